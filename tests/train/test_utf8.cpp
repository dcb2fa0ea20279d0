// Utf8Decoder passes only whole characters: an incomplete tail is held back until its bytes
// arrive, invalid bytes become U+FFFD (one per maximal invalid subpart, as Python's "replace"
// does), and the end of the stream turns a held-back tail into U+FFFD.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "core/rng.h"
#include "test_util.h"
#include "train/utf8.h"

namespace ft::train {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8Decoder, PassesWholeCharacters) {
  Utf8Decoder d;
  EXPECT_EQ(d.push("plain ascii"), "plain ascii");
  EXPECT_EQ(d.push("\xC3\xA9t\xC3\xA9 \xE4\xBD\xA0 \xF0\x9F\x98\x80"),
            "\xC3\xA9t\xC3\xA9 \xE4\xBD\xA0 \xF0\x9F\x98\x80");
  EXPECT_EQ(d.pending(), 0u);
  EXPECT_EQ(d.finish(), "");
}

TEST(Utf8Decoder, HoldsBackAnIncompleteTailUntilItCompletes) {
  Utf8Decoder d;
  // U+1F600 (F0 9F 98 80) split over three pushes, as byte-level tokens split it.
  EXPECT_EQ(d.push("ab\xF0"), "ab");
  EXPECT_EQ(d.pending(), 1u);
  EXPECT_EQ(d.push("\x9F\x98"), "");
  EXPECT_EQ(d.pending(), 3u);
  EXPECT_EQ(d.push("\x80!"), "\xF0\x9F\x98\x80!");
  EXPECT_EQ(d.pending(), 0u);
  // A tail that never completes is replaced at the end.
  EXPECT_EQ(d.push("x\xE4\xBD"), "x");
  EXPECT_EQ(d.finish(), kFffd);
  EXPECT_EQ(d.pending(), 0u);
}

TEST(Utf8Decoder, ReplacesInvalidBytes) {
  EXPECT_EQ(valid_utf8("a\x80z"), "a" + kFffd + "z");                        // lone continuation
  EXPECT_EQ(valid_utf8("\xFF\xFE"), kFffd + kFffd);                          // never valid
  EXPECT_EQ(valid_utf8("\xC0\xAF"), kFffd + kFffd);                          // overlong lead
  EXPECT_EQ(valid_utf8("\xE0\x80\x41"), kFffd + kFffd + "A");                // overlong 3-byte
  EXPECT_EQ(valid_utf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);              // a surrogate
  EXPECT_EQ(valid_utf8("\xF0\x90\x80\x41"), kFffd + "A");                    // cut by a letter
  EXPECT_EQ(valid_utf8("\xF4\x90\x80\x80"), kFffd + kFffd + kFffd + kFffd);  // > U+10FFFF
  EXPECT_EQ(valid_utf8("\xE4\xBD"), kFffd);                                  // cut at the end
  // An invalid byte that arrives after a held-back start: the start is replaced, then the byte.
  Utf8Decoder d;
  EXPECT_EQ(d.push("\xE4"), "");
  EXPECT_EQ(d.push("A"), kFffd + "A");
}

TEST(Utf8Decoder, OutputIsValidWhateverTheBytesAndSplits) {
  Rng rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes;
    for (int i = 0; i < 64; ++i) bytes += static_cast<char>(rng.uniform() * 256.0);
    Utf8Decoder d;
    std::string out;
    for (size_t at = 0; at < bytes.size();) {
      const size_t n = 1 + static_cast<size_t>(rng.uniform() * 4.0);
      out += d.push(bytes.substr(at, n));
      at += n;
    }
    out += d.finish();
    EXPECT_TRUE(is_valid_utf8(out)) << trial;
    EXPECT_EQ(out, valid_utf8(bytes)) << "the split must not change the text";
  }
  EXPECT_FALSE(is_valid_utf8("\xC3"));
  EXPECT_TRUE(is_valid_utf8("\xC3\xA9"));
}

// The replacements are Python's: bytes.decode('utf-8', 'replace'), on random bytes.
TEST(Utf8Decoder, ReplacesAsPythonDoes) {
  if (std::system("python3 --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no python3";
  test::TempDir dir;
  Rng rng(11);
  std::string bytes;
  for (int i = 0; i < 4096; ++i) {
    // Mostly bytes that start or continue sequences, so that every rule is exercised.
    const double u = rng.uniform();
    bytes += static_cast<char>(u < 0.2 ? 0x41 : 0x80 + static_cast<int>(rng.uniform() * 128.0));
  }
  std::ofstream(dir.file("in.bin"), std::ios::binary) << bytes;
  const test::CommandResult r = test::run_shell(
      "python3 -c \"import sys; d = open(sys.argv[1], 'rb').read(); "
      "open(sys.argv[2], 'wb').write(d.decode('utf-8', 'replace').encode('utf-8'))\" '" +
      dir.file("in.bin") + "' '" + dir.file("out.bin") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir.file("out.bin"), std::ios::binary);
  const std::string python{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  EXPECT_EQ(valid_utf8(bytes), python);
}

}  // namespace
}  // namespace ft::train

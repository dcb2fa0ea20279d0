// The C++ GPT-2 encoder gives the ids scripts/prepare_data.py gave the shipped shards (which the
// data test shows are byte-identical to the script's output), on the whole tinyshakespeare
// corpus; its pre-tokeniser splits as the `regex` module does on text with every class of
// character the pattern distinguishes.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/bpe.h"
#include "train/corpus.h"
#include "train/data_loader.h"
#include "train/tokenizer.h"

namespace ft::train {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<uint32_t> shard_tokens(const std::string& path) {
  const ShardHeader h = read_shard_header(path);
  const std::string bytes = read_file(path);
  std::vector<uint32_t> tokens(static_cast<size_t>(h.num_tokens));
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + 1024 + 2 * i, 2);
    tokens[i] = v;
  }
  return tokens;
}

Gpt2Encoder encoder() {
  return Gpt2Encoder(Tokenizer(test::source_path("data/gpt2_tokenizer.bin")));
}

TEST(Gpt2Encoder, KnownEncodings) {
  Gpt2Encoder e = encoder();
  // The published tokenizer's ids (the same pairs scripts/prepare_data.py checks).
  EXPECT_EQ(e.encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(e.encode("hello world"), (std::vector<int32_t>{31373, 995}));
  EXPECT_EQ(e.encode(" the"), (std::vector<int32_t>{262}));
  EXPECT_EQ(e.encode("\n\n"), (std::vector<int32_t>{628}));
  EXPECT_TRUE(e.encode("").empty());
  // End-of-text in the text is ordinary characters, never id 50256.
  for (int32_t id : e.encode("<|endoftext|>")) EXPECT_NE(id, 50256);
}

// The ids of every document of the corpus, split and framed as the script does it, are the
// shipped shards' (validation first, then training).
TEST(Gpt2Encoder, EncodesTinyShakespeareAsTheShippedShards) {
  Gpt2Encoder e = encoder();
  const std::string text = read_file(test::source_path("data/tinyshakespeare.txt"));
  ASSERT_GT(text.size(), 1000000u);
  std::vector<uint32_t> expected = shard_tokens(test::source_path("data/tinyshakespeare_val.bin"));
  const std::vector<uint32_t> train =
      shard_tokens(test::source_path("data/tinyshakespeare_train.bin"));
  expected.insert(expected.end(), train.begin(), train.end());

  std::vector<uint32_t> got;
  size_t start = 0;
  while (true) {
    const size_t sep = text.find("\n\n", start);
    const bool last = sep == std::string::npos;
    const std::string doc = last ? text.substr(start) : text.substr(start, sep + 2 - start);
    got.push_back(static_cast<uint32_t>(e.eot_token()));
    for (int32_t id : e.encode(doc)) got.push_back(static_cast<uint32_t>(id));
    if (last) break;
    start = sep + 2;
  }
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], expected[i]) << "token " << i;
  }
}

// Contractions, spaces before words, numbers and symbols, runs of whitespace before a word or
// at the end, letters and digits outside ASCII, marks, CJK and emoji.
const char* kTricky =
    "I'll say it's 42, they've said 'quoted'  twice!!\n\n\tTabs  \u00e9t\u00e9 na\u00efve "
    "\u0663\u0664 \u00bd caf\u0065\u0301 \u4f60\u597d\u3002 \U0001F600\U0001F600 x\u00a0y "
    "\u2003z  end   ";

TEST(Gpt2Encoder, PretokeniserSplitsAsTheRegexModule) {
  if (std::system("python3 -c 'import regex' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with the 'regex' package is not available";
  }
  test::TempDir dir;
  std::ofstream(dir.file("in.txt"), std::ios::binary) << kTricky;
  // The pattern is read from the script itself, so the test follows it.
  const std::string py =
      "import importlib.util, sys\n"
      "spec = importlib.util.spec_from_file_location('p', sys.argv[1])\n"
      "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
      "text = open(sys.argv[2], encoding='utf-8').read()\n"
      "for piece in m.regex.findall(m.GPT2_SPLIT, text):\n"
      "    sys.stdout.write(piece.encode('utf-8').hex() + '\\n')\n";
  std::ofstream(dir.file("split.py")) << py;
  const test::CommandResult r = test::run_shell("python3 '" + dir.file("split.py") + "' '" +
                                                test::source_path("scripts/prepare_data.py") +
                                                "' '" + dir.file("in.txt") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::string want;
  for (std::string_view piece : gpt2_pretokenize(kTricky)) {
    static const char* hex = "0123456789abcdef";
    for (unsigned char ch : piece) {
      want += hex[ch >> 4];
      want += hex[ch & 15];
    }
    want += '\n';
  }
  EXPECT_EQ(want, r.output);
  EXPECT_GT(gpt2_pretokenize(kTricky).size(), 30u);
}

TEST(Gpt2Encoder, InvalidUtf8IsReplacedNotRejected) {
  Gpt2Encoder e = encoder();
  EXPECT_EQ(e.encode("a\xff"), e.encode("a\xEF\xBF\xBD"));
}

// prepare_corpus reports progress through its input: bytes done rise to the total, and the
// counts at the end are the summary's.
TEST(Corpus, ReportsProgressUpToTheWholeInput) {
  test::TempDir dir;
  for (const char* name : {"a.txt", "b.txt", "c.txt"}) {
    std::ofstream(dir.file(name)) << std::string(3000, 'x') + " and some words " + name;
  }
  CorpusOptions o;
  o.inputs = {dir.file("a.txt"), dir.file("b.txt"), dir.file("c.txt")};
  o.out_dir = dir.file("out");
  o.val_tokens = 10;
  Gpt2Encoder e = encoder();
  std::vector<CorpusProgress> seen;
  const CorpusSummary s = prepare_corpus(o, e, [&](const CorpusProgress& p) { seen.push_back(p); });
  ASSERT_EQ(seen.size(), 3u);  // after each file
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i].bytes_done, seen[i - 1].bytes_done);
  EXPECT_EQ(seen.back().bytes_done, seen.back().bytes_total);
  EXPECT_EQ(seen.back().bytes_total, 3 * 3016 + 3 * 5);
  EXPECT_EQ(seen.back().documents, 3);
  EXPECT_EQ(seen.back().tokens, s.tokens);
  EXPECT_EQ(s.documents, 3);
  ASSERT_EQ(s.shards.size(), 2u);
  EXPECT_EQ(s.shards[0].second, 10);
  EXPECT_EQ(s.shards[0].second + s.shards[1].second, s.tokens);
}

}  // namespace
}  // namespace ft::train

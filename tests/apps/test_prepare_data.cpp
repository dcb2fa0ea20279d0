// `flashtrain prepare-data`: tinyshakespeare gives the shipped shards byte for byte; directories
// and JSON-lines files become documents in path order, each after an end-of-text token, with the
// validation split first and numbered training shards when they fill; the shards train; bad
// input is one error line before any shard is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "test_util.h"
#include "train/bpe.h"
#include "train/data_loader.h"
#include "train/tokenizer.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<uint32_t> tokens_of(const std::string& shard) {
  const train::ShardHeader h = train::read_shard_header(shard);
  const std::string bytes = read_file(shard);
  std::vector<uint32_t> t(static_cast<size_t>(h.num_tokens));
  for (size_t i = 0; i < t.size(); ++i) {
    uint32_t v = 0;
    std::memcpy(&v, bytes.data() + 1024 + h.token_bytes * i, static_cast<size_t>(h.token_bytes));
    t[i] = v;
  }
  return t;
}

void run_ok(const std::string& args, test::CommandResult* out = nullptr) {
  const test::CommandResult r = test::run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.output;
  if (out) *out = r;
}

TEST(PrepareDataCli, TinyShakespeareGivesTheShippedShards) {
  test::TempDir dir;
  run_ok("prepare-data data/tinyshakespeare.txt --split-on '\\n\\n' --out-dir '" +
         dir.path().string() + "'");
  for (const char* name : {"tinyshakespeare_train.bin", "tinyshakespeare_val.bin"}) {
    EXPECT_EQ(read_file(dir.file(name)), read_file(test::source_path(std::string("data/") + name)))
        << name;
  }
}

TEST(PrepareDataCli, DirectoriesAndJsonLinesBecomeDocumentsThatTrain) {
  test::TempDir dir;
  fs::create_directories(dir.path() / "corpus" / "sub");
  fs::create_directories(dir.path() / "corpus" / ".git");
  std::string a, b, c;
  for (int i = 0; i < 40; ++i) {
    a += "To be, or not to be, that is the question. ";
    b += "Caf\xC3\xA9 cr\xC3\xA8me, na\xC3\xAFve r\xC3\xA9sum\xC3\xA9 " + std::to_string(i) + "\n";
    c += "Numbers 3.14159 and symbols #$%! ";
  }
  std::ofstream(dir.file("corpus/a.txt"), std::ios::binary) << a;
  std::ofstream(dir.file("corpus/sub/b.md"), std::ios::binary) << b;
  std::ofstream(dir.file("corpus/.hidden.txt")) << "never read";
  std::ofstream(dir.file("corpus/.git/config")) << "never read";
  std::ofstream(dir.file("docs.jsonl")) << "{\"text\": \"" << c << "\", \"id\": 1}\n\n"
                                        << "{\"text\": \"second \\u00e9\", \"id\": 2}\n";
  const std::string out = dir.file("shards");
  test::CommandResult r;
  run_ok("prepare-data '" + dir.file("corpus") + "' '" + dir.file("docs.jsonl") +
             "' --name mix --val-tokens 50 --shard-tokens 300 --out-dir '" + out + "'",
         &r);
  EXPECT_NE(r.output.find("encoded 3 files, 4 documents"), std::string::npos) << r.output;

  // The expected stream: each document after an end-of-text token, in path order, then the
  // JSON lines in order.
  train::Gpt2Encoder e(train::Tokenizer(test::source_path("data/gpt2_tokenizer.bin")));
  std::vector<uint32_t> want;
  for (const std::string& doc : {a, b, c, std::string("second \xC3\xA9")}) {
    want.push_back(50256);
    for (int32_t id : e.encode(doc)) want.push_back(static_cast<uint32_t>(id));
  }
  std::vector<uint32_t> got = tokens_of(out + "/mix_val.bin");
  EXPECT_EQ(got.size(), 50u);
  std::vector<std::string> train_shards;
  for (const auto& f : fs::directory_iterator(out)) {
    if (f.path().filename().string().rfind("mix_train_", 0) == 0)
      train_shards.push_back(f.path().string());
  }
  std::sort(train_shards.begin(), train_shards.end());
  ASSERT_GE(train_shards.size(), 2u) << r.output;
  EXPECT_EQ(fs::path(train_shards[0]).filename(), "mix_train_000000.bin");
  for (const std::string& s : train_shards) {
    const std::vector<uint32_t> t = tokens_of(s);
    EXPECT_LE(t.size(), 300u) << s;
    got.insert(got.end(), t.begin(), t.end());
  }
  EXPECT_EQ(got, want);
  // The shards train (a glob over the numbered ones).
  run_ok("train --device cpu --train-data '" + out + "/mix_train_*.bin' --val-data '" + out +
         "/mix_val.bin' --batch-size 1 --seq-len 16 --steps 2 --val-steps 1 --sample-tokens 0");
}

TEST(PrepareDataCli, BadInputIsOneErrorLineAndWritesNoShard) {
  test::TempDir dir;
  std::ofstream(dir.file("bad.jsonl")) << "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n";
  std::ofstream(dir.file("small.txt")) << "tiny";
  auto expect_error = [&](const std::string& args, const std::string& needle) {
    const test::CommandResult r = test::run_cli("prepare-data " + args);
    EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
    EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
    EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "one line: " << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
  };
  const std::string out = " --out-dir '" + dir.file("out") + "'";
  expect_error("'" + dir.file("missing.txt") + "'" + out, "missing.txt: no such file");
  expect_error("'" + dir.file("bad.jsonl") + "'" + out, "bad.jsonl:2: no string field \"text\"");
  expect_error("'" + dir.file("small.txt") + "'" + out, "nothing is left for training");
  expect_error("'" + dir.file("small.txt") + "' --val-tokens -1" + out, "--val-tokens");
  expect_error("'" + dir.file("small.txt") + "' --shard-tokens 0" + out, "--shard-tokens");
  expect_error("'" + dir.file("small.txt") + "' --split-on '\\q'" + out, "unknown escape");
  expect_error("'" + dir.file("small.txt") + "' --out-dir /proc/flashtrain_no_dir", "--out-dir");
  expect_error("'" + dir.file("small.txt") + "' --tokenizer '" + dir.file("none.bin") + "'" + out,
               "none.bin");
  expect_error(out, "inputs is required");
  if (fs::exists(dir.file("out"))) {
    EXPECT_TRUE(fs::is_empty(dir.file("out")));
  }
}

// Invalid UTF-8 in a text file is read with U+FFFD in its place, and said so.
TEST(PrepareDataCli, InvalidUtf8IsReplacedAndReported) {
  test::TempDir dir;
  std::string text;
  for (int i = 0; i < 30; ++i) text += "ok \xFF bytes ";
  std::ofstream(dir.file("odd.txt"), std::ios::binary) << text;
  test::CommandResult r;
  run_ok("prepare-data '" + dir.file("odd.txt") + "' --val-tokens 0 --out-dir '" +
             dir.path().string() + "'",
         &r);
  EXPECT_NE(r.output.find("invalid UTF-8"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("odd_val.bin")));
  train::Gpt2Encoder e(train::Tokenizer(test::source_path("data/gpt2_tokenizer.bin")));
  std::vector<uint32_t> want = {50256};
  for (int32_t id : e.encode(text)) want.push_back(static_cast<uint32_t>(id));
  EXPECT_EQ(tokens_of(dir.file("odd_train.bin")), want);
}

}  // namespace
}  // namespace ft

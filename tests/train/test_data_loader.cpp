#include "train/data_loader.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "train/tokenizer.h"

namespace fs = std::filesystem;
using ft::Tensor;
using ft::train::DataLoader;
using ft::train::LoaderState;
using ft::train::write_token_shard;

namespace {

const std::string kData = std::string(FLASHTRAIN_SOURCE_DIR) + "/data/";

// Runs fn, which must throw ft::Error whose message holds every one of parts.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const ft::Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << msg << "\nlacks: " << p;
    return;
  }
  ADD_FAILURE() << "no ft::Error thrown";
}

std::vector<uint32_t> iota_tokens(size_t n, uint32_t first) {
  std::vector<uint32_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = first + static_cast<uint32_t>(i);
  return t;
}

std::vector<int32_t> to_vector(const Tensor& t) {
  const int32_t* p = t.data<int32_t>();
  return std::vector<int32_t>(p, p + t.numel());
}

// Raw shard bytes: header ints as given, then `count` uint16 tokens of value 1.
void write_raw_shard(const std::string& path, int32_t magic, int32_t version, int32_t declared,
                     int64_t count) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = declared;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  const std::vector<uint16_t> body(static_cast<size_t>(count), 1);
  out.write(reinterpret_cast<const char*>(body.data()),
            static_cast<std::streamsize>(body.size() * 2));
}

class DataLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("ft_data_loader_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// The first token of every batch the loader yields in `n` calls.
std::vector<int32_t> first_tokens(DataLoader& loader, int n) {
  Tensor x, y;
  std::vector<int32_t> firsts;
  for (int i = 0; i < n; ++i) {
    loader.next_batch(x, y);
    firsts.push_back(x.data<int32_t>()[0]);
  }
  return firsts;
}

}  // namespace

TEST(ShippedData, ShardHeadersAndCounts) {
  const auto val = ft::train::read_shard_header(kData + "tinyshakespeare_val.bin");
  const auto train = ft::train::read_shard_header(kData + "tinyshakespeare_train.bin");
  EXPECT_EQ(val.num_tokens, 32768);
  EXPECT_EQ(val.token_bytes, 2);
  EXPECT_EQ(train.num_tokens, 305260);  // llm.c's tinyshakespeare.py gives the same count
  EXPECT_EQ(train.token_bytes, 2);

  DataLoader loader(kData + "tinyshakespeare_val.bin", 4, 64);
  EXPECT_EQ(loader.num_tokens(), 32768);
  EXPECT_EQ(loader.batches_per_epoch(), (32768 - 1) / (4 * 64));
  loader.check_vocab(50257);
  DataLoader all(kData + "tinyshakespeare_*.bin", 4, 64);
  ASSERT_EQ(all.files().size(), 2u);
  EXPECT_EQ(all.num_tokens(), 32768 + 305260);
  all.check_vocab(50257);
}

TEST(ShippedData, ValShardDecodesToShakespeare) {
  DataLoader loader(kData + "tinyshakespeare_val.bin", 1, 64);
  Tensor x, y;
  loader.next_batch(x, y);
  ft::train::Tokenizer tok(kData + "gpt2_tokenizer.bin");
  const auto ids = to_vector(x);
  EXPECT_EQ(ids[0], tok.eot_token());
  // Each document starts with <|endoftext|>; without those the tokens spell the corpus.
  std::vector<int> text_ids;
  for (int32_t id : ids) {
    if (id != tok.eot_token()) text_ids.push_back(id);
  }
  EXPECT_LT(text_ids.size(), ids.size() - 1);  // 64 tokens span several documents
  const std::string text = tok.decode(text_ids);

  std::ifstream in(kData + "tinyshakespeare.txt", std::ios::binary);
  std::string corpus(text.size(), '\0');
  in.read(corpus.data(), static_cast<std::streamsize>(corpus.size()));
  EXPECT_EQ(text, corpus);
  EXPECT_EQ(text.rfind("First Citizen:\nBefore we proceed any further, hear me speak.", 0), 0u)
      << text;
}

TEST_F(DataLoaderTest, BatchesInOrderTargetsShifted) {
  write_token_shard(path("s.bin"), iota_tokens(100, 0), false);
  DataLoader loader(path("s.bin"), 2, 4);
  EXPECT_EQ(loader.batches_per_epoch(), 99 / 8);
  Tensor x, y;
  for (int b = 0; b < 3; ++b) {
    loader.next_batch(x, y);
    ASSERT_EQ(x.shape(), (ft::Shape{2, 4}));
    ASSERT_EQ(y.shape(), (ft::Shape{2, 4}));
    for (int i = 0; i < 8; ++i) {
      EXPECT_EQ(x.data<int32_t>()[i], b * 8 + i);
      EXPECT_EQ(y.data<int32_t>()[i], b * 8 + i + 1);
    }
  }
  loader.reset();
  loader.next_batch(x, y);
  EXPECT_EQ(x.data<int32_t>()[0], 0);
}

TEST_F(DataLoaderTest, WrapsAcrossShardsAndEpochs) {
  // B*T = 8: shard 0 (21 tokens, uint16) holds 2 batches, shard 1 (17 tokens, uint32) holds 2.
  write_token_shard(path("part_000.bin"), iota_tokens(21, 0), false);
  write_token_shard(path("part_001.bin"), iota_tokens(17, 70000), true);
  DataLoader loader(path("part_*.bin"), 2, 4);
  ASSERT_EQ(loader.files().size(), 2u);
  EXPECT_EQ(loader.files()[0], path("part_000.bin"));
  EXPECT_EQ(loader.batches_per_epoch(), 4);
  EXPECT_EQ(first_tokens(loader, 5), (std::vector<int32_t>{0, 8, 70000, 70008, 0}));
  EXPECT_EQ(loader.state().epoch, 1);
  EXPECT_EQ(loader.state().shard, 0);
  EXPECT_EQ(loader.state().position, 1);

  // The last target of a shard's last batch is still inside that shard.
  loader.reset();
  Tensor x, y;
  loader.next_batch(x, y);
  loader.next_batch(x, y);
  EXPECT_EQ(y.data<int32_t>()[7], 16);
}

TEST_F(DataLoaderTest, ShuffleIsDeterministicPermutation) {
  write_token_shard(path("s.bin"), iota_tokens(8 * 50 + 1, 0), false);
  DataLoader a(path("s.bin"), 2, 4, true, 1234);
  DataLoader b(path("s.bin"), 2, 4, true, 1234);
  DataLoader c(path("s.bin"), 2, 4, true, 99);
  const auto epoch0 = first_tokens(a, 50);
  const auto epoch1 = first_tokens(a, 50);
  EXPECT_EQ(first_tokens(b, 100), [&] {
    auto v = epoch0;
    v.insert(v.end(), epoch1.begin(), epoch1.end());
    return v;
  }());
  EXPECT_NE(first_tokens(c, 50), epoch0);
  EXPECT_NE(epoch0, epoch1);
  const std::set<int32_t> seen(epoch0.begin(), epoch0.end());
  EXPECT_EQ(seen.size(), 50u);
  for (int32_t t : seen) EXPECT_EQ(t % 8, 0);
  EXPECT_EQ(std::set<int32_t>(epoch1.begin(), epoch1.end()), seen);
}

TEST_F(DataLoaderTest, ResumeIsBitIdentical) {
  write_token_shard(path("r_0.bin"), iota_tokens(8 * 7 + 3, 0), false);
  write_token_shard(path("r_1.bin"), iota_tokens(8 * 5 + 1, 1000), true);
  for (bool shuffle : {false, true}) {
    for (int skip : {0, 3, 7, 11, 12, 30}) {
      DataLoader first(path("r_*.bin"), 2, 4, shuffle, 42);
      first_tokens(first, skip);
      const LoaderState saved = first.state();
      Tensor x1, y1, x2, y2;
      DataLoader second(path("r_*.bin"), 2, 4, shuffle, 7);  // the seed comes from the state
      second.restore(saved);
      for (int i = 0; i < 30; ++i) {
        first.next_batch(x1, y1);
        second.next_batch(x2, y2);
        ASSERT_EQ(to_vector(x1), to_vector(x2)) << "shuffle " << shuffle << " skip " << skip;
        ASSERT_EQ(to_vector(y1), to_vector(y2)) << "shuffle " << shuffle << " skip " << skip;
      }
      EXPECT_EQ(first.state().epoch, second.state().epoch);
    }
  }
}

// skip(n) is n next_batch calls without the reading: across shards, epochs and shuffles.
TEST_F(DataLoaderTest, SkipMovesAsNextBatchDoes) {
  write_token_shard(path("k_0.bin"), iota_tokens(8 * 7 + 3, 0), false);
  write_token_shard(path("k_1.bin"), iota_tokens(8 * 5 + 1, 1000), true);
  for (bool shuffle : {false, true}) {
    DataLoader read(path("k_*.bin"), 2, 4, shuffle, 42),
        skipped(path("k_*.bin"), 2, 4, shuffle, 42);
    Tensor x1, y1, x2, y2;
    for (int round = 0; round < 10; ++round) {
      const int n = round % 4;  // 0 to 3 batches passed over
      for (int i = 0; i < n; ++i) read.next_batch(x1, y1);
      skipped.skip(n);
      read.next_batch(x1, y1);
      skipped.next_batch(x2, y2);
      ASSERT_EQ(to_vector(x1), to_vector(x2)) << "shuffle " << shuffle << " round " << round;
      EXPECT_EQ(read.state().shard, skipped.state().shard);
      EXPECT_EQ(read.state().position, skipped.state().position);
      EXPECT_EQ(read.state().epoch, skipped.state().epoch);
    }
  }
}

TEST_F(DataLoaderTest, RestoreRejectsOutOfRangeState) {
  write_token_shard(path("s.bin"), iota_tokens(17, 0), false);
  DataLoader loader(path("s.bin"), 2, 4);
  expect_error([&] { loader.restore(LoaderState{1, 0, 0, 0}); }, {"shard 1"});
  expect_error([&] { loader.restore(LoaderState{0, 3, 0, 0}); }, {"position 3", path("s.bin")});
}

TEST_F(DataLoaderTest, MissingFile) {
  expect_error([&] { DataLoader(path("nope.bin"), 1, 4); }, {path("nope.bin"), "no such file"});
  expect_error([&] { DataLoader(path("nope_*.bin"), 1, 4); },
               {path("nope_*.bin"), "no file matches"});
}

TEST_F(DataLoaderTest, WrongMagic) {
  write_raw_shard(path("m.bin"), 12345, 1, 10, 10);
  expect_error([&] { DataLoader(path("m.bin"), 1, 4); },
               {path("m.bin"), "bad magic 12345", "20240520", "20240801"});
}

TEST_F(DataLoaderTest, WrongVersion) {
  write_raw_shard(path("v.bin"), 20240520, 7, 10, 10);
  expect_error([&] { DataLoader(path("v.bin"), 1, 4); },
               {path("v.bin"), "version 7", "expected 1"});
  write_raw_shard(path("v32.bin"), 20240801, 1, 5, 10);  // 10 uint16 = 5 uint32
  expect_error([&] { DataLoader(path("v32.bin"), 1, 4); },
               {path("v32.bin"), "version 1", "expected 7"});
}

TEST_F(DataLoaderTest, TruncatedFile) {
  write_raw_shard(path("t.bin"), 20240520, 1, 100, 60);
  expect_error([&] { DataLoader(path("t.bin"), 1, 4); },
               {path("t.bin"), "truncated", "100 tokens", "holds 60"});
  write_raw_shard(path("h.bin"), 20240520, 1, 0, 0);
  fs::resize_file(path("h.bin"), 500);
  expect_error([&] { DataLoader(path("h.bin"), 1, 4); }, {path("h.bin"), "header"});
  write_raw_shard(path("x.bin"), 20240520, 1, 10, 12);
  expect_error([&] { DataLoader(path("x.bin"), 1, 4); }, {path("x.bin"), "10 tokens"});
}

TEST_F(DataLoaderTest, TooFewTokensForOneBatch) {
  write_token_shard(path("small.bin"), iota_tokens(16, 0), false);
  expect_error([&] { DataLoader(path("small.bin"), 2, 8); },
               {path("small.bin"), "16 tokens", "B*T+1 = 17"});
  DataLoader ok(path("small.bin"), 3, 5);  // 15 + 1 tokens fit exactly
  EXPECT_EQ(ok.batches_per_epoch(), 1);
}

TEST_F(DataLoaderTest, TokenOutsideVocab) {
  auto tokens = iota_tokens(40, 0);
  tokens[33] = 50257;
  write_token_shard(path("ok.bin"), iota_tokens(40, 0), false);
  write_token_shard(path("vocab.bin"), tokens, true);
  DataLoader loader(path("*.bin"), 2, 4);
  loader.check_vocab(50257 + 1);
  expect_error([&] { loader.check_vocab(50257); },
               {path("vocab.bin"), "token id 50257", "position 33", "[0, 50257)"});
}

TEST_F(DataLoaderTest, WriteRejectsIdsBeyondUint16) {
  expect_error(
      [&] {
        write_token_shard(path("w.bin"), {1, 70000}, false);
      },
      {path("w.bin"), "70000", "uint16"});
  EXPECT_FALSE(fs::exists(path("w.bin")));
  EXPECT_FALSE(fs::exists(path("w.bin.tmp")));
}

TEST_F(DataLoaderTest, RejectsWrongBatchTensor) {
  write_token_shard(path("s.bin"), iota_tokens(17, 0), false);
  DataLoader loader(path("s.bin"), 2, 4);
  Tensor x = Tensor::empty({4, 2}, ft::DType::i32), y;
  expect_error([&] { loader.next_batch(x, y); }, {"[2, 4]", "[4, 2]"});
}

TEST(PrepareData, ShippedFilesMatchScript) {
  if (std::system("python3 -c 'import regex' >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3 with the 'regex' package is not available "
                    "(python3 -m pip install regex)";
  }
  const std::string cmd =
      "python3 '" + std::string(FLASHTRAIN_SOURCE_DIR) + "/scripts/prepare_data.py' --check 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe)) output += buf;
  const int status = pclose(pipe);
  EXPECT_EQ(status, 0) << output;
}

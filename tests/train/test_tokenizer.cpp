#include "train/tokenizer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace fs = std::filesystem;
using ft::train::Tokenizer;

namespace {

const std::string kTokenizerPath = std::string(FLASHTRAIN_SOURCE_DIR) + "/data/gpt2_tokenizer.bin";

// Writes an llm.c tokenizer file: header ints as given, then each token as length + bytes.
void write_tokenizer(const std::string& path, int32_t magic, int32_t version, int32_t eot,
                     const std::vector<std::string>& tokens, int32_t declared_vocab = -1) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = declared_vocab >= 0 ? declared_vocab : static_cast<int32_t>(tokens.size());
  header[3] = eot;
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 1024);
  for (const auto& t : tokens) {
    const auto len = static_cast<uint8_t>(t.size());
    out.write(reinterpret_cast<const char*>(&len), 1);
    out.write(t.data(), static_cast<std::streamsize>(t.size()));
  }
}

void expect_error(const std::string& path, const std::string& what) {
  try {
    Tokenizer tok(path);
    ADD_FAILURE() << "no ft::Error for " << path;
  } catch (const ft::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
}

class TokenizerFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("ft_tokenizer_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

}  // namespace

TEST(Tokenizer, ShippedGpt2DecodesKnownIds) {
  Tokenizer tok(kTokenizerPath);
  EXPECT_EQ(tok.vocab_size(), 50257);
  EXPECT_EQ(tok.eot_token(), 50256);
  EXPECT_EQ(tok.decode(50256), "<|endoftext|>");
  EXPECT_EQ(tok.decode(std::vector<int>{15496, 995}), "Hello world");
  EXPECT_EQ(tok.decode(262), " the");
  EXPECT_EQ(tok.decode(198), "\n");
  EXPECT_EQ(tok.decode(628), "\n\n");
  EXPECT_EQ(tok.decode(std::vector<int>{5962, 22307, 25}), "First Citizen:");
  // Byte-level tokens can hold part of a UTF-8 character: 447 and 247 together are U+2019.
  EXPECT_EQ(tok.decode(std::vector<int>{447, 247}), "\xe2\x80\x99");
}

TEST(Tokenizer, OutOfRangeIdNamesTheId) {
  Tokenizer tok(kTokenizerPath);
  for (int id : {-1, 50257}) {
    try {
      tok.decode(id);
      ADD_FAILURE() << "no error for id " << id;
    } catch (const ft::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("token id " + std::to_string(id)), std::string::npos) << msg;
      EXPECT_NE(msg.find("[0, 50257)"), std::string::npos) << msg;
    }
  }
}

TEST_F(TokenizerFileTest, Version1AssumesGpt2Eot) {
  std::vector<std::string> tokens(50257, "a");
  tokens[3] = "xyz";
  write_tokenizer(path("v1.bin"), 20240328, 1, 0, tokens);
  Tokenizer tok(path("v1.bin"));
  EXPECT_EQ(tok.eot_token(), 50256);
  EXPECT_EQ(tok.decode(std::vector<int>{3, 0}), "xyza");
}

TEST_F(TokenizerFileTest, BadFiles) {
  const std::vector<std::string> tokens = {"a", "b", "<eot>"};
  expect_error(path("missing.bin"), "cannot open");
  write_tokenizer(path("magic.bin"), 20240520, 2, 2, tokens);
  expect_error(path("magic.bin"), "bad magic 20240520");
  write_tokenizer(path("version.bin"), 20240328, 3, 2, tokens);
  expect_error(path("version.bin"), "version 3");
  write_tokenizer(path("eot.bin"), 20240328, 2, 3, tokens);
  expect_error(path("eot.bin"), "eot token 3");
  write_tokenizer(path("short.bin"), 20240328, 2, 2, tokens, 4);
  expect_error(path("short.bin"), "truncated at token 3");
  write_tokenizer(path("long.bin"), 20240328, 2, 1, tokens, 2);
  expect_error(path("long.bin"), "trailing bytes");
  // A vocabulary the file cannot hold is refused before the token table is allocated.
  write_tokenizer(path("huge.bin"), 20240328, 2, 0, tokens, 2000000000);
  expect_error(path("huge.bin"), "vocab size 2000000000 does not fit the file (1034 bytes");
  write_tokenizer(path("empty.bin"), 20240328, 2, 0, {"a", ""});
  expect_error(path("empty.bin"), "token 1 has length 0");
  write_tokenizer(path("header.bin"), 20240328, 2, 0, {});
  fs::resize_file(path("header.bin"), 100);
  expect_error(path("header.bin"), "header");
}

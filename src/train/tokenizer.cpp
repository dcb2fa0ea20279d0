#include "train/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace ft::train {

namespace {
// llm.c's version-1 files predate the eot field; they were all GPT-2's tokenizer.
constexpr int kVersion1EotToken = 50256;
}  // namespace

Tokenizer::Tokenizer(const std::string& path) : path_(path) {
  std::ifstream in(path, std::ios::binary);
  FT_CHECK(in.good(), "tokenizer '", path, "': cannot open");
  int32_t header[256];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  FT_CHECK(in.good(), "tokenizer '", path, "': shorter than the ", sizeof(header), "-byte header");
  FT_CHECK(header[0] == kTokenizerMagic, "tokenizer '", path, "': bad magic ", header[0],
           ", expected ", kTokenizerMagic);
  const int32_t version = header[1];
  FT_CHECK(version == 1 || version == 2, "tokenizer '", path, "': version ", version,
           ", expected 1 or 2");
  const int32_t vocab = header[2];
  FT_CHECK(vocab > 0, "tokenizer '", path, "': vocab size ", vocab, " must be positive");
  eot_token_ = version == 1 ? kVersion1EotToken : header[3];
  FT_CHECK(eot_token_ >= 0 && eot_token_ < vocab, "tokenizer '", path, "': eot token ", eot_token_,
           " outside [0, ", vocab, ")");

  // Each token takes at least its length byte: a vocabulary larger than the file can hold is
  // refused before the table is allocated.
  std::error_code ec;
  const auto bytes = static_cast<int64_t>(std::filesystem::file_size(path, ec));
  const int64_t most = ec ? 0 : bytes - static_cast<int64_t>(sizeof(header));
  FT_CHECK(vocab <= most, "tokenizer '", path, "': vocab size ", vocab, " does not fit the file (",
           bytes, " bytes hold at most ", most, " tokens)");
  tokens_.resize(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) {
    uint8_t length = 0;
    in.read(reinterpret_cast<char*>(&length), 1);
    FT_CHECK(in.good(), "tokenizer '", path, "': truncated at token ", i, " of ", vocab);
    FT_CHECK(length > 0, "tokenizer '", path, "': token ", i, " has length 0");
    auto& token = tokens_[static_cast<size_t>(i)];
    token.resize(length);
    in.read(token.data(), length);
    FT_CHECK(in.good(), "tokenizer '", path, "': truncated at token ", i, " of ", vocab);
  }
  FT_CHECK(in.peek() == std::ifstream::traits_type::eof(), "tokenizer '", path,
           "': trailing bytes after ", vocab, " tokens");
}

const std::string& Tokenizer::decode(int id) const {
  FT_CHECK(id >= 0 && id < vocab_size(), "tokenizer '", path_, "': token id ", id, " outside [0, ",
           vocab_size(), ")");
  return tokens_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int>& ids) const {
  std::string text;
  for (int id : ids) text += decode(id);
  return text;
}

}  // namespace ft::train

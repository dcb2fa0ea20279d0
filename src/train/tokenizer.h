// Decoder for llm.c's tokenizer file: a 256-int32 header (magic 20240328; version 1, or 2 which
// adds the end-of-text id in header[3]; vocab size in header[2]), then for each token id one
// uint8 length and that many raw bytes. Decoding only: training reads pre-tokenised shards.
#pragma once

#include <string>
#include <vector>

namespace ft::train {

inline constexpr int kTokenizerMagic = 20240328;

class Tokenizer {
 public:
  explicit Tokenizer(const std::string& path);

  // The raw bytes of one token (a piece of UTF-8 that may split a multi-byte character).
  const std::string& decode(int id) const;
  std::string decode(const std::vector<int>& ids) const;

  int eot_token() const { return eot_token_; }
  int vocab_size() const { return static_cast<int>(tokens_.size()); }

 private:
  std::string path_;
  std::vector<std::string> tokens_;
  int eot_token_ = 0;
};

}  // namespace ft::train

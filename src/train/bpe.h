// GPT-2's byte-level BPE encoder, for prompts (`flashtrain generate`) and for tokenising text
// into shards (`flashtrain prepare-data`). It gives the same ids as scripts/prepare_data.py,
// which made the shipped shards (tests/train/test_bpe.cpp encodes the corpus and compares).
//
// Text is first split into pieces by GPT-2's pre-tokenisation pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (the first alternative that matches at each position, as a regex engine tries them; the
// classes come from src/train/unicode_classes.inc, generated from the same regex module the
// script uses). Each piece's UTF-8 bytes are then merged: repeatedly, the adjacent pair whose
// concatenation is the lowest-ranked token. GPT-2's ranks are its token ids (the vocabulary
// lists merges in the order they were learnt, as tiktoken uses it), so an llm.c tokenizer file,
// which holds each id's bytes, is all the encoder needs. The end-of-text token is never formed
// from text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "train/tokenizer.h"

namespace ft::train {

// GPT-2's pieces of `text` (valid UTF-8; see valid_utf8()), as views into it.
std::vector<std::string_view> gpt2_pretokenize(std::string_view text);

class Gpt2Encoder {
 public:
  // Every one of the 256 bytes must be a token of its own (byte-level BPE); throws ft::Error
  // naming the tokenizer otherwise.
  explicit Gpt2Encoder(const Tokenizer& tokenizer);

  // Ordinary text (invalid UTF-8 is first replaced by U+FFFD); "<|endoftext|>" in the text is
  // encoded as ordinary characters.
  std::vector<int32_t> encode(std::string_view text);
  // Appends the ids of one piece of gpt2_pretokenize(); encode() is this over every piece (for
  // callers that report progress through a long text).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out);
  int32_t eot_token() const { return eot_; }

 private:
  std::unordered_map<std::string, int32_t> rank_;  // token bytes -> id (eot excluded)
  int32_t byte_token_[256] = {};
  int32_t eot_ = 0;
  std::unordered_map<std::string, std::vector<int32_t>> cache_;  // piece -> ids (bounded)
};

}  // namespace ft::train

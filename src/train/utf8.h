// Turning token bytes into text that is valid UTF-8. A token is a piece of UTF-8 that may end in
// the middle of a character (GPT-2's byte-level BPE splits rare characters across tokens), and a
// sampled sequence may hold bytes that never form a character. Utf8Decoder passes through only
// whole characters: an incomplete sequence at the end is held back until the bytes that
// complete it arrive, and a sequence that cannot be completed is replaced by U+FFFD (one per
// maximal invalid subpart, as the Unicode standard recommends and Python's "replace" does).
#pragma once

#include <string>
#include <string_view>

namespace ft::train {

class Utf8Decoder {
 public:
  // Appends bytes; returns the text that is now complete: valid UTF-8, invalid bytes replaced.
  std::string push(std::string_view bytes);
  // Ends the stream: a held-back incomplete sequence becomes U+FFFD.
  std::string finish();
  // Bytes held back (0 to 3), waiting for the rest of a character.
  size_t pending() const { return pending_.size(); }

 private:
  std::string pending_;
};

// The whole of bytes as valid UTF-8 (push then finish).
std::string valid_utf8(std::string_view bytes);
// True when bytes are valid UTF-8 (no overlong forms, no surrogates, nothing past U+10FFFF).
bool is_valid_utf8(std::string_view bytes);

}  // namespace ft::train

// UTF-8 as defined by RFC 3629 / Unicode Table 3-7 (well-formed byte sequences):
//   00..7F
//   C2..DF 80..BF
//   E0 A0..BF 80..BF | E1..EC 80..BF 80..BF | ED 80..9F 80..BF | EE..EF 80..BF 80..BF
//   F0 90..BF 80..BF 80..BF | F1..F3 80..BF 80..BF 80..BF | F4 80..8F 80..BF 80..BF
// The second byte's range depends on the lead byte (no overlong forms, no surrogates, nothing
// past U+10FFFF); later bytes are 80..BF.
#include "train/utf8.h"

#include <cstdint>

namespace ft::train {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// Length of the sequence a lead byte starts (0: not a lead byte).
int sequence_length(uint8_t lead) {
  if (lead < 0x80) return 1;
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether byte `b` may follow at index `i` (1..3) of a sequence that starts with `lead`.
bool continues(uint8_t lead, int i, uint8_t b) {
  uint8_t lo = 0x80, hi = 0xBF;
  if (i == 1) {
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  }
  return b >= lo && b <= hi;
}

// Decodes as much of `in` as is decided: complete characters are appended to `out`, invalid
// subparts become U+FFFD. Returns the number of bytes consumed; the rest (a valid prefix of a
// character, at most 3 bytes) waits for more input unless `final`.
size_t decode(std::string_view in, bool final, std::string& out) {
  size_t i = 0;
  while (i < in.size()) {
    const auto lead = static_cast<uint8_t>(in[i]);
    const int length = sequence_length(lead);
    if (length == 0) {
      out += kReplacement;
      ++i;
      continue;
    }
    int have = 1;
    while (have < length && i + have < in.size() &&
           continues(lead, have, static_cast<uint8_t>(in[i + have]))) {
      ++have;
    }
    if (have == length) {
      out.append(in.substr(i, static_cast<size_t>(length)));
      i += static_cast<size_t>(length);
    } else if (i + have == in.size() && !final) {
      return i;  // a valid start, cut off by the end of the input so far
    } else {
      out += kReplacement;  // the maximal subpart that was valid so far is one replacement
      i += static_cast<size_t>(have);
    }
  }
  return i;
}

}  // namespace

std::string Utf8Decoder::push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  const size_t used = decode(pending_, false, out);
  pending_.erase(0, used);
  return out;
}

std::string Utf8Decoder::finish() {
  std::string out;
  decode(pending_, true, out);
  pending_.clear();
  return out;
}

std::string valid_utf8(std::string_view bytes) {
  Utf8Decoder d;
  std::string out = d.push(bytes);
  return out + d.finish();
}

bool is_valid_utf8(std::string_view bytes) {
  std::string out;
  decode(bytes, true, out);
  return out == bytes;  // any replacement changes the bytes at its position
}

}  // namespace ft::train

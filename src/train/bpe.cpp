#include "train/bpe.h"

#include <algorithm>
#include <limits>

#include "core/error.h"
#include "train/utf8.h"

namespace ft::train {
namespace {

constexpr size_t kMaxCachedPieces = 1 << 20;

struct CodePointRange {
  char32_t lo, hi;
};

#include "train/unicode_classes.inc"

template <size_t N>
bool in_ranges(const CodePointRange (&ranges)[N], char32_t cp) {
  const CodePointRange* end = ranges + N;
  const CodePointRange* it = std::upper_bound(
      ranges, end, cp, [](char32_t c, const CodePointRange& r) { return c < r.lo; });
  return it != ranges && cp <= (it - 1)->hi;
}

enum class Kind { letter, number, space, other };

Kind kind_of(char32_t cp) {
  if (cp < 0x80) {  // the common case, without a search
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return Kind::letter;
    if (cp >= '0' && cp <= '9') return Kind::number;
  }
  if (in_ranges(kLetterRanges, cp)) return Kind::letter;
  if (in_ranges(kNumberRanges, cp)) return Kind::number;
  if (in_ranges(kSpaceRanges, cp)) return Kind::space;
  return Kind::other;
}

// One decoded character: its code point, kind and byte offset in the text.
struct Char {
  char32_t cp;
  Kind kind;
  size_t offset;
};

// Decodes valid UTF-8.
std::vector<Char> decode_chars(std::string_view text) {
  std::vector<Char> chars;
  chars.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto b0 = static_cast<unsigned char>(text[i]);
    const int n = b0 < 0x80 ? 1 : b0 < 0xE0 ? 2 : b0 < 0xF0 ? 3 : 4;
    char32_t cp = n == 1 ? b0 : n == 2 ? (b0 & 0x1F) : n == 3 ? (b0 & 0x0F) : (b0 & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    chars.push_back({cp, kind_of(cp), i});
    i += static_cast<size_t>(n);
  }
  return chars;
}

// Length (in characters) of the contraction at i ('s 't 're 've 'm 'll 'd), or 0.
size_t contraction_at(const std::vector<Char>& c, size_t i) {
  if (c[i].cp != '\'' || i + 1 >= c.size()) return 0;
  const char32_t a = c[i + 1].cp, b = i + 2 < c.size() ? c[i + 2].cp : 0;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the run of `kind` characters from i.
size_t run_end(const std::vector<Char>& c, size_t i, Kind kind) {
  while (i < c.size() && c[i].kind == kind) ++i;
  return i;
}

// End of the run of characters that are neither space, letter nor number from i.
size_t other_end(const std::vector<Char>& c, size_t i) {
  return run_end(c, i, Kind::other);
}

// The end (in characters) of the piece that starts at i.
size_t piece_end(const std::vector<Char>& c, size_t i) {
  if (const size_t n = contraction_at(c, i)) return i + n;
  // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: an optional U+0020, then a run.
  const size_t start = (c[i].cp == ' ' && i + 1 < c.size()) ? i + 1 : i;
  const Kind k = c[start].kind;
  if (k == Kind::letter || k == Kind::number) return run_end(c, start, k);
  if (k == Kind::other) return other_end(c, start);
  // `\s+(?!\S)`: the whitespace run, less its last character when a non-space follows it;
  // `\s+`: a single whitespace character before a non-space.
  const size_t end = run_end(c, i, Kind::space);
  if (end == c.size() || end - i == 1) return end;
  return end - 1;
}

}  // namespace

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  const std::vector<Char> chars = decode_chars(text);
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < chars.size();) {
    const size_t end = piece_end(chars, i);
    const size_t from = chars[i].offset, to = end < chars.size() ? chars[end].offset : text.size();
    pieces.push_back(text.substr(from, to - from));
    i = end;
  }
  return pieces;
}

Gpt2Encoder::Gpt2Encoder(const Tokenizer& tokenizer) : eot_(tokenizer.eot_token()) {
  std::fill(std::begin(byte_token_), std::end(byte_token_), -1);
  for (int id = 0; id < tokenizer.vocab_size(); ++id) {
    if (id == eot_) continue;
    const std::string& bytes = tokenizer.decode(id);
    rank_.emplace(bytes, id);
    if (bytes.size() == 1) byte_token_[static_cast<unsigned char>(bytes[0])] = id;
  }
  for (int b = 0; b < 256; ++b) {
    FT_CHECK(byte_token_[b] >= 0, "the tokenizer has no token for byte ", b,
             ", so it is not a byte-level BPE vocabulary (GPT-2's is)");
  }
}

void Gpt2Encoder::encode_piece(std::string_view piece, std::vector<int32_t>& out) {
  const auto cached = cache_.find(std::string(piece));
  if (cached != cache_.end()) {
    out.insert(out.end(), cached->second.begin(), cached->second.end());
    return;
  }
  // parts[k] = byte offset where part k starts; a part ends where the next starts.
  std::vector<size_t> parts(piece.size() + 1);
  for (size_t k = 0; k <= piece.size(); ++k) parts[k] = k;
  std::string pair;
  while (parts.size() > 2) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    size_t best = 0;
    for (size_t k = 0; k + 2 < parts.size(); ++k) {
      pair.assign(piece.substr(parts[k], parts[k + 2] - parts[k]));
      const auto it = rank_.find(pair);
      if (it != rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = k;
      }
    }
    if (best_rank == std::numeric_limits<int32_t>::max()) break;
    parts.erase(parts.begin() + static_cast<std::ptrdiff_t>(best + 1));
  }
  std::vector<int32_t> ids;
  for (size_t k = 0; k + 1 < parts.size(); ++k) {
    const std::string_view part = piece.substr(parts[k], parts[k + 1] - parts[k]);
    ids.push_back(part.size() == 1 ? byte_token_[static_cast<unsigned char>(part[0])]
                                   : rank_.at(std::string(part)));
  }
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache_.size() >= kMaxCachedPieces) cache_.clear();  // a large corpus: keep memory bounded
  cache_.emplace(std::string(piece), std::move(ids));
}

std::vector<int32_t> Gpt2Encoder::encode(std::string_view text) {
  std::string repaired;
  if (!is_valid_utf8(text)) {
    repaired = valid_utf8(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  for (std::string_view piece : gpt2_pretokenize(text)) encode_piece(piece, ids);
  return ids;
}

}  // namespace ft::train

// Mask bounds per tile: the one place that turns the mask description into ranges of positions,
// so that every implementation skips exactly the tiles the mask hides and applies the
// element-wise mask (attention.h: allowed()) only on tiles the mask cuts through.
//
// Causal and window give each query block a contiguous key range (and each key block a
// contiguous query range); segment ids are summarised per block by their smallest and largest
// non-padding id, which proves a tile hidden when the two id ranges do not overlap.
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/attention.h"

namespace ft::attention {

struct PositionRange {
  int64_t begin = 0, end = 0;  // [begin, end)
  int64_t size() const { return end > begin ? end - begin : 0; }
  bool empty() const { return end <= begin; }
};

// Keys that some query in [q_begin, q_end) may attend under causal and window.
inline PositionRange key_range(const Mask& mask, int64_t q_begin, int64_t q_end, int64_t seq_len) {
  PositionRange r{0, seq_len};
  if (mask.causal) r.end = std::min(seq_len, q_end);
  if (mask.window > 0) r.begin = std::max<int64_t>(0, q_begin - (mask.window - 1));
  return r;
}

// Queries that may attend some key in [k_begin, k_end) under causal and window.
inline PositionRange query_range(const Mask& mask, int64_t k_begin, int64_t k_end,
                                 int64_t seq_len) {
  PositionRange r{0, seq_len};
  if (mask.causal) r.begin = k_begin;
  if (mask.window > 0) r.end = std::min(seq_len, (k_end - 1) + mask.window);
  return r;
}

// Smallest and largest non-padding segment id of a block, and whether it holds padding.
struct SegmentSpan {
  int32_t lowest = 0, highest = -1;
  bool has_padding = false;
  bool all_padding() const { return highest < lowest; }
  bool single_id() const { return !has_padding && lowest == highest; }
};

inline SegmentSpan segment_span(const int32_t* segment_row, int64_t begin, int64_t end) {
  SegmentSpan s;
  bool first = true;
  for (int64_t i = begin; i < end; ++i) {
    const int32_t id = segment_row[i];
    if (id < 0) {
      s.has_padding = true;
    } else if (first) {
      s.lowest = s.highest = id;
      first = false;
    } else {
      s.lowest = std::min(s.lowest, id);
      s.highest = std::max(s.highest, id);
    }
  }
  return s;
}

enum class TileCover {
  hidden,   // the mask hides every pair: skip the tile
  partial,  // some pairs hidden: apply allowed() per element
  full,     // every pair attended: no element-wise mask needed
};

// Classifies the tile of queries [q_begin, q_end) x keys [k_begin, k_end). query_span is the
// segment span of the query block (ignored without segments); it is passed in because a query
// block meets many key blocks.
inline TileCover classify_tile(const Mask& mask, const int32_t* segment_row,
                               const SegmentSpan& query_span, int64_t q_begin, int64_t q_end,
                               int64_t k_begin, int64_t k_end) {
  const int64_t q_last = q_end - 1, k_last = k_end - 1;
  const int64_t w = mask.window;
  if (mask.causal && k_begin > q_last) return TileCover::hidden;
  if (w > 0 && k_last < q_begin - (w - 1)) return TileCover::hidden;
  bool segments_full = true;
  if (mask.has_segments) {
    const SegmentSpan key_span = segment_span(segment_row, k_begin, k_end);
    if (query_span.all_padding() || key_span.all_padding()) return TileCover::hidden;
    if (query_span.highest < key_span.lowest || key_span.highest < query_span.lowest) {
      return TileCover::hidden;
    }
    segments_full =
        query_span.single_id() && key_span.single_id() && query_span.lowest == key_span.lowest;
  }
  const bool causal_full = !mask.causal || k_last <= q_begin;
  const bool window_full = w <= 0 || k_begin >= q_last - (w - 1);
  return causal_full && window_full && segments_full ? TileCover::full : TileCover::partial;
}

}  // namespace ft::attention

// What every CUDA flash kernel shares: the launch parameters, and the mask on the device (the
// per-tile classification of mask_bounds.h and the element-wise allowed() of attention.h, in
// the same definitions).
//
// Segment ids are summarised per 16-position chunk (SegmentChunk, made by one small kernel per
// call, flash.cu): a tile combines the chunks it covers, so a kernel proves a tile hidden or
// fully attended from a handful of cached loads. Every tile edge is a multiple of 16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/check.h"

namespace ft::attention::cuda {

inline constexpr int kSegmentChunk = 16;

// Smallest and largest non-padding id of 16 positions, and whether one of them is padding
// (highest < lowest: all padding).
struct SegmentChunk {
  int lowest, highest, has_padding, unused;
};

struct FlashParams {
  // [B, S, H, D], bf16 or fp32 as the problem's dtype; heads of a position and the elements of a
  // head contiguous, positions row_* elements apart (below).
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  void* o = nullptr;
  float* lse = nullptr;  // [B, Hq, S], natural log; -inf for rows that see no key
  // Backward.
  const void* dout = nullptr;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  float* dq_accum = nullptr;  // [B, S, Hq, D] fp32 scratch (bf16 path)
  // fp32 path with more query heads than kv heads: [2, B, S, Hq, D] scratch, each query head's
  // part of dK and of dV, summed over the group into dk and dv.
  float* dkv_part = nullptr;
  float* dsum = nullptr;  // [B, Hq, S] fp32: D = rowsum(dO * O)
  // Deterministic backward (tma path): [B, Hq, ceil(S / 64), 2] zeroed counters that fix the
  // order of the dQ reductions per query tile (and consumer, where their columns differ); null:
  // any order.
  int* dq_semaphore = nullptr;
  // Mask.
  const int32_t* segment_ids = nullptr;          // [B, S] or null
  const SegmentChunk* segment_chunks = nullptr;  // [B, ceil(S / 16)] or null
  bool causal = false;
  int window = 0;  // 0: none; keys >= query - (window - 1)

  int batch = 0, seq_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  // Elements between consecutive positions of q, k, v and of dq, dk, dv: H * D for dense
  // tensors, (Hq + 2 Hkv) * D inside a fused QKV buffer and its gradient. Only the tma kernels
  // (and the dQ conversion) take other than dense rows; o, dout and the fp32 scratch are dense.
  int64_t q_row = 0, k_row = 0, v_row = 0, dq_row = 0, dk_row = 0, dv_row = 0;
  float scale = 0.0f;       // softmax scale
  float scale_log2 = 0.0f;  // scale * log2(e): scores go through exp2

  __host__ __device__ int group() const { return q_heads / kv_heads; }
  __host__ __device__ bool dense_rows() const {
    const int64_t qd = int64_t{q_heads} * head_dim, kvd = int64_t{kv_heads} * head_dim;
    return q_row == qd && dq_row == qd && k_row == kvd && v_row == kvd && dk_row == kvd &&
           dv_row == kvd;
  }
  __host__ __device__ int chunks_per_row() const {
    return (seq_len + kSegmentChunk - 1) / kSegmentChunk;
  }
};

enum class Cover { hidden, partial, full };

// The segment chunks of positions [begin, end) of one batch row, combined.
__device__ __forceinline__ SegmentChunk combine_chunks(const SegmentChunk* row, int begin,
                                                       int end) {
  SegmentChunk s{0x7fffffff, -1, 0, 0};
  for (int c = begin / kSegmentChunk; c * kSegmentChunk < end; ++c) {
    const SegmentChunk x = row[c];
    s.lowest = min(s.lowest, x.lowest);
    s.highest = max(s.highest, x.highest);
    s.has_padding |= x.has_padding;
  }
  return s;
}

// Queries [q0, q1) x keys [k0, k1) (q0 and k0 multiples of 16; q1, k1 at most seq_len). The
// query block's chunks are combined once by the caller. Mirrors classify_tile() in
// mask_bounds.h; keys past the sequence end are the caller's to mask.
// The same with the key tile's chunks already combined (k_span; ignored without segments).
__device__ __forceinline__ Cover classify_spans(const FlashParams& p, bool segments,
                                                const SegmentChunk& q_span,
                                                const SegmentChunk& k_span, int q0, int q1, int k0,
                                                int k1) {
  if (p.causal && k0 > q1 - 1) return Cover::hidden;
  if (p.window > 0 && k1 - 1 < q0 - (p.window - 1)) return Cover::hidden;
  bool segments_full = true;
  if (segments) {
    if (q_span.highest < q_span.lowest || k_span.highest < k_span.lowest) return Cover::hidden;
    if (q_span.highest < k_span.lowest || k_span.highest < q_span.lowest) return Cover::hidden;
    segments_full = !q_span.has_padding && !k_span.has_padding && q_span.lowest == q_span.highest &&
                    k_span.lowest == k_span.highest && q_span.lowest == k_span.lowest;
  }
  const bool causal_full = !p.causal || k1 - 1 <= q0;
  const bool window_full = p.window <= 0 || k0 >= (q1 - 1) - (p.window - 1);
  return causal_full && window_full && segments_full ? Cover::full : Cover::partial;
}

__device__ __forceinline__ Cover classify(const FlashParams& p, const SegmentChunk* seg_row,
                                          const SegmentChunk& q_span, int q0, int q1, int k0,
                                          int k1) {
  const SegmentChunk k_span =
      seg_row != nullptr ? combine_chunks(seg_row, k0, k1) : SegmentChunk{0, 0, 0, 0};
  return classify_spans(p, seg_row != nullptr, q_span, k_span, q0, q1, k0, k1);
}

// Key range [begin, end) that queries [q0, q1) may see under causal and window.
__device__ __forceinline__ int2 key_range(const FlashParams& p, int q0, int q1) {
  int2 r{0, p.seq_len};
  if (p.causal) r.y = min(p.seq_len, q1);
  if (p.window > 0) r.x = max(0, q0 - (p.window - 1));
  return r;
}

// Query range [begin, end) that may see keys [k0, k1) under causal and window.
__device__ __forceinline__ int2 query_range(const FlashParams& p, int k0, int k1) {
  int2 r{0, p.seq_len};
  if (p.causal) r.x = k0;
  if (p.window > 0) r.y = min(p.seq_len, (k1 - 1) + p.window);
  return r;
}

// The position part of the element-wise mask: key j exists, and causal and window let query i
// see it.
__device__ __forceinline__ bool allowed_position(const FlashParams& p, int i, int j) {
  if (j >= p.seq_len) return false;
  if (p.causal && j > i) return false;
  if (p.window > 0 && j < i - (p.window - 1)) return false;
  return true;
}

// The position part of the mask as one row's span: the positions [lo, hi) of the other side that
// causal and window leave visible, relative to `base` (a thread's first column of the tile).
// After unrolling, a column's test is two compares with constants, where allowed_position()
// chains three tests per element; the spans say the same (the GPU accuracy grid checks every
// kernel that uses them against the fp64 reference).
struct VisibleSpan {
  int lo, hi;
  __device__ __forceinline__ bool contains(int column) const { return column >= lo && column < hi; }
};
// The keys that query i sees (allowed_position(p, i, j) for j = base + column).
__device__ __forceinline__ VisibleSpan visible_keys(const FlashParams& p, int i, int base) {
  const int lo = p.window > 0 ? i - (p.window - 1) : 0;
  const int hi = p.causal ? min(i + 1, p.seq_len) : p.seq_len;
  return {lo - base, hi - base};
}
// The queries that see key j (allowed_position(p, i, j) for i = base + column; none where the
// key is past the end). Queries past the end are left out too: their dO rows are zero, so they
// add nothing to a gradient either way.
__device__ __forceinline__ VisibleSpan visible_queries(const FlashParams& p, int j, int base) {
  if (j >= p.seq_len) return {0, 0};
  const int lo = p.causal ? j : 0;
  const int hi = p.window > 0 ? min(j + p.window, p.seq_len) : p.seq_len;
  return {lo - base, hi - base};
}

// The segment part, with both ids already read: a query that is padding (qid < 0) sees nothing,
// and a key is seen only from its own segment.
__device__ __forceinline__ bool same_segment(int qid, int kid) {
  return qid >= 0 && qid == kid;
}

// Whether every position of [begin, end) has one segment id (no padding), and which: tiles
// inside one document (the usual case of packed documents) need no per-key id.
struct UniformSegment {
  bool uniform;
  int id;
};
__device__ __forceinline__ UniformSegment uniform_segment(const SegmentChunk* row, int begin,
                                                          int end) {
  const SegmentChunk s = combine_chunks(row, begin, end);
  return {s.lowest == s.highest && !s.has_padding, s.lowest};
}

// The segment part of a tile's element-wise mask that needs no key's id, folded into a row's span
// of visible keys: a row that is padding (qid < 0) sees no key, and on a tile whose keys are all
// of one document (`keys.uniform`) a row of another document sees none of them.
__device__ __forceinline__ VisibleSpan segment_span(VisibleSpan span, int qid,
                                                    UniformSegment keys) {
  return qid < 0 || (keys.uniform && keys.id != qid) ? VisibleSpan{0, 0} : span;
}
// The element-wise mask (attention.h allowed()), with the query's segment id already read
// (qid; pass 0 without segments) and positions past the sequence end hidden.
__device__ __forceinline__ bool allowed(const FlashParams& p, const int32_t* seg_row, int qid,
                                        int i, int j) {
  if (j >= p.seq_len) return false;
  if (p.causal && j > i) return false;
  if (p.window > 0 && j < i - (p.window - 1)) return false;
  if (seg_row != nullptr && (qid < 0 || seg_row[j] != qid)) return false;
  return true;
}

// Launches `kernel` on `stream` with `smem` bytes of dynamic shared memory (the opt-in past the
// default 48 KB is set on each call: it is per device, and cheap) and checks the launch.
template <typename Kernel, typename Args>
void launch_with_smem(Kernel kernel, dim3 grid, int threads, int smem, cudaStream_t stream,
                      const Args& args) {
  FT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  kernel<<<grid, threads, smem, stream>>>(args);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::attention::cuda

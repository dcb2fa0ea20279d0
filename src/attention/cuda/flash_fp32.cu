// fp32 flash attention on CUDA cores (the FlashAttention-2 algorithm in exact fp32: FMA, expf and
// logf, no TF32), behind flash_fp32_forward/backward (flash_launch.h).
//
// Every block has 256 threads laid out 16 x 16 (ty, tx). In a score tile (query rows x key rows)
// thread (ty, tx) owns rows ty * R + i and columns tx + 16 j; in a 64-row output accumulator it
// owns rows 4 ty + i and the float4 column chunks 4 tx + 64 u, in registers. Tiles of Q, K, V and
// dO sit in shared memory with rows padded by 4 floats, so the float4 reads of a score product
// hit distinct banks. Head dims go to three compiled buckets (<= 64, 128, 256); loops run to the
// runtime D.
//
// Forward, one block per (64-query tile, query head, batch row): Q stays in shared memory; for
// each 64-key tile the mask does not hide (classify()), load K and V, S = scale Q K^T, the
// element-wise mask on partial tiles only, online softmax (running max and sum per row; the
// accumulator is rescaled when the max grows), P through shared memory, O += P V. At the end
// O = acc / sum and lse = max + log(sum); a row that saw no key gets O = 0 and lse = -inf.
//
// Backward, two passes without atomics (the same inputs give the same bits):
//   dK/dV: one block per (64-key tile, query head, batch row) walks the query tiles that may see
//     its keys: recompute P = exp(S - lse), dP = dO V^T, dS = P (dP - dsum); dV += P^T dO and
//     dK += dS^T Q stay in registers and are written once. With grouped-query attention each
//     query head writes its part (FlashParams::dkv_part) and a last kernel sums the group's parts
//     in head order into dK and dV: a block per kv head instead would leave a batch-1 causal
//     backward with a few hundred blocks of very unequal length (the first key tile is seen by
//     every query tile), one short wave whose longest block sets the time.
//   dQ: one block per (64-query tile, query head, batch row) walks the visible key tiles,
//     recomputes P and dS the same way and accumulates dQ = dS K.
// At D = 256 the streamed operand of each backward pass comes in 32-row tiles, so that the four
// D-wide tiles fit in shared memory (227 KB per block).
//
// Traffic: the forward reads Q and writes O and lse once, and reads K and V once per visible
// (query tile, key tile) pair, about 2 * D * attended pairs / 64 floats. The dK/dV pass reads K
// and V once per block (once per query head of the group), and Q, dO, lse and dsum once per
// visible pair; with GQA it writes the 2 x [B, S, Hq, D] parts, which the sum reads once. The dQ
// pass reads K and V once per visible pair; dq, dk and dv are written once. Nothing of size
// S x S exists.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "attention/cuda/flash_common.cuh"
#include "attention/cuda/flash_launch.h"
#include "core/cuda/check.h"

namespace ft::attention::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kOutRows = 64;  // rows of every output accumulator tile (o, dq, dk, dv)

// The tile shape of one kernel: kBlockQ query rows x kBlockK key rows of the score tile, and the
// head-dim bucket the shared tiles are sized for.
template <int kHeadDimMaxV, int kBlockQV, int kBlockKV>
struct Tiles {
  static constexpr int kHeadDimMax = kHeadDimMaxV;
  static constexpr int kBlockQ = kBlockQV;
  static constexpr int kBlockK = kBlockKV;
  static constexpr int kRows = kBlockQ / 16;        // score rows of a thread
  static constexpr int kCols = kBlockK / 16;        // score columns of a thread
  static constexpr int kChunks = kHeadDimMax / 64;  // float4 chunks of an accumulator row
  static constexpr int kStride = kHeadDimMax + 4;   // row stride of the Q, K, V, dO tiles
  // Row stride of a P or dS tile: the two half-warps' rows (kRows apart) start 16 banks apart,
  // so the scalar stores of a warp do not conflict; a multiple of 4 for float4 reads.
  static constexpr int kScoreStride = kBlockK + 16 / kRows;
  // Small tiles leave registers for a second block per SM.
  static constexpr int kMinBlocks = kHeadDimMax <= 64 ? 2 : 1;
  static_assert(kBlockQ % 32 == 0 && kBlockK % 32 == 0 && kHeadDimMax % 64 == 0);
};

template <int kHeadDimMax>
using ForwardTiles = Tiles<kHeadDimMax, 64, 64>;
template <int kHeadDimMax>
using DkvTiles = Tiles<kHeadDimMax, kHeadDimMax == 256 ? 32 : 64, 64>;
template <int kHeadDimMax>
using DqTiles = Tiles<kHeadDimMax, 64, kHeadDimMax == 256 ? 32 : 64>;

// Shared memory layouts, in floats; the host sizes the launch from the same numbers.
template <class T>
struct ForwardSmem {
  static constexpr int q = 0;
  static constexpr int k = q + T::kBlockQ * T::kStride;
  static constexpr int v = k + T::kBlockK * T::kStride;
  static constexpr int probs = v + T::kBlockK * T::kStride;
  static constexpr int floats = probs + T::kBlockQ * T::kScoreStride;
};

template <class T>
struct DkvSmem {
  static constexpr int k = 0;
  static constexpr int v = k + T::kBlockK * T::kStride;
  static constexpr int q = v + T::kBlockK * T::kStride;
  static constexpr int dout = q + T::kBlockQ * T::kStride;
  static constexpr int probs = dout + T::kBlockQ * T::kStride;
  static constexpr int dscores = probs + T::kBlockQ * T::kScoreStride;
  static constexpr int floats = dscores + T::kBlockQ * T::kScoreStride;
};

template <class T>
struct DqSmem {
  static constexpr int q = 0;
  static constexpr int dout = q + T::kBlockQ * T::kStride;
  static constexpr int k = dout + T::kBlockQ * T::kStride;
  static constexpr int v = k + T::kBlockK * T::kStride;
  static constexpr int dscores = v + T::kBlockK * T::kStride;
  static constexpr int floats = dscores + T::kBlockQ * T::kScoreStride;
};

// ---- device helpers ----

__device__ __forceinline__ int thread_row() {
  return threadIdx.x / 16;
}
__device__ __forceinline__ int thread_col() {
  return threadIdx.x % 16;
}

// One head of a [B, S, H, D] tensor: position i starts at data + i * row_stride.
struct HeadRows {
  const float* data;
  int64_t row_stride;
};

__device__ __forceinline__ HeadRows head_rows(const void* t, const FlashParams& p, int heads, int b,
                                              int h) {
  const int64_t row_stride = static_cast<int64_t>(heads) * p.head_dim;
  const float* base = static_cast<const float*>(t);
  return {base + static_cast<int64_t>(b) * p.seq_len * row_stride +
              static_cast<int64_t>(h) * p.head_dim,
          row_stride};
}

__device__ __forceinline__ float4 fma4(float a, float4 b, float4 c) {
  return make_float4(fmaf(a, b.x, c.x), fmaf(a, b.y, c.y), fmaf(a, b.z, c.z), fmaf(a, b.w, c.w));
}

__device__ __forceinline__ float4 mul4(float a, float4 b) {
  return make_float4(a * b.x, a * b.y, a * b.z, a * b.w);
}

// Reductions over the 16 lanes that share a score row (a half-warp). Every lane of the half gets
// the same bits: the butterfly only ever adds the same two partial sums in either order.
__device__ __forceinline__ float half_warp_max(float v) {
  for (int offset = 8; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}
__device__ __forceinline__ float half_warp_sum(float v) {
  for (int offset = 8; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Positions [row0, row0 + kTileRows) of a head into a shared tile. Positions past the sequence
// are zero: they must add nothing (and no NaN) to the products that sum over rows.
template <int kTileRows, int kStride>
__device__ void load_tile(float* tile, HeadRows src, int row0, int seq_len, int head_dim) {
  const int vecs = head_dim / 4;
  for (int idx = threadIdx.x; idx < kTileRows * vecs; idx += kThreads) {
    const int r = idx / vecs, c = idx - r * vecs;
    float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (row0 + r < seq_len) {
      x = __ldg(reinterpret_cast<const float4*>(src.data + (row0 + r) * src.row_stride) + c);
    }
    *reinterpret_cast<float4*>(tile + r * kStride + 4 * c) = x;
  }
}

// s[i][j] = sum_d a[ty * kRows + i][d] * b[tx + 16 j][d]: a holds kBlockQ rows, b kBlockK rows.
template <class T>
__device__ void score_tile(const float* a, const float* b, int head_dim,
                           float (&s)[T::kRows][T::kCols]) {
  const float* a_rows = a + thread_row() * T::kRows * T::kStride;
  const float* b_rows = b + thread_col() * T::kStride;
#pragma unroll
  for (int i = 0; i < T::kRows; ++i) {
#pragma unroll
    for (int j = 0; j < T::kCols; ++j) s[i][j] = 0.0f;
  }
  // Rolled: each step is already kRows * kCols * 4 FMAs, and unrolling costs the registers
  // that the 128-register kernels (two blocks per SM) do not have.
#pragma unroll 1
  for (int d = 0; d < head_dim; d += 4) {
    float4 av[T::kRows], bv[T::kCols];
#pragma unroll
    for (int i = 0; i < T::kRows; ++i) {
      av[i] = *reinterpret_cast<const float4*>(a_rows + i * T::kStride + d);
    }
#pragma unroll
    for (int j = 0; j < T::kCols; ++j) {
      bv[j] = *reinterpret_cast<const float4*>(b_rows + 16 * j * T::kStride + d);
    }
#pragma unroll
    for (int i = 0; i < T::kRows; ++i) {
#pragma unroll
      for (int j = 0; j < T::kCols; ++j) {
        float x = s[i][j];
        x = fmaf(av[i].x, bv[j].x, x);
        x = fmaf(av[i].y, bv[j].y, x);
        x = fmaf(av[i].z, bv[j].z, x);
        x = fmaf(av[i].w, bv[j].w, x);
        s[i][j] = x;
      }
    }
  }
}

// acc[i][u] += sum_x L(4 ty + i, x) * r[x][4 tx + 64 u ...]: the product of a score tile (P or
// dS, in shared memory) with a D-wide tile. L is l[row][x] for P V and dS K, and l[x][row]
// (kTransposed) for P^T dO and dS^T Q. Chunks past the head dim are left alone.
template <int kX, int kLStride, bool kTransposed, int kChunks, int kStride>
__device__ void accumulate_product(const float* l, const float* r, int head_dim,
                                   float4 (&acc)[4][kChunks]) {
  const int ty = thread_row(), tx = thread_col();
  static_assert(kX % 4 == 0 && kLStride % 4 == 0);
#pragma unroll 1
  for (int x = 0; x < kX; x += 4) {
    float lv[4][4];  // [output row i][x + k]
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const float4 t = kTransposed
                           ? *reinterpret_cast<const float4*>(l + (x + n) * kLStride + 4 * ty)
                           : *reinterpret_cast<const float4*>(l + (4 * ty + n) * kLStride + x);
      // Transposed: t holds rows 4ty..4ty+3 at x + n; otherwise row 4ty + n at x..x+3.
      const float t4[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        if (kTransposed) {
          lv[m][n] = t4[m];
        } else {
          lv[n][m] = t4[m];
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int col = 4 * tx + 64 * u;
      if (col >= head_dim) continue;
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float4 rv = *reinterpret_cast<const float4*>(r + (x + k) * kStride + col);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i][u] = fma4(lv[i][k], rv, acc[i][u]);
      }
    }
  }
}

// Rows [row0, row0 + 64) of an accumulator, each times its factor, into a head of a
// [B, S, H, D] tensor; positions past the sequence are dropped.
template <int kChunks>
__device__ void store_rows(void* dst, const FlashParams& p, int heads, int b, int h, int row0,
                           const float (&factor)[4], const float4 (&acc)[4][kChunks]) {
  const HeadRows rows = head_rows(dst, p, heads, b, h);
  float* out = const_cast<float*>(rows.data);
  const int ty = thread_row(), tx = thread_col();
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int pos = row0 + 4 * ty + i;
    if (pos >= p.seq_len) continue;
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int col = 4 * tx + 64 * u;
      if (col >= p.head_dim) continue;
      *reinterpret_cast<float4*>(out + pos * rows.row_stride + col) = mul4(factor[i], acc[i][u]);
    }
  }
}

// The segment ids of a thread's score rows (allowed()'s qid): 0 without segments, -1 (attends
// nothing) past the sequence end so that no id is read out of bounds.
template <int kRows>
__device__ void query_ids(const int32_t* seg_row, int row0, int seq_len, int (&qid)[kRows]) {
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int pos = row0 + i;
    qid[i] = seg_row == nullptr ? 0 : (pos < seq_len ? seg_row[pos] : -1);
  }
}

// Sets the scores of hidden pairs to -inf: element-wise on partial tiles; on full tiles only the
// columns past the sequence end (a full tile's key range is clamped to seq_len, the shared tile
// is not).
template <class T>
__device__ void mask_scores(const FlashParams& p, Cover cover, const int32_t* seg_row,
                            const int (&qid)[T::kRows], int q0, int k0,
                            float (&s)[T::kRows][T::kCols]) {
  const int row0 = q0 + thread_row() * T::kRows, col0 = k0 + thread_col();
#pragma unroll
  for (int i = 0; i < T::kRows; ++i) {
#pragma unroll
    for (int j = 0; j < T::kCols; ++j) {
      const int key = col0 + 16 * j;
      const bool hidden =
          cover == Cover::partial ? !allowed(p, seg_row, qid[i], row0 + i, key) : key >= p.seq_len;
      if (hidden) s[i][j] = -INFINITY;
    }
  }
}

// The per-row values the backward needs for a thread's score rows: lse and dsum of query head h,
// and the segment ids. Rows past the sequence get lse = -inf, which makes their P (and dS) zero.
template <int kRows>
struct RowStats {
  float lse[kRows], dsum[kRows];
  int qid[kRows];
};

template <int kRows>
__device__ RowStats<kRows> row_stats(const FlashParams& p, const int32_t* seg_row, int b, int h,
                                     int row0) {
  RowStats<kRows> st;
  const int64_t base = (static_cast<int64_t>(b) * p.q_heads + h) * p.seq_len;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int pos = row0 + i;
    const bool inside = pos < p.seq_len;
    st.lse[i] = inside ? p.lse[base + pos] : -INFINITY;
    st.dsum[i] = inside ? p.dsum[base + pos] : 0.0f;
  }
  query_ids(seg_row, row0, p.seq_len, st.qid);
  return st;
}

// Recomputes a tile's P = exp(scale s - lse) into s and dS = P (dP - dsum) into dp, from the raw
// dot products s = Q K^T and dp = dO V^T. P is 0 where the mask hides a pair and on rows with
// lse = -inf (no key seen), so that exp(-inf - (-inf)) never happens; dS is then exactly 0.
template <class T>
__device__ void probabilities_and_gradient(const FlashParams& p, Cover cover,
                                           const int32_t* seg_row, const RowStats<T::kRows>& st,
                                           int q0, int k0, float (&s)[T::kRows][T::kCols],
                                           float (&dp)[T::kRows][T::kCols]) {
#pragma unroll
  for (int i = 0; i < T::kRows; ++i) {
#pragma unroll
    for (int j = 0; j < T::kCols; ++j) s[i][j] *= p.scale;
  }
  mask_scores<T>(p, cover, seg_row, st.qid, q0, k0, s);
#pragma unroll
  for (int i = 0; i < T::kRows; ++i) {
    const bool empty_row = st.lse[i] == -INFINITY;
#pragma unroll
    for (int j = 0; j < T::kCols; ++j) {
      const float prob = empty_row ? 0.0f : expf(s[i][j] - st.lse[i]);
      s[i][j] = prob;
      dp[i][j] = prob * (dp[i][j] - st.dsum[i]);
    }
  }
}

// A score tile from registers into shared memory [kBlockQ][kScoreStride].
template <class T>
__device__ void store_scores(float* tile, const float (&s)[T::kRows][T::kCols]) {
  float* rows = tile + thread_row() * T::kRows * T::kScoreStride + thread_col();
#pragma unroll
  for (int i = 0; i < T::kRows; ++i) {
#pragma unroll
    for (int j = 0; j < T::kCols; ++j) rows[i * T::kScoreStride + 16 * j] = s[i][j];
  }
}

template <int kChunks>
__device__ void zero(float4 (&acc)[4][kChunks]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int u = 0; u < kChunks; ++u) acc[i][u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

// The mask's per-batch-row inputs: ids for allowed(), chunk summaries for classify().
struct SegmentRows {
  const int32_t* ids;
  const SegmentChunk* chunks;
};

__device__ __forceinline__ SegmentRows segment_rows(const FlashParams& p, int b) {
  if (p.segment_ids == nullptr) return {nullptr, nullptr};
  return {p.segment_ids + static_cast<int64_t>(b) * p.seq_len,
          p.segment_chunks + static_cast<int64_t>(b) * p.chunks_per_row()};
}

__device__ __forceinline__ SegmentChunk query_span(const SegmentRows& seg, int q0, int q1) {
  return seg.chunks != nullptr ? combine_chunks(seg.chunks, q0, q1) : SegmentChunk{};
}

// What a forward or dQ block knows of its query block. The grid is (query tiles, query heads,
// batch), the query tiles last-first: under causal masks the last ones see the most keys and
// should start early.
struct QueryBlock {
  int q0, q1, h, b;
  SegmentRows seg;
  SegmentChunk q_span;
};

template <class T>
__device__ __forceinline__ QueryBlock query_block(const FlashParams& p) {
  const int q0 = (gridDim.x - 1 - blockIdx.x) * T::kBlockQ, q1 = min(q0 + T::kBlockQ, p.seq_len);
  const int h = blockIdx.y, b = blockIdx.z;
  const SegmentRows seg = segment_rows(p, b);
  return {q0, q1, h, b, seg, query_span(seg, q0, q1)};
}

// The K and V rows that query head h of batch row b reads.
struct KvRows {
  HeadRows k, v;
};

__device__ __forceinline__ KvRows kv_rows(const FlashParams& p, int b, int h) {
  const int kv = h / p.group();
  return {head_rows(p.k, p, p.kv_heads, b, kv), head_rows(p.v, p, p.kv_heads, b, kv)};
}

// Key tile k0's K and V into shared memory once every thread is done with the previous tile's
// (and with what the block staged beside them from it: P, dS).
template <class T>
__device__ __forceinline__ void load_key_tile(const KvRows& rows, int k0, int S, int D,
                                              float* k_tile, float* v_tile) {
  __syncthreads();
  load_tile<T::kBlockK, T::kStride>(k_tile, rows.k, k0, S, D);
  load_tile<T::kBlockK, T::kStride>(v_tile, rows.v, k0, S, D);
  __syncthreads();
}

// ---- kernels ----

// grid (query tiles, query heads, batch), last tiles first (query_block).
template <class T>
__global__ void __launch_bounds__(kThreads, T::kMinBlocks)
    flash_fp32_forward_kernel(const __grid_constant__ FlashParams p) {
  static_assert(T::kBlockQ == kOutRows, "a thread's score rows are its output rows");
  using Smem = ForwardSmem<T>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* q_tile = smem + Smem::q;
  float* k_tile = smem + Smem::k;
  float* v_tile = smem + Smem::v;
  float* p_tile = smem + Smem::probs;

  const int S = p.seq_len, D = p.head_dim;
  const auto [q0, q1, h, b, seg, q_span] = query_block<T>(p);
  const KvRows kv = kv_rows(p, b, h);
  int qid[T::kRows];
  query_ids(seg.ids, q0 + thread_row() * T::kRows, S, qid);

  load_tile<T::kBlockQ, T::kStride>(q_tile, head_rows(p.q, p, p.q_heads, b, h), q0, S, D);

  // Running max of the scaled scores of each row (shared by the half-warp) and this thread's
  // part of the row sum of exp(score - max); the parts are added once at the end.
  float row_max[T::kRows], row_sum[T::kRows];
#pragma unroll
  for (int i = 0; i < T::kRows; ++i) row_max[i] = -INFINITY, row_sum[i] = 0.0f;
  float4 acc[4][T::kChunks];
  zero(acc);

  const int2 keys = key_range(p, q0, q1);
  for (int k0 = keys.x / T::kBlockK * T::kBlockK; k0 < keys.y; k0 += T::kBlockK) {
    const Cover cover = classify(p, seg.chunks, q_span, q0, q1, k0, min(k0 + T::kBlockK, S));
    if (cover == Cover::hidden) continue;  // the same for the whole block
    load_key_tile<T>(kv, k0, S, D, k_tile, v_tile);

    float s[T::kRows][T::kCols];
    score_tile<T>(q_tile, k_tile, D, s);
#pragma unroll
    for (int i = 0; i < T::kRows; ++i) {
#pragma unroll
      for (int j = 0; j < T::kCols; ++j) s[i][j] *= p.scale;
    }
    mask_scores<T>(p, cover, seg.ids, qid, q0, k0, s);
#pragma unroll
    for (int i = 0; i < T::kRows; ++i) {
      float tile_max = s[i][0];
#pragma unroll
      for (int j = 1; j < T::kCols; ++j) tile_max = fmaxf(tile_max, s[i][j]);
      const float new_max = fmaxf(row_max[i], half_warp_max(tile_max));
      if (new_max == -INFINITY) {  // no key of the row so far: avoid exp(-inf - (-inf))
#pragma unroll
        for (int j = 0; j < T::kCols; ++j) s[i][j] = 0.0f;
        continue;
      }
      const float correction = expf(row_max[i] - new_max);  // 0 when the old max was -inf
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < T::kCols; ++j) {
        s[i][j] = expf(s[i][j] - new_max);
        sum += s[i][j];
      }
      row_sum[i] = row_sum[i] * correction + sum;
      row_max[i] = new_max;
#pragma unroll
      for (int u = 0; u < T::kChunks; ++u) acc[i][u] = mul4(correction, acc[i][u]);
    }
    store_scores<T>(p_tile, s);
    __syncthreads();
    accumulate_product<T::kBlockK, T::kScoreStride, false, T::kChunks, T::kStride>(p_tile, v_tile,
                                                                                   D, acc);
  }

  float inv_sum[T::kRows];
  const int64_t lse_base = (static_cast<int64_t>(b) * p.q_heads + h) * S;
#pragma unroll
  for (int i = 0; i < T::kRows; ++i) {
    const float total = half_warp_sum(row_sum[i]);
    const bool saw_keys = total > 0.0f;  // the row's largest score contributes exp(0) = 1
    inv_sum[i] = saw_keys ? 1.0f / total : 0.0f;
    const int pos = q0 + thread_row() * T::kRows + i;
    if (thread_col() == 0 && pos < S) {
      p.lse[lse_base + pos] = saw_keys ? row_max[i] + logf(total) : -INFINITY;
    }
  }
  store_rows(p.o, p, p.q_heads, b, h, q0, inv_sum, acc);
}

// grid (query heads, key tiles, batch): the heads of a key tile run side by side (a group shares
// its K and V tiles), and under a causal mask the first key tiles, which the most query tiles
// see, start first. dK and dV of the block's keys from its query head, in registers; every
// element is written (zeros where no query sees the key): into dk and dv when each kv head has
// one query head, else into the head's part of dkv_part.
template <class T>
__global__ void __launch_bounds__(kThreads, T::kMinBlocks)
    flash_fp32_dkv_kernel(const __grid_constant__ FlashParams p) {
  static_assert(T::kBlockK == kOutRows, "the accumulators hold the block's key rows");
  using Smem = DkvSmem<T>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* k_tile = smem + Smem::k;
  float* v_tile = smem + Smem::v;
  float* q_tile = smem + Smem::q;
  float* do_tile = smem + Smem::dout;
  float* p_tile = smem + Smem::probs;
  float* ds_tile = smem + Smem::dscores;

  const int S = p.seq_len, D = p.head_dim, group = p.group();
  const int h = blockIdx.x, kv = h / group, b = blockIdx.z;
  const int k0 = blockIdx.y * T::kBlockK, k1 = min(k0 + T::kBlockK, S);
  const SegmentRows seg = segment_rows(p, b);

  load_tile<T::kBlockK, T::kStride>(k_tile, head_rows(p.k, p, p.kv_heads, b, kv), k0, S, D);
  load_tile<T::kBlockK, T::kStride>(v_tile, head_rows(p.v, p, p.kv_heads, b, kv), k0, S, D);
  float4 dk[4][T::kChunks], dv[4][T::kChunks];
  zero(dk);
  zero(dv);

  const int2 queries = query_range(p, k0, k1);
  for (int q0 = queries.x / T::kBlockQ * T::kBlockQ; q0 < queries.y; q0 += T::kBlockQ) {
    const int q1 = min(q0 + T::kBlockQ, S);
    const Cover cover = classify(p, seg.chunks, query_span(seg, q0, q1), q0, q1, k0, k1);
    if (cover == Cover::hidden) continue;  // the same for the whole block
    const RowStats<T::kRows> st =
        row_stats<T::kRows>(p, seg.ids, b, h, q0 + thread_row() * T::kRows);
    // The previous tile's reads of Q, dO, P and dS are done.
    __syncthreads();
    load_tile<T::kBlockQ, T::kStride>(q_tile, head_rows(p.q, p, p.q_heads, b, h), q0, S, D);
    load_tile<T::kBlockQ, T::kStride>(do_tile, head_rows(p.dout, p, p.q_heads, b, h), q0, S, D);
    __syncthreads();

    float s[T::kRows][T::kCols], dp[T::kRows][T::kCols];
    score_tile<T>(q_tile, k_tile, D, s);
    score_tile<T>(do_tile, v_tile, D, dp);
    probabilities_and_gradient<T>(p, cover, seg.ids, st, q0, k0, s, dp);
    store_scores<T>(p_tile, s);
    store_scores<T>(ds_tile, dp);
    __syncthreads();
    accumulate_product<T::kBlockQ, T::kScoreStride, true, T::kChunks, T::kStride>(p_tile, do_tile,
                                                                                  D, dv);
    accumulate_product<T::kBlockQ, T::kScoreStride, true, T::kChunks, T::kStride>(ds_tile, q_tile,
                                                                                  D, dk);
  }

  const float dk_factor[4] = {p.scale, p.scale, p.scale, p.scale};
  const float dv_factor[4] = {1.0f, 1.0f, 1.0f, 1.0f};
  if (group == 1) {
    store_rows(p.dk, p, p.kv_heads, b, kv, k0, dk_factor, dk);
    store_rows(p.dv, p, p.kv_heads, b, kv, k0, dv_factor, dv);
  } else {
    const int64_t part = static_cast<int64_t>(p.batch) * S * p.q_heads * D;
    store_rows(p.dkv_part, p, p.q_heads, b, h, k0, dk_factor, dk);
    store_rows(p.dkv_part + part, p, p.q_heads, b, h, k0, dv_factor, dv);
  }
}

// dK and dV [B, S, Hkv, D] from the parts of dkv_part: each float4 the sum over the group's query
// heads in head order (a fixed order: the same inputs give the same bits). One thread per float4.
__global__ void sum_group_parts_kernel(const __grid_constant__ FlashParams p) {
  const int vecs = p.head_dim / 4, group = p.group();
  const int64_t n = static_cast<int64_t>(p.batch) * p.seq_len * p.kv_heads * vecs;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t row = i / (p.kv_heads * vecs);  // (batch, position)
  const int within = static_cast<int>(i - row * p.kv_heads * vecs);
  const int kv = within / vecs, c = within - kv * vecs;
  const auto* dk_part = reinterpret_cast<const float4*>(p.dkv_part);
  const float4* dv_part = dk_part + n * group;
  int64_t src = (row * p.q_heads + static_cast<int64_t>(kv) * group) * vecs + c;
  float4 dk = dk_part[src], dv = dv_part[src];
  for (int g = 1; g < group; ++g) {
    src += vecs;
    const float4 a = dk_part[src], v = dv_part[src];
    dk = make_float4(dk.x + a.x, dk.y + a.y, dk.z + a.z, dk.w + a.w);
    dv = make_float4(dv.x + v.x, dv.y + v.y, dv.z + v.z, dv.w + v.w);
  }
  reinterpret_cast<float4*>(p.dk)[i] = dk;
  reinterpret_cast<float4*>(p.dv)[i] = dv;
}

// grid (query tiles, query heads, batch), last tiles first as in the forward. dQ of the block's
// queries; every element is written (zeros for rows that see no key).
template <class T>
__global__ void __launch_bounds__(kThreads, T::kMinBlocks)
    flash_fp32_dq_kernel(const __grid_constant__ FlashParams p) {
  static_assert(T::kBlockQ == kOutRows, "a thread's score rows are its output rows");
  using Smem = DqSmem<T>;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* q_tile = smem + Smem::q;
  float* do_tile = smem + Smem::dout;
  float* k_tile = smem + Smem::k;
  float* v_tile = smem + Smem::v;
  float* ds_tile = smem + Smem::dscores;

  const int S = p.seq_len, D = p.head_dim;
  const auto [q0, q1, h, b, seg, q_span] = query_block<T>(p);
  const KvRows kv = kv_rows(p, b, h);
  const RowStats<T::kRows> st = row_stats<T::kRows>(p, seg.ids, b, h, q0 + thread_row() * T::kRows);

  load_tile<T::kBlockQ, T::kStride>(q_tile, head_rows(p.q, p, p.q_heads, b, h), q0, S, D);
  load_tile<T::kBlockQ, T::kStride>(do_tile, head_rows(p.dout, p, p.q_heads, b, h), q0, S, D);
  float4 dq[4][T::kChunks];
  zero(dq);

  const int2 keys = key_range(p, q0, q1);
  for (int k0 = keys.x / T::kBlockK * T::kBlockK; k0 < keys.y; k0 += T::kBlockK) {
    const Cover cover = classify(p, seg.chunks, q_span, q0, q1, k0, min(k0 + T::kBlockK, S));
    if (cover == Cover::hidden) continue;  // the same for the whole block
    load_key_tile<T>(kv, k0, S, D, k_tile, v_tile);

    float s[T::kRows][T::kCols], dp[T::kRows][T::kCols];
    score_tile<T>(q_tile, k_tile, D, s);
    score_tile<T>(do_tile, v_tile, D, dp);
    probabilities_and_gradient<T>(p, cover, seg.ids, st, q0, k0, s, dp);
    store_scores<T>(ds_tile, dp);
    __syncthreads();
    accumulate_product<T::kBlockK, T::kScoreStride, false, T::kChunks, T::kStride>(ds_tile, k_tile,
                                                                                   D, dq);
  }

  const float factor[4] = {p.scale, p.scale, p.scale, p.scale};
  store_rows(p.dq, p, p.q_heads, b, h, q0, factor, dq);
}

// ---- host side ----

bool aligned16(const void* ptr) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0;
}

// What the kernels assume of the parameters; flash.cu and Problem::validate() guarantee it, so
// a failure here is a caller's bug, reported with the offending value.
void check_params(const FlashParams& p, bool backward) {
  FT_CHECK(p.head_dim >= 8 && p.head_dim <= 256 && p.head_dim % 8 == 0, "flash fp32: head dim ",
           p.head_dim, " must be a multiple of 8 in [8, 256]");
  FT_CHECK(p.kv_heads > 0 && p.q_heads % p.kv_heads == 0, "flash fp32: q heads ", p.q_heads,
           " must be a multiple of kv heads ", p.kv_heads);
  FT_CHECK(p.seq_len > 0 && p.batch > 0, "flash fp32: batch ", p.batch, " and seq len ", p.seq_len,
           " must be positive");
  FT_CHECK(p.batch <= 65535 && p.q_heads <= 65535 && p.seq_len <= 65535 * 64, "flash fp32: batch ",
           p.batch, " and q heads ", p.q_heads, " must be at most 65535, seq len ", p.seq_len,
           " at most ", 65535 * 64, " (grid y/z)");
  FT_CHECK((p.segment_ids == nullptr) == (p.segment_chunks == nullptr),
           "flash fp32: segment ids and their chunk summary must be given together");
  // float4 loads and stores: the base of every [B, S, H, D] tensor must be 16-byte aligned (rows
  // are, D being a multiple of 8).
  bool aligned = aligned16(p.q) && aligned16(p.k) && aligned16(p.v);
  if (backward) {
    aligned = aligned && aligned16(p.dout) && aligned16(p.dq) && aligned16(p.dk) && aligned16(p.dv);
    FT_CHECK(p.group() == 1 || p.dkv_part != nullptr,
             "flash fp32: grouped-query backward needs the dK/dV part buffer (dkv_part)");
    aligned = aligned && aligned16(p.dkv_part);
  } else {
    aligned = aligned && aligned16(p.o);
  }
  FT_CHECK(aligned, "flash fp32: q, k, v, o, dout, dq, dk, dv must be 16-byte aligned");
}

unsigned tiles(int seq_len, int block) {
  return static_cast<unsigned>((seq_len + block - 1) / block);
}

// The largest opt-in shared memory of a block on sm_90 (H100/H200): every tile set fits it.
constexpr int kMaxSmemBytes = 232448;

template <class Kernel>
void launch(Kernel kernel, dim3 grid, int smem_floats, const FlashParams& p, cudaStream_t stream) {
  const int bytes = smem_floats * static_cast<int>(sizeof(float));
  int device = 0, optin = 0;
  FT_CUDA_CHECK(cudaGetDevice(&device));
  FT_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  FT_CHECK(bytes <= optin, "flash fp32: head dim ", p.head_dim, " needs ", bytes,
           " bytes of shared memory per block, the device offers ", optin,
           " (the fp32 tiles are sized for sm_90's ", kMaxSmemBytes, ")");
  launch_with_smem(kernel, grid, kThreads, bytes, stream, p);
}

template <int kHeadDimMax>
void forward(const FlashParams& p, cudaStream_t stream) {
  using T = ForwardTiles<kHeadDimMax>;
  static_assert(ForwardSmem<T>::floats * sizeof(float) <= kMaxSmemBytes);
  const dim3 grid(tiles(p.seq_len, T::kBlockQ), p.q_heads, p.batch);
  launch(flash_fp32_forward_kernel<T>, grid, ForwardSmem<T>::floats, p, stream);
}

template <int kHeadDimMax>
void backward(const FlashParams& p, cudaStream_t stream) {
  using Dkv = DkvTiles<kHeadDimMax>;
  using Dq = DqTiles<kHeadDimMax>;
  static_assert(DkvSmem<Dkv>::floats * sizeof(float) <= kMaxSmemBytes);
  static_assert(DqSmem<Dq>::floats * sizeof(float) <= kMaxSmemBytes);
  launch(flash_fp32_dkv_kernel<Dkv>, dim3(p.q_heads, tiles(p.seq_len, Dkv::kBlockK), p.batch),
         DkvSmem<Dkv>::floats, p, stream);
  if (p.group() > 1) {
    const int64_t n = static_cast<int64_t>(p.batch) * p.seq_len * p.kv_heads * (p.head_dim / 4);
    sum_group_parts_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(p);
    FT_CUDA_CHECK_LAUNCH();
  }
  launch(flash_fp32_dq_kernel<Dq>, dim3(tiles(p.seq_len, Dq::kBlockQ), p.q_heads, p.batch),
         DqSmem<Dq>::floats, p, stream);
}

}  // namespace

void flash_fp32_forward(const FlashParams& p, cudaStream_t stream) {
  check_params(p, false);
  if (p.head_dim <= 64) return forward<64>(p, stream);
  if (p.head_dim <= 128) return forward<128>(p, stream);
  forward<256>(p, stream);
}

void flash_fp32_backward(const FlashParams& p, cudaStream_t stream) {
  check_params(p, true);
  if (p.head_dim <= 64) return backward<64>(p, stream);
  if (p.head_dim <= 128) return backward<128>(p, stream);
  backward<256>(p, stream);
}

}  // namespace ft::attention::cuda

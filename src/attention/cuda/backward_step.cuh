// The pieces of one bf16 backward step that the wgmma and the tma backward share
// (flash_wgmma.cuh, flash_tma_backward.cuh): a consumer warpgroup's products S^T = K Q^T and
// dP^T = V dO^T, then P^T and dS^T in its registers. Rows are the warpgroup's keys, columns the
// step's BM queries; this thread holds columns qt * 8 + (lane % 4) * 2 + {0, 1} of rows key_row
// and key_row + 8 (the wgmma accumulator layout).
#pragma once

#include <cstdint>

#include "attention/cuda/flash_bf16.cuh"
#include "attention/cuda/hopper.cuh"

namespace ft::attention::cuda::backward_step {

// Segment ids of this thread's two keys (-2 past the end: a key that does not exist).
template <bool SEG>
__device__ __forceinline__ void key_segment_ids(const int32_t* seg_row, int k0, int key_row, int S,
                                                int (&kid)[2]) {
  kid[0] = kid[1] = 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = k0 + key_row + 8 * half;
    if (SEG) kid[half] = j < S ? seg_row[j] : -2;
  }
}

// What runs between the issue of S^T's and of dP^T's products (issue_score_products): nothing.
struct NothingBetween {
  __device__ __forceinline__ void operator()() const {}
};

// Warpgroup products of a step, each its own commit group. All operands are K-major panels in
// shared memory: K and V tiles of BN rows, Q and dO tiles of BM rows, of which the products take
// QN (from where q_stage and do_stage point: every query of the tile, or a consumer's share).
// S^T = K Q^T:
template <int BM, int BN, int D, int QN = BM>
__device__ __forceinline__ void issue_st(float (&st)[QN / 2], uint64_t k_rows, uint64_t q_stage) {
  using hopper::advance;
  using hopper::kPanelRowBytes;
  hopper::wg_fence();
#pragma unroll
  for (int kd = 0; kd < D / 16; ++kd) {
    const uint32_t key_off = (kd / 4) * BN * kPanelRowBytes + (kd % 4) * 32;
    const uint32_t query_off = (kd / 4) * BM * kPanelRowBytes + (kd % 4) * 32;
    hopper::mma_ss<QN, 0, 0>(st, advance(k_rows, key_off), advance(q_stage, query_off), kd > 0);
  }
  hopper::wg_commit();
}
// dP^T = V dO^T (the fence also keeps loads issued before it ahead of the products in ptxas's
// schedule):
template <int BM, int BN, int D, int QN = BM>
__device__ __forceinline__ void issue_dpt(float (&dpt)[QN / 2], uint64_t v_rows,
                                          uint64_t do_stage) {
  using hopper::advance;
  using hopper::kPanelRowBytes;
  hopper::wg_fence();
#pragma unroll
  for (int kd = 0; kd < D / 16; ++kd) {
    const uint32_t key_off = (kd / 4) * BN * kPanelRowBytes + (kd % 4) * 32;
    const uint32_t query_off = (kd / 4) * BM * kPanelRowBytes + (kd % 4) * 32;
    hopper::mma_ss<QN, 0, 0>(dpt, advance(v_rows, key_off), advance(do_stage, query_off), kd > 0);
  }
  hopper::wg_commit();
}
// Both, S^T first, so that P^T can be computed while dP^T runs; `between` runs after S^T's
// products are issued and before dP^T's (shared-memory loads there queue behind S^T's operand
// reads only).
template <int BM, int BN, int D, int QN = BM, typename Between = NothingBetween>
__device__ __forceinline__ void issue_score_products(float (&st)[QN / 2], float (&dpt)[QN / 2],
                                                     uint64_t k_rows, uint64_t v_rows,
                                                     uint64_t q_stage, uint64_t do_stage,
                                                     Between between = {}) {
  issue_st<BM, BN, D, QN>(st, k_rows, q_stage);
  between();
  issue_dpt<BM, BN, D, QN>(dpt, v_rows, do_stage);
}

// What the softmax step of a query tile reads besides the products.
struct StepRows {
  const float* lse;   // the tile's lse, BM values (natural log, or log2 units: LSE_LOG2 below)
  const float* dsum;  // the tile's D = rowsum(dO * O), BM values
  int q0, k0, key_row, lane, seq_len;
  bool partial;  // a mask boundary (or the end of the keys) cuts this group's keys of the tile
};

// lse in log2 units, the form the exponentials use: +inf for a row that sees nothing (lse -inf),
// so that its P is exactly 0.
__device__ __forceinline__ float lse_log2(float lse) {
  return lse == -INFINITY ? INFINITY : lse * 1.4426950408889634f;
}

// P^T = exp2(S^T * scale_log2 - lse_log2), in place; MASKED: zero where the mask hides a position
// (the tiles a boundary cuts; a separate loop, so that the others test nothing per element).
// `seen[h]`: whether key h's segment can be seen from the tile at all (false folds the segment
// test of a tile inside one document into the key's span); PER_QUERY: the segment ids of a tile
// that a document boundary crosses, tested per position.
template <int BM, bool PER_QUERY, bool MASKED>
__device__ __forceinline__ void probabilities(float (&st)[BM / 2], const float (&lse2)[BM / 8][2],
                                              const FlashParams& p, const StepRows& r,
                                              const bool (&seen)[2], const int (&qids)[BM / 8][2],
                                              const int (&kid)[2]) {
  constexpr int QT = BM / 8;
  VisibleSpan span[2] = {};  // the queries that see this thread's two keys
  if constexpr (MASKED) {
    const int base = r.q0 + (r.lane % 4) * 2;  // this thread's first query of the tile
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      span[h] = seen[h] ? visible_queries(p, r.k0 + r.key_row + 8 * h, base) : VisibleSpan{0, 0};
    }
  }
#pragma unroll
  for (int qt = 0; qt < QT; ++qt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pv = bf16_detail::fast_exp2(fmaf(st[4 * qt + e], p.scale_log2, -lse2[qt][e % 2]));
      if constexpr (MASKED) {
        bool ok = span[e / 2].contains(qt * 8 + (e % 2));
        if (PER_QUERY) ok = ok && same_segment(qids[qt][e % 2], kid[e / 2]);
        if (!ok) pv = 0.0f;
      }
      st[4 * qt + e] = pv;
    }
  }
}

// This thread's values of the step's per-query rows: lse in log2 units and D, for its query
// columns qt * 8 + (lane % 4) * 2 + {0, 1}.
template <int BM>
struct RowValues {
  float lse2[BM / 8][2], dsum[BM / 8][2];
};
// LSE_LOG2: r.lse is already in log2 units (lse_log2(), written so by the tma backward's
// producer); otherwise it is converted here.
template <int BM, bool LSE_LOG2>
__device__ __forceinline__ void read_lse(const StepRows& r, RowValues<BM>& v) {
#pragma unroll
  for (int qt = 0; qt < BM / 8; ++qt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float l = r.lse[qt * 8 + (r.lane % 4) * 2 + c];
      v.lse2[qt][c] = LSE_LOG2 ? l : lse_log2(l);
    }
  }
}
template <int BM>
__device__ __forceinline__ void read_dsum(const StepRows& r, RowValues<BM>& v) {
#pragma unroll
  for (int qt = 0; qt < BM / 8; ++qt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) v.dsum[qt][c] = r.dsum[qt * 8 + (r.lane % 4) * 2 + c];
  }
}
// Both, before the step's products are issued, where registers allow (the tma backward at 240
// registers a consumer): read later, the loads queue in the shared-memory pipe behind the
// products' operand reads and the first exponentials wait on them.
template <int BM, bool LSE_LOG2>
__device__ __forceinline__ void read_row_values(const StepRows& r, RowValues<BM>& v) {
  read_lse<BM, LSE_LOG2>(r, v);
  read_dsum<BM>(r, v);
}

// When a step reads its lse and D values from shared memory:
//   early:   both before the products are issued (read_row_values(), registers allowing);
//   between: lse between S^T's and dP^T's products (issue_score_products' `between`: the loads
//            wait behind S^T's operand reads only, not dP^T's too) and D once P^T is made,
//            before the wait for dP^T (in the registers lse leaves free);
//   late:    lse after the products are issued, D after the wait for dP^T (fewest registers).
enum class RowReads { early, between, late };

// Softmax step, after issue_score_products: waits for S^T, makes it P^T (probabilities above),
// waits for dP^T, makes it dS^T = P^T (dP^T - D), reading the row values as READS says.
template <int BM, bool SEG, bool LSE_LOG2, RowReads READS>
__device__ __forceinline__ void probabilities_and_ds(float (&st)[BM / 2], float (&dpt)[BM / 2],
                                                     const FlashParams& p, const StepRows& r,
                                                     RowValues<BM>& rows,
                                                     const SegmentChunk* chunk_row,
                                                     const int32_t* seg_row, const int (&kid)[2]) {
  constexpr int QT = BM / 8;
  const int lane = r.lane;
  if constexpr (READS == RowReads::late) read_lse<BM, LSE_LOG2>(r, rows);
  // Segment ids, where the mask cuts the step: a query tile inside one document (most of them,
  // with packed documents) only decides which of this thread's keys it can see at all, folded
  // into their spans; a tile that a document boundary crosses reads its queries' ids and tests
  // every position.
  bool seen[2] = {true, true};
  bool per_query = false;
  int qids[QT][2] = {};
  if (SEG && r.partial) {
    const UniformSegment queries_seg = uniform_segment(chunk_row, r.q0, min(r.q0 + BM, r.seq_len));
    if (queries_seg.uniform) {
#pragma unroll
      for (int h = 0; h < 2; ++h) seen[h] = same_segment(queries_seg.id, kid[h]);
    } else {
      per_query = true;
#pragma unroll
      for (int qt = 0; qt < QT; ++qt) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int i = r.q0 + qt * 8 + (lane % 4) * 2 + c;
          qids[qt][c] = i < r.seq_len ? seg_row[i] : -1;
        }
      }
    }
  }
  hopper::wg_wait<1>();
  hopper::pin(st);
  if (SEG && per_query) {
    probabilities<BM, true, true>(st, rows.lse2, p, r, seen, qids, kid);
  } else if (r.partial) {
    probabilities<BM, false, true>(st, rows.lse2, p, r, seen, qids, kid);
  } else {
    probabilities<BM, false, false>(st, rows.lse2, p, r, seen, qids, kid);
  }
  if constexpr (READS == RowReads::between) read_dsum<BM>(r, rows);
  hopper::wg_wait<0>();
  hopper::pin(dpt);
  if constexpr (READS == RowReads::late) read_dsum<BM>(r, rows);
#pragma unroll
  for (int qt = 0; qt < QT; ++qt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      dpt[4 * qt + e] = st[4 * qt + e] * (dpt[4 * qt + e] - rows.dsum[qt][e % 2]);
    }
  }
}

}  // namespace ft::attention::cuda::backward_step

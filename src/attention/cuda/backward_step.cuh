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

// Warpgroup product: S^T = K Q^T, then dP^T = V dO^T, as two commit groups, so that P^T can be
// computed while dP^T runs. All four operands are K-major panels in shared memory.
template <int BM, int BN, int D>
__device__ __forceinline__ void issue_score_products(float (&st)[BM / 2], float (&dpt)[BM / 2],
                                                     uint64_t k_rows, uint64_t v_rows,
                                                     uint64_t q_stage, uint64_t do_stage) {
  using hopper::advance;
  using hopper::kPanelRowBytes;
  hopper::wg_fence();
#pragma unroll
  for (int kd = 0; kd < D / 16; ++kd) {
    const uint32_t key_off = (kd / 4) * BN * kPanelRowBytes + (kd % 4) * 32;
    const uint32_t query_off = (kd / 4) * BM * kPanelRowBytes + (kd % 4) * 32;
    hopper::mma_ss<BM, 0, 0>(st, advance(k_rows, key_off), advance(q_stage, query_off), kd > 0);
  }
  hopper::wg_commit();
#pragma unroll
  for (int kd = 0; kd < D / 16; ++kd) {
    const uint32_t key_off = (kd / 4) * BN * kPanelRowBytes + (kd % 4) * 32;
    const uint32_t query_off = (kd / 4) * BM * kPanelRowBytes + (kd % 4) * 32;
    hopper::mma_ss<BM, 0, 0>(dpt, advance(v_rows, key_off), advance(do_stage, query_off), kd > 0);
  }
  hopper::wg_commit();
}

// What the softmax step of a query tile reads besides the products.
struct StepRows {
  const float* lse;   // the tile's lse (natural log), BM values
  const float* dsum;  // the tile's D = rowsum(dO * O), BM values
  int q0, k0, key_row, lane, seq_len;
  bool partial;  // a mask boundary (or the end of the keys) cuts the tile
};

// Softmax step, after issue_score_products: waits for S^T, makes it P^T = exp2(S^T * scale_log2 -
// lse_log2) (zero where the mask hides a position of a cut tile; +inf lse for rows that see
// nothing makes their P exactly 0), waits for dP^T, makes it dS^T = P^T (dP^T - D).
template <int BM, bool SEG>
__device__ __forceinline__ void probabilities_and_ds(float (&st)[BM / 2], float (&dpt)[BM / 2],
                                                     const FlashParams& p, const StepRows& r,
                                                     const SegmentChunk* chunk_row,
                                                     const int32_t* seg_row, const int (&kid)[2]) {
  constexpr int QT = BM / 8;
  const int lane = r.lane;
  float lse2[QT][2];  // in log2 units
#pragma unroll
  for (int qt = 0; qt < QT; ++qt) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const float l = r.lse[qt * 8 + (lane % 4) * 2 + c];
      lse2[qt][c] = l == -INFINITY ? INFINITY : l * 1.4426950408889634f;
    }
  }
  // Segment ids of this thread's query columns (a query tile inside one document needs no
  // per-query read).
  int qids[QT][2];
  if (SEG && r.partial) {
    const UniformSegment queries_seg = uniform_segment(chunk_row, r.q0, min(r.q0 + BM, r.seq_len));
#pragma unroll
    for (int qt = 0; qt < QT; ++qt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int i = r.q0 + qt * 8 + (lane % 4) * 2 + c;
        qids[qt][c] = queries_seg.uniform ? queries_seg.id : (i < r.seq_len ? seg_row[i] : -1);
      }
    }
  }
  hopper::wg_wait<1>();
  hopper::pin(st);
#pragma unroll
  for (int qt = 0; qt < QT; ++qt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float pv = bf16_detail::fast_exp2(fmaf(st[4 * qt + e], p.scale_log2, -lse2[qt][e % 2]));
      if (r.partial) {
        const int i = r.q0 + qt * 8 + (lane % 4) * 2 + (e % 2);
        const int j = r.k0 + r.key_row + 8 * (e / 2);
        bool ok = allowed_position(p, i, j);
        if (SEG) ok = ok && same_segment(qids[qt][e % 2], kid[e / 2]);
        if (!ok) pv = 0.0f;
      }
      st[4 * qt + e] = pv;
    }
  }
  hopper::wg_wait<0>();
  hopper::pin(dpt);
#pragma unroll
  for (int qt = 0; qt < QT; ++qt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float dsum = r.dsum[qt * 8 + (lane % 4) * 2 + e % 2];
      dpt[4 * qt + e] = st[4 * qt + e] * (dpt[4 * qt + e] - dsum);
    }
  }
}

}  // namespace ft::attention::cuda::backward_step

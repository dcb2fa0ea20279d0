// bf16 flash attention on tensor cores (mma.sync m16n8k16, fp32 accumulators): the forward and
// backward kernel templates, instantiated per tile and head dim by flash_bf16_{fwd,bwd}_d*.cu
// from the list in flash_kernel_list.h.
//
// Forward, one block per (query tile, head, batch row): Q stays in shared memory; K and V tiles
// stream through two cp.async stages while the previous tile is computed. Each warp owns 16 or
// 32 query rows: S = Q K^T (ldmatrix from swizzled shared memory), the mask only on tiles that
// straddle a boundary (hidden tiles are never loaded), online softmax in base 2 with the scale
// folded into the exponent, then O += P V with P taken straight from the accumulators.
// Traffic: Q, O once; K and V once per query tile that sees them.
//
// Backward, one block per (key tile, kv head, batch row), so dK and dV of a kv head (summed over
// its group's query heads) stay in registers and are written once, without atomics. The block
// walks the query tiles of every query head of the group that the mask lets see its keys; Q, dO,
// lse and D = rowsum(dO * O) arrive per query tile (single stage, or double-buffered so the next
// tile loads during this one). Each warp owns 16 or 32 key rows and computes transposed tiles:
// S^T = K Q^T, P^T = exp2(S^T - lse), dP^T = V dO^T, dS^T = P^T (dP^T - D); dV += P^T dO and
// dK += dS^T Q from registers; dS^T goes through shared memory for dQ = dS K, which is added to
// an fp32 buffer with atomics (flash.cu converts it to bf16 and applies the scale).
//
// Shared memory rows are D (or the query tile) bf16 wide; 16-byte chunks are XOR-swizzled by the
// row so that ldmatrix's eight row reads hit distinct banks. The layouts here are the ones
// forward_smem_bytes() and backward_smem_bytes() in kernel_config.cpp count.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/cuda/flash_common.cuh"
#include "attention/flash_kernel_list.h"
#include "attention/kernel_config.h"
#include "core/cuda/check.h"

namespace ft::attention::cuda {

using ForwardLaunch = void (*)(const FlashParams&, cudaStream_t);
using BackwardLaunch = void (*)(const FlashParams&, cudaStream_t);

// The compiled bf16 kernels (mma.sync and wgmma), filled by the per-head-dim files.
struct Bf16Kernels {
  struct Forward {
    int head_dim;
    TileConfig tile;
    ForwardPath path;
    ForwardLaunch launch;
    int stages = 0;         // tma path: ring slots of K and V
    bool pingpong = false;  // tma path: consumer warpgroups take turns
  };
  struct Backward {
    int head_dim;
    TileConfig tile;
    BackwardPath path;
    BackwardLaunch launch;
    int stages = 0;  // tma path: ring slots of Q and dO
  };
  std::vector<Forward> forward;
  std::vector<Backward> backward;
};

void add_bf16_forward_d32(Bf16Kernels& k);
void add_bf16_forward_d64(Bf16Kernels& k);
void add_bf16_forward_d128(Bf16Kernels& k);
void add_bf16_backward_d32(Bf16Kernels& k);
void add_bf16_backward_d64(Bf16Kernels& k);
void add_bf16_backward_d128(Bf16Kernels& k);

namespace bf16_detail {

// ---- PTX wrappers ----

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; with valid == false the destination is zero-filled.
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
// 4 bytes global -> shared (zero-filled when !valid).
__device__ __forceinline__ void cp_async_4(uint32_t dst, const void* src, bool valid) {
  const int src_bytes = valid ? 4 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a b: a 16x16 (row), b 16x8 (col), bf16 in, fp32 accumulate.
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                    uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as bf16x2, the first in the low half (the lower column of a fragment pair).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Adds four consecutive floats (16-byte aligned) to global memory.
__device__ __forceinline__ void red_add_f32x4(float* dst, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(v.x), "f"(v.y),
               "f"(v.z), "f"(v.w)
               : "memory");
#else
  atomicAdd(dst, v.x);
  atomicAdd(dst + 1, v.y);
  atomicAdd(dst + 2, v.z);
  atomicAdd(dst + 3, v.w);
#endif
}

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Element offset of (row, col) in a swizzled tile whose rows are COLS bf16 wide; col's 16-byte
// chunk is XORed with the row, so the 8 rows an ldmatrix reads at one column hit 8 chunks.
template <int COLS>
__device__ __forceinline__ int swz(int row, int col) {
  constexpr int kChunks = COLS / 8;
  constexpr int kMask = (kChunks >= 8 ? 8 : kChunks) - 1;
  return row * COLS + ((((col >> 3) ^ (row & kMask))) << 3) + (col & 7);
}

// Copies rows [row0, row0 + ROWS) of one head of a [B, S, H, D] tensor into a swizzled tile
// (rows past the sequence end are zero-filled).
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(__nv_bfloat16* tile, const __nv_bfloat16* head_base,
                                          int64_t row_stride, int row0, int seq_len) {
  constexpr int kChunks = D / 8;
  for (int idx = threadIdx.x; idx < ROWS * kChunks; idx += THREADS) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = row0 + r < seq_len;
    const __nv_bfloat16* src = head_base + (valid ? (row0 + r) * row_stride + c * 8 : 0);
    cp_async_16(smem_addr(tile + swz<D>(r, c * 8)), src, valid);
  }
}

// Address (for ldmatrix) of this lane's row of an A operand 16x16 at (row0, col0), stored
// row-major [m][k] in a swizzled tile: matrices (m 0-7, k 0-7), (m 8-15, k 0-7), (m 0-7, k 8-15),
// (m 8-15, k 8-15) give a0..a3.
template <int COLS>
__device__ __forceinline__ uint32_t a_addr(const __nv_bfloat16* tile, int row0, int col0,
                                           int lane) {
  const int i = lane / 8;
  return smem_addr(tile + swz<COLS>(row0 + (i % 2) * 8 + lane % 8, col0 + (i / 2) * 8));
}
// B operands of two n8 tiles (n0..n0+15) over k0..k0+15 from a tile stored [n][k]: registers
// {0, 1} are the first n tile's b0, b1 and {2, 3} the second's (ldmatrix, no transpose).
template <int COLS>
__device__ __forceinline__ uint32_t b_addr_nk(const __nv_bfloat16* tile, int n0, int k0, int lane) {
  const int i = lane / 8;
  return smem_addr(tile + swz<COLS>(n0 + (i / 2) * 8 + lane % 8, k0 + (i % 2) * 8));
}
// The same from a tile stored [k][n] (ldmatrix .trans).
template <int COLS>
__device__ __forceinline__ uint32_t b_addr_kn(const __nv_bfloat16* tile, int k0, int n0, int lane) {
  const int i = lane / 8;
  return smem_addr(tile + swz<COLS>(k0 + (i % 2) * 8 + lane % 8, n0 + (i / 2) * 8));
}
// An A operand 16x16 (m0.., k0..) from a tile stored [k][m] (ldmatrix .trans).
template <int COLS>
__device__ __forceinline__ uint32_t a_addr_km(const __nv_bfloat16* tile, int m0, int k0, int lane) {
  const int i = lane / 8;
  return smem_addr(tile + swz<COLS>(k0 + (i / 2) * 8 + lane % 8, m0 + (i % 2) * 8));
}

// The accumulators of two adjacent n8 tiles as the A operand of the next product (k = their
// 16 columns).
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4]) {
  a[0] = pack_bf16(lo[0], lo[1]);
  a[1] = pack_bf16(lo[2], lo[3]);
  a[2] = pack_bf16(hi[0], hi[1]);
  a[3] = pack_bf16(hi[2], hi[3]);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

// Online softmax's maximum, for the tma and wgmma forwards: how far (log2 units) a row's scaled
// scores may rise above the maximum its exponentials are taken against before that maximum moves.
// P = exp2(s - max) then stays below 2^8, which the fp32 sums and O and the bf16 P hold with the
// same relative rounding as values below 1, while O's rescale is left for the rare tile whose
// scores jump that far instead of every tile in which some row's maximum creeps up (docs/PERF.md,
// "The rescale slack").
inline constexpr float kRescaleSlack = 8.0f;

// The maximum a row's exponentials use after a tile whose largest scaled score is `tile_max`:
// unchanged unless the tile rises more than kRescaleSlack above it. (-INFINITY + the slack stays
// -INFINITY: a row's first visible scores always set it.)
__device__ __forceinline__ float moved_max(float row_max, float tile_max) {
  return tile_max > row_max + kRescaleSlack ? tile_max : row_max;
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

struct NoSegments {};

// The element-wise mask on a tile that a boundary cuts, for the warpgroup products' accumulator
// layout (the wgmma and tma forwards; the mma.sync forward's 16-row m tiles have it too): this
// thread's scores of rows `rows[0]`, `rows[1]` (query positions; -1 or any id for rows past the
// sequence, whose output is not kept) against keys k0 + nt * 8 + (lane % 4) * 2 + {0, 1}.
// Causal, window and the segment tests that need no key's id bound a span of keys per row (two
// compares and a select an element, no branch); only a tile that holds more than one document
// (or padding) reads its keys' ids (below: all at once on 64-key tiles, one behind each span
// test on 128-key tiles).
template <int NT, bool SEG>
__device__ __forceinline__ void mask_tile(float (&s)[NT * 4], const FlashParams& p,
                                          const int (&rows)[2], const int (&qid)[2],
                                          const int32_t* seg_row, UniformSegment keys_seg, int k0,
                                          int lane, float masked) {
  const int base = k0 + (lane % 4) * 2;  // this thread's first key of the tile
  VisibleSpan span[2] = {visible_keys(p, rows[0], base), visible_keys(p, rows[1], base)};
  if (SEG) {
    span[0] = segment_span(span[0], qid[0], keys_seg);
    span[1] = segment_span(span[1], qid[1], keys_seg);
  }
  // Key tiles of up to 64 keys read the ids of the thread's 2 NT keys before the first test:
  // independent loads whose latencies overlap, where a load behind each element's span test
  // waited for the one before (window + documents, 64x64 tma forward: ~9% of the stall samples
  // in that chain on a work tile's first key tile). At 128 keys the 32 ids spill in the tma
  // plans (ptxas, 128x128 at head dim 64 and 128), so those keep the load behind the test.
  // A key past the sequence's end reads the last key's id; its span hides it.
  if (SEG && !keys_seg.uniform && NT <= 8) {
    int key_id[NT][2];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int c = 0; c < 2; ++c) key_id[nt][c] = seg_row[min(base + nt * 8 + c, p.seq_len - 1)];
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool visible =
            span[e / 2].contains(nt * 8 + (e % 2)) && key_id[nt][e % 2] == qid[e / 2];
        if (!visible) s[4 * nt + e] = masked;
      }
    }
    return;
  }
  if (SEG && !keys_seg.uniform) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int column = nt * 8 + (e % 2);
        if (!span[e / 2].contains(column) || seg_row[base + column] != qid[e / 2]) {
          s[4 * nt + e] = masked;
        }
      }
    }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (!span[e / 2].contains(nt * 8 + (e % 2))) s[4 * nt + e] = masked;
    }
  }
}

// ---- forward ----

template <int D, int BM, int BN, int THREADS>
struct ForwardTraits {
  static constexpr int kWarps = THREADS / 32;
  static constexpr int kWarpRows = BM / kWarps;
  static constexpr int kMTiles = kWarpRows / 16;  // 16-row m tiles per warp
  static constexpr int kNTiles = BN / 8;          // n8 tiles of S per m tile
  static constexpr int kDTiles = D / 8;           // n8 tiles of O per m tile
  static_assert(THREADS % 32 == 0 && BM % kWarps == 0, "warps must split the query rows");
  static_assert(kWarpRows == 16 || kWarpRows == 32, "16 or 32 query rows per warp");
  static_assert(BN % 16 == 0 && D % 16 == 0, "tiles are whole 16-wide mma steps");
  static constexpr int kSmemBytes = 2 * D * (BM + 4 * BN);
};

// SEG: the mask has segment ids (without them the kernel carries no per-row ids at all).
template <int D, int BM, int BN, int THREADS, bool SEG>
__global__ void __launch_bounds__(THREADS) flash_forward_kernel(const FlashParams p) {
  using T = ForwardTraits<D, BM, BN, THREADS>;
  constexpr int MT = T::kMTiles, NT = T::kNTiles, DT = T::kDTiles;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* q_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* k_s = q_s + BM * D;  // [2][BN][D]
  __nv_bfloat16* v_s = k_s + 2 * BN * D;

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // Tiles with the most keys (causal: the last) start first.
  const int q_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, hk = h / p.group();
  const int S = p.seq_len;
  const int q0 = q_block * BM, q1 = min(q0 + BM, S);
  const int64_t q_stride = int64_t{p.q_heads} * D, kv_stride = int64_t{p.kv_heads} * D;
  const auto* q_base = static_cast<const __nv_bfloat16*>(p.q) + int64_t{b} * S * q_stride + h * D;
  const auto* k_base = static_cast<const __nv_bfloat16*>(p.k) + int64_t{b} * S * kv_stride + hk * D;
  const auto* v_base = static_cast<const __nv_bfloat16*>(p.v) + int64_t{b} * S * kv_stride + hk * D;

  const int32_t* seg_row = SEG ? p.segment_ids + int64_t{b} * S : nullptr;
  const SegmentChunk* chunk_row =
      SEG ? p.segment_chunks + int64_t{b} * p.chunks_per_row() : nullptr;
  const SegmentChunk q_span =
      chunk_row ? combine_chunks(chunk_row, q0, q1) : SegmentChunk{0, 0, 0, 0};
  const int2 keys = key_range(p, q0, q1);
  const int kb_end = (keys.y + BN - 1) / BN;
  // The next key tile from kb on that the mask does not hide (or kb_end), and its cover.
  auto next_tile = [&](int kb, Cover& cover) {
    for (; kb < kb_end; ++kb) {
      const int k0 = kb * BN;
      cover = classify(p, chunk_row, q_span, q0, q1, k0, min(k0 + BN, S));
      if (cover != Cover::hidden) break;
    }
    return kb;
  };
  auto load_kv = [&](int kb, int stage) {
    load_tile<BN, D, THREADS>(k_s + stage * BN * D, k_base, kv_stride, kb * BN, S);
    load_tile<BN, D, THREADS>(v_s + stage * BN * D, v_base, kv_stride, kb * BN, S);
  };

  // This thread's rows: warp_row0 + mt * 16 + lane / 4 + 8 * half.
  const int warp_row0 = warp * T::kWarpRows;
  int qid[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = q0 + warp_row0 + mt * 16 + lane / 4 + 8 * half;
      qid[mt][half] = SEG && i < S ? seg_row[i] : 0;
    }
  }

  float o[MT][DT][4];
  float row_max[MT][2], row_sum[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0;
    row_max[mt][0] = row_max[mt][1] = -INFINITY;
    row_sum[mt][0] = row_sum[mt][1] = 0.0f;
  }

  load_tile<BM, D, THREADS>(q_s, q_base, q_stride, q0, S);
  Cover cover = Cover::hidden;
  int kb = next_tile(keys.x / BN, cover);
  if (kb < kb_end) load_kv(kb, 0);
  cp_async_commit();

  for (int stage = 0; kb < kb_end; stage ^= 1) {
    Cover next_cover = Cover::hidden;
    const int next = next_tile(kb + 1, next_cover);
    if (next < kb_end) load_kv(next, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    const int k0 = kb * BN;
    const __nv_bfloat16* kt = k_s + stage * BN * D;
    const __nv_bfloat16* vt = v_s + stage * BN * D;

    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0;
    }
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        ldmatrix_x4(a[mt], a_addr<D>(q_s, warp_row0 + mt * 16, kd * 16, lane));
      }
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        uint32_t bk[4];
        ldmatrix_x4(bk, b_addr_nk<D>(kt, np * 16, kd * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma(s[mt][2 * np], a[mt], bk[0], bk[1]);
          mma(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
        }
      }
    }

    // Scores in log2 units (scaled before masking, so any sign of the scale works).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] *= p.scale_log2;
      }
    }
    // Keys past the end (zero-filled) are masked like the mask's own boundaries. Each m tile of
    // S has the warpgroup products' accumulator layout (mask_tile); the scores are already
    // scaled, so a masked one is -inf whatever the scale's sign.
    if (k0 + BN > S || cover == Cover::partial) {
      const UniformSegment keys_seg =
          SEG ? uniform_segment(chunk_row, k0, min(k0 + BN, S)) : UniformSegment{true, 0};
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int row = q0 + warp_row0 + mt * 16 + lane / 4;
        const int rows[2] = {row, row + 8};
        mask_tile<NT, SEG>(reinterpret_cast<float(&)[NT * 4]>(s[mt]), p, rows, qid[mt], seg_row,
                           keys_seg, k0, lane, -INFINITY);
      }
    }

    // Online softmax, base 2: p = exp2(s - max).
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        // Every new maximum moves it, and O is rescaled every tile (no kRescaleSlack here: with
        // the slack and a skipped pass ptxas spilled more in the 255-register head-dim-128 tiles).
        float mx = row_max[mt][half];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          mx = fmaxf(mx, fmaxf(s[mt][nt][2 * half], s[mt][nt][2 * half + 1]));
        }
        mx = quad_max(mx);
        // A row that has seen no key yet keeps max -inf: offset 0 keeps exp2(-inf) = 0.
        const float offset = mx == -INFINITY ? 0.0f : mx;
        const float alpha = fast_exp2(row_max[mt][half] - offset);
        row_max[mt][half] = mx;
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 2 * half; e < 2 * half + 2; ++e) {
            s[mt][nt][e] = fast_exp2(s[mt][nt][e] - offset);
            sum += s[mt][nt][e];
          }
        }
        row_sum[mt][half] = row_sum[mt][half] * alpha + sum;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          o[mt][dt][2 * half] *= alpha;
          o[mt][dt][2 * half + 1] *= alpha;
        }
      }
    }

    // O += P V.
#pragma unroll
    for (int kn = 0; kn < BN / 16; ++kn) {
      uint32_t a[MT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) acc_to_a(a[mt], s[mt][2 * kn], s[mt][2 * kn + 1]);
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t bv[4];
        ldmatrix_x4_trans(bv, b_addr_kn<D>(vt, kn * 16, dp * 16, lane));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma(o[mt][2 * dp], a[mt], bv[0], bv[1]);
          mma(o[mt][2 * dp + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // the next iteration's loads overwrite this stage
    kb = next;
    cover = next_cover;
  }
  cp_async_wait<0>();

  auto* o_base = static_cast<__nv_bfloat16*>(p.o) + int64_t{b} * S * q_stride + h * D;
  float* lse_row = p.lse + (int64_t{b} * p.q_heads + h) * S;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int i = q0 + warp_row0 + mt * 16 + lane / 4 + 8 * half;
      const float sum = quad_sum(row_sum[mt][half]);
      if (i >= S) continue;
      const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int col = dt * 8 + (lane % 4) * 2;
        *reinterpret_cast<uint32_t*>(o_base + i * q_stride + col) =
            pack_bf16(o[mt][dt][2 * half] * inv, o[mt][dt][2 * half + 1] * inv);
      }
      if (lane % 4 == 0) {
        lse_row[i] =
            sum > 0.0f ? (row_max[mt][half] + log2f(sum)) * 0.6931471805599453f : -INFINITY;
      }
    }
  }
}

template <int D, int BM, int BN, int THREADS>
void launch_forward(const FlashParams& p, cudaStream_t stream) {
  constexpr int kSmem = ForwardTraits<D, BM, BN, THREADS>::kSmemBytes;
  auto kernel = p.segment_ids != nullptr ? flash_forward_kernel<D, BM, BN, THREADS, true>
                                         : flash_forward_kernel<D, BM, BN, THREADS, false>;
  const dim3 grid((p.seq_len + BM - 1) / BM, p.q_heads, p.batch);
  launch_with_smem(kernel, grid, THREADS, kSmem, stream, p);
}

// ---- backward ----

template <int D, int BM, int BN, int THREADS, bool DOUBLE>
struct BackwardTraits {
  static constexpr int kWarps = THREADS / 32;
  static constexpr int kWarpKeys = BN / kWarps;
  static constexpr int kKTiles = kWarpKeys / 16;  // 16-key m tiles per warp
  static constexpr int kQTiles = BM / 8;          // n8 query tiles of S^T
  static constexpr int kDTiles = D / 8;
  static constexpr int kStages = DOUBLE ? 2 : 1;
  static_assert(THREADS % 32 == 0 && BN % kWarps == 0, "warps must split the key rows");
  static_assert(kWarpKeys == 16 || kWarpKeys == 32, "16 or 32 key rows per warp");
  static_assert(BM % 16 == 0 && D % 16 == 0, "tiles are whole 16-wide mma steps");
  // dQ = dS K: warps over 16-row query steps, then over 16-column slices of D.
  static constexpr int kDqWarpsM = kWarps < BM / 16 ? kWarps : BM / 16;
  static constexpr int kDqWarpsN = kWarps / kDqWarpsM;
  static constexpr int kDqMTiles = BM / 16 / kDqWarpsM;
  static constexpr int kDqCols = D / kDqWarpsN;
  static_assert((BM / 16) % kDqWarpsM == 0 && kWarps % kDqWarpsM == 0 && kDqCols % 16 == 0,
                "the dQ step must split evenly");
  // K, V; per stage Q, dO (bf16) and lse, D (fp32); dS^T (bf16).
  static constexpr int kSmemBytes = 4 * D * BN + kStages * (4 * D * BM + 8 * BM) + 2 * BM * BN;
};

template <int D, int BM, int BN, int THREADS, bool DOUBLE, bool SEG>
__global__ void __launch_bounds__(THREADS) flash_backward_kernel(const FlashParams p) {
  using T = BackwardTraits<D, BM, BN, THREADS, DOUBLE>;
  constexpr int KT = T::kKTiles, QT = T::kQTiles, DT = T::kDTiles;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* k_s = reinterpret_cast<__nv_bfloat16*>(smem_raw);
  __nv_bfloat16* v_s = k_s + BN * D;
  __nv_bfloat16* q_s = v_s + BN * D;                        // [stages][BM][D]
  __nv_bfloat16* do_s = q_s + T::kStages * BM * D;          // [stages][BM][D]
  __nv_bfloat16* ds_s = do_s + T::kStages * BM * D;         // [BN][BM]: dS^T
  float* lse_s = reinterpret_cast<float*>(ds_s + BN * BM);  // [stages][BM]
  float* dsum_s = lse_s + T::kStages * BM;                  // [stages][BM]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int k_block = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
  const int S = p.seq_len, G = p.group();
  const int k0 = k_block * BN, k1 = min(k0 + BN, S);
  const int64_t q_stride = int64_t{p.q_heads} * D, kv_stride = int64_t{p.kv_heads} * D;
  const int64_t q_batch = int64_t{b} * S * q_stride;
  const auto* q_all = static_cast<const __nv_bfloat16*>(p.q) + q_batch;
  const auto* do_all = static_cast<const __nv_bfloat16*>(p.dout) + q_batch;
  const int64_t kv_off = int64_t{b} * S * kv_stride + hk * D;

  const int32_t* seg_row = SEG ? p.segment_ids + int64_t{b} * S : nullptr;
  const SegmentChunk* chunk_row =
      SEG ? p.segment_chunks + int64_t{b} * p.chunks_per_row() : nullptr;
  const int2 queries = query_range(p, k0, k1);
  const int qb_begin = queries.x / BM, qb_end = (queries.y + BM - 1) / BM;
  const int q_blocks = max(0, qb_end - qb_begin);
  const int steps = G * q_blocks;  // step t: query head hk * G + t / q_blocks, block qb_begin + ..

  auto cover_of = [&](int t) {
    const int q0 = (qb_begin + t % q_blocks) * BM, q1 = min(q0 + BM, S);
    const SegmentChunk q_span =
        chunk_row ? combine_chunks(chunk_row, q0, q1) : SegmentChunk{0, 0, 0, 0};
    return classify(p, chunk_row, q_span, q0, q1, k0, k1);
  };
  // The mask is the same for every head of the group: a hidden block is hidden for all. Returns
  // the next visible step from t on (or `steps`) and its cover.
  auto next_step = [&](int t, Cover& cover) {
    for (; t < steps; ++t) {
      cover = cover_of(t);
      if (cover != Cover::hidden) break;
    }
    return t;
  };
  auto load_step = [&](int t, int stage) {
    const int h = hk * G + t / q_blocks, q0 = (qb_begin + t % q_blocks) * BM;
    load_tile<BM, D, THREADS>(q_s + stage * BM * D, q_all + h * D, q_stride, q0, S);
    load_tile<BM, D, THREADS>(do_s + stage * BM * D, do_all + h * D, q_stride, q0, S);
    // lse and D arrive asynchronously too (zero past the end: those rows have zero Q and dO,
    // so they contribute nothing).
    const int64_t row = (int64_t{b} * p.q_heads + h) * S;
    for (int r = threadIdx.x; r < BM; r += THREADS) {
      const bool valid = q0 + r < S;
      cp_async_4(smem_addr(lse_s + stage * BM + r), p.lse + row + (valid ? q0 + r : 0), valid);
      cp_async_4(smem_addr(dsum_s + stage * BM + r), p.dsum + row + (valid ? q0 + r : 0), valid);
    }
  };

  load_tile<BN, D, THREADS>(k_s, static_cast<const __nv_bfloat16*>(p.k) + kv_off, kv_stride, k0, S);
  load_tile<BN, D, THREADS>(v_s, static_cast<const __nv_bfloat16*>(p.v) + kv_off, kv_stride, k0, S);
  Cover cover = Cover::hidden;
  int t = next_step(0, cover);
  if (DOUBLE && t < steps) load_step(t, 0);
  cp_async_commit();

  float dk[KT][DT][4], dv[KT][DT][4];
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dk[kt][dt][e] = dv[kt][dt][e] = 0.0f;
    }
  }
  const int warp_key0 = warp * T::kWarpKeys;
  // dQ step layout.
  const int dq_wm = warp % T::kDqWarpsM, dq_wn = warp / T::kDqWarpsM;

  for (int stage = 0; t < steps; stage = DOUBLE ? stage ^ 1 : 0) {
    Cover next_cover = Cover::hidden;
    const int next = next_step(t + 1, next_cover);
    if (DOUBLE) {
      if (next < steps) load_step(next, stage ^ 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      load_step(t, 0);
      cp_async_commit();
      cp_async_wait<0>();
    }
    __syncthreads();

    const int h = hk * G + t / q_blocks, q0 = (qb_begin + t % q_blocks) * BM;
    const bool partial = k0 + BN > S || cover == Cover::partial;
    const __nv_bfloat16* qt = q_s + stage * BM * D;
    const __nv_bfloat16* dot = do_s + stage * BM * D;
    const float* lse_t = lse_s + stage * BM;
    const float* dsum_t = dsum_s + stage * BM;

    // S^T = K Q^T and dP^T = V dO^T, rows = this warp's keys, columns = the tile's queries.
    float st[KT][QT][4], dpt[KT][QT][4];
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
      for (int qt_i = 0; qt_i < QT; ++qt_i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) st[kt][qt_i][e] = dpt[kt][qt_i][e] = 0.0f;
      }
    }
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
      uint32_t ak[KT][4], av[KT][4];
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
        ldmatrix_x4(ak[kt], a_addr<D>(k_s, warp_key0 + kt * 16, kd * 16, lane));
        ldmatrix_x4(av[kt], a_addr<D>(v_s, warp_key0 + kt * 16, kd * 16, lane));
      }
#pragma unroll
      for (int np = 0; np < QT / 2; ++np) {
        uint32_t bq[4], bdo[4];
        ldmatrix_x4(bq, b_addr_nk<D>(qt, np * 16, kd * 16, lane));
        ldmatrix_x4(bdo, b_addr_nk<D>(dot, np * 16, kd * 16, lane));
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
          mma(st[kt][2 * np], ak[kt], bq[0], bq[1]);
          mma(st[kt][2 * np + 1], ak[kt], bq[2], bq[3]);
          mma(dpt[kt][2 * np], av[kt], bdo[0], bdo[1]);
          mma(dpt[kt][2 * np + 1], av[kt], bdo[2], bdo[3]);
        }
      }
    }

    // P^T = exp2(S^T * scale_log2 - lse_log2); dS^T = P^T (dP^T - D). st becomes P^T, dpt dS^T.
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
      for (int qt_i = 0; qt_i < QT; ++qt_i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = qt_i * 8 + (lane % 4) * 2 + (e % 2);  // query row within the tile
          // Rows that see nothing have lse = -inf and P = 0.
          const float lse2 = lse_t[r] * 1.4426950408889634f;
          float pv = lse2 == -INFINITY ? 0.0f : fast_exp2(st[kt][qt_i][e] * p.scale_log2 - lse2);
          if (partial) {
            const int i = q0 + r, j = k0 + warp_key0 + kt * 16 + lane / 4 + 8 * (e / 2);
            const int qid = SEG && i < S ? seg_row[i] : 0;
            if (!allowed(p, seg_row, qid, i, j)) pv = 0.0f;
          }
          st[kt][qt_i][e] = pv;
          dpt[kt][qt_i][e] = pv * (dpt[kt][qt_i][e] - dsum_t[r]);
        }
      }
    }

    // dV += P^T dO and dK += dS^T Q: k = the tile's queries, B operands stored [query][d].
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      uint32_t ap[KT][4], ads[KT][4];
#pragma unroll
      for (int kt = 0; kt < KT; ++kt) {
        acc_to_a(ap[kt], st[kt][2 * kq], st[kt][2 * kq + 1]);
        acc_to_a(ads[kt], dpt[kt][2 * kq], dpt[kt][2 * kq + 1]);
      }
#pragma unroll
      for (int dp = 0; dp < DT / 2; ++dp) {
        uint32_t bdo[4], bq[4];
        ldmatrix_x4_trans(bdo, b_addr_kn<D>(dot, kq * 16, dp * 16, lane));
        ldmatrix_x4_trans(bq, b_addr_kn<D>(qt, kq * 16, dp * 16, lane));
#pragma unroll
        for (int kt = 0; kt < KT; ++kt) {
          mma(dv[kt][2 * dp], ap[kt], bdo[0], bdo[1]);
          mma(dv[kt][2 * dp + 1], ap[kt], bdo[2], bdo[3]);
          mma(dk[kt][2 * dp], ads[kt], bq[0], bq[1]);
          mma(dk[kt][2 * dp + 1], ads[kt], bq[2], bq[3]);
        }
      }
    }

    // dS^T to shared memory, [key][query].
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
      for (int qt_i = 0; qt_i < QT; ++qt_i) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int key = warp_key0 + kt * 16 + lane / 4 + 8 * half;
          const int col = qt_i * 8 + (lane % 4) * 2;
          *reinterpret_cast<uint32_t*>(ds_s + swz<BM>(key, col)) =
              pack_bf16(dpt[kt][qt_i][2 * half], dpt[kt][qt_i][2 * half + 1]);
        }
      }
    }
    __syncthreads();

    // dQ (tile rows x D) += dS K, added to the fp32 buffer.
    {
      constexpr int MQ = T::kDqMTiles, NQ = T::kDqCols / 8;
      float dq[MQ][NQ][4];
#pragma unroll
      for (int mq = 0; mq < MQ; ++mq) {
#pragma unroll
        for (int nq = 0; nq < NQ; ++nq)
          dq[mq][nq][0] = dq[mq][nq][1] = dq[mq][nq][2] = dq[mq][nq][3] = 0;
      }
      const int col0 = dq_wn * T::kDqCols;
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        uint32_t a[MQ][4];
#pragma unroll
        for (int mq = 0; mq < MQ; ++mq) {
          ldmatrix_x4_trans(a[mq],
                            a_addr_km<BM>(ds_s, (mq * T::kDqWarpsM + dq_wm) * 16, kk * 16, lane));
        }
#pragma unroll
        for (int np = 0; np < NQ / 2; ++np) {
          uint32_t bk[4];
          ldmatrix_x4_trans(bk, b_addr_kn<D>(k_s, kk * 16, col0 + np * 16, lane));
#pragma unroll
          for (int mq = 0; mq < MQ; ++mq) {
            mma(dq[mq][2 * np], a[mq], bk[0], bk[1]);
            mma(dq[mq][2 * np + 1], a[mq], bk[2], bk[3]);
          }
        }
      }
      // Lanes 2c and 2c + 1 hold columns 4c..4c+3 of rows r and r + 8: they swap halves so that
      // each adds four consecutive floats of one row with a single vector reduction.
      float* dq_base = p.dq_accum + q_batch + h * D;
      const bool odd = lane & 1;
#pragma unroll
      for (int mq = 0; mq < MQ; ++mq) {
        const int r = q0 + (mq * T::kDqWarpsM + dq_wm) * 16 + lane / 4 + (odd ? 8 : 0);
#pragma unroll
        for (int nq = 0; nq < NQ; ++nq) {
          const float* c = dq[mq][nq];
          // Even lanes send their row r + 8 pair, odd lanes their row r pair.
          const float give0 = odd ? c[0] : c[2], give1 = odd ? c[1] : c[3];
          const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
          const float got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
          const float4 v =
              odd ? make_float4(got0, got1, c[2], c[3]) : make_float4(c[0], c[1], got0, got1);
          if (r < S) red_add_f32x4(dq_base + r * q_stride + col0 + nq * 8 + (lane % 4 / 2) * 4, v);
        }
      }
    }
    __syncthreads();  // dS^T and this stage are rewritten next
    t = next;
    cover = next_cover;
  }
  cp_async_wait<0>();

  auto* dk_base = static_cast<__nv_bfloat16*>(p.dk) + kv_off;
  auto* dv_base = static_cast<__nv_bfloat16*>(p.dv) + kv_off;
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int j = k0 + warp_key0 + kt * 16 + lane / 4 + 8 * half;
      if (j >= S) continue;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        const int col = dt * 8 + (lane % 4) * 2;
        *reinterpret_cast<uint32_t*>(dk_base + j * kv_stride + col) =
            pack_bf16(dk[kt][dt][2 * half] * p.scale, dk[kt][dt][2 * half + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv_base + j * kv_stride + col) =
            pack_bf16(dv[kt][dt][2 * half], dv[kt][dt][2 * half + 1]);
      }
    }
  }
}

template <int D, int BM, int BN, int THREADS, bool DOUBLE>
void launch_backward(const FlashParams& p, cudaStream_t stream) {
  constexpr int kSmem = BackwardTraits<D, BM, BN, THREADS, DOUBLE>::kSmemBytes;
  auto kernel = p.segment_ids != nullptr ? flash_backward_kernel<D, BM, BN, THREADS, DOUBLE, true>
                                         : flash_backward_kernel<D, BM, BN, THREADS, DOUBLE, false>;
  const dim3 grid((p.seq_len + BN - 1) / BN, p.kv_heads, p.batch);
  launch_with_smem(kernel, grid, THREADS, kSmem, stream, p);
}

}  // namespace bf16_detail

// Adds the forward (or backward) kernels of every compiled tile for head dim D.
template <int D>
void add_forward_kernels(Bf16Kernels& k) {
#define FT_ADD_FORWARD(m, n, t) \
  k.forward.push_back(          \
      {D, TileConfig{m, n, t}, ForwardPath::mma, &bf16_detail::launch_forward<D, m, n, t>});
  FT_FLASH_FORWARD_TILES(FT_ADD_FORWARD)
#undef FT_ADD_FORWARD
}

template <int D>
void add_backward_kernels(Bf16Kernels& k) {
#define FT_ADD_BACKWARD(m, n, t)                                               \
  k.backward.push_back({D, TileConfig{m, n, t}, BackwardPath::single,          \
                        &bf16_detail::launch_backward<D, m, n, t, false>});    \
  k.backward.push_back({D, TileConfig{m, n, t}, BackwardPath::double_buffered, \
                        &bf16_detail::launch_backward<D, m, n, t, true>});
  FT_FLASH_BACKWARD_TILES(FT_ADD_BACKWARD)
#undef FT_ADD_BACKWARD
}

}  // namespace ft::attention::cuda

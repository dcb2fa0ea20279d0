// bf16 flash attention on Hopper's warpgroup tensor-core instructions (wgmma, sm_90a): the
// forward and backward kernel templates of the `wgmma` paths, instantiated per tile and head dim
// (64 or 128) by flash_bf16_wgmma_{fwd,bwd}_d*.cu from the list in flash_kernel_list.h.
//
// The algorithm, masking, tile skipping and GQA handling are those of flash_bf16.cuh; what
// changes is who feeds the tensor cores. A warpgroup (four warps, 128 threads) issues one
// m64nNk16 product for 64 rows: both operands come straight from shared memory through a matrix
// descriptor (no ldmatrix, no operand registers), or the left one from registers when it is a
// fresh P or dS, and the products run asynchronously while the warps go on.
//
// Shared memory tiles are stored in 64-column panels (128 bytes per row): a [ROWS][D] tile is
// D / 64 panels of [ROWS][64], and inside a panel the 16-byte chunk c of row r sits at chunk
// c ^ (r % 8) (the hardware's 128-byte swizzle, which needs 1024-byte aligned panels). The same
// storage serves as a K-major operand (a row's 64 columns are the reduction) and as an MN-major
// one (the rows are the reduction), so Q, K, V and dO are loaded once and used both ways.
//
// Forward, one block per (64 * warpgroups query rows, head, batch row): each warpgroup owns 64
// query rows: S = Q K^T (both operands in shared memory), mask and online softmax on the
// accumulators, then O += P V with P from registers. K and V stream through two stages.
//
// Backward, one block per (64 * warpgroups keys, kv head, batch row): each warpgroup owns 64 keys
// and keeps their dK and dV in registers over every query tile (64 rows) of the group's heads:
// S^T = K Q^T and dP^T = V dO^T from shared memory, P^T and dS^T on the accumulators, dV += P^T
// dO and dK += dS^T Q with the left operand from registers, and dQ = dS K from shared memory
// (dS^T is stored for it), added to the fp32 buffer with vector reductions.
#pragma once

#include "attention/cuda/backward_step.cuh"
#include "attention/cuda/flash_bf16.cuh"
#include "attention/cuda/hopper.cuh"

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FT_WGMMA_ENABLED 1
#endif

namespace ft::attention::cuda {

void add_wgmma_forward_d64(Bf16Kernels& k);
void add_wgmma_forward_d128(Bf16Kernels& k);
void add_wgmma_backward_d64(Bf16Kernels& k);
void add_wgmma_backward_d128(Bf16Kernels& k);

namespace wgmma_detail {

using bf16_detail::cp_async_16;
using bf16_detail::cp_async_4;
using bf16_detail::cp_async_commit;
using bf16_detail::cp_async_wait;
using bf16_detail::fast_exp2;
using bf16_detail::mask_tile;
using bf16_detail::moved_max;
using bf16_detail::pack_bf16;
using bf16_detail::quad_max;
using bf16_detail::quad_sum;
using bf16_detail::red_add_f32x4;
using bf16_detail::smem_addr;
using hopper::acc_to_a;
using hopper::advance;
using hopper::desc;
using hopper::kPanel;
using hopper::kPanelRowBytes;
using hopper::mma_rs;
using hopper::mma_ss;
using hopper::panel_offset;
using hopper::pin;
using hopper::wg_commit;
using hopper::wg_fence;
using hopper::wg_wait;
// Shared memory written by threads (cp.async, st.shared) becomes visible to wgmma's operand
// reads only after this fence (and a barrier for other threads' writes).
inline __device__ void fence_smem_for_wgmma() {
  hopper::fence_async_shared();
}

// Rows [row0, row0 + ROWS) of one head of a [B, S, H, D] tensor into a panel tile (rows past the
// sequence end are zero-filled). Each thread copies one 16-byte column chunk of every
// (THREADS / (D / 8))-th row: a multiple of 8 rows apart, so its swizzled offset only moves by
// whole rows and the address arithmetic stays out of the loop.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_panels(__nv_bfloat16* tile, const __nv_bfloat16* head_base,
                                            int64_t row_stride, int row0, int seq_len) {
  constexpr int kChunks = D / 8;
  constexpr int kRowStep = THREADS / kChunks;
  static_assert(THREADS % kChunks == 0 && kRowStep % 8 == 0, "rows 8 apart per thread");
  const int c = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
  const uint32_t dst = smem_addr(tile + panel_offset<ROWS>(r0, c * 8));
  const __nv_bfloat16* src = head_base + (row0 + r0) * row_stride + c * 8;
#pragma unroll
  for (int i = 0; i < (ROWS + kRowStep - 1) / kRowStep; ++i) {
    const int r = r0 + i * kRowStep;
    if (ROWS % kRowStep != 0 && r >= ROWS) break;
    const bool valid = row0 + r < seq_len;
    cp_async_16(dst + i * kRowStep * kPanelRowBytes,
                valid ? src + i * kRowStep * row_stride : head_base, valid);
  }
}

// The dynamic shared memory, rounded up to the 1024 bytes the swizzled panels need (the
// allocation asks for 1024 bytes more than the tiles).
__device__ __forceinline__ __nv_bfloat16* aligned_smem(unsigned char* raw) {
  return reinterpret_cast<__nv_bfloat16*>(hopper::align_1024(raw));
}

// ---- forward ----

template <int D, int BM, int BN, int THREADS>
struct WgmmaForwardTraits {
  static constexpr int kGroups = THREADS / 128;
  static_assert(THREADS % 128 == 0 && BM == 64 * kGroups, "one warpgroup per 64 query rows");
  static_assert(BN == 64 || BN == 128, "key tiles of 64 or 128");
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  // One warpgroup keeps a single K slot (the next K tile loads once S of this one is done), so
  // that three blocks fit an SM; wider blocks double-buffer K. V always has two slots.
  static constexpr int kKSlots = kGroups == 1 ? 1 : 2;
  // With segment ids, the covers of up to kTileTable key tiles are classified up front.
  static constexpr int kTileTable = 256;
  // Q, the K and V slots, the tile table (a cover byte and a key-segment id per tile), and the
  // alignment slack.
  static constexpr int kSmemBytes = 2 * D * (BM + (kKSlots + 2) * BN) + 5 * kTileTable + 1024;
  // Registers for as many one-warpgroup blocks as shared memory (227 KB per SM) lets in.
  static constexpr int kMinBlocks = kGroups > 1 ? 1
                                                : (3 * (kSmemBytes + 1024) <= 227 * 1024 ? 3 : 2);
};

template <int D, int BM, int BN, int THREADS, bool SEG>
__global__ void __launch_bounds__(THREADS, (WgmmaForwardTraits<D, BM, BN, THREADS>::kMinBlocks))
    wgmma_forward_kernel(const FlashParams p) {
#ifdef FT_WGMMA_ENABLED
  constexpr int NT = BN / 8, DT = D / 8;
  constexpr int KS = WgmmaForwardTraits<D, BM, BN, THREADS>::kKSlots;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* q_s = aligned_smem(smem_raw);
  __nv_bfloat16* k_s = q_s + BM * D;       // [KS][BN][D]
  __nv_bfloat16* v_s = k_s + KS * BN * D;  // [2][BN][D]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4, group = threadIdx.x / 128;
  const int q_block = gridDim.x - 1 - blockIdx.x;  // most keys first
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
  const int kb_begin = keys.x / BN, kb_end = (keys.y + BN - 1) / BN;
  // With segment ids, classifying a key tile reads its chunk summaries from global memory; done
  // tile by tile in the loop, every iteration would wait for those loads. So the threads
  // classify all of the block's key tiles at once into a table (when they fit it): the cover,
  // and the tile's segment id when all its keys share one (-1 otherwise).
  constexpr int kTable = WgmmaForwardTraits<D, BM, BN, THREADS>::kTileTable;
  auto* table_id = reinterpret_cast<int*>(v_s + 2 * BN * D);
  auto* table_cover = reinterpret_cast<int8_t*>(table_id + kTable);
  const bool use_table = SEG && kb_end - kb_begin <= kTable;
  if (use_table) {
    for (int t = threadIdx.x; t < kb_end - kb_begin; t += THREADS) {
      const int k0 = (kb_begin + t) * BN, k1 = min(k0 + BN, S);
      const SegmentChunk k_span = combine_chunks(chunk_row, k0, k1);
      table_cover[t] = static_cast<int8_t>(classify_spans(p, true, q_span, k_span, q0, q1, k0, k1));
      table_id[t] = k_span.lowest == k_span.highest && !k_span.has_padding ? k_span.lowest : -1;
    }
    __syncthreads();
  }
  auto next_tile = [&](int kb, Cover& cover) {
    for (; kb < kb_end; ++kb) {
      const int k0 = kb * BN;
      cover = use_table ? static_cast<Cover>(table_cover[kb - kb_begin])
                        : classify(p, chunk_row, q_span, q0, q1, k0, min(k0 + BN, S));
      if (cover != Cover::hidden) break;
    }
    return kb;
  };
  // This thread's rows: row0 and row0 + 8 of the tile.
  const int row0 = group * 64 + warp * 16 + lane / 4;
  const int rows[2] = {q0 + row0, q0 + row0 + 8};
  int qid[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) qid[half] = SEG && rows[half] < S ? seg_row[rows[half]] : 0;
  float o[DT * 4];
#pragma unroll
  for (int i = 0; i < DT * 4; ++i) o[i] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};

  // Pipeline, per visible key tile j (slot j % 2 of K and of V):
  //   issue S_j = Q K_j^T; issue O += P_{j-1} V_{j-1}; wait for S_j; mask and softmax of S_j
  //   (while P V runs); wait for P V; rescale O by the new maximum.
  // K_{j+1} loads at the top of iteration j (its slot held K_{j-1}, whose product is done);
  // V_{j+1} at the end (its slot held V_{j-1}, read by the P V of this iteration).
  load_panels<BM, D, THREADS>(q_s, q_base, q_stride, q0, S);
  Cover cover = Cover::hidden;
  int kb = next_tile(kb_begin, cover);
  if (kb < kb_end) load_panels<BN, D, THREADS>(k_s, k_base, kv_stride, kb * BN, S);
  cp_async_commit();
  if (kb < kb_end) load_panels<BN, D, THREADS>(v_s, v_base, kv_stride, kb * BN, S);
  cp_async_commit();

  const uint64_t q_desc = desc(smem_addr(q_s) + group * 64 * kPanelRowBytes, 0);
  const uint64_t k_desc = desc(smem_addr(k_s), 0);
  const uint64_t v_desc = desc(smem_addr(v_s), BN * kPanelRowBytes);
  constexpr uint32_t kSlotBytes = BN * D * 2;
  // Scores are scaled in the exponent (exp2(s * scale_log2 - max)); with a negative scale the
  // largest scaled score comes from the smallest raw one, and masked scores are +inf.
  const bool positive_scale = p.scale_log2 > 0.0f;
  const float masked = positive_scale ? -INFINITY : INFINITY;
  uint32_t pa[BN / 16][4];  // P of the previous tile, waiting for its product with V
  int it = 0;
  for (; kb < kb_end; ++it) {
    const int slot = it % 2, k_slot_index = KS == 2 ? slot : 0;
    Cover next_cover = Cover::hidden;
    const int next = next_tile(kb + 1, next_cover);
    if (KS == 2) {
      if (next < kb_end) {
        load_panels<BN, D, THREADS>(k_s + (slot ^ 1) * BN * D, k_base, kv_stride, next * BN, S);
      }
      cp_async_commit();
      cp_async_wait<2>();  // K_j (and V_{j-1}) have landed; V_j and K_{j+1} may be in flight
    } else {
      cp_async_wait<1>();  // K_j (and V_{j-1}) have landed; V_j may be in flight
    }
    fence_smem_for_wgmma();
    __syncthreads();

    const int k0 = kb * BN;
    const uint64_t k_slot = advance(k_desc, k_slot_index * kSlotBytes);
    const uint64_t v_prev = advance(v_desc, (slot ^ 1) * kSlotBytes);

    // S = Q K^T: both K-major; a 16-column step moves 32 bytes along a panel row.
    float s[NT * 4];
    pin(o);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) pin(pa[kk]);
    wg_fence();
#pragma unroll
    for (int kd = 0; kd < D / 16; ++kd) {
      const uint32_t col = (kd % 4) * 32;
      mma_ss<BN, 0, 0>(s, advance(q_desc, (kd / 4) * BM * kPanelRowBytes + col),
                       advance(k_slot, (kd / 4) * BN * kPanelRowBytes + col), kd > 0);
    }
    wg_commit();
    // O += P V of the previous tile: P from registers, V MN-major (its rows are the keys).
    if (it > 0) {
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        mma_rs<D, 1>(o, pa[kk], advance(v_prev, kk * 16 * kPanelRowBytes));
      }
    }
    wg_commit();
    wg_wait<1>();
    pin(s);
    if (KS == 1) {  // S_j is done with the only K slot: K_{j+1} loads during the softmax
      __syncthreads();
      if (next < kb_end) load_panels<BN, D, THREADS>(k_s, k_base, kv_stride, next * BN, S);
      cp_async_commit();
    }

    if (k0 + BN > S || cover == Cover::partial) {
      // Keys of one document (no padding) share an id; otherwise each key's id is read.
      UniformSegment keys_seg{true, 0};
      if (SEG) {
        if (use_table) {
          const int id = table_id[kb - kb_begin];
          keys_seg = {id >= 0, id};
        } else {
          keys_seg = uniform_segment(chunk_row, k0, min(k0 + BN, S));
        }
      }
      mask_tile<NT, SEG>(s, p, rows, qid, seg_row, keys_seg, k0, lane, masked);
    }

    // Online softmax, base 2; O is rescaled once the previous product is in.
    float alpha[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float ext = masked;  // the raw score of the largest scaled score
      if (positive_scale) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          ext = fmaxf(ext, fmaxf(s[4 * nt + 2 * half], s[4 * nt + 2 * half + 1]));
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          ext = fminf(ext, fminf(s[4 * nt + 2 * half], s[4 * nt + 2 * half + 1]));
        }
      }
      const float mx = moved_max(row_max[half], quad_max(ext * p.scale_log2));
      const float offset = mx == -INFINITY ? 0.0f : mx;
      alpha[half] = mx == row_max[half] ? 1.0f : fast_exp2(row_max[half] - offset);
      row_max[half] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s[4 * nt + e] = fast_exp2(fmaf(s[4 * nt + e], p.scale_log2, -offset));
          sum += s[4 * nt + e];
        }
      }
      row_sum[half] = row_sum[half] * alpha[half] + sum;
    }
    uint32_t pa_next[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) acc_to_a(pa_next[kk], s, kk);

    wg_wait<0>();
    pin(o);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pin(pa[kk]);
#pragma unroll
      for (int r = 0; r < 4; ++r) pa[kk][r] = pa_next[kk][r];
    }
    // Where no row of the warp moved its maximum (most tiles: kRescaleSlack) every alpha is 1 and
    // the warp skips the pass.
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[4 * dt + e] *= alpha[e / 2];
      }
    }
    __syncthreads();  // every warpgroup's P V is done: V_{j-1}'s slot takes V_{j+1}
    if (next < kb_end) {
      load_panels<BN, D, THREADS>(v_s + (slot ^ 1) * BN * D, v_base, kv_stride, next * BN, S);
    }
    cp_async_commit();
    kb = next;
    cover = next_cover;
  }
  // The last tile's P V.
  cp_async_wait<0>();
  fence_smem_for_wgmma();
  __syncthreads();
  if (it > 0) {
    const uint64_t v_last = advance(v_desc, ((it - 1) % 2) * kSlotBytes);
    pin(o);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) pin(pa[kk]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      mma_rs<D, 1>(o, pa[kk], advance(v_last, kk * 16 * kPanelRowBytes));
    wg_commit();
    wg_wait<0>();
    pin(o);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) pin(pa[kk]);
  }

  auto* o_base = static_cast<__nv_bfloat16*>(p.o) + int64_t{b} * S * q_stride + h * D;
  float* lse_row = p.lse + (int64_t{b} * p.q_heads + h) * S;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int i = q0 + row0 + 8 * half;
    const float sum = quad_sum(row_sum[half]);
    if (i >= S) continue;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int col = dt * 8 + (lane % 4) * 2;
      *reinterpret_cast<uint32_t*>(o_base + i * q_stride + col) =
          pack_bf16(o[4 * dt + 2 * half] * inv, o[4 * dt + 2 * half + 1] * inv);
    }
    if (lane % 4 == 0) {
      lse_row[i] = sum > 0.0f ? (row_max[half] + log2f(sum)) * 0.6931471805599453f : -INFINITY;
    }
  }
#else
  __trap();  // only compiled for sm_90a; can_implement refuses other devices
#endif
}

template <int D, int BM, int BN, int THREADS>
void launch_forward(const FlashParams& p, cudaStream_t stream) {
  constexpr int kSmem = WgmmaForwardTraits<D, BM, BN, THREADS>::kSmemBytes;
  auto kernel = p.segment_ids != nullptr ? wgmma_forward_kernel<D, BM, BN, THREADS, true>
                                         : wgmma_forward_kernel<D, BM, BN, THREADS, false>;
  const dim3 grid((p.seq_len + BM - 1) / BM, p.q_heads, p.batch);
  launch_with_smem(kernel, grid, THREADS, kSmem, stream, p);
}

// ---- backward ----

template <int D, int BM, int BN, int THREADS>
struct WgmmaBackwardTraits {
  static constexpr int kGroups = THREADS / 128;
  static_assert(THREADS % 128 == 0 && BN == 64 * kGroups, "one warpgroup per 64 keys");
  static_assert(BM == 64, "query tiles of 64 rows");
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  // dQ = dS K, one 64-column panel per product: when the head dim has one panel per
  // warpgroup, each takes its panel over all the block's keys; otherwise each adds the products
  // over its own 64 keys for every panel of the head dim.
  static constexpr bool kDqSplitsColumns = D == 64 * kGroups;
  static constexpr int kDqPanels = kDqSplitsColumns ? 1 : D / 64;
  static constexpr int kDqKeys = kDqSplitsColumns ? BN : 64;
  // K, V; per stage Q, dO (bf16) and lse, D (fp32); dS^T (bf16); alignment slack.
  static constexpr int kSmemBytes = 4 * D * BN + 2 * (4 * D * BM + 8 * BM) + 2 * BM * BN + 1024;
  // Head dim 64 on one warpgroup fits three blocks per SM (at most 170 registers a thread).
  static constexpr int kMinBlocks = D == 64 && kGroups == 1 ? 3 : 1;
};

template <int D, int BM, int BN, int THREADS, bool SEG>
__global__ void __launch_bounds__(THREADS, (WgmmaBackwardTraits<D, BM, BN, THREADS>::kMinBlocks))
    wgmma_backward_kernel(const FlashParams p) {
#ifdef FT_WGMMA_ENABLED
  using T = WgmmaBackwardTraits<D, BM, BN, THREADS>;
  constexpr int QT = BM / 8, DT = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* k_s = aligned_smem(smem_raw);
  __nv_bfloat16* v_s = k_s + BN * D;
  __nv_bfloat16* q_s = v_s + BN * D;                        // [2][BM][D]
  __nv_bfloat16* do_s = q_s + 2 * BM * D;                   // [2][BM][D]
  __nv_bfloat16* ds_s = do_s + 2 * BM * D;                  // [BN][BM]: dS^T, one panel wide
  float* lse_s = reinterpret_cast<float*>(ds_s + BN * BM);  // [2][BM]
  float* dsum_s = lse_s + 2 * BM;                           // [2][BM]

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32 % 4, group = threadIdx.x / 128;
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
  const int steps = G * q_blocks;  // step t: query head hk * G + t / q_blocks

  auto next_step = [&](int t, Cover& cover) {
    for (; t < steps; ++t) {
      const int q0 = (qb_begin + t % q_blocks) * BM, q1 = min(q0 + BM, S);
      const SegmentChunk q_span =
          chunk_row ? combine_chunks(chunk_row, q0, q1) : SegmentChunk{0, 0, 0, 0};
      cover = classify(p, chunk_row, q_span, q0, q1, k0, k1);
      if (cover != Cover::hidden) break;
    }
    return t;
  };
  auto load_step = [&](int t, int stage) {
    const int h = hk * G + t / q_blocks, q0 = (qb_begin + t % q_blocks) * BM;
    load_panels<BM, D, THREADS>(q_s + stage * BM * D, q_all + h * D, q_stride, q0, S);
    load_panels<BM, D, THREADS>(do_s + stage * BM * D, do_all + h * D, q_stride, q0, S);
    const int64_t row = (int64_t{b} * p.q_heads + h) * S;
    for (int r = threadIdx.x; r < BM; r += THREADS) {
      const bool valid = q0 + r < S;
      cp_async_4(smem_addr(lse_s + stage * BM + r), p.lse + row + (valid ? q0 + r : 0), valid);
      cp_async_4(smem_addr(dsum_s + stage * BM + r), p.dsum + row + (valid ? q0 + r : 0), valid);
    }
  };

  load_panels<BN, D, THREADS>(k_s, static_cast<const __nv_bfloat16*>(p.k) + kv_off, kv_stride, k0,
                              S);
  load_panels<BN, D, THREADS>(v_s, static_cast<const __nv_bfloat16*>(p.v) + kv_off, kv_stride, k0,
                              S);
  Cover cover = Cover::hidden;
  int t = next_step(0, cover);
  if (t < steps) load_step(t, 0);
  cp_async_commit();

  float dk[DT * 4], dv[DT * 4];
#pragma unroll
  for (int i = 0; i < DT * 4; ++i) dk[i] = dv[i] = 0.0f;

  // This warpgroup's keys start at key_base; this thread's accumulator rows are key_row and
  // key_row + 8.
  const int key_base = group * 64;
  const int key_row = key_base + warp * 16 + lane / 4;
  // Descriptors: this warpgroup's K and V rows (K-major), the stage-0 Q and dO tiles (K-major for
  // S^T and dP^T, MN-major for dK and dV), dS^T and K as the MN-major operands of dQ.
  const uint64_t k_rows = desc(smem_addr(k_s) + key_base * kPanelRowBytes, 0);
  const uint64_t v_rows = desc(smem_addr(v_s) + key_base * kPanelRowBytes, 0);
  const uint64_t q_desc = desc(smem_addr(q_s), 0), q_mn = desc(smem_addr(q_s), BM * kPanelRowBytes);
  const uint64_t do_desc = desc(smem_addr(do_s), 0);
  const uint64_t do_mn = desc(smem_addr(do_s), BM * kPanelRowBytes);
  const uint64_t ds_desc = desc(smem_addr(ds_s), 0);
  const uint64_t k_desc = desc(smem_addr(k_s), 0);
  constexpr uint32_t kStageBytes = BM * D * 2;
  const int dq_panel0 = T::kDqSplitsColumns ? group : 0;
  const int dq_key0 = T::kDqSplitsColumns ? 0 : key_base;
  int kid[2];  // this thread's two keys' segment ids
  backward_step::key_segment_ids<SEG>(seg_row, k0, key_row, S, kid);

  for (int stage = 0; t < steps; stage ^= 1) {
    Cover next_cover = Cover::hidden;
    const int next = next_step(t + 1, next_cover);
    if (next < steps) load_step(next, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    fence_smem_for_wgmma();
    __syncthreads();

    const int h = hk * G + t / q_blocks, q0 = (qb_begin + t % q_blocks) * BM;
    const bool partial = k0 + BN > S || cover == Cover::partial;
    const uint64_t q_stage = advance(q_desc, stage * kStageBytes);
    const uint64_t do_stage = advance(do_desc, stage * kStageBytes);
    const float* lse_t = lse_s + stage * BM;
    const float* dsum_t = dsum_s + stage * BM;

    // S^T = K Q^T, then dP^T = V dO^T, in two groups: P^T is computed while dP^T runs. Rows =
    // this warpgroup's keys, columns = the tile's queries; all four operands K-major.
    float st[QT * 4], dpt[QT * 4];
    backward_step::issue_score_products<BM, BN, D>(st, dpt, k_rows, v_rows, q_stage, do_stage);
    const backward_step::StepRows rows{lse_t, dsum_t, q0, k0, key_row, lane, S, partial};
    backward_step::RowValues<BM> values;
    backward_step::probabilities_and_ds<BM, SEG, false, backward_step::RowReads::late>(
        st, dpt, p, rows, values, chunk_row, seg_row, kid);

    // P^T and dS^T as register operands; dS^T also to shared memory ([key][query], one panel)
    // for dQ.
    uint32_t ap[BM / 16][4], ads[BM / 16][4];
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      acc_to_a(ap[kq], st, kq);
      acc_to_a(ads[kq], dpt, kq);
#pragma unroll
      for (int half = 0; half < 2; ++half) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int col = kq * 16 + c * 8 + (lane % 4) * 2;
          *reinterpret_cast<uint32_t*>(ds_s + panel_offset<BN>(key_row + 8 * half, col)) =
              ads[kq][2 * c + half];
        }
      }
    }
    fence_smem_for_wgmma();
    __syncthreads();  // every warpgroup's dS^T is stored

    // dQ (queries x 64 columns per product) = dS K: dS^T read as an MN-major A (rows = keys), K
    // MN-major. The first product is issued before dV += P^T dO and dK += dS^T Q (left operand
    // from registers, dO and Q MN-major), so that its reduction to global memory overlaps them.
    float* dq_row = p.dq_accum + q_batch + h * D;
    auto issue_dq = [&](float(&dq)[32], int panel) {
#pragma unroll
      for (int kk = 0; kk < T::kDqKeys / 16; ++kk) {
        const int key = dq_key0 + kk * 16;
        mma_ss<64, 1, 1>(dq, advance(ds_desc, key * kPanelRowBytes),
                         advance(k_desc, (panel * BN + key) * kPanelRowBytes), kk > 0);
      }
      wg_commit();
    };
    // Lanes 2c and 2c + 1 hold columns 4c..4c+3 of rows r and r + 8: they swap halves so that
    // each adds four consecutive floats of one row with a single vector reduction.
    auto reduce_dq = [&](float(&dq)[32], int panel) {
      const bool odd = lane & 1;
      const int r = q0 + warp * 16 + lane / 4 + (odd ? 8 : 0);
#pragma unroll
      for (int nq = 0; nq < 8; ++nq) {
        const float* c = dq + 4 * nq;
        const float give0 = odd ? c[0] : c[2], give1 = odd ? c[1] : c[3];
        const float got0 = __shfl_xor_sync(0xffffffffu, give0, 1);
        const float got1 = __shfl_xor_sync(0xffffffffu, give1, 1);
        const float4 v =
            odd ? make_float4(got0, got1, c[2], c[3]) : make_float4(c[0], c[1], got0, got1);
        if (r < S) {
          red_add_f32x4(dq_row + r * q_stride + panel * 64 + nq * 8 + (lane % 4 / 2) * 4, v);
        }
      }
    };
    float dq[32];
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      pin(ap[kq]);
      pin(ads[kq]);
    }
    pin(dv);
    pin(dk);
    wg_fence();
    issue_dq(dq, dq_panel0);
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      const uint32_t row_off = kq * 16 * kPanelRowBytes;
      mma_rs<D, 1>(dv, ap[kq], advance(do_mn, stage * kStageBytes + row_off));
      mma_rs<D, 1>(dk, ads[kq], advance(q_mn, stage * kStageBytes + row_off));
    }
    wg_commit();
    wg_wait<1>();
    pin(dq);
    reduce_dq(dq, dq_panel0);
#pragma unroll
    for (int panel = 1; panel < T::kDqPanels; ++panel) {
      wg_fence();
      issue_dq(dq, dq_panel0 + panel);
      wg_wait<0>();
      pin(dq);
      reduce_dq(dq, dq_panel0 + panel);
    }
    wg_wait<0>();
    pin(dv);
    pin(dk);
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      pin(ap[kq]);
      pin(ads[kq]);
    }
    __syncthreads();  // dS^T and this stage are rewritten next
    t = next;
    cover = next_cover;
  }
  cp_async_wait<0>();

  auto* dk_base = static_cast<__nv_bfloat16*>(p.dk) + kv_off;
  auto* dv_base = static_cast<__nv_bfloat16*>(p.dv) + kv_off;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int j = k0 + key_row + 8 * half;
    if (j >= S) continue;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int col = dt * 8 + (lane % 4) * 2;
      *reinterpret_cast<uint32_t*>(dk_base + j * kv_stride + col) =
          pack_bf16(dk[4 * dt + 2 * half] * p.scale, dk[4 * dt + 2 * half + 1] * p.scale);
      *reinterpret_cast<uint32_t*>(dv_base + j * kv_stride + col) =
          pack_bf16(dv[4 * dt + 2 * half], dv[4 * dt + 2 * half + 1]);
    }
  }
#else
  __trap();  // only compiled for sm_90a; can_implement refuses other devices
#endif
}

template <int D, int BM, int BN, int THREADS>
void launch_backward(const FlashParams& p, cudaStream_t stream) {
  constexpr int kSmem = WgmmaBackwardTraits<D, BM, BN, THREADS>::kSmemBytes;
  auto kernel = p.segment_ids != nullptr ? wgmma_backward_kernel<D, BM, BN, THREADS, true>
                                         : wgmma_backward_kernel<D, BM, BN, THREADS, false>;
  const dim3 grid((p.seq_len + BN - 1) / BN, p.kv_heads, p.batch);
  launch_with_smem(kernel, grid, THREADS, kSmem, stream, p);
}

}  // namespace wgmma_detail

template <int D>
void add_wgmma_forward_kernels(Bf16Kernels& k) {
#define FT_ADD_FORWARD(m, n, t) \
  k.forward.push_back(          \
      {D, TileConfig{m, n, t}, ForwardPath::wgmma, &wgmma_detail::launch_forward<D, m, n, t>});
  FT_FLASH_WGMMA_FORWARD_TILES(FT_ADD_FORWARD)
#undef FT_ADD_FORWARD
}

template <int D>
void add_wgmma_backward_kernels(Bf16Kernels& k) {
#define FT_ADD_BACKWARD(m, n, t) \
  k.backward.push_back(          \
      {D, TileConfig{m, n, t}, BackwardPath::wgmma, &wgmma_detail::launch_backward<D, m, n, t>});
  FT_FLASH_WGMMA_BACKWARD_TILES(FT_ADD_BACKWARD)
#undef FT_ADD_BACKWARD
}

}  // namespace ft::attention::cuda

// bf16 flash attention forward for Hopper (sm_90a): the `tma` path. FlashAttention-3's design,
// built from the pieces of hopper.cuh; one kernel template, instantiated per tile plan
// (tma_plans.h) by flash_bf16_tma_fwd_d*.cu.
//
// A block is persistent (one per SM, or two or three of one consumer group each: the plan's
// blocks_per_sm()): it walks work tiles (64 * groups query rows of one head of one batch row) of
// TileOrder's list (attention/tile_order.h), longest first, each claimed from a counter when its
// producer is ready for it (TmaForwardArgs::claims), and is made of
//   - a producer warpgroup that gives most of its registers away; one warp of it issues every
//     copy: Q of each work tile, and K and V of each visible key tile into rings of `stages`
//     and `v_stages()` slots, all through the copy engine (TMA) onto mbarriers;
//   - `groups` consumer warpgroups that never copy: each owns 64 query rows of the work tile and
//     runs S = Q K^T and O += P V as warpgroup products from shared memory (P from registers).
// Inside a consumer the products of key tile j overlap the softmax of tile j: per tile it issues
// S_j and O += P_{j-1} V_{j-1}, then the mask and the online softmax of S_j run while P V is on
// the tensor cores. Between consumers (`pingpong`) a named barrier passes the turn to issue
// products around, so one group's softmax runs while the others' products fill the tensor cores.
// Ring slots are released per warp as soon as the products that read them are done.
// Q comes through a ring of two slots where shared memory allows (the next work tile's Q loads
// while this one runs); each group writes its output over its own rows of the tile's Q slot
// (once its last product has read them) and TMA stores it from there; lse is written by the
// threads; the slot is released once the store has read it (with two slots, not before the
// next work tile's first products are issued, so the store's latency stays off the path).
//
// Masks: without segment ids causal and window bound a contiguous range of key tiles and each
// tile's cover follows from positions; with segment ids the producer classifies the work tile's
// key tiles into a shared-memory table (two, for this work tile and the next) before it hands
// over Q, so both sides skip the same hidden tiles. The element-wise mask runs only on the tiles
// a boundary cuts (and the last, partial key tile).
//
// Traffic: Q and O once; K and V once per work tile that sees them (heads of a GQA group are
// neighbours in the order, so they meet in L2).
#pragma once

#include <algorithm>

#include "attention/cuda/flash_bf16.cuh"
#include "attention/cuda/hopper.cuh"
#include "attention/cuda/tensor_map.h"
#include "attention/tile_order.h"
#include "attention/tma_plans.h"

namespace ft::attention::cuda {

void add_tma_forward_d64(Bf16Kernels& k);
void add_tma_forward_d128(Bf16Kernels& k);
void add_tma_forward_d256(Bf16Kernels& k);

namespace tma_detail {

using bf16_detail::fast_exp2;
using bf16_detail::ldmatrix_x4;
using bf16_detail::mask_tile;
using bf16_detail::moved_max;
using bf16_detail::quad_max;
using bf16_detail::quad_sum;
using namespace hopper;

// ---- scheduler: TileOrder (attention/tile_order.h) ----

struct TmaForwardArgs {
  CUtensorMap q, k, v, o;
  FlashParams p;
  TileOrder order;
  // Two counters of the launch's stream (zero between launches): with them the blocks claim
  // their work tiles in the order's list, one at a time (a block's first is its index; then the
  // next unclaimed one, when its producer is ready for its Q), so a block that runs ahead takes
  // more; the last block to finish sets both back to zero. Null: TileOrder's static deal
  // (next_tile). Claimed, the forward ran 2-15% faster on an H100 (docs/PERF.md, session 60): the
  // deal's rounds assume blocks of one speed, and the three blocks of an SM, the SMs' clocks and
  // the tiles that documents hide make them differ.
  int* claims = nullptr;
};

// Where a block's producer gets its work tiles: claims on the launch's counter
// (TmaForwardArgs::claims), or TileOrder's deal (next_tile). Claimed, the consumers learn each
// tile from the producer through its Q slot's tile id; dealt, they compute it as it does.
struct TileSource {
  const TmaForwardArgs& a;
  int step = 0;  // the deal's walk step

  __device__ int first() {
    if (a.claims != nullptr) {
      const int block = static_cast<int>(blockIdx.x);
      return block < a.order.count() ? block : -1;
    }
    return a.order.next_tile(step, blockIdx.x, gridDim.x);
  }
  // The block's next work tile, or -1 (the whole warp calls it; lane 0 claims).
  __device__ int next(int lane) {
    if (a.claims == nullptr) {
      ++step;
      return a.order.next_tile(step, blockIdx.x, gridDim.x);
    }
    int t = 0;
    if (lane == 0) t = static_cast<int>(gridDim.x) + atomicAdd(a.claims, 1);
    t = __shfl_sync(0xffffffffu, t, 0);
    return t < a.order.count() ? t : -1;
  }
  // After the block's last claim: the last block to get here zeroes the counters for the next
  // launch on the stream (every block's claims come before its count here).
  __device__ void finish(int lane) const {
    if (a.claims == nullptr || lane != 0) return;
    __threadfence();
    if (atomicAdd(a.claims + 1, 1) == static_cast<int>(gridDim.x) - 1) {
      atomicExch(a.claims, 0);
      atomicExch(a.claims + 1, 0);
    }
  }
};

// ---- shared memory ----

template <int PLAN>
struct Smem {
  static constexpr TmaForwardPlan P = kTmaForwardPlans[PLAN];
  static constexpr int kQSlots = P.q_slots();
  static constexpr int64_t kQ = 0;
  static constexpr int64_t kK = kQ + kQSlots * P.tile_bytes(P.q_rows());
  static constexpr int64_t kV = kK + P.stages * P.tile_bytes(P.block_n);
  static constexpr int64_t kTable = kV + P.v_stages() * P.tile_bytes(P.block_n);
  static constexpr int64_t kBarriers = kTable + P.table_bytes();
  static constexpr int kBarrierCount = 3 * kQSlots + 2 * P.stages + 2 * P.v_stages();
  // After the barriers: each Q slot's work tile (claimed tiles: the producer writes it before Q's
  // full barrier arrives, once every consumer warp has read the one before, tile_read; -1 ends
  // the walk).
  static constexpr int64_t kTileIds = kBarriers + kBarrierCount * 8;
  static_assert(kBarriers + TmaForwardPlan::barrier_bytes() + TmaForwardPlan::align_slack() ==
                    P.smem_bytes(),
                "the kernel's layout is the plan's byte count");
  static_assert(kK % 1024 == 0 && kV % 1024 == 0, "panels on 1024 bytes");
  static_assert(kBarriers % 8 == 0 &&
                    kBarrierCount * 8 + kQSlots * 4 <= TmaForwardPlan::barrier_bytes(),
                "barriers and tile ids fit");
  // Between the output's 64-column panels (elements): it lies in its Q slot's panels.
  static constexpr int kOPanelStride = P.q_rows() * kPanel;

  unsigned char* base;
  __device__ __nv_bfloat16* q(int slot) const {
    return reinterpret_cast<__nv_bfloat16*>(base + kQ + slot * P.tile_bytes(P.q_rows()));
  }
  __device__ __nv_bfloat16* k(int slot) const {
    return reinterpret_cast<__nv_bfloat16*>(base + kK + slot * P.tile_bytes(P.block_n));
  }
  __device__ __nv_bfloat16* v(int slot) const {
    return reinterpret_cast<__nv_bfloat16*>(base + kV + slot * P.tile_bytes(P.block_n));
  }
  // Group g's 64 output rows: its rows of Q slot `slot`.
  __device__ __nv_bfloat16* o(int slot, int g) const { return q(slot) + g * 64 * kPanel; }
  // The segment tables of work tiles with even and odd local index.
  __device__ int* table_ids(int parity) const {
    return reinterpret_cast<int*>(base + kTable) + parity * P.table_tiles();
  }
  __device__ int8_t* table_covers(int parity) const {
    return reinterpret_cast<int8_t*>(base + kTable + 2 * P.table_tiles() * 4) +
           parity * P.table_tiles();
  }
  __device__ uint64_t* barrier(int i) const {
    return reinterpret_cast<uint64_t*>(base + kBarriers) + i;
  }
  __device__ volatile int* tile_id(int slot) const {
    return reinterpret_cast<volatile int*>(base + kTileIds) + slot;
  }
  __device__ uint64_t* q_full(int s) const { return barrier(s); }
  __device__ uint64_t* q_empty(int s) const { return barrier(kQSlots + s); }
  __device__ uint64_t* k_full(int s) const { return barrier(2 * kQSlots + s); }
  __device__ uint64_t* v_full(int s) const { return barrier(2 * kQSlots + P.stages + s); }
  __device__ uint64_t* k_empty(int s) const {
    return barrier(2 * kQSlots + P.stages + P.v_stages() + s);
  }
  __device__ uint64_t* v_empty(int s) const {
    return barrier(2 * kQSlots + 2 * P.stages + P.v_stages() + s);
  }
  __device__ uint64_t* tile_read(int s) const {
    return barrier(2 * kQSlots + 2 * P.stages + 2 * P.v_stages() + s);
  }
};

// Named barriers: consumer g waits for its turn to issue products (pingpong); each group syncs
// its own epilogue.
__device__ __forceinline__ constexpr int turn_barrier(int g) {
  return 1 + g;
}
template <int GROUPS>
__device__ __forceinline__ constexpr int epilogue_barrier(int g) {
  return 1 + GROUPS + g;
}
// Each group's vote on a key tile's exponentials taken without the tile's own maximum
// (OnlineSoftmax::exponentials_at_row_max).
template <int GROUPS>
__device__ __forceinline__ constexpr int vote_barrier(int g) {
  return 1 + 2 * GROUPS + g;
}

// ---- key tiles of a work tile and their covers ----

template <int BM, int BN, int TABLE, bool SEG>
struct KeyTiles {
  const FlashParams& p;
  int q0, q1;      // the work tile's query rows [q0, q1)
  int begin, end;  // key tiles that causal and window leave: [begin, end)
  // Without segment ids: the key tiles that no mask boundary cuts and that end inside the
  // sequence, [full_begin, full_end) (a window cuts a prefix of [begin, end), the causal
  // diagonal and the sequence's end a suffix), so that a consumer asks two comparisons a tile.
  int full_begin = 0, full_end = 0;
  const SegmentChunk* chunk_row;
  SegmentChunk q_span;
  int* ids;  // the table (SEG and at most TABLE key tiles), else null
  int8_t* covers;

  // The producer (`classifies`) needs the query block's segment span; a consumer only when
  // there is no table (its summaries are global loads, better kept off the consumers' path).
  __device__ KeyTiles(const FlashParams& params, const WorkTile& w, int* table_ids,
                      int8_t* table_covers, bool classifies)
      : p(params) {
    const int S = p.seq_len;
    q0 = w.q_block * BM;
    q1 = min(q0 + BM, S);
    const int2 keys = key_range(p, q0, q1);
    begin = keys.x / BN;
    end = (keys.y + BN - 1) / BN;
    if (!SEG) {
      // Full under causal: the tile's last key at most q0, (kb + 1) BN - 1 <= q0; under the
      // window: its first key at least q1 - window, the last query's first visible key.
      full_end = S / BN;
      if (p.causal) full_end = min(full_end, (q0 + 1) / BN);
      if (p.window > 0) full_begin = q1 - p.window <= 0 ? 0 : (q1 - p.window + BN - 1) / BN;
    }
    chunk_row = SEG ? p.segment_chunks + int64_t{w.batch} * p.chunks_per_row() : nullptr;
    const bool table = SEG && end - begin <= TABLE;
    ids = table ? table_ids : nullptr;
    covers = table ? table_covers : nullptr;
    q_span = SEG && (classifies || !table) ? span_of<BM>(q0, q1) : SegmentChunk{0, 0, 0, 0};
  }

  // The segment chunks of [begin, end) (at most ROWS positions from a multiple of 16), combined:
  // a fixed number of independent loads, all in flight at once.
  template <int ROWS>
  __device__ SegmentChunk span_of(int first, int last) const {
    SegmentChunk out{0x7fffffff, -1, 0, 0};
#pragma unroll
    for (int c = 0; c < ROWS / kSegmentChunk; ++c) {
      if (first + c * kSegmentChunk < last) {
        const SegmentChunk x = chunk_row[first / kSegmentChunk + c];
        out.lowest = min(out.lowest, x.lowest);
        out.highest = max(out.highest, x.highest);
        out.has_padding |= x.has_padding;
      }
    }
    return out;
  }

  // The producer's warp fills the table (one tile per lane at a time).
  __device__ void classify_all(int lane) {
    if (covers == nullptr) return;
    for (int t = lane; t < end - begin; t += 32) {
      const int k0 = (begin + t) * BN, k1 = min(k0 + BN, p.seq_len);
      const SegmentChunk k_span = span_of<BN>(k0, k1);
      covers[t] = static_cast<int8_t>(classify_spans(p, true, q_span, k_span, q0, q1, k0, k1));
      ids[t] = k_span.lowest == k_span.highest && !k_span.has_padding ? k_span.lowest : -1;
    }
  }
  __device__ Cover cover(int kb) const {
    const int k0 = kb * BN, k1 = min(k0 + BN, p.seq_len);
    if (!SEG) return classify_spans(p, false, q_span, q_span, q0, q1, k0, k1);
    if (covers != nullptr) return static_cast<Cover>(covers[kb - begin]);
    return classify(p, chunk_row, q_span, q0, q1, k0, k1);
  }
  // Whether tile kb needs the element-wise mask: a boundary cuts it, or it runs past the
  // sequence's end.
  __device__ bool masked(int kb) const {
    if (!SEG) return kb < full_begin || kb >= full_end;
    return (kb + 1) * BN > p.seq_len || cover(kb) == Cover::partial;
  }
  // The first tile from kb on that the mask does not hide (causal and window hide none of
  // [begin, end)).
  __device__ int next_visible(int kb) const {
    if constexpr (SEG) {
      while (kb < end && cover(kb) == Cover::hidden) ++kb;
    }
    return kb;
  }
  // Whether all keys of tile kb belong to one document (no padding), and which.
  __device__ UniformSegment key_segment(int kb) const {
    if (ids != nullptr) return {ids[kb - begin] >= 0, ids[kb - begin]};
    const int k0 = kb * BN;
    return uniform_segment(chunk_row, k0, min(k0 + BN, p.seq_len));
  }
};

// ---- producer ----

template <int PLAN, bool SEG>
__device__ __forceinline__ void produce(const TmaForwardArgs& a, const Smem<PLAN>& s) {
  constexpr TmaForwardPlan P = kTmaForwardPlans[PLAN];
  constexpr int kPanels = P.head_dim / kPanel;
  constexpr uint32_t kKvBytes = P.block_n * P.head_dim * 2;
  constexpr uint32_t kQBytes = P.q_rows() * P.head_dim * 2;
  const int lane = threadIdx.x % 32;
  if (lane == 0) {
    tma_prefetch_map(&a.q);
    tma_prefetch_map(&a.k);
    tma_prefetch_map(&a.v);
    tma_prefetch_map(&a.o);
  }
  RingPosition<Smem<PLAN>::kQSlots> q_ring;
  PairedRings<P.stages, P.v_stages()> kv_rings;
  // One K or V tile into its ring slot, once the consumers have released it.
  auto load_kv = [&](const CUtensorMap* map, __nv_bfloat16* slot, uint64_t* full, uint64_t* empty,
                     uint32_t parity, int kb, const WorkTile& w) {
    if (lane != 0) return;
    mbar_wait(empty, parity ^ 1);
    mbar_arrive_expect_bytes(full, kKvBytes);
    const int hk = w.head / a.p.group();
#pragma unroll
    for (int panel = 0; panel < kPanels; ++panel) {
      tma_load(slot + panel * P.block_n * kPanel, map, full, panel * kPanel, hk, kb * P.block_n,
               w.batch);
    }
  };
  // Claimed tiles: the tile's id beside its Q slot, once every consumer warp has read the id the
  // slot held before (lane 0).
  auto write_tile_id = [&](int t) {
    mbar_wait(s.tile_read(q_ring.slot), q_ring.parity ^ 1);
    *s.tile_id(q_ring.slot) = t;
  };
  // A work tile's segment table (the block's work tiles alternate between two, by their local
  // index) and its Q into the next Q slot, once the tile that used the slot has stored its
  // output from it (with two slots: the tile before last, whose table this one takes).
  auto stage_q = [&](int t, int local) {
    const WorkTile w = a.order.at(t);
    if (lane == 0) {
      mbar_wait(s.q_empty(q_ring.slot), q_ring.parity ^ 1);
      if (a.claims != nullptr) write_tile_id(t);
    }
    __syncwarp();
    KeyTiles<P.block_m, P.block_n, P.table_tiles(), SEG> tiles(a.p, w, s.table_ids(local & 1),
                                                               s.table_covers(local & 1), true);
    tiles.classify_all(lane);
    __syncwarp();
    // Every lane arrives (its table entries are then visible to the consumers); lane 0 also
    // announces Q's bytes.
    uint64_t* q_full = s.q_full(q_ring.slot);
    if (lane == 0) {
      mbar_arrive_expect_bytes(q_full, kQBytes);
      // A box of block_m rows a head and panel; with two heads a tile, the second head's rows
      // follow the first's in each panel (consumer group g reads rows 64 g on).
#pragma unroll
      for (int panel = 0; panel < kPanels; ++panel) {
#pragma unroll
        for (int h = 0; h < P.heads; ++h) {
          tma_load(s.q(q_ring.slot) + (panel * P.q_rows() + h * P.block_m) * kPanel, &a.q, q_full,
                   panel * kPanel, w.head + h, tiles.q0, w.batch);
        }
      }
    } else {
      mbar_arrive(q_full);
    }
    q_ring.advance();
    return tiles;
  };
  // With segment ids and two Q slots the next work tile's table and Q are staged once `stages` +
  // 1 of this tile's key tiles are asked for: the consumers have then released this tile's first
  // K and V slot, which they do after releasing the Q slot of the tile before (so the wait for
  // it is over), and the classification's loads and the copy run under the rest of this tile
  // instead of after its last key tile has a ring slot (window + documents -10%). With one slot
  // the next tile's Q waits for this tile's output store; without segment ids (no table to
  // fill, long tiles) staging early was slower (docs/PERF.md, session 49); a producer of fewer
  // than 56 registers (three consumer groups, three blocks an SM) spills the second table walk
  // (head dim 64: 36 -> 152 bytes): all of these stage the next tile after the walk.
  constexpr bool kStageEarly = SEG && Smem<PLAN>::kQSlots > 1 && P.producer_registers(SEG) >= 56;
  TileSource source{a};
  int t = source.first();
  bool staged = false;  // whether tile t's table and Q were asked for during the tile before
  for (int local = 0; t >= 0; ++local) {
    const WorkTile w = a.order.at(t);
    // The walk's view of the tile: the one its staging made, or (staged during the tile
    // before) one over the table written then.
    const KeyTiles<P.block_m, P.block_n, P.table_tiles(), SEG> tiles =
        staged ? KeyTiles<P.block_m, P.block_n, P.table_tiles(), SEG>(
                     a.p, w, s.table_ids(local & 1), s.table_covers(local & 1), false)
               : stage_q(t, local);
    int next = -1;
    bool known = false;  // whether next was already claimed (where the next tile stages early)
    staged = false;
    int asked = 0;
    for (int kb = tiles.next_visible(tiles.begin); kb < tiles.end;
         kb = tiles.next_visible(kb + 1)) {
      const auto k = kv_rings.k();
      const auto v = kv_rings.v();
      load_kv(&a.k, s.k(k.slot), s.k_full(k.slot), s.k_empty(k.slot), k.parity, kb, w);
      load_kv(&a.v, s.v(v.slot), s.v_full(v.slot), s.v_empty(v.slot), v.parity, kb, w);
      kv_rings.advance();
      if constexpr (kStageEarly) {
        if (++asked == P.stages + 1) {
          next = source.next(lane);
          known = true;
          if (next >= 0) {
            stage_q(next, local + 1);
            staged = true;
          }
        }
      }
    }
    if (!known) next = source.next(lane);
    t = next;
  }
  // Claimed tiles: the consumers wait on the next Q slot for a tile id, which ends their walk.
  if (a.claims != nullptr) {
    if (lane == 0) {
      mbar_wait(s.q_empty(q_ring.slot), q_ring.parity ^ 1);
      write_tile_id(-1);
    }
    __syncwarp();
    mbar_arrive(s.q_full(q_ring.slot));
  }
  source.finish(lane);
}

// ---- consumer pieces ----

// The largest (LARGEST) or smallest score of this thread's row `half` (its elements 2 * half and
// 2 * half + 1 of each 8-column block) as a tree, ceil(log2(NT)) + 1 comparisons deep: a running
// extremum would chain all 2 * NT of them, and the softmax's row maximum is on the path from a
// tile's scores to its exponentials. Each level pairs the first n / 2 values with the upper half
// (ceil(n / 2) on); an odd n leaves its middle value for the next level.
template <int NT, bool LARGEST>
__device__ __forceinline__ float row_extremum(const float (&s)[NT * 4], int half) {
  auto pick = [](float x, float y) { return LARGEST ? fmaxf(x, y) : fminf(x, y); };
  float v[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) v[nt] = pick(s[4 * nt + 2 * half], s[4 * nt + 2 * half + 1]);
#pragma unroll
  for (int n = NT; n > 1; n = (n + 1) / 2) {
#pragma unroll
    for (int i = 0; i < NT / 2; ++i) {
      if (i < n / 2) v[i] = pick(v[i], v[i + (n + 1) / 2]);
    }
  }
  return v[0];
}

// Key tiles that no mask boundary cuts, after a row's first: the exponentials are taken against
// the row maxima as they stand, without the tile's own maximum (its tree of comparisons and
// shuffles is a fifth of a key tile's softmax instructions). The maximum only keeps P from
// overflowing, and the sums, O and the bf16 P hold values far above 1 with the same relative
// rounding; so a tile whose scores stay below max + 64 (log2 units: every P and this thread's sum
// of them below 2^64, checked on the sums) is as exact this way. A tile that rises higher
// (P may then be inf) or a row without a maximum yet is taken again from its scores by the
// exact step (the consumer's group votes: the scores are recomputed by the warpgroup).
inline constexpr float kLazySumLimit = 0x1p64f;

// Online softmax of one key tile for this thread's two rows, base 2 with the scale folded into
// the exponent: the row maxima the exponentials are taken against (moved only past
// kRescaleSlack), alpha = the factor O is rescaled by (1 where the maximum stays),
// P = exp2(s * scale_log2 - max) in place of the scores, and the running row sums. With a
// positive scale the largest scaled score comes from the largest raw one; with a negative one
// from the smallest (and masked scores are +inf). The two extremum trees are separate branches
// on a warp-uniform flag, so a thread runs one of them, not both predicated.
template <int NT>
struct OnlineSoftmax {
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};

  static __device__ __forceinline__ float masked(bool positive_scale) {
    return positive_scale ? -INFINITY : INFINITY;
  }
  __device__ __forceinline__ void step(float (&s)[NT * 4], float scale_log2, bool positive_scale,
                                       float (&alpha)[2]) {
    float ext[2];
    if (positive_scale) {
#pragma unroll
      for (int half = 0; half < 2; ++half) ext[half] = row_extremum<NT, true>(s, half);
    } else {
#pragma unroll
      for (int half = 0; half < 2; ++half) ext[half] = row_extremum<NT, false>(s, half);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const float tile_max = quad_max(ext[half] * scale_log2);
      const float mx = moved_max(row_max[half], tile_max);
      const float offset = mx == -INFINITY ? 0.0f : mx;
      alpha[half] = mx == row_max[half] ? 1.0f : fast_exp2(row_max[half] - offset);
      row_max[half] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s[4 * nt + e] = fast_exp2(fmaf(s[4 * nt + e], scale_log2, -offset));
          sum += s[4 * nt + e];
        }
      }
      row_sum[half] = row_sum[half] * alpha[half] + sum;
    }
  }
  // P = exp2(s * scale_log2 - row_max) in place, without the tile's maximum, and this thread's
  // two row sums of it; whether both rows had a maximum and both sums stay below kLazySumLimit
  // (false for inf and NaN too). The sums are added by add_sums once the group agrees.
  __device__ __forceinline__ bool exponentials_at_row_max(float (&s)[NT * 4], float scale_log2,
                                                          float (&sums)[2]) const {
    if (row_max[0] == -INFINITY || row_max[1] == -INFINITY) return false;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      float sum = 0.0f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 2 * half; e < 2 * half + 2; ++e) {
          s[4 * nt + e] = fast_exp2(fmaf(s[4 * nt + e], scale_log2, -row_max[half]));
          sum += s[4 * nt + e];
        }
      }
      sums[half] = sum;
    }
    return sums[0] < kLazySumLimit && sums[1] < kLazySumLimit;
  }
  __device__ __forceinline__ void add_sums(const float (&sums)[2]) {
    row_sum[0] += sums[0];
    row_sum[1] += sums[1];
  }
};

// O *= alpha per row; where no row of the warp moved its maximum (most tiles: kRescaleSlack) every
// alpha is 1 and the warp skips the pass.
template <int DT>
__device__ __forceinline__ void rescale(float (&o)[DT * 4], const float (&alpha)[2]) {
  if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) return;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) o[4 * dt + e] *= alpha[e / 2];
  }
}

// Epilogue of one consumer group: O / row sum (bf16, swizzled panels) over its own 64 rows of
// the tile's Q slot (its products are done with them), one TMA store per panel, and lse by the
// threads; at its rows of the tile (two heads a tile: the tile's rows, in its own head).
template <int PLAN, int NT>
__device__ __forceinline__ void store_output(const TmaForwardArgs& a, const Smem<PLAN>& s,
                                             int q_slot, int g, const WorkTile& w, int q0,
                                             const float (&o)[kTmaForwardPlans[PLAN].head_dim / 2],
                                             const OnlineSoftmax<NT>& sm) {
  constexpr TmaForwardPlan P = kTmaForwardPlans[PLAN];
  constexpr int DT = P.head_dim / 8;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int S = a.p.seq_len;
  const int row0 = q0 + P.group_row(g);  // this group's first row
  const int head = w.head + P.group_head(g);
  __nv_bfloat16* out = s.o(q_slot, g);
  float* lse_row = a.p.lse + (int64_t{w.batch} * a.p.q_heads + head) * S;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + lane / 4 + 8 * half;
    const float sum = quad_sum(sm.row_sum[half]);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int col = dt * 8 + (lane % 4) * 2;
      const int at = (col / kPanel) * Smem<PLAN>::kOPanelStride + r * kPanel +
                     ((((col % kPanel) / 8) ^ (r % 8)) * 8) + col % 8;
      *reinterpret_cast<uint32_t*>(out + at) =
          pack_bf16(o[4 * dt + 2 * half] * inv, o[4 * dt + 2 * half + 1] * inv);
    }
    const int i = row0 + r;
    if (lane % 4 == 0 && i < S) {
      lse_row[i] = sum > 0.0f ? (sm.row_max[half] + log2f(sum)) * 0.6931471805599453f : -INFINITY;
    }
  }
  fence_async_shared();
  named_sync(epilogue_barrier<P.consumer_groups()>(g), 128);
  if (tid == 0 && row0 < S) {
#pragma unroll
    for (int panel = 0; panel < P.head_dim / kPanel; ++panel) {
      tma_store(&a.o, out + panel * Smem<PLAN>::kOPanelStride, panel * kPanel, head, row0, w.batch);
    }
    tma_store_commit();
  }
}

// A consumer group's 64 rows of the work tile's Q slot as the A operands of S = Q K^T, one
// 16-column step each (the mma.sync fragment layout per warp: warp w holds rows 16 w on). Each
// ldmatrix reads four 8x8 matrices of the swizzled panels: rows +0 and +8 at columns +0 and +8.
template <int PLAN>
__device__ __forceinline__ void load_q_operands(
    uint32_t (&qa)[kTmaForwardPlans[PLAN].head_dim / 16][4], const __nv_bfloat16* q_slot, int g,
    int warp, int lane) {
  constexpr TmaForwardPlan P = kTmaForwardPlans[PLAN];
  const int m = lane / 8;
  const int row = 64 * g + 16 * warp + (m % 2) * 8 + lane % 8;
#pragma unroll
  for (int kd = 0; kd < P.head_dim / 16; ++kd) {
    ldmatrix_x4(qa[kd], smem_addr(q_slot + panel_offset<P.q_rows()>(row, kd * 16 + (m / 2) * 8)));
  }
}

// ---- consumer ----

template <int PLAN, bool SEG>
__device__ __forceinline__ void consume(const TmaForwardArgs& a, const Smem<PLAN>& s, int g) {
  constexpr TmaForwardPlan P = kTmaForwardPlans[PLAN];
  constexpr int D = P.head_dim, BM = P.block_m, BN = P.block_n, NT = BN / 8, DT = D / 8;
  constexpr int kGroups = P.consumer_groups();
  constexpr uint32_t kSlotBytes = BN * D * 2;
  constexpr int QR = P.q_rows();  // rows of a Q slot: 64 a group (BM, or BM a head)
  constexpr uint32_t kQSlotBytes = QR * D * 2;
  constexpr bool kQRegisters = P.q_in_registers(SEG);
  // Exponentials without the tile's maximum (OnlineSoftmax::exponentials_at_row_max) in the
  // plans of two or three groups of one head up to head dim 128, without segment ids: the
  // one-group plans' 80 registers and the head-dim-256 plans spill with its second path (ptxas);
  // with the one-group plans at GPT-2's shape (latency-bound) and the two-head plan with
  // segment ids at window 512 + 5 documents it measured slower (+2% and +10%, H100, session 57).
  constexpr bool kLazyMaximum = kGroups > 1 && P.heads == 1 && D <= 128 && !SEG;
  const FlashParams& p = a.p;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const int S = p.seq_len;
  const int next_group = g + 1 == kGroups ? 0 : g + 1;
  const bool positive_scale = p.scale_log2 > 0.0f;

  // This group's Q rows (K-major, its 64 rows of each panel of slot 0), the K slots (K-major)
  // and the V slots (MN-major: the rows are the reduction).
  const uint64_t q_desc = desc(smem_addr(s.q(0)) + g * 64 * kPanelRowBytes, 0);
  const uint64_t k_desc = desc(smem_addr(s.k(0)), 0);
  const uint64_t v_desc = desc(smem_addr(s.v(0)), BN * kPanelRowBytes);

  if (P.pingpong && g == 0) named_arrive(turn_barrier(0), 256);  // group 0 takes the first turn

  auto release = [&](uint64_t* empty) {
    __syncwarp();
    if (lane == 0) mbar_arrive(empty);
  };
  // A Q slot whose output store may still be reading it. The thread that issued the store
  // releases it once the store has read it: with two slots lazily (in the next work tile,
  // after its first products are issued, so that the store's latency stays off the path), with
  // one at once (the next work tile's Q needs it).
  int unreleased_slot = -1;
  auto release_stored_slot = [&] {
    if (unreleased_slot < 0) return;
    if (tid == 0) {
      tma_store_wait_read();
      mbar_arrive(s.q_empty(unreleased_slot));
    }
    unreleased_slot = -1;
  };
  RingPosition<Smem<PLAN>::kQSlots> q_ring;
  RingPosition<P.stages> k_ring;
  RingPosition<P.v_stages()> v_ring;
  for (int local = 0, step = 0;; ++local, ++step) {  // as the producer walks
    int t;
    if (a.claims != nullptr) {  // claimed: the producer names the tile beside its Q
      if (unreleased_slot == q_ring.slot) release_stored_slot();
      mbar_wait(s.q_full(q_ring.slot), q_ring.parity);
      // Lane 0 reads the id for its warp and arrives once it has: the thread that read is the
      // one whose arrival orders the read before the producer's next write (compute-sanitizer's
      // racecheck follows the order only that way; with every lane reading and lane 0 arriving
      // after a warp barrier it reported the pair).
      t = lane == 0 ? *s.tile_id(q_ring.slot) : 0;
      t = __shfl_sync(0xffffffffu, t, 0);
      if (lane == 0) mbar_arrive(s.tile_read(q_ring.slot));
    } else {
      t = a.order.next_tile(step, blockIdx.x, gridDim.x);
    }
    if (t < 0) break;
    const WorkTile w = a.order.at(t);
    const KeyTiles<BM, BN, P.table_tiles(), SEG> tiles(p, w, s.table_ids(local & 1),
                                                       s.table_covers(local & 1), false);
    const int32_t* seg_row = SEG ? p.segment_ids + int64_t{w.batch} * S : nullptr;
    // This thread's two rows.
    const int rows[2] = {tiles.q0 + P.group_row(g) + warp * 16 + lane / 4,
                         tiles.q0 + P.group_row(g) + warp * 16 + lane / 4 + 8};
    int qid[2] = {0, 0};
    if (SEG) {
      qid[0] = rows[0] < S ? seg_row[rows[0]] : -1;
      qid[1] = rows[1] < S ? seg_row[rows[1]] : -1;
    }
    float o[DT * 4];
#pragma unroll
    for (int i = 0; i < DT * 4; ++i) o[i] = 0.0f;
    OnlineSoftmax<NT> softmax;
    uint32_t pa[BN / 16][4];  // P of the previous key tile, waiting for its product with V
    const int q_slot = q_ring.slot;
    const uint64_t q_tile = advance(q_desc, q_slot * kQSlotBytes);
    // This tile's Q goes into the slot of the tile before last: if that slot still waits for
    // its store (the last tile had no key tile to release it under), release it now.
    if (unreleased_slot == q_slot) release_stored_slot();
    mbar_wait(s.q_full(q_slot), q_ring.parity);
    uint32_t qa[kQRegisters ? D / 16 : 1][4];  // this group's Q rows as A operands
    if constexpr (kQRegisters) {
      // A warp reads its 16 rows of the slot with ldmatrix, and its lanes write O over the same
      // rows at the end (store_output), in this work tile and in the slot's earlier ones: lanes
      // other than the ones that read. The warp barriers order the two for every lane (without
      // them compute-sanitizer's racecheck reports the pairs as intra-warp hazards).
      __syncwarp();
      load_q_operands<PLAN>(qa, s.q(q_slot), g, warp, lane);
      __syncwarp();
    }

    // The pieces of one key tile. S = Q K^T of ring slot `slot` (both K-major; a 16-column
    // step moves 32 bytes along a panel row), Q from registers or from its slot.
    float sc[NT * 4];
    auto issue_scores = [&](int slot) {
      const uint64_t k_slot = advance(k_desc, slot * kSlotBytes);
#pragma unroll
      for (int kd = 0; kd < D / 16; ++kd) {
        const uint32_t col = (kd % 4) * 32;
        const uint64_t k_step = advance(k_slot, (kd / 4) * BN * kPanelRowBytes + col);
        if constexpr (kQRegisters) {
          mma_rs<BN, 0>(sc, qa[kd], k_step, kd > 0);
        } else {
          mma_ss<BN, 0, 0>(sc, advance(q_tile, (kd / 4) * QR * kPanelRowBytes + col), k_step,
                           kd > 0);
        }
      }
      wg_commit();
    };
    // O += P V of ring slot `slot`: P from registers, V MN-major (its rows are the keys).
    auto issue_pv = [&](int slot) {
      const uint64_t v_slot = advance(v_desc, slot * kSlotBytes);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        mma_rs<D, 1>(o, pa[kk], advance(v_slot, kk * 16 * kPanelRowBytes));
      }
      wg_commit();
    };
    // Mask (where a boundary cuts the tile) and online softmax of the scores of key tile kb.
    auto softmax_step = [&](int kb, float(&alpha)[2]) {
      const int k0 = kb * BN;
      if (tiles.masked(kb)) {
        mask_tile<NT, SEG>(sc, p, rows, qid, seg_row,
                           SEG ? tiles.key_segment(kb) : UniformSegment{true, 0}, k0, lane,
                           OnlineSoftmax<NT>::masked(positive_scale));
      }
      softmax.step(sc, p.scale_log2, positive_scale, alpha);
    };
    auto begin_turn = [&] {
      if (P.pingpong) named_sync(turn_barrier(g), 256);
      pin(o);
      pin(pa);
      if constexpr (kQRegisters) pin(qa);
      wg_fence();
    };
    auto end_turn = [&] {
      if (P.pingpong) named_arrive(turn_barrier(next_group), 256);
    };

    int kb = tiles.next_visible(tiles.begin);
    RingPosition<P.v_stages()> prev = v_ring;  // the slot whose V the next P V reads
    if (kb < tiles.end) {                      // the first key tile: its scores alone
      mbar_wait(s.k_full(k_ring.slot), k_ring.parity);
      begin_turn();
      issue_scores(k_ring.slot);
      end_turn();
      release_stored_slot();  // the previous tile's store has had its products' time to read
      wg_wait<0>();
      pin(sc);
      release(s.k_empty(k_ring.slot));
      float alpha[2];
      softmax_step(kb, alpha);
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) acc_to_a(pa[kk], sc, kk);
      prev = v_ring;
      k_ring.advance();
      v_ring.advance();
      kb = tiles.next_visible(kb + 1);
    }
    // Steady state: S_j and P_{j-1} V_{j-1} issued together, the softmax of S_j while P V runs.
    for (; kb < tiles.end; kb = tiles.next_visible(kb + 1)) {
      mbar_wait(s.k_full(k_ring.slot), k_ring.parity);
      mbar_wait(s.v_full(prev.slot), prev.parity);
      begin_turn();
      issue_scores(k_ring.slot);
      issue_pv(prev.slot);
      end_turn();
      wg_wait<1>();
      pin(sc);
      float alpha[2];
      if (!kLazyMaximum || tiles.masked(kb)) {
        release(s.k_empty(k_ring.slot));
        softmax_step(kb, alpha);
      } else {
        // Without the tile's maximum where the whole group's rows allow it; else S_j again
        // from its K slot, which is held until then, and the exact step.
        float sums[2];
        const bool ok = softmax.exponentials_at_row_max(sc, p.scale_log2, sums);
        if (!named_any(vote_barrier<kGroups>(g), 128, !ok)) {
          softmax.add_sums(sums);
          alpha[0] = alpha[1] = 1.0f;
        } else {
          wg_fence();
          issue_scores(k_ring.slot);
          wg_wait<0>();
          pin(sc);
          softmax_step(kb, alpha);
        }
        release(s.k_empty(k_ring.slot));
      }
      wg_wait<0>();
      pin(o);
      pin(pa);
      release(s.v_empty(prev.slot));
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) acc_to_a(pa[kk], sc, kk);
      rescale<DT>(o, alpha);
      prev = v_ring;
      k_ring.advance();
      v_ring.advance();
    }
    if (prev.slot != v_ring.slot || prev.parity != v_ring.parity) {  // the last tile's P V
      mbar_wait(s.v_full(prev.slot), prev.parity);
      begin_turn();
      issue_pv(prev.slot);
      end_turn();
      wg_wait<0>();
      pin(o);
      pin(pa);
      release(s.v_empty(prev.slot));
    }
    // This group's products are done with its Q rows: the output goes over them.
    store_output<PLAN, NT>(a, s, q_slot, g, w, tiles.q0, o, softmax);
    release_stored_slot();  // only when this tile had no key tile to release it under
    unreleased_slot = q_slot;
    if constexpr (Smem<PLAN>::kQSlots == 1) release_stored_slot();
    q_ring.advance();
  }
  if (tid == 0) tma_store_wait_all();
}

// ---- the kernel ----

template <int PLAN, bool SEG>
__global__ void __launch_bounds__(kTmaForwardPlans[PLAN].threads(),
                                  kTmaForwardPlans[PLAN].blocks_per_sm())
    tma_forward_kernel(const __grid_constant__ TmaForwardArgs args) {
#ifdef FT_HOPPER_ENABLED
  constexpr TmaForwardPlan P = kTmaForwardPlans[PLAN];
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const Smem<PLAN> s{align_1024(smem_raw)};
  if (threadIdx.x == 0) {
    for (int i = 0; i < Smem<PLAN>::kQSlots; ++i) {
      mbar_init(s.q_full(i), 32);  // every producer lane (the table)
      // Each consumer group's store thread, once its store has read the slot.
      mbar_init(s.q_empty(i), P.consumer_groups());
    }
    for (int i = 0; i < P.stages; ++i) {
      mbar_init(s.k_full(i), 1);
      mbar_init(s.k_empty(i), 4 * P.consumer_groups());
    }
    for (int i = 0; i < P.v_stages(); ++i) {
      mbar_init(s.v_full(i), 1);
      mbar_init(s.v_empty(i), 4 * P.consumer_groups());
    }
    for (int i = 0; i < Smem<PLAN>::kQSlots; ++i) {
      mbar_init(s.tile_read(i), 4 * P.consumer_groups());  // each consumer warp, claimed tiles
    }
    mbar_fence_init();
  }
  __syncthreads();
  // The warpgroup index, provably the same across the warp (the roles are warp-uniform
  // branches, which setmaxnreg needs).
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (warpgroup == 0) {
    release_registers<P.producer_registers(SEG)>();
    if (threadIdx.x < 32) produce<PLAN, SEG>(args, s);
  } else {
    claim_registers<P.consumer_registers(SEG)>();
    consume<PLAN, SEG>(args, s, warpgroup - 1);
  }
#else
  __trap();  // only compiled for sm_90a; can_implement refuses other devices
#endif
}

// ---- host ----

template <int PLAN>
void launch_tma_forward(const FlashParams& p, cudaStream_t stream) {
  constexpr TmaForwardPlan P = kTmaForwardPlans[PLAN];
  TmaForwardArgs a;
  a.q = head_tensor_map(p.q, p.batch, p.seq_len, p.q_heads, P.head_dim, p.q_row, P.block_m);
  a.k = head_tensor_map(p.k, p.batch, p.seq_len, p.kv_heads, P.head_dim, p.k_row, P.block_n);
  a.v = head_tensor_map(p.v, p.batch, p.seq_len, p.kv_heads, P.head_dim, p.v_row, P.block_n);
  a.o = head_tensor_map(p.o, p.batch, p.seq_len, p.q_heads, P.head_dim,
                        int64_t{p.q_heads} * P.head_dim, 64);
  a.p = p;
  TileDeal deal{p.batch,    p.seq_len,  p.q_heads,
                p.kv_heads, p.head_dim, Mask{p.causal, p.window, p.segment_ids != nullptr},
                P.block_m,  P.block_n,  P.heads};
  // Persistent: blocks_per_sm() blocks on every SM.
  deal.grid = std::min(deal.tiles(), sm_count() * P.blocks_per_sm());
  a.order = cached_tile_order(deal);
  a.claims = tma_forward_claims();
  auto kernel =
      p.segment_ids != nullptr ? tma_forward_kernel<PLAN, true> : tma_forward_kernel<PLAN, false>;
  if constexpr (P.blocks_per_sm() > 1) {
    // All of the SM's shared memory for the blocks (the driver may otherwise keep part of it as
    // L1 and fit fewer of them).
    FT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
  }
  launch_with_smem(kernel, deal.grid, P.threads(), static_cast<int>(P.smem_bytes()), stream, a);
}

}  // namespace tma_detail

// Adds the compiled plans of head dim D to the table.
template <int D, int I = 0>
void add_tma_forward_kernels(Bf16Kernels& k) {
  if constexpr (I < kTmaForwardPlanCount) {
    constexpr TmaForwardPlan P = kTmaForwardPlans[I];
    if constexpr (P.head_dim == D && tma_plan_compiled(P)) {
      k.forward.push_back({D, TileConfig{P.block_m, P.block_n, P.threads()}, ForwardPath::tma,
                           &tma_detail::launch_tma_forward<I>, P.stages, P.pingpong});
    }
    add_tma_forward_kernels<D, I + 1>(k);
  }
}

}  // namespace ft::attention::cuda

// bf16 flash attention backward for Hopper (sm_90a): the `tma` path. FlashAttention-3's shape
// of the backward on the pieces of hopper.cuh; one kernel template, instantiated per tile plan
// (tma_plans.h) by flash_bf16_tma_bwd_d*.cu.
//
// A block owns block_n keys of one kv head (K and V stay in shared memory) and walks every query
// tile (64 rows) of every query head of its GQA group that can see those keys. It is made of
//   - a producer warpgroup that gives most of its registers away; one warp of it loads K and V
//     once, then per step Q and dO by TMA and lse (in log2 units) and D by plain loads into a
//     ring of `stages` slots, with the step's query head, rows and each consumer's mask cover;
//     a last slot with no head ends;
//   - two or three consumer warpgroups (the plan's block_n / 64), 64 keys each, whose dK and dV
//     stay in registers over all steps; at head dim 256 two groups share 64 keys and each holds
//     half of the head dim's columns (consume_head_part below).
// A step is 64 query rows, or 128 where two groups split dQ by rows (tma_plans.h).
// A consumer's step (where the mask hides all of its keys from the step's queries, none of its
// products; where the groups split dQ's columns or rows, only its part of dQ over the other
// group's keys): S^T = K Q^T and dP^T = V dO^T (shared-memory products; P^T is computed while
// dP^T runs), dS^T = P^T (dP^T - D), dS^T into shared memory (two buffers; where the groups split
// dQ's columns or rows the other group reads it too), then dQ = dS K from shared memory
// and dV += P^T dO, dK += dS^T Q with the left operand from registers. Its dQ part (64 rows x 64
// columns, fp32) goes into a staging tile (two per consumer where they fit, alternating; mbarriers)
// and one thread of the producer warpgroup, the dQ writer, adds it to the fp32 dQ buffer by TMA
// reductions: no consumer thread waits on global memory. At the end a group's dK and dV leave
// the same way, through its staging tiles and TMA stores.
//
// The grid's order (KeyBlockTile): (batch, kv head) pairs in groups whose Q and dO fit half the
// L2, key blocks outermost within a group, so that under a causal mask the longest blocks start
// first while the blocks resident at once share their Q and dO in L2; deterministic mode puts
// every pair in one group (docs/PERF.md, "The tma backward", b3).
//
// Deterministic mode (FlashParams::dq_semaphore): the reductions into each query tile of dQ
// happen in a fixed order, key block by key block (then consumer by consumer where their parts
// meet): a counter per query tile says whose turn it is, and only the writer waits for it. Steps
// that the mask hides from every group are then sent rather than skipped, so that every key block
// in a query tile's range takes its turn: a group with nothing to add hands the writer an empty
// record, whose turn the writer passes (where the groups split the head dim, zeros computed).
#pragma once

#include <algorithm>
#include <cstdint>

#include "attention/cuda/backward_step.cuh"
#include "attention/cuda/flash_bf16.cuh"
#include "attention/cuda/hopper.cuh"
#include "attention/cuda/tensor_map.h"
#include "attention/fragment_layout.h"
#include "attention/tma_plans.h"

namespace ft::attention::cuda {

void add_tma_backward_d64(Bf16Kernels& k);
void add_tma_backward_d128(Bf16Kernels& k);
void add_tma_backward_d256(Bf16Kernels& k);

namespace tma_bwd_detail {

using namespace hopper;

// How KeyBlockTile groups the (batch, kv head) pairs: the pairs before `tail_first` in groups
// of `size`, the pairs from `tail_first` on in one last group.
struct PairGroups {
  int size, tail_first;
};

struct TmaBackwardArgs {
  CUtensorMap q, k, v, dout, dq;
  CUtensorMap dk, dv;  // stores of 64 key rows (the epilogue)
  FlashParams p;
  PairGroups groups;  // KeyBlockTile's groups of pairs
};

// What a ring slot carries besides its tiles: the step's query head (< 0: no more steps), its
// first query row and each consumer group's mask cover (group_cover()).
struct StepInfo {
  int head, q0, covers, unused;
};

// The covers of a step, two bits a consumer group: where the mask leaves all of the group's 64
// keys of the block visible to the step's queries, cuts them, or hides them all.
__device__ __forceinline__ int with_group_cover(int covers, int g, Cover c) {
  return covers | (static_cast<int>(c) << (2 * g));
}
__device__ __forceinline__ Cover group_cover(int covers, int g) {
  return static_cast<Cover>((covers >> (2 * g)) & 3);
}

// ---- shared memory ----

template <int PLAN>
struct BackwardSmem {
  static constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  static constexpr int BM = P.block_m, BN = P.block_n, kGroups = P.consumer_groups();
  static constexpr int kDqSlots = P.dq_slots();
  static constexpr int64_t kDqTile = P.dq_tile_bytes();
  static constexpr int64_t kScoreTile = int64_t{BN} * BM * 2;  // dS^T or P^T of a step
  static constexpr int64_t kK = 0;
  static constexpr int64_t kV = kK + P.tile_bytes(BN);
  static constexpr int64_t kQ = kV + P.tile_bytes(BN);
  static constexpr int64_t kDo = kQ + P.stages * P.tile_bytes(BM);
  static constexpr int64_t kDs = kDo + P.stages * P.tile_bytes(BM);
  static constexpr int64_t kDq = kDs + P.ds_bytes();
  static constexpr int64_t kLse = kDq + kDqSlots * kGroups * kDqTile;
  static constexpr int64_t kDsum = kLse + P.stages * BM * 4;
  static constexpr int64_t kBarriers = kDsum + P.stages * BM * 4;
  // K and V; full and empty per ring slot; full and empty per dQ staging tile.
  static constexpr int kBarrierCount = 1 + 2 * P.stages + 2 * kDqSlots * kGroups;
  static constexpr int64_t kInfo = kBarriers + 8 * kBarrierCount;
  static constexpr int64_t kDqInfo = kInfo + 16 * P.stages;
  static_assert(kDqInfo + 16 * kDqSlots * kGroups <= kBarriers + P.barrier_bytes(),
                "barriers and step records fit");
  static_assert(kBarriers + P.barrier_bytes() + TmaBackwardPlan::align_slack() == P.smem_bytes(),
                "the kernel's layout is the plan's byte count");
  static_assert(kQ % 1024 == 0 && kDo % 1024 == 0 && kDs % 1024 == 0 && kDq % 1024 == 0 &&
                    kDqTile % 1024 == 0 && kScoreTile % 1024 == 0,
                "panels and staging tiles on 1024 bytes");

  unsigned char* base;
  template <typename T>
  __device__ T* at(int64_t offset) const {
    return reinterpret_cast<T*>(base + offset);
  }
  __device__ __nv_bfloat16* k() const { return at<__nv_bfloat16>(kK); }
  __device__ __nv_bfloat16* v() const { return at<__nv_bfloat16>(kV); }
  __device__ __nv_bfloat16* q(int slot) const {
    return at<__nv_bfloat16>(kQ + slot * P.tile_bytes(BM));
  }
  __device__ __nv_bfloat16* dout(int slot) const {
    return at<__nv_bfloat16>(kDo + slot * P.tile_bytes(BM));
  }
  // dS^T of a step: [BN keys][BM queries], one panel; two buffers, alternating by step.
  __device__ __nv_bfloat16* ds(int buffer) const {
    return at<__nv_bfloat16>(kDs + buffer * kScoreTile);
  }
  // P^T of a step, the same way (only where the groups split the head dim).
  __device__ __nv_bfloat16* pt(int buffer) const {
    static_assert(P.head_parts() > 1, "P^T stays in registers unless the head dim is split");
    return at<__nv_bfloat16>(kDs + (2 + buffer) * kScoreTile);
  }
  // Consumer g's fp32 dQ staging tile `slot`: dq_columns() / 32 boxes of [64 rows][32 columns].
  __device__ float* dq(int slot, int g) const {
    return at<float>(kDq + (slot * kGroups + g) * kDqTile);
  }
  __device__ float* lse(int slot) const { return at<float>(kLse + slot * BM * 4); }
  __device__ float* dsum(int slot) const { return at<float>(kDsum + slot * BM * 4); }
  __device__ uint64_t* kv_full() const { return at<uint64_t>(kBarriers); }
  __device__ uint64_t* full(int slot) const { return at<uint64_t>(kBarriers) + 1 + slot; }
  __device__ uint64_t* empty(int slot) const {
    return at<uint64_t>(kBarriers) + 1 + P.stages + slot;
  }
  __device__ StepInfo* info(int slot) const { return at<StepInfo>(kInfo) + slot; }
  // Staging tile (slot, g): staged (its step's record written), and read by the copy engine.
  __device__ uint64_t* dq_full(int slot, int g) const {
    return at<uint64_t>(kBarriers) + 1 + 2 * P.stages + slot * kGroups + g;
  }
  __device__ uint64_t* dq_empty(int slot, int g) const {
    return at<uint64_t>(kBarriers) + 1 + 2 * P.stages + kDqSlots * kGroups + slot * kGroups + g;
  }
  __device__ StepInfo* dq_info(int slot, int g) const {
    return at<StepInfo>(kDqInfo) + slot * kGroups + g;
  }
};

// Named barrier ids: 1 (both groups) or 1 + g for dS^T (ds_stored below); kEpilogueBarrier + g
// for a group's epilogue.
inline constexpr int kEpilogueBarrier = 4;

// Named barriers: dS^T is complete, for the products that read it: both groups' (dQ over every
// key of the block, when the groups split dQ's columns), or group g's own (each group's dQ part
// reads only its own keys' rows; the groups then run out of step, one's element-wise work under
// the other's products, instead of waiting for each other every step).
template <bool BOTH>
__device__ __forceinline__ void ds_stored(int g, int groups) {
  if constexpr (BOTH) {
    named_sync(1, 128 * groups);
  } else {
    named_sync(1 + g, 128);
  }
}
// The same barrier of both groups where each one's dQ part reads both groups' dS^T (consume(): dQ
// split by columns at head dim 128, by rows with 128-query steps): a group whose keys the mask
// hides waits for it on its own path, at another instruction, so the barrier is the unaligned
// form.
__device__ __forceinline__ void ds_stored_split() {
  named_sync_unaligned(1, 256);
}

// ---- scheduler ----

// The key block, kv head and batch row this thread block computes. The (batch, kv head) pairs
// go in groups (PairGroups); within a group key blocks are outermost (every pair's first
// key block, then every pair's second, ...). Under a causal mask the first key blocks have the
// most query tiles, so within a group the longest blocks start first and the group's tail is
// made of its shortest. The group size trades the L2 against spreading: a group's blocks stream
// the same Q and dO (pair_groups(): as many pairs as fit half the L2), and in deterministic
// mode one group holds every pair, so that a key block's predecessors at a query tile (same
// pair, earlier key blocks, smaller indices: launched before it) run waves earlier instead of
// beside it, one step ahead. The last group is larger (PairGroups::tail_first): a last group of
// a few pairs would launch its longest key blocks when the others are ending.
struct KeyBlockTile {
  int kv_block, hk, b;
  __device__ KeyBlockTile(const FlashParams& p, int key_blocks, const PairGroups& groups) {
    const int pairs = p.kv_heads * p.batch;
    const int block = static_cast<int>(blockIdx.x);
    const bool tail = block >= groups.tail_first * key_blocks;
    const int first_pair =
        tail ? groups.tail_first : block / (groups.size * key_blocks) * groups.size;
    const int group_pairs = tail ? pairs - groups.tail_first : groups.size;
    const int r = block - first_pair * key_blocks;
    kv_block = r / group_pairs;
    const int pair = first_pair + (r - kv_block * group_pairs);
    hk = pair % p.kv_heads;
    b = pair / p.kv_heads;
  }
};

// The key block's steps: query tiles [qb_begin, qb_begin + q_blocks) of each query head of the
// group, heads outer.
struct KeyBlockSteps {
  int k0, k1, qb_begin, q_blocks, steps;
  __device__ KeyBlockSteps(const FlashParams& p, const KeyBlockTile& tile, int BM, int BN) {
    k0 = tile.kv_block * BN;
    k1 = min(k0 + BN, p.seq_len);
    const int2 queries = query_range(p, k0, k1);
    qb_begin = queries.x / BM;
    q_blocks = max(0, (queries.y + BM - 1) / BM - qb_begin);
    steps = p.group() * q_blocks;
  }
};

// ---- producer ----

template <int PLAN, bool SEG>
__device__ __forceinline__ void produce(const TmaBackwardArgs& a, const BackwardSmem<PLAN>& s) {
  constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  constexpr int D = P.head_dim, BM = P.block_m, BN = P.block_n, kPanels = D / kPanel;
  const FlashParams& p = a.p;
  const KeyBlockTile tile(p, (p.seq_len + BN - 1) / BN, a.groups);
  const int lane = threadIdx.x % 32, hk = tile.hk, b = tile.b, S = p.seq_len;
  const KeyBlockSteps steps(p, tile, BM, BN);
  if (lane == 0) {
    tma_prefetch_map(&a.q);
    tma_prefetch_map(&a.dout);
    tma_prefetch_map(&a.k);
    tma_prefetch_map(&a.v);
    mbar_arrive_expect_bytes(s.kv_full(), static_cast<uint32_t>(P.kv_bytes()));
#pragma unroll
    for (int panel = 0; panel < kPanels; ++panel) {
      tma_load(s.k() + panel * BN * kPanel, &a.k, s.kv_full(), panel * kPanel, hk, steps.k0, b);
      tma_load(s.v() + panel * BN * kPanel, &a.v, s.kv_full(), panel * kPanel, hk, steps.k0, b);
    }
  }
  const SegmentChunk* chunk_row =
      SEG ? p.segment_chunks + int64_t{b} * p.chunks_per_row() : nullptr;
  // Each consumer group's keys [k0 + 64 (g / head_parts), + 64) and their segment span.
  constexpr int kGroups = P.consumer_groups(), kParts = P.head_parts();
  SegmentChunk k_spans[kGroups];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int gk0 = steps.k0 + 64 * (g / kParts), gk1 = min(gk0 + 64, S);
    k_spans[g] = SEG && gk0 < S ? combine_chunks(chunk_row, gk0, gk1) : SegmentChunk{0, 0, 0, 0};
  }
  const bool deterministic = p.dq_semaphore != nullptr;
  RingPosition<P.stages> ring;
  // Hands the consumers one slot: the step's record, Q and dO by TMA and lse and D of its rows
  // (every lane two rows) when `load`. lse and D are read from global memory before the slot is
  // free and Q and dO are asked for before lse and D are stored, so that neither the loads'
  // latency nor the stores delay the copies.
  constexpr int kRowsPerLane = BM / 32;
  auto send = [&](const StepInfo& info, bool load) {
    float lse2[kRowsPerLane], dsum[kRowsPerLane];
    if (load) {
      const int64_t row = (int64_t{b} * p.q_heads + info.head) * S;
#pragma unroll
      for (int j = 0; j < kRowsPerLane; ++j) {
        const int r = info.q0 + lane + 32 * j;
        // Rows past the end see nothing: lse +inf (log2 units) makes their P zero, as for rows
        // that see no key.
        lse2[j] = r < S ? backward_step::lse_log2(p.lse[row + r]) : INFINITY;
        dsum[j] = r < S ? p.dsum[row + r] : 0.0f;
      }
    }
    // Every lane waits: each rewrites lse and D that consumer threads read.
    mbar_wait(s.empty(ring.slot), ring.parity ^ 1);
    uint64_t* full = s.full(ring.slot);
    if (lane == 0) {
      *s.info(ring.slot) = info;
      if (load) {
        mbar_expect_bytes(full, static_cast<uint32_t>(2 * P.tile_bytes(BM)));
#pragma unroll
        for (int panel = 0; panel < kPanels; ++panel) {
          tma_load(s.q(ring.slot) + panel * BM * kPanel, &a.q, full, panel * kPanel, info.head,
                   info.q0, b);
          tma_load(s.dout(ring.slot) + panel * BM * kPanel, &a.dout, full, panel * kPanel,
                   info.head, info.q0, b);
        }
      }
    }
    if (load) {
#pragma unroll
      for (int j = 0; j < kRowsPerLane; ++j) {
        s.lse(ring.slot)[lane + 32 * j] = lse2[j];
        s.dsum(ring.slot)[lane + 32 * j] = dsum[j];
      }
    }
    mbar_arrive(full);
    ring.advance();
  };
  for (int t = 0; t < steps.steps; ++t) {
    const int h = hk * p.group() + t / steps.q_blocks;
    const int q0 = (steps.qb_begin + t % steps.q_blocks) * BM, q1 = min(q0 + BM, S);
    const SegmentChunk q_span = SEG ? combine_chunks(chunk_row, q0, q1) : SegmentChunk{0, 0, 0, 0};
    int covers = 0;
    bool seen = false;
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      const int gk0 = steps.k0 + 64 * (g / kParts), gk1 = min(gk0 + 64, S);
      Cover c =
          gk0 < S ? classify_spans(p, SEG, q_span, k_spans[g], q0, q1, gk0, gk1) : Cover::hidden;
      if (c == Cover::full && gk0 + 64 > S) c = Cover::partial;  // the keys end inside the group
      seen = seen || c != Cover::hidden;
      // Where the groups split the head dim they share their keys: a step that hides them (sent in
      // deterministic mode only) is computed as cut, zeros.
      if (c == Cover::hidden && kParts > 1) c = Cover::partial;
      covers = with_group_cover(covers, g, c);
    }
    // A step that no group sees is skipped, except in deterministic mode: there every group
    // hands the writer an empty part, so that its turn is taken.
    if (!seen && !deterministic) continue;
    send({h, q0, covers, 0}, true);
  }
  send({-1, 0, 0, 0}, false);
}

// ---- consumer pieces ----

// This thread's part of group g's dQ (64 rows x COLS columns of fp32 accumulators) into its
// staging tile: COLS / 32 boxes of [64][32] floats, the 16-byte chunk c of row r at c ^ (r % 8)
// (the 128-byte swizzle the dQ tensor map reads), so a warp's stores meet no bank twice per
// chunk.
template <int COLS>
__device__ __forceinline__ void stage_dq(float* tile, const float (&dq)[COLS / 2], int warp,
                                         int lane) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + lane / 4 + 8 * half;
#pragma unroll
    for (int nt = 0; nt < COLS / 8; ++nt) {
      const int col = nt * 8 + (lane % 4) * 2;
      const int box = col / 32, c = col % 32;
      float* at = tile + box * 64 * 32 + r * 32 + (((c / 4) ^ (r % 8)) * 4) + c % 4;
      *reinterpret_cast<float2*>(at) =
          make_float2(dq[4 * nt + 2 * half], dq[4 * nt + 2 * half + 1]);
    }
  }
}

// Deterministic mode: waits until this part's turn at its query tile's counter...
__device__ __forceinline__ void wait_turn(const int* counter, int turn) {
  while (true) {
    int now;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(now) : "l"(counter) : "memory");
    if (now == turn) break;
  }
  fence_async_global();  // the reduction below comes after the turn was seen
}
// ...and passes the turn on once the reduction is complete in global memory.
__device__ __forceinline__ void pass_turn(int* counter) {
  tma_store_wait_all();
  fence_async_global();
  __threadfence();
  atomicAdd(counter, 1);
}

// ---- dQ writer ----

// Whether consumer g staged nothing for a step: the mask hides its keys or, where the groups split
// dQ's columns or rows (each part sums over every key of the block), every group's keys.
template <int PLAN>
__device__ __forceinline__ bool dq_part_empty(int covers, int g) {
  constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  if constexpr (P.dq_reads_all_keys()) {
    for (int h = 0; h < P.consumer_groups(); ++h) {
      if (group_cover(covers, h) != Cover::hidden) return false;
    }
    return true;
  } else {
    return group_cover(covers, g) == Cover::hidden;
  }
}

// The counter and turn of consumer g's part of query tile (h, q0) in deterministic mode. With
// dQ's columns or rows split between the groups their parts never meet: a counter per group,
// turns key block by key block; otherwise one counter, turns key block by key block, then group
// by group.
template <int PLAN>
__device__ __forceinline__ int* turn_counter(const FlashParams& p, const KeyBlockTile& tile, int h,
                                             int q0, int g, int& turn) {
  constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  const int q_tiles = (p.seq_len + P.block_m - 1) / P.block_m;
  const int first_block = key_range(p, q0, min(q0 + P.block_m, p.seq_len)).x / P.block_n;
  const int blocks_before = tile.kv_block - first_block;
  const bool split = P.dq_reads_all_keys();
  turn = split ? blocks_before : blocks_before * P.consumer_groups() + g;
  const int64_t q_tile = (int64_t{tile.b} * p.q_heads + h) * q_tiles + q0 / P.block_m;
  return p.dq_semaphore + 2 * q_tile + (split ? g : 0);
}

// One thread of the producer warpgroup: per step, each consumer's staged dQ part into the dQ
// buffer by TMA reductions (in deterministic mode once it is the part's turn; a group that
// skipped the step staged nothing, and only passes its turn), then the staging tiles back to the
// consumers once the copy engine has read them. A record with no head ends.
template <int PLAN>
__device__ __forceinline__ void write_dq(const TmaBackwardArgs& a, const BackwardSmem<PLAN>& s) {
  constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  constexpr int kGroups = P.consumer_groups();
  const FlashParams& p = a.p;
  const bool deterministic = p.dq_semaphore != nullptr;
  // Group g's first column and row of the step's part: g * column0, q0 + g * row0.
  const int column0 = P.dq_splits_columns() ? P.dq_columns() : 0;
  const int row0 = P.dq_splits_rows() ? 64 : 0;
  const KeyBlockTile tile(p, (p.seq_len + P.block_n - 1) / P.block_n, a.groups);
  tma_prefetch_map(&a.dq);
  RingPosition<P.dq_slots()> ring;
  for (;;) {
    for (int g = 0; g < kGroups; ++g) {
      mbar_wait(s.dq_full(ring.slot, g), ring.parity);
      const StepInfo info = *s.dq_info(ring.slot, g);
      if (info.head < 0) {  // every group ends at the same step
        tma_store_wait_all();
        return;
      }
      const bool empty = dq_part_empty<PLAN>(info.covers, g);  // nothing staged
      if (empty && !deterministic) continue;
      int turn = 0;
      int* counter =
          deterministic ? turn_counter<PLAN>(p, tile, info.head, info.q0, g, turn) : nullptr;
      if (deterministic) wait_turn(counter, turn);
      if (empty) {
        pass_turn(counter);
        continue;
      }
      const float* staged = s.dq(ring.slot, g);
#pragma unroll
      for (int box = 0; box < P.dq_columns() / 32; ++box) {
        tma_reduce_add(&a.dq, staged + box * 64 * 32, g * column0 + box * 32, info.head,
                       info.q0 + g * row0, tile.b);
      }
      tma_store_commit();
      if (deterministic) pass_turn(counter);
    }
    tma_store_wait_read();
    for (int g = 0; g < kGroups; ++g) mbar_arrive(s.dq_empty(ring.slot, g));
    ring.advance();
  }
}

// The epilogue: group g's dK (scaled) and dV, bf16 (its columns [column0, + group_columns())),
// through its staging tiles (free by now: dK in one and dV in the other, or both in the one, as
// 64-row panels) and TMA stores, so that no consumer thread waits on scattered global stores
// (rows past the end are dropped by the copy engine).
template <int PLAN>
__device__ __forceinline__ void store_dk_dv(
    const TmaBackwardArgs& a, const BackwardSmem<PLAN>& s, int g, int key0, int column0,
    const KeyBlockTile& tile, const float (&dk)[kTmaBackwardPlans[PLAN].group_columns() / 2],
    const float (&dv)[kTmaBackwardPlans[PLAN].group_columns() / 2]) {
  constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  constexpr int D = P.group_columns(), DT = D / 8;
  constexpr int64_t kPartBytes = int64_t{64} * D * 2;  // dK or dV
  static_assert(2 * kPartBytes <= P.dq_slots() * P.dq_tile_bytes() &&
                    (P.dq_slots() == 1 || kPartBytes <= P.dq_tile_bytes()),
                "dK and dV fit the staging tiles");
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  auto* dk_tile = reinterpret_cast<__nv_bfloat16*>(s.dq(0, g));
  auto* dv_tile =
      P.dq_slots() == 2 ? reinterpret_cast<__nv_bfloat16*>(s.dq(1, g)) : dk_tile + 64 * D;
  const float scale = a.p.scale;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = warp * 16 + lane / 4 + 8 * half;
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int at = panel_offset<64>(r, dt * 8 + (lane % 4) * 2);
      *reinterpret_cast<uint32_t*>(dk_tile + at) =
          pack_bf16(dk[4 * dt + 2 * half] * scale, dk[4 * dt + 2 * half + 1] * scale);
      *reinterpret_cast<uint32_t*>(dv_tile + at) =
          pack_bf16(dv[4 * dt + 2 * half], dv[4 * dt + 2 * half + 1]);
    }
  }
  fence_async_shared();
  named_sync(kEpilogueBarrier + g, 128);
  if (tid == 0 && key0 < a.p.seq_len) {
#pragma unroll
    for (int panel = 0; panel < D / kPanel; ++panel) {
      const int col = column0 + panel * kPanel;
      tma_store(&a.dk, dk_tile + panel * 64 * kPanel, col, tile.hk, key0, tile.b);
      tma_store(&a.dv, dv_tile + panel * 64 * kPanel, col, tile.hk, key0, tile.b);
    }
    tma_store_commit();
    tma_store_wait_read();  // the block's shared memory outlives the copy engine's reads
  }
}

// ---- consumer ----

// Group g's side of its dQ staging tiles: wait until the writer has read the tile at dq_ring
// (its part of dq_slots() records ago)...
template <int PLAN, int SLOTS>
__device__ __forceinline__ void wait_dq_tile(const BackwardSmem<PLAN>& s,
                                             const RingPosition<SLOTS>& dq_ring, int g) {
  mbar_wait(s.dq_empty(dq_ring.slot, g), dq_ring.parity ^ 1);
}
// ...then hand the writer the record of what it holds (a staged part, an empty one, or the end)
// and move to the next tile.
template <int PLAN, int SLOTS>
__device__ __forceinline__ void post_dq_record(const BackwardSmem<PLAN>& s,
                                               RingPosition<SLOTS>& dq_ring, int g,
                                               const StepInfo& info, int tid, int lane) {
  if (tid == 0) *s.dq_info(dq_ring.slot, g) = info;
  __syncwarp();
  if (lane == 0) mbar_arrive(s.dq_full(dq_ring.slot, g));
  dq_ring.advance();
}

// After the last step: the writer's end record, and every staging tile free (the writer has
// read the last parts from them; the end record's tile holds nothing it reads).
template <int PLAN, int SLOTS>
__device__ __forceinline__ void finish_dq_records(const BackwardSmem<PLAN>& s,
                                                  RingPosition<SLOTS>& dq_ring, int g, int tid,
                                                  int lane) {
  wait_dq_tile(s, dq_ring, g);
  post_dq_record(s, dq_ring, g, {-1, 0, 0, 0}, tid, lane);
  if constexpr (SLOTS == 2) wait_dq_tile(s, dq_ring, g);
}

// The warp's query columns [16 kq, + 16) of dS^T (a register operand: acc_to_a's layout, this
// thread's rows key_row and key_row + 8) into a step's dS^T buffer ([BN keys][BM queries]), as
// one stmatrix (fragment_layout.h: the row each lane addresses). (Four 32-bit stores a thread
// before: 16 a step.)
template <int BN>
__device__ __forceinline__ void store_ds_part(__nv_bfloat16* tile, const uint32_t (&a)[4], int kq,
                                              int key_row, int lane) {
  const FragmentRow at = stmatrix_x4_row(lane);
  const int row = key_row - lane / 4 + at.row;  // the warp's first row, then the lane's
  stmatrix_x4(smem_addr(tile + panel_offset<BN>(row, kq * 16 + at.col)), a);
}

// dQ (64 of the step's queries x the head dim's 64-column panel `panel`) = dS K over KEYS of the
// block's BN keys from key0: dS^T (this step's buffer, from the queries' panel) read as an
// MN-major A (rows = keys), K MN-major.
template <int BN, int KEYS>
__device__ __forceinline__ void issue_dq(float (&dq)[32], uint64_t ds_step, uint64_t k_desc,
                                         int panel, int key0) {
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; ++kk) {
    const int key = key0 + kk * 16;
    mma_ss<64, 1, 1>(dq, advance(ds_step, key * kPanelRowBytes),
                     advance(k_desc, (panel * BN + key) * kPanelRowBytes), kk > 0);
  }
}

template <int PLAN, bool SEG>
__device__ __forceinline__ void consume(const TmaBackwardArgs& a, const BackwardSmem<PLAN>& s,
                                        int g) {
  constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  constexpr int D = P.head_dim, BM = P.block_m, BN = P.block_n, QT = BM / 8, DT = D / 8;
  constexpr int kGroups = P.consumer_groups();
  static_assert(P.head_parts() == 1, "plans that split the head dim run consume_head_part");
  static_assert(!P.dq_reads_all_keys() || kGroups == 2, "dQ's columns or rows split in two");
  static_assert(!P.dq_splits_rows() || BM == 64 * kGroups, "a 64-row dQ part per group");
  // Whether this group's dQ part reads every group's dS^T (dQ split by columns or rows), or only
  // its own keys'.
  constexpr bool kDqAllKeys = P.dq_reads_all_keys();
  constexpr int kDqKeys = kDqAllKeys ? BN : 64;
  constexpr uint32_t kStageBytes = BM * D * 2;
  constexpr uint32_t kDsBytes = BN * BM * 2;
  const FlashParams& p = a.p;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const KeyBlockTile tile(p, (p.seq_len + BN - 1) / BN, a.groups);
  const int b = tile.b, S = p.seq_len;
  const KeyBlockSteps steps(p, tile, BM, BN);
  const int k0 = steps.k0;

  // This group's keys start at key_base; this thread's accumulator rows are key_row and
  // key_row + 8.
  const int key_base = g * 64;
  const int key_row = key_base + warp * 16 + lane / 4;
  // Descriptors: this group's K and V rows (K-major); the slot-0 Q and dO tiles (K-major for S^T
  // and dP^T, MN-major for dK and dV); dS^T (buffer 0; where dQ splits rows, the panel of this
  // group's 64 queries) and K as the MN-major operands of dQ.
  const uint64_t k_rows = desc(smem_addr(s.k()) + key_base * kPanelRowBytes, 0);
  const uint64_t v_rows = desc(smem_addr(s.v()) + key_base * kPanelRowBytes, 0);
  const uint64_t q_desc = desc(smem_addr(s.q(0)), 0);
  const uint64_t q_mn = desc(smem_addr(s.q(0)), BM * kPanelRowBytes);
  const uint64_t do_desc = desc(smem_addr(s.dout(0)), 0);
  const uint64_t do_mn = desc(smem_addr(s.dout(0)), BM * kPanelRowBytes);
  const int dq_queries = P.dq_splits_rows() ? g : 0;  // the dS^T panel of this group's part
  const uint64_t ds_desc = desc(smem_addr(s.ds(0)) + dq_queries * BN * kPanelRowBytes, 0);
  const uint64_t k_desc = desc(smem_addr(s.k()), 0);
  const int dq_panel = P.dq_splits_columns() ? g : 0;  // the head dim's panel of this part
  const int dq_key0 = kDqAllKeys ? 0 : key_base;

  const int32_t* seg_row = SEG ? p.segment_ids + int64_t{b} * S : nullptr;
  const SegmentChunk* chunk_row =
      SEG ? p.segment_chunks + int64_t{b} * p.chunks_per_row() : nullptr;
  int kid[2];  // this thread's two keys' segment ids
  backward_step::key_segment_ids<SEG>(seg_row, k0, key_row, S, kid);

  float dk[DT * 4], dv[DT * 4];
#pragma unroll
  for (int i = 0; i < DT * 4; ++i) dk[i] = dv[i] = 0.0f;

  mbar_wait(s.kv_full(), 0);
  RingPosition<P.stages> ring;
  RingPosition<P.dq_slots()> dq_ring;  // the staging tiles
  for (int local = 0;; ++local) {
    mbar_wait(s.full(ring.slot), ring.parity);
    const StepInfo info = *s.info(ring.slot);
    if (info.head < 0) break;
    const int stage = ring.slot, q0 = info.q0;
    const Cover cover = group_cover(info.covers, g);
    if (cover == Cover::hidden) {
      // The mask hides this group's keys from the step's queries: none of its products, and the
      // slot is read at once. Where the groups split dQ's columns or rows and the other group's
      // keys are seen, its rows of dS^T are zeros (the other group's dQ part reads them) and it
      // makes its part of dQ over the other group's keys; otherwise it hands the writer an empty
      // record (the writer skips the part, or in deterministic mode passes its turn).
      mbar_arrive(s.empty(stage));
      ring.advance();
      wait_dq_tile(s, dq_ring, g);
      const bool dq_part = kDqAllKeys && group_cover(info.covers, 1 - g) != Cover::hidden;
      __nv_bfloat16* ds_tile = s.ds(local & 1);
      if (dq_part) {
        const uint32_t zeros[4] = {0u, 0u, 0u, 0u};
#pragma unroll
        for (int kq = 0; kq < BM / 16; ++kq) store_ds_part<BN>(ds_tile, zeros, kq, key_row, lane);
        fence_async_shared();
      }
      // Where the groups split dQ both pass the dS^T barrier at every step, also one that hides
      // both (deterministic mode): no group may store a dS^T buffer before the other's dQ
      // products of two steps before, which read it, are done.
      if constexpr (kDqAllKeys) ds_stored_split();
      if (dq_part) {
        float dq[32];
        wg_fence();
        issue_dq<BN, 64>(dq, advance(ds_desc, (local & 1) * kDsBytes), k_desc, dq_panel,
                         (1 - g) * 64);
        wg_commit();
        wg_wait<0>();
        pin(dq);
        stage_dq<64>(s.dq(dq_ring.slot, g), dq, warp, lane);
        fence_async_shared();
      }
      post_dq_record(s, dq_ring, g, info, tid, lane);
      continue;
    }
    const bool partial = cover == Cover::partial;
    const uint64_t q_stage = advance(q_desc, stage * kStageBytes);
    const uint64_t do_stage = advance(do_desc, stage * kStageBytes);

    // S^T = K Q^T, then dP^T = V dO^T, in two groups: P^T is computed while dP^T runs. Rows =
    // this group's keys, columns = the step's queries; all four operands K-major.
    float st[QT * 4], dpt[QT * 4];
    pin(dk);
    pin(dv);
    const float* lse_t = s.lse(stage);
    const float* dsum_t = s.dsum(stage);
    const backward_step::StepRows rows{lse_t, dsum_t, q0, k0, key_row, lane, S, partial};
    backward_step::RowValues<BM> values;
    // Early not with segment ids: their masked steps keep more live, and the early values
    // spilled (ptxas: 412 bytes against 212; window + documents 4.27 -> 5.21 ms, b7 in PERF.md).
    using backward_step::RowReads;
    constexpr RowReads kReads = P.reads_rows_early() && !SEG ? RowReads::early : RowReads::between;
    if constexpr (kReads == RowReads::early) backward_step::read_row_values<BM, true>(rows, values);
    backward_step::issue_score_products<BM, BN, D>(st, dpt, k_rows, v_rows, q_stage, do_stage, [&] {
      if constexpr (kReads == RowReads::between) backward_step::read_lse<BM, true>(rows, values);
    });
    backward_step::probabilities_and_ds<BM, SEG, true, kReads>(st, dpt, p, rows, values, chunk_row,
                                                               seg_row, kid);

    // P^T and dS^T as register operands; dS^T also into this step's buffer ([key][query], one
    // panel) for dQ.
    const int ds_buffer = local & 1;
    __nv_bfloat16* ds_tile = s.ds(ds_buffer);
    uint32_t ap[BM / 16][4], ads[BM / 16][4];
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      acc_to_a(ap[kq], st, kq);
      acc_to_a(ads[kq], dpt, kq);
      store_ds_part<BN>(ds_tile, ads[kq], kq, key_row, lane);
    }
    fence_async_shared();
    // The dS^T that this group's dQ reads is stored. (The other buffer was last read by the dQ
    // products of the step before, which each group finished before it stored this step's dS^T.)
    if constexpr (kDqAllKeys) {
      ds_stored_split();
    } else {
      ds_stored<false>(g, kGroups);
    }

    // dQ (queries x 64 columns) = dS K over the keys that some group sees (issue_dq); then
    // dV += P^T dO and dK += dS^T Q (left operand from registers, dO and Q MN-major).
    float dq[32];
    pin(ap);
    pin(ads);
    const uint64_t ds_step = advance(ds_desc, ds_buffer * kDsBytes);
    wg_fence();
    issue_dq<BN, kDqKeys>(dq, ds_step, k_desc, dq_panel, dq_key0);
    wg_commit();
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      const uint32_t row_off = kq * 16 * kPanelRowBytes;
      mma_rs<D, 1>(dv, ap[kq], advance(do_mn, stage * kStageBytes + row_off));
      mma_rs<D, 1>(dk, ads[kq], advance(q_mn, stage * kStageBytes + row_off));
    }
    wg_commit();
    wg_wait<1>();
    pin(dq);

    // The dQ part into this step's staging tile, for the writer thread, once the copy engine
    // has read the tile's last part. It is handed over once dV and dK are done: by then the
    // stores have drained, and the fence that orders them before the copy engine's reads
    // costs little (right after them it waited for every store: b6 profiles, 4-5% of samples).
    wait_dq_tile(s, dq_ring, g);
    stage_dq<64>(s.dq(dq_ring.slot, g), dq, warp, lane);

    wg_wait<0>();
    pin(dv);
    pin(dk);
    pin(ap);
    pin(ads);
    fence_async_shared();
    post_dq_record(s, dq_ring, g, info, tid, lane);
    // The slot's Q, dO, lse and D are read: the producer may refill it. Every thread arrives
    // (its own reads of lse and D are then ordered before the producer's rewrite).
    mbar_arrive(s.empty(stage));
    ring.advance();
  }
  finish_dq_records(s, dq_ring, g, tid, lane);
  store_dk_dv<PLAN>(a, s, g, k0 + key_base, 0, tile, dk, dv);
}

// Columns [col0, col0 + N) of a [64 keys][BM queries] bf16 tile (one panel) from this thread's
// accumulator of 64 keys x N queries: one stmatrix per 16 columns, as in store_ds_part.
template <int BM, int N>
__device__ __forceinline__ void store_key_rows(__nv_bfloat16* tile, const float (&acc)[N / 2],
                                               int key_row, int col0, int lane) {
  static_assert(N % 16 == 0, "whole 16-column steps");
  const FragmentRow at = stmatrix_x4_row(lane);
  const int row = key_row - lane / 4 + at.row;
#pragma unroll
  for (int j = 0; j < N / 16; ++j) {
    const uint32_t frag[4] = {
        pack_bf16(acc[8 * j], acc[8 * j + 1]), pack_bf16(acc[8 * j + 2], acc[8 * j + 3]),
        pack_bf16(acc[8 * j + 4], acc[8 * j + 5]), pack_bf16(acc[8 * j + 6], acc[8 * j + 7])};
    stmatrix_x4(smem_addr(tile + panel_offset<BM>(row, col0 + j * 16 + at.col)), frag);
  }
}

// A consumer of a plan that splits the head dim (head dim 256): the groups share the block's 64
// keys, and group g is part g of the head dim. Per step it computes S^T and dP^T for its share
// of the step's queries (group_queries() of them, from query0), makes P^T and dS^T of them and
// stores both into shared memory; once every part is there, dV += P^T dO and dK += dS^T Q for
// its columns of the head dim (group_columns() of them, from column0) over all of the step's
// queries, with both operands from shared memory, and its columns of dQ = dS K over the block's
// keys, handed to the writer as in consume().
template <int PLAN, bool SEG>
__device__ __forceinline__ void consume_head_part(const TmaBackwardArgs& a,
                                                  const BackwardSmem<PLAN>& s, int g) {
  constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  constexpr int D = P.head_dim, BM = P.block_m, BN = P.block_n, kGroups = P.consumer_groups();
  constexpr int QN = P.group_queries(), QT = QN / 8, kColumns = P.group_columns();
  static_assert(P.key_groups() == 1 && BN == 64 && P.dq_columns() == kColumns,
                "the parts share one block of 64 keys and split dQ's columns as dK's");
  constexpr uint32_t kStageBytes = BM * D * 2;
  constexpr uint32_t kScoreBytes = BN * BM * 2;
  const FlashParams& p = a.p;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32;
  const KeyBlockTile tile(p, (p.seq_len + BN - 1) / BN, a.groups);
  const int b = tile.b, S = p.seq_len;
  const KeyBlockSteps steps(p, tile, BM, BN);
  const int k0 = steps.k0;
  const int key_row = warp * 16 + lane / 4;  // this thread's accumulator rows: + 0 and + 8
  const int query0 = g * QN, column0 = g * kColumns, panel0 = column0 / kPanel;

  // Descriptors: K and V (K-major, for S^T and dP^T); this part's queries of the slot-0 Q and dO
  // tiles (K-major); Q, dO and K from this part's first column panel (MN-major, for dK, dV and
  // dQ); P^T and dS^T of buffer 0 (K-major for dV and dK; dS^T read MN-major for dQ).
  const uint64_t k_rows = desc(smem_addr(s.k()), 0);
  const uint64_t v_rows = desc(smem_addr(s.v()), 0);
  const uint64_t q_part = desc(smem_addr(s.q(0)) + query0 * kPanelRowBytes, 0);
  const uint64_t do_part = desc(smem_addr(s.dout(0)) + query0 * kPanelRowBytes, 0);
  const uint64_t q_mn = desc(smem_addr(s.q(0)) + panel0 * BM * kPanelRowBytes, BM * kPanelRowBytes);
  const uint64_t do_mn =
      desc(smem_addr(s.dout(0)) + panel0 * BM * kPanelRowBytes, BM * kPanelRowBytes);
  const uint64_t k_mn = desc(smem_addr(s.k()) + panel0 * BN * kPanelRowBytes, BN * kPanelRowBytes);
  const uint64_t pt_desc = desc(smem_addr(s.pt(0)), 0);
  const uint64_t ds_desc = desc(smem_addr(s.ds(0)), 0);

  const int32_t* seg_row = SEG ? p.segment_ids + int64_t{b} * S : nullptr;
  const SegmentChunk* chunk_row =
      SEG ? p.segment_chunks + int64_t{b} * p.chunks_per_row() : nullptr;
  int kid[2];  // this thread's two keys' segment ids
  backward_step::key_segment_ids<SEG>(seg_row, k0, key_row, S, kid);

  float dk[kColumns / 2], dv[kColumns / 2];
#pragma unroll
  for (int i = 0; i < kColumns / 2; ++i) dk[i] = dv[i] = 0.0f;

  mbar_wait(s.kv_full(), 0);
  RingPosition<P.stages> ring;
  RingPosition<P.dq_slots()> dq_ring;  // the staging tiles
  for (int local = 0;; ++local) {
    mbar_wait(s.full(ring.slot), ring.parity);
    const StepInfo info = *s.info(ring.slot);
    if (info.head < 0) break;
    // (No part is ever hidden alone: the producer sends a step that hides the block's keys, in
    // deterministic mode, as cut, and the parts compute its zeros.)
    const int stage = ring.slot;
    const bool partial = group_cover(info.covers, g) != Cover::full;

    float st[QT * 4], dpt[QT * 4];
    pin(dk);
    pin(dv);
    const backward_step::StepRows rows{s.lse(stage) + query0,
                                       s.dsum(stage) + query0,
                                       info.q0 + query0,
                                       k0,
                                       key_row,
                                       lane,
                                       S,
                                       partial};
    backward_step::RowValues<QN> values;
    using backward_step::RowReads;  // as in consume()
    constexpr RowReads kReads = P.reads_rows_early() && !SEG ? RowReads::early : RowReads::between;
    if constexpr (kReads == RowReads::early) backward_step::read_row_values<QN, true>(rows, values);
    backward_step::issue_score_products<BM, BN, D, QN>(
        st, dpt, k_rows, v_rows, advance(q_part, stage * kStageBytes),
        advance(do_part, stage * kStageBytes), [&] {
          if constexpr (kReads == RowReads::between)
            backward_step::read_lse<QN, true>(rows, values);
        });
    backward_step::probabilities_and_ds<QN, SEG, true, kReads>(st, dpt, p, rows, values, chunk_row,
                                                               seg_row, kid);

    // This part's query columns of P^T and dS^T into this step's buffers; every part's must be
    // there before any product reads them. (The buffers of the step before were last read by
    // its products, which each group finished before it stored this step's part.)
    const int buffer = local & 1;
    store_key_rows<BM, QN>(s.pt(buffer), st, key_row, query0, lane);
    store_key_rows<BM, QN>(s.ds(buffer), dpt, key_row, query0, lane);
    fence_async_shared();
    ds_stored<true>(g, kGroups);

    // dV += P^T dO and dK += dS^T Q over the step's queries, then dQ (queries x this part's
    // columns) = dS K: dS^T read as an MN-major A (rows = keys), K MN-major. dV and dK are the
    // last to read the slot's Q and dO: with one slot, the producer reloads it under dQ.
    float dq[kColumns / 2];
    wg_fence();
    const uint64_t pt_step = advance(pt_desc, buffer * kScoreBytes);
    const uint64_t ds_step = advance(ds_desc, buffer * kScoreBytes);
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      const uint32_t rows_off = stage * kStageBytes + kq * 16 * kPanelRowBytes;
      mma_ss<kColumns, 0, 1>(dv, advance(pt_step, kq * 32), advance(do_mn, rows_off), true);
      mma_ss<kColumns, 0, 1>(dk, advance(ds_step, kq * 32), advance(q_mn, rows_off), true);
    }
    wg_commit();
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      mma_ss<kColumns, 1, 1>(dq, advance(ds_step, kk * 16 * kPanelRowBytes),
                             advance(k_mn, kk * 16 * kPanelRowBytes), kk > 0);
    }
    wg_commit();
    wg_wait<1>();
    pin(dv);
    pin(dk);
    // The slot's Q, dO, lse and D are read: the producer may refill it (every thread arrives,
    // as in consume()).
    mbar_arrive(s.empty(stage));
    ring.advance();

    // The dQ part into the staging tile once the writer has read the last one.
    wait_dq_tile(s, dq_ring, g);
    wg_wait<0>();
    pin(dq);
    stage_dq<kColumns>(s.dq(dq_ring.slot, g), dq, warp, lane);
    fence_async_shared();
    post_dq_record(s, dq_ring, g, info, tid, lane);
  }
  finish_dq_records(s, dq_ring, g, tid, lane);
  store_dk_dv<PLAN>(a, s, g, k0, column0, tile, dk, dv);
}

// ---- the kernel ----

template <int PLAN, bool SEG>
__global__ void __launch_bounds__(kTmaBackwardPlans[PLAN].threads(), 1)
    tma_backward_kernel(const __grid_constant__ TmaBackwardArgs args) {
#ifdef FT_HOPPER_ENABLED
  constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const BackwardSmem<PLAN> s{align_1024(smem_raw)};
  if (threadIdx.x == 0) {
    mbar_init(s.kv_full(), 1);
    for (int i = 0; i < P.stages; ++i) {
      mbar_init(s.full(i), 32);                          // every producer lane (lse and D)
      mbar_init(s.empty(i), 128 * P.consumer_groups());  // every consumer thread
    }
    for (int slot = 0; slot < P.dq_slots(); ++slot) {
      for (int g = 0; g < P.consumer_groups(); ++g) {
        mbar_init(s.dq_full(slot, g), 4);   // the group's warps
        mbar_init(s.dq_empty(slot, g), 1);  // the writer
      }
    }
    mbar_fence_init();
  }
  __syncthreads();
  const int warpgroup = __shfl_sync(0xffffffffu, static_cast<int>(threadIdx.x / 128), 0);
  if (warpgroup == 0) {
    release_registers<P.producer_registers(SEG)>();
    if (threadIdx.x < 32) produce<PLAN, SEG>(args, s);
    if (threadIdx.x == 32) write_dq<PLAN>(args, s);
  } else {
    claim_registers<P.consumer_registers(SEG)>();
    if constexpr (P.head_parts() > 1) {
      consume_head_part<PLAN, SEG>(args, s, warpgroup - 1);
    } else {
      consume<PLAN, SEG>(args, s, warpgroup - 1);
    }
  }
#else
  __trap();  // only compiled for sm_90a; can_implement refuses other devices
#endif
}

// ---- host ----

// Waves of blocks (one block per SM) that the last group of pairs holds at least (b14 in
// docs/PERF.md: 2 measured best of 0, 1 and 2).
constexpr int kTailWaves = 2;

// KeyBlockTile's groups: every pair in one in deterministic mode; otherwise as many pairs as the
// Q and dO they stream (each query head of a pair, the whole sequence) fit in half the L2, at
// least one, and a last group of at least kTailWaves waves of blocks.
inline PairGroups pair_groups(const FlashParams& p, int key_blocks) {
  const int pairs = p.kv_heads * p.batch;
  if (p.dq_semaphore != nullptr) return {pairs, 0};
  const int64_t pair_bytes = int64_t{2} * p.group() * p.seq_len * p.head_dim * 2;
  const int size = static_cast<int>(std::clamp<int64_t>(l2_bytes() / 2 / pair_bytes, 1, pairs));
  const int tail_pairs = std::max(1, (kTailWaves * sm_count() + key_blocks - 1) / key_blocks);
  const int full_groups = pairs > tail_pairs ? (pairs - tail_pairs) / size : 0;
  return {size, full_groups * size};
}

template <int PLAN>
void launch_tma_backward(const FlashParams& p, cudaStream_t stream) {
  constexpr TmaBackwardPlan P = kTmaBackwardPlans[PLAN];
  TmaBackwardArgs a;
  a.q = head_tensor_map(p.q, p.batch, p.seq_len, p.q_heads, P.head_dim, p.q_row, P.block_m);
  a.dout = head_tensor_map(p.dout, p.batch, p.seq_len, p.q_heads, P.head_dim,
                           int64_t{p.q_heads} * P.head_dim, P.block_m);
  a.k = head_tensor_map(p.k, p.batch, p.seq_len, p.kv_heads, P.head_dim, p.k_row, P.block_n);
  a.v = head_tensor_map(p.v, p.batch, p.seq_len, p.kv_heads, P.head_dim, p.v_row, P.block_n);
  a.dq = dq_tensor_map(p.dq_accum, p.batch, p.seq_len, p.q_heads, P.head_dim);
  a.dk = head_tensor_map(p.dk, p.batch, p.seq_len, p.kv_heads, P.head_dim, p.dk_row, 64);
  a.dv = head_tensor_map(p.dv, p.batch, p.seq_len, p.kv_heads, P.head_dim, p.dv_row, 64);
  a.p = p;
  a.groups = pair_groups(p, (p.seq_len + P.block_n - 1) / P.block_n);
  auto kernel =
      p.segment_ids != nullptr ? tma_backward_kernel<PLAN, true> : tma_backward_kernel<PLAN, false>;
  // One block per (key block, kv head, batch row), in KeyBlockTile's order.
  const int key_blocks = (p.seq_len + P.block_n - 1) / P.block_n;
  const dim3 grid(key_blocks * p.kv_heads * p.batch);
  launch_with_smem(kernel, grid, P.threads(), static_cast<int>(P.smem_bytes()), stream, a);
}

}  // namespace tma_bwd_detail

// Adds the compiled backward plans of head dim D to the table.
template <int D, int I = 0>
void add_tma_backward_kernels(Bf16Kernels& k) {
  if constexpr (I < kTmaBackwardPlanCount) {
    constexpr TmaBackwardPlan P = kTmaBackwardPlans[I];
    if constexpr (P.head_dim == D && tma_plan_compiled(P)) {
      k.backward.push_back({D, TileConfig{P.block_m, P.block_n, P.threads()}, BackwardPath::tma,
                            &tma_bwd_detail::launch_tma_backward<I>, P.stages});
    }
    add_tma_backward_kernels<D, I + 1>(k);
  }
}

}  // namespace ft::attention::cuda

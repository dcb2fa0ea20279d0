// Tile plans of the TMA forward and backward kernels (sm90, bf16, flash_tma_forward.cuh and
// flash_tma_backward.cuh): the one list that
// the kernels instantiate, kernel_config.cpp judges (can_implement, the compiled set, shared
// memory) and the sweep draws its candidates from. Plain constexpr C++ (no CUDA), so that the
// CPU build and the tests read the same plans; the static_asserts below tie each plan to what
// the kernel can hold (shared memory, registers, warpgroup layout).
//
// A block is one producer warpgroup (one warp issues the copies) and block_m / 64 consumer
// warpgroups, 64 query rows each. Q comes through a ring of two slots when they fit (the next
// work tile's Q loads during this one), else one; the output tile is written over its own Q
// slot and leaves by TMA stores. K streams through a ring of `stages` slots of block_n keys,
// V through one of `stages + extra_v`. With `pingpong` the consumer warpgroups take turns issuing
// their products, so that one group's softmax runs while another's products use the tensor cores.
//
// A plan of two or three consumer groups runs one block per SM. A plan of one group (64 query
// rows) runs as many blocks per SM as shared memory and registers allow (two or three): each
// block's work tiles start and end on their own, so one block's first and last key tiles (a
// product without the softmax beside it) and its epilogue run while another block is in the
// middle of its tiles. Short work tiles (sliding windows, documents, short sequences) pay those
// ramps often; a 64-row tile also covers a window's or a document's edge more tightly.
//
// A plan of two heads a work tile (`heads` = 2, 64 query rows) gives its two consumer groups the
// same 64 positions of two query heads of one GQA group: they read the same K and V tiles, so a
// 64-row tile's tight cover comes with the 128-row tile's K/V traffic (one stream for two heads),
// and one block an SM has room for a deeper K/V ring (four stages) than two one-group blocks
// have; the groups take turns or not (`pingpong`). It needs query heads per kv head in pairs.
#pragma once

#include <cstdint>

namespace ft::attention {

// Shared memory per block with the opt-in on sm90 (kernel_config.cpp's architecture table
// asserts the same value), and per SM: blocks that share an SM also leave 1 KB each to the
// system.
inline constexpr int64_t kSm90SmemPerBlock = 232448;
inline constexpr int64_t kSm90SmemPerSm = 233472;
inline constexpr int64_t kSm90SmemReservedPerBlock = 1024;
// Blocks of one SM (one-group plans): at most this many.
inline constexpr int kTmaMaxBlocksPerSm = 3;
// Registers of one SM, shared by the block's warpgroups (one block per SM).
inline constexpr int kSm90RegistersPerSm = 65536;
// With segment ids the producer classifies up to this many key tiles of a query tile into a
// shared-memory table (two of them, for the current and the next query tile); longer rows are
// classified tile by tile.
inline constexpr int kTmaTileTable = 256;

struct TmaForwardPlan {
  int head_dim = 0;
  int block_m = 0;  // query rows: 64 per consumer warpgroup
  int block_n = 0;  // key rows per ring slot
  int stages = 0;   // ring slots of K and of V
  bool pingpong = false;
  bool compiled_by_default = false;  // also built without -DFLASHTRAIN_SWEEP_KERNELS=ON
  int heads = 1;  // query heads of a work tile (2: one a consumer group, the same positions)
  // V slots beyond K's: V_j is read one step after K_j (by P_j V_j, issued beside S_{j+1}) and
  // its slot frees one step later, so with as many V slots as K slots its copy has about one
  // step to land where K's has two; each extra slot gives it one step more. A property of the
  // plan, not a knob of its configuration text: plans that differ only in it count as the same
  // plan (operator==, tma_plans_distinct), so a configuration names one of them.
  int extra_v = 0;

  constexpr int consumer_groups() const { return heads * block_m / 64; }
  constexpr int threads() const { return 128 * (consumer_groups() + 1); }
  // Rows of a Q slot (and of the output staged in it): 64 per consumer group.
  constexpr int q_rows() const { return 64 * consumer_groups(); }
  // Where consumer group g's rows start among the work tile's positions, and its query head
  // after the tile's first.
  constexpr int group_row(int g) const { return heads == 1 ? 64 * g : 0; }
  constexpr int group_head(int g) const { return heads == 1 ? 0 : g; }

  constexpr int64_t tile_bytes(int rows) const { return int64_t{rows} * head_dim * 2; }
  constexpr int v_stages() const { return stages + extra_v; }
  constexpr int64_t ring_bytes() const { return (stages + v_stages()) * tile_bytes(block_n); }
  // The two segment tables (a cover byte and a key segment id per key tile) and the mbarriers.
  static constexpr int64_t table_bytes_for(int tiles) { return 2 * int64_t{tiles} * 5; }
  static constexpr int64_t barrier_bytes() { return 256; }
  static constexpr int64_t align_slack() { return 1024; }
  // Key tiles a segment table holds: kTmaTileTable, or half that where the full tables would not
  // fit beside one Q slot and the ring (head dim 256 with 80-key tiles), or where half tables
  // are what lets a second Q slot fit (head dim 128 with a third V slot); work tiles with more
  // key tiles are classified tile by tile.
  constexpr int table_tiles() const {
    const int64_t rest = ring_bytes() + barrier_bytes() + align_slack();
    const int64_t full = rest + table_bytes_for(kTmaTileTable);
    const int64_t half = rest + table_bytes_for(kTmaTileTable / 2);
    const int64_t q = tile_bytes(q_rows());
    if (full + q > kSm90SmemPerBlock) return kTmaTileTable / 2;
    if (full + 2 * q > kSm90SmemPerBlock && half + 2 * q <= kSm90SmemPerBlock) {
      return kTmaTileTable / 2;
    }
    return kTmaTileTable;
  }
  constexpr int64_t table_bytes() const { return table_bytes_for(table_tiles()); }
  constexpr int64_t bytes_with_q_slots(int slots) const {
    return slots * tile_bytes(q_rows()) + ring_bytes() + table_bytes() + barrier_bytes() +
           align_slack();
  }

  // ---- blocks per SM, and what each block may take ----
  // Shared memory one of `blocks` blocks of an SM may take.
  static constexpr int64_t smem_limit(int blocks) {
    const int64_t share = kSm90SmemPerSm / blocks - kSm90SmemReservedPerBlock;
    return share < kSm90SmemPerBlock ? share : kSm90SmemPerBlock;
  }
  constexpr int q_slots_for(int blocks) const {
    return bytes_with_q_slots(2) <= smem_limit(blocks) ? 2 : 1;
  }
  // setmaxnreg: the producer keeps few registers, the consumers take the rest of the block's
  // share of the register file; the launch gives every thread launch_registers() (the kernel's
  // register count under __launch_bounds__).
  constexpr int launch_registers_for(int blocks) const {
    const int r = (kSm90RegistersPerSm / (threads() * blocks)) / 8 * 8;
    return r > 255 ? 248 : r;
  }
  // With segment ids the producer classifies key tiles, which spills below 56 registers (a few
  // words, outside the consumers' loop); three consumer groups, or three blocks an SM, leave it
  // less. Without them it only walks key ranges and copies, in 24.
  constexpr int producer_registers_for(int blocks, bool segments) const {
    if (!segments) return 24;
    if (consumer_groups() == 3) return 32;
    return blocks >= 3 ? 40 : 56;
  }
  constexpr int consumer_registers_for(int blocks, bool segments) const {
    const int r = ((launch_registers_for(blocks) * threads() -
                    128 * producer_registers_for(blocks, segments)) /
                   (128 * consumer_groups())) /
                  8 * 8;
    return r > 256 ? 256 : r;
  }
  // S (block_n / 2 floats), P (block_n / 4 words) and O (head_dim / 2 floats) live at once,
  // with about 32 registers of addresses, row state and loop counters.
  constexpr int accumulator_registers() const {
    return block_n / 2 + block_n / 4 + head_dim / 2 + 32;
  }
  // A consumer group's 64 rows of Q as the scores' left operand in registers (head_dim / 4 a
  // thread, loaded once a work tile), where they fit beside the accumulators: S = Q K^T then
  // reads only K from shared memory.
  constexpr int q_registers() const { return head_dim / 4; }
  constexpr bool fits(int blocks) const {
    return bytes_with_q_slots(q_slots_for(blocks)) <= smem_limit(blocks) &&
           accumulator_registers() <= consumer_registers_for(blocks, true);
  }
  // One block per SM with two or more consumer groups; with one, the most that fit (1 when
  // none does: tma_plan_defect then refuses the plan).
  constexpr int blocks_per_sm() const {
    if (consumer_groups() > 1) return 1;
    for (int b = kTmaMaxBlocksPerSm; b > 1; --b) {
      if (fits(b)) return b;
    }
    return 1;
  }
  constexpr int q_slots() const { return q_slots_for(blocks_per_sm()); }
  constexpr int64_t smem_bytes() const { return bytes_with_q_slots(q_slots()); }
  constexpr int launch_registers() const { return launch_registers_for(blocks_per_sm()); }
  constexpr int producer_registers(bool segments) const {
    return producer_registers_for(blocks_per_sm(), segments);
  }
  constexpr int consumer_registers(bool segments) const {
    return consumer_registers_for(blocks_per_sm(), segments);
  }
  constexpr bool q_in_registers(bool segments) const {
    return accumulator_registers() + q_registers() <= consumer_registers(segments);
  }

  constexpr bool operator==(const TmaForwardPlan& o) const {
    return head_dim == o.head_dim && block_m == o.block_m && block_n == o.block_n &&
           stages == o.stages && pingpong == o.pingpong && heads == o.heads;
  }
};

// Every plan of the family. FlashAttention-3 runs 192x128 tiles (three consumer warpgroups) at
// head dim 64, 128x128 at 128 and 128x80 at 256; the sweep decides ours (docs/SWEEP.md) and the
// sm90 rows of the default table (kernel_config.cpp) name the winners.
// {head_dim, block_m, block_n, stages, pingpong, compiled_by_default[, heads[, extra_v]]}
inline constexpr TmaForwardPlan kTmaForwardPlans[] = {
    {64, 128, 128, 2, true, true, 1, 1},
    {64, 128, 64, 2, true, false},
    {64, 128, 128, 3, true, false},
    {64, 128, 128, 2, false, false},
    {64, 192, 128, 2, true, true, 1, 1},
    {64, 192, 64, 2, true, false},
    {128, 128, 128, 2, true, true, 1, 1},
    {128, 128, 64, 2, true, false},
    // No turns at head dim 128: the sm90 default for dense masks (the hero causal forward: 0.9%
    // faster than the turns plan on the H200 in alternating rounds, a tie on an H100; PERF.md).
    {128, 128, 128, 2, false, true},
    {128, 128, 64, 3, true, false},
    {128, 192, 64, 2, true, false},
    {256, 128, 64, 2, true, true},
    {256, 128, 64, 2, false, false},
    // 80-key tiles (FlashAttention-3's at head dim 256): the S product's shared-memory reads per
    // FLOP fall (Q's 64 x 16 operand read once per 80 keys, not per 64), which the 64-key plan
    // spends all of sm90's 128 bytes a cycle on at the tensor cores' peak.
    {256, 128, 80, 2, true, true},
    // One K and one V slot, so that two Q slots fit at head dim 256: the next work tile's Q
    // loads while this one runs, and K_{j+1} loads only once S_j has read K_j (26% slower than
    // s2 on the H200, 2026-12-05: a sweep candidate only).
    {256, 128, 64, 1, true, false},
    // One consumer group, several blocks per SM (blocks_per_sm(): 3, 2, 2). 64x128 lost to the
    // 128x128 plan at GPT-2's and llama3-1b's shapes (2026-12-05): a sweep candidate only.
    {64, 64, 64, 2, false, true},
    {64, 64, 128, 2, false, false},
    {128, 64, 64, 2, false, true},
    // Two heads a work tile (two consumer groups on the same 64 positions): slower than the
    // defaults at every shape measured (2026-12-05), sweep candidates only.
    {64, 64, 128, 2, true, false, 2},
    {128, 64, 128, 2, true, false, 2},
    {128, 64, 64, 2, true, false, 2},
    // Two heads, four ring stages, no turns: the sm90 default at head dim 128 with a window or
    // documents where query heads pair up (window 512 + 5 documents on an H100, 2026-12-06:
    // 1.424-1.449 ms in four calls against the one-head 64x64 plan's 1.473-1.493; with two
    // stages 1.55, with turns as fast as without).
    {128, 64, 64, 4, false, true, 2},
};
inline constexpr int kTmaForwardPlanCount =
    static_cast<int>(sizeof(kTmaForwardPlans) / sizeof(kTmaForwardPlans[0]));

// Why a plan cannot be built, or nullptr: the rules the kernel template also asserts.
constexpr const char* tma_plan_defect(const TmaForwardPlan& p) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return "head dim 64, 128 or 256";
  if (p.block_m != 64 && p.block_m != 128 && p.block_m != 192) {
    return "one, two or three consumer warpgroups";
  }
  if (p.heads != 1 && p.heads != 2) return "one or two heads a work tile";
  if (p.heads == 2 && p.block_m != 64) return "two heads a work tile of 64 rows";
  if (p.block_n != 64 && p.block_n != 128 && !(p.block_n == 80 && p.head_dim == 256)) {
    return "key tiles of 64 or 128 (80 at head dim 256)";
  }
  if (p.stages < 1 || p.stages > 4) return "1 to 4 stages";
  if (p.extra_v < 0 || p.v_stages() > 4) return "at most 4 V slots (stages + extra_v)";
  if (p.pingpong && p.consumer_groups() < 2) return "turns (pingpong) need two consumer groups";
  if (p.consumer_groups() == 1 && p.blocks_per_sm() < 2) {
    return "one consumer group needs two or more blocks per SM (shared memory, registers)";
  }
  if (p.smem_bytes() > TmaForwardPlan::smem_limit(p.blocks_per_sm())) {
    return "shared memory over sm90's limit";
  }
  if (p.accumulator_registers() > p.consumer_registers(true)) {
    return "accumulators exceed the consumer registers";
  }
  return nullptr;
}

constexpr bool all_tma_plans_valid() {
  for (const TmaForwardPlan& p : kTmaForwardPlans) {
    if (tma_plan_defect(p) != nullptr) return false;
  }
  return true;
}
static_assert(all_tma_plans_valid(), "a TMA forward plan breaks a kernel rule (tma_plan_defect)");

constexpr bool tma_plans_distinct() {
  for (int i = 0; i < kTmaForwardPlanCount; ++i) {
    for (int j = i + 1; j < kTmaForwardPlanCount; ++j) {
      if (kTmaForwardPlans[i] == kTmaForwardPlans[j]) return false;
    }
  }
  return true;
}
static_assert(tma_plans_distinct(), "a TMA forward plan is listed twice");

// ---- backward ----

// Tile plans of the TMA backward kernels (flash_tma_backward.cuh). A block owns block_n keys of
// one kv head (64 per consumer warpgroup: their dK and dV stay in registers) and walks the query
// tiles (block_m = 64 rows) of every query head of the group that can see them. A producer warp
// streams Q, dO, lse and D through a ring of `stages` slots; dS^T goes through shared memory
// (two buffers) for dQ = dS K, and each consumer's dQ part leaves through its own fp32 staging
// tile by TMA reductions into the dQ buffer (two staging buffers when they fit, so the next
// step's part is written while the last one is read).
//
// Over head dim 128 the dK and dV of 64 keys (head_dim floats a thread) no longer fit one
// warpgroup, so the head dim is split in `head_parts()`: that many consumer groups share the
// same 64 keys, each holding its columns of dK, dV and dQ and computing S^T and dP^T for its
// share of the step's queries; P^T and dS^T meet in shared memory (FlashAttention-3's layout
// at head dim 256).
//
// Steps of 128 queries (two groups of 64 keys; FlashAttention-3's plan at head dim 64): S^T and
// dP^T are 64 keys x 128 queries a group, and dQ is split by query rows: group g adds rows
// [64 g, + 64) of the step over all 128 keys, reading both groups' dS^T from shared memory. A
// step's dQ is then 128 x 64 floats for 128 x 128 pairs (2 bytes a pair) where 64-query steps
// stage 4, and each product's B operand is twice as wide (fewer shared-memory bytes a FLOP).
struct TmaBackwardPlan {
  int head_dim = 0;
  int block_m = 0;  // query rows of a step: 64, or 128 (two groups, dQ split by rows)
  int block_n = 0;  // keys of a block: 64 per consumer warpgroup, two or three groups
  int stages = 0;   // ring slots of Q, dO, lse and D
  bool compiled_by_default = false;

  constexpr int head_parts() const { return head_dim > 128 ? 2 : 1; }
  constexpr int key_groups() const { return block_n / 64; }  // groups with their own 64 keys
  constexpr int consumer_groups() const { return key_groups() * head_parts(); }
  constexpr int threads() const { return 128 * (consumer_groups() + 1); }
  // The head dim's columns of dK and dV that one group holds, and its share of a step's queries
  // in S^T and dP^T.
  constexpr int group_columns() const { return head_dim / head_parts(); }
  constexpr int group_queries() const { return block_m / head_parts(); }
  // dQ = dS K, in parts of 64 query rows: where the step has a 64-row part per consumer (128
  // queries, two groups), group g takes rows [64 g, + 64) over all the block's keys; where the
  // head dim splits into one part per consumer (a 64-column panel each at head dim 128, two
  // panels each at 256), each takes its columns over all the block's keys; otherwise each adds
  // its own keys' part over every column.
  constexpr bool dq_splits_rows() const { return block_m > 64; }
  constexpr bool dq_splits_columns() const {
    return !dq_splits_rows() && (head_parts() > 1 || head_dim == 64 * consumer_groups());
  }
  // Whether a group's dQ part reads every group's dS^T (and so waits for all of them).
  constexpr bool dq_reads_all_keys() const { return dq_splits_rows() || dq_splits_columns(); }
  constexpr int dq_columns() const {
    return dq_splits_columns() ? head_dim / consumer_groups() : head_dim;
  }

  constexpr int64_t tile_bytes(int rows) const { return int64_t{rows} * head_dim * 2; }
  constexpr int64_t kv_bytes() const { return 2 * tile_bytes(block_n); }
  // Q and dO (bf16), lse and D (fp32) per slot.
  constexpr int64_t stage_bytes() const { return 2 * tile_bytes(block_m) + 8 * block_m; }
  // dS^T in two buffers (alternating by step), and P^T beside it where the head dim is split.
  constexpr int64_t ds_bytes() const {
    return 2 * int64_t{block_n} * block_m * 2 * (head_parts() > 1 ? 2 : 1);
  }
  // One consumer's fp32 dQ part (64 query rows).
  constexpr int64_t dq_tile_bytes() const { return int64_t{64} * dq_columns() * 4; }
  // The mbarriers (K and V; full and empty per ring slot; full and empty per dQ staging tile)
  // and the step records (one per ring slot, one per staging tile), in 128-byte units, counted
  // for two staging tiles per consumer (enough for one).
  constexpr int64_t barrier_bytes() const {
    const int64_t bytes =
        8 * (1 + 2 * stages + 4 * consumer_groups()) + 16 * (stages + 2 * consumer_groups());
    return (bytes + 127) / 128 * 128;
  }
  static constexpr int64_t align_slack() { return 1024; }
  constexpr int64_t bytes_with_dq_slots(int slots) const {
    return kv_bytes() + stages * stage_bytes() + ds_bytes() +
           slots * consumer_groups() * dq_tile_bytes() + barrier_bytes() + align_slack();
  }
  constexpr int dq_slots() const { return bytes_with_dq_slots(2) <= kSm90SmemPerBlock ? 2 : 1; }
  constexpr int64_t smem_bytes() const { return bytes_with_dq_slots(dq_slots()); }

  // setmaxnreg, as the forward: the producer warpgroup keeps few registers.
  constexpr int launch_registers() const {
    return (kSm90RegistersPerSm / threads()) / 8 * 8 > 255
               ? 248
               : (kSm90RegistersPerSm / threads()) / 8 * 8;
  }
  // The producer warpgroup (copies, lse and D, the dQ writer) runs on 24 registers, and the
  // consumers take the rest. With segment ids, beside two groups of 64-query steps, it takes 40
  // and the consumers 232: at 24 the producer's loop reloaded about a dozen values a step from
  // local memory and the consumers' masked path spilled too (head dim 128: 196 bytes), at 40
  // ptxas spills 68 bytes there, 8 at head dim 64, none at 256, and window + documents ran 4%
  // faster. Without segment ids the consumers keep 240: at 232 the hero backward ran 1.4%
  // slower with no spill at all (docs/PERF.md, session 48).
  constexpr int producer_registers(bool segments) const {
    return segments && consumer_groups() == 2 && group_queries() <= 64 ? 40 : 24;
  }
  constexpr int consumer_registers(bool segments) const {
    const int r = ((launch_registers() * threads() - 128 * producer_registers(segments)) /
                   (128 * consumer_groups())) /
                  8 * 8;
    return r > 240 ? 240 : r;
  }
  // The fewer of the two: what the accumulators must fit in.
  constexpr int least_consumer_registers() const {
    const int dense = consumer_registers(false), segments = consumer_registers(true);
    return dense < segments ? dense : segments;
  }

  // A step's lse and D values go into registers before its products are issued (so that their
  // shared-memory loads do not queue behind the products' operand reads) where a consumer has
  // the registers for them (not beside the 128-query steps' S^T and dP^T: 128 floats).
  constexpr bool reads_rows_early() const {
    return consumer_registers(false) >= 240 && group_queries() <= 64;
  }

  constexpr bool operator==(const TmaBackwardPlan& o) const {
    return head_dim == o.head_dim && block_m == o.block_m && block_n == o.block_n &&
           stages == o.stages;
  }
};

// {head_dim, block_m, block_n, stages, compiled_by_default}. FlashAttention-3's backward runs
// 64 query rows against 128 keys (two consumer warpgroups) at head dim 128 and 128 x 128 at 64;
// at head dim 64 a third consumer group (192 keys) fits beside 64-query steps (160 registers
// each, docs/PERF.md b5), and the 128-query plan holds one dQ staging tile per group.
// At head dim 256 two groups share 64 keys, and shared memory holds one Q/dO slot and one dQ
// staging tile per group (K and V alone are 64 KB; FlashAttention-3 keeps one slot there too).
inline constexpr TmaBackwardPlan kTmaBackwardPlans[] = {
    {64, 64, 128, 2, true},   // each group its own keys' dQ part (windows, documents)
    {64, 64, 192, 2, true},   // three groups
    {64, 128, 128, 2, true},  // 128-query steps, dQ split by rows (dense masks)
    {128, 64, 128, 2, true},  // dQ split by columns
    {256, 64, 64, 1, true},   // two groups share 64 keys, each half the head dim
};
inline constexpr int kTmaBackwardPlanCount =
    static_cast<int>(sizeof(kTmaBackwardPlans) / sizeof(kTmaBackwardPlans[0]));

constexpr const char* tma_backward_plan_defect(const TmaBackwardPlan& p) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256) return "head dim 64, 128 or 256";
  if (p.block_m != 64 && !(p.block_m == 128 && p.head_parts() == 1 && p.block_n == 128)) {
    return "query tiles of 64 rows (128 with two groups of 64 keys)";
  }
  if (p.head_parts() == 1 && p.block_n != 128 && p.block_n != 192)
    return "two or three consumer warpgroups (128 or 192 keys)";
  if (p.head_parts() > 1 && p.block_n != 64) return "64 keys where groups split the head dim";
  if (p.stages < 1 || p.stages > 3) return "1 to 3 stages";
  if (p.smem_bytes() > kSm90SmemPerBlock) return "shared memory over sm90's limit";
  // dK and dV (group_columns() / 2 floats each), then S^T and dP^T (group_queries() / 2 each)
  // or the dQ part (dq_columns() / 2), and about 32 registers of addresses, lse and loop state
  // (ptxas, 64x192 at head dim 64: 160 registers, one loop-invariant value spilled and reloaded
  // once per step).
  const int scores = 2 * (p.group_queries() / 2), dq = p.dq_columns() / 2;
  if (p.group_columns() + (scores > dq ? scores : dq) + 32 > p.least_consumer_registers()) {
    return "accumulators exceed the consumer registers";
  }
  return nullptr;
}

constexpr bool all_tma_backward_plans_valid() {
  for (const TmaBackwardPlan& p : kTmaBackwardPlans) {
    if (tma_backward_plan_defect(p) != nullptr) return false;
  }
  for (int i = 0; i < kTmaBackwardPlanCount; ++i) {
    for (int j = i + 1; j < kTmaBackwardPlanCount; ++j) {
      if (kTmaBackwardPlans[i] == kTmaBackwardPlans[j]) return false;
    }
  }
  return true;
}
static_assert(all_tma_backward_plans_valid(),
              "a TMA backward plan breaks a kernel rule (tma_backward_plan_defect) or is listed "
              "twice");

// Whether this build compiles plan `p` (the default set, or every plan for the sweep build).
// Only the files that FLASHTRAIN_SWEEP_KERNELS reaches call it (CMakeLists.txt: the kernel
// instantiations and kernel_config.cpp); everything else asks compiled_kernels().
constexpr bool tma_plan_compiled(const TmaForwardPlan& p) {
#ifdef FLASHTRAIN_SWEEP_KERNELS
  return p.head_dim > 0;
#else
  return p.compiled_by_default;
#endif
}
constexpr bool tma_plan_compiled(const TmaBackwardPlan& p) {
#ifdef FLASHTRAIN_SWEEP_KERNELS
  return p.head_dim > 0;
#else
  return p.compiled_by_default;
#endif
}

}  // namespace ft::attention

// Kernel configurations without a GPU: the text form, the architecture table, can_implement's
// reasons at each rule's boundary, and the defaults (accepted and compiled on every family).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>

#include "attention/kernel_config.h"
#include "attention_test_util.h"

namespace ft::attention::testing {
namespace {

Problem bf16_problem(int64_t head_dim) {
  Problem p;
  p.batch = 2;
  p.seq_len = 513;
  p.q_heads = 8;
  p.kv_heads = 2;
  p.head_dim = head_dim;
  p.dtype = DType::bf16;
  p.mask.causal = true;
  return p;
}

TEST(KernelConfig, TextRoundTrips) {
  const KernelConfig c = KernelConfig::parse("fwd=128x32/128 bwd=64x128/256/single");
  EXPECT_EQ(c.forward, (TileConfig{128, 32, 128}));
  EXPECT_EQ(c.backward, (TileConfig{64, 128, 256}));
  EXPECT_EQ(c.backward_path, BackwardPath::single);
  EXPECT_EQ(c.str(), "fwd=128x32/128 bwd=64x128/256/single");
  EXPECT_EQ(KernelConfig::parse(c.str()), c);
  // Either part alone keeps the base's other part.
  const KernelConfig only_bwd = KernelConfig::parse("bwd=128x64/128", c);
  EXPECT_EQ(only_bwd.forward, c.forward);
  EXPECT_EQ(only_bwd.backward, (TileConfig{128, 64, 128}));
  EXPECT_EQ(only_bwd.backward_path, BackwardPath::single);
}

// The wgmma paths: the forward's path is written only when it is not mma.
TEST(KernelConfig, WgmmaPathsInText) {
  const KernelConfig c = KernelConfig::parse("fwd=128x128/256/wgmma bwd=64x128/256/wgmma");
  EXPECT_EQ(c.forward_path, ForwardPath::wgmma);
  EXPECT_EQ(c.backward_path, BackwardPath::wgmma);
  EXPECT_EQ(c.str(), "fwd=128x128/256/wgmma bwd=64x128/256/wgmma");
  EXPECT_EQ(KernelConfig::parse(c.str()), c);
  const KernelConfig mma = KernelConfig::parse("fwd=128x64/128/mma", c);
  EXPECT_EQ(mma.forward_path, ForwardPath::mma);
  EXPECT_EQ(mma.forward_str(), "fwd=128x64/128");
  EXPECT_EQ(mma.backward_path, BackwardPath::wgmma) << "the backward part is kept";
  expect_error([] { parse_forward_path("cp"); }, {"cp", "mma, wgmma, tma"});
  expect_error([] { KernelConfig::parse("fwd=128x64/128/wgmma/s2"); }, {"s2", "tma path only"});
}

// The tma path names its ring depth and turns; left out they are /s2/pp.
TEST(KernelConfig, TmaPathInText) {
  const KernelConfig c = KernelConfig::parse("fwd=128x128/384/tma/s2/pp bwd=64x128/256/wgmma");
  EXPECT_EQ(c.forward_path, ForwardPath::tma);
  EXPECT_EQ(c.forward_stages, 2);
  EXPECT_TRUE(c.forward_pingpong);
  EXPECT_EQ(c.str(), "fwd=128x128/384/tma/s2/pp bwd=64x128/256/wgmma");
  EXPECT_EQ(KernelConfig::parse(c.str()), c);
  EXPECT_EQ(KernelConfig::parse("fwd=128x128/384/tma", c), c);
  const KernelConfig seq = KernelConfig::parse("fwd=128x64/384/tma/s3/nopp", c);
  EXPECT_EQ(seq.forward_stages, 3);
  EXPECT_FALSE(seq.forward_pingpong);
  EXPECT_EQ(seq.forward_str(), "fwd=128x64/384/tma/s3/nopp");
  // One consumer group (64 rows) has no partner to take turns with: /nopp unless asked.
  const KernelConfig one = KernelConfig::parse("fwd=64x64/256/tma");
  EXPECT_EQ(one.forward_stages, 2);
  EXPECT_FALSE(one.forward_pingpong);
  EXPECT_EQ(one.forward_str(), "fwd=64x64/256/tma/s2/nopp");
  EXPECT_NE(find_tma_plan(one, 128), nullptr);
  EXPECT_EQ(find_tma_plan(KernelConfig::parse("fwd=64x64/256/tma/s2/pp"), 128), nullptr);
  // The same tile on 384 threads: two consumer groups, two heads a work tile, taking turns.
  const KernelConfig two = KernelConfig::parse("fwd=64x64/384/tma");
  EXPECT_TRUE(two.forward_pingpong);
  ASSERT_NE(find_tma_plan(two, 128), nullptr);
  EXPECT_EQ(find_tma_plan(two, 128)->heads, 2);
  EXPECT_EQ(find_tma_plan(one, 128)->heads, 1);
  EXPECT_EQ(with_tma_forward(c, *find_tma_plan(two, 128)).forward_str(), "fwd=64x64/384/tma/s2/pp");
  // Back to another path: the tma knobs are cleared, so configurations compare equal.
  EXPECT_EQ(KernelConfig::parse("fwd=128x128/256/wgmma", c),
            KernelConfig::parse("fwd=128x128/256/wgmma bwd=64x128/256/wgmma"));
  // The tma backward names a ring depth only where it is not its tile's first plan's; a word
  // without /sN (or one that leaves the path out) goes back to the first plan.
  const KernelConfig deep = KernelConfig::parse("bwd=64x192/512/tma/s3", c);
  EXPECT_EQ(deep.backward_stages, 3);
  EXPECT_EQ(deep.backward_str(), "bwd=64x192/512/tma/s3");
  EXPECT_EQ(KernelConfig::parse(deep.str()), deep);
  EXPECT_NE(deep, KernelConfig::parse("bwd=64x192/512/tma", c));
  EXPECT_EQ(KernelConfig::parse("bwd=64x192/512/tma", deep).backward_stages, 0);
  EXPECT_EQ(KernelConfig::parse("bwd=64x192/512", deep).backward_stages, 0);
  // Other paths have no ring depth to name; a depth counts from 1.
  expect_error([] { KernelConfig::parse("bwd=64x64/128/double/s2"); },
               {"bwd=64x64/128/double/s2", "tma backward only"});
  expect_error([] { KernelConfig::parse("bwd=64x128/384/s2"); }, {"tma backward only"});
  expect_error([] { KernelConfig::parse("bwd=64x128/384/tma/s0"); }, {"count from 1"});
}

// Every plan of tma_plans.h is a configuration can_implement accepts on sm90 (for the forward)
// with its shared memory, and the plan list is what the sweep's tma candidates are.
TEST(KernelConfig, TmaPlansAreTheCandidates) {
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  int plans = 0;
  for (int64_t d : tma_head_dims()) {
    const std::vector<TmaForwardPlan> candidates = sweep_tma_plans(d);
    ASSERT_FALSE(candidates.empty()) << d;
    for (const TmaForwardPlan& plan : candidates) {
      ++plans;
      const KernelConfig c = with_tma_forward(default_config(sm90, d), plan);
      const Problem p = bf16_problem(d);
      ASSERT_NE(find_tma_plan(c, d), nullptr) << c.str();
      EXPECT_TRUE(*find_tma_plan(c, d) == plan) << c.str();
      EXPECT_EQ(forward_smem_bytes(c, d), plan.smem_bytes()) << c.str();
      EXPECT_LE(plan.smem_bytes(), sm90.max_smem_per_block) << c.str();
      const std::string why = can_implement(c, p, sm90, KernelDirection::forward);
      const bool compiled =
          std::find(compiled_kernels().tma_forward.begin(), compiled_kernels().tma_forward.end(),
                    plan) != compiled_kernels().tma_forward.end();
      if (compiled) {
        EXPECT_EQ(why, "") << c.str();
      } else {
        EXPECT_NE(why.find("not compiled"), std::string::npos) << c.str() << ": " << why;
      }
    }
  }
  EXPECT_EQ(plans, kTmaForwardPlanCount);
}

// A plan of one consumer group shares its SM with one or two more blocks: their shared memory
// (and the 1 KB the system keeps for each) and their registers fit the SM together. Plans of
// two or three groups have the SM to themselves.
TEST(KernelConfig, OneGroupTmaPlansShareTheSm) {
  int shared = 0;
  for (const TmaForwardPlan& plan : kTmaForwardPlans) {
    const int blocks = plan.blocks_per_sm();
    if (plan.consumer_groups() > 1) {
      EXPECT_EQ(blocks, 1) << plan.block_m << "x" << plan.block_n;
      continue;
    }
    ++shared;
    EXPECT_GE(blocks, 2) << plan.head_dim << " " << plan.block_n;
    EXPECT_LE(blocks * (plan.smem_bytes() + kSm90SmemReservedPerBlock), kSm90SmemPerSm);
    EXPECT_LE(blocks * plan.threads() * plan.launch_registers(), kSm90RegistersPerSm);
    EXPECT_FALSE(plan.pingpong);
  }
  EXPECT_GT(shared, 0);
}

// The register split of every forward plan, with and without segment ids: setmaxnreg never asks
// for more than the block's share, the producer keeps 24 where it does not classify key tiles,
// and Q goes into registers only beside the accumulators' room.
TEST(KernelConfig, TmaForwardRegisterSplit) {
  for (const TmaForwardPlan& plan : kTmaForwardPlans) {
    for (const bool segments : {false, true}) {
      EXPECT_LE(128 * (plan.producer_registers(segments) +
                       plan.consumer_groups() * plan.consumer_registers(segments)),
                plan.launch_registers() * plan.threads())
          << "setmaxnreg would wait for registers the block does not have";
      EXPECT_LE(plan.accumulator_registers(), plan.consumer_registers(segments));
    }
    EXPECT_EQ(plan.producer_registers(false), 24);
    EXPECT_GE(plan.consumer_registers(false), plan.consumer_registers(true));
  }
  // The hero plan holds Q (32 words a thread) beside 192 of accumulators; head dim 256 and three
  // groups of 128 keys have no room for it.
  EXPECT_TRUE((TmaForwardPlan{128, 128, 128, 2, true, true, 1, 1}.q_in_registers(false)));
  EXPECT_EQ((TmaForwardPlan{128, 128, 128, 2, true, true, 1, 1}.consumer_registers(false)), 240);
  EXPECT_FALSE((TmaForwardPlan{256, 128, 80, 2, true, true}.q_in_registers(false)));
  EXPECT_FALSE((TmaForwardPlan{64, 192, 128, 2, true, true}.q_in_registers(false)));
}

// Every plan's segment tables hold kTmaTileTable key tiles, except where they would not fit
// beside one Q slot and the ring: head dim 256 with 80-key tiles (64 KB of Q, 160 KB of ring)
// holds half as many; and where half tables are what lets a second Q slot fit: the hero plan
// with its third V slot (2 x 32 KB of Q, 160 KB of ring). Key tiles of 80 are refused at the
// other head dims.
TEST(KernelConfig, TmaSegmentTablesFitBesideTheRing) {
  for (const TmaForwardPlan& plan : kTmaForwardPlans) {
    const bool halved = (plan.head_dim == 256 && plan.block_n == 80) ||
                        (plan.head_dim == 128 && plan.block_m == 128 && plan.block_n == 128 &&
                         plan.stages == 2 && plan.extra_v == 1);
    EXPECT_EQ(plan.table_tiles(), halved ? kTmaTileTable / 2 : kTmaTileTable)
        << plan.head_dim << " " << plan.block_m << "x" << plan.block_n;
    EXPECT_EQ(plan.table_bytes(), 10 * plan.table_tiles());
    EXPECT_LE(plan.smem_bytes(), kSm90SmemPerBlock);
  }
  // The hero plan keeps two Q slots beside three V slots (231,936 of 232,448 bytes); with full
  // tables it would fall to one.
  const TmaForwardPlan hero{128, 128, 128, 2, true, true, 1, 1};
  EXPECT_EQ(hero.q_slots(), 2);
  EXPECT_EQ(hero.smem_bytes(), 231936);
  EXPECT_EQ(hero.ring_bytes(), 5 * 32768);
  // The head-dim-64 plans of two and three consumer groups take the third V slot too, with their
  // full tables and two Q slots.
  const TmaForwardPlan d64{64, 128, 128, 2, true, true, 1, 1};
  EXPECT_EQ(d64.v_stages(), 3);
  EXPECT_EQ(d64.ring_bytes(), 5 * 16384);
  EXPECT_EQ(d64.q_slots(), 2);
  EXPECT_STREQ((tma_plan_defect(TmaForwardPlan{64, 128, 128, 2, true, true, 1, 3})),
               "at most 4 V slots (stages + extra_v)");
  TmaForwardPlan d128{128, 128, 80, 2, true, false};
  EXPECT_STREQ(tma_plan_defect(d128), "key tiles of 64 or 128 (80 at head dim 256)");
  d128.head_dim = 256;
  EXPECT_EQ(tma_plan_defect(d128), nullptr);
}

TEST(KernelConfig, TmaReasons) {
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  const KernelConfig c = KernelConfig::parse("fwd=128x128/384/tma/s2/pp bwd=64x128/256/wgmma");
  const Problem p = bf16_problem(128);
  EXPECT_EQ(can_implement(c, p, sm90), "");
  for (const char* arch : {"sm80", "sm86", "sm100", "sm120"}) {
    const std::string why = can_implement(c, p, DeviceLimits::for_arch(arch));
    EXPECT_NE(why.find("tma path needs sm90"), std::string::npos) << arch << ": " << why;
  }
  const std::string d32 = can_implement(c, bf16_problem(32), sm90);
  EXPECT_NE(d32.find("head dim 32: the tma forward kernels support 64, 128, 256"),
            std::string::npos)
      << d32;
  KernelConfig bad = c;
  bad.forward = {128, 96, 384};  // no such plan: the reason lists the plans of the head dim
  const std::string no_plan = can_implement(bad, p, sm90);
  EXPECT_NE(no_plan.find("not a tma plan for head dim 128"), std::string::npos) << no_plan;
  EXPECT_NE(no_plan.find("128x128/384/tma/s2/pp"), std::string::npos) << no_plan;
  bad = c;
  bad.forward.threads = 256;
  EXPECT_NE(can_implement(bad, p, sm90).find("runs 384 threads"), std::string::npos);
  // Two heads a work tile: the query heads of a kv head in pairs (8 / 2 here; not 6 / 2 or MHA).
  const KernelConfig paired = KernelConfig::parse("fwd=64x64/384/tma", c);
  // (Accepted apart from being compiled: the two-head plans are sweep candidates only.)
  const std::string pairs_ok = can_implement(paired, p, sm90, KernelDirection::forward);
  EXPECT_TRUE(pairs_ok.empty() || pairs_ok.find("not compiled") != std::string::npos) << pairs_ok;
  for (const auto& [hq, hkv] : {std::pair<int64_t, int64_t>{6, 2}, {8, 8}}) {
    Problem odd = p;
    odd.q_heads = hq;
    odd.kv_heads = hkv;
    const std::string why = can_implement(paired, odd, sm90, KernelDirection::forward);
    EXPECT_NE(why.find("query heads per kv head must come in 2s"), std::string::npos) << why;
    EXPECT_EQ(can_implement(KernelConfig::parse("fwd=64x64/256/tma", c), odd, sm90,
                            KernelDirection::forward),
              "");
  }
  // Head dim 256: the tma forward and the tma backward run it, the wgmma backward does not.
  const Problem d256 = bf16_problem(256);
  EXPECT_EQ(
      can_implement(KernelConfig::parse("fwd=128x64/384/tma/s2/pp bwd=64x64/384/tma"), d256, sm90),
      "");
  const KernelConfig c256 = KernelConfig::parse("fwd=128x64/384/tma/s2/pp bwd=64x128/256/wgmma");
  EXPECT_EQ(can_implement(c256, d256, sm90, KernelDirection::forward), "");
  EXPECT_NE(can_implement(c256, d256, sm90, KernelDirection::backward).find("head dim 256"),
            std::string::npos);
  EXPECT_NE(can_implement(c256, d256, sm90).find("head dim 256"), std::string::npos);
}

// How each tma backward plan splits dQ between its consumer groups, and the rules a plan of
// 128-query steps must meet (two groups of 64 keys, the head dim whole).
TEST(KernelConfig, TmaBackwardDqSplits) {
  const TmaBackwardPlan own{64, 64, 192, 2, false};    // each group its own keys' part
  const TmaBackwardPlan cols{128, 64, 128, 2, false};  // each group a 64-column panel
  const TmaBackwardPlan rows{64, 128, 128, 2, false};  // each group 64 of the 128 query rows
  const TmaBackwardPlan parts{256, 64, 64, 1, false};  // the head dim split, dQ with it
  EXPECT_FALSE(own.dq_reads_all_keys());
  EXPECT_EQ(own.dq_columns(), 64);
  EXPECT_TRUE(cols.dq_splits_columns());
  EXPECT_FALSE(cols.dq_splits_rows());
  EXPECT_EQ(cols.dq_columns(), 64);
  EXPECT_TRUE(rows.dq_splits_rows());
  EXPECT_FALSE(rows.dq_splits_columns());
  EXPECT_TRUE(rows.dq_reads_all_keys());
  EXPECT_EQ(rows.dq_columns(), 64);
  EXPECT_EQ(rows.group_queries(), 128);
  EXPECT_TRUE(parts.dq_splits_columns());
  EXPECT_EQ(parts.dq_columns(), 128);
  // Every staging tile holds 64 query rows; the 128-query plan has room for one a group, and
  // reads lse and D inside its step (S^T and dP^T take 128 of its 240 registers).
  for (const TmaBackwardPlan& p : {own, cols, rows, parts}) {
    EXPECT_EQ(p.dq_tile_bytes(), 64 * p.dq_columns() * 4);
  }
  EXPECT_EQ(rows.dq_slots(), 1);
  EXPECT_EQ(rows.consumer_registers(false), 240);
  EXPECT_EQ(rows.consumer_registers(true), 240);
  // With segment ids the 64-query plans of two groups give the producer 40 registers and
  // their consumers 232; without, and in the 128-query plan, 24 and 240.
  EXPECT_EQ(cols.producer_registers(true), 40);
  EXPECT_EQ(cols.consumer_registers(true), 232);
  EXPECT_EQ(cols.producer_registers(false), 24);
  EXPECT_EQ(cols.consumer_registers(false), 240);
  EXPECT_EQ(rows.producer_registers(true), 24);
  for (const TmaBackwardPlan& p : kTmaBackwardPlans) {
    for (const bool segments : {false, true}) {
      EXPECT_LE(128 * (p.producer_registers(segments) +
                       p.consumer_groups() * p.consumer_registers(segments)),
                p.launch_registers() * p.threads())
          << p.head_dim << " " << p.block_m << "x" << p.block_n << " segments " << segments
          << ": setmaxnreg would wait for registers the block does not have";
    }
  }
  EXPECT_FALSE(rows.reads_rows_early());
  EXPECT_TRUE(cols.reads_rows_early());
  EXPECT_EQ(tma_backward_plan_defect(rows), nullptr);
  // 128-query steps need two groups of 64 keys and the whole head dim in each.
  const char* three = tma_backward_plan_defect({64, 128, 192, 2, false});
  ASSERT_NE(three, nullptr);
  EXPECT_NE(std::string(three).find("query tiles of 64 rows (128 with two groups"),
            std::string::npos);
  EXPECT_NE(tma_backward_plan_defect({256, 128, 64, 1, false}), nullptr);
  EXPECT_NE(tma_backward_plan_defect({64, 96, 128, 2, false}), nullptr);
}

// The tma backward: its text, shared memory from its plan, and can_implement at each rule.
TEST(KernelConfig, TmaBackwardPlansAndReasons) {
  const KernelConfig c = KernelConfig::parse("fwd=128x128/384/tma/s2/pp bwd=64x128/384/tma");
  EXPECT_EQ(c.backward_path, BackwardPath::tma);
  EXPECT_EQ(c.backward_str(), "bwd=64x128/384/tma");
  EXPECT_EQ(KernelConfig::parse(c.str()), c);
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  for (const TmaBackwardPlan& plan : kTmaBackwardPlans) {
    const KernelConfig named = with_tma_backward(c, plan);
    EXPECT_EQ(find_tma_backward_plan(named, plan.head_dim), &plan) << named.backward_str();
    EXPECT_EQ(KernelConfig::parse(named.str()), named);
    EXPECT_EQ(backward_smem_bytes(named, plan.head_dim), plan.smem_bytes());
    EXPECT_LE(plan.smem_bytes(), sm90.max_smem_per_block);
    // The ring depth is written (/sN) only where the plan is not its tile's first.
    const TileConfig tile{plan.block_m, plan.block_n, plan.threads()};
    const KernelConfig short_form = KernelConfig::parse("bwd=" + tile.str() + "/tma", c);
    const bool first = find_tma_backward_plan(short_form, plan.head_dim) == &plan;
    EXPECT_EQ(named.backward_stages == 0, first) << named.backward_str();
    EXPECT_EQ(named == short_form, first) << named.backward_str();
    if (!first) {
      EXPECT_EQ(named.backward_str(), ft::str(short_form.backward_str(), "/s", plan.stages));
    } else {
      EXPECT_EQ(backward_smem_bytes(tile, BackwardPath::tma, plan.head_dim), plan.smem_bytes());
    }
    // K and V, Q, dO, lse and D per stage (m query rows), two dS^T buffers (and two of P^T
    // where two groups split the head dim: 256), fp32 dQ staging tiles (two of 64 x 64 per
    // consumer where they fit, else one; one of 64 x 128 where the head dim is split), barriers
    // and records (256 bytes for two consumers, 384 for three) and the alignment slack.
    const int64_t d = plan.head_dim, parts = d > 128 ? 2 : 1, groups = plan.block_n / 64 * parts;
    const int64_t m = plan.block_m;
    EXPECT_EQ(plan.consumer_groups(), groups);
    const int64_t dq_slots = plan.bytes_with_dq_slots(2) <= kSm90SmemPerBlock ? 2 : 1;
    EXPECT_EQ(plan.dq_slots(), dq_slots);
    if (parts > 1) {
      EXPECT_EQ(dq_slots, 1);
    }
    const int64_t dq_columns = 64 * parts;
    EXPECT_EQ(plan.smem_bytes(), 4 * d * plan.block_n + plan.stages * (4 * d * m + 8 * m) +
                                     4 * plan.block_n * m * parts +
                                     dq_slots * groups * 64 * dq_columns * 4 +
                                     (groups == 2 ? 256 : 384) + 1024);
  }
  const Problem p = bf16_problem(128);
  EXPECT_EQ(can_implement(c, p, sm90), "");
  for (const char* arch : {"sm80", "sm86", "sm100", "sm120"}) {
    const std::string why = can_implement(c, p, DeviceLimits::for_arch(arch));
    EXPECT_NE(why.find("tma path needs sm90"), std::string::npos) << arch << ": " << why;
  }
  const std::string d32 = can_implement(c, bf16_problem(32), sm90, KernelDirection::backward);
  EXPECT_NE(d32.find("head dim 32: the tma backward kernels support 64, 128"), std::string::npos)
      << d32;
  KernelConfig bad = c;
  bad.backward = {64, 64, 256};
  const std::string no_plan = can_implement(bad, p, sm90, KernelDirection::backward);
  EXPECT_NE(no_plan.find("not a tma backward plan for head dim 128"), std::string::npos) << no_plan;
  EXPECT_NE(no_plan.find("64x128/384/tma"), std::string::npos) << no_plan;
  bad.backward = {64, 128, 256};
  EXPECT_NE(can_implement(bad, p, sm90).find("runs 384 threads"), std::string::npos);
  // A ring depth the tile has no plan of is refused with the plans there are.
  const std::string depth = can_implement(KernelConfig::parse("bwd=64x128/384/tma/s3", c), p, sm90);
  EXPECT_NE(depth.find("backward tile 64x128/384/tma/s3: not a tma backward plan for head dim 128"),
            std::string::npos)
      << depth;
  // The deterministic mode: the tma backward takes it, the other bf16 paths refuse it, fp32
  // (deterministic already) takes any configuration.
  Problem det = p;
  det.deterministic = true;
  EXPECT_EQ(can_implement(c, det, sm90), "");
  // The default for a deterministic problem on sm90 runs the tma backward.
  for (int64_t d : {64, 128}) {
    Problem dp = bf16_problem(d);
    dp.deterministic = true;
    const KernelConfig dc = default_config(sm90, dp);
    EXPECT_EQ(dc.backward_path, BackwardPath::tma) << dc.str();
    EXPECT_EQ(can_implement(dc, dp, sm90), "") << dc.str();
  }
  KernelConfig wgmma = c;
  wgmma.backward = {64, 128, 256};
  wgmma.backward_path = BackwardPath::wgmma;
  const std::string why = can_implement(wgmma, det, sm90);
  EXPECT_NE(why.find("deterministic backward"), std::string::npos) << why;
  EXPECT_EQ(can_implement(wgmma, det, sm90, KernelDirection::forward), "");
  det.dtype = DType::f32;
  EXPECT_EQ(can_implement(wgmma, det, sm90), "");
}

TEST(KernelConfig, BadTextNamesTheWordAndTheForm) {
  expect_error([] { KernelConfig::parse("fwd=128x64"); }, {"fwd=128x64", "expected"});
  expect_error([] { KernelConfig::parse("bwd=64x64/128/triple"); }, {"triple"});
  expect_error([] { KernelConfig::parse("  "); }, {"empty"});
  // Too large for an int: an ft::Error, not std::out_of_range (found by fuzz_kernel_config).
  expect_error([] { KernelConfig::parse("bwd=33333333333364x64/1"); },
               {"33333333333364", "out of range"});
  expect_error([] { parse_backward_path("fast"); }, {"fast", "single, double"});
}

TEST(KernelConfig, ArchitectureTable) {
  EXPECT_EQ(DeviceLimits::for_arch("sm90").max_smem_per_block, 232448);
  EXPECT_EQ(DeviceLimits::for_arch("sm86").max_smem_per_block, 101376);
  EXPECT_EQ(DeviceLimits::for_arch("sm80").compute_capability, 80);
  expect_error([] { DeviceLimits::for_arch("sm75"); }, {"sm75", "known", "sm90"});
}

TEST(KernelConfig, SharedMemoryPlans) {
  // Q + 2 stages of K and V: 2 * D * (BM + 4 BN).
  EXPECT_EQ(forward_smem_bytes({128, 64, 128}, ForwardPath::mma, 128), 2 * 128 * (128 + 256));
  // K, V + per stage Q, dO, lse, D + dS.
  EXPECT_EQ(backward_smem_bytes({64, 128, 256}, BackwardPath::double_buffered, 128),
            4 * 128 * 128 + 2 * (4 * 128 * 64 + 8 * 64) + 2 * 64 * 128);
  EXPECT_EQ(backward_smem_bytes({64, 128, 256}, BackwardPath::single, 128),
            4 * 128 * 128 + (4 * 128 * 64 + 8 * 64) + 2 * 64 * 128);
  // wgmma: the same tiles, double-buffered, plus 1024 B to align the swizzled panels.
  // wgmma forward: also a 256-entry key-tile table (5 B each).
  EXPECT_EQ(forward_smem_bytes({128, 128, 256}, ForwardPath::wgmma, 128),
            2 * 128 * (128 + 512) + 1280 + 1024);
  // One warpgroup: a single K slot, so that three blocks share an SM.
  EXPECT_EQ(forward_smem_bytes({64, 64, 128}, ForwardPath::wgmma, 128),
            2 * 128 * (64 + 3 * 64) + 1280 + 1024);
  EXPECT_EQ(backward_smem_bytes({64, 128, 256}, BackwardPath::wgmma, 128),
            backward_smem_bytes({64, 128, 256}, BackwardPath::double_buffered, 128) + 1024);
}

TEST(KernelConfig, WgmmaReasons) {
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  KernelConfig c = KernelConfig::parse("fwd=128x128/256/wgmma bwd=64x128/256/wgmma");
  const Problem p = bf16_problem(128);
  EXPECT_EQ(can_implement(c, p, sm90), "");
  for (const char* arch : {"sm80", "sm86", "sm100", "sm120"}) {
    const std::string why = can_implement(c, p, DeviceLimits::for_arch(arch));
    EXPECT_NE(why.find("needs sm90"), std::string::npos) << arch << ": " << why;
  }
  const std::string d32 = can_implement(c, bf16_problem(32), sm90);
  EXPECT_NE(d32.find("head dim 32: the wgmma forward kernels support 64, 128"), std::string::npos)
      << d32;
  KernelConfig bad = c;
  bad.forward = {128, 64, 128};  // one warpgroup for 128 rows
  EXPECT_NE(can_implement(bad, p, sm90).find("one warpgroup (128 threads) per 64"),
            std::string::npos);
  bad.forward = {64, 96, 128};
  EXPECT_NE(can_implement(bad, p, sm90).find("64 or 128"), std::string::npos);
  bad = c;
  bad.backward = {128, 128, 256};
  EXPECT_NE(can_implement(bad, p, sm90).find("query rows must be 64"), std::string::npos);
  bad.backward = {64, 128, 128};
  EXPECT_NE(can_implement(bad, p, sm90).find("64 keys for 128 threads"), std::string::npos);
  // The mma forward with the wgmma backward (and the other way round) is a valid mix.
  bad = c;
  bad.forward = {128, 64, 128};
  bad.forward_path = ForwardPath::mma;
  EXPECT_EQ(can_implement(bad, p, sm90), "");
}

TEST(KernelConfig, CanImplementReasons) {
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  const DeviceLimits sm86 = DeviceLimits::for_arch("sm86");
  const KernelConfig base = KernelConfig::parse("fwd=128x64/128 bwd=64x128/256/double");
  Problem p = bf16_problem(128);
  EXPECT_EQ(can_implement(base, p, sm90), "");

  KernelConfig c = base;
  c.forward = {64, 64, 96};
  EXPECT_NE(can_implement(c, p, sm90).find("warps must split"), std::string::npos);
  c.forward = {64, 64, 100};
  EXPECT_NE(can_implement(c, p, sm90).find("multiple of 32"), std::string::npos);
  c.forward = {128, 64, 2048};
  EXPECT_NE(can_implement(c, p, sm90).find("up to 1024"), std::string::npos);
  c = base;
  c.backward = {64, 64, 256};  // 8 warps over 64 keys: 8 keys each
  EXPECT_NE(can_implement(c, p, sm90).find("key rows into 16 or 32"), std::string::npos);

  // 128x128/256 double at D = 128 needs 231424 B: fits sm90's 232448, not sm86's 101376.
  c = base;
  c.backward = {128, 128, 256};
  c.backward_path = BackwardPath::double_buffered;
  EXPECT_EQ(backward_smem_bytes(c.backward, c.backward_path, 128), 231424);
  const std::string on_sm86 = can_implement(c, p, sm86);
  EXPECT_NE(on_sm86.find("231424 B"), std::string::npos) << on_sm86;
  EXPECT_NE(on_sm86.find("101376"), std::string::npos) << on_sm86;
  c.backward = {256, 64, 128};  // 256 query rows double-buffered: 4 * 128 * 256 * 2 B alone
  EXPECT_NE(can_implement(c, p, sm90).find("shared memory"), std::string::npos);

  // Head dims and dtypes.
  EXPECT_NE(can_implement(base, bf16_problem(96), sm90).find("head dim 96"), std::string::npos);
  Problem fp64 = p;
  fp64.dtype = DType::f64;
  EXPECT_NE(can_implement(base, fp64, sm90).find("fp64"), std::string::npos);
  Problem fp32 = bf16_problem(96);
  fp32.dtype = DType::f32;
  EXPECT_EQ(can_implement(base, fp32, sm90), "") << "fp32 runs its own kernels for any head dim";
}

TEST(KernelConfig, NotCompiledSaysHowToCompileIt) {
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  const CompiledKernels& k = compiled_kernels();
  for (const TileConfig& tile : sweep_forward_tiles()) {
    KernelConfig c = default_config(sm90, 64);
    c.forward = tile;
    c.forward_path = ForwardPath::mma;
    const std::string reason = can_implement(c, bf16_problem(64), sm90);
    const bool compiled = std::find(k.forward.begin(), k.forward.end(), tile) != k.forward.end();
    if (compiled) {
      EXPECT_EQ(reason, "") << tile.str();
    } else {
      EXPECT_FALSE(k.sweep_set) << "the sweep build compiles every forward candidate";
      EXPECT_NE(reason.find("FLASHTRAIN_SWEEP_KERNELS=ON"), std::string::npos) << reason;
    }
  }
}

// Every family's default runs every compiled head dim, and is compiled into every build.
TEST(KernelConfig, DefaultsAreAcceptedEverywhere) {
  for (const std::string& arch : DeviceLimits::known_archs()) {
    const DeviceLimits d = DeviceLimits::for_arch(arch);
    for (int64_t dim : flash_head_dims()) {
      const KernelConfig c = default_config(d, dim);
      EXPECT_EQ(can_implement(c, bf16_problem(dim), d), "")
          << arch << " D " << dim << ": " << c.str();
    }
  }
}

// sm90's rows are the sweep's winners: the dense (causal) and local (window / segments) masks
// differ; every family has both rows.
TEST(KernelConfig, DefaultsDependOnTheMaskClass) {
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  Problem p = bf16_problem(128);
  EXPECT_EQ(mask_class_of(p.mask), MaskClass::dense);
  EXPECT_EQ(default_config(sm90, p).str(), "fwd=128x128/384/tma/s2/nopp bwd=64x128/384/tma");
  EXPECT_EQ(default_config(sm90, 64, MaskClass::dense).str(),
            "fwd=128x128/384/tma/s2/pp bwd=128x128/384/tma");
  EXPECT_EQ(default_config(sm90, 256, MaskClass::dense).str(),
            "fwd=128x80/384/tma/s2/pp bwd=64x64/384/tma")
      << "head dim 256: the tma paths only";
  EXPECT_EQ(default_config(sm90, 32, MaskClass::dense).str(),
            "fwd=128x64/128 bwd=64x128/256/double")
      << "head dim 32 has no wgmma kernels";
  p.mask.window = 512;
  EXPECT_EQ(mask_class_of(p.mask), MaskClass::local);
  EXPECT_EQ(default_config(sm90, p).str(), "fwd=64x64/384/tma/s4/nopp bwd=64x128/384/tma")
      << "query heads in pairs: two heads a work tile";
  EXPECT_EQ(default_config(sm90, 128, MaskClass::local).str(),
            "fwd=64x64/256/tma/s2/nopp bwd=64x128/384/tma")
      << "no group given: the one-head plan";
  EXPECT_EQ(default_config(sm90, 64, MaskClass::local).str(),
            "fwd=64x64/256/tma/s2/nopp bwd=64x128/384/tma")
      << "no length given: the rows between kShortSeqLen and kLongSeqLen";
  EXPECT_EQ(default_config(sm90, 256, MaskClass::local).str(),
            "fwd=128x64/384/tma/s2/pp bwd=64x64/384/tma");
  p.mask.window = 0;
  p.mask.has_segments = true;
  EXPECT_EQ(default_config(sm90, p), default_config(sm90, 128, MaskClass::local, 0, 4));
  EXPECT_EQ(arch_family(89), "sm86");
  EXPECT_EQ(arch_family(90), "sm90");
  EXPECT_EQ(arch_family(121), "sm120");
  for (const std::string& arch : DeviceLimits::known_archs()) {
    const DeviceLimits d = DeviceLimits::for_arch(arch);
    for (MaskClass m : {MaskClass::dense, MaskClass::local}) {
      EXPECT_EQ(can_implement(default_config(d, 64, m), bf16_problem(64), d), "")
          << arch << " " << mask_class_name(m);
    }
  }
}

// sm90 at head dim 128 with a window or documents: two heads a work tile where the query heads of
// a kv head pair up, one head otherwise (an odd group, or multi-head attention); dense masks and
// other head dims do not look at the group.
TEST(KernelConfig, Sm90LocalHeadDim128DefaultsDependOnTheGroup) {
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  Problem p = bf16_problem(128);
  p.mask.window = 256;
  for (const auto& [q_heads, kv_heads] : {std::pair{8, 2}, {8, 4}, {16, 8}, {4, 1}}) {
    p.q_heads = q_heads;
    p.kv_heads = kv_heads;
    EXPECT_EQ(default_config(sm90, p).forward_str(), "fwd=64x64/384/tma/s4/nopp")
        << q_heads << "/" << kv_heads;
    EXPECT_EQ(can_implement(default_config(sm90, p), p, sm90), "") << q_heads << "/" << kv_heads;
  }
  for (const auto& [q_heads, kv_heads] : {std::pair{8, 8}, {12, 4}, {3, 1}}) {
    p.q_heads = q_heads;
    p.kv_heads = kv_heads;
    EXPECT_EQ(default_config(sm90, p).forward_str(), "fwd=64x64/256/tma/s2/nopp")
        << q_heads << "/" << kv_heads;
    EXPECT_EQ(can_implement(default_config(sm90, p), p, sm90), "") << q_heads << "/" << kv_heads;
  }
  p.mask.window = 0;
  EXPECT_EQ(default_config(sm90, p), default_config(sm90, 128, MaskClass::dense));
  EXPECT_EQ(default_config(sm90, 64, MaskClass::local, 0, 2),
            default_config(sm90, 64, MaskClass::local, 0, 1));
}

// sm90 at head dim 64 and dense masks: the 64-row plan of one consumer group up to kShortSeqLen,
// three consumer groups (192x128) from kLongSeqLen on (short rows leave too few 192-row work
// tiles), the 128x128 plan between them and for a length not given (0); with a window or
// documents the wgmma 64x64 forward up to kShortSeqLen, three consumer groups from kLongSeqLen
// on and the 64-row tma plan between them and for a length not given; other head dims do not
// look at the length.
TEST(KernelConfig, Sm90HeadDim64DefaultsDependOnTheSequenceLength) {
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  Problem p = bf16_problem(64);
  for (const int64_t short_len : {int64_t{1}, int64_t{513}, kShortSeqLen}) {
    p.seq_len = short_len;
    EXPECT_EQ(default_config(sm90, p).str(), "fwd=64x64/256/tma/s2/nopp bwd=128x128/384/tma")
        << short_len;
    EXPECT_EQ(can_implement(default_config(sm90, p), p, sm90), "") << short_len;
  }
  p.seq_len = kShortSeqLen + 1;
  EXPECT_EQ(default_config(sm90, p).str(), "fwd=128x128/384/tma/s2/pp bwd=128x128/384/tma");
  EXPECT_EQ(default_config(sm90, 64, MaskClass::dense), default_config(sm90, p));
  p.seq_len = kLongSeqLen - 1;
  EXPECT_EQ(default_config(sm90, p).str(), "fwd=128x128/384/tma/s2/pp bwd=128x128/384/tma");
  p.seq_len = kLongSeqLen;
  EXPECT_EQ(default_config(sm90, p).str(), "fwd=192x128/512/tma/s2/pp bwd=128x128/384/tma");
  EXPECT_EQ(default_config(sm90, 64, MaskClass::dense, 32768), default_config(sm90, p));
  EXPECT_EQ(can_implement(default_config(sm90, p), p, sm90), "");
  p.mask.window = 512;
  EXPECT_EQ(default_config(sm90, p).str(), "fwd=192x128/512/tma/s2/pp bwd=64x128/384/tma");
  EXPECT_EQ(can_implement(default_config(sm90, p), p, sm90), "");
  p.seq_len = kShortSeqLen;
  EXPECT_EQ(default_config(sm90, p).str(), "fwd=64x64/128/wgmma bwd=64x128/384/tma");
  EXPECT_EQ(can_implement(default_config(sm90, p), p, sm90), "");
  p.seq_len = kShortSeqLen + 1;
  EXPECT_EQ(default_config(sm90, p).str(), "fwd=64x64/256/tma/s2/nopp bwd=64x128/384/tma");
  EXPECT_EQ(can_implement(default_config(sm90, p), p, sm90), "");
  EXPECT_EQ(default_config(sm90, 64, MaskClass::local), default_config(sm90, p));
  p.seq_len = kLongSeqLen - 1;
  EXPECT_EQ(default_config(sm90, 64, MaskClass::local), default_config(sm90, p));
  Problem q = bf16_problem(128);
  q.seq_len = 4 * kLongSeqLen;
  EXPECT_EQ(default_config(sm90, q), default_config(sm90, 128, MaskClass::dense));
  EXPECT_EQ(default_config(DeviceLimits::for_arch("sm80"), 64, MaskClass::dense, 32768),
            default_config(DeviceLimits::for_arch("sm80"), 64, MaskClass::dense));
}

// The sweep's candidates contain every tile the default build compiles (so the sweep can always
// time the defaults), and compiled tiles all have a valid layout on sm90.
TEST(KernelConfig, SweepCandidatesCoverTheDefaults) {
  const auto fwd = sweep_forward_tiles();
  const auto bwd = sweep_backward_tiles();
  EXPECT_EQ(bwd.size(), 12u);  // 6 tiles x {128, 256} threads
  for (const TileConfig& t : compiled_kernels().forward) {
    EXPECT_NE(std::find(fwd.begin(), fwd.end(), t), fwd.end()) << t.str();
  }
  for (const TileConfig& t : compiled_kernels().backward) {
    EXPECT_NE(std::find(bwd.begin(), bwd.end(), t), bwd.end()) << t.str();
  }
  const auto wgmma_fwd = sweep_forward_tiles(ForwardPath::wgmma);
  const auto wgmma_bwd = sweep_backward_tiles(BackwardPath::wgmma);
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  for (const TileConfig& t : compiled_kernels().wgmma_forward) {
    EXPECT_NE(std::find(wgmma_fwd.begin(), wgmma_fwd.end(), t), wgmma_fwd.end()) << t.str();
    KernelConfig c = default_config(sm90, 128);
    c.forward = t;
    c.forward_path = ForwardPath::wgmma;
    EXPECT_EQ(can_implement(c, bf16_problem(128), sm90), "") << c.str();
  }
  const auto tma_bwd = sweep_backward_tiles(BackwardPath::tma);
  for (const TmaBackwardPlan& plan : compiled_kernels().tma_backward_plans) {
    const KernelConfig c = with_tma_backward(default_config(sm90, plan.head_dim), plan);
    EXPECT_NE(std::find(tma_bwd.begin(), tma_bwd.end(), c.backward), tma_bwd.end()) << c.str();
    const auto plans = sweep_tma_backward_plans(plan.head_dim);
    EXPECT_NE(std::find(plans.begin(), plans.end(), plan), plans.end()) << c.str();
    EXPECT_EQ(can_implement(c, bf16_problem(plan.head_dim), sm90), "") << c.str();
  }
  for (const TileConfig& t : compiled_kernels().wgmma_backward) {
    EXPECT_NE(std::find(wgmma_bwd.begin(), wgmma_bwd.end(), t), wgmma_bwd.end()) << t.str();
    KernelConfig c = default_config(sm90, 128);
    c.backward = t;
    c.backward_path = BackwardPath::wgmma;
    EXPECT_EQ(can_implement(c, bf16_problem(128), sm90), "") << c.str();
  }
}

}  // namespace
}  // namespace ft::attention::testing

// The sweep's plan without a GPU: masks and segment ids, the check problem, the candidate list
// (one axis at a time, the reference never repeated, can_implement's reasons), shard selection,
// the worker job's JSON and the parent's reading of a worker's end.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>

#include "sweep/candidates.h"
#include "sweep/child_process.h"
#include "sweep/shapes.h"
#include "sweep/sweep.h"
#include "sweep/worker.h"

namespace ft::sweep {
namespace {

using attention::BackwardPath;
using attention::DeviceLimits;
using attention::KernelConfig;

attention::Problem hero_problem() {
  const SweepShape shape;
  return timed_problem(shape, sweep_masks(shape).front());
}

std::vector<Candidate> candidates_for(const std::string& arch, SweepAxis axis,
                                      std::vector<BackwardPath> paths = {}) {
  const DeviceLimits d = DeviceLimits::for_arch(arch);
  const KernelConfig base = attention::default_config(d, 128);
  if (paths.empty()) paths = {base.backward_path};
  return make_candidates(axis, paths, base, hero_problem(), d);
}

const Candidate* find(const std::vector<Candidate>& list, const std::string& text) {
  for (const Candidate& c : list) {
    if (c.config.str() == text) return &c;
  }
  return nullptr;
}

TEST(SweepShapes, HeroDefaultsAndTwoMasksInOrder) {
  const SweepShape s;
  EXPECT_EQ(s.describe(), "B=32 S=4096 Hq=16 Hkv=4 D=128 bf16");
  const std::vector<SweepMask> masks = sweep_masks(s);
  ASSERT_EQ(masks.size(), 2u);
  EXPECT_EQ(masks[0].key, "window");
  EXPECT_TRUE(masks[0].mask.causal);
  EXPECT_EQ(masks[0].mask.window, 512);
  EXPECT_TRUE(masks[0].mask.has_segments);
  EXPECT_EQ(masks[0].documents, 5);
  EXPECT_EQ(masks[1].key, "causal");
  EXPECT_TRUE(masks[1].mask.causal);
  EXPECT_EQ(masks[1].mask.window, 0);
  EXPECT_FALSE(masks[1].mask.has_segments);

  SweepShape plain;
  plain.window = 0;
  plain.documents = 0;
  ASSERT_EQ(sweep_masks(plain).size(), 1u);  // the first mask would equal the second
  plain.documents = 3;
  EXPECT_EQ(sweep_masks(plain).front().key, "segments");
}

TEST(SweepShapes, DocumentBoundariesShiftByRow) {
  const Tensor ids = document_ids(3, 100, 5);
  const int32_t* p = ids.data<int32_t>();
  for (int64_t b = 0; b < 3; ++b) {
    // Boundary k of row b sits at k * 20 + b.
    EXPECT_EQ(p[b * 100 + 0], 0);
    EXPECT_EQ(p[b * 100 + 19 + b], 0) << b;
    EXPECT_EQ(p[b * 100 + 20 + b], 1) << b;
    EXPECT_EQ(p[b * 100 + 80 + b], 4) << b;
    EXPECT_EQ(p[b * 100 + 99], 4) << b;
  }
  // Rows 64 apart share their boundaries.
  const Tensor many = document_ids(66, 200, 2);
  EXPECT_EQ(many.data<int32_t>()[65 * 200 + 101], many.data<int32_t>()[1 * 200 + 101]);
}

TEST(SweepShapes, CheckProblemIsReducedAndCutByTheWindow) {
  const SweepShape s;
  const std::vector<SweepMask> masks = sweep_masks(s);
  const attention::Problem p = check_problem(s, masks[0]);
  EXPECT_EQ(p.batch, 3);
  EXPECT_EQ(p.seq_len, 513);
  EXPECT_EQ(p.q_heads, 16);
  EXPECT_EQ(p.kv_heads, 4);
  EXPECT_EQ(p.head_dim, 128);
  EXPECT_EQ(p.dtype, DType::bf16);
  EXPECT_EQ(p.mask.window, 513 / 10);  // min(512, S / (2 * documents))
  EXPECT_EQ(check_problem(s, masks[1]).mask.window, 0);

  const Tensor ids = check_segment_ids(5);
  ASSERT_EQ(ids.shape(), (Shape{3, 513}));
  for (int64_t b = 0; b < 3; ++b) {
    const int32_t* row = ids.data<int32_t>() + b * 513;
    const int64_t padding = std::count(row, row + 513, -1);
    EXPECT_EQ(padding, 16 + 7 * b);
    EXPECT_EQ(row[512], -1);
    EXPECT_GE(row[513 - padding - 1], 0);  // padding only at the row's end
  }
}

TEST(SweepShapes, BadShapesNameTheFlag) {
  SweepShape s;
  s.kv_heads = 3;
  EXPECT_THROW(s.validate(), Error);
  s = {};
  s.head_dim = 100;
  try {
    s.validate();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--head-dim 100"), std::string::npos) << e.what();
  }
}

TEST(SweepCandidates, ReferenceIsFixedAndNeverRepeated) {
  const KernelConfig base = attention::default_config(DeviceLimits::for_arch("sm90"), 128);
  const KernelConfig ref = reference_config(base);
  // sm90's base runs the tma backward, whose only tile is its plans': the reference is the
  // wgmma 64x64 backward there; elsewhere the base's own path.
  EXPECT_EQ(base.backward_path, BackwardPath::tma);
  EXPECT_EQ(ref.str(), "fwd=64x64/128 bwd=64x64/128/wgmma");
  KernelConfig mma_base = base;
  mma_base.backward_path = BackwardPath::double_buffered;
  EXPECT_EQ(reference_config(mma_base).str(), "fwd=64x64/128 bwd=64x64/128/double");
  for (const std::string arch : {"sm80", "sm86", "sm90"}) {
    const KernelConfig arch_base = attention::default_config(DeviceLimits::for_arch(arch), 128);
    for (const Candidate& c : candidates_for(arch, SweepAxis::both)) {
      EXPECT_NE(c.config, reference_config(arch_base)) << arch << " " << c.config.str();
    }
  }
  // On sm86 the default is the reference: the reference row stands for both.
  const DeviceLimits sm86 = DeviceLimits::for_arch("sm86");
  const KernelConfig base86 = attention::default_config(sm86, 128);
  EXPECT_EQ(reference_candidate(base86, hero_problem(), sm86).role, "ref=base");
}

TEST(SweepCandidates, OneAxisAtATimeWithTheBaseFirst) {
  const KernelConfig base = attention::default_config(DeviceLimits::for_arch("sm90"), 128);
  const std::vector<Candidate> fwd = candidates_for("sm90", SweepAxis::forward);
  ASSERT_FALSE(fwd.empty());
  EXPECT_EQ(fwd[0].config, base);
  EXPECT_EQ(fwd[0].role, "base");
  // Every forward tile once (the base's own forward tile is the base row).
  EXPECT_EQ(fwd.size(), attention::sweep_forward_tiles(attention::ForwardPath::mma).size() +
                            attention::sweep_forward_tiles(attention::ForwardPath::wgmma).size() +
                            attention::sweep_tma_plans(128).size());
  for (const Candidate& c : fwd) {
    EXPECT_EQ(c.config.backward, base.backward) << c.config.str();
    EXPECT_EQ(c.config.backward_path, base.backward_path);
  }
  const std::vector<Candidate> bwd = candidates_for("sm90", SweepAxis::backward);
  // The base's path (tma on sm90) has its own backward tiles: its plans' for head dim 128 (the
  // 64x192 and 128x128 plans are head dim 64's only).
  EXPECT_EQ(bwd.size(), attention::sweep_tma_backward_plans(128).size());
  EXPECT_LT(bwd.size(), attention::sweep_backward_tiles(base.backward_path).size());
  for (const Candidate& c : bwd) EXPECT_EQ(c.config.forward, base.forward) << c.config.str();
  const std::vector<Candidate> both = candidates_for("sm90", SweepAxis::both);
  EXPECT_EQ(both.size(), fwd.size() + bwd.size() - 1);
  std::set<std::string> seen;
  for (size_t i = 0; i < both.size(); ++i) {
    EXPECT_EQ(both[i].index, static_cast<int>(i));
    EXPECT_TRUE(seen.insert(both[i].config.str()).second) << both[i].config.str();
  }
  // Every path: the axes once per path, the base once.
  const std::vector<Candidate> paths =
      candidates_for("sm90", SweepAxis::both, attention::all_backward_paths());
  // The base's path (tma) once, then each other path: every forward tile with the path's first
  // backward tile (the base's tile is not one of theirs), then its other backward tiles: 12 for
  // each mma path (6 tiles x {128, 256} threads); on the wgmma path the forward 64x64 with the
  // backward 64x64 is the reference, listed once, apart.
  const size_t mma_bwd = attention::sweep_backward_tiles(BackwardPath::double_buffered).size();
  EXPECT_EQ(mma_bwd, 12u);
  const size_t wgmma_bwd = attention::sweep_backward_tiles(BackwardPath::wgmma).size();
  EXPECT_EQ(paths.size(),
            both.size() + 2 * (fwd.size() + mma_bwd - 1) + fwd.size() + wgmma_bwd - 2);
}

// The tma backward's candidates are its plans, so a tile with plans of several Q/dO ring depths
// is timed at each (the text names the depth of every plan but the tile's first).
TEST(SweepCandidates, EveryTmaBackwardPlanOfTheHeadDimOnce) {
  const DeviceLimits sm90 = DeviceLimits::for_arch("sm90");
  for (int64_t d : attention::tma_backward_head_dims()) {
    attention::Problem p = hero_problem();
    p.head_dim = d;
    const KernelConfig base = attention::default_config(sm90, p);
    const std::vector<Candidate> bwd =
        make_candidates(SweepAxis::backward, {BackwardPath::tma}, base, p, sm90);
    const std::vector<attention::TmaBackwardPlan> plans = attention::sweep_tma_backward_plans(d);
    ASSERT_EQ(bwd.size(), plans.size()) << d;
    for (const attention::TmaBackwardPlan& plan : plans) {
      const KernelConfig want = attention::with_tma_backward(base, plan);
      const Candidate* c = find(bwd, want.str());
      ASSERT_NE(c, nullptr) << want.str();
      const attention::TmaBackwardPlan* found = attention::find_tma_backward_plan(c->config, d);
      ASSERT_NE(found, nullptr) << want.str();
      EXPECT_TRUE(*found == plan) << want.str();
    }
  }
}

TEST(SweepCandidates, RefusalsCarryCanImplementsReasons) {
  const std::vector<Candidate> sm90 =
      candidates_for("sm90", SweepAxis::both, attention::all_backward_paths());
  const Candidate* warps = find(sm90, "fwd=128x128/384/tma/s2/nopp bwd=64x64/256/double");
  ASSERT_NE(warps, nullptr);
  EXPECT_NE(warps->refused.find("warps must split"), std::string::npos) << warps->refused;
  const Candidate* smem = find(sm90, "fwd=128x128/384/tma/s2/nopp bwd=256x64/128/double");
  ASSERT_NE(smem, nullptr);
  EXPECT_NE(smem->refused.find("shared memory"), std::string::npos) << smem->refused;
  const Candidate* single = find(sm90, "fwd=128x128/384/tma/s2/nopp bwd=256x64/128/single");
  ASSERT_NE(single, nullptr);
  EXPECT_EQ(single->refused.find("shared memory"), std::string::npos) << single->refused;

  // sm86's smaller shared memory refuses more, for that reason.
  auto smem_refusals = [](const std::vector<Candidate>& list) {
    return std::count_if(list.begin(), list.end(), [](const Candidate& c) {
      return c.refused.find("shared memory") != std::string::npos;
    });
  };
  const std::vector<Candidate> sm86 =
      candidates_for("sm86", SweepAxis::both, attention::all_backward_paths());
  EXPECT_GT(smem_refusals(sm86), smem_refusals(sm90));
  const Candidate* big = find(sm86, "fwd=128x128/256 bwd=64x64/128/single");
  ASSERT_NE(big, nullptr);
  EXPECT_NE(big->refused.find("101376"), std::string::npos) << big->refused;
}

TEST(SweepCandidates, ShardsPartitionTheList) {
  const std::vector<Candidate> all =
      candidates_for("sm90", SweepAxis::both, attention::all_backward_paths());
  for (int n = 1; n <= 5; ++n) {
    std::multiset<int> indices;
    for (int i = 0; i < n; ++i) {
      for (const Candidate& c : select_shard(all, i, n)) {
        EXPECT_EQ(c.index % n, i);
        indices.insert(c.index);
      }
    }
    ASSERT_EQ(indices.size(), all.size()) << n;
    for (const Candidate& c : all) EXPECT_EQ(indices.count(c.index), 1u) << n;
  }
  EXPECT_THROW(select_shard(all, 3, 2), Error);
  EXPECT_THROW(select_shard(all, -1, 2), Error);
  EXPECT_THROW(select_shard(all, 0, 0), Error);
}

TEST(SweepCandidates, AxisNamesAndFamilies) {
  EXPECT_EQ(parse_axis("forward"), SweepAxis::forward);
  EXPECT_EQ(parse_axis("backward"), SweepAxis::backward);
  EXPECT_EQ(parse_axis("both"), SweepAxis::both);
  EXPECT_THROW(parse_axis("sideways"), Error);
  EXPECT_EQ(attention::arch_family(90), "sm90");
  EXPECT_EQ(attention::arch_family(89), "sm86");
  EXPECT_EQ(attention::arch_family(80), "sm80");
  EXPECT_EQ(attention::arch_family(120), "sm120");
}

TEST(SweepOptionsTest, BadFlagsFailWithTheValue) {
  auto message = [](const SweepOptions& o) {
    try {
      o.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  SweepOptions o;
  EXPECT_EQ(message(o), "");
  o.axis = "sideways";
  EXPECT_NE(message(o).find("sideways"), std::string::npos);
  o = {};
  o.shard = 3;
  o.num_shards = 2;
  EXPECT_NE(message(o).find("--shard 3"), std::string::npos);
  o = {};
  o.backward_path = "triple";
  EXPECT_NE(message(o).find("triple"), std::string::npos);
  o = {};
  o.backward_path = "single";
  o.all_paths = true;
  EXPECT_NE(message(o).find("--all-paths"), std::string::npos);
  o = {};
  o.gpus = "some";
  EXPECT_NE(message(o).find("--gpus"), std::string::npos);
  o = {};
  o.gpus = "all";
  o.device = 1;
  EXPECT_NE(message(o).find("--device"), std::string::npos);
  o = {};
  o.arch = "sm90";
  EXPECT_NE(message(o).find("--dry-run"), std::string::npos);
  o.dry_run = true;
  o.arch = "sm42";
  EXPECT_NE(message(o).find("sm42"), std::string::npos);
  o = {};
  o.iters = 0;
  EXPECT_NE(message(o).find("--iters"), std::string::npos);
}

TEST(SweepPlanTest, DryRunListsReferenceAndEveryCandidate) {
  SweepOptions o;
  o.dry_run = true;
  o.arch = "sm90";
  const SweepPlan plan = plan_sweep(o, sweep_gpus(o));
  EXPECT_EQ(plan.header.gpus.size(), 1u);
  EXPECT_EQ(plan.header.gpus[0].smem_per_block, 232448);
  const std::vector<SweepRow> rows = dry_run_rows(plan);
  ASSERT_EQ(rows.size(), plan.candidates.size() + 1);
  EXPECT_EQ(rows[0].index, -1);
  for (const SweepRow& r : rows) {
    EXPECT_EQ(r.status, r.reason.empty() ? RowStatus::planned : RowStatus::refused);
    EXPECT_FALSE(r.timed);
  }
  o.shard = 1;
  o.num_shards = 3;
  const SweepPlan shard = plan_sweep(o, sweep_gpus(o));
  for (const Candidate& c : shard.candidates) EXPECT_EQ(c.index % 3, 1);
}

TEST(SweepWorker, JobJsonRoundTrips) {
  WorkerJob job;
  job.shape.batch = 2;
  job.shape.window = 7;
  job.mask_key = "causal";
  job.config = KernelConfig::parse("fwd=128x64/256 bwd=128x128/128/single");
  job.reference = KernelConfig::parse("fwd=64x64/128 bwd=64x64/128/single");
  job.is_reference = false;
  job.pair_with_reference = false;
  job.check_dir = "/tmp/some dir";
  job.device = 3;
  job.warmup = 2;
  job.iters = 9;
  job.rounds = 4;
  job.time_failing = true;
  job.seed = 77;
  job.fault = "abort";
  const WorkerJob back = job_from_json(nlohmann::json::parse(job_to_json(job).dump()));
  EXPECT_EQ(back.shape.batch, 2);
  EXPECT_EQ(back.shape.window, 7);
  EXPECT_EQ(back.mask_key, "causal");
  EXPECT_EQ(back.config, job.config);
  EXPECT_EQ(back.reference, job.reference);
  EXPECT_FALSE(back.pair_with_reference);
  EXPECT_EQ(back.check_dir, job.check_dir);
  EXPECT_EQ(back.device, 3);
  EXPECT_EQ(back.iters, 9);
  EXPECT_EQ(back.rounds, 4);
  EXPECT_TRUE(back.time_failing);
  EXPECT_EQ(back.seed, 77u);
  EXPECT_EQ(back.fault, "abort");
}

TEST(SweepWorker, HowAWorkerEndedBecomesTheRow) {
  ChildOutcome clean;
  clean.exit_code = 0;
  SweepRow ok;
  ok.config = KernelConfig::parse("fwd=64x64/128 bwd=64x64/128/double");
  ok.status = RowStatus::checked;
  const SweepRow got = row_from_worker_output(row_to_json(ok).dump(), clean, 60);
  EXPECT_EQ(got.status, RowStatus::checked);

  ChildOutcome crashed;
  crashed.signal = 6;
  crashed.last_line = "flash.cu:123: something went wrong";
  const SweepRow crash = row_from_worker_output("", crashed, 60);
  EXPECT_EQ(crash.status, RowStatus::error);
  EXPECT_NE(crash.verdict().find("ERROR: worker killed by signal 6"), std::string::npos)
      << crash.verdict();
  EXPECT_NE(crash.verdict().find("something went wrong"), std::string::npos);

  ChildOutcome slow;
  slow.timed_out = true;
  slow.signal = 9;
  EXPECT_NE(row_from_worker_output("", slow, 60).verdict().find("timed out after 60 s"),
            std::string::npos);

  // A worker that caught its error reports it itself (exit code 3).
  SweepRow failed = ok;
  failed.status = RowStatus::error;
  failed.reason = "CUDA error: an illegal memory access was encountered";
  ChildOutcome three;
  three.exit_code = 3;
  EXPECT_EQ(row_from_worker_output(row_to_json(failed).dump(), three, 60).verdict(),
            "ERROR: CUDA error: an illegal memory access was encountered");
  // A clean result line followed by a crash (e.g. in teardown) is still an error.
  EXPECT_EQ(row_from_worker_output(row_to_json(ok).dump(), crashed, 60).status, RowStatus::error);
  EXPECT_EQ(row_from_worker_output("{not json", clean, 60).status, RowStatus::error);
}

TEST(SweepChildProcess, LinesExitCodesSignalsAndTimeouts) {
  std::vector<std::string> lines;
  const ChildOutcome out =
      run_child({"/bin/sh", "-c", "echo one; echo two >&2; printf three; exit 4"}, 30,
                [&](const std::string& line) { lines.push_back(line); });
  EXPECT_EQ(out.exit_code, 4);
  EXPECT_EQ(lines, (std::vector<std::string>{"one", "two", "three"}));
  EXPECT_EQ(out.last_line, "three");
  EXPECT_EQ(out.describe(30), "exit code 4");

  const ChildOutcome killed =
      run_child({"/bin/sh", "-c", "kill -SEGV $$"}, 30, [](const std::string&) {});
  EXPECT_EQ(killed.signal, 11);
  EXPECT_FALSE(killed.exited_cleanly());

  const ChildOutcome hung =
      run_child({"/bin/sh", "-c", "exec sleep 30"}, 0.5, [](const std::string&) {});
  EXPECT_TRUE(hung.timed_out);
  EXPECT_NE(hung.describe(0.5).find("timed out"), std::string::npos);

  EXPECT_THROW(run_child({"/nonexistent/flashtrain"}, 5, [](const std::string&) {}), Error);
}

}  // namespace
}  // namespace ft::sweep

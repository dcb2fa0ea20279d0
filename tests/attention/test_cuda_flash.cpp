// CUDA flash attention against the fp64 CPU reference: o, lse, dq, dk, dv on fresh random inputs
// over S in {1, 7, 64, 100, 513, 1000}, Hq/Hkv in {1, 2, 4, 8}, every head dim and each mask
// alone and combined (segments with padding, packed and interleaved). fp32: relative error
// <= 1e-5. bf16: at most 2x the error of the CUDA naive bf16 baseline on the same inputs (+ a
// small floor), for EVERY compiled kernel configuration that can_implement accepts (the default,
// each compiled forward tile and path (mma, wgmma) with the default backward, each compiled
// backward tile and path (single, double, wgmma, tma) with the default forward, and each compiled
// plan of the tma forward path). Beyond the grid: S > 16384 and non-default scales (one negative)
// against the CUDA naive fp32 run. The device pool is
// filled with NaN before every run: an element a kernel forgets to write fails. Never NaN or Inf;
// padding rows exactly zero, lse -inf. Configurations that can_implement refuses must fail with its
// reason, launching nothing. Skips itself without a CUDA build or a GPU.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "attention/kernel_config.h"
#include "attention_test_util.h"
#include "core/graph.h"
#include "core/npy.h"
#include "cuda_test_util.h"
#include "tensor_test_util.h"
#include "test_util.h"

namespace ft::attention::testing {
namespace {

using test::same_bits;

class CudaFlashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string why = gpu_unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

// Outputs and scratch of one flash forward + backward (plus slack), in bytes.
int64_t flash_bytes(const Problem& p) {
  const int64_t rows = p.batch * p.seq_len * p.q_heads * p.head_dim;
  return 4 * 12 * rows + (16 << 20);
}

int64_t naive_bytes(const Problem& p) {
  const int64_t squares = p.batch * p.q_heads * p.seq_len * p.seq_len;
  return 8 * squares + flash_bytes(p);
}

struct Errors {
  double o, lse, dq, dk, dv;
};

Errors errors_of(const std::string& what, const Inputs& in, const GpuResult& r,
                 const ForwardOutput& ref, const Gradients& ref_grads) {
  SCOPED_TRACE(what);
  EXPECT_TRUE(all_finite(r.fwd.o)) << "o";
  EXPECT_TRUE(all_finite(r.grads.dq)) << "dq";
  EXPECT_TRUE(all_finite(r.grads.dk)) << "dk";
  EXPECT_TRUE(all_finite(r.grads.dv)) << "dv";
  EXPECT_EQ(max_abs_on_padding(r.fwd.o, in.segment_ids), 0.0) << "o on padding rows";
  EXPECT_EQ(max_abs_on_padding(r.grads.dq, in.segment_ids), 0.0) << "dq on padding rows";
  EXPECT_EQ(max_abs_on_padding(r.grads.dk, in.segment_ids), 0.0) << "dk on padding rows";
  EXPECT_EQ(max_abs_on_padding(r.grads.dv, in.segment_ids), 0.0) << "dv on padding rows";
  const LseError lse = lse_error(r.fwd.lse, ref.lse);
  EXPECT_EQ(lse.mismatched, 0) << "lse -inf/NaN where the reference differs";
  return {error_vs(r.fwd.o, ref.o), lse.relative, error_vs(r.grads.dq, ref_grads.dq),
          error_vs(r.grads.dk, ref_grads.dk), error_vs(r.grads.dv, ref_grads.dv)};
}

class CudaFlashAccuracy : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    const std::string why = gpu_unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(CudaFlashAccuracy, Fp32MatchesReference) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c.shapes, c.mask(), DType::f32, 2468, c.scattered);
  const ForwardOutput ref = forward(Impl::reference, in.problem, in.q, in.k, in.v, in.segment_ids);
  const Gradients ref_grads =
      backward(Impl::reference, in.problem, in.q, in.k, in.v, ref, in.dout, in.segment_ids);
  const GpuResult r = run_on_gpu(Impl::flash, in, c.segments_on_gpu, flash_bytes(in.problem));
  const Errors e = errors_of("cuda flash fp32", in, r, ref, ref_grads);
  std::printf("cuda flash fp32 %s: o %.2e lse %.2e dq %.2e dk %.2e dv %.2e\n", c.name, e.o, e.lse,
              e.dq, e.dk, e.dv);
  constexpr double kTolerance = 1e-5;
  EXPECT_LE(e.o, kTolerance);
  EXPECT_LE(e.lse, kTolerance);
  EXPECT_LE(e.dq, kTolerance);
  EXPECT_LE(e.dk, kTolerance);
  EXPECT_LE(e.dv, kTolerance);
}

TEST_P(CudaFlashAccuracy, Bf16WithinTwiceNaiveForEveryConfig) {
  const Case& c = GetParam();
  const Inputs in = make_inputs(c.shapes, c.mask(), DType::bf16, 1357, c.scattered);
  const DeviceLimits& device = DeviceLimits::current();
  const std::string refused =
      can_implement(default_config(device, in.problem.head_dim), in.problem, device);
  if (!refused.empty()) {
    // Head dims without compiled kernels are refused with the reason, before any launch.
    EXPECT_NE(refused.find("head dim"), std::string::npos) << refused;
    const Tensor q = in.q.to(Device::cuda), k = in.k.to(Device::cuda), v = in.v.to(Device::cuda);
    expect_error([&] { forward(Impl::flash, in.problem, q, k, v, in.segment_ids); },
                 {"cannot run", "head dim"});
    return;
  }
  // The reference sees exactly the bf16-rounded inputs (widened to fp64).
  const ForwardOutput ref = forward(Impl::reference, in.problem, in.q, in.k, in.v, in.segment_ids);
  const Gradients ref_grads =
      backward(Impl::reference, in.problem, in.q, in.k, in.v, ref, in.dout, in.segment_ids);
  const GpuResult naive_run =
      run_on_gpu(Impl::naive, in, c.segments_on_gpu, naive_bytes(in.problem));
  const Errors naive = errors_of("cuda naive bf16", in, naive_run, ref, ref_grads);
  // Floor: where the baseline is exact (S = 1: o = v) "2x" would demand exactness; 1e-4 is ~40x
  // below bf16's relative resolution (2^-8), so it cannot hide a real error.
  constexpr double kFloor = 1e-4;
  constexpr double kBf16Bound = 2e-2;  // a few bf16 ulps: a shared bug cannot pass by being equal
  for (const KernelConfig& config : configs_under_test(in.problem)) {
    const GpuResult r =
        run_on_gpu(Impl::flash, in, c.segments_on_gpu, flash_bytes(in.problem), &config);
    const Errors e = errors_of("cuda flash bf16 " + config.str(), in, r, ref, ref_grads);
    const std::pair<const char*, std::pair<double, double>> pairs[] = {{"o", {naive.o, e.o}},
                                                                       {"lse", {naive.lse, e.lse}},
                                                                       {"dq", {naive.dq, e.dq}},
                                                                       {"dk", {naive.dk, e.dk}},
                                                                       {"dv", {naive.dv, e.dv}}};
    std::printf("cuda flash bf16 %s [%s], flash/naive error:", c.name, config.str().c_str());
    for (const auto& [name, x] : pairs) std::printf(" %s %.2e/%.2e", name, x.second, x.first);
    std::printf("\n");
    for (const auto& [name, x] : pairs) {
      EXPECT_LE(x.second, 2.0 * x.first + kFloor)
          << name << " [" << config.str() << "]: flash " << x.second << " naive " << x.first;
      EXPECT_LE(x.second, kBf16Bound) << name << " [" << config.str() << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, CudaFlashAccuracy, ::testing::ValuesIn(gpu_accuracy_cases()),
                         [](const ::testing::TestParamInfo<Case>& param_info) {
                           return std::string(param_info.param.name);
                         });

// Problems too large for the CPU reference: flash (each configuration given) against the CUDA
// naive fp32 run on the same bf16-rounded inputs, with the CUDA naive bf16 run as the error
// yardstick. With `gradients` false the gradients' errors are printed, not checked.
void check_against_naive_fp32(const std::string& what, const Inputs& in,
                              const std::vector<KernelConfig>& configs, bool gradients = true) {
  Inputs in32 = in;
  in32.q = in.q.to(DType::f32);
  in32.k = in.k.to(DType::f32);
  in32.v = in.v.to(DType::f32);
  in32.dout = in.dout.to(DType::f32);
  in32.problem.dtype = DType::f32;
  const bool seg = in.segment_ids.defined();
  const GpuResult want = run_on_gpu(Impl::naive, in32, seg, naive_bytes(in32.problem));
  const GpuResult naive = run_on_gpu(Impl::naive, in, seg, naive_bytes(in.problem));
  const Tensor* wants[] = {&want.fwd.o, &want.grads.dq, &want.grads.dk, &want.grads.dv};
  const Tensor* naives[] = {&naive.fwd.o, &naive.grads.dq, &naive.grads.dk, &naive.grads.dv};
  const char* names[] = {"o", "dq", "dk", "dv"};
  for (const KernelConfig& config : configs) {
    SCOPED_TRACE(what + " [" + config.str() + "]");
    const GpuResult flash = run_on_gpu(Impl::flash, in, seg, flash_bytes(in.problem), &config);
    const Tensor* flashes[] = {&flash.fwd.o, &flash.grads.dq, &flash.grads.dk, &flash.grads.dv};
    for (int i = 0; i < 4; ++i) {
      const double naive_error = error_vs(*naives[i], *wants[i]);
      const double flash_error = error_vs(*flashes[i], *wants[i]);
      std::printf("%s [%s] %s: flash %.2e naive %.2e\n", what.c_str(), config.str().c_str(),
                  names[i], flash_error, naive_error);
      EXPECT_TRUE(all_finite(*flashes[i])) << names[i];
      if (i == 0 || gradients) {
        EXPECT_LE(flash_error, 2.0 * naive_error + 1e-4) << names[i];
      }
    }
    EXPECT_EQ(lse_error(flash.fwd.lse, want.fwd.lse).mismatched, 0);
    EXPECT_LE(lse_error(flash.fwd.lse, want.fwd.lse).relative, 1e-3);
  }
}

TEST_F(CudaFlashTest, LargeBf16ProblemMatchesNaiveFp32) {
  Mask mask;
  mask.causal = true;
  mask.window = 300;
  mask.has_segments = true;
  const Inputs in = make_inputs({2, 2048, 8, 2, 128}, mask, DType::bf16, 99);
  check_against_naive_fp32("large bf16", in, configs_under_test(in.problem));
}

// Past 16384 positions (a partial last tile, 129 query blocks of 128), causal with GQA.
TEST_F(CudaFlashTest, VeryLongBf16ProblemMatchesNaiveFp32) {
  Mask mask;
  mask.causal = true;
  const Inputs in = make_inputs({1, 16448, 2, 1, 128}, mask, DType::bf16, 5);
  check_against_naive_fp32("s16448 bf16", in, configs_under_test(in.problem));
}

// Rows of more key tiles than a tma forward plan's segment table holds (128 tiles of 80 keys at
// head dim 256 with 80-key tiles: 10240 positions) classify their key tiles one by one, on both
// sides of the pipeline; documents and causal at 10400 positions, every compiled configuration.
TEST_F(CudaFlashTest, RowsLongerThanTheSegmentTableMatchNaiveFp32) {
  Mask mask;
  mask.causal = true;
  mask.has_segments = true;
  const Inputs in = make_inputs({1, 10400, 2, 1, 256}, mask, DType::bf16, 31);
  check_against_naive_fp32("s10400 segments d256", in, configs_under_test(in.problem));
}

// The tma backward runs its blocks in groups of (batch, kv head) pairs sized by the L2, the last
// group holding at least two waves of blocks (on an H200, 60 MiB of L2 and 132 SMs, these twelve
// pairs of 8 MiB of Q and dO and 32 key blocks go as one group of 3 and a last group of 9) and,
// in deterministic mode, in one group of every pair; both orders must cover every key block
// exactly once.
TEST_F(CudaFlashTest, TmaBackwardGroupsOfPairsCoverEveryKeyBlock) {
  const DeviceLimits& device = DeviceLimits::current();
  Mask mask;
  mask.causal = true;
  const Inputs plain = make_inputs({12, 4096, 4, 1, 128}, mask, DType::bf16, 17);
  KernelConfig config = default_config(device, plain.problem);
  config.backward = {64, 128, 384};
  config.backward_path = BackwardPath::tma;
  const std::string refused = can_implement(config, plain.problem, device);
  if (!refused.empty()) GTEST_SKIP() << refused;
  check_against_naive_fp32("tma backward, groups of pairs", plain, {config});
  Inputs deterministic = plain;
  deterministic.problem.deterministic = true;
  check_against_naive_fp32("tma backward, deterministic", deterministic, {config});
}

// Blocks that walk several work tiles: each tile's Q slot, softmax state and output store are
// reused by the next, and a tile whose keys the mask hides entirely, or the last tile of a
// block, ends alone. 8 x 8 heads of 600 positions (a partial last query tile) are two or more
// tiles a block at the 128- and 192-row plans and 1.6 or more at the 64-row ones (two or three
// blocks an SM); dense, every mask together, and a negative scale (the other branch of the
// softmax), at every head dim. (At 1000 positions and six cases it took 113 s of an H100 call.)
TEST_F(CudaFlashTest, TmaForwardBlocksOfSeveralWorkTilesMatchNaiveFp32) {
  struct MaskCase {
    const char* name;
    bool causal;
    int64_t window;
    bool segments;
    double scale;  // 0: 1 / sqrt(D)
  };
  const MaskCase cases[] = {{"dense", false, 0, false, 0.0},
                            {"all", true, 150, true, 0.0},
                            {"causal, negative scale", true, 0, false, -0.1}};
  for (const int64_t head_dim : {64, 128, 256}) {
    for (const MaskCase& c : cases) {
      Mask mask;
      mask.causal = c.causal;
      mask.window = c.window;
      mask.has_segments = c.segments;
      Inputs in = make_inputs({8, 600, 8, 2, head_dim}, mask, DType::bf16, 41);
      in.problem.scale = c.scale;
      check_against_naive_fp32(ft::str("several tiles a block d", head_dim, " ", c.name), in,
                               configs_under_test(in.problem));
    }
  }
}

// The tma forward's blocks claim their work tiles from a counter of the stream (the default) or
// take TileOrder's static deal (FT_TMA_DEAL=static): each tile is computed the same way by
// whichever block takes it, so both give the same bits. 4 x 8 heads of 1500 positions are two or
// more work tiles a block at every plan (claims past the first), causal, and a window with
// documents (tiles the documents hide). Four claimed forwards queued back to back, with no
// synchronisation between them, give the same bits too: each launch finds the counters that the
// one before left at zero.
TEST_F(CudaFlashTest, TmaForwardClaimedWorkTilesGiveTheDealtBits) {
  const DeviceLimits& device = DeviceLimits::current();
  struct DealScope {  // FT_TMA_DEAL while the scope lasts; unset after it, as the suite runs
    explicit DealScope(const char* deal) { setenv("FT_TMA_DEAL", deal, 1); }
    ~DealScope() { unsetenv("FT_TMA_DEAL"); }
  };
  int tested = 0;
  for (const TmaForwardPlan& plan : compiled_kernels().tma_forward) {
    for (const bool documents : {false, true}) {
      Mask mask;
      mask.causal = true;
      mask.window = documents ? 300 : 0;
      mask.has_segments = documents;
      const Inputs in = make_inputs({4, 1500, 8, 2, plan.head_dim}, mask, DType::bf16, 23);
      const KernelConfig config =
          with_tma_forward(default_config(device, in.problem.head_dim), plan);
      if (!can_implement(config, in.problem, device, KernelDirection::forward).empty()) continue;
      SCOPED_TRACE(config.forward_str() + " " + mask.describe());
      const Tensor q = in.q.to(Device::cuda), k = in.k.to(Device::cuda), v = in.v.to(Device::cuda);
      const Tensor seg = documents ? in.segment_ids.to(Device::cuda) : Tensor();
      ForwardOutput dealt;
      {
        const DealScope deal("static");
        dealt = forward(Impl::flash, in.problem, q, k, v, seg, &config);
      }
      std::vector<ForwardOutput> claimed;
      for (int run = 0; run < 4; ++run) {
        claimed.push_back(forward(Impl::flash, in.problem, q, k, v, seg, &config));
      }
      for (const ForwardOutput& c : claimed) {
        EXPECT_TRUE(same_bits(c.o, dealt.o));
        EXPECT_TRUE(same_bits(c.lse, dealt.lse));
      }
      ++tested;
    }
  }
  if (tested == 0) GTEST_SKIP() << "no tma forward plan runs on " << device.arch;
  // A value other than the two is refused with the choices.
  const TmaForwardPlan& plan = compiled_kernels().tma_forward.front();
  const Inputs in = make_inputs({1, 256, 4, 2, plan.head_dim}, {}, DType::bf16, 3);
  const KernelConfig config = with_tma_forward(default_config(device, plan.head_dim), plan);
  ASSERT_EQ(can_implement(config, in.problem, device, KernelDirection::forward), "");
  const Tensor q = in.q.to(Device::cuda), k = in.k.to(Device::cuda), v = in.v.to(Device::cuda);
  const DealScope deal("dynamic");
  expect_error([&] { forward(Impl::flash, in.problem, q, k, v, {}, &config); },
               {"FT_TMA_DEAL", "claims", "static"});
}

// A tma forward captured into a CUDA graph claims its work tiles with the counters of the stream
// the graph replays on (the launches before it on that stream made them), and each replay leaves
// them at zero for the next launch, captured or not: replays with eager forwards between them
// give the eager forward's bits.
TEST_F(CudaFlashTest, TmaForwardClaimsInACudaGraphGiveTheEagerBits) {
  const DeviceLimits& device = DeviceLimits::current();
  Mask mask;
  mask.causal = true;
  const Inputs in = make_inputs({4, 1500, 8, 2, 128}, mask, DType::bf16, 29);
  const KernelConfig config = default_config(device, in.problem);
  if (config.forward_path != ForwardPath::tma) GTEST_SKIP() << "no tma forward on " << device.arch;
  const Tensor q = in.q.to(Device::cuda), k = in.k.to(Device::cuda), v = in.v.to(Device::cuda);
  const ForwardOutput eager = forward(Impl::flash, in.problem, q, k, v, {}, &config);
  ForwardOutput captured;
  const DeviceGraph graph = DeviceGraph::capture(
      Device::cuda, [&] { captured = forward(Impl::flash, in.problem, q, k, v, {}, &config); });
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE(ft::str("replay ", replay));
    graph.replay();
    const ForwardOutput between = forward(Impl::flash, in.problem, q, k, v, {}, &config);
    EXPECT_TRUE(same_bits(captured.o, eager.o));
    EXPECT_TRUE(same_bits(captured.lse, eager.lse));
    EXPECT_TRUE(same_bits(between.o, eager.o));
    EXPECT_TRUE(same_bits(between.lse, eager.lse));
  }
}

// Scores that rise far above a row's maximum after its first key tiles: the keys of the second
// half of the sequence are 8 times longer, so that with a scale of 0.5 their scaled scores (log2
// units, standard deviation ~65) rise past the first half's maxima by more than 64 (the tma
// forward's exponentials without the tile's maximum then take the exact step again) and by more
// than 128 (where they overflow to inf first). Dense and causal, at head dims 64 and 128, every
// compiled configuration: the output and lse against the fp32 reference as everywhere. The
// gradients are printed, not checked: rows this sharp are nearly one-hot, so dS = P (dP - D) is a
// difference of nearly equal terms, with D = rowsum(dO * O) from the bf16 O (every flash
// backward), and the 8 times longer keys multiply its error into dq and dk, whichever forward
// ran: on an H100 (session 58) dq and dk reached 3.2x and 3.1x the naive bf16 error after the
// exact step everywhere, 3.6x and 3.5x with the exponentials without the tile's maximum
// (docs/PERF.md). The grid checks the gradients.
TEST_F(CudaFlashTest, ScoresRisingFarAboveTheRowMaximumMatchNaiveFp32) {
  for (const bool causal : {false, true}) {
    for (const int64_t head_dim : {64, 128}) {
      Mask mask;
      mask.causal = causal;
      Inputs in = make_inputs({2, 1000, 4, 2, head_dim}, mask, DType::bf16, 57);
      Tensor k = in.k.to(DType::f32);
      float* keys = k.data<float>();
      const int64_t row = in.k.dim(2) * head_dim;  // elements of one position
      for (int64_t b = 0; b < in.k.dim(0); ++b) {
        for (int64_t i = in.k.dim(1) / 2; i < in.k.dim(1); ++i) {
          float* at = keys + (b * in.k.dim(1) + i) * row;
          for (int64_t e = 0; e < row; ++e) at[e] *= 8.0f;
        }
      }
      in.k = k.to(DType::bf16);
      in.problem.scale = 0.5;
      check_against_naive_fp32(ft::str("rising scores d", head_dim, causal ? " causal" : ""), in,
                               configs_under_test(in.problem), /*gradients=*/false);
    }
  }
}

// Scales other than 1 / sqrt(D): larger, smaller and negative (the largest scaled score then
// comes from the smallest raw one), with every mask.
TEST_F(CudaFlashTest, NonDefaultScalesMatchNaiveFp32) {
  Mask mask;
  mask.causal = true;
  mask.window = 200;
  mask.has_segments = true;
  for (const double scale : {0.3, 0.02, -0.2}) {
    for (const int64_t head_dim : {64, 128, 256}) {
      Inputs in = make_inputs({2, 1000, 4, 2, head_dim}, mask, DType::bf16, 21);
      in.problem.scale = scale;
      check_against_naive_fp32(ft::str("scale ", scale, " d", head_dim), in,
                               configs_under_test(in.problem));
    }
  }
}

// Same inputs, same bits in fp32 (no atomics there); bf16 dQ sums with atomics, so only closeness.
TEST_F(CudaFlashTest, Fp32IsDeterministic) {
  Mask mask;
  mask.causal = true;
  mask.has_segments = true;
  const Inputs in = make_inputs({2, 300, 8, 2, 64}, mask, DType::f32, 77);
  const GpuResult a = run_on_gpu(Impl::flash, in, true, flash_bytes(in.problem));
  const GpuResult b = run_on_gpu(Impl::flash, in, false, flash_bytes(in.problem));
  for (const auto& [x, y] :
       {std::pair{&a.fwd.o, &b.fwd.o}, std::pair{&a.fwd.lse, &b.fwd.lse},
        std::pair{&a.grads.dq, &b.grads.dq}, std::pair{&a.grads.dk, &b.grads.dk},
        std::pair{&a.grads.dv, &b.grads.dv}}) {
    ASSERT_EQ(x->nbytes(), y->nbytes());
    EXPECT_EQ(std::memcmp(x->raw(), y->raw(), x->nbytes()), 0);
  }
}

// The tma backward in deterministic mode: three runs on the same inputs give the same bits of
// dq, dk and dv (the dQ parts of many key blocks meet in every query tile: S = 1000 is 8 key
// blocks, GQA adds each query head of a group), and stay within the accuracy bound against the
// naive fp32 run. Masks: none, causal, and causal + window + segments (tiles the segments hide
// still take their turn; the window moves the first key block of a query tile). Other bf16
// backward paths refuse the mode with the reason.
TEST_F(CudaFlashTest, TmaBackwardDeterministicModeGivesTheSameBits) {
  const DeviceLimits& device = DeviceLimits::current();
  int tested = 0;
  for (const TmaBackwardPlan& plan : compiled_kernels().tma_backward_plans) {
    for (int m = 0; m < 3; ++m) {
      Mask mask;
      mask.causal = m > 0;
      mask.window = m == 2 ? 300 : 0;
      mask.has_segments = m == 2;
      Inputs in = make_inputs({2, 1000, 8, 2, plan.head_dim}, mask, DType::bf16, 41 + m);
      in.problem.deterministic = true;
      KernelConfig config = default_config(device, in.problem);
      config.backward = {plan.block_m, plan.block_n, plan.threads()};
      config.backward_path = BackwardPath::tma;
      const std::string refused = can_implement(config, in.problem, device);
      if (!refused.empty()) {
        std::printf("skipped [%s]: %s\n", config.str().c_str(), refused.c_str());
        continue;
      }
      const std::string what = ft::str("deterministic d", plan.head_dim, " ", mask.describe());
      SCOPED_TRACE(what);
      const GpuResult first =
          run_on_gpu(Impl::flash, in, mask.has_segments, flash_bytes(in.problem), &config);
      for (int run = 1; run < 3; ++run) {
        const GpuResult again =
            run_on_gpu(Impl::flash, in, mask.has_segments, flash_bytes(in.problem), &config);
        for (const auto& [name, x, y] : {std::tuple{"dq", &first.grads.dq, &again.grads.dq},
                                         std::tuple{"dk", &first.grads.dk, &again.grads.dk},
                                         std::tuple{"dv", &first.grads.dv, &again.grads.dv}}) {
          ASSERT_EQ(x->nbytes(), y->nbytes());
          EXPECT_EQ(std::memcmp(x->raw(), y->raw(), x->nbytes()), 0) << name << ", run " << run;
        }
      }
      check_against_naive_fp32(what, in, {config});
      ++tested;
    }
  }
  if (tested == 0) GTEST_SKIP() << "no tma backward plan runs on " << device.arch;
  // A path that adds dQ in any order refuses the mode before any launch.
  Inputs in = make_inputs({1, 64, 4, 2, 64}, {}, DType::bf16, 3);
  in.problem.deterministic = true;
  KernelConfig wgmma = default_config(device, in.problem);
  wgmma.backward = {64, 64, 128};
  wgmma.backward_path = BackwardPath::wgmma;
  const Tensor q = in.q.to(Device::cuda), k = in.k.to(Device::cuda), v = in.v.to(Device::cuda);
  const ForwardOutput f = forward(Impl::flash, in.problem, q, k, v, {}, &wgmma);
  expect_error(
      [&] { backward(Impl::flash, in.problem, q, k, v, f, in.dout.to(Device::cuda), {}, &wgmma); },
      {"cannot run", "deterministic", "tma"});
}

TEST_F(CudaFlashTest, RefusedConfigsFailWithTheReason) {
  const Inputs in = make_inputs({1, 64, 4, 2, 64}, {}, DType::bf16, 3);
  const Tensor q = in.q.to(Device::cuda), k = in.k.to(Device::cuda), v = in.v.to(Device::cuda);
  KernelConfig bad_threads = default_config(DeviceLimits::current(), 64);
  bad_threads.forward = {64, 64, 96};  // 3 warps cannot split 64 rows into 16 or 32
  bad_threads.forward_path = ForwardPath::mma;
  expect_error([&] { forward(Impl::flash, in.problem, q, k, v, {}, &bad_threads); },
               {"cannot run", "64x64/96", "warps"});
  KernelConfig too_big = default_config(DeviceLimits::current(), 64);
  too_big.backward = {256, 256, 256};
  const ForwardOutput f = forward(Impl::flash, in.problem, q, k, v);
  expect_error(
      [&] {
        backward(Impl::flash, in.problem, q, k, v, f, in.dout.to(Device::cuda), {}, &too_big);
      },
      {"cannot run", "256x256/256"});
  if (!compiled_kernels().sweep_set) {
    KernelConfig not_compiled = default_config(DeviceLimits::current(), 64);
    not_compiled.forward = {256, 64, 256};
    not_compiled.forward_path = ForwardPath::mma;
    expect_error([&] { forward(Impl::flash, in.problem, q, k, v, {}, &not_compiled); },
                 {"not compiled", "FLASHTRAIN_SWEEP_KERNELS=ON"});
  }
}

// `flashtrain attention --device cuda --impl flash` end to end: .npy in, .npy out, --check.
TEST_F(CudaFlashTest, CliRunsOnTheGpu) {
  ft::test::TempDir dir;
  Rng rng(12);
  const Tensor q = random_tensor({2, 96, 4, 64}, DType::f32, rng);
  npy::save(dir.file("q.npy"), q);
  npy::save(dir.file("k.npy"), random_tensor({2, 96, 2, 64}, DType::f32, rng));
  npy::save(dir.file("v.npy"), random_tensor({2, 96, 2, 64}, DType::f32, rng));
  npy::save(dir.file("do.npy"), random_tensor({2, 96, 4, 64}, DType::f32, rng));
  npy::save(dir.file("seg.npy"), make_segment_ids(2, 96, rng));
  for (const char* dtype : {"fp32", "bf16"}) {
    SCOPED_TRACE(dtype);
    const ft::test::CommandResult run = ft::test::run_cli(
        std::string("attention --device cuda --impl flash --causal --window 40 --check") +
        " --dtype " + dtype + " --q " + dir.file("q.npy") + " --k " + dir.file("k.npy") + " --v " +
        dir.file("v.npy") + " --do " + dir.file("do.npy") + " --segment-ids " +
        dir.file("seg.npy") + " --out-dir " + dir.file(std::string("out_") + dtype));
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_NE(run.output.find("attention flash on cuda"), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("NOT FINITE"), std::string::npos) << run.output;
    const Tensor o = npy::load(dir.file(std::string("out_") + dtype + "/o.npy"));
    EXPECT_EQ(o.shape(), q.shape());
    for (const char* name : {"o ", "dq", "dk", "dv"}) {
      const size_t at = run.output.find(std::string("check ") + name);
      ASSERT_NE(at, std::string::npos) << run.output;
      const size_t colon = run.output.find(':', at);
      const double error = std::stod(run.output.substr(colon + 1));
      EXPECT_LE(error, std::string(dtype) == "fp32" ? 1e-5 : 2e-2) << name << run.output;
    }
  }
}

}  // namespace
}  // namespace ft::attention::testing

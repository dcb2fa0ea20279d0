// The check problem end to end on the CPU: the parent's fp64 reference survives the trip
// through .npy files, and the verdict passes the CPU flash bf16 path against the CPU naive bf16
// yardstick while it fails a result with one wrong gradient (the same logic the GPU worker
// applies to each candidate).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attention/attention.h"
#include "sweep/check.h"
#include "sweep/check_data.h"
#include "test_util.h"

namespace ft::sweep {
namespace {

using attention::Impl;

SweepShape small_shape() {
  SweepShape s;
  s.q_heads = 4;
  s.kv_heads = 2;
  s.head_dim = 32;
  s.window = 512;
  s.documents = 5;
  return s;
}

std::vector<Tensor> run_cpu(Impl impl, const CheckData& d) {
  const attention::ForwardOutput f =
      attention::forward(impl, d.problem, d.q, d.k, d.v, d.segment_ids);
  const attention::Gradients g =
      attention::backward(impl, d.problem, d.q, d.k, d.v, f, d.dout, d.segment_ids);
  return {f.o, g.dq, g.dk, g.dv};
}

std::vector<TensorCheck> judge(const std::vector<Tensor>& got, const std::vector<Tensor>& naive,
                               const CheckData& d) {
  const std::vector<Tensor> ref = {d.out, d.dq, d.dk, d.dv};
  std::vector<TensorCheck> checks;
  for (size_t i = 0; i < ref.size(); ++i) {
    checks.push_back(check_tensor(checked_tensor_names()[i], got[i], ref[i],
                                  relative_error_vs(naive[i], ref[i])));
  }
  return checks;
}

TEST(SweepCheckData, SavedAndLoadedUnchanged) {
  const SweepShape shape = small_shape();
  const SweepMask mask = sweep_masks(shape).front();
  const CheckData d = make_check_data(shape, mask, 42);
  EXPECT_EQ(d.q.dtype(), DType::bf16);
  EXPECT_EQ(d.out.dtype(), DType::f64);
  ASSERT_TRUE(d.segment_ids.defined());
  test::TempDir dir;
  save_check_data(dir.path().string(), mask, d);
  const CheckData back = load_check_data(dir.path().string(), shape, mask);
  EXPECT_EQ(max_abs_diff(back.q, d.q), 0.0);
  EXPECT_EQ(max_abs_diff(back.dout, d.dout), 0.0);
  EXPECT_EQ(max_abs_diff(back.dv, d.dv), 0.0);
  EXPECT_EQ(back.problem.mask.window, d.problem.mask.window);
  // A worker with another shape is told, not fed the wrong data.
  SweepShape other = shape;
  other.q_heads = 8;
  EXPECT_THROW(load_check_data(dir.path().string(), other, mask), Error);
}

TEST(SweepCheckData, FlashPassesAndAWrongGradientFails) {
  const SweepShape shape = small_shape();
  for (const SweepMask& mask : sweep_masks(shape)) {
    SCOPED_TRACE(mask.key);
    const CheckData d = make_check_data(shape, mask, 7);
    const std::vector<Tensor> naive = run_cpu(Impl::naive, d);
    const std::vector<Tensor> flash = run_cpu(Impl::flash, d);
    EXPECT_EQ(verdict_text(judge(flash, naive, d)), "ok");
    EXPECT_EQ(verdict_text(judge(naive, naive, d)), "ok");

    // dk off by 10%: still "close" for a loose eye, but far beyond 2x the bf16 baseline.
    std::vector<Tensor> wrong = flash;
    Tensor dk = wrong[2].to(DType::f32);
    for (int64_t i = 0; i < dk.numel(); ++i) dk.data<float>()[i] *= 1.1f;
    wrong[2] = dk;
    EXPECT_EQ(verdict_text(judge(wrong, naive, d)), "FAIL:dk");
  }
}

}  // namespace
}  // namespace ft::sweep

// Softmax cross-entropy over padded logits and the sampling softmax: finite-difference
// gradients in fp64, padding handling, aliasing, stability, fp32/bf16 agreement, bad inputs.
#include <gtest/gtest.h>

#include <cmath>

#include "grad_check.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

constexpr int64_t kN = 5, kV = 5, kVp = 8;
constexpr double kDloss = 0.37;

Tensor targets() {
  return tokens_of({kN}, {0, 4, 2, 2, 1});
}

Tensor ce_losses(const Tensor& logits, const Tensor& tgt, int64_t V) {
  Tensor losses = poisoned({logits.dim(0)}, acc_dtype(logits.dtype())), none;
  softmax_cross_entropy(losses, none, logits, tgt, V, 1.0);
  return losses;
}

double sum_of(const Tensor& t) {
  double s = 0;
  const Tensor t64 = t.to(DType::f64);
  for (int64_t i = 0; i < t.numel(); ++i) s += t64.data<double>()[i];
  return s;
}

// L = dloss * sum(losses): the gradient the fused kernel writes when given dloss.
TEST(CrossEntropy, GradientsWithPaddingColumns) {
  Tensor logits = randn({kN, kVp}, 1, DType::f64, 2.0);
  const Tensor tgt = targets();
  auto loss = [&] { return kDloss * sum_of(ce_losses(logits, tgt, kV)); };
  Tensor losses = poisoned({kN}, DType::f64), dlogits = poisoned({kN, kVp});
  softmax_cross_entropy(losses, dlogits, logits, tgt, kV, kDloss);
  expect_close(dlogits, numeric_grad(logits, loss), kGradTol, "dlogits");
  for (int64_t r = 0; r < kN; ++r) {
    for (int64_t j = kV; j < kVp; ++j) EXPECT_EQ(dlogits.data<double>()[r * kVp + j], 0.0);
  }
}

TEST(CrossEntropy, LossMatchesLogSoftmax) {
  const Tensor logits = randn({kN, kVp}, 2, DType::f64, 3.0), tgt = targets();
  const Tensor losses = ce_losses(logits, tgt, kV);
  for (int64_t r = 0; r < kN; ++r) {
    double z = 0;
    for (int64_t j = 0; j < kV; ++j) z += std::exp(logits.data<double>()[r * kVp + j]);
    const double want = std::log(z) - logits.data<double>()[r * kVp + tgt.data<int32_t>()[r]];
    EXPECT_NEAR(losses.data<double>()[r], want, 1e-12);
  }
}

// Equal logits give ln V whatever the padding columns hold, and huge logits stay finite.
TEST(CrossEntropy, UniformLogitsGiveLnVAndLargeLogitsAreStable) {
  for (double level : {0.0, 1000.0, -1000.0}) {
    Tensor logits = Tensor::empty({kN, kVp}, DType::f32);
    for (int64_t r = 0; r < kN; ++r) {
      for (int64_t j = 0; j < kVp; ++j) logits.data<float>()[r * kVp + j] = j < kV ? level : 1e4f;
    }
    const Tensor losses = ce_losses(logits, targets(), kV);
    for (int64_t r = 0; r < kN; ++r) {
      EXPECT_NEAR(losses.data<float>()[r], std::log(static_cast<double>(kV)), 1e-5) << level;
    }
  }
}

TEST(CrossEntropy, DlogitsMayAliasLogits) {
  const Tensor logits = randn({kN, kVp}, 3, DType::f32), tgt = targets();
  Tensor losses = poisoned({kN}, DType::f32), dlogits = poisoned({kN, kVp}, DType::f32);
  softmax_cross_entropy(losses, dlogits, logits, tgt, kV, kDloss);
  Tensor inplace = logits.clone(), losses2 = poisoned({kN}, DType::f32);
  softmax_cross_entropy(losses2, inplace, inplace, tgt, kV, kDloss);
  EXPECT_EQ(max_abs_diff(inplace, dlogits), 0.0);
  EXPECT_EQ(max_abs_diff(losses2, losses), 0.0);
}

TEST(CrossEntropy, LowPrecisionAgreesWithFp64) {
  const int64_t N = 16, V = 50, Vp = 64;
  Tensor tgt = Tensor::empty({N}, DType::i32);
  for (int64_t i = 0; i < N; ++i) tgt.data<int32_t>()[i] = static_cast<int32_t>((7 * i) % V);
  auto forward = [&](const std::vector<Tensor>& in) {
    Tensor losses = poisoned({N}, acc_dtype(in[0].dtype()));
    Tensor dlogits = poisoned({N, Vp}, in[0].dtype());
    softmax_cross_entropy(losses, dlogits, in[0], tgt, V, 1.0);
    return dlogits;
  };
  expect_fp32_and_bf16_agree({randn({N, Vp}, 4, DType::f64, 2.0)}, forward, "dlogits");
  auto loss_only = [&](const std::vector<Tensor>& in) { return ce_losses(in[0], tgt, V); };
  const Tensor logits = randn({N, Vp}, 5, DType::f64, 2.0);
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor low = logits.to(dt);
    const double tol = dt == DType::f32 ? kFp32Tol : kBf16Tol;
    expect_close(loss_only({low}), loss_only({low.to(DType::f64)}), tol, dtype_name(dt));
  }
}

TEST(CrossEntropy, BadInputsThrow) {
  const Tensor logits = randn({kN, kVp}, 6);
  Tensor losses = Tensor::empty({kN}, DType::f64), none;
  EXPECT_THROW(
      softmax_cross_entropy(losses, none, logits, tokens_of({kN}, {0, 1, 2, 3, kV}), kV, 1.0),
      Error);
  EXPECT_THROW(softmax_cross_entropy(losses, none, logits, targets(), kVp + 1, 1.0), Error);
  EXPECT_THROW(softmax_cross_entropy(losses, none, logits, tokens_of({2}, {0, 1}), kV, 1.0), Error);
  Tensor short_losses = Tensor::empty({kN - 1}, DType::f64);
  EXPECT_THROW(softmax_cross_entropy(short_losses, none, logits, targets(), kV, 1.0), Error);
  Tensor f32_losses = Tensor::empty({kN}, DType::f64).to(DType::f32);
  EXPECT_THROW(softmax_cross_entropy(f32_losses, none, logits, targets(), kV, 1.0), Error);
  Tensor wrong_d = Tensor::empty({kN, kV}, DType::f64);
  EXPECT_THROW(softmax_cross_entropy(losses, wrong_d, logits, targets(), kV, 1.0), Error);
}

// ---- sampling softmax ----

TEST(SoftmaxRow, MatchesFormulaWithTemperature) {
  const Tensor logits = randn({3, kVp}, 7, DType::f32, 2.0);
  std::vector<float> probs;
  softmax_row(probs, logits, 1, kV, 0.5);
  ASSERT_EQ(static_cast<int64_t>(probs.size()), kV);
  double z = 0, total = 0;
  for (int64_t j = 0; j < kV; ++j) z += std::exp(logits.data<float>()[kVp + j] / 0.5);
  for (int64_t j = 0; j < kV; ++j) {
    EXPECT_NEAR(probs[j], std::exp(logits.data<float>()[kVp + j] / 0.5) / z, 1e-6);
    total += probs[j];
  }
  EXPECT_NEAR(total, 1.0, 1e-6);
  EXPECT_THROW(softmax_row(probs, logits, 3, kV, 1.0), Error);
  EXPECT_THROW(softmax_row(probs, logits, 0, kV, 0.0), Error);
}

}  // namespace
}  // namespace ft::nn

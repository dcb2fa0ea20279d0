// LayerNorm and RMSNorm: finite-difference gradients in fp64, forward statistics, fp32/bf16
// agreement with fp64, accumulation of parameter gradients, bad shapes.
#include <gtest/gtest.h>

#include <cmath>

#include "grad_check.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

constexpr int64_t kB = 2, kT = 3, kC = 6;
constexpr double kEps = 1e-5;

struct NormOut {
  Tensor out, mean, rstd;
};

NormOut layernorm(const Tensor& x, const Tensor& w, const Tensor& b) {
  const int64_t rows = x.numel() / x.dim(-1);
  NormOut r{poisoned(x.shape(), x.dtype()), poisoned({rows}, acc_dtype(x.dtype())),
            poisoned({rows}, acc_dtype(x.dtype()))};
  layernorm_forward(r.out, r.mean, r.rstd, x, w, b, kEps);
  return r;
}

NormOut rmsnorm(const Tensor& x, const Tensor& w) {
  const int64_t rows = x.numel() / x.dim(-1);
  NormOut r{poisoned(x.shape(), x.dtype()), Tensor(), poisoned({rows}, acc_dtype(x.dtype()))};
  rmsnorm_forward(r.out, r.rstd, x, w, kEps);
  return r;
}

TEST(LayerNorm, Gradients) {
  Tensor x = randn({kB, kT, kC}, 1, DType::f64, 2.0), w = randn({kC}, 2), b = randn({kC}, 3);
  const Tensor R = randn({kB, kT, kC}, 4);
  auto loss = [&] { return dot(layernorm(x, w, b).out, R); };
  const NormOut fwd = layernorm(x, w, b);
  Tensor dx = poisoned(x.shape());
  Tensor dw = Tensor::zeros({kC}, DType::f64), db = Tensor::zeros({kC}, DType::f64);
  layernorm_backward(dx, dw, db, R, x, w, fwd.mean, fwd.rstd);
  layernorm_backward(dx, dw, db, R, x, w, fwd.mean, fwd.rstd);
  expect_close(dx, numeric_grad(x, loss), kGradTol, "dx");
  expect_close(dw, scaled(numeric_grad(w, loss), 2.0), kGradTol, "dw (x2)");
  expect_close(db, scaled(numeric_grad(b, loss), 2.0), kGradTol, "db (x2)");
}

// With w = 1, b = 0 each row has mean 0 and variance 1 (up to eps), and the saved statistics
// are the row's mean and 1/std.
TEST(LayerNorm, ForwardNormalisesRows) {
  const Tensor x = randn({kB * kT, 64}, 5, DType::f64, 3.0);
  Tensor w = Tensor::empty({64}, DType::f64), b = Tensor::zeros({64}, DType::f64);
  w.fill(1.0);
  const NormOut r = layernorm(x, w, b);
  for (int64_t row = 0; row < kB * kT; ++row) {
    double mean = 0, var = 0, x_mean = 0;
    for (int64_t c = 0; c < 64; ++c) {
      mean += r.out.data<double>()[row * 64 + c] / 64;
      x_mean += x.data<double>()[row * 64 + c] / 64;
    }
    for (int64_t c = 0; c < 64; ++c) {
      const double d = r.out.data<double>()[row * 64 + c] - mean;
      var += d * d / 64;
    }
    EXPECT_NEAR(mean, 0.0, 1e-12);
    EXPECT_NEAR(var, 1.0, 1e-5);  // eps = 1e-5 against a variance of ~9
    EXPECT_NEAR(r.mean.data<double>()[row], x_mean, 1e-12);
  }
}

// The affine part is applied after normalisation: out = norm * w + b.
TEST(LayerNorm, AffineAppliedPerColumn) {
  const Tensor x = randn({4, kC}, 6), w = randn({kC}, 7), b = randn({kC}, 8);
  Tensor ones = Tensor::empty({kC}, DType::f64), zeros = Tensor::zeros({kC}, DType::f64);
  ones.fill(1.0);
  const Tensor plain = layernorm(x, ones, zeros).out, affine = layernorm(x, w, b).out;
  for (int64_t i = 0; i < 4 * kC; ++i) {
    const int64_t c = i % kC;
    EXPECT_NEAR(affine.data<double>()[i],
                plain.data<double>()[i] * w.data<double>()[c] + b.data<double>()[c], 1e-12);
  }
}

TEST(LayerNorm, LowPrecisionAgreesWithFp64) {
  expect_fp32_and_bf16_agree(
      {randn({kB, kT, 48}, 9), randn({48}, 10), randn({48}, 11)},
      [](const std::vector<Tensor>& in) { return layernorm(in[0], in[1], in[2]).out; },
      "layernorm");
}

TEST(LayerNorm, BadShapesThrow) {
  const Tensor x = randn({kB, kT, kC}, 12), w = randn({kC}, 13), b = randn({kC}, 14);
  NormOut r = layernorm(x, w, b);
  EXPECT_THROW(layernorm_forward(r.out, r.mean, r.rstd, x, randn({kC + 1}, 15), b, kEps), Error);
  Tensor short_mean = Tensor::empty({kB}, DType::f64);
  EXPECT_THROW(layernorm_forward(r.out, short_mean, r.rstd, x, w, b, kEps), Error);
  Tensor f32_rstd = Tensor::empty({kB * kT}, DType::f32);
  EXPECT_THROW(layernorm_forward(r.out, r.mean, f32_rstd, x, w, b, kEps), Error);
  Tensor dx = Tensor::empty({kB, kT, kC + 1}, DType::f64), dw, db;
  EXPECT_THROW(layernorm_backward(dx, dw, db, x, x, w, r.mean, r.rstd), Error);
}

// ---- RMSNorm ----

TEST(RmsNorm, Gradients) {
  Tensor x = randn({kB, kT, kC}, 20), w = randn({kC}, 21);
  const Tensor R = randn({kB, kT, kC}, 22);
  auto loss = [&] { return dot(rmsnorm(x, w).out, R); };
  const NormOut fwd = rmsnorm(x, w);
  Tensor dx = poisoned(x.shape());
  Tensor dw = Tensor::zeros({kC}, DType::f64);
  rmsnorm_backward(dx, dw, R, x, w, fwd.rstd);
  rmsnorm_backward(dx, dw, R, x, w, fwd.rstd);
  expect_close(dx, numeric_grad(x, loss), kGradTol, "dx");
  expect_close(dw, scaled(numeric_grad(w, loss), 2.0), kGradTol, "dw (x2)");
}

// With w = 1 every row has mean square 1 (up to eps), and rstd = 1 / rms(x).
TEST(RmsNorm, ForwardHasUnitMeanSquare) {
  const Tensor x = randn({5, 32}, 23, DType::f64, 2.0);
  Tensor w = Tensor::empty({32}, DType::f64);
  w.fill(1.0);
  const NormOut r = rmsnorm(x, w);
  for (int64_t row = 0; row < 5; ++row) {
    double ms = 0, x_ms = 0;
    for (int64_t c = 0; c < 32; ++c) {
      const double o = r.out.data<double>()[row * 32 + c], v = x.data<double>()[row * 32 + c];
      ms += o * o / 32;
      x_ms += v * v / 32;
    }
    EXPECT_NEAR(ms, 1.0, 1e-5);
    EXPECT_NEAR(r.rstd.data<double>()[row], 1.0 / std::sqrt(x_ms + kEps), 1e-12);
  }
}

TEST(RmsNorm, LowPrecisionAgreesWithFp64) {
  expect_fp32_and_bf16_agree(
      {randn({kB, kT, 48}, 24), randn({48}, 25)},
      [](const std::vector<Tensor>& in) { return rmsnorm(in[0], in[1]).out; }, "rmsnorm");
}

TEST(RmsNorm, BadShapesThrow) {
  const Tensor x = randn({kB, kT, kC}, 26), w = randn({kC}, 27);
  NormOut r = rmsnorm(x, w);
  EXPECT_THROW(rmsnorm_forward(r.out, r.rstd, x, randn({kC - 1}, 28), kEps), Error);
  Tensor wrong_out = Tensor::empty({kB, kT}, DType::f64);
  EXPECT_THROW(rmsnorm_forward(wrong_out, r.rstd, x, w, kEps), Error);
  Tensor dx, dw_f32 = Tensor::zeros({kC}, DType::f32);
  EXPECT_THROW(rmsnorm_backward(dx, dw_f32, x, x, w, r.rstd), Error);
}

}  // namespace
}  // namespace ft::nn

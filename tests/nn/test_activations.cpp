// GELU, SwiGLU and add: finite-difference gradients in fp64, forward formulas, fp32/bf16
// agreement with fp64, in-place use, bad shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "grad_check.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

const Shape kShape{2, 3, 5};

Tensor gelu(const Tensor& x) {
  Tensor out = poisoned(x.shape(), x.dtype());
  gelu_forward(out, x);
  return out;
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  Tensor out = poisoned(gate.shape(), gate.dtype());
  swiglu_forward(out, gate, up);
  return out;
}

TEST(Gelu, Gradients) {
  Tensor x = randn(kShape, 1, DType::f64, 2.0);
  const Tensor R = randn(kShape, 2);
  auto loss = [&] { return dot(gelu(x), R); };
  Tensor dx = poisoned(kShape);
  gelu_backward(dx, R, x);
  expect_close(dx, numeric_grad(x, loss), kGradTol, "dx");
}

TEST(Gelu, ForwardMatchesTanhFormula) {
  const Tensor x = randn(kShape, 3, DType::f64, 3.0);
  const Tensor out = gelu(x);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double v = x.data<double>()[i];
    const double want =
        0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (v + 0.044715 * v * v * v)));
    EXPECT_NEAR(out.data<double>()[i], want, 1e-14);
  }
  // Far from zero GELU is the identity on the right and zero on the left.
  Tensor big = Tensor::empty({2}, DType::f64);
  big.data<double>()[0] = 10.0;
  big.data<double>()[1] = -10.0;
  const Tensor g = gelu(big);
  EXPECT_NEAR(g.data<double>()[0], 10.0, 1e-12);
  EXPECT_NEAR(g.data<double>()[1], 0.0, 1e-12);
}

TEST(Gelu, LowPrecisionAgreesWithFp64) {
  expect_fp32_and_bf16_agree(
      {randn({4, 64}, 4, DType::f64, 2.0)},
      [](const std::vector<Tensor>& in) { return gelu(in[0]); }, "gelu");
}

TEST(Gelu, BackwardInPlaceOnDout) {
  const Tensor x = randn(kShape, 5), R = randn(kShape, 6);
  Tensor expected = poisoned(kShape);
  gelu_backward(expected, R, x);
  Tensor inplace = R.clone();
  gelu_backward(inplace, inplace, x);
  EXPECT_EQ(max_abs_diff(inplace, expected), 0.0);
}

TEST(SwiGlu, Gradients) {
  Tensor gate = randn(kShape, 10, DType::f64, 2.0), up = randn(kShape, 11);
  const Tensor R = randn(kShape, 12);
  auto loss = [&] { return dot(swiglu(gate, up), R); };
  Tensor dgate = poisoned(kShape), dup = poisoned(kShape);
  swiglu_backward(dgate, dup, R, gate, up);
  expect_close(dgate, numeric_grad(gate, loss), kGradTol, "dgate");
  expect_close(dup, numeric_grad(up, loss), kGradTol, "dup");
}

TEST(SwiGlu, ForwardMatchesFormula) {
  const Tensor gate = randn(kShape, 13, DType::f64, 3.0), up = randn(kShape, 14);
  const Tensor out = swiglu(gate, up);
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const double g = gate.data<double>()[i], u = up.data<double>()[i];
    EXPECT_NEAR(out.data<double>()[i], g / (1.0 + std::exp(-g)) * u, 1e-14);
  }
}

TEST(SwiGlu, LowPrecisionAgreesWithFp64) {
  expect_fp32_and_bf16_agree(
      {randn({4, 64}, 15, DType::f64, 2.0), randn({4, 64}, 16)},
      [](const std::vector<Tensor>& in) { return swiglu(in[0], in[1]); }, "swiglu");
}

TEST(SwiGlu, SkipsUndefinedGradients) {
  const Tensor gate = randn(kShape, 17), up = randn(kShape, 18), R = randn(kShape, 19);
  Tensor dgate = poisoned(kShape), dup_all = poisoned(kShape), none;
  swiglu_backward(dgate, none, R, gate, up);
  Tensor dgate_all = poisoned(kShape);
  swiglu_backward(dgate_all, dup_all, R, gate, up);
  EXPECT_EQ(max_abs_diff(dgate, dgate_all), 0.0);
}

TEST(Activations, BadShapesThrow) {
  const Tensor x = randn(kShape, 20);
  Tensor wrong = Tensor::empty({2, 3, 4}, DType::f64);
  EXPECT_THROW(gelu_forward(wrong, x), Error);
  Tensor f32 = Tensor::empty(kShape, DType::f32);
  EXPECT_THROW(gelu_forward(f32, x), Error);
  Tensor out = Tensor::empty(kShape, DType::f64);
  EXPECT_THROW(swiglu_forward(out, x, randn({2, 3, 4}, 21)), Error);
  Tensor dgate = Tensor::empty({5}, DType::f64), none;
  EXPECT_THROW(swiglu_backward(dgate, none, x, x, x), Error);
}

// ---- add ----

TEST(Add, GradientsAndValues) {
  Tensor a = randn(kShape, 30), b = randn(kShape, 31);
  const Tensor R = randn(kShape, 32);
  auto sum = [](const Tensor& x, const Tensor& y) {
    Tensor out = poisoned(x.shape(), x.dtype());
    add(out, x, y);
    return out;
  };
  auto loss = [&] { return dot(sum(a, b), R); };
  // d(a + b)/da = d(a + b)/db = identity: both gradients equal R.
  expect_close(numeric_grad(a, loss), R, kGradTol, "da");
  expect_close(numeric_grad(b, loss), R, kGradTol, "db");
  const Tensor out = sum(a, b);
  for (int64_t i = 0; i < a.numel(); ++i) {
    EXPECT_DOUBLE_EQ(out.data<double>()[i], a.data<double>()[i] + b.data<double>()[i]);
  }
  expect_fp32_and_bf16_agree(
      {a, b}, [&](const std::vector<Tensor>& in) { return sum(in[0], in[1]); }, "add");
}

TEST(Add, OutputMayAliasInput) {
  Tensor a = randn(kShape, 33);
  const Tensor b = randn(kShape, 34);
  Tensor expected = Tensor::empty(kShape, DType::f64);
  add(expected, a, b);
  add(a, a, b);
  EXPECT_EQ(max_abs_diff(a, expected), 0.0);
}

TEST(Add, BadShapesThrow) {
  const Tensor a = randn(kShape, 35);
  Tensor out = Tensor::empty(kShape, DType::f64);
  EXPECT_THROW(add(out, a, randn({2, 15}, 36)), Error);
  EXPECT_THROW(add(out, a, randn(kShape, 37, DType::f32)), Error);
}

}  // namespace
}  // namespace ft::nn

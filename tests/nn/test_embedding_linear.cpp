// Embedding and linear layers: finite-difference gradients in fp64, forward formulas,
// fp32/bf16 agreement with fp64, accumulation of parameter gradients, determinism, bad shapes.
#include <gtest/gtest.h>

#include "gemm_bound.h"
#include "grad_check.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

constexpr int64_t kB = 2, kT = 3, kC = 4, kV = 5, kMaxT = 4;

// Token 1 appears three times and token 3 twice, so the backward must sum repeated rows.
Tensor repeated_tokens() {
  return tokens_of({kB, kT}, {1, 3, 1, 0, 1, 3});
}

Tensor embed(const Tensor& tokens, const Tensor& wte, const Tensor& wpe) {
  Tensor out = poisoned({tokens.dim(0), tokens.dim(1), wte.dim(1)}, wte.dtype());
  embedding_forward(out, tokens, wte, wpe);
  return out;
}

void check_embedding_grads(bool with_wpe) {
  const Tensor tokens = repeated_tokens();
  Tensor wte = randn({kV, kC}, 1);
  Tensor wpe = with_wpe ? randn({kMaxT, kC}, 2) : Tensor();
  const Tensor R = randn({kB, kT, kC}, 3);
  auto loss = [&] { return dot(embed(tokens, wte, wpe), R); };

  Tensor dwte = Tensor::zeros(wte.shape(), DType::f64);
  Tensor dwpe = with_wpe ? Tensor::zeros(wpe.shape(), DType::f64) : Tensor();
  embedding_backward(dwte, dwpe, R, tokens);
  embedding_backward(dwte, dwpe, R, tokens);  // parameter grads accumulate
  expect_close(dwte, scaled(numeric_grad(wte, loss), 2.0), kGradTol, "dwte (x2)");
  if (with_wpe) expect_close(dwpe, scaled(numeric_grad(wpe, loss), 2.0), kGradTol, "dwpe (x2)");
}

TEST(Embedding, GradientsWithPositions) {
  check_embedding_grads(true);
}

TEST(Embedding, GradientsWithoutPositions) {
  check_embedding_grads(false);
}

TEST(Embedding, ForwardGathersRows) {
  const Tensor tokens = repeated_tokens();
  const Tensor wte = randn({kV, kC}, 4), wpe = randn({kMaxT, kC}, 5);
  const Tensor out = embed(tokens, wte, wpe);
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t t = 0; t < kT; ++t) {
      const int32_t id = tokens.data<int32_t>()[b * kT + t];
      for (int64_t c = 0; c < kC; ++c) {
        EXPECT_DOUBLE_EQ(out.data<double>()[(b * kT + t) * kC + c],
                         wte.data<double>()[id * kC + c] + wpe.data<double>()[t * kC + c]);
      }
    }
  }
}

TEST(Embedding, LowPrecisionAgreesWithFp64) {
  expect_fp32_and_bf16_agree(
      {repeated_tokens(), randn({kV, kC}, 6), randn({kMaxT, kC}, 7)},
      [](const std::vector<Tensor>& in) { return embed(in[0], in[1], in[2]); }, "embedding");
}

// Bucketed backward on a larger problem equals a plain serial scatter exactly (same order).
TEST(Embedding, BackwardIsDeterministicAndInTokenOrder) {
  const int64_t B = 8, T = 64, C = 96, V = 50;
  Tensor tokens = Tensor::empty({B, T}, DType::i32);
  Rng rng(8);
  for (int64_t i = 0; i < B * T; ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % V);
  }
  const Tensor dout = randn({B, T, C}, 9, DType::f32);
  Tensor dwte = Tensor::zeros({V, C}, DType::f32), dwpe;
  embedding_backward(dwte, dwpe, dout, tokens);
  Tensor serial = Tensor::zeros({V, C}, DType::f32);
  for (int64_t i = 0; i < B * T; ++i) {
    const int32_t id = tokens.data<int32_t>()[i];
    for (int64_t c = 0; c < C; ++c) {
      serial.data<float>()[id * C + c] += dout.data<float>()[i * C + c];
    }
  }
  EXPECT_EQ(max_abs_diff(dwte, serial), 0.0);
}

TEST(Embedding, BadInputsThrow) {
  const Tensor wte = randn({kV, kC}, 10), wpe = randn({kMaxT, kC}, 11);
  Tensor out = Tensor::empty({kB, kT, kC}, DType::f64);
  EXPECT_THROW(embedding_forward(out, tokens_of({kB, kT}, {0, 1, 2, 3, 4, 5}), wte, wpe), Error);
  EXPECT_THROW(embedding_forward(out, tokens_of({kB, kT}, {0, 1, 2, 3, 4, -1}), wte, wpe), Error);
  Tensor long_out = Tensor::empty({1, kMaxT + 1, kC}, DType::f64);
  EXPECT_THROW(embedding_forward(long_out, tokens_of({1, kMaxT + 1}, {0, 0, 0, 0, 0}), wte, wpe),
               Error);
  Tensor wrong_out = Tensor::empty({kB, kT, kC + 1}, DType::f64);
  EXPECT_THROW(embedding_forward(wrong_out, repeated_tokens(), wte, wpe), Error);
  Tensor dwte_wrong_dtype = Tensor::zeros({kV, kC}, DType::f32), none;
  EXPECT_THROW(
      embedding_backward(dwte_wrong_dtype, none, randn({kB, kT, kC}, 12), repeated_tokens()),
      Error);
}

// ---- linear ----

constexpr int64_t kIC = 5, kOC = 3;

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  Tensor out = poisoned({x.dim(0), x.dim(1), w.dim(0)}, x.dtype());
  linear_forward(out, x, w, b);
  return out;
}

void check_linear_grads(bool with_bias) {
  Tensor x = randn({kB, kT, kIC}, 20), w = randn({kOC, kIC}, 21);
  Tensor b = with_bias ? randn({kOC}, 22) : Tensor();
  const Tensor R = randn({kB, kT, kOC}, 23);
  auto loss = [&] { return dot(linear(x, w, b), R); };

  Tensor dx = poisoned(x.shape());
  Tensor dw = Tensor::zeros(w.shape(), DType::f64);
  Tensor db = with_bias ? Tensor::zeros(b.shape(), DType::f64) : Tensor();
  linear_backward(dx, dw, db, R, x, w);
  linear_backward(dx, dw, db, R, x, w);  // dx is written, dw/db accumulate
  expect_close(dx, numeric_grad(x, loss), kGradTol, "dx");
  expect_close(dw, scaled(numeric_grad(w, loss), 2.0), kGradTol, "dw (x2)");
  if (with_bias) expect_close(db, scaled(numeric_grad(b, loss), 2.0), kGradTol, "db (x2)");
}

TEST(Linear, GradientsWithBias) {
  check_linear_grads(true);
}

TEST(Linear, GradientsWithoutBias) {
  check_linear_grads(false);
}

TEST(Linear, ForwardMatchesFormula) {
  const Tensor x = randn({kB, kT, kIC}, 24), w = randn({kOC, kIC}, 25), b = randn({kOC}, 26);
  const Tensor out = linear(x, w, b);
  for (int64_t n = 0; n < kB * kT; ++n) {
    for (int64_t o = 0; o < kOC; ++o) {
      double want = b.data<double>()[o];
      for (int64_t i = 0; i < kIC; ++i) {
        want += x.data<double>()[n * kIC + i] * w.data<double>()[o * kIC + i];
      }
      EXPECT_NEAR(out.data<double>()[n * kOC + o], want, 1e-12);
    }
  }
}

// Holds for any BLAS kernel: each fp32 output is a 33-term sum (32 products and the bias), off
// by at most gamma_33 * sum|terms| in any order (gemm_bound.h); for these inputs
// ||sum|terms| || / ||out|| = 3.36, so the relative norm error is at most 6.6e-6 < kFp32Tol.
// bf16 adds one rounding of each output, at most 2^-8 relative: 3.9e-3 + 6.6e-6 < kBf16Tol.
TEST(Linear, LowPrecisionAgreesWithFp64) {
  expect_fp32_and_bf16_agree(
      {randn({kB, kT, 32}, 27), randn({16, 32}, 28), randn({16}, 29)},
      [](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, "linear");
}

// bf16 weight gradients go to fp32 and accumulate there (not rounded to bf16 in between):
// every element within the fp32 bound of an 8-term sum in any order (gemm_bound.h), which a
// bf16 rounding of a partial sum (2^-8 relative) would exceed by orders of magnitude.
TEST(Linear, Bf16WeightGradientAccumulatesInFp32) {
  const Tensor x = randn({8, 32}, 30).to(DType::bf16), w = randn({16, 32}, 31).to(DType::bf16);
  const Tensor dout = randn({8, 16}, 32).to(DType::bf16);
  Tensor dw = Tensor::zeros({16, 32}, DType::f32), db = Tensor::zeros({16}, DType::f32), none;
  linear_backward(none, dw, db, dout, x, w);
  Tensor dw64 = Tensor::zeros({16, 32}, DType::f64), db64 = Tensor::zeros({16}, DType::f64);
  linear_backward(none, dw64, db64, dout.to(DType::f64), x.to(DType::f64), w.to(DType::f64));
  expect_fp32_gemm_matches_fp64(dw, dw64, abs_product(dout, true, x, false), 8, "dw");
  Tensor db_abs = Tensor::zeros({16}, DType::f64);
  const Tensor d64 = dout.to(DType::f64);
  for (int64_t n = 0; n < 8; ++n)
    for (int64_t o = 0; o < 16; ++o)
      db_abs.data<double>()[o] += std::fabs(d64.data<double>()[n * 16 + o]);
  expect_fp32_gemm_matches_fp64(db, db64, db_abs, 8, "db");
}

TEST(Linear, BadShapesThrow) {
  const Tensor x = randn({kB, kT, kIC}, 33), w = randn({kOC, kIC}, 34);
  Tensor out = Tensor::empty({kB, kT, kOC}, DType::f64), none;
  EXPECT_THROW(linear_forward(out, x, randn({kOC, kIC + 1}, 35), none), Error);
  EXPECT_THROW(linear_forward(out, x, w, randn({kOC + 1}, 36)), Error);
  Tensor wrong_out = Tensor::empty({kB, kT, kOC + 1}, DType::f64);
  EXPECT_THROW(linear_forward(wrong_out, x, w, none), Error);
  Tensor f32_out = Tensor::empty({kB, kT, kOC}, DType::f32);
  EXPECT_THROW(linear_forward(f32_out, x, w, none), Error);
  Tensor dw_wrong = Tensor::zeros({kOC, kIC + 1}, DType::f64);
  EXPECT_THROW(linear_backward(none, dw_wrong, none, randn({kB, kT, kOC}, 37), x, w), Error);
}

}  // namespace
}  // namespace ft::nn

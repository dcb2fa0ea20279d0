// RoPE (with and without Llama 3.1 scaling) and the QKV split/merge: finite-difference
// gradients in fp64, forward properties, fp32/bf16 agreement with fp64, bad shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "grad_check.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

// D = 6 with theta 500000 gives frequencies 1, 1.26e-2 and 1.59e-4 (wavelengths 6, 498,
// 39500), so Llama 3.1 scaling keeps two pairs and slows the third by 8.
constexpr int64_t kB = 2, kT = 4, kH = 2, kD = 6, kMaxT = 8;
constexpr double kTheta = 500000.0;

Tensor rope(const Tensor& x, const RopeTable& table) {
  Tensor out = poisoned(x.shape(), x.dtype());
  rope_forward(out, x, table);
  return out;
}

void check_rope_grads(bool llama31) {
  const RopeTable table = make_rope_table(kMaxT, kD, kTheta, llama31);
  Tensor x = randn({kB, kT, kH, kD}, llama31 ? 1 : 2);
  const Tensor R = randn(x.shape(), 3);
  auto loss = [&] { return dot(rope(x, table), R); };
  Tensor dx = poisoned(x.shape());
  rope_backward(dx, R, table);
  expect_close(dx, numeric_grad(x, loss), kGradTol, "dx");
}

TEST(Rope, Gradients) {
  check_rope_grads(false);
}

TEST(Rope, GradientsWithLlama31Scaling) {
  check_rope_grads(true);
}

// Position 0 is the identity; every pair keeps its norm; pair i at position t is rotated by
// t * theta^(-2i/D).
TEST(Rope, ForwardRotatesInterleavedPairs) {
  const RopeTable table = make_rope_table(kMaxT, kD, kTheta, false);
  const Tensor x = randn({kB, kT, kH, kD}, 4);
  const Tensor out = rope(x, table);
  const double* xp = x.data<double>();
  const double* op = out.data<double>();
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t t = 0; t < kT; ++t) {
      for (int64_t h = 0; h < kH; ++h) {
        for (int64_t i = 0; i < kD / 2; ++i) {
          const int64_t at = ((b * kT + t) * kH + h) * kD + 2 * i;
          const double angle = static_cast<double>(t) * std::pow(kTheta, -2.0 * i / kD);
          const double x0 = xp[at], x1 = xp[at + 1];
          EXPECT_NEAR(op[at], x0 * std::cos(angle) - x1 * std::sin(angle), 1e-12);
          EXPECT_NEAR(op[at + 1], x0 * std::sin(angle) + x1 * std::cos(angle), 1e-12);
          EXPECT_NEAR(std::hypot(op[at], op[at + 1]), std::hypot(x0, x1), 1e-12);
          if (t == 0) {
            EXPECT_EQ(op[at], x0);
          }
        }
      }
    }
  }
}

// Llama 3.1: short wavelengths (< 8192 / 4) keep their frequency, long ones (> 8192) are
// divided by 8, and the band between lies strictly between the two.
TEST(Rope, Llama31ScalingRegimes) {
  const int64_t D = 128, maxT = 2;
  const RopeTable plain = make_rope_table(maxT, D, kTheta, false);
  const RopeTable scaled_table = make_rope_table(maxT, D, kTheta, true);
  int kept = 0, divided = 0, blended = 0;
  for (int64_t i = 0; i < D / 2; ++i) {
    // Row t = 1 holds sin(freq): recover the frequencies (all < pi/2 here, so asin is exact).
    const double f = std::asin(plain.sin.data<double>()[D / 2 + i]);
    const double fs = std::asin(scaled_table.sin.data<double>()[D / 2 + i]);
    ASSERT_NEAR(f, std::pow(kTheta, -2.0 * i / D), 1e-12);
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen < 2048.0) {
      EXPECT_NEAR(fs, f, 1e-15) << i;
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_NEAR(fs, f / 8.0, 1e-15) << i;
      ++divided;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / 3.0;
      EXPECT_NEAR(fs, (1.0 - smooth) * f / 8.0 + smooth * f, 1e-15) << i;
      EXPECT_GT(fs, f / 8.0);
      EXPECT_LT(fs, f);
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
  // cos^2 + sin^2 = 1 everywhere, and position 0 is the identity.
  for (int64_t i = 0; i < D / 2; ++i) {
    EXPECT_EQ(scaled_table.cos.data<double>()[i], 1.0);
    EXPECT_EQ(scaled_table.sin.data<double>()[i], 0.0);
  }
}

TEST(Rope, InPlaceForwardAndBackward) {
  const RopeTable table = make_rope_table(kMaxT, kD, kTheta, true);
  const Tensor x = randn({kB, kT, kH, kD}, 5);
  Tensor y = x.clone();
  rope_forward(y, y, table);
  EXPECT_EQ(max_abs_diff(y, rope(x, table)), 0.0);
  rope_backward(y, y, table);  // the inverse rotation
  EXPECT_LT(max_abs_diff(y, x), 1e-14);
}

TEST(Rope, LowPrecisionAgreesWithFp64) {
  const RopeTable table = make_rope_table(16, 32, kTheta, true);
  expect_fp32_and_bf16_agree(
      {randn({2, 16, 3, 32}, 6)}, [&](const std::vector<Tensor>& in) { return rope(in[0], table); },
      "rope");
}

TEST(Rope, BadShapesThrow) {
  const RopeTable table = make_rope_table(kMaxT, kD, kTheta, false);
  Tensor out = Tensor::empty({1, kMaxT + 1, kH, kD}, DType::f64);
  EXPECT_THROW(rope_forward(out, randn({1, kMaxT + 1, kH, kD}, 7), table), Error);
  Tensor out8 = Tensor::empty({1, 2, kH, 8}, DType::f64);
  EXPECT_THROW(rope_forward(out8, randn({1, 2, kH, 8}, 8), table), Error);
  Tensor out3d = Tensor::empty({2, kH, kD}, DType::f64);
  EXPECT_THROW(rope_forward(out3d, randn({2, kH, kD}, 9), table), Error);
  EXPECT_THROW(make_rope_table(8, 7, kTheta, false), Error);
  EXPECT_THROW(rope_forward(out, randn({1, 2, kH, kD}, 10), RopeTable{}), Error);
}

// ---- split / merge QKV ----

constexpr int64_t kHq = 4, kHkv = 2, kHd = 3;

struct Qkv {
  Tensor q, k, v;
};

Qkv split(const Tensor& qkv) {
  Qkv r{poisoned({kB, kT, kHq, kHd}, qkv.dtype()), poisoned({kB, kT, kHkv, kHd}, qkv.dtype()),
        poisoned({kB, kT, kHkv, kHd}, qkv.dtype())};
  split_qkv(r.q, r.k, r.v, qkv);
  return r;
}

TEST(Qkv, SplitTakesConsecutiveBlocks) {
  const Tensor qkv = randn({kB, kT, (kHq + 2 * kHkv) * kHd}, 20);
  const Qkv s = split(qkv);
  const int64_t row = (kHq + 2 * kHkv) * kHd, qw = kHq * kHd, kw = kHkv * kHd;
  for (int64_t tok = 0; tok < kB * kT; ++tok) {
    const double* src = qkv.data<double>() + tok * row;
    for (int64_t j = 0; j < qw; ++j) EXPECT_EQ(s.q.data<double>()[tok * qw + j], src[j]);
    for (int64_t j = 0; j < kw; ++j) {
      EXPECT_EQ(s.k.data<double>()[tok * kw + j], src[qw + j]);
      EXPECT_EQ(s.v.data<double>()[tok * kw + j], src[qw + kw + j]);
    }
  }
}

TEST(Qkv, MergeIsTheGradientOfSplit) {
  Tensor qkv = randn({kB, kT, (kHq + 2 * kHkv) * kHd}, 21);
  const Tensor Rq = randn({kB, kT, kHq, kHd}, 22), Rk = randn({kB, kT, kHkv, kHd}, 23),
               Rv = randn({kB, kT, kHkv, kHd}, 24);
  auto loss = [&] {
    const Qkv s = split(qkv);
    return dot(s.q, Rq) + dot(s.k, Rk) + dot(s.v, Rv);
  };
  Tensor dqkv = poisoned(qkv.shape());
  merge_qkv(dqkv, Rq, Rk, Rv);
  expect_close(dqkv, numeric_grad(qkv, loss), kGradTol, "dqkv");
}

TEST(Qkv, RoundTripInEveryDtype) {
  for (DType dt : {DType::f32, DType::bf16, DType::f64}) {
    const Tensor qkv = randn({kB, kT, (kHq + 2 * kHkv) * kHd}, 25, dt);
    const Qkv s = split(qkv);
    Tensor back = poisoned(qkv.shape(), dt);
    merge_qkv(back, s.q, s.k, s.v);
    EXPECT_EQ(max_abs_diff(back, qkv), 0.0) << dtype_name(dt);
  }
}

TEST(Qkv, BadShapesThrow) {
  Qkv s = split(randn({kB, kT, (kHq + 2 * kHkv) * kHd}, 26));
  EXPECT_THROW(split_qkv(s.q, s.k, s.v, randn({kB, kT, (kHq + 2 * kHkv) * kHd + 1}, 27)), Error);
  Tensor v_wrong = Tensor::empty({kB, kT, kHkv + 1, kHd}, DType::f64);
  EXPECT_THROW(split_qkv(s.q, s.k, v_wrong, randn({kB, kT, (kHq + 2 * kHkv) * kHd}, 28)), Error);
  Tensor k_f32 = Tensor::empty({kB, kT, kHkv, kHd}, DType::f32);
  Tensor dqkv = Tensor::empty({kB, kT, (kHq + 2 * kHkv) * kHd}, DType::f64);
  EXPECT_THROW(merge_qkv(dqkv, s.q, k_f32, s.v), Error);
}

}  // namespace
}  // namespace ft::nn

namespace ft::nn {
namespace {

// The fused buffer's q and k heads turned in place: rope_forward / rope_backward on the split q
// and k, bit for bit, and v untouched (fp32 and bf16; Hq 4, Hkv 2, head dim 6).
TEST(RopeHeads, InPlaceOnTheFusedBufferGivesTheSplitRotationAndLeavesV) {
  constexpr int64_t Hq = 4, Hkv = 2;
  const RopeTable table = make_rope_table(kMaxT, kD, kTheta, true);
  for (DType dt : {DType::f32, DType::bf16}) {
    const Tensor qkv = randn({kB, kT, (Hq + 2 * Hkv) * kD}, 31).to(dt);
    Tensor q = poisoned({kB, kT, Hq, kD}, dt), k = poisoned({kB, kT, Hkv, kD}, dt),
           v = poisoned({kB, kT, Hkv, kD}, dt);
    split_qkv(q, k, v, qkv);
    for (int direction : {+1, -1}) {
      Tensor fused = qkv.clone();
      Tensor heads = fused.view({kB, kT, Hq + 2 * Hkv, kD});
      Tensor rq = poisoned(q.shape(), dt), rk = poisoned(k.shape(), dt);
      if (direction > 0) {
        rope_forward_heads(heads, table, Hq + Hkv);
        rope_forward(rq, q, table);
        rope_forward(rk, k, table);
      } else {
        rope_backward_heads(heads, table, Hq + Hkv);
        rope_backward(rq, q, table);
        rope_backward(rk, k, table);
      }
      Tensor gq = poisoned(q.shape(), dt), gk = poisoned(k.shape(), dt),
             gv = poisoned(v.shape(), dt);
      split_qkv(gq, gk, gv, fused);
      EXPECT_EQ(max_abs_diff(gq, rq), 0.0) << dtype_name(dt) << " " << direction;
      EXPECT_EQ(max_abs_diff(gk, rk), 0.0) << dtype_name(dt) << " " << direction;
      EXPECT_EQ(max_abs_diff(gv, v), 0.0) << dtype_name(dt) << " " << direction;
    }
  }
  Tensor x = randn({kB, kT, kH, kD}, 32);
  EXPECT_THROW(rope_forward_heads(x, table, kH + 1), Error);
  EXPECT_THROW(rope_backward_heads(x, table, -1), Error);
}

}  // namespace
}  // namespace ft::nn

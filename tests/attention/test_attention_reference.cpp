// The oracle's own checks: reference forward against a brute-force loop written here from the
// definition, reference gradients against central finite differences in fp64, and flash in
// fp64 against the reference (same algorithm class as nothing else: a logic check at 1e-12).
#include <gtest/gtest.h>

#include <vector>

#include "attention_test_util.h"

namespace ft::attention::testing {
namespace {

Mask full_mask(int64_t window) {
  Mask m;
  m.causal = true;
  m.window = window;
  m.has_segments = true;
  return m;
}

// o and lse straight from the definition: softmax over allowed keys of scale * q.k.
void brute_force(const Inputs& in, Tensor& o, Tensor& lse) {
  const Problem& p = in.problem;
  const int64_t S = p.seq_len, D = p.head_dim, Hq = p.q_heads, Hkv = p.kv_heads;
  const Tensor q = in.q.to(DType::f64), k = in.k.to(DType::f64), v = in.v.to(DType::f64);
  o = Tensor::zeros(q.shape(), DType::f64);
  lse = Tensor::zeros({p.batch, Hq, S}, DType::f64);
  auto at = [&](const Tensor& t, int64_t heads, int64_t b, int64_t s, int64_t h) {
    return t.data<double>() + ((b * S + s) * heads + h) * D;
  };
  for (int64_t b = 0; b < p.batch; ++b) {
    const int32_t* seg =
        in.segment_ids.defined() ? in.segment_ids.data<int32_t>() + b * S : nullptr;
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kv = h / (Hq / Hkv);
      for (int64_t i = 0; i < S; ++i) {
        std::vector<double> w(static_cast<size_t>(S), 0.0);
        double total = 0.0, mx = -1e300;
        for (int64_t j = 0; j < S; ++j) {
          if (!allowed(p.mask, seg, i, j)) continue;
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += at(q, Hq, b, i, h)[d] * at(k, Hkv, b, j, kv)[d];
          w[j] = dot * p.effective_scale();
          mx = std::max(mx, w[j]);
        }
        for (int64_t j = 0; j < S; ++j) {
          w[j] = allowed(p.mask, seg, i, j) ? std::exp(w[j] - mx) : 0.0;
          total += w[j];
        }
        lse.data<double>()[(b * Hq + h) * S + i] =
            total > 0 ? mx + std::log(total) : -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < S && total > 0; ++j) {
          for (int64_t d = 0; d < D; ++d) {
            at(o, Hq, b, i, h)[d] += w[j] / total * at(v, Hkv, b, j, kv)[d];
          }
        }
      }
    }
  }
}

TEST(AttentionReference, ForwardMatchesBruteForce) {
  const Inputs in = make_inputs({2, 37, 4, 2, 16}, full_mask(9), DType::f32, 7);
  const ForwardOutput ref = forward(Impl::reference, in.problem, in.q, in.k, in.v, in.segment_ids);
  Tensor o, lse;
  brute_force(in, o, lse);
  EXPECT_EQ(ref.o.dtype(), DType::f64);
  EXPECT_EQ(ref.lse.dtype(), DType::f64);
  EXPECT_LE(relative_error(ref.o, o), 1e-13);
  const LseError e = lse_error(ref.lse, lse);
  EXPECT_LE(e.relative, 1e-13);
  EXPECT_EQ(e.mismatched, 0);
}

// loss = sum(o * w); its gradient is backward(dout = w).
double loss(const Inputs& in, const Tensor& w) {
  const ForwardOutput f = forward(Impl::reference, in.problem, in.q, in.k, in.v, in.segment_ids);
  double sum = 0;
  for (int64_t i = 0; i < w.numel(); ++i) sum += f.o.data<double>()[i] * w.data<double>()[i];
  return sum;
}

Tensor finite_difference(Inputs& in, Tensor& x, const Tensor& w) {
  constexpr double kStep = 1e-6;
  Tensor grad = Tensor::empty(x.shape(), DType::f64);
  for (int64_t i = 0; i < x.numel(); ++i) {
    double& xi = x.data<double>()[i];
    const double saved = xi;
    xi = saved + kStep;
    const double up = loss(in, w);
    xi = saved - kStep;
    const double down = loss(in, w);
    xi = saved;
    grad.data<double>()[i] = (up - down) / (2 * kStep);
  }
  return grad;
}

void check_gradients(const Shapes& shapes, const Mask& mask, uint64_t seed) {
  Inputs in = make_inputs(shapes, mask, DType::f64, seed);
  const Tensor& w = in.dout;
  const ForwardOutput f = forward(Impl::reference, in.problem, in.q, in.k, in.v, in.segment_ids);
  const Gradients g = backward(Impl::reference, in.problem, in.q, in.k, in.v, f, w, in.segment_ids);
  // Central differences: truncation O(h^2) ~ 1e-12, rounding ~ 1e-16 / h ~ 1e-10.
  EXPECT_LE(relative_error(g.dq, finite_difference(in, in.q, w)), 1e-7);
  EXPECT_LE(relative_error(g.dk, finite_difference(in, in.k, w)), 1e-7);
  EXPECT_LE(relative_error(g.dv, finite_difference(in, in.v, w)), 1e-7);
}

TEST(AttentionReference, GradientsMatchFiniteDifferencesGqaCausal) {
  Mask m;
  m.causal = true;
  check_gradients({1, 6, 4, 2, 8}, m, 11);
}

TEST(AttentionReference, GradientsMatchFiniteDifferencesAllMasks) {
  check_gradients({2, 9, 2, 1, 8}, full_mask(4), 12);
}

TEST(AttentionFlash, Fp64MatchesReferenceTightly) {
  const Inputs in = make_inputs({1, 200, 4, 2, 32}, full_mask(70), DType::f64, 13, true);
  const ForwardOutput ref = forward(Impl::reference, in.problem, in.q, in.k, in.v, in.segment_ids);
  const Gradients rg =
      backward(Impl::reference, in.problem, in.q, in.k, in.v, ref, in.dout, in.segment_ids);
  const ForwardOutput fl = forward(Impl::flash, in.problem, in.q, in.k, in.v, in.segment_ids);
  const Gradients fg =
      backward(Impl::flash, in.problem, in.q, in.k, in.v, fl, in.dout, in.segment_ids);
  EXPECT_LE(relative_error(fl.o, ref.o), 1e-12);
  EXPECT_LE(lse_error(fl.lse, ref.lse).relative, 1e-12);
  EXPECT_EQ(lse_error(fl.lse, ref.lse).mismatched, 0);
  EXPECT_LE(relative_error(fg.dq, rg.dq), 1e-12);
  EXPECT_LE(relative_error(fg.dk, rg.dk), 1e-12);
  EXPECT_LE(relative_error(fg.dv, rg.dv), 1e-12);
}

}  // namespace
}  // namespace ft::attention::testing

// AdamW and the global gradient norm: a two-step update against the textbook formula, weight
// decay only when asked, gradient scaling, fp32 vs fp64, thread-count independence, bad inputs.
#include <gtest/gtest.h>

#include <cmath>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "grad_check.h"
#include "nn/adamw.h"

namespace ft::nn {
namespace {

using namespace ft::nn::testing;

Tensor scalars(const std::vector<double>& values, DType dtype = DType::f64) {
  Tensor t = Tensor::empty({static_cast<int64_t>(values.size())}, DType::f64);
  for (size_t i = 0; i < values.size(); ++i) t.data<double>()[i] = values[i];
  return t.to(dtype);
}

// The textbook AdamW step on one scalar (bias-corrected moments, decoupled decay on the old p).
struct ScalarAdam {
  double p, m = 0, v = 0;
  void step(double g, double lr, const AdamWConfig& c, int t, bool decay) {
    m = c.beta1 * m + (1 - c.beta1) * g;
    v = c.beta2 * v + (1 - c.beta2) * g * g;
    const double mhat = m / (1 - std::pow(c.beta1, t)), vhat = v / (1 - std::pow(c.beta2, t));
    p -= lr * (mhat / (std::sqrt(vhat) + c.eps) + (decay ? c.weight_decay * p : 0.0));
  }
};

TEST(AdamW, TwoStepsMatchTextbookFormula) {
  const AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  const std::vector<double> p0{0.5, -1.25, 2.0}, g1{0.1, -0.3, 0.0}, g2{-0.2, 0.05, 0.7};
  const double lr = 0.01;
  for (bool decay : {false, true}) {
    Tensor p = scalars(p0), m = scalars({0, 0, 0}), v = scalars({0, 0, 0});
    adamw_update(p, scalars(g1), m, v, lr, cfg, 1, 1.0, decay);
    adamw_update(p, scalars(g2), m, v, lr, cfg, 2, 1.0, decay);
    for (size_t i = 0; i < p0.size(); ++i) {
      ScalarAdam ref{p0[i]};
      ref.step(g1[i], lr, cfg, 1, decay);
      ref.step(g2[i], lr, cfg, 2, decay);
      EXPECT_NEAR(p.data<double>()[i], ref.p, 1e-14) << "decay " << decay << " i " << i;
      EXPECT_NEAR(m.data<double>()[i], ref.m, 1e-15);
      EXPECT_NEAR(v.data<double>()[i], ref.v, 1e-15);
    }
  }
}

// Step 1 with bias correction is lr * g / (|g| + eps): a move of lr against the gradient sign.
TEST(AdamW, FirstStepMovesByLr) {
  const AdamWConfig cfg{0.9, 0.999, 1e-8, 0.0};
  Tensor p = scalars({1.0, 1.0}), m = scalars({0, 0}), v = scalars({0, 0});
  adamw_update(p, scalars({3.0, -0.02}), m, v, 0.1, cfg, 1, 1.0, true);
  EXPECT_NEAR(p.data<double>()[0], 0.9, 1e-8);
  EXPECT_NEAR(p.data<double>()[1], 1.1, 1e-6);
  EXPECT_NEAR(m.data<double>()[0], 0.3, 1e-15);
  EXPECT_NEAR(v.data<double>()[0], 0.001 * 9.0, 1e-15);
}

// With a zero gradient the only change is the decay p *= 1 - lr * wd, and only when decay.
TEST(AdamW, WeightDecayOnlyWhenAsked) {
  const AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  for (bool decay : {false, true}) {
    Tensor p = scalars({2.0, -4.0}), m = scalars({0, 0}), v = scalars({0, 0});
    adamw_update(p, scalars({0, 0}), m, v, 0.5, cfg, 1, 1.0, decay);
    const double factor = decay ? 1.0 - 0.5 * 0.1 : 1.0;
    EXPECT_DOUBLE_EQ(p.data<double>()[0], 2.0 * factor);
    EXPECT_DOUBLE_EQ(p.data<double>()[1], -4.0 * factor);
  }
}

TEST(AdamW, GradScaleMultipliesTheGradient) {
  const AdamWConfig cfg;
  const Tensor g = randn({16}, 1);
  Tensor p1 = randn({16}, 2), m1 = randn({16}, 3), v1 = Tensor::zeros({16}, DType::f64);
  Tensor p2 = p1.clone(), m2 = m1.clone(), v2 = v1.clone();
  adamw_update(p1, g, m1, v1, 1e-3, cfg, 3, 1.0, true);
  adamw_update(p2, scaled(g, 4.0), m2, v2, 1e-3, cfg, 3, 0.25, true);
  EXPECT_LT(max_abs_diff(p1, p2), 1e-15);
  EXPECT_LT(max_abs_diff(m1, m2), 1e-15);
}

TEST(AdamW, Fp32AgreesWithFp64) {
  const AdamWConfig cfg;
  Tensor p = randn({64}, 4), m = Tensor::zeros({64}, DType::f64),
         v = Tensor::zeros({64}, DType::f64);
  Tensor p32 = p.to(DType::f32), m32 = m.to(DType::f32), v32 = v.to(DType::f32);
  for (int step = 1; step <= 3; ++step) {
    const Tensor g = randn({64}, 10 + static_cast<uint64_t>(step));
    adamw_update(p, g, m, v, 1e-2, cfg, step, 0.5, true);
    adamw_update(p32, g.to(DType::f32), m32, v32, 1e-2, cfg, step, 0.5, true);
  }
  EXPECT_LT(relative_error(p32, p), 1e-6);
  EXPECT_LT(relative_error(m32, m), 1e-6);
  EXPECT_LT(relative_error(v32, v), 1e-6);
}

TEST(AdamW, BadInputsThrow) {
  const AdamWConfig cfg;
  Tensor p = scalars({1, 2}), m = scalars({0, 0}), v = scalars({0, 0});
  EXPECT_THROW(adamw_update(p, scalars({1, 2, 3}), m, v, 0.1, cfg, 1, 1.0, true), Error);
  EXPECT_THROW(adamw_update(p, scalars({1, 2}, DType::f32), m, v, 0.1, cfg, 1, 1.0, true), Error);
  EXPECT_THROW(adamw_update(p, scalars({1, 2}), m, v, 0.1, cfg, 0, 1.0, true), Error);
  Tensor pb = scalars({1, 2}, DType::bf16), mb = pb.clone(), vb = pb.clone();
  EXPECT_THROW(adamw_update(pb, pb, mb, vb, 0.1, cfg, 1, 1.0, true), Error);
}

// ---- global gradient norm ----

TEST(GlobalGradNorm, SumsSquaresOverTensorsAndDtypes) {
  EXPECT_DOUBLE_EQ(global_grad_norm({scalars({3.0}), scalars({4.0}, DType::f32)}), 5.0);
  EXPECT_DOUBLE_EQ(global_grad_norm({}), 0.0);
  const Tensor a = randn({3, 7}, 20), b = randn({11}, 21, DType::f32);
  const double want = std::sqrt(dot(a, a) + dot(b, b));
  EXPECT_NEAR(global_grad_norm({a, b}), want, 1e-12 * want);
  EXPECT_THROW(global_grad_norm({Tensor()}), Error);
}

TEST(GlobalGradNorm, IndependentOfThreadCount) {
#ifdef _OPENMP
  const Tensor big = randn({300000}, 22, DType::f32);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const double one = global_grad_norm({big});
  omp_set_num_threads(2);
  const double two = global_grad_norm({big});
  omp_set_num_threads(saved);
  EXPECT_EQ(one, two);
#else
  GTEST_SKIP() << "built without OpenMP";
#endif
}

}  // namespace
}  // namespace ft::nn

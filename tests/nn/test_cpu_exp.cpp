// nn/cpu_exp.h's vectorisable exp against fp64 std::exp: relative error under 1.5 ulp of fp32
// over [-87, 88] on a dense sweep and at the edges, 0 below -87 (and for -inf), 1 at 0.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nn/cpu_exp.h"

namespace ft::nn::cpu {
namespace {

double ulps(float got, double want) {
  return std::abs(static_cast<double>(got) - want) / (want * std::ldexp(1.0, -23));
}

TEST(CpuExp, WithinOneAndAHalfUlpOverTheNormalRange) {
  double worst = 0.0;
  float worst_at = 0.0f;
  for (int64_t i = 0; i <= 4000000; ++i) {
    const float x = -87.0f + 175.0f * static_cast<float>(i) / 4000000.0f;
    const double e = ulps(exp_vectorizable(x), std::exp(static_cast<double>(x)));
    if (e > worst) worst = e, worst_at = x;
  }
  EXPECT_LT(worst, 1.5) << "at x = " << worst_at;
  for (float x : {-87.0f, -86.99f, -1e-7f, 1e-7f, 88.0f, 88.5f}) {
    EXPECT_LT(ulps(exp_vectorizable(x), std::exp(static_cast<double>(x))), 1.5) << x;
  }
  EXPECT_EQ(exp_vectorizable(0.0f), 1.0f);
}

TEST(CpuExp, IsZeroBelowTheNormalRange) {
  for (float x : {-87.01f, -100.0f, -1e30f, -std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(exp_vectorizable(x), 0.0f) << x;
  }
}

}  // namespace
}  // namespace ft::nn::cpu

// What two runs of one CPU GEMM are guaranteed to agree on, whatever kernel BLAS picks.
//
// OpenBLAS chooses its kernel by processor (OPENBLAS_CORETYPE) and splits the k-sum of each
// output by blocking and thread count, so two runs of the same fp32 product may sum the same
// terms in different orders. Any order of summing n terms in fp32 (with or without FMA) errs by
// at most gamma_n * sum|term_i|, gamma_n = n u / (1 - n u), u = 2^-24 (Higham, "Accuracy and
// Stability of Numerical Algorithms", 2nd ed., section 4.2 and eq. 3.5); the products of bf16
// or fp32 operands themselves are exact or one rounding, covered by counting them in n. So two
// fp32 results differ by at most 2 gamma_n * sum|term_i|, and results rounded once more to bf16
// by that plus half a bf16 ulp of each (rounding to nearest is monotone). A kernel that skips,
// repeats or races on a term is off by about the term itself, far outside the bound.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/blas.h"
#include "core/tensor.h"

namespace ft::nn::testing {

// gamma_n of fp32: the relative bound of an n-term fp32 sum in any order.
inline double fp32_sum_gamma(int64_t n) {
  const double nu = static_cast<double>(n) * std::ldexp(1.0, -24);
  return nu / (1.0 - nu);
}

// The spacing of bf16 values at |x| (8 significant bits; subnormal spacing below 2^-126).
inline double bf16_ulp(double x) {
  const int e = x == 0.0 ? -126 : std::max(std::ilogb(x), -126);
  return std::ldexp(1.0, e - 7);
}

// |op(a)| @ |op(b)| in fp64 for row-major 2-D views: each output's sum of |terms|, the scale of
// its possible rounding error. (fp64 sums of non-negative terms: exact to ~1e-13 relative.)
inline Tensor abs_product(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b) {
  const Tensor a64 = a.to(DType::f64), b64 = b.to(DType::f64);
  Tensor abs_a = a64.clone(), abs_b = b64.clone();
  for (int64_t i = 0; i < abs_a.numel(); ++i)
    abs_a.data<double>()[i] = std::fabs(abs_a.data<double>()[i]);
  for (int64_t i = 0; i < abs_b.numel(); ++i)
    abs_b.data<double>()[i] = std::fabs(abs_b.data<double>()[i]);
  const int64_t M = trans_a ? a.dim(1) : a.dim(0), K = trans_a ? a.dim(0) : a.dim(1);
  const int64_t N = trans_b ? b.dim(0) : b.dim(1);
  Tensor c = Tensor::zeros({M, N}, DType::f64);
  cpu::gemm(trans_a, trans_b, M, N, K, 1.0, abs_a.data<double>(), a.dim(1), abs_b.data<double>(),
            b.dim(1), 0.0, c.data<double>(), N);
  return c;
}

namespace detail {

// Every |a_i - b_i| within sum_gamma * abs_sums_i, plus half a bf16 ulp of each bf16 side.
inline void expect_within_sum_bound(const Tensor& a, const Tensor& b, const Tensor& abs_sums,
                                    double sum_gamma, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  ASSERT_EQ(a.numel(), abs_sums.numel()) << what;
  const Tensor x = a.to(DType::f64), y = b.to(DType::f64), s = abs_sums.to(DType::f64);
  int64_t over = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double xi = x.data<double>()[i], yi = y.data<double>()[i];
    double bound = sum_gamma * s.data<double>()[i];
    if (a.dtype() == DType::bf16) bound += 0.5 * bf16_ulp(xi);
    if (b.dtype() == DType::bf16) bound += 0.5 * bf16_ulp(yi);
    const double diff = std::fabs(xi - yi);
    if (!(diff <= bound) && over++ < 5) {  // !(<=): NaN fails too
      ADD_FAILURE() << what << "[" << i << "]: " << xi << " vs " << yi << ", |diff| " << diff
                    << " > bound " << bound;
    }
  }
  EXPECT_EQ(over, 0) << what << ": elements outside the bound";
}

}  // namespace detail

// Two results of one GEMM (fp32 or bf16 outputs, same dtype and shape), each element a sum of
// n_terms terms whose |terms| sum to abs_sums: within 2 gamma_n * abs_sums (+ bf16 rounding).
inline void expect_same_gemm_result(const Tensor& a, const Tensor& b, const Tensor& abs_sums,
                                    int64_t n_terms, const std::string& what) {
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  detail::expect_within_sum_bound(a, b, abs_sums, 2.0 * fp32_sum_gamma(n_terms), what);
}

// A GEMM result summed in fp32 (fp32 or bf16 output) against the same product in fp64: within
// gamma_n * abs_sums for the fp32 sum, plus the fp64 sum's own (2^-53 unit) bound.
inline void expect_fp32_gemm_matches_fp64(const Tensor& got, const Tensor& fp64,
                                          const Tensor& abs_sums, int64_t n_terms,
                                          const std::string& what) {
  ASSERT_EQ(fp64.dtype(), DType::f64) << what;
  const double nu64 = static_cast<double>(n_terms) * std::ldexp(1.0, -53);
  detail::expect_within_sum_bound(got, fp64, abs_sums, fp32_sum_gamma(n_terms) + nu64 / (1 - nu64),
                                  what);
}

}  // namespace ft::nn::testing

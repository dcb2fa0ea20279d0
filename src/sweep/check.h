// The correctness verdict of one candidate on the check problem. Each of out, dq, dk, dv is
// compared with a float32-or-better reference computed by a different algorithm (the explicit
// S x S path) and must pass both:
//   allclose   |got - ref| <= atol + rtol * |ref| for every element (atol = rtol = 7e-2)
//   2x naive   relative norm error <= 2 x that of the naive bf16 path on the same inputs
//              (+ a 1e-4 floor, for problems where the baseline is exact)
// A NaN or Inf anywhere fails. The verdict reads "ok" or "FAIL:out,dq" (the tensors that failed).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ft::sweep {

struct CheckTolerances {
  double atol = 7e-2;
  double rtol = 7e-2;
  double naive_factor = 2.0;
  double floor = 1e-4;
};

// The names the verdict uses, in order.
inline const std::vector<std::string>& checked_tensor_names() {
  static const std::vector<std::string> names = {"out", "dq", "dk", "dv"};
  return names;
}

struct TensorCheck {
  std::string name;
  int64_t non_finite = 0;             // NaN or Inf elements of got
  int64_t allclose_violations = 0;    // elements outside atol + rtol * |ref|
  double max_abs_diff = 0.0;          // largest |got - ref| (inf when anything is not finite)
  double relative_error = 0.0;        // see relative_error_vs
  double naive_relative_error = 0.0;  // the naive bf16 path's, on the same inputs
  bool allclose_ok = false;
  bool naive_ok = false;

  bool passed() const { return non_finite == 0 && allclose_ok && naive_ok; }
};

// ||got - ref|| / ||ref||; where ref is exactly zero, the rms of got - ref instead. Infinite when
// got has a NaN or Inf. Both CPU tensors of any float dtype with the same number of elements.
double relative_error_vs(const Tensor& got, const Tensor& ref);

TensorCheck check_tensor(const std::string& name, const Tensor& got, const Tensor& ref,
                         double naive_relative_error, const CheckTolerances& tol = {});

// "ok" when every check passed, else "FAIL:" and the failed names joined by commas.
std::string verdict_text(const std::vector<TensorCheck>& checks);
std::vector<std::string> failed_names(const std::vector<TensorCheck>& checks);

}  // namespace ft::sweep

#include "sweep/check.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ft::sweep {
namespace {

Tensor as_f64(const Tensor& t) {
  FT_CHECK(t.defined() && t.device() == Device::cpu, "sweep check: tensors must be on the CPU");
  return t.dtype() == DType::f64 ? t : t.to(DType::f64);
}

}  // namespace

double relative_error_vs(const Tensor& got, const Tensor& ref) {
  FT_CHECK(got.numel() == ref.numel(), "sweep check: ", shape_str(got.shape()), " against ",
           shape_str(ref.shape()));
  const Tensor g = as_f64(got), r = as_f64(ref);
  const double* a = g.data<double>();
  const double* b = r.data<double>();
  double num = 0.0, den = 0.0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (!std::isfinite(a[i])) return std::numeric_limits<double>::infinity();
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  if (den > 0.0) return std::sqrt(num / den);
  return std::sqrt(num / static_cast<double>(std::max<int64_t>(1, g.numel())));
}

TensorCheck check_tensor(const std::string& name, const Tensor& got, const Tensor& ref,
                         double naive_relative_error, const CheckTolerances& tol) {
  FT_CHECK(got.numel() == ref.numel(), "sweep check: ", name, " has shape ", shape_str(got.shape()),
           ", the reference ", shape_str(ref.shape()));
  TensorCheck c;
  c.name = name;
  const Tensor g = as_f64(got), r = as_f64(ref);
  const double* a = g.data<double>();
  const double* b = r.data<double>();
  for (int64_t i = 0; i < g.numel(); ++i) {
    if (!std::isfinite(a[i])) {
      ++c.non_finite;
      continue;
    }
    const double d = std::abs(a[i] - b[i]);
    c.max_abs_diff = std::max(c.max_abs_diff, d);
    // Written so that a NaN reference counts as a violation too.
    if (!(d <= tol.atol + tol.rtol * std::abs(b[i]))) ++c.allclose_violations;
  }
  if (c.non_finite > 0) c.max_abs_diff = std::numeric_limits<double>::infinity();
  c.relative_error = relative_error_vs(got, ref);
  c.naive_relative_error = naive_relative_error;
  c.allclose_ok = c.non_finite == 0 && c.allclose_violations == 0;
  // A broken yardstick (a non-finite naive error) certifies nothing.
  c.naive_ok = std::isfinite(naive_relative_error) &&
               c.relative_error <= tol.naive_factor * naive_relative_error + tol.floor;
  return c;
}

std::vector<std::string> failed_names(const std::vector<TensorCheck>& checks) {
  std::vector<std::string> out;
  for (const TensorCheck& c : checks) {
    if (!c.passed()) out.push_back(c.name);
  }
  return out;
}

std::string verdict_text(const std::vector<TensorCheck>& checks) {
  const std::vector<std::string> failed = failed_names(checks);
  if (failed.empty()) return "ok";
  std::string text = "FAIL:";
  for (size_t i = 0; i < failed.size(); ++i) text += (i ? "," : "") + failed[i];
  return text;
}

}  // namespace ft::sweep

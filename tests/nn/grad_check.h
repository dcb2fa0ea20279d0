// Test helpers for the layer tests: random and poisoned tensors, central finite differences in
// fp64, and the forward-agreement check of a low-precision dtype against fp64.
//
// Gradient checks use the scalar loss L = sum(out * R) with a random R, so dL/dout = R is what
// the backward receives, and every element of every gradient is compared with
// (L(x + h) - L(x - h)) / 2h.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace ft::nn::testing {

// Relative norm error allowed between an analytic fp64 gradient and central differences.
constexpr double kGradTol = 1e-6;
// Forward agreement with fp64 on the same (rounded) inputs. The bf16 outputs here measure
// 1.2e-3 to 1.9e-3 (one rounding of the output: at most 2^-8 = 3.9e-3 relative per element,
// bf16 having 8 significant bits, so at most that in relative norm too); 5e-3 stays above that
// worst case, tighter than a generic 2e-2 so that gross extra rounding shows.
constexpr double kFp32Tol = 1e-5;
constexpr double kBf16Tol = 5e-3;

inline DType acc_dtype(DType compute) {
  return compute == DType::f64 ? DType::f64 : DType::f32;
}

inline Tensor randn(const Shape& shape, uint64_t seed, DType dtype = DType::f64, double std = 1.0) {
  Tensor t = Tensor::empty(shape, dtype);
  Rng rng(seed);
  fill_normal(t, rng, 0.0, std);
  return t;
}

// Filled with NaN, so an element a kernel forgets to write fails every comparison.
inline Tensor poisoned(const Shape& shape, DType dtype = DType::f64) {
  Tensor t = Tensor::empty(shape, dtype);
  t.fill(std::numeric_limits<double>::quiet_NaN());
  return t;
}

inline Tensor tokens_of(const Shape& shape, const std::vector<int32_t>& ids) {
  Tensor t = Tensor::empty(shape, DType::i32);
  EXPECT_EQ(static_cast<int64_t>(ids.size()), t.numel());
  for (size_t i = 0; i < ids.size(); ++i) t.data<int32_t>()[i] = ids[i];
  return t;
}

// sum(a * b) in fp64 (the gradient-check loss).
inline double dot(const Tensor& a, const Tensor& b) {
  const Tensor a64 = a.to(DType::f64), b64 = b.to(DType::f64);
  double s = 0.0;
  for (int64_t i = 0; i < a.numel(); ++i) s += a64.data<double>()[i] * b64.data<double>()[i];
  return s;
}

inline Tensor scaled(const Tensor& t, double factor) {
  Tensor out = t.to(DType::f64);
  for (int64_t i = 0; i < out.numel(); ++i) out.data<double>()[i] *= factor;
  return out;
}

// dL/dx by central differences; x (fp64) is perturbed in place and restored.
inline Tensor numeric_grad(Tensor& x, const std::function<double()>& loss, double h = 1e-5) {
  Tensor g = Tensor::empty(x.shape(), DType::f64);
  double* p = x.data<double>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double saved = p[i];
    p[i] = saved + h;
    const double up = loss();
    p[i] = saved - h;
    const double down = loss();
    p[i] = saved;
    g.data<double>()[i] = (up - down) / (2.0 * h);
  }
  return g;
}

inline void expect_close(const Tensor& got, const Tensor& want, double tol, const char* what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  EXPECT_TRUE(all_finite(got)) << what << " has NaN/Inf (an unwritten element?)";
  const double err = relative_error(got, want);
  EXPECT_LT(err, tol) << what << ": relative error " << err;
}

// Byte-for-byte equality of two results (either on any device), finite values only (so two
// untouched NaN buffers do not pass).
inline void expect_same_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const Tensor g = got.to(Device::cpu), w = want.to(Device::cpu);
  EXPECT_TRUE(all_finite(g)) << what << " has NaN/Inf (an unwritten element?)";
  EXPECT_EQ(std::memcmp(g.raw(), w.raw(), static_cast<size_t>(g.numel()) * dtype_size(g.dtype())),
            0)
      << what << " is not bit-identical; max |diff| " << max_abs_diff(g, w);
}

// Runs `forward` on `inputs` converted to `dtype` (int32 inputs pass unchanged) and on the same
// rounded values in fp64, and expects the outputs to agree within `tol`.
using Forward = std::function<Tensor(const std::vector<Tensor>& inputs)>;

inline std::vector<Tensor> converted(const std::vector<Tensor>& inputs, DType dtype) {
  std::vector<Tensor> out;
  for (const Tensor& t : inputs) out.push_back(t.dtype() == DType::i32 ? t : t.to(dtype));
  return out;
}

inline void expect_forward_agrees(const std::vector<Tensor>& inputs, DType dtype, double tol,
                                  const Forward& forward, const char* what) {
  const std::vector<Tensor> low = converted(inputs, dtype);
  const Tensor out_low = forward(low);
  const Tensor out_ref = forward(converted(low, DType::f64));
  EXPECT_EQ(out_low.dtype(), dtype) << what;
  expect_close(out_low, out_ref, tol, what);
}

inline void expect_fp32_and_bf16_agree(const std::vector<Tensor>& inputs, const Forward& forward,
                                       const char* what) {
  SCOPED_TRACE(what);
  expect_forward_agrees(inputs, DType::f32, kFp32Tol, forward, "fp32 vs fp64");
  expect_forward_agrees(inputs, DType::bf16, kBf16Tol, forward, "bf16 vs fp64");
}

// f must throw ft::Error whose message contains needle.
inline void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace ft::nn::testing

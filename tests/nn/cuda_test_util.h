// Helpers shared by the GPU layer tests: skipping without a GPU, moving tensors, and comparing
// a GPU result with the CPU layer's.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/device.h"
#include "gpu_skip.h"
#include "grad_check.h"

namespace ft::nn::testing {

inline Tensor gpu(const Tensor& t) {
  return t.to(Device::cuda);
}
inline Tensor host(const Tensor& t) {
  return t.to(Device::cpu);
}
// Random N(0, std^2) values rounded to dtype, on the CPU (the GPU gets copies of the same).
inline Tensor rnd(const Shape& shape, uint64_t seed, DType dtype, double std = 1.0) {
  return randn(shape, seed, DType::f64, std).to(dtype);
}
inline Tensor gpu_poisoned(const Shape& shape, DType dtype) {
  return gpu(poisoned(shape, dtype));
}

// got: a GPU result; want: the CPU layer's result on the same inputs.
inline void expect_match(const Tensor& got, const Tensor& want, double tol,
                         const std::string& what) {
  EXPECT_EQ(got.device(), Device::cuda) << what;
  EXPECT_EQ(got.dtype(), want.dtype()) << what;
  expect_close(host(got), want, tol, what.c_str());
}

}  // namespace ft::nn::testing

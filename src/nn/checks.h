// Internal helpers shared by the CPU layer kernels in src/nn: argument checks whose messages
// name the function, the argument and both shapes, and the OpenMP work threshold. Not part of
// the public API (layers.h is).
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ft::nn::detail {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMinWork = 1 << 15;

inline void check_defined(const Tensor& t, const char* fn, const char* name) {
  FT_CHECK(t.defined(), fn, ": ", name, " is undefined");
  FT_CHECK(t.device() == Device::cpu, fn, ": ", name, " is on ", device_name(t.device()),
           ", only the CPU is implemented");
}

// The device a call runs on: its first input's (`t`, checked to be defined). Every other tensor
// of the call must be on it (check_on). A build without CUDA rejects a GPU tensor here, before
// any CPU kernel could touch its memory.
inline Device call_device(const Tensor& t, const char* fn, const char* name) {
  FT_CHECK(t.defined(), fn, ": ", name, " is undefined");
#ifndef FLASHTRAIN_WITH_CUDA
  FT_CHECK(t.device() == Device::cpu, fn, ": ", name, " is on ", device_name(t.device()),
           " but flashtrain was built without CUDA");
#endif
  return t.device();
}

inline void check_on(const Tensor& t, Device device, const char* fn, const char* name) {
  FT_CHECK(t.defined(), fn, ": ", name, " is undefined");
  FT_CHECK(t.device() == device, fn, ": ", name, " is on ", device_name(t.device()),
           " but the call runs on ", device_name(device), " (all tensors of a call on one device)");
}

inline void check_dtype(const Tensor& t, DType want, const char* fn, const char* name) {
  FT_CHECK(t.dtype() == want, fn, ": ", name, " is ", dtype_name(t.dtype()), ", expected ",
           dtype_name(want));
}

inline void check_float(const Tensor& t, const char* fn, const char* name) {
  FT_CHECK(t.dtype() != DType::i32, fn, ": ", name, " is int32, expected fp32, bf16 or fp64");
}

inline void check_shape(const Tensor& t, const Shape& want, const char* fn, const char* name) {
  FT_CHECK(t.shape() == want, fn, ": ", name, " has shape ", shape_str(t.shape()), ", expected ",
           shape_str(want));
}

// `other` must match `ref` in device, shape and dtype (e.g. an output against its input).
inline void check_like(const Tensor& other, const Tensor& ref, const char* fn, const char* name,
                       const char* ref_name) {
  check_on(other, ref.device(), fn, name);
  FT_CHECK(other.shape() == ref.shape(), fn, ": ", name, " ", shape_str(other.shape()),
           " does not match ", ref_name, " ", shape_str(ref.shape()));
  FT_CHECK(other.dtype() == ref.dtype(), fn, ": ", name, " is ", dtype_name(other.dtype()), " but ",
           ref_name, " is ", dtype_name(ref.dtype()));
}

// The dtype parameter gradients and saved statistics use for a given compute dtype.
inline DType acc_dtype_of(DType compute) {
  return compute == DType::f64 ? DType::f64 : DType::f32;
}

// Number of rows when the last dimension (of size `cols`) is the feature dimension.
inline int64_t rows_of(const Tensor& t) {
  const int64_t cols = t.ndim() == 0 ? 1 : t.dim(-1);
  return cols == 0 ? 0 : t.numel() / cols;
}

}  // namespace ft::nn::detail

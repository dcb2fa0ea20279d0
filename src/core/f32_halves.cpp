#include "core/f32_halves.h"

#include <cstring>

#include "core/error.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/tensor_ops.h"
#endif

namespace ft {
namespace {

// The three tensors' sizes, dtypes and devices (lo undefined: not checked).
void check_halves(const char* fn, const Tensor& values, const Tensor& hi, const Tensor& lo) {
  FT_CHECK(values.defined() && hi.defined(), fn, ": values and hi must be defined");
  FT_CHECK(values.dtype() == DType::f32 && hi.dtype() == DType::bf16, fn, ": values are ",
           dtype_name(values.dtype()), " and hi ", dtype_name(hi.dtype()),
           ", expected fp32 and bf16");
  FT_CHECK(hi.numel() == values.numel() && hi.device() == values.device(), fn, ": hi ",
           shape_str(hi.shape()), " on ", device_name(hi.device()), " does not match values ",
           shape_str(values.shape()), " on ", device_name(values.device()));
  if (!lo.defined()) return;
  FT_CHECK(lo.dtype() == DType::i16, fn, ": lo is ", dtype_name(lo.dtype()), ", expected int16");
  FT_CHECK(lo.numel() == values.numel() && lo.device() == values.device(), fn, ": lo ",
           shape_str(lo.shape()), " on ", device_name(lo.device()), " does not match values ",
           shape_str(values.shape()), " on ", device_name(values.device()));
}

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace

void split_f32(Tensor& hi, Tensor& lo, const Tensor& values) {
  check_halves("split_f32", values, hi, lo);
  const int64_t n = values.numel();
#ifdef FLASHTRAIN_WITH_CUDA
  if (values.device() == Device::cuda) {
    return cuda::split_f32(hi.raw(), lo.defined() ? lo.raw() : nullptr, values.raw(), n);
  }
#endif
  const float* v = values.data<float>();
  bf16* h = hi.data<bf16>();
  int16_t* l = lo.defined() ? lo.data<int16_t>() : nullptr;
  for (int64_t i = 0; i < n; ++i) {
    const F32Halves s = split_f32_bits(bits_of(v[i]));
    h[i] = bf16::from_bits(s.hi);
    if (l != nullptr) l[i] = s.lo;
  }
}

void join_f32(Tensor& values, const Tensor& hi, const Tensor& lo) {
  FT_CHECK(lo.defined(), "join_f32: lo must be defined");
  check_halves("join_f32", values, hi, lo);
  const int64_t n = values.numel();
#ifdef FLASHTRAIN_WITH_CUDA
  if (values.device() == Device::cuda) return cuda::join_f32(values.raw(), hi.raw(), lo.raw(), n);
#endif
  float* v = values.data<float>();
  const bf16* h = hi.data<bf16>();
  const int16_t* l = lo.data<int16_t>();
  for (int64_t i = 0; i < n; ++i) v[i] = float_of(join_f32_bits(h[i].bits, l[i]));
}

}  // namespace ft

// Element types and devices. Computation accumulates in acc_t<T>: float for f32 and bf16,
// double for f64 (the test and reference precision). i16 holds the low halves of fp32 values
// kept in two 16-bit halves (core/f32_halves.h); like i32 it is copied, never converted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/bf16.h"

namespace ft {

enum class DType { f32, bf16, f64, i32, i16 };
enum class Device { cpu, cuda };

size_t dtype_size(DType t);
inline bool is_integer(DType t) {
  return t == DType::i32 || t == DType::i16;
}
const char* dtype_name(DType t);          // "fp32", "bf16", "fp64", "int32", "int16"
DType parse_dtype(const std::string& s);  // fp32|f32|float32, bf16|bfloat16, fp64, int32, int16
const char* device_name(Device d);        // "cpu", "cuda"
Device parse_device(const std::string& s);

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::f32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::bf16;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::f64;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::i32;
};
template <>
struct dtype_of<int16_t> {
  static constexpr DType value = DType::i16;
};

template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

// Load/store through the accumulation type, so one kernel template serves every float dtype.
template <class T>
inline acc_t<T> load(const T& x) {
  if constexpr (std::is_same_v<T, bf16>) {
    return x.to_float();
  } else {
    return x;
  }
}
template <class T, class A>
inline void store(T& dst, A v) {
  if constexpr (std::is_same_v<T, bf16>) {
    dst = bf16(static_cast<float>(v));
  } else {
    dst = static_cast<T>(v);
  }
}

// Calls f(T{}) with T the C++ type of a floating dtype (f32, bf16, f64).
template <class F>
decltype(auto) dispatch_float(DType t, F&& f);

}  // namespace ft

#include "core/dtype_inl.h"

#pragma once

#include "core/error.h"

namespace ft {

template <class F>
decltype(auto) dispatch_float(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::bf16:
      return f(bf16{});
    case DType::f64:
      return f(double{});
    default:
      throw Error(str("expected a floating dtype (fp32, bf16, fp64), got ", dtype_name(t)));
  }
}

}  // namespace ft

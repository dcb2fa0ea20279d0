// The CPU implementations behind attention.h's forward()/backward(). dispatch.cpp validates
// every tensor before calling them, so they may assume agreeing shapes and dtypes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>

#include "attention/attention.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace ft::attention::cpu {

// Inputs in the problem's dtype (fp32, bf16 or fp64); o and gradients in the same dtype;
// lse (and naive's saved probabilities) in the accumulation type acc_t (fp32, or fp64 for fp64).
ForwardOutput naive_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& segment_ids);
Gradients naive_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const ForwardOutput& fwd, const Tensor& dout, const Tensor& segment_ids);
ForwardOutput flash_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& segment_ids);
Gradients flash_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                         const ForwardOutput& fwd, const Tensor& dout, const Tensor& segment_ids);
// Inputs of any float dtype, converted to fp64; every output is fp64.
ForwardOutput reference_forward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& segment_ids);
Gradients reference_backward(const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                             const ForwardOutput& fwd, const Tensor& dout,
                             const Tensor& segment_ids);

// ---- helpers shared by the implementations ----

// Offset of element (b, s, h, 0) of a [B, S, heads, D] tensor; rows of one head are
// heads * D apart.
inline int64_t head_row_offset(const Problem& p, int64_t heads, int64_t b, int64_t s, int64_t h) {
  return ((b * p.seq_len + s) * heads + h) * p.head_dim;
}

// Copies `rows` strided rows of `cols` elements into a dense block, widening to A.
template <class A, class T>
void load_rows(const T* src, int64_t stride, int64_t rows, int64_t cols, A* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* in = src + r * stride;
    A* out = dst + r * cols;
    for (int64_t c = 0; c < cols; ++c) out[c] = load(in[c]);
  }
}

// Writes a dense block back into strided rows, times `factor`, rounding to T.
template <class T, class A>
void store_rows(const A* src, int64_t rows, int64_t cols, A factor, T* dst, int64_t stride) {
  for (int64_t r = 0; r < rows; ++r) {
    const A* in = src + r * cols;
    T* out = dst + r * stride;
    for (int64_t c = 0; c < cols; ++c) store(out[c], in[c] * factor);
  }
}

// An output filled with NaN, so that an element a kernel forgets to write fails every check.
inline Tensor poisoned(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  t.fill(std::numeric_limits<double>::quiet_NaN());
  return t;
}

template <class A>
constexpr A minus_infinity() {
  return -std::numeric_limits<A>::infinity();
}

inline const int32_t* segment_row(const Problem& p, const Tensor& segment_ids, int64_t b) {
  return p.mask.has_segments ? segment_ids.data<int32_t>() + b * p.seq_len : nullptr;
}

}  // namespace ft::attention::cpu

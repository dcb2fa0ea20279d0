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

// Where a call's q, k and v lie in their tensors: element (b, s, h, d) of q at
// q_offset + (b * S + s) * q_row + h * D + d, k and v likewise with kv_row. Dense tensors
// [B, S, H, D] have rows of H * D and offsets 0; one fused QKV buffer [B, S, (Hq + 2 Hkv) * D]
// (attention.h, forward_packed) has rows of its width and k, v at offsets Hq * D, (Hq + Hkv) * D.
// Gradients are written in the same layout into the tensors they are handed.
struct Layout {
  int64_t q_row = 0, kv_row = 0;
  int64_t q_offset = 0, k_offset = 0, v_offset = 0;

  static Layout dense(const Problem& p) {
    return {p.q_heads * p.head_dim, p.kv_heads * p.head_dim, 0, 0, 0};
  }
  static Layout packed(const Problem& p) {
    const int64_t D = p.head_dim, width = (p.q_heads + 2 * p.kv_heads) * D;
    return {width, width, 0, p.q_heads * D, (p.q_heads + p.kv_heads) * D};
  }
  int64_t q_at(const Problem& p, int64_t b, int64_t s, int64_t h) const {
    return q_offset + (b * p.seq_len + s) * q_row + h * p.head_dim;
  }
  int64_t k_at(const Problem& p, int64_t b, int64_t s, int64_t kv) const {
    return k_offset + (b * p.seq_len + s) * kv_row + kv * p.head_dim;
  }
  int64_t v_at(const Problem& p, int64_t b, int64_t s, int64_t kv) const {
    return v_offset + (b * p.seq_len + s) * kv_row + kv * p.head_dim;
  }
};

// Inputs in the problem's dtype (fp32, bf16 or fp64); o and gradients in the same dtype;
// lse (and naive's saved probabilities) in the accumulation type acc_t (fp32, or fp64 for fp64).
// o and dout are dense [B, S, Hq, D]; the backward writes every element of dq, dk and dv into
// `into` at the layout's positions.
ForwardOutput naive_forward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& segment_ids);
void naive_backward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                    const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                    const Tensor& segment_ids, Gradients& into);
ForwardOutput flash_forward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& segment_ids);
void flash_backward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                    const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                    const Tensor& segment_ids, Gradients& into);
// Inputs of any float dtype, converted to fp64; every output is fp64 (`into` too).
ForwardOutput reference_forward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& segment_ids);
void reference_backward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                        const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                        const Tensor& segment_ids, Gradients& into);

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

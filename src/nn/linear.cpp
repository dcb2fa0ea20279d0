// Fully connected layer, CPU: every product goes through ft::cpu::gemm (BLAS).
//
// Forward: out = inp @ w^T + b. The bias is written into out first and the GEMM adds onto it
// (beta = 1), so a bf16 output is rounded once, after the bias is in.
// Backward: dinp = dout @ w (written); dw += dout^T @ inp with beta = 1 into the fp32 (or fp64)
// gradient, so bf16 weight gradients accumulate in fp32; db += column sums of dout.
// FLOPs: 2*N*IC*OC forward, twice that backward.
// linear_gelu_forward (GPT-2's fc + GELU): on the CPU the two unfused calls; on the GPU the GELU
// rides in the GEMM's epilogue (src/nn/cuda/linear.cu), saving the GELU kernel's read of pre and
// write of out beyond what the GEMM writes anyway. linear_gelu_backward (the projection after
// the GELU, backward through it): on the CPU linear_backward then gelu_backward; on the GPU the
// GELU backward rides in the input-gradient GEMM's epilogue.
// The call runs on inp's device; every tensor must be there. CUDA tensors go to
// src/nn/cuda/linear.cu (cuBLASLt) after the same checks.
#include <algorithm>

#include "core/blas.h"
#include "nn/checks.h"
#include "nn/layers.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

using detail::check_dtype;
using detail::check_on;
using detail::check_shape;

constexpr const char* kFwd = "linear_forward";
constexpr const char* kBwd = "linear_backward";

struct LinearShape {
  int64_t rows, in_features, out_features;
};

// Checks inp [..., IC] against w [OC, IC] (both the compute dtype, both on inp's device) and
// returns N, IC, OC.
LinearShape check_weights(const Tensor& inp, const Tensor& w, const char* fn) {
  const Device device = detail::call_device(inp, fn, "inp");
  check_on(w, device, fn, "w");
  detail::check_float(inp, fn, "inp");
  check_dtype(w, inp.dtype(), fn, "w");
  FT_CHECK(inp.ndim() >= 1 && w.ndim() == 2 && w.dim(1) == inp.dim(-1), fn, ": w ",
           shape_str(w.shape()), " must be [OC, IC] with IC the last dimension of inp ",
           shape_str(inp.shape()));
  return {detail::rows_of(inp), w.dim(1), w.dim(0)};
}

// `t` holds N rows of OC features: last dimension OC, N * OC elements in all.
void check_rows(const Tensor& t, const LinearShape& s, DType dtype, Device device, const char* fn,
                const char* name) {
  check_on(t, device, fn, name);
  check_dtype(t, dtype, fn, name);
  FT_CHECK(t.ndim() >= 1 && t.dim(-1) == s.out_features && t.numel() == s.rows * s.out_features, fn,
           ": ", name, " ", shape_str(t.shape()), " must hold ", s.rows, " rows of ",
           s.out_features, " (from inp rows and w [", s.out_features, ", ", s.in_features, "])");
}

template <class T>
void forward_kernel(T* out, const T* inp, const T* w, const T* b, const LinearShape& s) {
  const int64_t N = s.rows, IC = s.in_features, OC = s.out_features;
  if (b) {
#pragma omp parallel for schedule(static) if (N * OC >= detail::kParallelMinWork)
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t o = 0; o < OC; ++o) out[r * OC + o] = b[o];
    }
  }
  const acc_t<T> beta = b ? 1 : 0;
  cpu::gemm(false, true, N, OC, IC, acc_t<T>(1), inp, IC, w, IC, beta, out, OC);
}

// Column sums of dout [N, OC] added to db (written over it with overwrite). Each thread owns blocks
// of columns and walks the rows in order, so every sum is deterministic and the rows are read
// contiguously.
template <class T>
void bias_grad_kernel(acc_t<T>* db, const T* dout, int64_t N, int64_t OC, bool overwrite) {
  constexpr int64_t kBlock = 64;
  const int64_t n_blocks = (OC + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (N * OC >= detail::kParallelMinWork)
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const int64_t begin = blk * kBlock, end = std::min(OC, begin + kBlock);
    acc_t<T> sum[kBlock] = {};
    for (int64_t r = 0; r < N; ++r) {
      const T* row = dout + r * OC;
      for (int64_t o = begin; o < end; ++o) sum[o - begin] += load(row[o]);
    }
    for (int64_t o = begin; o < end; ++o)
      db[o] = overwrite ? sum[o - begin] : db[o] + sum[o - begin];
  }
}

// The arguments of a linear backward (dinp, dw, db may be undefined); returns N, IC, OC.
LinearShape check_backward(const Tensor& dinp, const Tensor& dw, const Tensor& db,
                           const Tensor& dout, const Tensor& inp, const Tensor& w, const char* fn) {
  const LinearShape s = check_weights(inp, w, fn);
  const DType acc = detail::acc_dtype_of(inp.dtype());
  check_rows(dout, s, inp.dtype(), inp.device(), fn, "dout");
  if (dinp.defined()) detail::check_like(dinp, inp, fn, "dinp", "inp");
  if (dw.defined()) {
    check_on(dw, inp.device(), fn, "dw");
    check_dtype(dw, acc, fn, "dw");
    check_shape(dw, w.shape(), fn, "dw");
  }
  if (db.defined()) {
    check_on(db, inp.device(), fn, "db");
    check_dtype(db, acc, fn, "db");
    check_shape(db, {s.out_features}, fn, "db");
  }
  return s;
}

}  // namespace

void linear_forward(Tensor& out, const Tensor& inp, const Tensor& w, const Tensor& b) {
  const LinearShape s = check_weights(inp, w, kFwd);
  if (b.defined()) {
    check_on(b, inp.device(), kFwd, "b");
    check_dtype(b, inp.dtype(), kFwd, "b");
    check_shape(b, {s.out_features}, kFwd, "b");
  }
  check_rows(out, s, inp.dtype(), inp.device(), kFwd, "out");
#ifdef FLASHTRAIN_WITH_CUDA
  if (inp.device() == Device::cuda) return cuda::linear_forward(out, inp, w, b);
#endif
  dispatch_float(inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    forward_kernel(out.data<T>(), inp.data<T>(), w.data<T>(), b.defined() ? b.data<T>() : nullptr,
                   s);
  });
}

void linear_gelu_forward(Tensor& pre, Tensor& out, const Tensor& inp, const Tensor& w,
                         const Tensor& b) {
  constexpr const char* fn = "linear_gelu_forward";
  const LinearShape s = check_weights(inp, w, fn);
  check_rows(pre, s, inp.dtype(), inp.device(), fn, "pre");
  detail::check_like(out, pre, fn, "out", "pre");
  FT_CHECK(out.raw() != pre.raw(), fn, ": out must not alias pre (backward needs pre)");
#ifdef FLASHTRAIN_WITH_CUDA
  if (inp.device() == Device::cuda) {
    if (b.defined()) {
      check_on(b, inp.device(), fn, "b");
      check_dtype(b, inp.dtype(), fn, "b");
      check_shape(b, {s.out_features}, fn, "b");
    }
    return cuda::linear_gelu_forward(pre, out, inp, w, b);
  }
#endif
  linear_forward(pre, inp, w, b);
  gelu_forward(out, pre);
}

void linear_backward(Tensor& dinp, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& inp,
                     const Tensor& w, GradStore store) {
  const LinearShape s = check_backward(dinp, dw, db, dout, inp, w, kBwd);
#ifdef FLASHTRAIN_WITH_CUDA
  if (inp.device() == Device::cuda) return cuda::linear_backward(dinp, dw, db, dout, inp, w, store);
#endif
  const bool overwrite = store == GradStore::overwrite;
  const int64_t N = s.rows, IC = s.in_features, OC = s.out_features;
  dispatch_float(inp.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const T* d = dout.data<T>();
    if (dinp.defined()) {
      cpu::gemm(false, false, N, IC, OC, A(1), d, OC, w.data<T>(), IC, A(0), dinp.data<T>(), IC);
    }
    if (dw.defined()) {
      // A = acc_t<T> output picks the bf16 -> fp32 overload for bf16. beta = 0 never reads dw.
      cpu::gemm(true, false, OC, IC, N, A(1), d, OC, inp.data<T>(), IC, A(overwrite ? 0 : 1),
                dw.data<A>(), IC);
    }
    if (db.defined()) bias_grad_kernel(db.data<A>(), d, N, OC, overwrite);
  });
}

void linear_gelu_backward(Tensor& dpre, Tensor& dw, Tensor& db, const Tensor& dout,
                          const Tensor& act, const Tensor& w, const Tensor& pre, GradStore store) {
  constexpr const char* fn = "linear_gelu_backward";
  FT_CHECK(dpre.defined(), fn, ": dpre is undefined (it is the point of the call)");
  check_backward(dpre, dw, db, dout, act, w, fn);
  detail::check_like(pre, act, fn, "pre", "act");
  FT_CHECK(dpre.raw() != pre.raw() && dpre.raw() != dout.raw() && dpre.raw() != act.raw(), fn,
           ": dpre must not alias pre, act or dout");
#ifdef FLASHTRAIN_WITH_CUDA
  if (act.device() == Device::cuda)
    return cuda::linear_gelu_backward(dpre, dw, db, dout, act, w, pre, store);
#endif
  linear_backward(dpre, dw, db, dout, act, w, store);  // dpre holds d act here
  gelu_backward(dpre, dpre, pre);
}

}  // namespace ft::nn

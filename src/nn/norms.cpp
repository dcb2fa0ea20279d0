// LayerNorm and RMSNorm over the last dimension, CPU, and their fused residual variants.
//
// Forward is one row per iteration (two passes over the row: statistics, then output) and saves
// mean/rstd per row in the accumulation dtype. Backward writes dx row by row, then accumulates
// dw/db in a second sweep where each thread owns a block of columns and walks the rows in
// order: no atomics, and the sums do not depend on the thread count. The second sweep
// recomputes the normalised row from x and the saved statistics instead of storing it.
// Traffic: forward reads x once (twice from cache) and writes out; backward reads dout and x
// twice.
//
// Fused residual variants (the transformer's `x += branch; h = norm(x)` and its backward):
// add_*norm_forward writes the row of x_out = a + b (rounded to the compute dtype) and then
// normalises that row while it is in cache; *norm_backward_add adds each element of dx, rounded
// to the compute dtype, into the residual gradient instead of writing dx. Both do exactly the
// operations of the unfused pair (add, then norm; norm backward, then add) in the same order,
// so they are bit-identical to it in every dtype; they save one pass over a [rows, C] tensor
// and the temporary it lived in.
#include <algorithm>
#include <cmath>

#include "nn/checks.h"
#include "nn/layers.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

using detail::check_dtype;
using detail::check_on;

struct NormShape {
  int64_t rows, cols;
};

// x [..., C] with a weight [C] (and optional bias [C]) in x's dtype, on x's device (the call's).
NormShape check_norm_args(const Tensor& x, const Tensor& w, const Tensor& b, const char* fn) {
  detail::call_device(x, fn, "x");
  detail::check_float(x, fn, "x");
  FT_CHECK(x.ndim() >= 1, fn, ": x must have a feature dimension, got ", shape_str(x.shape()));
  const int64_t C = x.dim(-1);
  check_on(w, x.device(), fn, "w");
  check_dtype(w, x.dtype(), fn, "w");
  detail::check_shape(w, {C}, fn, "w");
  if (b.defined()) {
    check_on(b, x.device(), fn, "b");
    check_dtype(b, x.dtype(), fn, "b");
    detail::check_shape(b, {C}, fn, "b");
  }
  return {detail::rows_of(x), C};
}

// Per-row statistics: one accumulation-dtype value per row of x.
void check_stat(const Tensor& s, const Tensor& x, int64_t rows, const char* fn, const char* name) {
  check_on(s, x.device(), fn, name);
  check_dtype(s, detail::acc_dtype_of(x.dtype()), fn, name);
  FT_CHECK(s.numel() == rows, fn, ": ", name, " ", shape_str(s.shape()),
           " must hold one value per row (", rows, ") of x ", shape_str(x.shape()));
}

// A parameter gradient [C] in the accumulation dtype (skipped when undefined).
void check_param_grad(const Tensor& g, const Tensor& x, int64_t C, const char* fn,
                      const char* name) {
  if (!g.defined()) return;
  check_on(g, x.device(), fn, name);
  check_dtype(g, detail::acc_dtype_of(x.dtype()), fn, name);
  detail::check_shape(g, {C}, fn, name);
}

bool parallel_rows(const NormShape& s) {
  return s.rows * s.cols >= detail::kParallelMinWork;
}

// One row of LayerNorm: o = (x - mean) * rstd * w (+ b); returns the row's statistics.
template <class T>
void layernorm_row(T* o, acc_t<T>& mean, acc_t<T>& rstd, const T* xr, const T* w, const T* b,
                   int64_t C, double eps) {
  using A = acc_t<T>;
  A sum = 0;
  for (int64_t c = 0; c < C; ++c) sum += load(xr[c]);
  const A mu = sum / static_cast<A>(C);
  A var = 0;  // two-pass variance: no cancellation when |mean| >> std
  for (int64_t c = 0; c < C; ++c) {
    const A d = load(xr[c]) - mu;
    var += d * d;
  }
  const A rs = A(1) / std::sqrt(var / static_cast<A>(C) + static_cast<A>(eps));
  for (int64_t c = 0; c < C; ++c) {
    const A y = (load(xr[c]) - mu) * rs * load(w[c]);
    store(o[c], b ? y + load(b[c]) : y);
  }
  mean = mu;
  rstd = rs;
}

// One row of RMSNorm: o = x * rstd * w.
template <class T>
void rmsnorm_row(T* o, acc_t<T>& rstd, const T* xr, const T* w, int64_t C, double eps) {
  using A = acc_t<T>;
  A sum_sq = 0;
  for (int64_t c = 0; c < C; ++c) sum_sq += load(xr[c]) * load(xr[c]);
  const A rs = A(1) / std::sqrt(sum_sq / static_cast<A>(C) + static_cast<A>(eps));
  for (int64_t c = 0; c < C; ++c) store(o[c], load(xr[c]) * rs * load(w[c]));
  rstd = rs;
}

// out = norm(x) row by row; with a and b given, x is first written as a + b (x = x_out of the
// fused residual variant). mean == nullptr gives RMSNorm.
template <class T>
void norm_forward_kernel(T* out, acc_t<T>* mean, acc_t<T>* rstd, T* x, const T* a, const T* b,
                         const T* w, const T* bias, NormShape s, double eps) {
  const int64_t C = s.cols;
#pragma omp parallel for schedule(static) if (parallel_rows(s))
  for (int64_t r = 0; r < s.rows; ++r) {
    T* xr = x + r * C;
    if (a) {
      for (int64_t c = 0; c < C; ++c) store(xr[c], load(a[r * C + c]) + load(b[r * C + c]));
    }
    if (mean) {
      layernorm_row(out + r * C, mean[r], rstd[r], xr, w, bias, C, eps);
    } else {
      rmsnorm_row(out + r * C, rstd[r], xr, w, C, eps);
    }
  }
}

// dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w.
// mean == nullptr gives RMSNorm (no centring, so no mean(dnorm) term). accumulate: dx is the
// residual gradient and receives dx + (the value above rounded to T), as add() would form it.
template <class T>
void norm_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const acc_t<T>* mean,
                    const acc_t<T>* rstd, NormShape s, bool accumulate) {
  using A = acc_t<T>;
  const int64_t C = s.cols;
#pragma omp parallel for schedule(static) if (parallel_rows(s))
  for (int64_t r = 0; r < s.rows; ++r) {
    const T* xr = x + r * C;
    const T* dr = dout + r * C;
    const A mu = mean ? mean[r] : A(0), rs = rstd[r];
    A dnorm_sum = 0, dnorm_norm_sum = 0;
    for (int64_t c = 0; c < C; ++c) {
      const A dnorm = load(dr[c]) * load(w[c]);
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * (load(xr[c]) - mu) * rs;
    }
    const A dnorm_mean = mean ? dnorm_sum / static_cast<A>(C) : A(0);
    const A dnorm_norm_mean = dnorm_norm_sum / static_cast<A>(C);
    T* o = dx + r * C;  // may alias dout: dr[c] is read before o[c] is written
    for (int64_t c = 0; c < C; ++c) {
      const A norm = (load(xr[c]) - mu) * rs;
      const A dnorm = load(dr[c]) * load(w[c]);
      T v;
      store(v, (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs);
      store(o[c], accumulate ? load(o[c]) + load(v) : load(v));
    }
  }
}

// dw += sum over rows of dout * norm; db += sum over rows of dout (either may be null); = with
// overwrite.
template <class T>
void norm_param_grad_kernel(acc_t<T>* dw, acc_t<T>* db, const T* dout, const T* x,
                            const acc_t<T>* mean, const acc_t<T>* rstd, NormShape s,
                            bool overwrite) {
  using A = acc_t<T>;
  constexpr int64_t kBlock = 64;
  const int64_t C = s.cols, n_blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (parallel_rows(s))
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const int64_t begin = blk * kBlock, end = std::min(C, begin + kBlock);
    A dw_sum[kBlock] = {}, db_sum[kBlock] = {};
    for (int64_t r = 0; r < s.rows; ++r) {
      const A mu = mean ? mean[r] : A(0), rs = rstd[r];
      for (int64_t c = begin; c < end; ++c) {
        const A d = load(dout[r * C + c]);
        dw_sum[c - begin] += d * (load(x[r * C + c]) - mu) * rs;
        db_sum[c - begin] += d;
      }
    }
    for (int64_t c = begin; c < end; ++c) {
      if (dw) dw[c] = overwrite ? dw_sum[c - begin] : dw[c] + dw_sum[c - begin];
      if (db) db[c] = overwrite ? db_sum[c - begin] : db[c] + db_sum[c - begin];
    }
  }
}

// The forward shared by both norms and their fused variants: out = norm(x); with a and b
// defined, x (then the x_out of the fused variant) is written as a + b first. mean undefined
// means RMSNorm.
void norm_forward(Tensor& out, Tensor& mean, Tensor& rstd, Tensor& x, const Tensor& a,
                  const Tensor& b, const Tensor& w, const Tensor& bias, double eps,
                  const char* fn) {
  const bool fused = a.defined();
  const NormShape s = check_norm_args(fused ? a : x, w, bias, fn);
  FT_CHECK(eps >= 0, fn, ": eps ", eps, " must be >= 0");
  if (fused) {
    detail::check_like(b, a, fn, "b", "a");
    detail::check_like(x, a, fn, "x_out", "a");
  }
  detail::check_like(out, x, fn, fused ? "h" : "out", fused ? "x_out" : "x");
  if (mean.defined()) check_stat(mean, x, s.rows, fn, "mean");
  check_stat(rstd, x, s.rows, fn, "rstd");
  if (fused) {
    FT_CHECK(out.raw() != x.raw() && out.raw() != a.raw() && out.raw() != b.raw(), fn,
             ": h must not alias x_out, a or b");
  }
#ifdef FLASHTRAIN_WITH_CUDA
  if (x.device() == Device::cuda) {
    if (fused) return cuda::add_norm_forward(x, out, mean, rstd, a, b, w, bias, eps);
    if (mean.defined()) return cuda::layernorm_forward(out, mean, rstd, x, w, bias, eps);
    return cuda::rmsnorm_forward(out, rstd, x, w, eps);
  }
#endif
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    norm_forward_kernel(out.data<T>(), mean.defined() ? mean.data<A>() : nullptr, rstd.data<A>(),
                        x.data<T>(), fused ? a.data<T>() : nullptr, fused ? b.data<T>() : nullptr,
                        w.data<T>(), bias.defined() ? bias.data<T>() : nullptr, s, eps);
  });
}

// The backward shared by both norms; mean undefined means RMSNorm. accumulate: dx is the
// residual gradient and receives += (the fused variants).
void norm_backward(Tensor& dx, Tensor& dw, Tensor* db, const Tensor& dout, const Tensor& x,
                   const Tensor& w, const Tensor* mean, const Tensor& rstd, bool accumulate,
                   GradStore store, const char* fn) {
  const NormShape s = check_norm_args(x, w, Tensor(), fn);
  detail::check_like(dout, x, fn, "dout", "x");
  if (accumulate) {
    FT_CHECK(dx.defined(), fn, ": dresidual is undefined");
    detail::check_like(dx, x, fn, "dresidual", "x");
    FT_CHECK(dx.raw() != dout.raw() && dx.raw() != x.raw(), fn,
             ": dresidual must not alias dout or x");
  } else if (dx.defined()) {
    detail::check_like(dx, x, fn, "dx", "x");
  }
  check_param_grad(dw, x, s.cols, fn, "dw");
  if (db) check_param_grad(*db, x, s.cols, fn, "db");
  if (mean) check_stat(*mean, x, s.rows, fn, "mean");
  check_stat(rstd, x, s.rows, fn, "rstd");
#ifdef FLASHTRAIN_WITH_CUDA
  if (x.device() == Device::cuda) {
    Tensor no_db;
    if (accumulate) {
      return cuda::norm_backward_add(dx, dw, db ? *db : no_db, dout, x, w, mean ? *mean : Tensor(),
                                     rstd, store);
    }
    if (mean) return cuda::layernorm_backward(dx, dw, *db, dout, x, w, *mean, rstd, store);
    return cuda::rmsnorm_backward(dx, dw, dout, x, w, rstd, store);
  }
#endif
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const A* mu = mean ? mean->data<A>() : nullptr;
    const A* rs = rstd.data<A>();
    if (dx.defined()) {
      norm_dx_kernel(dx.data<T>(), dout.data<T>(), x.data<T>(), w.data<T>(), mu, rs, s, accumulate);
    }
    A* dw_p = dw.defined() ? dw.data<A>() : nullptr;
    A* db_p = db && db->defined() ? db->data<A>() : nullptr;
    if (dw_p || db_p) {
      norm_param_grad_kernel(dw_p, db_p, dout.data<T>(), x.data<T>(), mu, rs, s,
                             store == GradStore::overwrite);
    }
  });
}

}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, double eps) {
  FT_CHECK(mean.defined(), "layernorm_forward: mean is undefined");
  Tensor x_in = x;  // read only: no a and b, so nothing writes it
  norm_forward(out, mean, rstd, x_in, Tensor(), Tensor(), w, b, eps, "layernorm_forward");
}

void layernorm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd, GradStore store) {
  norm_backward(dx, dw, &db, dout, x, w, &mean, rstd, false, store, "layernorm_backward");
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  Tensor x_in = x, no_mean;
  norm_forward(out, no_mean, rstd, x_in, Tensor(), Tensor(), w, Tensor(), eps, "rmsnorm_forward");
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd, GradStore store) {
  norm_backward(dx, dw, nullptr, dout, x, w, nullptr, rstd, false, store, "rmsnorm_backward");
}

void add_layernorm_forward(Tensor& x_out, Tensor& h, Tensor& mean, Tensor& rstd, const Tensor& a,
                           const Tensor& b, const Tensor& w, const Tensor& bias, double eps) {
  FT_CHECK(mean.defined(), "add_layernorm_forward: mean is undefined");
  norm_forward(h, mean, rstd, x_out, a, b, w, bias, eps, "add_layernorm_forward");
}

void add_rmsnorm_forward(Tensor& x_out, Tensor& h, Tensor& rstd, const Tensor& a, const Tensor& b,
                         const Tensor& w, double eps) {
  Tensor no_mean;
  norm_forward(h, no_mean, rstd, x_out, a, b, w, Tensor(), eps, "add_rmsnorm_forward");
}

void layernorm_backward_add(Tensor& dresidual, Tensor& dw, Tensor& db, const Tensor& dout,
                            const Tensor& x, const Tensor& w, const Tensor& mean,
                            const Tensor& rstd, GradStore store) {
  norm_backward(dresidual, dw, &db, dout, x, w, &mean, rstd, true, store, "layernorm_backward_add");
}

void rmsnorm_backward_add(Tensor& dresidual, Tensor& dw, const Tensor& dout, const Tensor& x,
                          const Tensor& w, const Tensor& rstd, GradStore store) {
  norm_backward(dresidual, dw, nullptr, dout, x, w, nullptr, rstd, true, store,
                "rmsnorm_backward_add");
}

}  // namespace ft::nn

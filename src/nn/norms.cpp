// LayerNorm and RMSNorm over the last dimension, CPU.
//
// Forward is one row per iteration (two passes over the row: statistics, then output) and saves
// mean/rstd per row in the accumulation dtype. Backward writes dx row by row, then accumulates
// dw/db in a second sweep where each thread owns a block of columns and walks the rows in
// order: no atomics, and the sums do not depend on the thread count. The second sweep
// recomputes the normalised row from x and the saved statistics instead of storing it.
// Traffic: forward reads x once (twice from cache) and writes out; backward reads dout and x
// twice.
#include <algorithm>
#include <cmath>

#include "nn/checks.h"
#include "nn/layers.h"

namespace ft::nn {
namespace {

using detail::check_defined;
using detail::check_dtype;

struct NormShape {
  int64_t rows, cols;
};

// x [..., C] with a weight [C] (and optional bias [C]) in x's dtype.
NormShape check_norm_args(const Tensor& x, const Tensor& w, const Tensor& b, const char* fn) {
  check_defined(x, fn, "x");
  detail::check_float(x, fn, "x");
  FT_CHECK(x.ndim() >= 1, fn, ": x must have a feature dimension, got ", shape_str(x.shape()));
  const int64_t C = x.dim(-1);
  check_defined(w, fn, "w");
  check_dtype(w, x.dtype(), fn, "w");
  detail::check_shape(w, {C}, fn, "w");
  if (b.defined()) {
    check_defined(b, fn, "b");
    check_dtype(b, x.dtype(), fn, "b");
    detail::check_shape(b, {C}, fn, "b");
  }
  return {detail::rows_of(x), C};
}

// Per-row statistics: one accumulation-dtype value per row of x.
void check_stat(const Tensor& s, const Tensor& x, int64_t rows, const char* fn, const char* name) {
  check_defined(s, fn, name);
  check_dtype(s, detail::acc_dtype_of(x.dtype()), fn, name);
  FT_CHECK(s.numel() == rows, fn, ": ", name, " ", shape_str(s.shape()),
           " must hold one value per row (", rows, ") of x ", shape_str(x.shape()));
}

// A parameter gradient [C] in the accumulation dtype (skipped when undefined).
void check_param_grad(const Tensor& g, const Tensor& x, int64_t C, const char* fn,
                      const char* name) {
  if (!g.defined()) return;
  check_defined(g, fn, name);
  check_dtype(g, detail::acc_dtype_of(x.dtype()), fn, name);
  detail::check_shape(g, {C}, fn, name);
}

bool parallel_rows(const NormShape& s) {
  return s.rows * s.cols >= detail::kParallelMinWork;
}

template <class T>
void layernorm_forward_kernel(T* out, acc_t<T>* mean, acc_t<T>* rstd, const T* x, const T* w,
                              const T* b, NormShape s, double eps) {
  using A = acc_t<T>;
  const int64_t C = s.cols;
#pragma omp parallel for schedule(static) if (parallel_rows(s))
  for (int64_t r = 0; r < s.rows; ++r) {
    const T* xr = x + r * C;
    A sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += load(xr[c]);
    const A mu = sum / static_cast<A>(C);
    A var = 0;  // two-pass variance: no cancellation when |mean| >> std
    for (int64_t c = 0; c < C; ++c) {
      const A d = load(xr[c]) - mu;
      var += d * d;
    }
    const A rs = A(1) / std::sqrt(var / static_cast<A>(C) + static_cast<A>(eps));
    T* o = out + r * C;
    for (int64_t c = 0; c < C; ++c) {
      const A y = (load(xr[c]) - mu) * rs * load(w[c]);
      store(o[c], b ? y + load(b[c]) : y);
    }
    mean[r] = mu;
    rstd[r] = rs;
  }
}

// dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)), dnorm = dout * w.
// mean == nullptr gives RMSNorm (no centring, so no mean(dnorm) term).
template <class T>
void norm_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const acc_t<T>* mean,
                    const acc_t<T>* rstd, NormShape s) {
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
      store(o[c], (dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs);
    }
  }
}

// dw += sum over rows of dout * norm; db += sum over rows of dout (either may be null).
template <class T>
void norm_param_grad_kernel(acc_t<T>* dw, acc_t<T>* db, const T* dout, const T* x,
                            const acc_t<T>* mean, const acc_t<T>* rstd, NormShape s) {
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
      if (dw) dw[c] += dw_sum[c - begin];
      if (db) db[c] += db_sum[c - begin];
    }
  }
}

template <class T>
void rmsnorm_forward_kernel(T* out, acc_t<T>* rstd, const T* x, const T* w, NormShape s,
                            double eps) {
  using A = acc_t<T>;
  const int64_t C = s.cols;
#pragma omp parallel for schedule(static) if (parallel_rows(s))
  for (int64_t r = 0; r < s.rows; ++r) {
    const T* xr = x + r * C;
    A sum_sq = 0;
    for (int64_t c = 0; c < C; ++c) sum_sq += load(xr[c]) * load(xr[c]);
    const A rs = A(1) / std::sqrt(sum_sq / static_cast<A>(C) + static_cast<A>(eps));
    T* o = out + r * C;
    for (int64_t c = 0; c < C; ++c) store(o[c], load(xr[c]) * rs * load(w[c]));
    rstd[r] = rs;
  }
}

// The backward shared by both norms; mean undefined means RMSNorm.
void norm_backward(Tensor& dx, Tensor& dw, Tensor* db, const Tensor& dout, const Tensor& x,
                   const Tensor& w, const Tensor* mean, const Tensor& rstd, const char* fn) {
  const NormShape s = check_norm_args(x, w, Tensor(), fn);
  detail::check_like(dout, x, fn, "dout", "x");
  if (dx.defined()) detail::check_like(dx, x, fn, "dx", "x");
  check_param_grad(dw, x, s.cols, fn, "dw");
  if (db) check_param_grad(*db, x, s.cols, fn, "db");
  if (mean) check_stat(*mean, x, s.rows, fn, "mean");
  check_stat(rstd, x, s.rows, fn, "rstd");
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    const A* mu = mean ? mean->data<A>() : nullptr;
    const A* rs = rstd.data<A>();
    if (dx.defined()) {
      norm_dx_kernel(dx.data<T>(), dout.data<T>(), x.data<T>(), w.data<T>(), mu, rs, s);
    }
    A* dw_p = dw.defined() ? dw.data<A>() : nullptr;
    A* db_p = db && db->defined() ? db->data<A>() : nullptr;
    if (dw_p || db_p) norm_param_grad_kernel(dw_p, db_p, dout.data<T>(), x.data<T>(), mu, rs, s);
  });
}

}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, double eps) {
  constexpr const char* fn = "layernorm_forward";
  const NormShape s = check_norm_args(x, w, b, fn);
  FT_CHECK(eps >= 0, fn, ": eps ", eps, " must be >= 0");
  detail::check_like(out, x, fn, "out", "x");
  check_stat(mean, x, s.rows, fn, "mean");
  check_stat(rstd, x, s.rows, fn, "rstd");
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using A = acc_t<T>;
    layernorm_forward_kernel(out.data<T>(), mean.data<A>(), rstd.data<A>(), x.data<T>(),
                             w.data<T>(), b.defined() ? b.data<T>() : nullptr, s, eps);
  });
}

void layernorm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  norm_backward(dx, dw, &db, dout, x, w, &mean, rstd, "layernorm_backward");
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  constexpr const char* fn = "rmsnorm_forward";
  const NormShape s = check_norm_args(x, w, Tensor(), fn);
  FT_CHECK(eps >= 0, fn, ": eps ", eps, " must be >= 0");
  detail::check_like(out, x, fn, "out", "x");
  check_stat(rstd, x, s.rows, fn, "rstd");
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_forward_kernel(out.data<T>(), rstd.data<acc_t<T>>(), x.data<T>(), w.data<T>(), s, eps);
  });
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  norm_backward(dx, dw, nullptr, dout, x, w, nullptr, rstd, "rmsnorm_backward");
}

}  // namespace ft::nn

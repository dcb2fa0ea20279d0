// LayerNorm and RMSNorm over the last dimension C on the GPU, fp32 accumulation.
//
// Forward: one warp per row (8 rows per 256-thread block), lanes stride the row in 16-byte
// packs. LayerNorm takes the mean, then the variance in a second pass over the row (no
// cancellation when |mean| >> std, as on the CPU; the second pass hits L1/L2), then writes out
// and saves mean/rstd. Traffic: x read once from DRAM, out written once.
// Backward, input gradient: one warp per row reduces sum(dnorm) and sum(dnorm * norm), dnorm =
// dout * w, then writes dx = rstd * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)).
// Backward, parameter gradients, deterministic without atomics: stage 1 gives each block a
// fixed chunk of rows and each thread one column, summing dout * norm and dout down the chunk
// (coalesced across the warp) into a partial per chunk; stage 2 adds the chunks' partials in
// order into dw/db. The chunking depends only on the number of rows.
// Parameter gradients are formed before dx is written, so dx may alias dout.
//
// Fused residual variants (one kernel each instead of two):
// add_norm_forward: the first pass over the row reads a and b, writes x_out = a + b (rounded to
// the compute dtype) and sums it; the statistics and output passes then re-read x_out, which
// the same lane just wrote (L1/L2, no DRAM). DRAM traffic per row element: read a, b; write
// x_out, h = 4 accesses instead of add (3) + norm (2) = 5, and one launch instead of two.
// norm_backward_add: the dx kernel reads the residual gradient and writes
// dresidual + round(dx) (the add with __fadd_rn, so no FMA contraction with the dx product:
// the same bits as the unfused norm backward + add). DRAM traffic per element: read dout, x,
// dresidual; write dresidual = 4 instead of dx kernel (3) + add (3) = 6, no dx temporary, one
// launch fewer. Parameter gradients are unchanged (same two-stage reduction).
#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

constexpr int kRowThreads = 256;  // 8 warps, one row each
constexpr int kRowsPerBlock = kRowThreads / 32;
constexpr int kMaxRowChunks = 128;  // stage-1 chunks for the parameter gradients
constexpr int kColThreads = 256;

// mean == nullptr: RMSNorm (no centring); bias == nullptr: no bias. res_a != nullptr: the
// fused residual variant, x_out = res_a + res_b is written first and x must equal x_out.
template <class T, int W>
__global__ void norm_forward_kernel(T* out, float* mean, float* rstd, const T* x, T* x_out,
                                    const T* res_a, const T* res_b, const T* w, const T* bias,
                                    int64_t rows, int C, float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * C;
  const int n_packs = C / W;
  float sum = 0.0f;
  if (res_a != nullptr) {
    // Each lane later re-reads exactly the packs it writes here: no synchronisation needed.
    for (int p = lane; p < n_packs; p += 32) {
      const Pack<T, W> ap = load_pack<T, W>(res_a + row * C + p * W);
      const Pack<T, W> bp = load_pack<T, W>(res_b + row * C + p * W);
      Pack<T, W> sp;
#pragma unroll
      for (int k = 0; k < W; ++k) {
        sp.v[k] = from_f32<T>(to_f32(ap.v[k]) + to_f32(bp.v[k]));
        sum += to_f32(sp.v[k]);
      }
      store_pack<T, W>(x_out + row * C + p * W, sp);
    }
  } else if (mean != nullptr) {
    for (int p = lane; p < n_packs; p += 32) {
      const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
#pragma unroll
      for (int k = 0; k < W; ++k) sum += to_f32(xp.v[k]);
    }
  }
  const float mu = mean != nullptr ? warp_sum(sum) / static_cast<float>(C) : 0.0f;
  float sq = 0.0f;
  for (int p = lane; p < n_packs; p += 32) {
    const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float d = to_f32(xp.v[k]) - mu;
      sq += d * d;
    }
  }
  const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
  T* o = out + row * C;
  for (int p = lane; p < n_packs; p += 32) {
    const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
    const Pack<T, W> wp = load_pack<T, W>(w + p * W);
    Pack<T, W> bp{};
    if (bias != nullptr) bp = load_pack<T, W>(bias + p * W);
    Pack<T, W> op;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float y = (to_f32(xp.v[k]) - mu) * rs * to_f32(wp.v[k]);
      op.v[k] = from_f32<T>(bias != nullptr ? y + to_f32(bp.v[k]) : y);
    }
    store_pack<T, W>(o + p * W, op);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = mu;
    rstd[row] = rs;
  }
}

// Accumulate: dx is the residual gradient and receives dx + round(the norm's dx).
template <class T, int W, bool Accumulate>
__global__ void norm_dx_kernel(T* dx, const T* dout, const T* x, const T* w, const float* mean,
                               const float* rstd, int64_t rows, int C) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const T* xr = x + row * C;
  const T* dr = dout + row * C;
  const float mu = mean != nullptr ? mean[row] : 0.0f, rs = rstd[row];
  const int n_packs = C / W;
  float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
  for (int p = lane; p < n_packs; p += 32) {
    const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
    const Pack<T, W> dp = load_pack<T, W>(dr + p * W);
    const Pack<T, W> wp = load_pack<T, W>(w + p * W);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float dnorm = to_f32(dp.v[k]) * to_f32(wp.v[k]);
      dnorm_sum += dnorm;
      dnorm_norm_sum += dnorm * (to_f32(xp.v[k]) - mu) * rs;
    }
  }
  // Both sums are complete in every lane before any lane writes: dx may alias dout.
  const float dnorm_mean = mean != nullptr ? warp_sum(dnorm_sum) / static_cast<float>(C) : 0.0f;
  const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(C);
  T* o = dx + row * C;
  for (int p = lane; p < n_packs; p += 32) {
    const Pack<T, W> xp = load_pack<T, W>(xr + p * W);
    const Pack<T, W> dp = load_pack<T, W>(dr + p * W);
    const Pack<T, W> wp = load_pack<T, W>(w + p * W);
    Pack<T, W> op;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float norm = (to_f32(xp.v[k]) - mu) * rs;
      const float dnorm = to_f32(dp.v[k]) * to_f32(wp.v[k]);
      op.v[k] = from_f32<T>((dnorm - dnorm_mean - norm * dnorm_norm_mean) * rs);
    }
    if constexpr (Accumulate) {
      const Pack<T, W> rp = load_pack<T, W>(o + p * W);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        op.v[k] = from_f32<T>(__fadd_rn(to_f32(rp.v[k]), to_f32(op.v[k])));
      }
    }
    store_pack<T, W>(o + p * W, op);
  }
}

// Stage 1: block (column block, chunk) sums rows [chunk * rows_per_chunk, ...) for its columns.
// partial: [2, n_chunks, C] (dw part, then db part).
template <class T>
__global__ void norm_param_partial_kernel(float* partial, const T* dout, const T* x,
                                          const float* mean, const float* rstd, int64_t rows,
                                          int64_t rows_per_chunk, int C, int n_chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  const int chunk = blockIdx.y;
  if (c >= C) return;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
  float dw = 0.0f, db = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    const float d = to_f32(dout[r * C + c]);
    const float mu = mean != nullptr ? mean[r] : 0.0f;
    dw += d * (to_f32(x[r * C + c]) - mu) * rstd[r];
    db += d;
  }
  partial[static_cast<int64_t>(chunk) * C + c] = dw;
  partial[static_cast<int64_t>(n_chunks + chunk) * C + c] = db;
}

// Stage 2: dw[c] += sum over chunks (in order) of the partials; same for db.
__global__ void norm_param_finish_kernel(float* dw, float* db, const float* partial, int C,
                                         int n_chunks) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw_sum = 0.0f, db_sum = 0.0f;
  for (int k = 0; k < n_chunks; ++k) {
    dw_sum += partial[static_cast<int64_t>(k) * C + c];
    db_sum += partial[static_cast<int64_t>(n_chunks + k) * C + c];
  }
  if (dw != nullptr) dw[c] += dw_sum;
  if (db != nullptr) db[c] += db_sum;
}

int64_t rows_of(const Tensor& x) {
  return x.dim(-1) == 0 ? 0 : x.numel() / x.dim(-1);
}

// res_a == nullptr: plain norm of x; else x_out = res_a + res_b first and x = x_out.
template <class T>
void launch_norm_forward(T* out, float* mean, float* rstd, const T* x, T* x_out, const T* res_a,
                         const T* res_b, const T* w, const T* bias, int64_t rows, int C,
                         double eps) {
  const auto blocks = static_cast<unsigned>(ceil_div(rows, kRowsPerBlock));
  const auto e = static_cast<float>(eps);
  if (can_use_packs<T>(C, {out, x, x_out, res_a, res_b, w, bias})) {
    norm_forward_kernel<T, kPackWidth<T>><<<blocks, kRowThreads, 0, stream()>>>(
        out, mean, rstd, x, x_out, res_a, res_b, w, bias, rows, C, e);
  } else {
    norm_forward_kernel<T, 1><<<blocks, kRowThreads, 0, stream()>>>(
        out, mean, rstd, x, x_out, res_a, res_b, w, bias, rows, C, e);
  }
  FT_CUDA_CHECK_LAUNCH();
}

template <class T, bool Accumulate>
void launch_norm_dx(T* dx, const T* dout, const T* x, const T* w, const float* mu, const float* rs,
                    int64_t rows, int C) {
  const auto blocks = static_cast<unsigned>(ceil_div(rows, kRowsPerBlock));
  if (can_use_packs<T>(C, {dx, dout, x, w})) {
    norm_dx_kernel<T, kPackWidth<T>, Accumulate>
        <<<blocks, kRowThreads, 0, stream()>>>(dx, dout, x, w, mu, rs, rows, C);
  } else {
    norm_dx_kernel<T, 1, Accumulate>
        <<<blocks, kRowThreads, 0, stream()>>>(dx, dout, x, w, mu, rs, rows, C);
  }
  FT_CUDA_CHECK_LAUNCH();
}

// mean undefined: RMSNorm. db may be null (RMSNorm, or not wanted). accumulate: dx is the
// residual gradient (+=).
void norm_backward(Tensor& dx, Tensor& dw, Tensor* db, const Tensor& dout, const Tensor& x,
                   const Tensor& w, const Tensor& mean, const Tensor& rstd, bool accumulate,
                   const char* fn) {
  const int64_t rows = rows_of(x);
  const int C = static_cast<int>(x.dim(-1));
  if (rows == 0 || C == 0) return;
  dispatch_cuda_float(x.dtype(), fn, [&](auto tag) {
    using T = decltype(tag);
    const float* mu = ptr_or_null<float>(mean);
    const float* rs = ptr<float>(rstd);
    float* dw_p = ptr_or_null<float>(dw);
    float* db_p = db != nullptr ? ptr_or_null<float>(*db) : nullptr;
    if (dw_p != nullptr || db_p != nullptr) {
      const int n_chunks = static_cast<int>(std::min<int64_t>(rows, kMaxRowChunks));
      const int64_t rows_per_chunk = ceil_div(rows, n_chunks);
      Tensor partial = Tensor::empty({2, n_chunks, C}, DType::f32, Device::cuda);
      const dim3 grid(static_cast<unsigned>(ceil_div(C, kColThreads)),
                      static_cast<unsigned>(n_chunks));
      norm_param_partial_kernel<T><<<grid, kColThreads, 0, stream()>>>(
          ptr<float>(partial), ptr<T>(dout), ptr<T>(x), mu, rs, rows, rows_per_chunk, C, n_chunks);
      FT_CUDA_CHECK_LAUNCH();
      norm_param_finish_kernel<<<static_cast<unsigned>(ceil_div(C, kColThreads)), kColThreads, 0,
                                 stream()>>>(dw_p, db_p, ptr<float>(partial), C, n_chunks);
      FT_CUDA_CHECK_LAUNCH();
    }
    if (dx.defined()) {
      if (accumulate) {
        launch_norm_dx<T, true>(ptr<T>(dx), ptr<T>(dout), ptr<T>(x), ptr<T>(w), mu, rs, rows, C);
      } else {
        launch_norm_dx<T, false>(ptr<T>(dx), ptr<T>(dout), ptr<T>(x), ptr<T>(w), mu, rs, rows, C);
      }
    }
  });
}

}  // namespace

void layernorm_forward(Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& x, const Tensor& w,
                       const Tensor& b, double eps) {
  const int64_t rows = rows_of(x);
  if (rows == 0) return;
  dispatch_cuda_float(x.dtype(), "layernorm_forward", [&](auto tag) {
    using T = decltype(tag);
    launch_norm_forward<T>(ptr<T>(out), ptr<float>(mean), ptr<float>(rstd), ptr<T>(x), nullptr,
                           nullptr, nullptr, ptr<T>(w), ptr_or_null<T>(b), rows,
                           static_cast<int>(x.dim(-1)), eps);
  });
}

void layernorm_backward(Tensor& dx, Tensor& dw, Tensor& db, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  norm_backward(dx, dw, &db, dout, x, w, mean, rstd, false, "layernorm_backward");
}

void rmsnorm_forward(Tensor& out, Tensor& rstd, const Tensor& x, const Tensor& w, double eps) {
  const int64_t rows = rows_of(x);
  if (rows == 0) return;
  dispatch_cuda_float(x.dtype(), "rmsnorm_forward", [&](auto tag) {
    using T = decltype(tag);
    launch_norm_forward<T>(ptr<T>(out), nullptr, ptr<float>(rstd), ptr<T>(x), nullptr, nullptr,
                           nullptr, ptr<T>(w), nullptr, rows, static_cast<int>(x.dim(-1)), eps);
  });
}

void rmsnorm_backward(Tensor& dx, Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
                      const Tensor& rstd) {
  norm_backward(dx, dw, nullptr, dout, x, w, Tensor(), rstd, false, "rmsnorm_backward");
}

void add_norm_forward(Tensor& x_out, Tensor& out, Tensor& mean, Tensor& rstd, const Tensor& a,
                      const Tensor& b, const Tensor& w, const Tensor& bias, double eps) {
  const int64_t rows = rows_of(a);
  if (rows == 0) return;
  dispatch_cuda_float(a.dtype(), "add_norm_forward", [&](auto tag) {
    using T = decltype(tag);
    T* xo = ptr<T>(x_out);
    launch_norm_forward<T>(ptr<T>(out), ptr_or_null<float>(mean), ptr<float>(rstd), xo, xo,
                           ptr<T>(a), ptr<T>(b), ptr<T>(w), ptr_or_null<T>(bias), rows,
                           static_cast<int>(a.dim(-1)), eps);
  });
}

void norm_backward_add(Tensor& dresidual, Tensor& dw, Tensor& db, const Tensor& dout,
                       const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd) {
  norm_backward(dresidual, dw, &db, dout, x, w, mean, rstd, true, "norm_backward_add");
}

}  // namespace ft::nn::cuda

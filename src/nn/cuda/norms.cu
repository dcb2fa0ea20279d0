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
// Rows held in registers (the fast path: rows of up to 32 * kMaxLanePacks packs of 16 bytes,
// every pointer 16-byte aligned): the same fp32 operations in the same order as the streaming
// kernels above, each rounded as written (norm_out, add_dnorm, norm_dx), so the same bits, but each
// lane loads its packs of a row (pack lane + 32 k) all at once and keeps them, so that x (and a, b,
// dout) come from DRAM once with every load in flight together, and no pass re-reads the row. The
// backward also forms the parameter gradients in the same pass: each lane sums dout * norm and dout
// of its columns over the rows of its warp (a fixed grid of at most kBackwardBlocks blocks, warps
// taking rows in turn), the block adds its warps in order through shared memory, and stage 2 below
// adds the blocks in order: deterministic, and x and dout are read once instead of twice. Traffic
// of the fused backward per element: read dout, x (and dresidual), write dx: 3-4 accesses instead
// of 5-6.
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
#include <type_traits>

#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

constexpr int kRowThreads = 256;  // 8 warps, one row each
constexpr int kRowsPerBlock = kRowThreads / 32;
constexpr int kMaxRowChunks = 128;  // stage-1 chunks for the parameter gradients
constexpr int kColThreads = 256;

// The per-element arithmetic of every kernel below, each operation rounded as written (no FMA
// contraction): a compiler free to contract decides per kernel and instantiation, and the
// streaming and register kernels, fused residual or not, must give the same bits.
__device__ __forceinline__ float square_add(float acc, float d) {
  return __fadd_rn(acc, __fmul_rn(d, d));
}
// (x - mean) * rstd * w
__device__ __forceinline__ float norm_out(float x, float mu, float rs, float w) {
  return __fmul_rn(__fmul_rn(__fsub_rn(x, mu), rs), w);
}
// The row sums of dnorm = dout * w and of dnorm * norm.
__device__ __forceinline__ void add_dnorm(float& dnorm_sum, float& dnorm_norm_sum, float d, float w,
                                          float x, float mu, float rs) {
  const float dnorm = __fmul_rn(d, w);
  dnorm_sum = __fadd_rn(dnorm_sum, dnorm);
  dnorm_norm_sum = __fadd_rn(dnorm_norm_sum, __fmul_rn(__fmul_rn(dnorm, __fsub_rn(x, mu)), rs));
}
// dx = (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) * rstd
__device__ __forceinline__ float norm_dx(float d, float w, float x, float mu, float rs,
                                         float dnorm_mean, float dnorm_norm_mean) {
  const float norm = __fmul_rn(__fsub_rn(x, mu), rs);
  const float dnorm = __fmul_rn(d, w);
  return __fmul_rn(__fsub_rn(__fsub_rn(dnorm, dnorm_mean), __fmul_rn(norm, dnorm_norm_mean)), rs);
}

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
      sq = square_add(sq, to_f32(xp.v[k]) - mu);
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
      const float y = norm_out(to_f32(xp.v[k]), mu, rs, to_f32(wp.v[k]));
      op.v[k] = from_f32<T>(bias != nullptr ? __fadd_rn(y, to_f32(bp.v[k])) : y);
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
      add_dnorm(dnorm_sum, dnorm_norm_sum, to_f32(dp.v[k]), to_f32(wp.v[k]), to_f32(xp.v[k]), mu,
                rs);
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
      op.v[k] = from_f32<T>(norm_dx(to_f32(dp.v[k]), to_f32(wp.v[k]), to_f32(xp.v[k]), mu, rs,
                                    dnorm_mean, dnorm_norm_mean));
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

// Stage 2: dw[c] += the sum over chunks of the dw partials, db[c] the same with the db part
// (add_column_partials in common.cuh: a fixed order), both in one launch; = with overwrite.
void finish_param_grads(float* dw, float* db, const float* partial, int C, int n_chunks,
                        bool overwrite) {
  add_column_partials(dw, partial, n_chunks, C, overwrite, db,
                      partial + static_cast<int64_t>(n_chunks) * C);
}

// ---- rows held in registers ----

// Packs of a row per lane: 1024 bf16 or 512 fp32 columns. Eight (2048 bf16 columns, llama3-1b's
// width) took 242-255 registers in the backward, one block per multiprocessor, and made
// llama3-1b's norms slower (4.12 -> 4.57 ms a step, docs/PERF.md): those rows stream.
constexpr int kMaxLanePacks = 4;
constexpr int kBackwardBlocks = 256;  // fixed (a function of the row count only): deterministic

// Lane `lane`'s packs of a row (pack lane + 32 k for k < K; those past the row are not loaded).
template <class T, int W, int K>
struct LanePacks {
  Pack<T, W> v[K];

  __device__ __forceinline__ void load(const T* row, int n_packs, int lane) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (lane + 32 * k < n_packs) v[k] = load_pack<T, W>(row + (lane + 32 * k) * W);
    }
  }
};

// As norm_forward_kernel, on the lane's packs in registers.
template <class T, int W, int K>
__global__ void __launch_bounds__(kRowThreads)
    norm_forward_rows_kernel(T* out, float* mean, float* rstd, const T* x, T* x_out, const T* res_a,
                             const T* res_b, const T* w, const T* bias, int64_t rows, int C,
                             float eps) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int n_packs = C / W;
  auto live = [&](int k) { return lane + 32 * k < n_packs; };
  LanePacks<T, W, K> xr;
  float sum = 0.0f;
  if (res_a != nullptr) {
    LanePacks<T, W, K> a, b;
    a.load(res_a + row * C, n_packs, lane);
    b.load(res_b + row * C, n_packs, lane);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!live(k)) continue;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        xr.v[k].v[i] = from_f32<T>(to_f32(a.v[k].v[i]) + to_f32(b.v[k].v[i]));
        sum += to_f32(xr.v[k].v[i]);
      }
      store_pack<T, W>(x_out + row * C + (lane + 32 * k) * W, xr.v[k]);
    }
  } else {
    xr.load(x + row * C, n_packs, lane);
    if (mean != nullptr) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        if (!live(k)) continue;
#pragma unroll
        for (int i = 0; i < W; ++i) sum += to_f32(xr.v[k].v[i]);
      }
    }
  }
  const float mu = mean != nullptr ? warp_sum(sum) / static_cast<float>(C) : 0.0f;
  float sq = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!live(k)) continue;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      sq = square_add(sq, to_f32(xr.v[k].v[i]) - mu);
    }
  }
  const float rs = 1.0f / sqrtf(warp_sum(sq) / static_cast<float>(C) + eps);
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (!live(k)) continue;
    const int col = (lane + 32 * k) * W;
    const Pack<T, W> wp = load_pack<T, W>(w + col);
    Pack<T, W> bp{};
    if (bias != nullptr) bp = load_pack<T, W>(bias + col);
    Pack<T, W> op;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float y = norm_out(to_f32(xr.v[k].v[i]), mu, rs, to_f32(wp.v[i]));
      op.v[i] = from_f32<T>(bias != nullptr ? __fadd_rn(y, to_f32(bp.v[i])) : y);
    }
    store_pack<T, W>(out + row * C + col, op);
  }
  if (lane == 0) {
    if (mean != nullptr) mean[row] = mu;
    rstd[row] = rs;
  }
}

// dx as norm_dx_kernel (Accumulate: dx is the residual gradient), and, when partial is given,
// this block's sums of dout * norm and dout per column into partial [2, gridDim.x, C] (dw part,
// then db part when WithDb). Dynamic shared memory: kRowsPerBlock * C floats.
template <class T, int W, int K, bool Accumulate, bool WithDb>
__global__ void __launch_bounds__(kRowThreads)
    norm_backward_rows_kernel(T* dx, float* partial, const T* dout, const T* x, const T* w,
                              const float* mean, const float* rstd, int64_t rows, int C) {
  extern __shared__ float warp_sums[];  // [kRowsPerBlock, C]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n_packs = C / W;
  auto live = [&](int k) { return lane + 32 * k < n_packs; };
  float dw_acc[K][W] = {}, db_acc[WithDb ? K : 1][W] = {};
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + warp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    LanePacks<T, W, K> xr, dr;
    xr.load(x + row * C, n_packs, lane);
    dr.load(dout + row * C, n_packs, lane);
    const float mu = mean != nullptr ? mean[row] : 0.0f, rs = rstd[row];
    float dnorm_sum = 0.0f, dnorm_norm_sum = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!live(k)) continue;
      const Pack<T, W> wp = load_pack<T, W>(w + (lane + 32 * k) * W);
#pragma unroll
      for (int i = 0; i < W; ++i) {
        add_dnorm(dnorm_sum, dnorm_norm_sum, to_f32(dr.v[k].v[i]), to_f32(wp.v[i]),
                  to_f32(xr.v[k].v[i]), mu, rs);
      }
    }
    const float dnorm_mean = mean != nullptr ? warp_sum(dnorm_sum) / static_cast<float>(C) : 0.0f;
    const float dnorm_norm_mean = warp_sum(dnorm_norm_sum) / static_cast<float>(C);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!live(k)) continue;
      const int col = (lane + 32 * k) * W;
      const Pack<T, W> wp = load_pack<T, W>(w + col);
      Pack<T, W> op;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float d = to_f32(dr.v[k].v[i]);
        op.v[i] = from_f32<T>(
            norm_dx(d, to_f32(wp.v[i]), to_f32(xr.v[k].v[i]), mu, rs, dnorm_mean, dnorm_norm_mean));
        dw_acc[k][i] += d * (to_f32(xr.v[k].v[i]) - mu) * rs;
        if constexpr (WithDb) db_acc[k][i] += d;
      }
      if constexpr (Accumulate) {
        const Pack<T, W> rp = load_pack<T, W>(dx + row * C + col);
#pragma unroll
        for (int i = 0; i < W; ++i) {
          op.v[i] = from_f32<T>(__fadd_rn(to_f32(rp.v[i]), to_f32(op.v[i])));
        }
      }
      store_pack<T, W>(dx + row * C + col, op);
    }
  }
  if (partial == nullptr) return;  // the same for the whole block
  for (int part = 0; part < (WithDb ? 2 : 1); ++part) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!live(k)) continue;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        warp_sums[warp * C + (lane + 32 * k) * W + i] =
            part == 0 || !WithDb ? dw_acc[k][i] : db_acc[WithDb ? k : 0][i];
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      float total = 0.0f;
      for (int w8 = 0; w8 < kRowsPerBlock; ++w8) total += warp_sums[w8 * C + c];
      partial[(static_cast<int64_t>(part) * gridDim.x + blockIdx.x) * C + c] = total;
    }
    __syncthreads();
  }
}

// Packs per lane for a row of C elements on the register path, or 0 when it does not apply.
template <class T>
int lane_packs(int C, std::initializer_list<const void*> ptrs) {
  if (!can_use_packs<T>(C, ptrs)) return 0;
  const int n = static_cast<int>(ceil_div(C / kPackWidth<T>, 32));
  for (int k : {1, 2, 3, 4}) {
    if (n <= k) return k;
  }
  return 0;
}

// Calls f(std::integral_constant<int, K>{}) for the lane_packs() value k (one of 1..4).
template <class F>
void with_lane_packs(int k, F&& f) {
  switch (k) {
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    default:
      return f(std::integral_constant<int, kMaxLanePacks>{});
  }
}

// Shared memory a block of the register backward needs, and whether the device gives it.
bool backward_rows_fit(int C) {
  static const int optin = [] {
    int device = 0, bytes = 0;
    FT_CUDA_CHECK(cudaGetDevice(&device));
    FT_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return bytes;
  }();
  return static_cast<int64_t>(kRowsPerBlock) * C * 4 <= optin;
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
  if (const int k = lane_packs<T>(C, {out, x, x_out, res_a, res_b, w, bias}); k > 0) {
    with_lane_packs(k, [&](auto K) {
      norm_forward_rows_kernel<T, kPackWidth<T>, decltype(K)::value>
          <<<blocks, kRowThreads, 0, stream()>>>(out, mean, rstd, x, x_out, res_a, res_b, w, bias,
                                                 rows, C, e);
    });
  } else if (can_use_packs<T>(C, {out, x, x_out, res_a, res_b, w, bias})) {
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
                   GradStore store, const char* fn) {
  const bool overwrite = store == GradStore::overwrite;
  const int64_t rows = rows_of(x);
  const int C = static_cast<int>(x.dim(-1));
  if (rows == 0 || C == 0) return;
  dispatch_cuda_float(x.dtype(), fn, [&](auto tag) {
    using T = decltype(tag);
    const float* mu = ptr_or_null<float>(mean);
    const float* rs = ptr<float>(rstd);
    float* dw_p = ptr_or_null<float>(dw);
    float* db_p = db != nullptr ? ptr_or_null<float>(*db) : nullptr;
    T* dx_p = ptr_or_null<T>(dx);
    const int k = dx_p != nullptr && backward_rows_fit(C)
                      ? lane_packs<T>(C, {dx_p, ptr<T>(dout), ptr<T>(x), ptr<T>(w)})
                      : 0;
    if (k > 0) {
      const bool params = dw_p != nullptr || db_p != nullptr;
      const auto blocks =
          static_cast<int>(std::min<int64_t>(ceil_div(rows, kRowsPerBlock), kBackwardBlocks));
      Tensor partial;
      if (params) partial = Tensor::empty({2, blocks, C}, DType::f32, Device::cuda);
      const size_t smem = params ? sizeof(float) * kRowsPerBlock * C : 0;
      with_lane_packs(k, [&](auto K) {
        auto launch = [&](auto kernel) {
          if (smem > 48 * 1024) {
            FT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(smem)));
          }
          kernel<<<blocks, kRowThreads, smem, stream()>>>(dx_p, ptr_or_null<float>(partial),
                                                          ptr<T>(dout), ptr<T>(x), ptr<T>(w), mu,
                                                          rs, rows, C);
          FT_CUDA_CHECK_LAUNCH();
        };
        constexpr int k_packs = decltype(K)::value, w_pack = kPackWidth<T>;
        if (accumulate) {
          db_p != nullptr ? launch(norm_backward_rows_kernel<T, w_pack, k_packs, true, true>)
                          : launch(norm_backward_rows_kernel<T, w_pack, k_packs, true, false>);
        } else {
          db_p != nullptr ? launch(norm_backward_rows_kernel<T, w_pack, k_packs, false, true>)
                          : launch(norm_backward_rows_kernel<T, w_pack, k_packs, false, false>);
        }
      });
      if (params) {
        finish_param_grads(dw_p, db_p, ptr<float>(partial), C, blocks, overwrite);
      }
      return;
    }
    if (dw_p != nullptr || db_p != nullptr) {
      const int n_chunks = static_cast<int>(std::min<int64_t>(rows, kMaxRowChunks));
      const int64_t rows_per_chunk = ceil_div(rows, n_chunks);
      Tensor partial = Tensor::empty({2, n_chunks, C}, DType::f32, Device::cuda);
      const dim3 grid(static_cast<unsigned>(ceil_div(C, kColThreads)),
                      static_cast<unsigned>(n_chunks));
      norm_param_partial_kernel<T><<<grid, kColThreads, 0, stream()>>>(
          ptr<float>(partial), ptr<T>(dout), ptr<T>(x), mu, rs, rows, rows_per_chunk, C, n_chunks);
      FT_CUDA_CHECK_LAUNCH();
      finish_param_grads(dw_p, db_p, ptr<float>(partial), C, n_chunks, overwrite);
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
                        const Tensor& w, const Tensor& mean, const Tensor& rstd, GradStore store) {
  norm_backward(dx, dw, &db, dout, x, w, mean, rstd, false, store, "layernorm_backward");
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
                      const Tensor& rstd, GradStore store) {
  norm_backward(dx, dw, nullptr, dout, x, w, Tensor(), rstd, false, store, "rmsnorm_backward");
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
                       const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                       GradStore store) {
  norm_backward(dresidual, dw, &db, dout, x, w, mean, rstd, true, store, "norm_backward_add");
}

}  // namespace ft::nn::cuda

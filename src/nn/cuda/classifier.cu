// Fused softmax + cross-entropy + its gradient on the GPU, one block per row of logits [N, Vp].
//
// Pass 1: each thread keeps an online (max, sum of exp(x - max)) over its columns < V (rescaled
// once per 16-byte pack, by the pack's max), the block combines them (fixed tree), and the row
// loss is log(sum) - (x[target] - max). Pass 2 (with
// dlogits): each thread rewrites its columns with (softmax - onehot(target)) * dloss, and 0 for
// the padding columns [V, Vp). Each thread reads a pack before writing the same pack, the target
// logit is read before the block's first barrier, and no thread writes before that barrier, so
// dlogits may alias logits: no second copy of the logits, fp32 or otherwise, is ever made.
// Traffic: the row read twice (the second time mostly from L2) and written once. Two variants
// measured slower on the H200 (docs/PERF.md, 2026-12-02): the row kept in shared memory between
// the passes (two blocks per multiprocessor; 1.67-1.75 ms a GPT-2 step against 1.51), and four
// packs per thread loaded before the first is used (1.73 ms). Both moved fewer DRAM bytes and
// took longer: this kernel is not bound by its bytes alone (an ncu run should say by what).
// Pass 2 reads and writes with the evict-first hint (below): 1.643-1.676 ms against 1.704-1.740
// without in the same call (GPT-2 16 x 1024, the profile's classifier row); capping the blocks
// per multiprocessor at three or two (so the rows in flight fit L2) was slower (1.79, 2.07).
#include <cfloat>
#include <cstring>

#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

constexpr int kThreads = 512;

// exp(x) for x <= 0 as 2^(x log2 e): one multiply and one MUFU.EX2 (relative error ~2^-21 on
// the arguments softmax gives it; expf's range reduction costs several instructions more, and
// two exponentials per logit bound this kernel's instruction rate, not its memory traffic).
__device__ __forceinline__ float fast_exp(float x) {
  return __expf(x);
}

struct MaxSum {
  float max, sum;  // sum of exp(x - max)
};

__device__ __forceinline__ MaxSum combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  // An empty partial (max = -inf, sum = 0) contributes nothing (and no inf - inf).
  const float sa = a.sum == 0.0f ? 0.0f : a.sum * expf(a.max - m);
  const float sb = b.sum == 0.0f ? 0.0f : b.sum * expf(b.max - m);
  return {m, sa + sb};
}

__device__ MaxSum block_max_sum(MaxSum v) {
  __shared__ MaxSum partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) {
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.max, offset),
                    __shfl_xor_sync(0xffffffffu, v.sum, offset)});
  }
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : MaxSum{-FLT_MAX, 0.0f};
  for (int offset = 16; offset > 0; offset /= 2) {
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.max, offset),
                    __shfl_xor_sync(0xffffffffu, v.sum, offset)});
  }
  return v;
}

// Pass 2's accesses are the last of the row: its loads and the dlogits stores go with the
// evict-first hint (ld/st.global.cs), so that they do not push out of L2 the rows that other
// resident blocks have yet to read a second time (four blocks of 512 threads per multiprocessor
// hold ~53 MB of GPT-2 rows against 50 MB of L2).
template <class T, int W>
__device__ __forceinline__ Pack<T, W> load_last_use(const T* p) {
  static_assert(sizeof(Pack<T, W>) == 16 || W == 1);
  if constexpr (sizeof(Pack<T, W>) == 16) {
    const uint4 bits = __ldcs(reinterpret_cast<const uint4*>(p));
    Pack<T, W> r;
    memcpy(&r, &bits, 16);
    return r;
  } else {
    return load_pack<T, W>(p);
  }
}

template <class T, int W>
__device__ __forceinline__ void store_streaming(T* p, const Pack<T, W>& x) {
  if constexpr (sizeof(Pack<T, W>) == 16) {
    uint4 bits;
    memcpy(&bits, &x, 16);
    __stcs(reinterpret_cast<uint4*>(p), bits);
  } else {
    store_pack<T, W>(p, x);
  }
}

template <class T, int W>
__global__ void cross_entropy_kernel(float* losses, T* dlogits, const T* logits,
                                     const int32_t* targets, int64_t Vp, int64_t V, float dloss) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vp;
  const int32_t target = targets[row];
  const float target_logit = to_f32(x[target]);  // before any thread may overwrite it
  MaxSum acc{-FLT_MAX, 0.0f};
  for (int64_t p = threadIdx.x; p * W < V; p += blockDim.x) {
    const Pack<T, W> xp = load_pack<T, W>(x + p * W);
    const int n = static_cast<int>(V - p * W < W ? V - p * W : W);  // columns < V in the pack
    float pack_max = -FLT_MAX;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (k < n) pack_max = fmaxf(pack_max, to_f32(xp.v[k]));
    }
    if (pack_max > acc.max) {  // rescale once per pack, not per element
      acc.sum *= fast_exp(acc.max - pack_max);
      acc.max = pack_max;
    }
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (k < n) acc.sum += fast_exp(to_f32(xp.v[k]) - acc.max);
    }
  }
  const MaxSum row_stats = block_max_sum(acc);
  if (threadIdx.x == 0) losses[row] = logf(row_stats.sum) - (target_logit - row_stats.max);
  if (dlogits == nullptr) return;
  T* d = dlogits + row * Vp;
  const float scale = dloss / row_stats.sum;
  for (int64_t p = threadIdx.x; p * W < Vp; p += blockDim.x) {
    Pack<T, W> xp{};
    if (p * W < V) xp = load_last_use<T, W>(x + p * W);
    Pack<T, W> dp;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const int64_t j = p * W + k;
      float g = 0.0f;
      if (j < V) {
        g = fast_exp(to_f32(xp.v[k]) - row_stats.max) * scale;
        if (j == target) g -= dloss;
      }
      dp.v[k] = from_f32<T>(g);
    }
    store_streaming<T, W>(d + p * W, dp);
  }
}

}  // namespace

void softmax_cross_entropy(Tensor& losses, Tensor& dlogits, const Tensor& logits,
                           const Tensor& targets, int64_t V, double dloss) {
  const int64_t Vp = logits.dim(-1), N = logits.numel() / Vp;
  if (N == 0) return;
  const Tensor dev_targets = on_device_i32(targets);
  dispatch_cuda_float(logits.dtype(), "softmax_cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    T* d = ptr_or_null<T>(dlogits);
    const T* x = ptr<T>(logits);
    const auto grid = static_cast<unsigned>(N);
    const auto scale = static_cast<float>(dloss);
    if (can_use_packs<T>(Vp, {d, x})) {
      cross_entropy_kernel<T, kPackWidth<T>><<<grid, kThreads, 0, stream()>>>(
          ptr<float>(losses), d, x, ptr<int32_t>(dev_targets), Vp, V, scale);
    } else {
      cross_entropy_kernel<T, 1><<<grid, kThreads, 0, stream()>>>(
          ptr<float>(losses), d, x, ptr<int32_t>(dev_targets), Vp, V, scale);
    }
    FT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ft::nn::cuda

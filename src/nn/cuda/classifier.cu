// Fused softmax + cross-entropy + its gradient on the GPU, one block per row of logits [N, Vp].
//
// Pass 1: each thread keeps an online (max, sum of exp(x - max)) over its columns < V (rescaled
// once per 16-byte pack, by the pack's max), the block combines them (fixed tree), and the row
// loss is log(sum) - (x[target] - max). Pass 2 (with
// dlogits): each thread rewrites its columns with (softmax - onehot(target)) * dloss, and 0 for
// the padding columns [V, Vp). Each thread reads a pack before writing the same pack, the target
// logit is read before the block's first barrier, and no thread writes before that barrier, so
// dlogits may alias logits: no second copy of the logits, fp32 or otherwise, is ever made.
// Traffic: the row read once and written once when it fits in shared memory (kMaxRowCacheBytes;
// pass 2 reads it there), else read twice (the second time partly from L2) and written once.
#include <cfloat>

#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

constexpr int kThreads = 512;
// Rows up to this many bytes are kept in shared memory between the two passes (two blocks per
// multiprocessor: GPT-2's padded vocabulary, 50304 bf16 = 98.25 KiB); longer rows (llama3's
// 128256, fp32 GPT-2) are read twice, the second time partly from L2.
constexpr int64_t kMaxRowCacheBytes = 110 * 1024;

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

// RowInSmem: pass 1 keeps each pack it reads in dynamic shared memory (the row's first
// ceil(V / W) packs) and pass 2 reads them back from there; each thread reads back only the packs
// it wrote, so no barrier is needed for them.
template <class T, int W, bool RowInSmem>
__global__ void cross_entropy_kernel(float* losses, T* dlogits, const T* logits,
                                     const int32_t* targets, int64_t Vp, int64_t V, float dloss) {
  extern __shared__ unsigned char smem_bytes[];
  auto* row_cache = reinterpret_cast<Pack<T, W>*>(smem_bytes);
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vp;
  const int32_t target = targets[row];
  const float target_logit = to_f32(x[target]);  // before any thread may overwrite it
  MaxSum acc{-FLT_MAX, 0.0f};
  for (int64_t p = threadIdx.x; p * W < V; p += blockDim.x) {
    const Pack<T, W> xp = load_pack<T, W>(x + p * W);
    if constexpr (RowInSmem) row_cache[p] = xp;
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
    if (p * W < V) {
      if constexpr (RowInSmem) {
        xp = row_cache[p];
      } else {
        xp = load_pack<T, W>(x + p * W);
      }
    }
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
    store_pack<T, W>(d + p * W, dp);
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
    const int64_t row_bytes = Vp * static_cast<int64_t>(sizeof(T));
    if (can_use_packs<T>(Vp, {d, x}) && d != nullptr && row_bytes <= kMaxRowCacheBytes) {
      constexpr int W = kPackWidth<T>;
      auto kernel = cross_entropy_kernel<T, W, true>;
      static const bool attribute_set = [&] {  // once per instantiation
        FT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kMaxRowCacheBytes)));
        return true;
      }();
      (void)attribute_set;
      kernel<<<grid, kThreads, static_cast<size_t>(row_bytes), stream()>>>(
          ptr<float>(losses), d, x, ptr<int32_t>(dev_targets), Vp, V, scale);
    } else if (can_use_packs<T>(Vp, {d, x})) {
      cross_entropy_kernel<T, kPackWidth<T>, false><<<grid, kThreads, 0, stream()>>>(
          ptr<float>(losses), d, x, ptr<int32_t>(dev_targets), Vp, V, scale);
    } else {
      cross_entropy_kernel<T, 1, false><<<grid, kThreads, 0, stream()>>>(
          ptr<float>(losses), d, x, ptr<int32_t>(dev_targets), Vp, V, scale);
    }
    FT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ft::nn::cuda

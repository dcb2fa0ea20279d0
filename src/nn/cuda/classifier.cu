// Fused softmax + cross-entropy + its gradient on the GPU, one block per row of logits [N, Vp].
//
// Pass 1: each thread keeps an online (max, sum of exp(x - max)) over its columns < V (rescaled
// once per 16-byte pack, by the pack's max), the block combines them (fixed tree), and the row
// loss is log(sum) - (x[target] - max). Pass 2 (with
// dlogits): each thread rewrites its columns with (softmax - onehot(target)) * dloss, and 0 for
// the padding columns [V, Vp). Each thread reads a pack before writing the same pack, the target
// logit is read before the block's first barrier, and no thread writes before that barrier, so
// dlogits may alias logits: no second copy of the logits, fp32 or otherwise, is ever made.
// Traffic: the row read twice (the second time partly from L2: 35% hits at llama3-1b's 256 KB
// rows) and written once. Two variants measured slower on the H200 (docs/PERF.md, 2026-12-02):
// the row kept in shared memory between the passes (two blocks per multiprocessor; 1.67-1.75 ms
// a GPT-2 step against 1.51), and four packs per thread loaded before the first is used
// (1.73 ms). Both moved fewer DRAM bytes and took longer: ncu (2026-12-03) says the kernel is
// bound by its instruction issue (0.80 warps issued per scheduler and cycle), so each logit
// costs as few instructions as it can: one FFMA and one EX2 an exponential, no per-column
// checks in the packs wholly below V, one compare a pack for the target. With that the kernel
// waits on memory (DRAM 78% of peak, 0.37 issued a cycle; 235.9 -> 190.8 us a llama3-1b chunk).
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
constexpr float kLog2e = 1.4426950408889634f;

// 2^x in one MUFU.EX2 (flush-to-zero; relative error ~2^-22). Every exponential here is
// exp(x - max) formed as 2^(x log2e - max log2e): one FFMA and this, where __expf(x - max)
// costs an FADD, an FMUL and the MUFU. The kernel issues an instruction most cycles (ncu on the
// H200: 0.80 issued per scheduler and cycle at llama3-1b's 128256 columns), so instructions
// per logit, not bytes, set its time.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
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

// Folds one pack of logits into a thread's (max, sum): the pack's max first, the sum rescaled
// once if it rises, then one FFMA and one EX2 a logit. Full: all W columns are < V (every pack
// but a row's last partial one), so no column is checked.
template <bool Full, class T, int W>
__device__ __forceinline__ void add_pack(MaxSum& acc, const Pack<T, W>& xp, int n) {
  float f[W];
  float pack_max = -FLT_MAX;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    f[k] = to_f32(xp.v[k]);
    if (Full || k < n) pack_max = fmaxf(pack_max, f[k]);
  }
  if (pack_max > acc.max) {  // rescale once per pack, not per element
    acc.sum *= exp2_approx((acc.max - pack_max) * kLog2e);
    acc.max = pack_max;
  }
  const float shift = -acc.max * kLog2e;
#pragma unroll
  for (int k = 0; k < W; ++k) {
    if (Full || k < n) acc.sum += exp2_approx(fmaf(f[k], kLog2e, shift));
  }
}

// (softmax - onehot(target)) * dloss for one pack starting at column `col`, 0 at columns >= V.
// The target's column is found by one compare a pack; only the pack that holds it subtracts.
template <bool Full, class T, int W>
__device__ __forceinline__ Pack<T, W> grad_pack(const Pack<T, W>& xp, int col, int V, int target,
                                                float shift, float scale, float dloss) {
  float g[W];
#pragma unroll
  for (int k = 0; k < W; ++k) {
    g[k] = Full || col + k < V ? exp2_approx(fmaf(to_f32(xp.v[k]), kLog2e, shift)) * scale : 0.0f;
  }
  const int t = target - col;
  if (static_cast<unsigned>(t) < static_cast<unsigned>(W)) {
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (k == t) g[k] -= dloss;
    }
  }
  Pack<T, W> dp;
#pragma unroll
  for (int k = 0; k < W; ++k) dp.v[k] = from_f32<T>(g[k]);
  return dp;
}

// One block a row. The packs wholly below V go through the unchecked loops; the packs from V / W
// on (a partial pack, the padding) through the checked ones. V < 2^31 (int32 targets), so
// columns are ints; only the row's offset needs 64 bits.
template <class T, int W>
__global__ void cross_entropy_kernel(float* losses, T* dlogits, const T* logits,
                                     const int32_t* targets, int Vp, int V, float dloss) {
  const int64_t row = blockIdx.x;
  const T* x = logits + row * Vp;
  const int target = targets[row];
  const float target_logit = to_f32(x[target]);  // before any thread may overwrite it
  const int full_packs = V / W;
  MaxSum acc{-FLT_MAX, 0.0f};
  for (int p = threadIdx.x; p < full_packs; p += blockDim.x) {
    add_pack<true>(acc, load_pack<T, W>(x + p * W), W);
  }
  for (int p = full_packs + threadIdx.x; p * W < V; p += blockDim.x) {
    add_pack<false>(acc, load_pack<T, W>(x + p * W), V - p * W);
  }
  const MaxSum row_stats = block_max_sum(acc);
  if (threadIdx.x == 0) losses[row] = logf(row_stats.sum) - (target_logit - row_stats.max);
  if (dlogits == nullptr) return;
  T* d = dlogits + row * Vp;
  const float scale = dloss / row_stats.sum, shift = -row_stats.max * kLog2e;
  for (int p = threadIdx.x; p < full_packs; p += blockDim.x) {
    const Pack<T, W> xp = load_last_use<T, W>(x + p * W);
    store_streaming<T, W>(d + p * W, grad_pack<true>(xp, p * W, V, target, shift, scale, dloss));
  }
  for (int p = full_packs + threadIdx.x; p * W < Vp; p += blockDim.x) {
    Pack<T, W> xp{};
    if (p * W < V) xp = load_last_use<T, W>(x + p * W);
    store_streaming<T, W>(d + p * W, grad_pack<false>(xp, p * W, V, target, shift, scale, dloss));
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
    const auto vp = static_cast<int>(Vp), v = static_cast<int>(V);
    if (can_use_packs<T>(Vp, {d, x})) {
      cross_entropy_kernel<T, kPackWidth<T>><<<grid, kThreads, 0, stream()>>>(
          ptr<float>(losses), d, x, ptr<int32_t>(dev_targets), vp, v, scale);
    } else {
      cross_entropy_kernel<T, 1><<<grid, kThreads, 0, stream()>>>(
          ptr<float>(losses), d, x, ptr<int32_t>(dev_targets), vp, v, scale);
    }
    FT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ft::nn::cuda

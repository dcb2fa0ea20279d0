// Attention of one new query per head over a KV cache, CUDA (the CPU twin and the algorithm:
// src/nn/decode_attention.cpp). One block per query head, three passes over the n keys:
//   1. scores: thread t takes keys t, t + blockDim, ...; q is read once into shared memory;
//      the fp32 scores go to a scratch row of n floats (global memory: any cache length);
//   2. max and sum of exp over the row (block reductions);
//   3. out: the block is split into slices of D threads; slice s sums p_j v_j over keys
//      j = s, s + slices, ... (coalesced reads of v rows), and the slices' partial sums are
//      added in a fixed order. Deterministic.
// Traffic: the k and v rows of the cache once per query head (GQA heads share them in L2),
// 3 passes over the n-float score row. A decode step is memory bound; nothing here is tuned.
#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float block_max(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : -INFINITY;
  for (int offset = 16; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Dynamic shared memory: D floats of q, then kThreads floats of output partial sums.
template <class T>
__global__ void decode_attention_kernel(T* out, const T* q, const T* k, const T* v, float* scores,
                                        int64_t first, int64_t n, int Hkv, int D, int group,
                                        float scale) {
  extern __shared__ float smem[];
  float* q_s = smem;
  float* part = smem + D;
  const int h = blockIdx.x, kvh = h / group;
  for (int d = threadIdx.x; d < D; d += blockDim.x) q_s[d] = to_f32(q[h * D + d]);
  __syncthreads();
  float* row = scores + static_cast<int64_t>(h) * n;
  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const T* kj = k + ((first + j) * Hkv + kvh) * D;
    float s = 0.0f;
    for (int d = 0; d < D; ++d) s += q_s[d] * to_f32(kj[d]);
    s *= scale;
    row[j] = s;
    local_max = fmaxf(local_max, s);
  }
  const float mx = block_max(local_max);
  float local_sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
    const float p = expf(row[j] - mx);  // not __expf: nearer the CPU twin; off the hot path
    row[j] = p;
    local_sum += p;
  }
  const float sum = block_sum(local_sum);  // its __syncthreads also publishes row[]
  // Slices of D threads (D <= kThreads); threads past the last whole slice only help reduce.
  const int slices = blockDim.x / D;
  const int slice = threadIdx.x / D, d = threadIdx.x % D;
  float acc = 0.0f;
  if (slice < slices) {
    for (int64_t j = slice; j < n; j += slices) {
      acc += row[j] * to_f32(v[((first + j) * Hkv + kvh) * D + d]);
    }
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < D) {
    float total = 0.0f;
    for (int s = 0; s < slices; ++s) total += part[s * D + threadIdx.x];
    out[h * D + threadIdx.x] = from_f32<T>(total / sum);
  }
}

}  // namespace

void decode_attention(Tensor& out, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                      int64_t first_key, int64_t last_key, double scale) {
  const int Hq = static_cast<int>(q.dim(0)), D = static_cast<int>(q.dim(1));
  const int Hkv = static_cast<int>(k_cache.dim(1));
  FT_CHECK(D <= kThreads, "decode_attention on CUDA: head dim ", D, " > ", kThreads);
  const int64_t n = last_key - first_key + 1;
  Tensor scores = Tensor::empty({Hq, n}, DType::f32, Device::cuda);
  const size_t smem = static_cast<size_t>(D + kThreads) * sizeof(float);
  dispatch_cuda_float(q.dtype(), "decode_attention", [&](auto tag) {
    using T = decltype(tag);
    decode_attention_kernel<T><<<Hq, kThreads, smem, stream()>>>(
        ptr<T>(out), ptr<T>(q), ptr<T>(k_cache), ptr<T>(v_cache), ptr<float>(scores), first_key, n,
        Hkv, D, Hq / Hkv, static_cast<float>(scale));
    FT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ft::nn::cuda

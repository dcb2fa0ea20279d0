// GPU helpers of the sweep (device_ops.h). Each is one grid-stride kernel: fill_normal writes
// every element once; max_abs_diff reads both tensors once and reduces per block before one
// atomic per block; busy_wait reads the global timer until its time is up.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "sweep/device_ops.h"

namespace ft::sweep::gpu {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

int blocks_for(int64_t n) {
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks)));
}

__device__ uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Box-Muller on two 24-bit uniforms from one hash; u1 in (0, 1] so the log is finite.
__device__ float normal_at(uint64_t seed, int64_t i) {
  const uint64_t h = mix(seed + 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(i + 1));
  const float u1 = (static_cast<float>(h >> 40) + 1.0f) * (1.0f / 16777216.0f);
  const float u2 = static_cast<float>((h >> 16) & 0xffffffull) * (1.0f / 16777216.0f);
  return sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
}

// Round to nearest even, as core/bf16.h does (the samples are finite).
__device__ uint16_t to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ float from_bf16_bits(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__global__ void fill_normal_f32(float* out, int64_t n, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = normal_at(seed, i);
  }
}

__global__ void fill_normal_bf16(uint16_t* out, int64_t n, uint64_t seed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[i] = to_bf16_bits(normal_at(seed, i));
  }
}

__device__ float value_of(float x) {
  return x;
}
__device__ float value_of(uint16_t x) {
  return from_bf16_bits(x);
}

// Non-negative floats (and +inf) order like their bit patterns, so atomicMax on the bits works.
template <class T>
__global__ void max_abs_diff_kernel(const T* a, const T* b, int64_t n, unsigned int* result) {
  __shared__ float block_max[kThreads];
  float m = 0.0f;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const float d = fabsf(value_of(a[i]) - value_of(b[i]));
    m = isfinite(d) ? fmaxf(m, d) : __int_as_float(0x7f800000);
  }
  block_max[threadIdx.x] = m;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) {
      block_max[threadIdx.x] = fmaxf(block_max[threadIdx.x], block_max[threadIdx.x + half]);
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicMax(result, __float_as_uint(block_max[0]));
}

__global__ void busy_wait_kernel(uint64_t nanoseconds) {
  uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

__global__ void illegal_address_kernel(int* p) {
  p[threadIdx.x] = 1;
}

}  // namespace

void fill_normal(Tensor& t, uint64_t seed) {
  FT_CHECK(t.device() == Device::cuda, "sweep fill_normal: the tensor must be on cuda");
  const int64_t n = t.numel();
  if (n == 0) return;
  cudaStream_t stream = cuda::current_stream();
  if (t.dtype() == DType::f32) {
    fill_normal_f32<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<float*>(t.raw()), n, seed);
  } else if (t.dtype() == DType::bf16) {
    fill_normal_bf16<<<blocks_for(n), kThreads, 0, stream>>>(static_cast<uint16_t*>(t.raw()), n,
                                                             seed);
  } else {
    throw Error(str("sweep fill_normal: dtype ", dtype_name(t.dtype()), " (allowed: fp32, bf16)"));
  }
  FT_CUDA_CHECK_LAUNCH();
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  FT_CHECK(a.device() == Device::cuda && b.device() == Device::cuda && a.dtype() == b.dtype() &&
               a.numel() == b.numel(),
           "sweep max_abs_diff: two cuda tensors of one dtype and size, got ", shape_str(a.shape()),
           " ", dtype_name(a.dtype()), " and ", shape_str(b.shape()), " ", dtype_name(b.dtype()));
  const int64_t n = a.numel();
  if (n == 0) return 0.0;
  Tensor result = Tensor::zeros({1}, DType::i32, Device::cuda);
  auto* bits = static_cast<unsigned int*>(result.raw());
  cudaStream_t stream = cuda::current_stream();
  if (a.dtype() == DType::f32) {
    max_abs_diff_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const float*>(a.raw()), static_cast<const float*>(b.raw()), n, bits);
  } else if (a.dtype() == DType::bf16) {
    max_abs_diff_kernel<<<blocks_for(n), kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(a.raw()), static_cast<const uint16_t*>(b.raw()), n, bits);
  } else {
    throw Error(str("sweep max_abs_diff: dtype ", dtype_name(a.dtype()), " (allowed: fp32, bf16)"));
  }
  FT_CUDA_CHECK_LAUNCH();
  const Tensor host = result.to(Device::cpu);
  const uint32_t raw = static_cast<uint32_t>(host.data<int32_t>()[0]);
  float value = 0.0f;
  static_assert(sizeof value == sizeof raw);
  std::memcpy(&value, &raw, sizeof value);
  return value;
}

void busy_wait(double ms) {
  if (ms <= 0) return;
  busy_wait_kernel<<<1, 1, 0, cuda::current_stream()>>>(static_cast<uint64_t>(ms * 1e6));
  FT_CUDA_CHECK_LAUNCH();
}

void illegal_address() {
  // An address no allocation owns (the first page is never mapped).
  illegal_address_kernel<<<1, 32, 0, cuda::current_stream()>>>(reinterpret_cast<int*>(64));
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::sweep::gpu

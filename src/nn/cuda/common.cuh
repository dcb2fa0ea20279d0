// Device helpers shared by the CUDA layer kernels in src/nn/cuda: fp32/bf16 load and store
// through fp32, 16-byte packs, warp and block reductions, launch sizes and the dtype dispatch.
// Every kernel accumulates in fp32 (fp64 for the gradient norm) whatever the storage dtype.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/tensor.h"

namespace ft::nn::cuda {

using bf16_t = __nv_bfloat16;

__device__ __forceinline__ float to_f32(float x) {
  return x;
}
__device__ __forceinline__ float to_f32(bf16_t x) {
  return __bfloat162float(x);
}

template <class T>
__device__ __forceinline__ T from_f32(float x);
template <>
__device__ __forceinline__ float from_f32<float>(float x) {
  return x;
}
// Round to nearest even, as the CPU's bf16 store does.
template <>
__device__ __forceinline__ bf16_t from_f32<bf16_t>(float x) {
  return __float2bfloat16_rn(x);
}

// W consecutive elements moved as one load/store (16 bytes when W = 16 / sizeof(T)).
template <class T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

template <class T, int W>
__device__ __forceinline__ Pack<T, W> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, W>*>(p);
}
template <class T, int W>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, W>& x) {
  *reinterpret_cast<Pack<T, W>*>(p) = x;
}

template <class T>
constexpr int kPackWidth = 16 / static_cast<int>(sizeof(T));

// 16-byte packs are used when every pointer is 16-byte aligned and `multiple_of` (a row length
// or element count) is a whole number of packs; otherwise one element at a time.
template <class T>
bool can_use_packs(int64_t multiple_of, std::initializer_list<const void*> ptrs) {
  if (multiple_of % kPackWidth<T> != 0) return false;
  for (const void* p : ptrs) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

template <class A>
__device__ __forceinline__ A warp_sum(A v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// The tree is fixed, so the result is deterministic. Contains __syncthreads.
template <class A>
__device__ A block_sum(A v) {
  __shared__ A partial[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : A(0);
  return warp_sum(v);
}

inline int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Grid for a grid-stride loop over n items: enough blocks to fill the GPU, capped.
inline unsigned grid_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::clamp<int64_t>(ceil_div(n, threads), 1, int64_t{1} << 16));
}

inline cudaStream_t stream() {
  return ::ft::cuda::current_stream();
}

// Calls f(T{}) with T = float or __nv_bfloat16; fp64 (the CPU gradient-check dtype) and int32
// are rejected with the function's name.
template <class F>
void dispatch_cuda_float(DType t, const char* fn, F&& f) {
  switch (t) {
    case DType::f32:
      f(float{});
      return;
    case DType::bf16:
      f(bf16_t{});
      return;
    default:
      throw Error(str(fn, ": ", dtype_name(t),
                      " is not supported on CUDA (fp32 or bf16; fp64 is for CPU gradient checks)"));
  }
}

template <class T>
T* ptr(Tensor& t) {
  return static_cast<T*>(t.raw());
}
template <class T>
const T* ptr(const Tensor& t) {
  return static_cast<const T*>(t.raw());
}
template <class T>
T* ptr_or_null(Tensor& t) {
  return t.defined() ? static_cast<T*>(t.raw()) : nullptr;
}
template <class T>
const T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<const T*>(t.raw()) : nullptr;
}

// int32 tokens/targets on the GPU: `t` itself when it is there, else a copy.
inline Tensor on_device_i32(const Tensor& t) {
  return t.device() == Device::cuda ? t : t.to(Device::cuda);
}

constexpr int kElementwiseThreads = 256;

// out[i] = op(a[i], b[i]) through fp32 (b == nullptr passes 0 as the second operand), W
// elements per thread and step. Each pack of a and b is read before the pack of out is written,
// so out may alias a or b.
template <class T, int W, class Op>
__global__ void map_kernel(T* out, const T* a, const T* b, int64_t n_packs, Op op) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n_packs;
       p += stride) {
    const Pack<T, W> x = load_pack<T, W>(a + p * W);
    Pack<T, W> y{};
    if (b != nullptr) y = load_pack<T, W>(b + p * W);
    Pack<T, W> o;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      o.v[k] = from_f32<T>(op(to_f32(x.v[k]), b != nullptr ? to_f32(y.v[k]) : 0.0f));
    }
    store_pack<T, W>(out + p * W, o);
  }
}

template <class T, class Op>
void launch_map(T* out, const T* a, const T* b, int64_t n, Op op) {
  if (n == 0) return;
  constexpr int kThreads = kElementwiseThreads;
  if (can_use_packs<T>(n, {out, a, b})) {
    constexpr int W = kPackWidth<T>;
    map_kernel<T, W><<<grid_for(n / W, kThreads), kThreads, 0, stream()>>>(out, a, b, n / W, op);
  } else {
    map_kernel<T, 1><<<grid_for(n, kThreads), kThreads, 0, stream()>>>(out, a, b, n, op);
  }
  FT_CUDA_CHECK_LAUNCH();
}

// The second stage of the deterministic column reductions (bias gradients, norm weight
// gradients): out[c] += the sum over k < parts of partial[k * cols + c]. A block covers 32
// columns with kPartLanes lanes of threads: lane y adds parts y, y + kPartLanes, ... in order,
// then the lanes are added in order, so the result depends only on (parts, cols); a column's
// parts are read kPartLanes at a time (one thread per column adding hundreds of parts one after
// another left these kernels latency-bound: 10-34 us a launch at GPT-2's shapes).
constexpr int kPartLanes = 16;

template <class Acc>
__device__ __forceinline__ void add_partials_of_block(Acc* out, const Acc* partial, int64_t parts,
                                                      int64_t cols, bool overwrite) {
  __shared__ Acc lanes[kPartLanes][33];
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  Acc sum = 0;
  if (c < cols) {
#pragma unroll 4
    for (int64_t k = threadIdx.y; k < parts; k += kPartLanes) sum += partial[k * cols + c];
  }
  lanes[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    Acc total = 0;
    for (int y = 0; y < kPartLanes; ++y) total += lanes[y][threadIdx.x];
    // total starts from +0, so it is never -0: written, it has the bits 0 + total would have.
    out[c] = overwrite ? total : out[c] + total;
  }
}

// Two reductions of the same shape in one launch (blockIdx.y picks one): a norm's weight and
// bias gradients.
template <class Acc>
__global__ void add_column_partials_kernel(Acc* out0, const Acc* partial0, Acc* out1,
                                           const Acc* partial1, int64_t parts, int64_t cols,
                                           bool overwrite) {
  if (blockIdx.y == 0) {
    add_partials_of_block(out0, partial0, parts, cols, overwrite);
  } else {
    add_partials_of_block(out1, partial1, parts, cols, overwrite);
  }
}

// out (may be null: nothing to do) += the column sums of partial [parts, cols], in a fixed
// order (= with overwrite); with out1 (may be null), also out1 += those of partial1, in the same
// launch.
template <class Acc>
void add_column_partials(Acc* out, const Acc* partial, int64_t parts, int64_t cols, bool overwrite,
                         Acc* out1 = nullptr, const Acc* partial1 = nullptr) {
  if (out == nullptr) {
    out = out1;
    partial = partial1;
    out1 = nullptr;
  }
  if (out == nullptr || cols == 0) return;
  const dim3 grid(static_cast<unsigned>(ceil_div(cols, 32)), out1 != nullptr ? 2 : 1);
  add_column_partials_kernel<Acc><<<grid, dim3(32, kPartLanes), 0, stream()>>>(
      out, partial, out1, partial1, parts, cols, overwrite);
  FT_CUDA_CHECK_LAUNCH();
}

}  // namespace ft::nn::cuda

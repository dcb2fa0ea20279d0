// Tensor copies, dtype conversions and fills on the GPU.
//
// Transfers are cudaMemcpyAsync on the current stream (host destinations synchronise, so the
// caller may read them at once). Conversion and fill are one grid-stride elementwise kernel
// each: every element is read once and written once, so they run at copy bandwidth
// (sizeof(src) + sizeof(dst) bytes per element). The bf16 rounding below repeats the CPU's
// (core/bf16.h) bit for bit, NaN payloads included, so a tensor converted on either device is
// the same; split_f32 and join_f32 run core/f32_halves.h's own functions, as the CPU does.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "core/bf16.h"
#include "core/cuda/capture_state.h"
#include "core/cuda/check.h"
#include "core/cuda/graph.h"
#include "core/cuda/runtime.h"
#include "core/cuda/tensor_ops.h"
#include "core/f32_halves.h"
#include "core/memory.h"

namespace ft::cuda {
namespace {

constexpr int kThreads = 256;
// Enough blocks to fill any current GPU several times over; the grid-stride loop does the rest.
constexpr int64_t kMaxBlocks = 8192;

int blocks_for(int64_t n) {
  return static_cast<int>(std::min<int64_t>((n + kThreads - 1) / kThreads, kMaxBlocks));
}

// The CPU's bf16::round_bits: round to nearest even, NaN stays a quiet NaN with its payload.
__device__ uint16_t float_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

__device__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

// Device stand-ins for the CPU types: bf16 travels as its 16 bits. widen() and narrow() are
// dtype.h's load() and store(): through float for f32/bf16, through double for f64.
struct Bf16Bits {
  uint16_t bits;
};

__device__ float widen(float x) {
  return x;
}
__device__ double widen(double x) {
  return x;
}
__device__ float widen(Bf16Bits x) {
  return bf16_bits_to_float(x.bits);
}
template <class A>
__device__ void narrow(float& dst, A v) {
  dst = static_cast<float>(v);
}
template <class A>
__device__ void narrow(double& dst, A v) {
  dst = static_cast<double>(v);
}
template <class A>
__device__ void narrow(Bf16Bits& dst, A v) {
  dst.bits = float_to_bf16_bits(static_cast<float>(v));  // f64 -> f32 -> bf16, like the CPU
}

template <class Dst, class Src>
__global__ void convert_kernel(Dst* dst, const Src* src, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    narrow(dst[i], widen(src[i]));
  }
}

__global__ void split_f32_kernel(uint16_t* hi, int16_t* lo, const float* values, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const F32Halves s = split_f32_bits(__float_as_uint(values[i]));
    hi[i] = s.hi;
    if (lo != nullptr) lo[i] = s.lo;
  }
}

__global__ void join_f32_kernel(float* values, const uint16_t* hi, const int16_t* lo, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    values[i] = __uint_as_float(join_f32_bits(hi[i], lo[i]));
  }
}

template <class Bits>
__global__ void fill_kernel(Bits* dst, int64_t n, Bits value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    dst[i] = value;
  }
}

// Calls f(T{}) with T the device type of a float dtype.
template <class F>
void dispatch_device_float(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      return f(float{});
    case DType::bf16:
      return f(Bf16Bits{});
    case DType::f64:
      return f(double{});
    default:
      throw Error(str("GPU conversion needs fp32, bf16 or fp64, got ", dtype_name(t)));
  }
}

template <class Bits>
void launch_fill(void* dst, int64_t n, Bits value) {
  fill_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(static_cast<Bits*>(dst), n, value);
  FT_CUDA_CHECK_LAUNCH();
}

template <class Bits, class T>
Bits bits_of(T value) {
  static_assert(sizeof(Bits) == sizeof(T));
  Bits b;
  std::memcpy(&b, &value, sizeof b);
  return b;
}

}  // namespace

void ensure_device_ready() {
  if (!has_device_allocator(Device::cuda)) init_device(0);
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  FT_CHECK(dst != nullptr && src != nullptr, "copy_bytes: null pointer for ", nbytes, " bytes");
  const bool to_host = dst_device == Device::cpu, from_host = src_device == Device::cpu;
  const cudaMemcpyKind kind = to_host
                                  ? (from_host ? cudaMemcpyHostToHost : cudaMemcpyDeviceToHost)
                                  : (from_host ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice);
  if (capturing()) {  // graph.h's rules
    FT_CHECK(!to_host,
             "a copy to host memory while a CUDA graph is being captured: nothing has "
             "run yet, so the host cannot read the device inside a captured step");
    FT_CHECK(!from_host || is_pinned(src), "a copy from pageable host memory (", nbytes,
             " bytes) while a CUDA graph is being captured: every replay would read that "
             "address after the buffer is gone; give the step's inputs in page-locked memory "
             "(Tensor::empty_pinned), or upload a constant table with cuda::upload_constant");
  }
  FT_CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, kind, current_stream()));
  if (to_host) synchronize();
}

void convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, int64_t n) {
  if (n == 0) return;
  dispatch_device_float(dst_dtype, [&](auto d) {
    using D = decltype(d);
    dispatch_device_float(src_dtype, [&](auto s) {
      using S = decltype(s);
      convert_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
          static_cast<D*>(dst), static_cast<const S*>(src), n);
      FT_CUDA_CHECK_LAUNCH();
    });
  });
}

void split_f32(void* hi, void* lo, const void* values, int64_t n) {
  if (n == 0) return;
  split_f32_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
      static_cast<uint16_t*>(hi), static_cast<int16_t*>(lo), static_cast<const float*>(values), n);
  FT_CUDA_CHECK_LAUNCH();
}

void join_f32(void* values, const void* hi, const void* lo, int64_t n) {
  if (n == 0) return;
  join_f32_kernel<<<blocks_for(n), kThreads, 0, current_stream()>>>(
      static_cast<float*>(values), static_cast<const uint16_t*>(hi),
      static_cast<const int16_t*>(lo), n);
  FT_CUDA_CHECK_LAUNCH();
}

void fill(void* dst, DType dtype, int64_t n, double value) {
  if (n == 0) return;
  // The value is converted on the host exactly as the CPU fill converts it.
  switch (dtype) {
    case DType::f32:
      return launch_fill(dst, n, bits_of<uint32_t>(static_cast<float>(value)));
    case DType::bf16:
      return launch_fill(dst, n, bf16(static_cast<float>(value)).bits);
    case DType::f64:
      return launch_fill(dst, n, bits_of<uint64_t>(value));
    case DType::i32:
      return launch_fill(dst, n, bits_of<uint32_t>(static_cast<int32_t>(value)));
    case DType::i16:
      return launch_fill(dst, n, bits_of<uint16_t>(static_cast<int16_t>(value)));
  }
}

void zero_bytes(void* dst, size_t nbytes) {
  if (nbytes == 0) return;
  FT_CUDA_CHECK(cudaMemsetAsync(dst, 0, nbytes, current_stream()));
}

}  // namespace ft::cuda

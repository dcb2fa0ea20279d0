// Elementwise activations on the GPU: GELU (tanh approximation, GPT-2's) and SwiGLU (LLaMA's
// MLP gate), the same fp32 formulas as the CPU (src/nn/activations.cpp) with IEEE tanhf/expf.
// Memory bound: one 16-byte pack of each input read and of each output written per thread and
// step (8 bf16 or 4 fp32 elements). Each pack is read before the output pack is written, so an
// output may alias an input.
#include "nn/cuda/common.cuh"
#include "nn/cuda/cuda_layers.h"

namespace ft::nn::cuda {
namespace {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

__device__ __forceinline__ float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));
}

struct GeluForward {
  __device__ float operator()(float v, float) const {
    const float inner = kGeluScale * (v + kGeluCubic * v * v * v);
    return 0.5f * v * (1.0f + tanhf(inner));
  }
};

// Arguments (dout, x).
struct GeluBackward {
  __device__ float operator()(float d, float v) const {
    const float inner = kGeluScale * (v + kGeluCubic * v * v * v);
    const float th = tanhf(inner);
    const float dinner = kGeluScale * (1.0f + 3.0f * kGeluCubic * v * v);
    return d * (0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * dinner);
  }
};

// Arguments (gate, up).
struct SwigluForward {
  __device__ float operator()(float g, float u) const { return g * sigmoid(g) * u; }
};

// d silu(g) / dg = sig(g) * (1 + g * (1 - sig(g))). Either output may be null.
template <class T, int W>
__global__ void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                                       int64_t n_packs) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < n_packs;
       p += stride) {
    const Pack<T, W> gp = load_pack<T, W>(gate + p * W);
    const Pack<T, W> up_p = load_pack<T, W>(up + p * W);
    const Pack<T, W> dp = load_pack<T, W>(dout + p * W);
    Pack<T, W> dg, du;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      const float g = to_f32(gp.v[k]), u = to_f32(up_p.v[k]), d = to_f32(dp.v[k]);
      const float sig = sigmoid(g);
      dg.v[k] = from_f32<T>(d * u * sig * (1.0f + g * (1.0f - sig)));
      du.v[k] = from_f32<T>(d * g * sig);
    }
    if (dgate != nullptr) store_pack<T, W>(dgate + p * W, dg);
    if (dup != nullptr) store_pack<T, W>(dup + p * W, du);
  }
}

}  // namespace

void gelu_forward(Tensor& out, const Tensor& x) {
  dispatch_cuda_float(x.dtype(), "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    launch_map<T>(ptr<T>(out), ptr<T>(x), nullptr, x.numel(), GeluForward{});
  });
}

void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  dispatch_cuda_float(x.dtype(), "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_map<T>(ptr<T>(dx), ptr<T>(dout), ptr<T>(x), x.numel(), GeluBackward{});
  });
}

void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  dispatch_cuda_float(gate.dtype(), "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    launch_map<T>(ptr<T>(out), ptr<T>(gate), ptr<T>(up), gate.numel(), SwigluForward{});
  });
}

void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  const int64_t n = gate.numel();
  if (n == 0 || (!dgate.defined() && !dup.defined())) return;
  dispatch_cuda_float(gate.dtype(), "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    T* dg = ptr_or_null<T>(dgate);
    T* du = ptr_or_null<T>(dup);
    const T *d = ptr<T>(dout), *g = ptr<T>(gate), *u = ptr<T>(up);
    constexpr int kThreads = kElementwiseThreads;
    if (can_use_packs<T>(n, {dg, du, d, g, u})) {
      constexpr int W = kPackWidth<T>;
      swiglu_backward_kernel<T, W>
          <<<grid_for(n / W, kThreads), kThreads, 0, stream()>>>(dg, du, d, g, u, n / W);
    } else {
      swiglu_backward_kernel<T, 1>
          <<<grid_for(n, kThreads), kThreads, 0, stream()>>>(dg, du, d, g, u, n);
    }
    FT_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace ft::nn::cuda

// Elementwise activations, CPU: GELU (tanh approximation, GPT-2's) and SwiGLU (LLaMA's MLP
// gate). Memory bound: one read of each input and one write of each output per element.
// Every kernel reads element i of all inputs before writing element i of an output, so an
// output may alias an input of the same shape.
#include <cmath>

#include "nn/checks.h"
#include "nn/layers.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

using detail::check_like;

// sqrt(2 / pi), the GELU tanh-approximation constant.
constexpr double kGeluScale = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;

bool parallel_elems(int64_t n) {
  return n >= detail::kParallelMinWork;
}

// The call runs on x's device; every other tensor is checked against x (check_like).
void check_input(const Tensor& x, const char* fn, const char* name) {
  detail::call_device(x, fn, name);
  detail::check_float(x, fn, name);
}

template <class A>
A sigmoid(A z) {
  return A(1) / (A(1) + std::exp(-z));
}

template <class T>
void gelu_forward_kernel(T* out, const T* x, int64_t n) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (parallel_elems(n))
  for (int64_t i = 0; i < n; ++i) {
    const A v = load(x[i]);
    const A inner = A(kGeluScale) * (v + A(kGeluCubic) * v * v * v);
    store(out[i], A(0.5) * v * (A(1) + std::tanh(inner)));
  }
}

template <class T>
void gelu_backward_kernel(T* dx, const T* dout, const T* x, int64_t n) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (parallel_elems(n))
  for (int64_t i = 0; i < n; ++i) {
    const A v = load(x[i]);
    const A inner = A(kGeluScale) * (v + A(kGeluCubic) * v * v * v);
    const A th = std::tanh(inner);
    const A dinner = A(kGeluScale) * (A(1) + A(3 * kGeluCubic) * v * v);
    const A grad = A(0.5) * (A(1) + th) + A(0.5) * v * (A(1) - th * th) * dinner;
    store(dx[i], load(dout[i]) * grad);
  }
}

template <class T>
void swiglu_forward_kernel(T* out, const T* gate, const T* up, int64_t n) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (parallel_elems(n))
  for (int64_t i = 0; i < n; ++i) {
    const A g = load(gate[i]);
    store(out[i], g * sigmoid(g) * load(up[i]));
  }
}

// d silu(g) / dg = sig(g) * (1 + g * (1 - sig(g))).
template <class T>
void swiglu_backward_kernel(T* dgate, T* dup, const T* dout, const T* gate, const T* up,
                            int64_t n) {
  using A = acc_t<T>;
#pragma omp parallel for schedule(static) if (parallel_elems(n))
  for (int64_t i = 0; i < n; ++i) {
    const A g = load(gate[i]), u = load(up[i]), d = load(dout[i]);
    const A sig = sigmoid(g);
    if (dgate) store(dgate[i], d * u * sig * (A(1) + g * (A(1) - sig)));
    if (dup) store(dup[i], d * g * sig);
  }
}

}  // namespace

void gelu_forward(Tensor& out, const Tensor& x) {
  constexpr const char* fn = "gelu_forward";
  check_input(x, fn, "x");
  check_like(out, x, fn, "out", "x");
#ifdef FLASHTRAIN_WITH_CUDA
  if (x.device() == Device::cuda) return cuda::gelu_forward(out, x);
#endif
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    gelu_forward_kernel(out.data<T>(), x.data<T>(), x.numel());
  });
}

void gelu_backward(Tensor& dx, const Tensor& dout, const Tensor& x) {
  constexpr const char* fn = "gelu_backward";
  check_input(x, fn, "x");
  check_like(dout, x, fn, "dout", "x");
  if (!dx.defined()) return;
  check_like(dx, x, fn, "dx", "x");
#ifdef FLASHTRAIN_WITH_CUDA
  if (x.device() == Device::cuda) return cuda::gelu_backward(dx, dout, x);
#endif
  dispatch_float(x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    gelu_backward_kernel(dx.data<T>(), dout.data<T>(), x.data<T>(), x.numel());
  });
}

void swiglu_forward(Tensor& out, const Tensor& gate, const Tensor& up) {
  constexpr const char* fn = "swiglu_forward";
  check_input(gate, fn, "gate");
  check_like(up, gate, fn, "up", "gate");
  check_like(out, gate, fn, "out", "gate");
#ifdef FLASHTRAIN_WITH_CUDA
  if (gate.device() == Device::cuda) return cuda::swiglu_forward(out, gate, up);
#endif
  dispatch_float(gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel(out.data<T>(), gate.data<T>(), up.data<T>(), gate.numel());
  });
}

void swiglu_backward(Tensor& dgate, Tensor& dup, const Tensor& dout, const Tensor& gate,
                     const Tensor& up) {
  constexpr const char* fn = "swiglu_backward";
  check_input(gate, fn, "gate");
  check_like(up, gate, fn, "up", "gate");
  check_like(dout, gate, fn, "dout", "gate");
  if (dgate.defined()) check_like(dgate, gate, fn, "dgate", "gate");
  if (dup.defined()) check_like(dup, gate, fn, "dup", "gate");
#ifdef FLASHTRAIN_WITH_CUDA
  if (gate.device() == Device::cuda) return cuda::swiglu_backward(dgate, dup, dout, gate, up);
#endif
  dispatch_float(gate.dtype(), [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel(dgate.defined() ? dgate.data<T>() : nullptr,
                           dup.defined() ? dup.data<T>() : nullptr, dout.data<T>(), gate.data<T>(),
                           up.data<T>(), gate.numel());
  });
}

}  // namespace ft::nn

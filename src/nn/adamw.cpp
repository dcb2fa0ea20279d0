// AdamW on the CPU, elementwise over fp32 (or fp64) master weights and moments, and the global
// gradient norm.
//
// The update follows PyTorch's torch.optim.AdamW (single-tensor path) operation by operation,
// because fp32 loss curves are compared with PyTorch's:
//   p *= 1 - lr * wd                      (decoupled decay first, on the old weights)
//   m = m + (1 - b1) * (g - m)            (torch's lerp; equals b1 m + (1 - b1) g)
//   v = b2 v + (1 - b2) g^2
//   p -= (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// which is p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p_old) up to rounding. Scalars are
// formed in fp64 and rounded once to the tensor dtype, as torch does with Python floats.
//
// global_grad_norm sums squares in fp64 over fixed-size blocks and adds the block sums in
// order, so the result (and every clipped step) does not depend on the thread count.
// CUDA tensors go to src/nn/cuda/adamw.cu: the same fp32 operations with the same scalars, and a
// deterministic two-stage fp64 reduction for the norm.
//
// adamw_update_all (the trainer's step over every parameter): on the CPU the per-tensor update
// and write_compute_copy in a loop, and for split masters (core/f32_halves.h) the same update of
// each element between joining its halves and splitting it again; on CUDA one multi-tensor
// kernel launch for all tensors that also writes the compute copies (see adamw.cu),
// bit-identical to the loop.
#include "nn/adamw.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include "core/f32_halves.h"
#include "nn/checks.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "nn/cuda/cuda_layers.h"
#endif

namespace ft::nn {
namespace {

constexpr const char* kAdam = "adamw_update";

template <class T>
struct AdamScalars {
  T decay_mul, one_minus_b1, b2, one_minus_b2, neg_step_size, bc2_sqrt, eps, grad_scale;
};

// The fp64 values of a step that depend on lr and step (write_adamw_step_values stores them).
struct StepValues {
  double decay_mul, neg_step_size, bc2_sqrt;
};

StepValues step_values(double lr, const AdamWConfig& cfg, int64_t step) {
  const double t = static_cast<double>(step);
  const double bc1 = 1.0 - std::pow(cfg.beta1, t);
  const double bc2 = 1.0 - std::pow(cfg.beta2, t);
  return {1.0 - lr * cfg.weight_decay, -(lr / bc1), std::sqrt(bc2)};
}

template <class T>
AdamScalars<T> adam_scalars(double lr, const AdamWConfig& cfg, int64_t step, double grad_scale,
                            bool decay) {
  const StepValues v = step_values(lr, cfg, step);
  return {static_cast<T>(decay ? v.decay_mul : 1.0),
          static_cast<T>(1.0 - cfg.beta1),
          static_cast<T>(cfg.beta2),
          static_cast<T>(1.0 - cfg.beta2),
          static_cast<T>(v.neg_step_size),
          static_cast<T>(v.bc2_sqrt),
          static_cast<T>(cfg.eps),
          static_cast<T>(grad_scale)};
}

template <class T>
inline void adamw_element(T& p, T grad, T& m, T& v, const AdamScalars<T>& s) {
  const T g = grad * s.grad_scale;
  m += s.one_minus_b1 * (g - m);
  v = v * s.b2 + s.one_minus_b2 * g * g;
  const T denom = std::sqrt(v) / s.bc2_sqrt + s.eps;
  p *= s.decay_mul;
  p += (s.neg_step_size * m) / denom;  // torch's addcdiv order
}

template <class T>
void adamw_kernel(T* p, const T* grad, T* m, T* v, int64_t n, const AdamScalars<T>& s) {
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) adamw_element(p[i], grad[i], m[i], v[i], s);
}

// The update of a split master: each element's halves joined, updated, split again.
void adamw_split_kernel(bf16* hi, int16_t* lo, const float* grad, float* m, float* v, int64_t n,
                        const AdamScalars<float>& s) {
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMinWork)
  for (int64_t i = 0; i < n; ++i) {
    auto p = std::bit_cast<float>(join_f32_bits(hi[i].bits, lo[i]));
    adamw_element(p, grad[i], m[i], v[i], s);
    const F32Halves h = split_f32_bits(std::bit_cast<uint32_t>(p));
    hi[i] = bf16::from_bits(h.hi);
    lo[i] = h.lo;
  }
}

void check_state(const Tensor& t, const Tensor& master, const char* name) {
  detail::check_like(t, master, kAdam, name, "master");
}

template <class T>
double sum_squares(const T* x, int64_t n) {
  constexpr int64_t kBlock = 1 << 14;
  const int64_t n_blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(n_blocks), 0.0);
#pragma omp parallel for schedule(static) if (n >= detail::kParallelMinWork)
  for (int64_t blk = 0; blk < n_blocks; ++blk) {
    const int64_t end = std::min(n, (blk + 1) * kBlock);
    double s = 0.0;
    for (int64_t i = blk * kBlock; i < end; ++i) {
      const double g = static_cast<double>(load(x[i]));
      s += g * g;
    }
    partial[blk] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return total;
}

}  // namespace

namespace {

void check_update(const Tensor& master, const Tensor& grad, const Tensor& m, const Tensor& v,
                  double lr, const AdamWConfig& cfg, int64_t step, double grad_scale) {
  detail::call_device(master, kAdam, "master");
  FT_CHECK(master.dtype() == DType::f32 || master.dtype() == DType::f64, kAdam, ": master is ",
           dtype_name(master.dtype()), ", expected fp32 (or fp64 in tests)");
  check_state(grad, master, "grad");
  check_state(m, master, "m");
  check_state(v, master, "v");
  FT_CHECK(step >= 1, kAdam, ": step ", step, " must be >= 1 (steps are 1-based)");
  FT_CHECK(cfg.beta1 >= 0 && cfg.beta1 < 1 && cfg.beta2 >= 0 && cfg.beta2 < 1, kAdam, ": betas (",
           cfg.beta1, ", ", cfg.beta2, ") must be in [0, 1)");
  FT_CHECK(std::isfinite(lr) && std::isfinite(grad_scale), kAdam, ": lr ", lr, " and grad_scale ",
           grad_scale, " must be finite");
}

#ifdef FLASHTRAIN_WITH_CUDA
cuda::AdamWScalars cuda_scalars(double lr, const AdamWConfig& cfg, int64_t step, double grad_scale,
                                bool decay) {
  const AdamScalars<float> s = adam_scalars<float>(lr, cfg, step, grad_scale, decay);
  return {s.decay_mul,     s.one_minus_b1, s.b2,  s.one_minus_b2,
          s.neg_step_size, s.bc2_sqrt,     s.eps, s.grad_scale};
}
#endif

bool is_split(const AdamWTensor& t) {
  return t.master_lo.defined();
}

bool has_own_compute(const AdamWTensor& t) {
  return !is_split(t) && t.compute.defined() && t.compute.raw() != t.master.raw();
}

// A split master's halves and state: compute bf16, master_lo int16, grad, m and v fp32, one
// shape, on `device`.
void check_split(const AdamWTensor& t, Device device, const std::string& name, double lr,
                 const AdamWConfig& cfg, int64_t step, double grad_scale) {
  constexpr const char* fn = "adamw_update_all";
  FT_CHECK(!t.master.defined(), fn, ": ", name,
           " has a master and a low half; a split master is its halves alone");
  FT_CHECK(
      t.compute.defined() && t.compute.dtype() == DType::bf16 && t.master_lo.dtype() == DType::i16,
      fn, ": ", name, " is split: its halves must be bf16 (compute) and int16 (master_lo)");
  detail::check_on(t.master_lo, device, fn, (name + " master_lo").c_str());
  detail::check_on(t.compute, device, fn, (name + " compute").c_str());
  FT_CHECK(t.compute.shape() == t.master_lo.shape(), fn, ": ", name, " compute ",
           shape_str(t.compute.shape()), " does not match master_lo ",
           shape_str(t.master_lo.shape()));
  FT_CHECK(t.grad.defined() && t.grad.dtype() == DType::f32, fn, ": ", name,
           " is split: grad must be fp32");
  // The update's checks, with the gradient standing in for the master it shapes.
  check_update(t.grad, t.grad, t.m, t.v, lr, cfg, step, grad_scale);
  FT_CHECK(t.grad.shape() == t.compute.shape(), fn, ": ", name, " grad ", shape_str(t.grad.shape()),
           " does not match compute ", shape_str(t.compute.shape()));
}

// The arguments of adamw_update_all (tensors not empty); returns their device.
Device check_all(const std::vector<AdamWTensor>& tensors, double lr, const AdamWConfig& cfg,
                 int64_t step, double grad_scale) {
  constexpr const char* fn = "adamw_update_all";
  // The parameter's device (its master, or its compute copy where the master is split) is the
  // call's: a gradient elsewhere is then the tensor named as misplaced.
  const AdamWTensor& first = tensors[0];
  const Device device = first.master.defined()
                            ? detail::call_device(first.master, fn, "master of tensor 0")
                            : detail::call_device(first.compute, fn, "compute of tensor 0");
  for (size_t i = 0; i < tensors.size(); ++i) {
    const AdamWTensor& t = tensors[i];
    const std::string name = str("tensor ", i);
    if (is_split(t)) {
      check_split(t, device, name, lr, cfg, step, grad_scale);
      continue;
    }
    detail::check_on(t.master, device, fn, (name + " master").c_str());
    check_update(t.master, t.grad, t.m, t.v, lr, cfg, step, grad_scale);
    if (!has_own_compute(t)) continue;
    detail::check_on(t.compute, device, fn, (name + " compute").c_str());
    FT_CHECK(t.compute.shape() == t.master.shape(), fn, ": ", name, " compute ",
             shape_str(t.compute.shape()), " does not match master ", shape_str(t.master.shape()));
    detail::check_float(t.compute, fn, (name + " compute").c_str());
  }
  return device;
}

}  // namespace

void adamw_update(Tensor& master, const Tensor& grad, Tensor& m, Tensor& v, double lr,
                  const AdamWConfig& cfg, int64_t step, double grad_scale, bool decay) {
  check_update(master, grad, m, v, lr, cfg, step, grad_scale);
#ifdef FLASHTRAIN_WITH_CUDA
  if (master.device() == Device::cuda) {
    return cuda::adamw_update(master, grad, m, v, cuda_scalars(lr, cfg, step, grad_scale, decay));
  }
#endif
  if (master.dtype() == DType::f32) {
    adamw_kernel(master.data<float>(), grad.data<float>(), m.data<float>(), v.data<float>(),
                 master.numel(), adam_scalars<float>(lr, cfg, step, grad_scale, decay));
  } else {
    adamw_kernel(master.data<double>(), grad.data<double>(), m.data<double>(), v.data<double>(),
                 master.numel(), adam_scalars<double>(lr, cfg, step, grad_scale, decay));
  }
}

void adamw_update_all(std::vector<AdamWTensor>& tensors, double lr, const AdamWConfig& cfg,
                      int64_t step, double grad_scale) {
  if (tensors.empty()) return;
  [[maybe_unused]] const Device device = check_all(tensors, lr, cfg, step, grad_scale);
#ifdef FLASHTRAIN_WITH_CUDA
  if (device == Device::cuda) {
    return cuda::adamw_update_all(tensors, cuda_scalars(lr, cfg, step, grad_scale, true),
                                  cuda_scalars(lr, cfg, step, grad_scale, false).decay_mul);
  }
#endif
  for (AdamWTensor& t : tensors) {
    if (is_split(t)) {
      adamw_split_kernel(t.compute.data<bf16>(), t.master_lo.data<int16_t>(), t.grad.data<float>(),
                         t.m.data<float>(), t.v.data<float>(), t.grad.numel(),
                         adam_scalars<float>(lr, cfg, step, grad_scale, t.decay));
      continue;
    }
    adamw_update(t.master, t.grad, t.m, t.v, lr, cfg, step, grad_scale, t.decay);
    if (has_own_compute(t)) write_compute_copy(t.compute, t.master);
  }
}

void write_compute_copy(Tensor& compute, const Tensor& master) {
  if (compute.dtype() != DType::bf16) return compute.copy_from(master);
  Tensor no_low_half;
  split_f32(compute, no_low_half, master.dtype() == DType::f32 ? master : master.to(DType::f32));
}

double clip_scale(double norm, double max_norm) {
  return max_norm > 0 && norm > max_norm ? max_norm / norm : 1.0;
}

void adamw_update_all(std::vector<AdamWTensor>& tensors, double lr, const AdamWConfig& cfg,
                      int64_t step, const Tensor& norm, double max_norm) {
  constexpr const char* fn = "adamw_update_all";
  FT_CHECK(norm.defined() && norm.dtype() == DType::f64 && norm.numel() == 1, fn,
           ": the norm must be one fp64 value (global_grad_norm_tensor), got ",
           norm.defined() ? str(dtype_name(norm.dtype()), " ", shape_str(norm.shape()))
                          : std::string("none"));
  if (tensors.empty()) return;
  detail::check_on(norm, tensors[0].grad.device(), fn, "norm");
#ifdef FLASHTRAIN_WITH_CUDA
  if (norm.device() == Device::cuda) {
    check_all(tensors, lr, cfg, step, 1.0);  // grad_scale is formed on the device
    return cuda::adamw_update_all(tensors, cuda_scalars(lr, cfg, step, 1.0, true),
                                  cuda_scalars(lr, cfg, step, 1.0, false).decay_mul,
                                  static_cast<const double*>(norm.raw()), max_norm);
  }
#endif
  adamw_update_all(tensors, lr, cfg, step, clip_scale(norm.data<double>()[0], max_norm));
}

void write_adamw_step_values(Tensor& values, double lr, const AdamWConfig& cfg, int64_t step) {
  FT_CHECK(values.defined() && values.device() == Device::cpu && values.dtype() == DType::f64 &&
               values.numel() == kAdamWStepValues,
           "write_adamw_step_values: the values must be a CPU fp64 tensor of ", kAdamWStepValues,
           " elements");
  FT_CHECK(step >= 1 && step < (int64_t{1} << 53), "write_adamw_step_values: step ", step,
           " must be >= 1 and exact in fp64");
  const StepValues v = step_values(lr, cfg, step);
  double* out = values.data<double>();
  out[0] = lr;
  out[1] = static_cast<double>(step);
  out[2] = v.decay_mul;
  out[3] = v.neg_step_size;
  out[4] = v.bc2_sqrt;
}

void adamw_update_all(std::vector<AdamWTensor>& tensors, const Tensor& step_values,
                      const AdamWConfig& cfg, const Tensor& norm, double max_norm) {
  constexpr const char* fn = "adamw_update_all";
  FT_CHECK(step_values.defined() && step_values.device() == Device::cpu &&
               step_values.dtype() == DType::f64 && step_values.numel() == kAdamWStepValues,
           fn, ": the step values must be write_adamw_step_values' CPU fp64 tensor");
  const double lr = step_values.data<double>()[0];
  const auto step = static_cast<int64_t>(step_values.data<double>()[1]);
#ifdef FLASHTRAIN_WITH_CUDA
  if (!tensors.empty() && norm.defined() && norm.device() == Device::cuda) {
    FT_CHECK(norm.dtype() == DType::f64 && norm.numel() == 1, fn,
             ": the norm must be one fp64 value (global_grad_norm_tensor)");
    check_all(tensors, lr, cfg, step, 1.0);  // grad_scale is formed on the device
    // lr and step reach the kernel through memory, the constants of cfg as arguments.
    const Tensor on_device = step_values.to(Device::cuda);
    return cuda::adamw_update_all(tensors, cuda_scalars(lr, cfg, step, 1.0, true),
                                  cuda_scalars(lr, cfg, step, 1.0, false).decay_mul,
                                  static_cast<const double*>(norm.raw()), max_norm,
                                  static_cast<const double*>(on_device.raw()));
  }
#endif
  adamw_update_all(tensors, lr, cfg, step, norm, max_norm);
}

double global_grad_norm(const std::vector<Tensor>& grads) {
  return global_grad_norm_tensor(grads).to(Device::cpu).data<double>()[0];
}

Tensor global_grad_norm_tensor(const std::vector<Tensor>& grads) {
  constexpr const char* fn = "global_grad_norm";
  if (grads.empty()) return Tensor::zeros({1}, DType::f64);
  const Device device = detail::call_device(grads[0], fn, "gradient 0");
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string name = str("gradient ", i);
    detail::check_on(grads[i], device, fn, name.c_str());
  }
#ifdef FLASHTRAIN_WITH_CUDA
  if (device == Device::cuda) return cuda::global_grad_norm_tensor(grads);
#endif
  double total = 0.0;
  for (const Tensor& g : grads) {
    dispatch_float(g.dtype(), [&](auto tag) {
      using T = decltype(tag);
      total += sum_squares(g.data<T>(), g.numel());
    });
  }
  Tensor norm = Tensor::empty({1}, DType::f64);
  norm.data<double>()[0] = std::sqrt(total);
  return norm;
}

}  // namespace ft::nn

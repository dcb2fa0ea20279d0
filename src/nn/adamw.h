// AdamW with fp32 master weights and moments (decoupled weight decay, bias-corrected moments),
// and global gradient-norm clipping.
#pragma once

#include <vector>

#include "core/tensor.h"

namespace ft::nn {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// One parameter tensor's state. master, grad, m, v share a shape and are fp32 (fp64 allowed
// for tests). step is 1-based (the update after the first micro-batch sum is step 1).
// grad_scale multiplies the gradient first (clipping and averaging fold into it).
// decay: apply weight decay (matrices yes, biases/norms/none per the caller).
void adamw_update(Tensor& master, const Tensor& grad, Tensor& m, Tensor& v, double lr,
                  const AdamWConfig& cfg, int64_t step, double grad_scale, bool decay);

// One parameter tensor for adamw_update_all, in one of two forms:
// - whole: the arguments of adamw_update, plus an optional compute copy that is refreshed from
//   the updated master (write_compute_copy). An undefined compute, or one sharing master's
//   memory, is skipped.
// - split (master_lo defined, master undefined): an fp32 master kept as two 16-bit halves
//   (core/f32_halves.h), compute (bf16) the high half and master_lo (int16) the low half, as a
//   bf16 model keeps its masters (models::Parameter). Each element is joined, updated and split
//   again, so the compute copy is the master's own high half and needs no refresh. grad, m and
//   v are fp32.
// The two forms give the same masters, moments and compute copies bit for bit (the whole form
// is the split one's slow twin), except that a NaN master may end with another NaN payload.
struct AdamWTensor {
  Tensor master, grad, m, v;
  bool decay = false;
  Tensor compute;
  // {}: a whole tensor's braced initialiser may end at compute (no missing-initialiser warning).
  Tensor master_lo{};
};

// What adamw_update_all writes into the compute copy of a whole master: a bf16 copy is the high
// half of the master split in two (ties away from zero, core/f32_halves.h; an fp64 master is
// rounded to fp32 first), so that it equals the compute copy of a split master; another dtype
// is converted (Tensor::copy_from).
void write_compute_copy(Tensor& compute, const Tensor& master);

// adamw_update over every tensor with one lr, step and grad_scale, then the compute copies.
// Equal bit for bit to adamw_update per tensor followed by write_compute_copy (split tensors:
// join, adamw_update, split_f32). CUDA: one kernel launch for all tensors (fp32 masters, whole
// or split; compute copies fp32 or bf16). All tensors on one device.
void adamw_update_all(std::vector<AdamWTensor>& tensors, double lr, const AdamWConfig& cfg,
                      int64_t step, double grad_scale);

// The scale that clipping to max_norm applies for a gradient norm: max_norm / norm when
// max_norm > 0 and norm > max_norm, else 1 (fp64; a NaN norm gives 1).
double clip_scale(double norm, double max_norm);

// adamw_update_all with grad_scale = clip_scale(norm, max_norm) formed where the norm lives:
// `norm` is a one-element fp64 tensor on the tensors' device (global_grad_norm_tensor), so on
// the GPU the host never waits for it (the kernel reads it). Bit-identical to adamw_update_all
// with that grad_scale given by the host.
void adamw_update_all(std::vector<AdamWTensor>& tensors, double lr, const AdamWConfig& cfg,
                      int64_t step, const Tensor& norm, double max_norm);

// What one AdamW step takes from lr and step, as a CPU fp64 tensor of kAdamWStepValues values
// (lr, step, and the decay factor and the bias corrections formed from them in fp64 exactly as
// adamw_update forms them): the form in which a step's lr reaches a captured CUDA graph, which
// copies it from page-locked memory at every replay (Tensor::empty_pinned, core/cuda/graph.h).
constexpr int64_t kAdamWStepValues = 5;
void write_adamw_step_values(Tensor& values, double lr, const AdamWConfig& cfg, int64_t step);
// adamw_update_all(tensors, lr, cfg, step, norm, max_norm) with lr and step read from
// `step_values` (write_adamw_step_values' CPU tensor). On the GPU the kernel reads the values
// from a copy of the tensor queued on the stream (from page-locked memory: when it runs), so the
// host's only per-step work is writing those five numbers. Bit-identical to the other form.
void adamw_update_all(std::vector<AdamWTensor>& tensors, const Tensor& step_values,
                      const AdamWConfig& cfg, const Tensor& norm, double max_norm);
// sqrt(sum over tensors of sum(g^2)), accumulated in fp64.
double global_grad_norm(const std::vector<Tensor>& grads);
// The same value as a one-element fp64 tensor on the gradients' device (the CPU for none),
// nothing read back: global_grad_norm is this, read.
Tensor global_grad_norm_tensor(const std::vector<Tensor>& grads);

}  // namespace ft::nn

// The optimizer step of training, as one object, so that everything that steps a model (the
// trainer, `flashtrain debug-step` and with it tests/torch_parity.py) runs the same path:
// the global gradient norm (nn::global_grad_norm_tensor: fp64, independent of the thread count,
// left on the device), clipping to grad_clip (scale = grad_clip / norm when the norm is larger,
// formed where the norm is), then AdamW over every parameter in one nn::adamw_update_all call
// (one multi-tensor kernel on the GPU), which also writes the compute copies (a bf16 model's are
// the high halves of its split masters, updated with them). The moments live in the model's
// Parameters, so the resume state saves and restores them; they are allocated, zero, on the
// first step.
#pragma once

#include <cstdint>

#include "models/transformer.h"
#include "nn/adamw.h"

namespace ft::train {

// What a step did. The norm stays where it was computed (one fp64 value on the model's device:
// on the GPU, AdamW forms the clipping scale from it there, so the host does not wait for the
// device mid-step); grad_norm() reads it, waiting for the device.
struct OptimizerStep {
  Tensor norm;            // the global gradient norm before clipping
  double max_norm = 0.0;  // the clipping threshold (<= 0: none)
  double grad_norm() const;
  // What the gradients were multiplied by: nn::clip_scale(grad_norm(), max_norm), <= 1.
  double grad_scale() const;
};

class Optimizer {
 public:
  // grad_clip <= 0: no clipping. The model must outlive the optimizer.
  Optimizer(models::Transformer& model, const nn::AdamWConfig& adamw, double grad_clip);

  // One update from the gradients the model holds; step is 1-based (bias correction).
  // set_step(step, lr), then the update's work queued, reading lr and step from step_values().
  OptimizerStep step(int64_t step, double lr);

  // Writes what a step takes from lr and step into step_values() (nn::write_adamw_step_values),
  // queuing nothing: before each replay of a captured step, which copies them from there.
  void set_step(int64_t step, double lr);
  // Moves the step values to page-locked memory, so that a captured step reads them at each
  // replay (core/cuda/graph.h). The host then rewrites them only when the device is done with
  // the last step (the trainer reads each step's losses first). Pageable by default: a copy
  // from there is staged at once, so callers that queue steps back to back need not wait.
  void pin_step_values();
  const Tensor& step_values() const { return step_values_; }

 private:
  models::Transformer& model_;
  nn::AdamWConfig adamw_;
  double grad_clip_;
  Tensor step_values_;
};

}  // namespace ft::train

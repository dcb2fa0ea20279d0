#include "train/optimizer.h"

#include <vector>

namespace ft::train {

Optimizer::Optimizer(models::Transformer& model, const nn::AdamWConfig& adamw, double grad_clip)
    : model_(model),
      adamw_(adamw),
      grad_clip_(grad_clip),
      step_values_(Tensor::zeros({nn::kAdamWStepValues}, DType::f64)) {}

void Optimizer::set_step(int64_t step, double lr) {
  nn::write_adamw_step_values(step_values_, lr, adamw_, step);
}

void Optimizer::pin_step_values() {
  Tensor pinned = Tensor::empty_pinned({nn::kAdamWStepValues}, DType::f64);
  pinned.copy_from(step_values_);
  step_values_ = pinned;
}

double OptimizerStep::grad_norm() const {
  return norm.to(Device::cpu).data<double>()[0];  // waits for the device
}

double OptimizerStep::grad_scale() const {
  return nn::clip_scale(grad_norm(), max_norm);
}

OptimizerStep Optimizer::step(int64_t step, double lr) {
  std::vector<Tensor> grads;
  for (const models::Parameter& p : model_.parameters()) grads.push_back(p.grad);
  OptimizerStep r;
  r.norm = nn::global_grad_norm_tensor(grads);
  r.max_norm = grad_clip_;
  std::vector<nn::AdamWTensor> update;
  for (models::Parameter& p : model_.parameters()) {
    const Device device = p.grad.device();
    if (!p.m.defined()) p.m = Tensor::zeros(p.shape(), p.master_dtype(), device);
    if (!p.v.defined()) p.v = Tensor::zeros(p.shape(), p.master_dtype(), device);
    update.push_back({p.master, p.grad, p.m, p.v, p.decay, p.compute, p.master_lo});
  }
  set_step(step, lr);
  nn::adamw_update_all(update, step_values_, adamw_, r.norm, grad_clip_);
  return r;
}

}  // namespace ft::train

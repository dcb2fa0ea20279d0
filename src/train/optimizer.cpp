#include "train/optimizer.h"

#include <vector>

namespace ft::train {

Optimizer::Optimizer(models::Transformer& model, const nn::AdamWConfig& adamw, double grad_clip)
    : model_(model), adamw_(adamw), grad_clip_(grad_clip) {}

OptimizerStep Optimizer::step(int64_t step, double lr) {
  std::vector<Tensor> grads;
  for (const models::Parameter& p : model_.parameters()) grads.push_back(p.grad);
  OptimizerStep r;
  r.grad_norm = nn::global_grad_norm(grads);
  if (grad_clip_ > 0 && r.grad_norm > grad_clip_) r.grad_scale = grad_clip_ / r.grad_norm;
  std::vector<nn::AdamWTensor> update;
  for (models::Parameter& p : model_.parameters()) {
    const Device device = p.master.device();
    if (!p.m.defined()) p.m = Tensor::zeros(p.master.shape(), p.master.dtype(), device);
    if (!p.v.defined()) p.v = Tensor::zeros(p.master.shape(), p.master.dtype(), device);
    update.push_back({p.master, p.grad, p.m, p.v, p.decay, p.compute});
  }
  nn::adamw_update_all(update, lr, adamw_, step, r.grad_scale);
  return r;
}

}  // namespace ft::train

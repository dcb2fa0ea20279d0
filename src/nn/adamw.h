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

// sqrt(sum over tensors of sum(g^2)), accumulated in fp64.
double global_grad_norm(const std::vector<Tensor>& grads);

}  // namespace ft::nn

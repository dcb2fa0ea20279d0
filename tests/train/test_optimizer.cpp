// train::Optimizer, the step that training and `flashtrain debug-step` share: the global norm,
// clipping by grad_clip / norm, AdamW with decay on matrices only, and the compute copies
// refreshed; bit for bit what the per-tensor operations give.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/rng.h"
#include "models/config.h"
#include "models/transformer.h"
#include "nn/adamw.h"
#include "train/optimizer.h"

namespace ft::train {
namespace {

models::ModelConfig tiny() {
  models::ModelOverrides o;
  o.layers = 1;
  o.width = 16;
  o.heads = 2;
  o.vocab = 50;
  o.context = 8;
  return models::apply_overrides(models::preset("gpt2-tiny"), o);
}

Tensor ids(uint64_t seed) {
  Rng rng(seed);
  Tensor t = Tensor::empty({2, 8}, DType::i32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % 50);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Two identical models after one forward and backward on the same batch.
struct TwoModels {
  models::Transformer a, b;
  explicit TwoModels(DType dtype) : a(tiny(), dtype, {}), b(tiny(), dtype, {}) {
    for (models::Transformer* m : {&a, &b}) {
      m->init_weights(3);
      m->zero_grad();
      m->forward(ids(1), ids(2));
      m->backward(1.0);
    }
  }
};

// The operations the optimizer stands for, one tensor at a time.
double reference_step(models::Transformer& model, const nn::AdamWConfig& cfg, double clip,
                      int64_t step, double lr) {
  std::vector<Tensor> grads;
  for (const models::Parameter& p : model.parameters()) grads.push_back(p.grad);
  const double norm = nn::global_grad_norm(grads);
  const double scale = norm > clip ? clip / norm : 1.0;
  for (models::Parameter& p : model.parameters()) {
    if (!p.m.defined()) p.m = Tensor::zeros(p.master.shape(), p.master.dtype());
    if (!p.v.defined()) p.v = Tensor::zeros(p.master.shape(), p.master.dtype());
    nn::adamw_update(p.master, p.grad, p.m, p.v, lr, cfg, step, scale, p.decay);
    p.sync_compute();
  }
  return norm;
}

void expect_same_state(const models::Transformer& a, const models::Transformer& b) {
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    const models::Parameter &p = a.parameters()[i], &q = b.parameters()[i];
    EXPECT_TRUE(same_bits(p.master, q.master)) << p.name << " master";
    EXPECT_TRUE(same_bits(p.m, q.m)) << p.name << " m";
    EXPECT_TRUE(same_bits(p.v, q.v)) << p.name << " v";
    EXPECT_TRUE(same_bits(p.compute, q.compute)) << p.name << " compute";
  }
}

TEST(Optimizer, StepIsNormClipAndAdamWOfEveryParameter) {
  const nn::AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  for (DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    TwoModels m(dtype);
    // A clip below the norm, so that clipping acts.
    std::vector<Tensor> grads;
    for (const models::Parameter& p : m.a.parameters()) grads.push_back(p.grad);
    const double clip = 0.5 * nn::global_grad_norm(grads);
    ASSERT_GT(clip, 0.0);
    Optimizer optimizer(m.a, cfg, clip);
    for (int64_t step = 1; step <= 3; ++step) {
      const double lr = 1e-2 * static_cast<double>(step);
      const OptimizerStep r = optimizer.step(step, lr);
      const double norm = reference_step(m.b, cfg, clip, step, lr);
      EXPECT_EQ(r.grad_norm(), norm);
      EXPECT_EQ(r.grad_scale(), norm > clip ? clip / norm : 1.0);
      expect_same_state(m.a, m.b);
    }
    EXPECT_LT(optimizer.step(4, 1e-3).grad_scale(), 1.0);  // same gradients, still clipped
  }
}

TEST(Optimizer, NoClipWhenOffOrUnderTheNorm) {
  TwoModels m(DType::f32);
  Optimizer off(m.a, {}, 0.0);
  EXPECT_EQ(off.step(1, 1e-3).grad_scale(), 1.0);
  Optimizer loose(m.b, {}, 1e30);
  const OptimizerStep r = loose.step(1, 1e-3);
  EXPECT_EQ(r.grad_scale(), 1.0);
  EXPECT_GT(r.grad_norm(), 0.0);
  // Unclipped, both took the same step.
  expect_same_state(m.a, m.b);
}

}  // namespace
}  // namespace ft::train

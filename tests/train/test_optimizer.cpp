// train::Optimizer, the step that training and `flashtrain debug-step` share: the global norm,
// clipping by grad_clip / norm, AdamW with decay on matrices only, and the compute copies
// refreshed; bit for bit what the per-tensor operations give on whole fp32 masters with compute
// copies of their own (the layout before bf16 models split their masters); on a GPU (skipped
// without one) the fused kernel on split masters against the CPU's optimizer and against whole
// masters updated tensor by tensor on the GPU.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "models/config.h"
#include "models/transformer.h"
#include "nn/adamw.h"
#include "tensor_test_util.h"
#include "train/optimizer.h"

namespace ft::train {
namespace {

using test::same_bits;

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

// The operations the optimizer stands for, one tensor at a time, on whole masters kept beside
// the model (a copy of its masters) and compute copies of their own, written from the updated
// masters by nn::write_compute_copy: the slow twin of a bf16 model's split masters. The model
// gives the gradients and holds the moments.
struct Reference {
  std::vector<Tensor> masters, compute;

  explicit Reference(const models::Transformer& model) {
    for (const models::Parameter& p : model.parameters()) {
      masters.push_back(p.master_weights());
      compute.push_back(p.split() ? p.compute.clone() : masters.back());
    }
  }

  double step(models::Transformer& model, const nn::AdamWConfig& cfg, double clip, int64_t step,
              double lr) {
    std::vector<Tensor> grads;
    for (const models::Parameter& p : model.parameters()) grads.push_back(p.grad);
    const double norm = nn::global_grad_norm(grads);
    const double scale = nn::clip_scale(norm, clip);
    for (size_t i = 0; i < masters.size(); ++i) {
      models::Parameter& p = model.parameters()[i];
      const Device device = p.grad.device();
      if (!p.m.defined()) p.m = Tensor::zeros(p.shape(), p.master_dtype(), device);
      if (!p.v.defined()) p.v = Tensor::zeros(p.shape(), p.master_dtype(), device);
      nn::adamw_update(masters[i], p.grad, p.m, p.v, lr, cfg, step, scale, p.decay);
      if (p.split()) nn::write_compute_copy(compute[i], masters[i]);
    }
    return norm;
  }
};

void expect_same_state(const models::Transformer& a, const models::Transformer& b,
                       const Reference& ref) {
  for (size_t i = 0; i < a.parameters().size(); ++i) {
    const models::Parameter &p = a.parameters()[i], &q = b.parameters()[i];
    EXPECT_TRUE(same_bits(p.master_weights(), ref.masters[i])) << p.name << " master";
    EXPECT_TRUE(same_bits(p.m, q.m)) << p.name << " m";
    EXPECT_TRUE(same_bits(p.v, q.v)) << p.name << " v";
    EXPECT_TRUE(same_bits(p.compute, ref.compute[i])) << p.name << " compute";
  }
}

void expect_same_state(const models::Transformer& a, const models::Transformer& b) {
  expect_same_state(a, b, Reference(b));
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
    Reference ref(m.b);
    for (int64_t step = 1; step <= 3; ++step) {
      const double lr = 1e-2 * static_cast<double>(step);
      const OptimizerStep r = optimizer.step(step, lr);
      const double norm = ref.step(m.b, cfg, clip, step, lr);
      EXPECT_EQ(r.grad_norm(), norm);
      EXPECT_EQ(r.grad_scale(), norm > clip ? clip / norm : 1.0);
      expect_same_state(m.a, m.b, ref);
    }
    EXPECT_LT(optimizer.step(4, 1e-3).grad_scale(), 1.0);  // same gradients, still clipped
  }
}

// The GPU's fused kernel on a bf16 model's split masters against the CPU's optimizer and against
// whole masters with bf16 copies of their own updated tensor by tensor on the GPU, all from the
// CPU model's gradients: the same masters, moments and copies bit for bit. No clipping: the
// devices sum the norm in different orders.
TEST(Optimizer, GpuStepOnSplitMastersMatchesTheCpuAndWholeMasters) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
  const nn::AdamWConfig cfg{0.9, 0.95, 1e-8, 0.1};
  models::Transformer cpu(tiny(), DType::bf16, {});
  models::Transformer gpu(tiny(), DType::bf16, {}, Device::cuda);
  models::Transformer twin(tiny(), DType::bf16, {}, Device::cuda);
  for (models::Transformer* m : {&cpu, &gpu, &twin}) m->init_weights(3);
  cpu.zero_grad();
  cpu.forward(ids(1), ids(2));
  cpu.backward(1.0);
  for (models::Transformer* m : {&gpu, &twin}) {
    Tensor grads = m->flat_grads();
    grads.copy_from(cpu.flat_grads());
  }
  Optimizer on_cpu(cpu, cfg, 0.0), on_gpu(gpu, cfg, 0.0);
  Reference ref(twin);
  for (int64_t step = 1; step <= 3; ++step) {
    const double lr = 1e-2 * static_cast<double>(step);
    on_cpu.step(step, lr);
    on_gpu.step(step, lr);
    ref.step(twin, cfg, 0.0, step, lr);
    expect_same_state(gpu, cpu);
    expect_same_state(gpu, twin, ref);
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

// The first micro-batch of a step writes its parameter gradients (nn::GradStore::overwrite)
// instead of adding them to zeros: losses, every parameter gradient and the weights after AdamW
// must be bit-identical to the slow twin (set_overwrite_first_grads(false): zero everything,
// every micro-batch adds), over steps with 1 and 3 micro-batches, GPT-2 (tied wte, biases,
// GELU) and LLaMA (RMSNorm, SwiGLU, RoPE, untied head), fp32 and bf16, with recompute and
// classifier chunks, on the CPU and (skipped without a GPU) on CUDA. Gradients that must be
// overwritten are poisoned with NaN first, so an op that adds instead of writing shows.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "core/rng.h"
#include "models/transformer.h"
#include "nn/adamw.h"
#include "small_models.h"
#include "tensor_test_util.h"

namespace ft::models {
namespace {

using test::same_bits;

constexpr int64_t kBatch = 2, kSeq = 32;

ModelConfig small(const std::string& preset_name) {
  return testing::small_model(preset_name, 64, 61, kSeq);
}

Tensor random_tokens(int64_t vocab, Rng& rng) {
  return testing::random_tokens(kBatch, kSeq, vocab, rng);
}

struct StepSetup {
  int64_t accum = 1;
  Recompute recompute = Recompute::none;
  int64_t classifier_chunk = 0;  // rows
  bool deferred = true;          // forward_train_deferred (the trainer's) or forward()
};

struct Trace {
  std::vector<double> losses;
  std::vector<Tensor> grads;  // the flat gradient buffer after each step's backward, on the CPU
  Tensor weights;             // the flat masters after the last update, on the CPU
  int64_t zeroed_bytes = 0;
};

Trace train(const ModelConfig& config, DType dtype, Device device, const StepSetup& s,
            bool overwrite) {
  Transformer model(config, dtype, {attention::Impl::naive, 0, 0}, device);
  model.set_overwrite_first_grads(overwrite);
  model.set_recompute(s.recompute);
  model.set_classifier_chunk(s.classifier_chunk);
  model.init_weights(5);
  Rng rng(11);
  const double scale = 1.0 / static_cast<double>(s.accum);
  const nn::AdamWConfig adamw;
  Trace trace;
  for (int64_t step = 1; step <= 3; ++step) {
    model.zero_grad();
    if (overwrite) {
      // What the first micro-batch must write: poisoned, unless zero_grad() zeroed it.
      for (Parameter& p : model.parameters()) {
        if (max_abs_diff(p.grad, Tensor::zeros(p.grad.shape(), p.grad.dtype(), device)) != 0.0)
          p.grad.fill(std::numeric_limits<double>::quiet_NaN());
      }
    }
    double loss = 0.0;
    for (int64_t micro = 0; micro < s.accum; ++micro) {
      const Tensor x = random_tokens(config.vocab_size, rng);
      const Tensor y = random_tokens(config.vocab_size, rng);
      if (s.deferred) {
        loss += Transformer::mean_loss_of(model.forward_train_deferred(x, y, scale));
      } else {
        loss += model.forward(x, y);
      }
      model.backward(scale);
    }
    trace.losses.push_back(loss);
    trace.grads.push_back(model.flat_grads().to(Device::cpu));
    for (Parameter& p : model.parameters()) {
      if (!p.m.defined()) p.m = Tensor::zeros(p.shape(), p.master_dtype(), device);
      if (!p.v.defined()) p.v = Tensor::zeros(p.shape(), p.master_dtype(), device);
      Tensor master = p.master_weights();
      nn::adamw_update(master, p.grad, p.m, p.v, 1e-2, adamw, step, 1.0, p.decay);
      p.set_master_weights(master);
    }
  }
  trace.weights = model.master_range(0, model.flat_grads().numel(), Device::cpu);
  trace.zeroed_bytes = model.zeroed_grad_bytes();
  return trace;
}

bool device_ready(Device device) {
  return device == Device::cpu || cuda_device_count() > 0;
}

// {preset, dtype, device}
class GradOverwrite
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(GradOverwrite, GivesTheLossesGradientsAndWeightsOfZeroingBitForBit) {
  const auto& [name, dtype_str, device_str] = GetParam();
  const Device device = device_str == "cuda" ? Device::cuda : Device::cpu;
  if (!device_ready(device)) GTEST_SKIP() << "no GPU";
  const ModelConfig config = small(name);
  const DType dtype = parse_dtype(dtype_str);
  const std::vector<StepSetup> setups = {
      {1, Recompute::none, 0, true},  {3, Recompute::none, 0, true},
      {3, Recompute::block, 0, true}, {3, Recompute::elementwise, 0, false},
      {2, Recompute::none, 32, true}, {2, Recompute::none, 32, false},
  };
  for (const StepSetup& s : setups) {
    const std::string what = name + " " + dtype_str + " " + device_str + " accum " +
                             std::to_string(s.accum) + " recompute " + recompute_name(s.recompute) +
                             " chunk " + std::to_string(s.classifier_chunk) +
                             (s.deferred ? " forward_train" : " forward");
    const Trace reference = train(config, dtype, device, s, false);
    const Trace fast = train(config, dtype, device, s, true);
    EXPECT_EQ(fast.losses, reference.losses) << what;
    for (size_t i = 0; i < reference.grads.size(); ++i) {
      // Not trivially equal: the gradients carry signal.
      ASSERT_GT(max_abs_diff(reference.grads[i],
                             Tensor::zeros(reference.grads[i].shape(), reference.grads[i].dtype())),
                0.0);
      EXPECT_TRUE(same_bits(fast.grads[i], reference.grads[i])) << what << ", step " << i + 1;
    }
    EXPECT_TRUE(same_bits(fast.weights, reference.weights)) << what;
    // Only the embedding's scatter targets are zeroed: wpe (GPT-2, its wte being the tied head,
    // written by the classifier first) or wte (LLaMA).
    EXPECT_EQ(reference.zeroed_bytes, reference.grads[0].nbytes()) << what;
    const int64_t C = config.n_embd, fp32 = 4;
    const int64_t scatter_rows =
        config.tied_embeddings() ? config.max_seq_len : config.padded_vocab_size;
    EXPECT_EQ(fast.zeroed_bytes, scatter_rows * C * fp32) << what;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GradOverwrite,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama3-tiny"),
                                            ::testing::Values("f32", "bf16"),
                                            ::testing::Values("cpu", "cuda")),
                         [](const auto& param_info) {
                           std::string n = std::get<0>(param_info.param) + "_" +
                                           std::get<1>(param_info.param) + "_" +
                                           std::get<2>(param_info.param);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace ft::models

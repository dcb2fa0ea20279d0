// The layers hand attention the QKV projection's output as it is where it can
// (AttentionSettings::qkv_in_place, attention::forward_packed): training then gives the losses
// and gradients of the split path bit for bit (GPT-2 on the CPU, fp32 and bf16, naive and
// flash, with documents and padding, with a window; LLaMA with RoPE turned in place on the
// buffer), and keeps the fused buffer instead of q, k, v.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/rng.h"
#include "models/transformer.h"
#include "small_models.h"
#include "tensor_test_util.h"

namespace ft::models {
namespace {

using test::same_bits;
using testing::Trace;

constexpr int64_t kBatch = 2, kSeq = 16;

ModelConfig small(const std::string& preset_name) {
  return testing::small_model(preset_name, 32, 37, kSeq);
}

Tensor random_tokens(int64_t vocab, Rng& rng) {
  return testing::random_tokens(kBatch, kSeq, vocab, rng);
}

// Row 0: documents of 5, 7 and 4 positions; row 1: two documents and three padding positions.
Tensor segment_ids() {
  return testing::two_rows_of_documents();
}

// Three steps of two micro-batches with plain SGD between them, so that later steps see other
// weights.
Trace train_steps(const ModelConfig& config, DType dtype, AttentionSettings settings,
                  bool segments) {
  Transformer model(config, dtype, settings);
  model.init_weights(17);
  Rng rng(29);
  const Tensor ids = segments ? segment_ids() : Tensor();
  Trace trace;
  for (int64_t step = 1; step <= 3; ++step) {
    model.zero_grad();
    double loss = 0.0;
    for (int micro = 0; micro < 2; ++micro) {
      const Tensor x = random_tokens(config.vocab_size, rng);
      const Tensor y = random_tokens(config.vocab_size, rng);
      loss += model.forward_train(x, y, 0.5, ids);
      model.backward(0.5);
    }
    trace.losses.push_back(loss);
    trace.grads.push_back(model.flat_grads().clone());
    for (Parameter& p : model.parameters()) {
      const Tensor g = p.grad.to(DType::f64), w = p.master_weights().to(DType::f64);
      Tensor updated = Tensor::empty(w.shape(), DType::f64);
      for (int64_t i = 0; i < w.numel(); ++i)
        updated.data<double>()[i] = w.data<double>()[i] - 0.05 * g.data<double>()[i];
      p.set_master_weights(updated);
    }
  }
  return trace;
}

TEST(PackedQkv, TrainsTheSplitPathsLossesAndGradientsBitForBit) {
  for (const char* name : {"gpt2-tiny", "llama3-tiny"}) {
    const ModelConfig config = small(name);
    for (const char* dtype_name : {"fp32", "bf16"}) {
      for (attention::Impl impl : {attention::Impl::naive, attention::Impl::flash}) {
        for (int64_t window : {int64_t{0}, int64_t{5}}) {
          for (bool segments : {false, true}) {
            AttentionSettings in_place{impl};
            in_place.window = window;
            AttentionSettings split = in_place;
            split.qkv_in_place = false;
            const DType dtype = parse_dtype(dtype_name);
            const Trace a = train_steps(config, dtype, in_place, segments);
            const Trace b = train_steps(config, dtype, split, segments);
            const std::string what = std::string(name) + " " + dtype_name + " " +
                                     attention::impl_name(impl) + " window " +
                                     std::to_string(window) + (segments ? " documents" : "");
            EXPECT_EQ(a.losses, b.losses) << what;
            for (size_t s = 0; s < a.grads.size(); ++s) {
              EXPECT_TRUE(same_bits(a.grads[s], b.grads[s]))
                  << what << " step " << s + 1 << ": gradients differ by up to "
                  << max_abs_diff(a.grads[s], b.grads[s]);
            }
          }
        }
      }
    }
  }
}

// The fused buffer is kept instead of q, k and v: the same bytes (Hq + 2 Hkv heads a position).
TEST(PackedQkv, KeepsTheFusedBufferInsteadOfQKV) {
  for (const char* name : {"gpt2-tiny", "llama3-tiny"}) {
    const ModelConfig config = small(name);
    AttentionSettings in_place{attention::Impl::flash};
    AttentionSettings split = in_place;
    split.qkv_in_place = false;
    Transformer a(config, DType::f32, in_place), b(config, DType::f32, split);
    a.init_weights(3);
    b.init_weights(3);
    Rng rng(5);
    const Tensor x = random_tokens(config.vocab_size, rng);
    const Tensor y = random_tokens(config.vocab_size, rng);
    EXPECT_EQ(a.forward(x, y), b.forward(x, y)) << name;
    EXPECT_EQ(a.saved_activation_bytes(), b.saved_activation_bytes()) << name;
  }
}

}  // namespace
}  // namespace ft::models

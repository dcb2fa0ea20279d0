// Activation recompute (Transformer::set_recompute): every mode gives the losses and parameter
// gradients of none bit for bit over training steps (CPU, fp32 and bf16, naive and flash, with
// document segment ids and with a sliding window), keeps exactly the bytes it promises (less
// than none, block least), and puts its recomputed forward in the profile's recompute row.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "models/step_profile.h"
#include "models/transformer.h"
#include "small_models.h"
#include "tensor_test_util.h"

namespace ft::models {
namespace {

using test::same_bits;
using testing::adamw_step;
using testing::Trace;

constexpr int64_t kBatch = 2, kSeq = 16;
constexpr Recompute kSavingModes[] = {Recompute::attention, Recompute::mlp, Recompute::block,
                                      Recompute::elementwise};

// Two layers of the preset, head dim 8 (LLaMA: two query heads per kv head).
ModelConfig small(const std::string& preset_name) {
  return testing::small_model(preset_name, 32, 37, kSeq);
}

Tensor random_tokens(int64_t vocab, Rng& rng) {
  return testing::random_tokens(kBatch, kSeq, vocab, rng);
}

// Documents of 5, 7 and 4 positions in row 0; row 1 two documents and three padding positions
// (id -1: fully masked rows, whose zero output must be recomputed as zero too).
Tensor segment_ids() {
  return testing::two_rows_of_documents();
}

struct Masking {
  const char* name;
  bool segments;
  int64_t window, global_every;
};
constexpr Masking kMaskings[] = {
    {"causal", false, 0, 0}, {"documents", true, 0, 0}, {"window", false, 5, 2}};

Trace train_steps(const ModelConfig& config, DType dtype, AttentionSettings settings,
                  Recompute mode, const Masking& masking) {
  settings.window = masking.window;
  settings.global_every = masking.global_every;
  Transformer model(config, dtype, settings);
  model.set_recompute(mode);
  model.init_weights(17);
  Rng rng(29);
  const Tensor ids = masking.segments ? segment_ids() : Tensor();
  Trace trace;
  for (int64_t step = 1; step <= 3; ++step) {
    model.zero_grad();
    // Two micro-batches: the second backward accumulates onto recomputed activations' grads.
    double loss = 0.0;
    for (int micro = 0; micro < 2; ++micro) {
      const Tensor x = random_tokens(config.vocab_size, rng);
      const Tensor y = random_tokens(config.vocab_size, rng);
      loss += model.forward(x, y, ids);
      model.backward(0.5);
    }
    trace.losses.push_back(loss);
    trace.grads.push_back(model.flat_grads().clone());
    adamw_step(model, step, 1e-2);
  }
  return trace;
}

// {preset, dtype, attention}
class RecomputeModes
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(RecomputeModes, GiveTheLossesAndGradientsOfNoneBitForBit) {
  const auto& [name, dtype_str, impl_str] = GetParam();
  const ModelConfig config = small(name);
  const DType dtype = parse_dtype(dtype_str);
  const AttentionSettings settings{attention::parse_impl(impl_str)};
  for (const Masking& masking : kMaskings) {
    const Trace none = train_steps(config, dtype, settings, Recompute::none, masking);
    // The run is not trivially equal: its gradients carry signal.
    ASSERT_GT(max_abs_diff(none.grads.front(),
                           Tensor::zeros(none.grads.front().shape(), none.grads.front().dtype())),
              0.0);
    for (Recompute mode : kSavingModes) {
      const Trace other = train_steps(config, dtype, settings, mode, masking);
      const std::string what =
          name + " " + dtype_str + " " + impl_str + " " + masking.name + " " + recompute_name(mode);
      EXPECT_EQ(other.losses, none.losses) << what;
      for (size_t s = 0; s < none.grads.size(); ++s) {
        EXPECT_TRUE(same_bits(other.grads[s], none.grads[s]))
            << what << " step " << s + 1 << ": gradients differ by up to "
            << max_abs_diff(other.grads[s], none.grads[s]);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, RecomputeModes,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama3-tiny"),
                                            ::testing::Values("fp32", "bf16"),
                                            ::testing::Values("naive", "flash")));

// What a forward keeps under `mode`: the layers' bytes and the attention's share.
struct Kept {
  int64_t layers = 0, attention = 0;
};

Kept kept_after_forward(const ModelConfig& config, DType dtype, attention::Impl impl,
                        Recompute mode, bool segments) {
  Transformer model(config, dtype, {impl});
  model.set_recompute(mode);
  model.init_weights(3);
  Rng rng(5);
  const Tensor x = random_tokens(config.vocab_size, rng);
  EXPECT_EQ(model.saved_activation_bytes(), 0);  // before any forward
  model.forward(x, x, segments ? segment_ids() : Tensor());
  return {model.saved_activation_bytes(), model.attention_saved_bytes()};
}

// Each mode keeps exactly what it says it does not drop: block the layers' inputs alone, mlp
// all but the F-wide tensors, attention all but q, k, v (naive: all but its whole output),
// elementwise all but the norms' outputs and row statistics and LLaMA's SwiGLU output.
TEST(RecomputeKeptBytes, AreWhatEachModeKeeps) {
  for (const std::string name : {"gpt2-tiny", "llama3-tiny"}) {
    const ModelConfig m = small(name);
    const int64_t L = m.n_layer, tokens = kBatch * kSeq, D = m.head_dim();
    for (DType dtype : {DType::f32, DType::bf16}) {
      const auto size = static_cast<int64_t>(dtype_size(dtype));
      const int64_t wide = m.mlp() == MlpKind::swiglu ? 3 : 2;  // fc, (gate,) activation
      const int64_t qkv = tokens * (m.n_head + 2 * m.n_kv_head) * D * size;
      const int64_t o = tokens * m.n_head * D * size;
      for (attention::Impl impl : {attention::Impl::naive, attention::Impl::flash}) {
        for (bool segments : {false, true}) {
          const std::string what = name + " " + dtype_name(dtype) + " " +
                                   attention::impl_name(impl) + (segments ? " documents" : "");
          const Kept none = kept_after_forward(m, dtype, impl, Recompute::none, segments);
          const Kept attn = kept_after_forward(m, dtype, impl, Recompute::attention, segments);
          const Kept mlp = kept_after_forward(m, dtype, impl, Recompute::mlp, segments);
          const Kept block = kept_after_forward(m, dtype, impl, Recompute::block, segments);
          const Kept elem = kept_after_forward(m, dtype, impl, Recompute::elementwise, segments);
          EXPECT_EQ(block.layers, L * tokens * m.n_embd * size) << what;
          // Two norms a layer: the output, and fp32 rstd (and mean: layernorm) per token.
          const int64_t stats = m.norm() == NormKind::layernorm ? 8 : 4;
          const int64_t swiglu = m.mlp() == MlpKind::swiglu ? tokens * m.ffn_hidden * size : 0;
          EXPECT_EQ(none.layers - elem.layers,
                    L * (2 * tokens * (m.n_embd * size + stats) + swiglu))
              << what;
          EXPECT_EQ(elem.attention, none.attention) << what;
          EXPECT_EQ(none.layers - mlp.layers, L * wide * tokens * m.ffn_hidden * size) << what;
          if (impl == attention::Impl::flash) {
            EXPECT_EQ(none.layers - attn.layers, L * qkv) << what;
            EXPECT_EQ(attn.attention, none.attention) << what;  // o and lse stay
          } else {
            EXPECT_EQ(none.layers - attn.layers, L * (qkv + o) + none.attention) << what;
            EXPECT_EQ(attn.attention, 0) << what;  // S x S probabilities and lse re-made
          }
          EXPECT_EQ(block.attention, 0) << what;
          EXPECT_EQ(mlp.attention, none.attention) << what;
          for (const Kept& k : {attn, mlp, elem}) {
            EXPECT_LT(k.layers, none.layers) << what;
            EXPECT_LT(block.layers, k.layers) << what;
          }
        }
      }
    }
  }
}

// The profile's rows of one training step of gpt2-tiny under `mode`.
std::vector<StepProfile::Row> profiled_rows(const std::string& name, Recompute mode) {
  const ModelConfig config = small(name);
  Transformer model(config, DType::f32, {attention::Impl::flash});
  model.set_recompute(mode);
  model.init_weights(1);
  StepProfile profile(Device::cpu);
  model.set_profile(&profile);
  Rng rng(2);
  const Tensor x = random_tokens(config.vocab_size, rng);
  profile.begin_step(1, true);
  model.forward(x, x);
  model.backward(1.0);
  profile.end_step();
  return profile.result().rows;
}

const StepProfile::Row* row_of(const std::vector<StepProfile::Row>& rows, OpFamily family) {
  for (const StepProfile::Row& r : rows)
    if (r.family == family) return &r;
  return nullptr;
}

// The recomputed forward is its own row, and the other rows stay what a step without
// recompute counts: under mlp the recompute row's work is the MLP's up projections once, a
// third of what the gemm mlp-up row counts (forward + backward); its byte-counted ops (LLaMA's
// SwiGLU) add no bytes to a FLOP row.
TEST(RecomputeProfile, HasItsOwnRowAndLeavesTheOthersAsWithout) {
  for (const std::string name : {"gpt2-tiny", "llama3-tiny"}) {
    const std::vector<StepProfile::Row> none = profiled_rows(name, Recompute::none);
    EXPECT_EQ(row_of(none, OpFamily::recompute), nullptr) << name;
    for (Recompute mode : kSavingModes) {
      const std::vector<StepProfile::Row> rows = profiled_rows(name, mode);
      const StepProfile::Row* recompute = row_of(rows, OpFamily::recompute);
      ASSERT_NE(recompute, nullptr) << name << " " << recompute_name(mode);
      EXPECT_GT(recompute->calls, 0);
      // The row counts FLOPs: elementwise recomputes no product, its bytes are not counted.
      if (mode == Recompute::elementwise) {
        EXPECT_EQ(recompute->work, 0.0) << name;
      } else {
        EXPECT_GT(recompute->work, 0.0) << name << " " << recompute_name(mode);
      }
      for (const StepProfile::Row& r : none) {
        const StepProfile::Row* same = row_of(rows, r.family);
        ASSERT_NE(same, nullptr) << op_family_info(r.family).name;
        EXPECT_EQ(same->calls, r.calls) << name << " " << op_family_info(r.family).name;
        EXPECT_EQ(same->work, r.work) << name << " " << op_family_info(r.family).name;
      }
      if (mode == Recompute::mlp) {
        EXPECT_EQ(recompute->work, row_of(rows, OpFamily::gemm_mlp_up)->work / 3) << name;
      }
    }
  }
}

TEST(Recompute, NamesParseAndABadOneIsRefusedWithTheChoices) {
  for (Recompute mode : {Recompute::none, Recompute::attention, Recompute::mlp, Recompute::block,
                         Recompute::elementwise})
    EXPECT_EQ(parse_recompute(recompute_name(mode)), mode);
  try {
    parse_recompute("everything");
    FAIL() << "parsed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "'everything' (allowed: none, attention, mlp, block, elementwise)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ft::models

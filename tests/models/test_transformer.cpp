// Whole-model checks: gradients against finite differences in fp64, the loss at
// initialisation, and fp32/bf16 agreement with the fp64 model.
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "models/config.h"
#include "models/transformer.h"

namespace ft::models {
namespace {

ModelConfig small(const std::string& preset_name) {
  ModelOverrides o;
  o.layers = 2;
  o.width = 32;
  o.heads = 4;
  o.vocab = 37;
  o.context = 8;
  if (preset_name == "llama3-tiny") o.kv_heads = 2;
  return apply_overrides(preset(preset_name), o);
}

Tensor random_tokens(int64_t B, int64_t T, int64_t vocab, Rng& rng) {
  Tensor t = Tensor::empty({B, T}, DType::i32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
  return t;
}

// Central finite differences on a few entries of every parameter, in fp64.
void check_model_gradients(const std::string& preset_name) {
  const ModelConfig config = small(preset_name);
  Transformer model(config, DType::f64, {attention::Impl::reference, 0, 0});
  model.init_weights(7);
  // Larger weights than the 0.02 init so every path carries signal the check can see.
  Rng rng(11);
  for (Parameter& p : model.parameters()) {
    Tensor noise = Tensor::empty(p.master.shape(), DType::f64);
    fill_normal(noise, rng, 0.0, 0.3);
    double* m = p.master.data<double>();
    const double* n = noise.data<double>();
    for (int64_t i = 0; i < p.master.numel(); ++i) m[i] += n[i];
  }
  const Tensor x = random_tokens(2, 5, config.vocab_size, rng);
  const Tensor y = random_tokens(2, 5, config.vocab_size, rng);
  model.zero_grad();
  model.forward(x, y);
  model.backward(1.0);

  const double h = 1e-5;
  int checked = 0;
  for (Parameter& p : model.parameters()) {
    double* w = p.master.data<double>();
    const double* g = p.grad.data<double>();
    const int64_t rows = p.master.ndim() == 2
                             ? std::min<int64_t>(p.master.dim(0), config.vocab_size)
                             : p.master.dim(0);
    const int64_t cols = p.master.numel() / p.master.dim(0);
    for (int k = 0; k < 4; ++k) {
      const int64_t i = static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(rows)) * cols +
                        static_cast<int64_t>(rng.next_u64() % static_cast<uint64_t>(cols));
      const double saved = w[i];
      w[i] = saved + h;
      const double up = model.forward(x, y);
      w[i] = saved - h;
      const double down = model.forward(x, y);
      w[i] = saved;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(g[i], numeric, 1e-7 + 1e-5 * std::fabs(numeric))
          << preset_name << " " << p.name << "[" << i << "]";
      ++checked;
    }
  }
  EXPECT_GT(checked, 40);
}

TEST(Transformer, Gpt2GradientsMatchFiniteDifferences) {
  check_model_gradients("gpt2-tiny");
}
TEST(Transformer, Llama3GradientsMatchFiniteDifferences) {
  check_model_gradients("llama3-tiny");
}

TEST(Transformer, LossAtInitialisationIsNearLnVocab) {
  for (const std::string name : {"gpt2-tiny", "llama3-tiny"}) {
    const ModelConfig config = preset(name);
    Transformer model(config, DType::f32, {});
    model.init_weights(1);
    Rng rng(3);
    const double loss = model.forward(random_tokens(2, 32, config.vocab_size, rng),
                                      random_tokens(2, 32, config.vocab_size, rng));
    EXPECT_NEAR(loss, std::log(static_cast<double>(config.vocab_size)), 0.15) << name;
  }
}

// fp32 and bf16 models compute the same loss and gradients as the fp64 model, within their
// precision: fp32 to 1e-5 relative, bf16 to a few bf16 ulps (2^-8 relative) per step. The
// GEMMs go through BLAS, whose kernel (processor, OPENBLAS_CORETYPE) orders the fp32 sums; an
// order changes an error of a few u = 2^-24 per term by a factor of order one, and these
// bounds sit far above it: under the Zen, Haswell, Sandybridge and Nehalem kernels fp32
// measured at most 7.6e-9 (loss) and 1.8e-7 (wte gradient), bf16 5.8e-6 and 5.2e-3.
TEST(Transformer, Fp32AndBf16AgreeWithFp64) {
  for (const std::string name : {"gpt2-tiny", "llama3-tiny"}) {
    const ModelConfig config = small(name);
    Rng rng(5);
    const Tensor x = random_tokens(2, 8, config.vocab_size, rng);
    const Tensor y = random_tokens(2, 8, config.vocab_size, rng);
    Transformer ref(config, DType::f64, {attention::Impl::reference, 0, 0});
    ref.init_weights(9);
    const double ref_loss = ref.forward(x, y);
    ref.backward(1.0);
    for (DType dtype : {DType::f32, DType::bf16}) {
      Transformer model(config, dtype, {attention::Impl::naive, 0, 0});
      model.init_weights(9);
      const double loss = model.forward(x, y);
      model.backward(1.0);
      const double tol = dtype == DType::f32 ? 1e-5 : 2e-2;
      EXPECT_NEAR(loss, ref_loss, tol * ref_loss) << name << " " << dtype_name(dtype);
      const Tensor& g = model.parameter("wte").grad;
      const Tensor& g_ref = ref.parameter("wte").grad;
      EXPECT_LT(relative_error(g, g_ref), dtype == DType::f32 ? 1e-4 : 5e-2)
          << name << " " << dtype_name(dtype);
    }
  }
}

TEST(Transformer, RejectsBadInput) {
  const ModelConfig config = small("gpt2-tiny");
  Transformer model(config, DType::f32, {});
  model.init_weights(1);
  Rng rng(1);
  EXPECT_THROW(model.forward(random_tokens(1, config.max_seq_len + 1, 10, rng),
                             random_tokens(1, config.max_seq_len + 1, 10, rng)),
               Error);
  EXPECT_THROW(Transformer(config, DType::i32, {}), Error);
  EXPECT_THROW(preset("gpt3"), Error);
  ModelOverrides bad;
  bad.heads = 5;  // 16 is not a multiple of 5
  EXPECT_THROW(apply_overrides(config, bad), Error);
  ModelOverrides scaled;
  scaled.rope_scaling = true;
  EXPECT_THROW(apply_overrides(config, scaled), Error);  // GPT-2 has no RoPE
  EXPECT_TRUE(apply_overrides(preset("llama3-tiny"), scaled).rope_scaling);
}

}  // namespace
}  // namespace ft::models

namespace ft::models {
namespace {

// The parameters are views into the flat buffers at aligned offsets, in order; a backward
// reports each gradient once, as soon as it is complete: the last layer's before the first's,
// a tied embedding (GPT-2's wte, also the head) last.
TEST(Transformer, FlatBuffersAndGradientsReportedOnceInBackwardOrder) {
  for (const std::string name : {"gpt2-tiny", "llama3-tiny"}) {
    const ModelConfig config = small(name);
    Transformer model(config, DType::bf16, {}, Device::cpu, 96);
    model.init_weights(3);
    const std::vector<Parameter>& params = model.parameters();
    EXPECT_EQ(model.flat_grads().numel() % 96, 0);
    // bf16: the fp32 masters split, the compute copy their high half.
    EXPECT_TRUE(model.split_masters());
    EXPECT_FALSE(model.flat_masters().defined());
    EXPECT_EQ(model.flat_master_lo().numel(), model.flat_grads().numel());
    EXPECT_EQ(model.flat_master_lo().dtype(), DType::i16);
    int64_t next = 0;
    for (const Parameter& p : params) {
      EXPECT_EQ(p.offset % 96, 0) << p.name;
      EXPECT_GE(p.offset, next) << p.name;
      next = p.offset + p.numel();
      EXPECT_EQ(p.grad.raw(), model.flat_grads().slice(p.offset, next).raw()) << p.name;
      EXPECT_FALSE(p.master.defined()) << p.name;
      EXPECT_EQ(p.master_lo.raw(), model.flat_master_lo().slice(p.offset, next).raw()) << p.name;
      EXPECT_EQ(p.compute.raw(), model.flat_compute().slice(p.offset, next).raw()) << p.name;
    }
    EXPECT_LE(next, model.flat_grads().numel());
    Rng rng(5);
    const Tensor x = random_tokens(2, 8, config.vocab_size, rng);
    const Tensor y = random_tokens(2, 8, config.vocab_size, rng);
    model.forward(x, y);
    std::vector<size_t> order;
    model.backward(1.0, [&](size_t i) { order.push_back(i); });
    ASSERT_EQ(order.size(), params.size()) << name;
    std::vector<int> seen(params.size(), 0);
    for (size_t i : order) ++seen[i];
    for (size_t i = 0; i < params.size(); ++i) EXPECT_EQ(seen[i], 1) << params[i].name;
    auto position = [&](const std::string& param) {
      for (size_t k = 0; k < order.size(); ++k)
        if (params[order[k]].name == param) return k;
      return order.size();
    };
    EXPECT_LT(position("h.1.attn.qkv.weight"), position("h.0.attn.qkv.weight")) << name;
    EXPECT_EQ(position("wte"), config.tied_embeddings() ? order.size() - 2 : order.size() - 1)
        << name;  // GPT-2: wte, then wpe
  }
}

}  // namespace
}  // namespace ft::models

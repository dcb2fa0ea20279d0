// Generation on the GPU: with the KV cache (nn::decode_attention's CUDA kernel, RoPE with an
// offset, the cache appends) it gives the tokens that recomputing the whole window gives, greedy
// in fp32, past the context and with documents, for GPT-2 and LLaMA-3 shapes with naive and
// flash attention; and the cached logits equal the recomputed ones at every step (1e-5).
// Skips itself without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "attention/cuda_test_util.h"
#include "core/rng.h"
#include "models/transformer.h"
#include "train/documents.h"
#include "train/generate.h"

namespace ft::train {
namespace {

// Head dim 32 (width 128 / 4 heads); context 32 so that 70 tokens restart the window twice.
models::ModelConfig small(const std::string& name) {
  models::ModelOverrides o;
  o.layers = 2;
  o.width = 128;
  o.heads = 4;
  o.vocab = 300;
  o.context = 32;
  if (name == "llama3-tiny") o.kv_heads = 2;
  return models::apply_overrides(models::preset(name), o);
}

// Weights far from GPT-2's small initialisation, so that greedy decoding wanders (drawn on the
// CPU, copied to the GPU).
void randomize(models::Transformer& model, uint64_t seed) {
  Rng rng(seed);
  for (models::Parameter& p : model.parameters()) {
    Tensor host = Tensor::empty(p.shape(), p.master_dtype());
    const bool norm = p.name.find("norm") != std::string::npos;
    fill_normal(host, rng, norm ? 1.0 : 0.0, norm ? 0.1 : 0.3);
    p.set_master_weights(host);
  }
}

using Params = std::tuple<std::string, std::string>;  // model, attention
class CudaGenerate : public ::testing::TestWithParam<Params> {
 protected:
  void SetUp() override {
    const std::string why = attention::testing::gpu_unavailable();
    if (!why.empty()) GTEST_SKIP() << why;
  }
  std::unique_ptr<models::Transformer> make_model() const {
    models::AttentionSettings att;
    att.impl = attention::parse_impl(std::get<1>(GetParam()));
    auto model = std::make_unique<models::Transformer>(small(std::get<0>(GetParam())), DType::f32,
                                                       att, Device::cuda);
    randomize(*model, 21);
    return model;
  }
};

TEST_P(CudaGenerate, KvCacheGreedyFp32GivesTheRecomputedTokens) {
  const auto owned = make_model();
  models::Transformer& model = *owned;
  const std::vector<int32_t> prompt = {5, 17, 3, 250, 8};
  for (const std::optional<int32_t> eot : {std::optional<int32_t>(), std::optional<int32_t>(17)}) {
    GenerateOptions o;
    o.temperature = 0;
    o.tokens = 70;
    o.doc_eot = eot;
    o.kv_cache = false;
    const std::vector<int32_t> recomputed = generate_tokens(model, prompt, o);
    o.kv_cache = true;
    const std::vector<int32_t> cached = generate_tokens(model, prompt, o);
    ASSERT_EQ(cached.size(), 70u);
    EXPECT_EQ(cached, recomputed) << (eot ? "with documents" : "");
    EXPECT_GE(std::set<int32_t>(cached.begin(), cached.end()).size(), 5u) << "a trivial sequence";
  }
}

TEST_P(CudaGenerate, CachedLogitsMatchRecomputedAtEveryStep) {
  const auto owned = make_model();
  models::Transformer& model = *owned;
  const models::ModelConfig& mc = model.config();
  Rng rng(3);
  std::vector<int32_t> ids(static_cast<size_t>(mc.max_seq_len));
  for (auto& id : ids) id = static_cast<int32_t>(rng.next_u64() % 300);
  ids[4] = ids[20] = 17;  // documents
  auto window = [&](int64_t from, int64_t to) {
    Tensor t = Tensor::empty({1, to - from}, DType::i32);
    for (int64_t i = from; i < to; ++i) t.data<int32_t>()[i - from] = ids[static_cast<size_t>(i)];
    return t;
  };
  models::KvCache cache = model.make_kv_cache();
  const int64_t prompt = 6;
  for (int64_t end = prompt; end <= mc.max_seq_len; ++end) {
    const Tensor all = window(0, end);
    const Tensor segments = document_segment_ids(all, 17);
    model.forward_logits(all, segments);
    const Tensor want = model.logits().to(Device::cpu).slice(end - 1, end).clone();
    const int64_t from = end == prompt ? 0 : end - 1;
    Tensor chunk_segments = Tensor::empty({1, end - from}, DType::i32);
    for (int64_t i = from; i < end; ++i)
      chunk_segments.data<int32_t>()[i - from] = segments.data<int32_t>()[i];
    model.forward_cached(window(from, end), cache, chunk_segments);
    const Tensor got = model.logits().to(Device::cpu);
    ASSERT_EQ(got.numel(), want.numel());
    EXPECT_TRUE(all_finite(got)) << "position " << end - 1;
    EXPECT_LT(relative_error(got, want), 1e-5) << "position " << end - 1;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaGenerate,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama3-tiny"),
                                            ::testing::Values("naive", "flash")),
                         [](const ::testing::TestParamInfo<Params>& p) {
                           return std::string(std::get<0>(p.param) == "gpt2-tiny" ? "gpt2"
                                                                                  : "llama3") +
                                  "_" + std::get<1>(p.param);
                         });

}  // namespace
}  // namespace ft::train

// Generation with the KV cache chooses the tokens that recomputing the whole window chooses:
// greedy in fp32 (the bar), and sampled (temperature, top-k) in fp64 where nothing rounds
// differently; past the context (both paths restart the window the same way) and with
// documents. The options behave as documented.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "models/transformer.h"
#include "train/generate.h"

namespace ft::train {
namespace {

models::ModelConfig small(const std::string& name, int64_t context = 32) {
  models::ModelOverrides o;
  o.layers = 2;
  o.width = 64;
  o.heads = 4;
  o.vocab = 300;
  o.context = context;
  if (name == "llama3-tiny") o.kv_heads = 2;
  return models::apply_overrides(models::preset(name), o);
}

// Weights far from GPT-2's small initialisation, so that greedy decoding does not settle on one
// token and every step of the comparison is a different one.
void randomize(models::Transformer& model, uint64_t seed) {
  Rng rng(seed);
  for (models::Parameter& p : model.parameters()) {
    Tensor host = Tensor::empty(p.shape(), p.master_dtype());
    const bool norm = p.name.find("norm") != std::string::npos;
    fill_normal(host, rng, norm ? 1.0 : 0.0, norm ? 0.1 : 0.3);
    p.set_master_weights(host);
  }
}

std::vector<int32_t> run(models::Transformer& model, const GenerateOptions& o,
                         const std::vector<int32_t>& prompt = {5, 17, 3, 250, 8}) {
  return generate_tokens(model, prompt, o);
}

class GenerateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerateTest, KvCacheGreedyFp32GivesTheRecomputedTokens) {
  models::Transformer model(small(GetParam()), DType::f32, {});
  randomize(model, 3);
  GenerateOptions o;
  o.temperature = 0;
  o.tokens = 70;  // past the context of 32: the window restarts twice
  o.kv_cache = false;
  const std::vector<int32_t> recomputed = run(model, o);
  o.kv_cache = true;
  const std::vector<int32_t> cached = run(model, o);
  ASSERT_EQ(cached.size(), 70u);
  EXPECT_EQ(cached, recomputed);
  // Not a trivial sequence: the comparison sees many different steps.
  EXPECT_GE(std::set<int32_t>(cached.begin(), cached.end()).size(), 5u);
  // Documents: id 17 separates them (two in the prompt's reach, more as generated).
  o.doc_eot = 17;
  o.kv_cache = false;
  const std::vector<int32_t> docs_recomputed = run(model, o);
  o.kv_cache = true;
  EXPECT_EQ(run(model, o), docs_recomputed);
}

TEST_P(GenerateTest, KvCacheSampledFp64GivesTheRecomputedTokens) {
  models::Transformer model(small(GetParam()), DType::f64, {});
  randomize(model, 4);
  for (int64_t top_k : {0, 20}) {
    GenerateOptions o;
    o.temperature = 0.8;
    o.top_k = top_k;
    o.tokens = 50;
    o.seed = 99;
    o.kv_cache = false;
    const std::vector<int32_t> recomputed = run(model, o);
    o.kv_cache = true;
    EXPECT_EQ(run(model, o), recomputed) << "top-k " << top_k;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GenerateTest, ::testing::Values("gpt2-tiny", "llama3-tiny"));

TEST(Generate, OptionsDoWhatTheySay) {
  models::Transformer model(small("llama3-tiny"), DType::f32, {});
  model.init_weights(5);
  GenerateOptions o;
  o.tokens = 30;
  o.temperature = 0;
  const std::vector<int32_t> greedy = run(model, o);
  o.seed = 12345;
  EXPECT_EQ(run(model, o), greedy) << "greedy does not depend on the seed";
  o.temperature = 1.0;
  o.top_k = 1;
  EXPECT_EQ(run(model, o), greedy) << "top-1 sampling is greedy";
  o.top_k = 0;
  const std::vector<int32_t> sampled = run(model, o);
  EXPECT_NE(sampled, greedy);
  EXPECT_EQ(run(model, o), sampled) << "one seed, one sample";
  o.seed = 12346;
  EXPECT_NE(run(model, o), sampled);
  // Top-k keeps every token among the k most likely (a flat model: near-uniform logits).
  o.top_k = 3;
  o.tokens = 1;
  std::vector<int32_t> seen;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    o.seed = seed;
    seen.push_back(run(model, o).front());
  }
  std::sort(seen.begin(), seen.end());
  seen.erase(std::unique(seen.begin(), seen.end()), seen.end());
  EXPECT_LE(seen.size(), 3u);
  EXPECT_GE(seen.size(), 2u);
  int called = 0;
  o.tokens = 4;
  generate_tokens(model, {1}, o, [&](int32_t) { ++called; });
  EXPECT_EQ(called, 4);

  auto expect_error = [&](const GenerateOptions& bad, const std::vector<int32_t>& prompt,
                          const std::string& part) {
    try {
      generate_tokens(model, prompt, bad);
      ADD_FAILURE() << "no error; expected '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  GenerateOptions bad;
  expect_error(bad, {}, "prompt is empty");
  expect_error(bad, {1, 300}, "outside the model's vocabulary [0, 300)");
  bad.temperature = -1;
  expect_error(bad, {1}, "temperature");
  bad.temperature = 1;
  bad.top_k = -2;
  expect_error(bad, {1}, "top-k");
}

TEST(Generate, WindowRestartsAtTheNewestHalfOfTheContext) {
  EXPECT_EQ(generation_window_start(10, 0, 32), 0);
  EXPECT_EQ(generation_window_start(32, 0, 32), 0);
  EXPECT_EQ(generation_window_start(33, 0, 32), 17);  // keeps 16 tokens
  EXPECT_EQ(generation_window_start(48, 17, 32), 17);
  EXPECT_EQ(generation_window_start(50, 17, 32), 34);
  EXPECT_EQ(generation_window_start(100, 0, 32), 84);  // a prompt longer than the context
  EXPECT_EQ(generation_window_start(5, 3, 1), 4);      // context 1 keeps one token
}

}  // namespace
}  // namespace ft::train

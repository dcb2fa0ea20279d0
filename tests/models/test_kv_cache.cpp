// Transformer::forward_cached (generation with a KV cache) gives the logits that recomputing the
// whole sequence gives, at every step: GPT-2 (learned positions) and LLaMA-3 (RoPE with the
// position offset, GQA), naive and flash attention for the prompt, plain, windowed with a full
// layer, and with documents; fp64 to 1e-10, fp32 to 1e-5 (relative, per step).
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "core/rng.h"
#include "models/transformer.h"

namespace ft::models {
namespace {

ModelConfig small(const std::string& name) {
  ModelOverrides o;
  o.layers = 3;
  o.width = 64;
  o.heads = 4;
  o.vocab = 500;
  o.context = 48;
  if (name == "llama3-tiny") o.kv_heads = 2;
  return apply_overrides(preset(name), o);
}

constexpr int32_t kEot = 7;  // the document separator of the tests with documents

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  Rng rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& id : t) id = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
  // A few document boundaries, in the prompt and after it.
  for (size_t at : {3u, 9u, 22u, 23u, 35u}) t[at] = kEot;
  return t;
}

Tensor as_tensor(const std::vector<int32_t>& ids, int64_t from, int64_t to) {
  Tensor t = Tensor::empty({1, to - from}, DType::i32);
  for (int64_t i = from; i < to; ++i) t.data<int32_t>()[i - from] = ids[static_cast<size_t>(i)];
  return t;
}

// Segment ids as train/documents.h makes them: a new segment at each eot after position 0.
Tensor segments_of(const std::vector<int32_t>& ids, int64_t from, int64_t to) {
  Tensor s = Tensor::empty({1, to - from}, DType::i32);
  int32_t id = 0;
  for (int64_t i = from; i < to; ++i) {
    if (ids[static_cast<size_t>(i)] == kEot && i > 0) ++id;
    s.data<int32_t>()[i - from] = id;
  }
  return s;
}

// {model, attention, window, documents}
using Params = std::tuple<std::string, std::string, int64_t, bool>;
class KvCacheTest : public ::testing::TestWithParam<Params> {};

void expect_cached_equals_recomputed(const Params& params, DType dtype, double tol) {
  const auto& [name, impl, window, documents] = params;
  const ModelConfig mc = small(name);
  AttentionSettings att;
  att.impl = attention::parse_impl(impl);
  att.window = window;
  att.global_every = window > 0 ? 3 : 0;  // the third layer attends fully
  Transformer model(mc, dtype, att);
  model.init_weights(11);
  const int64_t n = mc.max_seq_len, prompt = 6;
  const std::vector<int32_t> ids = random_tokens(n, mc.vocab_size, 5);
  KvCache cache = model.make_kv_cache();
  for (int64_t end = prompt; end <= n; ++end) {
    // Recomputed: the whole sequence so far; its last row.
    const Tensor all = as_tensor(ids, 0, end);
    model.forward_logits(all, documents ? segments_of(ids, 0, end) : Tensor());
    const Tensor want = model.logits().slice(end - 1, end).clone().view({1, mc.padded_vocab_size});
    // Cached: the prompt in one chunk, then one token at a time.
    const int64_t from = end == prompt ? 0 : end - 1;
    const Tensor segments_all = segments_of(ids, 0, end);
    Tensor segments;
    if (documents) {
      segments = Tensor::empty({1, end - from}, DType::i32);
      for (int64_t i = from; i < end; ++i)
        segments.data<int32_t>()[i - from] = segments_all.data<int32_t>()[i];
    }
    model.forward_cached(as_tensor(ids, from, end), cache, segments);
    ASSERT_EQ(cache.length, end);
    const Tensor got = model.logits();
    ASSERT_EQ(got.shape(), want.shape());
    const double err = relative_error(got.to(DType::f64), want.to(DType::f64));
    EXPECT_LT(err, tol) << name << " " << impl << " window " << window << " documents " << documents
                        << " " << dtype_name(dtype) << " position " << end - 1;
  }
}

TEST_P(KvCacheTest, LogitsMatchRecomputingInFp64) {
  expect_cached_equals_recomputed(GetParam(), DType::f64, 1e-10);
}

TEST_P(KvCacheTest, LogitsMatchRecomputingInFp32) {
  expect_cached_equals_recomputed(GetParam(), DType::f32, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Models, KvCacheTest,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama3-tiny"),
                                            ::testing::Values("naive", "flash"),
                                            ::testing::Values(0, 8), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<Params>& p) {
                           return std::string(std::get<0>(p.param) == "gpt2-tiny" ? "gpt2"
                                                                                  : "llama3") +
                                  "_" + std::get<1>(p.param) + "_w" +
                                  std::to_string(std::get<2>(p.param)) +
                                  (std::get<3>(p.param) ? "_docs" : "");
                         });

TEST(KvCache, MisuseIsAnError) {
  const ModelConfig mc = small("llama3-tiny");
  Transformer model(mc, DType::f32, {});
  model.init_weights(1);
  KvCache cache = model.make_kv_cache(8);
  const std::vector<int32_t> ids = random_tokens(mc.max_seq_len, mc.vocab_size, 2);
  auto expect_error = [](const std::function<void()>& f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "no error; expected '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error([&] { model.forward_cached(as_tensor(ids, 0, 9), cache); }, "capacity 8");
  model.forward_cached(as_tensor(ids, 0, 5), cache);
  expect_error([&] { model.forward_cached(as_tensor(ids, 5, 7), cache); }, "one token per call");
  expect_error([&] { model.backward(); }, "backward() needs a forward() with targets");
  expect_error([&] { model.make_kv_cache(mc.max_seq_len + 1); }, "capacity");
  KvCache other = Transformer(small("gpt2-tiny"), DType::f32, {}).make_kv_cache();
  other.k.pop_back();
  expect_error([&] { model.forward_cached(as_tensor(ids, 0, 2), other); }, "layers");
}

}  // namespace
}  // namespace ft::models

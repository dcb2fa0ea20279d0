// Document segment ids (`train --doc-mask`): the derivation from end-of-text tokens, and that a
// model given them keeps each document's logits independent of the documents before it in the
// row, in every layer, with or without a sliding window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "models/config.h"
#include "models/transformer.h"
#include "test_util.h"
#include "train/documents.h"
#include "train/tokenizer.h"

namespace ft::train {
namespace {

constexpr int32_t E = 9;  // the end-of-text id in the derivation tests

Tensor batch(const std::vector<std::vector<int32_t>>& rows) {
  const int64_t B = static_cast<int64_t>(rows.size()), T = static_cast<int64_t>(rows[0].size());
  Tensor t = Tensor::empty({B, T}, DType::i32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < T; ++i) t.data<int32_t>()[b * T + i] = rows[b][static_cast<size_t>(i)];
  return t;
}

std::vector<int32_t> row_ids(const std::vector<int32_t>& tokens) {
  const Tensor s = document_segment_ids(batch({tokens}), E);
  return {s.data<int32_t>(), s.data<int32_t>() + s.numel()};
}

using Ids = std::vector<int32_t>;

TEST(DocumentSegmentIds, NewSegmentAtEachEndOfText) {
  EXPECT_EQ(row_ids({1, 2, 3, 4}), Ids({0, 0, 0, 0}));        // none: one document
  EXPECT_EQ(row_ids({E, 1, 2, 3}), Ids({0, 0, 0, 0}));        // at the start: opens segment 0
  EXPECT_EQ(row_ids({1, 2, E, 3, 4}), Ids({0, 0, 1, 1, 1}));  // middle: EOT opens the next
  EXPECT_EQ(row_ids({1, 2, 3, E}), Ids({0, 0, 0, 1}));        // at the end: a one-token doc
  EXPECT_EQ(row_ids({1, E, E, 2}), Ids({0, 1, 2, 2}));        // consecutive: each opens one
  EXPECT_EQ(row_ids({E, E, 1, E}), Ids({0, 1, 1, 2}));        // start, consecutive and end
  EXPECT_EQ(row_ids({E}), Ids({0}));
}

TEST(DocumentSegmentIds, RowsAreIndependentAndNeverPadding) {
  const Tensor s = document_segment_ids(batch({{1, E, 2, E, 3}, {4, 5, 6, E, 7}}), E);
  ASSERT_EQ(s.shape(), Shape({2, 5}));
  EXPECT_EQ(s.dtype(), DType::i32);
  const Ids ids(s.data<int32_t>(), s.data<int32_t>() + s.numel());
  EXPECT_EQ(ids, Ids({0, 1, 1, 2, 2, 0, 0, 0, 1, 1}));
}

TEST(DocumentSegmentIds, RejectsWhatIsNotInt32Tokens) {
  EXPECT_THROW(document_segment_ids(Tensor::zeros({2, 4}, DType::f32), E), Error);
  EXPECT_THROW(document_segment_ids(Tensor::zeros({8}, DType::i32), E), Error);
}

// --- the model: a document's logits must not see the previous document of its row ---

int32_t gpt2_eot() {
  return Tokenizer(test::source_path("data/gpt2_tokenizer.bin")).eot_token();
}

models::ModelConfig small(const std::string& preset_name) {
  models::ModelOverrides o;
  o.layers = 2;
  o.width = 32;
  o.heads = 4;
  o.context = 16;
  if (preset_name == "llama3-tiny") o.kv_heads = 2;
  return models::apply_overrides(models::preset(preset_name), o);  // GPT-2's vocabulary
}

constexpr int64_t kT = 16, kEotAt = 6;  // rows of kT tokens; the second document starts at 6

// Two rows of random tokens with the end-of-text token at kEotAt; `seed` draws the tokens
// before it (the first document), the rest stay fixed.
Tensor two_documents(uint64_t seed, int32_t eot, int64_t vocab) {
  Rng first(seed), rest(99);
  // Ids below the end-of-text id, so that only position kEotAt starts a document.
  const uint64_t ids = static_cast<uint64_t>(std::min<int64_t>(vocab, eot));
  Tensor t = Tensor::empty({2, kT}, DType::i32);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < kT; ++i) {
      Rng& rng = i < kEotAt ? first : rest;
      t.data<int32_t>()[b * kT + i] =
          i == kEotAt ? eot : static_cast<int32_t>(rng.next_u64() % ids);
    }
  }
  return t;
}

// Largest |difference| between the two models' logits over positions [begin, end) of each row.
double max_logit_diff(const Tensor& a, const Tensor& b, int64_t begin, int64_t end, int64_t V) {
  const int64_t Vp = a.dim(1);
  double worst = 0.0;
  for (int64_t r = 0; r < a.dim(0); ++r) {
    const int64_t pos = r % kT;
    if (pos < begin || pos >= end) continue;
    for (int64_t v = 0; v < V; ++v) {
      const double d =
          std::fabs(static_cast<double>(a.data<float>()[r * Vp + v]) - b.data<float>()[r * Vp + v]);
      worst = std::max(worst, d);
    }
  }
  return worst;
}

struct Logits {
  Tensor before_change, after_change;  // for two different first documents
};

Logits logits_for_two_first_documents(const std::string& preset_name,
                                      models::AttentionSettings settings, bool doc_mask) {
  const models::ModelConfig config = small(preset_name);
  const int32_t eot = gpt2_eot();
  models::Transformer model(config, DType::f32, settings);
  model.init_weights(5);
  Logits out;
  for (uint64_t seed : {1, 2}) {
    const Tensor tokens = two_documents(seed, eot, config.vocab_size);
    model.forward_logits(tokens, doc_mask ? document_segment_ids(tokens, eot) : Tensor());
    (seed == 1 ? out.before_change : out.after_change) = model.logits().to(Device::cpu);
  }
  return out;
}

TEST(DocMaskModel, SecondDocumentIgnoresTheFirst) {
  // Every layer gets the segment ids, including the full-attention layer of a windowed model
  // (global_every 2: layer 1 attends fully, layer 0 through a window of 4).
  for (const std::string name : {"gpt2-tiny", "llama3-tiny"}) {
    for (attention::Impl impl : {attention::Impl::naive, attention::Impl::flash}) {
      for (const models::AttentionSettings& s :
           {models::AttentionSettings{impl, 0, 0}, models::AttentionSettings{impl, 4, 2}}) {
        const std::string what =
            name + " " + attention::impl_name(impl) + " window " + std::to_string(s.window);
        const int64_t V = small(name).vocab_size;
        // Exactly equal: masked keys get probability 0 and the same sums run in the same order.
        const Logits masked = logits_for_two_first_documents(name, s, true);
        EXPECT_EQ(max_logit_diff(masked.before_change, masked.after_change, kEotAt, kT, V), 0.0)
            << what;
        // The first document's own logits did change: the test changed something.
        EXPECT_GT(max_logit_diff(masked.before_change, masked.after_change, 0, kEotAt, V), 1e-3)
            << what;
        const Logits unmasked = logits_for_two_first_documents(name, s, false);
        EXPECT_GT(max_logit_diff(unmasked.before_change, unmasked.after_change, kEotAt, kT, V),
                  1e-4)
            << what;
      }
    }
  }
}

// The window applies only to windowed layers and on top of the segments: with every layer
// global, or a window wider than the row, a windowed model equals the unwindowed one; a narrow
// window on windowed layers changes it.
TEST(DocMaskModel, ComposesWithWindowAndGlobalLayers) {
  const models::ModelConfig config = small("gpt2-tiny");
  const int32_t eot = gpt2_eot();
  const Tensor tokens = two_documents(3, eot, config.vocab_size);
  const Tensor segments = document_segment_ids(tokens, eot);
  for (attention::Impl impl : {attention::Impl::naive, attention::Impl::flash}) {
    auto logits = [&](int64_t window, int64_t global_every) {
      models::Transformer model(config, DType::f32, {impl, window, global_every});
      model.init_weights(5);
      model.forward_logits(tokens, segments);
      return model.logits().to(Device::cpu);
    };
    const Tensor full = logits(0, 0);
    const int64_t V = config.vocab_size;
    const char* name = attention::impl_name(impl);
    EXPECT_EQ(max_logit_diff(logits(3, 1), full, 0, kT, V), 0.0) << name;   // all layers global
    EXPECT_EQ(max_logit_diff(logits(kT, 0), full, 0, kT, V), 0.0) << name;  // window >= row
    EXPECT_GT(max_logit_diff(logits(3, 2), full, 0, kT, V), 1e-4) << name;  // layer 0 windowed
    EXPECT_GT(max_logit_diff(logits(3, 0), logits(3, 2), 0, kT, V), 1e-4) << name;
  }
}

}  // namespace
}  // namespace ft::train

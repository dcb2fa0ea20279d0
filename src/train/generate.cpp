#include "train/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"
#include "core/rng.h"
#include "nn/layers.h"
#include "train/documents.h"

namespace ft::train {
namespace {

// tokens[from, to) as an int32 [1, T] CPU tensor.
Tensor window_tensor(const std::vector<int32_t>& tokens, int64_t from, int64_t to) {
  Tensor t = Tensor::empty({1, to - from}, DType::i32);
  std::copy(tokens.begin() + from, tokens.begin() + to, t.data<int32_t>());
  return t;
}

// Picks the next id from one row of logits.
class Chooser {
 public:
  Chooser(const GenerateOptions& o, int64_t vocab) : o_(o), vocab_(vocab), rng_(o.seed) {}

  int32_t choose(const Tensor& logits, int64_t row) {
    // Greedy reads the softmax at temperature 1: its order is the logits' order.
    nn::softmax_row(probs_, logits, row, vocab_, o_.temperature > 0 ? o_.temperature : 1.0);
    if (o_.temperature == 0) {
      return static_cast<int32_t>(std::max_element(probs_.begin(), probs_.end()) - probs_.begin());
    }
    double total = 1.0;
    if (o_.top_k > 0 && o_.top_k < vocab_) {
      order_.resize(probs_.size());
      std::iota(order_.begin(), order_.end(), 0);
      std::nth_element(
          order_.begin(), order_.begin() + (o_.top_k - 1), order_.end(), [&](int32_t a, int32_t b) {
            return probs_[static_cast<size_t>(a)] > probs_[static_cast<size_t>(b)] ||
                   (probs_[static_cast<size_t>(a)] == probs_[static_cast<size_t>(b)] && a < b);
          });
      std::vector<float> kept(probs_.size(), 0.0f);
      total = 0.0;
      for (int64_t i = 0; i < o_.top_k; ++i) {
        const auto id = static_cast<size_t>(order_[static_cast<size_t>(i)]);
        kept[id] = probs_[id];
        total += probs_[id];
      }
      probs_.swap(kept);
    }
    const double u = rng_.uniform() * total;
    double cdf = 0.0;
    int32_t last_nonzero = 0;
    for (size_t v = 0; v < probs_.size(); ++v) {
      if (probs_[v] <= 0) continue;
      cdf += probs_[v];
      last_nonzero = static_cast<int32_t>(v);
      if (u < cdf) return static_cast<int32_t>(v);
    }
    return last_nonzero;  // rounding left u past the last sum
  }

 private:
  const GenerateOptions& o_;
  int64_t vocab_;
  Rng rng_;
  std::vector<float> probs_;
  std::vector<int32_t> order_;
};

}  // namespace

int64_t generation_window_start(int64_t n, int64_t start, int64_t context) {
  if (n - start <= context) return start;
  return n - std::max<int64_t>(1, context / 2);
}

std::vector<int32_t> generate_tokens(models::Transformer& model, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& o,
                                     const std::function<void(int32_t)>& on_token) {
  const models::ModelConfig& mc = model.config();
  FT_CHECK(!prompt.empty(), "generate: the prompt is empty (start from the end-of-text token)");
  FT_CHECK(o.tokens >= 0, "generate: tokens must be >= 0, got ", o.tokens);
  FT_CHECK(std::isfinite(o.temperature) && o.temperature >= 0,
           "generate: temperature must be a finite number >= 0 (0: greedy), got ", o.temperature);
  FT_CHECK(o.top_k >= 0, "generate: top-k must be >= 0 (0: all tokens), got ", o.top_k);
  for (size_t i = 0; i < prompt.size(); ++i) {
    FT_CHECK(prompt[i] >= 0 && prompt[i] < mc.vocab_size, "generate: prompt token ", i, " is id ",
             prompt[i], ", outside the model's vocabulary [0, ", mc.vocab_size, ")");
  }
  const int64_t context = mc.max_seq_len;
  std::vector<int32_t> all = prompt, generated;
  Chooser chooser(o, mc.vocab_size);
  models::KvCache cache;
  if (o.kv_cache) cache = model.make_kv_cache();
  int64_t start = 0;
  int32_t segment = 0;  // the newest cached position's segment id (--doc-mask)
  for (int64_t i = 0; i < o.tokens; ++i) {
    const auto n = static_cast<int64_t>(all.size());
    const int64_t new_start = generation_window_start(n, start, context);
    int32_t next = 0;
    if (!o.kv_cache) {
      start = new_start;
      const Tensor window = window_tensor(all, start, n);
      const Tensor segments = o.doc_eot ? document_segment_ids(window, *o.doc_eot) : Tensor();
      model.forward_logits(window, segments);
      next = chooser.choose(model.logits(), n - start - 1);
    } else if (cache.length == 0 || new_start != start) {
      // The first step, or the window moved on: encode the window from position 0.
      start = new_start;
      cache.clear();
      const Tensor window = window_tensor(all, start, n);
      Tensor segments;
      if (o.doc_eot) {
        segments = document_segment_ids(window, *o.doc_eot);
        segment = segments.data<int32_t>()[n - start - 1];
      }
      model.forward_cached(window, cache, segments);
      next = chooser.choose(model.logits(), 0);
    } else {
      // One new position: the newest token, after the cached ones.
      const Tensor token = window_tensor(all, n - 1, n);
      Tensor segments;
      if (o.doc_eot) {
        if (all.back() == *o.doc_eot) ++segment;
        segments = Tensor::empty({1, 1}, DType::i32);
        segments.data<int32_t>()[0] = segment;
      }
      model.forward_cached(token, cache, segments);
      next = chooser.choose(model.logits(), 0);
    }
    all.push_back(next);
    generated.push_back(next);
    if (on_token) on_token(next);
  }
  return generated;
}

}  // namespace ft::train

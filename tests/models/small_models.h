// Shared pieces of the model tests that train small models: the presets cut down to two layers,
// random tokens, a fixed document layout with padding, an AdamW step and a run's trace.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"
#include "models/transformer.h"
#include "nn/adamw.h"

namespace ft::models::testing {

// Two layers of the preset with four heads over `width` (LLaMA: two query heads per kv head), a
// vocabulary of `vocab` (padded as the preset pads it) and a context of `context` positions.
inline ModelConfig small_model(const std::string& preset_name, int64_t width, int64_t vocab,
                               int64_t context) {
  ModelOverrides o;
  o.layers = 2;
  o.width = width;
  o.heads = 4;
  o.vocab = vocab;
  o.context = context;
  if (preset_name == "llama3-tiny") o.kv_heads = 2;
  return apply_overrides(preset(preset_name), o);
}

// Tokens [batch, seq] drawn uniformly from [0, vocab).
inline Tensor random_tokens(int64_t batch, int64_t seq, int64_t vocab, Rng& rng) {
  Tensor t = Tensor::empty({batch, seq}, DType::i32);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(vocab));
  return t;
}

// Segment ids [2, 16]: row 0 documents of 5, 7 and 4 positions; row 1 two documents and three
// padding positions (id -1: rows that see no key).
inline Tensor two_rows_of_documents() {
  constexpr int64_t kSeq = 16;
  Tensor ids = Tensor::empty({2, kSeq}, DType::i32);
  int32_t* p = ids.data<int32_t>();
  for (int64_t t = 0; t < kSeq; ++t) {
    p[t] = t < 5 ? 0 : (t < 12 ? 1 : 2);
    p[kSeq + t] = t < 6 ? 3 : (t < 13 ? 4 : -1);
  }
  return ids;
}

// One AdamW update of every parameter at learning rate `lr` (moments allocated on the first
// step, where the gradients are).
inline void adamw_step(Transformer& m, int64_t step, double lr) {
  const nn::AdamWConfig cfg;
  for (Parameter& p : m.parameters()) {
    if (!p.m.defined()) p.m = Tensor::zeros(p.shape(), p.master_dtype(), p.grad.device());
    if (!p.v.defined()) p.v = Tensor::zeros(p.shape(), p.master_dtype(), p.grad.device());
    Tensor master = p.master_weights();
    nn::adamw_update(master, p.grad, p.m, p.v, lr, cfg, step, 1.0, p.decay);
    p.set_master_weights(master);
  }
}

// A training run's losses and, after each step's backward, the flat gradient buffer.
struct Trace {
  std::vector<double> losses;
  std::vector<Tensor> grads;
};

}  // namespace ft::models::testing

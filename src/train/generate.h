// Text generation from a model: greedy or sampled (temperature, top-k), with a KV cache (each
// step feeds one token through the model and attends over the cached keys and values) or by
// recomputing the whole window each step (the slow twin the cache is tested against: greedy
// fp32 gives the same tokens).
//
// Past the model's context both paths drop the oldest tokens the same way: once the window of
// tokens seen would exceed the context, it restarts at the newest half of the context (the
// cache re-encodes those tokens once, at positions from 0, then caches again), so the two paths
// see the same tokens at the same positions at every step.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "models/transformer.h"

namespace ft::train {

struct GenerateOptions {
  int64_t tokens = 64;       // new tokens to generate
  double temperature = 1.0;  // 0: greedy (the most likely token)
  int64_t top_k = 0;         // sample among the k most likely tokens (0: all)
  uint64_t seed = 1337;
  bool kv_cache = true;
  // Documents start at this token (--doc-mask): attention stays within the current one.
  std::optional<int32_t> doc_eot;
};

// Generates after `prompt` (ids in the model's vocabulary; at least one), calling on_token(id)
// as each new id is chosen. Returns the new ids.
std::vector<int32_t> generate_tokens(models::Transformer& model, const std::vector<int32_t>& prompt,
                                     const GenerateOptions& options,
                                     const std::function<void(int32_t)>& on_token = {});

// Where the window of tokens the model sees starts, for `n` tokens so far and the current start:
// unchanged while the window fits the context, else the newest context / 2 tokens (at least 1).
int64_t generation_window_start(int64_t n, int64_t start, int64_t context);

}  // namespace ft::train

// The sweep's problems: the timed ("hero") training shape with its two masks, the document
// segment ids, and the reduced problem every candidate is checked on before it is timed.
//
// Masks, in the order a run times them:
//   window   causal + sliding window W + segment ids of `documents` documents per row
//            (key "segments" when W = 0; left out when neither a window nor documents is set)
//   causal   causal alone: no window, no segment ids
// Documents: the boundaries of row b sit at k * S / documents + (b % 64), k = 1 .. documents-1,
// so rows do not share tile edges.
//
// The check problem (batch 3, seq 513) keeps the heads and head dim; 513 leaves every tile
// partial, the window becomes min(W, 513 / (2 * documents)) so that it really cuts, and each
// row ends in padding tokens (segment id -1) when the mask has segments.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "core/tensor.h"

namespace ft::sweep {

struct SweepShape {
  int64_t batch = 32, seq_len = 4096, q_heads = 16, kv_heads = 4, head_dim = 128;
  int64_t window = 512;   // 0: the first mask has no window
  int64_t documents = 5;  // per row; 0: no segment ids

  // Throws ft::Error naming the bad flag, its value and what is allowed.
  void validate() const;
  std::string describe() const;  // "B=32 S=4096 Hq=16 Hkv=4 D=128 bf16"
};

struct SweepMask {
  std::string key;  // "window" | "segments" | "causal"
  attention::Mask mask;
  int64_t documents = 0;  // 0: no segment ids

  std::string describe() const;  // "causal+window=512+segments (5 documents per row)"
};

// The masks a run times, in order (identical masks once).
std::vector<SweepMask> sweep_masks(const SweepShape& shape);

// The timed problem (bf16) and its segment ids (int32 [B, S] on the CPU, undefined without).
attention::Problem timed_problem(const SweepShape& shape, const SweepMask& mask);
Tensor document_ids(int64_t batch, int64_t seq_len, int64_t documents);

inline constexpr int64_t kCheckBatch = 3;
inline constexpr int64_t kCheckSeqLen = 513;

attention::Problem check_problem(const SweepShape& shape, const SweepMask& mask);
// document_ids() of the check problem, with the last 16 + 7 * b positions of row b padding.
Tensor check_segment_ids(int64_t documents);

}  // namespace ft::sweep

// Reads llm.c token shards: a 1024-byte header of 256 little-endian int32 (magic, version,
// token count, zeros) followed by the tokens, uint16 for magic 20240520 (version 1, GPT-2) or
// uint32 for magic 20240801 (version 7, LLaMA-3). A batch is B*T+1 consecutive tokens: inputs
// are the first B*T, targets the same window shifted by one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/rng.h"
#include "core/tensor.h"

namespace ft::train {

inline constexpr int32_t kShardMagicU16 = 20240520;
inline constexpr int32_t kShardVersionU16 = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;
inline constexpr int32_t kShardVersionU32 = 7;
inline constexpr int64_t kShardHeaderInts = 256;

// What a shard's header says, after checking it against the file's size.
struct ShardHeader {
  int64_t num_tokens = 0;
  int token_bytes = 2;  // 2 (uint16) or 4 (uint32)
};
// Throws ft::Error naming the file for a missing file, wrong magic or version, or a size that
// does not match the header's token count.
ShardHeader read_shard_header(const std::string& path);

// Where the loader is: enough to continue the exact batch sequence after a restart.
struct LoaderState {
  int64_t shard = 0;       // index into files()
  int64_t position = 0;    // index of the next batch in the current shard's batch order
  uint64_t rng_state = 0;  // shuffle: Rng state before the current shard's order was drawn
  int64_t epoch = 0;       // completed passes over all shards
};

class DataLoader {
 public:
  // pattern: a file path or a glob (matches sorted). shuffle=false reads batches in order from
  // the start (llm.c's convention); shuffle=true permutes the batch order of each shard on
  // every visit, deterministically from seed.
  DataLoader(const std::string& pattern, int64_t B, int64_t T, bool shuffle = false,
             uint64_t seed = 0);

  // Fills int32 [B, T] CPU tensors, allocating them if undefined.
  void next_batch(Tensor& inputs, Tensor& targets);
  // Moves past n batches without reading them, exactly as n next_batch calls would (data
  // parallelism: each rank skips the other ranks' batches).
  void skip(int64_t n);
  void reset();

  int64_t num_tokens() const;
  int64_t batches_per_epoch() const;
  // Throws naming the file, position and id of the first token >= vocab.
  void check_vocab(int64_t vocab) const;

  LoaderState state() const;
  void restore(const LoaderState& s);

  const std::vector<std::string>& files() const { return files_; }

 private:
  int64_t batches_in_shard(int64_t shard) const;
  void enter_shard(int64_t shard);  // loads the tokens and, with shuffle, draws the order
  void advance_shard();

  std::vector<std::string> files_;
  std::vector<ShardHeader> headers_;
  int64_t B_, T_;
  bool shuffle_;
  uint64_t seed_;

  LoaderState state_;
  Rng rng_;
  int64_t loaded_shard_ = -1;
  std::vector<uint8_t> tokens_;  // current shard's token bytes, as stored in the file
  std::vector<int64_t> order_;   // shuffle: batch order of the current shard
};

// Writes an llm.c token shard via a temporary file and a rename; uint32_tokens selects
// magic 20240801 / version 7, else 20240520 / version 1 (ids must then fit in uint16).
void write_token_shard(const std::string& path, const std::vector<uint32_t>& tokens,
                       bool uint32_tokens);

}  // namespace ft::train

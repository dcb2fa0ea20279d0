// The sweep's candidates: which kernel configurations a run compares, the fixed reference row,
// can_implement's verdict on each, and the shard of them one process runs.
//
// Candidate 0 is the base configuration (the device's default, whatever --backward-path says),
// so that every table answers "is the default the fastest correct one?". Then, per backward
// path, the forward axis (every forward tile, backward fixed at the base) and the backward axis
// (every backward tile x {128, 256} threads, forward fixed at the base): one axis varies at a
// time. A configuration already listed, or equal to the reference, is not repeated. Indices
// count this list, refused candidates included, so that shards partition it.
#pragma once

#include <string>
#include <vector>

#include "attention/kernel_config.h"

namespace ft::sweep {

enum class SweepAxis { forward, backward, both };
const char* axis_name(SweepAxis axis);  // "forward" | "backward" | "both"
SweepAxis parse_axis(const std::string& text);

// The fixed yardstick: forward 64x64/128, backward 64x64/128, the base's backward path.
attention::KernelConfig reference_config(const attention::KernelConfig& base);

struct Candidate {
  int index = -1;    // position in the candidate list; -1 for the reference
  std::string role;  // "ref" | "base" | "forward" | "backward"
  attention::KernelConfig config;
  std::string refused;  // can_implement's reason; "" when the candidate can run
};

Candidate reference_candidate(const attention::KernelConfig& base,
                              const attention::Problem& problem,
                              const attention::DeviceLimits& device);

std::vector<Candidate> make_candidates(SweepAxis axis,
                                       const std::vector<attention::BackwardPath>& paths,
                                       const attention::KernelConfig& base,
                                       const attention::Problem& problem,
                                       const attention::DeviceLimits& device);

// The candidates whose index % num_shards == shard. Throws ft::Error for a shard outside
// [0, num_shards).
std::vector<Candidate> select_shard(const std::vector<Candidate>& candidates, int shard,
                                    int num_shards);

}  // namespace ft::sweep

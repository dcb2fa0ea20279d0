#include "sweep/candidates.h"

#include <algorithm>

namespace ft::sweep {

using attention::BackwardPath;
using attention::ForwardPath;
using attention::KernelConfig;
using attention::TileConfig;

const char* axis_name(SweepAxis axis) {
  switch (axis) {
    case SweepAxis::forward:
      return "forward";
    case SweepAxis::backward:
      return "backward";
    case SweepAxis::both:
      return "both";
  }
  return "?";
}

SweepAxis parse_axis(const std::string& text) {
  if (text == "forward") return SweepAxis::forward;
  if (text == "backward") return SweepAxis::backward;
  if (text == "both") return SweepAxis::both;
  throw Error(str("--sweep '", text, "': allowed: forward, backward, both"));
}

KernelConfig reference_config(const KernelConfig& base) {
  KernelConfig ref;
  ref.forward = {64, 64, 128};
  ref.backward = {64, 64, 128};
  // The base's backward path, in its smallest tile; the tma backward has only its plans' tiles,
  // so a tma base is checked against the wgmma 64x64 (same hardware, simplest pipeline).
  ref.backward_path =
      base.backward_path == BackwardPath::tma ? BackwardPath::wgmma : base.backward_path;
  return ref;
}

Candidate reference_candidate(const KernelConfig& base, const attention::Problem& problem,
                              const attention::DeviceLimits& device) {
  Candidate c;
  c.config = reference_config(base);
  c.role = c.config == base ? "ref=base" : "ref";
  c.refused = attention::can_implement(c.config, problem, device);
  return c;
}

std::vector<Candidate> make_candidates(SweepAxis axis, const std::vector<BackwardPath>& paths,
                                       const KernelConfig& base, const attention::Problem& problem,
                                       const attention::DeviceLimits& device) {
  FT_CHECK(!paths.empty(), "make_candidates: no backward path given");
  const KernelConfig ref = reference_config(base);
  std::vector<Candidate> out;
  auto add = [&](const KernelConfig& config, const char* role) {
    if (config == ref) return;
    for (const Candidate& seen : out) {
      if (seen.config == config) return;
    }
    Candidate c;
    c.index = static_cast<int>(out.size());
    c.role = role;
    c.config = config;
    c.refused = attention::can_implement(config, problem, device);
    out.push_back(c);
  };
  add(base, "base");
  for (BackwardPath path : paths) {
    KernelConfig fixed = base;
    fixed.backward_path = path;
    // A path whose tiles do not include the base's backward tile (tma: the plans' tiles) times
    // the forward tiles with its first tile.
    const std::vector<TileConfig> path_tiles =
        attention::sweep_backward_tiles(path, problem.head_dim);
    if (!path_tiles.empty() &&
        std::find(path_tiles.begin(), path_tiles.end(), fixed.backward) == path_tiles.end()) {
      fixed.backward = path_tiles.front();
      fixed.backward_stages = 0;
    }
    if (axis != SweepAxis::backward) {
      for (ForwardPath forward_path : {ForwardPath::mma, ForwardPath::wgmma}) {
        for (const TileConfig& tile : attention::sweep_forward_tiles(forward_path)) {
          KernelConfig c = fixed;
          c.forward = tile;
          c.forward_path = forward_path;
          c.forward_stages = 0;
          c.forward_pingpong = false;
          add(c, c == base ? "base" : "forward");
        }
      }
      // The tma path's candidates are its plans for this head dim (tma_plans.h).
      for (const attention::TmaForwardPlan& plan : attention::sweep_tma_plans(problem.head_dim)) {
        const KernelConfig c = attention::with_tma_forward(fixed, plan);
        add(c, c == base ? "base" : "forward");
      }
    }
    if (axis != SweepAxis::forward) {
      if (path == BackwardPath::tma) {
        // The tma path's candidates are its plans (tile and ring depth) for this head dim.
        for (const attention::TmaBackwardPlan& plan :
             attention::sweep_tma_backward_plans(problem.head_dim)) {
          const KernelConfig c = attention::with_tma_backward(fixed, plan);
          add(c, c == base ? "base" : "backward");
        }
        continue;
      }
      for (const TileConfig& tile : path_tiles) {
        KernelConfig c = fixed;
        c.backward = tile;
        add(c, c == base ? "base" : "backward");
      }
    }
  }
  return out;
}

std::vector<Candidate> select_shard(const std::vector<Candidate>& candidates, int shard,
                                    int num_shards) {
  FT_CHECK(num_shards >= 1, "--num-shards ", num_shards, ": must be at least 1");
  FT_CHECK(shard >= 0 && shard < num_shards, "--shard ", shard, ": must be in [0, ", num_shards,
           ") for --num-shards ", num_shards);
  std::vector<Candidate> out;
  std::copy_if(candidates.begin(), candidates.end(), std::back_inserter(out),
               [&](const Candidate& c) { return c.index % num_shards == shard; });
  return out;
}

}  // namespace ft::sweep

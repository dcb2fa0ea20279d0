// Configuration of the CUDA flash kernels: tile shapes, threads and paths, whether a
// configuration can run a problem on a device (and why not), the compiled set, and the default
// configuration per architecture family.
//
// A configuration is written "fwd=128x64/128 bwd=64x64/128/double": forward tile block_m (query
// rows) x block_n (key rows) / threads [/ path], backward tile block_m (query rows) x block_n
// (key rows) / threads / path. The forward path is written only when it is not the default
// (mma): "fwd=128x128/256/wgmma". The tma path also names its ring depth and whether its
// consumer warpgroups take turns: "fwd=128x128/384/tma/s2/pp" (or "/nopp"); its tiles are the
// plans of tma_plans.h. The backward path tma names a backward plan of tma_plans.h by its tile
// and, where a tile has plans of several ring depths, by its Q/dO ring: "bwd=64x128/384/tma" (the
// tile's first plan in tma_plans.h) or "bwd=64x192/512/tma/s3". The text form is what the CLI, the
// sweep tables and the default table use.
//
// Everything here is plain C++ (no CUDA): the sweep's --dry-run and the CI tests judge
// configurations for a named architecture without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention.h"
#include "attention/tma_plans.h"

namespace ft::attention {

// Which tensor-core instructions the forward kernel uses.
enum class ForwardPath {
  mma,    // mma.sync per warp (sm80 and newer)
  wgmma,  // Hopper warpgroup products from shared memory (sm90 only)
  tma,    // Hopper, warp-specialised: a TMA producer warp, consumer warpgroups (sm90 only)
};
const char* forward_path_name(ForwardPath path);  // "mma" | "wgmma" | "tma"
ForwardPath parse_forward_path(const std::string& s);

// How the backward kernel computes: with mma.sync, loading the query-side tiles (Q, dO, lse, D)
// of its next iteration in one or two buffers, with Hopper's wgmma (double-buffered), or
// warp-specialised on TMA (the plans of tma_plans.h).
enum class BackwardPath {
  single,           // mma.sync; one buffer: load, wait, compute
  double_buffered,  // mma.sync; two buffers: the next query tile loads during this one
  wgmma,            // wgmma (sm90 only); two buffers
  tma,              // sm90 only: a TMA producer warp, two consumer warpgroups, dQ by TMA reductions
};
const char* backward_path_name(BackwardPath path);  // "single" | "double" | "wgmma" | "tma"
BackwardPath parse_backward_path(const std::string& s);
std::vector<BackwardPath> all_backward_paths();
// The backward paths of the mma.sync kernels (single, double).
std::vector<BackwardPath> mma_backward_paths();

struct TileConfig {
  int block_m = 0;  // query rows of a tile
  int block_n = 0;  // key rows of a tile
  int threads = 0;  // threads of a block (a multiple of 32)
  // (Written out: CUDA sources include this header and compile as C++17.)
  bool operator==(const TileConfig& o) const {
    return block_m == o.block_m && block_n == o.block_n && threads == o.threads;
  }
  bool operator!=(const TileConfig& o) const { return !(*this == o); }
  std::string str() const;  // "128x64/128"
};

struct KernelConfig {
  TileConfig forward{128, 64, 128};
  ForwardPath forward_path = ForwardPath::mma;
  // The tma path only (ignored on the others): ring slots of K and V, and whether the consumer
  // warpgroups take turns issuing their products.
  int forward_stages = 0;
  bool forward_pingpong = false;
  TileConfig backward{64, 64, 128};
  BackwardPath backward_path = BackwardPath::double_buffered;
  // The tma backward only: ring slots of Q and dO; 0 names the tile's first plan in tma_plans.h
  // (its default depth; written without /sN).
  int backward_stages = 0;

  // The tma knobs count only on the tma paths (a configuration switched to another path by
  // assigning forward_path or backward_path keeps them, and means the same kernels).
  bool operator==(const KernelConfig& o) const {
    const bool tma_same =
        forward_path != ForwardPath::tma ||
        (forward_stages == o.forward_stages && forward_pingpong == o.forward_pingpong);
    const bool tma_backward_same =
        backward_path != BackwardPath::tma || backward_stages == o.backward_stages;
    return forward == o.forward && forward_path == o.forward_path && tma_same &&
           backward == o.backward && backward_path == o.backward_path && tma_backward_same;
  }
  bool operator!=(const KernelConfig& o) const { return !(*this == o); }
  std::string str() const;           // "fwd=128x64/128 bwd=64x64/128/double"
  std::string forward_str() const;   // "fwd=128x64/128", "fwd=128x128/256/wgmma" or ".../tma/s2/pp"
  std::string backward_str() const;  // "bwd=64x64/128/double", "bwd=64x192/512/tma[/s3]"
  // Parses str()'s form; either part may be left out (it keeps `base`'s value). Throws
  // ft::Error with the offending text and the expected form.
  static KernelConfig parse(const std::string& text, const KernelConfig& base);
  static KernelConfig parse(const std::string& text) { return parse(text, KernelConfig{}); }
};

// What a device offers the kernels. for_arch() knows the families' published limits, so that
// configurations can be judged without the GPU; current() reads them from the device.
struct DeviceLimits {
  std::string arch;                // "sm90"
  int compute_capability = 0;      // major * 10 + minor
  int64_t max_smem_per_block = 0;  // bytes, with the opt-in (232448 on sm90)
  int max_threads_per_block = 1024;

  static DeviceLimits for_arch(const std::string& arch);  // sm80, sm86, sm89, sm90, sm100, sm120
  // The current CUDA device's limits (read once per device, then cached).
  static const DeviceLimits& current();
  static std::vector<std::string> known_archs();
};

// Shared memory a kernel of this tile needs for one head dim (bf16 tiles; the fp32 path has its
// own fixed kernels and ignores the configuration). The tma path's bytes come from its plan
// (forward_smem_bytes of a KernelConfig; 0 when no plan matches).
int64_t forward_smem_bytes(const TileConfig& tile, ForwardPath path, int64_t head_dim);
int64_t forward_smem_bytes(const KernelConfig& config, int64_t head_dim);

// The tma plan (tma_plans.h) that a configuration's forward names for a head dim, or null.
const TmaForwardPlan* find_tma_plan(const KernelConfig& config, int64_t head_dim);
// `base` with its forward replaced by the plan's tile, threads, stages and turns.
KernelConfig with_tma_forward(KernelConfig base, const TmaForwardPlan& plan);
// The head dims of the tma plans, forward and backward.
const std::vector<int64_t>& tma_head_dims();
const std::vector<int64_t>& tma_backward_head_dims();
// Shared memory of a backward kernel (bf16); the tma path's from its plan (0 when none matches:
// the KernelConfig form, which knows the plan's ring depth).
int64_t backward_smem_bytes(const TileConfig& tile, BackwardPath path, int64_t head_dim);
int64_t backward_smem_bytes(const KernelConfig& config, int64_t head_dim);
// The tma backward plan that a configuration's backward names for a head dim (its tile and ring
// depth; depth 0: the tile's first plan), or null.
const TmaBackwardPlan* find_tma_backward_plan(const KernelConfig& config, int64_t head_dim);
// `base` with its backward replaced by the plan's tile, threads and ring depth (0 where the plan
// is its tile's first, so that the text form stays the short one).
KernelConfig with_tma_backward(KernelConfig base, const TmaBackwardPlan& plan);

// The head dims the bf16 kernels are compiled for: every mma.sync kernel, and the wgmma ones.
const std::vector<int64_t>& flash_head_dims();
const std::vector<int64_t>& wgmma_head_dims();

// "" when the CUDA flash kernels of `config` can run `problem` on `device`; otherwise a reason a
// person can act on (the value, the limit, and what to change). Checks the dtype and head dim,
// the warp layout of each tile, shared memory against the device's opt-in limit and whether the
// kernel was compiled into this build.
// `which` narrows the check to the kernels of one direction (a forward-only caller, e.g. a head
// dim that has a forward kernel but no backward one).
enum class KernelDirection { forward, backward, both };
std::string can_implement(const KernelConfig& config, const Problem& problem,
                          const DeviceLimits& device,
                          KernelDirection which = KernelDirection::both);

// Masks that hide or cut most tiles (a sliding window or segment ids) favour smaller tiles than
// dense ones (none, causal): the default table has a row for each.
enum class MaskClass { dense, local };
const char* mask_class_name(MaskClass mask_class);  // "dense" | "local"
MaskClass mask_class_of(const Mask& mask);

// The default table's family of a compute capability: sm80, sm86 (also sm89), sm90, sm100, sm120.
std::string arch_family(int compute_capability);
// Every family arch_family() names, in that order.
std::vector<std::string> arch_families();

// The configuration the flash kernels use when none is asked for (the per-architecture table in
// kernel_config.cpp, chosen for sm90 by `flashtrain sweep`; docs/SWEEP.md has the tables).
// Each row of the default table also names a range of sequence lengths: any (0, 0), up to
// kShortSeqLen, where sm90's head-dim-64 dense row is the 64-row tma forward of one consumer
// group (docs/PERF.md, "The rescale slack": at 512 and 1024 positions faster than 128x128 at
// every batch measured, slower at 2048), or from kLongSeqLen on, where it is the 192x128
// forward ("t9"); sm90's head-dim-64 local rows (a window or documents) split at the same two
// lengths: the wgmma 64x64 forward up to kShortSeqLen, the 64-row tma plan between, 192x128
// from kLongSeqLen on (docs/PERF.md, session 50). seq_len 0 (the default argument) picks among
// the rows for any length. `group` (query heads per kv head) decides between sm90's local rows
// at head dim 128: the plan of two heads a work tile where the heads pair up, the one-head plan
// otherwise.
inline constexpr int64_t kShortSeqLen = 1024;
inline constexpr int64_t kLongSeqLen = 8192;
KernelConfig default_config(const DeviceLimits& device, int64_t head_dim,
                            MaskClass mask_class = MaskClass::dense, int64_t seq_len = 0,
                            int64_t group = 1);
// For a problem: its mask class's row, then with_deterministic_backward().
KernelConfig default_config(const DeviceLimits& device, const Problem& problem);
// Deterministic mode needs the tma backward (the only bf16 one with a fixed dQ order): for a
// deterministic problem on sm90 whose head dim has a tma backward plan, `config` with its
// backward replaced by the first such plan when it names another path; `config` otherwise.
KernelConfig with_deterministic_backward(KernelConfig config, const DeviceLimits& device,
                                         const Problem& problem);

// The compiled kernels: mma.sync forward tiles and backward tiles (each for both of its paths),
// and wgmma forward and backward tiles. The default build compiles the defaults;
// -DFLASHTRAIN_SWEEP_KERNELS=ON compiles the sweep's whole candidate set.
struct CompiledKernels {
  std::vector<TileConfig> forward;
  std::vector<TileConfig> backward;  // each for the single and double paths
  std::vector<TileConfig> wgmma_forward;
  std::vector<TileConfig> wgmma_backward;
  std::vector<TmaForwardPlan> tma_forward;
  std::vector<TmaBackwardPlan> tma_backward_plans;
  std::vector<TileConfig> tma_backward;  // the tiles of tma_backward_plans, each once
  std::vector<int64_t> head_dims;
  std::vector<int64_t> wgmma_head_dims;
  bool sweep_set = false;

  // The mma and wgmma forward tiles (the tma path's are the plans of tma_forward).
  const std::vector<TileConfig>& forward_tiles(ForwardPath path) const {
    return path == ForwardPath::wgmma ? wgmma_forward : forward;
  }
  const std::vector<TileConfig>& backward_tiles(BackwardPath path) const {
    return path == BackwardPath::wgmma ? wgmma_backward
                                       : (path == BackwardPath::tma ? tma_backward : backward);
  }
};
const CompiledKernels& compiled_kernels();

// The tile sweep's candidates (compiled or not) of each path: mma.sync forward tiles with their
// threads, mma.sync backward tiles x {128, 256} threads, and the wgmma tiles. The tma forward
// path's candidates are the plans of tma_plans.h (sweep_tma_plans; empty here); the tma backward
// path's are its plans (sweep_tma_backward_plans), whose tiles sweep_backward_tiles lists for
// `head_dim` (0: of every head dim), each once.
std::vector<TileConfig> sweep_forward_tiles(ForwardPath path = ForwardPath::mma);
std::vector<TmaForwardPlan> sweep_tma_plans(int64_t head_dim);
std::vector<TmaBackwardPlan> sweep_tma_backward_plans(int64_t head_dim);
std::vector<TileConfig> sweep_backward_tiles(BackwardPath path = BackwardPath::double_buffered,
                                             int64_t head_dim = 0);

}  // namespace ft::attention

// Configuration of the CUDA flash kernels: tile shapes, threads and backward path, whether a
// configuration can run a problem on a device (and why not), the compiled set, and the default
// configuration per architecture family.
//
// A configuration is written "fwd=128x64/128 bwd=64x64/128/double": forward tile block_m (query
// rows) x block_n (key rows) / threads, backward tile block_m (query rows) x block_n (key rows)
// / threads / path. The text form is what the CLI, the sweep tables and the default table use.
//
// Everything here is plain C++ (no CUDA): the sweep's --dry-run and the CI tests judge
// configurations for a named architecture without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/attention.h"

namespace ft::attention {

// How the backward kernel loads the query-side tiles (Q, dO, lse, D) of its next iteration.
enum class BackwardPath {
  single,           // one buffer: load, wait, compute
  double_buffered,  // two buffers: the next query tile loads while this one is computed
};
const char* backward_path_name(BackwardPath path);  // "single" | "double"
BackwardPath parse_backward_path(const std::string& s);
std::vector<BackwardPath> all_backward_paths();

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
  TileConfig backward{64, 64, 128};
  BackwardPath backward_path = BackwardPath::double_buffered;

  bool operator==(const KernelConfig& o) const {
    return forward == o.forward && backward == o.backward && backward_path == o.backward_path;
  }
  bool operator!=(const KernelConfig& o) const { return !(*this == o); }
  std::string str() const;  // "fwd=128x64/128 bwd=64x64/128/double"
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
// own fixed kernels and ignores the configuration).
int64_t forward_smem_bytes(const TileConfig& tile, int64_t head_dim);
int64_t backward_smem_bytes(const TileConfig& tile, BackwardPath path, int64_t head_dim);

// The head dims the bf16 kernels are compiled for.
const std::vector<int64_t>& flash_head_dims();

// "" when the CUDA flash kernels of `config` can run `problem` on `device`; otherwise a reason a
// person can act on (the value, the limit, and what to change). Checks the dtype and head dim,
// the warp layout of each tile, shared memory against the device's opt-in limit and whether the
// kernel was compiled into this build.
std::string can_implement(const KernelConfig& config, const Problem& problem,
                          const DeviceLimits& device);

// Masks that hide or cut most tiles (a sliding window or segment ids) favour smaller tiles than
// dense ones (none, causal): the default table has a row for each.
enum class MaskClass { dense, local };
const char* mask_class_name(MaskClass mask_class);  // "dense" | "local"
MaskClass mask_class_of(const Mask& mask);

// The default table's family of a compute capability: sm80, sm86 (also sm89), sm90, sm100, sm120.
std::string arch_family(int compute_capability);

// The configuration the flash kernels use when none is asked for (the per-architecture table in
// kernel_config.cpp, chosen for sm90 by `flashtrain sweep`; docs/SWEEP.md has the tables).
KernelConfig default_config(const DeviceLimits& device, int64_t head_dim,
                            MaskClass mask_class = MaskClass::dense);
KernelConfig default_config(const DeviceLimits& device, const Problem& problem);

// The compiled kernels: forward tiles, and backward tiles per path. The default build compiles
// the defaults; -DFLASHTRAIN_SWEEP_KERNELS=ON compiles the sweep's whole candidate set.
struct CompiledKernels {
  std::vector<TileConfig> forward;
  std::vector<TileConfig> backward;  // each for every backward path
  std::vector<int64_t> head_dims;
  bool sweep_set = false;
};
const CompiledKernels& compiled_kernels();

// The tile sweep's candidates (compiled or not): forward tiles with their threads, backward
// tiles x {128, 256} threads.
std::vector<TileConfig> sweep_forward_tiles();
std::vector<TileConfig> sweep_backward_tiles();

}  // namespace ft::attention

// Kernel-configuration files: rows of the default-config table (kernel_config.cpp) kept outside
// the source, so that a sweep's winners reach training without a rebuild. `flashtrain sweep
// --emit-kernel-config FILE` writes one; `flashtrain train --kernel-config FILE` and `flashtrain
// attention --kernel-config FILE` read it. JSON (docs/SWEEP.md, "Kernel-config files"):
//
//   {"format": "flashtrain-kernel-config", "version": 1,
//    "note": "...",                                  optional, for people
//    "source": {...},                                optional: where the rows come from
//    "rows": [{"arch": "sm90", "max_head_dim": 128, "mask": "local",
//              "config": "fwd=64x64/128/wgmma bwd=64x128/384/tma",
//              "note": "...", "measured": {...}}]}   note, measured: optional
//
// A row is a row of the built-in table: an architecture family (arch_family(): sm80, sm86,
// sm90, sm100, sm120), a head-dim bound (the row covers head dims up to it), a mask class and a
// whole configuration (both parts, KernelConfig::str()'s form). "source" and "measured" are
// provenance: kept for people, not interpreted. Any other key is refused, so that a misspelt
// one is not silently ignored.
//
// For a problem, the file's row for the device's family and the problem's mask class whose bound
// covers the head dim most tightly wins; without one the built-in table decides. Either way the
// deterministic rule of default_config() applies on top (with_deterministic_backward()).
//
// Plain C++ (no CUDA); needs nlohmann-json, so the Python module, which builds the attention
// layer without it, leaves this file out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attention/kernel_config.h"

namespace ft::attention {

inline constexpr const char* kKernelConfigFormat = "flashtrain-kernel-config";
inline constexpr int kKernelConfigVersion = 1;

struct KernelConfigRow {
  std::string arch;          // a family of arch_family()
  int64_t max_head_dim = 0;  // the row covers head dims up to this
  MaskClass mask_class = MaskClass::dense;
  KernelConfig config;

  std::string describe() const;  // "sm90, head dims <= 128, local"
};

struct KernelConfigFile {
  std::string path;  // what messages name
  std::vector<KernelConfigRow> rows;

  // Of the rows of `family` and `mask_class` whose bound covers head_dim, the one with the
  // smallest bound; null when there is none.
  const KernelConfigRow* find(const std::string& family, int64_t head_dim,
                              MaskClass mask_class) const;
  // "kernel config file tuned.json, rows[1] (sm90, head dims <= 128, local)"
  std::string row_name(const KernelConfigRow& row) const;
};

// Parses and checks a file's text; `path` names it in messages. Throws ft::Error naming the
// file, the row and the field: bad JSON, another format or version, an unknown or missing key, a
// value of the wrong type or out of range, an unknown architecture, a configuration that does
// not parse or lacks a part, two rows for the same architecture, bound and mask class.
KernelConfigFile parse_kernel_config_file(const std::string& text, const std::string& path);
KernelConfigFile read_kernel_config_file(const std::string& path);

// The configuration the flash kernels run for a problem, and where it came from.
struct KernelConfigChoice {
  MaskClass mask_class = MaskClass::dense;
  KernelConfig config;
  std::string family;  // the device's
  const KernelConfigFile* file = nullptr;
  const KernelConfigRow* row = nullptr;  // the file's row; null: the built-in table
  bool deterministic_backward = false;   // with_deterministic_backward() replaced the backward

  // "kernel config file tuned.json, rows[1] (sm90, head dims <= 128, local)" or "the built-in
  // sm90 table", and ", with the tma backward for deterministic mode" when that replaced it.
  std::string origin() const;
};

// The file's row (file may be null), else default_config(); then with_deterministic_backward().
KernelConfigChoice choose_kernel_config(const KernelConfigFile* file, const DeviceLimits& device,
                                        const Problem& problem);
// choose_kernel_config(), checked by can_implement() for `which`: a configuration that cannot
// run the problem is an ft::Error naming where it came from and why, never a silent fallback.
KernelConfigChoice checked_kernel_config(const KernelConfigFile* file, const DeviceLimits& device,
                                         const Problem& problem,
                                         KernelDirection which = KernelDirection::both);

}  // namespace ft::attention

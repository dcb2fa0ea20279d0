// The sweep's rows and what is made of them: the text table (one per mask), JSON and CSV for
// tools, --emit-defaults' lines for the default-config table and --emit-kernel-config's file. Rows
// travel from the worker processes to the parent as the same JSON (row_to_json / row_from_json).
#pragma once

#include <nlohmann/json.hpp>

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "attention/kernel_config.h"
#include "sweep/check.h"
#include "sweep/shapes.h"

namespace ft::sweep {

struct GpuFacts {
  int device = 0;
  std::string name;  // "NVIDIA H200"; "(dry run)" without a GPU
  std::string arch;  // "sm90"
  int compute_capability = 0;
  int64_t smem_per_block = 0;  // bytes, with the opt-in
  int sms = 0;
};

struct MaskFacts {
  std::string key, description;
  int64_t attended_pairs = 0;  // of the timed problem, summed over batch and query heads
  int64_t check_window = 0;    // the check problem's window (0: none)
  double fwd_flop = 0, bwd_flop = 0;
  // The device's default for this mask (default_config() depends on the mask class); the
  // header's base config when unset.
  std::optional<attention::KernelConfig> default_config;
};

struct SweepHeader {
  std::vector<GpuFacts> gpus;
  SweepShape shape;
  attention::KernelConfig base, reference;
  std::string axis;
  std::vector<std::string> paths;
  bool sweep_kernels_compiled = false;
  int warmup = 5, iters = 20, rounds = 1;
  bool dry_run = false;
  std::vector<MaskFacts> masks;
};

// Median of the timed calls of one direction, pooled over rounds; spread is the interquartile
// range over the median; round_ms holds each round's median (drift shows there).
struct DirectionTiming {
  double median_ms = 0.0;
  double spread = 0.0;
  std::vector<double> round_ms;
};

struct ConfigTiming {
  DirectionTiming fwd, bwd;
  double total_ms() const { return fwd.median_ms + bwd.median_ms; }
  // IQR of forward and backward together, over the total.
  double spread() const;
};

DirectionTiming summarize_timing(const std::vector<std::vector<double>>& samples_per_round);

enum class RowStatus {
  planned,  // --dry-run: can_implement accepted it; nothing ran
  refused,  // can_implement refused it; nothing launched
  error,    // the worker failed (launch error, CUDA error, crash, timeout)
  checked,  // the check ran (and, when it passed or with --time-failing, the timing)
};
const char* status_name(RowStatus status);
RowStatus parse_status(const std::string& text);

struct SweepRow {
  std::string mask;  // MaskFacts::key
  int gpu = 0;
  int index = -1;    // candidate index; -1 for the reference
  std::string role;  // "ref" | "base" | "forward" | "backward"
  attention::KernelConfig config;
  RowStatus status = RowStatus::planned;
  std::string reason;  // the refusal or the error
  std::vector<TensorCheck> checks;
  bool timed = false;
  ConfigTiming timing;
  ConfigTiming ref_timing;  // the reference, timed in the same process alternately with it
  double max_abs_diff = std::numeric_limits<double>::quiet_NaN();  // vs the reference config
  double flop = 0.0;  // forward + backward FLOPs of the timed problem

  bool passed() const;  // checked and every tensor passed
  double total_ms() const { return timing.total_ms(); }
  double vs_ref() const;  // reference total / this total
  double tflops() const;
  std::string verdict() const;  // "ok", "FAIL:dq", "refused: ...", "ERROR: ...", "can run"
};

nlohmann::json row_to_json(const SweepRow& row);
SweepRow row_from_json(const nlohmann::json& j);
nlohmann::json header_to_json(const SweepHeader& header);

// The header block and one table per mask, with a summary line each ("fastest correct: ...").
std::string format_header(const SweepHeader& header);
std::string format_mask_table(const SweepHeader& header, const MaskFacts& mask,
                              const std::vector<SweepRow>& rows);

// Numbers as the table and CSV print them ("nan" / "inf" when not finite; sci(0) is "0").
std::string fixed(double x, int digits);
std::string sci(double x);

// {"header": ..., "rows": [...]}
void write_json(const std::string& path, const SweepHeader& header,
                const std::vector<SweepRow>& rows);
// The header facts as "# key: value" lines, then one line per row.
void write_csv(const std::string& path, const SweepHeader& header,
               const std::vector<SweepRow>& rows);
std::string csv_text(const SweepHeader& header, const std::vector<SweepRow>& rows);

// The fastest row that passed and was timed, per mask: by total ms on one GPU, by vs ref when
// the rows come from several GPUs (the paired ratio cancels the cards' differences). Null when
// no row qualifies.
const SweepRow* fastest_correct(const std::vector<SweepRow>& rows, const std::string& mask);

// Per mask, a comment naming what was measured and a line in the format of kDefaults in
// src/attention/kernel_config.cpp: {"sm90", 256, "fwd=128x64/128 bwd=64x128/256/double"},
std::string emit_defaults(const SweepHeader& header, const std::vector<SweepRow>& rows);

// --emit-kernel-config: a kernel-config file (attention/kernel_config_file.h) with, per mask,
// the fastest correct row for the first GPU's family, its bound the measured head dim, and what
// was measured; the header's facts are its "source". `date` is the caller's (UTC, ISO 8601),
// so that the text is reproducible. Masks without a qualifying row give no row.
nlohmann::json kernel_config_file_json(const SweepHeader& header, const std::vector<SweepRow>& rows,
                                       const std::string& date);
// Writes it atomically, dated now; returns the number of rows written.
size_t write_kernel_config_file(const std::string& path, const SweepHeader& header,
                                const std::vector<SweepRow>& rows);

}  // namespace ft::sweep

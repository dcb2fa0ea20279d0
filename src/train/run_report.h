// Baseline-vs-test reports over two sets of run logs (run_log.h), paired by case name:
//   loss alignment (compare-loss): per case the steps compared, the largest absolute loss
//     difference and the first step over the dtype's threshold; a missing step, a case on one
//     side only or two dtypes for one case fail the case.
//   performance (summarize): per case avg ms, avg tok/s, peak used and peak reserved MB of both
//     sides, speedup = base ms / test ms, tok/s gain = test / base - 1 and memory saved =
//     (base - test) / base; the first step left out by default (it carries the warm-up).
// Both return plain structs; rendering to Markdown / CSV is separate.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/run_log.h"

namespace ft::train {

// Exit codes of compare-loss and summarize.
enum ReportExit : int { report_ok = 0, report_case_failed = 1, report_bad_input = 2 };

// One case name and its log on each side (nullptr: that side has no log of this name).
struct CasePair {
  std::string name;
  const RunLog* base = nullptr;
  const RunLog* test = nullptr;
};

// Pairs by case name, sorted by name; the pairs point into base and test, which must outlive
// them. With two_files (BASE and TEST were each one log file, not a directory) the two logs
// pair whatever their names, under the base log's name.
std::vector<CasePair> pair_runs(const std::vector<RunLog>& base, const std::vector<RunLog>& test,
                                bool two_files = false);

// Both sides of a comparison as the tools load them: BASE and TEST paths (run directories or
// single logs). A path that cannot be read throws ft::Error (the tools exit report_bad_input);
// a log that cannot be parsed is kept with its error. two_files: both paths are single logs.
struct RunSides {
  std::vector<RunLog> base, test;
  bool two_files = false;
  std::vector<std::string> log_errors() const;  // the errors of the logs that did not parse
  std::vector<CasePair> pairs() const { return pair_runs(base, test, two_files); }
};
RunSides load_run_sides(const std::string& base_path, const std::string& test_path);

// ---- loss alignment ----

struct LossThresholds {
  double fp32 = 1e-5;
  double bf16 = 1e-2;
  double for_dtype(const std::string& dtype) const { return dtype == "bf16" ? bf16 : fp32; }
};

struct StepDifference {
  int64_t step = 0;
  double base_loss = 0.0, test_loss = 0.0, abs_diff = 0.0;
  // The baseline's gradient norm at that step and its ratio to the median over the compared
  // steps, when the baseline logs gradient norms: a large ratio marks a data spike, where the
  // loss is most sensitive to the small differences of the weights.
  std::optional<double> base_grad_norm, grad_norm_ratio;
};

struct LossComparison {
  std::string name;
  std::string dtype;  // "fp32", "bf16", or "?" when no readable log says
  double threshold = 0.0;
  int64_t steps_compared = 0;
  double max_abs_diff = 0.0;  // Inf when a loss is NaN or Inf
  int64_t max_diff_step = 0;  // 0: nothing compared
  int64_t steps_over = 0;
  std::vector<StepDifference> first_over;  // the first few steps over the threshold
  std::vector<int64_t> missing_in_base, missing_in_test;
  // One side only, an unreadable log, dtypes that differ, a run that stopped (the test run,
  // or the baseline other than out of memory).
  std::vector<std::string> problems;
  bool bad_input = false;  // a log could not be read
  // Set when the baseline's log says it ran out of memory ("in step 1: out of GPU memory:
  // ..."): the steps before that are still compared, and the test run must be complete.
  std::string base_out_of_memory;

  bool passed() const {
    return problems.empty() && missing_in_base.empty() && missing_in_test.empty() &&
           steps_over == 0 && steps_compared > 0 && base_out_of_memory.empty();
  }
  // The baseline did not fit but the test run is complete and agrees wherever both logged:
  // neither passed nor failed ("base OOM"), and no reason for a non-zero exit.
  bool baseline_did_not_fit() const {
    return !base_out_of_memory.empty() && problems.empty() && missing_in_base.empty() &&
           missing_in_test.empty() && steps_over == 0;
  }
  std::optional<int64_t> first_step_over() const {
    if (first_over.empty()) return std::nullopt;
    return first_over.front().step;
  }
};

// The steps expected of a case are every step either side logged, plus the steps up to the
// declared total (`step N/M`, "steps") from the first one logged: a run cut short on both sides
// still misses steps. Of a baseline that ran out of memory, only the steps before that.
LossComparison compare_losses(const CasePair& pair, const LossThresholds& thresholds);

std::vector<LossComparison> compare_all_losses(const std::vector<CasePair>& pairs,
                                               const LossThresholds& thresholds);

int loss_exit_code(const std::vector<LossComparison>& cases);

// The Markdown table, the failures in words, and the passed count per dtype.
std::string render_loss_report(const std::vector<LossComparison>& cases,
                               const LossThresholds& thresholds);

// Every compared step of every case: base loss, test loss, difference (for --per-step).
std::string render_loss_steps(const std::vector<CasePair>& pairs);

// ---- performance ----

struct PerfStats {
  int64_t steps = 0;       // steps averaged
  int64_t first_step = 0;  // first and last step averaged (0 when none)
  int64_t last_step = 0;
  std::optional<double> ms, tokens_per_second;           // means over the steps
  std::optional<double> peak_used_mb, peak_reserved_mb;  // maxima over the steps
  std::optional<double> attention_saved_mb;              // maximum over the steps
};

// include_first: keep the first logged step (step 1), which carries the warm-up.
PerfStats perf_stats(const RunLog& log, bool include_first);

struct PerfRow {
  std::string name, dtype;
  PerfStats base, test;
  std::vector<std::string> problems;  // not summarized, and why
  bool bad_input = false;
  // The baseline ran out of memory (as compare-loss): the row shows the test side only.
  std::string base_out_of_memory;

  bool summarized() const { return problems.empty(); }
  // Each nullopt when a side lacks the field, or the baseline ran out of memory.
  std::optional<double> speedup() const;                 // base ms / test ms
  std::optional<double> tokens_per_second_gain() const;  // test / base - 1
  std::optional<double> peak_used_saved() const;         // (base - test) / base
  std::optional<double> peak_reserved_saved() const;
  std::optional<double> peak_used_saved_mb() const;  // base - test
  // What the attention keeps for backward, base - test (our JSON lines log it per step): the
  // saving to expect from fused attention, against the measured peak_used_saved_mb().
  std::optional<double> expected_saved_mb() const;
};

std::vector<PerfRow> summarize_runs(const std::vector<CasePair>& pairs, bool include_first);

int perf_exit_code(const std::vector<PerfRow>& rows);

struct PerfLabels {
  std::string base = "baseline";
  std::string test = "flash";
};

std::string render_perf_markdown(const std::vector<PerfRow>& rows, const PerfLabels& labels,
                                 bool include_first);
std::string render_perf_csv(const std::vector<PerfRow>& rows);

}  // namespace ft::train

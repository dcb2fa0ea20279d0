// Reading training logs back, for the baseline-vs-flash tools (compare-loss, summarize).
//
// Two formats:
//   JSON lines (step_log.h): a {"event": "run", ..., "dtype": ...} line first, then one object
//     per step ({"step", "train_loss", "ms", "tok_per_s", "peak_used_mb", ...}); other events
//     ({"event": "summary"}) are skipped, except {"event": "error"}: the run stopped there
//     (RunFailure), and {"event": "resume", "step": N}: a resumed run continues the log from
//     step N, so steps after N logged before that line (and a failure) are superseded.
//   InfiniTrain-style text: any line holding `step N/M | train loss X` (a glog prefix before it
//     and text after the fields are allowed); `lr`, `ms`, `tok/s`, `peak used:` and
//     `peak reserved:` are read when present. Lines without `step N/M |` are not step lines;
//     one with it but without a readable `train loss X` is malformed.
// A text log carries no dtype, so it comes from the file name as InfiniTrain's compare_loss.py
// does: a name containing "_bfloat16" is bf16, any other is fp32.
//
// A run directory holds one log per case: every *.jsonl and *.log file directly inside, the
// case named by the file's stem, so a baseline directory and a test directory pair by name.
#pragma once

#include <cstdint>
#include <istream>
#include <optional>
#include <string>
#include <vector>

namespace ft::train {

struct LoggedStep {
  int64_t step = 0;
  int64_t total_steps = 0;  // 0 when the log does not say
  int64_t line = 0;         // 1-based line in the file, for messages
  double train_loss = 0.0;  // may be NaN or Inf in a text log: a comparison then fails
  std::optional<double> lr, ms, tokens_per_second, peak_used_mb, peak_reserved_mb;
  std::optional<double> grad_norm;           // our JSON lines only
  std::optional<double> attention_saved_mb;  // our JSON lines only
};

// How a run that stopped early ended: its {"event": "error", "step", "kind", "message"} line,
// which our trainer writes before the failure propagates (JSON lines only).
struct RunFailure {
  int64_t step = 0;  // the step it stopped in
  std::string kind;  // "out_of_memory", or "error" for anything else
  std::string message;
  int64_t line = 0;

  bool out_of_memory() const { return kind == "out_of_memory"; }
};

enum class LogFormat { json_lines, text };

struct RunLog {
  std::string name;  // the case: the file name without its extension
  std::string path;
  LogFormat format = LogFormat::text;
  std::string dtype;              // "fp32" or "bf16"; empty when the log did not get that far
  std::vector<LoggedStep> steps;  // ascending by step, no step twice
  // Set when the run recorded why it stopped; the steps before it are still read, and a
  // failed run with no step is a valid log (a baseline that ran out of memory in step 1).
  std::optional<RunFailure> failure;
  // Non-empty when the log could not be read: "<file>:<line>: <what was expected>". A bad log
  // is carried instead of thrown so that one broken case does not hide the report on the others.
  std::string error;

  bool ok() const { return error.empty(); }
};

// *.jsonl / *.json are JSON lines, anything else is text. Never throws: see RunLog::error.
RunLog read_run_log(const std::string& path);

// The parsers behind read_run_log; `path` names the source in messages and gives the case name.
RunLog parse_json_lines_log(std::istream& in, const std::string& path);
RunLog parse_text_log(std::istream& in, const std::string& path);

// "bf16" when the file name contains "_bfloat16" (InfiniTrain's rule), else "fp32".
std::string dtype_from_file_name(const std::string& path);

// A run directory (every *.jsonl and *.log directly inside, sorted by case name) or one log file.
// Throws ft::Error for a path that does not exist, a directory without logs, or two logs of one
// case (x.jsonl and x.log).
std::vector<RunLog> load_runs(const std::string& path);

}  // namespace ft::train

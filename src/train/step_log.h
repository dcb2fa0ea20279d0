// One record per optimizer step, printed in the InfiniTrain-compatible text format and written
// as a JSON line with the same fields:
//   step    2/30 | train loss 4.560387 | lr 1.00e-04 | (81.50 ms | 25128 tok/s | peak used:  5896
//   MB | peak reserved:  5952 MB) | elapsed 0:00:01 | eta 0:00:09 | 16384 tokens
// (the progress fields after the parenthesis are ours; InfiniTrain's readers stop before them).
#pragma once

#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ft::train {

// One rank's share of a data-parallel step (JSON only).
struct RankRecord {
  double ms = 0.0, tokens_per_second = 0.0, peak_used_mb = 0.0, peak_reserved_mb = 0.0;
};

struct StepRecord {
  int64_t step = 0, total_steps = 0;
  double train_loss = 0.0, lr = 0.0, ms = 0.0, tokens_per_second = 0.0, grad_norm = 0.0;
  double peak_used_mb = 0.0, peak_reserved_mb = 0.0;
  // What the attention of all layers keeps for backward (JSON only): summarize's expected
  // memory saving of flash over naive is the difference of the two runs' values.
  double attention_saved_mb = 0.0;
  // What all layers keep for backward (JSON only): their inputs and caches, attention's
  // included, under the run's --recompute mode.
  double activations_saved_mb = 0.0;
  std::optional<double> val_loss;
  // Progress, printed after the InfiniTrain fields (readers skip them): wall time since this
  // process started training, the estimate of the time left, tokens trained on so far.
  std::optional<double> elapsed_s, eta_s;
  int64_t tokens_seen = 0;
  // Data parallelism: ms is the slowest rank's, tokens_per_second the whole job's, the peaks
  // the sums over the ranks; each rank's own figures go to the JSON line as "ranks".
  std::vector<RankRecord> ranks;
};

std::string format_step_line(const StepRecord& r);
nlohmann::json to_json(const StepRecord& r);

// JSON-lines writer: the first line describes the run ({"event": "run", ...}), then one line
// per step. Lines are flushed as they are written, so a killed run keeps its log.
class JsonLog {
 public:
  JsonLog() = default;
  // append: continue an existing log (a resumed run) instead of starting it afresh.
  explicit JsonLog(const std::string& path, bool append = false);
  bool enabled() const { return out_.is_open(); }
  void write(const nlohmann::json& line);

 private:
  std::ofstream out_;
};

}  // namespace ft::train

// One sweep job, run in a child process (`flashtrain sweep --worker JOB`) so that a launch
// failure, a CUDA error or a crash ends only that job: the next job gets a fresh, healthy CUDA
// context. A job is one configuration on one mask on one GPU:
//   1. the check: naive bf16 on the check problem (the yardstick), then the configuration's
//      flash forward and backward into a NaN-poisoned pool, each of out, dq, dk, dv judged
//      against the fp64 reference the parent computed (check.h);
//   2. when it passed (or with time_failing): max|d| of out, dq, dk, dv against the reference
//      configuration at the timed shape, then the timing: `rounds` rounds, each timing the
//      reference and the configuration (in alternating order), forward and backward apart.
// The worker prints progress lines "FT_SWEEP_PROGRESS <what>" and, last, one line
// "FT_SWEEP_RESULT <row JSON>" on stdout.
#pragma once

#include <nlohmann/json.hpp>

#include <functional>
#include <string>

#include "attention/kernel_config.h"
#include "sweep/results.h"
#include "sweep/shapes.h"

namespace ft::sweep {

inline constexpr const char* kResultPrefix = "FT_SWEEP_RESULT ";
inline constexpr const char* kProgressPrefix = "FT_SWEEP_PROGRESS ";

struct WorkerJob {
  SweepShape shape;
  std::string mask_key;
  attention::KernelConfig config, reference;
  bool is_reference = false;        // the job of the reference row: timed alone
  bool pair_with_reference = true;  // false when the reference cannot run here
  std::string check_dir;            // check_data.h's files
  int device = 0;
  int warmup = 5, iters = 20, rounds = 1;
  bool time_failing = false;
  int max_input_sets = 16;  // rotated input sets at most (small shapes)
  uint64_t seed = 1234;
  // For tests of the recovery: "abort" (the process dies), "illegal-address" (a kernel faults,
  // leaving the CUDA context unusable) or "hang" (never finishes). The parent sets it from
  // FT_SWEEP_INJECT_FAULT="<kind>@<candidate index>".
  std::string fault;
};

nlohmann::json job_to_json(const WorkerJob& job);
WorkerJob job_from_json(const nlohmann::json& j);

// Runs the job on the GPU, filling `row` as it goes (so that an exception leaves what was
// measured before it). Throws on any failure.
void run_job(const WorkerJob& job, SweepRow& row,
             const std::function<void(const std::string&)>& progress);

// The worker process: parses the job, runs it, prints the result line. Returns 0, or 3 after
// an error (the row says what happened).
int worker_main(const std::string& job_json);

}  // namespace ft::sweep

// `flashtrain sweep`: is the default kernel configuration the fastest correct one, for this GPU
// and this training shape? Every candidate (candidates.h) is first checked on a reduced
// problem against an fp64 reference (check.h); only those that pass are timed at the training
// shape, alternately with a fixed reference configuration, once per mask (shapes.h).
//
// The parent process (run_sweep) never touches the GPU: it computes the check problem's fp64
// reference once per mask, then runs each job in a child process (worker.h) so that a crash or
// a CUDA error costs one row, not the sweep. With several GPUs each runs its share of the jobs
// in parallel, and the rows are merged into one table per mask.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "sweep/candidates.h"
#include "sweep/child_process.h"
#include "sweep/results.h"
#include "sweep/shapes.h"

namespace ft::sweep {

struct SweepOptions {
  SweepShape shape;
  std::string axis = "both";  // forward | backward | both
  std::string backward_path;  // "" = the base config's
  bool all_paths = false;
  int warmup = 5, iters = 20, rounds = 1;
  bool time_failing = false;
  int shard = 0, num_shards = 1;
  int device = -1;   // -1: GPU 0
  std::string gpus;  // "" (one GPU) or "all"
  bool dry_run = false;
  std::string arch;  // --dry-run without a GPU: the architecture to judge for
  std::string json_path, csv_path;
  bool emit_defaults = false;
  std::string kernel_config_path;  // --emit-kernel-config: the winners as a kernel-config file
  double worker_timeout_s = 600.0;
  int max_input_sets = 16;
  uint64_t seed = 1234;

  // Throws ft::Error naming the bad flag, its value and what is allowed.
  void validate() const;
};

// What a run will do, decided without a GPU (from `gpus`, the facts of the GPUs it will use).
struct SweepPlan {
  SweepHeader header;
  std::vector<SweepMask> masks;
  Candidate reference;
  std::vector<Candidate> candidates;  // this shard's
};

SweepPlan plan_sweep(const SweepOptions& opt, const std::vector<GpuFacts>& gpus);

// The facts of the GPUs a run uses (from the CUDA runtime, without creating a context), or of
// the named --arch for a dry run without a GPU.
std::vector<GpuFacts> sweep_gpus(const SweepOptions& opt);

// --dry-run's rows: the reference and every candidate, "can run" or refused with the reason.
std::vector<SweepRow> dry_run_rows(const SweepPlan& plan);

// The row a worker reported (its result line's JSON, "" when it printed none), or an ERROR row
// saying how the worker ended when it crashed, timed out or printed nothing readable.
SweepRow row_from_worker_output(const std::string& result_json, const ChildOutcome& outcome,
                                double timeout_s);

// The whole command. `self` is the flashtrain binary that runs the workers
// (`<self> sweep --worker JOB`). Tables go to `out`, progress to `err`. Returns the exit code.
int run_sweep(const SweepOptions& opt, const std::string& self, std::ostream& out,
              std::ostream& err);

}  // namespace ft::sweep

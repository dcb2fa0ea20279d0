// `flashtrain sweep`: a correctness-first tile sweep of the CUDA flash kernels on a training
// shape (src/sweep/sweep.h). Parses flags and calls the library; `--worker JOB` is the child
// process the sweep runs each job in.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "core/output_path.h"
#include "sweep/sweep.h"
#include "sweep/worker.h"

namespace ft::cli {
namespace {

struct SweepCommand {
  sweep::SweepOptions opt;
  std::string worker_job;
};

// The running binary, so that workers are this very build.
std::string self_path() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  FT_CHECK(!ec, "sweep: cannot find the flashtrain binary (/proc/self/exe): ", ec.message());
  return p.string();
}

void run(const SweepCommand& cmd) {
  if (!cmd.worker_job.empty()) {
    // The result line is out; skip the teardown, which a faulted CUDA context may not survive
    // (a hang there would cost the whole --worker-timeout).
    const int code = sweep::worker_main(cmd.worker_job);
    std::fflush(nullptr);
    std::_Exit(code);
  }
  // The tables are written after the whole sweep: their paths are checked before it.
  if (!cmd.opt.json_path.empty()) check_writable_file(cmd.opt.json_path, "--json");
  if (!cmd.opt.csv_path.empty()) check_writable_file(cmd.opt.csv_path, "--csv");
  if (!cmd.opt.kernel_config_path.empty()) {
    check_writable_file(cmd.opt.kernel_config_path, "--emit-kernel-config");
  }
  const int code = sweep::run_sweep(cmd.opt, self_path(), std::cout, std::cerr);
  if (code != 0) std::exit(code);
}

}  // namespace

void add_sweep_command(CLI::App& app) {
  auto cmd = std::make_shared<SweepCommand>();
  sweep::SweepOptions& o = cmd->opt;
  CLI::App* sub = app.add_subcommand(
      "sweep",
      "Correctness-first tile sweep of the CUDA flash attention kernels on a training shape: "
      "every candidate configuration is checked against an fp64 reference (out, dq, dk, dv) "
      "before it is timed; one table per mask (sliding window + documents, then causal). Build "
      "with -DFLASHTRAIN_SWEEP_KERNELS=ON to compile every candidate. See docs/SWEEP.md.");
  sub->add_option("--batch", o.shape.batch, "batch per GPU")->capture_default_str();
  sub->add_option("--seq-len", o.shape.seq_len, "sequence length")->capture_default_str();
  sub->add_option("--q-heads", o.shape.q_heads, "query heads")->capture_default_str();
  sub->add_option("--kv-heads", o.shape.kv_heads, "kv heads (divides --q-heads)")
      ->capture_default_str();
  sub->add_option("--head-dim", o.shape.head_dim, "head dim")->capture_default_str();
  sub->add_option("--sliding-window", o.shape.window,
                  "window of the first mask (causal + window + documents); 0 = none")
      ->capture_default_str();
  sub->add_option("--documents", o.shape.documents,
                  "documents per row of the first mask (segment ids); 0 = none")
      ->capture_default_str();
  sub->add_option("--sweep", o.axis,
                  "which axis varies: forward (every forward tile of the mma and wgmma paths and "
                  "every tma plan of the head dim, backward fixed), backward (every backward tile "
                  "of the path, forward fixed) or both")
      ->capture_default_str();
  sub->add_option(
      "--backward-path", o.backward_path,
      "backward path of the candidates: single, double, wgmma or tma (default: the base "
      "config's)");
  sub->add_flag("--all-paths", o.all_paths, "sweep every compiled backward path");
  sub->add_option("--warmup", o.warmup, "untimed calls before the timed ones")
      ->capture_default_str();
  sub->add_option("--iters", o.iters, "timed calls per direction and round (median)")
      ->capture_default_str();
  sub->add_option("--rounds", o.rounds,
                  "repeat the comparison, alternating reference and candidate order (drift)")
      ->capture_default_str();
  sub->add_flag("--time-failing", o.time_failing,
                "also time candidates that failed the check (marked '!')");
  sub->add_option("--shard", o.shard, "run the candidates whose index % --num-shards is this")
      ->capture_default_str();
  sub->add_option("--num-shards", o.num_shards, "number of shards")->capture_default_str();
  sub->add_option("--device", o.device, "GPU to run on (default 0)");
  sub->add_option("--gpus", o.gpus,
                  "'all': one worker per visible GPU, candidates dealt out, one merged table");
  sub->add_flag("--dry-run", o.dry_run,
                "list the candidates with can_implement's verdicts; launches nothing");
  sub->add_option("--arch", o.arch, "architecture of a --dry-run without a GPU (e.g. sm90)");
  sub->add_option("--json", o.json_path, "write the header and rows as JSON");
  sub->add_option("--csv", o.csv_path, "write the rows as CSV ('# key: value' header lines)");
  sub->add_flag("--emit-defaults", o.emit_defaults,
                "print the fastest correct config per mask as kDefaults rows "
                "(src/attention/kernel_config.cpp), to make them the built-in defaults");
  sub->add_option("--emit-kernel-config", o.kernel_config_path,
                  "write the fastest correct config per mask to this kernel-config file (JSON), "
                  "which `train --kernel-config` and `attention --kernel-config` read: the "
                  "winners used without a rebuild (named after the flag that reads it; "
                  "--emit-defaults prints the same winners as source rows)");
  sub->add_option("--worker-timeout", o.worker_timeout_s,
                  "seconds before a job's worker process is killed")
      ->capture_default_str();
  sub->add_option("--max-input-sets", o.max_input_sets,
                  "at most this many input sets rotated past L2 (small shapes)")
      ->capture_default_str();
  sub->add_option("--seed", o.seed, "seed of the check and timing inputs")->capture_default_str();
  sub->add_option("--worker", cmd->worker_job, "internal: run one job (JSON) and print its row")
      ->group("");
  sub->callback([cmd] { run(*cmd); });
}

}  // namespace ft::cli

// `flashtrain compare-loss BASE TEST`: per-step loss alignment of two sets of runs (a baseline
// and a test, e.g. naive and flash attention), paired by case name. The library does the work
// (train/run_report.h); this file parses flags and maps the outcome to the exit status.
#include <cmath>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "report_args.h"
#include "train/run_report.h"

namespace ft::cli {
namespace {

struct CompareLossFlags {
  std::string base, test;
  train::LossThresholds thresholds;
  bool per_step = false;
};

void run(const CompareLossFlags& f) {
  for (const auto& [flag, value] : {std::pair{"--threshold-fp32", f.thresholds.fp32},
                                    std::pair{"--threshold-bf16", f.thresholds.bf16}}) {
    FT_CHECK(std::isfinite(value) && value >= 0, flag, " must be a finite number >= 0, got ",
             value);
  }
  const train::RunSides sides = load_sides_or_exit(f.base, f.test);
  const std::vector<train::CasePair> pairs = sides.pairs();
  const std::vector<train::LossComparison> cases = train::compare_all_losses(pairs, f.thresholds);
  auto logs = [](size_t n) { return str(n, n == 1 ? " log" : " logs"); };
  std::cout << "base: " << f.base << " (" << logs(sides.base.size()) << ")\n"
            << "test: " << f.test << " (" << logs(sides.test.size()) << ")\n\n"
            << train::render_loss_report(cases, f.thresholds);
  if (f.per_step) std::cout << train::render_loss_steps(pairs);
  std::cout.flush();
  const int code = train::loss_exit_code(cases);
  if (code != train::report_ok) throw CLI::RuntimeError(code);
}

}  // namespace

void add_compare_loss_command(CLI::App& app) {
  auto flags = std::make_shared<CompareLossFlags>();
  CLI::App* cmd = app.add_subcommand(
      "compare-loss",
      "Check that two sets of training runs (BASE: the baseline, TEST: e.g. flash attention) "
      "log the same loss at every step, within a threshold per dtype");
  cmd->add_option("BASE", flags->base, kBaseRunsHelp)->required();
  cmd->add_option("TEST", flags->test,
                  "Runs to check against BASE, paired by case name (two single files always "
                  "pair)")
      ->required();
  cmd->add_option("--threshold-fp32", flags->thresholds.fp32,
                  "Largest absolute loss difference allowed at a step of an fp32 case")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--threshold-bf16", flags->thresholds.bf16,
                  "Largest absolute loss difference allowed at a step of a bf16 case")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_flag("--per-step", flags->per_step,
                "Also print every compared step: base loss, test loss, difference");
  cmd->footer(
      "Logs: flashtrain's JSON lines (train --log; the dtype comes from its run line) or "
      "InfiniTrain-style text lines 'step N/M | train loss X | ...' (the dtype comes from the "
      "file name: '_bfloat16' in it means bf16, else fp32). A case fails when a step's loss "
      "differs by more than the threshold, a step is missing on either side (up to the declared "
      "step count), the case is on one side only, or the two sides differ in dtype.\n"
      "Exit status: 0 every case passed; 1 a case failed; 2 bad input (a path that does not "
      "exist, a directory without logs, an empty log, a malformed line: the message names the "
      "file and line).");
  cmd->callback([flags]() { run(*flags); });
}

}  // namespace ft::cli

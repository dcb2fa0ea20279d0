// `flashtrain summarize BASE TEST`: the performance table of two sets of runs (a baseline and a
// test, e.g. naive and flash attention), paired by case name: avg ms, tok/s, peak memory,
// speedup and memory saved, as Markdown or CSV. The library does the work
// (train/run_report.h); this file parses flags and maps the outcome to the exit status.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "core/error.h"
#include "core/output_path.h"
#include "report_args.h"
#include "train/run_report.h"

namespace ft::cli {
namespace {

struct SummarizeFlags {
  std::string base, test, format = "markdown", csv_path;
  train::PerfLabels labels;
  bool include_step1 = false;
};

void run(const SummarizeFlags& f) {
  if (!f.csv_path.empty()) {
    try {
      check_writable_file(f.csv_path, "--csv");  // before the logs are read
    } catch (const Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      throw CLI::RuntimeError(train::report_bad_input);
    }
  }
  const train::RunSides sides = load_sides_or_exit(f.base, f.test);
  const std::vector<train::PerfRow> rows = train::summarize_runs(sides.pairs(), f.include_step1);
  if (!f.csv_path.empty()) {
    std::ofstream out(f.csv_path, std::ios::trunc);
    if (!out.is_open()) {
      std::fprintf(stderr, "error: --csv %s: cannot open for writing\n", f.csv_path.c_str());
      throw CLI::RuntimeError(train::report_bad_input);
    }
    out << train::render_perf_csv(rows);
  }
  std::cout << (f.format == "csv" ? train::render_perf_csv(rows)
                                  : train::render_perf_markdown(rows, f.labels, f.include_step1));
  std::cout.flush();
  const int code = train::perf_exit_code(rows);
  if (code != train::report_ok) throw CLI::RuntimeError(code);
}

}  // namespace

void add_summarize_command(CLI::App& app) {
  auto flags = std::make_shared<SummarizeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "summarize",
      "Performance table of two sets of training runs (BASE: the baseline, TEST: e.g. flash "
      "attention): avg ms, tok/s, peak used and reserved MB, speedup, memory saved");
  cmd->add_option("BASE", flags->base, kBaseRunsHelp)->required();
  cmd->add_option("TEST", flags->test,
                  "Runs to set beside BASE, paired by case name (two single files always pair)")
      ->required();
  cmd->add_flag("--include-step1", flags->include_step1,
                "Average step 1 too (left out by default: it carries the warm-up)");
  cmd->add_option("--format", flags->format, "What to print: markdown or csv")
      ->check(CLI::IsMember({"markdown", "csv"}))
      ->capture_default_str();
  cmd->add_option("--csv", flags->csv_path,
                  "Also write the table as CSV to this file (ratios as fractions, not %)");
  cmd->add_option("--base-label", flags->labels.base, "Name of the BASE side in the Markdown")
      ->capture_default_str();
  cmd->add_option("--test-label", flags->labels.test, "Name of the TEST side in the Markdown")
      ->capture_default_str();
  cmd->footer(
      "Per side: avg ms and avg tok/s are means over the steps, peak used / peak reserved MB the "
      "maxima over the same steps. speedup = base ms / test ms; tok/s gain = test / base - 1; "
      "memory saved = (base - test) / base. Logs without a field show '-'. Logs: as for "
      "compare-loss (flashtrain JSON lines, InfiniTrain-style text lines).\n"
      "Exit status: 0 every case summarized; 1 a case could not be (on one side only, no step "
      "left to average, dtypes differ); 2 bad input (a path that does not exist, a directory "
      "without logs, an empty log, a malformed line: the message names the file and line).");
  cmd->callback([flags]() { run(*flags); });
}

}  // namespace ft::cli

// What compare-loss and summarize share: their BASE/TEST arguments and loading both sides.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "core/error.h"
#include "train/run_report.h"

namespace ft::cli {

inline constexpr const char* kBaseRunsHelp =
    "Baseline runs: a directory (every *.jsonl and *.log inside is one case, named by its file "
    "name without the extension) or one log file";

// Loads BASE and TEST; an unreadable path ends the command with report_bad_input, and the
// errors of logs that did not parse are printed (their cases report them too).
inline train::RunSides load_sides_or_exit(const std::string& base, const std::string& test) {
  train::RunSides sides;
  try {
    sides = train::load_run_sides(base, test);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    throw CLI::RuntimeError(train::report_bad_input);
  }
  for (const std::string& error : sides.log_errors()) {
    std::fprintf(stderr, "error: %s\n", error.c_str());
  }
  return sides;
}

}  // namespace ft::cli

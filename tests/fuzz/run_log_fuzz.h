// Shared by fuzz_text_log and fuzz_json_log: a log parsed from the input goes through what
// compare-loss and summarize do with it, paired with itself and with a complete log. The
// parsers never throw (a bad log carries its error), so nothing is caught here.
#pragma once

#include <sstream>
#include <string>
#include <vector>

#include "train/run_log.h"
#include "train/run_report.h"

namespace ft::fuzz {

inline void report_on(const train::RunLog& log) {
  std::istringstream good_text(
      "step 1/2 | train loss 4.5 | lr 1.00e-04 | (81.50 ms | 25128 tok/s | peak used: 5896 MB | "
      "peak reserved: 5952 MB)\n"
      "step 2/2 | train loss 4.4 | lr 1.00e-04 | (80.00 ms | 25600 tok/s | peak used: 5896 MB | "
      "peak reserved: 5952 MB)\n");
  const train::RunLog good = train::parse_text_log(good_text, log.path);
  const std::vector<train::RunLog> one{log}, other{good};
  for (const auto& [base, test] :
       {std::pair{&one, &one}, std::pair{&one, &other}, std::pair{&other, &one}}) {
    for (const bool two_files : {false, true}) {
      const std::vector<train::CasePair> pairs = train::pair_runs(*base, *test, two_files);
      const std::vector<train::LossComparison> losses =
          train::compare_all_losses(pairs, train::LossThresholds{});
      train::loss_exit_code(losses);
      train::render_loss_report(losses, train::LossThresholds{});
      train::render_loss_steps(pairs);
      for (const bool include_first : {false, true}) {
        const std::vector<train::PerfRow> rows = train::summarize_runs(pairs, include_first);
        train::perf_exit_code(rows);
        train::render_perf_markdown(rows, train::PerfLabels{}, include_first);
        train::render_perf_csv(rows);
      }
    }
  }
}

}  // namespace ft::fuzz

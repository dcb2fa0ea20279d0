// JSON-lines training logs (train/run_log.h), as compare-loss and summarize read them, then
// through both reports.
// Seeds: the JSON-lines logs of tests/fixtures/report (complete, failed, out of memory, broken).
#include "fuzz_util.h"
#include "run_log_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  ft::fuzz::report_on(ft::train::parse_json_lines_log(in, "case.jsonl"));
  return 0;
}

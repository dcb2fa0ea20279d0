// InfiniTrain-style text logs (train/run_log.h), as compare-loss and summarize read them, in
// fp32 and bf16 (the dtype comes from the file name), then through both reports.
// Seeds: the text logs of tests/fixtures/report and lines of every field.
#include "fuzz_util.h"
#include "run_log_fuzz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const char* name : {"case.log", "case_bfloat16.log"}) {
    std::istringstream in(text);
    ft::fuzz::report_on(ft::train::parse_text_log(in, name));
  }
  return 0;
}

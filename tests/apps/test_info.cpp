// `flashtrain info` names the processor and the OpenBLAS core type the run uses, including one
// forced with OPENBLAS_CORETYPE (scripts/test.sh prints it before the tests).
#include <gtest/gtest.h>

#include <string>

#include "core/blas.h"
#include "core/device.h"
#include "test_util.h"

namespace ft {
namespace {

TEST(InfoCli, NamesProcessorCoreTypeAndThreads) {
  const test::CommandResult r = test::run_cli("info");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("processor: " + cpu_model_name() + "\n"), std::string::npos) << r.output;
  EXPECT_NE(cpu_model_name(), "unknown");
  EXPECT_NE(r.output.find("openblas:  core " + cpu::blas_core_name() + " ("), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("openmp:    "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cuda:      "), std::string::npos) << r.output;
}

#if defined(__x86_64__)
// Prescott (SSE3) runs on every x86-64 processor of this project's machines, and is nobody's
// default, so the name can only come from the variable.
TEST(InfoCli, ReportsTheForcedCoreType) {
  const test::CommandResult r =
      test::run_shell(std::string("OPENBLAS_CORETYPE=Prescott '") + FLASHTRAIN_CLI + "' info");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("openblas:  core Prescott ("), std::string::npos) << r.output;
}
#endif

}  // namespace
}  // namespace ft

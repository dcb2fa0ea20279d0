// `flashtrain train --profile [STEP]` as a user types it: the flag with and without a value,
// its errors, and under mpirun the communication row. Then bench/kernel_census.py, the per-kernel
// table of a step from Nsight Compute's CSV, on a CSV written here.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "test_util.h"

namespace ft {
namespace {

const std::string kRun =
    "train --device cpu --model gpt2-tiny --batch-size 2 --seq-len 16 --val-data '' "
    "--sample-tokens 0 ";

TEST(TrainProfileCli, WithoutAValueProfilesTheThirdStep) {
  const test::CommandResult r = test::run_cli(kRun + "--steps 4 --profile");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step profile: step 3, gpt2-tiny on cpu, fp32"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("\ngemm classifier "), std::string::npos);
  EXPECT_NE(r.output.find("\nother (unattributed) "), std::string::npos);
  // The table comes last, after the summary.
  EXPECT_LT(r.output.find("== summary =="), r.output.find("step profile"));
}

TEST(TrainProfileCli, TakesAStepAndFallsBackToTheLast) {
  test::CommandResult r = test::run_cli(kRun + "--steps 4 --profile 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step profile: step 2,"), std::string::npos) << r.output;
  r = test::run_cli(kRun + "--steps 2 --profile");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step profile: step 2,"), std::string::npos) << r.output;
}

TEST(TrainProfileCli, RefusesWhatIsNotAStepOfTheRun) {
  for (const std::string bad : {"0", "x", "2x", "-1"}) {
    const test::CommandResult r = test::run_cli(kRun + "--steps 4 --profile " + bad);
    EXPECT_EQ(r.exit_code, 1) << bad << ": " << r.output;
    EXPECT_NE(r.output.find("--profile"), std::string::npos) << r.output;
  }
  const test::CommandResult r = test::run_cli(kRun + "--steps 4 --profile 5");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("error: --profile STEP must be a step of the run, 1 to 4, got 5"),
            std::string::npos)
      << r.output;
}

TEST(TrainProfileCli, TwoRanksShowTheAllReduce) {
  if (!test::have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/bootstrap.sh installs it)";
  const test::CommandResult r =
      test::run_shell(test::mpirun(2) + "'" + FLASHTRAIN_CLI + "' " + kRun +
                      "--total-batch-size 64 --steps 3 --profile --zero 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\nall-reduce "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\noptimizer "), std::string::npos) << r.output;
}

// Nsight Compute's CSV as `ncu --csv --metrics ...` writes it: tool lines, a header, one row per
// (launch, metric). Two steps (each starts at an embedding_forward launch), a setup launch
// before them; the second step has two launches of one GEMM and a kernel without DRAM metrics.
const char* kNcuCsv =
    "==PROF== Connected to process 1\n"
    "\"ID\",\"Process ID\",\"Process Name\",\"Host Name\",\"Kernel Name\",\"Context\",\"Stream\","
    "\"Block Size\",\"Grid Size\",\"Device\",\"CC\",\"Section Name\",\"Metric Name\","
    "\"Metric Unit\",\"Metric Value\"\n"
    "\"0\",\"1\",\"ft\",\"h\",\"void fill_kernel<float>(float *, long)\",\"1\",\"7\",\"(256, 1, "
    "1)\","
    "\"(1, 1, 1)\",\"0\",\"9.0\",\"m\",\"gpu__time_duration.sum\",\"ns\",\"5,000\"\n"
    "\"1\",\"1\",\"ft\",\"h\",\"void ft::nn::cuda::embedding_forward_kernel<float, 4>(float *)\","
    "\"1\",\"7\",\"(256, 1, 1)\",\"(1, 1, 1)\",\"0\",\"9.0\",\"m\",\"gpu__time_duration.sum\","
    "\"us\",\"10\"\n"
    "\"2\",\"1\",\"ft\",\"h\",\"nvjet_gemm\",\"1\",\"7\",\"(384, 1, 1)\",\"(132, 1, 1)\",\"0\","
    "\"9.0\",\"m\",\"gpu__time_duration.sum\",\"ns\",\"100,000\"\n"
    "\"3\",\"1\",\"ft\",\"h\",\"void ft::nn::cuda::embedding_forward_kernel<float, 4>(float *)\","
    "\"1\",\"7\",\"(256, 1, 1)\",\"(1, 1, 1)\",\"0\",\"9.0\",\"m\",\"gpu__time_duration.sum\","
    "\"ns\",\"20,000\"\n"
    "\"3\",\"1\",\"ft\",\"h\",\"void ft::nn::cuda::embedding_forward_kernel<float, 4>(float *)\","
    "\"1\",\"7\",\"(256, 1, 1)\",\"(1, 1, 1)\",\"0\",\"9.0\",\"m\",\"dram__bytes_read.sum\","
    "\"Mbyte\",\"30\"\n"
    "\"3\",\"1\",\"ft\",\"h\",\"void ft::nn::cuda::embedding_forward_kernel<float, 4>(float *)\","
    "\"1\",\"7\",\"(256, 1, 1)\",\"(1, 1, 1)\",\"0\",\"9.0\",\"m\",\"dram__bytes_write.sum\","
    "\"byte\",\"10,000,000\"\n"
    "\"4\",\"1\",\"ft\",\"h\",\"nvjet_gemm\",\"1\",\"7\",\"(384, 1, 1)\",\"(132, 1, 1)\",\"0\","
    "\"9.0\",\"m\",\"gpu__time_duration.sum\",\"ms\",\"0.2\"\n"
    "\"5\",\"1\",\"ft\",\"h\",\"nvjet_gemm\",\"1\",\"7\",\"(384, 1, 1)\",\"(132, 1, 1)\",\"0\","
    "\"9.0\",\"m\",\"gpu__time_duration.sum\",\"ns\",\"300,000\"\n";

bool have_python() {
  return std::system("python3 --version >/dev/null 2>&1") == 0;
}

TEST(KernelCensus, GroupsTheLastStepsLaunchesByKernel) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  std::ofstream(dir.file("step.csv")) << kNcuCsv;
  const std::string census = "python3 bench/kernel_census.py '" + dir.file("step.csv") + "'";
  test::CommandResult r = test::run_shell(census);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  // Step 2: the embedding (20 us, 40 MB: 2 TB/s) and two GEMM launches (0.2 + 0.3 ms, no DRAM
  // metrics), longest first; the setup launch and step 1 are not in it.
  EXPECT_NE(r.output.find("step 2 of 2: 3 launches, 0.520 ms of kernel time"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("     500.0        2   96.2%         -      -  nvjet_gemm"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("      20.0        1    3.8%      40.0   2.00  "
                          "embedding_forward_kernel<float, 4>"),
            std::string::npos)
      << r.output;
  EXPECT_LT(r.output.find("nvjet_gemm"), r.output.find("embedding_forward_kernel"));
  // Step 1, as JSON: the 10 us embedding (no byte metrics) and one 100 us GEMM.
  r = test::run_shell(census + " --step 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("\"step\": 1, \"steps\": 2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("{\"kernel\": \"nvjet_gemm\", \"launches\": 1, \"seconds\": 0.0001, "
                          "\"bytes\": null}"),
            std::string::npos)
      << r.output;
}

TEST(KernelCensus, BadInputExits2WithTheReason) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  std::ofstream(dir.file("step.csv")) << kNcuCsv;
  std::ofstream(dir.file("not.csv")) << "a,b\n1,2\n";
  const std::string census = "python3 bench/kernel_census.py ";
  struct Bad {
    std::string args, says;
  };
  for (const Bad& bad : {
           Bad{"'" + dir.file("step.csv") + "' --step 3", "the file has steps 1 to 2"},
           Bad{"'" + dir.file("step.csv") + "' --boundary nothing_like_this",
               "no kernel matches the step boundary"},
           Bad{"'" + dir.file("not.csv") + "'", "expected Nsight Compute's CSV header"},
           Bad{"'" + dir.file("missing.csv") + "'", "No such file"},
       }) {
    const test::CommandResult r = test::run_shell(census + bad.args);
    EXPECT_EQ(r.exit_code, 2) << bad.args << ": " << r.output;
    EXPECT_NE(r.output.find(bad.says), std::string::npos) << bad.args << ": " << r.output;
  }
  const test::CommandResult help = test::run_shell(census + "--help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("--boundary"), std::string::npos) << help.output;
}

}  // namespace
}  // namespace ft

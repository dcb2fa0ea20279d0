// `flashtrain train --profile [STEP]` as a user types it: the flag with and without a value,
// its errors, and under mpirun the communication row.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ft

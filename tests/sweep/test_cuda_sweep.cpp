// `flashtrain sweep` end to end on a GPU, on a small shape: every row that runs is checked and,
// when it passes, timed; the reference and the default pass; --emit-defaults prints a row; a
// worker that crashes or faults (FT_SWEEP_INJECT_FAULT) costs only its own row. Skips itself
// without a CUDA build or a GPU.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "core/device.h"
#include "test_util.h"

namespace ft {
namespace {

class CudaSweep : public ::testing::Test {
 protected:
  void SetUp() override {
#ifndef FLASHTRAIN_WITH_CUDA
    GTEST_SKIP() << "built without CUDA";
#else
    if (cuda_device_count() == 0) GTEST_SKIP() << cuda_unavailable_reason();
#endif
  }
};

const char* kSmall =
    "sweep --batch 2 --seq-len 384 --q-heads 4 --kv-heads 2 --head-dim 64 --sliding-window 96 "
    "--documents 3 --warmup 1 --iters 3 --worker-timeout 300 ";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

TEST_F(CudaSweep, SmallShapeEndToEnd) {
  test::TempDir dir;
  const test::CommandResult r =
      test::run_cli(std::string(kSmall) + "--rounds 2 --json '" + dir.file("s.json") + "' --csv '" +
                    dir.file("s.csv") + "' --emit-defaults");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::printf("%s\n", r.output.c_str());
  const nlohmann::json j = read_json(dir.file("s.json"));
  ASSERT_EQ(j["header"]["masks"].size(), 2u);
  int ref_rows = 0, base_rows = 0;
  for (const auto& row : j["rows"]) {
    const std::string status = row["status"];
    EXPECT_NE(status, "error") << row.dump();
    if (status == "refused") continue;
    EXPECT_EQ(status, "checked") << row.dump();
    EXPECT_EQ(row["passed"], row["timed"]) << row.dump();  // only passing rows are timed
    if (row["timed"] == true) {
      EXPECT_TRUE(row["max_abs_diff"].is_number()) << row.dump();  // finite
      EXPECT_LT(row["max_abs_diff"].get<double>(), 1.0) << row.dump();
    }
    if (row["index"] == -1 && row["timed"] == true) {
      EXPECT_DOUBLE_EQ(row["vs_ref"].get<double>(), 1.0);
    }
    if (row["index"] == -1) ++ref_rows;
    const bool base = row["role"] == "base" || row["role"] == "ref=base";
    if (base) ++base_rows;
    if (base || row["index"] == -1) {
      EXPECT_EQ(row["verdict"], "ok") << row.dump();
      EXPECT_GT(row["total_ms"].get<double>(), 0.0);
      EXPECT_GT(row["vs_ref"].get<double>(), 0.0);
      EXPECT_EQ(row["timing"]["fwd"]["round_ms"].size(), 2u);
    }
  }
  EXPECT_EQ(ref_rows, 2);  // one per mask
  EXPECT_GE(base_rows, 1);
  EXPECT_NE(r.output.find("fastest correct: "), std::string::npos);
  EXPECT_NE(r.output.find("\", 256, MaskClass::local, 0, 0, \"fwd="), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("\", 256, MaskClass::dense, 0, 0, \"fwd="), std::string::npos)
      << r.output;
}

TEST_F(CudaSweep, AFaultingWorkerCostsOnlyItsRow) {
  // One mask (causal), the forward axis: candidate 0 (the default) fails on purpose; the other
  // compiled forward tile (64x64, compiled in every build) must still run and pass after it.
  for (const char* fault : {"illegal-address", "abort", "hang"}) {
    SCOPED_TRACE(fault);
    test::TempDir dir;
    setenv("FT_SWEEP_INJECT_FAULT", (std::string(fault) + "@0").c_str(), 1);
    const test::CommandResult r = test::run_cli(
        "sweep --batch 2 --seq-len 384 --q-heads 4 --kv-heads 2 --head-dim 64 --sliding-window 0 "
        "--documents 0 --warmup 1 --iters 3 --sweep forward --worker-timeout 30 --json '" +
        dir.file("s.json") + "'");
    unsetenv("FT_SWEEP_INJECT_FAULT");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json j = read_json(dir.file("s.json"));
    int errors = 0, ok_after = 0;
    for (const auto& row : j["rows"]) {
      if (row["index"] == 0) {
        EXPECT_EQ(row["status"], "error") << row.dump();
        ++errors;
      } else if (row["index"].get<int>() > 0 && row["status"] == "checked") {
        EXPECT_EQ(row["verdict"], "ok") << row.dump();
        ++ok_after;
      }
    }
    EXPECT_EQ(errors, 1);
    EXPECT_GE(ok_after, 1);
    const std::string expected = std::string(fault) == "illegal-address" ? "illegal memory access"
                                 : std::string(fault) == "abort"         ? "signal 6"
                                                                         : "timed out";
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
  }
}

}  // namespace
}  // namespace ft

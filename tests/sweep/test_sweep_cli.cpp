// `flashtrain sweep` from the command line, without a GPU: --dry-run lists every candidate with
// can_implement's verdict for a named architecture, shards and writers work there too, the help
// names the flags, and bad flags fail with one clear line.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "attention/kernel_config.h"
#include "core/device.h"
#include "test_util.h"

namespace ft {
namespace {

int count(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

// Lines of the candidate table: they start with "-" (the reference) or an index.
int table_rows(const std::string& text) {
  const std::regex row(R"(^(-|\d+) +(ref|ref=base|base|forward|backward) )");
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += std::regex_search(line, row) ? 1 : 0;
  return n;
}

TEST(SweepCli, HelpNamesTheFlags) {
  const test::CommandResult r = test::run_cli("sweep --help");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* flag :
       {"--batch",          "--seq-len",   "--q-heads",       "--kv-heads",          "--head-dim",
        "--sliding-window", "--documents", "--sweep",         "--backward-path",     "--all-paths",
        "--warmup",         "--iters",     "--rounds",        "--time-failing",      "--shard",
        "--num-shards",     "--device",    "--gpus",          "--dry-run",           "--arch",
        "--json",           "--csv",       "--emit-defaults", "--emit-kernel-config"}) {
    EXPECT_NE(r.output.find(flag), std::string::npos) << flag;
  }
  EXPECT_EQ(r.output.find("--worker "), std::string::npos) << "internal flag shown";
  EXPECT_NE(test::run_cli("--help").output.find("sweep"), std::string::npos);
}

TEST(SweepCli, DryRunSm90ListsEveryCandidateWithVerdicts) {
  const test::CommandResult r = test::run_cli("sweep --dry-run --arch sm90");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("dry run for sm90 (232448 B"), std::string::npos) << r.output;
  EXPECT_NE(
      r.output.find("base config (the default): fwd=128x128/384/tma/s2/nopp bwd=64x128/384/tma"),
      std::string::npos);
  // A tma backward base is checked against the wgmma 64x64 backward.
  EXPECT_NE(r.output.find("reference row: fwd=64x64/128 bwd=64x64/128/wgmma"), std::string::npos);
  // The reference, the base and every other forward candidate (the mma and wgmma tiles, the
  // other tma plans of head dim 128); the tma backward has one tile, the base's.
  const int rows =
      static_cast<int>(2 + attention::sweep_forward_tiles(attention::ForwardPath::mma).size() +
                       attention::sweep_forward_tiles(attention::ForwardPath::wgmma).size() +
                       attention::sweep_tma_plans(128).size() - 1);
  EXPECT_EQ(table_rows(r.output), rows) << r.output;
  EXPECT_GE(count(r.output, "can run"), 3);  // ref, base and 64x64 forward are always compiled
  EXPECT_NE(r.output.find(std::to_string(rows) + " rows"), std::string::npos);

  // Every path: the mma.sync backward tiles too, refused with can_implement's reasons.
  const test::CommandResult all = test::run_cli("sweep --dry-run --arch sm90 --all-paths");
  ASSERT_EQ(all.exit_code, 0) << all.output;
  EXPECT_NE(all.output.find("refused: backward tile 64x64/256: 8 warps must split"),
            std::string::npos);
  EXPECT_NE(all.output.find("refused: backward tile 256x64/128/double needs 331776 B of shared "
                            "memory; sm90 allows at most 232448 B"),
            std::string::npos)
      << all.output;
  if (!attention::compiled_kernels().sweep_set) {
    EXPECT_NE(all.output.find("refused: forward tile 256x64/256 is not compiled"),
              std::string::npos)
        << all.output;
  }
}

TEST(SweepCli, DryRunSm86RefusesMoreForSharedMemory) {
  const test::CommandResult sm90 = test::run_cli("sweep --dry-run --arch sm90 --all-paths");
  const test::CommandResult sm86 = test::run_cli("sweep --dry-run --arch sm86 --all-paths");
  ASSERT_EQ(sm86.exit_code, 0) << sm86.output;
  EXPECT_NE(sm86.output.find("101376"), std::string::npos);
  EXPECT_GT(count(sm86.output, "B of shared memory"), count(sm90.output, "B of shared memory"));
  // sm86's default is the reference configuration: it is listed once, as the reference.
  EXPECT_NE(sm86.output.find("ref=base"), std::string::npos) << sm86.output;
}

TEST(SweepCli, ShardsPartitionTheDryRun) {
  const int all = table_rows(test::run_cli("sweep --dry-run --arch sm90 --all-paths").output);
  int sum = 0;
  for (int i = 0; i < 3; ++i) {
    const test::CommandResult r = test::run_cli("sweep --dry-run --arch sm90 --all-paths --shard " +
                                                std::to_string(i) + " --num-shards 3");
    ASSERT_EQ(r.exit_code, 0) << r.output;
    sum += table_rows(r.output) - 1;  // each shard lists the reference too
    const std::regex row(R"(^(\d+) +(base|forward|backward) )");
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);) {
      std::smatch m;
      if (std::regex_search(line, m, row)) {
        EXPECT_EQ(std::stoi(m[1]) % 3, i) << line;
      }
    }
  }
  EXPECT_EQ(sum, all - 1);
}

TEST(SweepCli, DryRunWritesJsonAndCsv) {
  test::TempDir dir;
  const test::CommandResult r =
      test::run_cli("sweep --dry-run --arch sm90 --sweep forward --json '" + dir.file("s.json") +
                    "' --csv '" + dir.file("s.csv") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(dir.file("s.json"));
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j["header"]["dry_run"], true);
  EXPECT_EQ(j["header"]["gpus"][0]["arch"], "sm90");
  EXPECT_EQ(j["rows"].size(),
            1u + attention::sweep_forward_tiles(attention::ForwardPath::mma).size() +
                attention::sweep_forward_tiles(attention::ForwardPath::wgmma).size() +
                attention::sweep_tma_plans(128).size());
  for (const auto& row : j["rows"]) {
    const std::string status = row["status"];
    EXPECT_TRUE(status == "planned" || status == "refused") << status;
  }
  std::ifstream csv(dir.file("s.csv"));
  int lines = 0;
  for (std::string line; std::getline(csv, line);) lines += line.rfind("#", 0) == 0 ? 0 : 1;
  EXPECT_EQ(lines, 1 + static_cast<int>(j["rows"].size()));
}

TEST(SweepCli, BadFlagsFailClearly) {
  const struct {
    const char* args;
    const char* says;
  } cases[] = {
      {"sweep --dry-run --arch sm90 --sweep sideways", "--sweep 'sideways'"},
      {"sweep --dry-run --arch sm90 --shard 3 --num-shards 2", "--shard 3"},
      {"sweep --dry-run --arch sm90 --num-shards 0", "--num-shards 0"},
      {"sweep --dry-run --arch sm42", "sm42"},
      {"sweep --dry-run --arch sm90 --backward-path triple", "triple"},
      {"sweep --dry-run --arch sm90 --backward-path single --all-paths", "--all-paths"},
      {"sweep --dry-run --arch sm90 --kv-heads 3", "--kv-heads 3"},
      {"sweep --dry-run --arch sm90 --head-dim 100", "--head-dim 100"},
      {"sweep --dry-run --arch sm90 --gpus some", "--gpus 'some'"},
      {"sweep --arch sm90", "--dry-run"},
      {"sweep --dry-run --arch sm90 --rounds 0", "--rounds 0"},
      {"sweep --dry-run --arch sm90 --emit-kernel-config k.json",
       "--emit-kernel-config k.json: a --dry-run times nothing"},
  };
  for (const auto& c : cases) {
    const test::CommandResult r = test::run_cli(c.args);
    EXPECT_EQ(r.exit_code, 1) << c.args << "\n" << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << c.args << "\n" << r.output;
    EXPECT_EQ(count(r.output, "\n"), 1) << c.args << "\n" << r.output;  // one line
  }
  EXPECT_NE(test::run_cli("sweep --no-such-flag").exit_code, 0);
}

TEST(SweepCli, WithoutAGpuARunSaysHowToDryRun) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  const test::CommandResult run = test::run_cli("sweep");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_NE(run.output.find("--dry-run --arch sm90"), std::string::npos) << run.output;
  const test::CommandResult dry = test::run_cli("sweep --dry-run");
  EXPECT_EQ(dry.exit_code, 1);
  EXPECT_NE(dry.output.find("needs --arch"), std::string::npos) << dry.output;
}

TEST(SweepCli, WorkerReportsItsErrorAsARow) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  // Without a GPU the job fails at once; the worker still prints its one result line.
  const std::string job =
      R"({"shape":{"batch":1,"seq_len":64,"q_heads":2,"kv_heads":1,"head_dim":64,"window":16,)"
      R"("documents":2},"mask":"window","config":"fwd=64x64/128 bwd=64x64/128/double",)"
      R"("reference":"fwd=64x64/128 bwd=64x64/128/double","is_reference":true,)"
      R"("pair_with_reference":true,"check_dir":"/nonexistent","device":0,"warmup":1,"iters":2,)"
      R"("rounds":1,"time_failing":false,"max_input_sets":2,"seed":1})";
  const test::CommandResult r = test::run_cli("sweep --worker '" + job + "'");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  const size_t at = r.output.find("FT_SWEEP_RESULT ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const nlohmann::json row =
      nlohmann::json::parse(r.output.substr(at + 16, r.output.find('\n', at) - at - 16));
  EXPECT_EQ(row["status"], "error");
  EXPECT_EQ(row["verdict"].get<std::string>().rfind("ERROR: ", 0), 0u);
}

}  // namespace
}  // namespace ft

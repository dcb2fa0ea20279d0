// `flashtrain compare-loss` and `flashtrain summarize` on the fixture logs in
// tests/fixtures/report (ours and InfiniTrain-style; aligned, mismatching, a missing step, an
// unpaired case, broken files), and scripts/run_matrix.py on the CPU smoke config.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>

#include "test_util.h"

namespace ft {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = "tests/fixtures/report/";

std::string fixture(const std::string& rel) {
  return kFixtures + rel;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// ---- compare-loss ----

TEST(CompareLossCli, AlignedRunsPass) {
  const test::CommandResult r =
      test::run_cli("compare-loss " + fixture("ours_base") + " " + fixture("ours_flash"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "| gpt2_fp32 | fp32 | 1e-05 | 5 | 5.00e-06 | 5 | - | pass |"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "| gpt2_bf16 | bf16 | 1e-02 | 5 | 6.00e-03 | 4 | - | pass |"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "fp32: 2/2 cases passed (threshold 1e-05)")) << r.output;
  EXPECT_TRUE(contains(r.output, "bf16: 1/1 cases passed (threshold 1e-02)")) << r.output;
  EXPECT_TRUE(contains(r.output, "total: 3/3 cases passed")) << r.output;
}

TEST(CompareLossCli, MismatchMissingStepAndUnpairedCaseFail) {
  const test::CommandResult r =
      test::run_cli("compare-loss " + fixture("ours_base") + " " + fixture("ours_flash_bad"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  // gpt2_fp32 drifts by 2.5e-5 at step 3 and 4e-5 at step 4.
  EXPECT_TRUE(contains(r.output, "| gpt2_fp32 | fp32 | 1e-05 | 5 | 4.00e-05 | 4 | 3 | FAIL |"))
      << r.output;
  EXPECT_TRUE(contains(r.output,
                       "gpt2_fp32: 2 of 5 steps over 1e-05; step 3: base 10.200000 vs "
                       "test 10.200025 (diff 2.50e-05, baseline gradient norm 1.5 = 1x the "
                       "median)"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "gpt2_bf16: steps missing in test: 4")) << r.output;
  EXPECT_TRUE(contains(r.output, "llama3_fp32: only in base")) << r.output;
  EXPECT_TRUE(contains(r.output, "total: 0/3 cases passed")) << r.output;
}

TEST(CompareLossCli, InfiniTrainLogsTakeTheDtypeFromTheFileName) {
  const std::string dirs = fixture("infinitrain_base") + " " + fixture("infinitrain_flash");
  const test::CommandResult r = test::run_cli("compare-loss " + dirs);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  // A 5e-3 drift: over the fp32 threshold, so only the name's _bfloat16 lets it pass.
  EXPECT_TRUE(contains(r.output, "| gpt2_1_bfloat16 | bf16 | 1e-02 | 5 | 5.00e-03 | 2 | - | pass"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "| gpt2_1 | fp32 | 1e-05 | 5 | 2.00e-06 | 4 | - | pass |"))
      << r.output;

  const test::CommandResult strict =
      test::run_cli("compare-loss " + dirs + " --threshold-bf16 1e-3 --threshold-fp32 1e-6");
  EXPECT_EQ(strict.exit_code, 1) << strict.output;
  EXPECT_TRUE(contains(strict.output, "| gpt2_1_bfloat16 | bf16 | 1e-03 | 5 | 5.00e-03 | 2 | 2 |"))
      << strict.output;
  EXPECT_TRUE(contains(strict.output, "fp32: 0/1 cases passed (threshold 1e-06)")) << strict.output;
}

TEST(CompareLossCli, SingleFilesPairAcrossFormats) {
  // Our JSON log against the same losses as text lines.
  test::TempDir dir;
  std::ofstream(dir.file("flash.log"))
      << "step    1/5 | train loss 10.900000 | lr 1.00e-04 | (80.00 ms | 1250 tok/s)\n"
         "step    2/5 | train loss 10.500000 | lr 1.00e-04 | (25.00 ms | 4000 tok/s)\n"
         "step    3/5 | train loss 10.200000 | lr 1.00e-04 | (25.00 ms | 4000 tok/s)\n"
         "step    4/5 | train loss 9.900000 | lr 1.00e-04 | (25.00 ms | 4000 tok/s)\n"
         "step    5/5 | train loss 9.700000 | lr 1.00e-04 | (25.00 ms | 4000 tok/s)\n";
  const test::CommandResult r =
      test::run_cli("compare-loss " + fixture("ours_base/gpt2_fp32.jsonl") + " '" +
                    dir.file("flash.log") + "' --per-step");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "| gpt2_fp32 | fp32 | 1e-05 | 5 |")) << r.output;
  EXPECT_TRUE(contains(r.output, "| 3 | 10.200000 | 10.200000 | 0.00e+00 |")) << r.output;
}

TEST(CompareLossCli, BadInputExits2NamingFileAndLine) {
  const std::string good = fixture("ours_base/gpt2_fp32.jsonl");
  const struct {
    std::string file, expected;
  } cases[] = {
      {"broken/empty.jsonl", "broken/empty.jsonl: the file is empty"},
      {"broken/run_only.jsonl", "broken/run_only.jsonl: no step records after the run line"},
      {"broken/malformed.jsonl", "broken/malformed.jsonl:3: not valid JSON (column 66"},
      {"broken/bad_field.jsonl",
       "broken/bad_field.jsonl:3: \"train_loss\": expected a number, got \"10.5\""},
      {"broken/bad_loss.log",
       "broken/bad_loss.log:3: expected a number after 'train loss', got '4.5O3331'"},
  };
  for (const auto& c : cases) {
    const test::CommandResult r = test::run_cli("compare-loss " + fixture(c.file) + " " + good);
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "error: tests/fixtures/report/" + c.expected)) << r.output;
  }
  test::TempDir empty_dir;
  const test::CommandResult none =
      test::run_cli("compare-loss '" + empty_dir.path().string() + "' " + good);
  EXPECT_EQ(none.exit_code, 2) << none.output;
  EXPECT_TRUE(contains(none.output, "no *.jsonl or *.log files in this directory")) << none.output;
  const test::CommandResult missing = test::run_cli("compare-loss no/such/dir " + good);
  EXPECT_EQ(missing.exit_code, 2) << missing.output;
  EXPECT_TRUE(contains(missing.output, "error: no/such/dir: no such file or directory"));
  // A bad log among good ones: the others are still compared.
  const test::CommandResult mixed =
      test::run_cli("compare-loss " + fixture("broken") + " " + fixture("ours_base"));
  EXPECT_EQ(mixed.exit_code, 2) << mixed.output;
  EXPECT_TRUE(contains(mixed.output, "gpt2_fp32: only in test")) << mixed.output;
}

TEST(CompareLossCli, HelpDocumentsTheExitStatus) {
  for (const char* cmd : {"compare-loss", "summarize"}) {
    const test::CommandResult r = test::run_cli(std::string(cmd) + " --help");
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_TRUE(contains(r.output, "Exit status: 0")) << r.output;
    EXPECT_TRUE(contains(r.output, "2 bad input")) << r.output;
  }
}

// ---- summarize ----

TEST(SummarizeCli, MarkdownAndCsv) {
  test::TempDir dir;
  const std::string dirs = fixture("ours_base") + " " + fixture("ours_flash");
  const test::CommandResult md =
      test::run_cli("summarize " + dirs + " --csv '" + dir.file("summary.csv") + "'");
  EXPECT_EQ(md.exit_code, 0) << md.output;
  // Steps 2-5: 50 vs 25 ms, 2000 vs 4000 tok/s, 800 vs 600 MB used, 1000 vs 800 MB reserved.
  EXPECT_TRUE(contains(md.output,
                       "| gpt2_fp32 | fp32 | 4 | 50.00 | 25.00 | 2.00x | 2000 | 4000 | +100.0% | "
                       "800 | 600 | +25.0% | 200 | 1000 | 800 | +20.0% |"))
      << md.output;
  EXPECT_TRUE(contains(md.output, "| case | dtype | steps | avg ms (baseline) | avg ms (flash) |"))
      << md.output;

  const test::CommandResult csv = test::run_cli("summarize " + dirs + " --format csv");
  EXPECT_EQ(csv.exit_code, 0) << csv.output;
  EXPECT_EQ(csv.output, read_file(dir.file("summary.csv")));
  EXPECT_TRUE(contains(csv.output,
                       "\ngpt2_bf16,bf16,4,4,50,25,2,2000,4000,1,800,600,0.25,1000,800,"
                       "0.2,200,,,,,\n"))
      << csv.output;

  // Step 1 (100 vs 80 ms) counted: 60 vs 36 ms.
  const test::CommandResult with1 = test::run_cli("summarize " + dirs + " --include-step1");
  EXPECT_EQ(with1.exit_code, 0) << with1.output;
  EXPECT_TRUE(contains(with1.output, "| gpt2_fp32 | fp32 | 5 | 60.00 | 36.00 | 1.67x |"))
      << with1.output;
}

TEST(SummarizeCli, InfiniTrainLogsWithoutMemoryShowDashes) {
  const test::CommandResult r =
      test::run_cli("summarize " + fixture("infinitrain_base") + " " +
                    fixture("infinitrain_flash") + " --base-label naive --test-label flash");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "avg ms (naive)")) << r.output;
  EXPECT_TRUE(contains(r.output, "| gpt2_1 | fp32 | 4 | 126.39 | 98.35 | 1.29x |")) << r.output;
  EXPECT_TRUE(contains(r.output, "| - | - | - | - | - | - | - |")) << r.output;
  EXPECT_TRUE(contains(r.output, "| 3770 | 3100 | +17.8% | 670 | 3808 | 3200 | +16.0% |"))
      << r.output;
}

// A baseline that ran out of memory is a result: both reports say so and exit 0.
TEST(SummarizeCli, ABaselineOutOfMemoryIsReportedAndExits0) {
  const std::string dirs = fixture("oom_base") + " " + fixture("oom_flash");
  const test::CommandResult loss = test::run_cli("compare-loss " + dirs);
  EXPECT_EQ(loss.exit_code, 0) << loss.output;
  EXPECT_TRUE(contains(loss.output, "| llama_s8192 | bf16 | 1e-02 | 0 | - | - | - | base OOM |"))
      << loss.output;
  EXPECT_TRUE(
      contains(loss.output, "- llama_s8192: in step 1: out of GPU memory: asked for 8192 MB"))
      << loss.output;
  EXPECT_TRUE(contains(loss.output, "total: 0/1 cases passed, 1 not compared (base out of memory)"))
      << loss.output;

  const test::CommandResult perf = test::run_cli("summarize " + dirs);
  EXPECT_EQ(perf.exit_code, 0) << perf.output;
  EXPECT_TRUE(
      contains(perf.output,
               "| llama_s8192 | bf16 | 2 | OOM | 200.00 | - | OOM | 40960 | - | OOM | 40000 "
               "| - | - | OOM | 40100 | - |"))
      << perf.output;

  // The other way round the flash run did not fit: that fails.
  const test::CommandResult reversed =
      test::run_cli("compare-loss " + fixture("oom_flash") + " " + fixture("oom_base"));
  EXPECT_EQ(reversed.exit_code, 1) << reversed.output;
  EXPECT_TRUE(contains(reversed.output, "the test run stopped in step 1: out of GPU memory"))
      << reversed.output;
}

TEST(SummarizeCli, UnpairedCaseExits1AndBadInputExits2) {
  const test::CommandResult r =
      test::run_cli("summarize " + fixture("ours_base") + " " + fixture("ours_flash_bad"));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "Not summarized:\n- llama3_fp32: only in base")) << r.output;
  EXPECT_TRUE(contains(r.output, "| gpt2_bf16 | bf16 | 4 / 3 |")) << r.output;

  const test::CommandResult bad = test::run_cli("summarize " + fixture("broken/malformed.jsonl") +
                                                " " + fixture("ours_base/gpt2_fp32.jsonl"));
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(contains(bad.output, "error: tests/fixtures/report/broken/malformed.jsonl:3:"))
      << bad.output;
}

// ---- the run matrix ----

bool have_python() {
  return std::system("python3 --version >/dev/null 2>&1") == 0;
}

std::string matrix_command(const std::string& config, const std::string& logdir) {
  return "python3 scripts/run_matrix.py '" + config + "' --logdir '" + logdir + "' --cli '" +
         FLASHTRAIN_CLI + "'";
}

TEST(RunMatrix, CpuSmokeConfigRunsComparesAndSummarizes) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  const fs::path logdir = dir.path() / "smoke";
  const test::CommandResult r = test::run_shell(
      "OMP_NUM_THREADS=2 " + matrix_command("configs/cpu_smoke.json", logdir.string()));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const char* cases[] = {"gpt2-tiny_fp32", "gpt2-tiny_bf16", "llama3-tiny_fp32",
                         "llama3-tiny_bf16"};
  for (const char* group : {"baseline", "flash"}) {
    for (const char* name : cases) {
      const fs::path log = logdir / group / (std::string(name) + ".jsonl");
      EXPECT_TRUE(fs::exists(log)) << log;
      EXPECT_TRUE(fs::exists(logdir / group / (std::string(name) + ".out")));
    }
  }
  const nlohmann::json env = nlohmann::json::parse(read_file(logdir / "environment.json"));
  for (const char* key : {"gpu", "driver", "nvcc_on_path", "compiler_in_binary", "git_commit"}) {
    EXPECT_TRUE(env.contains(key)) << key;
  }
  EXPECT_FALSE(env["compiler_in_binary"].empty()) << env.dump();
  const nlohmann::json matrix = nlohmann::json::parse(read_file(logdir / "matrix.json"));
  ASSERT_EQ(matrix["cases"].size(), 8u);
  for (const auto& c : matrix["cases"]) EXPECT_EQ(c["status"], "ok") << c.dump();

  const std::string compare = read_file(logdir / "compare-loss_baseline_vs_flash.md");
  EXPECT_TRUE(contains(compare, "fp32: 2/2 cases passed (threshold 1e-05)")) << compare;
  EXPECT_TRUE(contains(compare, "bf16: 2/2 cases passed (threshold 1e-02)")) << compare;
  EXPECT_TRUE(contains(compare, "total: 4/4 cases passed")) << compare;
  const std::string summary = read_file(logdir / "summary_baseline_vs_flash.md");
  for (const char* name : cases) {
    EXPECT_TRUE(contains(summary, "| " + std::string(name) + " |")) << summary;
  }
  const std::string csv = read_file(logdir / "summary_baseline_vs_flash.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5) << csv;
  EXPECT_TRUE(contains(r.output, "matrix: 8/8 cases ran")) << r.output;
}

// Binaries carried to the GPU machine name their commit in GIT_COMMIT beside them
// (scripts/build_gpu.sh); the environment record takes it over the checkout's.
TEST(RunMatrix, RecordsTheCommitTheBinaryWasBuiltFrom) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  fs::create_symlink(FLASHTRAIN_CLI, dir.path() / "flashtrain");
  std::ofstream(dir.file("GIT_COMMIT")) << "0123abcd dirty\n";
  std::ofstream(dir.file("config.json")) << R"({
    "defaults": {"device": "cpu", "batch": 1, "seq_len": 8, "steps": 1,
                 "flags": ["--val-data", "", "--sample-tokens", "0"]},
    "cases": [{"name": "tiny", "model": "gpt2-tiny", "dtype": "fp32"}],
    "groups": {"baseline": {"attention": "naive"}}
  })";
  const fs::path logdir = dir.path() / "logs";
  const test::CommandResult r = test::run_shell(
      "OMP_NUM_THREADS=2 python3 scripts/run_matrix.py '" + dir.file("config.json") +
      "' --logdir '" + logdir.string() + "' --cli '" + dir.file("flashtrain") + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const nlohmann::json env = nlohmann::json::parse(read_file(logdir / "environment.json"));
  EXPECT_EQ(env["git_commit"], "0123abcd") << env.dump();
  EXPECT_EQ(env["git_dirty"], true);
  EXPECT_EQ(env["git_commit_source"], "binary");
}

TEST(RunMatrix, GoesOnPastAFailedCaseAndSaysSo) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << R"({
    "defaults": {"device": "cpu", "batch": 1, "seq_len": 8, "steps": 2,
                 "flags": ["--val-data", "", "--sample-tokens", "0"]},
    "cases": [
      {"name": "broken", "model": "no-such-model", "dtype": "fp32"},
      {"name": "tiny", "model": "gpt2-tiny", "dtype": "fp32"}
    ],
    "groups": {"baseline": {"attention": "naive"}, "flash": {"attention": "flash"}},
    "compare": [{"base": "baseline", "test": "flash"}]
  })";
  const std::string logdir = dir.file("runs");
  const test::CommandResult r = test::run_shell(matrix_command(dir.file("config.json"), logdir));
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_TRUE(contains(r.output, "FAILED: baseline/broken")) << r.output;
  EXPECT_TRUE(contains(r.output, "continuing with the next case")) << r.output;
  EXPECT_TRUE(contains(r.output, "matrix: 2/4 cases ran")) << r.output;
  EXPECT_TRUE(contains(r.output, "failed case: flash/broken")) << r.output;
  EXPECT_TRUE(fs::exists(fs::path(logdir) / "flash" / "tiny.jsonl"));
  EXPECT_TRUE(contains(read_file(fs::path(logdir) / "compare-loss_baseline_vs_flash.md"),
                       "total: 1/1 cases passed"));
}

// A case whose log records that it ran out of memory is a result, not a failed case: the
// matrix says so and leaves the judgement to the reports. A stand-in CLI plays the GPU run: its
// naive training stops out of memory in step 1, its flash training writes a complete log, and
// the reports are the real CLI's.
TEST(RunMatrix, ABaselineOutOfMemoryIsAResultNotAFailure) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  const std::string cli = dir.file("flashtrain");
  std::ofstream(cli) << "#!/bin/sh\n"
                        "[ \"$1\" = train ] || exec '" FLASHTRAIN_CLI
                        "' \"$@\"\n"
                        "while [ $# -gt 0 ]; do\n"
                        "  case \"$1\" in --log) log=$2;; --attention) att=$2;; esac; shift\n"
                        "done\n"
                        "if [ \"$att\" = naive ]; then\n"
                        "  cp '" +
                            test::source_path("tests/fixtures/report/oom_base/llama_s8192.jsonl") +
                            "' \"$log\"\n"
                            "  echo 'error: out of GPU memory' >&2; exit 1\n"
                            "fi\n"
                            "cp '" +
                            test::source_path("tests/fixtures/report/oom_flash/llama_s8192.jsonl") +
                            "' \"$log\"\n";
  fs::permissions(cli, fs::perms::owner_all);
  std::ofstream(dir.file("config.json")) << R"({
    "defaults": {"device": "cuda", "batch": 1, "seq_len": 8192, "steps": 3},
    "cases": [{"name": "big", "model": "llama3-1b", "dtype": "bf16"}],
    "groups": {"baseline": {"attention": "naive"}, "flash": {"attention": "flash"}},
    "compare": [{"base": "baseline", "test": "flash"}]
  })";
  const std::string logdir = dir.file("runs");
  const test::CommandResult r =
      test::run_shell("python3 scripts/run_matrix.py '" + dir.file("config.json") + "' --logdir '" +
                      logdir + "' --cli '" + cli + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "baseline/big ... out of memory in step 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "out of memory: baseline/big (its log says so")) << r.output;
  EXPECT_FALSE(contains(r.output, "FAILED")) << r.output;
  EXPECT_TRUE(contains(r.output, "| big | bf16 | 1e-02 | 0 | - | - | - | base OOM |")) << r.output;
  EXPECT_TRUE(contains(r.output, "| big | bf16 | 2 | OOM | 200.00 |")) << r.output;
}

TEST(RunMatrix, BadConfigExits2WithWhereAndWhat) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << R"({
    "cases": [{"name": "a", "model": "gpt2-tiny", "dtype": "fp16", "batch": 1, "seq_len": 8,
               "steps": 1}],
    "groups": {"baseline": {"attention": "naive"}}
  })";
  const test::CommandResult r =
      test::run_shell(matrix_command(dir.file("config.json"), dir.file("runs")));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "groups.baseline, case 1: dtype 'fp16': expected fp32 or bf16"))
      << r.output;
  EXPECT_FALSE(fs::exists(dir.file("runs")));
}

// --plot promises plots: without matplotlib the matrix is refused before any case runs.
TEST(RunMatrix, PlotWithoutMatplotlibIsRefusedBeforeAnyCase) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  fs::create_directories(dir.path() / "no_mpl");
  std::ofstream(dir.path() / "no_mpl" / "matplotlib.py") << "raise ImportError('absent')\n";
  std::ofstream(dir.file("config.json")) << R"({
    "defaults": {"device": "cpu", "batch": 1, "seq_len": 8, "steps": 1,
                 "flags": ["--val-data", "", "--sample-tokens", "0"]},
    "cases": [{"name": "tiny", "model": "gpt2-tiny", "dtype": "fp32"}],
    "groups": {"baseline": {"attention": "naive"}, "flash": {"attention": "flash"}},
    "compare": [{"base": "baseline", "test": "flash"}]
  })";
  const test::CommandResult r =
      test::run_shell("PYTHONPATH='" + dir.file("no_mpl") + "' " +
                      matrix_command(dir.file("config.json"), dir.file("runs")) + " --plot");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "error: --plot needs matplotlib")) << r.output;
  EXPECT_FALSE(fs::exists(dir.file("runs"))) << "no case may run";
}

// ---- plots ----

TEST(PlotRuns, DrawsLossAndPerfPngsOrSaysMatplotlibIsMissing) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  // A stand-in matplotlib that fails to import, first on the path.
  fs::create_directories(dir.path() / "no_mpl");
  std::ofstream(dir.path() / "no_mpl" / "matplotlib.py") << "raise ImportError('absent')\n";
  const std::string args = "scripts/plot_runs.py " + fixture("ours_base") + " " +
                           fixture("ours_flash") + " --out '" + dir.file("plots") + "'";
  const test::CommandResult none =
      test::run_shell("PYTHONPATH='" + dir.file("no_mpl") + "' python3 " + args);
  EXPECT_EQ(none.exit_code, 3) << none.output;
  EXPECT_TRUE(contains(none.output, "needs matplotlib")) << none.output;
  EXPECT_FALSE(fs::exists(dir.file("plots")));

  if (test::run_shell("python3 -c 'import matplotlib'").exit_code != 0) {
    GTEST_SKIP() << "matplotlib not installed: only the message was checked";
  }
  const std::string csv = dir.file("summary.csv");
  ASSERT_EQ(test::run_cli("summarize " + fixture("ours_base") + " " + fixture("ours_flash") +
                          " --csv '" + csv + "'")
                .exit_code,
            0);
  const test::CommandResult r = test::run_shell("python3 " + args + " --summary '" + csv + "'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  for (const char* png : {"loss_gpt2_fp32.png", "loss_gpt2_bf16.png", "perf.png"}) {
    EXPECT_GT(fs::file_size(dir.path() / "plots" / png), 1000u) << png;
  }
}

}  // namespace
}  // namespace ft

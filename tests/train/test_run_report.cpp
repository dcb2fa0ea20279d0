// Reading run logs back (our JSON lines, InfiniTrain-style text) and the baseline-vs-test
// reports: loss alignment per dtype threshold, missing steps, unpaired cases, and the
// performance table's averages, ratios and step-1 rule.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "train/run_report.h"
#include "train/step_log.h"

namespace ft::train {
namespace {

std::string run_line(const std::string& dtype) {
  return R"({"event":"run","model":"gpt2-tiny","dtype":")" + dtype + R"(","steps":4})";
}

// A JSON-lines log as the trainer writes it (step_log.h), from losses and step times.
// declared_steps: the run's "steps" (default: as many as there are losses).
std::string json_log(const std::string& dtype, const std::vector<double>& losses,
                     const std::vector<double>& ms = {}, double used_mb = 100.0,
                     int64_t declared_steps = 0, const std::vector<double>& grad_norms = {}) {
  std::string out = run_line(dtype) + "\n";
  for (size_t i = 0; i < losses.size(); ++i) {
    StepRecord r;
    r.step = static_cast<int64_t>(i) + 1;
    r.total_steps = declared_steps > 0 ? declared_steps : static_cast<int64_t>(losses.size());
    r.train_loss = losses[i];
    r.lr = 1e-4;
    r.ms = ms.empty() ? 10.0 : ms[i];
    r.tokens_per_second = 1000.0 / r.ms * 64.0;
    r.peak_used_mb = used_mb;
    r.peak_reserved_mb = used_mb + 20.0;
    if (!grad_norms.empty()) r.grad_norm = grad_norms[i];
    out += to_json(r).dump() + "\n";
  }
  return out + R"({"event":"summary","steps":4})" + "\n";
}

// The log of a run that logged `losses` and then stopped in the next step (trainer.cpp).
std::string stopped_log(const std::string& dtype, const std::vector<double>& losses,
                        int64_t declared_steps, const std::string& kind,
                        const std::string& message) {
  std::string out = json_log(dtype, losses, {}, 100.0, declared_steps);
  out = out.substr(0, out.find(R"({"event":"summary")"));
  nlohmann::json e = {{"event", "error"},
                      {"step", static_cast<int64_t>(losses.size()) + 1},
                      {"kind", kind},
                      {"message", message}};
  return out + e.dump() + "\n";
}

RunLog parse_json(const std::string& text, const std::string& path = "case.jsonl") {
  std::istringstream in(text);
  return parse_json_lines_log(in, path);
}

RunLog parse_text(const std::string& text, const std::string& path = "case.log") {
  std::istringstream in(text);
  return parse_text_log(in, path);
}

// ---- reading logs ----

TEST(RunLog, ReadsOurJsonLines) {
  const RunLog log = parse_json(json_log("bf16", {10.5, 10.25, 10.0}), "runs/flash/gpt2_s64.jsonl");
  ASSERT_TRUE(log.ok()) << log.error;
  EXPECT_EQ(log.name, "gpt2_s64");
  EXPECT_EQ(log.format, LogFormat::json_lines);
  EXPECT_EQ(log.dtype, "bf16");
  ASSERT_EQ(log.steps.size(), 3u);
  EXPECT_EQ(log.steps[1].step, 2);
  EXPECT_EQ(log.steps[1].total_steps, 3);
  EXPECT_DOUBLE_EQ(log.steps[1].train_loss, 10.25);
  EXPECT_DOUBLE_EQ(*log.steps[1].ms, 10.0);
  EXPECT_DOUBLE_EQ(*log.steps[1].peak_reserved_mb, 120.0);
  EXPECT_EQ(log.steps[1].line, 3);
}

TEST(RunLog, ReadsTheTrainersTextLine) {
  // Our own text line (format_step_line) is the InfiniTrain format.
  StepRecord r;
  r.step = 2;
  r.total_steps = 30;
  r.train_loss = 4.560387;
  r.lr = 1e-4;
  r.ms = 81.5;
  r.tokens_per_second = 25128;
  r.peak_used_mb = 5896;
  r.peak_reserved_mb = 5952;
  const RunLog log = parse_text("model: gpt2\n" + format_step_line(r) + "\nval loss 4.2\n");
  ASSERT_TRUE(log.ok()) << log.error;
  ASSERT_EQ(log.steps.size(), 1u);
  const LoggedStep& s = log.steps[0];
  EXPECT_EQ(s.step, 2);
  EXPECT_EQ(s.total_steps, 30);
  EXPECT_DOUBLE_EQ(s.train_loss, 4.560387);
  EXPECT_DOUBLE_EQ(*s.lr, 1e-4);
  EXPECT_DOUBLE_EQ(*s.ms, 81.5);
  EXPECT_DOUBLE_EQ(*s.tokens_per_second, 25128);
  EXPECT_DOUBLE_EQ(*s.peak_used_mb, 5896);
  EXPECT_DOUBLE_EQ(*s.peak_reserved_mb, 5952);
  EXPECT_EQ(s.line, 2);
}

TEST(RunLog, ReadsInfiniTrainLinesWithPrefixAndExtraFields) {
  const RunLog log = parse_text(
      "[COMMAND] ./gpt2 --dtype bfloat16\n"
      "E20260315 22:09:04.648366 1401 main.cc:386] step    1/20 | train loss 4.483155 | lr "
      "1.00e-04 | (142.77 ms | 7172 tok/s | peak used:  3770 MB | peak reserved:  3808 MB, DP=1, "
      "TP=1, SP=1, PP=1)\n"
      "E20250930 22:04:04.543396 1399 main.cc:237] step    2/20 | train loss 5.062500 | lr "
      "1.00e-04 | (119.62 ms | 2140 tok/s)\n"
      "steps 2 | final train loss 5.0625 | 2140 tok/s\n"
      "[profile] step 2/20 done\n",
      "logs/gpt2_1_bfloat16.log");
  ASSERT_TRUE(log.ok()) << log.error;
  EXPECT_EQ(log.dtype, "bf16");
  ASSERT_EQ(log.steps.size(), 2u);
  EXPECT_DOUBLE_EQ(*log.steps[0].peak_reserved_mb, 3808);
  EXPECT_DOUBLE_EQ(*log.steps[1].ms, 119.62);
  EXPECT_FALSE(log.steps[1].peak_used_mb.has_value());
}

TEST(RunLog, TextDtypeComesFromTheFileNameAsInfiniTrainDoes) {
  EXPECT_EQ(dtype_from_file_name("logs/gpt2_1_bfloat16.log"), "bf16");
  EXPECT_EQ(dtype_from_file_name("logs/gpt2_1_bfloat16_profile.log"), "bf16");
  EXPECT_EQ(dtype_from_file_name("logs/gpt2_1.log"), "fp32");
  EXPECT_EQ(dtype_from_file_name("logs/gpt2_bf16.log"), "fp32");      // InfiniTrain's rule exactly
  EXPECT_EQ(dtype_from_file_name("logs_bfloat16/gpt2.log"), "fp32");  // the name, not the dir
}

TEST(RunLog, MalformedJsonNamesFileLineAndExpectation) {
  const std::string good = json_log("fp32", {1.0, 2.0});
  const struct {
    std::string text, expected;
  } cases[] = {
      {"", "case.jsonl: the file is empty"},
      {run_line("fp32") + "\n", "no step records"},
      {"\n" + run_line("fp32") + "\n{\"step\": 1, \"train_loss\": \n",
       "case.jsonl:3: not valid JSON"},
      {run_line("fp32") + "\n{\"step\": 1, \"train_loss\": \"2.0\"}\n",
       "case.jsonl:2: \"train_loss\": expected a number, got \"2.0\""},
      {run_line("fp32") + "\n{\"step\": 0, \"train_loss\": 2.0}\n",
       "case.jsonl:2: \"step\": expected an integer >= 1"},
      {run_line("fp32") + "\n{\"step\": 1, \"train_loss\": 2.0, \"ms\": null}\n",
       "case.jsonl:2: \"ms\": expected a number, got null"},
      {run_line("fp32") + "\n{\"loss\": 2.0}\n", "case.jsonl:2: expected a step record"},
      {run_line("fp32") + "\n[1, 2]\n", "case.jsonl:2: expected a JSON object, got array"},
      {"{\"step\": 1, \"train_loss\": 2.0}\n", "case.jsonl:1: expected the {\"event\": \"run\""},
      {R"({"event":"run","dtype":"fp64"})", "case.jsonl:1: dtype \"fp64\": expected fp32 or bf16"},
      {R"({"event":"run"})", "case.jsonl:1: the run line needs \"dtype\""},
      {good + run_line("fp32") + "\n", "case.jsonl:5: a second {\"event\": \"run\"} line"},
      {run_line("fp32") + "\n{\"step\":1,\"train_loss\":2}\n{\"step\":1,\"train_loss\":2}\n",
       "case.jsonl:3: step 1 appears twice (first on line 2)"},
  };
  for (const auto& c : cases) {
    const RunLog log = parse_json(c.text);
    EXPECT_FALSE(log.ok()) << c.text;
    EXPECT_NE(log.error.find(c.expected), std::string::npos)
        << "got: " << log.error << "\nexpected: " << c.expected;
  }
}

TEST(RunLog, MalformedTextNamesFileLineAndExpectation) {
  const struct {
    std::string text, expected;
  } cases[] = {
      {"", "case.log: no step lines"},
      {"just a banner\n", "case.log: no step lines"},
      {"{\"event\":\"run\",\"dtype\":\"fp32\"}\n", "it looks like JSON lines; name it *.jsonl"},
      {"x\nstep 3/5 | train loss 4.5O3 | lr 1e-4\n",
       "case.log:2: expected a number after 'train loss', got '4.5O3'"},
      {"step 3/5 | val loss 4.1\n",
       "case.log:1: expected '| train loss <number>' after 'step 3/5'"},
      {"step 3/5 | train loss 4.1 | (fast ms | 100 tok/s)\n",
       "case.log:1: expected a number in the ms field, got 'fast ms'"},
      {"step 3/5 | train loss 4.1 | (1 ms | 100 tok/s | peak used: lots MB)\n",
       "expected a number in the peak used field"},
      {"step 1/5 | train loss 4.1\nstep 1/5 | train loss 4.1\n",
       "case.log:2: step 1 appears twice (first on line 1)"},
  };
  for (const auto& c : cases) {
    const RunLog log = parse_text(c.text);
    EXPECT_FALSE(log.ok()) << c.text;
    EXPECT_NE(log.error.find(c.expected), std::string::npos)
        << "got: " << log.error << "\nexpected: " << c.expected;
  }
}

TEST(RunLog, TextNanLossIsReadAndFailsTheComparison) {
  const RunLog base = parse_text("step 1/2 | train loss 4.0\nstep 2/2 | train loss 3.9\n");
  const RunLog test = parse_text("step 1/2 | train loss 4.0\nstep 2/2 | train loss nan\n");
  ASSERT_TRUE(test.ok()) << test.error;
  const LossComparison c = compare_losses({"case", &base, &test}, {});
  EXPECT_FALSE(c.passed());
  EXPECT_EQ(c.first_step_over(), 2);
  EXPECT_TRUE(std::isinf(c.max_abs_diff));
}

TEST(RunLog, ReadsTheErrorLineOfARunThatStopped) {
  const RunLog oom = parse_json(
      stopped_log("bf16", {}, 20, "out_of_memory", "out of GPU memory: asked for 8192 MB"));
  ASSERT_TRUE(oom.ok()) << oom.error;  // no step, but it says why: a valid log
  ASSERT_TRUE(oom.failure.has_value());
  EXPECT_TRUE(oom.failure->out_of_memory());
  EXPECT_EQ(oom.failure->step, 1);
  EXPECT_EQ(oom.failure->line, 2);
  EXPECT_EQ(oom.failure->message, "out of GPU memory: asked for 8192 MB");

  const RunLog diverged =
      parse_json(stopped_log("fp32", {10.0, 9.0}, 5, "error", "training diverged"));
  ASSERT_TRUE(diverged.ok()) << diverged.error;
  EXPECT_EQ(diverged.steps.size(), 2u);
  EXPECT_EQ(diverged.failure->step, 3);
  EXPECT_FALSE(diverged.failure->out_of_memory());

  const RunLog bad = parse_json(run_line("fp32") + "\n" + R"({"event":"error","step":1})" + "\n");
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.error.find("case.jsonl:2: the error line needs \"kind\" (a string)"),
            std::string::npos)
      << bad.error;
}

TEST(RunLog, LoadRunsReadsADirectoryAndRefusesTwoLogsOfOneCase) {
  test::TempDir dir;
  EXPECT_THROW(load_runs(dir.file("missing")), Error);
  EXPECT_THROW(load_runs(dir.path().string()), Error);  // no logs
  {
    std::ofstream(dir.file("b.jsonl")) << json_log("fp32", {1.0});
    std::ofstream(dir.file("a_bfloat16.log")) << "step 1/1 | train loss 1.0\n";
    std::ofstream(dir.file("b.out")) << "not a log\n";
  }
  const std::vector<RunLog> runs = load_runs(dir.path().string());
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].name, "a_bfloat16");
  EXPECT_EQ(runs[0].dtype, "bf16");
  EXPECT_EQ(runs[1].name, "b");
  std::ofstream(dir.file("b.log")) << "step 1/1 | train loss 1.0\n";
  try {
    load_runs(dir.path().string());
    FAIL() << "expected an error for b.jsonl beside b.log";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("two logs for case 'b'"), std::string::npos) << e.what();
  }
}

// ---- loss alignment ----

TEST(LossReport, PassesWithinTheDtypeThreshold) {
  const RunLog base = parse_json(json_log("fp32", {10.0, 9.5, 9.0}));
  const RunLog test = parse_json(json_log("fp32", {10.0, 9.500004, 8.999991}));
  const LossComparison c = compare_losses({"case", &base, &test}, {});
  EXPECT_TRUE(c.passed());
  EXPECT_EQ(c.steps_compared, 3);
  EXPECT_NEAR(c.max_abs_diff, 9e-6, 1e-9);
  EXPECT_EQ(c.max_diff_step, 3);
  EXPECT_FALSE(c.first_step_over().has_value());
}

TEST(LossReport, Bf16UsesItsOwnThreshold) {
  const RunLog base = parse_json(json_log("bf16", {10.0, 9.5}));
  const RunLog test = parse_json(json_log("bf16", {10.0, 9.505}));
  EXPECT_TRUE(compare_losses({"c", &base, &test}, {}).passed());
  LossThresholds strict;
  strict.bf16 = 1e-3;
  const LossComparison c = compare_losses({"c", &base, &test}, strict);
  EXPECT_FALSE(c.passed());
  EXPECT_EQ(c.first_step_over(), 2);
  EXPECT_DOUBLE_EQ(c.threshold, 1e-3);
}

TEST(LossReport, MismatchReportsTheFirstStepOver) {
  const RunLog base = parse_json(json_log("fp32", {10.0, 9.5, 9.0, 8.5}));
  const RunLog test = parse_json(json_log("fp32", {10.0, 9.5, 9.0001, 8.4}));
  const LossComparison c = compare_losses({"case", &base, &test}, {});
  EXPECT_FALSE(c.passed());
  EXPECT_EQ(c.first_step_over(), 3);
  EXPECT_EQ(c.steps_over, 2);
  EXPECT_EQ(c.max_diff_step, 4);
  EXPECT_NEAR(c.max_abs_diff, 0.1, 1e-12);
  const std::string report = render_loss_report({c}, {});
  EXPECT_NE(report.find("| case | fp32 | 1e-05 | 4 | 1.00e-01 | 4 | 3 | FAIL |"), std::string::npos)
      << report;
  EXPECT_NE(report.find("step 3: base 9.000000 vs test 9.000100"), std::string::npos) << report;
  EXPECT_NE(report.find("fp32: 0/1 cases passed"), std::string::npos) << report;
  EXPECT_EQ(loss_exit_code({c}), report_case_failed);
}

// A step over the threshold at a data spike says so: the baseline's gradient norm there and
// its ratio to the run's median (the pass/fail rule itself is unchanged).
TEST(LossReport, AStepOverAtAGradientSpikeIsMarked) {
  const std::vector<double> norms = {3.0, 2.9, 268.4, 3.1, 2.8};
  const RunLog base =
      parse_json(json_log("fp32", {10.0, 9.5, 9.917375, 9.0, 8.9}, {}, 100.0, 0, norms));
  const RunLog test =
      parse_json(json_log("fp32", {10.0, 9.5, 9.917360, 9.0, 8.9}, {}, 100.0, 0, norms));
  ASSERT_TRUE(base.steps[2].grad_norm.has_value());
  const LossComparison c = compare_losses({"case", &base, &test}, {});
  EXPECT_FALSE(c.passed());
  ASSERT_EQ(c.first_over.size(), 1u);
  ASSERT_TRUE(c.first_over[0].grad_norm_ratio.has_value());
  EXPECT_NEAR(*c.first_over[0].grad_norm_ratio, 268.4 / 3.0, 1e-9);  // median of five: 3.0
  const std::string report = render_loss_report({c}, {});
  EXPECT_NE(report.find("(diff 1.50e-05, baseline gradient norm 268 = 89.5x the median: a "
                        "gradient spike)"),
            std::string::npos)
      << report;
  // Without gradient norms (text logs, older logs) the line is as before.
  RunLog plain_base = parse_json(json_log("fp32", {10.0, 9.5, 9.917375}));
  const RunLog plain_test = parse_json(json_log("fp32", {10.0, 9.5, 9.917360}));
  for (LoggedStep& s : plain_base.steps) s.grad_norm.reset();
  const std::string plain =
      render_loss_report({compare_losses({"case", &plain_base, &plain_test}, {})}, {});
  EXPECT_NE(plain.find("(diff 1.50e-05)"), std::string::npos) << plain;
}

TEST(LossReport, MissingStepsFailEvenWhenBothSidesStopEarly) {
  const RunLog base = parse_json(json_log("fp32", {10.0, 9.5, 9.0, 8.5}));
  const RunLog test = parse_json(json_log("fp32", {10.0}, {}, 100.0, /*declared_steps=*/4));
  ASSERT_TRUE(test.ok()) << test.error;
  const LossComparison c = compare_losses({"case", &base, &test}, {});
  EXPECT_FALSE(c.passed());
  EXPECT_EQ(c.missing_in_test, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_NE(render_loss_report({c}, {}).find("steps missing in test: 2-4"), std::string::npos);

  // Both logs declare 4 steps but hold only step 1: steps 2-4 are missing on both sides.
  const LossComparison both = compare_losses({"case", &test, &test}, {});
  EXPECT_EQ(both.missing_in_base, (std::vector<int64_t>{2, 3, 4}));
  EXPECT_FALSE(both.passed());
}

TEST(LossReport, PairsByNameAndFailsUnpairedCasesAndDtypeDisagreement) {
  std::vector<RunLog> base = {parse_json(json_log("fp32", {1.0}), "b/a.jsonl"),
                              parse_json(json_log("fp32", {1.0}), "b/only_base.jsonl"),
                              parse_json(json_log("fp32", {1.0}), "b/mixed.jsonl")};
  std::vector<RunLog> test = {parse_json(json_log("fp32", {1.0}), "t/a.jsonl"),
                              parse_json(json_log("bf16", {1.0}), "t/mixed.jsonl"),
                              parse_text("step 1/1 | train loss 1.0\n", "t/only_test.log")};
  const std::vector<CasePair> pairs = pair_runs(base, test);
  ASSERT_EQ(pairs.size(), 4u);
  const std::vector<LossComparison> cases = compare_all_losses(pairs, {});
  EXPECT_EQ(cases[0].name, "a");
  EXPECT_TRUE(cases[0].passed());
  EXPECT_EQ(cases[1].name, "mixed");
  EXPECT_FALSE(cases[1].passed());
  EXPECT_NE(cases[1].problems.at(0).find("dtypes differ: base fp32, test bf16"), std::string::npos);
  EXPECT_NE(cases[2].problems.at(0).find("only in base"), std::string::npos);
  EXPECT_NE(cases[3].problems.at(0).find("only in test"), std::string::npos);
  EXPECT_EQ(loss_exit_code(cases), report_case_failed);
  const std::string report = render_loss_report(cases, {});
  EXPECT_NE(report.find("total: 1/4 cases passed"), std::string::npos) << report;

  // Two single files pair whatever their names.
  const std::vector<RunLog> one_base = {base[1]}, one_test = {test[0]};
  const std::vector<CasePair> two = pair_runs(one_base, one_test, /*two_files=*/true);
  ASSERT_EQ(two.size(), 1u);
  EXPECT_EQ(two[0].name, "only_base");
  EXPECT_TRUE(compare_losses(two[0], {}).passed());
}

TEST(LossReport, UnreadableLogIsBadInput) {
  const RunLog base = parse_json(json_log("fp32", {1.0}));
  const RunLog broken = parse_json("");
  const std::vector<LossComparison> cases = compare_all_losses({{"case", &base, &broken}}, {});
  EXPECT_TRUE(cases[0].bad_input);
  EXPECT_EQ(loss_exit_code(cases), report_bad_input);
  EXPECT_NE(
      render_loss_report(cases, {}).find("test log unreadable: case.jsonl: the file is empty"),
      std::string::npos);
}

TEST(LossReport, ABaselineOutOfMemoryIsNotComparedButTheTestMustBeComplete) {
  const RunLog oom = parse_json(
      stopped_log("bf16", {10.0}, 3, "out_of_memory", "out of GPU memory: asked for 8192 MB"));
  const RunLog full = parse_json(json_log("bf16", {10.001, 9.5, 9.0}));
  const RunLog cut = parse_json(json_log("bf16", {10.0, 9.5}, {}, 100.0, 3));

  // The steps before the baseline stopped are compared; the case neither passes nor fails.
  const std::vector<LossComparison> cases = compare_all_losses({{"big", &oom, &full}}, {});
  const LossComparison& c = cases[0];
  EXPECT_FALSE(c.passed());
  EXPECT_TRUE(c.baseline_did_not_fit());
  EXPECT_EQ(c.steps_compared, 1);
  EXPECT_TRUE(c.missing_in_base.empty());
  EXPECT_EQ(loss_exit_code(cases), report_ok);
  const std::string report = render_loss_report(cases, {});
  EXPECT_NE(report.find("| big | bf16 | 1e-02 | 1 | 1.00e-03 | 1 | - | base OOM |"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("- big: in step 2: out of GPU memory: asked for 8192 MB"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("bf16: 0/1 cases passed, 1 not compared (base out of memory)"),
            std::string::npos)
      << report;

  // The test run must still be complete, and agree where both logged.
  const LossComparison short_test = compare_losses({"big", &oom, &cut}, {});
  EXPECT_FALSE(short_test.baseline_did_not_fit());
  EXPECT_EQ(short_test.missing_in_test, (std::vector<int64_t>{3}));
  EXPECT_EQ(loss_exit_code({short_test}), report_case_failed);
  const RunLog far = parse_json(json_log("bf16", {10.5, 9.5, 9.0}));
  EXPECT_FALSE(compare_losses({"big", &oom, &far}, {}).baseline_did_not_fit());

  // A test run out of memory, or a baseline that stopped for another reason, fails the case.
  const LossComparison test_oom = compare_losses({"big", &full, &oom}, {});
  EXPECT_FALSE(test_oom.passed() || test_oom.baseline_did_not_fit());
  EXPECT_NE(test_oom.problems.at(0).find("the test run stopped in step 2: out of GPU memory"),
            std::string::npos);
  // Both sides out of memory in step 1: nothing logged on either side, the test run failed.
  const RunLog test_oom_at_once = parse_json(
      stopped_log("bf16", {}, 3, "out_of_memory", "out of GPU memory: asked for 9000 MB"));
  const RunLog base_oom_at_once = parse_json(
      stopped_log("bf16", {}, 3, "out_of_memory", "out of GPU memory: asked for 8192 MB"));
  const LossComparison neither = compare_losses({"big", &base_oom_at_once, &test_oom_at_once}, {});
  EXPECT_EQ(neither.steps_compared, 0);
  EXPECT_FALSE(neither.passed() || neither.baseline_did_not_fit());
  EXPECT_EQ(loss_exit_code({neither}), report_case_failed);
  EXPECT_FALSE(
      summarize_runs({{"big", &base_oom_at_once, &test_oom_at_once}}, false)[0].summarized());

  const RunLog diverged = parse_json(stopped_log("bf16", {10.0}, 3, "error", "training diverged"));
  const LossComparison base_error = compare_losses({"big", &diverged, &full}, {});
  EXPECT_FALSE(base_error.passed() || base_error.baseline_did_not_fit());
  EXPECT_NE(base_error.problems.at(0).find("the base run stopped in step 2: training diverged"),
            std::string::npos);
}

// ---- performance ----

TEST(PerfReport, AveragesAfterStepOneAndComputesRatios) {
  const RunLog base = parse_json(json_log("fp32", {1, 1, 1, 1}, {100, 40, 50, 60}, 1000));
  const RunLog test = parse_json(json_log("fp32", {1, 1, 1, 1}, {90, 20, 25, 30}, 600));
  const std::vector<PerfRow> rows = summarize_runs({{"case", &base, &test}}, false);
  ASSERT_EQ(rows.size(), 1u);
  const PerfRow& r = rows[0];
  ASSERT_TRUE(r.summarized());
  EXPECT_EQ(r.base.steps, 3);
  EXPECT_EQ(r.base.first_step, 2);
  EXPECT_DOUBLE_EQ(*r.base.ms, 50.0);
  EXPECT_DOUBLE_EQ(*r.test.ms, 25.0);
  EXPECT_DOUBLE_EQ(*r.speedup(), 2.0);
  // tok/s is the mean of the per-step rates: 64000/40, 64000/50, 64000/60 on the base side.
  EXPECT_NEAR(*r.base.tokens_per_second, (1600.0 + 1280.0 + 64000.0 / 60.0) / 3.0, 1e-9);
  EXPECT_NEAR(*r.tokens_per_second_gain(), 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(*r.peak_used_saved(), 0.4);
  EXPECT_DOUBLE_EQ(*r.peak_reserved_saved(), (1020.0 - 620.0) / 1020.0);
  EXPECT_EQ(perf_exit_code(rows), report_ok);

  const std::vector<PerfRow> with1 = summarize_runs({{"case", &base, &test}}, true);
  EXPECT_DOUBLE_EQ(*with1[0].base.ms, 62.5);
  EXPECT_EQ(with1[0].base.steps, 4);

  const std::string md = render_perf_markdown(rows, {}, false);
  EXPECT_NE(md.find("| case | fp32 | 3 | 50.00 | 25.00 | 2.00x |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 1000 | 600 | +40.0% | 400 (0) |"), std::string::npos) << md;
  EXPECT_NE(md.find("avg ms (baseline) | avg ms (flash)"), std::string::npos) << md;
  const std::string csv = render_perf_csv(rows);
  EXPECT_EQ(csv.substr(0, csv.find('\n')),
            "case,dtype,steps_base,steps_test,ms_base,ms_test,speedup,tok_per_s_base,"
            "tok_per_s_test,tok_per_s_gain,peak_used_mb_base,peak_used_mb_test,peak_used_saved,"
            "peak_reserved_mb_base,peak_reserved_mb_test,peak_reserved_saved,peak_used_saved_mb,"
            "attention_saved_mb_base,attention_saved_mb_test,expected_saved_mb,base_out_of_memory,"
            "problem");
  EXPECT_NE(csv.find("\ncase,fp32,3,3,50,25,2,"), std::string::npos) << csv;
}

TEST(PerfReport, ExpectedSavingIsWhatTheAttentionKeptOnEachSide) {
  RunLog base = parse_json(json_log("bf16", {1, 1, 1}, {}, 1000));
  RunLog test = parse_json(json_log("bf16", {1, 1, 1}, {}, 600));
  for (LoggedStep& s : base.steps) s.attention_saved_mb = 350.0;
  for (LoggedStep& s : test.steps) s.attention_saved_mb = 2.0;
  const std::vector<PerfRow> rows = summarize_runs({{"case", &base, &test}}, false);
  EXPECT_DOUBLE_EQ(*rows[0].peak_used_saved_mb(), 400.0);
  EXPECT_DOUBLE_EQ(*rows[0].expected_saved_mb(), 348.0);
  const std::string md = render_perf_markdown(rows, {}, false);
  EXPECT_NE(md.find("| +40.0% | 400 (348) |"), std::string::npos) << md;
  EXPECT_NE(render_perf_csv(rows).find(",400,350,2,348,,\n"), std::string::npos)
      << render_perf_csv(rows);
}

TEST(PerfReport, ABaselineOutOfMemoryShowsTheTestSideOnly) {
  const RunLog oom = parse_json(
      stopped_log("bf16", {}, 4, "out_of_memory", "out of GPU memory: asked for 8192 MB"));
  const RunLog test = parse_json(json_log("bf16", {1, 1, 1, 1}, {90, 20, 25, 30}, 600));
  const std::vector<PerfRow> rows = summarize_runs({{"big", &oom, &test}}, false);
  ASSERT_TRUE(rows[0].summarized());
  EXPECT_FALSE(rows[0].speedup().has_value());
  EXPECT_FALSE(rows[0].peak_used_saved().has_value());
  EXPECT_EQ(perf_exit_code(rows), report_ok);
  const std::string md = render_perf_markdown(rows, {}, false);
  EXPECT_NE(md.find("| big | bf16 | 3 | OOM | 25.00 | - | OOM | 2631 | - | OOM | 600 | - | - | "
                    "OOM | 620 | - |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("- big: in step 1: out of GPU memory"), std::string::npos) << md;
  const std::string csv = render_perf_csv(rows);
  EXPECT_NE(
      csv.find("\nbig,bf16,,3,,25,,,2631.111111,,,600,,,620,,,,0,,in step 1: out of GPU memory: "
               "asked for 8192 MB,\n"),
      std::string::npos)
      << csv;
}

TEST(PerfReport, MissingFieldsShowAsDashAndOneStepRunsNeedIncludeStep1) {
  const RunLog base = parse_text(
      "step 1/2 | train loss 4.0 | lr 1e-4 | (100.0 ms | 640 tok/s)\n"
      "step 2/2 | train loss 3.9 | lr 1e-4 | (50.0 ms | 1280 tok/s)\n");
  const RunLog test = parse_text(
      "step 1/2 | train loss 4.0 | lr 1e-4 | (90.0 ms | 711 tok/s)\n"
      "step 2/2 | train loss 3.9 | lr 1e-4 | (40.0 ms | 1600 tok/s)\n");
  const std::vector<PerfRow> rows = summarize_runs({{"x", &base, &test}}, false);
  EXPECT_FALSE(rows[0].peak_used_saved().has_value());
  const std::string md = render_perf_markdown(rows, {"naive", "flash"}, false);
  EXPECT_NE(md.find("| x | fp32 | 1 | 50.00 | 40.00 | 1.25x | 1280 | 1600 | +25.0% | - | - | - |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("avg ms (naive)"), std::string::npos);

  const RunLog one = parse_json(json_log("fp32", {1.0}));
  const std::vector<PerfRow> short_rows = summarize_runs({{"one", &one, &one}}, false);
  EXPECT_FALSE(short_rows[0].summarized());
  EXPECT_EQ(perf_exit_code(short_rows), report_case_failed);
  EXPECT_NE(render_perf_markdown(short_rows, {}, false).find("--include-step1"), std::string::npos);
  EXPECT_TRUE(summarize_runs({{"one", &one, &one}}, true)[0].summarized());
}

}  // namespace
}  // namespace ft::train

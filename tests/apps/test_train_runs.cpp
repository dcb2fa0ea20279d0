// `flashtrain train` as a user runs it: a resume appends to its log, matches an uninterrupted run
// and refuses changes that would alter its losses (with the diff); SIGINT and SIGTERM finish the
// step, save, log and exit 130, a second signal exits at once, and no interrupt leaves a
// checkpoint and a state from different steps; step lines show progress and still parse;
// samples are valid UTF-8 on a pipe and in the JSON log.
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include <nlohmann/json.hpp>

#include "models/checkpoint.h"
#include "models/transformer.h"
#include "test_util.h"
#include "train/generate.h"
#include "train/run_log.h"
#include "train/saved_run.h"
#include "train/schedule.h"
#include "train/tokenizer.h"
#include "train/train_state.h"
#include "train/utf8.h"

extern char** environ;

namespace ft {
namespace {

namespace fs = std::filesystem;

bool have_python() {
  return std::system("python3 --version >/dev/null 2>&1") == 0;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A freshly initialised model samples almost uniformly from GPT-2's 50257 tokens, 344 of which
// are pieces of UTF-8 characters. The final sample of this run is reproduced from its saved
// checkpoint: its raw token bytes are not valid UTF-8 (checked), yet what the run printed on a
// pipe decodes as strict UTF-8, is exactly those bytes with only whole characters kept, and the
// JSON log (samples included) parses.
TEST(TrainSamples, AreValidUtf8OnAPipeAndInTheLog) {
  if (!have_python()) GTEST_SKIP() << "python3 not found";
  test::TempDir dir;
  const std::string log = dir.file("run.jsonl"), ckpt = dir.file("ck.bin");
  const int64_t tokens = 300;
  const uint64_t seed = 3;
  const std::string train =
      std::string("'") + FLASHTRAIN_CLI +
      "' train --device cpu --batch-size 1 --seq-len 8 --steps 2 --val-data '' "
      "--sample-every 1 --sample-tokens " +
      std::to_string(tokens) + " --seed " + std::to_string(seed) + " --save '" + ckpt +
      "' --log '" + log + "'";
  const test::CommandResult r =
      test::run_shell(train + " | tee '" + dir.file("out.txt") +
                      "' | python3 -c \"import sys; sys.stdin.buffer.read().decode('utf-8')\"");
  ASSERT_EQ(r.exit_code, 0) << r.output;

  const models::ModelConfig mc = models::read_checkpoint_config(ckpt);
  models::Transformer model(mc, DType::f32, {});
  models::load_checkpoint(ckpt, model);
  const train::Tokenizer tokenizer(test::source_path("data/gpt2_tokenizer.bin"));
  train::GenerateOptions o;
  o.tokens = tokens;
  o.seed = seed;
  std::string raw;
  for (int32_t id : train::generate_tokens(model, {tokenizer.eot_token()}, o))
    raw += tokenizer.decode(id);
  ASSERT_FALSE(train::is_valid_utf8(raw)) << "this sample should split a character";
  const std::string printed = read_file(dir.file("out.txt"));
  const std::string expected = "sample:\n" + train::valid_utf8(raw) + "\n";
  EXPECT_NE(printed.find(expected), std::string::npos) << printed;

  const test::CommandResult j = test::run_shell(
      "python3 -c \"import json, sys\n"
      "lines = open(sys.argv[1], encoding='utf-8').read().splitlines()\n"
      "samples = [json.loads(l) for l in lines if json.loads(l).get('event') == 'sample']\n"
      "assert len(samples) == 1 and samples[0]['step'] == 1 and samples[0]['text'], samples\n"
      "summary = json.loads(lines[-1])\n"
      "assert summary['event'] == 'summary' and summary['sample'], summary\n"
      "\" '" +
      log + "'");
  EXPECT_EQ(j.exit_code, 0) << j.output;
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line)) last = line;
  EXPECT_EQ(nlohmann::json::parse(last)["sample"], train::valid_utf8(raw));
}

// ---- resume ----

// Small, fast runs; a constant schedule unless a test says otherwise.
const std::string kRun =
    "train --device cpu --batch-size 2 --seq-len 16 --val-data '' --sample-tokens 0 ";

std::vector<double> losses_of(const std::string& log) {
  const train::RunLog r = train::read_run_log(log);
  EXPECT_TRUE(r.ok()) << r.error;
  std::vector<double> out;
  for (const train::LoggedStep& s : r.steps) out.push_back(s.train_loss);
  return out;
}

std::vector<nlohmann::json> events(const std::string& log, const std::string& event) {
  std::vector<nlohmann::json> found;
  std::ifstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("event", "") == event) found.push_back(j);
  }
  return found;
}

void run_ok(const std::string& args) {
  const test::CommandResult r = test::run_cli(args);
  ASSERT_EQ(r.exit_code, 0) << args << "\n" << r.output;
}

TEST(TrainResume, AppendsToTheLogAndMatchesAnUninterruptedRun) {
  test::TempDir dir;
  const std::string common = kRun + "--lr-schedule constant --warmup 2 --shuffle ";
  const std::string ck = dir.file("ck.bin"), log = dir.file("run.jsonl");
  run_ok(common + "--steps 8 --log '" + dir.file("straight.jsonl") + "'");
  run_ok(common + "--steps 4 --save '" + ck + "' --log '" + log + "'");
  run_ok(common + "--steps 8 --resume '" + ck + "' --log '" + log + "'");
  const std::vector<double> straight = losses_of(dir.file("straight.jsonl"));
  ASSERT_EQ(straight.size(), 8u);
  EXPECT_EQ(losses_of(log), straight) << "steps 1-4, then the resumed 5-8, bit for bit";
  EXPECT_EQ(events(log, "run").size(), 1u);
  const std::vector<nlohmann::json> resumes = events(log, "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_EQ(resumes[0]["step"], 4);
  // A declared-safe change: the same run with flash attention, within the naive/flash bar.
  const test::CommandResult flash =
      test::run_cli(common + "--steps 8 --resume '" + ck + "' --attention flash --log '" +
                    dir.file("flash.jsonl") + "'");
  ASSERT_EQ(flash.exit_code, 0) << flash.output;
  EXPECT_NE(flash.output.find("attention: naive -> flash"), std::string::npos) << flash.output;
  const std::vector<double> resumed_flash = losses_of(dir.file("flash.jsonl"));
  ASSERT_EQ(resumed_flash.size(), 4u);  // a new log: the resumed steps only
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(resumed_flash[i], straight[i + 4], 1e-5) << i;
}

void expect_refused(const std::string& args, const std::vector<std::string>& parts) {
  const test::CommandResult r = test::run_cli(args);
  EXPECT_EQ(r.exit_code, 1) << args << "\n" << r.output;
  EXPECT_EQ(r.output.rfind("error: ", 0), 0u) << r.output;
  EXPECT_EQ(r.output.find('\n'), r.output.size() - 1) << "one line: " << r.output;
  for (const std::string& part : parts) {
    EXPECT_NE(r.output.find(part), std::string::npos) << args << "\n" << r.output;
  }
}

// The default cosine schedule decays over --steps: 10 steps resumed to 20 would not match a run
// of 20. Such a resume, and one with another lr, seed, shuffle, decay or clipping, is refused
// with the diff; --allow-schedule-change continues on the new schedule.
TEST(TrainResume, RefusesWhatWouldChangeTheLosses) {
  test::TempDir dir;
  const std::string ck = dir.file("ck.bin");
  run_ok(kRun + "--steps 10 --save '" + ck + "'");
  const std::string resume = kRun + "--resume '" + ck + "' ";
  expect_refused(resume + "--steps 20", {"learning-rate schedule", "steps: 10 -> 20",
                                         "--lr-schedule constant", "--allow-schedule-change"});
  expect_refused(resume + "--steps 20 --lr 0.002", {"lr: 0.001 -> 0.002", "steps: 10 -> 20"});
  expect_refused(resume + "--steps 10", {"already completed 10 steps"});
  expect_refused(resume + "--steps 20 --seed 2", {"different run", "seed: 1337 -> 2"});
  expect_refused(resume + "--steps 20 --shuffle", {"different run", "shuffle: false -> true"});
  expect_refused(resume + "--steps 20 --weight-decay 0", {"weight_decay: 0.1 -> 0.0"});
  expect_refused(resume + "--steps 20 --grad-clip 0.5", {"grad_clip: 1.0 -> 0.5"});
  expect_refused(
      "train --device cpu --batch-size 4 --seq-len 16 --val-data '' --sample-tokens 0 --resume '" +
          ck + "' --steps 20",
      {"batch_size: 2 -> 4"});
  expect_refused(resume + "--steps 20 --dtype bf16", {"dtype: fp32 -> bf16"});

  const std::string log = dir.file("longer.jsonl");
  run_ok(resume + "--steps 20 --allow-schedule-change --log '" + log + "'");
  const std::vector<nlohmann::json> resumes = events(log, "resume");
  ASSERT_EQ(resumes.size(), 1u);
  EXPECT_NE(resumes[0]["changes"].dump().find("steps: 10 -> 20"), std::string::npos)
      << resumes[0].dump();
  const train::RunLog r = train::read_run_log(log);
  ASSERT_TRUE(r.ok()) << r.error;
  ASSERT_EQ(r.steps.size(), 10u);
  const train::LrSchedule twenty{1e-3, 0, 20, 0.0, train::LrDecay::cosine};
  EXPECT_EQ(r.steps.front().step, 11);
  EXPECT_DOUBLE_EQ(*r.steps.front().lr, twenty.lr(11)) << "the resumed steps follow --steps 20";
}

// ---- interrupts ----

// `flashtrain <args>` in the background, stdout and stderr to `out`.
class Background {
 public:
  Background(const std::string& args, const std::string& out) {
    const std::string cmd = std::string("cd '") + FLASHTRAIN_SOURCE_DIR + "' && exec '" +
                            FLASHTRAIN_CLI + "' " + args + " > '" + out + "' 2>&1";
    std::string sh = "/bin/sh", dash_c = "-c", command = cmd;
    char* argv[] = {sh.data(), dash_c.data(), command.data(), nullptr};
    EXPECT_EQ(posix_spawn(&pid_, "/bin/sh", nullptr, nullptr, argv, environ), 0);
  }
  ~Background() {
    if (pid_ > 0 && !waited_) {
      ::kill(pid_, SIGKILL);
      wait();
    }
  }
  void signal(int sig) const { ::kill(pid_, sig); }
  // The exit status, or -1 when it did not exit normally.
  int wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    waited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

 private:
  pid_t pid_ = -1;
  bool waited_ = false;
};

// Temporary files and journals of saves in dir.
std::vector<std::string> temporary_files(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp.") != std::string::npos || name.ends_with(".commit")) found.push_back(name);
  }
  return found;
}

int logged_steps(const std::string& log) {
  std::ifstream in(log);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) n += line.find("\"train_loss\"") != std::string::npos;
  return n;
}

bool wait_until(const std::function<bool()>& done, useconds_t poll_us = 20000) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    usleep(poll_us);
  }
  return true;
}

// Two signals, the second once the first has been handled (two sent together may merge into
// one pending signal): the handler's message is in the output.
void interrupt_twice(Background& run, const std::string& out) {
  run.signal(SIGINT);
  ASSERT_TRUE(wait_until(
      [&] { return read_file(out).find("interrupt: finishing") != std::string::npos; }, 1000));
  run.signal(SIGINT);
}

// The checkpoint's weights are the state's master weights (fp32 files); returns the state's step.
int64_t check_pair(const std::string& path) {
  models::Transformer from_checkpoint(models::read_checkpoint_config(path), DType::f32, {});
  models::load_checkpoint(path, from_checkpoint);
  models::Transformer from_state(models::read_checkpoint_config(path), DType::f32, {});
  train::load_train_state(path + ".state", from_state);
  for (size_t i = 0; i < from_state.parameters().size(); ++i) {
    EXPECT_EQ(max_abs_diff(from_checkpoint.parameters()[i].master_weights(),
                           from_state.parameters()[i].master_weights()),
              0.0)
        << from_state.parameters()[i].name << ": checkpoint and state from different steps";
  }
  return train::read_train_state(path + ".state").step;
}

std::string last_line(const std::string& path, int from_end = 0) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) lines.push_back(line);
  return lines.size() > static_cast<size_t>(from_end) ? lines[lines.size() - 1 - from_end] : "";
}

void interrupt_finishes_saves_and_resumes(int sig) {
  test::TempDir dir;
  const std::string common = kRun + "--lr-schedule constant ";
  const std::string ck = dir.file("ck.bin"), log = dir.file("run.jsonl");
  Background run(common + "--steps 100000 --save '" + ck + "' --log '" + log + "'",
                 dir.file("out.txt"));
  ASSERT_TRUE(wait_until([&] { return logged_steps(log) >= 3; }));
  run.signal(sig);
  EXPECT_EQ(run.wait(), 130) << read_file(dir.file("out.txt"));
  const nlohmann::json closing = nlohmann::json::parse(last_line(log));
  ASSERT_EQ(closing["event"], "interrupted") << closing.dump();
  EXPECT_EQ(nlohmann::json::parse(last_line(log, 1))["event"], "summary");
  const int64_t done = closing["step"].get<int64_t>();
  EXPECT_EQ(logged_steps(log), done) << "the step in flight was finished and logged";
  const std::string out = read_file(dir.file("out.txt"));
  EXPECT_NE(out.find("interrupted: stopped after step " + std::to_string(done)), std::string::npos)
      << out;
  EXPECT_NE(out.find("== summary =="), std::string::npos) << out;
  EXPECT_EQ(check_pair(ck), done);

  // It resumes to the losses of an uninterrupted run (the constant schedule keeps every rate).
  const std::string steps = std::to_string(done + 2);
  run_ok(common + "--steps " + steps + " --resume '" + ck + "' --log '" + log + "'");
  run_ok(common + "--steps " + steps + " --log '" + dir.file("straight.jsonl") + "'");
  EXPECT_EQ(losses_of(log), losses_of(dir.file("straight.jsonl")));
}

TEST(TrainInterrupt, SigintFinishesTheStepSavesLogsAndExits130) {
  interrupt_finishes_saves_and_resumes(SIGINT);
}

TEST(TrainInterrupt, SigtermDoesTheSame) {
  interrupt_finishes_saves_and_resumes(SIGTERM);
}

// Steps of 8 x 256 tokens take long enough that the second signal lands inside the step.
TEST(TrainInterrupt, ASecondSignalExitsAtOnce) {
  test::TempDir dir;
  const std::string log = dir.file("run.jsonl");
  Background run(
      "train --device cpu --batch-size 8 --seq-len 256 --val-data '' --sample-tokens 0 --steps "
      "100000 "
      "--save '" +
          dir.file("ck.bin") + "' --log '" + log + "'",
      dir.file("out.txt"));
  ASSERT_TRUE(wait_until([&] { return logged_steps(log) >= 1; }));
  interrupt_twice(run, dir.file("out.txt"));
  EXPECT_EQ(run.wait(), 130);
  EXPECT_EQ(nlohmann::json::parse(last_line(log)).value("event", ""), "")
      << "no closing lines: it stopped at once";
}

// Saving every step, a run is killed (SIGKILL: no handler, no clean-up) at moments spread over
// its steps and saves: after recovery (which every train run does first) the pair is always
// whole and no temporary file is left. (SavedRun.AWriterKilledAtAnyPointLeavesAWholePair stops
// a writer after each phase of a save deterministically.)
TEST(TrainInterrupt, NoKillLeavesAMismatchedPair) {
  test::TempDir dir;
  const std::string ck = dir.file("ck.bin");
  int cut_mid_save = 0;
  const int trials = 8;
  for (int trial = 0; trial < trials; ++trial) {
    Background run(kRun + "--steps 100000 --save-every 1 --save '" + ck + "'", dir.file("out.txt"));
    // A save after the first one has begun: its temporary checkpoint exists; then a delay
    // that moves the kill through the save's phases (and, for the last trials, past it).
    ASSERT_TRUE(wait_until([&] { return fs::exists(ck + ".state"); }, 1000));
    ASSERT_TRUE(wait_until([&] { return !temporary_files(dir.path()).empty(); }, 500));
    usleep(static_cast<useconds_t>(8000 * trial));
    run.signal(SIGKILL);
    run.wait();
    cut_mid_save += !temporary_files(dir.path()).empty();
    train::recover_saved_run(ck);
    check_pair(ck);
    EXPECT_TRUE(temporary_files(dir.path()).empty()) << temporary_files(dir.path()).front();
  }
  std::printf("killed mid-save in %d of %d trials\n", cut_mid_save, trials);
  EXPECT_GE(cut_mid_save, 1) << "no kill landed inside a save: the test proved nothing";
}

TEST(TrainSaves, TemporaryFilesOfAKilledWriterAreRemoved) {
  test::TempDir dir;
  const std::string ck = dir.file("ck.bin");
  std::ofstream(ck + ".tmp.999999999") << "partial";
  std::ofstream(ck + ".state.tmp.999999999") << "partial";
  const test::CommandResult r = test::run_cli(kRun + "--steps 1 --save '" + ck + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("removed 2 temporary files"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(ck + ".tmp.999999999"));
  EXPECT_FALSE(fs::exists(ck + ".state.tmp.999999999"));
  EXPECT_EQ(check_pair(ck), 1);
}

// ---- progress ----

TEST(TrainProgress, StepLinesShowProgressAndStillParse) {
  test::TempDir dir;
  const std::string text_log = dir.file("run.log"), json_log = dir.file("run.jsonl");
  const test::CommandResult r =
      test::run_shell(std::string("'") + FLASHTRAIN_CLI + "' " + kRun + "--steps 3 --log '" +
                      json_log + "' > '" + text_log + "'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string text = read_file(text_log);
  // The InfiniTrain fields as before, then elapsed, the estimate left and the tokens so far.
  for (const std::string part : {"step    2/3 | train loss ", " MB) | elapsed 0:00:",
                                 " | eta 0:00:", " | 64 tokens\n", " | 96 tokens\n"}) {
    EXPECT_NE(text.find(part), std::string::npos) << part << "\n" << text;
  }
  const train::RunLog parsed = train::read_run_log(text_log);
  ASSERT_TRUE(parsed.ok()) << parsed.error;
  ASSERT_EQ(parsed.steps.size(), 3u);
  EXPECT_TRUE(parsed.steps[0].peak_reserved_mb.has_value());
  EXPECT_TRUE(parsed.steps[0].ms.has_value());
  const test::CommandResult compare =
      test::run_cli("compare-loss '" + text_log + "' '" + text_log + "'");
  EXPECT_EQ(compare.exit_code, 0) << compare.output;
  const nlohmann::json step = nlohmann::json::parse(last_line(json_log, 1));
  EXPECT_EQ(step["step"], 3);
  EXPECT_EQ(step["tokens_seen"], 96);
  EXPECT_GE(step["elapsed_s"].get<double>(), 0.0);
  EXPECT_EQ(step["eta_s"].get<double>(), 0.0);
}

}  // namespace
}  // namespace ft

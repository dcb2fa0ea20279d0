// Training end to end on the shipped Shakespeare shards: the regression bar, determinism,
// exact resume, naive vs flash attention, and the CLI's errors for bad input.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "test_util.h"
#include "train/data_loader.h"
#include "train/trainer.h"

namespace ft::train {
namespace {

TrainConfig tiny_run(int64_t steps) {
  TrainConfig c;
  c.model = "gpt2-tiny";
  c.train_data = test::source_path("data/tinyshakespeare_train.bin");
  c.val_data = test::source_path("data/tinyshakespeare_val.bin");
  c.tokenizer = test::source_path("data/gpt2_tokenizer.bin");
  c.batch_size = 4;
  c.seq_len = 32;
  c.steps = steps;
  c.lr = 3e-3;
  c.warmup = 5;
  c.sample_tokens = 0;
  c.quiet = true;
  return c;
}

TrainSummary run(const TrainConfig& c) {
  std::ostringstream out;
  return train(c, out);
}

// The regression bar (README): gpt2-tiny, batch 8 x 64, 120 steps, lr 3e-3, warm-up 10
// reaches a validation loss under 6.6 (measured 6.34 on the CPU; ln(50257) = 10.8 at start).
TEST(Trainer, Gpt2TinyLearnsShakespeare) {
  TrainConfig c = tiny_run(120);
  c.batch_size = 8;
  c.seq_len = 64;
  c.warmup = 10;
  c.val_steps = 16;
  const TrainSummary s = run(c);
  ASSERT_EQ(s.losses.size(), 120u);
  EXPECT_GT(s.losses.front(), 10.0);
  EXPECT_LT(s.final_val_loss, 6.6);
}

TEST(Trainer, SameSeedSameLosses) {
  TrainConfig c = tiny_run(8);
  c.model = "llama3-tiny";
  c.val_data.clear();
  c.total_batch_size = 2 * c.batch_size * c.seq_len;  // with gradient accumulation
  const TrainSummary a = run(c);
  const TrainSummary b = run(c);
  EXPECT_EQ(a.losses, b.losses);
  c.seed += 1;
  EXPECT_NE(run(c).losses, a.losses);
}

TEST(Trainer, ResumeIsBitIdentical) {
  for (const std::string model : {"gpt2-tiny", "llama3-tiny"}) {
    for (const std::string dtype : {"fp32", "bf16"}) {
      test::TempDir dir;
      TrainConfig c = tiny_run(8);
      c.model = model;
      c.dtype = parse_dtype(dtype);
      c.shuffle = true;
      c.val_data.clear();
      const TrainSummary straight = run(c);

      TrainConfig first = c;
      first.steps = 4;
      first.save_path = dir.file("ckpt.bin");
      run(first);
      TrainConfig second = c;
      second.resume_path = dir.file("ckpt.bin");
      const TrainSummary resumed = run(second);
      ASSERT_EQ(resumed.losses.size(), 4u);
      for (size_t i = 0; i < 4; ++i) {
        EXPECT_EQ(resumed.losses[i], straight.losses[i + 4])
            << model << " " << dtype << " step " << i + 5;
      }
    }
  }
}

// Issue 3's bar: naive and flash attention give the same fp32 training losses to 1e-5 per step
// over 50 steps. (At lr 3e-3 and batch 4 x 32 a spiky batch, gradient norm ~170, amplifies
// rounding differences to ~2e-4 in both directions; this gentler run measured 2.1e-6.)
TEST(Trainer, NaiveAndFlashAttentionTrainAlike) {
  TrainConfig c = tiny_run(50);
  c.seq_len = 64;
  c.lr = 1e-3;
  c.warmup = 10;
  c.val_data.clear();
  const TrainSummary naive = run(c);
  c.attention.impl = attention::Impl::flash;
  const TrainSummary flash = run(c);
  ASSERT_EQ(naive.losses.size(), flash.losses.size());
  for (size_t i = 0; i < naive.losses.size(); ++i) {
    EXPECT_NEAR(flash.losses[i], naive.losses[i], 1e-5) << "step " << i + 1;
  }
}

TEST(Trainer, LogHasOneJsonLinePerStep) {
  test::TempDir dir;
  TrainConfig c = tiny_run(3);
  c.log_path = dir.file("run.jsonl");
  run(c);
  std::ifstream in(c.log_path);
  std::string line;
  int steps = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("train_loss")) {
      ++steps;
      EXPECT_EQ(j["step"], steps);
      EXPECT_TRUE(j.contains("peak_used_mb") && j.contains("tok_per_s") && j.contains("lr"));
    }
  }
  EXPECT_EQ(steps, 3);
}

// --- the CLI: every bad input is one clear line and a non-zero exit, never a crash ---

void expect_cli_error(const std::string& args, const std::string& needle) {
  const test::CommandResult r = test::run_cli("train " + args);
  EXPECT_NE(r.exit_code, 0) << args << "\n" << r.output;
  EXPECT_NE(r.exit_code, -1) << "crashed: " << args << "\n" << r.output;
  EXPECT_NE(r.output.find(needle), std::string::npos) << args << "\n" << r.output;
}

TEST(TrainCli, BadInputGivesClearErrors) {
  expect_cli_error("--model gpt3", "unknown model preset 'gpt3'");
  expect_cli_error("--seq-len 300 --steps 1", "exceeds the context");
  expect_cli_error("--batch-size 4 --seq-len 32 --total-batch-size 100 --steps 1",
                   "not a multiple of batch size");
  expect_cli_error("--dtype fp16", "fp16");
  expect_cli_error("--attention fast", "fast");
  expect_cli_error("--vocab 1000 --steps 1", "token id");
  expect_cli_error("--train-data data/missing.bin --steps 1", "data/missing.bin");
  if (cuda_device_count() == 0) expect_cli_error("--device cuda --steps 1", "--device cuda");
  expect_cli_error("--load data/tinyshakespeare_val.bin --steps 1", "magic");
  expect_cli_error("--heads 5 --steps 1", "heads");
  expect_cli_error("--steps 0", "steps must be >= 1");
}

TEST(TrainCli, ResumeOfAnotherRunIsRefusedAndSavesAreAtomic) {
  test::TempDir dir;
  const std::string ckpt = dir.file("ckpt.bin");
  const std::string common = "--batch-size 2 --seq-len 16 --sample-tokens 0 --val-data '' ";
  test::CommandResult r = test::run_cli("train " + common + "--steps 2 --save " + ckpt);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(ckpt));
  EXPECT_TRUE(std::filesystem::exists(ckpt + ".state"));
  expect_cli_error(common + "--steps 4 --dtype bf16 --resume " + ckpt, "different run");
  expect_cli_error(common + "--steps 2 --resume " + ckpt, "nothing to do");
  // A save into a missing directory fails cleanly and leaves no partial file.
  const std::string bad = dir.file("missing/ckpt.bin");
  expect_cli_error(common + "--steps 1 --save " + bad, "missing");
  EXPECT_FALSE(std::filesystem::exists(bad));
  EXPECT_FALSE(std::filesystem::exists(dir.file("missing")));
}

TEST(TrainCli, PrintsStepLinesAndSummary) {
  const test::CommandResult r = test::run_cli(
      "train --batch-size 2 --seq-len 16 --steps 3 --sample-tokens 8 --eval-every 2 --val-steps 2");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("step    1/3 | train loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("peak reserved:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("val loss"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("== summary =="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("sample:"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace ft::train

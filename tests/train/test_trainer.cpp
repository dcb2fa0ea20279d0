// Training end to end on the shipped Shakespeare shards: the regression bar, determinism,
// exact resume, naive vs flash attention, --doc-mask, and the CLI's errors for bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "models/transformer.h"
#include "test_util.h"
#include "train/data_loader.h"
#include "train/run_log.h"
#include "train/tokenizer.h"
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
// rounding differences to ~2e-4 in both directions; this gentler run measured 2.1e-6.) The
// difference is rounding amplified by training, so the BLAS kernel moves it: worst step 1.3e-6
// under OpenBLAS's Zen and Haswell kernels, 3.1e-6 under Sandybridge (no FMA). This is the
// tightest margin that depends on the kernel; the bar is the design's, not derived here.
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

// --doc-mask: the same fp32 bar between naive and flash, alone and under a window with a
// full-attention layer (segment ids apply in every layer, the window in the windowed ones).
// Measured at most 6e-8 per step.
TEST(Trainer, DocMaskNaiveAndFlashTrainAlike) {
  for (const models::AttentionSettings& s :
       {models::AttentionSettings{{}, 0, 0}, models::AttentionSettings{{}, 16, 2}}) {
    TrainConfig c = tiny_run(12);
    c.seq_len = 64;
    c.lr = 1e-3;
    c.warmup = 4;
    c.val_data.clear();
    c.doc_mask = true;
    c.attention = s;
    c.attention.impl = attention::Impl::naive;
    const TrainSummary naive = run(c);
    c.attention.impl = attention::Impl::flash;
    const TrainSummary flash = run(c);
    ASSERT_EQ(naive.losses.size(), flash.losses.size());
    for (size_t i = 0; i < naive.losses.size(); ++i) {
      EXPECT_NEAR(flash.losses[i], naive.losses[i], 1e-5)
          << "window " << s.window << " step " << i + 1;
    }
  }
}

// Shakespeare's documents are ~47 tokens, so 64-token rows hold boundaries: the mask must change
// what the model computes, from the first step on.
TEST(Trainer, DocMaskChangesTheLoss) {
  TrainConfig c = tiny_run(2);
  c.seq_len = 64;
  c.val_data.clear();
  DataLoader loader(c.train_data, c.batch_size, c.seq_len);
  Tensor x, y;
  loader.next_batch(x, y);
  const int32_t eot = Tokenizer(c.tokenizer).eot_token();
  int boundaries = 0;
  for (int64_t i = 0; i < x.numel(); ++i) boundaries += x.data<int32_t>()[i] == eot;
  ASSERT_GT(boundaries, 2) << "the first batch should hold end-of-text tokens";

  const TrainSummary plain = run(c);
  c.doc_mask = true;
  const TrainSummary masked = run(c);
  ASSERT_EQ(plain.losses.size(), masked.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) {
    EXPECT_GT(std::fabs(masked.losses[i] - plain.losses[i]), 1e-5) << "step " << i + 1;
  }
}

TEST(Trainer, DocMaskNeedsAnEndOfTextTheModelCanSee) {
  test::TempDir dir;
  TrainConfig c = tiny_run(1);
  c.val_data.clear();
  c.doc_mask = true;
  c.tokenizer = dir.file("missing_tokenizer.bin");
  std::ostringstream out;
  try {
    train(c, out);
    ADD_FAILURE() << "a missing tokenizer was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--doc-mask needs the tokenizer"), std::string::npos)
        << e.what();
  }
  // A model whose vocabulary stops below the end-of-text id (50256) cannot see boundaries.
  c = tiny_run(1);
  c.val_data.clear();
  c.doc_mask = true;
  c.overrides.vocab = 1000;
  c.train_data = dir.file("small_vocab.bin");
  std::vector<uint32_t> tokens(200);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i % 1000);
  write_token_shard(c.train_data, tokens, false);
  try {
    train(c, out);
    ADD_FAILURE() << "an end-of-text id outside the vocabulary was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("end-of-text id 50256"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[0, 1000)"), std::string::npos) << e.what();
  }
}

TEST(Trainer, LogHasOneJsonLinePerStep) {
  test::TempDir dir;
  TrainConfig c = tiny_run(3);
  c.log_path = dir.file("run.jsonl");
  c.doc_mask = true;
  c.attention.window = 8;
  c.attention.global_every = 2;
  run(c);
  std::ifstream in(c.log_path);
  std::string line;
  int steps = 0;
  ASSERT_TRUE(std::getline(in, line));
  const auto first = nlohmann::json::parse(line);
  EXPECT_EQ(first["event"], "run");
  EXPECT_EQ(first["doc_mask"], true);
  EXPECT_EQ(first["window"], 8);
  EXPECT_EQ(first["global_every"], 2);
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

// The summary's peak used memory: over the run the highest step's, over the timed steps (all
// but the first, which warms up) the highest of those; the same in the summary's text.
TEST(Trainer, SummaryReportsThePeakOverTheRunAndOverTheTimedSteps) {
  test::TempDir dir;
  TrainConfig c = tiny_run(4);
  c.val_data.clear();
  c.log_path = dir.file("run.jsonl");
  std::ostringstream out;
  train(c, out);
  std::ifstream in(c.log_path);
  std::string line;
  double run_peak = 0.0, timed_peak = 0.0;
  nlohmann::json summary;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("train_loss")) {
      const double peak = j["peak_used_mb"].get<double>();
      run_peak = std::max(run_peak, peak);
      if (j["step"].get<int>() > 1) timed_peak = std::max(timed_peak, peak);
    } else if (j.value("event", "") == "summary") {
      summary = j;
    }
  }
  ASSERT_TRUE(summary.contains("run_peak_used_mb")) << summary.dump();
  EXPECT_GT(run_peak, 0.0);
  EXPECT_EQ(summary["run_peak_used_mb"].get<double>(), run_peak);
  EXPECT_EQ(summary["timed_peak_used_mb"].get<double>(), timed_peak);
  EXPECT_NE(out.str().find(" MB over the run, "), std::string::npos) << out.str();
  EXPECT_NE(out.str().find(" MB over the timed steps"), std::string::npos) << out.str();
}

// What the attention keeps for backward is logged per step: naive the fp32 probabilities and
// the log-sum-exp of every layer, flash the log-sum-exp only (summarize's expected saving).
TEST(Trainer, LogSaysWhatTheAttentionKeeps) {
  test::TempDir dir;
  TrainConfig c = tiny_run(1);
  c.val_data.clear();
  c.log_path = dir.file("naive.jsonl");
  run(c);
  const RunLog naive = read_run_log(c.log_path);
  c.attention.impl = attention::Impl::flash;
  c.log_path = dir.file("flash.jsonl");
  run(c);
  const RunLog flash = read_run_log(c.log_path);
  ASSERT_TRUE(naive.ok() && flash.ok()) << naive.error << flash.error;
  // gpt2-tiny: 4 layers, 4 heads; batch 4 x 32.
  const double lse_bytes = 4.0 * 4 * 4 * 32 * 4;
  const double mib = 1024.0 * 1024.0;
  EXPECT_DOUBLE_EQ(*naive.steps.at(0).attention_saved_mb,
                   (4.0 * 4 * 4 * 32 * 32 * 4 + lse_bytes) / mib);
  EXPECT_DOUBLE_EQ(*flash.steps.at(0).attention_saved_mb, lse_bytes / mib);
}

// --recompute: every mode trains as none does, bit for bit (with gradient accumulation and
// document masks), keeps less (logged per step and in the summary, block least), is recorded
// in the run log, and a run saved under one mode resumes under another with the same losses.
TEST(Trainer, RecomputeKeepsLessAndTrainsBitIdentically) {
  test::TempDir dir;
  TrainConfig c = tiny_run(4);
  c.model = "llama3-tiny";
  c.val_data.clear();
  c.doc_mask = true;
  c.total_batch_size = 2 * c.batch_size * c.seq_len;
  std::vector<double> kept;
  std::vector<double> straight;
  for (models::Recompute mode :
       {models::Recompute::none, models::Recompute::attention, models::Recompute::mlp,
        models::Recompute::block, models::Recompute::elementwise}) {
    c.recompute = mode;
    c.log_path = dir.file(std::string(models::recompute_name(mode)) + ".jsonl");
    std::ostringstream out;
    const TrainSummary s = train(c, out);
    if (straight.empty()) straight = s.losses;
    EXPECT_EQ(s.losses, straight) << models::recompute_name(mode);
    EXPECT_NE(out.str().find(std::string("(--recompute ") + models::recompute_name(mode) + ")"),
              std::string::npos)
        << out.str();
    std::ifstream log(c.log_path);
    const nlohmann::json run_event = nlohmann::json::parse([&] {
      std::string line;
      std::getline(log, line);
      return line;
    }());
    EXPECT_EQ(run_event.at("recompute"), models::recompute_name(mode));
    const nlohmann::json step = nlohmann::json::parse([&] {
      std::string line;
      std::getline(log, line);
      return line;
    }());
    kept.push_back(step.at("activations_saved_mb").get<double>());
  }
  for (size_t i = 1; i < kept.size(); ++i) EXPECT_LT(kept[i], kept[0]) << i;
  EXPECT_LT(kept[3], std::min(kept[1], kept[2]));

  // Saved under none, resumed under block: the same losses as the uninterrupted run.
  TrainConfig first = c;
  first.recompute = models::Recompute::none;
  first.steps = 2;
  first.log_path.clear();
  first.save_path = dir.file("ckpt.bin");
  run(first);
  TrainConfig second = c;
  second.recompute = models::Recompute::block;
  second.log_path.clear();
  second.resume_path = first.save_path;
  const TrainSummary resumed = run(second);
  ASSERT_EQ(resumed.losses.size(), 2u);
  EXPECT_EQ(resumed.losses[0], straight[2]);
  EXPECT_EQ(resumed.losses[1], straight[3]);
}

// A run that fails inside the loop records why before the error propagates.
TEST(Trainer, AFailedRunRecordsItsErrorInTheLog) {
  test::TempDir dir;
  TrainConfig c = tiny_run(5);
  c.val_data.clear();
  c.lr = 1e30;  // the first update sends the weights to ~1e30: the next loss is not finite
  c.log_path = dir.file("diverged.jsonl");
  EXPECT_THROW(run(c), Error);
  const RunLog log = read_run_log(c.log_path);
  ASSERT_TRUE(log.ok()) << log.error;
  ASSERT_TRUE(log.failure.has_value());
  EXPECT_EQ(log.failure->kind, "error");
  EXPECT_FALSE(log.failure->out_of_memory());
  EXPECT_NE(log.failure->message.find("training diverged"), std::string::npos)
      << log.failure->message;
  EXPECT_EQ(static_cast<int64_t>(log.steps.size()), log.failure->step - 1);
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
  expect_cli_error("--device cpu --cuda-graph on --steps 1",
                   "--cuda-graph on: graphs replay GPU work");
  expect_cli_error("--cuda-graph sometimes --steps 1", "--cuda-graph");
  expect_cli_error("--device cpu --gemm-tune --steps 1", "--gemm-tune times the GPU's");
  expect_cli_error("--gemm-tune --deterministic --steps 1", "use one or the other");
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
  expect_cli_error(common + "--steps 4 --doc-mask --resume " + ckpt, "different run");
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

TEST(TrainCli, DocMaskRuns) {
  const test::CommandResult r = test::run_cli(
      "train --batch-size 2 --seq-len 32 --steps 2 --sample-tokens 8 --val-steps 2 --doc-mask "
      "--attention flash --window 8 --global-every 2 --device cpu");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("doc mask at end-of-text 50256"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(window 8, every 2 full)"), std::string::npos) << r.output;
  expect_cli_error("--doc-mask --tokenizer data/missing.bin --steps 1", "data/missing.bin");
}

}  // namespace
}  // namespace ft::train

// Training steps replayed by a CUDA graph (--cuda-graph): the same losses as the steps run as
// usual, bit for bit, over 50 steps whose learning rate moves (warm-up and cosine decay), with
// gradient accumulation, evaluations and samples between replays; where graphs cannot be used, a
// clear error; the capturing step's peak memory as it was. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "core/device.h"
#include "core/error.h"
#include "test_util.h"
#include "train/trainer.h"

namespace ft::train {
namespace {

TrainConfig gpu_run(const std::string& model, DType dtype, attention::Impl impl) {
  TrainConfig c;
  c.model = model;
  c.train_data = test::source_path("data/tinyshakespeare_train.bin");
  c.val_data = test::source_path("data/tinyshakespeare_val.bin");
  c.tokenizer = test::source_path("data/gpt2_tokenizer.bin");
  c.batch_size = 4;
  c.seq_len = 64;
  c.total_batch_size = 4 * 64 * 2;  // two micro-batches per step
  c.steps = 50;
  c.lr = 3e-3;
  c.warmup = 5;
  c.eval_every = 20;  // eager forwards between replays
  c.val_steps = 2;
  c.sample_every = 25;
  c.sample_tokens = 8;
  c.quiet = true;
  c.device = Device::cuda;
  c.dtype = dtype;
  c.attention.impl = impl;
  if (dtype == DType::bf16 && impl == attention::Impl::flash) {
    // The bf16 flash backward sums dQ in a fixed order only on its tma path, which takes head
    // dim 64: two heads of 64 (llama: one kv head per two query heads).
    c.attention.deterministic = true;
    c.overrides.heads = 2;
    if (model == "llama3-tiny") c.overrides.kv_heads = 1;
  }
  return c;
}

struct Ran {
  TrainSummary summary;
  std::string output;
};

Ran run(const TrainConfig& c) {
  std::ostringstream out;
  Ran r{train(c, out), ""};
  r.output = out.str();
  return r;
}

void expect_graph_equals_eager(TrainConfig c) {
  c.cuda_graph = TrainConfig::CudaGraph::off;
  const Ran eager = run(c);
  c.cuda_graph = TrainConfig::CudaGraph::on;
  const Ran graph = run(c);
  EXPECT_EQ(graph.summary.losses, eager.summary.losses);
  EXPECT_EQ(graph.summary.final_val_loss, eager.summary.final_val_loss);
  EXPECT_EQ(graph.summary.sample, eager.summary.sample);
  EXPECT_NE(graph.output.find("graph:     step 2 captured"), std::string::npos) << graph.output;
  EXPECT_NE(eager.output.find("graph:     off (--cuda-graph off)"), std::string::npos)
      << eager.output;
}

TEST(CudaGraphTraining, ReplayedStepsGiveTheEagerLossesBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
  expect_graph_equals_eager(gpu_run("gpt2-tiny", DType::f32, attention::Impl::naive));
  expect_graph_equals_eager(gpu_run("gpt2-tiny", DType::bf16, attention::Impl::flash));
  TrainConfig llama = gpu_run("llama3-tiny", DType::bf16, attention::Impl::flash);
  llama.steps = 12;
  llama.recompute = models::Recompute::block;
  expect_graph_equals_eager(llama);
}

TEST(CudaGraphTraining, AutoUsesGraphsAndSaysWhereItCannot) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
  test::TempDir dir;
  TrainConfig c = gpu_run("gpt2-tiny", DType::f32, attention::Impl::flash);
  c.steps = 4;
  c.log_path = dir.file("run.jsonl");
  const Ran ran = run(c);  // automatic
  EXPECT_NE(ran.output.find("graph:     step 2 captured"), std::string::npos) << ran.output;
  std::ifstream log(c.log_path);
  std::string first;
  std::getline(log, first);
  EXPECT_EQ(nlohmann::json::parse(first).at("cuda_graph"), true);

  c.log_path.clear();
  c.profile_step = 0;
  EXPECT_NE(run(c).output.find("graph:     not used: --profile"), std::string::npos);
  c.cuda_graph = TrainConfig::CudaGraph::on;
  try {
    run(c);
    FAIL() << "--cuda-graph on with --profile ran";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--cuda-graph on: --profile"), std::string::npos)
        << e.what();
  }
}

// The step that captures the graph holds the first step's leftovers until the capture ends and
// the graph's memory only from its first replay on: its peak is the larger of the two stretches
// (at most the first step's or a replayed step's), not the sum of the pool's and the graph
// memory's high-water marks, which are reached at different moments.
TEST(CudaGraphTraining, CapturingStepPeakIsItsLargerStretch) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
  test::TempDir dir;
  TrainConfig c = gpu_run("gpt2-tiny", DType::bf16, attention::Impl::flash);
  c.steps = 4;
  c.cuda_graph = TrainConfig::CudaGraph::on;
  c.log_path = dir.file("run.jsonl");
  run(c);
  std::ifstream log(c.log_path);
  std::map<int64_t, double> peak;  // step -> peak used MB
  for (std::string line; std::getline(log, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("step") && j.contains("peak_used_mb")) {
      peak[j.at("step").get<int64_t>()] = j.at("peak_used_mb").get<double>();
    }
  }
  ASSERT_EQ(peak.size(), 4u);
  EXPECT_GT(peak[1], 0.0);
  EXPECT_LE(peak[2], std::max(peak[1], peak[3]) + 0.5)
      << "steps 1-3: " << peak[1] << ", " << peak[2] << ", " << peak[3] << " MB";
}

}  // namespace
}  // namespace ft::train

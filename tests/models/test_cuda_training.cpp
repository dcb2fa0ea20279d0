// Training steps on the GPU against the CPU: the same model, weights and batch must give the
// same loss and gradients (fp32: 1e-5 relative), and the same losses after AdamW updates, with
// and without document segment ids; a kernel-config file's rows reach the flash kernels.
// Skips without CUDA or a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "attention/kernel_config_file.h"
#include "core/device.h"
#include "core/error.h"
#include "core/rng.h"
#include "models/transformer.h"
#include "small_models.h"
#include "test_util.h"
#include "train/documents.h"
#include "train/run_log.h"
#include "train/tokenizer.h"
#include "train/trainer.h"

namespace ft::models {
namespace {

using testing::adamw_step;
using testing::random_tokens;

bool gpu_ready(std::string& why) {
#ifndef FLASHTRAIN_WITH_CUDA
  why = "built without CUDA";
  return false;
#else
  if (cuda_device_count() == 0) {
    why = cuda_unavailable_reason();
    return false;
  }
  return true;
#endif
}

#define REQUIRE_GPU()                           \
  do {                                          \
    std::string why_;                           \
    if (!gpu_ready(why_)) GTEST_SKIP() << why_; \
  } while (0)

// Head dim 16 (width 64 / 4 heads); head_dim 32 where the bf16 flash kernels need it (they are
// compiled for 32, 64 and 128; other head dims are refused with that reason).
ModelConfig small(const std::string& name, int64_t head_dim = 16) {
  ModelOverrides o;
  o.layers = 2;
  o.width = 4 * head_dim;
  o.heads = 4;
  o.context = 64;
  if (name == "llama3-tiny") o.kv_heads = 2;
  return apply_overrides(preset(name), o);
}

constexpr double kLr = 1e-3;

// {model, dtype, GPU attention}: the GPU model (naive or flash attention) against the CPU model
// with naive attention.
class CudaTraining
    : public ::testing::TestWithParam<std::tuple<std::string, std::string, std::string>> {};

TEST_P(CudaTraining, StepsMatchTheCpu) {
  REQUIRE_GPU();
  const auto& [name, dtype_name_, impl_name_] = GetParam();
  const DType dtype = parse_dtype(dtype_name_);
  const attention::Impl impl = attention::parse_impl(impl_name_);
  const ModelConfig config =
      small(name, impl == attention::Impl::flash && dtype == DType::bf16 ? 32 : 16);
  Transformer cpu(config, dtype, {attention::Impl::naive, 0, 0}, Device::cpu);
  Transformer gpu(config, dtype, {impl, 0, 0}, Device::cuda);
  cpu.init_weights(21);
  gpu.init_weights(21);
  Rng rng(4);
  // fp32 must match the CPU to 1e-5; bf16 rounds activations differently on each device
  // (different summation orders before each rounding), so a few bf16 ulps (2^-8) are allowed.
  const double loss_tol = dtype == DType::f32 ? 1e-5 : 1e-2;
  const double grad_tol = dtype == DType::f32 ? 1e-5 : 5e-2;
  for (int64_t step = 1; step <= 3; ++step) {
    const Tensor x = random_tokens(2, 48, config.vocab_size, rng);
    const Tensor y = random_tokens(2, 48, config.vocab_size, rng);
    cpu.zero_grad();
    gpu.zero_grad();
    const double l_cpu = cpu.forward(x, y);
    const double l_gpu = gpu.forward(x, y);
    EXPECT_NEAR(l_gpu, l_cpu, loss_tol * l_cpu) << name << " step " << step;
    cpu.backward(1.0);
    gpu.backward(1.0);
    for (size_t i = 0; i < cpu.parameters().size(); ++i) {
      const Tensor g_gpu = gpu.parameters()[i].grad.to(Device::cpu);
      const Tensor& g_cpu = cpu.parameters()[i].grad;
      ASSERT_TRUE(all_finite(g_gpu)) << cpu.parameters()[i].name;
      // After AdamW updates (steps 2 and 3) the weights themselves differ by rounding, and
      // AdamW turns tiny gradient differences into lr-sized weight differences where the
      // second moment is small; measured 1.5e-5 for llama3-tiny fp32. Step 1 is the issue's
      // 1e-5 check of one training step; later steps get 10x room.
      EXPECT_LT(relative_error(g_gpu, g_cpu), step == 1 ? grad_tol : 10 * grad_tol)
          << name << " " << dtype_name_ << " step " << step << " " << cpu.parameters()[i].name;
    }
    adamw_step(cpu, step, kLr);
    adamw_step(gpu, step, kLr);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaTraining,
                         ::testing::Combine(::testing::Values("gpt2-tiny", "llama3-tiny"),
                                            ::testing::Values("fp32", "bf16"),
                                            ::testing::Values("naive", "flash")));

// train --doc-mask on the GPU: segment ids made on the CPU (as the trainer makes them) reach
// every layer's attention on the GPU, alone and under a window with a full-attention layer.
TEST(CudaDocMask, StepMatchesTheCpu) {
  REQUIRE_GPU();
  const ModelConfig config = small("llama3-tiny");
  // llama3-tiny uses GPT-2's vocabulary, so GPT-2's end-of-text id.
  const int32_t eot = train::Tokenizer(test::source_path("data/gpt2_tokenizer.bin")).eot_token();
  Rng rng(8);
  Tensor x = random_tokens(2, 48, config.vocab_size, rng);
  for (int64_t i : {0, 5, 6, 30, 47, 48 + 20}) x.data<int32_t>()[i] = eot;
  const Tensor y = random_tokens(2, 48, config.vocab_size, rng);
  const Tensor segments = train::document_segment_ids(x, eot);
  for (const AttentionSettings& s : {AttentionSettings{attention::Impl::naive, 0, 0},
                                     AttentionSettings{attention::Impl::naive, 8, 2},
                                     AttentionSettings{attention::Impl::flash, 0, 0},
                                     AttentionSettings{attention::Impl::flash, 8, 2}}) {
    Transformer cpu(config, DType::f32, {attention::Impl::naive, s.window, s.global_every},
                    Device::cpu);
    Transformer gpu(config, DType::f32, s, Device::cuda);
    cpu.init_weights(21);
    gpu.init_weights(21);
    const double l_cpu = cpu.forward(x, y, segments);
    const double l_gpu = gpu.forward(x, y, segments);
    EXPECT_NEAR(l_gpu, l_cpu, 1e-5 * l_cpu)
        << attention::impl_name(s.impl) << " window " << s.window;
    EXPECT_GT(std::fabs(l_cpu - cpu.forward(x, y)), 1e-6) << "the mask changes the loss";
    cpu.forward(x, y, segments);
    cpu.backward(1.0);
    gpu.backward(1.0);
    for (size_t i = 0; i < cpu.parameters().size(); ++i) {
      const Tensor g_gpu = gpu.parameters()[i].grad.to(Device::cpu);
      EXPECT_LT(relative_error(g_gpu, cpu.parameters()[i].grad), 1e-5)
          << attention::impl_name(s.impl) << " window " << s.window << " "
          << cpu.parameters()[i].name;
    }
  }
}

TEST(CudaTrainer, TrainsDeterministicallyAndReportsMemory) {
  REQUIRE_GPU();
  train::TrainConfig c;
  c.model = "llama3-tiny";
  c.train_data = test::source_path("data/tinyshakespeare_train.bin");
  c.val_data.clear();
  c.tokenizer = test::source_path("data/gpt2_tokenizer.bin");
  c.device = Device::cuda;
  c.dtype = DType::bf16;
  c.batch_size = 8;
  c.seq_len = 128;
  c.steps = 20;
  c.lr = 3e-3;
  c.sample_tokens = 16;
  test::TempDir dir;
  c.log_path = dir.file("log.jsonl");
  std::ostringstream out_a, out_b;
  const train::TrainSummary a = train::train(c, out_a);
  const train::TrainSummary b = train::train(c, out_b);
  EXPECT_EQ(a.losses, b.losses);  // same seed, same losses, run after run
  EXPECT_LT(a.losses.back(), a.losses.front() - 1.0);
  EXPECT_FALSE(a.sample.empty());
  EXPECT_NE(out_a.str().find("peak reserved"), std::string::npos);
}

// bf16 flash training of a tiny model at head dim 64 (width 256: 4 heads of 64, a head dim of
// the tma backward) with the deterministic attention backward, on the Shakespeare shards.
train::TrainConfig deterministic_flash_run(const std::string& model) {
  train::TrainConfig c;
  c.model = model;
  c.overrides.width = 256;
  c.train_data = test::source_path("data/tinyshakespeare_train.bin");
  c.val_data.clear();
  c.tokenizer = test::source_path("data/gpt2_tokenizer.bin");
  c.device = Device::cuda;
  c.dtype = DType::bf16;
  c.attention.impl = attention::Impl::flash;
  c.attention.deterministic = true;
  c.lr = 3e-3;
  c.sample_tokens = 0;
  return c;
}

// Deterministic attention (TrainConfig's attention.deterministic, `train --deterministic`): bf16
// flash training gives the same losses bit for bit, run after run, with the dQ parts of several
// key blocks meeting in every query tile (head dim 64, 256 positions: two key blocks of 128).
TEST(CudaTrainer, FlashTrainsBitIdenticallyInDeterministicMode) {
  REQUIRE_GPU();
  train::TrainConfig c = deterministic_flash_run("llama3-tiny");
  c.batch_size = 8;
  c.seq_len = 256;
  c.steps = 10;
  std::ostringstream out_a, out_b, out_c;
  const train::TrainSummary a = train::train(c, out_a);
  const train::TrainSummary b = train::train(c, out_b);
  const train::TrainSummary d = train::train(c, out_c);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.losses, d.losses);
  EXPECT_LT(a.losses.back(), a.losses.front());
}

// --recompute on the GPU: bf16 flash training in every mode gives the losses of none bit for
// bit. The recomputed activations are the dropped ones because every kernel gives the same bits
// on the same inputs; the one that would not (the bf16 flash backward's dQ sums) runs in its
// deterministic mode, so the comparison sees only what recompute changes.
TEST(CudaTrainer, RecomputeModesTrainBitIdenticallyToNone) {
  REQUIRE_GPU();
  for (const std::string model : {"gpt2-tiny", "llama3-tiny"}) {
    train::TrainConfig c = deterministic_flash_run(model);
    c.batch_size = 4;
    c.seq_len = 256;
    c.total_batch_size = 2 * c.batch_size * c.seq_len;
    c.steps = 4;
    c.quiet = true;
    std::ostringstream out;
    const train::TrainSummary none = train::train(c, out);
    for (Recompute mode :
         {Recompute::attention, Recompute::mlp, Recompute::block, Recompute::elementwise}) {
      c.recompute = mode;
      EXPECT_EQ(train::train(c, out).losses, none.losses) << model << " " << recompute_name(mode);
    }
  }
}

// On the GPU the layers hand flash the fused QKV buffer (its tma kernels read q, k, v in place and
// write dq, dk, dv into the fused gradient; LLaMA's RoPE turns the buffer's heads in place):
// bf16 training gives the split path's losses bit for bit, dense, with a window and with
// documents (the backward deterministic, as above).
TEST(CudaTrainer, FusedQkvTrainsTheSplitPathsLossesBitForBit) {
  REQUIRE_GPU();
  for (const std::string model : {"gpt2-tiny", "llama3-tiny"}) {
    for (int mask = 0; mask < 3; ++mask) {
      train::TrainConfig c = deterministic_flash_run(model);
      c.batch_size = 4;
      c.seq_len = 256;
      c.steps = 4;
      c.quiet = true;
      c.attention.window = mask == 1 ? 64 : 0;
      c.doc_mask = mask == 2;
      std::ostringstream out;
      const train::TrainSummary fused = train::train(c, out);
      c.attention.qkv_in_place = false;
      EXPECT_EQ(train::train(c, out).losses, fused.losses) << model << " mask " << mask;
    }
  }
}

// A kernel-config file reaches every attention call: its row is what flash_kernel_configs()
// reports and what the kernels run (an unchecked row that can_implement refuses fails the
// forward, named), a runnable row trains as the built-in one does (bf16, within rounding), and
// train() prints and logs the configuration of each mask class.
TEST(CudaKernelConfigFile, RowsReachTheFlashKernels) {
  REQUIRE_GPU();
  const ModelConfig config = small("gpt2-tiny", 32);
  const std::string family =
      attention::arch_family(attention::DeviceLimits::current().compute_capability);
  const auto text = [&](const std::string& kernel_config) {
    return str(R"({"format": "flashtrain-kernel-config", "version": 1, "rows": [{"arch": ")",
               family, R"(", "max_head_dim": 32, "mask": "dense", "config": ")", kernel_config,
               R"("}]})");
  };
  const auto file = [&](const std::string& kernel_config) {
    return std::make_shared<const attention::KernelConfigFile>(
        attention::parse_kernel_config_file(text(kernel_config), "k.json"));
  };
  Rng rng(5);
  const Tensor x = random_tokens(2, 48, config.vocab_size, rng);
  const Tensor y = random_tokens(2, 48, config.vocab_size, rng);
  const AttentionSettings builtin{attention::Impl::flash, 0, 0};
  Transformer reference(config, DType::bf16, builtin, Device::cuda);
  reference.init_weights(3);
  const double l_ref = reference.forward(x, y);

  AttentionSettings tuned = builtin;
  tuned.kernel_configs = file("fwd=64x64/128 bwd=64x64/128/double");
  Transformer model(config, DType::bf16, tuned, Device::cuda);
  model.init_weights(3);
  const std::vector<attention::KernelConfigChoice> dense = model.flash_kernel_configs(2, 48, false);
  ASSERT_EQ(dense.size(), 1u);
  EXPECT_EQ(dense[0].config.str(), "fwd=64x64/128 bwd=64x64/128/double");
  EXPECT_EQ(dense[0].row, &tuned.kernel_configs->rows[0]);
  EXPECT_NEAR(model.forward(x, y), l_ref, 1e-2 * l_ref);
  model.backward(1.0);
  // With segment ids every layer is local: the file has no local row, the built-in table decides.
  const std::vector<attention::KernelConfigChoice> local = model.flash_kernel_configs(2, 48, true);
  ASSERT_EQ(local.size(), 1u);
  EXPECT_EQ(local[0].row, nullptr);

  AttentionSettings broken = builtin;
  broken.kernel_configs = file("fwd=64x64/256 bwd=64x64/128/double");  // 8 warps, 64 rows
  Transformer bad(config, DType::bf16, broken, Device::cuda);
  bad.init_weights(3);
  try {
    bad.flash_kernel_configs(2, 48, false);
    ADD_FAILURE() << "a row can_implement refuses was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("kernel config file k.json, rows[0]"), std::string::npos)
        << e.what();
  }
  try {
    bad.forward(x, y);
    ADD_FAILURE() << "the forward did not run the file's configuration";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fwd=64x64/256"), std::string::npos) << e.what();
  }

  test::TempDir dir;
  { std::ofstream(dir.file("k.json")) << text("fwd=64x64/128 bwd=64x64/128/double"); }
  train::TrainConfig c;
  c.model = "gpt2-tiny";
  c.train_data = test::source_path("data/tinyshakespeare_train.bin");
  c.val_data.clear();
  c.device = Device::cuda;
  c.dtype = DType::bf16;
  c.attention.impl = attention::Impl::flash;
  c.kernel_config_path = dir.file("k.json");
  c.steps = 2;
  c.sample_tokens = 0;
  c.log_path = dir.file("log.jsonl");
  std::ostringstream out;
  train::train(c, out);
  EXPECT_NE(out.str().find("kernels:   --kernel-config " + c.kernel_config_path), std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("dense masks: fwd=64x64/128 bwd=64x64/128/double (kernel config file "),
            std::string::npos)
      << out.str();
  std::ifstream log(c.log_path);
  std::string first;
  std::getline(log, first);
  const nlohmann::json run = nlohmann::json::parse(first);
  EXPECT_EQ(run["kernel_config"], c.kernel_config_path);
  EXPECT_EQ(run["kernel_configs"]["dense"], "fwd=64x64/128 bwd=64x64/128/double");
}

// A naive baseline that does not fit must leave a log that says so (the study's compare-loss
// and summarize report it as "base OOM" rather than as a broken log): 4 heads x 131072^2 fp32
// probabilities are 275 GB, beyond any one GPU.
TEST(CudaTrainer, NaiveOutOfMemoryIsLoggedAsSuch) {
  REQUIRE_GPU();
  train::TrainConfig c;
  c.model = "gpt2-tiny";
  c.overrides.context = 131072;
  c.train_data = test::source_path("data/tinyshakespeare_train.bin");
  c.val_data.clear();
  c.device = Device::cuda;
  c.batch_size = 1;
  c.seq_len = 131072;
  c.steps = 2;
  c.sample_tokens = 0;
  c.quiet = true;
  test::TempDir dir;
  c.log_path = dir.file("naive.jsonl");
  std::ostringstream out;
  EXPECT_THROW(train::train(c, out), OutOfMemory);
  const train::RunLog log = train::read_run_log(c.log_path);
  ASSERT_TRUE(log.ok()) << log.error;
  ASSERT_TRUE(log.failure.has_value());
  EXPECT_TRUE(log.failure->out_of_memory());
  EXPECT_EQ(log.failure->step, 1);
  EXPECT_NE(log.failure->message.find("out of GPU memory"), std::string::npos)
      << log.failure->message;
  EXPECT_TRUE(log.steps.empty());
}

}  // namespace
}  // namespace ft::models

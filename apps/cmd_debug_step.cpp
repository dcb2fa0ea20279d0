// `flashtrain debug-step`: one training step on one fixed batch, with everything dumped, so that
// another framework (tests/torch_parity.py: PyTorch) can check our logits, loss, gradients and a
// short AdamW trajectory against its own on the same llm.c checkpoint.
//
// Writes to --out-dir: logits.npy (fp32 [B*T, padded vocab], the first forward), one
// grad_<parameter name>.npy (fp32, the first backward) per parameter, and losses.json
// ({"loss": first loss, "losses": loss before each of --steps AdamW updates, "grad_norms": ...}).
// Each step is train's: zero_grad, forward, backward, then train::Optimizer (global norm, clipping,
// AdamW over every parameter in one multi-tensor update that refreshes the compute copies) at a
// constant learning rate with 1-based step numbers. Only the schedule and the data differ.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "core/device.h"
#include "core/error.h"
#include "core/npy.h"
#include "core/output_path.h"
#include "models/checkpoint.h"
#include "models/transformer.h"
#include "nn/adamw.h"
#include "train/optimizer.h"

namespace ft::cli {
namespace {

struct DebugStepFlags {
  std::string load_path, tokens_path, targets_path, out_dir;
  std::string device = "cpu", dtype = "fp32", attention = "naive";
  int64_t steps = 10;
  double lr = 1e-4, grad_clip = 0.0;
  nn::AdamWConfig adamw;
};

// [B, T] ids (int32 or int64 .npy) in [0, vocab), T within the model's context.
Tensor load_ids(const std::string& path, const char* what, const models::ModelConfig& mc) {
  Tensor ids = npy::load_ids(path);
  FT_CHECK(ids.ndim() == 2, path, ": ", what, " must be [B, T], got shape ",
           shape_str(ids.shape()));
  FT_CHECK(ids.numel() > 0, path, ": ", what, " ", shape_str(ids.shape()), " is empty");
  FT_CHECK(ids.dim(1) <= mc.max_seq_len, path, ": ", what, " have T = ", ids.dim(1),
           ", more than the model's context ", mc.max_seq_len);
  const int32_t* p = ids.data<int32_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    FT_CHECK(p[i] >= 0 && p[i] < mc.vocab_size, path, ": ", what, " id ", p[i], " at index ", i,
             " is outside [0, ", mc.vocab_size, ")");
  }
  return ids;
}

Tensor to_host_f32(const Tensor& t) {
  return t.to(Device::cpu).to(DType::f32);
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  FT_CHECK(out.good(), path, ": cannot open for writing");
  out << j.dump(2) << "\n";
  FT_CHECK(out.good(), path, ": write failed");
}

void run(const DebugStepFlags& f) {
  FT_CHECK(f.steps >= 0, "--steps must be >= 0, got ", f.steps);
  FT_CHECK(f.lr >= 0 && std::isfinite(f.lr), "--lr must be a finite number >= 0, got ", f.lr);
  FT_CHECK(f.grad_clip >= 0 && std::isfinite(f.grad_clip),
           "--grad-clip must be a finite number >= 0 (0: off), got ", f.grad_clip);
  FT_CHECK(f.adamw.weight_decay >= 0 && std::isfinite(f.adamw.weight_decay),
           "--weight-decay must be a finite number >= 0, got ", f.adamw.weight_decay);
  const Device device = f.device == "cuda" ? Device::cuda : Device::cpu;
  if (device == Device::cuda) {
    FT_CHECK(cuda_device_count() > 0, "--device cuda: ", cuda_unavailable_reason());
  }
  const DType dtype = parse_dtype(f.dtype);
  models::AttentionSettings attention;
  attention.impl = attention::parse_impl(f.attention);

  const models::ModelConfig mc = models::read_checkpoint_config(f.load_path);
  const Tensor tokens = load_ids(f.tokens_path, "tokens", mc);
  const Tensor targets = load_ids(f.targets_path, "targets", mc);
  FT_CHECK(targets.shape() == tokens.shape(), f.targets_path, ": targets ",
           shape_str(targets.shape()), " must have the shape of the tokens ",
           shape_str(tokens.shape()));
  prepare_output_dir(f.out_dir, "--out-dir");  // before any work: the dumps must land
  models::Transformer model(mc, dtype, attention, device);
  models::load_checkpoint(f.load_path, model);
  const std::filesystem::path dir(f.out_dir);

  // Step 1, dumped: the classifier backward overwrites the logits, so save them first.
  model.zero_grad();
  const double loss = model.forward(tokens, targets);
  npy::save((dir / "logits.npy").string(), to_host_f32(model.logits()));
  model.backward(1.0);
  for (const models::Parameter& p : model.parameters()) {
    npy::save((dir / ("grad_" + p.name + ".npy")).string(), to_host_f32(p.grad));
  }

  train::Optimizer optimizer(model, f.adamw, f.grad_clip);
  std::vector<double> losses, norms;
  for (int64_t step = 1; step <= f.steps; ++step) {
    double step_loss = loss;
    if (step > 1) {
      model.zero_grad();
      step_loss = model.forward(tokens, targets);
      model.backward(1.0);
    }
    FT_CHECK(std::isfinite(step_loss), "loss is ", step_loss, " at step ", step);
    losses.push_back(step_loss);
    norms.push_back(optimizer.step(step, f.lr).grad_norm());
  }
  synchronize(device);
  write_json((dir / "losses.json").string(), {{"model", models::family_name(mc.family)},
                                              {"device", device_name(device)},
                                              {"dtype", dtype_name(dtype)},
                                              {"batch", tokens.dim(0)},
                                              {"seq_len", tokens.dim(1)},
                                              {"loss", loss},
                                              {"losses", losses},
                                              {"grad_norms", norms}});
  std::cout << "model:  " << mc.describe() << "\n"
            << "run:    " << device_name(device) << ", " << dtype_name(dtype) << ", batch "
            << tokens.dim(0) << " x " << tokens.dim(1) << ", " << f.steps << " AdamW steps at lr "
            << f.lr << "\n";
  std::printf("loss:   %.9g\n", loss);
  if (!losses.empty())
    std::printf("last:   %.9g (before step %zu)\n", losses.back(), losses.size());
  std::cout << "wrote:  " << f.out_dir << "/{logits.npy, grad_*.npy (" << model.parameters().size()
            << "), losses.json}\n";
}

}  // namespace

void add_debug_step_command(CLI::App& app) {
  auto flags = std::make_shared<DebugStepFlags>();
  DebugStepFlags& f = *flags;
  CLI::App* cmd = app.add_subcommand(
      "debug-step",
      "Run training steps on one fixed batch and dump logits, loss, every gradient and the "
      "losses of AdamW steps (for parity checks against another framework)");
  cmd->add_option("--load", f.load_path, "llm.c checkpoint (GPT-2 or LLaMA-3)")->required();
  cmd->add_option("--tokens", f.tokens_path, "Input token ids, .npy int32 or int64 [B, T]")
      ->required();
  cmd->add_option("--targets", f.targets_path, "Target token ids, .npy int32 or int64 [B, T]")
      ->required();
  cmd->add_option("--out-dir", f.out_dir, "Directory for the outputs (created if missing)")
      ->required();
  cmd->add_option("--device", f.device, "cpu or cuda")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--dtype", f.dtype,
                  "fp32 or bf16 (bf16 weights and activations, fp32 master weights and "
                  "accumulation)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--attention", f.attention, "naive (materialises S x S) or flash")
      ->check(CLI::IsMember({"naive", "flash"}))
      ->capture_default_str();
  cmd->add_option("--steps", f.steps, "AdamW steps on the batch (0: only the dumped step)")
      ->capture_default_str();
  cmd->add_option("--lr", f.lr, "Constant learning rate")->capture_default_str();
  cmd->add_option("--weight-decay", f.adamw.weight_decay, "AdamW weight decay (matrices only)")
      ->capture_default_str();
  cmd->add_option("--grad-clip", f.grad_clip, "Clip the global gradient norm (0: off)")
      ->capture_default_str();
  cmd->callback([flags]() { run(*flags); });
}

}  // namespace ft::cli

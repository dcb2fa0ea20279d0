// `flashtrain attention`: run one attention implementation on .npy files, so that any framework
// can check our kernels against its own. Parses flags, loads, calls ft::attention, writes.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "attention/attention.h"
#include "attention/kernel_config.h"
#include "attention/kernel_config_file.h"
#include "commands.h"
#include "core/device.h"
#include "core/npy.h"
#include "core/output_path.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

namespace ft::cli {
namespace {

struct AttentionOptions {
  std::string q, k, v, dout, segment_ids, out_dir;
  std::string impl = "flash", device = "cpu", dtype = "fp32";
  std::string config;         // CUDA flash kernel config; empty: the device's default
  std::string kernel_config;  // a kernel-config file whose rows come before the built-in table
  bool causal = false, check = false, deterministic = false;
  int64_t window = 0;
  double scale = 0.0;
};

// Loads a q/k/v/do input: float32, or bf16 stored as uint16; converted to the run's dtype.
Tensor load_float_input(const std::string& flag, const std::string& path, DType dtype) {
  Tensor t = npy::load(path);
  FT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16, "--", flag, " ", path,
           " has dtype ", dtype_name(t.dtype()),
           "; expected float32, or bfloat16 stored as uint16");
  return t.dtype() == dtype ? t : t.to(dtype);
}

// int32 or int64 ids [B, S] for queries q [B, S, Hq, D].
Tensor load_segment_ids(const std::string& path, const Tensor& q) {
  Tensor t;
  try {
    t = npy::load(path);
  } catch (const Error&) {
    t = npy::load_ids(path);  // int64 ('<i8') is no tensor dtype: read as int32, range-checked
  }
  FT_CHECK(t.dtype() == DType::i32, "--segment-ids ", path, " has dtype ", dtype_name(t.dtype()),
           "; expected int32 or int64");
  FT_CHECK(t.ndim() == 2 && q.ndim() == 4 && t.dim(0) == q.dim(0) && t.dim(1) == q.dim(1),
           "--segment-ids ", path, " has shape ", shape_str(t.shape()), "; expected [B, S] = [",
           q.ndim() == 4 ? q.dim(0) : 0, ", ", q.ndim() == 4 ? q.dim(1) : 0, "] for --q ",
           shape_str(q.shape()));
  return t;
}

// Waits for queued GPU work, so that a time measured around a call includes it.
void wait_for(Device device) {
#ifdef FLASHTRAIN_WITH_CUDA
  if (device == Device::cuda) cuda::synchronize();
#else
  (void)device;
#endif
}

double seconds_since(Device device, std::chrono::steady_clock::time_point start) {
  wait_for(device);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Device parse_run_device(const std::string& flag) {
  const Device device = parse_device(flag);
  if (device == Device::cuda) {
    FT_CHECK(cuda_device_count() > 0, "--device cuda: ", cuda_unavailable_reason());
  }
  return device;
}

// The tensor itself on the CPU, else a copy there (what .npy files and --check need).
Tensor on_cpu(const Tensor& t) {
  return t.device() == Device::cpu ? t : t.to(Device::cpu);
}

// fp64 (reference) outputs are written as float64; bf16 as uint16; lse as float32 otherwise.
void write_output(const std::string& dir, const std::string& name, const Tensor& t) {
  const std::string path = (std::filesystem::path(dir) / (name + ".npy")).string();
  npy::save(path, on_cpu(t));
  std::printf("wrote %s %s %s\n", path.c_str(), shape_str(t.shape()).c_str(),
              dtype_name(t.dtype()));
}

void print_check(const char* name, const Tensor& got, const Tensor& ref) {
  std::printf("check %-3s relative error vs reference: %.3e (max abs diff %.3e)%s\n", name,
              relative_error(got, ref), max_abs_diff(got, ref),
              all_finite(got) ? "" : "  NOT FINITE");
}

// lse holds -inf on rows that see no key; compare only the finite entries.
void print_lse_check(const Tensor& got, const Tensor& ref) {
  const Tensor g = got.to(DType::f64), r = ref.to(DType::f64);
  double num = 0, den = 0;
  int64_t mismatched_infinities = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    const double a = g.data<double>()[i], b = r.data<double>()[i];
    if (std::isinf(b) || std::isinf(a)) {
      mismatched_infinities += (a == b) ? 0 : 1;
      continue;
    }
    num += (a - b) * (a - b);
    den += b * b;
  }
  std::printf("check lse relative error vs reference: %.3e (rows with mismatched -inf: %lld)\n",
              den > 0 ? std::sqrt(num / den) : std::sqrt(num),
              static_cast<long long>(mismatched_infinities));
}

void run_attention(const AttentionOptions& opt) {
  // The file first: a bad one is reported as such whatever the other flags say.
  std::optional<attention::KernelConfigFile> kernel_file;
  if (!opt.kernel_config.empty()) {
    kernel_file = attention::read_kernel_config_file(opt.kernel_config);
  }
  const Device device = parse_run_device(opt.device);
  const attention::Impl impl = attention::parse_impl(opt.impl);
  const DType dtype = parse_dtype(opt.dtype);
  FT_CHECK(dtype == DType::f32 || dtype == DType::bf16, "--dtype ", opt.dtype,
           " is not supported (allowed: fp32, bf16)");
  FT_CHECK(impl != attention::Impl::reference || device == Device::cpu,
           "--impl reference is the fp64 CPU oracle; use --device cpu (or --impl naive|flash)");
  const bool flash_on_gpu = impl == attention::Impl::flash && device == Device::cuda;
  FT_CHECK(opt.config.empty() || flash_on_gpu,
           "--config sets the CUDA flash kernels' tiles: it needs --impl flash --device cuda");
  FT_CHECK(!kernel_file || flash_on_gpu, "--kernel-config ", opt.kernel_config,
           " sets the CUDA flash kernels' tiles: it needs --impl flash --device cuda");
  FT_CHECK(opt.window >= 0, "--window must be >= 0 (0: none), got ", opt.window);
  FT_CHECK(std::isfinite(opt.scale) && opt.scale >= 0,
           "--scale must be a finite number >= 0 "
           "(0: 1/sqrt(D)), got ",
           opt.scale);
  const Tensor q = load_float_input("q", opt.q, dtype);
  const Tensor k = load_float_input("k", opt.k, dtype);
  const Tensor v = load_float_input("v", opt.v, dtype);
  const Tensor segments = opt.segment_ids.empty() ? Tensor{} : load_segment_ids(opt.segment_ids, q);
  attention::Mask mask;
  mask.causal = opt.causal;
  mask.window = opt.window;
  mask.has_segments = segments.defined();
  attention::Problem problem = attention::make_problem(q, k, v, mask, opt.scale);
  problem.deterministic = opt.deterministic;
  const Tensor dout = opt.dout.empty() ? Tensor{} : load_float_input("do", opt.dout, dtype);
  FT_CHECK(!dout.defined() || dout.shape() == q.shape(), "--do ", opt.dout, " has shape ",
           shape_str(dout.shape()), "; it must have the shape of --q ", shape_str(q.shape()));
  attention::KernelConfig config;
  const attention::KernelConfig* config_arg = nullptr;
  std::string config_origin;
  if (!opt.config.empty()) {
    config = attention::KernelConfig::parse(opt.config);
    config_arg = &config;
    config_origin = kernel_file ? "--config, over --kernel-config" : "--config";
  }
  if (kernel_file && config_arg == nullptr) {
    // Checked here, so that a row that cannot run the problem is named as the file's.
    const attention::KernelConfigChoice choice = attention::checked_kernel_config(
        &*kernel_file, attention::DeviceLimits::current(), problem,
        dout.defined() ? attention::KernelDirection::both : attention::KernelDirection::forward);
    config = choice.config;
    config_arg = &config;
    config_origin = choice.origin();
  }
  prepare_output_dir(opt.out_dir, "--out-dir");  // before any work: the results must land
  std::printf("attention %s on %s: %s\n", attention::impl_name(impl), device_name(device),
              problem.describe().c_str());
  if (flash_on_gpu && dtype == DType::bf16) {
    const auto& limits = attention::DeviceLimits::current();
    std::printf("kernels %s (%s)\n",
                (config_arg ? config : attention::default_config(limits, problem)).str().c_str(),
                config_arg ? config_origin.c_str() : ("default for " + limits.arch).c_str());
  }

  // The inputs stay on the CPU for --check; segment ids are accepted on either device.
  const auto on_device = [&](const Tensor& t) {
    return t.defined() && device != Device::cpu ? t.to(device) : t;
  };
  const Tensor q_run = on_device(q), k_run = on_device(k), v_run = on_device(v);
  const Tensor dout_run = on_device(dout);
  wait_for(device);
  // Times include the first call's library set-up (e.g. cuBLAS); use bench/ for timings.
  auto start = std::chrono::steady_clock::now();
  attention::ForwardOutput fwd =
      attention::forward(impl, problem, q_run, k_run, v_run, segments, config_arg);
  std::printf("forward  %.3f ms\n", 1e3 * seconds_since(device, start));
  attention::Gradients grads;
  if (dout.defined()) {
    start = std::chrono::steady_clock::now();
    grads = attention::backward(impl, problem, q_run, k_run, v_run, fwd, dout_run, segments,
                                config_arg);
    std::printf("backward %.3f ms\n", 1e3 * seconds_since(device, start));
  }
  fwd.saved = Tensor{};  // naive's S x S probabilities are not needed any more
  const Tensor o = on_cpu(fwd.o), lse = on_cpu(fwd.lse);
  write_output(opt.out_dir, "o", o);
  write_output(opt.out_dir, "lse", lse);
  if (dout.defined()) {
    grads = {on_cpu(grads.dq), on_cpu(grads.dk), on_cpu(grads.dv)};
    write_output(opt.out_dir, "dq", grads.dq);
    write_output(opt.out_dir, "dk", grads.dk);
    write_output(opt.out_dir, "dv", grads.dv);
  }
  if (!opt.check) return;
  using attention::Impl;
  const attention::ForwardOutput ref =
      attention::forward(Impl::reference, problem, q, k, v, segments);
  print_check("o", o, ref.o);
  print_lse_check(lse, ref.lse);
  if (!dout.defined()) return;
  const attention::Gradients ref_grads =
      attention::backward(Impl::reference, problem, q, k, v, ref, dout, segments);
  print_check("dq", grads.dq, ref_grads.dq);
  print_check("dk", grads.dk, ref_grads.dk);
  print_check("dv", grads.dv, ref_grads.dv);
}

}  // namespace

void add_attention_command(CLI::App& app) {
  auto opt = std::make_shared<AttentionOptions>();
  CLI::App* cmd = app.add_subcommand(
      "attention",
      "Run one attention implementation on .npy files (q, k, v [B, S, H, D] float32 or bf16 "
      "as uint16) and write o, lse and, with --do, dq, dk, dv to --out-dir");
  cmd->add_option("--q", opt->q, "queries .npy [B, S, Hq, D]")->required();
  cmd->add_option("--k", opt->k, "keys .npy [B, S, Hkv, D]; Hq must be a multiple of Hkv")
      ->required();
  cmd->add_option("--v", opt->v, "values .npy, same shape as --k")->required();
  cmd->add_option("--do", opt->dout, "output gradient .npy like --q; also runs backward");
  cmd->add_option("--segment-ids", opt->segment_ids,
                  "int32 or int64 .npy [B, S]: attend within equal ids; -1 marks padding");
  cmd->add_option("--out-dir", opt->out_dir, "directory for o.npy, lse.npy, dq/dk/dv.npy")
      ->required();
  cmd->add_option("--impl", opt->impl, "implementation: reference, naive or flash")
      ->capture_default_str();
  cmd->add_option("--device", opt->device, "cpu or cuda (cuda: --impl naive or flash)")
      ->capture_default_str();
  cmd->add_option("--config", opt->config,
                  "CUDA flash kernel tiles and paths, e.g. 'fwd=128x64/128 bwd=64x128/256/double' "
                  "or, on sm90, 'fwd=128x128/256/wgmma bwd=64x128/256/wgmma' (default: the "
                  "GPU's default; bf16 only, fp32 has fixed kernels)");
  cmd->add_option("--kernel-config", opt->kernel_config,
                  "kernel-config file (JSON, e.g. from `flashtrain sweep --emit-kernel-config`): "
                  "its row for this GPU, head dim and mask gives the kernels, before the "
                  "built-in table; --config beats it (needs --impl flash --device cuda)");
  cmd->add_option("--dtype", opt->dtype,
                  "fp32 or bf16 (float32 inputs are rounded to bf16); reference computes in fp64")
      ->capture_default_str();
  cmd->add_flag("--causal", opt->causal, "causal mask: key <= query");
  cmd->add_flag("--deterministic", opt->deterministic,
                "backward with bit-identical dq, dk, dv on every run (bf16 flash on the GPU: the "
                "tma backward, sm90)");
  cmd->add_option("--window", opt->window, "sliding window W: key >= query - (W - 1); 0 = none")
      ->capture_default_str();
  cmd->add_option("--scale", opt->scale, "score scale; 0 means 1/sqrt(D)")->capture_default_str();
  cmd->add_flag("--check", opt->check,
                "also run the fp64 reference and print relative errors of o, lse (and dq, dk, dv)");
  cmd->callback([opt] { run_attention(*opt); });
}

}  // namespace ft::cli

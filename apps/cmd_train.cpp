// `flashtrain train`: flags -> TrainConfig -> ft::train::train(). SIGINT and SIGTERM ask the run
// to stop after the current step (it saves, logs and exits 130); a second one exits at once.
// Under mpirun every rank runs this: it takes its GPU (its local rank, or --device cuda:K),
// joins the job's communicator, and a rank that fails prints its rank and reason and ends
// every rank of the job (MPI_Abort) rather than leaving them waiting.
#include <atomic>
#include <csignal>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>

#include <unistd.h>

#include "commands.h"
#include "core/device.h"
#include "core/error.h"
#include "device_flag.h"
#include "dist/communicator.h"
#include "models/config.h"
#include "train/trainer.h"

namespace ft::cli {
namespace {

constexpr int kInterruptedExit = 130;  // 128 + SIGINT, as shells report an interrupted job

std::atomic<bool> g_stop_requested{false};
std::atomic<int> g_stop_signals{0};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "the signal handler needs lock-free atomics");

extern "C" void on_stop_signal(int) {
  if (g_stop_signals.fetch_add(1) > 0) ::_exit(kInterruptedExit);  // the second: at once
  g_stop_requested.store(true);
  static const char kMessage[] =
      "\ninterrupt: finishing the current step, then saving and logging (interrupt again to "
      "stop at once)\n";
  const ssize_t written = ::write(STDERR_FILENO, kMessage, sizeof kMessage - 1);
  (void)written;
}

// SIGINT and SIGTERM go to on_stop_signal while a run trains; the old handlers come back after.
class StopSignals {
 public:
  StopSignals() {
    struct sigaction action {};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // the step's reads and writes carry on
    sigaction(SIGINT, &action, &old_int_);
    sigaction(SIGTERM, &action, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct sigaction old_int_ {};
  struct sigaction old_term_ {};
};

struct TrainFlags {
  train::TrainConfig config;
  std::string dtype = "fp32", device = "auto", attention = "naive", lr_schedule = "cosine";
  std::string recompute = "none";
  std::string cuda_graph = "auto";
  std::string classifier_chunk = "auto";
  std::string dist = "auto", comm_dtype = "auto";
  std::string profile;  // --profile [STEP]: empty without a value
  double dist_timeout = 600.0;
  int64_t layers = 0, width = 0, heads = 0, kv_heads = 0, vocab = 0, context = 0;
  bool list_models = false, rope_scaling = false, split_qkv = false;
  CLI::App* cmd = nullptr;  // to tell a flag given on the command line from its default
};

// A shape override given on the command line: it must be >= 1.
std::optional<int64_t> override_flag(const CLI::App& cmd, const char* flag, int64_t value) {
  if (cmd.count(flag) == 0) return std::nullopt;
  FT_CHECK(value >= 1, flag, " must be >= 1, got ", value);
  return value;
}

// --profile's value: a step number >= 1, or none (0: the trainer's default step).
// --classifier-chunk: auto or a row count >= 0.
int64_t classifier_chunk_rows(const std::string& value) {
  if (value == "auto") return train::TrainConfig::kAutoClassifierChunk;
  size_t used = 0;
  int64_t rows = -1;
  try {
    rows = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  FT_CHECK(used == value.size() && rows >= 0,
           "--classifier-chunk takes auto or a number of rows >= 0 (0: the whole micro-batch), "
           "got '",
           value, "'");
  return rows;
}

int64_t profile_step(const std::string& value) {
  if (value.empty()) return 0;
  size_t used = 0;
  int64_t step = 0;
  try {
    step = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  FT_CHECK(used == value.size() && step >= 1,
           "--profile takes a step number >= 1 (or no value), "
           "got '",
           value, "'");
  return step;
}

dist::Backend dist_backend(const std::string& flag, const dist::Launch& launch, Device device) {
  if (flag == "off") return dist::Backend::local;
  if (flag == "auto") {
    if (!launch.by_mpirun) return dist::Backend::local;
    return device == Device::cuda ? dist::Backend::nccl : dist::Backend::mpi;
  }
  const dist::Backend b = flag == "mpi" ? dist::Backend::mpi : dist::Backend::nccl;
  FT_CHECK(b != dist::Backend::nccl || device == Device::cuda,
           "--dist nccl reduces GPU tensors: it needs --device cuda");
  FT_CHECK(b != dist::Backend::mpi || device == Device::cpu,
           "--dist mpi reduces CPU tensors: on GPUs use --dist nccl (or auto)");
  return b;
}

// The GPU of a rank that named none: its rank among the ranks of its node.
int rank_gpu(const dist::Launch& launch) {
  const int gpus = cuda_device_count();
  FT_CHECK(launch.local_rank < gpus, "rank ", launch.rank, " is rank ", launch.local_rank,
           " on its node, which has ", gpus, " GPU", gpus == 1 ? "" : "s",
           ": start at most one rank per GPU (mpirun -npernode ", gpus, ")");
  return launch.local_rank;
}

void run(TrainFlags& f) {
  if (f.list_models) {
    for (const std::string& name : models::preset_names()) {
      std::cout << models::preset(name).describe() << "\n";
    }
    return;
  }
  train::TrainConfig& c = f.config;
  const CLI::App& cmd = *f.cmd;
  c.overrides.layers = override_flag(cmd, "--layers", f.layers);
  c.overrides.width = override_flag(cmd, "--width", f.width);
  c.overrides.heads = override_flag(cmd, "--heads", f.heads);
  c.overrides.kv_heads = override_flag(cmd, "--kv-heads", f.kv_heads);
  c.overrides.vocab = override_flag(cmd, "--vocab", f.vocab);
  c.overrides.context = override_flag(cmd, "--context", f.context);
  if (f.rope_scaling) c.overrides.rope_scaling = true;
  FT_CHECK(c.load_path.empty() || cmd.count("--model") == 0, "--load ", c.load_path,
           " takes the model from the checkpoint; --model ", c.model, " would be ignored");
  FT_CHECK(cmd.count("--tokenizer") == 0 || std::filesystem::exists(c.tokenizer), "--tokenizer ",
           c.tokenizer, ": no such file");
  c.dtype = parse_dtype(f.dtype);
  c.lr_decay = train::parse_lr_decay(f.lr_schedule);
  if (f.comm_dtype != "auto") c.wire_dtype = parse_dtype(f.comm_dtype);
  if (cmd.count("--profile") > 0) c.profile_step = profile_step(f.profile);
  const dist::Launch launch = dist::launch_from_environment();
  std::ostream null_out(nullptr);
  int gpu = -1;
  c.device = resolve_device(f.device, launch.rank == 0 ? std::cout : null_out, &gpu);
  c.attention.impl = attention::parse_impl(f.attention);
  c.recompute = models::parse_recompute(f.recompute);
  c.cuda_graph = train::parse_cuda_graph(f.cuda_graph);
  c.attention.qkv_in_place = !f.split_qkv;
  c.classifier_chunk = classifier_chunk_rows(f.classifier_chunk);
  FT_CHECK(c.attention.impl != attention::Impl::reference,
           "--attention reference is the fp64 test oracle; train with naive or flash");
  FT_CHECK(f.dist_timeout > 0, "--dist-timeout must be > 0 seconds, got ", f.dist_timeout);
  dist::CommOptions comm_options;
  comm_options.backend = dist_backend(f.dist, launch, c.device);
  comm_options.timeout_s = f.dist_timeout;
  if (c.device == Device::cuda) {
    comm_options.cuda_device = gpu >= 0 ? gpu : rank_gpu(launch);
    use_cuda_device(comm_options.cuda_device);
  }
  const std::unique_ptr<dist::Communicator> comm = dist::make_communicator(comm_options);
  c.comm = comm.get();
  c.stop_requested = &g_stop_requested;
  const StopSignals signals;
  train::TrainSummary summary;
  try {
    summary = train::train(c, std::cout);
  } catch (const std::exception& e) {
    if (comm->size() == 1) throw;
    // The other ranks may wait in a collective for this one: end them all, naming this rank.
    std::fprintf(stderr, "error: rank %d of %d: %s\n", comm->rank(), comm->size(), e.what());
    std::fflush(stderr);
    comm->abort(1);
    throw;
  }
  if (summary.interrupted) throw CLI::RuntimeError(kInterruptedExit);
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto flags = std::make_shared<TrainFlags>();
  train::TrainConfig& c = flags->config;
  CLI::App* cmd = app.add_subcommand(
      "train", "Train a GPT-2 or LLaMA-3 model on llm.c token shards, printing one line per step");
  cmd->add_option("--model", c.model, "Model preset (see --list-models)")->capture_default_str();
  cmd->add_flag("--list-models", flags->list_models, "List the model presets and exit");
  cmd->add_option("--layers", flags->layers, "Override the number of layers");
  cmd->add_option("--width", flags->width, "Override the model width (channels)");
  cmd->add_option("--heads", flags->heads, "Override the number of query heads");
  cmd->add_option("--kv-heads", flags->kv_heads, "Override the number of key/value heads");
  cmd->add_option("--vocab", flags->vocab, "Override the vocabulary size");
  cmd->add_option("--context", flags->context, "Override the maximum sequence length");
  cmd->add_flag("--rope-scaling", flags->rope_scaling,
                "LLaMA-3: apply Llama 3.1's RoPE frequency scaling");
  cmd->add_option("--load", c.load_path,
                  "Initialise from an llm.c checkpoint (the model shape comes from its header)");
  cmd->add_option("--train-data", c.train_data, "Training token shard (a path or a glob)")
      ->capture_default_str();
  cmd->add_option("--val-data", c.val_data, "Validation token shard ('' for none)")
      ->capture_default_str();
  cmd->add_option("--tokenizer", c.tokenizer,
                  "llm.c tokenizer file: prints samples; gives --doc-mask its end-of-text id")
      ->capture_default_str();
  cmd->add_option("--batch-size,-b", c.batch_size, "Sequences per micro-batch")
      ->capture_default_str();
  cmd->add_option("--seq-len,-t", c.seq_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--total-batch-size", c.total_batch_size,
                  "Tokens per optimizer step, all ranks together; a multiple of batch x seq-len "
                  "x ranks, reached by gradient accumulation (0: one micro-batch per rank)")
      ->capture_default_str();
  cmd->add_option("--steps", c.steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--lr", c.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--warmup", c.warmup, "Linear warm-up steps")->capture_default_str();
  cmd->add_option("--min-lr-frac", c.min_lr_fraction,
                  "Cosine decay ends at this fraction of the peak learning rate")
      ->capture_default_str();
  cmd->add_option("--lr-schedule", flags->lr_schedule,
                  "After the warm-up: cosine (decay over --steps) or constant (the peak; a "
                  "resumed run may then extend --steps and still match a longer run)")
      ->check(CLI::IsMember({"cosine", "constant"}))
      ->capture_default_str();
  cmd->add_option("--weight-decay", c.adamw.weight_decay, "AdamW weight decay (matrices only)")
      ->capture_default_str();
  cmd->add_option("--grad-clip", c.grad_clip, "Clip the global gradient norm (0: off)")
      ->capture_default_str();
  cmd->add_option("--dtype", flags->dtype,
                  "fp32 or bf16 (bf16 weights and activations, fp32 "
                  "master weights and accumulation)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--device", flags->device,
                  "cpu, cuda, cuda:K (GPU K; default: GPU 0, under mpirun the rank's local "
                  "rank), or auto (the GPU when usable)")
      ->check(
          [](const std::string& v) {
            const bool ok = v == "auto" || v == "cpu" || v == "cuda" || v.rfind("cuda:", 0) == 0;
            return ok ? std::string() : "expected auto, cpu, cuda or cuda:K, got '" + v + "'";
          },
          "DEVICE")
      ->capture_default_str();
  cmd->add_flag("--tf32", c.tf32,
                "Let fp32 matrix products on the GPU use TF32 tensor cores (default: true fp32)");
  cmd->add_option("--attention", flags->attention, "naive (materialises S x S) or flash")
      ->check(CLI::IsMember({"naive", "flash"}))
      ->capture_default_str();
  cmd->add_option("--window", c.attention.window, "Sliding-window attention width (0: off)")
      ->capture_default_str();
  cmd->add_option("--global-every", c.attention.global_every,
                  "With --window: every N-th layer attends fully (0: none)")
      ->capture_default_str();
  cmd->add_flag("--gemm-tune", c.gemm_tune,
                "GPU: on the first call of each matrix-product shape, time a few of cuBLASLt's "
                "algorithms and keep the fastest for the run (default: cuBLASLt's heuristic "
                "choice, the same in every run; tuned runs may differ from each other in the "
                "last bits, so not with --deterministic)");
  cmd->add_flag("--deterministic", c.attention.deterministic,
                "Attention backward with bit-identical results on every run (the GPU's bf16 "
                "flash backward then adds its dQ parts in a fixed order: the tma path, sm90)");
  cmd->add_flag("--split-qkv", flags->split_qkv,
                "Copy q, k and v out of the fused QKV projection (and dq, dk, dv back into its "
                "gradient) instead of handing attention the fused buffer to read in place: the "
                "same arithmetic, for measuring what the copies cost");
  cmd->add_option("--recompute", flags->recompute,
                  "Keep less for backward and recompute it there: none, attention (q, k, v; "
                  "naive also its S x S probabilities), mlp (the MLP's hidden-width "
                  "activations), block (only each layer's input: backward re-runs the "
                  "layer's forward) or elementwise (the norms' outputs and LLaMA's SwiGLU "
                  "output: no GEMM runs again). The losses do not change; safe to change on "
                  "--resume")
      ->check(CLI::IsMember({"none", "attention", "mlp", "block", "elementwise"}))
      ->capture_default_str();
  cmd->add_option("--cuda-graph", flags->cuda_graph,
                  "Replay each step as one CUDA graph: the first step runs as usual, the second "
                  "is captured (forward, backward, optimizer) and every later one replays it, "
                  "without the host's launches between kernels. The losses do not change. auto: "
                  "on a GPU unless the run is data-parallel or uses --doc-mask or --profile; on: "
                  "an error where it cannot be used; off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--classifier-chunk", flags->classifier_chunk,
                  "Rows of a micro-batch the classifier and the loss take at a time, so that the "
                  "logits of the whole micro-batch never exist: auto (chunks of at most 512 MiB "
                  "of logits; the whole micro-batch when it fits), a row count, or 0 (the whole "
                  "micro-batch). Each chunk's gradients are formed as soon as its loss is: no "
                  "extra work. Safe to change on --resume")
      ->capture_default_str();
  cmd->add_option("--kernel-config", c.kernel_config_path,
                  "Kernel-config file (JSON, e.g. from `flashtrain sweep --emit-kernel-config`): "
                  "its rows give the CUDA flash kernels' tiles and paths in every attention call, "
                  "before the built-in table; checked at the start (needs --attention flash on "
                  "a GPU; unused in fp32, whose kernels are fixed)");
  cmd->add_flag("--doc-mask", c.doc_mask,
                "Attend only within each document of a packed row: a document starts at each "
                "end-of-text token (id from --tokenizer), in every layer, also for val loss and "
                "samples");
  cmd->add_option("--seed", c.seed, "Seed for initialisation, shuffling and samples")
      ->capture_default_str();
  cmd->add_flag("--shuffle", c.shuffle, "Shuffle batch order per epoch (default: in order)");
  cmd->add_option("--log", c.log_path,
                  "Write one JSON line per step to this file (a resumed run appends to it)");
  cmd->add_option("--save", c.save_path,
                  "Save an llm.c checkpoint here at the end, or when interrupted (and PATH.state "
                  "for --resume; the pair is written as one unit)");
  cmd->add_option("--save-every", c.save_every, "Also save every N steps (0: end only)")
      ->capture_default_str();
  cmd->add_option("--resume", c.resume_path,
                  "Resume from a checkpoint written by --save (reads PATH.state); refused when "
                  "a flag that decides the losses differs from the saved run (--attention and "
                  "--device may change)");
  cmd->add_flag("--allow-schedule-change", c.allow_schedule_change,
                "With --resume: accept a new learning-rate schedule (--steps, --lr, --warmup, "
                "--min-lr-frac, --lr-schedule); the resumed steps follow it");
  cmd->add_option("--profile", flags->profile,
                  "Time every op family of one step (CUDA events on the GPU, the clock on the "
                  "CPU) and print a table at the end, also written to --log: step STEP, or "
                  "without a value the run's third step (its last when it runs fewer); every "
                  "step then carries NVTX ranges for Nsight. The losses do not change")
      ->expected(0, 1)
      ->type_name("[STEP]");
  cmd->add_option("--eval-every", c.eval_every,
                  "Validation loss every N steps (0: only after the last step)")
      ->capture_default_str();
  cmd->add_option("--val-steps", c.val_steps, "Validation batches averaged")->capture_default_str();
  cmd->add_option("--sample-every", c.sample_every, "Print a generated sample every N steps")
      ->capture_default_str();
  cmd->add_option("--sample-tokens", c.sample_tokens, "Tokens per generated sample")
      ->capture_default_str();
  cmd->add_option("--dist", flags->dist,
                  "Data parallelism: auto (under mpirun: NCCL on GPUs, MPI on the CPU; else "
                  "off), off, mpi or nccl (also without mpirun: a world of one)")
      ->check(CLI::IsMember({"auto", "off", "mpi", "nccl"}))
      ->capture_default_str();
  cmd->add_option("--zero", c.zero_stage,
                  "1: shard the AdamW moments over the ranks (ZeRO-1); 0: every rank keeps all")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
  cmd->add_option("--bucket-mb", c.bucket_mb,
                  "Gradient bucket size in MB of fp32 gradients (each bucket is reduced as "
                  "soon as the backward completes it)")
      ->capture_default_str();
  cmd->add_option(
         "--comm-dtype", flags->comm_dtype,
         "Gradients on the wire: auto (the run's --dtype; fp32 in a world of one), fp32 or "
         "bf16")
      ->check(CLI::IsMember({"auto", "fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--dist-timeout", flags->dist_timeout,
                  "Seconds a collective may wait for the other ranks before the job is ended "
                  "as stuck")
      ->capture_default_str();
  flags->cmd = cmd;
  cmd->callback([flags]() { run(*flags); });
}

}  // namespace ft::cli

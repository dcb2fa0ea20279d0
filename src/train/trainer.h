// The training loop: data, gradient accumulation, clipping, AdamW, schedule, evaluation,
// samples, logs, checkpoints and exact resume. Knows nothing about command-line flags.
#pragma once

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "models/config.h"
#include "models/transformer.h"
#include "nn/adamw.h"
#include "train/schedule.h"

namespace ft::dist {
class Communicator;
}

namespace ft::train {

struct TrainConfig {
  // Model: a preset plus overrides, or the shape stored in a checkpoint (load_path).
  std::string model = "gpt2-tiny";
  models::ModelOverrides overrides;
  std::string load_path;

  std::string train_data = "data/tinyshakespeare_train.bin";
  std::string val_data = "data/tinyshakespeare_val.bin";
  std::string tokenizer = "data/gpt2_tokenizer.bin";

  int64_t batch_size = 4, seq_len = 64;
  // Tokens per optimizer step (all ranks together); 0 means batch_size * seq_len per rank.
  int64_t total_batch_size = 0;
  int64_t steps = 100;
  double lr = 1e-3, min_lr_fraction = 0.0;
  int64_t warmup = 0;
  LrDecay lr_decay = LrDecay::cosine;
  double grad_clip = 1.0;
  nn::AdamWConfig adamw;

  DType dtype = DType::f32;
  Device device = Device::cpu;
  bool tf32 = false;  // let fp32 GEMMs on the GPU use TF32 tensor cores
  // Time a few cuBLASLt algorithms per GEMM problem on its first call and keep the fastest
  // (core/cuda/gemm.h); off: cuBLASLt's heuristic choice, the same in every run.
  bool gemm_tune = false;
  models::AttentionSettings attention;
  // What each layer keeps for backward and recomputes there (models/transformer.h); the losses
  // are the same in every mode, bit for bit.
  models::Recompute recompute = models::Recompute::none;
  // Rows of a micro-batch the classifier and loss take at a time (Transformer::
  // set_classifier_chunk): 0 the whole micro-batch, kAutoClassifierChunk chunks of at most
  // models::kClassifierChunkBytes of logits (models::auto_classifier_chunk).
  static constexpr int64_t kAutoClassifierChunk = -1;
  int64_t classifier_chunk = kAutoClassifierChunk;
  // A kernel-config file (attention/kernel_config_file.h) whose rows the CUDA flash kernels take
  // before the built-in table (flash on the GPU only); "" for none.
  std::string kernel_config_path;
  // Attention stays inside each document of a packed row: segment ids from the tokenizer's
  // end-of-text token (train/documents.h), for training, evaluation and samples.
  bool doc_mask = false;
  uint64_t seed = 1337;
  bool shuffle = false;

  std::string log_path;     // JSON lines
  std::string save_path;    // llm.c checkpoint; the resume state goes to save_path + ".state"
  int64_t save_every = 0;   // also save every N steps (0: at the end only)
  std::string resume_path;  // a checkpoint written by save_path; resumes from its .state
  // --resume may change the learning-rate schedule; the resumed steps follow the new one
  // (train/run_record.h says what a resume may change).
  bool allow_schedule_change = false;

  int64_t eval_every = 0;  // 0: evaluate at the end only (when val data is given)
  int64_t val_steps = 20;  // batches averaged for the validation loss
  int64_t sample_every = 0;
  int64_t sample_tokens = 64;
  bool quiet = false;  // no per-step lines (tests)
  // Profile one step (train/profile_report.h): -1 none, 0 the run's third step (its first steps
  // warm up the allocator and the caches) or its last when it runs fewer, else that step. The
  // table is printed at the end and written to the log as {"event": "profile"}; every step
  // then also carries NVTX ranges for Nsight. Profiling changes no loss.
  int64_t profile_step = -1;
  // CUDA graphs (core/cuda/graph.h): the run's first step runs as usual, the next is captured
  // (forward, backward and optimizer of every micro-batch) and each later step replays it: one
  // launch instead of hundreds. The losses do not change, bit for bit. automatic: wherever the
  // run allows it (cuda_graph_obstacle says where not); on: an error where it does not.
  enum class CudaGraph { automatic, on, off };
  CudaGraph cuda_graph = CudaGraph::automatic;
  // Set (by a signal handler, say) to stop after the current step: the run saves (with
  // save_path), writes its summary and an {"event": "interrupted"} log line, and returns with
  // TrainSummary::interrupted.
  const std::atomic<bool>* stop_requested = nullptr;

  // Data parallelism (train/data_parallel.h): this process's rank of the job (not owned;
  // nullptr: one process). Rank r takes micro-batch r of every group of world-size
  // consecutive micro-batches; rank 0 alone prints, logs, samples and saves.
  dist::Communicator* comm = nullptr;
  int zero_stage = 0;       // 1: shard the AdamW moments over the ranks (ZeRO-1)
  double bucket_mb = 25.0;  // gradient bucket size (fp32 MB)
  // dtype of the gradients on the wire (default: dtype across ranks, fp32 in a world of one)
  std::optional<DType> wire_dtype;
};

struct TrainSummary {
  int64_t steps_run = 0;
  double final_train_loss = 0.0;
  double final_val_loss = -1.0;    // < 0 when never evaluated
  double tokens_per_second = 0.0;  // mean over the steps after the first
  double mean_step_ms = 0.0;
  std::string sample;
  std::vector<double> losses;  // train loss of each step run, in order
  bool interrupted = false;    // stopped by stop_requested before the last step
};

// Runs training, printing the per-step lines and the closing summary to out.
TrainSummary train(const TrainConfig& config, std::ostream& out);

// --cuda-graph's values: auto, on, off.
TrainConfig::CudaGraph parse_cuda_graph(const std::string& name);
// Why this run's steps cannot be replayed by a CUDA graph ("" when they can).
std::string cuda_graph_obstacle(const TrainConfig& config, bool distributed);

// The model that train() builds for a config (preset + overrides, or a checkpoint's header).
models::ModelConfig resolve_model_config(const TrainConfig& config);

}  // namespace ft::train

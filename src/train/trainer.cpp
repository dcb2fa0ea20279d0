#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <ostream>
#include <vector>

#include "attention/kernel_config_file.h"
#include "core/device.h"
#include "core/error.h"
#include "core/graph.h"
#include "core/memory.h"
#include "core/output_path.h"
#include "dist/communicator.h"
#include "models/checkpoint.h"
#include "train/data_loader.h"
#include "train/data_parallel.h"
#include "train/documents.h"
#include "train/generate.h"
#include "train/optimizer.h"
#include "train/profile_report.h"
#include "train/run_record.h"
#include "train/saved_run.h"
#include "train/schedule.h"
#include "train/step_log.h"
#include "train/tokenizer.h"
#include "train/train_state.h"
#include "train/utf8.h"

namespace ft::train {
namespace {

using Clock = std::chrono::steady_clock;

double elapsed_ms(Clock::time_point since) {
  return std::chrono::duration<double, std::milli>(Clock::now() - since).count();
}

double to_mb(int64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

// Bytes of the logits of `rows` rows in the compute dtype.
int64_t logits_bytes(const models::ModelConfig& mc, DType dtype, int64_t rows) {
  return rows * mc.padded_vocab_size * static_cast<int64_t>(dtype_size(dtype));
}

int64_t resolved_classifier_chunk(const TrainConfig& c, const models::ModelConfig& mc) {
  if (c.classifier_chunk != TrainConfig::kAutoClassifierChunk) {
    FT_CHECK(c.classifier_chunk >= 0, "--classifier-chunk ", c.classifier_chunk,
             " must be auto or >= 0 rows (0: the whole micro-batch)");
    return c.classifier_chunk;
  }
  return models::auto_classifier_chunk(mc, c.dtype, c.batch_size * c.seq_len);
}

// Micro-batches per optimizer step, all ranks together: each rank takes accum / ranks of them.
int64_t accumulation_steps(const TrainConfig& c, int ranks) {
  const int64_t per_micro = c.batch_size * c.seq_len;
  const int64_t total = c.total_batch_size > 0 ? c.total_batch_size : per_micro * ranks;
  FT_CHECK(total % per_micro == 0, "total batch size ", total,
           " tokens is not a multiple of batch size x seq len = ", c.batch_size, " x ", c.seq_len,
           " = ", per_micro);
  const int64_t accum = total / per_micro;
  FT_CHECK(accum % ranks == 0, "--total-batch-size ", total, " tokens is ", accum,
           " micro-batches of ", c.batch_size, " x ", c.seq_len, ", which ", ranks,
           " ranks cannot share equally (rank r takes micro-batch r of every group of ", ranks,
           "): use a multiple of batch size x seq len x ranks = ", per_micro * ranks,
           " tokens, or another number of ranks");
  return accum;
}

bool finite_at_least(double v, double lo) {
  return std::isfinite(v) && v >= lo;
}

// Every setting in its range, before any work: a bad value is an error naming the flag, never a
// failure many steps later.
void check_config(const TrainConfig& c, const models::ModelConfig& m, int ranks) {
  FT_CHECK(c.batch_size >= 1, "--batch-size must be >= 1, got ", c.batch_size);
  FT_CHECK(c.seq_len >= 1, "--seq-len must be >= 1, got ", c.seq_len);
  FT_CHECK(c.seq_len <= m.max_seq_len, "seq len ", c.seq_len, " exceeds the context of ", m.name,
           " (", m.max_seq_len, "); use a shorter --seq-len or --context");
  FT_CHECK(c.total_batch_size >= 0, "--total-batch-size must be >= 0 (0: one micro-batch), got ",
           c.total_batch_size);
  FT_CHECK(c.steps >= 1, "steps must be >= 1, got ", c.steps);
  FT_CHECK(c.lr > 0 && std::isfinite(c.lr), "lr must be a positive number, got ", c.lr);
  FT_CHECK(c.warmup >= 0, "warmup must be >= 0, got ", c.warmup);
  FT_CHECK(std::isfinite(c.min_lr_fraction) && c.min_lr_fraction >= 0 && c.min_lr_fraction <= 1,
           "--min-lr-frac must be in [0, 1] (the decay ends at this fraction of --lr), got ",
           c.min_lr_fraction);
  FT_CHECK(finite_at_least(c.adamw.weight_decay, 0),
           "--weight-decay must be a finite number >= 0, got ", c.adamw.weight_decay);
  FT_CHECK(std::isfinite(c.adamw.beta1) && c.adamw.beta1 >= 0 && c.adamw.beta1 < 1 &&
               std::isfinite(c.adamw.beta2) && c.adamw.beta2 >= 0 && c.adamw.beta2 < 1,
           "AdamW betas must be in [0, 1), got ", c.adamw.beta1, " and ", c.adamw.beta2);
  FT_CHECK(std::isfinite(c.adamw.eps) && c.adamw.eps > 0, "AdamW eps must be > 0, got ",
           c.adamw.eps);
  FT_CHECK(finite_at_least(c.grad_clip, 0),
           "--grad-clip must be a finite number >= 0 (0: off), got ", c.grad_clip);
  FT_CHECK(c.val_steps >= 1, "val steps must be >= 1, got ", c.val_steps);
  FT_CHECK(c.eval_every >= 0, "--eval-every must be >= 0 (0: after the last step only), got ",
           c.eval_every);
  FT_CHECK(c.sample_every >= 0, "--sample-every must be >= 0 (0: no samples during training), got ",
           c.sample_every);
  FT_CHECK(c.sample_tokens >= 0, "--sample-tokens must be >= 0, got ", c.sample_tokens);
  FT_CHECK(c.save_every >= 0, "--save-every must be >= 0 (0: at the end only), got ", c.save_every);
  FT_CHECK(c.save_every == 0 || !c.save_path.empty(), "--save-every ", c.save_every,
           " needs --save PATH (where to save)");
  FT_CHECK(c.attention.window >= 0, "--window must be >= 0 (0: none), got ", c.attention.window);
  FT_CHECK(c.attention.global_every >= 0, "--global-every must be >= 0 (0: none), got ",
           c.attention.global_every);
  FT_CHECK(c.dtype == DType::f32 || c.dtype == DType::bf16, "dtype must be fp32 or bf16, got ",
           dtype_name(c.dtype));
  FT_CHECK(!c.gemm_tune || !c.attention.deterministic,
           "--gemm-tune picks matrix-product algorithms by timing them, so two runs may differ in "
           "the last bits; --deterministic promises bit-identical runs: use one or the other");
  FT_CHECK(!c.gemm_tune || c.device == Device::cuda,
           "--gemm-tune times the GPU's matrix products: it needs --device cuda");
  FT_CHECK(c.load_path.empty() || !c.overrides.any(), "--load ", c.load_path,
           " takes the model shape from the checkpoint; ", c.overrides.describe(),
           " would be ignored (drop the override, or train the new shape without --load)");
  FT_CHECK(c.zero_stage == 0 || c.zero_stage == 1, "--zero must be 0 (off) or 1, got ",
           c.zero_stage);
  FT_CHECK(c.profile_step >= -1 && c.profile_step <= c.steps, "--profile STEP must be a step of ",
           "the run, 1 to ", c.steps, ", got ", c.profile_step);
  accumulation_steps(c, ranks);
}

// The run's attention settings, with the kernel-config file read and checked (before any work).
models::AttentionSettings attention_settings(const TrainConfig& c) {
  models::AttentionSettings s = c.attention;
  if (!c.kernel_config_path.empty()) {
    s.kernel_configs = std::make_shared<const attention::KernelConfigFile>(
        attention::read_kernel_config_file(c.kernel_config_path));
  }
  // As `flashtrain attention --config`: a setting that nothing would read is refused.
  FT_CHECK(!s.kernel_configs || (c.device == Device::cuda && s.impl == attention::Impl::flash),
           "--kernel-config ", s.kernel_configs ? s.kernel_configs->path : "",
           " sets the CUDA flash kernels' configurations: it needs --attention flash on a GPU "
           "(this run: ",
           attention::impl_name(s.impl), " attention on ", device_name(c.device), ")");
  return s;
}

// The configuration of each mask class, as the run record and the log keep them.
nlohmann::json kernel_configs_json(const std::vector<attention::KernelConfigChoice>& kernels) {
  nlohmann::json out = nlohmann::json::object();
  for (const attention::KernelConfigChoice& k : kernels) {
    out[attention::mask_class_name(k.mask_class)] = k.config.str();
  }
  return out;
}

// The end-of-text id that --doc-mask splits documents at: the tokenizer file's (llm.c's shards
// and samples use the same one). The model must be able to see it in the data.
int32_t doc_mask_eot_token(const TrainConfig& c, const models::ModelConfig& m) {
  FT_CHECK(std::filesystem::exists(c.tokenizer),
           "--doc-mask needs the tokenizer file for its end-of-text id, but '", c.tokenizer,
           "' does not exist (pass --tokenizer PATH)");
  const int eot = Tokenizer(c.tokenizer).eot_token();
  FT_CHECK(eot < m.vocab_size, "--doc-mask: the end-of-text id ", eot, " of tokenizer '",
           c.tokenizer, "' is outside the model's vocabulary [0, ", m.vocab_size,
           "), so the data cannot mark documents; use a model with the tokenizer's vocabulary");
  return static_cast<int32_t>(eot);
}

// Segment ids for a batch with --doc-mask (eot given), else none.
Tensor segments_for(const Tensor& tokens, std::optional<int32_t> eot) {
  return eot ? document_segment_ids(tokens, *eot) : Tensor();
}

// The mean loss of the first batches: rank r computes batch i when i % ranks == r, and the
// losses are added in batch order on every rank, as one process adds them.
double evaluate(models::Transformer& model, DataLoader& loader, int64_t max_batches,
                std::optional<int32_t> eot, dist::Communicator& comm) {
  loader.reset();
  const int64_t n = std::min(max_batches, loader.batches_per_epoch());
  const int ranks = comm.size(), rank = comm.rank();
  Tensor x, y;
  std::vector<double> mine(static_cast<size_t>(n), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    if (i % ranks != rank) {
      loader.skip(1);
      continue;
    }
    loader.next_batch(x, y);
    mine[static_cast<size_t>(i)] = model.forward(x, y, segments_for(x, eot));
  }
  const std::vector<double> all = comm.all_gather(mine);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += all[static_cast<size_t>(i % ranks * n + i)];
  return sum / static_cast<double>(n);
}

// What every rank reports after a step, gathered: its micro-batch losses and its figures.
struct StepShares {
  double loss = 0.0;   // the mean over all micro-batches, added in the order one process adds
  double ms = 0.0;     // the slowest rank's
  MemoryStats memory;  // the peaks summed over the ranks
  std::vector<RankRecord> ranks;
  bool stop = false;  // some rank was asked to stop
};

StepShares share_step(dist::Communicator& comm, const std::vector<double>& losses, double ms,
                      const MemoryStats& mem, bool stop, int64_t rank_tokens) {
  std::vector<double> mine = losses;
  mine.insert(mine.end(), {ms, static_cast<double>(mem.peak_used_bytes),
                           static_cast<double>(mem.peak_reserved_bytes), stop ? 1.0 : 0.0});
  const std::vector<double> all = comm.all_gather(mine);
  const size_t per_rank = mine.size(), accum = losses.size() * static_cast<size_t>(comm.size());
  StepShares s;
  for (size_t i = 0; i < accum; ++i) {
    const size_t r = i % static_cast<size_t>(comm.size()),
                 micro = i / static_cast<size_t>(comm.size());
    s.loss += all[r * per_rank + micro];
  }
  s.loss /= static_cast<double>(accum);
  for (int r = 0; r < comm.size(); ++r) {
    const double* f = all.data() + static_cast<size_t>(r) * per_rank + losses.size();
    const auto used = static_cast<int64_t>(f[1]), reserved = static_cast<int64_t>(f[2]);
    s.ms = std::max(s.ms, f[0]);
    s.memory.peak_used_bytes += used;
    s.memory.peak_reserved_bytes += reserved;
    s.stop = s.stop || f[3] != 0.0;
    s.ranks.push_back(
        {f[0], static_cast<double>(rank_tokens) / (f[0] / 1000.0), to_mb(used), to_mb(reserved)});
  }
  return s;
}

// Every rank must train the same run: rank 0's record is compared with each rank's.
void check_same_run(dist::Communicator& comm, const nlohmann::json& record) {
  if (comm.size() == 1) return;
  const nlohmann::json root = nlohmann::json::parse(comm.broadcast(record.dump()));
  if (root == record) return;
  std::string diff;
  for (const auto& [key, value] : record.items()) {
    const nlohmann::json theirs = root.contains(key) ? root.at(key) : nlohmann::json();
    if (theirs != value)
      diff += str(diff.empty() ? "" : ", ", key, ": ", theirs.dump(), " -> ", value.dump());
  }
  throw Error(str("rank ", comm.rank(),
                  " was started with another run than rank 0 (rank 0 -> rank ", comm.rank(),
                  "): ", diff, "; every rank must get the same flags and data"));
}

// A sample from the end-of-text token (KV cache, temperature 1), as whole UTF-8 characters.
std::string sample_text(models::Transformer& model, const Tokenizer& tokenizer, int64_t n_tokens,
                        uint64_t seed, std::optional<int32_t> eot) {
  GenerateOptions o;
  o.tokens = n_tokens;
  o.seed = seed;
  o.doc_eot = eot;
  Utf8Decoder utf8;  // tokens may split characters: only whole ones are printed
  std::string text;
  generate_tokens(model, {tokenizer.eot_token()}, o, [&](int32_t id) {
    if (id < tokenizer.vocab_size()) text += utf8.push(tokenizer.decode(id));
  });
  return text + utf8.finish();
}

// What a profiled step ran on, for the table's heading, and the floors its rows are held to.
std::string profile_run(const TrainConfig& c, const models::ModelConfig& m) {
  std::string device = device_name(c.device);
  if (c.device == Device::cuda) device += " (" + cuda_device_name(cuda_current_device()) + ")";
  return str(m.name, " on ", device, ", ", dtype_name(c.dtype), ", attention ",
             attention::impl_name(c.attention.impl), ", batch ", c.batch_size, " x ", c.seq_len);
}

ProfileFloors profile_floors_of(const TrainConfig& c) {
  const std::string gpu = c.device == Device::cuda ? cuda_device_name(cuda_current_device()) : "";
  return profile_floors(c.device, gpu, c.dtype, c.tf32);
}

}  // namespace

TrainConfig::CudaGraph parse_cuda_graph(const std::string& name) {
  if (name == "auto") return TrainConfig::CudaGraph::automatic;
  if (name == "on") return TrainConfig::CudaGraph::on;
  if (name == "off") return TrainConfig::CudaGraph::off;
  throw Error(str("--cuda-graph takes auto, on or off, got '", name, "'"));
}

std::string cuda_graph_obstacle(const TrainConfig& c, bool distributed) {
  const std::string unavailable = device_graph_unavailable(c.device);
  if (!unavailable.empty()) return unavailable;
  if (distributed) {
    return "a data-parallel run reduces gradients between ranks during backward, which is not "
           "captured";
  }
  if (c.doc_mask) {
    return "--doc-mask forms each batch's document ids on the host, which a replay would not "
           "redo";
  }
  if (c.profile_step >= 0) return "--profile times each op family of a step run as usual";
  return "";
}

models::ModelConfig resolve_model_config(const TrainConfig& c) {
  if (!c.load_path.empty()) return models::read_checkpoint_config(c.load_path);
  return models::apply_overrides(models::preset(c.model), c.overrides);
}

TrainSummary train(const TrainConfig& c, std::ostream& all_out) {
  std::unique_ptr<dist::Communicator> own_comm;
  if (c.comm == nullptr) own_comm = dist::make_communicator({});
  dist::Communicator& comm = c.comm ? *c.comm : *own_comm;
  const bool distributed = comm.backend() != dist::Backend::local;
  const bool root = comm.is_root();
  const int ranks = comm.size(), rank = comm.rank();
  std::ostream null_out(nullptr);  // what the other ranks would print goes nowhere
  std::ostream& out = root ? all_out : null_out;

  // A save that an interrupt cut short is finished (or its temporary files removed) first, by
  // rank 0 alone, before any rank reads the files.
  std::vector<std::string> notes;
  for (const std::string* path : {&c.load_path, &c.resume_path, &c.save_path}) {
    if (path->empty() || !root) continue;
    const std::string note = recover_saved_run(*path);
    if (!note.empty()) notes.push_back(note);
  }
  comm.barrier();
  const models::ModelConfig mc = resolve_model_config(c);
  check_config(c, mc, ranks);
  const models::AttentionSettings run_attention = attention_settings(c);
  const std::string graph_obstacle = cuda_graph_obstacle(c, distributed);
  FT_CHECK(c.cuda_graph != TrainConfig::CudaGraph::on || graph_obstacle.empty(),
           "--cuda-graph on: ", graph_obstacle, " (use --cuda-graph auto or off)");
  const bool graphs = c.cuda_graph != TrainConfig::CudaGraph::off && graph_obstacle.empty();
  FT_CHECK(c.zero_stage == 0 || distributed,
           "--zero 1 shards the optimizer state over the ranks of a data-parallel job; this run "
           "has none (start it with mpirun, or pass --dist mpi or nccl for a world of one)");
  // Outputs are checked before any work, so that no run is lost to a path found bad at its end.
  if (!c.save_path.empty() && root) check_writable_file(c.save_path, "--save");
  if (!c.log_path.empty() && root) check_writable_file(c.log_path, "--log");
  std::optional<Tokenizer> tokenizer;
  if (std::filesystem::exists(c.tokenizer)) tokenizer.emplace(c.tokenizer);
  FT_CHECK(tokenizer || c.sample_every == 0, "--sample-every ", c.sample_every,
           " needs the tokenizer file to print samples, but '", c.tokenizer,
           "' does not exist (pass --tokenizer PATH)");
  // Samples start from the end-of-text token: the model must have it.
  const bool can_sample = tokenizer && tokenizer->eot_token() < mc.vocab_size;
  FT_CHECK(can_sample || c.sample_every == 0,
           "--sample-every: samples start from the tokenizer's "
           "end-of-text id, which is outside the model's vocabulary [0, ",
           mc.vocab_size, ")");
  set_tf32(c.tf32);
  set_gemm_tuning(c.gemm_tune);
  const int64_t accum = accumulation_steps(c, ranks);
  const int64_t rank_accum = accum / ranks;
  const int64_t tokens_per_step = c.batch_size * c.seq_len * accum;

  DataLoader train_loader(c.train_data, c.batch_size, c.seq_len, c.shuffle, c.seed);
  train_loader.check_vocab(mc.vocab_size);
  std::unique_ptr<DataLoader> val_loader;
  if (!c.val_data.empty()) {
    val_loader = std::make_unique<DataLoader>(c.val_data, c.batch_size, c.seq_len);
    val_loader->check_vocab(mc.vocab_size);
  }

  std::optional<int32_t> eot;
  if (c.doc_mask) eot = doc_mask_eot_token(c, mc);

  // Buckets of the layout split into equal, aligned chunks per rank (ZeRO-1).
  models::Transformer model(mc, c.dtype, run_attention, c.device,
                            models::kParameterAlignment * ranks);
  model.set_recompute(c.recompute);
  const int64_t micro_rows = c.batch_size * c.seq_len;
  const int64_t classifier_chunk = resolved_classifier_chunk(c, mc);
  model.set_classifier_chunk(classifier_chunk);
  // Every configuration the file gives is checked now: one that cannot run is an error at the
  // start, naming its row, not in step 1.
  const std::vector<attention::KernelConfigChoice> kernels =
      run_attention.kernel_configs
          ? model.flash_kernel_configs(c.batch_size, c.seq_len, eot.has_value())
          : std::vector<attention::KernelConfigChoice>();
  if (!c.load_path.empty()) {
    models::load_checkpoint(c.load_path, model);
  } else {
    model.init_weights(c.seed);
  }
  nlohmann::json record = make_run_record(c, mc, accum, train_loader, val_loader.get());
  if (ranks > 1) record["world_size"] = ranks;
  if (c.zero_stage > 0) record["zero"] = c.zero_stage;
  if (run_attention.kernel_configs) {
    record["kernel_config"] = run_attention.kernel_configs->path;
    record["kernel_configs"] = kernel_configs_json(kernels);
  }
  check_same_run(comm, record);
  DataParallelConfig dp_config;
  dp_config.zero_stage = c.zero_stage;
  dp_config.bucket_mb = c.bucket_mb;
  // auto: the run's dtype across ranks; in a world of one nothing travels, and rounding the
  // gradients to bf16 there would only cost two passes over them and change the losses.
  dp_config.wire_dtype = c.wire_dtype.value_or(ranks > 1 ? c.dtype : DType::f32);
  DataParallel dp(comm, model, c.adamw, c.grad_clip, dp_config);
  int64_t first_step = 1;
  std::vector<std::string> resume_changes;
  if (!c.resume_path.empty()) {
    const std::string state_path = c.resume_path + ".state";
    const TrainState state = read_train_state(state_path);
    resume_changes =
        check_resume(state.run, record, state.step, c.allow_schedule_change, state_path);
    FT_CHECK(state.step < c.steps, c.resume_path, " already completed ", state.step,
             " steps; --steps ", c.steps, " leaves nothing to do");
    dp.before_load_state();
    load_train_state(state_path, model);
    dp.after_load_state();
    train_loader.restore(state.loader);
    first_step = state.step + 1;
  }
  const bool resumed = first_step > 1;
  // The profiled step, and what it is profiled with.
  const int64_t profile_at =
      c.profile_step > 0 ? c.profile_step : std::min(first_step + 2, c.steps);
  std::unique_ptr<models::StepProfile> profile;
  if (c.profile_step >= 0) {
    FT_CHECK(profile_at >= first_step, "--profile ", profile_at, ": the run resumes after step ",
             first_step - 1, "; profile one of steps ", first_step, " to ", c.steps);
    profile = std::make_unique<models::StepProfile>(c.device);
    model.set_profile(profile.get());
  }
  std::string profile_table;

  out << "model:     " << mc.describe() << "\n"
      << "run:       " << device_name(c.device) << ", " << dtype_name(c.dtype) << ", attention "
      << attention::impl_name(c.attention.impl);
  if (c.attention.window > 0) {
    out << " (window " << c.attention.window;
    if (c.attention.global_every > 0) out << ", every " << c.attention.global_every << " full";
    out << ")";
  }
  if (eot) out << ", doc mask at end-of-text " << *eot;
  if (c.recompute != models::Recompute::none) {
    out << ", recompute " << models::recompute_name(c.recompute);
  }
  if (classifier_chunk > 0) out << ", classifier chunks of " << classifier_chunk << " rows";
  out << ", batch " << c.batch_size << " x seq " << c.seq_len << " x accumulation " << accum
      << " = " << tokens_per_step << " tokens per step\n"
      << "data:      " << c.train_data << " (" << train_loader.num_tokens() << " tokens)";
  if (val_loader) out << ", val " << c.val_data << " (" << val_loader->num_tokens() << " tokens)";
  out << "\n";
  if (c.device == Device::cuda) {
    out << "graph:     ";
    if (graphs && c.steps > first_step) {
      out << "step " << first_step + 1 << " is captured as a CUDA graph; later steps replay it\n";
    } else if (graphs) {
      out << "not used: the run has one step to go, which runs as usual\n";
    } else if (c.cuda_graph == TrainConfig::CudaGraph::off) {
      out << "off (--cuda-graph off)\n";
    } else {
      out << "not used: " << graph_obstacle << "\n";
    }
    if (c.gemm_tune) {
      out << "gemms:     tuned (--gemm-tune): each product's first call times cuBLASLt's "
             "candidates and keeps the fastest\n";
    }
  }
  if (resumed) {
    out << "resumed:   from " << c.resume_path << " after step " << first_step - 1 << "\n";
    for (const std::string& change : resume_changes) out << "           " << change << "\n";
  }
  if (distributed) {
    out << "dist:      " << ranks << " rank" << (ranks == 1 ? "" : "s") << ", " << comm.describe()
        << "; rank r takes micro-batch r of every group of " << ranks << " (" << rank_accum
        << " per rank per step)\n"
        << "           " << dp.describe_buckets() << "\n";
    if (dp.sharded()) out << "ZeRO-1:    " << dp.describe_sharding() << "\n";
  }
  if (run_attention.kernel_configs) {
    out << "kernels:   --kernel-config " << run_attention.kernel_configs->path;
    if (kernels.empty()) {
      out << " is not used: the " << dtype_name(c.dtype) << " flash kernels are fixed";
    }
    out << "\n";
    for (const attention::KernelConfigChoice& k : kernels) {
      out << "           " << attention::mask_class_name(k.mask_class)
          << " masks: " << k.config.str() << " (" << k.origin() << ")\n";
    }
  }
  for (const std::string& note : notes) out << "note:      " << note << "\n";
  out.flush();

  // A resumed run continues its log: a {"event": "resume"} line, then its steps.
  std::error_code ec;
  const bool log_continues =
      resumed && !c.log_path.empty() && std::filesystem::file_size(c.log_path, ec) > 0 && !ec;
  JsonLog log = c.log_path.empty() || !root ? JsonLog() : JsonLog(c.log_path, resumed);
  if (!log_continues) {
    nlohmann::json run_event = {{"event", "run"},
                                {"model", mc.name},
                                {"family", models::family_name(mc.family)},
                                {"parameters", mc.num_parameters()},
                                {"dtype", dtype_name(c.dtype)},
                                {"device", device_name(c.device)},
                                {"attention", attention::impl_name(c.attention.impl)},
                                {"window", c.attention.window},
                                {"global_every", c.attention.global_every},
                                {"doc_mask", c.doc_mask},
                                {"recompute", models::recompute_name(c.recompute)},
                                {"cuda_graph", graphs},
                                {"classifier_chunk", classifier_chunk},
                                {"batch_size", c.batch_size},
                                {"seq_len", c.seq_len},
                                {"tokens_per_step", tokens_per_step},
                                {"steps", c.steps},
                                {"seed", c.seed}};
    if (run_attention.kernel_configs) {
      run_event["kernel_config"] = run_attention.kernel_configs->path;
      run_event["kernel_configs"] = kernel_configs_json(kernels);
    }
    if (distributed) {
      run_event["world_size"] = ranks;
      run_event["dist"] = dist::backend_name(comm.backend());
      run_event["zero"] = c.zero_stage;
      run_event["buckets"] = dp.bucket_count();
      run_event["wire_dtype"] = dtype_name(dp_config.wire_dtype);
      run_event["moment_mb_per_rank"] = to_mb(dp.moment_bytes());
      run_event["moment_mb_unsharded"] = to_mb(dp.unsharded_moment_bytes());
    }
    log.write(run_event);
  }
  if (resumed) {
    log.write({{"event", "resume"},
               {"step", first_step - 1},
               {"steps", c.steps},
               {"from", c.resume_path},
               {"changes", resume_changes}});
  }

  const LrSchedule schedule{c.lr, c.warmup, c.steps, c.min_lr_fraction, c.lr_decay};

  TrainSummary summary;
  double timed_ms = 0.0;
  int64_t timed_steps = 0;
  Tensor x, y;
  int64_t saved_step = -1;
  // The checkpoint and its resume state, as one unit (train/saved_run.h).
  auto save = [&](int64_t done) {
    if (c.save_path.empty() || saved_step == done) return;
    dp.save([&] { save_run(c.save_path, model, c.dtype, {done, train_loader.state(), record}); });
    saved_step = done;
  };
  const auto loop_start = Clock::now();
  bool interrupted = false;
  // The most the layers kept for backward in one micro-batch, read after each step's last
  // backward (evaluation and samples run forwards of other shapes afterwards).
  int64_t kept_bytes = 0;
  // The high-water marks of the steps' peak used memory: over the run (the warm-up steps, with
  // graphs the capturing one, included) and over the timed steps alone.
  int64_t run_peak_used = 0, timed_peak_used = 0;

  // A failure inside the loop is recorded in the log before it propagates, so that the log of
  // a run that stopped says why: {"event": "error", "step", "kind", "message"}, kind
  // "out_of_memory" (a baseline that does not fit is a result of its own) or "error".
  int64_t step = first_step;
  auto log_failure = [&](const char* kind, const char* message) {
    log.write({{"event", "error"}, {"step", step}, {"kind", kind}, {"message", message}});
  };
  // With graphs: the step after the first is captured (its allocations, caches and the moments
  // exist by then) and replayed at once; each later step writes its micro-batches and step
  // values into the page-locked tensors the graph copies from, and replays it. What the
  // captured work created and kept (each micro-batch's losses, the norm) is what every replay
  // writes. The inputs are rewritten only after the last step's losses have been read: the
  // device is done with them by then.
  const double loss_scale = 1.0 / static_cast<double>(accum);
  DeviceGraph graph;
  // The capturing step's marks up to its first replay. The pool's high-water mark and the graph
  // memory's are reached at different moments of that step (the pool's while the first step's
  // leftovers live, until the capture ends; the graph's during the replay), so their sum would
  // overstate its peak: the step's peak is the larger of the two stretches'. Zero at other steps.
  MemoryStats before_first_replay;
  std::vector<Tensor> graph_x, graph_y, graph_pending(static_cast<size_t>(rank_accum));
  OptimizerStep graph_update;
  if (graphs) {
    dp.pin_step_values();
    for (int64_t micro = 0; micro < rank_accum; ++micro) {
      graph_x.push_back(Tensor::empty_pinned({c.batch_size, c.seq_len}, DType::i32));
      graph_y.push_back(Tensor::empty_pinned({c.batch_size, c.seq_len}, DType::i32));
    }
  }
  auto replay_step = [&](int64_t at, double lr) {
    for (int64_t micro = 0; micro < rank_accum; ++micro) {
      train_loader.next_batch(x, y);  // one rank: every micro-batch is this rank's
      graph_x[static_cast<size_t>(micro)].copy_from(x);
      graph_y[static_cast<size_t>(micro)].copy_from(y);
    }
    dp.set_step(at, lr);
    if (!graph.captured()) {
      const auto t = Clock::now();
      graph = DeviceGraph::capture(c.device, [&] {
        model.zero_grad();
        for (size_t micro = 0; micro < graph_x.size(); ++micro) {
          graph_pending[micro] =
              model.forward_train_deferred(graph_x[micro], graph_y[micro], loss_scale, Tensor());
          model.backward(loss_scale, models::GradientReady());
        }
        graph_update = dp.step(at, lr);
      });
      // The graph's memory is its own: the pool's spare memory (with the first step's
      // activations, freed as the capture replaced them) goes back before the graph takes it.
      release_cached_memory(c.device);
      before_first_replay = memory_stats(c.device);
      reset_peak_memory(c.device);
      out << "graph:     step " << at << " captured: " << graph.node_count() << " nodes in "
          << elapsed_ms(t) << " ms\n";
    }
    graph.replay();
  };
  // Steps that warm up (the first; with graphs also the captured one) are not timed.
  const int64_t warmup_steps = graphs ? 2 : 1;

  try {
    for (; step <= c.steps; ++step) {
      reset_peak_memory(c.device);
      if (profile) profile->begin_step(step, step == profile_at);
      const auto t0 = Clock::now();
      const double lr = schedule.lr(step);
      models::ProfileRegion region(profile.get(), models::OpFamily::zero_grad,
                                   static_cast<double>(model.zeroed_grad_bytes()));
      // Each micro-batch's losses stay on the device until the step's end: one wait per step.
      std::vector<Tensor> pending(static_cast<size_t>(rank_accum));
      OptimizerStep update;
      if (graphs && step > first_step) {
        replay_step(step, lr);
        pending = graph_pending;
        update = graph_update;
      } else {
        model.zero_grad();
        for (int64_t micro = 0; micro < rank_accum; ++micro) {
          region.enter(models::OpFamily::data,
                       2.0 * static_cast<double>(c.batch_size * c.seq_len * sizeof(int32_t)));
          train_loader.skip(rank);  // the micro-batches of the ranks before this one
          train_loader.next_batch(x, y);
          train_loader.skip(ranks - 1 - rank);
          const Tensor segments = segments_for(x, eot);
          region.leave();
          // Segment ids go in on the CPU; the model copies them to its device once per forward.
          pending[static_cast<size_t>(micro)] =
              model.forward_train_deferred(x, y, loss_scale, segments);
          // The last backward queues each gradient bucket as soon as it is complete.
          const bool last = micro + 1 == rank_accum;
          model.backward(loss_scale, last ? dp.gradient_ready() : models::GradientReady());
        }
        update = dp.step(step, lr);
      }
      region.enter(models::OpFamily::classifier_loss,
                   static_cast<double>(rank_accum * c.batch_size * c.seq_len * sizeof(float)));
      std::vector<double> losses(pending.size());
      for (size_t i = 0; i < pending.size(); ++i) {
        losses[i] = models::Transformer::mean_loss_of(pending[i]);
      }
      const double norm = update.grad_norm();  // the device is done with the step by now
      region.leave();
      if (profile) profile->end_step();
      synchronize(c.device);  // the step's time includes its device work
      const double rank_ms = elapsed_ms(t0);
      if (profile && step == profile_at) {
        const ProfileReport report =
            make_profile_report(profile->result(), profile_run(c, mc), profile_floors_of(c));
        profile_table = format_profile_table(report);
        log.write(to_json(report));
      }
      const bool stop_here = c.stop_requested != nullptr && c.stop_requested->load();
      MemoryStats step_memory = memory_stats(c.device);
      step_memory.peak_used_bytes =
          std::max(step_memory.peak_used_bytes, before_first_replay.peak_used_bytes);
      step_memory.peak_reserved_bytes =
          std::max(step_memory.peak_reserved_bytes, before_first_replay.peak_reserved_bytes);
      before_first_replay = MemoryStats();
      const StepShares shares =
          share_step(comm, losses, rank_ms, step_memory, stop_here, tokens_per_step / ranks);
      const double loss = shares.loss, ms = shares.ms;
      FT_CHECK(std::isfinite(loss), "training diverged: loss is ", loss, " at step ", step);
      const MemoryStats& mem = shares.memory;
      StepRecord r;
      r.step = step;
      r.total_steps = c.steps;
      r.train_loss = loss;
      r.lr = lr;
      r.ms = ms;
      r.tokens_per_second = static_cast<double>(tokens_per_step) / (ms / 1000.0);
      r.grad_norm = norm;
      r.peak_used_mb = to_mb(mem.peak_used_bytes);
      r.peak_reserved_mb = to_mb(mem.peak_reserved_bytes);
      r.attention_saved_mb = to_mb(model.attention_saved_bytes());
      r.activations_saved_mb = to_mb(model.saved_activation_bytes());
      kept_bytes = std::max(kept_bytes, model.saved_activation_bytes());
      run_peak_used = std::max(run_peak_used, mem.peak_used_bytes);
      const double elapsed_s = elapsed_ms(loop_start) / 1000.0;
      r.elapsed_s = elapsed_s;
      r.eta_s = elapsed_s / static_cast<double>(step - first_step + 1) *
                static_cast<double>(c.steps - step);
      r.tokens_seen = step * tokens_per_step;
      if (distributed) r.ranks = shares.ranks;
      if (step - first_step >= warmup_steps || (step == c.steps && timed_steps == 0)) {
        timed_ms += ms;
        ++timed_steps;
        timed_peak_used = std::max(timed_peak_used, mem.peak_used_bytes);
      }
      const bool last = step == c.steps;
      if (val_loader && ((c.eval_every > 0 && step % c.eval_every == 0) || last)) {
        r.val_loss = evaluate(model, *val_loader, c.val_steps, eot, comm);
        summary.final_val_loss = *r.val_loss;
      }
      if (!c.quiet) {
        out << format_step_line(r) << "\n";
        if (r.val_loss) out << "val loss " << *r.val_loss << "\n";
        out.flush();
      }
      log.write(to_json(r));
      summary.final_train_loss = loss;
      summary.losses.push_back(loss);
      summary.steps_run = step;
      if (c.save_every > 0 && step % c.save_every == 0 && !last) save(step);
      if (c.sample_every > 0 && step % c.sample_every == 0 && !last && can_sample && root) {
        const std::string sample = sample_text(model, *tokenizer, c.sample_tokens, c.seed, eot);
        if (!c.quiet) out << "sample: " << sample << "\n";
        log.write({{"event", "sample"}, {"step", step}, {"text", sample}});
      }
      if (!last && shares.stop) {  // every rank stops after the same step
        interrupted = true;
        break;
      }
    }
  } catch (const OutOfMemory& e) {
    log_failure("out_of_memory", e.what());
    throw;
  } catch (const std::bad_alloc&) {
    log_failure("out_of_memory", "out of host memory (std::bad_alloc)");
    throw;
  } catch (const std::exception& e) {
    log_failure("error", e.what());
    throw;
  }
  const int64_t done = interrupted ? step : c.steps;
  save(done);
  summary.interrupted = interrupted;

  summary.mean_step_ms = timed_steps ? timed_ms / static_cast<double>(timed_steps) : 0.0;
  summary.tokens_per_second =
      summary.mean_step_ms > 0 ? tokens_per_step / (summary.mean_step_ms / 1000.0) : 0.0;
  if (can_sample && c.sample_tokens > 0 && !interrupted && root) {
    summary.sample = sample_text(model, *tokenizer, c.sample_tokens, c.seed, eot);
  }
  out << "\n== summary ==\n"
      << "steps " << summary.steps_run << " | final train loss " << summary.final_train_loss;
  if (summary.final_val_loss >= 0) out << " | final val loss " << summary.final_val_loss;
  out << " | " << static_cast<int64_t>(summary.tokens_per_second) << " tok/s | "
      << summary.mean_step_ms << " ms/step (mean over " << timed_steps << " steps) | "
      << done * tokens_per_step << " tokens | " << elapsed_ms(loop_start) / 1000.0 << " s\n";
  out << "memory:    the layers kept " << to_mb(kept_bytes)
      << " MB of activations per micro-batch for backward (--recompute "
      << models::recompute_name(c.recompute) << "); the classifier's logits "
      << to_mb(logits_bytes(mc, c.dtype, classifier_chunk > 0 ? classifier_chunk : micro_rows))
      << " MB";
  if (classifier_chunk > 0) {
    out << " (chunks of " << classifier_chunk
        << " rows; the whole micro-batch's: " << to_mb(logits_bytes(mc, c.dtype, micro_rows))
        << " MB)";
  }
  out << "; the weights " << to_mb(model.weight_bytes()) << " MB";
  if (model.split_masters()) {
    // A separate bf16 copy would take what the high halves take.
    out << " (fp32 masters in two halves, the high one the bf16 copy: "
        << to_mb(static_cast<int64_t>(model.flat_compute().nbytes())) << " MB less)";
  }
  if (run_peak_used > 0) {
    out << "; peak used " << to_mb(run_peak_used) << " MB over the run, " << to_mb(timed_peak_used)
        << " MB over the timed steps";
  }
  out << "\n";
  if (!c.save_path.empty()) {
    out << "saved:     " << c.save_path << " (+ .state for --resume) after step " << done << "\n";
  }
  if (interrupted) {
    out << "interrupted: stopped after step " << done << " of " << c.steps;
    if (!c.save_path.empty()) out << "; continue with --resume " << c.save_path;
    out << "\n";
  }
  if (!summary.sample.empty()) out << "sample:\n" << summary.sample << "\n";
  if (!profile_table.empty()) out << "\n" << profile_table;
  out.flush();
  log.write({{"event", "summary"},
             {"steps", summary.steps_run},
             {"sample", summary.sample},
             {"final_train_loss", summary.final_train_loss},
             {"final_val_loss", summary.final_val_loss},
             {"tok_per_s", summary.tokens_per_second},
             {"mean_step_ms", summary.mean_step_ms},
             {"activations_saved_mb", to_mb(kept_bytes)},
             {"weights_mb", to_mb(model.weight_bytes())},
             {"run_peak_used_mb", to_mb(run_peak_used)},
             {"timed_peak_used_mb", to_mb(timed_peak_used)}});
  if (interrupted) {
    log.write({{"event", "interrupted"},
               {"step", done},
               {"steps", c.steps},
               {"saved", c.save_path.empty() ? nlohmann::json() : nlohmann::json(c.save_path)}});
  }
  return summary;
}

}  // namespace ft::train

#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <new>
#include <optional>
#include <ostream>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/output_path.h"
#include "models/checkpoint.h"
#include "train/data_loader.h"
#include "train/documents.h"
#include "train/generate.h"
#include "train/optimizer.h"
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

int64_t accumulation_steps(const TrainConfig& c) {
  const int64_t per_micro = c.batch_size * c.seq_len;
  const int64_t total = c.total_batch_size > 0 ? c.total_batch_size : per_micro;
  FT_CHECK(total % per_micro == 0, "total batch size ", total,
           " tokens is not a multiple of batch size x seq len = ", c.batch_size, " x ", c.seq_len,
           " = ", per_micro);
  return total / per_micro;
}

bool finite_at_least(double v, double lo) {
  return std::isfinite(v) && v >= lo;
}

// Every setting in its range, before any work: a bad value is an error naming the flag, never a
// failure many steps later.
void check_config(const TrainConfig& c, const models::ModelConfig& m) {
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
  FT_CHECK(c.load_path.empty() || !c.overrides.any(), "--load ", c.load_path,
           " takes the model shape from the checkpoint; ", c.overrides.describe(),
           " would be ignored (drop the override, or train the new shape without --load)");
  accumulation_steps(c);
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

double evaluate(models::Transformer& model, DataLoader& loader, int64_t max_batches,
                std::optional<int32_t> eot) {
  loader.reset();
  const int64_t n = std::min(max_batches, loader.batches_per_epoch());
  Tensor x, y;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    loader.next_batch(x, y);
    sum += model.forward(x, y, segments_for(x, eot));
  }
  return sum / static_cast<double>(n);
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

}  // namespace

models::ModelConfig resolve_model_config(const TrainConfig& c) {
  if (!c.load_path.empty()) return models::read_checkpoint_config(c.load_path);
  return models::apply_overrides(models::preset(c.model), c.overrides);
}

TrainSummary train(const TrainConfig& c, std::ostream& out) {
  // A save that an interrupt cut short is finished (or its temporary files removed) first.
  std::vector<std::string> notes;
  for (const std::string* path : {&c.load_path, &c.resume_path, &c.save_path}) {
    if (path->empty()) continue;
    const std::string note = recover_saved_run(*path);
    if (!note.empty()) notes.push_back(note);
  }
  const models::ModelConfig mc = resolve_model_config(c);
  check_config(c, mc);
  // Outputs are checked before any work, so that no run is lost to a path found bad at its end.
  if (!c.save_path.empty()) check_writable_file(c.save_path, "--save");
  if (!c.log_path.empty()) check_writable_file(c.log_path, "--log");
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
  const int64_t accum = accumulation_steps(c);
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

  models::Transformer model(mc, c.dtype, c.attention, c.device);
  if (!c.load_path.empty()) {
    models::load_checkpoint(c.load_path, model);
  } else {
    model.init_weights(c.seed);
  }
  const nlohmann::json record = make_run_record(c, mc, accum, train_loader, val_loader.get());
  int64_t first_step = 1;
  std::vector<std::string> resume_changes;
  if (!c.resume_path.empty()) {
    const std::string state_path = c.resume_path + ".state";
    const TrainState state = read_train_state(state_path);
    resume_changes =
        check_resume(state.run, record, state.step, c.allow_schedule_change, state_path);
    FT_CHECK(state.step < c.steps, c.resume_path, " already completed ", state.step,
             " steps; --steps ", c.steps, " leaves nothing to do");
    load_train_state(state_path, model);
    train_loader.restore(state.loader);
    first_step = state.step + 1;
  }
  const bool resumed = first_step > 1;

  out << "model:     " << mc.describe() << "\n"
      << "run:       " << device_name(c.device) << ", " << dtype_name(c.dtype) << ", attention "
      << attention::impl_name(c.attention.impl);
  if (c.attention.window > 0) {
    out << " (window " << c.attention.window;
    if (c.attention.global_every > 0) out << ", every " << c.attention.global_every << " full";
    out << ")";
  }
  if (eot) out << ", doc mask at end-of-text " << *eot;
  out << ", batch " << c.batch_size << " x seq " << c.seq_len << " x accumulation " << accum
      << " = " << tokens_per_step << " tokens per step\n"
      << "data:      " << c.train_data << " (" << train_loader.num_tokens() << " tokens)";
  if (val_loader) out << ", val " << c.val_data << " (" << val_loader->num_tokens() << " tokens)";
  out << "\n";
  if (resumed) {
    out << "resumed:   from " << c.resume_path << " after step " << first_step - 1 << "\n";
    for (const std::string& change : resume_changes) out << "           " << change << "\n";
  }
  for (const std::string& note : notes) out << "note:      " << note << "\n";
  out.flush();

  // A resumed run continues its log: a {"event": "resume"} line, then its steps.
  std::error_code ec;
  const bool log_continues =
      resumed && !c.log_path.empty() && std::filesystem::file_size(c.log_path, ec) > 0 && !ec;
  JsonLog log = c.log_path.empty() ? JsonLog() : JsonLog(c.log_path, resumed);
  if (!log_continues) {
    log.write({{"event", "run"},
               {"model", mc.name},
               {"family", models::family_name(mc.family)},
               {"parameters", mc.num_parameters()},
               {"dtype", dtype_name(c.dtype)},
               {"device", device_name(c.device)},
               {"attention", attention::impl_name(c.attention.impl)},
               {"window", c.attention.window},
               {"global_every", c.attention.global_every},
               {"doc_mask", c.doc_mask},
               {"batch_size", c.batch_size},
               {"seq_len", c.seq_len},
               {"tokens_per_step", tokens_per_step},
               {"steps", c.steps},
               {"seed", c.seed}});
  }
  if (resumed) {
    log.write({{"event", "resume"},
               {"step", first_step - 1},
               {"steps", c.steps},
               {"from", c.resume_path},
               {"changes", resume_changes}});
  }

  const LrSchedule schedule{c.lr, c.warmup, c.steps, c.min_lr_fraction, c.lr_decay};
  Optimizer optimizer(model, c.adamw, c.grad_clip);

  TrainSummary summary;
  double timed_ms = 0.0;
  int64_t timed_steps = 0;
  Tensor x, y;
  int64_t saved_step = -1;
  // The checkpoint and its resume state, as one unit (train/saved_run.h).
  auto save = [&](int64_t done) {
    if (c.save_path.empty() || saved_step == done) return;
    save_run(c.save_path, model, c.dtype, {done, train_loader.state(), record});
    saved_step = done;
  };
  const auto loop_start = Clock::now();
  bool interrupted = false;

  // A failure inside the loop is recorded in the log before it propagates, so that the log of
  // a run that stopped says why: {"event": "error", "step", "kind", "message"}, kind
  // "out_of_memory" (a baseline that does not fit is a result of its own) or "error".
  int64_t step = first_step;
  auto log_failure = [&](const char* kind, const char* message) {
    log.write({{"event", "error"}, {"step", step}, {"kind", kind}, {"message", message}});
  };
  try {
    for (; step <= c.steps; ++step) {
      reset_peak_memory(c.device);
      const auto t0 = Clock::now();
      model.zero_grad();
      double loss = 0.0;
      for (int64_t micro = 0; micro < accum; ++micro) {
        train_loader.next_batch(x, y);
        // Segment ids go in on the CPU; the model copies them to its device once per forward.
        loss += model.forward(x, y, segments_for(x, eot));
        model.backward(1.0 / static_cast<double>(accum));
      }
      loss /= static_cast<double>(accum);
      const double lr = schedule.lr(step);
      const double norm = optimizer.step(step, lr).grad_norm;
      synchronize(c.device);  // the step's time includes its device work
      const double ms = elapsed_ms(t0);
      FT_CHECK(std::isfinite(loss), "training diverged: loss is ", loss, " at step ", step);

      const MemoryStats mem = memory_stats(c.device);
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
      const double elapsed_s = elapsed_ms(loop_start) / 1000.0;
      r.elapsed_s = elapsed_s;
      r.eta_s = elapsed_s / static_cast<double>(step - first_step + 1) *
                static_cast<double>(c.steps - step);
      r.tokens_seen = step * tokens_per_step;
      if (step > first_step || c.steps == first_step) {
        timed_ms += ms;
        ++timed_steps;
      }
      const bool last = step == c.steps;
      if (val_loader && ((c.eval_every > 0 && step % c.eval_every == 0) || last)) {
        r.val_loss = evaluate(model, *val_loader, c.val_steps, eot);
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
      if (c.sample_every > 0 && step % c.sample_every == 0 && !last && can_sample) {
        const std::string sample = sample_text(model, *tokenizer, c.sample_tokens, c.seed, eot);
        if (!c.quiet) out << "sample: " << sample << "\n";
        log.write({{"event", "sample"}, {"step", step}, {"text", sample}});
      }
      if (!last && c.stop_requested != nullptr && c.stop_requested->load()) {
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
  if (can_sample && c.sample_tokens > 0 && !interrupted) {
    summary.sample = sample_text(model, *tokenizer, c.sample_tokens, c.seed, eot);
  }
  out << "\n== summary ==\n"
      << "steps " << summary.steps_run << " | final train loss " << summary.final_train_loss;
  if (summary.final_val_loss >= 0) out << " | final val loss " << summary.final_val_loss;
  out << " | " << static_cast<int64_t>(summary.tokens_per_second) << " tok/s | "
      << summary.mean_step_ms << " ms/step (mean over " << timed_steps << " steps) | "
      << done * tokens_per_step << " tokens | " << elapsed_ms(loop_start) / 1000.0 << " s\n";
  if (!c.save_path.empty()) {
    out << "saved:     " << c.save_path << " (+ .state for --resume) after step " << done << "\n";
  }
  if (interrupted) {
    out << "interrupted: stopped after step " << done << " of " << c.steps;
    if (!c.save_path.empty()) out << "; continue with --resume " << c.save_path;
    out << "\n";
  }
  if (!summary.sample.empty()) out << "sample:\n" << summary.sample << "\n";
  out.flush();
  log.write({{"event", "summary"},
             {"steps", summary.steps_run},
             {"sample", summary.sample},
             {"final_train_loss", summary.final_train_loss},
             {"final_val_loss", summary.final_val_loss},
             {"tok_per_s", summary.tokens_per_second},
             {"mean_step_ms", summary.mean_step_ms}});
  if (interrupted) {
    log.write({{"event", "interrupted"},
               {"step", done},
               {"steps", c.steps},
               {"saved", c.save_path.empty() ? nlohmann::json() : nlohmann::json(c.save_path)}});
  }
  return summary;
}

}  // namespace ft::train

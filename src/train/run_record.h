// The run record: everything that decides a training run's losses, kept in its resume state
// (train/train_state.h) so that `--resume` can refuse a change that would make the resumed run
// differ from an uninterrupted one. Resume semantics:
//
//   recorded and refused when changed: the model shape, dtype, attention mask (--window,
//     --global-every, --doc-mask), batch layout (B, T, accumulation), training data (file names
//     and token counts) and validation data and --val-steps, --seed, --shuffle, the optimizer
//     (--weight-decay, AdamW betas and eps, --grad-clip), --tf32, and the learning-rate schedule
//     (--lr, --lr-schedule, --warmup, --min-lr-frac, --steps);
//   declared safe (accepted, and named in the log's resume line): --attention (naive and flash
//     compute the same attention; their fp32 losses agree to 1e-5, not bit for bit),
//     --deterministic and --kernel-config (the file and the kernel configurations it gave: the
//     same attention with its sums in another order), --device (CPU and GPU agree within the
//     same tolerances), --recompute (the same ops run again in backward: the same losses bit
//     for bit), the number of ranks and --zero
//     (the batch layout counts micro-batches per step over all ranks, so another world size
//     trains on the same micro-batches; only the order of the gradient sums differs, and a
//     ZeRO-1 state is saved whole);
//   --steps: a new total is accepted when the learning rates of the steps already run are the
//     same under it (a constant schedule, or a cosine run resumed within its warm-up), so the
//     resumed run continues exactly as a run of the new length; any other schedule change is
//     refused unless --allow-schedule-change says the resumed steps follow the new schedule;
//   anything else (--log, --save, --eval-every, --sample-*, --save-every) does not change the
//     losses and may differ.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/config.h"
#include "train/data_loader.h"
#include "train/trainer.h"

namespace ft::train {

// The record of config c: model m, `accum` micro-batches per step, the loaders it reads.
nlohmann::json make_run_record(const TrainConfig& c, const models::ModelConfig& m, int64_t accum,
                               const DataLoader& train, const DataLoader* val);

// Compares the record saved after `completed_steps` steps with the record of the run that
// resumes it. Returns the accepted changes, one line each ("attention: naive -> flash");
// throws ft::Error naming state_path and listing every refused change (what was saved, what is
// asked now) and how to proceed.
std::vector<std::string> check_resume(const nlohmann::json& saved, const nlohmann::json& now,
                                      int64_t completed_steps, bool allow_schedule_change,
                                      const std::string& state_path);

}  // namespace ft::train

// Resume state: what a checkpoint alone does not hold (fp32 master weights, AdamW moments,
// the step, the data position) and the record of everything that decides the run's losses
// (train/run_record.h), so that a resumed run reproduces the same losses bit for bit and a
// resume that would change them is refused.
//
// Format 2: 8-byte magic "FTSTATE2", uint64 length of a JSON header, the JSON header (step,
// loader position, run record, master dtype, parameter names and shapes), then for each
// parameter its master weights, first and second moments, raw, in the master dtype (whole fp32
// masters, also from a bf16 model, which keeps them split in two halves: models::Parameter).
// Format 1 ("FTSTATE1", which recorded only a fingerprint of the model and batch layout) is
// refused with a message saying so: it does not say which schedule, seed or data made it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "models/transformer.h"
#include "train/data_loader.h"

namespace ft::train {

inline constexpr int kTrainStateFormat = 2;

struct TrainState {
  int64_t step = 0;  // optimizer steps completed
  LoaderState loader;
  nlohmann::json run;  // the run record (train/run_record.h)
};

void save_train_state(const std::string& path, const models::Transformer& model,
                      const TrainState& state);

// The header only: step, loader position and run record. Throws ft::Error naming the file when
// it is missing, not a state file, of another format version, or truncated.
TrainState read_train_state(const std::string& path);

// Loads master weights and moments into model (and with them its compute copies); throws
// ft::Error naming the file when its parameters are not the model's or it is truncated.
void load_train_state(const std::string& path, models::Transformer& model);

}  // namespace ft::train

// Resume state: what a checkpoint alone does not hold (fp32 master weights, AdamW moments,
// the step, the data position), so that a resumed run reproduces the same losses bit for bit.
// Format: 8-byte magic "FTSTATE1", uint64 length of a JSON header, the JSON header (step,
// loader position, run fingerprint, parameter names and shapes), then for each parameter its
// master weights, first and second moments, raw, in the master dtype.
#pragma once

#include <cstdint>
#include <string>

#include "models/transformer.h"
#include "train/data_loader.h"

namespace ft::train {

struct TrainState {
  int64_t step = 0;  // optimizer steps completed
  LoaderState loader;
  std::string fingerprint;  // what must match to resume: model, dtype, batch layout
};

void save_train_state(const std::string& path, const models::Transformer& model,
                      const TrainState& state);
// Loads master weights and moments into model; throws ft::Error naming the file when it is
// not a state file, is truncated, or was written for another model or batch layout.
TrainState load_train_state(const std::string& path, models::Transformer& model,
                            const std::string& expected_fingerprint);

}  // namespace ft::train

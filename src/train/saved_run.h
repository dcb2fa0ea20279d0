// A saved run: the llm.c checkpoint CKPT and its resume state CKPT.state, written as one unit.
//
// Both files are written completely under temporary names (CKPT.tmp.<pid>, CKPT.state.tmp.<pid>);
// then the journal CKPT.commit, naming both (temporary, final) pairs and the step, is written
// under a temporary name and renamed into place: that rename is the commit point. Both files
// are then renamed into place and the journal is removed. A process killed before the commit
// point leaves the previous pair as it was (its temporary files are removed by the next save);
// killed after it, recover_saved_run() (which every save, --resume and --load runs first)
// finishes the renames. So no interrupt leaves CKPT and CKPT.state from different steps.
// Protects against a process being killed, not against a power cut (nothing is fsync'ed).
#pragma once

#include <functional>
#include <string>

#include "core/dtype.h"
#include "models/transformer.h"
#include "train/train_state.h"

namespace ft::train {

// The steps of a save, for tests that stop a writer between them.
enum class SavePhase { files_written, committed, checkpoint_renamed, done };

// Writes the checkpoint (weights in file_dtype) and the resume state as one unit.
// after_phase (tests) runs after each phase.
void save_run(const std::string& path, const models::Transformer& model, DType file_dtype,
              const TrainState& state, const std::function<void(SavePhase)>& after_phase = {});

// Finishes a save of `path` whose journal exists, and removes temporary files that saves of
// `path` left behind in processes that are gone. Returns what it did, for a note ("" when it
// found nothing to do). Throws ft::Error for a journal it cannot read.
std::string recover_saved_run(const std::string& path);

// The journal's name: path + ".commit".
std::string journal_path(const std::string& path);

}  // namespace ft::train

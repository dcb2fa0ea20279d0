// Resume semantics (train/run_record.h): which changes a resume accepts and which it refuses
// with the diff; a resumed log supersedes what a killed run logged past its last save; and the
// checkpoint + state pair (train/saved_run.h) survives a writer killed at any point of a save.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "models/checkpoint.h"
#include "models/transformer.h"
#include "test_util.h"
#include "train/run_log.h"
#include "train/run_record.h"
#include "train/saved_run.h"
#include "train/train_state.h"

namespace ft::train {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

json record() {
  TrainConfig c;
  c.steps = 20;
  c.warmup = 5;
  const models::ModelConfig m = models::preset("gpt2-tiny");
  DataLoader loader(test::source_path("data/tinyshakespeare_val.bin"), 2, 8);
  return make_run_record(c, m, 1, loader, nullptr);
}

std::string refusal(const json& saved, const json& now, int64_t done, bool allow = false) {
  try {
    check_resume(saved, now, done, allow, "ck.bin.state");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(RunRecord, RefusesWhatChangesTheLossesWithTheDiff) {
  const json saved = record();
  for (const auto& [key, value] : std::vector<std::pair<std::string, json>>{{"seed", 7},
                                                                            {"shuffle", true},
                                                                            {"weight_decay", 0.0},
                                                                            {"grad_clip", 0.5},
                                                                            {"batch_size", 3},
                                                                            {"dtype", "bf16"},
                                                                            {"doc_mask", true},
                                                                            {"window", 16},
                                                                            {"tf32", true},
                                                                            {"val_steps", 3}}) {
    json now = saved;
    now[key] = value;
    const std::string why = refusal(saved, now, 10);
    EXPECT_NE(why.find("ck.bin.state: written for a different run"), std::string::npos)
        << key << ": " << why;
    EXPECT_NE(
        why.find(key + ": " +
                 (saved[key].is_string() ? saved[key].get<std::string>() : saved[key].dump()) +
                 " -> "),
        std::string::npos)
        << why;
  }
  json now = saved;
  now["train_data"][0]["tokens"] = 12;
  EXPECT_NE(refusal(saved, now, 10).find("train_data"), std::string::npos);
  // Two changes are both listed.
  now = saved;
  now["seed"] = 9;
  now["shuffle"] = true;
  const std::string both = refusal(saved, now, 10);
  EXPECT_NE(both.find("seed: 1337 -> 9"), std::string::npos) << both;
  EXPECT_NE(both.find("shuffle: false -> true"), std::string::npos) << both;
}

TEST(RunRecord, AcceptsTheDeclaredSafeChanges) {
  const json saved = record();
  json now = saved;
  now["attention"] = "flash";
  now["device"] = "cuda";
  const std::vector<std::string> changes = check_resume(saved, now, 10, false, "s");
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0], "attention: naive -> flash");
  EXPECT_EQ(changes[1], "device: cpu -> cuda");
  EXPECT_TRUE(check_resume(saved, saved, 10, false, "s").empty());
}

// Another kernel-config file, or none, changes only the kernels' tiles (the order of the sums):
// accepted and listed, as --deterministic is. A record without the keys ran the built-in table.
TEST(RunRecord, KernelConfigIsASafeChange) {
  const json saved = record();
  EXPECT_FALSE(saved.contains("kernel_config"));
  json now = saved;
  now["kernel_config"] = "tuned.json";
  now["kernel_configs"] = {{"dense", "fwd=128x64/128 bwd=64x128/256/double"}};
  const std::vector<std::string> changes = check_resume(saved, now, 10, false, "s");
  ASSERT_EQ(changes.size(), 2u);
  EXPECT_EQ(changes[0], "kernel_config: built-in -> tuned.json");
  EXPECT_EQ(changes[1],
            R"(kernel_configs: built-in -> {"dense":"fwd=128x64/128 bwd=64x128/256/double"})");
  // And back: resuming without the flag.
  const std::vector<std::string> back = check_resume(now, saved, 10, false, "s");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[0], "kernel_config: tuned.json -> built-in");
  EXPECT_TRUE(check_resume(now, now, 10, false, "s").empty());
  // The refusal names it among the safe changes.
  json other = now;
  other["seed"] = 2;
  EXPECT_NE(refusal(now, other, 10).find("--kernel-config"), std::string::npos);
}

// --recompute keeps other activations and recomputes the rest with the same ops: the same
// losses bit for bit, so a resume may change it. A record without the key kept everything.
TEST(RunRecord, RecomputeIsASafeChange) {
  const json saved = record();
  EXPECT_EQ(saved.at("recompute"), "none");
  json now = saved;
  now["recompute"] = "block";
  const std::vector<std::string> changes = check_resume(saved, now, 10, false, "s");
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0], "recompute: none -> block");
  json older = saved;
  older.erase("recompute");
  EXPECT_TRUE(check_resume(older, saved, 10, false, "s").empty());
  EXPECT_EQ(check_resume(older, now, 10, false, "s"),
            std::vector<std::string>{"recompute: none -> block"});
  json other = now;
  other["seed"] = 2;
  EXPECT_NE(refusal(now, other, 10).find("--recompute"), std::string::npos);
}

TEST(RunRecord, MoreStepsOnlyWhenTheRatesSoFarStayOrTheChangeIsAllowed) {
  const json saved = record();  // cosine over 20 steps, warm-up 5
  json longer = saved;
  longer["steps"] = 40;
  // Within the warm-up the rates so far do not depend on --steps.
  EXPECT_EQ(check_resume(saved, longer, 5, false, "s").size(), 1u);
  // After it they do: refused, with what to do instead.
  const std::string why = refusal(saved, longer, 10);
  EXPECT_NE(why.find("learning-rate schedule"), std::string::npos) << why;
  EXPECT_NE(why.find("steps: 20 -> 40"), std::string::npos) << why;
  EXPECT_NE(why.find("--lr-schedule constant"), std::string::npos) << why;
  EXPECT_NE(why.find("--allow-schedule-change"), std::string::npos) << why;
  const std::vector<std::string> allowed = check_resume(saved, longer, 10, true, "s");
  ASSERT_EQ(allowed.size(), 1u);
  EXPECT_NE(allowed[0].find("--allow-schedule-change"), std::string::npos) << allowed[0];
  // A constant schedule: any new length keeps every rate.
  json constant = saved;
  constant["lr_schedule"] = "constant";
  json constant_longer = constant;
  constant_longer["steps"] = 1000;
  EXPECT_EQ(check_resume(constant, constant_longer, 15, false, "s").size(), 1u);
  // Another schedule parameter is a schedule change too; allowed only with the flag.
  json faster = saved;
  faster["lr"] = 0.002;
  EXPECT_NE(refusal(saved, faster, 10).find("lr: 0.001 -> 0.002"), std::string::npos);
  json warmer = saved;
  warmer["warmup"] = 2;
  EXPECT_NE(refusal(saved, warmer, 3).find("warmup: 5 -> 2"), std::string::npos);
  EXPECT_EQ(check_resume(saved, warmer, 3, true, "s").size(), 1u);
  // The flag does not open other changes.
  json other = longer;
  other["seed"] = 3;
  EXPECT_NE(refusal(saved, other, 10, true).find("written for a different run"), std::string::npos);
}

TEST(TrainState, Format1IsRefusedClearly) {
  test::TempDir dir;
  std::ofstream(dir.file("old.state"), std::ios::binary) << "FTSTATE1" << std::string(64, '\0');
  try {
    read_train_state(dir.file("old.state"));
    ADD_FAILURE() << "format 1 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("format 1"), std::string::npos) << e.what();
  }
}

TEST(RunLogResume, StepsPastTheResumedStepAreSuperseded) {
  std::istringstream in(
      R"({"event": "run", "dtype": "fp32"}
{"step": 1, "train_loss": 9.0}
{"step": 2, "train_loss": 8.0}
{"step": 3, "train_loss": 7.0}
{"step": 4, "train_loss": 6.5}
{"event": "error", "step": 5, "kind": "error", "message": "killed"}
{"event": "resume", "step": 2, "steps": 5, "from": "ck.bin", "changes": []}
{"step": 3, "train_loss": 7.0}
{"step": 4, "train_loss": 6.4}
{"step": 5, "train_loss": 6.0}
)");
  const RunLog log = parse_json_lines_log(in, "run.jsonl");
  ASSERT_TRUE(log.ok()) << log.error;
  ASSERT_EQ(log.steps.size(), 5u);
  EXPECT_EQ(log.steps[3].train_loss, 6.4);
  EXPECT_EQ(log.steps[3].line, 9);
  EXPECT_FALSE(log.failure.has_value()) << "the resumed run went on past the failure";
}

// ---- the checkpoint + state pair ----

models::ModelConfig tiny() {
  models::ModelOverrides o;
  o.layers = 1;
  o.width = 32;
  o.heads = 2;
  o.vocab = 200;
  o.context = 16;
  return models::apply_overrides(models::preset("gpt2-tiny"), o);
}

// The pair on disk belongs together: the checkpoint's weights are the state's master weights
// (fp32 files), and the state says which step that was.
int64_t check_pair(const std::string& path) {
  models::Transformer from_checkpoint(tiny(), DType::f32, {});
  models::load_checkpoint(path, from_checkpoint);
  models::Transformer from_state(tiny(), DType::f32, {});
  load_train_state(path + ".state", from_state);
  for (size_t i = 0; i < from_state.parameters().size(); ++i) {
    EXPECT_EQ(max_abs_diff(from_checkpoint.parameters()[i].master_weights(),
                           from_state.parameters()[i].master_weights()),
              0.0)
        << from_state.parameters()[i].name << ": checkpoint and state from different steps";
  }
  return read_train_state(path + ".state").step;
}

std::vector<std::string> temporary_files(const fs::path& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.find(".tmp.") != std::string::npos || name.ends_with(".commit")) found.push_back(name);
  }
  return found;
}

// A writer killed after each phase of a save (a process killed, as by a second Ctrl-C): after
// recovery the pair is whole, of the old step before the commit point and of the new one
// after it, and no temporary file is left.
TEST(SavedRun, AWriterKilledAtAnyPointLeavesAWholePair) {
  GTEST_FLAG_SET(death_test_style, "fast");  // the child must see this test's directory
  for (SavePhase stop_after :
       {SavePhase::files_written, SavePhase::committed, SavePhase::checkpoint_renamed}) {
    test::TempDir dir;
    const std::string path = dir.file("ck.bin");
    models::Transformer old_model(tiny(), DType::f32, {});
    old_model.init_weights(1);
    save_run(path, old_model, DType::f32, {5, {}, json::object()});
    ASSERT_EQ(check_pair(path), 5);

    models::Transformer new_model(tiny(), DType::f32, {});
    new_model.init_weights(2);
    EXPECT_EXIT(
        {
          save_run(path, new_model, DType::f32, {10, {}, json::object()}, [&](SavePhase p) {
            if (p == stop_after) ::_exit(3);
          });
          ::_exit(0);
        },
        ::testing::ExitedWithCode(3), "");
    const int64_t expected = stop_after == SavePhase::files_written ? 5 : 10;
    EXPECT_FALSE(temporary_files(dir.path()).empty()) << "the writer was stopped mid-save";
    const std::string note = recover_saved_run(path);
    EXPECT_FALSE(note.empty());
    EXPECT_TRUE(temporary_files(dir.path()).empty()) << temporary_files(dir.path()).front();
    EXPECT_EQ(check_pair(path), expected) << "stopped after phase " << static_cast<int>(stop_after);
    // The next save works as usual.
    save_run(path, new_model, DType::f32, {11, {}, json::object()});
    EXPECT_EQ(check_pair(path), 11);
  }
}

// Temporary files of a writer that is gone are removed; a live writer's are left alone.
TEST(SavedRun, StaleTemporaryFilesOfGoneWritersAreRemoved) {
  test::TempDir dir;
  const std::string path = dir.file("ck.bin");
  const std::string gone = "999999999";  // above any pid_max
  const std::string live = std::to_string(::getppid());
  for (const std::string& name :
       {"ck.bin.tmp." + gone, "ck.bin.state.tmp." + gone + ".tmp." + gone,
        "ck.bin.commit.tmp." + gone, "ck.bin.tmp." + live, "other.bin.tmp." + gone}) {
    std::ofstream(dir.file(name)) << "partial";
  }
  const std::string note = recover_saved_run(path);
  EXPECT_NE(note.find("removed 3 temporary files"), std::string::npos) << note;
  EXPECT_FALSE(fs::exists(dir.file("ck.bin.tmp." + gone)));
  EXPECT_TRUE(fs::exists(dir.file("ck.bin.tmp." + live))) << "a live writer's file";
  EXPECT_TRUE(fs::exists(dir.file("other.bin.tmp." + gone))) << "another checkpoint's file";
  EXPECT_EQ(recover_saved_run(path), "");
}

}  // namespace
}  // namespace ft::train

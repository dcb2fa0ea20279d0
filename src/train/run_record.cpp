#include "train/run_record.h"

#include <filesystem>
#include <map>
#include <set>

#include "core/error.h"
#include "train/schedule.h"

namespace ft::train {
namespace {

using nlohmann::json;

// Declared safe: the same computation by another implementation, on another device, with
// another summation order (deterministic, or other kernel tiles: kernel_config and the
// configurations it gave), spread over another number of ranks (the same micro-batches per
// step: sums in another order), or keeping other activations for backward (recompute: the same
// ops again, the same losses bit for bit), or running the classifier over other chunks of rows
// (classifier_chunk: the head's gradient summed in another order).
const std::set<std::string> kSafe = {"attention",     "device",         "deterministic",
                                     "kernel_config", "kernel_configs", "world_size",
                                     "zero",          "recompute",      "classifier_chunk"};
// What a record without the key means (records of one process leave world_size and zero out,
// runs without --kernel-config the kernel configurations, records older than --recompute keep
// everything, records older than --classifier-chunk ran the classifier over the whole
// micro-batch).
const std::map<std::string, json> kImplied = {{"world_size", 1},
                                              {"zero", 0},
                                              {"kernel_config", "built-in"},
                                              {"kernel_configs", "built-in"},
                                              {"recompute", "none"},
                                              {"classifier_chunk", 0}};

json implied(const json& record, const std::string& key) {
  if (record.contains(key)) return record.at(key);
  const auto it = kImplied.find(key);
  return it == kImplied.end() ? json() : it->second;
}
// The learning-rate schedule; --allow-schedule-change accepts changes to these.
const std::set<std::string> kSchedule = {"steps", "lr", "lr_schedule", "warmup", "min_lr_frac"};

json data_record(const DataLoader& loader) {
  json files = json::array();
  for (const std::string& f : loader.files()) {
    files.push_back({{"file", std::filesystem::path(f).filename().string()},
                     {"tokens", read_shard_header(f).num_tokens}});
  }
  return files;
}

LrSchedule schedule_of(const json& r) {
  LrSchedule s;
  s.peak = r.at("lr").get<double>();
  s.warmup_steps = r.at("warmup").get<int64_t>();
  s.total_steps = r.at("steps").get<int64_t>();
  s.min_lr_fraction = r.at("min_lr_frac").get<double>();
  s.decay = parse_lr_decay(r.at("lr_schedule").get<std::string>());
  return s;
}

// The steps already run see the same learning rates under both schedules, bit for bit.
bool same_rates_so_far(const json& saved, const json& now, int64_t completed_steps) {
  const LrSchedule a = schedule_of(saved), b = schedule_of(now);
  for (int64_t s = 1; s <= completed_steps; ++s) {
    if (a.lr(s) != b.lr(s)) return false;
  }
  return true;
}

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? sep : "") + parts[i];
  return out;
}

std::string shown(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "(not recorded)";
  return v.dump();
}

}  // namespace

json make_run_record(const TrainConfig& c, const models::ModelConfig& m, int64_t accum,
                     const DataLoader& train, const DataLoader* val) {
  models::ModelConfig shape = m;
  shape.name = "model";  // a checkpoint header names the file, not the preset
  return {{"model", shape.describe()},
          {"dtype", dtype_name(c.dtype)},
          {"attention", attention::impl_name(c.attention.impl)},
          {"device", device_name(c.device)},
          {"window", c.attention.window},
          {"global_every", c.attention.global_every},
          {"deterministic", c.attention.deterministic},
          {"doc_mask", c.doc_mask},
          {"recompute", models::recompute_name(c.recompute)},
          {"classifier_chunk", c.classifier_chunk == TrainConfig::kAutoClassifierChunk
                                   ? json("auto")
                                   : json(c.classifier_chunk)},
          {"batch_size", c.batch_size},
          {"seq_len", c.seq_len},
          {"accumulation", accum},
          {"train_data", data_record(train)},
          {"val_data", val ? data_record(*val) : json::array()},
          {"val_steps", c.val_steps},
          {"seed", c.seed},
          {"shuffle", c.shuffle},
          {"steps", c.steps},
          {"lr", c.lr},
          {"lr_schedule", lr_decay_name(c.lr_decay)},
          {"warmup", c.warmup},
          {"min_lr_frac", c.min_lr_fraction},
          {"weight_decay", c.adamw.weight_decay},
          {"beta1", c.adamw.beta1},
          {"beta2", c.adamw.beta2},
          {"eps", c.adamw.eps},
          {"grad_clip", c.grad_clip},
          {"tf32", c.tf32}};
}

std::vector<std::string> check_resume(const json& saved, const json& now, int64_t completed_steps,
                                      bool allow_schedule_change, const std::string& state_path) {
  std::vector<std::string> accepted, refused, schedule_changes;
  for (const auto& [key, value] : now.items()) {
    const json old = implied(saved, key);
    if (old == value) continue;
    std::string line = str(key, ": ", shown(old), " -> ", shown(value));
    if (key == "world_size") line += " (the same micro-batches per step, summed in another order)";
    if (kSafe.count(key)) {
      accepted.push_back(line);
    } else if (kSchedule.count(key)) {
      schedule_changes.push_back(line);
    } else {
      refused.push_back(line);
    }
  }
  for (const auto& [key, value] : saved.items()) {
    if (now.contains(key)) continue;
    const json implied_now = implied(now, key);
    if (implied_now == value) continue;
    std::string line = str(key, ": ", shown(value), " -> ", shown(implied_now));
    if (key == "world_size") line += " (the same micro-batches per step, summed in another order)";
    if (kSafe.count(key)) {
      accepted.push_back(line);
    } else {
      refused.push_back(line);
    }
  }
  if (!schedule_changes.empty() && refused.empty()) {
    const bool only_steps =
        schedule_changes.size() == 1 && schedule_changes.front().rfind("steps:", 0) == 0;
    if (only_steps && same_rates_so_far(saved, now, completed_steps)) {
      accepted.push_back(str(schedule_changes.front(), " (steps 1..", completed_steps,
                             " had the same learning rates: the run continues as one of ",
                             now.at("steps").get<int64_t>(), " steps)"));
    } else if (allow_schedule_change) {
      for (const std::string& line : schedule_changes)
        accepted.push_back(line + " (--allow-schedule-change: the resumed steps follow it)");
    } else {
      throw Error(
          str(state_path,
              ": --resume would change the learning-rate schedule of a run that already "
              "took ",
              completed_steps, " steps (", join(schedule_changes, ", "),
              "): the resumed run would not match an uninterrupted one. Resume with the saved "
              "values, train with --lr-schedule constant (extending --steps then keeps every "
              "learning rate), or pass --allow-schedule-change to continue on the new schedule"));
    }
  }
  if (!refused.empty()) {
    for (const std::string& line : schedule_changes) refused.push_back(line);
    throw Error(str(state_path,
                    ": written for a different run; --resume refuses what would "
                    "change its losses (saved -> now): ",
                    join(refused, ", "),
                    ". Safe to change: --attention, --device, --deterministic, --kernel-config, "
                    "--recompute, --classifier-chunk, the number of ranks and --zero, and --steps "
                    "under a schedule that keeps the "
                    "learning rates of the steps already run"));
  }
  return accepted;
}

}  // namespace ft::train

// The table `flashtrain train --profile` prints: one profiled step's time by op family
// (models/step_profile.h), each row beside its floor (DESIGN.md: FLOPs over the measured matrix
// rate, bytes over the measured bandwidth), and an "other (unattributed)" row for the step time
// outside every region (host gaps, allocations, what no region covers). bench/torch_peer.py
// --profile prints the same layout for PyTorch, row by row.
//
// Columns: region, calls, ms, % of the step, work, achieved rate, floor rate, floor ms (the
// work at the floor rate). Work is FLOP or bytes, rates FLOP/s or B/s, each with the SI prefix
// that fits it (1 GB = 1e9 bytes); a floor is left blank where none is known: on the CPU, for an
// unlisted GPU, for host and network transfers.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "models/step_profile.h"

namespace ft::train {

struct ProfileFloors {
  std::string source;                        // where the rates come from; "" when none is known
  std::optional<double> matrix_flop_per_s;   // products in the run's dtype (flop rows)
  std::optional<double> memory_bytes_per_s;  // device memory (bytes rows)
};

// The floors for a run on `device` (`gpu_name`: cuda_device_name of its GPU) in `dtype`; tf32:
// fp32 products on TF32 tensor cores, whose rate is not measured (no matrix floor then).
// Known: the H200 (docs/PERF.md, "Machines"); none for the CPU (not measured yet).
ProfileFloors profile_floors(Device device, const std::string& gpu_name, DType dtype, bool tf32);

struct ProfileRow {
  std::string region;
  int64_t calls = 0;  // 0 for the "other" and "step" rows
  double ms = 0.0, percent = 0.0;
  std::optional<models::WorkKind> kind;  // absent for "other" and "step"
  double work = 0.0;                     // FLOP or bytes
  std::optional<double> achieved_per_s, floor_per_s, floor_ms;
};

struct ProfileReport {
  int64_t step = 0;
  std::string run;  // "cuda (NVIDIA H200), bf16": what ran the step
  ProfileFloors floors;
  std::vector<ProfileRow> rows;  // the families that ran, in table order, then other, then step
};

ProfileReport make_profile_report(const models::StepProfile::Result& result, std::string run,
                                  ProfileFloors floors);
// The table, one line per row, with a heading line naming the step, the run and the floors.
std::string format_profile_table(const ProfileReport& report);
// {"event": "profile", "step", "run", "floors", "rows": [{"region", "calls", "ms", "percent",
// "work", "unit" ("flop" or "bytes"), "achieved_per_s", "floor_per_s", "floor_ms"}]}: SI units,
// null where a table cell is blank.
nlohmann::json to_json(const ProfileReport& report);

}  // namespace ft::train

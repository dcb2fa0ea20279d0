#include "models/step_profile.h"

#include <string>

#include "core/error.h"

namespace ft::models {
namespace {

// Indexed by OpFamily: the one place that names the rows.
constexpr std::array<OpFamilyInfo, kOpFamilyCount> kInfo = {{
    {"data", WorkKind::transfer},
    {"zero grad", WorkKind::bytes},
    {"embedding", WorkKind::bytes},
    {"norm", WorkKind::bytes},
    {"gemm qkv", WorkKind::flop},
    {"qkv split/merge", WorkKind::bytes},
    {"rope", WorkKind::bytes},
    {"attention forward", WorkKind::flop},
    {"attention backward", WorkKind::flop},
    {"gemm attn-out", WorkKind::flop},
    {"gemm mlp-up", WorkKind::flop},
    {"activation", WorkKind::bytes},
    {"gemm mlp-down", WorkKind::flop},
    {"gemm classifier", WorkKind::flop},
    {"classifier + loss", WorkKind::bytes},
    // Counted in FLOPs: the recomputed products (and attention) are most of its time.
    {"recompute", WorkKind::flop},
    {"all-reduce", WorkKind::transfer},
    {"optimizer", WorkKind::bytes},
}};

constexpr std::array<OpFamily, kOpFamilyCount> all_families() {
  std::array<OpFamily, kOpFamilyCount> all{};
  for (int i = 0; i < kOpFamilyCount; ++i) all[static_cast<size_t>(i)] = static_cast<OpFamily>(i);
  return all;
}

constexpr std::array<OpFamily, kOpFamilyCount> kFamilies = all_families();

size_t index(OpFamily family) {
  return static_cast<size_t>(family);
}

}  // namespace

const OpFamilyInfo& op_family_info(OpFamily family) {
  return kInfo[index(family)];
}

const std::array<OpFamily, kOpFamilyCount>& op_families() {
  return kFamilies;
}

StepProfile::StepProfile(Device device) : timer_(device) {}

void StepProfile::begin_step(int64_t step, bool record) {
  FT_ASSERT(!in_step_ && !open_);
  in_step_ = true;
  nvtx_push(("step " + std::to_string(step)).c_str());
  if (!record) return;
  timer_.clear();
  // Events for a few layers' worth of regions exist before the first mark: creating them
  // inside the step would add to its time.
  timer_.reserve(1024);
  regions_.clear();
  work_.fill(0.0);
  later_.clear();
  failed_ = false;
  step_ = step;
  recording_ = true;
  timer_.mark();  // mark 0: the step's start
}

void StepProfile::end_step() {
  FT_ASSERT(in_step_ && !open_);
  in_step_ = false;
  if (recording_) {
    step_end_ = timer_.mark();
    recording_ = false;
    recorded_ = true;
  }
  nvtx_pop();
}

// The row that work of `family` goes to, and how much of `work` it takes (all, or none when
// redirected to a row of another unit).
std::pair<OpFamily, double> StepProfile::target(OpFamily family, double work) const {
  if (!redirect_) return {family, work};
  const bool same_unit = op_family_info(family).work == op_family_info(*redirect_).work;
  return {*redirect_, same_unit ? work : 0.0};
}

void StepProfile::enter(OpFamily own_family, double own_work, const void* owner) {
  const auto [family, work] = target(own_family, own_work);
  FT_CHECK(!open_ || owner_ == owner, "profile regions must not nest: '",
           op_family_info(family).name, "' opened inside '", op_family_info(open_family_).name,
           "'");
  if (open_) nvtx_pop();
  nvtx_push(op_family_info(family).name);
  if (recording_) {
    // One mark ends the open region and begins the next.
    const size_t m = timer_.mark();
    if (open_) regions_.back().end = m;
    regions_.push_back({family, m, m});
    work_[index(family)] += work;
  }
  open_ = true;
  owner_ = owner;
  open_family_ = family;
}

void StepProfile::leave() noexcept {
  if (!open_) return;
  open_ = false;
  owner_ = nullptr;
  nvtx_pop();
  if (!recording_) return;
  try {
    regions_.back().end = timer_.mark();
  } catch (...) {
    failed_ = true;  // a device error; the next device call reports it
  }
}

void StepProfile::add_work_later(OpFamily family, std::function<double()> count) {
  if (!recording_) return;
  const auto [row, share] = target(family, 1.0);
  if (share == 0.0) return;
  later_.emplace_back(row, std::move(count));
}

StepProfile::Result StepProfile::result() {
  FT_CHECK(recorded_ && !failed_, "no step was profiled");
  const std::vector<double> t = timer_.times();
  std::array<Row, kOpFamilyCount> rows{};
  for (OpFamily f : kFamilies) rows[index(f)].family = f;
  for (const Region& r : regions_) {
    Row& row = rows[index(r.family)];
    ++row.calls;
    row.ms += t[r.end] - t[r.begin];
  }
  for (auto& [family, count] : later_) work_[index(family)] += count();
  later_.clear();
  Result result;
  result.step = step_;
  result.step_ms = t[step_end_];
  for (Row& row : rows) {
    if (row.calls == 0) continue;
    row.work = work_[index(row.family)];
    result.rows.push_back(row);
  }
  return result;
}

}  // namespace ft::models

#include "train/profile_report.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace ft::train {
namespace {

using models::WorkKind;

// GPUs whose ceilings the project measured (docs/PERF.md, "Machines"): cuBLAS bf16 8192^3 and
// the device-to-device copy by bench/gpu_ceilings.py; fp32 is true fp32 on CUDA cores, held
// against the datasheet's non-tensor rate as docs/PERF.md does.
struct KnownGpu {
  const char* name_part;  // found in cuda_device_name()
  double bf16_tflops, fp32_tflops, copy_gbps;
  const char* source;
};
constexpr KnownGpu kKnownGpus[] = {
    {"H200", 780.0, 67.0, 4270.0,
     "H200: cuBLAS bf16 780 TFLOP/s and device copy 4.27 TB/s (bench/gpu_ceilings.py), "
     "fp32 67 TFLOP/s (datasheet, CUDA cores)"},
};

constexpr const char* kOther = "other (unattributed)";

// Three significant digits without an exponent: 1230, 12.3, 0.0331.
std::string significant(double x) {
  if (x == 0.0 || !std::isfinite(x)) return x == 0.0 ? "0" : "-";
  const int magnitude = static_cast<int>(std::floor(std::log10(std::fabs(x))));
  const int decimals = std::max(0, 2 - magnitude);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

std::string fixed(double x, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, x);
  return buf;
}

// x in `unit` with the SI prefix that leaves 1 to 999 before the point (decimal: 1 GB = 1e9
// bytes), three significant digits: "604 MFLOP", "4.27 TB/s". A GPU step's rows and a CPU
// step's differ by a factor of a thousand or more; one fixed unit would not fit both.
std::string si(double x, const std::string& unit) {
  static const char* const kPrefixes[] = {"", "k", "M", "G", "T", "P", "E"};
  size_t p = 0;
  while (std::fabs(x) >= 999.5 && p + 1 < std::size(kPrefixes)) {
    x /= 1000.0;
    ++p;
  }
  return significant(x) + " " + kPrefixes[p] + unit;
}

std::string pad_left(const std::string& s, size_t width) {
  return s.size() >= width ? s : std::string(width - s.size(), ' ') + s;
}
std::string pad_right(const std::string& s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

nlohmann::json optional_json(const std::optional<double>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json();
}

}  // namespace

ProfileFloors profile_floors(Device device, const std::string& gpu_name, DType dtype, bool tf32) {
  if (device != Device::cuda) return {};
  for (const KnownGpu& gpu : kKnownGpus) {
    if (gpu_name.find(gpu.name_part) == std::string::npos) continue;
    ProfileFloors f;
    f.source = gpu.source;
    f.memory_bytes_per_s = gpu.copy_gbps * 1e9;
    if (dtype == DType::bf16) f.matrix_flop_per_s = gpu.bf16_tflops * 1e12;
    if (dtype == DType::f32 && !tf32) f.matrix_flop_per_s = gpu.fp32_tflops * 1e12;
    return f;
  }
  return {};
}

ProfileReport make_profile_report(const models::StepProfile::Result& result, std::string run,
                                  ProfileFloors floors) {
  ProfileReport report;
  report.step = result.step;
  report.run = std::move(run);
  report.floors = std::move(floors);
  const double step_ms = result.step_ms;
  auto percent = [&](double ms) { return step_ms > 0 ? 100.0 * ms / step_ms : 0.0; };
  double attributed = 0.0;
  for (const models::StepProfile::Row& r : result.rows) {
    const models::OpFamilyInfo& info = models::op_family_info(r.family);
    ProfileRow row;
    row.region = info.name;
    row.calls = r.calls;
    row.ms = r.ms;
    row.percent = percent(r.ms);
    row.kind = info.work;
    row.work = r.work;
    if (r.work > 0 && r.ms > 0) row.achieved_per_s = r.work / (r.ms / 1000.0);
    if (info.work == WorkKind::flop) row.floor_per_s = report.floors.matrix_flop_per_s;
    if (info.work == WorkKind::bytes) row.floor_per_s = report.floors.memory_bytes_per_s;
    if (row.floor_per_s && r.work > 0) row.floor_ms = 1000.0 * r.work / *row.floor_per_s;
    attributed += r.ms;
    report.rows.push_back(row);
  }
  // Marks of one stream are ordered, so the regions cannot add up to more than the step; the
  // clamp only hides the rounding of the event timestamps.
  const double other = std::max(0.0, step_ms - attributed);
  report.rows.push_back({kOther, 0, other, percent(other), {}, 0.0, {}, {}, {}});
  report.rows.push_back({"step", 0, step_ms, 100.0, {}, 0.0, {}, {}, {}});
  return report;
}

std::string format_profile_table(const ProfileReport& report) {
  std::ostringstream out;
  out << "step profile: step " << report.step << ", " << report.run
      << "; floors: " << (report.floors.source.empty() ? "none known here" : report.floors.source)
      << "\n";
  const size_t name_w = 22;
  out << pad_right("region", name_w) << pad_left("calls", 6) << pad_left("ms", 11)
      << pad_left("% step", 8) << pad_left("work", 15) << pad_left("achieved", 16)
      << pad_left("floor", 14) << pad_left("floor ms", 10) << "\n";
  for (const ProfileRow& row : report.rows) {
    const bool total = !row.kind.has_value();
    std::ostringstream line;
    line << pad_right(row.region, name_w) << pad_left(total ? "-" : std::to_string(row.calls), 6)
         << pad_left(fixed(row.ms, 3), 11) << pad_left(fixed(row.percent, 1) + "%", 8);
    if (!total) {
      const std::string unit = *row.kind == WorkKind::flop ? "FLOP" : "B";
      auto rate = [&](const std::optional<double>& r) {
        return r ? si(*r, unit + "/s") : std::string("-");
      };
      line << pad_left(row.work > 0 ? si(row.work, unit) : "-", 15)
           << pad_left(rate(row.achieved_per_s), 16) << pad_left(rate(row.floor_per_s), 14)
           << pad_left(row.floor_ms ? significant(*row.floor_ms) : "-", 10);
    }
    out << line.str() << "\n";
  }
  return out.str();
}

nlohmann::json to_json(const ProfileReport& report) {
  nlohmann::json rows = nlohmann::json::array();
  for (const ProfileRow& row : report.rows) {
    nlohmann::json r = {
        {"region", row.region}, {"calls", row.calls}, {"ms", row.ms}, {"percent", row.percent}};
    if (row.kind) {
      r["work"] = row.work;
      r["unit"] = *row.kind == WorkKind::flop ? "flop" : "bytes";
      r["achieved_per_s"] = optional_json(row.achieved_per_s);
      r["floor_per_s"] = optional_json(row.floor_per_s);
      r["floor_ms"] = optional_json(row.floor_ms);
    }
    rows.push_back(r);
  }
  return {{"event", "profile"},
          {"step", report.step},
          {"run", report.run},
          {"floors", report.floors.source},
          {"rows", rows}};
}

}  // namespace ft::train

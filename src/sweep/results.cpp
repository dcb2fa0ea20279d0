#include "sweep/results.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <sstream>

#include "core/atomic_file.h"

namespace ft::sweep {

using nlohmann::json;

namespace {

void write_file_atomically(const std::string& path, const std::string& text) {
  AtomicFile file(path);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace

// ---- timing summaries ----

namespace {

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

}  // namespace

DirectionTiming summarize_timing(const std::vector<std::vector<double>>& samples_per_round) {
  DirectionTiming t;
  std::vector<double> pooled;
  for (const std::vector<double>& round : samples_per_round) {
    if (round.empty()) continue;
    t.round_ms.push_back(quantile(round, 0.5));
    pooled.insert(pooled.end(), round.begin(), round.end());
  }
  if (pooled.empty()) return t;
  t.median_ms = quantile(pooled, 0.5);
  t.spread = t.median_ms > 0 ? (quantile(pooled, 0.75) - quantile(pooled, 0.25)) / t.median_ms : 0;
  return t;
}

double ConfigTiming::spread() const {
  const double total = total_ms();
  if (total <= 0) return 0.0;
  return (fwd.spread * fwd.median_ms + bwd.spread * bwd.median_ms) / total;
}

// ---- rows ----

const char* status_name(RowStatus status) {
  switch (status) {
    case RowStatus::planned:
      return "planned";
    case RowStatus::refused:
      return "refused";
    case RowStatus::error:
      return "error";
    case RowStatus::checked:
      return "checked";
  }
  return "?";
}

RowStatus parse_status(const std::string& text) {
  for (RowStatus s :
       {RowStatus::planned, RowStatus::refused, RowStatus::error, RowStatus::checked}) {
    if (text == status_name(s)) return s;
  }
  throw Error(str("sweep: unknown row status '", text, "'"));
}

bool SweepRow::passed() const {
  if (status != RowStatus::checked || checks.empty()) return false;
  return std::all_of(checks.begin(), checks.end(), [](const TensorCheck& c) { return c.passed(); });
}

double SweepRow::vs_ref() const {
  const double total = total_ms();
  return timed && total > 0 ? ref_timing.total_ms() / total : 0.0;
}

double SweepRow::tflops() const {
  const double total = total_ms();
  return timed && total > 0 ? flop / (total * 1e9) : 0.0;
}

std::string SweepRow::verdict() const {
  switch (status) {
    case RowStatus::planned:
      return "can run";
    case RowStatus::refused:
      return "refused: " + reason;
    case RowStatus::error:
      return "ERROR: " + reason;
    case RowStatus::checked:
      return checks.empty() ? "ERROR: no check result" : verdict_text(checks);
  }
  return "?";
}

// ---- JSON ----

namespace {

// JSON has no Inf or NaN: those travel as strings.
json number(double x) {
  if (std::isfinite(x)) return x;
  if (std::isnan(x)) return "nan";
  return x > 0 ? "inf" : "-inf";
}

double number_from(const json& j) {
  if (j.is_number()) return j.get<double>();
  if (j.is_string()) {
    const std::string s = j.get<std::string>();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  return std::numeric_limits<double>::quiet_NaN();
}

json direction_to_json(const DirectionTiming& t) {
  return {{"median_ms", t.median_ms}, {"spread", t.spread}, {"round_ms", t.round_ms}};
}

DirectionTiming direction_from_json(const json& j) {
  DirectionTiming t;
  t.median_ms = j.value("median_ms", 0.0);
  t.spread = j.value("spread", 0.0);
  t.round_ms = j.value("round_ms", std::vector<double>{});
  return t;
}

json timing_to_json(const ConfigTiming& t) {
  return {{"fwd", direction_to_json(t.fwd)}, {"bwd", direction_to_json(t.bwd)}};
}

ConfigTiming timing_from_json(const json& j) {
  ConfigTiming t;
  if (j.contains("fwd")) t.fwd = direction_from_json(j["fwd"]);
  if (j.contains("bwd")) t.bwd = direction_from_json(j["bwd"]);
  return t;
}

json check_to_json(const TensorCheck& c) {
  return {{"name", c.name},
          {"non_finite", c.non_finite},
          {"allclose_violations", c.allclose_violations},
          {"max_abs_diff", number(c.max_abs_diff)},
          {"relative_error", number(c.relative_error)},
          {"naive_relative_error", number(c.naive_relative_error)},
          {"allclose_ok", c.allclose_ok},
          {"naive_ok", c.naive_ok},
          {"passed", c.passed()}};
}

TensorCheck check_from_json(const json& j) {
  TensorCheck c;
  c.name = j.at("name").get<std::string>();
  c.non_finite = j.value("non_finite", int64_t{0});
  c.allclose_violations = j.value("allclose_violations", int64_t{0});
  c.max_abs_diff = number_from(j.at("max_abs_diff"));
  c.relative_error = number_from(j.at("relative_error"));
  c.naive_relative_error = number_from(j.at("naive_relative_error"));
  c.allclose_ok = j.value("allclose_ok", false);
  c.naive_ok = j.value("naive_ok", false);
  return c;
}

}  // namespace

json row_to_json(const SweepRow& r) {
  json checks = json::array();
  for (const TensorCheck& c : r.checks) checks.push_back(check_to_json(c));
  json j = {{"mask", r.mask},
            {"gpu", r.gpu},
            {"index", r.index},
            {"role", r.role},
            {"config", r.config.str()},
            {"fwd_tile", r.config.forward_str().substr(4)},
            {"bwd_tile", str(r.config.backward.block_m, "x", r.config.backward.block_n)},
            {"threads", r.config.backward.threads},
            {"path", attention::backward_path_name(r.config.backward_path)},
            {"status", status_name(r.status)},
            {"reason", r.reason},
            {"verdict", r.verdict()},
            {"passed", r.passed()},
            {"checks", checks},
            {"timed", r.timed},
            {"max_abs_diff", number(r.max_abs_diff)},
            {"flop", r.flop}};
  if (r.timed) {
    j["timing"] = timing_to_json(r.timing);
    j["ref_timing"] = timing_to_json(r.ref_timing);
    j["fwd_ms"] = r.timing.fwd.median_ms;
    j["bwd_ms"] = r.timing.bwd.median_ms;
    j["total_ms"] = r.total_ms();
    j["spread"] = r.timing.spread();
    j["ref_total_ms"] = r.ref_timing.total_ms();
    j["vs_ref"] = r.vs_ref();
    j["tflops"] = r.tflops();
  }
  return j;
}

SweepRow row_from_json(const json& j) {
  SweepRow r;
  r.mask = j.value("mask", std::string());
  r.gpu = j.value("gpu", 0);
  r.index = j.value("index", -1);
  r.role = j.value("role", std::string());
  r.config = attention::KernelConfig::parse(j.at("config").get<std::string>());
  r.status = parse_status(j.at("status").get<std::string>());
  r.reason = j.value("reason", std::string());
  for (const json& c : j.value("checks", json::array())) r.checks.push_back(check_from_json(c));
  r.timed = j.value("timed", false);
  if (r.timed) {
    r.timing = timing_from_json(j.at("timing"));
    r.ref_timing = timing_from_json(j.at("ref_timing"));
  }
  r.max_abs_diff = j.contains("max_abs_diff") ? number_from(j["max_abs_diff"])
                                              : std::numeric_limits<double>::quiet_NaN();
  r.flop = j.value("flop", 0.0);
  return r;
}

json header_to_json(const SweepHeader& h) {
  json gpus = json::array();
  for (const GpuFacts& g : h.gpus) {
    gpus.push_back({{"device", g.device},
                    {"name", g.name},
                    {"arch", g.arch},
                    {"compute_capability", g.compute_capability},
                    {"smem_per_block", g.smem_per_block},
                    {"sms", g.sms}});
  }
  json masks = json::array();
  for (const MaskFacts& m : h.masks) {
    masks.push_back(
        {{"key", m.key},
         {"description", m.description},
         {"attended_pairs", m.attended_pairs},
         {"check_window", m.check_window},
         {"fwd_flop", m.fwd_flop},
         {"bwd_flop", m.bwd_flop},
         {"default_config", m.default_config ? m.default_config->str() : h.base.str()}});
  }
  const SweepShape& s = h.shape;
  return {{"gpus", gpus},
          {"shape",
           {{"batch", s.batch},
            {"seq_len", s.seq_len},
            {"q_heads", s.q_heads},
            {"kv_heads", s.kv_heads},
            {"head_dim", s.head_dim},
            {"sliding_window", s.window},
            {"documents", s.documents},
            {"dtype", "bf16"}}},
          {"check_problem", {{"batch", kCheckBatch}, {"seq_len", kCheckSeqLen}}},
          {"base_config", h.base.str()},
          {"reference_config", h.reference.str()},
          {"axis", h.axis},
          {"paths", h.paths},
          {"sweep_kernels_compiled", h.sweep_kernels_compiled},
          {"warmup", h.warmup},
          {"iters", h.iters},
          {"rounds", h.rounds},
          {"dry_run", h.dry_run},
          {"masks", masks}};
}

void write_json(const std::string& path, const SweepHeader& header,
                const std::vector<SweepRow>& rows) {
  json out = {{"header", header_to_json(header)}, {"rows", json::array()}};
  for (const SweepRow& r : rows) out["rows"].push_back(row_to_json(r));
  write_file_atomically(path, out.dump(2) + "\n");
}

size_t write_kernel_config_file(const std::string& path, const SweepHeader& header,
                                const std::vector<SweepRow>& rows) {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", &utc);
  const json file = kernel_config_file_json(header, rows, date);
  write_file_atomically(path, file.dump(2) + "\n");
  return file["rows"].size();
}

// ---- CSV ----

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

std::string csv_text(const SweepHeader& header, const std::vector<SweepRow>& rows) {
  std::ostringstream os;
  const json h = header_to_json(header);
  for (const auto& [key, value] : h.items()) os << "# " << key << ": " << value.dump() << "\n";
  os << "mask,gpu,index,role,fwd_tile,bwd_tile,threads,path,config,fwd_ms,bwd_ms,total_ms,"
        "spread,vs_ref,tflops,max_abs_diff,verdict,passed,timed,status,reason\n";
  for (const SweepRow& r : rows) {
    const bool t = r.timed;
    os << csv_field(r.mask) << "," << r.gpu << "," << r.index << "," << r.role << ","
       << r.config.forward_str().substr(4) << "," << r.config.backward.block_m << "x"
       << r.config.backward.block_n << "," << r.config.backward.threads << ","
       << attention::backward_path_name(r.config.backward_path) << "," << csv_field(r.config.str())
       << "," << (t ? fixed(r.timing.fwd.median_ms, 4) : "") << ","
       << (t ? fixed(r.timing.bwd.median_ms, 4) : "") << "," << (t ? fixed(r.total_ms(), 4) : "")
       << "," << (t ? fixed(r.timing.spread(), 4) : "") << "," << (t ? fixed(r.vs_ref(), 4) : "")
       << "," << (t ? fixed(r.tflops(), 2) : "") << ","
       << (std::isnan(r.max_abs_diff) ? "" : sci(r.max_abs_diff)) << "," << csv_field(r.verdict())
       << "," << (r.passed() ? 1 : 0) << "," << (t ? 1 : 0) << "," << status_name(r.status) << ","
       << csv_field(r.reason) << "\n";
  }
  return os.str();
}

void write_csv(const std::string& path, const SweepHeader& header,
               const std::vector<SweepRow>& rows) {
  write_file_atomically(path, csv_text(header, rows));
}

}  // namespace ft::sweep

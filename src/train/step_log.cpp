#include "train/step_log.h"

#include <cstdio>

#include "core/error.h"

namespace ft::train {

namespace {

// h:mm:ss
std::string clock_time(double seconds) {
  const auto s = static_cast<long long>(seconds < 0 ? 0 : seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

}  // namespace

std::string format_step_line(const StepRecord& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %4lld/%lld | train loss %.6f | lr %.2e | (%.2f ms | %.0f tok/s | "
                "peak used: %5.0f MB | peak reserved: %5.0f MB)",
                static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.train_loss,
                r.lr, r.ms, r.tokens_per_second, r.peak_used_mb, r.peak_reserved_mb);
  std::string line = buf;
  if (r.elapsed_s) line += " | elapsed " + clock_time(*r.elapsed_s);
  if (r.eta_s) line += " | eta " + clock_time(*r.eta_s);
  if (r.tokens_seen > 0) line += " | " + std::to_string(r.tokens_seen) + " tokens";
  return line;
}

nlohmann::json to_json(const StepRecord& r) {
  nlohmann::json j = {{"step", r.step},
                      {"steps", r.total_steps},
                      {"train_loss", r.train_loss},
                      {"lr", r.lr},
                      {"ms", r.ms},
                      {"tok_per_s", r.tokens_per_second},
                      {"grad_norm", r.grad_norm},
                      {"peak_used_mb", r.peak_used_mb},
                      {"peak_reserved_mb", r.peak_reserved_mb},
                      {"attention_saved_mb", r.attention_saved_mb},
                      {"activations_saved_mb", r.activations_saved_mb}};
  if (r.val_loss) j["val_loss"] = *r.val_loss;
  if (r.elapsed_s) j["elapsed_s"] = *r.elapsed_s;
  if (r.eta_s) j["eta_s"] = *r.eta_s;
  if (r.tokens_seen > 0) j["tokens_seen"] = r.tokens_seen;
  if (!r.ranks.empty()) {
    j["world_size"] = r.ranks.size();
    for (const RankRecord& k : r.ranks) {
      j["ranks"].push_back({{"ms", k.ms},
                            {"tok_per_s", k.tokens_per_second},
                            {"peak_used_mb", k.peak_used_mb},
                            {"peak_reserved_mb", k.peak_reserved_mb}});
    }
  }
  return j;
}

JsonLog::JsonLog(const std::string& path, bool append) {
  // A log cut mid-line (a killed run) gets its line ended before anything is appended.
  bool ends_mid_line = false;
  if (append) {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    if (in && in.tellg() > 0) {
      in.seekg(-1, std::ios::end);
      ends_mid_line = in.get() != '\n';
    }
  }
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  FT_CHECK(out_.is_open(), "cannot write log file ", path);
  if (ends_mid_line) out_ << '\n';
}

void JsonLog::write(const nlohmann::json& line) {
  if (!out_.is_open()) return;
  out_ << line.dump() << '\n';
  out_.flush();
}

}  // namespace ft::train

#include "train/step_log.h"

#include <cstdio>

#include "core/error.h"

namespace ft::train {

std::string format_step_line(const StepRecord& r) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %4lld/%lld | train loss %.6f | lr %.2e | (%.2f ms | %.0f tok/s | "
                "peak used: %5.0f MB | peak reserved: %5.0f MB)",
                static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.train_loss,
                r.lr, r.ms, r.tokens_per_second, r.peak_used_mb, r.peak_reserved_mb);
  return buf;
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
                      {"attention_saved_mb", r.attention_saved_mb}};
  if (r.val_loss) j["val_loss"] = *r.val_loss;
  return j;
}

JsonLog::JsonLog(const std::string& path) : out_(path, std::ios::trunc) {
  FT_CHECK(out_.is_open(), "cannot write log file ", path);
}

void JsonLog::write(const nlohmann::json& line) {
  if (!out_.is_open()) return;
  out_ << line.dump() << '\n';
  out_.flush();
}

}  // namespace ft::train

// Learning-rate schedule: linear warm-up, then either cosine decay to min_lr_fraction * peak over
// the rest of total_steps, or a constant peak. The constant schedule does not depend on
// total_steps, so a run that is resumed with more --steps continues exactly as a longer run
// would have; cosine decay does (see train/run_record.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace ft::train {

enum class LrDecay { cosine, constant };

inline const char* lr_decay_name(LrDecay d) {
  return d == LrDecay::cosine ? "cosine" : "constant";
}

inline LrDecay parse_lr_decay(const std::string& s) {
  if (s == "cosine") return LrDecay::cosine;
  if (s == "constant") return LrDecay::constant;
  throw Error(str("unknown learning-rate schedule '", s, "' (allowed: cosine, constant)"));
}

struct LrSchedule {
  double peak = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_fraction = 0.0;
  LrDecay decay = LrDecay::cosine;

  // step is 1-based: the first optimizer update uses lr(1).
  double lr(int64_t step) const {
    if (warmup_steps > 0 && step <= warmup_steps) {
      return peak * static_cast<double>(step) / static_cast<double>(warmup_steps);
    }
    if (decay == LrDecay::constant) return peak;
    const int64_t decay_steps = total_steps - warmup_steps;
    if (decay_steps <= 0) return peak;
    double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps);
    progress = std::fmin(std::fmax(progress, 0.0), 1.0);
    const double min_lr = peak * min_lr_fraction;
    return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (peak - min_lr);
  }
};

}  // namespace ft::train

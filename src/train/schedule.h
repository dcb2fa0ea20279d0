// Learning-rate schedule: linear warm-up, then cosine decay to min_lr_fraction * peak.
#pragma once

#include <cmath>
#include <cstdint>

namespace ft::train {

struct LrSchedule {
  double peak = 1e-3;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_fraction = 0.0;

  // step is 1-based: the first optimizer update uses lr(1).
  double lr(int64_t step) const {
    if (warmup_steps > 0 && step <= warmup_steps) {
      return peak * static_cast<double>(step) / static_cast<double>(warmup_steps);
    }
    const int64_t decay_steps = total_steps - warmup_steps;
    if (decay_steps <= 0) return peak;
    double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps);
    progress = std::fmin(std::fmax(progress, 0.0), 1.0);
    const double min_lr = peak * min_lr_fraction;
    return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (peak - min_lr);
  }
};

}  // namespace ft::train

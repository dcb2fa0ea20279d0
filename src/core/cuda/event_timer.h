// CUDA events around timed calls on the current stream: start(i) / stop(i) bracket call i,
// elapsed_ms() waits for the last and returns every call's time. The benchmarks' and the
// sweep's one timer.
#pragma once

#include <cuda_runtime.h>

#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace ft::cuda {

class EventTimer {
 public:
  explicit EventTimer(int calls) : start_(calls), stop_(calls) {
    for (int i = 0; i < calls; ++i) {
      FT_CUDA_CHECK(cudaEventCreate(&start_[i]));
      FT_CUDA_CHECK(cudaEventCreate(&stop_[i]));
    }
  }
  ~EventTimer() {
    for (size_t i = 0; i < start_.size(); ++i) {
      cudaEventDestroy(start_[i]);
      cudaEventDestroy(stop_[i]);
    }
  }
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;

  void start(int i) { FT_CUDA_CHECK(cudaEventRecord(start_[i], current_stream())); }
  void stop(int i) { FT_CUDA_CHECK(cudaEventRecord(stop_[i], current_stream())); }
  std::vector<double> elapsed_ms() const {
    FT_CUDA_CHECK(cudaEventSynchronize(stop_.back()));
    std::vector<double> ms;
    for (size_t i = 0; i < start_.size(); ++i) {
      float t = 0;
      FT_CUDA_CHECK(cudaEventElapsedTime(&t, start_[i], stop_[i]));
      ms.push_back(t);
    }
    return ms;
  }

 private:
  std::vector<cudaEvent_t> start_, stop_;
};

}  // namespace ft::cuda

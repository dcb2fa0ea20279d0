#include "core/mark_timer.h"

#include "core/error.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include <nvtx3/nvToolsExt.h>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#endif

namespace ft {

MarkTimer::MarkTimer(Device device) : device_(device) {
#ifndef FLASHTRAIN_WITH_CUDA
  FT_CHECK(device == Device::cpu, "timing marks on ", device_name(device),
           " need a flashtrain built with CUDA");
#endif
}

MarkTimer::~MarkTimer() {
#ifdef FLASHTRAIN_WITH_CUDA
  for (CUevent_st* e : events_) cudaEventDestroy(e);
#endif
}

void MarkTimer::clear() {
  count_ = 0;
  host_.clear();
}

void MarkTimer::reserve(size_t marks) {
  if (device_ == Device::cpu) {
    host_.reserve(marks);
    return;
  }
#ifdef FLASHTRAIN_WITH_CUDA
  while (events_.size() < marks) {
    cudaEvent_t e = nullptr;
    FT_CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
#endif
}

size_t MarkTimer::mark() {
  if (device_ == Device::cpu) {
    host_.push_back(std::chrono::steady_clock::now());
    return count_++;
  }
#ifdef FLASHTRAIN_WITH_CUDA
  if (count_ == events_.size()) reserve(2 * count_ + 64);
  FT_CUDA_CHECK(cudaEventRecord(events_[count_], cuda::current_stream()));
#endif
  return count_++;
}

std::vector<double> MarkTimer::times() const {
  std::vector<double> ms(count_, 0.0);
  if (count_ == 0) return ms;
  if (device_ == Device::cpu) {
    for (size_t i = 0; i < count_; ++i)
      ms[i] = std::chrono::duration<double, std::milli>(host_[i] - host_[0]).count();
    return ms;
  }
#ifdef FLASHTRAIN_WITH_CUDA
  FT_CUDA_CHECK(cudaEventSynchronize(events_[count_ - 1]));
  for (size_t i = 1; i < count_; ++i) {
    float t = 0.0f;
    FT_CUDA_CHECK(cudaEventElapsedTime(&t, events_[0], events_[i]));
    ms[i] = t;
  }
#endif
  return ms;
}

#ifdef FLASHTRAIN_WITH_CUDA
void nvtx_push(const char* name) {
  nvtxRangePushA(name);
}
void nvtx_pop() {
  nvtxRangePop();
}
#else
void nvtx_push(const char*) {}
void nvtx_pop() {}
#endif

}  // namespace ft

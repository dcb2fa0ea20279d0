// Time marks in the order of a device's work, for profiling whole steps without stopping them:
// on a CUDA device each mark is an event recorded on the current stream (nothing waits for it
// until times() is asked for), on the CPU a steady_clock reading (CPU work is synchronous, so
// no wait is needed either). The time between two marks is then what the stream (or the host)
// spent between them, idle gaps included.
//
// NVTX ranges (nvtx_push / nvtx_pop) name the same stretches for Nsight Systems; they are
// no-ops without a CUDA build, and cost a call through an empty function pointer when no tool
// is attached.
#pragma once

#include <chrono>
#include <vector>

#include "core/dtype.h"

struct CUevent_st;  // cudaEvent_t, without the CUDA headers

namespace ft {

class MarkTimer {
 public:
  // device: Device::cuda needs a CUDA build and uses the current GPU and stream.
  explicit MarkTimer(Device device);
  ~MarkTimer();
  MarkTimer(const MarkTimer&) = delete;
  MarkTimer& operator=(const MarkTimer&) = delete;

  // Forgets the marks; the events stay for reuse.
  void clear();
  // Creates events for `marks` marks now, so that a timed stretch does not pay for creating them.
  void reserve(size_t marks);
  // Records a mark; returns its index (0, 1, ... since clear()).
  size_t mark();
  size_t marks() const { return count_; }
  // Milliseconds of each mark after mark 0 (waits for the last mark on a device).
  std::vector<double> times() const;

 private:
  Device device_;
  size_t count_ = 0;
  std::vector<std::chrono::steady_clock::time_point> host_;
  std::vector<CUevent_st*> events_;  // a pool: the first count_ hold this round's marks
};

// A named range on the calling thread's NVTX stack (CUDA builds; otherwise nothing).
void nvtx_push(const char* name);
void nvtx_pop();

}  // namespace ft

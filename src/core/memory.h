// Memory accounting per device. Every tensor buffer is allocated through allocate_bytes(), so
// the counters see all of it. On the CPU "reserved" equals "used"; a device backend whose
// allocator keeps a pool reports its own reserved bytes through set_reserved_hook().
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "core/dtype.h"

namespace ft {

struct MemoryStats {
  int64_t used_bytes = 0;           // live bytes now
  int64_t peak_used_bytes = 0;      // high-water mark of used since the last reset
  int64_t peak_reserved_bytes = 0;  // high-water mark of reserved since the last reset
};

void* allocate_bytes(Device device, size_t nbytes);
void free_bytes(Device device, void* ptr, size_t nbytes);

MemoryStats memory_stats(Device device);
void reset_peak_memory(Device device);  // peaks restart from the current usage
// Host memory for tensors that the GPU copies from (Tensor::empty_pinned): page-locked where a
// CUDA backend is registered (its copies are truly asynchronous, and a captured CUDA graph reads
// it at every replay), else ordinary host memory; page_locked says which, for the free. Counted
// as CPU memory.
void* allocate_pinned_bytes(size_t nbytes, bool& page_locked);
void free_pinned_bytes(void* ptr, size_t nbytes, bool page_locked);
// Gives the device allocator's free reserve back to the driver (a no-op on the CPU).
void release_cached_memory(Device device);

// Device backends (CUDA) register how they allocate, free and report reserved memory.
struct DeviceAllocator {
  std::function<void*(size_t)> allocate;
  std::function<void(void*)> free;
  std::function<int64_t()> peak_used;      // since the last reset (the pool's own mark)
  std::function<int64_t()> peak_reserved;  // since the last reset
  std::function<void()> reset_peak;
  std::function<void*(size_t)> allocate_pinned;  // page-locked host memory
  std::function<void(void*)> free_pinned;
  std::function<void()> release_cached;
};
void register_device_allocator(Device device, DeviceAllocator allocator);
bool has_device_allocator(Device device);
// The allocator registered for `device` (a copy; empty functions where none is), e.g. to wrap it
// and register the wrapper, which then hands it what it did not allocate itself.
DeviceAllocator device_allocator(Device device);

}  // namespace ft

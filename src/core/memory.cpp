#include "core/memory.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <mutex>
#include <new>

#include "core/error.h"

namespace ft {
namespace {

constexpr size_t kCpuAlignment = 64;

struct DeviceState {
  std::mutex mutex;
  MemoryStats stats;
  DeviceAllocator allocator;
  bool has_allocator = false;
};

DeviceState& state(Device device) {
  static std::array<DeviceState, 2> states;
  return states[static_cast<size_t>(device)];
}

}  // namespace

void register_device_allocator(Device device, DeviceAllocator allocator) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.allocator = std::move(allocator);
  s.has_allocator = true;
}

DeviceAllocator device_allocator(Device device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.allocator;
}

bool has_device_allocator(Device device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  return device == Device::cpu || s.has_allocator;
}

void* allocate_bytes(Device device, size_t nbytes) {
  DeviceState& s = state(device);
  void* ptr = nullptr;
  if (device == Device::cpu) {
    const size_t rounded =
        (std::max<size_t>(nbytes, 1) + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    ptr = std::aligned_alloc(kCpuAlignment, rounded);
    if (ptr == nullptr) {
      throw OutOfMemory(str("out of host memory: could not allocate ", nbytes, " bytes"));
    }
  } else {
    FT_CHECK(s.has_allocator, "no allocator registered for device ", device_name(device),
             " (was flashtrain built with CUDA?)");
    ptr = s.allocator.allocate(nbytes);
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.used_bytes += static_cast<int64_t>(nbytes);
  s.stats.peak_used_bytes = std::max(s.stats.peak_used_bytes, s.stats.used_bytes);
  if (device == Device::cpu) {
    s.stats.peak_reserved_bytes = std::max(s.stats.peak_reserved_bytes, s.stats.used_bytes);
  }
  return ptr;
}

void free_bytes(Device device, void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  DeviceState& s = state(device);
  if (device == Device::cpu) {
    std::free(ptr);
  } else {
    s.allocator.free(ptr);
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.used_bytes -= static_cast<int64_t>(nbytes);
}

namespace {

// The CUDA backend's page-locked allocator, when one is registered.
DeviceState* pinned_provider() {
  DeviceState& s = state(Device::cuda);
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.has_allocator && s.allocator.allocate_pinned ? &s : nullptr;
}

}  // namespace

void* allocate_pinned_bytes(size_t nbytes, bool& page_locked) {
  DeviceState* cuda = pinned_provider();
  page_locked = cuda != nullptr;
  if (!page_locked) return allocate_bytes(Device::cpu, nbytes);
  void* ptr = cuda->allocator.allocate_pinned(nbytes);
  DeviceState& s = state(Device::cpu);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.used_bytes += static_cast<int64_t>(nbytes);
  s.stats.peak_used_bytes = std::max(s.stats.peak_used_bytes, s.stats.used_bytes);
  s.stats.peak_reserved_bytes = std::max(s.stats.peak_reserved_bytes, s.stats.used_bytes);
  return ptr;
}

void free_pinned_bytes(void* ptr, size_t nbytes, bool page_locked) {
  if (ptr == nullptr) return;
  if (!page_locked) return free_bytes(Device::cpu, ptr, nbytes);
  state(Device::cuda).allocator.free_pinned(ptr);
  DeviceState& s = state(Device::cpu);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.used_bytes -= static_cast<int64_t>(nbytes);
}

void release_cached_memory(Device device) {
  if (device == Device::cpu) return;
  DeviceState& s = state(device);
  std::function<void()> release;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.has_allocator) release = s.allocator.release_cached;
  }
  if (release) release();
}

MemoryStats memory_stats(Device device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  MemoryStats out = s.stats;
  if (device != Device::cpu && s.has_allocator && s.allocator.peak_reserved) {
    out.peak_reserved_bytes = s.allocator.peak_reserved();
  }
  if (device != Device::cpu && s.has_allocator && s.allocator.peak_used) {
    out.peak_used_bytes = s.allocator.peak_used();
  }
  return out;
}

void reset_peak_memory(Device device) {
  DeviceState& s = state(device);
  std::lock_guard<std::mutex> lock(s.mutex);
  s.stats.peak_used_bytes = s.stats.used_bytes;
  s.stats.peak_reserved_bytes = s.stats.used_bytes;
  if (device != Device::cpu && s.has_allocator && s.allocator.reset_peak) s.allocator.reset_peak();
}

}  // namespace ft

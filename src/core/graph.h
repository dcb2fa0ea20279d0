// Device work recorded once and replayed: CUDA graphs (core/cuda/graph.h says what a capture
// records and what a replay sees) behind a device-neutral face, so that code built without CUDA
// compiles the same and gets a clear error.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "core/dtype.h"

namespace ft {

class DeviceGraph {
 public:
  DeviceGraph() = default;
  // Records the work `work` queues on `device` (the GPU only; nothing runs yet).
  static DeviceGraph capture(Device device, const std::function<void()>& work);
  bool captured() const { return impl_ != nullptr; }
  void replay() const;  // queues the recorded work again
  size_t node_count() const;

 private:
  std::shared_ptr<void> impl_;
};

// Why graphs cannot be used on `device` in this build ("" when they can).
std::string device_graph_unavailable(Device device);

}  // namespace ft

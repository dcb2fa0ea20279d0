#include "core/graph.h"

#include "core/device.h"
#include "core/error.h"
#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/graph.h"
#endif

namespace ft {

std::string device_graph_unavailable(Device device) {
  if (device != Device::cuda)
    return str("graphs replay GPU work; this runs on ", device_name(device));
  if (!cuda_training_supported()) return cuda_unavailable_reason();
  return "";
}

#ifdef FLASHTRAIN_WITH_CUDA

DeviceGraph DeviceGraph::capture(Device device, const std::function<void()>& work) {
  const std::string why = device_graph_unavailable(device);
  FT_CHECK(why.empty(), "cannot capture a device graph: ", why);
  DeviceGraph g;
  g.impl_ = std::make_shared<cuda::Graph>(cuda::Graph::capture(work));
  return g;
}

void DeviceGraph::replay() const {
  FT_CHECK(impl_ != nullptr, "replaying a device graph that was never captured");
  static_cast<const cuda::Graph*>(impl_.get())->replay();
}

size_t DeviceGraph::node_count() const {
  return impl_ ? static_cast<const cuda::Graph*>(impl_.get())->node_count() : 0;
}

#else

DeviceGraph DeviceGraph::capture(Device device, const std::function<void()>&) {
  throw Error(str("cannot capture a device graph: ", device_graph_unavailable(device)));
}

void DeviceGraph::replay() const {
  throw Error("replaying a device graph that was never captured");
}

size_t DeviceGraph::node_count() const {
  return 0;
}

#endif

}  // namespace ft

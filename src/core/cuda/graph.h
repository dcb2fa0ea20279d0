// CUDA graphs: the device work that a piece of host code queues, recorded once and replayed
// without the host (one launch instead of hundreds, no gaps between kernels).
//
// What a capture records and what a replay sees:
// - Kernels, memsets and device copies, with the arguments they had: a replay runs exactly that
//   work again, bit for bit, whatever the host's objects hold by then.
// - Device memory allocated by the work becomes the graph's own, at addresses fixed for the
//   graph's life: tensors the work created and kept (losses, the model's saved activations)
//   point at what every replay writes. A replay first frees what the last one left allocated.
//   Memory from before the capture that the work lets go of is freed when the capture ends.
// - Host-to-device copies from page-locked memory (Tensor::empty_pinned) read that memory when
//   they run, at every replay: they are the graph's inputs, which the host rewrites between
//   replays (after the last replay that read them has finished). A copy from pageable memory is
//   refused, since the buffer would be gone by the replay; a table that is a constant of the
//   work (pointers and sizes) is uploaded with upload_constant, whose bytes the graph keeps.
// - The host reading the device (a device-to-host copy, a synchronisation) is an error: nothing
//   has run yet during a capture.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace ft::cuda {

class Graph {
 public:
  Graph() = default;
  // Runs `work` once with current_stream() capturing into a new graph: nothing runs on the GPU
  // yet. An exception thrown by `work` (or a capture the driver refuses) ends the capture and
  // propagates; tensors the work created are then invalid, so the caller should stop.
  static Graph capture(const std::function<void()>& work);

  Graph(Graph&& other) noexcept;
  Graph& operator=(Graph&& other) noexcept;
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  ~Graph();

  bool captured() const { return exec_ != nullptr; }
  // Queues the recorded work on current_stream(), which must be the stream that was current
  // when the work was captured.
  void replay() const;
  // Kernels, copies, memsets and memory nodes in the graph.
  size_t node_count() const { return nodes_; }

 private:
  cudaGraphExec_t exec_ = nullptr;
  cudaStream_t stream_ = nullptr;  // current when captured: the replays' stream
  size_t nodes_ = 0;
  std::vector<void*> constants_;  // page-locked copies of upload_constant's tables
};

// True while this thread's current stream is being captured.
bool capturing();

// The stream the work being queued will run on: during a capture the stream the graph replays
// on (per-stream resources, such as cuBLASLt's workspace, follow it, so the graph uses those
// of its replay stream and makes none of its own), else current_stream().
cudaStream_t execution_stream();

// Copies nbytes of host memory to the device on current_stream(): a table that is a constant of
// the work being queued (device pointers, sizes). The host buffer may go once this returns.
// Inside a capture its bytes go to page-locked memory that the graph keeps and copies from at
// every replay.
void upload_constant(void* dst, const void* src, size_t nbytes);

}  // namespace ft::cuda

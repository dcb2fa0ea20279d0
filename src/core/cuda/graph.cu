#include "core/cuda/graph.h"

#include <cstring>
#include <mutex>
#include <unordered_set>
#include <utility>

#include "core/cuda/capture_state.h"
#include "core/cuda/check.h"
#include "core/cuda/runtime.h"

namespace ft::cuda {
namespace {

thread_local CaptureState* t_capture = nullptr;

std::mutex g_failed_mutex;
std::unordered_set<void*> g_failed_allocations;

// What a failed capture leaves behind: its page-locked constants go, the memory from before it
// that it released is freed after all, and its own allocations are forgotten.
void clean_up_failed_capture(CaptureState& state, cudaStream_t outer) {
  for (void* p : state.constants) cudaFreeHost(p);
  for (void* p : state.deferred_frees) cudaFreeAsync(p, outer);
  forget_failed_capture(state.allocated);
}

// Ends a capture that failed, dropping the partial graph (the work's own error is the one
// reported).
void abandon_capture(cudaStream_t stream) {
  cudaGraph_t partial = nullptr;
  cudaStreamEndCapture(stream, &partial);
  if (partial != nullptr) cudaGraphDestroy(partial);
  cudaGetLastError();  // a refused capture leaves its error pending
}

}  // namespace

CaptureState* capture_state() {
  return t_capture;
}

bool capturing() {
  return t_capture != nullptr;
}

void forget_failed_capture(const std::unordered_set<void*>& allocated) {
  std::lock_guard<std::mutex> lock(g_failed_mutex);
  g_failed_allocations.insert(allocated.begin(), allocated.end());
}

bool release_failed_capture_memory(void* ptr) {
  std::lock_guard<std::mutex> lock(g_failed_mutex);
  return g_failed_allocations.erase(ptr) > 0;
}

cudaStream_t execution_stream() {
  return t_capture != nullptr ? t_capture->origin : current_stream();
}

void* allocate_pinned(size_t nbytes) {
  void* ptr = nullptr;
  FT_CUDA_CHECK(cudaHostAlloc(&ptr, nbytes == 0 ? 1 : nbytes, cudaHostAllocDefault));
  return ptr;
}

void free_pinned(void* ptr) {
  if (ptr != nullptr) FT_CUDA_CHECK(cudaFreeHost(ptr));
}

bool is_pinned(const void* ptr) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeHost;
}

void upload_constant(void* dst, const void* src, size_t nbytes) {
  if (nbytes == 0) return;
  const void* from = src;
  if (CaptureState* state = capture_state()) {
    void* kept = allocate_pinned(nbytes);
    std::memcpy(kept, src, nbytes);
    state->constants.push_back(kept);
    from = kept;
  }
  FT_CUDA_CHECK(cudaMemcpyAsync(dst, from, nbytes, cudaMemcpyHostToDevice, current_stream()));
}

Graph Graph::capture(const std::function<void()>& work) {
  FT_CHECK(t_capture == nullptr, "CUDA graph captures do not nest");
  cudaStream_t stream = nullptr;
  FT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CaptureState state;
  const cudaStream_t outer = current_stream();
  state.origin = outer;
  cudaGraph_t graph = nullptr;
  {
    StreamScope scope(stream);
    // Relaxed: the work may call the runtime's non-stream functions (page-locked allocations,
    // kernel attributes); what would read the device is refused by the copies themselves.
    FT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    t_capture = &state;
    try {
      work();
    } catch (...) {
      t_capture = nullptr;
      abandon_capture(stream);
      cudaStreamDestroy(stream);
      clean_up_failed_capture(state, outer);
      throw;
    }
    t_capture = nullptr;
    const cudaError_t err = cudaStreamEndCapture(stream, &graph);
    if (err != cudaSuccess) {
      cudaGetLastError();
      cudaStreamDestroy(stream);
      clean_up_failed_capture(state, outer);
      throw Error(str("capturing the step into a CUDA graph failed: ", cudaGetErrorString(err),
                      " (some call in it cannot be captured; run without the graph)"));
    }
  }
  FT_CUDA_CHECK(cudaStreamDestroy(stream));
  // Memory from before the capture that the work let go of: freed now, in stream order.
  for (void* p : state.deferred_frees) FT_CUDA_CHECK(cudaFreeAsync(p, outer));
  Graph g;
  g.stream_ = outer;
  g.constants_ = std::move(state.constants);
  FT_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &g.nodes_));
  // Auto-free: what a replay left allocated (tensors the host still holds) is freed when the
  // next one starts, which allocates it again at the same address.
  const cudaError_t err =
      cudaGraphInstantiateWithFlags(&g.exec_, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
  cudaGraphDestroy(graph);
  FT_CUDA_CHECK(err);
  return g;
}

Graph::Graph(Graph&& other) noexcept
    : exec_(std::exchange(other.exec_, nullptr)),
      stream_(other.stream_),
      nodes_(other.nodes_),
      constants_(std::move(other.constants_)) {}

Graph& Graph::operator=(Graph&& other) noexcept {
  std::swap(exec_, other.exec_);  // other's destructor releases what this held
  std::swap(stream_, other.stream_);
  std::swap(nodes_, other.nodes_);
  constants_.swap(other.constants_);
  return *this;
}

Graph::~Graph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
  exec_ = nullptr;
  for (void* p : constants_) cudaFreeHost(p);
  constants_.clear();
}

void Graph::replay() const {
  FT_CHECK(exec_ != nullptr, "replaying a CUDA graph that was never captured");
  FT_CHECK(current_stream() == stream_,
           "a CUDA graph replays on the stream that was current when it was captured (its "
           "per-stream resources, such as cuBLASLt's workspace, belong to that stream)");
  FT_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
}

}  // namespace ft::cuda

// The NCCL communicator: GPU tensors reduced, scattered and gathered by NCCL on a communication
// stream of its own, so that the buckets of a backward travel while the backward goes on.
//
// Each collective first makes the communication stream wait for an event recorded on the
// compute stream (the tensor is complete there), then queues the NCCL call; wait() records an
// event on the communication stream and polls it, checking NCCL's asynchronous error state
// (a peer that died, a network failure) and the timeout, then makes the compute stream wait
// for it. A failure or a timeout aborts the NCCL communicator (its kernels stop spinning) and
// throws, naming the rank; the caller then ends the job (MPI_Abort).
//
// The bootstrap: rank 0 makes the NCCL unique id, MPI broadcasts it, every rank joins. NCCL
// is opened at run time (libnccl.so.2; FLASHTRAIN_NCCL_LIBRARY names another file), typed
// from nccl.h, so a build carried to a GPU machine without NCCL still trains on one GPU.
#include <memory>

#include "core/error.h"
#include "dist/backends.h"

#if defined(FLASHTRAIN_WITH_CUDA) && defined(FLASHTRAIN_WITH_NCCL)
#include <dlfcn.h>
#include <nccl.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "core/cuda/check.h"
#include "core/cuda/runtime.h"
#include "core/device.h"
#endif

namespace ft::dist {

#if defined(FLASHTRAIN_WITH_CUDA) && defined(FLASHTRAIN_WITH_NCCL)
namespace {

// clang-format off
#define FT_NCCL_FUNCTIONS(X)                                                         \
  X(GetVersion) X(GetUniqueId) X(CommInitRank) X(CommDestroy) X(CommAbort)           \
  X(CommGetAsyncError) X(GetErrorString) X(GetLastError) X(AllReduce)                \
  X(ReduceScatter) X(AllGather)
// clang-format on

struct NcclLibrary {
#define FT_NCCL_MEMBER(name) decltype(&::nccl##name) name = nullptr;
  FT_NCCL_FUNCTIONS(FT_NCCL_MEMBER)
#undef FT_NCCL_MEMBER
  std::string path;
};

const NcclLibrary& nccl_library() {
  static std::once_flag once;
  static NcclLibrary lib;
  std::call_once(once, [] {
    const char* env = std::getenv("FLASHTRAIN_NCCL_LIBRARY");
    lib.path = env != nullptr && *env != '\0' ? env : "libnccl.so.2";
    void* handle = ::dlopen(lib.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = ::dlerror();
      throw Error(str("cannot load NCCL (", lib.path, "): ", why ? why : "unknown error",
                      ". It comes with the CUDA toolkit, libnccl2, or the PyPI wheel "
                      "nvidia-nccl-cu13 (.../site-packages/nvidia/nccl/lib); put its directory "
                      "on LD_LIBRARY_PATH or set FLASHTRAIN_NCCL_LIBRARY to the file"));
    }
#define FT_NCCL_LOAD(name)                                                        \
  lib.name = reinterpret_cast<decltype(lib.name)>(::dlsym(handle, "nccl" #name)); \
  FT_CHECK(lib.name != nullptr, lib.path, " has no symbol nccl" #name,            \
           " (an NCCL older than "                                                \
           "the nccl.h flashtrain was built with?)");
    FT_NCCL_FUNCTIONS(FT_NCCL_LOAD)
#undef FT_NCCL_LOAD
  });
  return lib;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<MpiWorld> world, const CommOptions& o)
      : Communicator(world ? world->rank() : 0, world ? world->size() : 1,
                     world ? world->local_rank() : 0),
        world_(std::move(world)),
        nccl_(nccl_library()) {
    set_timeout(o.timeout_s);
    int version = 0;
    check(nccl_.GetVersion(&version), "ncclGetVersion");
    version_ = str(version / 10000, ".", version / 100 % 100, ".", version % 100);
    ncclUniqueId id{};
    if (rank() == 0) check(nccl_.GetUniqueId(&id), "ncclGetUniqueId");
    if (world_) {
      const std::string bytes =
          world_->broadcast(std::string(reinterpret_cast<const char*>(&id), sizeof id), timeout());
      FT_CHECK(bytes.size() == sizeof id, "the NCCL unique id arrived with ", bytes.size(),
               " bytes, expected ", sizeof id);
      std::memcpy(&id, bytes.data(), sizeof id);
    }
    FT_CHECK(cuda_current_device() == o.cuda_device, "NCCL: GPU ", o.cuda_device,
             " must be selected before the communicator is made");
    check(nccl_.CommInitRank(&comm_, size(), id, rank()), "ncclCommInitRank");
    FT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    FT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
    FT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }

  ~NcclCommunicator() override {
    if (comm_ != nullptr) {
      // A communicator left by an error may have collectives in flight: abort, never wait.
      if (failed_) {
        nccl_.CommAbort(comm_);
      } else {
        nccl_.CommDestroy(comm_);
      }
    }
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Backend backend() const override { return Backend::nccl; }
  Device device() const override { return Device::cuda; }
  std::string describe() const override {
    return "NCCL " + version_ + (world_ ? " over MPI (" + world_->version() + ")" : "");
  }

  std::vector<double> all_gather(const std::vector<double>& mine) override {
    return world_ ? world_->all_gather(mine, timeout()) : mine;
  }
  std::string broadcast(const std::string& bytes) override {
    return world_ ? world_->broadcast(bytes, timeout()) : bytes;
  }
  void gather_to_root(const void* send, size_t bytes, void* recv) override {
    if (world_) {
      world_->gather_to_root(send, bytes, recv, timeout());
    } else if (bytes > 0 && recv != send) {
      std::memcpy(recv, send, bytes);
    }
  }
  void barrier() override {
    if (world_) world_->barrier(timeout());
  }
  void abort(int exit_code) override {
    failed_ = true;
    if (world_) world_->abort(exit_code);
  }

  void all_reduce_sum(const Tensor& t) override {
    after_compute(t);
    check(nccl_.AllReduce(t.raw(), t.raw(), static_cast<size_t>(t.numel()), type(t), ncclSum, comm_,
                          stream_),
          "ncclAllReduce");
    pending_.push_back(t);
  }

  void reduce_scatter_sum(const Tensor& t) override {
    after_compute(t);
    const Tensor mine = chunk(t);
    // In place: this rank's result lands on its own chunk of the input.
    check(nccl_.ReduceScatter(t.raw(), mine.raw(), static_cast<size_t>(mine.numel()), type(t),
                              ncclSum, comm_, stream_),
          "ncclReduceScatter");
    pending_.push_back(t);
  }

  void all_gather(const Tensor& t) override {
    after_compute(t);
    const Tensor mine = chunk(t);
    check(nccl_.AllGather(mine.raw(), t.raw(), static_cast<size_t>(mine.numel()), type(t), comm_,
                          stream_),
          "ncclAllGather");
    pending_.push_back(t);
  }

  void wait() override {
    if (pending_.empty()) return;
    FT_CUDA_CHECK(cudaEventRecord(done_, stream_));
    using Clock = std::chrono::steady_clock;
    const auto start = Clock::now();
    for (int polls = 0;; ++polls) {
      const cudaError_t state = cudaEventQuery(done_);
      if (state == cudaSuccess) break;
      if (state != cudaErrorNotReady) {
        failed_ = true;
        FT_CUDA_CHECK(state);
      }
      ncclResult_t async = ncclSuccess;
      check(nccl_.CommGetAsyncError(comm_, &async), "ncclCommGetAsyncError");
      if (async != ncclSuccess && async != ncclInProgress) {
        failed_ = true;
        throw Error(str("NCCL failed during a collective: ", nccl_.GetErrorString(async), " (",
                        nccl_.GetLastError(comm_), ")"));
      }
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      if (waited >= timeout()) {
        failed_ = true;
        throw Error(str("NCCL collectives did not complete within ", timeout(),
                        " s: another rank failed or hangs (--dist-timeout sets the limit)"));
      }
      if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    FT_CUDA_CHECK(cudaStreamWaitEvent(cuda::current_stream(), done_, 0));
    pending_.clear();
  }

 private:
  void check(ncclResult_t rc, const char* call) {
    if (rc == ncclSuccess) return;
    failed_ = true;
    const char* detail = comm_ != nullptr ? nccl_.GetLastError(comm_) : "";
    throw Error(str(call, " failed: ", nccl_.GetErrorString(rc),
                    detail && *detail ? str(" (", detail, ")") : ""));
  }
  void after_compute(const Tensor& t) {
    FT_CHECK(t.device() == Device::cuda, "NCCL collectives take GPU tensors, got one on ",
             device_name(t.device()));
    FT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16,
             "collectives take fp32 or bf16 tensors, got ", dtype_name(t.dtype()));
    FT_CUDA_CHECK(cudaEventRecord(ready_, cuda::current_stream()));
    FT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  }
  Tensor chunk(const Tensor& t) const {
    FT_CHECK(t.numel() % size() == 0, "a tensor of ", t.numel(), " elements does not split into ",
             size(), " equal chunks");
    return chunk_of(t, rank(), size());
  }
  static ncclDataType_t type(const Tensor& t) {
    return t.dtype() == DType::f32 ? ncclFloat32 : ncclBfloat16;
  }

  std::shared_ptr<MpiWorld> world_;
  const NcclLibrary& nccl_;
  std::string version_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr, done_ = nullptr;
  std::vector<Tensor> pending_;  // kept alive until their collectives are complete
  bool failed_ = false;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<MpiWorld> world,
                                                     const CommOptions& options) {
  return std::make_unique<NcclCommunicator>(std::move(world), options);
}

#else

std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<MpiWorld>,
                                                     const CommOptions&) {
#ifdef FLASHTRAIN_WITH_CUDA
  throw Error(
      "this flashtrain was built without NCCL (nccl.h was not found at configure time); "
      "GPU data parallelism needs it");
#else
  throw Error("this flashtrain was built without CUDA: NCCL (GPU data parallelism) needs it");
#endif
}

#endif

}  // namespace ft::dist

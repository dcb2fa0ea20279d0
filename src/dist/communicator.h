// A communicator: the ranks of a data-parallel job and the collectives between them.
//
// MPI launches the ranks (OpenMPI's mpirun) and carries every host collective (a few numbers
// per step, the checkpoint state); the collectives over tensors go through NCCL when the
// tensors are on GPUs and through MPI when they are on the CPU, so the same code paths run and
// are tested without a GPU. A process that no launcher started is world size 1 and loads no
// MPI library at all (src/dist/mpi_library.h: libmpi is opened at run time, not linked).
//
// Every rank must call the collectives in the same order. Tensor collectives are queued: each
// starts after the work already queued on the compute stream (CUDA) or at once (CPU), runs on a
// communication stream while the caller goes on, and is complete after wait(). Each wait gives
// up after the timeout, so that a rank that died or hangs ends the job instead of stalling it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ft::dist {

enum class Backend {
  local,  // one process, no collectives
  mpi,    // MPI for everything (CPU tensors)
  nccl,   // NCCL for tensors (GPU), MPI for the host
};
const char* backend_name(Backend b);

// What the launcher's environment says about this process (OpenMPI's mpirun sets
// OMPI_COMM_WORLD_SIZE, _RANK and _LOCAL_RANK), read without starting MPI.
struct Launch {
  bool by_mpirun = false;
  int world_size = 1, rank = 0, local_rank = 0;
};
Launch launch_from_environment();

class Communicator {
 public:
  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  bool is_root() const { return rank_ == 0; }
  virtual Backend backend() const = 0;
  // Where the tensors of the tensor collectives live.
  virtual Device device() const = 0;
  // "NCCL 2.28.3 over Open MPI v4.1.4", for the run's header line.
  virtual std::string describe() const = 0;
  // Seconds a wait may take before the job is declared stuck (> 0).
  void set_timeout(double seconds);
  double timeout() const { return timeout_s_; }

  // Host collectives (blocking).
  // Every rank's values, rank after rank (each rank gives the same count).
  virtual std::vector<double> all_gather(const std::vector<double>& mine) = 0;
  // Root's bytes on every rank.
  virtual std::string broadcast(const std::string& bytes) = 0;
  // Every rank's `bytes` bytes at `send`, rank after rank, into `recv` on rank 0 (`recv` is
  // not touched elsewhere).
  virtual void gather_to_root(const void* send, size_t bytes, void* recv) = 0;
  virtual void barrier() = 0;
  // Ends every rank of the job with this exit status (MPI_Abort); returns only at world size 1
  // without a launcher, where the caller exits as usual.
  virtual void abort(int exit_code) = 0;

  // Tensor collectives (queued; contiguous fp32 or bf16 tensors on device(); bf16 sums round
  // each addition to bf16, as NCCL does).
  // In place: every rank's t becomes the sum over ranks.
  virtual void all_reduce_sum(const Tensor& t) = 0;
  // In place: chunk r of t (numel a multiple of the world size, chunk r the r-th of size()
  // equal parts) becomes on rank r the sum over ranks of chunk r; the other chunks are left in
  // an unspecified state.
  virtual void reduce_scatter_sum(const Tensor& t) = 0;
  // In place: chunk r of t, from rank r, lands in chunk r of t on every rank.
  virtual void all_gather(const Tensor& t) = 0;
  // Until the queued tensor collectives are complete (the compute stream then sees their
  // results). Throws ft::Error naming the collective when one fails or the timeout passes.
  virtual void wait() = 0;

 protected:
  Communicator(int rank, int size, int local_rank);

 private:
  int rank_, size_, local_rank_;
  double timeout_s_ = 600.0;
};

struct CommOptions {
  Backend backend = Backend::local;
  // nccl: the GPU this rank uses, selected already (core's use_cuda_device).
  int cuda_device = 0;
  double timeout_s = 600.0;
};

// The communicator of this process: local (world size 1, no MPI) or an MPI job of the ranks
// mpirun started (a world of 1 when started without it). Refuses local under mpirun with
// several ranks (each would train alone and write the same files).
std::unique_ptr<Communicator> make_communicator(const CommOptions& options);

// Whether this process has opened libmpi (a single process never does).
bool mpi_library_loaded();

// chunk r of n elements over `ranks` equal parts: [r * n / ranks, (r + 1) * n / ranks).
inline Tensor chunk_of(const Tensor& t, int rank, int ranks) {
  const int64_t c = t.numel() / ranks;
  return t.view({t.numel()}).slice(rank * c, (rank + 1) * c);
}

}  // namespace ft::dist

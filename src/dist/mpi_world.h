// The MPI job this process belongs to (internal to src/dist): MPI started once per process,
// the host collectives every communicator uses, and waits that give up after a timeout.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dist/mpi_library.h"

namespace ft::dist {

class MpiWorld {
 public:
  // The job's MPI, started on the first call (a world of one when no launcher started this
  // process: OpenMPI's singleton start) and finalized when the last holder lets go. Throws
  // when MPI cannot be loaded or was finalized already (MPI starts once per process).
  static std::shared_ptr<MpiWorld> get();
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  const MpiLibrary& lib() const { return lib_; }
  MPI_Comm comm() const { return lib_.comm_world; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  // "Open MPI v4.1.4"
  std::string version() const;
  // Sums bf16 values stored as MPI_UINT16_T, each addition rounded to bf16.
  MPI_Op bf16_sum() const { return bf16_sum_; }

  // Polls req until it completes; throws ft::Error naming `what` after timeout_s seconds.
  void wait(MPI_Request& req, const char* what, double timeout_s) const;

  std::vector<double> all_gather(const std::vector<double>& mine, double timeout_s) const;
  std::string broadcast(const std::string& bytes, double timeout_s) const;
  void gather_to_root(const void* send, size_t bytes, void* recv, double timeout_s) const;
  void barrier(double timeout_s) const;
  [[noreturn]] void abort(int exit_code) const;

 private:
  MpiWorld();

  const MpiLibrary& lib_;
  int rank_ = 0, size_ = 1, local_rank_ = 0;
  bool started_here_ = false;
  MPI_Op bf16_sum_ = nullptr;
};

}  // namespace ft::dist

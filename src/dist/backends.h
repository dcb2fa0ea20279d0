// The communicator implementations (internal to src/dist; make_communicator picks one).
#pragma once

#include <memory>

#include "dist/communicator.h"
#include "dist/mpi_world.h"

namespace ft::dist {

// MPI for host and CPU-tensor collectives.
std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<MpiWorld> world);
// NCCL for GPU tensors on options.cuda_device; host collectives through world, or none when
// world is null (one process, no launcher: a world of one). Throws in builds without NCCL.
std::unique_ptr<Communicator> make_nccl_communicator(std::shared_ptr<MpiWorld> world,
                                                     const CommOptions& options);

}  // namespace ft::dist

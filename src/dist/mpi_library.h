// OpenMPI, opened at run time: a process that no launcher started never loads libmpi, and a
// binary carried to a machine without OpenMPI still trains on one device.
//
// The entry points are typed from OpenMPI's own mpi.h (decltype of each function), so a call
// through this table is checked as a direct call would be; OpenMPI's handles (MPI_COMM_WORLD,
// MPI_FLOAT, MPI_SUM, ...) are the addresses of its global objects, looked up by their names
// (ompi_mpi_comm_world, ...). That ties this file to OpenMPI's ABI (libmpi.so.40: OpenMPI
// 3.x to 5.x), which is the MPI flashtrain depends on. FLASHTRAIN_MPI_LIBRARY names another
// file to open.
#pragma once

#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1  // the C API only: the C++ bindings would need linking
#endif
#include <mpi.h>

#include <string>

#ifndef OPEN_MPI
#error \
    "flashtrain's dist layer opens OpenMPI (libmpi.so.40) at run time: build with OpenMPI's mpi.h"
#endif

namespace ft::dist {

// clang-format off
#define FT_MPI_FUNCTIONS(X)                                                          \
  X(Initialized) X(Init_thread) X(Finalized) X(Finalize) X(Abort) X(Comm_rank)       \
  X(Comm_size) X(Comm_split_type) X(Comm_free) X(Test) X(Iallreduce)                 \
  X(Ireduce_scatter_block) X(Iallgather) X(Ibcast) X(Igather) X(Ibarrier)            \
  X(Op_create) X(Get_library_version)
// clang-format on

struct MpiLibrary {
#define FT_MPI_MEMBER(name) decltype(&::MPI_##name) name = nullptr;
  FT_MPI_FUNCTIONS(FT_MPI_MEMBER)
#undef FT_MPI_MEMBER
  MPI_Comm comm_world = nullptr;
  MPI_Datatype float_type = nullptr, double_type = nullptr, uint16_type = nullptr,
               byte_type = nullptr;
  MPI_Op sum = nullptr;
  MPI_Info info_null = nullptr;
  std::string path;  // the file opened
};

// Opens the library on the first call (later calls return the same table); throws ft::Error
// saying what was tried and what to install when it cannot.
const MpiLibrary& mpi_library();

}  // namespace ft::dist

#include "dist/mpi_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "core/error.h"
#include "dist/communicator.h"

namespace ft::dist {
namespace {

std::once_flag g_once;
MpiLibrary g_library;
bool g_loaded = false;

template <class T>
void symbol(void* handle, const MpiLibrary& lib, const char* name, T& out) {
  void* address = ::dlsym(handle, name);
  FT_CHECK(address != nullptr, lib.path, " has no symbol ", name,
           ": not an OpenMPI library of the ABI flashtrain was built for (libmpi.so.40)");
  out = reinterpret_cast<T>(address);
}

void load() {
  const char* env = std::getenv("FLASHTRAIN_MPI_LIBRARY");
  g_library.path = env != nullptr && *env != '\0' ? env : "libmpi.so.40";
  // RTLD_GLOBAL: OpenMPI's components (plugins it opens itself) resolve symbols of libmpi.
  void* handle = ::dlopen(g_library.path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = ::dlerror();
    throw Error(str("cannot load OpenMPI (", g_library.path, "): ", why ? why : "unknown error",
                    ". Install it (Debian/Ubuntu: apt-get install openmpi-bin libopenmpi-dev) "
                    "or set FLASHTRAIN_MPI_LIBRARY to its libmpi.so.40"));
  }
  MpiLibrary& l = g_library;
#define FT_MPI_LOAD(name) symbol(handle, l, "MPI_" #name, l.name);
  FT_MPI_FUNCTIONS(FT_MPI_LOAD)
#undef FT_MPI_LOAD
  symbol(handle, l, "ompi_mpi_comm_world", l.comm_world);
  symbol(handle, l, "ompi_mpi_float", l.float_type);
  symbol(handle, l, "ompi_mpi_double", l.double_type);
  symbol(handle, l, "ompi_mpi_uint16_t", l.uint16_type);
  symbol(handle, l, "ompi_mpi_byte", l.byte_type);
  symbol(handle, l, "ompi_mpi_op_sum", l.sum);
  symbol(handle, l, "ompi_mpi_info_null", l.info_null);
  g_loaded = true;
}

}  // namespace

const MpiLibrary& mpi_library() {
  std::call_once(g_once, load);
  return g_library;
}

bool mpi_library_loaded() {  // communicator.h
  return g_loaded;
}

}  // namespace ft::dist

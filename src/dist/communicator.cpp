#include "dist/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "dist/backends.h"

namespace ft::dist {
namespace {

// A non-negative integer from the environment, or -1 when unset; throws for anything else.
int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  FT_CHECK(*end == '\0' && n >= 0 && n < (1L << 30), "environment: ", name, "='", v,
           "' is not a rank number");
  return static_cast<int>(n);
}

// World size 1 without MPI: every collective is the identity.
class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator() : Communicator(0, 1, 0) {}
  Backend backend() const override { return Backend::local; }
  Device device() const override { return Device::cpu; }
  std::string describe() const override { return "one process"; }
  std::vector<double> all_gather(const std::vector<double>& mine) override { return mine; }
  std::string broadcast(const std::string& bytes) override { return bytes; }
  void gather_to_root(const void* send, size_t bytes, void* recv) override {
    if (bytes > 0 && recv != send) std::memcpy(recv, send, bytes);
  }
  void barrier() override {}
  void abort(int) override {}
  void all_reduce_sum(const Tensor&) override {}
  void reduce_scatter_sum(const Tensor&) override {}
  void all_gather(const Tensor&) override {}
  void wait() override {}
};

}  // namespace

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::local:
      return "local";
    case Backend::mpi:
      return "mpi";
    case Backend::nccl:
      return "nccl";
  }
  return "?";
}

Launch launch_from_environment() {
  Launch l;
  const int size = env_int("OMPI_COMM_WORLD_SIZE");
  if (size < 0) return l;
  l.by_mpirun = true;
  l.world_size = size;
  l.rank = std::max(env_int("OMPI_COMM_WORLD_RANK"), 0);
  l.local_rank = std::max(env_int("OMPI_COMM_WORLD_LOCAL_RANK"), 0);
  FT_CHECK(l.world_size >= 1 && l.rank < l.world_size, "environment: OMPI_COMM_WORLD_RANK ", l.rank,
           " is outside OMPI_COMM_WORLD_SIZE ", l.world_size);
  return l;
}

Communicator::Communicator(int rank, int size, int local_rank)
    : rank_(rank), size_(size), local_rank_(local_rank) {}

Communicator::~Communicator() = default;

void Communicator::set_timeout(double seconds) {
  FT_CHECK(seconds > 0, "the collective timeout must be > 0 seconds, got ", seconds);
  timeout_s_ = seconds;
}

std::unique_ptr<Communicator> make_communicator(const CommOptions& options) {
  const Launch launch = launch_from_environment();
  std::unique_ptr<Communicator> comm;
  switch (options.backend) {
    case Backend::local:
      FT_CHECK(!launch.by_mpirun || launch.world_size == 1, "started by mpirun as rank ",
               launch.rank, " of ", launch.world_size,
               ", but data parallelism is off (--dist off): every rank would train alone and "
               "write the same files; use --dist auto");
      comm = std::make_unique<LocalCommunicator>();
      break;
    case Backend::mpi:
      comm = make_mpi_communicator(MpiWorld::get());
      break;
    case Backend::nccl:
      comm = make_nccl_communicator(launch.by_mpirun ? MpiWorld::get() : nullptr, options);
      break;
  }
  comm->set_timeout(options.timeout_s);
  return comm;
}

}  // namespace ft::dist

// The MPI communicator: CPU tensors reduced, scattered and gathered by MPI's non-blocking
// collectives, started as soon as they are queued and completed (polled, with the timeout) by
// wait(). bf16 travels as 16-bit words summed by a user-defined operation.
#include <climits>
#include <vector>

#include "core/error.h"
#include "dist/backends.h"

namespace ft::dist {
namespace {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(std::shared_ptr<MpiWorld> world)
      : Communicator(world->rank(), world->size(), world->local_rank()), world_(std::move(world)) {}

  ~MpiCommunicator() override = default;

  Backend backend() const override { return Backend::mpi; }
  Device device() const override { return Device::cpu; }
  std::string describe() const override { return "MPI (" + world_->version() + ")"; }

  std::vector<double> all_gather(const std::vector<double>& mine) override {
    return world_->all_gather(mine, timeout());
  }
  std::string broadcast(const std::string& bytes) override {
    return world_->broadcast(bytes, timeout());
  }
  void gather_to_root(const void* send, size_t bytes, void* recv) override {
    world_->gather_to_root(send, bytes, recv, timeout());
  }
  void barrier() override { world_->barrier(timeout()); }
  void abort(int exit_code) override { world_->abort(exit_code); }

  void all_reduce_sum(const Tensor& t) override {
    const MpiLibrary& l = world_->lib();
    Pending p{nullptr, t, Tensor(), "a gradient all-reduce"};
    check_rc(l.Iallreduce(MPI_IN_PLACE, t.raw(), count(t, t.numel()), type(t), sum_op(t),
                          world_->comm(), &p.req),
             "MPI_Iallreduce");
    pending_.push_back(std::move(p));
  }

  void reduce_scatter_sum(const Tensor& t) override {
    const MpiLibrary& l = world_->lib();
    const int64_t c = chunk_numel(t);
    Pending p{nullptr, t, Tensor::empty({c}, t.dtype()), "a gradient reduce-scatter"};
    check_rc(l.Ireduce_scatter_block(t.raw(), p.result.raw(), count(t, c), type(t), sum_op(t),
                                     world_->comm(), &p.req),
             "MPI_Ireduce_scatter_block");
    pending_.push_back(std::move(p));
  }

  void all_gather(const Tensor& t) override {
    const MpiLibrary& l = world_->lib();
    const int n = count(t, chunk_numel(t));
    Pending p{nullptr, t, Tensor(), "a weight all-gather"};
    check_rc(l.Iallgather(MPI_IN_PLACE, n, type(t), t.raw(), n, type(t), world_->comm(), &p.req),
             "MPI_Iallgather");
    pending_.push_back(std::move(p));
  }

  void wait() override {
    std::vector<Pending> pending;
    pending.swap(pending_);
    for (Pending& p : pending) {
      world_->wait(p.req, p.what, timeout());
      // A reduce-scatter's result arrives apart: it belongs in this rank's chunk.
      if (p.result.defined()) chunk_of(p.tensor, rank(), size()).copy_from(p.result);
    }
  }

 private:
  struct Pending {
    MPI_Request req;
    Tensor tensor, result;
    const char* what;
  };

  void check_tensor(const Tensor& t) const {
    FT_CHECK(t.device() == Device::cpu, "MPI collectives take CPU tensors, got one on ",
             device_name(t.device()));
    FT_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16,
             "collectives take fp32 or bf16 tensors, got ", dtype_name(t.dtype()));
  }
  int count(const Tensor& t, int64_t n) const {
    check_tensor(t);
    FT_CHECK(n <= INT_MAX, "an MPI collective of ", n, " elements exceeds MPI's int count");
    return static_cast<int>(n);
  }
  int64_t chunk_numel(const Tensor& t) const {
    FT_CHECK(t.numel() % size() == 0, "a tensor of ", t.numel(), " elements does not split into ",
             size(), " equal chunks");
    return t.numel() / size();
  }
  MPI_Datatype type(const Tensor& t) const {
    return t.dtype() == DType::f32 ? world_->lib().float_type : world_->lib().uint16_type;
  }
  MPI_Op sum_op(const Tensor& t) const {
    return t.dtype() == DType::f32 ? world_->lib().sum : world_->bf16_sum();
  }
  static void check_rc(int rc, const char* call) {
    FT_CHECK(rc == MPI_SUCCESS, call, " failed (MPI error ", rc, ")");
  }

  std::shared_ptr<MpiWorld> world_;
  std::vector<Pending> pending_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator(std::shared_ptr<MpiWorld> world) {
  return std::make_unique<MpiCommunicator>(std::move(world));
}

}  // namespace ft::dist

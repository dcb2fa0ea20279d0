#include "train/data_parallel.h"

#include <cmath>
#include <sstream>

#include "core/error.h"

namespace ft::train {
namespace {

double to_mb(int64_t bytes) {
  return static_cast<double>(bytes) / (1024.0 * 1024.0);
}

std::vector<dist::ParamRange> ranges_of(const models::Transformer& model) {
  std::vector<dist::ParamRange> ranges;
  for (const models::Parameter& p : model.parameters()) ranges.push_back({p.offset, p.numel()});
  return ranges;
}

// What AdamW moves per element: m and v read and written, the gradient read twice (its norm,
// then the update), and the weights read and written: the master, which is the compute copy
// in fp32, or both halves of a split master in bf16 (the compute copy one of them: 4 bytes,
// where a whole fp32 master with a bf16 copy of its own moved 4 + 4 + 2).
double optimizer_bytes(const models::Transformer& model) {
  return static_cast<double>(6 * model.flat_grads().nbytes()) +
         2.0 * static_cast<double>(model.weight_bytes());
}

// Elements [begin, end) of the model's flat buffers as one tensor of an AdamW update, with
// moments m and v.
nn::AdamWTensor adamw_range(const models::Transformer& model, int64_t begin, int64_t end,
                            const Tensor& m, const Tensor& v, bool decay) {
  auto range = [&](const Tensor& flat) { return flat.defined() ? flat.slice(begin, end) : flat; };
  return {range(model.flat_masters()), range(model.flat_grads()),    m, v, decay,
          range(model.flat_compute()), range(model.flat_master_lo())};
}

// A parameter's flat view: its elements [begin, end) of the flat buffers.
Tensor piece(const Tensor& param, int64_t offset, int64_t begin, int64_t end) {
  return param.view({param.numel()}).slice(begin - offset, end - offset);
}

}  // namespace

DataParallel::DataParallel(dist::Communicator& comm, models::Transformer& model,
                           const nn::AdamWConfig& adamw, double grad_clip,
                           const DataParallelConfig& config)
    : comm_(comm),
      model_(model),
      adamw_(adamw),
      grad_clip_(grad_clip),
      config_(config),
      optimizer_(model, adamw, grad_clip),
      ranges_(ranges_of(model)) {
  FT_CHECK(config.zero_stage == 0 || config.zero_stage == 1, "--zero must be 0 or 1, got ",
           config.zero_stage);
  FT_CHECK(config.bucket_mb > 0 && std::isfinite(config.bucket_mb),
           "--bucket-mb must be a positive number, got ", config.bucket_mb);
  if (comm.backend() == dist::Backend::local) {
    FT_CHECK(config.zero_stage == 0,
             "--zero 1 shards the optimizer state over the ranks of a "
             "data-parallel job; this run has none (start it with mpirun, "
             "or pass --dist mpi|nccl for a world of one)");
    return;
  }
  FT_CHECK(comm.device() == model.flat_grads().device(), "the ", dist::backend_name(comm.backend()),
           " communicator reduces tensors on ", device_name(comm.device()), ", the model is on ",
           device_name(model.flat_grads().device()));
  const auto bucket_bytes = static_cast<int64_t>(config.bucket_mb * 1024.0 * 1024.0);
  reducer_ = std::make_unique<dist::GradientReducer>(
      comm, model.flat_grads(), ranges_, bucket_bytes, model.parameter_alignment(),
      config.wire_dtype,
      sharded() ? dist::GradientReducer::Mode::reduce_scatter
                : dist::GradientReducer::Mode::all_reduce);
  if (sharded()) {
    slices_ = dist::shard_slices(reducer_->buckets(), ranges_, comm.rank(), comm.size());
    const int64_t n = dist::shard_numel(reducer_->buckets(), comm.size());
    const DType dtype = model.master_dtype();
    shard_m_ = Tensor::zeros({n}, dtype, model.flat_grads().device());
    shard_v_ = Tensor::zeros({n}, dtype, model.flat_grads().device());
  }
}

models::GradientReady DataParallel::gradient_ready() {
  if (!reducer_) return {};
  return [this](size_t param) { reducer_->ready(param); };
}

OptimizerStep DataParallel::step(int64_t step, double lr) {
  models::ProfileRegion region(model_.profile());
  if (reducer_) {
    // What the backward's overlap left to wait for, and the buckets that had not left yet.
    region.enter(models::OpFamily::all_reduce,
                 static_cast<double>(model_.flat_grads().numel() *
                                     static_cast<int64_t>(dtype_size(config_.wire_dtype))));
    reducer_->finish();
  }
  if (sharded()) {
    region.leave();
    return sharded_step(step, lr);
  }
  region.enter(models::OpFamily::optimizer, optimizer_bytes(model_));
  return optimizer_.step(step, lr);
}

OptimizerStep DataParallel::sharded_step(int64_t step, double lr) {
  const Tensor& grads = model_.flat_grads();
  const Tensor& compute = model_.flat_compute();
  // This rank's share of the update: its chunks, about 1 / ranks of every buffer.
  models::ProfileRegion region(model_.profile(), models::OpFamily::optimizer,
                               optimizer_bytes(model_) / comm_.size());
  std::vector<Tensor> shard_grads;
  for (const dist::ShardSlice& s : slices_) shard_grads.push_back(grads.slice(s.begin, s.end));
  const double mine = shard_grads.empty() ? 0.0 : nn::global_grad_norm(shard_grads);
  double squares = 0.0;
  for (double v : comm_.all_gather({mine * mine})) squares += v;  // rank order: equal everywhere
  // The shards' norms meet on the host (all_gather), so this path reads them back mid-step.
  OptimizerStep r;
  r.norm = Tensor::empty({1}, DType::f64);
  r.norm.data<double>()[0] = std::sqrt(squares);
  r.max_norm = grad_clip_;

  std::vector<nn::AdamWTensor> update;
  const std::vector<models::Parameter>& params = model_.parameters();
  for (const dist::ShardSlice& s : slices_) {
    const int64_t n = s.end - s.begin;
    update.push_back(
        adamw_range(model_, s.begin, s.end, shard_m_.slice(s.shard_offset, s.shard_offset + n),
                    shard_v_.slice(s.shard_offset, s.shard_offset + n), params[s.param].decay));
  }
  nn::adamw_update_all(update, lr, adamw_, step, r.grad_scale());
  region.enter(models::OpFamily::all_reduce, static_cast<double>(compute.nbytes()));
  // The weights every rank reads: bf16 compute copies (the high halves of the split masters;
  // the low halves stay with the rank that updated them), or the fp32 masters themselves.
  for (const dist::Bucket& b : reducer_->buckets()) comm_.all_gather(compute.slice(b.begin, b.end));
  comm_.wait();
  return r;
}

void DataParallel::before_load_state() {
  if (!sharded()) return;
  for (models::Parameter& p : model_.parameters()) {
    p.m = Tensor::zeros(p.shape(), p.master_dtype());
    p.v = Tensor::zeros(p.shape(), p.master_dtype());
  }
}

void DataParallel::after_load_state() {
  if (!sharded()) return;
  std::vector<models::Parameter>& params = model_.parameters();
  for (const dist::ShardSlice& s : slices_) {
    const models::Parameter& p = params[s.param];
    const int64_t n = s.end - s.begin;
    Tensor m = shard_m_.slice(s.shard_offset, s.shard_offset + n);
    Tensor v = shard_v_.slice(s.shard_offset, s.shard_offset + n);
    m.copy_from(piece(p.m, p.offset, s.begin, s.end));
    v.copy_from(piece(p.v, p.offset, s.begin, s.end));
  }
  for (models::Parameter& p : params) p.m = p.v = Tensor();
}

void DataParallel::gather_state_on_root() {
  const int64_t n = dist::shard_numel(reducer_->buckets(), comm_.size());
  const DType dtype = model_.master_dtype();
  const size_t bytes = static_cast<size_t>(n) * dtype_size(dtype);
  // This rank's master pieces, at their places in its shard (what the gaps hold is unused).
  Tensor masters = Tensor::zeros({n}, dtype);
  for (const dist::ShardSlice& s : slices_) {
    Tensor dst = masters.slice(s.shard_offset, s.shard_offset + (s.end - s.begin));
    dst.copy_from(model_.master_range(s.begin, s.end, Device::cpu));
  }
  const Tensor m = shard_m_.to(Device::cpu), v = shard_v_.to(Device::cpu);
  const bool root = comm_.is_root();
  const int64_t all_n = root ? n * comm_.size() : 0;
  Tensor all_masters = Tensor::empty({all_n}, dtype), all_m = Tensor::empty({all_n}, dtype),
         all_v = Tensor::empty({all_n}, dtype);
  comm_.gather_to_root(masters.raw(), bytes, root ? all_masters.raw() : nullptr);
  comm_.gather_to_root(m.raw(), bytes, root ? all_m.raw() : nullptr);
  comm_.gather_to_root(v.raw(), bytes, root ? all_v.raw() : nullptr);
  if (!root) return;
  std::vector<models::Parameter>& params = model_.parameters();
  for (models::Parameter& p : params) {
    p.m = Tensor::zeros(p.shape(), dtype);
    p.v = Tensor::zeros(p.shape(), dtype);
  }
  for (int r = 0; r < comm_.size(); ++r) {
    for (const dist::ShardSlice& s :
         dist::shard_slices(reducer_->buckets(), ranges_, r, comm_.size())) {
      models::Parameter& p = params[s.param];
      const int64_t at = r * n + s.shard_offset, len = s.end - s.begin;
      model_.set_master_range(s.begin, all_masters.slice(at, at + len));
      piece(p.m, p.offset, s.begin, s.end).copy_from(all_m.slice(at, at + len));
      piece(p.v, p.offset, s.begin, s.end).copy_from(all_v.slice(at, at + len));
    }
  }
}

void DataParallel::save(const std::function<void()>& save_on_root) {
  if (!sharded()) {
    if (comm_.is_root()) save_on_root();
    return;
  }
  gather_state_on_root();
  if (!comm_.is_root()) return;
  try {
    save_on_root();
  } catch (...) {
    for (models::Parameter& p : model_.parameters()) p.m = p.v = Tensor();
    throw;
  }
  for (models::Parameter& p : model_.parameters()) p.m = p.v = Tensor();
}

int64_t DataParallel::unsharded_moment_bytes() const {
  int64_t n = 0;
  for (const dist::ParamRange& r : ranges_) n += r.numel;
  return 2 * n * static_cast<int64_t>(dtype_size(model_.master_dtype()));
}

int64_t DataParallel::moment_bytes() const {
  if (!sharded()) return unsharded_moment_bytes();
  return static_cast<int64_t>(shard_m_.nbytes() + shard_v_.nbytes());
}

size_t DataParallel::bucket_count() const {
  return reducer_ ? reducer_->buckets().size() : 0;
}

size_t DataParallel::buckets_launched_during_backward() const {
  return reducer_ ? reducer_->launched_during_backward() : 0;
}

std::string DataParallel::describe_buckets() const {
  if (!reducer_) return "";
  std::ostringstream os;
  os.precision(3);
  os << reducer_->buckets().size() << " gradient bucket" << (bucket_count() == 1 ? "" : "s")
     << " of about " << config_.bucket_mb << " MB, " << dtype_name(config_.wire_dtype)
     << " on the wire, " << (sharded() ? "reduce-scattered (ZeRO-1)" : "all-reduced")
     << " as the backward completes them";
  return os.str();
}

std::string DataParallel::describe_sharding() const {
  if (!sharded()) return "";
  std::ostringstream os;
  os.precision(4);
  const double full = to_mb(unsharded_moment_bytes()), mine = to_mb(moment_bytes());
  os << "AdamW moments sharded over " << comm_.size() << " ranks: " << mine
     << " MB per rank instead of " << full << " MB (saves " << full - mine
     << " MB per rank; master weights and gradients stay whole)";
  return os.str();
}

}  // namespace ft::train

#include "dist/buckets.h"

#include <algorithm>

#include "core/error.h"

namespace ft::dist {

std::vector<Bucket> plan_buckets(const std::vector<ParamRange>& params, int64_t flat_numel,
                                 int64_t bucket_numel, int64_t divisor) {
  FT_CHECK(bucket_numel >= 1, "bucket size must be >= 1 element, got ", bucket_numel);
  FT_CHECK(divisor >= 1, "bucket divisor must be >= 1, got ", divisor);
  for (size_t i = 0; i < params.size(); ++i) {
    const int64_t next = i + 1 < params.size() ? params[i + 1].offset : flat_numel;
    FT_CHECK(params[i].numel >= 0 && params[i].offset + params[i].numel <= next, "parameter ", i,
             " at [", params[i].offset, ", ", params[i].offset + params[i].numel,
             ") overlaps what follows it (", next, ")");
  }
  std::vector<Bucket> buckets;
  Bucket open;
  int64_t held = 0;
  for (size_t k = params.size(); k-- > 0;) {
    if (open.params.empty()) open.end = k + 1 < params.size() ? params[k + 1].offset : flat_numel;
    open.params.push_back(k);
    held += params[k].numel;
    if (held >= bucket_numel || k == 0) {
      open.begin = k == 0 ? 0 : params[k].offset;
      std::reverse(open.params.begin(), open.params.end());
      FT_CHECK(open.numel() % divisor == 0, "bucket [", open.begin, ", ", open.end, ") of ",
               open.numel(), " elements is not a multiple of ", divisor);
      buckets.push_back(std::move(open));
      open = Bucket();
      held = 0;
    }
  }
  return buckets;
}

std::vector<ShardSlice> shard_slices(const std::vector<Bucket>& buckets,
                                     const std::vector<ParamRange>& params, int rank, int ranks) {
  std::vector<ShardSlice> slices;
  int64_t base = 0;
  for (const Bucket& b : buckets) {
    const int64_t lo = b.chunk_begin(rank, ranks), hi = b.chunk_end(rank, ranks);
    for (size_t p : b.params) {
      const int64_t begin = std::max(lo, params[p].offset);
      const int64_t end = std::min(hi, params[p].offset + params[p].numel);
      if (begin < end) slices.push_back({p, begin, end, base + (begin - lo)});
    }
    base += hi - lo;
  }
  return slices;
}

int64_t shard_numel(const std::vector<Bucket>& buckets, int ranks) {
  int64_t n = 0;
  for (const Bucket& b : buckets) n += b.numel() / ranks;
  return n;
}

GradientReducer::GradientReducer(Communicator& comm, Tensor flat_grads,
                                 std::vector<ParamRange> params, int64_t bucket_bytes,
                                 int64_t divisor, DType wire, Mode mode)
    : comm_(comm),
      grads_(std::move(flat_grads)),
      params_(std::move(params)),
      wire_dtype_(wire),
      mode_(mode) {
  FT_CHECK(grads_.ndim() == 1 && grads_.dtype() == DType::f32,
           "gradient buckets need a flat fp32 buffer, got ", dtype_name(grads_.dtype()), " ",
           shape_str(grads_.shape()));
  FT_CHECK(wire == DType::f32 || wire == DType::bf16, "gradients travel as fp32 or bf16, not ",
           dtype_name(wire));
  FT_CHECK(divisor % comm.size() == 0, "bucket divisor ", divisor,
           " must be a multiple of the world size ", comm.size());
  const int64_t bucket_numel = std::max<int64_t>(1, bucket_bytes / 4);
  buckets_ = plan_buckets(params_, grads_.numel(), bucket_numel, divisor);
  bucket_of_.resize(params_.size());
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (size_t p : buckets_[b].params) bucket_of_[p] = b;
  }
  if (wire == DType::bf16) wire_ = Tensor::zeros(grads_.shape(), DType::bf16, grads_.device());
  missing_.resize(buckets_.size());
  reported_.assign(params_.size(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = buckets_[b].params.size();
}

void GradientReducer::ready(size_t param) {
  FT_CHECK(param < params_.size(), "gradient of parameter ", param, " reported, but there are ",
           params_.size());
  FT_CHECK(!reported_[param], "gradient of parameter ", param, " reported twice in one backward");
  reported_[param] = true;
  if (--missing_[bucket_of_[param]] == 0) launch_ready();
}

void GradientReducer::launch_ready() {
  for (; next_ < buckets_.size() && missing_[next_] == 0; ++next_) {
    const Bucket& b = buckets_[next_];
    const Tensor grads = grads_.slice(b.begin, b.end);
    Tensor wire = grads;
    if (wire_.defined()) {
      wire = wire_.slice(b.begin, b.end);
      wire.copy_from(grads);  // on the compute stream, which the collective then follows
    }
    if (mode_ == Mode::all_reduce) {
      comm_.all_reduce_sum(wire);
    } else {
      comm_.reduce_scatter_sum(wire);
    }
  }
}

void GradientReducer::finish() {
  for (size_t p = 0; p < params_.size(); ++p) {
    FT_CHECK(reported_[p], "the backward never reported the gradient of parameter ", p);
  }
  launched_early_ = next_;
  launch_ready();
  FT_ASSERT(next_ == buckets_.size());
  comm_.wait();
  if (wire_.defined()) {
    for (const Bucket& b : buckets_) {
      const bool all = mode_ == Mode::all_reduce;
      const int64_t lo = all ? b.begin : b.chunk_begin(comm_.rank(), comm_.size());
      const int64_t hi = all ? b.end : b.chunk_end(comm_.rank(), comm_.size());
      Tensor grads = grads_.slice(lo, hi);
      grads.copy_from(wire_.slice(lo, hi));
    }
  }
  next_ = 0;
  reported_.assign(params_.size(), false);
  for (size_t b = 0; b < buckets_.size(); ++b) missing_[b] = buckets_[b].params.size();
}

}  // namespace ft::dist

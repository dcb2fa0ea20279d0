// Gradient buckets: the flat gradient buffer (every parameter's gradient, one after another)
// cut into runs of consecutive parameters of about --bucket-mb each. A backward completes the
// gradients from the last parameters to the first, so the buckets are cut in that order, and
// each is reduced as soon as its last gradient is complete, on the communication stream, while
// the backward computes the earlier layers (the overlap). One bucket, one collective: an
// all-reduce (every rank keeps every sum) or, with ZeRO-1, a reduce-scatter (rank r keeps the
// sums of chunk r of every bucket, the part of the state it updates).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/tensor.h"
#include "dist/communicator.h"

namespace ft::dist {

// A parameter's place in the flat buffers, in elements.
struct ParamRange {
  int64_t offset = 0, numel = 0;
};

struct Bucket {
  int64_t begin = 0, end = 0;  // flat elements [begin, end): its parameters and the gaps after
  std::vector<size_t> params;  // indices into the parameter list
  int64_t numel() const { return end - begin; }
  // Rank r's chunk of the bucket: [begin + r * numel / ranks, begin + (r + 1) * numel / ranks).
  int64_t chunk_begin(int rank, int ranks) const { return begin + rank * (numel() / ranks); }
  int64_t chunk_end(int rank, int ranks) const {
    return chunk_begin(rank, ranks) + numel() / ranks;
  }
};

// Buckets from the last parameter to the first; a bucket closes once it holds bucket_numel
// elements or more (a parameter larger than that is a bucket of its own). A bucket reaches from
// its first parameter's offset to the next parameter's offset (flat_numel after the last), so
// the buckets tile the buffer. params: sorted by offset, not overlapping. Every bucket's size
// must be a multiple of `divisor` (offsets and flat_numel aligned to it make it so).
std::vector<Bucket> plan_buckets(const std::vector<ParamRange>& params, int64_t flat_numel,
                                 int64_t bucket_numel, int64_t divisor);

// ZeRO-1: what a rank owns is chunk `rank` of every bucket. A ShardSlice is the part of one
// parameter inside one such chunk: flat elements [begin, end), found at shard_offset in the
// rank's shard (its chunks laid end to end, bucket after bucket).
struct ShardSlice {
  size_t param = 0;
  int64_t begin = 0, end = 0;
  int64_t shard_offset = 0;
};
std::vector<ShardSlice> shard_slices(const std::vector<Bucket>& buckets,
                                     const std::vector<ParamRange>& params, int rank, int ranks);
// Elements in each rank's shard (the same for every rank).
int64_t shard_numel(const std::vector<Bucket>& buckets, int ranks);

// Reduces a flat gradient buffer bucket by bucket as a backward reports its gradients.
class GradientReducer {
 public:
  enum class Mode { all_reduce, reduce_scatter };

  // flat_grads: fp32, 1-D, on comm's device. wire: the dtype on the wire, fp32 or bf16 (a bf16
  // copy of each bucket travels and its sums come back into flat_grads).
  GradientReducer(Communicator& comm, Tensor flat_grads, std::vector<ParamRange> params,
                  int64_t bucket_bytes, int64_t divisor, DType wire, Mode mode);

  const std::vector<Bucket>& buckets() const { return buckets_; }
  const std::vector<ParamRange>& params() const { return params_; }
  DType wire_dtype() const { return wire_dtype_; }
  Mode mode() const { return mode_; }

  // Parameter `param`'s gradient is complete: its bucket goes once all of its gradients are
  // (buckets go in order, so that every rank queues the same collectives in the same order).
  void ready(size_t param);
  // After the backward: queues what is left, waits, and leaves in flat_grads the sums over the
  // ranks (all_reduce: everywhere; reduce_scatter: on this rank's chunks). Every parameter
  // must have been reported once.
  void finish();
  // Buckets of the last finish() that left during the backward (the rest left in finish()).
  size_t launched_during_backward() const { return launched_early_; }

 private:
  void launch_ready();

  Communicator& comm_;
  Tensor grads_, wire_;
  std::vector<ParamRange> params_;
  std::vector<Bucket> buckets_;
  DType wire_dtype_;
  Mode mode_;
  std::vector<size_t> bucket_of_;  // per parameter
  std::vector<size_t> missing_;    // per bucket: gradients not yet reported
  std::vector<bool> reported_;     // per parameter
  size_t next_ = 0;                // the next bucket to queue
  size_t launched_early_ = 0;
};

}  // namespace ft::dist

// The trainer's side of data parallelism (src/dist does the communication): the gradient
// buckets of the last micro-batch's backward, the optimizer step over the averaged gradients
// and, with ZeRO-1, over this rank's shard of the AdamW state, followed by the all-gather of
// the updated weights; and the state a checkpoint needs, gathered on rank 0.
//
// Every rank holds the whole model. Plain data parallelism: each bucket is all-reduced, every
// rank runs the same AdamW over all parameters (the replicas stay equal bit for bit). ZeRO-1:
// each bucket is reduce-scattered, so rank r holds the summed gradients of chunk r of every
// bucket; it keeps the AdamW moments of those chunks only (1/N of them), updates its chunks'
// master weights and compute copies, and an all-gather per bucket brings every rank the
// weights the others updated (the compute copies: in a bf16 run the bf16 high halves of the
// split masters, models::Parameter; in an fp32 run the fp32 masters, which are the compute
// copies). The gradient norm for clipping sums the ranks' shares. The low halves of the master
// weights outside a rank's chunks are not kept up to date in a bf16 run: saving gathers the
// masters, with the moments, on rank 0.
//
// Gradients are averaged by the loss scale (each micro-batch's backward is scaled by 1 / the
// micro-batches of the whole step) and summed over the ranks, so the update is the one a
// single process makes from the same micro-batches.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dist/buckets.h"
#include "dist/communicator.h"
#include "models/transformer.h"
#include "nn/adamw.h"
#include "train/optimizer.h"

namespace ft::train {

struct DataParallelConfig {
  int zero_stage = 0;       // 0 or 1
  double bucket_mb = 25.0;  // fp32 gradient MB per bucket
  DType wire_dtype = DType::f32;
};

class DataParallel {
 public:
  // comm.backend() local: no communication, the optimizer of one process (bit for bit).
  // The model must outlive this object; its parameter alignment a multiple of the world size.
  DataParallel(dist::Communicator& comm, models::Transformer& model, const nn::AdamWConfig& adamw,
               double grad_clip, const DataParallelConfig& config);

  bool communicates() const { return reducer_ != nullptr; }
  bool sharded() const { return config_.zero_stage == 1; }

  // For the backward of a step's last micro-batch: queues each bucket as it completes (empty
  // when nothing communicates).
  models::GradientReady gradient_ready();
  // Completes the gradient reduction, then clips and updates (every parameter, or this
  // rank's shard, then the weights' all-gather).
  OptimizerStep step(int64_t step, double lr);
  // For a captured step (replayed by a CUDA graph, one rank, not sharded): the optimizer's step
  // values in page-locked memory, and rewritten before each replay (Optimizer::set_step).
  void pin_step_values() { optimizer_.pin_step_values(); }
  void set_step(int64_t step, double lr) { optimizer_.set_step(step, lr); }

  // ZeRO-1 resume: before train_state's load_train_state(model), which then leaves the saved
  // moments in host tensors, and after it, which keeps this rank's chunks of them. No-ops
  // without sharding.
  void before_load_state();
  void after_load_state();
  // Runs save_on_root on rank 0 with the whole training state in the model: with ZeRO-1 the
  // master weights and moments are gathered first (every rank must call this); the model's
  // moments are released again afterwards.
  void save(const std::function<void()>& save_on_root);

  // "3 buckets (<= 25 MB), fp32 on the wire" and, sharded, the memory line.
  std::string describe_buckets() const;
  std::string describe_sharding() const;
  // Bytes of AdamW moments this rank keeps, and what one process keeps.
  int64_t moment_bytes() const;
  int64_t unsharded_moment_bytes() const;
  // Buckets of the last step that left during the backward.
  size_t buckets_launched_during_backward() const;
  size_t bucket_count() const;

 private:
  OptimizerStep sharded_step(int64_t step, double lr);
  void gather_state_on_root();

  dist::Communicator& comm_;
  models::Transformer& model_;
  nn::AdamWConfig adamw_;
  double grad_clip_;
  DataParallelConfig config_;
  Optimizer optimizer_;  // unsharded
  std::vector<dist::ParamRange> ranges_;
  std::unique_ptr<dist::GradientReducer> reducer_;
  // ZeRO-1: this rank's pieces of the parameters, and the moments of its shard.
  std::vector<dist::ShardSlice> slices_;
  Tensor shard_m_, shard_v_;
};

}  // namespace ft::train

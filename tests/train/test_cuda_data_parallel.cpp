// Data-parallel training through NCCL at world size 1 (no mpirun): the real communicator, the
// buckets and the optimizer paths of data parallelism, against the run of one process on the
// same GPU. fp32 and bf16 with fp32 on the wire are equal bit for bit; ZeRO-1 within 1e-6 (its
// gradient norm is summed per shard); bf16 on the wire rounds the gradients, within bf16's
// tolerance. Skipped without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <sstream>

#include "core/device.h"
#include "dist/communicator.h"
#include "test_util.h"
#include "train/trainer.h"

namespace ft::train {
namespace {

TrainConfig gpu_run(DType dtype) {
  TrainConfig c;
  c.model = "gpt2-tiny";
  c.train_data = test::source_path("data/tinyshakespeare_train.bin");
  c.val_data = "";
  c.tokenizer = test::source_path("data/gpt2_tokenizer.bin");
  c.batch_size = 4;
  c.seq_len = 64;
  c.total_batch_size = 4 * 64 * 2;
  c.steps = 8;
  c.lr = 3e-3;
  c.warmup = 2;
  c.sample_tokens = 0;
  c.quiet = true;
  c.device = Device::cuda;
  c.dtype = dtype;
  c.bucket_mb = 1;
  return c;
}

std::vector<double> losses(const TrainConfig& c) {
  std::ostringstream out;
  return train(c, out).losses;
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) d = std::max(d, std::abs(a[i] - b[i]));
  return d;
}

TEST(CudaDataParallel, NcclWorldOfOneTrainsAsOneProcess) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason();
  use_cuda_device(0);
  dist::CommOptions o;
  o.backend = dist::Backend::nccl;
  const std::unique_ptr<dist::Communicator> comm = dist::make_communicator(o);

  TrainConfig c = gpu_run(DType::f32);
  const std::vector<double> one = losses(c);
  c.comm = comm.get();
  EXPECT_EQ(losses(c), one) << "fp32 through the buckets";
  c.zero_stage = 1;
  EXPECT_LT(max_diff(losses(c), one), 1e-6) << "fp32 ZeRO-1";

  TrainConfig b = gpu_run(DType::bf16);
  const std::vector<double> one_bf16 = losses(b);
  b.comm = comm.get();
  b.wire_dtype = DType::f32;
  EXPECT_EQ(losses(b), one_bf16) << "bf16 with fp32 on the wire";
  b.wire_dtype = DType::bf16;
  EXPECT_LT(max_diff(losses(b), one_bf16), 1e-2) << "bf16 on the wire";
}

}  // namespace
}  // namespace ft::train

// The NCCL communicator on one GPU without mpirun (a world of one: every collective is the
// identity, through the real NCCL calls, the communication stream and the waits), and the
// gradient buckets on the GPU with bf16 on the wire. Skipped without a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "core/bf16.h"
#include "core/device.h"
#include "dist/buckets.h"
#include "dist/communicator.h"

namespace ft::dist {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no GPU: " << cuda_unavailable_reason()

std::unique_ptr<Communicator> nccl_world_of_one() {
  use_cuda_device(0);
  CommOptions o;
  o.backend = Backend::nccl;
  o.cuda_device = 0;
  o.timeout_s = 60;
  return make_communicator(o);
}

Tensor ramp(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = 0.37f * static_cast<float>(i % 97) - 3.1f;
  return t;
}

TEST(Nccl, WorldOfOneCollectivesAreTheIdentity) {
  SKIP_WITHOUT_GPU();
  const std::unique_ptr<Communicator> comm = nccl_world_of_one();
  ASSERT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->device(), Device::cuda);
  const Tensor host = ramp(4096);
  for (DType dtype : {DType::f32, DType::bf16}) {
    const Tensor expected = host.to(dtype).to(DType::f32);
    Tensor a = host.to(dtype).to(Device::cuda), b = a.clone(), c = a.clone();
    comm->all_reduce_sum(a);
    comm->reduce_scatter_sum(b);
    comm->all_gather(c);
    comm->wait();
    for (const Tensor* t : {&a, &b, &c}) {
      EXPECT_EQ(max_abs_diff(t->to(Device::cpu).to(DType::f32), expected), 0.0)
          << dtype_name(dtype);
    }
  }
  EXPECT_EQ(comm->all_gather({1.5, 2.5}), (std::vector<double>{1.5, 2.5}));
}

TEST(Nccl, BucketsWithBf16OnTheWire) {
  SKIP_WITHOUT_GPU();
  const std::unique_ptr<Communicator> comm = nccl_world_of_one();
  const std::vector<ParamRange> params = {{0, 1000}, {1024, 3000}, {4096, 64}};
  const Tensor host = ramp(4160);
  Tensor grads = host.to(Device::cuda);
  GradientReducer reducer(*comm, grads, params, 4 * 1024, 64, DType::bf16,
                          GradientReducer::Mode::all_reduce);
  EXPECT_GE(reducer.buckets().size(), 2u);
  for (size_t p : {2u, 1u, 0u}) reducer.ready(p);
  reducer.finish();
  const Tensor got = grads.to(Device::cpu);
  for (int64_t i = 0; i < host.numel(); ++i) {
    ASSERT_EQ(got.data<float>()[i], round_to_bf16(host.data<float>()[i])) << i;
  }
}

}  // namespace
}  // namespace ft::dist

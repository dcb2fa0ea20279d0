// Gradient buckets without MPI: the plan tiles the flat buffer from the last parameter to the
// first, ZeRO-1's shard slices give every element of every parameter to exactly one rank, and
// the reducer queues each bucket as soon as its last gradient is reported, in bucket order,
// through a bf16 copy when the wire is bf16 (a recording communicator stands in for the ranks).
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <vector>

#include "core/bf16.h"
#include "dist/buckets.h"
#include "dist/communicator.h"

namespace ft::dist {
namespace {

// Three parameters of 100, 300 and 40 elements at 128-aligned offsets.
std::vector<ParamRange> three_params() {
  return {{0, 100}, {128, 300}, {512, 40}};
}
constexpr int64_t kFlat = 640;

TEST(PlanBuckets, TilesTheBufferFromTheLastParameter) {
  const std::vector<Bucket> b = plan_buckets(three_params(), kFlat, 300, 128);
  ASSERT_EQ(b.size(), 2u);
  // The last two parameters reach 340 >= 300 elements: the first bucket; the first is left.
  EXPECT_EQ(b[0].begin, 128);
  EXPECT_EQ(b[0].end, kFlat);
  EXPECT_EQ(b[0].params, (std::vector<size_t>{1, 2}));
  EXPECT_EQ(b[1].begin, 0);
  EXPECT_EQ(b[1].end, 128);
  EXPECT_EQ(b[1].params, (std::vector<size_t>{0}));
}

TEST(PlanBuckets, ABigParameterIsABucketOfItsOwn) {
  const std::vector<Bucket> b = plan_buckets(three_params(), kFlat, 1, 128);
  ASSERT_EQ(b.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(b[i].params, (std::vector<size_t>{2 - i}));
  const std::vector<Bucket> one = plan_buckets(three_params(), kFlat, 1 << 20, 128);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].begin, 0);
  EXPECT_EQ(one[0].end, kFlat);
}

TEST(PlanBuckets, RefusesSizesThatDoNotSplitAndOverlaps) {
  EXPECT_THROW(plan_buckets(three_params(), kFlat, 1, 256), Error);  // 384 % 256 != 0
  EXPECT_THROW(plan_buckets({{0, 200}, {128, 10}}, 256, 1, 1), Error);
}

TEST(ShardSlices, EveryElementBelongsToExactlyOneRank) {
  const std::vector<ParamRange> params = three_params();
  for (int ranks : {1, 2, 4}) {
    const std::vector<Bucket> buckets = plan_buckets(params, kFlat, 200, 128);
    std::vector<int> owner(kFlat, -1);
    for (int r = 0; r < ranks; ++r) {
      std::vector<bool> used(static_cast<size_t>(shard_numel(buckets, ranks)), false);
      for (const ShardSlice& s : shard_slices(buckets, params, r, ranks)) {
        EXPECT_GE(s.begin, params[s.param].offset);
        EXPECT_LE(s.end, params[s.param].offset + params[s.param].numel);
        for (int64_t e = s.begin; e < s.end; ++e) {
          EXPECT_EQ(owner[static_cast<size_t>(e)], -1) << "element " << e << " owned twice";
          owner[static_cast<size_t>(e)] = r;
          const auto at = static_cast<size_t>(s.shard_offset + (e - s.begin));
          ASSERT_LT(at, used.size());
          EXPECT_FALSE(used[at]);
          used[at] = true;
        }
      }
    }
    for (const ParamRange& p : params) {
      for (int64_t e = p.offset; e < p.offset + p.numel; ++e) {
        EXPECT_GE(owner[static_cast<size_t>(e)], 0) << "element " << e << " has no owner";
      }
    }
    EXPECT_EQ(shard_numel(buckets, ranks) * ranks, kFlat);
  }
}

// Rank 0 of two ranks whose peer holds the same gradients: a sum doubles every value.
class RecordingCommunicator final : public Communicator {
 public:
  struct Call {
    const char* op;
    const void* data;
    int64_t numel;
    DType dtype;
  };
  RecordingCommunicator() : Communicator(0, 2, 0) {}
  Backend backend() const override { return Backend::mpi; }
  Device device() const override { return Device::cpu; }
  std::string describe() const override { return "recording"; }
  std::vector<double> all_gather(const std::vector<double>& mine) override {
    std::vector<double> all = mine;
    all.insert(all.end(), mine.begin(), mine.end());
    return all;
  }
  std::string broadcast(const std::string& bytes) override { return bytes; }
  void gather_to_root(const void*, size_t, void*) override {}
  void barrier() override {}
  void abort(int) override {}
  void all_reduce_sum(const Tensor& t) override {
    calls.push_back({"all_reduce", t.raw(), t.numel(), t.dtype()});
    doubled.push_back(t);
  }
  void reduce_scatter_sum(const Tensor& t) override {
    calls.push_back({"reduce_scatter", t.raw(), t.numel(), t.dtype()});
    doubled.push_back(chunk_of(t, 0, 2));
  }
  void all_gather(const Tensor& t) override {
    calls.push_back({"all_gather", t.raw(), t.numel(), t.dtype()});
  }
  void wait() override {
    for (Tensor& t : doubled) {
      Tensor f = t.to(DType::f32);
      for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] *= 2.0f;
      t.copy_from(f);
    }
    doubled.clear();
    ++waits;
  }
  std::vector<Call> calls;
  std::vector<Tensor> doubled;
  int waits = 0;
};

Tensor ramp(int64_t n) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = 0.001f * static_cast<float>(i) + 0.3f;
  return t;
}

TEST(GradientReducer, QueuesEachBucketOnceItsLastGradientIsReported) {
  RecordingCommunicator comm;
  Tensor grads = ramp(kFlat);
  const Tensor before = grads.clone();
  GradientReducer reducer(comm, grads, three_params(), 1 /*byte: one bucket per parameter*/, 128,
                          DType::f32, GradientReducer::Mode::all_reduce);
  ASSERT_EQ(reducer.buckets().size(), 3u);
  reducer.ready(2);  // the last parameter first, as a backward reports them
  ASSERT_EQ(comm.calls.size(), 1u);
  EXPECT_EQ(comm.calls[0].data, grads.slice(512, kFlat).raw());
  reducer.ready(0);  // its bucket is the last: it waits for bucket 1
  EXPECT_EQ(comm.calls.size(), 1u);
  reducer.ready(1);
  ASSERT_EQ(comm.calls.size(), 3u);
  EXPECT_EQ(comm.calls[1].data, grads.slice(128, 512).raw());
  EXPECT_EQ(comm.calls[2].data, grads.raw());
  EXPECT_EQ(comm.waits, 0);
  reducer.finish();
  EXPECT_EQ(comm.waits, 1);
  EXPECT_EQ(reducer.launched_during_backward(), 3u);
  for (int64_t i = 0; i < kFlat; ++i) {
    ASSERT_EQ(grads.data<float>()[i], 2.0f * before.data<float>()[i]) << i;
  }
  // The next backward starts afresh; a parameter reported twice is an error.
  reducer.ready(2);
  EXPECT_THROW(reducer.ready(2), Error);
}

TEST(GradientReducer, FinishRefusesAMissingGradient) {
  RecordingCommunicator comm;
  GradientReducer reducer(comm, ramp(kFlat), three_params(), 1, 128, DType::f32,
                          GradientReducer::Mode::all_reduce);
  reducer.ready(2);
  reducer.ready(1);
  EXPECT_THROW(reducer.finish(), Error);
}

TEST(GradientReducer, Bf16WireCarriesRoundedGradientsAndScattersChunks) {
  RecordingCommunicator comm;
  Tensor grads = ramp(kFlat);
  const Tensor before = grads.clone();
  GradientReducer reducer(comm, grads, three_params(), 1 << 20, 128, DType::bf16,
                          GradientReducer::Mode::reduce_scatter);
  ASSERT_EQ(reducer.buckets().size(), 1u);
  for (size_t p : {2u, 1u, 0u}) reducer.ready(p);
  ASSERT_EQ(comm.calls.size(), 1u);
  EXPECT_EQ(comm.calls[0].dtype, DType::bf16);
  EXPECT_STREQ(comm.calls[0].op, "reduce_scatter");
  EXPECT_EQ(comm.calls[0].numel, kFlat);
  reducer.finish();
  // Rank 0's chunk (the first half) holds the bf16 sums; the other half is untouched.
  for (int64_t i = 0; i < kFlat; ++i) {
    const float x = before.data<float>()[i];
    const float expected = i < kFlat / 2 ? round_to_bf16(2.0f * round_to_bf16(x)) : x;
    ASSERT_EQ(grads.data<float>()[i], expected) << i;
  }
}

TEST(Launch, EnvironmentWithoutMpirunIsOneProcess) {
  if (std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr) GTEST_SKIP() << "running under mpirun";
  const Launch l = launch_from_environment();
  EXPECT_FALSE(l.by_mpirun);
  EXPECT_EQ(l.world_size, 1);
  const std::unique_ptr<Communicator> comm = make_communicator({});
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->backend(), Backend::local);
}

}  // namespace
}  // namespace ft::dist

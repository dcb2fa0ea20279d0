// The MPI communicator on real ranks: Mpi.* start this test binary under
// `mpirun --oversubscribe -np 2` (and once alone, OpenMPI's singleton start: a world of one),
// where MpiRank.* run the collectives on every rank. Outside such a start MpiRank.* skip.
#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/bf16.h"
#include "dist/buckets.h"
#include "dist/communicator.h"
#include "test_util.h"

namespace ft::dist {
namespace {

bool in_rank() {
  return std::getenv("FLASHTRAIN_TEST_MPI") != nullptr;
}

std::string self_path() {
  char buf[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// MPI starts once per process: one communicator for all MpiRank tests, finalized at the end.
std::unique_ptr<Communicator> g_comm;

class MpiEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { g_comm.reset(); }
};
[[maybe_unused]] ::testing::Environment* const g_env =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

Communicator& comm() {
  if (!g_comm) {
    CommOptions o;
    o.backend = Backend::mpi;
    o.timeout_s = 60;
    g_comm = make_communicator(o);
  }
  return *g_comm;
}

#define SKIP_OUTSIDE_RANKS() \
  if (!in_rank()) GTEST_SKIP() << "runs under mpirun (Mpi.*)"

TEST(MpiRank, HostCollectives) {
  SKIP_OUTSIDE_RANKS();
  Communicator& c = comm();
  const std::vector<double> all = c.all_gather({c.rank() + 0.5, 10.0 * c.rank()});
  ASSERT_EQ(all.size(), 2u * static_cast<size_t>(c.size()));
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(all[2 * r], r + 0.5);
    EXPECT_EQ(all[2 * r + 1], 10.0 * r);
  }
  EXPECT_EQ(c.broadcast(c.is_root() ? "from rank 0" : "ignored"), "from rank 0");
  const std::vector<int32_t> mine = {c.rank(), 7 * c.rank() + 1};
  std::vector<int32_t> gathered(c.is_root() ? 2 * static_cast<size_t>(c.size()) : 0);
  c.gather_to_root(mine.data(), sizeof(int32_t) * 2, c.is_root() ? gathered.data() : nullptr);
  for (int r = 0; c.is_root() && r < c.size(); ++r) {
    EXPECT_EQ(gathered[2 * r], r);
    EXPECT_EQ(gathered[2 * r + 1], 7 * r + 1);
  }
  c.barrier();
}

// Element i of rank r's tensor: (r + 1) * (i + 1) / 8, exact in fp32 and in their sums.
Tensor rank_values(int rank, int64_t n, DType dtype = DType::f32) {
  Tensor t = Tensor::empty({n}, DType::f32);
  for (int64_t i = 0; i < n; ++i) t.data<float>()[i] = (rank + 1) * (i + 1) / 8.0f;
  return t.to(dtype);
}

float sum_over_ranks(int ranks, int64_t i) {
  float s = 0;
  for (int r = 0; r < ranks; ++r) s += (r + 1) * (i + 1) / 8.0f;
  return s;
}

TEST(MpiRank, TensorCollectives) {
  SKIP_OUTSIDE_RANKS();
  Communicator& c = comm();
  const int64_t n = 4 * c.size();
  Tensor reduced = rank_values(c.rank(), n);
  c.all_reduce_sum(reduced);
  Tensor scattered = rank_values(c.rank(), n);
  c.reduce_scatter_sum(scattered);
  Tensor gathered = Tensor::zeros({n}, DType::f32);
  Tensor own = chunk_of(gathered, c.rank(), c.size());
  own.fill(c.rank() + 1.0);
  c.all_gather(gathered);
  c.wait();
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(reduced.data<float>()[i], sum_over_ranks(c.size(), i)) << i;
    EXPECT_EQ(gathered.data<float>()[i], static_cast<float>(i / 4 + 1)) << i;
  }
  const Tensor mine = chunk_of(scattered, c.rank(), c.size());
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_EQ(mine.data<float>()[i], sum_over_ranks(c.size(), c.rank() * 4 + i)) << i;
  }
}

TEST(MpiRank, Bf16SumsRoundEachAddition) {
  SKIP_OUTSIDE_RANKS();
  Communicator& c = comm();
  // 1 + 2^-8 lies halfway between two bf16 values: the sum rounds to even (1.0).
  Tensor t = Tensor::empty({2}, DType::f32);
  t.data<float>()[0] = c.is_root() ? 1.0f : 0.00390625f;
  t.data<float>()[1] = 0.75f;
  Tensor wire = t.to(DType::bf16);
  c.all_reduce_sum(wire);
  c.wait();
  const Tensor back = wire.to(DType::f32);
  float expected = 1.0f;
  for (int r = 1; r < c.size(); ++r) expected = round_to_bf16(expected + 0.00390625f);
  EXPECT_EQ(back.data<float>()[0], expected);
  EXPECT_EQ(back.data<float>()[1], round_to_bf16(0.75f * static_cast<float>(c.size())));
}

TEST(MpiRank, GradientReducerSumsEveryBucket) {
  SKIP_OUTSIDE_RANKS();
  Communicator& c = comm();
  const int64_t a = 64 * c.size();  // alignment: every bucket splits into aligned chunks
  const std::vector<ParamRange> params = {{0, 100}, {2 * a, 3 * a - 5}, {6 * a, a}};
  const int64_t flat = 7 * a;
  for (auto mode : {GradientReducer::Mode::all_reduce, GradientReducer::Mode::reduce_scatter}) {
    Tensor grads = rank_values(c.rank(), flat);
    GradientReducer reducer(c, grads, params, 4 * a /*bytes: a elements*/, a, DType::f32, mode);
    for (size_t p : {2u, 1u, 0u}) reducer.ready(p);
    reducer.finish();
    for (const Bucket& b : reducer.buckets()) {
      const bool all = mode == GradientReducer::Mode::all_reduce;
      const int64_t lo = all ? b.begin : b.chunk_begin(c.rank(), c.size());
      const int64_t hi = all ? b.end : b.chunk_end(c.rank(), c.size());
      for (int64_t i = lo; i < hi; ++i) {
        ASSERT_EQ(grads.data<float>()[i], sum_over_ranks(c.size(), i)) << i;
      }
    }
  }
}

// A rank that does not come: the waiting rank gives up after the timeout, naming it.
TEST(MpiRank, AWaitGivesUpAfterTheTimeout) {
  SKIP_OUTSIDE_RANKS();
  Communicator& c = comm();
  if (c.size() == 1) GTEST_SKIP() << "needs two ranks";
  if (c.is_root()) {
    c.set_timeout(0.3);
    try {
      c.barrier();
      ADD_FAILURE() << "the barrier completed without rank 1";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("did not complete within 0.3 s"), std::string::npos)
          << e.what();
    }
    c.set_timeout(60);
  } else {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    c.barrier();  // completes rank 0's abandoned barrier
  }
  c.barrier();
}

TEST(Mpi, CollectivesOnTwoRanks) {
  if (!test::have_mpirun()) GTEST_SKIP() << "mpirun not found (scripts/bootstrap.sh installs it)";
  const test::CommandResult r =
      test::run_shell(test::mpirun(2) + "-x FLASHTRAIN_TEST_MPI=1 '" + self_path() +
                      "' --gtest_color=no --gtest_filter='MpiRank.*'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  size_t passed = 0;
  for (size_t at = r.output.find("[  PASSED  ] 5 tests"); at != std::string::npos;
       at = r.output.find("[  PASSED  ] 5 tests", at + 1)) {
    ++passed;
  }
  EXPECT_EQ(passed, 2u) << r.output;
}

// OpenMPI's singleton start (no mpirun): a world of one, every collective the identity.
TEST(Mpi, WorldOfOneWithoutMpirun) {
  if (!test::have_mpirun()) GTEST_SKIP() << "OpenMPI not installed (scripts/bootstrap.sh)";
  const test::CommandResult r = test::run_shell("FLASHTRAIN_TEST_MPI=1 '" + self_path() +
                                                "' --gtest_color=no --gtest_filter='MpiRank.*'");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("[  PASSED  ] 4 tests"), std::string::npos) << r.output;
}

TEST(Mpi, OneProcessOpensNoMpi) {
  if (in_rank()) GTEST_SKIP() << "MPI is open in a rank";
  const std::unique_ptr<Communicator> c = make_communicator({});
  EXPECT_EQ(c->size(), 1);
  EXPECT_FALSE(mpi_library_loaded());
}

}  // namespace
}  // namespace ft::dist

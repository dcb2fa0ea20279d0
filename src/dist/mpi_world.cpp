#include "dist/mpi_world.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "core/bf16.h"
#include "core/error.h"

namespace ft::dist {
namespace {

std::mutex g_mutex;
std::weak_ptr<MpiWorld> g_world;
bool g_finalized = false;

void check(int rc, const char* call) {
  FT_CHECK(rc == MPI_SUCCESS, call, " failed (MPI error ", rc, ")");
}

extern "C" void bf16_sum_function(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float sum = bf16::from_bits(a[i]).to_float() + bf16::from_bits(b[i]).to_float();
    b[i] = bf16::round_bits(sum);
  }
}

// The largest piece one gather moves per rank: counts are ints.
constexpr size_t kMaxPieceBytes = size_t{1} << 30;

}  // namespace

std::shared_ptr<MpiWorld> MpiWorld::get() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (auto world = g_world.lock()) return world;
  FT_CHECK(!g_finalized, "MPI was finalized already in this process (MPI starts once per process)");
  std::shared_ptr<MpiWorld> world(new MpiWorld());
  g_world = world;
  return world;
}

MpiWorld::MpiWorld() : lib_(mpi_library()) {
  int initialized = 0;
  check(lib_.Initialized(&initialized), "MPI_Initialized");
  if (!initialized) {
    // Only the main thread calls MPI (OpenMP threads never do).
    int provided = 0;
    check(lib_.Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    started_here_ = true;
  }
  check(lib_.Comm_rank(comm(), &rank_), "MPI_Comm_rank");
  check(lib_.Comm_size(comm(), &size_), "MPI_Comm_size");
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (local != nullptr && *local != '\0') {
    local_rank_ = std::atoi(local);
  } else {  // another launcher: the rank among the processes sharing this node's memory
    MPI_Comm node = nullptr;
    check(lib_.Comm_split_type(comm(), MPI_COMM_TYPE_SHARED, rank_, lib_.info_null, &node),
          "MPI_Comm_split_type");
    check(lib_.Comm_rank(node, &local_rank_), "MPI_Comm_rank");
    check(lib_.Comm_free(&node), "MPI_Comm_free");
  }
  check(lib_.Op_create(&bf16_sum_function, 1, &bf16_sum_), "MPI_Op_create");
}

MpiWorld::~MpiWorld() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_finalized = true;
  if (!started_here_) return;
  // Finalizing waits for every rank: a rank leaving on an error must abort instead.
  if (std::uncaught_exceptions() > 0 && size_ > 1) lib_.Abort(comm(), 1);
  lib_.Finalize();
}

std::string MpiWorld::version() const {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  lib_.Get_library_version(text, &length);
  std::string v(text, static_cast<size_t>(std::max(length, 0)));
  const size_t cut = v.find_first_of(",\n");
  return cut == std::string::npos ? v : v.substr(0, cut);
}

void MpiWorld::wait(MPI_Request& req, const char* what, double timeout_s) const {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    check(lib_.Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done) return;
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    FT_CHECK(waited < timeout_s, what, " did not complete within ", timeout_s,
             " s: another rank failed or hangs (--dist-timeout sets the limit)");
    // Spin first (collectives of a step take microseconds), then let the compute threads run.
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::vector<double> MpiWorld::all_gather(const std::vector<double>& mine, double timeout_s) const {
  FT_CHECK(mine.size() <= static_cast<size_t>(INT_MAX) / static_cast<size_t>(size_),
           "all_gather: ", mine.size(), " values per rank is too many");
  std::vector<double> all(mine.size() * static_cast<size_t>(size_));
  const int n = static_cast<int>(mine.size());
  MPI_Request req = nullptr;
  check(lib_.Iallgather(mine.data(), n, lib_.double_type, all.data(), n, lib_.double_type, comm(),
                        &req),
        "MPI_Iallgather");
  wait(req, "an all-gather of step values", timeout_s);
  return all;
}

std::string MpiWorld::broadcast(const std::string& bytes, double timeout_s) const {
  uint64_t length = bytes.size();
  MPI_Request req = nullptr;
  check(lib_.Ibcast(&length, sizeof length, lib_.byte_type, 0, comm(), &req), "MPI_Ibcast");
  wait(req, "a broadcast", timeout_s);
  FT_CHECK(length <= static_cast<uint64_t>(INT_MAX), "broadcast: ", length, " bytes is too many");
  std::string out = rank_ == 0 ? bytes : std::string(length, '\0');
  check(lib_.Ibcast(out.data(), static_cast<int>(length), lib_.byte_type, 0, comm(), &req),
        "MPI_Ibcast");
  wait(req, "a broadcast", timeout_s);
  return out;
}

void MpiWorld::gather_to_root(const void* send, size_t bytes, void* recv, double timeout_s) const {
  const auto* src = static_cast<const char*>(send);
  auto* dst = static_cast<char*>(recv);
  const auto ranks = static_cast<size_t>(size_);
  std::vector<char> piece_all;
  size_t offset = 0;
  do {  // at least once: a rank with nothing to send still takes part
    const size_t len = std::min(kMaxPieceBytes, bytes - offset);
    if (rank_ == 0) piece_all.resize(len * ranks);
    MPI_Request req = nullptr;
    check(lib_.Igather(src + offset, static_cast<int>(len), lib_.byte_type, piece_all.data(),
                       static_cast<int>(len), lib_.byte_type, 0, comm(), &req),
          "MPI_Igather");
    wait(req, "a gather of the training state", timeout_s);
    for (size_t r = 0; rank_ == 0 && len > 0 && r < ranks; ++r) {
      std::memcpy(dst + r * bytes + offset, piece_all.data() + r * len, len);
    }
    offset += len;
  } while (offset < bytes);
}

void MpiWorld::barrier(double timeout_s) const {
  MPI_Request req = nullptr;
  check(lib_.Ibarrier(comm(), &req), "MPI_Ibarrier");
  wait(req, "a barrier", timeout_s);
}

void MpiWorld::abort(int exit_code) const {
  lib_.Abort(comm(), exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; should it, leave all the same
}

}  // namespace ft::dist

// Kernel configurations: text form, per-architecture limits and defaults, and can_implement().
// The warp-layout and shared-memory rules here mirror the kernels' static_asserts and shared
// memory plans (src/attention/cuda/flash_bf16.cuh); a test instantiates every rule's boundary.
#include "attention/kernel_config.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <map>
#include <mutex>
#include <regex>
#include <sstream>

#include "attention/flash_kernel_list.h"
#include "core/device.h"

namespace ft::attention {

const char* forward_path_name(ForwardPath path) {
  switch (path) {
    case ForwardPath::mma:
      return "mma";
    case ForwardPath::wgmma:
      return "wgmma";
    case ForwardPath::tma:
      return "tma";
  }
  return "?";
}

ForwardPath parse_forward_path(const std::string& s) {
  if (s == "mma") return ForwardPath::mma;
  if (s == "wgmma") return ForwardPath::wgmma;
  if (s == "tma") return ForwardPath::tma;
  throw Error(str("unknown forward path '", s, "' (allowed: mma, wgmma, tma)"));
}

const char* backward_path_name(BackwardPath path) {
  switch (path) {
    case BackwardPath::single:
      return "single";
    case BackwardPath::double_buffered:
      return "double";
    case BackwardPath::wgmma:
      return "wgmma";
    case BackwardPath::tma:
      return "tma";
  }
  return "?";
}

BackwardPath parse_backward_path(const std::string& s) {
  if (s == "single") return BackwardPath::single;
  if (s == "double") return BackwardPath::double_buffered;
  if (s == "wgmma") return BackwardPath::wgmma;
  if (s == "tma") return BackwardPath::tma;
  throw Error(str("unknown backward path '", s, "' (allowed: single, double, wgmma, tma)"));
}

std::vector<BackwardPath> all_backward_paths() {
  return {BackwardPath::single, BackwardPath::double_buffered, BackwardPath::wgmma,
          BackwardPath::tma};
}

std::vector<BackwardPath> mma_backward_paths() {
  return {BackwardPath::single, BackwardPath::double_buffered};
}

std::string TileConfig::str() const {
  return ft::str(block_m, "x", block_n, "/", threads);
}

std::string KernelConfig::forward_str() const {
  switch (forward_path) {
    case ForwardPath::mma:
      return ft::str("fwd=", forward.str());
    case ForwardPath::wgmma:
      return ft::str("fwd=", forward.str(), "/wgmma");
    case ForwardPath::tma:
      return ft::str("fwd=", forward.str(), "/tma/s", forward_stages,
                     forward_pingpong ? "/pp" : "/nopp");
  }
  return "?";
}

std::string KernelConfig::backward_str() const {
  const bool stages = backward_path == BackwardPath::tma && backward_stages != 0;
  return ft::str("bwd=", backward.str(), "/", backward_path_name(backward_path),
                 stages ? ft::str("/s", backward_stages) : std::string());
}

std::string KernelConfig::str() const {
  return ft::str(forward_str(), " ", backward_str());
}

namespace {

// A tile size or thread count of the text form (digits, per the pattern): one that does not fit
// an int is refused, not thrown as std::out_of_range.
int config_number(const std::ssub_match& digits, const std::string& text) {
  int v = 0;
  const std::string s = digits.str();
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  FT_CHECK(ec == std::errc() && end == s.data() + s.size(), "kernel config: number ", s, " in '",
           text, "' is out of range (at most ", std::numeric_limits<int>::max(), ")");
  return v;
}

}  // namespace

KernelConfig KernelConfig::parse(const std::string& text, const KernelConfig& base) {
  static const std::regex fwd_re(
      R"(^fwd=(\d+)x(\d+)/(\d+)(?:/(mma|wgmma|tma))?(?:/s(\d+))?(?:/(pp|nopp))?$)");
  static const std::regex bwd_re(
      R"(^bwd=(\d+)x(\d+)/(\d+)(?:/(single|double|wgmma|tma))?(?:/s(\d+))?$)");
  const std::string expected =
      "expected 'fwd=MxN/THREADS[/FPATH] bwd=MxN/THREADS/PATH', e.g. 'fwd=128x64/128 "
      "bwd=64x64/128/double' (either part may be left out; FPATH: mma (default), wgmma, or "
      "tma[/sSTAGES][/pp|/nopp] (default /s2, and /pp over 256 threads); PATH: single, double, "
      "wgmma or tma[/sSTAGES] (default: the tile's first plan))";
  KernelConfig c = base;
  std::istringstream words(text);
  std::string word;
  int parts = 0;
  while (words >> word) {
    std::smatch m;
    if (std::regex_match(word, m, fwd_re)) {
      c.forward = {config_number(m[1], text), config_number(m[2], text), config_number(m[3], text)};
      c.forward_path = m[4].matched ? parse_forward_path(m[4]) : ForwardPath::mma;
      const bool tma = c.forward_path == ForwardPath::tma;
      FT_CHECK(tma || (!m[5].matched && !m[6].matched), "kernel config: '", word,
               "': stages (/sN) and turns (/pp, /nopp) belong to the tma path only: ", expected);
      c.forward_stages = tma ? (m[5].matched ? config_number(m[5], text) : 2) : 0;
      // Turns need two consumer groups: a tile of one group (256 threads) defaults to /nopp.
      c.forward_pingpong = tma && (m[6].matched ? m[6] == "pp" : c.forward.threads > 256);
    } else if (std::regex_match(word, m, bwd_re)) {
      c.backward = {config_number(m[1], text), config_number(m[2], text),
                    config_number(m[3], text)};
      if (m[4].matched) c.backward_path = parse_backward_path(m[4]);
      FT_CHECK(c.backward_path == BackwardPath::tma || !m[5].matched, "kernel config: '", word,
               "': stages (/sN) belong to the tma backward only: ", expected);
      c.backward_stages = m[5].matched ? config_number(m[5], text) : 0;
      FT_CHECK(!m[5].matched || c.backward_stages > 0, "kernel config: '", word,
               "': stages (/sN) count from 1: ", expected);
    } else {
      throw Error(ft::str("kernel config: cannot read '", word, "' in '", text, "': ", expected));
    }
    ++parts;
  }
  FT_CHECK(parts > 0, "kernel config: '", text, "' is empty: ", expected);
  return c;
}

// ---- devices ----

namespace {

struct ArchRow {
  const char* arch;
  int compute_capability;
  int64_t max_smem_per_block;
};

// Per-block shared memory with the opt-in, from the CUDA programming guide's table.
constexpr ArchRow kArchs[] = {
    {"sm80", 80, 166912}, {"sm86", 86, 101376},   {"sm89", 89, 101376},
    {"sm90", 90, 232448}, {"sm100", 100, 232448}, {"sm120", 120, 101376},
};
static_assert(kArchs[3].max_smem_per_block == kSm90SmemPerBlock,
              "tma_plans.h sizes its plans for sm90's shared memory");

}  // namespace

std::string arch_family(int cc) {
  if (cc >= 120) return "sm120";
  if (cc >= 100) return "sm100";
  if (cc >= 90) return "sm90";
  if (cc >= 86) return "sm86";
  return "sm80";
}

std::vector<std::string> arch_families() {
  std::vector<std::string> out;
  for (const ArchRow& row : kArchs) {
    const std::string family = arch_family(row.compute_capability);
    if (std::find(out.begin(), out.end(), family) == out.end()) out.push_back(family);
  }
  return out;
}

std::vector<std::string> DeviceLimits::known_archs() {
  std::vector<std::string> out;
  for (const ArchRow& row : kArchs) out.push_back(row.arch);
  return out;
}

DeviceLimits DeviceLimits::for_arch(const std::string& arch) {
  for (const ArchRow& row : kArchs) {
    if (arch == row.arch) return {row.arch, row.compute_capability, row.max_smem_per_block, 1024};
  }
  std::string known;
  for (const ArchRow& row : kArchs) known += (known.empty() ? "" : ", ") + std::string(row.arch);
  throw Error(ft::str("unknown architecture '", arch, "' (known: ", known, ")"));
}

const DeviceLimits& DeviceLimits::current() {
  static std::mutex mutex;
  static std::map<int, DeviceLimits> cache;
  const int device = cuda_current_device();
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(device);
  if (it != cache.end()) return it->second;
  FT_CHECK(cuda_device_count() > 0, "no CUDA device: ", cuda_unavailable_reason());
  DeviceLimits d;
  d.compute_capability = cuda_compute_capability(device);
  d.arch = ft::str("sm", d.compute_capability);
  d.max_smem_per_block = cuda_max_shared_memory_per_block(device);
  return cache.emplace(device, d).first->second;
}

// ---- shared memory plans (flash_bf16.cuh allocates exactly these) ----

// The wgmma kernels ask for 1024 bytes more, to align their swizzled panels.
constexpr int64_t kWgmmaAlignSlack = 1024;

int64_t forward_smem_bytes(const TileConfig& t, ForwardPath path, int64_t head_dim) {
  // Q tile, plus K and V tiles in two stages each; bf16. The wgmma kernel on one warpgroup (64
  // query rows) keeps a single K slot.
  // It also keeps a table of 256 key-tile covers and segment ids (5 B each).
  if (path == ForwardPath::wgmma) {
    const int64_t k_slots = t.block_m == 64 ? 1 : 2;
    return 2 * head_dim * (t.block_m + (k_slots + 2) * int64_t{t.block_n}) + 5 * 256 +
           kWgmmaAlignSlack;
  }
  return 2 * head_dim * (t.block_m + 4 * int64_t{t.block_n});
}

const TmaForwardPlan* find_tma_plan(const KernelConfig& c, int64_t head_dim) {
  if (c.forward_path != ForwardPath::tma) return nullptr;
  // The threads tell the heads of a work tile apart: 64 rows on 384 threads are two consumer
  // groups, one head each.
  for (const TmaForwardPlan& plan : kTmaForwardPlans) {
    if (plan.head_dim == head_dim && plan.block_m == c.forward.block_m &&
        plan.block_n == c.forward.block_n && plan.stages == c.forward_stages &&
        plan.pingpong == c.forward_pingpong && plan.threads() == c.forward.threads) {
      return &plan;
    }
  }
  return nullptr;
}

KernelConfig with_tma_forward(KernelConfig base, const TmaForwardPlan& plan) {
  base.forward = {plan.block_m, plan.block_n, plan.threads()};
  base.forward_path = ForwardPath::tma;
  base.forward_stages = plan.stages;
  base.forward_pingpong = plan.pingpong;
  return base;
}

int64_t forward_smem_bytes(const KernelConfig& c, int64_t head_dim) {
  if (c.forward_path != ForwardPath::tma) {
    return forward_smem_bytes(c.forward, c.forward_path, head_dim);
  }
  const TmaForwardPlan* plan = find_tma_plan(c, head_dim);
  return plan != nullptr ? plan->smem_bytes() : 0;
}

namespace {

// The tma backward plan of a tile and ring depth (0: the tile's first plan) for a head dim.
const TmaBackwardPlan* find_tma_backward_plan(const TileConfig& t, int stages, int64_t head_dim) {
  for (const TmaBackwardPlan& plan : kTmaBackwardPlans) {
    if (plan.head_dim == head_dim && plan.block_m == t.block_m && plan.block_n == t.block_n &&
        (stages == 0 || plan.stages == stages)) {
      return &plan;
    }
  }
  return nullptr;
}

}  // namespace

const TmaBackwardPlan* find_tma_backward_plan(const KernelConfig& c, int64_t head_dim) {
  if (c.backward_path != BackwardPath::tma) return nullptr;
  return find_tma_backward_plan(c.backward, c.backward_stages, head_dim);
}

KernelConfig with_tma_backward(KernelConfig base, const TmaBackwardPlan& plan) {
  base.backward = {plan.block_m, plan.block_n, plan.threads()};
  base.backward_path = BackwardPath::tma;
  const TmaBackwardPlan* first = find_tma_backward_plan(base.backward, 0, plan.head_dim);
  base.backward_stages = first != nullptr && *first == plan ? 0 : plan.stages;
  return base;
}

int64_t backward_smem_bytes(const KernelConfig& c, int64_t head_dim) {
  if (c.backward_path != BackwardPath::tma) {
    return backward_smem_bytes(c.backward, c.backward_path, head_dim);
  }
  const TmaBackwardPlan* plan = find_tma_backward_plan(c, head_dim);
  return plan != nullptr ? plan->smem_bytes() : 0;
}

int64_t backward_smem_bytes(const TileConfig& t, BackwardPath path, int64_t head_dim) {
  if (path == BackwardPath::tma) {
    const TmaBackwardPlan* plan = find_tma_backward_plan(t, 0, head_dim);
    return plan != nullptr ? plan->smem_bytes() : 0;
  }
  const int64_t stages = path == BackwardPath::single ? 1 : 2;
  const int64_t m = t.block_m, n = t.block_n;
  // K and V (bf16) once; Q and dO (bf16) with lse and D (fp32) per stage; dS (bf16).
  const int64_t tiles = 4 * head_dim * n + stages * (4 * head_dim * m + 8 * m) + 2 * m * n;
  return path == BackwardPath::wgmma ? tiles + kWgmmaAlignSlack : tiles;
}

const std::vector<int64_t>& flash_head_dims() {
  static const std::vector<int64_t> dims = {
#define FT_DIM(d) d,
      FT_FLASH_HEAD_DIMS(FT_DIM)
#undef FT_DIM
  };
  return dims;
}

const std::vector<int64_t>& wgmma_head_dims() {
  static const std::vector<int64_t> dims = {
#define FT_DIM(d) d,
      FT_FLASH_WGMMA_HEAD_DIMS(FT_DIM)
#undef FT_DIM
  };
  return dims;
}

const std::vector<int64_t>& tma_head_dims() {
  static const std::vector<int64_t> dims = [] {
    std::vector<int64_t> out;
    for (const TmaForwardPlan& plan : kTmaForwardPlans) {
      if (std::find(out.begin(), out.end(), plan.head_dim) == out.end()) {
        out.push_back(plan.head_dim);
      }
    }
    return out;
  }();
  return dims;
}

const std::vector<int64_t>& tma_backward_head_dims() {
  static const std::vector<int64_t> dims = [] {
    std::vector<int64_t> out;
    for (const TmaBackwardPlan& plan : kTmaBackwardPlans) {
      if (std::find(out.begin(), out.end(), plan.head_dim) == out.end()) {
        out.push_back(plan.head_dim);
      }
    }
    return out;
  }();
  return dims;
}

const CompiledKernels& compiled_kernels() {
  static const CompiledKernels k = [] {
    CompiledKernels c;
#define FT_TILE(m, n, t) TileConfig{m, n, t},
    c.forward = {FT_FLASH_FORWARD_TILES(FT_TILE)};
    c.backward = {FT_FLASH_BACKWARD_TILES(FT_TILE)};
    c.wgmma_forward = {FT_FLASH_WGMMA_FORWARD_TILES(FT_TILE)};
    c.wgmma_backward = {FT_FLASH_WGMMA_BACKWARD_TILES(FT_TILE)};
#undef FT_TILE
    for (const TmaForwardPlan& plan : kTmaForwardPlans) {
      if (tma_plan_compiled(plan)) c.tma_forward.push_back(plan);
    }
    for (const TmaBackwardPlan& plan : kTmaBackwardPlans) {
      if (!tma_plan_compiled(plan)) continue;
      c.tma_backward_plans.push_back(plan);
      const TileConfig tile{plan.block_m, plan.block_n, plan.threads()};
      if (std::find(c.tma_backward.begin(), c.tma_backward.end(), tile) == c.tma_backward.end()) {
        c.tma_backward.push_back(tile);
      }
    }
    c.head_dims = flash_head_dims();
    c.wgmma_head_dims = wgmma_head_dims();
#ifdef FLASHTRAIN_SWEEP_KERNELS
    c.sweep_set = true;
#endif
    return c;
  }();
  return k;
}

std::vector<TileConfig> sweep_forward_tiles(ForwardPath path) {
  // wgmma: one warpgroup per 64 query rows, key tiles of 64 or 128; the tiles that have run
  // the GPU tests (128x64/256 measured slower than both neighbours and was dropped).
  if (path == ForwardPath::wgmma) return {{64, 64, 128}, {64, 128, 128}, {128, 128, 256}};
  if (path == ForwardPath::tma) return {};  // sweep_tma_plans()
  // One thread count per forward tile (16 or 32 query rows per warp), and:
  // 128x64 also with 16 rows per warp (fewer registers, more warps).
  return {{64, 64, 128},  {64, 128, 128},  {128, 32, 128}, {128, 64, 128},
          {128, 64, 256}, {128, 128, 256}, {192, 64, 192}, {256, 64, 256}};
}

std::vector<TmaForwardPlan> sweep_tma_plans(int64_t head_dim) {
  std::vector<TmaForwardPlan> out;
  for (const TmaForwardPlan& plan : kTmaForwardPlans) {
    if (plan.head_dim == head_dim) out.push_back(plan);
  }
  return out;
}

std::vector<TmaBackwardPlan> sweep_tma_backward_plans(int64_t head_dim) {
  std::vector<TmaBackwardPlan> out;
  for (const TmaBackwardPlan& plan : kTmaBackwardPlans) {
    if (plan.head_dim == head_dim) out.push_back(plan);
  }
  return out;
}

std::vector<TileConfig> sweep_backward_tiles(BackwardPath path, int64_t head_dim) {
  // wgmma: query tiles of 64, one warpgroup per 64 keys.
  if (path == BackwardPath::wgmma) return {{64, 64, 128}, {64, 128, 256}};
  std::vector<TileConfig> out;
  if (path == BackwardPath::tma) {
    for (const TmaBackwardPlan& plan : kTmaBackwardPlans) {
      if (head_dim != 0 && plan.head_dim != head_dim) continue;
      const TileConfig tile{plan.block_m, plan.block_n, plan.threads()};
      if (std::find(out.begin(), out.end(), tile) == out.end()) out.push_back(tile);
    }
    return out;
  }
  for (const auto& [m, n] : std::vector<std::pair<int, int>>{
           {64, 64}, {64, 128}, {128, 64}, {128, 128}, {192, 64}, {256, 64}}) {
    for (int threads : {128, 256}) out.push_back({m, n, threads});
  }
  return out;
}

// ---- can_implement ----

namespace {

bool contains(const std::vector<TileConfig>& tiles, const TileConfig& t) {
  return std::find(tiles.begin(), tiles.end(), t) != tiles.end();
}

std::string threads_reason(const char* which, const TileConfig& t, int max_threads) {
  if (t.block_m <= 0 || t.block_n <= 0 || t.threads <= 0) {
    return ft::str(which, " tile ", t.str(), ": sizes must be positive");
  }
  if (t.threads % 32 != 0 || t.threads > max_threads) {
    return ft::str(which, " tile ", t.str(), ": threads must be a multiple of 32 up to ",
                   max_threads);
  }
  return "";
}

// Forward: warps split the query rows, 16 or 32 rows each; key tiles are whole 16-key steps.
std::string forward_layout_reason(const TileConfig& t) {
  const int warps = t.threads / 32;
  if (t.block_m % warps != 0 || (t.block_m / warps != 16 && t.block_m / warps != 32)) {
    return ft::str("forward tile ", t.str(), ": ", warps, " warps must split the ", t.block_m,
                   " query rows into 16 or 32 rows each");
  }
  if (t.block_n % 16 != 0) {
    return ft::str("forward tile ", t.str(), ": key rows must be a multiple of 16");
  }
  return "";
}

// wgmma forward: one warpgroup (128 threads) per 64 query rows; key tiles of 64 or 128.
std::string wgmma_forward_layout_reason(const TileConfig& t) {
  if (t.threads % 128 != 0 || t.block_m != 64 * (t.threads / 128)) {
    return ft::str("forward tile ", t.str(), "/wgmma: needs one warpgroup (128 threads) per 64 ",
                   "query rows, i.e. ", 64 * std::max(1, t.threads / 128), " rows for ", t.threads,
                   " threads");
  }
  if (t.block_n != 64 && t.block_n != 128) {
    return ft::str("forward tile ", t.str(), "/wgmma: key rows must be 64 or 128");
  }
  return "";
}

// Backward: warps split the key rows, 16 or 32 each; for dQ they split the query rows into
// 16-row steps and, when fewer steps than warps, the head dim into 16-column slices.
std::string backward_layout_reason(const TileConfig& t, int64_t head_dim) {
  const int warps = t.threads / 32;
  if (t.block_n % warps != 0 || (t.block_n / warps != 16 && t.block_n / warps != 32)) {
    return ft::str("backward tile ", t.str(), ": ", warps, " warps must split the ", t.block_n,
                   " key rows into 16 or 32 rows each");
  }
  if (t.block_m % 16 != 0) {
    return ft::str("backward tile ", t.str(), ": query rows must be a multiple of 16");
  }
  const int m_steps = t.block_m / 16;
  const int warps_m = std::min(warps, m_steps);
  const int warps_n = warps / warps_m;
  if (m_steps % warps_m != 0 || warps % warps_m != 0 || head_dim % (16 * warps_n) != 0) {
    return ft::str("backward tile ", t.str(), ": the dQ step cannot split ", t.block_m,
                   " query rows x head dim ", head_dim, " over ", warps, " warps");
  }
  return "";
}

// wgmma backward: query tiles of 64 rows, one warpgroup (128 threads) per 64 keys.
std::string wgmma_backward_layout_reason(const TileConfig& t) {
  if (t.block_m != 64) {
    return ft::str("backward tile ", t.str(), "/wgmma: query rows must be 64");
  }
  if (t.threads % 128 != 0 || t.block_n != 64 * (t.threads / 128)) {
    return ft::str("backward tile ", t.str(), "/wgmma: needs one warpgroup (128 threads) per 64 ",
                   "keys, i.e. ", 64 * std::max(1, t.threads / 128), " keys for ", t.threads,
                   " threads");
  }
  return "";
}

// tma forward: the configuration must name a plan of tma_plans.h for this head dim, with its
// threads (one producer warpgroup and one consumer warpgroup per 64 query rows of each head of
// a work tile); a plan of two heads a tile needs query heads per kv head in pairs.
std::string tma_forward_reason(const KernelConfig& c, const Problem& problem) {
  const int64_t head_dim = problem.head_dim;
  const TmaForwardPlan* plan = find_tma_plan(c, head_dim);
  if (plan == nullptr) {
    // Plans of this tile on other threads: what they run.
    std::string runs;
    for (const TmaForwardPlan& p : kTmaForwardPlans) {
      if (p.head_dim == head_dim && p.block_m == c.forward.block_m &&
          p.block_n == c.forward.block_n && p.stages == c.forward_stages &&
          p.pingpong == c.forward_pingpong) {
        runs += ft::str(runs.empty() ? "" : ", or ", p.threads(),
                        " threads (a producer warpgroup and ", p.consumer_groups(),
                        p.consumer_groups() > 1 ? " consumer warpgroups" : " consumer warpgroup",
                        p.heads > 1 ? ", one per head of a pair" : "", ")");
      }
    }
    if (!runs.empty()) {
      return ft::str("forward tile ", c.forward_str().substr(4), ": the tma plan runs ", runs);
    }
    std::string plans;
    for (const TmaForwardPlan& p : kTmaForwardPlans) {
      if (p.head_dim != head_dim) continue;
      plans += (plans.empty() ? "" : ", ") + with_tma_forward(c, p).forward_str().substr(4);
    }
    return ft::str(
        "forward tile ", c.forward_str().substr(4), ": not a tma plan for head dim ", head_dim,
        plans.empty() ? " (the tma plans have head dims 64, 128, 256)" : " (plans: " + plans + ")");
  }
  if (problem.kv_heads > 0 && problem.group_size() % plan->heads != 0) {
    return ft::str("forward tile ", c.forward_str().substr(4), ": the tma plan takes ", plan->heads,
                   " query heads of one kv head a work tile, so query heads per kv ",
                   "head must come in ", plan->heads, "s (this problem: ", problem.q_heads, " / ",
                   problem.kv_heads, "); its one-head plans run any");
  }
  return "";
}

// tma backward: the tile (and ring depth, where named) must be a plan of tma_plans.h for this head
// dim, with its threads (one producer warpgroup and one consumer warpgroup per 64 keys, two at
// head dim 256).
std::string tma_backward_reason(const KernelConfig& c, int64_t head_dim) {
  const TmaBackwardPlan* plan = find_tma_backward_plan(c, head_dim);
  const std::string name = c.backward_str().substr(4);
  if (plan == nullptr) {
    std::string plans;
    for (const TmaBackwardPlan& p : kTmaBackwardPlans) {
      if (p.head_dim != head_dim) continue;
      plans += (plans.empty() ? "" : ", ") + with_tma_backward(c, p).backward_str().substr(4);
    }
    return ft::str("backward tile ", name, ": not a tma backward plan for head dim ", head_dim,
                   plans.empty() ? "" : " (plans: " + plans + ")");
  }
  if (c.backward.threads != plan->threads()) {
    return ft::str("backward tile ", name, ": the plan runs ", plan->threads(),
                   " threads (a producer warpgroup and ", plan->consumer_groups(),
                   " consumer warpgroups)");
  }
  return "";
}

std::string smem_reason(const char* which, const std::string& tile, int64_t bytes,
                        const DeviceLimits& d) {
  if (bytes <= d.max_smem_per_block) return "";
  return ft::str(which, " ", tile, " needs ", bytes, " B of shared memory; ", d.arch,
                 " allows at most ", d.max_smem_per_block, " B per block");
}

std::string head_dim_reason(const char* kernels, const std::vector<int64_t>& dims,
                            int64_t head_dim) {
  if (std::find(dims.begin(), dims.end(), head_dim) != dims.end()) return "";
  std::string list;
  for (int64_t dim : dims) list += (list.empty() ? "" : ", ") + std::to_string(dim);
  return ft::str("head dim ", head_dim, ": the ", kernels, " support ", list);
}

}  // namespace

namespace {

// The checks of one direction, in the order they are reported: head dim, threads, warp layout,
// shared memory, compiled.
using Checks = std::array<std::string, 5>;

std::string not_compiled(const std::string& tile) {
  const char* how = compiled_kernels().sweep_set
                        ? "it is not among the sweep candidates"
                        : "configure with -DFLASHTRAIN_SWEEP_KERNELS=ON to compile the sweep's "
                          "candidate set";
  return ft::str(tile, " is not compiled into this build (", how, ")");
}

Checks forward_checks(const KernelConfig& c, const Problem& p, const DeviceLimits& d) {
  const bool wgmma = c.forward_path == ForwardPath::wgmma;
  const bool tma = c.forward_path == ForwardPath::tma;
  const std::string name = c.forward_str().substr(4);
  const char* kernels = tma     ? "tma forward kernels"
                        : wgmma ? "wgmma forward kernels"
                                : "bf16 flash kernels";
  const std::vector<int64_t>& dims =
      tma ? tma_head_dims() : (wgmma ? wgmma_head_dims() : flash_head_dims());
  Checks out = {head_dim_reason(kernels, dims, p.head_dim),
                threads_reason("forward", c.forward, d.max_threads_per_block),
                tma     ? tma_forward_reason(c, p)
                : wgmma ? wgmma_forward_layout_reason(c.forward)
                        : forward_layout_reason(c.forward),
                smem_reason("forward tile", name, forward_smem_bytes(c, p.head_dim), d), ""};
  const CompiledKernels& k = compiled_kernels();
  const TmaForwardPlan* plan = tma ? find_tma_plan(c, p.head_dim) : nullptr;
  const bool compiled =
      tma ? plan != nullptr &&
                std::find(k.tma_forward.begin(), k.tma_forward.end(), *plan) != k.tma_forward.end()
          : contains(k.forward_tiles(c.forward_path), c.forward);
  if (!compiled) out[4] = not_compiled("forward tile " + name);
  return out;
}

Checks backward_checks(const KernelConfig& c, const Problem& p, const DeviceLimits& d) {
  const bool wgmma = c.backward_path == BackwardPath::wgmma;
  const bool tma = c.backward_path == BackwardPath::tma;
  const std::string name = c.backward_str().substr(4);
  Checks out = {tma ? head_dim_reason("tma backward kernels", tma_backward_head_dims(), p.head_dim)
                : wgmma ? head_dim_reason("wgmma backward kernels", wgmma_head_dims(), p.head_dim)
                        : head_dim_reason("bf16 flash kernels", flash_head_dims(), p.head_dim),
                threads_reason("backward", c.backward, d.max_threads_per_block),
                tma     ? tma_backward_reason(c, p.head_dim)
                : wgmma ? wgmma_backward_layout_reason(c.backward)
                        : backward_layout_reason(c.backward, p.head_dim),
                smem_reason("backward tile", name, backward_smem_bytes(c, p.head_dim), d), ""};
  const CompiledKernels& k = compiled_kernels();
  const TmaBackwardPlan* plan = find_tma_backward_plan(c, p.head_dim);
  const bool compiled =
      tma ? plan != nullptr && std::find(k.tma_backward_plans.begin(), k.tma_backward_plans.end(),
                                         *plan) != k.tma_backward_plans.end()
          : contains(k.backward_tiles(c.backward_path), c.backward);
  if (!compiled) {
    out[4] = not_compiled(ft::str("backward tile ", name));
  }
  return out;
}

}  // namespace

std::string can_implement(const KernelConfig& c, const Problem& p, const DeviceLimits& d,
                          KernelDirection which) {
  if (p.dtype == DType::f32) return "";  // the fp32 path has fixed kernels for every problem
  if (p.dtype != DType::bf16) {
    return ft::str("dtype ", dtype_name(p.dtype), ": the CUDA flash kernels take bf16 or fp32");
  }
  const bool fwd = which != KernelDirection::backward, bwd = which != KernelDirection::forward;
  if (d.compute_capability < 80) {
    return ft::str(d.arch, ": the bf16 flash kernels need sm80 or newer (bf16 mma.sync)");
  }
  const bool hopper_fwd = fwd && c.forward_path != ForwardPath::mma;
  const bool hopper_bwd =
      bwd && (c.backward_path == BackwardPath::wgmma || c.backward_path == BackwardPath::tma);
  if ((hopper_fwd || hopper_bwd) && arch_family(d.compute_capability) != "sm90") {
    return ft::str(
        d.arch, ": the ",
        hopper_fwd ? forward_path_name(c.forward_path) : backward_path_name(c.backward_path),
        " path needs sm90 (Hopper's warpgroup instructions); use an mma path ",
        "(forward without /wgmma or /tma, backward single or double)");
  }
  const Checks f = fwd ? forward_checks(c, p, d) : Checks{};
  const Checks b = bwd ? backward_checks(c, p, d) : Checks{};
  for (size_t i = 0; i < f.size(); ++i) {
    if (!f[i].empty()) return f[i];
    if (!b[i].empty()) return b[i];
  }
  if (bwd && p.deterministic && c.backward_path != BackwardPath::tma) {
    return ft::str("deterministic backward: the bf16 ", backward_path_name(c.backward_path),
                   " backward adds the dQ parts in any order; only the tma backward (sm90, e.g. "
                   "bwd=64x128/384/tma) fixes their order (or use fp32)");
  }
  return "";
}

// ---- defaults ----

const char* mask_class_name(MaskClass mask_class) {
  return mask_class == MaskClass::dense ? "dense" : "local";
}

MaskClass mask_class_of(const Mask& mask) {
  return mask.window > 0 || mask.has_segments ? MaskClass::local : MaskClass::dense;
}

namespace {

struct DefaultRow {
  const char* family;
  int64_t max_head_dim;  // the row applies to head dims up to this
  MaskClass mask_class;
  int64_t min_seq_len;  // and to sequences at least this long
  int64_t max_seq_len;  // and at most this long (0: no bound; a bounded row never fits length 0)
  const char* config;
  // and to query heads per kv head a multiple of this (2: a plan of two heads a work tile)
  int64_t group_multiple = 1;
};

// Rows are searched in order: the first of the family whose head-dim bound, mask class, length
// range and group multiple fit.
// sm90, measured on an H200 with bench/attention_gpu.sh and `flashtrain sweep --sweep forward`
// (docs/PERF.md, "The tma forward", 2026-12-01): dense masks run the tma forward, 128x128 with
// two ring stages and turns: at B=32 S=4096 Hq=16 Hkv=4 D=128 causal 3.8-3.9 ms (the wgmma
// 128x128 forward 6.17 ms), at the GPT-2 shape (D=64) 0.061 ms (wgmma 64x128: 0.069 ms); head
// dim 256 has only the tma paths: the forward's 80-key tiles beside the 64-key plan's with
// causal masks (7.36 and 7.45 ms in two rounds of one call, cuDNN 7.35 in both: 1.00x / 0.99x,
// docs/results/tma_forward_d256/call1), the 64-key plan with a window or documents (80 there is
// unmeasured), and the tma backward's one plan (64x64: two consumer groups share 64 keys, each
// half of the head dim). With a window or segment ids (many short work tiles) the 64-row tma
// plan of one consumer group (two or three blocks an SM) is the fastest at head dim 128: at
// window 512 + 5 documents 1.852 and 1.851 ms in two rounds of one call beside FlexAttention's
// 1.989 / 1.986, the wgmma 64x64 forward 1.880 and the 128x128 tma plan 2.05
// (docs/results/tma_forward_64rows/call2). At head dim 64 with those masks the length decides
// (H100, docs/PERF.md session 50): up to kShortSeqLen the wgmma 64x64 forward (GPT-2's shape
// with a window of 256 and 4 documents 0.050 ms against the 64-row tma plan's 0.052, 4
// documents 0.051 against 0.052; a window alone 0.043 against 0.041), from kLongSeqLen on three
// consumer groups (llama3-1b at S=32768 with 8 documents 2.08 ms against the wgmma forward's
// 4.72, with a window of 4096 2.26 against 3.59), and between them the 64-row tma plan
// (llama3-1b's 4 x 2048 with 4 documents 0.132 against 0.142). At head dim 128, where the query
// heads pair up, the plan of two heads a work tile with four ring stages and no turns
// (`fwd=64x64/384/tma/s4/nopp`) beat the one-head 64-row plan: window 512 + 5 documents
// 1.424-1.449 ms in four H100 calls against 1.473-1.493 (docs/PERF.md, session 49).
// The backward is the tma path's at head dims 64, 128 and 256, measured at 64 and 128 against
// the other paths (PERF.md, "The tma backward": hero causal 13.2 ms against the wgmma 64x128's
// 16.9, window + documents 5.09 against 6.06-6.57, llama3-1b at S=32768 34.1
// against 39.0, GPT-2 0.195 against the wgmma 64x64's 0.193-0.196; `flashtrain sweep
// --all-paths` on the H200 picks these rows at the hero and GPT-2 shapes, docs/SWEEP.md). Head dim
// 32 keeps the mma.sync rows, the fastest correct of `flashtrain sweep --all-paths` before the
// wgmma path (docs/SWEEP.md). sm100 takes sm90's mma.sync rows unmeasured (wgmma is sm90 only),
// sm80 the same tiles (they fit its shared memory); sm86/89 and sm120 (99 KB per block) the
// small tiles with the single-stage backward. At head dim 64 the forward's softmax bounds the
// 128x128 plan (docs/PERF.md, t6-t9); at long sequences three consumer groups (192x128) hide it
// better: llama3-1b at S=32768 9.61 ms against 10.15 (cuDNN 9.66 in another call), while short
// sequences have too few 192-row work tiles to fill 132 multiprocessors (GPT-2, S=1024: 0.071
// against 0.057 ms); the crossover is docs/PERF.md's "t9". The head-dim-64 backward takes steps
// of 128 queries with dQ split by rows (128x128): in one call beside 64x192 and 64x128 (H100,
// 2026-12-05, docs/PERF.md session 44), GPT-2 0.156 against 0.161 and 0.176 ms, llama3-1b at
// 4 x 2048 0.492 against 0.596 and 0.651, at S=32768 23.8 against 25.0 and 27.8; with a window
// or segment ids it keeps 64x128 (GPT-2's shape, window 256 and 4 documents: 0.127 against
// 128x128's 0.160, same session). Up to kShortSeqLen positions the head-dim-64
// dense forward is the 64-row plan of one consumer group (three blocks an SM): at Hq=12 and B = 8,
// 16, 32 it ran 0.050 / 0.097 / 0.193 ms at S=1024 against 128x128's 0.054 / 0.103 / 0.196, and
// 13-17% faster at S=512, while at S=2048 128x128 won by 4-8% (one call,
// docs/results/tma_rescale_slack/cross/).
constexpr DefaultRow kDefaults[] = {
    {"sm80", 256, MaskClass::dense, 0, 0, "fwd=128x64/128 bwd=64x128/256/double"},
    {"sm80", 256, MaskClass::local, 0, 0, "fwd=64x64/128 bwd=64x64/128/double"},
    {"sm86", 256, MaskClass::dense, 0, 0, "fwd=64x64/128 bwd=64x64/128/single"},
    {"sm86", 256, MaskClass::local, 0, 0, "fwd=64x64/128 bwd=64x64/128/single"},
    {"sm90", 32, MaskClass::dense, 0, 0, "fwd=128x64/128 bwd=64x128/256/double"},
    {"sm90", 32, MaskClass::local, 0, 0, "fwd=64x64/128 bwd=64x64/128/double"},
    {"sm90", 64, MaskClass::dense, kLongSeqLen, 0, "fwd=192x128/512/tma/s2/pp bwd=128x128/384/tma"},
    {"sm90", 64, MaskClass::dense, 0, kShortSeqLen, "fwd=64x64/256/tma bwd=128x128/384/tma"},
    {"sm90", 64, MaskClass::dense, 0, 0, "fwd=128x128/384/tma/s2/pp bwd=128x128/384/tma"},
    {"sm90", 128, MaskClass::dense, 0, 0, "fwd=128x128/384/tma/s2/nopp bwd=64x128/384/tma"},
    {"sm90", 256, MaskClass::dense, 0, 0, "fwd=128x80/384/tma/s2/pp bwd=64x64/384/tma"},
    {"sm90", 64, MaskClass::local, kLongSeqLen, 0, "fwd=192x128/512/tma/s2/pp bwd=64x128/384/tma"},
    {"sm90", 64, MaskClass::local, 0, kShortSeqLen, "fwd=64x64/128/wgmma bwd=64x128/384/tma"},
    {"sm90", 64, MaskClass::local, 0, 0, "fwd=64x64/256/tma bwd=64x128/384/tma"},
    {"sm90", 128, MaskClass::local, 0, 0, "fwd=64x64/384/tma/s4/nopp bwd=64x128/384/tma", 2},
    {"sm90", 128, MaskClass::local, 0, 0, "fwd=64x64/256/tma bwd=64x128/384/tma"},
    {"sm90", 256, MaskClass::local, 0, 0, "fwd=128x64/384/tma/s2/pp bwd=64x64/384/tma"},
    {"sm100", 256, MaskClass::dense, 0, 0, "fwd=128x64/128 bwd=64x128/256/double"},
    {"sm100", 256, MaskClass::local, 0, 0, "fwd=64x64/128 bwd=64x64/128/double"},
    {"sm120", 256, MaskClass::dense, 0, 0, "fwd=64x64/128 bwd=64x64/128/single"},
    {"sm120", 256, MaskClass::local, 0, 0, "fwd=64x64/128 bwd=64x64/128/single"},
};

// kDefaults' configurations, parsed once: the rows are text so that they read as `--config`
// does, and a call must not pay for the parse (regular expressions) every time.
const std::vector<KernelConfig>& parsed_defaults() {
  static const std::vector<KernelConfig> parsed = [] {
    std::vector<KernelConfig> rows;
    for (const DefaultRow& row : kDefaults) rows.push_back(KernelConfig::parse(row.config));
    return rows;
  }();
  return parsed;
}

}  // namespace

KernelConfig default_config(const DeviceLimits& device, int64_t head_dim, MaskClass mask_class,
                            int64_t seq_len, int64_t group) {
  const std::string family = arch_family(device.compute_capability);
  const std::vector<KernelConfig>& parsed = parsed_defaults();
  for (size_t i = 0; i < std::size(kDefaults); ++i) {
    const DefaultRow& row = kDefaults[i];
    if (family == row.family && head_dim <= row.max_head_dim && mask_class == row.mask_class &&
        seq_len >= row.min_seq_len &&
        (row.max_seq_len == 0 || (seq_len > 0 && seq_len <= row.max_seq_len)) &&
        group % row.group_multiple == 0) {
      return parsed[i];
    }
  }
  return parsed[0];
}

KernelConfig default_config(const DeviceLimits& device, const Problem& problem) {
  return with_deterministic_backward(
      default_config(device, problem.head_dim, mask_class_of(problem.mask), problem.seq_len,
                     problem.group_size()),
      device, problem);
}

KernelConfig with_deterministic_backward(KernelConfig c, const DeviceLimits& device,
                                         const Problem& problem) {
  if (problem.deterministic && c.backward_path != BackwardPath::tma &&
      arch_family(device.compute_capability) == "sm90") {
    for (const TmaBackwardPlan& plan : kTmaBackwardPlans) {
      if (plan.head_dim == problem.head_dim) {
        c = with_tma_backward(c, plan);
        break;
      }
    }
  }
  return c;
}

}  // namespace ft::attention

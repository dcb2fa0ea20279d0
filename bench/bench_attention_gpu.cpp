// GPU attention benchmark, flashtrain's side: our CUDA flash kernels (and the naive baseline
// where its S x S probabilities fit) on the training shapes, forward and backward timed
// separately. bench/torch_attention_peer.py times PyTorch on the same cases and
// bench/attention_gpu.sh runs both and prints the comparison table.
//
// Cases (every one causal, bf16; the shape flags override the preset of each chosen case):
//   hero-causal       B=32 S=4096 Hq=16 Hkv=4 D=128
//   hero-window-docs  the same + sliding window 512 + 5 documents per row (boundary k at
//                     k*S/5 + (row % 64), so rows do not share tile edges)
//   gpt2              B=8 S=1024 Hq=Hkv=12 D=64
//   llama-long        B=1 S=32768 Hq=32 Hkv=8 D=64 (llama3-1b's attention at long context)
//   hero-d256         B=32 S=4096 Hq=16 Hkv=4 D=256
// --config may be given several times (or as a ';' list): each configuration is timed on every
// case, the first one being "ours" in the comparison table. A direction whose kernels a
// configuration cannot run (can_implement) gets a row with the reason instead of timings.
// --deterministic also times each configuration's backward in deterministic mode (a row of its
// own, "<config> deterministic"), so the mode's cost is printed beside the default.
// --packed also times each flash configuration on the layout training hands attention: q, k
// and v read in place from one fused projection output [B, S, (Hq + 2 Hkv) D] and dq, dk, dv
// written into one buffer of that shape (forward_packed, backward_packed; a row of its own,
// "<config> packed").
//
// Method (DESIGN.md): CUDA events on ft::cuda::current_stream() around every call, after
// --warmup calls and at least --warmup-ms of them; median, min and max of --iters calls. Inputs
// rotate through enough copies that together they exceed 4x the L2 cache. Before the timed calls
// the stream is given a queue of memsets long enough to cover the host's work for all of them, so
// that the host's per-call checks and allocations overlap kernels instead of showing up as idle
// time between events. FLOPs = 4 * attended pairs * D forward (Problem::attended_pairs), 2.5x that
// backward.
//
// Output: one JSON line per (case, impl, direction) on stdout, after one "meta" line naming the
// GPU; progress and refusals on stderr.
//
//   build-gpu/carry/bench_attention_gpu --case hero-causal --config "fwd=128x64/128"
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "attention/attention.h"
#include "attention/kernel_config.h"
#include "core/device.h"
#include "core/rng.h"
#include "sweep/shapes.h"

#ifdef FLASHTRAIN_WITH_CUDA
#include "core/cuda/check.h"
#include "core/cuda/event_timer.h"
#include "core/cuda/runtime.h"
#endif

namespace {

using namespace ft;
using namespace ft::attention;
using nlohmann::json;

struct Options {
  std::vector<std::string> cases{"all"};
  std::vector<std::string> impls{"auto"};
  // -1: keep the preset's value.
  int64_t batch = -1, seq_len = -1, q_heads = -1, kv_heads = -1, head_dim = -1, window = -1,
          docs = -1;
  std::string dtype = "bf16";
  std::string dirs = "both";         // fwd, bwd or both
  std::vector<std::string> configs;  // none: default_config() of the device for the case
  bool deterministic = false;        // also time each flash backward in deterministic mode
  bool packed = false;               // also time each flash configuration on a fused qkv buffer
  int warmup = 5, iters = 20, max_sets = 64;
  double warmup_ms = 300.0;    // and keep warming up until this much time has passed
  double naive_max_gib = 2.0;  // auto runs naive when one set's probabilities fit in this
};

#ifdef FLASHTRAIN_WITH_CUDA

struct CaseSpec {
  std::string name;
  int64_t batch = 0, seq_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  int64_t window = 0;  // 0: causal only
  int64_t docs = 0;    // documents per row; 0: no segment ids
};

const std::vector<CaseSpec>& preset_cases() {
  static const std::vector<CaseSpec> cases = {
      {"hero-causal", 32, 4096, 16, 4, 128, 0, 0},
      {"hero-window-docs", 32, 4096, 16, 4, 128, 512, 5},
      {"gpt2", 8, 1024, 12, 12, 64, 0, 0},
      {"llama-long", 1, 32768, 32, 8, 64, 0, 0},
      {"hero-d256", 32, 4096, 16, 4, 256, 0, 0},
  };
  return cases;
}

// N(0, 1) inputs drawn on the CPU, one thread per group of batch rows: the hero inputs are over
// a billion samples, too slow for one thread.
Tensor random_cpu(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t rows = shape[0];
  const int64_t workers =
      std::clamp<int64_t>(std::thread::hardware_concurrency(), int64_t{1}, rows);
  Rng seeder(seed);
  std::vector<uint64_t> row_seeds(static_cast<size_t>(rows));
  for (uint64_t& s : row_seeds) s = seeder.next_u64();
  std::vector<std::thread> pool;
  for (int64_t w = 0; w < workers; ++w) {
    pool.emplace_back([&t, &row_seeds, rows, workers, w] {
      for (int64_t r = w; r < rows; r += workers) {
        Tensor row = t.slice(r, r + 1);
        Rng rng(row_seeds[static_cast<size_t>(r)]);
        fill_normal(row, rng);
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return t;
}

struct InputSet {
  Tensor q, k, v, dout;
  Tensor qkv;  // [B, S, (Hq + 2 Hkv) D], with --packed only
};

struct Stats {
  double median_ms = 0, min_ms = 0, max_ms = 0, host_ms = 0;
};

Stats summarize(std::vector<double> ms, double host_ms) {
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  const double median = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return {median, ms.front(), ms.back(), host_ms};
}

void emit(const json& row) {
  std::printf("%s\n", row.dump().c_str());
  std::fflush(stdout);
}

bool wants(const std::vector<std::string>& list, const std::string& name) {
  return std::find(list.begin(), list.end(), name) != list.end();
}

std::vector<CaseSpec> chosen_cases(const Options& opt) {
  std::vector<CaseSpec> out;
  for (const CaseSpec& preset : preset_cases()) {
    if (!wants(opt.cases, "all") && !wants(opt.cases, preset.name)) continue;
    CaseSpec c = preset;
    auto keep_or = [](int64_t flag, int64_t preset_value) {
      return flag >= 0 ? flag : preset_value;
    };
    c.batch = keep_or(opt.batch, c.batch);
    c.seq_len = keep_or(opt.seq_len, c.seq_len);
    c.q_heads = keep_or(opt.q_heads, c.q_heads);
    c.kv_heads = keep_or(opt.kv_heads, c.kv_heads);
    c.head_dim = keep_or(opt.head_dim, c.head_dim);
    c.window = keep_or(opt.window, c.window);
    c.docs = keep_or(opt.docs, c.docs);
    out.push_back(c);
  }
  for (const std::string& name : opt.cases) {
    bool known = name == "all";
    for (const CaseSpec& preset : preset_cases()) known = known || preset.name == name;
    FT_CHECK(known, "unknown case '", name,
             "' (allowed: all, hero-causal, hero-window-docs, gpt2, llama-long, hero-d256)");
  }
  return out;
}

// Keeps the GPU busy while the host queues the timed calls (see the comment on top).
class QueueAhead {
 public:
  QueueAhead() : scratch_(Tensor::empty({kBytes / 4}, DType::f32, Device::cuda)) {
    scratch_.zero();
    cuda::EventTimer timer(1);
    timer.start(0);
    for (int i = 0; i < 4; ++i) scratch_.zero();
    timer.stop(0);
    fill_ms_ = std::max(timer.elapsed_ms()[0] / 4.0, 1e-3);
  }
  void enqueue(double ms) {
    const int fills = static_cast<int>(std::ceil(std::min(ms, kMaxMs) / fill_ms_));
    for (int i = 0; i < fills; ++i) scratch_.zero();
  }

 private:
  static constexpr int64_t kBytes = int64_t{256} << 20;
  static constexpr double kMaxMs = 500.0;
  Tensor scratch_;
  double fill_ms_ = 1.0;
};

double host_now_ms() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Calls call(0 .. warmup-1) untimed, and more until --warmup-ms have passed (the GPU's clocks
// settle under a sustained load: a short warm-up times a cold or a boosted card), then
// call(0 .. iters-1) each between two events.
Stats time_calls(const std::function<void(int)>& call, const Options& opt, QueueAhead& queue) {
  double host_ms = 1.0;  // per call; measured below when there are calls to spare
  if (opt.warmup > 0) {
    call(0);  // the first call pays one-time costs (module load, smem attributes, handles)
    cuda::synchronize();
    const double t0 = host_now_ms();
    for (int w = 1; w < opt.warmup; ++w) call(w);
    if (opt.warmup > 1) host_ms = (host_now_ms() - t0) / (opt.warmup - 1);
    cuda::synchronize();
    for (int w = opt.warmup; host_now_ms() - t0 < opt.warmup_ms; ++w) {
      call(w);
      if (w % 8 == 0) cuda::synchronize();  // a bounded queue, and the clock is the GPU's
    }
    cuda::synchronize();
  }
  cuda::EventTimer timer(opt.iters);
  queue.enqueue(1.25 * host_ms * opt.iters + 0.2);
  for (int i = 0; i < opt.iters; ++i) {
    timer.start(i);
    call(i);
    timer.stop(i);
  }
  return summarize(timer.elapsed_ms(), host_ms);
}

struct Context {
  Options opt;
  DeviceLimits limits;
  std::string gpu;
  int64_t l2_bytes = 0;
  QueueAhead* queue = nullptr;
};

json base_row(const CaseSpec& c, const Problem& p, Impl impl, const char* dir, int64_t pairs,
              const Context& ctx) {
  const double fwd_flop = 4.0 * static_cast<double>(pairs) * static_cast<double>(p.head_dim);
  return json{{"side", "flashtrain"},
              {"impl", impl_name(impl)},
              {"case", c.name},
              {"dir", dir},
              {"batch", p.batch},
              {"seq_len", p.seq_len},
              {"q_heads", p.q_heads},
              {"kv_heads", p.kv_heads},
              {"head_dim", p.head_dim},
              {"dtype", dtype_name(p.dtype)},
              {"mask", p.mask.describe()},
              {"deterministic", p.deterministic},
              {"window", c.window},
              {"docs", c.docs},
              {"pairs", pairs},
              {"flop", std::string(dir) == "fwd" ? fwd_flop : 2.5 * fwd_flop},
              {"warmup", ctx.opt.warmup},
              {"iters", ctx.opt.iters},
              {"gpu", ctx.gpu}};
}

void add_stats(json& row, const Stats& s) {
  row["median_ms"] = s.median_ms;
  row["min_ms"] = s.min_ms;
  row["max_ms"] = s.max_ms;
  row["host_ms_per_call"] = s.host_ms;
  row["tflops"] = row["flop"].get<double>() / (s.median_ms * 1e9);
}

std::vector<Impl> impls_for(const Options& opt, const Problem& p) {
  if (!wants(opt.impls, "auto")) {
    std::vector<Impl> out;
    for (const std::string& name : opt.impls) out.push_back(parse_impl(name));
    return out;
  }
  const double probs_gib = 4.0 * static_cast<double>(p.batch * p.q_heads) *
                           static_cast<double>(p.seq_len * p.seq_len) / (1 << 30);
  if (probs_gib <= opt.naive_max_gib) return {Impl::flash, Impl::naive};
  return {Impl::flash};
}

// Enough input sets that together they exceed 4x the L2 cache, so no call reads its inputs
// from the cache the previous call warmed.
int input_set_count(const Problem& p, const Context& ctx) {
  const int64_t q_bytes =
      p.batch * p.seq_len * p.q_heads * p.head_dim * static_cast<int64_t>(dtype_size(p.dtype));
  const int64_t kv_bytes = q_bytes / p.group_size();
  int64_t set_bytes = 2 * q_bytes + 2 * kv_bytes;           // q, dout, k, v
  if (ctx.opt.packed) set_bytes += q_bytes + 2 * kv_bytes;  // and qkv
  const int64_t sets = (4 * ctx.l2_bytes + set_bytes - 1) / set_bytes;
  return static_cast<int>(std::clamp<int64_t>(sets, 1, ctx.opt.max_sets));
}

std::vector<InputSet> make_input_sets(const Problem& p, int count, bool packed) {
  const Shape q_shape{p.batch, p.seq_len, p.q_heads, p.head_dim};
  const Shape kv_shape{p.batch, p.seq_len, p.kv_heads, p.head_dim};
  const Shape qkv_shape{p.batch, p.seq_len, (p.q_heads + 2 * p.kv_heads) * p.head_dim};
  std::vector<InputSet> sets;
  for (int i = 0; i < count; ++i) {
    const uint64_t seed = 1000 + 10 * static_cast<uint64_t>(i);
    sets.push_back({random_cpu(q_shape, p.dtype, seed).to(Device::cuda),
                    random_cpu(kv_shape, p.dtype, seed + 1).to(Device::cuda),
                    random_cpu(kv_shape, p.dtype, seed + 2).to(Device::cuda),
                    random_cpu(q_shape, p.dtype, seed + 3).to(Device::cuda),
                    packed ? random_cpu(qkv_shape, p.dtype, seed + 4).to(Device::cuda) : Tensor()});
  }
  return sets;
}

// What one run_impl call times: both directions on q, k, v of their own; the backward alone
// (the deterministic mode's row); or both directions on the fused qkv buffer (--packed).
enum class Variant { plain, backward_only, packed };

// Forward, then backward of one implementation on one case (flash: with configuration `text`,
// "" for the device's default): a row each, with the error text in place of timings when a
// call throws or can_implement refuses the direction.
void run_impl(const CaseSpec& c, const Problem& p, Impl impl, const std::string& text,
              const std::vector<InputSet>& sets, const Tensor& seg_gpu, int64_t pairs, Context& ctx,
              Variant variant = Variant::plain) {
  const bool backward_only = variant == Variant::backward_only;
  const bool packed = variant == Variant::packed;
  const KernelConfig* config = nullptr;
  KernelConfig flash_config;
  std::string config_text;
  std::string refused[2];  // forward, backward
  if (impl == Impl::flash) {
    try {
      const KernelConfig base = default_config(ctx.limits, p);
      flash_config = text.empty() ? base : KernelConfig::parse(text, base);
      // fp32 flash has fixed kernels (CUDA cores): a configuration names bf16 tiles only, and
      // the row says so rather than name tiles that did not run.
      const std::string named = p.dtype != DType::f32 ? flash_config.str()
                                : text.empty()        ? std::string("fp32 kernels")
                                               : "fp32 kernels (" + text + " applies to bf16)";
      config_text = named + (p.deterministic ? " deterministic" : "") + (packed ? " packed" : "");
      config = &flash_config;
    } catch (const std::exception& e) {
      for (const char* dir : {"fwd", "bwd"}) {
        json row = base_row(c, p, impl, dir, pairs, ctx);
        row["config"] = text;
        row["error"] = e.what();
        emit(row);
      }
      return;
    }
    refused[0] = can_implement(flash_config, p, ctx.limits, KernelDirection::forward);
    refused[1] = can_implement(flash_config, p, ctx.limits, KernelDirection::backward);
  }
  const int n = static_cast<int>(sets.size());
  std::vector<ForwardOutput> saved;
  Tensor dqkv;  // --packed: the backward's one output buffer, written by every call
  if (packed) dqkv = Tensor::empty(sets.front().qkv.shape(), p.dtype, Device::cuda);
  for (const char* dir : {"fwd", "bwd"}) {
    if (ctx.opt.dirs != "both" && ctx.opt.dirs != dir) continue;
    if (backward_only && std::string(dir) == "fwd") continue;
    json row = base_row(c, p, impl, dir, pairs, ctx);
    row["input_sets"] = n;
    if (config) row["config"] = config_text;
    const std::string& why = refused[std::string(dir) == "fwd" ? 0 : 1];
    if (!why.empty()) {
      std::fprintf(stderr, "%s flash %s: config %s refused: %s\n", c.name.c_str(), dir,
                   config_text.c_str(), why.c_str());
      row["error"] = "can_implement: " + why;
      emit(row);
      continue;
    }
    try {
      Stats s;
      if (std::string(dir) == "fwd") {
        s = time_calls(
            [&](int i) {
              const InputSet& in = sets[i % n];
              if (packed) {
                (void)forward_packed(impl, p, in.qkv, seg_gpu, config);
              } else {
                (void)forward(impl, p, in.q, in.k, in.v, seg_gpu, config);
              }
            },
            ctx.opt, *ctx.queue);
      } else {
        // One forward per set for backward to read, made after the forward timing so that
        // naive's probabilities are not resident while the forward is timed.
        for (const InputSet& in : sets) {
          saved.push_back(packed ? forward_packed(impl, p, in.qkv, seg_gpu, config)
                                 : forward(impl, p, in.q, in.k, in.v, seg_gpu, config));
        }
        s = time_calls(
            [&](int i) {
              const InputSet& in = sets[i % n];
              if (packed) {
                backward_packed(impl, p, in.qkv, saved[i % n], in.dout, dqkv, seg_gpu, config);
              } else {
                (void)backward(impl, p, in.q, in.k, in.v, saved[i % n], in.dout, seg_gpu, config);
              }
            },
            ctx.opt, *ctx.queue);
      }
      add_stats(row, s);
      std::fprintf(stderr, "%s %s %s: %.3f ms (%.3f .. %.3f), %.1f TFLOP/s\n", c.name.c_str(),
                   impl_name(impl), dir, s.median_ms, s.min_ms, s.max_ms,
                   row["tflops"].get<double>());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s %s %s: %s\n", c.name.c_str(), impl_name(impl), dir, e.what());
      row["error"] = e.what();
      try {
        cuda::synchronize();  // surfaces an asynchronous fault here, not in the next case
      } catch (const std::exception&) {
      }
    }
    emit(row);
  }
}

void run_case(const CaseSpec& c, Context& ctx) {
  Mask mask;
  mask.causal = true;
  mask.window = c.window;
  mask.has_segments = c.docs > 0;
  Problem p;
  p.batch = c.batch;
  p.seq_len = c.seq_len;
  p.q_heads = c.q_heads;
  p.kv_heads = c.kv_heads;
  p.head_dim = c.head_dim;
  p.dtype = parse_dtype(ctx.opt.dtype);
  p.mask = mask;
  p.validate();
  const Tensor seg_cpu =
      mask.has_segments ? sweep::document_ids(c.batch, c.seq_len, c.docs) : Tensor();
  const Tensor seg_gpu = seg_cpu.defined() ? seg_cpu.to(Device::cuda) : Tensor();
  const int64_t pairs = p.attended_pairs(seg_cpu);
  const int count = input_set_count(p, ctx);
  std::fprintf(stderr, "%s: %s, %lld attended pairs, %d input set(s)\n", c.name.c_str(),
               p.describe().c_str(), static_cast<long long>(pairs), count);
  const std::vector<InputSet> sets = make_input_sets(p, count, ctx.opt.packed);
  // With --deterministic each flash configuration's backward is timed a second time in
  // deterministic mode (its own row, "... deterministic" in the config column).
  Problem deterministic = p;
  deterministic.deterministic = true;
  const bool also_deterministic = ctx.opt.deterministic && ctx.opt.dirs != "fwd";
  for (Impl impl : impls_for(ctx.opt, p)) {
    const std::vector<std::string> texts = impl != Impl::flash || ctx.opt.configs.empty()
                                               ? std::vector<std::string>{""}
                                               : ctx.opt.configs;
    for (const std::string& text : texts) {
      run_impl(c, p, impl, text, sets, seg_gpu, pairs, ctx);
      if (impl == Impl::flash && also_deterministic) {
        run_impl(c, deterministic, impl, text, sets, seg_gpu, pairs, ctx, Variant::backward_only);
      }
      if (impl == Impl::flash && ctx.opt.packed) {
        run_impl(c, p, impl, text, sets, seg_gpu, pairs, ctx, Variant::packed);
      }
    }
  }
}

int run(const Options& opt) {
  if (cuda_device_count() == 0) {
    std::fprintf(stderr, "bench_attention_gpu: no CUDA device: %s\n",
                 cuda_unavailable_reason().c_str());
    return 2;
  }
  cuda::init_device(0);
  Context ctx;
  ctx.opt = opt;
  ctx.limits = DeviceLimits::current();
  const int device = cuda_current_device();
  ctx.gpu = cuda_device_name(device);
  int l2 = 0, driver = 0, runtime = 0;
  FT_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  FT_CUDA_CHECK(cudaDriverGetVersion(&driver));
  FT_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  ctx.l2_bytes = l2;
  auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  emit(json{{"side", "flashtrain"},
            {"meta", true},
            {"gpu", ctx.gpu},
            {"arch", ctx.limits.arch},
            {"sms", cuda_sm_count(device)},
            {"l2_bytes", ctx.l2_bytes},
            {"cuda_driver_api", version(driver)},
            {"cuda_runtime", version(runtime)},
            {"config_flags", opt.configs}});
  QueueAhead queue;
  ctx.queue = &queue;
  for (const CaseSpec& c : chosen_cases(opt)) {
    try {
      run_case(c, ctx);
    } catch (const std::exception& e) {  // a bad shape or no memory for the inputs
      std::fprintf(stderr, "%s: %s\n", c.name.c_str(), e.what());
      for (const char* dir : {"fwd", "bwd"}) {
        emit(json{{"side", "flashtrain"},
                  {"impl", "flash"},
                  {"case", c.name},
                  {"dir", dir},
                  {"batch", c.batch},
                  {"seq_len", c.seq_len},
                  {"q_heads", c.q_heads},
                  {"kv_heads", c.kv_heads},
                  {"head_dim", c.head_dim},
                  {"dtype", opt.dtype},
                  {"window", c.window},
                  {"docs", c.docs},
                  {"gpu", ctx.gpu},
                  {"error", e.what()}});
      }
    }
  }
  return 0;
}

#else

int run(const Options&) {
  std::fprintf(stderr,
               "bench_attention_gpu: flashtrain was built without CUDA; configure on a machine "
               "with the CUDA toolkit (FLASHTRAIN_CUDA=ON) to benchmark the GPU kernels\n");
  return 2;
}

#endif

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"GPU attention benchmark: flashtrain flash (and naive), forward and backward"};
  app.add_option("--case", opt.cases,
                 "cases: all, hero-causal, hero-window-docs, gpt2, llama-long, hero-d256")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--impl", opt.impls,
                 "flash, naive, or auto (flash, plus naive where its probabilities fit)")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--batch", opt.batch, "batch size (default: the case's)");
  app.add_option("--seq-len", opt.seq_len, "sequence length (default: the case's)");
  app.add_option("--q-heads", opt.q_heads, "query heads (default: the case's)");
  app.add_option("--kv-heads", opt.kv_heads, "kv heads (default: the case's)");
  app.add_option("--head-dim", opt.head_dim, "head dim (default: the case's)");
  app.add_option("--window", opt.window, "sliding window, 0 = none (default: the case's)");
  app.add_option("--docs", opt.docs, "documents per row, 0 = no segment ids (default: the case's)");
  app.add_option("--dtype", opt.dtype, "bf16 or fp32")->capture_default_str();
  app.add_option("--dir", opt.dirs, "directions to time: fwd, bwd or both")
      ->check(CLI::IsMember({"fwd", "bwd", "both"}))
      ->capture_default_str();
  app.add_option("--config", opt.configs,
                 "flash kernel config, e.g. \"fwd=128x128/384/tma/s2/pp bwd=64x128/256/wgmma\" "
                 "(parts left out keep the device default); repeat it, or separate with ';', to "
                 "time several (the first is 'ours' in the table)")
      ->delimiter(';');
  app.add_flag("--deterministic", opt.deterministic,
               "also time each flash backward in deterministic mode (bit-identical dq, dk, dv; "
               "the tma backward only): its own row beside the default");
  app.add_flag("--packed", opt.packed,
               "also time each flash configuration on training's layout: q, k, v read in place "
               "from one fused [B, S, (Hq + 2 Hkv) D] buffer, dq, dk, dv written into one: its "
               "own row beside the default");
  app.add_option("--warmup", opt.warmup, "untimed calls first")->capture_default_str();
  app.add_option("--warmup-ms", opt.warmup_ms,
                 "and untimed calls until this many milliseconds have passed (settled clocks)")
      ->capture_default_str();
  app.add_option("--iters", opt.iters, "timed calls (median, min, max)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-sets", opt.max_sets, "at most this many rotated input sets")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--naive-max-gib", opt.naive_max_gib,
                 "auto runs naive when B*Hq*S*S fp32 probabilities fit in this")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(opt);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_attention_gpu: %s\n", e.what());
    return 1;
  }
}

// CPU attention benchmark: flash vs naive, full causal vs causal + sliding window, forward and
// forward + backward, median of --repeats timed runs after one warm-up run.
//
// Reports milliseconds, the attended (query, key) pairs, and the rate in GFLOP/s counted as
// 4 * pairs * D forward and 2.5x that backward (DESIGN.md), so that a skipped tile shows up as
// time saved rather than as a higher rate. The headline numbers are the window/causal speedup
// of flash forward (issue 3 asks for >= 5x at S = 8192, window 512) and flash vs naive.
//
//   OMP_NUM_THREADS=2 build/bench_attention_cpu --seq-len 8192 --head-dim 64 --window 512
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include "attention/attention.h"
#include "core/blas.h"
#include "core/rng.h"

namespace {

using namespace ft;
using namespace ft::attention;

struct Options {
  int64_t batch = 1, heads = 1, seq_len = 8192, head_dim = 64, window = 512;
  int repeats = 5;
  bool skip_naive = false;
};

double median_ms(int repeats, const std::function<void()>& run) {
  run();  // warm-up: page faults, thread pool start
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct Timing {
  double forward_ms, forward_backward_ms;
};

Timing time_impl(Impl impl, const Problem& p, const Tensor& q, const Tensor& k, const Tensor& v,
                 const Tensor& dout, int repeats) {
  Timing t{};
  t.forward_ms = median_ms(repeats, [&] { forward(impl, p, q, k, v); });
  t.forward_backward_ms = median_ms(repeats, [&] {
    const ForwardOutput f = forward(impl, p, q, k, v);
    backward(impl, p, q, k, v, f, dout);
  });
  return t;
}

void print_row(Impl impl, const Problem& p, const Timing& t) {
  const double pairs = static_cast<double>(p.attended_pairs());
  const double fwd_flop = 4.0 * pairs * static_cast<double>(p.head_dim);
  std::printf("%-6s %-18s %12.0f %10.1f %12.1f %10.1f %12.1f\n", impl_name(impl),
              p.mask.describe().c_str(), pairs, t.forward_ms, fwd_flop / t.forward_ms * 1e-6,
              t.forward_backward_ms, 3.5 * fwd_flop / t.forward_backward_ms * 1e-6);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"CPU attention benchmark: flash vs naive, causal vs causal + window"};
  app.add_option("--batch", opt.batch, "batch size")->capture_default_str();
  app.add_option("--heads", opt.heads, "query heads (= kv heads)")->capture_default_str();
  app.add_option("--seq-len", opt.seq_len, "sequence length")->capture_default_str();
  app.add_option("--head-dim", opt.head_dim, "head dim")->capture_default_str();
  app.add_option("--window", opt.window, "sliding window of the windowed run")
      ->capture_default_str();
  app.add_option("--repeats", opt.repeats, "timed runs per measurement (median)")
      ->capture_default_str();
  app.add_flag("--skip-naive", opt.skip_naive, "time flash only (naive needs B*H*S*S*4 bytes)");
  CLI11_PARSE(app, argc, argv);

  Rng rng(1);
  const Shape shape{opt.batch, opt.seq_len, opt.heads, opt.head_dim};
  Tensor q = Tensor::empty(shape, DType::f32), k = Tensor::empty(shape, DType::f32);
  Tensor v = Tensor::empty(shape, DType::f32), dout = Tensor::empty(shape, DType::f32);
  for (Tensor* t : {&q, &k, &v, &dout}) fill_normal(*t, rng);
  Mask causal;
  causal.causal = true;
  Mask windowed = causal;
  windowed.window = opt.window;
  const Problem p_causal = make_problem(q, k, v, causal);
  const Problem p_window = make_problem(q, k, v, windowed);

  std::printf("CPU attention, %d threads, B=%lld S=%lld H=%lld D=%lld fp32, median of %d\n",
              ft::cpu::num_threads(), static_cast<long long>(opt.batch),
              static_cast<long long>(opt.seq_len), static_cast<long long>(opt.heads),
              static_cast<long long>(opt.head_dim), opt.repeats);
  std::printf("%-6s %-18s %12s %10s %12s %10s %12s\n", "impl", "mask", "pairs", "fwd ms",
              "fwd GFLOP/s", "f+b ms", "f+b GFLOP/s");
  const Timing flash_causal = time_impl(Impl::flash, p_causal, q, k, v, dout, opt.repeats);
  print_row(Impl::flash, p_causal, flash_causal);
  const Timing flash_window = time_impl(Impl::flash, p_window, q, k, v, dout, opt.repeats);
  print_row(Impl::flash, p_window, flash_window);
  std::printf("flash forward, causal / window=%lld: %.2fx faster (attended pairs ratio %.2fx)\n",
              static_cast<long long>(opt.window), flash_causal.forward_ms / flash_window.forward_ms,
              static_cast<double>(p_causal.attended_pairs()) /
                  static_cast<double>(p_window.attended_pairs()));
  if (opt.skip_naive) return 0;
  const Timing naive_causal = time_impl(Impl::naive, p_causal, q, k, v, dout, opt.repeats);
  print_row(Impl::naive, p_causal, naive_causal);
  const Timing naive_window = time_impl(Impl::naive, p_window, q, k, v, dout, opt.repeats);
  print_row(Impl::naive, p_window, naive_window);
  std::printf("flash vs naive, causal: forward %.2fx, forward+backward %.2fx\n",
              naive_causal.forward_ms / flash_causal.forward_ms,
              naive_causal.forward_backward_ms / flash_causal.forward_backward_ms);
  std::printf("flash vs naive, window=%lld: forward %.2fx, forward+backward %.2fx\n",
              static_cast<long long>(opt.window), naive_window.forward_ms / flash_window.forward_ms,
              naive_window.forward_backward_ms / flash_window.forward_backward_ms);
  return 0;
}

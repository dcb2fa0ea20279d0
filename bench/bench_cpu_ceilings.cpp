// The CPU's ceilings, the floors under the CPU numbers of docs/PERF.md: the fp32 GEMM rate of
// the OpenBLAS the library calls (cpu::gemm, square sizes, C = A B) and the memory bandwidth of
// the STREAM kernels (copy a = b, triad a = b + s c, over arrays far larger than the caches),
// each with 1 thread and with every thread OpenMP has. Best of --repeats timed runs after a
// warm-up (ceilings, not typical values: the best run is the one the machine's other work
// disturbed least). Bytes counted as STREAM counts them (copy 8, triad 12 bytes an fp32 element:
// no write-allocate traffic).
//
//   build/bench_cpu_ceilings                       # GEMM 512..4096, arrays of 64 M floats
//   build/bench_cpu_ceilings --gemm 2048 --mib 512 --repeats 10
#include <omp.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "core/blas.h"
#include "core/rng.h"
#include "core/tensor.h"

namespace {

using namespace ft;

struct Options {
  std::vector<int64_t> gemm_sizes = {512, 1024, 2048, 4096};
  int64_t mib = 256;  // each STREAM array
  int repeats = 5;
};

// Seconds of the fastest of `repeats` runs, after one warm-up run.
double best_seconds(int repeats, const std::function<void()>& run) {
  run();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

double gemm_gflops(int64_t n, int repeats) {
  Rng rng(7);
  Tensor a = Tensor::empty({n, n}, DType::f32), b = Tensor::empty({n, n}, DType::f32);
  Tensor c = Tensor::zeros({n, n}, DType::f32);
  fill_normal(a, rng);
  fill_normal(b, rng);
  const double s = best_seconds(repeats, [&] {
    cpu::gemm(false, false, n, n, n, 1.0f, a.data<float>(), n, b.data<float>(), n, 0.0f,
              c.data<float>(), n);
  });
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / s / 1e9;
}

struct Stream {
  double copy_gbs, triad_gbs;
};

Stream stream_gbs(int64_t mib, int repeats) {
  const int64_t n = mib * 1024 * 1024 / 4;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n)),
      c(static_cast<size_t>(n));
  // First touch by the threads that use them (pages land near their cores).
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 0.0f;
    b[i] = 1.0f;
    c[i] = 2.0f;
  }
  float* pa = a.data();
  const float* pb = b.data();
  const float* pc = c.data();
  const double copy_s = best_seconds(repeats, [&] {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i];
  });
  const double triad_s = best_seconds(repeats, [&] {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) pa[i] = pb[i] + 3.0f * pc[i];
  });
  const auto bytes = static_cast<double>(n) * 4.0;
  return {2.0 * bytes / copy_s / 1e9, 3.0 * bytes / triad_s / 1e9};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{
      "The CPU's fp32 GEMM rate (OpenBLAS) and memory bandwidth (STREAM copy and "
      "triad), with 1 thread and with every thread OpenMP has: the ceilings of "
      "docs/PERF.md's CPU numbers."};
  app.add_option("--gemm", o.gemm_sizes, "square GEMM sizes n (C[n,n] = A[n,n] B[n,n])")
      ->check(CLI::Range(int64_t{16}, int64_t{16384}));
  app.add_option("--mib", o.mib, "size of each of the three STREAM arrays in MiB")
      ->check(CLI::Range(int64_t{16}, int64_t{8192}));
  app.add_option("--repeats", o.repeats, "timed runs after a warm-up; the best is reported")
      ->check(CLI::Range(1, 1000));
  CLI11_PARSE(app, argc, argv);

  const int all = omp_get_max_threads();
  std::vector<int> thread_counts = {1};
  if (all > 1) thread_counts.push_back(all);
  std::printf("OpenBLAS %s, core %s; OpenMP threads: %d\n", cpu::blas_config().c_str(),
              cpu::blas_core_name().c_str(), all);
  std::printf("%-28s", "");
  for (const int t : thread_counts)
    std::printf(" %12s", (std::to_string(t) + " thread(s)").c_str());
  std::printf("\n");
  for (const int64_t n : o.gemm_sizes) {
    std::printf("%-28s", ("sgemm n=" + std::to_string(n) + " GFLOP/s").c_str());
    for (const int t : thread_counts) {
      omp_set_num_threads(t);
      std::printf(" %12.1f", gemm_gflops(n, o.repeats));
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  std::vector<Stream> streams;
  for (const int t : thread_counts) {
    omp_set_num_threads(t);
    streams.push_back(stream_gbs(o.mib, o.repeats));
  }
  std::printf("%-28s", "STREAM copy GB/s");
  for (const Stream& s : streams) std::printf(" %12.1f", s.copy_gbs);
  std::printf("\n%-28s", "STREAM triad GB/s");
  for (const Stream& s : streams) std::printf(" %12.1f", s.triad_gbs);
  std::printf("\n");
  omp_set_num_threads(all);
  return 0;
}

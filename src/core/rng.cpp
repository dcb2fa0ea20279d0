#include "core/rng.h"

#include <omp.h>

#include <atomic>

namespace ft {

namespace {

// splitmix64 advances its state by one constant per draw, so the stream can be cut anywhere:
// draw k of a stream that starts at state s is the next draw of an Rng at s + k * gamma.
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;
// Below this many elements a fill runs on the calling thread.
constexpr int64_t kParallelFrom = int64_t{1} << 16;

// Runs fill(begin, end, rng) over [0, n) in parallel chunks, each starting where the serial
// stream would be after `draws_per_element` draws per earlier element, and leaves `rng` where
// the serial loop would. fill returns false when it consumed a different number of draws (a
// rejected normal, probability 2^-53 per element); then the fill is redone serially.
template <class Fill>
void fill_in_chunks(int64_t n, Rng& rng, uint64_t draws_per_element, Fill fill) {
  const uint64_t start = rng.state();
  if (n >= kParallelFrom && omp_get_max_threads() > 1) {
    std::atomic<bool> exact{true};
#pragma omp parallel
    {
      const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
      const int64_t begin = n * id / threads, end = n * (id + 1) / threads;
      Rng local(start + static_cast<uint64_t>(begin) * draws_per_element * kGamma);
      if (!fill(begin, end, local)) exact = false;
    }
    if (exact) {
      rng.set_state(start + static_cast<uint64_t>(n) * draws_per_element * kGamma);
      return;
    }
    rng.set_state(start);
  }
  fill(0, n, rng);
}

}  // namespace

void fill_normal(Tensor& t, Rng& rng, double mean, double std) {
  FT_CHECK(t.device() == Device::cpu, "fill_normal needs a CPU tensor");
  dispatch_float(t.dtype(), [&](auto d) {
    using D = decltype(d);
    D* p = t.data<D>();
    // Rng::normal() takes two draws, more only when the first is exactly 0.
    fill_in_chunks(t.numel(), rng, 2, [&](int64_t begin, int64_t end, Rng& r) {
      const uint64_t expected = r.state() + static_cast<uint64_t>(end - begin) * 2 * kGamma;
      for (int64_t i = begin; i < end; ++i) store(p[i], mean + std * r.normal());
      return r.state() == expected;
    });
  });
}

void fill_uniform(Tensor& t, Rng& rng, double lo, double hi) {
  FT_CHECK(t.device() == Device::cpu, "fill_uniform needs a CPU tensor");
  dispatch_float(t.dtype(), [&](auto d) {
    using D = decltype(d);
    D* p = t.data<D>();
    fill_in_chunks(t.numel(), rng, 1, [&](int64_t begin, int64_t end, Rng& r) {
      for (int64_t i = begin; i < end; ++i) store(p[i], lo + (hi - lo) * r.uniform());
      return true;
    });
  });
}

}  // namespace ft

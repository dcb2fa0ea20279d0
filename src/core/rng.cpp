#include "core/rng.h"

namespace ft {

void fill_normal(Tensor& t, Rng& rng, double mean, double std) {
  FT_CHECK(t.device() == Device::cpu, "fill_normal needs a CPU tensor");
  dispatch_float(t.dtype(), [&](auto d) {
    using D = decltype(d);
    D* p = t.data<D>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) store(p[i], mean + std * rng.normal());
  });
}

void fill_uniform(Tensor& t, Rng& rng, double lo, double hi) {
  FT_CHECK(t.device() == Device::cpu, "fill_uniform needs a CPU tensor");
  dispatch_float(t.dtype(), [&](auto d) {
    using D = decltype(d);
    D* p = t.data<D>();
    for (int64_t i = 0, n = t.numel(); i < n; ++i) store(p[i], lo + (hi - lo) * rng.uniform());
  });
}

}  // namespace ft

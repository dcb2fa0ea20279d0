// Byte-for-byte comparison of two tensors, for the tests that expect bit-identical results.
#pragma once

#include <cstring>

#include "core/tensor.h"

namespace ft::test {

// True iff `a` and `b` (either on any device) have the same dtype, the same shape and the same
// bytes; both are copied to the CPU first.
inline bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.to(Device::cpu), y = b.to(Device::cpu);
  return x.dtype() == y.dtype() && x.shape() == y.shape() &&
         std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

}  // namespace ft::test

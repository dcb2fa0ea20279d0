// reference attention: the fp64 oracle. It widens every input to fp64 and runs the explicit
// S x S algorithm of naive.cpp in fp64 (scores, mask via allowed(), softmax, products through
// dgemm), so every output (o, lse, dq, dk, dv) is fp64. Its independent checks are the
// finite-difference and brute-force tests in tests/attention, and flash, which shares no code
// with it beyond allowed().
//
// Memory: like naive, O(B * Hq * S^2) fp64 probabilities; meant for tests and checks only.
#include "attention/cpu/cpu_kernels.h"

namespace ft::attention::cpu {
namespace {

Tensor widened(const Tensor& t) {
  return t.dtype() == DType::f64 ? t : t.to(DType::f64);
}

Problem in_fp64(Problem p) {
  p.dtype = DType::f64;
  return p;
}

}  // namespace

ForwardOutput reference_forward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                                const Tensor& v, const Tensor& segment_ids) {
  // A packed call hands the same tensor three times: widen it once.
  const Tensor q64 = widened(q);
  const Tensor k64 = &k == &q ? q64 : widened(k), v64 = &v == &q ? q64 : widened(v);
  return naive_forward(in_fp64(p), l, q64, k64, v64, segment_ids);
}

void reference_backward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                        const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                        const Tensor& segment_ids, Gradients& into) {
  // The oracle recomputes its own fp64 probabilities rather than trust whichever forward
  // output it is handed.
  (void)fwd;
  const Tensor q64 = widened(q);
  const Tensor k64 = &k == &q ? q64 : widened(k), v64 = &v == &q ? q64 : widened(v);
  const ForwardOutput own = naive_forward(in_fp64(p), l, q64, k64, v64, segment_ids);
  naive_backward(in_fp64(p), l, q64, k64, v64, own, widened(dout), segment_ids, into);
}

}  // namespace ft::attention::cpu

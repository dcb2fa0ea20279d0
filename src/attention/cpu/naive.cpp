// naive attention: the baseline "Matmul + Mask + Softmax + Matmul" of a framework without fused
// attention. Per (batch, head) it materialises the S x S scores, masks and normalises them in
// place into probabilities, and keeps all B * Hq * S * S probabilities for backward.
//
// Memory traffic: O(B * Hq * S^2) reads and writes of the probabilities forward and about three
// times that backward (P, dP/dS and the two products that read them); the S x S state is what
// flash avoids. Products run through BLAS (multi-threaded inside one call); the row-wise
// mask/softmax loops run on OpenMP threads. Compute is in acc_t<T> (fp32 for fp32 and bf16).
#include <cmath>

#include "attention/cpu/cpu_kernels.h"
#include "core/blas.h"

namespace ft::attention::cpu {
namespace {

// Masks and normalises each row of scores [S, S] in place; writes lse. Rows that see no key
// become all-zero probabilities with lse = -inf.
template <class A>
void masked_softmax_rows(const Mask& mask, const int32_t* seg, int64_t S, A* probs, A* lse) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S; ++i) {
    A* row = probs + i * S;
    A row_max = minus_infinity<A>();
    for (int64_t j = 0; j < S; ++j) {
      if (mask.any() && !allowed(mask, seg, i, j)) row[j] = minus_infinity<A>();
      row_max = std::max(row_max, row[j]);
    }
    if (row_max == minus_infinity<A>()) {
      for (int64_t j = 0; j < S; ++j) row[j] = A(0);
      lse[i] = minus_infinity<A>();
      continue;
    }
    A sum = 0;
    for (int64_t j = 0; j < S; ++j) {
      row[j] = std::exp(row[j] - row_max);
      sum += row[j];
    }
    const A inv = A(1) / sum;
    for (int64_t j = 0; j < S; ++j) row[j] *= inv;
    lse[i] = row_max + std::log(sum);
  }
}

// dS = P * (dP - rowsum(P * dP)), in place in dp.
template <class A>
void softmax_backward_rows(int64_t S, const A* probs, A* dp) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < S; ++i) {
    const A* p = probs + i * S;
    A* d = dp + i * S;
    A dot = 0;
    for (int64_t j = 0; j < S; ++j) dot += p[j] * d[j];
    for (int64_t j = 0; j < S; ++j) d[j] = p[j] * (d[j] - dot);
  }
}

template <class T>
ForwardOutput forward_typed(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& segment_ids) {
  using A = acc_t<T>;
  const DType acc = dtype_of<A>::value;
  const int64_t B = p.batch, S = p.seq_len, Hq = p.q_heads, D = p.head_dim;
  const A scale = static_cast<A>(p.effective_scale());
  ForwardOutput out;
  out.o = poisoned({B, S, Hq, D}, p.dtype);
  out.lse = poisoned({B, Hq, S}, acc);
  out.saved = Tensor::empty({B, Hq, S, S}, acc);
  Tensor q_head = Tensor::empty({S, D}, acc), k_head = Tensor::empty({S, D}, acc);
  Tensor v_head = Tensor::empty({S, D}, acc), o_head = Tensor::empty({S, D}, acc);
  A *qh = q_head.data<A>(), *kh = k_head.data<A>(), *vh = v_head.data<A>();
  A* oh = o_head.data<A>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t kv = h / p.group_size();
      load_rows(q.data<T>() + l.q_at(p, b, 0, h), l.q_row, S, D, qh);
      load_rows(k.data<T>() + l.k_at(p, b, 0, kv), l.kv_row, S, D, kh);
      load_rows(v.data<T>() + l.v_at(p, b, 0, kv), l.kv_row, S, D, vh);
      A* probs = out.saved.data<A>() + (b * Hq + h) * S * S;
      A* lse = out.lse.data<A>() + (b * Hq + h) * S;
      ft::cpu::gemm(false, true, S, S, D, scale, qh, D, kh, D, A(0), probs, S);
      masked_softmax_rows(p.mask, segment_row(p, segment_ids, b), S, probs, lse);
      ft::cpu::gemm(false, false, S, D, S, A(1), probs, S, vh, D, A(0), oh, D);
      store_rows(oh, S, D, A(1), out.o.data<T>() + head_row_offset(p, Hq, b, 0, h), Hq * D);
    }
  }
  return out;
}

template <class T>
void backward_typed(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                    const Tensor& v, const ForwardOutput& fwd, const Tensor& dout, Gradients& g) {
  using A = acc_t<T>;
  const DType acc = dtype_of<A>::value;
  const int64_t B = p.batch, S = p.seq_len, Hq = p.q_heads, Hkv = p.kv_heads, D = p.head_dim;
  const A scale = static_cast<A>(p.effective_scale());
  Tensor dscores = Tensor::empty({S, S}, acc);
  Tensor q_head = Tensor::empty({S, D}, acc), k_head = Tensor::empty({S, D}, acc);
  Tensor v_head = Tensor::empty({S, D}, acc), do_head = Tensor::empty({S, D}, acc);
  Tensor dq_head = Tensor::empty({S, D}, acc), dk_sum = Tensor::empty({S, D}, acc);
  Tensor dv_sum = Tensor::empty({S, D}, acc);
  A *qh = q_head.data<A>(), *kh = k_head.data<A>(), *vh = v_head.data<A>();
  A *doh = do_head.data<A>(), *dqh = dq_head.data<A>(), *ds = dscores.data<A>();
  A *dk = dk_sum.data<A>(), *dv = dv_sum.data<A>();
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t kv = 0; kv < Hkv; ++kv) {
      load_rows(k.data<T>() + l.k_at(p, b, 0, kv), l.kv_row, S, D, kh);
      load_rows(v.data<T>() + l.v_at(p, b, 0, kv), l.kv_row, S, D, vh);
      dk_sum.zero();
      dv_sum.zero();
      // dk and dv of a kv head sum over the query heads of its group, in order: no races.
      for (int64_t h = kv * p.group_size(); h < (kv + 1) * p.group_size(); ++h) {
        load_rows(q.data<T>() + l.q_at(p, b, 0, h), l.q_row, S, D, qh);
        load_rows(dout.data<T>() + head_row_offset(p, Hq, b, 0, h), Hq * D, S, D, doh);
        const A* probs = fwd.saved.data<A>() + (b * Hq + h) * S * S;
        ft::cpu::gemm(true, false, S, D, S, A(1), probs, S, doh, D, A(1), dv, D);
        ft::cpu::gemm(false, true, S, S, D, A(1), doh, D, vh, D, A(0), ds, S);
        softmax_backward_rows(S, probs, ds);
        ft::cpu::gemm(false, false, S, D, S, scale, ds, S, kh, D, A(0), dqh, D);
        store_rows(dqh, S, D, A(1), g.dq.data<T>() + l.q_at(p, b, 0, h), l.q_row);
        ft::cpu::gemm(true, false, S, D, S, scale, ds, S, qh, D, A(1), dk, D);
      }
      store_rows(dk, S, D, A(1), g.dk.data<T>() + l.k_at(p, b, 0, kv), l.kv_row);
      store_rows(dv, S, D, A(1), g.dv.data<T>() + l.v_at(p, b, 0, kv), l.kv_row);
    }
  }
}

}  // namespace

ForwardOutput naive_forward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& segment_ids) {
  return dispatch_float(
      p.dtype, [&](auto t) { return forward_typed<decltype(t)>(p, l, q, k, v, segment_ids); });
}

void naive_backward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                    const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                    const Tensor& segment_ids, Gradients& into) {
  (void)segment_ids;  // the saved probabilities already carry the mask
  dispatch_float(p.dtype,
                 [&](auto t) { backward_typed<decltype(t)>(p, l, q, k, v, fwd, dout, into); });
}

}  // namespace ft::attention::cpu

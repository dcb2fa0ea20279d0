// flash attention on the CPU (FlashAttention-2 algorithm).
//
// Forward, one task per (batch, query head, block of kBlockQ queries): stream the key/value
// blocks the mask lets through (mask_bounds.h), S = scale * Q K^T on a kBlockQ x kBlockK tile,
// online softmax with a running row max m and row sum l (the output accumulator is rescaled by
// exp(m_old - m_new) when the max grows), O += P V; at the end O /= l and lse = m + log(l).
// Backward recomputes P = exp(S - lse) per tile and uses D_i = rowsum(dO_i * O_i):
// dS = P * (dP - D_i) with dP = dO V^T. It runs as two race-free passes: one task per
// (batch, kv head, key block) accumulates dK and dV over every query head of the group, and one
// task per (batch, query head, query block) accumulates dQ; the second pass recomputes S and dP
// (7 tile products instead of 5) in exchange for needing no atomics or per-thread dQ copies.
//
// Memory: per thread a few tiles (O((kBlockQ + kBlockK) * D)); nothing of size S x S. Traffic:
// each query block reads the K/V blocks it attends, so about (attended pairs / kBlockQ) * D
// elements of K and V, plus one pass over Q and O. Tile products go through BLAS, one thread
// per task. Compute is in acc_t<T> (fp32 for fp32 and bf16); o and gradients are rounded to T.
#include <cmath>

#include "attention/cpu/cpu_kernels.h"
#include "attention/mask_bounds.h"
#include "core/blas.h"

namespace ft::attention::cpu {
namespace {

constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;

// One thread's tiles, carved from one counted allocation.
template <class A>
struct TileScratch {
  Tensor storage;
  A *q, *k, *v, *dout, *scores, *dscores, *acc, *acc2, *row_max, *row_sum;

  explicit TileScratch(int64_t D) {
    const int64_t block = std::max(kBlockQ, kBlockK);
    const int64_t tile = kBlockQ * kBlockK;
    storage = Tensor::empty({6 * block * D + 2 * tile + 2 * kBlockQ}, dtype_of<A>::value);
    A* next = storage.data<A>();
    auto take = [&](int64_t n) {
      A* p = next;
      next += n;
      return p;
    };
    q = take(block * D), k = take(block * D), v = take(block * D), dout = take(block * D);
    acc = take(block * D), acc2 = take(block * D);
    scores = take(tile), dscores = take(tile);
    row_max = take(kBlockQ), row_sum = take(kBlockQ);
  }
};

// A block of rows [begin, begin + size) of one sequence.
struct Block {
  int64_t begin, size;
  int64_t end() const { return begin + size; }
};

inline Block block_at(int64_t begin, int64_t block, int64_t seq_len) {
  return {begin, std::min(block, seq_len - begin)};
}

// Sets the scores of pairs the mask hides to `hidden_value`.
template <class A>
void mask_tile(const Mask& mask, const int32_t* seg, Block qb, Block kb, A hidden_value, A* s) {
  for (int64_t r = 0; r < qb.size; ++r) {
    A* row = s + r * kBlockK;
    for (int64_t c = 0; c < kb.size; ++c) {
      if (!allowed(mask, seg, qb.begin + r, kb.begin + c)) row[c] = hidden_value;
    }
  }
}

// Online softmax step: turns the tile's scores into exp(s - m_new) in place, updates the
// running max and sum, and rescales the rows of the output accumulator.
template <class A>
void online_softmax_update(int64_t rows, int64_t cols, int64_t D, A* s, A* row_max, A* row_sum,
                           A* acc) {
  for (int64_t r = 0; r < rows; ++r) {
    A* row = s + r * kBlockK;
    A tile_max = minus_infinity<A>();
    for (int64_t c = 0; c < cols; ++c) tile_max = std::max(tile_max, row[c]);
    const A new_max = std::max(row_max[r], tile_max);
    if (new_max == minus_infinity<A>()) {  // the row has seen no key yet
      for (int64_t c = 0; c < cols; ++c) row[c] = A(0);
      continue;
    }
    A sum = 0;
    for (int64_t c = 0; c < cols; ++c) {
      row[c] = std::exp(row[c] - new_max);
      sum += row[c];
    }
    const A correction = std::exp(row_max[r] - new_max);  // 0 when the old max was -inf
    if (correction != A(1)) {
      for (int64_t d = 0; d < D; ++d) acc[r * D + d] *= correction;
    }
    row_sum[r] = row_sum[r] * correction + sum;
    row_max[r] = new_max;
  }
}

// P = exp(S - lse) in place; zero where the mask hides a pair or the row saw no key.
template <class A>
void probabilities_from_lse(const Mask& mask, const int32_t* seg, TileCover cover, Block qb,
                            Block kb, const A* lse, A* s) {
  for (int64_t r = 0; r < qb.size; ++r) {
    A* row = s + r * kBlockK;
    const A row_lse = lse[r];
    for (int64_t c = 0; c < kb.size; ++c) {
      const bool hidden =
          row_lse == minus_infinity<A>() ||
          (cover == TileCover::partial && !allowed(mask, seg, qb.begin + r, kb.begin + c));
      row[c] = hidden ? A(0) : std::exp(row[c] - row_lse);
    }
  }
}

// dS = P * (dP - D_i), in place in dp.
template <class A>
void softmax_gradient(Block qb, Block kb, const A* p, const A* delta, A* dp) {
  for (int64_t r = 0; r < qb.size; ++r) {
    for (int64_t c = 0; c < kb.size; ++c) {
      const int64_t i = r * kBlockK + c;
      dp[i] = p[i] * (dp[i] - delta[r]);
    }
  }
}

// Raw views of the tensors of one call, so that the per-block functions stay short.
template <class T>
struct CallViews {
  using A = acc_t<T>;
  const Problem& p;
  const Layout& l;
  const Tensor& segment_ids;
  const T *q = nullptr, *k = nullptr, *v = nullptr, *o = nullptr, *dout = nullptr;
  const A *lse = nullptr, *delta = nullptr;  // [B, Hq, S]

  const T* q_rows(int64_t b, int64_t h, int64_t s) const { return q + l.q_at(p, b, s, h); }
  const T* dout_rows(int64_t b, int64_t h, int64_t s) const {
    return dout + head_row_offset(p, p.q_heads, b, s, h);
  }
  const T* k_rows(int64_t b, int64_t kv, int64_t s) const { return k + l.k_at(p, b, s, kv); }
  const T* v_rows(int64_t b, int64_t kv, int64_t s) const { return v + l.v_at(p, b, s, kv); }
  int64_t row_stat(int64_t b, int64_t h, int64_t s) const {
    return (b * p.q_heads + h) * p.seq_len + s;
  }
};

// Calls visit(key block, cover) for every key block that queries qb of batch row b may attend.
template <class F>
void for_each_visible_key_block(const Problem& p, const int32_t* seg, Block qb, F&& visit) {
  const SegmentSpan q_span = seg ? segment_span(seg, qb.begin, qb.end()) : SegmentSpan{};
  const PositionRange keys = key_range(p.mask, qb.begin, qb.end(), p.seq_len);
  for (int64_t k0 = keys.begin / kBlockK * kBlockK; k0 < keys.end; k0 += kBlockK) {
    const Block kb = block_at(k0, kBlockK, p.seq_len);
    const TileCover cover =
        classify_tile(p.mask, seg, q_span, qb.begin, qb.end(), kb.begin, kb.end());
    if (cover != TileCover::hidden) visit(kb, cover);
  }
}

// Calls visit(query block, cover) for every query block that may attend keys kb.
template <class F>
void for_each_visible_query_block(const Problem& p, const int32_t* seg, Block kb, F&& visit) {
  const PositionRange queries = query_range(p.mask, kb.begin, kb.end(), p.seq_len);
  for (int64_t q0 = queries.begin / kBlockQ * kBlockQ; q0 < queries.end; q0 += kBlockQ) {
    const Block qb = block_at(q0, kBlockQ, p.seq_len);
    const SegmentSpan q_span = seg ? segment_span(seg, qb.begin, qb.end()) : SegmentSpan{};
    const TileCover cover =
        classify_tile(p.mask, seg, q_span, qb.begin, qb.end(), kb.begin, kb.end());
    if (cover != TileCover::hidden) visit(qb, cover);
  }
}

template <class T, class A = acc_t<T>>
void forward_block(const CallViews<T>& in, int64_t b, int64_t h, Block qb, TileScratch<A>& ws, T* o,
                   A* lse) {
  const Problem& p = in.p;
  const int64_t D = p.head_dim, kv = h / p.group_size();
  const A scale = static_cast<A>(p.effective_scale());
  const int32_t* seg = segment_row(p, in.segment_ids, b);
  load_rows(in.q_rows(b, h, qb.begin), in.l.q_row, qb.size, D, ws.q);
  std::fill(ws.row_max, ws.row_max + qb.size, minus_infinity<A>());
  std::fill(ws.row_sum, ws.row_sum + qb.size, A(0));
  std::fill(ws.acc, ws.acc + qb.size * D, A(0));
  for_each_visible_key_block(p, seg, qb, [&](Block kb, TileCover cover) {
    load_rows(in.k_rows(b, kv, kb.begin), in.l.kv_row, kb.size, D, ws.k);
    load_rows(in.v_rows(b, kv, kb.begin), in.l.kv_row, kb.size, D, ws.v);
    ft::cpu::gemm(false, true, qb.size, kb.size, D, scale, ws.q, D, ws.k, D, A(0), ws.scores,
                  kBlockK);
    if (cover == TileCover::partial) mask_tile(p.mask, seg, qb, kb, minus_infinity<A>(), ws.scores);
    online_softmax_update(qb.size, kb.size, D, ws.scores, ws.row_max, ws.row_sum, ws.acc);
    ft::cpu::gemm(false, false, qb.size, D, kb.size, A(1), ws.scores, kBlockK, ws.v, D, A(1),
                  ws.acc, D);
  });
  T* o_rows = o + head_row_offset(p, p.q_heads, b, qb.begin, h);
  A* lse_rows = lse + in.row_stat(b, h, qb.begin);
  for (int64_t r = 0; r < qb.size; ++r) {
    const bool saw_keys = ws.row_sum[r] > A(0);  // padding rows: o = 0, lse = -inf
    lse_rows[r] = saw_keys ? ws.row_max[r] + std::log(ws.row_sum[r]) : minus_infinity<A>();
    const A inv = saw_keys ? A(1) / ws.row_sum[r] : A(0);
    store_rows(ws.acc + r * D, 1, D, inv, o_rows + r * p.q_heads * D, D);
  }
}

// Recomputes P and dS = P * (dP - D_i) of the tile (qb of query head h) x (kb of kv head kv);
// expects ws.q, ws.dout, ws.k, ws.v loaded; leaves P in ws.scores and dS in ws.dscores.
template <class T, class A = acc_t<T>>
void tile_probabilities_and_gradient(const CallViews<T>& in, int64_t b, int64_t h, Block qb,
                                     Block kb, TileCover cover, TileScratch<A>& ws) {
  const Problem& p = in.p;
  const int64_t D = p.head_dim;
  const A scale = static_cast<A>(p.effective_scale());
  const int64_t stat = in.row_stat(b, h, qb.begin);
  ft::cpu::gemm(false, true, qb.size, kb.size, D, scale, ws.q, D, ws.k, D, A(0), ws.scores,
                kBlockK);
  probabilities_from_lse(p.mask, segment_row(p, in.segment_ids, b), cover, qb, kb, in.lse + stat,
                         ws.scores);
  ft::cpu::gemm(false, true, qb.size, kb.size, D, A(1), ws.dout, D, ws.v, D, A(0), ws.dscores,
                kBlockK);
  softmax_gradient(qb, kb, ws.scores, in.delta + stat, ws.dscores);
}

template <class T, class A = acc_t<T>>
void dq_block(const CallViews<T>& in, int64_t b, int64_t h, Block qb, TileScratch<A>& ws, T* dq) {
  const Problem& p = in.p;
  const int64_t D = p.head_dim, kv = h / p.group_size();
  const A scale = static_cast<A>(p.effective_scale());
  load_rows(in.q_rows(b, h, qb.begin), in.l.q_row, qb.size, D, ws.q);
  load_rows(in.dout_rows(b, h, qb.begin), p.q_heads * D, qb.size, D, ws.dout);
  std::fill(ws.acc, ws.acc + qb.size * D, A(0));
  for_each_visible_key_block(p, segment_row(p, in.segment_ids, b), qb, [&](Block kb, TileCover c) {
    load_rows(in.k_rows(b, kv, kb.begin), in.l.kv_row, kb.size, D, ws.k);
    load_rows(in.v_rows(b, kv, kb.begin), in.l.kv_row, kb.size, D, ws.v);
    tile_probabilities_and_gradient(in, b, h, qb, kb, c, ws);
    ft::cpu::gemm(false, false, qb.size, D, kb.size, scale, ws.dscores, kBlockK, ws.k, D, A(1),
                  ws.acc, D);
  });
  store_rows(ws.acc, qb.size, D, A(1), dq + in.l.q_at(p, b, qb.begin, h), in.l.q_row);
}

// dK and dV of one key block of kv head kv, summed over every query head of its group.
template <class T, class A = acc_t<T>>
void dkv_block(const CallViews<T>& in, int64_t b, int64_t kv, Block kb, TileScratch<A>& ws, T* dk,
               T* dv) {
  const Problem& p = in.p;
  const int64_t D = p.head_dim;
  const A scale = static_cast<A>(p.effective_scale());
  A* dk_acc = ws.acc;
  A* dv_acc = ws.acc2;
  load_rows(in.k_rows(b, kv, kb.begin), in.l.kv_row, kb.size, D, ws.k);
  load_rows(in.v_rows(b, kv, kb.begin), in.l.kv_row, kb.size, D, ws.v);
  std::fill(dk_acc, dk_acc + kb.size * D, A(0));
  std::fill(dv_acc, dv_acc + kb.size * D, A(0));
  for (int64_t h = kv * p.group_size(); h < (kv + 1) * p.group_size(); ++h) {
    for_each_visible_query_block(
        p, segment_row(p, in.segment_ids, b), kb, [&](Block qb, TileCover cover) {
          load_rows(in.q_rows(b, h, qb.begin), in.l.q_row, qb.size, D, ws.q);
          load_rows(in.dout_rows(b, h, qb.begin), p.q_heads * D, qb.size, D, ws.dout);
          tile_probabilities_and_gradient(in, b, h, qb, kb, cover, ws);
          ft::cpu::gemm(true, false, kb.size, D, qb.size, A(1), ws.scores, kBlockK, ws.dout, D,
                        A(1), dv_acc, D);
          ft::cpu::gemm(true, false, kb.size, D, qb.size, scale, ws.dscores, kBlockK, ws.q, D, A(1),
                        dk_acc, D);
        });
  }
  store_rows(dk_acc, kb.size, D, A(1), dk + in.l.k_at(p, b, kb.begin, kv), in.l.kv_row);
  store_rows(dv_acc, kb.size, D, A(1), dv + in.l.v_at(p, b, kb.begin, kv), in.l.kv_row);
}

// D_i = rowsum(dO_i * O_i) for every query row, [B, Hq, S].
template <class T, class A = acc_t<T>>
Tensor row_deltas(const Problem& p, const T* o, const T* dout) {
  Tensor delta = Tensor::empty({p.batch, p.q_heads, p.seq_len}, dtype_of<A>::value);
  A* out = delta.data<A>();
  const int64_t rows = p.batch * p.q_heads * p.seq_len, D = p.head_dim;
#pragma omp parallel for schedule(static)
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t s = row % p.seq_len, h = (row / p.seq_len) % p.q_heads;
    const int64_t b = row / (p.seq_len * p.q_heads);
    const int64_t offset = head_row_offset(p, p.q_heads, b, s, h);
    A sum = 0;
    for (int64_t d = 0; d < D; ++d) sum += load(dout[offset + d]) * load(o[offset + d]);
    out[row] = sum;
  }
  return delta;
}

int64_t num_blocks(int64_t seq_len, int64_t block) {
  return (seq_len + block - 1) / block;
}

// Runs body(batch, head, block) for every (batch, head, block) on OpenMP threads, each thread
// with its own scratch tiles.
template <class A, class F>
void parallel_over_blocks(const Problem& p, int64_t heads, int64_t block, F&& body) {
  const int64_t blocks = num_blocks(p.seq_len, block);
  const int64_t tasks = p.batch * heads * blocks;
#pragma omp parallel
  {
    TileScratch<A> ws(p.head_dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t blk = task % blocks, h = (task / blocks) % heads;
      const int64_t b = task / (blocks * heads);
      body(b, h, block_at(blk * block, block, p.seq_len), ws);
    }
  }
}

template <class T>
ForwardOutput forward_typed(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& segment_ids) {
  using A = acc_t<T>;
  ForwardOutput out;
  out.o = poisoned({p.batch, p.seq_len, p.q_heads, p.head_dim}, p.dtype);
  out.lse = poisoned({p.batch, p.q_heads, p.seq_len}, dtype_of<A>::value);
  CallViews<T> in{p, l, segment_ids};
  in.q = q.data<T>(), in.k = k.data<T>(), in.v = v.data<T>();
  T* o = out.o.data<T>();
  A* lse = out.lse.data<A>();
  parallel_over_blocks<A>(p, p.q_heads, kBlockQ,
                          [&](int64_t b, int64_t h, Block qb, TileScratch<A>& ws) {
                            forward_block(in, b, h, qb, ws, o, lse);
                          });
  return out;
}

template <class T>
void backward_typed(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                    const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                    const Tensor& segment_ids, Gradients& g) {
  using A = acc_t<T>;
  const Tensor delta = row_deltas(p, fwd.o.data<T>(), dout.data<T>());
  CallViews<T> in{p, l, segment_ids};
  in.q = q.data<T>(), in.k = k.data<T>(), in.v = v.data<T>();
  in.o = fwd.o.data<T>(), in.dout = dout.data<T>();
  in.lse = fwd.lse.data<A>(), in.delta = delta.data<A>();
  T *dq = g.dq.data<T>(), *dk = g.dk.data<T>(), *dv = g.dv.data<T>();
  parallel_over_blocks<A>(p, p.kv_heads, kBlockK,
                          [&](int64_t b, int64_t kv, Block kb, TileScratch<A>& ws) {
                            dkv_block(in, b, kv, kb, ws, dk, dv);
                          });
  parallel_over_blocks<A>(
      p, p.q_heads, kBlockQ,
      [&](int64_t b, int64_t h, Block qb, TileScratch<A>& ws) { dq_block(in, b, h, qb, ws, dq); });
}

}  // namespace

ForwardOutput flash_forward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& segment_ids) {
  return dispatch_float(
      p.dtype, [&](auto t) { return forward_typed<decltype(t)>(p, l, q, k, v, segment_ids); });
}

void flash_backward(const Problem& p, const Layout& l, const Tensor& q, const Tensor& k,
                    const Tensor& v, const ForwardOutput& fwd, const Tensor& dout,
                    const Tensor& segment_ids, Gradients& into) {
  dispatch_float(p.dtype, [&](auto t) {
    backward_typed<decltype(t)>(p, l, q, k, v, fwd, dout, segment_ids, into);
  });
}

}  // namespace ft::attention::cpu

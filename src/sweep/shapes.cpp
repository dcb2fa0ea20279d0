#include "sweep/shapes.h"

#include <algorithm>

namespace ft::sweep {

void SweepShape::validate() const {
  FT_CHECK(batch > 0, "--batch ", batch, ": must be positive");
  FT_CHECK(seq_len > 0, "--seq-len ", seq_len, ": must be positive");
  FT_CHECK(q_heads > 0 && kv_heads > 0 && q_heads % kv_heads == 0, "--q-heads ", q_heads,
           " --kv-heads ", kv_heads, ": both positive, q heads a multiple of kv heads");
  FT_CHECK(head_dim > 0 && head_dim % 8 == 0 && head_dim <= attention::kMaxHeadDim, "--head-dim ",
           head_dim, ": a multiple of 8 up to ", attention::kMaxHeadDim);
  FT_CHECK(window >= 0, "--sliding-window ", window, ": must be 0 (none) or positive");
  FT_CHECK(documents >= 0 && documents <= seq_len, "--documents ", documents,
           ": must be between 0 (no segment ids) and --seq-len ", seq_len);
}

std::string SweepShape::describe() const {
  return str("B=", batch, " S=", seq_len, " Hq=", q_heads, " Hkv=", kv_heads, " D=", head_dim,
             " bf16");
}

std::string SweepMask::describe() const {
  std::string text = mask.describe();
  if (documents > 0) text += str(" (", documents, " documents per row)");
  return text;
}

std::vector<SweepMask> sweep_masks(const SweepShape& shape) {
  std::vector<SweepMask> masks;
  if (shape.window > 0 || shape.documents > 0) {
    SweepMask m;
    m.key = shape.window > 0 ? "window" : "segments";
    m.mask.causal = true;
    m.mask.window = shape.window;
    m.mask.has_segments = shape.documents > 0;
    m.documents = shape.documents;
    masks.push_back(m);
  }
  SweepMask causal;
  causal.key = "causal";
  causal.mask.causal = true;
  masks.push_back(causal);
  return masks;
}

attention::Problem timed_problem(const SweepShape& shape, const SweepMask& mask) {
  attention::Problem p;
  p.batch = shape.batch;
  p.seq_len = shape.seq_len;
  p.q_heads = shape.q_heads;
  p.kv_heads = shape.kv_heads;
  p.head_dim = shape.head_dim;
  p.dtype = DType::bf16;
  p.mask = mask.mask;
  return p;
}

Tensor document_ids(int64_t batch, int64_t seq_len, int64_t documents) {
  Tensor ids = Tensor::empty({batch, seq_len}, DType::i32);
  int32_t* out = ids.data<int32_t>();
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < seq_len; ++i) {
      int32_t id = 0;
      for (int64_t k = 1; k < documents; ++k) {
        if (i >= k * seq_len / documents + b % 64) ++id;
      }
      out[b * seq_len + i] = id;
    }
  }
  return ids;
}

attention::Problem check_problem(const SweepShape& shape, const SweepMask& mask) {
  attention::Problem p = timed_problem(shape, mask);
  p.batch = kCheckBatch;
  p.seq_len = kCheckSeqLen;
  if (p.mask.window > 0) {
    const int64_t cut = kCheckSeqLen / (2 * std::max<int64_t>(mask.documents, 1));
    p.mask.window = std::max<int64_t>(1, std::min(p.mask.window, cut));
  }
  return p;
}

Tensor check_segment_ids(int64_t documents) {
  Tensor ids = document_ids(kCheckBatch, kCheckSeqLen, std::min(documents, kCheckSeqLen));
  int32_t* out = ids.data<int32_t>();
  for (int64_t b = 0; b < kCheckBatch; ++b) {
    const int64_t padding = 16 + 7 * b;
    for (int64_t i = kCheckSeqLen - padding; i < kCheckSeqLen; ++i) out[b * kCheckSeqLen + i] = -1;
  }
  return ids;
}

}  // namespace ft::sweep

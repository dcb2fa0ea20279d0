#include "train/documents.h"

#include "core/error.h"

namespace ft::train {

Tensor document_segment_ids(const Tensor& tokens, int32_t eot_token) {
  FT_CHECK(tokens.dtype() == DType::i32 && tokens.ndim() == 2 && tokens.device() == Device::cpu,
           "document segment ids: tokens must be int32 [B, T] on the CPU, got ",
           dtype_name(tokens.dtype()), " ", shape_str(tokens.shape()), " on ",
           device_name(tokens.device()));
  const int64_t B = tokens.dim(0), T = tokens.dim(1);
  Tensor segments = Tensor::empty({B, T}, DType::i32);
  const int32_t* in = tokens.data<int32_t>();
  int32_t* out = segments.data<int32_t>();
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (in[b * T + t] == eot_token && t > 0) ++id;
      out[b * T + t] = id;
    }
  }
  return segments;
}

}  // namespace ft::train

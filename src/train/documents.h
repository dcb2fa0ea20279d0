// Document boundaries in packed batches. llm.c shards put the end-of-text token (GPT-2's
// <|endoftext|>, id 50256) before each document, and a batch row is a window cut anywhere in
// that stream, so a row holds the tail of one document followed by whole ones. For
// `train --doc-mask` each row gets segment ids that attention reads to stay inside a document.
#pragma once

#include <cstdint>

#include "core/tensor.h"

namespace ft::train {

// tokens: int32 [B, T] on the CPU. Returns int32 [B, T] on the CPU: per row, positions before
// the first end-of-text token are segment 0, and each end-of-text token starts the next
// segment (it belongs to the document it opens, so attention from its position sees only
// itself). An end-of-text token at position 0 opens segment 0, so ids are always 0, 1, 2, ...
// with no gaps; consecutive end-of-text tokens are one-token documents. No id is -1 (padding).
Tensor document_segment_ids(const Tensor& tokens, int32_t eot_token);

}  // namespace ft::train

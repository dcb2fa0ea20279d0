// NumPy .npy files (format versions 1.0-3.0, C order, little endian) for exchanging attention
// inputs and outputs with any framework. dtypes: '<f4' <-> fp32, '<u2' <-> bf16 (the raw bf16
// bits; NumPy has no bfloat16), '<i4' <-> int32, '<f8' <-> fp64.
#pragma once

#include <string>

#include "core/tensor.h"

namespace ft::npy {

// Reads a whole file into a CPU tensor. Throws ft::Error naming the file and the problem for a
// bad magic string, a Fortran-order array, an unsupported dtype or a truncated file.
Tensor load(const std::string& path);

// Reads integer ids (token ids, targets) as an int32 CPU tensor: '<i4', or '<i8' (NumPy's
// default integer dtype), whose values must fit in int32 (callers check the range they need,
// e.g. the vocabulary). Any other dtype is an ft::Error naming the file and what was found.
Tensor load_ids(const std::string& path);

// Writes a CPU tensor (fp32, bf16, int32 or fp64). Writes a temporary file next to `path` and
// renames it over `path`, so a reader never sees a half-written file.
void save(const std::string& path, const Tensor& tensor);

}  // namespace ft::npy

// The check problem's inputs and its fp64 reference outputs, computed once per mask by the
// parent process (on the CPU: the reference is the explicit S x S path in fp64) and read by
// every worker from .npy files, so that no worker repeats it.
#pragma once

#include <cstdint>
#include <string>

#include "attention/attention.h"
#include "sweep/shapes.h"

namespace ft::sweep {

struct CheckData {
  attention::Problem problem;
  Tensor q, k, v, dout, segment_ids;  // bf16 (ids int32, undefined without segments), CPU
  Tensor out, dq, dk, dv;             // fp64 reference, CPU
};

// Fresh N(0, 1) inputs rounded to bf16 (seeded), and the fp64 reference on exactly those.
CheckData make_check_data(const SweepShape& shape, const SweepMask& mask, uint64_t seed);

// <dir>/<mask key>_<name>.npy
void save_check_data(const std::string& dir, const SweepMask& mask, const CheckData& data);
CheckData load_check_data(const std::string& dir, const SweepShape& shape, const SweepMask& mask);

}  // namespace ft::sweep

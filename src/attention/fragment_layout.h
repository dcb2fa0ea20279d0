// Where the elements of a warp's mma fragments go, as index arithmetic that the kernels
// (hopper.cuh's callers) and the CPU tests share. Plain C++ (FT_HOST_DEVICE), no CUDA.
//
// A warp's 16 x 16 bf16 A fragment (the layout acc_to_a makes from a wgmma accumulator) is four
// 8 x 8 matrices in four registers: register i of lane t holds row t / 4 + 8 (i % 2), columns
// 8 (i / 2) + 2 (t % 4) + {0, 1}. stmatrix .x4 stores them in one instruction, each lane giving
// the shared address of one 8-element row: lane t the row t % 8 of matrix t / 8.
#pragma once

#include "core/host_device.h"

namespace ft::attention {

// The row and first column, within the warp's 16 x 16 fragment, whose 16 bytes lane `lane`
// addresses in an stmatrix .x4 store of an A fragment.
struct FragmentRow {
  int row, col;
};
FT_HOST_DEVICE constexpr FragmentRow stmatrix_x4_row(int lane) {
  return {lane % 8 + 8 * ((lane / 8) % 2), 8 * (lane / 16)};
}

// The fragment's row and column of element `half` (0, 1) of register `reg` of lane `lane`.
FT_HOST_DEVICE constexpr FragmentRow a_fragment_element(int lane, int reg, int half) {
  return {lane / 4 + 8 * (reg % 2), 8 * (reg / 2) + 2 * (lane % 4) + half};
}

}  // namespace ft::attention

// The fragment index arithmetic the Hopper kernels share (fragment_layout.h), checked against a
// model of stmatrix on the CPU: every element of a warp's A fragment must land in the row and
// column the fragment layout gives it, and every position of the 16 x 16 tile exactly once.
#include <gtest/gtest.h>

#include <array>

#include "attention/fragment_layout.h"

namespace ft::attention {
namespace {

// stmatrix .x4: register i of lane t holds row t / 4, columns 2 (t % 4) + {0, 1} of matrix i;
// matrix i's row r is written at the address lane 8 i + r gives (16 bytes: 8 columns).
TEST(FragmentLayout, StmatrixStoresEveryElementWhereTheFragmentHasIt) {
  std::array<std::array<int, 16>, 16> hits{};
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < 4; ++reg) {
      for (int half = 0; half < 2; ++half) {
        const FragmentRow row_start = stmatrix_x4_row(8 * reg + lane / 4);
        const int row = row_start.row, col = row_start.col + 2 * (lane % 4) + half;
        const FragmentRow expect = a_fragment_element(lane, reg, half);
        EXPECT_EQ(row, expect.row) << "lane " << lane << " register " << reg << " half " << half;
        EXPECT_EQ(col, expect.col) << "lane " << lane << " register " << reg << " half " << half;
        ASSERT_TRUE(row >= 0 && row < 16 && col >= 0 && col < 16);
        ++hits[row][col];
      }
    }
  }
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) EXPECT_EQ(hits[r][c], 1) << "row " << r << " column " << c;
  }
}

// The rows a warp's lanes address are 16-byte aligned halves of the fragment's rows: columns 0
// and 8 only, each of the 16 rows twice.
TEST(FragmentLayout, EachRowIsAddressedOncePerHalf) {
  std::array<std::array<int, 2>, 16> seen{};
  for (int lane = 0; lane < 32; ++lane) {
    const FragmentRow at = stmatrix_x4_row(lane);
    ASSERT_TRUE(at.col == 0 || at.col == 8) << at.col;
    ++seen[at.row][at.col / 8];
  }
  for (const auto& row : seen) EXPECT_EQ(row, (std::array<int, 2>{1, 1}));
}

}  // namespace
}  // namespace ft::attention

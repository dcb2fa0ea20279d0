// The order in which the tma forward's persistent blocks take their work tiles (a query block of
// one head of one batch row; flash_tma_forward.cuh). Plain C++ shared by the kernel and the CPU
// tests, which check that every tile is dealt exactly once and how evenly.
//
// (head, batch row) pairs are cut into sections whose K and V fit in L2 together; inside a
// section the query blocks go from the most keys to the fewest (causal: the last query block
// first), so the longest tiles start first and the short ones fill the section's tail. Heads of
// one GQA group are adjacent.
//
// Each section is dealt in rounds of one tile per block, in a snake: in a block's walk step s
// (rounds counted over all sections), block b takes the round's tile b when s is even and
// grid - 1 - b when it is odd, so the block that drew the longest tile of one round draws the
// shortest of the next (dealt in one direction, block 0 would draw the longest of every round:
// 2.4% more work than the mean at the hero shape, 12% at GPT-2's, against 0.7% and 3% in a
// snake; docs/PERF.md t4). Rounds start afresh at every section: dealt as one list, the rounds
// that straddle two sections mix one section's shortest tiles with the next one's longest, and
// the snake no longer evens them out (the busiest block 3.4% over the mean at llama3-1b's long
// context, 0.7% at the hero shape; `bench/tile_order_sim.py`). In the last round of a section
// the blocks past its end take nothing and go on to the next section.
#pragma once

#include <algorithm>
#include <cstdint>

#include "core/host_device.h"

namespace ft::attention {

struct WorkTile {
  int q_block, head, batch;  // head: the first of the tile's heads
};

struct TileOrder {
  // pairs: (head unit, batch row) pairs, a head unit being heads_per_tile query heads of one kv
  // head (a work tile of a two-head plan covers both); q_heads: head units a batch row.
  int q_blocks = 0, pairs = 0, section_pairs = 1, q_heads = 0, heads_per_tile = 1;
  bool last_block_first = false;

  FT_HOST_DEVICE int count() const { return q_blocks * pairs; }
  FT_HOST_DEVICE int section_tiles() const { return section_pairs * q_blocks; }

  // The next work tile of block `block` of `grid` from its walk step `step` on (advanced past
  // the steps where it takes nothing), or -1 once it has none left.
  FT_HOST_DEVICE int next_tile(int& step, int block, int grid) const {
    if (count() <= 0) return -1;
    const int per_section = section_tiles();
    const int rounds = (per_section + grid - 1) / grid;  // of every section but maybe the last
    for (;; ++step) {
      const int section = step / rounds;
      const int first = section * per_section;
      if (first >= count()) return -1;
      const int round = step - section * rounds;
      const int in_section = round * grid + (step % 2 == 0 ? block : grid - 1 - block);
      const int size = count() - first < per_section ? count() - first : per_section;
      if (in_section < size) return first + in_section;
    }
  }

  FT_HOST_DEVICE WorkTile at(int t) const {
    const int per_section = section_tiles();
    const int section = t / per_section;
    const int first_pair = section * section_pairs;
    const int pairs_here = pairs - first_pair < section_pairs ? pairs - first_pair : section_pairs;
    const int r = t - section * per_section;
    const int rank = r / pairs_here, pair = first_pair + r % pairs_here;
    return {last_block_first ? q_blocks - 1 - rank : rank, pair % q_heads * heads_per_tile,
            pair / q_heads};
  }
};

// Sections of (head, batch row) pairs whose K and V fit in this much L2 together: about a third
// of the H100's and H200's 50 MB, leaving room for the streams of Q and O (with 32 MB the hero
// forward read K and V ~4.7 times from DRAM, with 16 MB about once, as cuDNN's does; docs/PERF.md,
// "K and V sections of 16 MB of L2").
inline constexpr int64_t kL2BytesForKv = int64_t{16} << 20;

// The order of a problem's work tiles of block_m query rows and heads_per_tile query heads (of
// one kv head: q_heads / kv_heads a multiple of it). Causal: later query blocks see more keys. A
// window alone bounds keys from below, so earlier blocks see more.
inline TileOrder make_tile_order(int64_t batch, int64_t seq_len, int64_t q_heads, int64_t kv_heads,
                                 int64_t head_dim, bool causal, int block_m,
                                 int heads_per_tile = 1) {
  TileOrder order;
  order.q_blocks = static_cast<int>((seq_len + block_m - 1) / block_m);
  order.heads_per_tile = heads_per_tile;
  order.q_heads = static_cast<int>(q_heads / heads_per_tile);
  order.pairs = static_cast<int>(order.q_heads * batch);
  order.last_block_first = causal;
  const int64_t kv_head_bytes = int64_t{2} * seq_len * head_dim * 2;
  int64_t kv_heads_fit = 1;
  while (kv_heads_fit * 2 * kv_head_bytes <= kL2BytesForKv) kv_heads_fit *= 2;
  order.section_pairs = static_cast<int>(
      std::min<int64_t>(kv_heads_fit * (q_heads / kv_heads / heads_per_tile), order.pairs));
  return order;
}

}  // namespace ft::attention

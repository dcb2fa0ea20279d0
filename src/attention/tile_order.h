// The order in which the tma forward's persistent blocks take their work tiles (a query block of
// one head of one batch row; flash_tma_forward.cuh). Plain C++ shared by the kernel and the CPU
// tests, which check that every tile is dealt exactly once and how evenly.
//
// By default the blocks claim the list's tiles one at a time from a counter, each when its
// producer is ready for the next (TmaForwardArgs::claims): 2-15% faster than the static deal
// below on an H100 (docs/PERF.md, session 60), which assumes blocks of one speed. The deal stays
// as the claims' twin (FT_TMA_DEAL=static; the GPU tests compare the two bit for bit) and for a
// CUDA graph captured on a stream with no counters yet. The list's sections and their sizes
// below were chosen for the deal and are kept with claims (the claims were measured with them).
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
//
// A section's partial rounds are where the snake stops evening out, so under a causal mask alone
// its size is chosen for the deal, not only for L2: among the sizes from half of what fits in L2
// up to all of it (whole GQA groups), the one whose busiest block has the least work in a model of
// the deal (a work tile costs its key tiles plus a fixed ramp); the largest of equals. At GPT-2's
// shape on 396 blocks (64-row tiles, three blocks an SM) 64 pairs fit, and a section of 64 and one
// of 32 put the busiest block 5.6% over the mean, where two of 49 and 47 put it 3.1% over, the
// floor the longest tile sets (docs/PERF.md, "L2 sections sized for an even deal": 1.9% faster on
// an H100). With a window or documents the sections are the largest that fit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "attention/mask_bounds.h"
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

// What the order of a problem's work tiles depends on: the problem (a window alone bounds keys
// from below, so earlier query blocks see more keys; causal: later ones), the plan's tiles and
// the persistent grid.
struct TileDeal {
  int64_t batch = 0, seq_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  Mask mask;  // segment ids (documents) hide tiles that key_tiles() counts
  int block_m = 0, block_n = 0;
  int heads_per_tile = 1;  // query heads of a work tile (of one kv head)
  int grid = 1;            // persistent blocks

  int q_blocks() const { return static_cast<int>((seq_len + block_m - 1) / block_m); }
  int pairs() const { return static_cast<int>(q_heads / heads_per_tile * batch); }
  int tiles() const { return q_blocks() * pairs(); }
  // Key tiles of query block q under causal and window (segment ids unknown here).
  int key_tiles(int q) const {
    const int64_t q0 = int64_t{q} * block_m;
    const PositionRange keys = key_range(mask, q0, std::min(q0 + block_m, seq_len), seq_len);
    return static_cast<int>((keys.end + block_n - 1) / block_n - keys.begin / block_n);
  }
  // The most pairs whose K and V fit in kL2BytesForKv, in whole GQA groups.
  int largest_section_pairs() const {
    const int64_t kv_head_bytes = int64_t{2} * seq_len * head_dim * 2;
    int64_t kv_heads_fit = 1;
    while (kv_heads_fit * 2 * kv_head_bytes <= kL2BytesForKv) kv_heads_fit *= 2;
    return static_cast<int>(std::min<int64_t>(kv_heads_fit * group(), pairs()));
  }
  int group() const { return static_cast<int>(q_heads / kv_heads / heads_per_tile); }
  auto key() const {
    return std::make_tuple(batch, seq_len, q_heads, kv_heads, head_dim, mask.causal, mask.window,
                           mask.has_segments, block_m, block_n, heads_per_tile, grid);
  }
};

// The deal's model: a work tile costs its key tiles plus this many for its ramp (its first scores
// alone, its last P V alone, its epilogue: about 2.5 key tiles of instructions in the GPT-2
// forward's profile, docs/PERF.md).
inline constexpr int kWorkTileRampKeyTiles = 2;

// The busiest block's work in that model when `order` is dealt to `grid` blocks by next_tile.
inline int64_t busiest_block_work(const TileOrder& order, const TileDeal& d) {
  std::vector<int64_t> cost(static_cast<size_t>(order.q_blocks));
  for (int q = 0; q < order.q_blocks; ++q) {
    cost[static_cast<size_t>(q)] = d.key_tiles(q) + kWorkTileRampKeyTiles;
  }
  std::vector<int64_t> load(static_cast<size_t>(d.grid), 0);
  const int per = order.section_tiles();
  const int rounds = (per + d.grid - 1) / d.grid;
  for (int first = 0, section = 0; first < order.count(); first += per, ++section) {
    const int size = std::min(per, order.count() - first);
    for (int i = 0; i < size; ++i) {  // as next_tile deals it: round, then place in the snake
      const int step = section * rounds + i / d.grid, place = i % d.grid;
      const int block = step % 2 == 0 ? place : d.grid - 1 - place;
      load[static_cast<size_t>(block)] += cost[static_cast<size_t>(order.at(first + i).q_block)];
    }
  }
  return *std::max_element(load.begin(), load.end());
}

// The order of a problem's work tiles. Under a causal mask alone, sections of whole GQA groups
// from half of what fits in L2 (kL2BytesForKv) up to all of it, the size whose busiest block does
// the least (the largest of equals); otherwise the largest that fit. Window 512 + 5 documents ran
// 3.7% slower with the model's 14 pairs a section than with 16 (its documents hide tiles the
// model counts; a window alone is not measured), GPT-2 1.9% faster with 49 of 64 (docs/PERF.md).
inline TileOrder make_tile_order(const TileDeal& d) {
  TileOrder order;
  order.q_blocks = d.q_blocks();
  order.heads_per_tile = d.heads_per_tile;
  order.q_heads = static_cast<int>(d.q_heads / d.heads_per_tile);
  order.pairs = d.pairs();
  order.last_block_first = d.mask.causal;
  const int fit = d.largest_section_pairs();
  order.section_pairs = fit;
  const bool modelled = d.mask.causal && d.mask.window == 0 && !d.mask.has_segments;
  if (!modelled || order.count() <= 0 || d.grid <= 1) return order;
  int64_t best = busiest_block_work(order, d);
  for (int pairs = fit - d.group(); pairs > 0 && 2 * pairs >= fit; pairs -= d.group()) {
    TileOrder candidate = order;
    candidate.section_pairs = pairs;
    const int64_t work = busiest_block_work(candidate, d);
    if (work < best) {
      best = work;
      order.section_pairs = pairs;
    }
  }
  return order;
}

// make_tile_order's answer, computed once per deal: its search over section sizes takes 0.2-0.6
// ms of host time at the bench's shapes and 9 ms at B=256 S=512 (one CPU core), where the forward
// it orders may take 50 us.
inline TileOrder cached_tile_order(const TileDeal& d) {
  static std::mutex mutex;
  static std::map<decltype(d.key()), TileOrder> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(d.key());
  if (it == cache.end()) it = cache.emplace(d.key(), make_tile_order(d)).first;
  return it->second;
}

}  // namespace ft::attention

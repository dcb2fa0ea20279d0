// The tma forward's deal of work tiles (attention/tile_order.h), on the CPU: every tile goes to
// exactly one block, blocks walk the L2 sections in order, and the causal key-tile counts are
// shared evenly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "attention/tile_order.h"

namespace ft::attention {
namespace {

struct Shape {
  const char* name;
  int64_t batch, seq_len, q_heads, kv_heads, head_dim;
  bool causal;
  int block_m, grid, heads = 1;  // heads: query heads a work tile
  int block_n = 128;
  int64_t window = 0;
};

// The bench's cases (H200: 132 SMs; two and three blocks an SM for the 64-row plans) and small
// ones whose sections, rounds and last partial rounds are uneven.
const Shape kShapes[] = {
    {"hero", 32, 4096, 16, 4, 128, true, 128, 132},
    {"gpt2", 8, 1024, 12, 12, 64, true, 128, 132},
    {"gpt2_64rows", 8, 1024, 12, 12, 64, true, 64, 396, 1, 64},
    {"gpt2_b16_64rows", 16, 1024, 12, 12, 64, true, 64, 396, 1, 64},
    {"llama_4x2048", 4, 2048, 32, 8, 64, true, 128, 132},
    {"llama_4x2048_64rows", 4, 2048, 32, 8, 64, true, 64, 264},
    {"llama_long", 1, 32768, 32, 8, 64, true, 192, 132},
    {"window_docs_64rows", 32, 4096, 16, 4, 128, false, 64, 264, 1, 64, 512},
    {"small_uneven", 3, 700, 6, 2, 64, true, 128, 5},
    {"one_block", 2, 300, 4, 4, 128, false, 128, 1},
    {"more_blocks_than_tiles", 1, 100, 2, 1, 64, true, 64, 7},
    {"window_docs_two_heads", 32, 4096, 16, 4, 128, false, 64, 132, 2, 64, 512},
    {"small_two_heads", 3, 700, 12, 3, 64, true, 64, 5, 2},
};

const Shape& shape(const char* name) {
  for (const Shape& s : kShapes) {
    if (std::strcmp(s.name, name) == 0) return s;
  }
  ADD_FAILURE() << "no shape " << name;
  return kShapes[0];
}

// Each block's tiles, in the order it takes them.
std::vector<std::vector<int>> deal(const TileOrder& order, int grid) {
  std::vector<std::vector<int>> blocks(static_cast<size_t>(grid));
  for (int b = 0; b < grid; ++b) {
    for (int step = 0;; ++step) {
      const int t = order.next_tile(step, b, grid);
      if (t < 0) break;
      blocks[static_cast<size_t>(b)].push_back(t);
    }
  }
  return blocks;
}

TileDeal deal_of(const Shape& s) {
  return {s.batch,   s.seq_len, s.q_heads, s.kv_heads, s.head_dim, Mask{s.causal, s.window, false},
          s.block_m, s.block_n, s.heads,   s.grid};
}

TileOrder order_of(const Shape& s) {
  return make_tile_order(deal_of(s));
}

// The order with the sections of the largest size that fits in L2 (the rule before the deal
// chose it).
TileOrder largest_sections(const Shape& s) {
  TileOrder order = order_of(s);
  order.section_pairs = deal_of(s).largest_section_pairs();
  return order;
}

TEST(TileOrder, EveryTileOnceAndSectionsInOrder) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.name);
    const TileOrder order = order_of(s);
    std::vector<int> seen(static_cast<size_t>(order.count()), 0);
    for (const std::vector<int>& tiles : deal(order, s.grid)) {
      for (size_t i = 0; i < tiles.size(); ++i) {
        ASSERT_GE(tiles[i], 0);
        ASSERT_LT(tiles[i], order.count());
        ++seen[static_cast<size_t>(tiles[i])];
        if (i > 0) {  // a block never returns to an earlier section (their K and V left L2)
          EXPECT_LE(tiles[i - 1] / order.section_tiles(), tiles[i] / order.section_tiles());
        }
      }
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), order.count()) << "dealt once each";
  }
}

// at() names every (query block, head, batch row) once; with two heads a tile, every even head
// (the tile covers it and the next).
TEST(TileOrder, TilesNameEveryQueryBlockOfEveryPair) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.name);
    const TileOrder order = order_of(s);
    std::vector<int> seen(static_cast<size_t>(order.count()), 0);
    for (int t = 0; t < order.count(); ++t) {
      const WorkTile w = order.at(t);
      ASSERT_GE(w.q_block, 0);
      ASSERT_LT(w.q_block, order.q_blocks);
      ASSERT_LT(w.head, s.q_heads);
      ASSERT_EQ(w.head % s.heads, 0);
      ASSERT_LT(w.batch, s.batch);
      const int64_t unit = w.head / s.heads, units = s.q_heads / s.heads;
      ++seen[static_cast<size_t>((w.batch * units + unit) * order.q_blocks + w.q_block)];
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), order.count());
  }
}

// With every causal key tile one unit of work, the busiest block of the hero shape and of
// llama3-1b's long context (two L2 sections, 192-row tiles) does at most 0.5% more than the mean.
// Dealt as one list, the rounds that straddle two sections put it 0.7% and 3.4% over
// (bench/tile_order_sim.py).
TEST(TileOrder, CausalWorkIsSharedEvenly) {
  for (const Shape& s : {shape("hero"), shape("llama_long")}) {
    SCOPED_TRACE(s.name);
    const TileOrder order = order_of(s);
    ASSERT_GT(order.count(), order.section_tiles()) << "more than one section";
    const int block_n = 128;
    auto key_tiles = [&](int t) {
      const int q = order.at(t).q_block;
      const int64_t q_end = std::min<int64_t>(int64_t{q + 1} * s.block_m, s.seq_len);
      return static_cast<double>((q_end + block_n - 1) / block_n);
    };
    double total = 0, busiest = 0;
    for (const std::vector<int>& tiles : deal(order, s.grid)) {
      double work = 0;
      for (int t : tiles) work += key_tiles(t);
      total += work;
      busiest = std::max(busiest, work);
    }
    EXPECT_LE(busiest, 1.005 * total / s.grid);
  }
}

// The section size: whole GQA groups, at least half of what fits in L2, and a busiest block (in
// the deal's model) never above the largest sections'; with a window or documents the largest. At
// GPT-2's shape on 396 blocks (64-row tiles, three blocks an SM) the largest sections (64 + 32
// pairs) put it 5.6% over the mean, and 49 + 47 pairs at 3.1%, the floor the longest tile sets
// (bench/tile_order_sim.py).
TEST(TileOrder, SectionsSizedForAnEvenDeal) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.name);
    const TileDeal d = deal_of(s);
    const TileOrder order = order_of(s), largest = largest_sections(s);
    EXPECT_EQ(order.section_pairs % (s.q_heads / s.kv_heads / s.heads), 0) << "whole GQA groups";
    EXPECT_GE(2 * order.section_pairs, largest.section_pairs);
    EXPECT_LE(order.section_pairs, largest.section_pairs);
    EXPECT_LE(busiest_block_work(order, d), busiest_block_work(largest, d));
  }
  // A window or documents: the largest sections (the model counts tiles that documents hide).
  for (const char* name : {"window_docs_64rows", "window_docs_two_heads"}) {
    SCOPED_TRACE(name);
    EXPECT_EQ(order_of(shape(name)).section_pairs, largest_sections(shape(name)).section_pairs);
  }
  TileDeal documents = deal_of(shape("gpt2_64rows")), window = documents;
  documents.mask.has_segments = true;
  window.mask.window = 256;
  EXPECT_EQ(make_tile_order(documents).section_pairs, 64);
  EXPECT_EQ(make_tile_order(window).section_pairs, 64);
  const Shape& gpt2 = shape("gpt2_64rows");
  const TileDeal d = deal_of(gpt2);
  const TileOrder order = order_of(gpt2);
  EXPECT_EQ(largest_sections(gpt2).section_pairs, 64);
  EXPECT_EQ(order.section_pairs, 49);
  int64_t total = 0;
  for (int t = 0; t < order.count(); ++t) {
    total += d.key_tiles(order.at(t).q_block) + kWorkTileRampKeyTiles;
  }
  const double mean = static_cast<double>(total) / gpt2.grid;
  EXPECT_GT(busiest_block_work(largest_sections(gpt2), d), 1.05 * mean);
  EXPECT_LT(busiest_block_work(order, d), 1.035 * mean);
}

// busiest_block_work deals as next_tile does: the same loads as dealing tile by tile.
TEST(TileOrder, ModelDealsAsTheKernel) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.name);
    const TileDeal d = deal_of(s);
    const TileOrder order = order_of(s);
    int64_t busiest = 0;
    for (const std::vector<int>& tiles : deal(order, s.grid)) {
      int64_t work = 0;
      for (int t : tiles) work += d.key_tiles(order.at(t).q_block) + kWorkTileRampKeyTiles;
      busiest = std::max(busiest, work);
    }
    EXPECT_EQ(busiest_block_work(order, d), busiest);
  }
}

// The launcher's cache answers what make_tile_order answers.
TEST(TileOrder, CachedOrderIsTheOrder) {
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(s.name);
    for (int pass = 0; pass < 2; ++pass) {
      const TileOrder a = cached_tile_order(deal_of(s)), b = order_of(s);
      EXPECT_EQ(a.section_pairs, b.section_pairs);
      EXPECT_EQ(a.count(), b.count());
    }
  }
}

}  // namespace
}  // namespace ft::attention

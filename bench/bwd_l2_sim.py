#!/usr/bin/env python3
"""DRAM bytes of the tma backward's Q, dO and dQ streams under an LRU model of the L2.

Builds the grid's order as flash_tma_backward.cuh does (KeyBlockTile: (batch, kv head) pairs in
groups whose Q and dO fit half the L2, key blocks outermost within a group, a larger last
group), runs one block per SM, every step one time unit (a query tile of one query head: its Q
and dO tiles read, its fp32 dQ tile added to), starting the next block of the grid where one
ends, and counts the bytes an LRU cache of --l2-mb misses (reads) and evicts dirty (writes).
K and V (read once a block), lse and D are left out. A model of the order only: real L2s are
not LRU, blocks do not run in lockstep and the steps on the diagonal cost more, so it ranks
step orders at best, and only where it ranks them the same at every cache size.

  python3 bench/bwd_l2_sim.py                          # hero causal, every order, 30 and 40 MB
  python3 bench/bwd_l2_sim.py --order up --l2-mb 40 --group-pairs 1
"""
import argparse
import collections

ORDERS = {
    # heads outer; within a head the query tiles from the diagonal up (the kernel before
    # 2026-12-05, and its deterministic mode) or from the last one down
    "up": lambda heads, tiles: [(h, i) for h in range(heads) for i in tiles],
    "down": lambda heads, tiles: [(h, i) for h in range(heads) for i in reversed(tiles)],
    # query tiles outer, heads inner
    "tiles-outer": lambda heads, tiles: [(h, i) for i in tiles for h in range(heads)],
}


def grid(pairs, key_blocks, sms, group_pairs, l2_bytes, pair_bytes):
    """(pair, key block) of every block in launch order (KeyBlockTile, pair_groups)."""
    size = group_pairs or max(1, min(pairs, l2_bytes // 2 // pair_bytes))
    tail_pairs = max(1, (2 * sms + key_blocks - 1) // key_blocks)  # kTailWaves = 2
    full = (pairs - tail_pairs) // size if pairs > tail_pairs else 0
    tail_first = full * size
    order = []
    for block in range(key_blocks * pairs):
        tail = block >= tail_first * key_blocks
        first = tail_first if tail else block // (size * key_blocks) * size
        group = pairs - tail_first if tail else size
        r = block - first * key_blocks
        kb = r // group
        order.append((first + r - kb * group, kb))
    return order, size


def simulate(args, order_name, l2_mb):
    b, s, hq, hkv, d = args.shape
    heads = hq // hkv
    key_blocks, q_tiles = s // args.block_n, s // args.block_m
    pair_bytes = 2 * heads * s * d * 2
    blocks, size = grid(b * hkv, key_blocks, args.sms, args.group_pairs, 50 << 20, pair_bytes)
    tile_bytes, dq_bytes = args.block_m * d * 2, args.block_m * d * 4
    cap = l2_mb * (1 << 20)
    lru = collections.OrderedDict()
    used = read = written = 0

    def touch(key, nbytes, dirty):
        nonlocal used, read, written
        if key in lru:
            was = lru.pop(key)
            lru[key] = (nbytes, was[1] or dirty)
            return
        read += nbytes  # Q and dO from DRAM; a dQ tile read back (the zeroed buffer at first)
        lru[key] = (nbytes, dirty)
        used += nbytes
        while used > cap:
            _, (n, was_dirty) = lru.popitem(last=False)
            used -= n
            written += n if was_dirty else 0

    def steps(pair, kb):
        first = kb * args.block_n // args.block_m  # causal: the diagonal's query tile
        return ORDERS[order_name](heads, list(range(first, q_tiles)))

    pending = iter(blocks)
    running = []
    for _ in range(args.sms):
        blk = next(pending, None)
        if blk:
            running.append([blk, steps(*blk), 0])
    while running:
        for slot in running:
            (pair, _), walk, k = slot
            h, i = walk[k]
            touch(("q", pair, h, i), tile_bytes, False)
            touch(("do", pair, h, i), tile_bytes, False)
            touch(("dq", pair, h, i), dq_bytes, True)
            slot[2] += 1
        nxt = []
        for slot in running:
            if slot[2] < len(slot[1]):
                nxt.append(slot)
            else:
                blk = next(pending, None)
                if blk:
                    nxt.append([blk, steps(*blk), 0])
        running = nxt
    written += sum(n for n, dirty in lru.values() if dirty)
    return size, read, written


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="32,4096,16,4,128",
                    type=lambda t: tuple(int(x) for x in t.split(",")),
                    help="batch,seq_len,q_heads,kv_heads,head_dim (default: hero causal)")
    ap.add_argument("--block-m", type=int, default=64, help="query rows a step")
    ap.add_argument("--block-n", type=int, default=128, help="keys a block")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--group-pairs", type=int, default=0,
                    help="pairs a group (default: pair_groups()'s, with a 50 MB L2)")
    ap.add_argument("--order", choices=sorted(ORDERS), action="append",
                    help="step orders to model (default: every one)")
    ap.add_argument("--l2-mb", type=float, action="append",
                    help="LRU capacity in MB (default: 30 and 40)")
    args = ap.parse_args()
    for l2_mb in args.l2_mb or [30.0, 40.0]:
        for name in args.order or sorted(ORDERS):
            size, read, written = simulate(args, name, l2_mb)
            print(f"L2 {l2_mb:g} MB, {size} pairs a group, {name:11s}: DRAM read "
                  f"{read / 1e9:.2f} GB, written {written / 1e9:.2f} GB, "
                  f"total {(read + written) / 1e9:.2f} GB")


if __name__ == "__main__":
    main()

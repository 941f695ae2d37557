#!/usr/bin/env python3
"""A fluid model of the decode main launch's dispatch order (a model, not a measurement; docs/design.md, "Session 22:
the dispatch order").

With staggered cursors one row in L writes its checkpoint each step, and each of its programs takes ~3.6x a plain
program's time (session 8's step split: 508 against 142.5 us for a whole step of either kind). The grid is
(V / BV, B, HV): each value head sweeps the batch in turn, so those long programs are spread through the launch and
accumulate among the programs in flight; when the grid runs out, the long ones still running are too few to keep
the memory system busy. This model dispatches programs in grid order onto P concurrent slots; a program's rate is
min(r_max, BW / active), with r_max = f x BW / P (f > 1: a full set of programs saturates the bandwidth, as the
plain steps do at ~95% of the copy peak), and reports the time against the work / bandwidth ideal for three
orders: the grid's (interleaved), the folding rows first, and last.
What it says hinges on f, which is not measured: the grid order's excess is about one long program's time at r_max
over the launch's ~16 waves (12% at f = 1.3, 3% at f = 4, 1% at f = 8), and a lone one-warp program with three
chunks in flight may well stream several times its share under full load. The H200 settles it
(`bench_kernels.py --variants order`); the one measurement so far that bears on it is session 6's run 0748,
staggered against aligned cursors: GDN 182.1 / 180.6 us, KDA 220.9 / 207.9.

    python scripts/dispatch_order_model.py [--slots 2100] [--heavy 3.6] [--factors 1.3,2,4,8]
"""

from __future__ import annotations

import argparse

import numpy as np


def drain_time(heavy: np.ndarray, slots: int, factor: float, heavy_w: float) -> float:
    """Time to run programs of work 1 (heavy: heavy_w) dispatched in the given order onto `slots` slots, bandwidth 1,
    each program at most factor / slots."""
    w = np.where(heavy, heavy_w, 1.0)
    rmax = factor / slots
    t, nxt = 0.0, min(slots, len(w))
    active = w[:nxt].copy()
    while len(active):
        r = min(rmax, 1.0 / len(active))
        dt = active.min() / r
        t += dt
        active = active - dt * r
        done = active <= 1e-12
        add = w[nxt:nxt + int(done.sum())]
        nxt += len(add)
        active = np.concatenate([active[~done], add])
    return t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--B", type=int, default=256)
    ap.add_argument("--HV", type=int, default=32)
    ap.add_argument("--vtiles", type=int, default=4, help="V / BV")
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--slots", type=int, default=2100, help="programs in flight (132 SMs x ~16 per SM)")
    ap.add_argument("--heavy", type=float, default=3.6, help="a folding program's time over a plain one's")
    ap.add_argument("--factors", default="1.3,2,4,8", help="r_max x slots / bandwidth")
    a = ap.parse_args(argv)
    heavy_row = (np.arange(a.B) % a.L) == a.L - 1  # staggered cursors: one row in L folds this step
    grid = np.array([heavy_row[b] for _ in range(a.HV) for b in range(a.B) for _ in range(a.vtiles)])
    ideal = float(np.where(grid, a.heavy, 1.0).sum())
    print(f"B={a.B} HV={a.HV} V/BV={a.vtiles} L={a.L}: {grid.size} programs, {int(grid.sum())} folding "
          f"(x{a.heavy}), {a.slots} slots; time over the work / bandwidth ideal")
    for f in (float(x) for x in a.factors.split(",")):
        res = {name: drain_time(order, a.slots, f, a.heavy) / ideal - 1 for name, order in
               (("grid order", grid), ("folding first", np.sort(grid)[::-1]), ("folding last", np.sort(grid)))}
        print(f"  r_max x{f}: " + ", ".join(f"{k} +{100 * v:.1f}%" for k, v in res.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Small-batch policy: which window a decode launch runs with.

At small batch a decode step is bound by latency, not bytes: the buffered path saves state bytes
that are not the bottleneck and adds a dependent read (h, then the records). There the decode
kernel runs with window 1, which is the conventional decode (read, update, write the state every
step) plus, for a row that still holds records, a fold of them first (the pre-step fold of ring.py
with L = 1). State consistency needs nothing else: every launch, whatever its window, leaves each
slot as ring.py says (h <= capacity, checkpoint + records = the state), so launches of different
windows may follow each other in any order and rows may move between CUDA graphs of different
batch sizes freely.

The thresholds are measured (scripts/bench_kernels.py, arms ours_r* vs ours_L1, H200): the largest
batch size at which window 1 was faster than the buffered window, per layer kind and state dtype.
docs/design.md ("Decode kernels and small-batch policy") records the numbers behind them.
"""

from __future__ import annotations

import os

import torch

# batch sizes <= this value run with window 1 (kind, state element size in bytes)
SMALL_BATCH_MAX: dict[tuple[str, int], int] = {
    ("gdn", 4): 0,
    ("gdn", 2): 0,
    ("kda", 4): 0,
    ("kda", 2): 0,
}


def decode_window(kind: str, B: int, state_dtype: torch.dtype, L: int) -> int:
    """Window for a decode launch of B rows (the ring's L, or 1 at small batch).
    REPLAYSSM_DECODE_WINDOW=<int> forces a window (capped at L), for measurements."""
    forced = os.environ.get("REPLAYSSM_DECODE_WINDOW")
    if forced:
        return max(1, min(L, int(forced)))
    es = torch.empty((), dtype=state_dtype).element_size()
    return 1 if B <= SMALL_BATCH_MAX.get((kind, es), 0) else L

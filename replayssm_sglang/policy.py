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

# batch sizes <= this value run with window 1 (kind, state element size in bytes).
# Measured 2026-11-29 on one H200 (benchmarks/results/kernels-20261129-1924.json, L = 16, bf16
# records), speed vs SGLang's conventional Triton decode, buffered (ours_r16) / window 1 (ours_L1):
#   GDN fp32: B=1 0.92 / 1.26, B=32 0.95 / 1.05, B>=128 1.03-1.04 / (1.00 in the first run)
#   GDN bf16: buffered 0.61-0.90 at every B; window 1: 0.76 (B=1), 0.99 (B=32)
#   KDA fp32: buffered 0.65-0.85 at every B; window 1: 1.04 (B=1), 1.10 (B=32)
#   KDA bf16: buffered 0.43-0.54 at every B; window 1: 0.73 (B=1), 0.98 (B=32)
# so the buffered window is used only where it measured faster: GDN with an fp32 state, B >= 128.
NEVER = 2**31 - 1
SMALL_BATCH_MAX: dict[tuple[str, int], int] = {
    ("gdn", 4): 64,
    ("gdn", 2): NEVER,
    ("kda", 4): NEVER,
    ("kda", 2): NEVER,
}


def decode_window(kind: str, B: int, state_dtype: torch.dtype, L: int) -> int:
    """Window for a decode launch of B rows (the ring's L, or 1 at small batch).
    REPLAYSSM_DECODE_WINDOW=<int> forces a window (capped at L), for measurements."""
    forced = os.environ.get("REPLAYSSM_DECODE_WINDOW")
    if forced:
        return max(1, min(L, int(forced)))
    es = torch.empty((), dtype=state_dtype).element_size()
    return 1 if B <= SMALL_BATCH_MAX.get((kind, es), 0) else L

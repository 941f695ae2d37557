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
# Measured 2026-11-29 on one H200 (benchmarks/results/kernels-20261129-2108.json, L = 16, bf16 records),
# speed vs SGLang's conventional Triton decode: buffered v3 (v3_r16) / window 1 (v1's L = 1 path, ours_L1):
#   GDN fp32: B=1 0.58 / 0.67, B=32 0.93 / 0.78, B=128 1.26, B=256 1.33
#   GDN bf16: buffered 0.40-0.90 at every B; window 1: 0.76 (B=1), 0.99 (B=32)
#   KDA fp32: B=1 0.56 / 1.05, B=32 0.92 / 1.10, B=128 1.11, B=256 1.17
#   KDA bf16: buffered 0.36-0.77 at every B; window 1: 0.73 (B=1), 0.98 (B=32)
# Window 1 was measured at B <= 32 only. GDN fp32 switches between B=1 and 32 (8 is a choice inside that
# interval: the CUDA-graph sizes 2-16 were not timed), KDA fp32 between 32 and 128 (64: the same kind of
# choice); bf16 states stay at window 1, where the buffered path measured slower at every B.
NEVER = 2**31 - 1
SMALL_BATCH_MAX: dict[tuple[str, int], int] = {
    ("gdn", 4): 8,
    ("gdn", 2): NEVER,
    ("kda", 4): 64,
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


def decode_impl(window: int) -> str:
    """Kernel for a decode launch of this window: the buffered window runs decode v3 (kernels/decode_v3.py),
    window 1 runs w1 (kernels/decode_w1.py: the conventional step, plus a fold for a row that still holds
    records). Both follow ring.py's protocol on the same ring, so launches may alternate freely."""
    return "v3" if window > 1 else "w1"

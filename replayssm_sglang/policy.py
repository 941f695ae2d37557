"""Small-batch policy: which window a decode launch runs with.

At small batch a decode step is bound by latency, not bytes: the buffered path saves state bytes
that are not the bottleneck and adds a dependent read (h, then the records). There the decode
kernel runs with window 1, which is the conventional decode (read, update, write the state every
step) plus, for a row that still holds records, a fold of them first (the pre-step fold of ring.py
with L = 1). State consistency needs nothing else: every launch, whatever its window, leaves each
slot as ring.py says (h <= capacity, checkpoint + records = the state), so launches of different
windows may follow each other in any order and rows may move between CUDA graphs of different
batch sizes freely.

The thresholds are measured (scripts/bench_kernels.py, arms v3_* / v3p_* / v3_tg1_* vs ours_w1; H200, and for the
CUDA main launch's fp32 states an H100): the largest batch size at which window 1 was faster than the buffered
window, per layer kind, state dtype and (with the CUDA main launch) read copy.
docs/design.md ("Decode kernels and small-batch policy") records the numbers behind them.
"""

from __future__ import annotations

import os

import torch

# batch sizes <= this value run with window 1 (kind, state element size in bytes).
# Measured 2026-11-30 on one H200 (benchmarks/results/kernels-20261130-{0121,0132}.json, L = 16), speed vs SGLang's
# conventional Triton decode: window 1 (w1, kernels/decode_w1.py) / buffered v3 with the server's records (fp32
# records for an fp32 state):
#   GDN fp32: B=1 1.25 / 0.42, B=32 1.05 / 0.86, B=128 1.01 / 1.38-1.41, B=256 - / 1.49-1.51
#   KDA fp32: B=1 1.27 / 0.44, B=32 1.13 / 0.81, B=128 1.02 / 1.14-1.16, B=256 - / 1.23-1.24
#   GDN fp32 at B=64 (kernels-20261130-0748.json, commit dea4a0b): window 1 1.02, buffered 1.22 (fp32 records);
#     end to end (e2e-20261130-gdn-profile.json, 4c17d30) window 16 forced 1.12x at B = 64 against 1.01x for
#     window 1 (0053766): so GDN fp32 switches at 32 (window 1 up to 32, the buffered window above)
#   KDA fp32 at B=64 (same kernel run): window 1 1.06, buffered 1.03; end to end (6b77c5f, one run) the
#     buffered window 1.17x against 1.09x for window 1: the evidence disagrees, the switch stays at 64
#   GDN bf16: window 1 0.98-1.06 (B = 1, 32, 128); buffered 0.37-0.92 at every B (best arm)
#   KDA bf16: window 1 1.00-1.06 (B = 1, 32, 128); buffered 0.30-0.56
# fp32 states switch between B = 32 (window 1 faster) and 128 (buffered faster): GDN at 32 (B = 64 measured
# buffered-faster), KDA at 64 (B = 64 split, see above; the CUDA-graph sizes in between were not timed).
# bf16 states stay at window 1: the buffered path measured slower than conventional at every B; still so with the
# tile's reduction on the tensor cores (decode_v3 tile_mma, 2026-12-01, kernels-20261201-2125 / -2132): GDN
# 0.88-0.93x, KDA 0.52-0.53x at B = 128-512. (Except the bf16 states with the CUDA main launch:
# CUDA_SMALL_BATCH_MAX below.)
NEVER = 2**31 - 1
SMALL_BATCH_MAX: dict[tuple[str, int], int] = {
    ("gdn", 4): 32,
    ("gdn", 2): NEVER,
    ("kda", 4): 64,
    ("kda", 2): NEVER,
}
# Where the buffered launch's main launch is the CUDA kernel (REPLAYSSM_MAIN_IMPL unset, "auto" or "cuda", and
# kernels/cuda_main.py can run this launch): the bf16 states, whose buffered Triton launch is slower than window 1,
# and since session 48 the fp32 states (their thresholds above were Triton's launch's).
# - GDN: measured 2026-12-03 on one H200 (benchmarks/results/kernels-20261203-0808.json, the server's arguments, the
#   shape then, g8w4_m8_late): buffered 1.10x conventional at B = 128, 1.11x at 256 and 512 (upstream's ReplaySSM
#   1.08-1.11x), against window 1's 0.98-1.06 above. Its default shape since session 34, x16w4c1_m6, re-timed after
#   session 35's PDL fix (kernels-20261204-0327): 1.24x / 1.32x / 1.36x at B = 128 / 256 / 512.
# - KDA (since session 36, its XL default x16w4c1_m6_gp, kernels-20261204-0327): 1.19x / 1.22x / 1.14x at B = 128 /
#   256 / 512 (round-robin 1.16-1.19x), where the layout before it was 1.04-1.06x and Triton's 0.52x.
# - B = 32 and 64 (session 39, kernels-20261204-1714 / -1715, the server's launches, bf16 records): at B = 64 the
#   buffered CUDA launch is 1.11x (GDN) / 1.13x (KDA) conventional against window 1's 1.02x / 1.03x; at B = 32 it is
#   0.93x / 1.03x against 1.05x / 1.06x. Served at B = 64 (e2e-20261204-1649 / -1657, one server each): window 16
#   1.01x / 1.03x, the policy's window 1 then 0.98x / 0.98x. So window 1 up to 32, the buffered window above.
# - fp32 states (session 48, kernels-20261206-0935 / -0940, one H100, the server's step in the default shapes with
#   the main launch's early trigger, against window 1, us): GDN (x16w4c1_m4_sp2, no pre launch) 4.9 / 7.5 / 12.1 /
#   20.2 / 34.1 against 5.1 / 8.9 / 13.9 / 26.0 / 48.4 at B = 1 / 4 / 8 / 16 / 32: the buffered window everywhere
#   (1.25x conventional at B = 1). KDA (x16w4c1_m4_gp) 6.9 / 9.9 / 15.3 / 23.1 / 37.8 / 67.0 against 5.4 / 8.8 /
#   13.7 / 26.4 / 49.2 / 95.6 at B = 1 / 4 / 8 / 16 / 32 / 64: window 1 up to 8 (B = 9-15 not timed).
CUDA_SMALL_BATCH_MAX: dict[tuple[str, int], int] = {
    ("gdn", 2): 32,
    ("kda", 2): 32,
    ("gdn", 4): 0,
    ("kda", 4): 8,
}
# An fp32 state's read copy (issue 7) with the CUDA main launch, by the copy's type (session 48, the same runs): the
# fp8 copy's step (its default shapes; PDL from 33 rows, decode_v3's pdl_min_rows) GDN 10.0 / 11.4 / 16.5 / 24.4 /
# 33.1 / 45.5, KDA 9.1 / 11.1 / 17.1 / 25.6 / 35.4 / 49.1 at B = 1 / 4 / 8 / 16 / 32 / 64, against window 1's above
# (GDN 94.4, KDA 95.6 at 64): window 1 up to 8. A bf16 copy (not timed so) keeps SMALL_BATCH_MAX.
CUDA_RC_SMALL_BATCH_MAX: dict[tuple[str, torch.dtype], int] = {
    ("gdn", torch.float8_e4m3fn): 8,
    ("kda", torch.float8_e4m3fn): 8,
}


def decode_window(kind: str, B: int, state_dtype: torch.dtype, L: int, cuda_main: bool = False,
                  read_dtype: torch.dtype | None = None) -> int:
    """Window for a decode launch of B rows (the ring's L, or 1 at small batch). cuda_main: the buffered launch
    would run the CUDA main launch (the caller checked that it can), whose thresholds (CUDA_SMALL_BATCH_MAX; with a
    read copy of type read_dtype, CUDA_RC_SMALL_BATCH_MAX) then apply where they have any. REPLAYSSM_DECODE_WINDOW=
    <int> forces a window (capped at L), for measurements."""
    forced = os.environ.get("REPLAYSSM_DECODE_WINDOW")
    if forced:
        return max(1, min(L, int(forced)))
    es = torch.empty((), dtype=state_dtype).element_size()
    if cuda_main and read_dtype is not None and (kind, read_dtype) in CUDA_RC_SMALL_BATCH_MAX:
        limit = CUDA_RC_SMALL_BATCH_MAX[(kind, read_dtype)]
    elif cuda_main and read_dtype is None and (kind, es) in CUDA_SMALL_BATCH_MAX:
        limit = CUDA_SMALL_BATCH_MAX[(kind, es)]
    else:
        limit = SMALL_BATCH_MAX.get((kind, es), 0)
    return 1 if B <= limit else L


def decode_impl(window: int) -> str:
    """Kernel for a decode launch of this window: the buffered window runs decode v3 (kernels/decode_v3.py),
    window 1 runs w1 (kernels/decode_w1.py: the conventional step, plus a fold for a row that still holds
    records). Both follow ring.py's protocol on the same ring, so launches may alternate freely."""
    return "v3" if window > 1 else "w1"

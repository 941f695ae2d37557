"""Decode v4 (kernels/decode_v4.py, GDN: the state tile rebuilt on the tensor cores in one launch) against the
float64 references, through test_decode_kernels.Harness: outputs every step, the state at every flush, h and the
records, untouched slots bit-identical (filled with 1e30), outputs poisoned with NaN before each launch.

CPU: Triton interpreter, fp32, small shapes; ``chunk_bytes=64`` and ``block_v=16`` make two K chunks and two
V-tiles of a head, so the chunk loop, the per-chunk fold and the record writers (one program per key head / value
head) all run. GPU (when CUDA is present): real head sizes, fp32 and bf16 states and records.
"""

from __future__ import annotations

import pytest
import torch

from test_decode_kernels import DEV, DTYPES, ON_GPU, Harness, _real_harness
from replayssm_sglang import ring as ringmod
from replayssm_sglang.kernels.decode import replay_decode

SMALL = dict(chunk_bytes=64)  # K = 32 fp32: two 16-wide K chunks


@pytest.mark.parametrize("L", [1, 4, 16])
def test_v4_matches_reference_over_windows(L):
    """Staggered cursors, random forced flushes, padded rows; L = 4: three windows, L = 16: one window plus forced
    flushes, L = 1: every step flushes (no records)."""
    hz = Harness("gdn", B=2 if L == 16 else 3, H=1, HV=2, K=32, V=32, L=L, seed=40 + L, block_v=16,
                 p_forced={1: 0.1, 4: 0.1, 16: 0.15}[L], impl="v4", v4_opts=SMALL)
    st = hz.run({1: 3, 4: 12, 16: 17}[L])
    assert st["flushes"] > 0 and st["padded"] > 0
    if L > 1:
        assert st["forced"] > 0 and st["staggered"] > 0


def test_v4_gqa4_L8_and_L32():
    """Four value heads per key head (the key record is written by one program of the group), and L = 32 (BC 32)."""
    st = Harness("gdn", B=2, H=1, HV=4, K=16, V=16, L=8, seed=4, p_forced=0.1, impl="v4").run(10)
    assert st["flushes"] > 0
    st = Harness("gdn", B=2, H=1, HV=1, K=16, V=16, L=32, seed=3, p_forced=0.0, p_pad=0.05, impl="v4").run(34)
    assert st["flushes"] > 0 and st["staggered"] > 0


def test_v4_window_switching_prefolds():
    """Windows 8, 3, 1: rows with h >= L fold first (pre-step fold), with and without the token; record 0's shared
    parts come from the post launch, its correction from the main launch after its own fold read the old one."""
    hz = Harness("gdn", B=2, H=1, HV=2, K=32, V=32, L=8, seed=11, windows=(8, 8, 8, 3, 1), p_forced=0.05,
                 block_v=16, impl="v4", v4_opts=SMALL)
    st = hz.run(14)
    assert st["prefolds"] > 0 and st["prefold_appends"] > 0


@pytest.mark.parametrize("windows", [(None,), (8, 8, 3)], ids=["fixed", "switching"])
def test_v4_h_rows_snapshot(windows):
    """The caller's h (h_rows, advance_h=False): the launch neither reads nor writes ring.h (junk during it)."""
    hz = Harness("gdn", B=2, H=1, HV=2, K=16, V=16, L=8, seed=47, windows=windows, p_forced=0.1, impl="v4",
                 h_rows=True)
    st = hz.run(12)
    assert st["flushes"] > 0


def test_v4_ring_idx_rows_differ_from_slots():
    """The ring keyed by request row (ring_idx), padding by slot -1 or ring index -1, window switching."""
    hz = Harness("gdn", B=3, H=1, HV=2, K=16, V=16, L=4, seed=48, windows=(4, 4, 4, 1), p_forced=0.1, p_pad=0.3,
                 block_v=16, impl="v4", ring_idx=True)
    st = hz.run(12)
    assert st["flushes"] > 0 and st["padded"] > 0


@pytest.mark.parametrize("state_dtype,rec_dtype", [("bfloat16", "float32"), ("float32", "bfloat16"),
                                                   ("bfloat16", "bfloat16")])
def test_v4_bf16(state_dtype, rec_dtype):
    hz = Harness("gdn", B=2, H=1, HV=2, K=32, V=32, L=4, seed=49, state_dtype=DTYPES[state_dtype],
                 rec_dtype=DTYPES[rec_dtype], block_v=16, impl="v4", v4_opts=SMALL)
    st = hz.run(8)
    assert st["flushes"] > 0


@pytest.mark.parametrize("opts", [dict(dot_precision="ieee"), dict(pipe_stages=1, fold_pipe_stages=2),
                                  dict(pdl=False, chunk_bytes=128)], ids=["ieee", "stages", "nopdl-c128"])
def test_v4_options(opts):
    """The launch options keep the maths (fp32 tolerances): the FMA product, other loop stages, one K chunk."""
    hz = Harness("gdn", B=2, H=1, HV=2, K=32, V=32, L=4, seed=50, p_forced=0.2, block_v=16, impl="v4",
                 v4_opts=dict(SMALL, **opts))
    st = hz.run(6)
    assert st["flushes"] > 0


@pytest.mark.skipif(not ON_GPU, reason="Triton's interpreter computes bf16 tl.dot wrongly (fp32 only on the CPU)")
def test_v4_bf16_products():
    """dot_precision "bf16" (opt-in, upstream's rounding of the product's operands): within the bf16 tolerances."""
    hz = Harness("gdn", B=2, H=1, HV=2, K=32, V=32, L=4, seed=51, p_forced=0.2, block_v=16, impl="v4",
                 rec_dtype=torch.bfloat16, v4_opts=dict(SMALL, dot_precision="bf16"))
    st = hz.run(6)
    assert st["flushes"] > 0


def test_v4_refusals():
    """KDA, read copies, unknown options: refused with the fix named."""
    def args(kind, read_dtype="same"):
        H, HV = (1, 2) if kind == "gdn" else (2, 2)
        lay = ringmod.RingLayout.for_layer(kind, L=4, H=H, HV=HV, K=16, V=16)
        ring = lay.allocate(2, device=DEV, read_dtype=read_dtype)
        GK = 1 if kind == "gdn" else 16
        x = (torch.zeros(1, 2 * H * 16 + HV * 16, device=DEV), torch.zeros(1, HV * GK, device=DEV),
             torch.zeros(1, HV, device=DEV), torch.zeros(HV, device=DEV), torch.zeros(HV * GK, device=DEV))
        return (kind, *x, torch.zeros(2, HV, 16, 16, device=DEV), ring, torch.zeros(1, dtype=torch.int32, device=DEV))

    with pytest.raises(ValueError, match="impl='v3'"):
        replay_decode(*args("kda"), impl="v4")
    with pytest.raises(ValueError, match="read copy"):
        replay_decode(*args("gdn", "bf16"), impl="v4")
    with pytest.raises(ValueError, match="dot_precision"):
        replay_decode(*args("gdn"), impl="v4", v4_opts=dict(dot_precision="bf16x9"))
    with pytest.raises(ValueError, match="v4_opts"):
        replay_decode(*args("gdn"), impl="v3", v4_opts=dict(pipe_stages=2))
    with pytest.raises(ValueError, match="fold"):
        replay_decode(*args("gdn"), impl="v4", fold="dot3")
    with pytest.raises(ValueError, match="block_v given twice"):
        replay_decode(*args("gdn"), impl="v4", block_v=16, v4_opts=dict(block_v=32))


# ---------------------------------------------------------------------------------------------
# GPU: real head sizes (skipped on CPU)
# ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("state_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rec_dtype", ["float32", "bfloat16"])
def test_gpu_real_shapes_v4(state_dtype, rec_dtype):
    """Qwen3-Next's GDN shapes (H 16, HV 32, K = V = 128, L 16), windows 16 / 1 / 4 (pre-step folds), 8 rows."""
    hz = _real_harness("gdn", state_dtype=DTYPES[state_dtype], rec_dtype=DTYPES[rec_dtype], seed=7, impl="v4")
    st = hz.run(26)
    assert st["flushes"] > 0 and st["prefolds"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("B", [8, 96])
def test_gpu_real_shapes_v4_server_args(B):
    """The server's arguments (ring keyed by request row, forced flushes, padding) with fp32 records, PDL on, and
    more programs than fit the GPU at once (B = 96)."""
    hz = _real_harness("gdn", B=B, seed=8, impl="v4", ring_idx=True, p_forced=0.1, p_pad=0.2)
    st = hz.run(26)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["padded"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("opts", [dict(dot_precision="ieee"), dict(block_v=32, chunk_bytes=128),
                                  dict(num_warps=2), dict(fold_pipe_stages=2), dict(dot_precision="bf16"),
                                  dict(block_v=32, chunk_bytes=128, dot_precision="bf16")],
                         ids=["ieee", "32-c128", "2warps", "foldpipe2", "bf16", "32-c128-bf16"])
def test_gpu_real_shapes_v4_options(opts):
    """The configurations the benchmark times, each checked against float64 first (bf16 products: with bf16 records,
    at their tolerances)."""
    rec = torch.bfloat16 if opts.get("dot_precision") == "bf16" else torch.float32
    hz = _real_harness("gdn", seed=9, impl="v4", v4_opts=opts, rec_dtype=rec)
    st = hz.run(26)
    assert st["flushes"] > 0

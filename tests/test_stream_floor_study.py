"""scripts/stream_floor_study.py: its kernels compute the item maths they claim, under Triton's interpreter.

The study's GPU numbers (per-tile against persistent programs) only mean something if every arm computes the same
thing: each arm here runs on a fresh small problem (bf16 or fp8 tiles, a padded row, ring rows permuted, h random)
against the float64 reference written from the module docstring, with NaN-poisoned outputs; the persistent arms
with a program count that does not divide the items, so the walk's tail and its prefetches past the end are covered.
"""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import stream_floor_study as S  # noqa: E402


@pytest.mark.parametrize("arm,tile_dtype", [
    ("tile_w2", torch.bfloat16),
    ("stream_w2", torch.float8_e4m3fn),
    ("tile_hgate_c128_s3_w1", torch.bfloat16),
    ("tile_c64_s2_w1", torch.float8_e4m3fn),
    ("persist_p2_w2", torch.bfloat16),        # 6 programs over 256 items: a tail of 4
    ("persist_hgate_p2_w2", torch.float8_e4m3fn),
    ("persist_tl_p2_s2_w2", torch.bfloat16),
])
def test_arm_matches_float64(arm, tile_dtype):
    seed = torch.seed() % 100000
    errs = S.check([arm], tile_dtype, torch.device("cpu"), seed, B=2, pad_rows=1, n_sm=3)
    assert errs[arm] < 1e-5, (arm, seed, errs)


def test_reference_sees_the_chain():
    """The reference is not blind to what the chain loads: dropping the slot / ring-row / h indirection (the stream
    arms' maths) changes the answer by far more than the tolerance, so an arm that skipped it would fail."""
    d = S.make_problem(2, torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(3), pad_rows=0)
    a, b = S.reference(d, True), S.reference(d, False)
    assert ((a - b).norm() / a.norm()).item() > 0.1


def test_arm_names_are_checked():
    assert S.parse_arm("persist_tl_hgate_p8_s3_w4") == dict(kind="persist_tl", hgate=True, per_sm=8, stages=3,
                                                            warps=4, BV=32, chunk_bytes=None)
    assert S.parse_arm("tile_c128_s3_w1")["chunk_bytes"] == 128
    for bad in ("persist_w2", "persist_tl_p4_w2", "tile_c64_w1", "persist_c64_p2_s2_w2", "foo_w2"):
        with pytest.raises(ValueError):
            S.parse_arm(bad)


def test_plot_draws_every_dtype(tmp_path):
    """--plot merges runs per tile dtype (a later run's arm replaces an earlier one of the same name) into one PNG."""
    pytest.importorskip("matplotlib")
    paths = []
    for i, (td, arms) in enumerate([("bf16", {"stream_w2": 80.0, "tile_w2": 90.0}),
                                    ("bf16", {"tile_w2": 88.0, "persist_p4_w2": 120.0}),
                                    ("fp8_e4m3", {"stream_w2": 70.0, "persist_tl_p8_s2_w2": 110.0})]):
        rows = [dict(arm=a, **S.parse_arm(a), t_us=t) for a, t in arms.items()]
        p = tmp_path / f"r{i}.json"
        p.write_text(__import__("json").dumps(dict(meta=dict(tile_dtype=td, batch=256, commit=f"c{i}", gpu="x"),
                                                    rows=rows)))
        paths.append(str(p))
    png = tmp_path / "out.png"
    S.plot(paths, str(png))
    assert png.stat().st_size > 1000

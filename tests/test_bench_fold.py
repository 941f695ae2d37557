"""scripts/bench_fold.py (the standalone fold probe): every configuration it would time on the GPU matches float64
under the interpreter at small sizes (the probe times a configuration only after the same check on the GPU)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))

import bench_fold  # noqa: E402


def test_fold_probe_configurations_match_float64(capsys):
    assert bench_fold.main(["--cpu-check", "--quick"]) == 0
    assert "configurations match float64" in capsys.readouterr().out


def test_fold_probe_table_picks_the_fastest_per_mode():
    res = dict(rows=[dict(mode="rmw", BV=8, warps=1, BKC=128, stages=1, us=300.0, TB_s=3.6),
                     dict(mode="rmw", BV=16, warps=1, BKC=32, stages=3, us=280.0, TB_s=3.8),
                     dict(mode="dot3", BV=32, warps=1, BKC=128, stages=1, error="x")])
    t = bench_fold.table(res)
    assert "| rmw | 16 x 1, 32, 3 | 280.0 | 3.80 |" in t and "dot3" not in t

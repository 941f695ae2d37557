"""scripts/bench_kernels.py's arm setup on CPU (Triton interpreter): the server-like arguments (ring keyed by request
row through ring_idx, a forced-flush mask) must give the same decode as the plain setup (ring keyed by slot), so
that a timing difference between the two is the kernels' and not a different computation."""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import bench_kernels as bk  # noqa: E402


@pytest.mark.parametrize("kind,read_dtype", [("gdn", "bf16"), ("kda", "fp8_e4m3"), ("kda", "same")])
def test_server_like_arm_same_outputs(kind, read_dtype, monkeypatch):
    monkeypatch.setattr(bk, "KIND_SHAPES", {"gdn": dict(H=2, HV=4, K=32, V=16), "kda": dict(H=2, HV=2, K=32, V=16)})
    outs = []
    for server_like in (False, True):
        c = bk.Case(kind, 6, "float32", torch.device("cpu"), L=4)
        run = bk.arm_ours(c, torch.float32, impl="v3", read_dtype=read_dtype, server_like=server_like)
        steps = []
        for st in range(6):  # staggered cursors over L = 4: every step has rows that write their checkpoint
            c.out.fill_(float("nan"))
            run(st)
            steps.append(c.out.float().clone())
        outs.append(torch.stack(steps))
    assert torch.isfinite(outs[1]).all() and outs[1].abs().max() > 0
    assert torch.equal(outs[0], outs[1])

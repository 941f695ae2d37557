"""The float64 references agree with each other and with ring.py's rule (no kernels here).

ReplayReference computes outputs from the checkpoint plus records (the unrolled identity), never
from a running state; conventional_step runs the plain recurrence. They must agree to float64
rounding over many windows, and the checkpoint at every flush must equal the sequential state.
"""

from __future__ import annotations

import pytest
import torch

from conftest import extra_cases
from replayssm_sglang import reference as R
from replayssm_sglang import ring as ringmod


def _run(kind, *, B=4, H=2, HV=4, K=8, V=6, L=4, steps=30, seed=0, windows=None, p_forced=0.15, p_pad=0.2,
         lower_bound=None):
    if kind == "kda":
        HV = H
    g = torch.Generator().manual_seed(seed)
    slots = B + 2
    state0 = torch.randn(slots, HV, V, K, generator=g, dtype=torch.float64) * 0.3
    seq = state0.clone()
    rep = R.ReplayReference(kind, state0, H=H, L=L)
    row_slot = torch.randperm(slots, generator=g)[:B].to(torch.int32)
    n_flush = n_prefold = 0
    for _ in range(steps):
        mixed, a, b, A_log, dt_bias = R.random_decode_inputs(kind, B, H, HV, K, V, generator=g, dtype=torch.float64)
        x = R.unpack(kind, mixed, a, b, A_log, dt_bias, H=H, HV=HV, K=K, V=V, lower_bound=lower_bound)
        slot_idx = row_slot.clone()
        slot_idx[torch.rand(B, generator=g) < p_pad] = -1
        forced = (torch.rand(B, generator=g) < p_forced).to(torch.int32)
        Lw = windows[int(torch.randint(len(windows), (1,), generator=g))] if windows else L
        h0 = rep.h.clone()
        n_prefold += int((h0[slot_idx[slot_idx >= 0].long()] >= Lw).sum())
        o_rep = rep.step(x, slot_idx, forced, L=Lw)
        o_seq = R.conventional_step(seq, x, slot_idx)
        assert torch.allclose(o_rep, o_seq, rtol=1e-10, atol=1e-12)
        assert torch.equal(o_rep[slot_idx < 0], torch.zeros_like(o_rep[slot_idx < 0]))
        for n in torch.nonzero(rep.flushed).flatten().tolist():
            s = int(slot_idx[n])
            if int(rep.h[s]) == 0:  # flushed with this token (a pre-step fold alone leaves h = 1)
                assert torch.allclose(rep.state[s], seq[s], rtol=1e-10, atol=1e-12)
            n_flush += 1
        # the state the ring stands for (checkpoint + records) is always the sequential state
        for s in row_slot.tolist():
            h = int(rep.h[s])
            G = rep.G[s, :, h - 1] if h else torch.zeros(HV, rep.G.shape[-1], dtype=torch.float64)
            assert torch.allclose(rep._fold(s, h, G), seq[s], rtol=1e-10, atol=1e-12)
    return n_flush, n_prefold


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("L", [1, 2, 8])
def test_protocol_equals_sequential(kind, L):
    n_flush, _ = _run(kind, L=L, seed=L)
    assert n_flush > 0


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_window_switching(kind):
    _, n_prefold = _run(kind, L=8, windows=(8, 8, 3, 1), seed=5)
    assert n_prefold > 0


def test_kda_safe_gate():
    _run("kda", L=4, lower_bound=-5.0, seed=9)


def test_gating_matches_formula():
    """g = -exp(A_log) softplus(a + dt_bias), softplus(x) = x above 20; beta = sigmoid(b)."""
    a = torch.tensor([[-30.0, 0.0, 3.0, 25.0]], dtype=torch.float64)
    dt = torch.tensor([0.5, -0.5, 0.0, 0.0], dtype=torch.float64)
    A_log = torch.log(torch.tensor([1.0, 2.0, 0.5, 1.0], dtype=torch.float64))
    g = R.gate("gdn", a, dt, A_log, HV=4, K=1).flatten()
    x = a.flatten() + dt
    want = -torch.exp(A_log) * torch.where(x > 20, x, torch.log(1 + torch.exp(x)))
    assert torch.allclose(g, want, rtol=1e-14)
    assert g[3] == -25.0


def test_l1_is_conventional():
    """L = 1: every step flushes, nothing is ever recorded."""
    g = torch.Generator().manual_seed(1)
    st = torch.randn(3, 2, 4, 4, generator=g, dtype=torch.float64)
    rep = R.ReplayReference("gdn", st, H=1, L=1)
    for _ in range(3):
        x = R.unpack("gdn", *R.random_decode_inputs("gdn", 2, 1, 2, 4, 4, generator=g), H=1, HV=2, K=4, V=4)
        rep.step(x, torch.tensor([2, 0], dtype=torch.int32))
        assert int(rep.h.abs().sum()) == 0 and bool(rep.flushed.all())


def test_reference_detects_a_wrong_rule(monkeypatch):
    """The reference checks itself against ring.py: a changed flush rule is caught."""
    monkeypatch.setattr(ringmod, "h_after_decode", lambda h, L, forced=None: h + 1)
    with pytest.raises(AssertionError):
        _run("gdn", L=4, steps=6, p_forced=0.0, p_pad=0.0)


@pytest.mark.parametrize("case", extra_cases(), ids=lambda c: str(c))
def test_extra_cases(case):
    if case.get("T", 1) != 1:
        pytest.skip("T > 1 belongs to the verify reference")
    kind = case.get("kind", "gdn")
    H = case.get("H", 2)
    HV = case.get("HV", 2 * H if kind == "gdn" else H)
    _run(kind, B=min(case.get("B", 4), 8), H=H, HV=HV, K=min(case.get("K", 8), 32), V=min(case.get("V", 6), 32),
         L=case.get("L", 4), seed=case.get("seed", 0), steps=20)

"""Two-precision state (issue 7): rounding operators, the two-copy protocol, and the error study.

The study (``test_error_study_*``): one head, K = V = 128, 4096 decode steps, L = 16, seeded random
inputs, slow-decay (per-step decays uniform in 0.9995..0.99999) and fast-decay (0.9..0.95) heads,
relative output error against the exact float64 recurrence for (a) the state rounded every step,
(b) one low-precision checkpoint rounded once per window, (c) two copies (fp32 recurrence copy,
read copy in bf16 or fp8 e4m3). "Error at step t" is the aggregate relative error over the 64
steps ending at t (``precision.window_error``). Keys are drawn from a random 32-dimensional subspace
plus 10% isotropic noise (``key_rank=32``): with isotropic keys the delta rule itself forgets every
direction within about K / beta steps, so no arm can accumulate for long (that case is checked too,
for (c) staying flat). docs/design.md, "Precision: two copies", explains the mechanism.
"""

from __future__ import annotations

import math

import pytest
import torch

from replayssm_sglang import precision as P
from replayssm_sglang import reference as R

F64 = torch.float64


def _seed() -> int:
    return int(torch.randint(0, 2**31 - 1, (1,)))


# --- round to nearest -------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_round_nearest_is_the_cast(dtype):
    x = torch.randn(1000, dtype=F64) * 10.0
    r = P.round_nearest(x, dtype)
    assert torch.equal(r, x.to(dtype).to(F64))
    assert torch.equal(P.round_nearest(r, dtype), r)  # idempotent
    ulp_rel = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24}[dtype]
    assert float(((r - x).abs() / x.abs()).max()) <= ulp_rel * (1 + 1e-12)
    assert torch.isnan(P.round_nearest(torch.tensor([math.nan], dtype=F64), dtype)).all()


# --- stochastic rounding ---------------------------------------------------------------------------

def _neighbours(x: torch.Tensor, dtype):
    """The representable numbers just below and above each x (by stepping the cast value)."""
    r = x.to(dtype)
    lo = torch.where(r.to(F64) <= x, r, torch.nextafter(r, torch.full_like(r, -math.inf)))
    hi = torch.where(r.to(F64) >= x, r, torch.nextafter(r, torch.full_like(r, math.inf)))
    return lo.to(F64), hi.to(F64)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_lands_on_a_neighbour_and_is_representable(dtype):
    g = torch.Generator().manual_seed(_seed())
    x = torch.randn(5000, dtype=F64, generator=g) * torch.exp2(torch.randint(-20, 12, (5000,), generator=g)).to(F64)
    if dtype == torch.float16:  # keep inside fp16's range; include subnormals (below 2^-14)
        x = x.clamp(-6e4, 6e4)
        x[:200] = torch.randn(200, dtype=F64, generator=g) * 2.0**-18
    r = P.round_stochastic(x, dtype, g)
    assert torch.equal(r.to(dtype).to(F64), r), "not representable in the format"
    lo, hi = _neighbours(x, dtype)
    assert bool(((r == lo) | (r == hi)).all()), "stochastic rounding left the two neighbours"
    assert bool((r == lo).any()) and bool((r == hi).any())
    exact = x.to(dtype).to(F64)
    assert torch.equal(P.round_stochastic(exact, dtype, g), exact), "representable values must not move"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_is_unbiased(dtype):
    """For x = lo + f ulp the mean of n draws must be x within 5 standard errors, and the fraction
    rounded up must be f. Round to nearest fails the same check (bias up to ulp/2)."""
    g = torch.Generator().manual_seed(_seed())
    n = 40000
    base = torch.tensor([1.0, -3.0, 1234.5, 2.0**-10], dtype=F64)
    if dtype == torch.float16:
        base = torch.cat([base, torch.tensor([2.0**-20], dtype=F64)])  # fp16 subnormal
    fracs = torch.tensor([0.3, 0.7, 0.05, 0.5, 0.9], dtype=F64)[: base.numel()]
    lo = base.to(dtype).to(F64)
    _, hi = _neighbours(lo + lo.abs() * 1e-9 + 1e-300, dtype)
    step = hi - lo
    x = lo + fracs * step
    draws = P.round_stochastic(x.expand(n, -1).contiguous(), dtype, g)
    mean = draws.mean(0)
    se = step * 0.5 / math.sqrt(n)  # sqrt(p(1-p)) <= 1/2
    assert bool(((mean - x).abs() < 5 * se).all()), (mean - x) / se
    up = (draws == hi).to(F64).mean(0)
    assert bool(((up - fracs).abs() < 5 * 0.5 / math.sqrt(n)).all())
    rtn = P.round_nearest(x, dtype)
    assert bool(((rtn - x).abs() >= 5 * se).any()), "the check must be able to fail"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_stochastic_rounding_non_finite(dtype):
    g = torch.Generator().manual_seed(_seed())
    x = torch.tensor([math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0], dtype=F64)
    r = P.round_stochastic(x.expand(100, -1).contiguous(), dtype, g)
    assert torch.isnan(r[:, :2]).all(), "NaN must stay NaN"
    assert (r[:, 2] == math.inf).all() and (r[:, 3] == -math.inf).all()
    assert (r[:, 4:] == 0).all()
    big = torch.full((1000,), float(torch.finfo(dtype).max) * (1 + 2.0**-12), dtype=F64)
    rb = P.round_stochastic(big, dtype, g)
    assert not torch.isnan(rb).any() and bool(((rb == float(torch.finfo(dtype).max)) | (rb == math.inf)).all())


# --- fp8 e4m3 with per-row scales -----------------------------------------------------------------

def test_fp8_scales_and_accuracy():
    g = torch.Generator().manual_seed(_seed())
    # rows of very different magnitude, like the state rows of different value channels
    x = torch.randn(4, 16, 128, dtype=F64, generator=g) * torch.exp2(torch.randint(-12, 12, (4, 16, 1), generator=g)).to(F64)
    x[1, 3] = 0.0
    q, s = P.quantize_fp8_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and s.shape == x.shape[:-1]
    amax = x.abs().amax(-1)
    expect = torch.where(amax == 0, torch.ones_like(amax), amax).to(torch.float32)
    expect = torch.where(amax == 0, expect, (amax / 448.0).to(torch.float32))
    assert torch.equal(s, expect)
    qa = q.to(F64).abs().amax(-1)
    assert bool((qa[amax > 0] == 448.0).all()), "each row's largest element must map to 448"
    assert bool((q[1, 3].to(F64) == 0).all())
    d = P.dequantize_fp8_rows(q, s)
    assert torch.isfinite(d).all()
    # e4m3: 3 stored mantissa bits, half an ulp = 2^-4 relative for normal codes (|code| >= 2^-6)
    normal = q.to(F64).abs() >= 2.0**-6
    rel = ((d - x).abs() / x.abs())[normal]
    assert float(rel.max()) <= 2.0**-4 * (1 + 1e-6)
    # one row's scale never touches another row
    x2 = x.clone()
    x2[2, 5] *= 1000.0
    q2, s2 = P.quantize_fp8_rows(x2)
    keep = torch.ones(4, 16, dtype=torch.bool)
    keep[2, 5] = False
    assert torch.equal(q2.view(torch.uint8)[keep], q.view(torch.uint8)[keep]) and torch.equal(s2[keep], s[keep])
    assert torch.equal(P.round_fp8_rows(x), d)


def test_fp8_saturation_and_non_finite():
    y = torch.tensor([447.0, 448.0, 449.0, 470.0, 1e6, -1e6, math.inf, -math.inf, math.nan], dtype=F64)
    r = P.saturate_fp8(y).to(F64)
    assert r[:6].tolist() == [448.0, 448.0, 448.0, 448.0, 448.0, -448.0]
    assert r[6] == 448.0 and r[7] == -448.0
    assert torch.isnan(r[8])
    # through the quantizer: a NaN or inf in a row poisons the whole dequantized row, others intact
    x = torch.randn(3, 32, dtype=F64)
    x[0, 7] = math.nan
    x[1, 0] = math.inf
    d = P.round_fp8_rows(x)
    assert torch.isnan(d[0]).all() and torch.isnan(d[1]).all()
    assert torch.isfinite(d[2]).all()


def test_read_rounding_and_bytes():
    x = torch.randn(2, 8, 16, dtype=F64)
    rec = P.round_state(x, "float32")
    assert P.round_read(x, "same", state_value=rec) is rec
    assert torch.equal(P.round_read(x, "bf16"), x.to(torch.bfloat16).to(F64))
    assert torch.equal(P.round_read(x, "fp8_e4m3"), P.round_fp8_rows(x))
    with pytest.raises(ValueError):
        P.round_read(x, "int8")
    assert P.read_copy_bytes(32, 128, 128, "same") == 0
    assert P.read_copy_bytes(32, 128, 128, "bf16") == 32 * 128 * 128 * 2
    assert P.read_copy_bytes(32, 128, 128, "fp8_e4m3") == 32 * 128 * 128 + 32 * 128 * 4


# --- the protocol ---------------------------------------------------------------------------------

def test_pool_writes_both_copies_from_one_matrix():
    g = torch.Generator().manual_seed(_seed())
    S = torch.randn(3, 2, 8, 16, dtype=F64, generator=g)
    pool = P.TwoCopyPool(S, "float32", "fp8_e4m3")
    assert torch.equal(pool.rec, S.to(torch.float32).to(F64))
    assert torch.equal(pool.read, P.round_fp8_rows(S))
    assert torch.equal(pool[1], pool.read[1])
    pool.folding = True
    assert torch.equal(pool[1], pool.rec[1])
    sr = P.TwoCopyPool(S, "bfloat16", "fp8_e4m3", generator=g)
    assert torch.equal(sr.rec.to(torch.bfloat16).to(F64), sr.rec)
    assert not torch.equal(sr.rec, S.to(torch.bfloat16).to(F64)), "bf16 recurrence copy must round stochastically"


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_non_flush_steps_read_only_the_read_copy(kind):
    """Poison the recurrence copy right after a flush: the L-1 non-flush steps that follow give the
    same outputs as an unpoisoned run (they read the read copy only); the next flush folds the
    poisoned recurrence copy (it reads nothing else), so NaN appears in both copies after it."""
    H, HV, K, V, L = 1, 1, 16, 8, 4
    x = P.study_inputs(kind, "fast", 3 * L, K, V, _seed())
    slot = torch.zeros(1, dtype=torch.int32)
    zero = torch.zeros(1, HV, V, K, dtype=F64)
    a = P.TwoCopyReference(kind, zero, H=H, L=L, state_dtype="float32", read_dtype="bf16")
    b = P.TwoCopyReference(kind, zero, H=H, L=L, state_dtype="float32", read_dtype="bf16")
    for t in range(L):  # the step t = L-1 flushes
        assert torch.equal(a.step(x.step(t), slot), b.step(x.step(t), slot))
    assert bool(b.flushed[0])
    b.state.rec.fill_(math.nan)
    for t in range(L, 2 * L - 1):
        assert torch.equal(a.step(x.step(t), slot), b.step(x.step(t), slot))
        assert not bool(b.flushed[0])
    o = b.step(x.step(2 * L - 1), slot)
    assert bool(b.flushed[0])
    assert torch.isnan(o).all(), "the flush step reads the recurrence copy"
    assert torch.isnan(b.state.rec).all() and torch.isnan(b.state.read).all()


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_flush_step_reads_only_the_recurrence_copy(kind):
    """Poison the read copy just before a flush step: the flush step's output, its fold and every
    later step equal an unpoisoned run (the flush rewrites the read copy from the fold)."""
    H, HV, K, V, L = 1, 1, 16, 8, 4
    x = P.study_inputs(kind, "fast", 4 * L, K, V, _seed())
    slot = torch.zeros(1, dtype=torch.int32)
    zero = torch.zeros(1, HV, V, K, dtype=F64)
    a = P.TwoCopyReference(kind, zero, H=H, L=L, state_dtype="float32", read_dtype="fp8_e4m3")
    b = P.TwoCopyReference(kind, zero, H=H, L=L, state_dtype="float32", read_dtype="fp8_e4m3")
    for t in range(2 * L - 1):
        assert torch.equal(a.step(x.step(t), slot), b.step(x.step(t), slot))
    b.state.read.fill_(math.nan)
    for t in range(2 * L - 1, 4 * L):
        assert torch.equal(a.step(x.step(t), slot), b.step(x.step(t), slot))
    assert torch.equal(a.state.rec, b.state.rec) and torch.equal(a.state.read, b.state.read)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_batched_study_matches_the_reference_classes(kind, dtype):
    """``error_study`` runs all arms as one batched recurrence; each arm must give the outputs of
    the reference classes (TwoCopyReference on ReplayReference's step math, RoundedConventional on
    conventional_step) step by step, over several windows."""
    K, V, L, steps = 32, 16, 8, 5 * 8
    seed = _seed()
    res = P.error_study(kind, "slow", dtype, steps=steps, K=K, V=V, L=L, seed=seed, key_rank=8)
    x = P.study_inputs(kind, "slow", steps, K, V, seed, key_rank=8)
    out = res["outputs"]
    for i, arm in enumerate(("exact", *P.ARMS)):
        ref = P.reference_run(kind, arm, dtype, x, L=L)
        err = float((out[:, i] - ref).norm() / ref.norm())
        assert err < 1e-9, (arm, err)
    # and the arms differ from each other (the comparison can fail)
    assert float((out[:, 2] - out[:, 3]).norm()) > 1e-6 * float(out[:, 0].norm())


# --- the error study ------------------------------------------------------------------------------

STUDY = dict(steps=4096, K=128, V=128, L=16, key_rank=32)


def _at(res, arm, t):
    return P.window_error(res[arm], res["norm"], t)


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_error_study_slow_decay(kind, dtype):
    res = P.error_study(kind, "slow", dtype, seed=1234, arms=P.ARMS, **STUDY)
    for arm in P.ARMS:
        assert torch.isfinite(res[arm]).all(), arm
    a256, a4k = _at(res, "a_every_step", 256), _at(res, "a_every_step", 4096)
    b256, b4k = _at(res, "b_checkpoint", 256), _at(res, "b_checkpoint", 4096)
    c256, c4k = _at(res, "c_two_copies", 256), _at(res, "c_two_copies", 4096)
    assert c4k <= 1.5 * c256, f"(c) two copies grew: {c256:.3g} -> {c4k:.3g}"
    assert a4k >= 2.0 * a256, f"(a) rounding every step did not grow: {a256:.3g} -> {a4k:.3g}"
    assert b4k >= 2.0 * b256, f"(b) one low-precision checkpoint did not grow: {b256:.3g} -> {b4k:.3g}"
    assert c4k < b4k < a4k
    # (c) is about one read-copy rounding of the state: bf16 ~2^-9, fp8 e4m3 ~2^-5 relative
    bound = {"bf16": 2.0**-8, "fp8_e4m3": 2.0**-4}[dtype]
    assert c4k < bound
    # what leaks into the recurrence copy (through the u cached by steps that read the read copy)
    # is below one read-copy rounding and does not accumulate; (b)'s checkpoint error does
    rc, rb = res["recurrence_c_two_copies"], res["recurrence_b_checkpoint"]
    assert rc.shape[0] == 4096 // 16 and torch.isfinite(rc).all()
    assert float(rc[-1]) <= 1.5 * float(rc[256 // 16 - 1]) and float(rc[-1]) < c4k
    assert float(rb[-1]) >= 2.0 * float(rb[256 // 16 - 1])


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_error_study_fast_decay(dtype):
    """Fast decay forgets within a window: nothing accumulates, (b) and (c) are about equal, and
    (a), which rounds every step, is worse by about sqrt(L)."""
    res = P.error_study("gdn", "fast", dtype, seed=4321, arms=P.ARMS, **STUDY)
    a256, a4k = _at(res, "a_every_step", 256), _at(res, "a_every_step", 4096)
    c256, c4k = _at(res, "c_two_copies", 256), _at(res, "c_two_copies", 4096)
    assert c4k <= 1.5 * c256 and a4k <= 1.5 * a256
    assert c4k <= 1.2 * _at(res, "b_checkpoint", 4096)
    assert a4k > 2.0 * c4k


def test_error_study_isotropic_keys_two_copies_flat():
    """Isotropic keys: the delta rule forgets every direction within ~K/beta steps, so (a) grows
    little; (c) must still be flat and below (a) and (b)."""
    kw = dict(STUDY, key_rank=None)
    res = P.error_study("gdn", "slow", "fp8_e4m3", seed=99, arms=P.ARMS, **kw)
    c256, c4k = _at(res, "c_two_copies", 256), _at(res, "c_two_copies", 4096)
    assert c4k <= 1.5 * c256
    assert c4k < _at(res, "b_checkpoint", 4096) < _at(res, "a_every_step", 4096)


# --- verify steps (reference_verify.RingModel with two copies) -------------------------------------

def _verify_run(kind, models, steps, *, T=4, L=8, B=3, H=1, HV=2, K=16, V=8, seed=0, poison=None):
    """Drive RingModel-like ``models`` with the same random verify steps and accepts; ``poison(i, m)``
    may tamper with a model before step i. Returns the outputs per model, the pre-fold flags and the
    reference stream's outputs."""
    from replayssm_sglang import reference_verify as RV
    from replayssm_sglang import ring as ringmod

    if kind == "kda":
        H = HV
    g = torch.Generator().manual_seed(seed)
    A_log, dt_bias = RV.random_params(kind=kind, HV=HV, K=K, gen=g)
    C0 = torch.randn(B, HV, V, K, generator=g, dtype=F64) * 0.3
    kw = dict(kind=kind, L=L, T_max=T, H=H, HV=HV, K=K, V=V, A_log=A_log, dt_bias=dt_bias)
    ms = [mk(C0, **kw) for mk in models]
    ref = RV.ReferenceStream(C0, kind=kind, H=H, HV=HV, K=K, V=V, A_log=A_log, dt_bias=dt_bias)
    outs = [[] for _ in ms]
    pre, routs = [], []
    for i in range(steps):
        mixed, a, b = RV.random_inputs(kind=kind, B=B, T=T, H=H, HV=HV, K=K, V=V, gen=g, dtype=torch.float64)
        acc = torch.randint(1, T + 1, (B,), generator=g)
        pre.append(ringmod.needs_prefold(ms[0].h, T, L).clone())
        if poison is not None:
            for j, m in enumerate(ms):
                poison(i, j, m)
        for j, m in enumerate(ms):
            outs[j].append(m.verify(mixed, a, b, T).reshape(B, T, HV, V))
            m.commit(acc)
        routs.append(ref.verify(mixed, a, b, T).reshape(B, T, HV, V))
        ref.commit(acc)
    return outs, pre, routs


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_verify_two_copies_same_is_ring_model(kind):
    from replayssm_sglang import reference_verify as RV

    two = lambda C0, **kw: P.TwoCopyRingModel(C0, state_dtype="float64", read_dtype="same", **kw)  # noqa: E731
    outs, pre, _ = _verify_run(kind, [RV.RingModel, two], 24, seed=_seed())
    assert any(bool(p.any()) for p in pre), "no pre-step fold happened"
    for o1, o2 in zip(*outs):
        assert torch.equal(o1, o2)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_verify_rows_read_the_copy_the_rule_says(kind):
    """Before every step, a deep copy of the model gets NaN in the recurrence copy of each row whose
    step does not fold and in the read copy of each row whose step folds; its outputs must equal
    the untouched model's (each row read only the copy it should), over random accepts."""
    import copy

    from replayssm_sglang import ring as ringmod

    T, L = 4, 8
    seen = {"pre": 0, "plain": 0}

    def poison(i, j, m):
        if j != 0:
            return
        pre = ringmod.needs_prefold(m.h, T, L)
        twin = copy.deepcopy(m)
        twin.__class__ = P.TwoCopyRingModel  # the twin only runs, it does not check
        for r in range(m.h.shape[0]):
            if bool(pre[r]):
                twin.C.read[r] = math.nan
                seen["pre"] += 1
            else:
                twin.C.rec[r] = math.nan
                seen["plain"] += 1
        poison.twin = twin

    class Checked(P.TwoCopyRingModel):
        def verify(self, mixed_qkv, a, b, T):
            o = super().verify(mixed_qkv, a, b, T)
            o2 = poison.twin.verify(mixed_qkv, a, b, T)
            assert torch.equal(o, o2)
            return o

    def mk(C0, **kw):
        return Checked(C0, state_dtype="float32", read_dtype="fp8_e4m3", **kw)

    _verify_run(kind, [mk], 24, T=T, L=L, seed=_seed(), poison=poison)
    assert seen["pre"] > 0 and seen["plain"] > 0


@pytest.mark.parametrize("read_dtype,tol", [("bf16", 2.0**-7), ("fp8_e4m3", 2.0**-3)])
def test_verify_two_copies_accuracy(read_dtype, tol):
    """Against the float64 stream on the accepted tokens: error about one read-copy rounding."""
    def mk(C0, **kw):
        return P.TwoCopyRingModel(C0, state_dtype="float32", read_dtype=read_dtype, **kw)

    outs, _, routs = _verify_run("gdn", [mk], 32, seed=_seed())
    o, r = torch.stack(outs[0]), torch.stack(routs)
    # drafts past the accepted ones are computed on a different history by the stream: compare the
    # first draft of each step (always on the committed history in both)
    o, r = o[:, :, 0], r[:, :, 0]
    err = float((o - r).norm() / r.norm())
    assert torch.isfinite(o).all() and err < tol, err
    assert err > 1e-9, "the read copy must perturb something"

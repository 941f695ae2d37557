"""Two-precision state (issue 7): rounding operators and a float64 reference of the two-copy protocol.

Operators (all take float64 tensors and return float64 values that are exactly representable in the
target format, except the fp8 pair, which returns the stored fp8 codes and their scales):

* ``round_nearest(x, dtype)``: round to nearest (even) through torch's dtype cast (bf16, fp16, fp32).
* ``round_stochastic(x, dtype, generator)``: stochastic rounding to bf16 or fp16, written out: the
  two neighbours of x in the format (``lo`` toward zero, ``lo + ulp`` away from zero) and a draw
  ``U < (|x| - |lo|) / ulp`` choosing the upper one, so ``E[round(x)] = x`` exactly. Subnormals use
  the format's smallest exponent; NaN stays NaN; a value past the largest finite number can round
  to inf (what the format's own conversion does there).
* ``quantize_fp8_rows(x)`` / ``dequantize_fp8_rows(q, scale)``: fp8 e4m3 (``torch.float8_e4m3fn``),
  round to nearest, one fp32 scale per state row, i.e. per (slot, value head, V-row) of the
  ``[slots, HV, V, K]`` pool: ``scale = amax_k |S[v, k]| / 448``, ``q = sat(S / scale)``. Why per
  V-row: a read step needs ``C (e q)`` and ``C (e k)``, dot products along K, so each row's scale
  multiplies one finished dot (one multiply per row, nothing inside the K loop); the rows of
  ``S = sum u k^T`` differ in magnitude by their value channel (u's V entries), while along K the
  keys are l2-normalised, so a row shares one magnitude; and a row of K = 128 is one contiguous
  128-byte line, written by the one program that folds it. Per-(head, K-column) scales would cost
  the same (scale q and k once per step) but mix channels of very different size under one scale.
  Saturation: scaled values past 448 are clamped to +-448 explicitly (e4m3fn has no inf; torch's
  CPU cast happens to saturate, even inf, and a GPU cast without ``satfinite`` gives NaN, so the
  rule is stated here, not left to a cast). An all-zero row gets scale 1. A NaN or inf anywhere in
  a row makes the whole dequantized row NaN (its scale is NaN or inf): nothing non-finite passes
  as a finite value.

Double rounding: torch casts float64 to bf16/fp16 through fp32, so ``round_nearest`` is round to
nearest of the fp32 value, which is what a kernel folding in fp32 produces; the study's values
never sit within 2^-24 of a tie often enough for this to matter.

Protocol (float64, on ``reference.ReplayReference``'s step math: nothing here re-derives the
recurrence): ``TwoCopyReference`` keeps per slot a *recurrence copy* (what every fold reads and
writes: fp32, or bf16/fp16 with stochastic rounding) and a *read copy* (what every step's output
and u read: ``same``, ``bf16`` or ``fp8_e4m3`` round to nearest). A flush folds in float64 from the
recurrence copy and writes both copies from the same unrounded matrix. The study arms:

* (a) ``RoundedConventional``: the conventional recurrence with its state rounded every step;
* (b) ``TwoCopyReference(..., state_dtype=low, read_dtype="same")``: one low-precision checkpoint,
  rounded once per window (folds and reads both use it);
* (c) ``TwoCopyReference(..., state_dtype="float32", read_dtype=low)``: two copies.

Verify steps: ``TwoCopyRingModel`` does the same on ``reference_verify.RingModel`` (rows that fold
before the step read the recurrence copy, all others the read copy).

``error_study`` runs them against the exact float64 recurrence (``reference.conventional_step``)
on one head and returns the relative output error per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replayssm_sglang import reference as R
from replayssm_sglang import reference_verify as RV
from replayssm_sglang import ring as ringmod

F64 = torch.float64
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
READ_DTYPES = ("same", "bf16", "fp8_e4m3")
STATE_DTYPES = ("float32", "bfloat16", "float16")

# (significand bits including the implicit one, smallest normal exponent, largest finite)
_FORMATS = {
    torch.bfloat16: (8, -126, float(torch.finfo(torch.bfloat16).max)),
    torch.float16: (11, -14, float(torch.finfo(torch.float16).max)),
}
_NAMES = {
    "float32": torch.float32, "fp32": torch.float32,
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16,
    "fp8_e4m3": FP8, "float8_e4m3fn": FP8,
    "float64": F64, "fp64": F64,
}


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return _NAMES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(_NAMES)}") from None


# --- rounding operators ---------------------------------------------------------------------------

def round_nearest(x: torch.Tensor, dtype) -> torch.Tensor:
    """Round to nearest even in ``dtype`` (bf16, fp16, fp32) through torch's cast; float64 back."""
    dt = torch_dtype(dtype)
    if dt == FP8:
        return round_fp8_rows(x)
    if dt == F64:
        return x.to(F64)
    return x.to(dt).to(F64)


def round_stochastic(x: torch.Tensor, dtype, generator: torch.Generator | None = None) -> torch.Tensor:
    """Stochastic rounding of float64 ``x`` to bf16 or fp16, returned as float64 (exactly
    representable in ``dtype``). Unbiased: E[result] = x for every finite x inside the range."""
    dt = torch_dtype(dtype)
    if dt not in _FORMATS:
        raise ValueError(f"stochastic rounding is defined here for bf16 and fp16, not {dt}")
    p, emin, _ = _FORMATS[dt]
    x = x.to(F64)
    a = x.abs()
    _, e = torch.frexp(a)  # a = m * 2**e, m in [0.5, 1): floor(log2 a) = e - 1
    e = torch.clamp(e.to(F64) - 1.0, min=float(emin))
    ulp = torch.exp2(e - (p - 1))
    lo = torch.floor(a / ulp) * ulp  # exact: ulp is a power of two
    frac = (a - lo) / ulp  # in [0, 1)
    u = torch.rand(x.shape, generator=generator, dtype=F64, device=x.device)
    mag = torch.where(u < frac, lo + ulp, lo)
    out = torch.copysign(mag, x)
    out = out.to(dt).to(F64)  # exact for finite values; lo + ulp past the range becomes inf
    return torch.where(torch.isfinite(x), out, x)  # NaN stays NaN, +-inf stays +-inf


def round_state(x: torch.Tensor, dtype, generator: torch.Generator | None = None,
                stochastic: bool | None = None) -> torch.Tensor:
    """The recurrence copy's rounding: fp32 to nearest; bf16/fp16 stochastic unless told not to."""
    dt = torch_dtype(dtype)
    if stochastic is None:
        stochastic = dt in _FORMATS
    if stochastic:
        return round_stochastic(x, dt, generator)
    return round_nearest(x, dt)


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 e4m3 with one fp32 scale per row (the last axis, K, shares a scale): returns
    (codes [..., K] float8_e4m3fn, scale [...] float32), round to nearest, saturating at +-448."""
    x = x.to(F64)
    amax = x.abs().amax(-1)
    # NaN in a row must not vanish: amax ignores nothing (NaN propagates through amax)
    scale = (amax / FP8_MAX).to(torch.float32)
    scale = torch.where(amax == 0, torch.ones_like(scale), scale)
    y = x / scale.to(F64).unsqueeze(-1)
    return saturate_fp8(y), scale


def saturate_fp8(y: torch.Tensor) -> torch.Tensor:
    """Round scaled values to fp8 e4m3 (nearest even), clamping to +-448 first; NaN stays NaN."""
    return torch.clamp(y.to(F64), -FP8_MAX, FP8_MAX).to(FP8)


def dequantize_fp8_rows(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.to(F64) * scale.to(F64).unsqueeze(-1)


def round_fp8_rows(x: torch.Tensor) -> torch.Tensor:
    q, s = quantize_fp8_rows(x)
    return dequantize_fp8_rows(q, s)


def round_read(x: torch.Tensor, read_dtype: str, state_value: torch.Tensor | None = None) -> torch.Tensor:
    """The read copy's rounding (round to nearest). ``same`` returns ``state_value`` (the
    recurrence copy itself: no separate read copy)."""
    if read_dtype == "same":
        return state_value if state_value is not None else x
    if read_dtype == "bf16":
        return round_nearest(x, torch.bfloat16)
    if read_dtype == "fp8_e4m3":
        return round_fp8_rows(x)
    raise ValueError(f"read dtype must be one of {READ_DTYPES}, got {read_dtype!r}")


def read_copy_bytes(HV: int, V: int, K: int, read_dtype: str) -> int:
    """Bytes of one slot's read copy in one layer, scales included (0 for ``same``)."""
    if read_dtype == "same":
        return 0
    if read_dtype == "bf16":
        return HV * V * K * 2
    if read_dtype == "fp8_e4m3":
        return HV * V * K * 1 + HV * V * 4  # codes + one fp32 scale per (head, V-row)
    raise ValueError(f"read dtype must be one of {READ_DTYPES}, got {read_dtype!r}")


# --- the two-copy protocol on ReplayReference ---------------------------------------------------

class TwoCopyPool:
    """Stands in for ``ReplayReference.state``: a write stores both copies from the same unrounded
    matrix; a read returns the read copy, except inside a fold, which reads the recurrence copy."""

    def __init__(self, state: torch.Tensor, state_dtype: str, read_dtype: str,
                 generator: torch.Generator | None = None, stochastic: bool | None = None):
        self.state_dtype, self.read_dtype = state_dtype, read_dtype
        self.generator, self.stochastic = generator, stochastic
        self.rec = torch.zeros_like(state, dtype=F64)
        self.read = torch.zeros_like(state, dtype=F64)
        self.folding = False
        self.rec_slots: set[int] = set()  # slots whose current step flushes: they read C only
        self.writes = 0
        for s in range(state.shape[0]):
            self[s] = state[s]
        self.writes = 0

    def __getitem__(self, s):
        return self.rec[s] if self.folding or s in self.rec_slots else self.read[s]

    def __setitem__(self, s, S: torch.Tensor) -> None:
        S = S.to(F64)
        rec = round_state(S, self.state_dtype, self.generator, self.stochastic)
        self.rec[s] = rec
        self.read[s] = round_read(S, self.read_dtype, state_value=rec)
        self.writes += 1


class TwoCopyReference(R.ReplayReference):
    """``ReplayReference`` with a two-copy checkpoint: folds read the recurrence copy, every
    step's ``C q`` and ``C k`` read the read copy; each checkpoint write (pre-step fold or flush)
    rounds the same float64 fold into both. ``read_dtype="same"`` is a single checkpoint in
    ``state_dtype`` (arm (b) when that dtype is low)."""

    def __init__(self, kind: str, state: torch.Tensor, *, H: int, L: int, state_dtype: str = "float32",
                 read_dtype: str = "same", generator: torch.Generator | None = None,
                 stochastic: bool | None = None):
        super().__init__(kind, state, H=H, L=L)
        self.state = TwoCopyPool(self.state, state_dtype, read_dtype, generator, stochastic)

    def step(self, x: R.DecodeInputs, slot_idx: torch.Tensor, forced: torch.Tensor | None = None,
             L: int | None = None) -> torch.Tensor:
        """A step that writes the checkpoint (``ring.decode_flushes``: ring full, forced, or a pre-step
        fold) reads the recurrence copy only, for its fold and for its own output; every other
        step reads the read copy only."""
        L = self.L if L is None else L
        valid = slot_idx >= 0
        slots = slot_idx[valid].long()
        f = None if forced is None else forced[valid]
        flushes = ringmod.decode_flushes(self.h[slots], L, f)
        self.state.rec_slots = {int(s) for s in slots[flushes]}
        try:
            return super().step(x, slot_idx, forced, L)
        finally:
            self.state.rec_slots = set()

    def _fold(self, s: int, n_rec: int, G_ref: torch.Tensor) -> torch.Tensor:
        self.state.folding = True
        try:
            return super()._fold(s, n_rec, G_ref)
        finally:
            self.state.folding = False


class _RowPool(TwoCopyPool):
    """A ``TwoCopyPool`` indexed by batch row (``reference_verify.RingModel.C``)."""

    @property
    def shape(self):
        return self.rec.shape


class TwoCopyRingModel(RV.RingModel):
    """Verify steps with two copies, on ``reference_verify.RingModel``'s step math: a row whose
    step folds first (``ring.needs_prefold``: h + T > L) reads the recurrence copy only (its fold
    and the step that runs from the new checkpoint); every other row reads the read copy only.
    The pre-step fold writes both copies from the same unrounded fold."""

    def __init__(self, C0: torch.Tensor, *, state_dtype: str = "float32", read_dtype: str = "same",
                 generator: torch.Generator | None = None, stochastic: bool | None = None, **kw):
        super().__init__(C0, **kw)
        self.C = _RowPool(self.C, state_dtype, read_dtype, generator, stochastic)

    def verify(self, mixed_qkv, a, b, T):
        pre = ringmod.needs_prefold(self.h, T, self.L)
        self.C.rec_slots = {int(r) for r in torch.nonzero(pre).flatten()}
        try:
            return super().verify(mixed_qkv, a, b, T)
        finally:
            self.C.rec_slots = set()


class RoundedConventional:
    """Arm (a): the conventional recurrence (``reference.conventional_step``) whose state is
    rounded to ``dtype`` after every step (``fp8_e4m3``: per-row scales, round to nearest)."""

    def __init__(self, state: torch.Tensor, dtype: str, generator: torch.Generator | None = None,
                 stochastic: bool = False):
        self.dtype, self.generator, self.stochastic = dtype, generator, stochastic
        self.state = self._round(state.to(F64).clone())

    def _round(self, S: torch.Tensor) -> torch.Tensor:
        if self.dtype == "fp8_e4m3":
            return round_fp8_rows(S)
        return round_state(S, self.dtype, self.generator, self.stochastic)

    def step(self, x: R.DecodeInputs, slot_idx: torch.Tensor) -> torch.Tensor:
        out = R.conventional_step(self.state, x, slot_idx)
        self.state = self._round(self.state)
        return out


# --- the error study ------------------------------------------------------------------------------

REGIMES = {"slow": (0.9995, 0.99999), "fast": (0.9, 0.95)}
ARMS = ("a_every_step", "b_checkpoint", "c_two_copies")


@dataclass
class StudyInputs:
    kind: str
    q: torch.Tensor  # [T, K] (normalised, scaled)
    k: torch.Tensor  # [T, K]
    v: torch.Tensor  # [T, V]
    g: torch.Tensor  # [T, GK]
    beta: torch.Tensor  # [T]

    def step(self, t: int) -> R.DecodeInputs:
        return R.DecodeInputs(q=self.q[t][None, None], k=self.k[t][None, None], v=self.v[t][None, None],
                              g=self.g[t][None, None], beta=self.beta[t][None, None])


def study_inputs(kind: str, regime: str, steps: int, K: int, V: int, seed: int,
                 key_rank: int | None = None) -> StudyInputs:
    """One head's random inputs: per-step decays uniform in the regime's range (GDN one per step,
    KDA one per K channel per step), beta = sigmoid(N(0, 1)), v ~ N(0, 1), q and k l2-normalised
    (q scaled by K^-0.5). ``key_rank``: keys drawn from a fixed random subspace of that dimension
    plus 10% isotropic noise (real keys are far from isotropic); None = isotropic keys."""
    gen = torch.Generator().manual_seed(seed)
    lo, hi = REGIMES[regime]
    GK = 1 if kind == "gdn" else K
    decay = lo + (hi - lo) * torch.rand(steps, GK, generator=gen, dtype=F64)
    g = torch.log(decay)
    q = R._l2norm(torch.randn(steps, K, generator=gen, dtype=F64)) * K ** -0.5
    if key_rank is None:
        k = torch.randn(steps, K, generator=gen, dtype=F64)
    else:
        basis, _ = torch.linalg.qr(torch.randn(K, key_rank, generator=gen, dtype=F64))
        k = torch.randn(steps, key_rank, generator=gen, dtype=F64) @ basis.T
        k = R._l2norm(k) + 0.1 * R._l2norm(torch.randn(steps, K, generator=gen, dtype=F64))
    k = R._l2norm(k)
    v = torch.randn(steps, V, generator=gen, dtype=F64)
    beta = torch.sigmoid(torch.randn(steps, generator=gen, dtype=F64))
    return StudyInputs(kind, q, k, v, g, beta)


def error_study(kind: str = "gdn", regime: str = "slow", dtype: str = "bf16", *, steps: int = 4096,
                K: int = 128, V: int = 128, L: int = 16, seed: int = 0, key_rank: int | None = None,
                arms: tuple[str, ...] = ARMS, generator_seed: int | None = None) -> dict[str, torch.Tensor]:
    """Relative output error per step, ||o_arm - o|| / ||o||, of each arm against the exact
    float64 recurrence, one head (H = HV = 1), from a zero state, plain decode (a flush every L
    tokens). Also returned: ``norm`` (||o|| per step).

    ``dtype`` is the low precision under study (``bf16`` or ``fp8_e4m3``): ``a_every_step`` rounds
    the state to it every step (round to nearest), ``b_checkpoint`` keeps one checkpoint in it
    (rounded once per window of L), ``c_two_copies`` keeps an fp32 recurrence copy and a read copy
    in it; ``c_bf16sr_two_copies`` (optional) a bf16 recurrence copy with stochastic rounding.

    Batched over the arms with one [arms, V, K] tensor so that 4096 steps at K = V = 128 take a few
    seconds. It uses two equalities of the protocol (checked against ``TwoCopyReference`` and
    ``RoundedConventional`` step by step in tests/test_precision.py): between flushes, the output
    computed from a read copy Cr plus the ring equals the conventional recurrence started from Cr
    (the unrolled identity of docs/design.md); and C Diag(exp Gamma) + sum_j u_j w_j^T, what the
    flush step sees and folds, equals that running state plus (C - Cr) Diag(exp Gamma)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # [arms, 128, 128] ops: threading costs more than it gives
    try:
        return _error_study(kind, regime, dtype, steps, K, V, L, seed, key_rank, arms, generator_seed)
    finally:
        torch.set_num_threads(threads)


def _error_study(kind, regime, dtype, steps, K, V, L, seed, key_rank, arms, generator_seed):
    x = study_inputs(kind, regime, steps, K, V, seed, key_rank)
    gen = torch.Generator().manual_seed(seed + 1 if generator_seed is None else generator_seed)
    names = ["exact", *arms]
    N = len(names)
    GK = x.g.shape[1]
    S = torch.zeros(N, V, K, dtype=F64)  # the state each arm's outputs see
    C = torch.zeros(N, V, K, dtype=F64)  # recurrence copy (ring arms)
    Cr = torch.zeros(N, V, K, dtype=F64)  # read copy at the checkpoint (ring arms)
    Gw = torch.zeros(N, GK, dtype=F64)  # cumulative log-decay since the checkpoint
    idx = {n: i for i, n in enumerate(names)}
    ring_arms = [n for n in arms if n != "a_every_step"]
    out = torch.empty(steps, N, V, dtype=F64)
    rec_err = {n: [] for n in ring_arms}  # ||C - S_exact|| / ||S_exact|| at every flush
    for t in range(steps):
        g, k, q = x.g[t], x.k[t], x.q[t]
        flush = (t + 1) % L == 0  # plain decode: ring.decode_flushes is true when h + 1 == L
        if flush:  # this step reads the recurrence copy: switch to the trajectory from C
            for n in ring_arms:
                i = idx[n]
                S[i] = S[i] + (C[i] - Cr[i]) * torch.exp(Gw[i])
        S = S * torch.exp(g)  # [N, V, K] * [GK]
        u = x.beta[t] * (x.v[t] - S @ k)  # [N, V]
        S = S + u[:, :, None] * k
        out[t] = S @ q
        Gw = Gw + g
        if "a_every_step" in idx:
            i = idx["a_every_step"]
            S[i] = round_nearest(S[i], dtype)
        if flush:
            for n in ring_arms:
                i = idx[n]
                F = S[i]
                if n == "b_checkpoint":
                    C[i] = round_nearest(F, dtype)
                    Cr[i] = C[i]
                elif n == "c_two_copies":
                    C[i] = round_nearest(F, torch.float32)
                    Cr[i] = round_read(F, dtype)
                elif n == "c_bf16sr_two_copies":
                    C[i] = round_stochastic(F, torch.bfloat16, gen)
                    Cr[i] = round_read(F, dtype)
                else:
                    raise ValueError(f"unknown arm {n!r}")
                S[i] = Cr[i]
                rec_err[n].append(float(torch.linalg.vector_norm(C[i] - S[0]) / torch.linalg.vector_norm(S[0])))
            Gw = torch.zeros_like(Gw)
    o = out[:, 0]
    norm = torch.linalg.vector_norm(o, dim=-1)
    res = {n: torch.linalg.vector_norm(out[:, idx[n]] - o, dim=-1) / norm for n in arms}
    res["norm"] = norm
    res["outputs"] = out
    for n in ring_arms:  # the recurrence copy's own error after each flush (step L, 2L, ...)
        res["recurrence_" + n] = torch.tensor(rec_err[n], dtype=F64)
    return res


def reference_run(kind: str, arm: str, dtype: str, x: StudyInputs, L: int = 16) -> torch.Tensor:
    """The same arm through the reference classes (slow: one ``ReplayReference`` step per token).
    Returns the outputs [steps, V]; used to check ``error_study``'s batched arms."""
    V, K = x.v.shape[1], x.k.shape[1]
    zero = torch.zeros(1, 1, V, K, dtype=F64)
    slot = torch.zeros(1, dtype=torch.int32)
    if arm == "exact":
        run = RoundedConventional(zero, "float64")
    elif arm == "a_every_step":
        run = RoundedConventional(zero, dtype)
    elif arm == "b_checkpoint":
        run = TwoCopyReference(kind, zero, H=1, L=L, state_dtype=dtype, read_dtype="same", stochastic=False)
    elif arm == "c_two_copies":
        run = TwoCopyReference(kind, zero, H=1, L=L, state_dtype="float32", read_dtype=dtype)
    else:
        raise ValueError(f"no reference run for arm {arm!r}")
    steps = x.v.shape[0]
    return torch.stack([run.step(x.step(t), slot)[0, 0] for t in range(steps)])


def window_error(err: torch.Tensor, norm: torch.Tensor, t: int, width: int = 64) -> float:
    """Aggregate relative error over the ``width`` steps ending at step ``t`` (1-based):
    sqrt(sum ||e||^2 / sum ||o||^2), robust to a single small ||o||."""
    lo = max(0, t - width)
    e2 = ((err[lo:t] * norm[lo:t]) ** 2).sum()
    return math.sqrt(float(e2 / (norm[lo:t] ** 2).sum()))

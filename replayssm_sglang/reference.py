"""Float64 references for GDN / KDA decode, written from the math (docs/design.md, "The identity").

Two independent computations that every kernel test compares against:

* ``conventional_step``: the sequential recurrence, one token per row, read-update-write of the
  state every step (what SGLang's packed decode does):
      S <- S Diag(a_t);  u_t = beta_t (v_t - S k_t);  S <- S + u_t k_t^T;  o_t = S q_t
* ``ReplayReference``: our protocol (checkpoint + ring of records, ring.py's flush rule). Its
  output is computed from the checkpoint read once plus dot products against the cached keys,
  never by materialising the state, so agreement with ``conventional_step`` checks the identity.
  It records the checkpoint at every flush and the ring records in the kernels' layout
  (u per value head, k per key head, cumulative log-decay G per value head).

Inputs are SGLang 0.5.17's packed decode inputs: ``mixed_qkv`` = [q | k | v] after conv1d
([B, 2*H*K + HV*V]), ``a`` (GDN [B, HV]; KDA [B, HV*K]), ``b`` [B, HV], ``A_log`` [HV],
``dt_bias`` (GDN [HV]; KDA [HV*K]). SGLang's gating: g = -exp(A_log) * softplus(a + dt_bias)
(softplus(x) = x above 20), or KDA's safe gate g = lower_bound * sigmoid(exp(A_log) (a + dt_bias));
beta = sigmoid(b) (GDN's packed decode rounds beta to b's dtype; KDA keeps it in fp32);
q, k l2-normalised as x / sqrt(sum x^2 + 1e-6); q scaled by ``scale`` (default K^-0.5).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from replayssm_sglang import ring as ringmod

F64 = torch.float64


@dataclass
class DecodeInputs:
    """One decode step, unpacked to float64. q is normalised and scaled, k normalised."""

    q: torch.Tensor  # [B, H, K]
    k: torch.Tensor  # [B, H, K]
    v: torch.Tensor  # [B, HV, V]
    g: torch.Tensor  # [B, HV, GK] log-decay of this step (GK = 1 for GDN, K for KDA)
    beta: torch.Tensor  # [B, HV]


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gate(kind: str, a: torch.Tensor, dt_bias: torch.Tensor, A_log: torch.Tensor, *, HV: int, K: int,
         lower_bound: float | None = None) -> torch.Tensor:
    """Log-decay g per row: [B, HV, 1] (GDN) or [B, HV, K] (KDA), float64."""
    B = a.shape[0]
    GK = 1 if kind == "gdn" else K
    x = a.to(F64).reshape(B, HV, GK) + dt_bias.to(F64).reshape(1, HV, GK)
    A = torch.exp(A_log.to(F64)).reshape(1, HV, 1)
    if lower_bound is not None:
        return lower_bound * torch.sigmoid(A * x)
    softplus = torch.where(x <= 20.0, torch.log1p(torch.exp(torch.clamp(x, max=20.0))), x)
    return -A * softplus


def unpack(kind: str, mixed_qkv, a, b, A_log, dt_bias, *, H: int, HV: int, K: int, V: int,
           scale: float | None = None, lower_bound: float | None = None) -> DecodeInputs:
    B = mixed_qkv.shape[0]
    x = mixed_qkv.to(F64)
    q = _l2norm(x[:, : H * K].reshape(B, H, K))
    k = _l2norm(x[:, H * K: 2 * H * K].reshape(B, H, K))
    v = x[:, 2 * H * K: 2 * H * K + HV * V].reshape(B, HV, V)
    q = q * (K ** -0.5 if scale is None else scale)
    beta = torch.sigmoid(b.to(F64).reshape(B, HV))
    if kind == "gdn":  # SGLang's GDN packed decode rounds beta through b's dtype
        beta = beta.to(b.dtype).to(F64)
    g = gate(kind, a, dt_bias, A_log, HV=HV, K=K, lower_bound=lower_bound)
    return DecodeInputs(q=q, k=k, v=v, g=g, beta=beta)


def _group(H: int, HV: int) -> torch.Tensor:
    """Key head of each value head (GQA: HV/H value heads share one key head)."""
    return torch.arange(HV) // (HV // H)


def conventional_step(state: torch.Tensor, x: DecodeInputs, slot_idx: torch.Tensor) -> torch.Tensor:
    """Sequential recurrence on a float64 pool ``state`` [slots, HV, V, K] (updated in place).
    Rows with slot index < 0 get zero output and touch nothing. Returns o [B, HV, V]."""
    B, H, K = x.q.shape
    HV, V = x.v.shape[1:]
    kh = _group(H, HV)
    out = torch.zeros(B, HV, V, dtype=F64)
    for n in range(B):
        s = int(slot_idx[n])
        if s < 0:
            continue
        S = state[s] * torch.exp(x.g[n])[:, None, :]  # [HV, V, K] * [HV, 1, GK]
        qn, kn = x.q[n][kh], x.k[n][kh]  # [HV, K]
        u = x.beta[n][:, None] * (x.v[n] - torch.einsum("hvk,hk->hv", S, kn))
        S = S + u[:, :, None] * kn[:, None, :]
        out[n] = torch.einsum("hvk,hk->hv", S, qn)
        state[s] = S
    return out


class ReplayReference:
    """Our protocol in float64: checkpoint pool + ring records + h, ring.py's rule.

    After each ``step``: ``self.flushed`` holds the rows that wrote their checkpoint this step,
    and ``self.state`` the checkpoints (so a test reads the state at every flush there)."""

    def __init__(self, kind: str, state: torch.Tensor, *, H: int, L: int, cap: int | None = None):
        slots, HV, V, K = state.shape
        self.kind, self.H, self.HV, self.V, self.K, self.L = kind, H, HV, V, K, L
        self.cap = cap if cap is not None else ringmod.ring_capacity(L)
        HK = H if kind == "gdn" else HV
        GK = 1 if kind == "gdn" else K
        self.state = state.to(F64).clone()
        self.u = torch.zeros(slots, HV, self.cap, V, dtype=F64)
        self.k = torch.zeros(slots, HK, self.cap, K, dtype=F64)
        self.G = torch.zeros(slots, HV, self.cap, GK, dtype=F64)
        self.h = torch.zeros(slots, dtype=torch.int32)
        self.flushed = torch.zeros(0, dtype=torch.bool)

    def _keys(self, s: int, n_rec: int) -> torch.Tensor:
        """Cached keys of slot s expanded to value heads: [HV, n_rec, K]."""
        if self.kind == "gdn":
            return self.k[s, _group(self.H, self.HV), :n_rec]
        return self.k[s, :, :n_rec]

    def _fold(self, s: int, n_rec: int, G_ref: torch.Tensor) -> torch.Tensor:
        """C Diag(exp G_ref) + sum_{j<n_rec} u_j (k_j * exp(G_ref - G_j))^T, as [HV, V, K]."""
        C = self.state[s] * torch.exp(G_ref)[:, None, :]
        if n_rec:
            w = self._keys(s, n_rec) * torch.exp(G_ref[:, None, :] - self.G[s, :, :n_rec])
            C = C + torch.einsum("hjv,hjk->hvk", self.u[s, :, :n_rec], w)
        return C

    def step(self, x: DecodeInputs, slot_idx: torch.Tensor, forced: torch.Tensor | None = None,
             L: int | None = None) -> torch.Tensor:
        L = self.L if L is None else L
        B = x.q.shape[0]
        kh = _group(self.H, self.HV)
        out = torch.zeros(B, self.HV, self.V, dtype=F64)
        flushed = torch.zeros(B, dtype=torch.bool)
        for n in range(B):
            s = int(slot_idx[n])
            if s < 0:
                continue
            f = bool(forced[n]) if forced is not None else False
            h = int(self.h[s])
            h_expect = int(ringmod.h_after_decode(self.h[s: s + 1], L, None if forced is None else forced[n: n + 1]))
            flush_expect = bool(ringmod.decode_flushes(self.h[s: s + 1], L, None if forced is None else forced[n: n + 1]))
            if bool(ringmod.needs_prefold(self.h[s: s + 1], 1, L)):
                self.state[s] = self._fold(s, h, self.G[s, :, h - 1])
                h = 0
                self.h[s] = 0
                flushed[n] = True
            G_prev = self.G[s, :, h - 1] if h > 0 else torch.zeros(self.HV, self.G.shape[-1], dtype=F64)
            G_t = G_prev + x.g[n]  # [HV, GK]
            qn, kn = x.q[n][kh], x.k[n][kh]  # [HV, K]
            C = self.state[s]
            eG = torch.exp(G_t)
            Cq = torch.einsum("hvk,hk->hv", C, eG * qn)
            Ck = torch.einsum("hvk,hk->hv", C, eG * kn)
            if h:
                w = self._keys(s, h) * torch.exp(G_t[:, None, :] - self.G[s, :, :h])  # [HV, h, K]
                Cq = Cq + torch.einsum("hjv,hj->hv", self.u[s, :, :h], torch.einsum("hjk,hk->hj", w, qn))
                Ck = Ck + torch.einsum("hjv,hj->hv", self.u[s, :, :h], torch.einsum("hjk,hk->hj", w, kn))
            u_t = x.beta[n][:, None] * (x.v[n] - Ck)
            out[n] = Cq + u_t * (kn * qn).sum(-1, keepdim=True)
            # commit (T = 1 auto-commit), then flush if the ring is full or the flush is forced
            if h + 1 >= L or f:
                S = self._fold(s, h, G_t) + u_t[:, :, None] * kn[:, None, :]
                self.state[s] = S
                self.h[s] = 0
                flushed[n] = True
            else:
                self.u[s, :, h] = u_t
                if self.kind == "gdn":
                    self.k[s, :, h] = x.k[n]
                else:
                    self.k[s, :, h] = kn
                self.G[s, :, h] = G_t
                self.h[s] = h + 1
            assert int(self.h[s]) == h_expect, "reference disagrees with ring.h_after_decode"
            assert bool(flushed[n]) == flush_expect, "reference disagrees with ring.decode_flushes"
        self.flushed = flushed
        return out


def random_decode_inputs(kind: str, B: int, H: int, HV: int, K: int, V: int, *, dtype=torch.float32,
                         generator: torch.Generator | None = None, device="cpu", decay: str = "fast"):
    """Random packed decode inputs in SGLang 0.5.17's layout (for tests and benchmarks).
    Gates are drawn so that per-step decays spread over roughly exp(-0.05) .. exp(-3) (decay="fast"), or, with
    decay="slow", 98% of them within exp(-0.07) .. exp(-0.0006) (median exp(-0.01)), as trained models' heads mostly
    are: there the checkpoint's term stays large through a whole window, where fast decays shrink it to e^-10 or
    less by its end (a fault in that term alone can hide under fast decays). Both draw the same random numbers."""
    if decay not in ("fast", "slow"):
        raise ValueError(f"decay must be 'fast' or 'slow', got {decay!r}")
    gen = generator
    GK = 1 if kind == "gdn" else K
    mixed = torch.randn(B, 2 * H * K + HV * V, generator=gen, dtype=torch.float32)
    a = torch.randn(B, HV * GK, generator=gen, dtype=torch.float32)
    b = torch.randn(B, HV, generator=gen, dtype=torch.float32)
    A_log = torch.rand(HV, generator=gen, dtype=torch.float32)
    A_log = A_log * 1.5 - 1.0 if decay == "fast" else A_log * 3.0 - 6.0  # A = e^A_log: 0.37 .. 1.6, or 0.0025 .. 0.05
    dt_bias = torch.rand(HV * GK, generator=gen, dtype=torch.float32) - 0.5
    t = lambda x, d: x.to(device=device, dtype=d)  # noqa: E731
    return (t(mixed, dtype), t(a, dtype), t(b, dtype), t(A_log, torch.float32), t(dt_bias, torch.float32))

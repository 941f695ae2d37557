"""Float64 references for speculative verify in the ring, written from the math in docs/design.md.

Nothing here is taken from a kernel: these are the plain recurrences, used by every verify test.

Per value head, state S (V x K), log-decay g_t (scalar for GDN, per-K for KDA), beta_t:
    u_t = beta_t (v_t - (S_{t-1} Diag(exp g_t)) k_t)
    S_t = S_{t-1} Diag(exp g_t) + u_t k_t^T
    o_t = S_t q_t
with SGLang's gating g = -exp(A_log) * softplus(a + dt_bias) (or KDA's safe gate
lower_bound * sigmoid(exp(A_log) * (a + dt_bias))), beta = sigmoid(b), q and k l2-normalised
(eps 1e-6 inside the square root), q scaled by `scale` (default K^-0.5).

Two references:
- ``ReferenceStream``: the conventional computation on the accepted stream. A verify step runs the
  T drafts from the committed state S and returns all T outputs; ``commit(m)`` keeps the state after
  the first m drafts. This is what any verify (ours, upstream's, the conventional one) must agree with.
- ``RingModel``: a float64 model of our ring protocol (checkpoint C, records u/k/G, committed
  count h, pre-step fold, commit by pointer), driven by ``replayssm_sglang.ring``. It is used to
  check that the checkpoint at every fold equals the stream's state, independently of any kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from replayssm_sglang import ring as ring_mod

F64 = torch.float64


@dataclass
class VerifyInputs:
    """One verify step's packed inputs, as SGLang hands them to the linear-attention layer."""

    mixed_qkv: torch.Tensor  # [B*T, 2*H*K + HV*V]
    a: torch.Tensor  # [B*T, HV] (GDN) or [B*T, HV*K] (KDA)
    b: torch.Tensor  # [B*T, HV]


def split_inputs(mixed_qkv, a, b, *, kind, B, T, H, HV, K, V):
    """Unpack [B*T, ...] inputs into float64 per-token tensors [B, T, ...] (key heads expanded to HV)."""
    m = mixed_qkv.reshape(B, T, -1).to(F64)
    q = m[..., : H * K].reshape(B, T, H, K)
    k = m[..., H * K : 2 * H * K].reshape(B, T, H, K)
    v = m[..., 2 * H * K :].reshape(B, T, HV, V)
    rep = HV // H
    q = q.repeat_interleave(rep, dim=2)
    k = k.repeat_interleave(rep, dim=2)
    if kind == "gdn":
        a_ = a.reshape(B, T, HV).to(F64)
    else:
        a_ = a.reshape(B, T, HV, K).to(F64)
    b_ = b.reshape(B, T, HV).to(F64)
    return q, k, v, a_, b_


def gating(a, b, A_log, dt_bias, *, kind, HV, K, lower_bound=None):
    """Log-decay g and beta in float64 from SGLang's gate inputs. a: [..., HV] or [..., HV, K]."""
    A = A_log.to(F64)
    if kind == "gdn":
        x = a + dt_bias.to(F64)
        g = -torch.exp(A) * torch.nn.functional.softplus(x)
    else:
        x = a + dt_bias.to(F64).reshape(HV, K)
        if lower_bound is not None:
            g = lower_bound * torch.sigmoid(torch.exp(A)[:, None] * x)
        else:
            g = -torch.exp(A)[:, None] * torch.nn.functional.softplus(x)
    beta = torch.sigmoid(b)
    return g, beta


def l2n(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def step(S, q, k, v, g, beta, scale):
    """One conventional token for a batch of heads. S [..., V, K]; q,k [..., K]; v [..., V];
    g [...] (GDN) or [..., K] (KDA); beta [...]. Returns (S_new, o, u)."""
    qn = l2n(q) * scale
    kn = l2n(k)
    if g.dim() == S.dim() - 2:  # scalar per head
        Sd = S * torch.exp(g)[..., None, None]
    else:
        Sd = S * torch.exp(g)[..., None, :]
    u = beta[..., None] * (v - (Sd @ kn[..., None])[..., 0])
    S_new = Sd + u[..., :, None] * kn[..., None, :]
    o = (S_new @ qn[..., None])[..., 0]
    return S_new, o, u


class ReferenceStream:
    """Conventional float64 recurrence on the accepted stream, one state per batch row."""

    def __init__(self, S0: torch.Tensor, *, kind, H, HV, K, V, A_log, dt_bias, scale=None, lower_bound=None):
        self.S = S0.to(F64).clone()  # [B, HV, V, K]
        self.kind, self.H, self.HV, self.K, self.V = kind, H, HV, K, V
        self.A_log, self.dt_bias = A_log, dt_bias
        self.scale = K ** -0.5 if scale is None else scale
        self.lower_bound = lower_bound
        self._drafts = None

    def verify(self, mixed_qkv, a, b, T):
        """All T draft outputs [B*T, HV, V] from the committed state; remembers the draft states."""
        B = self.S.shape[0]
        q, k, v, a_, b_ = split_inputs(mixed_qkv, a, b, kind=self.kind, B=B, T=T, H=self.H, HV=self.HV, K=self.K, V=self.V)
        g, beta = gating(a_, b_, self.A_log, self.dt_bias, kind=self.kind, HV=self.HV, K=self.K, lower_bound=self.lower_bound)
        S = self.S
        outs, states = [], []
        for t in range(T):
            S, o, _ = step(S, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], self.scale)
            outs.append(o)
            states.append(S)
        self._drafts = torch.stack(states, 1)  # [B, T, HV, V, K]
        return torch.stack(outs, 1).reshape(B * T, self.HV, self.V)

    def commit(self, accepted: torch.Tensor):
        """Keep the state after the first accepted[r] drafts of row r (1 <= accepted <= T)."""
        idx = (accepted.to(torch.long) - 1).cpu()
        self.S = self._drafts[torch.arange(self.S.shape[0]), idx].clone()
        self._drafts = None


class RingModel:
    """Float64 model of the ring protocol for B rows (one slot each), driven by ring.py's rule."""

    def __init__(self, C0: torch.Tensor, *, kind, L, T_max, H, HV, K, V, A_log, dt_bias, scale=None, lower_bound=None):
        self.layout = ring_mod.RingLayout.for_layer(kind, L=L, T_max=T_max, H=H, HV=HV, K=K, V=V)
        B = C0.shape[0]
        cap = self.layout.cap
        self.C = C0.to(F64).clone()
        self.u = torch.zeros(B, HV, cap, V, dtype=F64)
        self.k = torch.zeros(B, HV, cap, K, dtype=F64)  # per value head (expanded) for simplicity
        self.G = torch.zeros(B, HV, cap, K if kind == "kda" else 1, dtype=F64)
        self.h = torch.zeros(B, dtype=torch.int32)
        self.kind, self.L, self.H, self.HV, self.K, self.V = kind, L, H, HV, K, V
        self.A_log, self.dt_bias = A_log, dt_bias
        self.scale = K ** -0.5 if scale is None else scale
        self.lower_bound = lower_bound
        self.folds = []  # (step, row) of every fold
        self._T = None
        self._step = 0

    def state(self, r: int, h: int | None = None) -> torch.Tensor:
        """S after the first h records of row r (default: the committed ones)."""
        h = int(self.h[r]) if h is None else h
        C = self.C[r]
        if h == 0:
            return C.clone()
        G_h = self.G[r, :, h - 1]  # [HV, GK]
        S = C * torch.exp(G_h)[:, None, :]
        w = torch.exp(G_h[:, None, :] - self.G[r, :, :h])  # [HV, h, GK]
        S = S + torch.einsum("hjv,hjk->hvk", self.u[r, :, :h], self.k[r, :, :h] * w)
        return S

    def verify(self, mixed_qkv, a, b, T):
        B = self.C.shape[0]
        q, k, v, a_, b_ = split_inputs(mixed_qkv, a, b, kind=self.kind, B=B, T=T, H=self.H, HV=self.HV, K=self.K, V=self.V)
        g, beta = gating(a_, b_, self.A_log, self.dt_bias, kind=self.kind, HV=self.HV, K=self.K, lower_bound=self.lower_bound)
        self._h_pre = self.h.clone()
        pre = ring_mod.needs_prefold(self.h, T, self.L)
        outs = torch.zeros(B, T, self.HV, self.V, dtype=F64)
        for r in range(B):
            if bool(pre[r]):
                self.C[r] = self.state(r)
                self.h[r] = 0
                self.folds.append((self._step, r))
            h0 = int(self.h[r])
            G_ref = self.G[r, :, h0 - 1] if h0 > 0 else torch.zeros(self.HV, self.G.shape[-1], dtype=F64)
            S = self.state(r, h0)
            for t in range(T):
                gt = g[r, t] if self.kind == "kda" else g[r, t][:, None]
                S, o, u = step(S, q[r, t], k[r, t], v[r, t], g[r, t], beta[r, t], self.scale)
                G_ref = G_ref + gt
                self.u[r, :, h0 + t] = u
                self.k[r, :, h0 + t] = l2n(k[r, t])
                self.G[r, :, h0 + t] = G_ref
                outs[r, t] = o
        self._T = T
        self._step += 1
        return outs.reshape(B * T, self.HV, self.V)

    def commit(self, accepted: torch.Tensor):
        # The commit sees the committed count from before the step (as on the device, where the
        # verify kernel never writes h); ring.h_after_verify accounts for the pre-step fold.
        self.h = ring_mod.h_after_verify(self._h_pre, self._T, self.L, accepted.to(torch.int32).cpu())
        self._T = None


def random_inputs(*, kind, B, T, H, HV, K, V, dtype=torch.float32, device="cpu", gen=None, a_shift=0.0):
    """Fresh random packed inputs of a verify step (SGLang's pre-gating tensors)."""
    D = 2 * H * K + HV * V
    mixed = torch.randn(B * T, D, generator=gen, dtype=torch.float32).to(device=device, dtype=dtype)
    if kind == "gdn":
        a = (torch.randn(B * T, HV, generator=gen) + a_shift).to(device=device, dtype=dtype)
    else:
        a = (torch.randn(B * T, HV * K, generator=gen) + a_shift).to(device=device, dtype=dtype)
    b = torch.randn(B * T, HV, generator=gen).to(device=device, dtype=dtype)
    return mixed, a, b


def random_params(*, kind, HV, K, device="cpu", gen=None):
    """A_log, dt_bias in fp32 with decays in a realistic range (per-token log-decay ~ -0.05 .. -3)."""
    A_log = (torch.rand(HV, generator=gen) * math.log(8.0) - math.log(4.0)).to(device)
    n = HV if kind == "gdn" else HV * K
    dt_bias = (torch.randn(n, generator=gen) * 0.5 - 1.0).to(device)
    return A_log, dt_bias

"""Buffered (ReplaySSM) decode kernels for GDN and KDA: one token per request per step.

One Triton kernel serves both layer kinds (``IS_KDA`` selects the per-K gate); the protocol is
ring.py's (docs/design.md, "The ring protocol"); the float64 reference is
``replayssm_sglang.reference``.

Grid: (V / BV, B * HV). A program owns one V-tile of one value head of one row and keeps the
full K in registers. Per step it reads its checkpoint tile exactly once and uses it for both
C q and C k; the h committed records since the checkpoint add dot products against cached keys
(non-flush steps never rebuild the state). On a flush step (h + 1 == L, or the row's forced flag)
the same tile is folded with the records and the current token and written back.

Per row:
  prefold  = h >= L             (h + T > L with T = 1; only reachable after a verify step, or
                                 when the small-batch policy runs with a shorter window)
  h_eff    = 0 if prefold else h
  flush    = h_eff + 1 >= L or forced
  h_new    = 0 if flush else h_eff + 1
The kernel writes h itself, on the device: every program of a row reads h first; the row's
programs count their arrival on a per-slot counter (``arrive``, always 0 between launches) and the
last one to arrive writes ``h_new`` and resets the counter. Rows whose h does not change (L = 1,
or a forced flush at h = 0) skip the counter. A prefold that does not flush must append the new
record at position 0, which other programs of the row may still be reading: there the shared
parts of record 0 (keys, gates) are written by the last program to arrive, after a release.

Padded rows (slot index < 0) write zeros to their output and touch no state, record, h or counter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_sglang import policy
from replayssm_sglang import ring as ringmod


# ----------------------------------------------------------------------------------------------
# reusable pieces (also meant for the verify kernel)
# ----------------------------------------------------------------------------------------------

@triton.jit
def _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound,
               K: tl.constexpr, IS_KDA: tl.constexpr, USE_LOWER_BOUND: tl.constexpr):
    """This step's log-decay of value head i_hv, a scalar (GDN) or a [BK] vector (KDA), with SGLang's
    gating g = -exp(A_log) softplus(a + dt_bias) (softplus(x) = x above 20), or KDA's safe gate
    g = lower_bound * sigmoid(exp(A_log) (a + dt_bias))."""
    A_log_val = tl.load(A_log + i_hv).to(tl.float32)
    if IS_KDA:
        x = tl.load(a + i_n * stride_a + i_hv * K + o_k, mask=mask_k, other=0).to(tl.float32)
        x += tl.load(dt_bias + i_hv * K + o_k, mask=mask_k, other=0).to(tl.float32)
    else:
        x = tl.load(a + i_n * stride_a + i_hv).to(tl.float32)
        x += tl.load(dt_bias + i_hv).to(tl.float32)
    if USE_LOWER_BOUND:
        g = lower_bound * tl.sigmoid(tl.exp(A_log_val) * x)
    else:
        sp = tl.where(x <= 20.0, tl.log(1.0 + tl.exp(x)), x)
        g = -tl.exp(A_log_val) * sp
    return g


@triton.jit
def _record_weights(rec_g, G_ref, valid, IS_KDA: tl.constexpr):
    """exp(G_ref - G_j) for the valid records (0 elsewhere): [BC] (GDN) or [BC, BK] (KDA)."""
    if IS_KDA:
        w = tl.where(valid[:, None], tl.exp(G_ref[None, :] - rec_g), 0.0)
    else:
        w = tl.where(valid, tl.exp(G_ref - rec_g), 0.0)
    return w


@triton.jit
def _fold(b_C, rec_u, rec_k, rec_g, G_ref, valid, IS_KDA: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """C Diag(exp G_ref) + sum_j u_j (k_j * exp(G_ref - G_j))^T for one [BV, BK] tile."""
    w = _record_weights(rec_g, G_ref, valid, IS_KDA)
    if IS_KDA:
        kw = rec_k * w
        S = b_C * tl.exp(G_ref)[None, :]
    else:
        kw = rec_k * w[:, None]
        S = b_C * tl.exp(G_ref)
    S += tl.dot(tl.trans(rec_u), kw, input_precision=DOT_PRECISION)
    return S


# ----------------------------------------------------------------------------------------------
# the decode kernel
# ----------------------------------------------------------------------------------------------

@triton.jit
def replay_decode_kernel(
    mixed_qkv, a, b, A_log, dt_bias, out, state,
    ring_u, ring_k, ring_g, ring_h, arrive, slot_idx, forced,
    scale, lower_bound, L,
    stride_qkv, stride_a, stride_b, stride_slot,
    H: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, GK: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, CAP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, NPROG: tl.constexpr,
    IS_KDA: tl.constexpr, HAS_FORCED: tl.constexpr, USE_LOWER_BOUND: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    i_v = tl.program_id(0)
    i_nh = tl.program_id(1)
    i_n = i_nh // HV
    i_hv = i_nh % HV
    i_h = i_hv // (HV // H)
    if IS_KDA:
        i_hk = i_hv
    else:
        i_hk = i_h

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_c = tl.arange(0, BC)
    mask_k = o_k < K
    mask_v = o_v < V
    mask_kv = mask_v[:, None] & mask_k[None, :]

    slot = tl.load(slot_idx + i_n).to(tl.int64)
    p_o = out + (i_n * HV + i_hv) * V + o_v
    if slot < 0:
        tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty), mask=mask_v)
        return

    # checkpoint tile: read once, used for C q, C k and (on a flush) the fold
    p_s = state + slot * stride_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    b_C = tl.load(p_s, mask=mask_kv, other=0).to(tl.float32)
    h_old = tl.load(ring_h + slot)

    # this token: q, k (l2-normalised, q scaled), v tile, gate, beta -- SGLang's packed decode math
    p_x = mixed_qkv + i_n * stride_qkv
    b_q = tl.load(p_x + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_v = tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0).to(tl.float32)
    # l2 norm as SGLang's packed decode: x / sqrt(sum x^2 + 1e-6)
    b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
    b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
    b_q = b_q * scale
    g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, IS_KDA, USE_LOWER_BOUND)
    b_val = tl.load(b + i_n * stride_b + i_hv).to(tl.float32)
    if IS_KDA:
        beta = tl.sigmoid(b_val).to(tl.float32)
    else:
        beta = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)

    # the protocol (ring.py): prefold, flush, new h
    is_forced = h_old < 0
    if HAS_FORCED:
        is_forced = tl.load(forced + i_n) != 0
    prefold = h_old >= L
    h_eff = tl.where(prefold, 0, h_old)
    flush = ((h_eff + 1) >= L) | is_forced
    h_new = tl.where(flush, 0, h_eff + 1)
    update_h = h_new != h_old
    # arrival count for the in-kernel h update; the increment depends on h_old, so it is performed
    # only after this program has read h (the last program to arrive then writes h_new)
    cnt = h_old * 0 - 1
    if update_h & (prefold == 0):
        cnt = tl.atomic_add(arrive + slot, (h_old >= 0).to(tl.int32), sem="relaxed")

    # committed records of this row/head (masked: only j < h_old are read)
    valid = o_c < h_old
    p_ru = ring_u + ((slot * HV + i_hv) * CAP + o_c[:, None]) * V + o_v[None, :]
    p_rk = ring_k + ((slot * HK + i_hk) * CAP + o_c[:, None]) * K + o_k[None, :]
    rec_u = tl.load(p_ru, mask=valid[:, None] & mask_v[None, :], other=0).to(tl.float32)
    rec_k = tl.load(p_rk, mask=valid[:, None] & mask_k[None, :], other=0).to(tl.float32)
    if IS_KDA:
        p_rg = ring_g + ((slot * HV + i_hv) * CAP + o_c[:, None]) * GK + o_k[None, :]
        rec_g = tl.load(p_rg, mask=valid[:, None] & mask_k[None, :], other=0)
        G_last = tl.sum(tl.where((o_c == h_old - 1)[:, None], rec_g, 0.0), axis=0)
    else:
        p_rg = ring_g + (slot * HV + i_hv) * CAP + o_c
        rec_g = tl.load(p_rg, mask=valid, other=0)
        G_last = tl.sum(tl.where(o_c == h_old - 1, rec_g, 0.0), axis=0)

    if prefold:
        # fold every committed record into the checkpoint; the step then starts from it, h = 0
        b_C = _fold(b_C, rec_u, rec_k, rec_g, G_last, valid, IS_KDA, DOT_PRECISION)
        if flush == 0:
            tl.store(p_s, b_C.to(p_s.dtype.element_ty), mask=mask_kv)
        valid = o_c < 0
        G_last = G_last * 0.0
    G_t = G_last + g_t

    if flush:
        # full state in registers: S = C Diag(exp G_t) + records; then SGLang's update, in its order
        if h_eff > 0:
            b_S = _fold(b_C, rec_u, rec_k, rec_g, G_t, valid, IS_KDA, DOT_PRECISION)
        else:
            if IS_KDA:
                b_S = b_C * tl.exp(G_t)[None, :]
            else:
                b_S = b_C * tl.exp(G_t)
        b_v -= tl.sum(b_S * b_k[None, :], 1)
        b_v *= beta
        b_S += b_v[:, None] * b_k[None, :]
        b_o = tl.sum(b_S * b_q[None, :], 1)
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mask_v)
        tl.store(p_s, b_S.to(p_s.dtype.element_ty), mask=mask_kv)
    else:
        # output from the checkpoint read once plus dot products against the cached keys
        if IS_KDA:
            w = tl.where(valid[:, None], tl.exp(G_t[None, :] - rec_g), 0.0)
            eG = tl.exp(G_t)
            w_q = tl.sum(rec_k * w * b_q[None, :], 1)
            w_k = tl.sum(rec_k * w * b_k[None, :], 1)
            Cq = tl.sum(b_C * (eG * b_q)[None, :], 1)
            Ck = tl.sum(b_C * (eG * b_k)[None, :], 1)
        else:
            w = tl.where(valid, tl.exp(G_t - rec_g), 0.0)
            eG = tl.exp(G_t)
            w_q = tl.sum(rec_k * b_q[None, :], 1) * w
            w_k = tl.sum(rec_k * b_k[None, :], 1) * w
            Cq = tl.sum(b_C * b_q[None, :], 1) * eG
            Ck = tl.sum(b_C * b_k[None, :], 1) * eG
        Sak = Ck + tl.sum(rec_u * w_k[:, None], 0)
        u_t = beta * (b_v - Sak)
        b_o = Cq + tl.sum(rec_u * w_q[:, None], 0) + u_t * tl.sum(b_k * b_q)
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mask_v)
        # append this token's record at h_eff (u: this program's tile; k, G: one writer each)
        p_nu = ring_u + ((slot * HV + i_hv) * CAP + h_eff) * V + o_v
        tl.store(p_nu, u_t.to(p_nu.dtype.element_ty), mask=mask_v)
        if prefold == 0:
            if i_v == 0:
                if IS_KDA:
                    tl.store(ring_g + ((slot * HV + i_hv) * CAP + h_eff) * GK + o_k, G_t, mask=mask_k)
                    tl.store(ring_k + ((slot * HK + i_hk) * CAP + h_eff) * K + o_k,
                             b_k.to(ring_k.dtype.element_ty), mask=mask_k)
                else:
                    tl.store(ring_g + (slot * HV + i_hv) * CAP + h_eff, G_t)
                    if i_hv % (HV // H) == 0:
                        tl.store(ring_k + ((slot * HK + i_hk) * CAP + h_eff) * K + o_k,
                                 b_k.to(ring_k.dtype.element_ty), mask=mask_k)

    if update_h & prefold:
        # every load of the old records above happens before this release
        cnt = tl.atomic_add(arrive + slot, 1, sem="acq_rel")
    if update_h:
        if cnt == NPROG - 1:
            tl.store(ring_h + slot, h_new)
            tl.store(arrive + slot, 0)
            if prefold & (flush == 0):
                # record 0's shared parts for every head of this row: keys and G_0 = g_t
                for hk in range(HK):
                    kk = tl.load(p_x + H * K + hk * K + o_k, mask=mask_k, other=0).to(tl.float32)
                    kk = kk / tl.sqrt(tl.sum(kk * kk) + 1e-6)
                    tl.store(ring_k + (slot * HK + hk) * CAP * K + o_k, kk.to(ring_k.dtype.element_ty), mask=mask_k)
                for hv in range(HV):
                    gg = _load_gate(a, dt_bias, A_log, i_n, hv, stride_a, o_k, mask_k, lower_bound, K,
                                    IS_KDA, USE_LOWER_BOUND)
                    if IS_KDA:
                        tl.store(ring_g + (slot * HV + hv) * CAP * GK + o_k, gg, mask=mask_k)
                    else:
                        tl.store(ring_g + (slot * HV + hv) * CAP, gg)


# ----------------------------------------------------------------------------------------------
# host wrapper
# ----------------------------------------------------------------------------------------------

# Launch configurations (BV, num_warps) chosen from the H200 sweep in scripts/bench_kernels.py;
# keyed by (kind, state element size). Anything unlisted uses DEFAULT_CONFIG.
DEFAULT_CONFIG = (32, 2)
CONFIGS: dict[tuple[str, int], tuple[int, int]] = {}


def replay_decode(
    kind: str,
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    ring: "ringmod.Ring",
    slot_idx: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    forced: torch.Tensor | None = None,
    L: int | None = None,
    scale: float | None = None,
    lower_bound: float | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
    dot_precision: str = "ieee",
) -> torch.Tensor:
    """One buffered decode step (T = 1) for every row of the batch, in place on ``state`` and ``ring``.

    kind: "gdn" (a [B, HV], dt_bias [HV]) or "kda" (a [B, HV*K], dt_bias [HV*K]).
    mixed_qkv [B, 2*H*K + HV*V]; b [B, HV]; A_log [HV]; state [slots, HV, V, K] (fp32 or bf16);
    slot_idx [B] int (-1 = padded row); forced [B] (nonzero = flush this step: radix-cache block).
    L: the window for this launch; default: replayssm_sglang.policy.decode_window (the ring's L, or 1
    at small batch). It may be shorter than the ring's capacity, never longer.
    Returns out [B, 1, HV, V] in mixed_qkv's dtype.
    """
    lay = ring.layout
    if kind != lay.kind:
        raise ValueError(f"ring is for {lay.kind}, called with {kind}")
    B = mixed_qkv.shape[0]
    slots, HV, V, K = state.shape
    H = lay.H
    if (HV, V, K) != (lay.HV, lay.V, lay.K):
        raise ValueError(f"state {tuple(state.shape)} does not match the ring layout {lay}")
    if mixed_qkv.shape[1] != 2 * H * K + HV * V or mixed_qkv.stride(-1) != 1:
        raise ValueError("mixed_qkv must be [B, 2*H*K + HV*V], contiguous in the last dim")
    GK = 1 if kind == "gdn" else K
    if a.reshape(B, -1).shape[1] != HV * GK or dt_bias.numel() != HV * GK or A_log.numel() != HV:
        raise ValueError("gate inputs have the wrong size for this layer kind")
    if state.stride(-1) != 1 or state.stride(-2) != K or state.stride(-3) != V * K:
        raise ValueError("state must be contiguous within a slot")
    if L is None:
        L = policy.decode_window(kind, B, state.dtype, lay.L)
    L = int(L)
    if not 1 <= L <= lay.cap:
        raise ValueError(f"window L={L} must be in [1, ring capacity {lay.cap}]")
    a2 = a.reshape(B, HV * GK)
    b2 = b.reshape(B, HV)
    if out is None:
        out = torch.empty(B, 1, HV, V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    if not out.is_contiguous() or out.numel() != B * HV * V:
        raise ValueError("out must be contiguous with B*HV*V elements")
    if ring.arrive is None:
        raise ValueError("ring has no arrival counter (allocate it with RingLayout.allocate)")
    BK = triton.next_power_of_2(K)
    cfg = CONFIGS.get((kind, state.element_size()), DEFAULT_CONFIG)
    BV = block_v or min(cfg[0], triton.next_power_of_2(V))
    BV = max(BV, 16)
    nw = num_warps or cfg[1]
    BC = max(16, triton.next_power_of_2(lay.cap))
    NV = triton.cdiv(V, BV)
    grid = (NV, B * HV)
    replay_decode_kernel[grid](
        mixed_qkv, a2, b2, A_log, dt_bias, out, state,
        ring.u, ring.k, ring.g, ring.h, ring.arrive, slot_idx,
        forced if forced is not None else slot_idx,
        float(K ** -0.5 if scale is None else scale),
        float(lower_bound if lower_bound is not None else 0.0),
        L,
        mixed_qkv.stride(0), a2.stride(0), b2.stride(0), state.stride(0),
        H=H, HV=HV, HK=lay.HK, GK=GK, K=K, V=V, CAP=lay.cap, BK=BK, BV=BV, BC=BC, NPROG=NV * HV,
        IS_KDA=(kind == "kda"), HAS_FORCED=forced is not None,
        USE_LOWER_BOUND=lower_bound is not None, DOT_PRECISION=dot_precision,
        num_warps=nw, num_stages=1,
    )
    return out

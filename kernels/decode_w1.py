"""Window-1 decode: the conventional decode step on the checkpoint, for the small-batch policy.

Selected with ``replay_decode(..., L=1, impl="w1")``, and by ``impl="auto"`` wherever the policy
(replayssm_sglang/policy.py) picks window 1. At small batch a decode step is bound by latency, not bytes, so the
buffered path does not pay there; this kernel is then the conventional decode (read the state tile, update it,
write it back: SGLang's packed decode, op for op) with the ring's protocol at window 1 folded in:

- a row whose slot holds no records (h = 0, the steady state once a request decodes at small batch) runs
  exactly the conventional step; its h stays 0, nothing else is read or written;
- a row that still holds h > 0 records (its last step ran at a larger batch, or a verify step) folds them into the
  tile in registers first (ring.py's pre-step fold: C e^{G_{h-1}} + sum_j u_j (k_j e^{G_{h-1} - G_j})^T), then
  takes the conventional step from the folded state; the row's programs count their arrival on the ring's
  per-slot counter and the last one sets h = 0 (every program has read h by then).

Why a kernel of its own: v1's window-1 branch computes the same thing but lives in the buffered kernel, whose
registers and dependent loads (h, then the branch, then the tile) it pays at every batch size: on the H200 it
measured 0.67x conventional at B = 1 and 0.78x at B = 32 for GDN fp32 (benchmarks/results/kernels-20261129-2108).
Here the tile load is issued beside the h load, and the fold is a loop the common path never enters.

Grid (V / BV, B * HV) with SGLang's launch (BV = 32, one warp). Padded rows (slot < 0) write zeros and touch
nothing else. Rings with a read copy: the copy of every real row is marked stale (this kernel writes the
recurrence copy only), as after v1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_sglang.kernels.decode import _load_gate, _slot_row, ring_rows
from replayssm_sglang.kernels.decode_v2 import _fold_records


@triton.jit
def replay_decode_w1_kernel(
    mixed_qkv, a, b, A_log, dt_bias, out, state,
    ring_u, ring_k, ring_g, ring_h, arrive, slot_idx, ring_idx,
    scale, lower_bound,
    stride_qkv, stride_a, stride_b, stride_slot,
    H: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, GK: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    CAP: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, NPROG: tl.constexpr,
    IS_KDA: tl.constexpr, USE_LOWER_BOUND: tl.constexpr, HAS_RING_IDX: tl.constexpr = False,
    PRED: tl.constexpr = False,
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

    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, BK)
    mask_v = o_v < V
    mask_k = o_k < K
    m_kv = mask_v[:, None] & mask_k[None, :]

    slot, rrow = _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX)  # state slot, ring row
    p_o = out + (i_n * HV + i_hv) * V + o_v
    if slot < 0:
        tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty), mask=mask_v)
        return

    # the tile and h depend on the indices only: both loads in flight together
    p_s = state + slot * stride_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    b_h = tl.load(p_s, mask=m_kv, other=0).to(tl.float32)
    h_old = tl.load(ring_h + rrow)

    p_x = mixed_qkv + i_n * stride_qkv
    b_q = tl.load(p_x + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_v = tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_val = tl.load(b + i_n * stride_b + i_hv).to(tl.float32)
    if IS_KDA:
        beta = tl.sigmoid(b_val).to(tl.float32)
    else:
        beta = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)
    g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, IS_KDA, USE_LOWER_BOUND)

    if h_old > 0:
        # rare: records left by a buffered or verify step. ring.py's pre-step fold, in registers.
        base_u = ring_u + (rrow * HV + i_hv) * CAP * V
        base_k = ring_k + (rrow * HK + i_hk) * CAP * K
        base_g = ring_g + (rrow * HV + i_hv) * CAP * GK
        if IS_KDA:
            G_ref = tl.load(base_g + (h_old - 1) * GK + o_k, mask=mask_k, other=0)
        else:
            G_ref = tl.load(base_g + (h_old - 1))
        b_h = _fold_records(b_h, G_ref, h_old, base_u, base_k, base_g, o_v, o_k, mask_v, mask_k, V, K, GK, CAP, IS_KDA,
                            PRED=PRED)
        # h = 0 once every program of the row has read it: count arrivals (the increment depends on h_old, so
        # it is performed after this program's read of h); the last to arrive writes h and resets the counter
        cnt = tl.atomic_add(arrive + rrow, (h_old >= 0).to(tl.int32), sem="relaxed")
        if cnt == NPROG - 1:
            tl.store(ring_h + rrow, h_old * 0)
            tl.store(arrive + rrow, cnt * 0)

    # SGLang's packed decode, in its order
    b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
    b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
    b_q = b_q * scale
    if IS_KDA:
        b_h *= tl.exp(g_t)[None, :]
    else:
        b_h *= tl.exp(g_t)
    b_v -= tl.sum(b_h * b_k[None, :], 1)
    b_v *= beta
    b_h += b_v[:, None] * b_k[None, :]
    b_o = tl.sum(b_h * b_q[None, :], 1)
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mask_v)
    tl.store(p_s, b_h.to(state.dtype.element_ty), mask=m_kv)


# SGLang 0.5.17's launch of its packed decode (fused_sigmoid_gating_delta_rule_update): BV <= 32, one warp
W1_CONFIG = (32, 1)
_LAST: dict = {}


def launch(kind, mixed_qkv, a2, b2, A_log, dt_bias, state, ring, slot_idx, out, scale, lower_bound,
           *, block_v=None, num_warps=None, ring_idx=None):
    """One window-1 decode step (see the module docstring). Arguments as checked by kernels.decode.replay_decode."""
    lay = ring.layout
    ring.require_whole_records("the window-1 decode (decode_w1)")
    if ring.arrive is None:
        raise ValueError("ring has no arrival counter (allocate it with RingLayout.allocate)")
    B = mixed_qkv.shape[0]
    _, HV, V, K = state.shape
    if B == 0:
        return out
    BK = triton.next_power_of_2(K)
    BV = max(16, min(block_v or W1_CONFIG[0], triton.next_power_of_2(V)))
    NV = triton.cdiv(V, BV)
    _LAST["kernel"] = replay_decode_w1_kernel[(NV, B * HV)](
        mixed_qkv, a2, b2, A_log, dt_bias, out, state,
        ring.u, ring.k, ring.g, ring.h, ring.arrive, slot_idx, ring_idx if ring_idx is not None else slot_idx,
        float(scale), float(lower_bound if lower_bound is not None else 0.0),
        mixed_qkv.stride(0), a2.stride(0), b2.stride(0), state.stride(0),
        H=lay.H, HV=HV, HK=lay.HK, GK=1 if kind == "gdn" else K, K=K, V=V, CAP=lay.cap, BK=BK, BV=BV,
        NPROG=NV * HV, IS_KDA=(kind == "kda"), USE_LOWER_BOUND=lower_bound is not None,
        HAS_RING_IDX=ring_idx is not None, PRED=ring.predecayed,
        num_warps=num_warps or W1_CONFIG[1], num_stages=1,
    )
    if ring.rc is not None:
        # the recurrence copy was written: the read copies of these rows are stale
        from replayssm_sglang.kernels.decode_v3 import set_rc_valid_

        set_rc_valid_(ring, ring_rows(slot_idx, ring_idx), 0)
    return out

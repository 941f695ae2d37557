"""Buffered (ReplaySSM) decode, version 4 (GDN): one launch rebuilds each state tile on the tensor cores.

Selected with ``replay_decode(..., impl="v4")`` (kernels/decode.py); the protocol is ring.py's, the float64 reference
``replayssm_sglang.reference``; docs/design.md ("Decode kernel v4") has the reasoning and the measurements.

Why: decode v3 (kernels/decode_v3.py) reads its checkpoint at the copy speed on the steps that write nothing, but
pays a pre launch per (row, key head) for the record coefficients, about 15 us per GDN layer-step at B = 256 that
PDL hides only in part (docs/design.md, "Session 6" and "Session 14"). SGLang 0.5.17's own buffered kernel has no
such launch and measured 162-165 us per layer-step where v3 takes 181-183 (benchmarks/results/kernels-20261130-0748:
upstream 164.2 staggered / 162.4 aligned, v3 182.1 / 180.6). The difference is where the record sums go: v3 makes
per-record coefficients <k_j, q> once per key head (the pre launch) and weighs the records' corrections with them;
v4, like upstream's kernel, rebuilds the tile of the state before the token in each K chunk,

    S_c = e^{G_t} C_c + U_d K_c,    U_d[:, j] = u_j e^{G_t - G_j} (j < h),   K_c = the records' keys in chunk c,

one [BV, BC] x [BC, BKT] tensor-core product per chunk, and reads it with q~ and k~. Nothing is computed once per key
head, so there is no pre launch; the product is cheap on the tensor cores. Unlike upstream's kernel (tf32 products,
cursors from the host), v4 reads the ring's own committed count h on the device, follows ring.py's rule (flush,
forced flush, pre-step fold) and, by default, multiplies in three tf32 passes ("tf32x3", fp32-accurate).

Grid (V / BV, B, HV); a program owns a V-tile of one value head of one row:
  - h, the rule, and the gates: G_t = G_{h-1} + g_t; U_d from the h records' corrections of this V-tile;
  - the K-chunk loop (software-pipelined over ``pipe_stages``): the checkpoint chunk, the records' key chunk, the
    product above, S_c q~ and S_c k~ accumulated;
  - u_t = beta (v - S k~), o = S q~ + u_t <k~, q~>;
  - a row that writes its checkpoint (flush, forced flush, pre-step fold; 1/L of the rows) goes over the chunks a
    second time and stores S_c (its fold: through the token, S_c e^{g_t} + u_t k~^T, or, for a pre-step fold that
    appends, up to the last record);
  - a row that appends stores u_t (every program its V-tile), G_t (one program per value head) and k~ (one program
    per key head) at position h; the records a step reads are those below h, so nothing it reads is overwritten.
Then decode v2's post launch advances h (and writes record 0's key and G for a row that pre-folded and appends), a
programmatic dependent of the main launch with ``pdl``.

GDN only: KDA's per-K decay would need [BC, BKT] exponentials per chunk and program (upstream's KDA path, 0.77x
conventional), and its predecayed keys' rebases are decided per head in v3's pre launch. Read copies (issue 7) stay
on v3 too. Padded rows (slot < 0) write zeros and touch nothing else.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

from replayssm_sglang.kernels.decode import _decode_rule, _load_gate, _slot_row
from replayssm_sglang.kernels.decode_v2 import replay_decode_v2_post_kernel
from replayssm_sglang.kernels.decode_v3 import _maxnreg_opts, _pdl_kw, pdl_available


@triton.jit
def replay_decode_v4_kernel(
    mixed_qkv, a, b, A_log, dt_bias, out, state,
    ring_u, ring_k, ring_g, ring_h, h_rows, slot_idx, forced, ring_idx,
    scale, lower_bound, L,
    stride_qkv, stride_a, stride_b, stride_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, CAP: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BC: tl.constexpr, BKT: tl.constexpr,
    HAS_FORCED: tl.constexpr, HAS_H_ROWS: tl.constexpr, HAS_RING_IDX: tl.constexpr, USE_LOWER_BOUND: tl.constexpr,
    DOT_PREC: tl.constexpr, DOT_BF16: tl.constexpr, PIPE: tl.constexpr, FOLD_PIPE: tl.constexpr, USE_PDL: tl.constexpr,
):
    if USE_PDL:
        gdc_launch_dependents()  # the post launch may be scheduled now; it waits (gdc_wait) for this one to finish
    i_v = tl.program_id(0)
    i_n = tl.program_id(1)
    i_hv = tl.program_id(2)
    i_h = i_hv // (HV // H)  # GDN: the key head of this value head's group
    o_v = i_v * BV + tl.arange(0, BV)
    mask_v = o_v < V
    o_c = tl.arange(0, BC)
    p_o = out + (i_n * HV + i_hv) * V + o_v

    slot, rrow = _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX)
    if slot < 0:
        tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty), mask=mask_v)
        return
    if HAS_H_ROWS:
        h_old = tl.load(h_rows + i_n).to(tl.int32)
    else:
        h_old = tl.load(ring_h + rrow).to(tl.int32)
    prefold, h_eff, flush, _ = _decode_rule(h_old, forced, i_n, L, HAS_FORCED)
    valid = o_c < h_old  # the committed records

    # gates: G of the records (cumulative since the checkpoint), this step's g_t, G_t = G_{h-1} + g_t
    base_g = ring_g + (rrow * HV + i_hv) * CAP
    Gr = tl.load(base_g + o_c, mask=valid, other=0.0)
    G_last = tl.sum(tl.where(o_c == h_old - 1, Gr, 0.0), 0)  # 0 without records
    g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_c, valid, lower_bound, K, False, USE_LOWER_BOUND)
    G_t = G_last + g_t
    # the records' corrections of this V-tile, each weighted by its decay up to this token (exponents <= 0)
    base_u = ring_u + (rrow * HV + i_hv) * CAP * V
    U = tl.load(base_u + o_c[None, :] * V + o_v[:, None], mask=mask_v[:, None] & valid[None, :],
                other=0).to(tl.float32)  # [BV, BC]
    Ud = U * tl.where(valid, tl.exp(G_t - Gr), 0.0)[None, :]
    e_t = tl.exp(G_t)

    # q and k of the key head as [chunks, BKT] (one load each; a chunk is picked out in registers in the loop: loads
    # of 2-byte elements inside a pipelined loop are not asynchronous copies and would stall it, decode_v3)
    NC: tl.constexpr = BK // BKT
    o_ch = tl.arange(0, NC)
    offs = o_ch[:, None] * BKT + tl.arange(0, BKT)[None, :]  # [NC, BKT]: chunk c holds c * BKT + j
    p_x = mixed_qkv + i_n * stride_qkv
    Q2 = tl.load(p_x + i_h * K + offs, mask=offs < K, other=0).to(tl.float32)
    K2 = tl.load(p_x + H * K + i_h * K + offs, mask=offs < K, other=0).to(tl.float32)
    s_q = scale / tl.sqrt(tl.sum(tl.sum(Q2 * Q2, 1), 0) + 1e-6)  # q~ = s_q q, k~ = s_k k (SGLang's l2 norm)
    s_k = 1.0 / tl.sqrt(tl.sum(tl.sum(K2 * K2, 1), 0) + 1e-6)
    kq = tl.sum(tl.sum(Q2 * K2, 1), 0) * (s_q * s_k)

    p_st = state + slot * stride_slot + i_hv * V * K
    base_k = ring_k + (rrow * H + i_h) * CAP * K
    dq = tl.zeros([BV], dtype=tl.float32)
    dk = tl.zeros([BV], dtype=tl.float32)
    for c in tl.range(0, NC, num_stages=PIPE):
        o_kc = c * BKT + tl.arange(0, BKT)
        mk = o_kc < K
        C_c = tl.load(p_st + o_v[:, None] * K + o_kc[None, :], mask=mask_v[:, None] & mk[None, :],
                      other=0).to(tl.float32)
        K_c = tl.load(base_k + o_c[:, None] * K + o_kc[None, :], mask=valid[:, None] & mk[None, :],
                      other=0).to(tl.float32)  # [BC, BKT]
        if DOT_BF16:  # (opt-in: the operands rounded to bf16, as upstream's kernel multiplies)
            S_c = tl.dot(Ud.to(tl.bfloat16), K_c.to(tl.bfloat16), acc=C_c * e_t)
        else:
            S_c = tl.dot(Ud, K_c, acc=C_c * e_t, input_precision=DOT_PREC)  # the state before the token's decay
        sel = o_ch[:, None] == c
        dq += tl.sum(S_c * tl.sum(tl.where(sel, Q2, 0.0), 0)[None, :], 1)
        dk += tl.sum(S_c * tl.sum(tl.where(sel, K2, 0.0), 0)[None, :], 1)
    Sq = dq * s_q
    Sk = dk * s_k

    v = tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_val = tl.load(b + i_n * stride_b + i_hv).to(tl.float32)
    beta = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)  # rounded as SGLang's GDN kernel does
    u_t = beta * (v - Sk)
    o = Sq + u_t * kq
    tl.store(p_o, o.to(p_o.dtype.element_ty), mask=mask_v)

    if flush | prefold:
        # write the checkpoint: the records folded up to this token (flush: through it) from the ring again (the
        # first pass reduced its chunks as they landed); G_f = G_t through the token, G_{h-1} before it
        tok = flush
        G_f = tl.where(tok, G_t, G_last)
        Uf = tl.load(base_u + o_c[None, :] * V + o_v[:, None], mask=mask_v[:, None] & valid[None, :],
                     other=0).to(tl.float32)
        Uf = Uf * tl.where(valid, tl.exp(G_f - Gr), 0.0)[None, :]
        e_f = tl.exp(G_f)
        u_add = tl.where(tok, u_t, 0.0)
        tl.debug_barrier()  # every read of the tiles above precedes the writes below
        for c in tl.range(0, NC, num_stages=FOLD_PIPE):
            o_kc = c * BKT + tl.arange(0, BKT)
            mk = o_kc < K
            m_c = mask_v[:, None] & mk[None, :]
            C_c = tl.load(p_st + o_v[:, None] * K + o_kc[None, :], mask=m_c, other=0).to(tl.float32)
            K_c = tl.load(base_k + o_c[:, None] * K + o_kc[None, :], mask=valid[:, None] & mk[None, :],
                          other=0).to(tl.float32)
            if DOT_BF16:
                S_c = tl.dot(Uf.to(tl.bfloat16), K_c.to(tl.bfloat16), acc=C_c * e_f)
            else:
                S_c = tl.dot(Uf, K_c, acc=C_c * e_f, input_precision=DOT_PREC)
            k_c = tl.sum(tl.where(o_ch[:, None] == c, K2, 0.0), 0) * s_k
            S_c += u_add[:, None] * k_c[None, :]
            tl.store(p_st + o_v[:, None] * K + o_kc[None, :], S_c.to(state.dtype.element_ty), mask=m_c)
        tl.debug_barrier()  # the fold's reads of record 0 precede its rewrite below (a pre-step fold that appends)
    if flush == 0:
        tl.store(base_u + h_eff * V + o_v, u_t.to(ring_u.dtype.element_ty), mask=mask_v)
        if (prefold == 0) & (i_v == 0):
            # the record's shared parts (a pre-step fold's record 0: the post launch, after every reader of the old
            # one): G_t by one program per value head, k~ by one per key head
            tl.store(base_g + h_eff, G_t)
            if i_hv % (HV // H) == 0:
                tl.store(base_k + h_eff * K + offs, (K2 * s_k).to(ring_k.dtype.element_ty), mask=offs < K)


# ----------------------------------------------------------------------------------------------
# host side (called by kernels.decode.replay_decode with impl="v4", after its argument checks)
# ----------------------------------------------------------------------------------------------

# The launch's defaults (``launch`` keyword arguments left None). Until the H200 sweeps them: upstream's tile
# (BV 64, one warp, two 256-byte K chunks of an fp32 row, three stages), the products in three tf32 passes.
V4_TUNED: dict = {"block_v": 64, "num_warps": 1, "chunk_bytes": 256, "pipe_stages": 3, "fold_pipe_stages": 1,
                  "dot_precision": "tf32x3", "pdl": True}
DOT_PRECISIONS = ("tf32x3", "tf32", "ieee", "bf16")
_LAST: dict = {}


def launch(kind, mixed_qkv, a2, b2, A_log, dt_bias, state, ring, slot_idx, out, forced, L, scale, lower_bound, *,
           block_v=None, num_warps=None, h_rows=None, advance_h=True, may_prefold=True, ring_idx=None,
           chunk_bytes=None, pipe_stages=None, fold_pipe_stages=None, dot_precision=None, pdl=None,
           main_maxnreg=None):
    """One decode step with decode v4 (GDN). Options left None come from V4_TUNED. chunk_bytes: the K-chunk width
    of a checkpoint row in bytes (at least 16 elements: the product's inner dimension). dot_precision: the records'
    product, "tf32x3" (fp32-accurate), "tf32" (one pass), "bf16" (operands rounded to bf16, as upstream's kernel
    does) or "ieee" (fp32 FMA). h_rows / advance_h /
    may_prefold / ring_idx as decode v3."""
    if kind != "gdn":
        raise ValueError("decode v4 is for GDN layers (scalar decay per head); KDA runs impl='v3' (impl='auto')")
    if ring.rc is not None:
        raise ValueError("a ring with a read copy (read_dtype bf16/fp8_e4m3) runs impl 'v3' (impl='auto')")
    if not may_prefold and advance_h:
        raise ValueError("may_prefold=False only skips the post launch, which advance_h=True needs anyway")
    o = {k: (v if v is not None else V4_TUNED[k]) for k, v in dict(
        block_v=block_v, num_warps=num_warps, chunk_bytes=chunk_bytes, pipe_stages=pipe_stages,
        fold_pipe_stages=fold_pipe_stages, dot_precision=dot_precision, pdl=pdl).items()}
    if o["dot_precision"] not in DOT_PRECISIONS:
        raise ValueError(f"dot_precision must be one of {DOT_PRECISIONS}, got {o['dot_precision']!r}")
    if o["pipe_stages"] < 1 or o["fold_pipe_stages"] < 1:
        raise ValueError("pipe_stages and fold_pipe_stages must be >= 1 (1: a plain loop)")
    lay = ring.layout
    B = mixed_qkv.shape[0]
    _, HV, V, K = state.shape
    if h_rows is not None and (h_rows.shape != (B,) or h_rows.dtype != torch.int32):
        raise ValueError("h_rows must be an int32 [B] tensor")
    BK = triton.next_power_of_2(K)
    if BK < 16:
        raise ValueError(f"decode v4 needs K >= 16 (a tensor-core product over K chunks), got K={K}")
    BKT = min(BK, max(16, int(o["chunk_bytes"]) // state.element_size()))
    BV = max(16, min(int(o["block_v"]), triton.next_power_of_2(V)))
    BC = max(16, triton.next_power_of_2(lay.cap))
    pdl_on = bool(o["pdl"]) and pdl_available(mixed_qkv.device)
    if B == 0:
        return out
    f = forced if forced is not None else slot_idx
    hr = h_rows if h_rows is not None else slot_idx
    ri = ring_idx if ring_idx is not None else slot_idx
    _LAST["kernel"] = replay_decode_v4_kernel[(triton.cdiv(V, BV), B, HV)](
        mixed_qkv, a2, b2, A_log, dt_bias, out, state,
        ring.u, ring.k, ring.g, ring.h, hr, slot_idx, f, ri,
        float(scale), float(lower_bound if lower_bound is not None else 0.0), L, mixed_qkv.stride(0), a2.stride(0), b2.stride(0), state.stride(0),
        H=lay.H, HV=HV, K=K, V=V, CAP=lay.cap, BK=BK, BV=BV, BC=BC, BKT=BKT,
        HAS_FORCED=forced is not None, HAS_H_ROWS=h_rows is not None, HAS_RING_IDX=ring_idx is not None,
        USE_LOWER_BOUND=lower_bound is not None, DOT_BF16=o["dot_precision"] == "bf16",
        DOT_PREC=o["dot_precision"] if o["dot_precision"] != "bf16" else "tf32", PIPE=int(o["pipe_stages"]), FOLD_PIPE=int(o["fold_pipe_stages"]),
        USE_PDL=pdl_on, num_warps=int(o["num_warps"]), num_stages=int(o["pipe_stages"]),
        **_maxnreg_opts("main_maxnreg", main_maxnreg, mixed_qkv.device),
    )
    if advance_h or may_prefold:
        replay_decode_v2_post_kernel[(B,)](
            mixed_qkv, a2, A_log, dt_bias, ring.k, ring.g, ring.h, hr, ring.h, slot_idx, f, ri,
            float(lower_bound if lower_bound is not None else 0.0), L, mixed_qkv.stride(0), a2.stride(0),
            H=lay.H, HV=HV, HK=lay.HK, GK=1, K=K, CAP=lay.cap, BK=BK, IS_KDA=False,
            HAS_FORCED=forced is not None, HAS_H_ROWS=h_rows is not None, USE_LOWER_BOUND=lower_bound is not None,
            HAS_RING_IDX=ring_idx is not None, WRITE_H=bool(advance_h), WRITE_REC0=True, num_warps=1, num_stages=1,
            USE_PDL=pdl_on, HVP=triton.next_power_of_2(HV), **_pdl_kw(pdl_on),
        )
    return out

"""Buffered (ReplaySSM) decode, version 2: a latency-lean kernel with h read, never written.

Selected with ``replay_decode(..., impl="v2")`` (kernels/decode.py); the protocol is ring.py's, the
float64 reference ``replayssm_sglang.reference``; docs/design.md ("Decode kernel v2") has the design,
the bytes/occupancy estimate and what is still unmeasured.

What changes against v1 (``replay_decode_kernel``):
  * grid (V / BV, B, HV), one [BV, K] checkpoint tile per program, loaded in one piece right after
    the slot index and before anything that depends on h: the big load never waits for h;
  * h comes either per row from the caller (``h_rows`` [B], loaded next to the slot index: no
    dependent round trip at all) or from ``ring.h[slot]``; the kernel never writes h, so there is no
    arrival counter and no atomics. A second tiny launch (``replay_decode_v2_post_kernel``, one
    program per row) advances ``ring.h`` with ring.py's rule, or the caller does it once per forward
    for every layer (a model-wide h per slot, docs/design.md);
  * the records are loaded as whole tiles ([cap, K] keys, [cap, BV] corrections) with a mask from h:
    one round trip, no loop;
  * one uniform path for every row: output = C (exp(G_t) q) + sum_j u_j <k_j exp(G_t - G_j), q> +
    u_t <k, q> with G_t = G_last + g_t; a row that writes its checkpoint (flush, or a pre-step fold)
    folds the records into its register tile by rank-1 updates, re-reading each record (expected cache hits: the
    tiles were just loaded); ``fold="unroll"`` unrolls that loop over the ``cap`` record slots at
    compile time (masked by h, all loads independent) instead of a loop of h trips; ``records="all"``
    loads every ring position without waiting for h (zeroed past h by a select): more bytes (cap
    instead of h records), one dependent round trip fewer when h comes from the ring;
  * a pre-step fold (h >= L) that appends the token needs record 0's shared parts (keys per key head,
    G per value head) rewritten while other programs of the row may still read the old record 0: the
    post launch writes them (stream order puts it after every read). The private part (u of this
    V-tile) is written in the kernel, after a barrier.
Every exponent is <= 0 (exp(G_f - G_j) with G cumulative log-decays and G_f later than G_j), so nothing
overflows however strong the decay. Padded rows (slot < 0) write zeros and touch nothing else.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from replayssm_sglang.kernels.decode import (_decode_rule, _decode_rule_rc, _load_gate, _slot_row,
                                             _store_record0_shared)


@triton.jit
def _fold_one(S, j, h_old, G_f, base_u, base_k, base_g, o_v, o_k, mask_v, mask_k,
              V: tl.constexpr, K: tl.constexpr, GK: tl.constexpr, IS_KDA: tl.constexpr, PRED: tl.constexpr = False):
    """S + u_j (k_j exp(G_f - G_j))^T for record j (nothing when j >= h_old). PRED (KDA records k_j e^{-G_j},
    ring.kda_keys "predecayed"): the record already carries e^{-G_j}; G_f is then e^{G_f / 2} (computed once by
    _fold_records), applied twice (see decode_v3._pre_row), and G_j is not read."""
    ok = h_old > j
    u_j = tl.load(base_u + j * V + o_v, mask=mask_v & ok, other=0).to(tl.float32)
    k_j = tl.load(base_k + j * K + o_k, mask=mask_k & ok, other=0).to(tl.float32)
    if PRED:
        k_j = k_j * G_f * G_f  # (k_j is 0 past h_old)
    else:
        if IS_KDA:
            g_j = tl.load(base_g + j * GK + o_k, mask=mask_k & ok, other=0)
        else:
            g_j = tl.load(base_g + j, mask=ok, other=0)
        k_j = k_j * tl.where(ok, tl.exp(G_f - g_j), 0.0)
    return S + u_j[:, None] * k_j[None, :]


@triton.jit
def _fold_records(C, G_f, n, base_u, base_k, base_g, o_v, o_k, mask_v, mask_k,
                  V: tl.constexpr, K: tl.constexpr, GK: tl.constexpr, CAP: tl.constexpr, IS_KDA: tl.constexpr,
                  UNROLL: tl.constexpr = False, PRED: tl.constexpr = False):
    """C e^{G_f} + sum_{j < n} u_j (k_j e^{G_f - G_j})^T on one [BV, K-range] tile (o_k selects the K range;
    G_f is a scalar for GDN, a vector over that K range for KDA): the fold of every kernel that writes a
    checkpoint (decode v2 and v3, the track-slot materialization). UNROLL unrolls the record loop over the
    ring capacity (independent loads, masked by n) instead of n trips."""
    if IS_KDA:
        S = C * tl.exp(G_f)[None, :]
    else:
        S = C * tl.exp(G_f)
    if PRED:
        w = tl.exp(0.5 * G_f)  # every predecayed record's weight is e^{G_f}: computed once, not per record
    else:
        w = G_f
    if UNROLL:
        for j in tl.static_range(CAP):
            S = _fold_one(S, j, n, w, base_u, base_k, base_g, o_v, o_k, mask_v, mask_k, V, K, GK, IS_KDA, PRED)
    else:
        for j in range(n):
            S = _fold_one(S, j, n, w, base_u, base_k, base_g, o_v, o_k, mask_v, mask_k, V, K, GK, IS_KDA, PRED)
    return S


@triton.jit
def replay_decode_v2_kernel(
    mixed_qkv, a, b, A_log, dt_bias, out, state,
    ring_u, ring_k, ring_g, ring_h, h_rows, slot_idx, forced, ring_idx,
    scale, lower_bound, L,
    stride_qkv, stride_a, stride_b, stride_slot,
    H: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, GK: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, CAP: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BC: tl.constexpr,
    IS_KDA: tl.constexpr, HAS_FORCED: tl.constexpr, HAS_H_ROWS: tl.constexpr,
    USE_LOWER_BOUND: tl.constexpr, FOLD_UNROLL: tl.constexpr = False, REC_ALL: tl.constexpr = False,
    HAS_RING_IDX: tl.constexpr = False,
):
    i_v = tl.program_id(0)
    i_n = tl.program_id(1)
    i_hv = tl.program_id(2)
    i_h = i_hv // (HV // H)
    if IS_KDA:
        i_hk = i_hv
    else:
        i_hk = i_h

    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, BK)
    o_c = tl.arange(0, BC)
    mask_v = o_v < V
    mask_k = o_k < K
    m_vk = mask_v[:, None] & mask_k[None, :]

    # per-row metadata: all independent loads
    slot, rrow = _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX)  # state slot, ring row
    if HAS_H_ROWS:
        h_old = tl.load(h_rows + i_n).to(tl.int32)
    p_o = out + (i_n * HV + i_hv) * V + o_v
    if slot < 0:
        tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty), mask=mask_v)
        return

    # the checkpoint tile [BV, K]: depends on the slot only, so it is issued first
    p_s = state + slot * stride_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    C = tl.load(p_s, mask=m_vk, other=0).to(tl.float32)
    if not HAS_H_ROWS:
        h_old = tl.load(ring_h + rrow).to(tl.int32)

    # this token's inputs
    p_x = mixed_qkv + i_n * stride_qkv
    q = tl.load(p_x + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    k = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    v = tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_val = tl.load(b + i_n * stride_b + i_hv).to(tl.float32)
    if IS_KDA:
        beta = tl.sigmoid(b_val).to(tl.float32)
    else:
        beta = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)
    g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, IS_KDA,
                     USE_LOWER_BOUND)
    q = q / tl.sqrt(tl.sum(q * q) + 1e-6)
    q = q * scale
    k = k / tl.sqrt(tl.sum(k * k) + 1e-6)

    # the protocol (ring.py): prefold, flush
    prefold, h_eff, flush, _ = _decode_rule(h_old, forced, i_n, L, HAS_FORCED)

    # the h_old committed records (folded into the checkpoint first on a prefold: same sums)
    valid = o_c < h_old
    base_u = ring_u + (rrow * HV + i_hv) * CAP * V
    base_k = ring_k + (rrow * HK + i_hk) * CAP * K
    base_g = ring_g + (rrow * HV + i_hv) * CAP * GK
    if REC_ALL:
        # every ring position (independent of h, so these loads issue with the state's); the ones past h
        # (stale, or never written) are replaced by zeros with a select, never multiplied
        rv = o_c < CAP
    else:
        rv = valid
    m_ck = rv[:, None] & mask_k[None, :]
    rk = tl.load(base_k + o_c[:, None] * K + o_k[None, :], mask=m_ck, other=0).to(tl.float32)  # [BC, BK]
    ru = tl.load(base_u + o_c[:, None] * V + o_v[None, :], mask=rv[:, None] & mask_v[None, :],
                 other=0).to(tl.float32)  # [BC, BV]
    if REC_ALL:
        rk = tl.where(valid[:, None], rk, 0.0)
        ru = tl.where(valid[:, None], ru, 0.0)
    last = o_c == (h_old - 1)
    if IS_KDA:
        rg = tl.load(base_g + o_c[:, None] * GK + o_k[None, :], mask=m_ck, other=0)  # [BC, BK]
        if REC_ALL:
            rg = tl.where(valid[:, None], rg, 0.0)
        G_last = tl.sum(tl.where(last[:, None], rg, 0.0), 0)  # [BK], 0 without records
        G_t = G_last + g_t
        kw = rk * tl.where(valid[:, None], tl.exp(G_t[None, :] - rg), 0.0)
        wq = tl.sum(kw * q[None, :], 1)
        wk = tl.sum(kw * k[None, :], 1)
        e_t = tl.exp(G_t)
        Cq = tl.sum(C * (e_t * q)[None, :], 1)
        Ck = tl.sum(C * (e_t * k)[None, :], 1)
    else:
        rg = tl.load(base_g + o_c, mask=rv, other=0)  # [BC]
        if REC_ALL:
            rg = tl.where(valid, rg, 0.0)
        G_last = tl.sum(tl.where(last, rg, 0.0), 0)
        G_t = G_last + g_t
        w = tl.where(valid, tl.exp(G_t - rg), 0.0)
        wq = tl.sum(rk * q[None, :], 1) * w
        wk = tl.sum(rk * k[None, :], 1) * w
        e_t = tl.exp(G_t)
        Cq = tl.sum(C * q[None, :], 1) * e_t
        Ck = tl.sum(C * k[None, :], 1) * e_t
    kq = tl.sum(k * q)
    u_t = beta * (v - (Ck + tl.sum(ru * wk[:, None], 0)))
    o = Cq + tl.sum(ru * wq[:, None], 0) + u_t * kq
    tl.store(p_o, o.to(p_o.dtype.element_ty), mask=mask_v)

    if flush | prefold:
        # write the checkpoint: fold the records (and, on a flush, this token) relative to G_f, the
        # cumulative decay at the last thing folded (G_t on a flush, G_last on a prefold that appends)
        G_f = tl.where(flush, G_t, G_last)
        # the records were just loaded above: expected cache hits
        S = _fold_records(C, G_f, h_old, base_u, base_k, base_g, o_v, o_k, mask_v, mask_k, V, K, GK, CAP, IS_KDA,
                          FOLD_UNROLL)
        S += tl.where(flush, u_t, 0.0)[:, None] * k[None, :]
        tl.debug_barrier()  # every read of this tile and of record 0 above precedes the writes below
        tl.store(p_s, S.to(state.dtype.element_ty), mask=m_vk)
    if flush == 0:
        # append the token as record h_eff (0 after a prefold): u of this V-tile here; the shared parts
        # (keys: one writer per key head; G: one per value head) here unless a prefold happened, when
        # other programs may still read record 0 and the post launch writes them
        tl.store(base_u + h_eff * V + o_v, u_t.to(ring_u.dtype.element_ty), mask=mask_v)
        if (prefold == 0) & (i_v == 0):
            if IS_KDA:
                tl.store(base_k + h_eff * K + o_k, k.to(ring_k.dtype.element_ty), mask=mask_k)
                tl.store(base_g + h_eff * GK + o_k, G_t, mask=mask_k)
            else:
                if i_hv % (HV // H) == 0:
                    tl.store(base_k + h_eff * K + o_k, k.to(ring_k.dtype.element_ty), mask=mask_k)
                tl.store(base_g + h_eff, G_t)


@triton.jit
def replay_decode_v2_post_kernel(
    mixed_qkv, a, A_log, dt_bias, ring_k, ring_g, ring_h, h_rows, h_dst, slot_idx, forced, ring_idx,
    lower_bound, L, stride_qkv, stride_a,
    H: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, GK: tl.constexpr, K: tl.constexpr,
    CAP: tl.constexpr, BK: tl.constexpr,
    IS_KDA: tl.constexpr, HAS_FORCED: tl.constexpr, HAS_H_ROWS: tl.constexpr, USE_LOWER_BOUND: tl.constexpr,
    WRITE_H: tl.constexpr, WRITE_REC0: tl.constexpr, USE_PDL: tl.constexpr = False,
    HAS_RING_IDX: tl.constexpr = False, rc_valid=None, HAS_RC: tl.constexpr = False, ovf=None,
    PRED: tl.constexpr = False, HVP: tl.constexpr = 1, ring_k_lo=None, SPLIT: tl.constexpr = False,
):
    """One program per row, after the decode launch: h_dst[ring row] = ring.h_after_decode(h) (WRITE_H) and,
    for a row that pre-folded and appended, record 0's shared parts (WRITE_REC0). USE_PDL (launched as a
    programmatic dependent of the decode launch): waits for it first. HAS_RC (decode v3 with a read copy): the
    rule counts a stale copy as a forced flush, as the decode launch did, and every real row's copy is marked
    current (rc_valid[ring row] = 1) once the decode launch has written it. SPLIT (split records, decode v3's CUDA
    launches): keys are written, and zeroed, in both planes (ring_k_lo the low one)."""
    if USE_PDL:
        gdc_wait()
    i_n = tl.program_id(0)
    slot, rrow = _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX)
    if slot >= 0:
        if HAS_H_ROWS:
            h_old = tl.load(h_rows + i_n).to(tl.int32)
        else:
            h_old = tl.load(ring_h + rrow).to(tl.int32)
        prefold, h_eff, flush, h_new = _decode_rule_rc(h_old, forced, i_n, L, HAS_FORCED, rc_valid, rrow, HAS_RC)
        if PRED:
            # decode v3 with predecayed KDA keys (see decode_v3): a row its pre launch flagged flushed; a head it
            # flagged was rebased by the decode launch, whose programs have read its records by now: they are
            # zeroed (the pre launch wrote this step's as zeros). The flags are cleared for the next launch.
            p_f = ovf + rrow * (HV + 1)
            ov = tl.load(p_f + HV) != 0
            flush = flush | ov
            prefold = prefold & (ov == 0)
            h_new = tl.where(ov, 0, h_new)
            tl.store(p_f + HV, 0)
            o_k = tl.arange(0, BK)
            o_h = tl.arange(0, HVP)
            # all head flags in one load: the loop below runs only on the (rare) rows with a rebased head
            if tl.max(tl.load(p_f + o_h, mask=o_h < HV, other=0), 0) != 0:
                for hv in range(HV):  # (KDA: key head hv is value head hv)
                    if tl.load(p_f + hv) != 0:
                        for j in range(h_old):
                            tl.store(ring_k + ((rrow * HK + hv) * CAP + j) * K + o_k,
                                     tl.zeros([BK], dtype=tl.float32).to(ring_k.dtype.element_ty), mask=o_k < K)
                            if SPLIT:  # (a zero record's low half is 0 too: a stale one would join to garbage)
                                tl.store(ring_k_lo + ((rrow * HK + hv) * CAP + j) * K + o_k,
                                         tl.zeros([BK], dtype=tl.int16), mask=o_k < K)
                        tl.store(p_f + hv, 0)
        if WRITE_H:
            tl.store(h_dst + rrow, h_new)
        if HAS_RC:
            tl.store(rc_valid + rrow, 1)
        if WRITE_REC0:
            if prefold & (flush == 0):
                _store_record0_shared(mixed_qkv + i_n * stride_qkv, a, dt_bias, A_log, i_n, stride_a, lower_bound,
                                      ring_k, ring_g, rrow, H, HK, HV, K, GK, CAP, BK, IS_KDA, USE_LOWER_BOUND,
                                      PRED, ring_k_lo, SPLIT)


# ----------------------------------------------------------------------------------------------
# host side (called by kernels.decode.replay_decode with impl="v2", after its argument checks)
# ----------------------------------------------------------------------------------------------

# (BV, num_warps) per (kind, state element size); anything unlisted uses V2_DEFAULT_CONFIG. Not yet
# tuned on a GPU: scripts/bench_kernels.py --v2-sweep picks from V2_SWEEP (docs/benchmarks.md). Chosen
# offline from ptxas (scripts/sass_decode.py, sm_90, Triton 3.6 as on the GPU): no spills, <= 162 registers
# (3-5 programs, 12-20 warps per SM); KDA at BV=64, 8 warps (128 registers) so that each head's per-K gate
# records are read (and exponentiated) by two programs, not four.
V2_DEFAULT_CONFIG = (32, 4)
V2_CONFIGS: dict[tuple[str, int], tuple[int, int]] = {("kda", 4): (64, 8), ("kda", 2): (64, 8)}
V2_SWEEP = "16x2,32x2,32x4,64x4,64x8"
_LAST: dict = {}


def launch(kind, mixed_qkv, a2, b2, A_log, dt_bias, state, ring, slot_idx, out, forced, L, scale, lower_bound,
           *, block_v=None, num_warps=None, h_rows=None, advance_h=True, may_prefold=True, fold="loop",
           records="masked", ring_idx=None):
    lay = ring.layout
    ring.require_whole_records("decode v2")
    B = mixed_qkv.shape[0]
    _, HV, V, K = state.shape
    GK = 1 if kind == "gdn" else K
    if h_rows is not None:
        if h_rows.shape != (B,) or h_rows.dtype != torch.int32 or h_rows.device != slot_idx.device:
            raise ValueError("h_rows must be an int32 [B] tensor on the batch's device")
    if not may_prefold and advance_h:
        raise ValueError("may_prefold=False only skips the post launch, which advance_h=True needs anyway")
    if fold not in ("loop", "unroll"):
        raise ValueError(f"v2 fold must be 'loop' or 'unroll', got {fold!r}")
    if records not in ("masked", "all"):
        raise ValueError(f"v2 records must be 'masked' or 'all', got {records!r}")
    BK = triton.next_power_of_2(K)
    cfg = V2_CONFIGS.get((kind, state.element_size()), V2_DEFAULT_CONFIG)
    BV = max(16, min(block_v or cfg[0], triton.next_power_of_2(V)))
    nw = num_warps or cfg[1]
    BC = max(4, triton.next_power_of_2(lay.cap))
    grid = (triton.cdiv(V, BV), B, HV)
    common = dict(H=lay.H, HV=HV, HK=lay.HK, GK=GK, K=K, CAP=lay.cap, BK=BK, IS_KDA=(kind == "kda"),
                  HAS_FORCED=forced is not None, HAS_H_ROWS=h_rows is not None,
                  USE_LOWER_BOUND=lower_bound is not None, HAS_RING_IDX=ring_idx is not None)
    f = forced if forced is not None else slot_idx
    hr = h_rows if h_rows is not None else slot_idx
    ri = ring_idx if ring_idx is not None else slot_idx
    lb = float(lower_bound if lower_bound is not None else 0.0)
    _LAST["kernel"] = replay_decode_v2_kernel[grid](
        mixed_qkv, a2, b2, A_log, dt_bias, out, state,
        ring.u, ring.k, ring.g, ring.h, hr, slot_idx, f, ri,
        float(scale), lb, L,
        mixed_qkv.stride(0), a2.stride(0), b2.stride(0), state.stride(0),
        V=V, BV=BV, BC=BC, FOLD_UNROLL=(fold == "unroll"), REC_ALL=(records == "all"), num_warps=nw, num_stages=1, **common,
    )
    if advance_h or may_prefold:
        replay_decode_v2_post_kernel[(B,)](
            mixed_qkv, a2, A_log, dt_bias, ring.k, ring.g, ring.h, hr, ring.h, slot_idx, f, ri,
            lb, L, mixed_qkv.stride(0), a2.stride(0),
            WRITE_H=bool(advance_h), WRITE_REC0=True, num_warps=1, num_stages=1, **common,
        )
    return out


def advance_h_(h: torch.Tensor, slot_idx: torch.Tensor, L: int, forced: torch.Tensor | None = None,
               h_rows: torch.Tensor | None = None, ring_idx: torch.Tensor | None = None) -> torch.Tensor:
    """h[slot] = ring.h_after_decode(h_old, L, forced) for every real row, in one launch (no host sync,
    CUDA-graph capturable); h_old is h_rows[row] when given, else h[slot]. Padded rows touch nothing.
    With ``ring_idx`` [B] h is indexed by ring row ``ring_idx[row]`` instead of the slot.
    For the model-wide h (docs/design.md): every layer's decode runs with h_rows and advance_h=False,
    and this advances the shared h once per forward."""
    B = slot_idx.shape[0]
    if B == 0:
        return h
    hr = h_rows if h_rows is not None else slot_idx
    f = forced if forced is not None else slot_idx
    replay_decode_v2_post_kernel[(B,)](
        h, h, h, h, h, h, h, hr, h, slot_idx, f, ring_idx if ring_idx is not None else slot_idx, 0.0, int(L), 0, 0,
        H=1, HV=1, HK=1, GK=1, K=1, CAP=1, BK=1, IS_KDA=False, HAS_FORCED=forced is not None,
        HAS_H_ROWS=h_rows is not None, USE_LOWER_BOUND=False, WRITE_H=True, WRITE_REC0=False,
        HAS_RING_IDX=ring_idx is not None,
        num_warps=1, num_stages=1,
    )
    return h

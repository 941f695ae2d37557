"""Buffered (ReplaySSM) decode kernels for GDN and KDA: one token per request per step.

One Triton kernel serves both layer kinds (``IS_KDA`` selects the per-K gate); the protocol is
ring.py's (docs/design.md, "The ring protocol"); the float64 reference is
``replayssm_sglang.reference``; docs/design.md ("Decode kernels and small-batch policy") has the
design notes and the measurements behind the choices.

Grid: (V / BV, B * HV). A program owns one V-tile of one value head of one row. Three branches,
decided per row on the device:
  * no records and a flush (L = 1, a forced flush at h = 0): SGLang's packed decode, op for op, on the
    full [BV, K] tile (so L = 1 is the conventional decode, bit for bit under the interpreter);
  * otherwise the output comes from the checkpoint read once (C q and C k from the same K-chunk
    loads, NK chunks) plus dot products against the h cached keys; a non-flush step appends its
    record, a flush step re-reads the checkpoint chunks (cache hits) and folds the records (rank-1
    updates, one record at a time) and this token into it;
  * a pre-step fold (h >= L: after a verify step, or a shorter window from the policy) folds the
    records into the checkpoint first and writes it.

Per row:
  prefold  = h >= L             (h + T > L with T = 1)
  h_eff    = 0 if prefold else h
  flush    = h_eff + 1 >= L or forced
  h_new    = 0 if flush else h_eff + 1
The kernel writes h itself, on the device: every program of a row reads h first; the row's
programs count their arrival on a per-slot counter (``arrive``, always 0 between launches) and the
last one to arrive writes ``h_new`` and resets the counter. Rows whose h does not change (L = 1,
or a forced flush at h = 0) skip the counter. A prefold that does not flush must append the new
record at position 0, which other programs of the row may still be reading: there the shared
parts of record 0 (keys, gates) are written by the last program to arrive, after a release.
Every exponent is <= 0 (exp(G_t - G_j), exp(G_t) with G cumulative log-decays), so nothing overflows
however long the window or strong the decay.

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


# ----------------------------------------------------------------------------------------------
# the decode kernel
# ----------------------------------------------------------------------------------------------



@triton.jit
def _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX: tl.constexpr):
    """Batch row i_n's state slot and ring row: the ring row is ``ring_idx[i_n]`` when the launch has one
    (rings keyed by request row, docs/integration.md "Memory"), else the slot itself. A row with either
    index < 0 is padding: both come back -1 (zero output, nothing touched)."""
    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if HAS_RING_IDX:
        row = tl.load(ring_idx + i_n).to(tl.int64)
        slot = tl.where(row < 0, -1, slot)
        row = tl.where(slot < 0, -1, row)
    else:
        row = slot
    return slot, row


@triton.jit
def _decode_rule(h_old, forced, i_n, L, HAS_FORCED: tl.constexpr):
    """ring.py's rule for a T = 1 decode step of row i_n, in Triton (the one copy every decode
    kernel uses): prefold = h >= L; h_eff = 0 if prefold else h; flush = h_eff + 1 >= L or forced;
    h_new = 0 if flush else h_eff + 1. (_decode_rule_rc without a read copy.)"""
    return _decode_rule_rc(h_old, forced, i_n, L, HAS_FORCED, forced, i_n, False)


@triton.jit
def _decode_rule_rc(h_old, forced, i_n, L, HAS_FORCED: tl.constexpr, rc_valid, rrow, HAS_RC: tl.constexpr):
    """_decode_rule, and for a ring with a read copy (HAS_RC) a row whose copy is stale (rc_valid[ring row] == 0:
    the checkpoint was written by something else, e.g. a prefill) flushes as if forced, reading the recurrence
    copy and rewriting both. Read here from the ring rather than folded into ``forced`` on the host, which took
    five small torch launches per layer-step (~8 us at B = 256, H200 2026-11-30). rc_valid and rrow are unused
    without HAS_RC."""
    if HAS_FORCED:
        is_forced = tl.load(forced + i_n) != 0
    else:
        is_forced = h_old < 0  # h >= 0: never
    if HAS_RC:
        is_forced = is_forced | (tl.load(rc_valid + rrow) == 0)
    prefold = h_old >= L
    h_eff = tl.where(prefold, 0, h_old)
    flush = ((h_eff + 1) >= L) | is_forced
    h_new = tl.where(flush, 0, h_eff + 1)
    return prefold, h_eff, flush, h_new


@triton.jit
def store_split(hi, lo, offs, x, mask):
    """fp32 values x as split records (ring.split_planes): hi[offs] their bf16, (b + 0x8000) >> 16 of their bits b,
    and lo[offs] (int16) the low 16 bits of b."""
    b = x.to(tl.float32).to(tl.int32, bitcast=True)
    tl.store(hi + offs, ((b + 0x8000) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True), mask=mask)
    tl.store(lo + offs, (b & 0xFFFF).to(tl.int16), mask=mask)


@triton.jit
def _store_record0_shared(p_x, a, dt_bias, A_log, i_n, stride_a, lower_bound, ring_k, ring_g, slot,
                          H: tl.constexpr, HK: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                          GK: tl.constexpr, CAP: tl.constexpr, BK: tl.constexpr, IS_KDA: tl.constexpr,
                          USE_LOWER_BOUND: tl.constexpr, PRED: tl.constexpr = False, ring_k_lo=None,
                          SPLIT: tl.constexpr = False):
    """Record 0's parts shared by a row's programs, for every head: the l2-normalised keys and
    G_0 = g_t. Written by one program once every program of the row is done reading the old
    record 0 (a pre-step fold that appends). PRED (KDA, predecayed keys): the key is stored as k e^{-G_0}.
    SPLIT (split records, ring.k_lo): the key into both planes (store_split)."""
    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    for hk in range(HK):
        kk = tl.load(p_x + H * K + hk * K + o_k, mask=mask_k, other=0).to(tl.float32)
        kk = kk / tl.sqrt(tl.sum(kk * kk) + 1e-6)
        if PRED:  # (KDA: key head hk is value head hk)
            kk = kk * tl.exp(-_load_gate(a, dt_bias, A_log, i_n, hk, stride_a, o_k, mask_k, lower_bound, K, True,
                                         USE_LOWER_BOUND))
        if SPLIT:
            store_split(ring_k, ring_k_lo, (slot * HK + hk) * CAP * K + o_k, kk, mask_k)
        else:
            tl.store(ring_k + (slot * HK + hk) * CAP * K + o_k, kk.to(ring_k.dtype.element_ty), mask=mask_k)
    for hv in range(HV):
        gg = _load_gate(a, dt_bias, A_log, i_n, hv, stride_a, o_k, mask_k, lower_bound, K,
                        IS_KDA, USE_LOWER_BOUND)
        if IS_KDA:
            tl.store(ring_g + (slot * HV + hv) * CAP * GK + o_k, gg, mask=mask_k)
        else:
            tl.store(ring_g + (slot * HV + hv) * CAP, gg)

@triton.jit
def replay_decode_kernel(
    mixed_qkv, a, b, A_log, dt_bias, out, state,
    ring_u, ring_k, ring_g, ring_h, arrive, slot_idx, forced, ring_idx,
    scale, lower_bound, L,
    stride_qkv, stride_a, stride_b, stride_slot,
    H: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, GK: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, CAP: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BC: tl.constexpr, NK: tl.constexpr, NPROG: tl.constexpr,
    IS_KDA: tl.constexpr, HAS_FORCED: tl.constexpr, USE_LOWER_BOUND: tl.constexpr,
    FOLD_DOT: tl.constexpr, DOT_PRECISION: tl.constexpr, UPDATE_H: tl.constexpr = True,
    HAS_RING_IDX: tl.constexpr = False,
):
    BKC: tl.constexpr = BK // NK
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
    o_c = tl.arange(0, BC)
    mask_v = o_v < V

    slot, rrow = _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX)  # state slot, ring row
    p_o = out + (i_n * HV + i_hv) * V + o_v
    if slot < 0:
        tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty), mask=mask_v)
        return

    h_old = tl.load(ring_h + rrow)
    p_x = mixed_qkv + i_n * stride_qkv
    p_s = state + slot * stride_slot + i_hv * V * K  # this head's checkpoint [V, K]
    b_v = tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_val = tl.load(b + i_n * stride_b + i_hv).to(tl.float32)
    if IS_KDA:
        beta = tl.sigmoid(b_val).to(tl.float32)
    else:
        beta = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)

    # the protocol (ring.py): prefold, flush, new h
    prefold, h_eff, flush, h_new = _decode_rule(h_old, forced, i_n, L, HAS_FORCED)
    update_h = (h_new != h_old) & UPDATE_H  # UPDATE_H=False: diagnostics only (h frozen, no atomics)
    # arrival count for the in-kernel h update; the increment depends on h_old, so it is performed
    # only after this program has read h (the last program to arrive then writes h_new)
    cnt = h_old * 0 - 1
    if update_h & (prefold == 0):
        cnt = tl.atomic_add(arrive + rrow, (h_old >= 0).to(tl.int32), sem="relaxed")

    base_u = ring_u + (rrow * HV + i_hv) * CAP * V
    base_k = ring_k + (rrow * HK + i_hk) * CAP * K
    base_g = ring_g + (rrow * HV + i_hv) * CAP * GK

    if prefold:
        # rare (after a verify step, or a shorter window): fold the h_old committed records into the
        # checkpoint and write it; the step then runs from it with h = 0
        if not IS_KDA:
            G_ref = tl.load(base_g + (h_old - 1))
        for c in tl.static_range(NK):
            o_k = c * BKC + tl.arange(0, BKC)
            mask_k = o_k < K
            m_kv = mask_v[:, None] & mask_k[None, :]
            C_c = tl.load(p_s + o_v[:, None] * K + o_k[None, :], mask=m_kv, other=0).to(tl.float32)
            if IS_KDA:
                G_ref_c = tl.load(base_g + (h_old - 1) * GK + o_k, mask=mask_k, other=0)
                S_c = C_c * tl.exp(G_ref_c)[None, :]
            else:
                S_c = C_c * tl.exp(G_ref)
            for j in range(h_old):  # rank-1 updates, one record at a time (small register footprint)
                u_j = tl.load(base_u + j * V + o_v, mask=mask_v, other=0).to(tl.float32)
                k_j = tl.load(base_k + j * K + o_k, mask=mask_k, other=0).to(tl.float32)
                if IS_KDA:
                    k_j = k_j * tl.exp(G_ref_c - tl.load(base_g + j * GK + o_k, mask=mask_k, other=0))
                else:
                    k_j = k_j * tl.exp(G_ref - tl.load(base_g + j))
                S_c += u_j[:, None] * k_j[None, :]
            tl.store(p_s + o_v[:, None] * K + o_k[None, :], S_c.to(state.dtype.element_ty), mask=m_kv)
        tl.debug_barrier()  # the folded checkpoint is re-read below by other threads of this program

    if flush & (h_eff == 0):
        # no records: exactly SGLang's packed decode, in its order (L = 1 is the conventional decode)
        o_k1 = tl.arange(0, BK)
        mask_k1 = o_k1 < K
        m_kv1 = mask_v[:, None] & mask_k1[None, :]
        b_q = tl.load(p_x + i_h * K + o_k1, mask=mask_k1, other=0).to(tl.float32)
        b_k = tl.load(p_x + H * K + i_h * K + o_k1, mask=mask_k1, other=0).to(tl.float32)
        b_q = b_q / tl.sqrt(tl.sum(b_q * b_q) + 1e-6)
        b_k = b_k / tl.sqrt(tl.sum(b_k * b_k) + 1e-6)
        b_q = b_q * scale
        b_h = tl.load(p_s + o_v[:, None] * K + o_k1[None, :], mask=m_kv1, other=0).to(tl.float32)
        g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k1, mask_k1, lower_bound, K, IS_KDA,
                         USE_LOWER_BOUND)
        if IS_KDA:
            b_h *= tl.exp(g_t)[None, :]
        else:
            b_h *= tl.exp(g_t)
        b_v -= tl.sum(b_h * b_k[None, :], 1)
        b_v *= beta
        b_h += b_v[:, None] * b_k[None, :]
        b_o = tl.sum(b_h * b_q[None, :], 1)
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mask_v)
        tl.store(p_s + o_v[:, None] * K + o_k1[None, :], b_h.to(state.dtype.element_ty), mask=m_kv1)
    else:
        # output from the checkpoint read once plus dot products against the h_eff cached keys,
        # K processed in NK chunks (small register tiles)
        valid = o_c < h_eff
        o_kf = tl.arange(0, BK)
        qf = tl.load(p_x + i_h * K + o_kf, mask=o_kf < K, other=0).to(tl.float32)
        kf = tl.load(p_x + H * K + i_h * K + o_kf, mask=o_kf < K, other=0).to(tl.float32)
        n_q = tl.sqrt(tl.sum(qf * qf) + 1e-6)
        n_k = tl.sqrt(tl.sum(kf * kf) + 1e-6)
        rec_u = tl.load(base_u + o_c[:, None] * V + o_v[None, :], mask=valid[:, None] & mask_v[None, :],
                        other=0).to(tl.float32)
        if not IS_KDA:
            g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_kf, o_kf < K, lower_bound, K, IS_KDA,
                             USE_LOWER_BOUND)
            rec_g = tl.load(base_g + o_c, mask=valid, other=0)
            G_t = tl.load(base_g + (h_eff - 1), mask=h_eff > 0, other=0) + g_t
            w = tl.where(valid, tl.exp(G_t - rec_g), 0.0)
        append = flush == 0
        # shared parts of the new record (keys per key head, G per value head): one writer each;
        # after a pre-step fold the last program to arrive writes them (see the end)
        write_k = append & (prefold == 0) & (i_v == 0)
        if not IS_KDA:
            write_k = write_k & (i_hv % (HV // H) == 0)
        Cq = tl.zeros([BV], dtype=tl.float32)
        Ck = tl.zeros([BV], dtype=tl.float32)
        wq = tl.zeros([BC], dtype=tl.float32)
        wk = tl.zeros([BC], dtype=tl.float32)
        kq = 0.0
        for c in tl.static_range(NK):
            o_k = c * BKC + tl.arange(0, BKC)
            mask_k = o_k < K
            m_ck = valid[:, None] & mask_k[None, :]
            q_c = tl.load(p_x + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32) / n_q * scale
            k_c = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32) / n_k
            C_c = tl.load(p_s + o_v[:, None] * K + o_k[None, :], mask=mask_v[:, None] & mask_k[None, :],
                          other=0).to(tl.float32)
            rk = tl.load(base_k + o_c[:, None] * K + o_k[None, :], mask=m_ck, other=0).to(tl.float32)
            if IS_KDA:
                g_c = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, IS_KDA,
                                 USE_LOWER_BOUND)
                Gt_c = tl.load(base_g + (h_eff - 1) * GK + o_k, mask=mask_k & (h_eff > 0), other=0) + g_c
                rg = tl.load(base_g + o_c[:, None] * GK + o_k[None, :], mask=m_ck, other=0)
                w_c = tl.where(valid[:, None], tl.exp(Gt_c[None, :] - rg), 0.0)
                e_c = tl.exp(Gt_c)
                Cq += tl.sum(C_c * (e_c * q_c)[None, :], 1)
                Ck += tl.sum(C_c * (e_c * k_c)[None, :], 1)
                wq += tl.sum(rk * w_c * q_c[None, :], 1)
                wk += tl.sum(rk * w_c * k_c[None, :], 1)
                if write_k:
                    tl.store(base_g + h_eff * GK + o_k, Gt_c, mask=mask_k)
            else:
                Cq += tl.sum(C_c * q_c[None, :], 1)
                Ck += tl.sum(C_c * k_c[None, :], 1)
                wq += tl.sum(rk * q_c[None, :], 1)
                wk += tl.sum(rk * k_c[None, :], 1)
            kq += tl.sum(k_c * q_c)
            if write_k:
                tl.store(base_k + h_eff * K + o_k, k_c.to(ring_k.dtype.element_ty), mask=mask_k)
        if not IS_KDA:
            eG = tl.exp(G_t)
            Cq = Cq * eG
            Ck = Ck * eG
            wq = wq * w
            wk = wk * w
        Sak = Ck + tl.sum(rec_u * wk[:, None], 0)
        u_t = beta * (b_v - Sak)
        b_o = Cq + tl.sum(rec_u * wq[:, None], 0) + u_t * kq
        tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mask_v)
        if flush:
            # fold the records and this token into the checkpoint, chunk by chunk (re-read from cache)
            for c in tl.static_range(NK):
                o_k = c * BKC + tl.arange(0, BKC)
                mask_k = o_k < K
                m_kv = mask_v[:, None] & mask_k[None, :]
                k_c = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32) / n_k
                C_c = tl.load(p_s + o_v[:, None] * K + o_k[None, :], mask=m_kv, other=0).to(tl.float32)
                if IS_KDA:
                    g_c = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, IS_KDA,
                                     USE_LOWER_BOUND)
                    Gt_c = tl.load(base_g + (h_eff - 1) * GK + o_k, mask=mask_k & (h_eff > 0), other=0) + g_c
                    S_c = C_c * tl.exp(Gt_c)[None, :]
                else:
                    S_c = C_c * eG
                if FOLD_DOT:
                    # all records at once on the tensor cores (opt-in, not yet measured; see docs)
                    m_ck = valid[:, None] & mask_k[None, :]
                    rk = tl.load(base_k + o_c[:, None] * K + o_k[None, :], mask=m_ck, other=0).to(tl.float32)
                    if IS_KDA:
                        rg = tl.load(base_g + o_c[:, None] * GK + o_k[None, :], mask=m_ck, other=0)
                        kw = rk * tl.where(valid[:, None], tl.exp(Gt_c[None, :] - rg), 0.0)
                    else:
                        kw = rk * w[:, None]
                    S_c += tl.dot(tl.trans(rec_u), kw, input_precision=DOT_PRECISION)
                else:
                    for j in range(h_eff):  # rank-1 updates, one record at a time
                        u_j = tl.load(base_u + j * V + o_v, mask=mask_v, other=0).to(tl.float32)
                        k_j = tl.load(base_k + j * K + o_k, mask=mask_k, other=0).to(tl.float32)
                        if IS_KDA:
                            k_j = k_j * tl.exp(Gt_c - tl.load(base_g + j * GK + o_k, mask=mask_k, other=0))
                        else:
                            k_j = k_j * tl.exp(G_t - tl.load(base_g + j))
                        S_c += u_j[:, None] * k_j[None, :]
                S_c += u_t[:, None] * k_c[None, :]
                tl.store(p_s + o_v[:, None] * K + o_k[None, :], S_c.to(state.dtype.element_ty), mask=m_kv)
        else:
            tl.store(base_u + h_eff * V + o_v, u_t.to(ring_u.dtype.element_ty), mask=mask_v)
            if not IS_KDA:
                if (prefold == 0) & (i_v == 0):
                    tl.store(base_g + h_eff, G_t)

    if update_h & prefold:
        # every load of the old records above happens before this release
        cnt = tl.atomic_add(arrive + rrow, 1, sem="acq_rel")
    if update_h:
        if cnt == NPROG - 1:
            tl.store(ring_h + rrow, h_new)
            tl.store(arrive + rrow, 0)
            if prefold & (flush == 0):
                _store_record0_shared(p_x, a, dt_bias, A_log, i_n, stride_a, lower_bound, ring_k, ring_g, rrow,
                                      H, HK, HV, K, GK, CAP, BK, IS_KDA, USE_LOWER_BOUND)


# ----------------------------------------------------------------------------------------------
# host wrapper
# ----------------------------------------------------------------------------------------------

# Launch configurations (BV, num_warps, K chunks) chosen from the H200 sweep in scripts/bench_kernels.py;
# keyed by (kind, state element size). Anything unlisted uses DEFAULT_CONFIG.
# Sweep at B = 256 (benchmarks/results/kernels-20261129-1924.json): (32, 1, 2) was best or within 2%
# for all four (kind, state dtype) pairs; (32, 2, 2) and (16, 1, 2) were slower except GDN fp32 (16, 1, 2).
DEFAULT_CONFIG = (32, 1, 2)
def check_ring_idx(ring_idx: torch.Tensor | None, slot_idx: torch.Tensor) -> None:
    """``ring_idx`` (None, or an int [B] tensor beside ``slot_idx`` on its device) as every launch takes it."""
    if ring_idx is None:
        return
    if (ring_idx.shape != slot_idx.shape or ring_idx.dtype not in (torch.int32, torch.int64)
            or ring_idx.device != slot_idx.device):
        raise ValueError(f"ring_idx must be an int32/int64 tensor shaped like slot_idx {tuple(slot_idx.shape)} on "
                         f"{slot_idx.device}, got {tuple(ring_idx.shape)} {ring_idx.dtype} on {ring_idx.device}")


def ring_rows(slot_idx: torch.Tensor, ring_idx: torch.Tensor | None) -> torch.Tensor:
    """Per batch row, the ring row its launch uses (-1 for a padded row): ``slot_idx`` itself without
    ``ring_idx``, else ``ring_idx`` where both indices are >= 0. Device ops only (graph-capturable)."""
    if ring_idx is None:
        return slot_idx
    pad = (slot_idx < 0) | (ring_idx < 0)
    return torch.where(pad, torch.full_like(ring_idx, -1), ring_idx)


_LAST: dict = {}  # the last launched compiled kernel (n_regs / n_spills for the benchmark's sweep)
CONFIGS: dict[tuple[str, int], tuple[int, int, int]] = {}


def _cuda_main_preferred(kind, state, ring, lower_bound, K, V, impl, v3_opts) -> bool:
    """The buffered launch of this call would run the CUDA main launch by the environment's preference
    (REPLAYSSM_MAIN_IMPL unset, "auto" or "cuda"; decode_v3.launch's rule: where cuda_main can run it, in its default
    shape), so the small-batch policy may use the CUDA kernel's thresholds (with a read copy too, since session 48:
    policy.decode_window keys those by the copy's type). A caller's own v3_opts keep the plain thresholds."""
    if impl not in ("auto", "v3") or v3_opts:
        return False
    from replayssm_sglang.kernels import cuda_main

    if not cuda_main.prefers_cuda():
        return False
    return cuda_main.usable(kind, state, ring, lower_bound, K, V, cuda_main.launch_default_config(state, ring, kind))


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
    L: int | str | None = None,
    scale: float | None = None,
    lower_bound: float | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
    k_chunks: int | None = None,
    fold: str | None = None,
    dot_precision: str = "tf32x3",
    _diag_freeze_h: bool = False,
    impl: str = "auto",
    h_rows: torch.Tensor | None = None,
    advance_h: bool = True,
    may_prefold: bool = True,
    records: str = "masked",
    v3_opts: dict | None = None,
    ring_idx: torch.Tensor | None = None,
) -> torch.Tensor:
    """One buffered decode step (T = 1) for every row of the batch, in place on ``state`` and ``ring``.

    kind: "gdn" (a [B, HV], dt_bias [HV]) or "kda" (a [B, HV*K], dt_bias [HV*K]).
    mixed_qkv [B, 2*H*K + HV*V]; b [B, HV]; A_log [HV]; state [slots, HV, V, K] (fp32 or bf16);
    slot_idx [B] int (-1 = padded row); forced [B] (nonzero = flush this step: radix-cache block).
    L: the window for this launch: None = the ring's L; "auto" = replayssm_sglang.policy.decode_window
    (the ring's L, or 1 where the buffered path measured slower); an int (1 .. ring capacity).
    fold: how a flush folds the records into the checkpoint: None (default: "loop" for v1 / v2, v3's tuned
    choice for v3, decode_v3.V3_TUNED), "loop" (rank-1 updates, one record at a time; measured) or "dot" (one tl.dot over all records with ``dot_precision``, "tf32x3" by default:
    fp32-accurate on the tensor cores; opt-in until measured on the GPU).
    impl: "auto" (default: replayssm_sglang.policy.decode_impl, v3 for a buffered window, w1 for window 1),
    "v1" (this module's kernel), "w1" (kernels/decode_w1.py: window 1 only, the conventional step with the
    ring's window-1 fold for rows that still hold records), "v3" (kernels/decode_v3.py:
    a pre launch per (row, key head) does the V-tile-independent work, the main launch only the checkpoint's;
    same h_rows / advance_h / may_prefold options as v2) or "v2"
    (kernels/decode_v2.py: h read, never written by the decode launch; a one-program-per-row post launch
    advances ring.h). v2 only: ``h_rows`` [B] int32, the committed count of each row's slot before this
    step, given by the caller (e.g. a model-wide h gathered once per forward), so the kernel does not
    load ring.h; ``advance_h=False`` leaves h alone (the caller advances it, e.g. once per forward with
    ``decode_v2.advance_h_``); ``may_prefold=False`` (only with advance_h=False) also skips the post
    launch, a promise by the caller that every row has h < L (no pre-step fold can happen).
    v2 ignores ``k_chunks`` and ``dot_precision``; its ``fold`` is "loop" (default) or "unroll" (the record
    loop unrolled over the ring capacity, masked by h); its ``records`` is "masked" (load the h committed
    records) or "all" (load every ring position without waiting for h, zero those past h with a select);
    ``block_v`` / ``num_warps`` pick its launch.
    v3_opts: extra keyword arguments of ``decode_v3.launch`` (``chunk_bytes``; benchmark diagnostics).
    ring_idx: [B] int32/int64, the ring row of each batch row (a ring keyed by request row: SGLang's
    ``req_pool_indices``); None (default): the ring row is the state slot (``slot_idx``). A row with
    ``slot_idx < 0`` or ``ring_idx < 0`` is padding. ``h_rows`` (v2/v3) is per batch row either way.
    Returns out [B, 1, HV, V] in mixed_qkv's dtype.
    """
    if impl not in ("auto", "v1", "v2", "v3", "w1"):
        raise ValueError(f"impl must be 'auto', 'v1', 'v2', 'v3' or 'w1', got {impl!r}")
    check_ring_idx(ring_idx, slot_idx)
    if impl in ("v1", "w1") and (h_rows is not None or not advance_h or not may_prefold or records != "masked"):
        raise ValueError(f"h_rows / advance_h / may_prefold need impl='v2' or 'v3' ({impl} advances h in the kernel)")
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
        L = lay.L
    elif L == "auto":
        L = policy.decode_window(kind, B, state.dtype, lay.L,
                                 cuda_main=_cuda_main_preferred(kind, state, ring, lower_bound, K, V, impl, v3_opts),
                                 read_dtype=ring.rc.dtype if ring.rc is not None else None)
    L = int(L)
    if not 1 <= L <= lay.cap:
        raise ValueError(f"window L={L} must be in [1, ring capacity {lay.cap}]")
    if impl == "auto":
        impl = policy.decode_impl(L)
        if impl == "w1" and (h_rows is not None or not advance_h):
            impl = "v3"  # the caller owns h: v3 at window 1 (w1 advances h in the kernel)
        if ring.split_records:
            impl = "v3"  # (split records: decode v3's CUDA launches only)
    if ring.split_records and impl != "v3":
        ring.require_whole_records(f"impl={impl!r}")
    if impl == "w1" and L != 1:
        raise ValueError(f"impl='w1' is the window-1 decode (L=1), called with L={L}")
    if v3_opts and impl != "v3":
        raise ValueError(f"v3_opts are options of impl='v3' (this launch runs {impl!r})")
    if ring.predecayed and impl not in ("v3", "w1"):
        raise ValueError(f"a ring with predecayed KDA keys (kda_keys='predecayed') runs impl 'auto', 'v3' or 'w1', "
                         f"not {impl!r}")
    if impl != "v3" and fold is None:
        fold = "loop"
    if impl == "v3" and (records != "masked" or fold not in ("loop", "chunked", "dot", "dot3", None)):
        raise ValueError("impl='v3' folds with fold='loop', 'chunked', 'dot' or 'dot3' (decode_v3.V3_FOLDS) and "
                         "loads the committed records only")
    a2 = a.reshape(B, HV * GK)
    b2 = b.reshape(B, HV)
    if out is None:
        out = torch.empty(B, 1, HV, V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    if not out.is_contiguous() or out.numel() != B * HV * V:
        raise ValueError("out must be contiguous with B*HV*V elements")
    if impl == "v3":
        from replayssm_sglang.kernels import decode_v3

        return decode_v3.launch(kind, mixed_qkv, a2, b2, A_log, dt_bias, state, ring, slot_idx, out, forced, L,
                                K ** -0.5 if scale is None else scale, lower_bound, block_v=block_v,
                                num_warps=num_warps, h_rows=h_rows, advance_h=advance_h, may_prefold=may_prefold,
                                fold=fold, ring_idx=ring_idx, **(v3_opts or {}))
    if impl == "w1":
        from replayssm_sglang.kernels import decode_w1

        return decode_w1.launch(kind, mixed_qkv, a2, b2, A_log, dt_bias, state, ring, slot_idx, out,
                                K ** -0.5 if scale is None else scale, lower_bound, block_v=block_v,
                                num_warps=num_warps, ring_idx=ring_idx)
    if impl == "v2" and ring.rc is not None:
        raise ValueError("a ring with a read copy (read_dtype bf16/fp8_e4m3) runs impl 'auto', 'v3' or 'v1'")
    if impl == "v2":
        from replayssm_sglang.kernels import decode_v2

        return decode_v2.launch(kind, mixed_qkv, a2, b2, A_log, dt_bias, state, ring, slot_idx, out, forced, L,
                                K ** -0.5 if scale is None else scale, lower_bound, block_v=block_v,
                                num_warps=num_warps, h_rows=h_rows, advance_h=advance_h, may_prefold=may_prefold,
                                fold="loop" if fold in ("loop", None) else fold, records=records, ring_idx=ring_idx)
    if ring.arrive is None:
        raise ValueError("ring has no arrival counter (allocate it with RingLayout.allocate)")
    BK = triton.next_power_of_2(K)
    cfg = CONFIGS.get((kind, state.element_size()), DEFAULT_CONFIG)
    BV = block_v or min(cfg[0], triton.next_power_of_2(V))
    BV = max(BV, 16)
    nw = num_warps or cfg[1]
    NK = k_chunks or cfg[2]
    NK = max(1, min(NK, BK // 16))
    BC = max(16, triton.next_power_of_2(lay.cap))
    NV = triton.cdiv(V, BV)
    grid = (NV, B * HV)
    _LAST["kernel"] = replay_decode_kernel[grid](
        mixed_qkv, a2, b2, A_log, dt_bias, out, state,
        ring.u, ring.k, ring.g, ring.h, ring.arrive, slot_idx,
        forced if forced is not None else slot_idx, ring_idx if ring_idx is not None else slot_idx,
        float(K ** -0.5 if scale is None else scale),
        float(lower_bound if lower_bound is not None else 0.0),
        L,
        mixed_qkv.stride(0), a2.stride(0), b2.stride(0), state.stride(0),
        H=H, HV=HV, HK=lay.HK, GK=GK, K=K, V=V, CAP=lay.cap, BK=BK, BV=BV, BC=BC, NK=NK, NPROG=NV * HV,
        IS_KDA=(kind == "kda"), HAS_FORCED=forced is not None,
        USE_LOWER_BOUND=lower_bound is not None, FOLD_DOT=(fold == "dot"), DOT_PRECISION=dot_precision,
        UPDATE_H=not _diag_freeze_h, HAS_RING_IDX=ring_idx is not None,
        num_warps=nw, num_stages=1,
    )
    if ring.rc is not None:
        # v1 writes the recurrence copy only (every step at window 1): the read copies of its rows are stale
        from replayssm_sglang.kernels.decode_v3 import set_rc_valid_

        set_rc_valid_(ring, ring_rows(slot_idx, ring_idx), 0)
    return out

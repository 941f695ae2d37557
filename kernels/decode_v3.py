"""Buffered (ReplaySSM) decode, version 3: the per-V-tile programs do only the checkpoint's work.

Selected with ``replay_decode(..., impl="v3")`` (kernels/decode.py); the protocol is ring.py's, the float64
reference ``replayssm_sglang.reference``; docs/design.md ("Decode kernel v3") has the measurements behind it.

Why: v1 and v2 stream 2.1-2.3 TB/s where the conventional kernel streams 3.9 because they are bound by
instruction issue, not by memory: ptxas for sm_90 counts 5.5-5.9k SASS instructions per 16 KiB of fp32
checkpoint for them against 1.7k for SGLang's conventional decode (which reads AND writes those 16 KiB) and
1.3k for upstream's buffered kernel. Most of ours went to work that does not depend on the V-tile: the l2
norms of q and k, the dots of the h cached keys with q and k, the history decays, KDA's per-K exponentials,
done again by each of the V / BV programs of a value head and, for GDN, by both value heads of a key head.

v3 splits the step into three launches:
  pre   grid (B, HK), one program per (row, key head): normalises q and k, computes <k, q>, the record
        coefficients c_j = <k_j e^{G_t - G_j}, q> and d_j = <k_j e^{G_t - G_j}, k> for every value head of
        the group (zero past h) and GDN's e^{G_t}, into a small scratch (about 1 MB at B = 256); it also
        appends this token's shared record parts (the key per key head, G_t per value head) unless the row
        flushes or pre-folds;
  main  grid (V / BV, B, HV): the [BV, K] checkpoint tile read once, C q~ and C k~ (two multiply-reduce
        passes; q~, k~ made from the inputs here: the normalised q and k, KDA's times e^{G_t} per K), then,
        with the pre launch's coefficients, the h correction vectors u_j of this V-tile, and
            o   = e C q + sum_j u_j c_j + u_t <k, q>,   u_t = beta (v - e C k - sum_j u_j d_j);
        a row that writes its checkpoint (flush or pre-fold, 1/L of them) folds its records into the tile
        exactly as v2 does (rank-1 updates, recomputed from the ring, not from the scratch); a row that
        appends writes u_t of its V-tile;
  post  v2's post launch: h advanced by ring.py's rule, and record 0's shared parts for a row that
        pre-folded and appends (other programs may still read the old record 0 during main).
With ``pdl=True`` the main and post launches are programmatic dependents (CUDA PDL, sm_90+): the pre launch lets
the main launch start at once, whose tile read needs nothing from it; the main launch waits
(griddepcontrol.wait) just before it loads the coefficients.
The maths is v2's term by term (same sums, same order of the exponent differences, all <= 0); only where
each term is computed changes. Padded rows (slot < 0) write zeros and touch nothing else.

Measured on the H200 (benchmarks/results/kernels-20261129-2331.*, B = 256, fp32 state, the V3_TUNED defaults:
tile read software-pipelined, tf32x3 dot fold): GDN 1.50-1.59x conventional, KDA 1.08-1.27x (bf16 / fp32
records); bf16 states stayed below conventional when last measured (docs/design.md, "Decode kernel v3").

Options (``launch``; unset ones come from V3_TUNED): ``fold`` "loop" / "chunked" / "dot" / "dot3" (V3_FOLDS),
``pipe_stages`` (the software-pipelined tile read), ``chunk_bytes`` / ``fold_bytes`` (K-chunk widths), ``row_order``
(the main launch's dispatch order; "flush_first": the rows that fold this step first, _row_order_kernel).
KDA rings with predecayed key records (``Ring.kda_keys``, docs/design.md "Pre-decayed KDA keys"; PRED in the kernels):
records hold k_j e^{-G_j}, the pre launch reads no gate records, folds decay all records by one e^{G_f}; a head whose
G would pass ring.PREDECAYED_MIN_G is rebased alone (main folds it through the token, post zeroes its key records).
A ring with a read copy (``Ring.rc``, issue 7, ``--linear-replayssm-read-dtype``): rows that do not write their
checkpoint read the bf16 / fp8 copy instead of the checkpoint; a flush writes both copies from the same fold
(in K chunks; fp8 not with the dot folds); a row
whose copy is stale (``Ring.rc_valid == 0``) takes a forced flush; every real row's copy is current after a
launch.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from replayssm_sglang.kernels import cuda_main
from replayssm_sglang.kernels.decode import _decode_rule_rc, _load_gate, _slot_row, ring_rows
from replayssm_sglang.kernels.decode_v2 import _fold_records, replay_decode_v2_post_kernel
from replayssm_sglang.ring import PREDECAYED_MIN_G


@triton.jit
def _pre_row(i_n, i_hk, mixed_qkv, a, A_log, dt_bias, ring_k, ring_g, ring_h, h_rows, slot_idx, forced, ring_idx,
             coef, scal, scale, lower_bound, L, stride_qkv, stride_a,
             H: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, GK: tl.constexpr, K: tl.constexpr,
             CAP: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr, IS_KDA: tl.constexpr, HAS_FORCED: tl.constexpr,
             HAS_H_ROWS: tl.constexpr, USE_LOWER_BOUND: tl.constexpr, HAS_RING_IDX: tl.constexpr, rc_valid,
             HAS_RC: tl.constexpr, ovf, min_g, PRED: tl.constexpr, gt_out=None, STORE_GT: tl.constexpr = False):
    """The pre launch's work for row i_n and key head i_hk (see replay_decode_v3_pre_kernel).
    STORE_GT (KDA, predecayed; the CUDA main launch's gt_pre shapes): G_t per column also goes to gt_out [B, HV, K]
    (as computed here, before a rebase zeroes the stored G).
    PRED (KDA, ring.kda_keys "predecayed"): the records hold k_j e^{-G_j}, so the coefficients need e^{G_t} only. A
    head whose G_t falls below min_g in any channel is rebased (ovf[ring row, head] = 1; its record is appended as
    zeros with G = 0: the main launch folds the head through this token) or, on a row that pre-folds, flushes the
    row (ovf[ring row, HV] = 1)."""
    if IS_KDA:
        i_h = i_hk // (HV // H)  # HK = HV: key head = value head; q/k come from its query head
    else:
        i_h = i_hk
    slot, rrow = _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX)  # the pre launch touches the ring only
    if slot >= 0:
        if HAS_H_ROWS:
            h_old = tl.load(h_rows + i_n).to(tl.int32)
        else:
            h_old = tl.load(ring_h + rrow).to(tl.int32)
        prefold, h_eff, flush, _ = _decode_rule_rc(h_old, forced, i_n, L, HAS_FORCED, rc_valid, rrow, HAS_RC)
        append = (flush == 0) & (prefold == 0)  # a pre-fold's record 0 is written by the post launch

        o_k = tl.arange(0, BK)
        o_c = tl.arange(0, BC)
        mask_k = o_k < K
        valid = o_c < h_old
        last = o_c == (h_old - 1)
        p_x = mixed_qkv + i_n * stride_qkv
        q = tl.load(p_x + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
        k = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
        q = q / tl.sqrt(tl.sum(q * q) + 1e-6)
        q = q * scale
        k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
        kq = tl.sum(k * q)
        m_ck = valid[:, None] & mask_k[None, :]
        rk = tl.load(ring_k + ((rrow * HK + i_hk) * CAP + o_c[:, None]) * K + o_k[None, :], mask=m_ck,
                     other=0).to(tl.float32)  # [BC, BK]
        if IS_KDA:
            i_hv = i_hk
            g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, True,
                             USE_LOWER_BOUND)
            base_g = ring_g + (rrow * HV + i_hv) * CAP * GK
            p_c = coef + (i_n * HV + i_hv) * 2 * BC + o_c
            if PRED:
                # records k_j e^{-G_j}: <k_j e^{G_t - G_j}, x> = <k_j e^{-G_j}, x e^{G_t}>; only G_{h-1} is read
                G_last = tl.load(base_g + (h_old - 1) * GK + o_k, mask=mask_k & (h_old > 0), other=0)
                G_t = G_last + g_t
                if STORE_GT:
                    tl.store(gt_out + (i_n * HV + i_hv) * K + o_k, G_t, mask=mask_k)
                # e^{G_t} in two halves, each applied in turn: k_j e^{-G_j} e^{G_t/2} stays in fp32's range, and a
                # weight e^{G_t - G_j} survives where e^{G_t} alone would underflow (G_t < -87 on a flushing row)
                e_h = tl.exp(0.5 * G_t)
                tl.store(p_c, tl.sum(rk * (q * e_h)[None, :] * e_h[None, :], 1))
                tl.store(p_c + BC, tl.sum(rk * (k * e_h)[None, :] * e_h[None, :], 1))
                rb = tl.min(tl.where(mask_k, G_t, 0.0), 0) < min_g
                if rb & (prefold != 0):
                    tl.store(ovf + rrow * (HV + 1) + HV, 1)  # the row flushes (any head may write the same 1)
                if rb & append:
                    tl.store(ovf + rrow * (HV + 1) + i_hv, 1)  # this head is rebased
                k_rec = tl.where(rb, 0.0, k * tl.exp(-tl.maximum(G_t, min_g)))
                G_t = tl.where(rb, 0.0, G_t)  # (as stored: a rebased head's G restarts at its new checkpoint)
            else:
                rg = tl.load(base_g + o_c[:, None] * GK + o_k[None, :], mask=m_ck, other=0)  # [BC, BK]
                G_last = tl.sum(tl.where(last[:, None], rg, 0.0), 0)  # [BK], 0 without records
                G_t = G_last + g_t
                kw = rk * tl.where(valid[:, None], tl.exp(G_t[None, :] - rg), 0.0)
                tl.store(p_c, tl.sum(kw * q[None, :], 1))
                tl.store(p_c + BC, tl.sum(kw * k[None, :], 1))
                k_rec = k
            tl.store(scal + (i_n * HV + i_hv) * 2 + 1, kq)
            if append:
                tl.store(ring_k + ((rrow * HK + i_hk) * CAP + h_eff) * K + o_k, k_rec.to(ring_k.dtype.element_ty),
                         mask=mask_k)
                tl.store(base_g + h_eff * GK + o_k, G_t, mask=mask_k)
        else:
            dq = tl.sum(rk * q[None, :], 1)  # [BC], shared by the value heads of this key head
            dk = tl.sum(rk * k[None, :], 1)
            for r in tl.static_range(HV // H):
                i_hv = i_hk * (HV // H) + r
                g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, False,
                                 USE_LOWER_BOUND)
                base_g = ring_g + (rrow * HV + i_hv) * CAP
                rg = tl.load(base_g + o_c, mask=valid, other=0)
                G_last = tl.sum(tl.where(last, rg, 0.0), 0)
                G_t = G_last + g_t
                w = tl.where(valid, tl.exp(G_t - rg), 0.0)
                p_c = coef + (i_n * HV + i_hv) * 2 * BC + o_c
                tl.store(p_c, dq * w)
                tl.store(p_c + BC, dk * w)
                tl.store(scal + (i_n * HV + i_hv) * 2, tl.exp(G_t))
                tl.store(scal + (i_n * HV + i_hv) * 2 + 1, kq)
                if append:
                    tl.store(base_g + h_eff, G_t)
            if append:
                tl.store(ring_k + ((rrow * HK + i_hk) * CAP + h_eff) * K + o_k, k.to(ring_k.dtype.element_ty),
                         mask=mask_k)


@triton.jit
def _row_and_head(AXIS: tl.constexpr, ROWS_OUTER: tl.constexpr):
    """(row, head) program ids of a grid whose axes AXIS and AXIS + 1 are (rows, heads), or (heads, rows) with
    ROWS_OUTER (the rows outermost: a row's heads dispatched together). Shared by the decode and verify launches'
    row orders."""
    if ROWS_OUTER:
        row = tl.program_id(AXIS + 1)
        head = tl.program_id(AXIS)
    else:
        row = tl.program_id(AXIS)
        head = tl.program_id(AXIS + 1)
    return row, head


def dispatch_grid(rows, heads, rows_outer: bool, *lead) -> tuple:
    """The launch grid for _row_and_head: (*lead, rows, heads), or (*lead, heads, rows) with the rows outermost."""
    return (*lead, heads, rows) if rows_outer else (*lead, rows, heads)


def dispatch_order(name: str, value: str, orders: dict) -> int:
    """A launch's dispatch-order option checked against its table (name -> ROW_ORDER constexpr)."""
    if value not in orders:
        raise ValueError(f"{name} must be one of {list(orders)}, got {value!r}")
    return orders[value]


@triton.jit
def replay_decode_v3_pre_kernel(
    mixed_qkv, a, A_log, dt_bias, ring_k, ring_g, ring_h, h_rows, slot_idx, forced, ring_idx,
    coef, scal,
    scale, lower_bound, L, stride_qkv, stride_a, B,
    H: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, GK: tl.constexpr, K: tl.constexpr,
    CAP: tl.constexpr, BK: tl.constexpr, BC: tl.constexpr,
    IS_KDA: tl.constexpr, HAS_FORCED: tl.constexpr, HAS_H_ROWS: tl.constexpr, USE_LOWER_BOUND: tl.constexpr,
    USE_PDL: tl.constexpr = False, ROWS: tl.constexpr = 1, HAS_RING_IDX: tl.constexpr = False,
    rc_valid=None, HAS_RC: tl.constexpr = False, ovf=None, min_g=0.0, PRED: tl.constexpr = False,
    ROW_ORDER: tl.constexpr = 0, gt_out=None, STORE_GT: tl.constexpr = False, LEAD_WAIT: tl.constexpr = False,
):
    """Grid (cdiv(B, ROWS), HK): one program per ROWS rows and one key head. ROWS > 1 makes the grid smaller, so
    that with PDL all of it can be resident at once and the main launch (which starts only once every program of
    this one has started) overlaps all of it, not only its last wave. ROW_ORDER 1 (opt-in ``pre_order`` "rows"):
    grid (HK, cdiv(B, ROWS)), the rows outermost, so a row's key heads (its records, adjacent in the ring) are
    dispatched together."""
    if LEAD_WAIT:
        # LEAD_PDL: a programmatic dependent of the stream's previous kernel, complete from here; waited for before
        # the main launch may start, whose loads ahead of its own wait read what that kernel wrote (h, the records)
        gdc_wait()
    if USE_PDL:
        # the main launch may start now: its checkpoint read needs nothing from this launch (it waits for
        # the coefficients with gdc_wait before it uses them)
        gdc_launch_dependents()
    i_r0, i_hk = _row_and_head(0, ROW_ORDER == 1)
    for r in range(ROWS):
        i_n = i_r0 * ROWS + r
        if i_n < B:
            _pre_row(i_n, i_hk, mixed_qkv, a, A_log, dt_bias, ring_k, ring_g, ring_h, h_rows, slot_idx, forced,
                     ring_idx, coef, scal, scale, lower_bound, L, stride_qkv, stride_a, H, HV, HK, GK, K, CAP, BK, BC,
                     IS_KDA, HAS_FORCED, HAS_H_ROWS, USE_LOWER_BOUND, HAS_RING_IDX, rc_valid, HAS_RC, ovf, min_g,
                     PRED, gt_out, STORE_GT)


@triton.jit
def _round_bf16(x):
    """x rounded to the nearest bf16 (ties to even), still as fp32, so the cast that follows is exact. Written
    out because Triton's interpreter truncates on fp32 -> bf16 casts whatever the rounding mode asked for (the
    GPU rounds to nearest): the read copy must be the same rounding on both. NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + (0x7FFF + ((bits >> 16) & 1))) & 0xFFFF0000
    return tl.where(x != x, x, bits.to(tl.float32, bitcast=True))


@triton.jit
def _round_e4m3(x):
    """x (already scaled into [-448, 448]) rounded to the nearest fp8 e4m3 value (ties to even), as fp32, so
    the cast that follows is exact: normals keep 3 of fp32's 23 mantissa bits; below 2^-6 (e4m3's
    subnormals, quantum 2^-9) the magic-number add rounds. Written out because Triton's interpreter
    rounds wrongly when the rounding carries into the exponent (31.2 -> 16, not 32); the GPU cast is right.
    NaN stays NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    nrm = ((bits + (0x7FFFF + ((bits >> 20) & 1))) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = (x + 24576.0) - 24576.0  # fp32 ulp at 24576 is 2^-9
    return tl.where(x != x, x, tl.where(tl.abs(x) < 0.015625, sub, nrm))


@triton.jit
def _rc_scale(amax):
    """fp8 read copy: one scale per row, amax / 448 (e4m3's largest finite value), 1 for a zero row."""
    return tl.where(amax == 0, 1.0, amax / 448.0)


@triton.jit
def _store_read_copy(p_r, S, sc, m, RC_FP8: tl.constexpr):
    """round(S) into the read copy at p_r: bf16 to nearest even, or fp8 e4m3 codes of S / sc (sc [rows], one
    scale per row; unused for bf16), saturating at +-448, NaN kept."""
    if RC_FP8:
        y = tl.clamp(S / sc[:, None], -448.0, 448.0, propagate_nan=tl.PropagateNan.ALL)
        tl.store(p_r, _round_e4m3(y).to(p_r.dtype.element_ty), mask=m)
    else:
        tl.store(p_r, _round_bf16(S).to(p_r.dtype.element_ty), mask=m)


@triton.jit
def _qk_tilde(p_x, offs, m, p_gl, has, a, dt_bias, A_log, i_n, i_hv, stride_a, lower_bound,
              H: tl.constexpr, K: tl.constexpr, IS_KDA: tl.constexpr, USE_LOWER_BOUND: tl.constexpr):
    """This row's raw q and k of its key head at K positions offs (p_x at its q; k is H * K later), fp32, not
    normalised; KDA's both times e^{G_t}, G_t = G of the last record (p_gl; 0 without records) + this step's
    gate."""
    q = tl.load(p_x + offs, mask=m, other=0).to(tl.float32)
    k = tl.load(p_x + H * K + offs, mask=m, other=0).to(tl.float32)
    if IS_KDA:
        e = tl.exp(tl.load(p_gl + offs, mask=m & has, other=0) + _load_gate(
            a, dt_bias, A_log, i_n, i_hv, stride_a, offs, m, lower_bound, K, True, USE_LOWER_BOUND))
        q = q * e
        k = k * e
    return q, k


@triton.jit
def _qk_tilde_chunks(p_x, p_gl, has, a, dt_bias, A_log, i_n, i_hv, stride_a, lower_bound, H: tl.constexpr,
                     K: tl.constexpr, BKT: tl.constexpr, NC: tl.constexpr, IS_KDA: tl.constexpr,
                     USE_LOWER_BOUND: tl.constexpr):
    """_qk_tilde over all of K as [NC, BKT] tensors (chunk c in row c: K positions c * BKT + j), made before a
    pipelined chunk loop, which picks chunk c out in registers (_chunk_of); and the row index o_ch [NC]."""
    o_ch = tl.arange(0, NC)
    offs = o_ch[:, None] * BKT + tl.arange(0, BKT)[None, :]
    Q2, K2 = _qk_tilde(p_x, offs, offs < K, p_gl, has, a, dt_bias, A_log, i_n, i_hv, stride_a, lower_bound,
                       H, K, IS_KDA, USE_LOWER_BOUND)
    return o_ch, Q2, K2


@triton.jit
def _chunk_of(X2, o_ch, c):
    """Row c of X2 [NC, BKT] as a [BKT] vector (in registers: a loop index cannot index a register tensor)."""
    return tl.sum(tl.where(o_ch[:, None] == c, X2, 0.0), 0)


@triton.jit
def _mma_tile_chunk(c, p_tile, o_v, mask_v, K: tl.constexpr, BKT: tl.constexpr, MMA_F32: tl.constexpr):
    """K chunk c [BV, BKT] of the tile at p_tile as a tensor-core operand: bf16 as stored, fp8 e4m3 codes made bf16
    (exact: e4m3's values are all bf16 values); masked lanes 0. MMA_F32 (Triton's interpreter): the same values as
    fp32."""
    o_kc = c * BKT + tl.arange(0, BKT)
    m_c = mask_v[:, None] & (o_kc < K)[None, :]
    if p_tile.dtype.element_ty == tl.bfloat16:
        C_c = tl.load(p_tile + o_v[:, None] * K + o_kc[None, :], mask=m_c, other=0.0)
        if MMA_F32:
            C_c = C_c.to(tl.float32)
    else:
        # fp8: no `other=` (the interpreter cannot make an fp8 fill value); masked lanes zeroed after the cast
        C_c = tl.load(p_tile + o_v[:, None] * K + o_kc[None, :], mask=m_c)
        if MMA_F32:
            C_c = tl.where(m_c, C_c.to(tl.float32), 0.0)
        else:
            C_c = tl.where(m_c, C_c.to(tl.bfloat16), tl.zeros(C_c.shape, dtype=tl.bfloat16))
    return C_c


@triton.jit
def _mma_acc(C_c, B_c, acc, MMA_F32: tl.constexpr):
    """acc + C_c B_c, fp32 accumulation: bf16 tensor cores, or (MMA_F32, the interpreter) an fp32 product of the
    same, exactly bf16, values."""
    if MMA_F32:
        acc = tl.dot(C_c, B_c.to(tl.float32), acc, input_precision="ieee")
    else:
        acc = tl.dot(C_c, B_c.to(tl.bfloat16), acc)
    return acc


@triton.jit
def _mma_chunk(c, acc, p_tile, o_v, mask_v, p_x, H: tl.constexpr, K: tl.constexpr, BKT: tl.constexpr,
               MMA_F32: tl.constexpr):
    """GDN: acc [BV, 16] + C chunk c [BV, BKT] times [q, k, 0, ...] of the chunk ([BKT, 16], bf16 from the input:
    column 0 q, column 1 k, which is H * K further on): _tile_dots' tensor-core form. (An fp8 tile's per-V-row scale
    is applied by the caller.)"""
    o_kc = c * BKT + tl.arange(0, BKT)
    o_n = tl.arange(0, 16)
    B_c = tl.load(p_x + o_kc[:, None] + tl.where(o_n == 1, H * K, 0)[None, :],
                  mask=(o_kc < K)[:, None] & (o_n < 2)[None, :], other=0.0)
    return _mma_acc(_mma_tile_chunk(c, p_tile, o_v, mask_v, K, BKT, MMA_F32), B_c, acc, MMA_F32)


@triton.jit
def _bf16_parts(x):
    """x (fp32) as three bf16 values whose sum is x to fp32's precision: hi = bf16(x), mid = bf16(x - hi),
    lo = bf16(x - hi - mid) (each difference exact in fp32; 3 x 8 significant bits cover fp32's 24), as fp32."""
    hi = x.to(tl.bfloat16).to(tl.float32)
    r = x - hi
    mid = r.to(tl.bfloat16).to(tl.float32)
    lo = (r - mid).to(tl.bfloat16).to(tl.float32)
    return hi, mid, lo


@triton.jit
def _mma_chunk_split(c, acc, p_tile, o_v, mask_v, q_c, k_c, K: tl.constexpr, BKT: tl.constexpr,
                     MMA_F32: tl.constexpr):
    """KDA: acc [BV, 16] + C chunk c [BV, BKT] times [q_hi, q_mid, q_lo, k_hi, k_mid, k_lo, 0, ...] ([BKT, 16]), where
    q_c, k_c (fp32 [BKT]: q~, k~ of the chunk, which carry e^{G_t} per channel and are not bf16 values) are split into
    three bf16 parts each (_bf16_parts: the sum is x to fp32 precision). Columns 0-2 give C q~, 3-5 C k~: the products
    of the CUDA-core form to fp32 rounding, at the cost of one tensor-core product (N = 16 whatever the columns used).
    (Session 20's two parts, x to 16 significant bits, left an output error of ~3e-5 of the rms where the fp32 checks
    allow 2e-5: below the bf16 copy's own rounding, but not fp32-grade.)"""
    o_n = tl.arange(0, 16)[None, :]
    q_hi, q_mid, q_lo = _bf16_parts(q_c)
    k_hi, k_mid, k_lo = _bf16_parts(k_c)
    # every value below is a bf16 value, so the operand's cast to bf16 (in _mma_acc) is exact
    B_c = tl.where(o_n == 0, q_hi[:, None], tl.where(o_n == 1, q_mid[:, None], tl.where(
        o_n == 2, q_lo[:, None], tl.where(o_n == 3, k_hi[:, None], tl.where(
            o_n == 4, k_mid[:, None], tl.where(o_n == 5, k_lo[:, None], 0.0))))))
    return _mma_acc(_mma_tile_chunk(c, p_tile, o_v, mask_v, K, BKT, MMA_F32), B_c, acc, MMA_F32)


@triton.jit
def _split_sums(acc):
    """(C q~, C k~) [BV] from the [BV, 16] product of _mma_chunk_split's operand: columns 0-2 and 3-5 summed."""
    o_n = tl.arange(0, 16)[None, :]
    dq = tl.sum(tl.where(o_n < 3, acc, 0.0), 1)
    dk = tl.sum(tl.where((o_n >= 3) & (o_n < 6), acc, 0.0), 1)
    return dq, dk


@triton.jit
def _qk_in_scaled(p_x, scale, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr):
    """This row's raw q and k of one key head (p_x at its q; [BK], fp32) and the factors that make q~ = s_q q and
    k~ = s_k k (s_q = scale / |q|, s_k = 1 / |k|), as the tile-dot functions scale their reduced dots."""
    o_k = tl.arange(0, BK)
    q_in = tl.load(p_x + o_k, mask=o_k < K, other=0).to(tl.float32)
    k_in = tl.load(p_x + H * K + o_k, mask=o_k < K, other=0).to(tl.float32)
    s_q = scale / tl.sqrt(tl.sum(q_in * q_in) + 1e-6)
    s_k = 1.0 / tl.sqrt(tl.sum(k_in * k_in) + 1e-6)
    return q_in, k_in, s_q, s_k


@triton.jit
def _tile_dots(p_tile, o_v, mask_v, p_x, p_gl, has, a, dt_bias, A_log, i_n, i_hv, stride_a, scale, lower_bound,
               H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BKT: tl.constexpr, PIPE: tl.constexpr,
               IS_KDA: tl.constexpr, USE_LOWER_BOUND: tl.constexpr, MMA: tl.constexpr = False,
               MMA_F32: tl.constexpr = False):
    """(tile q~, tile k~) [BV] over the K chunks of a [BV, K] tile at p_tile (row stride K): q~ = scale q / |q|,
    k~ = k / |k| of this row's key head (p_x at its q), KDA's both times e^{G_t} per K (_qk_tilde). Everything
    here comes from this step's inputs and the ring as the previous step left it, so it may run before the pre
    launch has finished (PDL). The l2 norms scale the reduced dots at the end.
    PIPE > 0: the chunks in a loop that Triton software-pipelines over PIPE stages (asynchronous copies into
    shared memory: the chunks in flight hold no registers), each chunk reduced over K as it lands; q and k are
    made before the loop as [chunks, BKT] tensors and each chunk picked out in registers, because loads of
    them inside the loop are not asynchronous copies (2-byte elements) and stall every iteration (H200,
    2026-11-30 01:21: GDN 172 -> 204 us). PIPE = 0: the chunks unrolled into registers (q, k loaded per chunk),
    the products accumulated element-wise and reduced once at the end.
    MMA (opt-in ``tile_mma``; GDN with a bf16 or fp8 tile and bf16 inputs, else ignored): the raw q and k are exactly
    bf16 there and so is the tile (fp8 codes are bf16 values), so each chunk's C q and C k are one tensor-core product,
    C chunk [BV, BKT] times a [BKT, 16] operand whose columns 0 and 1 are q and k of the chunk straight from the
    input (the other 14 zero: tl.dot needs N >= 16), accumulated in fp32: the products of the CUDA-core form, without
    its per-element conversions to fp32 (scripts/tile_dots_study.py). MMA_F32: the same product in fp32 (the values are
    exact either way), for Triton's interpreter, whose bf16 tl.dot is unusable. KDA (session 20): q~ and k~ carry
    e^{G_t} per channel and are not bf16 values, so each is split into three bf16 parts, six operand columns
    (_mma_chunk_split; fp32's 24 significant bits since session 21, 16 before)."""
    _, _, s_q, s_k = _qk_in_scaled(p_x, scale, H, K, BK)
    NC: tl.constexpr = BK // BKT
    narrow_tile: tl.constexpr = p_tile.dtype.element_ty == tl.bfloat16 or p_tile.dtype.element_ty == tl.float8e4nv
    if MMA and (not IS_KDA) and narrow_tile and p_x.dtype.element_ty == tl.bfloat16:
        o_n = tl.arange(0, 16)
        acc = tl.zeros([o_v.shape[0], 16], dtype=tl.float32)
        if PIPE > 0:
            for c in tl.range(0, NC, num_stages=PIPE):
                acc = _mma_chunk(c, acc, p_tile, o_v, mask_v, p_x, H, K, BKT, MMA_F32)
        else:
            for c in tl.static_range(NC):
                acc = _mma_chunk(c, acc, p_tile, o_v, mask_v, p_x, H, K, BKT, MMA_F32)
        dq = tl.sum(tl.where(o_n[None, :] == 0, acc, 0.0), 1)
        dk = tl.sum(tl.where(o_n[None, :] == 1, acc, 0.0), 1)
    elif MMA and IS_KDA and narrow_tile:
        # KDA: q~ and k~ (fp32, e^{G_t} per channel) split into three bf16 columns each (_mma_chunk_split)
        acc = tl.zeros([o_v.shape[0], 16], dtype=tl.float32)
        if PIPE > 0:
            o_ch, Q2, K2 = _qk_tilde_chunks(p_x, p_gl, has, a, dt_bias, A_log, i_n, i_hv, stride_a, lower_bound,
                                            H, K, BKT, NC, IS_KDA, USE_LOWER_BOUND)
            for c in tl.range(0, NC, num_stages=PIPE):
                acc = _mma_chunk_split(c, acc, p_tile, o_v, mask_v, _chunk_of(Q2, o_ch, c), _chunk_of(K2, o_ch, c),
                                       K, BKT, MMA_F32)
        else:
            for c in tl.static_range(NC):
                o_kc = c * BKT + tl.arange(0, BKT)
                q_c, k_c = _qk_tilde(p_x, o_kc, o_kc < K, p_gl, has, a, dt_bias, A_log, i_n, i_hv, stride_a,
                                     lower_bound, H, K, IS_KDA, USE_LOWER_BOUND)
                acc = _mma_chunk_split(c, acc, p_tile, o_v, mask_v, q_c, k_c, K, BKT, MMA_F32)
        dq, dk = _split_sums(acc)
    elif PIPE > 0:
        o_ch, Q2, K2 = _qk_tilde_chunks(p_x, p_gl, has, a, dt_bias, A_log, i_n, i_hv, stride_a, lower_bound,
                                        H, K, BKT, NC, IS_KDA, USE_LOWER_BOUND)
        dq = tl.zeros(o_v.shape, dtype=tl.float32)
        dk = tl.zeros(o_v.shape, dtype=tl.float32)
        for c in tl.range(0, NC, num_stages=PIPE):
            o_kc = c * BKT + tl.arange(0, BKT)
            m_c = mask_v[:, None] & (o_kc < K)[None, :]
            C_c = tl.where(m_c, tl.load(p_tile + o_v[:, None] * K + o_kc[None, :], mask=m_c).to(tl.float32), 0.0)
            dq += tl.sum(C_c * _chunk_of(Q2, o_ch, c)[None, :], 1)
            dk += tl.sum(C_c * _chunk_of(K2, o_ch, c)[None, :], 1)
    else:
        acc_q = tl.zeros([o_v.shape[0], BKT], dtype=tl.float32)
        acc_k = tl.zeros([o_v.shape[0], BKT], dtype=tl.float32)
        for c in tl.static_range(NC):
            o_kc = c * BKT + tl.arange(0, BKT)
            mk = o_kc < K
            m_c = mask_v[:, None] & mk[None, :]
            # no `other=` (Triton's interpreter cannot make an fp8 fill value): masked lanes zeroed after the cast
            C_c = tl.where(m_c, tl.load(p_tile + o_v[:, None] * K + o_kc[None, :], mask=m_c).to(tl.float32), 0.0)
            q_c, k_c = _qk_tilde(p_x, o_kc, mk, p_gl, has, a, dt_bias, A_log, i_n, i_hv, stride_a, lower_bound,
                                 H, K, IS_KDA, USE_LOWER_BOUND)
            acc_q += C_c * q_c[None, :]
            acc_k += C_c * k_c[None, :]
        dq = tl.sum(acc_q, 1)
        dk = tl.sum(acc_k, 1)
    return dq * s_q, dk * s_k


@triton.jit
def _tile_rec_dots(p_tile, o_v, mask_v, p_x, p_rk, valid, a, dt_bias, A_log, i_n, i_hv, stride_a, scale,
                   lower_bound, H: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BKT: tl.constexpr,
                   PIPE: tl.constexpr, BC: tl.constexpr, USE_LOWER_BOUND: tl.constexpr):
    """_tile_dots' pipelined form for GDN (fp32 or bf16 tile, CUDA cores), and the key head's record dots beside it
    (``self_pre``: the pre launch's work in the main launch): each K chunk of the [BC, K] key records at p_rk (rows
    past h masked by ``valid``) is loaded with the tile's chunk and dotted with the same q and k chunks. Returns
    (C q~, C k~) [BV], (<k_j, q~>, <k_j, k~>) [BC] and <k~, q~>."""
    q_in, k_in, s_q, s_k = _qk_in_scaled(p_x, scale, H, K, BK)
    NC: tl.constexpr = BK // BKT
    o_c = tl.arange(0, BC)
    o_ch, Q2, K2 = _qk_tilde_chunks(p_x, p_x, False, a, dt_bias, A_log, i_n, i_hv, stride_a, lower_bound,
                                    H, K, BKT, NC, False, USE_LOWER_BOUND)
    dq = tl.zeros(o_v.shape, dtype=tl.float32)
    dk = tl.zeros(o_v.shape, dtype=tl.float32)
    rq = tl.zeros([BC], dtype=tl.float32)
    rk = tl.zeros([BC], dtype=tl.float32)
    for c in tl.range(0, NC, num_stages=PIPE):
        o_kc = c * BKT + tl.arange(0, BKT)
        mk = o_kc < K
        m_c = mask_v[:, None] & mk[None, :]
        C_c = tl.where(m_c, tl.load(p_tile + o_v[:, None] * K + o_kc[None, :], mask=m_c).to(tl.float32), 0.0)
        R_c = tl.load(p_rk + o_c[:, None] * K + o_kc[None, :], mask=valid[:, None] & mk[None, :],
                      other=0).to(tl.float32)  # [BC, BKT]
        q_c = _chunk_of(Q2, o_ch, c)
        k_c = _chunk_of(K2, o_ch, c)
        dq += tl.sum(C_c * q_c[None, :], 1)
        dk += tl.sum(C_c * k_c[None, :], 1)
        rq += tl.sum(R_c * q_c[None, :], 1)
        rk += tl.sum(R_c * k_c[None, :], 1)
    return dq * s_q, dk * s_k, rq * s_q, rk * s_k, tl.sum(q_in * k_in) * s_q * s_k


@triton.jit
def _fold_chunk(c, amax, p_st, o_v, mask_v, p_k_in, n_k, a, dt_bias, A_log, i_n, i_hv, stride_a, lower_bound,
                base_u, base_k, base_g, h_old, has, flush, G_f, u_add, o_cd, valid_d, Ud, p_rc,
                K: tl.constexpr, V: tl.constexpr, GK: tl.constexpr, CAP: tl.constexpr, BKF: tl.constexpr,
                IS_KDA: tl.constexpr, USE_LOWER_BOUND: tl.constexpr, FOLD_DOT: tl.constexpr, DOT_PREC: tl.constexpr,
                HAS_RC: tl.constexpr, RC_FP8: tl.constexpr, PRED: tl.constexpr = False):
    """K chunk c ([BV, BKF]) of the main launch's chunked fold (the checkpoint tile at p_st, ring records at base_*,
    this token's u_add k^T when ``flush``, i.e. when the fold takes this token: a flush or a rebased head), stored in
    place, and its bf16 read copy at p_rc; returns the fp8 read copy's running row max |S|. G_f: GDN's fold decay
    (scalar); KDA loads its per-K decay for the chunk. Ud, o_cd, valid_d: the dot folds' [BV, BCD] decayed corrections
    and ring positions (FOLD_DOT)."""
    o_kc = c * BKF + tl.arange(0, BKF)
    mk = o_kc < K
    m_c = mask_v[:, None] & mk[None, :]
    p_c_s = p_st + o_v[:, None] * K + o_kc[None, :]
    C_c = tl.load(p_c_s, mask=m_c, other=0).to(tl.float32)  # read a moment ago: cache hits
    k_c = tl.load(p_k_in + o_kc, mask=mk, other=0).to(tl.float32) / n_k
    if IS_KDA:
        g_c = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_kc, mk, lower_bound, K, True, USE_LOWER_BOUND)
        G_last_c = tl.load(base_g + (h_old - 1) * GK + o_kc, mask=mk & has, other=0)
        G_fc = tl.where(flush, G_last_c + g_c, G_last_c)
    else:
        G_fc = G_f
    if FOLD_DOT:
        m_d = valid_d[:, None] & mk[None, :]
        Kd = tl.load(base_k + o_cd[:, None] * K + o_kc[None, :], mask=m_d, other=0).to(tl.float32)
        if PRED:
            # records k_j e^{-G_j}: one e^{G_f} per K for all of them, applied in two halves (see _pre_row)
            e_h = tl.exp(0.5 * G_fc)
            Kd = Kd * e_h[None, :] * e_h[None, :]
            S_c = C_c * tl.exp(G_fc)[None, :]
        elif IS_KDA:
            g_dc = tl.load(base_g + o_cd[:, None] * GK + o_kc[None, :], mask=m_d, other=0)
            Kd = Kd * tl.where(m_d, tl.exp(G_fc[None, :] - g_dc), 0.0)
            S_c = C_c * tl.exp(G_fc)[None, :]
        else:
            S_c = C_c * tl.exp(G_fc)
        S_c = tl.dot(Ud, Kd, acc=S_c, input_precision=DOT_PREC)
    else:
        S_c = _fold_records(C_c, G_fc, h_old, base_u, base_k, base_g, o_v, o_kc, mask_v, mk, V, K, GK, CAP, IS_KDA,
                            PRED=PRED)
    S_c += u_add[:, None] * k_c[None, :]
    tl.store(p_c_s, S_c.to(p_st.dtype.element_ty), mask=m_c)
    if HAS_RC:
        if RC_FP8:
            amax = tl.maximum(amax, tl.max(tl.abs(S_c), 1), propagate_nan=tl.PropagateNan.ALL)
        else:
            _store_read_copy(p_rc + o_v[:, None] * K + o_kc[None, :], S_c, amax, m_c, False)
    return amax


@triton.jit
def _row_order_kernel(ring_h, h_rows, slot_idx, ring_idx, forced, rc_valid, row_perm, B, L,
                      BB: tl.constexpr, HAS_FORCED: tl.constexpr, HAS_H_ROWS: tl.constexpr,
                      HAS_RING_IDX: tl.constexpr, HAS_RC: tl.constexpr):
    """One program: row_perm [B] = the batch rows that write their checkpoint this step (flush, pre-fold, forced,
    stale read copy: _decode_rule_rc's rule) first, then the others, each part in batch order (padded rows with
    the others). The main launch with ROW_ORDER 2 takes its rows in this order. A permutation whatever h holds,
    so it moves only when work is done, never what is computed. (A head rebased by the predecayed keys' overflow
    rule is decided in the pre launch and not seen here: it only stays in the second part.)"""
    i = tl.arange(0, BB)
    m = i < B
    slot = tl.load(slot_idx + i, mask=m, other=-1).to(tl.int64)
    if HAS_RING_IDX:
        rrow = tl.load(ring_idx + i, mask=m, other=-1).to(tl.int64)
        real = m & (slot >= 0) & (rrow >= 0)
    else:
        rrow = slot
        real = m & (slot >= 0)
    if HAS_H_ROWS:
        h = tl.load(h_rows + i, mask=m, other=0).to(tl.int32)
    else:
        h = tl.load(ring_h + rrow, mask=real, other=0).to(tl.int32)
    if HAS_FORCED:
        hot = tl.load(forced + i, mask=m, other=0) != 0
    else:
        hot = h < 0  # never
    if HAS_RC:
        hot = hot | (tl.load(rc_valid + rrow, mask=real, other=1) == 0)
    heavy = real & ((h + 1 >= L) | hot)  # a pre-fold (h >= L) or a flush: the row's programs fold
    light = m & (heavy == 0)
    n_heavy = tl.sum(heavy.to(tl.int32), 0)
    pos = tl.where(heavy, tl.cumsum(heavy.to(tl.int32), 0) - 1, n_heavy + tl.cumsum(light.to(tl.int32), 0) - 1)
    tl.store(row_perm + pos, i, mask=m)


@triton.jit
def replay_decode_v3_kernel(
    mixed_qkv, a, b, A_log, dt_bias, out, state,
    ring_u, ring_k, ring_g, ring_h, h_rows, slot_idx, forced, ring_idx,
    coef, scal, rc, rc_scale,
    scale, lower_bound, L,
    stride_qkv, stride_a, stride_b, stride_slot,
    H: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, GK: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, CAP: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BC: tl.constexpr, BKT: tl.constexpr,
    IS_KDA: tl.constexpr, HAS_FORCED: tl.constexpr, HAS_H_ROWS: tl.constexpr,
    USE_LOWER_BOUND: tl.constexpr, FOLD_CHUNKED: tl.constexpr = False,
    HAS_RC: tl.constexpr = False, RC_FP8: tl.constexpr = False,
    FOLD_DOT: tl.constexpr = False, DOT_PREC: tl.constexpr = "ieee", BCD: tl.constexpr = 16,
    PIPE: tl.constexpr = 0, BKF: tl.constexpr = 16, USE_PDL: tl.constexpr = False,
    HAS_RING_IDX: tl.constexpr = False, rc_valid=None,
    HPP: tl.constexpr = 1, FOLD_PIPE: tl.constexpr = 0, ovf=None, PRED: tl.constexpr = False,
    TILE_MMA: tl.constexpr = False, MMA_F32: tl.constexpr = False,
    row_perm=None, ROW_ORDER: tl.constexpr = 0, SELF_PRE: tl.constexpr = False,
):
    """Grid (V / BV, B, HV / HPP): one program per V-tile, row and HPP consecutive value heads, one head after
    the other (_main_tile). HPP > 1 (opt-in ``heads_per_program``) pays the program's first memory round trips
    (slot, ring row, h, flags) once for HPP tiles: their later loads are expected to hit the cache.
    ROW_ORDER (opt-in ``row_order``, see ``launch``): 0 the grid above; 1 grid (V / BV, HV / HPP, B), the rows
    outermost, so a row's programs are dispatched together, in batch order; 2 the same with row
    ``row_perm[program_id(2)]`` (_row_order_kernel: the rows that write their checkpoint first)."""
    # a read copy is written by the K-chunked fold only (the launch picks it)
    tl.static_assert(FOLD_CHUNKED or not HAS_RC, "a read copy needs FOLD_CHUNKED")
    tl.static_assert(HV % HPP == 0, "HPP must divide HV")
    i_n, i_hp = _row_and_head(1, ROW_ORDER != 0)
    if ROW_ORDER == 2:
        i_n = tl.load(row_perm + i_n)
    for r in range(HPP):  # a loop, not unrolled (ptxas sm_90, fp32 checkpoint, 4 heads: 168 registers, 255 unrolled)
        _main_tile(tl.program_id(0), i_n, i_hp * HPP + r,
                   mixed_qkv, a, b, A_log, dt_bias, out, state,
                   ring_u, ring_k, ring_g, ring_h, h_rows, slot_idx, forced, ring_idx, coef, scal, rc, rc_scale,
                   scale, lower_bound, L, stride_qkv, stride_a, stride_b, stride_slot,
                   H, HV, HK, GK, K, V, CAP, BK, BV, BC, BKT, IS_KDA, HAS_FORCED, HAS_H_ROWS, USE_LOWER_BOUND,
                   FOLD_CHUNKED, HAS_RC, RC_FP8, FOLD_DOT, DOT_PREC, BCD, PIPE, BKF, USE_PDL, HAS_RING_IDX, rc_valid,
                   FOLD_PIPE, ovf, PRED, TILE_MMA, MMA_F32, SELF_PRE)


@triton.jit
def _main_tile(
    i_v, i_n, i_hv,
    mixed_qkv, a, b, A_log, dt_bias, out, state,
    ring_u, ring_k, ring_g, ring_h, h_rows, slot_idx, forced, ring_idx,
    coef, scal, rc, rc_scale,
    scale, lower_bound, L,
    stride_qkv, stride_a, stride_b, stride_slot,
    H: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, GK: tl.constexpr,
    K: tl.constexpr, V: tl.constexpr, CAP: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, BC: tl.constexpr, BKT: tl.constexpr,
    IS_KDA: tl.constexpr, HAS_FORCED: tl.constexpr, HAS_H_ROWS: tl.constexpr, USE_LOWER_BOUND: tl.constexpr,
    FOLD_CHUNKED: tl.constexpr, HAS_RC: tl.constexpr, RC_FP8: tl.constexpr,
    FOLD_DOT: tl.constexpr, DOT_PREC: tl.constexpr, BCD: tl.constexpr,
    PIPE: tl.constexpr, BKF: tl.constexpr, USE_PDL: tl.constexpr,
    HAS_RING_IDX: tl.constexpr, rc_valid, FOLD_PIPE: tl.constexpr, ovf, PRED: tl.constexpr,
    TILE_MMA: tl.constexpr = False, MMA_F32: tl.constexpr = False, SELF_PRE: tl.constexpr = False,
):
    """The main launch's work for V-tile i_v of row i_n and value head i_hv (see the module docstring).
    SELF_PRE (GDN, no read copy, the pipelined read; opt-in ``self_pre``): there is no pre launch; the program
    dots its key head's records with q~ and k~ beside the tile's chunks (_tile_rec_dots), weighs them by
    e^{G_t - G_j} itself, and appends the token's G_t (V-tile 0 of each value head) and key (V-tile 0 of the key
    head's first value head), as the pre launch does."""
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

    slot, rrow = _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX)  # state slot; ring row (records, h, read copy)
    if HAS_H_ROWS:
        h_old = tl.load(h_rows + i_n).to(tl.int32)
    p_o = out + (i_n * HV + i_hv) * V + o_v
    if slot < 0:
        tl.store(p_o, tl.zeros([BV], dtype=tl.float32).to(p_o.dtype.element_ty), mask=mask_v)
        return

    # C q~ and C k~ over the [BV, K] checkpoint tile, q~ = scale q / |q|, k~ = k / |k| (KDA: both times e^{G_t}
    # per K). Computed here from the inputs (_tile_dots), not taken from the pre launch, so that with PDL this
    # part overlaps the pre launch; the coefficients of the records come from it after gdc_wait below.
    # The tile is read in K chunks (BKT elements, chunk_bytes per row): either software-pipelined through
    # shared memory (PIPE > 0, each chunk reduced as it lands) or unrolled, the products accumulated
    # element-wise across 64-byte chunks, so Triton lays a chunk out as 8 rows x 4 threads per warp: each thread
    # reduces its 4 rows' K elements in registers and only 2 shuffle levels remain per row, where one [BV, K]
    # load would put 32 threads along K (5 shuffle levels per row and reduction). _tile_dots has both.
    # With a read copy (issue 7): a row that writes its checkpoint this step (flush, pre-fold; a row whose read
    # copy is stale arrives here as a forced flush) reads the recurrence copy, every other row the read copy
    # (bf16, or fp8 codes times one scale per V-row). The choice needs h first.
    p_s = state + slot * stride_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    if not HAS_H_ROWS:
        h_old = tl.load(ring_h + rrow).to(tl.int32)
    p_x = mixed_qkv + i_n * stride_qkv
    p_xq = p_x + i_h * K  # this row's q of the key head; its k follows H * K later
    p_gl = ring_g + ((rrow * HV + i_hv) * CAP + (h_old - 1)) * GK  # KDA: G of the last record (h_old > 0)
    has = h_old > 0
    from_rc = False  # without a read copy (constexpr branch) every row reads the checkpoint
    if HAS_RC:
        pf0, _, fl0, _ = _decode_rule_rc(h_old, forced, i_n, L, HAS_FORCED, rc_valid, rrow, HAS_RC)
        from_rc = (pf0 | fl0) == 0
    # one _tile_dots per branch: the read copy's pointer type (bf16 / fp8) differs from the checkpoint's, and
    # compiled Triton refuses a variable whose type depends on the branch (the interpreter does not check).
    # SELF_PRE (a constexpr, so the names it defines outlive its branch; launch() refuses it with a read copy)
    # comes first: names defined under the runtime `if from_rc` would not.
    valid_r = o_c < h_old  # (self_pre: the records this step reads)
    if SELF_PRE:
        Cq, Ck, rq, rk, kq = _tile_rec_dots(state + slot * stride_slot + i_hv * V * K, o_v, mask_v, p_xq,
                                            ring_k + (rrow * HK + i_hk) * CAP * K, valid_r, a, dt_bias, A_log, i_n,
                                            i_hv, stride_a, scale, lower_bound, H, K, BK, BKT, PIPE, BC,
                                            USE_LOWER_BOUND)
    elif from_rc:
        Cq, Ck = _tile_dots(rc + (rrow * HV + i_hv) * V * K, o_v, mask_v, p_xq, p_gl, has, a, dt_bias, A_log,
                            i_n, i_hv, stride_a, scale, lower_bound, H, K, BK, BKT, PIPE, IS_KDA, USE_LOWER_BOUND,
                            TILE_MMA, MMA_F32)
    else:
        Cq, Ck = _tile_dots(state + slot * stride_slot + i_hv * V * K, o_v, mask_v, p_xq, p_gl, has, a, dt_bias,
                            A_log, i_n, i_hv, stride_a, scale, lower_bound, H, K, BK, BKT, PIPE, IS_KDA,
                            USE_LOWER_BOUND, TILE_MMA, MMA_F32)
    if SELF_PRE:
        # what the pre launch stores: G_t = G_{h-1} + g_t, the records' weights e^{G_t - G_j} (zero past h)
        g_t0 = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, False,
                          USE_LOWER_BOUND)
        rg = tl.load(ring_g + (rrow * HV + i_hv) * CAP + o_c, mask=valid_r, other=0)
        G_t = tl.sum(tl.where(o_c == h_old - 1, rg, 0.0), 0) + g_t0
        w_r = tl.where(valid_r, tl.exp(G_t - rg), 0.0)
        cq = rq * w_r
        ck = rk * w_r
    else:
        if USE_PDL:
            gdc_wait()  # the pre launch's coefficients (and its ring appends) are visible from here on
        p_c = coef + (i_n * HV + i_hv) * 2 * BC + o_c
        cq = tl.load(p_c)  # zero past h
        ck = tl.load(p_c + BC)
        kq = tl.load(scal + (i_n * HV + i_hv) * 2 + 1)
    v = tl.load(p_x + 2 * H * K + i_hv * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_val = tl.load(b + i_n * stride_b + i_hv).to(tl.float32)
    if IS_KDA:
        beta = tl.sigmoid(b_val).to(tl.float32)
    else:
        beta = tl.sigmoid(b_val).to(b.dtype.element_ty).to(tl.float32)

    if HAS_RC:
        if RC_FP8:
            rs = tl.load(rc_scale + (rrow * HV + i_hv) * V + o_v, mask=mask_v & from_rc, other=1.0)
            Cq = Cq * rs
            Ck = Ck * rs
    if not IS_KDA:
        if SELF_PRE:
            e_t = tl.exp(G_t)
        else:
            e_t = tl.load(scal + (i_n * HV + i_hv) * 2)
        Cq = Cq * e_t
        Ck = Ck * e_t

    prefold, h_eff, flush, _ = _decode_rule_rc(h_old, forced, i_n, L, HAS_FORCED, rc_valid, rrow, HAS_RC)
    rebase = h_old < 0  # (false: no head is rebased without predecayed keys)
    if PRED:
        # the pre launch's flags (visible after gdc_wait): a pre-folding row one of whose heads would pass
        # PREDECAYED_MIN_G flushes whole; on a row that appends, such a head is rebased: folded through this
        # token like a flush, the head alone (the post launch zeroes its records). Either way the tile above may
        # have come from the read copy, as any plain step's; the fold below reads the recurrence copy.
        ov = tl.load(ovf + rrow * (HV + 1) + HV) != 0
        flush = flush | ov
        prefold = prefold & (ov == 0)
        rebase = (tl.load(ovf + rrow * (HV + 1) + i_hv) != 0) & (flush == 0) & (prefold == 0)
    tok = flush | rebase  # the fold (if any) takes this token too
    valid = o_c < h_old
    base_u = ring_u + (rrow * HV + i_hv) * CAP * V
    ru = tl.load(base_u + o_c[:, None] * V + o_v[None, :], mask=valid[:, None] & mask_v[None, :],
                 other=0).to(tl.float32)  # [BC, BV]
    u_t = beta * (v - (Ck + tl.sum(ru * ck[:, None], 0)))
    o = Cq + tl.sum(ru * cq[:, None], 0) + u_t * kq
    tl.store(p_o, o.to(p_o.dtype.element_ty), mask=mask_v)

    if (flush | prefold | rebase) & FOLD_CHUNKED:
        # the same fold, one K chunk at a time ([BV, BKF] live instead of [BV, K]): fewer registers for the
        # whole kernel (the hot path above needs few), so more programs per SM keep loads in flight
        base_k = ring_k + (rrow * HK + i_hk) * CAP * K
        base_g = ring_g + (rrow * HV + i_hv) * CAP * GK
        tl.debug_barrier()  # every read of the tile above (other threads' layouts) precedes the writes below
        kf = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
        n_k = tl.sqrt(tl.sum(kf * kf) + 1e-6)
        has = h_old > 0
        if not IS_KDA:
            g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, False,
                             USE_LOWER_BOUND)
            G_last = tl.load(base_g + (h_old - 1), mask=has, other=0)
            G_f = tl.where(tok, G_last + g_t, G_last)
        u_add = tl.where(tok, u_t, 0.0)
        if FOLD_DOT:
            # the fold as one product per K chunk over all (up to BCD) ring positions, masked by h: every load is
            # independent of the others, where the record loop waits for each record's loads in turn (h of them,
            # per chunk). GDN's per-record decay goes into U, KDA's per-(record, K) decay into the keys.
            o_cd = tl.arange(0, BCD)
            valid_d = o_cd < h_old
            Ud = tl.load(base_u + o_cd[None, :] * V + o_v[:, None], mask=mask_v[:, None] & valid_d[None, :],
                         other=0).to(tl.float32)  # [BV, BCD]
            if not IS_KDA:
                g_d = tl.load(base_g + o_cd, mask=valid_d, other=0)
                Ud = Ud * tl.where(valid_d, tl.exp(G_f - g_d), 0.0)[None, :]
        amax = tl.zeros([BV], dtype=tl.float32)  # fp8 read copy: the V-rows' max |S| over K, for their scales
        NCH: tl.constexpr = BK // BKF
        p_st = state + slot * stride_slot + i_hv * V * K
        if not FOLD_DOT:
            o_cd = tl.arange(0, BCD)  # (unused by the record-loop fold)
            valid_d = o_cd < 0
            Ud = tl.zeros([BV, BCD], dtype=tl.float32)
        if IS_KDA:
            G_f = 0.0  # (KDA's decay is per K: _fold_chunk loads it per chunk)
        p_k_in = p_x + H * K + i_h * K
        p_rc = rc + (rrow * HV + i_hv) * V * K  # this tile's read copy (unused without one)
        if FOLD_PIPE > 0:
            # the chunk loop software-pipelined over FOLD_PIPE stages (the dot folds): the next chunks' checkpoint and
            # key loads are in flight as asynchronous copies while this chunk folds and stores; unrolled (below),
            # each chunk's loads wait behind the previous chunk's store, which the compiler cannot move them above
            for c in tl.range(0, NCH, num_stages=FOLD_PIPE):
                amax = _fold_chunk(c, amax, p_st, o_v, mask_v, p_k_in, n_k, a, dt_bias, A_log, i_n, i_hv, stride_a,
                                   lower_bound, base_u, base_k, base_g, h_old, has, tok, G_f, u_add, o_cd, valid_d,
                                   Ud, p_rc, K, V, GK, CAP, BKF, IS_KDA, USE_LOWER_BOUND,
                                   FOLD_DOT, DOT_PREC, HAS_RC, RC_FP8, PRED)
        else:
            for c in tl.static_range(NCH):
                amax = _fold_chunk(c, amax, p_st, o_v, mask_v, p_k_in, n_k, a, dt_bias, A_log, i_n, i_hv, stride_a,
                                   lower_bound, base_u, base_k, base_g, h_old, has, tok, G_f, u_add, o_cd, valid_d,
                                   Ud, p_rc, K, V, GK, CAP, BKF, IS_KDA, USE_LOWER_BOUND,
                                   FOLD_DOT, DOT_PREC, HAS_RC, RC_FP8, PRED)
        if HAS_RC:
            if RC_FP8:
                # second pass: the codes need the whole row's scale; the chunks are re-read from the checkpoint
                # just written (exact for an fp32 state; with the record-loop fold the same thread wrote each
                # element, same layout; the dot folds store from the tensor-core layout and are refused with fp8)
                sc = _rc_scale(amax)
                tl.debug_barrier()
                for c in tl.static_range(NCH):
                    o_kc = c * BKF + tl.arange(0, BKF)
                    m_c = mask_v[:, None] & (o_kc < K)[None, :]
                    S_c = tl.load(p_st + o_v[:, None] * K + o_kc[None, :], mask=m_c, other=0).to(tl.float32)
                    _store_read_copy(p_rc + o_v[:, None] * K + o_kc[None, :], S_c, sc, m_c, True)
                tl.store(rc_scale + (rrow * HV + i_hv) * V + o_v, sc, mask=mask_v)
        tl.debug_barrier()  # the fold's reads of record 0 precede its rewrite below (a pre-fold that appends)
    if (flush | prefold | rebase) & (not FOLD_CHUNKED):
        # write the checkpoint (1/L of the rows): v2's fold, from the ring and this token's inputs; the pre
        # launch appended nothing for these rows (a rebased head's zero record lies at h_old, past the h_old
        # committed records folded here)
        base_k = ring_k + (rrow * HK + i_hk) * CAP * K
        base_g = ring_g + (rrow * HV + i_hv) * CAP * GK
        C = tl.load(p_s, mask=m_vk, other=0).to(tl.float32)  # read a moment ago: expected cache hits
        k = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
        k = k / tl.sqrt(tl.sum(k * k) + 1e-6)
        g_t = _load_gate(a, dt_bias, A_log, i_n, i_hv, stride_a, o_k, mask_k, lower_bound, K, IS_KDA,
                         USE_LOWER_BOUND)
        has = h_old > 0
        if IS_KDA:
            G_last = tl.load(base_g + (h_old - 1) * GK + o_k, mask=mask_k & has, other=0)
        else:
            G_last = tl.load(base_g + (h_old - 1), mask=has, other=0)
        G_f = tl.where(tok, G_last + g_t, G_last)
        S = _fold_records(C, G_f, h_old, base_u, base_k, base_g, o_v, o_k, mask_v, mask_k, V, K, GK, CAP, IS_KDA,
                          PRED=PRED)
        S += tl.where(tok, u_t, 0.0)[:, None] * k[None, :]
        tl.debug_barrier()  # every read of this tile and of record 0 above precedes the writes below
        tl.store(p_s, S.to(state.dtype.element_ty), mask=m_vk)
    if flush == 0:
        tl.store(base_u + h_eff * V + o_v, u_t.to(ring_u.dtype.element_ty), mask=mask_v)
    if SELF_PRE:
        # the token's shared record parts, as the pre launch appends them (not on a flush; a pre-fold's record 0
        # is the post launch's). Position h_eff = h_old is read by no program this step (records j < h_old).
        if (flush == 0) & (prefold == 0) & (i_v == 0):
            tl.store(ring_g + (rrow * HV + i_hv) * CAP + h_eff, G_t)
            if i_hv % (HV // H) == 0:
                kk = tl.load(p_x + H * K + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
                kk = kk / tl.sqrt(tl.sum(kk * kk) + 1e-6)
                tl.store(ring_k + ((rrow * HK + i_hk) * CAP + h_eff) * K + o_k, kk.to(ring_k.dtype.element_ty),
                         mask=mask_k)


# ----------------------------------------------------------------------------------------------
# host side (called by kernels.decode.replay_decode with impl="v3", after its argument checks)
# ----------------------------------------------------------------------------------------------

# (BV, num_warps) of the main launch per (kind, state element size); unlisted: V3_DEFAULT_CONFIG.
# scripts/bench_kernels.py --v3-sweep times V3_SWEEP at B = 256 (docs/benchmarks.md).
# H200 sweep at B = 256 (benchmarks/results/kernels-20261129-2108.json, us): GDN fp32 32x1 205, 32x2 211,
# 64x2 209; GDN bf16 32x2 157 (32x1 222); KDA fp32 32x1 235 (32x2 244); KDA bf16 32x2 187 (32x1 262).
V3_DEFAULT_CONFIG = (32, 1)
V3_CONFIGS: dict[tuple[str, int], tuple[int, int]] = {("gdn", 4): (32, 1), ("gdn", 2): (32, 2),
                                                      ("kda", 4): (32, 1), ("kda", 2): (32, 2)}
V3_SWEEP = "32x1,32x2,64x2,64x4,128x4"
# how a flush folds the ring into the checkpoint: "loop" (whole [BV, K] tile, one record after the other),
# "chunked" (one K chunk at a time, the record loop per chunk), "dot" / "dot3" (one K chunk at a time, all
# records in one tl.dot: fp32 FMA ("ieee") / three tf32 tensor-core passes ("tf32x3")).
V3_FOLDS = frozenset({"loop", "chunked", "dot", "dot3"})
RC_FOLD = "chunked"  # the fold of a launch with a read copy when the caller asks for "loop" (it needs K chunks)
# Measured defaults per (kind, state element size, read-copy dtype or None), H200 2026-11-29 23:31
# (benchmarks/results/kernels-20261129-2331.*, B = 256, fp32 records): the tile read software-pipelined in
# 128-byte chunks with the tf32x3 dot fold: GDN 182.6 us vs 210.5 us (1.50x vs 1.30x conventional), KDA 218.1
# vs 245.9 us (1.27x vs 1.12x). bf16 states and read copies keep the unrolled read until measured.
# With a read copy: the configurations that passed the real-shape GPU checks (run 2319: the record-loop fold in
# chunks of the copy's 64-byte read width, i.e. 64 fp32 elements for fp8, 32 for bf16); not faster than without.
# 2026-11-30 (kernels-20261130-0132): main and post as PDL dependents, GDN 173.9 -> 170.7 us (r16), 182.9 -> 180.7
# (r32); KDA 268.1 -> 264.4 (r16), 224.7 -> 222.0 (r32), B = 256.
# 2026-12-01 (kernels-split-20261201-0416 / -0417, B = 256, the server's arguments, us per layer-step): the dot fold's
# chunk loop rolled (fold_pipe_stages 1; 92 registers instead of 110 for GDN, 100 instead of 127 for KDA raw keys)
# costs nothing with aligned cursors (GDN 181.9 -> 181.5, KDA predecayed 193.9 -> 192.1, raw 210.1 -> 210.0) and
# gains with staggered ones (GDN 183.8 -> 181.5, KDA predecayed 210.0 -> 204.8, raw 231.1 -> 217.6); 128-byte fold
# chunks are slower (GDN staggered 189.3, KDA raw 286.6).
_PIPE3 = dict(fold="dot3", pipe_stages=3, chunk_bytes=128, fold_bytes=64, pdl=True, fold_pipe_stages=1)
_RC_FP8 = dict(fold="chunked", pipe_stages=0, chunk_bytes=64, fold_bytes=256)
_RC_BF16 = dict(fold="chunked", pipe_stages=0, chunk_bytes=64, fold_bytes=128)
# GDN's bf16 copy: the pipelined read and the dot fold since 2026-11-30 (H200, B = 256, us; step split, aligned
# cursors: main launch 109.9 on a step that writes no checkpoint and 709 on the one that does, against 124.9 / 867
# with _RC_BF16, kernels-split-20261130-1300-gdn.json; graph benchmark, staggered cursors: 187.6 against 233.5,
# kernels-rc-20261130-1325.json). KDA's bf16 copy was slower with it (333.2 staggered; 289.6 with _RC_BF16 in
# kernels-20261130-0427) and keeps _RC_BF16.
# 2026-11-30 16:10 (kernels-split-20261130-1610.json, aligned cursors, us per layer-step): the fold's chunk loop
# pipelined (fold_pipe_stages 3) with the bf16 copy: GDN 162.4 -> 159.0 (checkpoint step 700.5 -> 649.1). KDA's bf16
# copy folded by dot3 in 64-byte chunks, pipelined (bench arm v3_rc_bf16_dot_fp3): 219.0 -> 205.2 in that run, but
# 243.4 in a later call (16:53, on since-reverted code); re-measured twice in one call at 30d7198 (19:18 UTC,
# kernels-split-20261130-1918-kda.json): 204.2 / 204.0 against _RC_BF16's 218.2 / 218.1, so it is KDA's bf16-copy
# default again (its real-shape GPU test passed at fa4c97e with it). Without a copy the pipelined fold costs the
# plain steps more than it saves: GDN 181.7 -> 185.5, KDA 209.4 -> 210.4; not taken (not for residency: offline,
# KDA keeps 14 programs per SM with it, docs/design.md "Session 10").
# fp8 copies: two value heads per main program (heads_per_program 2): GDN 181.5 -> 169.8, KDA 216.3 -> 208.2 (run
# 1545: 181.5 -> 170.0, 216.8 -> 208.1); without a copy or with bf16 it is slower (GDN 181.5 -> 189.6 / 162.5 -> 168.1).
_RC_BF16_PIPE = dict(fold="dot3", pipe_stages=3, chunk_bytes=128, fold_bytes=64, pdl=True, fold_pipe_stages=3)
# 2026-12-01 11:19 / 11:34 UTC (session 19; their raw files were lost, docs/benchmarks.md; re-timed with files at 21:25,
# kernels-20261201-2125: bf16 copy 168.9 -> 158.6, bf16 state 168.1 before -> 155.3, fp8 copy 189.1 -> 228.8; H200, B = 256):
# the bf16 tiles' C q / C k as tensor-core products (tile_mma), GDN. Its bf16 copy: 169.6 -> 158.5 and 169.1 -> 157.5 us
# (graph, staggered; 1.61x -> 1.73x conventional, faster than upstream's 164.4-164.6), 160.5 -> 155.2 and 160.4 -> 154.7
# (split, the server's arguments; plain step 110.9 -> 105.2). A bf16 state, whose tuned entry was none (the record-loop
# fold, an unrolled 64-byte read): 167.0 with it, 234.3 with tile_mma alone, 155.5 with tile_mma, the read pipelined
# in 128-byte chunks and the bf16 copy's pipelined tf32x3 fold (still below conventional's 141.5; the small-batch
# policy keeps bf16 pools on window 1). The fp8 copy with tile_mma is slower (186.7 -> 226.4; split 148.0 -> 181.2:
# 82 B spilled at the 168 cap, slower still uncapped or pipelined) and keeps the CUDA-core form.
_RC_BF16_PIPE_MMA = dict(_RC_BF16_PIPE, tile_mma=True)
_R16_MMA = dict(_RC_BF16_PIPE_MMA)
# KDA, 2026-12-01 21:32 / 21:34 UTC (session 20, kernels-20261201-2132 / -2134, H200, graph, staggered): the
# split-operand tile_mma (q~, k~ as bf16 high + low columns) with the same launch as GDN's bf16 state: a bf16 state
# 333.9 -> 271.3 us at B = 256 (0.43x -> 0.53x conventional; 0.52-0.53x at B = 128 / 512); that launch without
# tile_mma 338.2, tile_mma alone 613.6. Below conventional still: the policy keeps bf16 pools on window 1. KDA's bf16
# copy was slower with tile_mma alone (220.5 -> 267.3); with the read pipelined as well it is faster (session 21,
# _RC_BF16_KDA_MMA below). So both kinds' bf16 states take _R16_MMA.
# KDA's bf16 copy: the main launch capped at 168 registers (2026-12-01, H200, B = 256, the server's arguments, step
# split kernels-split-20261201-0135-maxnreg.*): uncapped, the H200's Triton compiles it to 184 (predecayed keys) / 200
# (raw) registers and the plain step takes 173-176 us; at 168 (2 bytes spilled) 136.5-138.6, and the layer-step goes
# from 230.2 to 192.6 us (predecayed; `same`: 194.1) and from 250.0 to 206.2 (raw).
_RC_BF16_KDA = dict(_RC_BF16, fold="dot3", fold_bytes=64, fold_pipe_stages=3, main_maxnreg=168)
# 2026-12-02 00:17 UTC (session 21, kernels-20261202-0017, H200, graph benchmark, staggered cursors, B = 256,
# predecayed keys): KDA's bf16 copy read by the split-operand tile_mma in a loop pipelined over 128-byte chunks
# (the bench arm v3_rc_bf16_mma_p3) 207.6 us against 220.6 for _RC_BF16_KDA (1.25x -> 1.33x conventional); tile_mma
# with the unrolled 64-byte read 269.5 (session 20: 267.3). So its bf16 copy takes the pair, as GDN's does.
# (Timed with session 20's two-part split of q~ / k~. Later in session 21 the split became three parts, fp32-grade,
# after the fp32 CPU checks caught the two-part error on this default path: offline, Triton 3.6, sm_90, the main launch
# goes 134 -> 150 registers with predecayed keys (138 -> 155 raw), no spills, 13 programs per SM either way (12 raw).
# Session 22 (kernels-20261202-0259 / -0338): 218.4 / 219.4 us, 1.26x, against 220.4 / 221.7 for the pipelined read
# without tile_mma: the third part costs 12 of the 13 us; the pair stays, 2 us ahead and fp32-grade.)
_RC_BF16_KDA_MMA = dict(_RC_BF16_KDA, tile_mma=True, pipe_stages=3, chunk_bytes=128)
# fp8 copies: the main launch capped at 168 registers too (2026-12-01, kernels-split-20261201-0301-fp8cap.*, B = 256,
# the server's arguments, us per layer-step): uncapped the H200's Triton gives it 255 registers (8 programs per SM);
# at 168 (56-72 B spilled) GDN 176.1 -> 150.3 (1.82x conventional), KDA predecayed 196.7 -> 167.6 (1.65x), raw keys
# 214.8 -> 184.9; a 200 cap is slower than none (187.0 / 216.7).
# Session 48 (kernels-20261206-0935, H100, the server's step in the fp8 copy's default CUDA shapes, round-robin, us):
# that launch had no PDL. With PDL and the main launch's early trigger for the post launch (TRIGGER_POST): GDN
# 75.9 -> 73.2 / 131.2 -> 128.1 / 244.5 -> 240.2 at B = 128 / 256 / 512, KDA 85.9 -> 81.3 / 149.4 -> 144.7 / 274.8 ->
# 271.2, B = 64 GDN 48.1 -> 45.5, KDA 52.8 -> 49.1; but at B = 16 slower (GDN 24.5 -> 29.8, KDA 25.6 -> 30.7) and at
# B = 32 even (33.3 / 33.6, 35.5 / 36.6). So PDL from 33 rows up (pdl_min_rows; an asked pdl wins).
_RC_FP8_HPP = dict(_RC_FP8, heads_per_program=2, main_maxnreg=168, pdl_min_rows=33)
# Session 23 (kernels-20261202-0610 / -0614, H200, graph benchmark, staggered cursors, B = 256; the v3_sl* arms:
# the ring keyed by request row and a forced mask, as the server passes them, KDA predecayed): the main launch's rows
# outermost (row_order "rows": grid (V / BV, HV / HPP, B), a row's heads dispatched together) against the grid order,
# us per layer-step: KDA 204.5 -> 200.8 (-> 191.4 capped at 96 registers; B = 128: 113.0 -> 110.0 -> 106.0), its bf16
# copy 218.7 -> 201.5, its fp8 copy 218.8 -> 204.7; GDN 184.7 -> 180.7 (capped: 180.3), its bf16 copy 159.5 -> 158.8,
# its fp8 copy 189.9 -> 181.3. (The fluid model's tail, "flush_first", gains nothing beyond "rows": 196.0 against
# 192.6 for KDA with slot-keyed rings, GDN 182.0 against 179.7.) bf16 states keep the grid order (GDN 154.5 -> 157.6).
# So every fp32 state takes "rows", and KDA's, without a copy, also the 96-register cap.
_ROWS = dict(row_order="rows")
V3_TUNED: dict = {("gdn", 4, None): dict(_PIPE3, **_ROWS), ("kda", 4, None): dict(_PIPE3, **_ROWS, main_maxnreg=96),
                  ("gdn", 4, torch.float8_e4m3fn): dict(_RC_FP8_HPP, **_ROWS),
                  ("kda", 4, torch.float8_e4m3fn): dict(_RC_FP8_HPP, **_ROWS),
                  ("gdn", 4, torch.bfloat16): dict(_RC_BF16_PIPE_MMA, **_ROWS),
                  ("kda", 4, torch.bfloat16): dict(_RC_BF16_KDA_MMA, **_ROWS),
                  ("gdn", 2, None): _R16_MMA, ("kda", 2, None): _R16_MMA}
# launch(row_order=...): the main launch's dispatch order -> its ROW_ORDER
ROW_ORDERS = {"grid": 0, "rows": 1, "flush_first": 2}
# launch(pre_order=...): the pre launch's dispatch order -> its ROW_ORDER (verify.ring_verify's row_order too)
PRE_ORDERS = {"grid": 0, "rows": 1}
PRE_WARPS = 1  # ptxas sm_90: 1176 (GDN) / 1848 (KDA) SASS per program at 1 warp, 2816 / 3520 at 4
_LAST: dict = {}


def tuned_pdl(tuned: dict, B: int) -> bool:
    """PDL for a launch of B rows that does not ask: REPLAYSSM_PDL (0 / 1, a measurement's override), else the tuned
    entry's pdl, or its pdl_min_rows (PDL for batches of at least that many rows: the fp8 copies, session 48)."""
    env = cuda_main.env_flag("REPLAYSSM_PDL")
    if env is not None:
        return env
    return bool(tuned.get("pdl", False)) or B >= tuned.get("pdl_min_rows", 2**31)


def diag_runs(diag_parts: str, part: str) -> bool:
    """Whether a step with launch's _diag_parts runs its launch `part` ("pre", "main" or "post"): every step but the
    diagnostics that name some launches alone."""
    return diag_parts in ("all", "stream", "nofold") or part in diag_parts.split("+")


def post_trigger_applies(post_trigger, pdl: bool, advance_h: bool, may_prefold: bool, diag_parts: str = "all") -> bool:
    """Whether the CUDA main launch's build takes TRIGGER_POST (the post launch let start at once; session 48):
    post_trigger the caller's choice (None: cuda_main.env_post_trigger's), and only where the post launch runs and is
    the main launch's programmatic dependent (pdl, a post launch for advance_h or may_prefold, a step that runs it)."""
    want = cuda_main.env_post_trigger() if post_trigger is None else bool(post_trigger)
    return bool(want and pdl and (advance_h or may_prefold) and diag_runs(diag_parts, "post"))


def launch(kind, mixed_qkv, a2, b2, A_log, dt_bias, state, ring, slot_idx, out, forced, L, scale, lower_bound,
           *, block_v=None, num_warps=None, h_rows=None, advance_h=True, may_prefold=True, fold=None,
           chunk_bytes=None, pipe_stages=None, fold_bytes=None, pdl=None, pre_rows=None, _diag_parts="all",
           ring_idx=None, pre_maxnreg=None, heads_per_program=None, fold_pipe_stages=None, main_maxnreg=None,
           tile_mma=None, row_order=None, pre_order=None, main_impl=None, cuda_config=None, self_pre=None,
           pre_impl=None, post_trigger=None, lead_pdl=None, pre_early=None, pre_pf=None, vec_u=None,
           tile_early=None, fold_out=None, flush_first=None, ff_from=None):
    """chunk_bytes: the width in bytes of one K chunk of a checkpoint row as the main launch reads it (of the read
    copy where the row reads it). _diag_parts (benchmark diagnostics only, results are wrong otherwise): "pre",
    "main" or "post" runs that launch alone, "pre+main" / "main+post" those two, so a benchmark can split a step's
    time.
    pipe_stages > 0: the checkpoint (or read-copy) tile is read by a K-chunk loop that Triton software-pipelines
    over that many stages (asynchronous copies into shared memory), each chunk reduced as it lands; 0 (default):
    the chunks unrolled into registers. fold_bytes: the K-chunk width of the chunked folds (per checkpoint row).
    pdl: launch the main and post launches as programmatic dependents (CUDA PDL, sm_90+): the main launch's
    checkpoint read starts while the pre launch still runs and waits (griddepcontrol.wait) only before it uses
    the pre launch's coefficients. Ignored off the GPU (Triton's interpreter has no PDL).
    pre_rows: rows per program of the pre launch (1: one program per row and key head; more: a grid small enough to
    be resident at once, for PDL's overlap).
    main_maxnreg: a register cap for the main launch (ptxas maxnreg; None: V3_TUNED: 168 for KDA's bf16 copy and for
    the fp8 copies, 96 for KDA's fp32 state without a copy, else none; ignored off the GPU). The
    H200's Triton 3.6 compiles KDA's bf16-copy main launch to 168 registers in some argument setups and to 182-200
    in others (an int32 ring_idx; the ring keyed by request row with a forced mask, as the server passes them;
    predecayed keys), and the plain step goes from 134 to 173-176 us at the higher counts
    (benchmarks/results/kernels-split-20261201-0134-parts-regs.*).
    pre_maxnreg: a register cap for the pre launch (ptxas maxnreg; None: none). The pre program needs 95 registers
    (GDN; KDA 114, ptxas sm_90), so 21 one-warp programs fit an SM and GDN's 4,096 take two waves; the main launch,
    a PDL dependent, starts only once the last wave has started (13.3 us after the pre launch in the 2026-11-30 GDN
    server profile). At 64, 32 fit (4,224 on the H200: one wave) at the cost of spills (GDN 108 B, KDA 360 B per
    thread). Timed on the H200 (benchmarks/results/kernels-20261130-1008, B = 256, fp32 state and records): no gain
    (GDN 179.3 us at 64, 177.6 at 80, against 178.8 without; KDA 241.4 / 229.1 against 220.2); ignored off the GPU.
    heads_per_program: value heads per main-launch program, one after the other (it must divide HV): the program's
    first round trips (slot, ring row, h, flags), which session 8's step split points at as the main launch's floor
    (~110 us at B = 256 whatever the tile's bytes), are paid once per that many tiles. None: V3_TUNED (2 with an fp8
    read copy, else 1: on the H200 it pays only there, docs/benchmarks.md, Kernels).
    fold_pipe_stages (the dot folds, "dot" / "dot3"): the fold's K-chunk loop software-pipelined over that many
    stages (asynchronous copies of the next chunks' checkpoint and keys while one chunk folds and stores), for the
    checkpoint-writing step (3.6x a plain step in session 8's split); 1: a plain loop (not unrolled); 0: unrolled.
    None: V3_TUNED (3 for the bf16 read copies, 1 for fp32 states without a copy, else 0). Ignored by the record-loop
    folds. (Session 8's fold_ahead, each chunk's loads issued one chunk early by hand, measured no gain on the H200
    and was replaced by this: docs/benchmarks.md.)
    tile_mma (None: V3_TUNED, on for the bf16 copies and for bf16 states): where a row reads a 2- or 1-byte tile (a bf16
    state, the bf16 or fp8 read copy), the tile's C q and C k are tensor-core products (_tile_dots; fp8 codes made bf16
    in registers, exactly). GDN: with bf16 inputs (the server's) the raw q and k are the operand's columns; fp32 inputs
    keep the CUDA-core form. KDA: q~ and k~ (e^{G_t} per channel) split into three bf16 columns each. fp32 tiles
    keep the CUDA-core form.
    row_order (None: V3_TUNED: "rows" for fp32 states, "grid" for bf16 states; measured in session 23): the order
    in which the main launch's programs are dispatched. "grid": V-tiles, then rows, then value heads (each head's
    sweep over the batch in turn), so the programs resident at one time read one or two heads of nearly every row
    (checkpoint tiles 2 MiB apart), and with staggered cursors the folding programs (1 row in L each step, ~3.6x a
    plain program's time) are spread through the launch; "rows": rows outermost, in batch order (the resident
    programs within ~16 rows); "flush_first": rows outermost, the rows that write their checkpoint first
    (_row_order_kernel, one small launch before the pre launch), so the long programs start first. On the H200
    "rows" is the gain and "flush_first" adds nothing to it (docs/design.md, "Session 23: what the order changed").
    What is computed is the same in every order.
    pre_order (None: V3_TUNED, "grid"; opt-in, not yet timed): the pre launch's dispatch order. "grid": rows, then
    key heads (each head's sweep over the batch in turn: consecutive programs read records 256 KB apart for KDA, a
    slot's key records being [HK, CAP, K]); "rows": the key heads of one row together, its records read in order.
    The main launch's "rows" order gained most where its per-row data is largest (KDA, session 23), which is what
    this tries for the pre launch.
    main_impl (None: the environment's REPLAYSSM_MAIN_IMPL, default "auto": "cuda" where this launch can take it,
    else "triton"): "cuda" runs the main launch as kernels/gdn_main.cu (cuda_main.py: GDN, and KDA with predecayed
    keys, fp32 or bf16 state, no read copy, K = 128, sm_90, nvcc or a cubin cache; the same arithmetic in fp32, rows
    outermost). Asked for by the caller where it cannot run, the launch says why; the environment's preference falls
    back to Triton there, and where the kernel does not build or load (cuda_main.load_failure: warned once).
    REPLAYSSM_MAIN_IMPL=triton keeps Triton's main launch everywhere.
    cuda_config: its (rows per warp, warps per block[, 1 to read the tile into registers[, minimum blocks per SM[, 1
    to load the coefficients after the dots[, 1 (KDA) to take G_t per column from the pre launch[, 1 (GDN) for the
    eight-lanes-per-row layout[, the V-tiles a block walks (with it)]]]]]]), or a name of cuda_main.CUDA_CONFIGS (None: cuda_main.default_config(state.dtype, kind, the read copy's dtype)).
    _diag_parts "stream" / "nofold" (with main_impl "cuda"; wrong results): the CUDA main launch stops after the tile
    dots (the benchmark's streaming floor) / skips the fold.
    pre_impl (None: the environment's preference, REPLAYSSM_PRE_IMPL (cuda_main.env_pre_impl; default "auto": "cuda"
    for GDN where the main launch is the CUDA one and this launch can take it, since session 32), else "triton"):
    "cuda" runs the pre launch as gdn_main.cu's replay_gdn_pre, or replay_kda_pre for KDA with predecayed keys
    (cuda_main.pre_unavailable_reason: K = 128, a ring capacity of at most 16, pre_rows 1, sm_90): the
    same outputs as Triton's, one warp per (row, key head) at most 64 registers for GDN (one wave of the grid at
    B = 256), 72 for KDA, q and k loaded beside h and the h key records all at once. With Triton's main launch it is
    built from the default CUDA shape's parameters.
    self_pre (None: the environment's REPLAYSSM_SELF_PRE=1 where this launch can take it and REPLAYSSM_MAIN_IMPL does
    not ask for CUDA, else V3_TUNED's, off; opt-in, session 28): no pre launch. Each main program dots its key head's
    records with q~ and k~ beside its tile's K chunks and appends the token's key and G_t itself (_main_tile's
    SELF_PRE), as upstream's single launch does. The work is redundant over the key head's V / BV x HV / H
    programs, and no program waits for another. GDN only, Triton's main launch, fp32 state, no read copy, the
    pipelined read (pipe_stages > 0). The main launch is then no programmatic dependent: nothing before it in the
    step produces what it reads. With main_impl="cuda" (or REPLAYSSM_SELF_PRE=cuda, a preference where the CUDA main
    launch runs and can take it) it is gdn_main.cu's SELF_PRE instead (session 37): GDN's XL shapes with 16 rows per
    warp, a ring capacity of at most 16, fp32 or bf16 state, with or without a read copy (cuda_main.unavailable_reason).
    self_pre=2 (main_impl="cuda" only; session 47) is SELF_PRE 2: the block's warps share the record dots (warp w's
    group g dots position 4 w + g, one barrier) and the checkpoint's tile is loaded before them, as with a pre launch;
    it also takes the fold on the tensor cores (mma_fold). A shape may carry it (cuda_main's eleventh shape field, as
    GDN's fp32 default x16w4c1_m4_sp2 does since session 47): with the CUDA main launch, no pre launch runs then; a
    self_pre asked for here wins over the shape's.
    post_trigger (None: REPLAYSSM_POST_TRIGGER, cuda_main.env_post_trigger; session 48): the CUDA main launch lets
    the post launch, its programmatic dependent, start at once (gdn_main.cu's TRIGGER_POST); the post launch waits
    for the main launch to finish before it reads anything, so only its launch and start overlap the main launch.
    It applies where the CUDA main launch runs with pdl and a post launch follows it.
    lead_pdl (None: REPLAYSSM_LEAD_PDL, cuda_main.env_lead_pdl; session 48): with pdl, the step's first launch (the
    pre launch, CUDA's or Triton's, or the CUDA main launch without one) is itself a programmatic dependent of the
    stream's previous kernel and waits for it (griddepcontrol.wait) before anything else, so that its launch and
    dispatch overlap that kernel's end.
    pre_early (None: REPLAYSSM_PRE_EARLY, cuda_main.env_pre_early; session 49): the CUDA pre launch issues what waits
    for no index before the slot, the G records beside the key records, and a bf16 key record's columns as one load
    (gdn_main.cu's PRE_EARLY), so that its warps' chain is slot -> h -> records; 2 (session 50): and with fp32 key
    records the first of them too (PRE_EARLY_F32; cuda_main.PRE_EARLY_F32_RECORDS). The CUDA builds with a pre launch.
    pre_pf (None: REPLAYSSM_PRE_PF, cuda_main.env_pre_pf; session 49): the CUDA pre launch's warps of the first pre_pf
    batch rows prefetch into L2 the tiles the main launch reads first (gdn_main.cu's PRE_PF; 0: none).
    vec_u (None: REPLAYSSM_VEC_U, cuda_main.env_vec_u, else cuda_main.vec_u_default: on for GDN's bf16 value records
    since session 54; session 52): the CUDA main launch reads a lane's value records at one position as one vector
    load (gdn_main.cu's VEC_U; the XL shapes).
    tile_early (None: REPLAYSSM_TILE_EARLY, cuda_main.env_tile_early; session 54): under PDL the CUDA main launch loads
    its tile with plain loads, which ptxas keeps above the PDL wait, so that a block that starts while the pre launch
    runs holds its tile (gdn_main.cu's TILE_EARLY; the XL shapes).
    fold_out (None: REPLAYSSM_FOLD_OUT, cuda_main.env_fold_out, else cuda_main.fold_out_default; session 57): a block
    of the copy-sized CUDA shapes whose rows flush from the checkpoint takes its outputs from its fold, reading the
    checkpoint once (gdn_main.cu's FOLD_OUT).
    flush_first (None: REPLAYSSM_FLUSH_FIRST, cuda_main.env_flush_first; session 59): the CUDA main launch's blocks of
    the batch rows past the first ff_from (None: cuda_main.FF_FROM_DEFAULT) take the rows that fold this step first,
    in the order the CUDA pre launch writes (gdn_main.cu's FLUSH_FIRST; the XL shapes with the CUDA pre launch:
    elsewhere it does not apply and the launch keeps batch order)."""
    has_rc = ring.rc is not None
    # unset options: the measured choice for this (layer kind, state element size, read copy), V3_TUNED
    tuned = V3_TUNED.get((kind, state.element_size(), ring.rc.dtype if has_rc else None), {})
    fold = fold if fold is not None else tuned.get("fold", "loop")
    chunk_bytes = chunk_bytes if chunk_bytes is not None else tuned.get("chunk_bytes", 64)
    pipe_stages = pipe_stages if pipe_stages is not None else tuned.get("pipe_stages", 0)
    fold_bytes = fold_bytes if fold_bytes is not None else tuned.get("fold_bytes", 64)
    pdl = bool(pdl if pdl is not None else tuned_pdl(tuned, mixed_qkv.shape[0])) and pdl_available(mixed_qkv.device)
    pre_rows = int(pre_rows if pre_rows is not None else tuned.get("pre_rows", 1))
    hpp = int(heads_per_program if heads_per_program is not None else tuned.get("heads_per_program", 1))
    fold_pipe = int(fold_pipe_stages if fold_pipe_stages is not None else tuned.get("fold_pipe_stages", 0))
    tile_mma_asked = tile_mma is not None  # an explicit tile_mma=True refuses K chunks too short for tl.dot
    tile_mma = bool(tile_mma if tile_mma is not None else tuned.get("tile_mma", False))
    order = dispatch_order("row_order", row_order if row_order is not None else tuned.get("row_order", "grid"),
                           ROW_ORDERS)
    pre_ord = dispatch_order("pre_order", pre_order if pre_order is not None else tuned.get("pre_order", "grid"),
                             PRE_ORDERS)
    if hpp < 1 or state.shape[1] % hpp:
        raise ValueError(f"heads_per_program must be >= 1 and divide the value heads ({state.shape[1]}), got {hpp}")
    if fold_pipe < 0:
        raise ValueError(f"fold_pipe_stages must be >= 0, got {fold_pipe}")
    if pre_rows < 1:
        raise ValueError(f"pre_rows must be >= 1, got {pre_rows}")
    pre_opts = _maxnreg_opts("pre_maxnreg", pre_maxnreg, mixed_qkv.device)
    main_opts = _maxnreg_opts("main_maxnreg", main_maxnreg if main_maxnreg is not None else tuned.get("main_maxnreg"),
                              mixed_qkv.device)
    # self_pre: the caller's, else the environment's preference (REPLAYSSM_SELF_PRE=1: wherever this launch can take
    # it and its main launch is Triton's, as REPLAYSSM_MAIN_IMPL does for the CUDA main launch; =cuda: gdn_main.cu's
    # SELF_PRE wherever the CUDA main launch runs and can take it, below), else V3_TUNED's
    env_sp = cuda_main.env_self_pre() if self_pre is None else ""
    if env_sp not in ("", "0", "1", "cuda"):
        raise ValueError(f"REPLAYSSM_SELF_PRE must be 0, 1 or cuda, got {env_sp!r}")
    env_cuda = main_impl is None and cuda_main.env_main_impl() == "cuda"  # (asked by name; "auto" yields to self_pre)
    # (with the CUDA main launch asked by name, self_pre is gdn_main.cu's SELF_PRE: its conditions are the launch's,
    # cuda_main.unavailable_reason)
    cuda_sp = main_impl == "cuda"
    sp_why = ("GDN only" if kind != "gdn" else None if cuda_sp else "an fp32 state" if state.element_size() != 4 else
              "no read copy" if has_rc else "the pipelined read (pipe_stages > 0)" if pipe_stages <= 0 else None)
    if self_pre is None:
        self_pre = bool(tuned.get("self_pre", False)) or (env_sp == "1" and sp_why is None and not env_cuda)
    if self_pre not in (False, True, 0, 1, 2):
        raise ValueError(f"self_pre must be False, True (1) or 2 (the CUDA main launch's shared record dots), got "
                         f"{self_pre!r}")
    self_pre = int(self_pre)  # (0 / 1 / 2: gdn_main.cu's SELF_PRE where the main launch is CUDA's)
    if self_pre and sp_why:
        raise ValueError(f"self_pre needs {sp_why}")
    if self_pre == 2 and main_impl != "cuda":
        raise ValueError("self_pre=2 (the block's warps sharing the record dots) is the CUDA main launch's: "
                         "main_impl='cuda'")
    if _diag_parts in ("stream", "nofold") and main_impl != "cuda":
        raise ValueError(f"_diag_parts={_diag_parts!r} is the CUDA main launch's diagnostic (main_impl='cuda')")
    diag_set = set(_diag_parts.split("+"))
    if _diag_parts not in ("all", "stream", "nofold") and not diag_set <= {"pre", "main", "post"}:
        raise ValueError(f"_diag_parts must be 'all', 'stream', 'nofold' or '+'-joined launches of 'pre', 'main', "
                         f"'post', got {_diag_parts!r}")
    if chunk_bytes not in (16, 32, 64, 128, 256, 512):
        raise ValueError(f"chunk_bytes must be a power of two in [16, 512], got {chunk_bytes}")
    lay = ring.layout
    B = mixed_qkv.shape[0]
    _, HV, V, K = state.shape
    GK = 1 if kind == "gdn" else K
    if h_rows is not None:
        if h_rows.shape != (B,) or h_rows.dtype != torch.int32 or h_rows.device != slot_idx.device:
            raise ValueError("h_rows must be an int32 [B] tensor on the batch's device")
    if not may_prefold and advance_h:
        raise ValueError("may_prefold=False only skips the post launch, which advance_h=True needs anyway")
    BK = triton.next_power_of_2(K)
    BC = max(4, triton.next_power_of_2(lay.cap))
    cfg = V3_CONFIGS.get((kind, state.element_size()), V3_DEFAULT_CONFIG)
    BV = max(16, min(block_v or cfg[0], triton.next_power_of_2(V)))
    nw = num_warps or cfg[1]
    dev = mixed_qkv.device
    # scratch (graph-safe: the caching allocator serves captured launches from the graph's pool)
    coef = torch.empty(B, HV, 2, BC, dtype=torch.float32, device=dev)
    scal = torch.empty(B, HV, 2, dtype=torch.float32, device=dev)
    common = dict(H=lay.H, HV=HV, HK=lay.HK, GK=GK, K=K, CAP=lay.cap, BK=BK, IS_KDA=(kind == "kda"),
                  HAS_FORCED=forced is not None, HAS_H_ROWS=h_rows is not None,
                  USE_LOWER_BOUND=lower_bound is not None, HAS_RING_IDX=ring_idx is not None)
    f = forced if forced is not None else slot_idx
    hr = h_rows if h_rows is not None else slot_idx
    ri = ring_idx if ring_idx is not None else slot_idx
    lb = float(lower_bound if lower_bound is not None else 0.0)
    # the main launch's implementation: the caller's, else the environment's preference (REPLAYSSM_MAIN_IMPL, default
    # "auto": the CUDA main launch wherever it can run and its kernel builds and loads, Triton's elsewhere; "triton":
    # Triton's always)
    env_impl = cuda_main.env_main_impl() if main_impl is None else ""
    if env_impl and env_impl not in cuda_main.MAIN_IMPLS:
        raise ValueError(f"REPLAYSSM_MAIN_IMPL must be one of {list(cuda_main.MAIN_IMPLS)}, got {env_impl!r}")
    impl_main = main_impl if main_impl is not None else ("triton" if env_impl == "triton" else "cuda")
    if impl_main not in ("triton", "cuda"):
        raise ValueError(f"main_impl must be 'triton' or 'cuda', got {impl_main!r}")
    if self_pre and not cuda_sp:
        impl_main = "triton"  # (an environment preference for CUDA does not apply: self_pre is Triton's form here)
    cuda_sp = cuda_sp and self_pre  # (below: without a pre launch the CUDA main launch waits for nothing: no PDL)
    cuda_cfg = cuda_main.asked_config(cuda_config, state.dtype, kind, cuda_main.rc_dtype_of(ring), lay.cap,
                                       cuda_main.device_name_of(state))
    if impl_main == "cuda" and main_impl is None and not self_pre and not cuda_main.usable(
            kind, state, ring, lower_bound, K, V, cuda_cfg):
        impl_main = "triton"  # (a preference, not a demand: this launch cannot take the CUDA path)
    # a shape without a pre launch (its self_pre field: gdn_main.cu's SELF_PRE 2, GDN's fp32 default since session 47);
    # a self_pre the caller asks for wins over the shape's
    cfg_sp = (cuda_main.full_config(cuda_cfg)[10] if isinstance(cuda_cfg, tuple)
              and 2 <= len(cuda_cfg) <= len(cuda_main.CONFIG_FIELDS) else 0)
    if impl_main == "cuda" and cfg_sp and not self_pre:
        self_pre = cuda_sp = cfg_sp
    if (env_sp == "cuda" and impl_main == "cuda" and main_impl is None and not self_pre and isinstance(cuda_cfg, tuple)
            and cuda_main.unavailable_reason(kind, state, ring, lower_bound, K, V, *cuda_cfg[:10],
                                             self_pre=True) is None):
        self_pre = cuda_sp = True  # (REPLAYSSM_SELF_PRE=cuda: a preference, where this CUDA launch can take it)
    diag_stream = {"stream": 1, "nofold": 2}.get(_diag_parts, 0)

    # the main launch's early trigger for the post launch (TRIGGER_POST): the caller's, else the environment's;
    # only where the post launch runs as its programmatic dependent
    trigger = post_trigger_applies(post_trigger, pdl, advance_h, may_prefold, _diag_parts)
    lead = bool(pdl and (cuda_main.env_lead_pdl() if lead_pdl is None else lead_pdl))
    early = cuda_main.env_pre_early() if pre_early is None else int(pre_early)
    pf = cuda_main.env_pre_pf() if pre_pf is None else int(pre_pf)
    vu = cuda_main.env_vec_u() if vec_u is None else int(vec_u)  # (None: cuda_main.vec_u_default for the build)
    te = cuda_main.env_tile_early() if tile_early is None else int(tile_early)
    fo = cuda_main.env_fold_out() if fold_out is None else int(fold_out)  # (None: cuda_main.fold_out_default)
    ff = cuda_main.env_flush_first() if flush_first is None else bool(flush_first)

    def cuda_defines(config, diag, trigger_post=False, ff=False):  # the build (gdn_main.cu's -D parameters)
        return cuda_main.launch_defines(
            mixed_qkv=mixed_qkv, a2=a2, b2=b2, A_log=A_log, dt_bias=dt_bias, out=out, state=state, ring=ring,
            h_rows=h_rows, slot_idx=slot_idx, forced=forced, ring_idx=ring_idx, H=lay.H, HV=HV, V=V, cap=lay.cap,
            BC=BC, pdl=pdl and not cuda_sp, config=config, diag_stream=diag, kind=kind, lower_bound=lower_bound,
            self_pre=cuda_sp, trigger_post=trigger_post, lead_pdl=lead, pre_early=early, pre_pf=pf, vec_u=vu,
            tile_early=te, fold_out=fo, flush_first=ff, ff_from=ff_from)

    main_defs = None  # the CUDA main launch's build, made once: its load check, the pre launch and the launch take it
    if impl_main == "cuda":
        nf = len(cuda_main.CONFIG_FIELDS)
        if isinstance(cuda_cfg, tuple) and 2 <= len(cuda_cfg) <= nf:
            cuda_cfg = cuda_main.full_config(cuda_cfg)
        if not (isinstance(cuda_cfg, tuple) and len(cuda_cfg) == nf):
            raise ValueError(f"cuda_config must be (rows per warp, warps[, load_reg[, min_blocks[, late_coef[, "
                             f"gt_pre[, xl[, nch[, rc_lean[, mma_fold[, self_pre]]]]]]]]]) or one of "
                             f"{list(cuda_main.CUDA_CONFIGS)}, got {cuda_config!r}")
        why = cuda_main.unavailable_reason(kind, state, ring, lower_bound, K, V, *cuda_cfg[:10], self_pre=cuda_sp)
        if why:
            raise ValueError(f"main_impl='cuda' cannot run this launch: {why} (main_impl='triton' can)")
        main_defs = cuda_defines(cuda_cfg, diag_stream, trigger, ff)
        if main_impl is None and cuda_main.load_failure(main_defs, state.device):
            impl_main = "triton"  # (its kernel did not build or load here: warned once, Triton's main launch runs)
            main_defs = None
            if cuda_sp:  # (REPLAYSSM_SELF_PRE=cuda was a preference for that kernel: Triton's keeps its pre launch)
                self_pre = cuda_sp = False
    # the pre launch's implementation: the caller's, else the environment's preference (REPLAYSSM_PRE_IMPL, default
    # "auto": the CUDA pre launch where the main launch is the CUDA one and the pre launch can run; "cuda": wherever it
    # can run and its kernel builds and loads; "triton": Triton's always). A preference never fails a launch.
    env_pre = cuda_main.env_pre_impl() if pre_impl is None else ""
    if env_pre and env_pre not in cuda_main.PRE_IMPLS:
        raise ValueError(f"REPLAYSSM_PRE_IMPL must be one of {list(cuda_main.PRE_IMPLS)}, got {env_pre!r}")
    if pre_impl is None and ring.split_records and not self_pre:
        pre_impl = "cuda"  # (the pre launch that writes both planes of a split ring's key records)
    if pre_impl is None:
        pre_impl = "cuda" if env_pre == "cuda" or (env_pre == "auto" and main_defs is not None
                                                   and kind in cuda_main.PRE_AUTO_KINDS) else "triton"
    if pre_impl not in ("triton", "cuda"):
        raise ValueError(f"pre_impl must be 'triton' or 'cuda', got {pre_impl!r}")
    pre_defs = None
    mma = main_defs is not None and cuda_main.tensor_core_dots(main_defs)  # (rc_lean 2: the CUDA pre launch's operand)
    if mma and pre_impl != "cuda":
        if env_pre:
            pre_impl = "cuda"  # (a preference gives way: this main launch reads what only the CUDA pre launch writes)
        else:
            raise ValueError("rc_lean 2 (RC_MMA, ST_MMA) reads its tensor-core operand from the CUDA pre launch: pre_impl="
                             "'cuda' (or a shape without it)")
    if pre_impl == "cuda":
        why = ("self_pre has no pre launch" if self_pre else
               cuda_main.pre_unavailable_reason(kind, state, ring, K, BC, pre_rows))
        if why and env_pre and not mma:
            pre_impl = "triton"  # (a preference, not a demand: this launch cannot take the CUDA pre launch)
        elif why:
            raise ValueError(f"pre_impl='cuda' cannot run this launch: {why} (pre_impl='triton' can)")
        else:
            # the build of the main launch it feeds where that is CUDA's (one module, loaded above), else of the
            # default CUDA shape
            pre_defs = main_defs if main_defs is not None else cuda_defines(
                cuda_main.pre_build_config(cuda_main.launch_default_config(state, ring, kind), kind, state.dtype), 0)
            if env_pre and main_defs is None and cuda_main.load_failure(pre_defs, state.device):
                pre_impl, pre_defs = "triton", None  # (its kernel did not build or load here: warned once)
    if ring.split_records and (main_defs is None or (pre_defs is None and not self_pre)):
        # (the CUDA launches read and write both planes; Triton's read the high plane as whole records)
        raise ValueError("a ring of split records (split_records) runs the CUDA main launch with the CUDA pre launch "
                         "or none (self_pre): main_impl='cuda', pre_impl='cuda' (REPLAYSSM_MAIN_IMPL / "
                         f"REPLAYSSM_PRE_IMPL not 'triton'; in the server, or unset REPLAYSSM_SPLIT_RECORDS); this "
                         f"launch has main {impl_main}, pre {pre_impl}")
    if main_defs is not None and main_defs.get("FLUSH_FIRST") and not (
            pre_defs is main_defs and diag_runs(_diag_parts, "pre")):
        # (FLUSH_FIRST's order is written by this build's own CUDA pre launch: without it, batch order)
        main_defs = cuda_defines(cuda_cfg, diag_stream, trigger)
    ff_order = cuda_main.order_scratch(B, dev) if main_defs is not None and main_defs.get("FLUSH_FIRST") else None
    # KDA's gt_pre shapes: the pre launch hands the main launch G_t per column
    gts = _gts_scratch(B, HV, K, dev) if impl_main == "cuda" and cuda_cfg[5] else None
    frag = cuda_main.frag_scratch(B, lay.H, dev) if mma else None  # (rc_lean 2: the pre launch's operand for the main)
    if B == 0:
        return out
    rc_fp8 = has_rc and ring.rc.dtype == torch.float8_e4m3fn
    if has_rc and h_rows is not None:
        raise ValueError("h_rows with a read copy: the caller would advance h without the stale-copy flushes")
    pred = ring.predecayed  # (a KDA ring: RingLayout.allocate refuses it for GDN)
    if pred and (h_rows is not None or not advance_h):
        # the post launch advances h by the flags the pre launch raised (and clears them); a caller-owned h would not
        raise ValueError("predecayed KDA keys need advance_h=True and no h_rows (the launch's own flushes set h)")
    if fold not in V3_FOLDS:
        raise ValueError(f"v3 fold must be one of {sorted(V3_FOLDS)}, got {fold!r}")
    if has_rc:
        # a stale read copy (the checkpoint was written by something else) makes the row's step a flush:
        # it reads the recurrence copy and rewrites both (docs/design.md, "Precision: two copies"); every
        # launch reads rc_valid itself (_decode_rule_rc) and the post launch marks the rows' copies current
        # the fold writes the read copy chunk by chunk (fp8: a second pass with the rows' scales); the
        # whole-tile fold with the copy's writes needs 255 registers and spills (ptxas, sm_90)
        if fold == "loop":
            fold = RC_FOLD
        if rc_fp8 and fold in ("dot", "dot3"):
            # the fp8 copy's second pass re-reads the chunks the first pass stored; with the dot fold the stores
            # come from the tensor-core layout (other threads), and the H200 check of 2026-11-29 23:31 found the
            # copy wrong (rms 8.8e-3 against round(fold)) at real head sizes: refused until fixed
            raise ValueError("an fp8 read copy folds with fold='chunked' (the dot folds fail the GPU check)")
    run_pre, run_main, run_post = (diag_runs(_diag_parts, p) for p in ("pre", "main", "post"))
    run_pre = run_pre and not self_pre  # (self_pre: the main launch does the pre launch's work)
    # the read copy's element size where rows read it (all but 1/L of them), else the checkpoint's
    tile_es = ring.rc.element_size() if has_rc else state.element_size()
    BKT = min(BK, max(1, chunk_bytes // tile_es))
    if tile_mma and tile_es <= 2 and BKT < 16:
        if not tile_mma_asked:
            tile_mma = False  # V3_TUNED's choice, for the default chunks; a caller's shorter chunks: CUDA cores
        else:
            raise ValueError(f"tile_mma needs K chunks of at least 16 elements (tl.dot's minimum): chunk_bytes >= "
                             f"{16 * tile_es} for a {'bf16' if tile_es == 2 else 'fp8'} tile, got {chunk_bytes}")
    row_perm = None
    if order == 2 and run_main:
        # before the pre launch, so that the main launch (its PDL dependent) can read it before gdc_wait
        row_perm = torch.empty(B, dtype=torch.int32, device=dev)
        _row_order_kernel[(1,)](ring.h, hr, slot_idx, ri, f, ring.rc_valid if has_rc else slot_idx, row_perm, B, L,
                                BB=triton.next_power_of_2(B), HAS_FORCED=forced is not None,
                                HAS_H_ROWS=h_rows is not None, HAS_RING_IDX=ring_idx is not None, HAS_RC=has_rc,
                                num_warps=4)
    if run_pre and pre_defs is not None:
        cuda_main.pre_launch(defs=pre_defs, mixed_qkv=mixed_qkv, a2=a2, A_log=A_log, dt_bias=dt_bias, ring=ring,
                             h_rows=h_rows, slot_idx=slot_idx, forced=forced, ring_idx=ring_idx, coef=coef, scal=scal,
                             scale=float(scale), lower_bound=lower_bound, L=L, B=B, gts=gts,
                             min_g=PREDECAYED_MIN_G, frag=frag, lead=lead, state=state, order=ff_order)
    elif run_pre:
        replay_decode_v3_pre_kernel[dispatch_grid(triton.cdiv(B, pre_rows), lay.HK, pre_ord == 1)](
            mixed_qkv, a2, A_log, dt_bias, ring.k, ring.g, ring.h, hr, slot_idx, f, ri, coef, scal,
            float(scale), lb, L, mixed_qkv.stride(0), a2.stride(0), B, BC=BC, num_warps=PRE_WARPS, num_stages=1,
            USE_PDL=pdl, ROWS=pre_rows, rc_valid=ring.rc_valid if has_rc else None, HAS_RC=has_rc, **common,
            ovf=ring.ovf if pred else None, min_g=PREDECAYED_MIN_G, PRED=pred, ROW_ORDER=pre_ord, **pre_opts,
            gt_out=gts, STORE_GT=gts is not None, LEAD_WAIT=lead, **_pdl_kw(lead),
        )
    if run_main and impl_main == "cuda":
        _LAST["kernel"] = None  # (no Triton kernel to report registers of: cuda_main.resources has them)
        cuda_main.launch(mixed_qkv=mixed_qkv, a2=a2, b2=b2, A_log=A_log, dt_bias=dt_bias, out=out, state=state,
                         ring=ring, h_rows=h_rows, slot_idx=slot_idx, forced=forced, ring_idx=ring_idx, coef=coef,
                         scal=scal, scale=float(scale), L=L, H=lay.H, HV=HV, V=V, cap=lay.cap, BC=BC,
                         pdl=pdl and not cuda_sp, config=cuda_cfg, diag_stream=diag_stream, kind=kind,
                         lower_bound=lower_bound, gts=gts, defs=main_defs, frag=frag, order=ff_order)
    elif run_main:
        grid = dispatch_grid(B, HV // hpp, order != 0, triton.cdiv(V, BV))
        _LAST["kernel"] = replay_decode_v3_kernel[grid](
            mixed_qkv, a2, b2, A_log, dt_bias, out, state,
            ring.u, ring.k, ring.g, ring.h, hr, slot_idx, f, ri, coef, scal,
            ring.rc if has_rc else state, ring.rc_scale if rc_fp8 else scal,
            float(scale), lb, L,
            mixed_qkv.stride(0), a2.stride(0), b2.stride(0), state.stride(0),
            V=V, BV=BV, BC=BC, BKT=BKT, FOLD_CHUNKED=(fold != "loop"), FOLD_DOT=fold in ("dot", "dot3"),
            DOT_PREC="tf32x3" if fold == "dot3" else "ieee", BCD=max(16, BC),
            HAS_RC=has_rc, RC_FP8=rc_fp8, PIPE=int(pipe_stages),
            BKF=min(BK, max(16, fold_bytes // state.element_size())),
            num_warps=nw, num_stages=max(1, int(pipe_stages)), USE_PDL=pdl and not self_pre,
            rc_valid=ring.rc_valid if has_rc else None,
            HPP=hpp, FOLD_PIPE=fold_pipe if fold in ("dot", "dot3") else 0, ovf=ring.ovf if pred else None, PRED=pred,
            TILE_MMA=tile_mma, MMA_F32=os.environ.get("TRITON_INTERPRET") == "1",
            row_perm=row_perm, ROW_ORDER=order, SELF_PRE=bool(self_pre),
            **common, **_pdl_kw(pdl and not self_pre), **main_opts,
        )
    if run_post and (advance_h or may_prefold):
        replay_decode_v2_post_kernel[(B,)](
            mixed_qkv, a2, A_log, dt_bias, ring.k, ring.g, ring.h, hr, ring.h, slot_idx, f, ri,
            lb, L, mixed_qkv.stride(0), a2.stride(0),
            WRITE_H=bool(advance_h), WRITE_REC0=True, num_warps=1, num_stages=1, USE_PDL=pdl, **common,
            rc_valid=ring.rc_valid if has_rc else None, HAS_RC=has_rc, ovf=ring.ovf if pred else None, PRED=pred,
            HVP=triton.next_power_of_2(HV), ring_k_lo=ring.k_lo, SPLIT=ring.split_records, **_pdl_kw(pdl),
        )
    elif has_rc and _diag_parts == "all":
        set_rc_valid_(ring, ring_rows(slot_idx, ring_idx), 1)  # (the post launch does it where it runs)
    # every real row now holds round(checkpoint) in its read copy
    return out


def _gts_scratch(B: int, HV: int, K: int, device) -> torch.Tensor:
    """KDA's gt_pre scratch, G_t per (row, value head, column) [B, HV, K] fp32, from the pre launch to the main
    launch: uninitialised (with the tile's dots on the tensor cores the pre launch writes only the rows the main launch
    reads, gdn_main.cu's replay_kda_pre; tests fill it with NaN to show it)."""
    return torch.empty(B, HV, K, dtype=torch.float32, device=device)


def _maxnreg_opts(name: str, maxnreg, device: torch.device) -> dict:
    """The launch option of a register cap (ptxas maxnreg) named ``name``, checked; {} for none, and off the GPU
    (Triton's interpreter has no registers)."""
    if maxnreg is None:
        return {}
    if not 24 <= int(maxnreg) <= 255:
        raise ValueError(f"{name} must be in [24, 255], got {maxnreg}")
    return {"maxnreg": int(maxnreg)} if compiled_for_cuda(device) else {}


def compiled_for_cuda(device: torch.device) -> bool:
    """Launches on this device compile for a CUDA GPU (not Triton's interpreter): compile options apply."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"


def pdl_available(device: torch.device) -> bool:
    """Programmatic dependent launch: a CUDA device of compute capability 9.0 or newer, not the interpreter."""
    return compiled_for_cuda(device) and torch.cuda.get_device_capability(device)[0] >= 9


def _pdl_kw(pdl: bool) -> dict:
    """The launch option that makes a Triton launch a programmatic dependent of the previous one."""
    return {"launch_pdl": True} if pdl else {}


@triton.jit
def _set_rc_valid_kernel(slot_idx, rc_valid, value):
    i_n = tl.program_id(0)
    slot = tl.load(slot_idx + i_n)
    if slot >= 0:
        tl.store(rc_valid + slot, value)


def set_rc_valid_(ring, slot_idx: torch.Tensor, value: int) -> None:
    """ring.rc_valid[slot] = value for every real row (slot >= 0), on the device (graph-capturable).
    No-op for a ring without a read copy."""
    if ring.rc_valid is None or slot_idx.numel() == 0:
        return
    _set_rc_valid_kernel[(slot_idx.shape[0],)](slot_idx, ring.rc_valid, int(value), num_warps=1)

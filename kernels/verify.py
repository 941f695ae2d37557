"""Speculative verify in the ring (GDN and KDA): T draft outputs from the checkpoint read once plus
the ring, output-only; the T draft records are appended at r[h..h+T-1]; nothing else is written
except at a pre-step fold.

Protocol (owned by ``replayssm_sglang.ring``; see docs/design.md, "Speculative verify in the ring"):
- per row, with committed count h (read on the device, never written here) and T drafts:
  if ``ring.needs_prefold(h, T, L)`` (h + T > L) the committed records r[0..h-1] are folded into the
  checkpoint first (one state write) and the step appends at r[0..T-1]; else it appends at r[h..h+T-1];
- the commit after acceptance is ``ring.commit_verify_`` (h += accepted, bonus included), a separate
  tiny device op; rejected records lie past h and are overwritten by the next step.

Math, per value head, with Gamma the cumulative log-decay since the checkpoint C and G_ref = Gamma at
the last committed record (0 after a fold), Gl_i the draft-local cumulative log-decay (Gamma_i =
G_ref + Gl_i):
    W_i  = S_h Diag(exp Gl_i) k_i  = C (exp(Gamma_i) * k_i) + sum_{j<h} u_j <k_j * exp(Gamma_i - Gamma_j), k_i>
    Q_i  = S_h Diag(exp Gl_i) q_i  (same with q_i)
    u_i  = beta_i (v_i - W_i) - beta_i sum_{m<i} u_m <k_m * exp(Gl_i - Gl_m), k_i>
    o_i  = Q_i + sum_{m<=i} u_m <k_m * exp(Gl_i - Gl_m), q_i>
The u_i of the window depend on each other: (I + A) u = R with A strictly lower,
A[i,m] = beta_i <k_m * exp(Gl_i - Gl_m), k_i>, R_i = beta_i (v_i - W_i); solved in-kernel by forward
substitution of the T x T unit-lower-triangular system (UT transform), then u = R (I+A)^-T.
Every exponent is kept <= 0 (history factors are taken relative to G_ref, intra-window KDA factors are
built as running products of exp(g)), so nothing overflows however strong the decay.

Two launches, both decided on the device (CUDA-graph capturable):
1. ``_ring_prefold_kernel``: rows with h + T > L fold r[0..h-1] into C; every other row exits at once.
   A separate launch because the fold reads the records the step then overwrites (r[0..T-1]), and the
   key records are shared by all value-head programs of a key head.
2. ``_ring_verify_kernel``: one program per (row, value head) (optionally split over V), looping over
   V tiles so the K-side work (norms, gates, T x T solve, history scores) is done once per head.
   The checkpoint tile is read in K chunks by a software-pipelined loop (``pipe_stages``, the default since
   2026-11-30, ``VERIFY_TUNED``): since 2026-12-01 (``ck_dot=2``) each chunk is multiplied by the stacked drafts'
   [k~; q~] rows in one tensor-core product at ``default_precision`` (3xTF32 for an fp32 pool: C k~_i reaches the
   records); before, C k~_i was an fp32 multiply-reduce per draft on the CUDA cores (``ck_dot=0``), which left the
   kernel at 1.2 TB/s. The products against history records use tl.dot at ``default_precision``; those whose inner
   axis is the draft axis (the T x T solve, U = R Ti^T, O += U F^T) are fp32 broadcast-reduces (``_mm_small``), so
   the draft axis is padded to T's power of two only (tl.dot refuses an inner axis below 16 on the H200's Triton;
   until 2026-12-01 the launch then retried at BT = 16, which quadrupled every draft-axis tensor). The one-piece read
   (``pipe_stages=0``; rings with a read copy) takes both checkpoint products as tl.dots.
   ``split=True`` (opt-in) runs this kernel twice: PART 1, one program per (row, value head), the K-side work
   into a scratch; PART 2, one program per (row, value head, V-tile), the tile and the outputs. Timed slower on
   the H200 (verify-20261130-1250, GDN B = 256, T = 4: 1037 / 708 us at 32x4 / 32x2 against 627 one launch).
   A variant that did every
   product as an fp32 broadcast-reduce on CUDA cores (git 7da6299) was rejected on its sm_90 SASS:
   8.6k instructions per warp, shuffle-bound cross-lane reductions, about 1.1 ms issue-bound at
   B=256, T=4 against about 0.13 ms for SGLang's conventional verify kernel.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from replayssm_sglang import ring as ring_mod
from replayssm_sglang.kernels.decode_v2 import _fold_records
from replayssm_sglang.kernels.decode import _slot_row, check_ring_idx, ring_rows
from replayssm_sglang.kernels.decode_v3 import (PRE_ORDERS, _maxnreg_opts, _rc_scale, _row_and_head,
                                                _store_read_copy, dispatch_grid, dispatch_order, set_rc_valid_)

__all__ = ["ring_verify", "ring_prefold", "ring_commit_", "default_precision"]


@triton.jit
def _ring_prefold_kernel(
    state,
    ring_u,
    ring_k,
    ring_g,
    ring_h,
    slot_idx,
    stride_state_slot,
    stride_u_slot,
    stride_k_slot,
    stride_g_slot,
    T,
    L,
    CAP,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    IS_KDA: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    rc=None,
    rc_scale=None,
    HAS_RC: tl.constexpr = False,
    RC_FP8: tl.constexpr = False,
    ring_idx=None,
    HAS_RING_IDX: tl.constexpr = False,
    PIPE: tl.constexpr = 0,
    BKT: tl.constexpr = 32,
    ROW_ORDER: tl.constexpr = 0,
):
    # ROW_ORDER (ring_prefold's row_order): 0 grid (V-tiles, B, HV); 1 grid (V-tiles, HV, B), the rows outermost
    i_v = tl.program_id(0)
    i_n, i_hv = _row_and_head(1, ROW_ORDER == 1)
    i_h = i_hv // (HV // H)

    slot, rrow = _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX)  # state slot, ring row
    if slot < 0:
        return
    h = tl.load(ring_h + rrow).to(tl.int32)
    # ring.needs_prefold: fold before appending T records when h + T > L.
    if h + T <= L:
        return
    if h <= 0:
        return

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_c = tl.arange(0, BC)
    mk = o_k < K
    mv = o_v < V
    mc = o_c < h

    # u records as [BV, BC] (transposed view of [cap, V])
    p_u = ring_u + rrow * stride_u_slot + i_hv * CAP * V + o_c[None, :] * V + o_v[:, None]
    uT = tl.load(p_u, mask=mv[:, None] & mc[None, :], other=0.0).to(tl.float32)
    if PIPE > 0:
        # the checkpoint tile in K chunks of BKT through a software-pipelined loop (asynchronous copies into shared
        # memory), each chunk folded and written back as the next ones land: the tile is never whole in registers
        st_base = state + slot * stride_state_slot + i_hv * V * K
        if IS_KDA:
            g_base = ring_g + rrow * stride_g_slot + i_hv * CAP * K
        else:
            g_base = ring_g + rrow * stride_g_slot + i_hv * CAP
            Gh = tl.load(g_base + o_c, mask=mc, other=0.0)
            Glast = tl.load(g_base + (h - 1))
            uT = uT * tl.where(mc, tl.exp(tl.minimum(Glast - Gh, 0.0)), 0.0)[None, :]
        for c in tl.range(0, BK // BKT, num_stages=PIPE):
            o_kc = c * BKT + tl.arange(0, BKT)
            mkc = o_kc < K
            m_vk = mv[:, None] & mkc[None, :]
            m_ck = mc[:, None] & mkc[None, :]
            C_c = tl.load(st_base + o_v[:, None] * K + o_kc[None, :], mask=m_vk, other=0.0).to(tl.float32)
            kh_c = tl.load(ring_k + rrow * stride_k_slot + i_h * CAP * K + o_c[:, None] * K + o_kc[None, :],
                           mask=m_ck, other=0.0).to(tl.float32)
            if IS_KDA:
                Gh_c = tl.load(g_base + o_c[:, None] * K + o_kc[None, :], mask=m_ck, other=0.0)
                Gl_c = tl.load(g_base + (h - 1) * K + o_kc, mask=mkc, other=0.0)
                w_c = tl.where(m_ck, tl.exp(tl.minimum(Gl_c[None, :] - Gh_c, 0.0)), 0.0)
                S_c = C_c * tl.exp(Gl_c)[None, :] + tl.dot(uT, kh_c * w_c, input_precision=DOT_PRECISION)
            else:
                S_c = C_c * tl.exp(Glast) + tl.dot(uT, kh_c, input_precision=DOT_PRECISION)
            tl.store(st_base + o_v[:, None] * K + o_kc[None, :], S_c.to(state.dtype.element_ty), mask=m_vk)
        return

    p_C = state + slot * stride_state_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :]
    C = tl.load(p_C, mask=mv[:, None] & mk[None, :], other=0.0).to(tl.float32)
    p_k = ring_k + rrow * stride_k_slot + i_h * CAP * K + o_c[:, None] * K + o_k[None, :]
    kh = tl.load(p_k, mask=mc[:, None] & mk[None, :], other=0.0).to(tl.float32)

    if IS_KDA:
        g_base = ring_g + rrow * stride_g_slot + i_hv * CAP * K
        Gh = tl.load(g_base + o_c[:, None] * K + o_k[None, :], mask=mc[:, None] & mk[None, :], other=0.0)
        Glast = tl.load(g_base + (h - 1) * K + o_k, mask=mk, other=0.0)
        # exp(Gamma_h - Gamma_j) <= 1 for j < h
        w = tl.where(mc[:, None] & mk[None, :], tl.exp(tl.minimum(Glast[None, :] - Gh, 0.0)), 0.0)
        S = C * tl.exp(Glast)[None, :] + tl.dot(uT, kh * w, input_precision=DOT_PRECISION)
    else:
        g_base = ring_g + rrow * stride_g_slot + i_hv * CAP
        Gh = tl.load(g_base + o_c, mask=mc, other=0.0)
        Glast = tl.load(g_base + (h - 1))
        w = tl.where(mc, tl.exp(tl.minimum(Glast - Gh, 0.0)), 0.0)
        S = C * tl.exp(Glast) + tl.dot(uT * w[None, :], kh, input_precision=DOT_PRECISION)

    tl.store(p_C, S.to(p_C.dtype.element_ty), mask=mv[:, None] & mk[None, :])
    if HAS_RC:
        # two copies (issue 7): the read copy from the same unrounded fold (decode v3's rounding)
        sc = _rc_scale(tl.max(tl.abs(S), 1))
        _store_read_copy(rc + (rrow * HV + i_hv) * V * K + o_v[:, None] * K + o_k[None, :], S, sc,
                         mv[:, None] & mk[None, :], RC_FP8)
        if RC_FP8:
            tl.store(rc_scale + (rrow * HV + i_hv) * V + o_v, sc, mask=mv)


@triton.jit
def _store_draft_records(ring_k, g_base, rrow, stride_k_slot, h0, o_t, o_k, mt, mtk, k, Gref, Gl, i_s, i_h, i_hv,
                         H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, CAP, IS_KDA: tl.constexpr):
    """The drafts' key (once per key head) and log-decay records at ring positions h0..h0+T-1."""
    if i_s == 0:
        if i_hv == i_h * (HV // H):
            p_k = ring_k + rrow * stride_k_slot + i_h * CAP * K + (h0 + o_t)[:, None] * K + o_k[None, :]
            tl.store(p_k, k.to(p_k.dtype.element_ty), mask=mtk)
        if IS_KDA:
            p_g = g_base + (h0 + o_t)[:, None] * K + o_k[None, :]
            tl.store(p_g, Gref[None, :] + Gl, mask=mtk)
        else:
            tl.store(g_base + h0 + o_t, Gref + Gl, mask=mt)


@triton.jit
def _mm_small(x, y):
    """x [M, N] @ y [N, P] as an fp32 broadcast-reduce, for products whose inner axis is the draft axis (N = BT,
    4-8 at the usual T): tl.dot refuses an inner dimension below 16 (Triton 3.6, the H200's), and padding the
    draft axis to 16 for it would quadruple every [BV, BT] and [BT, BT, BK] tensor of the kernel at T = 4."""
    return tl.sum(x[:, :, None] * y[None, :, :], 1)


@triton.jit
def _ring_verify_kernel(
    mixed,
    a,
    b,
    A_log,
    dt_bias,
    out,
    state,
    ring_u,
    ring_k,
    ring_g,
    ring_h,
    slot_idx,
    scale,
    lower_bound,
    stride_mixed_tok,
    stride_a_tok,
    stride_b_tok,
    stride_state_slot,
    stride_u_slot,
    stride_k_slot,
    stride_g_slot,
    L,
    CAP,
    T: tl.constexpr,
    H: tl.constexpr,
    HV: tl.constexpr,
    K: tl.constexpr,
    V: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    BC: tl.constexpr,
    BT: tl.constexpr,
    VS: tl.constexpr,
    NLOG: tl.constexpr,
    IS_KDA: tl.constexpr,
    USE_LOWER_BOUND: tl.constexpr,
    SOFTPLUS_THRESHOLD: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    OUT_PRECISION: tl.constexpr,
    rc=None,
    rc_scale=None,
    rc_valid=None,
    HAS_RC: tl.constexpr = False,
    RC_FP8: tl.constexpr = False,
    ring_idx=None,
    HAS_RING_IDX: tl.constexpr = False,
    qk_scr=None,
    PIPE: tl.constexpr = 0,
    BKT: tl.constexpr = 32,
    PART: tl.constexpr = 0,
    SCR: tl.constexpr = 0,
    CKDOT: tl.constexpr = 0,
    PAIR_LOOP: tl.constexpr = False,
    ROW_ORDER: tl.constexpr = 0,
):
    # SCR: the scratch's floats per (row, value head) (_scratch_floats): the drafts' checkpoint-side vectors
    # [2, BT, BK]; for a split step (PART 1 writes, PART 2 reads) also the K-side results: s_k, s_q [BC, BT],
    # Ti, Fmat [BT, BT], beta, ecol [BT]
    # DOT_PRECISION: products that reach the records (and so the state): C k, history k-scores, the
    # solve. OUT_PRECISION: output-only products (C q, q-scores, F): their error never compounds.
    # ROW_ORDER (ring_verify's row_order): 0 grid (splits, B, HV); 1 grid (splits, HV, B), the rows outermost
    i_s = tl.program_id(0)
    i_n, i_hv = _row_and_head(1, ROW_ORDER == 1)
    i_h = i_hv // (HV // H)

    o_t = tl.arange(0, BT)
    o_k = tl.arange(0, BK)
    o_c = tl.arange(0, BC)
    mt = o_t < T
    mk = o_k < K
    mtk = mt[:, None] & mk[None, :]
    tok = i_n * T + o_t
    v_lo = i_s * VS

    slot, rrow = _slot_row(slot_idx, ring_idx, i_n, HAS_RING_IDX)  # state slot, ring row
    if slot < 0:
        # padded row: zeros out, touch no state, record or h
        if PART == 1:
            return
        for v0 in range(v_lo, v_lo + VS, BV):
            o_v = v0 + tl.arange(0, BV)
            mv = o_v < V
            p_o = out + tok[None, :] * (HV * V) + i_hv * V + o_v[:, None]
            tl.store(p_o, tl.zeros([BV, BT], dtype=tl.float32).to(p_o.dtype.element_ty), mask=mv[:, None] & mt[None, :])
        return

    h = tl.load(ring_h + rrow).to(tl.int32)
    # ring.verify_start: 0 after a pre-step fold (ring.needs_prefold: h + T > L), else h.
    h0 = tl.where(h + T > L, 0, h)
    mc = o_c < h0
    if HAS_RC:
        # two copies: a row that folded first reads the recurrence copy (the step runs from the new
        # checkpoint); any other row reads the read copy when it is current, else the recurrence copy
        from_rc = (h + T <= L) & (tl.load(rc_valid + rrow) == 1)

    if PART != 2:
        # ---- the T drafts: q, k (l2-normalised), beta, gates ----
        p_q = mixed + tok[:, None] * stride_mixed_tok + i_h * K + o_k[None, :]
        q = tl.load(p_q, mask=mtk, other=0.0).to(tl.float32)
        k = tl.load(p_q + H * K, mask=mtk, other=0.0).to(tl.float32)
        q = q / tl.sqrt(tl.sum(q * q, 1) + 1e-6)[:, None] * scale
        k = k / tl.sqrt(tl.sum(k * k, 1) + 1e-6)[:, None]

        bb = tl.load(b + tok * stride_b_tok + i_hv, mask=mt, other=0.0).to(tl.float32)
        beta = tl.where(mt, 1.0 / (1.0 + tl.exp(-bb)), 0.0)
        A_val = tl.load(A_log + i_hv).to(tl.float32)

        # strict lower (m < i) and causal (m <= i) masks over (i = row, m = column)
        strict = (o_t[None, :] < o_t[:, None]) & mt[:, None] & mt[None, :]
        causal = (o_t[None, :] <= o_t[:, None]) & mt[:, None] & mt[None, :]

        # history keys [BC, BK] (key head i_h), committed records only
        kh = tl.load(
            ring_k + rrow * stride_k_slot + i_h * CAP * K + o_c[:, None] * K + o_k[None, :],
            mask=mc[:, None] & mk[None, :],
            other=0.0,
        ).to(tl.float32)

        if IS_KDA:
            g_base = ring_g + rrow * stride_g_slot + i_hv * CAP * K
            aa = tl.load(a + tok[:, None] * stride_a_tok + i_hv * K + o_k[None, :], mask=mtk, other=0.0).to(tl.float32)
            dtb = tl.load(dt_bias + i_hv * K + o_k, mask=mk, other=0.0).to(tl.float32)
            x = aa + dtb[None, :]
            if USE_LOWER_BOUND:
                g = lower_bound * tl.sigmoid(tl.exp(A_val) * x)
            else:
                g = -tl.exp(A_val) * tl.where(x <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x)), x)
            g = tl.where(mtk, g, 0.0)
            Gl = tl.cumsum(g, axis=0)  # [BT, BK], <= 0
            Gref = tl.load(g_base + (h0 - 1) * K + o_k, mask=mk & (h0 > 0), other=0.0)  # [BK]
            el = tl.exp(Gl)  # exp(Gamma_i - G_ref) <= 1
            kq = k * el
            qq = q * el
            eg = tl.exp(Gref)
            kc = kq * eg[None, :]  # k_i * exp(Gamma_i)
            qc = qq * eg[None, :]
            # history scores: <k_j * exp(Gamma_i - Gamma_j), x_i> = <k_j exp(G_ref - Gamma_j), x_i exp(Gl_i)>
            Gh = tl.load(g_base + o_c[:, None] * K + o_k[None, :], mask=mc[:, None] & mk[None, :], other=0.0)
            khd = kh * tl.where(mc[:, None] & mk[None, :], tl.exp(tl.minimum(Gref[None, :] - Gh, 0.0)), 0.0)
            s_k = tl.dot(khd, tl.trans(kq), input_precision=DOT_PRECISION)  # [BC, BT]
            s_q = tl.dot(khd, tl.trans(qq), input_precision=OUT_PRECISION)
            # intra-window pair factors exp(Gl_i - Gl_m) per channel, m <= i (exponents <= 0)
            if PAIR_LOOP:
                # one draft m at a time (VERIFY_TUNED from T = 8): a [BT, BK] slice live instead of the [BT, BT, BK]
                # tensors below, whose registers grow with T^2 (KDA at T = 8: 1.16x -> 1.32x conventional, run 0421)
                Amat = tl.zeros([BT, BT], dtype=tl.float32)
                Fmat = tl.zeros([BT, BT], dtype=tl.float32)
                for m in tl.static_range(T):
                    sel = (o_t == m)[:, None]
                    k_m = tl.sum(tl.where(sel, k, 0.0), 0)  # [BK]
                    G_m = tl.sum(tl.where(sel, Gl, 0.0), 0)
                    e_m = tl.where((o_t >= m)[:, None] & mtk, tl.exp(tl.minimum(Gl - G_m[None, :], 0.0)), 0.0)
                    kEm = k_m[None, :] * e_m  # [i, K]: k_m * exp(Gl_i - Gl_m), rows i >= m
                    Amat += tl.where(o_t[None, :] == m, tl.sum(kEm * k, 1)[:, None], 0.0)
                    Fmat += tl.where(o_t[None, :] == m, tl.sum(kEm * q, 1)[:, None], 0.0)
                Amat = tl.where(strict, beta[:, None] * Amat, 0.0)
                Fmat = tl.where(causal, Fmat, 0.0)
            else:
                E3 = tl.where(causal[:, :, None], tl.exp(tl.minimum(Gl[:, None, :] - Gl[None, :, :], 0.0)), 0.0)
                kE = k[None, :, :] * E3  # [i, m, K]: k_m * exp(Gl_i - Gl_m)
                Amat = tl.where(strict, beta[:, None] * tl.sum(kE * k[:, None, :], 2), 0.0)
                Fmat = tl.where(causal, tl.sum(kE * q[:, None, :], 2), 0.0)
        else:
            g_base = ring_g + rrow * stride_g_slot + i_hv * CAP
            aa = tl.load(a + tok * stride_a_tok + i_hv, mask=mt, other=0.0).to(tl.float32)
            x = aa + tl.load(dt_bias + i_hv).to(tl.float32)
            g = -tl.exp(A_val) * tl.where(x <= SOFTPLUS_THRESHOLD, tl.log(1.0 + tl.exp(x)), x)
            g = tl.where(mt, g, 0.0)
            Gl = tl.cumsum(g, axis=0)  # [BT]
            Gref = tl.load(g_base + (h0 - 1), mask=h0 > 0, other=0.0)
            ecol = tl.exp(Gref + Gl)  # exp(Gamma_i), applied to the checkpoint products
            Gh = tl.load(g_base + o_c, mask=mc, other=0.0)
            wh = tl.where(mc[:, None] & mt[None, :], tl.exp(tl.minimum(Gref - Gh, 0.0))[:, None] * tl.exp(Gl)[None, :], 0.0)
            s_k = tl.dot(kh, tl.trans(k), input_precision=DOT_PRECISION) * wh  # [BC, BT]
            s_q = tl.dot(kh, tl.trans(q), input_precision=OUT_PRECISION) * wh
            D = tl.where(causal, tl.exp(tl.minimum(Gl[:, None] - Gl[None, :], 0.0)), 0.0)
            kk = tl.dot(k, tl.trans(k), input_precision=DOT_PRECISION)  # [i, m] = <k_i, k_m>
            qk = tl.dot(q, tl.trans(k), input_precision=OUT_PRECISION)  # [i, m] = <q_i, k_m>
            Amat = tl.where(strict, beta[:, None] * kk * D, 0.0)
            Fmat = tl.where(causal, qk * D, 0.0)

        # ---- UT transform: Ti = (I + A)^-1. A is strictly lower (nilpotent, A^T = 0), so
        # (I + A)^-1 = sum_{n<T} (-A)^n = (I - A)(I + A^2)(I + A^4)...: log2(T) small products ----
        eye = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
        Np = -Amat
        Ti = eye + Np
        for _j in tl.static_range(1, NLOG):
            Np = _mm_small(Np, Np)
            Ti = _mm_small(Ti, eye + Np)

    else:
        # the main launch of a split step: the K-side results of the pre launch (PART 1), same maths
        sb = qk_scr + (i_n * HV + i_hv) * SCR + 2 * BT * BK
        s_k = tl.load(sb + o_c[:, None] * BT + o_t[None, :])
        s_q = tl.load(sb + BC * BT + o_c[:, None] * BT + o_t[None, :])
        Ti = tl.load(sb + 2 * BC * BT + o_t[:, None] * BT + o_t[None, :])
        Fmat = tl.load(sb + 2 * BC * BT + BT * BT + o_t[:, None] * BT + o_t[None, :])
        beta = tl.load(sb + 2 * BC * BT + 2 * BT * BT + o_t)
        if not IS_KDA:
            ecol = tl.load(sb + 2 * BC * BT + 2 * BT * BT + BT + o_t)

    # ---- per V tile: checkpoint read once, history, solve, outputs, u records ----
    st_base = state + slot * stride_state_slot + i_hv * V * K
    u_base = ring_u + rrow * stride_u_slot + i_hv * CAP * V
    if PIPE > 0:
        if PART != 2:
            # the drafts' key and log-decay records before the V loop, so k and the gates hold no registers across
            # it (this launch reads ring positions below h0 only; the records go to h0..h0+T-1)
            _store_draft_records(ring_k, g_base, rrow, stride_k_slot, h0, o_t, o_k, mt, mtk, k, Gref, Gl, i_s, i_h,
                                 i_hv, H, HV, K, CAP, IS_KDA)
            # the drafts' checkpoint-side vectors ([2, BT, BK]: k then q rows) into this (row, value head)'s
            # scratch, so that the K-chunk loop below reads them as 4-byte asynchronous copies beside the tile
            # chunks (values the registers hold cannot be sliced per chunk; bf16 loads in the loop would stall it)
            scr = qk_scr + (i_n * HV + i_hv) * SCR + o_t[:, None] * BK + o_k[None, :]
            if IS_KDA:
                tl.store(scr, kc)
                tl.store(scr + BK * BT, qc)
            else:
                tl.store(scr, k)
                tl.store(scr + BK * BT, q)
            if PART == 1:
                # the pre launch of a split step: the K-side results for the main launch (PART 2), then done
                sb = qk_scr + (i_n * HV + i_hv) * SCR + 2 * BT * BK
                tl.store(sb + o_c[:, None] * BT + o_t[None, :], s_k)
                tl.store(sb + BC * BT + o_c[:, None] * BT + o_t[None, :], s_q)
                tl.store(sb + 2 * BC * BT + o_t[:, None] * BT + o_t[None, :], Ti)
                tl.store(sb + 2 * BC * BT + BT * BT + o_t[:, None] * BT + o_t[None, :], Fmat)
                tl.store(sb + 2 * BC * BT + 2 * BT * BT + o_t, beta)
                if not IS_KDA:
                    tl.store(sb + 2 * BC * BT + 2 * BT * BT + BT + o_t, ecol)
                return
            tl.debug_barrier()  # the scratch is written by other threads of this program than read it
        scr_t = qk_scr + (i_n * HV + i_hv) * SCR
    for v0 in range(v_lo, v_lo + VS, BV):
        o_v = v0 + tl.arange(0, BV)
        mv = o_v < V
        if PIPE > 0:
            # the [BV, K] tile in K chunks of BKT, software-pipelined over PIPE stages (asynchronous copies into
            # shared memory), each chunk multiplied into the [BV, BT] products as it lands: the whole tile is
            # never in registers. CKDOT 2 (VERIFY_TUNED since 2026-12-01): one tensor-core product of the chunk by the
            # stacked [k~; q~] rows at DOT_PRECISION (C k~_i reaches the records, so the state), the chunk split once.
            # CKDOT 1: C k~_i as its own product at DOT_PRECISION, C q~_i at OUT_PRECISION. CKDOT 0 (the default until
            # then): C k~_i in fp32 on the CUDA cores, one multiply-reduce per draft, chosen when the draft axis was
            # padded to 16 on the GPU and a 3xTF32 product of 16 columns cost half the step (H200 2026-11-30 10:23)
            wk = tl.zeros([BV, BT], dtype=tl.float32)
            wq = tl.zeros([BV, BT], dtype=tl.float32)
            if CKDOT == 2:
                wkq = tl.zeros([BV, 2 * BT], dtype=tl.float32)
            for c in tl.range(0, BK // BKT, num_stages=PIPE):
                o_kc = c * BKT + tl.arange(0, BKT)
                mkc = o_kc < K
                C_c = tl.load(st_base + o_v[:, None] * K + o_kc[None, :], mask=mv[:, None] & mkc[None, :],
                              other=0.0).to(tl.float32)
                if CKDOT == 2:
                    o_2t = tl.arange(0, 2 * BT)
                    kq_c = tl.load(scr_t + o_2t[:, None] * BK + o_kc[None, :])  # [2 BT, BKT]: k~ rows, then q~ rows
                    wkq = tl.dot(C_c, tl.trans(kq_c), acc=wkq, input_precision=DOT_PRECISION)
                else:
                    q_c = tl.load(scr_t + BT * BK + o_t[:, None] * BK + o_kc[None, :])  # [BT, BKT]
                    wq = tl.dot(C_c, tl.trans(q_c), acc=wq, input_precision=OUT_PRECISION)
                    if CKDOT == 1:
                        k_c = tl.load(scr_t + o_t[:, None] * BK + o_kc[None, :])  # [BT, BKT]
                        wk = tl.dot(C_c, tl.trans(k_c), acc=wk, input_precision=DOT_PRECISION)
                    else:
                        for i in tl.static_range(T):
                            k_ic = tl.load(scr_t + i * BK + o_kc)  # [BKT]
                            wk += tl.where(o_t[None, :] == i, tl.sum(C_c * k_ic[None, :], 1)[:, None], 0.0)
            if CKDOT == 2:
                wk, wq = tl.split(tl.permute(tl.reshape(wkq, [BV, 2, BT]), (0, 2, 1)))
            if not IS_KDA:
                wk = wk * ecol[None, :]
                wq = wq * ecol[None, :]
        elif HAS_RC:
            m_vk = mv[:, None] & mk[None, :]
            if from_rc:
                # no `other=` (the interpreter cannot make an fp8 fill): masked lanes zeroed after the cast
                C = tl.where(m_vk, tl.load(rc + (rrow * HV + i_hv) * V * K + o_v[:, None] * K + o_k[None, :],
                                           mask=m_vk).to(tl.float32), 0.0)
                if RC_FP8:
                    C = C * tl.load(rc_scale + (rrow * HV + i_hv) * V + o_v, mask=mv, other=1.0)[:, None]
            else:
                C = tl.load(st_base + o_v[:, None] * K + o_k[None, :], mask=m_vk, other=0.0).to(tl.float32)
        else:
            C = tl.load(st_base + o_v[:, None] * K + o_k[None, :], mask=mv[:, None] & mk[None, :], other=0.0).to(tl.float32)
        if PIPE == 0:
            if IS_KDA:
                wk = tl.dot(C, tl.trans(kc), input_precision=DOT_PRECISION)
                wq = tl.dot(C, tl.trans(qc), input_precision=OUT_PRECISION)
            else:
                wk = tl.dot(C, tl.trans(k), input_precision=DOT_PRECISION) * ecol[None, :]
                wq = tl.dot(C, tl.trans(q), input_precision=OUT_PRECISION) * ecol[None, :]
        uT = tl.load(u_base + o_c[None, :] * V + o_v[:, None], mask=mv[:, None] & mc[None, :], other=0.0).to(tl.float32)
        wk += tl.dot(uT, s_k, input_precision=DOT_PRECISION)
        wq += tl.dot(uT, s_q, input_precision=OUT_PRECISION)
        vv = tl.load(
            mixed + tok[None, :] * stride_mixed_tok + 2 * H * K + i_hv * V + o_v[:, None],
            mask=mv[:, None] & mt[None, :],
            other=0.0,
        ).to(tl.float32)
        R = beta[None, :] * (vv - wk)  # [BV, BT]
        U = _mm_small(R, tl.trans(Ti))  # U[:, i] = sum_m Ti[i, m] R[:, m]
        O = wq + _mm_small(U, tl.trans(Fmat))  # O[:, i] = Q_i + sum_m F[i, m] U[:, m]
        p_o = out + tok[None, :] * (HV * V) + i_hv * V + o_v[:, None]
        tl.store(p_o, O.to(p_o.dtype.element_ty), mask=mv[:, None] & mt[None, :])
        p_u = u_base + (h0 + o_t)[None, :] * V + o_v[:, None]
        tl.store(p_u, U.to(p_u.dtype.element_ty), mask=mv[:, None] & mt[None, :])

    if PIPE == 0:
        _store_draft_records(ring_k, g_base, rrow, stride_k_slot, h0, o_t, o_k, mt, mtk, k, Gref, Gl, i_s, i_h, i_hv,
                             H, HV, K, CAP, IS_KDA)


@triton.jit
def _ring_commit_kernel(ring_h, slot_idx, accepted, n_rows, T, L, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n_rows
    slot = tl.load(slot_idx + offs, mask=m, other=-1).to(tl.int64)
    valid = m & (slot >= 0)
    h = tl.load(ring_h + slot, mask=valid, other=0)
    acc = tl.load(accepted + offs, mask=valid, other=0).to(h.dtype)
    start = tl.where(h + T > L, 0, h)  # ring.verify_start
    tl.store(ring_h + slot, start + acc, mask=valid)


def ring_commit_(h: torch.Tensor, slot_idx: torch.Tensor, T: int, L: int, accepted: torch.Tensor,
                 ring_idx: torch.Tensor | None = None) -> torch.Tensor:
    """One-launch device form of ``ring.commit_verify_`` (same rule: h = verify_start(h) + accepted for
    rows with a slot; padded rows untouched), for the hot path; tests check the two agree.
    ``ring_idx`` [B]: h is indexed by ring row (``ring_idx``) instead of ``slot_idx``."""
    check_ring_idx(ring_idx, slot_idx)
    slot_idx = ring_rows(slot_idx, ring_idx)
    B = slot_idx.shape[0]
    if B:
        BLOCK = min(1024, triton.next_power_of_2(B))
        _ring_commit_kernel[(triton.cdiv(B, BLOCK),)](h, slot_idx, accepted, B, T, L, BLOCK=BLOCK)
    return h


def default_precision(device, state_dtype: torch.dtype = torch.float32) -> str:
    """Dot precision. NVIDIA GPUs: 'tf32x3' (three TF32 passes, about fp32) for an fp32 pool, whose
    accuracy the records must keep; 'tf32' (one pass, relative error ~5e-4, below the bf16 rounding of
    the pool itself) for a bf16 pool. Elsewhere (CPU interpreter, ROCm): 'ieee'.
    Measured on an H200 (benchmarks/results/verify-20261129-1859): one-pass TF32 is 2.7x faster than
    3xTF32 at B=256, T=4 (GDN); pass ``precision='tf32'`` to trade fp32 accuracy for that."""
    dev = torch.device(device)
    if dev.type == "cuda" and torch.version.hip is None:
        return "tf32x3" if state_dtype == torch.float32 else "tf32"
    return "ieee"


def _flat_tokens(x: torch.Tensor, BT_tokens: int, name: str) -> torch.Tensor:
    if x.dim() == 3:
        x = x.reshape(x.shape[0] * x.shape[1], x.shape[2])
    if x.dim() != 2 or x.shape[0] != BT_tokens:
        raise ValueError(f"`{name}` must be [B*T, ...] or [B, T, ...] with B*T={BT_tokens} tokens, got {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x


def _check(ring: ring_mod.Ring, state: torch.Tensor, slot_idx: torch.Tensor, T: int):
    lay = ring.layout
    ring.require_whole_records("the ring's verify launches (kernels/verify.py)")
    ring_mod.ring_capacity(lay.L, T)  # T <= L, with the fix in the message
    if T > lay.T_max:
        raise ValueError(f"T={T} exceeds the ring's T_max={lay.T_max}; allocate the ring with T_max >= {T}")
    if state.dim() != 4 or tuple(state.shape[1:]) != (lay.HV, lay.V, lay.K):
        raise ValueError(f"state pool must be [slots, HV={lay.HV}, V={lay.V}, K={lay.K}], got {tuple(state.shape)}")
    if state.stride(-1) != 1 or state.stride(-2) != lay.K or state.stride(-3) != lay.V * lay.K:
        raise ValueError("state pool slots must be contiguous [HV, V, K] blocks")
    if slot_idx.dim() != 1:
        raise ValueError("slot_idx must be 1-D [B]")
    for name in ("u", "k", "g"):
        t = getattr(ring, name)
        if not t[0].is_contiguous():
            raise ValueError(f"ring.{name} slots must be contiguous")


def _chunk_width(BK: int, chunk_bytes: int, state: torch.Tensor) -> int:
    """K elements per chunk of a pipelined tile read: chunk_bytes of one checkpoint row, at least 16 (tl.dot's
    smallest K), at most the padded K."""
    return min(BK, max(16, chunk_bytes // state.element_size()))


def ring_prefold(state, slot_idx, ring: ring_mod.Ring, T: int, *, block_v: int = 64, num_warps: int = 4, precision: str | None = None,
                 ring_idx: torch.Tensor | None = None, pipe_stages: int = 0, chunk_bytes: int = 128,
                 row_order: str = "grid"):
    """Launch 1: fold the committed records of rows with h + T > L into their checkpoint (``ring_idx``:
    as in ``ring_verify``). pipe_stages > 0: the tile folded in K chunks of ``chunk_bytes`` per row through a
    software-pipelined loop (not with a read copy, whose fp8 scales need the whole row; built and CPU-tested
    2026-11-30, not yet timed). row_order: "grid" (V-tiles, rows, value heads) or "rows" (the rows outermost, as
    ``ring_verify``'s row_order)."""
    check_ring_idx(ring_idx, slot_idx)
    ring.require_whole_records("the ring's pre-fold (verify.ring_prefold)")
    lay = ring.layout
    B = slot_idx.shape[0]
    if B == 0:
        return
    BK = triton.next_power_of_2(lay.K)
    BV = min(block_v, triton.next_power_of_2(lay.V))
    BC = max(16, triton.next_power_of_2(lay.cap))
    precision = precision or default_precision(state.device, state.dtype)
    order = dispatch_order("row_order", row_order, PRE_ORDERS)
    grid = dispatch_grid(B, lay.HV, order == 1, triton.cdiv(lay.V, BV))
    has_rc = ring.rc is not None
    if pipe_stages < 0:
        raise ValueError(f"pipe_stages must be >= 0, got {pipe_stages}")
    pipe = 0 if has_rc else int(pipe_stages)
    BKT = _chunk_width(BK, chunk_bytes, state)
    _ring_prefold_kernel[grid](
        state, ring.u, ring.k, ring.g, ring.h, slot_idx,
        state.stride(0), ring.u.stride(0), ring.k.stride(0), ring.g.stride(0),
        T, lay.L, lay.cap, H=lay.HK, HV=lay.HV, K=lay.K, V=lay.V,
        BK=BK, BV=BV, BC=BC, IS_KDA=(lay.kind == "kda"), DOT_PRECISION=precision,
        rc=ring.rc if has_rc else state, rc_scale=ring.rc_scale if ring.rc_scale is not None else state,
        HAS_RC=has_rc, RC_FP8=ring.rc_scale is not None,
        ring_idx=ring_idx, HAS_RING_IDX=ring_idx is not None, PIPE=pipe, BKT=BKT, ROW_ORDER=order,
        num_warps=num_warps, num_stages=max(1, pipe),
    )


def ring_verify(
    mixed_qkv: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    slot_idx: torch.Tensor,
    ring: ring_mod.Ring,
    T: int,
    *,
    scale: float | None = None,
    out: torch.Tensor | None = None,
    lower_bound: float | None = None,
    block_v: int | None = None,
    nsplit: int = 1,
    num_warps: int | None = None,
    fold_block_v: int = 64,
    fold_num_warps: int = 4,
    precision: str | None = None,
    out_precision: str | None = None,
    ring_idx: torch.Tensor | None = None,
    pipe_stages: int | None = None,
    chunk_bytes: int = 128,
    split: bool | None = None,
    fold_pipe_stages: int | None = None,
    ck_dot: int | None = None,
    maxnreg: int | None = None,
    pair_loop: bool | None = None,
    row_order: str | None = None,
) -> torch.Tensor:
    """One verify step of T draft tokens per row, in the ring.

    mixed_qkv: [B*T, 2*H*K + HV*V] or [B, T, ...] post-conv q|k|v (SGLang's packed layout);
    a: [B*T, HV] (GDN) or [B*T, HV*K] (KDA); b: [B*T, HV]; A_log: [HV]; dt_bias: [HV] or [HV*K];
    state: the pool [slots, HV, V, K] (fp32 or bf16), written only by a pre-step fold;
    slot_idx: [B] int (-1 = padded row: zero output, nothing touched); ring: from ring.py.
    ring_idx: [B] int, the ring row of each row (a ring keyed by request row); None: the ring row is the
    slot. A row with either index < 0 is padding.
    Returns out [B*T, HV, V] (dtype of mixed_qkv unless ``out`` is given). Does not change ring.h:
    call ``ring.commit_verify_(ring.h, slot_idx, T, L, accepted, ring_idx)`` after acceptance.
    pipe_stages > 0: the checkpoint tile is read in K chunks of ``chunk_bytes`` per row by a loop Triton
    software-pipelines over that many stages, each chunk multiplied into the T products as it lands (the drafts'
    vectors go through a small scratch, 8 KiB per row and value head); 0: the tile read in one piece.
    None: ``VERIFY_TUNED`` (rings with a read copy always read in one piece).
    block_v, num_warps: the V-tile and warps per program; None: ``VERIFY_TUNED`` for the layer kind (with a read
    copy: 32 and 4, the one-piece read's).
    split: two launches, as decode v3 splits a decode step: a pre launch, one program per (row, value head) with
    ``num_warps``, does the K-side work (norms, gates, history scores, the T x T inverse) into the scratch, then a
    main launch, one program per (row, value head, V-tile of ``block_v``), streams its tile through the pipelined
    read and finishes the outputs and records. Needs the pipelined read; not with a read copy. None: VERIFY_TUNED
    (off: measured slower, see the module docstring).
    fold_pipe_stages: ``ring_prefold``'s pipe_stages for the pre-step fold; None: VERIFY_TUNED (3; 0 with a read
    copy).
    ck_dot: with the pipelined read, how the drafts' checkpoint products C k~_i are taken: 0, one fp32 multiply-reduce
    per draft on the CUDA cores; 1, a tensor-core product at ``precision`` beside C q~'s; 2, one product of each
    chunk by the stacked [k~; q~] rows at ``precision`` (C q~ too). None: VERIFY_TUNED (2 since 2026-12-01).
    maxnreg: a register cap for the verify launch (ptxas maxnreg, 24-255; GPU only). None: VERIFY_TUNED's (KDA 168)
    when the launch is VERIFY_TUNED's (no block_v, num_warps, pipe_stages, split or ck_dot given), else none.
    pair_loop: KDA's intra-window pair factors one draft at a time ([T, K] live instead of [T, T, K]). None:
    VERIFY_TUNED (KDA: on from T = 8, where it measured faster; off below). No effect for GDN, whose pair factors are
    scalars.
    row_order: the dispatch order of the pre-step fold's and the verify launch's programs: "grid" (V-splits, rows,
    value heads: each head's sweep over the batch in turn) or "rows" (the rows outermost, a row's heads together,
    as decode v3's row_order "rows", which the H200 measured faster for every fp32-state decode in session 23).
    None: VERIFY_TUNED ("rows" for the pipelined launch since session 24, 0.2-1.8% faster on the H200; "grid" for
    rings with a read copy, not timed in the other order). What is computed does not change.
    """
    lay = ring.layout
    _check(ring, state, slot_idx, T)
    check_ring_idx(ring_idx, slot_idx)
    B = slot_idx.shape[0]
    N = B * T
    mixed_qkv = _flat_tokens(mixed_qkv, N, "mixed_qkv")
    a = _flat_tokens(a, N, "a")
    b = _flat_tokens(b, N, "b")
    H, HV, K, V = lay.HK, lay.HV, lay.K, lay.V
    if mixed_qkv.shape[1] != 2 * H * K + HV * V:
        raise ValueError(f"mixed_qkv width {mixed_qkv.shape[1]} != 2*H*K + HV*V = {2 * H * K + HV * V}")
    is_kda = lay.kind == "kda"
    if a.shape[1] != (HV * K if is_kda else HV) or b.shape[1] != HV:
        raise ValueError(f"a must be [B*T, {'HV*K' if is_kda else 'HV'}] and b [B*T, HV]")
    if dt_bias.numel() != (HV * K if is_kda else HV) or A_log.numel() != HV:
        raise ValueError("A_log must have HV entries and dt_bias HV (GDN) or HV*K (KDA)")
    if lower_bound is not None and not is_kda:
        raise ValueError("lower_bound (KDA safe gate) applies to KDA only")
    if scale is None:
        scale = K ** -0.5
    if out is None:
        out = torch.empty(N, HV, V, dtype=mixed_qkv.dtype, device=mixed_qkv.device)
    else:
        if not out.is_contiguous() or out.numel() != N * HV * V:
            raise ValueError(f"out must be a contiguous buffer of {N}x{HV}x{V} elements")
        out = out.view(N, HV, V)
    if B == 0:
        return out
    precision = precision or default_precision(mixed_qkv.device, state.dtype)
    # output-only products: one-pass TF32 on NVIDIA unless asked otherwise (outputs are consumed in
    # the activation dtype and their error does not compound)
    out_precision = out_precision or ("tf32" if precision in ("tf32x3", "tf32") else precision)

    # launch choices, checked before anything is launched
    tuned = VERIFY_TUNED[lay.kind] if ring.rc is None else VERIFY_ONE_PIECE
    block_v_arg, num_warps_arg, split_arg = block_v, num_warps, split
    block_v = tuned["block_v"] if block_v is None else block_v
    num_warps = tuned["num_warps"] if num_warps is None else num_warps
    pipe = int(tuned["pipe_stages"] if pipe_stages is None else pipe_stages)
    if pipe < 0:
        raise ValueError(f"pipe_stages must be >= 0, got {pipe_stages}")
    if ring.rc is not None:
        pipe = 0  # the read copy's tile (bf16 / fp8, or the recurrence copy by row) is read in one piece
    if chunk_bytes not in (64, 128, 256, 512):
        raise ValueError(f"chunk_bytes must be 64, 128, 256 or 512, got {chunk_bytes}")
    split = bool(tuned.get("split", False) if split is None else split)
    if split:
        if ring.rc is not None:
            raise ValueError("split=True reads the checkpoint through the pipelined read: not with a read copy")
        if pipe == 0:
            raise ValueError("split=True needs the pipelined tile read (pipe_stages > 0)")
    fold_pipe = tuned.get("fold_pipe_stages", 0) if fold_pipe_stages is None else fold_pipe_stages
    # the tuned register cap belongs to the tuned launch: a caller who chooses the tile, warps or products gets none
    own_launch = any(x is not None for x in (block_v_arg, num_warps_arg, pipe_stages, split_arg, ck_dot))
    if ck_dot is None:
        ck_dot = tuned.get("ck_dot", 0) if pipe > 0 else 0
    if ck_dot not in (0, 1, 2):
        raise ValueError(f"ck_dot must be 0, 1 or 2, got {ck_dot}")
    if ck_dot and pipe == 0:
        raise ValueError("ck_dot chooses the products of the pipelined tile read (pipe_stages > 0): not with "
                         "pipe_stages=0 or a read copy")
    if maxnreg is None and not own_launch:
        maxnreg = tuned.get("maxnreg")
    launch_opts = _maxnreg_opts("maxnreg", maxnreg, state.device)

    row_order = tuned.get("row_order", "grid") if row_order is None else row_order
    order = dispatch_order("row_order", row_order, PRE_ORDERS)
    ring_prefold(state, slot_idx, ring, T, block_v=fold_block_v, num_warps=fold_num_warps, precision=precision,
                 ring_idx=ring_idx, pipe_stages=fold_pipe, chunk_bytes=chunk_bytes, row_order=row_order)

    BK = triton.next_power_of_2(K)
    BV = min(block_v, triton.next_power_of_2(V))
    BC = max(16, triton.next_power_of_2(lay.cap))
    # the draft axis padded to a power of two, no further: no tl.dot has it as its inner dimension (_mm_small)
    BT = max(VERIFY_BT_MIN, triton.next_power_of_2(T))
    NLOG = max(1, (T - 1).bit_length())  # factors (I + (-A)^(2^j)), j < NLOG, cover powers < T
    VS = triton.cdiv(triton.cdiv(V, nsplit), BV) * BV
    nsplit = triton.cdiv(V, VS)
    grid = dispatch_grid(B, HV, order == 1, nsplit)
    if pair_loop is None:  # VERIFY_TUNED: from pair_loop_min_T drafts on (KDA)
        pair_loop = T >= tuned.get("pair_loop_min_T", T + 1)
    pair_loop = bool(pair_loop)
    pipe_kw = dict(CKDOT=ck_dot, PAIR_LOOP=pair_loop and is_kda, launch_opts=launch_opts, ROW_ORDER=order)
    if pipe > 0:
        pipe_kw.update(PIPE=pipe, BKT=_chunk_width(BK, chunk_bytes, state))
    if split:
        pipe_kw["split"] = True
        VS = BV  # the main launch: one V-tile per program
        nsplit = triton.cdiv(V, VS)
        grid = dispatch_grid(B, HV, order == 1, nsplit)
    _launch_verify(grid, BT, NLOG, BK, BV, BC, VS, mixed_qkv, a, b, A_log, dt_bias, out, state, ring, slot_idx,
                   scale, lower_bound, lay, T, H, HV, K, V, is_kda, precision, num_warps, out_precision, ring_idx,
                   **pipe_kw)
    if ring.rc is not None:
        # the rows that folded first wrote both copies: their read copy is current now
        rows = ring_rows(slot_idx, ring_idx)
        hh = ring.h[rows.clamp(min=0).long()]
        pre = ring_mod.needs_prefold(hh, T, lay.L) & (hh > 0)
        set_rc_valid_(ring, torch.where(pre, rows, torch.full_like(rows, -1)), 1)
    return out


# The smallest draft-axis tile. Until 2026-12-01 the products over the draft axis were tl.dots, which Triton 3.6 (the
# H200's) refuses below 16 on the inner axis: the launch caught the error and retried at BT = 16, so the GPU ran T = 4
# with every draft-axis tensor four times its size (KDA's [BT, BT, BK] pair factors at 128 registers per thread alone).
VERIFY_BT_MIN = 2
# ring_verify's launch choices when the caller gives none, per layer kind (no read copy). H200, 2026-11-30
# (benchmarks/results/verify-20261130-{1030,1039}.*, fp32 pool, fp32 records, L = 16, B = 256, T = 4, all accepted;
# us per verify + commit step): GDN one-piece read (BV 32, 4 warps) 982, pipelined BV x warps 32x4 1055, 64x4 665,
# 64x8 1164, 128x4 627, 128x8 933; KDA one piece 3462, pipelined 64x4 2914, 64x8 2003, 128x4 3192, 128x8 1745.
# Conventional: 978 (GDN) / 994 (KDA). At B = 1 (run 1039): GDN 14-17 us pipelined vs 23 one piece.
# GDN 128 x 4 since 2026-11-30 12:50 (verify-20261130-1250: 627 vs 665 us at B = 256, T = 4, all accepted; 167 vs
# 177 at B = 64), once its multi-step float64 GPU tests passed (test_gpu_pipelined_tile_read, fp32 pools, same call;
# bf16 pools in run 1254). The pre-step fold pipelined over K chunks (fold_pipe_stages 3) since run 1254
# (verify-20261130-1254, B = 256, T = 4, us per step all accepted / all rejected: GDN 621.5 -> 609.9 / 574.8 -> 568.2,
# KDA 1739.5 -> 1684.9 / 1673.6 -> 1642.3); its multi-step GPU tests are the split cases of
# test_gpu_pipelined_tile_read (fp32 pools in run 1250, bf16 pools in run 1254), which fold with it.
# BV 64 x 2 warps for both kinds since 2026-12-01 (verify-20261201-0237, the first run without the draft axis padded
# to 16; B = 256, T = 4, all accepted, us per step: GDN 128x4 585.4, 64x4 676.1, 32x4 997.3, 64x2 541.3, 32x2 614.7;
# KDA 128x8 952.7, 128x4 660.7, 64x2 621.3, 32x2 697.4; B = 64 the same order), with its multi-step float64 GPU tests
# in the same call (test_gpu_pipelined_tile_read 64x2, fp32 and bf16 pools, GDN and KDA).
# The drafts' checkpoint products as one tensor-core product of each chunk by the stacked [k~; q~] rows at the pool's
# precision (ck_dot 2) since 2026-12-01 02:43 (verify-20261201-0243, same shapes, us per step all accepted / all
# rejected): GDN 540.1 -> 365.9 / 498.7 -> 323.4 (2.67x conventional 975.2, 1.55x upstream's ring 565.9), with a
# 168-register cap 365.3 (no gain: none for GDN); KDA 625.2 -> 452.0, with the cap 402.0 / 353.2 (2.45x conventional
# 985.1); ck_dot 1 (C k~ as its own product) 373.4 / 464.2; ck_dot 2 at 64 x 4 475.3 / 445.8, 128 x 4 417.6 / 494.8;
# the caps alone 538.5 (168) / 574.8 (128, GDN) / 580.1 (KDA 168). Output RMS against float64 0.00168 (GDN) /
# 0.00166 (KDA) against 0.00184 / 0.00182 before (C q~ at 3xTF32 now too; SGLang's conventional verify 0.00166).
# GPU float64 tests of each option in the same call (test_gpu_verify_options, 10/10).
# KDA's pair factors one draft at a time (pair_loop) from T = 8 on, since 2026-12-01 04:21 (verify-20261201-0421,
# B = 256, us per step all accepted / all rejected): T = 8 1347.2 -> 1189.2 / 1215.8 -> 1056.6 (1.16x -> 1.32x /
# 1.29x -> 1.48x conventional, 1564.9), T = 4 401.5 -> 450.7 (slower: off below 8); without the register cap 1351.4
# (T = 8), at 64 x 4 1682.2. GPU float64 tests of pair_loop in the same call (2/2).
# The rows outermost (row_order "rows") since 2026-12-02 16:03 (verify-20261202-1603-rows, B = 256, us per step, all
# accepted / all rejected, grid -> rows): GDN T = 4 363.2 -> 356.6 / 321.1 -> 316.0, T = 8 827.2 -> 818.4 / 705.6 ->
# 704.3; KDA T = 4 398.6 -> 393.7 / 351.4 -> 348.3, T = 8 1183.1 -> 1174.5 / 1054.5 -> 1049.9: 0.2-1.8%, faster in all
# eight cells of one call; GPU float64 tests of the order in the same call (test_row_order, 4/4). The read-copy
# launch (VERIFY_ONE_PIECE) was not timed in that order and keeps the grid's.
VERIFY_TUNED = {"gdn": dict(pipe_stages=3, block_v=64, num_warps=2, fold_pipe_stages=3, ck_dot=2, row_order="rows"),
                "kda": dict(pipe_stages=3, block_v=64, num_warps=2, fold_pipe_stages=3, ck_dot=2, maxnreg=168,
                            pair_loop_min_T=8, row_order="rows")}
VERIFY_ONE_PIECE = dict(pipe_stages=0, block_v=32, num_warps=4)  # rings with a read copy


def _scratch_floats(BT: int, BK: int, BC: int) -> int:
    """The verify kernel's scratch per (row, value head), fp32 elements (its SCR): k and q rows [2, BT, BK], then
    s_k, s_q [BC, BT], Ti, Fmat [BT, BT], beta, ecol [BT]."""
    return 2 * BT * BK + 2 * BC * BT + 2 * BT * BT + 2 * BT


def _launch_verify(grid, BT, NLOG, BK, BV, BC, VS, mixed_qkv, a, b, A_log, dt_bias, out, state, ring, slot_idx,
                   scale, lower_bound, lay, T, H, HV, K, V, is_kda, precision, num_warps, out_precision, ring_idx=None,
                   PIPE=0, BKT=32, split=False, CKDOT=0, PAIR_LOOP=False, launch_opts=None, ROW_ORDER=0):
    B = grid[1] if ROW_ORDER == 0 else grid[2]
    # scratch of the pipelined read per (row, value head), fp32: the drafts' k and q vectors, and for a split step the
    # pre launch's K-side results
    scr = _scratch_floats(BT, BK, BC)
    qk_scr = torch.empty(B * HV * scr if PIPE else 1, dtype=torch.float32, device=state.device)
    parts = ((1, dispatch_grid(B, HV, ROW_ORDER == 1, 1)), (2, grid)) if split else ((0, grid),)
    for part, g in parts:
        _launch_verify_part(part, g, BT, NLOG, BK, BV, BC, VS, mixed_qkv, a, b, A_log, dt_bias, out, state, ring,
                            slot_idx, scale, lower_bound, lay, T, H, HV, K, V, is_kda, precision, num_warps,
                            out_precision, ring_idx, PIPE, BKT, qk_scr, scr, CKDOT, PAIR_LOOP, launch_opts or {},
                            ROW_ORDER)


def _launch_verify_part(part, grid, BT, NLOG, BK, BV, BC, VS, mixed_qkv, a, b, A_log, dt_bias, out, state, ring,
                        slot_idx, scale, lower_bound, lay, T, H, HV, K, V, is_kda, precision, num_warps, out_precision,
                        ring_idx, PIPE, BKT, qk_scr, scr, CKDOT, PAIR_LOOP, launch_opts, ROW_ORDER=0):
    _ring_verify_kernel[grid](
        mixed_qkv, a, b, A_log, dt_bias, out, state, ring.u, ring.k, ring.g, ring.h, slot_idx,
        float(scale), float(lower_bound) if lower_bound is not None else 0.0,
        mixed_qkv.stride(0), a.stride(0), b.stride(0), state.stride(0),
        ring.u.stride(0), ring.k.stride(0), ring.g.stride(0),
        lay.L, lay.cap, T=T, H=H, HV=HV, K=K, V=V,
        BK=BK, BV=BV, BC=BC, BT=BT, VS=VS, NLOG=NLOG,
        IS_KDA=is_kda, USE_LOWER_BOUND=lower_bound is not None, SOFTPLUS_THRESHOLD=20.0,
        DOT_PRECISION=precision,
        OUT_PRECISION=out_precision,
        rc=ring.rc if ring.rc is not None else state,
        rc_scale=ring.rc_scale if ring.rc_scale is not None else state,
        rc_valid=ring.rc_valid if ring.rc_valid is not None else ring.h,
        HAS_RC=ring.rc is not None, RC_FP8=ring.rc_scale is not None,
        ring_idx=ring_idx, HAS_RING_IDX=ring_idx is not None,
        qk_scr=qk_scr, PIPE=PIPE, BKT=BKT, PART=part, SCR=scr, CKDOT=CKDOT, PAIR_LOOP=PAIR_LOOP,
        ROW_ORDER=ROW_ORDER, num_warps=num_warps, num_stages=max(1, PIPE), **launch_opts,
    )


# ----------------------------------------------------------------------------------------------
# extra_buffer tracking under verify: a draft's exact state into a track slot, without a host sync
# ----------------------------------------------------------------------------------------------

@triton.jit
def _materialize_kernel(
    temporal, ring_u, ring_k, ring_g, ring_h, src, dst, steps, src_rows, T, L, ROWS,
    s_t_layer, s_t_slot, s_u_layer, s_u_row, s_k_layer, s_k_row, s_g_layer, s_g_row, s_h_layer,
    HV: tl.constexpr, HK: tl.constexpr, K: tl.constexpr, V: tl.constexpr, CAP: tl.constexpr, GK: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, IS_KDA: tl.constexpr, HAS_RING_IDX: tl.constexpr = False,
):
    """One (V-tile, row, layer x value head): temporal[layer, dst] = the state of live slot src after its
    first n = verify_start(h) + steps + 1 records (the fold's math on a prefix of the ring); rows with
    steps < 0, src < 0 or dst < 0 do nothing. The live checkpoint, records and h are only read. The records
    are those of ring row src_rows[row] (HAS_RING_IDX; < 0: nothing done), else of ring row src."""
    i_v = tl.program_id(0)
    i_n = tl.program_id(1)
    i_lh = tl.program_id(2)
    li = i_lh // HV
    i_hv = i_lh % HV
    i_hk = i_hv // (HV // HK)
    st = tl.load(steps + i_n).to(tl.int32)
    s, r = _slot_row(src, src_rows, i_n, HAS_RING_IDX)  # live state slot, its ring row
    d = tl.load(dst + i_n).to(tl.int64)
    if (st >= 0) & (s >= 0) & (d >= 0):
        r = tl.where(r < ROWS, r, 0)  # ReplayPool._rows_of: a slot without ring storage has h = 0
        hh = tl.load(ring_h + li * s_h_layer + r).to(tl.int32)
        n = tl.where(hh + T > L, 0, hh) + st + 1  # ring.verify_start(h, T, L) + steps + 1
        o_v = i_v * BV + tl.arange(0, BV)
        o_k = tl.arange(0, BK)
        mv = o_v < V
        mk = o_k < K
        m_vk = mv[:, None] & mk[None, :]
        C = tl.load(temporal + li * s_t_layer + s * s_t_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                    mask=m_vk, other=0.0).to(tl.float32)
        base_u = ring_u + li * s_u_layer + r * s_u_row + i_hv * CAP * V
        base_k = ring_k + li * s_k_layer + r * s_k_row + i_hk * CAP * K
        base_g = ring_g + li * s_g_layer + r * s_g_row + i_hv * CAP * GK
        has = n > 0
        if IS_KDA:
            G_ref = tl.load(base_g + (n - 1) * GK + o_k, mask=mk & has, other=0.0)
        else:
            G_ref = tl.load(base_g + (n - 1), mask=has, other=0.0)
        S = _fold_records(C, G_ref, n, base_u, base_k, base_g, o_v, o_k, mv, mk, V, K, GK, CAP, IS_KDA)
        tl.store(temporal + li * s_t_layer + d * s_t_slot + i_hv * V * K + o_v[:, None] * K + o_k[None, :],
                 S.to(temporal.dtype.element_ty), mask=m_vk)


def ring_materialize_(temporal: torch.Tensor, u: torch.Tensor, k: torch.Tensor, g: torch.Tensor, h: torch.Tensor,
                      layout, src: torch.Tensor, dst: torch.Tensor, steps: torch.Tensor, T: int,
                      block_v: int = 32, num_warps: int = 4, ring_idx: torch.Tensor | None = None) -> None:
    """temporal[:, dst[r]] = the exact state of live slot src[r] after draft steps[r] of the verify step just
    run, for every row r with steps, src and dst >= 0, in every layer (stacked tensors: temporal [layers,
    slots, HV, V, K], u/k/g/h [layers, rows, ...] as ReplayPool holds them). One launch, no host sync
    (graph-capturable); rows without a boundary return at once. ``ring_idx`` [B]: the ring row holding
    src[r]'s records (a ring keyed by request row); None: the ring row is src[r]."""
    check_ring_idx(ring_idx, src)
    B = src.shape[0]
    if B == 0:
        return
    nl = temporal.shape[0]
    HV, V, K = layout.HV, layout.V, layout.K
    BK = triton.next_power_of_2(K)
    BV = min(block_v, triton.next_power_of_2(V))
    grid = (triton.cdiv(V, BV), B, nl * HV)
    _materialize_kernel[grid](
        temporal, u, k, g, h, src, dst, steps, ring_idx if ring_idx is not None else src, int(T), int(layout.L),
        h.shape[1],
        temporal.stride(0), temporal.stride(1), u.stride(0), u.stride(1), k.stride(0), k.stride(1),
        g.stride(0), g.stride(1), h.stride(0),
        HV=HV, HK=layout.HK, K=K, V=V, CAP=layout.cap, GK=layout.GK, BK=BK, BV=BV,
        IS_KDA=(layout.kind == "kda"), HAS_RING_IDX=ring_idx is not None, num_warps=num_warps,
    )

#!/usr/bin/env python3
"""Decode-kernel benchmark (GPU): conventional vs upstream ReplaySSM vs ours, one run, one GPU.

Arms (per layer kind, state dtype and batch size B):
  conv        SGLang 0.5.17's Triton packed decode (fused_recurrent_{gated_delta_rule,kda}_packed_decode)
  conv_cuda   SGLang 0.5.17's KDA CUDA row-streaming packed decode (fp32 state, B >= 8), if it loads
  upstream    SGLang 0.5.17's fused_recurrent_linear_replayssm_decode (bf16 records, host cursors)
  ours        kernels/decode.py, L = 16 (records fp32 and bf16: ours_r32, ours_r16)
  ours_L1     kernels/decode.py run with window 1 (the small-batch policy's conventional-equivalent path)
  v2_r16/r32  kernels/decode_v2.py (replay_decode(impl="v2")), bf16 / fp32 records, h read from the ring and
              advanced by its one-program-per-row post launch (a drop-in for ours_*: same ring, same rule)
  v2_r16_rows the v2 kernel alone with per-row h given by the caller (h_rows, advance_h=False): what each
              layer costs when one model-wide h is advanced once per forward (docs/design.md); the same
              conditions as upstream's arm (cursors supplied per row, (row + step) % 16)
  v2_r16_unroll  (--variants unroll) v2 with the fold loop unrolled over the ring capacity
  v2_r16_all  (--variants all) v2 loading every ring position without waiting for h (records="all")
  v3_r16/r32   kernels/decode_v3.py (replay_decode(impl="v3")) with its defaults, decode_v3.V3_TUNED: since
              2026-11-29 23:41 the software-pipelined tile read for fp32 states (before: chunks in registers)
  ours_w1     (--variants w1, B <= 128) kernels/decode_w1.py: the window-1 kernel the small-batch policy runs
  v3_r32_preregN (--variants prereg, fp32 states, B >= 128) the pre launch capped at N registers (64: one wave)
  *_aligned   (--variants aligned, B >= 128) upstream and v3 with every row on the same cursor (all checkpoint
              writes in one step of L, as in a batch that started together) instead of staggered cursors
  v3p_*_rowsN (--variants prerows, fp32 states, B >= 128) the PDL arms with N rows per pre-launch program
  v3_*_srv, v3_*_nomma, v3_r16_s18, v3_rc_fp8_mma (--variants mma, GDN) decode v3's server launches (V3_TUNED:
              tile_mma, the tile's dots on the tensor cores, for bf16 states and the bf16 copies) beside the same
              without tile_mma, the bf16 state's launch of session 18, and the fp8 copy with tile_mma;
              KDA: v3_*_srv beside v3_r16_mma, v3_r16_mma_p3 (its split-operand tile_mma) and v3_r16_p3
              (v3_r16_mma_p3's launch without tile_mma); the bf16 copy (tile_mma, read pipelined: V3_TUNED since
              session 21) beside v3_rc_bf16_s20 (its launch before), v3_rc_bf16_nomma, v3_rc_bf16_mma_u
  v3_r32*_rows, *_ff, *_ff_m96, *_aligned (--variants order, fp32 states, B >= 128; KDA also with predecayed keys,
              v3_r32_pred*) the main launch's programs dispatched rows outermost, in batch order / with the rows that
              write their checkpoint this step first (decode_v3 row_order "flush_first"), and that capped at 96
              registers, beside every row on the same cursor; and as the server launches it (v3_sl*: the ring keyed
              by request row, a forced mask, V3_TUNED; KDA predecayed) with and without each read copy
              (v3_rc_bf16_sl*, v3_rc_fp8_sl*): in the grid order (*_grid), as tuned (rows outermost since session
              23), with the pre launch's rows outermost as well (*_pre: pre_order "rows"), and two value heads per
              program (*_hpp2; not for the fp8 copy, which has two already)
  v3_sl_mN, v3_rc_fp8_sl_mN (--variants regcap, fp32 states, B = 256) the server's launch (as v3_sl, v3_rc_fp8_sl)
              with the main launch capped at N registers
  v3_sl_cu_* (--variants cuda, GDN fp32, B >= 128) the server's launch with the main launch in CUDA
              (kernels/gdn_main.cu) in each block shape of cuda_main.CUDA_CONFIGS; _nopdl without PDL; _aligned
              (one pool) every row on the same cursor, beside v3_sl / v3_sl_aligned (Triton); _main the main launch
              alone; _pre, _post, _premain, _mainpost those launches alone; *_r16 (and v3_sl_r16, Triton's) with
              bf16 records; _stream / _nofold diagnostics (wrong results); with --variants cuda,curr also v3_sl_rr,
              v3_sl_cu_rr and v3_sl_sp_rr: Triton's, CUDA's (g8w4) and self_pre timed round-robin over six rounds
  v3_sl_cu_* (--variants cuda16, GDN bf16 state, B >= 128) the server's launch with the main launch in CUDA for a
              bf16 checkpoint, in each shape of cuda_main.CUDA_BF16_CONFIGS; _r16 bf16 records; _main, _pre,
              _premain the step split; _stream / _nofold diagnostics (wrong results)
  v3_sl_cu_* (--variants cudakda, KDA, fp32 or bf16 state, B >= 128) the server's launch (predecayed keys) with
              KDA's main launch in CUDA (gdn_main.cu's IS_KDA), in its state's shapes; _r16, _nopdl, _main, _pre,
              _premain, _stream, _nofold as above; with --variants cudakda,curr the shapes and v3_sl round-robin
  v3_sl[_cu]_cpre (--variants cudapre, GDN and KDA, fp32 or bf16 state, B >= 32) the server's launch with the pre
              launch in CUDA (gdn_main.cu's replay_gdn_pre, GDN's default beside the CUDA main launch since session
              32; replay_kda_pre, KDA's predecayed keys, opt-in; decode_v3 pre_impl "cuda"), beside the CUDA main launch
              (v3_sl_cu_cpre, against v3_sl_cu with Triton's pre) and Triton's (v3_sl_cpre, against v3_sl);
              _cpre_pre / _pre the two pre launches alone, _cpre_premain / _premain with the main launch; with
              --variants cudapre,curr v3_sl_cu and v3_sl_cu_cpre round-robin. Records as the server's: the
              state's type (bf16 beside a bf16 state since session 33); fp32 states also v3_sl_cu_cpre_r16 (and
              _r16_pre): bf16 records, a bound for byte cuts in the records
  v3_rc_*_sl_cu_<shape> (--variants rccu, fp32 states, B >= 128) issue 7's read copies (fp8, bf16) read by the CUDA
              main launch in the XL layout (session 36), beside Triton's read-copy launch (v3_rc_*_sl); with
              --variants rccu,curr also round-robin (_rr)
  v3_sl_cu_cpre_x* (--variants xl, GDN and KDA, fp32 or bf16 state, B >= 128) the server's launch with both CUDA
              launches and the main launch in the eight-lanes-per-row layout (gdn_main.cu's XL) in each shape of
              cuda_main.XL_FP32_CONFIGS / XL_BF16_CONFIGS (KDA: XL_KDA_*), beside the default shape (v3_sl_cu_cpre)
              and the shape before XL; _main_x* each main launch alone; _stream / _nofold for the first two; with
              --variants xl,curr the default and the shapes round-robin; KDA also v3_sl_cu[_x*]: the same shapes
              with Triton's pre launch, as KDA's server runs them (its CUDA pre launch is opt-in)
  v3_sl[_cu]_prN (--variants prerows, GDN and KDA, B >= 128) the server's launch, Triton's or the CUDA main launch, with
              N batch rows per pre program (pre_rows); v3_sl_cu_pre_prN the pre launch alone
  v3_sl_sp*  (--variants cuda, with the above) decode v3's self_pre (no pre launch: every main program dots its
              key head's records itself): 32-row tiles (v3_sl_sp, and _r16 with bf16 records), 64-row tiles with
              1 or 2 warps (v3_sl_sp64w1, v3_sl_sp64w2)
  v3_sl_pN   (--variants place, fp32 states, B = 256) the server's launch (v3_sl) on rings allocated at 8 places
              (v3_sl_p0_again: the first timed again last); the rings' addresses go to the JSON's meta; with
              placerr too, the eight timed round-robin over PLACE_ROUNDS rounds, odd rounds in reverse order (each
              arm: the median; every round and the clocks after it in the meta), to tell placement from drift
  v3p_*_pdl   (--variants pdl) v3 pipelined, main and post launches as programmatic dependents (CUDA PDL);
              bf16 states also get v3p_r16 (the pipelined read without PDL); B >= 128: BV 64 x 2 / 32 x 2 arms
  v3_spd_<shape>, v3_sp2_<shape> (--variants sp2, GDN, B >= 32) the server's step in the CUDA-core shapes (and this
              GPU's default, v3_spd_) with the CUDA pre launch, and without one: SELF_PRE 2 (the block's warps share
              the record dots, gdn_main.cu, session 47); _rr
  v3_tg0_<shape>, v3_tg1_<shape> (--variants trig) the server's step at this GPU's default shape without and with
              the main launch's early trigger for the post launch (gdn_main.cu's TRIGGER_POST, session 48), fp32
              states also with the fp8 read copy (v3_tg*_fp8_<shape>; _pdl: that launch with PDL); v3_tg2_: the
              trigger and the step's first launch a programmatic dependent of the kernel before it (LEAD_PDL); _rr
  v3_pe0_<shape>, v3_pe1_<shape>[_pre] (--variants early) the server's step (and its pre launch alone, _pre) at this
              GPU's default shapes with a pre launch, the CUDA pre launch without and with gdn_main.cu's PRE_EARLY
              (its loads issued early, session 49); fp32 states also with the fp8 copy (v3_pe*_fp8_) and with level 2
              (v3_pe2*: the first fp32 records early too, PRE_EARLY_F32, session 50); where the server's pre launch
              is Triton's also with the CUDA one (v3_pe0c_, v3_pe1c_, v3_pe2c_); _rr
  v3_pf<N>_<shape> (--variants pf) the server's step at this GPU's default shapes with a pre launch, the CUDA pre launch
              prefetching the first N batch rows' tiles into L2 for the main launch (gdn_main.cu's PRE_PF, session 49;
              N in cuda_main.PF_BENCH_ROWS, 0: none); fp32 states also with the fp8 copy (_fp8); where the server's
              pre launch is Triton's, v3_pf0t_ (Triton's) and v3_pf<N>c_ (the CUDA one); _rr
  v3_vu0_<shape>, v3_vu1_<shape> (--variants vu) the server's step at this GPU's default shapes without and with the
              main launch's value records read as vectors (gdn_main.cu's VEC_U, session 52); fp32 states also with
              the fp8 copy (_fp8), there also with split records (_rsp) and bf16 records (_r16: a bound); _rr
  v3_te0_<shape>, v3_te1_<shape> (--variants te) the server's step at this GPU's default shapes without and with the
              main launch's tile loaded by plain loads under PDL (gdn_main.cu's TILE_EARLY, session 54: ptxas moved
              KDA's __ldg tile loads below the PDL wait); fp32 states also with the fp8 copy (_fp8); _rr
  v3_fo{0,1,2,3}_rc_<copy>_<shape>[_aligned], v3_fo_rc_<copy>_<shape>_nofold (--variants fo,
              fp32 states, B >= 32) the read copies' default shapes (both kinds' fp8 copy, GDN's bf16 copy) without
              and with FOLD_OUT (session 57: a flushing block takes its outputs from its fold and reads the
              checkpoint once), staggered and with every row on one cursor (_aligned: the folds all in one step of
              the window), and the step without folds (a diagnostic, wrong results); _rr
  v3_fox_fo{0,1,2}_<shape>, v3_fox_fo2_lead_<shape> (--variants fox, GDN, fp32 state, B >= 32) FOLD_OUT's levels
              in GDN's fp8 copy shapes (cuda_main.FOX_SHAPES: the default x16w4c1_m7_lean at levels 0-2 and its
              neighbours at 0 and 2: 80 registers without spills, the tile's dots on the tensor cores, two warps per
              block) and, in the default shape, level 2 with the step's first launch a programmatic dependent
              (LEAD_PDL); staggered, the server's arguments, _rr
  v3_ff_{off,from0,from16,from64}_rc_fp8_<shape>[_aligned] (--variants ff, fp32 states, B >= 32) the fp8 copy's
              default shape without and with FLUSH_FIRST (session 59: the main launch's blocks past the first FF_FROM
              rows take the rows that fold this step first, in the order the CUDA pre launch writes), staggered and
              aligned (off and from16: where the order changes nothing, what reading it costs); _rr
  v3_rc_fp8_d_<shape>, v3_rc_fp8_sp2_<shape> (--variants rcsp2, GDN, fp32 state; v3_rcd_ / v3_rcsp2_ in run 1004)
              the fp8 copy's step in its default shape (with its pre launch) and in cuda_main.RC_SELF_PRE2_CONFIGS
              (lean registers, no pre launch: SELF_PRE 2); _rr
  v3_fx_<shape>[_pre|_main|_post|_premain|_nofold] (--variants fixed, bf16 states, B >= 32; for fp32 states
              v3_fx_fp8_<shape>..., their fp8 read copy's default, session 56) the server's step at
              this GPU's default shape (cuda_main.default_config with the device's name), each of its launches alone,
              pre + main, the step without its folds, and with every row on one cursor (_aligned), round-robin
              (_rr): over several batches, what a step costs
              whatever its rows (scripts/target_bounds.py --fit) and which launch it is in; where the pre launch
              is Triton's also v3_fxprN_<shape>[_pre], the step (and the pre launch alone) with N = 2, 4 rows per
              pre program, and for KDA v3_fxcpre_<shape>[_pre] with KDA's CUDA pre launch
--impl picks ours (v1), v2 or both; --v2-sweep times decode_v2.V2_SWEEP launch configs at B=256 first.
Method: every arm runs NSTEPS decode steps captured in one CUDA graph (NSTEPS >= 16; rows' cursors
staggered (row + step) % 16; slots permuted); the layers' state pools are rotated step by step so
that the state touched by a graph replay is at least 4x the L2 (a model has dozens of such layers);
triton.testing.do_bench median of graph replays / NSTEPS. Bytes: the bytes model (state, ring
records, per step, average over the staggered cursors), and its fraction of the measured
device-to-device copy peak. Speedups are against the fastest conventional arm of the same run.

Writes JSON (and a PNG: --plot JSON makes the PNG from a JSON anywhere matplotlib exists).

Verify mode: ``bench_kernels.py --verify [args]`` runs the speculative-verify benchmark (scripts/bench_verify.py:
conventional verify writing a state per draft, upstream's GDN spec ring and ours, B = 1 / 64 / 256, T = 2 / 4 / 8,
all drafts accepted and all rejected; JSON + Markdown + PNG) with the arguments that follow, e.g.
``python scripts/bench_kernels.py --verify --B 256 --T 4 --out benchmarks/results``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from target_bounds import read_copy_of  # noqa: E402  (an arm's read copy by its name: one rule for both scripts)

# Each arm names its main launch: the CUDA arms pass main_impl="cuda", every other v3 arm is Triton's launch (as the
# arms were named and timed before session 31), not the server's default preference for the CUDA one.
os.environ.setdefault("REPLAYSSM_MAIN_IMPL", "triton")
os.environ.setdefault("REPLAYSSM_PRE_IMPL", "triton")  # (the pre launch too: the _cpre arms ask for CUDA's by name)

KIND_SHAPES = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}
DT = {"float32": torch.float32, "bfloat16": torch.bfloat16}
PLACE_ROUNDS = 6  # --variants placerr: round-robin rounds over the eight ring placements (odd ones reversed)
L2_BYTES = 50 * 2**20


def copy_peak(dev) -> float:
    n = 2**28  # 1 GiB of fp32
    a = torch.empty(n, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    import triton.testing as tt
    t = tt.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median") * 1e-3
    del a, b
    return 2 * n * 4 / t


def bytes_model(kind, B, sdt, arm, L=16, rec_es=2, copy="auto"):
    """The bytes one decode step of `arm` moves, averaged over a window (the bytes model); copy: the read copy it
    reads ("auto": read_copy_of(arm); None: none, as the model counted before a copy's arms were named)."""
    s = KIND_SHAPES[kind]
    H, HV, K, V = s["H"], s["HV"], s["K"], s["V"]
    es = torch.empty((), dtype=DT[sdt]).element_size()
    state = B * HV * V * K * es
    GK = 1 if kind == "gdn" else K
    HK = H if kind == "gdn" else HV
    inputs = B * ((2 * H * K + HV * V) * 2 + HV * GK * 2 + HV * 2 + HV * V * 2)  # qkv, a, b, out (bf16)
    if arm in ("conv", "conv_cuda", "ours_L1", "v3_L1", "ours_w1"):
        return 2 * state + inputs
    rec = HV * V * rec_es + HK * K * rec_es + HV * GK * 4
    mean_read = (L - 1) / 2  # cursors uniform over 0..L-1
    scratch = 0
    if arm.startswith("v3"):  # the pre launch's scratch, written once and read once: the coefficients
        scratch = 2 * B * HV * (2 * 16 + 2) * 4
    copy = read_copy_of(arm) if copy == "auto" else copy
    if copy:  # read copy (issue 7): flush steps read and write the checkpoint and write the copy,
        # the other L - 1 steps of a window read the copy only (fp8: codes plus one fp32 scale per V-row)
        bf = copy == "bf16"
        rc = B * HV * V * (K * (2 if bf else 1) + (0 if bf else 4))
        state_traffic = 2 * state / L + rc * (L - 1) / L + rc / L
        return state_traffic + B * rec * (mean_read + (L - 1) / L) + inputs + scratch
    return state * (1 + 1 / L) + B * rec * (mean_read + (L - 1) / L) + inputs + scratch


class Case:
    def __init__(self, kind, B, sdt, dev, L=16, seed=0):
        from replayssm_sglang import reference as R

        s = KIND_SHAPES[kind]
        self.kind, self.B, self.sdt, self.L, self.dev = kind, B, sdt, L, dev
        self.H, self.HV, self.K, self.V = s["H"], s["HV"], s["K"], s["V"]
        es = torch.empty((), dtype=DT[sdt]).element_size()
        pool_bytes = B * self.HV * self.V * self.K * es
        self.NL = max(1, min(128, math.ceil(4 * L2_BYTES / pool_bytes)))
        self.NSTEPS = max(16, self.NL)
        g = torch.Generator().manual_seed(seed)
        self.pools = [(torch.randn(B, self.HV, self.V, self.K, generator=g) * 0.05).to(DT[sdt]).to(dev)
                      for _ in range(self.NL)]
        self.slot_idx = torch.randperm(B, generator=g).to(torch.int32).to(dev)
        self.inputs = []
        for _ in range(min(self.NSTEPS, 16)):
            x = R.random_decode_inputs(kind, B, self.H, self.HV, self.K, self.V, generator=g,
                                       dtype=torch.bfloat16, device=dev)
            self.inputs.append(x)
        self.out = torch.empty(B, 1, self.HV, self.V, dtype=torch.bfloat16, device=dev)

    def x(self, step):
        return self.inputs[step % len(self.inputs)]

    def pool(self, step):
        return self.pools[step % self.NL]


def arm_conv(c: Case):
    from replayssm_sglang.kernels import upstream

    def run(step):
        upstream.conventional_decode(c.kind, *c.x(step), c.pool(step), c.slot_idx, c.out)
    return run


def arm_conv_cuda(c: Case):
    if c.kind != "kda" or c.sdt != "float32" or c.B < 8:
        return None
    mod = _kda_cuda_module()
    if mod is None:
        return None
    H = c.H

    def run(step):
        mixed, a, b, A_log, dt_bias = c.x(step)
        mod.kda_packed_decode(mixed, a, b, A_log, dt_bias, c.K ** -0.5, c.pool(step), c.out, c.slot_idx, H, None)
    return run


_KDA_CUDA = {}


def _stub_ipython() -> None:
    """Where IPython is absent (the GPU image), a stand-in for what SGLang's KDA import chain and matplotlib ask of
    it: IPython.display's HTML / display (no-ops), get_ipython() (None: no shell), and version_info, which matplotlib
    reads when it makes a canvas (>= 8.24 needs nothing more; without it the PNGs of the GPU runs that loaded the KDA
    baseline failed with "module 'IPython' has no attribute 'version_info'", sessions 37-39)."""
    try:
        import IPython.display  # noqa: F401
    except ImportError:
        import types
        ip = types.ModuleType("IPython")
        disp = types.ModuleType("IPython.display")
        disp.HTML = disp.display = lambda *a, **k: None
        ip.display = disp
        ip.get_ipython = lambda: None
        ip.version_info = (8, 24, 0)
        sys.modules.setdefault("IPython", ip)
        sys.modules.setdefault("IPython.display", disp)


def _kda_cuda_module():
    """SGLang's KDA CUDA row-streaming path (JIT through tvm-ffi). Its import chain needs SGLang's
    utils; IPython.display is stubbed when absent (used there only for notebook display helpers)."""
    if "mod" in _KDA_CUDA:
        return _KDA_CUDA["mod"]
    mod = None
    try:
        _stub_ipython()
        import importlib
        mod = importlib.import_module("sglang.kernels.ops.attention.kda_packed_decode")
        mod._jit_kda_packed_decode_module()
    except Exception as e:  # noqa: BLE001
        print(f"[conv_cuda] not available: {type(e).__name__}: {str(e)[:300]}", flush=True)
        _KDA_CUDA["err"] = f"{type(e).__name__}: {str(e)[:300]}"
        mod = None
    _KDA_CUDA["mod"] = mod
    return mod


def arm_upstream(c: Case, aligned=False):
    from replayssm_sglang.kernels import upstream

    m = upstream.load("fused_recurrent_linear_replayssm")
    L, B, dev = c.L, c.B, c.dev
    is_kda = c.kind == "kda"
    rings = []
    for _ in range(c.NL):
        d = torch.zeros(B, c.HV, L, c.V, dtype=torch.bfloat16, device=dev)
        k = torch.zeros(B, c.H, L, c.K, dtype=torch.bfloat16, device=dev)
        gshape = (B, c.HV, L, c.K) if is_kda else (B, c.HV, L)
        g = torch.zeros(gshape, dtype=torch.float32, device=dev)
        rings.append((d, k, g))
    # per-row cursors staggered (row + step) % L; upstream's caller owns them (host-side tensors here)
    rows = torch.arange(B, device=dev, dtype=torch.int32)
    start = torch.zeros_like(rows) if aligned else rows  # aligned: every row on the same cursor
    wpos = [((start + s) % L).to(torch.int32) for s in range(c.NSTEPS)]

    def run(step):
        mixed, a, b, A_log, dt_bias = c.x(step)
        d, k, g = rings[step % c.NL]
        if is_kda:
            a = a.reshape(B, c.HV, c.K)
            dt_bias = dt_bias.reshape(c.HV, c.K)
        m.fused_recurrent_linear_replayssm_decode(
            mixed, a, b, A_log, dt_bias, c.K ** -0.5, c.pool(step), d, k, g, c.out, c.slot_idx, wpos[step],
            use_qk_l2norm_in_kernel=True, is_kda=is_kda)
    return run


SERVER_PARTS = frozenset({"perm", "ident", "i32", "forced"})


def server_pre_impl(kind: str, name: str) -> str:
    """The pre launch the server runs beside the CUDA main launch's shape `name`: the CUDA one where the shape takes
    its tile's dots on the tensor cores (only it writes their operand), else the kind's default
    (cuda_main.PRE_AUTO_KINDS)."""
    from replayssm_sglang.kernels import cuda_main as cm

    if cm.full_config(cm.CUDA_CONFIGS[name])[10]:
        return "triton"  # (a shape without a pre launch, SELF_PRE 2: none runs, and only a CUDA one would be refused)
    return "cuda" if cm.tensor_core_shape(cm.CUDA_CONFIGS[name]) or kind in cm.PRE_AUTO_KINDS else "triton"


def device_defaults(kind: str, sdt: str):
    """(read copy, its element type, shape name) for this GPU's default shapes: the state's own and, for an fp32
    state, its fp8 copy's; for --variants trig, vu and (with a pre launch) early and pf."""
    from replayssm_sglang.kernels import cuda_main as cm

    for rd in ("same", "fp8_e4m3") if sdt == "float32" else ("same",):
        rcd = None if rd == "same" else torch.float8_e4m3fn
        yield rd, rcd, cm.config_name(cm.default_config(DT[sdt], kind, rcd, device_name=torch.cuda.get_device_name()))


def defaults_with_a_pre_launch(kind: str, sdt: str):
    """(read copy, shape name, the server's pre launch, arm tag) for this GPU's default shapes that have a pre launch:
    the state's own and, for an fp32 state, its fp8 copy's (a SELF_PRE 2 default, without one, left out); for
    --variants early and pf."""
    from replayssm_sglang.kernels import cuda_main as cm

    for rd, _, name in device_defaults(kind, sdt):
        if not cm.full_config(cm.CUDA_CONFIGS[name])[10]:
            yield rd, name, server_pre_impl(kind, name), "" if rd == "same" else "_fp8"


def option_arms(c: Case, kind: str, sdt: str, tag: str, option: str, extra_recs: bool = False,
                levels=(0, 1)) -> dict:
    """--variants vu and te: this GPU's default shapes (device_defaults) at each level of an option of decode v3's
    launch (vec_u 0 / 1 / 2, tile_early 0 / 1), the server's records and pre launch: arms v3_<tag><level>[_fp8]_<shape>;
    extra_recs: the fp8 copy also with split records (_rsp, the CUDA pre launch) and bf16 records (_r16: a bound, not
    a valid decode)."""
    from replayssm_sglang.kernels import cuda_main as cm

    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
    out = {}
    for rd, rcd, name in device_defaults(kind, sdt):
        sp = cm.full_config(cm.CUDA_CONFIGS[name])[10]
        ftag = "" if rd == "same" else "_fp8"
        recs = [(DT[sdt], "")] + ([("split", "_rsp"), (torch.bfloat16, "_r16")] if rcd and extra_recs else [])
        for rec, rtag in recs:
            pre = None if sp else "cuda" if rec == "split" else server_pre_impl(kind, name)
            for on in levels:
                out[f"v3_{tag}{on}{ftag}_{name}{rtag}"] = arm_ours(
                    c, rec, impl="v3", read_dtype=rd, **srv,
                    v3_opts={"main_impl": "cuda", "cuda_config": name, "pre_impl": pre, option: on})
    return out


# --variants split: beside the fp8 copy's default shape (72 registers, whose split build spills 16-28 bytes, ptxas
# sm_90), a shape of each kind whose split build spills nothing (GDN 72 registers with the tensor-core dots, KDA 80)
SPLIT_SIBLINGS = {"gdn": "x16w4c1_m7_lean_mma", "kda": "x16w4c1_m6_gp_lean_mma"}


def arm_ours(c: Case, rec_dtype, *args, **kwargs):
    """One arm of ours (_arm_ours, below), its run tagged with its records' element size (rec_es) for the bytes
    model: the TB/s column then counts the records the arm moves (before session 33 every arm but the *_r32 /
    v3_rc_* ones was counted at bf16 records). rec_dtype "split": fp32 records in two 16-bit planes
    (RingLayout.allocate(split_records=True)), counted at 2 bytes (the plain steps read the high plane only; a fold's
    second plane, 1 / L of the reads, is left out)."""
    run = _arm_ours(c, rec_dtype, *args, **kwargs)
    run.rec_es = 2 if rec_dtype == "split" else torch.empty((), dtype=rec_dtype).element_size()
    return run


def _arm_ours(c: Case, rec_dtype, window=None, cfg=None, fold=None, freeze_h=False, impl="v1", rows=False,
              records="masked", read_dtype="same", v3_opts=None, aligned=False, server_like=False, kda_keys="raw",
              parts=None, rings_out=None):
    """server_like (v2 / v3): the arguments as the server passes them: the ring keyed by request row (twice as many
    ring rows as batch rows, ring_idx a random int64 subset, as forward_batch.req_pool_indices) and a forced-flush
    mask (int32 zeros, as flush.forced_flush_mask with a track interval); otherwise the ring is keyed by slot and no
    mask is passed. parts (overrides server_like): some of those arguments alone, "+"-joined from SERVER_PARTS:
    "perm" (the ring keyed by request row: 2B rows, ring_idx a random int64 subset), "ident" (ring_idx passed but
    naming the batch rows' slots, B ring rows: the argument without the other keying), "i32" (ring_idx as int32),
    "forced" (the mask). kda_keys: the ring's KDA key records ("predecayed": k_j e^{-G_j}, ring.Ring.kda_keys)."""
    from replayssm_sglang import ring as ringmod
    from replayssm_sglang.kernels.decode import replay_decode

    lay = ringmod.RingLayout.for_layer(c.kind, L=c.L, H=c.H, HV=c.HV, K=c.K, V=c.V)
    rings = []
    if parts is None:
        parts = "perm+forced" if server_like else ""
    pset = set(parts.split("+")) - {""}
    if not pset <= SERVER_PARTS or {"perm", "ident"} <= pset or ("i32" in pset and not pset & {"perm", "ident"}):
        raise ValueError(f"parts: '+'-joined from {sorted(SERVER_PARTS)}, one of perm / ident (i32 with one), got {parts!r}")
    n_rows = 2 * c.B if "perm" in pset else c.B
    if "perm" in pset:
        ring_idx = torch.randperm(n_rows, generator=torch.Generator().manual_seed(7))[:c.B].to(c.dev)  # int64
    elif "ident" in pset:
        ring_idx = c.slot_idx.long().clone()
    else:
        ring_idx = None
    if ring_idx is not None and "i32" in pset:
        ring_idx = ring_idx.to(torch.int32)
    forced = torch.zeros(c.B, dtype=torch.int32, device=c.dev) if "forced" in pset else None
    rr = ring_idx.long() if ring_idx is not None else c.slot_idx.long()  # the ring row of each batch row
    rows_t = torch.arange(c.B, device=c.dev, dtype=torch.int32)  # batch row indices
    split = rec_dtype == "split"
    for _ in range(c.NL):
        r = lay.allocate(n_rows, device=c.dev, record_dtype=torch.float32 if split else rec_dtype,
                         read_dtype=read_dtype, kda_keys=kda_keys, split_records=split)
        if r.rc is not None:  # steady state: every copy current (a stale copy only follows a prefill)
            from replayssm_sglang import precision as P

            src = c.pools[len(rings) % c.NL].float()[c.slot_idx.long()]  # each batch row's checkpoint
            if r.rc_scale is not None:
                q, sc = P.quantize_fp8_rows(src)
                r.rc.view(torch.uint8).index_copy_(0, rr, q.to(c.dev).view(torch.uint8))  # (no fp8 index_copy_)
                r.rc_scale.index_copy_(0, rr, sc.to(c.dev))
            else:
                r.rc.index_copy_(0, rr, src.to(torch.bfloat16))
            r.rc_valid.fill_(1)
        # staggered cursors: batch row i starts at i % L; zero records are valid records. aligned: every
        # row on the same cursor (a batch that started together, as in the server's throughput runs: all rows
        # write their checkpoints in the same step, one step in L)
        r.h.index_copy_(0, rr, torch.zeros_like(rows_t) if aligned else rows_t % c.L)
        rings.append(r)
    if rings_out is not None:  # (--variants place: where each ring landed)
        rings_out.extend(rings)
    L = window if window is not None else c.L
    if impl in ("v2", "v3"):
        bv, nw = cfg if cfg else (None, None)
        h_rows = [((rows_t + s) % c.L).to(torch.int32) for s in range(c.NSTEPS)] if rows else None
        extra = dict(h_rows=None, advance_h=True)
        if ring_idx is not None:
            extra.update(ring_idx=ring_idx)
        if forced is not None:
            extra.update(forced=forced)

        def run(step):
            if rows:
                extra.update(h_rows=h_rows[step % c.NSTEPS], advance_h=False, may_prefold=False)
            # fold None: the launch's own choice (v1 / v2: the record loop; v3: V3_TUNED's)
            vx = dict(fold=fold, records=records) if impl == "v2" else ({} if fold is None else dict(fold=fold))
            if v3_opts:
                vx["v3_opts"] = v3_opts
            replay_decode(c.kind, *c.x(step), c.pool(step), rings[step % c.NL], c.slot_idx, out=c.out, L=L,
                          block_v=bv, num_warps=nw, impl=impl, **vx, **extra)
        return run
    if impl == "w1":
        def run(step):
            replay_decode(c.kind, *c.x(step), c.pool(step), rings[step % c.NL], c.slot_idx, out=c.out, L=1,
                          impl="w1")
        return run
    bv, nw, nk = cfg if cfg else (None, None, None)

    def run(step):
        replay_decode(c.kind, *c.x(step), c.pool(step), rings[step % c.NL], c.slot_idx, out=c.out, L=L,
                      block_v=bv, num_warps=nw, k_chunks=nk, fold=fold, _diag_freeze_h=freeze_h, impl="v1")
    return run


def time_graph(c: Case, run) -> float:
    """Median seconds per decode step over CUDA-graph replays of NSTEPS steps."""
    return time_replays(c, capture_graph(c, run))


def time_replays(c: Case, g) -> float:
    """Median seconds per decode step over replays of a captured graph of NSTEPS steps."""
    import triton.testing as tt

    return tt.do_bench(g.replay, warmup=20, rep=120, return_mode="median") * 1e-3 / c.NSTEPS


def round_robin(c: Case, runs: dict, label: str) -> dict:
    """Each run's graph timed in turn over PLACE_ROUNDS rounds, odd rounds in the reverse order (is a difference the
    arms' or their turn's?); prints every round as "<label> round r: name us ..." and returns each run's seconds per
    step, one per round."""
    graphs = {n: capture_graph(c, r) for n, r in runs.items()}
    per = {n: [] for n in runs}
    for rnd in range(PLACE_ROUNDS):
        for n in (list(runs) if rnd % 2 == 0 else list(runs)[::-1]):
            per[n].append(time_replays(c, graphs[n]))
        print(f"{label} round {rnd}: " + " ".join(f"{n} {per[n][-1] * 1e6:6.1f}" for n in runs), flush=True)
    return per


def keep_rounds(per: dict, meta: dict, rounds_key: str, prefix: str, timed: dict) -> None:
    """Rounds of timed runs ({name: seconds per step, one per round}): each round's time (us) kept in
    meta[rounds_key] under "<prefix>/<name>", and each run's median over the rounds into timed, as the arm's result."""
    meta.setdefault(rounds_key, {}).update({f"{prefix}/{n}": [t * 1e6 for t in v] for n, v in per.items()})
    timed.update({n: sorted(v)[len(v) // 2] for n, v in per.items()})


def round_robin_medians(c: Case, runs: dict, label: str, meta: dict, rounds_key: str, prefix: str,
                        timed: dict) -> dict:
    """round_robin over `runs`, its rounds kept (keep_rounds); returns them."""
    per = round_robin(c, runs, label)
    keep_rounds(per, meta, rounds_key, prefix, timed)
    return per


def gpu_clocks() -> str:
    """The SM and memory clocks, temperature, power and the active clock-event (throttle) reasons bit mask as
    nvidia-smi reads them now (without the reasons where this nvidia-smi does not know the field; "" without
    nvidia-smi)."""
    import subprocess

    base = "clocks.sm,clocks.mem,temperature.gpu,power.draw"
    for fields in (base + ",clocks_event_reasons.active", base):
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"], capture_output=True,
                               text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return ""
        if r.returncode == 0:
            return r.stdout.strip()
    return ""


def capture_graph(c: Case, run):
    """run's NSTEPS steps warmed up (compiled, every ring and pool touched once), captured in one CUDA graph and
    replayed once."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(c.NSTEPS):  # warm-up: compile, and every ring/pool touched once
            run(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(c.NSTEPS):
            run(i)
    g.replay()
    torch.cuda.synchronize()
    return g


# --step-split: per-launch GPU time by step of a window, every row on the same cursor (as in the server), B = 256.
# name -> (record dtype, (BV, warps) or None, arm_ours keyword arguments); fp32 states; the read-copy arms are
# issue 7's (steps that write no checkpoint read only the copy: are they at the copy's bytes?)
_P3 = dict(pipe_stages=3, chunk_bytes=128, fold_bytes=64, pdl=True)
SPLIT_ARMS = {
    "v3_r32": (torch.float32, None, {}),
    "v3_r16": (torch.bfloat16, None, {}),
    "v3_rc_bf16": (torch.float32, None, dict(read_dtype="bf16")),
    "v3_rc_fp8": (torch.float32, None, dict(read_dtype="fp8_e4m3")),
    "v3p_rc_bf16": (torch.float32, None, dict(read_dtype="bf16", fold="dot3", v3_opts=_P3)),
    "v3p_rc_bf16_64x2": (torch.float32, (64, 2), dict(read_dtype="bf16", fold="dot3", v3_opts=_P3)),
    "v3p_rc_fp8": (torch.float32, None, dict(read_dtype="fp8_e4m3", fold="chunked", v3_opts=_P3)),
    "v3p_rc_fp8_64x2": (torch.float32, (64, 2), dict(read_dtype="fp8_e4m3", fold="chunked", v3_opts=_P3)),
    "v3p_rc_fp8_128x4": (torch.float32, (128, 4), dict(read_dtype="fp8_e4m3", fold="chunked", v3_opts=_P3)),
    # larger tiles of a narrow copy with the K loop still pipelined: 32-byte chunks of a 128-byte fp8 row (4
    # stages' worth), 64-byte chunks of a 256-byte bf16 row; the fold in 256-byte chunks (as _RC_FP8)
    "v3p_rc_fp8_64x2_c32": (torch.float32, (64, 2), dict(read_dtype="fp8_e4m3", fold="chunked",
                                                          v3_opts=dict(_P3, chunk_bytes=32, fold_bytes=256))),
    "v3p_rc_fp8_128x4_c32": (torch.float32, (128, 4), dict(read_dtype="fp8_e4m3", fold="chunked",
                                                            v3_opts=dict(_P3, chunk_bytes=32, fold_bytes=256))),
    "v3p_rc_fp8_32x1_c32": (torch.float32, None, dict(read_dtype="fp8_e4m3", fold="chunked",
                                                       v3_opts=dict(_P3, chunk_bytes=32, fold_bytes=256))),
    "v3p_rc_bf16_64x2_c64": (torch.float32, (64, 2), dict(read_dtype="bf16", fold="dot3",
                                                           v3_opts=dict(_P3, chunk_bytes=64))),
    "v3p_rc_bf16_128x4_c64": (torch.float32, (128, 4), dict(read_dtype="bf16", fold="dot3",
                                                             v3_opts=dict(_P3, chunk_bytes=64))),
    # several value heads per main-launch program, one after the other (heads_per_program): the defaults otherwise
    "v3_r32_hpp2": (torch.float32, None, dict(v3_opts=dict(heads_per_program=2))),
    "v3_r32_hpp4": (torch.float32, None, dict(v3_opts=dict(heads_per_program=4))),
    "v3_rc_bf16_hpp2": (torch.float32, None, dict(read_dtype="bf16", v3_opts=dict(heads_per_program=2))),
    "v3_rc_fp8_hpp2": (torch.float32, None, dict(read_dtype="fp8_e4m3", v3_opts=dict(heads_per_program=2))),
    "v3_rc_fp8_hpp4": (torch.float32, None, dict(read_dtype="fp8_e4m3", v3_opts=dict(heads_per_program=4))),
    # the dot folds' K-chunk loop software-pipelined (fold_pipe_stages): the checkpoint-writing step
    "v3_r32_fp2": (torch.float32, None, dict(v3_opts=dict(fold_pipe_stages=2))),
    "v3_r32_fp3": (torch.float32, None, dict(v3_opts=dict(fold_pipe_stages=3))),
    "v3_r32_fp3_f128": (torch.float32, None, dict(v3_opts=dict(fold_pipe_stages=3, fold_bytes=128))),
    "v3_r16_fp3": (torch.bfloat16, None, dict(v3_opts=dict(fold_pipe_stages=3))),
    "v3_rc_bf16_fp3": (torch.float32, None, dict(read_dtype="bf16", v3_opts=dict(fold_pipe_stages=3))),
    "v3_rc_bf16_dot_fp3": (torch.float32, None, dict(read_dtype="bf16", fold="dot3",
                                                      v3_opts=dict(fold_pipe_stages=3, fold_bytes=64))),
    # KDA only: predecayed key records (no per-(record, K) gate read or exponentiated; ring.Ring.kda_keys)
    "v3_r32_pred": (torch.float32, None, dict(kda_keys="predecayed")),
    "v3_r32_ff": (torch.float32, None, dict(v3_opts=dict(row_order="flush_first"))),
    "v3_r32_pred_ff": (torch.float32, None, dict(kda_keys="predecayed", v3_opts=dict(row_order="flush_first"))),
    "v3_rc_bf16_pred": (torch.float32, None, dict(read_dtype="bf16", kda_keys="predecayed")),
    # session 13: the options timed on raw keys (fold pipelined, two heads per program), now on predecayed keys,
    # and the tile read in 64-byte chunks (8 stages' worth of a 512-byte row; the default is 128)
    "v3_r32_pred_fp3": (torch.float32, None, dict(kda_keys="predecayed", v3_opts=dict(fold_pipe_stages=3))),
    "v3_r32_pred_hpp2": (torch.float32, None, dict(kda_keys="predecayed", v3_opts=dict(heads_per_program=2))),
    "v3_r32_pred_c64": (torch.float32, None, dict(kda_keys="predecayed", v3_opts=dict(chunk_bytes=64))),
    "v3_r32_c64": (torch.float32, None, dict(v3_opts=dict(chunk_bytes=64))),
    # session 14: the server-like setup's parts one at a time, with the bf16 read copy (its plain step was 176.7 us
    # server-like against 136.4 plain for KDA, session 12) and without; "_p" arms ignore --split-server-like
    "v3_rc_bf16_p0": (torch.float32, None, dict(read_dtype="bf16", parts="")),
    "v3_rc_bf16_pident": (torch.float32, None, dict(read_dtype="bf16", parts="ident")),
    "v3_rc_bf16_pperm": (torch.float32, None, dict(read_dtype="bf16", parts="perm")),
    "v3_rc_bf16_pperm32": (torch.float32, None, dict(read_dtype="bf16", parts="perm+i32")),
    "v3_rc_bf16_pforced": (torch.float32, None, dict(read_dtype="bf16", parts="forced")),
    "v3_rc_bf16_pall": (torch.float32, None, dict(read_dtype="bf16", parts="perm+forced")),
    "v3_rc_bf16_pred_p0": (torch.float32, None, dict(read_dtype="bf16", kda_keys="predecayed", parts="")),
    "v3_rc_bf16_pred_pall": (torch.float32, None, dict(read_dtype="bf16", kda_keys="predecayed", parts="perm+forced")),
    # the main launch's registers capped at what the fast setups compile to (168 on the H200's Triton: 12 programs per
    # SM; 182-200 in the slow ones)
    "v3_rc_bf16_pall_m168": (torch.float32, None, dict(read_dtype="bf16", parts="perm+forced",
                                                      v3_opts=dict(main_maxnreg=168))),
    "v3_rc_bf16_pred_pall_m168": (torch.float32, None, dict(read_dtype="bf16", kda_keys="predecayed",
                                                           parts="perm+forced", v3_opts=dict(main_maxnreg=168))),
    "v3_rc_bf16_pred_pall_m160": (torch.float32, None, dict(read_dtype="bf16", kda_keys="predecayed",
                                                           parts="perm+forced", v3_opts=dict(main_maxnreg=160))),
    # next: the fp8 copies (248-255 registers under the H200's Triton, 8 programs per SM) capped; offline (Triton 3.6.0)
    # 168 spills 72 B (GDN) / 244 B (KDA), 200 fewer
    "v3_rc_fp8_pall": (torch.float32, None, dict(read_dtype="fp8_e4m3", parts="perm+forced")),
    "v3_rc_fp8_pall_m168": (torch.float32, None, dict(read_dtype="fp8_e4m3", parts="perm+forced",
                                                     v3_opts=dict(main_maxnreg=168))),
    "v3_rc_fp8_pall_m200": (torch.float32, None, dict(read_dtype="fp8_e4m3", parts="perm+forced",
                                                     v3_opts=dict(main_maxnreg=200))),
    "v3_rc_fp8_pred_pall": (torch.float32, None, dict(read_dtype="fp8_e4m3", kda_keys="predecayed",
                                                     parts="perm+forced")),
    "v3_rc_fp8_pred_pall_m168": (torch.float32, None, dict(read_dtype="fp8_e4m3", kda_keys="predecayed",
                                                          parts="perm+forced", v3_opts=dict(main_maxnreg=168))),
    # since 2026-12-01 the fp8 copies' default is the 168 cap (V3_TUNED): 255 is the uncapped launch for comparison
    "v3_rc_fp8_pall_m255": (torch.float32, None, dict(read_dtype="fp8_e4m3", parts="perm+forced",
                                                     v3_opts=dict(main_maxnreg=255))),
    "v3_rc_fp8_pred_pall_m255": (torch.float32, None, dict(read_dtype="fp8_e4m3", kda_keys="predecayed",
                                                          parts="perm+forced", v3_opts=dict(main_maxnreg=255))),
    "v3_r32_pred_pall_m128": (torch.float32, None, dict(kda_keys="predecayed", parts="perm+forced",
                                                       v3_opts=dict(main_maxnreg=128))),
    "v3_r32_pred_pall": (torch.float32, None, dict(kda_keys="predecayed", parts="perm+forced")),
    "v3_r32_p0": (torch.float32, None, dict(parts="")),
    "v3_r32_pperm": (torch.float32, None, dict(parts="perm")),
    "v3_r32_pall": (torch.float32, None, dict(parts="perm+forced")),
    # the dot fold's K-chunk loop rolled (fold_pipe_stages 1: a loop, not unrolled, no shared-memory stages) in
    # 64- / 128-byte chunks, and pipelined over 2 stages in 128-byte chunks (offline, Triton 3.6: GDN 92 / 134 / 131
    # registers against 110 unrolled; KDA raw 100 / 185 / 182 against 127)
    "v3_r32_fp1": (torch.float32, None, dict(v3_opts=dict(fold_pipe_stages=1))),
    "v3_r32_fp1_f128": (torch.float32, None, dict(v3_opts=dict(fold_pipe_stages=1, fold_bytes=128))),
    "v3_r32_fp2_f128": (torch.float32, None, dict(v3_opts=dict(fold_pipe_stages=2, fold_bytes=128))),
    "v3_r32_pred_fp1": (torch.float32, None, dict(kda_keys="predecayed", v3_opts=dict(fold_pipe_stages=1))),
    "v3_r32_pred_fp1_f128": (torch.float32, None, dict(kda_keys="predecayed",
                                                      v3_opts=dict(fold_pipe_stages=1, fold_bytes=128))),
    # the main launch's residency (offline, Triton 3.6, sm_90, fp32 state and records): 92 registers (GDN), 21 one-warp
    # programs per SM; capped at 80 (28 B spilled) 25, where its 8 KiB of pipeline stages bind; at 64 (108 B
    # spilled) with two stages (one 4 KiB buffer) 32, the most one-warp programs an SM holds
    "v3_r32_m80": (torch.float32, None, dict(v3_opts=dict(main_maxnreg=80))),
    "v3_r32_m64_p2": (torch.float32, None, dict(v3_opts=dict(main_maxnreg=64, pipe_stages=2))),
    "v3_r32_m72_p2": (torch.float32, None, dict(v3_opts=dict(main_maxnreg=72, pipe_stages=2))),
    # the fp8 copy with one value head per program of four warps (BV 128): the program's first round trips paid once
    # per head by four warps at a time, where the default (BV 32, one warp, two heads per program) pays them per
    # 32 rows; offline (Triton 3.6, the 168 cap) 3 programs per SM, the same 12 warps, 72-88 B spilled
    "v3_rc_fp8_128x4": (torch.float32, (128, 4), dict(read_dtype="fp8_e4m3", v3_opts=dict(heads_per_program=1))),
    "v3_rc_fp8_128x4_hpp2": (torch.float32, (128, 4), dict(read_dtype="fp8_e4m3")),
    "v3_rc_fp8_pred": (torch.float32, None, dict(read_dtype="fp8_e4m3", kda_keys="predecayed")),
    "v3_rc_fp8_pred_128x4_hpp2": (torch.float32, (128, 4), dict(read_dtype="fp8_e4m3", kda_keys="predecayed")),
    "v3_r32_pred_m80": (torch.float32, None, dict(kda_keys="predecayed", v3_opts=dict(main_maxnreg=80))),
    "v3_r32_pred_m64_p2": (torch.float32, None, dict(kda_keys="predecayed",
                                                    v3_opts=dict(main_maxnreg=64, pipe_stages=2))),
    # GDN's bf16 read copy with its tile's C q / C k as tensor-core products (decode_v3 tile_mma, session 18; GDN only;
    # V3_TUNED's since session 19) and without them
    "v3_rc_bf16_mma": (torch.float32, None, dict(read_dtype="bf16", v3_opts=dict(tile_mma=True))),
    "v3_rc_bf16_nomma": (torch.float32, None, dict(read_dtype="bf16", v3_opts=dict(tile_mma=False))),
    # the fp8 copy's tile the same way (fp8 codes made bf16 in registers; session 19): with its V3_TUNED launch
    # (unrolled 64-byte chunks, two heads per program, 168-register cap: offline 432 B spilled against 72), the read
    # software-pipelined in 64-byte chunks as the tile study's fastest form, and each without the register cap
    "v3_rc_fp8_mma": (torch.float32, None, dict(read_dtype="fp8_e4m3", v3_opts=dict(tile_mma=True))),
    "v3_rc_fp8_mma_m255": (torch.float32, None, dict(read_dtype="fp8_e4m3",
                                                    v3_opts=dict(tile_mma=True, main_maxnreg=255))),
    "v3_rc_fp8_mma_p3": (torch.float32, None, dict(read_dtype="fp8_e4m3",
                                                  v3_opts=dict(tile_mma=True, pipe_stages=3, chunk_bytes=64))),
    "v3_rc_fp8_mma_p3_m255": (torch.float32, None, dict(read_dtype="fp8_e4m3", v3_opts=dict(
        tile_mma=True, pipe_stages=3, chunk_bytes=64, main_maxnreg=255))),
}


def step_split(c: Case, run, steps: int | None = None) -> dict:
    """GPU time of each launch of ``steps`` eager decode steps under the torch profiler (no CUDA graph: launch
    gaps are not in these numbers), grouped by kernel name in launch order. With aligned cursors one step in L
    writes every checkpoint: per kernel the median over steps (a step that writes no checkpoint), the maximum (the
    one that does), and the mean per step. ``steps`` (default: the fewest whole windows of at least 32 steps) must
    be a multiple of L, so that the mean per step counts each window's checkpoint step once per L steps."""
    from torch.profiler import ProfilerActivity, profile

    if steps is None:
        steps = c.L * -(-32 // c.L)
    if steps % c.L:
        raise ValueError(f"steps ({steps}) must be a multiple of L ({c.L})")

    for i in range(c.L):  # compiled, warm, and back to the window's first step
        run(i)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            run(i)
        torch.cuda.synchronize()
    per: dict[str, list] = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            per.setdefault(ev.name, []).append(ev.device_time)
    out = {}
    for name, ts in per.items():
        ts_s = sorted(ts)
        out[name] = dict(n=len(ts), median_us=ts_s[len(ts) // 2], max_us=ts_s[-1], mean_per_step_us=sum(ts) / steps)
    return out


def _compiled_resources(mod) -> dict:
    """Registers, spills and shared memory of the last main launch of a decode module (its ``_LAST["kernel"]``) as
    this machine's Triton compiled it (offline counts, scripts/compile_configs.py --resources, come from the Triton
    they run under, which may differ); {} before any launch."""
    k = mod._LAST.get("kernel")
    if k is None:
        return {}
    return dict(n_regs=getattr(k, "n_regs", None), n_spills=getattr(k, "n_spills", None),
                shared=getattr(getattr(k, "metadata", None), "shared", None))


def run_step_split(args, dev, meta):
    from replayssm_sglang.kernels import decode_v3

    B = max(int(b) for b in args.batches.split(","))
    names = args.split_arms.split(",")
    res = []
    for kind in args.kinds.split(","):
        c = Case(kind, B, "float32", dev, L=args.cache_len)
        arms = {"conv": arm_conv(c)}
        for n in names:
            rec, cfg, kw = SPLIT_ARMS[n]
            if kw.get("kda_keys", "raw") != "raw" and kind != "kda":
                continue  # (a KDA record layout)
            if kw.get("v3_opts", {}).get("tile_mma") and kind != "gdn":
                continue  # (GDN only: decode_v3.launch refuses it for KDA)
            arms[n] = arm_ours(c, rec, cfg=cfg, impl="v3", aligned=not args.split_staggered,
                               server_like=args.split_server_like, **kw)
        for n, run in arms.items():
            try:
                sp = step_split(c, run)
            except Exception as e:  # noqa: BLE001
                print(f"split {kind} B={B} {n}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
                continue
            tot = sum(v["mean_per_step_us"] for v in sp.values())
            main_res = _compiled_resources(decode_v3) if n != "conv" else {}
            print(f"split {kind} B={B} {n}: {tot:.1f} us per step (kernels only)"
                  + (f"  [main launch as compiled here: {main_res}]" if main_res else ""), flush=True)
            for kn, v in sorted(sp.items(), key=lambda kv: -kv[1]["mean_per_step_us"]):
                print(f"    {kn[:60]:60s} n={v['n']:3d} median {v['median_us']:7.1f} max {v['max_us']:7.1f} "
                      f"per step {v['mean_per_step_us']:7.1f}", flush=True)
            res.append(dict(kind=kind, B=B, L=c.L, arm=n, kernels_us_per_step=tot, kernels=sp, main_launch=main_res))
        cursors = "staggered" if args.split_staggered else "aligned"
        args_kind = ", server-like arguments (ring_idx, forced)" if args.split_server_like else ""
        _dump(args.out, dict(meta, mode=f"step-split, L = {c.L}, {cursors} cursors{args_kind}, eager steps under "
                                        "torch.profiler"),
              res)
        del c, arms
        torch.cuda.empty_cache()
    print(f"wrote {args.out}")
    print(table(args.out))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="benchmarks/results/kernels.json")
    ap.add_argument("--kinds", default="gdn,kda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batches", default="1,32,128,256,512")
    ap.add_argument("--sweep", action="store_true", help="first sweep (BV, num_warps) at B=256 for ours")
    ap.add_argument("--sweep-configs", default="32x1x2,32x1x4,16x1x2,64x1x4,64x2x2")
    ap.add_argument("--plot", default=None, help="only make the PNG from this JSON")
    ap.add_argument("--table", default=None, help="only print the markdown table of this JSON")
    ap.add_argument("--rebytes", default=None, help="only recount this JSON's bytes with today's bytes model (rows "
                    "whose read copy an earlier model missed), rewriting it and noting which rows in its meta")
    ap.add_argument("--variants", default="", help="extra arms of ours, comma-separated: 'r32' = v1 with fp32 "
                    "records (ours_r32; 0.77-0.80x of ours_r16 on 2026-11-29); 'unroll' = v2 with the unrolled fold "
                    "(v2_r16_unroll); 'all' = v2 loading every ring position without waiting for h (v2_r16_all); "
                    "'chunked' = v3 with the K-chunked fold (v3_r16_chunked, v3_r32_chunked; at B=256 also the "
                    "launch configs v3c_BVxwarps); 'rc' = v3 with a bf16 / fp8 read copy of an fp32 state "
                    "(v3_rc_bf16, v3_rc_fp8; v3_rc_fp8_c16: the copy read in 16-byte chunks; issue 7, fp32 records); "
                    "'parts' = diagnostics at B >= 128: v3's pre, main and post launches timed alone "
                    "(v3_r16_pre/main/post; not a valid decode); 'v3dot' = v3 folding with one tl.dot per K chunk "
                    "(v3_r16_dot, v3_r32_dot: fp32 FMA; *_dot3: tf32x3 tensor cores; with 'rc' also "
                    "v3_rc_bf16_{dot,dot3}; at B=256 the configs v3d_BVxwarps); 'pipe' = v3 with the tile read "
                    "software-pipelined (v3p_*: 3 stages, 128/256-byte chunks, dot3 fold (fp8 copies: chunked); "
                    "at B >= 128); 'bkt' = v3 "
                    "reading the checkpoint in 32- or 128-byte K chunks (v3_r16_c32, v3_r16_c128); 'dot' = "
                    "tensor-core fold (ours_r16_dot); 'freeze' = diagnostics: h frozen at the staggered cursors "
                    "(row %% L), the same mix of flush and non-flush rows every step but no arrival atomics and no h "
                    "writes (diag_no_atomics; not a valid decode: it isolates the cost of the in-kernel h update); "
                    "'split' = split records (REC_SPLIT: bf16 high plane read, low plane joined at folds) against "
                    "fp32 and bf16 records, the fp8 copy's default and the plain fp32 default with a pre launch, "
                    "round-robin (B >= 128, fp32 states); "
                    "'rcr16' = the fp8 copy's default CUDA shape and the plain one with fp32 and with bf16 records "
                    "(v3_rc_fp8_sl_cu_<shape>_r32 / _r16: the record bytes' share, a bound; B >= 128, fp32 states); "
                    "'mmaf' = the fold on the tensor cores (gdn_main.cu's MMA_FOLD: v3_mf_<shape>; bf16 states: the "
                    "default, ST_MMA's m7 / m8 and their _mf, the CUDA-core dots' _mf shapes; fp32 states: the default and its _mf; the first "
                    "CUDA-core shape without folds; round-robin medians; B >= 128)")
    ap.add_argument("--impl", default="v1,v2", help="which of ours to run: v1 (kernels/decode.py), v2 "
                    "(kernels/decode_v2.py), or both")
    ap.add_argument("--v2-sweep", action="store_true", help="first time decode_v2.V2_SWEEP (BVxwarps) at B=256")
    ap.add_argument("--v2-sweep-configs", default=None)
    ap.add_argument("--v3-sweep", action="store_true", help="first time decode_v3.V3_SWEEP (BVxwarps) at B=256")
    ap.add_argument("--v3-sweep-configs", default=None)
    ap.add_argument("--commit", default=os.environ.get("REPLAYSSM_COMMIT", "unknown"))
    ap.add_argument("--split-server-like", action="store_true",
                    help="--step-split with the arguments as the server passes them: the ring keyed by request row "
                         "(ring_idx, twice as many ring rows as batch rows) and a forced-flush mask")
    ap.add_argument("--split-staggered", action="store_true",
                    help="--step-split with staggered cursors (row r starts at h = r %% L, as rows admitted at different "
                         "steps are in a server): 1/L of the rows write their checkpoint on every step")
    ap.add_argument("--step-split", action="store_true", help="only the per-launch split by step of a window "
                    "(aligned cursors unless --split-staggered, fp32 states, the largest of --batches; conv and --split-arms): where a decode "
                    "step's time goes on the steps that write no checkpoint and on the one that does")
    ap.add_argument("--split-arms", default=",".join(SPLIT_ARMS), help="names from SPLIT_ARMS")
    ap.add_argument("--cache-len", type=int, default=16,
                    help="--step-split's ring length L (the server's --linear-replayssm-cache-len; default 16): the "
                         "window the decode steps run, so one step in L writes the checkpoints")
    args = ap.parse_args()
    variants = set(args.variants.split(",")) - {""}
    if args.plot:
        plot(args.plot)
        return
    if args.rebytes:
        print(rebytes(args.rebytes))
        return
    if args.table:
        print(table(args.table))
        return

    import triton

    dev = torch.device("cuda")
    meta = dict(gpu=torch.cuda.get_device_name(0), torch=torch.__version__, triton=triton.__version__,
                python=platform.python_version(), commit=args.commit, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                L=16, method="CUDA graph of NSTEPS decode steps, staggered cursors, pools rotated over >= 4x L2, "
                "do_bench median of replays / NSTEPS")
    meta["copy_peak_Bps"] = copy_peak(dev)
    print(f"# {meta['gpu']}  copy peak {meta['copy_peak_Bps'] / 1e12:.2f} TB/s  commit {args.commit}", flush=True)
    if args.step_split:
        run_step_split(args, dev, meta)
        return
    rows = []
    chosen = {}
    kinds, dtypes = args.kinds.split(","), args.dtypes.split(",")
    batches = [int(b) for b in args.batches.split(",")]

    impls = args.impl.split(",")
    chosen2 = {}
    chosen3 = {}
    sweeps = []  # (impl, module holding _LAST, BVxwarps[xNK] configs, where the fastest goes)
    if args.sweep:
        from replayssm_sglang.kernels import decode as _d1
        sweeps.append(("v1", _d1, args.sweep_configs, chosen))
    if args.v2_sweep and "v2" in impls:
        from replayssm_sglang.kernels import decode_v2 as _d2
        sweeps.append(("v2", _d2, args.v2_sweep_configs or _d2.V2_SWEEP, chosen2))
    if args.v3_sweep and "v3" in impls:
        from replayssm_sglang.kernels import decode_v3 as _d3
        sweeps.append(("v3", _d3, args.v3_sweep_configs or _d3.V3_SWEEP, chosen3))
    for impl_s, mod_s, cfg_s, chosen_s in sweeps:
        cfgs = [tuple(int(v) for v in s.split("x")) for s in cfg_s.split(",")]
        for kind in kinds:
            for sdt in dtypes:
                c = Case(kind, 256, sdt, dev)
                best = None
                for cfg in cfgs:
                    try:
                        t = time_graph(c, arm_ours(c, torch.bfloat16, cfg=cfg, impl=impl_s))
                    except Exception as e:  # noqa: BLE001
                        print(f"{impl_s} sweep {kind} {sdt} {cfg}: failed {type(e).__name__}: {str(e)[:200]}")
                        continue
                    res_k = _compiled_resources(mod_s)
                    regs = (res_k.get("n_regs"), res_k.get("n_spills"))
                    nk = f" NK={cfg[2]}" if len(cfg) > 2 else ""
                    print(f"{impl_s} sweep {kind} {sdt} B=256 BV={cfg[0]} warps={cfg[1]}{nk}: {t * 1e6:.1f} us"
                          f"  regs {regs[0]} spills {regs[1]}", flush=True)
                    prefix = "" if impl_s == "v1" else impl_s  # v1's rows keep their names ("sweep_...")
                    rows.append(dict(kind=kind, state_dtype=sdt, B=256, arm=f"{prefix}sweep_" + "x".join(map(str, cfg)),
                                     t_us=t * 1e6, n_regs=regs[0], n_spills=regs[1]))
                    if best is None or t < best[0]:
                        best = (t, cfg)
                if best:
                    chosen_s[f"{kind}/{sdt}"] = best[1]
                del c
                torch.cuda.empty_cache()
    meta["configs"] = {k: list(v) for k, v in chosen.items()}
    meta["v2_configs"] = {k: list(v) for k, v in chosen2.items()}
    meta["v3_configs"] = {k: list(v) for k, v in chosen3.items()}

    for kind in kinds:
        for sdt in dtypes:
            cfg = chosen.get(f"{kind}/{sdt}")
            cfg2 = chosen2.get(f"{kind}/{sdt}")
            cfg3 = chosen3.get(f"{kind}/{sdt}")
            v1, v2, v3 = "v1" in impls, "v2" in impls, "v3" in impls
            for B in batches:
                c = Case(kind, B, sdt, dev)
                timed = {}  # arm -> seconds per step, timed before the loop below (--variants placerr)
                arms = {
                    "conv": arm_conv(c),
                    "conv_cuda": arm_conv_cuda(c),
                    "upstream": arm_upstream(c),
                    "ours_r32": arm_ours(c, torch.float32, cfg=cfg)
                    if v1 and sdt == "float32" and "r32" in variants else None,
                    "ours_r16": arm_ours(c, torch.bfloat16, cfg=cfg) if v1 else None,
                    "ours_L1": arm_ours(c, torch.bfloat16, window=1, cfg=cfg) if v1 and B <= 32 else None,
                    "ours_r16_dot": arm_ours(c, torch.bfloat16, cfg=cfg, fold="dot")
                    if v1 and "dot" in variants else None,
                    "diag_no_atomics": arm_ours(c, torch.bfloat16, cfg=cfg, freeze_h=True)
                    if v1 and "freeze" in variants else None,
                    "v2_r16": arm_ours(c, torch.bfloat16, cfg=cfg2, impl="v2") if v2 else None,
                    "v2_r32": arm_ours(c, torch.float32, cfg=cfg2, impl="v2") if v2 and sdt == "float32" else None,
                    "v2_r16_rows": arm_ours(c, torch.bfloat16, cfg=cfg2, impl="v2", rows=True) if v2 else None,
                    "v2_r16_unroll": arm_ours(c, torch.bfloat16, cfg=cfg2, impl="v2", fold="unroll")
                    if v2 and "unroll" in variants else None,
                    "v2_r16_all": arm_ours(c, torch.bfloat16, cfg=cfg2, impl="v2", records="all")
                    if v2 and "all" in variants else None,
                    "v3_r16": arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3") if v3 else None,
                    "v3_r32": arm_ours(c, torch.float32, cfg=cfg3, impl="v3") if v3 and sdt == "float32" else None,
                    "v3_r16_rows": arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3", rows=True) if v3 else None,
                    "v3_L1": arm_ours(c, torch.bfloat16, window=1, cfg=cfg3, impl="v3") if v3 and B <= 32 else None,
                    "v3_rc_bf16": arm_ours(c, torch.float32, cfg=cfg3, impl="v3", read_dtype="bf16")
                    if v3 and sdt == "float32" and "rc" in variants else None,
                    "v3_rc_fp8": arm_ours(c, torch.float32, cfg=cfg3, impl="v3", read_dtype="fp8_e4m3")
                    if v3 and sdt == "float32" and "rc" in variants else None,
                    "v3_r16_chunked": arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3", fold="chunked")
                    if v3 and "chunked" in variants else None,
                    "v3_r32_chunked": arm_ours(c, torch.float32, cfg=cfg3, impl="v3", fold="chunked")
                    if v3 and sdt == "float32" and "chunked" in variants else None,
                }
                if v3 and "v3dot" in variants:  # the fold as one tl.dot per K chunk (fp32 FMA / tf32x3)
                    for fd in ("dot", "dot3"):
                        arms[f"v3_r16_{fd}"] = arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3", fold=fd)
                        if sdt == "float32":
                            arms[f"v3_r32_{fd}"] = arm_ours(c, torch.float32, cfg=cfg3, impl="v3", fold=fd)
                            if "rc" in variants:
                                for rd in ("bf16",):  # an fp8 copy with a dot fold is refused (decode_v3.launch)
                                    arms[f"v3_rc_{rd}_{fd}"] = arm_ours(
                                        c, torch.float32, cfg=cfg3, impl="v3", fold=fd,
                                        read_dtype="bf16" if rd == "bf16" else "fp8_e4m3")
                    if B == 256:
                        for bv, nw in ((32, 2), (64, 2), (64, 4)):
                            arms[f"v3d_{bv}x{nw}"] = arm_ours(c, torch.bfloat16, cfg=(bv, nw), impl="v3", fold="dot3")
                if v3 and "pipe" in variants and B >= 128:  # the tile read software-pipelined through shared memory
                    P3 = dict(pipe_stages=3, chunk_bytes=128, fold_bytes=64)
                    arms["v3p_r16"] = arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3", fold="dot3", v3_opts=P3)
                    arms["v3p_r16_c256"] = arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3", fold="dot3",
                                                    v3_opts=dict(P3, chunk_bytes=256))
                    arms["v3p_r16_chunked"] = arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3", fold="chunked",
                                                       v3_opts=P3)
                    arms["v3p_r16_64x2"] = arm_ours(c, torch.bfloat16, cfg=(64, 2), impl="v3", fold="dot3",
                                                    v3_opts=dict(P3, pipe_stages=2, chunk_bytes=256))
                    if sdt == "float32":
                        arms["v3p_r32"] = arm_ours(c, torch.float32, cfg=cfg3, impl="v3", fold="dot3", v3_opts=P3)
                        for cb in (64, 128):
                            arms[f"v3p_rc_fp8_c{cb}"] = arm_ours(
                                c, torch.float32, cfg=cfg3, impl="v3", fold="chunked", read_dtype="fp8_e4m3",
                                v3_opts=dict(P3, chunk_bytes=cb))  # fp8 copies fold with the record loop
                        arms["v3p_rc_bf16"] = arm_ours(c, torch.float32, cfg=cfg3, impl="v3", fold="dot3",
                                                       read_dtype="bf16", v3_opts=P3)
                if v3 and "rc" in variants and sdt == "float32":  # the copy read in 16-byte chunks (the old layout)
                    arms["v3_rc_fp8_c16"] = arm_ours(c, torch.float32, cfg=cfg3, impl="v3", read_dtype="fp8_e4m3",
                                                     v3_opts=dict(chunk_bytes=16))
                if v3 and "mma" in variants and kind == "gdn":
                    # the 2- / 1-byte tiles' C q / C k on the tensor cores (decode_v3 tile_mma; V3_TUNED has it for
                    # GDN's bf16 copy and bf16 states since session 19): the server's launches (*_srv) beside the same
                    # without it (*_nomma), the bf16 state also beside its launch before session 19 (*_s18: the
                    # record-loop fold, the 64-byte unrolled read), the fp8 copy with it (its default is without)
                    arms["v3_r16_srv"] = arm_ours(c, torch.bfloat16, impl="v3")
                    arms["v3_r16_nomma"] = arm_ours(c, torch.bfloat16, impl="v3", v3_opts=dict(tile_mma=False))
                    arms["v3_r16_s18"] = arm_ours(c, torch.bfloat16, impl="v3", fold="loop", v3_opts=dict(
                        tile_mma=False, pipe_stages=0, chunk_bytes=64, fold_bytes=64, fold_pipe_stages=0, pdl=False))
                    if sdt == "float32":
                        arms["v3_rc_bf16_srv"] = arm_ours(c, torch.float32, impl="v3", read_dtype="bf16")
                        arms["v3_rc_bf16_nomma"] = arm_ours(c, torch.float32, impl="v3", read_dtype="bf16",
                                                            v3_opts=dict(tile_mma=False))
                        arms["v3_rc_fp8_srv"] = arm_ours(c, torch.float32, impl="v3", read_dtype="fp8_e4m3")
                        rec, cfg, kw = SPLIT_ARMS["v3_rc_fp8_mma"]
                        arms["v3_rc_fp8_mma"] = arm_ours(c, rec, cfg=cfg, impl="v3", **kw)
                if v3 and "mma" in variants and kind == "kda":
                    # KDA's split-operand tile_mma (session 20, opt-in): the server's launch (*_srv) beside the same
                    # with tile_mma (*_mma), bf16 states also with GDN's bf16-state launch (*_mma_p3: the read
                    # pipelined in 128-byte chunks, the pipelined tf32x3 fold); fp32 states with the bf16 copy and
                    # predecayed keys (the server's for KDA without speculative decoding)
                    p3 = dict(pipe_stages=3, chunk_bytes=128, fold_bytes=64, fold_pipe_stages=3, pdl=True)
                    arms["v3_r16_srv"] = arm_ours(c, torch.bfloat16, impl="v3")
                    arms["v3_r16_mma"] = arm_ours(c, torch.bfloat16, impl="v3", v3_opts=dict(tile_mma=True))
                    arms["v3_r16_mma_p3"] = arm_ours(c, torch.bfloat16, impl="v3", fold="dot3",
                                                     v3_opts=dict(p3, tile_mma=True))
                    arms["v3_r16_p3"] = arm_ours(c, torch.bfloat16, impl="v3", fold="dot3",
                                                 v3_opts=dict(p3, tile_mma=False))
                    if sdt == "float32":
                        # the bf16 copy (V3_TUNED since session 21: tile_mma with the read pipelined in 128-byte
                        # chunks) beside its launch before (*_s20: CUDA-core tile, unrolled 64-byte read), the
                        # pipelined read without tile_mma (*_nomma) and tile_mma with the unrolled read (*_mma_u)
                        arms["v3_rc_bf16_srv"] = arm_ours(c, torch.float32, impl="v3", read_dtype="bf16",
                                                          kda_keys="predecayed")
                        arms["v3_rc_bf16_s20"] = arm_ours(c, torch.float32, impl="v3", read_dtype="bf16",
                                                          kda_keys="predecayed", v3_opts=dict(
                                                              tile_mma=False, pipe_stages=0, chunk_bytes=64))
                        arms["v3_rc_bf16_nomma"] = arm_ours(c, torch.float32, impl="v3", read_dtype="bf16",
                                                            kda_keys="predecayed", v3_opts=dict(tile_mma=False))
                        arms["v3_rc_bf16_mma_u"] = arm_ours(c, torch.float32, impl="v3", read_dtype="bf16",
                                                            kda_keys="predecayed", v3_opts=dict(
                                                                tile_mma=True, pipe_stages=0, chunk_bytes=64))
                if "w1" in variants and B <= 128:  # the window-1 kernel (the small-batch policy's path)
                    arms["ours_w1"] = arm_ours(c, torch.bfloat16, window=1, impl="w1")
                if v3 and "pdl" in variants:  # main and post launches as programmatic dependents (PDL)
                    P3 = dict(pipe_stages=3, chunk_bytes=128, fold_bytes=64)
                    arms["v3p_r16_pdl"] = arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3", fold="dot3",
                                                   v3_opts=dict(P3, pdl=True))
                    if sdt == "float32":
                        arms["v3p_r32_pdl"] = arm_ours(c, torch.float32, cfg=cfg3, impl="v3", fold="dot3",
                                                       v3_opts=dict(P3, pdl=True))
                    else:  # bf16 states: the pipelined read (not their default yet), without and with PDL
                        arms["v3p_r16"] = arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3", fold="dot3", v3_opts=P3)
                    if B >= 128:
                        for bv, nw, cb in ((64, 2, 256), (32, 2, 128), (64, 4, 256)):
                            for rn, rdt in (("r16", torch.bfloat16), ("r32", torch.float32)):
                                if rn == "r32" and sdt != "float32":
                                    continue
                                arms[f"v3p_{rn}_pdl_{bv}x{nw}"] = arm_ours(
                                    c, rdt, cfg=(bv, nw), impl="v3", fold="dot3",
                                    v3_opts=dict(P3, chunk_bytes=cb, pdl=True))
                if v3 and "aligned" in variants and B >= 128 and c.NL == 1:
                    # every row on the same cursor: one step in L writes every checkpoint (with one pool and
                    # NSTEPS = L = 16, every graph replay holds exactly one such step)
                    arms["upstream_aligned"] = arm_upstream(c, aligned=True)
                    arms["v3_r16_aligned"] = arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3", aligned=True)
                    if sdt == "float32":
                        arms["v3_r32_aligned"] = arm_ours(c, torch.float32, cfg=cfg3, impl="v3", aligned=True)
                if v3 and "order" in variants and B >= 128 and sdt == "float32":
                    # the main launch's dispatch order (decode_v3 row_order): with staggered cursors 1 row in L folds
                    # each step, its programs ~3.6x a plain one's time and spread through the grid; rows outermost
                    # in batch order, then the folding rows first (one small launch for the order), then that with
                    # the main launch capped at 96 registers (the permutation's load takes it 92 -> 103 offline:
                    # 21 -> 19 programs per SM); the aligned arm is the same work with no mixing at all
                    keys = ("raw", "predecayed") if c.kind == "kda" else ("raw",)
                    for kk in keys:
                        tag = "v3_r32" + ("_pred" if kk == "predecayed" else "")
                        if kk == "predecayed":
                            arms[tag] = arm_ours(c, torch.float32, cfg=cfg3, impl="v3", kda_keys=kk)
                        for sfx, opts in (("_rows", dict(row_order="rows")), ("_ff", dict(row_order="flush_first")),
                                          ("_ff_m96", dict(row_order="flush_first", main_maxnreg=96))):
                            arms[tag + sfx] = arm_ours(c, torch.float32, cfg=cfg3, impl="v3", kda_keys=kk,
                                                       v3_opts=opts)
                        if c.NL == 1:
                            arms[tag + "_aligned"] = arm_ours(c, torch.float32, cfg=cfg3, impl="v3", kda_keys=kk,
                                                              aligned=True)
                    # as the server launches it (the ring keyed by request row, a forced mask, V3_TUNED; KDA with
                    # predecayed keys), without a copy and with each read copy: the grid order (*_grid; V3_TUNED's
                    # before session 23), V3_TUNED (rows outermost since session 23) and that with the pre launch's
                    # rows outermost too (*_pre, decode_v3 pre_order "rows", opt-in)
                    kk = "predecayed" if c.kind == "kda" else "raw"
                    for rd in ("same", "bf16", "fp8_e4m3"):
                        tag = "v3_sl" if rd == "same" else f"v3_rc_{rd[:4].rstrip('_')}_sl"
                        grid = dict(row_order="grid")
                        if c.kind == "kda" and rd == "same":
                            grid["main_maxnreg"] = 255  # the hardware's limit: KDA's 96 cap came with "rows"
                        for sfx, opts in (("_grid", grid), ("", None), ("_pre", dict(pre_order="rows"))):
                            arms[tag + sfx] = arm_ours(c, torch.float32, impl="v3", kda_keys=kk, read_dtype=rd,
                                                       server_like=True, v3_opts=opts)
                        if rd != "fp8_e4m3":  # (the fp8 copies' V3_TUNED has two heads per program already)
                            # two value heads per program, slower in the grid order (session 9): a row's heads
                            # are adjacent in the rows order, so the second head's loads may hit what the first
                            # brought in
                            arms[tag + "_hpp2"] = arm_ours(c, torch.float32, impl="v3", kda_keys=kk, read_dtype=rd,
                                                           server_like=True, v3_opts=dict(heads_per_program=2))
                if v3 and "regcap" in variants and B == 256 and sdt == "float32":
                    # the main launch's register cap as the server launches it (V3_TUNED otherwise; rows
                    # outermost): fewer registers let more programs sit on an SM (the plain step's floor is per
                    # program), more let the checkpoint step's fold keep its tiles; KDA's 96 is session 23's pick
                    kk = "predecayed" if c.kind == "kda" else "raw"
                    for rd in ("same", "fp8_e4m3"):
                        tag = "v3_sl" if rd == "same" else "v3_rc_fp8_sl"
                        caps = (72, 80, 88, 96, 104, 112, 128) if rd == "same" else (128, 144, 200)
                        for mx in caps:
                            arms[f"{tag}_m{mx}"] = arm_ours(c, torch.float32, impl="v3", kda_keys=kk, read_dtype=rd,
                                                            server_like=True, v3_opts=dict(main_maxnreg=mx))
                if v3 and "place" in variants and B == 256 and sdt == "float32":
                    # the same launch (the server's, V3_TUNED) on rings allocated at different places: a pad of
                    # p MiB allocated before each ring moves it; the first arm is timed again last (drift over
                    # the run, against the spread between placements). Where each ring's record arrays start
                    # goes to meta["placement"].
                    kk = "predecayed" if c.kind == "kda" else "raw"
                    pads, place = [], meta.setdefault("placement", {})
                    for i, mib in enumerate((0, 1, 2, 3, 5, 8, 13, 21)):
                        pads.append(torch.empty(mib << 20, dtype=torch.uint8, device=c.dev))
                        got = []
                        arms[f"v3_sl_p{i}"] = arm_ours(c, torch.float32, impl="v3", kda_keys=kk, server_like=True,
                                                       rings_out=got)
                        place[f"{kind}/v3_sl_p{i}"] = {f: getattr(got[0], f).data_ptr() for f in ("u", "k", "g", "h")}
                    arms["v3_sl_p0_again"] = arms["v3_sl_p0"]
                    if "placerr" in variants:
                        # placement or drift: the eight placements timed round-robin, PLACE_ROUNDS rounds of one
                        # graph each, the clocks read after every round; each arm's result is its median over the
                        # rounds, every round's time in meta["place_rounds"]
                        del arms["v3_sl_p0_again"]
                        names = [f"v3_sl_p{i}" for i in range(8)]
                        # the runs stay referenced while their graphs replay: a graph does not keep the rings its
                        # kernels read alive (fc91e27 dropped them: KDA's replays then read freed memory and faulted)
                        runs = {n: arms.pop(n) for n in names}
                        graphs = {n: capture_graph(c, runs[n]) for n in names}
                        per = {n: [] for n in names}
                        clocks = meta.setdefault("place_clocks", {}).setdefault(kind, [])
                        for rnd in range(PLACE_ROUNDS):
                            # odd rounds in the reverse order: does a stable arm follow its place or its turn?
                            for n in (names if rnd % 2 == 0 else names[::-1]):
                                per[n].append(time_replays(c, graphs[n]))
                            clocks.append(gpu_clocks())
                            print(f"{kind} place round {rnd}{' (reversed)' if rnd % 2 else ''}: "
                                  + " ".join(f"{per[n][-1] * 1e6:6.1f}" for n in names) + f" | {clocks[-1]}",
                                  flush=True)
                        keep_rounds(per, meta, "place_rounds", kind, timed)
                        del graphs, runs
                if v3 and "cuda" in variants and kind == "gdn" and sdt == "float32" and B >= 128:
                    # the main launch in CUDA (kernels/gdn_main.cu, decode_v3 main_impl "cuda"), as the server
                    # launches it, in each block shape of cuda_main.CUDA_CONFIGS, beside V3_TUNED's Triton launch
                    # (v3_sl); v3_sl_cu_nopdl: the default shape without PDL (the pre launch fully exposed)
                    from replayssm_sglang.kernels import cuda_main as _cm

                    arms["v3_sl"] = arm_ours(c, torch.float32, impl="v3", server_like=True)
                    for name in _cm.CUDA_CONFIGS:
                        if name in ("r16w4", "g16w4", "g8w2_m10", "g8w2_late",  # (timed slower in runs 2158-2249)
                                    "g8w4_m8", "g8w2_m16", "g8w1_m32", "g8w8_m4", "g8w4_m8_late", "g8w1_m32_late",
                                    "g8w2_m16_late",  # (a bf16 checkpoint's shapes: --variants cuda16)
                                    "g8w4_m7_late", "g8w2_m14_late", *_cm.KDA_ONLY):  # (KDA's: --variants cudakda)
                            continue
                        arms[f"v3_sl_cu_{name}"] = arm_ours(c, torch.float32, impl="v3", server_like=True,
                                                            v3_opts=dict(main_impl="cuda", cuda_config=name))
                    arms["v3_sl_cu_nopdl"] = arm_ours(c, torch.float32, impl="v3", server_like=True,
                                                      v3_opts=dict(main_impl="cuda", pdl=False))
                    if c.NL == 1:
                        arms["v3_sl_aligned"] = arm_ours(c, torch.float32, impl="v3", server_like=True, aligned=True)
                        arms["v3_sl_cu_aligned"] = arm_ours(c, torch.float32, impl="v3", server_like=True,
                                                            aligned=True, v3_opts=dict(main_impl="cuda"))
                    # the main launch alone (Triton's, CUDA's default), and CUDA's streaming floor: the tile read and
                    # its dots only (register and shared-memory reads; wrong results, timing only)
                    arms["v3_sl_main"] = arm_ours(c, torch.float32, impl="v3", server_like=True,
                                                  v3_opts=dict(_diag_parts="main"))
                    arms["v3_sl_cu_main"] = arm_ours(c, torch.float32, impl="v3", server_like=True,
                                                     v3_opts=dict(main_impl="cuda", _diag_parts="main"))
                    # the step split by launch (each part alone and in pairs; with PDL as the server runs them)
                    for dg in ("pre", "post", "pre+main", "main+post"):
                        arms[f"v3_sl_cu_{dg.replace('+', '')}"] = arm_ours(
                            c, torch.float32, impl="v3", server_like=True,
                            v3_opts=dict(main_impl="cuda", _diag_parts=dg))
                    # bf16 records (issue 3's "ideas worth trying"; the server keeps fp32 records): Triton's main
                    # launch and the CUDA one
                    arms["v3_sl_r16"] = arm_ours(c, torch.bfloat16, impl="v3", server_like=True)
                    arms["v3_sl_cu_g8w4_r16"] = arm_ours(c, torch.bfloat16, impl="v3", server_like=True,
                                                         v3_opts=dict(main_impl="cuda", cuda_config="g8w4"))
                    for name in ("g8w2",):
                        for dg in ("stream", "nofold"):
                            arms[f"v3_sl_cu_{name}_{dg}"] = arm_ours(
                                c, torch.float32, impl="v3", server_like=True,
                                v3_opts=dict(main_impl="cuda", cuda_config=name, _diag_parts=dg))
                    # the pre launch's work in every Triton main program (decode_v3 self_pre, session 28; no pre
                    # launch): 32- and 64-row tiles (8 / 4 programs per key head), fp32 and bf16 records
                    arms["v3_sl_sp"] = arm_ours(c, torch.float32, impl="v3", server_like=True,
                                                v3_opts=dict(self_pre=True))
                    for bv, nw in ((64, 1), (64, 2)):
                        arms[f"v3_sl_sp{bv}w{nw}"] = arm_ours(c, torch.float32, cfg=(bv, nw), impl="v3",
                                                              server_like=True, v3_opts=dict(self_pre=True))
                    arms["v3_sl_sp_r16"] = arm_ours(c, torch.bfloat16, impl="v3", server_like=True,
                                                    v3_opts=dict(self_pre=True))
                    arms["v3_sl_again"] = arms["v3_sl"]  # timed again last: the drift over the run
                    if "curr" in variants:
                        # Triton's and CUDA's main launch (the server's launch otherwise) timed round-robin, PLACE_ROUNDS
                        # rounds of one graph each, odd rounds in reverse order: is the difference the arms' or their
                        # turn's? Each arm's result is its median over the rounds, every round in meta["cu_rounds"]
                        round_robin_medians(c, {"v3_sl_rr": arms["v3_sl"], "v3_sl_cu_rr": arms["v3_sl_cu_g8w4"],
                                                "v3_sl_sp_rr": arms["v3_sl_sp"]}, f"{kind} cuda",
                                            meta, "cu_rounds", kind, timed)
                if v3 and "cuda16" in variants and kind == "gdn" and sdt == "bfloat16" and B >= 128:
                    # a bf16 checkpoint through the CUDA main launch (gdn_main.cu's ST_T, 8-byte loads), with fp32
                    # records (the server stores bf16 records beside a bf16 state: v3_sl_cu_r16 is its launch; 128.4
                    # against 127.5 us in run 0808), in each shape of cuda_main.CUDA_BF16_CONFIGS, beside V3_TUNED's
                    # Triton launch (v3_sl); the step split and the streaming floor of the default shape
                    from replayssm_sglang.kernels import cuda_main as _cm

                    arms["v3_sl"] = arm_ours(c, torch.float32, impl="v3", server_like=True)
                    for name in _cm.CUDA_BF16_CONFIGS:
                        arms[f"v3_sl_cu_{name}"] = arm_ours(c, torch.float32, impl="v3", server_like=True,
                                                            v3_opts=dict(main_impl="cuda", cuda_config=name))
                    arms["v3_sl_cu_r16"] = arm_ours(c, torch.bfloat16, impl="v3", server_like=True,
                                                    v3_opts=dict(main_impl="cuda"))
                    for dg in ("main", "pre", "pre+main", "stream", "nofold"):
                        arms[f"v3_sl_cu_{dg.replace('+', '')}"] = arm_ours(
                            c, torch.float32, impl="v3", server_like=True,
                            v3_opts=dict(main_impl="cuda", _diag_parts=dg))
                    arms["v3_sl_again"] = arms["v3_sl"]  # timed again last: the drift over the run
                    if "curr" in variants:  # the closest shapes round-robin (odd rounds reversed), medians
                        round_robin_medians(c, {f"v3_sl_cu_{n}_rr": arms[f"v3_sl_cu_{n}"]
                                                for n in _cm.CUDA_BF16_CONFIGS}, f"{kind} bf16 cuda",
                                            meta, "cu16_rounds", f"{kind}/B{B}", timed)
                if v3 and "cudakda" in variants and kind == "kda" and B >= 128:
                    # KDA's main launch in CUDA (gdn_main.cu's IS_KDA: predecayed keys), with fp32 records (the
                    # server's beside an fp32 state; beside a bf16 one it stores bf16 records, v3_sl_cu_r16) and
                    # predecayed keys, fp32 or bf16 checkpoint, in each shape of its state's list,
                    # beside V3_TUNED's Triton launch (v3_sl); the default shape's step split and streaming floor;
                    # with "curr" the Triton launch and the shapes round-robin
                    from replayssm_sglang.kernels import cuda_main as _cm

                    kk = dict(kda_keys="predecayed", server_like=True)
                    names = _cm.CUDA_KDA_FP32_CONFIGS if sdt == "float32" else _cm.CUDA_KDA_BF16_CONFIGS
                    arms["v3_sl"] = arm_ours(c, torch.float32, impl="v3", **kk)
                    for name in names:
                        arms[f"v3_sl_cu_{name}"] = arm_ours(c, torch.float32, impl="v3", **kk,
                                                            v3_opts=dict(main_impl="cuda", cuda_config=name))
                    arms["v3_sl_cu_r16"] = arm_ours(c, torch.bfloat16, impl="v3", **kk, v3_opts=dict(main_impl="cuda"))
                    if sdt == "float32":
                        arms["v3_sl_cu_nopdl"] = arm_ours(c, torch.float32, impl="v3", **kk,
                                                          v3_opts=dict(main_impl="cuda", pdl=False))
                    arms["v3_sl_main"] = arm_ours(c, torch.float32, impl="v3", **kk, v3_opts=dict(_diag_parts="main"))
                    for dg in ("main", "pre", "pre+main", "stream", "nofold"):
                        arms[f"v3_sl_cu_{dg.replace('+', '')}"] = arm_ours(
                            c, torch.float32, impl="v3", **kk, v3_opts=dict(main_impl="cuda", _diag_parts=dg))
                    arms["v3_sl_again"] = arms["v3_sl"]  # timed again last: the drift over the run
                    if "curr" in variants:
                        rr = {"v3_sl_rr": arms["v3_sl"]}
                        rr.update({f"v3_sl_cu_{n}_rr": arms[f"v3_sl_cu_{n}"] for n in names})
                        round_robin_medians(c, rr, f"{kind} {sdt} cuda", meta, "cukda_rounds", f"{kind}/{sdt}/B{B}",
                                            timed)
                if v3 and "cudapre" in variants and B >= 32:  # (B = 32 and 64: the bf16 policy's threshold, beside w1)
                    # the pre launch in CUDA (GDN session 31, KDA session 32): does a one-wave pre launch (64
                    # registers for GDN, 72 for KDA, the loads that do not need h issued before it) shorten the step?
                    # (GDN: 12.8 -> 7.3 us, the step 175.5 -> 171.9 at fp32, run 1602.) Beside both main launches,
                    # with the step split; KDA with the server's predecayed keys
                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    # the server's records: the state's element type (sglang_hooks.pool.record_dtype_for: bf16
                    # records beside a bf16 state; sessions 32-33 timed the bf16 states with fp32 records here)
                    rec = DT[sdt]
                    arms["v3_sl"] = arm_ours(c, rec, impl="v3", **srv)
                    arms["v3_sl_cpre"] = arm_ours(c, rec, impl="v3", **srv, v3_opts=dict(pre_impl="cuda"))
                    arms["v3_sl_cu"] = arm_ours(c, rec, impl="v3", **srv, v3_opts=dict(main_impl="cuda"))
                    arms["v3_sl_cu_cpre"] = arm_ours(c, rec, impl="v3", **srv,
                                                     v3_opts=dict(main_impl="cuda", pre_impl="cuda"))
                    for dg in ("pre", "pre+main"):
                        arms[f"v3_sl_cu_{dg.replace('+', '')}"] = arm_ours(
                            c, rec, impl="v3", **srv, v3_opts=dict(main_impl="cuda", _diag_parts=dg))
                        arms[f"v3_sl_cu_cpre_{dg.replace('+', '')}"] = arm_ours(
                            c, rec, impl="v3", **srv,
                            v3_opts=dict(main_impl="cuda", pre_impl="cuda", _diag_parts=dg))
                    arms["v3_sl_cu_main"] = arm_ours(c, rec, impl="v3", **srv,
                                                     v3_opts=dict(main_impl="cuda", _diag_parts="main"))
                    if sdt == "float32":
                        # what fewer record bytes would buy beside both CUDA launches: bf16 records of keys and u
                        # (not the server's for an fp32 state; a bound for exact byte cuts such as GDN's raw bf16
                        # keys, design.md "Session 33")
                        arms["v3_sl_cu_cpre_r16"] = arm_ours(c, torch.bfloat16, impl="v3", **srv,
                                                             v3_opts=dict(main_impl="cuda", pre_impl="cuda"))
                        arms["v3_sl_cu_cpre_r16_pre"] = arm_ours(
                            c, torch.bfloat16, impl="v3", **srv,
                            v3_opts=dict(main_impl="cuda", pre_impl="cuda", _diag_parts="pre"))
                    if kind == "gdn" and sdt == "float32":
                        # the main launch's coefficients waited for after its tile's dots (late), beside the short
                        # CUDA pre launch: does the first wave's streaming hide more of it? (session 32)
                        for shape in ("g8w4_late", "g8w2_late"):
                            arms[f"v3_sl_cu_cpre_{shape}"] = arm_ours(
                                c, torch.float32, impl="v3", **srv,
                                v3_opts=dict(main_impl="cuda", pre_impl="cuda", cuda_config=shape))
                    arms["v3_sl_cu_again"] = arms["v3_sl_cu"]  # timed again last: the drift over the run
                    if "curr" in variants:  # the two pre launches before the CUDA main launch, round-robin, medians
                        round_robin_medians(c, {"v3_sl_cu_rr": arms["v3_sl_cu"],
                                                "v3_sl_cu_cpre_rr": arms["v3_sl_cu_cpre"]}, f"{kind} {sdt} cuda pre",
                                            meta, "cpre_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "rccu" in variants and B >= 128 and sdt == "float32":
                    # issue 7: the read copies (fp8 e4m3 with per-V-row scales, bf16) read by the CUDA main launch in
                    # the XL layout (session 36; the server's since session 37), against Triton's read-copy launch
                    # (the server's before) and the conventional fp32 decode (the row's "conv"); the pre launch as the
                    # server's (GDN: CUDA's since session 37, which reads rc_valid too; _tpre: Triton's); the copies
                    # current (steady state), fp32 records
                    from replayssm_sglang.kernels import cuda_main as _cm_rc
                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    shapes = _cm_rc.XL_RC_CONFIGS[kind]
                    pre_srv = "cuda" if kind in _cm_rc.PRE_AUTO_KINDS else "triton"  # (the server's, by default)
                    rc_names = []
                    for rd, tag in (("fp8_e4m3", "v3_rc_fp8_sl"), ("bf16", "v3_rc_bf16_sl")):
                        arms[tag] = arm_ours(c, torch.float32, impl="v3", read_dtype=rd, **srv)
                        rc_names.append(tag)
                        for name in shapes:  # (RC_MMA's: fp8 copies since session 41, bf16 ones and KDA's since 42)
                            arms[f"{tag}_cu_{name}"] = arm_ours(c, torch.float32, impl="v3", read_dtype=rd, **srv,
                                                                v3_opts=dict(main_impl="cuda", cuda_config=name,
                                                                             pre_impl=server_pre_impl(kind, name)))
                            rc_names.append(f"{tag}_cu_{name}")
                        if kind == "gdn":  # (GDN's pre launch is CUDA's beside the CUDA main launch: Triton's too)
                            arms[f"{tag}_cu_{shapes[0]}_tpre"] = arm_ours(
                                c, torch.float32, impl="v3", read_dtype=rd, **srv,
                                v3_opts=dict(main_impl="cuda", cuda_config=shapes[0], pre_impl="triton"))
                            rc_names.append(f"{tag}_cu_{shapes[0]}_tpre")
                    # the fp8 copy's step split (the first shape): each launch alone, the main launch without its
                    # folds (nofold) and its streaming floor (stream: the tile read and its dots only; timing only)
                    for dg in ("pre", "main", "post", "nofold", "stream"):
                        arms[f"v3_rc_fp8_sl_cu_{shapes[0]}_{dg}"] = arm_ours(
                            c, torch.float32, impl="v3", read_dtype="fp8_e4m3", **srv,
                            v3_opts=dict(main_impl="cuda", cuda_config=shapes[0], _diag_parts=dg, pre_impl=pre_srv))
                    # with every row on the same cursor (aligned: all rows fold in the same step of a window, as the
                    # e2e harness's batch, admitted at once, does), the first shape and the rc_lean ones (the copies'
                    # defaults since session 41's served A/B)
                    for name in shapes:
                        if name == shapes[0] or _cm_rc.full_config(_cm_rc.CUDA_CONFIGS[name])[8]:
                            arms[f"v3_rc_fp8_sl_cu_{name}_aligned"] = arm_ours(
                                c, torch.float32, impl="v3", read_dtype="fp8_e4m3", **srv, aligned=True,
                                v3_opts=dict(main_impl="cuda", cuda_config=name, pre_impl=server_pre_impl(kind, name)))
                    # the rc_lean shapes' main launch alone and streaming floor (session 40: the copy-sized registers,
                    # tighter caps)
                    for name in shapes:
                        if _cm_rc.full_config(_cm_rc.CUDA_CONFIGS[name])[8]:
                            for dg in ("main", "stream"):
                                arms[f"v3_rc_fp8_sl_cu_{name}_{dg}"] = arm_ours(
                                    c, torch.float32, impl="v3", read_dtype="fp8_e4m3", **srv,
                                    v3_opts=dict(main_impl="cuda", cuda_config=name, _diag_parts=dg,
                                                 pre_impl=server_pre_impl(kind, name)))
                    # the first shape's opt-in form, with the fp8 copy and without one (`same`, beside the same shape
                    # as the server runs it): gdn_main.cu's SELF_PRE (GDN, session 37: no pre launch, the main launch
                    # makes its coefficients; `_sp`)
                    if kind == "gdn":
                        arms[f"v3_sl_cu_{shapes[0]}"] = arm_ours(
                            c, torch.float32, impl="v3", **srv,
                            v3_opts=dict(main_impl="cuda", cuda_config=shapes[0], pre_impl=pre_srv))
                        for rd, tag in (("same", "v3_sl"), ("fp8_e4m3", "v3_rc_fp8_sl")):
                            arms[f"{tag}_cu_{shapes[0]}_sp"] = arm_ours(
                                c, torch.float32, impl="v3", read_dtype=rd, **srv,
                                v3_opts=dict(main_impl="cuda", cuda_config=shapes[0], self_pre=True))
                    if "curr" in variants:  # round-robin, medians
                        round_robin_medians(c, {f"{n}_rr": arms[n] for n in rc_names}, f"{kind} {sdt} rccu",
                                            meta, "rccu_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "rcr16" in variants and B >= 128 and sdt == "float32":
                    # what the record bytes cost beside the fp8 copy (session 41): the copy's default shape (the
                    # server's) with fp32 records (the server's, _r32) and with bf16 ones (_r16; not a valid
                    # two-precision decode: the fold would read rounded records; a bound for a read copy of the
                    # records), and the shape without a copy's (x16w4c1_m5 / KDA's default) with both
                    from replayssm_sglang.kernels import cuda_main as _cm_r

                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    d_rc = _cm_r.config_name(_cm_r.default_config(torch.float32, kind, torch.float8_e4m3fn))
                    d_plain = _cm_r.config_name(_cm_r.default_config(torch.float32, kind))
                    for name in dict.fromkeys((d_rc, d_plain)):
                        for rec, rtag in ((torch.float32, "r32"), (torch.bfloat16, "r16")):
                            arms[f"v3_rc_fp8_sl_cu_{name}_{rtag}"] = arm_ours(
                                c, rec, impl="v3", read_dtype="fp8_e4m3", **srv,
                                v3_opts=dict(main_impl="cuda", cuda_config=name, pre_impl=server_pre_impl(kind, name)))
                if v3 and "split" in variants and B >= 128 and sdt == "float32":
                    # split records (session 51, gdn_main.cu's REC_SPLIT): fp32 records whose plain steps read a bf16
                    # high plane and whose folds join the low plane to the exact fp32 value. The fp8 copy's default
                    # shape and the plain state's (GDN's has no pre launch, SELF_PRE 2: its main launch writes both
                    # planes), each with the server's fp32 records (_r32, the server's pre launch), split (_rsp, the
                    # CUDA pre launch where there is one: it writes both planes) and bf16 records (_r16: not a valid
                    # two-precision decode, the fold reads rounded records; the bound of halving the record reads);
                    # round-robin
                    from replayssm_sglang.kernels import cuda_main as _cm_s

                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    s_arms = {}
                    for rd, tag in (("fp8_e4m3", "_fp8"), ("same", "")):
                        name = _cm_s.config_name(_cm_s.default_config(
                            torch.float32, kind, torch.float8_e4m3fn if rd != "same" else None))
                        sp = _cm_s.full_config(_cm_s.CUDA_CONFIGS[name])[10]
                        for rec, rtag in ((torch.float32, "r32"), ("split", "rsp"), (torch.bfloat16, "r16")):
                            pre = None if sp else "cuda" if rec == "split" else server_pre_impl(kind, name)
                            s_arms[f"v3_spl{tag}_{name}_{rtag}"] = arm_ours(
                                c, rec, impl="v3", read_dtype=rd, **srv,
                                v3_opts=dict(main_impl="cuda", cuda_config=name, pre_impl=pre))
                        if rd != "same":  # (and a sibling shape whose split build spills nothing, SPLIT_SIBLINGS)
                            sib = SPLIT_SIBLINGS[kind]
                            for rec, rtag in ((torch.float32, "r32"), ("split", "rsp")):
                                s_arms[f"v3_spl{tag}_{sib}_{rtag}"] = arm_ours(
                                    c, rec, impl="v3", read_dtype=rd, **srv,
                                    v3_opts=dict(main_impl="cuda", cuda_config=sib, pre_impl="cuda"))
                    arms.update(s_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in s_arms.items()}, f"{kind} {sdt} split", meta,
                                        "split_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "mmaf" in variants and B >= 128:
                    # the fold on the tensor cores (gdn_main.cu's MMA_FOLD, mma_fold 1; session 43) against the
                    # CUDA-core fold of the same shape, the server's records, the CUDA pre launch beside each where the
                    # server takes it: a bf16 state's default, ST_MMA's m7 and m8, their _mf and the CUDA-core dots'
                    # _mf shapes (session 44); an fp32 state's
                    # default and its _mf; the first CUDA-core shape without its folds (_nofold, wrong results) is what
                    # the fold can give at most; then all of them round-robin, medians
                    from replayssm_sglang.kernels import cuda_main as _cm_f

                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    if sdt == "bfloat16":
                        mm = (_cm_f.XL_BF16_MMA_CONFIGS if kind == "gdn" else _cm_f.XL_KDA_BF16_MMA_CONFIGS)[1:]
                        mf = (_cm_f.XL_BF16_MMA_MF_CONFIGS + _cm_f.XL_BF16_MF_CONFIGS if kind == "gdn"
                              else _cm_f.XL_KDA_BF16_MMA_MF_CONFIGS + _cm_f.XL_KDA_BF16_MF_CONFIGS)
                        f_names = [_cm_f.config_name(_cm_f.default_config(torch.bfloat16, kind)), *mm, *mf]
                        nofold = mm[0]
                    else:
                        f_names = list(_cm_f.XL_FP32_MF_CONFIGS[kind])
                        nofold = f_names[0]
                    f_arms = {f"v3_mf_{n}": arm_ours(c, DT[sdt], impl="v3", **srv,
                                                     v3_opts=dict(main_impl="cuda", cuda_config=n,
                                                                  pre_impl=server_pre_impl(kind, n)))
                              for n in f_names}
                    f_arms[f"v3_mf_{nofold}_nofold"] = arm_ours(c, DT[sdt], impl="v3", **srv,  # (its cubin prebuilt)
                                                               v3_opts=dict(main_impl="cuda", cuda_config=nofold,
                                                                            pre_impl=server_pre_impl(kind, nofold),
                                                                            _diag_parts="nofold"))
                    arms.update(f_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in f_arms.items()}, f"{kind} {sdt} mmaf",
                                        meta, "mmaf_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "fixed" in variants and B >= 32:
                    # the step's fixed part (session 46): target_bounds.py --fit puts ~10-14 us of every bf16 step at
                    # any B (conventional's: 5-7) beside a per-row part streaming at 89-96% of the copy peak; here the
                    # default shape's step and each of its launches alone (pre, main, post), pre + main, and the step
                    # without folds, round-robin at each B, so that a line through the batches says where it is.
                    # An fp32 state times its fp8 read copy's default instead (session 56, arms v3_fx_fp8_<shape>):
                    # issue 7's 3x at B = 256 is the fp32 cell still short, and its step had not been split so
                    from replayssm_sglang.kernels import cuda_main as _cm_x

                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    x_rd = "same" if sdt == "bfloat16" else "fp8_e4m3"
                    name = _cm_x.config_name(_cm_x.default_config(
                        DT[sdt], kind, None if x_rd == "same" else torch.float8_e4m3fn,
                        device_name=torch.cuda.get_device_name()))
                    fx = f"v3_fx_{name}" if x_rd == "same" else f"v3_fx_fp8_{name}"
                    x_opts = dict(main_impl="cuda", cuda_config=name, pre_impl=server_pre_impl(kind, name))
                    x_arms = {fx: arm_ours(c, DT[sdt], impl="v3", **srv, read_dtype=x_rd, v3_opts=x_opts)}
                    for dg in ("pre", "main", "post", "pre+main", "nofold"):
                        x_arms[f"{fx}_{dg.replace('+', '')}"] = arm_ours(
                            c, DT[sdt], impl="v3", **srv, read_dtype=x_rd, v3_opts=dict(x_opts, _diag_parts=dg))
                    # every row on one cursor: the folding blocks all in one step of the window, none among plain
                    # ones; if the folds' fixed part (~3.7 us for GDN on an H100) is the folding blocks' tail among
                    # the plain ones, this arm's mean step sheds it
                    x_arms[f"{fx}_aligned"] = arm_ours(c, DT[sdt], impl="v3", **srv, read_dtype=x_rd, v3_opts=x_opts,
                                                       aligned=True)
                    if x_opts["pre_impl"] == "triton" and kind == "kda" and x_rd == "same":
                        # KDA's CUDA pre launch (opt-in there; the H200's tensor-core shape needs it) beside Triton's
                        x_arms[f"v3_fxcpre_{name}"] = arm_ours(c, DT[sdt], impl="v3", **srv,
                                                               v3_opts=dict(x_opts, pre_impl="cuda"))
                        x_arms[f"v3_fxcpre_{name}_pre"] = arm_ours(
                            c, DT[sdt], impl="v3", **srv, v3_opts=dict(x_opts, pre_impl="cuda", _diag_parts="pre"))
                    if x_opts["pre_impl"] == "triton" and x_rd == "same":
                        # Triton's pre launch with 2 / 4 batch rows per program (pre_rows): KDA's 8,192 one-warp
                        # programs at B = 256 are two waves, and the main launch starts only once every one of them
                        # has started; does one wave (or half of one) let it overlap the pre launch? (session 30
                        # asked this of GDN's fp32 state: no)
                        for pr in (2, 4):
                            x_arms[f"v3_fxpr{pr}_{name}"] = arm_ours(c, DT[sdt], impl="v3", **srv,
                                                                     v3_opts=dict(x_opts, pre_rows=pr))
                            x_arms[f"v3_fxpr{pr}_{name}_pre"] = arm_ours(
                                c, DT[sdt], impl="v3", **srv, v3_opts=dict(x_opts, pre_rows=pr, _diag_parts="pre"))
                    arms.update(x_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in x_arms.items()}, f"{kind} {sdt} fixed",
                                        meta, "fixed_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "sp2" in variants and kind == "gdn" and B >= 32:
                    # no pre launch, the block's warps sharing the record dots (gdn_main.cu's SELF_PRE 2, session
                    # 47): the pre launch is wholly exposed at every B (session 46, --variants fixed), and SELF_PRE 1
                    # (each warp its own dots, the tile after them) was slower for an fp32 state (session 38). Here
                    # the default step beside the CUDA-core shapes with their CUDA pre launch, with SELF_PRE 2, and
                    # round-robin (SELF_PRE 1, each warp its own dots, timed 165-170 us against 123-127 for bf16 m6 at
                    # B = 256, runs 0715 and 0726)
                    from replayssm_sglang.kernels import cuda_main as _cm_s

                    srv = dict(server_like=True)
                    dflt = _cm_s.config_name(_cm_s.default_config(DT[sdt], kind,
                                                                  device_name=torch.cuda.get_device_name()))
                    shapes = _cm_s.SELF_PRE2_CONFIGS[DT[sdt]]
                    s_arms = {f"v3_spd_{dflt}": arm_ours(c, DT[sdt], impl="v3", **srv, v3_opts=dict(
                        main_impl="cuda", cuda_config=dflt, pre_impl=server_pre_impl(kind, dflt)))}
                    for n in shapes:
                        if n != dflt:
                            s_arms[f"v3_spd_{n}"] = arm_ours(c, DT[sdt], impl="v3", **srv, v3_opts=dict(
                                main_impl="cuda", cuda_config=n, pre_impl=server_pre_impl(kind, n)))
                        s_arms[f"v3_sp2_{n}"] = arm_ours(c, DT[sdt], impl="v3", **srv, v3_opts=dict(
                            main_impl="cuda", cuda_config=n, self_pre=2))
                    arms.update(s_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in s_arms.items()}, f"{kind} {sdt} sp2",
                                        meta, "sp2_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "trig" in variants:
                    # the post launch let start at once (session 48: gdn_main.cu's TRIGGER_POST, the main launch's
                    # griddepcontrol.launch_dependents first thing): without it the post launch, a programmatic
                    # dependent that waits for the whole main launch anyway, starts only as the main launch's blocks
                    # exit. This GPU's default shape with and without it, round-robin; fp32 states also with the fp8
                    # read copy (issue 7), in its default shape
                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    t_arms = {}
                    for rd, rcd, name in device_defaults(kind, sdt):
                        t_opts = dict(main_impl="cuda", cuda_config=name, pre_impl=server_pre_impl(kind, name))
                        # (the fp8 copy's tuned launch has no PDL, V3_TUNED's _RC_FP8: also with PDL, and the
                        # trigger beside it, _pdl)
                        # (tg2: the trigger and the step's first launch a programmatic dependent too, LEAD_PDL)
                        for trig, pdl in ((0, None), (1, None), (2, None)) + (((0, True), (1, True), (2, True))
                                                                               if rcd else ()):
                            t_arms[f"v3_tg{trig}{'' if rd == 'same' else '_fp8'}{'_pdl' if pdl else ''}_{name}"] = \
                                arm_ours(c, DT[sdt], impl="v3", **srv, read_dtype=rd,
                                         v3_opts=dict(t_opts, post_trigger=trig > 0, pdl=pdl, lead_pdl=trig == 2))
                    arms.update(t_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in t_arms.items()}, f"{kind} {sdt} trig",
                                        meta, "trig_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "early" in variants:
                    # the CUDA pre launch's loads issued early (session 49: gdn_main.cu's PRE_EARLY; the pre launch is
                    # wholly exposed at every B, session 46, and its warps' chain was slot -> h -> three batches of
                    # record loads -> the G records and gate inputs): this GPU's default shapes with a pre launch
                    # without (pe0) and with it (pe1; pe2 with fp32 records: the first of them early too,
                    # PRE_EARLY_F32, session 50), the step and the pre launch alone (_pre); fp32 states also with
                    # the fp8 read copy; where the server's pre launch is Triton's (KDA's CUDA-core shapes) also the
                    # CUDA one (pe0c, pe1c, pe2c); round-robin
                    from replayssm_sglang.kernels import cuda_main as cm_e

                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    e_arms = {}
                    for rd, name, spi, tag in defaults_with_a_pre_launch(kind, sdt):
                        for pi in ("", "c") if spi == "triton" else ("",):
                            for pe in cm_e.pre_early_levels(DT[sdt]):  # (the records in the state's type)
                                if pi == "" and spi == "triton" and pe:
                                    continue  # (PRE_EARLY is the CUDA pre launch's)
                                e_opts = dict(main_impl="cuda", cuda_config=name, pre_impl="cuda" if pi else spi,
                                              pre_early=pe)
                                for dg in ("all", "pre"):
                                    e_arms[f"v3_pe{pe}{pi}{tag}_{name}{'' if dg == 'all' else '_pre'}"] = arm_ours(
                                        c, DT[sdt], impl="v3", **srv, read_dtype=rd,
                                        v3_opts=dict(e_opts, _diag_parts=dg))
                    if e_arms:
                        arms.update(e_arms)
                        round_robin_medians(c, {f"{n}_rr": a for n, a in e_arms.items()}, f"{kind} {sdt} early",
                                            meta, "early_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "pf" in variants:
                    # the pre launch prefetching into L2 the tiles the main launch reads first (session 49:
                    # gdn_main.cu's PRE_PF; the pre launch is wholly exposed and streams well below the copy peak, so
                    # the memory is idle while it runs): this GPU's default shapes with a pre launch,
                    # cuda_main.PF_BENCH_ROWS rows' tiles; fp32 states also with the fp8 copy (whose plain rows' copy
                    # tiles it prefetches); where the server's pre launch is Triton's, Triton's (pf0t) and the CUDA
                    # one (pf<N>c); round-robin
                    from replayssm_sglang.kernels import cuda_main as _cm_f

                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    f_arms = {}
                    for rd, name, spi, tag in defaults_with_a_pre_launch(kind, sdt):
                        base = dict(main_impl="cuda", cuda_config=name)
                        if spi == "triton":
                            f_arms[f"v3_pf0t{tag}_{name}"] = arm_ours(c, DT[sdt], impl="v3", **srv, read_dtype=rd,
                                                                     v3_opts=dict(base, pre_impl="triton"))
                        for n_pf in _cm_f.PF_BENCH_ROWS:
                            f_arms[f"v3_pf{n_pf}{'c' if spi == 'triton' else ''}{tag}_{name}"] = arm_ours(
                                c, DT[sdt], impl="v3", **srv, read_dtype=rd,
                                v3_opts=dict(base, pre_impl="cuda", pre_pf=n_pf))
                    if f_arms:
                        arms.update(f_arms)
                        round_robin_medians(c, {f"{n}_rr": a for n, a in f_arms.items()}, f"{kind} {sdt} pf",
                                            meta, "pf_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "vu" in variants:
                    # the main launch's value records read as vectors (session 52: gdn_main.cu's VEC_U; a lane's
                    # RPL records at one position were RPL element loads, as many for bf16 as for fp32, and session
                    # 51 found halving the records' bytes worth nothing to GDN): this GPU's default shapes without
                    # (vu0) and with it (vu1; vu2, session 55: the same loads with no branch), the server's records;
                    # fp32 states also with the fp8 copy, there also with split records (_rsp, the CUDA pre launch)
                    # and bf16 records (_r16: the bound, not a valid decode); round-robin
                    v_arms = option_arms(c, kind, sdt, "vu", "vec_u", extra_recs=True, levels=(0, 1, 2))
                    arms.update(v_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in v_arms.items()}, f"{kind} {sdt} vu", meta,
                                        "vu_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "te" in variants:
                    # the main launch's tile loaded by plain loads under PDL (session 54: gdn_main.cu's TILE_EARLY;
                    # ptxas hoists the PDL wait above __ldg's read-only loads, and in KDA's default shapes it left
                    # the tile to be loaded after the pre launch had finished): this GPU's default shapes without
                    # (te0) and with it (te1), the server's records and pre launch; round-robin
                    t_arms = option_arms(c, kind, sdt, "te", "tile_early")
                    arms.update(t_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in t_arms.items()}, f"{kind} {sdt} te", meta,
                                        "te_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "fo" in variants and sdt == "float32" and B >= 32:
                    # FOLD_OUT (session 57): the read copies' default shapes without (fo0) and with (fo1; fo2: 8
                    # rows folded at a time; fo3: the next rows loaded first) the fold making a flushing block's
                    # outputs, staggered and aligned (every fold in one step of the window, where the all-fold step
                    # streamed at ~65% of the copy peak, session 56), and the step without folds; the server's
                    # arguments, round-robin
                    from replayssm_sglang.kernels import cuda_main as _cm_f

                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    f_arms = {}
                    for rd, rc in (("fp8_e4m3", torch.float8_e4m3fn), ("bf16", torch.bfloat16)):
                        name = _cm_f.config_name(_cm_f.default_config(DT[sdt], kind, rc,
                                                                      device_name=torch.cuda.get_device_name()))
                        if "FOLD_OUT" not in _cm_f.server_defines(_cm_f.CUDA_CONFIGS[name], kind=kind, rc_dtype=rc,
                                                                  fold_out=1):
                            continue  # (a shape FOLD_OUT does not apply to: KDA's bf16 copy)
                        rtag = "rc_fp8" if rd == "fp8_e4m3" else "rc_bf16"  # (target_bounds.read_copy_of's names)
                        base = dict(main_impl="cuda", cuda_config=name, pre_impl=server_pre_impl(kind, name))
                        for on in _cm_f.FOLD_OUT_LEVELS:
                            for al in (False, True):
                                f_arms[f"v3_fo{on}_{rtag}_{name}" + ("_aligned" if al else "")] = arm_ours(
                                    c, DT[sdt], impl="v3", **srv, read_dtype=rd, aligned=al,
                                    v3_opts=dict(base, fold_out=on))
                        f_arms[f"v3_fo_{rtag}_{name}_nofold"] = arm_ours(
                            c, DT[sdt], impl="v3", **srv, read_dtype=rd, v3_opts=dict(base, _diag_parts="nofold"))
                    arms.update(f_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in f_arms.items()}, f"{kind} {sdt} fo", meta,
                                        "fo_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "fox" in variants and kind == "gdn" and sdt == "float32" and B >= 32:
                    # FOLD_OUT's levels across GDN's fp8 copy shapes (session 58: level 2 put the default shape at
                    # 2.99x conventional at B = 256, 0.4 us from issue 7's 3x): the neighbours of the default and, in
                    # the default, level 2 with LEAD_PDL; staggered, the server's arguments, round-robin
                    from replayssm_sglang.kernels import cuda_main as _cm_x

                    srv = dict(server_like=True, kda_keys="raw")
                    x_arms = {}
                    for name in _cm_x.FOX_SHAPES:
                        base = dict(main_impl="cuda", cuda_config=name, pre_impl=server_pre_impl(kind, name))
                        for on in _cm_x.fox_levels(name):
                            x_arms[f"v3_fox_fo{on}_{name}"] = arm_ours(c, DT[sdt], impl="v3", **srv,
                                                                       read_dtype="fp8_e4m3",
                                                                       v3_opts=dict(base, fold_out=on))
                    name = _cm_x.FOX_SHAPES[0]
                    x_arms[f"v3_fox_fo2_lead_{name}"] = arm_ours(
                        c, DT[sdt], impl="v3", **srv, read_dtype="fp8_e4m3",
                        v3_opts=dict(main_impl="cuda", cuda_config=name, pre_impl=server_pre_impl(kind, name),
                                     fold_out=2, pdl=True, lead_pdl=True))
                    arms.update(x_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in x_arms.items()}, f"{kind} {sdt} fox", meta,
                                        "fox_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "ff" in variants and sdt == "float32" and B >= 32:
                    # FLUSH_FIRST (session 59): the fp8 copy's default shape with the main launch's blocks past the
                    # first FF_FROM rows taking the folding rows first (the order its CUDA pre launch writes), at
                    # FF_FROM 0, 16 and 64, beside batch order; staggered, and aligned (where no order changes
                    # anything: what reading the order costs); the server's arguments, round-robin
                    from replayssm_sglang.kernels import cuda_main as _cm_ff

                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    name = _cm_ff.config_name(_cm_ff.default_config(DT[sdt], kind, torch.float8_e4m3fn,
                                                                    device_name=torch.cuda.get_device_name()))
                    base = dict(main_impl="cuda", cuda_config=name, pre_impl=server_pre_impl(kind, name))
                    ff_arms = {}
                    for al in (False, True):
                        tail = "_aligned" if al else ""
                        ff_arms[f"v3_ff_off_rc_fp8_{name}{tail}"] = arm_ours(
                            c, DT[sdt], impl="v3", **srv, read_dtype="fp8_e4m3", aligned=al,
                            v3_opts=dict(base, flush_first=False))
                        for frm in ((0, 16, 64) if not al else (16,)):
                            ff_arms[f"v3_ff_from{frm}_rc_fp8_{name}{tail}"] = arm_ours(
                                c, DT[sdt], impl="v3", **srv, read_dtype="fp8_e4m3", aligned=al,
                                v3_opts=dict(base, flush_first=True, ff_from=frm))
                    arms.update(ff_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in ff_arms.items()}, f"{kind} {sdt} ff", meta,
                                        "ff_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "rcsp2" in variants and kind == "gdn" and sdt == "float32":
                    # the fp8 copy's lean registers without a pre launch (SELF_PRE 2 beside RC_LEAN, session 48)
                    # beside the copy's default shape with its pre launch, round-robin, the server's arguments
                    from replayssm_sglang.kernels import cuda_main as _cm_r

                    fp8 = torch.float8_e4m3fn
                    dname = _cm_r.config_name(_cm_r.default_config(DT[sdt], kind, fp8))
                    r_arms = {f"v3_rc_fp8_d_{dname}": arm_ours(c, DT[sdt], impl="v3", server_like=True,
                                                         read_dtype="fp8_e4m3", v3_opts=dict(
                                                             main_impl="cuda", cuda_config=dname,
                                                             pre_impl=server_pre_impl(kind, dname)))}
                    for n in _cm_r.RC_SELF_PRE2_CONFIGS:
                        r_arms[f"v3_rc_fp8_sp2_{n}"] = arm_ours(c, DT[sdt], impl="v3", server_like=True,
                                                           read_dtype="fp8_e4m3",
                                                           v3_opts=dict(main_impl="cuda", cuda_config=n))
                    arms.update(r_arms)
                    round_robin_medians(c, {f"{n}_rr": a for n, a in r_arms.items()}, f"{kind} {sdt} rcsp2",
                                        meta, "rcsp2_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "xl" in variants and B >= 128:
                    # the CUDA main launch in the eight-lanes-per-row layout (gdn_main.cu's XL, session 34): a row's
                    # dots reduced over 8 lanes (a handful of shuffles per warp instead of ~60), blocks that walk
                    # NCH V-tiles; beside the default shape, both with the CUDA pre launch, the server's records
                    from replayssm_sglang.kernels import cuda_main as _cm

                    srv = dict(server_like=True, kda_keys="predecayed" if kind == "kda" else "raw")
                    rec = DT[sdt]
                    # (the shapes before XL first: g8w4 / g8w4_m8_late, GDN's defaults until session 34; KDA's
                    # defaults g8w4_gp / g8w4_m7_gp beside its XL shapes, session 34's next runs)
                    if kind == "kda":
                        names = (("g8w4_m7_gp",) + _cm.XL_KDA_BF16_CONFIGS + _cm.XL_KDA_BF16_MMA_CONFIGS
                                 + _cm.XL_KDA_BF16_MMA_MF_CONFIGS if sdt == "bfloat16"
                                 else ("g8w4_gp",) + _cm.XL_KDA_FP32_CONFIGS)
                    else:
                        # (a bf16 checkpoint: ST_MMA's shapes too, session 42, the tile's dots on the tensor cores)
                        names = (("g8w4_m8_late",) + _cm.XL_BF16_CONFIGS + _cm.XL_BF16_MMA_CONFIGS
                                 + _cm.XL_BF16_MMA_MF_CONFIGS if sdt == "bfloat16" else ("g8w4",) + _cm.XL_FP32_CONFIGS)
                    base = dict(main_impl="cuda", pre_impl="cuda")
                    arms["v3_sl_cu_cpre"] = arm_ours(c, rec, impl="v3", **srv, v3_opts=base)
                    for name in names:
                        arms[f"v3_sl_cu_cpre_{name}"] = arm_ours(c, rec, impl="v3", **srv,
                                                                 v3_opts=dict(base, cuda_config=name))
                    arms["v3_sl_cu_main"] = arm_ours(c, rec, impl="v3", **srv, v3_opts=dict(base, _diag_parts="main"))
                    for name in names:
                        arms[f"v3_sl_cu_main_{name}"] = arm_ours(
                            c, rec, impl="v3", **srv, v3_opts=dict(base, cuda_config=name, _diag_parts="main"))
                    # where the time goes: the streaming floor (the tile's dots and the output, wrong results) and
                    # everything but the fold, for the default and the first two XL shapes
                    mma7 = (_cm.XL_BF16_MMA_CONFIGS if kind == "gdn" else _cm.XL_KDA_BF16_MMA_CONFIGS)[1:2]
                    diag_names = names[:2] + (mma7 if sdt == "bfloat16" else ())  # (ST_MMA's m7: how far its floor moved)
                    for name in diag_names:
                        for dg in ("stream", "nofold"):
                            arms[f"v3_sl_cu_cpre{'_' + name if name else ''}_{dg}"] = arm_ours(
                                c, rec, impl="v3", **srv,
                                v3_opts=dict(base, _diag_parts=dg, **({"cuda_config": name} if name else {})))
                    tpre = []  # KDA as the server runs it: Triton's pre launch (KDA's CUDA pre launch is opt-in)
                    if kind == "kda":
                        # (not the tensor-core shapes: their operand comes from the CUDA pre launch only)
                        tnames = [x for x in names if not _cm.tensor_core_shape(_cm.CUDA_CONFIGS[x])]
                        tpre = ["v3_sl_cu"] + [f"v3_sl_cu_{x}" for x in tnames]
                        arms["v3_sl_cu"] = arm_ours(c, rec, impl="v3", **srv, v3_opts=dict(main_impl="cuda"))
                        for name in tnames:
                            arms[f"v3_sl_cu_{name}"] = arm_ours(c, rec, impl="v3", **srv,
                                                                v3_opts=dict(main_impl="cuda", cuda_config=name))
                    arms["v3_sl_cu_cpre_again"] = arms["v3_sl_cu_cpre"]  # timed again last: the drift over the run
                    if "curr" in variants:  # the default and each XL shape round-robin, medians
                        round_robin_medians(c, {f"{n}_rr": arms[n] for n in ["v3_sl_cu_cpre"]
                                                + [f"v3_sl_cu_cpre_{x}" for x in names] + tpre}, f"{kind} {sdt} xl",
                                            meta, "xl_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "prerows" in variants and B >= 128:
                    # the pre launch with 2-8 batch rows per program (pre_rows), beside the CUDA and Triton main
                    # launches: does a smaller pre grid, leaving SM block slots and registers free, let the main
                    # launch overlap it? (session 30, run 1113: no; 2 rows level with 1, 4 and 8 slower)
                    kk = dict(kda_keys="predecayed" if kind == "kda" else "raw", server_like=True)
                    arms["v3_sl"] = arm_ours(c, torch.float32, impl="v3", **kk)
                    arms["v3_sl_cu"] = arm_ours(c, torch.float32, impl="v3", **kk, v3_opts=dict(main_impl="cuda"))
                    for pr in (2, 4, 8):
                        arms[f"v3_sl_pr{pr}"] = arm_ours(c, torch.float32, impl="v3", **kk, v3_opts=dict(pre_rows=pr))
                        arms[f"v3_sl_cu_pr{pr}"] = arm_ours(c, torch.float32, impl="v3", **kk,
                                                            v3_opts=dict(main_impl="cuda", pre_rows=pr))
                    for pr in (1, 2, 4):
                        arms[f"v3_sl_cu_pre_pr{pr}"] = arm_ours(c, torch.float32, impl="v3", **kk,
                                                                v3_opts=dict(main_impl="cuda", pre_rows=pr,
                                                                             _diag_parts="pre"))
                    arms["v3_sl_cu_main"] = arm_ours(c, torch.float32, impl="v3", **kk,
                                                     v3_opts=dict(main_impl="cuda", _diag_parts="main"))
                    arms["v3_sl_again"] = arms["v3_sl"]  # timed again last: the drift over the run
                    if "curr" in variants:
                        names = ["v3_sl", "v3_sl_cu"] + [f"v3_sl{t}_pr{pr}" for pr in (2, 4) for t in ("", "_cu")]
                        round_robin_medians(c, {f"{n}_rr": arms[n] for n in names}, f"{kind} {sdt} prerows",
                                            meta, "prerows_rounds", f"{kind}/{sdt}/B{B}", timed)
                if v3 and "prereg" in variants and B >= 128 and sdt == "float32" and c.NL == 1:
                    # the pre launch capped at 64 / 80 registers (one wave of one-warp programs at 64), staggered
                    # and aligned cursors
                    for mx in (64, 80):
                        for al in (False, True):
                            arms[f"v3_r32_prereg{mx}{'_aligned' if al else ''}"] = arm_ours(
                                c, torch.float32, cfg=cfg3, impl="v3", v3_opts=dict(pre_maxnreg=mx), aligned=al)
                if v3 and "prerows" in variants and B >= 128 and sdt == "float32":  # pre launch: rows per program
                    P3 = dict(pipe_stages=3, chunk_bytes=128, fold_bytes=64, pdl=True)
                    for pr in (2, 4, 8):
                        for rn, rdt in (("r16", torch.bfloat16), ("r32", torch.float32)):
                            arms[f"v3p_{rn}_pdl_rows{pr}"] = arm_ours(c, rdt, cfg=cfg3, impl="v3", fold="dot3",
                                                                      v3_opts=dict(P3, pre_rows=pr))
                if v3 and "parts" in variants and B >= 128:  # one launch alone: where a step's time goes
                    for part in ("pre", "main", "post"):
                        arms[f"v3_r16_{part}"] = arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3",
                                                          v3_opts=dict(_diag_parts=part))
                if v3 and "bkt" in variants and B >= 128:  # K-chunk width of the checkpoint reads
                    for cb in (32, 128):
                        arms[f"v3_r16_c{cb}"] = arm_ours(c, torch.bfloat16, cfg=cfg3, impl="v3",
                                                         v3_opts=dict(chunk_bytes=cb))
                if v3 and "chunked" in variants and B == 256:  # launch configs with the chunked fold's registers
                    for bv, nw in ((32, 2), (64, 2), (64, 4), (16, 1)):
                        arms[f"v3c_{bv}x{nw}"] = arm_ours(c, torch.bfloat16, cfg=(bv, nw), impl="v3", fold="chunked")
                res = {}
                for name, run in arms.items():
                    if run is None:
                        continue
                    try:
                        res[name] = time_graph(c, run)
                    except Exception as e:  # noqa: BLE001
                        print(f"{kind} {sdt} B={B} {name}: failed {type(e).__name__}: {str(e)[:300]}", flush=True)
                res.update(timed)  # timed above (--variants placerr), after the others as before
                base_name = min((n for n in ("conv", "conv_cuda") if n in res), key=lambda n: res[n])
                base = res[base_name]
                line = [f"{kind} {sdt:8s} B={B:4d} NL={c.NL:3d}"]
                tagged = {n: getattr(r, "rec_es", None) for n, r in arms.items() if r is not None}
                for name, t in res.items():
                    # the arm's own records (arm_ours tags its run; a round-robin arm "<name>_rr" is <name>'s run);
                    # untagged arms by name: *_r32 / v3_rc_* fp32, the rest (upstream, v3c_*, v3d_*) bf16
                    rec_es = tagged.get(name) or tagged.get(name[:-3] if name.endswith("_rr") else name) or (
                        4 if name == "ours_r32" or name.startswith(("v2_r32", "v3_r32", "v3_rc_", "v3p_r32",
                                                                    "v3p_rc_")) else 2)
                    nbytes = bytes_model(kind, B, sdt, name, rec_es=rec_es)
                    rows.append(dict(kind=kind, state_dtype=sdt, B=B, arm=name, t_us=t * 1e6, bytes=nbytes,
                                     TBps=nbytes / t / 1e12, frac_copy_peak=nbytes / t / meta["copy_peak_Bps"],
                                     speedup_vs_conv=base / t, baseline=base_name))
                    line.append(f"{name} {t * 1e6:8.1f}us {base / t:5.2f}x {nbytes / t / 1e12:4.2f}TB/s")
                print(" | ".join(line), flush=True)
                _dump(args.out, meta, rows)
                del c, arms
                torch.cuda.empty_cache()
    if "err" in _KDA_CUDA:
        meta["conv_cuda_error"] = _KDA_CUDA["err"]
    _dump(args.out, meta, rows)
    print(f"wrote {args.out}")
    try:
        plot(args.out)
    except Exception as e:  # noqa: BLE001
        print(f"plot failed: {e}")


def rebytes(path) -> str:
    """Recount the bytes of a run's rows whose read copy the model of their day did not see (session 48's first fp8
    arms were counted as reading the fp32 checkpoint every step: 142-176% of the copy peak). The records' element size
    is the one that reproduces the stored count under that day's rule (only "_rc_" marked a copy); the times are not
    touched. Rewrites the JSON and its meta["rebytes"]; returns a line per row changed."""
    d = json.load(open(path))
    meta, changed = d["meta"], []
    L = meta.get("L", 16)
    for r in d["rows"]:
        if r["arm"] in ("conv", "conv_cuda") or "_rc_" in r["arm"] or read_copy_of(r["arm"]) is None:
            continue
        args = (r["kind"], r["B"], r["state_dtype"], r["arm"], L)
        if any(abs(bytes_model(*args, es) - r["bytes"]) < 1 for es in (2, 4)):
            continue  # (counted with its copy already: a later run, or recounted before)
        for es in (2, 4):  # (the rule of their day: no "_rc_" in the name, so a plain state's bytes)
            if abs(bytes_model(*args, es, copy=None) - r["bytes"]) < 1:
                break
        else:
            raise ValueError(f"{path}: {r['arm']}: no records' size reproduces its stored bytes")
        nb = bytes_model(r["kind"], r["B"], r["state_dtype"], r["arm"], L, es)
        t = r["t_us"] * 1e-6
        changed.append(f"{r['kind']} {r['state_dtype']} B={r['B']} {r['arm']}: {r['TBps']:.2f} -> "
                       f"{nb / t / 1e12:.2f} TB/s")
        r.update(bytes=nb, TBps=nb / t / 1e12, frac_copy_peak=nb / t / meta["copy_peak_Bps"])
    if changed:
        meta["rebytes"] = (f"bytes recounted by bench_kernels.py --rebytes (session 48): {len(changed)} rows whose fp8 "
                           f"read copy the bytes model of the run's commit missed; times unchanged")
        _dump(path, meta, d["rows"])
    return "\n".join(changed) or "nothing to recount"


def _dump(path, meta, rows):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)


_SPLIT_SHORT = (("replay_decode_v3_ckpt_kernel", "ckpt"), ("replay_decode_v3_pre_kernel", "pre"),
                 ("replay_decode_v3_kernel", "main"), ("replay_decode_v2_post_kernel", "post"))


def split_table(d: dict) -> str:
    """Markdown of a --step-split JSON: per kind and arm the kernels' us per step, x the conventional arm, and per
    launch of ours the median (a step that writes no checkpoint with aligned cursors) / max (the one that does)."""
    out = [f"step split, {d['meta'].get('mode', '')}, commit {d['meta'].get('commit')}, {d['meta'].get('gpu')}", "",
           "| kind | arm | us per step | x conv | main: median / max | ckpt: median / max | pre: median |",
           "|---|---|---|---|---|---|---|"]
    conv = {r["kind"]: r["kernels_us_per_step"] for r in d["rows"] if r["arm"] == "conv"}
    for r in d["rows"]:
        per = {}
        for name, v in r["kernels"].items():
            for full, short in _SPLIT_SHORT:
                if name.startswith(full) and short not in per:
                    per[short] = v
                    break

        def cell(k, both=True):
            v = per.get(k)
            return "" if v is None else (f"{v['median_us']:.1f} / {v['max_us']:.1f}" if both else f"{v['median_us']:.1f}")
        c = conv.get(r["kind"])
        x = f"{c / r['kernels_us_per_step']:.2f}x" if c else ""
        out.append(f"| {r['kind']} | {r['arm']} | {r['kernels_us_per_step']:.1f} | {x} | {cell('main')} | "
                   f"{cell('ckpt')} | {cell('pre', False)} |")
    return "\n".join(out)


def table(path) -> str:
    """Markdown: per (kind, state dtype, B) the conventional time and each arm's speedup, TB/s, % of copy peak."""
    d = json.load(open(path))
    if str(d.get("meta", {}).get("mode", "")).startswith("step-split"):
        return split_table(d)
    rows = [r for r in d["rows"] if "speedup_vs_conv" in r]
    present = {r["arm"] for r in rows}
    arms = [a for a in ["upstream", "ours_r16", "ours_r32", "ours_L1", "v3_r16", "v3_r32", "v3_r16_rows", "v3_L1",
                        "v3_r16_chunked", "v3_r32_chunked", "v3_rc_bf16", "v3_rc_fp8",
                        "v2_r16", "v2_r32", "v2_r16_rows",
                        "v2_r16_unroll", "v2_r16_all", "ours_r16_dot", "diag_no_atomics"] if a in present]
    arms += sorted(present - set(arms) - {"conv", "conv_cuda"})  # the variants' arms
    out = ["| layer | state | B | conv us (TB/s) | " + " | ".join(f"{a}: x conv, x upstream, TB/s, % peak" for a in arms) + " |",
           "|---|---|---|---|" + "---|" * len(arms)]
    keys = sorted({(r["kind"], r["state_dtype"], r["B"]) for r in rows}, key=lambda k: (k[0], k[1] != "float32", k[2]))
    for kind, sdt, B in keys:
        rs = {r["arm"]: r for r in rows if (r["kind"], r["state_dtype"], r["B"]) == (kind, sdt, B)}
        conv = rs.get("conv")
        cells = [kind.upper(), sdt, str(B), f"{conv['t_us']:.1f} ({conv['TBps']:.2f})" if conv else "-"]
        up = rs.get("upstream")
        for a in arms:
            r = rs.get(a)
            if not r:
                cells.append("-")
                continue
            vs_up = f"{up['t_us'] / r['t_us']:.2f}" if up and a != "upstream" else "1.00" if a == "upstream" else "-"
            cells.append(f"{r['speedup_vs_conv']:.2f}, {vs_up}, {r['TBps']:.2f}, {100 * r['frac_copy_peak']:.0f}%")
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def plot(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = json.load(open(path))
    rows = [r for r in d["rows"] if "speedup_vs_conv" in r]
    combos = sorted({(r["kind"], r["state_dtype"]) for r in rows})
    fig, axes = plt.subplots(1, len(combos), figsize=(4.2 * len(combos), 3.6), squeeze=False)
    for ax, (kind, sdt) in zip(axes[0], combos):
        colors = {"upstream": "tab:blue", "ours_r32": "tab:orange", "ours_r16": "tab:green", "ours_L1": "tab:red",
                  "conv_cuda": "tab:gray", "ours_r16_dot": "tab:purple", "diag_no_atomics": "tab:brown",
                  "v2_r16": "tab:olive", "v2_r32": "tab:cyan", "v2_r16_rows": "tab:pink", "v2_r16_unroll": "black",
                  "v2_r16_all": "tab:gray", "v3_r16": "darkgreen", "v3_r32": "darkorange", "v3_r16_rows": "magenta",
                  "v3_L1": "darkred", "v3_r16_chunked": "lime", "v3_r32_chunked": "gold",
                  "v3_rc_bf16": "navy", "v3_rc_fp8": "crimson",
                  # --variants mma: the server's launches (*_srv) beside the same without tile_mma (*_nomma)
                  "v3_rc_bf16_srv": "navy", "v3_rc_bf16_nomma": "lightsteelblue", "v3_rc_fp8_srv": "crimson",
                  "v3_rc_fp8_mma": "lightsalmon", "v3_r16_nomma": "yellowgreen", "v3_r16_s18": "darkkhaki",
                  "v3_r16_mma": "teal", "v3_r16_mma_p3": "turquoise", "v3_rc_bf16_mma": "slateblue",
                  "v3_r16_p3": "olive", "v3_rc_bf16_mma_u": "mediumpurple",
                  "v3_rc_bf16_s20": "peru"}
        for arm in colors:
            pts = sorted((r["B"], r["speedup_vs_conv"]) for r in rows
                         if r["kind"] == kind and r["state_dtype"] == sdt and r["arm"] == arm)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=arm, color=colors[arm])
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{kind.upper()} {sdt} state")
        ax.set_xlabel("batch B")
        ax.set_ylabel("speedup vs best conventional")
        ax.legend(fontsize=7)
    m = d["meta"]
    fig.suptitle(f"decode step, L=16 ({m['gpu']}, commit {m['commit']}, {m['date']})", fontsize=9)
    fig.tight_layout()
    png = os.path.splitext(path)[0] + ".png"
    fig.savefig(png, dpi=110)
    print(f"wrote {png}")


def verify_mode(argv) -> None:
    """``--verify``: the verify benchmark, one module for both modes' users (its own options follow the flag)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_verify

    sys.argv = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_verify.py"), *argv]
    bench_verify.main()


if __name__ == "__main__":
    if "--verify" in sys.argv[1:]:
        i = sys.argv.index("--verify")
        verify_mode(sys.argv[1:i] + sys.argv[i + 1:])
    else:
        main()

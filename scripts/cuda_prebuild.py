#!/usr/bin/env python3
"""Build, on this machine (nvcc from scripts/setup-nvcc or REPLAYSSM_NVCC), the cubins of the CUDA main launch
(kernels/gdn_main.cu) that the GPU benchmark (bench_kernels.py --variants cuda) and the GPU tests
(test_gpu_*cuda_main*) launch, into a folder a GPU call carries (default .gpu/cubin; scripts/gpu_kernels.sh points
REPLAYSSM_CUBIN_DIR at a copy). A build missing there is compiled on the GPU machine by its own nvcc, if any.

    python scripts/cuda_prebuild.py [--out .gpu/cubin]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

F32, BF16, I32, I64 = torch.float32, torch.bfloat16, torch.int32, torch.int64
GDN = dict(H=16, HV=32, V=128, cap=16, BC=16)
# bench_kernels.py --variants sp2's builds: (shape, state type, SELF_PRE level; 0: with the CUDA pre launch, PDL)
def sp2_builds():
    from replayssm_sglang.kernels import cuda_main as cm

    return [(n, sdt, level) for sdt, names in cm.SELF_PRE2_CONFIGS.items() for n in names for level in (0, 2)]
KDA = dict(H=32, HV=32, V=128, cap=16, BC=16)  # (with kind="kda": predecayed keys)


def combos():
    """(rows per warp, warps, pdl, flags and element types) of every launch the benchmark and the GPU tests make."""
    from replayssm_sglang.kernels import cuda_main as cm

    out = []
    # the benchmark: the server's arguments (bf16 inputs and output, fp32 records, int32 slots, int64 ring rows)
    server = [(cfg, pdl, 0, F32) for n, cfg in cm.CUDA_CONFIGS.items() for pdl in (True, False)
              if n not in cm.KDA_ONLY and not cm.full_config(cfg)[8]]  # (rc_lean shapes: a read copy's, below)
    server += [(cm.CUDA_CONFIGS[n], True, d, F32) for n in ("g8w8", "g8w2") for d in (1, 2)]  # the diagnostics
    server += [(cm.CUDA_DEFAULT, True, 0, BF16)]  # bf16 records
    server = [(*x, F32) for x in server]
    # a bf16 checkpoint (--variants cuda16): its shapes, the default's bf16 records and diagnostics
    # (and ST_MMA's shapes, session 42: rc_lean 2 without a copy)
    server += [(cm.CUDA_CONFIGS[n], True, 0, F32, BF16)
               for n in cm.CUDA_BF16_CONFIGS + cm.XL_BF16_CONFIGS + cm.XL_BF16_MMA_CONFIGS + cm.XL_BF16_MMA_MF_CONFIGS
               + cm.XL_BF16_MF_CONFIGS]
    server += [(cm.CUDA_CONFIGS[n], True, 0, BF16, BF16)
               for n in ("g8w4_m8_late",) + cm.XL_BF16_CONFIGS + cm.XL_BF16_MMA_CONFIGS
               + cm.XL_BF16_MMA_MF_CONFIGS + cm.XL_BF16_MF_CONFIGS]  # (xl: bf16 records; MMA_FOLD's, sessions 43-44)
    # --variants xl's diagnostics: the shapes before XL and GDN's defaults (x16w4c1_m5) of each state type, bf16 records
    # beside a bf16 state
    server += [(cm.CUDA_CONFIGS[n], True, d, F32, F32) for n in ("g8w4", "x16w4c1_m5") for d in (1, 2)]
    server += [(cm.CUDA_CONFIGS[n], True, d, BF16, BF16) for n in ("g8w4_m8_late", "x16w4c1_m5") for d in (1, 2)]
    server += [(cm.CUDA_DEFAULT_BF16, True, d, r, BF16) for d, r in ((0, BF16), (1, F32), (2, F32))]
    server += [(cm.CUDA_CONFIGS[cm.XL_BF16_MMA_CONFIGS[1]], True, d, BF16, BF16) for d in (1, 2)]  # (its diagnostics)
    # (--variants fixed: the bf16 defaults' nofold on every GPU DEVICE_DEFAULTS names, and on the others)
    gpus = (None, *cm.DEVICE_DEFAULTS)
    server += [(cfg, True, 2, BF16, BF16) for cfg in dict.fromkeys(cm.default_config(BF16, "gdn", device_name=g)
                                                                      for g in gpus)]
    server = [(*x, "gdn") for x in server]
    # KDA (--variants cudakda): fp32 shapes, bf16-checkpoint shapes, bf16 records, the default's diagnostics
    server += [(cm.CUDA_CONFIGS[n], True, 0, F32, F32, "kda") for n in cm.CUDA_KDA_FP32_CONFIGS]
    server += [(cm.CUDA_DEFAULT_KDA, True, d, r, F32, "kda") for d, r in ((0, BF16), (1, F32), (2, F32))]
    server += [(cm.CUDA_DEFAULT_KDA, False, 0, F32, F32, "kda")]
    server += [(cm.CUDA_CONFIGS[n], True, 0, F32, BF16, "kda") for n in cm.CUDA_KDA_BF16_CONFIGS]
    server += [(cm.CUDA_DEFAULT_KDA_BF16, True, d, r, BF16, "kda") for d, r in ((0, BF16), (1, F32), (2, F32))]
    server += [(cm.CUDA_CONFIGS[cm.XL_KDA_BF16_MMA_CONFIGS[1]], True, d, BF16, BF16, "kda") for d in (1, 2)]
    server += [(cfg, True, 2, BF16, BF16, "kda")  # (--variants fixed, as GDN's above)
               for cfg in dict.fromkeys(cm.default_config(BF16, "kda", device_name=g) for g in gpus)]
    # KDA in the XL layout (--variants xl): the shapes with the server's records, the first one's diagnostics
    server += [(cm.CUDA_CONFIGS[n], True, 0, F32, F32, "kda") for n in cm.XL_KDA_FP32_CONFIGS]
    server += [(cm.CUDA_CONFIGS["x16w4c1_m4_gp_mf"], True, 0, F32, F32, "kda")]  # (MMA_FOLD's, session 43)
    server += [(cm.CUDA_CONFIGS[n], True, 0, BF16, BF16, "kda")
               for n in ("g8w4_m7_gp",) + cm.XL_KDA_BF16_CONFIGS + cm.XL_KDA_BF16_MMA_CONFIGS
               + cm.XL_KDA_BF16_MMA_MF_CONFIGS + cm.XL_KDA_BF16_MF_CONFIGS]  # (ST_MMA's: session 42; MMA_FOLD's: 43-44)
    server += [(cm.CUDA_CONFIGS[n], True, d, r, s, "kda") for n, r, s in (("g8w4_gp", F32, F32), ("x16w4c1_m5_gp", F32, F32),
                                                                       ("g8w4_m7_gp", BF16, BF16),
                                                                       ("x16w4c1_m5_gp", BF16, BF16)) for d in (1, 2)]
    for cfg, pdl, diag, rec, sdt, kind in server:
        rpw, nw, lr, mb, late, gt, xl, nch, lean, mf, sp = cm.full_config(cfg)
        out.append(cm.defines(**(GDN if kind == "gdn" else KDA), rpw=rpw, nwarps=nw, load_reg=lr, min_blocks=mb,
                              late_coef=late, gt_pre=gt, xl=xl, nch=nch, diag_stream=diag,
                              has_h_rows=False, has_forced=True, has_ring_idx=True, pdl=pdl, x_dtype=BF16,
                              a_dtype=BF16, b_dtype=BF16, alog_dtype=F32, dtb_dtype=F32, out_dtype=BF16, u_dtype=rec,
                              k_dtype=rec, slot_dtype=I32, forced_dtype=I32, ridx_dtype=I64, state_dtype=sdt,
                              kind=kind, rc_lean=lean, mma_fold=mf, self_pre=sp))
    # the GPU tests' harness: fp32 a, b and output, int32 indices, a forced mask always
    from test_decode_kernels import (CUDA_MAIN_BF16_CASES, CUDA_MAIN_CASES, CUDA_MAIN_KDA_CASES, CUDA_MAIN_SLOW_CASES,
                                     CUDA_PRE_CASES, CUDA_PRE_KDA_CASES)

    cases = [(cm.CUDA_CONFIGS.get(c, c), r, q, ri, hr, F32) for c, r, q, ri, hr in CUDA_MAIN_CASES]
    cases.append((cm.CUDA_DEFAULT, "float32", "bfloat16", True, False, F32))  # test_gpu_cuda_main_many_blocks
    cases += [(cm.CUDA_CONFIGS.get(c, c), r, q, ri, hr, BF16) for c, r, q, ri, hr in CUDA_MAIN_BF16_CASES]
    # the CUDA pre launch's cases (test_gpu_real_shapes_cuda_pre[_kda]): the build of the main launch's shape, the
    # default one (for GDN always: its cases ask for none) where the main launch is Triton's
    cases += [(cm.pre_build_config(cm.default_config(getattr(torch, sdt), "gdn"), "gdn", getattr(torch, sdt)), r, q, ri,
               hr, getattr(torch, sdt)) for _, sdt, r, q, ri, hr in CUDA_PRE_CASES]
    # the slow-decay cases (test_gpu_real_shapes_cuda_main_slow): fp32 records, bf16 inputs, the ring keyed by its rows
    cases += [(cm.CUDA_CONFIGS[c], "float32", "bfloat16", True, False, getattr(torch, sdt))
              for kind, c, sdt in CUDA_MAIN_SLOW_CASES if kind == "gdn"]
    for cfg, rec, qkv, ri, hr, sdt in cases:
        rpw, nw, lr, mb, late, _, xl, nch, lean, mf, sp = cm.full_config(cfg)
        rec, qkv = getattr(torch, rec), getattr(torch, qkv)
        out.append(cm.defines(**GDN, rpw=rpw, nwarps=nw, load_reg=lr, min_blocks=mb, late_coef=late, xl=xl, nch=nch,
                              has_h_rows=hr, has_forced=True,
                              has_ring_idx=ri, pdl=True, x_dtype=qkv, a_dtype=F32, b_dtype=F32, alog_dtype=F32, dtb_dtype=F32, out_dtype=F32,
                              u_dtype=rec, k_dtype=rec, slot_dtype=I32, forced_dtype=I32, ridx_dtype=I32,
                              state_dtype=sdt, rc_lean=lean, mma_fold=mf, self_pre=sp))
    kda_cases = list(CUDA_MAIN_KDA_CASES) + [
        (c or cm.default_config(getattr(torch, sdt), "kda"), sdt, rec, qkv, ri, lb, mg)
        for c, sdt, rec, qkv, ri, lb, mg in CUDA_PRE_KDA_CASES] + [
        (c, sdt, "float32", "bfloat16", True, None, None) for kind, c, sdt in CUDA_MAIN_SLOW_CASES if kind == "kda"]
    for c, sdt, rec, qkv, ri, lb, _ in kda_cases:
        rpw, nw, lr, mb, late, gt, xl, nch, lean, mf, sp = cm.full_config(cm.CUDA_CONFIGS.get(c, c))
        rec, qkv, sdt = getattr(torch, rec), getattr(torch, qkv), getattr(torch, sdt)
        out.append(cm.defines(**KDA, rpw=rpw, nwarps=nw, load_reg=lr, min_blocks=mb, late_coef=late, gt_pre=gt, xl=xl,
                              nch=nch, has_h_rows=False,
                              has_forced=True, has_ring_idx=ri, pdl=True, x_dtype=qkv, a_dtype=F32, b_dtype=F32,
                              alog_dtype=F32, dtb_dtype=F32, out_dtype=F32, u_dtype=rec, k_dtype=rec, slot_dtype=I32,
                              forced_dtype=I32, ridx_dtype=I32, state_dtype=sdt, kind="kda",
                              lower_bound=lb is not None, rc_lean=lean, mma_fold=mf, self_pre=sp))
    # issue 7's read copies read by the CUDA main launch (session 36): test_gpu_real_shapes_cuda_main_read_copy (the
    # harness's arguments, as above) and bench_kernels.py --variants rccu (the server's)
    from test_decode_kernels import CUDA_MAIN_RC_CASES

    RC = {"fp8_e4m3": torch.float8_e4m3fn, "bf16": BF16}

    def rc_build(kind, name, rc_dtype, io, ridx, sdt=F32, self_pre=False, diag=0, rec=F32, trig=False, pdl=None,
                 lead=False, early=None, pf=0, split=False, vu=None, te=None, fo=None, ff=False, ff_from=None):
        # io: a's, b's and the output's type; ridx: the ring rows'; trig: TRIGGER_POST; pdl: None for PDL where there
        # is no self_pre; lead: LEAD_PDL; early: PRE_EARLY (None: its default; only where the shape has a pre launch);
        # pf: PRE_PF; split: REC_SPLIT (rec is then the high plane's type, bf16); vu: VEC_U (None: its default);
        # te: TILE_EARLY (None: its default); fo: FOLD_OUT (None: its default); ff, ff_from: FLUSH_FIRST
        rpw, nw, lr, mb, late, gt, xl, nch, lean, mf, sp = cm.full_config(cm.CUDA_CONFIGS[name])
        return cm.defines(**(GDN if kind == "gdn" else KDA), rpw=rpw, nwarps=nw, load_reg=lr, min_blocks=mb,
                          late_coef=late, gt_pre=gt, xl=xl, nch=nch, diag_stream=diag, has_h_rows=False,
                          has_forced=True, has_ring_idx=True, pdl=not self_pre if pdl is None else pdl,
                          x_dtype=BF16, a_dtype=io, b_dtype=io, alog_dtype=F32, dtb_dtype=F32, out_dtype=io,
                          u_dtype=rec, k_dtype=rec, slot_dtype=I32,
                          forced_dtype=I32, ridx_dtype=ridx, state_dtype=sdt, kind=kind, rc_dtype=rc_dtype,
                          self_pre=self_pre or sp, rc_lean=lean, mma_fold=mf, trigger_post=trig, lead_pdl=lead,
                          pre_early=early, pre_pf=pf, rec_split=split, vec_u=vu, tile_early=te, fold_out=fo,
                          flush_first=ff, ff_from=ff_from)

    def gpu_default(kind, sdt, rd, g):  # the default shape's name on GPU g (a DEVICE_DEFAULTS name; None: the rest)
        return cm.config_name(cm.default_config(sdt, kind, RC.get(rd), device_name=g))

    out += [rc_build(kind, c, RC[rd], F32, I32) for kind, c, rd, _ in CUDA_MAIN_RC_CASES]
    out += [rc_build(kind, n, rcd, BF16, I64) for kind, names in cm.XL_RC_CONFIGS.items()
            for n in names for rcd in RC.values()]
    # the fp8 copy's step split (--variants rccu): the first shape's diagnostics, and the rc_lean shapes' streaming floor
    out += [rc_build(kind, names[0], RC["fp8_e4m3"], BF16, I64, diag=d) for kind, names in cm.XL_RC_CONFIGS.items()
            for d in (1, 2)]
    out += [rc_build(kind, n, RC["fp8_e4m3"], BF16, I64, diag=1) for kind, names in cm.XL_RC_CONFIGS.items()
            for n in names if cm.full_config(cm.CUDA_CONFIGS[n])[8]]
    # gdn_main.cu's SELF_PRE (session 37): test_gpu_real_shapes_cuda_main_self_pre, and the benchmark's _sp arms (the
    # server's arguments: the first of GDN's read-copy shapes, no copy and the fp8 copy)
    # bench --variants rcr16: the fp8 copy with bf16 records, in the copy's default shape and the plain one
    out += [rc_build(kind, n, RC["fp8_e4m3"], BF16, I64, rec=BF16) for kind in ("gdn", "kda")
            for n in dict.fromkeys(cm.config_name(c) for c in (
                cm.default_config(F32, kind, RC["fp8_e4m3"]), cm.default_config(F32, kind)))]
    from test_decode_kernels import CUDA_MAIN_SELF_PRE_CASES

    out += [rc_build("gdn", c, RC.get(rd), F32, I32, getattr(torch, sdt), level)
            for c, sdt, rd, level in CUDA_MAIN_SELF_PRE_CASES]
    # bench --variants sp2 (session 47): SELF_PRE 1 and 2 in the server's builds, the records in the state's type
    out += [rc_build("gdn", n, None, BF16, I64, sdt, level, rec=sdt) for n, sdt, level in sp2_builds()]
    out += [rc_build("gdn", cm.XL_RC_CONFIGS["gdn"][0], rcd, BF16, I64, F32, True) for rcd in (None, RC["fp8_e4m3"])]
    # bench --variants rcsp2 (session 48): the fp8 copy's lean shapes without a pre launch, the server's arguments
    # (fp32 records, PDL for the post launch: the tuned launch's at B >= 33)
    out += [rc_build("gdn", n, RC["fp8_e4m3"], BF16, I64, F32, trig=True) for n in cm.RC_SELF_PRE2_CONFIGS]
    def server_defaults(with_pre=False):
        # every GPU's default shapes (DEVICE_DEFAULTS and the others) for each kind and state, fp32 states also with
        # the fp8 copy, as (kind, shape name, copy type, state type); with_pre: only the shapes with a pre launch
        for kind, sdt, g in itertools.product(("gdn", "kda"), (F32, BF16), (None, *cm.DEVICE_DEFAULTS)):
            for rcd in (None, RC["fp8_e4m3"]) if sdt == F32 else (None,):
                cfg = cm.default_config(sdt, kind, rcd, device_name=g)
                if not (with_pre and cm.full_config(cfg)[10]):
                    yield kind, cm.config_name(cfg), rcd, sdt

    # bench --variants trig (session 48): without and with TRIGGER_POST, the records in the state's type
    out += [rc_build(kind, name, rcd, BF16, I64, sdt, rec=sdt, trig=trig, pdl=pdl, lead=lead)
            for kind, name, rcd, sdt in server_defaults()
            for trig, pdl, lead in ((False, None, False), (True, None, False), (True, None, True))
            + (((False, False, False),) if rcd else ())]  # (the fp8 copy's tuned launch below 33 rows: no PDL)
    # bench --variants early (session 49): the shapes with a pre launch, without and with PRE_EARLY (fp32 states also
    # level 2, PRE_EARLY_F32: session 50), with the trigger (the step) and without it (the pre launch alone: no post
    # launch, so no trigger)
    out += [rc_build(kind, name, rcd, BF16, I64, sdt, rec=sdt, trig=trig, early=early)
            for kind, name, rcd, sdt in server_defaults(with_pre=True) for trig in (False, True)
            for early in cm.pre_early_levels(sdt)]
    # bench --variants pf (session 49): the same shapes with the trigger, PRE_PF at each of cuda_main.PF_BENCH_ROWS
    out += [rc_build(kind, name, rcd, BF16, I64, sdt, rec=sdt, trig=True, pf=n_pf)
            for kind, name, rcd, sdt in server_defaults(with_pre=True) for n_pf in cm.PF_BENCH_ROWS if n_pf]
    # bench --variants vu (session 52): every default shape without and with VEC_U, the server's records, with and
    # without the trigger as --variants trig; the fp8 copy's also with split and bf16 records
    out += [rc_build(kind, name, rcd, BF16, I64, sdt, rec=r, trig=trig, pdl=pdl, split=spl, vu=vu)
            for kind, name, rcd, sdt in server_defaults()
            for r, spl in [(sdt, False)] + ([(BF16, True), (BF16, False)] if rcd else [])
            for trig, pdl in ((False, None), (True, None)) + (((False, False),) if rcd else ())
            for vu in (0, 1, 2)]
    # bench --variants te (session 54): every default shape with TILE_EARLY (without it: the vu0 builds above), the
    # server's records, with and without the trigger (a build without PDL has no TILE_EARLY: the vu0 one)
    out += [rc_build(kind, name, rcd, BF16, I64, sdt, rec=sdt, trig=trig, te=1)
            for kind, name, rcd, sdt in server_defaults() for trig in (False, True)]
    # test_gpu_real_shapes_tile_early (session 54): the harness's arguments, each GPU's default shape, TRIGGER_POST,
    # TILE_EARLY
    from test_decode_kernels import TILE_EARLY_GPU_CASES

    out += [rc_build(kind, gpu_default(kind, getattr(torch, sdt), rd, g), RC.get(rd), F32, I32, getattr(torch, sdt),
                     rec=getattr(torch, sdt), trig=True, te=1)
            for kind, sdt, rd in TILE_EARLY_GPU_CASES for g in (None, *cm.DEVICE_DEFAULTS)]
    # test_gpu_real_shapes_pre_early (session 49): the harness's arguments, each GPU's default shape with a pre
    # launch, PRE_EARLY, PRE_PF (8 rows) and TRIGGER_POST
    from test_decode_kernels import PRE_EARLY_CASES as PE_CASES, pe_level

    out += [rc_build(kind, gpu_default(kind, getattr(torch, sdt), rd, g),
                     RC.get(rd), F32, I32, getattr(torch, sdt), rec=getattr(torch, rec), trig=True,
                     early=pe_level(getattr(torch, rec)), pf=8)
            for kind, sdt, rd, rec in PE_CASES for g in (None, *cm.DEVICE_DEFAULTS)]
    # split records (session 51, REC_SPLIT): test_gpu_real_shapes_split (the harness's arguments, TRIGGER_POST) and
    # bench --variants split (the server's: the fp8 copy's default and the plain fp32 default with a pre launch, with
    # fp32, split and bf16 records, the trigger the tuned launch's at B >= 128)
    from test_decode_kernels import SPLIT_GPU_CASES

    split_shapes = [(kind, gpu_default(kind, F32, rd, g), rd)
                    for kind, rd in SPLIT_GPU_CASES for g in (None, *cm.DEVICE_DEFAULTS)]
    out += [rc_build(kind, n, RC.get(rd), F32, I32, rec=BF16, trig=True, split=True) for kind, n, rd in split_shapes]
    out += [rc_build(kind, n, RC.get(rd), BF16, I64, rec=rec, trig=True, split=sp) for kind, n, rd in split_shapes
            for rec, sp in ((F32, False), (BF16, True), (BF16, False))]
    from bench_kernels import SPLIT_SIBLINGS

    out += [rc_build(kind, n, RC["fp8_e4m3"], BF16, I64, rec=rec, trig=True, split=sp)
            for kind, n in SPLIT_SIBLINGS.items() for rec, sp in ((F32, False), (BF16, True))]
    # test_gpu_real_shapes_vec_u (session 52): the harness's arguments, each GPU's default shape, TRIGGER_POST, VEC_U
    from test_decode_kernels import VEC_U_GPU_CASES

    out += [rc_build(kind, gpu_default(kind, getattr(torch, sdt), rd, g),
                     RC.get(rd), F32, I32, getattr(torch, sdt), rec=BF16 if spl else getattr(torch, sdt), trig=True,
                     split=spl, vu=1)
            for kind, sdt, rd, spl in VEC_U_GPU_CASES for g in (None, *cm.DEVICE_DEFAULTS)]
    # test_gpu_real_shapes_vec_u2 (session 55): the same at VEC_U 2, the bf16 states
    from test_decode_kernels import VEC_U2_GPU_CASES

    out += [rc_build(kind, gpu_default(kind, getattr(torch, sdt), "same", g), None, F32, I32, getattr(torch, sdt),
                     rec=getattr(torch, sdt), trig=True, vu=2)
            for kind, sdt in VEC_U2_GPU_CASES for g in (None, *cm.DEVICE_DEFAULTS)]
    # test_gpu_real_shapes_post_trigger (session 48): the harness's arguments, each GPU's default shape, TRIGGER_POST
    # and LEAD_PDL
    from test_decode_kernels import GRAPH_LEAD_CASES, POST_TRIGGER_CASES

    out += [rc_build(kind, gpu_default(kind, getattr(torch, sdt), rd, g),
                     RC.get(rd), F32, I32, getattr(torch, sdt), rec=getattr(torch, sdt), trig=True, lead=True)
            for kind, sdt, rd in POST_TRIGGER_CASES for g in (None, *cm.DEVICE_DEFAULTS)]
    # bench --variants fo (session 57): the read copies' default shapes (both kinds' fp8 copy, GDN's bf16 copy) without
    # and with FOLD_OUT, the server's records, with and without the trigger, and the step without folds (diag 2);
    # test_gpu_real_shapes_fold_out: the harness's arguments, each GPU's default copy shape, TRIGGER_POST, FOLD_OUT
    from test_decode_kernels import FOLD_OUT_GPU_CASES

    fo_shapes = {(kind, gpu_default(kind, F32, rd, g), rd) for kind, rd in FOLD_OUT_GPU_CASES
                 for g in (None, *cm.DEVICE_DEFAULTS)}
    out += [rc_build(kind, n, RC[rd], BF16, I64, trig=trig, fo=fo, diag=diag) for kind, n, rd in sorted(fo_shapes)
            for trig in (False, True) for fo, diag in ((0, 0), (1, 0), (2, 0), (3, 0), (0, 2))]
    out += [rc_build(kind, n, RC[rd], F32, I32, trig=True, fo=fo) for kind, n, rd in sorted(fo_shapes)
            for fo in (1, 2, 3)]
    # bench --variants fox (session 58): GDN's fp8 copy shapes (cuda_main.FOX_SHAPES) at their levels
    # (cuda_main.fox_levels), with and without the trigger; the default shape at level 2 with LEAD_PDL
    out += [rc_build("gdn", n, RC["fp8_e4m3"], BF16, I64, trig=trig, fo=fo) for n in cm.FOX_SHAPES
            for trig in (False, True) for fo in cm.fox_levels(n)]
    out.append(rc_build("gdn", cm.FOX_SHAPES[0], RC["fp8_e4m3"], BF16, I64, trig=True, lead=True, fo=2))
    # bench --variants ff (session 59): the fp8 copies' default shapes with FLUSH_FIRST at the benchmark's FF_FROM,
    # with and without the trigger; test_gpu_real_shapes_flush_first: the harness's arguments, TRIGGER_POST
    from test_decode_kernels import FLUSH_FIRST_GPU_CASES

    ff_shapes = {(kind, gpu_default(kind, F32, "fp8_e4m3", g)) for kind in ("gdn", "kda")
                 for g in (None, *cm.DEVICE_DEFAULTS)}
    out += [rc_build(kind, n, RC["fp8_e4m3"], BF16, I64, trig=trig, ff=True, ff_from=frm)
            for kind, n in sorted(ff_shapes) for trig in (False, True) for frm in (0, 16, 64)]
    out += [rc_build(kind, n, RC["fp8_e4m3"], F32, I32, trig=True, ff=True, ff_from=frm)
            for kind, n in sorted(ff_shapes) for k2, frm in FLUSH_FIRST_GPU_CASES if k2 == kind]
    # test_gpu_cuda_main_graph_matches_eager: replay_decode with a bf16 output, fp32 gates, no forced mask, the ring
    # keyed by int32 rows (without and with TRIGGER_POST; GRAPH_LEAD_CASES with it and LEAD_PDL)
    graph_cases = [(*x, None) for x in CUDA_MAIN_SLOW_CASES] + [("gdn", "x16w4c1_m7_lean", "float32", RC["fp8_e4m3"]),
                                                                 ("kda", "x16w4c1_m7_gp_lean_mma", "float32",
                                                                  RC["fp8_e4m3"])]  # (and the fp8 copies')
    graph_lead = [(kind, c, sdt, RC.get(rd), True, True) for kind, c, sdt, rd in GRAPH_LEAD_CASES]
    for kind, c, sdt, rcd, trig, lead in [(*g, t, False) for g, t in itertools.product(graph_cases, (False, True))] + \
            graph_lead:
        rpw, nw, lr, mb, late, gt, xl, nch, lean, mf, sp = cm.full_config(cm.CUDA_CONFIGS[c])
        out.append(cm.defines(**(GDN if kind == "gdn" else KDA), rpw=rpw, nwarps=nw, load_reg=lr, min_blocks=mb,
                              late_coef=late, gt_pre=gt, xl=xl, nch=nch, has_h_rows=False, has_forced=False,
                              has_ring_idx=True, pdl=True, x_dtype=BF16, a_dtype=F32, b_dtype=F32, alog_dtype=F32,
                              dtb_dtype=F32, out_dtype=BF16, u_dtype=F32, k_dtype=F32, slot_dtype=I32,
                              forced_dtype=I32, ridx_dtype=I32, state_dtype=getattr(torch, sdt), kind=kind,
                              self_pre=sp, trigger_post=trig, rc_dtype=rcd, rc_lean=lean, mma_fold=mf,
                              lead_pdl=lead))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=".gpu/cubin")
    args = ap.parse_args()
    os.environ["REPLAYSSM_CUBIN_DIR"] = str(Path(args.out).resolve())
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from replayssm_sglang.kernels import cuda_main as cm

    if cm.find_nvcc() is None:
        sys.exit("no nvcc: run scripts/setup-nvcc or set REPLAYSSM_NVCC")
    todo = combos()
    t0 = time.time()
    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as ex:
        paths = list(ex.map(cm.build, todo))
    print(f"{len(set(paths))} cubins in {args.out} ({time.time() - t0:.0f} s)")
    # the same, xz-compressed, for a GPU call that cannot carry the folder (scripts/gpu_kernels.sh takes either)
    out = Path(args.out).resolve()
    tarball = out.with_name(out.name + ".tar.xz")
    with tarfile.open(tarball, "w:xz") as tf:
        for p in sorted(out.glob("*.cubin")):
            tf.add(p, arcname=f"{out.name}/{p.name}")
    print(f"and {tarball} ({tarball.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()

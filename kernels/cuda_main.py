"""Decode v3's main launch for GDN, and for KDA with predecayed key records, with an fp32 or bf16 checkpoint, in CUDA
(``gdn_main.cu``; docs/design.md "Session 26"). Since session 31 the default wherever it can run: a launch that names
no main launch takes it when ``unavailable_reason`` has nothing against it, nvcc or a cubin cache is there and its
kernel builds and loads (``load_failure``), else Triton's; ``REPLAYSSM_MAIN_IMPL=triton`` in the environment keeps
Triton's everywhere, ``decode_v3.launch(main_impl="cuda")`` demands this one.

The kernel source is compiled for sm_90 with nvcc into a cubin, once per set of compile-time parameters (shapes,
block shape, optional arguments, element types), and cached (``REPLAYSSM_CUBIN_DIR``, default
``~/.cache/replayssm_sglang/cubin``); the cubin is loaded through the CUDA driver (ctypes, libcuda) and launched on
PyTorch's current stream, so CUDA graphs capture it like any launch. nvcc is looked up in ``REPLAYSSM_NVCC``, on
PATH, under ``CUDA_HOME`` / /usr/local/cuda, and in the ``nvidia-cuda-nvcc`` wheel (``nvidia/cu13/bin``). A launch
with the pre launch as its programmatic-dependent primary (``pdl``) starts its checkpoint copy while the pre launch
runs and waits (``griddepcontrol.wait``) before it reads the coefficients, as the Triton main launch does.

Nothing here runs on a CPU: ``unavailable_reason`` says why a launch cannot take this path, and
``build`` / ``resources`` only need nvcc (tests/test_cuda_main.py compiles the kernel where nvcc exists).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch

SRC = Path(__file__).with_name("gdn_main.cu")
ARCH = "sm_90"
# (rows per warp, warps per block, how the tile is read: 0 bulk copies into shared memory, 1 16-byte loads into
# registers, minimum blocks per SM: a register cap of 65536 / (that x threads), 0 none[, 1: the pre launch's
# coefficients loaded after the tile's dots, not before[, KDA's G_t from the pre launch[, the eight-lanes-per-row layout
# (xl)[, V-tiles per block (nch)[, rc_lean[, the fold on the tensor cores (mma_fold)[, no pre launch: gdn_main.cu's
# SELF_PRE level (self_pre)]]]]]]]; CONFIG_FIELDS): the block's
# V-tile is rows x warps. CUDA_CONFIGS names
# the ones the benchmark times ("r": shared memory, "g": registers, "x": xl with "cN" its nch, "_mN" a cap, "_late"
# the coefficients late);
# CUDA_DEFAULT is what launch() takes when none is asked.
CUDA_CONFIGS = {"r16w4": (16, 4, 0, 0),
                "g8w4": (8, 4, 1, 6), "g8w8": (8, 8, 1, 3), "g8w2": (8, 2, 1, 12),
                "g8w2_late": (8, 2, 1, 12, 1), "g8w2_m10": (8, 2, 1, 10), "g16w4": (16, 4, 1, 4),
                # the default's shape waiting for the pre launch after its tile's dots, not before (session 32: with the
                # CUDA pre launch's one short wave, does a first wave that streams before it waits hide more of it?)
                "g8w4_late": (8, 4, 1, 6, 1),
                # for a bf16 checkpoint: 8 rows per warp capped at 64 registers (32 warps per SM; 24-16 bytes of the
                # fold spilled), in blocks of 1-8 warps, the coefficients loaded before or after the tile's dots
                # (16 rows per warp, the fp32 shapes' bytes in flight per warp, was slower: 215.6-216.5 us against
                # 132.8 for g8w4_m8, kernels-20261203-0722; 2 or 4 warps uncapped, 8 capped: 137.2-139.9, -0804)
                "g8w4_m8": (8, 4, 1, 8), "g8w2_m16": (8, 2, 1, 16), "g8w1_m32": (8, 1, 1, 32), "g8w8_m4": (8, 8, 1, 4),
                "g8w4_m8_late": (8, 4, 1, 8, 1), "g8w1_m32_late": (8, 1, 1, 32, 1), "g8w2_m16_late": (8, 2, 1, 16, 1),
                # KDA's bf16 checkpoint: at 64 registers its per-column G_t spills 40-80 bytes (ptxas sm_90); capped at
                # 72 with the coefficients late, none
                "g8w4_m7_late": (8, 4, 1, 7, 1), "g8w2_m14_late": (8, 2, 1, 14, 1),
                # KDA with G_t per column from the pre launch (a sixth element, 1): the wait before the dots, no gate
                # work and no G_{h-1} load behind h in the main launch
                "g8w4_gp": (8, 4, 1, 6, 0, 1), "g8w4_m7_gp": (8, 4, 1, 7, 0, 1), "g8w4_m8_gp": (8, 4, 1, 8, 0, 1),
                # GDN in the eight-lanes-per-row layout (a seventh element, 1: gdn_main.cu's XL; session 34): a row's
                # dots reduced over 8 lanes, a handful of shuffles per warp instead of ~60; an eighth, the V-tiles a
                # block walks in turn (NCH: its setup once, the next tile's loads in flight through this one's epilogue)
                "x8w4c1": (8, 4, 1, 6, 0, 0, 1, 1), "x8w4c2_m5": (8, 4, 1, 5, 0, 0, 1, 2),
                "x8w4c4_m5": (8, 4, 1, 5, 0, 0, 1, 4), "x8w2c4_m10": (8, 2, 1, 10, 0, 0, 1, 4),
                "x16w4c1_m5": (16, 4, 1, 5, 0, 0, 1, 1), "x16w4c1_m4": (16, 4, 1, 4, 0, 0, 1, 1),
                "x16w4c1_m5_late": (16, 4, 1, 5, 1, 0, 1, 1), "x16w2c1_m10": (16, 2, 1, 10, 0, 0, 1, 1),
                "x16w8c1_m2": (16, 8, 1, 2, 0, 0, 1, 1),
                # for a bf16 checkpoint (16-byte accesses of 8 columns)
                "x8w4c1_m8": (8, 4, 1, 8, 0, 0, 1, 1), "x8w4c4_m6_late": (8, 4, 1, 6, 1, 0, 1, 4),
                "x16w4c1_m6": (16, 4, 1, 6, 0, 0, 1, 1), "x16w4c2_m5": (16, 4, 1, 5, 0, 0, 1, 2),
                # a bf16 checkpoint with bf16 records at 7 blocks per SM (72 registers, no spill; with fp32 records 48
                # bytes; ptxas sm_90, session 40: the occupancy the study of that session puts at a few us; untimed)
                "x16w4c1_m7": (16, 4, 1, 7, 0, 0, 1, 1),
                "x16w2c2_m10": (16, 2, 1, 10, 0, 0, 1, 2), "x16w8c1_m3": (16, 8, 1, 3, 0, 0, 1, 1),
                # KDA (G_t from the pre launch: the sixth field)
                "x16w4c1_m5_gp": (16, 4, 1, 5, 0, 1, 1, 1), "x16w4c1_m4_gp": (16, 4, 1, 4, 0, 1, 1, 1),
                "x16w4c1_m6_gp": (16, 4, 1, 6, 0, 1, 1, 1),
                # for a read copy (issue 7): blocks that walk 2 V-tiles, the fp8 copy's two loaded at once (68 bytes
                # of the fold spilled, ptxas sm_90; x16w4c2_m5 312, KDA's x16w4c2_m4_gp 132)
                "x16w4c2_m4": (16, 4, 1, 4, 0, 0, 1, 2),
                # a read copy with the tile's registers sized for the copy (a ninth element, 1: gdn_main.cu's RC_LEAN;
                # session 40): a folding block reads its fp32 tile one word per row at a time and folds 4 rows at a
                # time, so the copy's rows fit tighter caps (ptxas sm_90, GDN fp8: m6 80 registers, no spill; m7 72,
                # 16 bytes; m8 64, 52 bytes; m5 96, none, where x16w4c1_m5 spills 16)
                "x16w4c1_m5_lean": (16, 4, 1, 5, 0, 0, 1, 1, 1), "x16w4c1_m6_lean": (16, 4, 1, 6, 0, 0, 1, 1, 1),
                "x16w4c1_m7_lean": (16, 4, 1, 7, 0, 0, 1, 1, 1), "x16w4c1_m8_lean": (16, 4, 1, 8, 0, 0, 1, 1, 1),
                "x16w4c1_m5_gp_lean": (16, 4, 1, 5, 0, 1, 1, 1, 1), "x16w4c1_m6_gp_lean": (16, 4, 1, 6, 0, 1, 1, 1, 1),
                # two warps per block (session 58): a block of half the V-rows, so a flushing block's tail at the
                # step's end is half as long; the same registers per thread as the four-warp m7 / m6 shapes
                "x16w2c1_m14_lean": (16, 2, 1, 14, 0, 0, 1, 1, 1), "x16w2c1_m12_lean": (16, 2, 1, 12, 0, 0, 1, 1, 1),
                # rc_lean 2 (session 41, gdn_main.cu's RC_MMA; GDN's copies, the CUDA pre launch): as rc_lean 1, and
                # a copy block takes its tile's dots on the tensor cores (e4m3 -> f16 codes, or bf16 values since
                # session 42, times the pre launch's split operand of q / |q| and k / |k|) and skips the q, k staging
                # and norms
                "x16w4c1_m6_lean_mma": (16, 4, 1, 6, 0, 0, 1, 1, 2),
                "x16w4c1_m7_lean_mma": (16, 4, 1, 7, 0, 0, 1, 1, 2),
                "x16w4c1_m8_lean_mma": (16, 4, 1, 8, 0, 0, 1, 1, 2),
                # the same tuples for a bf16 checkpoint without a read copy (session 42, gdn_main.cu's ST_MMA: rc_lean
                # 2 where there is no copy to be lean for): every block's tile dots on the tensor cores (bf16 values
                # times the pre launch's split bf16 operand), no q, k staging or norms (a folding block loads k~)
                "x16w4c1_m6_mma": (16, 4, 1, 6, 0, 0, 1, 1, 2),
                "x16w4c1_m7_mma": (16, 4, 1, 7, 0, 0, 1, 1, 2),
                "x16w4c1_m8_mma": (16, 4, 1, 8, 0, 0, 1, 1, 2),
                # KDA's (G_t from the pre launch; session 42): its copies' (RC_MMA) and its bf16 checkpoint's (ST_MMA),
                # the operand per value head with e^{G_t} per column in it (KDA's CUDA pre launch)
                "x16w4c1_m6_gp_lean_mma": (16, 4, 1, 6, 0, 1, 1, 1, 2),
                "x16w4c1_m7_gp_lean_mma": (16, 4, 1, 7, 0, 1, 1, 1, 2),
                "x16w4c1_m6_gp_mma": (16, 4, 1, 6, 0, 1, 1, 1, 2),
                "x16w4c1_m7_gp_mma": (16, 4, 1, 7, 0, 1, 1, 1, 2),
                "x16w4c1_m8_gp_mma": (16, 4, 1, 8, 0, 1, 1, 1, 2),
                # the fold on the tensor cores (a tenth element, 1: gdn_main.cu's MMA_FOLD; session 43): a folding
                # warp's 16 rows take the records as one 16-deep product per 8 columns (bf16 checkpoints: bf16
                # products, split where a factor is not bf16; fp32 ones: 3xTF32) where the CUDA-core fold's warp
                # issued 1,600-4,000 instructions more than a plain step's (sass_main_paths.py --path fold; 40-50% of
                # that saved); "_mf" on the shape it folds for: ST_MMA's, the fp32 defaults and the read copies'
                # (GDN's fp8 default, its RC_MMA m8, KDA's fp8 default)
                "x16w4c1_m7_mma_mf": (16, 4, 1, 7, 0, 0, 1, 1, 2, 1),
                "x16w4c1_m8_mma_mf": (16, 4, 1, 8, 0, 0, 1, 1, 2, 1),
                "x16w4c1_m7_gp_mma_mf": (16, 4, 1, 7, 0, 1, 1, 1, 2, 1),
                "x16w4c1_m8_gp_mma_mf": (16, 4, 1, 8, 0, 1, 1, 1, 2, 1),
                "x16w4c1_m5_mf": (16, 4, 1, 5, 0, 0, 1, 1, 0, 1),
                "x16w4c1_m4_gp_mf": (16, 4, 1, 4, 0, 1, 1, 1, 0, 1),
                "x16w4c1_m7_lean_mf": (16, 4, 1, 7, 0, 0, 1, 1, 1, 1),
                "x16w4c1_m8_lean_mma_mf": (16, 4, 1, 8, 0, 0, 1, 1, 2, 1),
                "x16w4c1_m7_gp_lean_mma_mf": (16, 4, 1, 7, 0, 1, 1, 1, 2, 1),
                # and a bf16 checkpoint's CUDA-core shapes with it (session 44: on an H100 the default then, x16w4c1_m6, was
                # faster than ST_MMA's shapes, whose fold MMA_FOLD shortened by 2-7 us; ptxas sm_90, bf16 records: m6
                # 80 registers and m7 72, 0 / 8 bytes of spill, where x16w4c1_m6's CUDA-core fold spills 12 with fp32
                # records)
                "x16w4c1_m6_mf": (16, 4, 1, 6, 0, 0, 1, 1, 0, 1),
                "x16w4c1_m7_mf": (16, 4, 1, 7, 0, 0, 1, 1, 0, 1),
                "x16w4c1_m6_gp_mf": (16, 4, 1, 6, 0, 1, 1, 1, 0, 1),
                # GDN without a pre launch (an eleventh element, 2: gdn_main.cu's SELF_PRE 2, session 47): the block's
                # warps share the record dots, made after the tile's dots; at 128 registers (4 blocks per SM), where
                # it keeps its record's columns and the tile in flight unspilled (ptxas sm_90)
                "x16w4c1_m4_sp2": (16, 4, 1, 4, 0, 0, 1, 1, 0, 0, 2),
                "x16w8c1_m2_sp2": (16, 8, 1, 2, 0, 0, 1, 1, 0, 0, 2),
                # the fp8 copy's lean shapes without a pre launch (SELF_PRE 2 beside RC_LEAN, session 48)
                "x16w4c1_m5_lean_sp2": (16, 4, 1, 5, 0, 0, 1, 1, 1, 0, 2),
                "x16w4c1_m6_lean_sp2": (16, 4, 1, 6, 0, 0, 1, 1, 1, 0, 2),
                "x16w4c1_m7_lean_sp2": (16, 4, 1, 7, 0, 0, 1, 1, 1, 0, 2)}
# (timed and dropped, kernels-20261202-2152 / -2158: shared memory with 32 rows x 4 warps, 8 x 8; registers 16 x 8)
# GDN's default from session 34 to 46 (since session 47 the fp32 state's without a read copy is CUDA_DEFAULT_FP32_GDN
# below; CUDA_DEFAULT stays what a long ring, and the CUDA pre launch's build beside Triton's main launch, take):
# x16w4c1_m5 (the XL layout, 16 rows per warp, 96 registers; fp32 with the CUDA pre launch
# at B = 128 / 256 / 512: 88.3 / 163.6 / 316.3 us against g8w4's 91.1 / 170.5 / 336.3, kernels-20261203-2019); g8w4 before
CUDA_DEFAULT = CUDA_CONFIGS["x16w4c1_m5"]
# GDN's fp32 checkpoint without a read copy since session 47 (default_config; CUDA_DEFAULT stays the shape with a pre
# launch, which a ring of more than 16 records takes): x16w4c1_m4_sp2, no pre launch. Round-robin, the server's
# arguments, B = 128 / 256 / 512: H100 113.1 / 217.2 / 425.1 us against x16w4c1_m5's 118.3 / 224.7 / 438.7 with its
# CUDA pre launch (1.63x / 1.68x / 1.70x conventional against 1.56x / 1.62x / 1.65x; kernels-20261206-0730, and
# -0745 again with 114.8 / 220.0 / 431.0 and 35.3 / 63.0 at B = 32 / 64); H200 86.7 / 165.0 against 88.8 / 168.3
# (B = 128 / 256, kernels-20261206-0726). For a bf16 checkpoint it was slower in every shape (its shorter tiles expose
# the record dots' chain; the same runs). Served: e2e-20261206-0751 / -0756
CUDA_DEFAULT_FP32_GDN = CUDA_CONFIGS["x16w4c1_m4_sp2"]
# the shapes timed for a bf16 checkpoint before XL (a bf16 tile needs the registers form, load_reg 1), and the default
# for one until session 34: g8w4_m8_late, the fastest at B = 128, 256 and 512 alone (67.1 / 127.5 / 250.4 us, 1.10-1.11x conventional; upstream
# 67.9 / 128.2 / 250.1) and at 256 and 512 round-robin (H200, GDN, the server's arguments, kernels-20261203-0808)
CUDA_BF16_CONFIGS = ("g8w4_m8", "g8w1_m32", "g8w4_m8_late", "g8w1_m32_late", "g8w2_m16_late")
# a bf16 checkpoint's since session 34: x16w4c1_m6 (80 registers, 12 bytes of the fold spilled; B = 128 / 256 / 512: 60.1 /
# 106.9 / 202.9 us against g8w4_m8_late's 64.8 / 120.7 / 233.6 and x16w4c1_m5's 64.4 / 114.6 / 218.6, the CUDA pre
# launch beside each, kernels-20261203-2019); since session 44: x16w4c1_m7_mma_mf (ST_MMA's tile dots and MMA_FOLD's
# fold, both on the tensor cores; the CUDA pre launch's operand). On the H100 it was the fastest GDN bf16 shape or tied
# in both runs (kernels-20261205-2346: 123.3 us against 125.1 at B = 256; -20261206-0044: 126.3 / 126.4, and 69.5 /
# 70.5 and 241.7 / 243.7 round-robin at B = 128 / 512); on the H200 ST_MMA's m7 without it already took 102.6
# against 107.3 (kernels-20261205-0140), and MMA_FOLD took 3.6-7.3 us off that shape on the H100. Its float64 GPU
# cases and the step-by-step comparison with the CUDA-core fold passed in both runs
CUDA_DEFAULT_BF16 = CUDA_CONFIGS["x16w4c1_m7_mma_mf"]
# the XL shapes the benchmark times (--variants xl) for an fp32 and for a bf16 checkpoint (x16w4c1_m5 is in both)
# (run kernels-20261203-2008, B = 256, with the CUDA pre launch: fp32 x16w4c1_m5 164.5 us against the default's 171.1,
# x8w4c1 186.7, x8w4c2_m5 178.1, x8w4c4_m5 175.9, x8w2c4_m10 174.6; bf16 x16w4c1_m5 114.2 against 120.2, x8w4c1_m8
# 143.9, x8w4c1 154.3, x8w4c4_m6_late 133.1)
XL_FP32_CONFIGS = ("x16w4c1_m5", "x16w4c1_m4", "x16w4c1_m5_late", "x16w2c1_m10", "x16w8c1_m2")
XL_BF16_CONFIGS = ("x16w4c1_m5", "x16w4c1_m6", "x16w4c1_m5_late", "x16w4c2_m5", "x16w2c2_m10", "x16w8c1_m3",
                   "x16w4c1_m7")
# the XL shapes for a bf16 checkpoint only (their caps spill more than 64 bytes of an fp32 one's fold)
XL_BF16_ONLY = ("x16w4c1_m6", "x16w8c1_m3", "x16w4c1_m7", "x16w4c1_m6_mf", "x16w4c1_m7_mf")
# a bf16 checkpoint's tile dots on the tensor cores (ST_MMA, session 42; the CUDA pre launch), GDN's and KDA's: the
# shapes the benchmark times (--variants xl, bf16) and scripts/cuda_prebuild.py builds
XL_BF16_MMA_CONFIGS = ("x16w4c1_m6_mma", "x16w4c1_m7_mma", "x16w4c1_m8_mma")
XL_KDA_BF16_MMA_CONFIGS = ("x16w4c1_m6_gp_mma", "x16w4c1_m7_gp_mma", "x16w4c1_m8_gp_mma")
# and with the fold on the tensor cores too (MMA_FOLD, mma_fold 1; session 43)
XL_BF16_MMA_MF_CONFIGS = ("x16w4c1_m7_mma_mf", "x16w4c1_m8_mma_mf")
XL_KDA_BF16_MMA_MF_CONFIGS = ("x16w4c1_m7_gp_mma_mf", "x16w4c1_m8_gp_mma_mf")
# and with the CUDA-core tile dots (session 44; bf16 checkpoints only, as their bases)
XL_BF16_MF_CONFIGS = ("x16w4c1_m6_mf", "x16w4c1_m7_mf")
# the fp8 copy's lean shapes without a pre launch (session 48), which the benchmark times beside the copy's default
# (--variants rcsp2) and scripts/cuda_prebuild.py builds
RC_SELF_PRE2_CONFIGS = ("x16w4c1_m5_lean_sp2", "x16w4c1_m6_lean_sp2", "x16w4c1_m7_lean_sp2")
# the shapes the benchmark times with and without their pre launch (--variants sp2: SELF_PRE 2, session 47) and
# scripts/cuda_prebuild.py builds both ways, per checkpoint type: SELF_PRE 2's builds at 96-128 registers (ptxas sm_90;
# at 72-80, bf16 m6 / m7, its record's columns held through the tile's dots spill 92-220 bytes, and those were slower
# still, run kernels-20261206-0726)
SELF_PRE2_CONFIGS = {torch.bfloat16: ("x16w4c1_m5", "x16w4c1_m4", "x16w4c1_m5_mf", "x16w8c1_m2"),
                     torch.float32: ("x16w4c1_m5", "x16w4c1_m4", "x16w8c1_m2")}
XL_KDA_BF16_MF_CONFIGS = ("x16w4c1_m6_gp_mf",)
# the fp32 states' defaults with it (GDN x16w4c1_m5, KDA x16w4c1_m4_gp; the benchmark's --variants mmaf)
XL_FP32_MF_CONFIGS = {"gdn": ("x16w4c1_m5", "x16w4c1_m5_mf"), "kda": ("x16w4c1_m4_gp", "x16w4c1_m4_gp_mf")}
# KDA in the XL layout (session 34; timed and served since session 35, benchmarks.md):
# G_t per column from the pre launch (gt_pre, as KDA's defaults), waited for before the dots
XL_KDA_FP32_CONFIGS = ("x16w4c1_m5_gp", "x16w4c1_m4_gp")
XL_KDA_BF16_CONFIGS = ("x16w4c1_m5_gp", "x16w4c1_m6_gp")
# KDA (predecayed keys): the shapes the benchmark times (--variants cudakda), and the defaults: G_t per column from
# the pre launch (gt_pre), fp32 g8w4_gp (186.8 us at B = 256 against g8w4's 196.5; Triton's 186.3), bf16 g8w4_m7_gp
# (72 registers, no spill: 147.7 against g8w4_m7_late's 153.8; H200, the server's arguments, kernels-20261203-1113)
CUDA_KDA_BF16_CONFIGS = ("g8w4_m7_late", "g8w2_m14_late", "g8w4", "g8w4_m7_gp", "g8w4_m8_gp")
CUDA_KDA_FP32_CONFIGS = ("g8w4", "g8w2", "g8w8", "g8w4_gp")
# the shapes that are KDA's only (G_t from the pre launch)
KDA_ONLY = tuple(n for n, c in CUDA_CONFIGS.items() if len(c) > 5 and c[5])
# KDA's defaults since session 36: the XL layout. Session 35 timed it faster but, served, it moved the tiny
# Kimi-Linear's logprobs by 0.526: nvcc had scheduled its loads of the pre launch's outputs above the PDL wait (fixed
# in gdn_main.cu, checked by pdl_hazards). After the fix (H200, the server's arguments, Triton's pre launch as KDA's
# server runs it, kernels-20261204-0327): fp32 x16w4c1_m4_gp 93.9 / 178.5 / 347.3 us at B = 128 / 256 / 512 (1.51x /
# 1.54x / 1.56x conventional; round-robin 1.50x / 1.54x / 1.53x) against g8w4_gp's 98.3 / 192.8 / 373.8 (x16w4c1_m5_gp,
# the faster before the fix, 97.8 / 185.1 / 363.7); served at window 16 (e2e-20261204-0330) 16/16 prompts identical
# to conventional, max |logprob diff| 0.030 (g8w4_gp 0.034), B = 256 1.296x (g8w4_gp 1.282x). bf16 x16w4c1_m6_gp
# 63.6 / 117.6 / 248.3 us (1.19x / 1.22x / 1.14x; round-robin 1.16x / 1.17x / 1.19x) against g8w4_m7_gp's 72.7 /
# 140.3 / 267.6; its float64 GPU cases passed, the slow-decay one and the CUDA-graph-against-eager one among them;
# not yet served
CUDA_DEFAULT_KDA = CUDA_CONFIGS["x16w4c1_m4_gp"]
# KDA's bf16 checkpoint since session 44: x16w4c1_m6_gp_mf, its default before with the fold on the tensor cores
# (MMA_FOLD): round-robin on the H100 (kernels-20261206-0044) 74.4 / 140.1 / 268.7 us against 76.0 / 141.4 / 270.3 at
# B = 128 / 256 / 512 (1.41x at 512); the same tile dots, so the outputs are the same code's, the checkpoints within
# 4e-5 (rms ratio, emulated) of the CUDA-core fold's; float64 GPU cases passed
CUDA_DEFAULT_KDA_BF16 = CUDA_CONFIGS["x16w4c1_m6_gp_mf"]
# the shapes the benchmark times with a read copy (--variants rccu; issue 7) and scripts/cuda_prebuild.py builds
# (and since session 40 the rc_lean shapes: registers sized for the copy, tighter caps)
XL_RC_CONFIGS = {"gdn": ("x16w4c1_m5", "x16w4c1_m6", "x16w4c2_m4", "x16w4c1_m5_lean", "x16w4c1_m6_lean",
                         "x16w4c1_m7_lean", "x16w4c1_m8_lean", "x16w4c1_m6_lean_mma", "x16w4c1_m7_lean_mma",
                         "x16w4c1_m8_lean_mma", "x16w4c1_m7_lean_mf", "x16w4c1_m8_lean_mma_mf"),
                 "kda": ("x16w4c1_m4_gp", "x16w4c1_m5_gp", "x16w4c1_m5_gp_lean", "x16w4c1_m6_gp_lean",
                         "x16w4c1_m6_gp_lean_mma", "x16w4c1_m7_gp_lean_mma", "x16w4c1_m7_gp_lean_mma_mf")}


CONFIG_FIELDS = ("rpw", "nwarps", "load_reg", "min_blocks", "late_coef", "gt_pre", "xl", "nch", "rc_lean",
                 "mma_fold", "self_pre")
CONFIG_DEFAULTS = (0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0)  # (the first two are required)


def full_config(config) -> tuple:
    """A block shape of 2 to 11 elements (CONFIG_FIELDS) padded with CONFIG_DEFAULTS to all 11."""
    return (*config, *CONFIG_DEFAULTS[len(config):])


CONFIG_ENV = {"gdn": "REPLAYSSM_CUDA_CONFIG_GDN", "kda": "REPLAYSSM_CUDA_CONFIG_KDA"}


def env_config(kind: str):
    """The block shape the environment asks for this kind's launches that name none (REPLAYSSM_CUDA_CONFIG_GDN /
    _KDA: a name of CUDA_CONFIGS, for measurements and diagnostics), or None. An unknown name is refused with the
    names; a shape the launch cannot take is refused by the launch itself (unavailable_reason)."""
    var = CONFIG_ENV.get(kind)
    name = os.environ.get(var, "").strip() if var else ""
    if not name:
        return None
    if name not in CUDA_CONFIGS:
        raise ValueError(f"{var}={name!r} is not a CUDA main-launch shape; one of {sorted(CUDA_CONFIGS)}, "
                         f"or unset it for the default")
    return CUDA_CONFIGS[name]


# GDN with a read copy (issue 7): the rc_lean shapes (session 40; the copy's tile registers sized for the copy). The
# kernel benchmark with staggered cursors (H200, B = 256 / 128, us per layer-step, kernels-20261204-1925): the fp8 copy
# x16w4c1_m7_lean 113.9 / 66.8 against x16w4c1_m5's 124.0 / 70.4; the bf16 copy x16w4c1_m6_lean 127.3 / 71.7 against
# 131.3 / 72.3; aligned cursors (kernels-20261204-1936): 113.0 against 123.0. Served side by side in one call
# (e2e-20261204-2132, GDN fp8 copy, B = 256): 47,503 tok/s with x16w4c1_m7_lean against 45,996 / 45,687 with
# x16w4c1_m5 (before and after it; conventional 31,058). Session 40's served 1.28x (e2e-20261204-1929) did not repeat.
# The bf16 copy's shape was timed in the kernel benchmark only
CUDA_DEFAULT_RC = {torch.float8_e4m3fn: CUDA_CONFIGS["x16w4c1_m7_lean"],
                   torch.bfloat16: CUDA_CONFIGS["x16w4c1_m6_lean"]}
# KDA's fp8 copy (session 42): x16w4c1_m7_gp_lean_mma, the copy-sized registers and the tile's dots on the tensor
# cores (with KDA's CUDA pre launch, which only it feeds): the kernel benchmark at B = 256 (kernels-20261205-0141)
# 125.3 us against 151.5 for x16w4c1_m4_gp, KDA's `same` default which its copies took before; served in one call
# (e2e-20261205-0158, B = 256): 40,140 tok/s against 36,646 (conventional 26,081; 1.539x against 1.405x), 16/16
# prompts identical to conventional, max |logprob diff| 0.038 (0.064 before). KDA's bf16 copy keeps x16w4c1_m4_gp
# (its rc_lean shape x16w4c1_m6_gp_lean timed 137.9 against 159.5, not yet served or checked on the GPU with a bf16
# copy)
CUDA_DEFAULT_RC_KDA = {torch.float8_e4m3fn: CUDA_CONFIGS["x16w4c1_m7_gp_lean_mma"]}
# A ring longer than the CUDA pre launch's 16 records (--linear-replayssm-cache-len > 16) cannot feed a tensor-core
# shape's operand, and MMA_FOLD folds at most 16 records: where the default is such a shape (the bf16 states', KDA's
# fp8 copy's), such a ring takes the shape its state had before them (default_config). (Until session 44 KDA's fp8
# copy took its tensor-core default there too and its first decode step raised: the pre launch could not run.)
# (and SELF_PRE holds at most 16 records: GDN's fp32 default, without a pre launch, takes CUDA_DEFAULT there)
LONG_RING_DEFAULT = {("gdn", torch.bfloat16): CUDA_CONFIGS["x16w4c1_m6"],
                     ("kda", torch.bfloat16): CUDA_CONFIGS["x16w4c1_m6_gp"],
                     ("gdn", torch.float32): CUDA_DEFAULT, ("kda", torch.float32): CUDA_DEFAULT_KDA}


# The two GPUs we time order KDA's bf16 shapes differently (session 45): on the H200 ST_MMA's m8 with MMA_FOLD was
# KDA's fastest bf16 shape in every round (kernels-20261206-0258, round-robin medians at B = 128 / 256 / 512: 61.3 /
# 109.9 / 206.4 us against x16w4c1_m6_gp_mf's 64.3 / 118.4 / 239.0), on the H100 the CUDA-core dots' x16w4c1_m6_gp_mf
# (kernels-20261206-0044: 74.4 / 140.1 / 268.7 against 79.1 / 145.4 / 278.1). So a GPU whose name holds a key here
# takes these shapes for its (kind, checkpoint type) without a read copy; every other GPU the defaults above. (GDN's
# bf16 default, x16w4c1_m7_mma_mf, was the fastest or tied on both.) The ring-length rule of default_config applies
# after it.
DEVICE_DEFAULTS = {"H200": {("kda", torch.bfloat16): CUDA_CONFIGS["x16w4c1_m8_gp_mma_mf"]}}


@functools.lru_cache(maxsize=None)
def _cuda_device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def device_name_of(tensor) -> str | None:
    """The name of the CUDA device a tensor lives on (what DEVICE_DEFAULTS's keys are found in), None off the GPU."""
    dev = getattr(tensor, "device", None)
    if dev is None or dev.type != "cuda":
        return None
    return _cuda_device_name(dev.index if dev.index is not None else torch.cuda.current_device())


def config_name(config) -> str:
    """The first name of CUDA_CONFIGS for a block shape (a tuple as default_config returns)."""
    full = full_config(config)
    return next(n for n, c in CUDA_CONFIGS.items() if full_config(c) == full)


def rc_dtype_of(ring):
    """The element type of a ring's read copy, None without one (what default_config's rc_dtype takes)."""
    return ring.rc.dtype if getattr(ring, "rc", None) is not None else None


def launch_default_config(state, ring, kind: str = "gdn") -> tuple:
    """default_config for a launch on this checkpoint and ring (its element type, its read copy's, its capacity)."""
    return default_config(state.dtype, kind, rc_dtype_of(ring), ring.layout.cap, device_name_of(state))


def default_config(state_dtype: torch.dtype, kind: str = "gdn", rc_dtype: torch.dtype | None = None,
                   cap: int | None = None, device_name: str | None = None) -> tuple:
    """The block shape a launch takes when none is asked: the environment's (env_config), else by the kind, the
    checkpoint's element type and the read copy's (rc_dtype, None without one: GDN's copies take CUDA_DEFAULT_RC,
    KDA's fp8 copy CUDA_DEFAULT_RC_KDA). A ring longer than PRE_MAX_CAP (cap; --linear-replayssm-cache-len > 16)
    cannot take a default that reads the CUDA pre launch's tensor-core operand (rc_lean 2: that pre launch holds at
    most 16 records per row) or folds on the tensor cores (mma_fold: at most 16 records): it takes LONG_RING_DEFAULT's
    shape for its kind and state instead. device_name (torch.cuda.get_device_name of the checkpoint's GPU; None: none
    known) picks DEVICE_DEFAULTS's shape where a key of it is in the name. GDN's fp32 checkpoint without a read copy
    takes CUDA_DEFAULT_FP32_GDN (no pre launch, SELF_PRE 2), which a long ring cannot take either (it holds 16
    records)."""
    env = env_config(kind)
    if env is not None:
        return env
    if kind == "gdn" and rc_dtype in CUDA_DEFAULT_RC and state_dtype == torch.float32:
        cfg = CUDA_DEFAULT_RC[rc_dtype]
    elif kind == "kda" and rc_dtype in CUDA_DEFAULT_RC_KDA and state_dtype == torch.float32:
        cfg = CUDA_DEFAULT_RC_KDA[rc_dtype]
    elif kind == "kda":
        cfg = CUDA_DEFAULT_KDA_BF16 if state_dtype == torch.bfloat16 else CUDA_DEFAULT_KDA
    elif rc_dtype is not None:
        cfg = CUDA_DEFAULT_BF16 if state_dtype == torch.bfloat16 else CUDA_DEFAULT
    else:
        cfg = CUDA_DEFAULT_BF16 if state_dtype == torch.bfloat16 else CUDA_DEFAULT_FP32_GDN
    if rc_dtype is None and device_name:
        for key, table in DEVICE_DEFAULTS.items():
            if key in device_name:
                cfg = table.get((kind, state_dtype), cfg)
    if cap is not None and cap > PRE_MAX_CAP and (tensor_core_shape(cfg) or full_config(cfg)[9]
                                                  or full_config(cfg)[10]):
        cfg = long_ring_default(kind, state_dtype)
    return cfg


def long_ring_default(kind: str, state_dtype: torch.dtype) -> tuple:
    """LONG_RING_DEFAULT's shape for a kind and checkpoint type: no tensor-core operand, no fold on the tensor cores,
    a pre launch."""
    return LONG_RING_DEFAULT[(kind, torch.bfloat16 if state_dtype == torch.bfloat16 else torch.float32)]


def pre_build_config(config, kind: str = "gdn", state_dtype: torch.dtype = torch.float32) -> tuple:
    """The shape whose build holds the CUDA pre launch beside Triton's main launch (decode_v3): the default shape,
    unless that one has no pre launch (SELF_PRE 2: GDN's fp32 default) or its pre launch writes the tensor-core
    operand that only its own main launch reads (rc_lean 2: the bf16 states' defaults, KDA's fp8 copy's; such a build
    refuses to run without that operand's buffer), then LONG_RING_DEFAULT's shape for the kind and state, which is
    neither."""
    return long_ring_default(kind, state_dtype) if full_config(config)[10] or tensor_core_shape(config) else config


def asked_config(cuda_config, state_dtype: torch.dtype, kind: str = "gdn", rc_dtype: torch.dtype | None = None,
                 cap: int | None = None, device_name: str | None = None):
    """A launch's ``cuda_config`` as a shape: a name of CUDA_CONFIGS looked up, a tuple as given (checked by
    decode_v3.launch), None the default for the kind, the checkpoint's element type, the read copy's and the ring's
    capacity (and the GPU's name, DEVICE_DEFAULTS)."""
    return (CUDA_CONFIGS.get(cuda_config, cuda_config) if cuda_config
            else default_config(state_dtype, kind, rc_dtype, cap, device_name))


# (a ring with a read copy, issue 7, takes the CUDA main launch as any other since session 37, the XL layout: opt-in
# in session 36 until its float64 GPU cases passed (kernels-20261204-1153) and it served (e2e-20261204-1159))
MAIN_IMPLS = ("auto", "cuda", "triton")


def env_main_impl() -> str:
    """REPLAYSSM_MAIN_IMPL (how a server prefers a main launch), stripped and lower-cased; "auto" when unset or empty.
    "auto" and "cuda": the CUDA main launch wherever it can run (unavailable_reason) and a kernel can be had (nvcc or
    cached cubins, and the kernel built and loaded), Triton's elsewhere; "triton": Triton's always. decode_v3.launch
    refuses other values."""
    return os.environ.get("REPLAYSSM_MAIN_IMPL", "").strip().lower() or "auto"


PRE_IMPLS = ("auto", "cuda", "triton")
# the kinds whose CUDA pre launch "auto" takes beside the CUDA main launch: those measured faster on the H200 (GDN,
# session 32); KDA's (replay_kda_pre) is taken only where asked for (REPLAYSSM_PRE_IMPL=cuda, pre_impl="cuda")
PRE_AUTO_KINDS = ("gdn",)


def env_pre_impl() -> str:
    """REPLAYSSM_PRE_IMPL (the pre launch a server prefers), stripped and lower-cased; "auto" when unset or
    empty. "auto": the CUDA pre launch for the kinds of PRE_AUTO_KINDS (GDN: gdn_main.cu's replay_gdn_pre) wherever
    the step's main launch is the CUDA one (they share a module) and the pre launch can run (pre_unavailable_reason),
    Triton's elsewhere; "cuda": the CUDA pre launch (KDA's too) wherever it can run and its kernel builds and loads,
    beside Triton's main launch too; "triton": Triton's always.
    decode_v3.launch refuses other values."""
    return os.environ.get("REPLAYSSM_PRE_IMPL", "").strip().lower() or "auto"


def env_self_pre() -> str:
    """REPLAYSSM_SELF_PRE (a server's preference for a decode step without its pre launch), stripped and lower-cased:
    "" (unset), "0", "1" (Triton's main launch doing the pre launch's work) or "cuda" (gdn_main.cu's SELF_PRE);
    decode_v3.launch refuses other values."""
    return os.environ.get("REPLAYSSM_SELF_PRE", "").strip().lower()


# REPLAYSSM_POST_TRIGGER unset: the trigger on. Session 48, H100, round-robin medians of the server's step in each
# default shape (bench --variants trig; kernels-20261206-0932 / -0935), without -> with it, us: GDN fp32 114.7 ->
# 113.7 / 219.6 -> 219.1 / 430.9 -> 429.5 at B = 128 / 256 / 512, and 6.1 -> 4.9 at B = 1; GDN bf16 69.6 -> 68.8 /
# 126.7 -> 125.3; KDA fp32 125.4 -> 124.4 / 239.4 -> 238.5; KDA bf16 74.3 -> 74.0 / 139.8 -> 139.1. Slower nowhere.
POST_TRIGGER_DEFAULT = True


def env_flag(var: str, default=None):
    """An on / off environment variable: "1" True, "0" False, unset or empty `default`. Anything else raises, naming
    the values."""
    v = os.environ.get(var, "").strip().lower()
    if v not in ("", "0", "1"):
        raise ValueError(f"{var} must be 0 or 1, got {v!r}")
    return default if v == "" else v == "1"


def env_level(var: str, levels: tuple, default=None):
    """A leveled environment variable: one of `levels` (ints) as an int, unset or empty `default`. Anything else
    raises, naming the levels."""
    v = os.environ.get(var, "").strip()
    if v == "":
        return default
    if v not in {str(n) for n in levels}:
        names = ", ".join(map(str, levels[:-1])) + f" or {levels[-1]}"
        raise ValueError(f"{var} must be {names}, got {v!r}")
    return int(v)


def env_post_trigger() -> bool:
    """REPLAYSSM_POST_TRIGGER: "1" the CUDA main launch lets the post launch start at once (gdn_main.cu's
    TRIGGER_POST), "0" not; unset or empty: POST_TRIGGER_DEFAULT."""
    return env_flag("REPLAYSSM_POST_TRIGGER", POST_TRIGGER_DEFAULT)


LEAD_PDL_DEFAULT = False  # REPLAYSSM_LEAD_PDL unset (session 48: to be measured, bench --variants trig's v3_tg2_ arms)


def env_lead_pdl() -> bool:
    """REPLAYSSM_LEAD_PDL: "1" the step's first launch is a programmatic dependent of what ran before it (LEAD_PDL),
    "0" not; unset or empty: LEAD_PDL_DEFAULT."""
    return env_flag("REPLAYSSM_LEAD_PDL", LEAD_PDL_DEFAULT)


# PRE_EARLY (session 49): the CUDA pre launches' loads reordered so that a warp's chain is slot -> h -> records (q, k
# and the gate inputs before the slot, the G records beside the key records, a bf16 record's columns in one load).
# bench --variants early, H100, round-robin (kernels-20261206-1216): GDN bf16 (x16w4c1_m7_mma_mf) 122.7 -> 121.3 us at
# B = 256 and 67.4 -> 66.1 at 128 (the pre launch alone 8.0 -> 7.3, 5.9 -> 5.2); GDN's fp8 copy 126.4 -> 125.8 / 72.3
# -> 71.7; KDA's CUDA pre launch alone 15.4 -> 14.5 at 256 (bf16 records) with the step unchanged (136.1 / 136.7), its
# fp8 copy (fp32 records) unchanged. On wherever a build has a pre launch (defines: pre_early None)
# PRE_EARLY level 2 (session 50; pre_early=2, REPLAYSSM_PRE_EARLY=2): with fp32 key records, the first of them loaded
# early too (gdn_main.cu's PRE_EARLY_F32; level 1 loads an fp32 record only at its dot, and KDA's only after the token's
# record is stored). As many as fit the pre launch's registers without a spill (ptxas sm_90, the server's fp8-copy
# and fp32 builds: KDA 8 at its 72 registers, GDN 4 at its 64; 8 spill there). Builds with bf16 records are level 1's.
# The default since session 51: bench --variants early, H100, round-robin at B = 256 (kernels-20261206-1917-s2):
# KDA's fp8 copy 143.9 -> 142.7 us (its pre launch 24.4 -> 24.0), GDN's 127.8 -> 127.5, KDA's fp32 state with the
# CUDA pre launch 238.4 -> 238.1; its GPU float64 cases passed (run 1917), and it changes no bit (emulated)
PRE_EARLY_DEFAULT = 2
PRE_EARLY_F32_RECORDS = {"gdn": 4, "kda": 8}


# PRE_PF (session 49): the pre launch prefetches into L2 the tiles of the batch's first rows. Timed in session 55
# (bench --variants pf, H100, round-robin, B = 256, kernels-20261207-0755): slower at every row count, more so the
# more rows (GDN bf16 119.9 / 120.2 / 120.8 / 121.3 us at 0 / 8 / 16 / 32 rows; KDA bf16 135.9 -> 136.4 / 137.6 /
# 140.5; GDN's fp8 copy 125.9 -> 129.1 at 32; KDA fp32 234.9 -> 245.2; KDA's fp8 copy 140.9 -> 147.3). So none.
PRE_PF_DEFAULT = 0  # REPLAYSSM_PRE_PF unset: no prefetch
PF_BENCH_ROWS = (0, 8, 16, 32)  # bench --variants pf's row counts (and the prebuild's)


def env_pre_pf() -> int:
    """REPLAYSSM_PRE_PF: how many batch rows' tiles the pre launch prefetches into L2 for the main launch (gdn_main.cu's
    PRE_PF; 0 none); unset or empty: PRE_PF_DEFAULT."""
    v = os.environ.get("REPLAYSSM_PRE_PF", "").strip()
    if not v:
        return PRE_PF_DEFAULT
    if not v.isdigit():
        raise ValueError(f"REPLAYSSM_PRE_PF must be a row count (0 for none), got {v!r}")
    return int(v)


# VEC_U (session 52): the main launch's value records read as one vector load per position (a lane's RPL rows, 16
# bytes fp32 or 8 bf16 at 16 rows per warp) instead of RPL element loads; the XL layout. Session 51's bf16-record
# bound found halving the records' bytes worth nothing to GDN, and a value record's elements were loaded one at a
# time, as many loads for bf16 as for fp32. bench --variants vu, H100, round-robin: with fp32 records slower
# (kernels-20261206-2316, B = 256: GDN fp32 216.3 -> 232.5 us, KDA fp32 235.5 -> 245.3, GDN's fp8 copy 125.8 ->
# 128.2; KDA's fp8 copy 140.9 -> 139.7); with bf16 records (the bf16 states', session 54, kernels-20261207-0502 /
# 0503 / 0504) GDN faster at every batch (B = 128 67.4 -> 66.7, 256 124.3 -> 123.2, 512 238.8 -> 236.7; also its
# fp32-state bf16-record bound, 130.8 -> 128.1), KDA much slower (B = 256 138.8 -> 171.6). So on by default where
# it measured faster: GDN with bf16 value records at 16 rows per warp, the layout of every GDN default (not split
# records' high plane, not timed as a default; not the 8-row shapes, where ptxas spills more with it: x8w4c4_m6_late
# 68 bytes of spill loads). Level 2 (session 55: the same loads with no branch; at level 1 KDA's H100 bf16 default put
# each in a branch of its own) takes back two thirds of KDA's loss and no more (kernels-20261207-0755 / 0756, H100,
# B = 256: 136.5 / 168.7 / 147.8 us at levels 0 / 1 / 2; B = 128 72.2 / 88.7 / 78.7), and is GDN's level 1 again
# (120.0 against 119.9; 65.0 / 65.1 at 128): opt-in, REPLAYSSM_VEC_U=2.
VEC_U_DEFAULT_CASES = frozenset({("gdn", torch.bfloat16)})  # (kind, value records' type), at 16 rows per warp


VEC_U_LEVELS = (0, 1, 2)  # 2 (session 55): the same vector loads with no branch (gdn_main.cu's VEC_U 2)


def env_vec_u() -> int | None:
    """REPLAYSSM_VEC_U: "1" the CUDA main launch reads a lane's value records as vectors (gdn_main.cu's VEC_U), "2"
    the same with every load issued unconditionally (a dead position's values dropped by a select), "0" not; unset
    or empty: None (the default, VEC_U_DEFAULT_CASES)."""
    return env_level("REPLAYSSM_VEC_U", VEC_U_LEVELS)


def vec_u_default(kind: str, u_dtype, rec_split: bool = False, rpw: int = 16) -> int:
    """VEC_U where none is asked: 1 for the (kind, value records' type) of VEC_U_DEFAULT_CASES at 16 rows per warp,
    not split records."""
    return int((kind, u_dtype) in VEC_U_DEFAULT_CASES and not rec_split and rpw == 16)


def vec_u_defines(vec_u, xl, rpw, u_dtype, kind: str = "gdn", rec_split: bool = False) -> dict:
    """VEC_U's -D parameter (vec_u None: vec_u_default) where it applies: the XL layout at 8 or 16 rows per warp (2 or
    4 rows per lane) with fp32 or bf16 value records (only where set, so that the other builds keep their cubin
    keys)."""
    on = vec_u_default(kind, u_dtype, rec_split, rpw) if vec_u is None else vec_u
    if on not in VEC_U_LEVELS:
        raise ValueError(f"vec_u must be one of {VEC_U_LEVELS} (or None for its default), got {vec_u!r}")
    applies = xl and rpw in (8, 16) and u_dtype in (torch.float32, torch.bfloat16)
    return {"VEC_U": int(on)} if on and applies else {}


# TILE_EARLY (session 54): under PDL the XL tile's words are loaded with a plain ld.global instead of __ldg. ptxas
# hoists the PDL wait (griddepcontrol.wait, SASS ACQBULK) above read-only .nc loads: in the SASS of KDA's default
# shapes (bf16 state x16w4c1_m6_gp_mf: 1 of the 8 vector loads the PTX issues before the wait stays above it; fp32
# state x16w4c1_m4_gp: 1 of 16; the H200's bf16 x16w4c1_m8_gp_mma_mf: 5 of 8) the tile was loaded only after the
# pre launch had finished, so a main block that started early held nothing while it waited; GDN's defaults and the
# fp8 copies' keep theirs. Timed (bench --variants te, H100, kernels-20261207-0502 / 0503 / 0504): no gain, KDA bf16
# 139.1 -> 139.4 us at B = 256, KDA fp32 238.8 -> 242.9, KDA's fp8 copy 143.4 -> 142.6, GDN unchanged. So off.
TILE_EARLY_DEFAULT = 0


def env_tile_early() -> int:
    """REPLAYSSM_TILE_EARLY: "1" the CUDA main launch loads its tile with plain loads under PDL (gdn_main.cu's
    TILE_EARLY), "0" with __ldg; unset or empty: TILE_EARLY_DEFAULT."""
    return int(env_flag("REPLAYSSM_TILE_EARLY", bool(TILE_EARLY_DEFAULT)))


def tile_early_defines(tile_early, xl, pdl) -> dict:
    """TILE_EARLY's -D parameter (tile_early None: TILE_EARLY_DEFAULT) where it changes the build: the XL layout
    under PDL (only where set, so that the other builds keep their cubin keys)."""
    on = int(TILE_EARLY_DEFAULT if tile_early is None else tile_early)
    if on not in (0, 1):
        raise ValueError(f"tile_early must be 0 or 1 (or None for TILE_EARLY_DEFAULT), got {tile_early!r}")
    return {"TILE_EARLY": 1} if on and xl and pdl else {}


# FOLD_OUT (session 57): in the copy-sized registers (RC_LEAN) a block whose rows flush from the checkpoint read it
# twice, word by word for the tile's dots (NACC serial round trips) and again for the fold; with FOLD_OUT it folds
# first and takes its outputs from the folded rows (gdn_main.cu); level 2 folds 8 rows at a time, not 4; level 3 4 at
# a time with the next 4 rows' loads issued first. The default per kind (session 58, bench --variants fo / fox on two
# H100s, runs kernels-20261207-1551 / -1553 / -1557 / -1618): GDN level 2, faster than level 0 in every round at
# B = 128, 256 and 512 for both copies (fp8 at B = 256: 122.0 against 126.1 us) and in the two-warp and 80-register
# neighbours; KDA off, where every level was slower (fp8 at B = 256: 141.6-149.2 against 140.2-141.2 us). Only in the
# shapes fold_out_default names (the CUDA-core copy shapes at 72 registers or more, GDN's copy defaults among them).
# Not in the tensor-core copy shapes (rc_lean 2, no default of GDN's): there level 2 spills 16 / 28 bytes where level
# 0 spills none (ptxas sm_90) and gained 0-1.3 us in GDN's x16w4c1_m7_lean_mma (faster in 3 of 6 rounds in run 1557,
# 6 of 6 in run 1618). Not at 64 registers, where it spills 96 / 356 bytes (untimed).
FOLD_OUT_DEFAULT = {"gdn": 2, "kda": 0}
FOLD_OUT_MIN_REGISTERS = 72


def fold_out_default(kind: str, rc_lean: int, registers: int) -> int:
    """FOLD_OUT's level where none is asked: FOLD_OUT_DEFAULT[kind] in the copy-sized CUDA-core shapes (rc_lean 1)
    whose register cap (registers per thread) is at least FOLD_OUT_MIN_REGISTERS, 0 elsewhere."""
    return FOLD_OUT_DEFAULT[kind] if rc_lean == 1 and registers >= FOLD_OUT_MIN_REGISTERS else 0


FOLD_OUT_LEVELS = (0, 1, 2, 3)
# bench --variants fox (session 58): GDN's fp8 copy shapes FOLD_OUT is timed in, the default first, then its
# neighbours: 80 registers (no spills; the default spills 16-36 bytes), the tile's dots on the tensor cores, and two
# warps per block at the same registers (half the V-rows per block)
FOX_SHAPES = ("x16w4c1_m7_lean", "x16w4c1_m6_lean", "x16w4c1_m7_lean_mma", "x16w2c1_m14_lean", "x16w2c1_m12_lean")


def fox_levels(name: str) -> tuple:
    """The FOLD_OUT levels bench --variants fox times FOX_SHAPES' shape `name` at (and cuda_prebuild builds): the
    default shape at 0-2, its neighbours at 0 and 2."""
    return (0, 1, 2) if name == FOX_SHAPES[0] else (0, 2)


def env_fold_out() -> int | None:
    """REPLAYSSM_FOLD_OUT: "1" a flushing block of the copy-sized CUDA shapes takes its outputs from its fold
    (gdn_main.cu's FOLD_OUT), "2" the same folding 8 rows at a time, "3" 4 at a time with the next 4 loaded first,
    "0" from the tile's dots; unset or empty: None (fold_out_default: by the kind and shape)."""
    return env_level("REPLAYSSM_FOLD_OUT", FOLD_OUT_LEVELS)


def fold_out_defines(fold_out, kind, rc_dtype, rc_lean, mma_fold, rec_split, late_coef, self_pre,
                     registers=FOLD_OUT_MIN_REGISTERS) -> dict:
    """FOLD_OUT's -D parameter (fold_out None: fold_out_default, by the kind, rc_lean and the shape's register cap)
    where gdn_main.cu takes it: a read copy in the copy-sized registers (RC_LEAN), the CUDA-core fold, whole records,
    the coefficients before the dots (only where set, so that the other builds keep their cubin keys)."""
    on = int(fold_out_default(kind, rc_lean, registers) if fold_out is None else fold_out)
    if on not in FOLD_OUT_LEVELS:
        raise ValueError(f"fold_out must be one of {FOLD_OUT_LEVELS} (or None for its default), got {fold_out!r}")
    applies = rc_dtype is not None and rc_lean and not (mma_fold or rec_split or late_coef or self_pre)
    return {"FOLD_OUT": on} if on and applies else {}


FF_FROM_DEFAULT = 16  # FLUSH_FIRST's rows that keep their place (gdn_main.cu's FF_FROM)


def env_flush_first() -> bool:
    """REPLAYSSM_FLUSH_FIRST: "1" the CUDA main launch takes the rows that fold this step first, in the order its CUDA
    pre launch writes (gdn_main.cu's FLUSH_FIRST, session 59), "0" or unset in batch order."""
    return bool(env_level("REPLAYSSM_FLUSH_FIRST", (0, 1), 0))


def flush_first_defines(flush_first, ff_from, xl, self_pre) -> dict:
    """FLUSH_FIRST's -D parameters (ff_from None: FF_FROM_DEFAULT) where gdn_main.cu takes it: the XL layout with a
    pre launch (not under SELF_PRE); only where set, so that the other builds keep their cubin keys. The launch that
    runs such a build must run the CUDA pre launch of the same build (decode_v3.launch sees to it)."""
    if not flush_first or not xl or self_pre:
        return {}
    ff = FF_FROM_DEFAULT if ff_from is None else int(ff_from)
    if ff < 0:
        raise ValueError(f"ff_from (the rows that keep their place) must be >= 0, got {ff_from!r}")
    return {"FLUSH_FIRST": 1, "FF_FROM": ff}


def env_pre_early() -> int:
    """REPLAYSSM_PRE_EARLY: "1" the CUDA pre launches issue their loads early (gdn_main.cu's PRE_EARLY), "2" and with
    fp32 key records the first PRE_EARLY_F32_RECORDS of them too, "0" neither; unset or empty: PRE_EARLY_DEFAULT."""
    return env_level("REPLAYSSM_PRE_EARLY", (0, 1, 2), int(PRE_EARLY_DEFAULT))


def pre_early_defines(pre_early, kind: str, k_dtype, self_pre=False) -> dict:
    """The -D parameters of a PRE_EARLY level (None: PRE_EARLY_DEFAULT; False / 0 off, True / 1, 2) for a build with a
    pre launch (none under self_pre): PRE_EARLY, and at level 2 with fp32 key records PRE_EARLY_F32 (only where set,
    so that the other builds keep their cubin keys)."""
    level = int(PRE_EARLY_DEFAULT if pre_early is None else pre_early)
    if level not in (0, 1, 2):
        raise ValueError(f"pre_early must be 0, 1 or 2 (or None for PRE_EARLY_DEFAULT), got {pre_early!r}")
    if not level or self_pre:
        return {}
    f32 = level == 2 and k_dtype == torch.float32
    return {"PRE_EARLY": 1} | ({"PRE_EARLY_F32": PRE_EARLY_F32_RECORDS[kind]} if f32 else {})


def pre_early_levels(k_dtype) -> tuple:
    """The PRE_EARLY levels whose builds differ with these key records (pre_early_defines: level 2 only with fp32
    records), for bench --variants early, its prebuild and the GPU pre-early case."""
    return (0, 1, 2) if k_dtype == torch.float32 else (0, 1)


def prefers_cuda() -> bool:
    """The environment lets a launch that names no main launch take the CUDA one where it can (the default)."""
    return env_main_impl() != "triton"

_CTYPES = {torch.float32: "float", torch.bfloat16: "__nv_bfloat16", torch.float16: "__half",
           torch.int32: "int", torch.int64: "long long", torch.bool: "bool", torch.uint8: "unsigned char",
           torch.int8: "signed char"}


def _env_or_path(var: str, name: str) -> tuple:
    """(True, the tool) where the environment's ``var`` names it (None if no such file: the search stops there) or
    ``name`` is on PATH; (False, None) where the caller should look further."""
    env = os.environ.get(var)
    if env:
        return True, (env if Path(env).is_file() else None)
    found = shutil.which(name)
    return (True, found) if found else (False, None)


def find_nvcc() -> str | None:
    """The nvcc to compile with: REPLAYSSM_NVCC, PATH, CUDA_HOME / /usr/local/cuda, the nvidia-cuda-nvcc wheel."""
    decided, tool = _env_or_path("REPLAYSSM_NVCC", "nvcc")
    if decided:
        return tool
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    try:
        import nvidia  # the pip wheels' namespace package (nvidia-cuda-nvcc)

        for base in nvidia.__path__:
            for sub in ("cu13", "cuda_nvcc"):
                p = Path(base) / sub / "bin" / "nvcc"
                if p.is_file():
                    return str(p)
    except ImportError:
        pass
    return None


def cache_dir() -> Path:
    d = os.environ.get("REPLAYSSM_CUBIN_DIR")
    return Path(d) if d else Path.home() / ".cache" / "replayssm_sglang" / "cubin"


def ctype(dtype: torch.dtype) -> str:
    if dtype not in _CTYPES:
        raise ValueError(f"the CUDA main launch has no element type for {dtype}")
    return _CTYPES[dtype]


def defines(*, H, HV, V, cap, BC, rpw, nwarps, load_reg=0, min_blocks=0, late_coef=0, gt_pre=0, xl=0, nch=1,
            rc_lean=0, mma_fold=0, diag_stream=0,
            has_h_rows,
            has_forced, has_ring_idx, pdl, x_dtype, a_dtype, b_dtype, alog_dtype, dtb_dtype, out_dtype, u_dtype,
            k_dtype, slot_dtype, forced_dtype, ridx_dtype, state_dtype=torch.float32, kind="gdn",
            lower_bound=False, rc_dtype=None, self_pre=False, trigger_post=False, lead_pdl=False,
            pre_early=None, pre_pf=0, rec_split=False, vec_u=None, tile_early=None, fold_out=None,
            flush_first=False, ff_from=None) -> dict:
    """The compile-time parameters of one build of gdn_main.cu (its -D macros). kind "kda": KDA with predecayed key
    records; lower_bound: KDA's safe gate (its value is a launch argument); rc_dtype: the read copy's element type
    (issue 7: bf16, or fp8 e4m3 codes with per-V-row scales; the XL layout only), None without one (the builds
    without a read copy keep the defines, and so the cubins, they had before it existed); self_pre: the main launch
    makes the pre launch's coefficients itself (GDN's XL layout; SELF_PRE, session 37: likewise only where set);
    rc_lean: the tile's registers sized for the read copy (RC_LEAN, session 40; only where set); 2: the tile's dots on
    the tensor cores, with a read copy RC_LEAN and the copy blocks' (RC_MMA, session 41; fp8 or bf16 copies), without
    one every block's (ST_MMA, session 42; a bf16 checkpoint); GDN's and KDA's. mma_fold: a folding warp's fold on
    the tensor cores (MMA_FOLD, session 43; the XL layout; only where set). trigger_post: the main launch lets its
    programmatic dependent, the post launch, start at once (TRIGGER_POST, session 48; only where set). lead_pdl: the
    step's first launch (the pre launch, or the main launch under self_pre) is launched as a programmatic dependent of
    what ran before it and waits for it first thing (LEAD_PDL, session 48; only where set). pre_early: the CUDA pre
    launches issue the loads that wait for no index before the slot's, the G records with the key records, and a bf16
    key record's columns as one load (PRE_EARLY, session 49; None: PRE_EARLY_DEFAULT; never under self_pre, which
    has no pre launch); 2: and with fp32 key records the first of them too (PRE_EARLY_F32, session 50). pre_pf:
    the pre launch's warps of the first pre_pf batch rows prefetch their tiles into L2 (PRE_PF, session 49; only
    where set, and only with a pre launch). rec_split: the records are split in two 16-bit planes (REC_SPLIT, session
    51; u_dtype and k_dtype are then the bf16 high plane; only where set). vec_u: the main launch reads a lane's value
    records at one position as one vector load (VEC_U, session 52; None: vec_u_default, on for GDN's bf16 records
    since session 54; vec_u_defines says where).
    tile_early: under PDL the XL tile's words are plain loads, which the PDL wait cannot pass (TILE_EARLY, session 54;
    None: TILE_EARLY_DEFAULT; tile_early_defines says where). fold_out: a flushing block of the copy-sized shapes takes
    its outputs from its fold (FOLD_OUT, session 57; None: fold_out_default, GDN's level 2 in its CUDA-core copy
    shapes since session 58; fold_out_defines says where). flush_first: the main launch takes the rows that fold
    this step first, past the first ff_from (None: FF_FROM_DEFAULT), in the order its CUDA pre launch writes
    (FLUSH_FIRST, session 59; flush_first_defines says where)."""
    rc = {} if rc_dtype is None else {"HAS_RC": 1, "RC_FP8": int(rc_dtype == torch.float8_e4m3fn),
                                      "RC_T": "unsigned char" if rc_dtype == torch.float8_e4m3fn else ctype(rc_dtype)}
    rc |= {"SELF_PRE": int(self_pre)} if self_pre else {}
    if rc_dtype is not None:  # (likewise only where set: the other builds' cubins keep their keys)
        rc |= ({"RC_LEAN": 1} if rc_lean else {}) | ({"RC_MMA": 1} if rc_lean == 2 else {})
    elif rc_lean == 2:
        rc |= {"ST_MMA": 1}
    elif rc_lean:
        rc |= {"RC_LEAN": 1}  # (refused by gdn_main.cu: a lean tile needs a copy)
    rc |= {"MMA_FOLD": 1} if mma_fold else {}
    rc |= {"TRIGGER_POST": 1} if trigger_post else {}
    rc |= {"LEAD_PDL": 1} if lead_pdl else {}
    rc |= pre_early_defines(pre_early, kind, k_dtype, self_pre)
    rc |= {"PRE_PF": int(pre_pf)} if pre_pf and not self_pre else {}
    rc |= {"REC_SPLIT": 1} if rec_split else {}
    rc |= vec_u_defines(vec_u, xl, rpw, u_dtype, kind, rec_split)
    rc |= tile_early_defines(tile_early, xl, bool(pdl) and not self_pre)
    rc |= fold_out_defines(fold_out, kind, rc_dtype, rc_lean, mma_fold, rec_split, late_coef, self_pre,
                           registers=65536 // (32 * nwarps * max(1, int(min_blocks))))
    rc |= flush_first_defines(flush_first, ff_from, xl, self_pre)
    return rc | {"H_": H, "HV_": HV, "V_": V, "CAP_": cap, "BC_": BC, "RPW": rpw, "NWARPS": nwarps,
            "IS_KDA": int(kind == "kda"), "USE_LOWER_BOUND": int(bool(lower_bound)), "GT_PRE": int(gt_pre),
            "LOAD_REG": int(load_reg), "MINB": max(1, int(min_blocks)), "LATE_COEF": int(late_coef),
            "DIAG_STREAM": int(diag_stream), "XL": int(xl), "NCH": int(nch),
            "HAS_H_ROWS": int(has_h_rows), "HAS_FORCED": int(has_forced), "HAS_RING_IDX": int(has_ring_idx),
            "USE_PDL": int(bool(pdl) and not self_pre),  # (no pre launch, nothing to wait for)
            "X_T": ctype(x_dtype), "A_T": ctype(a_dtype), "B_T": ctype(b_dtype),
            "ALOG_T": ctype(alog_dtype), "DTB_T": ctype(dtb_dtype), "OUT_T": ctype(out_dtype),
            "U_T": ctype(u_dtype), "KR_T": ctype(k_dtype), "SLOT_T": ctype(slot_dtype),
            "FORCED_T": ctype(forced_dtype), "RIDX_T": ctype(ridx_dtype), "ST_T": ctype(state_dtype)}


def server_defines(config, *, rec_dtype=torch.float32, state_dtype=torch.float32, kind: str = "gdn",
                   rc_dtype=None, rec_split=False, vec_u=None, tile_early=None, fold_out=None,
                   flush_first=False) -> dict:
    """The build the server's launch of a block shape compiles, at the real head sizes (GDN: Qwen3-Next's H 16, HV 32;
    KDA: Kimi-Linear's 32, 32; K = V = 128, L = 16): bf16 inputs and output, int32 slots and flags, int64 ring rows,
    PDL; rec_dtype the records' type (rec_split: fp32 records split in two planes, REC_SPLIT; rec_dtype is then
    ignored). For offline checks of a shape (ptxas resources, SASS, PDL hazards)."""
    if rec_split:
        rec_dtype = torch.bfloat16  # (the high plane)
    rpw, nwarps, load_reg, min_blocks, late, gt, xl, nch, lean, mf, sp = full_config(config)
    H, HV = (16, 32) if kind == "gdn" else (32, 32)
    bf16, f32 = torch.bfloat16, torch.float32
    return defines(H=H, HV=HV, V=128, cap=16, BC=16, rpw=rpw, nwarps=nwarps, load_reg=load_reg, min_blocks=min_blocks,
                   late_coef=late, gt_pre=gt, xl=xl, nch=nch, rc_lean=lean, mma_fold=mf, has_h_rows=False,
                   has_forced=True,
                   has_ring_idx=True, pdl=True, x_dtype=bf16, a_dtype=bf16, b_dtype=bf16, alog_dtype=f32,
                   dtb_dtype=f32, out_dtype=bf16, u_dtype=rec_dtype, k_dtype=rec_dtype, slot_dtype=torch.int32,
                   forced_dtype=torch.int32, ridx_dtype=torch.int64, state_dtype=state_dtype, kind=kind,
                   rc_dtype=rc_dtype, self_pre=sp, rec_split=rec_split, vec_u=vec_u, tile_early=tile_early,
                   fold_out=fold_out, flush_first=flush_first)


def smem_bytes(defs: dict) -> int:
    """Dynamic shared memory of a block: the [VT, K] tile (read into shared memory), the fold's [VT, BC] decayed
    records and [VT] u_t."""
    vt = defs["RPW"] * defs["NWARPS"]
    return 4 * (vt * 128 * (1 - defs["LOAD_REG"]) + vt * defs["BC_"] + vt)


def _key(defs: dict, arch: str, src: Path | None = None) -> str:
    h = hashlib.sha1((src or SRC).read_bytes())
    h.update(repr(sorted(defs.items())).encode())
    h.update(arch.encode())
    return h.hexdigest()[:20]


def _nvcc_cmd(nvcc: str, defs: dict, arch: str, out: str, verbose=False, src: Path | None = None) -> list:
    cmd = [nvcc, f"-arch={arch}", "-cubin", "-O3", "-std=c++17", "-o", out, str(src or SRC)]
    cmd += [f"-D{k}={v}" for k, v in defs.items()]
    if verbose:
        cmd += ["-Xptxas", "-v"]
    return cmd


def build(defs: dict, arch: str = ARCH, src: Path | None = None) -> Path:
    """The cubin of this build, compiled if it is not in the cache yet. src: the CUDA source (None: gdn_main.cu; the
    study kernels of scripts/ pass theirs, cached beside it under their own name)."""
    src = src or SRC
    path = cache_dir() / f"{src.stem}-{_key(defs, arch, src)}.cubin"
    if path.is_file():
        return path
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("the CUDA main launch needs nvcc to build its kernel (set REPLAYSSM_NVCC, put nvcc on PATH "
                           "or `pip install nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt nvidia-cuda-runtime`), or a "
                           f"cubin cache in REPLAYSSM_CUBIN_DIR ({cache_dir()})")
    path.parent.mkdir(parents=True, exist_ok=True)
    log = logging.getLogger(__name__)
    what = "the CUDA main launch" if src == SRC else src.name
    log.info("ReplaySSM: compiling %s for one shape with %s (once: cached in %s)", what, nvcc, path.parent)
    t0 = time.monotonic()
    # compiled into a temporary file beside the cache entry and renamed into place (one filesystem: atomic), so that
    # processes building the same kernel at once (tensor-parallel ranks) never load a partly written cubin
    with tempfile.TemporaryDirectory(dir=path.parent) as td:
        tmp = str(Path(td) / "k.cubin")
        r = subprocess.run(_nvcc_cmd(nvcc, defs, arch, tmp, src=src), capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"nvcc failed on {src.name}:\n{r.stderr[-4000:]}")
        os.replace(tmp, path)
    log.info("ReplaySSM: %s compiled in %.1f s (%s)", what, time.monotonic() - t0, path.name)
    return path


def resources(defs: dict, arch: str = ARCH, name: str = "replay_gdn_main", src: Path | None = None) -> dict:
    """ptxas's report for kernel ``name`` of this build (of ``src``, None: gdn_main.cu): registers, spill stores /
    loads and stack frame (bytes)."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("resources() needs nvcc")
    src = src or SRC
    with tempfile.TemporaryDirectory() as td:
        r = subprocess.run(_nvcc_cmd(nvcc, defs, arch, str(Path(td) / "k.cubin"), verbose=True, src=src),
                           capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src.name}:\n{r.stderr[-4000:]}")
    txt = r.stdout + r.stderr
    # the build may hold two kernels: the report's section of this one (up to the next entry function)
    m = re.search(rf"Compiling entry function '{re.escape(name)}'(.*?)(?=Compiling entry function|\Z)", txt, re.S)
    if m is None:
        raise RuntimeError(f"ptxas reported no kernel {name!r} for this build")
    sec = m.group(1)
    reg = re.search(r"Used (\d+) registers", sec)
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", sec)
    stack = re.search(r"(\d+) bytes stack frame", sec)
    return {"registers": int(reg.group(1)) if reg else None,
            "spill_stores": int(spill.group(1)) if spill else None,
            "spill_loads": int(spill.group(2)) if spill else None,
            "stack": int(stack.group(1)) if stack else None}


def emulated(device: torch.device) -> bool:
    """The launches on this device run gdn_main.cu on the CPU (kernels/cuda_emu.py): a CPU device and
    REPLAYSSM_CUDA_EMULATE=1, for tests."""
    return device.type == "cpu" and os.environ.get("REPLAYSSM_CUDA_EMULATE") == "1"


def find_nvdisasm() -> str | None:
    """nvdisasm (for pdl_hazards): REPLAYSSM_NVDISASM, PATH, beside nvcc, or the copy Triton's wheel carries."""
    decided, tool = _env_or_path("REPLAYSSM_NVDISASM", "nvdisasm")
    if decided:
        return tool
    nvcc = find_nvcc()
    if nvcc and (Path(nvcc).parent / "nvdisasm").exists():
        return str(Path(nvcc).parent / "nvdisasm")
    try:
        import triton

        p = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "nvdisasm"
        return str(p) if p.exists() else None
    except ImportError:
        return None


# the main launch's parameters that the pre launch writes (coef, scal, ovf, gts: parameters 15-18, at 0x210 + 8 i in
# the constant bank; qk_frag at 0x2f0; FLUSH_FIRST's order, the last, at 0x308; a change of the kernel's parameter
# list moves them, and test_pdl_hazards_finds_the_session_35_bug then fails), and SASS operands: registers (R, UR; a
# ".64" operand is a pair)
_PRE_PARAMS = re.compile(r"c\[0x0\]\[0x(288|290|298|2a0|2f0|308)\]")
_REG = re.compile(r"\b(U?R)(\d+)(\.64)?\b")


def _regs(operand: str) -> set:
    out = set()
    for kind, num, wide in _REG.findall(operand):
        out.add(f"{kind}{num}")
        if wide:
            out.add(f"{kind}{int(num) + 1}")
    return out


def main_sass(defs: dict, arch: str = ARCH, name: str = "replay_gdn_main", src: Path | None = None) -> list:
    """A kernel's SASS instructions in order (replay_gdn_main's unless named; nvcc, then nvdisasm), each without its
    address, its trailing ";" and any predicate (a predicate does not change what an instruction reads). src: the
    CUDA source (None: gdn_main.cu; the study kernels of scripts/ pass theirs)."""
    nvcc, nvdisasm = find_nvcc(), find_nvdisasm()
    if nvcc is None or nvdisasm is None:
        raise RuntimeError("main_sass() needs nvcc and nvdisasm")
    src = src or SRC
    with tempfile.TemporaryDirectory() as td:
        out = str(Path(td) / "k.cubin")
        r = subprocess.run(_nvcc_cmd(nvcc, defs, arch, out, src=src), capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"nvcc failed on {src.name}:\n{r.stderr[-4000:]}")
        sass = subprocess.run([nvdisasm, "-c", out], capture_output=True, text=True, check=True).stdout
    sec = sass.split(f".text.{name}:", 1)
    if len(sec) != 2:
        raise RuntimeError(f"nvdisasm shows no {name}")
    sec[1] = sec[1].split("\n.text.", 1)[0].split("\n\t.section", 1)[0]  # (that kernel's section only)
    ins = [re.sub(r"/\*[0-9a-f]+\*/", "", ln).strip().rstrip(" ;") for ln in sec[1].splitlines()
           if re.search(r"/\*[0-9a-f]{4}\*/", ln)]
    return [re.sub(r"^@!?U?P\w+\s+", "", ln) for ln in ins]


def pdl_wait_index(ins: list) -> int:
    """The index of the first PDL wait (griddepcontrol.wait, SASS ACQBULK) in main_sass's instructions."""
    at = next((i for i, ln in enumerate(ins) if ln.startswith("ACQBULK")), None)
    if at is None:
        raise RuntimeError("no PDL wait (ACQBULK) in the kernel's SASS: built without USE_PDL?")
    return at


def pdl_hazards(defs: dict, arch: str = ARCH) -> list:
    """The main launch's global loads, before its PDL wait (griddepcontrol.wait, SASS ACQBULK), whose addresses come
    from what the pre launch writes (coef, scal, ovf, gts): under PDL those read the pre launch's output before it is
    there. Builds the kernel (nvcc) and follows registers forward through the SASS (nvdisasm) from those parameters
    up to the wait; conservative (a register written from a tainted one stays tainted until overwritten by an
    untainted value). Session 35: nvcc scheduled such loads above the wait when the pointers were __restrict__."""
    ins = main_sass(dict(defs, USE_PDL=1), arch)
    tainted, bad = set(), []
    for ln in ins[:pdl_wait_index(ins)]:
        parts = ln.split(None, 1)
        if len(parts) < 2:
            continue
        opc, ops = parts[0], [o.strip() for o in parts[1].split(",")]
        if opc.startswith(("LDG", "LD.", "LDS")):
            addr = next((o for o in ops if "[" in o), "")
            where = addr.split("]", 1)[-1] if addr.startswith("desc") else addr  # (desc[URx] is the descriptor)
            if opc.startswith(("LDG", "LD.")) and _regs(where) & tainted:
                bad.append(ln)
            tainted -= _dst_regs(opc, ops[0])
            continue
        if opc.startswith(("ST", "BRA", "BAR", "EXIT", "RET", "CALL", "WARPSYNC", "NOP", "BSYNC", "BSSY")):
            continue
        dst, srcs = ops[0], ops[1:]
        if any(_PRE_PARAMS.search(o) for o in srcs) or any(_regs(o) & tainted for o in srcs):
            tainted |= _dst_regs(opc, dst)
        else:
            tainted -= _dst_regs(opc, dst)  # (all of them: session 42's ULDC.64 left the pair's high half tainted)
    return bad


def tile_loads_before_wait(defs: dict, arch: str = ARCH) -> tuple:
    """(PTX, SASS): the main launch's 16- and 8-byte global loads before its first PDL wait, in the PTX nvcc emits
    (griddepcontrol.wait) and in the SASS ptxas makes of it (ACQBULK). Where SASS has fewer, ptxas moved loads the
    source issues before the wait below it (session 54: it hoists the wait above __ldg's read-only loads; KDA's
    defaults then loaded their tile only after the pre launch). Needs nvcc and nvdisasm; builds with USE_PDL."""
    defs = dict(defs, USE_PDL=1)
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("tile_loads_before_wait() needs nvcc")
    with tempfile.TemporaryDirectory() as td:
        out = str(Path(td) / "k.ptx")
        cmd = _nvcc_cmd(nvcc, defs, arch, out)
        cmd[cmd.index("-cubin")] = "-ptx"
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"nvcc failed on {SRC.name}:\n{r.stderr[-4000:]}")
        body = Path(out).read_text().split(".entry replay_gdn_main", 1)[1].split(".entry ", 1)[0]
    if "griddepcontrol.wait" not in body:
        raise RuntimeError("no PDL wait in replay_gdn_main's PTX")
    ptx = len(re.findall(r"\tld\.global\S*\.v[24]\.[bfu]32", body.split("griddepcontrol.wait", 1)[0]))
    ins = main_sass(defs, arch)
    sass = sum(1 for ln in ins[:pdl_wait_index(ins)] if re.match(r"LDG\S*\.(128|64)\b", ln))
    return ptx, sass


def branched_loads_before_wait(defs: dict, op: str = "LDG.E.64", arch: str = ARCH) -> tuple:
    """(all, branched): the main launch's global loads of opcode ``op`` (exactly; LDG.E.64 is a lane's four bf16 value
    records at 16 rows per warp, VEC_U) before its PDL wait, and how many of them lie inside a branch's region
    (between a BSSY Bn and its BSYNC Bn in the SASS). A load in such a region is issued only on its branch, and its
    use before the BSYNC makes the warp wait for it there (session 55: VEC_U 1 in KDA's bf16 default put each of its
    record loads in a branch of its own; VEC_U 2 issues them with none). Needs nvcc and nvdisasm; builds with
    USE_PDL."""
    ins = main_sass(dict(defs, USE_PDL=1), arch)
    open_regions, found, branched = set(), 0, 0
    for ln in ins[:pdl_wait_index(ins)]:
        parts = ln.split(None, 1)
        opc = parts[0] if parts else ""
        if opc == "BSSY":
            open_regions.add(parts[1].split(",")[0].strip())
        elif opc == "BSYNC":
            open_regions.discard(parts[1].strip())
        elif opc == op:
            found += 1
            branched += bool(open_regions)
    return found, branched


def _dst_regs(opc: str, dst: str) -> set:
    """The registers an instruction writes: its destination, the pair of a 64-bit result (.64, .WIDE), the four of a
    128-bit load."""
    n = 4 if ".128" in opc else 2 if (".64" in opc or ".WIDE" in opc) else 1
    return _regs(dst) | {f"{k}{int(r) + i}" for k, r, _ in _REG.findall(dst) for i in range(1, n)}


# ---------------------------------------------------------------------------------------------------------------
# the driver side: load a cubin, launch it on the current stream (optionally as a programmatic dependent)
# ---------------------------------------------------------------------------------------------------------------

class _LaunchAttr(ctypes.Structure):
    # CUlaunchAttribute: an enum id, padding to 8 bytes, a 64-byte value union
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_char * 64)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttr)), ("numAttrs", ctypes.c_uint)]


_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
_FUNC_ATTR_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_lib = None
_functions: dict = {}


def _cuda():
    global _lib
    if _lib is None:
        _lib = ctypes.CDLL("libcuda.so.1")
        _lib.cuLaunchKernelEx.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p,
                                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    return _lib


def _check(rc: int, what: str) -> None:
    if rc != 0:
        msg = ctypes.c_char_p()
        _cuda().cuGetErrorString(rc, ctypes.byref(msg))
        raise RuntimeError(f"{what} failed: CUDA error {rc} ({(msg.value or b'?').decode()})")


def function(defs: dict, device: torch.device, name: str = "replay_gdn_main"):
    """The loaded kernel ``name`` of this build on ``device`` (built and loaded once per process; the build holds the
    main launch, replay_gdn_main, and for GDN the pre launch, replay_gdn_pre)."""
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (tuple(sorted(defs.items())), idx)
    if name != "replay_gdn_main":
        mod = _functions.get(key, (None,))[0]
        if mod is None:
            function(defs, device)  # (loads the module)
            mod = _functions[key][0]
        fkey = (key, name)
        if fkey not in _functions:
            f = ctypes.c_void_p()
            _check(_cuda().cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), f"cuModuleGetFunction({name})")
            _functions[fkey] = (mod, f)
        return _functions[fkey][1]
    fn = _functions.get(key)
    if fn is None:
        data = build(defs).read_bytes()
        torch.cuda.init()
        with torch.cuda.device(idx):
            lib = _cuda()
            ctx = ctypes.c_void_p()
            _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
            if not ctx.value:  # (a thread PyTorch has not used yet: its device's primary context)
                dev = ctypes.c_int()
                _check(lib.cuDeviceGet(ctypes.byref(dev), idx), "cuDeviceGet")
                _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
                _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            mod, f = ctypes.c_void_p(), ctypes.c_void_p()
            _check(lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(data)), "cuModuleLoadData")
            _check(lib.cuModuleGetFunction(ctypes.byref(f), mod, b"replay_gdn_main"), "cuModuleGetFunction")
            _check(lib.cuFuncSetAttribute(f, _FUNC_ATTR_MAX_DYNAMIC_SHARED, smem_bytes(defs)), "cuFuncSetAttribute")
        fn = (mod, f)  # (the module stays loaded for the process)
        _functions[key] = fn
    return fn[1]


def unavailable_reason(kind, state, ring, lower_bound, K, V, rpw, nwarps, load_reg=0, min_blocks=0,
                       late_coef=0, gt_pre=0, xl=0, nch=1, rc_lean=0, mma_fold=0, self_pre=False) -> str | None:
    """Why the CUDA main launch cannot run this launch (None: it can); self_pre: without a pre launch (SELF_PRE)."""
    dev = state.device
    cap = ring.layout.cap
    if mma_fold and (not xl or rpw != 16 or cap > 16 or K != 128 or int(self_pre) == 1):
        return ("the fold on the tensor cores (mma_fold, MMA_FOLD) is the eight-lanes-per-row layout's (xl) with 16 rows "
                "per warp, K = 128, the pre launch's coefficients or self_pre 2 (not 1), and folds at most 16 "
                "records: a ring capacity of at most 16 (--linear-replayssm-cache-len <= 16)")
    if rc_lean == 2 and ring.rc is None:
        if state.dtype != torch.bfloat16 or not xl or rpw != 16 or nch != 1 or late_coef or self_pre or K != 128:
            return ("the tile's dots on the tensor cores (rc_lean 2) without a read copy (ST_MMA) take a bf16 state, "
                    "the eight-lanes-per-row layout (xl), 16 rows per warp, one V-tile per block, no late_coef or "
                    "self_pre, K = 128")
    elif rc_lean and (ring.rc is None or not xl or nch != 1 or int(self_pre) == 1 or (rc_lean == 2 and self_pre)):
        return ("registers sized for the read copy (rc_lean) need a read copy, the eight-lanes-per-row layout (xl), "
                "one V-tile per block and the pre launch's coefficients or self_pre 2 (not 1; rc_lean 2: the pre "
                "launch's operand, no self_pre)")
    elif rc_lean == 2 and (rpw != 16 or late_coef or K != 128):
        return "the copy's dots on the tensor cores (rc_lean 2, RC_MMA) take 16 rows per warp, no late_coef, K = 128"
    if ring.split_records and (not xl or state.dtype != torch.float32):
        return "split records (REC_SPLIT) are read by the eight-lanes-per-row layout (xl) beside an fp32 state"
    if self_pre and (kind != "gdn" or not xl or rpw != 16 or late_coef or cap > 16):
        return ("making the pre launch's coefficients itself (self_pre) is GDN's eight-lanes-per-row layout (xl), 16 "
                "rows per warp, no late_coef, a ring capacity of at most 16")
    if xl:
        if kind == "kda" and (not gt_pre or late_coef):
            return ("the eight-lanes-per-row layout (xl) takes KDA's G_t from the pre launch (gt_pre) and waits for it "
                    "before the tile's dots (no late_coef)")
        if not load_reg or rpw not in (8, 16):
            return "the eight-lanes-per-row layout (xl) reads the tile into registers, 8 or 16 rows per warp"
        if cap % 16:  # (the kernel is written for multiples of 8; its GPU cases run 16, the server's)
            return "the eight-lanes-per-row layout (xl) needs a ring capacity that is a multiple of 16"
        if V % (rpw * nwarps * nch):
            return f"its V-tiles ({rpw} x {nwarps} rows, {nch} per block) must divide V = {V}"
    elif nch != 1:
        return "a block walks several V-tiles (nch) in the eight-lanes-per-row layout (xl) only"
    if kind not in ("gdn", "kda"):
        return "it is written for GDN and KDA only"
    if kind == "kda" and not ring.predecayed:
        return "KDA needs predecayed key records (kda_keys='predecayed', the server's default without speculative decoding)"
    if gt_pre and kind != "kda":
        return "G_t from the pre launch (gt_pre) is KDA's"
    if kind == "kda" and not load_reg:
        return "KDA is written for the tile in registers (load_reg 1, the g* shapes)"
    if state.dtype not in (torch.float32, torch.bfloat16):
        return "it needs an fp32 or bf16 state"
    if state.dtype == torch.bfloat16 and not load_reg:
        return "a bf16 state is read into registers (load_reg 1, the g* shapes)"
    if ring.rc is not None:
        if not xl:
            return "a read copy is read by the eight-lanes-per-row layout (xl) only"
        if state.dtype != torch.float32:
            return "a read copy is kept beside an fp32 state only"
        if ring.rc.dtype not in (torch.bfloat16, torch.float8_e4m3fn):
            return "its read copy is bf16 or fp8 e4m3"
        if ring.rc.stride()[1:] != (V * K, K, 1) or ring.rc.data_ptr() % 16:
            return "it needs each ring row's [HV, V, K] read copy contiguous and 16-byte aligned"
    if lower_bound is not None and kind == "gdn":
        return "GDN's gate has no lower bound"
    if K != 128:
        return "it needs K = 128 (a warp's 32 lanes x 4 columns)"
    if load_reg and cap % 8:
        return "the tile in registers needs a ring capacity that is a multiple of 8"
    if rpw not in (8, 16, 32) or (not xl and cap % (4 * 32 // rpw)):
        return f"{rpw} rows per warp need 8, 16 or 32 rows and a ring capacity that is a multiple of {4 * 32 // rpw}"
    if V % (rpw * nwarps):
        return f"its V-tile ({rpw} x {nwarps} rows) must divide V = {V}"
    if emulated(dev):
        pass  # (the CPU emulation, kernels/cuda_emu.py: for tests; the layout checks below still apply)
    elif dev.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "it needs a CUDA GPU"
    elif torch.cuda.get_device_capability(dev) < (9, 0):
        return "it needs sm_90 or newer (bulk asynchronous copies)"
    if state.stride()[1:] != (V * K, K, 1) or (state.stride(0) * state.element_size()) % 16 or state.data_ptr() % 16:
        return "it needs each slot's [HV, V, K] checkpoint contiguous and 16-byte aligned"
    if rc_lean == 2 and not self_pre:  # (the tile's dots on the tensor cores take the CUDA pre launch's operand)
        why = pre_unavailable_reason(kind, state, ring, K, max(4, 1 << (cap - 1).bit_length()))  # (BC: decode_v3's)
        if why:
            return f"its tensor-core operand comes from the CUDA pre launch ({why})"
    return None


def usable(kind, state, ring, lower_bound, K, V, config) -> bool:
    """The launch can take the CUDA path here and now: it can run (unavailable_reason) and a kernel can be had
    (nvcc to build one, or a cache holding cubins)."""
    if not (isinstance(config, tuple) and 2 <= len(config) <= len(CONFIG_FIELDS)):
        return False
    if unavailable_reason(kind, state, ring, lower_bound, K, V, *config) is not None:
        return False
    return _obtainable()


def preference_note(kind, state, ring, K, V) -> str:
    """Which main launch a decode step of this layer takes by the environment's preference, for the server's log:
    "CUDA (...)" or "Triton (why)". (A CUDA kernel that then fails to build falls back at its first launch, warned.)"""
    if not prefers_cuda():
        return "Triton (REPLAYSSM_MAIN_IMPL=triton)"
    why = unavailable_reason(kind, state, ring, None, K, V, *launch_default_config(state, ring, kind))
    if why:
        return f"Triton (the CUDA one: {why})"
    if not _obtainable():
        return "Triton (the CUDA one needs nvcc or cached cubins: REPLAYSSM_NVCC, REPLAYSSM_CUBIN_DIR)"
    cfg = launch_default_config(state, ring, kind)
    shape = f"shape {_shape_name(kind, cfg)}" + (f" from {CONFIG_ENV[kind]}" if env_config(kind) is not None else "")
    return (f"CUDA (kernels/gdn_main.cu; {shape}; REPLAYSSM_MAIN_IMPL=triton for Triton's; "
            f"nvcc {find_nvcc() or 'none, cubins'})")


def _shape_name(kind, cfg) -> str:
    """A shape's name for the server's log: the environment's where it names this one (several names share a tuple:
    the rc_lean 2 shapes with and without a read copy), else the first of CUDA_CONFIGS."""
    env = os.environ.get(CONFIG_ENV.get(kind, ""), "").strip()
    if env in CUDA_CONFIGS and full_config(CUDA_CONFIGS[env]) == full_config(cfg):
        return env
    return next((n for n, c in CUDA_CONFIGS.items() if full_config(c) == full_config(cfg)), str(cfg))


def pre_preference_note(kind, state, ring, K, BC) -> str:
    """Which pre launch a decode step of this layer takes by the environment's preference (REPLAYSSM_PRE_IMPL), for
    the server's log: "CUDA (...)" or "Triton (why)"."""
    impl = env_pre_impl()
    cfg = launch_default_config(state, ring, kind)
    # (a shape without a pre launch first: decode_v3 takes its own SELF_PRE level over REPLAYSSM_SELF_PRE's)
    if (full_config(cfg)[10] and prefers_cuda() and _obtainable()
            and unavailable_reason(kind, state, ring, None, K, ring.layout.V, *cfg) is None):
        return (f"none (the CUDA main launch's shape {_shape_name(kind, cfg)} makes the coefficients itself: "
                "gdn_main.cu's SELF_PRE 2)")
    if (env_self_pre() == "cuda" and prefers_cuda() and _obtainable()
            and unavailable_reason(kind, state, ring, None, K, ring.layout.V, *cfg[:10], self_pre=True) is None):
        return "none (REPLAYSSM_SELF_PRE=cuda: the CUDA main launch makes the coefficients itself)"
    if (tensor_core_shape(cfg) and prefers_cuda() and _obtainable() and pre_unavailable_reason(kind, state, ring, K, BC)
            is None and unavailable_reason(kind, state, ring, None, K, ring.layout.V, *cfg) is None):
        # (decode_v3.launch takes it whatever the preference: only it writes that main launch's operand)
        return (f"CUDA (kernels/gdn_main.cu replay_{kind}_pre: the main launch's shape {_shape_name(kind, cfg)} reads "
                "its tensor-core operand)")
    if impl == "triton":
        return "Triton (REPLAYSSM_PRE_IMPL=triton)"
    why = pre_unavailable_reason(kind, state, ring, K, BC)
    if why:
        return f"Triton (the CUDA one: {why})"
    if impl == "auto" and kind not in PRE_AUTO_KINDS:
        return "Triton (its CUDA one is opt-in: REPLAYSSM_PRE_IMPL=cuda)"
    if impl == "auto" and (not prefers_cuda() or unavailable_reason(kind, state, ring, None, K, ring.layout.V,
                                                                    *launch_default_config(state, ring, kind))):
        return "Triton (beside Triton's main launch; REPLAYSSM_PRE_IMPL=cuda takes the CUDA one there too)"
    if not _obtainable():
        return "Triton (the CUDA one needs nvcc or cached cubins: REPLAYSSM_NVCC, REPLAYSSM_CUBIN_DIR)"
    return f"CUDA (kernels/gdn_main.cu replay_{kind}_pre; REPLAYSSM_PRE_IMPL=triton for Triton's)"


_OBTAINABLE: dict = {}


def _obtainable() -> bool:
    """nvcc or a cache holding cubins exists (looked up once per process and setting: launches call usable()), and no
    build has failed in this process (load_failure)."""
    key = (os.environ.get("REPLAYSSM_NVCC"), os.environ.get("REPLAYSSM_CUBIN_DIR"))
    if key not in _OBTAINABLE:
        _OBTAINABLE[key] = find_nvcc() is not None or any(cache_dir().glob("gdn_main-*.cubin"))
    return _OBTAINABLE[key]


def launch_defines(*, mixed_qkv, a2, b2, A_log, dt_bias, out, state, ring, h_rows, slot_idx, forced, ring_idx, H, HV,
                   V, cap, BC, pdl, config=None, diag_stream=False, kind="gdn", lower_bound=None,
                   self_pre=False, trigger_post=False, lead_pdl=False, pre_early=None, pre_pf=0,
                   vec_u=None, tile_early=None, fold_out=None, flush_first=False, ff_from=None) -> dict:
    """The compile-time parameters (defines) of the build a launch with these arguments runs (launch's arguments).
    pre_early (None: PRE_EARLY_DEFAULT) applies where the build has a pre launch (not under SELF_PRE); vec_u (None:
    vec_u_default) where vec_u_defines says; tile_early (None: TILE_EARLY_DEFAULT) where tile_early_defines says;
    fold_out (None: fold_out_default) where fold_out_defines says."""
    rpw, nwarps, load_reg, min_blocks, late_coef, gt_pre, xl, nch, rc_lean, mma_fold, sp = full_config(
        config or launch_default_config(state, ring, kind))
    return defines(H=H, HV=HV, V=V, cap=cap, BC=BC, rpw=rpw, nwarps=nwarps, load_reg=load_reg, min_blocks=min_blocks,
                   late_coef=late_coef, gt_pre=gt_pre, xl=xl, nch=nch, rc_lean=rc_lean, mma_fold=mma_fold,
                   diag_stream=diag_stream, has_h_rows=h_rows is not None,
                   has_forced=forced is not None, has_ring_idx=ring_idx is not None, pdl=pdl,
                   x_dtype=mixed_qkv.dtype, a_dtype=a2.dtype, b_dtype=b2.dtype, alog_dtype=A_log.dtype,
                   dtb_dtype=dt_bias.dtype, out_dtype=out.dtype, u_dtype=ring.u.dtype, k_dtype=ring.k.dtype,
                   slot_dtype=slot_idx.dtype, forced_dtype=(forced if forced is not None else slot_idx).dtype,
                   ridx_dtype=(ring_idx if ring_idx is not None else slot_idx).dtype, state_dtype=state.dtype,
                   kind=kind, lower_bound=lower_bound is not None,
                   rc_dtype=rc_dtype_of(ring), self_pre=self_pre or sp, trigger_post=trigger_post, lead_pdl=lead_pdl,
                   pre_early=pre_early, pre_pf=pre_pf, rec_split=ring.split_records, vec_u=vec_u,
                   tile_early=tile_early, fold_out=fold_out, flush_first=flush_first, ff_from=ff_from)


_FAILED: dict = {}  # defines key -> why its kernel could not be built or loaded (warned once)


def load_failure(defs: dict, device: torch.device) -> str | None:
    """Builds (or finds in the cache) and loads the kernel of ``defs`` on ``device``: None where that worked, else
    why not (an nvcc error, a cubin this driver cannot load), logged once as a warning. A launch that only prefers
    the CUDA main launch (no main_impl asked) then runs Triton's instead of failing the server's step."""
    key = (tuple(sorted(defs.items())), device.index)
    if key not in _FAILED:
        try:
            function(defs, device)
            _FAILED[key] = None
        except (RuntimeError, OSError) as e:
            why = " ".join(str(e).split())[-400:] or type(e).__name__  # (nvcc's stderr tail, on one line)
            _FAILED[key] = why
            # one build failing says the toolchain or the driver is not fit: every later preference (usable(), so the
            # small-batch policy too) takes Triton's main launch without trying again
            _OBTAINABLE[(os.environ.get("REPLAYSSM_NVCC"), os.environ.get("REPLAYSSM_CUBIN_DIR"))] = False
            logging.getLogger(__name__).warning(
                "ReplaySSM: the CUDA decode kernels (kernels/gdn_main.cu) could not be built or loaded (%s); this "
                "launch runs Triton's kernels instead. REPLAYSSM_MAIN_IMPL=triton (and REPLAYSSM_PRE_IMPL=triton) "
                "choose Triton's without trying; REPLAYSSM_NVCC names the nvcc to build with.", why)
    return _FAILED[key]


PRE_MAX_CAP = 16  # the CUDA pre launch holds a row's 2 x 16 record dots in one warp's lanes


def pre_unavailable_reason(kind, state, ring, K, BC, pre_rows=1) -> str | None:
    """Why the CUDA pre launch (gdn_main.cu's replay_gdn_pre for GDN, replay_kda_pre for KDA with predecayed key
    records; decode_v3.launch(pre_impl="cuda")) cannot run this launch (None: it can)."""
    if kind == "kda" and not ring.predecayed:
        return "it is written for KDA's predecayed key records (KDA_KEYS / ring.kda_keys 'predecayed')"
    if kind not in ("gdn", "kda"):
        return f"it is written for GDN and KDA, not {kind!r}"
    if K != 128:
        return "it needs K = 128 (a warp's 32 lanes x 4 columns)"
    if ring.layout.cap > PRE_MAX_CAP or BC > PRE_MAX_CAP:
        return f"it needs a ring capacity of at most {PRE_MAX_CAP} (one warp holds a row's 2 x 16 record dots)"
    if pre_rows != 1:
        return "it runs one row per block (pre_rows 1)"
    dev = state.device
    if emulated(dev):
        return None  # (the CPU emulation, kernels/cuda_emu.py: for tests)
    if dev.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return "it needs a CUDA GPU"
    if torch.cuda.get_device_capability(dev) < (9, 0):
        return "it needs sm_90 or newer"
    return None


def pre_name(defs: dict) -> str:
    """The pre launch's kernel in the build ``defs``: replay_kda_pre (KDA) or replay_gdn_pre."""
    return "replay_kda_pre" if defs["IS_KDA"] else "replay_gdn_pre"


FRAG_WORDS = 16 * 8 * 2  # per (row, key head): 16 lanes x 8 K-steps x 2 words (gdn_main.cu's RC_MMA, ST_MMA)


def tensor_core_shape(config) -> bool:
    """A block shape that takes its tile's dots on the tensor cores (rc_lean 2), and so the CUDA pre launch's operand:
    tensor_core_dots of every build it makes."""
    return full_config(config)[8] == 2


def tensor_core_dots(defs: dict) -> bool:
    """The build takes its tile's dots on the tensor cores (rc_lean 2: gdn_main.cu's RC_MMA with a read copy, ST_MMA
    without), with the CUDA pre launch's operand (frag_scratch)."""
    return bool(defs.get("RC_MMA") or defs.get("ST_MMA"))


def frag_scratch(B: int, H: int, device) -> torch.Tensor:
    """The pre launch's tensor-core operand for rc_lean 2 (RC_MMA, ST_MMA), [B, H, 16 lanes, 8 K-steps, 2] 32-bit
    words: for each (row, key head) the f16 (fp8 copy) or bf16 (bf16 tiles) pairs of q / |q| and k / |k| split in high
    and low parts (1 KiB)."""
    return torch.empty(B, H, 16, 8, 2, dtype=torch.int32, device=device)


def check_frag(frag, B: int, H: int) -> None:
    """Refuses an operand buffer that is not frag_scratch(B, H)'s kind (or larger), with the fix."""
    if frag is None or frag.dtype != torch.int32 or not frag.is_contiguous() or frag.numel() < B * H * FRAG_WORDS:
        raise ValueError("rc_lean 2 (RC_MMA, ST_MMA): the pre and main launches share the tensor-core operand (frag: "
                         "cuda_main.frag_scratch(B, H), int32, contiguous)")


def pre_launch(*, defs, mixed_qkv, a2, A_log, dt_bias, ring, h_rows, slot_idx, forced, ring_idx, coef, scal, scale,
               lower_bound, L, B, gts=None, min_g=0.0, frag=None, lead=False, state=None, order=None) -> None:
    """One pre launch on the current stream, from the build ``defs`` (launch_defines of the main launch it feeds: the
    same module), writing what decode_v3's Triton pre launch writes: coef, scal, the token's record; for KDA also G_t
    per column into gts where given (the main launch's gt_pre shapes) and the overflow flags (ring.ovf, below min_g).
    Grid (key heads, B): the build's H for GDN, HV for KDA (one key head per value head). A build with rc_lean 2
    (RC_MMA, ST_MMA) also writes the main launch's tensor-core operand into frag (frag_scratch(B, key heads)).
    lead: launched as a programmatic dependent of the stream's previous kernel (a LEAD_PDL build waits for it).
    state: the checkpoint pool, whose first rows' tiles (or their read copy's) a PRE_PF build prefetches into L2.
    order: where a FLUSH_FIRST build writes the main launch's row order (check_order); its grid then has one more row
    of blocks, the first, whose first block writes it."""
    if lead and not defs.get("LEAD_PDL"):
        raise ValueError("a pre launch made a programmatic dependent must wait first: a LEAD_PDL build")
    if ring.k.stride(-1) != 1 or not coef.is_contiguous() or not scal.is_contiguous():
        raise ValueError("the CUDA pre launch needs contiguous records and scratch")
    check_split(defs, ring)
    if defs.get("PRE_PF") and (state is None or not state.is_contiguous()):
        raise ValueError("PRE_PF's pre launch prefetches the checkpoint's tiles: pass the contiguous state")
    if defs.get("PRE_EARLY") and (ring.k.data_ptr() % 8 or ring.k.stride(-2) % 4):
        # (a bf16 lane's four columns are one 8-byte load there: a record row's start must keep that alignment)
        raise ValueError("PRE_EARLY's pre launch needs the key records 8-byte aligned with rows of a multiple of 4 "
                         "elements (REPLAYSSM_PRE_EARLY=0 for this ring)")
    name = pre_name(defs)
    ptr = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else 0)  # noqa: E731
    lb = ctypes.c_float(float(lower_bound) if lower_bound is not None else 0.0)
    head = [ptr(mixed_qkv), ptr(a2), ptr(A_log), ptr(dt_bias), ptr(ring.k), ptr(ring.g), ptr(ring.h), ptr(h_rows),
            ptr(slot_idx), ptr(forced), ptr(ring_idx), ptr(coef), ptr(scal)]
    if defs["IS_KDA"]:
        if gts is not None and not gts.is_contiguous():
            raise ValueError("the CUDA pre launch needs a contiguous gts")
        args = head + [ptr(gts), ptr(ring.ovf), ctypes.c_float(scale), lb, ctypes.c_float(min_g)]
    else:
        args = head + [ctypes.c_float(scale), lb]
    mma = tensor_core_dots(defs)
    if mma:
        check_frag(frag, B, defs["HV_"] if defs["IS_KDA"] else defs["H_"])
    args += [ctypes.c_int(int(L)), ctypes.c_longlong(mixed_qkv.stride(0)), ctypes.c_longlong(a2.stride(0)),
             ptr(ring.rc_valid if ring.rc is not None else None),
             ptr(frag if mma else None),  # (rc_lean 2's operand, null in the other builds)
             ptr(state), ptr(ring.rc if ring.rc is not None else None),  # (PRE_PF's tiles)
             ptr(ring.k_lo),  # (REC_SPLIT's low plane of the keys)
             ptr(order), ctypes.c_int(int(B))]  # (FLUSH_FIRST's row order and the batch's rows)
    check_order(defs, order, B)
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in args])
    heads = defs["HV_"] if defs["IS_KDA"] else defs["H_"]
    ff = int(bool(defs.get("FLUSH_FIRST")))  # (the grid's first row orders the main launch's rows)
    if emulated(mixed_qkv.device):
        from . import cuda_emu  # (the CPU emulation, for tests: kernels/cuda_emu.py)

        cuda_emu.run_pre(defs, (heads, B + ff), params)
        return
    f = function(defs, mixed_qkv.device, name)
    attrs, n_attrs = _pdl_attrs(lead)
    cfg = _LaunchConfig(heads, B + ff, 1, 32, 1, 1, 0,
                        ctypes.c_void_p(torch.cuda.current_stream(mixed_qkv.device).cuda_stream), attrs, n_attrs)
    _check(_cuda().cuLaunchKernelEx(ctypes.byref(cfg), f, params, None), f"cuLaunchKernelEx({name})")


def order_scratch(B: int, device) -> torch.Tensor:
    """FLUSH_FIRST's row order: the pre launch writes it, the main launch reads it (int32, one per batch row)."""
    return torch.empty(max(1, B), dtype=torch.int32, device=device)


def check_order(defs: dict, order, B: int) -> None:
    """A FLUSH_FIRST build's launches take the row order (order_scratch of the batch); the others take none."""
    if not defs.get("FLUSH_FIRST"):
        return
    if order is None or order.dtype != torch.int32 or not order.is_contiguous() or order.numel() < B:
        raise ValueError("a FLUSH_FIRST build's pre and main launches share the row order: an int32 tensor of at "
                         "least B elements (cuda_main.order_scratch)")


def check_split(defs: dict, ring) -> None:
    """A build reads the ring's records as they are kept: REC_SPLIT's two planes (bf16 high, int16 low, shaped
    alike and contiguous) exactly where the ring splits them."""
    if bool(defs.get("REC_SPLIT")) != ring.split_records:
        raise ValueError(f"the build {'splits' if defs.get('REC_SPLIT') else 'does not split'} records and the ring "
                         f"{'does' if ring.split_records else 'does not'}: make the defines from this ring "
                         f"(launch_defines)")
    if ring.split_records:
        for hi, lo in ((ring.u, ring.u_lo), (ring.k, ring.k_lo)):
            if (hi.dtype != torch.bfloat16 or lo.dtype != torch.int16 or hi.shape != lo.shape
                    or not hi.is_contiguous() or not lo.is_contiguous()):
                raise ValueError("split records: u, k bf16 and u_lo, k_lo int16, shaped alike and contiguous "
                                 "(RingLayout.allocate(split_records=True))")


def _pdl_attrs(on: bool):
    """cuLaunchKernelEx's attributes: programmatic stream serialization where `on` (a programmatic dependent of the
    stream's previous kernel), none otherwise."""
    attrs = (_LaunchAttr * 1)()
    if not on:
        return attrs, 0
    attrs[0].id = _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION
    one = ctypes.c_int(1)  # value.programmaticStreamSerializationAllowed
    ctypes.memmove(ctypes.addressof(attrs[0]) + _LaunchAttr.value.offset, ctypes.byref(one), 4)
    return attrs, 1


def check_vec_u(defs: dict, ring, coef=None) -> None:
    """A VEC_U build reads a lane's RPW / 4 value records at one position as one vector: the ring's value records must
    start on that vector's alignment, with each position's row of V a multiple of it and the last dimension dense;
    likewise the fp8 copy's row scales, and the pre launch's coefficients (coef) in pairs."""
    if not defs.get("VEC_U"):
        return
    if coef is not None and coef.data_ptr() % 8:
        raise ValueError("VEC_U's main launch reads the pre launch's coefficients in pairs: coef must be 8-byte aligned "
                         "(REPLAYSSM_VEC_U=0 for this scratch)")
    run = defs["RPW"] // 4
    vec_bytes = run * ring.u.element_size()
    if ring.u.stride(-1) != 1 or ring.u.stride(-2) % run or ring.u.data_ptr() % vec_bytes:
        raise ValueError(f"VEC_U's main launch reads {run} value records as one {vec_bytes}-byte load: the ring's u "
                         f"must be {vec_bytes}-byte aligned with dense rows of a multiple of {run} elements "
                         "(REPLAYSSM_VEC_U=0 for this ring)")
    if ring.rc_scale is not None and (not ring.rc_scale.is_contiguous() or ring.rc_scale.data_ptr() % (4 * run)):
        raise ValueError(f"VEC_U's main launch reads {run} fp8 row scales as one load: the ring's rc_scale must be "
                         f"contiguous and {4 * run}-byte aligned (REPLAYSSM_VEC_U=0 for this ring)")


def launch(*, mixed_qkv, a2, b2, A_log, dt_bias, out, state, ring, h_rows, slot_idx, forced, ring_idx, coef, scal,
           scale, L, H, HV, V, cap, BC, pdl, config=None, diag_stream=False, kind="gdn", lower_bound=None, gts=None,
           defs=None, frag=None, order=None):
    """One main launch on the current stream (arguments as decode_v3.launch passes its Triton main launch; kind "kda"
    reads the ring's overflow flags, ring.ovf, which its pre launch raised, and with gt_pre the pre launch's G_t per
    column, gts [B, HV, K]).
    config: (rows per warp, warps, load_reg, min_blocks[, late_coef[, gt_pre[, xl[, nch[, rc_lean[, mma_fold[,
    self_pre]]]]]]])
    (CONFIG_FIELDS; None: launch_default_config(state, ring, kind)); diag_stream: the benchmark's diagnostic; defs:
    launch_defines of these arguments where the caller has them already (decode_v3.launch makes them once per step);
    frag: the pre launch's tensor-core operand (frag_scratch) for rc_lean 2 (RC_MMA, ST_MMA); order: the row order
    the CUDA pre launch of a FLUSH_FIRST build wrote this step (order_scratch), the last parameter."""
    rpw, nwarps, load_reg, min_blocks, late_coef, gt_pre, xl, nch, rc_lean, *_ = full_config(
        config or launch_default_config(state, ring, kind))
    if gt_pre and (gts is None or gts.dtype != torch.float32 or not gts.is_contiguous()):
        raise ValueError("gt_pre: the CUDA main launch reads the pre launch's G_t per column (gts, fp32 [B, HV, K])")
    B = mixed_qkv.shape[0]
    if rc_lean == 2:
        check_frag(frag, B, H)
    if out.stride(-1) != 1 or not out.is_contiguous() or mixed_qkv.stride(-1) != 1:
        raise ValueError("the CUDA main launch needs a contiguous output and unit-stride inputs")
    if defs is None:
        defs = launch_defines(mixed_qkv=mixed_qkv, a2=a2, b2=b2, A_log=A_log, dt_bias=dt_bias, out=out, state=state,
                              ring=ring, h_rows=h_rows, slot_idx=slot_idx, forced=forced, ring_idx=ring_idx, H=H,
                              HV=HV, V=V, cap=cap, BC=BC, pdl=pdl, config=config, diag_stream=diag_stream, kind=kind,
                              lower_bound=lower_bound)
    if kind == "kda" and (ring.ovf is None or ring.ovf.dtype != torch.int32):
        raise ValueError("the CUDA main launch for KDA reads the ring's int32 overflow flags (predecayed keys)")
    check_split(defs, ring)
    check_vec_u(defs, ring, coef)
    check_order(defs, order, B)
    ptr = lambda t: ctypes.c_void_p(t.data_ptr() if t is not None else 0)  # noqa: E731
    args = [ptr(mixed_qkv), ptr(a2), ptr(b2), ptr(A_log), ptr(dt_bias), ptr(out), ptr(state), ptr(ring.u),
            ptr(ring.k), ptr(ring.g), ptr(ring.h), ptr(h_rows), ptr(slot_idx), ptr(forced), ptr(ring_idx),
            ptr(coef), ptr(scal), ptr(ring.ovf if kind == "kda" else None),
            ptr(gts if gt_pre else None),
            ctypes.c_float(scale),
            ctypes.c_float(float(lower_bound) if lower_bound is not None else 0.0), ctypes.c_int(int(L)),
            ctypes.c_longlong(mixed_qkv.stride(0)), ctypes.c_longlong(a2.stride(0)), ctypes.c_longlong(b2.stride(0)),
            ctypes.c_longlong(state.stride(0)), ptr(ring.rc), ptr(ring.rc_scale), ptr(ring.rc_valid),
            ptr(frag if rc_lean == 2 else None), ptr(ring.u_lo), ptr(ring.k_lo),
            ptr(order if defs.get("FLUSH_FIRST") else None)]
    params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(x), ctypes.c_void_p) for x in args])
    if emulated(state.device):
        from . import cuda_emu  # (the CPU emulation, for tests: kernels/cuda_emu.py)

        cuda_emu.run_main(defs, (V // (rpw * nwarps * nch), HV, B), 32 * nwarps, params)
        return
    f = function(defs, state.device)
    # a programmatic dependent: of the pre launch (pdl), or, as the step's first launch (a LEAD_PDL build without a
    # pre launch), of the stream's previous kernel
    attrs, n_attrs = _pdl_attrs(pdl or bool(defs.get("LEAD_PDL") and defs.get("SELF_PRE")))
    cfg = _LaunchConfig(V // (rpw * nwarps * nch), HV, B, 32 * nwarps, 1, 1, smem_bytes(defs),
                        ctypes.c_void_p(torch.cuda.current_stream(state.device).cuda_stream), attrs, n_attrs)
    _check(_cuda().cuLaunchKernelEx(ctypes.byref(cfg), f, params, None), "cuLaunchKernelEx")

#!/usr/bin/env python3
"""End-to-end GPU harness: SGLang servers per arm, correctness, decode throughput, prefix caching, SSM share.

Run on the GPU machine through scripts/gpu_e2e.sh (it unpacks .bundle/, generates the tiny models, and
calls this). One call:

    python scripts/gpu_e2e.py --model gdn=/tmp/models/gdn --arms conventional,upstream_replayssm \
        --tasks correctness,spec,throughput,prefix,ssm_share --out $OUT
    (add `profile` to --tasks for the profiled state-update share at B = 256, e.g. --tasks throughput,profile)

Arms (extra server flags on top of the common launch line; SGLang's defaults otherwise: radix cache on,
`auto` mamba cache strategy, overlap scheduler on, CUDA graphs on):
  conventional          -- nothing extra
  conventional_nobuf    -- --mamba-radix-cache-strategy no_buffer --disable-overlap-schedule
                           (the settings upstream's flag forces; isolates the kernel from the cache settings)
  upstream_replayssm    -- --enable-linear-replayssm --mamba-radix-cache-strategy no_buffer
                           --disable-overlap-schedule (upstream 0.5.17 refuses its flag under the defaults)
  ours                  -- --enable-linear-replayssm with the defaults, on the patched copy of SGLang
                           (gpu_e2e.sh applies the series to /tmp/ours = E2E_OURS_PATH and sets
                           REPLAYSSM_SERIES_APPLIED=1; the other arms keep pristine SGLang); skipped with a
                           message when the series is not applied.
The first arm is the reference for correctness and the denominator of the throughput ratios.

Tasks:
  correctness -- fixed prompt set (seeded token ids), greedy, 32 new tokens, top-5 logprobs; per arm vs the
                 reference: token agreement, common-prefix length, max |logprob diff| of the chosen tokens
                 over the common prefix (the first 32 tokens); plus an output-diversity check (random
                 weights must not give degenerate text). Each arm's JSON records how it ran
                 (`correctness_setup`: the 16 prompts as one batch, the decode window) and its environment.
  spec        -- the same prompts with NEXTN speculative decoding (GDN model with its MTP layer): the greedy
                 tokens must equal the same arm without speculation.
  throughput  -- steady-state decode tokens/s at B = 1, 64, 256: input 32 tokens, ignore_eos; a warm-up
                 call, then per repeat two calls with 64 and 256 new tokens; decode rate =
                 B * (256 - 64) / (t256 - t64) (prefill and fixed costs cancel); median over repeats; also
                 the server's own logged "gen throughput" for batches at that size.
  prefix      -- generated-shared-prefix: 8 groups x 32 prompts, 2048-token system prompt per group,
                 64-token questions, 64 new tokens, all sent at once (streaming); hit rate =
                 sum(cached_tokens) / sum(prompt tokens) from meta_info (--enable-cache-report); mean TTFT.
                 --prefix-repeats N (default 2) runs it N times on the same server with /flush_cache in
                 between. The first run's numbers stay at the top of the record (comparable with older runs);
                 the last run is also kept as `warm`: the first run of a server includes the JIT compilation
                 of its prefill kernels (with --fast-start and no Triton cache, the first server of a call
                 measured 4.77 s of mean TTFT cold against 1.44 s warm, KDA, 2026-11-30), so issue 9's
                 TTFT comparison between arms is the warm one.
  prefill     -- prefill cost without queueing or streaming (about 5 s per arm): uncached random prompts of
                 2113 and 4000 tokens sent one at a time with max_new_tokens 1 (median latency of 5 each,
                 after one warm-up per length), a 16-token prompt the same way (the fixed per-request cost),
                 and 8 uncached 2113-token prompts in one call (three 8192-token chunked-prefill batches;
                 median wall of 3, plus the server's logged input throughput of those batches).
  profile     -- the state update's share of a decode step from a profile of the real server (runs last on
                 each server): B = 256 requests (--profile-batch) of 32 tokens decode with ignore_eos; once the
                 server logs a decode batch of 256 running requests, POST /start_profile with SGLang's ProfileReq
                 {activities: [GPU], num_steps: --profile-steps (64), no stacks/shapes}; the scheduler stops the
                 torch profiler by itself and writes $OUT/profiles/<server>/<id>-TP-<rank>.trace.json.gz.
                 scripts/trace_share.py reads it: steps = CUDA-graph replay periods (cudaGraphLaunch correlation
                 ids), state-update kernels by name (trace_share.STATE_UPDATE_SUBSTRINGS), share = their time /
                 GPU busy time over whole steps, the top 10 kernels; share None with a reason when the trace holds
                 no state-update kernel events (e.g. graph kernels not recorded individually). CUDA graphs stay on.
  ssm_share   -- after the servers stop: the conventional packed GDN/KDA decode kernel alone at B=256
                 (fp32 state, slots permuted over a pool larger than L2), times the model's linear-layer
                 count, divided by the conventional arm's measured decode step at B=256.
An arm may carry a tag, `ARM:TAG` (e.g. `--arms conventional,ours,conventional:2`): the same flags on a
fresh server, recorded under its own key, so an arm-order effect shows up as a difference between the two.
Writes $OUT/e2e.json, $OUT/e2e.png, $OUT/e2e.log (servers' log tails and the run log).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import requests

ARMS = {
    "conventional": [],
    "conventional_nobuf": ["--mamba-radix-cache-strategy", "no_buffer", "--disable-overlap-schedule"],
    "upstream_replayssm": ["--enable-linear-replayssm", "--mamba-radix-cache-strategy", "no_buffer",
                           "--disable-overlap-schedule"],
    "ours": ["--enable-linear-replayssm"],
    # the same server with the buffered window forced at every batch size (the policy ran window 1 at the
    # correctness task's batch of 16 until session 48; with the CUDA main launch it now runs the buffered window
    # there for the fp32 states, window 1 with Triton's launch): checks the buffered decode's outputs whichever
    # main launch runs, not only its speed
    "ours_w16": ["--enable-linear-replayssm"],
    # a control for the correctness comparison: window 1 (exactly the conventional update) with every GDN/KDA
    # decode output multiplied by (1 +- 1e-6), a perturbation of fp32-rounding size: how far does this model's
    # greedy text move under numerics alone?
    "ours_perturbed": ["--enable-linear-replayssm"],
    # issue 7: the two-precision state (a low-precision read copy; the recurrence stays fp32)
    "ours_rc_bf16": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "bf16"],
    "ours_rc_fp8": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    # the same fp8 copy read by the CUDA main launch in the XL layout (session 36; opt-in until session 37, the
    # default since: ours_rc_fp8 takes it too), and by Triton's main launch (the server's before session 37)
    "ours_rc_fp8_cu": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    "ours_rc_fp8_tr": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    # GDN's fp8 copy in the rc_lean shape named (the default since session 41's A/B, e2e-20261204-2132) and in the
    # shape without a copy's (x16w4c1_m5, the default before), for A/B calls
    "ours_rc_fp8_lean": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    "ours_rc_fp8_m5": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    # GDN's fp8 copy with its dots on the tensor cores (RC_MMA, session 41; opt-in until timed and served)
    "ours_rc_fp8_mma": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    # GDN without a pre launch: the CUDA main launch makes the coefficients itself (REPLAYSSM_SELF_PRE=cuda, session
    # 37; KDA keeps its pre launch); with the fp8 copy too
    "ours_cusp": ["--enable-linear-replayssm"],
    "ours_rc_fp8_cusp": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    # KDA's ring with raw key records (k_j and G_j per record); ours_predkeys: predecayed ones (k_j e^{-G_j}; KDA's
    # default without speculative decoding, as `ours`)
    "ours_rawkeys": ["--enable-linear-replayssm"],
    "ours_predkeys": ["--enable-linear-replayssm"],
    # decode v3's main launch in CUDA (kernels/gdn_main.cu, REPLAYSSM_MAIN_IMPL=cuda; GDN, and KDA with predecayed keys
    # since session 30; Triton's elsewhere), window 16 forced as ours_w16
    "ours_w16_cu": ["--enable-linear-replayssm"],
    # ours with Triton's main launch (REPLAYSSM_MAIN_IMPL=triton): the default before session 31, which made the CUDA
    # main launch the default wherever it can run (`ours` then takes it)
    "ours_triton": ["--enable-linear-replayssm"],
    # ours with GDN's pre launch in CUDA (REPLAYSSM_PRE_IMPL=cuda; KDA keeps Triton's): session 32's measure before it
    # became the default beside the CUDA main launch (`ours` takes it since); ours_tritonpre keeps Triton's pre launch
    "ours_cudapre": ["--enable-linear-replayssm"],
    "ours_tritonpre": ["--enable-linear-replayssm"],
    # GDN: decode v3's self_pre (no pre launch; REPLAYSSM_SELF_PRE=1, where it can run), window 16 forced as ours_w16
    "ours_w16_sp": ["--enable-linear-replayssm"],
    # KDA's main launch pinned to a shape, window 16 forced as ours_w16: the XL layout (x16w4c1_m4_gp, KDA's fp32
    # default since session 36: served 16/16 at 0.030, B = 256 1.296x; session 35's x16w4c1_m5_gp had moved the
    # logprobs by 0.526, loads ahead of the PDL wait, fixed since), and the layout before it (g8w4_gp)
    "ours_w16_kxl": ["--enable-linear-replayssm"],
    "ours_w16_kg8": ["--enable-linear-replayssm"],
    # a bf16 recurrent state (SGLang's --mamba-ssm-dtype): conventional, and ours with the CUDA main launch
    # (REPLAYSSM_MAIN_IMPL=cuda, which reads a bf16 checkpoint; window 16 forced so that the correctness task's batch
    # of 16 runs the buffered decode too: the policy's own window there is 1, and 16 above B = 32)
    "conventional_bf16": ["--mamba-ssm-dtype", "bfloat16"],
    "ours_bf16_cu": ["--enable-linear-replayssm", "--mamba-ssm-dtype", "bfloat16"],
    # the same at the policy's windows (1 up to B = 32, 16 above where the CUDA main launch runs; 64 until session
    # 39, when e2e-20261204-1649 / -1657 ran it)
    "ours_bf16_cu_policy": ["--enable-linear-replayssm", "--mamba-ssm-dtype", "bfloat16"],
    # a bf16 state with its tile's dots on the tensor cores (gdn_main.cu's ST_MMA, session 42; GDN and KDA, window 16)
    "ours_bf16_mma": ["--enable-linear-replayssm", "--mamba-ssm-dtype", "bfloat16"],
    # and with the fold on the tensor cores too (gdn_main.cu's MMA_FOLD, session 43; GDN and KDA, window 16); the fp32
    # state's and the fp8 copy's defaults with it
    "ours_bf16_mf": ["--enable-linear-replayssm", "--mamba-ssm-dtype", "bfloat16"],
    "ours_mf": ["--enable-linear-replayssm"],
    # GDN's fp32 default before session 47 (x16w4c1_m5 with its CUDA pre launch; the default since has none, SELF_PRE 2)
    "ours_m5": ["--enable-linear-replayssm"],
    "ours_rc_fp8_mf": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    # the bf16 state's default shape before session 44 (CUDA-core tile dots, x16w4c1_m6 / _m6_gp) with MMA_FOLD, and
    # without it (the defaults since are ST_MMA's m7 with MMA_FOLD for GDN, x16w4c1_m6_gp_mf for KDA; window 16)
    "ours_bf16_mf6": ["--enable-linear-replayssm", "--mamba-ssm-dtype", "bfloat16"],
    "ours_bf16_m6": ["--enable-linear-replayssm", "--mamba-ssm-dtype", "bfloat16"],
    # ST_MMA's m8 with MMA_FOLD for both (KDA's fastest bf16 shape on the H200 in run kernels-20261206-0258:
    # x16w4c1_m8_gp_mma_mf 109.9 us against its default x16w4c1_m6_gp_mf's 118.4 at B = 256; on the H100 5 us behind)
    "ours_bf16_mf8": ["--enable-linear-replayssm", "--mamba-ssm-dtype", "bfloat16"],
    # KDA's fp8 copy in the rc_lean shape, and with its dots on the tensor cores (session 42; kernel benchmark at
    # B = 256, kernels-20261205-0141: 129.5 and 125.3 us against the default x16w4c1_m4_gp's 151.5)
    "ours_rc_fp8_klean": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    "ours_rc_fp8_kmma": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    # (the served A/B e2e-20261205-0158 made x16w4c1_m7_gp_lean_mma KDA's fp8-copy default; this arm keeps the shape
    # before, x16w4c1_m4_gp)
    "ours_rc_fp8_km4": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    # the fp8 copy with PDL at every batch (its tuned launch takes PDL from 33 rows, session 48: the correctness
    # task's 16 rows would not), window 16 forced
    "ours_rc_fp8_pdl": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    # split records (session 51, REPLAYSSM_SPLIT_RECORDS=1): the fp32 records' dots read a bf16 high plane, folds join
    # the low plane; beside the fp8 copy (window 16 and PDL forced, as ours_rc_fp8_pdl) and without a copy
    "ours_rc_fp8_split": ["--enable-linear-replayssm", "--linear-replayssm-read-dtype", "fp8_e4m3"],
    "ours_split": ["--enable-linear-replayssm"],
}
# The read-copy arms force window 16 too: at the policy's window 1 (fp32 states with a copy: B <= 8 with the CUDA
# main launch since session 48, B <= 32 GDN / 64 KDA with Triton's) no copy is read,
# so the correctness task would compare the conventional update, not the copy (their B = 1 / 64 throughput is then
# the buffered path's, not the policy's).
ARM_ENV = {"ours_w16": {"REPLAYSSM_DECODE_WINDOW": "16"},
           "ours_rc_bf16": {"REPLAYSSM_DECODE_WINDOW": "16"},
           "ours_rc_fp8": {"REPLAYSSM_DECODE_WINDOW": "16"},
           "ours_rc_fp8_cu": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_MAIN_IMPL": "cuda"},
           "ours_rc_fp8_tr": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_MAIN_IMPL": "triton"},
           "ours_rc_fp8_lean": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m7_lean"},
           "ours_rc_fp8_m5": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m5"},
           "ours_rc_fp8_mma": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m8_lean_mma"},
           "ours_cusp": {"REPLAYSSM_SELF_PRE": "cuda"},
           "ours_rc_fp8_cusp": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_SELF_PRE": "cuda"},
           "ours_perturbed": {"REPLAYSSM_DECODE_WINDOW": "1", "REPLAYSSM_DIAG_PERTURB": "1e-6"},
           "ours_rawkeys": {"REPLAYSSM_KDA_KEYS": "raw"},
           "ours_predkeys": {"REPLAYSSM_KDA_KEYS": "predecayed"},
           "ours_w16_cu": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_MAIN_IMPL": "cuda"},
           "ours_triton": {"REPLAYSSM_MAIN_IMPL": "triton"},
           "ours_cudapre": {"REPLAYSSM_PRE_IMPL": "cuda"},
           "ours_tritonpre": {"REPLAYSSM_PRE_IMPL": "triton"},
           "ours_w16_sp": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_SELF_PRE": "1"},
           "ours_w16_kxl": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m4_gp"},
           "ours_w16_kg8": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_CUDA_CONFIG_KDA": "g8w4_gp"},
           "ours_bf16_cu": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_MAIN_IMPL": "cuda"},
           "ours_bf16_cu_policy": {"REPLAYSSM_MAIN_IMPL": "cuda"},
           "ours_bf16_mma": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_MAIN_IMPL": "cuda",
                             "REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m8_mma",
                             "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m7_gp_mma"},
           "ours_bf16_mf": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_MAIN_IMPL": "cuda",
                            "REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m8_mma_mf",
                            "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m7_gp_mma_mf"},
           "ours_bf16_mf6": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_MAIN_IMPL": "cuda",
                             "REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m6_mf",
                             "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m6_gp_mf"},
           "ours_bf16_m6": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_MAIN_IMPL": "cuda",
                            "REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m6", "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m6_gp"},
           "ours_bf16_mf8": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_MAIN_IMPL": "cuda",
                             "REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m8_mma_mf",
                             "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m8_gp_mma_mf"},
           "ours_mf": {"REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m5_mf", "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m4_gp_mf"},
           "ours_m5": {"REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m5"},
           "ours_rc_fp8_mf": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_CUDA_CONFIG_GDN": "x16w4c1_m7_lean_mf",
                              "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m7_gp_lean_mma_mf"},
           "ours_rc_fp8_kmma": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m7_gp_lean_mma"},
           "ours_rc_fp8_klean": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m6_gp_lean"},
           "ours_rc_fp8_km4": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_CUDA_CONFIG_KDA": "x16w4c1_m4_gp"},
           "ours_rc_fp8_pdl": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_PDL": "1"},
           "ours_rc_fp8_split": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_PDL": "1", "REPLAYSSM_SPLIT_RECORDS": "1"},
           "ours_split": {"REPLAYSSM_DECODE_WINDOW": "16", "REPLAYSSM_SPLIT_RECORDS": "1"}}
NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]
# What the GPU image needs (device-facts.md): no fa3 (its kernels are stripped from the bundle), no JIT of
# flashinfer's attention/sampling, no grammar backend. The rest stays at SGLang's defaults (radix cache,
# `auto` mamba strategy, overlap scheduler, decode and prefill CUDA graphs).
COMMON = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none",
          "--mem-fraction-static", "0.6", "--max-running-requests", "256",
          # nine decode graphs instead of ~35 (startup is most of a call's device time); B=1/64/256 are exact
          "--cuda-graph-bs-decode", "1", "2", "4", "8", "16", "32", "64", "128", "256",
          # SGLang sizes the mamba pool at 0.9x the KV pool by default; with 5 state slots per request
          # (extra_buffer) that capped this model at 216 running requests (measured 2026-11-29): give the
          # recurrent states the memory so B=256 really runs 256 rows (the same for every arm)
          "--mamba-full-memory-ratio", "3.0",
          "--context-length", "4096", "--enable-cache-report", "--log-level", "info",
          "--decode-log-interval", "20"]

T0 = time.time()
LOG: list[str] = []


def log(msg: str) -> None:
    line = f"[{time.time() - T0:7.1f}s] {msg}"
    print(line, flush=True)
    LOG.append(line)


class Deadline(Exception):
    pass


def arm_base(arm: str) -> str:
    """`ours:2` -> `ours`: a tagged arm runs the flags (and environment) of its base arm on a fresh server."""
    return arm.split(":", 1)[0]


def tag_repeats(arms: list[str]) -> list[str]:
    """--arms with every repeat of a name tagged (`ours,conventional,ours` -> `ours,conventional,ours:2`), so that each
    server keeps its own results (the JSON keys them by arm: an untagged repeat overwrote the earlier server's, as
    session 34's first call lost one `ours` server to its second)."""
    out: list[str] = []
    for arm in arms:
        name, k = arm, 1
        while name in out:
            k += 1
            name = f"{arm_base(arm)}:{k}"
        out.append(name)
    return out


class Server:
    def __init__(self, name: str, model: str, extra: list[str], port: int, logdir: Path, audit: Path | None):
        self.name, self.model, self.port = name, model, port
        self.arm = arm_base(name.split("-")[1] if "-" in name else name)
        self.url = f"http://127.0.0.1:{port}"
        self.logpath = logdir / f"server-{name}.log"
        self.cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(port),
                    "--host", "127.0.0.1", *COMMON, *extra]
        self.audit = audit
        self.proc = None

    def start(self) -> None:
        env = dict(os.environ)
        env.update(ARM_ENV.get(self.arm, {}))
        if self.arm.startswith("ours") and os.environ.get("E2E_OURS_PATH"):
            # the patched copy of the sglang package shadows the pristine one for this arm only
            env["PYTHONPATH"] = os.environ["E2E_OURS_PATH"] + os.pathsep + env.get("PYTHONPATH", "")
        if self.audit is not None:
            env["REPLAYSSM_LOAD_AUDIT"] = str(self.audit)
        self.logf = open(self.logpath, "w")
        log(f"launch {self.name}: {' '.join(self.cmd[3:])}")
        self.proc = subprocess.Popen(self.cmd, stdout=self.logf, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        self.t_start = time.time()

    def wait_ready(self, timeout: float) -> bool:
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                log(f"{self.name}: server exited rc={self.proc.returncode}")
                return False
            try:
                r = requests.get(self.url + "/health_generate", timeout=5)
                if r.status_code == 200:
                    self.startup_s = time.time() - self.t_start
                    log(f"{self.name}: ready after {self.startup_s:.0f}s")
                    return True
            except requests.RequestException:
                pass
            time.sleep(2)
        log(f"{self.name}: not ready after {timeout:.0f}s")
        return False

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except Exception:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except Exception:
                    pass
        if getattr(self, "logf", None):
            self.logf.close()

    def tail(self, n: int = 40) -> str:
        try:
            lines = self.logpath.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        keep = [l for l in lines if "Warning" not in l or "rror" in l]
        return "\n".join(keep[-n:])

    def notes(self, n: int = 40) -> list[str]:
        """The server log's ReplaySSM lines (which launches its layers take, a first-use compile, fallbacks and
        warnings), first n, each cut at 400 characters: kept in the result so that a slow arm can be read back
        without the server log, which does not leave the GPU machine."""
        try:
            lines = self.logpath.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [l[:400] for l in lines if NOTE_RE.search(l)][:n]

    def generate(self, payload: dict, timeout: float = 300) -> list | dict:
        r = requests.post(self.url + "/generate", json=payload, timeout=timeout)
        r.raise_for_status()
        return r.json()


# ------------------------------------------------------------------------------------------------- prompts

def take_load_audit(srv: "Server", audit: Path, into: dict) -> None:
    """Move the load audit the server's processes wrote (scripts/gpu_hooks/sitecustomize.py) into the
    results and log, per model, the parameters the checkpoint did not write."""
    if not audit.exists():
        return
    into["load_audit"] = [json.loads(l) for l in audit.read_text().splitlines()]
    audit.unlink()
    for a in into["load_audit"]:
        log(f"{srv.name}: load audit {a['model']}: {len(a['not_loaded'])} of {a['params']} "
            f"params not loaded {[x[0] for x in a['not_loaded']][:6]}")


def prompt_set(vocab: int, n: int = 16, seed: int = 1234) -> list[list[int]]:
    rng = random.Random(seed)
    lens = [8, 16, 24, 33, 47, 64, 100, 128, 150, 200, 255, 256, 300, 511, 700, 1000][:n]
    return [[rng.randrange(10, vocab - 10) for _ in range(L)] for L in lens]


TASKS = {"correctness", "spec", "throughput", "prefill", "prefix", "ssm_share", "profile"}  # --tasks
# the correctness task's greedy tokens and top logprobs per prompt (run_prompts; correctness_setup reports them)
CORRECTNESS_TOKENS, CORRECTNESS_TOP = 32, 5


def correctness_setup(arm: str, prompts: list[list[int]], new_tokens: int = CORRECTNESS_TOKENS,
                      top: int = CORRECTNESS_TOP) -> dict:
    """What the correctness task of ``arm`` ran, for its JSON: the prompts (sent in one request, so they decode
    together as one batch), the greedy tokens and top logprobs per prompt, and the decode window: forced by the
    arm's environment (ARM_ENV), or the small-batch policy's choice for the batch (replayssm_sglang.policy: window 1
    for fp32 states at this batch), or "upstream" (pristine SGLang's own ReplaySSM), or none for the arms without
    ReplaySSM."""
    base = arm_base(arm)
    forced = ARM_ENV.get(base, {}).get("REPLAYSSM_DECODE_WINDOW")
    if forced:
        window = int(forced)
    elif "--enable-linear-replayssm" in ARMS[base]:
        window = "policy" if base.startswith("ours") else "upstream"
    else:
        window = None
    return {"prompts": len(prompts), "batch": len(prompts), "new_tokens": new_tokens, "top_logprobs": top,
            "decode_window": window}


def run_prompts(srv: Server, prompts: list[list[int]], new_tokens: int = CORRECTNESS_TOKENS,
                top: int = CORRECTNESS_TOP) -> list[dict]:
    out = srv.generate({
        "input_ids": prompts,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": new_tokens, "ignore_eos": True},
        "return_logprob": True, "top_logprobs_num": top, "logprob_start_len": -1,
    })
    res = []
    for o in out:
        mi = o["meta_info"]
        toks = [t[1] for t in mi["output_token_logprobs"]]
        lps = [t[0] for t in mi["output_token_logprobs"]]
        tops = [[(x[1], x[0]) for x in step] for step in mi.get("output_top_logprobs") or []]
        res.append({"tokens": toks, "logprobs": lps, "top": tops})
    return res


def compare(ref: list[dict], got: list[dict]) -> dict:
    agree = total = 0
    prefix_lens, max_lp, max_top = [], 0.0, 0.0
    for a, b in zip(ref, got):
        n = min(len(a["tokens"]), len(b["tokens"]))
        total += n
        agree += sum(1 for i in range(n) if a["tokens"][i] == b["tokens"][i])
        p = 0
        while p < n and a["tokens"][p] == b["tokens"][p]:
            p += 1
        prefix_lens.append(p)
        for i in range(min(p + 1, n)):  # same context up to and including the first divergent step
            if i < p:
                max_lp = max(max_lp, abs(a["logprobs"][i] - b["logprobs"][i]))
            if i < len(a["top"]) and i < len(b["top"]):
                ta, tb = dict(a["top"][i]), dict(b["top"][i])
                for t in set(ta) & set(tb):
                    max_top = max(max_top, abs(ta[t] - tb[t]))
    return {"token_agreement": agree / max(total, 1), "identical_prompts": sum(
        1 for a, b in zip(ref, got) if a["tokens"] == b["tokens"]), "prompts": len(ref),
        "min_common_prefix": min(prefix_lens), "mean_common_prefix": statistics.mean(prefix_lens),
        "max_abs_logprob_diff": max_lp, "max_abs_top_logprob_diff": max_top}


def diversity(res: list[dict]) -> dict:
    toks = [t for r in res for t in r["tokens"]]
    seqs = [tuple(r["tokens"]) for r in res]
    top1 = [lp for r in res for lp in r["logprobs"]]
    # a sequence is "stuck" when its second half is one repeated token
    stuck = sum(1 for r in res if len(set(r["tokens"][len(r["tokens"]) // 2:])) <= 1)
    return {"unique_tokens": len(set(toks)), "total_tokens": len(toks), "distinct_outputs": len(set(seqs)),
            "stuck_outputs": stuck, "mean_chosen_logprob": statistics.mean(top1) if top1 else None,
            "degenerate": len(set(toks)) < 0.2 * len(toks) or len(set(seqs)) < len(seqs) // 2,
            "sample": res[0]["tokens"][:16] if res else []}


# ---------------------------------------------------------------------------------------------- throughput

NOTE_RE = re.compile(r"ReplaySSM")  # our hooks' and kernels' log lines (not the args dump's enable_linear_replayssm)
GEN_RE = re.compile(r"Decode batch.*?#running-req: (\d+).*?gen throughput \(token/s\): ([\d.]+)")
CAP_RE = re.compile(r"max_running_requests is capped to (\d+)")


def server_gen_throughput(srv: Server, since_line: int) -> tuple[dict, int]:
    lines = srv.logpath.read_text(errors="replace").splitlines()
    by_b: dict[int, list[float]] = {}
    for l in lines[since_line:]:
        m = GEN_RE.search(l)
        if m:
            by_b.setdefault(int(m.group(1)), []).append(float(m.group(2)))
    return by_b, len(lines)


def throughput(srv: Server, vocab: int, batches: list[int], repeats: int, deadline: float) -> dict:
    rng = random.Random(99)

    def call(B: int, out_len: int) -> float:
        ids = [[rng.randrange(10, vocab - 10) for _ in range(32)] for _ in range(B)]
        t = time.perf_counter()
        srv.generate({"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": out_len,
                                                            "ignore_eos": True}})
        return time.perf_counter() - t

    call(max(batches), 16)  # warm-up
    res = {}
    for B in batches:
        rates, walls = [], []
        _, mark = server_gen_throughput(srv, 0)
        for _ in range(repeats):
            if time.time() > deadline:
                raise Deadline()
            t64, t256 = call(B, 64), call(B, 256)
            rates.append(B * (256 - 64) / max(t256 - t64, 1e-6))
            walls.append(B * 256 / t256)
        logged, _ = server_gen_throughput(srv, mark)
        lg = logged.get(B, [])
        max_run = max(logged) if logged else None
        res[str(B)] = {"decode_tok_s": statistics.median(rates), "decode_tok_s_all": rates,
                       "wall_tok_s_256": statistics.median(walls),
                       "server_logged_tok_s": statistics.median(lg) if lg else None,
                       "max_running_logged": max_run,
                       # fewer rows ran at once than asked (pool cap): the rate mixes two waves
                       "queued": max_run is not None and max_run < B,
                       "step_ms": 1000 * B / statistics.median(rates)}
        if res[str(B)]["queued"]:
            log(f"{srv.name}: WARNING B={B} but at most {max_run} requests ran at once")
        log(f"{srv.name}: B={B} decode {res[str(B)]['decode_tok_s']:.0f} tok/s "
            f"(server log {res[str(B)]['server_logged_tok_s']}) step {res[str(B)]['step_ms']:.2f} ms")
    return res


# ------------------------------------------------------------------------------------------------- prefix

async def _prefix_async(url: str, prompts: list[list[int]], out_len: int) -> list[dict]:
    import aiohttp

    async def one(session, ids):
        payload = {"input_ids": ids, "stream": True,
                   "sampling_params": {"temperature": 0.0, "max_new_tokens": out_len, "ignore_eos": True}}
        t0 = time.perf_counter()
        ttft, last = None, None
        async with session.post(url + "/generate", json=payload) as r:
            r.raise_for_status()
            async for raw in r.content:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                body = line[5:].strip()
                if body == "[DONE]":
                    break
                d = json.loads(body)
                if ttft is None and d.get("output_ids", d.get("text")):
                    ttft = time.perf_counter() - t0
                last = d
        mi = (last or {}).get("meta_info", {})
        return {"ttft": ttft, "latency": time.perf_counter() - t0, "cached": mi.get("cached_tokens", 0),
                "prompt": mi.get("prompt_tokens", len(ids))}

    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as s:
        return await asyncio.gather(*[one(s, p) for p in prompts])


def prefix_workload(srv: Server, vocab: int, groups=8, per_group=32, sys_len=2048, q_len=64, out_len=64,
                    seed=7) -> dict:
    rng = random.Random(seed)
    sys_prompts = [[rng.randrange(10, vocab - 10) for _ in range(sys_len)] for _ in range(groups)]
    prompts = [sp + [rng.randrange(10, vocab - 10) for _ in range(q_len)] for sp in sys_prompts
               for _ in range(per_group)]
    rng.shuffle(prompts)
    _, since = server_prefill_batches(srv, 0)
    t = time.perf_counter()
    rs = asyncio.run(_prefix_async(srv.url, prompts, out_len))
    wall = time.perf_counter() - t
    cached, total = sum(r["cached"] for r in rs), sum(r["prompt"] for r in rs)
    ttfts = sorted(r["ttft"] for r in rs if r["ttft"] is not None)
    # the best possible: every prompt after the first of its group reuses the system prompt
    ideal = groups * (per_group - 1) * sys_len / total
    # how the server batched this run's prefills (SGLang's "Prefill batch" lines): the warm runs' mean TTFT spread
    # from 0.61 to 1.38 s on one server in session 36, with the same prompts in the same order every run
    time.sleep(0.3)  # (the server's last log lines)
    batches, _ = server_prefill_batches(srv, since)
    out = {"hit_rate": cached / total, "ideal_hit_rate": ideal, "mean_ttft_s": statistics.mean(ttfts),
           "p50_ttft_s": statistics.median(ttfts), "p90_ttft_s": ttfts[int(0.9 * (len(ttfts) - 1))],
           "max_ttft_s": ttfts[-1], "wall_s": wall, "requests": len(rs),
           "output_tok_s": len(rs) * out_len / wall, "prefill_batches": len(batches),
           "prefill_new_tokens": sum(b["new_tokens"] for b in batches),
           "prefill_cached_tokens": sum(b["cached_tokens"] for b in batches),
           "prefill_batch_seqs": [b["new_seq"] for b in batches]}
    log(f"{srv.name}: prefix hit {out['hit_rate']:.3f} (ideal {ideal:.3f}) mean TTFT {out['mean_ttft_s']:.3f}s "
        f"(p90 {out['p90_ttft_s']:.3f}s) wall {wall:.1f}s; {len(batches)} prefill batches")
    return out


WARM_KEYS = ("hit_rate", "ideal_hit_rate", "mean_ttft_s", "p50_ttft_s", "p90_ttft_s", "wall_s", "prefill_batches")


def prefix_task(srv: Server, vocab: int, repeats: int, deadline: float, **kw) -> dict:
    """The prefix workload `repeats` times on one server, /flush_cache in between (stops early past the deadline
    or if the flush fails). Returns the first run's record; with more than one run it also holds `repeats` (the
    later runs), `mean_ttft_s_all` / `wall_s_all` (every run) and `warm` (the last run's WARM_KEYS): the run
    whose prefill kernels were all compiled before it started."""
    first = prefix_workload(srv, vocab, **kw)
    reps = []
    for _ in range(max(0, repeats - 1)):
        if time.time() > deadline or not flush_cache(srv):
            break
        reps.append(prefix_workload(srv, vocab, **kw))
    if reps:
        allr = [first] + reps
        first["repeats"] = reps
        first["mean_ttft_s_all"] = [x["mean_ttft_s"] for x in allr]
        first["wall_s_all"] = [x["wall_s"] for x in allr]
        first["warm"] = {k: reps[-1][k] for k in WARM_KEYS}
    return first


def flush_cache(srv: Server) -> bool:
    try:
        r = requests.post(srv.url + "/flush_cache", timeout=30)
        return r.status_code == 200
    except requests.RequestException:
        return False


# ------------------------------------------------------------------------------------------------ prefill

PREFILL_RE = re.compile(r"Prefill batch.*?#new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+).*?"
                        r"input throughput \(token/s\): ([\d.]+)")


def server_prefill_batches(srv: Server, since_line: int) -> tuple[list[dict], int]:
    """The server's "Prefill batch" log lines after line `since_line`: new seqs, new and cached tokens, and
    SGLang's logged input throughput (tokens over the gap since the previous prefill log line, so it is a
    prefill rate only for batches that follow each other without idle time)."""
    lines = srv.logpath.read_text(errors="replace").splitlines()
    out = []
    for l in lines[since_line:]:
        m = PREFILL_RE.search(l)
        if m:
            out.append({"new_seq": int(m.group(1)), "new_tokens": int(m.group(2)), "cached_tokens": int(m.group(3)),
                        "input_tok_s": float(m.group(4))})
    return out, len(lines)


def prefill_latency(srv: Server, vocab: int, lens=(2113, 4000), repeats: int = 5, burst_n: int = 8,
                    burst_len: int = 2113, burst_repeats: int = 3, seed: int = 11) -> dict:
    """Prefill cost per arm without queueing or streaming (the prefix workload mixes both): every prompt is
    fresh random tokens (no prefix hit: the cached token count is recorded to show it), max_new_tokens 1,
    one non-streaming call at a time; latency measured by the client. Small enough to run by default."""
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(10, vocab - 10) for _ in range(n)]

    def one(ids) -> tuple[float, int]:
        t = time.perf_counter()
        o = srv.generate({"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": 1,
                                                                "ignore_eos": True}})
        dt = time.perf_counter() - t
        outs = o if isinstance(o, list) else [o]
        return dt, sum(int(x.get("meta_info", {}).get("cached_tokens", 0) or 0) for x in outs)

    out: dict = {}
    for n in (16,) + tuple(lens):
        one(fresh(n))  # warm-up: first use of this shape (allocator growth, graph buckets)
        ts, cached = [], 0
        for _ in range(repeats):
            dt, c = one(fresh(n))
            ts.append(dt)
            cached += c
        out[f"single_{n}"] = {"median_s": statistics.median(ts), "min_s": min(ts), "all_s": ts,
                              "cached_tokens": cached}
    _, mark = server_prefill_batches(srv, 0)
    one([fresh(burst_len) for _ in range(burst_n)])  # warm-up
    walls, cached = [], 0
    for _ in range(burst_repeats):
        dt, c = one([fresh(burst_len) for _ in range(burst_n)])
        walls.append(dt)
        cached += c
    logged, _ = server_prefill_batches(srv, mark)
    full = [b["input_tok_s"] for b in logged if b["cached_tokens"] == 0 and b["new_tokens"] >= 4096]
    out[f"burst_{burst_n}x{burst_len}"] = {
        "median_s": statistics.median(walls), "all_s": walls, "cached_tokens": cached,
        "tokens": burst_n * burst_len, "tok_s": burst_n * burst_len / statistics.median(walls),
        "server_input_tok_s_median": statistics.median(full) if full else None, "server_batches": logged}
    s = {k: round(v["median_s"] * 1000, 1) for k, v in out.items()}
    log(f"{srv.name}: prefill medians (ms) {s}")
    return out


# ------------------------------------------------------------------------------------------------ profile

PROFILE_DONE = "Profiling done"  # profiler_manager.py _stop_profile: logged after the export and the TP barrier


def profile_payload(output_dir: str, num_steps: int) -> dict:
    """The body of POST /start_profile: SGLang 0.5.17's ProfileReq (srt/managers/io_struct.py). Without
    profile_by_stage or start_step the scheduler starts the torch profiler at once and stops it by itself after
    num_steps forward steps (scheduler_components/profiler_manager.py _init_profile/_profile_batch_predicate),
    writing <profile_id>-TP-<rank>.trace.json.gz into output_dir. GPU activity only (CUDA kernels, copies and
    the CUDA runtime calls, whose cudaGraphLaunch correlation ids the step count uses); no Python stacks or
    shapes (SGLang turns both on unless they are false)."""
    return {"output_dir": output_dir, "num_steps": num_steps, "activities": ["GPU"], "profile_by_stage": False,
            "with_stack": False, "record_shapes": False}


def _new_traces(out_dir: Path, before: set) -> list[Path]:
    return sorted(p for p in out_dir.glob("*.trace.json*") if p not in before)


def profile_decode(srv: Server, vocab: int, linear_layers: int, out_dir: Path, B: int = 256, num_steps: int = 64,
                   tp: int = 1, steady_timeout: float = 90, trace_timeout: float = 180) -> dict:
    """Profile of a steady B-row decode on the running server: B requests of 32 random tokens, ignore_eos, long
    enough to outlast the profile; once the server logs a decode batch of B running requests, POST
    /start_profile (num_steps steps, stops by itself), wait for the trace files, and measure the state update's
    share of the decode step with scripts/trace_share.py (its docstring: how steps are counted)."""
    import threading

    import trace_share

    rng = random.Random(2024)

    def body(n_new: int) -> dict:
        return {"input_ids": [[rng.randrange(10, vocab - 10) for _ in range(32)] for _ in range(B)],
                "sampling_params": {"temperature": 0.0, "max_new_tokens": n_new, "ignore_eos": True}}

    srv.generate(body(16))  # warm-up: this batch size's graph and kernels
    out_dir.mkdir(parents=True, exist_ok=True)
    before = set(out_dir.glob("*.trace.json*"))
    _, mark = server_gen_throughput(srv, 0)
    # long enough for: the first decode log line (every 20 steps), the start request, the profiled steps and the
    # pause the profiler's start and export cause (the scheduler blocks; decode resumes after)
    out_len = max(512, 4 * num_steps + 128)
    box: dict = {}

    def run() -> None:
        try:
            box["out"] = srv.generate(body(out_len), timeout=900)
        except Exception as e:  # reported below
            box["error"] = repr(e)[:300]

    th = threading.Thread(target=run, daemon=True)
    t0 = time.time()
    th.start()
    res: dict = {"batch": B, "num_steps_requested": num_steps, "max_new_tokens": out_len,
                 "payload": profile_payload(str(out_dir), num_steps)}
    steady = False
    while time.time() < t0 + steady_timeout and th.is_alive():
        by_b, _ = server_gen_throughput(srv, mark)
        if B in by_b:
            steady = True
            break
        if sum(len(v) for v in by_b.values()) >= 3:  # 60 decode steps below B rows (a pool cap): go on, flagged
            break
        time.sleep(0.1)
    res["steady_before_start"] = steady
    res["running_logged_before_start"] = sorted(server_gen_throughput(srv, mark)[0])
    if not th.is_alive():
        res["error"] = f"the decode batch finished before the profile started {box.get('error', '')}"
        return res
    r = requests.post(srv.url + "/start_profile", json=res["payload"], timeout=120)
    r.raise_for_status()
    t_start = time.time()
    traces: list[Path] = []
    sizes: dict = {}
    stable = 0
    stopped = "num_steps"
    end = t_start + trace_timeout
    while time.time() < end:
        traces = _new_traces(out_dir, before)
        done = PROFILE_DONE in "\n".join(srv.logpath.read_text(errors="replace").splitlines()[mark:])
        now = {p: p.stat().st_size for p in traces}
        stable = stable + 1 if now and now == sizes else 0
        sizes = now
        if len(traces) >= tp and (done or stable >= 6):
            break
        if not th.is_alive() and stopped == "num_steps" and not traces:
            # the decode ended before num_steps steps: the profiler waits for more steps; stop it explicitly
            stopped = "stop_profile"
            try:
                requests.post(srv.url + "/stop_profile", timeout=120)
            except requests.RequestException as e:
                res["stop_error"] = repr(e)[:200]
        time.sleep(0.5)
    res["stopped_by"] = stopped
    res["trace_wait_s"] = time.time() - t_start
    th.join(timeout=max(1.0, 900 - (time.time() - t0)))
    if "error" in box:
        res["generate_error"] = box["error"]
    logged, _ = server_gen_throughput(srv, mark)
    res["running_logged"] = sorted(logged)
    res["queued"] = bool(logged) and max(logged) < B
    if not traces:
        res["error"] = f"no trace file in {out_dir} after {trace_timeout:.0f} s"
        res["share"] = None
        return res
    res["traces"] = [str(p) for p in traces]
    ranks = []
    for p in traces:
        a = trace_share.analyze(p, linear_layers)
        a["trace_bytes"] = p.stat().st_size
        ranks.append(a)
    # the headline is TP rank 0 (the file name ends in -TP-0); every rank is kept
    head = next((a for a in ranks if "-TP-0" in Path(a["trace"]).name), ranks[0])
    res["ranks"] = ranks
    res.update({k: head[k] for k in ("share", "share_of_span", "reason", "steps", "steps_method", "per_step",
                                     "top_kernels", "state_kernel_durations", "warnings")})
    log(f"{srv.name}: profile B={B}: {trace_share.summary(head)}"
        + (f" [WARNING at most {max(logged)} requests ran at once]" if res["queued"] else ""))
    for n, d in (head.get("state_kernel_durations") or {}).items():
        if d.get("count"):
            log(f"{srv.name}:   {n[:48]}: {d['count']} launches, median {d['median_us']:.1f} us, "
                f"p90 {d['p90_us']:.1f}, max {d['max_us']:.1f}")
    return res


# ---------------------------------------------------------------------------------------------- SSM share

def ssm_kernel_us(kind: str, B: int = 256) -> dict:
    import torch
    import triton

    from sglang.kernels.ops.attention.fla import fused_recurrent as fr

    torch.manual_seed(0)
    dev = "cuda"
    H, HV, K, V = (16, 32, 128, 128) if kind == "gdn" else (32, 32, 128, 128)
    slots = 4 * B
    state = torch.randn(slots, HV, V, K, device=dev, dtype=torch.float32) * 0.1
    idx = torch.randperm(slots, device=dev)[:B].to(torch.int32)
    qkv = torch.randn(B, 2 * H * K + HV * V, device=dev, dtype=torch.bfloat16)
    out = torch.empty(B, 1, HV, V, device=dev, dtype=torch.bfloat16)
    A_log = torch.log(torch.rand(HV, device=dev) * 15 + 1)
    if kind == "gdn":
        a = torch.randn(B, HV, device=dev, dtype=torch.bfloat16)
        b = torch.randn(B, HV, device=dev, dtype=torch.bfloat16)
        dt = torch.randn(HV, device=dev, dtype=torch.float32) * 0.1

        def fn():
            fr.fused_recurrent_gated_delta_rule_packed_decode(
                mixed_qkv=qkv, a=a, b=b, A_log=A_log, dt_bias=dt, scale=K ** -0.5, initial_state=state,
                out=out, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)
    else:
        a = torch.randn(B, HV * K, device=dev, dtype=torch.bfloat16)
        b = torch.rand(B, HV, device=dev, dtype=torch.bfloat16)
        dt = torch.randn(HV * K, device=dev, dtype=torch.float32) * 0.1

        def fn():
            fr.fused_recurrent_kda_packed_decode(
                mixed_qkv=qkv, a=a, b=b, A_log=A_log, dt_bias=dt, scale=K ** -0.5, initial_state=state,
                out=out, ssm_state_indices=idx, use_qk_l2norm_in_kernel=True)

    fn()
    torch.cuda.synchronize()
    ms = triton.testing.do_bench(fn, warmup=25, rep=200)
    moved = B * HV * V * K * 4 * 2
    return {"kernel_us": ms * 1000, "state_bytes_rw": moved, "TBps": moved / (ms * 1e-3) / 1e12}


# -------------------------------------------------------------------------------------------------- plot

def throughput_ratios(results: dict) -> list[tuple[str, str, int, float, float | None, bool]]:
    """(model, arm, B, decode tok/s, x the model's reference arm at that B or None, queued) for every throughput
    point; the reference arm is the correctness reference (the first arm run) unless the model names none."""
    out = []
    for mname, m in results["models"].items():
        arms = m["arms"]
        ref = m.get("reference_arm") or next(iter(arms), None)
        base = (arms.get(ref) or {}).get("throughput") or {}
        for arm, r in arms.items():
            for b, t in sorted((r.get("throughput") or {}).items(), key=lambda kv: int(kv[0])):
                rb = base.get(b)
                ratio = t["decode_tok_s"] / rb["decode_tok_s"] if rb else None
                out.append((mname, arm, int(b), t["decode_tok_s"], ratio, bool(t.get("queued"))))
    return out


def prefix_points(results: dict) -> list[dict]:
    """Per arm with a prefix result: label, `hit` (the median hit rate over the warm runs), `ttfts` (each warm run's
    mean TTFT) and `cold` (the first run's mean TTFT when later runs exist, else None). The warm runs are the ones
    after the first (issue 9's comparison: the first server of a call compiles its prefill kernels during its first
    run), or the only run."""
    import statistics

    pts = []
    for mname, m in results["models"].items():
        for arm, r in m["arms"].items():
            p = r.get("prefix")
            if not p:
                continue
            warm = p.get("repeats") or [p]
            pts.append(dict(label=f"{mname}:{arm}", hit=statistics.median(x["hit_rate"] for x in warm),
                            ttfts=[x["mean_ttft_s"] for x in warm],
                            cold=p["mean_ttft_s"] if p.get("repeats") else None))
    return pts


def plot(results: dict, path: Path) -> None:
    """Left: decode throughput per batch size as x the model's reference arm (linear axis from 0, the tok/s written
    on each bar). Right: the prefix workload per arm: the warm runs' median hit rate (bars), each warm run's mean
    TTFT (dots) and their median, and the first run's (hollow; a triangle at the top, with its value written, when
    it is off the scale of the warm runs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    pts = [t for t in throughput_ratios(results) if t[4] is not None]
    series = list(dict.fromkeys((mn, arm) for mn, arm, *_ in pts))
    bs_all = sorted({b for _, _, b, *_ in pts})
    width = 0.8 / max(1, len(series))
    for i, (mn, arm) in enumerate(series):
        mine = {b: (tok, ratio, q) for m2, a2, b, tok, ratio, q in pts if (m2, a2) == (mn, arm)}
        xs = [bs_all.index(b) + i * width for b in mine]
        bars = ax.bar(xs, [v[1] for v in mine.values()], width, label=f"{mn}:{arm}")
        for bar, (tok, ratio, q) in zip(bars, mine.values()):
            ax.annotate(f"{ratio:.2f}x\n{tok / 1000:.1f}k" + ("\nqueued" if q else ""),
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=7)
    if series:
        ax.set_xticks([k + 0.4 - width / 2 for k in range(len(bs_all))], [f"B={b}" for b in bs_all])
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_ylim(0, max(t[4] for t in pts) * 1.25)
        ax.legend(fontsize=7, loc="lower right")
    else:
        ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("decode throughput, x the model's reference arm")
    ax.set_title("steady-state decode throughput (tok/s on the bars)")
    ax = axes[1]
    pp = prefix_points(results)
    if pp:
        import statistics

        xs = list(range(len(pp)))
        ax.bar(xs, [p["hit"] for p in pp], color="tab:green", alpha=0.6, label="hit rate (median of warm runs)")
        ax.set_xticks(xs, [p["label"] for p in pp], rotation=20, fontsize=7)
        ax.set_ylim(0, 1)
        ax.set_ylabel("hit rate")
        ax2 = ax.twinx()
        top = max(t for p in pp for t in p["ttfts"]) * 1.4
        for x, p in zip(xs, pp):
            ax2.plot([x] * len(p["ttfts"]), p["ttfts"], ".", color="0.3", ms=5,
                     label="mean TTFT of each warm run (s)" if x == 0 else None)
        ax2.plot(xs, [statistics.median(p["ttfts"]) for p in pp], "k_-", ms=14, label="their median (s)")
        for x, p in zip(xs, pp):
            if p["cold"] is None:
                continue
            y = min(p["cold"], top * 0.97)
            ax2.plot([x], [y], "^" if p["cold"] > top else "o", mfc="none", mec="0.4",
                     label="first run (s)" if x == next(i for i, q in zip(xs, pp) if q["cold"] is not None) else None)
            if p["cold"] > top:
                ax2.annotate(f"first run {p['cold']:.1f} s", (x, y), xytext=(6, -4), textcoords="offset points",
                             fontsize=7)
        ax2.set_ylim(0, top)
        ax2.set_ylabel("mean TTFT (s)")
        h1, l1 = ax.get_legend_handles_labels()
        h2, l2 = ax2.get_legend_handles_labels()
        ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="lower right")
    else:
        ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
    ax.set_title("generated-shared-prefix 8x32, 2048-token system prompt")
    fig.suptitle(f"SGLang 0.5.17 end to end, {results.get('gpu', '?')}, {results.get('date', '')}, "
                 f"commit {results.get('commit', '?')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--plot", type=Path, default=None, metavar="JSON",
                    help="only redraw the PNG of an e2e JSON (written beside it, .png), then exit; no GPU needed")
    ap.add_argument("--model", action="append", help="label=path (label gdn or kda); required unless --plot")
    ap.add_argument("--arms", default="conventional,upstream_replayssm")
    ap.add_argument("--tasks", default="correctness,spec,throughput,prefill,prefix,ssm_share",
                    help="comma-separated, of correctness, spec, throughput, prefill, prefix, ssm_share, profile "
                         "(profile is not in the default; see the module docstring)")
    ap.add_argument("--prefix-repeats", type=int, default=2,
                    help="run the prefix workload this many times per arm, /flush_cache in between; the last run "
                         "is reported as `warm` (the first includes prefill-kernel JIT compilation)")
    ap.add_argument("--spec-arms", default="", help="the spec task only for these arms (comma-separated; "
                    "default: every arm)")
    ap.add_argument("--profile-batch", type=int, default=256, help="the profile task's decode batch size")
    ap.add_argument("--profile-arms", default="",
                    help="comma-separated arms the profile task runs on (default: every arm)")
    ap.add_argument("--profile-steps", type=int, default=64,
                    help="the profile task's num_steps for SGLang's /start_profile (forward steps profiled)")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/e2e-out")))
    ap.add_argument("--budget-s", type=float, default=540, help="stop starting new work after this")
    ap.add_argument("--startup-timeout", type=float, default=300)
    ap.add_argument("--port", type=int, default=31000)
    ap.add_argument("--extra", default="", help="extra flags for every server (space separated)")
    ap.add_argument("--tp", type=int, default=1,
                    help="tensor parallel size for every server (--tp-size): 2 on the nvidia-h200-x2 machine; the "
                         "ring and the read copy are sharded by heads like the state (docs/integration.md)")
    ap.add_argument("--fast-start", action="store_true",
                    help="--disable-prefill-cuda-graph: saves ~20 s per server (84 s for the first, Triton JIT "
                         "included) at the cost of eager prefill (TTFT)")
    args = ap.parse_args()
    if args.plot:
        plot(json.loads(args.plot.read_text()), args.plot.with_suffix(".png"))
        print(f"wrote {args.plot.with_suffix('.png')}")
        return
    if not args.model:
        ap.error("--model is required (label=path), unless --plot")
    tasks = set(args.tasks.split(",")) - {""}
    if tasks - TASKS:
        ap.error(f"unknown --tasks {sorted(tasks - TASKS)}: the tasks are {', '.join(sorted(TASKS))} "
                 "(decode throughput is `throughput`)")
    args.out.mkdir(parents=True, exist_ok=True)
    logdir = Path("/tmp/e2e-logs")
    logdir.mkdir(exist_ok=True)
    audit = logdir / "load-audit.jsonl"
    deadline = T0 + args.budget_s
    batches = [int(b) for b in args.batches.split(",")]
    if args.extra:
        COMMON.extend(args.extra.split())
    if args.tp > 1:
        import torch as _t

        if _t.cuda.device_count() < args.tp:
            raise SystemExit(f"--tp {args.tp} needs {args.tp} GPUs, this machine has {_t.cuda.device_count()}")
        COMMON.extend(["--tp-size", str(args.tp)])
        # 2026-11-30 04:37 on the nvidia-h200-x2 machine: with SGLang's defaults the TP = 2 server (conventional,
        # flag off) never became ready: its log stops after the symmetric-memory setup (300 s), past the line
        # where SGLang auto-enables FlashInfer's all-reduce fusion for Qwen3-Next on SM90 (the suspect: a JIT
        # module the offline image may lack; custom all-reduce off too, to rule it out). Both arms
        # get the plain NCCL all-reduce, so the comparison stays fair.
        COMMON.extend(["--enforce-disable-flashinfer-allreduce-fusion", "--disable-custom-all-reduce"])
    if args.fast_start:
        COMMON.append("--disable-prefill-cuda-graph")

    import torch

    results = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": torch.cuda.get_device_name(0),
               "commit": os.environ.get("REPLAYSSM_COMMIT", "?"), "common_flags": COMMON, "models": {},
               "series_applied": os.environ.get("REPLAYSSM_SERIES_APPLIED") == "1", "skipped": []}
    try:
        import sglang

        results["sglang"] = sglang.__version__
    except Exception as e:
        results["sglang"] = repr(e)
    servers: list[Server] = []
    port = args.port

    def save():
        (args.out / "e2e.json").write_text(json.dumps(results, indent=1))

    try:
        for spec in args.model:
            mname, mpath = spec.split("=", 1)
            cfg = json.loads(Path(mpath, "config.json").read_text())
            vocab = cfg["vocab_size"]
            n_lin = (sum(1 for t in cfg.get("layer_types", []) if t == "linear_attention")
                     or len(cfg.get("linear_attn_config", {}).get("kda_layers", [])))
            m = results["models"][mname] = {"path": mpath, "arch": cfg["architectures"][0],
                                            "linear_layers": n_lin, "layers": cfg["num_hidden_layers"],
                                            "hidden": cfg["hidden_size"], "arms": {},
                                            # make_tiny_model --init (gpu_e2e.sh passes E2E_INIT, default decisive)
                                            "init": os.environ.get("E2E_INIT", "decisive")}
            prompts = prompt_set(vocab)
            ref = ref_nextn = None
            arm_list = [a for a in args.arms.split(",") if a]
            if tag_repeats(arm_list) != arm_list:
                log(f"arms repeated: run as {','.join(tag_repeats(arm_list))} (each server's results kept)")
            for arm in tag_repeats(arm_list):
                if time.time() > deadline:
                    results["skipped"].append(f"{mname}:{arm} (time budget)")
                    continue
                base = arm_base(arm)
                if base.startswith("ours") and not results["series_applied"]:
                    msg = f"{mname}:{arm} skipped: the replayssm-sglang patch series is not applied"
                    log(msg)
                    results["skipped"].append(msg)
                    continue
                r = m["arms"][arm] = {"flags": ARMS[base], "env": dict(ARM_ENV.get(base, {}))}
                srv = Server(f"{mname}-{arm}", mpath, ARMS[base], port, logdir, audit)
                port += 1
                servers.append(srv)
                srv.start()
                if not srv.wait_ready(min(args.startup_timeout, deadline - time.time())):
                    r["error"] = "server did not start"
                    r["log_tail"] = srv.tail(60)
                    LOG.append(f"---- {srv.name} log tail ----\n{r['log_tail']}")
                    srv.stop()
                    save()
                    continue
                r["startup_s"] = srv.startup_s
                cap = CAP_RE.search(srv.logpath.read_text(errors="replace"))
                r["max_running_requests_cap"] = int(cap.group(1)) if cap else None
                try:
                    take_load_audit(srv, audit, r)
                    if "correctness" in tasks:
                        res = run_prompts(srv, prompts)
                        r["correctness_setup"] = correctness_setup(arm, prompts)
                        r["diversity"] = diversity(res)
                        r["outputs"] = [x["tokens"] for x in res]
                        log(f"{srv.name}: diversity {r['diversity']}")
                        if ref is None:
                            ref, m["reference_arm"] = res, arm
                        else:
                            r["vs_reference"] = compare(ref, res)
                            log(f"{srv.name}: vs {m['reference_arm']}: {r['vs_reference']}")
                        r["_res"] = res
                    if "throughput" in tasks:
                        r["throughput"] = throughput(srv, vocab, batches, args.repeats, deadline)
                    if "prefill" in tasks and time.time() < deadline:
                        r["prefill"] = prefill_latency(srv, vocab)
                    if "prefix" in tasks and time.time() < deadline:
                        r["prefix"] = prefix_task(srv, vocab, args.prefix_repeats, deadline)
                    # last on the server: the torch profiler may leave CUPTI attached after it stops, which could
                    # slow the launches of a task measured after it
                    if "profile" in tasks and time.time() < deadline and (
                            not args.profile_arms or arm in args.profile_arms.split(",")):
                        pdir = args.out / "profiles" / srv.name.replace(":", "_")
                        try:
                            r["profile"] = profile_decode(srv, vocab, n_lin, pdir, B=args.profile_batch,
                                                          num_steps=args.profile_steps, tp=args.tp)
                        except Exception as e:
                            r["profile"] = {"error": repr(e)[:500], "share": None}
                            log(f"{srv.name}: profile ERROR {e!r}")
                        t_b = (r.get("throughput") or {}).get(str(args.profile_batch))
                        if t_b:  # the unprofiled step from the throughput task, for comparison
                            r["profile"]["throughput_step_ms"] = t_b["step_ms"]
                except Deadline:
                    results["skipped"].append(f"{mname}:{arm}: rest of the tasks (time budget)")
                except Exception as e:
                    r["error"] = repr(e)[:500]
                    log(f"{srv.name}: ERROR {e!r}")
                r["log_tail"] = srv.tail(12)
                r["replayssm_notes"] = srv.notes()
                for note in r["replayssm_notes"]:
                    if "launch" in note:  # which decode launch the server took (the first such line)
                        log(f"{srv.name}: {note.split('] ', 1)[-1][:300]}")
                        break
                srv.stop()
                save()
                # NEXTN speculative decoding on the same arm: same greedy tokens required
                spec_arms = set(args.spec_arms.split(",")) - {""}
                if ("spec" in tasks and mname == "gdn" and "_res" in r and time.time() < deadline - 60
                        and (not spec_arms or arm in spec_arms)):
                    ss = Server(f"{mname}-{arm}-nextn", mpath, ARMS[base] + NEXTN, port, logdir, audit)
                    port += 1
                    servers.append(ss)
                    ss.start()
                    sr = r["nextn"] = {}
                    if ss.wait_ready(min(args.startup_timeout, deadline - time.time())):
                        try:
                            take_load_audit(ss, audit, sr)
                            res = run_prompts(ss, prompts)
                            sr["vs_same_arm_without_spec"] = compare(r["_res"], res)
                            sr["same_greedy_text"] = all(a["tokens"] == b["tokens"] for a, b in zip(r["_res"], res))
                            sr["outputs"] = [x["tokens"] for x in res]
                            log(f"{ss.name}: vs no-spec {sr['vs_same_arm_without_spec']}")
                            # the same spec path on both sides: this arm + NEXTN against the reference arm + NEXTN
                            if ref_nextn is None:
                                ref_nextn = res
                            else:
                                sr["vs_reference_arm_nextn"] = compare(ref_nextn, res)
                                log(f"{ss.name}: vs {m.get('reference_arm')}+NEXTN {sr['vs_reference_arm_nextn']}")
                            acc = re.findall(r"accept len: ([\d.]+)", ss.logpath.read_text(errors="replace"))
                            sr["accept_len_logged"] = [float(x) for x in acc[-5:]]
                        except Exception as e:
                            sr["error"] = repr(e)[:500]
                            log(f"{ss.name}: ERROR {e!r}")
                    else:
                        sr["error"] = "server did not start"
                        sr["log_tail"] = ss.tail(60)
                        LOG.append(f"---- {ss.name} log tail ----\n{sr['log_tail']}")
                    ss.stop()
                    save()
                r.pop("_res", None)
            # ratios vs the first arm
            arms = list(m["arms"])
            if arms and "throughput" in m["arms"][arms[0]]:
                base = m["arms"][arms[0]]["throughput"]
                for a in arms[1:]:
                    tp = m["arms"][a].get("throughput")
                    if tp:
                        m["arms"][a]["ratio_vs_" + arms[0]] = {
                            b: tp[b]["decode_tok_s"] / base[b]["decode_tok_s"] for b in tp if b in base}
            for a in m["arms"].values():
                a.pop("_res", None)
            if "ssm_share" in tasks:
                try:
                    kind = "gdn" if "Qwen3Next" in m["arch"] else "kda"
                    k = ssm_kernel_us(kind)
                    m["ssm_kernel"] = k
                    ref_arm = next((a for a in m["arms"].values() if "throughput" in a
                                    and "256" in a["throughput"]), None)
                    if ref_arm:
                        t256 = ref_arm["throughput"]["256"]
                        step_us = t256["step_ms"] * 1000
                        m["ssm_share_b256"] = n_lin * k["kernel_us"] / step_us
                        m["ssm_share_b256_valid"] = not t256.get("queued")
                    log(f"{mname}: {kind} kernel B=256 {k['kernel_us']:.1f} us ({k['TBps']:.2f} TB/s), "
                        f"{n_lin} layers, share of decode step {m.get('ssm_share_b256')}")
                except Exception as e:
                    m["ssm_kernel_error"] = repr(e)[:500]
                    log(f"{mname}: ssm kernel ERROR {e!r}")
            save()
    finally:
        for s in servers:
            s.stop()
        results["elapsed_s"] = time.time() - T0
        save()
        try:
            plot(results, args.out / "e2e.png")
        except Exception as e:
            log(f"plot failed: {e!r}")
        (args.out / "e2e.log").write_text("\n".join(LOG) + "\n")
    log("done")


if __name__ == "__main__":
    main()

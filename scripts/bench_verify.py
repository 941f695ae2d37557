#!/usr/bin/env python
"""Verify-mode benchmark: one process, one GPU, side by side.

Arms (GDN = Qwen3-Next TP1 layer H=16, HV=32, K=V=128; KDA = Kimi-Linear TP1 layer H=HV=32, K=V=128;
bf16 activations, fp32 state pool):
  conventional  SGLang 0.5.17's recurrent verify (fused_sigmoid_gating_delta_rule_update with
                intermediate states, one full state written per draft) + its commit
                (fused_mamba_state_scatter_with_mask: copy the last accepted state into the pool);
  flashinfer    FlashInfer's gated_delta_rule_mtp: not run on the project's GPU (a CuTe-DSL kernel; nvidia-cutlass-dsl
                is not on the image and its 92 MB CUDA 13 wheel exceeds what a device call carries), the reason
                in the JSON's meta;
  upstream      SGLang 0.5.17's GDN spec ring (gdn_replayssm_spec_decode, launch_mode "both", +
                commit_gdn_replayssm_spec), ring length L (power of two), its own early-flush rule;
  ours          kernels/verify.py (pre-fold + verify) + kernels.verify.ring_commit_, ring length L, fp32
                records, default_precision (3xTF32 dots for an fp32 pool), the launch choices of
                verify.VERIFY_TUNED (since 2026-11-30 10:30 the pipelined tile read; --tune replaces them);
  ours-onepiece the tile read in one piece (BV 32, 4 warps: the default before);
  ours-bf16rec  the same with bf16 records (u, k), halving the ring;
  ours-tf32     the same with one-pass TF32 dots instead of 3xTF32;
  ours-pipe     ring_verify(pipe_stages=3): the checkpoint tile read in 128-byte K chunks by a software-pipelined
                loop, each chunk multiplied in as it lands (BV 64, 4 warps; -bv32: BV 32; -bv128: BV 128, 8 warps;
                -bf16rec: bf16 records);
  ours-split    ring_verify(split=True): a pre launch per (row, value head) for the K-side work, then a main launch
                per V-tile (BV 32, 4 warps; -split64: BV 64; -split32x2: BV 32, 2 warps) that streams its tile
                (not in the default arms); ours-pipe128x4: the pipelined read at BV 128, 4 warps;
  ours-pf       the default launch with the pre-step fold pipelined over K chunks (ring_verify(fold_pipe_stages=3));
                ours-split-pf: both (not in the default arms).
  ours-rows     VERIFY_TUNED's launch with the rows outermost (ring_verify(row_order="rows"): the pre-step fold's
                and the verify launch's grids (tiles, HV, B); VERIFY_TUNED's own order since session 24, so the
                same launch as ours); ours-grid: the same in the grid order (before session 24; not in the default
                arms).
Each arm runs N_STEPS verify+commit steps captured in one CUDA graph with a fixed acceptance
(all drafts accepted: T per row; all rejected: 1 per row, the bonus token), replayed after warm-up;
the time per step is the median replay / N_STEPS. Slots are permuted; the state pool is 0.5 GB at
B=256 (larger than L2). Before timing, each arm's first-step outputs are compared with ours.

Reported per (kind, arm, B, T, accept): time per verify step, committed tokens per second, modelled
state+ring bytes per step and per committed token (HBM traffic of the state and the ring/intermediate
buffers, simulated over 64 steps of each arm's own cursor rule), achieved GB/s, memory per request.

Usage: python scripts/bench_verify.py --out benchmarks/results   (GPU)
       python scripts/bench_verify.py --smoke                    (CPU interpreter: API/agreement check)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys

if "--smoke" in sys.argv:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from replayssm_sglang import ring as R
from replayssm_sglang.kernels.verify import ring_commit_, ring_verify
from replayssm_sglang.reference_verify import ReferenceStream, random_inputs, random_params

LAYERS = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}
N_STEPS = 8
COPY_PEAK_GBPS = 4300.0  # device-to-device copy on this H200 (shared/research/device-facts.md)

_mods: dict = {}


def sglang_module(rel: str):
    """Load one SGLang 0.5.17 kernel file by path (these files import only torch and triton), so the
    baselines run without SGLang's server stack. Nothing is copied: the installed source is executed."""
    if rel in _mods:
        return _mods[rel]
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("SGLang 0.5.17 is not installed (pip install --no-deps sglang==0.5.17)")
    path = os.path.join(list(spec.submodule_search_locations)[0], *rel.split("/"))
    name = "_bench_sglang_" + rel.replace("/", "_").removesuffix(".py")
    s = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(s)
    sys.modules[name] = mod
    s.loader.exec_module(mod)
    _mods[rel] = mod
    return mod


FSG = "kernels/ops/attention/fla/fused_sigmoid_gating_recurrent.py"
SPEC = "kernels/ops/attention/fla/gdn_replayssm_spec_decode.py"
SCATTER = "kernels/ops/mamba/mamba_state_scatter_triton.py"


class Case:
    def __init__(self, kind, B, T, L, *, device, act_dtype=torch.bfloat16, state_dtype=torch.float32, seed=0, layer=None):
        self.kind, self.B, self.T, self.L = kind, B, T, L
        self.device, self.act_dtype, self.state_dtype = device, act_dtype, state_dtype
        d = layer or LAYERS[kind]
        self.H, self.HV, self.K, self.V = d["H"], d["HV"], d["K"], d["V"]
        if kind == "kda":
            self.H = self.HV
        g = torch.Generator().manual_seed(seed)
        self.gen = g
        A_log, dt = random_params(kind=kind, HV=self.HV, K=self.K, gen=g)
        self.A_log, self.dt_bias = A_log.to(device), dt.to(device)
        self.S = B + 1
        perm = torch.randperm(self.S, generator=g)
        self.slots = perm[:B].to(torch.int32).to(device)
        self.pool0 = (torch.randn(self.S, self.HV, self.V, self.K, generator=g) * 0.3).to(state_dtype)
        self.N = B * T
        self.qsl = torch.arange(0, self.N + 1, T, dtype=torch.int32, device=device)
        self.inputs = [random_inputs(kind=kind, B=B, T=T, H=self.H, HV=self.HV, K=self.K, V=self.V,
                                     dtype=act_dtype, device=device, gen=g) for _ in range(N_STEPS)]

    @property
    def state_bytes(self):
        return self.HV * self.V * self.K * torch.empty((), dtype=self.state_dtype).element_size()

    def split(self, mixed):
        HK = self.H * self.K
        return mixed[:, :HK], mixed[:, HK:2 * HK], mixed[:, 2 * HK:]


# --------------------------------------------------------------------------------------------
# Arms
# --------------------------------------------------------------------------------------------
class Conventional:
    name = "conventional"

    def __init__(self, c: Case):
        self.c = c
        self.pool = c.pool0.to(c.device).clone()
        self.inter = torch.empty(c.B, c.T, c.HV, c.V, c.K, dtype=c.state_dtype, device=c.device)
        self.inter_idx = torch.arange(c.B, dtype=torch.int32, device=c.device)
        self.m = sglang_module(FSG)
        self.sc = sglang_module(SCATTER) if c.device != "cpu" else None

    def step(self, i):
        c = self.c
        mixed, a, b = c.inputs[i]
        q, k, v = c.split(mixed)
        o = self.m.fused_sigmoid_gating_delta_rule_update(
            A_log=c.A_log, a=a, dt_bias=c.dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
            q=q.view(1, c.N, c.H, c.K), k=k.view(1, c.N, c.H, c.K), v=v.view(1, c.N, c.HV, c.V), b=b,
            initial_state_source=self.pool, initial_state_indices=c.slots, scale=c.K ** -0.5,
            use_qk_l2norm_in_kernel=True, cu_seqlens=c.qsl, is_kda=c.kind == "kda",
            disable_state_update=True, intermediate_states_buffer=self.inter,
            intermediate_state_indices=self.inter_idx, cache_steps=c.T)
        return o.reshape(c.N, c.HV, c.V)

    def commit(self, acc):
        step_idx = (acc - 1).to(torch.int32)
        if self.sc is not None:
            self.sc.fused_mamba_state_scatter_with_mask(self.pool.unsqueeze(0), self.inter.unsqueeze(0), self.c.slots, step_idx)
        else:
            self.pool[self.c.slots.long()] = self.inter[torch.arange(self.c.B), step_idx.long()]

    def bytes_per_step(self, acc):
        Sb, T = self.c.state_bytes, self.c.T
        return Sb * (1 + T + 1 + 1)  # read S, write T states, commit: read 1 + write 1

    def mem_per_request(self):
        return self.c.state_bytes * (1 + self.c.T)


class Upstream:
    name = "upstream"

    def __init__(self, c: Case):
        assert c.kind == "gdn"
        self.c = c
        dev, S, HV, H, L, K, V = c.device, c.S, c.HV, c.H, c.L, c.K, c.V
        ad = c.act_dtype
        self.pool = c.pool0.to(dev).clone()
        self.d = torch.zeros(S, HV, L, V, dtype=ad, device=dev)
        self.k = torch.zeros(S, H, L, K, dtype=ad, device=dev)
        self.g = torch.zeros(S, HV, L, dtype=torch.float32, device=dev)
        self.rawv = torch.zeros(S, HV, L, V, dtype=ad, device=dev)
        self.rawk = torch.zeros(S, H, L, K, dtype=ad, device=dev)
        self.beta = torch.zeros(S, HV, L, dtype=torch.float32, device=dev)
        self.wp = torch.zeros(S, dtype=torch.int32, device=dev)
        self.cb = torch.zeros(S, dtype=torch.int32, device=dev)
        self.isf = torch.full((S,), 1 if 2 * c.T > L else 0, dtype=torch.int8, device=dev)
        self.out = torch.empty(c.N, HV, V, dtype=ad, device=dev)
        self.m = sglang_module(SPEC)

    def step(self, i):
        c = self.c
        mixed, a, b = c.inputs[i]
        q, k, v = c.split(mixed)
        self.m.gdn_replayssm_spec_decode(
            q=q.view(c.N, c.H, c.K), k=k.view(c.N, c.H, c.K), v=v.view(c.N, c.HV, c.V), a=a, b=b,
            A_log=c.A_log, dt_bias=c.dt_bias, checkpoint_state=self.pool, d_cache=self.d, k_cache=self.k,
            g_cache=self.g, rawv_cache=self.rawv, rawk_cache=self.rawk, beta_cache=self.beta, out=self.out,
            query_start_loc=c.qsl, ssm_state_indices=c.slots, write_pos=self.wp, cache_base=self.cb,
            is_flush=self.isf, max_cache_len=c.L, max_spec_len=c.T, scale=c.K ** -0.5,
            use_qk_l2norm_in_kernel=True, null_block_id=-1)
        return self.out

    def commit(self, acc):
        c = self.c
        self.m.commit_gdn_replayssm_spec(self.wp, self.cb, self.isf, num_accepted=acc.to(torch.int32),
                                         state_batch_indices=c.slots, max_cache_len=c.L, max_spec_len=c.T,
                                         null_block_id=-1)

    def _rec(self):
        c = self.c
        e = torch.empty((), dtype=c.act_dtype).element_size()
        hist = c.HV * c.V * e + c.H * c.K * e + c.HV * 4  # d, k, g (output reconstruction)
        raw = c.HV * c.V * e + c.H * c.K * e + c.HV * 4  # rawv, rawk, beta (exact fold)
        return hist, raw

    def bytes_per_step(self, acc, steps=64):
        c = self.c
        Sb, T, L = c.state_bytes, c.T, c.L
        hist, raw = self._rec()
        wp, isf, tot = 0, (2 * T > L), 0
        for _ in range(steps):
            if isf:
                tot += Sb + wp * (raw + c.HV * 4) + Sb  # exact fold: read S, replay raw records (+g), write S
                tot += Sb  # flush-output verify re-reads the folded checkpoint
                wp_read = 0
            else:
                tot += Sb
                wp_read = wp
            tot += wp_read * hist + T * (hist + raw)
            new = acc if isf else wp + acc
            isf = new + 2 * T > L
            wp = new
        return tot / steps

    def mem_per_request(self):
        hist, raw = self._rec()
        return self.c.state_bytes + self.c.L * (hist + raw) + 4 + 4 + 1


class Ours:
    name = "ours"

    def __init__(self, c: Case, record_dtype=torch.float32, precision=None, name=None, cfg=None):
        self.c = c
        self.cfg = dict(cfg or {})
        self.name = name or self.name
        self.pool = c.pool0.to(c.device).clone()
        self.lay = R.RingLayout.for_layer(c.kind, L=c.L, T_max=c.T, H=c.H, HV=c.HV, K=c.K, V=c.V)
        self.ring = self.lay.allocate(c.S, device=c.device, record_dtype=record_dtype)
        self.rd = record_dtype
        self.precision = precision
        self.out = torch.empty(c.N, c.HV, c.V, dtype=c.act_dtype, device=c.device)

    def step(self, i):
        c = self.c
        mixed, a, b = c.inputs[i]
        return ring_verify(mixed, a, b, c.A_log, c.dt_bias, self.pool, c.slots, self.ring, c.T, out=self.out,
                           precision=self.precision, **self.cfg)

    def commit(self, acc):
        ring_commit_(self.ring.h, self.c.slots, self.c.T, self.c.L, acc)

    def bytes_per_step(self, acc, steps=64):
        c = self.c
        Sb, T, L = c.state_bytes, c.T, c.L
        rec = self.lay.record_bytes(self.rd)
        h, tot = 0, 0
        for _ in range(steps):
            if h + T > L:  # ring.needs_prefold
                tot += Sb + h * rec + Sb
                h = 0
            tot += Sb + h * rec + T * rec
            h += acc
        return tot / steps

    def mem_per_request(self):
        return self.c.state_bytes + self.lay.bytes_per_slot(self.rd)


def flashinfer_available():
    """Whether FlashInfer's MTP (verify) kernel can run here. flashinfer.gdn_decode imports without its kernels: the
    MTP kernel (flashinfer/gdn_kernels/gdn_decode_mtp.py, 0.6.15.post1) is a CuTe-DSL kernel that needs
    nvidia-cutlass-dsl and cuda-python, which the GPU image lacks and a device call cannot carry (the CUDA 13 libs
    wheel of nvidia-cutlass-dsl 4.8.1 alone is 92 MB, over the 64 MiB a call carries)."""
    try:
        import flashinfer.gdn_decode as fgd
    except Exception as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {e}"[:200]
    if not getattr(fgd, "_MTP_AVAILABLE", False):
        try:
            import cutlass.cute  # noqa: F401
            why = "flashinfer.gdn_kernels.gdn_decode_mtp did not import"
        except Exception as e:  # noqa: BLE001
            why = f"its CuTe-DSL kernel needs nvidia-cutlass-dsl ({type(e).__name__}: {e})"[:200]
        return False, why
    return True, ""


# --------------------------------------------------------------------------------------------
def rms_ratio(x, ref):
    x, ref = x.double(), ref.double()
    if not torch.isfinite(x).all():
        return math.inf
    return float((x - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))


def time_graph(arm, acc, reps=15):
    def run():
        for i in range(N_STEPS):
            arm.step(i)
            arm.commit(acc)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run()  # compile + warm up
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        run()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    del g
    return statistics.median(ts) / N_STEPS * 1e3  # us per step


def _launch(block_v, num_warps, pipe_stages, **kw):
    return dict(block_v=block_v, num_warps=num_warps, nsplit=1, pipe_stages=pipe_stages, **kw)


# ours' arms with a fixed launch, name -> (record dtype, ring_verify options); the docstring says what each is
FIXED_ARMS = {
    "ours-onepiece": (torch.float32, _launch(32, 4, 0)),  # the default before 2026-11-30 10:30
    "ours-pipe": (torch.float32, _launch(64, 4, 3)),
    "ours-pipe-bv32": (torch.float32, _launch(32, 4, 3)),
    "ours-pipe-bv128": (torch.float32, _launch(128, 8, 3)),
    "ours-pipe-bf16rec": (torch.bfloat16, _launch(64, 4, 3)),
    "ours-split": (torch.float32, _launch(32, 4, 3, split=True)),
    "ours-split64": (torch.float32, _launch(64, 4, 3, split=True)),
    "ours-split32x2": (torch.float32, _launch(32, 2, 3, split=True)),
    "ours-pipe128x4": (torch.float32, _launch(128, 4, 3)),
    "ours-split-pf": (torch.float32, _launch(32, 4, 3, split=True, fold_pipe_stages=3)),
    # 2026-12-01: the drafts' checkpoint products on the tensor cores (ck_dot 1: C k~ beside C q~; 2: one product of
    # the stacked rows), and register caps, at the tuned 64 x 2 and at 64 x 4 / 128 x 4
    "ours-ck1": (torch.float32, _launch(64, 2, 3, ck_dot=1, fold_pipe_stages=3)),
    "ours-ck2": (torch.float32, _launch(64, 2, 3, ck_dot=2, fold_pipe_stages=3)),
    "ours-ck2-64x4": (torch.float32, _launch(64, 4, 3, ck_dot=2, fold_pipe_stages=3)),
    "ours-ck2-128x4": (torch.float32, _launch(128, 4, 3, ck_dot=2, fold_pipe_stages=3)),
    "ours-m168": (torch.float32, _launch(64, 2, 3, maxnreg=168, fold_pipe_stages=3)),
    "ours-m128": (torch.float32, _launch(64, 2, 3, maxnreg=128, fold_pipe_stages=3)),
    "ours-ck2-m168": (torch.float32, _launch(64, 2, 3, ck_dot=2, maxnreg=168, fold_pipe_stages=3)),
    # KDA's pair factors one draft at a time (pair_loop; for T = 8), at the default launch and without its cap
    "ours-pl": (torch.float32, _launch(64, 2, 3, ck_dot=2, maxnreg=168, fold_pipe_stages=3, pair_loop=True)),
    "ours-pl-nocap": (torch.float32, _launch(64, 2, 3, ck_dot=2, fold_pipe_stages=3, pair_loop=True)),
    "ours-pl-64x4": (torch.float32, _launch(64, 4, 3, ck_dot=2, fold_pipe_stages=3, pair_loop=True)),
    # session 23: VERIFY_TUNED's launch (its register cap too) with the pre-step fold's and the verify launch's rows
    # outermost (ring_verify row_order "rows", opt-in; decode v3's "rows" gained 2-8% on the H200)
    "ours-rows": (torch.float32, dict(row_order="rows")),
    # session 24: VERIFY_TUNED takes "rows" (0.2-1.8% faster, verify-20261202-1603-rows); the grid order beside it
    "ours-grid": (torch.float32, dict(row_order="grid")),
}


def make_arms(c: Case, names, cfg=None):
    """The arms named, ours' with ``cfg`` (tuned or VERIFY_TUNED's when None) unless FIXED_ARMS fixes them."""
    arms = []
    for n in names:
        if n == "conventional":
            arms.append(Conventional(c))
        elif n == "upstream" and c.kind == "gdn":
            arms.append(Upstream(c))
        elif n == "ours":
            arms.append(Ours(c, cfg=cfg))
        elif n == "ours-bf16rec":
            arms.append(Ours(c, record_dtype=torch.bfloat16, name=n, cfg=cfg))
        elif n == "ours-tf32":
            arms.append(Ours(c, precision="tf32", name=n, cfg=cfg))
        elif n == "ours-pf":  # the default (or tuned) launch with the pre-step fold pipelined over K chunks
            arms.append(Ours(c, name=n, cfg=dict(cfg or {}, fold_pipe_stages=3)))
        elif n in FIXED_ARMS:
            rec, opts = FIXED_ARMS[n]
            arms.append(Ours(c, record_dtype=rec, name=n, cfg=opts))
    return arms


TUNE_CONFIGS = [  # the pipelined read (verify.VERIFY_TUNED) at several V-tiles and warps, and the one-piece read
    dict(block_v=64, num_warps=4, nsplit=1, pipe_stages=3),
    dict(block_v=64, num_warps=8, nsplit=1, pipe_stages=3),
    dict(block_v=128, num_warps=8, nsplit=1, pipe_stages=3),
    dict(block_v=128, num_warps=4, nsplit=1, pipe_stages=3),
    dict(block_v=64, num_warps=4, nsplit=2, pipe_stages=3),
    dict(block_v=32, num_warps=4, nsplit=1, pipe_stages=0),
    # since the draft axis is no longer padded to 16 (2026-12-01): smaller tiles and fewer warps, which the
    # kernel's registers (ptxas sm_90, Triton 3.6: KDA 168 at 32 x 4 against 255 at 128 x 8) may now favour
    dict(block_v=32, num_warps=4, nsplit=1, pipe_stages=3),
    dict(block_v=64, num_warps=2, nsplit=1, pipe_stages=3),
    dict(block_v=32, num_warps=2, nsplit=1, pipe_stages=3),
]


def tune(kind, B, T, L, dev, log):
    """Pick ring_verify's launch config for (kind, B) by timing each candidate (all-accepted)."""
    c = Case(kind, B, T, L, device=dev, seed=7)
    acc = torch.full((B,), T, dtype=torch.int32, device=dev)
    best = None
    for cfg in TUNE_CONFIGS:
        try:
            t = time_graph(Ours(c, cfg=cfg), acc, reps=7)
        except Exception as e:  # noqa: BLE001
            print(f"tune {kind} B={B} {cfg} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        log.append(dict(kind=kind, B=B, T=T, us_per_step=t, **cfg))
        print(f"tune {kind} B={B} T={T} {cfg} {t:.1f} us", flush=True)
        if best is None or t < best[0]:
            best = (t, cfg)
    return best[1] if best else {}


def kernel_split(arm, acc, steps=2 * N_STEPS):
    """Where one arm's step goes: GPU time per kernel name (us per step) over ``steps`` eager steps under the
    torch profiler (no CUDA graph, so launch gaps are not in these sums; each kernel's own time is)."""
    from torch.profiler import ProfilerActivity, profile

    for i in range(2):  # compiled and warm
        arm.step(i % N_STEPS)
        arm.commit(acc)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(steps):
            arm.step(i % N_STEPS)
            arm.commit(acc)
        torch.cuda.synchronize()
    tot: dict[str, float] = {}
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            tot[ev.name] = tot.get(ev.name, 0.0) + ev.device_time / steps
    return dict(sorted(tot.items(), key=lambda kv: -kv[1]))


def agreement(c: Case, arms):
    """First-step outputs of every arm (all from the same checkpoint) against ours and float64."""
    nb = min(c.B, 4)  # the float64 reference on the first rows only (CPU)
    n = nb * c.T
    outs = {a.name: a.step(0)[:n].float().cpu() for a in arms}
    ref = ReferenceStream(c.pool0[c.slots[:nb].long().cpu()].double(), kind=c.kind, H=c.H, HV=c.HV, K=c.K, V=c.V,
                          A_log=c.A_log.cpu(), dt_bias=c.dt_bias.cpu())
    m, a, b = c.inputs[0]
    o_ref = ref.verify(m[:n].cpu(), a[:n].cpu(), b[:n].cpu(), c.T)
    return {name: rms_ratio(o, o_ref) for name, o in outs.items()}


def smoke():
    """CPU interpreter: tiny shapes, every arm's API exercised, outputs agree over a few steps."""
    layer = dict(H=1, HV=2, K=32, V=32)
    for kind in ("gdn", "kda"):
        c = Case(kind, B=2, T=2, L=8, device="cpu", act_dtype=torch.float32, layer=layer, seed=1)
        arms = make_arms(c, ["conventional", "upstream", "ours", "ours-pipe", "ours-split", "ours-split-pf",
                             "ours-rows", "ours-grid"])
        ref = ReferenceStream(c.pool0[c.slots.long()].double(), kind=kind, H=c.H, HV=c.HV, K=c.K, V=c.V,
                              A_log=c.A_log, dt_bias=c.dt_bias)
        for i, acc_v in enumerate([2, 1, 2, 2, 1, 2]):
            acc = torch.full((c.B,), acc_v, dtype=torch.int32)
            o_ref = ref.verify(*c.inputs[i % N_STEPS], c.T)
            for arm in arms:
                o = arm.step(i % N_STEPS)
                e = rms_ratio(o, o_ref)
                tol = 2e-3 if arm.name == "upstream" else 1e-4  # upstream: TF32-intended dots
                print(f"smoke {kind} step {i} {arm.name:13s} rms vs float64 {e:.2e}")
                assert e < tol, (kind, arm.name, i, e)
                arm.commit(acc)
            ref.commit(acc)
        for arm in arms:
            print(f"smoke {kind} {arm.name}: bytes/step all-acc {arm.bytes_per_step(c.T):.0f} mem/req {arm.mem_per_request()}")
    print("smoke ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--kinds", default="gdn,kda")
    ap.add_argument("--B", default="1,64,256")
    ap.add_argument("--T", default="2,4,8")
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--arms", default="conventional,upstream,ours,ours-bf16rec,ours-tf32")
    ap.add_argument("--kda-arms", default="conventional,ours,ours-bf16rec")
    ap.add_argument("--split", action="store_true",
                    help="per-kernel GPU time of ours' arms at the target case (B max, T = 4), torch profiler")
    ap.add_argument("--tune", action="store_true", help="pick ours' launch config per kind at the largest and smallest B")
    ap.add_argument("--from-json", help="rebuild the .md table and .png plot from a results JSON")
    args = ap.parse_args()
    if args.from_json:
        with open(args.from_json) as f:
            d = json.load(f)
        base = args.from_json.removesuffix(".json")
        with open(base + ".md", "w") as f:
            f.write(table(d["rows"], d["meta"], d["agreement"]))
        plot(d["rows"], base + ".png", d["meta"])
        print("wrote", base + ".{md,png}")
        return
    if args.smoke:
        smoke()
        return
    assert torch.cuda.is_available(), "GPU benchmark"
    dev = "cuda"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M")
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except Exception:  # noqa: BLE001
        commit = "?"
    fi_ok, fi_why = flashinfer_available()
    meta = dict(date=stamp, gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__,
                # the GPU machine's copy of the tree may carry a stale .git: the caller's commit first
                commit=os.environ.get("REPLAYSSM_COMMIT") or commit or "?",
                L=args.L, n_steps_per_graph=N_STEPS, act_dtype="bfloat16", state_dtype="float32",
                flashinfer=("available (not wired)" if fi_ok else f"not run: {fi_why}"))
    rows, agree, tune_log = [], [], []
    Bs = [int(x) for x in args.B.split(",")]
    Ts = [int(x) for x in args.T.split(",")]
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, f"verify-{stamp}")

    def save():
        with open(base + ".json", "w") as f:
            json.dump(dict(meta=meta, rows=rows, agreement=agree, tune=tune_log), f, indent=1)

    for kind in args.kinds.split(","):
        names = (args.arms if kind == "gdn" else args.kda_arms).split(",")
        cfgs = {}
        if args.tune:
            big = tune(kind, max(Bs), 4, args.L, dev, tune_log)
            small = tune(kind, min(Bs), 4, args.L, dev, tune_log) if min(Bs) < max(Bs) else big
            cfgs = {B: (small if B == min(Bs) and B < 16 else big) for B in Bs}
        # the target case first (B = max, T = 4), so a cut-short run still answers it
        order = sorted(((T, B) for T in Ts for B in Bs), key=lambda tb: (tb != (4, max(Bs)), tb[0], -tb[1]))
        for T, B in order:
            if True:
                c = Case(kind, B, T, args.L, device=dev)
                arms = make_arms(c, names, cfgs.get(B))
                ag = agreement(c, arms)
                agree.append(dict(kind=kind, B=B, T=T, **{f"rms_{k}": v for k, v in ag.items()}))
                for acc_name, acc_v in (("all-accepted", T), ("all-rejected", 1)):
                    acc = torch.full((B,), acc_v, dtype=torch.int32, device=dev)
                    for arm in arms:
                        arm.pool.copy_(c.pool0.to(dev))
                        t = time_graph(arm, acc)
                        bps = arm.bytes_per_step(acc_v)
                        row = dict(kind=kind, arm=arm.name, B=B, T=T, L=args.L, accept=acc_name, accepted=acc_v,
                                   cfg=getattr(arm, "cfg", None),
                                   us_per_step=t, committed_tok_per_s=B * acc_v / (t * 1e-6),
                                   bytes_per_step_per_row=bps, bytes_per_committed_token=bps / acc_v,
                                   GBps=B * bps / (t * 1e-6) / 1e9, frac_copy_peak=B * bps / (t * 1e-6) / 1e9 / COPY_PEAK_GBPS,
                                   mem_per_request=arm.mem_per_request())
                        if args.split and arm.name.startswith("ours") and B == max(Bs) and T == 4:
                            row["kernel_split_us"] = kernel_split(arm, acc)
                            print(f"split {kind} {acc_name} {arm.name}: " + ", ".join(
                                f"{k[:40]} {v:.1f}" for k, v in row["kernel_split_us"].items()), flush=True)
                        rows.append(row)
                        print(f"{kind} B={B:3d} T={T} {acc_name:12s} {arm.name:13s} {t:9.1f} us/step "
                              f"{row['committed_tok_per_s']:12.0f} tok/s  {row['GBps']:7.0f} GB/s  "
                              f"{bps / acc_v / 1024:8.0f} KiB/tok  mem {row['mem_per_request'] / 2**20:6.2f} MiB", flush=True)
                del arms, c
                torch.cuda.empty_cache()
                save()
    save()
    md = table(rows, meta, agree)
    with open(base + ".md", "w") as f:
        f.write(md)
    print(md)
    try:
        plot(rows, base + ".png", meta)
    except Exception as e:  # noqa: BLE001
        print("plot failed:", e)
    print("wrote", base + ".{json,md,png}")


def table(rows, meta, agree):
    idx = {(r["kind"], r["arm"], r["B"], r["T"], r["accept"]): r for r in rows}
    lines = [f"Verify benchmark {meta['date']} on {meta['gpu']} (commit {meta['commit']}, torch {meta['torch']}, "
             f"triton {meta['triton']}), L={meta['L']}, bf16 activations, fp32 state; FlashInfer: {meta['flashinfer']}.",
             "", "Time per verify+commit step (us) and speed-up of committed tokens/s over conventional:", "",
             "| kind | B | T | accept | conventional us | upstream us | ours us | ours-bf16rec us | ours-tf32 us | "
             "ours-pipe us | ours/conv | ours/upstream | ours-pipe/conv | ours-pipe/upstream |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (kind, arm, B, T, acc), r in sorted(idx.items(), key=lambda x: (x[0][0], x[0][3], x[0][2], x[0][4])):
        if arm != "ours":
            continue
        g = lambda a: idx.get((kind, a, B, T, acc))  # noqa: E731
        f = lambda a: f"{g(a)['us_per_step']:.1f}" if g(a) else "-"  # noqa: E731
        conv, up = g("conventional"), g("upstream")
        pp = g("ours-pipe")
        ratio = lambda ref, x: f"{ref['us_per_step'] / x['us_per_step']:.2f}x" if ref and x else "-"  # noqa: E731
        lines.append(f"| {kind} | {B} | {T} | {acc} | {f('conventional')} | {f('upstream')} | {f('ours')} | "
                     f"{f('ours-bf16rec')} | {f('ours-tf32')} | {f('ours-pipe')} | {ratio(conv, r)} | {ratio(up, r)} | "
                     f"{ratio(conv, pp)} | {ratio(up, pp)} |")
    lines += ["", "State + ring bytes per committed token (KiB, modelled) and memory per request (MiB), B=256:", "",
              "| kind | T | accept | conventional | upstream | ours | ours-bf16rec | mem conv | mem upstream | mem ours | mem ours-bf16rec |",
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (kind, arm, B, T, acc), r in sorted(idx.items(), key=lambda x: (x[0][0], x[0][3], x[0][4])):
        if arm != "ours" or B != 256:
            continue
        g = lambda a: idx.get((kind, a, B, T, acc))  # noqa: E731
        kb = lambda a: f"{g(a)['bytes_per_committed_token'] / 1024:.0f}" if g(a) else "-"  # noqa: E731
        mb = lambda a: f"{g(a)['mem_per_request'] / 2**20:.2f}" if g(a) else "-"  # noqa: E731
        lines.append(f"| {kind} | {T} | {acc} | {kb('conventional')} | {kb('upstream')} | {kb('ours')} | {kb('ours-bf16rec')} | "
                     f"{mb('conventional')} | {mb('upstream')} | {mb('ours')} | {mb('ours-bf16rec')} |")
    lines += ["", "First-step output rms ratio against float64 (bf16 outputs):", ""]
    for a in agree:
        lines.append("- " + ", ".join(f"{k}={v:.2e}" if isinstance(v, float) else f"{k}={v}" for k, v in a.items()))
    return "\n".join(lines) + "\n"


def plot(rows, path, meta):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    kinds = sorted({r["kind"] for r in rows})
    Ts = sorted({r["T"] for r in rows})
    fig, axes = plt.subplots(len(kinds), len(Ts), figsize=(5 * len(Ts), 4 * len(kinds)), squeeze=False)
    for i, kind in enumerate(kinds):
        for j, T in enumerate(Ts):
            ax = axes[i][j]
            for arm in sorted({r["arm"] for r in rows if r["kind"] == kind}):
                for acc, ls in (("all-accepted", "-"), ("all-rejected", "--")):
                    pts = sorted((r["B"], r["committed_tok_per_s"]) for r in rows
                                 if r["kind"] == kind and r["T"] == T and r["arm"] == arm and r["accept"] == acc)
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], ls, marker="o", label=f"{arm} {acc}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{kind.upper()} T={T} L={meta['L']}")
            ax.set_xlabel("batch B")
            ax.set_ylabel("committed tokens/s (one layer)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=6)
    fig.suptitle(f"verify in the ring vs conventional and upstream, {meta['gpu']} {meta['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

#!/usr/bin/env python
"""Compile every kernel configuration the server launches for sm_90 (H100/H200), without a GPU.

Why: the CPU test suite runs the kernels under Triton's interpreter (TRITON_INTERPRET=1), which does not
type-check the way compiled Triton does (e.g. a variable that is a bf16 pointer in one branch and an fp32
pointer in the other: "Mismatched type for p_tile between then block ... and else block" compiled, silently
fine interpreted; decode_v3 until 6b77c5f). This compiles them as the JIT would on the GPU.

How: the real Python launch functions (kernels/decode.py replay_decode with impl "auto" at window 1 and the
ring's window, kernels/verify.py ring_verify / ring_commit_ / ring_materialize_, as
replayssm_sglang/sglang_hooks/pool.py calls them) run on small CPU tensors with real head shapes, every
``*_kernel`` object of the kernel modules replaced by a recorder (``kernel[grid](...)`` records the call,
launches nothing). GPU-only choices are taken as on the H200: PDL on (decode_v3.pdl_available) and verify's
tf32x3 / tf32 dot precision (verify.default_precision). Each recorded call is bound by the kernel's own JIT
binder against the CUDA backend for sm_90 (same signature, constexprs, 16-divisibility attributes and options
as a launch on the GPU), the distinct configurations compiled with triton.compile in worker processes.

TRITON_INTERPRET must be unset in this process (the kernels must be JITFunctions, not the interpreter's):
run it as a script (tests/test_compile_sm90.py does, in a subprocess). Usage:

    python scripts/compile_configs.py [--list] [--jobs N] [--only SUBSTR] [--json PATH]

Exit status 1 when any configuration fails to compile (each failure printed with its kernel and config).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import importlib
import json
import multiprocessing
import os
import sys
import time
import traceback
from dataclasses import dataclass, field

if os.environ.get("TRITON_INTERPRET") == "1":
    if "triton" in sys.modules:
        raise RuntimeError("compile_configs needs TRITON_INTERPRET unset before triton is imported "
                           "(run it as a subprocess)")
    os.environ.pop("TRITON_INTERPRET")

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
DEVICE_TRITON = "3.6.0"  # the H200 image's Triton (docs/benchmarks.md): register counts match it, not other versions
KERNEL_MODULES = ("decode", "decode_v2", "decode_v3", "decode_w1", "verify")
# real head shapes: Qwen3-Next GDN and Kimi-Linear KDA layers
LAYERS = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}
L_RING = 16
T_VERIFY = 4
DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class Scenario:
    """One server situation: layer kind, pool dtypes, read copy, window and what the call passes."""

    op: str  # "decode" (replay_decode, impl auto) or "verify" (ring_verify + ring_commit_ + ring_materialize_)
    kind: str
    state: str  # "fp32" / "bf16"
    rec: str  # record dtype ("fp32" / "bf16")
    read: str = "same"  # read copy: "same" / "bf16" / "fp8_e4m3"
    L: int = L_RING  # decode window (1: w1, else v3 under impl auto)
    forced: bool = True
    lower_bound: float | None = None
    impl: str = "auto"
    kda_keys: str = "raw"  # the ring's KDA key records (ring.Ring.kda_keys)
    T: int = T_VERIFY  # verify: drafts per step (KDA's pair loop from T = 8, verify.VERIFY_TUNED)
    v3_opts: tuple = ()  # opt-in launch options as (name, value) pairs (decode: replay_decode's v3_opts; verify:
    # ring_verify's keyword arguments)

    @property
    def label(self) -> str:
        s = f"{self.op} {self.kind} state={self.state} rec={self.rec} read={self.read}"
        if self.op == "decode":
            s += f" L={self.L} impl={self.impl} forced={self.forced}"
        else:
            s += f" T={self.T}"
        if self.kda_keys != "raw":
            s += f" keys={self.kda_keys}"
        if self.lower_bound is not None:
            s += f" lower_bound={self.lower_bound}"
        if self.v3_opts:
            s += " " + " ".join(f"{k}={v}" for k, v in self.v3_opts)
        return s


def server_scenarios() -> list[Scenario]:
    """What the server launches: GDN and KDA; fp32 pools (fp32 records, as pool.record_dtype_for) with read copy
    same / bf16 / fp8_e4m3; bf16 pools with bf16 records (the server's) and fp32 records, read copy same / fp8
    (a bf16 copy of a bf16 state is no copy: pool.effective_read_dtype); windows 1 (w1) and 16 (v3: the
    server's window for fp32 pools at B > 64, bf16 only with REPLAYSSM_DECODE_WINDOW); forced flags given (track
    interval set) and, for the plain fp32 ring, not; KDA with and without the safe-gate lower bound; verify T=4,
    and T=8 for fp32 pools (KDA's pair loop: verify.VERIFY_TUNED["kda"]["pair_loop_min_T"]).
    Plus one v1 and one v2 decode (impl forced; not launched by the server, compiled so they cannot rot), and GDN's
    opt-in tile_mma (the tile's dots on the tensor cores) on the fp8 read copy, KDA's bf16 copy with the
    CUDA-core tile (its launch before session 21, opt-out), the opt-in row_order "flush_first" (GDN without and
    with the bf16 copy, KDA with predecayed keys), the opt-in pre_order "rows" (KDA with predecayed keys),
    verify's opt-in row_order "rows" (GDN and KDA) and decode's opt-in self_pre (GDN, fp32 and bf16 records)."""
    out: list[Scenario] = []
    pools = [("fp32", "fp32", r) for r in ("same", "bf16", "fp8_e4m3")]
    pools += [("bf16", "bf16", r) for r in ("same", "fp8_e4m3")] + [("bf16", "fp32", "same")]
    for kind in ("gdn", "kda"):
        for state, rec, read in pools:
            for L in (1, L_RING):
                out.append(Scenario("decode", kind, state, rec, read, L))
            out.append(Scenario("verify", kind, state, rec, read))
        out.append(Scenario("decode", kind, "fp32", "fp32", "same", L_RING, forced=False))
        out.append(Scenario("decode", kind, "fp32", "fp32", "same", 1, forced=False))
    for L in (1, L_RING):
        out.append(Scenario("decode", "kda", "fp32", "fp32", "same", L, lower_bound=-5.0))
    out.append(Scenario("verify", "kda", "fp32", "fp32", "same", lower_bound=-5.0))
    for kind in ("gdn", "kda"):  # eight drafts per step (--speculative-num-draft-tokens 8)
        out.append(Scenario("verify", kind, "fp32", "fp32", "same", T=2 * T_VERIFY))
    out.append(Scenario("decode", "kda", "fp32", "fp32", "fp8_e4m3", L_RING, lower_bound=-5.0))
    for impl in ("v1", "v2"):
        out.append(Scenario("decode", "gdn", "fp32", "fp32", "same", L_RING, impl=impl))
    # KDA rings with predecayed key records (decode v3 and w1; fp32 pools, read copy same / bf16)
    for read in ("same", "bf16"):
        for L in (1, L_RING):
            out.append(Scenario("decode", "kda", "fp32", "fp32", read, L, kda_keys="predecayed"))
    # a longer window (--linear-replayssm-cache-len 32): the ring's record tiles double (BC 16 -> 32)
    out.append(Scenario("decode", "gdn", "fp32", "fp32", "same", 2 * L_RING))
    out.append(Scenario("decode", "kda", "fp32", "fp32", "same", 2 * L_RING, kda_keys="predecayed"))
    # the tile's C q / C k as tensor-core products (decode_v3 tile_mma): V3_TUNED's for bf16 states and the bf16
    # copies (above); opt-in for the fp8 copy (slower there, session 19)
    out.append(Scenario("decode", "gdn", "fp32", "fp32", "fp8_e4m3", L_RING, v3_opts=(("tile_mma", True),)))
    # KDA's bf16 copy with the CUDA-core tile (its default until session 21; opt-out now)
    out.append(Scenario("decode", "kda", "fp32", "fp32", "bf16", L_RING, kda_keys="predecayed",
                        v3_opts=(("tile_mma", False),)))
    # the main launch's rows outermost, the checkpoint-writing rows first (decode_v3 row_order, opt-in, session 22)
    out.append(Scenario("decode", "gdn", "fp32", "fp32", "same", L_RING, v3_opts=(("row_order", "flush_first"),)))
    out.append(Scenario("decode", "gdn", "fp32", "fp32", "bf16", L_RING, v3_opts=(("row_order", "flush_first"),)))
    out.append(Scenario("decode", "kda", "fp32", "fp32", "same", L_RING, kda_keys="predecayed",
                        v3_opts=(("row_order", "flush_first"),)))
    # the pre launch's rows outermost (decode_v3 pre_order, opt-in, session 23), and the verify step's (ring_verify
    # row_order, opt-in, session 23)
    out.append(Scenario("decode", "kda", "fp32", "fp32", "same", L_RING, kda_keys="predecayed",
                        v3_opts=(("pre_order", "rows"),)))
    for kind in ("gdn", "kda"):
        out.append(Scenario("verify", kind, "fp32", "fp32", "same", v3_opts=(("row_order", "rows"),)))
    # the pre launch's work in every main program (decode_v3 self_pre, opt-in, session 28), fp32 and bf16 records
    for rec in ("fp32", "bf16"):
        out.append(Scenario("decode", "gdn", "fp32", rec, "same", L_RING, v3_opts=(("self_pre", True),)))
    return out


# ---------------------------------------------------------------------------------------------------------------
# recording the launches
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Launch:
    kernel: JITFunction
    grid: tuple
    args: tuple
    kwargs: dict
    scenario: str


class _Recorder:
    def __init__(self, kernel: JITFunction, log: list, scenario: list):
        self.kernel, self.log, self.scenario = kernel, log, scenario

    def __getitem__(self, grid):
        def record(*args, **kwargs):
            self.log.append(Launch(self.kernel, grid, args, kwargs, self.scenario[0]))
            return None

        return record


def _modules():
    return [importlib.import_module(f"replayssm_sglang.kernels.{m}") for m in KERNEL_MODULES]


@contextlib.contextmanager
def recording(log: list, scenario: list):
    """Every ``*_kernel`` JITFunction bound in the kernel modules replaced by a recorder (restored after), and
    the GPU-only choices taken as on the H200 (PDL on; the launches' register caps; verify's CUDA dot precision)."""
    mods = _modules()
    saved = []
    try:
        for m in mods:
            for name, obj in list(vars(m).items()):
                if isinstance(obj, JITFunction) and name.endswith("_kernel"):
                    saved.append((m, name, obj))
                    setattr(m, name, _Recorder(obj, log, scenario))
                elif isinstance(obj, _Recorder):
                    raise RuntimeError(f"{m.__name__}.{name} is already recording")
        from replayssm_sglang.kernels import decode_v3, verify

        for m, name, fn in ((decode_v3, "pdl_available", lambda device: True),
                            (decode_v3, "compiled_for_cuda", lambda device: True),  # (register caps: maxnreg)
                            (verify, "default_precision",
                             lambda device, state_dtype=torch.float32:
                             "tf32x3" if state_dtype == torch.float32 else "tf32")):
            saved.append((m, name, getattr(m, name)))
            setattr(m, name, fn)
        yield
    finally:
        for m, name, obj in reversed(saved):
            setattr(m, name, obj)


def _kernel_modules_are_jit():
    for m in _modules():
        for name, obj in vars(m).items():
            if name.endswith("_kernel") and callable(obj) and not isinstance(obj, JITFunction):
                raise RuntimeError(f"{m.__name__}.{name} is {type(obj).__name__}, not a JITFunction "
                                   "(TRITON_INTERPRET set when the kernels were imported?)")


def run_scenario(sc: Scenario, log: list, label: list) -> None:
    """Call the launch functions as the server does, on CPU tensors (nothing runs: the kernels record)."""
    from replayssm_sglang import ring as ringmod
    from replayssm_sglang.kernels.decode import replay_decode
    from replayssm_sglang.kernels.verify import ring_commit_, ring_materialize_, ring_verify

    d = LAYERS[sc.kind]
    H, HV, K, V = d["H"], d["HV"], d["K"], d["V"]
    GK = 1 if sc.kind == "gdn" else K
    B, slots, rows = 2, 3, 4
    T = sc.T if sc.op == "verify" else 1
    ring_L = sc.L if sc.op == "decode" and sc.L > 1 else L_RING  # the ring holds the decode window
    lay = ringmod.RingLayout.for_layer(sc.kind, L=ring_L, H=H, HV=HV, K=K, V=V, T_max=max(T, T_VERIFY))
    ring = lay.allocate(rows, record_dtype=DTYPE[sc.rec], read_dtype=sc.read, kda_keys=sc.kda_keys)
    state = torch.zeros(slots, HV, V, K, dtype=DTYPE[sc.state])
    N = B * T
    act = torch.bfloat16  # activations (mixed_qkv, a, b) as the models run them
    mixed = torch.zeros(N, 2 * H * K + HV * V, dtype=act)
    a = torch.zeros(N, HV * GK, dtype=act)
    b = torch.zeros(N, HV, dtype=act)
    A_log = torch.zeros(HV, dtype=torch.float32)
    # Qwen3-Next's dt_bias is a model-dtype (bf16) parameter; Kimi's is fp32
    dt_bias = torch.zeros(HV * GK, dtype=torch.bfloat16 if sc.kind == "gdn" else torch.float32)
    slot_idx = torch.tensor([0, 2], dtype=torch.int32)  # SGLang's mamba cache indices (int32)
    ring_idx = torch.tensor([1, 3], dtype=torch.int64)  # forward_batch.req_pool_indices (int64)
    scale = K ** -0.5
    label[0] = sc.label
    if sc.op == "decode":
        forced = torch.zeros(B, dtype=torch.int32) if sc.forced else None  # flush.forced_flush_mask: int32
        out = torch.empty(B, 1, HV, V, dtype=act)
        replay_decode(sc.kind, mixed, a, b, A_log, dt_bias, state, ring, slot_idx, out=out, forced=forced,
                      scale=scale, lower_bound=sc.lower_bound, L=sc.L, impl=sc.impl,
                      ring_idx=ring_idx, **({"v3_opts": dict(sc.v3_opts)} if sc.v3_opts else {}))
        return
    ring_verify(mixed, a, b, A_log, dt_bias, state, slot_idx, ring, T, scale=scale, lower_bound=sc.lower_bound,
                ring_idx=ring_idx, **dict(sc.v3_opts))
    # pool.materialize_: stacked [layers, ...] tensors, int64 indices; pool.commit_verify: flat int64 rows
    layers = 2
    temporal = torch.zeros(layers, slots, HV, V, K, dtype=DTYPE[sc.state])
    st = lambda t: torch.stack([t] * layers)  # noqa: E731
    src = slot_idx.to(torch.int64)
    ring_materialize_(temporal, st(ring.u), st(ring.k), st(ring.g), st(ring.h), lay, src, src.flip(0),
                      torch.zeros(B, dtype=torch.int64), T, ring_idx=ring_idx)
    flat = torch.arange(layers * B, dtype=torch.int64)
    ring_commit_(st(ring.h).view(-1), flat, T, L_RING, torch.ones(layers * B, dtype=torch.int32))


def all_kernels() -> set[str]:
    """Every ``*_kernel`` JITFunction defined in the kernel modules (kernels/upstream.py, SGLang's own, excluded)."""
    return {obj.fn.__qualname__ for m in _modules() for name, obj in vars(m).items()
            if isinstance(obj, JITFunction) and name.endswith("_kernel") and obj.fn.__module__ == m.__name__}


def record_all(scenarios: list[Scenario]) -> list[Launch]:
    _kernel_modules_are_jit()
    log: list[Launch] = []
    label = [""]
    with recording(log, label):
        for sc in scenarios:
            try:
                run_scenario(sc, log, label)
            except Exception as e:  # a launch function refusing a scenario is a bug in the list: say which
                raise RuntimeError(f"scenario {sc.label}: {type(e).__name__}: {e}") from e
    return log


# ---------------------------------------------------------------------------------------------------------------
# binding (as the JIT does on the GPU) and compiling
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Config:
    module: str
    name: str
    signature: dict
    constexprs: dict
    attrs: dict
    options: dict
    scenarios: list = field(default_factory=list)

    def key(self):
        return (self.module, self.name, repr(self.signature), repr(sorted(self.constexprs.items())),
                repr(sorted(self.attrs.items())), repr(sorted(self.options.items())))

    def describe(self) -> str:
        names = list(self.signature)
        const = {names[p[0]]: v for p, v in self.constexprs.items() if len(p) == 1}
        ptrs = {n: t for n, t in self.signature.items() if isinstance(t, str) and t.startswith("*")}
        opts = {k: self.options[k] for k in ("num_warps", "num_stages", "launch_pdl") if k in self.options}
        return f"{self.name} {opts} constexprs={const} pointers={ptrs}"


_BACKEND = None


def bind(launch: Launch) -> Config:
    """The JIT's own binding of this call for sm_90: signature, constexprs, divisibility attrs and options."""
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = make_backend(TARGET)
    fn = launch.kernel
    kwargs = dict(launch.kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or triton.knobs.runtime.debug
    kwargs["instrumentation_mode"] = triton.knobs.compilation.instrumentation_mode
    binder = create_function_from_signature(fn.signature, fn.params, _BACKEND)
    bound_args, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(_BACKEND, kwargs, bound_args, specialization, options)
    return Config(fn.fn.__module__, fn.fn.__qualname__, signature, constexprs, attrs, dict(options.__dict__))


def distinct_configs(launches: list[Launch]) -> list[Config]:
    seen: dict = {}
    for ln in launches:
        c = bind(ln)
        k = c.key()
        if k not in seen:
            seen[k] = c
        if ln.scenario not in seen[k].scenarios:
            seen[k].scenarios.append(ln.scenario)
    return list(seen.values())


# H100 / H200 (sm_90) per-SM limits, for the residency estimate of --resources
# (shared memory: 228 KiB per SM, of which the driver reserves 1 KiB per resident block)
SM90_REGS, SM90_SMEM, SM90_SMEM_RESERVED, SM90_WARPS, SM90_BLOCKS = 65536, 228 * 1024, 1024, 64, 32


def resident_programs(regs: int, smem: int, num_warps: int) -> int:
    """Programs (thread blocks) of one kernel resident per sm_90 SM, from its registers per thread (allocated in
    units of 8 per thread, 256 per warp), static shared memory and warps: the smallest of the four limits."""
    per_warp = -(-max(regs, 1) // 8) * 8 * 32
    by_regs = SM90_REGS // (per_warp * num_warps)
    by_smem = SM90_SMEM // (smem + SM90_SMEM_RESERVED)
    return min(by_regs, by_smem, SM90_WARPS // num_warps, SM90_BLOCKS)


def compile_config(c: Config, resources: bool = False) -> dict:
    """Compile one configuration for sm_90 (in a worker); {ok, seconds, error}, and with ``resources`` the
    registers per thread, spill-store bytes (ptxas -v), static SASS instructions, shared memory per program and
    the programs per SM those allow (resident_programs)."""
    t0 = time.time()
    try:
        fn = getattr(importlib.import_module(c.module), c.name)
        if not isinstance(fn, JITFunction):
            raise RuntimeError(f"{c.module}.{c.name} is {type(fn).__name__}, not a JITFunction")
        src = ASTSource(fn=fn, signature=c.signature, constexprs=c.constexprs, attrs=c.attrs)
        k = triton.compile(src, target=TARGET, options=c.options)
        assert k.asm.get("cubin"), "no cubin"
        res = {}
        if resources:
            from sm90_offline import sass_stats

            n_sass, _, regs, spill = sass_stats(k)
            smem, nw = int(k.metadata.shared), int(c.options.get("num_warps", 4))
            res = dict(regs=regs, spill_bytes=spill, sass=n_sass, smem=smem, num_warps=nw,
                       programs_per_sm=resident_programs(regs, smem, nw))
        return dict(ok=True, seconds=time.time() - t0, error="", **res)
    except Exception as e:
        from triton.compiler.errors import CompilationError

        msg = f"{type(e).__name__}: {e}"  # a CompilationError carries the kernel source around the error
        if not isinstance(e, CompilationError):
            msg += "\n" + traceback.format_exc(limit=4)
        return dict(ok=False, seconds=time.time() - t0, error=msg)


def _worker_init():
    os.environ.pop("TRITON_INTERPRET", None)


def compile_all(configs: list[Config], jobs: int, resources: bool = False) -> list[dict]:
    # spawn: fresh workers (no fork of a process holding LLVM state); the heaviest kernels first
    order = sorted(range(len(configs)), key=lambda i: -_cost(configs[i]))
    results: list = [None] * len(configs)
    ctx = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=ctx, initializer=_worker_init) as ex:
        futs = {ex.submit(compile_config, configs[i], resources): i for i in order}
        for f in cf.as_completed(futs):
            results[futs[f]] = f.result()
    return results


def _cost(c: Config) -> int:
    return {"replay_decode_v3_kernel": 9, "replay_decode_kernel": 8, "_ring_verify_kernel": 8,
            "replay_decode_v2_kernel": 6, "_ring_prefold_kernel": 5, "replay_decode_w1_kernel": 5,
            "_materialize_kernel": 3}.get(c.name, 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the distinct configurations, compile nothing")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--only", default="", help="compile only kernels whose name contains this")
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--resources", action="store_true",
                    help="also read each configuration's registers, spills, shared memory and the programs per SM "
                         "they allow (ptxas -v, nvdisasm; a static count, not a timing)")
    ap.add_argument("--scenarios", default="", help="only scenarios whose label contains this (e.g. 'decode gdn')")
    a = ap.parse_args(argv)
    t0 = time.time()
    if a.resources and triton.__version__ != DEVICE_TRITON:
        print(f"note: register counts from Triton {triton.__version__}; the H200 image runs {DEVICE_TRITON}, whose "
              "counts can differ by tens of registers (KDA's bf16-copy main launch: 168 here under 3.8, 200 on the "
              f"H200 and under {DEVICE_TRITON}). For counts that match the GPU: bash scripts/setup-triton36-env, then "
              ".venv-t36/bin/python scripts/compile_configs.py --resources", flush=True)
    configs = distinct_configs(record_all([sc for sc in server_scenarios() if a.scenarios in sc.label]))
    if a.only:
        configs = [c for c in configs if a.only in c.name]
    uncovered = sorted(all_kernels() - {c.name for c in configs}) if not (a.only or a.scenarios) else []
    if uncovered:
        print(f"kernels no server scenario launches (add a scenario): {', '.join(uncovered)}", flush=True)
    counts: dict[str, int] = {}
    for c in configs:
        counts[c.name] = counts.get(c.name, 0) + 1
    print(f"{len(configs)} distinct sm_90 configurations ({time.time() - t0:.1f} s to record): "
          + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())), flush=True)
    if a.list:
        for c in configs:
            print(" ", c.describe(), "<-", "; ".join(c.scenarios))
        return 0
    results = compile_all(configs, a.jobs, a.resources)
    fails = [(c, r) for c, r in zip(configs, results) if not r["ok"]]
    for c, r in zip(configs, results):
        rs = (f"  {r['regs']:3d} regs, {r['spill_bytes']} B spilled, {r['smem']:6d} B smem, {r['num_warps']} warps: "
              f"{r['programs_per_sm']:2d} per SM" if a.resources and r["ok"] else "")
        print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['seconds']:6.1f} s  {c.name}  <- {c.scenarios[0]}"
              + (f" (+{len(c.scenarios) - 1})" if len(c.scenarios) > 1 else "") + rs, flush=True)
    for c, r in fails:
        print(f"\nFAILED to compile for sm_90: {c.describe()}\n  launched by: {'; '.join(c.scenarios)}\n"
              f"  {r['error']}", flush=True)
    print(f"{len(configs) - len(fails)}/{len(configs)} compiled in {time.time() - t0:.1f} s", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(seconds=time.time() - t0, uncovered=uncovered,
                           configs=[dict(kernel=c.name, module=c.module, config=c.describe(), scenarios=c.scenarios,
                                         **r) for c, r in zip(configs, results)]), f, indent=1)
    return 1 if fails or uncovered else 0


if __name__ == "__main__":
    sys.exit(main())

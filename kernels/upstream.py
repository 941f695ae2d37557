"""Load SGLang 0.5.17's own decode kernels (the baselines) from the installed package, by path.

Importing ``sglang.kernels.ops.attention.fla.fused_recurrent`` the normal way pulls in
``sglang.srt.utils`` and with it most of SGLang's server dependencies; the two kernel files only
need ``exp`` (``tl.exp`` unless FLA_USE_FAST_OPS=1, which we do not set) and a no-op ``input_guard`` from their package.
This loader reads the installed source, binds those two names locally and executes it as a private
module (``_replayssm_upstream_<name>``), so tests and benchmarks run the pinned upstream code
without SGLang's server stack and without touching ``sys.modules['sglang...']``.
Nothing is copied: the source is read from the installed SGLang at run time.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import re
import sys
import types

_FLA = ("kernels", "ops", "attention", "fla")
_PRELUDE = {
    # op.exp is tl.exp unless FLA_USE_FAST_OPS=1; calls are rewritten to tl.exp below (an alias
    # would escape the Triton interpreter's patching of tl)
    "from sglang.kernels.ops.attention.fla.op import exp": "",
    "from sglang.kernels.ops.attention.fla.utils import input_guard":
        "input_guard = (lambda f: f)",
}
_cache: dict[str, types.ModuleType] = {}


def sglang_root() -> str:
    spec = importlib.util.find_spec("sglang")  # top-level: found without executing sglang/__init__
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("SGLang is not installed (pip install --no-deps sglang==0.5.17)")
    return list(spec.submodule_search_locations)[0]


def load(name: str) -> types.ModuleType:
    """name: 'fused_recurrent' (conventional packed decode) or
    'fused_recurrent_linear_replayssm' (upstream ReplaySSM decode)."""
    if name in _cache:
        return _cache[name]
    path = os.path.join(sglang_root(), *_FLA, name + ".py")
    with open(path) as f:
        src = f.read()
    for line, repl in _PRELUDE.items():
        src = src.replace(line, repl)
    src = re.sub(r"(?<![\w.])exp\(", "tl.exp(", src)
    if "from sglang" in src.split("@triton.jit")[0]:
        raise ImportError(f"{path}: unexpected sglang import in the module prelude; update kernels/upstream.py")
    modname = f"_replayssm_upstream_{name}"
    # Triton reads a kernel's source back through inspect/linecache: register the rewritten text
    # under its own name so that it, not the file on disk, is what gets compiled
    fname = f"<replayssm upstream {path}>"
    linecache.cache[fname] = (len(src), None, src.splitlines(True), fname)
    mod = types.ModuleType(modname)
    mod.__file__ = fname
    sys.modules[modname] = mod  # triton's JIT looks functions' globals up through their module
    exec(compile(src, fname, "exec"), mod.__dict__)
    _cache[name] = mod
    return mod


def conventional_decode(kind: str, mixed_qkv, a, b, A_log, dt_bias, state, slot_idx, out, *,
                        scale=None, lower_bound=None):
    """SGLang's conventional Triton packed decode (read, update, write the state every step)."""
    m = load("fused_recurrent")
    K = state.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    B = mixed_qkv.shape[0]
    if kind == "gdn":
        return m.fused_recurrent_gated_delta_rule_packed_decode(
            mixed_qkv, a.reshape(B, -1), b.reshape(B, -1), A_log, dt_bias, scale, state, out, slot_idx,
            use_qk_l2norm_in_kernel=True)[0]
    # use_qk_l2norm_in_kernel=True would route B >= 8 fp32 states to SGLang's CUDA row-streaming
    # kernel (JIT through tvm-ffi); the Triton path is reached by the same math with that flag off
    # only if q/k are pre-normalised, so call the Triton kernel directly here.
    HV, V, K = state.shape[-3:]
    H = (mixed_qkv.shape[1] - HV * V) // (2 * K)
    import triton
    BK = triton.next_power_of_2(K)
    BV = min(triton.next_power_of_2(V), 32)
    m.fused_recurrent_kda_packed_decode_kernel[(triton.cdiv(V, BV), B * HV)](
        mixed_qkv=mixed_qkv, a=a.reshape(B, -1), b=b.reshape(B, -1), A_log=A_log, dt_bias=dt_bias, o=out,
        h0=state, ht=state, ssm_state_indices=slot_idx, scale=scale,
        lower_bound=lower_bound if lower_bound is not None else 0.0,
        stride_mixed_qkv_tok=mixed_qkv.stride(0), stride_a_tok=a.reshape(B, -1).stride(0),
        stride_b_tok=b.reshape(B, -1).stride(0), stride_init_state_token=state.stride(0),
        stride_final_state_token=state.stride(0), stride_indices_seq=slot_idx.stride(0),
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, SOFTPLUS_THRESHOLD=20.0, USE_QK_L2NORM_IN_KERNEL=True,
        USE_LOWER_BOUND=lower_bound is not None, num_warps=1, num_stages=3)
    return out

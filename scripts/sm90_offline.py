"""Shared by scripts/sass_decode.py and scripts/sass_verify.py: compile a Triton kernel for sm_90
without a GPU and read its registers, spills and SASS with Triton's bundled ptxas and nvdisasm."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_sm90(fn, ptr: dict, const: dict, *, num_warps: int, aligned=(), **options):
    """Compile ``fn`` for sm_90: ``ptr`` maps pointer arguments to element types ("fp32", "bf16",
    "i32", ...), ``const`` gives constexpr values, "scale"/"lower_bound" are fp32 scalars and every
    other argument an i32. ``aligned`` names arguments the JIT would see as 16-divisible."""
    sig = {}
    for n in fn.arg_names:
        if n in ptr:
            sig[n] = "*" + ptr[n]
        elif n in const:
            sig[n] = "constexpr"
        elif n in ("scale", "lower_bound"):
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
    const = {k: v for k, v in const.items() if k in fn.arg_names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n in aligned and n in sig}
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs) if attrs else \
        ASTSource(fn=fn, signature=sig, constexprs=const)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=num_warps, **options))


def sass_stats(k):
    """(static SASS instructions per warp, {opcode: count}, registers per thread, spill-store bytes)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(k.asm["cubin"])
    r = subprocess.run([os.path.join(BIN, "nvdisasm"), "-c", f.name], capture_output=True, text=True)
    ops: dict[str, int] = {}
    for line in r.stdout.splitlines():
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_]+)", line)
        if m:
            ops[m.group(2)] = ops.get(m.group(2), 0) + 1
    with tempfile.NamedTemporaryFile(suffix=".ptx", delete=False) as f:
        f.write(k.asm["ptx"].encode())
    r = subprocess.run([os.path.join(BIN, "ptxas"), "-v", "--gpu-name", "sm_90a", f.name, "-o", os.devnull],
                       capture_output=True, text=True)
    regs = re.search(r"Used (\d+) registers", r.stderr)
    spill = re.search(r"(\d+) bytes spill stores", r.stderr)
    return sum(ops.values()), ops, int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else -1

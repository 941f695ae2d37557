"""gdn_main.cu's main and pre launches run on the CPU (no GPU): the CUDA source compiled by g++ against a small
stand-in for the CUDA features it uses (kernels/emu/cuda_emu.h: one OS thread per CUDA thread, warp shuffles and
__syncwarp as barriers of the warp's 32 threads, blocks one after another), so that its indexing, control flow and
arithmetic can be checked against the float64 reference in CI, where the float64 GPU cases run only on an H200.

It is a check, not a fast path: a block of 128 threads costs a few milliseconds, so tests keep to a few value heads
and rows; one launch at a time per process. It cannot show what needs a GPU: races between warps or blocks, PDL
(USE_PDL, TRIGGER_POST and LEAD_PDL are 0 here), memory ordering. Numerics differ from the GPU's by a few ulp
(accurate expf / logf for __expf / __logf; no FMA contraction). The shapes that read the tile with bulk copies
(load_reg 0, PTX assembly) do not build.

cuda_main.launch and cuda_main.pre_launch come here for CPU tensors where REPLAYSSM_CUDA_EMULATE=1
(cuda_main.emulated; unavailable_reason and pre_unavailable_reason then let the CPU run them); ``build`` returns the
shared library for one set of defines (cached on disk by source and defines)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE / "gdn_main.cu"
SHIM = HERE / "emu" / "cuda_emu.h"
SMEM_BYTES = 1 << 17  # the runner's stand-in for a block's dynamic shared memory (emu_smem)

# the main launch's parameters in gdn_main.cu's order (replay_gdn_main), as C types of the build's defines
_MAIN_PARAMS = ("const X_T*", "const A_T*", "const B_T*", "const ALOG_T*", "const DTB_T*", "OUT_T*", "ST_T*", "U_T*",
                "SP_CONST KR_T*", "SP_CONST float*", "const int*", "const int*", "const SLOT_T*", "const FORCED_T*",
                "const RIDX_T*", "const float*", "const float*", "const int*", "const float*", "float", "float", "int",
                "long long", "long long", "long long", "long long", "RC_T*", "float*", "const int*",
                "const unsigned int*",  # (rc_lean 2's operand, qk_frag)
                "unsigned short*", "SP_CONST unsigned short*",  # (REC_SPLIT's low planes: ring_u_lo, ring_k_lo)
                "const int*")  # (FLUSH_FIRST's row order)

# the pre launches' parameters (replay_gdn_pre; replay_kda_pre has gts, ovf and min_g besides)
_PRE_HEAD = ("const X_T*", "const A_T*", "const ALOG_T*", "const DTB_T*", "KR_T*", "float*", "const int*", "const int*",
             "const SLOT_T*", "const FORCED_T*", "const RIDX_T*", "float*", "float*")
_PRE_PARAMS = {0: _PRE_HEAD + ("float", "float", "int", "long long", "long long", "const int*",
                                "unsigned int*", "const ST_T*", "const RC_T*", "unsigned short*", "int*", "int"),
               1: _PRE_HEAD + ("float*", "int*", "float", "float", "float", "int", "long long", "long long", "const int*",
                               "unsigned int*", "const ST_T*", "const RC_T*", "unsigned short*", "int*", "int")}
# (the tail: rc_lean 2's operand, qk_frag; PRE_PF's tiles, state and rc; REC_SPLIT's low plane of the keys, ring_k_lo;
# FLUSH_FIRST's row order and the batch's rows)

_RUNNER = r"""
#include "cuda_emu.h"
#include <memory>
#include <thread>
#include <vector>
thread_local emu_dim3 threadIdx, blockIdx;
EmuWarp* emu_warps = nullptr;
std::barrier<>* emu_block_bar = nullptr;
alignas(128) unsigned char emu_smem[%(SMEM)s];
#include "kernel_src.cu"

template <typename F>
static int emu_grid(int gx, int gy, int gz, int nthreads, F kernel) {
    if (nthreads % 32 || nthreads <= 0) return 1;
    const int nw = nthreads / 32;
    std::unique_ptr<EmuWarp[]> warps(new EmuWarp[nw]);
    std::barrier<> block_bar(nthreads);
    emu_warps = warps.get();
    emu_block_bar = &block_bar;
    std::vector<std::thread> threads;
    for (int t = 0; t < nthreads; ++t)
        threads.emplace_back([=, &block_bar] {
            threadIdx = {static_cast<unsigned>(t), 0u, 0u};
            for (int z = 0; z < gz; ++z)
                for (int y = 0; y < gy; ++y)
                    for (int x = 0; x < gx; ++x) {
                        blockIdx = {static_cast<unsigned>(x), static_cast<unsigned>(y), static_cast<unsigned>(z)};
                        kernel();
                        block_bar.arrive_and_wait();  // (the block's shared memory is the next block's)
                    }
        });
    for (auto& th : threads) th.join();
    return 0;
}

extern "C" int emu_run_main(int gx, int gy, int gz, int nthreads, void** p) {
    return emu_grid(gx, gy, gz, nthreads, [p] { replay_gdn_main(%(ARGS)s); });
}
%(PRE)s
"""


def _key(defs: dict) -> str:
    h = hashlib.sha1(SRC.read_bytes() + SHIM.read_bytes() + _RUNNER.encode())
    h.update(repr(sorted(defs.items())).encode())
    return h.hexdigest()[:20]


def cache_dir() -> Path:
    return Path(os.environ.get("REPLAYSSM_EMU_DIR", Path.home() / ".cache" / "replayssm_sglang" / "emu"))


def source_for_cpu() -> str:
    """gdn_main.cu as g++ takes it: the CUDA headers replaced by the stand-in, the dynamic shared memory a buffer."""
    src = SRC.read_text()
    for inc in ("#include <cuda_bf16.h>", "#include <cuda_fp16.h>"):
        if inc not in src:
            raise RuntimeError(f"gdn_main.cu no longer has {inc!r}: update kernels/cuda_emu.py")
        src = src.replace(inc, "")
    dyn = "extern __shared__ __align__(128) unsigned char smem_raw[];"
    if dyn not in src:
        raise RuntimeError("gdn_main.cu's dynamic shared memory is declared differently: update kernels/cuda_emu.py")
    return src.replace(dyn, "unsigned char* smem_raw = emu_smem;")


_LIBS: dict = {}


def build(defs: dict) -> ctypes.CDLL:
    """The shared library running replay_gdn_main for these defines (g++, cached on disk and in the process)."""
    key = _key(defs)
    if key in _LIBS:
        return _LIBS[key]
    out = cache_dir() / f"gdn_main_emu-{key}.so"
    if not defs["LOAD_REG"]:
        raise RuntimeError("the CPU emulation runs the shapes that read the tile into registers (load_reg 1) only: the "
                           "others copy it with PTX bulk copies")
    if not out.exists():
        gxx = shutil.which(os.environ.get("CXX", "g++"))
        if gxx is None:
            raise RuntimeError("the CPU emulation of the CUDA main launch needs g++ (or CXX)")
        out.parent.mkdir(parents=True, exist_ok=True)
        def unpack(types):  # (cuLaunchKernelEx's params: p[i] points at the i-th argument)
            return ", ".join(f"*reinterpret_cast<{t}*>(p[{i}])" if t in ("float", "int", "long long")
                             else f"static_cast<{t}>(*reinterpret_cast<void**>(p[{i}]))" for i, t in enumerate(types))

        args = unpack(_MAIN_PARAMS)
        pre = ""
        if defs["CAP_"] <= 16 and defs["BC_"] <= 16:  # (gdn_main.cu builds its pre launch there only)
            name = "replay_kda_pre" if defs["IS_KDA"] else "replay_gdn_pre"
            call = f'{name}({unpack(_PRE_PARAMS[int(defs["IS_KDA"])])})'
            pre = (f'extern "C" int emu_run_pre(int gx, int gy, void** p) {{\n'
                   f'    return emu_grid(gx, gy, 1, 32, [p] {{ {call}; }});\n}}')
        with tempfile.TemporaryDirectory() as td:
            (Path(td) / "kernel_src.cu").write_text(source_for_cpu())
            (Path(td) / "runner.cpp").write_text(_RUNNER.replace("%(ARGS)s", args).replace("%(PRE)s", pre)
                                                       .replace("%(SMEM)s", str(SMEM_BYTES)))
            shutil.copy(SHIM, Path(td) / "cuda_emu.h")
            tmp = Path(td) / "lib.so"
            cmd = [gxx, "-std=c++20", "-O1", "-ffp-contract=off", "-fno-strict-aliasing", "-fPIC", "-shared",
                   "-pthread", "-w",
                   "-o", str(tmp), str(Path(td) / "runner.cpp")]
            cmd[3:3] = ([f"-D{k}={v}" for k, v in defs.items() if k not in ("USE_PDL", "TRIGGER_POST", "LEAD_PDL")]
                        + ["-DUSE_PDL=0", "-DTRIGGER_POST=0", "-DLEAD_PDL=0"])  # (no PDL: one launch at a time)
            r = subprocess.run(cmd, capture_output=True, text=True, cwd=td)
            if r.returncode != 0:
                raise RuntimeError(f"g++ could not build the CPU emulation: {r.stderr[-3000:]}")
            shutil.move(str(tmp), out)
    lib = ctypes.CDLL(str(out))
    lib.emu_run_main.argtypes = [ctypes.c_int] * 4 + [ctypes.c_void_p]
    lib.emu_run_main.restype = ctypes.c_int
    _LIBS[key] = lib
    return lib


def run_pre(defs: dict, grid: tuple, params) -> None:
    """One pre launch on the CPU (replay_gdn_pre or replay_kda_pre of this build): grid (key heads, B), one warp per
    block, params as cuLaunchKernelEx takes them."""
    lib = build(defs)
    if not hasattr(lib, "emu_run_pre"):
        raise RuntimeError("this build has no pre launch (gdn_main.cu builds it for ring capacities up to 16)")
    lib.emu_run_pre.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    if lib.emu_run_pre(int(grid[0]), int(grid[1]), ctypes.cast(params, ctypes.c_void_p)) != 0:
        raise RuntimeError("the CPU emulation refused the pre launch")


def run_main(defs: dict, grid: tuple, nthreads: int, params) -> None:
    """One main launch on the CPU: grid (x, y, z), nthreads per block, params as cuLaunchKernelEx takes them."""
    from .cuda_main import smem_bytes

    if smem_bytes(defs) > SMEM_BYTES:
        raise RuntimeError(f"the CPU emulation has {SMEM_BYTES} bytes of dynamic shared memory, the launch asks for "
                           f"{smem_bytes(defs)}")
    rc = build(defs).emu_run_main(int(grid[0]), int(grid[1]), int(grid[2]), int(nthreads),
                                  ctypes.cast(params, ctypes.c_void_p))
    if rc != 0:
        raise RuntimeError(f"the CPU emulation refused the launch ({nthreads} threads per block)")

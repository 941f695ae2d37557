#!/usr/bin/env python
"""Offline resource usage of the decode kernels for sm_90 (no GPU needed): registers, spills, SASS count.

Compiles ``kernels/decode.py``'s v1 kernel and ``kernels/decode_v2.py``'s v2 kernel with Triton for an
H100/H200 target at the real layer shapes (Qwen3-Next GDN, Kimi-Linear KDA; K = V = 128, L = 16), runs
ptxas -v and nvdisasm from Triton's bundled CUDA tools and prints, per launch config, registers per
thread, spill bytes, static SASS instructions per warp and the resident programs per SM that the
register file allows (65536 registers per SM, at most 64 warps / 32 blocks per SM). Occupancy from
registers only (shared memory is small here); a static count, not a timing: what the GPU run measures.

Usage: python scripts/sass_decode.py [--kinds gdn,kda] [--state fp32,bf16] [--v1 32:1:2] [--v2 32:4,64:4]
"""

from __future__ import annotations

import argparse
import os

from sm90_offline import compile_sm90, sass_stats

import triton  # noqa: E402

from replayssm_sglang.kernels import decode as D1  # noqa: E402
from replayssm_sglang.kernels import decode_v2 as D2  # noqa: E402

LAYERS = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}
FOLD_UNROLL = os.environ.get("V2_FOLD_UNROLL", "0") == "1"


def compile_decode(impl, kind, state, rec, cfg, L=16, act="bf16", h_rows=False):
    d = LAYERS[kind]
    K, V = d["K"], d["V"]
    HK = d["H"] if kind == "gdn" else d["HV"]
    const = dict(H=d["H"], HV=d["HV"], HK=HK, GK=1 if kind == "gdn" else K, K=K, V=V, CAP=L,
                 BK=triton.next_power_of_2(K), IS_KDA=kind == "kda", HAS_FORCED=True, USE_LOWER_BOUND=False)
    if impl == "v1":
        bv, nw, nk = cfg
        fn = D1.replay_decode_kernel
        const.update(BV=bv, BC=16, NK=nk, NPROG=(V // bv) * d["HV"], FOLD_DOT=False, DOT_PRECISION="tf32x3",
                     UPDATE_H=True)
    else:
        bv, nw = cfg
        fn = D2.replay_decode_v2_kernel
        const.update(BV=bv, BC=16, HAS_H_ROWS=h_rows, FOLD_UNROLL=FOLD_UNROLL)
    ptr = {"mixed_qkv": act, "a": act, "b": act, "A_log": "fp32", "dt_bias": "fp32", "out": act, "state": state,
           "ring_u": rec, "ring_k": rec, "ring_g": "fp32", "ring_h": "i32", "arrive": "i32", "h_rows": "i32",
           "slot_idx": "i32", "forced": "i32"}
    # what the JIT specialises at a real launch: 16-byte aligned pointers, strides divisible by 16
    aligned = set(ptr) | {"stride_qkv", "stride_a", "stride_b", "stride_slot"}
    return compile_sm90(fn, ptr, const, num_warps=nw, aligned=aligned, num_stages=1)


def stats(k):
    n, _, regs, spill = sass_stats(k)
    return n, regs, spill


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="gdn,kda")
    ap.add_argument("--state", default="fp32,bf16")
    ap.add_argument("--rec", default="bf16")
    ap.add_argument("--v1", default="32:1:2", help="BV:num_warps:K-chunks triples")
    ap.add_argument("--v2", default=D2.V2_SWEEP.replace("x", ":"), help="BV:num_warps pairs")
    a = ap.parse_args()
    for kind in a.kinds.split(","):
        for state in a.state.split(","):
            todo = [("v1", tuple(int(x) for x in c.split(":"))) for c in a.v1.split(",") if c]
            todo += [("v2", tuple(int(x) for x in c.split(":"))) for c in a.v2.split(",") if c]
            for impl, cfg in todo:
                try:
                    k = compile_decode(impl, kind, state, a.rec, cfg)
                except Exception as e:  # noqa: BLE001
                    print(f"{kind} {state} {impl} {cfg}: compile failed {type(e).__name__}: {str(e)[:200]}")
                    continue
                n, regs, spill = stats(k)
                nw = cfg[1]
                per_sm = min(65536 // max(1, regs * 32 * nw), 64 // nw, 32) if regs > 0 else -1
                progs = LAYERS[kind]["V"] // cfg[0]
                print(f"{kind} {state:4s} state, {a.rec} rec, {impl} BV={cfg[0]} warps={nw}"
                      f"{' NK=' + str(cfg[2]) if impl == 'v1' else ''}: {regs} regs, {spill} B spilled, "
                      f"{n} SASS/warp, {per_sm} programs/SM ({per_sm * nw} warps), {progs} programs per head",
                      flush=True)


if __name__ == "__main__":
    main()

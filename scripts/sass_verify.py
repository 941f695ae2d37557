#!/usr/bin/env python
"""Offline instruction count of the verify kernel for sm_90 (no GPU needed).

Compiles ``kernels/verify.py``'s ``_ring_verify_kernel`` with Triton for an H100/H200 target, runs
ptxas -v (registers, spills) and nvdisasm (SASS) from Triton's bundled CUDA tools, and prints the
static SASS count per warp with an issue-bound estimate at B=256 (warp instructions / (132 SMs x 4
schedulers x 1.98 GHz)). With the V loop unrolled or absent the static count is the dynamic one
up to the loop trip count, which is printed. A lower bound only: it says when a formulation is
hopeless (docs/design.md, "Kernel layout and what the GPU said"), not how fast a good one runs.

Usage: python scripts/sass_verify.py [--kinds gdn,kda] [--T 4,8] [--precision tf32x3,tf32]
"""

from __future__ import annotations

import argparse

from sm90_offline import compile_sm90, sass_stats

import triton  # noqa: E402

from replayssm_sglang.kernels import verify as V  # noqa: E402

LAYERS = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}


def compile_verify(kind, T, precision, block_v, num_warps, state="fp32", act="bf16", rec="fp32", L=16, out_precision=None):
    d = LAYERS[kind]
    BV = min(block_v, d["V"])
    const = dict(T=T, H=d["H"], HV=d["HV"], K=d["K"], V=d["V"], BK=triton.next_power_of_2(d["K"]), BV=BV,
                 BC=max(16, triton.next_power_of_2(L)), BT=max(8, triton.next_power_of_2(T)), VS=d["V"],
                 NLOG=max(1, (T - 1).bit_length()), IS_KDA=kind == "kda", USE_LOWER_BOUND=False,
                 SOFTPLUS_THRESHOLD=20.0, DOT_PRECISION=precision,
                 OUT_PRECISION=out_precision or ("tf32" if precision in ("tf32x3", "tf32") else precision))
    ptr = {"mixed": act, "a": act, "b": act, "A_log": "fp32", "dt_bias": "fp32", "out": act, "state": state,
           "ring_u": rec, "ring_k": rec, "ring_g": "fp32", "ring_h": "i32", "slot_idx": "i32"}
    fn = V._ring_verify_kernel
    k = compile_sm90(fn, ptr, const, num_warps=num_warps)
    return k, d["V"] // BV


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kinds", default="gdn,kda")
    ap.add_argument("--T", default="4,8")
    ap.add_argument("--precision", default="tf32x3,tf32")
    ap.add_argument("--configs", default="64:4,32:4", help="BV:num_warps pairs")
    ap.add_argument("--B", type=int, default=256)
    a = ap.parse_args()
    for kind in a.kinds.split(","):
        for T in [int(x) for x in a.T.split(",")]:
            for prec in a.precision.split(","):
                for cfg in a.configs.split(","):
                    bv, nw = (int(x) for x in cfg.split(":"))
                    k, trips = compile_verify(kind, T, prec, bv, nw)
                    n, ops, regs, spill = sass_stats(k)
                    warps = a.B * LAYERS[kind]["HV"] * nw
                    us = n * warps / (132 * 4 * 1.98e9) * 1e6
                    top = ", ".join(f"{o} {c}" for o, c in sorted(ops.items(), key=lambda x: -x[1])[:5])
                    print(f"{kind} T={T} {prec:6s} BV={bv} warps={nw}: {n} SASS/warp (V loop x{trips}), "
                          f"{regs} regs, {spill} B spilled; issue-bound >= {us:.0f} us at B={a.B} (static); {top}")


if __name__ == "__main__":
    main()

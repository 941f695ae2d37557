#!/usr/bin/env python
"""How fast can the checkpoint fold run on this GPU, as a kernel of its own? (a probe, issue 3)

The decode step that writes a checkpoint costs GDN 508 us and KDA 593 us at B = 256 on the H200 (step split,
benchmarks/results/kernels-split-20261201-0039-ckpt.*), against 142-146 us for a step that only reads it and 273 us
for SGLang's conventional step, which reads AND writes the same fp32 state. Of the 508, about 366 us are the fold
pass (the tile re-read, the rank-L update from the ring's records, the write): 2.9 TB/s where the conventional step
moves 3.9. This probe times the fold pass alone, outside decode v3 and its register budget, for several tile shapes,
warp counts and ways to do the rank-L update, beside a plain read-modify-write of the same state (the copy-speed
floor of any fold), so that a fold launch can be sized from measurements rather than guesses.

Work per (row, value head) tile: S <- S * e^{g} + U^T K over L = 16 records (U [L, V] corrections, K [L, K] keys
already decayed), fp32 state [B, HV, V, K] and records, GDN/KDA real sizes (HV = 32, K = V = 128). Modes:
  rmw     S <- S * e^{g}                                  (bytes floor: read + write the state)
  dot3    the update as one tl.dot, three tf32 passes     (decode v3's default fold precision, "tf32x3")
  ieee    the update as one tl.dot in fp32 FMA            ("ieee")
  rank1   L rank-1 FMA updates, one record at a time      (decode v3's record-loop fold)
Layouts: the whole [BV, K] tile per program, or K in chunks of BKC with the chunk loop software-pipelined over
``stages`` (asynchronous copies). Every configuration is checked against a float64 reference on the same inputs
(rms ratio < 1e-5; NaN fails) before it is timed; timing: triton.testing.do_bench (median of repeats).

Usage (GPU): python scripts/bench_fold.py [--B 256] [--quick] [--out PATH.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import triton
import triton.language as tl

MODES = ("rmw", "dot3", "ieee", "rank1")


@triton.jit
def fold_probe_kernel(S, U, KR, G, V: tl.constexpr, K: tl.constexpr, L: tl.constexpr, BV: tl.constexpr,
                      BKC: tl.constexpr, MODE: tl.constexpr, STAGES: tl.constexpr):
    """One program per (V-tile, row x head): S[bh, V-tile, :] <- S e^{G[bh]} + U[bh]^T KR[bh] (MODE 0: no update;
    1: tl.dot tf32x3; 2: tl.dot ieee; 3: rank-1 updates). BKC < K: the K chunks in a pipelined loop."""
    i_v = tl.program_id(0)
    i_bh = tl.program_id(1).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    o_l = tl.arange(0, L)
    e = tl.exp(tl.load(G + i_bh))
    p_s = S + i_bh * V * K + o_v[:, None] * K
    if MODE == 1 or MODE == 2:
        u = tl.load(U + i_bh * L * V + o_l[None, :] * V + o_v[:, None])  # [BV, L]
    NC: tl.constexpr = K // BKC
    for c in tl.range(0, NC, num_stages=STAGES):
        o_k = c * BKC + tl.arange(0, BKC)
        C = tl.load(p_s + o_k[None, :]) * e
        if MODE == 1:
            kk = tl.load(KR + i_bh * L * K + o_l[:, None] * K + o_k[None, :])  # [L, BKC]
            C = tl.dot(u, kk, acc=C, input_precision="tf32x3")
        elif MODE == 2:
            kk = tl.load(KR + i_bh * L * K + o_l[:, None] * K + o_k[None, :])
            C = tl.dot(u, kk, acc=C, input_precision="ieee")
        elif MODE == 3:
            for j in range(L):
                uj = tl.load(U + (i_bh * L + j) * V + o_v)
                kj = tl.load(KR + (i_bh * L + j) * K + o_k)
                C += uj[:, None] * kj[None, :]
        tl.store(p_s + o_k[None, :], C)


def reference(S, U, KR, G, mode):
    e = torch.exp(G.double())[:, None, None]
    out = S.double() * e
    if mode != "rmw":
        out = out + torch.einsum("blv,blk->bvk", U.double(), KR.double())
    return out


def run(B=256, HV=32, V=128, K=128, L=16, quick=False, dev="cuda"):
    n = B * HV
    gen = torch.Generator(device=dev).manual_seed(0)
    S0 = torch.randn(n, V, K, device=dev, generator=gen) * 0.1
    U = torch.randn(n, L, V, device=dev, generator=gen) * 0.1
    KR = torch.randn(n, L, K, device=dev, generator=gen) / K ** 0.5
    G = -torch.rand(n, device=dev, generator=gen) * 0.1
    state_bytes = S0.numel() * 4
    rec_bytes = (U.numel() + KR.numel()) * 4
    configs = []
    for mode in MODES:
        for bv, nw in ((8, 1), (16, 1), (32, 1), (32, 2), (32, 4), (64, 2), (64, 4), (128, 4), (128, 8)):
            if mode in ("dot3", "ieee") and bv < 16:
                continue
            for bkc, st in ((K, 1), (32, 3), (64, 2)):
                if bv > V or bkc > K:
                    continue
                if quick and (nw > 2 or bkc == 64):
                    continue
                if mode == "rank1" and bkc == K and bv >= 64:
                    continue  # [64+, 128] fp32 tiles in registers per record: spills
                configs.append((mode, bv, nw, bkc, st))
    rows = []
    ref_cache = {}
    t0 = time.time()
    for mode, bv, nw, bkc, st in configs:
        S = S0.clone()
        grid = (V // bv, n)
        kw = dict(V=V, K=K, L=L, BV=bv, BKC=bkc, MODE=MODES.index(mode), STAGES=st, num_warps=nw)
        row = dict(mode=mode, BV=bv, warps=nw, BKC=bkc, stages=st)
        try:
            fold_probe_kernel[grid](S, U, KR, G, **kw)
            if dev == "cuda":
                torch.cuda.synchronize()
            key = "rmw" if mode == "rmw" else "fold"
            if key not in ref_cache:
                ref_cache[key] = reference(S0, U, KR, G, mode)
            ref = ref_cache[key]
            err = float(((S.double() - ref).norm() / ref.norm()).item())
            row["rms_ratio"] = err
            if not (err < 1e-5):  # NaN fails too
                row["error"] = f"rms ratio {err:.2e} against float64"
            elif dev != "cuda":
                pass  # (the interpreter: checked, not timed)
            else:
                S.copy_(S0)
                ms = triton.testing.do_bench(lambda: fold_probe_kernel[grid](S, U, KR, G, **kw), warmup=5, rep=40)
                row["us"] = ms * 1e3
                moved = 2 * state_bytes + (0 if mode == "rmw" else rec_bytes)
                row["TB_s"] = moved / (ms * 1e-3) / 1e12
        except Exception as exc:  # a configuration that does not compile is reported, not fatal
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        rows.append(row)
        print(f"{mode:5s} BV {bv:3d} x{nw} BKC {bkc:3d} st {st}: "
              + (f"{row['us']:7.1f} us {row['TB_s']:.2f} TB/s (rms {row['rms_ratio']:.1e})" if "us" in row
                 else row.get("error", f"checked (rms {row.get('rms_ratio', float('nan')):.1e})")), flush=True)
    return dict(B=B, HV=HV, V=V, K=K, L=L, state_MB=state_bytes / 1e6, records_MB=rec_bytes / 1e6,
                seconds=time.time() - t0, rows=rows)


def table(res) -> str:
    best = {}
    for r in res["rows"]:
        if "us" in r and (r["mode"] not in best or r["us"] < best[r["mode"]]["us"]):
            best[r["mode"]] = r
    lines = ["| mode | best config (BV x warps, K chunk, stages) | us | TB/s |", "|---|---|---|---|"]
    for m in MODES:
        if m in best:
            r = best[m]
            lines.append(f"| {m} | {r['BV']} x {r['warps']}, {r['BKC']}, {r['stages']} | {r['us']:.1f} | {r['TB_s']:.2f} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--B", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="fewer configurations (1-2 warps, whole K or 32-wide chunks)")
    ap.add_argument("--out", default="")
    ap.add_argument("--cpu-check", action="store_true",
                    help="run every configuration once at small sizes under TRITON_INTERPRET=1 against float64 (no timing)")
    a = ap.parse_args(argv)
    if a.cpu_check:
        res = run(B=2, HV=2, V=32, K=64, L=16, quick=a.quick, dev="cpu")
        bad = [r for r in res["rows"] if "error" in r]
        print(f"{len(res['rows']) - len(bad)} of {len(res['rows'])} configurations match float64")
        return 1 if bad else 0
    res = run(B=a.B, quick=a.quick)
    res.update(gpu=torch.cuda.get_device_name(), commit=os.environ.get("REPLAYSSM_COMMIT", "unknown"),
               date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(table(res))
    if a.out:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            json.dump(res, f, indent=1)
        with open(a.out.replace(".json", ".md"), "w") as f:
            f.write(f"fold probe, B = {res['B']}, {res['gpu']}, commit {res['commit']}, {res['date']}\n\n"
                    + table(res) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

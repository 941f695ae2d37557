#!/usr/bin/env python
"""Study: the checkpoint tile's two dot products on the tensor cores, for 2-byte tiles.

Decode v3's plain step reads each [BV, K] tile of the checkpoint (or of its read copy) and reduces it against two
vectors, C q~ and C k~ (kernels/decode_v3.py, ``_tile_dots``). For fp32 tiles that runs at ~4.0 TB/s; for bf16
tiles (bf16 states, the bf16 read copy) it stays near the same *time* with half the bytes (docs/design.md: "the
conversion per element makes the main kernel issue-bound"). The question here, isolated from the rest of the
kernel: does one tensor-core product per tile, C [BV, K] (bf16, exact) times a [K, 16] matrix whose columns are
q~ and k~ split into bf16 high and low parts (q~ = q_hi + q_lo, each exactly bf16; the product accumulates in fp32,
so the result carries q~ to ~2^-17 relative, not bf16's 2^-9), read the tile faster than the CUDA-core reduction?

Three kernels, each reading a pool of bf16 tiles [tiles, V, K] with one program per (V-tile of BV rows, tile), one
warp, and writing Cq, Ck per row:
- ``fma``: decode v3's reduction: K chunks of ``chunk_bytes``, converted to fp32, multiplied by q~ / k~ and reduced
  over K as they land (PIPE > 0: a software-pipelined chunk loop, as the bf16 read copy runs; 0: unrolled);
- ``mma``: the same chunks, each one ``tl.dot`` with its [chunk, 16] slice of the split matrix, which the caller
  has written once per tile ([K, 4] bf16; in decode v3 it would be the pre launch's, per row and key head);
- ``mma_in``: GDN's case, the one decode v3's ``tile_mma`` takes: the raw q and k are bf16 inputs (normalised after
  the product), so the operand is q and k straight from the input row, no split;
- ``mma_whole``: the whole tile in registers (8 KiB per program for bf16) and one ``tl.dot`` with the split matrix
  made in the program from q~ and k~ (nothing precomputed).

Modes:
- ``--offline`` (no GPU): compile every kernel for sm_90 with this machine's Triton and print registers, spills
  and static SASS per program by opcode class (scripts/sm90_offline.py). Run it under Triton 3.6 (the H200's:
  ``scripts/setup-triton36-env``) to match the GPU.
- default (GPU): each kernel's Cq / Ck against float64 (fresh random inputs, NaN-poisoned outputs), then the median
  time over CUDA-graph replays at B x HV tiles (default 256 x 32, GDN's shapes: 256 MiB of bf16 tiles), bytes moved
  and the fraction of the copy peak. Writes JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

K_DIM, V_DIM = 128, 128


@triton.jit
def tile_dots_fma_kernel(tile, q, k, out, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                         BKT: tl.constexpr, PIPE: tl.constexpr):
    """Cq, Ck of V-tile program_id(0) of tile program_id(1) by CUDA-core products (decode v3's _tile_dots form)."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    NC: tl.constexpr = K // BKT
    p = tile + i_t * V * K
    dq = tl.zeros([BV], dtype=tl.float32)
    dk = tl.zeros([BV], dtype=tl.float32)
    if PIPE > 0:
        o_ch = tl.arange(0, NC)
        offs = o_ch[:, None] * BKT + tl.arange(0, BKT)[None, :]
        Q2 = tl.load(q + i_t * K + offs)
        K2 = tl.load(k + i_t * K + offs)
        for c in tl.range(0, NC, num_stages=PIPE):
            o_kc = c * BKT + tl.arange(0, BKT)
            C = tl.load(p + o_v[:, None] * K + o_kc[None, :]).to(tl.float32)
            sel = o_ch[:, None] == c
            dq += tl.sum(C * tl.sum(tl.where(sel, Q2, 0.0), 0)[None, :], 1)
            dk += tl.sum(C * tl.sum(tl.where(sel, K2, 0.0), 0)[None, :], 1)
    else:
        acc_q = tl.zeros([BV, BKT], dtype=tl.float32)
        acc_k = tl.zeros([BV, BKT], dtype=tl.float32)
        for c in tl.static_range(NC):
            o_kc = c * BKT + tl.arange(0, BKT)
            C = tl.load(p + o_v[:, None] * K + o_kc[None, :]).to(tl.float32)
            acc_q += C * tl.load(q + i_t * K + o_kc)[None, :]
            acc_k += C * tl.load(k + i_t * K + o_kc)[None, :]
        dq = tl.sum(acc_q, 1)
        dk = tl.sum(acc_k, 1)
    tl.store(out + (i_t * V + o_v) * 2, dq)
    tl.store(out + (i_t * V + o_v) * 2 + 1, dk)


@triton.jit
def _split_cols(acc, BV: tl.constexpr):
    """(column 0 + 1, column 2 + 3) of an fp32 [BV, 16] product: q~'s high and low parts, k~'s."""
    col = tl.arange(0, 16)[None, :]
    dq = tl.sum(tl.where(col < 2, acc, 0.0), 1)
    dk = tl.sum(tl.where((col >= 2) & (col < 4), acc, 0.0), 1)
    return dq, dk


@triton.jit
def tile_dots_mma_kernel(tile, qk4, out, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                         BKT: tl.constexpr, PIPE: tl.constexpr):
    """Cq, Ck by one tensor-core product per K chunk: C chunk [BV, BKT] (bf16) times the tile's split matrix's rows
    of that chunk, qk4 [tiles, K, 4] bf16 (columns q_hi, q_lo, k_hi, k_lo), loaded as a [BKT, 16] operand whose
    other 12 columns are zeros (tl.dot needs N >= 16), accumulated in fp32."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    o_n = tl.arange(0, 16)
    NC: tl.constexpr = K // BKT
    p = tile + i_t * V * K
    acc = tl.zeros([BV, 16], dtype=tl.float32)
    for c in tl.range(0, NC, num_stages=PIPE):
        o_kc = c * BKT + tl.arange(0, BKT)
        C = tl.load(p + o_v[:, None] * K + o_kc[None, :])
        B = tl.load(qk4 + (i_t * K + o_kc[:, None]) * 4 + o_n[None, :], mask=(o_n < 4)[None, :], other=0.0)
        acc = tl.dot(C, B, acc)
    dq, dk = _split_cols(acc, BV)
    tl.store(out + (i_t * V + o_v) * 2, dq)
    tl.store(out + (i_t * V + o_v) * 2 + 1, dk)


@triton.jit
def tile_dots_mma_in_kernel(tile, qk, out, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr,
                            BKT: tl.constexpr, PIPE: tl.constexpr):
    """GDN's case (decode_v3 ``tile_mma``): q and k are the raw bf16 inputs (normalised after the product), so no
    split is needed: per chunk, C [BV, BKT] times a [BKT, 16] operand loaded straight from the input row qk [tiles,
    2K] (column 0 q, column 1 k, K further on; the rest zero)."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    o_n = tl.arange(0, 16)
    NC: tl.constexpr = K // BKT
    p = tile + i_t * V * K
    acc = tl.zeros([BV, 16], dtype=tl.float32)
    for c in tl.range(0, NC, num_stages=PIPE):
        o_kc = c * BKT + tl.arange(0, BKT)
        C = tl.load(p + o_v[:, None] * K + o_kc[None, :]).to(tl.bfloat16)  # (an fp8 tile: exact in bf16)
        B = tl.load(qk + i_t * 2 * K + o_kc[:, None] + tl.where(o_n == 1, K, 0)[None, :], mask=(o_n < 2)[None, :],
                    other=0.0)
        acc = tl.dot(C, B, acc)
    dq = tl.sum(tl.where(o_n[None, :] == 0, acc, 0.0), 1)
    dk = tl.sum(tl.where(o_n[None, :] == 1, acc, 0.0), 1)
    tl.store(out + (i_t * V + o_v) * 2, dq)
    tl.store(out + (i_t * V + o_v) * 2 + 1, dk)


@triton.jit
def tile_dots_mma_whole_kernel(tile, q, k, out, K: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """Cq, Ck by one tensor-core product of the whole [BV, K] tile with a split matrix made here from q~, k~."""
    i_v = tl.program_id(0)
    i_t = tl.program_id(1).to(tl.int64)
    o_v = i_v * BV + tl.arange(0, BV)
    o_k = tl.arange(0, K)
    C = tl.load(tile + i_t * V * K + o_v[:, None] * K + o_k[None, :])
    qv = tl.load(q + i_t * K + o_k)
    kv = tl.load(k + i_t * K + o_k)
    q_hi = qv.to(tl.bfloat16)
    k_hi = kv.to(tl.bfloat16)
    q_lo = (qv - q_hi.to(tl.float32)).to(tl.bfloat16)
    k_lo = (kv - k_hi.to(tl.float32)).to(tl.bfloat16)
    col = tl.arange(0, 16)[None, :]
    B = tl.where(col == 0, q_hi[:, None], tl.where(col == 1, q_lo[:, None], tl.where(
        col == 2, k_hi[:, None], tl.where(col == 3, k_lo[:, None], tl.zeros([K, 16], dtype=tl.bfloat16)))))
    acc = tl.dot(C, B)
    dq, dk = _split_cols(acc, BV)
    tl.store(out + (i_t * V + o_v) * 2, dq)
    tl.store(out + (i_t * V + o_v) * 2 + 1, dk)


def split_matrix(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """[tiles, K, 4] bf16: q_hi, q_lo, k_hi, k_lo (x_hi = bf16(x), x_lo = bf16(x - x_hi))."""
    out = torch.zeros(*q.shape, 4, dtype=torch.bfloat16, device=q.device)
    for j, x in ((0, q), (2, k)):
        hi = x.to(torch.bfloat16)
        out[..., j] = hi
        out[..., j + 1] = (x - hi.float()).to(torch.bfloat16)
    return out


VARIANTS = {  # name: (kernel kind, BKT or None, PIPE)
    "fma_p3": ("fma", 64, 3),     # 128-byte chunks, pipelined: the bf16 read copy's main launch today
    "fma_u": ("fma", 32, 0),      # 64-byte chunks, unrolled: the bf16 state's main launch today
    "mma_p3": ("mma", 64, 3),
    "mma_u": ("mma", 64, 0),
    "mma_whole": ("mma_whole", None, 0),
    "mma_in_p3": ("mma_in", 64, 3),  # GDN: raw bf16 q, k from the input, no split (decode_v3 tile_mma)
    "mma_in_u": ("mma_in", 64, 0),
}


def launch(name: str, tiles: torch.Tensor, q, k, qk16, out, qk_in=None, BV: int = 32):
    """One variant over every tile. q, k fp32 [tiles, K]; qk16 the split matrix (split_matrix); qk_in [tiles, 2K]
    bf16, q | k as bf16 inputs (mma_in: the caller rounds q and k to bf16 first, as GDN's inputs are)."""
    kind, bkt, pipe = VARIANTS[name]
    n, V, K = tiles.shape
    grid = (V // BV, n)
    if kind == "fma":
        return tile_dots_fma_kernel[grid](tiles, q, k, out, K=K, V=V, BV=BV, BKT=bkt, PIPE=pipe, num_warps=1)
    if kind == "mma":
        return tile_dots_mma_kernel[grid](tiles, qk16, out, K=K, V=V, BV=BV, BKT=bkt, PIPE=pipe, num_warps=1)
    if kind == "mma_in":
        return tile_dots_mma_in_kernel[grid](tiles, qk_in, out, K=K, V=V, BV=BV, BKT=bkt, PIPE=pipe, num_warps=1)
    return tile_dots_mma_whole_kernel[grid](tiles, q, k, out, K=K, V=V, BV=BV, num_warps=1)


def reference(tiles: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """float64 [tiles, V, 2]: C q~, C k~ of every row."""
    C = tiles.double()
    return torch.stack([torch.einsum("tvk,tk->tv", C, q.double()), torch.einsum("tvk,tk->tv", C, k.double())], -1)


TILE_DTYPES = {"bf16": (torch.bfloat16, "bf16"), "fp8_e4m3": (torch.float8_e4m3fn, "fp8e4nv")}
ANY_TILE = ("fma", "mma_in")  # kinds that take an fp8 tile too (mma_in converts it to bf16 in registers, exactly)


def offline(variants: list[str], tile_dtype: str = "bf16") -> list[dict]:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sm90_offline import compile_sm90, sass_stats

    rows = []
    td = TILE_DTYPES[tile_dtype][1]
    es = torch.empty((), dtype=TILE_DTYPES[tile_dtype][0]).element_size()
    for name in variants:
        kind, bkt, pipe = VARIANTS[name]
        if kind not in ANY_TILE and tile_dtype != "bf16":
            continue
        if bkt is not None:
            bkt = bkt * 2 // es  # the same chunk bytes
        if kind == "fma":
            fn, ptr, const = tile_dots_fma_kernel, dict(tile=td, q="fp32", k="fp32", out="fp32"), \
                dict(K=K_DIM, V=V_DIM, BV=32, BKT=bkt, PIPE=pipe)
        elif kind == "mma_in":
            fn, ptr, const = tile_dots_mma_in_kernel, dict(tile=td, qk="bf16", out="fp32"), \
                dict(K=K_DIM, V=V_DIM, BV=32, BKT=bkt, PIPE=pipe)
        elif kind == "mma":
            fn, ptr, const = tile_dots_mma_kernel, dict(tile="bf16", qk4="bf16", out="fp32"), \
                dict(K=K_DIM, V=V_DIM, BV=32, BKT=bkt, PIPE=pipe)
        else:
            fn, ptr, const = tile_dots_mma_whole_kernel, dict(tile="bf16", q="fp32", k="fp32", out="fp32"), \
                dict(K=K_DIM, V=V_DIM, BV=32)
        kern = compile_sm90(fn, ptr, const, num_warps=1, aligned=tuple(ptr))
        n, ops, regs, spill = sass_stats(kern)
        cls = {"FFMA/FMUL/FADD": sum(v for o, v in ops.items() if o in ("FFMA", "FMUL", "FADD")),
               "HMMA": sum(v for o, v in ops.items() if o.startswith("HMMA")),
               # the tile's element conversions on sm_90: bf16 -> fp32 is a 16-bit shift or byte permute (SHF /
               # PRMT); fp8 -> wider goes through F2FP / F2F / HADD2
               "conversions (SHF/PRMT/F2F*/HADD2)": sum(v for o, v in ops.items()
                                                        if o in ("SHF", "PRMT", "F2F", "F2FP", "HADD2")),
               "shuffles": ops.get("SHFL", 0),
               "loads/stores": sum(v for o, v in ops.items() if o.startswith(("LDG", "LDS", "LDSM", "STS", "STG",
                                                                             "LDGSTS", "LDGDEPBAR")))}
        rows.append(dict(variant=name, tile_dtype=tile_dtype, registers=regs, spill_bytes=spill, sass=n, classes=cls,
                         shared=getattr(kern.metadata, "shared", None), static_note="static count: a pipelined "
                         "loop's body is counted once (K = 128 in 64-element chunks: 2 trips)" if pipe else
                         "static count = dynamic count (unrolled)"))
        print(f"{name:10s} regs {regs:4d} spill {spill:4d} B  SASS {n:5d}  " +
              "  ".join(f"{c} {v}" for c, v in cls.items()), flush=True)
    return rows


def gpu(variants: list[str], n_tiles: int, seed: int, tile_dtype: str = "bf16") -> list[dict]:
    import triton.testing as tt

    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(seed)
    rows = []
    # correctness on a small fresh pool first (every variant), then timing on the big one
    tdt = TILE_DTYPES[tile_dtype][0]
    variants = [v for v in variants if VARIANTS[v][0] in ANY_TILE or tile_dtype == "bf16"]
    tiles = (torch.randn(64, V_DIM, K_DIM, generator=g) * 0.05).to(tdt)
    q = torch.nn.functional.normalize(torch.randn(64, K_DIM, generator=g, dtype=torch.float64), dim=-1) * K_DIM ** -0.5
    k = torch.nn.functional.normalize(torch.randn(64, K_DIM, generator=g, dtype=torch.float64), dim=-1)
    q16, k16 = q.to(torch.bfloat16), k.to(torch.bfloat16)
    refs = {False: reference(tiles, q, k), True: reference(tiles, q16.double(), k16.double())}
    tiles_d, q_d, k_d = tiles.to(dev), q.float().to(dev), k.float().to(dev)
    qk16 = split_matrix(q_d, k_d)
    qk_in = torch.cat([q16, k16], -1).to(dev)
    err = {}
    for name in variants:
        out = torch.full((64, V_DIM, 2), float("nan"), device=dev)
        launch(name, tiles_d, q_d, k_d, qk16, out, qk_in)
        torch.cuda.synchronize()
        o = out.cpu().double()
        ref = refs[VARIANTS[name][0] == "mma_in"]  # mma_in's q and k are the bf16 inputs themselves
        rel = ((o - ref).norm() / ref.norm()).item()
        err[name] = rel
        ok = bool(torch.isfinite(o).all()) and rel < 1e-5
        print(f"check {name:10s} relative error vs float64 {rel:.2e} {'ok' if ok else 'FAILED'}", flush=True)
    # timing: B x HV tiles (default GDN at B = 256: 8192 tiles, 256 MiB), one pool
    big = (torch.randn(n_tiles, V_DIM, K_DIM, device=dev) * 0.05).to(tdt)
    qb = torch.nn.functional.normalize(torch.randn(n_tiles, K_DIM, device=dev), dim=-1)
    kb = torch.nn.functional.normalize(torch.randn(n_tiles, K_DIM, device=dev), dim=-1)
    qk16b = split_matrix(qb, kb)
    qk_inb = torch.cat([qb, kb], -1).to(torch.bfloat16)
    outb = torch.empty(n_tiles, V_DIM, 2, device=dev)
    nbytes_tile = big.numel() * big.element_size()
    copy_src = torch.empty(nbytes_tile // 4, dtype=torch.float32, device=dev)
    copy_dst = torch.empty_like(copy_src)
    t_copy = tt.do_bench_cudagraph(lambda: copy_dst.copy_(copy_src)) * 1e-3
    peak = 2 * copy_src.numel() * 4 / t_copy
    print(f"copy peak {peak / 1e12:.2f} TB/s ({2 * nbytes_tile / 2**20:.0f} MiB moved in {t_copy * 1e6:.1f} us)")
    for name in variants:
        kind = VARIANTS[name][0]
        t = tt.do_bench_cudagraph(lambda: launch(name, big, qb, kb, qk16b, outb, qk_inb)) * 1e-3
        extra = {"mma": qk16b.numel() * 2, "mma_in": qk_inb.numel() * 2}.get(kind, qb.numel() * 8)
        nbytes = nbytes_tile + extra + outb.numel() * 4
        rows.append(dict(variant=name, t_us=t * 1e6, bytes=nbytes, TBps=nbytes / t / 1e12,
                         tile_TBps=nbytes_tile / t / 1e12, frac_copy_peak=nbytes / t / peak, rel_err=err[name]))
        print(f"time  {name:10s} {t * 1e6:8.1f} us  {nbytes / t / 1e12:5.2f} TB/s ({100 * nbytes / t / peak:4.1f}% "
              f"of the copy peak; the tiles alone {nbytes_tile / t / 1e12:5.2f} TB/s)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 and count; no GPU")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--tiles", type=int, default=256 * 32, help="tiles timed on the GPU (B x HV; default 256 x 32)")
    ap.add_argument("--seed", type=int, default=int(time.time()) % 100000)
    ap.add_argument("--out", default=None, help="JSON file for the results")
    ap.add_argument("--tile-dtype", default="bf16", choices=sorted(TILE_DTYPES),
                    help="the tiles' dtype: bf16 (bf16 states, the bf16 read copy) or fp8_e4m3 (the fp8 read copy; "
                         "fma and mma_in forms only)")
    args = ap.parse_args()
    variants = args.variants.split(",")
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        ap.error(f"unknown variants {sorted(unknown)}; known: {sorted(VARIANTS)}")
    meta = dict(triton=triton.__version__, torch=torch.__version__, commit=os.environ.get("REPLAYSSM_COMMIT", "?"),
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), seed=args.seed)
    if args.offline:
        rows = offline(variants, args.tile_dtype)
        meta["mode"] = (f"offline sm_90 compile (static SASS per program, one warp, BV 32, K = V = 128, "
                        f"{args.tile_dtype} tile)")
    else:
        meta["gpu"] = torch.cuda.get_device_name(0)
        rows = gpu(variants, args.tiles, args.seed, args.tile_dtype)
        meta["mode"] = f"GPU, {args.tiles} {args.tile_dtype} tiles [{V_DIM}, {K_DIM}], CUDA-graph medians"
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(meta=meta, rows=rows), f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

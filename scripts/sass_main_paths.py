#!/usr/bin/env python
"""Static SASS of the CUDA main launch's copy path (no GPU needed): how many instructions a warp of a read-copy block
issues when its row reads the copy (the common step, L - 1 in L), against the whole kernel.

gdn_main.cu decides per block at run time whether its row reads the read copy or folds, so the kernel's SASS holds
both paths and the fold's is the longer. This script builds, besides the real kernel, a variant of the source whose
row flags are fixed to "reads the copy, no fold" (two lines replaced, in a temporary copy of gdn_main.cu: the
compiler then drops the fold), and counts the instructions of replay_gdn_main up to its last EXIT (the slow paths
of IEEE sqrt / division that follow are called rarely and not counted) with nvdisasm. A static count, not a
timing: the copy path is nearly straight-line (the record loops are unrolled), so it approximates what a warp issues.
Session 41 (docs/design.md): x16w4c1_m7_lean 881 per warp on the copy path, RC_MMA's x16w4c1_m7_lean_mma 560; the
plain-step study's CUDA kernel (--study-arm) beside them.

    python scripts/sass_main_paths.py [--shapes x16w4c1_m7_lean,x16w4c1_m7_lean_mma] [--rc fp8_e4m3]
    python scripts/sass_main_paths.py --rc none --shapes x16w4c1_m6,x16w4c1_m7_mma --study-arm ''

--rc none: a bf16 checkpoint without a copy (the server's bf16-state build), its plain step (no flush, no pre-fold)
in place of the copy path; session 42: x16w4c1_m6 855 per warp, ST_MMA's x16w4c1_m7_mma 525. --kind kda: KDA's builds
(predecayed keys; session 42: bf16 state x16w4c1_m6_gp 895, x16w4c1_m7_gp_mma 497; fp8 copy x16w4c1_m5_gp_lean 891,
x16w4c1_m6_gp_lean_mma 507).

Needs nvcc (scripts/setup-nvcc or REPLAYSSM_NVCC) and nvdisasm (Triton's wheel carries one).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kernels import cuda_main as cm  # noqa: E402

# the row flags fixed to the copy path (the first: a row that reads the copy; the second: no fold, which for a build
# without a copy, where the first is compiled out, is its plain step: no flush, no pre-fold)
COPY_PATH = [("from_rc = !(flush || prefold);", "from_rc = true; flush = false; prefold = false;"),
             ("bool fold = (flush || prefold) && DIAG_STREAM == 0;", "bool fold = false; flush = false; prefold = false;")]
# KDA's flags may still turn after the pre launch's overflow flags are read: fixed there too
KDA_PATH = [("        fold = (flush || prefold || rebase) && DIAG_STREAM == 0;",
             "        fold = false; flush = false; prefold = false; rebase = false;")]
# --path fold: a flushing row's path instead (its fold with the token), the rolled loops unrolled so that the count is
# what a warp issues at a full ring (the record loops' early exits past h stay, so it is the most a fold issues)
FOLD_PATH = [("from_rc = !(flush || prefold);", "from_rc = false; flush = true; prefold = false;"),
             ("bool fold = (flush || prefold) && DIAG_STREAM == 0;",
              "bool fold = true; flush = true; prefold = false;")]
KDA_FOLD_PATH = [("        fold = (flush || prefold || rebase) && DIAG_STREAM == 0;",
                  "        fold = true; flush = true; prefold = false; rebase = false;")]
# --dead-padding: the padded row's branch (the whole block zeroes its output and returns) made dead, so that the count
# up to the last unconditional EXIT is the path's alone. Without it (the default, as every count in design.md up to
# session 45) the count includes that branch's ~70-130 instructions, which no warp of a real row issues (session 45:
# GDN bf16 x16w4c1_m7_mma_mf plain step 538 -> 426, fold path 1506 -> 1376)
PADDED_ROW = ("    if (slot < 0) {  // a padded row: zero output, nothing touched (the whole block takes this branch)\n"
              "        for (int r = threadIdx.x; r < VT * NCH;")
RC = {"fp8_e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16, "none": None}


def main_count(cubin: Path, kernel: str = "replay_gdn_main") -> tuple[int, dict]:
    """Instructions of ``kernel`` up to its last unconditional EXIT, and their opcodes."""
    sass = subprocess.run([cm.find_nvdisasm(), "-c", str(cubin)], capture_output=True, text=True, check=True).stdout
    body = sass.split(f".text.{kernel}:", 1)[1]
    n, last, ops, seen = 0, 0, {}, {}
    for line in body.splitlines():
        if line.startswith("$__internal") or line.lstrip().startswith(".section"):
            break
        m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m:
            n += 1
            op = m.group(2).split(".")[0]
            seen[op] = seen.get(op, 0) + 1
            if op == "EXIT" and not m.group(1):
                last, ops = n, dict(seen)
    return last, ops


def copy_path_source(td: Path, path: str = "copy", dead_padding: bool = False) -> Path:
    src = (ROOT / "kernels" / "gdn_main.cu").read_text()
    subs = COPY_PATH + KDA_PATH if path == "copy" else FOLD_PATH + KDA_FOLD_PATH
    if dead_padding:
        subs = subs + [(PADDED_ROW, PADDED_ROW.replace("if (slot < 0)", "if (false)"))]
    for a, b in subs:
        if src.count(a) != 1 and not (path == "fold" and a.startswith("from_rc") and src.count(a) == 1):
            raise RuntimeError(f"gdn_main.cu no longer has {a!r} once: update COPY_PATH / FOLD_PATH")
        src = src.replace(a, b)
    if path == "fold":
        src = src.replace("#pragma unroll 1\n", "#pragma unroll\n")
    out = td / "gdn_main.cu"
    out.write_text(src)
    for h in (ROOT / "kernels").glob("*.h"):  # (headers it includes, if any)
        (td / h.name).write_text(h.read_text())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="x16w4c1_m7_lean,x16w4c1_m7_lean_mma,x16w4c1_m8_lean_mma")
    ap.add_argument("--rc", default="fp8_e4m3", choices=sorted(RC))
    ap.add_argument("--kind", default="gdn", choices=("gdn", "kda"))
    ap.add_argument("--state", default="auto", choices=("auto", "fp32", "bf16"),
                    help="the checkpoint's type: auto (bf16 with --rc none, the server's bf16-state build; else fp32)")
    ap.add_argument("--rec", default="server", choices=("server", "fp32", "bf16"),
                    help="the ring records' type: server (the server's: the state's, so bf16 with --rc none; session "
                    "42's counts took fp32), fp32 or bf16")
    ap.add_argument("--path", default="copy", choices=("copy", "fold"),
                    help="copy: the copy path (--rc none: the plain step); fold: a flushing row's (its fold, unrolled)")
    ap.add_argument("--dead-padding", action="store_true",
                    help="leave out the padded row's branch (counted by default, as in the counts up to session 45)")
    ap.add_argument("--fold-out", default="0", help="comma-separated FOLD_OUT levels to count each shape at (session "
                    "57; 0: without; a level applies to the copy-sized shapes only, cuda_main.fold_out_defines)")
    ap.add_argument("--flush-first", default="0", help="comma-separated FLUSH_FIRST settings to count each shape at "
                    "(session 59; 1: the main launch takes rows past FF_FROM from the pre launch's order)")
    ap.add_argument("--study-arm", default="cutile_bv64", help="also count the plain-step study's CUDA kernel "
                    "(scripts/stream_persist.cu, an arm of stream_floor_study.py, tiles of --rc's type; '' skips it)")
    args = ap.parse_args()
    if cm.find_nvcc() is None or cm.find_nvdisasm() is None:
        sys.exit("needs nvcc (scripts/setup-nvcc, REPLAYSSM_NVCC) and nvdisasm")
    with tempfile.TemporaryDirectory() as td:
        copy_src = copy_path_source(Path(td), args.path, args.dead_padding)
        path = "fold path" if args.path == "fold" else "plain step" if args.rc == "none" else "copy path"
        print(f"| shape | registers (spill bytes) | SASS per warp, whole kernel | {path} | {path}'s top opcodes |")
        print("|---|---|---|---|---|")
        for name, fo, ff in ((n, int(f), int(x)) for n in args.shapes.split(",") for f in args.fold_out.split(",")
                             for x in args.flush_first.split(",")):
            state_dtype = ({"fp32": torch.float32, "bf16": torch.bfloat16}[args.state] if args.state != "auto"
                           else torch.bfloat16 if args.rc == "none" else torch.float32)
            rec = state_dtype if args.rec == "server" else getattr(torch, {"fp32": "float32"}.get(args.rec, "bfloat16"))
            d = cm.server_defines(cm.CUDA_CONFIGS[name], rc_dtype=RC[args.rc], kind=args.kind,
                                  state_dtype=state_dtype, rec_dtype=rec, fold_out=fo, flush_first=bool(ff))
            if fo and d.get("FOLD_OUT") != fo or ff and not d.get("FLUSH_FIRST"):
                continue  # (a shape FOLD_OUT / FLUSH_FIRST does not apply to)
            res = cm.resources(d)
            whole, _ = main_count(cm.build(d))
            path, ops = main_count(cm.build(d, src=copy_src))
            top = sorted(ops.items(), key=lambda x: -x[1])[:6]
            top += [(k, ops[k]) for k in ("LDG", "LDL", "STL") if k in ops and k not in dict(top)]  # (memory, always)
            top = ", ".join(f"{k} {v}" for k, v in top)
            label = f"`{name}`" + (f" `FOLD_OUT` {fo}" if fo else "") + (" `FLUSH_FIRST`" if ff else "")
            print(f"| {label} | {res['registers']} ({res['spill_stores']}) | {whole} | {path} | {top} |")
    if args.study_arm:
        sys.path.insert(0, str(ROOT / "scripts"))
        import stream_floor_study as S

        d = S.cu_defines(S.parse_arm(args.study_arm), RC[args.rc] or torch.bfloat16)  # (none: the bf16 tiles')
        n, ops = main_count(cm.build(d, src=Path(S.CU_SRC)), "stream_persist")
        res = cm.resources(d, name="stream_persist", src=Path(S.CU_SRC))
        top = ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda x: -x[1])[:6])
        print(f"| study `{args.study_arm}` (one item per block, no fold) | {res['registers']} "
              f"({res['spill_stores']}) | {n} | {n} | {top} |")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Assemble, on this machine, what the GPU image lacks to run SGLang 0.5.17 (one command).

    python scripts/gpu_bundle.py            # -> .bundle/*.tar.xz (+ MANIFEST.txt)

Steps (facts from /work/shared/research/device-facts.md):
  1. `pip download` the pinned cp312 manylinux wheels of scripts/gpu-requirements.txt into .cache/gpu-wheels/
     (kept between runs, so a rerun downloads nothing);
  2. `pip install --no-deps --target` them into a staging folder (.cache/gpu-stage/site);
  3. strip what the H200 runs never load: sgl_kernel's flash_ops / flashmla_ops / infllm_ops and sm100/,
     flashinfer's data/cutlass and data/cccl, xgrammar's lib/libxgrammar.a, every __pycache__;
  4. pack tar.xz bundles of at most 60 MiB each into .bundle/ (ignored by git).

On the GPU machine: `for b in .bundle/*.tar.xz; do tar -xJf $b -C /tmp/site; done; export PYTHONPATH=/tmp/site`
(scripts/gpu_e2e.sh does it). Everything one `run` call ships (working tree + carried paths) must stay under
64 MiB, so the bundle's total is checked against a budget as well.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQS = ROOT / "scripts" / "gpu-requirements.txt"
CACHE = ROOT / ".cache" / "gpu-wheels"
STAGE = ROOT / ".cache" / "gpu-stage"
OUTDIR = ROOT / ".bundle"

MIB = 1 << 20
MAX_BUNDLE = 60 * MIB
TOTAL_BUDGET = 62 * MIB  # leaves ~2 MiB of the 64 MiB per call for the working tree

PLATFORMS = [
    "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64", "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64", "manylinux_2_31_x86_64", "manylinux_2_34_x86_64", "manylinux_2_35_x86_64",
    "manylinux1_x86_64", "linux_x86_64",
]
TARGET = ["--python-version", "3.12", "--implementation", "cp", "--only-binary=:all:"]
for _p in PLATFORMS:
    TARGET += ["--platform", _p]

# paths relative to the staging site folder; globs allowed
STRIP = [
    "sgl_kernel/flash_ops*.so",
    "sgl_kernel/flashmla_ops*.so",
    "sgl_kernel/infllm_ops*.so",
    "sgl_kernel/sm100",
    "flashinfer/data/cutlass",
    "flashinfer/data/cccl",
    "xgrammar/lib/libxgrammar.a",
    # beyond device-facts.md, to fit one call's 64 MiB: zstandard's second (cffi) backend -- the C backend
    # is the default -- and jedi's bundled typeshed/django stubs (IPython imports jedi; completion only
    # reads the stubs)
    "zstandard/_cffi*.so",
    "jedi/third_party/typeshed",
    "jedi/third_party/django-stubs",
]

# bundle name -> top-level entries (prefix match on the folder / dist-info name); the rest goes to "misc"
GROUPS = {
    "sglang": ["sglang"],
    "sgl_kernel": ["sgl_kernel", "sglang_kernel"],
    "flashinfer": ["flashinfer"],
}


def pins() -> list[str]:
    out = []
    for line in REQS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            if "==" not in line:
                sys.exit(f"unpinned requirement in {REQS}: {line}")
            out.append(line)
    return out


def run(cmd: list[str], **kw) -> None:
    print("+", " ".join(cmd[:6]), "..." if len(cmd) > 6 else "", flush=True)
    subprocess.run(cmd, check=True, **kw)


def norm(name: str) -> str:
    return name.lower().replace("-", "_").replace(".", "_")


def wheel_for(pin: str) -> Path:
    name, ver = pin.split("==")
    cands = [w for w in CACHE.glob("*.whl")
             if norm(w.name.split("-")[0]) == norm(name) and w.name.split("-")[1] == ver]
    if len(cands) != 1:
        sys.exit(f"expected one wheel for {pin} in {CACHE}, found {[c.name for c in cands]}")
    return cands[0]


def download(req: list[str]) -> None:
    CACHE.mkdir(parents=True, exist_ok=True)
    missing = []
    for p in req:
        try:
            wheel_for(p)
        except SystemExit:
            missing.append(p)
    if not missing:
        print(f"all {len(req)} wheels cached in {CACHE.relative_to(ROOT)}")
        return
    run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
         *TARGET, "-d", str(CACHE), *missing])


def install(req: list[str]) -> Path:
    site = STAGE / "site"
    if STAGE.exists():
        shutil.rmtree(STAGE)
    site.mkdir(parents=True)
    wheels = [str(wheel_for(p)) for p in req]
    run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "-q",
         "--disable-pip-version-check", *TARGET, "--target", str(site), *wheels])
    return site


def strip(site: Path) -> None:
    for pat in STRIP:
        hits = list(site.glob(pat))
        if not hits:
            sys.exit(f"strip pattern matched nothing (layout changed?): {pat}")
        for h in hits:
            shutil.rmtree(h) if h.is_dir() else h.unlink()
            print(f"  stripped {h.relative_to(site)}")
    for d in list(site.rglob("__pycache__")):
        shutil.rmtree(d, ignore_errors=True)
    # console scripts written by pip point at this machine's python; they are not used there
    if (site / "bin").exists():
        shutil.rmtree(site / "bin")


def group_of(entry: str) -> str:
    base = entry.split("-")[0]  # package folder, or the distribution name of a .dist-info folder
    for g, prefixes in GROUPS.items():
        if base in prefixes:
            return g
    return "misc"


def pack(site: Path, outdir: Path) -> list[Path]:
    """Packs into `outdir` (a temporary folder: .bundle/ is swapped in only once all bundles exist)."""
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir()
    groups: dict[str, list[str]] = {}
    for e in sorted(os.listdir(site)):
        groups.setdefault(group_of(e), []).append(e)
    out = []
    for g, entries in groups.items():
        dst = outdir / f"site-{g}.tar.xz"
        tar = ["tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
               "-C", str(site), "-cf", "-", *entries]
        with open(dst, "wb") as f:
            p1 = subprocess.Popen(tar, stdout=subprocess.PIPE)
            p2 = subprocess.Popen(["xz", "-9", "-T0", "-c"], stdin=p1.stdout, stdout=f)
            p1.stdout.close()
            if p2.wait() or p1.wait():
                sys.exit(f"packing {dst} failed")
        size = dst.stat().st_size
        print(f"  {dst.name}: {size / MIB:.1f} MiB ({len(entries)} entries)")
        if size > MAX_BUNDLE:
            sys.exit(f"{dst} is {size / MIB:.1f} MiB > {MAX_BUNDLE / MIB:.0f} MiB: split GROUPS further")
        out.append(dst)
    return out


def manifest(req: list[str], bundles: list[Path], outdir: Path) -> None:
    lines = ["# written by scripts/gpu_bundle.py; pins from scripts/gpu-requirements.txt", ""]
    for b in bundles:
        h = hashlib.sha256(b.read_bytes()).hexdigest()
        lines.append(f"{b.name} {b.stat().st_size} sha256={h}")
    lines += ["", *req]
    (outdir / "MANIFEST.txt").write_text("\n".join(lines) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keep-stage", action="store_true", help="keep .cache/gpu-stage after packing")
    args = ap.parse_args()
    req = pins()
    download(req)
    site = install(req)
    strip(site)
    tmp = ROOT / ".cache" / "bundle.new"  # ignored, so a GPU call meanwhile never ships a half-built copy
    bundles = pack(site, tmp)
    manifest(req, bundles, tmp)
    total = sum(b.stat().st_size for b in bundles)
    if OUTDIR.exists():
        shutil.rmtree(OUTDIR)
    tmp.rename(OUTDIR)
    print(f"total {total / MIB:.1f} MiB in {len(bundles)} bundles under {OUTDIR.relative_to(ROOT)}/")
    if total > TOTAL_BUDGET:
        print(f"WARNING: over the {TOTAL_BUDGET / MIB:.0f} MiB budget: one run call ships <= 64 MiB in all",
              file=sys.stderr)
    if not args.keep_stage:
        shutil.rmtree(STAGE)


if __name__ == "__main__":
    main()

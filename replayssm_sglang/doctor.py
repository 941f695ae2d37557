"""`replayssm-sglang doctor`: is this machine ready to serve with ReplaySSM, and what to do if not.

Checks, in order: Python and this package; the SGLang tree (version, path, pin match) and the
patch series' state; the kernel modules; torch, CUDA and the GPU's compute capability; which
flags and radix-cache strategies `--enable-linear-replayssm` will run with. Every problem comes
with one line saying what to do. Needs no GPU and does not import SGLang (unless ``--probe``).

The patch engine (``replayssm_sglang.pin``, ``replayssm_sglang.patching``) is imported lazily, so a
broken install still gets a report. Pure parts (``collect``, ``format_report``) are separate from
the CLI glue (``add_parser``, ``run``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

OK, INFO, WARN, FAIL = "ok", "info", "warn", "fail"

TESTED_CAPABILITIES = {(9, 0)}  # H100 / H200: where the kernels are measured
MIN_CAPABILITY = (8, 0)  # bf16 tensor cores, what the Triton kernels assume
DEFAULT_CACHE_LEN = 16  # SGLang's --linear-replayssm-cache-len default


@dataclass
class Check:
    name: str
    status: str  # ok | info | warn | fail
    detail: str
    action: str | None = None  # what to do; set for every warn and fail


# --- seams the tests replace ----------------------------------------------------------------------

def _load_engine():
    """(pin, patching) modules of the patch engine; raises ImportError when unavailable."""
    pin = importlib.import_module("replayssm_sglang.pin")
    patching = importlib.import_module("replayssm_sglang.patching")
    return pin, patching


def _load_rules():
    """The side-package module that owns the --enable-linear-replayssm server-argument rules."""
    return importlib.import_module("replayssm_sglang.sglang_hooks.server_args")


def _torch_info() -> dict[str, Any]:
    """What torch says about CUDA. Keys: torch, cuda_build, available, devices [(name, (maj, min))],
    error (str) when torch cannot be imported."""
    try:
        import torch
    except Exception as e:  # noqa: BLE001 - report whatever breaks the import
        return {"error": f"{type(e).__name__}: {e}"}
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda_build": getattr(torch.version, "cuda", None),
        "available": False,
        "devices": [],
    }
    try:
        info["available"] = bool(torch.cuda.is_available())
        if info["available"]:
            for i in range(torch.cuda.device_count()):
                info["devices"].append((torch.cuda.get_device_name(i), tuple(torch.cuda.get_device_capability(i))))
    except Exception as e:  # noqa: BLE001
        info["available"] = False
        info["cuda_error"] = f"{type(e).__name__}: {e}"
    return info


def _kernel_modules() -> tuple[str | None, list[tuple[str, str | None]]]:
    """(error importing the kernels package or None, [(module, error or None)]) for every module
    under replayssm_sglang.kernels."""
    import pkgutil

    try:
        pkg = importlib.import_module("replayssm_sglang.kernels")
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}", []
    results = []
    for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        name = f"replayssm_sglang.kernels.{m.name}"
        try:
            importlib.import_module(name)
            results.append((m.name, None))
        except Exception as e:  # noqa: BLE001
            results.append((m.name, f"{type(e).__name__}: {e}"))
    return None, results


def _installed_sglang() -> tuple[str | None, Path | None]:
    """Version (package metadata) and folder of the SGLang this Python would import, without
    importing it."""
    import importlib.metadata
    import importlib.util

    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        spec = None
    where = None
    if spec is not None and spec.submodule_search_locations:
        where = Path(list(spec.submodule_search_locations)[0]).resolve().parent
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return version, where


# --- checks ---------------------------------------------------------------------------------------

def _target_arg(target) -> str:
    return f" --target {target}" if target else ""


def check_python() -> list[Check]:
    import replayssm_sglang

    out = [Check("python", OK, f"Python {platform.python_version()} ({sys.executable})")]
    where = Path(replayssm_sglang.__file__).resolve().parent
    out.append(Check("replayssm-sglang", OK, f"replayssm-sglang {replayssm_sglang.__version__} at {where}"))
    return out


_STATE_ADVICE = {
    # state: (status, what it means, what to do) ; {t} = " --target DIR" or "", {pin} = pinned version
    "pristine": (
        WARN,
        "the series is not applied: --enable-linear-replayssm runs upstream 0.5.17's kernel and rules",
        "replayssm-sglang apply{t}",
    ),
    "patched": (OK, "every patch of the series is applied", None),
    "partial": (
        FAIL,
        "only some patches are applied (an interrupted or hand-made change)",
        "replayssm-sglang apply{t} to finish the series, or replayssm-sglang revert{t} to undo it",
    ),
    "drifted": (
        FAIL,
        "files the series touches match neither the pristine files nor any patch stage (edited)",
        "pip install --force-reinstall --no-deps sglang=={pin}, then replayssm-sglang apply{t}; "
        "`replayssm-sglang status{t}` lists the edited files",
    ),
    "wrong-version": (
        FAIL,
        "this SGLang is not the version the series is pinned to",
        "pip install --force-reinstall --no-deps sglang=={pin}, then replayssm-sglang apply{t} "
        "(this replayssm-sglang carries a series for SGLang {pin} only)",
    ),
    "missing-files": (
        FAIL,
        "files the series needs are missing from this SGLang install",
        "pip install --force-reinstall --no-deps sglang=={pin}, then replayssm-sglang apply{t}",
    ),
}


def check_sglang(target: str | None, engine) -> tuple[list[Check], Any]:
    """SGLang version and path, pin match, series status. Returns (checks, TreeStatus or None)."""
    out: list[Check] = []
    inst_version, inst_where = _installed_sglang()
    if engine is None:
        where = Path(target) if target else inst_where
        if where is None:
            out.append(Check("sglang", FAIL, "SGLang is not importable in this Python",
                             "pip install sglang (the pinned version; see `pip show replayssm-sglang`)"))
        else:
            out.append(Check("sglang", INFO, f"SGLang {inst_version or '?'} at {where}/sglang "
                             "(pin and series unknown: the patch engine is unavailable)"))
        return out, None

    pin_mod, patching = engine
    try:
        pin_version = pin_mod.SGLANG_VERSION
    except Exception as e:  # noqa: BLE001 - PIN.json missing or unreadable
        out.append(Check("pin", FAIL, f"cannot read the pin: {type(e).__name__}: {e}",
                         "reinstall replayssm-sglang (pip install -e . in the checkout); "
                         "patches/PIN.json must ship with it"))
        return out, None
    t = _target_arg(target)
    try:
        root = patching.find_target(target)
    except patching.PatchError as e:
        out.append(Check("sglang", FAIL, str(e),
                         f"pip install sglang=={pin_version} (then replayssm-sglang apply), "
                         "or pass --target DIR (the folder that contains sglang/)"))
        return out, None
    try:
        st = patching.status(target)
    except patching.PatchError as e:
        out.append(Check("sglang", FAIL, f"SGLang at {root}/sglang: {e}",
                         f"pip install --force-reinstall --no-deps sglang=={pin_version}, then "
                         f"replayssm-sglang apply{t}"))
        return out, None
    except Exception as e:  # noqa: BLE001 - an engine bug must not hide the rest of the report
        out.append(Check("sglang", FAIL, f"the patch engine failed on {root}: {type(e).__name__}: {e}",
                         "report this as a replayssm-sglang bug, with this output"))
        return out, None

    version = st.version or "of unknown version"
    match = st.version == pin_version
    out.append(Check(
        "sglang", OK if match else FAIL,
        f"SGLang {version} at {st.target}/sglang; pin {pin_version}: " + ("match" if match else "MISMATCH"),
        None if match else f"pip install --force-reinstall --no-deps sglang=={pin_version}",
    ))
    if inst_where is not None and Path(st.target).resolve() != inst_where:
        out.append(Check(
            "sglang-import", WARN,
            f"the tree checked ({st.target}) is not the SGLang this Python imports ({inst_where})",
            "launch the server with the Python whose site-packages is the patched tree "
            f"(or check {inst_where} with --target {inst_where})",
        ))
    elif inst_where is None and target:
        out.append(Check(
            "sglang-import", WARN,
            f"this Python cannot import sglang; the tree checked is {st.target}",
            f"launch the server with PYTHONPATH={st.target} or from the environment that holds it",
        ))

    applied = sum(1 for p in st.patches if p.applied)
    n = len(st.patches)
    status, meaning, action = _STATE_ADVICE.get(
        st.state, (FAIL, f"unknown tree state {st.state!r}", "report this as a replayssm-sglang bug")
    )
    detail = f"series: {st.state} ({applied} of {n} patches applied): {meaning}"
    for p in st.patches:
        detail += f"\n[{'x' if p.applied else ' '}] {p.name}"
    for line in st.problems:
        detail += f"\n! {line}"
    out.append(Check("series", status, detail,
                     action.format(t=t, pin=pin_version) if action else None))
    return out, st


def check_kernels() -> list[Check]:
    err, mods = _kernel_modules()
    if err is not None:
        return [Check("kernels", FAIL, f"import replayssm_sglang.kernels failed: {err}",
                      "reinstall replayssm-sglang (pip install -e . in the checkout): kernels/ "
                      "installs as replayssm_sglang.kernels")]
    if not mods:
        return [Check("kernels", WARN, "replayssm_sglang.kernels holds no kernel modules",
                      "this build ships no ReplaySSM kernels yet: update replayssm-sglang")]
    out = []
    for name, e in mods:
        if e is None:
            out.append(Check(f"kernels.{name}", OK, f"replayssm_sglang.kernels.{name} imports"))
        else:
            fix = ("pip install triton (the version your torch pins)" if "triton" in e.lower()
                   else "reinstall replayssm-sglang (pip install -e . in the checkout) and rerun doctor")
            out.append(Check(f"kernels.{name}", FAIL, f"replayssm_sglang.kernels.{name}: {e}", fix))
    return out


def check_gpu(info: dict[str, Any] | None = None) -> list[Check]:
    info = _torch_info() if info is None else info
    if "error" in info:
        return [Check("torch", FAIL, f"torch does not import: {info['error']}",
                      "install the torch that SGLang pins (pip install sglang==<pin> brings it)")]
    out = [Check("torch", OK, f"torch {info['torch']} (CUDA build: {info['cuda_build'] or 'none, CPU-only'})")]
    interp = os.environ.get("TRITON_INTERPRET") == "1"
    if not info["available"]:
        why = info.get("cuda_error") or (
            "this torch is a CPU-only build" if not info["cuda_build"] else "no CUDA device is visible")
        out.append(Check(
            "gpu", WARN,
            f"no CUDA GPU: {why}. plan, apply/revert/status and the CPU tests work here; serving "
            "and the ReplaySSM kernels need an NVIDIA GPU",
            "on a GPU machine: check nvidia-smi and CUDA_VISIBLE_DEVICES"
            + ("; install a CUDA build of torch" if not info["cuda_build"] else ""),
        ))
        return out
    for i, (name, cap) in enumerate(info["devices"]):
        cap = tuple(cap)
        sm = f"sm_{cap[0]}{cap[1]}"
        if cap < MIN_CAPABILITY:
            out.append(Check(f"gpu{i}", FAIL, f"{name}, compute capability {cap[0]}.{cap[1]} ({sm})",
                             f"the kernels need compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]}: "
                             "use an Ampere or newer GPU, or serve without --enable-linear-replayssm"))
        elif cap in TESTED_CAPABILITIES:
            out.append(Check(f"gpu{i}", OK, f"{name}, compute capability {cap[0]}.{cap[1]} ({sm}, tested)"))
        else:
            out.append(Check(f"gpu{i}", WARN,
                             f"{name}, compute capability {cap[0]}.{cap[1]} ({sm}): supported but not measured",
                             "run the GPU tests (pytest -m gpu) before serving, and compare with "
                             "benchmarks/ on this GPU"))
    if interp:
        out.append(Check("triton", WARN, "TRITON_INTERPRET=1 is set: Triton kernels run in the slow CPU interpreter",
                         "unset TRITON_INTERPRET before launching the server"))
    return out


def _capabilities(rules) -> dict[str, Any] | None:
    caps = getattr(rules, "CAPABILITIES", None)
    if caps is None and callable(getattr(rules, "capabilities", None)):
        caps = rules.capabilities()
    return dict(caps) if caps is not None else None


def _probe_extra_buffer(rules) -> tuple[bool | None, str]:
    """Ask the rules whether --enable-linear-replayssm accepts the extra_buffer strategy (what
    `auto` resolves to with the overlap scheduler on). Imports SGLang's server-argument helpers."""
    import types

    args = types.SimpleNamespace(
        enable_linear_replayssm=True, enable_linear_replayssm_spec=False,
        mamba_radix_cache_strategy="extra_buffer", disable_radix_cache=False,
        disaggregation_mode="null", linear_replayssm_cache_len=DEFAULT_CACHE_LEN,
    )
    try:
        rules.validate(args, "triton")
        return True, "accepted"
    except ValueError as e:
        return False, str(e)
    except Exception as e:  # noqa: BLE001
        return None, f"{type(e).__name__}: {e}"


def check_flags(st, *, probe: bool = False, target: str | None = None) -> list[Check]:
    """Which flags and strategies `--enable-linear-replayssm` will run with on this tree."""
    t = _target_arg(target)
    upstream = (
        "upstream's rules: --enable-linear-replayssm needs --linear-attn-decode-backend triton and "
        "--mamba-radix-cache-strategy no_buffer, which in turn needs --disable-overlap-schedule "
        "(or --disable-radix-cache); under SGLang's defaults (auto -> extra_buffer, overlap on) the "
        "server refuses to start"
    )
    if st is None:
        return [Check("flags", INFO, "unknown: the SGLang tree could not be checked (see above)")]
    if st.state != "patched":
        return [Check("flags", WARN, upstream,
                      f"replayssm-sglang apply{t}, or launch with --mamba-radix-cache-strategy "
                      "no_buffer --disable-overlap-schedule")]
    try:
        rules = _load_rules()
    except Exception as e:  # noqa: BLE001
        return [Check("flags", FAIL, f"the series is applied but its rules module does not import: "
                      f"{type(e).__name__}: {e}",
                      f"reinstall replayssm-sglang in this Python, or replayssm-sglang revert{t}")]
    caps = _capabilities(rules)
    if caps is None and probe:
        ok, msg = _probe_extra_buffer(rules)
        if ok is not None:
            caps = {"extra_buffer": ok, "overlap_schedule": ok, "probe": msg}
    full = (
        "with the series applied, --enable-linear-replayssm keeps SGLang's defaults: radix cache "
        "strategy auto -> extra_buffer (prefix caching with forced flushes at block boundaries), "
        "the overlap scheduler, and CUDA graphs; ring length --linear-replayssm-cache-len "
        f"(default {DEFAULT_CACHE_LEN}); GDN and KDA layers"
    )
    if caps is None:
        return [Check(
            "flags", INFO,
            "series applied; this build's rules module declares no CAPABILITIES. The series' aim: "
            + full + ". Until a build supports extra_buffer, its rules refuse it at startup with "
            "the flags to pass instead",
            None,
        ), Check("flags-probe", INFO, "run `replayssm-sglang doctor --probe` to ask the rules "
                 "directly (imports SGLang, about 20 s)")]
    if caps.get("extra_buffer"):
        out = [Check("flags", OK, full)]
    else:
        reason = caps.get("probe")
        out = [Check(
            "flags", WARN,
            "this build's --enable-linear-replayssm does not support the extra_buffer strategy yet, "
            "so SGLang's defaults (auto -> extra_buffer with the overlap scheduler) are refused at "
            "startup" + (f" (rules say: {reason})" if reason else ""),
            "launch with --mamba-radix-cache-strategy no_buffer --disable-overlap-schedule "
            "(or --disable-radix-cache); CUDA graphs stay on",
        )]
    if "cuda_graph" in caps and not caps["cuda_graph"]:
        out.append(Check("flags-cuda-graph", WARN, "this build runs ReplaySSM without CUDA graphs",
                         "expect lower decode throughput; update replayssm-sglang"))
    if "spec_verify" in caps:
        out.append(Check("flags-spec", INFO, "speculative verify in the ring: "
                         + ("on (linear draft chains: NEXTN/MTP, EAGLE topk 1)" if caps["spec_verify"]
                            else "not in this build: --enable-linear-replayssm refuses "
                                  "--speculative-algorithm at startup")))
    if "read_copy" in caps:
        out.append(Check("flags-read-copy", INFO, "low-precision read copy of the state: "
                         + ("--linear-replayssm-read-dtype bf16|fp8_e4m3 (default same: none; needs "
                            "--enable-linear-replayssm; decode reads the copy, verify the fp32 checkpoint)"
                            if caps["read_copy"]
                            else "not in this build: --linear-replayssm-read-dtype accepts only same")))
    return out


def _cuda_main_toolchain() -> dict[str, Any]:
    """What the CUDA main launch would build with: nvcc (path or None), the cubin cache and how many cubins it holds,
    REPLAYSSM_MAIN_IMPL and REPLAYSSM_PRE_IMPL as the launches read them."""
    from replayssm_sglang.kernels import cuda_main

    d = cuda_main.cache_dir()
    return {"nvcc": cuda_main.find_nvcc(), "cache": str(d),
            "cubins": len(list(d.glob("gdn_main-*.cubin"))) if d.is_dir() else 0,
            "impl": cuda_main.env_main_impl(), "impls": cuda_main.MAIN_IMPLS,
            "pre_impl": cuda_main.env_pre_impl(), "pre_impls": cuda_main.PRE_IMPLS}


def check_main_launch(info: dict[str, Any] | None = None, tc: dict[str, Any] | None = None) -> list[Check]:
    """Which main launch the buffered decode step takes here (kernels/cuda_main.py): the CUDA one (the default where
    it can run) or Triton's, and what to do to get the CUDA one where it is missing."""
    info = _torch_info() if info is None else info
    try:
        tc = _cuda_main_toolchain() if tc is None else tc
    except Exception as e:  # noqa: BLE001
        return [Check("main-launch", WARN, f"the CUDA main launch's module does not import: {type(e).__name__}: {e}",
                      "reinstall replayssm-sglang (pip install -e . in the checkout)")]
    pre = tc.get("pre_impl", "auto")
    if pre not in tc.get("pre_impls", (pre,)):
        return [Check("main-launch", FAIL, f"REPLAYSSM_PRE_IMPL={pre!r}: the decode launch refuses it",
                      f"set REPLAYSSM_PRE_IMPL to one of {', '.join(tc['pre_impls'])} (or unset it: auto)")]
    if tc["impl"] not in tc["impls"]:
        return [Check("main-launch", FAIL, f"REPLAYSSM_MAIN_IMPL={tc['impl']!r}: the decode launch refuses it",
                      f"set REPLAYSSM_MAIN_IMPL to one of {', '.join(tc['impls'])} (or unset it: auto)")]
    if tc["impl"] == "triton":
        return [Check("main-launch", INFO, "decode main launch: Triton's (REPLAYSSM_MAIN_IMPL=triton)")]
    caps = [tuple(c) for _, c in info.get("devices", [])] if info.get("available") else []
    if not caps or max(caps) < (9, 0):
        why = "no CUDA GPU here" if not caps else "it needs sm_90 or newer"
        return [Check("main-launch", INFO, f"decode main launch: Triton's (the CUDA one: {why})")]
    if tc["nvcc"]:
        return [Check("main-launch", OK, f"decode main launch: CUDA (kernels/gdn_main.cu) where a layer can take it, "
                      f"built at first use by {tc['nvcc']}, cached in {tc['cache']} ({tc['cubins']} cubins now)")]
    if tc["cubins"]:
        return [Check("main-launch", OK, f"decode main launch: CUDA from cached cubins only ({tc['cubins']} in "
                      f"{tc['cache']}; no nvcc: a shape not cached falls back to Triton's)")]
    return [Check("main-launch", WARN, "decode main launch: Triton's, because neither nvcc nor cached cubins are "
                  "here (the CUDA one is faster on the H200: docs/usage.md)",
                  "install nvcc (the CUDA toolkit, or `pip install nvidia-cuda-nvcc nvidia-nvvm nvidia-cuda-crt "
                  "nvidia-cuda-runtime`) or name it with REPLAYSSM_NVCC; REPLAYSSM_MAIN_IMPL=triton silences this")]


def collect(target: str | None = None, *, probe: bool = False) -> list[Check]:
    checks = check_python()
    try:
        engine = _load_engine()
    except Exception as e:  # noqa: BLE001
        engine = None
        checks.append(Check("patch-engine", FAIL, f"patch engine not available: {type(e).__name__}: {e}",
                            "reinstall replayssm-sglang (pip install -e . in the checkout)"))
    sg, st = check_sglang(target, engine)
    checks += sg
    checks += check_kernels()
    info = _torch_info()
    checks += check_gpu(info)
    checks += check_main_launch(info)
    checks += check_flags(st, probe=probe, target=target)
    return checks


# --- output ---------------------------------------------------------------------------------------

def format_report(checks: list[Check]) -> str:
    import textwrap

    lines = ["replayssm-sglang doctor"]
    width = max(len(c.status) for c in checks) + 2
    pad = " " * (width + 3)

    def wrap(text: str, first: str, rest: str) -> list[str]:
        return textwrap.wrap(text, width=100, initial_indent=first, subsequent_indent=rest,
                             break_on_hyphens=False, break_long_words=False) or [first]

    for c in checks:
        first, *more = c.detail.split("\n")
        lines += wrap(first, f"  {('[' + c.status + ']'):<{width}} ", pad)
        for r in more:
            lines += wrap(r, pad, pad + "  ")
        if c.action:
            lines += wrap(c.action, pad + "-> ", pad + "   ")
    n_fail = sum(c.status == FAIL for c in checks)
    n_warn = sum(c.status == WARN for c in checks)
    lines.append("")
    lines.append(f"{n_fail} problem(s), {n_warn} warning(s)" if n_fail or n_warn else "all checks passed")
    return "\n".join(lines)


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "doctor",
        help="check SGLang, the patch series, kernels, GPU and flags; say what to fix",
        description=(
            "Report the SGLang version and path, whether it matches the pin, the patch series' "
            "state, whether the kernels import, the GPU and its compute capability, and which "
            "flags and strategies --enable-linear-replayssm will run with. Each problem comes "
            "with what to do. Exit status 1 when a check fails. Needs no GPU."
        ),
    )
    configure_parser(p)
    p.set_defaults(func=run)
    return p


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", metavar="DIR",
                   help="folder that contains the `sglang` package (default: the SGLang `import sglang` finds)")
    p.add_argument("--probe", action="store_true",
                   help="ask the ReplaySSM server-argument rules which strategies they accept "
                        "(imports SGLang: slower)")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")


def run(args: argparse.Namespace) -> int:
    checks = collect(getattr(args, "target", None), probe=getattr(args, "probe", False))
    if getattr(args, "json", False):
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        print(format_report(checks))
    return 1 if any(c.status == FAIL for c in checks) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="replayssm-sglang-doctor")
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

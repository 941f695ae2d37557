"""Shared test setup: the Triton interpreter on CPU, offline hub, and extra cases from the environment.

TRITON_INTERPRET must be set before triton (or sglang) is imported, so it is set here at import time.
"""

import json
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Decode v3's main launch is CUDA's by default where it can run (kernels/cuda_main.py; never on a CPU). The tests name
# the launch they check: Triton's unless a test asks for main_impl="cuda" (tests/test_cuda_main.py, the
# test_gpu_real_shapes_cuda_main* cases), so on a GPU the Triton cases keep checking Triton's kernels; the tests of
# the default preference itself set or unset REPLAYSSM_MAIN_IMPL.
os.environ.setdefault("REPLAYSSM_MAIN_IMPL", "triton")
# the pre launch likewise (REPLAYSSM_PRE_IMPL, default "auto": GDN's CUDA pre launch beside the CUDA main launch, since
# session 32): Triton's unless a test asks for pre_impl="cuda" or sets the preference itself
os.environ.setdefault("REPLAYSSM_PRE_IMPL", "triton")

_CASE_KEYS = {"kind", "B", "H", "HV", "K", "V", "L", "T", "state_dtype", "seed"}


def extra_cases(kind: str | None = None) -> list[dict]:
    """Cases from REPLAYSSM_EXTRA_CASES: a JSON list of objects with any of
    kind ("gdn"/"kda"), B, H, HV, K, V, L, T, state_dtype ("float32"/"bfloat16"), seed.
    With ``kind`` given, only the cases of that kind (or naming no kind) are returned."""
    raw = os.environ.get("REPLAYSSM_EXTRA_CASES", "").strip()
    if not raw:
        return []
    cases = json.loads(raw)
    if not isinstance(cases, list) or not all(isinstance(c, dict) for c in cases):
        raise ValueError("REPLAYSSM_EXTRA_CASES must be a JSON list of objects")
    for c in cases:
        unknown = set(c) - _CASE_KEYS
        if unknown:
            raise ValueError(f"REPLAYSSM_EXTRA_CASES: unknown keys {sorted(unknown)} in {c}")
    return [c for c in cases if kind is None or c.get("kind", kind) == kind]


def spy_launches(monkeypatch, module, name: str, record) -> None:
    """Replace the Triton kernel ``module.name`` (for this test) by one that launches the real kernel, then calls
    ``record(grid, args, kwargs)`` with what the launch was given: tests read a launch's grid and constexprs
    (ROW_ORDER, TILE_MMA, ...) from it to check that the path they ask for is the one that ran."""
    real = getattr(module, name)

    class Spy:
        def __getitem__(self, grid):
            def run(*args, **kw):
                out = real[grid](*args, **kw)
                record(grid, args, kw)
                return out
            return run

    monkeypatch.setattr(module, name, Spy())

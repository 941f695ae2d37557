"""Copies of the installed SGLang for tests that patch it (imported by the test modules).

The engine replaces files by rename, so a hard-linked copy is safe to patch; files a test writes
in place (the touched files, the version file) are real copies, never links, so the installed
SGLang is never written.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest


def clone_tree(src: Path, dst: Path, copy: set[str]) -> Path:
    """Hard-link src/sglang into dst, copying the files in `copy` and the version file."""
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src / "sglang", dst / "sglang", copy_function=os.link,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for rel in set(copy) | {"sglang/_version.py"}:
        p = dst / rel
        if p.exists():
            data = p.read_bytes()
            p.unlink()
            p.write_bytes(data)
    return dst


def forget_sglang() -> None:
    """Drop every imported sglang module, so the next import reads sys.path again."""
    for name in [n for n in sys.modules if n == "sglang" or n.startswith("sglang.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@contextmanager
def patched_sglang(dst: Path):
    """SGLang with the series applied, imported from a clone at dst; on exit the clone leaves
    sys.path and sys.modules again, so later test modules see the installed (pristine) SGLang."""
    from replayssm_sglang import patching, pin as pinmod

    tree = clone_tree(patching.find_target(None), dst, set(pinmod.load_pin().files))
    patching.apply(tree)
    forget_sglang()
    sys.path.insert(0, str(tree))
    try:
        import sglang

        assert sglang.__file__.startswith(str(tree)), sglang.__file__
        from sglang.srt.mem_cache import memory_pool

        yield SimpleNamespace(tree=tree, memory_pool=memory_pool)
    finally:
        sys.path.remove(str(tree))
        forget_sglang()


# Fixtures shared by the integration test modules (import them by name into the module).

@pytest.fixture(scope="module")
def sg(tmp_path_factory):
    """The patched SGLang, imported from a clone in tmp for the duration of the module."""
    with patched_sglang(tmp_path_factory.mktemp("patched") / "site") as ns:
        yield ns


@pytest.fixture(autouse=True)
def buffered_window(monkeypatch):
    """Serving lets the small-batch policy pick the decode window per batch size (policy.py), which
    at these test batch sizes is window 1 for most kinds; pin the ring's own L so the lifecycle tests
    exercise pending records (the policy path is tested on its own)."""
    monkeypatch.setenv("REPLAYSSM_DECODE_WINDOW", str(1 << 30))

"""The upstream pin: which SGLang the patch series is for, and the hashes that prove a tree is it.

The record lives in one file, ``patches/PIN.json``::

    {"sglang_version": "0.5.17",
     "series": "sglang-0.5.17",
     "files": {"sglang/srt/server_args.py": ["<sha256 pristine>", "<after patch 1>", ...], ...}}

``files`` lists every file the series touches, relative to the folder that contains the ``sglang``
package, with the sha256 of its pristine content (``null`` for a file the series creates) followed
by its sha256 after each patch of the series in order (``null`` where that stage has no file).
``replayssm-sglang refresh`` writes it; everything else only reads it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

PATCHES_DIR = Path(__file__).resolve().parent.parent / "patches"


def patches_dir() -> Path:
    """The patches/ folder: the repository's in a checkout, the packaged copy in a wheel install."""
    if (PATCHES_DIR / "PIN.json").is_file():
        return PATCHES_DIR
    import replayssm_sglang.patches as packaged  # data-only package, see pyproject.toml

    return Path(list(packaged.__path__)[0])


@dataclass(frozen=True)
class Pin:
    sglang_version: str
    series: str
    files: dict[str, tuple[str | None, ...]]

    @property
    def series_dir(self) -> Path:
        return patches_dir() / self.series

    def stage_hashes(self, k: int) -> dict[str, str | None]:
        """sha256 of every touched file after the first k patches (k = 0: pristine)."""
        return {rel: hashes[k] for rel, hashes in self.files.items()}


def pin_path() -> Path:
    return patches_dir() / "PIN.json"


@lru_cache(maxsize=None)
def load_pin(path: str | None = None) -> Pin:
    data = json.loads(Path(path or pin_path()).read_text())
    return Pin(
        sglang_version=data["sglang_version"],
        series=data["series"],
        files={rel: tuple(h) for rel, h in data["files"].items()},
    )


def write_pin(pin: Pin, path: Path | None = None) -> None:
    data = {
        "sglang_version": pin.sglang_version,
        "series": pin.series,
        "files": {rel: list(h) for rel, h in sorted(pin.files.items())},
    }
    Path(path or pin_path()).write_text(json.dumps(data, indent=2) + "\n")
    load_pin.cache_clear()


def __getattr__(name: str):
    # SGLANG_VERSION is read from PIN.json so the version is recorded exactly once.
    if name == "SGLANG_VERSION":
        return load_pin().sglang_version
    raise AttributeError(name)

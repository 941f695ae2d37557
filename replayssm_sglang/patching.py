"""The patch-series engine: apply, revert, status, check and refresh, all-or-nothing.

A *target* is the folder that contains the ``sglang`` package: a site-packages folder, or the
``python/`` folder of a source checkout. The series (``patches/<series>/series``) is applied with
``git apply`` (GNU ``patch`` where git is missing) to copies of the touched files in a scratch
folder; only when the result hashes to what ``patches/PIN.json`` records are the files swapped
into the target, each by an atomic rename, with every original kept in memory and put back if any
write fails. So a refused or failed run leaves the target byte-identical.

The tree's *stage* is how many patches of the series it holds: every touched file must hash to the
pin's value for one and the same stage. A tree that matches no stage is *drifted* and is refused.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from replayssm_sglang.pin import Pin, load_pin, write_pin


class PatchError(RuntimeError):
    """A refusal or failure, with a message that names the file, the reason and the fix."""


# --- the target ------------------------------------------------------------------------------

def find_target(target: str | os.PathLike | None = None) -> Path:
    """The folder containing the ``sglang`` package: ``target`` itself, or where ``import sglang``
    would find it (located without importing it)."""
    if target is not None:
        t = Path(target).resolve()
        if (t / "sglang" / "__init__.py").is_file():
            return t
        if t.name == "sglang" and (t / "__init__.py").is_file():
            raise PatchError(f"{t} is the sglang package itself; pass its parent folder: --target {t.parent}")
        raise PatchError(
            f"no sglang package under {t}: --target must be the folder that contains `sglang/` "
            "(site-packages, or python/ of a source checkout)"
        )
    import importlib.util

    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise PatchError(
            "SGLang is not importable in this Python; install the pinned version "
            f"(pip install sglang=={load_pin().sglang_version}) or pass --target DIR"
        )
    return Path(list(spec.submodule_search_locations)[0]).resolve().parent


_VERSION_RE = re.compile(r"""^__version__\s*=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M)


def read_version(target: Path) -> str | None:
    """SGLang's version in ``target`` without importing it: ``sglang/_version.py``, then the
    dist-info of a site-packages install."""
    vfile = target / "sglang" / "_version.py"
    if vfile.is_file():
        m = _VERSION_RE.search(vfile.read_text(errors="replace"))
        if m:
            return m.group(1)
    for meta in sorted(target.glob("sglang-*.dist-info/METADATA")):
        for line in meta.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    return None


def sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None


# --- the series ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Patch:
    name: str
    path: Path

    def header(self) -> dict[str, str]:
        """The DEP-3-style header fields (Description, Why, Upstream, Retire-when, ...)."""
        fields: dict[str, str] = {}
        key = None
        for line in self.path.read_text().splitlines():
            if line.startswith(("diff --git ", "--- ")):
                break
            m = re.match(r"^([A-Za-z][A-Za-z-]*):\s?(.*)$", line)
            if m:
                key = m.group(1)
                fields[key] = m.group(2)
            elif key and line.startswith(" "):
                fields[key] += "\n" + line.strip()
        return fields


def load_series(pin: Pin | None = None) -> list[Patch]:
    pin = pin or load_pin()
    d = pin.series_dir
    names = [
        ln.split("#", 1)[0].strip()
        for ln in (d / "series").read_text().splitlines()
    ]
    return [Patch(n, d / n) for n in names if n]


def _run_applier(patch: Path, cwd: Path, reverse: bool = False) -> None:
    if shutil.which("git"):
        cmd = ["git", "apply", "--whitespace=nowarn", "-p1"]
        if reverse:
            cmd.append("--reverse")
        cmd.append(str(patch))
        env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(cwd.parent))
    elif shutil.which("patch"):
        cmd = ["patch", "--batch", "--forward", "--silent", "-p1", "-i", str(patch)]
        if reverse:
            cmd = ["patch", "--batch", "--reverse", "--silent", "-p1", "-i", str(patch)]
        env = None
    else:
        raise PatchError("neither git nor GNU patch is installed: apt-get install git (or patch)")
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        verb = "reverse" if reverse else "apply"
        raise PatchError(f"{patch.name} does not {verb} cleanly: {(r.stderr or r.stdout).strip()}")


# --- stages ----------------------------------------------------------------------------------

@dataclass
class PatchState:
    name: str
    applied: bool


@dataclass
class TreeStatus:
    target: Path
    version: str | None
    state: str  # pristine | patched | partial | drifted | wrong-version | missing-files
    stage: int | None
    patches: list[PatchState] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.state in ("pristine", "patched")


def _current_hashes(target: Path, pin: Pin) -> dict[str, str | None]:
    return {rel: sha256_file(target / rel) for rel in pin.files}


def _stage_of(current: dict[str, str | None], pin: Pin) -> int | None:
    n = len(next(iter(pin.files.values()))) if pin.files else 1
    for k in range(n - 1, -1, -1):  # prefer "patched" when a patch leaves a file unchanged
        if current == pin.stage_hashes(k):
            return k
    return None


def status(target: str | os.PathLike | None = None, pin: Pin | None = None) -> TreeStatus:
    pin = pin or load_pin()
    t = find_target(target)
    series = load_series(pin)
    version = read_version(t)
    st = TreeStatus(target=t, version=version, state="", stage=None,
                    patches=[PatchState(p.name, False) for p in series])
    if version != pin.sglang_version:
        st.state = "wrong-version"
        st.problems.append(
            f"{t}/sglang is SGLang {version or 'of unknown version'}; the series is for "
            f"{pin.sglang_version}: pip install --force-reinstall --no-deps sglang=={pin.sglang_version}"
        )
        return st
    current = _current_hashes(t, pin)
    k = _stage_of(current, pin)
    if k is not None:
        st.stage = k
        st.state = "pristine" if k == 0 else "patched" if k == len(series) else "partial"
        for i, p in enumerate(st.patches):
            p.applied = i < k
        if st.state == "partial":
            st.problems.append(
                f"only the first {k} of {len(series)} patches are applied: run `replayssm-sglang apply` "
                "to finish or `replayssm-sglang revert` to undo"
            )
        return st
    known = {rel: set(h) for rel, h in pin.files.items()}
    missing = [rel for rel, h in current.items() if h is None and None not in known[rel]]
    st.state = "missing-files" if missing else "drifted"
    for rel in missing:
        st.problems.append(f"{t / rel}: missing (the series needs it)")
    for rel, h in current.items():
        if h is not None and h not in known[rel]:
            st.problems.append(
                f"{t / rel}: edited (sha256 {h[:12]}... matches neither the pristine "
                f"{pin.sglang_version} file nor any patch stage)"
            )
    if not st.problems:  # every file is at some stage, but not all at the same one
        stages = {rel: [i for i, x in enumerate(pin.files[rel]) if x == h] for rel, h in current.items()}
        st.problems.append(f"files are at different patch stages: {stages}")
    st.problems.append(
        f"restore the pristine files with `pip install --force-reinstall --no-deps sglang=={pin.sglang_version}`"
        + (" (or re-extract the source checkout)" if not (t / "sglang-" f"{pin.sglang_version}.dist-info").exists() else "")
    )
    return st


def _require_stage(st: TreeStatus, action: str) -> int:
    if st.stage is None:
        raise PatchError(f"refusing to {action} {st.target}: nothing was changed.\n  " + "\n  ".join(st.problems))
    return st.stage


# --- transforming copies and installing them ----------------------------------------------------

def _materialize(files: dict[str, bytes | None], root: Path) -> None:
    for rel, data in files.items():
        if data is not None:
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)


def _read_tree(root: Path, rels) -> dict[str, bytes | None]:
    out: dict[str, bytes | None] = {}
    for rel in rels:
        p = root / rel
        out[rel] = p.read_bytes() if p.is_file() else None
    return out


def transform(files: dict[str, bytes | None], patches: list[Patch], reverse: bool = False) -> dict[str, bytes | None]:
    """Apply (or reverse, in reverse order) ``patches`` to in-memory copies of ``files``."""
    with tempfile.TemporaryDirectory(prefix="replayssm-series-") as tmp:
        root = Path(tmp) / "tree"
        root.mkdir()
        _materialize(files, root)
        for p in (reversed(patches) if reverse else patches):
            _run_applier(p.path, root, reverse=reverse)
        return _read_tree(root, files.keys())


def _write_atomic(path: Path, data: bytes | None) -> None:
    """Replace one file by an atomic rename (or remove it when data is None)."""
    if data is None:
        if path.exists():
            path.unlink()
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".replayssm-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _install(target: Path, new: dict[str, bytes | None]) -> None:
    """Write every file or none: on any failure, put back what was already replaced."""
    originals = _read_tree(target, new.keys())
    done: list[str] = []
    try:
        for rel, data in new.items():
            if originals[rel] == data:
                continue
            _write_atomic(target / rel, data)
            done.append(rel)
    except BaseException as e:
        for rel in reversed(done):
            _write_atomic(target / rel, originals[rel])
        if isinstance(e, PermissionError):
            raise PatchError(f"cannot write {e.filename}: run as a user who can write {target}, "
                             "or install SGLang in a virtual environment") from e
        raise


def _check_result(result: dict[str, bytes | None], expect: dict[str, str | None], what: str) -> None:
    got = {rel: (hashlib.sha256(d).hexdigest() if d is not None else None) for rel, d in result.items()}
    bad = [rel for rel in expect if got[rel] != expect[rel]]
    if bad:
        raise PatchError(
            f"{what} produced content the pin does not record for {', '.join(bad)}: the pin is stale; "
            "a developer must run `replayssm-sglang refresh --pin-only --pristine DIR`"
        )


# --- the verbs ---------------------------------------------------------------------------------

@dataclass
class Result:
    changed: bool
    message: str
    status: TreeStatus


def apply(target: str | os.PathLike | None = None, dry_run: bool = False) -> Result:
    pin = load_pin()
    st = status(target, pin)
    series = load_series(pin)
    k = _require_stage(st, "patch")
    if k == len(series):
        return Result(False, f"already applied: all {len(series)} patches of {pin.series} are in {st.target} (nothing to do)", st)
    new = transform(_read_tree(st.target, pin.files), series[k:])
    _check_result(new, pin.stage_hashes(len(series)), "applying the series")
    if dry_run:
        return Result(False, f"the series would apply cleanly to {st.target} ({len(series) - k} patches)", st)
    _install(st.target, new)
    return Result(True, f"applied {len(series) - k} patches of {pin.series} to {st.target}", status(st.target, pin))


def revert(target: str | os.PathLike | None = None) -> Result:
    pin = load_pin()
    st = status(target, pin)
    series = load_series(pin)
    k = _require_stage(st, "revert")
    if k == 0:
        return Result(False, f"already pristine: {st.target} holds none of the series (nothing to do)", st)
    new = transform(_read_tree(st.target, pin.files), series[:k], reverse=True)
    _check_result(new, pin.stage_hashes(0), "reverting the series")
    _install(st.target, new)
    return Result(True, f"reverted {k} patches; {st.target} is pristine SGLang {pin.sglang_version} again", status(st.target, pin))


def check(target: str | os.PathLike | None = None) -> Result:
    """Would ``apply`` succeed (or has it)? Changes nothing."""
    pin = load_pin()
    st = status(target, pin)
    _require_stage(st, "patch")
    if st.state == "patched":
        return Result(False, "the series is applied and every touched file matches the pin", st)
    return apply(target, dry_run=True)


# --- refresh (developers) ------------------------------------------------------------------------

PATCH_TEMPLATE = """Description: {name}
Why: (say why SGLang needs this change)
Upstream: (the issue or PR this answers, or "not yet proposed")
Retire-when: (the upstream change that makes this patch unnecessary)

"""


def _diff(rel: str, old: bytes | None, new: bytes | None) -> str:
    if old == new:
        return ""
    with tempfile.TemporaryDirectory(prefix="replayssm-diff-") as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        _materialize({rel: old}, a)
        _materialize({rel: new}, b)
        # run from the scratch folder with the sides named a/<rel> and b/<rel>, so --no-prefix
        # gives exactly the -p1 paths git apply and GNU patch expect
        left = f"a/{rel}" if old is not None else "/dev/null"
        right = f"b/{rel}" if new is not None else "/dev/null"
        r = subprocess.run(["git", "diff", "--no-index", "--no-color", "--no-prefix", "-U3", left, right],
                           cwd=tmp, capture_output=True, text=True)
        if r.returncode not in (0, 1):
            raise PatchError(f"git diff failed for {rel}: {r.stderr.strip()}")
        return r.stdout


def refresh(name: str | None, target: str | os.PathLike, pristine: str | os.PathLike | None,
            add_files: list[str] = (), pin_only: bool = False) -> str:
    """Regenerate patch ``name`` from the edited tree ``target`` (quilt's refresh), then re-pin.

    ``target`` holds the whole series plus the edits meant for ``name``; ``pristine`` is an
    untouched SGLang tree of the pinned version. A ``name`` not yet in the series is appended.
    """
    pin = load_pin()
    src = find_target(pristine)
    if read_version(src) != pin.sglang_version:
        raise PatchError(f"--pristine {src} is SGLang {read_version(src)}, not {pin.sglang_version}")
    series = load_series(pin)
    rels = sorted(set(pin.files) | set(add_files))
    if not pin_only:
        if not name:
            raise PatchError("refresh needs a patch name (or --pin-only)")
        tgt = find_target(target)
        names = [p.name for p in series]
        if name not in names:
            path = pin.series_dir / name
            if not path.exists():
                path.write_text(PATCH_TEMPLATE.format(name=name))
            with open(pin.series_dir / "series", "a") as f:
                f.write(name + "\n")
            series = load_series(pin)
            names = [p.name for p in series]
        i = names.index(name)
        base = transform(_read_tree(src, rels), series[:i])
        edited = transform(_read_tree(tgt, rels), series[i + 1:], reverse=True)
        body = "".join(_diff(rel, base[rel], edited[rel]) for rel in rels)
        if not body:
            raise PatchError(f"{name}: the edited tree holds no change for it")
        p = series[i].path
        text = p.read_text() if p.exists() else PATCH_TEMPLATE.format(name=name)
        cut = re.search(r"^(diff --git |--- )", text, re.M)
        header = text[: cut.start()] if cut else text
        p.write_text(header.rstrip("\n") + "\n\n" + body)
    # re-pin: hashes of every touched file at every stage, from the pristine tree
    touched = set(add_files)
    for p in series:
        touched |= _touched_by(p)
    rels = sorted(touched)
    files = _read_tree(src, rels)
    stages = [{rel: _h(d) for rel, d in files.items()}]
    for j in range(len(series)):
        files = transform(files, [series[j]])
        stages.append({rel: _h(d) for rel, d in files.items()})
    write_pin(Pin(pin.sglang_version, pin.series, {rel: tuple(s[rel] for s in stages) for rel in rels}))
    return f"pinned {len(rels)} files over {len(series)} patches" + ("" if pin_only else f"; refreshed {name}")


def _h(data: bytes | None) -> str | None:
    return hashlib.sha256(data).hexdigest() if data is not None else None


def _touched_by(patch: Patch) -> set[str]:
    out = set()
    for line in patch.path.read_text().splitlines():
        m = re.match(r"^(?:---|\+\+\+) [ab]/(\S+)", line)
        if m:
            out.add(m.group(1))
    return out

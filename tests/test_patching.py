"""The patch-series engine: the real series against pristine SGLang 0.5.17, and a synthetic
two-patch series for stages, refusals and injected failures.

Trees under test are copies of the installed SGLang in tmp: files the tests write are copied,
every other file is hard-linked (the engine replaces files by rename, so the installed SGLang is
never written; `test_installed_sglang_untouched` checks that).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from replayssm_sglang import patching, pin as pinmod
from replayssm_sglang.patching import PatchError

sys.path.insert(0, str(Path(__file__).parent))
from sglang_trees import clone_tree  # noqa: E402

PIN = pinmod.load_pin()


def _installed_target() -> Path:
    try:
        t = patching.find_target(None)
    except PatchError:
        pytest.skip("SGLang is not installed")
    return t


def tree_hashes(root: Path) -> dict[str, str]:
    out = {}
    for p in sorted((root / "sglang").rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


@pytest.fixture(scope="module")
def pristine():
    t = _installed_target()
    st = patching.status(t)
    if st.state != "pristine":
        pytest.fail(f"the installed SGLang must be pristine for these tests: {st.state} {st.problems}")
    return t


@pytest.fixture(scope="module")
def pristine_hashes(pristine):
    return tree_hashes(pristine)


@pytest.fixture
def tree(pristine, tmp_path):
    return clone_tree(pristine, tmp_path / "site", set(PIN.files))


# --- the real series ---------------------------------------------------------------------------

def test_series_is_non_empty_and_pinned():
    series = patching.load_series()
    assert series, "the series must not be empty"
    touched = set().union(*(patching._touched_by(p) for p in series))
    assert touched == set(PIN.files), "PIN.json must list exactly the files the series touches"
    for hashes in PIN.files.values():
        assert len(hashes) == len(series) + 1


def test_every_patch_has_a_dep3_header():
    for p in patching.load_series():
        h = p.header()
        for key in ("Description", "Why", "Upstream", "Retire-when"):
            assert h.get(key, "").strip(), f"{p.name}: header field {key} is missing or empty"
            assert not h[key].startswith("("), f"{p.name}: {key} still holds the template text"


def test_apply_noop_revert_is_byte_identical(tree, pristine_hashes):
    before = tree_hashes(tree)
    assert before == pristine_hashes
    assert patching.status(tree).state == "pristine"
    r = patching.apply(tree)
    assert r.changed and r.status.state == "patched"
    assert all(p.applied for p in r.status.patches)
    patched = tree_hashes(tree)
    assert patched != before
    for rel, hashes in PIN.files.items():
        assert patched[rel] == hashes[-1]
    r2 = patching.apply(tree)
    assert not r2.changed and "already applied" in r2.message
    assert tree_hashes(tree) == patched
    r3 = patching.revert(tree)
    assert r3.changed and r3.status.state == "pristine"
    assert tree_hashes(tree) == before
    assert not patching.revert(tree).changed


def test_patched_modules_import_on_cpu(tree):
    patching.apply(tree)
    code = (
        "import sglang, sglang.srt.server_args as sa, sys\n"
        f"assert sglang.__file__.startswith({str(tree)!r}), sglang.__file__\n"
        "src = open(sa.__file__).read()\n"
        "assert 'replayssm_sglang.sglang_hooks' in src\n"
        "import sglang.srt.mem_cache.memory_pool, sglang.srt.layers.attention.hybrid_linear_attn_backend\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=str(tree) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_wrong_version_is_refused_unchanged(tree):
    v = tree / "sglang" / "_version.py"
    v.write_text(v.read_text().replace("0.5.17", "0.5.16").replace("(0, 5, 17)", "(0, 5, 16)"))
    before = tree_hashes(tree)
    st = patching.status(tree)
    assert st.state == "wrong-version" and st.version == "0.5.16"
    with pytest.raises(PatchError, match=r"0\.5\.16.*0\.5\.17"):
        patching.apply(tree)
    assert tree_hashes(tree) == before


def test_edited_touched_file_is_refused_unchanged(tree):
    rel = next(iter(PIN.files))
    with open(tree / rel, "a") as f:
        f.write("# local edit\n")
    before = tree_hashes(tree)
    st = patching.status(tree)
    assert st.state == "drifted"
    with pytest.raises(PatchError) as e:
        patching.apply(tree)
    assert rel in str(e.value) and "edited" in str(e.value)
    assert "pip install --force-reinstall" in str(e.value)
    assert tree_hashes(tree) == before
    with pytest.raises(PatchError):
        patching.revert(tree)
    assert tree_hashes(tree) == before


def test_missing_file_is_refused_unchanged(tree):
    rel = next(iter(PIN.files))
    (tree / rel).unlink()
    before = tree_hashes(tree)
    st = patching.status(tree)
    assert st.state == "missing-files"
    with pytest.raises(PatchError, match="missing"):
        patching.apply(tree)
    assert tree_hashes(tree) == before


def test_not_a_target_names_the_fix(tmp_path, pristine):
    with pytest.raises(PatchError, match="folder that contains `sglang/`"):
        patching.find_target(tmp_path)
    with pytest.raises(PatchError, match="pass its parent folder"):
        patching.find_target(pristine / "sglang")


def test_cli_exit_codes_and_output(tree):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "replayssm_sglang.cli", *args, "--target", str(tree)],
                              capture_output=True, text=True, timeout=120)

    r = cli("status")
    assert r.returncode == 0 and "pristine" in r.stdout and "[ ]" in r.stdout
    assert cli("check").returncode == 0
    assert cli("apply").returncode == 0
    r = cli("status")
    assert r.returncode == 0 and "patched" in r.stdout and "[x]" in r.stdout
    r = cli("apply")
    assert r.returncode == 0 and "already applied" in r.stdout
    assert cli("revert").returncode == 0
    rel = next(iter(PIN.files))
    with open(tree / rel, "a") as f:
        f.write("#\n")
    r = cli("status")
    assert r.returncode == 1 and "drifted" in r.stdout
    r = cli("apply")
    assert r.returncode == 2 and "edited" in r.stderr


def test_apply_patches_script(tree):
    script = Path(__file__).resolve().parents[1] / "scripts" / "apply-patches"
    r = subprocess.run(["bash", str(script), "--target", str(tree)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert patching.status(tree).state == "patched"


# --- a synthetic two-patch series over three files ---------------------------------------------

FILES = {
    "sglang/a.py": "def a():\n    return 1\n",
    "sglang/b.py": "def b():\n    return 2\n",
}


@pytest.fixture
def synthetic(tmp_path, monkeypatch):
    """A fake SGLang 9.9.9 tree and a series of two patches (the second creates sglang/c.py),
    pinned with the engine's own refresh."""
    pristine = tmp_path / "pristine"
    (pristine / "sglang").mkdir(parents=True)
    (pristine / "sglang" / "__init__.py").write_text("")
    (pristine / "sglang" / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    for rel, text in FILES.items():
        (pristine / rel).write_text(text)
    pdir = tmp_path / "patches"
    (pdir / "fake").mkdir(parents=True)
    (pdir / "fake" / "series").write_text("")
    (pdir / "PIN.json").write_text('{"sglang_version": "9.9.9", "series": "fake", "files": {}}')
    monkeypatch.setattr(pinmod, "PATCHES_DIR", pdir)
    pinmod.load_pin.cache_clear()
    # developer flow: edit a copy, refresh patch 1; edit again, refresh patch 2
    work = tmp_path / "work"
    shutil.copytree(pristine, work)
    (work / "sglang/a.py").write_text("def a():\n    return 10\n")
    (work / "sglang/b.py").write_text("def b():\n    return 20\n")
    patching.refresh("0001-ab.patch", work, pristine, ["sglang/a.py", "sglang/b.py"])
    (work / "sglang/c.py").write_text("C = 3\n")
    (work / "sglang/a.py").write_text("def a():\n    return 100\n")
    patching.refresh("0002-c.patch", work, pristine, ["sglang/c.py"])
    for p in (pdir / "fake").glob("*.patch"):  # fill in the headers the template left open
        p.write_text(p.read_text().replace("(say why SGLang needs this change)", "test"))
    target = tmp_path / "target"
    shutil.copytree(pristine, target)
    yield pristine, work, target
    pinmod.load_pin.cache_clear()


def _read(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_synthetic_refresh_round_trip(synthetic):
    pristine, work, target = synthetic
    pin = pinmod.load_pin()
    assert set(pin.files) == {"sglang/a.py", "sglang/b.py", "sglang/c.py"}
    assert pin.files["sglang/c.py"][0] is None  # created by patch 2
    before = _read(target)
    patching.apply(target)
    assert _read(target) == _read(work)  # the series reproduces the edited tree exactly
    patching.revert(target)
    assert _read(target) == before
    assert not (target / "sglang/c.py").exists()


def test_synthetic_partial_stage_is_reported_and_finished(synthetic):
    pristine, work, target = synthetic
    series = patching.load_series()
    subprocess.run(["git", "apply", "-p1", str(series[0].path)], cwd=target, check=True)
    st = patching.status(target)
    assert st.state == "partial" and st.stage == 1
    assert [p.applied for p in st.patches] == [True, False]
    patching.apply(target)
    assert _read(target) == _read(work)


def test_failure_midway_leaves_nothing_half_applied(synthetic, monkeypatch):
    pristine, work, target = synthetic
    before = _read(target)
    real = patching._write_atomic
    calls = []

    def flaky(path, data):
        calls.append(path)
        if len(calls) == 2:
            raise OSError("injected failure while writing the second file")
        return real(path, data)

    monkeypatch.setattr(patching, "_write_atomic", flaky)
    with pytest.raises(OSError, match="injected"):
        patching.apply(target)
    monkeypatch.setattr(patching, "_write_atomic", real)
    assert len(calls) >= 2
    assert _read(target) == before
    assert patching.status(target).state == "pristine"


def test_patch_that_no_longer_applies_is_refused(synthetic):
    pristine, work, target = synthetic
    pin = pinmod.load_pin()
    p = pin.series_dir / "0001-ab.patch"
    p.write_text(p.read_text().replace("return 10", "return 11"))  # patch 2's context breaks
    before = _read(target)
    with pytest.raises(PatchError, match="0002-c.patch does not apply cleanly"):
        patching.apply(target)
    assert _read(target) == before


def test_stale_pin_is_refused(synthetic):
    pristine, work, target = synthetic
    pin = pinmod.load_pin()
    p = pin.series_dir / "0002-c.patch"
    p.write_text(p.read_text().replace("+C = 3", "+C = 4"))  # applies, but not to what is pinned
    before = _read(target)
    with pytest.raises(PatchError, match="pin is stale"):
        patching.apply(target)
    assert _read(target) == before


def test_installed_sglang_untouched(pristine, pristine_hashes):
    assert tree_hashes(pristine) == pristine_hashes
    assert patching.status(pristine).state == "pristine"

"""`replayssm-sglang doctor` with the patch engine, torch and the kernels replaced by fakes.

For every tree state the report must carry the state, and every warning or failure must come
with an action line (``-> ...``) that names a command or flag to run.
"""

from __future__ import annotations

import argparse
import types
from pathlib import Path

import pytest

from replayssm_sglang import doctor as D

PIN = "0.5.17"


class FakePatchError(RuntimeError):
    pass


def fake_engine(state: str | None = "patched", *, version: str | None = PIN, find_error: str | None = None,
                problems=(), target: Path = Path("/fake/site-packages")):
    n = 3
    applied = {"pristine": 0, "patched": n, "partial": 1}.get(state, 0)
    st = types.SimpleNamespace(
        target=target, version=version, state=state, stage=applied,
        patches=[types.SimpleNamespace(name=f"000{i + 1}-p.patch", applied=i < applied) for i in range(n)],
        problems=list(problems),
    )

    def find_target(t=None):
        if find_error:
            raise FakePatchError(find_error)
        return target

    def status(t=None):
        return st

    pin = types.SimpleNamespace(SGLANG_VERSION=PIN)
    patching = types.SimpleNamespace(find_target=find_target, status=status, PatchError=FakePatchError)
    return pin, patching


@pytest.fixture
def fakes(monkeypatch):
    """Defaults: engine patched, kernels import, no GPU, installed sglang == the fake target."""
    state = {"engine": fake_engine()}
    monkeypatch.setattr(D, "_load_engine", lambda: state["engine"])
    monkeypatch.setattr(D, "_kernel_modules", lambda: (None, [("decode", None)]))
    monkeypatch.setattr(D, "_torch_info", lambda: {"torch": "2.x", "cuda_build": "13.0", "available": False, "devices": []})
    monkeypatch.setattr(D, "_installed_sglang", lambda: (PIN, Path("/fake/site-packages")))
    monkeypatch.setattr(D, "_load_rules", lambda: types.SimpleNamespace())
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    return state


def by_name(checks, name):
    found = [c for c in checks if c.name == name]
    assert found, [c.name for c in checks]
    return found[0]


def assert_actionable(checks):
    for c in checks:
        if c.status in (D.WARN, D.FAIL):
            assert c.action and c.action.strip(), f"{c.name} ({c.status}) has no action: {c.detail}"


@pytest.mark.parametrize("state,status,must_say", [
    ("pristine", D.WARN, "replayssm-sglang apply"),
    ("patched", D.OK, None),
    ("partial", D.FAIL, "replayssm-sglang revert"),
    ("drifted", D.FAIL, f"pip install --force-reinstall --no-deps sglang=={PIN}"),
    ("wrong-version", D.FAIL, f"sglang=={PIN}"),
    ("missing-files", D.FAIL, f"sglang=={PIN}"),
    ("something-new", D.FAIL, "bug"),
])
def test_each_state_has_its_status_and_action(fakes, state, status, must_say):
    version = "0.5.99" if state == "wrong-version" else PIN
    fakes["engine"] = fake_engine(state, version=version, problems=[f"problem for {state}"])
    checks = D.collect()
    s = by_name(checks, "series")
    assert s.status == status
    assert state in s.detail
    assert f"problem for {state}" in s.detail  # the engine's own messages are shown
    if must_say:
        assert must_say in s.action
    else:
        assert s.action is None
    assert_actionable(checks)
    text = D.format_report(checks)
    if must_say:  # the action is printed (wrapped at 100 columns) after "->"
        assert "-> " + s.action in " ".join(text.split())


def test_wrong_version_is_a_pin_mismatch(fakes):
    fakes["engine"] = fake_engine("wrong-version", version="0.5.23")
    checks = D.collect()
    sg = by_name(checks, "sglang")
    assert sg.status == D.FAIL and "0.5.23" in sg.detail and "MISMATCH" in sg.detail
    assert PIN in sg.action


def test_target_is_passed_into_the_actions(fakes):
    fakes["engine"] = fake_engine("pristine")
    checks = D.collect("/some/dir")
    assert by_name(checks, "series").action == "replayssm-sglang apply --target /some/dir"


def test_no_sglang_found(fakes):
    fakes["engine"] = fake_engine(find_error="SGLang is not importable in this Python")
    checks = D.collect()
    sg = by_name(checks, "sglang")
    assert sg.status == D.FAIL and "not importable" in sg.detail
    assert f"pip install sglang=={PIN}" in sg.action and "--target" in sg.action
    assert by_name(checks, "flags").status == D.INFO
    assert_actionable(checks)


def test_engine_unavailable_degrades(fakes, monkeypatch):
    def boom():
        raise ImportError("No module named 'replayssm_sglang.patching'")

    monkeypatch.setattr(D, "_load_engine", boom)
    checks = D.collect()
    pe = by_name(checks, "patch-engine")
    assert pe.status == D.FAIL and "patch engine not available" in pe.detail
    # the rest of the report is still there
    assert by_name(checks, "sglang").status == D.INFO
    assert by_name(checks, "kernels.decode").status == D.OK
    assert_actionable(checks)


def test_tree_is_not_the_imported_sglang(fakes, monkeypatch):
    monkeypatch.setattr(D, "_installed_sglang", lambda: (PIN, Path("/elsewhere")))
    checks = D.collect()
    c = by_name(checks, "sglang-import")
    assert c.status == D.WARN and "/elsewhere" in c.detail
    assert_actionable(checks)


def test_kernels_import_failure(fakes, monkeypatch):
    monkeypatch.setattr(D, "_kernel_modules", lambda: (None, [("decode", None),
                                                               ("verify", "ModuleNotFoundError: No module named 'triton'")]))
    checks = D.collect()
    v = by_name(checks, "kernels.verify")
    assert v.status == D.FAIL and "triton" in v.action
    assert_actionable(checks)


def test_kernels_package_missing_or_empty(fakes, monkeypatch):
    monkeypatch.setattr(D, "_kernel_modules", lambda: ("ImportError: boom", []))
    assert by_name(D.collect(), "kernels").status == D.FAIL
    monkeypatch.setattr(D, "_kernel_modules", lambda: (None, []))
    c = by_name(D.collect(), "kernels")
    assert c.status == D.WARN and c.action


def test_real_kernel_modules_listing():
    err, mods = D._kernel_modules()
    assert err is None or isinstance(err, str)
    for name, e in mods:
        assert isinstance(name, str) and (e is None or isinstance(e, str))


@pytest.mark.parametrize("info,status,text", [
    ({"torch": "2.x", "cuda_build": None, "available": False, "devices": []}, D.WARN, "CPU-only"),
    ({"torch": "2.x", "cuda_build": "13.0", "available": False, "devices": []}, D.WARN, "no CUDA device"),
    ({"torch": "2.x", "cuda_build": "13.0", "available": True, "devices": [("NVIDIA H200", (9, 0))]}, D.OK, "tested"),
    ({"torch": "2.x", "cuda_build": "13.0", "available": True, "devices": [("NVIDIA A100", (8, 0))]}, D.WARN, "not measured"),
    ({"torch": "2.x", "cuda_build": "13.0", "available": True, "devices": [("Tesla V100", (7, 0))]}, D.FAIL, "7.0"),
])
def test_gpu(info, status, text):
    checks = D.check_gpu(info)
    gpu = [c for c in checks if c.name.startswith("gpu")][0]
    assert gpu.status == status and text in gpu.detail
    assert_actionable(checks)


def test_torch_missing():
    checks = D.check_gpu({"error": "ModuleNotFoundError: No module named 'torch'"})
    assert checks[0].status == D.FAIL and checks[0].action


def test_triton_interpret_with_gpu(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    checks = D.check_gpu({"torch": "2.x", "cuda_build": "13.0", "available": True, "devices": [("NVIDIA H200", (9, 0))]})
    c = by_name(checks, "triton")
    assert c.status == D.WARN and "unset TRITON_INTERPRET" in c.action


def test_flags_unpatched_names_the_upstream_recipe(fakes):
    fakes["engine"] = fake_engine("pristine")
    f = by_name(D.collect(), "flags")
    assert f.status == D.WARN
    assert "--mamba-radix-cache-strategy no_buffer --disable-overlap-schedule" in f.action


def test_flags_patched_with_full_capabilities(fakes, monkeypatch):
    monkeypatch.setattr(D, "_load_rules", lambda: types.SimpleNamespace(
        CAPABILITIES={"extra_buffer": True, "overlap_schedule": True, "cuda_graph": True, "spec_verify": True,
                      "read_copy": True}))
    checks = D.collect()
    f = by_name(checks, "flags")
    assert f.status == D.OK
    assert "auto -> extra_buffer" in f.detail and "overlap" in f.detail and "CUDA graphs" in f.detail
    assert by_name(checks, "flags-spec").status == D.INFO
    rc = by_name(checks, "flags-read-copy")
    assert rc.status == D.INFO and "--linear-replayssm-read-dtype bf16|fp8_e4m3" in rc.detail


def test_flags_patched_without_extra_buffer(fakes, monkeypatch):
    monkeypatch.setattr(D, "_load_rules", lambda: types.SimpleNamespace(CAPABILITIES={"extra_buffer": False}))
    checks = D.collect()
    f = by_name(checks, "flags")
    assert f.status == D.WARN and "no_buffer --disable-overlap-schedule" in f.action
    assert_actionable(checks)


def test_flags_patched_probe(fakes, monkeypatch):
    def validate(args, decode):
        assert args.mamba_radix_cache_strategy == "extra_buffer" and decode == "triton"
        raise ValueError("does not support the extra_buffer mamba radix-cache strategy in this build")

    monkeypatch.setattr(D, "_load_rules", lambda: types.SimpleNamespace(validate=validate))
    f = by_name(D.collect(probe=True), "flags")
    assert f.status == D.WARN and "extra_buffer" in f.detail
    # without --probe and without CAPABILITIES: say how to find out
    checks = D.collect()
    assert by_name(checks, "flags").status == D.INFO
    assert "--probe" in by_name(checks, "flags-probe").detail


def test_flags_rules_module_broken(fakes, monkeypatch):
    def boom():
        raise ImportError("no sglang_hooks")

    monkeypatch.setattr(D, "_load_rules", boom)
    checks = D.collect()
    f = by_name(checks, "flags")
    assert f.status == D.FAIL and "revert" in f.action


def test_run_exit_status_and_json(fakes, capsys):
    args = argparse.Namespace(target=None, probe=False, json=True)
    assert D.run(args) == 0
    import json

    data = json.loads(capsys.readouterr().out)
    assert {"name", "status", "detail", "action"} <= set(data[0])
    fakes["engine"] = fake_engine("drifted")
    assert D.run(argparse.Namespace(target=None, probe=False, json=False)) == 1
    assert "problem(s)" in capsys.readouterr().out


def test_add_parser_sets_func():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    D.add_parser(sub)
    args = ap.parse_args(["doctor", "--target", "/x", "--probe"])
    assert args.func is D.run and args.target == "/x" and args.probe


@pytest.mark.sglang
def test_real_engine_on_the_installed_sglang(monkeypatch):
    """The real patch engine on the SGLang of this environment: the report names a known state and
    every problem has an action. (GPU and kernels are faked: they are covered above.)"""
    import importlib.util

    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed in this environment")
    monkeypatch.setattr(D, "_kernel_modules", lambda: (None, [("decode", None)]))
    monkeypatch.setattr(D, "_torch_info", lambda: {"torch": "2.x", "cuda_build": "13.0", "available": False, "devices": []})
    checks = D.collect()
    s = by_name(checks, "series")
    assert any(state in s.detail for state in D._STATE_ADVICE), s.detail
    assert by_name(checks, "sglang").detail.startswith("SGLang ")
    assert_actionable(checks)


H200 = {"torch": "2.x", "cuda_build": "13.0", "available": True, "devices": [("NVIDIA H200", (9, 0))]}
A100 = {"torch": "2.x", "cuda_build": "13.0", "available": True, "devices": [("NVIDIA A100", (8, 0))]}
NOGPU = {"torch": "2.x", "cuda_build": None, "available": False, "devices": []}


def _tc(**kw):
    tc = {"nvcc": "/usr/local/cuda/bin/nvcc", "cache": "/c", "cubins": 0, "impl": "auto",
          "impls": ("auto", "cuda", "triton"), "pre_impl": "auto", "pre_impls": ("auto", "cuda", "triton")}
    tc.update(kw)
    return tc


@pytest.mark.parametrize("info,tc,status,text", [
    (H200, _tc(), D.OK, "CUDA (kernels/gdn_main.cu)"),
    (H200, _tc(impl="cuda"), D.OK, "built at first use by /usr/local/cuda/bin/nvcc"),
    (H200, _tc(nvcc=None, cubins=3), D.OK, "cached cubins only (3 in /c"),
    (H200, _tc(nvcc=None), D.WARN, "neither nvcc nor cached cubins"),
    (H200, _tc(impl="triton"), D.INFO, "Triton's (REPLAYSSM_MAIN_IMPL=triton)"),
    (H200, _tc(impl="fast"), D.FAIL, "'fast'"),
    (H200, _tc(pre_impl="ptx"), D.FAIL, "REPLAYSSM_PRE_IMPL='ptx'"),
    (H200, _tc(pre_impl="triton"), D.OK, "CUDA (kernels/gdn_main.cu)"),
    (A100, _tc(), D.INFO, "needs sm_90"),
    (NOGPU, _tc(), D.INFO, "no CUDA GPU"),
])
def test_main_launch(info, tc, status, text):
    """doctor says which decode main launch the server will take (the CUDA one, the default where it can run, or
    Triton's) and, where the CUDA one is missing only for want of nvcc, how to get it."""
    checks = D.check_main_launch(info, tc)
    c = by_name(checks, "main-launch")
    assert c.status == status and text in c.detail + (c.action or "")
    assert_actionable(checks)


def test_main_launch_reads_the_real_toolchain(monkeypatch, tmp_path):
    monkeypatch.setenv("REPLAYSSM_CUBIN_DIR", str(tmp_path))
    monkeypatch.setenv("REPLAYSSM_NVCC", str(tmp_path / "no-nvcc"))
    (tmp_path / "gdn_main-0123.cubin").write_bytes(b"x")
    monkeypatch.delenv("REPLAYSSM_MAIN_IMPL", raising=False)
    tc = D._cuda_main_toolchain()
    monkeypatch.delenv("REPLAYSSM_PRE_IMPL", raising=False)
    assert tc["nvcc"] is None and tc["cubins"] == 1 and tc["cache"] == str(tmp_path) and tc["impl"] == "auto"
    assert D._cuda_main_toolchain()["pre_impl"] == "auto"
    c = by_name(D.check_main_launch(H200), "main-launch")
    assert c.status == D.OK and "cached cubins only (1 in" in c.detail

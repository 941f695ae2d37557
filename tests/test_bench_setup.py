"""scripts/bench_kernels.py's arm setup on CPU (Triton interpreter): the server-like arguments (ring keyed by request
row through ring_idx, a forced-flush mask) must give the same decode as the plain setup (ring keyed by slot), so
that a timing difference between the two is the kernels' and not a different computation."""

import builtins
import os
import shutil
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import bench_kernels as bk  # noqa: E402
from conftest import spy_launches  # noqa: E402


def _decode_outputs(kind, rec, *, B=6, L=4, steps=6, **arm_kw):
    """Six decode steps (by default) of one bench arm (bk.arm_ours, impl v3) on 6 rows at L = 4 with staggered
    cursors, so every step has rows that write their checkpoint; the outputs [steps, B, 1, HV, V] (each step's
    poisoned with NaN first)."""
    c = bk.Case(kind, B, "float32", torch.device("cpu"), L=L)
    run = bk.arm_ours(c, rec, impl="v3", **arm_kw)
    outs = []
    for st in range(steps):
        c.out.fill_(float("nan"))
        run(st)
        outs.append(c.out.float().clone())
    return torch.stack(outs)


def _emulate_with_spy(monkeypatch, shapes: dict, what) -> list:
    """The CUDA launches emulated on the CPU (REPLAYSSM_CUDA_EMULATE), the benchmark's head shapes replaced by
    `shapes`, and a list that gets what(arguments) of every CUDA main launch."""
    from replayssm_sglang.kernels import cuda_main

    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    monkeypatch.setattr(bk, "KIND_SHAPES", shapes)
    seen = []
    real = cuda_main.launch
    monkeypatch.setattr(cuda_main, "launch", lambda **a: seen.append(what(a)) or real(**a))
    return seen


@pytest.mark.parametrize("kind,read_dtype", [("gdn", "bf16"), ("kda", "fp8_e4m3"), ("kda", "same")])
def test_server_like_arm_same_outputs(kind, read_dtype, monkeypatch):
    monkeypatch.setattr(bk, "KIND_SHAPES", {"gdn": dict(H=2, HV=4, K=32, V=16), "kda": dict(H=2, HV=2, K=32, V=16)})
    outs = [_decode_outputs(kind, torch.float32, read_dtype=read_dtype, server_like=server_like)
            for server_like in (False, True)]
    assert torch.isfinite(outs[1]).all() and outs[1].abs().max() > 0
    assert torch.equal(outs[0], outs[1])


def test_split_table():
    """--table on a --step-split JSON: one row per (kind, arm), the speed-up against the conventional arm, and the
    launches' median / max."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results",
                        "kernels-split-20261130-2311-pred-opts.json")
    t = bk.table(path)
    assert "| kda | v3_r32_pred | 194.4 | 1.41x | 148.3 / 584.2 |  | 18.0 |" in t, t
    assert "| gdn | v3_r32 | 181.3 | 1.50x | 143.0 / 501.3 |" in t, t


@pytest.mark.parametrize("kind,read_dtype", [("gdn", "bf16"), ("kda", "bf16"), ("kda", "same")])
@pytest.mark.parametrize("parts", ["ident", "perm", "perm+i32", "forced", "ident+i32+forced"])
def test_server_parts_same_outputs(kind, read_dtype, parts, monkeypatch):
    """Each part of the server-like setup alone (bench_kernels.SERVER_PARTS) gives the decode of the plain setup, bit
    for bit, so the split can time the parts one at a time."""
    monkeypatch.setattr(bk, "KIND_SHAPES", {"gdn": dict(H=2, HV=4, K=32, V=16), "kda": dict(H=2, HV=2, K=32, V=16)})
    outs = [_decode_outputs(kind, torch.float32, read_dtype=read_dtype, parts=p) for p in ("", parts)]
    assert torch.isfinite(outs[1]).all() and outs[1].abs().max() > 0
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("bad", ["perm+ident", "i32", "rows", "perm+x"])
def test_server_parts_refused(bad):
    c = bk.Case("gdn", 2, "float32", torch.device("cpu"), L=4)
    with pytest.raises(ValueError, match="parts"):
        bk.arm_ours(c, torch.float32, impl="v3", parts=bad)


def test_verify_mode_smoke():
    """`bench_kernels.py --verify` runs the verify benchmark (issue 4's verify mode): its CPU smoke, every arm against
    the float64 accepted stream over six steps of mixed acceptance, asserting agreement (bench_verify.smoke)."""
    import subprocess

    script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "bench_kernels.py")
    out = subprocess.run([sys.executable, script, "--verify", "--smoke"], capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, TRITON_INTERPRET="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "smoke ok" in out.stdout and "smoke gdn step 5 ours" in out.stdout, out.stdout[-2000:]


def _spy_main_launch(monkeypatch, key: str) -> list:
    """decode v3's main launch recorded: the list of its keyword argument ``key`` (a constexpr such as TILE_MMA), one
    entry per launch."""
    from replayssm_sglang.kernels import decode_v3

    seen = []
    spy_launches(monkeypatch, decode_v3, "replay_decode_v3_kernel", lambda g, a, kw: seen.append(kw[key]))
    return seen


@pytest.mark.parametrize("v3_opts", [dict(tile_mma=True), dict(tile_mma=True, pipe_stages=3, chunk_bytes=64)])
def test_kda_mma_arm_same_decode(v3_opts, monkeypatch):
    """The `--variants mma` KDA arms (the bf16 copy with predecayed keys read by the split-operand tensor-core form,
    unrolled and pipelined) decode what the CUDA-core arm decodes (the launch records that the split form ran): a
    timing difference between them is the form's, not a different computation."""
    monkeypatch.setattr(bk, "KIND_SHAPES", {"kda": dict(H=2, HV=2, K=32, V=16)})
    seen = _spy_main_launch(monkeypatch, "TILE_MMA")
    base = _decode_outputs("kda", torch.float32, read_dtype="bf16", kda_keys="predecayed",
                           v3_opts=dict(tile_mma=False))
    assert seen and not any(seen)
    seen.clear()
    mma = _decode_outputs("kda", torch.float32, read_dtype="bf16", kda_keys="predecayed", v3_opts=v3_opts)
    assert seen and all(seen)  # the split form ran
    assert torch.isfinite(mma).all() and mma.abs().max() > 0
    # the same bf16 outputs up to one unit in their last place (the two forms sum in different orders; the fp32-grade
    # check of the split is the decode tests' 2e-5 against float64)
    torch.testing.assert_close(mma, base, rtol=2 ** -8, atol=1e-6 * float(base.abs().max()))


@pytest.mark.parametrize("kind,kda_keys", [("gdn", "raw"), ("kda", "predecayed")])
def test_order_arms_same_decode(kind, kda_keys, monkeypatch):
    """The `--variants order` arms (decode_v3 row_order "rows" / "flush_first") and the default (V3_TUNED: "rows" for
    fp32 states since session 23) decode bit for bit what the grid order decodes over six steps with staggered
    cursors (each program's work does not depend on when it runs), and their main launches ran in the order asked
    (ROW_ORDER recorded from the launch)."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.setattr(bk, "KIND_SHAPES", {"gdn": dict(H=2, HV=4, K=32, V=16), "kda": dict(H=2, HV=2, K=32, V=16)})
    seen = _spy_main_launch(monkeypatch, "ROW_ORDER")
    base = _decode_outputs(kind, torch.float32, kda_keys=kda_keys, v3_opts=dict(row_order="grid"))
    assert seen and not any(seen)
    assert torch.isfinite(base).all() and base.abs().max() > 0
    seen.clear()
    assert torch.equal(_decode_outputs(kind, torch.float32, kda_keys=kda_keys), base)
    assert seen and all(o == decode_v3.ROW_ORDERS["rows"] for o in seen)  # the tuned default
    for order in ("rows", "flush_first"):
        seen.clear()
        out = _decode_outputs(kind, torch.float32, kda_keys=kda_keys, v3_opts=dict(row_order=order))
        assert seen and all(o == decode_v3.ROW_ORDERS[order] for o in seen)
        assert torch.equal(out, base), order
    # the pre launch's rows outermost (pre_order "rows"): the same coefficients, so the same outputs bit for bit
    out = _decode_outputs(kind, torch.float32, kda_keys=kda_keys, v3_opts=dict(row_order="grid", pre_order="rows"))
    assert torch.equal(out, base), "pre_order"


def test_arm_records_tag_the_bytes_model(monkeypatch):
    """arm_ours tags its run with its records' element size, which the bytes model (the TB/s column) takes: fp32
    records count twice the record bytes of bf16 ones (before session 33 every v3 arm was counted at bf16)."""
    monkeypatch.setattr(bk, "KIND_SHAPES", {"gdn": dict(H=2, HV=4, K=32, V=16)})
    c = bk.Case("gdn", 6, "float32", torch.device("cpu"), L=4)
    r32 = bk.arm_ours(c, torch.float32, impl="v3", server_like=True)
    r16 = bk.arm_ours(c, torch.bfloat16, impl="v3", server_like=True)
    assert (r32.rec_es, r16.rec_es) == (4, 2)
    b32, b16 = (bk.bytes_model("gdn", 256, "float32", "v3_sl", rec_es=r.rec_es) for r in (r32, r16))
    s = bk.KIND_SHAPES["gdn"]
    per_rec = s["HV"] * s["V"] + s["H"] * s["K"]  # u and k elements of one record
    assert b32 - b16 == pytest.approx(256 * per_rec * 2 * ((16 - 1) / 2 + 15 / 16))


@pytest.mark.parametrize("kind,cfg", [("gdn", "x16w4c1_m5"), ("kda", "x16w4c1_m4_gp")])
def test_rccu_arm_runs_the_cuda_read_copy_launch(kind, cfg, monkeypatch):
    """The `--variants rccu` arm (issue 7's fp8 read copy read by the CUDA main launch, XL; here its CPU emulation)
    runs the CUDA launch every step from the arms' steady state (every copy current: the plain rows read the copy, the
    rows at the window's end fold and rewrite it), and decodes what Triton's read-copy arm decodes as closely as the
    two launches agree without a copy (their bf16 outputs differ by a few units in the last place at these shapes;
    the fp8 copy's own accuracy is tests/test_cuda_emu.py's float64 check)."""
    from replayssm_sglang.kernels import cuda_main

    calls = _emulate_with_spy(monkeypatch, {"gdn": dict(H=1, HV=2, K=128, V=64), "kda": dict(H=2, HV=2, K=128, V=64)},
                              lambda a: a["config"])
    kk = "predecayed" if kind == "kda" else "raw"

    def outputs(read_dtype, **kw):  # (16 rows at L = 16, cursors 0 .. 15: a row folds every step)
        return _decode_outputs(kind, torch.float32, B=16, L=16, steps=3, server_like=True, read_dtype=read_dtype,
                               kda_keys=kk, **kw)

    cu_opts = dict(v3_opts=dict(main_impl="cuda", cuda_config=cfg))
    tri_rc, tri = outputs("fp8_e4m3"), outputs("same")
    assert not calls
    cu_rc = outputs("fp8_e4m3", **cu_opts)
    assert len(calls) == 3 and all(cuda_main.full_config(x) == cuda_main.full_config(cuda_main.CUDA_CONFIGS[cfg])
                                   for x in calls)
    cu = outputs("same", **cu_opts)
    assert torch.isfinite(cu_rc).all() and cu_rc.abs().max() > 0
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    assert rel(cu_rc, tri_rc) < 1.5 * rel(cu, tri) + 1e-4, (rel(cu_rc, tri_rc), rel(cu, tri))


def test_sp2_arm_runs_without_a_pre_launch(monkeypatch):
    """The `--variants sp2` arm (gdn_main.cu's SELF_PRE 2; here its CPU emulation) runs the CUDA main launch every
    step with no pre launch, and decodes what the same shape with its CUDA pre launch decodes, to fp32 rounding (the
    same record dots, summed in another order)."""
    from replayssm_sglang.kernels import cuda_main

    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    monkeypatch.setattr(bk, "KIND_SHAPES", {"gdn": dict(H=1, HV=2, K=128, V=64)})
    calls, pres = [], []
    real, real_pre = cuda_main.launch, cuda_main.pre_launch
    monkeypatch.setattr(cuda_main, "launch", lambda **a: calls.append(a) or real(**a))
    monkeypatch.setattr(cuda_main, "pre_launch", lambda **a: pres.append(1) or real_pre(**a))

    def outputs(**v3_opts):  # (16 rows at L = 16, cursors 0 .. 15: a row folds every step)
        return _decode_outputs("gdn", torch.float32, B=16, L=16, steps=3, server_like=True,
                               v3_opts=dict(main_impl="cuda", cuda_config="x16w4c1_m5", **v3_opts))

    with_pre = outputs(pre_impl=bk.server_pre_impl("gdn", "x16w4c1_m5"))
    assert len(pres) == 3
    sp2 = outputs(self_pre=2)
    assert len(pres) == 3 and len(calls) == 6, "the sp2 arm: the CUDA main launch each step, no pre launch"
    assert torch.isfinite(sp2).all() and sp2.abs().max() > 0
    assert float((sp2 - with_pre).norm() / with_pre.norm()) < 1e-5


@pytest.mark.parametrize("kind,cfg,read_dtype", [("gdn", "x16w4c1_m7_lean", "fp8_e4m3"), ("kda", "x16w4c1_m4_gp", "same")])
def test_split_arm_runs_split_records(kind, cfg, read_dtype, monkeypatch):
    """The `--variants split` arm (rec "split": split records, gdn_main.cu's REC_SPLIT; here its CPU emulation) runs
    the CUDA main and pre launches every step on a ring of split records, is counted at 2 bytes a record element, and
    decodes what the fp32-record arm decodes to within bf16 records' rounding (its dots read the high plane), closer
    than the bf16-record arm, whose folds take the rounded records too."""
    builds = _emulate_with_spy(monkeypatch, {"gdn": dict(H=1, HV=2, K=128, V=128),
                                             "kda": dict(H=2, HV=2, K=128, V=64)}, lambda a: a["defs"])
    kk = "predecayed" if kind == "kda" else "raw"

    def outputs(rec, pre):  # (16 rows at L = 16, cursors 0 .. 15: a row folds every step)
        return _decode_outputs(kind, rec, B=16, L=16, steps=20, server_like=True, read_dtype=read_dtype, kda_keys=kk,
                               v3_opts=dict(main_impl="cuda", cuda_config=cfg, pre_impl=pre))

    c = bk.Case(kind, 4, "float32", torch.device("cpu"), L=16)
    assert bk.arm_ours(c, "split", impl="v3", server_like=True, kda_keys=kk,
                       v3_opts=dict(main_impl="cuda", cuda_config=cfg, pre_impl="cuda")).rec_es == 2
    builds.clear()
    sp = outputs("split", "cuda")
    assert builds and all(d.get("REC_SPLIT") == 1 for d in builds)
    r32, r16 = outputs(torch.float32, "cuda"), outputs(torch.bfloat16, "cuda")
    assert torch.isfinite(sp).all() and sp.abs().max() > 0
    rel = lambda a, b: float((a - b).norm() / b.norm())  # noqa: E731
    assert rel(sp, r32) < 2e-2, rel(sp, r32)
    assert rel(sp, r32) <= rel(r16, r32), (rel(sp, r32), rel(r16, r32))


def test_vu_arm_runs_vec_u_builds(monkeypatch):
    """The `--variants vu` arms (v3_opts vec_u, gdn_main.cu's VEC_U; here its CPU emulation): vu1's and vu2's builds
    carry their level and vu0's none, and the three decode the same bits (the same records, loaded as vectors or one
    by one)."""
    builds = _emulate_with_spy(monkeypatch, {"gdn": dict(H=1, HV=2, K=128, V=64)}, lambda a: a["defs"])

    def outputs(vu):  # (16 rows at L = 16, cursors 0 .. 15: a row folds every step)
        return _decode_outputs("gdn", torch.float32, B=16, L=16, steps=3, server_like=True,
                               v3_opts=dict(main_impl="cuda", cuda_config="x16w4c1_m5", pre_impl="cuda", vec_u=vu))

    v0 = outputs(0)
    assert builds and not any(d.get("VEC_U") for d in builds)
    builds.clear()
    v1 = outputs(1)
    assert builds and all(d.get("VEC_U") == 1 for d in builds)
    assert torch.isfinite(v1).all() and v1.abs().max() > 0
    assert torch.equal(v0.view(torch.int32), v1.view(torch.int32))
    builds.clear()
    v2 = outputs(2)
    assert builds and all(d.get("VEC_U") == 2 for d in builds)
    assert torch.equal(v0.view(torch.int32), v2.view(torch.int32))


def test_round_robin_medians_keeps_rounds_and_medians(monkeypatch):
    """The round-robin variants' common end (round_robin_medians / keep_rounds): every round in us under
    meta[key]["<prefix>/<name>"] beside what the key held, and each arm's median round (seconds) as its result."""
    per = {"a_rr": [3e-6, 1e-6, 2e-6], "b_rr": [5e-6, 4e-6, 6e-6]}
    monkeypatch.setattr(bk, "round_robin", lambda c, runs, label: per if set(runs) == set(per) else 1 / 0)
    meta, timed = {"x_rounds": {"old": [1.0]}}, {}
    assert bk.round_robin_medians(None, {"a_rr": 0, "b_rr": 0}, "l", meta, "x_rounds", "gdn/B8", timed) is per
    assert meta["x_rounds"] == {"old": [1.0], "gdn/B8/a_rr": pytest.approx([3.0, 1.0, 2.0]),
                                "gdn/B8/b_rr": pytest.approx([5.0, 4.0, 6.0])}
    assert timed == {"a_rr": 2e-6, "b_rr": 5e-6}


def test_png_with_the_ipython_stand_in(tmp_path, monkeypatch):
    """Where IPython is absent (the GPU image), the stand-in the KDA baseline's import installs must still let
    matplotlib draw the run's PNG (sessions 37-39's GPU runs that loaded the KDA baseline lost their PNGs to a
    stand-in without version_info)."""
    pytest.importorskip("matplotlib")
    for name in ("IPython", "IPython.display"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    real_import = builtins.__import__

    def no_ipython(name, *a, **k):  # IPython not installed, as on the GPU image
        if name.split(".")[0] == "IPython" and not isinstance(sys.modules.get("IPython"), type(sys)):
            raise ImportError("no IPython here")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_ipython)
    bk._stub_ipython()
    monkeypatch.setattr(builtins, "__import__", real_import)
    assert getattr(sys.modules["IPython"], "__file__", None) is None, "the stand-in, not a real IPython"
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks", "results",
                       "kernels-20261204-1715.json")
    js = tmp_path / "run.json"
    shutil.copyfile(src, js)
    monkeypatch.setattr(sys, "argv", ["bench_kernels.py", "--plot", str(js)])
    bk.main()
    png = tmp_path / "run.png"
    assert png.exists() and png.stat().st_size > 1000


def test_server_pre_impl():
    """The benchmark's pre launch for a CUDA main-launch shape is the server's: the CUDA one for a tensor-core shape
    (only it writes their operand), else the kind's default (GDN CUDA, KDA Triton)."""
    assert bk.server_pre_impl("gdn", "x16w4c1_m5") == "cuda"
    assert bk.server_pre_impl("kda", "x16w4c1_m4_gp") == "triton"
    assert bk.server_pre_impl("kda", "x16w4c1_m7_gp_lean_mma") == "cuda"
    assert bk.server_pre_impl("kda", "x16w4c1_m4_gp_mf") == "triton"


def test_read_copy_arms_and_rebytes(tmp_path):
    """The bytes model counts an fp8 copy's bytes for every arm that reads one: "_rc_" names (as before) and session
    48's "_fp8" / run-1004 names, which it had counted as an fp32 checkpoint read every step (142-176% of the copy
    peak). --rebytes recounts such rows of a stored run once, from the records' size their stored count implies,
    leaves the others and the times alone, and notes it in the meta."""
    import json

    assert [bk.read_copy_of(a) for a in ("v3_rc_bf16", "v3_rc_fp8_sl", "v3_tg1_fp8_pdl_x", "v3_rcd_x", "v3_fox_fo2_x",
                                         "v3_tg1_x", "conv")] == ["bf16", "fp8", "fp8", "fp8", "fp8", None, None]
    fp8 = bk.bytes_model("gdn", 256, "float32", "v3_tg1_fp8_x", rec_es=4)
    plain = bk.bytes_model("gdn", 256, "float32", "v3_tg1_fp8_x", rec_es=4, copy=None)
    assert fp8 == bk.bytes_model("gdn", 256, "float32", "v3_rc_fp8", rec_es=4) and fp8 < 0.6 * plain
    peak = 3e12
    rows = [dict(kind="gdn", state_dtype="float32", B=256, arm=a, t_us=100.0, bytes=b, TBps=b / 1e-4 / 1e12,
                 frac_copy_peak=b / 1e-4 / peak) for a, b in (("conv", 1e9), ("v3_tg1_fp8_x_rr", plain),
                                                            ("v3_tg1_x", plain), ("v3_rc_fp8", fp8))]
    p = tmp_path / "run.json"
    p.write_text(json.dumps(dict(meta=dict(copy_peak_Bps=peak, L=16), rows=rows)))
    out = bk.rebytes(str(p))
    assert out.count("\n") == 0 and "v3_tg1_fp8_x_rr" in out
    d = json.loads(p.read_text())
    got = {r["arm"]: r for r in d["rows"]}
    assert got["v3_tg1_fp8_x_rr"]["bytes"] == fp8 and got["v3_tg1_fp8_x_rr"]["t_us"] == 100.0
    assert got["v3_tg1_fp8_x_rr"]["frac_copy_peak"] == pytest.approx(fp8 / 1e-4 / peak)
    assert got["v3_tg1_x"]["bytes"] == plain and got["conv"]["bytes"] == 1e9 and "rebytes" in d["meta"]
    assert bk.rebytes(str(p)) == "nothing to recount"

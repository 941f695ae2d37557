"""Every kernel configuration the server launches compiles for sm_90 (H100/H200), on the CPU.

The rest of the suite runs the kernels under Triton's interpreter, which does not type-check like compiled
Triton: a variable that is a bf16 pointer in one branch and an fp32 pointer in the other compiles fine
interpreted and is refused by the compiler ("Mismatched type for p_tile between then block ... and else
block": decode_v3's read copy until 6b77c5f). scripts/compile_configs.py records the launches of the real
launch functions (server scenarios: GDN / KDA at real head sizes, fp32 / bf16 pools, read copy same / bf16 /
fp8_e4m3, windows 1 and 16, verify T = 4 and 8, PDL on as on the H200), binds them with the JIT's own binder for
sm_90 and compiles each distinct configuration with triton.compile. It runs in a subprocess: the kernels
must be JITFunctions there (TRITON_INTERPRET unset), while this process keeps the interpreter for the other
tests. About 2.5 minutes on 2 cores with an empty Triton cache; deselect with ``-m "not compile"``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "compile_configs.py")
# the kernels the server path launches; the script itself also fails on any *_kernel no scenario reaches
SERVER_KERNELS = {
    "replay_decode_w1_kernel", "replay_decode_v3_pre_kernel", "replay_decode_v3_kernel",
    "replay_decode_v2_post_kernel", "_set_rc_valid_kernel", "_ring_prefold_kernel", "_ring_verify_kernel",
    "_ring_commit_kernel", "_materialize_kernel",
}


def _has_cuda_backend() -> bool:
    try:
        import triton.backends.nvidia.compiler  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.compile
@pytest.mark.skipif(not _has_cuda_backend(), reason="Triton without its NVIDIA backend cannot compile for sm_90")
def test_every_server_kernel_config_compiles_for_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / "results.json"
    jobs = str(min(8, os.cpu_count() or 1))
    r = subprocess.run([sys.executable, SCRIPT, "--jobs", jobs, "--json", str(out)], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=1500)
    log = r.stdout + r.stderr
    assert out.exists(), f"compile_configs.py produced no results (rc {r.returncode}):\n{log[-6000:]}"
    res = json.loads(out.read_text())
    fails = [c for c in res["configs"] if not c["ok"]]
    msg = "\n\n".join(f"{c['config']}\n  launched by: {'; '.join(c['scenarios'])}\n  {c['error'].strip()}"
                      for c in fails)
    assert not fails, f"{len(fails)} of {len(res['configs'])} kernel configurations fail to compile for sm_90:\n{msg}"
    assert not res["uncovered"], f"kernels no server scenario launches: {res['uncovered']}"
    compiled = {c["kernel"] for c in res["configs"]}
    assert SERVER_KERNELS <= compiled, f"not compiled: {sorted(SERVER_KERNELS - compiled)}"
    # the read-copy and PDL variants of the main decode launch are among them (the configurations of 6b77c5f)
    v3 = [c["config"] for c in res["configs"] if c["kernel"] == "replay_decode_v3_kernel"]
    assert any("'rc': '*bf16'" in c and "'HAS_RC': True" in c for c in v3)
    assert any("'rc': '*fp8e4nv'" in c for c in v3)
    assert any("'launch_pdl': True" in c and "'USE_PDL': True" in c for c in v3)
    # KDA's verify at eight drafts, with its pair loop (verify.VERIFY_TUNED), as the server launches it
    ver = [c["config"] for c in res["configs"] if c["kernel"] == "_ring_verify_kernel"]
    assert any("'T': 8" in c and "'IS_KDA': True" in c and "'PAIR_LOOP': True" in c for c in ver)
    assert r.returncode == 0, log[-6000:]


@pytest.mark.skipif(not _has_cuda_backend(), reason="Triton without its NVIDIA backend")
def test_resident_programs_estimate():
    """compile_configs --resources: the programs per SM its registers / shared memory / warps allow, checked on
    hand-computed sm_90 cases (65536 registers, allocated 8 per thread; 228 KiB shared memory, 1 KiB reserved per
    block; 64 warps, 32 blocks): each case is bound by a different limit."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = ("import compile_configs as C; r = C.resident_programs; "
            "print(r(103, 8192, 1), r(156, 16384, 1), r(246, 39168, 8), r(255, 39168, 4), r(32, 0, 1), r(40, 0, 8), "
            "r(64, 100000, 1))")
    out = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(ROOT, "scripts"), env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    # 103 regs -> 104 x 32 = 3328 per warp: 19 by registers (smem 8 KiB + 1 allows 25); 156 -> 12 by registers;
    # 246 x 8 warps: 1 by registers; 255 x 4: 2 by registers; 32 regs, 1 warp: 32 by the block limit; 40 x 8 warps:
    # 6 by registers (65536 / (40 x 256)); 64 regs with 100000 B of shared memory: 2 by shared memory
    assert out.stdout.split() == ["19", "12", "1", "2", "32", "6", "2"]


def test_scenario_labels():
    """Each server scenario's label names what it is (the --scenarios filter and the report key on it): decode
    scenarios their window and no verify T, verify scenarios their T, KDA key layouts other than raw theirs; no
    two scenarios share a label."""
    code = ("import json, compile_configs as C; print(json.dumps([s.label for s in C.server_scenarios()]))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], cwd=os.path.join(ROOT, "scripts"), env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    labels = json.loads(out.stdout)
    assert len(set(labels)) == len(labels)
    for lab in labels:
        if lab.startswith("decode"):
            assert " L=" in lab and " T=" not in lab, lab
        else:
            assert lab.startswith("verify") and lab.endswith((" T=4", " T=8", "lower_bound=-5.0", "row_order=rows")), lab
            assert (" T=4" in lab) != (" T=8" in lab), lab
    # (read same / bf16) x (L 1 / 16), L = 32, KDA's bf16 copy with the CUDA-core tile (opt-out of tile_mma), and
    # row_order "flush_first" (opt-in), and pre_order "rows" (opt-in)
    assert sum("keys=predecayed" in lab for lab in labels) == 8
    assert sum("row_order=flush_first" in lab for lab in labels) == 3
    assert sum("pre_order=rows" in lab for lab in labels) == 1
    assert sorted(lab.split()[1] for lab in labels if lab.startswith("verify") and "row_order=rows" in lab) == [
        "gdn", "kda"]
    # eight drafts for both kinds (KDA's pair loop runs from T = 8: verify.VERIFY_TUNED)
    assert sorted(lab.split()[1] for lab in labels if lab.endswith(" T=8")) == ["gdn", "kda"]


def _recorded(code: str) -> list[str]:
    """The stdout lines of ``code`` run beside scripts/compile_configs.py (importable as C) outside the interpreter,
    so its recorded launches carry the GPU-only options (register caps) as on the H200."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", "import compile_configs as C\n" + code],
                         cwd=os.path.join(ROOT, "scripts"), env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.split("\n")


def test_register_caps_recorded_as_on_the_gpu():
    """The launches' register caps are GPU-only options (decode_v3.compiled_for_cuda); compile_configs records the
    launches as the H200 runs them, so KDA's bf16-copy main launch carries its maxnreg (V3_TUNED: 168, the cap that
    keeps it off the 182-200-register cliff), KDA's `same` launch its 96 (session 23: with the rows outermost, 200.8
    -> 191.4 us at B = 256 on the H200) and GDN's `same` launch none."""
    lines = _recorded(
        "for lab in ('decode kda state=fp32 rec=fp32 read=bf16 L=16 impl=auto forced=True keys=predecayed',\n"
        "            'decode kda state=fp32 rec=fp32 read=same L=16 impl=auto forced=True keys=predecayed',\n"
        "            'decode gdn state=fp32 rec=fp32 read=same L=16 impl=auto forced=True'):\n"
        "    L = C.record_all([s for s in C.server_scenarios() if s.label == lab])\n"
        "    print([l.kwargs.get('maxnreg') for l in L if l.kernel.fn.__name__ == 'replay_decode_v3_kernel'])\n")
    assert lines[:3] == ["[168]", "[96]", "[None]"], lines


def test_verify_launch_as_on_the_gpu():
    """The server's verify launch is VERIFY_TUNED's: the draft axis at T's power of two (Triton 3.6, the H200's,
    refuses tl.dot below 16 on the inner axis, and the launch used to retry silently at BT = 16), the drafts'
    checkpoint products as one tensor-core product (CKDOT 2), and KDA's 168-register cap (GDN: none)."""
    lines = _recorded(
        "for kind in ('gdn', 'kda'):\n"
        "    lab = f'verify {kind} state=fp32 rec=fp32 read=same T=4'\n"
        "    L = C.record_all([s for s in C.server_scenarios() if s.label == lab])\n"
        "    v = [l for l in L if l.kernel.fn.__name__ == '_ring_verify_kernel']\n"
        "    print([(l.kwargs['BT'], l.kwargs['CKDOT'], l.kwargs.get('maxnreg')) for l in v])\n")
    assert lines[:2] == ["[(4, 2, None)]", "[(4, 2, 168)]"], lines

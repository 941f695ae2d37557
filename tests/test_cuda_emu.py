"""gdn_main.cu's main and pre launches on the CPU (kernels/cuda_emu.py: g++ and a stand-in for the CUDA features it
uses), against the float64 reference through the decode harness: the CUDA source's indexing, control flow and
arithmetic in CI, where its float64 cases otherwise run only on an H200 (test_decode_kernels.py's
gpu_real_shapes_cuda_*). The pre launch is Triton's under the interpreter, or the CUDA one emulated
(test_cuda_pre_emulated); PDL is off. What only a GPU shows (races, ordering, the fast math intrinsics) stays with the
GPU cases."""

import shutil

import pytest
import torch

from replayssm_sglang import reference as R
from replayssm_sglang import ring as ringmod
from replayssm_sglang.kernels import cuda_main
from replayssm_sglang.kernels.decode import replay_decode
from test_cuda_main import _server_defs
from test_decode_kernels import Harness

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the CPU emulation needs g++")

# (kind, shape, state dtype, decay): the served defaults of both kinds and both state types (KDA's: x16w4c1_m4_gp and
# x16w4c1_m6_gp since session 36), the shapes before them and the other XL ones
EMU_CASES = [("gdn", "x16w4c1_m5", "float32", "slow"), ("gdn", "x16w4c1_m6", "bfloat16", "fast"),
             ("gdn", "g8w4", "float32", "fast"), ("kda", "g8w4_gp", "float32", "slow"),
             ("kda", "x16w4c1_m4_gp", "float32", "slow"), ("kda", "x16w4c1_m5_gp", "float32", "fast"),
             ("kda", "x16w4c1_m6_gp", "bfloat16", "slow"),
             ("kda", "g8w4_m7_gp", "bfloat16", "fast"),
             # the fold on the tensor cores for an fp32 checkpoint (MMA_FOLD's 3xTF32, session 43)
             ("gdn", "x16w4c1_m5_mf", "float32", "slow"), ("gdn", "x16w4c1_m5_mf", "float32", "fast"),
             ("kda", "x16w4c1_m4_gp_mf", "float32", "slow"),
             # and for a bf16 checkpoint beside the CUDA-core tile dots (session 44)
             ("gdn", "x16w4c1_m6_mf", "bfloat16", "fast"), ("kda", "x16w4c1_m6_gp_mf", "bfloat16", "slow")]


def _spy_builds(monkeypatch) -> list:
    """A list that gets the defines of every build the emulation makes from here on (cuda_emu.build spied on)."""
    from replayssm_sglang.kernels import cuda_emu

    builds = []
    real_build = cuda_emu.build
    monkeypatch.setattr(cuda_emu, "build", lambda defs, *a, **k: builds.append(defs) or real_build(defs, *a, **k))
    return builds


def _emu_harness(kind, cfg, state_dtype, decay, monkeypatch, *, H=None, HV=2, B=3, V=64, seed=5, pre_impl="triton",
                 self_pre=False, **kw):
    """The harness with the CUDA main launch (shape cfg) emulated; returns it, the configs of its main launches and
    a list that gets a 1 for each CUDA pre launch. self_pre: gdn_main.cu's SELF_PRE (True or 1: each warp its own
    record dots; 2: the block's warps share them), no pre launch (Triton's must not run either)."""
    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    calls, pres = [], []
    real, real_pre = cuda_main.launch, cuda_main.pre_launch
    monkeypatch.setattr(cuda_main, "launch", lambda **a: calls.append(a["config"]) or real(**a))
    monkeypatch.setattr(cuda_main, "pre_launch", lambda **a: pres.append(1) or real_pre(**a))
    opts = dict(main_impl="cuda", cuda_config=cfg, pre_impl=pre_impl)
    if self_pre:
        from replayssm_sglang.kernels import decode_v3

        opts["self_pre"] = self_pre

        class NoPre:
            def __getitem__(self, grid):
                raise AssertionError("Triton's pre launch ran under self_pre")

        monkeypatch.setattr(decode_v3, "replay_decode_v3_pre_kernel", NoPre())
    extra = dict(kda_keys="predecayed") if kind == "kda" else {}
    hz = Harness(kind, B=B, H=H or (1 if kind == "gdn" else HV), HV=HV, K=128, V=V, L=16, seed=seed,
                 windows=(16, 16, 16, 1, 4), impl="v3", ring_idx=True, state_dtype=getattr(torch, state_dtype),
                 qkv_dtype=torch.bfloat16, decay=decay,
                 v3_opts=opts, **extra, **kw)
    return hz, calls, pres


@pytest.mark.parametrize("kind,cfg,state_dtype,decay", EMU_CASES, ids=str)
def test_cuda_main_emulated(kind, cfg, state_dtype, decay, monkeypatch):
    """The CUDA main launch (its block shape cfg) emulated on the CPU, 14 steps against float64: window switching
    (16, 1, 4), forced flushes, pre-folds, padded rows, staggered cursors, the ring keyed by its own rows."""
    hz, calls, _ = _emu_harness(kind, cfg, state_dtype, decay, monkeypatch)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["staggered"] > 0 and st["padded"] > 0, st
    want = cuda_main.full_config(cuda_main.CUDA_CONFIGS[cfg])
    assert len(calls) == 14 and {cuda_main.full_config(c) for c in calls} == {want}, "every step: the CUDA launch, cfg"


@pytest.mark.parametrize("kind,cfg,state_dtype", [("gdn", "x16w4c1_m5", "float32"), ("gdn", "x16w4c1_m6", "bfloat16"),
                                                   ("kda", "g8w4_gp", "float32")], ids=str)
def test_cuda_pre_emulated(kind, cfg, state_dtype, monkeypatch):
    """The CUDA pre launch (replay_gdn_pre, GDN's default beside the CUDA main launch; replay_kda_pre, opt-in)
    emulated too, feeding the emulated main launch: 14 steps against float64, slow decays, every pre launch CUDA's."""
    hz, _, pre_calls = _emu_harness(kind, cfg, state_dtype, "slow", monkeypatch, pre_impl="cuda")
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0, st
    assert len(pre_calls) == 14


def test_cuda_main_emulated_kda_rebase(monkeypatch):
    """KDA's XL shape with heads rebased and pre-folds turned into flushes by the overflow flags (a lowered
    threshold, as the GPU cases do)."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.setattr(decode_v3, "PREDECAYED_MIN_G", -5.0)
    hz, _, _ = _emu_harness("kda", "x16w4c1_m5_gp", "float32", "fast", monkeypatch, seed=9)
    st = hz.run(14)
    assert st["rebase"] > 0 and st["ovf"] > 0, st


def _emulate_mutated(monkeypatch, tmp_path, old, new):
    """The emulation builds gdn_main.cu with its one line `old` replaced by `new` (a mutation a check must catch)."""
    from replayssm_sglang.kernels import cuda_emu

    src = cuda_emu.SRC.read_text()
    assert src.count(old) == 1, old
    bad = tmp_path / "gdn_main.cu"
    bad.write_text(src.replace(old, new))
    monkeypatch.setattr(cuda_emu, "SRC", bad)
    monkeypatch.setenv("REPLAYSSM_EMU_DIR", str(tmp_path / "cache"))


def test_emulation_fails_a_wrong_kernel(monkeypatch, tmp_path):
    """The check can fail: the same source with one term off by 1e-4 (the XL epilogue's u_t <k~, q~>) fails the
    float64 comparison."""
    _emulate_mutated(monkeypatch, tmp_path, "const float o = P + u_t * kq;", "const float o = P + u_t * kq * 1.0001f;")
    hz, _, _ = _emu_harness("gdn", "x16w4c1_m5", "float32", "slow", monkeypatch)
    with pytest.raises(AssertionError, match="output rms ratio"):
        hz.run(6)


def test_emulation_is_refused_without_the_switch(monkeypatch):
    """Without REPLAYSSM_CUDA_EMULATE=1 the CUDA main launch cannot run on the CPU (and says why); with it, it can."""
    from replayssm_sglang import ring as ringmod
    ring = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=64).allocate(2)
    state = torch.zeros(2, 2, 64, 128)
    cfg = cuda_main.CUDA_CONFIGS["x16w4c1_m5"]
    monkeypatch.delenv("REPLAYSSM_CUDA_EMULATE", raising=False)
    assert cuda_main.unavailable_reason("gdn", state, ring, None, 128, 64, *cfg) == "it needs a CUDA GPU"
    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    assert cuda_main.unavailable_reason("gdn", state, ring, None, 128, 64, *cfg) is None
    assert cuda_main.emulated(state.device) and not cuda_main.emulated(torch.device("cuda", 0))


def test_emulation_refuses_the_bulk_copy_shapes():
    """The shapes that read the tile with PTX bulk copies (load_reg 0) are refused with why, not miscompiled."""
    from replayssm_sglang.kernels import cuda_emu

    d = _server_defs(*cuda_main.CUDA_CONFIGS["r16w4"], torch.float32)
    with pytest.raises(RuntimeError, match="load_reg 1"):
        cuda_emu.build(d)


# issue 7's read copy in the XL layout (session 36): GDN's default shape and KDA's fp32 default, fp8 and bf16 copies
# (the last: two V-tiles per head and two value heads per key head, as the real shapes have; x16w4c2_m5 walks both
# tiles in one block); Triton's pre launch, and the CUDA one (session 37: it reads rc_valid too)
RC_CASES = [("gdn", "x16w4c1_m5", "fp8_e4m3", {}, "triton"), ("gdn", "x16w4c1_m5", "bf16", {}, "triton"),
            ("kda", "x16w4c1_m4_gp", "fp8_e4m3", {}, "triton"),
            ("gdn", "x16w4c1_m5", "fp8_e4m3", dict(H=2, HV=4, V=128), "triton"),
            ("gdn", "x16w4c2_m5", "fp8_e4m3", dict(H=2, HV=4, V=128), "triton"),
            ("gdn", "x16w4c1_m5", "fp8_e4m3", dict(H=2, HV=4, V=128), "cuda"),
            ("kda", "x16w4c1_m4_gp", "fp8_e4m3", {}, "cuda"), ("gdn", "x16w4c1_m5", "bf16", {}, "cuda"),
            # gdn_main.cu's RC_LEAN (session 40): the tile's registers sized for the copy, a folding block's fp32 tile
            # read one word per row at a time and folded 4 rows at a time
            ("gdn", "x16w4c1_m8_lean", "fp8_e4m3", dict(H=2, HV=4, V=128), "cuda"),
            ("gdn", "x16w4c1_m6_lean", "bf16", {}, "triton"),
            ("kda", "x16w4c1_m5_gp_lean", "fp8_e4m3", {}, "cuda"),
            # RC_MMA (session 41): a copy block's dots on the tensor cores (the emulation forms mma.sync's sums from
            # its fragments), with the CUDA pre launch's operand
            ("gdn", "x16w4c1_m8_lean_mma", "fp8_e4m3", dict(H=2, HV=4, V=128), "cuda"),
            # and a bf16 copy's (session 42: bf16 values times the split bf16 operand; its ~2^-18 rounding passes the
            # 2e-5 tolerance, the high part alone fails it: output rms ratio 1.2e-3)
            ("gdn", "x16w4c1_m6_lean_mma", "bf16", dict(H=2, HV=4, V=128), "cuda"),
            # and KDA's (session 42: the operand per value head with e^{G_t} per column, from KDA's CUDA pre launch)
            ("kda", "x16w4c1_m6_gp_lean_mma", "fp8_e4m3", {}, "cuda"),
            ("kda", "x16w4c1_m7_gp_lean_mma", "bf16", {}, "cuda"),
            # the fold on the tensor cores (MMA_FOLD, session 43): 3xTF32 into the fp32 checkpoint, the copy from the same
            # values (fp8: a second pass for each V-row's scale)
            ("gdn", "x16w4c1_m7_lean_mf", "fp8_e4m3", dict(H=2, HV=4, V=128), "cuda"),
            ("gdn", "x16w4c1_m8_lean_mma_mf", "bf16", {}, "cuda"),
            ("kda", "x16w4c1_m7_gp_lean_mma_mf", "fp8_e4m3", {}, "cuda")]


@pytest.mark.parametrize("kind,cfg,read_dtype,shape,pre_impl", RC_CASES, ids=str)
def test_cuda_main_read_copy_emulated(kind, cfg, read_dtype, shape, pre_impl, monkeypatch):
    """The CUDA main launch with a read copy (XL, fp32 checkpoint), emulated: 14 steps against the float64 two-copy
    reference (precision.TwoCopyReference), slow decays. The Harness checks every step's outputs, the checkpoint and
    the read copy of every row that folded (round(fold), its fp8 scales), every other copy bit-identical, rc_valid
    set; the copies start stale and poisoned with NaN, so a row reading one before its first fold fails. With the
    CUDA pre launch (pre_impl "cuda") every step's pre launch is CUDA's."""
    hz, calls, pre_calls = _emu_harness(kind, cfg, "float32", "slow", monkeypatch, read_dtype=read_dtype, seed=7,
                                        pre_impl=pre_impl, **shape)
    st = hz.run(14)
    assert len(pre_calls) == (14 if pre_impl == "cuda" else 0)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["staggered"] > 0 and st["padded"] > 0, st
    assert st["stale_only"] > 0, st  # (rows whose stale copy alone makes them flush: the launch must see rc_valid)
    # every current copy is exactly the rounding of the checkpoint its fold wrote beside it (decode_v3's rule: bf16 to
    # nearest even; fp8 codes of S / scale to nearest even, scale = max |S| over the V-row / 448)
    valid = hz.view(hz.ring.rc_valid).bool()
    assert int(valid.sum()) > 0
    S, rc = hz.state.cpu()[valid], hz.view(hz.ring.rc)[valid]
    if read_dtype == "fp8_e4m3":
        amax = S.abs().amax(-1)
        sc = torch.where(amax == 0, torch.ones_like(amax), amax / 448.0)
        assert torch.equal(hz.view(hz.ring.rc_scale)[valid], sc)
        want_rc = (S / sc[..., None]).to(torch.float8_e4m3fn)
    else:
        want_rc = S.to(torch.bfloat16)
    assert torch.equal(rc.view(torch.uint8), want_rc.view(torch.uint8)), "a read copy is not round(its checkpoint)"
    want = cuda_main.full_config(cuda_main.CUDA_CONFIGS[cfg])
    assert len(calls) == 14 and {cuda_main.full_config(c) for c in calls} == {want}, "every step: the CUDA launch, cfg"


def test_rc_mma_needs_the_cuda_pre_launch(monkeypatch):
    """RC_MMA's main launch reads an operand only the CUDA pre launch writes: asked for Triton's pre launch it is
    refused with the fix; with REPLAYSSM_PRE_IMPL=triton (a preference) the CUDA pre launch runs all the same."""
    hz, calls, pre_calls = _emu_harness("gdn", "x16w4c1_m8_lean_mma", "float32", "slow", monkeypatch,
                                        read_dtype="fp8_e4m3", seed=3, pre_impl="triton", H=2, HV=4, V=128)
    with pytest.raises(ValueError, match="CUDA pre launch"):
        hz.run(1)
    monkeypatch.setenv("REPLAYSSM_PRE_IMPL", "triton")
    hz, calls, pre_calls = _emu_harness("gdn", "x16w4c1_m8_lean_mma", "float32", "slow", monkeypatch,
                                        read_dtype="fp8_e4m3", seed=3, pre_impl=None, H=2, HV=4, V=128)
    hz.run(2)
    assert len(pre_calls) == 2 and len(calls) == 2


# gdn_main.cu's ST_MMA (session 42): a bf16 checkpoint's tile dots on the tensor cores in every block (shapes
# x16w4c1_m6/m7/m8_mma, rc_lean 2 without a copy), the CUDA pre launch's split bf16 operand; two value heads per key
# head and two V-tiles per head (the real shapes' GQA and tiling) in the second case
ST_MMA_CASES = [("gdn", "x16w4c1_m8_mma", "fast", {}), ("gdn", "x16w4c1_m7_mma", "slow", dict(H=2, HV=4, V=128)),
                ("kda", "x16w4c1_m7_gp_mma", "fast", {}), ("kda", "x16w4c1_m8_gp_mma", "slow", dict(V=128)),
                # and with the fold on the tensor cores too (MMA_FOLD, the "_mf" shapes; session 43): bf16 records (the
                # server's for a bf16 state: GDN's keys straight into B, KDA's u_j straight into A) and fp32 ones (split)
                ("gdn", "x16w4c1_m8_mma_mf", "fast", dict(rec_dtype=torch.bfloat16)),
                ("gdn", "x16w4c1_m7_mma_mf", "slow", dict(H=2, HV=4, V=128)),
                ("gdn", "x16w4c1_m7_mma_mf", "slow", dict(H=2, HV=4, V=128, rec_dtype=torch.bfloat16)),
                ("kda", "x16w4c1_m7_gp_mma_mf", "fast", dict(rec_dtype=torch.bfloat16)),
                ("kda", "x16w4c1_m8_gp_mma_mf", "slow", dict(V=128))]


@pytest.mark.parametrize("kind,cfg,decay,shape", ST_MMA_CASES, ids=str)
def test_st_mma_emulated(kind, cfg, decay, shape, monkeypatch):
    """ST_MMA emulated against float64 (the bf16 state's tolerance): 14 steps, window switching, forced flushes,
    pre-folds, padded rows, staggered cursors; every step the CUDA pre launch and the ST_MMA build."""
    hz, calls, pre_calls = _emu_harness(kind, cfg, "bfloat16", decay, monkeypatch, pre_impl="cuda", seed=11, **shape)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["staggered"] > 0 and st["padded"] > 0, st
    assert len(pre_calls) == 14
    want = cuda_main.full_config(cuda_main.CUDA_CONFIGS[cfg])
    assert len(calls) == 14 and {cuda_main.full_config(c) for c in calls} == {want}


def test_st_mma_emulated_kda_rebase(monkeypatch):
    """KDA's ST_MMA with heads rebased and pre-folds turned into flushes by the overflow flags (a lowered threshold):
    rows that learn they fold only after the pre launch's flags, with no q, k staged (the fold loads its k~)."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.setattr(decode_v3, "PREDECAYED_MIN_G", -5.0)
    hz, _, _ = _emu_harness("kda", "x16w4c1_m7_gp_mma", "bfloat16", "fast", monkeypatch, pre_impl="cuda", seed=9)
    st = hz.run(14)
    assert st["rebase"] > 0 and st["ovf"] > 0, st


def test_rc_mma_emulated_kda_rebase(monkeypatch):
    """KDA's RC_MMA likewise: copy rows rebased after their copy's dots (the fold reads the checkpoint, loads k~)."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.setattr(decode_v3, "PREDECAYED_MIN_G", -5.0)
    hz, _, _ = _emu_harness("kda", "x16w4c1_m6_gp_lean_mma", "float32", "fast", monkeypatch, read_dtype="fp8_e4m3",
                            pre_impl="cuda", seed=9)
    st = hz.run(14)
    assert st["rebase"] > 0, st


# the step-by-step comparison with the CUDA-core dots (GDN: two value heads per key head, two V-tiles per head; KDA)
MMA_PAIRS = {"gdn": ("x16w4c1_m6", "x16w4c1_m8_mma", dict(H=2, HV=4, V=128)),
             "kda": ("x16w4c1_m6_gp", "x16w4c1_m7_gp_mma", dict(V=128))}


def _st_mma_against_cuda_cores(monkeypatch, kind="gdn", steps=8):
    """test_decode_kernels.tensor_core_dots_against_cuda_cores on the emulated launches, slow decays."""
    from test_decode_kernels import tensor_core_dots_against_cuda_cores

    cuda_cores, tensor_cores, shape = MMA_PAIRS[kind]

    def make(cfg):
        return _emu_harness(kind, cfg, "bfloat16", "slow", monkeypatch, pre_impl="cuda", seed=13, **shape)[0]

    return tensor_core_dots_against_cuda_cores(monkeypatch, make, cuda_cores, tensor_cores, steps)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_st_mma_matches_the_cuda_core_dots(kind, monkeypatch):
    """Tighter than the float64 check above (whose bf16-state tolerance, 2e-2, would pass a dot off by 2^-9): from the
    same inputs, ST_MMA's outputs and records stay within 2e-5 (rms ratio) of the CUDA-core dots' over 8 steps; its
    split bf16 operand rounds q~, k~ (KDA: times e^{G_t}) by ~2^-18."""
    worst_o, worst_u = _st_mma_against_cuda_cores(monkeypatch, kind)
    print(f"ST_MMA against the CUDA-core dots: outputs {worst_o:.2e}, records {worst_u:.2e}")
    assert worst_o < 2e-5 and worst_u < 2e-5, (worst_o, worst_u)


def test_st_mma_check_can_fail(monkeypatch, tmp_path):
    """The comparison above fails when the pre launch's operand loses its low part (bf16 q~, k~ alone: ~2^-9)."""
    _emulate_mutated(monkeypatch, tmp_path, "lo[e] = mma_bits(v[j][e] - mma_float(hi[e]));", "lo[e] = 0u;")
    worst_o, worst_u = _st_mma_against_cuda_cores(monkeypatch, steps=3)  # (GDN's)
    print(f"without the low part: outputs {worst_o:.2e}, records {worst_u:.2e}")
    assert worst_o > 2e-5 or worst_u > 2e-5, (worst_o, worst_u)


def test_kda_operand_check_can_fail(monkeypatch, tmp_path):
    """KDA's comparison fails when the operand loses its e^{G_t} (GDN's form of the operand for a KDA head)."""
    _emulate_mutated(monkeypatch, tmp_path, "    if (GATED) {", "    if (false) {")
    try:
        worst_o, worst_u = _st_mma_against_cuda_cores(monkeypatch, "kda", steps=2)
    except AssertionError as e:  # (the harness's float64 check fails first: the operand is that far off)
        assert "rms ratio" in str(e), e
        return
    assert worst_o > 2e-5 or worst_u > 2e-5, (worst_o, worst_u)


def test_st_mma_needs_the_cuda_pre_launch(monkeypatch):
    """As RC_MMA: asked for Triton's pre launch, ST_MMA is refused with the fix."""
    hz, _, _ = _emu_harness("gdn", "x16w4c1_m8_mma", "bfloat16", "slow", monkeypatch, pre_impl="triton", seed=3)
    with pytest.raises(ValueError, match="CUDA pre launch"):
        hz.run(1)


# gdn_main.cu's SELF_PRE (session 37): GDN's XL main launch making the pre launch's coefficients itself, no pre launch;
# an fp32 state at both decays, a bf16 state, and the fp8 read copy (two value heads per key head, two V-tiles per head,
# as the real shapes: the token's record is appended by the first block of each head only)
SELF_PRE_CASES = [("x16w4c1_m5", "float32", "slow", {}, "same", 1), ("x16w4c1_m5", "float32", "fast", {}, "same", 1),
                  ("x16w4c1_m6", "bfloat16", "slow", {}, "same", 1),
                  ("x16w4c1_m5", "float32", "slow", dict(H=2, HV=4, V=128), "same", 1),
                  ("x16w4c1_m5", "float32", "slow", dict(H=2, HV=4, V=128), "fp8_e4m3", 1),
                  # SELF_PRE 2 (session 47): the block's warps share the record dots, the tile loaded first; with
                  # MMA_FOLD (the bf16 state's CUDA-core shapes), eight warps per block (the last four dot no
                  # position), an fp32 state, the fp8 copy
                  ("x16w4c1_m6", "bfloat16", "slow", dict(H=2, HV=4, V=128), "same", 2),
                  ("x16w4c1_m7_mf", "bfloat16", "fast", dict(H=2, HV=4, V=128, rec_dtype=torch.bfloat16), "same", 2),
                  ("x16w8c1_m3", "bfloat16", "slow", dict(V=128, seed=7), "same", 2),
                  ("x16w4c1_m5_mf", "float32", "fast", dict(H=2, HV=4, V=128), "same", 2),
                  ("x16w4c1_m5", "float32", "slow", dict(H=2, HV=4, V=128), "fp8_e4m3", 2),
                  # the fp8 copy's lean registers (RC_LEAN) without a pre launch (session 48): a folding block reads its
                  # checkpoint's words at the dots; its bf16 copy too
                  ("x16w4c1_m5_lean_sp2", "float32", "slow", dict(H=2, HV=4, V=128), "fp8_e4m3", 2),
                  ("x16w4c1_m5_lean_sp2", "float32", "fast", dict(H=2, HV=4, V=128), "fp8_e4m3", 2),
                  ("x16w4c1_m6_lean_sp2", "float32", "slow", dict(H=2, HV=4, V=128), "bf16", 2)]


@pytest.mark.parametrize("cfg,state_dtype,decay,shape,read_dtype,level", SELF_PRE_CASES, ids=str)
def test_cuda_main_self_pre_emulated(cfg, state_dtype, decay, shape, read_dtype, level, monkeypatch):
    """The CUDA main launch without a pre launch (self_pre with main_impl="cuda"), emulated: 14 steps against float64
    (forced flushes, pre-folds, staggered cursors, padded rows); no pre launch runs, CUDA's or Triton's; every main
    launch is built with SELF_PRE at the level asked."""
    builds = _spy_builds(monkeypatch)
    shape = {"seed": 11, **shape}  # (a case may name its own seed: one whose steps pre-fold)
    hz, calls, pre_calls = _emu_harness("gdn", cfg, state_dtype, decay, monkeypatch, self_pre=level, **shape,
                                        read_dtype=read_dtype)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["staggered"] > 0 and st["padded"] > 0, st
    assert not pre_calls
    assert len(calls) == 14, "every step: the CUDA main launch"
    assert builds and {d.get("SELF_PRE") for d in builds} == {level}, builds


# gdn_main.cu's MMA_FOLD (session 43): a folding warp's fold on the tensor cores (the tenth config field, "_mf"
# shapes). Against the CUDA-core fold of the same shape from the same checkpoint and ring, step by step: the outputs and
# records are the same code's (bit-identical), the checkpoints the folds write differ by the split products' ~2^-17
# (bf16: the bf16 roundings that flips) or ~2^-20 (fp32, 3xTF32). Bf16 states with the server's bf16 records; the fp32
# default; the fp8 copy's default (its copy written from the same values, checked beside)
MMAF_PAIRS = {"gdn": ("x16w4c1_m8_mma", "x16w4c1_m8_mma_mf", "bfloat16", dict(H=2, HV=4, V=128, rec_dtype=torch.bfloat16)),
              "kda": ("x16w4c1_m7_gp_mma", "x16w4c1_m7_gp_mma_mf", "bfloat16", dict(V=128, rec_dtype=torch.bfloat16)),
              "gdn32": ("x16w4c1_m5", "x16w4c1_m5_mf", "float32", dict(H=2, HV=4, V=128)),
              "kda32": ("x16w4c1_m4_gp", "x16w4c1_m4_gp_mf", "float32", dict(V=128)),
              "gdn8": ("x16w4c1_m7_lean", "x16w4c1_m7_lean_mf", "float32", dict(H=2, HV=4, V=128,
                                                                              read_dtype="fp8_e4m3")),
              # the bf16 states' defaults (CUDA-core tile dots) with it (session 44)
              "gdn16": ("x16w4c1_m6", "x16w4c1_m6_mf", "bfloat16", dict(H=2, HV=4, V=128, rec_dtype=torch.bfloat16)),
              "kda16": ("x16w4c1_m6_gp", "x16w4c1_m6_gp_mf", "bfloat16", dict(V=128, rec_dtype=torch.bfloat16))}
# (rms ratio of the folded heads' checkpoints. bf16: 4-8e-5 here, 1.3-1.8e-3 without a split's low part; fp32: ~1e-7)
MMAF_TOL = {"bfloat16": 3e-4, "float32": 5e-6}


def _mma_fold_against_cuda_cores(monkeypatch, pair="gdn", steps=8, decay="slow"):
    from test_decode_kernels import tensor_core_dots_against_cuda_cores

    cuda_cores, tensor_cores, sdt, shape = MMAF_PAIRS[pair]
    kind = pair[:3]
    # the same dots on both sides: the CUDA-core fold's shape without FOLD_OUT (GDN's copies' default since session 58,
    # which takes a flushing block's outputs from its fold, in another order; MMA_FOLD's shapes never take it)
    monkeypatch.setenv("REPLAYSSM_FOLD_OUT", "0")

    def make(cfg):
        return _emu_harness(kind, cfg, sdt, decay, monkeypatch, pre_impl="cuda", seed=17, **shape)[0]

    return tensor_core_dots_against_cuda_cores(monkeypatch, make, cuda_cores, tensor_cores, steps, with_state=True)


@pytest.mark.parametrize("pair", list(MMAF_PAIRS))
def test_mma_fold_matches_the_cuda_core_fold(pair, monkeypatch):
    """MMA_FOLD's checkpoints within MMAF_TOL (rms ratio) of the CUDA-core fold's over 8 steps with folds; outputs and
    records bit-identical (the same dots)."""
    worst_o, worst_u, worst_s = _mma_fold_against_cuda_cores(monkeypatch, pair)
    print(f"MMA_FOLD against the CUDA-core fold ({pair}): checkpoints {worst_s:.2e}, outputs {worst_o:.1e}, "
          f"records {worst_u:.1e}")
    assert worst_o == 0.0 and worst_u == 0.0, (worst_o, worst_u)
    assert worst_s < MMAF_TOL[MMAF_PAIRS[pair][2]], worst_s


@pytest.mark.parametrize("pair,old,new", [
    ("gdn", "                fold_mma_bf16(d[b], al[0], bh0, bh1, lane);", ""),  # GDN's w_j without its low part
    ("gdn16", "                fold_mma_bf16(d[b], al[0], bh0, bh1, lane);", ""),  # the same beside CUDA-core dots
    ("kda", "                fold_mma_bf16(d[b], ah[0], bl0, bl1, lane);", ""),  # KDA's scaled keys without theirs
    ("gdn", "                const float k = kt[e] * sk;", "                const float k = 0.0f * kt[e] * sk;"),  # token
    ("gdn32", "                    fold_mma_tf32(d[b], al[ks], bh0, bh1, lane);", ""),  # tf32: W's low part
    ("kda32", "                    fold_mma_tf32(d[b], ah[ks], bl0, bl1, lane);", "")])  # tf32: the keys' low part
def test_mma_fold_check_can_fail(pair, old, new, monkeypatch, tmp_path):
    """The comparison above fails when the fold loses a split's low part or the token's term."""
    _emulate_mutated(monkeypatch, tmp_path, old, new)
    try:
        worst_o, worst_u, worst_s = _mma_fold_against_cuda_cores(monkeypatch, pair, steps=4)
    except AssertionError as e:  # (the harness's float64 check may fail first)
        assert "rms ratio" in str(e), e
        return
    print(f"mutated ({pair}): checkpoints {worst_s:.2e}")
    assert worst_s > MMAF_TOL[MMAF_PAIRS[pair][2]], worst_s


@pytest.mark.parametrize("old,new", [("            sp_dots[0][16 + sp_p] = pk * s_k;",
                                      "            sp_dots[0][16 + sp_p] = pk * s_k * 1.001f;"),
                                     ("        if (s == 0 && sp_p < CAP_) {",
                                      "        if (s == 0 && sp_p < CAP_ && warp > 0) {")], ids=str)
def test_self_pre_shared_dots_can_fail(old, new, monkeypatch, tmp_path):
    """SELF_PRE 2's check can fail: a record dot with k~ off by 1e-3, or the first warp's positions (0-3) never
    dotted (the block's shared dots left as an earlier block wrote them), fails the float64 comparison."""
    _emulate_mutated(monkeypatch, tmp_path, old, new)
    hz, _, _ = _emu_harness("gdn", "x16w4c1_m5", "float32", "slow", monkeypatch, seed=11, self_pre=2, H=2, HV=4,
                            V=128)  # (an fp32 state: the tolerance is fp32's, 2e-5)
    with pytest.raises(AssertionError, match="rms ratio"):
        hz.run(14)


def test_gdn_fp32_default_has_no_pre_launch_emulated(monkeypatch):
    """GDN's fp32 default shape since session 47 (x16w4c1_m4_sp2: SELF_PRE 2 in its shape's eleventh field), taken
    where a launch asks for no shape and no self_pre: every step's main launch is that shape's SELF_PRE 2 build without
    PDL, no pre launch runs (CUDA's or Triton's), and 14 steps match float64 (two value heads per key head)."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_GDN", raising=False)
    builds = _spy_builds(monkeypatch)

    class NoPre:
        def __getitem__(self, grid):
            raise AssertionError("Triton's pre launch ran beside a shape without one")

    monkeypatch.setattr(decode_v3, "replay_decode_v3_pre_kernel", NoPre())
    hz, calls, pre_calls = _emu_harness("gdn", None, "float32", "slow", monkeypatch, seed=11, H=2, HV=4, V=128)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["padded"] > 0, st
    assert not pre_calls and len(calls) == 14
    assert {cuda_main.full_config(c) for c in calls} == {cuda_main.full_config(cuda_main.CUDA_DEFAULT_FP32_GDN)}
    assert builds and all(d["SELF_PRE"] == 2 and d["USE_PDL"] == 0 for d in builds)


@pytest.mark.parametrize("state_dtype", ["bfloat16", "float32"])
def test_cuda_pre_beside_triton_main_emulated(state_dtype, monkeypatch):
    """The CUDA pre launch beside Triton's main launch (REPLAYSSM_PRE_IMPL=cuda with REPLAYSSM_MAIN_IMPL=triton) is
    built from a shape that has a pre launch and writes no tensor-core operand (cuda_main.pre_build_config): the bf16
    state's default (ST_MMA) would refuse to run without that operand's buffer (found on the GPU in session 47, run
    0750), the fp32 one has no pre launch (SELF_PRE 2). Emulated, 14 steps against float64, every pre launch CUDA's."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_GDN", raising=False)
    pres = []
    real_pre = cuda_main.pre_launch
    monkeypatch.setattr(cuda_main, "pre_launch", lambda **a: pres.append(a["defs"]) or real_pre(**a))
    sdt = getattr(torch, state_dtype)
    hz = Harness("gdn", B=3, H=1, HV=2, K=128, V=64, L=16, seed=5, windows=(16, 16, 16, 1, 4), impl="v3",
                 ring_idx=True, state_dtype=sdt, qkv_dtype=torch.bfloat16, decay="slow",
                 v3_opts=dict(main_impl="triton", pre_impl="cuda"))
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0, st
    assert len(pres) == 14 and all("ST_MMA" not in d and "SELF_PRE" not in d for d in pres)
    assert decode_v3.cuda_main is cuda_main


def test_post_trigger_build_emulated(monkeypatch):
    """A main launch built with TRIGGER_POST (the post launch let start at once; session 48) runs in the emulation
    (which leaves the trigger out, as it does PDL) and matches float64 over 14 steps: the rule that takes it
    (decode_v3.post_trigger_applies, which wants PDL, absent on the CPU) forced on, every build checked for it."""
    from replayssm_sglang.kernels import decode_v3

    builds = _spy_builds(monkeypatch)
    monkeypatch.setattr(decode_v3, "post_trigger_applies", lambda *a, **k: True)
    hz, calls, _ = _emu_harness("gdn", "x16w4c1_m4_sp2", "float32", "slow", monkeypatch, seed=17, H=2, HV=4, V=128)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["padded"] > 0, st
    assert len(calls) == 14 and builds and all(d.get("TRIGGER_POST") == 1 for d in builds)


def test_lead_pdl_build_emulated():
    """A LEAD_PDL build (the step's first launch waiting for the kernel before it: PTX the CPU has no stand-in for)
    builds in the emulation, which leaves the wait out as it does PDL's; the build with a pre launch and the one
    without (SELF_PRE 2), each with its pre kernel where it has one."""
    from replayssm_sglang.kernels import cuda_emu

    for cfg, sdt in ((cuda_main.CUDA_DEFAULT_FP32_GDN, torch.float32), (cuda_main.CUDA_DEFAULT_BF16, torch.bfloat16)):
        d = cuda_main.server_defines(cfg, rec_dtype=sdt, state_dtype=sdt)
        lib = cuda_emu.build(dict(d, LEAD_PDL=1, TRIGGER_POST=1))
        assert hasattr(lib, "emu_run_main")


# PRE_EARLY (session 49): the CUDA pre launches' loads reordered (q, k and the gate inputs before the slot, the G records
# beside the key records, a bf16 record's columns in one 8-byte load, KDA's bf16 records ahead of the token's append).
# Both pre kernels, bf16 and fp32 records, the tensor-core operand's builds, a read copy, and KDA's rebases
PRE_EARLY_CASES = [("gdn", "x16w4c1_m7_mma_mf", "bfloat16", "slow", dict(H=2, HV=4, V=128, rec_dtype=torch.bfloat16)),
                   ("gdn", "x16w4c1_m6", "bfloat16", "fast", dict(rec_dtype=torch.bfloat16)),
                   ("gdn", "x16w4c1_m5", "float32", "slow", dict(H=2, HV=4)),
                   ("gdn", "x16w4c1_m7_lean", "float32", "fast", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128)),
                   ("kda", "x16w4c1_m6_gp_mf", "bfloat16", "slow", dict(rec_dtype=torch.bfloat16)),
                   ("kda", "x16w4c1_m8_gp_mma_mf", "bfloat16", "fast", dict(V=128, rec_dtype=torch.bfloat16)),
                   ("kda", "x16w4c1_m7_gp_lean_mma", "float32", "slow", dict(read_dtype="fp8_e4m3", V=128))]


@pytest.mark.parametrize("kind,cfg,state_dtype,decay,shape", PRE_EARLY_CASES, ids=str)
def test_pre_early_emulated(kind, cfg, state_dtype, decay, shape, monkeypatch):
    """REPLAYSSM_PRE_EARLY=1: every step's CUDA pre launch is a PRE_EARLY build and the step matches float64 over 14
    steps (window switching, forced flushes, pre-folds, padded rows, staggered cursors)."""
    builds = _spy_builds(monkeypatch)
    monkeypatch.setenv("REPLAYSSM_PRE_EARLY", "1")
    hz, calls, pre_calls = _emu_harness(kind, cfg, state_dtype, decay, monkeypatch, pre_impl="cuda", seed=23, **shape)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["staggered"] > 0 and st["padded"] > 0, st
    assert len(pre_calls) == 14 and len(calls) == 14
    assert builds and all(d.get("PRE_EARLY") == 1 for d in builds)


# PRE_EARLY level 2 (session 50): with fp32 key records the first cuda_main.PRE_EARLY_F32_RECORDS of them loaded early
# too (gdn_main.cu's PRE_EARLY_F32): the fp32 states' shapes with a pre launch, with and without the fp8 copy
PRE_EARLY_F32_CASES = [("gdn", "x16w4c1_m5", "slow", dict(H=2, HV=4)),
                       ("gdn", "x16w4c1_m7_lean", "fast", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128)),
                       ("kda", "x16w4c1_m4_gp", "fast", {}),
                       ("kda", "x16w4c1_m7_gp_lean_mma", "slow", dict(read_dtype="fp8_e4m3", V=128))]


@pytest.mark.parametrize("kind,cfg,decay,shape", PRE_EARLY_F32_CASES, ids=str)
def test_pre_early_f32_emulated(kind, cfg, decay, shape, monkeypatch):
    """REPLAYSSM_PRE_EARLY=2 with fp32 records: every step's CUDA pre launch is a PRE_EARLY build with PRE_EARLY_F32
    at the kind's count, and the step matches float64 over 14 steps (rows with more records than it loads early
    among them: staggered cursors up to 16)."""
    from replayssm_sglang.kernels import cuda_main

    builds = _spy_builds(monkeypatch)
    monkeypatch.setenv("REPLAYSSM_PRE_EARLY", "2")
    hz, calls, pre_calls = _emu_harness(kind, cfg, "float32", decay, monkeypatch, pre_impl="cuda", seed=23, **shape)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["staggered"] > 0 and st["padded"] > 0, st
    assert len(pre_calls) == 14 and len(calls) == 14
    n = cuda_main.PRE_EARLY_F32_RECORDS[kind]
    assert builds and all(d.get("PRE_EARLY") == 1 and d.get("PRE_EARLY_F32") == n for d in builds)


def test_pre_early_f32_check_can_fail(monkeypatch, tmp_path):
    """The level-2 cases fail on a kernel whose early fp32 records are the wrong ones (record j ^ 1's columns: a
    neighbour's, or past h a poisoned one, which the comparison's NaN check stops)."""
    _emulate_mutated(monkeypatch, tmp_path,
                     "er.f[j] = j < CAP_ && j < h_old ? load4(base_k + j * K_)",
                     "er.f[j] = j < CAP_ && j < h_old ? load4(base_k + (j ^ 1) * K_)")
    monkeypatch.setenv("REPLAYSSM_PRE_EARLY", "2")
    hz, _, _ = _emu_harness("kda", "x16w4c1_m4_gp", "float32", "fast", monkeypatch, pre_impl="cuda", seed=23)
    with pytest.raises(AssertionError, match="rms ratio|non-finite"):
        hz.run(14)


@pytest.mark.parametrize("kind,cfg", [("gdn", "x16w4c1_m6"), ("kda", "x16w4c1_m6_gp_mf")], ids=str)
def test_pre_early_off_emulated(kind, cfg, monkeypatch):
    """REPLAYSSM_PRE_EARLY=0 (PRE_EARLY is the default since session 49): the pre launches' load order before it,
    bf16 records, against float64, every build without PRE_EARLY."""
    builds = _spy_builds(monkeypatch)
    monkeypatch.setenv("REPLAYSSM_PRE_EARLY", "0")
    hz, _, pre_calls = _emu_harness(kind, cfg, "bfloat16", "slow", monkeypatch, pre_impl="cuda", seed=23,
                                    rec_dtype=torch.bfloat16)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0, st
    assert len(pre_calls) == 14 and builds and not any(d.get("PRE_EARLY") for d in builds)


def test_pre_early_emulated_kda_rebase(monkeypatch):
    """KDA's PRE_EARLY pre launch with heads rebased and pre-folds turned into flushes by the overflow flags (a lowered
    threshold): its bf16 records, loaded before the token's record is appended, and the zero record of a rebased head."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.setattr(decode_v3, "PREDECAYED_MIN_G", -5.0)
    monkeypatch.setenv("REPLAYSSM_PRE_EARLY", "1")
    hz, _, pre_calls = _emu_harness("kda", "x16w4c1_m6_gp_mf", "bfloat16", "fast", monkeypatch, pre_impl="cuda",
                                    seed=9, rec_dtype=torch.bfloat16)
    st = hz.run(14)
    assert st["rebase"] > 0 and st["ovf"] > 0, st
    assert len(pre_calls) == 14


@pytest.mark.parametrize("old,new", [
    # the bf16 record's columns: the halves of a word swapped
    ("return make_float4(__uint_as_float(w.x << 16), __uint_as_float(w.x & 0xffff0000u),",
     "return make_float4(__uint_as_float(w.x & 0xffff0000u), __uint_as_float(w.x << 16),"),
    # GDN's early G records: the next value head's
    ("rgs[r] = valid ? ring_g[(rrow * HV_ + i_h * R + r) * CAP_ + j] : 0.0f;",
     "rgs[r] = valid ? ring_g[(rrow * HV_ + i_h * R + (r + 1) % R) * CAP_ + j] : 0.0f;")], ids=["halves", "g"])
def test_pre_early_check_can_fail(old, new, monkeypatch, tmp_path):
    """The PRE_EARLY cases above fail on a kernel with a fault in its new loads: a bf16 record's halves swapped, or
    GDN's G records of the wrong value head."""
    _emulate_mutated(monkeypatch, tmp_path, old, new)
    monkeypatch.setenv("REPLAYSSM_PRE_EARLY", "1")
    hz, _, _ = _emu_harness("gdn", "x16w4c1_m6", "bfloat16", "fast", monkeypatch, pre_impl="cuda", seed=23, H=2, HV=4,
                            rec_dtype=torch.bfloat16)
    with pytest.raises(AssertionError, match="rms ratio"):
        hz.run(14)


@pytest.mark.parametrize("kind,cfg,state_dtype,shape", [
    ("gdn", "x16w4c1_m7_mma_mf", "bfloat16", dict(H=2, HV=4, V=128, rec_dtype=torch.bfloat16)),
    ("gdn", "x16w4c1_m7_lean", "float32", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128)),
    ("kda", "x16w4c1_m6_gp_mf", "bfloat16", dict(rec_dtype=torch.bfloat16))], ids=str)
def test_pre_pf_build_emulated(kind, cfg, state_dtype, shape, monkeypatch):
    """REPLAYSSM_PRE_PF=2 (the pre launch prefetching the first rows' tiles into L2: a hint the CPU leaves out) builds
    with the checkpoint and the read copy passed to the pre launch, and the step matches float64 over 14 steps."""
    builds = _spy_builds(monkeypatch)
    monkeypatch.setenv("REPLAYSSM_PRE_PF", "2")
    hz, _, pre_calls = _emu_harness(kind, cfg, state_dtype, "slow", monkeypatch, pre_impl="cuda", seed=31, **shape)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0, st
    assert len(pre_calls) == 14 and builds and all(d.get("PRE_PF") == 2 for d in builds)


@pytest.mark.parametrize("kind,cfg,state_dtype,shape,level", [
    ("gdn", "x16w4c1_m6", "bfloat16", dict(H=2, HV=4, rec_dtype=torch.bfloat16), "1"),
    ("kda", "x16w4c1_m6_gp_mf", "bfloat16", dict(rec_dtype=torch.bfloat16), "1"),
    ("gdn", "x16w4c1_m7_lean", "float32", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128), "2"),
    ("kda", "x16w4c1_m7_gp_lean_mma", "float32", dict(read_dtype="fp8_e4m3", V=128), "2")], ids=str)
def test_pre_early_changes_no_bit_emulated(kind, cfg, state_dtype, shape, level, monkeypatch):
    """PRE_EARLY (and PRE_PF, a prefetch) only reorder loads: 14 emulated steps with REPLAYSSM_PRE_EARLY=0 and with
    PRE_EARLY (fp32 records: level 2, PRE_EARLY_F32) and PRE_PF leave the checkpoint, every ring tensor and the read
    copy the same bit for bit (a bf16 record's columns convert exactly either way)."""
    runs = []
    for early, pf in (("0", "0"), (level, "2")):
        monkeypatch.setenv("REPLAYSSM_PRE_EARLY", early)
        monkeypatch.setenv("REPLAYSSM_PRE_PF", pf)
        hz, _, pre_calls = _emu_harness(kind, cfg, state_dtype, "slow", monkeypatch, pre_impl="cuda", seed=23,
                                        **shape)
        hz.run(14)
        assert len(pre_calls) == 14
        runs.append(hz)
    a, b = runs
    names = ("u", "k", "g", "h") + (("rc",) if a.ring.rc is not None else ())
    for x, y in [(a.state, b.state)] + [(getattr(a.ring, n), getattr(b.ring, n)) for n in names]:
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)  # (the harness poisons unused positions)


# Split records (session 51, gdn_main.cu's REC_SPLIT): fp32 records kept as a bf16 high plane, which the dots and
# outputs read, and the low 16 bits of each fp32 value beside it, which a fold joins back: the fp32 states' shapes with
# a pre launch, with and without the fp8 copy, both kinds
SPLIT_CASES = [("gdn", "x16w4c1_m5", "slow", dict(H=2, HV=4)),
               # (GDN's fp32 default, no pre launch: SELF_PRE 2's main launch appends the keys, both planes)
               ("gdn", "x16w4c1_m4_sp2", "slow", dict(H=2, HV=4)), ("gdn", "x16w4c1_m4_sp2", "fast", {}),
               ("gdn", "x16w4c1_m7_lean", "fast", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128)),
               ("gdn", "x16w4c1_m7_lean_mf", "slow", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128)),
               ("kda", "x16w4c1_m4_gp", "fast", {}),
               ("kda", "x16w4c1_m7_gp_lean_mma", "slow", dict(read_dtype="fp8_e4m3", V=128)),
               ("kda", "x16w4c1_m7_gp_lean_mma_mf", "fast", dict(read_dtype="fp8_e4m3", V=128))]


@pytest.mark.parametrize("kind,cfg,decay,shape", SPLIT_CASES, ids=str)
def test_split_records_emulated(kind, cfg, decay, shape, monkeypatch):
    """A ring of split records (RingLayout.allocate(split_records=True)) through 14 emulated steps against float64:
    every main and pre launch a REC_SPLIT build, the joined records and the checkpoints at bf16 records' tolerance
    (the dots read the high plane), the low planes of untouched rows unchanged (their never-written records start as
    noise, the high plane as NaN)."""
    builds = _spy_builds(monkeypatch)
    sp = cuda_main.full_config(cuda_main.CUDA_CONFIGS[cfg])[10]  # (SELF_PRE: no pre launch)
    hz, calls, pre_calls = _emu_harness(kind, cfg, "float32", decay, monkeypatch, pre_impl=None if sp else "cuda",
                                        seed=41, split_records=True, **shape)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["staggered"] > 0 and st["padded"] > 0, st
    assert len(pre_calls) == (0 if sp else 14) and len(calls) == 14
    assert builds and all(d.get("REC_SPLIT") == 1 and d["U_T"] == d["KR_T"] == "__nv_bfloat16" for d in builds)


def test_split_records_emulated_kda_rebase(monkeypatch):
    """Split records with KDA heads rebased and pre-folds turned into flushes (a lowered threshold): a rebased head's
    records zeroed in both planes by the post launch, its fold joining the records it read as bf16."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.setattr(decode_v3, "PREDECAYED_MIN_G", -5.0)
    hz, _, _ = _emu_harness("kda", "x16w4c1_m7_gp_lean_mma", "float32", "fast", monkeypatch, pre_impl="cuda", seed=9,
                            split_records=True, read_dtype="fp8_e4m3", V=128)
    st = hz.run(14)
    assert st["rebase"] > 0 and st["ovf"] > 0, st


def _split_pair(kind, cfg, read_dtype, *, h_mode, bf16_exact, seed, H=None, HV=2, V=64, B=5, min_g=None,
                monkeypatch):
    """One emulated decode step on two rings holding the same records, one fp32 and one split
    (ring.split_planes of the same values), from the same checkpoint, read copy and inputs. Returns both (state, ring,
    out). h_mode "mixed": cursors 0 .. L (pre-folds, flushes, appends), forced flushes, stale copies, a padded row;
    "prefold": every row at h = L, nothing forced, copies current (each row folds its old records, not its token).
    bf16_exact: every record value a bf16 (its low plane 0), so that both rings' dots read the same values."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    # both rings through the same fold: a split ring's build has no FOLD_OUT (cuda_main.fold_out_defines), which the
    # fp32 ring's copy shapes take by default for GDN since session 58 (the same values, summed in another order)
    monkeypatch.setenv("REPLAYSSM_FOLD_OUT", "0")
    if min_g is not None:
        monkeypatch.setattr(decode_v3, "PREDECAYED_MIN_G", min_g)
    g = torch.Generator().manual_seed(seed)
    H = H or (1 if kind == "gdn" else HV)
    L, K = 16, 128
    lay = ringmod.RingLayout.for_layer(kind, L=L, H=H, HV=HV, K=K, V=V)
    slots = B + 2
    keys = "predecayed" if kind == "kda" else "raw"
    rings = [lay.allocate(slots, read_dtype=read_dtype, kda_keys=keys, split_records=sp) for sp in (False, True)]
    r32, rs = rings
    u = torch.randn(r32.u.shape, generator=g)
    k = torch.randn(r32.k.shape, generator=g) * 0.1
    if bf16_exact:
        u, k = u.to(torch.bfloat16).float(), k.to(torch.bfloat16).float()
    G = -torch.cumsum(torch.rand(r32.g.shape, generator=g) * 0.2, dim=2)  # (cumulative log-decays along the ring)
    r32.u.copy_(u), r32.k.copy_(k), r32.g.copy_(G), rs.g.copy_(G)
    rs.u.copy_(ringmod.split_planes(u)[0]), rs.u_lo.copy_(ringmod.split_planes(u)[1])
    rs.k.copy_(ringmod.split_planes(k)[0]), rs.k_lo.copy_(ringmod.split_planes(k)[1])
    if h_mode == "prefold":
        h = torch.full((slots,), L, dtype=torch.int32)
        forced = torch.zeros(B, dtype=torch.int32)
        valid = torch.ones(slots, dtype=torch.int32)
    else:
        h = torch.randint(0, L + 1, (slots,), generator=g, dtype=torch.int32)
        h[:3] = torch.tensor([L, L - 1, 0], dtype=torch.int32)
        forced = (torch.rand(B, generator=g) < 0.25).to(torch.int32)
        valid = (torch.rand(slots, generator=g) < 0.7).to(torch.int32)
    for r in rings:
        r.h.copy_(h)
        if r.rc is not None:
            r.rc_valid.copy_(valid)
            if r.rc_scale is not None:
                r.rc.copy_((torch.randn(r.rc.shape, generator=g) * 100).to(torch.float8_e4m3fn)) if r is r32 else None
                r.rc_scale.copy_(torch.rand(r.rc_scale.shape, generator=g) * 1e-3 + 1e-4) if r is r32 else None
            else:
                r.rc.copy_(torch.randn(r.rc.shape, generator=g).to(r.rc.dtype) * 0.1) if r is r32 else None
    if rs.rc is not None:
        rs.rc.copy_(r32.rc)
        if rs.rc_scale is not None:
            rs.rc_scale.copy_(r32.rc_scale)
    return _step_each(kind, cfg, [(r, {}) for r in rings], g, forced=forced, padded=h_mode == "mixed", H=H, HV=HV,
                      V=V, L=L)


def _step_each(kind, cfg, arms, g, *, forced, padded, H, HV, V, L, K=128, state_dtype=torch.float32):
    """The step shared by the emulated pair checks: draws a checkpoint (slots = the rings' slots), the rows' slots (the
    last one padded if `padded`) and one token's inputs from `g`, then runs one CUDA-main decode step of `cfg` on each
    arm, (ring, extra v3 options), from its own clone of that checkpoint. Returns each arm's (state, ring, out)."""
    B = forced.shape[0]
    slots = arms[0][0].h.shape[0]
    state = (torch.randn(slots, HV, V, K, generator=g) * 0.1).to(state_dtype)
    slot_idx = torch.randperm(slots, generator=g)[:B].to(torch.int32)
    if padded:
        slot_idx[-1] = -1  # (a padded row)
    x = R.random_decode_inputs(kind, B, H, HV, K, V, generator=g, decay="slow")
    x = (x[0].to(torch.bfloat16),) + tuple(x[1:])
    sp = cuda_main.full_config(cuda_main.CUDA_CONFIGS[cfg])[10]  # (SELF_PRE: no pre launch)
    runs = []
    for r, opts in arms:
        st = state.clone()
        out = torch.full((B, 1, HV, V), float("nan"))
        replay_decode(kind, *x, st, r, slot_idx, out=out, forced=forced, L=L, impl="v3",
                      v3_opts=dict(main_impl="cuda", cuda_config=cfg, pre_impl=None if sp else "cuda", **opts))
        runs.append((st, r, out))
    return runs


SPLIT_BIT_CASES = [("gdn", "x16w4c1_m5", None, {}), ("gdn", "x16w4c1_m4_sp2", None, dict(H=2, HV=4)),
                   ("gdn", "x16w4c1_m7_lean", "fp8_e4m3", dict(H=2, HV=4, V=128)),
                   ("gdn", "x16w4c1_m7_lean_mf", "fp8_e4m3", dict(H=2, HV=4, V=128)),
                   ("kda", "x16w4c1_m4_gp", None, {}), ("kda", "x16w4c1_m7_gp_lean_mma", "fp8_e4m3", dict(V=128)),
                   ("kda", "x16w4c1_m7_gp_lean_mma_mf", "fp8_e4m3", dict(V=128))]


def _assert_same_bits(x, y, what):
    assert torch.equal(x.contiguous().view(torch.int32), y.contiguous().view(torch.int32)), what


@pytest.mark.parametrize("kind,cfg,read_dtype,shape", SPLIT_BIT_CASES, ids=str)
def test_split_records_fold_exact_emulated(kind, cfg, read_dtype, shape, monkeypatch):
    """What a split ring folds is its fp32 records exactly: every row pre-folds its 16 old records (random fp32 values,
    low planes non-zero), and the checkpoint and read copy it writes equal, bit for bit, what the fp32 ring's step
    writes; so do the key records (the post launch's record 0 joined) and the value records the step did not
    rewrite."""
    (s32, r32, _), (ss, rs, _) = _split_pair(kind, cfg, read_dtype or "same", h_mode="prefold", bf16_exact=False,
                                              seed=3, monkeypatch=monkeypatch, **shape)
    assert bool((rs.u_lo != 0).any()) and bool((rs.k_lo != 0).any())
    _assert_same_bits(ss, s32, "the split ring's fold differs from the fp32 ring's")
    if r32.rc is not None:
        assert torch.equal(rs.rc.view(torch.uint8), r32.rc.view(torch.uint8)), "read copies differ"
        if r32.rc_scale is not None:
            _assert_same_bits(rs.rc_scale, r32.rc_scale, "read copy scales differ")
    _assert_same_bits(ringmod.split_join(rs.k, rs.k_lo), r32.k, "key records differ")
    _assert_same_bits(ringmod.split_join(rs.u, rs.u_lo)[:, :, 1:], r32.u[:, :, 1:], "value records differ")
    assert torch.equal(rs.h, r32.h) and torch.equal(rs.g, r32.g)


@pytest.mark.parametrize("kind,cfg,read_dtype,shape", SPLIT_BIT_CASES, ids=str)
def test_split_records_same_bits_emulated(kind, cfg, read_dtype, shape, monkeypatch):
    """Where every record value is a bf16 (both rings' dots then read the same values), one step over every kind of
    row (appends, flushes, pre-folds, forced flushes, stale copies, a padded row; KDA also rebased heads) leaves a split
    ring and an fp32 ring the same bit for bit: outputs, checkpoints, read copies, and the records (joined), those the
    step wrote among them (the main launch's u_t, the pre and post launches' keys, a rebase's zeros)."""
    extra = dict(min_g=-0.3) if kind == "kda" else {}
    (s32, r32, o32), (ss, rs, os_) = _split_pair(kind, cfg, read_dtype or "same", h_mode="mixed", bf16_exact=True,
                                                 seed=4, monkeypatch=monkeypatch, **shape, **extra)
    _assert_same_bits(os_.float(), o32.float(), "outputs differ")
    _assert_same_bits(ss, s32, "checkpoints differ")
    if r32.rc is not None:
        assert torch.equal(rs.rc.view(torch.uint8), r32.rc.view(torch.uint8)), "read copies differ"
    _assert_same_bits(ringmod.split_join(rs.u, rs.u_lo), r32.u, "value records differ")
    _assert_same_bits(ringmod.split_join(rs.k, rs.k_lo), r32.k, "key records differ")
    assert torch.equal(rs.h, r32.h) and torch.equal(rs.g, r32.g)
    if kind == "kda":
        assert bool((r32.k == 0).all(-1).any()), "no head was rebased (its key records zeroed)"


@pytest.mark.parametrize("kind,cfg,read_dtype,shape,old,new,test", [
    # a fold that reads the high plane alone (rounded records into the checkpoint)
    ("gdn", "x16w4c1_m7_lean", "fp8_e4m3", dict(H=2, HV=4, V=128),
     "    return __uint_as_float(__float_as_uint(hi) + static_cast<uint32_t>(static_cast<int32_t>(static_cast<short>(lo))));",
     "    return hi + 0.0f * lo;", "fold"),
    ("kda", "x16w4c1_m7_gp_lean_mma", "fp8_e4m3", dict(V=128),
     "    return __uint_as_float(__float_as_uint(hi) + static_cast<uint32_t>(static_cast<int32_t>(static_cast<short>(lo))));",
     "    return hi + 0.0f * lo;", "fold"),
    # the fold's keys joined without their low halves (the vector loads' join)
    ("kda", "x16w4c1_m7_gp_lean_mma", "fp8_e4m3", dict(V=128), "    return __uint_as_float(h + static_cast<uint32_t>(l));",
     "    return __uint_as_float(h) + 0.0f * l;", "fold"),
    ("gdn", "x16w4c1_m7_lean_mf", "fp8_e4m3", dict(H=2, HV=4, V=128),
     "    return __uint_as_float(h + static_cast<uint32_t>(l));", "    return __uint_as_float(h) + 0.0f * l;", "fold"),
    # a pre-folding row's u_t stored before its fold, over the low half of the record 0 that the fold joins
    ("kda", "x16w4c1_m4_gp", None, {},
     "            if (!flush && !prefold) rec_store(base_u + h_eff * V_ + vrow, base_u_lo + h_eff * V_ + vrow, u_t);",
     "            if (!flush) rec_store(base_u + h_eff * V_ + vrow, base_u_lo + h_eff * V_ + vrow, u_t);", "fold"),
    # records written without their low half
    ("gdn", "x16w4c1_m5", None, {}, "    *lo = static_cast<unsigned short>(b & 0xffffu);", "    *lo = 0;", "bits"),
    ("kda", "x16w4c1_m4_gp", None, {}, "    *lo = static_cast<unsigned short>(b & 0xffffu);", "    *lo = 0;", "bits"),
    # SELF_PRE's main launch appending the key to the high plane alone
    ("gdn", "x16w4c1_m4_sp2", None, dict(H=2, HV=4),
     "                store_key(dst, ring_k_lo + (dst - ring_k), make_float4(kr[0] * s_k, kr[1] * s_k, kr[2] * s_k, kr[3] * s_k));",
     "                for (int c = 0; c < 4; ++c) from_f(dst + c, kr[c] * s_k);", "bits")],
    ids=["gdn-hi-fold", "kda-hi-fold", "kda-keys-hi", "gdn-mf-keys-hi", "kda-early-u_t", "gdn-no-lo", "kda-no-lo",
         "sp2-key-hi"])
def test_split_records_check_can_fail(kind, cfg, read_dtype, shape, old, new, test, monkeypatch, tmp_path):
    """The split records' bit checks fail on a kernel that folds the high plane alone, stores a pre-folding row's u_t
    over record 0 before its fold has read that record's low half, or writes records without their low half."""
    _emulate_mutated(monkeypatch, tmp_path, old, new)
    with pytest.raises(AssertionError, match="differ"):
        if test == "fold":
            test_split_records_fold_exact_emulated(kind, cfg, read_dtype, shape, monkeypatch)
        else:
            test_split_records_same_bits_emulated(kind, cfg, read_dtype, shape, monkeypatch)


@pytest.mark.parametrize("cfg,read_dtype,shape", [("x16w4c1_m7_gp_lean_mma", "fp8_e4m3", dict(V=128)),
                                                  ("x16w4c1_m6_gp_lean_mma", "bf16", {}),
                                                  ("x16w4c1_m8_gp_mma_mf", "same", dict(V=128))], ids=str)
def test_kda_gts_only_where_read_emulated(cfg, read_dtype, shape, monkeypatch):
    """KDA's pre launch writes G_t (gts) only where the main launch reads it when the tile's dots are on the tensor
    cores (session 51): the scratch starts as NaN every step and 14 emulated steps with heads rebased (a lowered
    threshold) still match float64; and the pre launch left some of it unwritten (NaN), on rows that append."""
    from replayssm_sglang.kernels import decode_v3

    scratch = []

    def nan_gts(B, HV, K, device):
        t = torch.full((B, HV, K), float("nan"), device=device)
        scratch.append(t)
        return t

    monkeypatch.setattr(decode_v3, "_gts_scratch", nan_gts)
    monkeypatch.setattr(decode_v3, "PREDECAYED_MIN_G", -5.0)
    sdt = "bfloat16" if read_dtype == "same" else "float32"
    kw = dict(rec_dtype=torch.bfloat16) if sdt == "bfloat16" else dict(read_dtype=read_dtype)
    hz, _, pre_calls = _emu_harness("kda", cfg, sdt, "fast", monkeypatch, pre_impl="cuda", seed=9, **kw, **shape)
    st = hz.run(14)
    assert st["rebase"] > 0 and len(pre_calls) == 14, st
    assert len(scratch) == 14 and any(bool(t.isnan().any()) for t in scratch), "the pre launch wrote every row's G_t"


def test_kda_gts_only_where_read_can_fail(monkeypatch, tmp_path):
    """That case fails on a pre launch that leaves out a rebased head's G_t (its fold takes the token with G_t)."""
    _emulate_mutated(monkeypatch, tmp_path, "if (gts != nullptr && (!rule.append || rb))",
                     "if (gts != nullptr && (!rule.append))")
    with pytest.raises(AssertionError, match="rms ratio|non-finite"):
        test_kda_gts_only_where_read_emulated("x16w4c1_m7_gp_lean_mma", "fp8_e4m3", dict(V=128), monkeypatch)


# VEC_U (session 52): the main launch reads a lane's RPL value records at one position as one vector load (16 bytes
# fp32, 8 bf16 at RPL 4; 8 and 4 at RPL 2) instead of RPL element loads. The XL shapes of both kinds: fp32 and bf16
# records, 16 and 8 rows per warp, the fp8 copy, SELF_PRE 2 and split records (whose plain rows read the bf16 high plane)
VEC_U_CASES = [("gdn", "x16w4c1_m7_lean", "float32", "slow", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128)),
               ("gdn", "x16w4c1_m7_mma_mf", "bfloat16", "fast", dict(H=2, HV=4, V=128, rec_dtype=torch.bfloat16)),
               ("gdn", "x8w4c1", "float32", "slow", {}),
               ("gdn", "x8w4c1", "bfloat16", "fast", dict(rec_dtype=torch.bfloat16)),
               ("gdn", "x16w4c1_m4_sp2", "float32", "fast", dict(H=2, HV=4, self_pre=2)),
               ("gdn", "x16w4c1_m5", "float32", "slow", dict(split_records=True)),
               ("kda", "x16w4c1_m7_gp_lean_mma", "float32", "slow", dict(read_dtype="fp8_e4m3", V=128)),
               ("kda", "x16w4c1_m6_gp_mf", "bfloat16", "fast", dict(rec_dtype=torch.bfloat16))]


# (level 2, session 55: every vector load issued, a dead position's values dropped by a select; the bf16 states'
# default shapes)
VEC_U_LEVEL_CASES = [(*c, 1) for c in VEC_U_CASES] + [(*VEC_U_CASES[1], 2), (*VEC_U_CASES[-1], 2)]


@pytest.mark.parametrize("kind,cfg,state_dtype,decay,shape,level", VEC_U_LEVEL_CASES, ids=str)
def test_vec_u_emulated(kind, cfg, state_dtype, decay, shape, level, monkeypatch):
    """REPLAYSSM_VEC_U=<level>: every build is a VEC_U build at that level and the step matches float64 over 14 steps
    (window switching, forced flushes, pre-folds, padded rows, staggered cursors: rows whose records end inside a
    lane's positions)."""
    builds = _spy_builds(monkeypatch)
    monkeypatch.setenv("REPLAYSSM_VEC_U", str(level))
    sp = shape.get("self_pre")
    hz, calls, _ = _emu_harness(kind, cfg, state_dtype, decay, monkeypatch, pre_impl=None if sp else "cuda",
                                seed=29 if level == 1 else 31, **shape)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["staggered"] > 0 and st["padded"] > 0, st
    assert len(calls) == 14
    assert builds and all(d.get("VEC_U") == level for d in builds)


@pytest.mark.parametrize("old,new,cfg,shape", [
    # the vector load hands a lane's rows their records (or fp8 scales) in the wrong order (rows 1 and 2 swapped)
    ("f[0] = w.x, f[1] = w.y, f[2] = w.z, f[3] = w.w;", "f[0] = w.x, f[1] = w.z, f[2] = w.y, f[3] = w.w;",
     "x16w4c1_m5", {}),
    # the fp8 copy's row scales one row off (records as they were: only the scales' vector load is wrong)
    ("            load_run<RPL>(rc_scale + (rrow * HV_ + hv) * V_ + row0 + (ch0 + cc) * VT + lrow, rsc[cc]);",
     "            load_run<RPL>(rc_scale + (rrow * HV_ + hv) * V_ + row0 + (ch0 + cc) * VT + (lrow ^ 4), rsc[cc]);",
     "x16w4c1_m7_lean", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128)),
    # a pair of positions' coefficients swapped
    ("            cq[t] = wq.x, cq[t + 1] = wq.y, ck[t] = wk.x, ck[t + 1] = wk.y;",
     "            cq[t] = wq.y, cq[t + 1] = wq.x, ck[t] = wk.x, ck[t + 1] = wk.y;", "x16w4c1_m5", {})], ids=str)
def test_vec_u_check_can_fail(old, new, cfg, shape, monkeypatch, tmp_path):
    """The VEC_U cases fail on a kernel whose vector loads put a value in the wrong place."""
    _emulate_mutated(monkeypatch, tmp_path, old, new)
    monkeypatch.setenv("REPLAYSSM_VEC_U", "1")
    hz, _, _ = _emu_harness("gdn", cfg, "float32", "slow", monkeypatch, pre_impl="cuda", seed=29, **shape)
    with pytest.raises(AssertionError, match="rms ratio|non-finite"):
        hz.run(6)


def _vec_u_pair(kind, cfg, read_dtype, state_dtype, *, seed, H=None, HV=2, V=64, B=5, level=1, monkeypatch,
                opts=None):
    """One emulated decode step without and with VEC_U (at `level`) on copies of one ring (random records, the value
    records at and past each slot's cursor NaN: no build may take them into a row; cursors 0 .. L: appends, flushes,
    pre-folds; forced flushes, stale copies, a padded row), checkpoint and inputs. Returns both (state, ring, out).
    opts: the two arms' decode_v3 options instead (the same ring, another pair of builds)."""
    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    g = torch.Generator().manual_seed(seed)
    H = H or (1 if kind == "gdn" else HV)
    L, K = 16, 128
    sdt = getattr(torch, state_dtype)
    lay = ringmod.RingLayout.for_layer(kind, L=L, H=H, HV=HV, K=K, V=V)
    slots = B + 2
    keys = "predecayed" if kind == "kda" else "raw"
    r0 = lay.allocate(slots, record_dtype=sdt, read_dtype=read_dtype, kda_keys=keys)
    r0.u.copy_(torch.randn(r0.u.shape, generator=g))
    r0.k.copy_(torch.randn(r0.k.shape, generator=g) * 0.1)
    r0.g.copy_(-torch.cumsum(torch.rand(r0.g.shape, generator=g) * 0.2, dim=2))
    h = torch.randint(0, L + 1, (slots,), generator=g, dtype=torch.int32)
    h[:3] = torch.tensor([L, L - 1, 0], dtype=torch.int32)
    r0.h.copy_(h)
    dead = torch.arange(L)[None, :] >= h[:, None].long()  # [slots, L]: positions at or past the cursor
    r0.u.masked_fill_(dead[:, None, :, None], float("nan"))
    if r0.rc is not None:
        r0.rc_valid.copy_((torch.rand(slots, generator=g) < 0.7).to(torch.int32))
        r0.rc.copy_((torch.randn(r0.rc.shape, generator=g) * 100).to(r0.rc.dtype))
        if r0.rc_scale is not None:
            r0.rc_scale.copy_(torch.rand(r0.rc_scale.shape, generator=g) * 1e-3 + 1e-4)
    r1 = lay.allocate(slots, record_dtype=sdt, read_dtype=read_dtype, kda_keys=keys)
    for f in ("u", "k", "g", "h", "rc", "rc_scale", "rc_valid", "ovf"):
        if getattr(r0, f) is not None:
            getattr(r1, f).copy_(getattr(r0, f))
    forced = (torch.rand(B, generator=g) < 0.25).to(torch.int32)
    o0, o1 = opts or (dict(vec_u=0), dict(vec_u=level))
    return _step_each(kind, cfg, [(r0, o0), (r1, o1)], g, forced=forced, padded=True, H=H,
                      HV=HV, V=V, L=L, K=K, state_dtype=sdt)


VEC_U_BIT_CASES = [("gdn", "x16w4c1_m7_lean", "fp8_e4m3", "float32", dict(H=2, HV=4, V=128)),
                   ("gdn", "x16w4c1_m7_mma_mf", "same", "bfloat16", dict(H=2, HV=4, V=128)),
                   ("gdn", "x8w4c1", "same", "float32", {}), ("gdn", "x8w4c1", "same", "bfloat16", {}),
                   ("kda", "x16w4c1_m4_gp", "same", "float32", {}),
                   ("kda", "x16w4c1_m6_gp_mf", "same", "bfloat16", {})]


@pytest.mark.parametrize("level", [1, 2])
@pytest.mark.parametrize("kind,cfg,read_dtype,state_dtype,shape", VEC_U_BIT_CASES, ids=str)
def test_vec_u_same_bits_emulated(kind, cfg, read_dtype, state_dtype, shape, level, monkeypatch):
    """VEC_U (either level) changes how the value records are loaded, not what: one step over every kind of row leaves
    outputs, checkpoints, read copies and records the same bit for bit without and with it (the records at and past
    each cursor NaN: level 2 loads them and must drop them)."""
    builds = _spy_builds(monkeypatch)
    (s0, r0, o0), (s1, r1, o1) = _vec_u_pair(kind, cfg, read_dtype, state_dtype, seed=6, level=level,
                                             monkeypatch=monkeypatch, **shape)
    assert {d.get("VEC_U", 0) for d in builds} == {0, level}
    assert bool(torch.isfinite(o0[:-1]).all()), "a real row's output is not finite"
    assert torch.equal(o0.float().view(torch.int32), o1.float().view(torch.int32)), "outputs differ"
    assert torch.equal(s0.float().view(torch.int32), s1.float().view(torch.int32)), "checkpoints differ"
    if r0.rc is not None:
        assert torch.equal(r0.rc.view(torch.uint8), r1.rc.view(torch.uint8)), "read copies differ"
    assert torch.equal(r0.u.float().view(torch.int32), r1.u.float().view(torch.int32)), "value records differ"
    assert torch.equal(r0.k.float().view(torch.int32), r1.k.float().view(torch.int32)), "key records differ"
    assert torch.equal(r0.h, r1.h)


@pytest.mark.parametrize("case", [VEC_U_BIT_CASES[1], VEC_U_BIT_CASES[-1]], ids=lambda c: c[0])
def test_vec_u2_dead_records_check_can_fail(case, monkeypatch, tmp_path):
    """That check fails on a level-2 build that loads each position's own records and keeps them, dead or not (the
    NaN records at and past the cursor reach the rows' outputs)."""
    src = ("load_run<RPL>(base_u + (live ? j0 + t : 0) * V_ + v0, f);  // (every load issued; a dead one's values\n"
           "#pragma unroll                                                           // are dropped by the select, NaN too)\n"
           "            for (int i = 0; i < RPL; ++i) ru[i][t] = live ? f[i] : 0.0f;")
    _emulate_mutated(monkeypatch, tmp_path, src, src.replace("live ? j0 + t : 0", "j0 + t").replace(
        "live ? f[i] : 0.0f", "f[i]"))
    with pytest.raises(AssertionError, match="differ"):
        test_vec_u_same_bits_emulated(*case, 2, monkeypatch)


def test_vec_u_refuses_a_misaligned_ring():
    """A VEC_U build refuses value records off its vector's alignment, and names the fix."""
    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=64)
    ring = lay.allocate(2)
    d = cuda_main.server_defines(cuda_main.CUDA_CONFIGS["x16w4c1_m5"], vec_u=1)
    assert d.get("VEC_U") == 1
    cuda_main.check_vec_u(d, ring)
    flat = torch.zeros(ring.u.numel() + 1)
    ring.u = flat[1:].view(ring.u.shape)  # (4 bytes past a 16-byte boundary)
    with pytest.raises(ValueError, match="REPLAYSSM_VEC_U=0"):
        cuda_main.check_vec_u(d, ring)
    assert "VEC_U" not in cuda_main.server_defines(cuda_main.CUDA_CONFIGS["x16w4c1_m5"], vec_u=0)
    assert "VEC_U" not in cuda_main.server_defines(cuda_main.CUDA_CONFIGS["g8w4"], vec_u=1)  # (not the XL layout)


# FOLD_OUT (session 57): in the copy-sized registers (RC_LEAN) a block whose rows flush from the checkpoint folds
# first and takes its outputs from the folded rows, instead of dotting the checkpoint word by word and reading it
# again to fold. The shapes it applies to: both kinds' fp8 copy defaults and GDN's bf16 copy default; and a two-warp
# copy shape (session 58's bench --variants fox), whose warps' rows sit at other offsets in the block
FOLD_OUT_CASES = [("gdn", "x16w4c1_m7_lean", "slow", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128)),
                  ("gdn", "x16w4c1_m6_lean", "fast", dict(read_dtype="bf16", H=2, HV=4, V=128)),
                  ("kda", "x16w4c1_m7_gp_lean_mma", "slow", dict(read_dtype="fp8_e4m3", V=128)),
                  ("gdn", "x16w2c1_m14_lean", "slow", dict(read_dtype="fp8_e4m3", H=2, HV=4, V=128))]


@pytest.mark.parametrize("level", [1, 2, 3])
@pytest.mark.parametrize("kind,cfg,decay,shape", FOLD_OUT_CASES, ids=str)
def test_fold_out_emulated(kind, cfg, decay, shape, level, monkeypatch):
    """REPLAYSSM_FOLD_OUT=<level> (2: 8 rows folded at a time; 3: the next rows loaded first): every build is a
    FOLD_OUT build at that level and the step matches float64 over 14 steps (window switching, forced flushes,
    pre-folds, padded rows, staggered cursors, stale copies after the window-1 steps)."""
    builds = _spy_builds(monkeypatch)
    monkeypatch.setenv("REPLAYSSM_FOLD_OUT", str(level))
    hz, calls, _ = _emu_harness(kind, cfg, "float32", decay, monkeypatch, pre_impl="cuda", seed=37, **shape)
    st = hz.run(14)
    assert st["flushes"] > 0 and st["prefolds"] > 0 and st["staggered"] > 0 and st["padded"] > 0, st
    assert len(calls) == 14
    assert builds and all(d.get("FOLD_OUT") == level for d in builds)


@pytest.mark.parametrize("old,new,level", [
    # the token's u_t k~ left out of the stored rows
    ("                        cf[i] = make_float4(cf[i].x + ui * kn.x, cf[i].y + ui * kn.y, cf[i].z + ui * kn.z,\n"
     "                                            cf[i].w + ui * kn.w);", "", 1),
    # the output without the token's u_t <k~, q~>
    ("from_f(out + nh * V_ + wrow + r0 + i, d[2 * i] + ui * kq);", "from_f(out + nh * V_ + wrow + r0 + i, d[2 * i]);",
     1),
    # each output written to its neighbour's row
    ("from_f(out + nh * V_ + wrow + r0 + i, d[2 * i] + ui * kq);",
     "from_f(out + nh * V_ + wrow + r0 + (i ^ 1), d[2 * i] + ui * kq);", 1),
    # the dots summed over half the warp
    ("for (int m = 16; m >= 1; m >>= 1)\n#pragma unroll\n                        for (int e = 0; e < 2 * FR; ++e)",
     "for (int m = 8; m >= 1; m >>= 1)\n#pragma unroll\n                        for (int e = 0; e < 2 * FR; ++e)", 1),
    # level 3: the next rows loaded but not taken (each batch after the first folds the first batch's rows again)
    ("                    for (int i = 0; i < FR; ++i) cf[i] = cn[i];", "", 3)],
    ids=["no-token-term", "no-kq", "rows-swapped", "half-warp", "l3-next-rows-dropped"])
def test_fold_out_check_can_fail(old, new, level, monkeypatch, tmp_path):
    """The FOLD_OUT cases fail on a kernel whose fold-made outputs or stored rows are wrong."""
    _emulate_mutated(monkeypatch, tmp_path, old, new)
    monkeypatch.setenv("REPLAYSSM_FOLD_OUT", str(level))
    kind, cfg, decay, shape = FOLD_OUT_CASES[0]
    hz, _, _ = _emu_harness(kind, cfg, "float32", decay, monkeypatch, pre_impl="cuda", seed=37, **shape)
    with pytest.raises(AssertionError, match="rms ratio|non-finite"):
        hz.run(14)


def test_fold_out_defines_where_it_applies(monkeypatch):
    """FOLD_OUT's -D parameter is set only for the copy-sized shapes with a read copy (not a plain state's shape, not
    the tensor-core fold, not split records), level 0 sets none, and a level it does not have is refused by the
    argument and by REPLAYSSM_FOLD_OUT, with the levels named."""
    fp8, f32 = torch.float8_e4m3fn, torch.float32
    cfgs = cuda_main.CUDA_CONFIGS
    for lv in (1, 2, 3):
        assert cuda_main.server_defines(cfgs["x16w4c1_m7_lean"], rc_dtype=fp8, fold_out=lv)["FOLD_OUT"] == lv
        assert cuda_main.server_defines(cfgs["x16w4c1_m7_gp_lean_mma"], kind="kda", rc_dtype=fp8,
                                        fold_out=lv)["FOLD_OUT"] == lv
    assert "FOLD_OUT" not in cuda_main.server_defines(cfgs["x16w4c1_m7_lean"], rc_dtype=fp8, fold_out=0)
    # the defaults (session 58): level 2 in GDN's CUDA-core copy shapes at 72 registers or more (its fp8 and bf16
    # copies' defaults, the two-warp shapes), not in its tensor-core copy shapes nor at 64 registers; KDA's off
    for name, rc in (("x16w4c1_m7_lean", fp8), ("x16w4c1_m6_lean", torch.bfloat16), ("x16w2c1_m14_lean", fp8)):
        assert cuda_main.server_defines(cfgs[name], rc_dtype=rc)["FOLD_OUT"] == 2, name
    for name in ("x16w4c1_m7_lean_mma", "x16w4c1_m8_lean"):
        assert "FOLD_OUT" not in cuda_main.server_defines(cfgs[name], rc_dtype=fp8), name
    assert cuda_main.server_defines(cfgs["x16w4c1_m8_lean"], rc_dtype=fp8, fold_out=2)["FOLD_OUT"] == 2  # (asked)
    assert "FOLD_OUT" not in cuda_main.server_defines(cfgs["x16w4c1_m7_gp_lean_mma"], kind="kda", rc_dtype=fp8)
    assert "FOLD_OUT" not in cuda_main.server_defines(cfgs["x16w4c1_m5"], state_dtype=f32, fold_out=1)  # (no copy)
    assert "FOLD_OUT" not in cuda_main.server_defines(cfgs["x16w4c1_m8_lean_mma_mf"], rc_dtype=fp8, fold_out=1)
    assert "FOLD_OUT" not in cuda_main.server_defines(cfgs["x16w4c1_m7_lean"], rc_dtype=fp8, rec_split=True,
                                                      fold_out=1)
    with pytest.raises(ValueError, match="fold_out must be one of"):
        cuda_main.server_defines(cfgs["x16w4c1_m7_lean"], rc_dtype=fp8, fold_out=4)
    monkeypatch.setenv("REPLAYSSM_FOLD_OUT", "4")
    with pytest.raises(ValueError, match="REPLAYSSM_FOLD_OUT must be 0, 1, 2 or 3"):
        cuda_main.env_fold_out()
    monkeypatch.setenv("REPLAYSSM_FOLD_OUT", "")
    assert cuda_main.env_fold_out() is None


# FLUSH_FIRST (session 59): the main launch's blocks of the batch rows past the first FF_FROM take their rows from the
# order the CUDA pre launch writes, the rows that fold this step first. What each block computes does not change: the
# step is the same bit for bit, and the order is a permutation of those rows, folding ones first, as the rule says.
FF_CASES = [("gdn", "x16w4c1_m7_lean", "fp8_e4m3", "float32", dict(H=2, HV=4, V=128)),
            ("kda", "x16w4c1_m7_gp_lean_mma", "fp8_e4m3", "float32", dict(V=128)),
            ("gdn", "x16w4c1_m5", "same", "float32", {}), ("gdn", "x16w4c1_m7_mma_mf", "same", "bfloat16", {})]


def _spy_orders(monkeypatch) -> list:
    """A list that gets, for each CUDA pre launch of a FLUSH_FIRST build, (the order it wrote, the order the decode
    rule gives): the rule's inputs are copied before the launch, the order read after it."""
    seen = []
    real = cuda_main.pre_launch

    def spy(**a):
        d = a["defs"]
        if not d.get("FLUSH_FIRST"):
            return real(**a)
        ring, B, L = a["ring"], a["B"], a["L"]
        slot = a["slot_idx"][:B].long()
        rrow = a["ring_idx"][:B].long() if a["ring_idx"] is not None else slot.clone()
        pad = (slot < 0) | (rrow < 0)
        h = a["h_rows"][:B].long() if a["h_rows"] is not None else ring.h.long()[rrow.clamp(min=0)]
        forced = (a["forced"][:B] != 0) if a["forced"] is not None else torch.zeros(B, dtype=torch.bool)
        if ring.rc is not None:
            forced = forced | (ring.rc_valid[rrow.clamp(min=0)] == 0)
        prefold = h >= L
        fold = (prefold | (torch.where(prefold, 0, h) + 1 >= L) | forced) & ~pad
        ff = d["FF_FROM"]
        rows = list(range(ff, B))
        want = [n for n in rows if fold[n]] + [n for n in reversed(rows) if not fold[n]]
        real(**a)
        seen.append((a["order"][:len(rows)].tolist(), want))

    monkeypatch.setattr(cuda_main, "pre_launch", spy)
    return seen


@pytest.mark.parametrize("ff_from", [0, 2])
@pytest.mark.parametrize("kind,cfg,read_dtype,state_dtype,shape", FF_CASES, ids=str)
def test_flush_first_same_bits_emulated(kind, cfg, read_dtype, state_dtype, shape, ff_from, monkeypatch):
    """FLUSH_FIRST (past the first ff_from rows) moves no bit: one step over every kind of row (appends, flushes,
    pre-folds, forced flushes, stale copies, a padded row) leaves outputs, checkpoints, read copies and records the same
    without and with it, and the order its pre launch wrote is the rule's: the folding rows first in batch order, then
    the others from the back."""
    builds = _spy_builds(monkeypatch)
    orders = _spy_orders(monkeypatch)
    (s0, r0, o0), (s1, r1, o1) = _vec_u_pair(kind, cfg, read_dtype, state_dtype, seed=8, B=7, monkeypatch=monkeypatch,
                                             opts=(dict(flush_first=False), dict(flush_first=True, ff_from=ff_from)),
                                             **shape)
    assert {d.get("FLUSH_FIRST", 0) for d in builds} == {0, 1}
    assert len(orders) == 1 and orders[0][0] == orders[0][1], orders
    got, _ = orders[0]
    assert got != list(range(ff_from, 7)), "no row moved: the case orders nothing"
    assert bool(torch.isfinite(o1[:-1]).all()), "a real row's output is not finite"
    _assert_same_bits(o0.float(), o1.float(), "outputs differ")
    _assert_same_bits(s0.float(), s1.float(), "checkpoints differ")
    if r0.rc is not None:
        assert torch.equal(r0.rc.view(torch.uint8), r1.rc.view(torch.uint8)), "read copies differ"
    _assert_same_bits(r0.u.float(), r1.u.float(), "value records differ")
    _assert_same_bits(r0.k.float(), r1.k.float(), "key records differ")
    assert torch.equal(r0.h, r1.h)


def test_flush_first_orders_a_large_batch_emulated(monkeypatch):
    """300 rows (past FF_FROM 16: two rounds of the pre launch's 256 rows a round): the order is the rule's and the
    step the same bit for bit as in batch order."""
    orders = _spy_orders(monkeypatch)
    (s0, r0, o0), (s1, r1, o1) = _vec_u_pair("gdn", "x16w4c1_m5", "same", "float32", seed=9, B=300, V=64,
                                             monkeypatch=monkeypatch,
                                             opts=(dict(flush_first=False), dict(flush_first=True)))
    assert len(orders) == 1 and orders[0][0] == orders[0][1]
    assert len(orders[0][0]) == 300 - cuda_main.FF_FROM_DEFAULT
    _assert_same_bits(o0.float(), o1.float(), "outputs differ")
    _assert_same_bits(s0.float(), s1.float(), "checkpoints differ")


@pytest.mark.parametrize("old,new", [
    # each plain row's place given its neighbour's row (one row run twice, one never)
    ("order[m - 1 - np - __popc(mp & below)] = n;", "order[m - 1 - np - __popc(mp & below)] = n > 0 ? n - 1 : n;"),
    # the main launch reading the order one place off
    ("n = order[n - FF_FROM];", "n = order[n - FF_FROM > 0 ? n - FF_FROM - 1 : 0];")],
    ids=["plain-row-repeated", "order-off-by-one"])
def test_flush_first_check_can_fail(old, new, monkeypatch, tmp_path):
    """Those checks fail on a pre launch that writes a wrong order, or a main launch that reads it wrong."""
    _emulate_mutated(monkeypatch, tmp_path, old, new)
    with pytest.raises(AssertionError, match="differ|not finite|\\["):
        test_flush_first_same_bits_emulated(*FF_CASES[0], 0, monkeypatch)


def test_flush_first_defines_where_it_applies(monkeypatch):
    """FLUSH_FIRST's -D parameters are set only for the XL shapes with a pre launch (not SELF_PRE's, not the others),
    with FF_FROM's default or the one asked; REPLAYSSM_FLUSH_FIRST is 0 or 1; a launch whose pre launch is not the
    CUDA one keeps batch order (its main build has no FLUSH_FIRST)."""
    fp8, cfgs = torch.float8_e4m3fn, cuda_main.CUDA_CONFIGS
    d = cuda_main.server_defines(cfgs["x16w4c1_m7_lean"], rc_dtype=fp8, flush_first=True)
    assert d["FLUSH_FIRST"] == 1 and d["FF_FROM"] == cuda_main.FF_FROM_DEFAULT
    assert "FLUSH_FIRST" not in cuda_main.server_defines(cfgs["x16w4c1_m7_lean"], rc_dtype=fp8)
    assert "FLUSH_FIRST" not in cuda_main.server_defines(cfgs["x16w4c1_m4_sp2"], flush_first=True)  # (SELF_PRE)
    assert "FLUSH_FIRST" not in cuda_main.server_defines(cfgs["g8w4"], flush_first=True)  # (not XL)
    with pytest.raises(ValueError, match="ff_from"):
        cuda_main.flush_first_defines(True, -1, 1, False)
    monkeypatch.setenv("REPLAYSSM_FLUSH_FIRST", "2")
    with pytest.raises(ValueError, match="REPLAYSSM_FLUSH_FIRST must be 0 or 1"):
        cuda_main.env_flush_first()
    monkeypatch.setenv("REPLAYSSM_FLUSH_FIRST", "1")
    assert cuda_main.env_flush_first() is True
    # beside Triton's pre launch (which writes no order) the CUDA main launch's build has no FLUSH_FIRST
    builds = _spy_builds(monkeypatch)
    hz, calls, pres = _emu_harness("gdn", "x16w4c1_m5", "float32", "slow", monkeypatch, B=3, pre_impl="triton")
    hz.run(2)
    assert builds and not any(b.get("FLUSH_FIRST") for b in builds) and not pres

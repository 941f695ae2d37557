"""The CUDA main launch (kernels/gdn_main.cu, kernels/cuda_main.py) on the CPU: where it refuses to run and why,
and (where nvcc exists: scripts/setup-nvcc) that every block shape compiles for sm_90 without spills, for GDN and for
KDA. Its arithmetic is checked against float64 on the GPU (tests/test_decode_kernels.py,
test_gpu_real_shapes_cuda_main*)."""

from __future__ import annotations

import pytest
import torch

from replayssm_sglang import reference as R
from replayssm_sglang import ring as ringmod
from replayssm_sglang.kernels import cuda_main
from replayssm_sglang.kernels.decode import replay_decode


def _launch(kind="gdn", state_dtype=torch.float32, read_dtype="same", kda_keys="raw", **v3_opts):
    H, HV, K, V = (1, 2, 128, 128) if kind == "gdn" else (2, 2, 128, 128)
    lay = ringmod.RingLayout.for_layer(kind, L=16, H=H, HV=HV, K=K, V=V)
    ring = lay.allocate(2, read_dtype=read_dtype, kda_keys=kda_keys)
    state = torch.zeros(2, HV, V, K, dtype=state_dtype)
    x = R.random_decode_inputs(kind, 2, H, HV, K, V, generator=torch.Generator().manual_seed(0))
    slot = torch.arange(2, dtype=torch.int32)
    return replay_decode(kind, *x, state, ring, slot, L=16, impl="v3", v3_opts={"main_impl": "cuda", **v3_opts})


def test_refuses_ring_capacity_the_layout_cannot_split():
    lay = ringmod.RingLayout.for_layer("gdn", L=8, H=1, HV=2, K=128, V=128)
    st = torch.zeros(1, 2, 128, 128)
    assert "multiple of 16" in cuda_main.unavailable_reason("gdn", st, lay.allocate(1), None, 128, 128, 8, 8)
    assert "multiple of 16" not in (cuda_main.unavailable_reason("gdn", st, lay.allocate(1), None, 128, 128, 32, 4)
                                    or "")


@pytest.mark.parametrize("kind,state_dtype,read_dtype,kda_keys,why", [
    ("gdn", torch.float32, "same", "raw", "needs a CUDA GPU"),
    ("kda", torch.float32, "same", "raw", "predecayed key records"),
    ("kda", torch.float32, "same", "predecayed", "needs a CUDA GPU"),  # (KDA with the server's keys can take it)
    ("kda", torch.bfloat16, "same", "predecayed", "needs a CUDA GPU"),
    ("gdn", torch.bfloat16, "same", "raw", "needs a CUDA GPU"),  # (a bf16 state can take it: the registers shapes)
    # a read copy: the XL defaults read it since session 36 (beside an fp32 state only)
    ("gdn", torch.float32, "bf16", "raw", "needs a CUDA GPU"),
    ("kda", torch.float32, "fp8_e4m3", "predecayed", "needs a CUDA GPU"),
    ("gdn", torch.bfloat16, "bf16", "raw", "beside an fp32 state only"),
])
def test_refuses_where_it_cannot_run(kind, state_dtype, read_dtype, kda_keys, why):
    with pytest.raises(ValueError, match=why):
        _launch(kind, state_dtype, read_dtype, kda_keys)


def test_kda_g_t_from_the_pre_launch(monkeypatch):
    """KDA's gt_pre shapes: the pre launch (Triton, here under the interpreter) hands the CUDA main launch G_t per
    column, G_{h-1} + g_t, in a [B, HV, K] scratch; GDN refuses the shape."""
    from replayssm_sglang.kernels import decode_v3

    got = []
    real_why = cuda_main.unavailable_reason
    monkeypatch.setattr(cuda_main, "launch", lambda **kw: got.append(kw))  # (the CUDA kernel needs a GPU)
    monkeypatch.setattr(cuda_main, "unavailable_reason", lambda *a, **k: None)
    B, H, HV, K, V, L = 3, 2, 2, 128, 128, 16
    lay = ringmod.RingLayout.for_layer("kda", L=L, H=H, HV=HV, K=K, V=V)
    ring = lay.allocate(B, kda_keys="predecayed")
    g = torch.Generator().manual_seed(4)
    h = torch.tensor([0, 5, 9], dtype=torch.int32)
    ring.h.copy_(h)
    ring.g.copy_(-torch.rand(ring.g.shape, generator=g) * 3)
    x = R.random_decode_inputs("kda", B, H, HV, K, V, generator=g)
    slot = torch.arange(B, dtype=torch.int32)
    replay_decode("kda", *x, torch.zeros(B, HV, V, K), ring, slot, L=L, impl="v3",
                  v3_opts={"main_impl": "cuda", "cuda_config": "g8w4_gp"})
    assert len(got) == 1 and got[0]["config"][5] == 1
    g_t = R.gate("kda", x[1], x[4], x[3], HV=HV, K=K).reshape(B, HV, K)
    for n in range(B):
        g_last = ring.g[n, :, int(h[n]) - 1].reshape(HV, K) if h[n] > 0 else torch.zeros(HV, K)
        torch.testing.assert_close(got[0]["gts"][n].double(), g_last.double() + g_t[n], rtol=1e-5, atol=1e-5)
    gdn_ring = ringmod.RingLayout.for_layer("gdn", L=L, H=1, HV=HV, K=K, V=V).allocate(1)
    assert "KDA's" in real_why("gdn", torch.zeros(1, HV, V, K), gdn_ring, None, K, V,
                               *cuda_main.CUDA_CONFIGS["g8w4_gp"])


def test_kda_refusals():
    """KDA takes the registers shapes only (the shared-memory form is GDN's), and a lower bound (KDA's safe gate)
    where GDN refuses one."""
    lay = ringmod.RingLayout.for_layer("kda", L=16, H=2, HV=2, K=128, V=128)
    ring = lay.allocate(1, kda_keys="predecayed")
    st = torch.zeros(1, 2, 128, 128)
    why = lambda lb, cfg: cuda_main.unavailable_reason("kda", st, ring, lb, 128, 128, *cfg)  # noqa: E731
    assert "registers" in why(None, cuda_main.CUDA_CONFIGS["r16w4"])
    assert "needs a CUDA GPU" in why(-5.0, cuda_main.CUDA_CONFIGS["g8w4"])
    assert "needs a CUDA GPU" in why(None, cuda_main.CUDA_CONFIGS["g8w4"])
    assert "gt_pre" in why(None, cuda_main.CUDA_DEFAULT)  # (GDN's default, the XL layout without KDA's G_t)
    # KDA's defaults take G_t from the pre launch (faster on the H200, kernels-20261203-1113); GDN's never do
    for dt in (torch.float32, torch.bfloat16):
        assert cuda_main.default_config(dt, "kda")[5] == 1 and cuda_main.full_config(cuda_main.default_config(dt, "gdn"))[5] == 0
        assert "needs a CUDA GPU" in why(None, cuda_main.default_config(dt, "kda"))


def test_state_dtypes():
    """fp32 and bf16 checkpoints only; a bf16 one only through the shapes that read the tile into registers (the
    shared-memory copy is written for 4-byte elements), which its default is."""
    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=128)
    ring = lay.allocate(1)
    why = lambda dt, cfg: cuda_main.unavailable_reason("gdn", torch.zeros(1, 2, 128, 128, dtype=dt), ring, None,  # noqa: E731
                                                       128, 128, *cfg)
    assert "fp32 or bf16 state" in why(torch.float16, cuda_main.CUDA_DEFAULT)
    assert "into registers" in why(torch.bfloat16, cuda_main.CUDA_CONFIGS["r16w4"])
    assert cuda_main.default_config(torch.bfloat16)[2] == 1
    for name in cuda_main.CUDA_BF16_CONFIGS:
        assert "needs a CUDA GPU" in why(torch.bfloat16, cuda_main.CUDA_CONFIGS[name])
    with pytest.raises(ValueError, match="into registers"):
        _launch(state_dtype=torch.bfloat16, cuda_config="r16w4")


def test_option_checks():
    with pytest.raises(ValueError, match="main_impl must be"):
        _launch(main_impl="cutlass")
    with pytest.raises(ValueError, match="cuda_config must be"):
        _launch(cuda_config="r64w1")
    with pytest.raises(ValueError, match="must divide V"):
        _launch(cuda_config=(32, 8))  # a 256-row V-tile
    with pytest.raises(ValueError, match="CUDA main launch's diagnostic"):
        replay_decode("gdn", *R.random_decode_inputs("gdn", 1, 1, 2, 128, 128), torch.zeros(1, 2, 128, 128),
                      ringmod.RingLayout.for_layer("gdn", L=4, H=1, HV=2, K=128, V=128).allocate(1),
                      torch.zeros(1, dtype=torch.int32), L=4, impl="v3", v3_opts=dict(_diag_parts="stream"))


def test_unavailable_reason_on_shapes():
    lay = ringmod.RingLayout.for_layer("gdn", L=4, H=1, HV=2, K=64, V=128)
    ring = lay.allocate(1)
    st = torch.zeros(1, 2, 128, 64)
    assert "K = 128" in cuda_main.unavailable_reason("gdn", st, ring, None, 64, 128, 32, 4)
    assert "lower bound" in cuda_main.unavailable_reason("gdn", st, ring, -5.0, 64, 128, 32, 4)


def _server_defs(rpw, nwarps, load_reg, min_blocks, *late_gt_rec, state_dtype=torch.float32, kind="gdn",
                 rc_dtype=None):
    *rest, rec = late_gt_rec
    return cuda_main.server_defines((rpw, nwarps, load_reg, min_blocks, *rest), rec_dtype=rec,
                                    state_dtype=state_dtype, kind=kind, rc_dtype=rc_dtype)


@pytest.mark.skipif(cuda_main.find_nvcc() is None, reason="no nvcc (scripts/setup-nvcc installs one)")
@pytest.mark.parametrize("name,state_dtype,kind", [(n, torch.float32, "gdn") for n in cuda_main.CUDA_CONFIGS
                                                   if n not in cuda_main.KDA_ONLY + cuda_main.XL_BF16_ONLY
                                                   and not cuda_main.full_config(cuda_main.CUDA_CONFIGS[n])[8]]
                         + [(n, torch.bfloat16, "gdn") for n in cuda_main.CUDA_BF16_CONFIGS + cuda_main.XL_BF16_CONFIGS]
                         + [(n, torch.float32, "kda") for n in cuda_main.CUDA_CONFIGS
                            if n.startswith("g") and "_m" not in n]  # (KDA's fp32 state: no bf16-state caps)
                         + [(n, torch.bfloat16, "kda") for n in cuda_main.CUDA_KDA_BF16_CONFIGS]
                         + [(n, torch.float32, "kda") for n in cuda_main.XL_KDA_FP32_CONFIGS]
                         + [(n, torch.bfloat16, "kda") for n in cuda_main.XL_KDA_BF16_CONFIGS])
@pytest.mark.parametrize("rec", [torch.float32, torch.bfloat16])
def test_compiles_for_sm90_without_spills(name, state_dtype, kind, rec):
    res = cuda_main.resources(_server_defs(*cuda_main.CUDA_CONFIGS[name], rec, state_dtype=state_dtype, kind=kind))
    if "_m" in name:  # a tighter register cap than the shape needs: a few bytes of spill (the fold's) allowed
        assert res["spill_stores"] <= 64 and res["spill_loads"] <= 64, res
    else:
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res
    # at most 128 registers: a 128-thread block then fits 4 times in an SM's register file (shared memory allows 3)
    assert res["registers"] is not None and res["registers"] <= 128, res


@pytest.mark.skipif(cuda_main.find_nvcc() is None, reason="no nvcc (scripts/setup-nvcc installs one)")
@pytest.mark.parametrize("name,kind", [("x16w4c1_m5", "gdn"), ("x16w4c1_m4", "gdn"), ("x16w4c1_m4_gp", "kda")])
@pytest.mark.parametrize("rc_dtype", [torch.float8_e4m3fn, torch.bfloat16])
def test_read_copy_builds_compile(name, kind, rc_dtype):
    """Issue 7's read copy in the XL layout (session 36) compiles for sm_90 at most 128 registers; the 96-register
    shape (x16w4c1_m5) spills a few bytes (measured with the copy: 16), the 128-register ones none."""
    res = cuda_main.resources(_server_defs(*cuda_main.CUDA_CONFIGS[name], torch.float32, kind=kind, rc_dtype=rc_dtype))
    assert res["registers"] is not None and res["registers"] <= 128, res
    limit = 64 if name == "x16w4c1_m5" else 0
    assert res["spill_stores"] <= limit and res["spill_loads"] <= limit, res


_LEAN = [(n, cuda_main.full_config(c)[8]) for n, c in cuda_main.CUDA_CONFIGS.items() if cuda_main.full_config(c)[8]
         and not cuda_main.full_config(c)[9] and not cuda_main.full_config(c)[10] and n not in
         cuda_main.XL_BF16_MMA_CONFIGS + cuda_main.XL_KDA_BF16_MMA_CONFIGS]  # (the same tuples as the _lean_mma
# ones, named for ST_MMA; MMA_FOLD's "_mf" shapes: test_mma_fold_builds_compile; the lean shapes without a pre launch,
# RC_SELF_PRE2_CONFIGS: test_lean_self_pre_builds_compile)


@pytest.mark.skipif(cuda_main.find_nvcc() is None, reason="no nvcc (scripts/setup-nvcc installs one)")
@pytest.mark.parametrize("name", cuda_main.RC_SELF_PRE2_CONFIGS)
def test_lean_self_pre_builds_compile(name):
    """The fp8 copy's lean shapes without a pre launch (SELF_PRE 2 beside RC_LEAN, session 48; opt-in, slower than the
    copy's default in run kernels-20261206-1004) build within their caps. They spill where the lean shapes with a pre
    launch do not: the record columns are held through the tile's dots (ptxas sm_90: 8 bytes at 96 registers, 80-112
    at 80 / 72)."""
    res = cuda_main.resources(_server_defs(*cuda_main.CUDA_CONFIGS[name], torch.float32,
                                           rc_dtype=torch.float8_e4m3fn))
    cap = 65536 // (128 * cuda_main.CUDA_CONFIGS[name][3])
    assert res["registers"] is not None and res["registers"] <= cap, res
    assert res["spill_stores"] <= 128 and res["spill_loads"] <= 128, res


@pytest.mark.skipif(cuda_main.find_nvcc() is None, reason="no nvcc (scripts/setup-nvcc installs one)")
@pytest.mark.parametrize("name,rc_dtype", [(n, r) for n, lean in _LEAN for r in (torch.float8_e4m3fn, torch.bfloat16)])
def test_read_copy_lean_builds_compile(name, rc_dtype):
    """RC_LEAN (session 40): with the tile's registers sized for the copy, the caps up to 6 blocks per SM (80
    registers) spill nothing where the checkpoint-sized registers spill 16-24 bytes at 96; tighter caps a little (the
    fold's); ptxas sm_90. RC_MMA's shapes (rc_lean 2; session 41 fp8 copies, session 42 bf16 ones and KDA's too) spill
    nothing up to 8 blocks per SM with an fp8 copy, at most 64 bytes with a bf16 one."""
    kind = "kda" if name in cuda_main.KDA_ONLY else "gdn"
    res = cuda_main.resources(_server_defs(*cuda_main.CUDA_CONFIGS[name], torch.float32, kind=kind, rc_dtype=rc_dtype))
    cap = 65536 // (32 * cuda_main.CUDA_CONFIGS[name][1] * cuda_main.CUDA_CONFIGS[name][3])  # (warps x blocks per SM)
    assert res["registers"] is not None and res["registers"] <= min(cap, 128), res
    mma = cuda_main.tensor_core_shape(cuda_main.CUDA_CONFIGS[name])
    # (a bf16 copy's tensor-core shapes below 80 registers spill a little: its 8 tile words per lane; ptxas sm_90,
    # session 42: GDN's at 64 registers 12 bytes stored, 36 loaded; KDA's at 72 8 and 24)
    limit = 0 if cap >= 80 or (mma and rc_dtype == torch.float8_e4m3fn) else 64 if mma else 128
    assert res["spill_stores"] <= limit and res["spill_loads"] <= limit, res


@pytest.mark.skipif(cuda_main.find_nvcc() is None, reason="no nvcc (scripts/setup-nvcc installs one)")
@pytest.mark.parametrize("name,kind", [(n, "gdn") for n in cuda_main.XL_BF16_MMA_CONFIGS]
                         + [(n, "kda") for n in cuda_main.XL_KDA_BF16_MMA_CONFIGS])
@pytest.mark.parametrize("rec", [torch.float32, torch.bfloat16])
def test_st_mma_builds_compile(name, kind, rec):
    """ST_MMA (session 42; rc_lean 2 without a copy, a bf16 checkpoint): GDN's up to 8 blocks per SM without a spill
    (its fold 4 rows at a time, as RC_LEAN's), KDA's up to 7 (at 8: 8 bytes stored, 24 loaded), within the cap;
    ptxas sm_90, the server's build."""
    res = cuda_main.resources(_server_defs(*cuda_main.CUDA_CONFIGS[name], rec, state_dtype=torch.bfloat16, kind=kind))
    cap = 65536 // (128 * cuda_main.CUDA_CONFIGS[name][3])
    assert res["registers"] is not None and res["registers"] <= min(cap, 128), res
    limit = 64 if kind == "kda" and cap < 72 else 0
    assert res["spill_stores"] <= limit and res["spill_loads"] <= limit, res


_MF = [n for n, c in cuda_main.CUDA_CONFIGS.items() if cuda_main.full_config(c)[9]]


@pytest.mark.skipif(cuda_main.find_nvcc() is None, reason="no nvcc (scripts/setup-nvcc installs one)")
@pytest.mark.parametrize("name,rec,rc_dtype", [(n, r, None) for n in _MF if "_lean" not in n
                                                for r in (torch.float32, torch.bfloat16)]
                         + [(n, torch.float32, c) for n in _MF if "_lean" in n
                            for c in (torch.float8_e4m3fn, torch.bfloat16)])
def test_mma_fold_builds_compile(name, rec, rc_dtype):
    """MMA_FOLD (session 43; mma_fold 1, the "_mf" shapes: the fold on the tensor cores): within the cap, at most 64
    bytes of spill (the fold's; ptxas sm_90: the bf16 states with the server's bf16 records none, the read copies' up to
    56 at 7-8 blocks per SM); the MMA_FOLD macro only in these builds (the others' cubins keep their keys)."""
    kind = "kda" if name in cuda_main.KDA_ONLY else "gdn"
    cfg = cuda_main.CUDA_CONFIGS[name]
    lean = cuda_main.full_config(cfg)[8]
    bf16 = cuda_main.XL_BF16_MF_CONFIGS + cuda_main.XL_KDA_BF16_MF_CONFIGS  # (and session 44's, CUDA-core dots)
    sdt = torch.bfloat16 if (lean == 2 and "_lean" not in name) or name in bf16 else torch.float32  # (ST_MMA's: bf16)
    d = _server_defs(*cfg, rec, state_dtype=sdt, kind=kind, rc_dtype=rc_dtype)
    assert d.get("MMA_FOLD") == 1
    res = cuda_main.resources(d)
    cap = 65536 // (128 * cfg[3])
    assert res["registers"] is not None and res["registers"] <= min(cap, 128), res
    assert res["spill_stores"] <= 64 and res["spill_loads"] <= 64, res
    base = next(n for n, c in cuda_main.CUDA_CONFIGS.items() if cuda_main.full_config(c)[:9] == cuda_main.full_config(
        cfg)[:9] and not cuda_main.full_config(c)[9])  # (the same shape with the CUDA-core fold)
    assert "MMA_FOLD" not in _server_defs(*cuda_main.CUDA_CONFIGS[base], rec, state_dtype=sdt, kind=kind,
                                          rc_dtype=rc_dtype)


def test_mma_fold_is_refused_where_it_cannot_run():
    """mma_fold (MMA_FOLD) is the XL layout's with 16 rows per warp and folds at most 16 records: a ring longer than 16,
    another layout and self_pre are refused with why; with ST_MMA's dots an fp32 checkpoint is refused as ST_MMA's; with
    a read copy, and for an fp32 checkpoint without one, it runs."""
    from replayssm_sglang import ring as ringmod

    st = torch.zeros(2, 2, 128, 128)
    for kind, name in (("gdn", "x16w4c1_m8_mma_mf"), ("kda", "x16w4c1_m7_gp_mma_mf")):
        cfg = cuda_main.CUDA_CONFIGS[name]
        assert cuda_main.tensor_core_shape(cfg) and cuda_main.full_config(cfg)[9] == 1
        extra = dict(kda_keys="predecayed") if kind == "kda" else {}
        lay = ringmod.RingLayout.for_layer(kind, L=16, H=2, HV=2, K=128, V=128)
        ok = cuda_main.unavailable_reason(kind, st.bfloat16(), lay.allocate(2, **extra), None, 128, 128, *cfg)
        assert ok in (None, "it needs a CUDA GPU"), ok
        why = cuda_main.unavailable_reason(kind, st, lay.allocate(2, **extra), None, 128, 128, *cfg)  # fp32
        assert why is not None and "ST_MMA" in why and "bf16" in why
        long = ringmod.RingLayout.for_layer(kind, L=32, H=2, HV=2, K=128, V=128)
        why = cuda_main.unavailable_reason(kind, st.bfloat16(), long.allocate(2, **extra), None, 128, 128, *cfg)
        assert why is not None and "--linear-replayssm-cache-len" in why and "mma_fold" in why
    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=2, HV=2, K=128, V=128)
    for name, rd in (("x16w4c1_m5_mf", "same"), ("x16w4c1_m7_lean_mf", "fp8_e4m3"), ("x16w4c1_m8_lean_mma_mf", "bf16")):
        ok = cuda_main.unavailable_reason("gdn", st, lay.allocate(2, read_dtype=rd), None, 128, 128,
                                          *cuda_main.CUDA_CONFIGS[name])
        assert ok in (None, "it needs a CUDA GPU"), (name, ok)
    g8 = cuda_main.full_config(cuda_main.CUDA_CONFIGS["x8w4c1"])[:9] + (1,)  # (8 rows per warp)
    assert "mma_fold" in cuda_main.unavailable_reason("gdn", st, lay.allocate(2), None, 128, 128, *g8)
    why = cuda_main.unavailable_reason("gdn", st, lay.allocate(2), None, 128, 128,
                                       *cuda_main.CUDA_CONFIGS["x16w4c1_m5_mf"], self_pre=True)
    assert why is not None and "self_pre" in why


def test_rc_mma_is_refused_where_it_cannot_run():
    """rc_lean 2 (the tile's dots on the tensor cores): with a read copy (RC_MMA), fp8 or bf16; without one (ST_MMA)
    a bf16 checkpoint only (GDN's and KDA's): an fp32 checkpoint and shapes off its layout are refused with why,
    before any build."""
    from replayssm_sglang import ring as ringmod

    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=128)
    st = torch.zeros(2, 2, 128, 128)
    mma = cuda_main.CUDA_CONFIGS["x16w4c1_m7_lean_mma"]
    for rd in ("fp8_e4m3", "bf16"):
        ok = cuda_main.unavailable_reason("gdn", st, lay.allocate(2, read_dtype=rd), None, 128, 128, *mma)
        assert ok in (None, "it needs a CUDA GPU"), (rd, ok)
    why = cuda_main.unavailable_reason("gdn", st, lay.allocate(2), None, 128, 128, *mma)  # fp32, no copy
    assert why is not None and "ST_MMA" in why and "bf16" in why
    ok = cuda_main.unavailable_reason("gdn", st.bfloat16(), lay.allocate(2), None, 128, 128, *mma)
    assert ok in (None, "it needs a CUDA GPU"), ok
    late = (*mma[:4], 1, *mma[5:])
    assert "ST_MMA" in cuda_main.unavailable_reason("gdn", st.bfloat16(), lay.allocate(2), None, 128, 128, *late)
    klay = ringmod.RingLayout.for_layer("kda", L=16, H=2, HV=2, K=128, V=128)
    kring = klay.allocate(2, kda_keys="predecayed")
    ok = cuda_main.unavailable_reason("kda", st.bfloat16(), kring, None, 128, 128,
                                      *cuda_main.CUDA_CONFIGS["x16w4c1_m7_gp_mma"])
    assert ok in (None, "it needs a CUDA GPU"), ok
    why = cuda_main.unavailable_reason("kda", st, kring, None, 128, 128, *cuda_main.CUDA_CONFIGS["x16w4c1_m7_gp_mma"])
    assert why is not None and "ST_MMA" in why  # (an fp32 checkpoint)
    why = cuda_main.unavailable_reason("kda", st.bfloat16(), kring, None, 128, 128,
                                       *cuda_main.CUDA_CONFIGS["x16w4c1_m7_mma"])  # (KDA's XL needs gt_pre)
    assert why is not None and "gt_pre" in why
    with pytest.raises(ValueError, match="frag"):
        cuda_main.check_frag(None, 2, 1)
    cuda_main.check_frag(cuda_main.frag_scratch(2, 1, "cpu"), 2, 1)


def test_read_copy_default_shapes(monkeypatch):
    """default_config's read-copy tables (CUDA_DEFAULT_RC, CUDA_DEFAULT_RC_KDA) are what a launch with a copy takes
    when no shape is asked: GDN's rc_lean shapes (fp8 x16w4c1_m7_lean, bf16 x16w4c1_m6_lean, since session 41's served
    A/B), KDA's fp8 copy x16w4c1_m7_gp_lean_mma (session 42's); without a copy, for KDA's bf16 copy and for a bf16
    state the defaults are the plain ones; the environment's shape (REPLAYSSM_CUDA_CONFIG_GDN) still wins."""
    from replayssm_sglang import ring as ringmod

    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_GDN", raising=False)
    f32, fp8, bf16 = torch.float32, torch.float8_e4m3fn, torch.bfloat16
    assert cuda_main.default_config(f32, "gdn", fp8) == cuda_main.CUDA_CONFIGS["x16w4c1_m7_lean"]
    assert cuda_main.default_config(f32, "gdn", bf16) == cuda_main.CUDA_CONFIGS["x16w4c1_m6_lean"]
    # (without a copy GDN's fp32 default has no pre launch since session 47: SELF_PRE 2)
    assert cuda_main.default_config(f32, "gdn") == cuda_main.CUDA_DEFAULT_FP32_GDN
    assert cuda_main.full_config(cuda_main.CUDA_DEFAULT_FP32_GDN)[8] == 0  # (no read copy: not lean)
    assert cuda_main.full_config(cuda_main.CUDA_DEFAULT_FP32_GDN)[10] == 2
    # KDA's fp8 copy: its rc_lean shape with the tensor cores (session 42's served A/B); its bf16 copy the plain one
    assert cuda_main.default_config(f32, "kda", fp8) == cuda_main.CUDA_CONFIGS["x16w4c1_m7_gp_lean_mma"]
    assert cuda_main.default_config(f32, "kda", bf16) == cuda_main.CUDA_DEFAULT_KDA
    assert cuda_main.default_config(f32, "kda") == cuda_main.CUDA_DEFAULT_KDA
    assert cuda_main.default_config(bf16, "gdn", fp8) == cuda_main.CUDA_DEFAULT_BF16  # (a copy is fp32 states' only)
    assert cuda_main.asked_config(None, f32, "gdn", fp8) == cuda_main.CUDA_CONFIGS["x16w4c1_m7_lean"]
    assert cuda_main.asked_config("x16w4c1_m5", f32, "gdn", fp8) == cuda_main.CUDA_CONFIGS["x16w4c1_m5"]
    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=128)
    ring = lay.allocate(2, read_dtype="fp8_e4m3")
    assert cuda_main.rc_dtype_of(ring) == fp8 and cuda_main.rc_dtype_of(lay.allocate(2)) is None
    monkeypatch.setenv("REPLAYSSM_CUDA_CONFIG_GDN", "x16w4c1_m5")
    assert cuda_main.default_config(f32, "gdn", fp8) == cuda_main.CUDA_CONFIGS["x16w4c1_m5"]


def test_device_defaults(monkeypatch):
    """DEVICE_DEFAULTS: a GPU whose name holds a key takes its shape for a (kind, checkpoint type) without a read copy
    (KDA's bf16 state on an H200: x16w4c1_m8_gp_mma_mf, the H200's fastest in run 0258); another GPU, no GPU (None), a
    read copy or another state keep the defaults; a long ring still takes LONG_RING_DEFAULT (the H200's shape folds on
    the tensor cores); the environment's shape still wins; a CPU tensor has no device name."""
    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_KDA", raising=False)
    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_GDN", raising=False)
    f32, fp8, bf16 = torch.float32, torch.float8_e4m3fn, torch.bfloat16
    h200, h100 = "NVIDIA H200", "NVIDIA H100 80GB HBM3"
    m8 = cuda_main.CUDA_CONFIGS["x16w4c1_m8_gp_mma_mf"]
    assert cuda_main.default_config(bf16, "kda", None, 16, h200) == m8
    assert cuda_main.asked_config(None, bf16, "kda", None, 16, h200) == m8
    assert cuda_main.default_config(bf16, "kda", None, 16, h100) == cuda_main.CUDA_DEFAULT_KDA_BF16 != m8
    assert cuda_main.default_config(bf16, "kda", None, 16, None) == cuda_main.CUDA_DEFAULT_KDA_BF16
    assert cuda_main.default_config(bf16, "gdn", None, 16, h200) == cuda_main.CUDA_DEFAULT_BF16
    assert cuda_main.default_config(f32, "kda", None, 16, h200) == cuda_main.CUDA_DEFAULT_KDA
    assert cuda_main.default_config(f32, "kda", fp8, 16, h200) == cuda_main.CUDA_DEFAULT_RC_KDA[fp8]
    assert cuda_main.default_config(bf16, "kda", None, 32, h200) == cuda_main.LONG_RING_DEFAULT[("kda", bf16)]
    monkeypatch.setenv("REPLAYSSM_CUDA_CONFIG_KDA", "x16w4c1_m6_gp")
    assert cuda_main.default_config(bf16, "kda", None, 16, h200) == cuda_main.CUDA_CONFIGS["x16w4c1_m6_gp"]
    assert cuda_main.device_name_of(torch.zeros(1)) is None and cuda_main.device_name_of(None) is None
    # the launch's own selection asks the checkpoint's GPU (device_name_of; here as an H200 would answer)
    from replayssm_sglang import ring as ringmod

    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_KDA")
    ring = ringmod.RingLayout.for_layer("kda", L=16, H=2, HV=2, K=128, V=128).allocate(2, kda_keys="predecayed")
    st = torch.zeros(2, 2, 128, 128, dtype=bf16)
    assert cuda_main.launch_default_config(st, ring, "kda") == cuda_main.CUDA_DEFAULT_KDA_BF16
    monkeypatch.setattr(cuda_main, "device_name_of", lambda t: h200)
    assert cuda_main.launch_default_config(st, ring, "kda") == m8
    for table in cuda_main.DEVICE_DEFAULTS.values():  # (every shape named there is one the prebuild knows)
        for (kind, sdt), cfg in table.items():
            assert cuda_main.config_name(cfg) in cuda_main.CUDA_CONFIGS and kind in ("gdn", "kda")


def test_read_copy_refusals():
    """Where the CUDA main launch cannot read a read copy it says why (the XL layout and an fp32 state only)."""
    from replayssm_sglang import ring as ringmod

    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=128)
    ring = lay.allocate(2, read_dtype="fp8_e4m3")
    st32, st16 = torch.zeros(2, 2, 128, 128), torch.zeros(2, 2, 128, 128, dtype=torch.bfloat16)
    why = lambda st, name: cuda_main.unavailable_reason("gdn", st, ring, None, 128, 128,  # noqa: E731
                                                        *cuda_main.CUDA_CONFIGS[name])
    assert "xl" in why(st32, "g8w4")
    assert "fp32 state" in why(st16, "x16w4c1_m6")
    assert why(st32, "x16w4c1_m5") in (None, "it needs a CUDA GPU")  # (the layout takes it: only the device is missing)
    assert why(st32, "x16w4c1_m6_lean") in (None, "it needs a CUDA GPU")
    assert "rc_lean" in cuda_main.unavailable_reason("gdn", st32, lay.allocate(2), None, 128, 128,
                                                     *cuda_main.CUDA_CONFIGS["x16w4c1_m6_lean"])  # (no read copy)


def test_read_copy_takes_the_cuda_launch(monkeypatch):
    """With a read copy the server takes the CUDA main launch as without one (opt-in in session 36, the default since
    its GPU cases passed and it served, session 37), REPLAYSSM_MAIN_IMPL=triton Triton's, and its log says which;
    decode_v3.launch follows the same rule."""
    from replayssm_sglang import ring as ringmod

    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=128)
    ring = lay.allocate(2, read_dtype="fp8_e4m3")
    st = torch.zeros(2, 2, 128, 128)
    monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", "triton")
    assert cuda_main.preference_note("gdn", st, ring, 128, 128) == "Triton (REPLAYSSM_MAIN_IMPL=triton)"
    monkeypatch.delenv("REPLAYSSM_MAIN_IMPL", raising=False)
    # (this machine has no GPU: the note names that, not a read copy)
    assert cuda_main.preference_note("gdn", st, ring, 128, 128) == "Triton (the CUDA one: it needs a CUDA GPU)"
    # the launch itself, emulated: unset and "cuda" -> the CUDA main launch; "triton" -> Triton's
    from replayssm_sglang import reference as R
    from replayssm_sglang.kernels.decode import replay_decode

    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    monkeypatch.setattr(cuda_main, "load_failure", lambda defs, device: None)  # (no cubin to load on a CPU)
    monkeypatch.setattr(cuda_main, "_obtainable", lambda: True)
    calls = []
    real = cuda_main.launch
    monkeypatch.setattr(cuda_main, "launch", lambda **a: calls.append(1) or real(**a))
    x = R.random_decode_inputs("gdn", 2, 1, 2, 128, 128, generator=torch.Generator().manual_seed(0))
    for env, want in (("", 1), ("cuda", 1), ("triton", 0)):
        monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", env)
        calls.clear()
        replay_decode("gdn", *x, st.clone(), ring, torch.arange(2, dtype=torch.int32), L=16, impl="v3")
        assert len(calls) == want, env



def test_self_pre_cuda_by_environment(monkeypatch):
    """REPLAYSSM_SELF_PRE=cuda: a GDN launch that takes the CUDA main launch by preference takes it without a pre
    launch (gdn_main.cu's SELF_PRE, session 37), where that can run; KDA keeps its pre launch; the server's log says
    which; other values are refused with the choices."""
    from replayssm_sglang import reference as R
    from replayssm_sglang import ring as ringmod
    from replayssm_sglang.kernels import decode_v3
    from replayssm_sglang.kernels.decode import replay_decode

    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    for var in ("REPLAYSSM_MAIN_IMPL", "REPLAYSSM_PRE_IMPL"):  # (the server's defaults: conftest asks for Triton's)
        monkeypatch.delenv(var, raising=False)
    # (a shape with a pre launch: GDN's fp32 default has none since session 47, SELF_PRE 2 in its shape)
    monkeypatch.setenv("REPLAYSSM_CUDA_CONFIG_GDN", "x16w4c1_m5")
    monkeypatch.setattr(cuda_main, "load_failure", lambda defs, device: None)  # (no cubin to load on a CPU)
    monkeypatch.setattr(cuda_main, "_obtainable", lambda: True)
    builds, pres = [], []
    real, real_pre = cuda_main.launch, cuda_main.pre_launch
    monkeypatch.setattr(cuda_main, "launch", lambda **a: builds.append(a["defs"]) or real(**a))
    monkeypatch.setattr(cuda_main, "pre_launch", lambda **a: pres.append(1) or real_pre(**a))
    triton_pre = decode_v3.replay_decode_v3_pre_kernel
    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=128)
    st = torch.zeros(2, 2, 128, 128)
    x = R.random_decode_inputs("gdn", 2, 1, 2, 128, 128, generator=torch.Generator().manual_seed(0))
    monkeypatch.setenv("REPLAYSSM_SELF_PRE", "cuda")
    assert cuda_main.pre_preference_note("gdn", st, lay.allocate(2), 128, 16).startswith("none (REPLAYSSM_SELF_PRE")

    class NoPre:
        def __getitem__(self, grid):
            raise AssertionError("a pre launch ran under REPLAYSSM_SELF_PRE=cuda")

    monkeypatch.setattr(decode_v3, "replay_decode_v3_pre_kernel", NoPre())
    replay_decode("gdn", *x, st.clone(), lay.allocate(2), torch.arange(2, dtype=torch.int32), L=16, impl="v3")
    assert len(builds) == 1 and builds[0].get("SELF_PRE") == 1 and builds[0]["USE_PDL"] == 0 and not pres
    # unset: the pre launch runs (GDN's CUDA one), the main launch's build has no SELF_PRE
    monkeypatch.setattr(decode_v3, "replay_decode_v3_pre_kernel", triton_pre)
    monkeypatch.delenv("REPLAYSSM_SELF_PRE")
    builds.clear()
    replay_decode("gdn", *x, st.clone(), lay.allocate(2), torch.arange(2, dtype=torch.int32), L=16, impl="v3")
    assert len(builds) == 1 and "SELF_PRE" not in builds[0] and len(pres) == 1
    monkeypatch.setenv("REPLAYSSM_SELF_PRE", "yes")
    with pytest.raises(ValueError, match="0, 1 or cuda"):
        replay_decode("gdn", *x, st.clone(), lay.allocate(2), torch.arange(2, dtype=torch.int32), L=16, impl="v3")
    # where the CUDA main launch cannot take it (KDA) the note names the pre launch as without it
    monkeypatch.setenv("REPLAYSSM_SELF_PRE", "cuda")
    # a CUDA kernel that cannot be had: Triton's main launch with its pre launch (the preference lapses)
    monkeypatch.setattr(cuda_main, "load_failure", lambda defs, device: "no kernel here")
    tpre = []

    class CountPre:
        def __getitem__(self, grid):
            tpre.append(1)
            return triton_pre[grid]

    monkeypatch.setattr(decode_v3, "replay_decode_v3_pre_kernel", CountPre())
    builds.clear()
    replay_decode("gdn", *x, st.clone(), lay.allocate(2), torch.arange(2, dtype=torch.int32), L=16, impl="v3")
    assert not builds and tpre
    kda = ringmod.RingLayout.for_layer("kda", L=16, H=2, HV=2, K=128, V=128).allocate(2, kda_keys="predecayed")
    assert not cuda_main.pre_preference_note("kda", st, kda, 128, 16).startswith("none")
    why = cuda_main.unavailable_reason("kda", st, kda, None, 128, 128, *cuda_main.CUDA_DEFAULT_KDA, self_pre=True)
    assert "self_pre" in why
    # GDN's fp32 default (session 47) carries SELF_PRE 2 in its shape: the variable changes nothing there, and the
    # note names the shape's own level, not the variable's
    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_GDN")
    monkeypatch.setattr(cuda_main, "load_failure", lambda defs, device: None)
    assert cuda_main.pre_preference_note("gdn", st, lay.allocate(2), 128, 16).startswith(
        "none (the CUDA main launch's shape x16w4c1_m4_sp2")
    builds.clear()
    replay_decode("gdn", *x, st.clone(), lay.allocate(2), torch.arange(2, dtype=torch.int32), L=16, impl="v3")
    assert len(builds) == 1 and builds[0]["SELF_PRE"] == 2 and builds[0]["USE_PDL"] == 0

def test_smem_fits_an_sm():
    for name, cfg in cuda_main.CUDA_CONFIGS.items():
        kind = "kda" if name in cuda_main.KDA_ONLY else "gdn"
        assert cuda_main.smem_bytes(_server_defs(*cfg, torch.float32, kind=kind)) <= 227 * 1024


def test_environment_preference_falls_back_where_it_cannot_run(monkeypatch):
    """The environment's preference (REPLAYSSM_MAIN_IMPL unset, "auto" or "cuda": the server's default) takes the
    CUDA path only where it can run: here (no GPU) the Triton launch runs and gives the same output as with
    REPLAYSSM_MAIN_IMPL=triton; a bad value is refused."""
    from replayssm_sglang.kernels import decode_v3

    calls = []
    monkeypatch.setattr(cuda_main, "launch", lambda **kw: calls.append(kw))
    monkeypatch.setattr(cuda_main, "load_failure", lambda defs, dev: None)  # (the kernel "loads": no GPU here)

    def run():
        H, HV, K, V = 1, 2, 128, 128
        lay = ringmod.RingLayout.for_layer("gdn", L=16, H=H, HV=HV, K=K, V=V)
        ring = lay.allocate(2)
        g = torch.Generator().manual_seed(1)
        state = torch.randn(2, HV, V, K, generator=g) * 0.1
        x = R.random_decode_inputs("gdn", 2, H, HV, K, V, generator=g)
        return replay_decode("gdn", *x, state, ring, torch.arange(2, dtype=torch.int32), L=16, impl="v3"), state

    monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", "triton")
    o_ref, s_ref = run()
    for pref in ("cuda", "auto", None):
        if pref is None:
            monkeypatch.delenv("REPLAYSSM_MAIN_IMPL")
        else:
            monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", pref)
        o, s = run()
        assert calls == [] and torch.equal(o, o_ref) and torch.equal(s, s_ref), pref
    # where it could run, the preference takes it (the availability check pretended true: no GPU here), unset too
    monkeypatch.setattr(cuda_main, "usable", lambda *a: True)
    monkeypatch.setattr(cuda_main, "unavailable_reason", lambda *a, **k: None)
    run()
    assert len(calls) == 1 and calls[0]["config"] == cuda_main.full_config(cuda_main.CUDA_DEFAULT_FP32_GDN)
    assert calls[0]["defs"]["SELF_PRE"] == 2 and calls[0]["defs"]["USE_PDL"] == 0  # (its shape: no pre launch)
    monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", "triton")  # Triton's, even where the CUDA one could run
    calls.clear()
    run()
    assert calls == []
    monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", "cuda")
    # a bf16 checkpoint takes its own default shape (since session 44 a tensor-core one, so the CUDA pre launch with
    # it: pretended available too)
    monkeypatch.setattr(cuda_main, "pre_unavailable_reason", lambda *a, **k: None)
    monkeypatch.setattr(cuda_main, "pre_launch", lambda **kw: None)
    calls.clear()
    H, HV, K, V = 1, 2, 128, 128
    ring = ringmod.RingLayout.for_layer("gdn", L=16, H=H, HV=HV, K=K, V=V).allocate(2)
    x = R.random_decode_inputs("gdn", 2, H, HV, K, V, generator=torch.Generator().manual_seed(2))
    replay_decode("gdn", *x, torch.zeros(2, HV, V, K, dtype=torch.bfloat16), ring, torch.arange(2, dtype=torch.int32),
                  L=16, impl="v3")
    want = cuda_main.CUDA_DEFAULT_BF16
    assert len(calls) == 1 and calls[0]["config"] == cuda_main.full_config(want)
    monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", "fast")
    with pytest.raises(ValueError, match="REPLAYSSM_MAIN_IMPL"):
        run()
    assert decode_v3.cuda_main is cuda_main


def test_preference_falls_back_where_the_kernel_does_not_build(monkeypatch, caplog):
    """Where the CUDA main launch could run but its kernel does not build or load (a broken nvcc, a driver too old for
    the cubin), a launch that only prefers it runs Triton's main launch, with the same output, warns once naming the
    reason and REPLAYSSM_MAIN_IMPL=triton, and later launches (and the small-batch policy: usable()) stop trying. A
    caller who asks for main_impl="cuda" gets the error."""
    import logging

    monkeypatch.setattr(cuda_main, "_FAILED", {})
    monkeypatch.setattr(cuda_main, "_OBTAINABLE", {})
    monkeypatch.setattr(cuda_main, "unavailable_reason", lambda *a, **k: None)  # (no GPU here: pretend it could run)
    monkeypatch.setattr(cuda_main, "find_nvcc", lambda: "/nonexistent/nvcc")
    tried = []

    def broken(defs, device):
        tried.append(defs)
        raise RuntimeError("nvcc failed on gdn_main.cu:\nptxas fatal: unsupported GPU architecture")

    monkeypatch.setattr(cuda_main, "function", broken)
    calls = []
    real_launch = cuda_main.launch
    monkeypatch.setattr(cuda_main, "launch", lambda **kw: calls.append(kw))
    H, HV, K, V = 1, 2, 128, 128
    g = torch.Generator().manual_seed(4)
    x = R.random_decode_inputs("gdn", 2, H, HV, K, V, generator=g)
    state0 = torch.randn(2, HV, V, K, generator=g) * 0.1

    def run(**v3_opts):
        ring = ringmod.RingLayout.for_layer("gdn", L=16, H=H, HV=HV, K=K, V=V).allocate(2)
        state = state0.clone()
        o = replay_decode("gdn", *x, state, ring, torch.arange(2, dtype=torch.int32), L=16, impl="v3",
                          v3_opts=v3_opts)
        return o, state

    monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", "triton")
    o_ref, s_ref = run()
    monkeypatch.delenv("REPLAYSSM_MAIN_IMPL")
    assert cuda_main.usable("gdn", state0, None, None, K, V, cuda_main.CUDA_DEFAULT)
    with caplog.at_level(logging.WARNING, logger=cuda_main.__name__):
        o, s = run()
        o2, _ = run()
    assert calls == [] and len(tried) == 1
    assert torch.equal(o, o_ref) and torch.equal(s, s_ref) and torch.equal(o2, o_ref)
    warned = [r.getMessage() for r in caplog.records if "could not be built or loaded" in r.getMessage()]
    assert len(warned) == 1 and "nvcc failed" in warned[0] and "unsupported GPU architecture" in warned[0]
    assert "REPLAYSSM_MAIN_IMPL=triton" in warned[0]
    assert not cuda_main.usable("gdn", state0, None, None, K, V, cuda_main.CUDA_DEFAULT)
    monkeypatch.setattr(cuda_main, "launch", real_launch)
    with pytest.raises(RuntimeError, match="nvcc failed"):
        run(main_impl="cuda")  # asked for by name: no fallback


def test_driver_structs_match_the_cuda_abi():
    """cuLaunchKernelEx's structs as cuda.h lays them out on x86-64 (CUDA 12 / 13): CUlaunchAttribute is an enum,
    4 bytes of padding and a 64-byte value union; CUlaunchConfig's stream pointer follows seven 32-bit fields at
    offset 32. A mismatch would pass garbage to the driver on the GPU only."""
    import ctypes

    A, C = cuda_main._LaunchAttr, cuda_main._LaunchConfig
    assert ctypes.sizeof(A) == 72 and A.value.offset == 8
    assert C.sharedMemBytes.offset == 24 and C.hStream.offset == 32 and C.attrs.offset == 40
    assert C.numAttrs.offset == 48 and ctypes.sizeof(C) == 56


@pytest.mark.parametrize("parts,want", [("pre+main", (1, 1, 0)), ("main+post", (0, 1, 1)), ("post", (0, 0, 1)),
                                        ("all", (1, 1, 1))])
def test_diag_parts_split_the_step_by_launch(monkeypatch, parts, want):
    """_diag_parts (the benchmark's step split) runs exactly the '+'-joined launches it names; a bad name is refused."""
    from replayssm_sglang.kernels import decode_v3

    ran = {"pre": 0, "main": 0, "post": 0}

    class _Kernel:
        def __init__(self, name):
            self.name = name

        def __getitem__(self, grid):
            return lambda *a, **kw: ran.__setitem__(self.name, ran[self.name] + 1)

    monkeypatch.setattr(cuda_main, "launch", lambda **kw: ran.__setitem__("main", ran["main"] + 1))
    monkeypatch.setattr(cuda_main, "unavailable_reason", lambda *a, **k: None)
    monkeypatch.setattr(decode_v3, "replay_decode_v3_pre_kernel", _Kernel("pre"))
    monkeypatch.setattr(decode_v3, "replay_decode_v2_post_kernel", _Kernel("post"))
    _launch(_diag_parts=parts, cuda_config="x16w4c1_m5")  # (a shape with a pre launch)
    assert (ran["pre"], ran["main"], ran["post"]) == want
    with pytest.raises(ValueError, match="'\\+'-joined launches"):
        _launch(_diag_parts="pre+fold")


def test_preference_note_for_the_server_log(monkeypatch):
    """The server logs which main launch its layers take (pool.main_launch_note): Triton's where the CUDA one cannot run
    (with why) or is declined, the CUDA one where it can."""
    from replayssm_sglang.sglang_hooks import pool as poolmod

    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=128)
    ring = lay.allocate(2)
    state = torch.zeros(2, 2, 128, 128)
    monkeypatch.delenv("REPLAYSSM_MAIN_IMPL", raising=False)
    assert cuda_main.preference_note("gdn", state, ring, 128, 128) == "Triton (the CUDA one: it needs a CUDA GPU)"
    monkeypatch.setattr(cuda_main, "unavailable_reason", lambda *a, **k: None)
    monkeypatch.setattr(cuda_main, "_obtainable", lambda: True)
    assert cuda_main.preference_note("gdn", state, ring, 128, 128).startswith("CUDA (kernels/gdn_main.cu")
    assert "shape x16w4c1_m4_sp2;" in cuda_main.preference_note("gdn", state, ring, 128, 128)
    monkeypatch.setenv("REPLAYSSM_CUDA_CONFIG_GDN", "g8w4")
    assert "shape g8w4 from REPLAYSSM_CUDA_CONFIG_GDN;" in cuda_main.preference_note("gdn", state, ring, 128, 128)
    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_GDN")
    monkeypatch.setattr(cuda_main, "_obtainable", lambda: False)
    assert "needs nvcc or cached cubins" in cuda_main.preference_note("gdn", state, ring, 128, 128)
    monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", "triton")
    assert cuda_main.preference_note("gdn", state, ring, 128, 128) == "Triton (REPLAYSSM_MAIN_IMPL=triton)"

    class FakePool:
        layout = lay

        def ring(self, i):
            return ring

    # the pre launch (REPLAYSSM_PRE_IMPL: auto by default; conftest names Triton's for the tests)
    monkeypatch.setenv("REPLAYSSM_PRE_IMPL", "triton")
    assert poolmod.main_launch_note(FakePool(), state[None]) == (
        "Triton (REPLAYSSM_MAIN_IMPL=triton); pre launch: Triton (REPLAYSSM_PRE_IMPL=triton)")
    monkeypatch.setenv("REPLAYSSM_PRE_IMPL", "cuda")
    assert poolmod.main_launch_note(FakePool(), state[None]) == (
        "Triton (REPLAYSSM_MAIN_IMPL=triton); pre launch: Triton (the CUDA one: it needs a CUDA GPU)")
    kring = ringmod.RingLayout.for_layer("kda", L=16, H=2, HV=2, K=128, V=128).allocate(2)
    assert cuda_main.pre_preference_note("kda", state, kring, 128, 16).startswith(
        "Triton (the CUDA one: it is written for KDA's predecayed key records")
    monkeypatch.setattr(cuda_main, "pre_unavailable_reason", lambda *a: None)
    assert cuda_main.pre_preference_note("gdn", state, ring, 128, 16) == (
        "Triton (the CUDA one needs nvcc or cached cubins: REPLAYSSM_NVCC, REPLAYSSM_CUBIN_DIR)")
    monkeypatch.setattr(cuda_main, "_obtainable", lambda: True)
    assert cuda_main.pre_preference_note("gdn", state, ring, 128, 16).startswith("CUDA (kernels/gdn_main.cu")
    monkeypatch.delenv("REPLAYSSM_PRE_IMPL")  # auto: the CUDA pre launch only beside the CUDA main launch, GDN's only
    assert cuda_main.pre_preference_note("kda", state, kring, 128, 16) == (
        "Triton (its CUDA one is opt-in: REPLAYSSM_PRE_IMPL=cuda)")
    assert cuda_main.pre_preference_note("gdn", state, ring, 128, 16).startswith("Triton (beside Triton's main launch")
    monkeypatch.delenv("REPLAYSSM_MAIN_IMPL")  # (the main launch's unavailable_reason stood in for above: CUDA's)
    # GDN's fp32 default shape makes the coefficients itself (SELF_PRE 2, session 47): no pre launch, and the note says
    # so; a shape with one named by the environment takes the CUDA pre launch
    assert poolmod.main_launch_note(FakePool(), state[None]) == (
        f"{cuda_main.preference_note('gdn', state, ring, 128, 128)}; pre launch: none (the CUDA main launch's shape "
        "x16w4c1_m4_sp2 makes the coefficients itself: gdn_main.cu's SELF_PRE 2)")
    monkeypatch.setenv("REPLAYSSM_CUDA_CONFIG_GDN", "x16w4c1_m5")
    assert poolmod.main_launch_note(FakePool(), state[None]) == (
        f"{cuda_main.preference_note('gdn', state, ring, 128, 128)}; pre launch: CUDA (kernels/gdn_main.cu "
        "replay_gdn_pre; REPLAYSSM_PRE_IMPL=triton for Triton's)")
    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_GDN")
    # a tensor-core shape (rc_lean 2) takes the CUDA pre launch whatever the preference, and the note says so, by the
    # name the environment gave (its tuple is also a read copy's shape)
    monkeypatch.setenv("REPLAYSSM_CUDA_CONFIG_KDA", "x16w4c1_m7_gp_mma")
    for pre in ("triton", "auto"):
        monkeypatch.setenv("REPLAYSSM_PRE_IMPL", pre)
        assert cuda_main.pre_preference_note("kda", state, kring, 128, 16) == (
            "CUDA (kernels/gdn_main.cu replay_kda_pre: the main launch's shape x16w4c1_m7_gp_mma reads its "
            "tensor-core operand)")
    assert "shape x16w4c1_m7_gp_mma from REPLAYSSM_CUDA_CONFIG_KDA" in cuda_main.preference_note("kda", state, kring,
                                                                                                 128, 128)
    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_KDA")
    monkeypatch.delenv("REPLAYSSM_PRE_IMPL")
    monkeypatch.setattr(cuda_main, "preference_note", lambda *a: 1 / 0)
    assert poolmod.main_launch_note(FakePool(), state[None]).startswith("unknown (ZeroDivisionError")


@pytest.mark.skipif(cuda_main.find_nvcc() is None, reason="no nvcc (scripts/setup-nvcc installs one)")
def test_build_caches_one_cubin_and_says_so(monkeypatch, tmp_path, caplog):
    """A server's first launch of a shape compiles it (logged, with the time it took: a pause users can see) into the
    cache, renamed into place whole (no temporary file left beside it); the next build of that shape is the cached
    file, with no compile."""
    import logging

    monkeypatch.setenv("REPLAYSSM_CUBIN_DIR", str(tmp_path))
    defs = _server_defs(*cuda_main.CUDA_DEFAULT, torch.float32)
    with caplog.at_level(logging.INFO, logger=cuda_main.__name__):
        p = cuda_main.build(defs)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("compiling the CUDA main launch" in m and str(tmp_path) in m for m in msgs), msgs
    assert any("compiled in" in m and p.name in m for m in msgs), msgs
    assert p.parent == tmp_path and p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x7fELF"
    assert sorted(x.name for x in tmp_path.iterdir()) == [p.name]  # (the temporary directory is gone)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=cuda_main.__name__):
        assert cuda_main.build(defs) == p
    assert not caplog.records


@pytest.mark.skipif(cuda_main.find_nvcc() is None, reason="no nvcc (scripts/setup-nvcc installs one)")
@pytest.mark.parametrize("rec,state_dtype,h_rows", [(torch.float32, torch.float32, False),
                                                    (torch.bfloat16, torch.float32, True),
                                                    (torch.float32, torch.bfloat16, False)])
def test_pre_launch_compiles_in_one_wave_without_spills(rec, state_dtype, h_rows):
    """GDN's CUDA pre launch (replay_gdn_pre, in the same build as the main launch it feeds): at most 64 registers,
    so 32 one-warp blocks fit an SM and the server's 4,096 (row, key head) items at B = 256 are one wave on the H200;
    no spills and no local memory (its 32 record dots stay in registers through the reduce-scatter). KDA's builds hold
    replay_kda_pre instead: at most 72 registers (28 blocks per SM), no spills, no local memory."""
    cfg = cuda_main.CUDA_DEFAULT_BF16 if state_dtype == torch.bfloat16 else cuda_main.CUDA_DEFAULT
    defs = dict(_server_defs(*cfg, rec, state_dtype=state_dtype), HAS_H_ROWS=int(h_rows))
    res = cuda_main.resources(defs, name="replay_gdn_pre")
    assert res["registers"] <= 64 and res["spill_stores"] == 0 and res["spill_loads"] == 0 and res["stack"] == 0, res
    assert cuda_main.resources(defs)["registers"] is not None  # (the main launch beside it: its own tests above)
    kda = _server_defs(*cuda_main.default_config(state_dtype, "kda"), rec, state_dtype=state_dtype, kind="kda")
    with pytest.raises(RuntimeError, match="no kernel 'replay_gdn_pre'"):
        cuda_main.resources(kda, name="replay_gdn_pre")
    if not h_rows:  # (KDA's predecayed keys take no caller-owned h)
        res = cuda_main.resources(kda, name=cuda_main.pre_name(kda))
        assert res["registers"] <= 72 and res["spill_stores"] == res["spill_loads"] == res["stack"] == 0, res


def test_pre_launch_refusals():
    """Where the CUDA pre launch cannot run, the reason names what it needs."""
    lay = ringmod.RingLayout.for_layer("gdn", L=16, H=1, HV=2, K=128, V=128)
    ring = lay.allocate(2)
    st = torch.zeros(2, 2, 128, 128)
    why = cuda_main.pre_unavailable_reason
    kda_lay = ringmod.RingLayout.for_layer("kda", L=16, H=2, HV=2, K=128, V=128)
    assert "predecayed key records" in why("kda", st, kda_lay.allocate(2), 128, 16)
    assert why("kda", st, kda_lay.allocate(2, kda_keys="predecayed"), 128, 16) == "it needs a CUDA GPU"
    assert "K = 128" in why("gdn", st, ring, 64, 16)
    assert "pre_rows 1" in why("gdn", st, ring, 128, 16, pre_rows=2)
    assert "at most 16" in why("gdn", st, ringmod.RingLayout.for_layer("gdn", L=32, H=1, HV=2, K=128,
                                                                      V=128).allocate(2), 128, 32)
    assert why("gdn", st, ring, 128, 16) == "it needs a CUDA GPU"
    # a read copy is no refusal since session 37 (the pre launch reads rc_valid, as Triton's)
    assert why("gdn", st, lay.allocate(2, read_dtype="bf16"), 128, 16) == "it needs a CUDA GPU"


def test_xl_refusals():
    """The eight-lanes-per-row layout (XL, GDN's default since session 34) is GDN's, reads the tile into registers with
    8 or 16 rows per warp, needs a ring capacity that is a multiple of 16 (what its GPU cases run), and its V-tiles
    times nch must divide V; nch needs XL."""
    st = torch.zeros(1, 2, 128, 128)
    gdn = lambda L: ringmod.RingLayout.for_layer("gdn", L=L, H=1, HV=2, K=128, V=128).allocate(1)  # noqa: E731
    why = lambda ring, cfg, kind="gdn": cuda_main.unavailable_reason(kind, st, ring, None, 128, 128,  # noqa: E731
                                                                     *cuda_main.full_config(cfg))
    assert "needs a CUDA GPU" in why(gdn(16), cuda_main.CUDA_DEFAULT)
    assert "multiple of 16" in why(gdn(8), cuda_main.CUDA_DEFAULT)
    assert "8 or 16 rows per warp" in why(gdn(16), (32, 4, 1, 0, 0, 0, 1, 1))
    assert "8 or 16 rows per warp" in why(gdn(16), (16, 4, 0, 0, 0, 0, 1, 1))
    assert "must divide V" in why(gdn(16), (16, 4, 1, 5, 0, 0, 1, 4))  # 16 x 4 x 4 = 256 rows
    assert "(xl) only" in why(gdn(16), (8, 4, 1, 6, 0, 0, 0, 2))
    kring = ringmod.RingLayout.for_layer("kda", L=16, H=2, HV=2, K=128, V=128).allocate(1, kda_keys="predecayed")
    assert "gt_pre" in why(kring, cuda_main.CUDA_DEFAULT, "kda")  # (GDN's default: no G_t from the pre launch)
    assert "needs a CUDA GPU" in why(kring, cuda_main.CUDA_CONFIGS["x16w4c1_m5_gp"], "kda")
    assert "gt_pre" in why(kring, (16, 4, 1, 5, 1, 1, 1, 1), "kda")  # (late coefficients)


@pytest.mark.parametrize("kind,state_dtype,read_dtype", [(k, s, r) for k in ("gdn", "kda")
                                                          for s, r in ((torch.float32, "same"),
                                                                       (torch.float32, "fp8_e4m3"),
                                                                       (torch.float32, "bf16"),
                                                                       (torch.bfloat16, "same"))])
def test_defaults_run_on_long_rings(kind, state_dtype, read_dtype, monkeypatch):
    """Every default shape runs on its ring, 16 records or more (--linear-replayssm-cache-len 32, 64): where the default
    reads the CUDA pre launch's tensor-core operand (rc_lean 2; that pre launch holds at most 16 records), folds on
    the tensor cores (MMA_FOLD, at most 16) or has no pre launch (SELF_PRE 2, at most 16), a longer ring takes
    LONG_RING_DEFAULT's shape, which needs none of them (until session 44 KDA's fp8 copy took its tensor-core shape
    there and its first step raised); the 16-record ring keeps the default. A tensor-core shape named for a long ring
    is not usable (its launch falls back to Triton's) and the log says why."""
    from replayssm_sglang import ring as ringmod

    monkeypatch.delenv(cuda_main.CONFIG_ENV[kind], raising=False)
    monkeypatch.setenv("REPLAYSSM_CUDA_EMULATE", "1")
    extra = dict(kda_keys="predecayed") if kind == "kda" else {}
    st = torch.zeros(2, 2, 128, 128, dtype=state_dtype)
    rc = {"same": None, "fp8_e4m3": torch.float8_e4m3fn, "bf16": torch.bfloat16}[read_dtype]
    for L in (16, 32, 64):
        ring = ringmod.RingLayout.for_layer(kind, L=L, H=2, HV=2, K=128, V=128).allocate(2, read_dtype=read_dtype,
                                                                                         **extra)
        cfg = cuda_main.launch_default_config(st, ring, kind)
        assert cfg == cuda_main.default_config(state_dtype, kind, rc, L)
        assert cuda_main.unavailable_reason(kind, st, ring, None, 128, 128, *cfg) is None, (L, cfg)  # (its operand too)
        if L == 16:
            assert cfg == cuda_main.default_config(state_dtype, kind, rc)
        else:
            assert not cuda_main.tensor_core_shape(cfg) and not any(cuda_main.full_config(cfg)[9:]), (L, cfg)
            short = cuda_main.default_config(state_dtype, kind, rc)
            if cuda_main.tensor_core_shape(short) or any(cuda_main.full_config(short)[9:]):  # (mma_fold, self_pre)
                sdt = torch.bfloat16 if state_dtype == torch.bfloat16 else torch.float32
                assert cfg == cuda_main.LONG_RING_DEFAULT[(kind, sdt)]
            else:
                assert cfg == short
    # the rule's cases today: the bf16 states' defaults and KDA's fp8 copy's take the tensor cores; GDN's fp32 default
    # has no pre launch (SELF_PRE 2 holds at most 16 records)
    if ((state_dtype, read_dtype) == (torch.bfloat16, "same") or (kind, read_dtype) == ("kda", "fp8_e4m3")
            or (kind, state_dtype, read_dtype) == ("gdn", torch.float32, "same")):
        assert cuda_main.default_config(state_dtype, kind, rc, 32) != cuda_main.default_config(state_dtype, kind, rc)
    # a tensor-core shape asked for a long ring: not usable here, and the reason names the pre launch's limit
    tc = "x16w4c1_m7_gp_lean_mma" if kind == "kda" else "x16w4c1_m8_lean_mma"
    if read_dtype != "same":
        ring = ringmod.RingLayout.for_layer(kind, L=32, H=2, HV=2, K=128, V=128).allocate(2, read_dtype=read_dtype,
                                                                                         **extra)
        why = cuda_main.unavailable_reason(kind, st, ring, None, 128, 128, *cuda_main.CUDA_CONFIGS[tc])
        assert why is not None and "pre launch" in why and "16" in why
        assert not cuda_main.usable(kind, st, ring, None, 128, 128, cuda_main.CUDA_CONFIGS[tc])
        monkeypatch.setenv(cuda_main.CONFIG_ENV[kind], tc)  # (the environment names it: the server's log line)
        monkeypatch.setenv("REPLAYSSM_MAIN_IMPL", "auto")
        note = cuda_main.preference_note(kind, st, ring, 128, 128)
        assert note.startswith("Triton (the CUDA one: its tensor-core operand") and "at most 16" in note, note


def test_pre_build_config_takes_a_shape_with_a_plain_pre_launch():
    """The build that holds the CUDA pre launch beside Triton's main launch: the default shape where its pre launch is
    plain, else LONG_RING_DEFAULT's (no SELF_PRE 2, no tensor-core operand)."""
    f32, bf16 = torch.float32, torch.bfloat16
    assert cuda_main.pre_build_config(cuda_main.CUDA_DEFAULT_FP32_GDN, "gdn", f32) == cuda_main.CUDA_DEFAULT
    assert cuda_main.pre_build_config(cuda_main.CUDA_DEFAULT_BF16, "gdn", bf16) == cuda_main.CUDA_CONFIGS["x16w4c1_m6"]
    kda_fp8 = cuda_main.default_config(f32, "kda", torch.float8_e4m3fn)
    assert cuda_main.tensor_core_shape(kda_fp8)
    assert cuda_main.pre_build_config(kda_fp8, "kda", f32) == cuda_main.CUDA_DEFAULT_KDA
    for cfg, kind, sdt in ((cuda_main.CUDA_DEFAULT_KDA, "kda", f32), (cuda_main.CUDA_DEFAULT, "gdn", f32),
                           (cuda_main.CUDA_DEFAULT_KDA_BF16, "kda", bf16)):
        assert cuda_main.pre_build_config(cfg, kind, sdt) == cfg  # (plain pre launches: the shape itself)


def test_env_config_picks_the_default_shape_per_kind(monkeypatch):
    """REPLAYSSM_CUDA_CONFIG_GDN / _KDA name the shape a launch takes when it asks for none (the server's launches), for
    one kind only; unset, the defaults by kind and state type; an unknown name is refused with the names."""
    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_GDN", raising=False)
    monkeypatch.delenv("REPLAYSSM_CUDA_CONFIG_KDA", raising=False)
    assert cuda_main.default_config(torch.float32, "kda") == cuda_main.CUDA_DEFAULT_KDA
    assert cuda_main.default_config(torch.bfloat16, "kda") == cuda_main.CUDA_DEFAULT_KDA_BF16
    monkeypatch.setenv("REPLAYSSM_CUDA_CONFIG_KDA", "x16w4c1_m5_gp")
    for dt in (torch.float32, torch.bfloat16):
        assert cuda_main.default_config(dt, "kda") == cuda_main.CUDA_CONFIGS["x16w4c1_m5_gp"]
        assert cuda_main.asked_config(None, dt, "kda") == cuda_main.CUDA_CONFIGS["x16w4c1_m5_gp"]
        assert cuda_main.asked_config("g8w4_gp", dt, "kda") == cuda_main.CUDA_CONFIGS["g8w4_gp"]  # asked wins
    assert cuda_main.default_config(torch.float32, "gdn") == cuda_main.CUDA_DEFAULT_FP32_GDN  # (the other kind's)
    monkeypatch.setenv("REPLAYSSM_CUDA_CONFIG_KDA", "x16w4c1_m5_gpx")
    with pytest.raises(ValueError, match="REPLAYSSM_CUDA_CONFIG_KDA='x16w4c1_m5_gpx'.*x16w4c1_m5_gp"):
        cuda_main.default_config(torch.float32, "kda")


# the served shapes (both kinds, both state types) and the XL ones: none may read what the pre launch writes (coef,
# scal, ovf, gts) before its PDL wait (session 35: with those pointers __restrict__, nvcc scheduled such loads above
# griddepcontrol.wait in three XL builds; the GPU's float64 cases, launched one by one, could not see it)
PDL_CASES = [("x16w4c1_m5", "gdn", torch.float32), ("x16w4c1_m6", "gdn", torch.bfloat16),
             ("g8w4", "gdn", torch.float32), ("g8w4_m8_late", "gdn", torch.bfloat16),
             ("g8w4_gp", "kda", torch.float32), ("g8w4_m7_gp", "kda", torch.bfloat16),
             ("x16w4c1_m5_gp", "kda", torch.float32), ("x16w4c1_m6_gp", "kda", torch.bfloat16),
             ("x16w4c1_m4_gp", "kda", torch.float32),
             # ST_MMA (session 42): the tensor-core operand (in gts's parameter) read after the wait
             ("x16w4c1_m7_mma", "gdn", torch.bfloat16), ("x16w4c1_m8_mma", "gdn", torch.bfloat16),
             ("x16w4c1_m6_gp_mma", "kda", torch.bfloat16), ("x16w4c1_m7_gp_mma", "kda", torch.bfloat16),
             # MMA_FOLD (session 43): its fold reads G_t (gts) after the wait
             ("x16w4c1_m8_mma_mf", "gdn", torch.bfloat16), ("x16w4c1_m7_gp_mma_mf", "kda", torch.bfloat16),
             ("x16w4c1_m5_mf", "gdn", torch.float32), ("x16w4c1_m4_gp_mf", "kda", torch.float32)]


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("name,kind,state_dtype", PDL_CASES, ids=str)
def test_pre_outputs_read_after_the_wait(name, kind, state_dtype):
    """In the SASS (sm_90, the server's arguments, PDL on), no global load before the PDL wait takes its address from
    the pre launch's outputs."""
    d = _server_defs(*cuda_main.CUDA_CONFIGS[name], torch.float32, state_dtype=state_dtype, kind=kind)
    assert cuda_main.pdl_hazards(d) == []


# the read copy's builds (issue 7; the server's since session 37), the rc_lean shapes among them (session 40)
PDL_RC_CASES = [("x16w4c1_m5", "gdn", torch.float8_e4m3fn), ("x16w4c1_m5", "gdn", torch.bfloat16),
                ("x16w4c1_m7_lean", "gdn", torch.float8_e4m3fn), ("x16w4c1_m6_lean", "gdn", torch.bfloat16),
                ("x16w4c1_m4_gp", "kda", torch.float8_e4m3fn), ("x16w4c1_m6_gp_lean", "kda", torch.float8_e4m3fn),
                # RC_MMA (session 41): the tensor-core operand (in gts's parameter) read after the wait too
                ("x16w4c1_m7_lean_mma", "gdn", torch.float8_e4m3fn),
                ("x16w4c1_m8_lean_mma", "gdn", torch.float8_e4m3fn),
                ("x16w4c1_m6_lean_mma", "gdn", torch.bfloat16),
                ("x16w4c1_m6_gp_lean_mma", "kda", torch.float8_e4m3fn), ("x16w4c1_m7_gp_lean_mma", "kda", torch.bfloat16),
                # MMA_FOLD (session 43)
                ("x16w4c1_m7_lean_mf", "gdn", torch.float8_e4m3fn), ("x16w4c1_m7_gp_lean_mma_mf", "kda",
                                                                     torch.float8_e4m3fn)]


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("name,kind,rc_dtype", PDL_RC_CASES, ids=str)
def test_pre_outputs_read_after_the_wait_read_copy(name, kind, rc_dtype):
    d = _server_defs(*cuda_main.CUDA_CONFIGS[name], torch.float32, kind=kind, rc_dtype=rc_dtype)
    assert cuda_main.pdl_hazards(d) == []


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("name,kind", [("x16w4c1_m7_lean", "gdn"), ("x16w4c1_m7_gp_lean_mma", "kda")])
def test_flush_first_order_read_after_the_wait(name, kind):
    """FLUSH_FIRST (session 59): the fp8 copies' defaults read the pre launch's row order only after the PDL wait
    (its parameter, the last, is in pdl_hazards' list), and read it at all (the parameter is in the SASS)."""
    d = _server_defs(*cuda_main.CUDA_CONFIGS[name], torch.float32, kind=kind, rc_dtype=torch.float8_e4m3fn)
    d = dict(d, FLUSH_FIRST=1, FF_FROM=16)
    assert cuda_main.pdl_hazards(d) == []
    assert any("c[0x0][0x308]" in ln for ln in cuda_main.main_sass(dict(d, USE_PDL=1)))


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
def test_pdl_hazards_finds_the_session_35_bug(monkeypatch, tmp_path):
    """The check can fail: with the pre launch's outputs taken __restrict__ again (as before the fix), KDA's XL build
    loads G_t (gts) and the row's overflow flag before the wait, and pdl_hazards names those loads."""
    src = cuda_main.SRC.read_text()
    old = "    const float* coef, const float* scal, const int* ovf,\n    const float* gts, float scale,"
    assert src.count(old) == 2
    bad = tmp_path / "gdn_main.cu"
    bad.write_text(src.replace(old, "    const float* __restrict__ coef, const float* __restrict__ scal, "
                                    "const int* __restrict__ ovf,\n    const float* __restrict__ gts, float scale,"))
    monkeypatch.setattr(cuda_main, "SRC", bad)
    d = _server_defs(*cuda_main.CUDA_CONFIGS["x16w4c1_m5_gp"], torch.float32, kind="kda")
    found = cuda_main.pdl_hazards(d)
    assert len(found) >= 4 and all(ln.startswith("LDG") for ln in found), found


def test_sass_main_paths_still_finds_the_copy_path():
    """scripts/sass_main_paths.py fixes a read-copy block's row flags by replacing two lines of gdn_main.cu: each must
    still be there exactly once (else its counts would be of the whole kernel, or it stops with why)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    sys.path.insert(0, str(root / "scripts"))
    import sass_main_paths

    src = (root / "kernels" / "gdn_main.cu").read_text()
    for old, _ in sass_main_paths.COPY_PATH + sass_main_paths.KDA_PATH:
        assert src.count(old) == 1, old
    # --dead-padding's branch too (its replacement must leave a source that still has the rest of the branch)
    assert src.count(sass_main_paths.PADDED_ROW) == 1
    import tempfile

    with tempfile.TemporaryDirectory() as td:
        out = sass_main_paths.copy_path_source(Path(td), "copy", dead_padding=True).read_text()
    mark = "if (slot < 0) {  // a padded row: zero output"  # (the other launch keeps its own)
    assert "if (false) {  // a padded row" in out and out.count(mark) == src.count(mark) - 1


def test_defines_trigger_post_only_where_set():
    """TRIGGER_POST (session 48) is in a build's defines only where asked: the builds without it keep the defines,
    and so the cubins' keys, they had before it existed."""
    cfg = cuda_main.CUDA_DEFAULT_FP32_GDN
    d0 = cuda_main.server_defines(cfg)
    args = dict(H=16, HV=32, V=128, cap=16, BC=16, rpw=16, nwarps=4, load_reg=1, xl=1, has_h_rows=False,
                has_forced=True, has_ring_idx=True, pdl=True, x_dtype=torch.bfloat16, a_dtype=torch.bfloat16,
                b_dtype=torch.bfloat16, alog_dtype=torch.float32, dtb_dtype=torch.float32, out_dtype=torch.bfloat16,
                u_dtype=torch.float32, k_dtype=torch.float32, slot_dtype=torch.int32, forced_dtype=torch.int32,
                ridx_dtype=torch.int64)
    assert "TRIGGER_POST" not in d0 and "TRIGGER_POST" not in cuda_main.defines(**args)
    assert cuda_main.defines(**args, trigger_post=True)["TRIGGER_POST"] == 1
    assert {k: v for k, v in cuda_main.defines(**args, trigger_post=True).items() if k != "TRIGGER_POST"} == \
        cuda_main.defines(**args)


@pytest.mark.parametrize("env,want", [("", None), ("0", False), ("1", True), (" 1 ", True)])
def test_env_post_trigger(env, want, monkeypatch):
    """REPLAYSSM_POST_TRIGGER: 0 or 1, unset or empty the default (POST_TRIGGER_DEFAULT); anything else names the
    values."""
    monkeypatch.setenv("REPLAYSSM_POST_TRIGGER", env)
    assert cuda_main.env_post_trigger() == (cuda_main.POST_TRIGGER_DEFAULT if want is None else want)
    monkeypatch.setenv("REPLAYSSM_POST_TRIGGER", "yes")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        cuda_main.env_post_trigger()


def test_post_trigger_applies(monkeypatch):
    """The early trigger goes into the main launch's build only where a post launch follows it as its programmatic
    dependent: PDL on, a post launch (advance_h or may_prefold), a step that runs it; the caller's choice over the
    environment's."""
    from replayssm_sglang.kernels.decode_v3 import post_trigger_applies as f

    monkeypatch.setenv("REPLAYSSM_POST_TRIGGER", "1")
    assert f(None, True, True, True) and f(True, True, False, True) and f(True, True, True, False)
    assert f(True, True, True, True, "main+post") and f(True, True, True, True, "nofold")
    assert not f(False, True, True, True)  # (the caller's no over the environment's yes)
    assert not f(True, False, True, True)  # no PDL: the post launch is an ordinary launch
    assert not f(True, True, False, False)  # no post launch
    assert not f(True, True, True, True, "pre+main") and not f(True, True, True, True, "main")
    monkeypatch.setenv("REPLAYSSM_POST_TRIGGER", "0")
    assert not f(None, True, True, True) and f(True, True, True, True)


TRIGGER_CASES = [("x16w4c1_m4_sp2", "gdn", torch.float32, None), ("x16w4c1_m7_mma_mf", "gdn", torch.bfloat16, None),
                 ("x16w4c1_m4_gp", "kda", torch.float32, None), ("x16w4c1_m7_lean", "gdn", torch.float32,
                                                                  torch.float8_e4m3fn)]


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("name,kind,state_dtype,rc_dtype", TRIGGER_CASES, ids=str)
def test_trigger_post_first_in_sass(name, kind, state_dtype, rc_dtype):
    """In the SASS (sm_90, the server's arguments), a TRIGGER_POST build's main launch triggers its dependents
    (PREEXIT) once, before any global load, PDL wait or barrier, and costs no register; a build without it has none."""
    d = cuda_main.server_defines(cuda_main.CUDA_CONFIGS[name], rec_dtype=state_dtype, state_dtype=state_dtype,
                                 kind=kind, rc_dtype=rc_dtype)
    assert "TRIGGER_POST" not in d
    with_t = cuda_main.main_sass(dict(d, TRIGGER_POST=1))
    at = [i for i, ln in enumerate(with_t) if ln.startswith("PREEXIT")]
    assert len(at) == 1, at
    assert not any(ln.startswith(("LDG", "ACQBULK", "BAR", "LDS", "UBLKCP")) for ln in with_t[:at[0]]), with_t[:at[0]]
    assert not any(ln.startswith("PREEXIT") for ln in cuda_main.main_sass(d))
    assert cuda_main.resources(dict(d, TRIGGER_POST=1))["registers"] == cuda_main.resources(d)["registers"]


def test_env_pdl_refuses_other_values(monkeypatch):
    """REPLAYSSM_PDL (a measurement's override of V3_TUNED's PDL choice, session 48) takes 0 or 1; anything else stops
    the launch naming the values."""
    from replayssm_sglang.kernels import decode

    monkeypatch.setenv("REPLAYSSM_PDL", "on")
    H, HV, K, V = 1, 2, 128, 128
    ring = ringmod.RingLayout.for_layer("gdn", L=16, H=H, HV=HV, K=K, V=V).allocate(2)
    x = R.random_decode_inputs("gdn", 2, H, HV, K, V, generator=torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="REPLAYSSM_PDL must be 0 or 1"):
        decode.replay_decode("gdn", *x, torch.zeros(2, HV, V, K), ring, torch.arange(2, dtype=torch.int32), L=16,
                             impl="v3")


def test_tuned_pdl(monkeypatch):
    """The tuned launches' PDL: the fp8 copies' from 33 rows (pdl_min_rows, session 48), the launches without a copy
    always, the bf16 copy of KDA never (its entry has none); REPLAYSSM_PDL overrides every one."""
    from replayssm_sglang.kernels import decode_v3

    monkeypatch.delenv("REPLAYSSM_PDL", raising=False)
    fp8 = decode_v3.V3_TUNED[("gdn", 4, torch.float8_e4m3fn)]
    assert [decode_v3.tuned_pdl(fp8, B) for B in (1, 32, 33, 256)] == [False, False, True, True]
    assert decode_v3.tuned_pdl(decode_v3.V3_TUNED[("kda", 4, torch.float8_e4m3fn)], 64)
    assert decode_v3.tuned_pdl(decode_v3.V3_TUNED[("gdn", 4, None)], 1)
    assert not decode_v3.tuned_pdl(decode_v3.V3_TUNED[("kda", 4, torch.bfloat16)], 256)
    monkeypatch.setenv("REPLAYSSM_PDL", "0")
    assert not decode_v3.tuned_pdl(fp8, 256) and not decode_v3.tuned_pdl(decode_v3.V3_TUNED[("gdn", 4, None)], 1)
    monkeypatch.setenv("REPLAYSSM_PDL", "1")
    assert decode_v3.tuned_pdl(fp8, 1)


@pytest.mark.parametrize("env,want", [("", None), ("0", False), ("1", True)])
def test_env_lead_pdl(env, want, monkeypatch):
    """REPLAYSSM_LEAD_PDL: 0 or 1, unset or empty the default (LEAD_PDL_DEFAULT); anything else names the values."""
    monkeypatch.setenv("REPLAYSSM_LEAD_PDL", env)
    assert cuda_main.env_lead_pdl() == (cuda_main.LEAD_PDL_DEFAULT if want is None else want)
    monkeypatch.setenv("REPLAYSSM_LEAD_PDL", "on")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        cuda_main.env_lead_pdl()


def test_lead_pre_launch_needs_a_waiting_build():
    """A pre launch made a programmatic dependent of the kernel before it must come from a build that waits for that
    kernel first (LEAD_PDL): cuda_main.pre_launch refuses otherwise, before it touches anything."""
    d = cuda_main.server_defines(cuda_main.CUDA_DEFAULT_BF16, rec_dtype=torch.bfloat16, state_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="LEAD_PDL build"):
        cuda_main.pre_launch(defs=d, mixed_qkv=None, a2=None, A_log=None, dt_bias=None, ring=None, h_rows=None,
                             slot_idx=None, forced=None, ring_idx=None, coef=None, scal=None, scale=1.0,
                             lower_bound=None, L=16, B=1, lead=True)


LEAD_CASES = [("x16w4c1_m4_sp2", "gdn", torch.float32, None, "replay_gdn_main"),
              ("x16w4c1_m7_mma_mf", "gdn", torch.bfloat16, None, "replay_gdn_pre"),
              ("x16w4c1_m4_gp", "kda", torch.float32, None, "replay_kda_pre"),
              ("x16w4c1_m7_lean", "gdn", torch.float32, torch.float8_e4m3fn, "replay_gdn_pre")]


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("name,kind,state_dtype,rc_dtype,kernel", LEAD_CASES, ids=str)
def test_lead_wait_first_in_sass(name, kind, state_dtype, rc_dtype, kernel):
    """A LEAD_PDL build's first launch of the step (the pre launch, or the main launch without one) waits for the
    kernel before it (ACQBULK) before any global load and before it lets its own dependent start (PREEXIT): the main
    launch's loads ahead of its wait read what that kernel wrote. Without LEAD_PDL there is no wait ahead of them."""
    d = cuda_main.server_defines(cuda_main.CUDA_CONFIGS[name], rec_dtype=state_dtype, state_dtype=state_dtype,
                                 kind=kind, rc_dtype=rc_dtype)
    d = dict(d, TRIGGER_POST=1)
    ins = cuda_main.main_sass(dict(d, LEAD_PDL=1), name=kernel)
    first = next(i for i, ln in enumerate(ins) if ln.startswith(("LDG", "ACQBULK", "PREEXIT", "LDS", "UBLKCP")))
    assert ins[first].startswith("ACQBULK"), ins[:first + 1]
    assert any(ln.startswith("PREEXIT") for ln in ins[first:])  # (the trigger, after the wait)
    plain = cuda_main.main_sass(d, name=kernel)
    first = next(i for i, ln in enumerate(plain) if ln.startswith(("LDG", "ACQBULK", "PREEXIT")))
    assert not plain[first].startswith("ACQBULK")


# (shape, kind): the bf16 states' pre launches, GDN's ST_MMA default (its tensor-core operand's stores), KDA's H100
# default and its H200 one
PRE_EARLY_SASS_CASES = [("x16w4c1_m7_mma_mf", "gdn"), ("x16w4c1_m6_gp_mf", "kda"), ("x16w4c1_m8_gp_mma_mf", "kda")]


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("name,kind", PRE_EARLY_SASS_CASES, ids=str)
def test_pre_early_loads_in_sass(name, kind):
    """In the SASS (sm_90, the server's arguments, bf16 records), a PRE_EARLY build's pre launch loads the 16 key
    records as one 8-byte load each and issues every load before its first store (the tensor-core operand's, the
    token's record), with no spill; the build without it loads each record's columns one by one (64 loads), some
    of them after a store."""
    d = cuda_main.server_defines(cuda_main.CUDA_CONFIGS[name], rec_dtype=torch.bfloat16, state_dtype=torch.bfloat16,
                                 kind=kind)
    fn = cuda_main.pre_name(d)
    assert d.get("PRE_EARLY") == 1  # (the default since session 49)
    d = {k: v for k, v in d.items() if k != "PRE_EARLY"}
    for early in (True, False):
        defs = dict(d, PRE_EARLY=1) if early else d
        sass = cuda_main.main_sass(defs, name=fn)
        loads = [i for i, ln in enumerate(sass) if ln.startswith("LDG")]
        first_store = next(i for i, ln in enumerate(sass) if ln.startswith("STG"))
        rec64 = [i for i in loads if sass[i].startswith("LDG.E.64 ")]  # (the records: not .CONSTANT, 8 bytes)
        if early:
            assert len(rec64) == 16 and max(loads) < first_store, (len(rec64), max(loads), first_store)
            res = cuda_main.resources(defs, name=fn)
            assert res["spill_stores"] == 0 and res["spill_loads"] == 0, res
        else:
            assert not rec64 and max(loads) > first_store and len(loads) >= 64 + 8, (len(loads), first_store)



@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("name,kind,rc_dtype", [("x16w4c1_m7_gp_lean_mma", "kda", torch.float8_e4m3fn),
                                                ("x16w4c1_m4_gp", "kda", None),
                                                ("x16w4c1_m7_lean", "gdn", torch.float8_e4m3fn)], ids=str)
def test_pre_early_f32_loads_in_sass(name, kind, rc_dtype):
    """PRE_EARLY level 2 in the SASS (sm_90, the server's arguments, fp32 records): the pre launch issues the first
    PRE_EARLY_F32_RECORDS key records (16-byte loads) within its first loads, ahead of any store (KDA: level 1 loads
    every record only after the token's record is stored), at the same register count and without a spill."""
    d = cuda_main.server_defines(cuda_main.CUDA_CONFIGS[name], rec_dtype=torch.float32, state_dtype=torch.float32,
                                 kind=kind, rc_dtype=rc_dtype)
    fn = cuda_main.pre_name(d)
    n = cuda_main.PRE_EARLY_F32_RECORDS[kind]
    got = {}
    for level in (1, 2):
        defs = {k: v for k, v in d.items() if k not in ("PRE_EARLY", "PRE_EARLY_F32")}
        defs |= cuda_main.pre_early_defines(level, kind, torch.float32)
        assert defs.get("PRE_EARLY_F32") == (n if level == 2 else None)
        sass = cuda_main.main_sass(defs, name=fn)
        first_store = next(i for i, ln in enumerate(sass) if ln.startswith("STG"))
        # (16-byte loads that are not .CONSTANT: the records and, for KDA, G_{h-1}; q and k are .CONSTANT)
        got[level] = sum(ln.startswith("LDG.E.128 ") for ln in sass[:first_store])
        res = cuda_main.resources(defs, name=fn)
        assert res["spill_stores"] == 0 and res["spill_loads"] == 0, (level, res)
        got[level, "regs"] = res["registers"]
    assert got[2] >= n and got[2] >= got[1] + (n if kind == "kda" else 0), got
    assert got[2, "regs"] <= max(64, got[1, "regs"]), got


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("name,kind,state_dtype,rc_dtype", [("x16w4c1_m7_mma_mf", "gdn", torch.bfloat16, None),
                                                            ("x16w4c1_m7_lean", "gdn", torch.float32,
                                                             torch.float8_e4m3fn),
                                                            ("x16w4c1_m6_gp_mf", "kda", torch.bfloat16, None)], ids=str)
def test_pre_pf_prefetch_in_sass(name, kind, state_dtype, rc_dtype):
    """A PRE_PF build's pre launch issues one L2 bulk prefetch (UBLKPF.L2), after the ring row's h is loaded (the
    tile it picks depends on the row's rule), at the same registers and without spills; a build without it none."""
    d = cuda_main.server_defines(cuda_main.CUDA_CONFIGS[name], rec_dtype=state_dtype, state_dtype=state_dtype,
                                 kind=kind, rc_dtype=rc_dtype)
    assert "PRE_PF" not in d
    fn = cuda_main.pre_name(d)
    with_pf = cuda_main.main_sass(dict(d, PRE_PF=16), name=fn)
    at = [i for i, ln in enumerate(with_pf) if ln.startswith("UBLKPF.L2")]
    loads = [i for i, ln in enumerate(with_pf) if ln.startswith("LDG")]
    assert len(at) == 1 and len(loads) >= 3 and at[0] > loads[2], (at, loads[:4])  # (slot, ring row, then h)
    assert not any(ln.startswith("UBLKPF") for ln in cuda_main.main_sass(d, name=fn))
    res = cuda_main.resources(dict(d, PRE_PF=16), name=fn)
    assert res["spill_stores"] == 0 and res["registers"] <= cuda_main.resources(d, name=fn)["registers"], res


def test_env_and_levels_of_pre_early(monkeypatch):
    """REPLAYSSM_PRE_EARLY takes 0, 1 or 2 (unset: PRE_EARLY_DEFAULT), anything else stops naming the values; a
    level's defines: 2 adds PRE_EARLY_F32 only with fp32 key records, nothing under self_pre (no pre launch)."""
    monkeypatch.delenv("REPLAYSSM_PRE_EARLY", raising=False)
    assert cuda_main.env_pre_early() == int(cuda_main.PRE_EARLY_DEFAULT)
    for v in ("0", "1", "2"):
        monkeypatch.setenv("REPLAYSSM_PRE_EARLY", v)
        assert cuda_main.env_pre_early() == int(v)
    monkeypatch.setenv("REPLAYSSM_PRE_EARLY", "3")
    with pytest.raises(ValueError, match="REPLAYSSM_PRE_EARLY must be 0, 1 or 2"):
        cuda_main.env_pre_early()
    f32, bf16 = torch.float32, torch.bfloat16
    assert cuda_main.pre_early_defines(0, "kda", f32) == {} == cuda_main.pre_early_defines(2, "kda", f32, True)
    assert cuda_main.pre_early_defines(1, "kda", f32) == {"PRE_EARLY": 1} == cuda_main.pre_early_defines(2, "gdn", bf16)
    for kind in ("gdn", "kda"):
        assert cuda_main.pre_early_defines(2, kind, f32) == {"PRE_EARLY": 1,
                                                             "PRE_EARLY_F32": cuda_main.PRE_EARLY_F32_RECORDS[kind]}
    with pytest.raises(ValueError, match="pre_early must be 0, 1 or 2"):
        cuda_main.pre_early_defines(3, "gdn", f32)


def test_env_pre_pf(monkeypatch):
    """REPLAYSSM_PRE_PF takes a row count (0: none); unset, PRE_PF_DEFAULT; anything else stops naming the values."""
    monkeypatch.delenv("REPLAYSSM_PRE_PF", raising=False)
    assert cuda_main.env_pre_pf() == cuda_main.PRE_PF_DEFAULT
    monkeypatch.setenv("REPLAYSSM_PRE_PF", "16")
    assert cuda_main.env_pre_pf() == 16
    monkeypatch.setenv("REPLAYSSM_PRE_PF", "yes")
    with pytest.raises(ValueError, match="REPLAYSSM_PRE_PF must be a row count"):
        cuda_main.env_pre_pf()


# ----- TILE_EARLY (session 54): under PDL the XL tile's words are plain loads, which ptxas keeps above the wait -----

def test_tile_early_only_where_it_changes_the_build(monkeypatch):
    """TILE_EARLY is set only for an XL build under PDL (without PDL or under SELF_PRE there is no wait to keep the
    loads above; the other builds keep their cubin keys); REPLAYSSM_TILE_EARLY picks it, anything but 0 / 1 refused."""
    xl = cuda_main.CUDA_CONFIGS["x16w4c1_m6_gp_mf"]
    kw = dict(state_dtype=torch.bfloat16, kind="kda", rec_dtype=torch.bfloat16)
    assert cuda_main.server_defines(xl, **kw, tile_early=1)["TILE_EARLY"] == 1
    assert "TILE_EARLY" not in cuda_main.server_defines(xl, **kw, tile_early=0)
    assert cuda_main.tile_early_defines(1, xl=1, pdl=False) == {}
    assert cuda_main.tile_early_defines(1, xl=0, pdl=True) == {}
    sp2 = cuda_main.CUDA_CONFIGS["x16w4c1_m4_sp2"]  # (GDN's fp32 default: SELF_PRE 2, no pre launch, no PDL wait)
    assert "TILE_EARLY" not in cuda_main.server_defines(sp2, tile_early=1)
    with pytest.raises(ValueError):
        cuda_main.tile_early_defines(2, xl=1, pdl=True)
    monkeypatch.setenv("REPLAYSSM_TILE_EARLY", "1")
    assert cuda_main.env_tile_early() == 1
    monkeypatch.setenv("REPLAYSSM_TILE_EARLY", "")
    assert cuda_main.env_tile_early() == cuda_main.TILE_EARLY_DEFAULT
    monkeypatch.setenv("REPLAYSSM_TILE_EARLY", "yes")
    with pytest.raises(ValueError):
        cuda_main.env_tile_early()


def _pdl_default_shapes():
    """Every GPU's default shape that runs under PDL (a pre launch), as (name, kind, state type, read copy type)."""
    out = {}
    for kind in ("gdn", "kda"):
        for sdt in (torch.float32, torch.bfloat16):
            for rcd in (None, torch.float8_e4m3fn, torch.bfloat16) if sdt == torch.float32 else (None,):
                if kind == "kda" and rcd == torch.bfloat16:
                    continue
                for g in (None, *cuda_main.DEVICE_DEFAULTS):
                    cfg = cuda_main.default_config(sdt, kind, rcd, device_name=g)
                    if not cuda_main.full_config(cfg)[10]:  # (SELF_PRE: no pre launch to wait for)
                        out[(cuda_main.config_name(cfg), kind, sdt, rcd)] = None
    return list(out)


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("name,kind,state_dtype,rc_dtype", _pdl_default_shapes(), ids=str)
def test_tile_early_keeps_the_tile_above_the_wait(name, kind, state_dtype, rc_dtype):
    """With TILE_EARLY every 16- / 8-byte load the PTX issues before the PDL wait is still above it in the SASS (so a
    main block that starts while the pre launch runs holds its tile), and none of them reads what the pre launch
    writes (pdl_hazards)."""
    rec = torch.bfloat16 if state_dtype == torch.bfloat16 else torch.float32
    d = cuda_main.server_defines(cuda_main.CUDA_CONFIGS[name], rec_dtype=rec, state_dtype=state_dtype, kind=kind,
                                 rc_dtype=rc_dtype, tile_early=1)
    assert d["TILE_EARLY"] == 1
    ptx, sass = cuda_main.tile_loads_before_wait(d)
    assert ptx >= 4 and sass >= ptx, (ptx, sass)
    assert cuda_main.pdl_hazards(d) == []


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
def test_tile_loads_before_wait_sees_ptxas_move_them():
    """The check can fail: without TILE_EARLY, KDA's bf16 default on the H100 (x16w4c1_m6_gp_mf) issues its tile's 8
    loads before the wait in the PTX, and ptxas moves all but one of them below it (nvcc 13.0, sm_90)."""
    d = cuda_main.server_defines(cuda_main.CUDA_CONFIGS["x16w4c1_m6_gp_mf"], rec_dtype=torch.bfloat16,
                                 state_dtype=torch.bfloat16, kind="kda", tile_early=0)
    assert "TILE_EARLY" not in d
    ptx, sass = cuda_main.tile_loads_before_wait(d)
    assert ptx >= 8 and sass < ptx, (ptx, sass)


@pytest.mark.skipif(cuda_main.find_nvcc() is None or cuda_main.find_nvdisasm() is None,
                    reason="no nvcc / nvdisasm (scripts/setup-nvcc; Triton's wheel carries nvdisasm)")
@pytest.mark.parametrize("kind,shape", [("kda", "x16w4c1_m6_gp_mf"), ("gdn", "x16w4c1_m7_mma_mf"),
                                        ("kda", "x16w4c1_m8_gp_mma_mf")], ids=str)
def test_vec_u2_issues_the_record_loads_with_no_branch(kind, shape):
    """VEC_U 2 (session 55): the bf16 states' default shapes (H100 and H200) issue a lane's two vector loads of value
    records before the PDL wait, neither inside a branch's region. At VEC_U 1 KDA's H100 default put both in
    branches (nvcc 13.0, sm_90): the finding the level exists for, kept here so that the check can fail."""
    bf16 = torch.bfloat16
    d2 = cuda_main.server_defines(cuda_main.CUDA_CONFIGS[shape], rec_dtype=bf16, state_dtype=bf16, kind=kind, vec_u=2)
    assert d2.get("VEC_U") == 2
    assert cuda_main.branched_loads_before_wait(d2) == (2, 0)
    if shape == "x16w4c1_m6_gp_mf":
        d1 = cuda_main.server_defines(cuda_main.CUDA_CONFIGS[shape], rec_dtype=bf16, state_dtype=bf16, kind=kind,
                                      vec_u=1)
        assert cuda_main.branched_loads_before_wait(d1) == (2, 2)


def test_vec_u_default_is_gdn_with_bf16_records(monkeypatch):
    """VEC_U where none is asked (session 54's measurement): GDN with bf16 value records at 16 rows per warp only;
    KDA's bf16 records (slower with it), fp32 records and split records' bf16 high plane keep the element loads;
    REPLAYSSM_VEC_U and an explicit vec_u win over the default."""
    bf16, f32 = torch.bfloat16, torch.float32
    gdn = cuda_main.default_config(bf16, "gdn")
    kda = cuda_main.default_config(bf16, "kda")
    assert cuda_main.server_defines(gdn, rec_dtype=bf16, state_dtype=bf16, kind="gdn").get("VEC_U") == 1
    assert "VEC_U" not in cuda_main.server_defines(gdn, rec_dtype=bf16, state_dtype=bf16, kind="gdn", vec_u=0)
    assert "VEC_U" not in cuda_main.server_defines(kda, rec_dtype=bf16, state_dtype=bf16, kind="kda")
    assert "VEC_U" not in cuda_main.server_defines(cuda_main.CUDA_CONFIGS["x16w4c1_m5"], rec_dtype=f32)
    fp8 = cuda_main.default_config(f32, "gdn", torch.float8_e4m3fn)
    assert "VEC_U" not in cuda_main.server_defines(fp8, rc_dtype=torch.float8_e4m3fn, rec_split=True)
    assert cuda_main.vec_u_default("gdn", bf16) == 1 and cuda_main.vec_u_default("gdn", bf16, rec_split=True) == 0
    assert cuda_main.vec_u_default("kda", bf16) == 0 and cuda_main.vec_u_default("gdn", f32) == 0
    # (16 rows per warp, every GDN default's layout: an 8-row shape spills more with it and keeps the element loads)
    assert cuda_main.vec_u_default("gdn", bf16, rpw=8) == 0
    assert "VEC_U" not in cuda_main.server_defines(cuda_main.CUDA_CONFIGS["x8w4c4_m6_late"], rec_dtype=bf16,
                                                   state_dtype=bf16, kind="gdn")
    monkeypatch.delenv("REPLAYSSM_VEC_U", raising=False)
    assert cuda_main.env_vec_u() is None
    monkeypatch.setenv("REPLAYSSM_VEC_U", "0")
    assert cuda_main.env_vec_u() == 0
    monkeypatch.setenv("REPLAYSSM_VEC_U", "2")  # (session 55: the vector loads with no branch)
    assert cuda_main.env_vec_u() == 2
    assert cuda_main.server_defines(kda, rec_dtype=bf16, state_dtype=bf16, kind="kda", vec_u=2).get("VEC_U") == 2
    monkeypatch.setenv("REPLAYSSM_VEC_U", "3")
    with pytest.raises(ValueError, match="REPLAYSSM_VEC_U must be 0, 1 or 2"):
        cuda_main.env_vec_u()
    with pytest.raises(ValueError, match="vec_u must be one of"):
        cuda_main.server_defines(kda, rec_dtype=bf16, state_dtype=bf16, kind="kda", vec_u=3)

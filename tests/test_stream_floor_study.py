"""scripts/stream_floor_study.py: its kernels compute the item maths they claim, under Triton's interpreter.

The study's GPU numbers (per-tile against persistent programs) only mean something if every arm computes the same
thing: each arm here runs on a fresh small problem (bf16 or fp8 tiles, a padded row, ring rows permuted, h random)
against the float64 reference written from the module docstring, with NaN-poisoned outputs; the persistent arms
with a program count that does not divide the items, so the walk's tail and its prefetches past the end are covered.
"""
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import stream_floor_study as S  # noqa: E402


@pytest.mark.parametrize("arm,tile_dtype", [
    ("tile_w2", torch.bfloat16),
    ("stream_w2", torch.float8_e4m3fn),
    ("tile_hgate_c128_s3_w1", torch.bfloat16),
    ("tile_c64_s2_w1", torch.float8_e4m3fn),
    ("persist_p2_w2", torch.bfloat16),        # 6 programs over 256 items: a tail of 4
    ("persist_hgate_p2_w2", torch.float8_e4m3fn),
    ("persist_tl_p2_s2_w2", torch.bfloat16),
])
def test_arm_matches_float64(arm, tile_dtype):
    seed = torch.seed() % 100000
    errs = S.check([arm], tile_dtype, torch.device("cpu"), seed, B=2, pad_rows=1, n_sm=3)
    assert errs[arm] < 1e-5, (arm, seed, errs)


def test_reference_sees_the_chain():
    """The reference is not blind to what the chain loads: dropping the slot / ring-row / h indirection (the stream
    arms' maths) changes the answer by far more than the tolerance, so an arm that skipped it would fail."""
    d = S.make_problem(2, torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(3), pad_rows=0)
    a, b = S.reference(d, True), S.reference(d, False)
    assert ((a - b).norm() / a.norm()).item() > 0.1


def test_arm_names_are_checked():
    assert S.parse_arm("persist_tl_hgate_p8_s3_w4") == dict(kind="persist_tl", hgate=True, per_sm=8, stages=3,
                                                            warps=4, BV=32, chunk_bytes=None)
    assert S.parse_arm("tile_c128_s3_w1")["chunk_bytes"] == 128
    for bad in ("persist_w2", "persist_tl_p4_w2", "tile_c64_w1", "persist_c64_p2_s2_w2", "foo_w2"):
        with pytest.raises(ValueError):
            S.parse_arm(bad)


def test_plot_draws_every_dtype(tmp_path):
    """--plot merges runs per tile dtype (a later run's arm replaces an earlier one of the same name) into one PNG."""
    pytest.importorskip("matplotlib")
    paths = []
    for i, (td, arms) in enumerate([("bf16", {"stream_w2": 80.0, "tile_w2": 90.0}),
                                    ("bf16", {"tile_w2": 88.0, "persist_p4_w2": 120.0}),
                                    ("fp8_e4m3", {"stream_w2": 70.0, "persist_tl_p8_s2_w2": 110.0})]):
        rows = [dict(arm=a, **S.parse_arm(a), t_us=t) for a, t in arms.items()]
        p = tmp_path / f"r{i}.json"
        p.write_text(__import__("json").dumps(dict(meta=dict(tile_dtype=td, batch=256, commit=f"c{i}", gpu="x"),
                                                    rows=rows)))
        paths.append(str(p))
    png = tmp_path / "out.png"
    S.plot(paths, str(png))
    assert png.stat().st_size > 1000


# ----- the CUDA arms (scripts/stream_persist.cu; session 40): they run on a GPU only, where the study checks them
# against float64 before timing; here their names, their shared-memory sizes and that they compile -----

def test_cuda_arm_names():
    plain = dict(hgate=False, chunk_bytes=None, pre=False, pdl=False, ncg=None, derived=False)
    assert S.parse_arm("cupersist_p4_s4_bv64") == dict(kind="cupersist", per_sm=4, stages=4, warps=5, BV=64, **plain)
    assert S.parse_arm("cutile_bv32") == dict(kind="cutile", per_sm=None, stages=None, warps=2, BV=32, **plain)
    assert S.parse_arm("cutile")["BV"] == 64
    assert S.parse_arm("cutile_bv64_o5")["occupancy"] == 5
    # session 54: the coefficients made by a pre launch (cutile _pre, _pdl) or by a coefficient warp (cugroup)
    assert S.parse_arm("cutile_bv64_pre_pdl") == dict(kind="cutile", per_sm=None, stages=None, warps=4, BV=64,
                                                      **dict(plain, pre=True, pdl=True, derived=True))
    assert S.parse_arm("cugroup_p1_s2") == dict(kind="cugroup", per_sm=1, stages=2, warps=10, BV=128,
                                                **dict(plain, ncg=8, derived=True))
    assert S.parse_arm("cugroup_p2_s2_n16_given") == dict(kind="cugroup", per_sm=2, stages=2, warps=17, BV=128,
                                                          **dict(plain, ncg=16))
    for bad in ("cupersist_p4_bv64", "cupersist_s4_bv64", "cupersist_p4_s4_bv48", "cutile_p4", "cutile_w2",
                "cutile_o0", "cupersist_p4_s4_o5", "cutile_bv64_pdl", "cupersist_p4_s4_pre", "cugroup_p1",
                "cugroup_s2", "cugroup_p1_s2_bv64", "cugroup_p1_s2_n0", "cutile_given", "cutile_n8"):
        with pytest.raises(ValueError):
            S.parse_arm(bad)


def test_derived_coefficients_matter():
    """The reference with the coefficients made from the records is not the one with the given coefficients, and
    not the one without the records' terms: an arm that read the wrong coefficients (or a pre launch's NaN poison
    left unwritten) fails its check. And derived_coef is what its docstring says, on one entry recomputed here."""
    d = S.make_problem(3, torch.bfloat16, torch.device("cpu"), torch.Generator().manual_seed(5), pad_rows=0)
    d["ring_h"][:] = S.CAP - 1  # (every row with records)
    c = S.derived_coef(d)
    given, derived = S.reference(d, True), S.reference(d, True, c)
    assert ((given - derived).norm() / derived.norm()).item() > 0.1
    no_records = S.reference(d, True, torch.zeros_like(c))
    assert ((no_records - derived).norm() / derived.norm()).item() > 1e-3
    n, hv, j = 1, 5, 3
    rrow, i_h = int(d["ring_idx"][n]), hv // (S.HV_DIM // S.H_DIM)
    q = d["x"][n, i_h * S.K_DIM:(i_h + 1) * S.K_DIM].double()
    kr = d["ring_k"][rrow, i_h, j].double()
    e = torch.exp(d["gt"][n, hv].double() - d["ring_g"][rrow, hv, j].double())
    assert torch.allclose(c[n, hv, 0, j], e * (kr @ q), rtol=1e-12, atol=0)
    assert (c[:, :, :, S.CAP - 1] == 0).all()  # (j >= h)


def test_cuda_arms_refuse_the_cpu():
    d = S.make_problem(2, torch.float8_e4m3fn, torch.device("cpu"), torch.Generator().manual_seed(1))
    with pytest.raises(RuntimeError, match="GPU only"):
        S.launch("cutile_bv64", d, torch.empty(2, S.HV_DIM, S.V_DIM), 1)


def _cu_stage_bytes(defs: dict, name: str = "STAGE_BYTES") -> int:
    """STAGE_BYTES as the .cu's preprocessor computes it, read from the source's #defines (not a copy of
    cu_smem_bytes' formula): a change on either side that breaks the agreement fails here."""
    import re

    src = open(S.CU_SRC).read()
    macros = dict(re.findall(r"^#define (\w+) (\(.*\)|\d+|[A-Z_][A-Z0-9_]*)\s*(?://.*)?$", src, re.M))
    macros.update({k: str(v) for k, v in defs.items()})
    macros.update(H_="16", HV_="32", K_="128", V_="128", CAP="16")

    e = name
    for _ in range(20):  # expand the macros (a number bare, an expression in its parentheses) until none is left
        e2 = re.sub(r"\b([A-Z_][A-Z0-9_]*)\b", lambda m: macros.get(m.group(1), m.group(1)), e)
        if e2 == e:
            break
        e = e2
    assert not re.search(r"[A-Za-z_]", e), e
    # C to Python: integer division, then the ternaries (innermost first: `(c ? a : b)` with plain operands)
    e = e.replace("/", "//")
    while "?" in e:
        e = re.sub(r"\(\s*([^()?:]+?)\s*\?\s*([^()?:]+?)\s*:\s*([^()?:]+?)\s*\)", r"((\2) if (\1) else (\3))", e)
    return int(eval(e))


@pytest.mark.parametrize("fp8", [1, 0])
@pytest.mark.parametrize("bv,stages", [(32, 3), (64, 4), (128, 2)])
def test_cuda_smem_size_matches_the_source(fp8, bv, stages):
    defs = dict(TILE_FP8=fp8, BV=bv, STAGES=stages, PERSIST=1)
    assert S.cu_smem_bytes(defs) == stages * (_cu_stage_bytes(defs) + 16)
    assert S.cu_smem_bytes(dict(defs, PERSIST=0)) == 0


@pytest.mark.parametrize("fp8", [1, 0])
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_cuda_group_smem_size_matches_the_source(fp8, stages):
    """A group block's stages (GSTAGE_BYTES, read from the source) and three mbarriers per stage; what the arms ask
    for fits one block (227 KiB)."""
    arm = S.parse_arm(f"cugroup_p1_s{stages}")
    defs = S.cu_defines(arm, torch.float8_e4m3fn if fp8 else torch.bfloat16)
    assert S.cu_smem_bytes(defs) == stages * (_cu_stage_bytes(defs, "GSTAGE_BYTES") + 24)
    assert (S.cu_smem_bytes(defs) <= S.MAX_BLOCK_SMEM) == (stages <= (4 if fp8 else 2))


@pytest.mark.parametrize("arm,td", [("cupersist_p4_s4_bv64", "fp8_e4m3"), ("cutile_bv64", "bf16"),
                                    ("cutile_bv64_pre_pdl", "bf16"), ("cugroup_p1_s2", "bf16"),
                                    ("cugroup_p1_s4_given", "fp8_e4m3")])
def test_cuda_arms_compile_without_spills(arm, td, tmp_path, monkeypatch):
    from kernels import cuda_main as cm

    if cm.find_nvcc() is None:
        pytest.skip("no nvcc (scripts/setup-nvcc)")
    monkeypatch.setenv("REPLAYSSM_CUBIN_DIR", str(tmp_path))
    row = S.cu_offline(arm, S.TILE_DTYPES[td])
    assert row["registers"] and row["registers"] <= 72 and row["spill_bytes"] == 0, row
    assert row.get("pre_spill_bytes", 0) == 0, row
    assert list(tmp_path.glob("stream_persist-*.cubin"))


@pytest.mark.parametrize("td", ["bf16", "fp8_e4m3"])
def test_pdl_arm_loads_its_tile_before_the_wait(td):
    """``_pdl``'s point is a block that starts early with its tile loaded: in the SASS every one of the tile's 16-byte
    loads (4 rows, one word each for fp8, two for bf16) comes before the PDL wait (ACQBULK). (ptxas hoists the wait
    above read-only .nc loads: with the tile read through __ldg none came before it.)"""
    import re

    from kernels import cuda_main as cm

    if cm.find_nvcc() is None or cm.find_nvdisasm() is None:
        pytest.skip("no nvcc / nvdisasm (scripts/setup-nvcc)")
    defs = S.cu_defines(S.parse_arm("cutile_bv64_pre_pdl"), S.TILE_DTYPES[td])
    ins = cm.main_sass(defs, name="stream_persist", src=Path(S.CU_SRC))
    wait = cm.pdl_wait_index(ins)
    early = [ln for ln in ins[:wait] if re.match(r"LDG\S*\.128", ln)]
    assert len(early) >= (4 if td == "fp8_e4m3" else 8), ins[:wait + 1]


@pytest.mark.parametrize("o", [1, 2, 4, 5, 6, 8, 12, 16])
def test_occupancy_limit_admits_exactly_o_blocks(o):
    """``_oO``'s unused shared memory: O blocks fit on an SM (each with the driver's 1 KiB), O + 1 do not."""
    smem = S.cu_occupancy_smem(o) + 1024
    assert o * smem <= S.SM_SMEM < (o + 1) * smem or smem - 1024 == S.MAX_BLOCK_SMEM
    assert S.cu_occupancy_smem(None) == 0

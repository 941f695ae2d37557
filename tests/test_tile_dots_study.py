"""scripts/tile_dots_study.py: the tile-reduction study's kernels and the algebra of its split matrix.

On CPU: the CUDA-core kernels (decode v3's reduction form) against float64 under the interpreter; the tensor-core
form's algebra (C times [q_hi, q_lo, k_hi, k_lo], columns summed) against float64 in torch (the interpreter's bf16
tl.dot is not usable: it returned values of order 1e11 for a product of order 40 here); the sm_90 compile of both
forms (the claim the study rests on: the tensor-core form drops the per-element bf16 conversions and most of the
FMAs). The tensor-core kernels' numbers come from the GPU mode.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "tests"))
import tile_dots_study as T  # noqa: E402
from test_compile_sm90 import _has_cuda_backend  # noqa: E402  (the one check for an sm_90-capable Triton)


def _inputs(n, seed, tile_dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    tiles = (torch.randn(n, T.V_DIM, T.K_DIM, generator=g) * 0.05).to(tile_dtype)
    q = torch.nn.functional.normalize(torch.randn(n, T.K_DIM, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(n, T.K_DIM, generator=g, dtype=torch.float64), dim=-1)
    return tiles, q, k


@pytest.mark.parametrize("variant,tile_dtype", [("fma_u", torch.bfloat16), ("fma_p3", torch.bfloat16),
                                                ("fma_u", torch.float8_e4m3fn)])
def test_fma_kernels_match_float64(variant, tile_dtype):
    tiles, q, k = _inputs(3, seed=torch.seed() % 10000, tile_dtype=tile_dtype)
    out = torch.full((3, T.V_DIM, 2), float("nan"))
    T.launch(variant, tiles, q.float(), k.float(), None, out)
    ref = T.reference(tiles, q, k)
    assert torch.isfinite(out).all()
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6


def test_split_matrix_carries_fp32_grade_vectors():
    """q_hi + q_lo is q to ~2^-16 relative (bf16 alone: ~2^-9), both parts exactly bf16, and the product of an exact
    bf16 tile with the split columns, summed in pairs, is C q and C k to that accuracy."""
    tiles, q, k = _inputs(4, seed=7)
    qf, kf = q.float(), k.float()
    S = T.split_matrix(qf, kf)
    assert S.shape == (4, T.K_DIM, 4) and S.dtype == torch.bfloat16
    rec_q = S[..., 0].double() + S[..., 1].double()
    assert ((rec_q - qf.double()).abs().max() / qf.abs().max()).item() < 2 ** -15
    assert ((S[..., 0].double() - qf.double()).abs().max() / qf.abs().max()).item() > 2 ** -12  # hi alone is bf16
    prod = torch.einsum("tvk,tkc->tvc", tiles.double(), S.double())
    got = torch.stack([prod[..., 0] + prod[..., 1], prod[..., 2] + prod[..., 3]], -1)
    ref = T.reference(tiles, qf.double(), kf.double())
    assert ((got - ref).norm() / ref.norm()).item() < 2e-5
    hi_only = torch.stack([prod[..., 0], prod[..., 2]], -1)  # what a plain bf16 product would give
    assert ((hi_only - ref).norm() / ref.norm()).item() > 1e-4


@pytest.mark.compile
@pytest.mark.skipif(not _has_cuda_backend(), reason="Triton without its NVIDIA backend cannot compile for sm_90")
def test_tensor_core_form_compiles_without_per_element_conversions():
    # compiled, not interpreted: the subprocess runs without TRITON_INTERPRET
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "tile_dots_study.py"), "--offline",
                        "--variants", "fma_u,mma_u"], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"})
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {}
    for line in r.stdout.splitlines():
        parts = line.split()
        if parts and parts[0] in ("fma_u", "mma_u"):
            rows[parts[0]] = dict(sass=int(parts[parts.index("SASS") + 1]),
                                  hmma=int(parts[parts.index("HMMA") + 1]))
    assert rows["mma_u"]["hmma"] > 0 and rows["fma_u"]["hmma"] == 0, rows
    assert rows["mma_u"]["sass"] < rows["fma_u"]["sass"] / 2, rows

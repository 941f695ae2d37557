"""The tiny checkpoints load completely through SGLang 0.5.17's own loader (CPU, construction only).

scripts/check_tiny_model_load.py fills every parameter with NaN before SGLang's DefaultModelLoader runs and
reports those still NaN after it. A checkpoint missing one tensor must be reported (the check can fail)."""
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
pytest.importorskip("sglang")
torch = pytest.importorskip("torch")
import make_tiny_model as mtm  # noqa: E402

pytestmark = pytest.mark.sglang
SMALL = dict(layers=4, hidden=128, experts=4, topk=2, moe_inter=64, vocab=1024)
DROPPED = "model.layers.1.linear_attn.A_log"


def _drop(src: Path, dst: Path, name: str) -> None:
    shutil.copytree(src, dst)
    raw = (src / "model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    dt = {"BF16": torch.bfloat16, "F32": torch.float32}
    tensors = {}
    for k, v in head.items():
        if k == name:
            continue
        a, b = v["data_offsets"]
        tensors[k] = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=dt[v["dtype"]]).reshape(v["shape"])
    mtm.save_safetensors(tensors, dst / "model.safetensors", {"format": "pt"})
    idx = json.loads((src / "model.safetensors.index.json").read_text())
    idx["weight_map"].pop(name)
    (dst / "model.safetensors.index.json").write_text(json.dumps(idx))


def test_sglang_loads_every_parameter(tmp_path):
    gdn, kda = tmp_path / "gdn", tmp_path / "kda"
    mtm.make("qwen3_next", gdn, seed=5, **SMALL)
    mtm.make("kimi_linear", kda, seed=5, **SMALL)
    _drop(gdn, tmp_path / "gdn_broken", DROPPED)
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "check_tiny_model_load.py"), str(gdn), f"{gdn}:draft", str(kda),
         str(tmp_path / "gdn_broken")],
        capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-3000:]
    recs = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    assert [(r["model"], r["kind"]) for r in recs] == [
        ("Qwen3NextForCausalLM", "target"), ("Qwen3NextForCausalLMMTP", "draft"),
        ("KimiLinearForCausalLM", "target"), ("Qwen3NextForCausalLM", "target")]
    gdn_r, mtp_r, kda_r, broken_r = recs
    assert gdn_r["not_loaded"] == [] and kda_r["not_loaded"] == []
    # the MTP draft shares embed_tokens and lm_head with the target (set_embed_and_head at startup)
    assert sorted(x[0] for x in mtp_r["not_loaded"]) == ["lm_head.weight", "model.embed_tokens.weight"]
    assert any(n.startswith("model.fc") or n == "fc.weight" for n in mtp_r["param_names"])
    # linear-attention layers really exist with the real head shapes: 3 GDN / 3 KDA layers of 4
    assert sum(n.endswith("linear_attn.A_log") for n in gdn_r["param_names"]) == 3
    assert sum(n.endswith("self_attn.A_log") for n in kda_r["param_names"]) == 3
    assert [x[0] for x in broken_r["not_loaded"]] == [DROPPED]

"""scripts/make_tiny_model.py: files, determinism, tokenizer round trip, config fields and weight shapes.

Small widths here (CPU); the GPU run uses the defaults. The linear-attention head shapes are the real ones
in both cases (they are not parameters of the script)."""
import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")
import make_tiny_model as mtm  # noqa: E402

SMALL = dict(layers=4, hidden=128, experts=4, topk=2, moe_inter=64, vocab=1024)
FILES = ["config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json",
         "tokenizer_config.json", "generation_config.json"]


def _digest(d: Path) -> dict:
    return {f: hashlib.sha256((d / f).read_bytes()).hexdigest() for f in FILES}


def _header(path: Path) -> dict:
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        h = json.loads(f.read(n))
        body = len(f.read())
    h.pop("__metadata__", None)
    end = max(v["data_offsets"][1] for v in h.values())
    assert end == body, "safetensors data section does not match its header"
    return h


@pytest.fixture(scope="module", params=["qwen3_next", "kimi_linear"])
def model(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    mtm.make(request.param, d, seed=3, **SMALL)
    return request.param, d


def test_files_and_config(model):
    arch, d = model
    for f in FILES:
        assert (d / f).is_file() and (d / f).stat().st_size > 0, f
    c = json.loads((d / "config.json").read_text())
    assert c["num_hidden_layers"] == SMALL["layers"] and c["hidden_size"] == SMALL["hidden"]
    if arch == "qwen3_next":
        assert c["architectures"] == ["Qwen3NextForCausalLM"]
        assert (c["linear_num_key_heads"], c["linear_num_value_heads"]) == (16, 32)
        assert (c["linear_key_head_dim"], c["linear_value_head_dim"]) == (128, 128)
        # SGLang derives the layer pattern from full_attention_interval: 3 linear : 1 full
        pattern = ["attention" if (i + 1) % c["full_attention_interval"] == 0 else "linear_attention"
                   for i in range(c["num_hidden_layers"])]
        assert pattern == ["linear_attention"] * 3 + ["attention"]
        assert [t.replace("full_", "") for t in c["layer_types"]] == pattern
    else:
        la = c["linear_attn_config"]
        assert c["architectures"] == ["KimiLinearForCausalLM"]
        assert (la["num_heads"], la["head_dim"]) == (32, 128)  # H = HV = 32, K = V = 128
        assert la["full_attn_layers"] == [4] and la["kda_layers"] == [1, 2, 3]


def test_weight_names_and_shapes(model):
    arch, d = model
    c = json.loads((d / "config.json").read_text())
    h = _header(d / "model.safetensors")
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    assert sorted(idx["weight_map"]) == sorted(h)
    H = SMALL["hidden"]
    assert h["model.embed_tokens.weight"]["shape"] == [c["vocab_size"], H]
    assert h["lm_head.weight"]["shape"] == [c["vocab_size"], H]
    if arch == "qwen3_next":
        a = "model.layers.0.linear_attn"
        assert h[f"{a}.in_proj_qkvz.weight"]["shape"] == [2 * 2048 + 2 * 4096, H]
        assert h[f"{a}.in_proj_ba.weight"]["shape"] == [64, H]
        assert h[f"{a}.conv1d.weight"]["shape"] == [2 * 2048 + 4096, 1, 4]
        assert h[f"{a}.A_log"]["shape"] == [32] and h[f"{a}.dt_bias"]["shape"] == [32]
        assert h[f"{a}.out_proj.weight"]["shape"] == [H, 4096]
        assert h["model.layers.3.self_attn.q_proj.weight"]["shape"] == [16 * 256 * 2, H]
        assert not any(k.startswith("model.layers.3.linear_attn") for k in h)
        for k in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
                  "mtp.norm.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.gate.weight"):
            assert k in h, k
        assert h["mtp.fc.weight"]["shape"] == [H, 2 * H]
        for e in range(SMALL["experts"]):
            assert f"model.layers.1.mlp.experts.{e}.down_proj.weight" in h
    else:
        s = "model.layers.0.self_attn"
        for x in "qkv":
            assert h[f"{s}.{x}_proj.weight"]["shape"] == [4096, H]
            assert h[f"{s}.{x}_conv1d.weight"]["shape"] == [4096, 1, 4]
        assert h[f"{s}.A_log"]["shape"] == [1, 1, 32, 1] and h[f"{s}.dt_bias"]["shape"] == [4096]
        assert h[f"{s}.f_b_proj.weight"]["shape"] == [4096, 128]
        assert h["model.layers.3.self_attn.kv_b_proj.weight"]["shape"] == [32 * 256, 512]
        assert "model.layers.0.mlp.gate_proj.weight" in h  # first_k_dense_replace = 1
        assert "model.layers.1.block_sparse_moe.experts.0.w1.weight" in h


def _read(path: Path, name: str) -> "torch.Tensor":
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    meta = json.loads(raw[8:8 + n])[name]
    a, b = meta["data_offsets"]
    dt = {"BF16": torch.bfloat16, "F32": torch.float32}[meta["dtype"]]
    buf = bytearray(raw[8 + n + a:8 + n + b])
    return torch.frombuffer(buf, dtype=dt).reshape(meta["shape"]).float()


def test_weights_are_sane(model):
    arch, d = model
    f = d / "model.safetensors"
    for name in _header(f):
        t = _read(f, name)
        assert torch.isfinite(t).all(), name
    emb = _read(f, "model.embed_tokens.weight")
    assert 0.9 < emb.std() < 1.1
    lin = "model.layers.0.linear_attn" if arch == "qwen3_next" else "model.layers.0.self_attn"
    A_log = _read(f, f"{lin}.A_log")
    assert (A_log >= 0).all() and (A_log <= torch.log(torch.tensor(16.0)) + 1e-6).all() and A_log.std() > 0.1
    dt = torch.nn.functional.softplus(_read(f, f"{lin}.dt_bias"))
    assert (dt > 0.9e-3).all() and (dt < 0.11).all()
    w = _read(f, "lm_head.weight")
    assert abs(w.std().item() * SMALL["hidden"] ** 0.5 - 3.0) < 0.3  # logits of std ~3 for unit-rms input


def test_tokenizer_round_trip(model):
    _, d = model
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    text = "karito musel vandor 42, quaber!"
    ids = tok.encode(text).ids
    assert 0 < len(ids) < len(text) and tok.decode(ids) == text
    assert max(ids) < json.loads((d / "config.json").read_text())["vocab_size"]
    tf = pytest.importorskip("transformers")
    at = tf.AutoTokenizer.from_pretrained(str(d))
    assert at.decode(at.encode(text)) == text and at.eos_token_id == 0


def test_deterministic_across_processes(model, tmp_path):
    arch, d = model
    code = (f"import sys; sys.path.insert(0, {str(ROOT / 'scripts')!r}); import make_tiny_model as m; "
            f"from pathlib import Path; m.make({arch!r}, Path({str(tmp_path)!r}), seed=3, **{SMALL!r})")
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONHASHSEED": "12345",
                                                                 "PATH": "/usr/bin:/bin"})
    assert _digest(tmp_path) == _digest(d)


def test_seed_changes_weights(tmp_path):
    mtm.make("qwen3_next", tmp_path / "a", seed=1, **SMALL)
    mtm.make("qwen3_next", tmp_path / "b", seed=2, **SMALL)
    a, b = _digest(tmp_path / "a"), _digest(tmp_path / "b")
    assert a["model.safetensors"] != b["model.safetensors"] and a["config.json"] == b["config.json"]

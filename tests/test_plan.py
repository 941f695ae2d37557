"""`replayssm-sglang plan` against hand-computed cases.

Every expected number below is written out as arithmetic from the shapes, not taken from a run.
The small GDN model: H=2 key heads, HV=4 value heads, K=V=8, 4 layers with full_attention_interval 4
(layers 0, 1, 2 linear, layer 3 full attention), conv kernel 4.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from replayssm_sglang import plan as P

DATA = Path(__file__).parent / "data" / "configs"

SMALL_GDN = {
    "model_type": "qwen3_next",
    "num_hidden_layers": 4,
    "full_attention_interval": 4,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}


def write_cfg(tmp_path: Path, cfg: dict) -> Path:
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


def ns(config, **kw) -> argparse.Namespace:
    """The Namespace plan's parser produces, built through the real parser."""
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    P.add_parser(sub)
    argv = ["plan", "--config", str(config)]
    for k, v in kw.items():
        flag = "--" + k.replace("_", "-")
        if v is True:
            argv.append(flag)
        else:
            argv += [flag, str(v)]
    args = ap.parse_args(argv)
    assert args.func is P.run
    return args


def run_json(capsys, config, **kw) -> dict:
    rc = P.run(ns(config, json=True, **kw))
    out = capsys.readouterr().out
    assert rc == 0, out
    return json.loads(out)


# --- the small GDN model, TP=1, fp32 state, fp32 records, L=4 --------------------------------------

def test_small_gdn_tp1_fp32(tmp_path, capsys):
    d = run_json(capsys, write_cfg(tmp_path, SMALL_GDN), cache_len=4)
    assert d["model"]["linear_layer_ids"] == [0, 1, 2]
    req, lay = d["per_request"], d["per_layer"]
    # state [HV, V, K] fp32: 4 * 8 * 8 * 4 B = 1024 B per layer; 3 layers = 3072 B
    assert lay["state_bytes"] == 4 * 8 * 8 * 4 == 1024
    assert req["state_bytes"] == 3 * 1024
    # record: u (HV*V = 32) + k (H*K = 16) fp32 = 48 * 4 = 192 B, plus fp32 g per value head 4*4 = 16 B
    assert lay["record_bytes"] == 192 + 16 == 208
    # ring: capacity L = 4 records + 4 B of h
    assert lay["ring_records"] == 4
    assert lay["ring_bytes"] == 4 * 208 + 4 == 836
    assert req["ring_bytes"] == 3 * 836
    # conventional decode: read + write the state: 2 * 1024 per layer
    assert req["conventional_decode_bytes_per_token"] == 3 * 2 * 1024 == 6144
    # ReplaySSM decode, L=4: read 1024 + write 1024/4 + mean records read (0+1+2+3)/4 = 1.5 * 208
    # + one record written 208 = 1024 + 256 + 312 + 208 = 1800 per layer
    assert lay["replayssm_decode_bytes_per_token"] == 1800
    assert req["replayssm_decode_bytes_per_token"] == 3 * 1800 == 5400
    assert req["decode_ceiling_speedup"] == pytest.approx(6144 / 5400)
    # memory: conventional 1 state per layer; ReplaySSM checkpoint + ring
    assert req["memory_bytes"]["conventional_decode"] == 3072
    assert req["memory_bytes"]["replayssm"] == 3 * (1024 + 836)
    assert req["memory_bytes"]["conventional_spec"] is None
    # conv window (not in state_bytes): (HV*V + 2*H*K) = 32 + 32 = 64 channels * 3 taps * 2 B (bf16)
    assert lay["conv_bytes"] == 64 * 3 * 2


def test_small_gdn_tp2(tmp_path, capsys):
    d = run_json(capsys, write_cfg(tmp_path, SMALL_GDN), cache_len=4, tp=2)
    assert d["per_rank_heads"] == {"H": 1, "HV": 2}
    lay = d["per_layer"]
    # state per rank: 2 * 8 * 8 * 4 = 512 B
    assert lay["state_bytes"] == 512
    assert d["per_request"]["state_bytes"] == 3 * 512
    # record: (2*8 + 1*8) * 4 = 96 B + g 2 * 4 = 8 B
    assert lay["record_bytes"] == 104
    assert lay["ring_bytes"] == 4 * 104 + 4
    # decode: 512 + 512/4 + 1.5*104 + 104 = 512 + 128 + 156 + 104 = 900
    assert lay["replayssm_decode_bytes_per_token"] == 900
    assert lay["conventional_decode_bytes_per_token"] == 1024


def test_small_gdn_bf16_state_and_records(tmp_path, capsys):
    d = run_json(capsys, write_cfg(tmp_path, SMALL_GDN), cache_len=4, state_dtype="bfloat16",
                 record_dtype="bfloat16")
    lay = d["per_layer"]
    # state bf16: 4*8*8*2 = 512; record: 48 * 2 = 96 + fp32 g 16 = 112
    assert lay["state_bytes"] == 512
    assert lay["record_bytes"] == 112
    # decode: 512 + 128 + 1.5*112 + 112 = 512 + 128 + 168 + 112 = 920
    assert lay["replayssm_decode_bytes_per_token"] == 920
    assert d["settings"]["state_dtype_source"] == "--state-dtype"


def test_state_dtype_from_config(tmp_path, capsys):
    cfg = dict(SMALL_GDN, mamba_ssm_dtype="bfloat16")
    d = run_json(capsys, write_cfg(tmp_path, cfg), cache_len=4)
    assert d["settings"]["state_dtype"] == "bfloat16"
    assert d["per_layer"]["state_bytes"] == 512


def test_spec_verify_hand_cycles(tmp_path, capsys):
    """L=4, T=2, fp32 (state S = 1024, record R = 208).

    All accepted (2 per step): h goes 0 -> 2 -> 4, then every step from h=4 folds (4+2 > 4) and
    ends at 2, and from h=2 appends to 4: cycle of 2 steps, 4 tokens, with C read twice, written
    once, records read 2 + 4 = 6, written 2 * 2 = 4.  Per token: 2S/4 + S/4 + 6R/4 + 4R/4
    = 512 + 256 + 312 + 208 = 1288.  Conventional: (T + 3) S / 2 = 5 * 1024 / 2 = 2560.

    All rejected (1 per step): cycle h = 1, 2, 3 (3 folds since 3+2 > 4): 3 steps, 3 tokens,
    C read 3, written 1, records read 1 + 2 + 3 = 6, written 3 * 2 = 6.  Per token:
    S + S/3 + 2R + 2R = 1024 + 1024/3 + 416 + 416.  Conventional: 5 * 1024 = 5120.
    """
    d = run_json(capsys, write_cfg(tmp_path, SMALL_GDN), cache_len=4, spec_tokens=2)
    spec = d["per_layer"]["spec"]
    assert spec["all_accepted"]["replayssm_spec_bytes_per_token"] == 1288
    assert spec["all_accepted"]["conventional_spec_bytes_per_token"] == 2560
    assert spec["all_rejected"]["replayssm_spec_bytes_per_token"] == pytest.approx(1024 + 1024 / 3 + 832)
    assert spec["all_rejected"]["conventional_spec_bytes_per_token"] == 5120
    assert spec["all_accepted"]["ceiling_speedup"] == pytest.approx(2560 / 1288)
    req = d["per_request"]
    assert req["spec"]["all_accepted"]["replayssm_spec_bytes_per_token"] == 3 * 1288
    # conventional spec memory: the state plus T per-draft snapshots, 3 layers
    assert req["memory_bytes"]["conventional_spec"] == 3 * 1024 * (1 + 2)
    # the ring still holds L records (not L + T)
    assert d["settings"]["ring_capacity"] == 4
    assert d["per_layer"]["ring_bytes"] == 4 * 208 + 4


def test_read_copy_bf16(tmp_path, capsys):
    """fp32 state with a bf16 read copy (Sr = 512), L=4: three of four decode steps read Sr, the
    flushing step reads S; the flush writes S and Sr.  Per token:
    (3*512 + 1024)/4 + (1024 + 512)/4 + 1.5*208 + 208 = 640 + 384 + 312 + 208 = 1544."""
    d = run_json(capsys, write_cfg(tmp_path, SMALL_GDN), cache_len=4, read_dtype="bf16")
    lay = d["per_layer"]
    assert lay["read_copy_bytes"] == 512
    assert lay["replayssm_decode_bytes_per_token"] == 1544
    assert d["per_request"]["memory_bytes"]["replayssm"] == 3 * (1024 + 512 + 836)


def test_read_copy_fp8(tmp_path, capsys):
    """fp8 e4m3 read copy: HV*V*K = 256 one-byte codes plus one fp32 scale per (value head, V-row),
    HV*V*4 = 128 bytes (replayssm_sglang.precision's layout): Sr = 384.  Per token:
    (3*384 + 1024)/4 + (1024 + 384)/4 + 1.5*208 + 208 = 544 + 352 + 312 + 208 = 1416."""
    d = run_json(capsys, write_cfg(tmp_path, SMALL_GDN), cache_len=4, read_dtype="fp8_e4m3")
    assert d["per_layer"]["read_copy_bytes"] == 384
    assert d["per_layer"]["replayssm_decode_bytes_per_token"] == 1416
    assert d["per_request"]["memory_bytes"]["replayssm"] == 3 * (1024 + 384 + 836)


def test_L1_is_conventional_plus_one_record(tmp_path, capsys):
    # L = 1: every step flushes: read S, write S, read no records, write one (a bound: the kernel
    # need not store the record of a step that folds it) = 2048 + 208
    d = run_json(capsys, write_cfg(tmp_path, SMALL_GDN), cache_len=1)
    assert d["per_layer"]["replayssm_decode_bytes_per_token"] == 2 * 1024 + 208


def test_batch_scales_totals(tmp_path, capsys):
    d = run_json(capsys, write_cfg(tmp_path, SMALL_GDN), cache_len=4, batch=8)
    assert d["batch_totals"]["replayssm_decode_bytes_per_step"] == 8 * 5400
    assert d["batch_totals"]["memory_bytes"]["conventional_decode"] == 8 * 3072


def test_json_keys(tmp_path, capsys):
    d = run_json(capsys, write_cfg(tmp_path, SMALL_GDN))
    for key in ("state_bytes", "ring_bytes", "conventional_decode_bytes_per_token",
                "replayssm_decode_bytes_per_token"):
        assert key in d["per_request"], key
    assert d["settings"]["cache_len"] == 16 and d["settings"]["spec_tokens"] == 1


# --- KDA (Kimi-Linear layout) ---------------------------------------------------------------------

SMALL_KDA = {
    "model_type": "kimi_linear",
    "num_hidden_layers": 4,
    "linear_attn_config": {
        "kda_layers": [1, 2, 3],  # 1-based: layers 0, 1, 2
        "full_attn_layers": [4],
        "num_heads": 4,
        "head_dim": 8,
        "short_conv_kernel_size": 4,
    },
}


def test_small_kda(tmp_path, capsys):
    d = run_json(capsys, write_cfg(tmp_path, SMALL_KDA), cache_len=4)
    assert d["model"]["kind"] == "kda"
    assert d["model"]["linear_layer_ids"] == [0, 1, 2]
    lay = d["per_layer"]
    # state 4*8*8*4 = 1024; record: u 4*8 + k 4*8 (one key per value head) = 64 * 4 = 256,
    # per-K fp32 gate 4 * 8 * 4 = 128  -> 384
    assert lay["state_bytes"] == 1024
    assert lay["record_bytes"] == 256 + 128
    # decode: 1024 + 256 + 1.5*384 + 384 = 2240
    assert lay["replayssm_decode_bytes_per_token"] == 2240
    # predecayed keys (the server's KDA default): the 1.5 records read carry no gate (256 each), the 3 steps of 4
    # that hold records read the last record's gate (128): 1024 + 256 + 1.5*256 + 0.75*128 + 384 = 2144
    assert lay["replayssm_decode_bytes_per_token_predecayed"] == 2144
    # conv: (4*8 + 2*4*8) = 96 channels * 3 * 2 B
    assert lay["conv_bytes"] == 96 * 3 * 2


def test_kda_needs_kda_layers(tmp_path):
    cfg = json.loads(json.dumps(SMALL_KDA))
    del cfg["linear_attn_config"]["kda_layers"]
    with pytest.raises(P.PlanError, match="kda_layers"):
        P.parse_config(cfg)


# --- config reading -------------------------------------------------------------------------------

def test_qwen35_nested_text_config():
    cfg = {
        "model_type": "qwen3_5_moe",
        "text_config": dict(SMALL_GDN, model_type="qwen3_5_moe_text", mamba_ssm_dtype="bfloat16"),
        "mamba_ssm_dtype": "float32",
    }
    m = P.parse_config(cfg)
    assert m.family == "Qwen3.5" and m.kind == "gdn"
    assert m.linear_layer_ids == (0, 1, 2)
    assert (m.H, m.HV, m.K, m.V) == (2, 4, 8, 8)
    assert m.config_state_dtype == "bfloat16"  # text_config first, as SGLang


def test_layer_types_fallback_is_flagged():
    cfg = dict(SMALL_GDN)
    del cfg["full_attention_interval"]
    cfg["layer_types"] = ["linear_attention", "full_attention", "linear_attention", "linear_attention"]
    m = P.parse_config(cfg)
    assert m.linear_layer_ids == (0, 2, 3)
    assert any("full_attention_interval" in n for n in m.notes)


def test_missing_heads_use_sglang_defaults_and_say_so():
    m = P.parse_config({"model_type": "qwen3_next", "num_hidden_layers": 8, "full_attention_interval": 4})
    assert (m.H, m.HV, m.K, m.V, m.conv_kernel) == (16, 32, 128, 128, 4)
    assert sum("default" in n for n in m.notes) == 5


def test_unknown_model_type():
    with pytest.raises(P.PlanError, match="llama"):
        P.parse_config({"model_type": "llama"})


def test_tp_must_divide(tmp_path, capsys):
    rc = P.run(ns(write_cfg(tmp_path, SMALL_GDN), tp=4))  # H = 2 key heads
    err = capsys.readouterr().err
    assert rc == 2 and "TP=4" in err


def test_T_above_L_is_refused_with_the_ring_message(tmp_path, capsys):
    rc = P.run(ns(write_cfg(tmp_path, SMALL_GDN), cache_len=2, spec_tokens=3))
    err = capsys.readouterr().err
    assert rc == 2 and "--linear-replayssm-cache-len" in err


# --- the shipped example configs ------------------------------------------------------------------

def test_qwen3_next_80b_shape(capsys):
    d = run_json(capsys, DATA / "qwen3-next-80b-a3b.json")
    req = d["per_request"]
    assert d["model"]["linear_layers"] == 36
    # 36 layers * 32 * 128 * 128 * 4 B = 72 MiB
    assert req["state_bytes"] == 36 * 32 * 128 * 128 * 4
    # record: (32*128 + 16*128) * 4 + 32 * 4 = 24704 B; ring 16 records + h
    assert d["per_layer"]["record_bytes"] == (32 * 128 + 16 * 128) * 4 + 32 * 4
    assert req["ring_bytes"] == 36 * (16 * 24704 + 4)
    S = 32 * 128 * 128 * 4
    assert req["replayssm_decode_bytes_per_token"] == 36 * (S + S // 16 + 7.5 * 24704 + 24704)
    # device-facts.md: about 1.72x for this layer with fp32 state and records
    assert round(req["decode_ceiling_speedup"], 2) == 1.72


def test_kimi_linear_48b_shape(capsys):
    d = run_json(capsys, DATA / "kimi-linear-48b-a3b.json")
    assert d["model"]["linear_layers"] == 20
    assert d["model"]["linear_layer_ids"][:4] == [0, 1, 2, 4]
    S = 32 * 128 * 128 * 4
    R = (32 * 128 + 32 * 128) * 4 + 32 * 128 * 4
    assert d["per_layer"]["record_bytes"] == R
    assert d["per_request"]["replayssm_decode_bytes_per_token"] == 20 * (S + S // 16 + 8.5 * R)
    # device-facts.md: about 1.59x with the per-K gate in every record
    assert round(d["per_request"]["decode_ceiling_speedup"], 2) == 1.59
    # predecayed keys: records read without their gate, the last record's gate read on 15 steps of 16
    Gb = 32 * 128 * 4
    assert d["per_request"]["replayssm_decode_bytes_per_token_predecayed"] == 20 * (
        S + S // 16 + 7.5 * (R - Gb) + 15 / 16 * Gb + R)


def test_text_output_mentions_capacity(tmp_path, capsys):
    rc = P.run(ns(write_cfg(tmp_path, SMALL_GDN), cache_len=4, spec_tokens=2))
    out = capsys.readouterr().out
    assert rc == 0
    assert "ring capacity: 4 records (not L+T=6" in out
    assert "ReplaySSM spec verify T=2, all rejected" in out


def test_help_documents_the_formula():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers()
    p = P.add_parser(sub)
    text = p.format_help()
    assert "S + S/L + (L-1)/2 R + R" in text
    assert "(T + 3) S / a" in text


def test_registered_in_the_cli(tmp_path, capsys):
    cli = pytest.importorskip("replayssm_sglang.cli")
    rc = cli.main(["plan", "--config", str(write_cfg(tmp_path, SMALL_GDN)), "--cache-len", "4", "--json"])
    assert rc == 0
    assert json.loads(capsys.readouterr().out)["per_request"]["replayssm_decode_bytes_per_token"] == 5400

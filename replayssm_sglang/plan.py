"""`replayssm-sglang plan`: memory and state traffic of a GDN or KDA model, per layer and per request.

Pure functions (``parse_config``, ``shard``, ``replayssm_traffic``, ``make_plan``) plus the CLI glue
(``add_parser``, ``run``). Ring sizes come from ``replayssm_sglang.ring`` (the owner of the record
layout and the flush rule); this module never re-derives them.

How the config is read mirrors SGLang 0.5.17 (``sglang/srt/configs/{qwen3_next,qwen3_5,kimi_linear,
mamba_utils}.py``):
- Qwen3-Next (``qwen3_next``) and Qwen3.5 (``qwen3_5*``, fields under ``text_config``): GDN.
  Layer ``i`` is full attention iff ``(i + 1) % full_attention_interval == 0``, otherwise linear.
  Heads: ``linear_num_key_heads`` (H), ``linear_num_value_heads`` (HV), ``linear_key_head_dim`` (K),
  ``linear_value_head_dim`` (V), ``linear_conv_kernel_dim``; missing ones take the defaults of
  SGLang's ``Qwen3NextConfig`` (16, 32, 128, 128, 4), and the output says so.
- Kimi-Linear (``kimi_linear``): KDA. ``linear_attn_config`` holds ``kda_layers`` (1-based layer
  numbers), ``full_attn_layers``, ``num_heads`` (H = HV), ``head_dim`` (K = V),
  ``short_conv_kernel_size``.
- Recurrent state per layer and TP rank: ``[HV/tp, V, K]`` in the SSM dtype (``mamba_ssm_dtype`` of
  the config, ``text_config`` first; default float32). Heads must divide by the attention TP size.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from replayssm_sglang import ring as _ring

# --- dtypes ---------------------------------------------------------------------------------------

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}
_ALIASES = {
    "fp32": "float32", "float": "float32", "float32": "float32",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp16": "float16", "half": "float16", "float16": "float16",
    "fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "float8_e4m3fn": "float8_e4m3fn",
}
STATE_DTYPES = ("float32", "bfloat16", "float16")  # SGLang's --mamba-ssm-dtype choices
READ_DTYPES = ("same", "bf16", "fp8_e4m3")
RECORD_DTYPES = ("float32", "bfloat16")
_READ = {"bf16": "bfloat16", "fp8_e4m3": "float8_e4m3fn"}
CONV_DTYPE = "bfloat16"  # SGLang's default conv-window dtype (SGLANG_MAMBA_CONV_DTYPE)

# SGLang 0.5.17 Qwen3NextConfig defaults for the linear-attention keys.
_QWEN3_NEXT_DEFAULTS = {
    "num_hidden_layers": 48,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}
_KIMI_DEFAULTS = {"num_hidden_layers": 32}


class PlanError(ValueError):
    """A config or setting plan cannot work with; the message says what to change."""


def canonical_dtype(name: str) -> str:
    try:
        return _ALIASES[name.lower()]
    except KeyError:
        raise PlanError(f"unknown dtype {name!r}; use one of {sorted(set(_ALIASES))}") from None


def dtype_bytes(name: str) -> int:
    return _DTYPE_BYTES[canonical_dtype(name)]


def _torch_dtype(name: str):
    import torch

    return getattr(torch, canonical_dtype(name))


# --- the model, as SGLang 0.5.17 reads it ---------------------------------------------------------

@dataclass(frozen=True)
class LinearModel:
    model_type: str
    family: str  # "Qwen3-Next", "Qwen3.5", "Kimi-Linear"
    kind: str  # "gdn" | "kda"
    num_hidden_layers: int
    linear_layer_ids: tuple[int, ...]
    H: int
    HV: int
    K: int
    V: int
    conv_kernel: int
    config_state_dtype: str | None  # mamba_ssm_dtype of the config, if any
    layer_rule: str
    notes: tuple[str, ...] = ()

    @property
    def num_linear_layers(self) -> int:
        return len(self.linear_layer_ids)


def _get(cfg: dict, key: str, defaults: dict, notes: list, what: str):
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if key in defaults:
        notes.append(f"{key} not in config: SGLang's {what} default {defaults[key]} used")
        return defaults[key]
    raise PlanError(f"config has no {key!r} (SGLang 0.5.17's {what} needs it)")


def _state_dtype_of(root: dict, text: dict | None) -> str | None:
    # mamba_utils.mamba2_state_dtype: text_config.mamba_ssm_dtype first, then the root's.
    if text is not None and "mamba_ssm_dtype" in text:
        val = text["mamba_ssm_dtype"]
    else:
        val = root.get("mamba_ssm_dtype")
    if val is None:
        return None
    if val not in STATE_DTYPES:
        return None  # SGLang warns and falls back to float32
    return val


def parse_config(cfg: dict) -> LinearModel:
    """Read a Hugging Face ``config.json`` (as a dict) the way SGLang 0.5.17 does."""
    if not isinstance(cfg, dict):
        raise PlanError("config must be a JSON object")
    mt = str(cfg.get("model_type", ""))
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    text_mt = str(text.get("model_type", "")) if text else ""
    archs = " ".join(cfg.get("architectures") or [])

    if mt.startswith("qwen3_5") or (text is not None and text_mt.startswith("qwen3_5")):
        # Qwen3_5Config / Qwen3_5MoeConfig: the GDN fields live in text_config
        # (Qwen3_5TextConfig, a Qwen3NextConfig). A bare text config works too.
        body = text if text is not None else cfg
        return _parse_gdn(body, cfg, text, family="Qwen3.5", model_type=mt or text_mt)
    if mt == "qwen3_next" or "Qwen3NextFor" in archs:
        return _parse_gdn(cfg, cfg, None, family="Qwen3-Next", model_type=mt or "qwen3_next")
    if mt == "kimi_linear" or "KimiLinearFor" in archs or (text is not None and text_mt == "kimi_linear"):
        body = cfg if mt == "kimi_linear" or text is None else text
        return _parse_kda(body, cfg, text if body is text else None, model_type=mt or "kimi_linear")
    raise PlanError(
        f"model_type {mt!r} is not a GDN or KDA model plan knows: expected qwen3_next, "
        "qwen3_5 / qwen3_5_moe (with text_config) or kimi_linear"
    )


def _parse_gdn(body: dict, root: dict, text: dict | None, *, family: str, model_type: str) -> LinearModel:
    notes: list[str] = []
    what = "Qwen3NextConfig"
    n = int(_get(body, "num_hidden_layers", _QWEN3_NEXT_DEFAULTS, notes, what))
    interval = body.get("full_attention_interval")
    layer_types = body.get("layer_types")
    if interval is not None:
        interval = int(interval)
        if interval < 1:
            raise PlanError(f"full_attention_interval must be >= 1, got {interval}")
        ids = tuple(i for i in range(n) if (i + 1) % interval != 0)
        rule = f"full_attention_interval={interval}"
        if layer_types is not None:
            from_types = tuple(i for i, t in enumerate(layer_types) if t == "linear_attention")
            if from_types != ids:
                notes.append(
                    "layer_types disagrees with full_attention_interval; SGLang 0.5.17 follows "
                    "full_attention_interval, and so does this plan"
                )
    elif layer_types is not None:
        if len(layer_types) != n:
            raise PlanError(f"layer_types has {len(layer_types)} entries for {n} layers")
        ids = tuple(i for i, t in enumerate(layer_types) if t == "linear_attention")
        rule = "layer_types"
        notes.append(
            "no full_attention_interval: layers counted from layer_types, but SGLang 0.5.17's "
            "Qwen3NextConfig.layers_block_type reads full_attention_interval and will fail "
            "without it; add it to the config"
        )
    else:
        raise PlanError(
            "config has neither full_attention_interval nor layer_types: cannot tell linear "
            "layers from full-attention ones (SGLang 0.5.17 reads full_attention_interval)"
        )
    H = int(_get(body, "linear_num_key_heads", _QWEN3_NEXT_DEFAULTS, notes, what))
    HV = int(_get(body, "linear_num_value_heads", _QWEN3_NEXT_DEFAULTS, notes, what))
    K = int(_get(body, "linear_key_head_dim", _QWEN3_NEXT_DEFAULTS, notes, what))
    V = int(_get(body, "linear_value_head_dim", _QWEN3_NEXT_DEFAULTS, notes, what))
    conv = int(_get(body, "linear_conv_kernel_dim", _QWEN3_NEXT_DEFAULTS, notes, what))
    if HV % H:
        raise PlanError(f"linear_num_value_heads={HV} is not a multiple of linear_num_key_heads={H}")
    return LinearModel(
        model_type=model_type, family=family, kind="gdn", num_hidden_layers=n,
        linear_layer_ids=ids, H=H, HV=HV, K=K, V=V, conv_kernel=conv,
        config_state_dtype=_state_dtype_of(root, text), layer_rule=rule, notes=tuple(notes),
    )


def _parse_kda(body: dict, root: dict, text: dict | None, *, model_type: str) -> LinearModel:
    notes: list[str] = []
    n = int(_get(body, "num_hidden_layers", _KIMI_DEFAULTS, notes, "KimiLinearConfig"))
    lac = body.get("linear_attn_config")
    if not isinstance(lac, dict):
        raise PlanError("kimi_linear config has no linear_attn_config: no KDA layers to plan for")
    for key in ("kda_layers", "full_attn_layers", "num_heads", "head_dim", "short_conv_kernel_size"):
        if lac.get(key) is None:
            raise PlanError(
                f"linear_attn_config has no {key!r}: SGLang 0.5.17's KimiLinearConfig needs it"
            )
    kda = {int(x) for x in lac["kda_layers"]}
    # KimiLinearConfig.is_kda_layer: (layer_idx + 1) in kda_layers (1-based numbers)
    ids = tuple(i for i in range(n) if (i + 1) in kda)
    outside = sorted(x for x in kda if not 1 <= x <= n)
    if outside:
        notes.append(f"kda_layers {outside} lie outside 1..{n} and are ignored (as SGLang does)")
    heads = int(lac["num_heads"])
    hd = int(lac["head_dim"])
    return LinearModel(
        model_type=model_type, family="Kimi-Linear", kind="kda", num_hidden_layers=n,
        linear_layer_ids=ids, H=heads, HV=heads, K=hd, V=hd,
        conv_kernel=int(lac["short_conv_kernel_size"]),
        config_state_dtype=_state_dtype_of(root, text),
        layer_rule="linear_attn_config.kda_layers (1-based)", notes=tuple(notes),
    )


def load_config(path: str | Path) -> LinearModel:
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text())
    except FileNotFoundError:
        raise PlanError(f"no such config file: {p}") from None
    except json.JSONDecodeError as e:
        raise PlanError(f"{p} is not valid JSON: {e}") from None
    return parse_config(cfg)


# --- tensor-parallel sharding ---------------------------------------------------------------------

@dataclass(frozen=True)
class Shard:
    tp: int
    H: int  # key heads on this rank
    HV: int  # value heads on this rank


def shard(model: LinearModel, tp: int) -> Shard:
    """Heads on one attention-TP rank (SGLang: ``divide(num_heads, tp)``, which asserts)."""
    if tp < 1:
        raise PlanError(f"--tp must be >= 1, got {tp}")
    if model.HV % tp:
        raise PlanError(f"{model.HV} value heads do not divide by TP={tp} (SGLang asserts on this)")
    if model.H % tp:
        raise PlanError(
            f"{model.H} key heads do not divide by TP={tp}: SGLang pads key groups then, and its "
            "ReplaySSM ring requires evenly divided heads"
        )
    return Shard(tp=tp, H=model.H // tp, HV=model.HV // tp)


def layer_state_bytes(model: LinearModel, sh: Shard, state_dtype: str) -> int:
    """One layer's recurrent state for one request on one rank: [HV/tp, V, K]."""
    return sh.HV * model.V * model.K * dtype_bytes(state_dtype)


def layer_conv_bytes(model: LinearModel, sh: Shard, conv_dtype: str = CONV_DTYPE) -> int:
    """One layer's short-conv window (K_conv - 1 inputs of q, k and v channels) on one rank."""
    channels = (sh.HV * model.V) + 2 * (sh.H * model.K)
    return channels * (model.conv_kernel - 1) * dtype_bytes(conv_dtype)


def layer_ring(model: LinearModel, sh: Shard, L: int, T: int) -> _ring.RingLayout:
    try:
        return _ring.RingLayout.for_layer(model.kind, L=L, H=sh.H, HV=sh.HV, K=model.K, V=model.V, T_max=T)
    except ValueError as e:
        raise PlanError(str(e)) from None


# --- traffic model --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Traffic:
    """Per committed token, in units of one object of one layer of one request (exact fractions):
    full-precision state reads/writes, read-copy reads/writes, records read/written."""

    state_reads: Fraction
    state_writes: Fraction
    read_copy_reads: Fraction
    read_copy_writes: Fraction
    records_read: Fraction
    records_written: Fraction
    steps_per_token: Fraction
    steps_with_records: Fraction = Fraction(0)  # steps that start with h > 0 (they read the last record's gate)

    def bytes(self, state_b: int, read_copy_b: int, record_b: int) -> Fraction:
        return (
            self.state_reads * state_b
            + self.state_writes * state_b
            + self.read_copy_reads * read_copy_b
            + self.read_copy_writes * read_copy_b
            + self.records_read * record_b
            + self.records_written * record_b
        )


def replayssm_traffic(L: int, T: int = 1, accepted: int | None = None, read_copy: bool = False) -> Traffic:
    """Steady-state traffic of the ring protocol, per committed token.

    Steps follow ``replayssm_sglang.ring`` exactly: a T = 1 step is a decode step (auto-commit,
    flush when the ring fills: ``decode_flushes`` / ``h_after_decode``); a T > 1 step is a verify
    step that commits ``accepted`` tokens (``needs_prefold`` / ``h_after_verify``). Starting from
    h = 0 the committed count is iterated until it repeats; the averages are over that cycle.

    Per step: the checkpoint is read once (the read copy on a step that writes no checkpoint, when
    ``read_copy``), the h committed records are read, T records are written, and a step that folds
    writes the checkpoint (and refreshes the read copy, when ``read_copy``).
    """
    import torch

    _ring.ring_capacity(L, T)
    a = T if accepted is None else accepted
    if not 1 <= a <= T:
        raise ValueError(f"accepted={a} must lie in 1..T={T}")
    h = 0
    seen: dict[int, int] = {}
    rows: list[tuple[int, bool, int]] = []  # (records read, flushes, tokens)
    while h not in seen:
        seen[h] = len(rows)
        ht = torch.tensor([h], dtype=torch.int32)
        if T == 1:
            flush = bool(_ring.decode_flushes(ht, L)[0])
            nxt = int(_ring.h_after_decode(ht, L)[0])
            tokens = 1
        else:
            flush = bool(_ring.needs_prefold(ht, T, L)[0])
            nxt = int(_ring.h_after_verify(ht, T, L, torch.tensor([a], dtype=torch.int32))[0])
            tokens = a
        rows.append((h, flush, tokens))
        h = nxt
    cycle = rows[seen[h]:]
    tokens = sum(r[2] for r in cycle)
    steps = len(cycle)
    flushes = sum(1 for r in cycle if r[1])
    rec_read = sum(r[0] for r in cycle)
    F = Fraction
    with_rec = F(sum(1 for r in cycle if r[0] > 0), tokens)
    if read_copy:
        return Traffic(
            state_reads=F(flushes, tokens), state_writes=F(flushes, tokens),
            read_copy_reads=F(steps - flushes, tokens), read_copy_writes=F(flushes, tokens),
            records_read=F(rec_read, tokens), records_written=F(steps * T, tokens),
            steps_per_token=F(steps, tokens), steps_with_records=with_rec,
        )
    return Traffic(
        state_reads=F(steps, tokens), state_writes=F(flushes, tokens),
        read_copy_reads=F(0), read_copy_writes=F(0),
        records_read=F(rec_read, tokens), records_written=F(steps * T, tokens),
        steps_per_token=F(steps, tokens), steps_with_records=with_rec,
    )


def conventional_decode_traffic() -> Traffic:
    """Conventional decode: every token reads and writes the state."""
    one, zero = Fraction(1), Fraction(0)
    return Traffic(one, one, zero, zero, zero, zero, one)


def conventional_spec_traffic(T: int, accepted: int) -> Traffic:
    """Conventional speculative verify of T tokens (SGLang 0.5.17's recurrent target verify):
    the verify reads the state once and writes one snapshot per draft token into
    ``intermediate_ssm_state_cache`` (T writes); the commit copies the accepted snapshot into the
    state (one read, one write). That is (T + 3) state moves per step, for ``accepted`` tokens."""
    if not 1 <= accepted <= T:
        raise ValueError(f"accepted={accepted} must lie in 1..T={T}")
    a = Fraction(accepted)
    return Traffic(Fraction(2) / a, Fraction(T + 1) / a, Fraction(0), Fraction(0), Fraction(0), Fraction(0), 1 / a)


# --- the plan -------------------------------------------------------------------------------------

@dataclass
class Plan:
    model: LinearModel
    shard: Shard
    batch: int
    T: int
    L: int
    cap: int
    state_dtype: str
    state_dtype_source: str
    read_dtype: str
    record_dtype: str
    per_layer: dict[str, Any]
    per_request: dict[str, Any]
    batch_totals: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        m = self.model
        return {
            "model": {
                "family": m.family, "model_type": m.model_type, "kind": m.kind,
                "num_hidden_layers": m.num_hidden_layers,
                "linear_layers": m.num_linear_layers, "linear_layer_ids": list(m.linear_layer_ids),
                "layer_rule": m.layer_rule,
                "H": m.H, "HV": m.HV, "K": m.K, "V": m.V, "conv_kernel": m.conv_kernel,
            },
            "tp": self.shard.tp,
            "per_rank_heads": {"H": self.shard.H, "HV": self.shard.HV},
            "settings": {
                "batch": self.batch, "spec_tokens": self.T, "cache_len": self.L,
                "ring_capacity": self.cap,
                "ring_capacity_rule": (
                    "ring.ring_capacity(L, T) = L records: the pre-step fold (ring.needs_prefold) "
                    "folds whenever h+T > L, so h+T <= L holds while appending; not L+T"
                ),
                "state_dtype": self.state_dtype,
                "state_dtype_source": self.state_dtype_source, "read_dtype": self.read_dtype,
                "record_dtype": self.record_dtype,
            },
            "per_layer": self.per_layer,
            "per_request": self.per_request,
            "batch_totals": self.batch_totals,
            "notes": list(self.notes),
        }


def _num(x: Fraction) -> float | int:
    return int(x) if x.denominator == 1 else float(x)


def make_plan(
    model: LinearModel,
    *,
    batch: int = 1,
    spec_tokens: int = 1,
    cache_len: int = 16,
    state_dtype: str | None = None,
    read_dtype: str = "same",
    record_dtype: str = "float32",
    tp: int = 1,
) -> Plan:
    if batch < 1:
        raise PlanError(f"--batch must be >= 1, got {batch}")
    T, L = int(spec_tokens), int(cache_len)
    if T < 1:
        raise PlanError(f"--spec-tokens must be >= 1 (1 = no speculative decoding), got {T}")
    notes = list(model.notes)
    if state_dtype is None:
        if model.config_state_dtype is not None:
            state_dtype, src = model.config_state_dtype, "config mamba_ssm_dtype"
        else:
            state_dtype, src = "float32", "SGLang default: the config names no mamba_ssm_dtype"
    else:
        src = "--state-dtype"
    state_dtype = canonical_dtype(state_dtype)
    if state_dtype not in STATE_DTYPES:
        raise PlanError(f"--state-dtype must be one of {STATE_DTYPES}, got {state_dtype}")
    record_dtype = canonical_dtype(record_dtype)
    if record_dtype not in RECORD_DTYPES:
        raise PlanError(f"--record-dtype must be one of {RECORD_DTYPES}, got {record_dtype}")
    if read_dtype not in READ_DTYPES:
        raise PlanError(f"--read-dtype must be one of {READ_DTYPES}, got {read_dtype}")
    if model.num_linear_layers == 0:
        raise PlanError("the config has no linear-attention layers")

    sh = shard(model, tp)
    layout = layer_ring(model, sh, L, T)
    cap = layout.cap
    n = model.num_linear_layers

    state_b = layer_state_bytes(model, sh, state_dtype)
    has_read_copy = read_dtype != "same" and dtype_bytes(_READ[read_dtype]) != dtype_bytes(state_dtype)
    if read_dtype != "same" and not has_read_copy:
        notes.append(f"--read-dtype {read_dtype} equals the state dtype: no separate read copy")
    # the read copy's layout (fp8: codes + one fp32 scale per (value head, V-row)) is owned by
    # replayssm_sglang.precision
    from replayssm_sglang.precision import read_copy_bytes

    read_copy_b = read_copy_bytes(sh.HV, model.V, model.K, read_dtype) if has_read_copy else 0
    rec_b = layout.record_bytes(_torch_dtype(record_dtype))
    ring_b = layout.bytes_per_slot(_torch_dtype(record_dtype))
    conv_b = layer_conv_bytes(model, sh)

    def per(tr: Traffic) -> Fraction:
        return tr.bytes(state_b, read_copy_b if has_read_copy else state_b, rec_b)

    conv_dec = per(conventional_decode_traffic())
    rep_dec_t = replayssm_traffic(L, 1, read_copy=has_read_copy)
    rep_dec = per(rep_dec_t)
    # KDA without speculative decoding: the server keeps predecayed key records (sglang_hooks.pool.kda_keys_for,
    # docs/design.md "Pre-decayed KDA keys"): a decode step reads the records' keys and values but not their per-K
    # gates, only the last record's G (written as before). Head rebases (rare) are not counted.
    pred_dec = None
    if model.kind == "kda" and T == 1:
        gate_b = 4 * layout.HV * layout.GK
        pred_dec = rep_dec - rep_dec_t.records_read * gate_b + rep_dec_t.steps_with_records * gate_b

    layer: dict[str, Any] = {
        "state_bytes": state_b,
        "read_copy_bytes": read_copy_b,
        "record_bytes": rec_b,
        "ring_records": cap,
        "ring_bytes": ring_b,
        "conv_bytes": conv_b,
        "conventional_decode_bytes_per_token": _num(conv_dec),
        "replayssm_decode_bytes_per_token": _num(rep_dec),
        "replayssm_decode_bytes_per_token_predecayed": None if pred_dec is None else _num(pred_dec),
    }
    spec_fr: dict[str, tuple[int, Fraction, Fraction]] = {}
    if T > 1:
        for case, a in (("all_accepted", T), ("all_rejected", 1)):
            spec_fr[case] = (
                a,
                per(conventional_spec_traffic(T, a)),
                per(replayssm_traffic(L, T, a, read_copy=has_read_copy)),
            )

    def spec_json(scale: int):
        if not spec_fr:
            return None
        return {
            case: {
                "accepted_per_step": a,
                "conventional_spec_bytes_per_token": _num(scale * c),
                "replayssm_spec_bytes_per_token": _num(scale * r),
                "ceiling_speedup": float(c / r),
            }
            for case, (a, c, r) in spec_fr.items()
        }

    layer["spec"] = spec_json(1)
    mem_conv = n * state_b
    mem_spec = n * state_b * (1 + T)
    mem_rep = n * (state_b + read_copy_b + ring_b)
    req: dict[str, Any] = {
        "linear_layers": n,
        "state_bytes": n * state_b,
        "read_copy_bytes": n * read_copy_b,
        "ring_bytes": n * ring_b,
        "conv_bytes": n * conv_b,
        "memory_bytes": {
            "conventional_decode": mem_conv,
            "conventional_spec": mem_spec if T > 1 else None,
            "replayssm": mem_rep,
        },
        "conventional_decode_bytes_per_token": _num(n * conv_dec),
        "replayssm_decode_bytes_per_token": _num(n * rep_dec),
        "decode_ceiling_speedup": float(conv_dec / rep_dec),
        "replayssm_decode_bytes_per_token_predecayed": None if pred_dec is None else _num(n * pred_dec),
        "decode_ceiling_speedup_predecayed": None if pred_dec is None else float(conv_dec / pred_dec),
        "replayssm_decode_per_token_units": {
            "state_reads": float(rep_dec_t.state_reads),
            "state_writes": float(rep_dec_t.state_writes),
            "read_copy_reads": float(rep_dec_t.read_copy_reads),
            "read_copy_writes": float(rep_dec_t.read_copy_writes),
            "records_read": float(rep_dec_t.records_read),
            "records_written": float(rep_dec_t.records_written),
        },
        "spec": spec_json(n),
    }

    totals = {
        "memory_bytes": {k: (None if v is None else v * batch) for k, v in req["memory_bytes"].items()},
        "conventional_decode_bytes_per_step": _num(batch * n * conv_dec),
        "replayssm_decode_bytes_per_step": _num(batch * n * rep_dec),
    }
    notes.append(
        "forced flushes at radix-cache block boundaries (one checkpoint write per cache block) "
        "are not counted"
    )
    return Plan(
        model=model, shard=sh, batch=batch, T=T, L=L, cap=cap, state_dtype=state_dtype,
        state_dtype_source=src, read_dtype=read_dtype, record_dtype=record_dtype,
        per_layer=layer, per_request=req, batch_totals=totals, notes=notes,
    )


# --- text output ----------------------------------------------------------------------------------

def human(n: float | int | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B" if n == int(n) else f"{n:.1f} B"


def format_plan(p: Plan) -> str:
    m, sh, lay, req = p.model, p.shard, p.per_layer, p.per_request
    kind = "GDN (Gated DeltaNet)" if m.kind == "gdn" else "KDA (Kimi Delta Attention)"
    out = []
    out.append(f"{m.family} ({m.model_type}), {kind}: {m.num_linear_layers} of {m.num_hidden_layers} "
               f"layers are linear attention ({m.layer_rule})")
    out.append(f"heads: H={m.H} key, HV={m.HV} value, K={m.K}, V={m.V}, conv kernel {m.conv_kernel}; "
               f"TP={sh.tp} -> H={sh.H}, HV={sh.HV} per rank")
    rd = p.read_dtype if p.read_dtype == "same" else f"{p.read_dtype} read copy"
    out.append(f"settings: L={p.L}, T={p.T}, batch={p.batch}, state {p.state_dtype} "
               f"({p.state_dtype_source}), records {p.record_dtype}, read: {rd}")
    cap_note = "" if p.cap == p.L + p.T else f" (not L+T={p.L + p.T}: the pre-step fold keeps h+T <= L)"
    out.append(f"ring capacity: {p.cap} records{cap_note}")
    out.append("")
    out.append(f"{'memory':<44}{'per layer':>14}{f'per request ({m.num_linear_layers} layers)':>28}")
    rows = [
        ("recurrent state [HV,V,K]", lay["state_bytes"], req["state_bytes"]),
    ]
    if lay["read_copy_bytes"]:
        rows.append((f"read copy ({p.read_dtype})", lay["read_copy_bytes"], req["read_copy_bytes"]))
    rows += [
        (f"ring record (one token)", lay["record_bytes"], lay["record_bytes"] * m.num_linear_layers),
        (f"ring ({p.cap} records + h)", lay["ring_bytes"], req["ring_bytes"]),
        ("conv window (bf16, not in totals below)", lay["conv_bytes"], req["conv_bytes"]),
    ]
    for name, a, b in rows:
        out.append(f"  {name:<42}{human(a):>14}{human(b):>28}")
    mem = req["memory_bytes"]
    out.append(f"  {'conventional decode: 1 state':<42}{'':>14}{human(mem['conventional_decode']):>28}")
    if p.T > 1:
        out.append(f"  {f'conventional spec: 1 + T={p.T} states':<42}{'':>14}{human(mem['conventional_spec']):>28}")
    rep_name = "ReplaySSM: checkpoint + ring" + (" + read copy" if lay["read_copy_bytes"] else "")
    out.append(f"  {rep_name:<42}{'':>14}{human(mem['replayssm']):>28}")
    out.append("")
    out.append("state traffic per committed token, per request (recurrent state + ring, no conv window):")
    out.append(f"  {'path':<42}{'bytes/token':>14}{'ceiling speedup':>18}")
    out.append(f"  {'conventional decode':<42}{human(req['conventional_decode_bytes_per_token']):>14}{'1.00x':>18}")
    out.append(f"  {f'ReplaySSM decode (L={p.L})':<42}{human(req['replayssm_decode_bytes_per_token']):>14}"
               f"{req['decode_ceiling_speedup']:>17.2f}x")
    if req["replayssm_decode_bytes_per_token_predecayed"] is not None:
        out.append(f"  {'  with predecayed KDA keys (the default)':<42}"
                   f"{human(req['replayssm_decode_bytes_per_token_predecayed']):>14}"
                   f"{req['decode_ceiling_speedup_predecayed']:>17.2f}x")
    if req["spec"]:
        for case, label in (("all_accepted", "all accepted"), ("all_rejected", "all rejected")):
            d = req["spec"][case]
            out.append(f"  {f'conventional spec verify T={p.T}, {label}':<42}"
                       f"{human(d['conventional_spec_bytes_per_token']):>14}{'1.00x':>18}")
            out.append(f"  {f'ReplaySSM spec verify T={p.T}, {label}':<42}"
                       f"{human(d['replayssm_spec_bytes_per_token']):>14}{d['ceiling_speedup']:>17.2f}x")
    out.append("  (speedup = conventional bytes / ReplaySSM bytes for the same path: a bandwidth-bound "
               "ceiling for the SSM kernels, not for the whole model)")
    out.append("")
    tot = p.batch_totals
    out.append(f"batch of {p.batch}: memory conventional {human(tot['memory_bytes']['conventional_decode'])}, "
               + (f"conventional spec {human(tot['memory_bytes']['conventional_spec'])}, " if p.T > 1 else "")
               + f"ReplaySSM {human(tot['memory_bytes']['replayssm'])}; per decode step "
               f"{human(tot['conventional_decode_bytes_per_step'])} conventional vs "
               f"{human(tot['replayssm_decode_bytes_per_step'])} ReplaySSM")
    if p.notes:
        out.append("")
        out.append("notes:")
        for n in p.notes:
            out.append(f"  - {n}")
    return "\n".join(out)


# --- CLI ------------------------------------------------------------------------------------------

HELP_EPILOG = """\
Bytes model (per linear layer, per request; see docs/design.md, "Bytes model"):
  S = HV/tp * V * K * state-dtype bytes   the recurrent state (no conv window)
  R = ring.RingLayout.record_bytes()      one ring record: u (V per value head), k (K per key
                                           head), fp32 cumulative log-decay (1 or K per value head)
  conventional decode       = 2 S                      (read + write every token)
  ReplaySSM decode          = S + S/L + (L-1)/2 R + R  (checkpoint read, one write per L tokens,
                                           the mean h over a window h = 0..L-1 records read, one
                                           record written)
  conventional spec verify  = (T + 3) S / a            (read, T per-draft snapshots, commit copy;
                                           a = tokens accepted per step, bonus included)
  ReplaySSM spec verify     = averaged over the cycle of h that ring.py's rule produces:
                              S per step + R * h read + T R written + S per fold
  with --read-dtype bf16|fp8_e4m3 (two-precision state): a step that writes no checkpoint reads
  the read copy (Sr) instead of S; a fold reads S and writes S and Sr. Sr = HV/tp * V * K * 2
  (bf16) or HV/tp * V * K + HV/tp * V * 4 (fp8 e4m3 codes + one fp32 scale per value-head row).
Ring capacity is ring.ring_capacity(L, T) = L records (the pre-step fold keeps h + T <= L).
--tp is the attention TP size (tp_size / dp_size under DP attention).
"""


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "plan",
        help="memory and state traffic of a GDN/KDA model under ReplaySSM vs conventional decode",
        description=(
            "From a Hugging Face config.json of a GDN (Qwen3-Next, Qwen3.5) or KDA (Kimi-Linear)\n"
            "model: per layer and per request, the recurrent state, the ring, memory per request,\n"
            "and the state bytes moved per committed token by conventional decode, conventional\n"
            "speculative verify and ReplaySSM, with the ceiling speedup this implies."
        ),
        epilog=HELP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    configure_parser(p)
    p.set_defaults(func=run)
    return p


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="config.json of the model (or the folder holding it)")
    p.add_argument("--batch", type=int, default=1, help="requests decoded together (default 1)")
    p.add_argument("--spec-tokens", type=int, default=1,
                   help="tokens per verify step T (SGLang's --speculative-num-draft-tokens); 1 = no "
                        "speculative decoding (default 1)")
    p.add_argument("--cache-len", type=int, default=16,
                   help="ring length L (--linear-replayssm-cache-len, default 16)")
    p.add_argument("--state-dtype", default=None,
                   help="recurrent state dtype: float32|bfloat16|float16 (default: the config's "
                        "mamba_ssm_dtype, else float32, as SGLang)")
    p.add_argument("--read-dtype", default="same", choices=READ_DTYPES,
                   help="dtype of a separate read copy of the checkpoint (two-precision state); "
                        "same = no read copy (default)")
    p.add_argument("--record-dtype", default="float32",
                   help="dtype of the ring's u and k records: float32|bfloat16 (default float32)")
    p.add_argument("--tp", type=int, default=1, help="attention tensor-parallel size (default 1)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    import sys

    try:
        model = load_config(args.config)
        plan = make_plan(
            model,
            batch=args.batch,
            spec_tokens=args.spec_tokens,
            cache_len=args.cache_len,
            state_dtype=args.state_dtype,
            read_dtype=args.read_dtype,
            record_dtype=args.record_dtype,
            tp=args.tp,
        )
    except PlanError as e:
        print(f"replayssm-sglang plan: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(plan.to_json(), indent=2, sort_keys=False))
    else:
        print(format_plan(plan))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run plan alone (``python -m replayssm_sglang.plan``); the CLI registers it as a subcommand."""
    parser = argparse.ArgumentParser(prog="replayssm-sglang-plan", epilog=HELP_EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

#!/usr/bin/env python3
"""Offline, deterministic random-weight checkpoints (Hugging Face format) that SGLang 0.5.17 loads.

    python scripts/make_tiny_model.py --arch qwen3_next  --out /tmp/models/gdn
    python scripts/make_tiny_model.py --arch kimi_linear --out /tmp/models/kda

Writes config.json, model.safetensors (+ index), generation_config.json, tokenizer.json and
tokenizer_config.json (a byte-level BPE trained here on generated text: no hub access).

Shapes: the linear-attention layers keep the real serving shapes (GDN: H=16, HV=32, K=V=128 as in
Qwen3-Next TP1; KDA: H=HV=32, K=V=128 as in Kimi-Linear TP1) and the real layer pattern (3 linear : 1
full attention). The other widths are small (hidden 1024, 8 experts top-2, expert width 256, small
vocabulary) so that, as in real hybrid models at serving batch, the recurrent-state update is the
largest slice of a decode step at batch 256 (the end-to-end script measures that share).

Weight names follow what SGLang 0.5.17's loaders expect (sglang/srt/models/qwen3_next.py,
qwen3_next_mtp.py, kimi_linear.py, deepseek_v2.py for Kimi's MLA layers): the packed GDN projections
`in_proj_qkvz` / `in_proj_ba`, per-expert `experts.{e}.{gate,up,down}_proj` (Qwen) or `w1/w2/w3` (Kimi),
the MTP block under `mtp.*` (Qwen3-Next, for NEXTN speculative decoding).

Init: every tensor is drawn from its own torch.Generator seeded from (seed, tensor name), so the bytes
do not depend on generation order or thread count. Scales keep activations O(1): input projections
std 1/sqrt(fan_in), output projections additionally 1/sqrt(2 * layers), embeddings std 1, Gemma-style
norms (Qwen3-Next: x * (1 + w)) near 0, plain norms near 1, A_log = log U(1, 16), dt_bias = softplus^-1
of a log-uniform dt in [1e-3, 1e-1] (the usual SSM initialisation), lm_head scaled for logits of
std ~3 so greedy choices depend on the context rather than being flat or degenerate.

Two constructions (--init; same config, same tensor names, shapes and dtypes, so throughput is unaffected):

  decisive (default) -- greedy decoding with decisive next-token margins, for correctness comparisons.
      The plain random model above is chaotic: a relative 1e-6 change of the GDN decode outputs flips greedy
      tokens (scripts/sensitivity_probe.py, benchmarks/results/sensitivity-20261129.json), so token agreement
      cannot separate a correct kernel from a wrong one. Here
        * lm_head = (M / hidden) * E[succ^-1] - shift * u + beta * R: row succ(t) is token t's embedding, succ a
          seeded single cycle over the non-special tokens, so the token embedding in the residual stream votes
          for its successor by ~M (1 - a^2) = 9.75 nats over the other tokens' mean; every embedding carries a
          shared direction u (weight a = 0.5) through which lm_head shifts all logits so that the chosen one
          sits near `target` = 0 (logits are bf16 in SGLang and here: near 11 the ulp is 1/16, which alone moves
          a logprob by up to ~0.05; below 1 it is <= 1/128); R is random (std 1/sqrt(hidden)), so the layers'
          contributions to the residual stream move every logit by O(beta): logprobs depend on the context (and
          on the linear-attention outputs), the argmax does not. Outputs walk the cycle (varied, never repeating
          within ~4000 tokens), top-1/top-2 gap median ~5 nats, chosen-token probability ~0.3-0.8;
        * linear-attention out_proj (GDN out_proj, KDA o_proj) x linear_gain = 2 and the other output projections
          (full attention / MLA, experts, shared experts, dense MLP) x other_gain = 0.5, so the linear-attention
          outputs carry most of the context in the logits (a wrong kernel shows in the logprobs);
        * every MoE expert = sqrt(1 - d^2) * a shared base + d * its own noise (d = 0.05), so a routing flip
          (knife-edge top-k ties happen at any scale) changes the layer output by O(d), not O(1); the router
          stays random, so the expert load (and the fused-MoE cost) is as in the random model;
        * the MTP block's fc passes the next token's embedding through (identity on the embedding half, small
          random on the hidden half), so the NEXTN draft should predict succ(succ(t)) (acceptance not measured here).
  random -- the plain random construction (the checkpoints of the runs up to 2026-11-29; byte for byte on the same
            CPU: torch's CPU randn and log / exp round differently on different CPUs, tests/test_tiny_model.py).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
from pathlib import Path

import torch

# --------------------------------------------------------------------------------------------------
# tokenizer


def build_tokenizer(vocab_size: int, seed: int):
    """A byte-level BPE trained on seeded pseudo-words (deterministic; no downloads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(seed)
    syl = ["ka", "ri", "to", "mu", "sel", "van", "dor", "pi", "ne", "lu", "zo", "ta", "qua", "ber", "fin",
           "gro", "a", "e", "o", "st", "th", "ing", "er", "al", "on", "ex", "ul", "im", "pra", "cle"]
    words = ["".join(rng.choice(syl) for _ in range(rng.randint(1, 4))) for _ in range(4000)]
    words += [str(i) for i in range(100)] + list(".,;:!?()-'\"")
    text = [" ".join(rng.choice(words) for _ in range(40)) for _ in range(3000)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer=trainer)
    return tok


def write_tokenizer(out: Path, vocab_size: int, seed: int) -> int:
    tok = build_tokenizer(vocab_size, seed)
    (out / "tokenizer.json").write_text(tok.to_str(pretty=False))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 32768,
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "chat_template": (
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
        ),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (out / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}, indent=1) + "\n")
    return tok.get_vocab_size()


# --------------------------------------------------------------------------------------------------
# weights


class Weights:
    """Collects tensors; each drawn from a generator seeded by (seed, name)."""

    def __init__(self, seed: int, dtype: torch.dtype):
        self.seed = seed
        self.dtype = dtype
        self.t: dict[str, torch.Tensor] = {}

    def _gen(self, name: str) -> torch.Generator:
        h = hashlib.sha256(f"{self.seed}:{name}".encode()).digest()
        g = torch.Generator()
        g.manual_seed(int.from_bytes(h[:8], "little") & ((1 << 63) - 1))
        return g

    def normal(self, name, shape, std, mean=0.0, dtype=None):
        x = torch.randn(*shape, generator=self._gen(name), dtype=torch.float32) * std + mean
        self.t[name] = x.to(dtype or self.dtype).contiguous()

    def uniform(self, name, shape, lo, hi, dtype=None):
        x = torch.rand(*shape, generator=self._gen(name), dtype=torch.float32) * (hi - lo) + lo
        self.t[name] = x.to(dtype or self.dtype).contiguous()

    def set(self, name, x, dtype=None):
        self.t[name] = x.to(dtype or self.dtype).contiguous()

    def a_log(self, name, shape):
        g = self._gen(name)
        self.t[name] = torch.log(torch.rand(*shape, generator=g) * 15 + 1).float().contiguous()

    def dt_bias(self, name, shape, dtype=None):
        g = self._gen(name)
        dt = torch.exp(torch.rand(*shape, generator=g) * (math.log(1e-1) - math.log(1e-3)) + math.log(1e-3))
        inv = dt + torch.log(-torch.expm1(-dt))  # softplus^-1
        self.t[name] = inv.to(dtype or self.dtype).contiguous()


def lin(w: Weights, name: str, out_f: int, in_f: int, scale: float = 1.0):
    w.normal(name, (out_f, in_f), scale / math.sqrt(in_f))


# ---- decisive construction ---------------------------------------------------------------------------

SPECIAL_TOKENS = 3  # <|endoftext|>, <|im_start|>, <|im_end|> (ids 0..2); never a successor
DECISIVE = {"margin": 13.0, "target": 0.0, "shared": 0.5, "beta": 1.0, "linear_gain": 2.0, "other_gain": 0.5,
            "expert_dev": 0.05, "mtp_hidden": 0.3}


def decisive_embed(w: Weights, vocab: int, h: int, d: dict) -> None:
    """E[t] = sqrt(1 - a^2) * e_t + a * u: a shared direction u (+-1 entries) that lm_head uses to shift every
    logit down, so the chosen token's logit sits near `target` (bf16 logits: a logit near 11 has a 1/16 ulp,
    which alone moves a logprob by up to ~0.05; near 3 the ulp is 1/64)."""
    e = torch.randn(vocab, h, generator=w._gen("model.embed_tokens.weight"), dtype=torch.float32)
    u = torch.randint(0, 2, (h,), generator=w._gen("model.embed_tokens.weight:u")).float() * 2 - 1
    a = d["shared"]
    w.set("model.embed_tokens.weight", math.sqrt(1 - a * a) * e + a * u)


def successor(vocab: int, seed: int) -> list[int]:
    """succ[t]: a seeded single cycle over tokens SPECIAL_TOKENS..vocab-1; special token t -> order[t]."""
    order = list(range(SPECIAL_TOKENS, vocab))
    random.Random(f"succ:{seed}:{vocab}").shuffle(order)
    succ = [0] * vocab
    for i, t in enumerate(order):
        succ[t] = order[(i + 1) % len(order)]
    for t in range(SPECIAL_TOKENS):
        succ[t] = order[t]
    return succ


def decisive_lm_head(w: Weights, c: dict, d: dict) -> None:
    """lm_head[v] = (M / h) * sum_{t: succ(t) = v} E[t] - ((M - T) / (a h)) * u + beta * R[v] (E from
    decisive_embed): for a unit-rms residual E[t], logit succ(t) ~ T, the others ~ T - M (1 - a^2) +- beta."""
    h, vocab = c["hidden_size"], c["vocab_size"]
    emb = w.t["model.embed_tokens.weight"].float()
    u = torch.randint(0, 2, (h,), generator=w._gen("model.embed_tokens.weight:u")).float() * 2 - 1
    succ = torch.tensor(successor(vocab, w.seed))
    head = torch.zeros(vocab, h)
    head.index_add_(0, succ, emb * (d["margin"] / h))
    head -= u * ((d["margin"] - d["target"]) / (d["shared"] * h))
    r = torch.randn(vocab, h, generator=w._gen("lm_head.weight:R"), dtype=torch.float32) / math.sqrt(h)
    w.set("lm_head.weight", head + d["beta"] * r)


def expert_lin(w: Weights, name: str, base: str, out_f: int, in_f: int, scale: float, dev: float | None):
    """An expert weight; with dev set, sqrt(1 - dev^2) * (shared base) + dev * (own noise)."""
    if dev is None:
        return lin(w, name, out_f, in_f, scale)
    std = scale / math.sqrt(in_f)
    b = torch.randn(out_f, in_f, generator=w._gen(base), dtype=torch.float32)
    e = torch.randn(out_f, in_f, generator=w._gen(name), dtype=torch.float32)
    w.set(name, (math.sqrt(1 - dev * dev) * b + dev * e) * std)


# ---- Qwen3-Next (GDN) ------------------------------------------------------------------------------

def qwen3_next_config(a, vocab: int) -> dict:
    n = a.layers
    interval = 4
    return {
        "architectures": ["Qwen3NextForCausalLM"],
        "model_type": "qwen3_next",
        "torch_dtype": "bfloat16",
        "vocab_size": vocab,
        "hidden_size": a.hidden,
        "intermediate_size": a.moe_inter * 2,
        "num_hidden_layers": n,
        "full_attention_interval": interval,
        "layer_types": ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n)],
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "partial_rotary_factor": 0.25,
        "rope_theta": 10000000.0,
        "max_position_embeddings": 32768,
        "attn_output_gate": True,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_experts": a.experts,
        "num_experts_per_tok": a.topk,
        "moe_intermediate_size": a.moe_inter,
        "shared_expert_intermediate_size": a.moe_inter,
        "norm_topk_prob": True,
        "tie_word_embeddings": False,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "initializer_range": 0.02,
        "use_cache": True,
    }


def _qwen_moe(w: Weights, p: str, c: dict, out_scale: float, dev: float | None = None):
    h, e, inter = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
    lin(w, f"{p}.mlp.gate.weight", e, h)
    for j in range(e):
        for x, o, i, sc in (("gate_proj", inter, h, 1.0), ("up_proj", inter, h, 1.0),
                            ("down_proj", h, inter, out_scale)):
            expert_lin(w, f"{p}.mlp.experts.{j}.{x}.weight", f"{p}.mlp.experts.base.{x}.weight", o, i, sc, dev)
    si = c["shared_expert_intermediate_size"]
    lin(w, f"{p}.mlp.shared_expert.gate_proj.weight", si, h)
    lin(w, f"{p}.mlp.shared_expert.up_proj.weight", si, h)
    lin(w, f"{p}.mlp.shared_expert.down_proj.weight", h, si, out_scale)
    lin(w, f"{p}.mlp.shared_expert_gate.weight", 1, h)


def _qwen_full_attn(w: Weights, p: str, c: dict, out_scale: float):
    h, nh, nkv, hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    lin(w, f"{p}.self_attn.q_proj.weight", nh * hd * 2, h)  # query and output gate, interleaved per head
    lin(w, f"{p}.self_attn.k_proj.weight", nkv * hd, h)
    lin(w, f"{p}.self_attn.v_proj.weight", nkv * hd, h)
    lin(w, f"{p}.self_attn.o_proj.weight", h, nh * hd, out_scale)
    w.normal(f"{p}.self_attn.q_norm.weight", (hd,), 0.02)  # Gemma norm: x * (1 + w)
    w.normal(f"{p}.self_attn.k_norm.weight", (hd,), 0.02)


def _gemma_norms(w: Weights, p: str, h: int):
    w.normal(f"{p}.input_layernorm.weight", (h,), 0.02)
    w.normal(f"{p}.post_attention_layernorm.weight", (h,), 0.02)


def qwen3_next_weights(c: dict, seed: int, decisive: dict | None = None) -> dict[str, torch.Tensor]:
    w = Weights(seed, torch.bfloat16)
    dev = decisive["expert_dev"] if decisive else None
    h, n, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    lin_gain, oth_gain = (decisive["linear_gain"], decisive["other_gain"]) if decisive else (1.0, 1.0)
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    key_dim, value_dim = hk * dk, hv * dv
    out_scale = 1.0 / math.sqrt(2 * n)
    if decisive:
        decisive_embed(w, vocab, h, decisive)
    else:
        w.normal("model.embed_tokens.weight", (vocab, h), 1.0)
    for i in range(n):
        p = f"model.layers.{i}"
        _gemma_norms(w, p, h)
        if c["layer_types"][i] == "full_attention":
            _qwen_full_attn(w, p, c, out_scale * oth_gain)
        else:
            a = f"{p}.linear_attn"
            # packed per key-head group: [q(dk) k(dk) v(HV/H*dv) z(HV/H*dv)] x H; random, so the order is moot
            lin(w, f"{a}.in_proj_qkvz.weight", 2 * key_dim + 2 * value_dim, h)
            lin(w, f"{a}.in_proj_ba.weight", 2 * hv, h)
            w.uniform(f"{a}.conv1d.weight", (2 * key_dim + value_dim, 1, c["linear_conv_kernel_dim"]), -0.5, 0.5)
            w.dt_bias(f"{a}.dt_bias", (hv,))
            w.a_log(f"{a}.A_log", (hv,))
            w.normal(f"{a}.norm.weight", (dv,), 0.02, mean=1.0)  # plain (gated) RMSNorm weight
            lin(w, f"{a}.out_proj.weight", h, value_dim, out_scale * lin_gain)
        _qwen_moe(w, p, c, out_scale * oth_gain, dev)
    w.normal("model.norm.weight", (h,), 0.02)
    if decisive:
        decisive_lm_head(w, c, decisive)
    else:
        lin(w, "lm_head.weight", vocab, h, 3.0)
    # MTP block (NEXTN draft): fc over [norm(embed), norm(hidden)], one full-attention layer + MoE, norm.
    # Embeddings and lm_head are shared with the target model (mtp_use_dedicated_embeddings = false).
    if decisive:  # the embedding half passes through: the draft's residual stream starts at E[next token]
        r = torch.randn(h, h, generator=w._gen("mtp.fc.weight"), dtype=torch.float32)
        w.set("mtp.fc.weight", torch.cat([torch.eye(h), r * (decisive["mtp_hidden"] / math.sqrt(h))], dim=1))
    else:
        lin(w, "mtp.fc.weight", h, 2 * h)
    w.normal("mtp.pre_fc_norm_embedding.weight", (h,), 0.02)
    w.normal("mtp.pre_fc_norm_hidden.weight", (h,), 0.02)
    p = "mtp.layers.0"
    _gemma_norms(w, p, h)
    _qwen_full_attn(w, p, c, out_scale * oth_gain)
    _qwen_moe(w, p, c, out_scale * oth_gain, dev)
    w.normal("mtp.norm.weight", (h,), 0.02)
    return w.t


# ---- Kimi-Linear (KDA) -----------------------------------------------------------------------------

def kimi_linear_config(a, vocab: int) -> dict:
    n = a.layers
    full = [i for i in range(1, n + 1) if i % 4 == 0]  # 1-based, as in Kimi-Linear's config
    if n not in full:
        full.append(n)  # Kimi-Linear ends on a full-attention (MLA) layer
    kda = [i for i in range(1, n + 1) if i not in full]
    return {
        "architectures": ["KimiLinearForCausalLM"],
        "model_type": "kimi_linear",
        "torch_dtype": "bfloat16",
        "vocab_size": vocab,
        "hidden_size": a.hidden,
        "intermediate_size": a.moe_inter * 2,
        "num_hidden_layers": n,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "head_dim": a.hidden // 32,  # Kimi: hidden / attention heads (MLA uses its own qk/v dims)
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 32768,
        "q_lora_rank": None,
        "kv_lora_rank": 512,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "mla_use_nope": True,
        "num_experts": a.experts,
        "num_experts_per_token": a.topk,
        "moe_intermediate_size": a.moe_inter,
        "num_shared_experts": 1,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "moe_renormalize": True,
        "moe_router_activation_func": "sigmoid",
        "routed_scaling_factor": 1.0,
        "use_grouped_topk": True,
        "num_expert_group": 1,
        "topk_group": 1,
        "topk_method": "noaux_tc",
        "linear_attn_config": {
            "full_attn_layers": full,
            "kda_layers": kda,
            "head_dim": 128,
            "num_heads": 32,
            "short_conv_kernel_size": 4,
        },
        "tie_word_embeddings": False,
        "bos_token_id": None,
        "eos_token_id": 0,
        "pad_token_id": 0,
        "initializer_range": 0.02,
        "use_cache": True,
    }


def kimi_linear_weights(c: dict, seed: int, decisive: dict | None = None) -> dict[str, torch.Tensor]:
    w = Weights(seed, torch.bfloat16)
    dev = decisive["expert_dev"] if decisive else None
    h, n, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    lin_gain, oth_gain = (decisive["linear_gain"], decisive["other_gain"]) if decisive else (1.0, 1.0)
    la = c["linear_attn_config"]
    nh, dh, ks = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
    proj = nh * dh
    out_scale = 1.0 / math.sqrt(2 * n)
    if decisive:
        decisive_embed(w, vocab, h, decisive)
    else:
        w.normal("model.embed_tokens.weight", (vocab, h), 1.0)
    for i in range(n):
        p = f"model.layers.{i}"
        w.normal(f"{p}.input_layernorm.weight", (h,), 0.02, mean=1.0)
        w.normal(f"{p}.post_attention_layernorm.weight", (h,), 0.02, mean=1.0)
        s = f"{p}.self_attn"
        if (i + 1) in la["kda_layers"]:
            for x in ("q", "k", "v"):
                lin(w, f"{s}.{x}_proj.weight", proj, h)
                w.uniform(f"{s}.{x}_conv1d.weight", (proj, 1, ks), -0.5, 0.5, dtype=torch.float32)
            lin(w, f"{s}.b_proj.weight", nh, h)
            lin(w, f"{s}.f_a_proj.weight", dh, h)
            lin(w, f"{s}.f_b_proj.weight", proj, dh)
            lin(w, f"{s}.g_a_proj.weight", dh, h)
            lin(w, f"{s}.g_b_proj.weight", proj, dh)
            w.a_log(f"{s}.A_log", (1, 1, nh, 1))
            w.dt_bias(f"{s}.dt_bias", (proj,), dtype=torch.float32)
            w.normal(f"{s}.o_norm.weight", (dh,), 0.02, mean=1.0)
            lin(w, f"{s}.o_proj.weight", h, proj, out_scale * lin_gain)
        else:  # MLA (DeepseekV2AttentionMLA with q_lora_rank = None, no rope: mla_use_nope)
            nope, rope, vd, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
            na = c["num_attention_heads"]
            lin(w, f"{s}.q_proj.weight", na * (nope + rope), h)
            lin(w, f"{s}.kv_a_proj_with_mqa.weight", r + rope, h)
            w.normal(f"{s}.kv_a_layernorm.weight", (r,), 0.02, mean=1.0)
            lin(w, f"{s}.kv_b_proj.weight", na * (nope + vd), r)
            lin(w, f"{s}.o_proj.weight", h, na * vd, out_scale * oth_gain)
        if i >= c["first_k_dense_replace"]:
            m = f"{p}.block_sparse_moe"
            e, inter = c["num_experts"], c["moe_intermediate_size"]
            lin(w, f"{m}.gate.weight", e, h)
            w.set(f"{m}.gate.e_score_correction_bias", torch.zeros(e), dtype=torch.float32)
            for j in range(e):
                for x, o, ii, sc in (("w1", inter, h, 1.0), ("w3", inter, h, 1.0), ("w2", h, inter, out_scale)):
                    expert_lin(w, f"{m}.experts.{j}.{x}.weight", f"{m}.experts.base.{x}.weight", o, ii,
                               sc * (oth_gain if x == "w2" else 1.0), dev)
            si = inter * c["num_shared_experts"]
            lin(w, f"{m}.shared_experts.gate_proj.weight", si, h)
            lin(w, f"{m}.shared_experts.up_proj.weight", si, h)
            lin(w, f"{m}.shared_experts.down_proj.weight", h, si, out_scale * oth_gain)
        else:
            inter = c["intermediate_size"]
            lin(w, f"{p}.mlp.gate_proj.weight", inter, h)
            lin(w, f"{p}.mlp.up_proj.weight", inter, h)
            lin(w, f"{p}.mlp.down_proj.weight", h, inter, out_scale * oth_gain)
    w.normal("model.norm.weight", (h,), 0.02, mean=1.0)
    if decisive:
        decisive_lm_head(w, c, decisive)
    else:
        lin(w, "lm_head.weight", vocab, h, 3.0)
    return w.t


# --------------------------------------------------------------------------------------------------

ARCHS = {
    "qwen3_next": (qwen3_next_config, qwen3_next_weights),
    "kimi_linear": (kimi_linear_config, kimi_linear_weights),
}


def save_safetensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict) -> None:
    """Deterministic safetensors writer (sorted keys, fixed metadata); the format is simple enough."""
    import struct

    names = sorted(tensors)
    dt = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}
    header: dict = {"__metadata__": metadata}
    off = 0
    blobs = []
    for k in names:
        t = tensors[k].contiguous()
        b = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else t.numpy().tobytes()
        header[k] = {"dtype": dt[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    hb = json.dumps(header, separators=(",", ":")).encode()
    hb += b" " * ((8 - len(hb) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hb)))
        f.write(hb)
        for b in blobs:
            f.write(b)


INITS = ("decisive", "random")


def make(arch: str, out: Path, seed: int = 0, layers: int = 24, hidden: int = 1024, experts: int = 8,
         topk: int = 2, moe_inter: int = 256, vocab: int = 4096, init: str = "decisive",
         decisive: dict | None = None) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    real_vocab = write_tokenizer(out, vocab, seed)
    args = argparse.Namespace(layers=layers, hidden=hidden, experts=experts, topk=topk, moe_inter=moe_inter)
    cfg_fn, w_fn = ARCHS[arch]
    cfg = cfg_fn(args, max(vocab, real_vocab))
    if init not in INITS:
        raise ValueError(f"init {init!r} not in {INITS}")
    dec = {**DECISIVE, **(decisive or {})} if init == "decisive" else None
    tensors = w_fn(cfg, seed, dec)
    save_safetensors(tensors, out / "model.safetensors", {"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": {k: "model.safetensors" for k in sorted(tensors)}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": 0, "pad_token_id": 0, "do_sample": False}, indent=1) + "\n")
    return {"arch": arch, "init": init, **({"decisive": dec} if dec else {}), "tensors": len(tensors),
            "bytes": total, "params": sum(t.numel() for t in tensors.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", choices=sorted(ARCHS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=24, help="total layers (3 linear : 1 full attention)")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--topk", type=int, default=2)
    ap.add_argument("--moe-inter", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--init", choices=INITS, default="decisive",
                    help="decisive: successor-permutation lm_head, near-shared experts, pass-through MTP fc "
                         "(decisive greedy margins; the correctness default); random: the plain random weights")
    for k, v in DECISIVE.items():
        ap.add_argument(f"--{k.replace('_', '-')}", type=float, default=v, help=f"decisive init: {k} (default {v})")
    a = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    info = make(a.arch, a.out, a.seed, a.layers, a.hidden, a.experts, a.topk, a.moe_inter, a.vocab, a.init,
                {k: getattr(a, k) for k in DECISIVE})
    print(json.dumps(info))


if __name__ == "__main__":
    main()

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


def _qwen_moe(w: Weights, p: str, c: dict, out_scale: float):
    h, e, inter = c["hidden_size"], c["num_experts"], c["moe_intermediate_size"]
    lin(w, f"{p}.mlp.gate.weight", e, h)
    for j in range(e):
        lin(w, f"{p}.mlp.experts.{j}.gate_proj.weight", inter, h)
        lin(w, f"{p}.mlp.experts.{j}.up_proj.weight", inter, h)
        lin(w, f"{p}.mlp.experts.{j}.down_proj.weight", h, inter, out_scale)
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


def qwen3_next_weights(c: dict, seed: int) -> dict[str, torch.Tensor]:
    w = Weights(seed, torch.bfloat16)
    h, n, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
    dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
    key_dim, value_dim = hk * dk, hv * dv
    out_scale = 1.0 / math.sqrt(2 * n)
    w.normal("model.embed_tokens.weight", (vocab, h), 1.0)
    for i in range(n):
        p = f"model.layers.{i}"
        _gemma_norms(w, p, h)
        if c["layer_types"][i] == "full_attention":
            _qwen_full_attn(w, p, c, out_scale)
        else:
            a = f"{p}.linear_attn"
            # packed per key-head group: [q(dk) k(dk) v(HV/H*dv) z(HV/H*dv)] x H; random, so the order is moot
            lin(w, f"{a}.in_proj_qkvz.weight", 2 * key_dim + 2 * value_dim, h)
            lin(w, f"{a}.in_proj_ba.weight", 2 * hv, h)
            w.uniform(f"{a}.conv1d.weight", (2 * key_dim + value_dim, 1, c["linear_conv_kernel_dim"]), -0.5, 0.5)
            w.dt_bias(f"{a}.dt_bias", (hv,))
            w.a_log(f"{a}.A_log", (hv,))
            w.normal(f"{a}.norm.weight", (dv,), 0.02, mean=1.0)  # plain (gated) RMSNorm weight
            lin(w, f"{a}.out_proj.weight", h, value_dim, out_scale)
        _qwen_moe(w, p, c, out_scale)
    w.normal("model.norm.weight", (h,), 0.02)
    lin(w, "lm_head.weight", vocab, h, 3.0)
    # MTP block (NEXTN draft): fc over [norm(embed), norm(hidden)], one full-attention layer + MoE, norm.
    # Embeddings and lm_head are shared with the target model (mtp_use_dedicated_embeddings = false).
    lin(w, "mtp.fc.weight", h, 2 * h)
    w.normal("mtp.pre_fc_norm_embedding.weight", (h,), 0.02)
    w.normal("mtp.pre_fc_norm_hidden.weight", (h,), 0.02)
    p = "mtp.layers.0"
    _gemma_norms(w, p, h)
    _qwen_full_attn(w, p, c, out_scale)
    _qwen_moe(w, p, c, out_scale)
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


def kimi_linear_weights(c: dict, seed: int) -> dict[str, torch.Tensor]:
    w = Weights(seed, torch.bfloat16)
    h, n, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    la = c["linear_attn_config"]
    nh, dh, ks = la["num_heads"], la["head_dim"], la["short_conv_kernel_size"]
    proj = nh * dh
    out_scale = 1.0 / math.sqrt(2 * n)
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
            lin(w, f"{s}.o_proj.weight", h, proj, out_scale)
        else:  # MLA (DeepseekV2AttentionMLA with q_lora_rank = None, no rope: mla_use_nope)
            nope, rope, vd, r = c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"], c["kv_lora_rank"]
            na = c["num_attention_heads"]
            lin(w, f"{s}.q_proj.weight", na * (nope + rope), h)
            lin(w, f"{s}.kv_a_proj_with_mqa.weight", r + rope, h)
            w.normal(f"{s}.kv_a_layernorm.weight", (r,), 0.02, mean=1.0)
            lin(w, f"{s}.kv_b_proj.weight", na * (nope + vd), r)
            lin(w, f"{s}.o_proj.weight", h, na * vd, out_scale)
        if i >= c["first_k_dense_replace"]:
            m = f"{p}.block_sparse_moe"
            e, inter = c["num_experts"], c["moe_intermediate_size"]
            lin(w, f"{m}.gate.weight", e, h)
            w.set(f"{m}.gate.e_score_correction_bias", torch.zeros(e), dtype=torch.float32)
            for j in range(e):
                lin(w, f"{m}.experts.{j}.w1.weight", inter, h)
                lin(w, f"{m}.experts.{j}.w3.weight", inter, h)
                lin(w, f"{m}.experts.{j}.w2.weight", h, inter, out_scale)
            si = inter * c["num_shared_experts"]
            lin(w, f"{m}.shared_experts.gate_proj.weight", si, h)
            lin(w, f"{m}.shared_experts.up_proj.weight", si, h)
            lin(w, f"{m}.shared_experts.down_proj.weight", h, si, out_scale)
        else:
            inter = c["intermediate_size"]
            lin(w, f"{p}.mlp.gate_proj.weight", inter, h)
            lin(w, f"{p}.mlp.up_proj.weight", inter, h)
            lin(w, f"{p}.mlp.down_proj.weight", h, inter, out_scale)
    w.normal("model.norm.weight", (h,), 0.02, mean=1.0)
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


def make(arch: str, out: Path, seed: int = 0, layers: int = 24, hidden: int = 1024, experts: int = 8,
         topk: int = 2, moe_inter: int = 256, vocab: int = 4096) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    real_vocab = write_tokenizer(out, vocab, seed)
    args = argparse.Namespace(layers=layers, hidden=hidden, experts=experts, topk=topk, moe_inter=moe_inter)
    cfg_fn, w_fn = ARCHS[arch]
    cfg = cfg_fn(args, max(vocab, real_vocab))
    tensors = w_fn(cfg, seed)
    save_safetensors(tensors, out / "model.safetensors", {"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": {k: "model.safetensors" for k in sorted(tensors)}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": 0, "pad_token_id": 0, "do_sample": False}, indent=1) + "\n")
    return {"arch": arch, "tensors": len(tensors), "bytes": total,
            "params": sum(t.numel() for t in tensors.values())}


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
    a = ap.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    info = make(a.arch, a.out, a.seed, a.layers, a.hidden, a.experts, a.topk, a.moe_inter, a.vocab)
    print(json.dumps(info))


if __name__ == "__main__":
    main()

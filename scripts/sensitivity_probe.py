#!/usr/bin/env python3
"""How sensitive is the tiny random-weight Qwen3-Next model's greedy text to fp32-rounding-size noise in the
Gated DeltaNet (GDN) outputs?  CPU, Hugging Face transformers (torch fallbacks for the GDN kernels), no hub.

    python scripts/make_tiny_model.py --arch qwen3_next --out /tmp/tiny_gdn
    python scripts/sensitivity_probe.py --model /tmp/tiny_gdn --prompts 8 --eps 1e-6,1e-4 \
        --out benchmarks/results/sensitivity-20261129.json

Arms (each is a greedy decode of --new-tokens tokens per prompt, KV/recurrent cache on, top-5 logprobs):
  baseline          -- the model as transformers runs it (bf16 weights and activations)
  perturbed_<eps>   -- every GDN layer's *decode* output (the core gated-delta-rule output, before the gated
                       RMSNorm and out_proj; the recurrent step that SGLang's decode kernel computes) is
                       multiplied in fp32 by (1 + eps * s), s = +1/-1 alternating along the value dim, and
                       only then rounded to the activation dtype (as a kernel writes its fp32 result to bf16).
                       With --perturb-prefill the chunked prefill output is perturbed too.
  baseline_repeat   -- baseline again; must be bit-identical to baseline (determinism check).
Each arm is compared to baseline with scripts/gpu_e2e.py's compare(); for the perturbed arms also the
fraction of (MoE layer, decode step) pairs on the common prefix whose top-k expert set differs from baseline.

The probe perturbs by a relative eps; it does not run our kernel. The GDN output is produced by a wrapper
that calls transformers' torch_recurrent_gated_delta_rule in fp32 and casts afterwards; with eps = 0 this is
bit-identical to the stock path (checked at start-up on the first prompt).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_e2e import compare, prompt_set  # noqa: E402


class Perturb:
    """Shared switch read by the GDN wrappers."""

    eps = 0.0
    prefill = False


def _sign(n: int, device) -> torch.Tensor:
    s = torch.ones(n, dtype=torch.float32, device=device)
    s[1::2] = -1.0
    return s


def _scale(o: torch.Tensor) -> torch.Tensor:
    """o: fp32 kernel output [B, T, HV, V]; multiply by (1 + eps * s) in fp32."""
    if Perturb.eps == 0.0:
        return o
    return o * (1.0 + Perturb.eps * _sign(o.shape[-1], o.device))


def install_gdn_wrappers(model, mod) -> int:
    """Replace each GDN module's recurrent/chunk rule by an fp32-output wrapper that perturbs, then casts."""
    n = 0
    for m in model.modules():
        if type(m).__name__ != "Qwen3NextGatedDeltaNet":
            continue
        rec, chunk = m.recurrent_gated_delta_rule, m.chunk_gated_delta_rule

        def make(fn, is_decode):
            def wrapped(query, key, value, g, beta, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, **kw):
                dt = query.dtype
                if use_qk_l2norm_in_kernel:  # as the stock function does it: in the input dtype
                    query = mod.l2norm(query, dim=-1, eps=1e-6)
                    key = mod.l2norm(key, dim=-1, eps=1e-6)
                # the stock function casts q, k, v, beta, g to fp32 first; doing it here is exact
                o, s = fn(query.float(), key.float(), value.float(), g.float(), beta.float(),
                          initial_state=initial_state, output_final_state=output_final_state,
                          use_qk_l2norm_in_kernel=False, **kw)
                if is_decode or Perturb.prefill:
                    o = _scale(o)
                return o.to(dt), s
            return wrapped

        m.recurrent_gated_delta_rule = make(rec, True)
        m.chunk_gated_delta_rule = make(chunk, False)
        m._stock_rules = (rec, chunk)
        n += 1
    return n


class RouterLog:
    """Records the top-k expert set of the last position at each MoE router call."""

    def __init__(self, model):
        self.calls: list[list[int]] = []
        self.handles = []
        for m in model.modules():
            if type(m).__name__ == "Qwen3NextTopKRouter":
                self.handles.append(m.register_forward_hook(self._hook))
        self.n_routers = len(self.handles)

    def _hook(self, module, inp, out):
        idx = out[2]  # (tokens, top_k)
        self.calls.append(sorted(idx[-1].tolist()))


@torch.no_grad()
def greedy(model, prompt: list[int], new_tokens: int, top: int, rlog: RouterLog | None):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    ids = torch.tensor([prompt])
    toks, lps, tops, routes = [], [], [], []
    for step in range(new_tokens):
        if rlog is not None:
            rlog.calls = []
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        logp = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
        t = int(torch.argmax(logp))
        tv, ti = torch.topk(logp, top)
        toks.append(t)
        lps.append(float(logp[t]))
        tops.append([(int(i), float(v)) for v, i in zip(tv, ti)])
        if rlog is not None:
            routes.append(rlog.calls)
        ids = torch.tensor([[t]])
    return {"tokens": toks, "logprobs": lps, "top": tops, "routes": routes}


def route_flips(ref: list[dict], got: list[dict]) -> dict:
    """(layer, decode step) pairs with identical inputs (step k processes token k-1; inputs equal iff k <= p,
    p = common prefix) whose top-k expert set differs."""
    diff = total = first_layers = 0
    per_step_first = []
    for a, b in zip(ref, got):
        n = min(len(a["tokens"]), len(b["tokens"]))
        p = 0
        while p < n and a["tokens"][p] == b["tokens"][p]:
            p += 1
        for k in range(1, min(p, n - 1) + 1):  # decode forwards only (prefill forward 0 is not perturbed)
            ra, rb = a["routes"][k], b["routes"][k]
            d = [i for i, (x, y) in enumerate(zip(ra, rb)) if x != y]
            total += len(ra)
            diff += len(d)
            if d:
                per_step_first.append(d[0])
    return {"route_pairs_compared": total, "route_pairs_different": diff,
            "route_flip_fraction": diff / max(total, 1),
            "first_flipped_layer_hist": {str(l): per_step_first.count(l) for l in sorted(set(per_step_first))}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="/tmp/tiny_gdn")
    ap.add_argument("--prompts", type=int, default=8, help="first N of gpu_e2e.prompt_set (lengths 8..)")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--eps", default="1e-6", help="comma-separated relative perturbations")
    ap.add_argument("--perturb-prefill", action="store_true")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="benchmarks/results/sensitivity-20261129.json")
    a = ap.parse_args()

    import transformers
    from transformers import AutoModelForCausalLM
    import transformers.models.qwen3_next.modeling_qwen3_next as mod

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    t0 = time.time()
    dtype = getattr(torch, a.dtype)
    model, info = AutoModelForCausalLM.from_pretrained(a.model, dtype=dtype, local_files_only=True,
                                                       output_loading_info=True)
    model.eval()
    missing = list(info.get("missing_keys", []))
    mism = list(info.get("mismatched_keys", []))
    unexpected = sorted(info.get("unexpected_keys", []))
    if missing or mism:
        raise SystemExit(f"weights did not load: missing {missing[:10]} mismatched {mism[:10]}")
    if any(not k.startswith("mtp.") for k in unexpected):
        raise SystemExit(f"unexpected non-MTP keys: {[k for k in unexpected if not k.startswith('mtp.')][:10]}")
    print(f"loaded in {time.time() - t0:.1f}s; fast path (fla/causal_conv1d): {mod.is_fast_path_available}; "
          f"unexpected keys (MTP, unused by transformers): {len(unexpected)}", flush=True)

    vocab = model.config.vocab_size
    prompts = prompt_set(vocab, n=a.prompts)
    eps_list = [float(x) for x in a.eps.split(",") if x]

    # check: the eps=0 wrapper is bit-identical to the stock GDN path (prefill + 2 decode steps, prompt 0)
    ref_stock = greedy(model, prompts[0], 3, a.top, None)
    n_gdn = install_gdn_wrappers(model, mod)
    rlog = RouterLog(model)
    Perturb.eps, Perturb.prefill = 0.0, a.perturb_prefill
    ref_wrapped = greedy(model, prompts[0], 3, a.top, None)
    wrapper_identical = ref_stock["tokens"] == ref_wrapped["tokens"] and ref_stock["logprobs"] == ref_wrapped["logprobs"]
    print(f"GDN modules wrapped: {n_gdn}; MoE routers hooked: {rlog.n_routers}; "
          f"eps=0 wrapper bit-identical to stock: {wrapper_identical}", flush=True)

    def run_arm(name, eps):
        Perturb.eps = eps
        t = time.time()
        res = []
        for i, p in enumerate(prompts):
            ts = time.time()
            res.append(greedy(model, p, a.new_tokens, a.top, rlog))
            print(f"  {name} prompt {i} (len {len(p)}): {time.time() - ts:.1f}s", flush=True)
        Perturb.eps = 0.0
        return res, time.time() - t

    arms, walls = {}, {}
    order = [("baseline", 0.0)] + [(f"perturbed_{e:g}", e) for e in eps_list] + [("baseline_repeat", 0.0)]
    for name, eps in order:
        arms[name], walls[name] = run_arm(name, eps)

    base = arms["baseline"]
    rows = {}
    for name, eps in order[1:]:
        r = compare(base, arms[name])
        r["eps"] = eps
        r["bit_identical"] = all(x["tokens"] == y["tokens"] and x["logprobs"] == y["logprobs"] and x["top"] == y["top"]
                                 for x, y in zip(base, arms[name]))
        r.update(route_flips(base, arms[name]))
        rows[name] = r

    hdr = f"{'arm':<18} {'eps':>7} {'agree':>6} {'ident':>6} {'minpfx':>6} {'meanpfx':>7} {'max|dlp|':>9} " \
          f"{'max|dtop|':>9} {'route flips':>16} {'bitident':>8}"
    print(hdr)
    for name, r in rows.items():
        print(f"{name:<18} {r['eps']:>7g} {r['token_agreement']:>6.3f} {r['identical_prompts']:>3}/{r['prompts']:<2} "
              f"{r['min_common_prefix']:>6} {r['mean_common_prefix']:>7.2f} {r['max_abs_logprob_diff']:>9.2e} "
              f"{r['max_abs_top_logprob_diff']:>9.2e} {r['route_pairs_different']:>6}/{r['route_pairs_compared']:<6} "
              f"{str(r['bit_identical']):>8}")

    out = {
        "what": "greedy-text sensitivity of the tiny random-weight Qwen3-Next model to a relative (1 + eps*s) "
                "perturbation of every GDN decode output (fp32, before the cast to the activation dtype); CPU, "
                "transformers torch fallbacks; not our kernel",
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "platform": platform.platform(),
                     "threads": torch.get_num_threads()},
        "model": a.model, "config": {k: getattr(model.config, k) for k in (
            "num_hidden_layers", "hidden_size", "num_experts", "num_experts_per_tok", "vocab_size")},
        "dtype": a.dtype, "fast_path": bool(mod.is_fast_path_available),
        "gdn_modules": n_gdn, "moe_routers": rlog.n_routers, "eps_zero_wrapper_bit_identical": wrapper_identical,
        "perturb_prefill": a.perturb_prefill, "eps": eps_list, "new_tokens": a.new_tokens, "top": a.top,
        "prompt_lengths": [len(p) for p in prompts], "prompt_seed": 1234,
        "prompts": prompts,
        "comparisons_vs_baseline": rows,
        "wall_s": {**walls, "total": time.time() - t0},
        "outputs": {k: [{kk: vv for kk, vv in r.items() if kk != "routes"} for r in v] for k, v in arms.items()},
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}; total {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()

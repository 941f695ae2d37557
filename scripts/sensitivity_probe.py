#!/usr/bin/env python3
"""How sensitive is the tiny Qwen3-Next model's greedy text to fp32-rounding-size noise in the Gated DeltaNet
(GDN) outputs, and does a gross GDN error show?  CPU, Hugging Face transformers (torch fallbacks), no hub.

    python scripts/make_tiny_model.py --arch qwen3_next --out /tmp/tiny_gdn   # --init decisive (default) or random
    python scripts/sensitivity_probe.py --model /tmp/tiny_gdn --prompts 16 --eps 1e-6,1e-2 --stale-step 8 \
        --out benchmarks/results/sensitivity-decisive-20261129.json

Arms (each is a greedy decode of --new-tokens tokens per prompt, KV/recurrent cache on, top-5 logprobs):
  baseline          -- the model as transformers runs it (bf16 weights and activations)
  perturbed_<eps>   -- every GDN layer's *decode* output (the core gated-delta-rule output, before the gated
                       RMSNorm and out_proj; the recurrent step that SGLang's decode kernel computes) is
                       multiplied in fp32 by (1 + eps * s), s = +1/-1 alternating along the value dim, and
                       only then rounded to the activation dtype (as a kernel writes its fp32 result to bf16).
                       With --perturb-prefill the chunked prefill output is perturbed too.
  stale_state@K     -- (--stale-step K) at decode step K only, every GDN layer's output is computed from the
                       recurrent state one token old (the state before the previous token's update), while
                       the state carried on is correct: a one-token stale-state bug (e.g. a record of the ring
                       left out of the output), the smallest error of that kind.
  baseline_repeat   -- baseline again; must be bit-identical to baseline (determinism check).
The prompt's prefill runs once and every arm decodes from a copy of its cache (prefill is not perturbed).
--conv fp32 (default) computes the short causal conv (prefill and decode) in fp32 and rounds its output to
the activation dtype, as the causal_conv1d kernels do; the stock torch fallback runs it as a bf16 conv1d,
which is ~85% of a CPU decode step. All arms use the same conv.
Each arm is compared to baseline with scripts/gpu_e2e.py's compare(); for the perturbed arms also the
fraction of (MoE layer, decode step) pairs on the common prefix whose top-k expert set differs from baseline.

The probe perturbs by a relative eps; it does not run our kernel. The GDN output is produced by a wrapper
that calls transformers' torch_recurrent_gated_delta_rule in fp32 and casts afterwards; with eps = 0 this is
bit-identical to the stock path (checked at start-up on the first prompt).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_e2e import compare, diversity, prompt_set  # noqa: E402


class Perturb:
    """Shared switch read by the GDN wrappers."""

    eps = 0.0
    prefill = False
    step = 0  # decode step (1 = first decode forward after the prefill)
    stale_step = 0  # when == step: output from the one-token-old state


def install_fp32_conv(model) -> int:
    """Short causal conv in fp32, output rounded to the input dtype (prefill and single-token decode)."""
    import torch.nn.functional as F

    def update(x, conv_state, weight, bias=None, activation=None):
        # x [B, C, 1]; conv_state [B, C, K] (transformers keeps K = kernel size); as torch_causal_conv1d_update
        seq_len, state_len = x.shape[-1], conv_state.shape[-1]
        new = torch.cat([conv_state, x], dim=-1).to(weight.dtype)
        conv_state.copy_(new[:, :, -state_len:])
        k = weight.shape[-1]
        win = new[:, :, -k:].float()
        out = (win * weight.float()).sum(-1, keepdim=True)
        if bias is not None:
            out = out + bias.float()[:, None]
        assert seq_len == 1
        return F.silu(out).to(x.dtype)

    def full(x, weight, bias=None, activation=None, seq_idx=None):
        k = weight.shape[-1]
        out = F.conv1d(F.pad(x.float(), (k - 1, 0)), weight.float().unsqueeze(1),
                       None if bias is None else bias.float(), groups=x.shape[1])
        return F.silu(out).to(x.dtype)

    n = 0
    for m in model.modules():
        if type(m).__name__ == "Qwen3NextGatedDeltaNet":
            m.causal_conv1d_update, m.causal_conv1d_fn = update, full
            n += 1
    return n


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

        def make(fn, is_decode, m_ref=m):
            def wrapped(query, key, value, g, beta, initial_state=None, output_final_state=False,
                        use_qk_l2norm_in_kernel=False, **kw):
                dt = query.dtype
                if use_qk_l2norm_in_kernel:  # as the stock function does it: in the input dtype
                    query = mod.l2norm(query, dim=-1, eps=1e-6)
                    key = mod.l2norm(key, dim=-1, eps=1e-6)
                # the stock function casts q, k, v, beta, g to fp32 first; doing it here is exact
                args = (query.float(), key.float(), value.float(), g.float(), beta.float())
                o, s = fn(*args, initial_state=initial_state, output_final_state=output_final_state,
                          use_qk_l2norm_in_kernel=False, **kw)
                if is_decode:
                    if Perturb.stale_step and Perturb.step == Perturb.stale_step and m_ref._prev_state is not None:
                        o, _ = fn(*args, initial_state=m_ref._prev_state, output_final_state=False,
                                  use_qk_l2norm_in_kernel=False, **kw)  # output from the stale state only
                    m_ref._prev_state = None if initial_state is None else initial_state.clone()
                if is_decode or Perturb.prefill:
                    o = _scale(o)
                return o.to(dt), s
            return wrapped

        m.recurrent_gated_delta_rule = make(rec, True)
        m.chunk_gated_delta_rule = make(chunk, False)
        m._stock_rules = (rec, chunk)
        m._prev_state = None
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
def prefill(model, prompt: list[int], rlog: RouterLog | None):
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    if rlog is not None:
        rlog.calls = []
    out = model(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True)
    return out.past_key_values, out.logits[0, -1].float(), (rlog.calls if rlog is not None else [])


@torch.no_grad()
def greedy(model, prompt: list[int], new_tokens: int, top: int, rlog: RouterLog | None, pre=None):
    """Greedy decode; pre = prefill(...) result to decode from (its cache is copied, not consumed)."""
    for m in model.modules():
        if hasattr(m, "_prev_state"):
            m._prev_state = None
    if pre is None:
        pre = prefill(model, prompt, rlog)
    cache, logits, routes0 = copy.deepcopy(pre[0]), pre[1], pre[2]
    toks, lps, tops, routes = [], [], [], []
    for step in range(new_tokens):
        if step > 0:
            if rlog is not None:
                rlog.calls = []
            Perturb.step = step
            out = model(input_ids=ids, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[0, -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        t = int(torch.argmax(logp))
        tv, ti = torch.topk(logp, top)
        toks.append(t)
        lps.append(float(logp[t]))
        tops.append([(int(i), float(v)) for v, i in zip(tv, ti)])
        if rlog is not None:
            routes.append(rlog.calls if step > 0 else routes0)
        ids = torch.tensor([[t]])
    Perturb.step = 0
    return {"tokens": toks, "logprobs": lps, "top": tops, "routes": routes}


def margins(res: list[dict]) -> dict:
    """Top-1 minus top-2 logprob per step (all steps) and the chosen token's probability."""
    gaps = sorted(r["top"][i][0][1] - r["top"][i][1][1] for r in res for i in range(len(r["top"])))
    p = sorted(math.exp(lp) for r in res for lp in r["logprobs"])
    q = lambda xs, f: xs[min(len(xs) - 1, int(f * len(xs)))]  # noqa: E731
    return {"top1_top2_gap_min": gaps[0], "top1_top2_gap_p01": q(gaps, 0.01), "top1_top2_gap_median": q(gaps, 0.5),
            "chosen_prob_min": p[0], "chosen_prob_median": q(p, 0.5), "chosen_prob_max": p[-1], "steps": len(gaps)}


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
    ap.add_argument("--stale-step", type=int, default=0, help="add a stale_state@K arm (K >= 2; 0: none)")
    ap.add_argument("--conv", default="fp32", choices=["fp32", "stock"], help="short-conv implementation (all arms)")
    ap.add_argument("--no-repeat", action="store_true", help="skip the baseline_repeat arm")
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

    n_conv = install_fp32_conv(model) if a.conv == "fp32" else 0
    # check: the eps=0 wrapper is bit-identical to the stock GDN path (prefill + 2 decode steps, prompt 0)
    ref_stock = greedy(model, prompts[0], 3, a.top, None)
    n_gdn = install_gdn_wrappers(model, mod)
    rlog = RouterLog(model)
    Perturb.eps, Perturb.prefill = 0.0, a.perturb_prefill
    ref_wrapped = greedy(model, prompts[0], 3, a.top, None)
    wrapper_identical = ref_stock["tokens"] == ref_wrapped["tokens"] and ref_stock["logprobs"] == ref_wrapped["logprobs"]
    print(f"GDN modules wrapped: {n_gdn}; MoE routers hooked: {rlog.n_routers}; "
          f"eps=0 wrapper bit-identical to stock: {wrapper_identical}", flush=True)

    order = [("baseline", 0.0, 0)] + [(f"perturbed_{e:g}", e, 0) for e in eps_list]
    if a.stale_step:
        assert a.stale_step >= 2, "--stale-step must be >= 2 (step 1's previous state is the prefill's)"
        order.append((f"stale_state@{a.stale_step}", 0.0, a.stale_step))
    if not a.no_repeat:
        order.append(("baseline_repeat", 0.0, 0))
    arms = {name: [] for name, _, _ in order}
    walls = {name: 0.0 for name, _, _ in order}
    walls["prefill"] = 0.0
    for i, p in enumerate(prompts):
        ts = time.time()
        pre = prefill(model, p, rlog)
        walls["prefill"] += time.time() - ts
        line = [f"prompt {i} (len {len(p)}): prefill {time.time() - ts:.1f}s"]
        for name, eps, stale in order:
            Perturb.eps, Perturb.stale_step = eps, stale
            t = time.time()
            arms[name].append(greedy(model, p, a.new_tokens, a.top, rlog, pre))
            walls[name] += time.time() - t
            line.append(f"{name} {time.time() - t:.1f}s")
            Perturb.eps, Perturb.stale_step = 0.0, 0
        del pre
        print("  " + "; ".join(line), flush=True)

    base = arms["baseline"]
    rows = {}
    for name, eps, stale in order[1:]:
        r = compare(base, arms[name])
        r["eps"] = eps
        r["stale_step"] = stale
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
    base_margins, base_div = margins(base), diversity(base)
    print("baseline margins:", json.dumps(base_margins))
    print("baseline diversity:", json.dumps(base_div))

    out = {
        "what": "greedy-text sensitivity of the tiny Qwen3-Next model to a relative (1 + eps*s) "
                "perturbation of every GDN decode output (fp32, before the cast to the activation dtype), and to a "
                "one-token stale GDN state (stale_state@K); CPU, transformers torch fallbacks; not our kernel",
        "command": " ".join([Path(sys.executable).name] + sys.argv),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__, "platform": platform.platform(),
                     "threads": torch.get_num_threads()},
        "model": a.model, "config": {k: getattr(model.config, k) for k in (
            "num_hidden_layers", "hidden_size", "num_experts", "num_experts_per_tok", "vocab_size")},
        "dtype": a.dtype, "fast_path": bool(mod.is_fast_path_available),
        "gdn_modules": n_gdn, "moe_routers": rlog.n_routers, "eps_zero_wrapper_bit_identical": wrapper_identical,
        "conv": a.conv, "fp32_conv_modules": n_conv, "stale_step": a.stale_step,
        "baseline_margins": base_margins, "baseline_diversity": base_div,
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

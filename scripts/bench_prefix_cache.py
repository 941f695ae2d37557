#!/usr/bin/env python
"""Prefix-cache hit rate, CPU simulation against SGLang 0.5.17's real radix cache (issue 6).

The generated-shared-prefix workload of SGLang's bench_serving (same option names), run through
SGLang's own UnifiedRadixCache (FULL + MAMBA components), HybridReqToTokenPool, MambaPool and KV
allocator on the CPU, with SGLang's own request-side cache logic (match with mamba copy-on-write,
branching seqlen, extra_buffer prefill track plan and decode ping-pong, insert after prefill,
donation or no_buffer cap at finish). The model is simulated: a slot's state records how many
tokens its checkpoint holds, and each decode step's checkpoint write follows the arm's ring:

  conventional        extra_buffer, no ReplaySSM: every decode step writes the state;
  upstream_no_buffer  upstream ReplaySSM as shipped: --enable-linear-replayssm forces no_buffer
                      (and the overlap scheduler off); upstream's write_pos cursor, advanced by
                      upstream's metadata code; finish donates at n - write_pos;
  replayssm           ours: extra_buffer with our ring (replayssm_sglang.ring) and the device-side
                      forced flush (replayssm_sglang.sglang_hooks.flush) at track boundaries.

A boundary snapshot or a prefix hit whose state does not hold exactly its length is counted as
stale and its tokens are not counted as hits. See replayssm_sglang/prefix_sim.py.

Usage (the shape of SGLang issue #37834):
  python scripts/bench_prefix_cache.py --gsp-num-groups 8 --gsp-prompts-per-group 32 \\
      --gsp-system-prompt-len 2048 --gsp-question-len 64 --output benchmarks/results/prefix-cache-37834.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

# No GPU here: SGLang's Triton kernels (imported at module load) need the interpreter, which
# must be chosen before triton is imported.
os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from replayssm_sglang import prefix_sim  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    d = prefix_sim.SimConfig()
    g = p.add_argument_group("generated-shared-prefix dataset (SGLang bench_serving names)")
    g.add_argument("--gsp-num-groups", type=int, default=d.num_groups)
    g.add_argument("--gsp-prompts-per-group", type=int, default=d.prompts_per_group)
    g.add_argument("--gsp-system-prompt-len", type=int, default=d.system_prompt_len)
    g.add_argument("--gsp-question-len", type=int, default=d.question_len)
    g.add_argument("--gsp-output-len", type=int, default=d.output_len)
    g.add_argument("--gsp-num-turns", type=int, default=d.num_turns,
                   help="turns per conversation; turn t's prompt extends turn t-1's prompt and output")
    g.add_argument("--gsp-ordered", action="store_true", help="keep requests in group order (default: shuffled)")
    p.add_argument("--seed", type=int, default=d.seed)
    s = p.add_argument_group("server")
    s.add_argument("--page-size", type=int, default=d.page_size,
                   help="extra_buffer arms; no_buffer runs at page size 1 (SGLang refuses anything else)")
    s.add_argument("--mamba-track-interval", type=int, default=d.mamba_track_interval)
    s.add_argument("--linear-replayssm-cache-len", type=int, default=d.linear_replayssm_cache_len,
                   help="ring length L (ours and upstream)")
    s.add_argument("--kind", choices=("gdn", "kda"), default=d.kind)
    s.add_argument("--max-concurrency", type=int, default=d.max_concurrency,
                   help="client concurrency (conversations in flight); #37834 used 48")
    s.add_argument("--chunked-prefill-size", type=int, default=d.chunked_prefill_size,
                   help="prefill token budget per batch (longer extends are not simulated)")
    s.add_argument("--disable-overlap-schedule", action="store_true",
                   help="also for the extra_buffer arms (one ping-pong track slot instead of two)")
    p.add_argument("--no-forced-flush", action="store_true",
                   help="debugging: our arm without the device-side forced flush (its states go stale)")
    p.add_argument("--arms", default=",".join(prefix_sim.ARMS), help="comma-separated subset of: "
                   + ", ".join(prefix_sim.ARMS))
    p.add_argument("--output", help="write the results as JSON here")
    p.add_argument("--plot", help="write a bar chart (PNG) here")
    a = p.parse_args(argv)
    for arm in a.arms.split(","):
        if arm not in prefix_sim.ARMS:
            p.error(f"unknown arm {arm!r}")
    if a.mamba_track_interval % a.page_size:
        p.error("--mamba-track-interval must be a multiple of --page-size (SGLang asserts it for extra_buffer)")
    return a


def config_from_args(a: argparse.Namespace) -> prefix_sim.SimConfig:
    return prefix_sim.SimConfig(
        num_groups=a.gsp_num_groups, prompts_per_group=a.gsp_prompts_per_group,
        system_prompt_len=a.gsp_system_prompt_len, question_len=a.gsp_question_len, output_len=a.gsp_output_len,
        num_turns=a.gsp_num_turns, ordered=a.gsp_ordered, seed=a.seed, page_size=a.page_size,
        mamba_track_interval=a.mamba_track_interval, linear_replayssm_cache_len=a.linear_replayssm_cache_len,
        kind=a.kind, max_concurrency=a.max_concurrency, chunked_prefill_size=a.chunked_prefill_size,
        disable_overlap_schedule=a.disable_overlap_schedule, forced_flush=not a.no_forced_flush)


COLUMNS = [("hit_rate", "hit rate", "{:.2%}"), ("cached_tokens", "cached", "{}"), ("prompt_tokens", "prompt", "{}"),
           ("hits", "hit reqs", "{}"), ("stale_hits", "stale hits", "{}"), ("stale_snapshots", "stale snaps", "{}"),
           ("track_snapshots", "snaps", "{}"), ("stale_tree_states", "stale in tree", "{}"),
           ("checkpoint_writes", "ckpt writes", "{}"), ("decode_steps", "decode steps", "{}")]


def table(res: dict) -> str:
    rows = [["arm", "strategy"] + [c[1] for c in COLUMNS]]
    for name, m in res["arms"].items():
        rows.append([name, f"{m['strategy']} p{m['page_size']}"] + [f.format(m[k]) for k, _, f in COLUMNS])
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    line = lambda r: "  ".join(x.rjust(w[i]) if i > 1 else x.ljust(w[i]) for i, x in enumerate(r))  # noqa: E731
    return "\n".join([line(rows[0]), line(["-" * x for x in w])] + [line(r) for r in rows[1:]])


def plot(res: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(res["arms"])
    vals = [100 * res["arms"][n]["hit_rate"] for n in names]
    c = res["config"]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bars = ax.bar(names, vals, color=["#888888", "#d62728", "#1f77b4"][: len(names)])
    for b, v in zip(bars, vals):
        ax.text(b.get_x() + b.get_width() / 2, v + 1, f"{v:.1f}%", ha="center")
    ax.set_ylabel("prefix-cache hit rate (%)")
    ax.set_ylim(0, 105)
    ax.set_title(f"GSP {c['num_groups']}x{c['prompts_per_group']}, sys {c['system_prompt_len']}, "
                 f"q {c['question_len']}, out {c['output_len']}, turns {c['num_turns']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    a = parse_args(argv)
    cfg = config_from_args(a)
    t0 = time.perf_counter()
    res = prefix_sim.run(cfg, arms=tuple(a.arms.split(",")), log=lambda m: print(m, file=sys.stderr, flush=True))
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or None
    except OSError:
        commit = None
    import sglang

    res["meta"] = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   "commit": commit, "sglang": sglang.__version__, "device": "cpu (simulation)",
                   "seconds": round(time.perf_counter() - t0, 1), "argv": sys.argv[1:] if argv is None else argv}
    print(table(res))
    if a.output:
        os.makedirs(os.path.dirname(os.path.abspath(a.output)), exist_ok=True)
        with open(a.output, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {a.output}")
    if a.plot:
        plot(res, a.plot)
        print(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

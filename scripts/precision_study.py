#!/usr/bin/env python
"""Two-precision state error study (issue 7), CPU, float64 reference: JSON + PNG.

For GDN and KDA, slow-decay (0.9995..0.99999) and fast-decay (0.9..0.95) heads, bf16 and fp8 e4m3,
keys from a 32-dimensional subspace (+10% noise) and isotropic keys: the relative output error per
step against the exact float64 recurrence of
  (a) a_every_step         the state rounded to the low precision every step (round to nearest),
  (b) b_checkpoint         one low-precision checkpoint, rounded once per window of L,
  (c) c_two_copies         fp32 recurrence copy + read copy in the low precision (round to nearest),
  (c') c_bf16sr_two_copies bf16 recurrence copy (stochastic rounding) + read copy.
"Error at step t" = sqrt(sum ||e||^2 / sum ||o||^2) over the 64 steps ending at t. For the ring arms
the JSON also holds the recurrence copy's own error after the flush at step t, ||C - S|| / ||S||.

    python scripts/precision_study.py [--steps 4096] [--K 128] [--seed 1234] [--out benchmarks/results/precision-DATE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

from replayssm_sglang import precision as P

ARMS = (*P.ARMS, "c_bf16sr_two_copies")
LABELS = {
    "a_every_step": "(a) rounded every step",
    "b_checkpoint": "(b) low-precision checkpoint, once per window",
    "c_two_copies": "(c) two copies: fp32 recurrence + read copy",
    "c_bf16sr_two_copies": "(c') two copies: bf16-SR recurrence + read copy",
}
KEYS = {"rank32": 32, "isotropic": None}


def _commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True).strip()
    except Exception:  # noqa: BLE001
        return "unknown"


def run(args) -> dict:
    out = {
        "what": "two-precision state error study (issue 7), float64 reference, one head",
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": _commit(),
        "settings": {"steps": args.steps, "K": args.K, "V": args.K, "L": args.L, "seed": args.seed,
                     "regimes": P.REGIMES, "window": 64,
                     "keys": {"rank32": "random 32-dim subspace + 10% isotropic noise", "isotropic": "N(0, I)"}},
        "arms": LABELS,
        "runs": [],
    }
    checkpoints = sorted({t for t in (256, 512, 1024, 2048, args.steps) if t <= args.steps})
    for kind in ("gdn", "kda"):
        for keys, rank in KEYS.items():
            for regime in ("slow", "fast"):
                for dtype in ("bf16", "fp8_e4m3"):
                    t0 = time.time()
                    res = P.error_study(kind, regime, dtype, steps=args.steps, K=args.K, V=args.K, L=args.L,
                                        seed=args.seed, key_rank=rank, arms=ARMS)
                    row = {"kind": kind, "keys": keys, "regime": regime, "dtype": dtype, "error_at": {},
                           "curve_steps": list(range(64, args.steps + 1, 16)), "curve": {}}
                    for arm in ARMS:
                        row["error_at"][arm] = {str(t): P.window_error(res[arm], res["norm"], t) for t in checkpoints}
                        row["curve"][arm] = [P.window_error(res[arm], res["norm"], t) for t in row["curve_steps"]]
                        e = row["error_at"][arm]
                        row["error_at"][arm]["growth_last_over_256"] = e[str(args.steps)] / e["256"]
                    row["recurrence_copy_error_at"] = {
                        arm: {str(t): float(res["recurrence_" + arm][t // args.L - 1]) for t in checkpoints}
                        for arm in ARMS if "recurrence_" + arm in res}
                    out["runs"].append(row)
                    ea = row["error_at"]
                    print(f"{kind} {keys:9s} {regime} {dtype:8s} " + "  ".join(
                        f"{a.split('_')[0]}: {ea[a]['256']:.2e}->{ea[a][str(args.steps)]:.2e}" for a in ARMS)
                        + f"  ({time.time() - t0:.1f}s)", flush=True)
    return out


def plot(data: dict, png: Path, kind: str = "gdn") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = [(k, d) for k in KEYS for d in ("bf16", "fp8_e4m3")]
    fig, axes = plt.subplots(2, len(cols), figsize=(4.2 * len(cols), 7), sharex=True)
    styles = {"a_every_step": ("tab:red", "-"), "b_checkpoint": ("tab:orange", "-"),
              "c_two_copies": ("tab:blue", "-"), "c_bf16sr_two_copies": ("tab:blue", ":")}
    for r, regime in enumerate(("slow", "fast")):
        for c, (keys, dtype) in enumerate(cols):
            ax = axes[r][c]
            row = next(x for x in data["runs"] if x["kind"] == kind and x["keys"] == keys
                       and x["regime"] == regime and x["dtype"] == dtype)
            for arm in ARMS:
                col, ls = styles[arm]
                ax.plot(row["curve_steps"], row["curve"][arm], color=col, ls=ls, lw=1.4, label=LABELS[arm])
            ax.set_yscale("log")
            lo, hi = P.REGIMES[regime]
            ax.set_title(f"{regime} decay ({lo}..{hi}), {dtype}\nkeys: {keys}", fontsize=9)
            ax.grid(True, which="both", alpha=0.3)
            if r == 1:
                ax.set_xlabel("decode step")
            if c == 0:
                ax.set_ylabel("relative output error (64-step RMS)")
    axes[0][0].legend(fontsize=7, loc="lower right")
    s = data["settings"]
    fig.suptitle(f"{kind.upper()} one head, K=V={s['K']}, L={s['L']}, seed {s['seed']}: error vs exact float64 "
                 f"({data['date']}, {data['commit']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=4096)
    ap.add_argument("--K", type=int, default=128)
    ap.add_argument("--L", type=int, default=16)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out", default=None, help="path prefix (default benchmarks/results/precision-YYYYMMDD-HHMM)")
    ap.add_argument("--plot", default=None, help="only make the PNG from this JSON")
    args = ap.parse_args(argv)
    if args.plot:
        js = Path(args.plot)
        data = json.loads(js.read_text())
        plot(data, js.with_suffix(".png"))
        return 0
    prefix = Path(args.out or f"benchmarks/results/precision-{dt.datetime.now(dt.timezone.utc):%Y%m%d-%H%M}")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    data = run(args)
    js = prefix.with_suffix(".json")
    js.write_text(json.dumps(data, indent=1))
    plot(data, prefix.with_suffix(".png"))
    print(f"wrote {js} and {prefix.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Pool the decode-throughput and prefix-cache results of several `scripts/gpu_e2e.py` calls at one commit.

    python scripts/e2e_pool.py benchmarks/results/e2e-A.json e2e-B.json ... [--batch 256] [--merge ours_w16=ours]

One server gives three harness repeats at a batch size, and servers of the same arm differ by a few percent from one
start to the next (docs/benchmarks.md: 1.29-1.31x for the same GDN arm in session 32), so a single call can put
issue 9's GDN ratio on either side of 1.3x. This script answers from every server that ran: for each model and arm,
at one batch size,
  - the harness's rate (B x 192 tokens over the time between a 64- and a 256-token generation): the median of every
    repeat of every server, and the median of the per-server medians;
  - SGLang's own log (`gen throughput` of decode batches with B running requests): the median over servers;
  - each against the reference arm's (conventional);
  - the prefix workload's warm runs (every run after a server's first, cold one: `--prefix-repeats 4` gives three):
    hit rate and mean TTFT, the hit rates' median, the TTFTs' mean and median, each against the reference's. One
    warm run per server is too few: a conventional server's warm mean TTFT ran from 0.61 to 1.38 s in one call
    (session 36), more than the 10% the target allows.
`--merge A=B` counts arm A's servers as arm B's (e.g. ours_w16=ours at B = 256, where the policy's own window is
16, so the two servers run the same launch); a tagged arm (`ours:2`, gpu_e2e.py's name for a repeated arm) counts as
its base arm. Refuses files from different commits unless --allow-mixed-commits.
Writes a markdown table to stdout (and JSON with --json).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


class PoolError(ValueError):
    pass


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def pool(results: list[dict], batch: int = 256, merge: dict[str, str] | None = None,
         allow_mixed_commits: bool = False, reference: str = "conventional") -> dict:
    """results: gpu_e2e.py JSON objects. Returns {model: {arm: row}} plus the commits and GPUs seen."""
    merge = merge or {}
    commits = sorted({str(r.get("commit")) for r in results})
    if len(commits) > 1 and not allow_mixed_commits:
        raise PoolError(f"results from {len(commits)} commits ({', '.join(commits)}): pool one commit's runs, "
                        "or pass --allow-mixed-commits")
    out: dict[str, dict] = {}
    key = str(batch)
    for r in results:
        for model, md in (r.get("models") or {}).items():
            for arm, ad in (md.get("arms") or {}).items():
                base = arm.split(":", 1)[0]  # (a tagged repeat, ours:2, is its base arm's server)
                name = merge.get(base, base)
                row = out.setdefault(model, {}).setdefault(name, {
                    "servers": 0, "prefix_servers": 0, "from_arms": [], "repeats": [], "server_medians": [],
                    "logged": [], "prefix_hit_warm": [], "prefix_ttft_warm": []})
                t = (ad.get("throughput") or {}).get(key)
                p = ad.get("prefix")
                if not t and not p:
                    continue
                if arm not in row["from_arms"]:
                    row["from_arms"].append(arm)
                if t:
                    row["servers"] += 1
                    reps = [float(x) for x in t.get("decode_tok_s_all") or []]
                    row["repeats"] += reps
                    if reps:
                        row["server_medians"].append(statistics.median(reps))
                    if t.get("server_logged_tok_s") is not None:
                        row["logged"].append(float(t["server_logged_tok_s"]))
                if p:
                    row["prefix_servers"] += 1
                    # every warm run: gpu_e2e.py keeps the runs after the cold one in `repeats` (older files:
                    # only `warm`, the last; one run alone: the dict itself)
                    for w in p.get("repeats") or [p.get("warm") or p]:
                        if w.get("hit_rate") is not None:
                            row["prefix_hit_warm"].append(float(w["hit_rate"]))
                        if w.get("mean_ttft_s") is not None:
                            row["prefix_ttft_warm"].append(float(w["mean_ttft_s"]))
    for model, arms in out.items():
        for row in arms.values():
            row["harness_median"] = _median(row["repeats"])
            row["harness_median_of_servers"] = _median(row["server_medians"])
            row["logged_median"] = _median(row["logged"])
            row["prefix_hit_median"] = _median(row["prefix_hit_warm"])
            row["prefix_ttft_median"] = _median(row["prefix_ttft_warm"])
            row["prefix_ttft_mean"] = statistics.mean(row["prefix_ttft_warm"]) if row["prefix_ttft_warm"] else None
        ref = arms.get(reference)
        for row in arms.values():
            for k in ("harness_median", "harness_median_of_servers", "logged_median", "prefix_ttft_mean",
                      "prefix_ttft_median"):
                a, b = row.get(k), (ref or {}).get(k)
                row[f"{k}_x_ref"] = a / b if a is not None and b else None
            a, b = row.get("prefix_hit_median"), (ref or {}).get("prefix_hit_median")
            row["prefix_hit_points_vs_ref"] = 100 * (a - b) if a is not None and b is not None else None
    return {"batch": batch, "reference": reference, "commits": commits,
            "gpus": sorted({str(r.get("gpu")) for r in results}), "models": out}


def _f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def markdown(p: dict) -> str:
    L = [f"Pooled at B = {p['batch']}; commit(s) {', '.join(p['commits'])}; {', '.join(p['gpus'])}; against "
         f"`{p['reference']}`.", "",
         "| model | arm (servers timed / with the prefix task) | harness, all repeats: median (x) | "
         "harness, per-server medians: median (x) | SGLang's log: median (x) | "
         "prefix warm runs | prefix warm hit rate (points vs ref) | prefix warm mean TTFT s: mean (x ref) | "
         "median (x ref) |",
         "|---|---|---|---|---|---|---|---|---|"]
    for model, arms in p["models"].items():
        for arm, r in arms.items():
            src = arm if r["from_arms"] == [arm] else f"{arm} = {' + '.join(r['from_arms'])}"
            L.append(f"| {model} | {src} ({r['servers']} / {r['prefix_servers']}) | {_f(r['harness_median'], '.0f')} "
                     f"({_f(r['harness_median_x_ref'], '.3f')}x) | {_f(r['harness_median_of_servers'], '.0f')} "
                     f"({_f(r['harness_median_of_servers_x_ref'], '.3f')}x) | {_f(r['logged_median'], '.0f')} "
                     f"({_f(r['logged_median_x_ref'], '.3f')}x) | {len(r['prefix_ttft_warm'])} | "
                     f"{_f(r['prefix_hit_median'], '.3f')} ({_f(r['prefix_hit_points_vs_ref'], '+.1f')}) | "
                     f"{_f(r['prefix_ttft_mean'], '.3f')} ({_f(r['prefix_ttft_mean_x_ref'], '.3f')}x) | "
                     f"{_f(r['prefix_ttft_median'], '.3f')} ({_f(r['prefix_ttft_median_x_ref'], '.3f')}x) |")
    return "\n".join(L)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path, nargs="+", help="gpu_e2e.py JSON files")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--merge", action="append", default=[], metavar="A=B",
                    help="count arm A's servers as arm B's (repeatable)")
    ap.add_argument("--reference", default="conventional")
    ap.add_argument("--allow-mixed-commits", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the pooled numbers here")
    a = ap.parse_args(argv)
    merge = {}
    for m in a.merge:
        if "=" not in m:
            ap.error(f"--merge takes A=B (arm A counted as arm B), got {m!r}")
        k, v = m.split("=", 1)
        merge[k] = v
    try:
        p = pool([json.loads(f.read_text()) for f in a.results], batch=a.batch, merge=merge,
                 allow_mixed_commits=a.allow_mixed_commits, reference=a.reference)
    except PoolError as e:
        print(f"e2e_pool: {e}", file=sys.stderr)
        return 2
    print(markdown(p))
    if a.json:
        a.json.write_text(json.dumps(p, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

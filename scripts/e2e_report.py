#!/usr/bin/env python3
"""Copy an end-to-end GPU result into the repo and (re)write the "End to end (GPU)" section of docs/benchmarks.md.

    python scripts/e2e_report.py RESULT_DIR [--tag NAME]

RESULT_DIR holds e2e.json (+ e2e.png) from scripts/gpu_e2e.py. Files land in benchmarks/results/e2e-<tag>.json/png
(tag defaults to the run's date). Only this script's own section of docs/benchmarks.md is replaced; other
sections are kept as they are.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
HEAD = "## End to end (GPU)"


def fmt(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def prefix_cell(p: dict, key: str, spec: str) -> str:
    """A prefix-workload figure: the first run's, and the warm (last) run's beside it when the workload ran more
    than once (scripts/gpu_e2e.py prefix_task)."""
    w = p.get("warm")
    return fmt(p.get(key), spec) + (f" (warm {fmt(w.get(key), spec)})" if w else "")


def section(res: dict, tag: str) -> str:
    L = [HEAD, "",
         f"`scripts/gpu_e2e.sh` on {res.get('gpu')}, SGLang {res.get('sglang')}, commit {res.get('commit')}, "
         f"{res.get('date')}; patch series applied: {res.get('series_applied')}. "
         f"Raw: `benchmarks/results/e2e-{tag}.json`, plot `benchmarks/results/e2e-{tag}.png`.", "",
         "Common server flags: `" + " ".join(res.get("common_flags", [])) + "`.", "",
         "How to run (one `run` call of at most 10 minutes; one model with two arms, NEXTN for each, tasks "
         "correctness,spec,throughput,prefix took 448 s of wall time on 2026-11-29 with the JIT caches carried):",
         "", "```",
         "python scripts/gpu_bundle.py                      # here, once: .bundle/ (~56 MiB, pinned cp312 wheels)",
         "git rev-parse --short HEAD > .gpu/COMMIT           # here: the device gets no .git",
         "# device, carry [.bundle, .gpu/fi-cache.tar.xz, .gpu/triton-cache.tar.xz, .gpu/COMMIT] (not .gpu/kwhl: 64 MiB cap):",
         "E2E_MODELS=gdn bash scripts/gpu_e2e.sh --arms conventional,ours,ours_w16 \\",
         "    --tasks correctness,spec,throughput,prefix --budget-s 500",
         "python scripts/e2e_report.py /work/.device/N --tag <tag>   # here: results + this section",
         "```", ""]
    for mname, m in res.get("models", {}).items():
        L += [f"### {mname}: {m.get('arch')} (tiny, {m.get('init', 'random')}-init synthetic weights; {m.get('layers')} layers of which "
              f"{m.get('linear_layers')} linear, hidden {m.get('hidden')})", ""]
        share = m.get("ssm_share_b256")
        k = m.get("ssm_kernel") or {}
        if k and m.get("ssm_share_b256_valid") is False:
            share = None  # the B=256 step mixed two waves (pool cap): see the notes
        if k:
            L += [f"SSM share of a decode step at B=256: {fmt(share, '.0%') if share is not None else 'n/a'} "
                  f"({m.get('linear_layers')} layers x {k['kernel_us']:.0f} us conventional packed-decode kernel "
                  f"alone, {k['TBps']:.2f} TB/s state traffic, vs the conventional arm's measured step); "
                  f"end-to-end ceiling for a perfect SSM kernel: "
                  f"{fmt(1 / (1 - share), '.2f') + 'x' if share is not None and share < 1 else '-'}.", ""]
        arms = m.get("arms", {})
        bs = sorted({int(b) for a in arms.values() for b in (a.get("throughput") or {})})
        if bs:
            L += ["| arm | " + " | ".join(f"B={b} tok/s" for b in bs) + " | " +
                  " | ".join(f"B={b} ratio" for b in bs) + " | startup s |",
                  "|---|" + "---|" * (2 * len(bs) + 1)]
            first = next(iter(arms))
            for an, a in arms.items():
                tp = a.get("throughput") or {}
                ratio = next((v for k2, v in a.items() if k2.startswith("ratio_vs_")), {})
                L.append(f"| {an} | " + " | ".join(
                    fmt(tp.get(str(b), {}).get("decode_tok_s"), ".0f") + (" (queued)" if tp.get(str(b), {}).get("queued")
                                                                          else "") for b in bs)
                         + " | " + " | ".join(("1" if an == first and tp else fmt(ratio.get(str(b)), ".2f"))
                                              for b in bs)
                         + f" | {fmt(a.get('startup_s'), '.0f')} |")
            L.append("")
        prof = [(an, a["profile"]) for an, a in arms.items() if a.get("profile")]
        if prof:
            L += ["Profiled decode step (task `profile`: torch profiler via SGLang's /start_profile, CUDA graphs on; "
                  "state update = the GDN/KDA recurrent decode kernels, scripts/trace_share.py):", "",
                  "| arm | B | steps | GPU step ms | busy ms | state update ms | share of busy | share of step | "
                  "note |", "|---|---|---|---|---|---|---|---|---|"]
            for an, p in prof:
                ps = p.get("per_step") or {}
                ms = (lambda k: fmt(ps[k] / 1000, ".3f") if ps.get(k) is not None else "-")
                note = p.get("error") or p.get("reason") or ("queued" if p.get("queued") else "")
                L.append(f"| {an} | {p.get('batch', '-')} | {p.get('steps') or '-'} | {ms('span_us')} | "
                         f"{ms('busy_us')} | {ms('state_update_us')} | {fmt(p.get('share'), '.1%')} | "
                         f"{fmt(p.get('share_of_span'), '.1%')} | {str(note)[:100]} |")
            L.append("")
        rows = []
        for an, a in arms.items():
            v = a.get("vs_reference")
            d = a.get("diversity") or {}
            n = a.get("nextn") or {}
            nx = n.get("vs_same_arm_without_spec") or {}
            p = a.get("prefix") or {}
            is_ref = an == m.get("reference_arm")
            rows.append(
                f"| {an} | {fmt(v['token_agreement'], '.3f') if v else ('ref' if is_ref else '-')} | "
                f"{fmt(v['max_abs_logprob_diff'], '.2e') if v else '-'} | "
                f"{d.get('distinct_outputs', '-')}/{len(a.get('outputs', []))} distinct, "
                f"{d.get('unique_tokens', '-')} unique tokens | "
                f"{(str(n.get('same_greedy_text')) + ' (' + fmt(nx.get('token_agreement'), '.3f') + ')') if n else '-'} | "
                f"{fmt((n.get('vs_reference_arm_nextn') or {}).get('token_agreement'), '.3f')} / "
                f"{fmt((n.get('vs_reference_arm_nextn') or {}).get('max_abs_logprob_diff'), '.2e')} | "
                f"{prefix_cell(p, 'hit_rate', '.3f')} / {fmt(p.get('ideal_hit_rate'), '.3f')} | "
                f"{prefix_cell(p, 'mean_ttft_s', '.3f')} | {a.get('error', '')[:80]} |")
        if rows:
            L += ["| arm | token agreement vs ref | max abs logprob diff (common prefix) | outputs | "
                  "NEXTN same greedy as without (agreement) | NEXTN vs ref arm's NEXTN (agreement / max lp diff) | "
                  "prefix hit rate / ideal (first run, warm run) | mean TTFT s (first run, warm run) | error |",
                  "|---|---|---|---|---|---|---|---|---|", *rows, ""]
    for n in res.get("notes", []):
        L += [f"- {n}"]
    if res.get("notes"):
        L.append("")
    if res.get("skipped"):
        L += ["Skipped: " + "; ".join(res["skipped"]), ""]
    return "\n".join(L) + "\n"


def replace_section(text: str, sec: str) -> str:
    """text with its "## End to end (GPU)" section replaced by sec (appended if absent); hand-kept history at the
    end of the old section (from its first "### Earlier" subsection on) is kept below the new one."""
    pat = re.compile(re.escape(HEAD) + r"\n.*?(?=\n## |\Z)", re.S)
    m = pat.search(text)
    if not m:
        return text.rstrip("\n") + "\n\n" + sec
    i = m.group(0).find("\n### Earlier")
    keep = m.group(0)[i:].rstrip("\n") + "\n" if i >= 0 else ""
    return pat.sub(lambda _: sec.rstrip("\n") + "\n" + keep, text)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("result_dir", type=Path)
    ap.add_argument("--tag")
    a = ap.parse_args()
    res = json.loads((a.result_dir / "e2e.json").read_text())
    tag = a.tag or res.get("date", "run").split()[0]
    dst = ROOT / "benchmarks" / "results"
    dst.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(a.result_dir / "e2e.json", dst / f"e2e-{tag}.json")
    try:  # redraw from the JSON (same code as on the GPU machine)
        import sys

        sys.path.insert(0, str(ROOT / "scripts"))
        from gpu_e2e import plot

        plot(res, dst / f"e2e-{tag}.png")
    except Exception as e:  # matplotlib missing here: keep the GPU's own plot
        print(f"replot failed ({e!r}); copying e2e.png")
        if (a.result_dir / "e2e.png").exists():
            shutil.copyfile(a.result_dir / "e2e.png", dst / f"e2e-{tag}.png")
    sec = section(res, tag)
    text = DOC.read_text() if DOC.exists() else "# Benchmarks\n\n"
    DOC.write_text(replace_section(text, sec))
    print(sec)


if __name__ == "__main__":
    main()

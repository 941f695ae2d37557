#!/usr/bin/env python3
"""What issue 3's and issue 7's speed targets ask of the memory system, from kernel-benchmark runs (CPU only).

For every (layer, state, B >= 128) of one or more `scripts/bench_kernels.py` JSON files it prints one row:
  - conventional's time and the fraction of the GPU's measured copy peak it streams at (its bytes: bench_kernels'
    bytes_model, read AND write of the state per step);
  - our fastest full step in that run (diagnostic arms excluded: `_nofold`, `_stream`, the launches alone, aligned
    cursors), its speedup and fraction of the copy peak;
  - the target (issue 3: GDN fp32 1.65x, GDN bf16 1.55x, KDA fp32 1.5x, KDA bf16 1.4x; issue 7: the fp8 read copy
    3x conventional fp32), the time it allows, and the fraction of the copy peak our bytes would have to stream at
    to meet it;
  - the bytes ceiling: the speedup if our step streamed its bytes as efficiently as conventional streams its own
    (conv_bytes / our_bytes), i.e. what the bytes model allows at conventional's efficiency;
  - where the run has it, the `_nofold` diagnostic of the same shape (every row reads, none folds: wrong results,
    fewer bytes by the fold's writes), which says how fast the streaming part runs alone;
  - from it, the floor of a fold split (session 40's design: the folding rows in a launch of their own, the plain
    rows in a lean one): the no-fold step plus the folds' own bytes at the full copy peak, i.e. as if folding cost
    nothing but its writes and overlapped nothing. No split can be faster than that, so where this floor misses the
    target, the split alone cannot meet it; the table then says the fraction of the copy peak the plain rows' bytes
    would have to stream at (beside what they reach now) for any design that folds at that cost.
A target is out of reach of a design when the efficiency it needs is above what the same kernel reaches without its
folds; it is within the bytes model when the ceiling is above it. The table says both.

With --fit it also splits each step by launch where the run has bench_kernels' `--variants fixed` arms (each launch
alone, pre + main, the step without folds; for an fp32 state its fp8 read copy's default, `v3_fx_fp8_<shape>`, which
answers to issue 7's target): the pre launch's exposure, the post launch's, the folds', the step with
the pre launch's exposure taken off, the step with the pre launch overlapped but its bytes (pre_bytes) still
streamed at the copy peak, and that with the folds at their bytes' cost too. And it splits each step into a fixed
part and a per-row part: a least-squares line t = a + b B over the run's batches >= --min-b, for conventional, for
our arm that is fastest at the largest batch (the same arm at every B; one per group: the state's own step and an
fp32 state's fp8 copy) and for that arm's `_nofold` diagnostic. b is what every further row costs (b_conv / b is
the speedup as B grows without bound; bytes per row / b the fraction of the copy peak the rows stream at), a what a
step costs however few rows it has (launches, the dependent loads before the first byte, the last wave). The fit
then says from which B the line meets the target, and the fixed part a step may have at B = 128 and 256 with the
slope it has.

  python3 scripts/target_bounds.py benchmarks/results/kernels-20261206-0258-s1.json [more.json ...]
      [--out docs-table.md] [--plot bounds.png] [--fit] [--min-b 32]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# issue 3's targets (speedup over conventional decode of the same state, B >= 128) and issue 7's (the fp8 read copy
# of an fp32 state against conventional fp32 decode, B >= 256)
TARGETS = {("gdn", "float32"): 1.65, ("gdn", "bfloat16"): 1.55, ("kda", "float32"): 1.5, ("kda", "bfloat16"): 1.4}
RC_FP8_TARGET = 3.0
RC_FP8_MIN_B = 256
SHAPES = {"gdn": dict(H=16, HV=32, K=128, V=128), "kda": dict(H=32, HV=32, K=128, V=128)}  # (bench_kernels.KIND_SHAPES)
ES = {"float32": 4, "bfloat16": 2}
ABBR = {"float32": "fp32", "bfloat16": "bf16"}
# arm-name tokens of diagnostics: wrong results (nofold, stream), one launch alone (main, pre, post, premain,
# mainpost), or another cursor distribution than the benchmark's staggered one (aligned)
DIAG_TOKENS = {"nofold", "stream", "main", "pre", "post", "premain", "mainpost", "aligned"}
BASELINE_ARMS = {"conv", "conv_cuda"}


# the Triton launches every run times for reference: a cell with only these did not time this state's CUDA shapes
# (a read-copy run's plain rows), so it gets no row of its own
STOCK_ARMS = {"v3_r16", "v3_r32", "v3_r16_rows", "v3_r32_rows"}


def nofold_of(arm: str, arms: dict):
    """The `_nofold` diagnostic of an arm's shape in the same run, if timed: the same name with `_nofold` before a
    round-robin `_rr`, the `_mf` (MMA_FOLD) dropped first where the run named the diagnostic after the base shape."""
    rr = arm.endswith("_rr")
    base = arm[:-3] if rr else arm
    for b in (base, base[:-3] if base.endswith("_mf") else None):
        if b is None:
            continue
        for name in ((b + "_nofold_rr", b + "_nofold") if rr else (b + "_nofold", b + "_nofold_rr")):
            if name in arms:
                return arms[name]
    return None


def is_diagnostic(arm: str) -> bool:
    return bool(DIAG_TOKENS & set(arm.split("_")))


# arms that timed the fp8 copy without "_fp8" in their names: session 48's first runs (kernels-20261206-1004) and
# session 58's --variants fox (kernels-20261207-1557)
_FP8_COPY_PREFIXES = ("v3_rcd_", "v3_rcsp2_", "v3_fox_")


def read_copy_of(arm: str) -> str | None:
    """The read copy an arm's step reads (issue 7), by its name: "bf16" (``_rc_bf16``), "fp8" (``_rc_`` otherwise, or
    ``_fp8``: session 48's ``v3_tg*_fp8_*`` arms), None without one. bench_kernels' bytes model counts the copy's
    bytes by it (here, torch-free, so that both scripts take the one rule)."""
    if "_rc_bf16" in arm:
        return "bf16"
    if "_rc_" in arm or "_fp8" in arm or arm.startswith(_FP8_COPY_PREFIXES):
        return "fp8"
    return None


def group_of(arm: str) -> str | None:
    """Which target an arm's step answers to: "plain" (the state's own), "rc_fp8" (issue 7), None (not ours, or a
    bf16 read copy, which has no target of its own)."""
    if arm in BASELINE_ARMS or arm.startswith("upstream"):
        return None
    copy = read_copy_of(arm)
    if copy == "bf16":
        return None
    return "rc_fp8" if copy == "fp8" else "plain"


def group_target(kind: str, sdt: str, group: str) -> float | None:
    """The speedup a group's step answers to at any B (the issues ask it from B = 128, "plain", and B = RC_FP8_MIN_B,
    "rc_fp8"): issue 3's TARGETS for the state's own step, issue 7's 3x for an fp32 state's fp8 copy, else None."""
    if group == "plain":
        return TARGETS.get((kind, sdt))
    return RC_FP8_TARGET if sdt == "float32" else None


def fold_write_bytes(kind: str, B: int, sdt: str, L: int, group: str) -> float:
    """The bytes the model counts for folding (what a `_nofold` arm does not move): the checkpoint's write (1 in L
    steps), and with a read copy also the checkpoint's read on those steps."""
    s = SHAPES[kind]
    state = B * s["HV"] * s["V"] * s["K"] * ES[sdt]
    return state / L if group == "plain" else 2 * state / L


def bounds(run: dict, min_b: int = 128) -> list[dict]:
    meta, rows = run["meta"], run["rows"]
    peak, L = meta["copy_peak_Bps"], meta.get("L", 16)
    gpu = meta.get("gpu", "?")
    cells: dict[tuple, dict] = {}
    for r in rows:
        cells.setdefault((r["kind"], r["state_dtype"], r["B"]), {})[r["arm"]] = r
    out = []
    for (kind, sdt, B), arms in sorted(cells.items()):
        conv = arms.get("conv")  # (the Triton conventional kernel every run times; bench_kernels' baseline)
        if conv is None or B < min_b:
            continue
        conv_eff = conv["bytes"] / (conv["t_us"] * 1e-6) / peak
        for group in ("plain", "rc_fp8"):
            target = group_target(kind, sdt, group)
            if target is None or (group == "rc_fp8" and B < RC_FP8_MIN_B):
                continue
            ours = [r for a, r in arms.items() if group_of(a) == group and not is_diagnostic(a)]
            if not any(r["arm"] not in STOCK_ARMS for r in ours):
                continue  # (a run that times this state's stock launches only, beside another subject)
            best = min(ours, key=lambda r: r["t_us"])
            t_need = conv["t_us"] / target
            row = dict(gpu=gpu, commit=meta.get("commit", "?"), kind=kind, state=sdt, B=B, group=group,
                       conv_us=conv["t_us"], conv_eff=conv_eff, best_arm=best["arm"], best_us=best["t_us"],
                       best_x=conv["t_us"] / best["t_us"], best_eff=best["bytes"] / (best["t_us"] * 1e-6) / peak,
                       target=target, need_us=t_need, need_eff=best["bytes"] / (t_need * 1e-6) / peak,
                       ceiling_x=conv["bytes"] / best["bytes"], our_mb=best["bytes"] / 1e6, met=best["t_us"] <= t_need)
            nf = nofold_of(best["arm"], arms)
            if nf is not None:
                nf_bytes = nf["bytes"] - fold_write_bytes(kind, B, sdt, L, group)
                row.update(nofold_arm=nf["arm"], nofold_us=nf["t_us"], nofold_x=conv["t_us"] / nf["t_us"],
                           nofold_eff=nf_bytes / (nf["t_us"] * 1e-6) / peak, fold_us=best["t_us"] - nf["t_us"])
                # the split's floor: the folds' bytes at the copy peak on top of the no-fold step
                fold_peak_us = fold_write_bytes(kind, B, sdt, L, group) / peak * 1e6
                split_us = nf["t_us"] + fold_peak_us
                plain_us = t_need - fold_peak_us  # (the time the target leaves the plain rows' bytes)
                row.update(split_us=split_us, split_x=conv["t_us"] / split_us, split_met=split_us <= t_need,
                           plain_need_eff=nf_bytes / (plain_us * 1e-6) / peak if plain_us > 0 else float("inf"))
            out.append(row)
    return out


def md_table(head: list[str], body: list[list[str]]) -> str:
    """A markdown table: its header row, the separator (one cell per column of the header) and the body rows."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    return "\n".join(lines) + "\n"


def gpu_label(r: dict) -> str:
    return r["gpu"].replace("NVIDIA ", "")


def state_label(r: dict) -> str:
    """A row's state as the tables name it: the state's type, with " + fp8 copy" for issue 7's group."""
    return r["state"] + (" + fp8 copy" if r.get("group") == "rc_fp8" else "")


def copy_tag(r: dict) -> str:
    """The plots' short form of state_label's suffix."""
    return "+fp8" if r.get("group") == "rc_fp8" else ""


def line_fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares a, b of t = a + b B over (B, t) points (two or more distinct B)."""
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mt = sum(t for _, t in points) / n
    sbb = sum((b - mb) ** 2 for b, _ in points)
    slope = sum((b - mb) * (t - mt) for b, t in points) / sbb
    return mt - slope * mb, slope


def fits(run: dict, min_b: int = 128) -> list[dict]:
    """Per (layer, state) of a run, and for an fp32 state also per its fp8 read copy (issue 7's group): the fixed and
    per-row parts of conventional, of our arm fastest at the largest B (timed at every B conventional was), and of
    its `_nofold` diagnostic; see --fit."""
    meta, rows = run["meta"], run["rows"]
    by: dict[tuple, dict] = {}
    for r in rows:
        if r["B"] >= min_b:
            by.setdefault((r["kind"], r["state_dtype"]), {}).setdefault(r["arm"], {})[r["B"]] = r
    out = []
    for (kind, sdt), arms in sorted(by.items()):
        for group in ("plain", "rc_fp8"):
            row = _fit_row(meta, kind, sdt, group, arms)
            if row is not None:
                out.append(row)
    return out


def _fit_row(meta: dict, kind: str, sdt: str, group: str, arms: dict) -> dict | None:
    """fits' row for one (layer, state, group), or None where the run lacks what it needs (conventional at two or
    more batches, one of our arms of the group at each of them, a target for the group)."""
    peak = meta["copy_peak_Bps"]
    target = group_target(kind, sdt, group)
    conv = arms.get("conv")
    if target is None or conv is None or len(conv) < 2:
        return None
    bs = sorted(conv)
    full = {a: v for a, v in arms.items() if group_of(a) == group and not is_diagnostic(a)
            and a not in STOCK_ARMS and set(bs) <= set(v)}
    if not full:
        return None
    best = min(full, key=lambda a: full[a][bs[-1]]["t_us"])
    row = dict(gpu=meta.get("gpu", "?"), kind=kind, state=sdt, group=group, batches=bs, target=target, arm=best)
    for name, arm in (("conv", "conv"), ("ours", best), ("nofold", None)):
        if arm is None:
            nf = {b: nofold_of(best, {a: v[b] for a, v in arms.items() if b in v}) for b in bs}
            if any(v is None for v in nf.values()):
                continue
            series = nf
        else:
            series = arms[arm]
        a, b = line_fit([(B, series[B]["t_us"]) for B in bs])
        per_row = (series[bs[-1]]["bytes"] - series[bs[0]]["bytes"]) / (bs[-1] - bs[0])
        if name == "nofold":  # (its bytes as the model counts them for the full step, less the fold's)
            per_row -= fold_write_bytes(kind, 1, sdt, meta.get("L", 16), group)
        row[name] = dict(a=a, b=b, eff=per_row / (b * 1e-6) / peak)
    ca, cb = row["conv"]["a"], row["conv"]["b"]
    oa, ob = row["ours"]["a"], row["ours"]["b"]
    row["asym_x"] = cb / ob
    # the line meets the target where oa + ob B <= (ca + cb B) / target
    gain = cb / target - ob
    row["meets_from_b"] = (oa - ca / target) / gain if gain > 0 else float("inf")
    row["fixed_allowed"] = {B: (ca + cb * B) / target - ob * B for B in (128, 256)}
    return row


def fit_table(rows: list[dict]) -> str:
    head = ["GPU", "layer", "state", "arm", "conv: a us + b us/row (% peak)", "ours: a + b (% peak)",
            "without folds: a + b", "x conv as B grows", "target", "the line meets it from B",
            "fixed part allowed at B = 128 / 256"]

    def ab(p):
        return f"{p['a']:.1f} + {p['b']:.4f} ({100 * p['eff']:.0f}%)"

    body = []
    for r in rows:
        meets = "never" if r["meets_from_b"] == float("inf") else f"{max(r['meets_from_b'], 0):.0f}"
        fa = r["fixed_allowed"]
        body.append([gpu_label(r), r["kind"].upper(), state_label(r), f"`{r['arm']}`", ab(r["conv"]), ab(r["ours"]),
                     ab(r["nofold"]) if "nofold" in r else "-", f"{r['asym_x']:.2f}x", f"{r['target']:.2f}x", meets,
                     f"{fa[128]:.1f} / {fa[256]:.1f}"])
    return md_table(head, body)


FX_PARTS = ("pre", "main", "post", "premain", "nofold")


def pre_bytes(kind: str, B: int, gt_pre: bool, L: int = 16, rec_es: int = 2) -> float:
    """What the pre launch loads and stores in one step, counted from decode_v3._pre_row (the CUDA pre launches move
    the same data), per (row, key head) with the server's bf16 records (rec_es), bf16 inputs and h records on
    average (cursors uniform over 0 .. L - 1):
      both kinds: q and k (2 K bf16), the h key records (h K rec_es), the appended key (K rec_es);
      GDN, per value head of the key head: the gate (one bf16), G of the h records (h fp32), the coefficients
        (2 x BC fp32; BC = 16 at L = 16), e^{G_t} and <k, q> (2 fp32), the appended G (fp32);
      KDA (predecayed keys): the gate (K bf16), G_{h-1} read and G_t appended (2 K fp32), the coefficients
        (2 x BC fp32), <k, q> (fp32), and G_t for the main launch where the shape takes it (gt_pre: K fp32)."""
    s = SHAPES[kind]
    H, K, HV = s["H"], s["K"], s["HV"]
    h = (L - 1) / 2
    coef = 2 * max(4, 1 << (L - 1).bit_length()) * 4  # (2 x BC fp32: decode_v3's BC, the ring's capacity L rounded up)
    both = 2 * K * 2 + h * K * rec_es + K * rec_es
    if kind == "gdn":
        per_v = 2 + h * 4 + coef + 2 * 4 + 4
        return B * H * (both + (HV // H) * per_v)
    per = both + K * 2 + 2 * K * 4 + coef + 4 + (K * 4 if gt_pre else 0)
    return B * HV * per


def launch_split(run: dict, min_b: int = 1) -> list[dict]:
    """Per (layer, state, B) of a run with bench_kernels' `--variants fixed` arms (`v3_fx_<shape>` and its `_pre`,
    `_main`, `_post`, `_premain`, `_nofold`; the round-robin `_rr` medians where timed): the step by launch. The pre
    launch's exposure is pre + main less main alone, the post launch's the step less pre + main, the folds' the step
    less the step without them; then the step with the pre launch's exposure taken off (what hiding it for free
    would give), with the pre launch overlapped but its bytes still streamed at the copy peak (what any overlap can
    give at most), and that with the folds at their bytes' cost as well (no folding blocks in the tail)."""
    meta, rows = run["meta"], run["rows"]
    cells: dict[tuple, dict] = {}
    for r in rows:
        if r["B"] >= min_b:
            cells.setdefault((r["kind"], r["state_dtype"], r["B"]), {})[r["arm"]] = r["t_us"]
    out = []
    for (kind, sdt, B), arms in sorted(cells.items()):
        conv = arms.get("conv")
        steps = [a for a in arms if a.startswith("v3_fx_") and not a.endswith("_rr")
                 and not any(a.endswith("_" + p) for p in FX_PARTS + ("aligned",))]
        if conv is None or len(steps) != 1:
            continue
        step = steps[0]
        # an fp32 state's cells time its fp8 read copy's default (v3_fx_fp8_<shape>, session 56): issue 7's target
        # from B = 256, the records fp32, and a fold that reads the checkpoint as well as writing it
        group = group_of(step)

        def t(suffix):
            return arms.get(step + suffix + "_rr", arms.get(step + suffix))

        parts = {p: t("_" + p) for p in FX_PARTS}
        if t("") is None or any(v is None for v in parts.values()):
            continue
        full = t("")
        pre_exposed = parts["premain"] - parts["main"]
        folds = full - parts["nofold"]
        # (issue 3's speedup targets are for B >= 128, issue 7's 3x for B >= 256)
        target = group_target(kind, sdt, group) if B >= (RC_FP8_MIN_B if group == "rc_fp8" else 128) else None
        shape = step[len("v3_fx_fp8_" if group == "rc_fp8" else "v3_fx_"):]
        peak = meta["copy_peak_Bps"]
        # the pre launch overlapped with the main launch, its bytes streamed beside the tiles at the copy peak (no
        # overlap can make them free); then also the folds at their bytes' cost (their writes at the peak)
        pre_peak = pre_bytes(kind, B, "_gp" in shape, meta.get("L", 16), rec_es=ES[sdt]) / peak * 1e6
        fold_peak = fold_write_bytes(kind, B, sdt, meta.get("L", 16), group) / peak * 1e6
        overlap_us = full - pre_exposed + pre_peak
        both_us = overlap_us - max(folds - fold_peak, 0.0)

        def met(us):
            return target is not None and conv / us >= target

        aligned = t("_aligned")  # (every row on one cursor, where the run timed it; None before session 46's)
        out.append(dict(gpu=meta.get("gpu", "?"), kind=kind, state=sdt, group=group, B=B, shape=shape, conv_us=conv,
                        aligned_us=aligned,
                        step_us=full, x=conv / full, **{p + "_us": v for p, v in parts.items()},
                        pre_exposed=pre_exposed, post_exposed=full - parts["premain"], folds=folds,
                        nopre_x=conv / (full - pre_exposed), target=target, nopre_met=met(full - pre_exposed),
                        pre_peak_us=pre_peak, overlap_us=overlap_us, overlap_x=conv / overlap_us,
                        overlap_met=met(overlap_us), both_us=both_us, both_x=conv / both_us, both_met=met(both_us)))
    return out


def split_table(rows: list[dict]) -> str:
    head = ["GPU", "layer", "state", "B", "shape", "conv us", "step us (x conv)", "pre / main / post alone",
            "pre + main", "pre exposed", "post exposed", "folds", "without the pre's exposure",
            "the pre overlapped at its bytes' cost (its bytes at the peak, us)", "... and the folds at theirs",
            "target", "every row on one cursor: step us"]
    body = []
    for r in rows:
        def x(key):
            met = "" if r["target"] is None else (" (met)" if r[key + "_met"] else " (not met)")
            return f"{r[key + '_x']:.2f}x{met}"

        body.append([gpu_label(r), r["kind"].upper(), state_label(r), str(r["B"]), f"`{r['shape']}`",
                     f"{r['conv_us']:.1f}", f"{r['step_us']:.1f} ({r['x']:.2f}x)",
                     f"{r['pre_us']:.1f} / {r['main_us']:.1f} / {r['post_us']:.1f}", f"{r['premain_us']:.1f}",
                     f"{r['pre_exposed']:.1f}", f"{r['post_exposed']:.1f}", f"{r['folds']:.1f}", x("nopre"),
                     f"{x('overlap')} ({r['pre_peak_us']:.1f})", x("both"),
                     f"{r['target']:.2f}x" if r["target"] else "-",
                     "-" if r["aligned_us"] is None else f"{r['aligned_us']:.1f}"])
    return md_table(head, body)


def table(rows: list[dict]) -> str:
    head = ["GPU", "layer", "state", "B", "conv us (% peak)", "our fastest step", "us", "x conv",
            "target: needs us (% peak)", "ours now % peak", "bytes ceiling at conv's % peak",
            "without folds (diagnostic): us, x conv, % peak", "folds cost us",
            "fold split's floor: us, x conv (meets?)", "plain rows must stream at (now)", "met?"]
    body = []
    for r in rows:
        split = "split_us" in r
        body.append([
            gpu_label(r), r["kind"].upper(), state_label(r),
            str(r["B"]), f"{r['conv_us']:.1f} ({100 * r['conv_eff']:.0f}%)", f"`{r['best_arm']}`",
            f"{r['best_us']:.1f}", f"{r['best_x']:.2f}x",
            f"{r['target']:.2f}x: {r['need_us']:.1f} ({100 * r['need_eff']:.0f}%)", f"{100 * r['best_eff']:.0f}%",
            f"{r['ceiling_x']:.2f}x",
            f"{r['nofold_us']:.1f}, {r['nofold_x']:.2f}x, {100 * r['nofold_eff']:.0f}%" if "nofold_us" in r else "-",
            f"{r['fold_us']:.1f}" if "fold_us" in r else "-",
            f"{r['split_us']:.1f}, {r['split_x']:.2f}x ({'yes' if r['split_met'] else 'no'})" if split else "-",
            f"{100 * r['plain_need_eff']:.0f}% ({100 * r['nofold_eff']:.0f}%)" if split else "-",
            "yes" if r["met"] else "no"])
    return md_table(head, body)


def _axes(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


def _finish(fig, ax, rows: list[dict], path: Path, ylabel: str, title: str, tag=lambda r: "") -> None:
    """The two plots' common end: one tick per row (GPU, layer, state and tag(row), B), labels, legend, the file."""
    ax.set_xticks(list(range(len(rows))))
    ax.set_xticklabels([f"{gpu_label(r)[:4]}\n{r['kind']} {ABBR.get(r['state'], r['state'])}{tag(r)}\nB={r['B']}"
                        for r in rows], fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def plot(rows: list[dict], path: Path) -> None:
    fig, ax = _axes(max(6.0, 0.75 * len(rows)), 4.2)
    xs = range(len(rows))
    ax.bar([x - 0.27 for x in xs], [r["best_x"] for r in rows], 0.27, label="ours (fastest full step)")
    ax.bar(list(xs), [r.get("nofold_x", 0) for r in rows], 0.27, label="ours without folds (diagnostic)")
    ax.bar([x + 0.27 for x in xs], [r["ceiling_x"] for r in rows], 0.27, label="bytes ceiling at conv's efficiency")
    ax.scatter(list(xs), [r["target"] for r in rows], marker="_", s=900, color="k", zorder=3, label="target")
    split = [(x, r["split_x"]) for x, r in zip(xs, rows) if "split_x" in r]
    if split:
        ax.scatter([x for x, _ in split], [v for _, v in split], marker="v", s=28, color="tab:red", zorder=4,
                   label="fold split's floor (folds at their bytes' peak time)")
    _finish(fig, ax, rows, path, "x conventional (same run)",
            "Speed targets against the bytes model (scripts/target_bounds.py)",
            copy_tag)


def plot_split(rows: list[dict], path: Path, per_target: bool = False) -> None:
    """Stacked bars of launch_split's rows: the main launch without its folds, the folds, the pre launch's and the
    post launch's exposure (they add up to the step), beside the time the target allows (conventional / target) and
    conventional's own time, per (GPU, layer, B). per_target: every bar in units of the time its group's target
    allows (1.0: the target met exactly; above it, missed), conventional left out, and the two levers' bounds marked
    (the pre launch overlapped at its bytes' cost; that and the folds at theirs)."""
    fig, ax = _axes(max(8.0, 0.8 * len(rows)), 4.6)
    xs = list(range(len(rows)))
    # (a row's `target` is None below the B the issue asks from; its group's target scales every row)
    unit = [r["conv_us"] / group_target(r["kind"], r["state"], r["group"]) if per_target else 1.0 for r in rows]
    parts = (("main launch without folds", lambda r: r["step_us"] - r["pre_exposed"] - r["post_exposed"] - r["folds"],
              "tab:blue"),
             ("folds", lambda r: r["folds"], "tab:orange"),
             ("pre launch exposed", lambda r: r["pre_exposed"], "tab:red"),
             ("post launch exposed", lambda r: r["post_exposed"], "tab:gray"))
    bottom = [0.0] * len(rows)
    for label, f, color in parts:
        vals = [f(r) / u for r, u in zip(rows, unit)]
        ax.bar(xs, vals, 0.6, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals)]
    if per_target:
        ax.axhline(1.0, color="tab:green", lw=1.2, label="what the target allows (conventional / target)")
        ax.scatter(xs, [r["overlap_us"] / u for r, u in zip(rows, unit)], marker="v", s=30, color="k", zorder=4,
                   label="pre launch overlapped at its bytes' cost")
        ax.scatter(xs, [r["both_us"] / u for r, u in zip(rows, unit)], marker="o", s=22, color="tab:purple",
                   zorder=4, label="... and the folds at their bytes' cost")
        ax.set_ylim(0, max(bottom) * 1.12)
        _finish(fig, ax, rows, path, "step / time the target allows",
                "The step by launch, in units of what the target allows (bench_kernels.py --variants fixed)",
                copy_tag)
        return
    ax.scatter(xs, [r["conv_us"] for r in rows], marker="_", s=500, color="k", zorder=3, label="conventional")
    tx = [(x, r["conv_us"] / r["target"]) for x, r in zip(xs, rows) if r["target"]]
    if tx:
        ax.scatter([x for x, _ in tx], [v for _, v in tx], marker="_", s=500, color="tab:green", zorder=3,
                   label="what the target allows")
    _finish(fig, ax, rows, path, "us per layer-step", "The step by launch (bench_kernels.py --variants fixed)",
            copy_tag)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="bench_kernels.py JSON files")
    ap.add_argument("--min-b", type=int, default=128)
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown table here")
    ap.add_argument("--plot", type=Path, default=None, help="and a PNG of it (needs matplotlib)")
    ap.add_argument("--fit", action="store_true", help="also the fixed and per-row parts of each step (a + b B)")
    ap.add_argument("--plot-split", type=Path, default=None,
                    help="with --fit: a PNG of the step by launch (needs matplotlib and --variants fixed arms)")
    ap.add_argument("--split-per-target", action="store_true",
                    help="--plot-split's bars in units of the time each target allows, with the levers' bounds")
    args = ap.parse_args(argv)
    rows, fit_rows, split_rows = [], [], []
    for p in args.runs:
        run = json.loads(p.read_text())
        rows += bounds(run, args.min_b)
        if args.fit:
            fit_rows += fits(run, args.min_b)
            split_rows += launch_split(run, args.min_b)
    if not rows:
        print("no cell with conventional and one of our full steps at B >= %d" % args.min_b, file=sys.stderr)
        return 1
    md = table(rows)
    if fit_rows:
        md += "\n" + fit_table(fit_rows)
    if split_rows:
        md += "\n" + split_table(split_rows)
    print(md, end="")
    if args.out:
        args.out.write_text(md)
    if args.plot:
        plot(rows, args.plot)
    if args.plot_split and split_rows:
        plot_split(split_rows, args.plot_split, per_target=args.split_per_target)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The share of a decode step that the linear-attention state update takes, from a torch-profiler chrome trace.

    python scripts/trace_share.py TRACE.trace.json.gz [--linear-layers N]     # prints the analysis as JSON

The trace is what SGLang's `/start_profile` writes (torch.profiler `export_chrome_trace`, gzip'd or plain): a
JSON object with "traceEvents" (or a bare event list). Used by the `profile` task of scripts/gpu_e2e.py.

GPU events are complete events (ph "X") of category "kernel", "gpu_memcpy" or "gpu_memset" with a finite
ts/dur (microseconds). A kernel is a *state update* when its name contains one of STATE_UPDATE_SUBSTRINGS
(case-sensitive: NCCL's "..._RING_..." kernels must not match). Everything else is "other".

Steps, primary method ("graph_launch"): SGLang's decode CUDA-graph runner replays one graph per forward step
(full_cuda_graph_backend.py: `self._graphs[shape_key].replay()`), and CUPTI gives each kernel of a replayed graph
the correlation id of its `cudaGraphLaunch` runtime call. Kernels are grouped by the graph launch they belong
to; a group's first kernel start is a step boundary. The first group may be cut by the profiler's start, so
the analysed window runs from the second boundary to the last one: exactly len(groups) - 2 complete periods
of the decode loop, each holding one graph replay plus whatever ran eagerly between replays (sampling,
copies, the scheduler's small kernels). Every GPU event that starts in the window counts.
Cross-check / fallback ("state_kernel_per_layer"): the count of the most frequent state-update kernel name
divided by the model's linear-layer count (one launch per linear layer per step). When the trace has fewer
than 3 graph launches with kernels (no CUDA graphs, or no runtime events), the whole trace is the window and
this count gives the steps.
The share does not depend on the step count: it is state-update kernel time / GPU busy time (the union of
all GPU event intervals) over the same window; `share_of_span` divides by the window's GPU wall time instead
(idle gaps included). Under CUDA graphs a CUPTI/kineto build may record a replayed graph as a whole instead of
its kernels: then no state-update kernel is found and the share is None with a reason, never 0.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
from collections import defaultdict
from pathlib import Path

# Substrings of the recurrent (GDN/KDA) decode kernels' names, the state update. Kept in one place; a kernel
# whose name contains any of these is a state-update kernel.
STATE_UPDATE_SUBSTRINGS: tuple[str, ...] = (
    # --- SGLang 0.5.17 (conventional arm and upstream's flag)
    "fused_recurrent_gated_delta_rule",  # fla/fused_recurrent.py: fwd, packed_decode, update_fwd kernels (GDN)
    "fused_recurrent_kda",               # fla/fused_recurrent.py: fused_recurrent_kda_packed_decode_kernel (KDA, Triton)
    "fused_sigmoid_gating_delta_rule",   # fla/fused_sigmoid_gating_recurrent.py: the non-packed GDN decode
    "kda_packed_decode",                 # kernels/jit/csrc/attention/kda_packed_decode.cuh: the CUDA row-streaming KDA decode
    "kda_decode_fusion",                 # kda_fused_decode.cuh: conv + recurrence + gated norm in one kernel (Kimi K3)
    "fused_recurrent_linear_replayssm",  # fla/fused_recurrent_linear_replayssm.py: upstream's replayssm decode
    "replayssm",                         # fla/{gdn,kda}_replayssm_spec_*.py: upstream's replayssm spec/fold kernels
    "gdn_decode",                        # FlashInfer / CuTe DSL GDN decode backends (not SGLang's default)
    # --- ours (kernels/*.py, installed as replayssm_sglang/kernels)
    "replay_decode",                     # replay_decode{,_v2,_v2_post,_v3,_v3_pre,_w1}_kernel
    "_ring_prefold", "_ring_verify", "_ring_commit",  # verify.py: the speculative verify path on the ring
    "_materialize_kernel",               # verify.py: a draft's exact state into an extra_buffer track slot
    "_set_rc_valid_kernel",              # decode_v3.py: the read copy's valid flags (two-precision state)
    "_row_order_kernel",                 # decode_v3.py: the main launch's row order (row_order="flush_first")
)
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def is_state_update(name: str) -> bool:
    return any(s in name for s in STATE_UPDATE_SUBSTRINGS)


def load_trace(path: str | Path) -> dict | list:
    """A chrome trace, gzip'd (detected by its magic bytes, whatever the name) or plain JSON."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw)


def _num(x) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _events(trace: dict | list) -> list[dict]:
    ev = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    return [e for e in ev if isinstance(e, dict) and e.get("ph") == "X"]


def _union_us(intervals: list[tuple[float, float]]) -> float:
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def _ok(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def durations(ds: list[float], bin_us: float = 10.0) -> dict:
    """The distribution of one kernel's launch durations (us): count, median, 10th/90th percentile, max and a
    histogram in bin_us bins (key: the bin's lower edge). A kernel whose work differs between steps shows here,
    where the mean hides it: e.g. the decode step that writes every row's checkpoint when all rows of a batch
    share one cursor (2026-11-30: GDN 503 us against 138-151 us for the other 15 steps of the window)."""
    ds = sorted(d for d in ds if math.isfinite(d))
    if not ds:
        return {"count": 0}

    def q(f):
        return ds[min(len(ds) - 1, int(f * len(ds)))]
    hist: dict = defaultdict(int)
    for d in ds:
        hist[str(int(d // bin_us * bin_us))] += 1
    mid = len(ds) // 2
    median = ds[mid] if len(ds) % 2 else 0.5 * (ds[mid - 1] + ds[mid])
    return {"count": len(ds), "median_us": median, "p10_us": q(0.1), "p90_us": q(0.9), "max_us": ds[-1],
            "mean_us": sum(ds) / len(ds), "histogram_us": dict(sorted(hist.items(), key=lambda kv: float(kv[0])))}


def analyze(trace: dict | list | str | Path, linear_layers: int | None = None, top: int = 10) -> dict:
    """Per-step GPU busy time, per-step state-update time, their ratio and the top kernels (module docstring)."""
    src = None
    if isinstance(trace, (str, Path)):
        src = str(trace)
        trace = load_trace(trace)
    xs = _events(trace)
    gpu, skipped = [], 0
    for e in xs:
        if str(e.get("cat", "")).lower() not in GPU_CATS:
            continue
        ts, dur = _num(e.get("ts")), _num(e.get("dur"))
        if ts is None or dur is None or dur < 0:
            skipped += 1
            continue
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        gpu.append({"name": str(e.get("name", "")), "cat": str(e.get("cat")).lower(), "ts": ts, "dur": dur,
                    "corr": args.get("correlation")})
    kernels = [e for e in gpu if e["cat"] == "kernel"]
    launch_corr = set()
    for e in xs:
        if "GraphLaunch" in str(e.get("name", "")) and str(e.get("cat", "")).lower() != "kernel":
            c = (e.get("args") or {}).get("correlation") if isinstance(e.get("args"), dict) else None
            if c is not None:
                launch_corr.add(c)
    groups: dict = {}
    for k in kernels:
        if k["corr"] is not None and k["corr"] in launch_corr:
            groups[k["corr"]] = min(groups.get(k["corr"], math.inf), k["ts"])
    starts = sorted(groups.values())
    res: dict = {"trace": src, "gpu_events": len(gpu), "kernel_events": len(kernels),
                 "skipped_events": skipped, "graph_launches": len(launch_corr),
                 "graph_launches_with_kernels": len(groups), "linear_layers": linear_layers,
                 "substrings": list(STATE_UPDATE_SUBSTRINGS), "warnings": []}
    if len(starts) >= 3:
        lo, hi, closed = starts[1], starts[-1], False
        steps_graph = len(starts) - 2
        res["window"] = "graph_launch_boundaries"
    elif gpu:
        lo, hi, closed = min(e["ts"] for e in gpu), max(e["ts"] + e["dur"] for e in gpu), True
        steps_graph = None
        res["window"] = "whole_trace"
    else:
        lo = hi = 0.0
        closed, steps_graph = True, None
        res["window"] = "empty"
    win = [e for e in gpu if lo <= e["ts"] < hi or (closed and e["ts"] == hi)]
    busy = _union_us([(e["ts"], min(e["ts"] + e["dur"], hi)) for e in win])
    span = hi - lo
    ksum = sum(e["dur"] for e in win if e["cat"] == "kernel")
    per_name: dict = defaultdict(lambda: [0.0, 0])
    state_durs: dict = defaultdict(list)  # every launch's duration, state-update kernels only
    for e in win:
        if e["cat"] == "kernel":
            per_name[e["name"]][0] += e["dur"]
            per_name[e["name"]][1] += 1
            if is_state_update(e["name"]):
                state_durs[e["name"]].append(e["dur"])
    state = {n: v for n, v in per_name.items() if is_state_update(n)}
    state_us = sum(v[0] for v in state.values())
    steps_layers = None
    if state and linear_layers:
        steps_layers = max(v[1] for v in state.values()) / linear_layers
    if steps_graph is not None:
        steps, method = steps_graph, "graph_launch"
        if steps_layers is not None and abs(steps_layers - steps_graph) > 0.5:
            res["warnings"].append(
                f"{steps_graph} graph-launch periods but {steps_layers:.2f} launches of the most frequent "
                f"state-update kernel per linear layer: more than one graph per step, or a kernel not launched "
                f"once per layer per step")
    elif steps_layers is not None and steps_layers >= 1:
        steps, method = int(round(steps_layers)), "state_kernel_per_layer"
        if abs(steps_layers - steps) > 0.01:
            res["warnings"].append(f"{steps_layers:.3f} state-update launches per linear layer: not an integer "
                                   f"(the whole trace is the window, edge steps are partial)")
    else:
        steps, method = None, None
    res.update({"steps": steps, "steps_method": method, "steps_by_graph_launch": steps_graph,
                "steps_by_state_kernel": steps_layers, "window_us": span, "gpu_busy_us": busy,
                "kernel_sum_us": ksum, "state_update_us": state_us,
                "state_kernels": {n: {"us": v[0], "count": v[1]} for n, v in
                                  sorted(state.items(), key=lambda kv: -kv[1][0])}})
    share = share_span = None
    reason = None
    if not gpu:
        reason = "no GPU kernel events in the trace"
    elif not state:
        reason = (f"no state-update kernel events among {len(kernels)} kernel events"
                  + (f" ({len(launch_corr)} CUDA-graph launches, {len(groups)} with kernels: the kernels inside"
                     f" replayed graphs may not be recorded individually by this CUPTI/kineto)"
                     if launch_corr else "")
                  + "; none of the names matches STATE_UPDATE_SUBSTRINGS")
    elif busy <= 0 or state_us <= 0:
        reason = "zero GPU busy time or zero state-update time in the window"
    else:
        share = _ok(state_us / busy)
        share_span = _ok(state_us / span) if span > 0 else None
        if share is None:
            reason = "share not finite"
    res["share"], res["share_of_span"], res["reason"] = share, share_span, reason
    if steps:
        res["per_step"] = {"span_us": _ok(span / steps), "busy_us": _ok(busy / steps),
                           "state_update_us": _ok(state_us / steps) if state else None,
                           "kernel_launches": sum(v[1] for v in per_name.values()) / steps}
    else:
        res["per_step"] = None
    res["state_kernel_durations"] = {n[:200]: durations(ds) for n, ds in state_durs.items()}
    res["top_kernels"] = [
        {"name": n[:200], "us": v[0], "count": v[1], "state_update": is_state_update(n),
         "share_of_busy": _ok(v[0] / busy) if busy > 0 else None,
         "us_per_step": _ok(v[0] / steps) if steps else None}
        for n, v in sorted(per_name.items(), key=lambda kv: -kv[1][0])[:top]]
    return res


def summary(res: dict) -> str:
    """One line: steps, per-step GPU time, the state update's time and share (or why there is none)."""
    ps = res.get("per_step") or {}
    head = (f"{res.get('steps')} steps ({res.get('steps_method')}), " if res.get("steps") else "steps unknown, ")
    if ps.get("span_us") is not None:
        head += f"step {ps['span_us'] / 1000:.3f} ms on the GPU (busy {ps['busy_us'] / 1000:.3f} ms), "
    if res.get("share") is None:
        return head + f"state-update share n/a: {res.get('reason')}"
    st = ps.get("state_update_us")
    sp = res.get("share_of_span")
    return (head + (f"state update {st / 1000:.3f} ms/step = " if st is not None else "state update ")
            + f"{res['share']:.1%} of GPU busy time"
            + (f" ({sp:.1%} of the step's GPU wall)" if sp is not None else ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--linear-layers", type=int, default=None)
    ap.add_argument("--top", type=int, default=10)
    a = ap.parse_args()
    res = analyze(a.trace, a.linear_layers, a.top)
    print(json.dumps(res, indent=1))
    print(summary(res))


if __name__ == "__main__":
    main()

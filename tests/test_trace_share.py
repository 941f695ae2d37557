"""scripts/trace_share.py (the state update's share of a decode step from a torch-profiler chrome trace) on
synthetic traces with known kernel durations, and scripts/gpu_e2e.py's `profile` task: its /start_profile body
against SGLang 0.5.17's own ProfileReq and scheduler code, and the whole task against a fake server. No GPU."""
import gzip
import inspect
import json
import math
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import trace_share as T  # noqa: E402

SGL = Path(__import__("importlib.util").util.find_spec("sglang").origin).parent

# ---------------------------------------------------------------------------------------- synthetic traces

P = 1000.0  # one decode step every 1000 us
T0 = 10_000.0
STATE = "replay_decode_w1_kernel"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_execute_kernel__5x_cublas"


def _k(name, ts, dur, corr, cat="kernel", stream=7):
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr}}


def _rt(name, ts, corr, cat="cuda_runtime"):
    return {"ph": "X", "cat": cat, "name": name, "pid": 4242, "tid": 4242, "ts": ts, "dur": 5.0,
            "args": {"correlation": corr}}


def step_events(i, state_name=STATE, layers=2, first_partial=False, last_partial=False):
    """Step i: one graph replay (gemm 200, state 100 per linear layer, add 50) then an eager sampling kernel
    (100) and a copy (20, on another stream, inside the sampling kernel's time). Per step: GPU busy 750 us,
    state update 100 * layers us (layers = 2: 200), kernel sum 750, span P = 1000 (300 * layers + 400)."""
    t = T0 + i * (300 * layers + 400)
    g, e = 1000 + 2 * i, 1001 + 2 * i
    ev = [_rt("cudaGraphLaunch", t - 30, g), _rt("cudaLaunchKernel", t + 600, e)]
    ks = []
    for l in range(layers):
        ks += [_k(GEMM, t + 300 * l, 200, g), _k(state_name, t + 300 * l + 200, 100, g)]
    ks += [_k("triton_poi_fused_add_0", t + 300 * layers, 50, g),
           _k("sampling_argmax_kernel", t + 300 * layers + 100, 100, e),
           _k("Memcpy DtoH (Device -> Pinned)", t + 300 * layers + 150, 20, e, cat="gpu_memcpy", stream=9)]
    if first_partial:  # the profiler started mid-graph: only the graph's tail was recorded
        ks = ks[-4:]
    if last_partial:  # it stopped mid-graph
        ks = ks[:2]
    return ev + ks


def make_trace(n=6, **kw):
    ev = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    for i in range(n):
        ev += step_events(i, first_partial=(i == 0), last_partial=(i == n - 1), **kw)
    return {"schemaVersion": 1, "traceEvents": ev, "displayTimeUnit": "ms"}


def write(tmp_path, trace, gz):
    p = tmp_path / ("123.4-TP-0.trace.json.gz" if gz else "123.4-TP-0.trace.json")
    raw = json.dumps(trace).encode()
    p.write_bytes(gzip.compress(raw) if gz else raw)
    return p


# ------------------------------------------------------------------------------------------------ parser

@pytest.mark.parametrize("gz", [True, False])
def test_share_exact_over_whole_steps(tmp_path, gz):
    """6 graph replays, the first and last cut by the profiler: the window is replays 1..5, 4 whole steps."""
    p = write(tmp_path, make_trace(6), gz)
    r = T.analyze(p, linear_layers=2)
    assert r["steps"] == 4 and r["steps_method"] == "graph_launch" and r["steps_by_graph_launch"] == 4
    assert r["steps_by_state_kernel"] == 4.0 and r["warnings"] == []
    assert r["graph_launches"] == 6 and r["graph_launches_with_kernels"] == 6
    assert r["window_us"] == 4 * P
    assert r["gpu_busy_us"] == 4 * 750.0  # the copy overlaps the sampling kernel: a union, not a sum
    assert r["kernel_sum_us"] == 4 * 750.0
    assert r["state_update_us"] == 4 * 200.0
    assert r["share"] == 200.0 / 750.0
    assert r["share_of_span"] == 200.0 / 1000.0
    assert r["reason"] is None
    assert r["per_step"] == {"span_us": 1000.0, "busy_us": 750.0, "state_update_us": 200.0,
                             "kernel_launches": 6.0}
    assert r["state_kernels"] == {STATE: {"us": 800.0, "count": 8}}
    top = r["top_kernels"]
    assert [k["name"] for k in top] == [GEMM, STATE, "sampling_argmax_kernel", "triton_poi_fused_add_0"]
    assert top[0]["us"] == 1600.0 and top[0]["count"] == 8 and top[0]["us_per_step"] == 400.0
    assert [k["state_update"] for k in top] == [False, True, False, False]
    assert top[1]["share_of_busy"] == 800.0 / 3000.0
    s = T.summary(r)
    assert "4 steps (graph_launch)" in s and "26.7% of GPU busy time" in s and "20.0% of the step" in s


def test_state_kernel_durations_show_the_heavy_step():
    """One step in four runs its state kernels 4x longer (a window whose checkpoint writes come together): the
    per-kernel distribution shows both modes where the mean blends them; the share is unchanged in kind."""
    ev = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    for i in range(10):
        for e in step_events(i, first_partial=(i == 0), last_partial=(i == 9)):
            if e.get("name") == STATE and i % 4 == 3:
                e = dict(e, dur=400.0)
            ev.append(e)
    res = T.analyze({"traceEvents": ev}, linear_layers=2)
    d = res["state_kernel_durations"][STATE]
    # window: steps 1..8 (the first and last are partial and outside the boundaries), 2 state launches each
    assert d["count"] == 16
    assert d["median_us"] == 100.0 and d["max_us"] == 400.0 and d["p10_us"] == 100.0
    assert d["histogram_us"] == {"100": 12, "400": 4}
    assert d["mean_us"] == pytest.approx((12 * 100 + 4 * 400) / 16)
    assert T.durations([]) == {"count": 0}
    assert T.durations([float("nan"), 5.0])["count"] == 1


def test_gz_detected_by_content_not_name(tmp_path):
    p = tmp_path / "plain_name.json"
    p.write_bytes(gzip.compress(json.dumps(make_trace(5)).encode()))
    assert T.analyze(p, 2)["steps"] == 3


def test_bare_event_list_and_three_layers():
    """A chrome trace may be a bare event array; 3 linear layers -> 300 us of state update per step."""
    tr = make_trace(5, layers=3)["traceEvents"]
    r = T.analyze(tr, linear_layers=3)
    assert r["steps"] == 3 and r["state_update_us"] == 3 * 300.0 and r["window_us"] == 3 * 1300.0
    assert r["gpu_busy_us"] == 3 * (300 * 3 + 50 + 100)  # gemm+state per layer, add, sampling
    assert r["share"] == 300.0 / 1050.0 and r["share_of_span"] == 300.0 / 1300.0


def test_step_count_disagreement_is_flagged():
    """Told the model has 3 linear layers while the trace launches the state kernel twice per step: the graph
    count stays the step count, with a warning."""
    r = T.analyze(make_trace(6), linear_layers=3)
    assert r["steps"] == 4 and r["steps_by_state_kernel"] == pytest.approx(8 / 3)
    assert len(r["warnings"]) == 1 and "graph-launch periods" in r["warnings"][0]


def test_no_graph_launches_falls_back_to_state_kernel_count():
    """No runtime events (or eager decode): the whole trace is the window, steps = state launches / layers."""
    ev = [e for i in range(3) for e in step_events(i) if e["cat"] != "cuda_runtime"]
    r = T.analyze({"traceEvents": ev}, linear_layers=2)
    assert r["window"] == "whole_trace" and r["graph_launches"] == 0
    assert r["steps"] == 3 and r["steps_method"] == "state_kernel_per_layer" and r["steps_by_graph_launch"] is None
    # window from the first kernel start to the last event end: 2 full periods + the last step's 800 us
    assert r["window_us"] == 2 * P + 800.0
    assert r["state_update_us"] == 600.0 and r["gpu_busy_us"] == 3 * 750.0
    assert r["share"] == 600.0 / 2250.0
    assert T.analyze({"traceEvents": ev})["steps"] is None  # no layer count: no step count, the share remains
    assert T.analyze({"traceEvents": ev})["share"] == 600.0 / 2250.0


def test_no_state_update_kernels_gives_none_with_reason():
    """Graph replays recorded as launches only (their kernels absent) and eager kernels without a state update:
    share None and a reason naming the graphs, never 0."""
    ev = [e for i in range(6) for e in step_events(i)
          if not (e["cat"] == "kernel" and e["args"]["correlation"] % 2 == 0)]  # drop the graph kernels
    r = T.analyze({"traceEvents": ev}, linear_layers=2)
    assert r["share"] is None and r["share_of_span"] is None
    assert r["state_update_us"] == 0 and r["kernel_events"] == 6
    assert "no state-update kernel events among 6 kernel events" in r["reason"]
    assert "6 CUDA-graph launches, 0 with kernels" in r["reason"]
    assert "n/a" in T.summary(r)


@pytest.mark.parametrize("trace", [{"traceEvents": []}, [], {"traceEvents": [{"ph": "M", "name": "x"}]},
                                   {"traceEvents": [_k("cpu thing", 1.0, 2.0, 1, cat="cpu_op")]}])
def test_empty_trace_gives_none(trace):
    r = T.analyze(trace, linear_layers=2)
    assert r["share"] is None and r["reason"] == "no GPU kernel events in the trace"
    assert r["steps"] is None and r["per_step"] is None and r["top_kernels"] == []


def test_nan_and_bad_durations_never_become_a_share():
    """A state kernel with a NaN / negative / missing duration is skipped, not summed: only it -> None."""
    ev = [_k(STATE, 10.0, float("nan"), 1), _k(STATE, 20.0, -5.0, 2), _k(STATE, 30.0, None, 3),
          _k(STATE, float("inf"), 4.0, 4), _k("other_kernel", 40.0, 10.0, 5)]
    r = T.analyze({"traceEvents": ev}, linear_layers=1)
    assert r["skipped_events"] == 4 and r["kernel_events"] == 1
    assert r["share"] is None and "no state-update kernel events" in r["reason"]
    # and json round trip (what the harness stores) has no NaN
    assert "NaN" not in json.dumps(r) and "Infinity" not in json.dumps(r)
    ok = T.analyze({"traceEvents": ev + [_k(STATE, 50.0, 30.0, 6)]}, linear_layers=1)
    assert ok["share"] == 30.0 / 40.0 and math.isfinite(ok["share"])


def test_zero_duration_state_kernels_are_not_a_zero_share():
    ev = [_k(STATE, 10.0, 0.0, 1), _k("other_kernel", 20.0, 10.0, 2)]
    r = T.analyze({"traceEvents": ev}, linear_layers=1)
    assert r["share"] is None and "zero" in r["reason"]


# -------------------------------------------------------------------------------------------- classification

def _triton_kernels(path: Path) -> list[str]:
    t = path.read_text(errors="replace")
    return [m.group(1) for m in re.finditer(r"@triton\.jit[^\n]*\n(?:@[^\n]*\n)*def (\w+_kernel)\(", t)]


def test_our_kernels_are_state_updates():
    """Every Triton kernel (not helper) of ours, read from kernels/*.py, is a state-update kernel."""
    names = [n for p in sorted((ROOT / "kernels").glob("*.py")) for n in _triton_kernels(p)]
    assert {"replay_decode_w1_kernel", "replay_decode_v3_kernel", "replay_decode_v3_pre_kernel",
            "_ring_verify_kernel"} <= set(names)
    assert [n for n in names if not T.is_state_update(n)] == []


def test_sglang_recurrent_decode_kernels_are_state_updates():
    fla = SGL / "kernels" / "ops" / "attention" / "fla"
    names = (_triton_kernels(fla / "fused_recurrent.py") + _triton_kernels(fla / "fused_recurrent_linear_replayssm.py")
             + _triton_kernels(fla / "fused_sigmoid_gating_recurrent.py"))
    assert {"fused_recurrent_gated_delta_rule_packed_decode_kernel", "fused_recurrent_kda_packed_decode_kernel",
            "fused_recurrent_linear_replayssm_decode_kernel",
            "fused_sigmoid_gating_delta_rule_update_kernel"} <= set(names)
    cuh = (SGL / "kernels" / "jit" / "csrc" / "attention" / "kda_packed_decode.cuh").read_text()
    cuda = re.findall(r"__global__\b.{0,300}?\bvoid\s+(\w+)\s*\(", cuh, re.S)
    assert cuda == ["kda_packed_decode_kernel"]
    names += cuda
    assert [n for n in names if not T.is_state_update(n)] == []
    # as the profiler shows them: demangled CUDA names with template arguments
    assert T.is_state_update("void device::kda_packed_decode_kernel<8, true>(device::KdaPackedDecodeParams)")


def test_other_kernels_are_not_state_updates():
    """SGLang's other Triton kernels on the decode path (conv1d, gating, norms, attention, sampling helpers) and
    the usual library kernels (cuBLAS, NCCL's RING, PyTorch elementwise) are "other"."""
    fla = SGL / "kernels" / "ops" / "attention" / "fla"
    others = [n for f in ("l2norm.py", "fused_gdn_gating.py", "layernorm_gated.py", "fused_norm_gate.py")
              for n in _triton_kernels(fla / f)]
    assert len(others) >= 4
    others += [GEMM, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ncclKernel_AllReduce_RING_LL_Sum_bf16",
               "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>",
               "_fwd_grouped_kernel_stage1", "_causal_conv1d_update_kernel", "chunk_gated_delta_rule_fwd_kernel_h",
               "triton_poi_fused_add_0", "Memcpy DtoH (Device -> Pinned)"]
    assert [n for n in others if T.is_state_update(n)] == []


# ----------------------------------------------------------------------------------- the profile request

def _gpu_e2e():
    pytest.importorskip("requests")
    import gpu_e2e

    return gpu_e2e


def test_profile_payload_is_sglang_profile_req():
    """The task's /start_profile body through SGLang 0.5.17's own ProfileReq: constructed from the dict (a
    misspelt field is a TypeError here, while the HTTP endpoint would drop it silently: pydantic schema with
    extra "ignore"), and validated as FastAPI does (types)."""
    from pydantic import TypeAdapter

    from sglang.srt.managers.io_struct import ProfileReq, ProfileReqType

    g = _gpu_e2e()
    payload = g.profile_payload("/tmp/prof-x", 64)
    req = ProfileReq(**payload)
    assert req.req_type == ProfileReqType.START_PROFILE
    assert (req.output_dir, req.num_steps, req.activities, req.with_stack, req.record_shapes,
            req.profile_by_stage, req.start_step) == ("/tmp/prof-x", 64, ["GPU"], False, False, False, None)
    via_http = TypeAdapter(ProfileReq).validate_json(json.dumps(payload))
    assert via_http == req
    with pytest.raises(TypeError):
        ProfileReq(**{**payload, "num_step": 64})  # the check above can fail


def test_profile_payload_stops_by_itself_and_names_gpu_activity():
    """SGLang's scheduler code for this body: no stage split and no start step -> the profiler starts at once and
    its target is forward_ct + num_steps + 1 (it stops by itself); "GPU" maps to CUDA activity; the file name is
    <profile_id>-TP-<rank>.trace.json.gz."""
    from sglang.srt.environ import envs
    from sglang.srt.managers.io_struct import ProfileReq
    from sglang.srt.managers.scheduler_components import profiler_manager as pm

    if envs.SGLANG_PROFILE_V2.get():
        pytest.skip("SGLANG_PROFILE_V2 set: the other profiler path")
    req = ProfileReq(**_gpu_e2e().profile_payload("/tmp/prof-x", 64))
    mgr = pm.SchedulerProfilerManager(ps=None, dp_tp_cpu_group=None, get_forward_ct=lambda: 100)
    out = mgr._init_profile(req.output_dir, req.start_step, req.num_steps, req.activities, req.with_stack,
                            req.record_shapes, req.profile_by_stage, "pid", req.merge_profiles, req.profile_prefix)
    assert out.success and mgr.profiler_target_forward_ct == 100 + 64 + 1
    assert mgr.profiler_start_forward_ct is None and not mgr.profile_by_stage
    assert mgr.torch_profiler_output_dir == Path("/tmp/prof-x") and mgr.profiler_activities == ["GPU"]
    src = inspect.getsource(pm.SchedulerProfilerManager)
    assert '"GPU": torch.profiler.ProfilerActivity.CUDA' in src
    assert '".trace.json.gz"' in src and 'f"TP-{self.ps.tp_rank}"' in src
    assert "Profiling done" in src  # the log line the task waits for (gpu_e2e.PROFILE_DONE)


# ------------------------------------------------------------------------- the task against a fake server

class _FakeSGLang(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    logpath: Path = None
    bodies: list = []

    def log_message(self, *a):
        pass

    def _reply(self, body: bytes, code=200):
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _log(self, line):
        with open(self.logpath, "a") as f:
            f.write(line + "\n")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.path == "/start_profile":
            type(self).bodies.append(body)
            out = Path(body["output_dir"])

            def export():
                time.sleep(0.3)
                out.mkdir(parents=True, exist_ok=True)
                (out / f"{time.time()}-TP-0.trace.json.gz").write_bytes(
                    gzip.compress(json.dumps(make_trace(6)).encode()))
                self._log(f"[t] Profiling done. Traces are saved to: {out}")

            threading.Thread(target=export, daemon=True).start()
            return self._reply(b"Start profiling.\n")
        n = body["sampling_params"]["max_new_tokens"]
        B = len(body["input_ids"])
        if n > 16:  # the long decode: log a full batch, then keep decoding for a while
            self._log(f"[t] Decode batch, #running-req: {B}, #full token: 9, gen throughput (token/s): 1234.5, "
                      f"#queue-req: 0")
            time.sleep(1.5)
        self._reply(json.dumps([{"text": "x", "meta_info": {}} for _ in range(B)]).encode())


def test_profile_task_against_fake_server(tmp_path):
    g = _gpu_e2e()
    srv_http = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSGLang)
    threading.Thread(target=srv_http.serve_forever, daemon=True).start()
    try:
        s = g.Server("gdn-ours", "/x", [], srv_http.server_address[1], tmp_path, None)
        s.logpath.write_text("old line\n[t] Decode batch, #running-req: 7, gen throughput (token/s): 1.0\n")
        _FakeSGLang.logpath, _FakeSGLang.bodies = s.logpath, []
        r = g.profile_decode(s, 4096, linear_layers=2, out_dir=tmp_path / "prof", B=8, num_steps=5)
    finally:
        srv_http.shutdown()
    assert _FakeSGLang.bodies == [g.profile_payload(str(tmp_path / "prof"), 5)]
    assert r["steady_before_start"] and r["running_logged"] == [8] and not r["queued"]
    assert r["stopped_by"] == "num_steps" and len(r["traces"]) == 1 and "generate_error" not in r
    assert r["steps"] == 4 and r["share"] == 200.0 / 750.0 and r["share_of_span"] == 0.2
    assert r["per_step"]["state_update_us"] == 200.0 and r["top_kernels"][1]["name"] == STATE
    json.dumps(r)  # stored in e2e.json


def test_e2e_report_renders_the_profile_line():
    import e2e_report as R

    prof = {"batch": 256, "steps": 62, "share": 0.25, "share_of_span": 0.2,
            "per_step": {"span_us": 8000.0, "busy_us": 6400.0, "state_update_us": 1600.0}}
    res = {"models": {"gdn": {"arch": "Qwen3NextForCausalLM", "arms": {
        "conventional": {"profile": prof},
        "ours": {"profile": {"batch": 256, "steps": None, "share": None, "reason": "no GPU kernel events"}}}}}}
    sec = R.section(res, "t")
    assert "| conventional | 256 | 62 | 8.000 | 6.400 | 1.600 | 25.0% | 20.0% |  |" in sec
    assert "| ours | 256 | - | - | - | - | - | - | no GPU kernel events |" in sec
    assert "Profiled decode step" not in R.section({"models": {"gdn": {"arms": {"c": {}}}}}, "t")

"""scripts/gpu_e2e.py: the metrics it reports (agreement, logprob diffs, diversity, log parsing, prefix hit
rate), checked against a fake /generate server. No GPU, no SGLang server."""
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
pytest.importorskip("requests")
pytest.importorskip("aiohttp")
import gpu_e2e as g  # noqa: E402


def _res(tokens, lps):
    return {"tokens": tokens, "logprobs": lps, "top": [[(t, lp), (t + 1, lp - 1)] for t, lp in zip(tokens, lps)]}


def test_compare_divergence_and_logprob_diff():
    ref = [_res([1, 2, 3, 4], [-1.0, -2.0, -3.0, -4.0]), _res([5, 6], [-0.5, -0.5])]
    got = [_res([1, 2, 9, 4], [-1.0, -2.25, -3.0, -7.0]), _res([5, 6], [-0.5, -0.5])]
    c = g.compare(ref, got)
    assert c["token_agreement"] == pytest.approx(5 / 6)
    assert c["identical_prompts"] == 1 and c["min_common_prefix"] == 2
    # chosen-token diffs only over the common prefix (-4 vs -7 after the divergence is not counted)
    assert c["max_abs_logprob_diff"] == pytest.approx(0.25)
    assert c["max_abs_top_logprob_diff"] == pytest.approx(0.25)
    assert g.compare(ref, ref)["max_abs_logprob_diff"] == 0 and g.compare(ref, ref)["token_agreement"] == 1


def test_diversity_flags_degenerate_output():
    varied = [_res(list(range(i * 8, i * 8 + 8)), [-1.0] * 8) for i in range(4)]
    stuck = [_res([7] * 8, [-0.1] * 8) for _ in range(4)]
    assert not g.diversity(varied)["degenerate"]
    d = g.diversity(stuck)
    assert d["degenerate"] and d["stuck_outputs"] == 4 and d["distinct_outputs"] == 1


def test_log_parsing(tmp_path):
    s = g.Server("t", "/x", [], 1, tmp_path, None)
    s.logpath.write_text(
        "[t] Decode batch, #running-req: 216, #full token: 9, mamba usage: 0.6, cuda graph: True, "
        "gen throughput (token/s): 30508.33, #queue-req: 40\n"
        "[t] Decode batch, #running-req: 64, #full token: 9, gen throughput (token/s): 17627.39, #queue-req: 0\n"
        "[t] max_running_requests is capped to 216 by the mamba state cache\n")
    by_b, n = g.server_gen_throughput(s, 0)
    assert by_b == {216: [30508.33], 64: [17627.39]} and n == 3
    assert g.server_gen_throughput(s, 1)[0] == {64: [17627.39]}
    assert g.CAP_RE.search(s.logpath.read_text()).group(1) == "216"


def test_replayssm_notes_kept_from_the_server_log(tmp_path):
    """Server.notes: our log lines (the launches a server took, compiles, fallbacks), not the args dump that names the
    flag, so that a slow arm can be read back from the result JSON."""
    s = g.Server("t", "/x", [], 1, tmp_path, None)
    assert s.notes() == []  # no log yet
    s.logpath.write_text(
        "[t] server_args=ServerArgs(model_path='/m', enable_linear_replayssm=True, " + "x" * 900 + ")\n"
        "[t] ReplaySSM ring: gdn, 18 linear layers x 512 request rows, L=16, records torch.float32\n"
        "[t] Decode batch, #running-req: 1, gen throughput (token/s): 500.0\n"
        "[t] ReplaySSM decode main launch (the buffered window): CUDA (kernels/gdn_main.cu; ...); pre launch: "
        + "y" * 600 + "\n")
    notes = s.notes()
    assert [n[:20] for n in notes] == ["[t] ReplaySSM ring: ", "[t] ReplaySSM decode"]
    assert len(notes[1]) == 400  # cut
    assert s.notes(n=1) == notes[:1]


class _Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    CACHED = 2048

    def log_message(self, *a):
        pass

    def do_POST(self):
        if self.path.startswith("/flush_cache"):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        n = body["sampling_params"]["max_new_tokens"]
        ids = body["input_ids"]

        def one(x):
            toks = [(sum(x) + i) % 97 for i in range(n)]
            mi = {"prompt_tokens": len(x), "cached_tokens": self.CACHED if len(x) > 2000 else 0}
            if body.get("return_logprob"):
                mi["output_token_logprobs"] = [[-0.5, t, None] for t in toks]
                mi["output_top_logprobs"] = [[[-0.5, t, None], [-1.5, t + 1, None]] for t in toks]
            return {"text": "x", "output_ids": toks, "meta_info": mi}

        if body.get("stream"):
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            o = one(ids)
            for k in (1, 2):
                c = f"data: {json.dumps(dict(o, output_ids=o['output_ids'][:k]))}\n\n".encode()
                self.wfile.write(f"{len(c):x}\r\n".encode() + c + b"\r\n")
            c = b"data: [DONE]\n\n"
            self.wfile.write(f"{len(c):x}\r\n".encode() + c + b"\r\n0\r\n\r\n")
            return
        out = json.dumps([one(x) for x in ids] if isinstance(ids[0], list) else one(ids)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


@pytest.fixture
def fake(tmp_path):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Fake)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    s = g.Server("fake", "/x", [], srv.server_address[1], tmp_path, None)
    s.logpath.write_text("")
    yield s
    srv.shutdown()


def test_prompts_and_prefix_against_fake_server(fake, monkeypatch):
    prompts = g.prompt_set(4096)
    assert len(prompts) == 16 and len({len(p) for p in prompts}) == 16
    res = g.run_prompts(fake, prompts, new_tokens=8)
    assert [len(r["tokens"]) for r in res] == [8] * 16
    assert res[0]["tokens"] == [(sum(prompts[0]) + i) % 97 for i in range(8)]
    p = g.prefix_workload(fake, 4096, groups=2, per_group=4, sys_len=2048, q_len=64, out_len=4)
    total = 8 * (2048 + 64)
    assert p["requests"] == 8 and p["hit_rate"] == pytest.approx(8 * 2048 / total)
    assert p["ideal_hit_rate"] == pytest.approx(2 * 3 * 2048 / total)
    assert p["mean_ttft_s"] > 0 and p["p50_ttft_s"] <= p["p90_ttft_s"] <= p["max_ttft_s"]
    assert p["prefill_batches"] == 0 and p["prefill_batch_seqs"] == []  # (the fake server logs none)
    # the run's own "Prefill batch" lines only: those logged before it started are not counted
    line = ("[t] Prefill batch, #new-seq: 3, #new-token: 6400, #cached-token: 128, full token usage: 0.01, "
            "input throughput (token/s): 1000.00")
    fake.logpath.write_text(line + "\n")
    real = g._prefix_async

    async def logging_run(*a):
        with fake.logpath.open("a") as f:
            f.write(line.replace("#new-seq: 3", "#new-seq: 5") + "\n")
        return await real(*a)
    monkeypatch.setattr(g, "_prefix_async", logging_run)
    p = g.prefix_workload(fake, 4096, groups=2, per_group=4, sys_len=2048, q_len=64, out_len=4)
    assert p["prefill_batches"] == 1 and p["prefill_batch_seqs"] == [5] and p["prefill_cached_tokens"] == 128
    tp = g.throughput(fake, 4096, [1, 4], 1, time.time() + 60)
    assert set(tp) == {"1", "4"} and all(v["decode_tok_s"] > 0 and not v["queued"] for v in tp.values())


def test_prefix_task_reports_the_warm_run(fake):
    """Two runs: the first run's record on top, the second kept as `warm` (the report shows both); one run: no
    `warm`; past the deadline the later runs are skipped."""
    import e2e_report as R

    kw = dict(groups=2, per_group=4, sys_len=2048, q_len=64, out_len=4)
    p = g.prefix_task(fake, 4096, 2, time.time() + 60, **kw)
    assert len(p["repeats"]) == 1 and len(p["mean_ttft_s_all"]) == 2 and len(p["wall_s_all"]) == 2
    assert set(p["warm"]) == set(g.WARM_KEYS)
    assert p["warm"]["mean_ttft_s"] == p["repeats"][0]["mean_ttft_s"] == p["mean_ttft_s_all"][1]
    assert p["warm"]["hit_rate"] == pytest.approx(8 * 2048 / (8 * (2048 + 64)))
    assert R.prefix_cell(p, "mean_ttft_s", ".3f") == (
        f"{p['mean_ttft_s']:.3f} (warm {p['repeats'][0]['mean_ttft_s']:.3f})")
    one = g.prefix_task(fake, 4096, 1, time.time() + 60, **kw)
    assert "warm" not in one and "repeats" not in one
    assert R.prefix_cell(one, "hit_rate", ".3f") == f"{one['hit_rate']:.3f}"
    late = g.prefix_task(fake, 4096, 3, time.time() - 1, **kw)
    assert "warm" not in late


def test_diag_perturb_is_off_by_default_and_relative_when_on(monkeypatch):
    """The ours_perturbed control arm's knob: no-op without REPLAYSSM_DIAG_PERTURB, an exact +-eps
    relative change per element with it (alternating along the last dim)."""
    import torch

    from replayssm_sglang.sglang_hooks.pool import diag_perturb_

    monkeypatch.delenv("REPLAYSSM_DIAG_PERTURB", raising=False)
    x = torch.randn(3, 1, 2, 8, dtype=torch.float64)
    assert torch.equal(diag_perturb_(x.clone()), x)
    monkeypatch.setenv("REPLAYSSM_DIAG_PERTURB", "1e-3")
    y = diag_perturb_(x.clone())
    rel = (y - x) / x
    assert torch.allclose(rel[..., 0::2], torch.full_like(rel[..., 0::2], 1e-3))
    assert torch.allclose(rel[..., 1::2], torch.full_like(rel[..., 1::2], -1e-3))
    assert "ours_perturbed" in g.ARMS and g.ARM_ENV["ours_perturbed"]["REPLAYSSM_DECODE_WINDOW"] == "1"


def test_read_copy_arms_force_the_buffered_window():
    """At the correctness batch (16) the policy runs window 1 for fp32 states, which never reads the read copy:
    the read-copy arms must force the buffered window or their logprob check compares the conventional update."""
    import torch

    from replayssm_sglang import policy

    for arm in ("ours_rc_bf16", "ours_rc_fp8", "ours_rc_fp8_cu", "ours_rc_fp8_tr", "ours_rc_fp8_cusp",
                "ours_rc_fp8_lean", "ours_rc_fp8_m5", "ours_rc_fp8_mma"):
        assert "--linear-replayssm-read-dtype" in g.ARMS[arm]
        w = int(g.ARM_ENV[arm]["REPLAYSSM_DECODE_WINDOW"])
        assert w > 1
    # the rc_lean arm names a shape the CUDA main launch has (an unknown one would be refused at the first decode)
    from replayssm_sglang.kernels import cuda_main

    def lean(arm):  # (the shape's rc_lean field: 0 none, 1 RC_LEAN, 2 RC_MMA as well)
        return cuda_main.full_config(cuda_main.CUDA_CONFIGS[g.ARM_ENV[arm]["REPLAYSSM_CUDA_CONFIG_GDN"]])[8]

    assert lean("ours_rc_fp8_lean") == 1 and lean("ours_rc_fp8_m5") == 0 and lean("ours_rc_fp8_mma") == 2
    # ST_MMA's arm (session 42): a bf16 state, rc_lean 2 without a copy, window 16 as the other bf16 arm
    assert lean("ours_bf16_mma") == 2 and "bfloat16" in g.ARMS["ours_bf16_mma"]
    assert g.ARM_ENV["ours_bf16_mma"]["REPLAYSSM_DECODE_WINDOW"] == g.ARM_ENV["ours_bf16_cu"]["REPLAYSSM_DECODE_WINDOW"]
    # MMA_FOLD's (session 43): the tenth field, GDN's and KDA's shapes named; the bf16 state's on ST_MMA's, the fp32
    # state's and the fp8 copy's on their defaults' shapes
    def fields(arm, kind):
        return cuda_main.full_config(cuda_main.CUDA_CONFIGS[g.ARM_ENV[arm][f"REPLAYSSM_CUDA_CONFIG_{kind}"]])

    for arm in ("ours_bf16_mf", "ours_mf", "ours_rc_fp8_mf", "ours_bf16_mf6"):
        assert fields(arm, "GDN")[9] == 1 and fields(arm, "KDA")[9] == 1, arm
    # (session 44's: the bf16 states' defaults before it with and without it, a bf16 state, window 16; the GDN bf16
    # default is ST_MMA's m7 with it since, KDA's its m6_gp with it)
    for arm in ("ours_bf16_mf6", "ours_bf16_m6"):
        assert fields(arm, "GDN")[:9] == cuda_main.full_config(cuda_main.CUDA_CONFIGS["x16w4c1_m6"])[:9]
        assert fields(arm, "KDA")[:9] == cuda_main.full_config(cuda_main.CUDA_CONFIGS["x16w4c1_m6_gp"])[:9]
        assert "bfloat16" in g.ARMS[arm] and int(g.ARM_ENV[arm]["REPLAYSSM_DECODE_WINDOW"]) > 1
    assert fields("ours_bf16_m6", "GDN")[9] == 0 and fields("ours_bf16_m6", "KDA")[9] == 0
    assert cuda_main.CUDA_DEFAULT_BF16 == cuda_main.CUDA_CONFIGS["x16w4c1_m7_mma_mf"]
    assert cuda_main.CUDA_DEFAULT_KDA_BF16 == cuda_main.CUDA_CONFIGS["x16w4c1_m6_gp_mf"]
    assert fields("ours_bf16_mf", "GDN")[8] == 2 and "bfloat16" in g.ARMS["ours_bf16_mf"]
    assert fields("ours_mf", "GDN")[:9] == cuda_main.full_config(cuda_main.CUDA_DEFAULT)[:9]
    assert fields("ours_mf", "KDA")[:9] == cuda_main.full_config(cuda_main.CUDA_DEFAULT_KDA)[:9]
    assert fields("ours_rc_fp8_mf", "GDN")[:9] == cuda_main.full_config(
        cuda_main.CUDA_DEFAULT_RC[torch.float8_e4m3fn])[:9]
    assert fields("ours_rc_fp8_mf", "KDA")[:9] == cuda_main.full_config(
        cuda_main.CUDA_DEFAULT_RC_KDA[torch.float8_e4m3fn])[:9]
    assert int(g.ARM_ENV["ours_rc_fp8_mf"]["REPLAYSSM_DECODE_WINDOW"]) > 1
    # why the arms need it: with Triton's main launch the policy runs window 1 at the correctness task's batch of 16
    # (with the CUDA main launch, since session 48, the buffered window: the arms then force what it runs anyway)
    assert policy.decode_window("gdn", 16, torch.float32, 16) == 1
    assert policy.decode_window("gdn", 16, torch.float32, 16, cuda_main=True) == 16


def test_prefill_task_and_prefill_log_parsing(fake):
    """The prefill task (uncached prompts one at a time, max_new_tokens 1; one burst of 8) against the fake
    server, and the parsing of SGLang's "Prefill batch" lines it reports for the burst."""
    line = ("[t] Prefill batch, #new-seq: 4, #new-token: 8192, #cached-token: 0, full token usage: 0.01, "
            "mamba usage: 0.05, #running-req: 0, #queue-req: 4, #pending-token: 8712, cuda graph: True, "
            "input throughput (token/s): 161234.50")
    fake.logpath.write_text("old line\n")
    p = g.prefill_latency(fake, 4096, lens=(2113, 300), repeats=2, burst_n=3, burst_len=2113, burst_repeats=2)
    assert set(p) == {"single_16", "single_2113", "single_300", "burst_3x2113"}
    assert all(v["median_s"] > 0 for v in p.values()) and len(p["single_300"]["all_s"]) == 2
    assert p["single_300"]["cached_tokens"] == 0 and p["burst_3x2113"]["tokens"] == 3 * 2113
    fake.logpath.write_text("old line\n" + line + "\n" + line.replace("#cached-token: 0", "#cached-token: 64") + "\n")
    b, n = g.server_prefill_batches(fake, 1)
    assert n == 3 and len(b) == 2 and b[0] == {"new_seq": 4, "new_tokens": 8192, "cached_tokens": 0,
                                               "input_tok_s": 161234.5}
    assert g.server_prefill_batches(fake, 2)[0] == b[1:]
    assert g.flush_cache(fake)


def test_correctness_setup_names_batch_and_window():
    """Each arm's JSON says how its correctness task ran: the 16 prompts as one batch, 32 greedy tokens, and which
    decode window served them (forced by the arm's environment, the policy's, upstream's own, or none)."""
    prompts = g.prompt_set(1000)
    s = g.correctness_setup("ours_rc_fp8", prompts)
    assert s == {"prompts": 16, "batch": 16, "new_tokens": 32, "top_logprobs": 5, "decode_window": 16}
    assert g.correctness_setup("ours_w16:2", prompts)["decode_window"] == 16  # a tagged arm: its base arm's
    assert g.correctness_setup("ours_perturbed", prompts)["decode_window"] == 1
    assert g.correctness_setup("ours", prompts)["decode_window"] == "policy"
    assert g.correctness_setup("conventional", prompts)["decode_window"] is None
    assert g.correctness_setup("upstream_replayssm", prompts)["decode_window"] == "upstream"


def test_tagged_arm_runs_its_base_arm():
    assert g.arm_base("ours:2") == "ours" and g.arm_base("conventional") == "conventional"
    s = g.Server("gdn-ours_perturbed:2", "/x", [], 1, Path("/tmp"), None)
    assert s.arm == "ours_perturbed"


def test_e2e_report_keeps_earlier_runs():
    """A new report replaces the run's own text but keeps the "### Earlier ..." history and the other sections."""
    import e2e_report as R

    doc = ("# Benchmarks\n\n## End to end (GPU)\n\nold run table\n\n### Earlier runs\n\nrun A\n\n"
           "## Kernels\n\nkernel table\n")
    out = R.replace_section(doc, "## End to end (GPU)\n\nnew run table\n")
    assert "new run table" in out and "old run table" not in out
    assert out.index("new run table") < out.index("### Earlier runs\n\nrun A") < out.index("## Kernels\n\nkernel table")
    fresh = R.replace_section("# Benchmarks\n", "## End to end (GPU)\n\nfirst\n")
    assert fresh.endswith("## End to end (GPU)\n\nfirst\n") and "Earlier" not in fresh


def _tp(tok, queued=False):
    return {"decode_tok_s": tok, "step_ms": 1.0, "queued": queued}


def _pf(hit, ttft, warm=None):
    p = {"hit_rate": hit, "mean_ttft_s": ttft}
    if warm is not None:
        p["repeats"] = [{"hit_rate": warm[0], "mean_ttft_s": warm[1]}]
    return p


def test_plot_shows_ratios_and_the_warm_prefix_run(tmp_path):
    """The PNG's numbers: throughput as x the model's reference arm at each B (not the other model's), and the
    prefix workload's last (warm) run, with the first run's TTFT beside it; the PNG is written."""
    res = {"gpu": "fake", "date": "d", "commit": "c", "models": {
        "gdn": {"reference_arm": "conventional", "arms": {
            "conventional": {"throughput": {"256": _tp(100.0), "1": _tp(10.0)}, "prefix": _pf(0.80, 4.0, (0.85, 1.0))},
            "ours": {"throughput": {"256": _tp(130.0, queued=True), "1": _tp(9.0)}, "prefix": _pf(0.84, 2.0, (0.85, 1.1))}}},
        "kda": {"arms": {  # no reference_arm recorded: the first arm is the reference
            "conventional": {"throughput": {"256": _tp(50.0)}},
            "ours": {"throughput": {"256": _tp(60.0)}, "prefix": _pf(0.5, 3.0)}}}}}
    r = {(m, a, b): (tok, ratio, q) for m, a, b, tok, ratio, q in g.throughput_ratios(res)}
    assert r[("gdn", "ours", 256)] == (130.0, pytest.approx(1.3), True)
    assert r[("gdn", "ours", 1)][1] == pytest.approx(0.9)
    assert r[("kda", "ours", 256)][1] == pytest.approx(1.2) and r[("kda", "conventional", 256)][1] == 1.0
    assert [b for m, a, b, *_ in g.throughput_ratios(res) if (m, a) == ("gdn", "ours")] == [1, 256]
    pts = {p["label"]: (p["hit"], p["ttfts"], p["cold"]) for p in g.prefix_points(res)}
    assert pts["gdn:conventional"] == (0.85, [1.0], 4.0)  # the warm run, and the first run's TTFT beside it
    assert pts["gdn:ours"] == (0.85, [1.1], 2.0)
    assert pts["kda:ours"] == (0.5, [3.0], None) and "kda:conventional" not in pts
    # several warm runs: every one's TTFT, the median hit rate
    res["models"]["gdn"]["arms"]["ours"]["prefix"]["repeats"] += [{"hit_rate": 0.80, "mean_ttft_s": 1.3},
                                                                  {"hit_rate": 0.86, "mean_ttft_s": 1.2}]
    pts = {p["label"]: (p["hit"], p["ttfts"], p["cold"]) for p in g.prefix_points(res)}
    assert pts["gdn:ours"] == (0.85, [1.1, 1.3, 1.2], 2.0)
    pytest.importorskip("matplotlib")
    g.plot(res, tmp_path / "e2e.png")
    assert (tmp_path / "e2e.png").stat().st_size > 1000


def test_unknown_task_is_refused_with_the_names(monkeypatch, capsys, tmp_path):
    """A misspelt task (session 26 asked for `decode`) stops the run at once and names the tasks; it used to be
    skipped silently, which spent a GPU call without its throughput."""
    monkeypatch.setattr(sys, "argv", ["gpu_e2e.py", "--model", f"gdn={tmp_path}", "--tasks", "correctness,decode",
                                      "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as e:
        g.main()
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown --tasks ['decode']" in err and "throughput" in err
    assert not (tmp_path / "out").exists()
    assert {"correctness", "throughput", "prefix", "spec"} <= g.TASKS


def test_repeated_arms_are_tagged():
    """A repeated --arms name runs as a tagged arm (its base arm's flags on a fresh server) so that the JSON, keyed by
    arm, keeps every server's results (session 34 lost one server to an untagged repeat)."""
    assert g.tag_repeats(["ours", "conventional", "ours"]) == ["ours", "conventional", "ours:2"]
    assert g.tag_repeats(["ours", "ours:2", "ours", "ours"]) == ["ours", "ours:2", "ours:3", "ours:4"]
    assert g.tag_repeats(["conventional", "ours_w16"]) == ["conventional", "ours_w16"]
    assert all(g.arm_base(a) in ("ours", "conventional") for a in g.tag_repeats(["ours", "conventional"] * 3))

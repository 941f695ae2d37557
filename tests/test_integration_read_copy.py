"""--linear-replayssm-read-dtype (issue 7, integration side) inside real SGLang 0.5.17 modules on CPU.

The series is applied to a clone in tmp (as in tests/test_integration_sglang.py). Checked here:
* the server option (patch 0001): its argparse definition, the rules in
  replayssm_sglang/sglang_hooks/server_args.py, and the real ServerArgs resolution;
* the pool (patch 0002 -> sglang_hooks/pool.attach): the read copy is allocated only when the
  published option asks for it, ``ring(i)`` hands the kernels views of the stacked tensors, and the
  bytes are counted (nbytes, mem_usage, patch 0005's budget through SGLang's own solver);
* the invalidation rule: every glue path that writes a running request's checkpoint or resets h
  clears ``rc_valid`` for exactly its ring rows (the copy lives with the ring: one per request row;
  rc_valid is set to 1 everywhere first, the path runs, the zeros are compared with the expected row
  set), and a path that writes no running request's checkpoint (slot copies and clears, track slots)
  leaves it alone.

The decode kernel's use of the copy (reads it, sets rc_valid back to 1) is tested with the kernels
(tests/test_decode_kernels.py), not here.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from replayssm_sglang import precision

sys.path.insert(0, str(Path(__file__).parent))
from sglang_trees import buffered_window, sg  # noqa: E402,F401  (fixtures)
from test_integration_sglang import H, HV, K, L, V, _args, cache_params, hybrid_pool, new_req, real_args  # noqa: E402,F401
from test_integration_spec import spec_pool  # noqa: E402

RC_DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


@contextmanager
def published(**fields):
    """Server arguments published as a launched server would (SGLang's runtime context)."""
    from sglang.srt.runtime_context import get_context

    with get_context().override_server_args(**fields) as sa:
        yield sa


def rc_pool(sg, read_dtype="bf16", *, spec=False, **kw):
    """A HybridReqToTokenPool built while --linear-replayssm-read-dtype is published."""
    with published(enable_linear_replayssm=True, linear_replayssm_read_dtype=read_dtype):
        if spec:
            return spec_pool(sg, kw.pop("kind", "gdn"), **kw)
        return hybrid_pool(sg, kw.pop("kind", "gdn"), **kw)


def validate_all(rtp):
    rp = rtp.mamba_pool.replayssm_pool
    rp.rc_valid.fill_(1)
    return rp


def cleared(rp):
    """{layer: sorted slots with rc_valid == 0}."""
    return {li: sorted((rp.rc_valid[li] == 0).nonzero().reshape(-1).tolist()) for li in range(rp.num_layers)}


def only(slots, layers):
    return {li: sorted(set(slots)) for li in range(layers)}


# --- server option (patch 0001) -----------------------------------------------------------------

MSG_NEEDS_FLAG = (
    "--linear-replayssm-read-dtype {dt} needs --enable-linear-replayssm: the read copy lives in the "
    "ReplaySSM ring. Fix: add --enable-linear-replayssm, or drop --linear-replayssm-read-dtype (the "
    "default, same, keeps no copy)."
)


def test_cli_option_choices_default_and_help(sg):
    import argparse

    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    act = next(a for a in parser._actions if "--linear-replayssm-read-dtype" in a.option_strings)
    assert act.dest == "linear_replayssm_read_dtype" and act.default == "same"
    assert list(act.choices) == ["same", "bf16", "fp8_e4m3"] == list(precision.READ_DTYPES)
    assert "--enable-linear-replayssm" in act.help
    m = ["--model-path", "m"]
    assert parser.parse_args(m).linear_replayssm_read_dtype == "same"
    ns = parser.parse_args(m + ["--linear-replayssm-read-dtype", "fp8_e4m3", "--enable-linear-replayssm"])
    assert ns.linear_replayssm_read_dtype == "fp8_e4m3"
    with pytest.raises(SystemExit):
        parser.parse_args(m + ["--linear-replayssm-read-dtype", "fp16"])


@pytest.mark.parametrize("dt", ["same", "bf16", "fp8_e4m3"])
def test_rules_accept_every_read_dtype_with_the_flag(dt):
    from replayssm_sglang.sglang_hooks import server_args as S

    assert S.validate(_args(linear_replayssm_read_dtype=dt), "triton") is True


def test_rules_default_same_changes_nothing():
    from replayssm_sglang.sglang_hooks import server_args as S

    # flag off, option at its default (or absent, as on an older ServerArgs): SGLang's own checks run
    assert S.validate(_args(enable_linear_replayssm=False, linear_replayssm_read_dtype="same"), "flashinfer") is False
    assert S.validate(_args(enable_linear_replayssm=False), "flashinfer") is False


@pytest.mark.parametrize("dt", ["bf16", "fp8_e4m3"])
def test_rules_refuse_a_read_copy_without_the_flag(dt):
    from replayssm_sglang.sglang_hooks import server_args as S

    with pytest.raises(ValueError) as e:
        S.validate(_args(enable_linear_replayssm=False, linear_replayssm_read_dtype=dt), "triton")
    assert str(e.value) == MSG_NEEDS_FLAG.format(dt=dt)


def test_rules_refuse_an_unknown_read_dtype():
    from replayssm_sglang.sglang_hooks import server_args as S

    with pytest.raises(ValueError) as e:
        S.validate(_args(linear_replayssm_read_dtype="fp16"), "triton")
    assert str(e.value) == "--linear-replayssm-read-dtype must be one of same, bf16, fp8_e4m3, got 'fp16'."


def test_capabilities_read_copy_matches_the_rules():
    from replayssm_sglang.sglang_hooks import server_args as S

    assert S.CAPABILITIES["read_copy"] is True
    for dt in ("bf16", "fp8_e4m3"):
        assert S.validate(_args(linear_replayssm_read_dtype=dt), "triton") is True


@pytest.mark.parametrize("dt", ["same", "bf16", "fp8_e4m3"])
def test_real_server_args_accept_with_the_flag(real_args, dt):
    a = real_args("gdn", enable_linear_replayssm=True, linear_replayssm_read_dtype=dt)
    assert a.enable_linear_replayssm and a.linear_replayssm_read_dtype == dt


def test_real_server_args_default_is_same(real_args):
    a = real_args("gdn")
    assert a.linear_replayssm_read_dtype == "same" and not a.enable_linear_replayssm


@pytest.mark.parametrize("dt", ["bf16", "fp8_e4m3"])
def test_real_server_args_refuse_without_the_flag(real_args, dt):
    with pytest.raises(ValueError) as e:
        real_args("gdn", linear_replayssm_read_dtype=dt)
    assert str(e.value) == MSG_NEEDS_FLAG.format(dt=dt)


# --- allocation, views and budget ---------------------------------------------------------------

@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("dt", ["bf16", "fp8_e4m3"])
def test_pool_allocates_the_read_copy_from_the_published_option(sg, kind, dt):
    from replayssm_sglang.sglang_hooks import pool as P

    rtp = rc_pool(sg, dt, kind=kind, layers=(3, 7), mamba_size=6)
    mp = rtp.mamba_pool
    rp = mp.replayssm_pool
    slots = rtp.req_to_token.shape[0]  # the ring's (and the read copy's) rows: one per request row
    assert slots < mp.mamba_cache.temporal.shape[1]
    assert rp.read_dtype == dt
    assert rp.rc.dtype == RC_DTYPES[dt] and tuple(rp.rc.shape) == (2, slots, HV, V, K)
    assert rp.rc_valid.dtype == torch.int32 and tuple(rp.rc_valid.shape) == (2, slots)
    assert (rp.rc_valid == 0).all(), "invalid at allocation: the first decode step flushes"
    if dt == "fp8_e4m3":
        assert rp.rc_scale.dtype == torch.float32 and tuple(rp.rc_scale.shape) == (2, slots, HV, V)
    else:
        assert rp.rc_scale is None
    # ring(i): views of layer i of the stacked tensors (the kernels write through them)
    for i in range(2):
        r = rp.ring(i)
        assert r.rc.data_ptr() == rp.rc[i].data_ptr() and tuple(r.rc.shape) == (slots, HV, V, K)
        assert r.rc_valid.data_ptr() == rp.rc_valid[i].data_ptr() and tuple(r.rc_valid.shape) == (slots,)
        if dt == "fp8_e4m3":
            assert r.rc_scale.data_ptr() == rp.rc_scale[i].data_ptr()
        else:
            assert r.rc_scale is None
    rp.ring(1).invalidate_read_copy(torch.tensor([2]))  # (Ring's own helper) no-op on zeros
    rp.rc_valid.fill_(1)
    rp.ring(1).invalidate_read_copy(torch.tensor([2]))
    assert rp.rc_valid[1, 2] == 0 and rp.rc_valid[0, 2] == 1
    # bytes: nbytes and mem_usage count the copy; ring_bytes_per_row (patch 0005) grows by exactly
    # read_copy_bytes + 4 (rc_valid) per layer
    same = hybrid_pool(sg, kind, layers=(3, 7), mamba_size=6).mamba_pool
    extra = rp.nbytes() - same.replayssm_pool.nbytes()
    per_layer = precision.read_copy_bytes(HV, V, K, dt) + 4
    assert extra == 2 * slots * per_layer
    assert abs((mp.mem_usage - same.mem_usage) * (1 << 30) - extra) < 1
    cp = cache_params(kind, [3, 7])
    assert P.ring_bytes_per_row(cp, L, read_dtype=dt) - P.ring_bytes_per_row(cp, L) == 2 * per_layer
    assert P.ring_bytes_per_row(cp, L, read_dtype=dt) * slots == rp.nbytes()


def test_pool_without_the_option_has_no_read_copy(sg):
    for rtp in (hybrid_pool(sg), rc_pool(sg, "same")):  # nothing published / published same
        rp = rtp.mamba_pool.replayssm_pool
        assert rp.rc is None and rp.rc_scale is None and rp.rc_valid is None and rp.read_dtype == "same"
        r = rp.ring(0)
        assert r.rc is None and r.rc_scale is None and r.rc_valid is None
        rp.reset_(torch.tensor([1]))  # every invalidating path is a no-op without a copy
        rp.invalidate_read_copy_(torch.tensor([1]), 0)


def test_a_bf16_copy_of_a_bf16_state_is_not_kept(sg):
    """The read copy would be the checkpoint itself: nothing allocated, nothing charged (as plan.py)."""
    from replayssm_sglang.sglang_hooks import pool as P

    with published(enable_linear_replayssm=True, linear_replayssm_read_dtype="bf16"):
        rtp = sg.memory_pool.HybridReqToTokenPool(
            size=4, mamba_size=6, mamba_spec_state_size=4, max_context_len=64, device="cpu",
            enable_memory_saver=False, cache_params=cache_params("gdn", [0], dtype=torch.bfloat16),
            mamba_layer_ids=[0], enable_mamba_extra_buffer=False, enable_overlap_schedule=True,
            enable_linear_replayssm=True, linear_replayssm_cache_len=L)
    assert rtp.mamba_pool.replayssm_pool.rc is None
    cp = cache_params("gdn", [0], dtype=torch.bfloat16)
    assert P.ring_bytes_per_row(cp, L, read_dtype="bf16") == P.ring_bytes_per_row(cp, L)
    assert P.ring_bytes_per_row(cp, L, read_dtype="fp8_e4m3") > P.ring_bytes_per_row(cp, L)


def test_ring_bytes_per_row_refuses_an_unknown_read_dtype():
    from replayssm_sglang.sglang_hooks import pool as P

    with pytest.raises(ValueError):
        P.ring_bytes_per_row(cache_params("gdn", [0]), L, read_dtype="fp16")


@pytest.mark.parametrize("dt", ["bf16", "fp8_e4m3"])
def test_budget_charges_the_read_copy_per_request_row(sg, dt):
    """Patch 0005 through SGLang's own solver (as test_budget_charges_the_ring_per_request_row): with the
    option the per-row cost is ring + read copy + rc_valid, charged once per request row."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.runtime_context import get_schedule
    from replayssm_sglang.sglang_hooks import pool as P

    layers = 12
    cp = cache_params("gdn", list(range(layers)))
    rest_gb, mratio, Lr, ratio = 8.0, 0.9, 16, 3
    got = {}
    for read in ("same", dt):
        with published(enable_linear_replayssm=True, linear_replayssm_cache_len=Lr, mamba_full_memory_ratio=mratio,
                       linear_replayssm_read_dtype=read) as sa:
            fake = SimpleNamespace(mambaish_config=SimpleNamespace(mamba2_cache_params=cp), server_args=sa,
                                   ps=SimpleNamespace(pp_size=1, attn_dp_size=1),
                                   spec_algorithm=SimpleNamespace(is_none=lambda: True),
                                   hybrid_gdn_config=object(),
                                   model_config=SimpleNamespace(hf_config=None, num_hidden_layers=24),
                                   _calculate_mamba_ratio=lambda: ratio)
            left = KVCacheConfigurator._handle_max_mamba_cache(fake, rest_gb)
            got[read] = (get_schedule().max_mamba_cache_size, left)
    budget = rest_gb * mratio / (1 + mratio) * (1 << 30)
    per = cp.mamba_cache_per_req
    ring = P.ring_bytes_per_row(cp, Lr)
    growth = (precision.read_copy_bytes(HV, V, K, dt) + 4) * layers
    assert P.ring_bytes_per_row(cp, Lr, read_dtype=dt) == ring + growth
    for read, row in (("same", ring), (dt, ring + growth)):
        k, left = got[read]
        assert (k + 1) * per + (k // ratio + 1) * row <= budget < (k + 2) * per + ((k + 1) // ratio + 1) * row
        assert abs(left - (rest_gb - ((k + 1) * per + (k // ratio + 1) * row) / (1 << 30))) < 1e-9
    assert got[dt][0] < got["same"][0]


# --- invalidation: each path clears rc_valid for exactly its slots ------------------------------

def test_alloc_invalidates_its_rows_and_slot_copies_do_not(sg):
    """A request row entering prefill: its copy is cleared. Copying into or clearing a slot (copy-on-write,
    track copies, clear_slots) writes no running request's checkpoint before its first forward resets the
    row again (test_extend_and_mixed_forwards_invalidate_their_rows), so it clears nothing."""
    rtp = rc_pool(sg, "bf16", layers=(0, 1), mamba_size=6)
    mp = rtp.mamba_pool
    rp = validate_all(rtp)
    a, b = new_req(1), new_req(2)
    rtp.alloc([a, b])
    sa = int(a.mamba_pool_idx)
    assert cleared(rp) == only([a.req_pool_idx, b.req_pool_idx], 2), "request rows entering prefill"
    rp.rc_valid.fill_(1)
    spare = rtp.mamba_allocator.alloc(1)
    mp.copy_from(torch.tensor([sa]), spare.clone())
    mp.clear_slots(spare.clone())
    assert cleared(rp) == only([], 2)


def test_cpu_backup_and_restore_invalidate(sg):
    """Req.offload_kv_cache folds the request's row (cleared); Req.load_kv_cache resets the restored
    request's row (cleared); nothing else."""
    from sglang.srt.managers.schedule_batch import Req
    from test_integration_sglang import _kv_allocator

    rtp = rc_pool(sg, "fp8_e4m3", layers=(0, 1), mamba_size=6)
    kv = _kv_allocator(rtp)
    rp = validate_all(rtp)
    rs = [new_req(i) for i in range(3)]
    rtp.alloc(rs)
    for r in rs:
        r.seqlen = 4
    rp.rc_valid.fill_(1)
    Req.offload_kv_cache(rs[0], rtp, kv)
    assert cleared(rp) == only([rs[0].req_pool_idx], 2), "retraction backup folds the request's row"
    rs[2].kv_cache_cpu = rs[0].kv_cache_cpu
    rp.rc_valid.fill_(1)
    Req.load_kv_cache(rs[2], rtp, kv)
    assert cleared(rp) == only([rs[2].req_pool_idx], 2), "a restored checkpoint"


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_finish_fold_invalidates(sg, kind):
    from sglang.srt.mem_cache.unified_cache.components.mamba_component import MambaComponent

    rtp = rc_pool(sg, "bf16", kind=kind, layers=(0, 1))
    rp = validate_all(rtp)
    a, b = new_req(1), new_req(2)
    rtp.alloc([a, b])
    row = int(a.req_pool_idx)
    rp.h[:, row] = 2  # records pending (zeros): the fold writes the checkpoint
    rp.rc_valid.fill_(1)
    comp = SimpleNamespace(cache=SimpleNamespace(enable_mamba_extra_buffer=False, req_to_token_pool=rtp),
                           int8_ckpt_pool=None)
    MambaComponent.prepare_for_caching_req(comp, a, SimpleNamespace(mamba_value=None), 40, True)
    assert rp.h[:, row].tolist() == [0, 0]
    assert cleared(rp) == only([row], 2), "only the finished request's row"


def test_fold_requests_invalidates_even_with_no_records(sg):
    from replayssm_sglang.sglang_hooks import pool as P

    rtp = rc_pool(sg, "bf16", layers=(0, 1), mamba_size=6)
    rp = validate_all(rtp)
    P.fold_requests(rtp, torch.tensor([5, 6]), torch.tensor([2, 4]))
    assert cleared(rp) == only([2, 4], 2)


def _metadata_forward(rtp, slots_of_reqs, mode, extend_seq_lens):
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase

    backend = object.__new__(MambaAttnBackendBase)
    backend.req_to_token_pool, backend.device = rtp, "cpu"
    n = len(slots_of_reqs)
    starts = torch.cumsum(torch.tensor([0] + list(extend_seq_lens[:-1])), 0)
    fb = SimpleNamespace(batch_size=n, req_pool_indices=torch.tensor(slots_of_reqs), mamba_track_indices=None,
                         mamba_track_mask=None, _original_batch_size=None, forward_mode=mode,
                         extend_start_loc=starts, extend_seq_lens=torch.tensor(extend_seq_lens))
    return MambaAttnBackendBase._forward_metadata(backend, fb)


def test_extend_and_mixed_forwards_invalidate_their_rows(sg):
    """The metadata hook (patch 0003, before_extend): the extend kernel writes the checkpoint of
    every row of the batch (prefill rows reset, decoding rows of a mixed batch folded first)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    rtp = rc_pool(sg, "bf16", layers=(0, 1), mamba_size=6)
    rp = validate_all(rtp)
    rs = [new_req(i) for i in range(3)]
    rtp.alloc(rs)
    sl = [int(r.mamba_pool_idx) for r in rs]
    rw = [int(r.req_pool_idx) for r in rs]
    rp.rc_valid.fill_(1)
    meta = _metadata_forward(rtp, [rs[0].req_pool_idx, rs[1].req_pool_idx], ForwardMode.EXTEND, [7, 3])
    assert meta.mamba_cache_indices.tolist() == sl[:2]
    assert cleared(rp) == only(rw[:2], 2)
    rp.rc_valid.fill_(1)
    meta = _metadata_forward(rtp, [rs[2].req_pool_idx, rs[1].req_pool_idx], ForwardMode.MIXED, [5, 1])
    assert meta.mamba_cache_indices.tolist() == [sl[2], sl[1]]
    # the prefill row and the decoding row; the hook's reset of prefill rows only sends the other
    # rows to SGLang's padding row 0 (never a request's row), which is cleared too
    assert 0 not in rw
    assert cleared(rp) == only([rw[2], rw[1], 0], 2)


def test_decode_metadata_leaves_the_read_copy_alone(sg):
    """A plain decode forward's metadata writes no checkpoint: rc_valid stays (the kernel owns it)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    rtp = rc_pool(sg, "bf16", layers=(0, 1), mamba_size=6)
    rp = validate_all(rtp)
    rs = [new_req(i) for i in range(2)]
    rtp.alloc(rs)
    rp.rc_valid.fill_(1)
    from replayssm_sglang.sglang_hooks import decode

    backend = SimpleNamespace(req_to_token_pool=rtp)
    fb = SimpleNamespace(forward_mode=ForwardMode.DECODE)
    decode.before_extend(backend, fb, torch.tensor([int(r.mamba_pool_idx) for r in rs]))
    assert cleared(rp) == only([], 2)


def test_verify_hands_the_layers_read_copy_to_the_kernel_and_clears_nothing(sg, monkeypatch):
    """The verify kernels keep the read copy themselves (a pre-step fold writes both copies and sets the
    flag; other rows read the copy only when current: tests/test_verify_kernels.py), so the glue clears
    nothing; the ring handed to the kernel is the layer's view with the read copy."""
    from replayssm_sglang.kernels import verify as kverify
    from replayssm_sglang.sglang_hooks import verify

    rtp = rc_pool(sg, "fp8_e4m3", spec=True, kind="gdn", layers=(0, 1), mamba_size=8)
    rp = validate_all(rtp)
    rs = [new_req(i) for i in range(2)]
    rtp.alloc(rs)
    sl = [int(r.mamba_pool_idx) for r in rs]
    T = rp.spec_T
    seen = []

    def fake_ring_verify(mixed, a, b, A_log, dt_bias, ssm, idx, ring, T_, **kw):
        seen.append((idx.clone(), ring))
        assert kw["ring_idx"].tolist() == [r.req_pool_idx for r in rs] + [0], "the request rows"
        return torch.zeros(mixed.shape[0], HV, V)

    monkeypatch.setattr(kverify, "ring_verify", fake_ring_verify)
    rp.rc_valid.fill_(1)
    idx = torch.tensor(sl + [-1], dtype=torch.int32)
    Bp = idx.numel()
    backend = SimpleNamespace(req_to_token_pool=rtp, forward_metadata=SimpleNamespace(retrieve_parent_token=None))
    fb = SimpleNamespace(spec_info=SimpleNamespace(draft_token_num=T, ragged_verify_layout=None),
                         req_pool_indices=torch.tensor([r.req_pool_idx for r in rs] + [0]))
    layer = SimpleNamespace(layer_id=1, A_log=None, dt_bias=None, head_k_dim=K, num_v_heads=HV, head_v_dim=V)
    N = Bp * T
    out = verify.forward_target_verify(backend, layer, fb, torch.zeros(N, 2 * H * K + HV * V),
                                       torch.zeros(N, HV), torch.zeros(N, HV),
                                       rtp.mamba_pool.mamba_cache.temporal[1], idx)
    assert out.shape == (1, N, HV, V)
    li = rtp.mamba_map[1]
    _, ring = seen[0]
    assert ring.rc.data_ptr() == rp.rc[li].data_ptr() and ring.rc_valid.data_ptr() == rp.rc_valid[li].data_ptr()
    assert ring.rc_scale.data_ptr() == rp.rc_scale[li].data_ptr()
    assert cleared(rp) == {li_: [] for li_ in range(2)}


def test_materialize_and_commit_clear_nothing(sg):
    """extra_buffer under verify: materialize_ writes a track slot's checkpoint, which no running request
    reads (a track slot has no ring row, so no read copy); the commit only moves h: rc_valid untouched."""
    rtp = rc_pool(sg, "bf16", spec=True, kind="gdn", layers=(0, 1), mamba_size=10, extra_buffer=True)
    rp = validate_all(rtp)
    rs = [new_req(i) for i in range(2)]
    rtp.alloc(rs)
    sl = [int(r.mamba_pool_idx) for r in rs]
    rows = torch.tensor([r.req_pool_idx for r in rs])
    track = [int(r.mamba_ping_pong_track_buffer[r.mamba_next_track_idx]) for r in rs]
    assert not set(track) & set(sl)
    rp.rc_valid.fill_(1)
    temporal = rtp.mamba_pool.mamba_cache.temporal
    rp.materialize_(temporal, torch.tensor(sl), torch.tensor(track), torch.tensor([1, -1]), ring_idx=rows)
    assert cleared(rp) == only([], 2)
    rp.commit_verify(torch.tensor(sl, dtype=torch.int32), torch.tensor([2, 1], dtype=torch.int32), ring_idx=rows)
    assert cleared(rp) == only([], 2)


# --- decode through the serving hook with the copy on (kernels: decode v3, v1 at window 1) ------------------

@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("dt", ["bf16", "fp8_e4m3"])
def test_serving_decode_reads_the_copy_and_keeps_the_recurrence_exact(sg, kind, dt, monkeypatch):
    """decode.forward_decode with --linear-replayssm-read-dtype: the first step after the prefill is a
    flush (the copy is stale) and exact; the steps after it read the read copy (outputs within its rounding
    of the conventional float64 path); the recurrence copy is never rounded to the read dtype, so at every
    flush it differs from the conventional state only through the corrections u_t, which carry one rounding
    of C k each (docs/design.md, "Precision: two copies"): far below the copy's own rounding; a window-1 step
    in between (the small-batch policy) leaves the copy stale again."""
    from test_integration_sglang import TOL, Model, h_of

    monkeypatch.setenv("REPLAYSSM_DECODE_WINDOW", str(L))
    rtp = rc_pool(sg, dt, kind=kind, mamba_size=2)
    rp = rtp.mamba_pool.replayssm_pool
    m = Model(kind, rtp, seed=7)
    r = new_req(1)
    rtp.alloc([r])
    s, row = int(r.mamba_pool_idx), int(r.req_pool_idx)
    m.write_prefill_state(s)
    rp.reset_([row])  # what the extend hook does after a prefill
    assert int(rp.rc_valid[:, row].sum()) == 0
    out_tol = 2e-2 if dt == "bf16" else 1.5e-1  # one rounding of C per element (fp8: 3 mantissa bits)
    state_tol = out_tol / 20
    assert m.step([s]) < TOL  # stale copy: forced flush, reads the fp32 checkpoint
    assert h_of(rtp, s) == [0] and m.state_err(s) < TOL
    assert bool((rp.rc_valid[:, row] == 1).all())
    errs = []
    for i in range(2 * L):
        errs.append(m.step([s]))
        if h_of(rtp, s) == [0]:  # a flush: the recurrence copy, never rounded to the read dtype
            assert m.state_err(s) < state_tol
    assert max(errs) < out_tol and max(errs) > TOL, errs  # the copy was read (its rounding shows)
    m.ref[:, s] = rtp.mamba_pool.mamba_cache.temporal[:, s].to(torch.float64)  # resync the conventional side
    monkeypatch.setenv("REPLAYSSM_DECODE_WINDOW", "1")  # a small batch: v1, the copy goes stale
    assert m.step([s]) < TOL
    assert bool((rp.rc_valid[:, row] == 0).all()) and m.state_err(s) < TOL
    monkeypatch.setenv("REPLAYSSM_DECODE_WINDOW", str(L))
    assert m.step([s]) < TOL  # stale again: this step reads the fp32 checkpoint (exact)
    assert bool((rp.rc_valid[:, row] == 1).all())

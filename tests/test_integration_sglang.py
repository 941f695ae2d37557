"""Our ring inside real SGLang 0.5.17 modules on CPU (the series applied to a copy in tmp).

Every lifecycle path is driven through the patched SGLang code (MambaPool, HybridReqToTokenPool,
the radix cache's MambaComponent, the hybrid backend's metadata hook) and our decode kernel
(Triton interpreter); the state each path leaves is compared with the float64 conventional
recurrence (replayssm_sglang.reference.conventional_step) over the same tokens.

The series is applied to a hard-linked clone (touched files copied) put first on sys.path before
SGLang is imported, and removed from sys.path and sys.modules afterwards: the installed SGLang
stays pristine (tests/test_patching.py checks that) and later test modules import it as usual.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from replayssm_sglang import reference as ref
from replayssm_sglang.sglang_hooks import flush

sys.path.insert(0, str(Path(__file__).parent))
from sglang_trees import buffered_window, sg  # noqa: E402,F401  (fixtures)
from conftest import spy_launches  # noqa: E402

F64 = torch.float64
H, HV, K, V = 1, 2, 16, 16
L = 4


# --- builders ------------------------------------------------------------------------------------

def cache_params(kind: str, layers: list[int], dtype=torch.float32):
    from sglang.srt.configs.mamba_utils import (KimiLinearCacheParams, KimiLinearStateShape, Mamba2CacheParams,
                                                Mamba2StateDType, Mamba2StateShape)

    dt = Mamba2StateDType(conv=torch.float32, temporal=dtype)
    if kind == "gdn":
        shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=HV * V, n_groups=H, num_heads=HV,
                                        head_dim=V, state_size=K, conv_kernel=4)
        return Mamba2CacheParams(shape=shape, layers=layers, dtype=dt)
    shape = KimiLinearStateShape.create(tp_world_size=1, num_heads=HV, head_dim=K, conv_kernel_size=4)
    return KimiLinearCacheParams(shape=shape, layers=layers, dtype=dt)


def hybrid_pool(sg, kind="gdn", *, layers=(0,), size=4, mamba_size=6, extra_buffer=False, flag=True, L_=L,
                burn=1):
    """SGLang's HybridReqToTokenPool. ``burn`` mamba slots are taken first (and never used) so that a
    request's mamba slot differs from its request row, which keys our ring: a ring indexed by slot by
    mistake then reads and writes other requests' records (or none) and the checks fail."""
    rtp = sg.memory_pool.HybridReqToTokenPool(
        size=size, mamba_size=mamba_size + burn, mamba_spec_state_size=size, max_context_len=64, device="cpu",
        enable_memory_saver=False, cache_params=cache_params(kind, list(layers)), mamba_layer_ids=list(layers),
        enable_mamba_extra_buffer=extra_buffer, enable_overlap_schedule=True,
        enable_linear_replayssm=flag, linear_replayssm_cache_len=L_)
    if burn:
        rtp.mamba_allocator.alloc(burn)
    return rtp


def row_of(rtp, slot: int) -> int:
    """The request row (ring row) of the running request whose live slot is ``slot`` (0: padding)."""
    if slot < 0:
        return 0
    used = set(range(1, rtp.req_to_token.shape[0])) - set(rtp.free_slots)
    rows = [r for r in sorted(used) if int(rtp.req_index_to_mamba_index_mapping[r]) == slot]
    assert len(rows) == 1, f"slot {slot}: running request rows {rows}"
    return rows[0]


def new_req(rid=0):
    return SimpleNamespace(rid=rid, req_pool_idx=None, mamba_pool_idx=None, inflight_middle_chunks=0,
                           kv_committed_len=0, mamba_ping_pong_track_buffer=None, mamba_next_track_idx=None)


class Model:
    """Per-layer fixed gate parameters, random tokens each step, and the float64 conventional
    state of every slot (what SGLang's conventional decode would hold)."""

    def __init__(self, kind, rtp, seed=None):
        self.kind, self.rtp = kind, rtp
        self.H = H if kind == "gdn" else HV  # KDA: one key head per value head
        self.gen = torch.Generator()
        self.gen.manual_seed(int(torch.randint(0, 2**31 - 1, ())) if seed is None else seed)
        self.layers = {}
        mp = rtp.mamba_pool
        for lid, li in rtp.mamba_map.items():
            _, _, _, A_log, dt_bias = ref.random_decode_inputs(kind, 1, self.H, HV, K, V, generator=self.gen)
            self.layers[lid] = SimpleNamespace(layer_id=lid, A_log=A_log, dt_bias=dt_bias, head_k_dim=K,
                                               num_v_heads=HV, head_v_dim=V, lower_bound=None)
        T = mp.mamba_cache.temporal
        self.ref = T.to(F64).clone()  # [layers, slots, HV, V, K]

    def write_prefill_state(self, slot: int, extend: bool = True):
        """What a prefill leaves in the slot: some state (random), on both sides. ``extend``: the slot's
        running request had its prefill forward (the metadata hook's first-extend reset, which clears the
        row's fresh flag); False: a state written without a forward (a copy, a load-back)."""
        T = self.rtp.mamba_pool.mamba_cache.temporal
        s = torch.randn(T.shape[0], HV, V, K, generator=self.gen) * 0.3
        T[:, slot] = s.to(T.dtype)
        self.ref[:, slot] = T[:, slot].to(F64)
        if extend:
            self.rtp.mamba_pool.replayssm_pool.first_extend_([row_of(self.rtp, slot)])

    def step(self, slots, seq_lens=None, mode=None, rows=None):
        """One decode forward over rows with these slots (-1 = padded row) through the patched
        backend hook; returns the max RMS ratio of the outputs against the conventional path.
        ``rows``: the request rows (ring rows) of the batch rows; default: the running request of each
        slot (``row_of``), 0 for a padded row."""
        from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from replayssm_sglang.sglang_hooks import decode

        idx = torch.tensor(slots, dtype=torch.int32)
        B = len(slots)
        if rows is None:
            rows = [row_of(self.rtp, int(x)) for x in slots]
        seq_lens = torch.tensor(seq_lens if seq_lens is not None else [1] * B, dtype=torch.int64)
        backend = SimpleNamespace(req_to_token_pool=self.rtp,
                                  forward_metadata=ForwardMetadata(query_start_loc=None, mamba_cache_indices=idx))
        fb = SimpleNamespace(seq_lens=seq_lens, forward_mode=mode or ForwardMode.DECODE,
                             req_pool_indices=torch.tensor(rows, dtype=torch.int64))
        worst = 0.0
        for lid, layer in self.layers.items():
            li = self.rtp.mamba_map[lid]
            mixed, a, b, _, _ = ref.random_decode_inputs(self.kind, B, self.H, HV, K, V, generator=self.gen)
            temporal = self.rtp.mamba2_layer_cache(lid).temporal
            out = decode.forward_decode(backend, layer, fb, mixed, a, b, temporal, idx)
            assert out.shape == (1, B, HV, V)
            x = ref.unpack(self.kind, mixed, a, b, layer.A_log, layer.dt_bias, H=self.H, HV=HV, K=K, V=V)
            st = self.ref[li]
            o_ref = ref.conventional_step(st, x, idx)
            o = out[0].to(F64)
            assert torch.isfinite(o).all()
            real = idx >= 0
            if real.any():
                worst = max(worst, rms_ratio(o[real], o_ref[real]))
            if (~real).any():
                assert (o[~real] == 0).all(), "padded rows must get zero output"
        return worst

    def state_err(self, slot, temporal_slot=None):
        """RMS ratio of the pool's checkpoint of ``slot`` (all layers) against the conventional state."""
        T = self.rtp.mamba_pool.mamba_cache.temporal
        got = T[:, slot] if temporal_slot is None else temporal_slot
        return rms_ratio(got.to(F64), self.ref[:, slot])


def rms_ratio(x, y):
    assert torch.isfinite(x).all(), "NaN/inf never passes"
    d = (x - y).pow(2).mean().sqrt()
    n = y.pow(2).mean().sqrt().clamp_min(1e-30)
    return float(d / n)


TOL = 2e-5  # fp32 kernel and fold against the float64 recurrence


def h_of(rtp, slot):
    """h (per layer) of the running request whose live slot is ``slot``."""
    return rtp.mamba_pool.replayssm_pool.h[:, row_of(rtp, slot)].tolist()


def h_row(rtp, row):
    """h (per layer) of ring row ``row`` (a request row)."""
    return rtp.mamba_pool.replayssm_pool.h[:, int(row)].tolist()


def extend_metadata(rtp, req_rows, extend_lens, mode="MIXED", original_batch_size=None):
    """SGLang's own (patched) metadata builder, ``MambaAttnBackendBase._forward_metadata``, for an extend-type
    forward (``mode``: EXTEND or MIXED) over request rows ``req_rows`` extending ``extend_lens`` tokens each
    (contiguous in the batch). Returns (backend, forward batch, metadata) so a test can build the next forward."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    backend = object.__new__(MambaAttnBackendBase)
    backend.req_to_token_pool, backend.device = rtp, "cpu"
    lens = torch.tensor(extend_lens)
    fb = SimpleNamespace(batch_size=len(req_rows), req_pool_indices=torch.tensor(req_rows), mamba_track_indices=None,
                         mamba_track_mask=None, _original_batch_size=original_batch_size,
                         forward_mode=getattr(ForwardMode, mode), extend_start_loc=torch.cumsum(lens, 0) - lens,
                         extend_seq_lens=lens)
    return backend, fb, MambaAttnBackendBase._forward_metadata(backend, fb)


# --- allocation and budget -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_pool_holds_our_ring_not_upstreams_and_counts_it(sg, kind, caplog):
    """The ring has one row per request row (SGLang's req_to_token rows: size + the padding
    row), not one per mamba slot; allocation, the per-row charge and mem_usage agree; the server log says what
    was allocated."""
    import logging

    from replayssm_sglang.sglang_hooks import pool as P

    with caplog.at_level(logging.INFO, logger="replayssm_sglang.sglang_hooks.pool"):
        rtp = hybrid_pool(sg, kind, layers=(3, 7), size=4, mamba_size=12)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ReplaySSM ring:")]
    assert len(said) == 1 and f"{kind.upper()}, 2 linear layers x 5 request rows, L={L}" in said[0], said
    assert ("KDA keys predecayed" in said[0]) == (kind == "kda"), said
    mp = rtp.mamba_pool
    rp = mp.replayssm_pool
    assert rp is not None and rp.kind == kind and rp.keyed_by == "request"
    # upstream's decode ring is neither allocated nor driven
    assert mp.enable_linear_replayssm is False and mp.replayssm_write_pos is None
    assert mp.mamba_cache.replayssm_d is None and mp.mamba_cache.replayssm_g is None
    lay = rp.layout
    GK = 1 if kind == "gdn" else K
    HK = H if kind == "gdn" else HV
    assert (lay.HV, lay.V, lay.K, lay.HK, lay.GK, lay.L) == (HV, V, K, HK, GK, L)
    rows = rtp.req_to_token.shape[0]
    assert rows == 5 and mp.mamba_cache.temporal.shape[1] == 14, "request rows, not mamba slots"
    assert tuple(rp.u.shape) == (2, rows, HV, L, V) and tuple(rp.k.shape) == (2, rows, HK, L, K)
    assert tuple(rp.g.shape) == (2, rows, HV, L, GK) and tuple(rp.h.shape) == (2, rows)
    # KDA without speculative decoding: predecayed key records (pool.kda_keys_for), the flags on the layer's ring
    assert rp.kda_keys == ("predecayed" if kind == "kda" else "raw")
    assert (rp.ring(1).ovf is not None) == (kind == "kda") and rp.ring(1).predecayed == (kind == "kda")
    # budget: what patch 0005 charges per request row is exactly what is allocated per row
    per_row = P.ring_bytes_per_row(cache_params(kind, [3, 7]), L)
    assert per_row * rows == rp.nbytes()
    by_hand = 2 * (L * (4 * (HV * V + HK * K) + 4 * HV * GK) + 8 + (4 * (HV + 1) if kind == "kda" else 0)) + 4
    # (+ KDA's threshold flags per layer, predecayed keys: one per head and one per row; + the row's fresh flag)
    assert per_row == by_hand
    # and counted in the pool's reported usage
    off = hybrid_pool(sg, kind, layers=(3, 7), size=4, mamba_size=12, flag=False).mamba_pool
    assert getattr(off, "replayssm_pool", "missing") is None
    assert abs((mp.mem_usage - off.mem_usage) * (1 << 30) - rp.nbytes()) < 1


def test_ring_rows_must_match_the_request_pool(sg):
    """attach sizes the ring from the request pool size SGLang hands the mamba pool; a mismatch with
    the request pool is refused at start-up (HybridReqToTokenPool checks it)."""
    from replayssm_sglang.sglang_hooks import pool as P

    rtp = hybrid_pool(sg)
    P.check_req_rows(rtp.mamba_pool, rtp.req_to_token.shape[0])
    with pytest.raises(RuntimeError, match="keyed by request row"):
        P.check_req_rows(rtp.mamba_pool, rtp.req_to_token.shape[0] + 1)
    with pytest.raises(RuntimeError, match="keyed by request row"):
        sg.memory_pool.HybridReqToTokenPool(
            size=4, mamba_size=6, mamba_spec_state_size=3, max_context_len=64, device="cpu",
            enable_memory_saver=False, cache_params=cache_params("gdn", [0]), mamba_layer_ids=[0],
            enable_mamba_extra_buffer=False, enable_overlap_schedule=True, enable_linear_replayssm=True,
            linear_replayssm_cache_len=L)


def test_ring_rows_are_request_rows_and_slot_events_touch_no_row(sg):
    """A running request's records live in its request row; copying into or clearing other slots
    (copy-on-write, track copies, clear_slots) and freeing or reusing slots never touch them."""
    rtp = hybrid_pool(sg, mamba_size=6)
    m = Model("gdn", rtp)
    a = new_req(1)
    rtp.alloc([a])
    s = int(a.mamba_pool_idx)
    assert s != a.req_pool_idx, "the test needs a slot that differs from the request row"
    m.write_prefill_state(s)
    for _ in range(L + 2):
        assert m.step([s]) < TOL
    rp = rtp.mamba_pool.replayssm_pool
    assert h_row(rtp, a.req_pool_idx) == [2] and int(rp.h[0].sum()) == 2
    h_before, u_before = rp.h.clone(), rp.u.clone()
    other = rtp.mamba_allocator.alloc(2)
    rtp.mamba_pool.copy_from(torch.tensor([s]), other[:1].clone())  # e.g. a track copy of the live slot
    rtp.mamba_pool.clear_slots(other[1:].clone())
    rtp.mamba_allocator.free(other)
    assert torch.equal(rp.h, h_before) and torch.equal(rp.u, u_before)
    for _ in range(3):
        assert m.step([s]) < TOL
    assert m.state_err(s) > 1e-3  # records pending: exactness above came from checkpoint + row


def test_flag_off_pool_is_upstreams(sg):
    mp = hybrid_pool(sg, "gdn", flag=False).mamba_pool
    assert mp.replayssm_pool is None and mp.replayssm_write_pos is None and mp.mamba_cache.replayssm_d is None


# --- lifecycle paths -----------------------------------------------------------------------------

def test_fresh_alloc_free_and_reuse_mid_window(sg):
    """A request decodes into the middle of a window and is freed (finish without caching, abort);
    the next owner of its request row and slot starts from its own prefill state with no records."""
    rtp = hybrid_pool(sg, size=1, mamba_size=1)  # one row and one slot: the second request reuses both
    m = Model("gdn", rtp)
    r1 = new_req(1)
    rtp.alloc([r1])
    s, row = int(r1.mamba_pool_idx), int(r1.req_pool_idx)
    assert s != row
    m.write_prefill_state(s)
    assert h_of(rtp, s) == [0]
    for _ in range(L + 2):  # one natural flush, then 2 records pending
        assert m.step([s]) < TOL
    assert h_of(rtp, s) == [2]
    rtp.free_mamba_cache(r1)
    rtp.free(r1)
    assert h_row(rtp, row) == [2], "nothing runs at free"
    r2 = new_req(2)
    rtp.alloc([r2])
    assert int(r2.mamba_pool_idx) == s and int(r2.req_pool_idx) == row
    assert h_of(rtp, s) == [0], "a request row entering prefill must start with no records"
    m.write_prefill_state(s)
    for _ in range(3):
        assert m.step([s]) < TOL


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_serving_decode_uses_the_small_batch_policy_and_stays_exact(sg, kind, monkeypatch):
    """Without the override, a small batch runs the window the policy measured not slower
    (window 1 here: the state is written every step, no record stays pending); switching to the
    buffered window and back mid-request keeps the state exact."""
    from replayssm_sglang import policy

    monkeypatch.delenv("REPLAYSSM_DECODE_WINDOW")
    assert policy.decode_window(kind, 1, torch.float32, L) == 1  # B = 1 is below every threshold
    rtp = hybrid_pool(sg, kind, mamba_size=1)
    m = Model(kind, rtp)
    r = new_req(1)
    rtp.alloc([r])
    s = int(r.mamba_pool_idx)
    m.write_prefill_state(s)
    for _ in range(3):
        assert m.step([s]) < TOL
        assert h_of(rtp, s) == [0] and m.state_err(s) < TOL
    monkeypatch.setenv("REPLAYSSM_DECODE_WINDOW", str(L))  # as a larger batch would
    for _ in range(2):
        assert m.step([s]) < TOL
    assert h_of(rtp, s) == [2]
    monkeypatch.delenv("REPLAYSSM_DECODE_WINDOW")  # back to a small batch: records folded first
    assert m.step([s]) < TOL
    assert h_of(rtp, s) == [0] and m.state_err(s) < TOL


def test_abort_mid_window_then_extend_resets_on_the_forward_stream(sg):
    """Abort frees a slot with records pending; the next owner's extend forward resets h even if
    the allocation-time reset raced with the old owner's in-flight decode (overlap scheduler)."""
    rtp = hybrid_pool(sg, mamba_size=2)
    m = Model("gdn", rtp)
    r = new_req()
    rtp.alloc([r])
    s = int(r.mamba_pool_idx)
    m.write_prefill_state(s)
    m.step([s])
    m.step([s])
    # the in-flight decode lands after the allocation-time reset: h is stale again
    assert h_of(rtp, s) == [2]
    # the next owner's prefill forward: SGLang's own (patched) metadata builder, one real row
    # and one padded row
    _, _, meta = extend_metadata(rtp, [r.req_pool_idx, r.req_pool_idx], [7, 1], mode="EXTEND", original_batch_size=1)
    assert meta.mamba_cache_indices.tolist() == [s, -1]
    assert h_of(rtp, s) == [0]
    m.write_prefill_state(s)
    assert m.step([s]) < TOL


def test_prefix_hit_copy_on_write(sg):
    """A radix node's state (exact: no running request owns it) is copied into a new request's slot;
    the request's row was reset at allocation (its previous owner left records there) and the copy
    touches no ring row, so the request decodes exactly from the copied checkpoint."""
    rtp = hybrid_pool(sg, size=2, mamba_size=4)
    m = Model("gdn", rtp)
    a, b = new_req(1), new_req(2)
    rtp.alloc([a, b])
    node, sb = int(a.mamba_pool_idx), int(b.mamba_pool_idx)
    m.write_prefill_state(node)
    m.write_prefill_state(sb)
    m.step([sb])
    m.step([sb])  # records in b's row
    row_b = int(b.req_pool_idx)
    assert h_row(rtp, row_b) == [2]
    rtp.free_mamba_cache(b)
    rtp.free(b)  # b aborted: its row keeps stale records until reused
    c = new_req(3)
    rtp.alloc([c])
    assert int(c.req_pool_idx) == row_b and h_row(rtp, row_b) == [0]
    dst = int(c.mamba_pool_idx)
    rtp.mamba_pool.copy_from(torch.tensor([node]), torch.tensor([dst]))
    m.ref[:, dst] = m.ref[:, node]
    assert m.state_err(dst) == 0.0
    for _ in range(L + 1):
        assert m.step([dst]) < TOL
    assert m.state_err(node) == 0.0, "the source checkpoint must be untouched"


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_finish_mid_window_caches_exact_state_at_full_length(sg, kind):
    """no_buffer: the finished request's live slot becomes a radix node. The patched
    MambaComponent folds the ring, so the key keeps its full length and the state is exact."""
    from sglang.srt.mem_cache.unified_cache.components.mamba_component import MambaComponent

    rtp = hybrid_pool(sg, kind, layers=(0, 1))
    m = Model(kind, rtp)
    r = new_req()
    rtp.alloc([r])
    s = int(r.mamba_pool_idx)
    m.write_prefill_state(s)
    steps = L + 2
    for _ in range(steps):
        assert m.step([s]) < TOL
    assert h_of(rtp, s) == [2, 2]
    assert m.state_err(s) > 1e-3, "mid-window the checkpoint lags (the test would pass vacuously otherwise)"
    comp = SimpleNamespace(cache=SimpleNamespace(enable_mamba_extra_buffer=False, req_to_token_pool=rtp),
                           int8_ckpt_pool=None)
    params = SimpleNamespace(mamba_value=None)
    n = 40 + steps
    cache_len = MambaComponent.prepare_for_caching_req(comp, r, params, n, True)
    assert cache_len == n, "the cached key must keep its full length"
    assert int(params.mamba_value) == s
    assert h_of(rtp, s) == [0, 0]
    assert m.state_err(s) < TOL


def test_legacy_mamba_radix_cache_finish_also_folds(sg):
    """The same hook in MambaRadixCache.cache_finished_req (legacy radix cache module)."""
    src = (sg.tree / "sglang/srt/mem_cache/mamba_radix_cache.py").read_text()
    i = src.index("def cache_finished_req")
    body = src[i: src.index("def cache_unfinished_req")]
    assert body.index("fold_req") < body.index("replayssm_write_pos"), "fold before the upstream cap"


def _kv_allocator(rtp):
    """The token-to-KV allocator's CPU copy calls as Req.offload_kv_cache / load_kv_cache make them:
    the mamba part goes to MambaPool.get_cpu_copy / load_cpu_copy (the KV part is not ours)."""
    mp = rtp.mamba_pool
    return SimpleNamespace(
        get_cpu_copy=lambda idx, mamba_indices: mp.get_cpu_copy(mamba_indices.view(-1)),
        load_cpu_copy=lambda cpu, idx, mamba_indices: mp.load_cpu_copy(cpu, mamba_indices.view(-1)))


def test_retraction_cpu_backup_keeps_accepted_updates(sg):
    """Retraction with CPU backup (upstream #38485): the patched Req.offload_kv_cache folds the
    request's ring row into its slot before the copy, so the backup holds every decoded token;
    Req.load_kv_cache restores into the re-admitted request's slot and drops its row's records."""
    from sglang.srt.managers.schedule_batch import Req

    rtp = hybrid_pool(sg, layers=(0, 1))
    kv = _kv_allocator(rtp)
    m = Model("gdn", rtp)
    r = new_req()
    rtp.alloc([r])
    s = int(r.mamba_pool_idx)
    m.write_prefill_state(s)
    for _ in range(L + 3):
        m.step([s])
    assert h_of(rtp, s) == [3, 3]
    r.seqlen = 9
    Req.offload_kv_cache(r, rtp, kv)
    conv_cpu, temporal_cpu = r.kv_cache_cpu
    assert temporal_cpu.device.type == "cpu"
    assert m.state_err(s, temporal_cpu[:, 0]) < TOL, "the backup must hold every accepted update"
    assert h_row(rtp, r.req_pool_idx) == [0, 0]
    ref_state = m.ref[:, s].clone()
    rtp.free_mamba_cache(r)
    rtp.free(r)
    # re-admission: a new request row and slot; the row's previous owner left records behind that
    # land after the allocation-time reset (an in-flight decode under the overlap scheduler)
    busy = new_req(5)
    rtp.alloc([busy])  # take the next row and slot so that r gets fresh ones
    rtp.alloc([r])
    s2 = int(r.mamba_pool_idx)
    m.write_prefill_state(s2)
    m.step([s2])
    assert h_row(rtp, r.req_pool_idx) == [1, 1]
    Req.load_kv_cache(r, rtp, kv)
    m.ref[:, s2] = ref_state
    assert h_row(rtp, r.req_pool_idx) == [0, 0]
    assert m.state_err(s2) < TOL
    for _ in range(3):
        assert m.step([s2]) < TOL


def test_hicache_load_back_into_a_slot_with_stale_records(sg):
    """HiCache load-back allocates the request's slot straight from the allocator and writes the
    host state into it; the request then enters HybridReqToTokenPool.alloc with its slot set, which
    resets its request row (stale records of the row's previous owner are dropped)."""
    rtp = hybrid_pool(sg, size=1, mamba_size=1)  # the load-back gets the stale row and slot
    m = Model("gdn", rtp)
    old = new_req(1)
    rtp.alloc([old])
    s, row = int(old.mamba_pool_idx), int(old.req_pool_idx)
    m.write_prefill_state(s)
    m.step([s])
    m.step([s])
    rtp.free_mamba_cache(old)  # finishes without caching
    rtp.free(old)
    r = new_req(2)
    slot = rtp.mamba_allocator.alloc(1)  # MambaComponent.prepare_load_back
    r.mamba_pool_idx = slot[0]
    assert int(slot[0]) == s and h_row(rtp, row) == [2], "the row still holds stale records"
    m.write_prefill_state(s, extend=False)  # the H->D copy of the cached state
    rtp.alloc([r])
    assert int(r.req_pool_idx) == row and h_row(rtp, row) == [0]
    for _ in range(L + 1):
        assert m.step([s]) < TOL


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_mixed_chunk_folds_decoding_rows_before_the_extend(sg, kind):
    """--enable-mixed-chunk: an extend batch carries decoding rows; the chunk kernel reads their
    checkpoints, which the metadata hook folds first (exact), and decode continues exactly."""
    rtp = hybrid_pool(sg, kind)
    m = Model(kind, rtp)
    a, b = new_req(1), new_req(2)
    rtp.alloc([a, b])
    sa, sb = int(a.mamba_pool_idx), int(b.mamba_pool_idx)
    m.write_prefill_state(sa)
    m.write_prefill_state(sb)
    for _ in range(3):
        m.step([sa])
    assert h_of(rtp, sa) == [3] and m.state_err(sa) > 1e-3
    m.step([sb])  # the slot's previous owner's last decode, still in flight under overlap
    m.ref[:, sb] = rtp.mamba_pool.mamba_cache.temporal[:, sb].to(F64)  # (its records are garbage for b)
    assert h_of(rtp, sb) == [1]
    before_b = rtp.mamba_pool.mamba_cache.temporal[:, sb].clone()
    # SGLang's own (patched) metadata builder for the mixed batch: prefill row b, decode row a
    _, _, meta = extend_metadata(rtp, [b.req_pool_idx, a.req_pool_idx], [5, 1])
    assert meta.mamba_cache_indices.tolist() == [sb, sa]
    assert h_of(rtp, sa) == [0] and m.state_err(sa) < TOL
    assert h_of(rtp, sb) == [0], "a prefill row drops stale records"
    assert torch.equal(rtp.mamba_pool.mamba_cache.temporal[:, sb], before_b), "and is not folded"
    for _ in range(2):
        assert m.step([sa, sb]) < TOL


def test_cuda_graph_padding_rows_touch_nothing(sg):
    """Padded rows (slot -1, request row 0, seq_len fill 1, as SGLang's _replay_metadata builds them)
    get zero output and leave every other slot, ring row, record and h bit-identical (poisoned with
    1e30)."""
    rtp = hybrid_pool(sg, mamba_size=4)
    m = Model("gdn", rtp)
    r = new_req()
    rtp.alloc([r])
    s, row = int(r.mamba_pool_idx), int(r.req_pool_idx)
    T = rtp.mamba_pool.mamba_cache.temporal
    rp = rtp.mamba_pool.replayssm_pool
    others = [i for i in range(T.shape[1]) if i != s]
    other_rows = [i for i in range(rp.rows) if i != row]
    T[:, others] = 1e30
    rp.u[:, other_rows] = 1e30
    m.ref[:, others] = 1e30
    m.write_prefill_state(s)
    snap = (T[:, others].clone(), rp.u[:, other_rows].clone(), rp.h[:, other_rows].clone())
    for _ in range(L + 1):
        assert m.step([s, -1, -1], seq_lens=[5, 1, 1], rows=[row, 0, 0]) < TOL
    assert torch.equal(T[:, others], snap[0]) and torch.equal(rp.u[:, other_rows], snap[1])
    assert torch.equal(rp.h[:, other_rows], snap[2])


# --- forced flush at radix block boundaries (issue 6) --------------------------------------------

def test_forced_flush_mask_is_device_side_and_exact():
    seq = torch.tensor([1, 255, 256, 257, 512, 768, 0])
    assert flush.forced_flush_mask(seq, 256).tolist() == [0, 0, 1, 0, 1, 1, 1]
    out = torch.full((7,), 7, dtype=torch.int32)
    r = flush.forced_flush_mask(seq, 256, out=out)
    assert r is out and out.tolist() == [0, 0, 1, 0, 1, 1, 1]
    with pytest.raises(ValueError):
        flush.forced_flush_mask(seq, 0)
    # matches SGLang's extra_buffer decode track mask, page sizes included (interval % page == 0)
    for interval in (64, 128, 256):
        s = torch.randint(1, 4096, (64,))
        assert torch.equal(flush.forced_flush_mask(s, interval).bool(), s % interval == 0)


def test_track_interval_only_when_decode_states_are_snapshotted():
    on = SimpleNamespace(disable_radix_cache=False, enable_mamba_extra_buffer=lambda: True, mamba_track_interval=256)
    assert flush.track_interval_from_server_args(on) == 256
    assert flush.track_interval_from_server_args(SimpleNamespace(**{**vars(on), "disable_radix_cache": True})) is None
    nb = SimpleNamespace(**{**vars(on), "enable_mamba_extra_buffer": lambda: False})
    assert flush.track_interval_from_server_args(nb) is None


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_forced_flush_makes_the_track_snapshot_exact_and_donation_keeps_it(sg, kind):
    """extra_buffer: on the step whose seq_len is a multiple of the track interval the kernel
    flushes (decided from device seq_lens), so the track copy SGLang makes after the last layer
    holds the exact state; the ping-pong slot is donated to the radix tree and a later request
    copies it (COW) and decodes exactly. Without the forced flag the snapshot would be stale."""
    interval = 3
    rtp = hybrid_pool(sg, kind, extra_buffer=True, mamba_size=8)
    rtp.mamba_pool.replayssm_pool.track_interval = interval
    m = Model(kind, rtp)
    r = new_req()
    rtp.alloc([r])
    s = int(r.mamba_pool_idx)
    assert r.mamba_ping_pong_track_buffer is not None
    m.write_prefill_state(s)
    T = rtp.mamba_pool.mamba_cache.temporal
    seq = 7  # prompt length; decode steps produce seq 8, 9 (boundary), 10, 11, 12 (boundary) ...
    snaps = 0
    for _ in range(6):
        seq += 1
        assert m.step([s], seq_lens=[seq]) < TOL
        if seq % interval == 0:
            # _track_mamba_state_decode: copy the live slot into the next ping-pong slot
            track = int(r.mamba_ping_pong_track_buffer[r.mamba_next_track_idx])
            T[:, track] = T[:, s]
            m.ref[:, track] = m.ref[:, s]
            assert m.state_err(track) < TOL, f"track snapshot at seq {seq} must be exact"
            r.mamba_next_track_idx = 1 - r.mamba_next_track_idx
            snaps += 1
    assert snaps == 2
    # donate the kept ping-pong slot to the tree; a new request copies it and decodes
    new_slot = rtp.mamba_allocator.alloc(1)
    donated = int(rtp.donate_mamba_ping_pong_slot(r, new_slot))
    r2 = new_req(2)
    rtp.alloc([r2])
    s2 = int(r2.mamba_pool_idx)
    rtp.mamba_pool.copy_from(torch.tensor([donated]), torch.tensor([s2]))
    m.ref[:, s2] = m.ref[:, donated]
    for _ in range(L + 1):
        assert m.step([s2], seq_lens=[100]) < TOL


def test_without_forced_flush_the_snapshot_would_be_stale(sg):
    """Guards the fix: the same walk with no track interval leaves the checkpoint lagging at the
    boundary (so the test above can fail)."""
    rtp = hybrid_pool(sg, "gdn", mamba_size=4)
    m = Model("gdn", rtp)
    r = new_req()
    rtp.alloc([r])
    s = int(r.mamba_pool_idx)
    m.write_prefill_state(s)
    for seq in (8, 9):
        m.step([s], seq_lens=[seq])
    assert m.state_err(s) > 1e-3


# --- server arguments ----------------------------------------------------------------------------

def _args(**kw):
    base = dict(enable_linear_replayssm=True, enable_linear_replayssm_spec=False, linear_replayssm_cache_len=16,
                speculative_algorithm=None, speculative_eagle_topk=None, disaggregation_mode="null",
                enable_unified_memory=False, enable_int8_mamba_checkpoint=False, enable_streaming_session=False)
    base.update(kw)
    return SimpleNamespace(**base)


ACCEPTED = [dict(), dict(linear_replayssm_cache_len=1), dict(linear_replayssm_cache_len=64),
            dict(speculative_algorithm="NEXTN"),
            dict(speculative_algorithm="EAGLE", speculative_eagle_topk=1, speculative_num_draft_tokens=4),
            dict(speculative_algorithm="eagle3", speculative_num_draft_tokens=16,
                 mamba_radix_cache_strategy="extra_buffer")]
REFUSED = [
    (dict(enable_linear_replayssm_spec=True), "triton",
     "--enable-linear-replayssm and --enable-linear-replayssm-spec cannot be combined: "
     "--enable-linear-replayssm-spec selects upstream SGLang's separate spec-verify ring, while "
     "replayssm-sglang verifies drafts in the same ring as decode (--enable-linear-replayssm "
     "alone turns on both). Fix: drop --enable-linear-replayssm-spec (or, for upstream's spec "
     "ring, drop --enable-linear-replayssm)."),
    (dict(), "flashinfer",
     "--enable-linear-replayssm runs on the Triton linear-attention decode backend, got "
     "--linear-attn-decode-backend='flashinfer': pass --linear-attn-decode-backend triton "
     "or drop --enable-linear-replayssm."),
    (dict(linear_replayssm_cache_len=0), "triton",
     "--linear-replayssm-cache-len must be >= 1, got 0; 16 is the default and a good choice."),
    (dict(speculative_algorithm="EAGLE", speculative_eagle_topk=4), "triton",
     "ReplaySSM speculative verify supports linear draft chains only, got --speculative-eagle-topk 4 "
     "(an EAGLE tree). Fix: set --speculative-eagle-topk 1 (or use NEXTN/MTP), or turn off "
     "--enable-linear-replayssm for tree drafting."),
    (dict(speculative_algorithm="NGRAM"), "triton",
     "--enable-linear-replayssm verifies linear draft chains of EAGLE, EAGLE3 or NEXTN, got "
     "--speculative-algorithm='NGRAM'. Fix: use one of those with --speculative-eagle-topk 1, or "
     "drop --enable-linear-replayssm."),
    (dict(disaggregation_mode="decode"), "triton",
     "--enable-linear-replayssm is not supported under PD disaggregation "
     "(--disaggregation-mode='decode'): the disaggregated decode pool "
     "(HybridMambaDecodeReqToTokenPool) allocates no ring and the state transfer does not "
     "fold it. Fix: drop --enable-linear-replayssm on both servers."),
    (dict(enable_unified_memory=True), "triton",
     "--enable-linear-replayssm does not support --enable-unified-memory: the unified mamba "
     "pool allocates no ring (upstream turns ReplaySSM off there silently). Fix: drop "
     "--enable-unified-memory or drop --enable-linear-replayssm."),
    (dict(enable_int8_mamba_checkpoint=True), "triton",
     "--enable-linear-replayssm is not validated with --enable-int8-mamba-checkpoint (its "
     "copy-on-write bypasses MambaPool.copy_from). Fix: drop --enable-int8-mamba-checkpoint "
     "or drop --enable-linear-replayssm."),
    (dict(enable_streaming_session=True), "triton",
     "--enable-linear-replayssm does not support --enable-streaming-session: a streaming "
     "session keeps a finished turn's live slot without the radix-cache path that folds the "
     "ring. Fix: drop --enable-streaming-session or drop --enable-linear-replayssm."),
    (dict(speculative_algorithm="NEXTN", speculative_num_draft_tokens=20), "triton",
     "tokens per step T=20 exceeds the ring length L=16: raise --linear-replayssm-cache-len to at "
     "least 20"),
    (dict(speculative_algorithm="EAGLE", speculative_eagle_topk=1, speculative_adaptive=True), "triton",
     "--enable-linear-replayssm does not support --speculative-adaptive: the ring and the commit are "
     "sized for a fixed --speculative-num-draft-tokens. Fix: drop --speculative-adaptive or drop "
     "--enable-linear-replayssm."),
    (dict(speculative_algorithm="NEXTN", mamba_radix_cache_strategy="extra_buffer_lazy"), "triton",
     "--enable-linear-replayssm with speculative decoding is not validated with "
     "--mamba-radix-cache-strategy extra_buffer_lazy (its lazily prepared track slots). Fix: "
     "--mamba-radix-cache-strategy extra_buffer (or auto), or drop --enable-linear-replayssm."),
]


@pytest.mark.parametrize("kw", ACCEPTED)
def test_server_args_accepted(kw):
    from replayssm_sglang.sglang_hooks import server_args as S

    assert S.validate(_args(**kw), "triton") is True
    assert S.validate(_args(enable_linear_replayssm=False, **kw), "flashinfer") is False


@pytest.mark.parametrize("kw,decode,msg", REFUSED)
def test_server_args_refused_with_exact_message(kw, decode, msg):
    from replayssm_sglang.sglang_hooks import server_args as S

    with pytest.raises(ValueError) as e:
        S.validate(_args(**kw), decode)
    assert str(e.value) == msg


def test_capabilities_match_the_rules():
    """doctor reports CAPABILITIES; each entry must be what validate() really does."""
    from replayssm_sglang.sglang_hooks import server_args as S

    def accepts(**kw):
        try:
            return S.validate(_args(**kw), "triton")
        except ValueError:
            return False

    caps = S.CAPABILITIES
    assert caps["extra_buffer"] == accepts(mamba_radix_cache_strategy="extra_buffer", disable_radix_cache=False)
    assert caps["overlap_schedule"] == accepts(disable_overlap_schedule=False)
    assert caps["cuda_graph"] == accepts(disable_cuda_graph=False)
    assert caps["spec_verify"] == accepts(speculative_algorithm="NEXTN", speculative_eagle_topk=1)


# --- through SGLang's own (patched) backend code -------------------------------------------------

@pytest.mark.parametrize("kind,lower_bound,keys,self_pre", [("gdn", None, "", False), ("gdn", None, "", True),
                                                             ("kda", None, "", False), ("kda", -5.0, "", False),
                                                             ("kda", None, "raw", False)])
def test_patched_backend_forward_decode_and_sglang_track_copy(sg, kind, lower_bound, keys, self_pre, monkeypatch):
    """GDNAttnBackend / KDAAttnBackend.forward_decode as patched (0003): after SGLang's conv1d
    (replaced by the identity here: conv is not ours) the step runs our kernel with the device
    forced-flush mask, then SGLang's own all-layers track copy (Triton, interpreted) snapshots the
    live slot into the extra_buffer track slot on boundary steps. The snapshots are exact; the
    live checkpoint between boundaries is not (records pending), so the test can fail.
    KDA's safe gate (lower_bound) goes through our kernel too (upstream silently falls back to an
    unbuffered path there while its cursor advances). keys: REPLAYSSM_KDA_KEYS ("": the default, predecayed
    key records for KDA; "raw": k_j and G_j per record). self_pre: REPLAYSSM_SELF_PRE=1 (GDN: decode v3 without its
    pre launch), checked to have run no pre launch."""
    from sglang.srt.layers.attention.linear import gdn_backend, kda_backend
    from replayssm_sglang.kernels import decode_v3

    pres = []
    spy_launches(monkeypatch, decode_v3, "replay_decode_v3_pre_kernel", lambda g, a, kw: pres.append(g))
    if self_pre:
        monkeypatch.setenv("REPLAYSSM_SELF_PRE", "1")
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mod, cls = (gdn_backend, gdn_backend.GDNAttnBackend) if kind == "gdn" else (kda_backend, kda_backend.KDAAttnBackend)
    monkeypatch.setattr(mod, "causal_conv1d_update", lambda x, *a, **k: x)
    interval = 3
    if keys:
        monkeypatch.setenv("REPLAYSSM_KDA_KEYS", keys)
    rtp = hybrid_pool(sg, kind, layers=(0, 1), extra_buffer=True, mamba_size=10)
    assert rtp.mamba_pool.replayssm_pool.kda_keys == (keys or ("predecayed" if kind == "kda" else "raw"))
    rtp.mamba_pool.replayssm_pool.track_interval = interval
    m = Model(kind, rtp)
    for layer in m.layers.values():
        layer.lower_bound = lower_bound
    a, b = new_req(1), new_req(2)
    rtp.alloc([a, b])
    slots = [int(a.mamba_pool_idx), int(b.mamba_pool_idx)]
    for s in slots:
        m.write_prefill_state(s)
    backend = object.__new__(cls)
    backend.req_to_token_pool = rtp
    backend.enable_unified_memory = False
    T = rtp.mamba_pool.mamba_cache.temporal
    seqs = [7, 8]  # the rows hit boundaries on different steps
    checked = 0
    for _ in range(3):
        seqs = [x + 1 for x in seqs]
        idx = torch.tensor(slots, dtype=torch.int32)
        mask = torch.tensor([x % interval == 0 for x in seqs])
        track = torch.tensor([int(r.mamba_ping_pong_track_buffer[r.mamba_next_track_idx]) for r in (a, b)])
        backend.forward_metadata = ForwardMetadata(query_start_loc=torch.arange(3, dtype=torch.int32),
                                                   mamba_cache_indices=idx, mamba_track_indices=track)
        fb = SimpleNamespace(seq_lens=torch.tensor(seqs), mamba_track_mask=mask, batch_size=2,
                             forward_mode=ForwardMode.DECODE,
                             req_pool_indices=torch.tensor([a.req_pool_idx, b.req_pool_idx]))
        for lid, layer in m.layers.items():
            li = rtp.mamba_map[lid]
            mixed, aa, bb, _, _ = ref.random_decode_inputs(kind, 2, m.H, HV, K, V, generator=m.gen)
            lay = SimpleNamespace(**vars(layer), conv_weights=None, bias=None, activation="silu")
            out = backend.forward_decode(lay, fb, mixed, aa, bb)
            x = ref.unpack(kind, mixed, aa, bb, layer.A_log, layer.dt_bias, H=m.H, HV=HV, K=K, V=V,
                           lower_bound=lower_bound)
            o_ref = ref.conventional_step(m.ref[li], x, idx)
            assert rms_ratio(out[0].to(F64), o_ref) < TOL
        for row, r in enumerate((a, b)):
            if mask[row]:
                t = int(track[row])
                assert rms_ratio(T[:, t].to(F64), m.ref[:, slots[row]]) < TOL, f"row {row} seq {seqs[row]}"
                r.mamba_next_track_idx = 1 - r.mamba_next_track_idx
                checked += 1
            else:
                assert m.state_err(slots[row]) > 1e-3, "between boundaries records are pending"
    assert checked == 2
    assert bool(pres) != self_pre, "the buffered decode ran its pre launch exactly when self_pre was off"


def test_mixed_chunk_fresh_prefill_row_with_racing_stale_records(sg):
    """Overlap scheduler + mixed chunk: a new request's row and slot were just freed by a request whose
    last decode is still in flight and bumps h of the row after the allocation-time reset. The mixed
    batch's metadata hook resets prefill rows (extending more than one token) on the forward stream
    before folding, so the fold is the identity on it: its prefill starts from SGLang's cleared state."""
    rtp = hybrid_pool(sg, size=1, mamba_size=1)
    m = Model("gdn", rtp)
    old = new_req(1)
    rtp.alloc([old])
    s, row = int(old.mamba_pool_idx), int(old.req_pool_idx)
    m.write_prefill_state(s)
    rtp.free_mamba_cache(old)
    rtp.free(old)
    new = new_req(2)
    rtp.alloc([new])
    assert int(new.mamba_pool_idx) == s and int(new.req_pool_idx) == row and new.mamba_needs_clear
    m.step([s], rows=[row])
    m.step([s], rows=[row])  # the old owner's in-flight decode lands after the reset
    assert h_row(rtp, row) == [2]
    rtp.mamba_pool.clear_slots(torch.tensor([s]))  # ModelRunner._maybe_execute_deferred_mamba_cow_and_clear
    extend_metadata(rtp, [new.req_pool_idx], [6])
    assert h_row(rtp, row) == [0]
    assert torch.count_nonzero(rtp.mamba_pool.mamba_cache.temporal[:, s]) == 0


def test_mixed_chunk_new_request_extending_one_token_drops_racing_stale_records(sg):
    """Overlap scheduler + mixed chunk, the corner the extend length cannot tell: a new request whose
    first forward extends exactly one token (a prefix hit up to its last token, copied into its slot),
    in a MIXED batch beside a decoding row. Its request row was just freed by a request whose last
    decode lands after the allocation-time reset. The row is flagged fresh at allocation, so the
    metadata hook resets it (not folds the stale records into the copied state); the decoding row is
    folded as usual, and both decode exactly afterwards."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase

    rtp = hybrid_pool(sg, size=2, mamba_size=4)
    m = Model("gdn", rtp)
    d, old = new_req(1), new_req(2)
    rtp.alloc([d, old])
    sd, s_old, row = int(d.mamba_pool_idx), int(old.mamba_pool_idx), int(old.req_pool_idx)
    m.write_prefill_state(sd)
    m.write_prefill_state(s_old)
    for _ in range(2):
        m.step([sd])
    rtp.free_mamba_cache(old)
    rtp.free(old)
    new = new_req(3)
    rtp.alloc([new])
    s_new = int(new.mamba_pool_idx)
    assert int(new.req_pool_idx) == row
    m.write_prefill_state(s_new, extend=False)  # the copied prefix state; its first forward is the mixed one
    m.step([s_old], rows=[row])  # the old owner's in-flight decode lands after the reset
    m.step([s_old], rows=[row])
    m.ref[:, s_old] = rtp.mamba_pool.mamba_cache.temporal[:, s_old].to(F64)
    assert h_row(rtp, row) == [2] and h_of(rtp, sd) == [2]
    before = rtp.mamba_pool.mamba_cache.temporal[:, s_new].clone()
    backend, fb, meta = extend_metadata(rtp, [new.req_pool_idx, d.req_pool_idx], [1, 1])
    assert meta.mamba_cache_indices.tolist() == [s_new, sd]
    assert h_row(rtp, row) == [0], "the fresh row is reset, not folded"
    assert torch.equal(rtp.mamba_pool.mamba_cache.temporal[:, s_new], before)
    assert h_of(rtp, sd) == [0] and m.state_err(sd) < TOL, "the decoding row is folded"
    for _ in range(L + 1):
        assert m.step([s_new, sd]) < TOL
    # the flag is cleared by the first extend: a later mixed batch folds the row like any decoding row
    assert h_of(rtp, s_new) != [0]
    fb.req_pool_indices = torch.tensor([new.req_pool_idx])
    fb.batch_size, fb.extend_start_loc, fb.extend_seq_lens = 1, torch.tensor([0]), torch.tensor([1])
    MambaAttnBackendBase._forward_metadata(backend, fb)
    assert h_of(rtp, s_new) == [0] and m.state_err(s_new) < TOL


def test_forced_mask_computed_once_per_forward_and_recomputed_for_new_lengths(sg):
    """Every layer of one forward shares one mask tensor; a new seq_lens tensor on the same
    metadata object (warm-up before a CUDA-graph capture reuses it) gets a fresh mask."""
    from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata

    rp = hybrid_pool(sg).mamba_pool.replayssm_pool
    meta = ForwardMetadata(query_start_loc=None, mamba_cache_indices=torch.tensor([1]))
    rp.track_interval = None
    assert rp.forced_mask(meta, torch.tensor([256])) is None
    rp.track_interval = 4
    s1 = torch.tensor([4, 5])
    m1 = rp.forced_mask(meta, s1)
    assert m1.tolist() == [1, 0] and rp.forced_mask(meta, s1) is m1
    s2 = torch.tensor([7, 8])
    m2 = rp.forced_mask(meta, s2)
    assert m2 is not m1 and m2.tolist() == [0, 1]


@pytest.mark.parametrize("kind", ["gdn", "kda"])
@pytest.mark.parametrize("max_running", [None, 40])
def test_budget_charges_the_ring_per_request_row(sg, kind, max_running):
    """Patch 0005 through SGLang's own solver (KVCacheConfigurator._handle_max_mamba_cache, ratio
    path): with the flag the ring is charged per request row, once: K mamba slots and
    R + 1 = min(K // ratio, max running requests) + 1 ring rows fit the budget, one more slot would
    not, and the memory left for KV is the budget minus both. Fewer slots than without the flag, more
    than with the ring charged per slot (the old charge)."""
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.runtime_context import get_context, get_schedule
    from replayssm_sglang.sglang_hooks import pool as P

    cp = cache_params(kind, list(range(12)))
    rest_gb, mratio, Lr, ratio = 8.0, 0.9, 16, 3
    got = {}
    for flag in (False, True):
        with get_context().override_server_args(enable_linear_replayssm=flag, linear_replayssm_cache_len=Lr,
                                                mamba_full_memory_ratio=mratio,
                                                max_running_requests=max_running) as sa:
            fake = SimpleNamespace(mambaish_config=SimpleNamespace(mamba2_cache_params=cp), server_args=sa,
                                   ps=SimpleNamespace(pp_size=1, attn_dp_size=1),
                                   spec_algorithm=SimpleNamespace(is_none=lambda: True),
                                   hybrid_gdn_config=object() if kind == "gdn" else None,
                                   model_config=SimpleNamespace(hf_config=None, num_hidden_layers=24),
                                   _calculate_mamba_ratio=lambda: ratio)
            left = KVCacheConfigurator._handle_max_mamba_cache(fake, rest_gb)
            got[flag] = (get_schedule().max_mamba_cache_size, left)
    budget = rest_gb * mratio / (1 + mratio) * (1 << 30)
    per, ring = cp.mamba_cache_per_req, P.ring_bytes_per_row(cp, Lr)
    k_off, left_off = got[False]
    assert k_off == int((budget - per) // per)
    assert abs(left_off - (rest_gb - (k_off + 1) * per / (1 << 30))) < 1e-9
    k, left = got[True]

    def rows(kk):
        r = kk // ratio
        return (r if max_running is None else min(r, max_running)) + 1

    assert (k + 1) * per + rows(k) * ring <= budget < (k + 2) * per + rows(k + 1) * ring
    assert abs(left - (rest_gb - ((k + 1) * per + rows(k) * ring) / (1 << 30))) < 1e-9
    per_slot_k = int((budget - per - ring) // (per + ring))  # the ring charged per slot, as before
    assert per_slot_k < k < k_off


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_tensor_parallel_ring_is_sharded_by_heads_like_the_state(sg, kind):
    """TP > 1: SGLang's cache params carry the per-rank heads; the ring follows them, so each rank
    holds the records of its own heads (no communication, same flush decisions on every rank)."""
    from sglang.srt.configs.mamba_utils import (KimiLinearCacheParams, KimiLinearStateShape, Mamba2CacheParams,
                                                Mamba2StateShape)
    from replayssm_sglang.sglang_hooks import pool as P

    full_H, full_HV = 16, 32
    for tp in (1, 2, 4):
        if kind == "gdn":
            shape = Mamba2StateShape.create(tp_world_size=tp, intermediate_size=full_HV * 128, n_groups=full_H,
                                            num_heads=full_HV, head_dim=128, state_size=128, conv_kernel=4)
            cp = Mamba2CacheParams(shape=shape, layers=[0])
        else:
            shape = KimiLinearStateShape.create(tp_world_size=tp, num_heads=full_HV, head_dim=128)
            cp = KimiLinearCacheParams(shape=shape, layers=[0])
        lay = P.layout_from_cache_params(cp, 16)
        assert (lay.HV, lay.V, lay.K) == tuple(cp.shape.temporal) == (full_HV // tp, 128, 128)
        assert lay.HK == ((full_H // tp) if kind == "gdn" else full_HV // tp)
        if tp > 1:
            assert P.ring_bytes_per_slot(cp, 16) * tp == pytest.approx(base, rel=1e-3)
        else:
            base = P.ring_bytes_per_slot(cp, 16)


def test_backend_setup_refuses_layers_we_do_not_serve_and_sets_the_interval(sg):
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend
    from replayssm_sglang.sglang_hooks import decode

    rtp = hybrid_pool(sg)
    runner = SimpleNamespace(server_args=SimpleNamespace(disable_radix_cache=False, enable_mamba_extra_buffer=lambda: True,
                                                         mamba_track_interval=64))
    for cls in (GDNAttnBackend, KDAAttnBackend):
        be = object.__new__(cls)
        be.req_to_token_pool = rtp
        rtp.mamba_pool.replayssm_pool.track_interval = None
        decode.setup(be, runner)
        assert rtp.mamba_pool.replayssm_pool.track_interval == 64
    be = object.__new__(Mamba2AttnBackend)
    be.req_to_token_pool = rtp
    with pytest.raises(RuntimeError) as e:
        decode.setup(be, runner)
    assert str(e.value) == (
        "--enable-linear-replayssm serves GDN (Qwen3-Next, Qwen3.5) and KDA (Kimi-Linear) "
        "linear-attention layers; this model's layers run on Mamba2AttnBackend. "
        "Fix: drop --enable-linear-replayssm for this model.")
    off = object.__new__(Mamba2AttnBackend)
    off.req_to_token_pool = hybrid_pool(sg, flag=False)
    decode.setup(off, runner)  # flag off: nothing to check


# --- the real ServerArgs resolution (patched SGLang) ---------------------------------------------

CONFIGS = Path(__file__).parent / "data" / "configs"


@pytest.fixture
def real_args(sg, tmp_path, monkeypatch):
    """ServerArgs(...) as launch_server builds it, for a GDN (Qwen3-Next: "gdn"; Qwen3.5-MoE, a
    multimodal config with a nested text_config: "qwen3_5") or KDA (Kimi-Linear: "kda") config, with
    the CUDA probes answered as on an H100 (this machine has no GPU)."""
    import sglang.srt.server_args as S

    monkeypatch.setattr(S, "is_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    dirs = {}
    for kind, name in (("gdn", "qwen3-next-80b-a3b.json"), ("kda", "kimi-linear-48b-a3b.json"),
                       ("qwen3_5", "qwen3.5-moe-like.json")):
        d = tmp_path / kind
        d.mkdir()
        shutil.copy(CONFIGS / name, d / "config.json")
        dirs[kind] = str(d)

    def make(kind="gdn", **kw):
        return S.ServerArgs(model_path=dirs[kind], skip_tokenizer_init=True, device="cuda", trust_remote_code=True, **kw)

    return make


@pytest.mark.parametrize("kind", ["gdn", "kda", "qwen3_5"])
@pytest.mark.parametrize("kw,strategy,overlap_off,extra_buffer", [
    (dict(), "extra_buffer", False, True),  # SGLang's defaults: auto -> extra_buffer, overlap on
    (dict(page_size=64), "extra_buffer", False, True),
    (dict(enable_mixed_chunk=True), "extra_buffer", False, True),
    (dict(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True), "no_buffer", True, False),
    (dict(disable_radix_cache=True), "auto", False, False),
    # MTP: NEXTN resolves to a linear chain (EAGLE, topk 1), verified in the same ring (patch 0006)
    (dict(speculative_algorithm="NEXTN"), "extra_buffer", False, True),
])
def test_real_server_args_accept_one_flag_under_defaults(real_args, kind, kw, strategy, overlap_off, extra_buffer):
    a = real_args(kind, enable_linear_replayssm=True, **kw)
    assert a.enable_linear_replayssm and a.linear_replayssm_cache_len == 16
    assert a.mamba_radix_cache_strategy == strategy
    assert a.disable_overlap_schedule is overlap_off
    assert a.enable_mamba_extra_buffer() is extra_buffer
    assert (a.linear_attn_decode_backend or a.linear_attn_backend) == "triton"


@pytest.mark.parametrize("kw,msg", [
    (dict(speculative_algorithm="NGRAM"), REFUSED[4][2]),
    (dict(speculative_algorithm="EAGLE", speculative_eagle_topk=4, speculative_num_steps=3,
          speculative_num_draft_tokens=8), REFUSED[3][2]),
    (dict(linear_attn_decode_backend="flashinfer"), REFUSED[1][2]),
    (dict(enable_unified_memory=True), REFUSED[6][2]),
    (dict(disaggregation_mode="decode"), REFUSED[5][2]),
    (dict(linear_replayssm_cache_len=0), REFUSED[2][2]),
])
@pytest.mark.parametrize("kind", ["gdn", "qwen3_5"])
def test_real_server_args_refuse_with_exact_message(real_args, kind, kw, msg):
    with pytest.raises(ValueError) as e:
        real_args(kind, enable_linear_replayssm=True, **kw)
    assert str(e.value) == msg


@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("kind,layers,linear", [("gdn", 48, 36), ("qwen3_5", 40, 30)])
def test_real_config_cache_params_shape_the_ring_per_rank(sg, real_args, kind, layers, linear, tp):
    """The ring's shapes come from the cache params SGLang itself derives from the model's config
    (Qwen3-Next's flat config; Qwen3.5's nested text_config) on each TP rank: the per-rank heads
    (H/tp key heads, HV/tp value heads, K = V = 128) and one ring layer per GDN layer, in SGLang's
    HybridReqToTokenPool built from those params."""
    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config, mambaish_config
    from sglang.srt.runtime_context import get_parallel
    from replayssm_sglang.sglang_hooks import pool as P

    a = real_args(kind, enable_linear_replayssm=True, tp_size=tp)
    mc = a.get_model_config()
    cfg = hybrid_gdn_config(mc)
    assert cfg is not None and mambaish_config(mc) is cfg  # served as GDN layers, not Mamba2
    with get_parallel().override(attn_tp_size=tp):
        cp = cfg.mamba2_cache_params
    assert list(cp.layers) == [i for i in range(layers) if (i + 1) % 4]
    assert len(cp.layers) == linear and cp.dtype.temporal == torch.float32
    lay = P.layout_from_cache_params(cp, a.linear_replayssm_cache_len)
    assert (lay.kind, lay.HK, lay.HV, lay.K, lay.V) == ("gdn", 16 // tp, 32 // tp, 128, 128)

    rtp = sg.memory_pool.HybridReqToTokenPool(
        size=2, mamba_size=2, mamba_spec_state_size=2, max_context_len=8, device="cpu",
        enable_memory_saver=False, cache_params=cp, mamba_layer_ids=list(cp.layers),
        enable_mamba_extra_buffer=True, enable_overlap_schedule=True,
        enable_linear_replayssm=True, linear_replayssm_cache_len=a.linear_replayssm_cache_len)
    rp = rtp.mamba_pool.replayssm_pool
    rows, cap = rtp.req_to_token.shape[0], lay.cap
    assert rp.rows == rows and rp.num_layers == linear
    assert tuple(rp.u.shape) == (linear, rows, 32 // tp, cap, 128)
    assert tuple(rp.k.shape) == (linear, rows, 16 // tp, cap, 128)
    assert tuple(rp.g.shape) == (linear, rows, 32 // tp, cap, 1)
    assert rp.nbytes() == rows * P.ring_bytes_per_row(cp, a.linear_replayssm_cache_len)


def test_kda_keys_option(monkeypatch):
    """KDA key records: predecayed for KDA without speculative decoding, raw with it and for GDN;
    REPLAYSSM_KDA_KEYS=raw opts out, =predecayed is refused where it cannot run; junk refused."""
    from replayssm_sglang.sglang_hooks.pool import kda_keys_for

    monkeypatch.delenv("REPLAYSSM_KDA_KEYS", raising=False)
    assert kda_keys_for("kda", None) == "predecayed"
    assert kda_keys_for("kda", 4) == "raw" and kda_keys_for("gdn", None) == "raw"
    monkeypatch.setenv("REPLAYSSM_KDA_KEYS", "raw")
    assert kda_keys_for("kda", None) == "raw"
    monkeypatch.setenv("REPLAYSSM_KDA_KEYS", "predecayed")
    assert kda_keys_for("kda", None) == "predecayed"
    for kind, spec_T in (("kda", 4), ("gdn", None)):
        with pytest.raises(ValueError, match="needs a KDA model without speculative decoding"):
            kda_keys_for(kind, spec_T)
    monkeypatch.setenv("REPLAYSSM_KDA_KEYS", "decayed")
    with pytest.raises(ValueError, match="REPLAYSSM_KDA_KEYS must be one of raw, predecayed"):
        kda_keys_for("kda", None)

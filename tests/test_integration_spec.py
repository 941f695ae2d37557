"""Speculative verify in the ring inside real SGLang 0.5.17 modules on CPU (patch 0006).

The series is applied to a clone in tmp (as in tests/test_integration_sglang.py). The target-verify
step runs through the patched ``GDNAttnBackend.forward_extend`` / ``KDAAttnBackend._forward_target_verify``
(SGLang's conv update replaced by the identity that fills the per-draft conv windows with random
values: conv is not ours), the commit through the patched
``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify``, plain decode steps through the patched
``forward_decode``; kernels run under the Triton interpreter. The reference is the float64
conventional recurrence (replayssm_sglang.reference.conventional_step) over the *accepted* stream:
a verify step's T outputs are computed from the committed state, then the state after the accepted
drafts is kept. After every commit the exact state the ring holds (checkpoint + committed records,
computed without touching the ring) must equal it, so a rejected draft that leaked would fail.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from replayssm_sglang import reference as ref

sys.path.insert(0, str(Path(__file__).parent))
from sglang_trees import buffered_window, sg  # noqa: E402,F401  (fixtures)
from test_integration_sglang import cache_params, new_req, rms_ratio  # noqa: E402

F64 = torch.float64
H, HV, K, V = 1, 2, 16, 16
L, T = 4, 3
TOL = 2e-5


class _CpuTorch:
    """MambaPool allocates the speculative scratch (conv windows, SSM snapshots) with
    device="cuda" hard-coded; on this CPU-only machine those allocations go to the CPU."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def zeros(*a, **k):
        if k.get("device") == "cuda":
            k["device"] = "cpu"
        return torch.zeros(*a, **k)


def spec_pool(sg, kind, *, layers=(0, 1), size=4, mamba_size=8, extra_buffer=False, flag=True, T_=T, L_=L):
    mp = pytest.MonkeyPatch()
    try:
        mp.setattr(sg.memory_pool, "torch", _CpuTorch())
        rtp = sg.memory_pool.HybridReqToTokenPool(
            size=size, mamba_size=mamba_size, mamba_spec_state_size=size, max_context_len=64, device="cpu",
            enable_memory_saver=False, cache_params=cache_params(kind, list(layers)), mamba_layer_ids=list(layers),
            enable_mamba_extra_buffer=extra_buffer, enable_overlap_schedule=True,
            enable_linear_replayssm=flag, linear_replayssm_cache_len=L_,
            speculative_num_draft_tokens=T_, speculative_eagle_topk=1)
        rtp.mamba_allocator.alloc(1)  # burn a slot: requests' slots then differ from their (ring) rows
        return rtp
    finally:
        mp.undo()


# --- memory -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_spec_pool_drops_the_per_draft_ssm_snapshots_and_counts_it(sg, kind):
    on = spec_pool(sg, kind)
    off = spec_pool(sg, kind, flag=False)
    mc_on, mc_off = on.mamba_pool.mamba_cache, off.mamba_pool.mamba_cache
    rp = on.mamba_pool.replayssm_pool
    assert mc_on.intermediate_ssm is None, "our verify keeps drafts as ring records"
    assert mc_off.intermediate_ssm is not None and off.mamba_pool.replayssm_pool is None
    layers, size = 2, 4
    assert tuple(mc_off.intermediate_ssm.shape) == (layers, size + 1, T, HV, V, K)
    # the conv windows stay (SGLang's conv rollback)
    assert [tuple(w.shape) for w in mc_on.intermediate_conv_window] == \
        [tuple(w.shape) for w in mc_off.intermediate_conv_window]
    assert rp.spec_T == T and rp.layout.T_max == T and rp.layout.cap == L
    dropped = mc_off.intermediate_ssm.numel() * mc_off.intermediate_ssm.element_size()
    assert rp.dropped_intermediate_bytes == dropped
    # mem_usage (GB): ours = SGLang's without the snapshots + our ring
    diff = (off.mamba_pool.mem_usage - on.mamba_pool.mem_usage) * (1 << 30)
    assert abs(diff - (dropped - rp.nbytes())) < 1e-3


def test_ring_too_short_for_the_drafts_is_refused_with_the_fix(sg):
    with pytest.raises(ValueError, match=r"T=5 exceeds the ring length L=4: raise --linear-replayssm-cache-len to at least 5"):
        spec_pool(sg, "gdn", T_=5)


# --- the request stream -------------------------------------------------------------------------

class Stream:
    """A batch of live requests driven through the patched backends, with the float64
    conventional state of every slot on the accepted stream."""

    def __init__(self, sg, kind, monkeypatch, *, extra_buffer=False, lower_bound=None, seed=0):
        from sglang.kernels.ops.mamba import mamba_state_scatter_triton as scatter
        from sglang.srt.layers.attention.linear import gdn_backend, kda_backend

        self.kind = kind
        self.Hk = H if kind == "gdn" else HV
        self.gen = torch.Generator().manual_seed(seed)
        self.rtp = spec_pool(sg, kind, extra_buffer=extra_buffer, mamba_size=10)
        self.mp = self.rtp.mamba_pool
        self.rp = self.mp.replayssm_pool
        mod, cls = (gdn_backend, gdn_backend.GDNAttnBackend) if kind == "gdn" else (kda_backend, kda_backend.KDAAttnBackend)
        monkeypatch.setattr(mod, "causal_conv1d_update", self._conv)
        monkeypatch.setattr(scatter, "fused_conv_window_scatter_with_mask", self._conv_scatter)
        self.scatters = []
        be = object.__new__(cls)
        be.req_to_token_pool = self.rtp
        be.enable_unified_memory = False
        be.verify_intermediate_state_indices = torch.arange(8, dtype=torch.int32)
        self.backend = be
        self.layers = {}
        for lid in self.rtp.mamba_map:
            _, _, _, A_log, dt_bias = ref.random_decode_inputs(kind, 1, self.Hk, HV, K, V, generator=self.gen)
            self.layers[lid] = SimpleNamespace(
                layer_id=lid, A_log=A_log, dt_bias=dt_bias, head_k_dim=K, head_q_dim=K, head_v_dim=V,
                num_v_heads=HV, num_k_heads=self.Hk, num_q_heads=self.Hk, q_dim=self.Hk * K, k_dim=self.Hk * K,
                v_dim=HV * V, conv_weights=None, bias=None, activation="silu", lower_bound=lower_bound)
        self.lower_bound = lower_bound
        self.temporal = self.mp.mamba_cache.temporal
        self.ref = self.temporal.to(F64).clone()
        self.row = {}  # live slot -> request row (the ring row)

    def rows(self, slots, pad=0):
        return torch.tensor([self.row[x] for x in slots] + [0] * pad, dtype=torch.int64)

    # conv is not ours: identity, and the per-draft windows get fresh random values
    def _conv(self, x, conv_state, *a, intermediate_conv_window=None, intermediate_state_indices=None, **k):
        if intermediate_conv_window is not None:
            B = x.shape[0]
            w = intermediate_conv_window[intermediate_state_indices[:B].long()]
            intermediate_conv_window[intermediate_state_indices[:B].long()] = torch.randn(
                w.shape, generator=self.gen).to(w.dtype)
        return x

    def _conv_scatter(self, dst, src, dst_idx, steps):  # SGLang's CUDA-only kernel, in torch
        self.scatters.append((dst_idx.clone(), steps.clone()))
        for i in range(steps.shape[0]):
            if int(steps[i]) >= 0 and int(dst_idx[i]) >= 0:
                dst[:, int(dst_idx[i])] = src[:, i, int(steps[i])]

    def admit(self, n):
        reqs = [new_req(i) for i in range(n)]
        self.rtp.alloc(reqs)
        slots = [int(r.mamba_pool_idx) for r in reqs]
        self.row.update({int(r.mamba_pool_idx): int(r.req_pool_idx) for r in reqs})
        assert all(s != self.row[s] for s in slots), "slots must differ from the ring rows"
        for s in slots:
            st = torch.randn(self.temporal.shape[0], HV, V, K, generator=self.gen) * 0.3
            self.temporal[:, s] = st.to(self.temporal.dtype)
            self.ref[:, s] = self.temporal[:, s].to(F64)
        return reqs, slots

    def _metadata(self, idx, track=None):
        from sglang.srt.layers.attention.mamba.mamba2_metadata import ForwardMetadata

        return ForwardMetadata(query_start_loc=None, mamba_cache_indices=idx, mamba_track_indices=track)

    def decode(self, slots, seq_lens):
        """One plain decode step (T = 1) through the patched forward_decode."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        idx = torch.tensor(slots, dtype=torch.int32)
        B = len(slots)
        self.backend.forward_metadata = self._metadata(idx)
        fb = SimpleNamespace(seq_lens=torch.tensor(seq_lens), mamba_track_mask=None,
                             batch_size=B, forward_mode=ForwardMode.DECODE, req_pool_indices=self.rows(slots))
        for lid, layer in self.layers.items():
            li = self.rtp.mamba_map[lid]
            mixed, a, b, _, _ = ref.random_decode_inputs(self.kind, B, self.Hk, HV, K, V, generator=self.gen)
            out = self.backend.forward_decode(layer, fb, mixed, a, b)
            x = ref.unpack(self.kind, mixed, a, b, layer.A_log, layer.dt_bias, H=self.Hk, HV=HV, K=K, V=V,
                           lower_bound=self.lower_bound)
            o_ref = ref.conventional_step(self.ref[li], x, idx)
            assert rms_ratio(out[0].to(F64), o_ref) < TOL

    def verify(self, slots, accepted, *, track=None, steps_to_track=None, pad=0, via_worker=False):
        """One target-verify step of T drafts per row through the patched forward_extend, then the
        patched commit with ``accepted`` drafts kept per row (bonus included). ``pad`` padded rows
        (slot -1, CUDA-graph padding) ride along. Returns the float64 draft states [layers][B][T]."""
        from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        B = len(slots)
        idx = torch.tensor(list(slots) + [-1] * pad, dtype=torch.int32)
        Bp = B + pad
        self.backend.forward_metadata = self._metadata(idx, track)
        fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY,
                             spec_info=SimpleNamespace(draft_token_num=T, ragged_verify_layout=None),
                             req_pool_indices=self.rows(slots, pad))
        drafts = {}
        for lid, layer in self.layers.items():
            li = self.rtp.mamba_map[lid]
            mixed, a, b, _, _ = ref.random_decode_inputs(self.kind, Bp * T, self.Hk, HV, K, V, generator=self.gen)
            out = self.backend.forward_extend(layer, fb, mixed, a, b)
            assert out.shape == (1, Bp * T, HV, V)
            o = out[0].reshape(Bp, T, HV, V).to(F64)
            assert torch.isfinite(o).all()
            assert (o[B:] == 0).all(), "padded rows get zero output"
            # conventional verify from the committed state of each row: T snapshots
            st = self.ref[li].clone()
            drafts[li] = []
            for t in range(T):
                rows = [r * T + t for r in range(B)]
                x = ref.unpack(self.kind, mixed[rows], a[rows], b[rows], layer.A_log, layer.dt_bias, H=self.Hk,
                               HV=HV, K=K, V=V, lower_bound=self.lower_bound)
                o_ref = ref.conventional_step(st, x, idx[:B])
                assert rms_ratio(o[:B, t], o_ref) < TOL, f"draft {t}"
                drafts[li].append(st.clone())
        before = self.temporal.clone()
        live_before = before[:, idx[:B].long()].clone()
        fake = SimpleNamespace(linear_attn_backend=self.backend)
        last = torch.tensor(list(accepted) + [-1] * pad, dtype=torch.int64) - torch.tensor([1] * B + [0] * pad)
        self.scatters.clear()
        if via_worker:
            # the speculative workers' entry: spec_utils.commit_mamba_states_after_verify with
            # SGLang's accept_lens/accept_index (chain: accept_index[r, j] = r*T + j); upstream's
            # own ReplaySSM branches there must stay inert under our flag
            from sglang.srt.speculative import spec_utils

            assert len(slots) == len(idx), "the worker's batch has no padded rows"
            mp = pytest.MonkeyPatch()
            mp.setattr(spec_utils, "mambaish_config", lambda cfg: object())
            try:
                backend = SimpleNamespace(update_mamba_state_after_mtp_verify=(
                    lambda **kw: HybridLinearAttnBackend.update_mamba_state_after_mtp_verify(fake, **kw)))
                worker = SimpleNamespace(model_runner=SimpleNamespace(
                    model_config=None, req_to_token_pool=self.rtp, attn_backend=backend, model=None))
                acc = torch.tensor(accepted, dtype=torch.int32)
                j = torch.arange(T)
                accept_index = torch.where(j[None, :] < acc[:, None], torch.arange(B)[:, None] * T + j[None, :], -1)
                batch = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY, mamba_track_indices=None,
                                        seq_lens=torch.tensor([64] * B), req_pool_indices=self.rows(slots))
                spec_utils.commit_mamba_states_after_verify(worker, batch, acc, accept_index, T)
            finally:
                mp.undo()
        else:
            HybridLinearAttnBackend.update_mamba_state_after_mtp_verify(
                fake, last_correct_step_indices=last, mamba_track_indices=track,
                mamba_steps_to_track=steps_to_track, model=None, req_pool_indices=self.rows(slots, pad))
        # the commit never writes a live checkpoint (only track slots, if any)
        assert torch.equal(self.temporal[:, idx[:B].long()], live_before)
        # SGLang's conv rollback ran on the state slots (and the track slots when tracking)
        assert torch.equal(self.scatters[0][0], idx) and torch.equal(self.scatters[0][1], last)
        for r, s in enumerate(slots):
            for li in drafts:
                self.ref[li, s] = drafts[li][accepted[r] - 1][s]
            w = self.mp.mamba_cache.intermediate_conv_window[0][:, r, accepted[r] - 1]
            assert torch.equal(self.mp.mamba_cache.conv[0][:, s], w)
        return drafts

    def exact_state(self, slot):
        """The state the ring holds for ``slot`` (checkpoint + committed records), all layers,
        computed without touching the ring."""
        s, r = torch.tensor([slot]), torch.tensor([self.row[slot]])
        return torch.stack([self.rp._state_after(self.temporal, li, s, self.rp.h[li, r], r)[0]
                            for li in range(self.rp.num_layers)])

    def check_committed(self, slots):
        for s in slots:
            assert len(set(self.rp.h[:, self.row[s]].tolist())) == 1, "all layers hold the same h"
            assert rms_ratio(self.exact_state(s).to(F64), self.ref[:, s]) < TOL, f"slot {s}"


@pytest.mark.parametrize("kind,lower_bound", [("gdn", None), ("kda", None), ("kda", -5.0)])
def test_verify_and_decode_steps_mix_in_one_request(sg, kind, lower_bound, monkeypatch):
    """Random accept counts, verify steps and plain decode steps in any order (decode window L
    forced, so records carry across kinds of step); the pre-step fold and the decode flush both
    fire. Rejected drafts never reach the state: after every commit the ring's exact state equals
    the conventional state of the accepted stream, and the next step's outputs agree with it."""
    monkeypatch.setenv("REPLAYSSM_DECODE_WINDOW", str(L))
    s = Stream(sg, kind, monkeypatch, lower_bound=lower_bound, seed=1 + (lower_bound is not None))
    _, slots = s.admit(2)
    rng = torch.Generator().manual_seed(7)
    seq = [5, 9]
    kinds = ["verify", "verify", "decode", "verify", "decode", "decode", "verify", "verify"]
    prefolds = full_decodes = 0
    for i, step in enumerate(kinds):
        h = s.rp.h[0, s.rows(slots)].clone()
        if step == "decode":
            full_decodes += int((h == L).sum())  # a decode that must fold first (only after a verify)
            seq = [x + 1 for x in seq]
            s.decode(slots, seq)
        else:
            acc = [int(torch.randint(1, T + 1, (1,), generator=rng)) for _ in slots]
            if i == 0:
                acc = [T, 1]  # all accepted, all rejected (bonus only)
            if i == 1:
                acc = [1, T]  # row 1: h 1 -> 4 = L, so the next decode starts from a full ring
            prefolds += int(((h + T) > L).sum())
            s.verify(slots, acc, pad=1 if i % 2 else 0, via_worker=(i % 2 == 0 and i > 0))
            seq = [x + a for x, a in zip(seq, acc)]
        s.check_committed(slots)
    assert prefolds >= 2, "the pre-step fold must fire in this sequence"
    assert full_decodes >= 1, "a decode step must start from h == L in this sequence"
    # finish (no_buffer) / retraction backup: the fold makes the checkpoint itself exact
    from replayssm_sglang.sglang_hooks import pool as P

    P.fold_requests(s.rtp, torch.tensor(slots), s.rows(slots))
    for x in slots:
        assert rms_ratio(s.temporal[:, x].to(F64), s.ref[:, x]) < TOL
        assert s.rp.h[:, s.row[x]].tolist() == [0, 0]


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_boundary_inside_an_accepted_run_goes_exactly_to_the_track_slot(sg, kind, monkeypatch):
    """extra_buffer under verify (issue 6): SGLang's commit names, per row, the draft whose state
    belongs to the radix block boundary crossed inside the accepted run (mamba_steps_to_track) and
    the track slot; the commit writes exactly that state there (the pre-step fold of this step
    included), and leaves the live checkpoint, records and h as a plain commit would. Rows without a
    crossing (-1) leave their track slot alone."""
    s = Stream(sg, kind, monkeypatch, extra_buffer=True, seed=3)
    reqs, slots = s.admit(2)
    s.verify(slots, [3, 2])  # some committed records first
    s.verify(slots, [2, 1])  # pre-step fold for the first row (h 3 -> 0), then h = 2
    track = torch.tensor([int(r.mamba_ping_pong_track_buffer[r.mamba_next_track_idx]) for r in reqs])
    sentinel = torch.full_like(s.temporal[:, track[1]], 1e30)
    s.temporal[:, track[1]] = sentinel
    h_before = s.rp.h[0, s.rows(slots)].tolist()
    steps = torch.tensor([1, -1])  # row 0 crosses a boundary after its draft 1
    drafts = s.verify(slots, [3, 2], track=track, steps_to_track=steps)
    assert h_before[0] + T > L, "the boundary step also pre-folds"
    got = s.temporal[:, int(track[0])].to(F64)
    want = torch.stack([drafts[li][1][slots[0]] for li in sorted(drafts)])
    assert rms_ratio(got, want) < TOL
    assert torch.equal(s.temporal[:, int(track[1])], sentinel), "no crossing: track slot untouched"
    # SGLang's conv scatter into the track slots ran with its own indices
    assert torch.equal(s.scatters[1][0], track) and torch.equal(s.scatters[1][1], steps)
    s.check_committed(slots)
    s.verify(slots, [2, 1])  # and the stream goes on exact
    s.check_committed(slots)


def test_backend_setup_checks_the_resolved_draft_shape(sg):
    """decode.setup (MambaAttnBackendBase.__init__) re-checks the resolved speculative arguments:
    an EAGLE tree, or a draft count other than the ring's, is refused with the fix."""
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend
    from replayssm_sglang.sglang_hooks import decode

    rtp = spec_pool(sg, "gdn")
    be = object.__new__(GDNAttnBackend)
    be.req_to_token_pool = rtp

    def runner(**kw):
        base = dict(disable_radix_cache=True, speculative_algorithm="EAGLE", speculative_eagle_topk=1,
                    speculative_num_draft_tokens=T)
        base.update(kw)
        return SimpleNamespace(server_args=SimpleNamespace(**base))

    decode.setup(be, runner())
    with pytest.raises(ValueError, match=r"--speculative-eagle-topk 4 \(an EAGLE tree\)"):
        decode.setup(be, runner(speculative_eagle_topk=4))
    with pytest.raises(RuntimeError, match="sized for 3 draft tokens, the server verifies 2"):
        decode.setup(be, runner(speculative_num_draft_tokens=2))


def test_commit_without_request_rows_is_refused(sg, monkeypatch):
    """The ring is keyed by request row: a commit caller that passes no req_pool_indices (the DSPARK /
    DFLASH direct callers, refused at start-up anyway) gets an error, not a commit into wrong rows."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    s = Stream(sg, "gdn", monkeypatch)
    _, slots = s.admit(1)
    s.backend.forward_metadata = s._metadata(torch.tensor(slots, dtype=torch.int32))
    fake = SimpleNamespace(linear_attn_backend=s.backend)
    with pytest.raises(RuntimeError, match="needs the batch's request rows"):
        HybridLinearAttnBackend.update_mamba_state_after_mtp_verify(
            fake, last_correct_step_indices=torch.tensor([0]), mamba_track_indices=None,
            mamba_steps_to_track=None, model=None)


def test_ragged_verify_layout_is_refused(sg, monkeypatch):
    s = Stream(sg, "gdn", monkeypatch)
    _, slots = s.admit(1)
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    s.backend.forward_metadata = s._metadata(torch.tensor(slots, dtype=torch.int32))
    fb = SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY,
                         spec_info=SimpleNamespace(draft_token_num=T, ragged_verify_layout=object()))
    mixed, a, b, _, _ = ref.random_decode_inputs("gdn", T, H, HV, K, V)
    with pytest.raises(RuntimeError, match="SGLANG_RAGGED_VERIFY_MODE=static"):
        s.backend.forward_extend(s.layers[0], fb, mixed, a, b)

"""Prefix-cache hit rate on CPU against SGLang 0.5.17's real radix cache (issue 6).

What runs for real (SGLang's code, called, not copied): ``UnifiedRadixCache`` with the FULL and
MAMBA components, ``HybridReqToTokenPool`` / ``MambaPool`` / ``HybridLinearKVPool`` and the KV
allocator on ``device="cpu"``, ``Req.init_next_round_input`` (match with mamba copy-on-write and
the branching seqlen), ``alloc_for_extend`` / ``alloc_for_decode``, the extra_buffer prefill track
plan (``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``), the deferred COW/clear
(``ScheduleBatch._collect_deferred_mamba_cow_and_clear`` + ``ModelRunner._maybe_execute_deferred_
mamba_cow_and_clear``), the decode track indices (``set_mamba_track_indices_from_reqs``), the
result processor's ping-pong update (``SchedulerBatchResultProcessor._mamba_prefix_cache_update``),
``maybe_cache_unfinished_req`` after prefill and ``release_kv_cache`` at finish (which runs
``MambaComponent.prepare_for_caching_req``: extra_buffer donation, or no_buffer's ``n - write_pos``
cap), and upstream's decode cursor advance (``MambaAttnBackendBase._forward_metadata``).

What is simulated: the model. Each mamba slot's state is a tiny tensor in the real pool whose first
element records how many tokens are folded into that slot's checkpoint (``temporal[:, slot, 0, 0,
0]``). Prefill writes the exact count (the chunk kernel's states are exact at every position);
after a decode step the checkpoint holds ``seq_len - h`` tokens, h being the records the ring
still holds (docs/design.md's protocol; upstream calls it ``write_pos``). The ring is our backend's
own logic:
``ReplayPool.forced_mask`` -> ``sglang_hooks.flush.forced_flush_mask`` on the device seq_lens, and
``ring.decode_flushes`` / ``ring.h_after_decode`` on the ring's h (``ReplayPool.h``), with
``sglang_hooks.decode.before_extend`` resetting h on every extend. Upstream's arm uses upstream's
``write_pos`` cursor advanced by upstream's metadata code. The conventional arm writes every step.

Checks on every event: a decode-boundary snapshot (extra_buffer's track copy) is *exact* only when
the copied checkpoint holds exactly ``seq_len`` tokens; a prefix hit is *exact* only when the
copied-on-write state holds exactly the matched length. Inexact ones are counted (``stale_*``);
their tokens are not counted as hits (a hit on a stale state is a wrong answer, not a cache hit).
At the end every mamba value left in the tree is checked against its node depth.

SGLang is imported lazily (``_sg()``): importing this module does not import SGLang. The caller
must set ``TRITON_INTERPRET=1`` before SGLang is imported on a machine without a GPU.
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

import torch

from replayssm_sglang import ring as ringmod

ARMS = ("conventional", "upstream_no_buffer", "replayssm")
SEP_TOKEN = 271  # the "\n\n" between system prompt and question (one token in the model)


@dataclass
class SimConfig:
    # generated-shared-prefix workload (SGLang's bench option names, without the gsp_ prefix)
    num_groups: int = 8
    prompts_per_group: int = 32
    system_prompt_len: int = 2048
    question_len: int = 64
    output_len: int = 256
    num_turns: int = 1
    ordered: bool = False
    seed: int = 1
    # server
    page_size: int = 1
    mamba_track_interval: int = 256  # SGLang's --mamba-track-interval default
    linear_replayssm_cache_len: int = 16  # L
    kind: str = "gdn"
    max_concurrency: int = 48  # client concurrency (#37834: --max-concurrency 48)
    chunked_prefill_size: int = 8192
    disable_overlap_schedule: bool = False  # extra_buffer arms; no_buffer always runs without overlap
    # debugging switch: our arm without the device-side forced flush
    forced_flush: bool = True


@dataclass
class Turn:
    prompt: list[int]
    output: list[int]


@dataclass
class Conversation:
    cid: int
    group: int
    questions: list[list[int]]
    outputs: list[list[int]]
    system: list[int] = field(repr=False, default_factory=list)


def generate_workload(cfg: SimConfig) -> list[Conversation]:
    """SGLang's generated-shared-prefix shape in token ids: per group a random system prompt, per
    prompt a random question (system + SEP + question), shuffled unless ``ordered``; outputs are
    fixed random tokens (the same in every arm: exact states give identical greedy outputs).
    Multi-turn: turn t's prompt is everything before it plus SEP + a new question (a chat)."""
    rng = random.Random(cfg.seed)
    tok = lambda n: [rng.randrange(1000, 150000) for _ in range(n)]  # noqa: E731
    systems = [tok(cfg.system_prompt_len) for _ in range(cfg.num_groups)]
    convs = []
    for g in range(cfg.num_groups):
        for p in range(cfg.prompts_per_group):
            convs.append(Conversation(
                cid=len(convs), group=g, system=systems[g],
                questions=[tok(cfg.question_len) for _ in range(cfg.num_turns)],
                outputs=[tok(cfg.output_len) for _ in range(cfg.num_turns)]))
    if not cfg.ordered:
        rng.shuffle(convs)
    return convs


def turn_prompt(conv: Conversation, t: int) -> list[int]:
    out = list(conv.system)
    for i in range(t + 1):
        out += [SEP_TOKEN] + conv.questions[i]
        if i < t:
            out += conv.outputs[i]
    return out


# --- SGLang, lazily ---------------------------------------------------------------------------

_SG = None


def _sg() -> SimpleNamespace:
    global _SG
    if _SG is None:
        from sglang.srt.configs.mamba_utils import (KimiLinearCacheParams, KimiLinearStateShape, Mamba2CacheParams,
                                                    Mamba2StateDType, Mamba2StateShape)
        from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase
        from sglang.srt.managers.schedule_batch import Req, ScheduleBatch, set_mamba_track_indices_from_reqs
        from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
        from sglang.srt.mem_cache.allocation import alloc_for_decode, alloc_for_extend
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.common import maybe_cache_unfinished_req, release_kv_cache
        from sglang.srt.mem_cache.memory_pool import HybridLinearKVPool, HybridReqToTokenPool
        from sglang.srt.mem_cache.unified_cache.components.tree_component import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.model_runner import ModelRunner
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        _SG = SimpleNamespace(**{k: v for k, v in locals().items()})
    return _SG


# --- the shims through which SGLang's own methods are called ------------------------------------

class _TorchWithoutPinnedMemory:
    """``torch`` for one SGLang module whose ``torch.tensor(..., pin_memory=True)`` needs a CUDA
    driver: the same calls, unpinned (the host-to-device copy that pinning speeds up does not exist
    on a CPU-only machine)."""

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def tensor(*args, pin_memory=False, **kwargs):
        return torch.tensor(*args, **kwargs)


def _call_unpinned(module, fn, *args, **kwargs):
    saved = module.torch
    module.torch = _TorchWithoutPinnedMemory()
    try:
        return fn(*args, **kwargs)
    finally:
        module.torch = saved


class _Batch:
    """The fields of a ScheduleBatch that SGLang's allocation, track-plan and result-processing
    code reads; their methods are SGLang's (bound below), the driver is ours."""

    def __init__(self, reqs, arm: "_Arm"):
        sg = _sg()
        self.reqs = reqs
        self.req_to_token_pool = arm.rtp
        self.token_to_kv_pool_allocator = arm.alloc
        self.tree_cache = arm.cache
        self.device = "cpu"
        self.model_config = SimpleNamespace(is_encoder_decoder=False)
        self.spec_algorithm = sg.SpeculativeAlgorithm.NONE
        self.mamba_lazy_spec_track_positions_cpu = None

    def maybe_evict_swa(self):
        return None

    def is_dllm(self):
        return False


def _bind_sglang_methods():
    sg = _sg()
    _Batch._mamba_radix_cache_v2_req_prepare_for_extend = sg.ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend
    _Batch._collect_deferred_mamba_cow_and_clear = sg.ScheduleBatch._collect_deferred_mamba_cow_and_clear
    _ResultProcessor._mamba_prefix_cache_update = sg.SchedulerBatchResultProcessor._mamba_prefix_cache_update
    _ResultProcessor._mamba_check_track_boundary = sg.SchedulerBatchResultProcessor._mamba_check_track_boundary
    _ResultProcessor.mamba_lazy_post_decode_at_boundary = (
        sg.SchedulerBatchResultProcessor.mamba_lazy_post_decode_at_boundary)
    _Runner._maybe_execute_deferred_mamba_cow_and_clear = sg.ModelRunner._maybe_execute_deferred_mamba_cow_and_clear
    _UpstreamBackend._forward_metadata = sg.MambaAttnBackendBase._forward_metadata
    _UpstreamBackend._replayssm_track_flush_mask = sg.MambaAttnBackendBase._replayssm_track_flush_mask
    _UpstreamBackend._translate_mamba_indices = sg.MambaAttnBackendBase._translate_mamba_indices


class _ResultProcessor:
    pass


class _Runner:
    def __init__(self, rtp):
        self.req_to_token_pool = rtp
        self.is_draft_worker = False


class _UpstreamBackend:
    """Upstream's hybrid linear-attention backend, reduced to what its decode metadata reads
    (the ReplaySSM write_pos snapshot + advance and the GDN forced-flush mask)."""

    def __init__(self, rtp):
        self.req_to_token_pool = rtp
        self.device = "cpu"
        self.topk = 1


# --- one arm ------------------------------------------------------------------------------------

@dataclass
class ArmSpec:
    strategy: str  # "extra_buffer" | "no_buffer"
    ring: str  # "conventional" | "upstream" | "ours"


ARM_SPECS = {
    "conventional": ArmSpec("extra_buffer", "conventional"),
    "upstream_no_buffer": ArmSpec("no_buffer", "upstream"),
    "replayssm": ArmSpec("extra_buffer", "ours"),
}

# per-slot state: [layers, slots, HV, V, K]; the folded-token count lives at [..., 0, 0, 0]
_H, _HV, _K, _V = 1, 1, 16, 16


def _cache_params(kind: str):
    sg = _sg()
    dt = sg.Mamba2StateDType(conv=torch.float32, temporal=torch.float32)
    if kind == "gdn":
        shape = sg.Mamba2StateShape.create(tp_world_size=1, intermediate_size=_HV * _V, n_groups=_H, num_heads=_HV,
                                           head_dim=_V, state_size=_K, conv_kernel=4)
        return sg.Mamba2CacheParams(shape=shape, layers=[0], dtype=dt)
    if kind == "kda":
        shape = sg.KimiLinearStateShape.create(tp_world_size=1, num_heads=_HV, head_dim=_K, conv_kernel_size=4)
        return sg.KimiLinearCacheParams(shape=shape, layers=[0], dtype=dt)
    raise ValueError(f"kind must be 'gdn' or 'kda', got {kind!r}")


class _Arm:
    def __init__(self, name: str, cfg: SimConfig, max_seq: int, total_tokens: int, n_turn_reqs: int):
        sg = _sg()
        _bind_sglang_methods()
        self.name, self.cfg = name, cfg
        self.spec = ARM_SPECS[name]
        eb = self.spec.strategy == "extra_buffer"
        # SGLang refuses no_buffer with page_size > 1 (MambaComponent asserts page_size == 1)
        self.page_size = cfg.page_size if eb else 1
        overlap = eb and not cfg.disable_overlap_schedule  # no_buffer requires the overlap scheduler off
        self.overlap = overlap
        L = cfg.linear_replayssm_cache_len
        upstream = self.spec.ring == "upstream"
        sa = sg.ServerArgs(model_path="dummy", page_size=self.page_size, mamba_radix_cache_strategy=self.spec.strategy,
                           mamba_track_interval=cfg.mamba_track_interval, disable_overlap_schedule=not overlap,
                           attention_backend="torch_native", enable_linear_replayssm=upstream,
                           linear_replayssm_cache_len=L)
        # FLA chunk 64 or the page, as ServerArgs.mamba_cache_chunk_size derives it from the model
        sa._mamba_cache_chunk_size = max(64, self.page_size)
        sg.set_global_server_args_for_scheduler(sa)
        self.server_args = sa
        C = cfg.max_concurrency
        params = _cache_params(cfg.kind)
        self.mamba_size = 4 * n_turn_reqs + 4 * C + 16  # room for every state the tree keeps: no eviction
        self.rtp = sg.HybridReqToTokenPool(
            size=C + 4, mamba_size=self.mamba_size, mamba_spec_state_size=C + 4, max_context_len=max_seq + 16,
            device="cpu", enable_memory_saver=False, cache_params=params, mamba_layer_ids=[0],
            enable_mamba_extra_buffer=eb, enable_overlap_schedule=overlap, enable_linear_replayssm=upstream,
            linear_replayssm_cache_len=L)
        kv_size = total_tokens + (C + 4) * self.page_size * 4 + 1024
        kv_size = -(-kv_size // self.page_size) * self.page_size
        self.kv = sg.HybridLinearKVPool(size=kv_size, dtype=torch.bfloat16, page_size=self.page_size, head_num=1,
                                        head_dim=4, full_attention_layer_ids=[1], device="cpu",
                                        enable_memory_saver=False, mamba_pool=self.rtp.mamba_pool)
        if self.page_size == 1:
            self.alloc = sg.TokenToKVPoolAllocator(size=kv_size, dtype=torch.bfloat16, device="cpu", kvcache=self.kv,
                                                   need_sort=False)
        else:
            self.alloc = sg.PagedTokenToKVPoolAllocator(size=kv_size, page_size=self.page_size, dtype=torch.bfloat16,
                                                        device="cpu", kvcache=self.kv, need_sort=False)
        self.cache = sg.UnifiedRadixCache(params=sg.CacheInitParams(
            req_to_token_pool=self.rtp, token_to_kv_pool_allocator=self.alloc, page_size=self.page_size,
            disable=False, tree_components=(sg.ComponentType.FULL, sg.ComponentType.MAMBA),
            enable_mamba_extra_buffer=eb))
        self.temporal = self.rtp.mamba_pool.mamba_cache.temporal  # [1, slots+1, HV, V, K]
        self.L = L
        self.rp = None
        if self.spec.ring == "ours":
            from replayssm_sglang.sglang_hooks import decode as hook_decode
            from replayssm_sglang.sglang_hooks import pool as hook_pool

            self.rtp.mamba_pool.replayssm_pool = hook_pool.attach(self.rtp.mamba_pool, params, L,
                                                                  req_rows=self.rtp.req_to_token.shape[0])
            self.rp = self.rtp.mamba_pool.replayssm_pool
            # what MambaAttnBackendBase.__init__ does through patch 0003, on an (uninitialised)
            # instance of the backend class that serves this kind of layer
            if cfg.kind == "gdn":
                from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend as backend_cls
            else:
                from sglang.srt.layers.attention.linear.kda_backend import KDAAttnBackend as backend_cls
            backend = object.__new__(backend_cls)
            backend.req_to_token_pool = self.rtp
            hook_decode.setup(backend, SimpleNamespace(server_args=sa))
            if not cfg.forced_flush:
                self.rp.track_interval = None
        self.upstream_backend = _UpstreamBackend(self.rtp) if upstream else None
        self.runner = _Runner(self.rtp)
        self.results = _ResultProcessor()
        self.m = dict(prompt_tokens=0, reported_cached_tokens=0, cached_tokens=0, stale_hits=0,
                      stale_cached_tokens=0, requests=0, hits=0, track_snapshots=0, stale_snapshots=0,
                      checkpoint_writes=0, decode_steps=0, prefill_batches=0, decode_batches=0)
        self.per_turn = {}

    # --- state helpers (the simulated model) ---------------------------------------------------
    def _count(self, slots: torch.Tensor) -> torch.Tensor:
        return self.temporal[0, slots.long(), 0, 0, 0]

    def _write(self, slots: torch.Tensor, counts: torch.Tensor) -> None:
        self.temporal[:, slots.long(), 0, 0, 0] = counts.to(self.temporal.dtype)

    # --- prefill --------------------------------------------------------------------------------
    def _new_req(self, conv: Conversation, t: int):
        sg = _sg()
        from array import array

        prompt = turn_prompt(conv, t)
        sp = sg.SamplingParams(temperature=0, max_new_tokens=self.cfg.output_len, ignore_eos=True)
        sp.normalize(None)  # what the tokenizer manager does (no stop strings here)
        r = sg.Req(rid=f"{conv.cid}-{t}", origin_input_text="", origin_input_ids=array("q", prompt),
                   sampling_params=sp, vocab_size=151936)
        r._sim = SimpleNamespace(conv=conv, turn=t, out_pos=0)
        return r

    def prefill(self, reqs) -> None:
        sg = _sg()
        b = _Batch(reqs, self)
        b.prefix_lens = [len(r.prefix_indices) for r in reqs]
        b.extend_lens = [r.extend_range.length for r in reqs]
        b.extend_num_tokens = sum(b.extend_lens)
        seq = [r.extend_range.end for r in reqs]
        b.seq_lens = torch.tensor(seq, dtype=torch.int64)
        b.seq_lens_cpu = b.seq_lens.clone()
        sg.alloc_for_extend(b)
        for r, s in zip(reqs, seq):
            r.kv_committed_len = s
        eb = self.spec.strategy == "extra_buffer"
        tracks = [b._mamba_radix_cache_v2_req_prepare_for_extend(r) if eb else None for r in reqs]
        b._collect_deferred_mamba_cow_and_clear(reqs)
        fb = SimpleNamespace(forward_mode=sg.ForwardMode.EXTEND, mamba_clear_indices=b.mamba_clear_indices,
                             mamba_cow_src_indices=b.mamba_cow_src_indices,
                             mamba_cow_dst_indices=b.mamba_cow_dst_indices)
        self.runner._maybe_execute_deferred_mamba_cow_and_clear(fb)
        live = torch.stack([r.mamba_pool_idx for r in reqs]).to(torch.int64)
        if self.rp is not None:  # patch 0003's extend hook: prefill rows start with no records
            from replayssm_sglang.sglang_hooks import decode as hook_decode

            hook_decode.before_extend(SimpleNamespace(req_to_token_pool=self.rtp),
                                      SimpleNamespace(forward_mode=sg.ForwardMode.EXTEND,
                                                      req_pool_indices=torch.tensor([r.req_pool_idx for r in reqs])),
                                      live)
        # the forward: starts from the copied-on-write state, which must hold exactly the prefix
        start = self._count(live)
        for i, r in enumerate(reqs):
            pre = len(r.prefix_indices)
            if int(start[i].item()) != pre:
                self.m["stale_hits"] += 1
                self.m["stale_cached_tokens"] += pre
                self.m["cached_tokens"] -= pre
                self.per_turn[r._sim.turn]["cached_tokens"] -= pre
        self._write(live, torch.tensor(seq))  # prefill writes the exact state at the extend end
        for r, tr in zip(reqs, tracks):
            if tr is not None and tr.track_mask:  # the chunk kernel's state at the tracked position
                self._write(torch.tensor([tr.track_index]), torch.tensor([r.mamba_last_track_seqlen]))
        # results: first output token, then cache the prompt (or finish)
        for r in reqs:
            self._emit_token(r)
            r.update_finish_state()
            if r.finished():
                self._finish(r)
            else:
                sg.maybe_cache_unfinished_req(r, self.cache)
        self.m["prefill_batches"] += 1

    def _emit_token(self, r) -> None:
        s = r._sim
        r.output_ids.append(s.conv.outputs[s.turn][s.out_pos])
        s.out_pos += 1

    def _finish(self, r) -> None:
        _sg().release_kv_cache(r, self.cache)
        self.finished.append(r)

    # --- decode ---------------------------------------------------------------------------------
    def decode(self, reqs) -> None:
        sg = _sg()
        b = _Batch(reqs, self)
        b.req_pool_indices = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        b.seq_lens = torch.tensor([r.kv_committed_len for r in reqs], dtype=torch.int64)
        b.seq_lens_cpu = b.seq_lens.clone()
        sg.alloc_for_decode(b, token_per_req=1)
        for r in reqs:
            r.kv_committed_len += 1
        b.seq_lens = b.seq_lens + 1  # the device lengths (what the forward sees)
        b.seq_lens_cpu = b.seq_lens_cpu + 1
        eb = self.spec.strategy == "extra_buffer"
        if eb:
            import sglang.srt.managers.schedule_batch as sb

            _call_unpinned(sb, sg.set_mamba_track_indices_from_reqs, b)
            b.mamba_track_mask = b.seq_lens_cpu % self.cfg.mamba_track_interval == 0
        live = self.rtp.get_mamba_indices(b.req_pool_indices).to(torch.int64)
        seq = b.seq_lens
        # the forward. Ring protocol (docs/design.md): after the step the checkpoint holds every
        # token but the h records still in the ring, so it holds seq - h tokens.
        if self.spec.ring == "conventional":
            pending = torch.zeros_like(seq)  # the state is written every step
            wrote = torch.ones_like(seq, dtype=torch.bool)
        elif self.spec.ring == "upstream":
            fb = SimpleNamespace(batch_size=len(reqs), req_pool_indices=b.req_pool_indices, mamba_track_indices=None,
                                 mamba_track_mask=None, _original_batch_size=None,
                                 forward_mode=sg.ForwardMode.DECODE,
                                 seq_lens_cpu=None if self.overlap else b.seq_lens_cpu)
            self.upstream_backend._forward_metadata(fb)  # upstream: snapshot write_pos, advance it
            pending = self.rtp.mamba_pool.replayssm_write_pos[live].to(torch.int64)
            wrote = pending == 0
        else:
            rp = self.rp
            forced = rp.forced_mask(SimpleNamespace(), seq)  # device seq_lens, our flush module
            rows = b.req_pool_indices.to(torch.int64)  # the ring is keyed by request row
            h = rp.h[0, rows]
            wrote = ringmod.decode_flushes(h, self.L, forced)
            rp.h[:, rows] = ringmod.h_after_decode(h, self.L, forced)
            pending = rp.h[0, rows].to(torch.int64)
        self._write(live, seq - pending)
        self.m["checkpoint_writes"] += int(wrote.sum())
        if eb and bool(b.mamba_track_mask.any()):  # extra_buffer's track copy (after the last layer)
            m = b.mamba_track_mask
            src, dst = live[m], b.mamba_track_indices[m].to(torch.int64)
            self.temporal[:, dst] = self.temporal[:, src]
            got = self._count(dst).to(torch.int64)
            self.m["track_snapshots"] += int(m.sum())
            self.m["stale_snapshots"] += int((got != seq[m]).sum())
        # results
        for i, r in enumerate(reqs):
            self._emit_token(r)
            r.update_finish_state()
            self.results._mamba_prefix_cache_update(r, b, SimpleNamespace(num_correct_drafts_per_req_cpu=None), i)
            if r.finished():
                self._finish(r)
        self.m["decode_steps"] += len(reqs)
        self.m["decode_batches"] += 1

    # --- the loop -------------------------------------------------------------------------------
    def run(self, convs: list[Conversation]) -> dict:
        cfg = self.cfg
        t0 = time.perf_counter()
        pending = deque(convs)
        waiting: deque = deque()
        running: list = []
        active = 0
        self.finished = []
        while pending or waiting or running:
            while active < cfg.max_concurrency and pending:
                waiting.append(self._new_req(pending.popleft(), 0))
                active += 1
            # a prefill batch whenever requests wait (SGLang runs prefill before decode)
            batch, budget = [], cfg.chunked_prefill_size
            while waiting:
                r = waiting[0]
                r.init_next_round_input(self.cache)
                ext = len(r.origin_input_ids) - len(r.prefix_indices)
                if batch and ext > budget:
                    break
                if ext > cfg.chunked_prefill_size:
                    raise NotImplementedError(
                        f"a {ext}-token extend needs chunked prefill (not simulated): raise --chunked-prefill-size")
                waiting.popleft()
                r.set_extend_range(len(r.prefix_indices), len(r.origin_input_ids))
                self.cache.inc_lock_ref(r.last_node)  # PrefillAdder._req_inc_lock_ref
                r.skip_lock_node_ids = {}
                budget -= ext
                batch.append(r)
                pre = len(r.prefix_indices)
                self.m["requests"] += 1
                self.m["prompt_tokens"] += len(r.origin_input_ids)
                self.m["reported_cached_tokens"] += pre
                self.m["cached_tokens"] += pre
                self.m["hits"] += int(pre > 0)
                pt = self.per_turn.setdefault(r._sim.turn, dict(prompt_tokens=0, cached_tokens=0))
                pt["prompt_tokens"] += len(r.origin_input_ids)
                pt["cached_tokens"] += pre
            if batch:
                self.finished = []
                self.prefill(batch)
                running += [r for r in batch if not r.finished()]
            elif running:
                self.finished = []
                self.decode(running)
                running = [r for r in running if not r.finished()]
            for r in self.finished:
                s = r._sim
                if s.turn + 1 < cfg.num_turns:
                    waiting.append(self._new_req(s.conv, s.turn + 1))
                else:
                    active -= 1
        tree = self.check_tree()
        m = dict(self.m)
        m.update(tree)
        m["hit_rate"] = m["cached_tokens"] / max(1, m["prompt_tokens"])
        m["reported_hit_rate"] = m["reported_cached_tokens"] / max(1, m["prompt_tokens"])
        m["per_turn_hit_rate"] = {t: v["cached_tokens"] / max(1, v["prompt_tokens"]) for t, v in
                                  sorted(self.per_turn.items())}
        m["strategy"] = self.spec.strategy
        m["ring"] = self.spec.ring
        m["page_size"] = self.page_size
        m["overlap_schedule"] = self.overlap
        m["forced_flush"] = (self.rp.track_interval is not None) if self.rp is not None else None
        m["seconds"] = round(time.perf_counter() - t0, 2)
        return m

    def check_tree(self) -> dict:
        """Every mamba state the tree holds must hold exactly its node's depth in tokens."""
        sg = _sg()
        ct = sg.ComponentType.MAMBA
        root = self.cache.tree_core.root_node
        n = stale = 0
        stack = [(root, 0)]
        while stack:
            node, depth = stack.pop()
            for child in node.children.values():
                d = depth + len(child.key)
                v = child.component_data[ct].value
                if v is not None:
                    n += 1
                    stale += int(int(self._count(v.view(-1)[:1]).item()) != d)
                stack.append((child, d))
        return dict(tree_states=n, stale_tree_states=stale)


def run(cfg: SimConfig, arms=ARMS, log=None) -> dict:
    convs = generate_workload(cfg)
    prompts = [turn_prompt(c, t) for c in convs for t in range(cfg.num_turns)]
    max_seq = max(len(p) for p in prompts) + cfg.output_len
    total = sum(len(p) + cfg.output_len for p in prompts)
    out = {"config": asdict(cfg), "arms": {}}
    for name in arms:
        arm = _Arm(name, cfg, max_seq, total, len(prompts))
        out["arms"][name] = arm.run(convs)
        if log:
            log(f"{name}: hit_rate={out['arms'][name]['hit_rate']:.4f} ({out['arms'][name]['seconds']} s)")
    return out

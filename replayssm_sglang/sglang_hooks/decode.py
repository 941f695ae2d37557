"""Decode dispatch (patch 0003): the GDN and KDA backends hand their decode step to our kernel
when ``--enable-linear-replayssm`` is on, and an extend over decoding rows (``--enable-mixed-chunk``)
folds them first.

SGLang's own ReplaySSM decode ring stays in the tree but is never allocated while ours is
(patch 0002 turns its pool flag off), so its metadata code (cursor snapshot/advance, host-side
flush mask) is inert and the conventional CUDA-graph fast path for state indices stays on.
"""

from __future__ import annotations

from typing import Any

import torch

from replayssm_sglang.sglang_hooks import flush, pool


SERVED_BACKENDS = ("GDNAttnBackend", "KDAAttnBackend")


def setup(backend: Any, model_runner: Any) -> None:
    """``MambaAttnBackendBase.__init__``: refuse linear-attention layers our kernel does not serve
    (Mamba2, Lightning, short conv, NPU backends: the ring would be allocated and never driven), and
    tell our ring when to force flushes (the radix track interval under extra_buffer)."""
    rp = pool.of(getattr(backend, "req_to_token_pool", None))
    if rp is None:
        return
    names = {c.__name__ for c in type(backend).__mro__}
    if not names.intersection(SERVED_BACKENDS):
        raise RuntimeError(
            "--enable-linear-replayssm serves GDN (Qwen3-Next, Qwen3.5) and KDA (Kimi-Linear) "
            f"linear-attention layers; this model's layers run on {type(backend).__name__}. "
            "Fix: drop --enable-linear-replayssm for this model."
        )
    rp.track_interval = flush.track_interval_from_server_args(model_runner.server_args)
    from replayssm_sglang.sglang_hooks import verify

    verify.setup(rp, model_runner.server_args)


def enabled(backend: Any) -> bool:
    return pool.of(backend.req_to_token_pool) is not None


def forward_decode(backend: Any, layer: Any, forward_batch: Any, mixed_qkv: torch.Tensor, a: torch.Tensor,
                   b: torch.Tensor, ssm_states: torch.Tensor, cache_indices: torch.Tensor,
                   lower_bound: float | None = None) -> torch.Tensor:
    """One layer's decode with our ring; returns [1, B, HV, V] (SGLang's packed-decode layout)."""
    rtp = backend.req_to_token_pool
    rp = pool.of(rtp)
    layer_idx = rtp.mamba_map[layer.layer_id]
    forced = rp.forced_mask(backend.forward_metadata, forward_batch.seq_lens)
    return rp.decode(layer_idx=layer_idx, mixed_qkv=mixed_qkv, a=a, b=b, A_log=layer.A_log, dt_bias=layer.dt_bias,
                     scale=layer.head_k_dim ** -0.5, ssm_states=ssm_states, cache_indices=cache_indices,
                     forced=forced, num_v_heads=layer.num_v_heads, head_v_dim=layer.head_v_dim,
                     lower_bound=lower_bound, ring_idx=ring_rows(forward_batch, cache_indices))


def ring_rows(forward_batch: Any, cache_indices: torch.Tensor) -> torch.Tensor:
    """The ring row of each batch row: the request rows (``forward_batch.req_pool_indices``, a static
    buffer under CUDA graphs; padded rows hold SGLang's padding row 0 and slot -1, so they are skipped)."""
    rows = forward_batch.req_pool_indices
    n = cache_indices.shape[0]
    if rows is None or rows.shape[0] < n:
        raise RuntimeError("--enable-linear-replayssm: the ring is keyed by request row and this forward has "
                           f"no req_pool_indices for its {n} rows")
    return rows[:n]


def before_extend(backend: Any, forward_batch: Any, mamba_cache_indices: torch.Tensor) -> None:
    """Every non-decode forward, on the forward stream (so it is ordered after any in-flight
    decode of a slot's previous owner under the overlap scheduler):
    * a plain extend (prefill, chunked prefill): its rows start from the checkpoint prefill
      extends, with no records (h := 0);
    * ForwardMode.MIXED (--enable-mixed-chunk): decoding rows are read by the chunk kernel, so
      their records are folded into the checkpoint first; prefill rows (extending more than one
      token) are reset, so stale records of a request row's previous owner never reach their state.
    The ring rows are the request rows (``forward_batch.req_pool_indices``), the slots the checkpoints.
    A target-verify forward (speculative decoding, patch 0006) changes nothing here: its rows are
    decoding rows whose records the verify kernel reads.
    Padded rows (slot -1) map to SGLang's padding slot 0 and padding request row 0, which never
    holds records."""
    rp = pool.of(backend.req_to_token_pool)
    if rp is None:
        return
    slots = mamba_cache_indices.clamp(min=0)
    mode = forward_batch.forward_mode
    if mode.is_mixed():
        rows = ring_rows(forward_batch, slots).to(slots.device)
        rows = torch.where(mamba_cache_indices >= 0, rows, torch.zeros_like(rows))
        # rows extending more than one token are prefill chunks, and rows in their first forward since
        # allocation (``fresh``) are new requests: reset (a decoding row extends exactly one, and so may
        # a new request after a long prefix hit); the rest are folded
        ext = getattr(forward_batch, "extend_seq_lens", None)
        rp.first_extend_(rows, None if ext is None else ext.to(slots.device) > 1)
        pool.fold_requests(backend.req_to_token_pool, slots, rows)
    elif mode.is_extend() and not mode.is_target_verify():
        rows = ring_rows(forward_batch, slots).to(slots.device)
        rp.first_extend_(torch.where(mamba_cache_indices >= 0, rows, torch.zeros_like(rows)),
                         torch.ones_like(rows, dtype=torch.bool))

"""Forced flush at radix-cache block boundaries, decided on the device (issue 6).

SGLang's extra_buffer strategy snapshots a decoding request's mamba state into its track slot on
the decode step whose sequence length (this step's token included) is a multiple of
``mamba_track_interval`` (``ScheduleBatch.prepare_for_decode``: ``seq_lens % interval == 0``;
``interval % page_size == 0`` is asserted by SGLang, so page sizes > 1 land on the same steps).
The snapshot copies ``temporal[slot]`` after the last linear layer, so on exactly those steps our
kernel must write the checkpoint: the forced flag below.

It is computed from the device tensor ``forward_batch.seq_lens`` with elementwise ops only: no host
sync, no data-dependent shape, so it is valid inside a captured CUDA graph (where ``seq_lens`` is
the graph's static input buffer) and under the overlap scheduler (which has no host lengths for
the batch in flight). Padded CUDA-graph rows carry slot -1, which the kernel skips whatever their
flag says.
"""

from __future__ import annotations

import torch


def forced_flush_mask(seq_lens: torch.Tensor, interval: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """int32 [B]: 1 where this decode step completes a block of ``interval`` tokens.

    ``seq_lens`` [B] (any integer dtype, on the device) counts the tokens whose state the step
    produces (SGLang increments it before the decode forward). With ``out`` given the result is
    written in place (a static buffer for CUDA graphs)."""
    if interval < 1:
        raise ValueError(f"mamba track interval must be >= 1, got {interval}")
    m = torch.remainder(seq_lens, interval) == 0
    if out is None:
        return m.to(torch.int32)
    out.copy_(m)
    return out


def track_interval_from_server_args(server_args) -> int | None:
    """The interval to force flushes on, or None when nothing snapshots decode states: the radix
    cache is off, or the strategy is not extra_buffer (no_buffer keeps states only at prefill and
    finish, where patch 0004 folds)."""
    if getattr(server_args, "disable_radix_cache", False):
        return None
    eb = getattr(server_args, "enable_mamba_extra_buffer", None)
    eb = eb() if callable(eb) else eb
    if not eb:
        return None
    return int(server_args.mamba_track_interval)

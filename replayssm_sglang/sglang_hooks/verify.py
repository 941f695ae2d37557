"""Speculative verify in the ring (patch 0006): the GDN and KDA backends hand their target-verify
step to our verify kernel, and SGLang's post-acceptance commit moves the committed count instead of
copying a per-draft SSM snapshot.

Plain decode is the T = 1 case of the same protocol (docs/design.md, "The ring protocol"): the
records, the committed count h and the checkpoint are shared, so a request can move between plain
decode steps (patch 0003) and verify steps in any order.

Where SGLang 0.5.17 does what (speculative workers EAGLE/EAGLE3/NEXTN with topk 1):
- ``GDNAttnBackend.forward_extend`` / ``KDAAttnBackend._forward_target_verify`` (TARGET_VERIFY):
  SGLang's conv update runs as it is (it writes the per-draft conv windows,
  ``intermediate_conv_window``); then, instead of the recurrent verify that writes T SSM snapshots
  into ``intermediate_ssm``, ``forward_target_verify`` runs ``ring_prefold`` + ``ring_verify``:
  outputs only, the T draft records appended past h, h untouched, the checkpoint written only by
  the pre-step fold (h + T > L);
- ``HybridLinearAttnBackend.update_mamba_state_after_mtp_verify`` (called by
  ``spec_utils.commit_mamba_states_after_verify`` and by the direct callers): ``commit_after_verify``
  materializes the boundary state into the extra_buffer track slot if a radix block boundary falls
  inside the accepted run, then commits (h := verify_start(h) + accepted, bonus included) with one
  ``ring_commit_`` launch over all layers, then runs SGLang's own conv-window scatter (state slots
  and track slots) exactly as the conventional commit does.
Rejected drafts lie past h and are overwritten by the next step: they never reach any state.
"""

from __future__ import annotations

from typing import Any

import torch

from replayssm_sglang import ring as ringmod
from replayssm_sglang.sglang_hooks import pool


def setup(rp: "pool.ReplayPool", server_args: Any) -> None:
    """Backend start-up (``decode.setup``): the resolved speculative configuration must be a linear
    draft chain whose T fits the ring and matches the ring's size (raises naming the fix)."""
    alg = getattr(server_args, "speculative_algorithm", None)
    if alg in (None, "", "NONE", "none"):
        return
    T = ringmod.check_draft_shape(getattr(server_args, "speculative_eagle_topk", None),
                                  getattr(server_args, "speculative_num_draft_tokens", None), rp.layout.L)
    if rp.spec_T != T:
        raise RuntimeError(
            f"--enable-linear-replayssm: the mamba pool's ring was sized for {rp.spec_T} draft tokens, "
            f"the server verifies {T} (--speculative-num-draft-tokens): a fixed draft count is required"
        )


def forward_target_verify(backend: Any, layer: Any, forward_batch: Any, mixed_qkv: torch.Tensor, a: torch.Tensor,
                          b: torch.Tensor, ssm_states: torch.Tensor, cache_indices: torch.Tensor,
                          lower_bound: float | None = None) -> torch.Tensor:
    """One layer's target verify (after SGLang's conv update): mixed_qkv [B*T, 2*H*K + HV*V]
    post-conv, dense layout (T tokens per row). Returns [1, B*T, HV, V]."""
    spec = forward_batch.spec_info
    if getattr(spec, "ragged_verify_layout", None) is not None:
        raise RuntimeError(
            "--enable-linear-replayssm verifies dense draft windows (T tokens per row); this batch "
            "uses a ragged verify layout (SGLANG_RAGGED_VERIFY_MODE). Fix: "
            "SGLANG_RAGGED_VERIFY_MODE=static, or drop --enable-linear-replayssm."
        )
    if getattr(backend.forward_metadata, "retrieve_parent_token", None) is not None:
        raise RuntimeError(
            "--enable-linear-replayssm verifies linear draft chains only; this batch is an EAGLE "
            "tree (retrieve_parent_token set). Fix: --speculative-eagle-topk 1."
        )
    from replayssm_sglang.sglang_hooks.decode import ring_rows

    rtp = backend.req_to_token_pool
    rp = pool.of(rtp)
    T = int(spec.draft_token_num)
    B = mixed_qkv.shape[0] // T
    return rp.verify(layer_idx=rtp.mamba_map[layer.layer_id], mixed_qkv=mixed_qkv, a=a, b=b, A_log=layer.A_log,
                     dt_bias=layer.dt_bias, scale=layer.head_k_dim ** -0.5, ssm_states=ssm_states,
                     cache_indices=cache_indices, T=T, num_v_heads=layer.num_v_heads,
                     head_v_dim=layer.head_v_dim, lower_bound=lower_bound,
                     ring_idx=ring_rows(forward_batch, cache_indices[:B]))


def commit_after_verify(mamba_pool: Any, mamba_caches: Any, state_indices: torch.Tensor,
                        last_correct_step_indices: torch.Tensor, mamba_track_indices: torch.Tensor | None,
                        mamba_steps_to_track: torch.Tensor | None,
                        req_pool_indices: torch.Tensor | None = None) -> None:
    """SGLang's post-acceptance commit with our ring (replaces the SSM part of
    ``scatter_mamba_states_after_mtp_verify``; its conv part runs unchanged).

    ``last_correct_step_indices`` [B]: index of the last accepted draft of each row (chain: accepted
    count including the bonus token minus one; < 0 keeps nothing). ``mamba_steps_to_track`` [B]:
    the draft whose state SGLang snapshots into the track slot (-1: none). ``req_pool_indices`` [B]: the
    request rows of the batch (``spec_utils.commit_mamba_states_after_verify`` passes
    ``batch.req_pool_indices``): the ring rows whose h the commit moves."""
    from sglang.kernels.ops.mamba import mamba_state_scatter_triton as scatter

    rp = mamba_pool.replayssm_pool
    temporal = mamba_caches.temporal
    steps = last_correct_step_indices
    if req_pool_indices is None:
        raise RuntimeError(
            "--enable-linear-replayssm: the commit after verify needs the batch's request rows "
            "(req_pool_indices): the ring is keyed by request row. This caller does not pass them "
            "(only spec_utils.commit_mamba_states_after_verify, used by EAGLE/EAGLE3/NEXTN, does)."
        )
    B = state_indices.shape[0]
    ring_idx = req_pool_indices.to(state_indices.device).reshape(-1)[:B]
    if mamba_track_indices is not None:
        assert mamba_steps_to_track is not None
        rp.materialize_(temporal, state_indices, mamba_track_indices, mamba_steps_to_track, ring_idx=ring_idx)
    accepted = torch.clamp(steps.to(torch.int32) + 1, min=0)
    rp.commit_verify(state_indices, accepted, ring_idx=ring_idx)
    for conv, window in zip(mamba_caches.conv, mamba_caches.intermediate_conv_window):
        scatter.fused_conv_window_scatter_with_mask(conv, window, state_indices, steps)
    if mamba_track_indices is not None:
        for conv, window in zip(mamba_caches.conv, mamba_caches.intermediate_conv_window):
            scatter.fused_conv_window_scatter_with_mask(conv, window, mamba_track_indices, mamba_steps_to_track)

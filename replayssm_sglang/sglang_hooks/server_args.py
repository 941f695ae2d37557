"""Server-argument rules for `--enable-linear-replayssm` (called from SGLang's
``ServerArgs._handle_linear_attn_backend`` by patch 0001).

One owner for which flags combine with our backend. A combination is accepted only when our code
handles it and a test shows it (tests/test_integration_sglang.py); every other one is refused at
startup with a message that names the fix. docs/integration.md ("Refusals") explains each.

Accepted with the flag (this build): GDN and KDA models on the Triton decode backend; radix cache
on or off; mamba radix-cache strategy ``auto``/``extra_buffer``/``extra_buffer_lazy``/``no_buffer``
(no_buffer still needs SGLang's own ``--disable-overlap-schedule``); the overlap scheduler; CUDA
graphs; chunked prefill; ``--enable-mixed-chunk``; page size > 1; TP > 1 (the ring is sized
from the per-rank head counts).
"""

from __future__ import annotations

from typing import Any

_FIX_DROP = "or drop --enable-linear-replayssm"

# What this build's rules accept with --enable-linear-replayssm, for `replayssm-sglang doctor`.
# tests/test_integration_sglang.py checks each entry against validate() itself.
CAPABILITIES = {
    "extra_buffer": True,       # auto -> extra_buffer, with forced flushes at track boundaries
    "overlap_schedule": True,
    "cuda_graph": True,
    "spec_verify": False,       # the verify kernels exist (kernels/verify.py) but are not wired in
}


def _spec_on(args: Any) -> bool:
    alg = getattr(args, "speculative_algorithm", None)
    return alg not in (None, "", "NONE", "none")


def validate(args: Any, decode: str) -> bool:
    """Check the ReplaySSM flags on a ServerArgs being resolved.

    Returns True when this module has decided the ReplaySSM flags (SGLang then skips its own
    ReplaySSM checks), False when SGLang's own checks should run (our flag off).
    Raises ValueError naming the fix for every combination this build does not support.
    """
    if not args.enable_linear_replayssm:
        return False
    if getattr(args, "enable_linear_replayssm_spec", False):
        raise ValueError(
            "--enable-linear-replayssm and --enable-linear-replayssm-spec cannot be combined: "
            "--enable-linear-replayssm-spec selects upstream SGLang's separate spec-verify ring, while "
            "replayssm-sglang verifies drafts in the same ring as decode (not wired into SGLang in "
            "this build). Fix: pass only one of them (upstream's spec ring alone: drop "
            "--enable-linear-replayssm)."
        )
    if decode != "triton":
        raise ValueError(
            "--enable-linear-replayssm runs on the Triton linear-attention decode backend, got "
            f"--linear-attn-decode-backend={decode!r}: pass --linear-attn-decode-backend triton "
            f"{_FIX_DROP}."
        )
    if args.linear_replayssm_cache_len < 1:
        raise ValueError(
            f"--linear-replayssm-cache-len must be >= 1, got {args.linear_replayssm_cache_len}; "
            "16 is the default and a good choice."
        )
    if _spec_on(args):
        topk = getattr(args, "speculative_eagle_topk", None)
        tree = f" (and --speculative-eagle-topk {topk} is an EAGLE tree, which the ring will not support)" if topk not in (None, 1) else ""
        raise ValueError(
            "--enable-linear-replayssm does not support speculative decoding in this build "
            f"(got --speculative-algorithm={args.speculative_algorithm!r}){tree}: drafts are verified "
            "in the ring only once the verify path is wired. Fix: drop --speculative-algorithm, "
            f"{_FIX_DROP}."
        )
    if args.disaggregation_mode != "null":
        raise ValueError(
            "--enable-linear-replayssm is not supported under PD disaggregation "
            f"(--disaggregation-mode={args.disaggregation_mode!r}): the disaggregated decode pool "
            "(HybridMambaDecodeReqToTokenPool) allocates no ring and the state transfer does not "
            "fold it. Fix: drop --enable-linear-replayssm on both servers."
        )
    if getattr(args, "enable_unified_memory", False):
        raise ValueError(
            "--enable-linear-replayssm does not support --enable-unified-memory: the unified mamba "
            "pool allocates no ring (upstream turns ReplaySSM off there silently). Fix: drop "
            f"--enable-unified-memory {_FIX_DROP}."
        )
    if getattr(args, "enable_int8_mamba_checkpoint", False):
        raise ValueError(
            "--enable-linear-replayssm is not validated with --enable-int8-mamba-checkpoint (its "
            "copy-on-write bypasses MambaPool.copy_from). Fix: drop --enable-int8-mamba-checkpoint "
            f"{_FIX_DROP}."
        )
    if getattr(args, "enable_streaming_session", False):
        raise ValueError(
            "--enable-linear-replayssm does not support --enable-streaming-session: a streaming "
            "session keeps a finished turn's live slot without the radix-cache path that folds the "
            "ring. Fix: drop --enable-streaming-session "
            f"{_FIX_DROP}."
        )
    return True

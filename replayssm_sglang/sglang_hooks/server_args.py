"""Server-argument rules for `--enable-linear-replayssm` (called from SGLang's
``ServerArgs._handle_linear_attn_backend`` by patch 0001).

One owner for which flags combine with our backend. A combination is accepted only when our code
handles it and a test shows it (tests/test_integration_sglang.py); every other one is refused at
startup with a message that names the fix. docs/integration.md ("Refusals") explains each.

Accepted with the flag (this build): GDN and KDA models on the Triton decode backend; radix cache
on or off; mamba radix-cache strategy ``auto``/``extra_buffer``/``extra_buffer_lazy``/``no_buffer``
(no_buffer still needs SGLang's own ``--disable-overlap-schedule``); the overlap scheduler; CUDA
graphs; chunked prefill; ``--enable-mixed-chunk``; page size > 1; TP > 1 (the ring is sized
from the per-rank head counts); speculative decoding with a linear draft chain (EAGLE, EAGLE3,
NEXTN; topk 1; T <= L; fixed draft count; not with extra_buffer_lazy), verified in the same ring
as decode (patch 0006); ``--linear-replayssm-read-dtype`` ``same``/``bf16``/``fp8_e4m3`` (a
low-precision read copy of the state per slot; a non-``same`` value needs the flag).
"""

from __future__ import annotations

from typing import Any

_FIX_DROP = "or drop --enable-linear-replayssm"

# --linear-replayssm-read-dtype (patch 0001): the per-slot low-precision read copy of the state
# (same = none). Mirrors replayssm_sglang.precision.READ_DTYPES.
READ_DTYPES = ("same", "bf16", "fp8_e4m3")

# What this build's rules accept with --enable-linear-replayssm, for `replayssm-sglang doctor`.
# tests/test_integration_sglang.py checks each entry against validate() itself.
CAPABILITIES = {
    "extra_buffer": True,       # auto -> extra_buffer, with forced flushes at track boundaries
    "overlap_schedule": True,
    "cuda_graph": True,
    "spec_verify": True,        # linear draft chains (EAGLE/EAGLE3/NEXTN, topk 1) verified in the ring
    "read_copy": True,          # --linear-replayssm-read-dtype bf16/fp8_e4m3 (decode reads it; verify reads fp32)
}

# Speculative algorithms whose target verify and commit go through the hooked paths (patch 0006:
# GDN/KDA target verify, HybridLinearAttnBackend.update_mamba_state_after_mtp_verify) with dense
# draft windows of a fixed T. NGRAM drafts trees; DFLASH/DSPARK use ragged windows and their own
# commit paths; STANDALONE is untested here.
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")


def _spec_on(args: Any) -> bool:
    alg = getattr(args, "speculative_algorithm", None)
    return alg not in (None, "", "NONE", "none")


def _validate_spec(args: Any) -> None:
    from replayssm_sglang import ring

    alg = str(args.speculative_algorithm).upper()
    if alg not in SPEC_ALGORITHMS:
        raise ValueError(
            f"--enable-linear-replayssm verifies linear draft chains of EAGLE, EAGLE3 or NEXTN, got "
            f"--speculative-algorithm={args.speculative_algorithm!r}. Fix: use one of those with "
            f"--speculative-eagle-topk 1, {_FIX_DROP}."
        )
    # EAGLE trees (topk > 1) and T > L are refused by the ring's own rule, with the fix
    ring.check_draft_shape(getattr(args, "speculative_eagle_topk", None),
                           getattr(args, "speculative_num_draft_tokens", None) or 1,
                           args.linear_replayssm_cache_len)
    if getattr(args, "speculative_adaptive", False):
        raise ValueError(
            "--enable-linear-replayssm does not support --speculative-adaptive: the ring and the commit "
            "are sized for a fixed --speculative-num-draft-tokens. Fix: drop --speculative-adaptive "
            f"{_FIX_DROP}."
        )
    if getattr(args, "mamba_radix_cache_strategy", None) == "extra_buffer_lazy":
        raise ValueError(
            "--enable-linear-replayssm with speculative decoding is not validated with "
            "--mamba-radix-cache-strategy extra_buffer_lazy (its lazily prepared track slots). Fix: "
            f"--mamba-radix-cache-strategy extra_buffer (or auto), {_FIX_DROP}."
        )


def validate(args: Any, decode: str) -> bool:
    """Check the ReplaySSM flags on a ServerArgs being resolved.

    Returns True when this module has decided the ReplaySSM flags (SGLang then skips its own
    ReplaySSM checks), False when SGLang's own checks should run (our flag off).
    Raises ValueError naming the fix for every combination this build does not support.
    """
    read_dtype = getattr(args, "linear_replayssm_read_dtype", "same") or "same"
    if read_dtype not in READ_DTYPES:
        raise ValueError(
            f"--linear-replayssm-read-dtype must be one of {', '.join(READ_DTYPES)}, got {read_dtype!r}."
        )
    if not args.enable_linear_replayssm:
        if read_dtype != "same":
            raise ValueError(
                f"--linear-replayssm-read-dtype {read_dtype} needs --enable-linear-replayssm: the read "
                "copy lives in the ReplaySSM ring. Fix: add --enable-linear-replayssm, or drop "
                "--linear-replayssm-read-dtype (the default, same, keeps no copy)."
            )
        return False
    if getattr(args, "enable_linear_replayssm_spec", False):
        raise ValueError(
            "--enable-linear-replayssm and --enable-linear-replayssm-spec cannot be combined: "
            "--enable-linear-replayssm-spec selects upstream SGLang's separate spec-verify ring, while "
            "replayssm-sglang verifies drafts in the same ring as decode (--enable-linear-replayssm "
            "alone turns on both). Fix: drop --enable-linear-replayssm-spec (or, for upstream's spec "
            "ring, drop --enable-linear-replayssm)."
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
        _validate_spec(args)
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

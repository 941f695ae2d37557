"""Server-argument rules for `--enable-linear-replayssm` (called from SGLang's
``ServerArgs._handle_linear_attn_backend`` by patch 0001).

Today these are upstream 0.5.17's rules for its decode ring, with messages that name the fix
(upstream calls no_buffer "the default", but the default is ``auto``, which picks extra_buffer on
hybrid models). As our backend lands, the refusals it lifts are removed here, one owner for the
rules.
"""

from __future__ import annotations

from typing import Any


def validate(args: Any, decode: str) -> bool:
    """Check the ReplaySSM flags on a ServerArgs being resolved.

    Returns True when this module has decided the ReplaySSM flags (SGLang then skips its own
    ReplaySSM checks), False when SGLang's own checks should run (flag off, or the spec flag on).
    """
    if not args.enable_linear_replayssm or args.enable_linear_replayssm_spec:
        return False
    if decode != "triton":
        raise ValueError(
            "--enable-linear-replayssm runs on the Triton linear-attention decode backend, got "
            f"--linear-attn-decode-backend={decode!r}: pass --linear-attn-decode-backend triton "
            "or drop --enable-linear-replayssm."
        )
    from sglang.srt.arg_groups.overrides import mamba_extra_buffer_of, resolved_view

    if mamba_extra_buffer_of(resolved_view(args)):
        raise ValueError(
            "--enable-linear-replayssm does not support the extra_buffer mamba radix-cache strategy "
            f"in this build (got --mamba-radix-cache-strategy={args.mamba_radix_cache_strategy!r}; "
            "'auto' picks extra_buffer on hybrid models). Pass --mamba-radix-cache-strategy no_buffer "
            "--disable-overlap-schedule, or --disable-radix-cache. `replayssm-sglang doctor` reports "
            "which strategies this build supports."
        )
    if args.disaggregation_mode != "null":
        raise ValueError(
            "--enable-linear-replayssm is not supported under PD disaggregation "
            f"(--disaggregation-mode={args.disaggregation_mode!r}): the disaggregated decode pool "
            "holds no ReplaySSM ring. Drop --enable-linear-replayssm on this server."
        )
    if args.linear_replayssm_cache_len < 1:
        raise ValueError(
            f"--linear-replayssm-cache-len must be >= 1, got {args.linear_replayssm_cache_len}; "
            "16 is the default and a good choice."
        )
    return True

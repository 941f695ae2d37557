"""Our ReplaySSM ring inside SGLang's mamba pool: allocation, budget and the lifecycle hooks.

The ring is keyed by **request row** (SGLang's ``req_pool_idx``, docs/integration.md "Memory"): a
request's exact state is the checkpoint in its mamba slot (``req.mamba_pool_idx``) plus the
committed records of its ring row (``req.req_pool_idx``). Only running requests decode, so only
request rows own ring storage: ``rows`` = the request pool's rows (``max_running_requests + 1``,
row 0 being SGLang's padding row), not the mamba pool's slots (about 3x as many with the radix
cache: radix-node and track slots never decode). Every kernel launch takes the slot per batch row
(the checkpoint) and the ring row per batch row (``ring_idx`` = ``forward_batch.req_pool_indices``).

Patch 0002 calls ``attach`` at the end of ``MambaPool.__init__`` (flag on, spec flag off; the ring's
rows are the request pool's, checked by ``check_req_rows`` from ``HybridReqToTokenPool``), resets
the ring rows of requests entering prefill (``HybridReqToTokenPool.alloc``), folds a retracted
request's row into its slot before the CPU backup (``Req.offload_kv_cache``) and resets it after the
restore (``Req.load_kv_cache``); patch 0004 folds where the radix cache keeps a finished request's
live slot; patch 0003 runs ``ReplayPool.decode`` from the GDN/KDA decode paths and resets/folds the
rows of an extend batch on the forward stream; patch 0006 runs ``ReplayPool.verify`` from the
target-verify paths and ``materialize_`` / ``commit_verify`` from SGLang's post-acceptance commit
(sglang_hooks/verify.py).

Invariant: a ring row holds records only while its request is running; it is reset whenever a
request row is allocated (and again at the request's first extend, on the forward stream), and a
fold writes the records into the request's own slot. Slot-level events (copy-on-write, clearing,
track copies, donation to the radix tree, eviction) touch no ring row: a slot without a running
request has no records anywhere, so its checkpoint is its exact state.

The protocol (h, flush rule, record layout) is ring.py's; this module only owns *where* the ring
lives and *when* SGLang's slot lifecycle forces a fold or a reset:

* reset (h := 0, records forgotten): the slot's checkpoint is exact as it stands -- a freshly
  allocated slot (prefill writes the checkpoint), a copy-on-write destination, a slot loaded back
  from host memory;
* fold (checkpoint := state after the h committed records, h := 0): the slot's *live* state is
  about to be read by someone other than our decode kernel -- the radix cache keeping a finished
  request's slot, a CPU backup of a retracted request, an extend (mixed chunk) over a decoding
  row. A fold never loses an accepted update, and is the identity when h == 0.

Read copy (``--linear-replayssm-read-dtype bf16|fp8_e4m3``, issue 7): each layer's ring also holds a
low-precision copy ``rc`` of every slot's checkpoint (``rc_scale`` per V-row for fp8) and ``rc_valid``
(1 while ``rc == round(checkpoint)``). Only our kernels write ``rc`` (and set ``rc_valid``): a decode
flush and a verify pre-step fold write both copies from the same fold. Every other write of a checkpoint
-- SGLang's prefill, copies and restores, our glue's folds, ``materialize_``, a window-1 decode launch --
leaves ``rc`` stale, so each such path clears ``rc_valid`` for its slots (``invalidate_read_copy_``;
the window-1 launch in kernels/decode.py); the next decode step of such a row is then a forced flush
that reads the fp32 checkpoint and rewrites both copies, and a verify step reads the fp32 checkpoint
for it until its next pre-step fold.

No function here syncs with the host: everything is device tensor ops (safe to call from the
overlap scheduler's paths; the fold is not meant for CUDA-graph capture, it runs on lifecycle
paths only).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from replayssm_sglang import precision
from replayssm_sglang import ring as ringmod

_log = logging.getLogger(__name__)

READ_DTYPES = precision.READ_DTYPES
_READ_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}


def layer_kind(cache_params: Any) -> str:
    """'kda' or 'gdn' from SGLang's linear-state cache params (``is_kda`` property)."""
    return "kda" if bool(getattr(cache_params, "is_kda", False)) else "gdn"


def layout_from_cache_params(cache_params: Any, L: int, T_max: int = 1) -> ringmod.RingLayout:
    """One layer's RingLayout on this rank from SGLang's cache params (TP-sharded heads:
    ``shape.temporal`` is ``(HV/tp, V, K)`` and ``shape.num_k_heads_per_tp`` is H/tp)."""
    HV, V, K = (int(x) for x in cache_params.shape.temporal)
    kind = layer_kind(cache_params)
    H = int(getattr(cache_params.shape, "num_k_heads_per_tp", HV)) if kind == "gdn" else HV
    return ringmod.RingLayout.for_layer(kind, L=L, H=H, HV=HV, K=K, V=V, T_max=T_max)


def record_dtype_for(ssm_dtype: torch.dtype) -> torch.dtype:
    """Records are stored in the state's dtype (fp32 state -> fp32 records, so a fold is exact to
    fp32 rounding; a bf16 state keeps bf16 records, halving ring bytes)."""
    return ssm_dtype


def diag_perturb_(out: torch.Tensor, eps: float | None = None) -> torch.Tensor:
    """Diagnostics only (REPLAYSSM_DIAG_PERTURB=<eps>, unset in normal use): multiply a decode output by
    (1 + eps * p) in place, p a fixed +-1 pattern along the last dim. With the window forced to 1 (the
    conventional update, exactly) this is a control for end-to-end comparisons: it shows how far a
    perturbation of fp32-rounding size moves a model's greedy tokens and logprobs
    (scripts/gpu_e2e.py, arm ours_perturbed). No host sync, graph-capturable."""
    if eps is None:
        import os

        v = os.environ.get("REPLAYSSM_DIAG_PERTURB")
        if not v:
            return out
        eps = float(v)
    n = out.shape[-1]
    sign = 1.0 - 2.0 * (torch.arange(n, device=out.device) % 2).to(out.dtype)
    return out.mul_(1.0 + eps * sign)


def read_dtype_option() -> str:
    """``--linear-replayssm-read-dtype`` of the published server arguments (patch 0001 adds the field);
    ``same`` when no server arguments are published (a pool built outside a server, as in tests)."""
    try:
        from sglang.srt.runtime_context import get_exec

        mamba = get_exec().mamba
    except (ImportError, ValueError):  # ValueError: "config namespace 'exec' not published"
        return "same"
    return str(getattr(mamba, "linear_replayssm_read_dtype", "same") or "same")


def _check_read_dtype(read_dtype: str) -> str:
    if read_dtype not in READ_DTYPES:
        raise ValueError(f"--linear-replayssm-read-dtype must be one of {', '.join(READ_DTYPES)}, got {read_dtype!r}")
    return read_dtype


def effective_read_dtype(read_dtype: str, state_dtype: torch.dtype) -> str:
    """The read copy actually kept: none (``same``) when it would have the state's own dtype (a bf16
    copy of a bf16 checkpoint is the checkpoint; plan.py counts it the same way)."""
    if _check_read_dtype(read_dtype) != "same" and _READ_TORCH_DTYPES[read_dtype] == state_dtype:
        return "same"
    return read_dtype


def ring_bytes_per_row(cache_params: Any, L: int, num_layers: int | None = None, T_max: int = 1,
                       read_dtype: str = "same") -> int:
    """Bytes our ring adds per ring row (one per request row), over all linear layers of this rank.
    Patch 0005 charges it in SGLang's mamba memory budget per request row (``budget_mamba_slots``);
    with a read copy (``read_dtype`` bf16/fp8_e4m3) it includes the copy, its scales and ``rc_valid``."""
    lay = layout_from_cache_params(cache_params, L, T_max)
    n = len(cache_params.layers) if num_layers is None else int(num_layers)
    rec = record_dtype_for(cache_params.dtype.temporal)
    rc = 0
    if effective_read_dtype(read_dtype, cache_params.dtype.temporal) != "same":
        rc = precision.read_copy_bytes(lay.HV, lay.V, lay.K, read_dtype) + 4  # + rc_valid (int32)
    # per layer: records + h + arrive (int32 each) [+ read copy + scales + rc_valid] [+ KDA's ovf flags, int32 per
    # head and one per row]; per row: ``fresh``
    ovf = 4 * (lay.HV + 1) if lay.kind == "kda" else 0
    return n * (lay.cap * lay.record_bytes(rec) + 4 + 4 + rc + ovf) + 4


ring_bytes_per_slot = ring_bytes_per_row  # the name patch 0005 used while the ring was per slot


def budget_mamba_slots(mamba_budget_bytes: float, per_slot: int, ring_per_row: int, ratio: int,
                       max_reqs: int | None = None) -> int:
    """Patch 0005's joint solve with the ring charged per request row: the largest K (mamba slots,
    padding slot excluded) with ``(K + 1) * per_slot + (R + 1) * ring_per_row <= budget`` where R, the
    request rows SGLang can then admit, is ``K // ratio`` (``resolve_max_num_reqs`` caps the running
    requests at ``max_mamba_cache_size // ratio``), or ``max_reqs`` when that is smaller."""
    budget = int(mamba_budget_bytes)
    if ring_per_row <= 0:
        return (budget - per_slot) // per_slot
    # R = K // ratio <= K / ratio: solve the relaxed equation (a feasible K), then step to the largest
    K = int((budget - per_slot - ring_per_row) // (per_slot + ring_per_row / ratio))
    if max_reqs is not None:
        K = max(K, int((budget - per_slot - (max_reqs + 1) * ring_per_row) // per_slot))

    def cost(k: int) -> int:
        r = k // ratio if max_reqs is None else min(k // ratio, max_reqs)
        return (k + 1) * per_slot + (r + 1) * ring_per_row

    while K > 0 and cost(K) > budget:
        K -= 1
    while cost(K + 1) <= budget:  # the relaxed bound may sit a few slots below the largest K (floors)
        K += 1
    return K


def ring_rows_for(max_mamba_cache_size: int, ratio: int, max_reqs: int | None = None) -> int:
    """Request rows (padding row included) the budget charges the ring for: ``min(K // ratio, max_reqs) + 1``."""
    r = int(max_mamba_cache_size) // int(ratio)
    if max_reqs is not None:
        r = min(r, int(max_reqs))
    return r + 1


@dataclass
class ReplayPool:
    """Per linear layer one ring (ring.Ring views into stacked tensors), rows indexed by mamba slot.

    ``u/k/g`` are ``[layers, rows, ...]``; ``h`` and ``arrive`` are ``[layers, rows]`` int32 (each
    layer's kernel writes its own h; all layers hold the same value between steps, except after a threshold
    flush of predecayed KDA keys, which one layer takes alone).
    ``rows`` is the number of slots that own ring storage; a slot index >= rows has none (its h is
    0 by construction) -- today rows == the pool's slot count (see docs/integration.md, "Memory").

    With a read copy (``read_dtype`` bf16/fp8_e4m3): ``rc`` ``[layers, rows, HV, V, K]``, ``rc_scale``
    ``[layers, rows, HV, V]`` fp32 (fp8 only) and ``rc_valid`` ``[layers, rows]`` int32 (0: invalid,
    the state at allocation); all None without one.
    """

    layout: ringmod.RingLayout
    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    h: torch.Tensor
    arrive: torch.Tensor
    track_interval: int | None = None  # forced flush every this many tokens (None: never)
    spec_T: int | None = None  # draft tokens per verify step (None: speculative decoding off)
    dropped_intermediate_bytes: int = 0  # SGLang's per-draft SSM snapshots not allocated (spec on)
    rc: torch.Tensor | None = None  # read copy of the checkpoint (--linear-replayssm-read-dtype)
    rc_scale: torch.Tensor | None = None  # fp8: one fp32 scale per (layer, slot, head, V-row)
    rc_valid: torch.Tensor | None = None  # 1 while rc == round(checkpoint)
    # every ring index the lifecycle hooks pass has a row (attach: rows == the request pool's rows), so
    # an index never needs mapping to the padding row; False (the safe default) keeps the mapping
    covers_all_rows: bool = False
    # "request": ring row = SGLang request row (attach); every launch and fold names the ring rows.
    # "slot": ring row = state slot (a pool built directly, as in kernel tests): rows may be omitted.
    keyed_by: str = "slot"
    # [rows] int32: 1 from a request row's allocation (``admit_``) to its first extend forward
    # (``before_extend``), which then resets the row on the forward stream whatever the batch mode.
    # Under the overlap scheduler the previous owner's last (discarded) decode may still be in flight
    # when the row is allocated and bump h after the allocation-time reset; this flag survives that.
    fresh: torch.Tensor | None = None
    # KDA key records (ring.Ring.kda_keys): "predecayed" (k_j e^{-G_j}) where every kernel that reads this pool's
    # records supports it (decode v3 and w1, the glue's folds); "raw" otherwise (kda_keys_for). ovf [layers, rows,
    # HV + 1] int32: decode v3's threshold flags (per head: rebase; last column: row flush; 0 between launches), used
    # by predecayed pools; allocated for every KDA pool, so that the bytes patch 0005 charges per row
    # (ring_bytes_per_row) do not depend on the layout.
    kda_keys: str = "raw"
    ovf: torch.Tensor | None = None
    # split records (ring.Ring.u_lo, REPLAYSSM_SPLIT_RECORDS=1; session 51): u and k the bf16 high planes of fp32
    # records, u_lo and k_lo [layers, rows, ...] int16 their low halves; None: whole records
    u_lo: torch.Tensor | None = None
    k_lo: torch.Tensor | None = None

    @classmethod
    def allocate(cls, layout: ringmod.RingLayout, num_layers: int, rows: int, *, device,
                 record_dtype: torch.dtype = torch.float32, track_interval: int | None = None,
                 read_dtype: str = "same", kda_keys: str = "raw", split_records: bool = False) -> "ReplayPool":
        if kda_keys not in ringmod.KDA_KEYS or (kda_keys != "raw" and layout.kind != "kda"):
            raise ValueError(f"kda_keys {kda_keys!r}: 'raw', or 'predecayed' for a KDA layout")
        s = layout.shapes(rows)
        z = lambda shape, dt: torch.zeros((num_layers,) + tuple(shape), dtype=dt, device=device)  # noqa: E731
        lo = {}
        if split_records:
            record_dtype = ringmod.split_high_dtype(record_dtype)  # (the high planes; the low ones beside them)
            lo = dict(u_lo=z(s["u"], torch.int16), k_lo=z(s["k"], torch.int16))
        rc = rc_scale = rc_valid = None
        if _check_read_dtype(read_dtype) != "same":
            rc = z((rows, layout.HV, layout.V, layout.K), _READ_TORCH_DTYPES[read_dtype])
            if read_dtype == "fp8_e4m3":
                rc_scale = torch.ones((num_layers, rows, layout.HV, layout.V), dtype=torch.float32, device=device)
            rc_valid = z((rows,), torch.int32)  # invalid: every slot's first decode step flushes
        return cls(layout=layout, u=z(s["u"], record_dtype), k=z(s["k"], record_dtype),
                   g=z(s["g"], torch.float32), h=z(s["h"], torch.int32), arrive=z(s["arrive"], torch.int32),
                   track_interval=track_interval, rc=rc, rc_scale=rc_scale, rc_valid=rc_valid, kda_keys=kda_keys,
                   ovf=z((rows, layout.HV + 1), torch.int32) if layout.kind == "kda" else None, **lo)

    # --- shape facts ---------------------------------------------------------------------------
    @property
    def num_layers(self) -> int:
        return self.h.shape[0]

    @property
    def rows(self) -> int:
        return self.h.shape[1]

    @property
    def kind(self) -> str:
        return self.layout.kind

    @property
    def read_dtype(self) -> str:
        if self.rc is None:
            return "same"
        return "fp8_e4m3" if self.rc.dtype == torch.float8_e4m3fn else "bf16"

    def nbytes(self) -> int:
        ts = (self.u, self.k, self.g, self.h, self.arrive, self.rc, self.rc_scale, self.rc_valid, self.fresh,
              self.ovf, self.u_lo, self.k_lo)
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def ring(self, layer_idx: int) -> ringmod.Ring:
        i = int(layer_idx)
        pick = lambda t: None if t is None else t[i]  # noqa: E731
        return ringmod.Ring(layout=self.layout, u=self.u[i], k=self.k[i], g=self.g[i], h=self.h[i],
                            arrive=self.arrive[i], rc=pick(self.rc), rc_scale=pick(self.rc_scale),
                            rc_valid=pick(self.rc_valid), kda_keys=self.kda_keys,
                            ovf=pick(self.ovf) if self.kda_keys == "predecayed" else None,
                            u_lo=pick(self.u_lo), k_lo=pick(self.k_lo))

    # --- lifecycle -----------------------------------------------------------------------------
    def _rows_of(self, rows) -> torch.Tensor:
        """Ring rows as a long tensor on the ring's device; an index without ring storage maps to row 0
        (SGLang's padding row: never decoded, h always 0), so no host sync is needed to drop it.
        When every index has a row (``covers_all_rows``) that mapping is the identity and is skipped:
        these run on every extend batch (several lifecycle resets), so each launch saved counts."""
        s = torch.as_tensor(rows, device=self.h.device).reshape(-1).to(torch.long)
        if self.covers_all_rows:
            return s
        return torch.where(s < self.rows, s, torch.zeros_like(s))

    def _ring_idx(self, ring_idx, what: str):
        """The ring rows a launch uses: ``ring_idx`` as given; None is only valid for a slot-keyed pool."""
        if ring_idx is None and self.keyed_by == "request":
            raise RuntimeError(f"--enable-linear-replayssm: {what} on a ring keyed by request row needs the "
                               "request rows (forward_batch.req_pool_indices) as ring_idx")
        return ring_idx

    def invalidate_read_copy_(self, slots, layer_idx: int | None = None) -> None:
        """The checkpoints behind these ring rows were (or are about to be) written without their read
        copy: clear ``rc_valid`` in every layer (or in ``layer_idx`` only), so their next decode step is a
        forced flush. A no-op without a read copy. Device ops only (no host sync, graph-capturable);
        a row < 0 or without ring storage maps to SGLang's padding row 0, whose copy is never read
        by a real request (clearing it costs nothing). (The read copy lives with the ring: per ring row.)"""
        if self.rc_valid is None:
            return
        s = torch.as_tensor(slots, device=self.rc_valid.device).reshape(-1).to(torch.long)
        if s.numel() == 0:
            return
        s = torch.where((s >= 0) & (s < self.rows), s, torch.zeros_like(s))
        if layer_idx is None:
            self.rc_valid.index_fill_(1, s, 0)
        else:
            self.rc_valid[int(layer_idx)].index_fill_(0, s, 0)

    def reset_(self, slots) -> None:
        """Forget the records of these ring rows in every layer (their request's checkpoint is exact as it
        is, and was written by someone else: the read copy is invalidated too). Rows must be real (>= 0);
        for a request-keyed pool these are request rows (``req_pool_idx``)."""
        s = self._rows_of(slots)
        if s.numel():
            self.h.index_fill_(1, s, 0)  # one launch (h[:, s] = 0 is an index_put over a broadcast index)
            self.invalidate_read_copy_(s)

    def admit_(self, rows) -> None:
        """Request rows allocated to requests entering prefill (``HybridReqToTokenPool.alloc``): reset
        them and flag them fresh until their first extend forward (``before_extend``)."""
        r = self._rows_of(rows)
        if r.numel():
            self.reset_(r)
            if self.fresh is not None:
                self.fresh.index_fill_(0, r, 1)

    def first_extend_(self, rows, reset_mask: torch.Tensor | None = None) -> None:
        """An extend forward over request rows (``before_extend``, forward stream): reset the rows in
        ``reset_mask`` (None: all) and every row still flagged fresh, then clear the flag. Padded rows
        map to row 0. Device ops only."""
        r = self._rows_of(rows)
        if r.numel() == 0:
            return
        if self.fresh is not None:
            fresh = self.fresh.index_select(0, r) != 0
            reset_mask = fresh if reset_mask is None else (reset_mask.to(r.device) | fresh)
        if reset_mask is None:
            self.reset_(r)
        else:
            self.reset_(torch.where(reset_mask.to(r.device), r, torch.zeros_like(r)))
        if self.fresh is not None:
            self.fresh.index_fill_(0, r, 0)

    def _state_after(self, temporal: torch.Tensor, li: int, s: torch.Tensor, n: torch.Tensor,
                     r: torch.Tensor | None = None) -> torch.Tensor:
        """The exact state of slots ``s`` after the first ``n`` records (per row, 0 <= n <= cap) of ring
        rows ``r`` (None: ``s``) in layer ``li``: checkpoint decayed to record n-1 plus the rank-1 terms
        of records 0..n-1. Returned in float32 (float64 when the state is float64); nothing is written."""
        if r is None:
            r = s
        lay = self.layout
        acc = torch.float64 if temporal.dtype == torch.float64 else torch.float32
        grp = torch.arange(lay.HV, device=temporal.device) // (lay.HV // lay.HK)
        j = torch.arange(lay.cap, device=temporal.device)
        n = n.to(torch.long)
        valid = j[None, :] < n[:, None]  # [m, cap]
        G = self.g[li, r].to(acc)  # [m, HV, cap, GK]
        last = (n - 1).clamp(min=0)
        G_ref = torch.gather(G, 2, last.view(-1, 1, 1, 1).expand(-1, lay.HV, 1, lay.GK)).squeeze(2)
        G_ref = torch.where((n > 0).view(-1, 1, 1), G_ref, torch.zeros_like(G_ref))  # [m, HV, GK]
        kk = self._records(self.k, self.k_lo, li, r)[:, grp].to(acc)  # [m, HV, cap, K]
        if self.kda_keys == "predecayed":
            # the records hold k_j e^{-G_j}: decay them by e^{G_ref} alone, in two halves (decode_v3._pre_row)
            e_h = torch.exp(0.5 * G_ref)[:, :, None, :]
            kw = torch.where(valid[:, None, :, None], kk * e_h * e_h, torch.zeros((), dtype=acc, device=G.device))
        else:
            kw = kk * torch.where(valid[:, None, :, None], torch.exp(G_ref[:, :, None, :] - G), torch.zeros_like(G))
        uu = torch.where(valid[:, None, :, None], self._records(self.u, self.u_lo, li, r).to(acc),
                         torch.zeros((), dtype=acc, device=G.device))
        C = temporal[li, s].to(acc) * torch.exp(G_ref)[:, :, None, :]
        return C + torch.einsum("nhjv,nhjk->nhvk", uu, kw)

    @staticmethod
    def _records(hi: torch.Tensor, lo: torch.Tensor | None, li: int, r: torch.Tensor) -> torch.Tensor:
        """Records of ring rows r in layer li as the recurrence reads them: split records joined (exact fp32)."""
        return hi[li, r] if lo is None else ringmod.split_join(hi[li, r], lo[li, r])

    def fold_(self, temporal: torch.Tensor, slots, rows=None) -> None:
        """Fold every committed record of ring rows ``rows`` into the checkpoints of ``slots`` (pairwise:
        a request's row into its own slot), all layers, and set h := 0. ``temporal`` is SGLang's state
        pool ``[layers, slots, HV, V, K]``. Afterwards ``temporal[:, s]`` is the exact state after every
        token the request has decoded (the identity for h == 0). Computed in float32 (float64 when the
        state is float64). ``rows`` None: the ring row is the slot (slot-keyed pools only).
        The read copy of these rows is invalidated (also where h == 0: a fold precedes someone
        else reading -- and possibly writing -- the checkpoint)."""
        if rows is None and self.keyed_by == "request":
            raise RuntimeError("fold_ on a ring keyed by request row needs the request rows")
        s = torch.as_tensor(slots, device=self.h.device).reshape(-1).to(torch.long)
        r = self._rows_of(s if rows is None else rows)
        if rows is None:
            s = r
        if s.numel() != r.numel():
            raise ValueError(f"fold_: {s.numel()} slots but {r.numel()} ring rows")
        if s.numel() == 0:
            return
        self.invalidate_read_copy_(r)
        for li in range(self.num_layers):
            h = self.h[li, r].to(torch.long)  # [n]
            C = self._state_after(temporal, li, s, h, r)
            temporal[li, s] = torch.where((h > 0).view(-1, 1, 1, 1), C.to(temporal.dtype), temporal[li, s])
            self.h[li, r] = 0

    def _check_raw_keys(self, what: str) -> None:
        """The verify kernels read raw KDA key records only (kda_keys_for picks raw whenever a verify can run)."""
        if self.kda_keys != "raw":
            raise RuntimeError(f"--enable-linear-replayssm: {what} on a ring with predecayed KDA keys (the verify "
                               "kernels read raw keys; a pool for speculative decoding is allocated with raw keys)")

    # --- decode --------------------------------------------------------------------------------
    def forced_mask(self, forward_metadata: Any, seq_lens: torch.Tensor) -> torch.Tensor | None:
        """This forward's forced-flush flags, computed once per forward on the device and kept on
        the forward metadata so every layer uses one tensor. The cache is keyed on the seq_lens
        tensor and on whether a CUDA graph is being captured: warm-up runs before a capture reuse
        the capture's metadata object, and a mask computed eagerly there must not be baked into
        the graph as a constant (the first captured layer recomputes it inside the graph)."""
        if self.track_interval is None:
            return None
        capturing = bool(seq_lens.is_cuda and torch.cuda.is_current_stream_capturing())
        cached = getattr(forward_metadata, "_replayssm_forced", None)
        # the cache holds the seq_lens tensor itself (compared by identity), so its id cannot be
        # reused by another tensor while the entry lives
        if cached is not None and cached[0] is seq_lens and cached[1] == capturing:
            return cached[2]
        from replayssm_sglang.sglang_hooks.flush import forced_flush_mask

        ff = forced_flush_mask(seq_lens, self.track_interval)
        forward_metadata._replayssm_forced = (seq_lens, capturing, ff)
        return ff

    def decode(self, *, layer_idx: int, mixed_qkv, a, b, A_log, dt_bias, scale: float, ssm_states: torch.Tensor,
               cache_indices: torch.Tensor, forced: torch.Tensor | None, num_v_heads: int, head_v_dim: int,
               lower_bound: float | None = None, ring_idx: torch.Tensor | None = None) -> torch.Tensor:
        """One buffered decode step of one layer (our kernel); returns [1, B, HV, V] like SGLang's
        packed decode. ``ring_idx`` [B]: the ring row of each batch row (the request rows). Rows with
        cache index -1 (padding) get zeros and touch nothing."""
        ring_idx = self._ring_idx(ring_idx, "decode")
        from replayssm_sglang.kernels.decode import replay_decode

        B = mixed_qkv.shape[0]
        out = mixed_qkv.new_empty(B, 1, num_v_heads, head_v_dim)
        # L="auto": the small-batch policy (replayssm_sglang/policy.py) picks, per batch size, the
        # window measured not slower than conventional decode; every window keeps the ring exact,
        # so CUDA graphs of different batch sizes may use different windows.
        replay_decode(self.kind, mixed_qkv, a, b, A_log, dt_bias, ssm_states, self.ring(layer_idx),
                      cache_indices, out=out, forced=forced, scale=scale, lower_bound=lower_bound, L="auto",
                      ring_idx=ring_idx)
        diag_perturb_(out)  # no-op unless REPLAYSSM_DIAG_PERTURB is set (diagnostics)
        return out.transpose(0, 1)


    # --- speculative verify (T draft tokens per row, patch 0006) ------------------------------
    def verify(self, *, layer_idx: int, mixed_qkv, a, b, A_log, dt_bias, scale: float, ssm_states: torch.Tensor,
               cache_indices: torch.Tensor, T: int, num_v_heads: int, head_v_dim: int,
               lower_bound: float | None = None, ring_idx: torch.Tensor | None = None) -> torch.Tensor:
        """One layer's target verify of T drafts per row in the ring (kernels/verify.py): outputs of
        all T drafts from the checkpoint and the committed records; the T records are appended past
        h; h is not moved (``commit_verify`` does that after acceptance); the checkpoint is written
        only by the pre-step fold (h + T > L). Returns [1, B*T, HV, V]."""
        from replayssm_sglang.kernels.verify import ring_verify

        self._check_raw_keys("verify")
        if self.spec_T is None or int(T) != self.spec_T:
            raise RuntimeError(
                f"--enable-linear-replayssm: a verify step of {T} draft tokens reached a ring sized for "
                f"{self.spec_T} (--speculative-num-draft-tokens); the draft count must be fixed "
                "(adaptive speculative decoding is refused)"
            )
        ring_idx = self._ring_idx(ring_idx, "verify")
        N = mixed_qkv.shape[0]
        B = N // T
        out = ring_verify(mixed_qkv, a.reshape(N, -1), b.reshape(N, -1), A_log, dt_bias, ssm_states,
                          cache_indices[:B], self.ring(layer_idx), T, scale=scale, lower_bound=lower_bound,
                          ring_idx=None if ring_idx is None else ring_idx[:B])
        # the verify kernels keep the read copy themselves: a row that folds first writes both copies
        # (and sets its rc_valid), every other row reads the copy when it is current; nothing to clear
        return out.view(1, N, num_v_heads, head_v_dim)

    def materialize_(self, temporal: torch.Tensor, src_slots: torch.Tensor, dst_slots: torch.Tensor,
                     steps: torch.Tensor, ring_idx: torch.Tensor | None = None) -> None:
        """extra_buffer tracking under verify (issue 6): for rows with ``steps >= 0``, write into
        ``temporal[:, dst]`` the exact state of live slot ``src`` after draft ``steps`` of the verify
        step just run (records r[0 .. verify_start(h) + steps]); the live checkpoint, records and h
        are untouched. Call before ``commit_verify`` (it reads the pre-commit h). ``ring_idx`` [B]: the
        ring rows of the live requests (request-keyed pools).

        Exact (the fold's math on a prefix of the records), in one kernel launch over every row and
        layer (kernels/verify.py: ring_materialize_): no host sync, so it can sit in the overlap
        scheduler's path; rows without a boundary return at once."""
        from replayssm_sglang.kernels.verify import ring_materialize_

        self._check_raw_keys("materialize_")
        if self.u_lo is not None:
            raise RuntimeError("--enable-linear-replayssm: materialize_ (speculative decoding) on split records")

        ring_idx = self._ring_idx(ring_idx, "materialize_")
        T = self.spec_T
        dev = self.h.device
        src = src_slots.to(dev).reshape(-1).to(torch.int64)
        dst = dst_slots.to(dev).reshape(-1).to(torch.int64)
        st = steps.to(dev).reshape(-1).to(torch.int64)
        if src.numel() == 0:
            return
        ri = None if ring_idx is None else ring_idx.to(dev).reshape(-1).to(torch.int64)
        if self.keyed_by == "slot":
            # the track slots' checkpoints are written without their read copy (rows without one: slot -1);
            # keyed by request, a track slot has no ring row (and no read copy) to invalidate
            wrote = (st >= 0) & (src >= 0) & (dst >= 0)
            self.invalidate_read_copy_(torch.where(wrote, dst, torch.full_like(dst, -1)))
        ring_materialize_(temporal, self.u, self.k, self.g, self.h, self.layout, src, dst, st, T, ring_idx=ri)

    def commit_verify(self, state_indices: torch.Tensor, accepted: torch.Tensor,
                      ring_idx: torch.Tensor | None = None) -> None:
        """After acceptance: h := verify_start(h) + accepted in every layer (ring.commit_verify_'s
        rule, one launch of kernels/verify.ring_commit_ over all layers). ``accepted`` counts the
        kept drafts including the bonus token (0 for a row that keeps nothing); rows with slot -1 are
        untouched. Rejected records stay past h and are overwritten by the next step. No checkpoint is
        written here: the read copy keeps its validity (``verify`` already cleared it). ``ring_idx`` [B]:
        the ring rows of the rows (request-keyed pools); h is moved there."""
        from replayssm_sglang.kernels.decode import ring_rows
        from replayssm_sglang.kernels.verify import ring_commit_

        ring_idx = self._ring_idx(ring_idx, "commit_verify")
        T, L = self.spec_T, self.layout.L
        s = state_indices.to(self.h.device).reshape(-1).to(torch.int64)
        if ring_idx is not None:
            s = ring_rows(s, ring_idx.to(self.h.device).reshape(-1).to(torch.int64))
        s = torch.where(s < self.rows, s, torch.zeros_like(s))  # no ring storage: padding row 0
        off = torch.arange(self.num_layers, device=s.device, dtype=torch.int64)[:, None] * self.rows
        flat = torch.where(s[None, :] >= 0, s[None, :] + off, torch.full_like(s[None, :] + off, -1)).reshape(-1)
        acc = accepted.to(device=s.device, dtype=torch.int32).reshape(1, -1).expand(self.num_layers, -1).reshape(-1)
        ring_commit_(self.h.view(-1), flat.contiguous(), T, L, acc.contiguous())


def split_records_for(state_dtype: torch.dtype, spec_T: int | None) -> bool:
    """REPLAYSSM_SPLIT_RECORDS=1 (opt-in, session 51; unset or 0: whole records): the pool keeps its fp32 records
    split in two 16-bit planes (ring.Ring.u_lo: a plain step reads the bf16 high plane, a fold joins the exact fp32
    value), for the CUDA main and pre launches. Refused with the fix where it cannot run: a bf16 state (its records
    are bf16 already) or speculative decoding (the verify kernels read whole records)."""
    env = os.environ.get("REPLAYSSM_SPLIT_RECORDS", "").strip()
    if env not in ("", "0", "1"):
        raise ValueError(f"REPLAYSSM_SPLIT_RECORDS must be 0 or 1, got {env!r}")
    if env != "1":
        return False
    if state_dtype != torch.float32:
        raise ValueError(f"REPLAYSSM_SPLIT_RECORDS=1 splits fp32 records; this state is {state_dtype} (its records "
                         "are in its own type already): unset it")
    if spec_T:
        raise ValueError("REPLAYSSM_SPLIT_RECORDS=1 with speculative decoding: the verify kernels read whole records; "
                         "unset it")
    return True


def kda_keys_for(kind: str, spec_T: int | None) -> str:
    """The KDA key records a pool gets: "predecayed" (k_j e^{-G_j}: decode reads no per-(record, K) gate) for a KDA
    model without speculative decoding, "raw" with it (the verify kernels read raw keys) and for GDN.
    REPLAYSSM_KDA_KEYS=raw forces raw keys; =predecayed is refused where it cannot run. Measured on the H200
    (2026-11-30, docs/benchmarks.md, tiny Kimi-Linear at B = 256): 1.251x conventional end to end against 1.224x /
    1.229x with raw keys (other calls of the same session); kernel split 207.3 -> 196.6 us per layer-step."""
    env = os.environ.get("REPLAYSSM_KDA_KEYS", "").strip()
    if env and env not in ringmod.KDA_KEYS:
        raise ValueError(f"REPLAYSSM_KDA_KEYS must be one of {', '.join(ringmod.KDA_KEYS)}, got {env!r}")
    auto = "predecayed" if kind == "kda" and not spec_T else "raw"
    if env == "predecayed" and auto != "predecayed":
        raise ValueError("REPLAYSSM_KDA_KEYS=predecayed needs a KDA model without speculative decoding "
                         "(GDN has no per-K gates; the verify kernels read raw keys): unset it")
    return env or auto


def attach(mamba_pool: Any, cache_params: Any, L: int, *, req_rows: int, track_interval: int | None = None,
           spec_T: int | None = None, spec_state_size: int | None = None,
           read_dtype: str | None = None) -> ReplayPool:
    """Allocate our ring for ``mamba_pool`` (called at the end of ``MambaPool.__init__``), add its
    bytes to ``mamba_pool.mem_usage`` (GB), and return it (stored as ``mamba_pool.replayssm_pool``).

    ``req_rows``: the ring's rows, one per request row of SGLang's request pool (its size + the padding
    row 0; patch 0002 passes ``spec_state_size + 1``, the request pool size SGLang gives the mamba pool,
    and ``HybridReqToTokenPool`` checks it with ``check_req_rows``).

    With speculative decoding (``spec_T`` = draft tokens per verify step) the ring is sized for
    T <= L (ring.ring_capacity raises with the fix otherwise) and SGLang's per-draft SSM snapshots
    (``intermediate_ssm``, ``[layers, spec_state_size + 1, T, HV, V, K]``) are not allocated by
    patch 0002: their bytes are recorded as ``dropped_intermediate_bytes``.

    ``read_dtype`` (None: ``--linear-replayssm-read-dtype`` of the published server arguments, read
    here like the budget path of patch 0005 reads it) adds the read copy (bf16/fp8_e4m3)."""
    temporal = mamba_pool.mamba_cache.temporal
    layers, slots = int(temporal.shape[0]), int(temporal.shape[1])
    lay = layout_from_cache_params(cache_params, L, int(spec_T) if spec_T else 1)
    if tuple(temporal.shape[2:]) != (lay.HV, lay.V, lay.K):
        raise RuntimeError(
            f"--enable-linear-replayssm: the mamba state pool is {tuple(temporal.shape)}, expected "
            f"[layers, slots, HV={lay.HV}, V={lay.V}, K={lay.K}] (SGLang's GDN/KDA layout); this "
            "layout (page-major envelope, NPU/AMX transposes) is not supported: drop the flag"
        )
    if read_dtype is None:
        read_dtype = read_dtype_option()
    read_dtype = effective_read_dtype(read_dtype, temporal.dtype)
    if int(req_rows) < 1:
        raise ValueError(f"req_rows must be >= 1 (the request pool's rows), got {req_rows}")
    pool = ReplayPool.allocate(lay, layers, int(req_rows), device=temporal.device,
                               record_dtype=record_dtype_for(temporal.dtype), track_interval=track_interval,
                               read_dtype=read_dtype, kda_keys=kda_keys_for(lay.kind, spec_T),
                               split_records=split_records_for(temporal.dtype, spec_T))
    pool.keyed_by = "request"
    pool.covers_all_rows = True  # rows == the request pool's rows (padding row 0 included)
    pool.fresh = torch.zeros(int(req_rows), dtype=torch.int32, device=temporal.device)
    if spec_T:
        pool.spec_T = int(spec_T)
        per_draft = lay.HV * lay.V * lay.K * temporal.element_size()
        pool.dropped_intermediate_bytes = layers * (int(spec_state_size or 0) + 1) * int(spec_T) * per_draft
    if hasattr(mamba_pool, "mem_usage"):
        mamba_pool.mem_usage += pool.nbytes() / (1 << 30)
    _log.info("ReplaySSM ring: %s, %d linear layers x %d request rows, L=%d, records %s, read copy %s%s, %.2f GB",
              lay.kind.upper(), layers, int(req_rows), lay.L,
              "float32 split (bf16 + low halves)" if pool.u_lo is not None else str(pool.k.dtype).replace("torch.", ""),
              pool.read_dtype, f", KDA keys {pool.kda_keys}" if lay.kind == "kda" else "", pool.nbytes() / 1e9)
    _log.info("ReplaySSM decode main launch (the buffered window): %s", main_launch_note(pool, temporal))
    return pool


def main_launch_note(pool: "ReplayPool", temporal: torch.Tensor) -> str:
    """The decode step's main and pre launches this pool's layers take (kernels/cuda_main.py's preference_note and
    pre_preference_note)."""
    from replayssm_sglang.kernels import cuda_main

    lay = pool.layout
    try:
        ring0 = pool.ring(0)
        note = cuda_main.preference_note(lay.kind, temporal[0], ring0, lay.K, lay.V)
        pre = cuda_main.pre_preference_note(lay.kind, temporal[0], ring0, lay.K, ring0.layout.cap)
        return f"{note}; pre launch: {pre}"
    except Exception as e:  # (a note for the log: never a reason to fail the allocation)
        return f"unknown ({type(e).__name__}: {e})"


def of(obj: Any) -> ReplayPool | None:
    """Our ReplayPool behind a MambaPool or a HybridReqToTokenPool (None when the flag is off)."""
    mp = getattr(obj, "mamba_pool", obj)
    return getattr(mp, "replayssm_pool", None)


def check_req_rows(mamba_pool: Any, req_rows: int) -> None:
    """``HybridReqToTokenPool._init_mamba_pool``: the ring has exactly one row per request row."""
    rp = of(mamba_pool)
    if rp is not None and rp.rows != int(req_rows):
        raise RuntimeError(
            f"--enable-linear-replayssm: the ring has {rp.rows} rows but the request pool {req_rows}; the "
            "ring is keyed by request row (req_pool_idx), so the two must match"
        )


def fold_requests(pool_or_req_pool: Any, slots, rows) -> None:
    """Fold running requests: the records of ring rows ``rows`` (their ``req_pool_idx``) into their
    live slots ``slots`` (``mamba_pool_idx``), pairwise (any path that reads or keeps a live state)."""
    rp = of(pool_or_req_pool)
    if rp is None:
        return
    mp = getattr(pool_or_req_pool, "mamba_pool", pool_or_req_pool)
    rp.fold_(mp.mamba_cache.temporal, slots, rows)


def fold_req(pool_or_req_pool: Any, req: Any) -> None:
    """Fold one request (``req.mamba_pool_idx``, ``req.req_pool_idx``): the finish fold (patch 0004) and
    the retraction backup (patch 0002, ``Req.offload_kv_cache``)."""
    if of(pool_or_req_pool) is None or req.mamba_pool_idx is None or req.req_pool_idx is None:
        return
    fold_requests(pool_or_req_pool, torch.as_tensor(req.mamba_pool_idx).view(-1),
                  torch.as_tensor([int(req.req_pool_idx)]))


def reset_rows(pool_or_req_pool: Any, rows) -> None:
    """Forget the records of these request rows (a request row allocated, a state restored)."""
    rp = of(pool_or_req_pool)
    if rp is not None:
        rp.reset_(rows)

"""The ring protocol: one owner for L, T, the committed count h, the flush rule and commit.

Every kernel and every piece of SGLang glue asks this module; nothing else re-derives the rule.
See docs/design.md ("The ring protocol") for the prose version.

Per request slot and per linear-attention layer the ring holds:
  u      [slots, HV, cap, V]   the correction u_j of each record (computed once, on its own step)
  k      [slots, HK, cap, K]   the l2-normalised key of each record (HK = H for GDN: one key per
                               key head, shared by the HV/H value heads of its group; HK = HV for KDA)
  g      [slots, HV, cap, GK]  the cumulative log-decay since the checkpoint, including step j
                               (GK = 1 for GDN's scalar decay, GK = K for KDA's per-K decay)
  h      [slots] int32         records committed since the checkpoint was written
  arrive [slots] int32         kernel scratch, 0 between launches: the decode kernel's programs of a
                               row count their arrival here so that the last one writes h (no host
                               sync, no second launch); see kernels/decode.py

The checkpoint itself is SGLang's mamba state pool `[slots, HV, V, K]`; the ring never holds a state.

Ring rows and state slots: by default a launch uses the state slot index as the ring row (the ring
has a row per slot). The kernels and ``commit_verify_`` also take ``ring_idx`` [B], a ring row per
batch row next to its state slot, so the ring can be keyed by something smaller than the state pool
(SGLang: the request row ``req_pool_idx``, docs/integration.md "Memory"); the exact state of a
request is then its checkpoint (state slot) plus the committed records of its ring row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Kind = Literal["gdn", "kda"]


def ring_capacity(L: int, T_max: int = 1) -> int:
    """Records a slot must hold for window L and at most T_max tokens per step.

    The pre-step fold (``needs_prefold``) guarantees h + T <= L whenever a step appends without
    folding, and T <= L after a fold, so L records suffice as long as T_max <= L.
    """
    if L < 1:
        raise ValueError(f"ring length L must be >= 1, got {L}")
    if T_max < 1:
        raise ValueError(f"tokens per step T must be >= 1, got {T_max}")
    if T_max > L:
        raise ValueError(
            f"tokens per step T={T_max} exceeds the ring length L={L}: raise "
            f"--linear-replayssm-cache-len to at least {T_max}"
        )
    return L


@dataclass(frozen=True)
class RingLayout:
    """Shapes of one layer's ring. Build with ``RingLayout.for_layer``."""

    kind: Kind
    L: int
    T_max: int
    H: int
    HV: int
    K: int
    V: int

    @classmethod
    def for_layer(cls, kind: Kind, *, L: int, H: int, HV: int, K: int, V: int, T_max: int = 1) -> "RingLayout":
        if kind not in ("gdn", "kda"):
            raise ValueError(f"kind must be 'gdn' or 'kda', got {kind!r}")
        if HV % H:
            raise ValueError(f"HV={HV} must be a multiple of H={H}")
        if kind == "kda" and H != HV:
            raise ValueError(f"KDA has one key per value head: H={H} must equal HV={HV}")
        ring_capacity(L, T_max)
        return cls(kind, L, T_max, H, HV, K, V)

    @property
    def cap(self) -> int:
        return ring_capacity(self.L, self.T_max)

    @property
    def HK(self) -> int:
        return self.H if self.kind == "gdn" else self.HV

    @property
    def GK(self) -> int:
        return 1 if self.kind == "gdn" else self.K

    def shapes(self, slots: int) -> dict[str, tuple[int, ...]]:
        return {
            "u": (slots, self.HV, self.cap, self.V),
            "k": (slots, self.HK, self.cap, self.K),
            "g": (slots, self.HV, self.cap, self.GK),
            "h": (slots,),
            "arrive": (slots,),
        }

    def record_bytes(self, record_dtype: torch.dtype = torch.float32) -> int:
        """Bytes of one record (one token) of one slot in this layer."""
        e = torch.empty((), dtype=record_dtype).element_size()
        return e * (self.HV * self.V + self.HK * self.K) + 4 * self.HV * self.GK

    def bytes_per_slot(self, record_dtype: torch.dtype = torch.float32) -> int:
        return self.cap * self.record_bytes(record_dtype) + 4

    def allocate(self, slots: int, device="cpu", record_dtype: torch.dtype = torch.float32,
                 read_dtype: str = "same", kda_keys: str = "raw", split_records: bool = False) -> "Ring":
        """A ring for ``slots`` slots; ``read_dtype`` "bf16" or "fp8_e4m3" also allocates the read copy
        (invalid until written: every slot's first decode step then flushes). ``kda_keys`` (KDA only):
        "raw" (records hold k_j and G_j) or "predecayed" (records hold k_j e^{-G_j}; see ``Ring.kda_keys``).
        ``split_records``: fp32 records (record_dtype float32) kept as two 16-bit planes, u and k the bf16 high
        plane and u_lo, k_lo the low halves (see ``Ring.u_lo``; the CUDA main and pre launches only)."""
        if kda_keys not in KDA_KEYS:
            raise ValueError(f"kda_keys must be one of {KDA_KEYS}, got {kda_keys!r}")
        if kda_keys != "raw" and self.kind != "kda":
            raise ValueError("kda_keys='predecayed' is for KDA rings (GDN's decay is one scalar per head)")
        s = self.shapes(slots)
        u_lo = k_lo = None
        if split_records:
            record_dtype = split_high_dtype(record_dtype)
            u_lo = torch.zeros(s["u"], dtype=torch.int16, device=device)
            k_lo = torch.zeros(s["k"], dtype=torch.int16, device=device)
        rc = rc_scale = rc_valid = None
        if read_dtype != "same":
            rdt = {"bf16": torch.bfloat16, "fp8_e4m3": torch.float8_e4m3fn}.get(read_dtype)
            if rdt is None:
                raise ValueError(f"read_dtype must be 'same', 'bf16' or 'fp8_e4m3', got {read_dtype!r}")
            rc = torch.zeros(slots, self.HV, self.V, self.K, dtype=rdt, device=device)
            if read_dtype == "fp8_e4m3":
                rc_scale = torch.ones(slots, self.HV, self.V, dtype=torch.float32, device=device)
            rc_valid = torch.zeros(slots, dtype=torch.int32, device=device)
        return Ring(
            layout=self,
            u=torch.zeros(s["u"], dtype=record_dtype, device=device),
            k=torch.zeros(s["k"], dtype=record_dtype, device=device),
            g=torch.zeros(s["g"], dtype=torch.float32, device=device),
            h=torch.zeros(s["h"], dtype=torch.int32, device=device),
            arrive=torch.zeros(s["arrive"], dtype=torch.int32, device=device),
            rc=rc, rc_scale=rc_scale, rc_valid=rc_valid, kda_keys=kda_keys, u_lo=u_lo, k_lo=k_lo,
            ovf=(torch.zeros(slots, self.HV + 1, dtype=torch.int32, device=device) if kda_keys == "predecayed"
                 else None),
        )


KDA_KEYS = ("raw", "predecayed")
# predecayed KDA keys: the lowest cumulative log-decay G a ring record may carry (k_j e^{-G_j} <= e^{80} |k_j| ~
# 5.5e34, under fp32's 3.4e38 ~ e^{88.7}; readers apply e^{G_t} in two halves, e^{G_t/2} twice, so no product leaves
# fp32's range; the relative error of e^{-G_j} e^{G_t} against e^{G_t - G_j} is ~|G| log2(e) 2^-24, <= ~7e-6).
# A head one of whose channels would pass it is rebased alone (see Ring.kda_keys). How often: on the tiny Kimi-Linear
# model's own decode trajectories 60% of (layer, row, 16-step window) triples pass -80, 98% pass -60
# (benchmarks/results/gate-probe-kda-20261130-2153.json; docs/design.md, "Pre-decayed KDA keys").
PREDECAYED_MIN_G = -80.0


@dataclass
class Ring:
    layout: RingLayout
    u: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    h: torch.Tensor
    arrive: torch.Tensor | None = None
    # Two-precision state (issue 7, docs/design.md "Precision: two copies"): a low-precision read copy of
    # the checkpoint, rc [slots, HV, V, K] (bf16, or float8_e4m3fn with rc_scale [slots, HV, V] fp32: one
    # scale per V-row), and rc_valid [slots] int32: 1 while rc holds round(checkpoint). Any write of a
    # checkpoint that does not also write rc (SGLang's prefill and copies, a window-1 step, a verify
    # pre-fold, the glue's folds) must clear rc_valid; a decode step of a row with rc_valid == 0 is a
    # forced flush (reads the checkpoint only, writes both copies). None: no read copy.
    rc: torch.Tensor | None = None
    rc_scale: torch.Tensor | None = None
    rc_valid: torch.Tensor | None = None
    # KDA key records (docs/design.md, "Pre-decayed KDA keys"): "raw" holds k_j and its cumulative log-decay G_j
    # per (record, K), and every read of record j decays it by e^{G_t - G_j}; "predecayed" holds k_j e^{-G_j},
    # so a read needs only e^{G_t} (G of the last record plus this step's gate) and the per-(record, K) gates
    # are neither read nor exponentiated (ring.g still holds G_j, read at the last record only). A head whose G
    # would fall below PREDECAYED_MIN_G in any channel is rebased that step instead: its checkpoint is folded
    # through this token (the head alone), its key records are zeroed and its G restarts at 0, so e^{-G_j} stays
    # finite and the row's cursor and other heads are untouched; a row that would fold first (a pre-step fold)
    # flushes whole instead. ovf [slots, HV + 1] int32: the decode launch's flags, per head (rebase) and in the last
    # column per row (flush); 0 between launches.
    kda_keys: str = "raw"
    ovf: torch.Tensor | None = None
    # Split records (session 51, docs/design.md "Split records"): fp32 records as two 16-bit planes. u and k hold
    # each element's bf16, rounded to nearest (ties away from zero), which is all that a step's dots and outputs read:
    # half an fp32 record's bytes. u_lo and k_lo (int16, shaped as u and k) hold the low 16 bits of its fp32 bits, so
    # that a fold joins the two into the exact fp32 record (split_join): the checkpoint folds what an fp32 ring would
    # hold. None: whole records (u, k in record_dtype). Only gdn_main.cu's launches (REC_SPLIT) read or write them;
    # every other kernel refuses such a ring (require_whole_records).
    u_lo: torch.Tensor | None = None
    k_lo: torch.Tensor | None = None

    @property
    def predecayed(self) -> bool:
        return self.kda_keys == "predecayed"

    @property
    def split_records(self) -> bool:
        return self.u_lo is not None

    def require_whole_records(self, what: str) -> None:
        """Refuses a ring of split records for a kernel that reads records whole (``what`` names it)."""
        if self.split_records:
            raise ValueError(f"{what} reads whole records; this ring keeps them split (split_records: the CUDA main "
                             f"launch with the CUDA pre launch or none only, decode_v3 main_impl='cuda', "
                             f"pre_impl='cuda'; in the server, unset REPLAYSSM_SPLIT_RECORDS)")

    def reset(self, slots: torch.Tensor) -> None:
        """Forget every record of these slots (their checkpoint is exact as it stands)."""
        self.h.index_fill_(0, slots.to(device=self.h.device, dtype=torch.long), 0)
        self.invalidate_read_copy(slots)

    def invalidate_read_copy(self, slots: torch.Tensor) -> None:
        """The checkpoints of these slots were written without their read copy (no-op without one)."""
        if self.rc_valid is not None:
            self.rc_valid.index_fill_(0, slots.to(device=self.rc_valid.device, dtype=torch.long), 0)


# --- the rule, as tensor ops usable inside a CUDA graph (no host sync) -------------------------

def needs_prefold(h: torch.Tensor, T: int, L: int) -> torch.Tensor:
    """Per row: fold the committed records before appending T new ones (h + T > L)."""
    return (h + T) > L


def decode_flushes(h: torch.Tensor, L: int, forced: torch.Tensor | None = None) -> torch.Tensor:
    """Per row, for a T = 1 decode step starting at committed count h: does the step write the
    checkpoint (after committing its token)? True when the ring becomes full or a flush is forced.
    A pre-step fold (h == L, only reachable after a verify step) also writes it."""
    after = h + 1
    out = (after >= L) | needs_prefold(h, 1, L)
    if forced is not None:
        out = out | forced.to(torch.bool)
    return out


def h_after_decode(h: torch.Tensor, L: int, forced: torch.Tensor | None = None) -> torch.Tensor:
    """Committed count after a T = 1 decode step (0 when the step flushed)."""
    start = torch.where(needs_prefold(h, 1, L), torch.zeros_like(h), h)
    after = start + 1
    flush = after >= L
    if forced is not None:
        flush = flush | forced.to(torch.bool)
    return torch.where(flush, torch.zeros_like(after), after).to(h.dtype)


def h_after_verify(h: torch.Tensor, T: int, L: int, accepted: torch.Tensor) -> torch.Tensor:
    """Committed count after a verify step of T drafts of which ``accepted`` (bonus included,
    1 <= accepted <= T) were accepted. Rejected records past it are simply overwritten later."""
    start = torch.where(needs_prefold(h, T, L), torch.zeros_like(h), h)
    return (start + accepted.to(h.dtype)).to(h.dtype)


def verify_start(h: torch.Tensor, T: int, L: int) -> torch.Tensor:
    """Per row: the ring position where a step of T tokens appends its first record (0 after a
    pre-step fold, else h). The records of the step land at r[start .. start+T-1]."""
    return torch.where(needs_prefold(h, T, L), torch.zeros_like(h), h)


def commit_verify_(h: torch.Tensor, slot_idx: torch.Tensor, T: int, L: int, accepted: torch.Tensor,
                   ring_idx: torch.Tensor | None = None) -> torch.Tensor:
    """Commit after acceptance, in place on the device: h[slot] = h_after_verify(h[slot], ...) for
    every row whose slot index is >= 0 (padded rows, slot -1, are left alone). With ``ring_idx`` [B]
    (a ring keyed by request row) h is indexed by ``ring_idx[row]`` instead; a row with either index
    < 0 is padding.

    ``h`` is the committed count from BEFORE the verify step (the verify kernel never writes it);
    ``accepted`` counts the accepted drafts including the bonus token (1 <= accepted <= T).
    Rejected records stay past h and are overwritten by the next step: nothing is copied back.

    Pure tensor ops without host syncs or data-dependent shapes, so it can be captured in a CUDA
    graph. Each real row must own a distinct slot (as SGLang guarantees); padded rows add 0 to
    slot 0 via index_add_, so they never race with a real row that owns slot 0.
    """
    if slot_idx.dim() != 1 or accepted.shape[0] != slot_idx.shape[0]:
        raise ValueError(f"slot_idx [B] and accepted [B] expected, got {tuple(slot_idx.shape)} and {tuple(accepted.shape)}")
    valid = slot_idx >= 0
    if ring_idx is not None:
        if ring_idx.shape != slot_idx.shape:
            raise ValueError(f"ring_idx must be shaped like slot_idx {tuple(slot_idx.shape)}, got {tuple(ring_idx.shape)}")
        valid = valid & (ring_idx >= 0)
        slot_idx = ring_idx
    safe = torch.where(valid, slot_idx, torch.zeros_like(slot_idx)).to(torch.long)
    old = h.index_select(0, safe)
    new = h_after_verify(old, T, L, accepted.to(h.dtype))
    delta = torch.where(valid, new - old, torch.zeros_like(old))
    h.index_add_(0, safe, delta)
    return h


def check_draft_shape(topk: int | None, num_draft_tokens: int | None, L: int | None = None) -> int:
    """Validate a speculative configuration for the ring and return T (draft tokens verified per
    step). Linear draft chains only: NEXTN/MTP, or EAGLE with topk 1.

    Raises ValueError naming the fix for an EAGLE tree (topk > 1), whose drafts branch: records of
    sibling branches would need one ring position each and the triangular solve over a chain
    does not hold for a tree.
    """
    if topk is not None and topk > 1:
        raise ValueError(
            f"ReplaySSM speculative verify supports linear draft chains only, got "
            f"--speculative-eagle-topk {topk} (an EAGLE tree). Fix: set --speculative-eagle-topk 1 "
            f"(or use NEXTN/MTP), or turn off --enable-linear-replayssm for tree drafting."
        )
    if num_draft_tokens is None:
        raise ValueError("speculative decoding needs --speculative-num-draft-tokens (T) to size the ring")
    T = int(num_draft_tokens)
    if T < 1:
        raise ValueError(f"--speculative-num-draft-tokens must be >= 1, got {T}")
    if L is not None:
        ring_capacity(L, T)  # raises with the fix when T > L
    return T


# --- split records (Ring.u_lo / k_lo): fp32 records as two 16-bit planes ---------------------------------------

def split_high_dtype(record_dtype: torch.dtype) -> torch.dtype:
    """The high plane's type of split records (bf16; the low plane is int16), for records of record_dtype: only fp32
    records are split."""
    if record_dtype != torch.float32:
        raise ValueError(f"split_records keeps fp32 records as two 16-bit planes: record_dtype must be torch.float32, "
                         f"got {record_dtype}")
    return torch.bfloat16


def split_planes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 values as (hi, lo): hi the bf16 of each, rounded to nearest with ties away from zero (its bits are
    (b + 0x8000) >> 16 of the fp32 bits b), lo the low 16 bits of b (int16). split_join(hi, lo) == x bit for bit."""
    if x.dtype != torch.float32:
        raise ValueError(f"split_planes takes fp32 values, got {x.dtype}")
    b = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    hi = ((b + 0x8000) >> 16) & 0xFFFF
    lo = b & 0xFFFF
    as16 = lambda v: torch.where(v >= 0x8000, v - 0x10000, v).to(torch.int16)  # noqa: E731 (the same 16 bits)
    return as16(hi).view(torch.bfloat16), as16(lo)


def split_join(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """The fp32 values whose planes are hi (bf16) and lo (int16): bits (hi << 16) + lo, lo taken as signed."""
    h = hi.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    b = ((h << 16) + lo.to(torch.int64)) & 0xFFFFFFFF
    return torch.where(b >= 1 << 31, b - (1 << 32), b).to(torch.int32).view(torch.float32)

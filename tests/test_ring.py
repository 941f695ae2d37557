"""Pure protocol tests for replayssm_sglang.ring (no kernels): h evolution, capacity, commit, refusals."""

import random

import pytest
import torch

from replayssm_sglang import ring as R


def _walk_h(h, T, L, acc):
    """The rule in words: fold first when h + T > L, then append T and keep `acc` of them."""
    start = 0 if h + T > L else h
    return start + acc


@pytest.mark.parametrize("L", [1, 2, 8, 16, 32])
def test_capacity_is_L_for_T_up_to_L(L):
    for T in range(1, L + 1):
        assert R.ring_capacity(L, T) == L
    with pytest.raises(ValueError, match="cache-len"):
        R.ring_capacity(L, L + 1)
    with pytest.raises(ValueError):
        R.ring_capacity(0, 1)
    with pytest.raises(ValueError):
        R.ring_capacity(L, 0)


def test_random_accept_sequences_keep_h_in_range_and_records_in_capacity():
    rng = random.Random()  # fresh each run
    for L in (1, 4, 8, 16, 32):
        for _ in range(4):
            h = 0
            for _step in range(100):
                T = rng.randint(1, L)
                acc = rng.randint(1, T)
                ht = torch.tensor([h], dtype=torch.int32)
                start = int(R.verify_start(ht, T, L)[0])
                assert start == (0 if h + T > L else h)
                # every record of the step fits in the ring
                assert start + T <= R.ring_capacity(L, T)
                assert bool(R.needs_prefold(ht, T, L)[0]) == (h + T > L)
                h_new = int(R.h_after_verify(ht, T, L, torch.tensor([acc]))[0])
                assert h_new == _walk_h(h, T, L, acc)
                assert 1 <= h_new <= L
                h = h_new


def test_flush_rule_is_decided_from_h_and_T_alone():
    L = 16
    h = torch.arange(0, L + 1, dtype=torch.int32)
    for T in (1, 2, 4, 8):
        got = R.needs_prefold(h, T, L)
        assert got.tolist() == [(int(x) + T) > L for x in h]


def test_commit_verify_in_place_padded_rows_and_duplicate_slot0():
    L, T = 8, 4
    h = torch.tensor([0, 3, 7, 5, 2], dtype=torch.int32)
    h0 = h.clone()
    # row 2 is padded (-1); slot 0 is a real row's slot too: padded rows must not disturb it
    slots = torch.tensor([1, 0, -1, 2, 4])
    acc = torch.tensor([2, 4, 3, 1, 4])
    R.commit_verify_(h, slots, T, L, acc)
    exp = h0.clone()
    for s, a in zip(slots.tolist(), acc.tolist()):
        if s < 0:
            continue
        exp[s] = _walk_h(int(h0[s]), T, L, a)
    assert h.tolist() == exp.tolist()
    assert h[3] == h0[3]  # slot 3 belongs to nobody: untouched
    assert h.dtype == torch.int32


def test_commit_verify_matches_h_after_verify_on_random_batches():
    g = torch.Generator().manual_seed(random.randrange(1 << 30))
    for L in (4, 16, 32):
        for T in (1, 2, 4):
            if T > L:
                continue
            slots_n = 40
            h = torch.randint(0, L + 1, (slots_n,), generator=g, dtype=torch.int32)
            B = 17
            slots = torch.randperm(slots_n, generator=g)[:B]
            slots[torch.rand(B, generator=g) < 0.2] = -1
            acc = torch.randint(1, T + 1, (B,), generator=g)
            before = h.clone()
            R.commit_verify_(h, slots, T, L, acc)
            for i in range(B):
                s = int(slots[i])
                if s < 0:
                    continue
                want = R.h_after_verify(before[s : s + 1], T, L, acc[i : i + 1])
                assert int(h[s]) == int(want[0])
            untouched = torch.ones(slots_n, dtype=torch.bool)
            untouched[slots[slots >= 0]] = False
            assert torch.equal(h[untouched], before[untouched])


def test_plain_decode_is_T1_of_the_same_rule():
    # A T = 1 verify that commits its token gives the same committed count as the decode rule,
    # except that decode folds eagerly at h == L (h = 0) where verify folds at the next step.
    L = 8
    for h in range(0, L + 1):
        ht = torch.tensor([h], dtype=torch.int32)
        v = int(R.h_after_verify(ht, 1, L, torch.tensor([1]))[0])
        d = int(R.h_after_decode(ht, L)[0])
        assert v == (1 if h == L else h + 1)
        assert d == (0 if v == L else v)


def test_mixed_T_sequence_switches_between_plain_and_speculative():
    L = 16
    h = torch.zeros(1, dtype=torch.int32)
    seq = [(1, 1), (4, 3), (1, 1), (8, 8), (2, 1), (1, 1), (4, 4), (8, 2), (1, 1)]
    want = 0
    for T, acc in seq:
        want = _walk_h(want, T, L, acc)
        h = R.h_after_verify(h, T, L, torch.tensor([acc]))
        assert int(h[0]) == want


@pytest.mark.parametrize("topk", [2, 4, 8])
def test_eagle_tree_is_refused_with_the_fix(topk):
    with pytest.raises(ValueError) as e:
        R.check_draft_shape(topk, 4)
    msg = str(e.value)
    assert "--speculative-eagle-topk 1" in msg and str(topk) in msg


def test_draft_shape_linear_chains_accepted():
    assert R.check_draft_shape(1, 4) == 4
    assert R.check_draft_shape(None, 3) == 3  # NEXTN/MTP: no topk
    assert R.check_draft_shape(0, 2, L=16) == 2
    with pytest.raises(ValueError, match="num-draft-tokens"):
        R.check_draft_shape(1, None)
    with pytest.raises(ValueError):
        R.check_draft_shape(1, 0)
    with pytest.raises(ValueError, match="cache-len"):
        R.check_draft_shape(1, 9, L=8)


def test_layout_shapes_for_verify():
    lay = R.RingLayout.for_layer("gdn", L=16, T_max=4, H=16, HV=32, K=128, V=128)
    sh = lay.shapes(3)
    assert sh["u"] == (3, 32, 16, 128) and sh["k"] == (3, 16, 16, 128) and sh["g"] == (3, 32, 16, 1)
    lay = R.RingLayout.for_layer("kda", L=8, T_max=8, H=4, HV=4, K=64, V=64)
    assert lay.shapes(2)["g"] == (2, 4, 8, 64)
    with pytest.raises(ValueError):
        R.RingLayout.for_layer("gdn", L=4, T_max=8, H=1, HV=1, K=16, V=16)


# --- split records (session 51): ring.split_planes / split_join and the pool's split rings ----------------------

def test_split_planes_join_exactly():
    """split_join(split_planes(x)) is x bit for bit (signs, zeros, subnormals, the largest finite values, every
    rounding case of the low half), and the high plane is x's bf16 rounded to nearest (ties away from zero)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(20000, generator=g) * torch.exp(torch.randn(20000, generator=g) * 8)
    edge = torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-39, 3.4e38, -3.4e38, 1.0, -1.0])
    ties = (torch.arange(64, dtype=torch.int32) * 0x10000 + 0x3F808000).view(torch.float32)  # low half 0x8000
    x = torch.cat([x, edge, ties, -ties])
    hi, lo = R.split_planes(x)
    assert hi.dtype == torch.bfloat16 and lo.dtype == torch.int16
    assert torch.equal(R.split_join(hi, lo).view(torch.int32), x.view(torch.int32))
    b = x.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    want = ((b + 0x8000) >> 16) & 0xFFFF
    assert torch.equal(hi.view(torch.int16).to(torch.int64) & 0xFFFF, want)
    odd = x.to(torch.bfloat16) != hi  # (torch rounds ties to even: only exact ties may differ)
    assert bool(((b[odd] & 0xFFFF) == 0x8000).all()) and int(odd.sum()) > 0


def test_split_ring_allocation_and_refusals():
    """allocate(split_records=True): u, k bf16 high planes and int16 low planes shaped alike; fp32 records only; the
    kernels that read whole records refuse such a ring, naming the launches that take it."""
    lay = R.RingLayout.for_layer("gdn", L=4, H=1, HV=2, K=8, V=4)
    r = lay.allocate(3, split_records=True)
    assert r.split_records and r.u.dtype == r.k.dtype == torch.bfloat16
    assert r.u_lo.shape == r.u.shape and r.k_lo.shape == r.k.shape and r.u_lo.dtype == torch.int16
    assert not lay.allocate(3).split_records
    with pytest.raises(ValueError, match="record_dtype must be torch.float32"):
        lay.allocate(3, record_dtype=torch.bfloat16, split_records=True)
    with pytest.raises(ValueError, match="main_impl='cuda', pre_impl='cuda'"):
        r.require_whole_records("a test kernel")
    lay.allocate(3).require_whole_records("a test kernel")  # (whole records: nothing to refuse)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_pool_split_records_fold_is_exact(kind, monkeypatch):
    """The glue's fold (ReplayPool.fold_) of a pool with split records joins them: the checkpoints it writes equal,
    bit for bit, those of the same records whole; its rings carry the low planes; REPLAYSSM_SPLIT_RECORDS chooses it
    and is refused, with the fix, beside a bf16 state or speculative decoding."""
    from replayssm_sglang.sglang_hooks import pool as poolmod

    H, HV = (1, 2) if kind == "gdn" else (2, 2)
    lay = R.RingLayout.for_layer(kind, L=4, H=H, HV=HV, K=8, V=4)
    g = torch.Generator().manual_seed(1)
    keys = "predecayed" if kind == "kda" else "raw"
    whole = poolmod.ReplayPool.allocate(lay, 2, 5, device="cpu", kda_keys=keys)
    split = poolmod.ReplayPool.allocate(lay, 2, 5, device="cpu", kda_keys=keys, split_records=True)
    u, k = torch.randn(whole.u.shape, generator=g), torch.randn(whole.k.shape, generator=g)
    whole.u.copy_(u), whole.k.copy_(k)
    (hu, lu), (hk, lk) = R.split_planes(u), R.split_planes(k)
    split.u.copy_(hu), split.u_lo.copy_(lu), split.k.copy_(hk), split.k_lo.copy_(lk)
    G = -torch.cumsum(torch.rand(whole.g.shape, generator=g), dim=3)
    for p in (whole, split):
        p.g.copy_(G)
        p.h.copy_(torch.tensor([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0]], dtype=torch.int32))
    assert bool((split.u_lo != 0).any())
    temporal = torch.randn(2, 5, HV, 4, 8, generator=g)
    t_whole, t_split = temporal.clone(), temporal.clone()
    whole.fold_(t_whole, [0, 1, 2, 3, 4])
    split.fold_(t_split, [0, 1, 2, 3, 4])
    assert torch.equal(t_split.view(torch.int32), t_whole.view(torch.int32))
    assert not torch.equal(t_split, temporal)
    ring = split.ring(1)
    assert ring.split_records and ring.u_lo.data_ptr() == split.u_lo[1].data_ptr()
    assert split.nbytes() == whole.nbytes()  # (two 16-bit planes: an fp32 record's bytes)
    monkeypatch.setenv("REPLAYSSM_SPLIT_RECORDS", "1")
    assert poolmod.split_records_for(torch.float32, None)
    with pytest.raises(ValueError, match="records are in its own type"):
        poolmod.split_records_for(torch.bfloat16, None)
    with pytest.raises(ValueError, match="speculative decoding"):
        poolmod.split_records_for(torch.float32, 4)
    monkeypatch.setenv("REPLAYSSM_SPLIT_RECORDS", "yes")
    with pytest.raises(ValueError, match="must be 0 or 1"):
        poolmod.split_records_for(torch.float32, None)
    monkeypatch.delenv("REPLAYSSM_SPLIT_RECORDS")
    assert not poolmod.split_records_for(torch.float32, None)

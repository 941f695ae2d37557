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

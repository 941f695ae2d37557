"""scripts/e2e_pool.py: pooling several gpu_e2e.py calls' throughput and prefix results at one commit (no GPU)."""
import json
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import e2e_pool as ep  # noqa: E402


def _arm(reps, logged, B="256", hit=None, ttft=None):
    a = {"throughput": {B: {"decode_tok_s_all": reps, "server_logged_tok_s": logged}}}
    if hit is not None:
        a["prefix"] = {"hit_rate": 0.1, "mean_ttft_s": 99.0,  # the cold run: never pooled
                       "warm": {"hit_rate": hit, "mean_ttft_s": ttft}}
    return a


def _res(commit, arms, model="gdn"):
    return {"commit": commit, "gpu": "NVIDIA H200", "models": {model: {"arms": arms}}}


def test_pools_every_server_and_merges_arms():
    r1 = _res("abc", {"conventional": _arm([100.0, 102.0, 150.0], 110.0, hit=0.85, ttft=1.0),
                      "ours": _arm([130.0, 128.0, 131.0], 140.0, hit=0.85, ttft=1.2),
                      "ours_w16": _arm([120.0, 90.0, 126.0], 135.0, hit=0.84, ttft=1.4)})
    r2 = _res("abc", {"conventional": _arm([98.0, 99.0, 101.0], 106.0, hit=0.86, ttft=1.2)})
    p = ep.pool([r1, r2], merge={"ours_w16": "ours"})
    conv, ours = p["models"]["gdn"]["conventional"], p["models"]["gdn"]["ours"]
    assert conv["servers"] == 2 and ours["servers"] == 2 and ours["from_arms"] == ["ours", "ours_w16"]
    assert conv["harness_median"] == statistics.median([100, 102, 150, 98, 99, 101])  # 100.5
    assert ours["harness_median"] == statistics.median([130, 128, 131, 120, 90, 126])  # 127
    assert ours["harness_median_of_servers"] == statistics.median([130, 120])
    assert ours["logged_median"] == 137.5 and conv["logged_median"] == 108.0
    assert ours["harness_median_x_ref"] == pytest.approx(127 / 100.5)
    assert ours["logged_median_x_ref"] == pytest.approx(137.5 / 108.0)
    # prefix: the warm runs only; mean TTFT 1.3 against 1.1; hit rates' medians 0.845 against 0.855 -> -1 point
    assert ours["prefix_ttft_mean_x_ref"] == pytest.approx(1.3 / 1.1)
    assert ours["prefix_hit_points_vs_ref"] == pytest.approx(-1.0)
    md = ep.markdown(p)
    assert "ours = ours + ours_w16 (2 / 2)" in md and "1.264x" in md  # 127 / 100.5


def test_other_batch_sizes_and_missing_reference():
    r = _res("abc", {"ours": _arm([10.0, 12.0, 11.0], None, B="64")})
    p = ep.pool([r], batch=64)
    row = p["models"]["gdn"]["ours"]
    assert row["harness_median"] == 11.0 and row["logged_median"] is None
    assert row["harness_median_x_ref"] is None  # no conventional server ran
    assert ep.pool([r], batch=256)["models"]["gdn"]["ours"]["servers"] == 0
    assert "| gdn | ours (1 / 0) | 11 (-x)" in ep.markdown(p)


def test_refuses_mixed_commits_unless_asked(tmp_path, capsys):
    a, b = _res("abc", {"ours": _arm([1.0], 1.0)}), _res("def", {"ours": _arm([2.0], 2.0)})
    with pytest.raises(ep.PoolError, match="2 commits"):
        ep.pool([a, b])
    assert ep.pool([a, b], allow_mixed_commits=True)["models"]["gdn"]["ours"]["harness_median"] == 1.5
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    assert ep.main([str(fa), str(fb)]) == 2
    assert "--allow-mixed-commits" in capsys.readouterr().err
    out = tmp_path / "p.json"
    assert ep.main([str(fa), str(fb), "--allow-mixed-commits", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["commits"] == ["abc", "def"]
    with pytest.raises(SystemExit):
        ep.main([str(fa), "--merge", "ours_w16"])  # not A=B


def test_tagged_repeats_count_as_their_base_arm():
    """gpu_e2e.py tags a repeated arm (ours, ours:2): both servers are the base arm's, merged or not."""
    r = _res("abc", {"conventional": _arm([100.0, 100.0, 100.0], 110.0),
                     "ours": _arm([130.0, 130.0, 130.0], 140.0), "ours:2": _arm([134.0, 134.0, 134.0], 144.0),
                     "ours_w16:2": _arm([120.0, 120.0, 120.0], 130.0)})
    rows = ep.pool([r], merge={"ours_w16": "ours"})["models"]["gdn"]
    assert set(rows) == {"conventional", "ours"}
    assert rows["ours"]["servers"] == 3 and rows["ours"]["from_arms"] == ["ours", "ours:2", "ours_w16:2"]
    assert rows["ours"]["harness_median_of_servers"] == 130.0


def test_every_warm_prefix_run_is_pooled():
    """--prefix-repeats 4: three warm runs per server (`repeats`), all pooled; the cold first run never."""
    def arm(ttfts, hits):
        reps = [{"hit_rate": h, "mean_ttft_s": t} for t, h in zip(ttfts, hits)]
        return {"prefix": {"hit_rate": 0.1, "mean_ttft_s": 99.0, "repeats": reps, "warm": reps[-1]}}
    r = _res("abc", {"conventional": arm([0.7, 1.1, 0.7], [0.85, 0.855, 0.85]),
                     "conventional:2": arm([0.6, 1.4, 0.6], [0.856, 0.848, 0.856]),
                     "ours": arm([0.74, 0.86, 0.91], [0.85, 0.85, 0.848])})
    rows = ep.pool([r])["models"]["gdn"]
    conv, ours = rows["conventional"], rows["ours"]
    assert conv["prefix_ttft_warm"] == [0.7, 1.1, 0.7, 0.6, 1.4, 0.6] and conv["prefix_servers"] == 2
    assert ours["prefix_ttft_mean_x_ref"] == pytest.approx((2.51 / 3) / (5.1 / 6))
    assert ours["prefix_ttft_median_x_ref"] == pytest.approx(0.86 / 0.7)
    assert ours["prefix_hit_points_vs_ref"] == pytest.approx(100 * (0.85 - 0.8525))  # medians
    md = ep.markdown(ep.pool([r]))
    assert "| 3 | 0.850 (" in md and "| 0.837 (0.984x) | 0.860 (1.229x) |" in md

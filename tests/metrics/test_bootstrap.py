"""Row-level bootstrap: the fast Poisson bootstrap against a per-row reference, and the paired
comparison."""

from __future__ import annotations

import numpy as np
import pytest

from ctrcal.metrics import auc, bootstrap_ci, ece, paired_bootstrap, pcoc

METRICS = {"ece": ece, "pcoc": pcoc, "auc": auc}


def _rows(n: int, seed: int, decimals: int | None = None):
    rng = np.random.default_rng(seed)
    p = rng.beta(1, 20, n)
    if decimals is not None:
        p = np.round(p, decimals)  # many ties
    y = (rng.random(n) < np.clip(1.2 * p, 0, 1)).astype(np.float64)
    return p, y


def _per_row_reference(p, y, n_boot, seed):
    """The textbook Poisson bootstrap: a Poisson(1) count per row and replicate."""
    rng = np.random.default_rng(seed)
    reps = {m: [] for m in METRICS}
    for _ in range(n_boot):
        rows = np.repeat(np.arange(p.size), rng.poisson(1.0, p.size))
        for m, fn in METRICS.items():
            reps[m].append(fn(p[rows], y[rows]))
    return {m: np.std(v, ddof=1) for m, v in reps.items()}


@pytest.mark.parametrize("decimals", [None, 3])
def test_estimates_equal_the_metrics(decimals):
    p, y = _rows(20_000, 0, decimals)
    ci = bootstrap_ci(p, y, n_boot=50, max_blocks=64)
    for m, fn in METRICS.items():
        assert ci[m].estimate == pytest.approx(fn(p, y), abs=1e-12)
        assert ci[m].low < ci[m].estimate < ci[m].high
        assert ci[m].replicates.shape == (50,)


@pytest.mark.slow
@pytest.mark.parametrize(
    "n, decimals, max_blocks",
    [
        (3_000, None, 4096),  # every row its own block: the exact Poisson bootstrap
        (10_000, 3, 4096),
        (20_000, None, 64),
    ],  # blocks of many rows, with and without ties
)
def test_spread_matches_the_per_row_poisson_bootstrap(n, decimals, max_blocks):
    p, y = _rows(n, 1, decimals)
    fast = bootstrap_ci(p, y, n_boot=300, max_blocks=max_blocks, seed=3)
    ref = _per_row_reference(p, y, 300, seed=4)
    for m in METRICS:  # 300 replicates: the SE of an SE is ~4 %
        assert fast[m].se == pytest.approx(ref[m], rel=0.15), m


def test_same_seed_same_interval_and_wider_with_fewer_rows():
    p, y = _rows(40_000, 2)
    a, b = bootstrap_ci(p, y, seed=7), bootstrap_ci(p, y, seed=7)
    assert np.array_equal(a["auc"].replicates, b["auc"].replicates)
    small = bootstrap_ci(p[:4_000], y[:4_000], seed=7)
    for m in METRICS:
        assert small[m].se > 2.0 * a[m].se  # √10 ≈ 3.2 in theory
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_ci(p, y, n_boot=1)


def test_paired_bootstrap_keeps_the_pairing():
    p, y = _rows(5_000, 3)
    rng = np.random.default_rng(0)
    worse = np.clip(p * 1.6, 0, 1)
    jitter = np.clip(p + rng.normal(0, 1e-4, p.size), 0, 1)

    def fn(probs, labels, rows):
        return {"ece": ece(probs, labels), "pcoc": pcoc(probs, labels)}

    same = paired_bootstrap(fn, p, jitter, y, n_boot=100)
    # the same rows for both models: the difference is far tighter than either interval
    assert same["pcoc"].diff.se < 0.05 * same["pcoc"].a.se
    far = paired_bootstrap(fn, p, worse, y, n_boot=100)
    assert far["pcoc"].diff.low > 0.3 and far["pcoc"].pvalue == pytest.approx(0.01)
    assert far["ece"].diff.estimate == pytest.approx(ece(worse, y) - ece(p, y))
    seen = []
    paired_bootstrap(lambda a, b, rows: seen.append(rows) or {"x": 0.0}, p, p, y, n_boot=3)
    assert seen[:2] == [None, None] and all(r.shape == (p.size,) for r in seen[2:])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bin_edges_zeros_and_ones_land_where_ece_puts_them(dtype):
    rng = np.random.default_rng(4)
    edges = np.linspace(0, 1, 16).astype(dtype)  # every bin edge, 0 and 1 included
    p = np.concatenate([np.repeat(edges, 40), rng.random(2_000).astype(dtype)])
    y = (rng.random(p.size) < p).astype(np.float64)
    ci = bootstrap_ci(p, y, n_boot=20, max_blocks=32)
    for m, fn in METRICS.items():
        assert ci[m].estimate == pytest.approx(fn(p, y), abs=1e-12), m

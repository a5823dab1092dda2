"""Inside / outside the training region (evaluation/regions.py): distances against a
brute-force evaluation, a growing training set, the per-part nMSE."""
import numpy as np
import pytest

from adaptive_dynamics.evaluation.regions import (MIN_SAMPLES, GrowingNearest, inside_region, nearest_distance,
                                                  region_summary, split_nmse)


def _brute(A, B):
    return np.sqrt(((B[:, None, :] - A[None, :, :]) ** 2).sum(axis=2)).min(axis=1)


def test_nearest_distance_and_the_growing_set_equal_brute_force():
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(700, 7)), rng.normal(size=(90, 7))
    np.testing.assert_allclose(nearest_distance(A, B), _brute(A, B), rtol=1e-12)
    g = GrowingNearest(7)
    assert np.all(np.isinf(g.query(B)))
    k = 0
    for size in (1, 5, 300, 17, 250, 127):          # crosses the tree rebuilds
        g.add(A[k:k + size])
        k += size
        assert len(g) == k
        np.testing.assert_allclose(g.query(B), _brute(A[:k], B), rtol=1e-9, atol=1e-12)


def test_inside_outside_and_the_parts_nmse():
    q = np.linspace(0, 1, 200)[:, None] * np.ones((1, 3))
    test = np.vstack([q[::7] + 0.01, q[::7] + [1.0, -1.0, 0.0]])   # half near, half 1.4 rad off the line
    inside = inside_region(q, test, 0.1)
    assert inside[:len(q[::7])].all() and not inside[len(q[::7]):].any()
    s = region_summary(q, test)
    assert s["fraction_outside"] == pytest.approx(0.5) and s["radius_rad"] == 0.1
    y = np.random.default_rng(1).normal(size=(test.shape[0], 2))
    p = y + np.where(inside[:, None], 0.1, 1.0)
    parts = split_nmse(y, p, inside)
    np.testing.assert_allclose(parts["inside"], 0.01 / y[inside].var(axis=0))
    np.testing.assert_allclose(parts["outside"], 1.0 / y[~inside].var(axis=0))
    few = np.zeros(len(y), dtype=bool)
    few[:MIN_SAMPLES - 1] = True
    assert split_nmse(y, p, few)["inside"] is None
    for bad in (0.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match="radius"):
            inside_region(q, test, bad)
        with pytest.raises(ValueError, match="radius"):
            region_summary(q, test, bad)

"""Held-out data inside and outside the training region (no ROS import).

A held-out state is **inside** the training region when some training state lies within
``radius`` of it, the distance being the Euclidean norm of the joint-position difference
(rad; m for a prismatic joint) -- :data:`REGION_RADIUS` = 0.1 rad by default --, and
**outside** otherwise.  Joint positions decide because they set the configuration-
dependent dynamics (inertia, gravity, a payload's lever arm) that a learner of
``x = (q, qd, qdd)`` cannot infer from anywhere else; velocities and accelerations
repeat across motions.  A learner that extrapolates shows it outside; one that has
learnt only its trajectory's artefacts shows it inside but on another motion.

:func:`nearest_distance` uses scipy's KD-tree; :class:`GrowingNearest` answers the same
question for a training set that grows (a prequential replay: each block is judged
against what was learnt before it); :func:`split_nmse` gives the per-joint nMSE of each
part (``None`` for a part of fewer than :data:`MIN_SAMPLES` samples).
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
from scipy.spatial import cKDTree

from .metrics import nmse

__all__ = ["REGION_RADIUS", "MIN_SAMPLES", "check_radius", "nearest_distance", "inside_region", "split_nmse",
           "region_summary", "GrowingNearest"]

#: default radius of the training region [rad]
REGION_RADIUS = 0.1
#: fewest samples a part needs for its nMSE to be reported
MIN_SAMPLES = 20


def nearest_distance(train_q: np.ndarray, test_q: np.ndarray) -> np.ndarray:
    """Distance of each test state to the nearest training state (joint positions)."""
    train_q = np.atleast_2d(np.asarray(train_q, dtype=float))
    test_q = np.atleast_2d(np.asarray(test_q, dtype=float))
    if train_q.shape[0] == 0:
        return np.full(test_q.shape[0], np.inf)
    return cKDTree(train_q).query(test_q)[0]


def check_radius(radius: float) -> float:
    """``radius`` as a float; ValueError unless finite and > 0."""
    radius = float(radius)
    if not (np.isfinite(radius) and radius > 0):
        raise ValueError(f"the region radius must be > 0, got {radius}")
    return radius


def inside_region(train_q, test_q, radius: float = REGION_RADIUS) -> np.ndarray:
    """Boolean mask of the test states inside the training region."""
    return nearest_distance(train_q, test_q) <= check_radius(radius)


def split_nmse(y: np.ndarray, pred: np.ndarray, inside: np.ndarray) -> Dict[str, Optional[list]]:
    """Per-joint nMSE of ``pred`` against ``y`` on all rows, inside and outside (each
    normalised by the variance of its own part's target)."""
    out: Dict[str, Optional[list]] = {"all": nmse(pred, y).tolist()}
    for name, mask in (("inside", inside), ("outside", ~inside)):
        out[name] = nmse(pred[mask], y[mask]).tolist() if np.count_nonzero(mask) >= MIN_SAMPLES else None
    return out


def region_summary(train_q, test_q, radius: float = REGION_RADIUS) -> dict:
    """``inside`` mask and the figures that describe the split: the radius, the fraction
    of held-out samples outside, and the quartiles of the nearest distance."""
    radius = check_radius(radius)
    d = nearest_distance(train_q, test_q)
    inside = d <= radius
    return {"inside": inside, "radius_rad": radius, "distance": "nearest training joint position,"
            " Euclidean [rad]", "fraction_outside": round(float(1.0 - inside.mean()), 4) if d.size else None,
            "fraction_beyond_0.5_rad": round(float((d > 0.5).mean()), 4) if d.size else None,
            "distance_quartiles_rad": [round(float(x), 4) for x in np.quantile(d, [0.25, 0.5, 0.75])] if d.size
            else None}


class GrowingNearest:
    """Nearest-distance queries against a set of points that grows: a KD-tree over a
    prefix, rebuilt when the points added since exceed the prefix (amortised O(log N) per
    point), and brute force over those recent points."""

    def __init__(self, dim: int):
        self.dim = int(dim)
        self._tree = None
        self._n_tree = 0
        self._points = np.zeros((0, self.dim))

    def __len__(self) -> int:
        return self._points.shape[0]

    def add(self, P) -> None:
        P = np.atleast_2d(np.asarray(P, dtype=float))
        if P.size:
            self._points = np.vstack([self._points, P])
        if len(self) - self._n_tree > max(256, self._n_tree):
            self._tree, self._n_tree = cKDTree(self._points), len(self)

    def query(self, Q) -> np.ndarray:
        Q = np.atleast_2d(np.asarray(Q, dtype=float))
        d = np.full(Q.shape[0], np.inf)
        if self._tree is not None:
            d = self._tree.query(Q)[0]
        tail = self._points[self._n_tree:]
        if tail.shape[0]:
            d2 = (np.einsum("nd,nd->n", Q, Q)[:, None] + np.einsum("md,md->m", tail, tail)[None]
                  - 2.0 * Q @ tail.T)
            d = np.minimum(d, np.sqrt(np.maximum(d2.min(axis=1), 0.0)))
        return d

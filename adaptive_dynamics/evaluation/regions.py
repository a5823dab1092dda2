"""Held-out data inside and outside the training region (no ROS import).

A held-out state is **inside** the training region when some training state lies within
``radius`` of it, the distance being the Euclidean norm of the joint-position difference
(rad; m for a prismatic joint) -- :data:`REGION_RADIUS` = 0.1 rad by default --, and
**outside** otherwise.  Joint positions decide because they set the configuration-
dependent dynamics (inertia, gravity, a payload's lever arm) that a learner of
``x = (q, qd, qdd)`` cannot infer from anywhere else; velocities and accelerations
repeat across motions.  A learner that extrapolates shows it outside; one that has
learnt only its trajectory's artefacts shows it inside but on another motion.

:func:`nearest_distance` uses scipy's KD-tree; :func:`split_nmse` gives the per-joint
nMSE of each part (``None`` for a part of fewer than :data:`MIN_SAMPLES` samples).
"""
from __future__ import annotations

from typing import Dict, Optional

import numpy as np
from scipy.spatial import cKDTree

from .metrics import nmse

__all__ = ["REGION_RADIUS", "MIN_SAMPLES", "nearest_distance", "inside_region", "split_nmse", "region_summary"]

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


def inside_region(train_q, test_q, radius: float = REGION_RADIUS) -> np.ndarray:
    """Boolean mask of the test states inside the training region."""
    if not (np.isfinite(radius) and radius > 0):
        raise ValueError(f"the region radius must be > 0, got {radius}")
    return nearest_distance(train_q, test_q) <= radius


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
    d = nearest_distance(train_q, test_q)
    inside = d <= radius
    return {"inside": inside, "radius_rad": float(radius), "distance": "nearest training joint position,"
            " Euclidean [rad]", "fraction_outside": round(float(1.0 - inside.mean()), 4) if d.size else None,
            "fraction_beyond_0.5_rad": round(float((d > 0.5).mean()), 4) if d.size else None,
            "distance_quartiles_rad": [round(float(x), 4) for x in np.quantile(d, [0.25, 0.5, 0.75])] if d.size
            else None}

"""Continuous joints (revolute without position limits) as plain angles (no ROS import).

Pinocchio models a URDF ``continuous`` joint with ``nq = 2`` (``cos θ, sin θ``), MuJoCo
with an unlimited hinge of one coordinate.  The suite's interfaces carry one angle per
joint (``JointState.position``), so every URDF is loaded with its continuous joints
rewritten as ``revolute`` with the sentinel limits ``±CONTINUOUS_LIMIT`` (the same
rotation about the same axis: dynamics, regressors and Jacobians are those of the
``nq = 2`` model at ``(cos θ, sin θ)`` -- tested against pinocchio on the original
model).  :func:`is_continuous` recognises them by those limits: no position-limit check
applies to them (velocity and effort still do), and errors are taken the shortest way
round (:func:`wrap_angle`).
"""
from __future__ import annotations

import xml.etree.ElementTree as ET

import numpy as np

__all__ = ["CONTINUOUS_LIMIT", "unbind_continuous", "is_continuous", "wrap_angle", "working_range"]

#: sentinel position limit [rad] of a rewritten continuous joint
CONTINUOUS_LIMIT = 1.0e4


def unbind_continuous(urdf_text: str) -> tuple[str, list[str]]:
    """The URDF text with every ``continuous`` joint made ``revolute`` with limits
    ``±CONTINUOUS_LIMIT`` (its effort and velocity limits kept), and the names of those
    joints; the text unchanged (and ``[]``) when it has none."""
    if "continuous" not in urdf_text:
        return urdf_text, []
    root = ET.fromstring(urdf_text)
    names = []
    for j in root.findall("joint"):
        if j.get("type") != "continuous":
            continue
        j.set("type", "revolute")
        lim = j.find("limit")
        if lim is None:
            lim = ET.SubElement(j, "limit")
        lim.set("lower", repr(-CONTINUOUS_LIMIT))
        lim.set("upper", repr(CONTINUOUS_LIMIT))
        names.append(j.get("name"))
    if not names:
        return urdf_text, []
    return ET.tostring(root, encoding="unicode"), names


def is_continuous(lower, upper) -> np.ndarray:
    """Which joints are continuous (their limits are the sentinel, or infinite)."""
    lo, hi = np.asarray(lower, dtype=float), np.asarray(upper, dtype=float)
    return (lo <= -CONTINUOUS_LIMIT) & (hi >= CONTINUOUS_LIMIT)


def wrap_angle(x):
    """``x`` mapped into ``[-pi, pi)``: the shortest way round."""
    return (np.asarray(x, dtype=float) + np.pi) % (2.0 * np.pi) - np.pi


def working_range(lower, upper) -> tuple[np.ndarray, np.ndarray]:
    """The limits with a continuous joint's replaced by one turn ``[-pi, pi]`` (for
    centring trajectories, sampling poses)."""
    lo, hi = np.array(lower, dtype=float), np.array(upper, dtype=float)
    c = is_continuous(lo, hi) | ~np.isfinite(lo) | ~np.isfinite(hi)
    lo[c], hi[c] = -np.pi, np.pi
    return lo, hi

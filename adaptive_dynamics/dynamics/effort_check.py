"""Can the drives hold it?  Start-time checks of joint torque against the effort limits
(no ROS import): the torque a set of poses (or a whole reference) needs under some
dynamics, its worst value per joint and where, and the joints beyond a share of their
limit.  Used by the simulator (its true gravity, payload included, over the joint
ranges), the trajectory node (the URDF model's inverse dynamics along the reference)
and the adaptive controller (the gravity of an estimate it loads from a file, over the
joint ranges) to warn before anything moves."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .continuous import working_range

__all__ = ["worst_torques", "over_limit", "describe", "range_poses"]


def range_poses(lower, upper, first=None, count: int = 256, seed: int = 0) -> np.ndarray:
    """``count`` poses: ``first`` (when given) and poses drawn uniformly inside the joint
    ranges (a continuous joint: one turn), deterministic for ``seed``."""
    lo, hi = working_range(lower, upper)
    rng = np.random.default_rng(seed)
    head = [] if first is None else [np.asarray(first, dtype=float)]
    return np.vstack(head + [rng.uniform(lo, hi, size=(count - len(head), len(lo)))])


def worst_torques(torque: Callable, Q, V=None, A=None) -> tuple[np.ndarray, np.ndarray]:
    """``(max_k |torque(q_k, v_k, a_k)_j|, k of that maximum)`` per joint over the rows of
    ``Q`` (``V``, ``A`` optional: ``torque(q)`` is then called with the pose only)."""
    Q = np.atleast_2d(np.asarray(Q, dtype=float))
    T = np.array([torque(Q[k]) if V is None else torque(Q[k], V[k], A[k]) for k in range(len(Q))])
    k = np.argmax(np.abs(T), axis=0)
    return np.abs(T)[k, np.arange(T.shape[1])], k


def over_limit(worst: np.ndarray, effort_limit, share: float = 1.0) -> np.ndarray:
    """Indices of the joints whose worst torque exceeds ``share`` of their effort limit."""
    return np.flatnonzero(np.asarray(worst) > share * np.asarray(effort_limit, dtype=float))


def describe(names, worst, where, effort_limit, joints, what: str) -> str:
    """One line per joint of ``joints``: name, torque, limit, where."""
    return "; ".join(f"joint {names[j]}: {what} {worst[j]:.3g} N m at {where[j]}, limit {effort_limit[j]:.3g} N m"
                     for j in joints)

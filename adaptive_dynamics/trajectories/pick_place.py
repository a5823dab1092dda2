"""Pick-and-place: repeated joint-space point-to-point motion with dwell times.

As in the PGPOL paper (Habich et al. 2019, section IV-B): the robot cycles between pick
and place configurations; the whole cycle is played at 33 %, 66 % and 100 % of the
nominal speed in turn (five cycles each) to change the dynamics during operation.  The
nominal timing is given here; the speed is applied with
:class:`~adaptive_dynamics.trajectories.base.ScaledTrajectory` (live) or
:func:`pgpol_speed_schedule` (the paper's sequence).

One cycle through waypoints ``w_0, ..., w_{N-1}`` (``N = 2``: pick, place)::

    dwell at w_0 | move w_0 -> w_1 | dwell at w_1 | move w_1 -> w_2 | ... | move w_{N-1} -> w_0

Each move is a minimum-jerk (quintic) profile ``s(u) = 10 u^3 - 15 u^4 + 6 u^5``,
``u = tau / move_time``: zero velocity and acceleration at both ends, so dwell and move
join with continuous position, velocity and acceleration.  ``t = 0`` is the start of the
dwell at ``w_0`` (the pick).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from .base import ArrayLike, Samples, ScaledTrajectory, Trajectory

__all__ = ["PickAndPlace", "minimum_jerk", "PGPOL_SPEEDS", "pgpol_speed_schedule"]

#: the PGPOL paper's speed settings (fractions of the maximum/nominal speed)
PGPOL_SPEEDS: Tuple[float, float, float] = (0.33, 0.66, 1.0)


def minimum_jerk(u: ArrayLike) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Minimum-jerk profile ``s(u)`` and its first two derivatives w.r.t. ``u``, with ``u``
    clipped to [0, 1]: ``s = 10u^3 - 15u^4 + 6u^5``, ``s(0)=0, s(1)=1``, ``s', s''`` zero
    at both ends."""
    u = np.clip(np.asarray(u, dtype=float), 0.0, 1.0)
    u2 = u * u
    s = u2 * u * (10.0 + u * (-15.0 + 6.0 * u))
    ds = u2 * (30.0 + u * (-60.0 + 30.0 * u))
    dds = u * (60.0 + u * (-180.0 + 120.0 * u))
    return s, ds, dds


class PickAndPlace(Trajectory):
    """Cyclic minimum-jerk motion between a pick and a place configuration.

    Parameters
    ----------
    q_pick, q_place:
        Joint configurations [rad], shape ``(n,)``.
    move_time:
        Nominal duration [s] of each move (> 0); scalar or one per move.
    dwell_time:
        Time [s] spent at rest at each waypoint (>= 0); scalar or one per waypoint.
    via:
        Optional extra waypoints visited after the place and before returning to the
        pick (multi-point pick-and-place, as the paper's star patterns).
    joint_names:
        Optional joint names for error messages.
    """

    def __init__(self, q_pick: ArrayLike, q_place: ArrayLike, move_time: ArrayLike = 2.0,
                 dwell_time: ArrayLike = 0.5, via: Optional[Sequence[ArrayLike]] = None,
                 joint_names: Optional[Sequence[str]] = None):
        pts = [np.asarray(q_pick, dtype=float).reshape(-1), np.asarray(q_place, dtype=float).reshape(-1)]
        pts += [np.asarray(v, dtype=float).reshape(-1) for v in (via or [])]
        n = pts[0].size
        for i, p in enumerate(pts):
            if p.shape != (n,) or not np.all(np.isfinite(p)):
                raise ValueError(f"waypoint {i} must be {n} finite values, got {p.tolist()}")
        self.waypoints = np.array(pts)                            # (N, n)
        N = len(pts)
        self.move_time = self._per(move_time, N, "move_time", positive=True)
        self.dwell_time = self._per(dwell_time, N, "dwell_time", positive=False)
        self.n = n
        self.joint_names = list(joint_names) if joint_names is not None else None
        # timeline: [dwell_0, move_0, dwell_1, move_1, ...]
        lengths = np.ravel(np.column_stack([self.dwell_time, self.move_time]))
        self._starts = np.concatenate([[0.0], np.cumsum(lengths)[:-1]])
        self._lengths = lengths
        self.period = float(lengths.sum())
        self.duration = None

    @staticmethod
    def _per(value, N: int, what: str, positive: bool) -> np.ndarray:
        arr = np.asarray(value, dtype=float)
        arr = np.full(N, float(arr)) if arr.ndim == 0 else arr.reshape(-1)
        if arr.shape != (N,) or not np.all(np.isfinite(arr)):
            raise ValueError(f"{what} must be a scalar or {N} finite values, got {value!r}")
        if np.any(arr <= 0) if positive else np.any(arr < 0):
            raise ValueError(f"{what} must be {'> 0' if positive else '>= 0'} [s], got {arr.tolist()}")
        return arr

    @property
    def q_pick(self) -> np.ndarray:
        return self.waypoints[0].copy()

    @property
    def q_place(self) -> np.ndarray:
        return self.waypoints[1].copy()

    def segment(self, t: float) -> Tuple[str, int]:
        """What the robot does at time ``t``: ``("dwell", i)`` at waypoint ``i`` or
        ``("move", i)`` from waypoint ``i`` to ``i + 1`` (cyclic).  Waypoint 0 is the pick,
        1 the place: grasp at the end of ``("dwell", 0)``, release at the end of
        ``("dwell", 1)`` (where a simulation toggles the payload)."""
        k = int(np.searchsorted(self._starts, float(t) % self.period, side="right") - 1)
        return ("dwell" if k % 2 == 0 else "move"), k // 2

    def segment_times(self) -> List[Tuple[float, str, int]]:
        """``(start time [s], kind, waypoint index)`` of every segment of one cycle."""
        return [(float(t0), "dwell" if k % 2 == 0 else "move", k // 2) for k, t0 in enumerate(self._starts)]

    def sample_many(self, ts: ArrayLike) -> Samples:
        t = np.mod(self._times(ts), self.period)
        k = np.clip(np.searchsorted(self._starts, t, side="right") - 1, 0, len(self._starts) - 1)
        i = k // 2
        N = len(self.waypoints)
        a = self.waypoints[i]                                     # (len, n)
        b = self.waypoints[(i + 1) % N]
        moving = (k % 2 == 1)
        T = self.move_time[i]
        u = np.where(moving, (t - self._starts[k]) / T, 0.0)
        s, ds, dds = minimum_jerk(u)
        s = np.where(moving, s, 0.0)
        d = b - a
        q = a + d * s[:, None]
        qd = d * (ds / T)[:, None] * moving[:, None]
        qdd = d * (dds / (T * T))[:, None] * moving[:, None]
        return q, qd, qdd


def pgpol_speed_schedule(traj: PickAndPlace, speeds: Sequence[float] = PGPOL_SPEEDS,
                         cycles_per_speed: int = 5, t0: float = 0.0) -> ScaledTrajectory:
    """The PGPOL experiment's sequence: ``cycles_per_speed`` cycles at each speed in turn
    (33 %, 66 %, 100 % of the nominal speed by default), then the last speed forever.
    Speed changes fall on cycle boundaries, i.e. during the dwell at the pick (at rest),
    so position, velocity and acceleration stay continuous."""
    return ScaledTrajectory.schedule(traj, speeds, cycles_per_speed, t0=t0)

"""Common interface of every joint-space reference trajectory, and live speed scaling.

No ROS import: the ``trajectory`` node samples these at control rate on ROS time.

* :class:`Trajectory` -- ``sample(t) -> (q, qd, qdd)``, ``sample_many(ts)``, ``n``,
  ``period``, ``duration``, ``joint_names``, ``check_limits(...)``.
* :class:`ScaledTrajectory` -- wraps a trajectory with a phase that advances at
  ``speed`` (live :meth:`~ScaledTrajectory.set_speed` keeps the phase, hence the
  position, continuous; an optional ramp keeps the velocity continuous too).
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["Trajectory", "ScaledTrajectory", "check_limit_arrays", "ACCELERATION_LIMIT"]

#: joint acceleration limit [rad/s^2] a trajectory is checked against when the URDF gives
#: none (the trajectory node's ``acceleration_limit`` default; experiments that choose
#: paths for it check the same)
ACCELERATION_LIMIT = 10.0

ArrayLike = Union[float, Sequence[float], np.ndarray]
Samples = Tuple[np.ndarray, np.ndarray, np.ndarray]

#: horizon [s] checked by ``check_limits`` for a trajectory that is neither periodic nor finite
DEFAULT_CHECK_HORIZON = 20.0


def _limit(value, n: int, what: str) -> Optional[np.ndarray]:
    if value is None:
        return None
    arr = np.asarray(value, dtype=float)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,):
        raise ValueError(f"{what}: expected a scalar or {n} values, got shape {arr.shape}")
    if np.any(np.isnan(arr)):
        raise ValueError(f"{what} contains NaN: {arr.tolist()}")
    return arr


def _name(i: int, joint_names: Optional[Sequence[str]]) -> str:
    if joint_names is not None and i < len(joint_names):
        return f"joint {joint_names[i]!r} (index {i})"
    return f"joint index {i}"


def check_limit_arrays(ts: np.ndarray, q: np.ndarray, qd: np.ndarray, qdd: np.ndarray, lower=None, upper=None,
                       vel_limit=None, acc_limit=None, joint_names: Optional[Sequence[str]] = None,
                       what: str = "trajectory") -> None:
    """Raise ``ValueError`` listing, per violated limit and joint, the worst sample.

    ``q``, ``qd``, ``qdd``: arrays (len(ts), n).  Limits: scalars or per joint; ``None``
    skips that check; velocity/acceleration limits are symmetric (|qd| <= vel_limit).
    The message names the joint (name and index), the violating value, the limit and
    the time [s] of the worst violation.
    """
    n = q.shape[1]
    lo, up = _limit(lower, n, "lower"), _limit(upper, n, "upper")
    vl, al = _limit(vel_limit, n, "vel_limit"), _limit(acc_limit, n, "acc_limit")
    problems: List[str] = []
    for label, values, bound, sign, unit in (
            ("position", q, lo, -1, "rad"), ("position", q, up, +1, "rad"),
            ("velocity", np.abs(qd), vl, +1, "rad/s"), ("acceleration", np.abs(qdd), al, +1, "rad/s^2")):
        if bound is None:
            continue
        excess = sign * (values - bound)  # > 0 where violated
        bad = np.flatnonzero(np.any(excess > 0, axis=0))
        for j in bad:
            k = int(np.argmax(excess[:, j]))
            if label == "position":
                rel = "below the lower" if sign < 0 else "above the upper"
                problems.append(f"{_name(j, joint_names)}: position {q[k, j]:.6g} {unit} {rel} limit "
                                f"{bound[j]:.6g} at t={ts[k]:.4f} s")
            else:
                raw = (qd if label == "velocity" else qdd)[k, j]
                problems.append(f"{_name(j, joint_names)}: {label} {raw:.6g} {unit} exceeds the limit "
                                f"+-{bound[j]:.6g} at t={ts[k]:.4f} s")
    if problems:
        raise ValueError(f"{what} violates the joint limits:\n  " + "\n  ".join(problems))


class Trajectory(ABC):
    """A joint-space reference ``t -> (q, qd, qdd)``.

    Attributes
    ----------
    n:
        Number of joints.
    period:
        Period [s] if the trajectory repeats (``sample(t + period) == sample(t)``), else ``None``.
    duration:
        Length [s] of a finite trajectory (held at its end state afterwards), ``None``
        for periodic/infinite ones.
    joint_names:
        Optional joint names (order of every array), used in error messages.
    """

    n: int
    period: Optional[float] = None
    duration: Optional[float] = None
    joint_names: Optional[List[str]] = None

    @abstractmethod
    def sample_many(self, ts: ArrayLike) -> Samples:
        """Positions, velocities, accelerations at the times ``ts`` [s]: three arrays of
        shape ``(len(ts), n)`` [rad, rad/s, rad/s^2]."""

    def sample(self, t: float) -> Samples:
        """``(q, qd, qdd)`` at the scalar time ``t`` [s]: three arrays of shape ``(n,)``."""
        q, qd, qdd = self.sample_many(np.array([float(t)]))
        return q[0], qd[0], qdd[0]

    def check_horizon(self) -> float:
        """Time span [s] :meth:`check_limits` samples by default: one period, the duration,
        or :data:`DEFAULT_CHECK_HORIZON` for an infinite aperiodic trajectory."""
        return float(self.period or self.duration or DEFAULT_CHECK_HORIZON)

    def check_limits(self, lower=None, upper=None, vel_limit=None, acc_limit=None, n_check: int = 2000,
                     horizon: Optional[float] = None) -> None:
        """Validate the trajectory against joint limits on a time grid.

        Parameters
        ----------
        lower, upper:
            Position limits [rad] (scalar or per joint; ``None`` = unchecked).
        vel_limit, acc_limit:
            Symmetric velocity [rad/s] and acceleration [rad/s^2] limits (``None`` = unchecked).
        n_check:
            Number of samples on ``[0, horizon]`` (endpoints included).
        horizon:
            Checked time span [s]; default :meth:`check_horizon`.

        Raises ``ValueError`` naming each violating joint (name and index), the value, the
        limit and the time of the worst violation.  A sampled check: peaks between samples
        can exceed a limit by a tiny amount (keep a margin, or raise ``n_check``).
        """
        if n_check < 2:
            raise ValueError(f"n_check must be >= 2, got {n_check}")
        T = self.check_horizon() if horizon is None else float(horizon)
        ts = np.linspace(0.0, T, int(n_check))
        q, qd, qdd = self.sample_many(ts)
        check_limit_arrays(ts, q, qd, qdd, lower, upper, vel_limit, acc_limit, self.joint_names,
                           what=type(self).__name__)

    # helpers for subclasses ----------------------------------------------------
    @staticmethod
    def _times(ts: ArrayLike) -> np.ndarray:
        t = np.asarray(ts, dtype=float)
        if t.ndim == 0:
            t = t.reshape(1)
        if t.ndim != 1:
            raise ValueError(f"times must be a 1-D array, got shape {t.shape}")
        if not np.all(np.isfinite(t)):
            raise ValueError("times must be finite")
        return t


@dataclass
class _Segment:
    t0: float       # start time [s]
    p0: float       # phase at t0 [s of the wrapped trajectory's time]
    s0: float       # speed at t0
    s1: float       # target speed
    ramp: float     # duration of the linear speed ramp s0 -> s1 [s] (0 = jump)

    def phase(self, t: np.ndarray):
        tau = t - self.t0
        if self.ramp > 0:
            r = self.ramp
            acc = (self.s1 - self.s0) / r
            in_ramp = tau < r
            tr = np.minimum(tau, r)
            p = self.p0 + self.s0 * tr + 0.5 * acc * tr * tr + self.s1 * np.maximum(tau - r, 0.0)
            sd = np.where(in_ramp, self.s0 + acc * tr, self.s1)
            sdd = np.where(in_ramp, acc, 0.0)
            return p, sd, sdd
        return self.p0 + self.s1 * tau, np.full_like(tau, self.s1), np.zeros_like(tau)


class ScaledTrajectory(Trajectory):
    """``traj`` played with a phase that advances at ``speed``: q(t) = traj.q(phi(t)).

    ``dphi/dt = speed``, so ``qd = traj.qd(phi) * speed`` and, at constant speed,
    ``qdd = traj.qdd(phi) * speed^2`` (during a ramp: ``+ traj.qd(phi) * dspeed/dt``).
    Speed 1 is the nominal timing, 0.33 plays it three times slower, 0 pauses.

    :meth:`set_speed` changes the speed live at a time ``t``: the phase is integrated,
    so the position never jumps; with ``ramp_time > 0`` the speed changes linearly over
    that time and the velocity does not jump either.  Sampling is a pure function of
    ``t`` (the history of speed changes is kept), so references published ahead of
    time stay valid until a later speed change at an earlier time overrides them.

    Parameters
    ----------
    traj:
        The nominal trajectory.
    speed:
        Initial speed factor (>= 0) from ``t = t0``.
    ramp_time:
        Default ramp duration [s] of :meth:`set_speed` (0 = immediate change).
    t0:
        Time [s] at which the phase is 0.
    """

    def __init__(self, traj: Trajectory, speed: float = 1.0, ramp_time: float = 0.0, t0: float = 0.0):
        self.base = traj
        self.n = traj.n
        self.joint_names = traj.joint_names
        self.ramp_time = self._check_ramp(ramp_time)
        s = self._check_speed(speed)
        self._segments: List[_Segment] = [_Segment(float(t0), 0.0, s, s, 0.0)]
        self._starts: List[float] = [float(t0)]
        self._t_last = float(t0)

    # ------------------------------------------------------------------ speed
    @staticmethod
    def _check_speed(speed) -> float:
        try:
            s = float(speed)
        except (TypeError, ValueError):
            raise ValueError(f"speed must be a number, got {speed!r}") from None
        if not math.isfinite(s) or s < 0:
            raise ValueError(f"speed must be finite and >= 0, got {speed!r}")
        return s

    @staticmethod
    def _check_ramp(ramp) -> float:
        r = float(ramp)
        if not math.isfinite(r) or r < 0:
            raise ValueError(f"ramp_time must be finite and >= 0, got {ramp!r}")
        return r

    @property
    def speed(self) -> float:
        """The (target) speed of the latest segment."""
        return self._segments[-1].s1

    @property
    def period(self) -> Optional[float]:  # type: ignore[override]
        """Period [s] while the speed has never changed (``None`` once it has, or if the
        base is aperiodic, or paused)."""
        if self.base.period is None or self.speed == 0 or len(self._segments) > 1:
            return None
        return self.base.period / self.speed

    @property
    def duration(self) -> Optional[float]:  # type: ignore[override]
        if self.base.duration is None or self.speed == 0 or len(self._segments) > 1:
            return None
        return self.base.duration / self.speed

    def phase(self, ts: ArrayLike):
        """``(phi, dphi/dt, d2phi/dt2)`` at the times ``ts`` (arrays)."""
        t = self._times(ts)
        idx = np.searchsorted(np.asarray(self._starts), t, side="right") - 1
        idx = np.clip(idx, 0, len(self._segments) - 1)
        p = np.empty_like(t)
        sd = np.empty_like(t)
        sdd = np.empty_like(t)
        for i in np.unique(idx):
            m = idx == i
            p[m], sd[m], sdd[m] = self._segments[i].phase(t[m])
        return p, sd, sdd

    def set_speed(self, speed: float, t: Optional[float] = None, ramp_time: Optional[float] = None) -> None:
        """Change the speed from time ``t`` [s] on without a jump in position.

        ``t`` defaults to the latest time sampled (a node that publishes references ahead
        of time thus keeps the ones already published valid).  Scheduled changes after
        ``t`` are dropped.  ``ramp_time`` [s] (default: the constructor's) ramps the speed
        linearly from its current value, so the velocity stays continuous; with 0 the
        velocity jumps by the speed ratio.
        """
        s = self._check_speed(speed)
        r = self.ramp_time if ramp_time is None else self._check_ramp(ramp_time)
        t = self._t_last if t is None else float(t)
        if not math.isfinite(t):
            raise ValueError(f"t must be finite, got {t!r}")
        p, sd, _ = self.phase(np.array([t]))
        while len(self._segments) > 1 and self._starts[-1] >= t:
            self._segments.pop()
            self._starts.pop()
        if self._starts[-1] >= t:  # replacing the very first segment (t <= t0)
            self._segments.pop()
            self._starts.pop()
        seg = _Segment(t, float(p[0]), float(sd[0]), s, r if float(sd[0]) != s else 0.0)
        self._segments.append(seg)
        self._starts.append(t)

    @classmethod
    def schedule(cls, traj: Trajectory, speeds: Sequence[float], cycles_per_speed: Union[int, Sequence[int]] = 5,
                 t0: float = 0.0) -> "ScaledTrajectory":
        """Play ``cycles_per_speed`` periods of a periodic ``traj`` at each speed in turn
        (e.g. the PGPOL pick-and-place experiment: 5 cycles each at 33 %, 66 %, 100 %),
        then keep the last speed.  Changes happen at period boundaries (phase a multiple
        of ``traj.period``), where a pick-and-place trajectory is at rest."""
        if traj.period is None:
            raise ValueError("schedule() needs a periodic trajectory (traj.period is None)")
        speeds = [cls._check_speed(s) for s in speeds]
        if not speeds or any(s == 0 for s in speeds[:-1]):
            raise ValueError(f"speeds must be non-empty and > 0 (except the last), got {speeds}")
        cycles = [int(cycles_per_speed)] * len(speeds) if np.ndim(cycles_per_speed) == 0 else list(cycles_per_speed)
        if len(cycles) != len(speeds) or any(c < 1 for c in cycles):
            raise ValueError(f"cycles_per_speed must be >= 1, one per speed, got {cycles_per_speed}")
        out = cls(traj, speeds[0], t0=t0)
        t, p = float(t0), 0.0
        for s, c, s_next in zip(speeds[:-1], cycles[:-1], speeds[1:]):
            t += c * traj.period / s
            p += c * traj.period
            out._segments.append(_Segment(t, p, s_next, s_next, 0.0))
            out._starts.append(t)
        return out

    def change_times(self) -> List[float]:
        """Start times [s] of every constant-speed (or ramp) segment."""
        return list(self._starts)

    # ------------------------------------------------------------------ sampling
    def sample_many(self, ts: ArrayLike) -> Samples:
        t = self._times(ts)
        if t.size:
            self._t_last = float(t[-1])
        p, sd, sdd = self.phase(t)
        q, dq, ddq = self.base.sample_many(p)
        return q, dq * sd[:, None], ddq * (sd * sd)[:, None] + dq * sdd[:, None]

    def check_horizon(self) -> float:
        return float(self.base.check_horizon())

    def check_limits(self, lower=None, upper=None, vel_limit=None, acc_limit=None, n_check: int = 2000,
                     horizon: Optional[float] = None, speed: Optional[float] = None) -> None:
        """Check the base trajectory played at a constant ``speed`` (default: the current
        target speed); see :meth:`Trajectory.check_limits`.  ``horizon`` is in the base
        trajectory's time.  Use it to validate a new speed before :meth:`set_speed`
        (ramps add ``qd * dspeed/dt`` to the acceleration, not checked here)."""
        s = self.speed if speed is None else self._check_speed(speed)
        T = self.base.check_horizon() if horizon is None else float(horizon)
        phases = np.linspace(0.0, T, int(n_check))
        q, dq, ddq = self.base.sample_many(phases)
        ts = phases / s if s > 0 else phases
        check_limit_arrays(ts, q, dq * s, ddq * s * s, lower, upper, vel_limit, acc_limit, self.joint_names,
                           what=f"{type(self.base).__name__} at speed {s:g}")

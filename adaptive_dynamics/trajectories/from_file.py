"""Trajectories read from a file: what ``adaptive-dynamics excite`` writes, or any CSV of
joint positions over time (no ROS import).

:func:`load_trajectory_file` reads

* the **JSON** ``excite`` writes (``kind: swevers_fourier``: the Fourier coefficients):
  an :class:`~adaptive_dynamics.trajectories.excitation.ExcitationTrajectory`, exact and
  periodic, q, qd, qdd analytic.  Given the CSV ``excite`` wrote, its JSON sidecar (same
  name, ``.json``) is read instead when it is there -- after checking that the CSV's
  positions are that JSON's samples, so a CSV edited after ``excite`` is not silently
  replaced;
* any other **CSV**: a ``time`` column [s, increasing] and a ``<joint>/position`` column
  [rad] per joint (``<joint>/velocity`` and ``<joint>/acceleration`` columns, if present,
  are not used): a :class:`SplineTrajectory`, the positions interpolated by
  ``scipy.interpolate.CubicSpline``, q, qd, qdd its value and derivatives.  Periodic
  (``bc_type="periodic"``, period = the time span) when a JSON sidecar says so
  (``"period"`` equal to the span, or ``"periodic": true``); else played once from the
  first time, then held at the last sample (qd = qdd = 0), as a finite trajectory.

With ``joint_names`` (the robot's) the file's joints are matched by name and put in that
order; a joint missing from the file or one the robot does not have is an error naming
both lists.  Limits are not checked here: the ``trajectory`` node checks every type
against the URDF's limits at start.
"""
from __future__ import annotations

import json
import math
import os
from typing import Optional, Sequence

import numpy as np

from .base import ArrayLike, Samples, Trajectory
from .excitation import ExcitationTrajectory

__all__ = ["Approach", "SplineTrajectory", "load_trajectory_file", "read_trajectory_csv"]

#: largest difference [rad] between a CSV's positions and its JSON sidecar's samples for the
#: JSON to be played in its place (``excite`` writes 9 significant digits)
CSV_JSON_TOLERANCE = 1e-6


class SplineTrajectory(Trajectory):
    """Joint positions sampled at ``times`` [s], interpolated by a cubic spline.

    ``positions``: (K, n) [rad].  ``periodic``: the first and last samples are the same
    state (checked, 1e-6 rad) and the trajectory repeats with period ``times[-1] -
    times[0]``; else it is finite (``duration`` = that span): before the first time the
    first sample, after the last the last one, at rest.  Time 0 of the trajectory is
    ``times[0]``.
    """

    def __init__(self, times: ArrayLike, positions: ArrayLike, *, periodic: bool = False,
                 joint_names: Optional[Sequence[str]] = None):
        from scipy.interpolate import CubicSpline  # lazy: scipy only for this type

        t = np.asarray(times, dtype=float).reshape(-1)
        q = np.asarray(positions, dtype=float)
        if q.ndim == 1:
            q = q.reshape(-1, 1)
        if q.ndim != 2 or q.shape[0] != t.size:
            raise ValueError(f"positions must be (len(times), n) = ({t.size}, n), got {np.shape(positions)}")
        if t.size < 4:
            raise ValueError(f"a spline trajectory needs at least 4 samples, got {t.size}")
        if not (np.all(np.isfinite(t)) and np.all(np.isfinite(q))):
            raise ValueError("times and positions must be finite")
        if np.any(np.diff(t) <= 0):
            k = int(np.flatnonzero(np.diff(t) <= 0)[0])
            raise ValueError(f"times must increase: row {k + 1} ({t[k + 1]!r} s) follows {t[k]!r} s")
        self.n = q.shape[1]
        self.joint_names = list(joint_names) if joint_names is not None else None
        if self.joint_names is not None and len(self.joint_names) != self.n:
            raise ValueError(f"{len(self.joint_names)} joint names for {self.n} joints")
        self.t0 = float(t[0])
        span = float(t[-1] - t[0])
        q = q.copy()
        if periodic:
            gap = np.abs(q[-1] - q[0])
            if gap.max() > 1e-6:
                j = int(np.argmax(gap))
                raise ValueError(f"a periodic trajectory must end where it starts: joint {self._label(j)} starts"
                                 f" at {q[0, j]:.6g} rad and ends at {q[-1, j]:.6g} rad")
            q[-1] = q[0]
        self.spline = CubicSpline(t - self.t0, q, axis=0, bc_type="periodic" if periodic else "not-a-knot")
        self.period = span if periodic else None
        self.duration = None if periodic else span
        self.q_first, self.q_last = q[0].copy(), q[-1].copy()

    def _label(self, j: int) -> str:
        return repr(self.joint_names[j]) if self.joint_names else f"index {j}"

    def sample_many(self, ts: ArrayLike) -> Samples:
        t = self._times(ts)
        if self.period is not None:
            t = np.mod(t, self.period)
            return self.spline(t), self.spline(t, 1), self.spline(t, 2)
        inside = (t >= 0.0) & (t <= self.duration)
        tc = np.clip(t, 0.0, self.duration)
        q = self.spline(tc)
        qd = np.where(inside[:, None], self.spline(tc, 1), 0.0)
        qdd = np.where(inside[:, None], self.spline(tc, 2), 0.0)
        return q, qd, qdd

    def reordered(self, index: Sequence[int], joint_names: Sequence[str]) -> "SplineTrajectory":
        """The same trajectory with its joints ``index`` (file order) in that order."""
        out = object.__new__(SplineTrajectory)
        out.__dict__.update(self.__dict__)
        from scipy.interpolate import PPoly  # lazy
        out.spline = PPoly(self.spline.c[:, :, list(index)], self.spline.x, extrapolate=self.spline.extrapolate)
        out.n, out.joint_names = len(index), list(joint_names)
        out.q_first, out.q_last = self.q_first[list(index)], self.q_last[list(index)]
        return out


def read_trajectory_csv(path: str):
    """``(times (K,), positions (K, n), joint names)`` from a CSV with a ``time`` column and
    ``<joint>/position`` columns (the order they come in)."""
    with open(path, newline="") as fh:
        header = fh.readline().strip().split(",")
    header = [h.strip() for h in header]
    if "time" not in header:
        raise ValueError(f"trajectory file {path}: no 'time' column in its header {header[:6]}"
                         f"{'...' if len(header) > 6 else ''} (expected time, <joint>/position, ...)")
    pos = [i for i, h in enumerate(header) if h.endswith("/position")]
    if not pos:
        raise ValueError(f"trajectory file {path}: no '<joint>/position' column in its header")
    try:
        data = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
    except ValueError as exc:
        raise ValueError(f"trajectory file {path}: not a numeric CSV below the header ({exc})") from None
    if data.shape[1] != len(header):
        raise ValueError(f"trajectory file {path}: {data.shape[1]} columns of data for {len(header)} names")
    names = [header[i][: -len("/position")] for i in pos]
    return data[:, header.index("time")], data[:, pos], names


def _match(file_names: Optional[Sequence[str]], n_file: int, path: str, robot: Optional[Sequence[str]]):
    """Index of each of the robot's joints among the file's (None: keep the file's order)."""
    if robot is None:
        return None
    robot = list(robot)
    if file_names is None:
        if n_file != len(robot):
            raise ValueError(f"trajectory file {path} has {n_file} joints (unnamed), the robot has {len(robot)}:"
                             f" {robot}")
        return list(range(n_file))
    file_names = list(file_names)
    missing = [j for j in robot if j not in file_names]
    extra = [j for j in file_names if j not in robot]
    if missing or extra or n_file != len(robot):
        raise ValueError(f"trajectory file {path} is for other joints: it has {n_file} {file_names}, the robot"
                         f" has {len(robot)} {robot}" + (f"; missing from the file: {missing}" if missing else "")
                         + (f"; not joints of the robot: {extra}" if extra else ""))
    return [file_names.index(j) for j in robot]


def _reorder_excitation(tr: ExcitationTrajectory, index, names) -> ExcitationTrajectory:
    out = ExcitationTrajectory(tr.a[index], tr.b[index], tr.q0[index], tr.period, names,
                               condition_number=tr.condition_number, logdet=tr.logdet, margins=tr.margins, **tr.info)
    return out


def _periodic_flag(side: Optional[dict], span: float) -> bool:
    if not side:
        return False
    if "periodic" in side:
        return bool(side["periodic"])
    p = side.get("period")
    return p is not None and math.isfinite(float(p)) and abs(float(p) - span) <= 1e-6 * max(1.0, span)


def load_trajectory_file(path, joint_names: Optional[Sequence[str]] = None) -> Trajectory:
    """The trajectory of ``path`` (``.json`` of ``excite``, or a ``.csv``; see the module
    docstring), its joints in the order of ``joint_names`` (the robot's) when given.

    ``FileNotFoundError`` for a missing file; ``ValueError`` for a file that is not a
    trajectory, or one for other joints."""
    path = os.fspath(path or "")
    if not path:
        raise ValueError("no trajectory file given (trajectory_file is empty)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"trajectory file {path!r} not found"
                                + ("" if os.path.isabs(path) else f" (relative to {os.getcwd()})"))
    ext = os.path.splitext(path)[1].lower()
    side, csv = None, None
    if ext == ".json":
        side_path = path
    else:
        csv, side_path = path, ExcitationTrajectory.sidecar(path)
    if os.path.isfile(side_path):
        try:
            with open(side_path) as fh:
                side = json.load(fh)
        except (OSError, ValueError) as exc:
            raise ValueError(f"trajectory file {side_path}: not readable JSON ({exc})") from None
        if not isinstance(side, dict):
            raise ValueError(f"trajectory file {side_path}: expected a JSON object")
    if side is not None and side.get("kind") == "swevers_fourier":
        try:
            tr = ExcitationTrajectory.from_dict(side)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"trajectory file {side_path}: not a valid excite trajectory ({exc})") from None
        if not (np.all(np.isfinite(tr.a)) and np.all(np.isfinite(tr.b)) and np.all(np.isfinite(tr.q0))):
            raise ValueError(f"trajectory file {side_path}: coefficients must be finite")
        if csv is not None:        # the CSV named: it must be what this JSON plays
            t, q, names = read_trajectory_csv(csv)
            if tr.joint_names is not None and names != list(tr.joint_names):
                raise ValueError(f"{csv} and its JSON {side_path} name different joints ({names} vs"
                                 f" {tr.joint_names}): pass one of them")
            dev = float(np.abs(tr.sample_many(t)[0] - q).max()) if q.shape[1] == tr.n else math.inf
            if not dev <= CSV_JSON_TOLERANCE:
                raise ValueError(f"{csv} differs from the samples of its JSON {side_path} (by {dev:.3g} rad): pass"
                                 " the one to play (the .json plays the Fourier series, a .csv alone is"
                                 " interpolated)")
        index = _match(tr.joint_names, tr.n, path, joint_names)
        return tr if index is None else _reorder_excitation(tr, index, list(joint_names))
    if csv is None:                # a JSON that is not excite's: its CSV, if any
        csv = os.path.splitext(path)[0] + ".csv"
        if not os.path.isfile(csv):
            raise ValueError(f"trajectory file {path}: neither excite's Fourier coefficients"
                             f" (kind swevers_fourier) nor a CSV beside it ({csv})")
    t, q, names = read_trajectory_csv(csv)
    tr = SplineTrajectory(t, q, periodic=_periodic_flag(side, float(t[-1] - t[0])), joint_names=names)
    index = _match(names, tr.n, csv, joint_names)
    return tr if index is None else tr.reordered(index, list(joint_names))


class Approach(Trajectory):
    """A move from ``q_from`` (the robot's pose) to the start of ``base`` (a file's
    positions are absolute), then ``base``: a minimum-jerk (quintic) move
    ``q_from + (q_start - q_from) s(t / T)``, ``s(u) = 10 u^3 - 15 u^4 + 6 u^5``, at rest at
    both ends (``excite``'s trajectories start at rest), then ``base(t - T)``.

    ``T`` (default) keeps the move's peak velocity ``15/8 |dq| / T`` and peak acceleration
    ``10/sqrt(3) |dq| / T^2`` within ``fraction`` of each joint's limits, at least
    ``min_time``.  Not periodic (``base``'s period shifted by ``T`` after the move)."""

    def __init__(self, base: Trajectory, q_from: ArrayLike, *, velocity_limit: ArrayLike, acceleration_limit: ArrayLike,
                 fraction: float = 0.2, min_time: float = 2.0, time: Optional[float] = None):
        self.base = base
        self.q_from = np.asarray(q_from, dtype=float).reshape(-1)
        q_start, qd_start, _ = base.sample(0.0)
        self.q_start = np.asarray(q_start, dtype=float)
        if self.q_from.shape != self.q_start.shape:
            raise ValueError(f"q_from has {self.q_from.size} values, the trajectory {self.q_start.size} joints")
        if not np.all(np.isfinite(self.q_from)):
            raise ValueError("q_from must be finite")
        dq = np.abs(self.q_start - self.q_from)
        if time is None:
            v = fraction * np.asarray(velocity_limit, dtype=float)
            a = fraction * np.asarray(acceleration_limit, dtype=float)
            time = max(float(min_time), float(np.max(15.0 / 8.0 * dq / v)),
                       float(np.sqrt(np.max(10.0 / math.sqrt(3.0) * dq / a))))
        self.time = float(time)
        self.n = self.q_start.size
        self.joint_names = getattr(base, "joint_names", None)
        self.period = None
        self.duration = None if base.duration is None else self.time + base.duration

    def sample_many(self, ts: ArrayLike) -> Samples:
        t = np.asarray(ts, dtype=float).reshape(-1)
        q, qd, qdd = (np.empty((t.size, self.n)) for _ in range(3))
        before = t < self.time
        if np.any(before):
            u = np.clip(t[before] / self.time, 0.0, None)
            s = u ** 3 * (10 - 15 * u + 6 * u ** 2)
            sd = 30 * u ** 2 * (1 - u) ** 2 / self.time
            sdd = 60 * u * (1 - u) * (1 - 2 * u) / self.time ** 2
            d = self.q_start - self.q_from
            q[before] = self.q_from + np.outer(s, d)
            qd[before], qdd[before] = np.outer(sd, d), np.outer(sdd, d)
        if np.any(~before):
            q[~before], qd[~before], qdd[~before] = self.base.sample_many(t[~before] - self.time)
        return q, qd, qdd

    def check_horizon(self) -> float:
        return self.time + self.base.check_horizon()

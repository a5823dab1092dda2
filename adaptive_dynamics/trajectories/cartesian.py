"""Cartesian end-effector paths (Lissajous, figure-8, square + circle, z sine) turned into joint references
(:class:`CartesianTrajectory`) or kept as task-space references (:class:`CartesianPath`).

The end-effector position follows ``p(t) = p_start + R_path (A * (sin(k w t + phi) - sin(phi)))``
(``w = 2 pi / period``, integer harmonics ``k`` so the path is periodic, and ``p(0) =
p_start``) -- or the square followed by its inscribed circle of :class:`SquareCirclePath`
(the PGPOL paper's Fig. 3a) -- while the orientation is held at the start orientation.  The joint path is
computed once, at construction, by closed-loop differential IK on a time grid
(default 1 kHz) over one period:

1. predictor: ``qd = J^# xd_dot + (I - J^# J) k0 (q_start - q)`` (damped least squares
   ``J^# = J^T (J J^T + lambda^2 I)^-1``; the null-space term keeps a redundant arm near
   its start posture), ``q <- q + dt qd``;
2. corrector: Newton steps ``q <- q + J^# e`` on the pose error ``e = [p_d - p;
   log3(R_d R^T)]`` at the new grid time until ``|e| < 1e-12`` (at most ``newton_iters``);
3. the period is repeated from its end state until the joint path closes
   (``|q(T) - q(0)| < closure_tol``): the null-space attraction makes this a limit
   cycle, so the joint path is periodic even for a redundant arm (its start posture can
   then differ from ``q_start`` in the null space only: see :attr:`start_offset`).

The grid is interpolated with a periodic ``scipy.interpolate.CubicSpline``: ``sample(t)``
is cheap, and ``qd``/``qdd`` are the spline's analytic derivatives (consistent with ``q``).

The joint velocity at ``t = 0`` is generally not zero (the path starts moving at once):
start from rest with ``ScaledTrajectory(traj, speed=0)`` followed by ``set_speed(1.0,
t=0, ramp_time=...)``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence, Union

import numpy as np
import pinocchio as pin
from scipy.interpolate import CubicSpline

from adaptive_dynamics.dynamics.model import RobotModel
from .base import ArrayLike, Samples, Trajectory
from .pick_place import minimum_jerk

__all__ = ["LissajousPath", "SquareCirclePath", "lissajous", "lissajous3d", "figure_eight", "square_circle", "z_sine",
           "CartesianTrajectory", "CartesianPath"]

_PLANES = {"xy": (0, 1, 2), "xz": (0, 2, 1), "yz": (1, 2, 0)}


class LissajousPath:
    """Periodic position offset ``x(t) = R (A * (sin(k w t + phi) - sin(phi)))`` [m], x(0) = 0.

    Parameters
    ----------
    amplitude:
        ``A`` [m], 3 values (path axes).
    harmonics:
        ``k``, 3 non-negative integers (0 = axis unused); the path period is ``period``.
    phase:
        ``phi`` [rad], 3 values or a scalar.
    period:
        Period [s] of the fundamental (> 0).
    rotation:
        3x3 rotation from the path axes to the robot base frame (default identity).
    """

    def __init__(self, amplitude: ArrayLike, harmonics: ArrayLike, phase: ArrayLike = 0.0, period: float = 4.0,
                 rotation: Optional[ArrayLike] = None):
        A = np.asarray(amplitude, dtype=float).reshape(-1)
        k = np.asarray(harmonics, dtype=float).reshape(-1)
        ph = np.broadcast_to(np.asarray(phase, dtype=float), (3,)).copy()
        if A.shape != (3,) or k.shape != (3,):
            raise ValueError(f"amplitude and harmonics need 3 values, got {A.shape}, {k.shape}")
        if not (np.all(np.isfinite(A)) and np.all(np.isfinite(ph))):
            raise ValueError("amplitude and phase must be finite")
        if np.any(k < 0) or np.any(k != np.round(k)):
            raise ValueError(f"harmonics must be non-negative integers (periodic path), got {k.tolist()}")
        period = float(period)
        if not (math.isfinite(period) and period > 0):
            raise ValueError(f"period must be > 0 [s], got {period!r}")
        R = np.eye(3) if rotation is None else np.asarray(rotation, dtype=float)
        if R.shape != (3, 3) or not np.allclose(R @ R.T, np.eye(3), atol=1e-9) or np.linalg.det(R) < 0:
            raise ValueError("rotation must be a 3x3 rotation matrix")
        self.amplitude, self.harmonics, self.phase, self.period, self.rotation = A, k, ph, period, R
        self._w = 2.0 * math.pi / period * k

    def sample_many(self, ts: ArrayLike):
        """Offset, velocity, acceleration in the base frame: three (len, 3) arrays."""
        t = np.asarray(ts, dtype=float).reshape(-1)
        arg = t[:, None] * self._w + self.phase
        s, c = np.sin(arg), np.cos(arg)
        x = self.amplitude * (s - np.sin(self.phase))
        xd = self.amplitude * self._w * c
        xdd = -self.amplitude * self._w ** 2 * s
        R = self.rotation
        return x @ R.T, xd @ R.T, xdd @ R.T


class SquareCirclePath:
    """A square followed by its inscribed circle, in one plane (PGPOL paper, Fig. 3a).

    Plane coordinates (u, v) [m], the start point at the origin: the middle of the
    square's bottom edge.  The square (side ``side``) is driven counter-clockwise from
    there -- half edge, three edges, half edge back to the start -- then the inscribed
    circle (radius ``side / 2``, centre ``(0, side / 2)``), which touches the bottom edge
    at the start point, once counter-clockwise.  Every straight segment and the circle
    are minimum-jerk profiles (:func:`~adaptive_dynamics.trajectories.pick_place.minimum_jerk`
    of the arc length / angle), so the path stops at each corner and at the start,
    and position, velocity and acceleration are continuous (zero velocity at t = 0).

    Parameters
    ----------
    side:
        Side of the square [m] (> 0).
    edge_time:
        Duration of a full edge [s] (half edges take half of it).
    circle_time:
        Duration of the circle [s].
    dwell_time:
        Rest at the start point after the circle [s] (>= 0).
    rotation:
        3x3 rotation from (u, v, normal) to the robot base frame (default identity).
    """

    def __init__(self, side: float = 0.2, edge_time: float = 1.0, circle_time: float = 3.0,
                 dwell_time: float = 0.0, rotation: Optional[ArrayLike] = None):
        for name, value, positive in (("side", side, True), ("edge_time", edge_time, True),
                                      ("circle_time", circle_time, True), ("dwell_time", dwell_time, False)):
            v = float(value)
            if not math.isfinite(v) or (v <= 0 if positive else v < 0):
                raise ValueError(f"{name} must be {'> 0' if positive else '>= 0'}, got {value!r}")
        R = np.eye(3) if rotation is None else np.asarray(rotation, dtype=float)
        if R.shape != (3, 3) or not np.allclose(R @ R.T, np.eye(3), atol=1e-9) or np.linalg.det(R) < 0:
            raise ValueError("rotation must be a 3x3 rotation matrix")
        self.side, self.edge_time, self.circle_time = float(side), float(edge_time), float(circle_time)
        self.dwell_time, self.rotation = float(dwell_time), R
        h = 0.5 * self.side
        corners = [(0.0, 0.0), (h, 0.0), (h, self.side), (-h, self.side), (-h, 0.0), (0.0, 0.0)]
        self._lines = []   # (t0, T, start, end)
        t = 0.0
        for a, b in zip(corners[:-1], corners[1:]):
            a, b = np.array(a), np.array(b)
            T = self.edge_time * np.linalg.norm(b - a) / self.side
            self._lines.append((t, T, a, b))
            t += T
        self._circle_t0 = t
        self.period = t + self.circle_time + self.dwell_time

    def sample_many(self, ts: ArrayLike):
        """Offset, velocity, acceleration in the base frame: three (len, 3) arrays."""

        t = np.mod(np.asarray(ts, dtype=float).reshape(-1), self.period)
        X, Xd, Xdd = (np.zeros((t.size, 3)) for _ in range(3))
        for t0, T, a, b in self._lines:
            m = (t >= t0) & (t < t0 + T)
            if m.any():
                s, ds, dds = minimum_jerk((t[m] - t0) / T)
                d = b - a
                X[m, :2] = a + np.outer(s, d)
                Xd[m, :2] = np.outer(ds / T, d)
                Xdd[m, :2] = np.outer(dds / (T * T), d)
        m = (t >= self._circle_t0) & (t < self._circle_t0 + self.circle_time)
        if m.any():
            T = self.circle_time
            s, ds, dds = minimum_jerk((t[m] - self._circle_t0) / T)
            r = 0.5 * self.side
            phi = -0.5 * math.pi + 2.0 * math.pi * s
            w, wd = 2.0 * math.pi * ds / T, 2.0 * math.pi * dds / (T * T)
            c, sn = np.cos(phi), np.sin(phi)
            X[m, 0], X[m, 1] = r * c, r + r * sn
            Xd[m, 0], Xd[m, 1] = -r * w * sn, r * w * c
            Xdd[m, 0] = -r * wd * sn - r * w * w * c
            Xdd[m, 1] = r * wd * c - r * w * w * sn
        R = self.rotation
        return X @ R.T, Xd @ R.T, Xdd @ R.T


def square_circle(side: float = 0.2, edge_time: float = 1.0, circle_time: float = 3.0, dwell_time: float = 0.0,
                  plane: Union[str, ArrayLike] = "xz") -> SquareCirclePath:
    """:class:`SquareCirclePath` in ``plane`` ("xy", "xz", "yz" of the base frame, or a 3x3
    rotation); in "xz" the square's sides are horizontal and vertical."""
    return SquareCirclePath(side, edge_time, circle_time, dwell_time, _plane_rotation(plane))


def _plane_rotation(plane: Union[str, ArrayLike]) -> np.ndarray:
    if isinstance(plane, str):
        if plane not in _PLANES:
            raise ValueError(f"plane must be one of {sorted(_PLANES)} or a 3x3 rotation, got {plane!r}")
        i, j, k = _PLANES[plane]
        R = np.zeros((3, 3))
        R[i, 0] = R[j, 1] = 1.0
        R[:, 2] = np.cross(R[:, 0], R[:, 1])
        return R
    return np.asarray(plane, dtype=float)


def lissajous(amplitude: Sequence[float], harmonics: Sequence[int], phase: ArrayLike = (0.5 * math.pi, 0.0, 0.0),
              period: float = 4.0, plane: Union[str, ArrayLike] = "xy") -> LissajousPath:
    """A Lissajous curve with 2 (or 3) axes in ``plane`` ("xy", "xz", "yz" of the base
    frame, or a 3x3 rotation): ``amplitude`` [m] and integer ``harmonics`` per axis
    (a third value spans the plane normal)."""
    A = list(amplitude) + [0.0] * (3 - len(amplitude))
    k = list(harmonics) + [0] * (3 - len(harmonics))
    return LissajousPath(A, k, phase, period, _plane_rotation(plane))


def figure_eight(size: float = 0.1, period: float = 4.0, plane: Union[str, ArrayLike] = "xy") -> LissajousPath:
    """Figure-8 of total width ``size`` [m] (and height ``size / 2``) in ``plane``:
    ``x = size/2 sin(w t)``, ``y = size/4 sin(2 w t)``; crosses itself at the start point."""
    if not size > 0:
        raise ValueError(f"size must be > 0 [m], got {size!r}")
    return LissajousPath([size / 2, size / 4, 0.0], [1, 2, 0], 0.0, period, _plane_rotation(plane))


def lissajous3d(size: float = 0.1, period: float = 4.0, plane: Union[str, ArrayLike] = "xy") -> LissajousPath:
    """A 3D Lissajous curve (Thunder Dynamics' validation path, Fig. 5 and 12): frequencies
    1 : 2 : 3 along the plane's two axes and its normal, amplitudes ``size / 2``,
    ``size / 2``, ``size / 4`` [m]; x = size/2 (cos(w t) - 1), y = size/2 sin(2 w t),
    z = size/4 sin(3 w t) in the plane's axes."""
    if not size > 0:
        raise ValueError(f"size must be > 0 [m], got {size!r}")
    return LissajousPath([size / 2, size / 2, size / 4], [1, 2, 3], (0.5 * math.pi, 0.0, 0.0), period,
                         _plane_rotation(plane))


def z_sine(amplitude: float = 0.05, period: float = 2.0) -> LissajousPath:
    """Up and down along the base frame's z axis: ``z = amplitude sin(w t)`` (the SCQP
    paper's z-axis tracking task)."""
    if not amplitude > 0:
        raise ValueError(f"amplitude must be > 0 [m], got {amplitude!r}")
    return LissajousPath([0.0, 0.0, amplitude], [0, 0, 1], 0.0, period)


class CartesianPath(Trajectory):
    """The task-space reference itself: the tracked frame's position
    ``p_start + x(t)`` [m], velocity and acceleration (``n = 3``, base-frame axes) of a
    path, with the orientation held at ``R_start``.  Wrap it in
    :class:`~adaptive_dynamics.trajectories.base.ScaledTrajectory` for speed scaling
    like any trajectory."""

    def __init__(self, path, p_start: ArrayLike, R_start: Optional[ArrayLike] = None):
        self.path = path
        self.p_start = np.asarray(p_start, dtype=float).reshape(3).copy()
        self.R_start = np.eye(3) if R_start is None else np.asarray(R_start, dtype=float).reshape(3, 3).copy()
        self.n = 3
        self.period = path.period
        self.duration = None
        self.joint_names = ["x", "y", "z"]

    def sample_many(self, ts: ArrayLike) -> Samples:
        X, Xd, Xdd = self.path.sample_many(self._times(ts))
        return self.p_start + X, Xd, Xdd


class CartesianTrajectory(Trajectory):
    """Joint references that move the end effector along a Cartesian path.

    Parameters
    ----------
    model:
        A :class:`~adaptive_dynamics.dynamics.model.RobotModel` (or a robot name/URDF for one).
    q_start:
        Start configuration [rad]; the path starts at its end-effector pose.
    path:
        A :class:`LissajousPath` (e.g. :func:`figure_eight`) or :class:`SquareCirclePath`:
        anything with ``period`` and ``sample_many(ts) -> (x, xd, xdd)``, offsets in the
        base frame with ``x(0) = 0``.
    frame:
        Tracked frame (default the model's end-effector frame).
    dt:
        IK grid step [s] (default 1e-3; rounded so that a whole number of steps spans a period).
    orientation:
        Hold the start orientation (6-D task, default) or track the position only (3-D).
    damping:
        lambda of the damped least-squares inverse (default 1e-4).
    nullspace_gain:
        k0 [1/s] of the null-space attraction to ``q_start`` (default 2).
    newton_iters:
        Maximum corrector iterations per grid point (default 5).
    closure_tol:
        Joint-path closure required after a period [rad] (default 1e-9).
    max_periods:
        Maximum number of periods integrated to reach closure (default 20); if not
        reached, the residual is spread linearly over the period (and reported in
        :attr:`closure_error`).
    """

    def __init__(self, model, q_start: ArrayLike, path: Union[LissajousPath, SquareCirclePath],
                 frame: Optional[str] = None, dt: float = 1e-3,
                 orientation: bool = True, damping: float = 1e-4, nullspace_gain: float = 2.0,
                 newton_iters: int = 5, closure_tol: float = 1e-9, max_periods: int = 20):

        if not isinstance(model, RobotModel):
            model = RobotModel(model)
        self.model = model
        self.n = model.n
        self.joint_names = list(model.joint_names)
        q0 = np.asarray(q_start, dtype=float).reshape(-1)
        if q0.shape != (self.n,) or not np.all(np.isfinite(q0)):
            raise ValueError(f"q_start must be {self.n} finite values, got {q0.tolist()}")
        if not (dt > 0 and math.isfinite(dt)):
            raise ValueError(f"dt must be > 0, got {dt!r}")
        self.q_start = q0.copy()
        self.path = path
        self.frame = frame or model.ee_frame
        self.period = path.period
        self.duration = None
        self.orientation = bool(orientation)

        pm = model.model
        pd = pm.createData()
        fid = model.frame_id(self.frame)
        ref = pin.ReferenceFrame.LOCAL_WORLD_ALIGNED
        rows = 6 if self.orientation else 3
        lam2 = float(damping) ** 2
        eye_m, eye_n = np.eye(rows), np.eye(self.n)

        pin.framesForwardKinematics(pm, pd, q0)
        self.p_start = pd.oMf[fid].translation.copy()
        self.R_start = pd.oMf[fid].rotation.copy()

        N = max(2, int(round(self.period / dt)))
        self.dt = self.period / N
        self.grid = np.arange(N + 1) * self.dt
        X, Xd, _ = path.sample_many(self.grid)
        P = self.p_start + X

        def jac(q):
            return pin.computeFrameJacobian(pm, pd, q, fid, ref)[:rows]  # also updates the kinematics

        def pinv(J):
            return J.T @ np.linalg.solve(J @ J.T + lam2 * eye_m, eye_m)

        def error(q, p_d):
            pin.framesForwardKinematics(pm, pd, q)
            M = pd.oMf[fid]
            e_p = p_d - M.translation
            if not self.orientation:
                return e_p
            return np.concatenate([e_p, pin.log3(self.R_start @ M.rotation.T)])

        vel = np.zeros(rows)
        q = q0.copy()
        Q = np.empty((N + 1, self.n))
        closure = np.inf
        self.periods_integrated = 0
        for _ in range(int(max_periods)):
            Q[0] = q
            for k in range(N):
                J = jac(q)
                Jp = pinv(J)
                vel[:3] = Xd[k]
                qd = Jp @ vel + (eye_n - Jp @ J) @ (nullspace_gain * (q0 - q))
                q = q + self.dt * qd
                for _it in range(int(newton_iters)):
                    e = error(q, P[k + 1])
                    if np.linalg.norm(e) < 1e-12:
                        break
                    q = q + pinv(jac(q)) @ e
                Q[k + 1] = q
            self.periods_integrated += 1
            closure = float(np.abs(Q[N] - Q[0]).max())
            if closure < closure_tol:
                break
        self.closure_error = closure
        if closure >= closure_tol:
            Q = Q - np.outer(self.grid / self.period, Q[N] - Q[0])
        Q[N] = Q[0]
        self.start_offset = float(np.abs(Q[0] - q0).max())
        self.q_grid = Q
        self._spline = CubicSpline(self.grid, Q, axis=0, bc_type="periodic")
        self._d1 = self._spline.derivative(1)
        self._d2 = self._spline.derivative(2)

    def sample_many(self, ts: ArrayLike) -> Samples:
        t = np.mod(self._times(ts), self.period)
        return self._spline(t), self._d1(t), self._d2(t)

    def task_space(self) -> CartesianPath:
        """The Cartesian reference this joint path realises (:class:`CartesianPath`:
        same path, start pose and period)."""
        return CartesianPath(self.path, self.p_start, self.R_start)

    def cartesian_reference(self, ts: ArrayLike):
        """Desired frame position [m] (len, 3) and velocity [m/s] at ``ts``; the desired
        orientation is :attr:`R_start`."""
        t = np.mod(self._times(ts), self.period)
        X, Xd, _ = self.path.sample_many(t)
        return self.p_start + X, Xd

    def tracking_error(self, n_samples: int = 2000) -> tuple:
        """Max position error [m] and orientation error [rad] of the interpolated joint
        path over one period (``n_samples`` evenly spaced times, off the IK grid)."""
        ts = (np.arange(n_samples) + 0.5) * self.period / n_samples
        q, _, _ = self.sample_many(ts)
        P, _ = self.cartesian_reference(ts)
        ep = eo = 0.0
        for qi, pi in zip(q, P):
            T = self.model.frame_pose(qi, self.frame)
            ep = max(ep, float(np.linalg.norm(T[:3, 3] - pi)))
            eo = max(eo, float(np.linalg.norm(pin.log3(self.R_start @ T[:3, :3].T))))
        return ep, eo

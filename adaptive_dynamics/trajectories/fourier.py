"""Modified Fourier excitation trajectories (Park 2006).

K.-J. Park, "Fourier-based optimal excitation trajectories for the dynamic
identification of robots", Robotica 24(5), 625-633, 2006 -- as used by Smith & Mistry's
semiparametric consistency paper ("a cyclic trajectory that guarantees a particular
starting state").

Per joint i, with fundamental angular frequency ``w_f`` and ``L`` harmonics::

    F_i(t) = sum_{l=1..L}  a_il / (w_f l) sin(w_f l t)  -  b_il / (w_f l) cos(w_f l t)
    q_i(t) = F_i(t) + P_i(t),          P_i(t) = sum_{k=0..5} c_ik t^k

(the Fourier series of the joint *velocity* is ``sum a cos + b sin``).  Park's
modification is the quintic P_i, solved from six linear conditions so that

    q(0) = q(T) = q_start,   qd(0) = qd(T) = 0,   qdd(0) = qdd(T) = 0,   T = 2 pi / w_f.

The trajectory repeats with period T and is C2 across period boundaries (position,
velocity and acceleration continuous; it starts and returns to rest at ``q_start``).
All derivatives are analytic.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

from .base import ArrayLike, Samples, Trajectory, _limit

__all__ = ["ModifiedFourier"]


class ModifiedFourier(Trajectory):
    """Park's modified Fourier trajectory (cyclic, start state guaranteed).

    Parameters
    ----------
    a, b:
        Coefficients, shape ``(n, L)`` [rad/s]: the joint velocity's Fourier series is
        ``sum_l a_il cos(w_f l t) + b_il sin(w_f l t)`` (before the polynomial correction).
    w_f:
        Fundamental angular frequency [rad/s] (> 0); the period is ``2 pi / w_f``.
    q_start:
        Start (and end-of-period) position [rad], shape ``(n,)``; velocity and
        acceleration are zero there.
    joint_names:
        Optional joint names for error messages.
    """

    def __init__(self, a: ArrayLike, b: ArrayLike, w_f: float, q_start: ArrayLike,
                 joint_names: Optional[Sequence[str]] = None):
        a = np.atleast_2d(np.asarray(a, dtype=float))
        b = np.atleast_2d(np.asarray(b, dtype=float))
        if a.shape != b.shape:
            raise ValueError(f"a and b must have the same shape (n, L), got {a.shape} and {b.shape}")
        if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
            raise ValueError("Fourier coefficients must be finite")
        w_f = float(w_f)
        if not (math.isfinite(w_f) and w_f > 0):
            raise ValueError(f"w_f must be > 0 [rad/s], got {w_f!r}")
        self.n, self.L = a.shape
        q_start = np.asarray(q_start, dtype=float).reshape(-1)
        if q_start.shape != (self.n,) or not np.all(np.isfinite(q_start)):
            raise ValueError(f"q_start must be {self.n} finite values, got {q_start.tolist()}")
        self.a, self.b, self.w_f, self.q_start = a.copy(), b.copy(), w_f, q_start.copy()
        self.period = 2.0 * math.pi / w_f
        self.duration = None
        self.joint_names = list(joint_names) if joint_names is not None else None
        if self.joint_names is not None and len(self.joint_names) != self.n:
            raise ValueError(f"{len(self.joint_names)} joint names for {self.n} joints")
        self._l = np.arange(1, self.L + 1, dtype=float)           # harmonic numbers
        self._wl = w_f * self._l                                  # (L,)
        self.c = self._polynomial()                               # (n, 6)

    # ------------------------------------------------------------------ construction
    def _fourier(self, t: np.ndarray):
        """F, F', F'' at times t (shape (len, n))."""
        arg = np.multiply.outer(t, self._wl)                      # (T, L)
        s, c = np.sin(arg), np.cos(arg)
        a_w, b_w = self.a / self._wl, self.b / self._wl           # (n, L)
        F = s @ a_w.T - c @ b_w.T
        F1 = c @ self.a.T + s @ self.b.T
        F2 = -(s @ (self.a * self._wl).T) + c @ (self.b * self._wl).T
        return F, F1, F2

    def _polynomial(self) -> np.ndarray:
        T = self.period
        F, F1, F2 = self._fourier(np.array([0.0]))                # F(T) = F(0) etc. (periodic)
        c0 = self.q_start - F[0]
        c1 = -F1[0]
        c2 = -0.5 * F2[0]
        # p(T) = p(0), p'(T) = p'(0), p''(T) = p''(0)  ->  3x3 system in c3, c4, c5
        A = np.array([[T ** 3, T ** 4, T ** 5],
                      [3 * T ** 2, 4 * T ** 3, 5 * T ** 4],
                      [6 * T, 12 * T ** 2, 20 * T ** 3]])
        rhs = -np.stack([c1 * T + c2 * T ** 2, 2 * c2 * T, np.zeros(self.n)])   # (3, n)
        c345 = np.linalg.solve(A, rhs)                                          # (3, n)
        return np.column_stack([c0, c1, c2, c345.T])

    @classmethod
    def random(cls, n: int, rng: np.random.Generator, q_center: Optional[ArrayLike] = None,
               amplitude: ArrayLike = 0.5, w_f: float = 2 * math.pi * 0.1, L: int = 5,
               lower: Optional[ArrayLike] = None, upper: Optional[ArrayLike] = None,
               vel_limit: Optional[ArrayLike] = None, acc_limit: Optional[ArrayLike] = None,
               margin: float = 0.05, joint_names: Optional[Sequence[str]] = None,
               n_check: int = 4000) -> "ModifiedFourier":
        """A random excitation trajectory that satisfies the given limits.

        Coefficients ``a_il, b_il ~ U(-1, 1) * amplitude_i * w_f`` (so the first harmonic's
        position amplitude is at most ``amplitude`` [rad], harmonic ``l`` at most
        ``amplitude / l``), then each joint's coefficients are scaled down (never up) so
        that, on a grid of ``n_check`` samples per period:

        * ``q`` stays inside ``[lower + m, upper - m]``, ``m = margin * (upper - lower)``;
        * ``|qd| <= (1 - margin) vel_limit`` and ``|qdd| <= (1 - margin) acc_limit``.

        ``q - q_center``, ``qd`` and ``qdd`` are linear in the coefficients (the polynomial
        correction is too), so the scale is exact on the grid; the result is then
        verified against the unshrunk limits with :meth:`check_limits` on a grid twice
        as fine.  Limits left ``None`` are not enforced.

        Parameters
        ----------
        n:
            Number of joints.
        rng:
            ``numpy.random.Generator`` (the result is a deterministic function of its state).
        q_center:
            Start/centre position [rad]; default the middle of ``[lower, upper]`` (or 0).
            Must lie inside the shrunk position limits.
        amplitude:
            Position amplitude scale [rad] (scalar or per joint).
        w_f:
            Fundamental angular frequency [rad/s] (period ``2 pi / w_f``).
        L:
            Number of harmonics (>= 1).
        lower, upper, vel_limit, acc_limit:
            Joint limits (scalar or per joint) [rad, rad, rad/s, rad/s^2].
        margin:
            Safety margin in [0, 0.5): fraction of the position range kept free at each
            end and fraction removed from the velocity/acceleration limits.
        joint_names:
            Optional names for error messages.
        n_check:
            Grid size used for the scaling.
        """
        if int(n) < 1 or int(L) < 1:
            raise ValueError(f"n and L must be >= 1, got n={n}, L={L}")
        n, L = int(n), int(L)
        if not 0 <= margin < 0.5:
            raise ValueError(f"margin must be in [0, 0.5), got {margin}")
        lo, up = _limit(lower, n, "lower"), _limit(upper, n, "upper")
        vl, al = _limit(vel_limit, n, "vel_limit"), _limit(acc_limit, n, "acc_limit")
        if q_center is None:
            q_center = 0.5 * (lo + up) if lo is not None and up is not None else np.zeros(n)
        qc = np.asarray(q_center, dtype=float).reshape(-1)
        if qc.shape != (n,):
            raise ValueError(f"q_center must have {n} values, got {qc.shape}")
        amp = _limit(amplitude, n, "amplitude")
        a = rng.uniform(-1.0, 1.0, (n, L)) * (amp * w_f)[:, None]
        b = rng.uniform(-1.0, 1.0, (n, L)) * (amp * w_f)[:, None]
        traj = cls(a, b, w_f, qc, joint_names)

        ts = np.linspace(0.0, traj.period, int(n_check))
        q, qd, qdd = traj.sample_many(ts)
        dev = q - qc
        scale = np.ones(n)

        def shrink(allowed, peak, what):
            with np.errstate(divide="ignore", invalid="ignore"):
                s = np.where(peak > 0, allowed / peak, np.inf)
            bad = np.flatnonzero(allowed < 0)
            if bad.size:
                j = int(bad[0])
                name = joint_names[j] if joint_names is not None else f"index {j}"
                raise ValueError(f"q_center of joint {name} ({qc[j]:.6g} rad) is outside the {what} "
                                 f"limits shrunk by margin {margin}")
            np.minimum(scale, s, out=scale)

        if up is not None:
            shrink(up - margin * (up - (lo if lo is not None else up)) - qc, dev.max(axis=0), "upper")
        if lo is not None:
            shrink(qc - lo - margin * ((up if up is not None else lo) - lo), -dev.min(axis=0), "lower")
        if vl is not None:
            shrink((1 - margin) * vl, np.abs(qd).max(axis=0), "velocity")
        if al is not None:
            shrink((1 - margin) * al, np.abs(qdd).max(axis=0), "acceleration")
        scale = np.minimum(scale, 1.0)
        out = cls(a * scale[:, None], b * scale[:, None], w_f, qc, joint_names)
        out.check_limits(lo, up, vl, al, n_check=2 * int(n_check))
        return out

    # ------------------------------------------------------------------ sampling
    def sample_many(self, ts: ArrayLike) -> Samples:
        t = np.mod(self._times(ts), self.period)
        F, F1, F2 = self._fourier(t)
        c = self.c
        # Horner for the quintic and its derivatives, (len, n)
        tt = t[:, None]
        P = ((((c[:, 5] * tt + c[:, 4]) * tt + c[:, 3]) * tt + c[:, 2]) * tt + c[:, 1]) * tt + c[:, 0]
        P1 = (((5 * c[:, 5] * tt + 4 * c[:, 4]) * tt + 3 * c[:, 3]) * tt + 2 * c[:, 2]) * tt + c[:, 1]
        P2 = ((20 * c[:, 5] * tt + 12 * c[:, 4]) * tt + 6 * c[:, 3]) * tt + 2 * c[:, 2]
        return F + P, F1 + P1, F2 + P2

"""Multi-sine joint trajectories: a sum of sines per joint around a centre.

    q_i(t) = center_i + sum_k A_ik sin(2 pi f_ik t + phi_ik)

with analytic velocity and acceleration.  The trajectory is periodic when all
frequencies are integer multiples of a common fundamental (detected on a 1 micro-Hz
grid); the period is then ``1 / fundamental``.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional, Sequence

import numpy as np

from .base import ArrayLike, Samples, Trajectory

__all__ = ["MultiSine"]

_FREQ_GRID = 1_000_000  # frequencies are tested for commensurability on a 1e-6 Hz grid
_MAX_PERIOD = 3600.0    # longer common periods are reported as aperiodic (period None)


def _common_period(freqs: np.ndarray) -> Optional[float]:
    f = freqs[freqs > 0]
    if f.size == 0:
        return None
    ints = np.rint(f * _FREQ_GRID)
    if np.any(np.abs(ints - f * _FREQ_GRID) > 1e-6):
        return None
    g = 0
    for k in ints.astype(np.int64):
        g = math.gcd(g, int(k))
    period = float(Fraction(_FREQ_GRID, g))
    return period if period <= _MAX_PERIOD else None


def _per_sine(value, n: int, K: int, what: str) -> np.ndarray:
    """Broadcast a scalar, a (K,) row (same for every joint), an (n,) column (K == 1) or
    an (n, K) array to shape (n, K)."""
    arr = np.asarray(value, dtype=float)
    if arr.ndim == 1:
        if arr.size == K:
            arr = arr.reshape(1, K)
        elif K == 1 and arr.size == n:
            arr = arr.reshape(n, 1)
    try:
        return np.broadcast_to(arr, (n, K)).copy()
    except ValueError:
        raise ValueError(f"{what} must be a scalar or have shape (K,) or (n, K) = {(n, K)}, "
                         f"got {np.shape(value)}") from None


class MultiSine(Trajectory):
    """Sum of sines per joint.

    Parameters
    ----------
    center:
        Centre position [rad], shape ``(n,)``.
    amplitudes:
        ``A`` [rad], shape ``(n, K)`` (or ``(n,)`` for one sine per joint).
    frequencies:
        ``f`` [Hz] (>= 0), shape ``(n, K)`` or ``(K,)`` (same frequencies for every joint).
    phases:
        ``phi`` [rad], shape ``(n, K)``, ``(K,)`` or scalar; default 0.
    joint_names:
        Optional joint names for error messages.
    """

    def __init__(self, center: ArrayLike, amplitudes: ArrayLike, frequencies: ArrayLike, phases: ArrayLike = 0.0,
                 joint_names: Optional[Sequence[str]] = None):
        c = np.asarray(center, dtype=float).reshape(-1)
        n = c.size
        A = np.asarray(amplitudes, dtype=float)
        if A.ndim == 1:
            A = A.reshape(n, 1) if A.size == n else A
        if A.ndim != 2 or A.shape[0] != n:
            raise ValueError(f"amplitudes must have shape (n={n}, K), got {np.shape(amplitudes)}")
        K = A.shape[1]
        f = _per_sine(frequencies, n, K, "frequencies")
        ph = _per_sine(phases, n, K, "phases")
        for what, arr in (("center", c), ("amplitudes", A), ("frequencies", f), ("phases", ph)):
            if not np.all(np.isfinite(arr)):
                raise ValueError(f"{what} must be finite")
        if np.any(f < 0):
            raise ValueError(f"frequencies must be >= 0 [Hz], got {f.tolist()}")
        self.n, self.K = n, K
        self.center, self.amplitudes, self.frequencies, self.phases = c, A.copy(), f, ph
        self._w = 2.0 * math.pi * f
        self.period = _common_period(f[A != 0]) if np.any(A != 0) else None
        self.duration = None
        self.joint_names = list(joint_names) if joint_names is not None else None

    def check_horizon(self) -> float:
        if self.period is not None:
            return self.period
        f = self.frequencies[(self.amplitudes != 0) & (self.frequencies > 0)]
        return float(10.0 / f.min()) if f.size else 1.0

    def sample_many(self, ts: ArrayLike) -> Samples:
        t = self._times(ts)
        arg = t[:, None, None] * self._w[None] + self.phases[None]     # (T, n, K)
        s, co = np.sin(arg), np.cos(arg)
        A, w = self.amplitudes[None], self._w[None]
        q = self.center + np.sum(A * s, axis=2)
        qd = np.sum(A * w * co, axis=2)
        qdd = -np.sum(A * w * w * s, axis=2)
        return q, qd, qdd

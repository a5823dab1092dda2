"""Consistency transforms (Smith & Mistry 2020 eq. 12-19; ARDL eq. 11-14).

The learner's target is the residual ``f(x) = tau - Y(x) pi_hat`` with x = (q, qd, qdd).
When the parametric estimate changes by ``dpi`` the target changes by exactly

    delta f(x) = -Y(x) dpi = -g(x),       g(x) := Y(x) dpi  (= RNEA with "inertias" dpi)

This module evaluates ``g`` and its state Jacobian ``J = dg/d(q, qd, qdd)`` (n x 3n) at
a set of points, fast, for one ``dpi`` (:class:`ParameterChange`), and applies the
Gaussian-mixture transform (:func:`transform_gaussians`):

    mu_o  <- mu_o - g(mu_i)                                   (eq. 16, exact)
    Sigma <- T Sigma T^T,   T = [[I, 0], [-J(mu_i), I]]        (eq. 18-19, first order)

The RBF network's transform (ARDL eq. 13-14) lives in :mod:`.rbfn` (it is a property
of the recursive least squares, not of the model).

How ``J`` is evaluated: with numba, one compiled call of pinocchio's RNEA-derivatives
algorithm for all component means at once, ``dpi`` used as it is (inertias kept as
their linear parameters; :class:`~adaptive_dynamics.dynamics.parameter_change.ShiftedParameterChange`).
Without numba, per point through pinocchio on the ball-shifted model pair, the
unit-ball terms cached per point while a component mean does not move.  Both are
checked against ``regressor_derivatives`` and finite differences in the tests.
"""
from __future__ import annotations

import weakref
from typing import Callable, Tuple

import numpy as np
import pinocchio as pin

from ..dynamics.parameter_change import ShiftedParameterChange


__all__ = ["ParameterChange", "transform_gaussians"]


class ParameterChange:
    """Evaluate ``g(x) = Y(x) dpi`` and ``dg/dx`` for a fixed ``dpi`` and RobotModel.

    ``dpi`` may be any finite vector (negative or zero "masses" included).  The Jacobians
    come from :meth:`ShiftedParameterChange.evaluate
    <adaptive_dynamics.dynamics.parameter_change.ShiftedParameterChange.evaluate>` (compiled), or
    without numba from the ball-shifted pinocchio models

        g(x; dpi) = s * [ g(x; dpi / s + r) - g(x; r) ]

    (``r`` the unit ball per link, every block of ``dpi / s + r`` physical; about one
    digit lost to the subtraction), where ``g(x; r)`` and its Jacobian do not depend on
    ``dpi`` and are cached per evaluation point.  :meth:`values` uses the latter.
    """

    _cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    @classmethod
    def for_model(cls, model) -> "ParameterChange":
        """A cached evaluator per RobotModel (building one copies the pinocchio model)."""
        ev = cls._cache.get(model)
        if ev is None:
            ev = cls(model)
            cls._cache[model] = ev
        return ev

    def __init__(self, model, *, compiled: bool = True):
        self.robot = model
        self.n = model.n
        self.n_inertial = 10 * model.n
        self.n_params = model.n_params
        self.shift = ShiftedParameterChange(model.model, self.n, compiled=compiled)
        self.friction = np.zeros(2 * self.n)
        self.has_friction = bool(getattr(model, "friction", False))
        self.eps = float(getattr(model, "coulomb_smoothing", 0.0))

    def clear_cache(self) -> None:
        """Forget the unit-ball terms the no-numba path keeps per point (the next call
        evaluates them afresh)."""
        self.shift.clear_cache()

    def set(self, dpi: np.ndarray) -> "ParameterChange":
        dpi = np.asarray(dpi, dtype=float).reshape(-1)
        if dpi.shape != (self.n_params,) or not np.isfinite(dpi).all():
            raise ValueError(f"dpi must be {self.n_params} finite values, got shape {dpi.shape}")
        self.shift.set(dpi[: self.n_inertial])
        self.friction = dpi[self.n_inertial:].copy()
        return self

    def _coulomb(self, v):
        return np.tanh(v / self.eps) if self.eps > 0 else np.sign(v)

    def _coulomb_slope(self, v):
        return (1.0 - np.tanh(v / self.eps) ** 2) / self.eps if self.eps > 0 else np.zeros_like(v)

    def values(self, Q, V, A) -> np.ndarray:
        """g = Y(q, v, a) dpi at K points (arrays K x n) -> K x n."""
        Q, V, A = (np.ascontiguousarray(np.atleast_2d(z), dtype=float) for z in (Q, V, A))
        out = np.zeros_like(Q)
        sh = self.shift
        if sh.scale > 0:
            rnea = pin.rnea
            a, da_, b, db = sh.shifted_models()
            for k in range(Q.shape[0]):
                out[k] = rnea(a, da_, Q[k], V[k], A[k])
                out[k] -= rnea(b, db, Q[k], V[k], A[k])
            out *= sh.scale
        if self.has_friction:
            n = self.n
            out += self.friction[:n] * V + self.friction[n:] * self._coulomb(V)
        return out

    def jacobians(self, Q, V=None, A=None) -> Tuple[np.ndarray, np.ndarray]:
        """(g, J) at K points: g K x n, J K x n x 3n = [dg/dq, dg/dv, dg/da].

        Points as three K x n arrays, or one K x 3n array ``Q`` of x = (q, v, a)."""
        n = self.n
        if V is None:
            X = np.ascontiguousarray(np.atleast_2d(Q), dtype=float)
        else:
            X = np.ascontiguousarray(np.hstack([np.atleast_2d(z) for z in (Q, V, A)]), dtype=float)
        if X.shape[1] != 3 * n:
            raise ValueError(f"points must have 3n = {3 * n} coordinates, got {X.shape[1]}")
        g, J = self.shift.evaluate(*(np.ascontiguousarray(X[:, c: c + n]) for c in (0, n, 2 * n)))
        if self.has_friction:
            V = X[:, n:2 * n]
            fv, fc = self.friction[:n], self.friction[n:]
            g += fv * V + fc * self._coulomb(V)
            d = fv + fc * self._coulomb_slope(V)            # K x n
            J[:, np.arange(n), n + np.arange(n)] += d
        return g, J


def transform_gaussians(means: np.ndarray, covs: np.ndarray, in_dim: int,
                        g: np.ndarray, J: np.ndarray, *, inplace: bool = False
                        ) -> Tuple[np.ndarray, np.ndarray]:
    """Apply the output shift ``y <- y - g(x)`` to joint Gaussians over (x, y), linearised
    at each component's input mean (eq. 16-19).

    ``means`` K x D, ``covs`` K x D x D (D = in_dim + out_dim), ``g`` K x out_dim (g at
    the input means), ``J`` K x out_dim x in_dim (dg/dx there).  Returns new arrays, or
    ``means`` and ``covs`` themselves, updated, with ``inplace=True``.
    With T = [[I, 0], [-J, I]]:  Sigma_ii unchanged, Sigma_oi <- Sigma_oi - J Sigma_ii,
    Sigma_oo <- Sigma_oo - J Sigma_io - Sigma_oi J^T + J Sigma_ii J^T
    = Sigma_oo - J Sigma_io - Sigma_oi' J^T (Sigma_oi' the new block).  T has unit
    determinant and the conditional covariance Sigma_o|i is invariant, so positive
    definiteness is preserved exactly.
    """
    i = in_dim
    m = means if inplace else means.copy()
    m[:, i:] -= g
    C = covs if inplace else covs.copy()
    JSio = J @ np.swapaxes(C[:, i:, :i], 1, 2)            # J Sigma_io (old Sigma_oi)
    new_oi = C[:, i:, :i] - J @ C[:, :i, :i]
    C[:, i:, :i] = new_oi
    C[:, :i, i:] = np.swapaxes(new_oi, 1, 2)
    Soo = C[:, i:, i:]
    Soo -= JSio
    Soo -= new_oi @ np.swapaxes(J, 1, 2)
    Soo += np.swapaxes(Soo, 1, 2)                          # symmetrise (rounding)
    Soo *= 0.5
    return m, C


def linearised_shift(fn: Callable[[np.ndarray], np.ndarray], X: np.ndarray, h: float = 1e-6):
    """(g, J) of an arbitrary output shift ``fn`` (x -> out_dim) by central differences,
    for :func:`transform_gaussians` with shifts that are not parameter changes (tests,
    the paper's Fig. 2 sine example)."""
    X = np.atleast_2d(np.asarray(X, dtype=float))
    g = np.array([fn(x) for x in X]).reshape(X.shape[0], -1)
    J = np.empty((X.shape[0], g.shape[1], X.shape[1]))
    for k in range(X.shape[1]):
        e = np.zeros(X.shape[1])
        e[k] = h
        J[:, :, k] = (np.array([fn(x + e) for x in X]).reshape(g.shape)
                      - np.array([fn(x - e) for x in X]).reshape(g.shape)) / (2 * h)
    return g, J

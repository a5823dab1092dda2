"""Quantities linear in the inertial parameters, for any parameter vector: what the
consistency transform and the adaptive estimates need from pinocchio.

:class:`_LinearInertias` evaluates pinocchio's algorithms that are linear in the
inertial parameters for non-physical vectors too; :class:`ShiftedParameterChange`
gives ``Y(q, v, a) dpi`` and its derivatives for a parameter change ``dpi`` (a pinocchio
pass, or the compiled kernels of :mod:`._slotine_li_compiled`).
"""
from __future__ import annotations

import numpy as np
import pinocchio as pin

from . import _slotine_li_compiled as slc
from .inertial import ball_shift_scale, pseudo_inertias, UNIT_BALL


class _LinearInertias:
    """Evaluate pinocchio algorithms that are linear in the inertial parameters for
    *any* parameter vector, including non-physical ones (zero or negative mass, an
    inertia violating the triangle inequality), as adaptive estimates and parameter
    changes can be.

    pinocchio's ``Inertia`` stores the CoM (h / m), so a zero-mass block cannot be
    represented, and some algorithms (the RNEA derivatives) return garbage for
    non-physical inertias.  Each non-physical block pi_i is therefore evaluated as
    (pi_i + r_i) - r_i: model A holds pi_i + r_i, model B holds r_i, with
    r_i = mu * UNIT_BALL, a solid ball whose pseudo-inertia
    diag(mu, mu, mu, mu) exceeds the spectral norm of pi_i's, so both are physical.
    The result is f(A) - f(B), exact by linearity (up to rounding at the scale of
    |pi_i|).  B is only evaluated when some block needed a shift.
    """

    def __init__(self, model: pin.Model, n_links: int):
        self.a = model.copy()
        self.b = model.copy()
        self.da = self.a.createData()
        self.db = self.b.createData()
        self.n = n_links
        self.use_b = False
        self._zero = pin.Inertia.Zero()

    def set(self, pi: np.ndarray) -> None:
        pi = np.asarray(pi, dtype=float)
        blocks = pi[: 10 * self.n].reshape(self.n, 10)
        lam = np.linalg.eigvalsh(pseudo_inertias(blocks))  # n x 4, ascending
        physical = lam[:, 0] > 1e-9 * np.maximum(1.0, lam[:, -1])
        fdp, a, b = pin.Inertia.FromDynamicParameters, self.a.inertias, self.b.inertias
        if physical.all():
            for i in range(self.n):
                a[i + 1] = fdp(blocks[i])
                b[i + 1] = self._zero
            self.use_b = False
        else:
            r = np.outer(1.0 + np.abs(lam).max(axis=1), UNIT_BALL)
            r[physical] = 0.0
            shifted = blocks + r
            for i in range(self.n):
                a[i + 1] = fdp(shifted[i])
                b[i + 1] = self._zero if physical[i] else fdp(r[i])
            self.use_b = True

    def eval(self, fn, *args):
        ra = fn(self.a, self.da, *args)
        if not self.use_b:
            return ra
        ra = np.array(ra)  # copy before B's call reuses pinocchio's buffers
        return ra - fn(self.b, self.db, *args)


class ShiftedParameterChange:
    """Quantities linear in a parameter change ``dpi`` (any finite inertial 10n-vector):
    ``Y(q, v, a) dpi`` and its derivatives with respect to (q, v, a).

    Two implementations of :meth:`evaluate`, the same numbers to rounding:

    * **compiled** (numba available): pinocchio's RNEA-derivatives algorithm in one
      compiled call for all points, with each link's inertia kept as its 10 linear
      parameters, so ``dpi`` is used as it is (``rnea_derivatives`` in
      :mod:`._slotine_li_compiled`); cross-checked against the pinocchio path on first use.
    * **pinocchio**: ``dpi`` is rarely physical and pinocchio's algorithms need physical
      inertias, so every block is shifted alike: with ``s = ball_shift_scale(dpi)`` the
      model ``a`` holds ``dpi / s + UNIT_BALL``, the model ``b`` unit balls (fixed), and
      ``f(dpi) = s (f(a) - f(b))`` by linearity (``scale`` = s; 0 for a zero ``dpi``).
      No eigenvalue problem; the shifted model is loaded only when this path runs.  The
      unit balls' terms do not depend on ``dpi``: they are kept per point from the last
      call (points at the same row unchanged -- component means rarely move between two
      consistency transforms), so a repeated call costs one RNEA-derivative per point.

    :meth:`set` with the ``dpi`` already loaded is free.  Used by
    :meth:`RobotModel.regressor_derivatives` and the learners' consistency transforms.
    """

    def __init__(self, model: pin.Model, n_links: int, *, compiled: bool = True):
        self.n = n_links
        self.a, self.b = model.copy(), model.copy()
        ball = pin.Inertia.FromDynamicParameters(UNIT_BALL)
        for j in range(1, n_links + 1):
            self.b.inertias[j] = ball
        self.da, self.db = self.a.createData(), self.b.createData()
        self._scale = 0.0
        self._pi = None
        self._loaded = True          # model ``a`` holds the dpi last set
        self._P = np.zeros((model.njoints, 10))   # dpi per joint (row 0: the universe)
        self._kernel = None if compiled else False  # resolved on first use
        self.clear_cache()
        # whether computeRNEADerivatives fills dtau/da's strict lower triangle (pinocchio
        # guarantees the upper one): probed once
        x = np.linspace(0.1, 0.7, n_links)
        M = pin.computeRNEADerivatives(self.b, self.db, x, x, x)[2]
        self.fills_lower = bool(np.array_equal(M, M.T))

    def clear_cache(self) -> None:
        """Forget the unit balls' terms kept from the last pinocchio-path call."""
        self._ball_X = np.zeros((0, 3 * self.n))
        self._ball_tau = np.zeros((0, self.n))
        self._ball_D = np.zeros((0, self.n, 3 * self.n))

    def set(self, pi: np.ndarray) -> None:
        """Load the inertial part ``pi`` (10 n values) of a parameter change."""
        if self._pi is not None and np.array_equal(pi, self._pi):
            return
        self._P[1:] = pi.reshape(self.n, 10)
        self._pi = pi.copy()
        self._scale = None
        self._loaded = False

    @property
    def scale(self) -> float:
        """The ball-shift scale ``s`` of the ``dpi`` last set (0 for a zero ``dpi``)."""
        if self._scale is None:
            self._scale = ball_shift_scale(self._P[1:])
        return self._scale

    def shifted_models(self):
        """``(a, data_a, b, data_b)`` for the pinocchio path, ``a`` loaded with the
        ``dpi`` last set (see the class docstring; only meaningful when ``scale > 0``)."""
        if not self._loaded:
            if self.scale > 0:
                shifted = self._P[1:] / self.scale + UNIT_BALL
                fdp, a = pin.Inertia.FromDynamicParameters, self.a.inertias
                for i in range(self.n):
                    a[i + 1] = fdp(shifted[i])
            self._loaded = True
        return self.a, self.da, self.b, self.db

    @property
    def implementation(self) -> str:
        """``"compiled"`` or ``"pinocchio"`` (which :meth:`evaluate` uses)."""
        return "compiled" if self._compiled() is not None else "pinocchio"

    def _compiled(self):
        if self._kernel is None:
            self._kernel = False
            kernel = slc.load_kernel() and slc.rnea_derivatives_kernel
            geo = slc.geometry(self.a) if kernel else None
            if geo is not None:
                self._kernel = (kernel, geo)
                # cross-check against the pinocchio path at a random dpi and state
                rng = np.random.default_rng(11)
                keep, keep_P = self._pi, self._P.copy()
                X = rng.uniform(-1.0, 1.0, (3, 2, self.n))
                self.set(rng.standard_normal(10 * self.n))
                try:
                    ok = all(np.allclose(u, w, rtol=1e-8, atol=1e-8)
                             for u, w in zip(self._evaluate_compiled(*X), self._evaluate_pinocchio(*X)))
                    why = "construction-time cross-check failed"
                except Exception as exc:  # pragma: no cover - a numba/runtime failure
                    ok, why = False, f"{type(exc).__name__}: {exc}"
                self._P[:] = keep_P      # the dpi set before (zero if none)
                self._pi, self._scale, self._loaded = keep, None, False
                self.clear_cache()
                if not ok:  # pragma: no cover
                    slc.warn_fallback(why, what="RNEA derivatives", fallback="the ball-shifted pinocchio models")
                    self._kernel = False
        return self._kernel or None

    def evaluate(self, Q, V, A):
        """``(tau, D)`` at K points (C-contiguous K x n arrays): ``tau = Y dpi`` (K x n)
        and ``D = [d/dq | d/dv | d/da]`` of it (K x n x 3n, the last block the full
        symmetric M(dpi))."""
        if self._compiled() is not None:
            return self._evaluate_compiled(Q, V, A)
        return self._evaluate_pinocchio(Q, V, A)

    def _evaluate_compiled(self, Q, V, A):
        kernel, geo = self._kernel
        K, n = Q.shape
        tau, D = np.empty((K, n)), np.empty((K, n, 3 * n))
        kernel(Q, V, A, geo, self._P, tau, D)
        return tau, D

    def _evaluate_pinocchio(self, Q, V, A):
        K, n = Q.shape
        tau, D = np.zeros((K, n)), np.zeros((K, n, 3 * n))
        if self.scale == 0:
            return tau, D
        a, da, _, _ = self.shifted_models()
        deriv = pin.computeRNEADerivatives
        for k in range(K):
            D[k] = np.hstack(deriv(a, da, Q[k], V[k], A[k]))
            tau[k] = da.tau
        ball_tau, ball_D = self._ball_terms(Q, V, A)
        tau -= ball_tau
        D -= ball_D
        tau *= self.scale
        D *= self.scale
        self.mirror_lower(D[:, :, 2 * n:])
        return tau, D

    def _ball_terms(self, Q, V, A):
        """The unit-ball model's tau and derivatives at K points, kept from the last call
        where the point at the same row is unchanged."""
        X = np.hstack([Q, V, A])
        K, n = Q.shape
        tau, D = np.empty((K, n)), np.empty((K, n, 3 * n))
        fresh = np.ones(K, dtype=bool)
        if self._ball_X.shape == X.shape:
            fresh = (X != self._ball_X).any(axis=1)
            tau[~fresh], D[~fresh] = self._ball_tau[~fresh], self._ball_D[~fresh]
        deriv = pin.computeRNEADerivatives
        for k in np.flatnonzero(fresh):
            D[k] = np.hstack(deriv(self.b, self.db, Q[k], V[k], A[k]))
            tau[k] = self.db.tau
        self._ball_X, self._ball_tau, self._ball_D = X, tau, D
        return tau, D

    def mirror_lower(self, M: np.ndarray) -> None:
        """Fill the strict lower triangle of (a stack of) dtau/da = M from the upper one,
        where pinocchio leaves it empty."""
        if not self.fills_lower:
            low = np.tril_indices(self.n, -1)
            M[..., low[0], low[1]] = M[..., low[1], low[0]]

    def derivatives(self, q, v, a):
        """(dq, dv, da), each n x n, of ``Y(q, v, a) dpi`` for the ``dpi`` last set."""
        n = self.n
        _, D = self.evaluate(*(np.ascontiguousarray(x, dtype=float).reshape(1, n) for x in (q, v, a)))
        D = D[0]
        return D[:, :n].copy(), D[:, n: 2 * n].copy(), D[:, 2 * n:].copy()
__all__ = ["ShiftedParameterChange"]

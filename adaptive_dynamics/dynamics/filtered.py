"""Filtered regressor W and filtered torque for composite adaptation.

Continuous time (Slotine & Li 1989; consistency paper eq. 7): with the first-order
filter w(s) = lam / (s + lam) started at rest,

    W(t) pi = tau_f(t) = int_0^t lam exp(-lam (t - r)) tau(r) dr.

Integrating the M qdd term by parts shows W needs no acceleration signal:
W = lam Y_p - lam w*Y_p + w*(Y_h) with Y_p pi = M qd and Y_h pi = g - C^T qd.

Discrete time (what :class:`FilteredRegressor` computes, sample period h):

    alpha   = exp(-lam h)
    q_m     = (q_k + q_{k-1}) / 2,  v_m = (v_k + v_{k-1}) / 2,  a_m = (v_k - v_{k-1}) / h
    W_k     = alpha W_{k-1} + (1 - alpha) Y(q_m, v_m, a_m)
    tau_f,k = alpha tau_f,k-1 + (1 - alpha) (tau_k + tau_{k-1}) / 2

i.e. the exact exponential-decay recursion with the interval's input evaluated at the
midpoint.  ``a_m`` is *not* a measured acceleration: ``(1 - alpha) a_m`` ~ lam (v_k -
v_{k-1}), the discrete counterpart of the ``lam Y_p - lam w*Y_p`` term; by summation by
parts the recursion equals lam Y_p,k minus a filtered momentum plus the filtered
``Y_h`` (with dM/dt taken as a difference over one sample), so velocity noise is
amplified by lam, never by 1/h.

Exactness: the midpoint rule and the midpoint state are both second order, so for a
smooth trajectory |W_k pi - tau_f(t_k)| = O(h^2) (halving h divides the error by ~4;
tested), and ``W_k pi`` equals the discretely filtered torque ``tau_f,k`` of the same
recursion to O(h^2).  One regressor evaluation per sample.

Implementation: where the model's Slotine-Li regressor is the compiled one (numba), a
whole sample -- midpoints, Y(q_m, v_m, a_m) as the Slotine-Li kernel with vr = v, both
recursions and the shift of the previous sample -- is one compiled call
(``filtered_step`` in :mod:`._slotine_li_compiled`); otherwise the same recursion runs
in numpy around :meth:`RobotModel.regressor`.  Both give the same W and tau_f to
rounding (tested).
"""
from __future__ import annotations

import math

import numpy as np

from ..validation import as_positive, as_vector


class FilteredRegressor:
    """Stateful W / filtered-torque pair for one robot model.

    ``update(q, v, tau)`` advances one sample and returns ``(W, tau_f)``; both arrays
    are internal buffers overwritten by the next update (copy them to keep them).
    ``tau`` may be ``None`` when only W is needed.
    """

    def __init__(self, model, lam: float, dt: float):
        self.model = model
        self.n, self.p = model.n, model.n_params
        self.dt = as_positive(dt, "dt")
        self._coef = np.empty(3)  # alpha, beta, 1/h (the compiled step's constants)
        self.lam = as_positive(lam, "lam")
        self.W = np.zeros((self.n, self.p))
        self.tau_f = np.zeros(self.n)
        # previous sample's q, v, tau (rows), midpoint scratch q_m, v_m, a_m (rows)
        self._prev = np.zeros((3, self.n))
        self._q_prev, self._v_prev, self._tau_prev = self._prev
        self._mid = np.empty((3, self.n))
        self._qm, self._vm, self._am = self._mid
        self._Y = np.empty((self.n, self.p))
        self._tmp = np.empty(self.n)
        compiled = getattr(model, "compiled_filtered_step", None)
        self._compiled = compiled() if compiled is not None else None
        self.samples = 0

    @property
    def lam(self) -> float:
        return self._lam

    @lam.setter
    def lam(self, value: float) -> None:
        self._lam = as_positive(value, "lam")
        self.alpha = math.exp(-self._lam * self.dt)
        self._inv_dt = 1.0 / self.dt
        self.beta = 1.0 - self.alpha
        self._coef[:] = (self.alpha, self.beta, self._inv_dt)

    @property
    def implementation(self) -> str:
        """``"compiled"`` (one numba call per sample) or ``"numpy"``."""
        return "compiled" if self._compiled is not None else "numpy"

    def reset(self) -> None:
        """Back to rest: the next update (re)initialises from its sample."""
        self.W.fill(0.0)
        self.tau_f.fill(0.0)
        self.samples = 0

    def update(self, q, v, tau=None, _add=np.add, _sub=np.subtract, _isfinite=math.isfinite):
        """Advance one sample with the measured q, v (and torque tau); returns (W, tau_f).

        Inputs are validated (length, NaN/inf -> ``ValueError`` naming the argument)
        before any state changes, so a rejected sample leaves the filter untouched.
        """
        if self.samples == 0:
            return self._first(q, v, tau)
        if self._compiled is not None:
            return self._update_compiled(q, v, tau)
        qm, vm, am = self._qm, self._vm, self._am
        try:
            if len(q) != self.n or len(v) != self.n:  # numpy would broadcast length 1
                raise ValueError("length")
            _add(q, self._q_prev, out=qm)
            qm *= 0.5
            _add(v, self._v_prev, out=vm)
            vm *= 0.5
            _sub(v, self._v_prev, out=am)
            am *= self._inv_dt
            Y = self.model.regressor(qm, vm, am)
            if tau is not None:
                t = _add(tau, self._tau_prev, out=self._tmp)
                if not _isfinite(t.dot(t)):
                    raise ValueError("tau")
        except (ValueError, TypeError, IndexError):
            self._validate(q, v, tau)  # raises naming the argument
            raise
        W = self.W
        W *= self.alpha
        Y *= self.beta
        W += Y
        if tau is not None:
            t *= 0.5 * self.beta
            self.tau_f *= self.alpha
            self.tau_f += t
            self._tau_prev[:] = tau
        self._q_prev[:] = q
        self._v_prev[:] = v
        self.samples += 1
        return W, self.tau_f

    def _update_compiled(self, q, v, tau):
        step, geo, work = self._compiled
        has_tau = tau is not None
        try:
            step(q, v, tau if has_tau else self._tmp, has_tau, self._prev, self._mid, self._coef,
                 geo, work, self._Y, self.W, self.tau_f)
        except (ValueError, TypeError):  # NaN/inf, wrong length, or a list / other dtype
            q, v, tau = self._validate(q, v, tau)  # raises naming the argument
            step(np.ascontiguousarray(q), np.ascontiguousarray(v),
                 np.ascontiguousarray(tau) if has_tau else self._tmp, has_tau, self._prev,
                 self._mid, self._coef, geo, work, self._Y, self.W, self.tau_f)
        self.samples += 1
        return self.W, self.tau_f

    def _validate(self, q, v, tau):
        n = self.n
        q = as_vector(q, n, "q")
        v = as_vector(v, n, "v")
        if tau is not None:
            tau = as_vector(tau, n, "tau")
        return q, v, tau

    def _first(self, q, v, tau):
        # filter at rest at the first sample: W = 0, tau_f = 0
        q, v, tau = self._validate(q, v, tau)
        self._q_prev[:] = q
        self._v_prev[:] = v
        if tau is not None:
            self._tau_prev[:] = tau
        self.samples = 1
        return self.W, self.tau_f

    def prediction_error(self, pi) -> np.ndarray:
        """e = W pi - tau_f (the composite-adaptation torque prediction error)."""
        return self.W @ np.asarray(pi, dtype=float) - self.tau_f

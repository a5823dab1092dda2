"""Joint friction models beyond viscous + Coulomb, identified together with the rigid body.

Per joint, velocity ``v`` [rad/s], friction torque [N m]:

* ``linear`` -- viscous + Coulomb, the friction columns of ``RobotModel(friction=True)``::

      tau_f(v) = f_v v + f_c sgn(v)          (f_c tanh(v / eps) with ``smoothing`` eps > 0)

* ``sigmoid`` -- the smooth, offset Coulomb characteristic of harmonic-drive joints
  (Gaz, Cognetti, Oliva, Robuffo Giordano, De Luca, IEEE RA-L 4(4), 2019, the Panda's
  published model), plus a viscous term so that it contains the linear model's slope::

      tau_f(v) = f_v v + phi1 / (1 + exp(-phi2 (v + phi3))) - phi1 / (1 + exp(-phi2 phi3))

  ``tau_f(0) = 0``; it rises by ``phi1`` (about ``phi1 / 2`` either side), steepest
  (slope ``f_v + phi1 phi2 / 4``) at ``v = -phi3``; ``phi2 -> inf`` with ``phi3 = 0``
  is the linear model with ``f_c = phi1 / 2``.
* ``stribeck`` -- Coulomb with a break-away torque at rest (as the simulator's plant
  has it, ``sim/plant.py``), the Stribeck velocity ``v_s`` estimated::

      tau_f(v) = f_v v + f_c tanh(v / eps) + f_s exp(-(v / v_s)^2) tanh(v / eps)

  with ``eps`` (``smoothing``, default 0.01 rad/s, the simulator's) fixed.

Every model (:class:`LinearFriction`, :class:`SigmoidFriction`,
:class:`StribeckFriction`) holds one value of each parameter per joint and gives
:meth:`~FrictionModel.torque` (N x n), its velocity derivative
:meth:`~FrictionModel.slope`, its parameter Jacobian
:meth:`~FrictionModel.parameter_jacobian`, :meth:`~FrictionModel.parameters` and a JSON
form (:meth:`~FrictionModel.to_dict`, :func:`from_dict`; no pickle).

Fitting
-------
:func:`fit_friction` fits a model to velocity/torque samples, joint by joint, by bounded
nonlinear least squares (``scipy.optimize.least_squares``, trust-region reflective,
analytic Jacobian).  Bounds: ``phi1 >= 0``, ``0.1 <= phi2 <= 1e4`` s/rad (below 0.1 the
sigmoid's transition is wider than any joint's velocity range and indistinguishable
from viscous friction; above 1e4 it is a step), ``|phi3| <= phi3_max`` (0.5 rad/s);
``f_c, f_s >= 0`` and ``1e-3 <= v_s <= 10`` rad/s; ``f_v`` is free, as in the linear
fit.  The NLS is started from the linear fit's ``(f_v, f_c)`` (sigmoid:
``phi1 = 2 f_c``, ``phi2 = 20`` s/rad, ``phi3 = 0``; Stribeck: ``f_s = 0``,
``v_s = 0.1`` rad/s) and, competing with it, from the best point of a coarse grid over
the nonlinear parameters (``phi2, phi3``, resp. ``v_s``) on which the others enter
linearly and are solved by least squares; the lower final cost wins.  The grid keeps a
badly placed start (e.g. a saturated sigmoid whose gradient in ``phi2`` vanishes) from
ending in a local minimum.

:func:`identify_friction` identifies the rigid body and a smooth friction model
jointly from ``(q, qd, qdd, tau)`` by alternation (block-coordinate descent), started
from the linear identification (:func:`~.identification.identify`); each alternation is

(b) per joint, the smooth model plus a constant (the joint's torque offset, with
    ``offset=True``) by the bounded NLS above, on the rigid-body residual
    ``r = tau - Y_rb theta_rb`` (warm-started from the previous alternation);
(a) one least squares for the rigid-body base parameters ``theta_rb`` (+ offsets)
    *and* the friction's linear coefficients at its current shape (``f_v, phi1`` at
    the current ``phi2, phi3``; ``f_v, f_c, f_s`` at the current ``v_s``), i.e. on the
    columns ``[Y_rb, basis_j(qd_j)]``; joint rows weighted by the inverse residual
    standard deviation of the current model (``weighted``: the rule of
    :func:`~.identification.identify`, so a joint whose friction the smooth model
    explains gains weight); a coefficient leaving its bound (``phi1, f_c, f_s >= 0``)
    is held at it.

Why this shape: the rigid body keeps its one linear least squares (~50 parameters, no
nonlinear solver over them), the nonlinear problems stay small (4-5 parameters per
joint, each well started), and the couplings between the blocks are handled where
they are strong.  A joint's torque offset trades against the sigmoid's velocity offset
``phi3`` and asymmetry, so step (b) fits the constant with the friction; the viscous
coefficient and the friction amplitude correlate with rigid-body columns of the same
joint's row (Coriolis terms carry ``qd``), so step (a) solves them with the rigid body
instead of subtracting a fixed friction torque -- on a simulated Panda recording with
the Gaz friction, three alternations reach the residual that subtracting the friction
torque reaches after five.  Three (the default) are enough there: the training residual
RMSE changes by about 3 % from the second alternation to the third and by under 0.5 %
afterwards
(:attr:`FrictionFit.history`); ``iterations`` and ``tol`` set the number.

No ROS import.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares
from scipy.special import expit

from .identification import _check, identify

__all__ = ["FRICTION_MODELS", "FrictionModel", "LinearFriction", "SigmoidFriction", "StribeckFriction",
           "from_dict", "fit_friction", "FrictionFit", "identify_friction", "PHI3_MAX", "STRIBECK_SMOOTHING"]

#: bound on the sigmoid's velocity offset |phi3| [rad/s] in the fit
PHI3_MAX = 0.5
#: the Stribeck model's tanh smoothing eps [rad/s] (the simulator's default)
STRIBECK_SMOOTHING = 0.01
PHI2_RANGE = (0.1, 1e4)           # s/rad
VS_RANGE = (1e-3, 10.0)           # rad/s
_PHI2_GRID = np.geomspace(0.5, 2000.0, 14)
_PHI3_GRID = np.array([-1.0, -0.3, -0.1, -0.03, 0.0, 0.03, 0.1, 0.3, 1.0])   # times phi3_max
_VS_GRID = np.geomspace(0.003, 2.0, 12)


class FrictionModel:
    """Per-joint friction ``tau_f(v)``: the parameters :attr:`PARAMETERS`, one value per
    joint each (a single value applies to every joint)."""

    kind = ""
    PARAMETERS: tuple = ()
    LINEAR: tuple = ()             # the parameters the torque is linear in (amplitudes, viscous)
    _SETTINGS: tuple = ()          # fixed settings (keyword arguments), e.g. "smoothing"

    def __init__(self, *values, **settings):
        arrays = [np.atleast_1d(np.asarray(v, dtype=float)) for v in values]
        if any(a.ndim != 1 for a in arrays):
            raise ValueError(f"{self.kind} friction: every parameter is one value per joint (1-D)")
        try:
            arrays = np.broadcast_arrays(*arrays)
        except ValueError:
            raise ValueError(f"{self.kind} friction: parameters of different lengths "
                             f"{dict(zip(self.PARAMETERS, [a.size for a in arrays]))}") from None
        p = np.array(arrays, dtype=float)
        if p.shape[1] == 0:
            raise ValueError(f"{self.kind} friction: no joints")
        if not np.isfinite(p).all():
            raise ValueError(f"{self.kind} friction: non-finite parameters {self._named(p)}")
        self._settings = {k: float(v) for k, v in settings.items()}
        self._validate(p)
        self._p = p

    # ------------------------------------------------------------ per kind
    def _validate(self, p) -> None:
        pass

    def _tau(self, p, v):
        """Friction torque for parameters ``p`` (P x n) at ``v`` (..., n)."""
        raise NotImplementedError

    def _dtau_dp(self, p, v):
        """(..., n, P): d tau_j / d p[k, j]."""
        raise NotImplementedError

    def _dtau_dv(self, p, v):
        raise NotImplementedError

    def _basis(self, p, v):
        """(..., n, L): the functions the parameters :attr:`LINEAR` multiply, the others
        (the shape) at ``p``: ``tau = basis @ p[LINEAR]``."""
        raise NotImplementedError

    @staticmethod
    def _bounds(phi3_max):
        """(lower, upper) of one joint's parameters in the fit."""
        raise NotImplementedError

    def _grid(self, v, r, constant, phi3_max):
        """Candidate starts of one joint (v, r 1-D): the nonlinear parameters on a grid,
        the linear ones by least squares."""
        return []

    @classmethod
    def _from_linear(cls, fv, fc, settings):
        """One joint's start derived from a linear fit (f_v, f_c)."""
        raise NotImplementedError

    # ------------------------------------------------------------ public
    @property
    def n(self) -> int:
        """Number of joints."""
        return self._p.shape[1]

    def vector(self) -> np.ndarray:
        """The parameters as a P x n array (rows in :attr:`PARAMETERS` order)."""
        return self._p.copy()

    def settings(self) -> dict:
        """The fixed (not fitted) settings, e.g. ``{"smoothing": eps}``."""
        return dict(self._settings)

    def with_vector(self, p) -> "FrictionModel":
        """The same kind and settings with parameters ``p`` (P x n)."""
        p = np.asarray(p, dtype=float)
        if p.ndim != 2 or p.shape[0] != len(self.PARAMETERS):
            raise ValueError(f"{self.kind} friction: need a {len(self.PARAMETERS)} x n parameter array, got {p.shape}")
        return type(self)(*p, **self._settings)

    def _velocity(self, v):
        v = np.asarray(v, dtype=float)
        if v.ndim not in (1, 2) or v.shape[-1] != self.n:
            raise ValueError(f"{self.kind} friction: velocity must be ({self.n},) or (N, {self.n}), got {v.shape}")
        if not np.isfinite(v).all():
            raise ValueError(f"{self.kind} friction: velocity contains NaN/inf")
        return v

    def torque(self, v) -> np.ndarray:
        """Friction torque [N m] at joint velocity ``v`` [rad/s], (N, n) or (n,)."""
        return self._tau(self._p, self._velocity(v))

    def slope(self, v) -> np.ndarray:
        """``d tau_f / d v`` per joint [N m s/rad], the shape of ``v``."""
        return self._dtau_dv(self._p, self._velocity(v))

    def parameter_jacobian(self, v) -> np.ndarray:
        """``d tau_f[..., j] / d parameter[k, j]``: shape ``v.shape + (P,)``, in
        :attr:`PARAMETERS` order (joint ``j``'s torque depends on joint ``j``'s
        parameters only)."""
        return self._dtau_dp(self._p, self._velocity(v))

    def parameters(self) -> dict:
        """``{name: [value per joint]}``."""
        return {k: [float(x) for x in row] for k, row in zip(self.PARAMETERS, self._p)}

    def to_dict(self) -> dict:
        """JSON-ready: ``{"kind", "parameters", **settings}`` (:func:`from_dict` reads it)."""
        return {"kind": self.kind, "parameters": self.parameters(), **self._settings}

    @classmethod
    def from_dict(cls, d: dict) -> "FrictionModel":
        """The model :meth:`to_dict` wrote (any kind, when called on :class:`FrictionModel`)."""
        if not isinstance(d, dict) or "kind" not in d or "parameters" not in d:
            raise ValueError("a friction model dict needs 'kind' and 'parameters'")
        kind = d["kind"]
        if kind not in _KINDS:
            raise ValueError(f"unknown friction model {kind!r}; one of {FRICTION_MODELS}")
        target = _KINDS[kind]
        if cls is not FrictionModel and target is not cls:
            raise ValueError(f"{cls.__name__}.from_dict got a {kind!r} model")
        params = d["parameters"]
        missing = [k for k in target.PARAMETERS if k not in params]
        extra = sorted(set(params) - set(target.PARAMETERS))
        if missing or extra:
            raise ValueError(f"{kind} friction: parameters {target.PARAMETERS} expected; missing {missing},"
                             f" unknown {extra}")
        settings = {k: v for k, v in d.items() if k not in ("kind", "parameters")}
        unknown = sorted(set(settings) - set(target._SETTINGS))
        if unknown:
            raise ValueError(f"{kind} friction: unknown settings {unknown}")
        return target(*(params[k] for k in target.PARAMETERS), **settings)

    def _named(self, p) -> dict:
        return {k: np.round(row, 6).tolist() for k, row in zip(self.PARAMETERS, p)}

    def __repr__(self) -> str:
        s = "".join(f", {k}={v:g}" for k, v in self._settings.items())
        return f"{type(self).__name__}({self._named(self._p)}{s})"


class LinearFriction(FrictionModel):
    """``tau_f = f_v v + f_c sgn(v)`` (``smoothing`` eps > 0: ``f_c tanh(v / eps)``), the
    friction columns of ``RobotModel(friction=True, coulomb_smoothing=eps)``."""

    kind = "linear"
    PARAMETERS = ("viscous", "coulomb")
    LINEAR = (0, 1)
    _SETTINGS = ("smoothing",)

    def __init__(self, viscous, coulomb, *, smoothing: float = 0.0):
        if not (np.isfinite(smoothing) and smoothing >= 0):
            raise ValueError(f"linear friction: smoothing must be >= 0, got {smoothing!r}")
        super().__init__(viscous, coulomb, smoothing=smoothing)

    def _coulomb(self, v):
        eps = self._settings["smoothing"]
        return np.tanh(v / eps) if eps > 0 else np.sign(v)

    def _tau(self, p, v):
        return p[0] * v + p[1] * self._coulomb(v)

    def _dtau_dp(self, p, v):
        return np.stack(np.broadcast_arrays(v, self._coulomb(v)), axis=-1)

    def _dtau_dv(self, p, v):
        eps = self._settings["smoothing"]
        dc = (1.0 - np.tanh(v / eps) ** 2) / eps if eps > 0 else np.zeros_like(v)
        return p[0] + p[1] * dc

    def _basis(self, p, v):
        return self._dtau_dp(p, v)

    @staticmethod
    def _bounds(phi3_max):
        return np.full(2, -np.inf), np.full(2, np.inf)

    @classmethod
    def _from_linear(cls, fv, fc, settings):
        return np.array([fv, fc])


class SigmoidFriction(FrictionModel):
    """``tau_f = f_v v + phi1 / (1 + exp(-phi2 (v + phi3))) - phi1 / (1 + exp(-phi2 phi3))``
    (Gaz et al. 2019 + viscous): ``phi1`` [N m] >= 0, ``phi2`` [s/rad] > 0, ``phi3`` [rad/s]."""

    kind = "sigmoid"
    PARAMETERS = ("viscous", "phi1", "phi2", "phi3")
    LINEAR = (0, 1)
    _SETTINGS = ()

    def __init__(self, viscous, phi1, phi2, phi3):
        super().__init__(viscous, phi1, phi2, phi3)

    def _validate(self, p):
        if np.any(p[1] < 0) or np.any(p[2] <= 0):
            raise ValueError(f"sigmoid friction: need phi1 >= 0 and phi2 > 0, got {self._named(p)}")

    def _tau(self, p, v):
        return p[0] * v + p[1] * (expit(p[2] * (v + p[3])) - expit(p[2] * p[3]))

    def _dtau_dp(self, p, v):
        fv, phi1, phi2, phi3 = p
        sa, sb = expit(phi2 * (v + phi3)), expit(phi2 * phi3)
        da, db = sa * (1.0 - sa), sb * (1.0 - sb)
        return np.stack(np.broadcast_arrays(v, sa - sb, phi1 * (da * (v + phi3) - db * phi3),
                                            phi1 * phi2 * (da - db)), axis=-1)

    def _dtau_dv(self, p, v):
        sa = expit(p[2] * (v + p[3]))
        return p[0] + p[1] * p[2] * sa * (1.0 - sa)

    def _basis(self, p, v):
        return np.stack(np.broadcast_arrays(v, expit(p[2] * (v + p[3])) - expit(p[2] * p[3])), axis=-1)

    @staticmethod
    def _bounds(phi3_max):
        return (np.array([-np.inf, 0.0, PHI2_RANGE[0], -phi3_max]),
                np.array([np.inf, np.inf, PHI2_RANGE[1], phi3_max]))

    def _grid(self, v, r, constant, phi3_max):
        out = []
        for phi2 in _PHI2_GRID:
            for phi3 in np.unique(np.clip(_PHI3_GRID * phi3_max, -phi3_max, phi3_max)):
                cols = [v, expit(phi2 * (v + phi3)) - expit(phi2 * phi3)]
                lin = _nonneg_lstsq(cols, r, constant, nonneg=(1,))
                out.append((lin[-1], np.array([lin[0], lin[1], phi2, phi3] + ([lin[2]] if constant else []))))
        return [min(out, key=lambda c: c[0])[1]]

    @classmethod
    def _from_linear(cls, fv, fc, settings):
        return np.array([fv, 2.0 * max(fc, 0.0), 20.0, 0.0])


class StribeckFriction(FrictionModel):
    """``tau_f = f_v v + f_c tanh(v / eps) + f_s exp(-(v / v_s)^2) tanh(v / eps)``:
    ``f_c, f_s`` [N m] >= 0, ``v_s`` [rad/s] > 0 fitted, ``eps`` (``smoothing``) > 0 fixed."""

    kind = "stribeck"
    PARAMETERS = ("viscous", "coulomb", "stribeck", "stribeck_velocity")
    LINEAR = (0, 1, 2)
    _SETTINGS = ("smoothing",)

    def __init__(self, viscous, coulomb, stribeck, stribeck_velocity, *, smoothing: float = STRIBECK_SMOOTHING):
        if not (np.isfinite(smoothing) and smoothing > 0):
            raise ValueError(f"stribeck friction: smoothing must be > 0, got {smoothing!r}")
        super().__init__(viscous, coulomb, stribeck, stribeck_velocity, smoothing=smoothing)

    def _validate(self, p):
        if np.any(p[3] <= 0):
            raise ValueError(f"stribeck friction: need stribeck_velocity > 0, got {self._named(p)}")

    def _tau(self, p, v):
        t = np.tanh(v / self._settings["smoothing"])
        return p[0] * v + (p[1] + p[2] * np.exp(-(v / p[3]) ** 2)) * t

    def _dtau_dp(self, p, v):
        t = np.tanh(v / self._settings["smoothing"])
        g = np.exp(-(v / p[3]) ** 2)
        return np.stack(np.broadcast_arrays(v, t, g * t, p[2] * t * g * 2.0 * v ** 2 / p[3] ** 3), axis=-1)

    def _dtau_dv(self, p, v):
        eps = self._settings["smoothing"]
        t = np.tanh(v / eps)
        g = np.exp(-(v / p[3]) ** 2)
        return p[0] + (p[1] + p[2] * g) * (1.0 - t * t) / eps - p[2] * t * g * 2.0 * v / p[3] ** 2

    def _basis(self, p, v):
        return self._dtau_dp(p, v)[..., :3]

    @staticmethod
    def _bounds(phi3_max):
        return np.array([-np.inf, 0.0, 0.0, VS_RANGE[0]]), np.array([np.inf, np.inf, np.inf, VS_RANGE[1]])

    def _grid(self, v, r, constant, phi3_max):
        t = np.tanh(v / self._settings["smoothing"])
        out = []
        for vs in _VS_GRID:
            lin = _nonneg_lstsq([v, t, np.exp(-(v / vs) ** 2) * t], r, constant, nonneg=(1, 2))
            out.append((lin[-1], np.array([lin[0], lin[1], lin[2], vs] + ([lin[3]] if constant else []))))
        return [min(out, key=lambda c: c[0])[1]]

    @classmethod
    def _from_linear(cls, fv, fc, settings):
        return np.array([fv, max(fc, 0.0), 0.0, 0.1])


_KINDS = {c.kind: c for c in (LinearFriction, SigmoidFriction, StribeckFriction)}
#: the friction model names (``--friction`` of ``adaptive-dynamics identify``)
FRICTION_MODELS = tuple(_KINDS)


def from_dict(d: dict) -> FrictionModel:
    """A friction model from its :meth:`FrictionModel.to_dict` form."""
    return FrictionModel.from_dict(d)


def _nonneg_lstsq(cols, r, constant, nonneg=()):
    """Least squares of ``r`` on ``cols`` (+ a constant), the coefficients ``nonneg``
    clamped to zero when negative (then the others refitted): a feasible start, not an
    exact NNLS.  Returns the coefficients followed by the cost."""
    C = np.column_stack(list(cols) + ([np.ones_like(r)] if constant else []))
    G, g = C.T @ C, C.T @ r                       # normal equations: 2-4 columns
    active = np.ones(C.shape[1], dtype=bool)
    for _ in range(len(nonneg) + 1):
        x = np.zeros(C.shape[1])
        x[active], *_ = np.linalg.lstsq(G[np.ix_(active, active)], g[active], rcond=None)
        bad = [k for k in nonneg if x[k] < 0]
        if not bad:
            break
        active[bad] = False
    x[list(nonneg)] = np.maximum(x[list(nonneg)], 0.0)
    e = C @ x - r
    return [*x, 0.5 * float(e @ e)]


def _bounded_lstsq(M, y, lo, hi):
    """Least squares ``M x ~ y`` (columns equilibrated) with ``lo <= x <= hi`` kept by an
    active set: a coefficient that leaves its bounds is fixed at the bound and the rest
    refitted, until none leaves (a feasible point near the bounded optimum -- exact when
    no bound is active; step (b) refines the friction exactly)."""
    scale = np.linalg.norm(M, axis=0)
    scale[scale == 0] = 1.0
    Ms = M / scale
    G, g = Ms.T @ Ms, Ms.T @ y                   # normal equations of the equilibrated columns
    x = np.zeros(M.shape[1])
    free = np.ones(M.shape[1], dtype=bool)
    for _ in range(M.shape[1]):
        rhs = g[free] - G[np.ix_(free, ~free)] @ (x[~free] * scale[~free])
        sol, *_ = np.linalg.lstsq(G[np.ix_(free, free)], rhs, rcond=None)
        x[free] = sol / scale[free]
        out = free & ((x < lo) | (x > hi))
        if not out.any():
            break
        x[out] = np.clip(x[out], lo[out], hi[out])
        free &= ~out
    return x


def _kind_class(kind):
    if kind not in _KINDS:
        raise ValueError(f"unknown friction model {kind!r}; one of {FRICTION_MODELS}")
    return _KINDS[kind]


def _default_settings(kind, smoothing):
    if kind == "linear":
        return {"smoothing": 0.0 if smoothing is None else float(smoothing)}
    if kind == "stribeck":
        return {"smoothing": STRIBECK_SMOOTHING if smoothing is None else float(smoothing)}
    if smoothing is not None:
        raise ValueError("the sigmoid friction model has no smoothing setting")
    return {}


def _fit(kind, v, r, *, start=None, constant=False, smoothing=None, phi3_max=PHI3_MAX):
    """Fit per joint: ``(model, constants (n,), costs (n,))``; ``start`` a model of the
    same kind (warm start: the only start) or a :class:`LinearFriction` (or None: the
    linear fit of the data) from which the NLS starts, competing with the grid's best."""
    cls = _kind_class(kind)
    settings = _default_settings(kind, smoothing) if not isinstance(start, cls) else start.settings()
    n = v.shape[1]
    if not (np.isfinite(phi3_max) and phi3_max > 0):
        raise ValueError(f"phi3_max must be > 0, got {phi3_max!r}")
    if kind == "linear" or not isinstance(start, (cls, LinearFriction)):
        lin_cols = LinearFriction(np.zeros(n), np.zeros(n), smoothing=settings.get("smoothing", 0.0)
                                  if kind == "linear" else 0.0)
        coef = [_nonneg_lstsq([v[:, j], lin_cols._coulomb(v[:, j])], r[:, j], constant) for j in range(n)]
        if kind == "linear":
            P = np.array([c[:2] for c in coef]).T
            consts = np.array([c[2] if constant else 0.0 for c in coef])
            return cls(*P, **settings), consts, np.array([c[-1] for c in coef])
        start = lin_cols.with_vector(np.array([c[:2] for c in coef]).T)
    template = cls(*cls._from_linear(0.0, 0.0, settings)[:, None], **settings) if kind != "linear" else None
    P = len(cls.PARAMETERS)
    lb, ub = template._bounds(phi3_max)
    if constant:
        lb, ub = np.append(lb, -np.inf), np.append(ub, np.inf)
    params, consts, costs = np.zeros((P, n)), np.zeros(n), np.zeros(n)
    sp = start.vector()
    for j in range(n):
        vj, rj = v[:, j], r[:, j]
        V = vj[:, None]
        if isinstance(start, cls):
            x0s = [sp[:, j]]
        else:
            x0s = [cls._from_linear(sp[0, j], sp[1, j], settings)]
        if constant:
            x0s = [np.append(x, np.mean(rj - template._tau(x[:, None], V)[:, 0])) for x in x0s]
        if not isinstance(start, cls):
            x0s += template._grid(vj, rj, constant, phi3_max)

        def fun(x, V=V, rj=rj):
            e = template._tau(x[:P, None], V)[:, 0] - rj
            return e + x[P] if constant else e

        def jac(x, V=V):
            J = template._dtau_dp(x[:P, None], V)[:, 0, :]
            return np.column_stack([J, np.ones(len(J))]) if constant else J

        best = None
        for x0 in x0s:
            sol = least_squares(fun, np.clip(x0, lb, ub), jac=jac, bounds=(lb, ub), method="trf",
                                x_scale="jac", max_nfev=200)
            if best is None or sol.cost < best.cost:
                best = sol
        params[:, j] = best.x[:P]
        consts[j] = best.x[P] if constant else 0.0
        costs[j] = best.cost
    return cls(*params, **settings), consts, costs


def fit_friction(kind: str, v, tau, *, start: FrictionModel | None = None, smoothing: float | None = None,
                 phi3_max: float = PHI3_MAX) -> FrictionModel:
    """The friction model ``kind`` (``linear``, ``sigmoid`` or ``stribeck``) fitted to
    velocity ``v`` and friction torque ``tau`` samples, (N, n) each (or (N,): one
    joint), joint by joint, by least squares (bounded NLS for the smooth models; see the
    module docstring for bounds and starts).  ``start``: a model of the same kind (warm
    start) or a :class:`LinearFriction` to start from (default: the data's linear fit);
    ``smoothing``: eps of ``tanh(v / eps)`` (linear: 0 = ``sgn``; Stribeck: 0.01 rad/s);
    ``phi3_max``: the bound on the sigmoid's ``|phi3|`` [rad/s]."""
    v, tau = np.asarray(v, dtype=float), np.asarray(tau, dtype=float)
    if v.ndim == 1:
        v, tau = v[:, None], tau.reshape(-1, 1) if tau.ndim == 1 else tau
    if not (v.shape == tau.shape and v.ndim == 2):
        raise ValueError(f"v and tau must be (N, n) (or (N,)) of the same shape, got {v.shape}, {tau.shape}")
    if not (np.isfinite(v).all() and np.isfinite(tau).all()):
        raise ValueError("friction data contain NaN/inf")
    cls = _kind_class(kind)
    if v.shape[0] < 3 * len(cls.PARAMETERS):
        raise ValueError(f"{v.shape[0]} samples are too few for the {kind} model")
    if start is not None and (not isinstance(start, (cls, LinearFriction)) or start.n != v.shape[1]):
        raise ValueError(f"start must be a {cls.__name__} or LinearFriction of {v.shape[1]} joints, got {start!r}")
    return _fit(kind, v, tau, start=start, smoothing=smoothing, phi3_max=phi3_max)[0]


@dataclass
class FrictionFit:
    """Result of :func:`identify_friction`: the rigid body (base parameters without the
    friction columns) + a friction model + (``offset``) a constant torque per joint."""

    kind: str
    friction: FrictionModel
    theta_rb: np.ndarray           # rigid-body base parameters (the model's base coordinates, friction excluded)
    names: list                    # their names
    pi: np.ndarray                 # a full pi (friction entries zero) with ``Y pi`` the rigid-body torque
    offset: np.ndarray             # constant torque per joint (empty without offset)
    residual_rmse: np.ndarray      # per joint [N m], on the identification data
    tau_rms: np.ndarray            # per joint [N m]
    samples: int
    iterations: int = 0            # alternations run
    history: list = field(default_factory=list)   # residual RMSE per joint after each alternation

    def torque(self, model, q, qd, qdd, *, offset: bool = True) -> np.ndarray:
        """Predicted joint torque (N x n): ``Y pi + tau_f(qd)`` (+ the offsets)."""
        tau = model.regressor_batch(q, qd, qdd) @ self.pi + self.friction.torque(np.atleast_2d(qd))
        return tau + self.offset if offset and self.offset.size else tau

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "friction": self.friction.to_dict(), "samples": int(self.samples),
               "iterations": int(self.iterations), "residual_rmse": [float(x) for x in self.residual_rmse],
               "relative_residual": [float(a / max(b, 1e-12)) for a, b in zip(self.residual_rmse, self.tau_rms)]}
        if self.offset.size:
            out["offset"] = [float(x) for x in self.offset]
        return out


def _split_columns(model, base):
    """Positions of the rigid-body and of the friction columns among the base columns."""
    fr = base.index >= model.n_inertial
    if int(fr.sum()) != 2 * model.n or not np.array_equal(base.index[fr], model.n_inertial + np.arange(2 * model.n)):
        raise RuntimeError("the base parameters do not keep the 2n friction columns apart")
    return np.flatnonzero(~fr), np.flatnonzero(fr)


def identify_friction(model, q, qd, qdd, tau, kind: str = "sigmoid", *, offset: bool = False,
                      weighted: bool = True, iterations: int = 3, linear=None, base=None,
                      smoothing: float | None = None, phi3_max: float = PHI3_MAX, tol: float = 1e-4) -> FrictionFit:
    """Rigid-body base parameters and the friction model ``kind`` identified jointly
    from samples (N, n) of ``q, qd, qdd`` and the joint torque, by alternation started
    from the linear identification (module docstring).

    ``model``: a :class:`RobotModel` with ``friction=True`` (its friction columns are
    the linear model).  ``linear``: that model's :func:`identify` result on the same
    data, when already computed (else computed here with ``weighted`` and ``offset`` on
    every sample, ``min_velocity=0``: the smooth models fit the near-rest samples the
    linear identification leaves out by default, and start from a fit that saw them);
    ``base``: ``model.base_parameters()``, when already computed.
    ``iterations``: alternations (each a friction NLS then a rigid-body least squares);
    fewer when the residual RMSE of every joint changes by less than ``tol``
    (relative).  ``kind="linear"`` returns the linear identification itself."""
    cls = _kind_class(kind)
    if not model.friction:
        raise ValueError("identify_friction needs a model with friction columns (RobotModel(..., friction=True))")
    if int(iterations) < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations!r}")
    q, qd, qdd, tau = _check(model, q, qd, qdd, tau)
    n, N = model.n, q.shape[0]
    base = model.base_parameters() if base is None else base
    rb, fr = _split_columns(model, base)
    if linear is None:   # the smooth models fit every sample, near rest too: so does their start
        linear = identify(model, q, qd, qdd, tau, weighted=weighted, offset=offset, min_velocity=0.0)
    if linear.theta.shape != (base.n_base,) or bool(linear.offset.size) != bool(offset):
        raise ValueError("linear: not an identify() result of this model with this offset setting")
    theta_fr = linear.theta[fr]
    lin_model = LinearFriction(theta_fr[:n], theta_fr[n:], smoothing=model.coulomb_smoothing)
    tau_rms = np.sqrt(np.mean(tau * tau, axis=0))

    def result(friction, x, its, history):
        theta = np.zeros(base.n_base)
        theta[rb] = x[: rb.size]
        off = x[rb.size:].copy()
        res = tau - A @ x - friction.torque(qd)
        return FrictionFit(kind=kind, friction=friction, theta_rb=theta[rb], names=[base.names[i] for i in rb],
                           pi=base.from_base(theta), offset=off, residual_rmse=np.sqrt(np.mean(res * res, axis=0)),
                           tau_rms=tau_rms, samples=N, iterations=its, history=history)

    A = model.regressor_batch(q, qd, qdd, base=base)[:, :, rb]
    if offset:
        A = np.concatenate([A, np.broadcast_to(np.eye(n), (N, n, n))], axis=2)
    x = np.concatenate([linear.theta[rb], linear.offset])
    if cls is LinearFriction:
        return result(lin_model, x, 0, [])
    b, L = A.shape[2], len(cls.LINEAR)
    lin_idx = list(cls.LINEAR)
    lb, ub = cls._bounds(phi3_max)
    lo = np.concatenate([np.full(b, -np.inf), np.tile(lb[lin_idx], n)])     # the coefficients of step (a)
    hi = np.concatenate([np.full(b, np.inf), np.tile(ub[lin_idx], n)])
    friction, history, prev = lin_model, [], None
    for it in range(int(iterations)):
        # (b) per joint: the friction model (+ the joint's constant) on the rigid-body residual
        rigid = np.einsum("knb,b->kn", A[:, :, : rb.size], x[: rb.size])
        friction, consts, _ = _fit(kind, qd, tau - rigid, start=friction, constant=offset, smoothing=smoothing,
                                   phi3_max=phi3_max)
        if offset:
            x = np.concatenate([x[: rb.size], consts])
        # (a) rigid body (+ offsets) and the friction's linear coefficients at its shape
        p = friction.vector()
        B = friction._basis(p, qd)                                            # N x n x L
        F = np.zeros((N, n, n, L))
        F[:, np.arange(n), np.arange(n), :] = B
        Aj = np.concatenate([A, F.reshape(N, n, n * L)], axis=2)
        xj = np.concatenate([x, p[lin_idx].T.reshape(-1)])
        if weighted:
            e = tau - np.einsum("knb,b->kn", Aj, xj)
            sd = np.sqrt(np.mean(e * e, axis=0))
            w = 1.0 / np.maximum(sd, 1e-6 * max(float(sd.max()), 1e-12))
        else:
            w = np.ones(n)
        xj = _bounded_lstsq((Aj * w[None, :, None]).reshape(N * n, -1), (tau * w[None, :]).reshape(N * n), lo, hi)
        x = xj[:b]
        p[lin_idx] = xj[b:].reshape(n, L).T
        friction = friction.with_vector(p)
        res = tau - np.einsum("knb,b->kn", A, x) - friction.torque(qd)
        rmse = np.sqrt(np.mean(res * res, axis=0))
        history.append([float(r) for r in rmse])
        if prev is not None and np.all(np.abs(rmse - prev) <= tol * np.maximum(prev, 1e-12)):
            return result(friction, x, it + 1, history)
        prev = rmse
    return result(friction, x, int(iterations), history)

"""Task-space model reference adaptive control (MRAC) of SCQP (no ROS import).

Khadivar, Chatzilygeroudis & Billard, "Self-Correcting Quadratic Programming-Based
Robot Control", Sec. IV-A (eq. 4-9), Appendix VIII (eq. A1-A6) and IX (RBF basis).
The controller turns the desired task-space motion into the reference acceleration
``xdd_r`` that a QP / inverse-dynamics layer then realises.

State and reference model (l task dimensions, n = 2 l)
------------------------------------------------------
::

    zeta   = [x - origin, xd]                    (measured,  R^2l)
    zeta_d = [x_des - origin, xd_des]            (desired,   R^2l)
    A_r = [[0, I], [-Kp, -Kd]],  B_r = [[0], [I]]                        (2l x 2l, 2l x l)
    zeta_r_dot = A_r zeta_r + B_r r(t)                                     (5)
    r(t) = -B_r^+ A_r zeta_d  = Kp x_des + Kd xd_des                       (Sec. IV-A)

``B_r^+`` is the Moore-Penrose pseudo-inverse (``numpy.linalg.pinv``).  ``zeta_r`` is
propagated exactly over each control period for an input that is linear over the
period, ``r(t_k + t) = r_k + r_dot_k t`` (``hold="foh"``, default) or constant
(``hold="zoh"``, i.e. ``r_dot_k = 0``)::

    expm([[A_r, B_r, 0], [0, 0, I], [0, 0, 0]] dt) = [[Ad, G0, G1], ...]
    zeta_r+ = Ad zeta_r + G0 r_k + G1 r_dot_k,     r_dot_k = -B_r^+ A_r zeta_d_dot

(``zeta_d_dot = [xd_des, xdd_des]``, ``G1 = int_0^dt exp(A_r (dt - t)) B_r t dt``).
Stable for any dt and Kp, Kd > 0 (the eigenvalues of Ad are exp(lambda_i(A_r) dt)).
The ramp matters for a moving target: with r held, the model's internal PD is pulled
towards the stale ``x_des(t_k)`` for the whole period and ``zeta_r`` lags by about
``xd_des dt / 2`` (0.8 mm at 0.3 m/s and dt = 5 ms) -- an error the sampled plant does
not have and that adaptation would chase; the ramp makes the lag O(dt^2).  For
``reference="paper"`` r_dot_k is exact; for ``"trajectory"`` the unknown jerk term
(``d^3 x_des / dt^3`` in r_dot) is omitted.
``zeta_r`` starts at the first measured ``zeta`` (so e = 0 on the first cycle) and is
re-initialised by :meth:`TaskSpaceMRAC.reset_reference`.

``reference="trajectory"`` (not the paper; see "xdd_des and the reference model" below)
uses instead the input that makes zeta_d itself a solution of (5)::

    r(t) = B_r^+ (zeta_d_dot - A_r zeta_d) = xdd_des + Kp x_des + Kd xd_des

Control (7)-(8) and error
-------------------------
::

    e  = zeta - zeta_r                                                     (App. VIII)
    nu = Psi_zeta zeta + Psi_r r + Psi_phi Phi(e)                          (7)
    xdd_r = xdd_des + nu           (reference="paper", eq. 4/8)
    xdd_r = nu                     (reference="trajectory": xdd_des is inside r)

Shapes: Psi_zeta l x 2l, Psi_r l x l, Psi_phi l x p.  Eq. 8 writes ``Psi_phi^T Phi``;
eq. 7 and the adaptation law (9) (``Psi_phi_dot ~ (.) Phi^T``, an l x p matrix) fix the
shape to l x p, so the term is ``Psi_phi Phi`` here.

Adaptation (9), explicit Euler at the control period dt, after the output is computed::

    s = B_r^T P e                          (l;  = P[l:, :] e)
    Psi_zeta <- Psi_zeta - dt Lambda_zeta s zeta^T
    Psi_r    <- Psi_r    - dt Lambda_r    s r^T
    Psi_phi  <- Psi_phi  - dt Lambda_phi  s Phi(e)^T

with ``P A_r + A_r^T P = -Q`` (``scipy.linalg.solve_continuous_lyapunov``; P is checked
symmetric positive definite) and diagonal ``Lambda_v = diag(rate_v)`` (scalar or l
values).  Afterwards every gain element is clipped to ``[init - bound, init + bound]``:
the box is centred on the construction-time initial gains (the ideal double-integrator
gains for ``init="ideal"``, zero for ``init="zero"``), fixed for the controller's life
(gains carried over between episodes with :meth:`load_state_dict` stay in the same box).
Clipped elements are counted (:attr:`last_clipped`, :attr:`clip_counts`).

Ideal gains (``init="ideal"``): for a perfect double integrator (A = [[0, I], [0, 0]],
B = B_r) the matching conditions (A2) ``A + B Psi_zeta* = A_r``, ``B Psi_r* = B_r``,
``B Psi_phi* Phi = -F = 0`` give ``Psi_zeta* = [-Kp, -Kd]``, ``Psi_r* = I``,
``Psi_phi* = 0``, so that initially ``nu = -Kp (x - x_des) - Kd (xd - xd_des)``: the PD
law of Sec. III (tested).

Lyapunov function (A4), with ``Theta_v = Psi_r*^-T Lambda_v^-1`` (:meth:`lyapunov`)::

    V = 1/2 e^T P e + 1/2 sum_v tr(Psi~_v^T Theta_v Psi~_v),   Psi~_v = Psi_v - Psi_v*
    V_dot = -1/2 e^T Q e        (plant exactly of the form (6) with B = B_r Psi_r*^-1)

RBF basis (App. IX)
-------------------
p Gaussian nodes on a grid over the position part of e (``rbf_velocity=True``: over
all of e)::

    phi_i(e) = exp(-||e_s - xi_i||^2 / (2 sigma^2)) / sqrt(2 pi sigma)

(the paper's normalisation ``1/sqrt(2 pi sigma)``), centres ``xi_i`` = all combinations
of ``rbf_per_dim`` points in ``[-rbf_span, +rbf_span]`` per dimension (3 per dimension,
l = 3: 27 nodes at {-span, 0, +span}^3).  ``rbf_span`` and ``rbf_width`` may be given
per dimension (l values, or 2l with ``rbf_velocity``); with per-dimension widths the
exponent is ``sum_j (e_j - xi_ij)^2 / (2 sigma_j^2)`` and the normalisation uses the
largest sigma (a constant factor that only rescales Psi_phi and Lambda_phi).  Phi is
evaluated as products of the per-dimension Gaussians (one exp per grid point, vectorised).

Default adaptation rates
------------------------
``s = B_r^T P e`` is small (Q = I, Kp = 100, Kd = 20: ``s = 0.005 e_x + 0.025 e_v``).  With
a regressor w_v (zeta, r or Phi) of roughly constant size, gain family v changes nu at
the rate ``-Lambda_v ||w_v||^2 s``; integrated, that is an added proportional gain
``k_v = Lambda_v ||w_v||^2 P_vv`` on e_x (from the e_v part) plus an integral gain
``k_v P_xv / P_vv`` on e_x (P_xv = Q_x / (2 Kp), P_vv ~ Q_v / (2 Kd) for diagonal Q, so
P_xv / P_vv ~ Kd / Kp).  The defaults (``None``) set, per axis::

    rate_v = k_a / (P_vv W_v^2),   k_a = adapt_stiffness * Kp   (adapt_stiffness = 0.5)

with the typical regressor sizes ``W_zeta^2 = 1`` (|zeta| ~ 1 m from the origin),
``W_r^2 = Kp^2 + Kd^2`` (|r| ~ Kp |x|) and ``W_phi^2 = ||Phi(0)||^2``.  So each family
adds at most ~Kp/2 of stiffness (1.5 Kp for all three; the loop's damping Kd is
untouched) and ~``0.5 Kd`` 1/s^3 of integral action (10 per family for Kp = 100), far
below the Routh limit ``Kp Kd`` of a PID on a double integrator: conservative (a
constant disturbance decays over ~10 s, see the closed-loop test; raise
adapt_stiffness for faster learning -- 2.0 still behaves well there).  Kp = 100,
Kd = 20, Q = I, default basis: ``rate_zeta ~ 2e3``, ``rate_r ~ 0.2``, ``rate_phi ~ 120``.

Default bounds: ``bound_zeta`` = Kp (position columns) and Kd (velocity columns) per
element, i.e. from the ideal init the diagonal feedback gains stay in [-2 Kp, 0] and
[-2 Kd, 0] (never positive feedback); ``bound_r = 1`` (Psi_r in [0, 2] on the
diagonal); ``bound_phi`` = ``Kp * rbf_span / max_i phi_i(0)`` per weight: one node alone
supplies at most the PD force of a ``rbf_span`` position error (Kp span = 5 m/s^2 with
the defaults, i.e. ~55 m/s^2 when all 27 nodes of ||e|| ~ 0 saturate together).
``numpy.inf`` disables a bound.

xdd_des and the reference model (a caveat of the paper)
-------------------------------------------------------
With the paper's ``r = -B_r^+ A_r zeta_d`` the reference model is a PD-driven double
integrator *without* the feedforward ``xdd_des``, while the plant receives
``xdd_des + nu`` (eq. 4).  For a moving target ``zeta_r`` therefore lags ``zeta_d``
(``x_des - x_r = s^2 / (s^2 + Kd s + Kp) x_des``, ~9 % of a 0.5 Hz sine's amplitude
for Kp = 100, Kd = 20), contradicting the paper's own requirement
``||zeta_r - zeta_d|| -> 0``; even a perfect double integrator with the ideal gains
then has e != 0 and adaptation pulls the gains away from the ideal ones to reproduce
that lag (tested: the tracking error of a perfect plant grows from ~0.05 mm to mm).
``reference="trajectory"`` removes the inconsistency: r then contains xdd_des, (5)
tracks zeta_d exactly, the plant input is ``xdd_r = nu`` itself and (A1)-(A6) hold
verbatim for any zeta_d (the feedforward is scaled by the adapted Psi_r, so a gain
mismatch on it is adapted as well).  The default stays the paper's law.

Other remarks on the paper's equations
--------------------------------------
* Table I gives r in R^n; with ``r = -B_r^+ A_r zeta_d`` it is in R^m = R^l.
* (A5)/(A6) need ``Theta = Psi_r*^-T Lambda^-1`` symmetric positive definite (the trace
  derivative uses it symmetric), i.e. a known sign / symmetric Psi_r* commuting with
  Lambda (e.g. both diagonal), as in standard MRAC with ``B = B_r Lambda_plant``; the
  paper's "if B_r > 0" does not apply to a non-square B_r.
* (A2) asks ``B Psi_phi* Phi(e) = -F(zeta_d, zeta)``: a basis of e alone cannot represent
  a state-dependent F along a trajectory (e ~ 0 there); near e = 0 the RBF term acts as
  an adaptive bias, and the adaptation behaves like integral action.
* The normalisation ``1/sqrt(2 pi sigma)`` (not ``1/(sqrt(2 pi) sigma)``) is kept as written;
  it only rescales Psi_phi and Lambda_phi.
* The law is not translation invariant (Psi_zeta zeta and Psi_r r use absolute
  positions, r ~ Kp x): hence ``origin`` and rates scaled by the regressor sizes.

Validation and safety
---------------------
Every input is checked (shape, finiteness, dt > 0) before any state changes; the new
gains and the reference state are computed into temporaries and committed only if all
are finite, so a NaN input or an overflow never corrupts the gains (``ValueError``).

Persistence: :meth:`state_dict` / :meth:`load_state_dict` (dict of plain arrays) and
:meth:`save` / :meth:`load_state` (``.npz``, no pickle).  Live tuning:
:meth:`set_adaptation` (rates and bounds) and :meth:`transfer_gains` (a controller built
with new ``kp``/``kd`` takes over what another one adapted, relative to each one's
initial gains).
"""
from __future__ import annotations

import itertools
import math
from typing import Optional

import numpy as np
import scipy.linalg

from .law import NpzState

__all__ = ["TaskSpaceMRAC", "REFERENCES", "INITS", "HOLDS"]

REFERENCES = ("paper", "trajectory")
HOLDS = ("foh", "zoh")
INITS = ("ideal", "zero")
FORMAT_VERSION = 1
GAIN_KEYS = ("psi_zeta", "psi_r", "psi_phi")


def _per_axis(value, dim: int, name: str, *, positive: Optional[bool] = True, allow_inf: bool = False) -> np.ndarray:
    """A length-``dim`` float vector from a scalar or ``dim`` values (``positive``: > 0;
    ``False``: >= 0; ``None``: any sign)."""
    try:
        arr = np.array(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number or {dim} numbers, got {value!r}") from None
    if arr.ndim == 0 or arr.size == 1:
        arr = np.full(dim, float(arr.reshape(-1)[0]))
    elif arr.shape != (dim,):
        raise ValueError(f"{name} must be a scalar or {dim} values, got shape {arr.shape}")
    if np.any(np.isnan(arr)) or (not allow_inf and not np.all(np.isfinite(arr))):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    if positive and not np.all(arr > 0):
        raise ValueError(f"{name} must be > 0, got {arr.tolist()}")
    if positive is False and not np.all(arr >= 0):
        raise ValueError(f"{name} must be >= 0, got {arr.tolist()}")
    return arr


def _bound(value, shape: tuple, name: str) -> np.ndarray:
    """Element-wise bound (>= 0, inf allowed) broadcast to ``shape``."""
    try:
        arr = np.array(value, dtype=float)
        out = np.broadcast_to(arr, shape).copy()
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number or an array broadcastable to {shape}, got "
                         f"{value!r}") from None
    if np.any(np.isnan(out)) or np.any(out < 0):
        raise ValueError(f"{name} must be >= 0 (inf = unbounded), got {arr.tolist() if arr.size <= 12 else arr}")
    return out


class TaskSpaceMRAC(NpzState):
    """Task-space MRAC of SCQP (one :meth:`compute` per control period); see the module docstring.

    Parameters
    ----------
    dim:
        Task dimension l (default 3: end-effector position).
    kp, kd:
        Reference-model gains Kp [1/s^2] and Kd [1/s] (> 0; scalar or l values).
        ``kd=None``: ``2 sqrt(kp)`` (critically damped).
    q_weight:
        Q of the Lyapunov equation: scalar, 2l values (diagonal) or a 2l x 2l SPD matrix.
    init:
        ``"ideal"`` (double-integrator gains, initially the PD law) or ``"zero"``.
    rate_zeta, rate_r, rate_phi:
        Adaptation rates Lambda (> 0; scalar or l values); ``None``: the defaults of the
        module docstring (scaled with Kp, Kd, P and the basis).
    bound_zeta, bound_r, bound_phi:
        Element-wise bounds around the initial gains (>= 0, inf = none; scalar or an
        array broadcastable to the gain's shape); ``None``: the module defaults.
    adapt:
        Adapt the gains (``False``: fixed-gain control law; settable attribute).
    rbf_per_dim, rbf_span, rbf_width, rbf_velocity:
        RBF grid: nodes per dimension, centre half-range [m] (scalar or per dimension),
        sigma (``None`` = ``rbf_span``), and whether the velocity error is a basis input.
    reference:
        ``"paper"`` (r = -B_r^+ A_r zeta_d, xdd_r = xdd_des + nu) or ``"trajectory"``
        (r = B_r^+ (zeta_d_dot - A_r zeta_d), xdd_r = nu).
    hold:
        Input of the reference model over a period: ``"foh"`` (ramp, default) or
        ``"zoh"`` (held).
    adapt_stiffness:
        Scale of the default adaptation rates (module docstring); ignored for rates given.
    origin:
        Task-space point (l values) positions are measured from (zeta = [x - origin, xd]);
        default 0.  The law is not translation invariant (Psi_zeta zeta, Psi_r r are in
        absolute coordinates), so a nearby origin keeps ``r`` and the rates well scaled.
    """

    REFERENCES = REFERENCES
    INITS = INITS

    STATE_WHAT = "an MRAC state file"

    def __init__(self, dim: int = 3, *, kp=100.0, kd=None, q_weight=1.0, init: str = "ideal",
                 rate_zeta=None, rate_r=None, rate_phi=None, bound_zeta=None, bound_r=None, bound_phi=None,
                 adapt: bool = True, rbf_per_dim: int = 3, rbf_span=0.05, rbf_width=None,
                 rbf_velocity: bool = False, reference: str = "paper", hold: str = "foh", origin=None,
                 adapt_stiffness: float = 0.5):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise ValueError(f"dim must be a positive integer, got {dim!r}")
        if init not in INITS:
            raise ValueError(f"unknown init {init!r}; available: {list(INITS)}")
        if reference not in REFERENCES:
            raise ValueError(f"unknown reference {reference!r}; available: {list(REFERENCES)}")
        if hold not in HOLDS:
            raise ValueError(f"unknown hold {hold!r}; available: {list(HOLDS)}")
        self.hold = hold
        if isinstance(rbf_per_dim, bool) or not isinstance(rbf_per_dim, (int, np.integer)) or rbf_per_dim < 1:
            raise ValueError(f"rbf_per_dim must be a positive integer, got {rbf_per_dim!r}")
        l = self.dim = int(dim)
        n = self.n = 2 * l
        self.init = init
        self.reference = reference
        self.adapt = bool(adapt)

        # ---- reference model (5)
        self.kp = _per_axis(kp, l, "kp")
        self.kd = 2.0 * np.sqrt(self.kp) if kd is None else _per_axis(kd, l, "kd")
        I, Z = np.eye(l), np.zeros((l, l))
        self.A_r = np.block([[Z, I], [-np.diag(self.kp), -np.diag(self.kd)]])
        self.B_r = np.vstack([Z, I])
        self.B_r_pinv = np.linalg.pinv(self.B_r)
        self._r_of_zeta_d = -self.B_r_pinv @ self.A_r  # r = -B_r^+ A_r zeta_d  (l x 2l)
        self.origin = np.zeros(l) if origin is None else _per_axis(origin, l, "origin", positive=None)

        # ---- Lyapunov equation  P A_r + A_r^T P = -Q
        self.Q = self._q_matrix(q_weight, n)
        P = scipy.linalg.solve_continuous_lyapunov(self.A_r.T, -self.Q)
        asym = float(np.abs(P - P.T).max())
        if asym > 1e-9 * max(1.0, float(np.abs(P).max())):
            raise ValueError(f"Lyapunov solution P is not symmetric (max |P - P^T| = {asym:.3g})")
        P = 0.5 * (P + P.T)
        ev = float(np.linalg.eigvalsh(P)[0])
        if not ev > 0:
            raise ValueError(f"Lyapunov solution P is not positive definite (min eigenvalue {ev:.3g})")
        self.P = P
        self._BtP = self.B_r.T @ P  # l x 2l

        # ---- RBF basis (App. IX)
        self.rbf_velocity = bool(rbf_velocity)
        nd = n if self.rbf_velocity else l
        self.rbf_per_dim = int(rbf_per_dim)
        self.rbf_span = _per_axis(rbf_span, nd, "rbf_span", positive=False)
        self.rbf_width = self.rbf_span.copy() if rbf_width is None else _per_axis(rbf_width, nd, "rbf_width")
        if not np.all(self.rbf_width > 0):
            raise ValueError(f"rbf_width must be > 0 (it defaults to rbf_span), got {self.rbf_width.tolist()}")
        k = self.rbf_per_dim
        self._grid = [np.linspace(-s, s, k) if k > 1 else np.zeros(1) for s in self.rbf_span]
        self.centers = np.array(list(itertools.product(*self._grid)), dtype=float).reshape(-1, nd)
        self.n_rbf = p = self.centers.shape[0]
        # node i = product over dimensions j of the Gaussian of grid point _node_idx[j, i]
        self._grid_arr = np.array(self._grid)
        self._inv_width = 1.0 / self.rbf_width
        self._node_idx = np.array(list(itertools.product(range(k), repeat=nd)), dtype=np.intp).reshape(-1, nd).T
        self._dim_idx = np.arange(nd)[:, None]
        if p > 100_000:
            raise ValueError(f"{p} RBF nodes ({k}^{nd}) is too many; reduce rbf_per_dim or rbf_velocity")
        self._rbf_norm = 1.0 / math.sqrt(2.0 * math.pi * float(self.rbf_width.max()))

        # ---- initial gains, bounds, rates
        self.psi_zeta_ideal = np.hstack([-np.diag(self.kp), -np.diag(self.kd)])
        self.psi_r_ideal = np.eye(l)
        if init == "ideal":
            c_z, c_r = self.psi_zeta_ideal.copy(), self.psi_r_ideal.copy()
        else:
            c_z, c_r = np.zeros((l, n)), np.zeros((l, l))
        self.center = {"psi_zeta": c_z, "psi_r": c_r, "psi_phi": np.zeros((l, p))}
        phi0 = self.basis(np.zeros(n))
        self.adapt_stiffness = float(adapt_stiffness)
        if not (math.isfinite(self.adapt_stiffness) and self.adapt_stiffness > 0):
            raise ValueError(f"adapt_stiffness must be > 0, got {adapt_stiffness!r}")
        pvv = np.diag(P)[l:]
        k_a = self.adapt_stiffness * self.kp
        defaults = {"rate_zeta": k_a / pvv,
                    "rate_r": k_a / (pvv * (self.kp ** 2 + self.kd ** 2)),
                    "rate_phi": k_a / (pvv * float(phi0 @ phi0))}
        given = {"rate_zeta": rate_zeta, "rate_r": rate_r, "rate_phi": rate_phi}
        self.default_rates = defaults
        self.rates = {k_: (defaults[k_] if v is None else _per_axis(v, l, k_)) for k_, v in given.items()}
        bz = np.hstack([np.broadcast_to(self.kp, (l, l)), np.broadcast_to(self.kd, (l, l))])
        bdef = {"psi_zeta": bz, "psi_r": 1.0, "psi_phi": float(self.kp.max()) * float(self.rbf_span.max() or 1.0)
                / float(phi0.max())}
        self.default_bounds = {k_: _bound(v, self.center[k_].shape, "bound_" + k_[4:]) for k_, v in bdef.items()}
        bgiven = {"psi_zeta": bound_zeta, "psi_r": bound_r, "psi_phi": bound_phi}
        self.bounds = {k_: _bound(bdef[k_] if bgiven[k_] is None else bgiven[k_], self.center[k_].shape,
                                  "bound_" + k_[4:]) for k_ in GAIN_KEYS}
        self._lo = {k_: self.center[k_] - self.bounds[k_] for k_ in GAIN_KEYS}
        self._hi = {k_: self.center[k_] + self.bounds[k_] for k_ in GAIN_KEYS}

        # ---- state
        self.psi_zeta = c_z.copy()
        self.psi_r = c_r.copy()
        self.psi_phi = np.zeros((l, p))
        self.zeta_r = np.zeros(n)
        self.reference_initialized = False
        self._disc_dt: Optional[float] = None
        self._disc = None
        self.steps = 0
        self.updates = 0
        self.last_clipped = 0
        self.clip_counts = {k_: 0 for k_ in GAIN_KEYS}
        self.last_error = np.zeros(n)
        self.last_r = np.zeros(l)
        self.last_nu = np.zeros(l)

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _q_matrix(q, n: int) -> np.ndarray:
        try:
            arr = np.array(q, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"q_weight must be a number, {n} numbers or a {n}x{n} matrix, got {q!r}") from None
        if arr.ndim == 0 or arr.size == 1:
            Q = float(arr.reshape(-1)[0]) * np.eye(n)
        elif arr.shape == (n,):
            Q = np.diag(arr)
        elif arr.shape == (n, n):
            Q = arr.copy()
        else:
            raise ValueError(f"q_weight must be a scalar, {n} values or a {n}x{n} matrix, got shape {arr.shape}")
        if not np.all(np.isfinite(Q)):
            raise ValueError("q_weight must be finite")
        if float(np.abs(Q - Q.T).max()) > 1e-12 * max(1.0, float(np.abs(Q).max())):
            raise ValueError("q_weight is not symmetric")
        Q = 0.5 * (Q + Q.T)
        ev = float(np.linalg.eigvalsh(Q)[0])
        if not ev > 0:
            raise ValueError(f"q_weight is not positive definite (min eigenvalue {ev:.3g})")
        return Q

    def _vec(self, value, name: str) -> np.ndarray:
        try:
            arr = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"{name} must be {self.dim} numbers, got {value!r}") from None
        if arr.shape != (self.dim,):
            if arr.size == self.dim and arr.ndim <= 2 and 1 in arr.shape:
                arr = arr.reshape(self.dim)
            else:
                raise ValueError(f"{name} must have {self.dim} elements, got shape {arr.shape}")
        if not np.isfinite(arr).all():
            raise ValueError(f"{name} is not finite: {arr.tolist()}")
        return arr

    def _discretisation(self, dt: float):
        """(Ad, G0, G1) of the module docstring for the period dt (cached)."""
        if dt != self._disc_dt:
            n, l = self.n, self.dim
            M = np.zeros((n + 2 * l, n + 2 * l))
            M[:n, :n] = self.A_r
            M[:n, n:n + l] = self.B_r
            M[n:n + l, n + l:] = np.eye(l)
            E = scipy.linalg.expm(M * dt)
            self._disc = (E[:n, :n].copy(), E[:n, n:n + l].copy(), E[:n, n + l:].copy())
            self._disc_dt = dt
        return self._disc

    # ------------------------------------------------------------------ law
    def basis(self, e) -> np.ndarray:
        """Phi(e) (p values, App. IX) for a 2l error vector (or l / 2l RBF input)."""
        e = np.asarray(e, dtype=float).reshape(-1)
        nd = self.centers.shape[1]
        if e.size == self.n:
            u = e[:nd]
        elif e.size == nd:
            u = e
        else:
            raise ValueError(f"basis input must have {self.n} (or {nd}) elements, got {e.size}")
        with np.errstate(over="ignore"):  # a huge error: exp(-inf) = 0, no node active
            z = (u[:, None] - self._grid_arr) * self._inv_width[:, None]
            g = np.exp(-0.5 * z * z)  # per-dimension Gaussians, nd x k
        return g[self._dim_idx, self._node_idx].prod(axis=0) * self._rbf_norm

    def regulation(self, x_des, xd_des, xdd_des=None) -> np.ndarray:
        """r(t) for the desired state (``reference="trajectory"`` needs ``xdd_des``)."""
        zd = np.concatenate([self._vec(x_des, "x_des") - self.origin, self._vec(xd_des, "xd_des")])
        if self.reference == "paper":
            return self._r_of_zeta_d @ zd
        zd_dot = np.concatenate([zd[self.dim:], self._vec(xdd_des, "xdd_des")])
        return self.B_r_pinv @ (zd_dot - self.A_r @ zd)

    def reset_reference(self, zeta=None) -> None:
        """New episode: ``zeta_r`` = ``zeta`` (2l values, positions in the world frame
        like :meth:`compute`'s x) or, with ``None``, the first measured state of the next
        :meth:`compute`.  The gains are kept."""
        if zeta is None:
            self.reference_initialized = False
            self.zeta_r = np.zeros(self.n)
            return
        z = np.asarray(zeta, dtype=float).reshape(-1)
        if z.shape != (self.n,) or not np.all(np.isfinite(z)):
            raise ValueError(f"zeta must be {self.n} finite values, got {np.asarray(zeta).tolist()}")
        self.zeta_r = np.concatenate([z[:self.dim] - self.origin, z[self.dim:]])
        self.reference_initialized = True

    def compute(self, x, xd, x_des, xd_des, xdd_des, dt: float) -> np.ndarray:
        """One control cycle: ``xdd_r`` (l values) for the measured position/velocity
        (``x``, ``xd``) and the desired ``x_des``, ``xd_des``, ``xdd_des``; then the
        gains adapt (9) and ``zeta_r`` advances by ``dt`` [s]."""
        try:
            dt = float(dt)
        except (TypeError, ValueError):
            raise ValueError(f"dt must be a number, got {dt!r}") from None
        if not (math.isfinite(dt) and dt > 0):
            raise ValueError(f"dt must be finite and > 0, got {dt!r}")
        l = self.dim
        x_, v_ = self._vec(x, "x"), self._vec(xd, "xd")
        a_des = self._vec(xdd_des, "xdd_des")
        zeta = np.concatenate([x_ - self.origin, v_])
        r = self.regulation(x_des, xd_des, a_des)
        zeta_r = self.zeta_r if self.reference_initialized else zeta
        e = zeta - zeta_r
        phi = self.basis(e)
        with np.errstate(over="ignore", invalid="ignore"):
            nu = self.psi_zeta @ zeta + self.psi_r @ r + self.psi_phi @ phi
            xdd_r = a_des + nu if self.reference == "paper" else nu.copy()
        if not np.isfinite(xdd_r).all():
            raise ValueError(f"xdd_r is not finite ({xdd_r.tolist()}); state unchanged")

        new = None
        clipped = {}
        if self.adapt:
            s = self._BtP @ e
            new = {}
            for key, w, rate in (("psi_zeta", zeta, self.rates["rate_zeta"]), ("psi_r", r, self.rates["rate_r"]),
                                 ("psi_phi", phi, self.rates["rate_phi"])):
                with np.errstate(over="ignore", invalid="ignore"):
                    G = getattr(self, key) - dt * np.multiply.outer(rate * s, w)
                if not np.isfinite(G).all():  # before clipping: clip(inf) would look finite
                    raise ValueError(f"adaptation of {key} overflowed (max |e| = {np.abs(e).max():.3g}); "
                                     "state unchanged")
                lo, hi = self._lo[key], self._hi[key]
                clipped[key] = int(np.count_nonzero((G < lo) | (G > hi)))
                new[key] = np.clip(G, lo, hi)
        Ad, G0, G1 = self._discretisation(dt)
        zr_next = Ad @ zeta_r + G0 @ r
        if self.hold == "foh":
            zr_next += G1 @ (self._r_of_zeta_d @ np.concatenate([self._vec(xd_des, "xd_des"), a_des]))
        if not np.isfinite(zr_next).all():
            raise ValueError("reference state is not finite; state unchanged")

        # ---- commit
        if new is not None:
            self.psi_zeta, self.psi_r, self.psi_phi = new["psi_zeta"], new["psi_r"], new["psi_phi"]
            self.last_clipped = sum(clipped.values())
            for key, c in clipped.items():
                self.clip_counts[key] += c
            self.updates += 1
        else:
            self.last_clipped = 0
        self.zeta_r = zr_next
        self.reference_initialized = True
        self.steps += 1
        self.last_error, self.last_r, self.last_nu = e, r, nu
        return xdd_r

    # ------------------------------------------------------------------ live settings
    def set_adaptation(self, **settings) -> None:
        """Change adaptation rates and bounds of a running controller (live tuning).

        Keywords ``rate_zeta``, ``rate_r``, ``rate_phi`` (> 0, scalar or l values) and
        ``bound_zeta``, ``bound_r``, ``bound_phi`` (>= 0, broadcastable to the gain, inf =
        none); ``None`` restores the constructor's default for that setting, an omitted
        keyword leaves it unchanged.  The bound box stays centred on the initial gains;
        gains outside a narrowed box are clipped into it (counted in :attr:`clip_counts`).
        Everything is validated before anything changes (``ValueError``)."""
        known = {"rate_zeta", "rate_r", "rate_phi", "bound_zeta", "bound_r", "bound_phi"}
        unknown = sorted(set(settings) - known)
        if unknown:
            raise ValueError(f"unknown adaptation settings {unknown}; known: {sorted(known)}")
        rates = dict(self.rates)
        bounds = dict(self.bounds)
        for name, value in settings.items():
            if name.startswith("rate_"):
                rates[name] = self.default_rates[name] if value is None else _per_axis(value, self.dim, name)
            else:
                key = "psi_" + name[len("bound_"):]
                bounds[key] = self.default_bounds[key].copy() if value is None else \
                    _bound(value, self.center[key].shape, name)
        lo = {k: self.center[k] - bounds[k] for k in GAIN_KEYS}
        hi = {k: self.center[k] + bounds[k] for k in GAIN_KEYS}
        self.rates, self.bounds, self._lo, self._hi = rates, bounds, lo, hi
        for key in GAIN_KEYS:
            G = getattr(self, key)
            outside = int(np.count_nonzero((G < lo[key]) | (G > hi[key])))
            if outside:
                self.clip_counts[key] += outside
                setattr(self, key, np.clip(G, lo[key], hi[key]))

    def transfer_gains(self, state: dict) -> None:
        """Take over the adapted gains of another controller's :meth:`state_dict` (e.g. one
        with other ``kp``/``kd`` or bounds, or saved by one): what it adapted -- its gains
        minus its initial gains (``init`` and the ``kp``/``kd`` in ``state``) -- is added to
        this controller's initial gains and clipped into this box.  Same task dimension and
        RBF grid size required; ``zeta_r`` is taken when present with the same origin.
        Validated before anything changes (``ValueError``)."""
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict of arrays, got {type(state).__name__}")
        l, n, p = self.dim, self.n, self.n_rbf
        try:
            dim, n_rbf = int(np.asarray(state["dim"])), int(np.asarray(state["n_rbf"]))
            kp = _per_axis(state["kp"], l, "kp")
            kd = _per_axis(state["kd"], l, "kd")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"state lacks a valid layout (dim, n_rbf, kp, kd): {exc}") from None
        if dim != l or n_rbf != p:
            raise ValueError(f"state is for dim {dim} with {n_rbf} RBF nodes, this controller has dim {l}"
                             f" with {p}")
        init = str(np.asarray(state.get("init", "ideal")))
        if init not in INITS:
            raise ValueError(f"state has an unknown init {init!r}")
        if init == "ideal":
            theirs = {"psi_zeta": np.hstack([-np.diag(kp), -np.diag(kd)]), "psi_r": np.eye(l)}
        else:
            theirs = {"psi_zeta": np.zeros((l, n)), "psi_r": np.zeros((l, l))}
        theirs["psi_phi"] = np.zeros((l, p))
        new = {}
        for key in GAIN_KEYS:
            if key not in state:
                raise ValueError(f"state is missing {key!r}")
            G = np.array(state[key], dtype=float)
            if G.shape != theirs[key].shape or not np.all(np.isfinite(G)):
                raise ValueError(f"{key} has shape {G.shape} (or non-finite values), expected "
                                 f"{theirs[key].shape}")
            new[key] = np.clip(self.center[key] + (G - theirs[key]), self._lo[key], self._hi[key])
        zr = None
        if "zeta_r" in state and bool(np.asarray(state.get("reference_initialized", True))):
            origin = np.asarray(state.get("origin", np.zeros(l)), dtype=float).reshape(-1)
            z = np.array(state["zeta_r"], dtype=float).reshape(-1)
            if z.shape == (n,) and np.all(np.isfinite(z)) and np.array_equal(origin, self.origin):
                zr = z
        self.psi_zeta, self.psi_r, self.psi_phi = new["psi_zeta"], new["psi_r"], new["psi_phi"]
        if zr is not None:
            self.zeta_r = zr
            self.reference_initialized = True

    # ------------------------------------------------------------------ diagnostics
    @property
    def gain_norms(self) -> dict:
        """Frobenius norms of the three gain matrices."""
        return {k: float(np.linalg.norm(getattr(self, k))) for k in GAIN_KEYS}

    @property
    def reference_state(self) -> np.ndarray:
        """zeta_r with positions in the world frame (origin added back)."""
        z = self.zeta_r.copy()
        z[:self.dim] += self.origin
        return z

    def lyapunov(self, e, psi_zeta_star, psi_r_star, psi_phi_star=None) -> float:
        """V of (A4) for the error e (2l) and the true gains Psi* of a plant of the form
        (6) with ``B = B_r Psi_r*^-1``; ``Theta_v = Psi_r*^-T Lambda_v^-1`` (the
        symmetric part enters the trace; the proof needs it symmetric PD, e.g. diagonal
        Psi_r* and Lambda)."""
        e = np.asarray(e, dtype=float).reshape(self.n)
        Rinv_T = np.linalg.inv(np.asarray(psi_r_star, dtype=float)).T
        stars = {"psi_zeta": np.asarray(psi_zeta_star, dtype=float), "psi_r": np.asarray(psi_r_star, dtype=float),
                 "psi_phi": np.zeros_like(self.psi_phi) if psi_phi_star is None else np.asarray(psi_phi_star, float)}
        V = 0.5 * float(e @ self.P @ e)
        for key, rate in (("psi_zeta", "rate_zeta"), ("psi_r", "rate_r"), ("psi_phi", "rate_phi")):
            Theta = Rinv_T @ np.diag(1.0 / self.rates[rate])
            Pt = getattr(self, key) - stars[key]
            V += 0.5 * float(np.trace(Pt.T @ Theta @ Pt))
        return V

    def diagnostics(self) -> dict:
        return {"steps": self.steps, "updates": self.updates, "adapt": self.adapt, "last_clipped": self.last_clipped,
                "clip_counts": dict(self.clip_counts), "gain_norms": self.gain_norms,
                "error_norm": float(np.linalg.norm(self.last_error)), "reference": self.reference}

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict:
        """Gains, reference state and layout as a dict of plain numpy arrays."""
        return {
            "format_version": np.array(FORMAT_VERSION),
            "init": np.array(self.init),
            "dim": np.array(self.dim),
            "n_rbf": np.array(self.n_rbf),
            "kp": self.kp.copy(), "kd": self.kd.copy(), "origin": self.origin.copy(),
            "psi_zeta": self.psi_zeta.copy(), "psi_r": self.psi_r.copy(), "psi_phi": self.psi_phi.copy(),
            "zeta_r": self.zeta_r.copy(),
            "reference_initialized": np.array(self.reference_initialized),
            "steps": np.array(self.steps), "updates": np.array(self.updates),
        }

    def load_state(self, path, *, reference: bool = False) -> None:
        """Load gains saved by :meth:`save` (``reference=True``: also zeta_r)."""
        super().load_state(path, reference=reference)

    def load_state_dict(self, state: dict, *, where: str = "state", reference: bool = True) -> None:
        """Restore gains (required) and, when present, ``zeta_r`` (otherwise the
        reference restarts at the next measured state: a new episode with the learned
        gains as initial guess).  Shapes, finiteness and the bound box are checked
        before anything changes (``ValueError``)."""
        if not isinstance(state, dict):
            raise ValueError(f"state must be a dict of arrays, got {type(state).__name__}")
        if not reference:
            state = {k: v for k, v in state.items() if k != "zeta_r"}
        l, n, p = self.dim, self.n, self.n_rbf
        shapes = {"psi_zeta": (l, n), "psi_r": (l, l), "psi_phi": (l, p)}
        new = {}
        for key, shape in shapes.items():
            if key not in state:
                raise ValueError(f"state is missing {key!r}")
            G = np.array(state[key], dtype=float)
            if G.shape != shape:
                raise ValueError(f"{key} has shape {G.shape}, this controller needs {shape} (dim {l}, {p} RBF nodes)")
            if not np.all(np.isfinite(G)):
                raise ValueError(f"{key} is not finite")
            tol = 1e-12 * (1.0 + np.abs(self.center[key]))
            if np.any(G < self._lo[key] - tol) or np.any(G > self._hi[key] + tol):
                raise ValueError(f"{key} lies outside this controller's bound box (init {self.init!r}, "
                                 f"bound_{key[4:]}); different kp/kd/bounds than when it was saved?")
            new[key] = np.clip(G, self._lo[key], self._hi[key])
        zr, init = None, False
        if "zeta_r" in state and bool(np.asarray(state.get("reference_initialized", True))):
            zr = np.array(state["zeta_r"], dtype=float).reshape(-1)
            if zr.shape != (n,) or not np.all(np.isfinite(zr)):
                raise ValueError(f"zeta_r must be {n} finite values")
            if "origin" in state and not np.array_equal(np.asarray(state["origin"], float).reshape(-1), self.origin):
                raise ValueError("zeta_r was saved with a different origin")
            init = True
        self.psi_zeta, self.psi_r, self.psi_phi = new["psi_zeta"], new["psi_r"], new["psi_phi"]
        self.zeta_r = zr if zr is not None else np.zeros(n)
        self.reference_initialized = init


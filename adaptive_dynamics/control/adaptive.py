"""Direct and composite adaptive joint-space control (no ROS import).

Laws (Slotine & Li 1987, 1989; ARDL, Smith & Mistry 2021, Listing 1)
-------------------------------------------------------------------
Sliding variables, with ``Lambda`` (``lam``) symmetric positive definite::

    e   = q_d - q,            e_dot = qd_d - qd
    qd_r  = qd_d  + Lambda e  ( = qd_d  - Lambda (q  - q_d) )
    qdd_r = qdd_d + Lambda e_dot
    s     = qd - qd_r         ( = -(e_dot + Lambda e) )

Control (both laws)::

    tau = Y(q, qd, qd_r, qdd_r) theta_hat - K_D s

with the Slotine-Li regressor ``Y theta = M(q) qdd_r + C(q, qd) qd_r + g(q)``
(+ ``f_v qd + f_c sgn(qd)`` with friction columns) and the Christoffel-consistent C
of :class:`~adaptive_dynamics.dynamics.RobotModel`.  Closed loop with exact parameters:
``M s_dot + (C + K_D) s = Y theta_tilde``, theta_tilde = theta_hat - theta.

* **direct** (1987):     theta_hat_dot = -Gamma Y^T s
* **composite** (1989):  theta_hat_dot = -P (Y^T s + W^T R e_p),   e_p = W theta_hat - tau_f
                         d/dt P^-1     = -lambda(t) P^-1 + W^T R W

  ``W`` and ``tau_f`` are the filtered regressor and filtered measured torque
  (:class:`~adaptive_dynamics.dynamics.FilteredRegressor`, first-order filter
  ``filter_lambda / (p + filter_lambda)``, ``W theta = tau_f``).  Sign convention: with
  ``s = qd - qd_r`` the Lyapunov function ``V = 1/2 s^T M s + 1/2 theta_tilde^T
  Gamma^-1 theta_tilde`` gives ``V_dot = -s^T K_D s <= 0`` for the direct law (tested).
  (Thunder's Appendix C writes ``s = qd_r - qd``: the same law with the opposite sign
  of s.)

  Bounded-gain forgetting (Slotine & Li 1989, as in ARDL Listing 1), with
  ``|P| = max column L1 norm`` (Eigen ``colwise().lpNorm<1>().maxCoeff()`` of
  ``Rho^-1 = P``)::

      lambda(t) = lambda0 (1 - |P| / k0)   if |P| <= k1,   else 0   (clipped to >= 0)

  so P cannot grow beyond ``max(|P(0)|_2, k1 exp(lambda0 dt))`` in the spectral norm
  (forgetting only acts while ``|P|_2 <= |P|_1 <= k1``; without forgetting P^-1 only
  grows).  ARDL's listing computes ``lambda`` but then multiplies ``Rho`` by
  ``lambda0``; we use ``lambda(t)`` as its comment and Slotine & Li intend.  Listing 1
  uses ``W^T W`` in the ``Rho`` update; we use ``W^T R W`` (identical for R = I), which
  makes ``V = 1/2 s^T M s + 1/2 theta_tilde^T P^-1 theta_tilde`` satisfy
  ``V_dot = -s^T K_D s - 1/2 theta_tilde^T (lambda P^-1 + W^T R W) theta_tilde`` for
  any R > 0.

  Forgetting toward the prior (``forget_to="prior"``; ARDL and Slotine & Li forget
  toward zero information, ``forget_to="zero"``, the default of the core).  What the
  forgetting removes is replaced by the information of the initial estimate
  ``theta_0`` (:attr:`theta_prior`: the URDF's, an identified one, ...) with covariance
  ``P0`` -- recursive least squares whose prior is forgotten only as far as data
  replace it::

      d/dt P^-1     = -lambda(t) (P^-1 - P0^-1) + W^T R W
      theta_hat_dot = -P (Y^T s + W^T R e_p + lambda(t) P0^-1 (theta_hat - theta_0))

  (the second line is the exact derivative of ``theta = P (P0^-1 theta_0 + filtered
  data)``).  Where the motion excites a direction, P is small there and the pull is
  negligible; where it does not, ``P -> P0`` (never above it) and the estimate returns
  to ``theta_0`` at rate ``lambda``: an estimate adapted on one motion keeps the prior
  in the directions that motion did not see, and a trajectory elsewhere starts from
  what is known rather than from a drift.  This is Ioannou's sigma-modification in the
  information metric: the Lyapunov function above gains the term
  ``-lambda theta_tilde^T P0^-1 (theta_hat - theta_0)``, so the estimate stays bounded
  near ``theta_0`` under disturbances the model cannot express instead of drifting.

A fixed friction model beside the law (:attr:`fixed_friction`)
-----------------------------------------------------------------
An identified smooth friction model ``tau_s(qd)`` (``identify --friction sigmoid``,
:mod:`~adaptive_dynamics.dynamics.joint_friction`) is added to the command at the
measured velocity, ``tau = Y theta_hat - K_D s + tau_s(qd)``, and taken out of the
measured torque the composite law learns from (``tau_measured - tau_s(qd)``): the
estimate -- its viscous and Coulomb columns included -- adapts to what the fixed model
leaves.  Start it from the rigid body identified with that model
(``estimate_<kind>.npz`` of ``identify``, friction columns zero).

A learned residual beside the law (``compute(..., feedforward=f)``)
-------------------------------------------------------------------
``tau = Y theta_hat - K_D s + f``.  The s-driven term sees only what the residual left
to the feedback, so an estimate adapted beside a good residual stops taking the part of
the model it could express (a Coulomb or Stribeck level the friction columns hold
everywhere, where the residual holds it only near its data).  With
``adapt_to_feedforward`` the term uses ``s_v = s - K_D^-1 f`` instead: the sliding
variable of the same loop with ``f`` supplied by the feedback, so the parametric
estimate adapts as it would without the residual and the residual keeps what the
model cannot express.  Where the residual falls back to zero the command is then the
parametric model such a controller would have on its own.  The prediction-error term
is unchanged (it never sees ``f``).

Discrete time (control period ``dt``, one call of :meth:`compute` per period)
---------------------------------------------------------------------------
* ``P^-1`` -- exact zero-order-hold solution of its ODE over the step (W, lambda held)::

      P^-1_{k+1} = a P^-1_k + c W^T R W,   a = exp(-lambda dt),  c = (1 - a) / lambda  (-> dt)

  ``P_{k+1}`` is its exact inverse by the Woodbury identity (one n x n solve,
  ``O(b^2 n)``), symmetrised every step; the well-conditioned ``P^-1`` recursion is
  carried alongside and ``P`` is refactored from it every ``refactor_every`` steps
  (Cholesky), so rounding cannot accumulate.  Symmetric positive definite by
  construction (a > 0, W^T R W >= 0).
* ``theta_hat`` -- explicit (forward) Euler, first order in dt, with the gain of the
  end of the step (as ARDL: ``Rho`` first, then ``pi``)::

      theta_{k+1} = theta_k - dt P_{k+1} (Y_k^T s_k + W_k^T R e_p,k)

  With ``forget_to="prior"`` the prior's share ``(1 - a) P0^-1`` of each step is
  accumulated (its mass decays with ``a`` like the rest of ``P^-1``) and added to
  ``P^-1`` every :data:`PRIOR_INJECT` of mass (about every 20 steps at lambda = 0.5,
  dt = 1 ms), followed by a refactor: ``P^-1`` is exact after each injection, ``P``
  lags by at most that mass.  The pull term uses ``P_{k+1}`` like the rest.
  Because ``P_{k+1}^-1 >= dt W^T R W`` the prediction-error part is a contraction
  (eigenvalues of ``dt P_{k+1} W^T R W`` lie in [0, 1]): the update is stable for any
  P0 and R, like recursive least squares.  The direct law is plain forward Euler
  (``theta_{k+1} = theta_k - dt Gamma Y_k^T s_k``).  Its continuous-time Lyapunov
  bound only limits ``|theta_tilde|`` in the Gamma^-1 metric; with an isotropic Gamma
  a tiny parameter (a wrist inertia) may wander to many times its size, and since
  ``M_hat(q) qdd_r`` contains the velocity feedback ``M_hat Lambda e_dot`` the sampled
  loop destabilises once ``dt (K_D + M_hat_jj Lambda) / M_jj`` nears 2.  Scale Gamma
  per parameter by the parameters' expected sizes (``gamma`` accepts a vector; see
  ``experiments/ardl.py``), or use the composite law (P normalises itself).
* The torque of step k uses ``theta_k`` (the estimate *before* this step's update);
  the update is applied afterwards and reported in :attr:`last_delta_pi`.

Parameters: base or full
------------------------
By default the estimate is the vector of base parameters ``theta = K pi``
(:meth:`RobotModel.base_parameters`), ``Y_b = Y[:, index]`` -- no unidentifiable
directions to drift in.  :attr:`last_delta_pi` is always in FULL pi coordinates,
``from_base(d_theta)`` (dependent entries zero) so that ``Y_full(x) d_pi = Y_b(x) d_theta``
for every state x (what the consistency transform needs).  Friction columns (viscous,
Coulomb per joint) are included when the model has them (``friction=True``).

Adapting a part of the model (``adapted_links``)
-------------------------------------------------
``adapted_links = ["panda_link7"]`` (link names; a body fixed to a link, e.g. the
Panda's ``panda_hand``, names that link's block) estimates only those links' 10
inertial parameters (and the friction columns when the model has them); every other
parameter stays at its value in ``pi0`` (the URDF, for a node).  With the adapted
columns ``A`` and the fixed ones ``F``::

    Y pi = Y_A pi_A + Y_F pi_F,    tau = Y_A theta_hat + Y_F pi_F - K_D s

and every law acts on ``pi_A`` alone (``Y_A^T s``, ``W_A``; the fixed part enters the
prediction error as ``W_F pi_F``).  Base parameters are those of the columns ``A``
(:class:`~adaptive_dynamics.dynamics.base_parameters.BaseParameters` with ``columns``),
the projection acts on the adapted links, :attr:`pi` is the whole estimate (fixed part
included).  This is how an unknown tool is estimated without touching the arm's model.

Physical-consistency projection (``projection=True``)
------------------------------------------------------
Consistency is a property of the full per-link parameters, which base parameters do not
determine.  With ``projection=True`` the controller therefore adapts the FULL pi (the
gains ``gamma``/``p0`` are then ``n_params``-dimensional; :attr:`coordinates` is
``"full"``, :attr:`parameter_names` the full names) and after every update projects
each link onto the consistent set (:func:`~.projection.project_consistent`:
pseudo-inertia eigenvalues clipped to ``projection_eps``, mass floor
``projection_min_mass``, friction >= 0).  The base estimate is still available as
``K pi_hat`` (:attr:`theta_base`).

Safety
------
* Any non-finite input (or a wrong length) raises ``ValueError`` naming the argument,
  BEFORE any state changes (estimate, P, filter untouched).
* ``|e| > max_tracking_error`` (Euclidean norm of q_d - q [rad]): the update is frozen
  (:attr:`frozen` = True, :attr:`freeze_reason`), the torque is still computed.
* ``learn=False``: no update of theta_hat or P (the filter keeps running so switching
  learning back on starts from a warm W).
* The torque is NOT saturated here (the node clips to the effort limits).

Robots that compensate gravity themselves (``robot_compensates_gravity=True``)
----------------------------------------------------------------------------
franka_ros2 adds its own g(q) to the command and reports the link-side torque tau_J.
Then:

* command  ``tau = Y theta_hat - Y_g theta_hat - K_D s``, ``Y_g = Y(q, 0, 0, 0)`` (the
  estimated gravity part is omitted; :attr:`gravity_torque` holds it);
* learning target: ``tau_measured`` is the FULL joint torque (tau_J includes gravity),
  so W and tau_f are unchanged and the parametric model stays the full dynamics
  (:attr:`parametric_torque` = Y theta_hat, gravity included);
* the s-driven term uses the regressor of what the controller itself supplies,
  ``(Y - Y_g)^T s``: the closed loop is ``M s_dot + (C + K_D) s = (Y - Y_g) theta_tilde
  + (g_robot - g_true)``, so this keeps the Lyapunov cross terms cancelling when the
  robot's own gravity model is right (gravity parameters are then learned from the
  prediction error only).  A payload the robot does not know about appears as the
  disturbance ``g_robot - g_true`` that this mode cannot cancel.

Externally computed regressors
------------------------------
:meth:`compute` accepts ``Y`` (and, composite, ``W`` + ``tau_f``) computed elsewhere --
the ``regressor`` node's topics in a distributed set-up -- in full coordinates; they
replace only the internal Slotine-Li regressor / filter step, the rest of the law is
unchanged (equal to the internal path to rounding when computed with the same
``lam``, ``filter_lambda`` and ``dt``; tested).

Persistence: :meth:`save` / :meth:`load` / :meth:`load_state` (``.npz``, see there).
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional

import numpy as np
from scipy.linalg.lapack import dposv as _dposv

from ..dynamics.model import RobotModel
from ..validation import as_vector
from .law import NpzState, read_npz
from .projection import consistency_margins, project_consistent

__all__ = ["AdaptiveController", "LAWS", "MODEL_INPUTS", "FORGET_TO", "spd_gain", "estimate_file"]

LAWS = ("direct", "composite")
MODEL_INPUTS = ("state", "desired")
#: what the composite law's forgetting forgets toward: "zero" (ARDL, Slotine & Li) or
#: "prior" (the initial estimate's information, module docstring)
FORGET_TO = ("zero", "prior")
#: with forget_to "prior": the accumulated prior mass (1 - a per step) added to P^-1 at once
PRIOR_INJECT = 0.01
FORMAT_VERSION = 1

_MATRIX_GAINS = ("lam", "kd", "gamma", "p0", "r")
_SCALAR_GAINS = ("filter_lambda", "lambda0", "k0", "k1", "max_tracking_error")
GAIN_NAMES = _MATRIX_GAINS + _SCALAR_GAINS


def spd_gain(value, dim: int, name: str) -> np.ndarray:
    """A ``dim x dim`` symmetric positive definite gain from a scalar (times identity),
    ``dim`` values (diagonal) or a ``dim x dim`` matrix; ``ValueError`` with the reason
    otherwise (e.g. ``"kd is not positive definite (eigenvalue -1 < 0)"``)."""
    try:
        arr = np.array(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, {dim} numbers or a {dim}x{dim} matrix, got {value!r}") from None
    if arr.ndim == 0:
        M = float(arr) * np.eye(dim)
    elif arr.ndim == 1 and arr.size == dim:
        M = np.diag(arr)
    elif arr.ndim == 1 and arr.size == 1:
        M = float(arr[0]) * np.eye(dim)
    elif arr.shape == (dim, dim):
        M = arr
    elif arr.ndim == 1 and arr.size == dim * dim:
        M = arr.reshape(dim, dim)  # a flattened matrix (ROS parameters are flat arrays)
    else:
        raise ValueError(f"{name} must be a scalar, {dim} values (diagonal) or a {dim}x{dim} matrix, "
                         f"got shape {arr.shape}")
    if not np.all(np.isfinite(M)):
        raise ValueError(f"{name} must be finite, got {M.tolist() if M.size <= 49 else 'a matrix with NaN/inf'}")
    asym = float(np.abs(M - M.T).max()) if dim > 0 else 0.0
    if asym > 1e-12 * max(1.0, float(np.abs(M).max())):
        raise ValueError(f"{name} is not symmetric (max |A - A^T| = {asym:.3g})")
    M = 0.5 * (M + M.T)
    ev = float(np.linalg.eigvalsh(M)[0])
    if not ev > 0.0:
        raise ValueError(f"{name} is not positive definite (eigenvalue {ev:.6g} {'<' if ev < 0 else '<='} 0)")
    return M


def _scalar(value, name: str, *, positive: bool, allow_inf: bool = False) -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(x) or (math.isinf(x) and not allow_inf):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not x > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    if not positive and x < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return x


def _diag_or_none(M: np.ndarray):
    d = np.diag(M).copy()
    return d if np.array_equal(M, np.diag(d)) else None


def _robot_name(model) -> str:
    name = getattr(model, "robot_name", None)
    if name:
        return str(name)
    path = getattr(model, "urdf_path", None)
    if path:
        return os.path.splitext(os.path.basename(path))[0]
    return "unknown"


class AdaptiveController(NpzState):
    """Direct / composite adaptive controller core (one :meth:`compute` per control period;
    the laws' protocol, :mod:`.law`).

    Parameters
    ----------
    model:
        :class:`~adaptive_dynamics.dynamics.RobotModel` (joint order = model order).
        Its current parameters are NOT used (the estimate starts at ``pi0``).
    law:
        ``"direct"`` or ``"composite"``.
    dt:
        Control period [s] (the update is integrated with this step).
    lam:
        Lambda [1/s]: scalar, n values or n x n SPD.
    kd:
        K_D [N m s/rad]: scalar, n values or n x n SPD.
    gamma:
        Gamma of the direct law: scalar, b values or b x b SPD (b = :attr:`n_adapted`).
    p0:
        Initial P of the composite law (same forms as gamma).
    r:
        R [1/(N m)^2 scaled]: weight of the prediction error, scalar, n values or n x n SPD.
    filter_lambda:
        Bandwidth [rad/s] of the first-order filter of W and tau_f.
    lambda0, k0, k1:
        Bounded-gain forgetting (see the module docstring): maximum forgetting rate
        [1/s] (>= 0), the norm at which forgetting would vanish, and the norm above
        which it is switched off.
    base_parameters:
        Adapt the base parameters (default) or the full pi.
    friction:
        ``None`` = as the model; ``True``/``False`` rebuild an internal model copy with
        or without the viscous + Coulomb columns (keeping ``coulomb_smoothing``).
    projection:
        Physical-consistency projection (adapts the full pi, see the module docstring).
    pi0:
        Initial estimate as a FULL pi of the (internal) model (length ``n_params``);
        default zeros (ARDL).  Mapped with ``to_base`` when base parameters are adapted.
    max_tracking_error:
        Freeze the update while ``|q_d - q| > max_tracking_error`` [rad] (default inf).
    robot_compensates_gravity:
        See the module docstring (franka_ros2 mode).
    projection_eps, projection_min_mass:
        Smallest pseudo-inertia eigenvalue and mass floor [kg] of the projection.
    refactor_every:
        Refactor P from P^-1 every this many composite updates.
    adapted_links:
        Link names whose parameters are estimated (``None``: all); see the module
        docstring.  The rest is held at ``pi0``.
    """

    LAWS = LAWS
    GAIN_NAMES = GAIN_NAMES

    STATE_WHAT = "an adaptive-controller state file"

    def __init__(self, model, law: str = "composite", *, dt: float = 1e-3, lam=10.0, kd=20.0,
                 gamma=1.0, p0=1.0, r=1.0, filter_lambda: float = 20.0, lambda0: float = 0.1,
                 k0: float = 1e3, k1: float = 1e2, base_parameters: bool = True, friction=None,
                 projection: bool = False, pi0=None, max_tracking_error: float = np.inf,
                 robot_compensates_gravity: bool = False, projection_eps: float = 0.0,
                 projection_min_mass: float = 0.0, refactor_every: int = 1000, adapted_links=None,
                 forget_to: str = "zero", adapt_to_feedforward: bool = False):
        if law not in LAWS:
            raise ValueError(f"unknown adaptive law {law!r}; available: {list(LAWS)}")
        #: where the model term is evaluated: "state" (Slotine-Li, Y(q, qd, qd_r, qdd_r)) or
        #: "desired" (a pure feed-forward Y(q_d, qd_d, qd_d, qdd_d) -- with learning, Sadegh &
        #: Horowitz's desired-compensation law); settable attribute (MODEL_INPUTS)
        self.model_input = "state"
        #: also evaluate the model at the learner's input, :attr:`model_torque` =
        #: ``Y(q, qd, qdd_d) pi_hat`` (the estimate of this cycle, before its update):
        #: the parametric part of a residual target that is a function of the state
        #: (settable attribute; the node's ``parametric_torque: state``)
        self.state_torque = False
        self.robot_name = _robot_name(model)
        if friction is not None and bool(friction) != bool(model.friction):
            model = RobotModel(model.model, friction=bool(friction), coulomb_smoothing=model.coulomb_smoothing,
                               gravity=np.array(model.model.gravity.linear))
        self.model = model
        self.n = n = model.n
        self.joint_names = list(model.joint_names)
        self.friction = bool(model.friction)
        self.dt = _scalar(dt, "dt", positive=True)
        self.projection = bool(projection)
        self.projection_eps = _scalar(projection_eps, "projection_eps", positive=False)
        self.projection_min_mass = _scalar(projection_min_mass, "projection_min_mass", positive=False)
        self.robot_compensates_gravity = bool(robot_compensates_gravity)
        self.refactor_every = max(1, int(refactor_every))

        P_full = model.n_params
        self.adapted_links, self.columns = self._adapted_columns(model, adapted_links)
        self.base = model.base_parameters(columns=self.columns)
        self.use_base = bool(base_parameters) and not self.projection
        self.coordinates = "base" if self.use_base else "full"
        self.full_parameter_names = list(model.parameter_names)
        if self.use_base:
            self.index = self.base.index
            self.n_adapted = b = self.base.n_base
            self.parameter_names = list(self.base.names)
        elif self.columns is not None:
            self.index = self.columns
            self.n_adapted = b = self.columns.size
            self.parameter_names = [self.full_parameter_names[i] for i in self.columns]
        else:
            self.index = None
            self.n_adapted = b = P_full
            self.parameter_names = list(model.parameter_names)
        # the part held fixed (zero on the adapted columns; all zero without adapted_links)
        self.pi_fixed = np.zeros(P_full)
        self._proj_links = n if self.columns is None else len(self.adapted_links)

        # ---- gains (validated all at once)
        self.lam = self.kd = self.gamma = self.p0 = self.r = None
        self._law = law
        self.set_gains(lam=lam, kd=kd, gamma=gamma, p0=p0, r=r, filter_lambda=filter_lambda,
                       lambda0=lambda0, k0=k0, k1=k1, max_tracking_error=max_tracking_error)

        # ---- state
        self.theta = np.zeros(b)
        self.set_estimate(pi=pi0 if pi0 is not None else np.zeros(P_full))
        self.filter = model.filtered_regressor(self.filter_lambda, self.dt)
        self.P = self.p0.copy()
        self.P_inv = np.linalg.inv(self.p0)
        self.P_inv = 0.5 * (self.P_inv + self.P_inv.T)
        self.forgetting = 0.0
        self.p_norm = float(np.abs(self.P).sum(axis=0).max())
        #: the estimate the composite law's forgetting returns to (forget_to "prior"): the
        #: initial estimate; :meth:`set_prior` changes it
        self.theta_prior = self.theta.copy()
        self._prior_mass = 0.0
        self.forget_to = forget_to
        #: with a ``feedforward`` in :meth:`compute`: the s-driven term adapts on s - K_D^-1 f
        self.adapt_to_feedforward = bool(adapt_to_feedforward)
        #: a fixed joint-friction model beside the estimate (module docstring; None: none)
        self.fixed_friction = None

        # ---- outputs (preallocated, overwritten every call)
        self.e = np.zeros(n)
        self.e_dot = np.zeros(n)
        self.s = np.zeros(n)
        self.qd_r = np.zeros(n)
        self.qdd_r = np.zeros(n)
        self.parametric_torque = np.zeros(n)
        self.model_torque = np.zeros(n)
        self.feedback_torque = np.zeros(n)
        self.gravity_torque = np.zeros(n)
        self.prediction_error = np.zeros(n)
        self.torque = np.zeros(n)
        self.last_delta_theta = np.zeros(b)
        self.last_delta_pi = np.zeros(P_full)
        self.frozen = False
        self.freeze_reason = ""
        self.updated = False
        self.projected = False
        self.cycles = 0
        self.updates = 0
        self.frozen_cycles = 0
        self.rejected_inputs = 0
        self.projections = 0

        # ---- scratch
        self._x = np.zeros(6 * n)
        self._zero = np.zeros(n)
        self._Yb = np.zeros((n, b))
        self._Wb = np.zeros((n, b))
        self._Ygb = np.zeros((n, b))
        self._g = np.zeros(b)
        self._gt = np.zeros(b)
        self._dtheta = np.zeros(b)
        self._Re = np.zeros(n)
        self._WP = np.zeros((n, b))
        self._S = np.zeros((n, n))
        self._PP = np.zeros((b, b))
        self._RW = np.zeros((n, b))
        self._abs = np.zeros((b, b))
        self._since_refactor = 0
        self._pi_scratch = np.zeros(b)
        self._sv = np.zeros(n)
        self.fixed_friction_torque = np.zeros(n)

    @staticmethod
    def _adapted_columns(model, links):
        """(sorted link names, full column indices) of ``adapted_links``; (None, None) = all."""
        if links is None:
            return None, None
        if isinstance(links, str):
            links = [links]
        links = [str(x) for x in links]
        if not links:
            raise ValueError("adapted_links is empty; give link names (or leave it unset to adapt every link)")
        blocks = sorted({model.link_block(name) for name in links})
        cols = [10 * i + k for i in blocks for k in range(10)]
        cols += list(range(model.n_inertial, model.n_params))   # friction columns, when the model has them
        return [model.link_names[i] for i in blocks], np.array(cols, dtype=int)

    # ------------------------------------------------------------------ configuration
    @property
    def law(self) -> str:
        return self._law

    @law.setter
    def law(self, value: str) -> None:
        if value not in LAWS:
            raise ValueError(f"unknown adaptive law {value!r}; available: {list(LAWS)}")
        if value == "composite" and self._law != "composite":
            self.filter.reset()
        self._law = value

    @property
    def forget_to(self) -> str:
        return self._forget_to

    @forget_to.setter
    def forget_to(self, value: str) -> None:
        if value not in FORGET_TO:
            raise ValueError(f"forget_to must be one of {list(FORGET_TO)}, got {value!r}")
        self._forget_to = value
        self._prior_mass = 0.0

    def set_prior(self, pi=None, theta=None) -> None:
        """The estimate ``forget_to="prior"`` returns to: a full ``pi`` or ``theta`` in
        the adapted coordinates; neither: the current estimate."""
        if pi is None and theta is None:
            self.theta_prior = self.theta.copy()
            return
        th, _ = self._adapted(pi, theta)
        if self.projection:
            project_consistent(th, self._proj_links, eps=self.projection_eps, min_mass=self.projection_min_mass)
        self.theta_prior = th

    def set_gains(self, **kw) -> None:
        """Validate and set any of :attr:`GAIN_NAMES`; all-or-nothing (a refused value
        leaves every gain unchanged; ``ValueError`` gives the reason).

        Setting ``p0`` also resets P (and P^-1) to the new P0.  ``filter_lambda`` is
        applied to the running filter (W and tau_f keep their state; both use the new
        pole from the next sample, so W theta = tau_f stays consistent).
        """
        unknown = sorted(set(kw) - set(GAIN_NAMES))
        if unknown:
            raise ValueError(f"unknown gain(s) {unknown}; valid: {list(GAIN_NAMES)}")
        n, b = self.n, self.n_adapted
        new: dict[str, Any] = {}
        dims = {"lam": n, "kd": n, "gamma": b, "p0": b, "r": n}
        for k in _MATRIX_GAINS:
            if kw.get(k) is not None:
                new[k] = spd_gain(kw[k], dims[k], k)
        if kw.get("filter_lambda") is not None:
            new["filter_lambda"] = _scalar(kw["filter_lambda"], "filter_lambda", positive=True)
        if kw.get("lambda0") is not None:
            new["lambda0"] = _scalar(kw["lambda0"], "lambda0", positive=False)
        for k in ("k0", "k1"):
            if kw.get(k) is not None:
                new[k] = _scalar(kw[k], k, positive=True, allow_inf=True)
        if kw.get("max_tracking_error") is not None:
            new["max_tracking_error"] = _scalar(kw["max_tracking_error"], "max_tracking_error",
                                                positive=True, allow_inf=True)
        for k, v in new.items():
            setattr(self, k, v)
        if "lam" in new:
            self._lam_d = _diag_or_none(self.lam)
        if "kd" in new:
            self._kd_d = _diag_or_none(self.kd)
        if "gamma" in new:
            self._gamma_d = _diag_or_none(self.gamma)
        if "r" in new:
            self._r_d = _diag_or_none(self.r)
            self.r_inv = np.linalg.inv(self.r)
            self.r_inv = 0.5 * (self.r_inv + self.r_inv.T)
        if "p0" in new:
            p0i = np.linalg.inv(self.p0)
            self._p0_inv = 0.5 * (p0i + p0i.T)
            self._p0_inv_d = _diag_or_none(self._p0_inv)
            if hasattr(self, "P"):
                self.reset_covariance()
        if "filter_lambda" in new and hasattr(self, "filter"):
            self.filter.lam = self.filter_lambda

    def gains(self) -> dict:
        """Current gains (matrices as arrays)."""
        return {k: (getattr(self, k).copy() if isinstance(getattr(self, k), np.ndarray) else getattr(self, k))
                for k in GAIN_NAMES}

    def reset_covariance(self) -> None:
        """P <- P0 (and P^-1 <- P0^-1)."""
        self.P = self.p0.copy()
        Pi = np.linalg.inv(self.p0)
        self.P_inv = 0.5 * (Pi + Pi.T)
        self.p_norm = float(np.abs(self.P).sum(axis=0).max())
        self._since_refactor = 0
        self._prior_mass = 0.0

    def reset_filter(self) -> None:
        self.filter.reset()

    # ------------------------------------------------------------------ estimate
    def set_estimate(self, pi=None, theta=None) -> None:
        """Set the estimate from a FULL ``pi`` (length ``model.n_params``) or from
        ``theta`` in the adapted coordinates (length :attr:`n_adapted`).  With
        ``adapted_links``, ``pi`` also sets the fixed part (its entries outside the
        adapted columns); ``theta`` leaves it as it is."""
        th, fixed = self._adapted(pi, theta)
        self.theta = th
        if fixed is not None:
            self.pi_fixed = fixed
            self._has_fixed = bool(np.any(fixed))
        if self.projection:
            self.projected = project_consistent(self.theta, self._proj_links, eps=self.projection_eps,
                                                min_mass=self.projection_min_mass)

    def _adapted(self, pi, theta):
        """``(theta, fixed part)`` of exactly one of a full ``pi`` (fixed: its entries
        outside the adapted columns) or ``theta`` (fixed: None), validated; ``ValueError``
        naming what is wrong."""
        if (pi is None) == (theta is None):
            raise ValueError("give exactly one of pi (full) or theta (adapted coordinates)")
        if pi is not None:
            pi = np.asarray(pi, dtype=float).reshape(-1)
            if pi.size != self.model.n_params:
                raise ValueError(f"pi must have {self.model.n_params} entries (full parameters of the model), "
                                 f"got {pi.size}")
            if not np.all(np.isfinite(pi)):
                raise ValueError("pi must be finite")
            if self.use_base:
                th = self.base.to_base(pi)
            elif self.columns is not None:
                th = pi[self.columns]
            else:
                th = pi.copy()
            fixed = pi.copy()
            if self.columns is not None:
                fixed[self.columns] = 0.0
            else:
                fixed[:] = 0.0
        else:
            fixed = None
            th = np.asarray(theta, dtype=float).reshape(-1)
            if th.size != self.n_adapted:
                raise ValueError(f"theta must have {self.n_adapted} entries ({self.coordinates} parameters), "
                                 f"got {th.size}")
            if not np.all(np.isfinite(th)):
                raise ValueError("theta must be finite")
        return np.array(th, dtype=float), fixed

    @property
    def pi(self) -> np.ndarray:
        """The estimate as a full pi (``from_base(theta)`` with base parameters: dependent
        entries zero; a representative, not the unique physical pi), plus the fixed part
        with ``adapted_links``."""
        if self.use_base:
            return self.pi_fixed + self.base.from_base(self.theta)
        if self.columns is None:
            return self.theta.copy()
        pi = self.pi_fixed.copy()
        pi[self.columns] = self.theta
        return pi

    @property
    def theta_base(self) -> np.ndarray:
        """The estimate in base-parameter coordinates (``K pi_hat`` when full pi is adapted;
        of the adapted columns with ``adapted_links``)."""
        return self.theta.copy() if self.use_base else self.base.to_base(self.pi)

    def link_estimate(self, link: str) -> dict:
        """Mass [kg], centre of mass [m] (link frame) and the 10 parameters of the block
        holding ``link`` in the current estimate (a representative with base parameters)."""
        i = self.model.link_block(link)
        blk = self.pi[10 * i: 10 * i + 10]
        m = float(blk[0])
        com = (blk[1:4] / m).tolist() if abs(m) > 1e-12 else [float("nan")] * 3
        return {"link": self.model.link_names[i], "mass": m, "com": com, "pi10": blk.tolist()}

    def nominal_gamma_scale(self, pi_nominal, floor: float = 1e-2) -> np.ndarray:
        """``diag(s_i^2)`` for a direct-law ``Gamma = gamma * diag(s_i^2)``: ``s_i`` the
        magnitude of adapted parameter i in ``pi_nominal`` (a full pi; base combinations,
        or the ``adapted_links`` columns, as this controller adapts them), floored at
        ``floor`` times the largest; friction entries 1 (a nominal model has none).  Each
        parameter then moves relative to its own size."""
        full = np.asarray(pi_nominal, dtype=float)
        if self.use_base:
            th = np.abs(self.base.to_base(full))
        else:
            th = np.abs(full if self.columns is None else full[self.columns])
        scale = np.maximum(th, floor * th.max())
        for i, name in enumerate(self.parameter_names):
            if name.split(" ")[0].endswith((".fv", ".fc")):
                scale[i] = 1.0
        return scale ** 2

    def consistency_margins(self) -> np.ndarray:
        """Smallest pseudo-inertia eigenvalue per link of the (full) estimate
        (meaningful with full-pi adaptation; for base parameters of ``from_base``)."""
        return consistency_margins(self.pi, self.n)

    # ------------------------------------------------------------------ control
    def _reject(self, q, v, q_d, v_d, a_d, tau_measured):
        self.rejected_inputs += 1
        n = self.n
        for name, val in (("q", q), ("v", v), ("q_d", q_d), ("v_d", v_d), ("a_d", a_d),
                          ("tau_measured", tau_measured)):
            if val is None and name == "tau_measured":
                continue
            as_vector(val, n, name)  # raises naming the argument
        raise ValueError("inputs are too large (their squares overflow); rejected")

    def _external(self, Y, W, tau_f):
        """Validated externally computed regressors (see :meth:`compute`); ``ValueError``
        (counted in :attr:`rejected_inputs`) naming the argument otherwise."""
        n, P = self.n, self.model.n_params
        out = []
        for name, val, shape in (("Y", Y, (n, P)), ("W", W, (n, P)), ("tau_f", tau_f, (n,))):
            if val is None:
                out.append(None)
                continue
            try:
                arr = np.asarray(val, dtype=float)
            except (TypeError, ValueError):
                arr = None
            if arr is None or arr.shape != shape:
                self.rejected_inputs += 1
                got = "not numeric" if arr is None else f"shape {arr.shape}"
                raise ValueError(f"{name} must have shape {shape} (rows: joints, columns: the full parameters"
                                 f" {'+ friction ' if self.friction else ''}of the model), got {got}")
            if not np.isfinite(arr).all():
                self.rejected_inputs += 1
                raise ValueError(f"{name} has non-finite entries")
            out.append(arr)
        if (out[1] is None) != (out[2] is None):
            self.rejected_inputs += 1
            raise ValueError("W and tau_f must be given together (the filtered regressor and the filtered"
                             " measured torque of the same filter)")
        return out

    def compute(self, q, v, q_d, v_d, a_d, tau_measured=None, learn: bool = True, *,
                Y=None, W=None, tau_f=None, reference=None, extra_torque=None,
                tracking_error: Optional[float] = None, feedforward=None) -> np.ndarray:
        """One control period: torque for the current state, then the parameter update.

        Returns a new array (model joint order, NOT saturated).  After the call the
        attributes :attr:`parametric_torque`, :attr:`feedback_torque`, (with
        :attr:`state_torque`) :attr:`model_torque`,
        :attr:`gravity_torque`, :attr:`s`, :attr:`e`, :attr:`prediction_error`,
        :attr:`last_delta_pi`, :attr:`last_delta_theta`, :attr:`frozen`,
        :attr:`freeze_reason`, :attr:`updated` describe this cycle (buffers
        overwritten by the next call).

        ``tau_measured`` (the full measured joint torque) is required by the composite
        law when ``learn`` is true (``ValueError`` otherwise: silently dropping the
        prediction error would change the law), unless ``W``/``tau_f`` are given.
        Raises ``ValueError`` (state untouched) on non-finite or wrongly sized inputs.

        Externally computed regressors (e.g. the ``regressor`` node's topics), all in
        FULL coordinates of :attr:`model` (rows = joints, columns =
        :attr:`full_parameter_names`, friction columns included when :attr:`friction`):

        * ``Y`` -- the Slotine-Li regressor ``Y(q, qd, qd_r, qdd_r)``, used instead of
          computing it.  It must have been computed with this controller's ``lam``
          (``qd_r``, ``qdd_r`` and ``s`` are still formed here with ``lam``);
        * ``W``, ``tau_f`` (together; composite law, ignored by the direct law) -- the
          filtered regressor and filtered measured torque of this step, used instead of
          running the internal filter (which is then not advanced; ``tau_measured`` is
          not needed).  Same ``filter_lambda`` and step ``dt`` as this controller for
          the identical law.

        Everything else (base-parameter selection, gravity mode, update, projection,
        freeze, counters) is the same as with the internal computation.

        ``reference = (qd_r, qdd_r)``: the reference velocity and acceleration of another
        reference generator (e.g. :class:`~adaptive_dynamics.control.backstepping.TaskSpaceReference`),
        used instead of ``v_d + Lambda (q_d - q)`` and its derivative: ``s = v - qd_r``;
        ``q_d``, ``v_d`` then only feed :attr:`e` (the freeze test).  ``extra_torque`` is
        added to the command (a backstepping cross term); it is part of neither the
        parametric nor the feedback torque.  ``tracking_error`` replaces ``|q_d - q|`` in
        the freeze test (another generator's error norm, e.g. the task-space error).

        ``feedforward``: a learned residual torque ``f`` added to the command (a residual
        learner's); with :attr:`adapt_to_feedforward` the s-driven term adapts on
        ``s_v = s - K_D^-1 f`` -- the sliding variable the loop would show if the
        feedback had supplied ``f`` -- so the parametric estimate still takes whatever
        part of the residual it can express (module docstring); otherwise ``f`` is only
        added.  Not finite: ``ValueError``, nothing changed.
        """
        n = self.n
        x = self._x
        isfinite = math.isfinite
        try:
            if len(q) != n or len(v) != n or len(q_d) != n or len(v_d) != n or len(a_d) != n:
                raise ValueError
            x[0:n] = q
            x[n:2 * n] = v
            x[2 * n:3 * n] = q_d
            x[3 * n:4 * n] = v_d
            x[4 * n:5 * n] = a_d
            if tau_measured is None:
                x[5 * n:] = 0.0
            else:
                if len(tau_measured) != n:
                    raise ValueError
                x[5 * n:] = tau_measured
            ok = isfinite(x.dot(x))
        except (TypeError, ValueError, IndexError):
            ok = False
        if not ok:
            self._reject(q, v, q_d, v_d, a_d, tau_measured)
        if Y is not None or W is not None or tau_f is not None:
            Y, W, tau_f = self._external(Y, W, tau_f)
        tff = None
        if self.fixed_friction is not None:
            if W is not None:
                raise ValueError("a fixed friction model needs the internal filter (not external W, tau_f)")
            tff = self.fixed_friction.torque(x[n:2 * n][None, :])[0]
            self.fixed_friction_torque[:] = tff
            if tau_measured is not None:
                x[5 * n:] -= tff     # the estimate learns the torque the fixed model leaves
        if feedforward is not None:
            ff = np.asarray(feedforward, dtype=float)
            if ff.shape != (n,) or not np.isfinite(ff).all():
                self.rejected_inputs += 1
                raise ValueError(f"feedforward must be {n} finite values, got shape {ff.shape}")
        composite = self._law == "composite"
        if composite and learn and tau_measured is None and W is None:
            raise ValueError("the composite law needs tau_measured (the measured joint torque) to learn; "
                             "pass it (or W and tau_f), or learn=False")
        q, v, qd_, vd_, ad_ = x[0:n], x[n:2 * n], x[2 * n:3 * n], x[3 * n:4 * n], x[4 * n:5 * n]
        tau_m = x[5 * n:]

        # ---- sliding variables
        e, ed, vr, ar, s = self.e, self.e_dot, self.qd_r, self.qdd_r, self.s
        np.subtract(qd_, q, out=e)
        np.subtract(vd_, v, out=ed)
        if reference is not None:
            vr[:], ar[:] = reference   # (raises on a wrong size: nothing has changed yet)
            if not (np.isfinite(vr).all() and np.isfinite(ar).all()):
                raise ValueError("reference (qd_r, qdd_r) is not finite")
        elif self._lam_d is not None:
            np.multiply(self._lam_d, e, out=vr)
            np.multiply(self._lam_d, ed, out=ar)
        else:
            np.dot(self.lam, e, out=vr)
            np.dot(self.lam, ed, out=ar)
        if reference is None:
            vr += vd_
            ar += ad_
        np.subtract(v, vr, out=s)

        # ---- regressor and torque
        model = self.model
        if Y is None:
            if self.model_input == "state" or reference is not None:
                Y = model.slotine_li_regressor(q, v, vr, ar)
            else:   # the model as a pure feed-forward of the reference (model_input "desired")
                Y = model.slotine_li_regressor(qd_, vd_, vd_, ad_)
        if self.index is not None:
            Yb = np.take(Y, self.index, axis=1, out=self._Yb)
        else:
            Yb = Y
        theta = self.theta
        np.dot(Yb, theta, out=self.parametric_torque)
        if self._has_fixed:
            self.parametric_torque += Y.dot(self.pi_fixed)
        if self.state_torque:
            np.dot(model.regressor(q, v, ad_), self.pi, out=self.model_torque)
        fb = self.feedback_torque
        if self._kd_d is not None:
            np.multiply(self._kd_d, s, out=fb)
        else:
            np.dot(self.kd, s, out=fb)
        np.negative(fb, out=fb)
        tau = self.torque
        np.add(self.parametric_torque, fb, out=tau)
        if extra_torque is not None:
            tau += extra_torque
        if feedforward is not None:
            tau += ff
        if tff is not None:
            tau += tff
        Ys = Yb  # regressor of what the controller supplies (s-driven term)
        if self.robot_compensates_gravity:
            Yg = model.regressor(q, self._zero, self._zero)
            Ygb = np.take(Yg, self.index, axis=1, out=self._Ygb) if self.index is not None else Yg
            np.dot(Ygb, theta, out=self.gravity_torque)
            if self._has_fixed:
                self.gravity_torque += Yg.dot(self.pi_fixed)
            tau -= self.gravity_torque
            Ys = np.subtract(Yb, Ygb, out=self._Ygb)

        # ---- filter (composite): runs whenever a measured torque is available (or W is given)
        Wb = None
        if composite and (W is not None or tau_measured is not None):
            if W is None:
                W, tau_f = self.filter.update(q, v, tau_m)
            Wb = np.take(W, self.index, axis=1, out=self._Wb) if self.index is not None else W
            np.dot(Wb, theta, out=self.prediction_error)
            if self._has_fixed:
                self.prediction_error += W.dot(self.pi_fixed)
            self.prediction_error -= tau_f

        # ---- update
        self.cycles += 1
        self.updated = False
        self.projected = False
        en = math.sqrt(e.dot(e)) if tracking_error is None else float(tracking_error)
        if en > self.max_tracking_error:
            self.frozen = True
            what = "|q_d - q|" if tracking_error is None else "(task space)"
            self.freeze_reason = (f"tracking error {what} = {en:.4g} exceeds max_tracking_error "
                                  f"= {self.max_tracking_error:.4g}")
            self.frozen_cycles += 1
        else:
            self.frozen = False
            self.freeze_reason = ""
        dth = self._dtheta
        if learn and not self.frozen:
            sv = s
            if feedforward is not None and self.adapt_to_feedforward:
                sv = self._sv
                if self._kd_d is not None:
                    np.divide(ff, self._kd_d, out=sv)
                else:
                    sv[:] = np.linalg.solve(self.kd, ff)
                np.subtract(s, sv, out=sv)
            g = np.dot(Ys.T, sv, out=self._g)
            if composite:
                self._update_covariance(Wb)
                Re = self._Re
                if self._r_d is not None:
                    np.multiply(self._r_d, self.prediction_error, out=Re)
                else:
                    np.dot(self.r, self.prediction_error, out=Re)
                g += np.dot(Wb.T, Re, out=self._gt)
                if self._forget_to == "prior" and self.forgetting > 0.0:
                    d = np.subtract(theta, self.theta_prior, out=self._gt)
                    if self._p0_inv_d is not None:
                        d *= self._p0_inv_d
                    else:
                        d = np.dot(self._p0_inv, d)
                    d *= self.forgetting
                    g += d
                np.dot(self.P, g, out=dth)
            elif self._gamma_d is not None:
                np.multiply(self._gamma_d, g, out=dth)
            else:
                np.dot(self.gamma, g, out=dth)
            dth *= -self.dt
            if self.projection:
                old = self._pi_scratch
                old[:] = theta
                theta += dth
                if project_consistent(theta, self._proj_links, eps=self.projection_eps,
                                      min_mass=self.projection_min_mass):
                    self.projected = True
                    self.projections += 1
                    np.subtract(theta, old, out=dth)
            else:
                theta += dth
            self.updated = True
            self.updates += 1
            self.last_delta_theta[:] = dth
            if self.index is not None:
                self.last_delta_pi.fill(0.0)
                self.last_delta_pi[self.index] = dth  # from_base: projector is a column selection
            else:
                self.last_delta_pi[:] = dth
        else:
            self.last_delta_theta.fill(0.0)
            self.last_delta_pi.fill(0.0)
        return tau.copy()

    def _update_covariance(self, Wb: np.ndarray) -> None:
        """One exact ZOH step of d/dt P^-1 = -lambda P^-1 + W^T R W (module docstring)."""
        h = self.dt
        pn = self.p_norm
        lam = self.lambda0 * (1.0 - pn / self.k0) if pn <= self.k1 else 0.0
        if lam < 0.0:
            lam = 0.0
        self.forgetting = lam
        lh = lam * h
        if lh > 1e-12:
            a = math.exp(-lh)
            c = -math.expm1(-lh) / lam
        else:
            a, c = 1.0, h
        P = self.P
        # P+ = (1/a) [P - P W^T (a/c R^-1 + W P W^T)^-1 W P]
        WP = np.dot(Wb, P, out=self._WP)
        S = np.dot(WP, Wb.T, out=self._S)
        S += (a / c) * self.r_inv
        _c, X, info = _dposv(S, WP)  # raw LAPACK Cholesky solve (numpy's solve: ~4x the overhead)
        if info != 0:  # pragma: no cover - S >= (a/c) R^-1 > 0
            X = np.linalg.solve(S, WP)
        PP = np.dot(WP.T, X, out=self._PP)
        P -= PP
        if a != 1.0:
            P *= 1.0 / a
        # P^-1+ = a P^-1 + c W^T R W
        Pi = self.P_inv
        if a != 1.0:
            Pi *= a
        RW = np.dot(self.r, Wb, out=self._RW)
        RW *= c
        Pi += np.dot(Wb.T, RW, out=self._PP)
        self._since_refactor += 1
        if self._forget_to == "prior" and a != 1.0:
            self._prior_mass = a * self._prior_mass + (1.0 - a)
            if self._prior_mass >= PRIOR_INJECT:
                Pi += self._prior_mass * self._p0_inv
                self._prior_mass = 0.0
                self._since_refactor = self.refactor_every
        if self._since_refactor >= self.refactor_every:
            self._refactor()
        else:
            # symmetrise (rounding of the rank-n downdate)
            PT = self._PP
            PT[:] = P.T
            P += PT
            P *= 0.5
        self.p_norm = float(np.abs(P, out=self._abs).sum(axis=0).max())

    def _refactor(self) -> None:
        """P <- (P^-1)^-1 by Cholesky (kills the rounding drift of the Woodbury updates)."""
        Pi = self.P_inv
        Pi += Pi.T
        Pi *= 0.5
        try:
            L = np.linalg.cholesky(Pi)
            Linv = np.linalg.inv(L)
            P = Linv.T @ Linv
            self.P[:] = 0.5 * (P + P.T)
        except np.linalg.LinAlgError:  # pragma: no cover - P^-1 is PD by construction
            pass
        self._since_refactor = 0

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict:
        g = self.gains()
        return {
            "format_version": np.array(FORMAT_VERSION),
            "law": np.array(self._law),
            "robot": np.array(self.robot_name),
            "joint_names": np.array(self.joint_names),
            "coordinates": np.array(self.coordinates),
            "parameter_names": np.array(self.parameter_names),
            "full_parameter_names": np.array(self.full_parameter_names),
            "friction": np.array(self.friction),
            "coulomb_smoothing": np.array(float(self.model.coulomb_smoothing)),
            "projection": np.array(self.projection),
            "robot_compensates_gravity": np.array(self.robot_compensates_gravity),
            "dt": np.array(self.dt),
            "theta": self.theta.copy(),
            "pi": self.pi,
            "theta_base": self.theta_base,
            "P": self.P.copy(),
            "P_inv": self.P_inv.copy(),
            "updates": np.array(self.updates),
            "adapted_links": np.array(self.adapted_links if self.adapted_links is not None else [], dtype=str),
            "pi_fixed": self.pi_fixed.copy(),
            "forget_to": np.array(self._forget_to),
            "theta_prior": self.theta_prior.copy(),
            **{f"gain_{k}": np.asarray(v) for k, v in g.items()},
        }

    def load_state_dict(self, d: dict, *, covariance: bool = True, where: str = "state") -> None:
        """Take theta_hat (and P, when ``covariance`` and ``d`` has a matching one) from a
        :meth:`state_dict` (:meth:`load_state`: from a file written by :meth:`save`).

        The robot, joint names and parameter layout (coordinates + names) must match
        this controller; otherwise ``ValueError`` says what differs (nothing is changed).
        """
        for key in ("robot", "joint_names", "coordinates", "parameter_names", "theta"):
            if key not in d:
                raise ValueError(f"{where}: missing {key!r}; not an adaptive-controller state file")
        robot = str(d["robot"])
        if robot != self.robot_name and "unknown" not in (robot, self.robot_name):
            raise ValueError(f"{where}: saved for robot {robot!r}, this controller is for {self.robot_name!r}")
        joints = [str(j) for j in d["joint_names"]]
        if joints != self.joint_names:
            raise ValueError(f"{where}: joint names {joints} differ from the model's {self.joint_names}")
        saved_links = [str(x) for x in d["adapted_links"]] if "adapted_links" in d else []
        if saved_links != (self.adapted_links or []):
            raise ValueError(f"{where}: saved with adapted_links {saved_links or 'all'}, this controller adapts "
                             f"{self.adapted_links or 'all links'}")
        coords = str(d["coordinates"])
        names = [str(x) for x in d["parameter_names"]]
        if coords != self.coordinates or names != self.parameter_names:
            diff = [f"{a!r} != {b!r}" for a, b in zip(names, self.parameter_names) if a != b][:3]
            raise ValueError(
                f"{where}: parameter layout differs: saved {coords} parameters ({len(names)}), controller uses "
                f"{self.coordinates} parameters ({len(self.parameter_names)}; friction={self.friction}, "
                f"projection={self.projection})" + (f"; first differences: {diff}" if diff else ""))
        theta = np.asarray(d["theta"], dtype=float)
        if theta.shape != (self.n_adapted,) or not np.all(np.isfinite(theta)):
            raise ValueError(f"{where}: theta has shape {theta.shape} or non-finite entries")
        fixed = None
        if self.columns is not None and "pi_fixed" in d:
            fixed = np.asarray(d["pi_fixed"], dtype=float)
            if fixed.shape != self.pi_fixed.shape or not np.all(np.isfinite(fixed)) or np.any(fixed[self.columns]):
                raise ValueError(f"{where}: pi_fixed has shape {fixed.shape}, non-finite entries or values on "
                                 "the adapted columns")
        P = None
        if covariance and "P" in d and d["P"].shape == (self.n_adapted, self.n_adapted):
            P = np.asarray(d["P"], dtype=float)
            Pinv = np.asarray(d.get("P_inv", np.linalg.inv(P)), dtype=float)
            if not (np.all(np.isfinite(P)) and np.all(np.isfinite(Pinv))):
                raise ValueError(f"{where}: P is not finite")
        prior = theta
        if "theta_prior" in d:   # (files before forget_to: their estimate is the prior)
            prior = np.asarray(d["theta_prior"], dtype=float)
            if prior.shape != theta.shape or not np.all(np.isfinite(prior)):
                raise ValueError(f"{where}: theta_prior has shape {prior.shape} or non-finite entries")
        self.theta = theta.copy()
        self.theta_prior = prior.copy()
        if fixed is not None:
            self.pi_fixed = fixed.copy()
            self._has_fixed = bool(np.any(fixed))
        if P is not None:
            self.P = 0.5 * (P + P.T)
            self.P_inv = 0.5 * (Pinv + Pinv.T)
            self.p_norm = float(np.abs(self.P).sum(axis=0).max())
            self._since_refactor = 0
            self._prior_mass = 0.0
        self.filter.reset()

    @classmethod
    def load(cls, path, model, **overrides) -> "AdaptiveController":
        """A controller for ``model`` with the law, gains, switches and state saved in
        ``path``; keyword ``overrides`` replace saved settings (e.g. ``kd=...``)."""
        d = read_npz(path, cls.STATE_WHAT)
        try:
            kwargs: dict[str, Any] = {
                "law": str(d["law"]),
                "dt": float(d["dt"]),
                "friction": bool(d["friction"]),
                "projection": bool(d["projection"]),
                "base_parameters": str(d["coordinates"]) == "base" or bool(d["projection"]),
                "robot_compensates_gravity": bool(d["robot_compensates_gravity"]),
            }
            if "forget_to" in d:
                kwargs["forget_to"] = str(d["forget_to"])
            if "adapted_links" in d and d["adapted_links"].size:
                kwargs["adapted_links"] = [str(x) for x in d["adapted_links"]]
            for k in GAIN_NAMES:
                if f"gain_{k}" in d:
                    val = d[f"gain_{k}"]
                    kwargs[k] = float(val) if val.ndim == 0 else val
        except KeyError as exc:
            raise ValueError(f"{os.fspath(path)}: missing {exc}; not an adaptive-controller state file") from None
        kwargs.update(overrides)
        ctl = cls(model, **kwargs)
        ctl.load_state(path)
        return ctl

    def diagnostics(self) -> dict:
        """Counters and state for the node's diagnostics."""
        return {
            "law": self._law, "coordinates": self.coordinates, "n_adapted": self.n_adapted,
            "cycles": self.cycles, "updates": self.updates, "frozen": self.frozen,
            "freeze_reason": self.freeze_reason, "frozen_cycles": self.frozen_cycles,
            "rejected_inputs": self.rejected_inputs, "projections": self.projections,
            "adapted_links": self.adapted_links or "all",
            "p_norm": self.p_norm, "forgetting": self.forgetting,
            "forget_to": self._forget_to,
        }


def estimate_file(model, ident, path: str, *, law: str = "direct") -> str:
    """Write ``ident`` (an :class:`~adaptive_dynamics.dynamics.identification.Identification`)
    as an :class:`AdaptiveController` state file (``estimate_file`` of the ``adaptive_controller`` node), for a
    controller with base parameters and friction columns exactly as ``model`` has."""
    ctl = AdaptiveController(model, law, pi0=ident.pi)
    if not np.allclose(ctl.theta, ident.theta, rtol=1e-12, atol=1e-12):
        raise ValueError("the identified parameters are not in the controller's base coordinates")
    return ctl.save(path)


"""External joint torques from a dynamics model: the generalized-momentum observer
(De Luca & Mattone 2003; Haddadin, De Luca & Albu-Schaeffer, "Robot collisions: a
survey", T-RO 2017), on any model the suite holds.  No ROS import.

Continuous time
---------------
With the generalized momentum ``p = M(q) q_dot`` and ``M_dot = C + C^T`` (pinocchio's
Christoffel-consistent C, :class:`~adaptive_dynamics.dynamics.RobotModel`) the dynamics
``M q_ddot + C q_dot + g + tau_f + f = tau + tau_ext`` read::

    p_dot = tau + tau_ext + C^T(q, q_dot) q_dot - g(q) - tau_f(q_dot) - f

so the residual::

    r(t) = K_O ( p(t) - int_0^t (tau + C^T q_dot - g - tau_f - f_hat + r) ds - p(0) )

obeys ``r_dot = K_O (tau_ext - r)``: each joint's r is the external torque through a
first-order low pass of time constant ``1 / K_O[i]`` (``K_O`` diagonal, one gain per
joint), with no acceleration and no inverse of M.  ``tau`` is the measured joint torque,
``tau_f`` the model's joint friction, ``f_hat`` the residual a learner predicts for what
the rigid-body + friction model misses (whatever the model and the learner leave is
reported as external torque: the better the model, the smaller the torque that can be
told apart from modelling error).  ``armature`` (drive inertia reflected to the joints,
constant) adds ``diag(armature)`` to M and nothing to C.

Discrete time (what :meth:`MomentumObserver.update` computes)
--------------------------------------------------------------
Samples ``x_k = (q_k, q_dot_k)`` at instants ``t_k`` (any spacing ``dt = t_{k+1} - t_k``).
Over a step the external torque is taken constant at its mean over the step, which the
momentum difference gives exactly::

    tau_ext_k = (p_{k+1} - p_k) / dt - tau_k - (b_k + b_{k+1}) / 2 + f_hat_k,
    b(x) = C^T(q, q_dot) q_dot - g(q) - tau_f(q_dot)

(the model terms by the trapezoidal rule; ``tau_k`` the torque that acted over the step:
``torque_timing="held"`` -- the torque reported with sample k+1, the simulator's and an
effort command's zero-order hold -- or ``"sampled"``, the mean of the two samples, a
sensor read at the instants).  The observer ODE ``r_dot = K_O (tau_ext - r)`` is then
integrated exactly over the step::

    r_{k+1} = a r_k + (1 - a) tau_ext_k,      a = exp(-K_O dt)   (per joint)

which is the continuous observer's response to a piecewise-constant external torque:
stable for any gain and step (0 < a < 1), and ``(1 - a) / dt -> K_O`` for small steps,
the continuous law.

Velocity noise reaches ``tau_ext_k`` through the momentum difference, ``M (dv_{k+1} -
dv_k) / dt``: a differenced white noise, so r carries it as ``K_O M`` times a noise whose
power sits at the highest frequencies.  ``filter_gains`` ``K_F`` (> 0, per joint; 0 =
off) passes r through one more first-order low pass, integrated the same way::

    r_f,{k+1} = a_f r_f,k + (1 - a_f) r_{k+1},   a_f = exp(-K_F dt)

(a second-order observer: ``r_f = K_O K_F / ((s + K_O)(s + K_F)) tau_ext``, the added lag
``1 / K_F``); :attr:`MomentumObserver.r` is then ``r_f`` and :attr:`r_raw` the first
stage.  A step longer than ``max_gap`` (a lost stretch of the stream) holds
r and restarts the integration from the new sample (counted in :attr:`gaps`); a step
``dt <= 0`` (an out-of-order or repeated sample) is refused with ``ValueError``, the
state unchanged.  The first sample initialises ``p_0`` (r = 0).

The residual ``f_hat``
    an array given with each sample (the value for the step ending at it: what the node
    takes from ``feedforward/residual``, which the learner predicts from the *reference*
    ``(q_d, qd_d, qdd_d)`` stamped for the instant), or a callable ``f_hat(q, q_dot,
    q_ddot)`` evaluated at every sample with ``q_ddot = (q_dot_k - q_dot_{k-1}) / dt``, the
    measured mean acceleration over the step ending there, and averaged over the step's
    two ends like the model terms (the measured acceleration is the only one a monitor
    has; it carries the contact's own acceleration, so a learner with a strong
    acceleration dependence absorbs a little of a contact: prefer the reference's).

Models
------
:class:`MomentumObserver` takes a :class:`~adaptive_dynamics.dynamics.RobotModel` with
the parameters to use: the URDF's (as loaded), or an estimate -- :func:`observer_model`
builds the model of a full parameter vector ``pi`` (an adaptive controller's
:attr:`~adaptive_dynamics.control.adaptive.AdaptiveController.pi`, non-physical allowed:
pinocchio's algorithms are evaluated linearly in pi), and
:meth:`MomentumObserver.set_parameters` swaps it while running.  An estimate in base
coordinates maps to pi with ``from_base`` (dependent entries zero): that pi has the same
``M(q)``, ``g(q)`` and, M determining the Christoffel C, the same ``C(q, q_dot)`` as any
other pi with the same base parameters, so the observer does not depend on the
representative.  :class:`EstimateLayout` turns the ``adaptive/parameters`` vector
(names + values, base or full coordinates, ``adapted_links`` or not) into that pi.  The
friction columns of an estimate give ``tau_f = f_v q_dot + f_c sgn(q_dot)`` (or
``tanh(q_dot / eps)`` with the model's ``coulomb_smoothing``); ``fixed_friction``, a
:class:`~adaptive_dynamics.dynamics.joint_friction.FrictionModel` beside the estimate (the
adaptive controller's ``friction_model_file``), is added to it.

External wrench
---------------
``tau_ext = J(q)^T F`` for a wrench ``F = [force; moment]`` acting on the robot at a frame
(the environment's wrench on the robot; ``J`` the 6 x n frame Jacobian, pinocchio's
``LOCAL`` -- the frame's axes, moment about its origin -- or ``LOCAL_WORLD_ALIGNED`` --
the base axes, moment about the frame origin).  :func:`wrench_estimate` solves it by
damped least squares, ``F = (J J^T + lambda^2 I)^-1 J r`` computed from the SVD
``J = U S V^T`` as ``U diag(s / (s^2 + lambda^2)) V^T r``, with the damping only near a
singularity (as the backstepping law's ``J#``): ``lambda^2 = damping^2 (1 - (s_min /
threshold)^2)`` below ``threshold``, else 0 (the exact pseudo-inverse).  An arm with fewer
than 6 joints gets the least-norm wrench (only ``min(n, 6)`` directions are observable).

Contact detection: :mod:`.contact`.
"""
from __future__ import annotations

import math
from typing import Callable, Optional, Sequence

import numpy as np
import pinocchio as pin

from ..dynamics.model import RobotModel
from ..validation import as_vector, per_joint

__all__ = ["MomentumObserver", "observer_model", "EstimateLayout", "wrench_estimate", "damped_transpose_pinv",
           "TORQUE_TIMINGS"]

#: how the measured torque of a sample relates to the step before it (module docstring)
TORQUE_TIMINGS = ("held", "sampled")

_REFS = {"local": pin.ReferenceFrame.LOCAL, "local_world_aligned": pin.ReferenceFrame.LOCAL_WORLD_ALIGNED,
         "world": pin.ReferenceFrame.WORLD}


def observer_model(model: RobotModel, pi=None, *, friction: Optional[bool] = None,
                   coulomb_smoothing: Optional[float] = None) -> RobotModel:
    """A private :class:`RobotModel` (same kinematics, gravity, end-effector frame) with the
    full parameters ``pi`` (length of the new model's ``n_params``; ``None``: ``model``'s
    current parameters, friction zero where ``model`` has none).  ``friction`` (None: as
    ``model``) adds or drops the viscous + Coulomb columns; ``pi`` may be non-physical."""
    fr = model.friction if friction is None else bool(friction)
    eps = model.coulomb_smoothing if coulomb_smoothing is None else float(coulomb_smoothing)
    out = RobotModel(model.model, ee_frame=model.ee_frame, friction=fr, coulomb_smoothing=eps,
                     gravity=np.array(model.model.gravity.linear))
    if pi is None:
        src, P = model.parameters, model.n_inertial
        pi = np.zeros(out.n_params)
        pi[:P] = src[:P]
        if model.friction and fr:
            pi[P:] = src[P:]
    out.set_parameters(as_vector(pi, out.n_params, "pi"), check=False)
    return out


def damped_transpose_pinv(J: np.ndarray, *, damping: float = 0.05, threshold: float = 0.05):
    """``(Jt_pinv, s_min, lambda^2)``: the damped pseudo-inverse of ``J^T`` (so that
    ``F = Jt_pinv @ tau`` solves ``J^T F = tau`` by damped least squares; module docstring)."""
    U, S, Vt = np.linalg.svd(np.asarray(J, dtype=float), full_matrices=False)
    s_min = float(S[-1]) if S.size else 0.0
    lam2 = 0.0
    if damping > 0 and s_min < threshold:
        ratio = s_min / threshold
        lam2 = damping * damping * (1.0 - ratio * ratio)
    with np.errstate(divide="ignore", invalid="ignore"):
        w = np.where(S * S + lam2 > 0, S / (S * S + lam2), 0.0)
    return (U * w) @ Vt, s_min, lam2


def wrench_estimate(model: RobotModel, q, tau_ext, *, frame: Optional[str] = None, reference: str = "local",
                    damping: float = 0.05, threshold: float = 0.05) -> np.ndarray:
    """The wrench ``[force; moment]`` at ``frame`` (default the end effector) whose joint
    torques ``J(q)^T F`` best match ``tau_ext`` (damped least squares, module docstring);
    ``reference``: ``"local"`` (the frame's axes, moment about its origin) or
    ``"local_world_aligned"`` (base axes, moment about the frame origin)."""
    if reference not in _REFS:
        raise ValueError(f"reference must be one of {sorted(_REFS)}, got {reference!r}")
    J = model.jacobian(q, frame, reference)
    Jp, _, _ = damped_transpose_pinv(J, damping=damping, threshold=threshold)
    return Jp @ as_vector(tau_ext, model.n, "tau_ext")


class EstimateLayout:
    """The ``adaptive/parameters`` vector of an adaptive controller (element names and
    values) as a full pi of ``model`` (the controller's model: same URDF, ``friction``).

    Recognised (the controller's coordinates, :attr:`AdaptiveController.parameter_names`):

    * base parameters -- the names of ``model.base_parameters(columns=...)`` for the
      controller's ``adapted_links`` (None: every link): ``pi = fixed + from_base(theta)``;
    * full parameters or a subset of them (``projection``, ``base_parameters: false``,
      ``adapted_links``) -- each named entry replaces the nominal one.

    Entries not adapted keep ``nominal`` (default: the model's parameters, the URDF's, as
    the controller holds them).  ``ValueError`` for names that fit neither.
    """

    def __init__(self, model: RobotModel, adapted_links: Optional[Sequence[str]] = None, nominal=None):
        from .adaptive import AdaptiveController   # (no import cycle at module load)
        self.model = model
        self.nominal = np.array(model.parameters if nominal is None else as_vector(nominal, model.n_params,
                                                                                   "nominal"), dtype=float)
        links = [str(x) for x in (adapted_links or []) if str(x)] or None
        _, columns = AdaptiveController._adapted_columns(model, links)
        self.columns = columns
        self.base = model.base_parameters(columns=columns)
        self.fixed = self.nominal.copy()
        if columns is None:
            self.fixed[:] = 0.0
        else:
            self.fixed[columns] = 0.0
        self._base_names = tuple(self.base.names)
        self._full_index = {name: i for i, name in enumerate(model.parameter_names)}

    def to_pi(self, names: Sequence[str], values) -> np.ndarray:
        names = tuple(str(x) for x in names)
        vals = np.asarray(values, dtype=float).reshape(-1)
        if vals.size != len(names):
            raise ValueError(f"{len(names)} names but {vals.size} values")
        if not np.all(np.isfinite(vals)):
            raise ValueError("the estimate is not finite")
        if names == self._base_names:
            return self.fixed + self.base.from_base(vals)
        unknown = [x for x in names if x not in self._full_index]
        if not unknown and len(set(names)) == len(names):
            pi = self.nominal.copy()
            pi[[self._full_index[x] for x in names]] = vals
            return pi
        return self._refuse(names, unknown)

    def _refuse(self, names, unknown):
        if len(names) == len(self._base_names):
            diff = next(i for i, (a, b) in enumerate(zip(names, self._base_names)) if a != b)
            why = f"base parameter {diff} is {names[diff]!r}, expected {self._base_names[diff]!r}"
        else:
            why = (f"{len(names)} names fit neither the {len(self._base_names)} base parameters nor the full"
                   f" parameters (unknown: {list(unknown[:3])})")
        raise ValueError(f"the estimate's names do not match this model ({why}): check the robot, `friction`"
                         " and `adapted_links` against the adaptive controller's")


class MomentumObserver:
    """The generalized-momentum observer of the module docstring.

    Parameters
    ----------
    model:
        :class:`RobotModel` with the parameters to use (a private copy is taken:
        :func:`observer_model`); joint order = model order.
    gains:
        ``K_O`` [1/s]: one value or one per joint (> 0).
    residual:
        Optional callable ``f_hat(q, q_dot, q_ddot) -> n`` (module docstring); a per-sample
        array given to :meth:`update` takes precedence.
    fixed_friction:
        Optional :class:`~adaptive_dynamics.dynamics.joint_friction.FrictionModel` added to
        the model's friction.
    armature:
        Drive inertia reflected to each joint [kg m^2] (scalar or n values), added to M.
    torque_timing:
        ``"held"`` or ``"sampled"`` (:data:`TORQUE_TIMINGS`, module docstring).
    max_gap:
        Longest step [s] integrated; a longer one holds r and restarts.
    filter_gains:
        ``K_F`` [1/s] of the second low pass (module docstring): one value or one per
        joint; 0 (default) = off, r is the first stage.
    residual_mask:
        The joints whose r takes the residual (n booleans; ``None``, default: every
        joint).  The observer is linear in ``f_hat``, so it keeps both estimates at the
        cost of one more low pass: :attr:`r_with_residual` and
        :attr:`r_without_residual`, and :attr:`r` takes each joint's from the mask
        (:meth:`set_residual_mask`; a calibration picks it per joint,
        :func:`~adaptive_dynamics.control.contact.calibrate_residual_joints`).
    """

    def __init__(self, model: RobotModel, gains=50.0, *, residual: Optional[Callable] = None,
                 fixed_friction=None, armature=0.0, torque_timing: str = "held", max_gap: float = 0.1,
                 copy: bool = True, filter_gains=0.0, residual_mask=None):
        self.model = observer_model(model) if copy else model
        self.n = n = self.model.n
        self.joint_names = list(self.model.joint_names)
        self.set_gains(gains)
        self.set_filter_gains(filter_gains)
        self.set_residual_mask(residual_mask)
        self.residual = residual
        self.fixed_friction = fixed_friction
        if fixed_friction is not None and getattr(fixed_friction, "n", n) != n:
            raise ValueError(f"fixed_friction has {fixed_friction.n} joints, the model {n}")
        self.armature = per_joint(armature, n, "armature", one_for_all=True)
        if torque_timing not in TORQUE_TIMINGS:
            raise ValueError(f"torque_timing must be one of {list(TORQUE_TIMINGS)}, got {torque_timing!r}")
        self.torque_timing = torque_timing
        self.max_gap = float(max_gap)
        if not self.max_gap > 0:
            raise ValueError(f"max_gap must be > 0 [s], got {max_gap!r}")
        #: the external-torque estimate r (model order) after the last sample (the second
        #: stage's with ``filter_gains``)
        self.r = np.zeros(n)
        #: the first stage's r (= :attr:`r` without ``filter_gains``)
        self.r_raw = np.zeros(n)
        self._raw2 = np.zeros((2, n))    # first stages: with, without the residual
        self._out2 = np.zeros((2, n))    # second stages (= first stages without filter_gains)
        #: the step's external-torque estimate before the low pass (the last step's)
        self.tau_ext_step = np.zeros(n)
        self.samples = 0
        self.gaps = 0
        self._prev = None   # (t, q, v, p, b, tau) of the last sample

    # ------------------------------------------------------------------ configuration
    def set_gains(self, gains) -> None:
        k = per_joint(gains, self.n, "gains (K_O)", one_for_all=True)
        if not np.all(k > 0):
            raise ValueError(f"gains (K_O) must be > 0 [1/s], got {k.tolist()}")
        self.gains = k

    def set_filter_gains(self, filter_gains) -> None:
        k = per_joint(filter_gains, self.n, "filter_gains (K_F)", one_for_all=True)
        if not np.all(k >= 0):
            raise ValueError(f"filter_gains (K_F) must be >= 0 [1/s] (0 = off), got {k.tolist()}")
        self.filter_gains = k
        self._filtered = bool(np.any(k > 0))

    def set_residual_mask(self, mask) -> None:
        """The joints whose r takes the residual (n booleans, or ``None``: every joint),
        from the next sample on (both estimates run all along: no transient)."""
        if mask is None:
            self.residual_mask = np.ones(self.n, dtype=bool)
            return
        m = np.asarray(mask)
        if m.shape != (self.n,) or not (m.dtype == bool or np.all(np.isin(m, (0, 1)))):
            raise ValueError(f"residual_mask must be {self.n} booleans, got {np.asarray(mask).tolist()!r}")
        self.residual_mask = m.astype(bool)

    @property
    def r_with_residual(self) -> np.ndarray:
        """r with the residual on every joint (the output stage; a copy)."""
        return self._out2[0].copy()

    @property
    def r_without_residual(self) -> np.ndarray:
        """r without the residual on any joint (the output stage; a copy)."""
        return self._out2[1].copy()

    def set_parameters(self, pi) -> None:
        """Use the full parameters ``pi`` (an estimate; non-physical allowed) from the next
        sample on.  The momentum of the last sample is recomputed with them, so the next
        step's momentum difference is that of one model."""
        self.model.set_parameters(as_vector(pi, self.model.n_params, "pi"), check=False)
        if self._prev is not None:
            t, q, v, _p, _b, tau, f = self._prev
            self._prev = (t, q, v, self.momentum(q, v), self._b(q, v), tau, f)

    def reset(self) -> None:
        """Forget the history: the next sample restarts the observer with r = 0."""
        self.r = np.zeros(self.n)
        self.r_raw = np.zeros(self.n)
        self._raw2 = np.zeros((2, self.n))
        self._out2 = np.zeros((2, self.n))
        self.tau_ext_step = np.zeros(self.n)
        self._prev = None

    # ------------------------------------------------------------------ model terms
    def momentum(self, q, v) -> np.ndarray:
        """``p = (M(q) + diag(armature)) q_dot``."""
        return self.model.mass_matrix(q) @ v + self.armature * v

    def friction(self, v) -> np.ndarray:
        tau_f = self.model.friction_torque(v)
        if self.fixed_friction is not None:
            tau_f = tau_f + self.fixed_friction.torque(np.asarray(v, dtype=float)[None, :])[0]
        return tau_f

    def _b(self, q, v) -> np.ndarray:
        """``C^T(q, q_dot) q_dot - g(q) - tau_f(q_dot)``."""
        return self.model.coriolis_matrix(q, v).T @ v - self.model.gravity(q) - self.friction(v)

    # ------------------------------------------------------------------ the observer
    def update(self, t: float, q, v, tau, residual=None) -> np.ndarray:
        """One sample at time ``t`` [s]: positions, velocities, measured torque (model
        order) and optionally the residual for the step ending here; returns r (a copy).
        ``ValueError`` (state unchanged) for a non-finite or misshaped input or ``t`` not
        after the previous sample."""
        n = self.n
        q, v, tau = as_vector(q, n, "q"), as_vector(v, n, "v"), as_vector(tau, n, "tau")
        if residual is not None:
            residual = as_vector(residual, n, "residual")
        t = float(t)
        if not math.isfinite(t):
            raise ValueError(f"t must be finite, got {t!r}")
        prev = self._prev
        if prev is not None and not t > prev[0]:
            raise ValueError(f"sample at t = {t!r} s is not after the previous one ({prev[0]!r} s)")
        p, b = self.momentum(q, v), self._b(q, v)
        if prev is None:
            self._prev = (t, q.copy(), v.copy(), p, b, tau.copy(), None)
            self.samples += 1
            return self.r.copy()
        t0, q0, v0, p0, b0, tau0, f0 = prev
        dt = t - t0
        f = None
        if dt > self.max_gap:
            self.gaps += 1
        else:
            if residual is None and self.residual is not None:
                f = as_vector(self.residual(q, v, (v - v0) / dt), n, "residual (callable)")
                residual = f if f0 is None else 0.5 * (f0 + f)
            tau_step = tau if self.torque_timing == "held" else 0.5 * (tau + tau0)
            ext0 = (p - p0) / dt - tau_step - 0.5 * (b0 + b)
            ext = ext0 + residual if residual is not None else ext0
            a = np.exp(-self.gains * dt)
            raw2, out2 = self._raw2, self._out2
            raw2[0] = a * raw2[0] + (1.0 - a) * ext
            raw2[1] = a * raw2[1] + (1.0 - a) * ext0
            if self._filtered:   # K_F = 0 on a joint: a_f = 0, r = r_raw there
                af = np.where(self.filter_gains > 0, np.exp(-self.filter_gains * dt), 0.0)
                out2[:] = af * out2 + (1.0 - af) * raw2
            else:
                out2[:] = raw2
            mask = self.residual_mask
            self.r_raw = np.where(mask, raw2[0], raw2[1])
            self.r = np.where(mask, out2[0], out2[1])
            self.tau_ext_step = np.where(mask, ext, ext0)
        self._prev = (t, q.copy(), v.copy(), p, b, tau.copy(), f)
        self.samples += 1
        return self.r.copy()

    def run(self, T, Q, V, TAU, residuals=None) -> np.ndarray:
        """:meth:`update` over K samples (rows); returns the K x n residuals."""
        out = np.empty((len(T), self.n))
        for k in range(len(T)):
            out[k] = self.update(T[k], Q[k], V[k], TAU[k], None if residuals is None else residuals[k])
        return out

    def wrench(self, q, *, frame: Optional[str] = None, reference: str = "local", damping: float = 0.05,
               threshold: float = 0.05) -> np.ndarray:
        """:func:`wrench_estimate` of the current r at ``q``."""
        return wrench_estimate(self.model, q, self.r, frame=frame, reference=reference, damping=damping,
                               threshold=threshold)

    def diagnostics(self) -> dict:
        return {"samples": self.samples, "gaps": self.gaps,
                "max_abs_external_torque": float(np.abs(self.r).max()) if self.n else 0.0}

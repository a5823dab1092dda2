"""MujocoPlant: the simulated "real robot" the controllers are tested against.

No ROS import: the ``mujoco_bridge`` node is a thin shell over this module (it owns
timing -- real-time or lockstep --, message conversion, logging and diagnostics; the
core here only steps).

The plant is built by :func:`adaptive_dynamics.sim.mujoco_model.load_mujoco_model` from
the *same* URDF the controller's pinocchio model uses, so with ``RealityConfig()`` (all
defaults, "reality off") its rigid-body dynamics equal pinocchio's.  Everything the
controller's model does not know is injected on purpose from :class:`RealityConfig`:

* joint friction: viscous ``f_v * v`` + smooth Coulomb ``f_c * tanh(v / eps)``;
* joint effects outside the rigid-body + viscous/Coulomb model class (off by default):
  Stribeck friction ``f_s exp(-(v/v_s)^2) tanh(v / eps)`` (break-away above the
  Coulomb level) and a position ripple ``a sin(N q)`` (gear / cogging torque), so an
  identified rigid-body model is not exact, as on a real arm;
* an unknown payload (mass, CoM, inertia) rigidly attached to a link frame
  (default: the robot's end-effector frame), switchable at run time
  (:meth:`MujocoPlant.set_payload_enabled`: the pick-and-place "sudden dynamics change");
* per-link scaling of mass and inertia (CoM unchanged);
* sensor noise on the reported q, q_dot and measured torque, and a torque-sensor bias.

And what the environment does to the robot: scripted external forces (:class:`ExternalPush`,
:meth:`MujocoPlant.add_push`: a force at a point of a link, for a while), applied as the
joint torques ``J(q)^T F`` they cause and reported (:attr:`MujocoPlant.external_torque`),
the truth a contact detector is checked against.

Design choices (see :class:`MujocoPlant` for the precise definitions):

Coulomb friction
    An explicit smooth torque ``-f_c tanh(v / eps)`` (``eps = coulomb_smoothing``), not
    MuJoCo's ``frictionloss`` constraint.  Reason: it is a known, deterministic function
    of the state, so the friction torque can be checked exactly (``tau - M a - C v - g``
    from the true state and MuJoCo's acceleration equals ``f_v v + f_c tanh(v/eps)`` to
    machine precision), it has the same structure as the controller-side model
    (``RobotModel(coulomb_smoothing=eps)``), and it does not depend on constraint-solver
    settings (``frictionloss`` is a soft constraint whose force below the break-away
    velocity depends on ``solref``/``solimp``).  The price of a smooth model is that a
    joint under a constant torque smaller than ``f_c`` creeps with ``v ~ eps * tau / f_c``
    instead of sticking; keep ``eps`` small (default 0.01 rad/s).
    The steep slope ``f_c / eps`` near ``v = 0`` would make an explicit integrator
    unstable, so with the implicit integrators the friction is *linearised*:
    ``dof_damping`` is set to ``f_v + f_c (1 - tanh^2(v_k/eps)) / eps`` for the step and
    ``qfrc_applied`` carries the rest, so the acceleration MuJoCo computes is exactly
    that of the nonlinear model at ``v_k``, while its implicit velocity update uses the
    friction's full velocity derivative (linearly-implicit Euler, unconditionally stable
    for any ``eps``).  With RK4 (explicit) the viscous part stays in ``dof_damping`` and
    the Coulomb torque is held constant over the step (zero-order hold).

Integrator
    ``"implicitfast"`` (default): semi-implicit Euler whose velocity update treats the
    joint damping (here: viscous + linearised Coulomb friction) implicitly; Coriolis
    derivatives are skipped (cheap, and exact forward dynamics at each step start).
    ``"euler"`` behaves the same for this plant (MuJoCo's Euler also integrates damping
    implicitly), ``"implicit"`` additionally linearises the Coriolis forces, ``"rk4"``
    is explicit 4th-order Runge-Kutta (more accurate per step, no implicit friction).

External forces
    A push is a force ``F`` [N] at a point of a link (an offset in the link's frame),
    along a direction given in the world's or the link's axes.  At the start of each step
    the points and directions are evaluated at the current position and every active
    push adds ``J_p(q)^T F`` to the joint torques (``mj_applyFT``: the point's
    translational Jacobian, so a force at a point off the link's centre of mass carries
    its moment), held over the step like the actuator torque.  The measured torque does
    not contain it (the sensor measures the actuator, not the environment): it is what a
    momentum observer finds from the motion, :attr:`MujocoPlant.external_torque` the
    truth for the step that ended at the last :meth:`MujocoPlant.state`.

Measured torque
    ``tau_measured`` is the torque the *actuator delivers to the joint* over the step:
    the commanded torque clipped to the URDF effort limits, plus the configured sensor
    bias and Gaussian noise.  Friction is neither subtracted nor added: the sensor sits
    on the motor side of the joint friction (like a motor-current based torque estimate,
    or ros2_control's effort state interface of a simulated joint).  Hence, noise-free,
    ``tau_measured = M(q) a + C(q, v) v + g(q) + payload terms + f_v v + f_c tanh(v/eps)``
    with the TRUE dynamics: everything a learner must explain, friction included, is in
    the measurement.  (Franka's and KUKA's link-side sensors would report this minus the
    joint friction; we chose the motor side so that friction, a main source of model
    mismatch, is observable for the learners.)
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import mujoco
import numpy as np

from adaptive_dynamics.dynamics.continuous import unbind_continuous
from adaptive_dynamics.dynamics.effort_check import describe, over_limit, range_poses, worst_torques
from adaptive_dynamics.dynamics.inertial import from_mass_com_inertia
from adaptive_dynamics.robots import default_ee_frame, end_effector_links, robot_config, strip_inertials, urdf_path
from ..validation import per_joint
from .mujoco_model import joint_indices, load_mujoco_model

__all__ = ["RealityConfig", "MujocoPlant", "SimulationDiverged", "INTEGRATORS", "SAFE_MODES",
           "PARAMETER_DESCRIPTIONS", "ExternalPush", "PUSH_FRAMES", "push_schedule"]

ArrayLike = Union[float, Sequence[float], np.ndarray]

INTEGRATORS = {
    "implicitfast": mujoco.mjtIntegrator.mjINT_IMPLICITFAST,
    "implicit": mujoco.mjtIntegrator.mjINT_IMPLICIT,
    "euler": mujoco.mjtIntegrator.mjINT_EULER,
    "rk4": mujoco.mjtIntegrator.mjINT_RK4,
}

#: safe behaviours for a stale/malformed command (``safe_torque`` modes)
SAFE_MODES = ("damp", "hold")
_SAFE_ALIASES = {"damp": "damp", "damping": "damp", "zero": "damp", "zero_damping": "damp",
                 "zero_torque": "damp", "hold": "hold"}

_DEFAULT_PAYLOAD_RADIUS = 0.02  # [m] radius of the default solid-sphere payload inertia


class SimulationDiverged(RuntimeError):
    """MuJoCo flagged a non-finite / huge state or acceleration (it resets the state)."""


# ----------------------------------------------------------------------------- config

# name -> description, for the bridge node's ParameterDescriptors (flat, snake_case
# names of config/<robot>.yaml's ``mujoco_bridge`` section).
PARAMETER_DESCRIPTIONS: Dict[str, str] = {
    "friction_viscous": "Viscous joint friction f_v [N m s/rad], one per joint (or a scalar): tau_f = f_v v.",
    "friction_coulomb": "Coulomb joint friction f_c [N m], one per joint (or a scalar): tau_f = f_c tanh(v/eps).",
    "coulomb_smoothing": "Velocity scale eps [rad/s] of the smooth Coulomb term tanh(v/eps); > 0.",
    "friction_stribeck": "Stribeck friction f_s [N m] above the Coulomb level at rest, one per joint (or a scalar):"
                         " tau_f = f_s exp(-(v/v_s)^2) tanh(v/eps); not in the rigid-body model class.",
    "stribeck_velocity": "Stribeck velocity v_s [rad/s] of friction_stribeck; > 0.",
    "ripple_amplitude": "Position ripple a [N m] (gear / cogging torque), one per joint (or a scalar):"
                        " tau_f = a sin(N q); not in the rigid-body model class.",
    "ripple_periods": "Periods N of the position ripple per radian of joint travel; > 0.",
    "payload_mass": "Payload mass [kg] (0 = no payload).",
    "payload_com": "Payload centre of mass [m], 3 values in the payload_frame's axes.",
    "payload_inertia": "Payload inertia about its CoM [kg m^2] in payload_frame axes: [] = solid sphere of "
                       "radius 0.02 m; 3 values = diagonal; 6 = ixx ixy ixz iyy iyz izz (URDF order); 9 = 3x3 "
                       "row-major.",
    "payload_frame": "Link (URDF link = MuJoCo body) carrying the payload; '' = the robot's end-effector frame.",
    "payload_enabled": "Whether the payload is attached at start (toggle at run time).",
    "link_scale": "Scale factor of every link's mass and inertia (CoM kept); per link: link_scale.<link_name>.",
    "noise_std_q": "Std dev of Gaussian noise on the reported joint positions [rad] (scalar or per joint).",
    "noise_std_v": "Std dev of Gaussian noise on the reported joint velocities [rad/s] (scalar or per joint).",
    "noise_std_tau": "Std dev of Gaussian noise on the measured joint torque [N m] (scalar or per joint).",
    "tau_bias": "Constant torque-sensor bias [N m] added to the measured torque (scalar or per joint).",
    "seed": "Seed of the sensor-noise generator (same seed + same commands = identical run); < 0 = random.",
    "armature": "Drive (rotor) inertia reflected to the joint [kg m^2], one per joint (or a scalar): MuJoCo's"
                " dof_armature, added to M_jj; on the motor side, like the friction.",
}
_REALITY_PREFIXES = ("friction_", "coulomb_", "stribeck_", "ripple_", "payload_", "noise_", "link_scale",
                     "tau_bias", "armature")
#: the graph's model parameters in ``/**`` that look like reality ones (the models' shape, not the plant's)
_MODEL_KEYS = ("friction_smoothing",)


@dataclass
class RealityConfig:
    """What the real robot has and the controller's model never sees.

    All per-joint quantities are a scalar (same value for every joint) or one value per
    joint in the plant's joint order.

    Attributes
    ----------
    friction_viscous:
        Viscous friction coefficients f_v [N m s/rad] (>= 0).
    friction_coulomb:
        Coulomb friction levels f_c [N m] (>= 0).
    coulomb_smoothing:
        eps [rad/s] of the smooth Coulomb model ``f_c tanh(v / eps)`` (> 0).
    friction_stribeck, stribeck_velocity:
        Stribeck friction f_s [N m] (>= 0) and its velocity v_s [rad/s] (> 0):
        ``f_s exp(-(v / v_s)^2) tanh(v / eps)``, the break-away torque above the Coulomb
        level that fades with speed.
    ripple_amplitude, ripple_periods:
        Position ripple a [N m] (>= 0) and its periods per radian N (> 0): a joint
        torque ``a sin(N q)`` opposing the drive (gear meshing, cogging).
    payload_mass:
        Payload mass [kg] (>= 0; 0 = no payload).
    payload_com:
        Payload centre of mass [m] in ``payload_frame`` coordinates.
    payload_inertia:
        Payload inertia about its CoM [kg m^2], in ``payload_frame`` axes: ``None`` =
        a solid sphere of radius 0.02 m (``0.4 m r^2 I``); 3 values = diagonal; 6 values
        = ``ixx ixy ixz iyy iyz izz`` (URDF order); 9 values or 3x3 = full matrix.
    payload_frame:
        URDF link (= MuJoCo body) carrying the payload; ``None``/``""`` = the robot's
        end-effector frame (``ee_frame`` of ``config/<robot>.yaml``, else the last
        frame of the URDF, as :class:`RobotModel` does).
    payload_enabled:
        Whether the payload is attached when the plant starts.
    link_scale:
        Factor applied to a link's mass and inertia tensor (CoM unchanged): a scalar for
        every link, or a mapping ``{link_name: factor}`` (key ``"*"`` = the factor of
        every link not listed, default 1).  Link names are URDF link names.
    noise_std_q, noise_std_v, noise_std_tau:
        Standard deviations of the zero-mean Gaussian noise added to the *reported*
        q [rad], q_dot [rad/s] and measured torque [N m] (a fresh sample each step).
    tau_bias:
        Constant bias [N m] added to the measured torque.
    armature:
        Drive inertia reflected to each joint [kg m^2] (>= 0; rotor inertia times the
        gear ratio squared), MuJoCo's ``dof_armature``: the plant's joint-space inertia is
        ``M(q) + diag(armature)``.  URDFs carry none; :func:`adaptive_dynamics.control.gains
        .default_armature` is the rule the generated parameter files state.  It acts on the
        motor side of the torque measurement, like the friction.
    seed:
        Seed of the noise generator (``numpy.random.default_rng``); ``None`` or a
        negative value = fresh OS entropy (not reproducible).
    """

    friction_viscous: ArrayLike = 0.0
    friction_coulomb: ArrayLike = 0.0
    coulomb_smoothing: float = 0.01
    friction_stribeck: ArrayLike = 0.0
    stribeck_velocity: float = 0.1
    ripple_amplitude: ArrayLike = 0.0
    ripple_periods: float = 10.0
    payload_mass: float = 0.0
    payload_com: Sequence[float] = (0.0, 0.0, 0.0)
    payload_inertia: Optional[ArrayLike] = None
    payload_frame: Optional[str] = None
    payload_enabled: bool = False
    link_scale: Union[float, Mapping[str, float]] = 1.0
    noise_std_q: ArrayLike = 0.0
    noise_std_v: ArrayLike = 0.0
    noise_std_tau: ArrayLike = 0.0
    tau_bias: ArrayLike = 0.0
    seed: Optional[int] = 0
    armature: ArrayLike = 0.0

    PARAMETERS = PARAMETER_DESCRIPTIONS  # class attribute (not a dataclass field: no annotation)

    @classmethod
    def from_node_parameters(cls, p: Mapping[str, Any]) -> "RealityConfig":
        """Build from the ``mujoco_bridge`` node's parameters as declared (lists of one
        value meaning "every joint", ``link_scales`` as ``"link:factor"`` strings,
        ``payload_inertia: [0.0]`` meaning "default")."""
        def one_or_n(values):
            arr = list(values)
            return arr[0] if len(arr) == 1 else arr
        scales: dict = {"*": float(p["link_scale"])}
        for item in p["link_scales"]:
            if item:
                link, _, factor = item.partition(":")
                scales[link.strip()] = float(factor)
        inertia = list(p["payload_inertia"])
        return cls.from_params({
            "friction_viscous": one_or_n(p["friction_viscous"]),
            "friction_coulomb": one_or_n(p["friction_coulomb"]),
            "coulomb_smoothing": p["coulomb_smoothing"],
            "friction_stribeck": one_or_n(p["friction_stribeck"]), "stribeck_velocity": p["stribeck_velocity"],
            "ripple_amplitude": one_or_n(p["ripple_amplitude"]), "ripple_periods": p["ripple_periods"],
            "payload_mass": p["payload_mass"], "payload_com": list(p["payload_com"]),
            "payload_inertia": [] if inertia in ([], [0.0]) else inertia,
            "payload_frame": p["payload_frame"], "payload_enabled": p["payload_enabled"],
            "link_scale": scales if len(scales) > 1 else scales["*"],
            "noise_std_q": one_or_n(p["noise_std_q"]), "noise_std_v": one_or_n(p["noise_std_v"]),
            "noise_std_tau": one_or_n(p["noise_std_tau"]), "tau_bias": one_or_n(p["tau_bias"]),
            "seed": int(p["seed"]), "armature": one_or_n(p["armature"]),
        })

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> "RealityConfig":
        """Build from the flat parameters of the ``mujoco_bridge`` section.

        ``params`` is e.g. :func:`adaptive_dynamics.robots.robot_config` (the ``/**``
        and ``mujoco_bridge`` ``ros__parameters`` merged) or the node's parameter dict.
        Names are those of :attr:`PARAMETERS`; per-link scales come either as
        ``link_scale.<link>`` keys (how ROS 2 flattens a nested YAML mapping), or as a
        nested mapping under ``link_scale``.  Keys of other nodes/purposes are ignored,
        but a key that looks like a reality parameter and is unknown (a typo such as
        ``payload_mas``) raises ``ValueError``.  ROS-friendly empty values: ``[]`` for
        ``payload_inertia`` and ``""`` for ``payload_frame`` mean "default".
        """
        known = set(PARAMETER_DESCRIPTIONS)
        kwargs: Dict[str, Any] = {}
        per_link: Dict[str, float] = {}
        for key, value in params.items():
            if key.startswith("link_scale."):
                per_link[key[len("link_scale."):]] = _as_float(value, key)
                continue
            if key not in known:
                if key.startswith(_REALITY_PREFIXES) and key not in _MODEL_KEYS:
                    raise ValueError(f"unknown reality parameter {key!r}; known: {sorted(known)}")
                continue
            kwargs[key] = value
        if "link_scale" in kwargs:
            ls = kwargs["link_scale"]
            if isinstance(ls, Mapping):
                per_link.update({str(k): _as_float(v, f"link_scale.{k}") for k, v in ls.items()})
                del kwargs["link_scale"]
            else:
                kwargs["link_scale"] = _as_float(ls, "link_scale")
        if per_link:
            default = kwargs.pop("link_scale", None)
            if default is not None and default != 1.0:
                per_link.setdefault("*", default)
            kwargs["link_scale"] = per_link
        if "payload_inertia" in kwargs and _is_empty(kwargs["payload_inertia"]):
            kwargs["payload_inertia"] = None
        if "payload_frame" in kwargs and not kwargs["payload_frame"]:
            kwargs["payload_frame"] = None
        if "seed" in kwargs:
            kwargs["seed"] = None if kwargs["seed"] is None else int(kwargs["seed"])
        if "payload_enabled" in kwargs:
            kwargs["payload_enabled"] = _as_bool(kwargs["payload_enabled"], "payload_enabled")
        for key in ("coulomb_smoothing", "stribeck_velocity", "ripple_periods", "payload_mass"):
            if key in kwargs:
                kwargs[key] = _as_float(kwargs[key], key)
        return cls(**kwargs)

    @classmethod
    def for_robot(cls, name: str) -> "RealityConfig":
        """The reality of ``config/<name>.yaml`` (its ``mujoco_bridge`` section)."""

        return cls.from_params(robot_config(name))

    def to_params(self) -> Dict[str, Any]:
        """Flat parameter dict (inverse of :meth:`from_params`, ROS-friendly values)."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "link_scale" and isinstance(value, Mapping):
                for link, s in value.items():
                    if link == "*":
                        out["link_scale"] = float(s)
                    else:
                        out[f"link_scale.{link}"] = float(s)
                continue
            if f.name == "payload_inertia" and value is None:
                value = []
            if f.name == "payload_frame" and value is None:
                value = ""
            if f.name == "seed" and value is None:
                value = -1
            if isinstance(value, np.ndarray):
                value = value.tolist()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


def _is_empty(value) -> bool:
    if value is None:
        return True
    try:
        return len(value) == 0
    except TypeError:
        return False


def _as_float(value, what: str) -> float:
    try:
        out = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(out):
        raise ValueError(f"{what} must be finite, got {value!r}")
    return out


def _as_bool(value, what: str) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{what} must be a boolean, got {value!r}")


def _inertia_3x3(value, mass: float) -> np.ndarray:
    if _is_empty(value):
        return 0.4 * mass * _DEFAULT_PAYLOAD_RADIUS ** 2 * np.eye(3)
    arr = np.asarray(value, dtype=float)
    if arr.size == 3:
        I = np.diag(arr.reshape(3))
    elif arr.size == 6:
        ixx, ixy, ixz, iyy, iyz, izz = arr.reshape(6)
        I = np.array([[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]])
    elif arr.size == 9:
        I = arr.reshape(3, 3)
    else:
        raise ValueError(f"payload_inertia: expected 0, 3, 6 or 9 values, got {arr.size}")
    if not np.all(np.isfinite(I)) or not np.allclose(I, I.T, rtol=0, atol=1e-12):
        raise ValueError(f"payload_inertia must be a finite symmetric matrix, got {I.tolist()}")
    I = 0.5 * (I + I.T)
    ev = np.linalg.eigvalsh(I)
    if ev.min() < -1e-12 or ev[0] + ev[1] < ev[2] * (1 - 1e-9) - 1e-12:
        raise ValueError(f"payload_inertia is not physical (eigenvalues {ev.tolist()} must be >= 0 "
                         "and satisfy the triangle inequality)")
    return I


# ----------------------------------------------------------------------------- rigid body helpers

def _quat_to_mat(quat) -> np.ndarray:
    R = np.empty(9)
    mujoco.mju_quat2Mat(R, np.asarray(quat, dtype=float))
    return R.reshape(3, 3)


def _mat_to_quat(R) -> np.ndarray:
    q = np.empty(4)
    mujoco.mju_mat2Quat(q, np.ascontiguousarray(R, dtype=float).reshape(9))
    return q


def _body_to_spatial(mass, ipos, iquat, inertia_diag):
    """(m, m c, I about the body origin) in body coordinates."""
    R = _quat_to_mat(iquat)
    Ic = R @ np.diag(inertia_diag) @ R.T
    c = np.asarray(ipos, dtype=float)
    Io = Ic + mass * (c @ c * np.eye(3) - np.outer(c, c))
    return float(mass), mass * c, Io


def _spatial_to_body(mass, h, Io):
    """Inverse of :func:`_body_to_spatial`: (mass, ipos, iquat, inertia_diag)."""
    if mass <= 0:
        return 0.0, np.zeros(3), np.array([1.0, 0, 0, 0]), np.zeros(3)
    c = h / mass
    Ic = Io - mass * (c @ c * np.eye(3) - np.outer(c, c))
    Ic = 0.5 * (Ic + Ic.T)
    ev, V = np.linalg.eigh(Ic)
    if np.linalg.det(V) < 0:
        V[:, 0] = -V[:, 0]
    ev = np.maximum(ev, 0.0)
    return float(mass), c, _mat_to_quat(V), ev


# ----------------------------------------------------------------------------- external forces

#: the axes a push's direction is given in
PUSH_FRAMES = ("world", "link")


@dataclass(frozen=True)
class ExternalPush:
    """A scripted external force on the robot: ``magnitude`` [N] along the unit vector
    ``direction`` (in the world's axes, ``frame="world"``, or the link's, ``"link"``) at
    the point ``point`` [m] of ``link`` (an offset in the link's frame; a URDF link =
    MuJoCo body), from sim time ``start`` [s] for ``duration`` [s] (``inf``: until
    :meth:`MujocoPlant.clear_pushes`).  Active on the steps starting in
    ``[start, start + duration)`` (to half a step: a duration of k steps acts on k steps).
    Build it through :meth:`MujocoPlant.add_push` (which checks the link)."""

    link: str
    direction: Tuple[float, float, float]
    magnitude: float
    point: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    frame: str = "world"
    start: float = 0.0
    duration: float = math.inf

    def __post_init__(self):
        d = _vec3(self.direction, "push direction")
        norm = float(np.linalg.norm(d))
        if not norm > 0:
            raise ValueError(f"push direction must be a non-zero 3-vector, got {list(self.direction)}")
        object.__setattr__(self, "direction", tuple(float(x) for x in d / norm))
        object.__setattr__(self, "point", tuple(float(x) for x in _vec3(self.point, "push point")))
        if self.frame not in PUSH_FRAMES:
            raise ValueError(f"push frame must be one of {list(PUSH_FRAMES)}, got {self.frame!r}")
        mag = _as_float(self.magnitude, "push magnitude")
        if mag < 0:
            raise ValueError(f"push magnitude must be >= 0 [N], got {mag!r}")
        object.__setattr__(self, "magnitude", mag)
        object.__setattr__(self, "start", _as_float(self.start, "push start"))
        dur = float(self.duration)
        if not dur > 0 or math.isnan(dur):
            raise ValueError(f"push duration must be > 0 [s], got {self.duration!r}")
        object.__setattr__(self, "duration", dur)

    @property
    def end(self) -> float:
        return self.start + self.duration

    def active(self, t: float, dt: float) -> bool:
        """Acts on the step starting at ``t`` (step ``dt``)."""
        h = 0.5 * dt
        return self.start - h <= t < self.end - h

    def force(self, R_link=None) -> np.ndarray:
        """The force [N] in world axes (``R_link``: the link's orientation, for ``frame="link"``)."""
        d = np.asarray(self.direction)
        if self.frame == "link":
            d = np.asarray(R_link, dtype=float).reshape(3, 3) @ d
        return self.magnitude * d

    def describe(self) -> str:
        def r(v):
            return [round(float(x), 4) for x in v]
        return (f"{self.magnitude:g} N along {r(self.direction)} ({self.frame} axes) at {r(self.point)} m on"
                f" {self.link}, t = {self.start:g} s"
                + ("" if math.isinf(self.duration) else f" for {self.duration:g} s"))


def _vec3(value, what: str) -> np.ndarray:
    try:
        v = np.asarray(value, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be 3 numbers, got {value!r}") from None
    if v.shape != (3,) or not np.all(np.isfinite(v)):
        raise ValueError(f"{what} must be 3 finite numbers, got {list(np.atleast_1d(value))}")
    return v


def push_schedule(links: Sequence[str], directions, magnitudes, starts, durations, points=(),
                  frames=("world",)) -> list:
    """The pushes of parallel lists, as the ``mujoco_bridge`` parameters give them:
    ``links`` (N names; ``[]`` or ``[""]`` = none), ``directions`` (3N numbers),
    ``magnitudes`` [N] and ``durations`` [s] (1 value for every push or N), ``starts`` [sim s]
    (N), ``points`` (3N numbers, or ``[]`` / ``[0.0]``: every push at its link's origin),
    ``frames`` (1 or N of :data:`PUSH_FRAMES`).  ``ValueError`` naming the list whose
    length or value is wrong.  (The links are checked by :meth:`MujocoPlant.add_push`.)"""
    links = [str(x) for x in links]
    if links in ([], [""]):
        return []
    n = len(links)
    if any(not x for x in links):
        raise ValueError(f"push_links: an empty link name among {links} (name every push's link)")

    def lengths(values, what, per, *, one=True, empty=None):
        vals = list(np.asarray(values, dtype=object).reshape(-1)) if not isinstance(values, (list, tuple)) \
            else list(values)
        if empty is not None and (vals == [] or vals == [0.0]):
            return [empty] * n
        if one and len(vals) == per:
            return [vals] * n if per > 1 else vals * n
        if len(vals) != per * n:
            opts = f"{per} (every push) or {per * n}" if one else f"{per * n}"
            raise ValueError(f"{what}: {len(vals)} values for {n} pushes ({links}); expected {opts}"
                             + (f" ({per} per push)" if per > 1 else ""))
        return [vals[i * per:(i + 1) * per] for i in range(n)] if per > 1 else vals

    dirs = lengths(directions, "push_directions", 3, one=False)
    mags = lengths(magnitudes, "push_magnitudes", 1)
    st = lengths(starts, "push_starts", 1, one=False)
    durs = lengths(durations, "push_durations", 1)
    pts = lengths(points, "push_points", 3, one=False, empty=(0.0, 0.0, 0.0))
    frs = lengths(frames, "push_frames", 1)
    out = []
    for i in range(n):
        try:
            out.append(ExternalPush(links[i], tuple(dirs[i]), mags[i], tuple(pts[i]), str(frs[i]), st[i], durs[i]))
        except ValueError as exc:
            raise ValueError(f"push {i} ({links[i]}): {exc}") from None
    return out


# ----------------------------------------------------------------------------- the plant

class MujocoPlant:
    """A MuJoCo simulation of the robot with injected "reality" (no ROS).

    Parameters
    ----------
    robot:
        A robot name of :mod:`adaptive_dynamics.robots` (``"panda"``, ``"iiwa14"``,
        ``"planar2"``) or a URDF file path.
    joint_names:
        Order of every per-joint array this class takes and returns (commands, state,
        reality parameters).  ``None`` = the URDF/pinocchio chain order; otherwise a
        permutation of the model's joints (matched by name; ``ValueError`` names missing
        or unknown joints).
    reality:
        The injected model mismatch and sensor model (:class:`RealityConfig`; default:
        none, i.e. the plant equals the controller's nominal model).
    timestep:
        Simulation step [s] (> 0).  One :meth:`step` advances exactly this much.
    integrator:
        ``"implicitfast"`` (default), ``"implicit"``, ``"euler"`` or ``"rk4"`` (see the
        module docstring for how friction is integrated by each).
    q0:
        Initial (and default :meth:`reset`) joint positions [rad]; ``None`` = the middle
        of the URDF position limits.

    Definitions (what :meth:`state` reports)
    ----------------------------------------
    ``tau_applied`` (:attr:`applied_torque`)
        The actuator torque applied during the last step: the commanded torque clipped
        to the URDF effort limits ``[-effort, +effort]`` per joint.
    ``tau_measured``
        ``tau_applied + tau_bias + noise_tau``: the joint torque the actuator delivers,
        measured on the motor side of the joint friction, i.e. friction is NOT
        subtracted: without noise and bias ``tau_measured = M a + C v + g + tau_friction``
        of the true robot (payload, link scaling included).
    ``q``, ``v`` reported
        True state after the step + Gaussian noise (a fresh sample per step; calling
        :meth:`state` twice between two steps returns the same values).
    ``tau_friction``
        ``f_v v + f_c tanh(v / eps)`` at the true velocity at the *start* of the step
        (what resists the motion; the acceleration MuJoCo computes is
        ``M^-1 (tau_applied - C v - g - tau_friction)``).

    Counters (for the node's diagnostics): :attr:`saturation_count` (per joint, steps
    whose command exceeded the effort limit), :attr:`rejected_commands` (commands that
    :meth:`step` refused), :attr:`safe_steps` (steps taken by :meth:`step_safe`),
    :attr:`steps`.
    """

    def __init__(self, robot: Union[str, os.PathLike] = "panda", joint_names: Optional[Sequence[str]] = None,
                 reality: Optional[RealityConfig] = None, timestep: float = 1e-3,
                 integrator: str = "implicitfast", q0: Optional[ArrayLike] = None, end_effector: str = "hand"):
        import pinocchio as pin  # limits and joint order come from the same URDF parse as RobotModel's


        self.reality = reality if reality is not None else RealityConfig()
        if not isinstance(self.reality, RealityConfig):
            raise ValueError(f"reality must be a RealityConfig, got {type(self.reality).__name__}")
        robot_s = os.fspath(robot)
        self.urdf = urdf_path(robot_s)
        ee_default = default_ee_frame(robot_s)
        with open(self.urdf, encoding="utf-8") as fh:
            pm = pin.buildModelFromXML(unbind_continuous(fh.read())[0])   # a continuous joint: one angle
        if ee_default is None:
            ee_default = pm.frames[pm.nframes - 1].name
        self.ee_frame: str = ee_default

        model_joints = [pm.names[j] for j in range(1, pm.njoints)]
        if joint_names is None:
            names = list(model_joints)
        else:
            names = [str(j) for j in joint_names]
            missing = [j for j in model_joints if j not in names]
            extra = [j for j in names if j not in model_joints]
            if missing or extra or len(set(names)) != len(names):
                raise ValueError(f"joint_names do not match the URDF: missing {missing}, unknown {extra}, "
                                 f"duplicates {len(names) - len(set(names))}; URDF joints: {model_joints}")
        self.joint_names = names
        self.n = len(names)
        pin_idx = np.array([pm.joints[pm.getJointId(j)].idx_v for j in names])
        self.effort_limit = np.array(pm.effortLimit, dtype=float)[pin_idx]
        self.velocity_limit = np.array(pm.velocityLimit, dtype=float)[pin_idx]
        self.lower = np.array(pm.lowerPositionLimit, dtype=float)[pin_idx]
        self.upper = np.array(pm.upperPositionLimit, dtype=float)[pin_idx]
        if not np.all(self.effort_limit > 0):
            bad = [j for j, e in zip(names, self.effort_limit) if not e > 0]
            raise ValueError(f"{self.urdf}: joints {bad} have no effort limit (<limit effort=...>): the simulator"
                             " saturates commands at it")
        for j in names:
            jid = pm.getJointId(j)
            if not pm.inertias[jid].mass > 0:
                link = next((f.name for f in pm.frames if f.parentJoint == jid and f.type == pin.FrameType.BODY), j)
                raise ValueError(f"{self.urdf}: link {link!r} (moved by joint {j!r}) has no mass: the simulator"
                                 " needs <inertial> for every moving link")

        if integrator not in INTEGRATORS:
            raise ValueError(f"integrator must be one of {sorted(INTEGRATORS)}, got {integrator!r}")
        self.integrator = integrator
        self.timestep = float(timestep)
        if end_effector not in ("hand", "none"):
            raise ValueError(f"end_effector must be 'hand' or 'none', got {end_effector!r}")
        self.end_effector = end_effector
        source = self.urdf
        if end_effector == "none":       # the arm without the bodies the URDF fixes after its last joint
            with open(self.urdf, encoding="utf-8") as fh:
                text = fh.read()
            source = strip_inertials(text, end_effector_links(text, pm))
        self.model = load_mujoco_model(source, timestep=self.timestep)
        self.model.opt.integrator = int(INTEGRATORS[integrator])
        if self.model.nv != self.n:
            raise ValueError(f"MuJoCo model has {self.model.nv} DoF, the URDF {self.n} joints")
        self._qi, self._di = joint_indices(self.model, names)
        self.data = mujoco.MjData(self.model)
        self._scratch = mujoco.MjData(self.model)
        self._qfrc = np.zeros(self.model.nv)

        # ---- reality: friction, sensors
        r = self.reality
        n = self.n
        self.friction_viscous = per_joint(r.friction_viscous, n, "friction_viscous")
        self.friction_coulomb = per_joint(r.friction_coulomb, n, "friction_coulomb")
        self.coulomb_smoothing = _as_float(r.coulomb_smoothing, "coulomb_smoothing")
        if self.coulomb_smoothing <= 0:
            raise ValueError(f"coulomb_smoothing must be > 0 [rad/s], got {r.coulomb_smoothing!r}")
        self.friction_stribeck = per_joint(r.friction_stribeck, n, "friction_stribeck")
        self.stribeck_velocity = _as_float(r.stribeck_velocity, "stribeck_velocity")
        self.ripple_amplitude = per_joint(r.ripple_amplitude, n, "ripple_amplitude")
        self.ripple_periods = _as_float(r.ripple_periods, "ripple_periods")
        for key in ("stribeck_velocity", "ripple_periods"):
            if not getattr(self, key) > 0:
                raise ValueError(f"{key} must be > 0, got {getattr(r, key)!r}")
        self._unmodelled = bool(np.any(self.friction_stribeck) or np.any(self.ripple_amplitude))
        self.noise_std_q = per_joint(r.noise_std_q, n, "noise_std_q")
        self.noise_std_v = per_joint(r.noise_std_v, n, "noise_std_v")
        self.noise_std_tau = per_joint(r.noise_std_tau, n, "noise_std_tau")
        self.tau_bias = per_joint(r.tau_bias, n, "tau_bias", nonneg=False)
        seed = r.seed
        self._rng = np.random.default_rng(None if seed is None or seed < 0 else int(seed))
        # no noise at all: the measurements are the state (no draws: the stream only feeds noise)
        self._noisy = bool(np.any(self.noise_std_q) or np.any(self.noise_std_v) or np.any(self.noise_std_tau))
        self.model.dof_damping[self._di] = self.friction_viscous
        self.armature = per_joint(r.armature, n, "armature")
        self.model.dof_armature[self._di] = self.armature

        # ---- reality: link scaling (static), then the payload (switchable)
        self._apply_link_scale(r.link_scale)
        self._body_nominal = {
            "mass": self.model.body_mass.copy(), "ipos": self.model.body_ipos.copy(),
            "iquat": self.model.body_iquat.copy(), "inertia": self.model.body_inertia.copy(),
        }
        frame = r.payload_frame or self.ee_frame
        self.payload_frame = frame
        self._payload_body = self._body_id(frame, "payload_frame")
        self.payload_mass = 0.0
        self.payload_com = np.zeros(3)
        self.payload_inertia = np.zeros((3, 3))
        self.payload_enabled = False
        self.set_payload(r.payload_mass, r.payload_com, r.payload_inertia, enabled=bool(r.payload_enabled))

        # ---- state
        if q0 is None:
            self.q0 = 0.5 * (self.lower + self.upper)
        else:
            self.q0 = self._vector(q0, "q0")
        self.saturation_count = np.zeros(n, dtype=np.int64)
        self.saturated = np.zeros(n, dtype=bool)
        self.rejected_commands = 0
        self.safe_steps = 0
        self.steps = 0
        self._hold_q: Optional[np.ndarray] = None
        self._warn_base = 0
        # ---- external forces (scripted pushes)
        self._pushes: list = []
        self._push_bodies: Dict[str, int] = {}
        self.pushes_added = 0
        self._ext_nv = np.zeros(self.model.nv)
        self._no_ext = np.zeros(n)
        self._tau_ext = self._no_ext
        self._ext_active: tuple = ()
        self.reset(self.q0, np.zeros(n))

    # ------------------------------------------------------------------ properties
    @property
    def time(self) -> float:
        """Simulation time [s]."""
        return float(self.data.time)

    @property
    def applied_torque(self) -> np.ndarray:
        """Torque applied during the last step (command clipped to the effort limits)."""
        return self._tau_applied.copy()

    @property
    def acceleration(self) -> np.ndarray:
        """Joint acceleration MuJoCo computed at the start of the last step (true, noise-free):
        ``M^-1 (tau_applied - C v - g - tau_friction)`` at the pre-step state."""
        return self._qacc.copy()

    @property
    def friction_torque(self) -> np.ndarray:
        """Joint friction torque that acted in the last step, :meth:`friction_model` at the
        step's start state (opposes motion when subtracted:
        ``M a + C v + g = tau_applied - friction_torque``)."""
        return self._tau_friction.copy()

    @property
    def external_torque(self) -> np.ndarray:
        """Joint torque [N m] the external pushes applied in the last step, ``sum J_p(q)^T F``
        at the step's start position (zero without an active push): the truth a momentum
        observer's estimate at :meth:`state` is compared with."""
        return self._tau_ext.copy()

    @property
    def external_forces(self) -> tuple:
        """The pushes that acted in the last step, each a dict: ``push`` (the
        :class:`ExternalPush`), ``point`` (world position [m]), ``force`` (world axes [N]),
        ``wrench_link`` (``[force; moment about the link's origin]`` in the link's axes)
        and ``torque`` (its joint torques ``J_p^T F`` [N m])."""
        return self._ext_active

    @property
    def pushes(self) -> tuple:
        """The pushes not yet over (scheduled or acting)."""
        return tuple(self._pushes)

    def add_push(self, link: Optional[str] = None, direction=(0.0, 0.0, -1.0), magnitude: float = 10.0, *,
                 point=(0.0, 0.0, 0.0), frame: str = "world", start: Optional[float] = None,
                 duration: float = math.inf) -> ExternalPush:
        """Schedule a push (:class:`ExternalPush`): ``link`` a URDF link / MuJoCo body
        (``None``/``""``: the end-effector frame's), ``start`` [sim s] (``None``: now, i.e.
        from the next step).  ``ValueError`` naming the problem (unknown link: the links
        are listed).  Returns the push."""
        push = link if isinstance(link, ExternalPush) else ExternalPush(
            link or self.ee_frame, tuple(np.asarray(direction, dtype=float).reshape(-1)), magnitude,
            tuple(np.asarray(point, dtype=float).reshape(-1)), frame, self.time if start is None else start,
            duration)
        if push.link not in self._push_bodies:
            self._push_bodies[push.link] = self.check_link(push.link, "push link")
        self._pushes.append(push)
        self.pushes_added += 1
        return push

    def check_link(self, name: str, what: str = "link") -> int:
        """The MuJoCo body id of the URDF link ``name``; ``ValueError`` listing the links."""
        return self._body_id(str(name), what)

    def clear_pushes(self) -> int:
        """Remove every push (scheduled or acting) from the next step on; returns how many."""
        k = len(self._pushes)
        self._pushes = []
        return k

    def _external(self, t: float) -> Optional[np.ndarray]:
        """The joint torques of the pushes acting on the step starting at ``t`` (None: none);
        sets :attr:`external_forces`.  Pushes that are over are dropped."""
        dt = self.timestep
        if any(p.end - 0.5 * dt <= t for p in self._pushes):
            self._pushes = [p for p in self._pushes if p.end - 0.5 * dt > t]
        active = [p for p in self._pushes if p.active(t, dt)]
        if not active:
            self._ext_active = ()
            return None
        m, d = self.model, self.data
        mujoco.mj_kinematics(m, d)     # the step start's positions (data holds the last step's start)
        mujoco.mj_comPos(m, d)         # (cdof, subtree CoM: what mj_jac needs)
        total = np.zeros(self.n)
        zero3 = np.zeros(3)
        out = []
        for p in active:
            b = self._push_bodies[p.link]
            R = d.xmat[b].reshape(3, 3).copy()
            point = d.xpos[b] + R @ np.asarray(p.point)
            F = p.force(R)
            buf = self._ext_nv
            buf[:] = 0.0
            mujoco.mj_applyFT(m, d, F, zero3, point, b, buf)
            tau = buf[self._di].copy()
            total += tau
            f_link = R.T @ F
            out.append({"push": p, "point": point.copy(), "force": F,
                        "wrench_link": np.concatenate([f_link, np.cross(np.asarray(p.point), f_link)]),
                        "torque": tau})
        self._ext_active = tuple(out)
        return total

    @property
    def hold_position(self) -> Optional[np.ndarray]:
        """Position latched by the "hold" safe mode (``None`` when not holding)."""
        return None if self._hold_q is None else self._hold_q.copy()

    def friction_model(self, v, q=None) -> np.ndarray:
        """``f_v v + (f_c + f_s exp(-(v/v_s)^2)) tanh(v / eps) + a sin(N q)`` for joint
        velocities ``v`` and positions ``q`` (the configured reality; ``q`` is needed only
        with a position ripple)."""
        v = np.asarray(v, dtype=float)
        out = self.friction_viscous * v + self._coulomb_level(v) * np.tanh(v / self.coulomb_smoothing)
        if np.any(self.ripple_amplitude):
            if q is None:
                raise ValueError("friction_model: the position ripple needs q")
            out = out + self._ripple(np.asarray(q, dtype=float))
        return out

    def _coulomb_level(self, v: np.ndarray) -> np.ndarray:
        """``f_c + f_s exp(-(v/v_s)^2)``: the Coulomb level, raised near rest by Stribeck."""
        if not np.any(self.friction_stribeck):
            return self.friction_coulomb
        return self.friction_coulomb + self.friction_stribeck * np.exp(-np.square(v / self.stribeck_velocity))

    def _ripple(self, q: np.ndarray) -> np.ndarray:
        """``a sin(N q)``: the position ripple."""
        return self.ripple_amplitude * np.sin(self.ripple_periods * q)

    # ------------------------------------------------------------------ validation
    def _vector(self, value, what: str) -> np.ndarray:
        try:
            arr = np.asarray(value, dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"{what}: expected {self.n} numbers, got {value!r}") from None
        if arr.ndim != 1 or arr.shape[0] != self.n:
            raise ValueError(f"{what} has shape {arr.shape} ({arr.size} values), expected {self.n} values "
                             f"for joints {self.joint_names}")
        if not np.isfinite(arr).all():
            bad = np.flatnonzero(~np.isfinite(arr))
            detail = ", ".join(f"{self.joint_names[i]} (index {i}) = {arr[i]}" for i in bad)
            raise ValueError(f"{what} is not finite at {detail}")
        # a fresh array as it is; the caller's (or a view of its buffer) copied
        return arr.copy() if arr is value or arr.base is not None else arr

    def _body_id(self, name: str, what: str) -> int:
        bid = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_BODY, name)
        if bid <= 0:
            bodies = [mujoco.mj_id2name(self.model, mujoco.mjtObj.mjOBJ_BODY, b) for b in range(1, self.model.nbody)]
            raise ValueError(f"{what}: {name!r} is not a link of the robot; links: {bodies}")
        return bid

    # ------------------------------------------------------------------ reality
    def _apply_link_scale(self, link_scale) -> None:
        m = self.model
        nb = m.nbody
        factors = np.ones(nb)
        if isinstance(link_scale, Mapping):
            default = _as_float(link_scale.get("*", 1.0), "link_scale['*']")
            factors[1:] = default
            for link, s in link_scale.items():
                if link == "*":
                    continue
                factors[self._body_id(str(link), "link_scale")] = _as_float(s, f"link_scale[{link!r}]")
        else:
            factors[1:] = _as_float(link_scale, "link_scale")
        if np.any(factors < 0):
            raise ValueError(f"link_scale factors must be >= 0, got {factors[1:].tolist()}")
        self.link_scale = {mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_BODY, b): float(factors[b]) for b in range(1, nb)}
        m.body_mass[:] *= factors
        m.body_inertia[:] *= factors[:, None]
        self._set_const()

    def _set_const(self) -> None:
        # mj_setConst recomputes the derived constants (subtree masses, inverse weights ...);
        # it uses its MjData as scratch (sets qpos0), so never pass the simulation's data.
        mujoco.mj_setConst(self.model, self._scratch)

    def set_payload(self, mass: Optional[float] = None, com: Optional[Sequence[float]] = None,
                    inertia: Optional[ArrayLike] = None, *, enabled: Optional[bool] = None) -> None:
        """Change the payload (any argument left ``None`` keeps its value; ``inertia=None``
        with a new mass = the default sphere) and/or attach/detach it.

        The carrying body's mass, CoM and inertia in the MuJoCo model are replaced by the
        rigid-body sum of the link (as scaled by ``link_scale``) and the payload, and the
        model's derived constants are recomputed: the change acts from the next step on.
        """
        if mass is not None:
            mass = _as_float(mass, "payload_mass")
            if mass < 0:
                raise ValueError(f"payload_mass must be >= 0, got {mass}")
            self.payload_mass = mass
            if inertia is None:
                self.payload_inertia = _inertia_3x3(None, mass)
        if com is not None:
            c = np.asarray(com, dtype=float)
            if c.shape != (3,) or not np.all(np.isfinite(c)):
                raise ValueError(f"payload_com must be 3 finite values [m], got {com!r}")
            self.payload_com = c.copy()
        if inertia is not None:
            self.payload_inertia = _inertia_3x3(inertia, self.payload_mass)
        if enabled is not None:
            self.payload_enabled = bool(enabled)
        self._update_payload_body()

    def set_payload_enabled(self, enabled: bool) -> None:
        """Attach (``True``) or remove (``False``) the payload at run time: the
        pick-and-place "sudden dynamics change".  Takes effect from the next step."""
        self.set_payload(enabled=bool(enabled))

    def _update_payload_body(self) -> None:
        m, b, nom = self.model, self._payload_body, self._body_nominal
        m.body_mass[b] = nom["mass"][b]
        m.body_ipos[b] = nom["ipos"][b]
        m.body_iquat[b] = nom["iquat"][b]
        m.body_inertia[b] = nom["inertia"][b]
        if self.payload_enabled and self.payload_mass > 0:
            m0, h0, I0 = _body_to_spatial(nom["mass"][b], nom["ipos"][b], nom["iquat"][b], nom["inertia"][b])
            mp, c = self.payload_mass, self.payload_com
            Ip = self.payload_inertia + mp * (c @ c * np.eye(3) - np.outer(c, c))
            mass, ipos, iquat, diag = _spatial_to_body(m0 + mp, h0 + mp * c, I0 + Ip)
            m.body_mass[b] = mass
            m.body_ipos[b] = ipos
            m.body_iquat[b] = iquat
            m.body_inertia[b] = diag
        # mj_setConst also recomputes body_sameframe: the compiler marks a massless body's
        # inertial frame as "same as the body frame", which would make kinematics ignore
        # the new body_ipos/iquat (the payload tests check M and g against pinocchio)
        self._set_const()

    def payload_parameters(self) -> np.ndarray:
        """The payload as a 10-vector (pinocchio order, about the payload frame's origin,
        in its axes) -- what ``RobotModel.set_payload`` takes; zeros when detached."""

        if not (self.payload_enabled and self.payload_mass > 0):
            return np.zeros(10)
        return from_mass_com_inertia(self.payload_mass, self.payload_com, self.payload_inertia)

    # ------------------------------------------------------------------ state
    def reset(self, q: Optional[ArrayLike] = None, v: Optional[ArrayLike] = None) -> None:
        """Put the robot at ``q`` [rad] (default ``q0``) with velocity ``v`` [rad/s]
        (default zero).

        The clock keeps running (ROS time must not jump back), counters are kept, the
        applied torque becomes zero, a latched hold position is released, and a new
        sensor-noise sample is drawn.  Raises ``ValueError`` on a wrong length / non-finite value.
        """
        q = self.q0 if q is None else self._vector(q, "reset q")
        v = np.zeros(self.n) if v is None else self._vector(v, "reset v")
        d = self.data
        d.qpos[self._qi] = q
        d.qvel[self._di] = v
        d.qacc[:] = 0.0
        d.qacc_warmstart[:] = 0.0
        d.qfrc_applied[:] = 0.0
        d.ctrl[:] = 0.0
        mujoco.mj_forward(self.model, d)
        self._tau_applied = np.zeros(self.n)
        self._qacc = np.zeros(self.n)
        self._tau_friction = np.zeros(self.n)
        self._tau_ext = self._no_ext
        self._ext_active = ()
        self.saturated[:] = False
        self._hold_q = None
        self._draw_noise()

    def _draw_noise(self) -> None:
        d = self.data
        if not self._noisy:
            self._q_meas = d.qpos[self._qi]           # fancy indexing: copies
            self._v_meas = d.qvel[self._di]
            self._tau_meas = self._tau_applied + self.tau_bias
            return
        n, rng = self.n, self._rng
        z = rng.standard_normal(3 * n)  # always 3n draws: the stream does not depend on which stds are 0
        self._q_meas = d.qpos[self._qi] + self.noise_std_q * z[:n]
        self._v_meas = d.qvel[self._di] + self.noise_std_v * z[n:2 * n]
        self._tau_meas = self._tau_applied + self.tau_bias + self.noise_std_tau * z[2 * n:]

    def state(self) -> Tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """``(t, q, v, tau_measured)`` as the robot's sensors report them.

        ``q`` [rad], ``v`` [rad/s] at time ``t`` [s] (after the last step) with noise;
        ``tau_measured`` [N m] = torque applied over the last step + bias + noise (see
        the class docstring).  Copies, in :attr:`joint_names` order.
        """
        return self.time, self._q_meas.copy(), self._v_meas.copy(), self._tau_meas.copy()

    def true_state(self) -> Tuple[np.ndarray, np.ndarray]:
        """Noise-free ``(q, v)`` at :attr:`time`."""
        return self.data.qpos[self._qi].copy(), self.data.qvel[self._di].copy()

    # ------------------------------------------------------------------ stepping
    def step(self, tau_cmd: ArrayLike) -> None:
        """Advance exactly one timestep with the commanded joint torque ``tau_cmd`` [N m].

        The command is validated (``ValueError`` naming the problem -- wrong length /
        shape, non-numeric, NaN/inf at which joint -- and :attr:`rejected_commands` is
        incremented; the plant is left untouched, the node decides the safe action),
        clipped to the URDF effort limits (:attr:`saturation_count` counts, per joint,
        the steps whose command exceeded the limit) and applied for the whole step.
        A latched "hold" position is released (a valid command resumes control).
        Raises :class:`SimulationDiverged` if MuJoCo flags an unstable state.
        """
        try:
            tau = self._vector(tau_cmd, "torque command")
        except ValueError:
            self.rejected_commands += 1
            raise
        self._hold_q = None
        self._advance(tau)

    def step_safe(self, mode: str = "damp", **gains) -> np.ndarray:
        """One step with :meth:`safe_torque` ``(mode, **gains)``; returns the torque
        commanded.  Keeps a latched hold position; counted in :attr:`safe_steps`.

        Same torque, clipping, measurement and counters as ``step(safe_torque(...))``,
        but with the implicit integrators the safe behaviour's velocity feedback
        (``-damping v`` or ``-kd v``) is integrated implicitly (MuJoCo joint damping), so
        it is stable for any gain; with ``"rk4"`` it is explicit.
        """
        tau, d = self._safe(mode, **gains)
        self.safe_steps += 1
        self._advance(tau, damping=d)
        return tau.copy()   # _advance keeps tau as the applied torque

    def _advance(self, tau: np.ndarray, damping: Optional[np.ndarray] = None) -> None:
        """Apply ``tau`` (clipped) for one step.  ``damping``: the part ``-damping * v``
        of ``tau`` that may be integrated implicitly (unsaturated joints only)."""
        m, d, lim = self.model, self.data, self.effort_limit
        sat = np.abs(tau) > lim
        self.saturated = sat
        if sat.any():
            self.saturation_count += sat
            tau_applied = np.clip(tau, -lim, lim)
        else:
            tau_applied = tau

        v = d.qvel[self._di].copy()
        fv, fc, eps = self.friction_viscous, self.friction_coulomb, self.coulomb_smoothing
        th = np.tanh(v / eps)
        if self._unmodelled:   # Stribeck raises the Coulomb level near rest; the ripple rides along
            fc = self._coulomb_level(v)
            coulomb = fc * th + self._ripple(d.qpos[self._qi])
        else:
            coulomb = fc * th
        qfrc = self._qfrc  # preallocated (nv): only the actuated dofs are ever written
        if self.integrator == "rk4":
            # explicit: viscous in dof_damping (set once), Coulomb held over the step
            qfrc[self._di] = tau_applied - coulomb
        else:
            # Linearly-implicit friction (and safe-mode damping): MuJoCo's implicit update
            # uses dof_damping as the velocity derivative, so put the full slope there and
            # compensate in qfrc_applied.  qfrc_passive + qfrc_applied is then exactly
            # tau_applied - f_v v - f_c tanh(v/eps) at v_k (same acceleration as explicit).
            slope = fv + fc * (1.0 - th * th) / eps
            if damping is not None:
                slope = slope + np.where(sat, 0.0, damping)
            m.dof_damping[self._di] = slope
            qfrc[self._di] = tau_applied - coulomb - fv * v + slope * v
        # the environment's pushes: J(q_k)^T F at the step start, held over the step
        tau_ext = None
        if self._pushes:
            tau_ext = self._external(d.time)
        elif self._ext_active:
            self._ext_active = ()
        if tau_ext is not None:
            qfrc[self._di] += tau_ext
        d.qfrc_applied[:] = qfrc

        warn_before = self._warning_count()
        if self.integrator == "rk4":
            mujoco.mj_forward(m, d)  # RK4 overwrites qacc with its last stage's: keep the step-start one
            qacc = d.qacc[self._di]
            mujoco.mj_step(m, d)
        else:
            mujoco.mj_step(m, d)    # qacc is that of mj_forward at the step start
            qacc = d.qacc[self._di]
        if self._warning_count() != warn_before or not (np.isfinite(d.qpos).all() and np.isfinite(d.qvel).all()):
            raise SimulationDiverged(
                f"MuJoCo flagged an unstable simulation at t={d.time:.6f} s (it resets the state); "
                f"last torque {tau_applied.tolist()} -- reduce the timestep or the gains")
        # MuJoCo adds the timestep to data.time at every step: in double precision that
        # drifts by ~1 ns per 10^5 steps, and stamps derived from it left the step grid
        # (3 minutes into a 1 kHz run no joint state matched its reference's stamp any
        # more).  Snapping to the grid removes the accumulation.
        d.time = round(d.time / m.opt.timestep) * m.opt.timestep
        self._qacc = qacc
        self._tau_applied = tau_applied
        self._tau_friction = fv * v + coulomb
        self._tau_ext = self._no_ext if tau_ext is None else tau_ext
        self.steps += 1
        self._draw_noise()

    _WARNINGS = tuple(int(k) for k in (mujoco.mjtWarning.mjWARN_BADQPOS, mujoco.mjtWarning.mjWARN_BADQVEL,
                                       mujoco.mjtWarning.mjWARN_BADQACC))

    def _warning_count(self) -> int:
        w = self.data.warning
        a, b, c = self._WARNINGS
        return w[a].number + w[b].number + w[c].number

    # ------------------------------------------------------------------ model queries (true robot)
    def _scratch_position(self, q) -> "mujoco.MjData":
        s = self._scratch
        s.qpos[:] = self.data.qpos
        if q is not None:
            s.qpos[self._qi] = self._vector(q, "q")
        s.qvel[:] = 0.0
        mujoco.mj_fwdPosition(self.model, s)
        return s

    def holding_shortfall(self) -> str:
        """Where the arm (its payload included) cannot hold itself against gravity within
        its effort limits -- the joint, its gravity torque at the worst of 256 poses of
        its ranges, its limit -- as a sentence; ``""`` when it can everywhere."""
        Q = range_poses(self.lower, self.upper, first=self.q0)
        worst, k = worst_torques(self.gravity_torque, Q)
        bad = over_limit(worst, self.effort_limit)
        if not bad.size:
            return ""
        where = [f"q={np.round(Q[i], 2).tolist()}" for i in k]
        return (f"the simulated arm (payload {self.payload_mass:g} kg) cannot hold itself everywhere in its joint"
                " ranges: " + describe(self.joint_names, worst, where, self.effort_limit, bad, "gravity torque"))

    def gravity_torque(self, q: Optional[ArrayLike] = None) -> np.ndarray:
        """Gravity torque g(q) [N m] of the TRUE robot (payload, link scaling included)
        at ``q`` (default: the true current position)."""
        s = self._scratch_position(q)
        out = np.zeros(self.model.nv)
        mujoco.mj_rne(self.model, s, 0, out)
        return out[self._di].copy()

    def mass_matrix(self, q: Optional[ArrayLike] = None) -> np.ndarray:
        """Joint-space inertia M(q) of the TRUE robot (default: current true position)."""
        s = self._scratch_position(q)
        M = np.zeros((self.model.nv, self.model.nv))
        mujoco.mj_fullM(self.model, s, M)
        return M[np.ix_(self._di, self._di)].copy()

    # ------------------------------------------------------------------ safe behaviour
    def safe_torque(self, mode: str = "damp", *, damping: Optional[ArrayLike] = None,
                    kp: Optional[ArrayLike] = None, kd: Optional[ArrayLike] = None,
                    q_hold: Optional[ArrayLike] = None, time_constant: float = 0.01,
                    omega: float = 20.0) -> np.ndarray:
        """Torque [N m] of the safe behaviour for a stale or malformed command.

        The robot's own safety controller, using its sensors (the *reported* q, v).
        Apply it with :meth:`step_safe` (implicit velocity feedback, stable for any gain)
        or ``step(safe_torque(...))``.

        ``mode="damp"`` (aliases ``"damping"``, ``"zero"``, ``"zero_torque"``,
        ``"zero_damping"``): zero torque plus joint damping, ``-damping * v``; the arm
        sinks slowly under gravity.  ``damping`` [N m s/rad] (scalar or per joint)
        defaults to ``M_ii(q) / time_constant`` (``time_constant`` [s], default 0.01).

        ``mode="hold"``: ``kp (q_hold - q) - kd v + g(q)`` (PD + the robot's own gravity
        compensation, payload included).  ``q_hold`` defaults to the position latched
        at the first "hold" since the last valid :meth:`step` / :meth:`reset` /
        :meth:`release_hold` (the position when the command went stale).  ``kp``
        [N m/rad], ``kd`` [N m s/rad] (scalar or per joint) default to ``M_ii omega^2``
        and ``2 M_ii omega`` (critically damped per joint; ``omega`` [rad/s], default 20).

        With ``integrator="rk4"`` the feedback is explicit: the default gains can be
        unstable in ill-conditioned configurations (``dt * eig(M^-1 D)`` must stay below
        ~2.8); pass a larger ``time_constant`` / smaller ``omega`` there.
        The result is clipped to the effort limits by the step, as any command.
        """
        return self._safe(mode, damping=damping, kp=kp, kd=kd, q_hold=q_hold,
                          time_constant=time_constant, omega=omega)[0]

    def _safe(self, mode: str = "damp", *, damping=None, kp=None, kd=None, q_hold=None,
              time_constant: float = 0.01, omega: float = 20.0) -> Tuple[np.ndarray, np.ndarray]:
        key = _SAFE_ALIASES.get(str(mode).lower())
        if key is None:
            raise ValueError(f"unknown safe mode {mode!r}; valid: {sorted(_SAFE_ALIASES)}")
        _, q, v, _ = self.state()
        need_m = damping is None if key == "damp" else (kp is None or kd is None)
        Mdiag = np.diag(self.mass_matrix(q)) if need_m else None
        if key == "damp":
            if damping is None:
                if not time_constant > 0:
                    raise ValueError(f"time_constant must be > 0, got {time_constant}")
                d = Mdiag / time_constant
            else:
                d = per_joint(damping, self.n, "damping")
            return -d * v, d
        if q_hold is not None:
            self._hold_q = self._vector(q_hold, "q_hold")
        elif self._hold_q is None:
            self._hold_q = q.copy()
        if not omega > 0:
            raise ValueError(f"omega must be > 0, got {omega}")
        kp_ = Mdiag * omega ** 2 if kp is None else per_joint(kp, self.n, "kp")
        kd_ = 2.0 * Mdiag * omega if kd is None else per_joint(kd, self.n, "kd")
        return kp_ * (self._hold_q - q) - kd_ * v + self.gravity_torque(q), kd_

    def release_hold(self) -> None:
        """Forget the latched hold position (the next "hold" latches anew)."""
        self._hold_q = None

    def diagnostics(self) -> Dict[str, Any]:
        """Counters and flags for the node's diagnostics message."""
        return {
            "time": self.time,
            "steps": self.steps,
            "safe_steps": self.safe_steps,
            "rejected_commands": self.rejected_commands,
            "saturation_count": dict(zip(self.joint_names, self.saturation_count.tolist())),
            "saturated_now": [j for j, s in zip(self.joint_names, self.saturated) if s],
            "payload_enabled": self.payload_enabled,
            "payload_mass": self.payload_mass,
            "holding": self._hold_q is not None,
            "pushes_added": self.pushes_added,
            "pushes_pending": len(self._pushes),
            "pushing_now": [f["push"].link for f in self._ext_active],
        }

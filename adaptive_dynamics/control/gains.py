"""Default gains of the Slotine-Li / adaptive controllers for an arm nobody tuned,
derived from its model, its drives and the control period (no ROS import).

Continuous time.  The sliding variable ``s = e_dot + Lambda e`` with ``tau = ... - K_D s``
gives, per joint and with the model term exact, ``m_j e_ddot + K_D,j e_dot + K_D,j Lambda e
= 0`` with ``m_j = M_jj + I_a,j`` (link inertia seen by the joint plus the drive's
reflected rotor inertia): natural frequency ``sqrt(K_D,j Lambda / m_j)``, damping ratio
``K_D,j / (2 sqrt(K_D,j Lambda m_j))``.  ``Lambda = 10 1/s`` and ``K_D,j = 4 Lambda m_j``
put both error poles at ``-2 Lambda`` (critically damped).

Discrete time.  The controller samples the state every ``dt`` and holds its torque for
the period.  The velocity part of the feedback alone is the map ``v+ = (1 - K_D dt / m) v``
(explicit sampling of a damper): stable only for ``K_D dt / m < 2``, and with one period
of transport delay (the command computed from the state of the step before) only for
``K_D dt / m < 1``.  The default keeps ``K_D,j dt / m_j <= DT_MARGIN = 0.2`` with ``m_j``
the smallest ``M_jj + I_a,j`` over the joint range -- a factor 5 from the delayed bound.

Drive inertia.  URDFs carry no rotor inertia, yet a geared drive's ``N^2 J_rotor``
dominates a light wrist (the SO-101's wrist links: ``M_jj ~ 1e-5 kg m^2``; its servo's
reflected rotor ~1e-2).  Where the robot's files state none, :func:`default_armature`
assumes ``I_a,j = ARMATURE_PER_EFFORT x tau_max,j`` (1e-3 kg m^2 per N m: 0.087 for the
Panda's 87 N m joints, close to the 0.1 the MuJoCo Menagerie Panda declares).  The same
values go to the simulator (MuJoCo ``dof_armature``) and into the gains, and ``info``
prints them.  On a real arm state the drives' values in the parameter file (``armature``).

Effort.  ``K_D,j <= 0.2 tau_max,j`` N m s/rad (at most 20 % of the rated torque for a
1 rad/s sliding error).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np

from ..dynamics.continuous import working_range
from ..validation import per_joint

__all__ = ["default_gains", "default_armature", "armature_vector", "gain_margins", "safe_damping", "LAMBDA",
           "KD_EFFORT_MAX", "DT_MARGIN", "ARMATURE_PER_EFFORT", "GAINS_VERSION"]

#: part of the cache key of generated parameter files: change it with the rule below or
#: with anything else :func:`~adaptive_dynamics.robot_setup.resolve_robot` writes into them
GAINS_VERSION = "4"

#: sliding-variable bandwidth [1/s]
LAMBDA = 10.0
#: K_D upper bound as a fraction of the effort limit [N m s/rad per N m]
KD_EFFORT_MAX = 0.2
#: bound on K_D dt / (M_jj + I_a) (discrete-time stability margin; see the module docstring)
DT_MARGIN = 0.2
#: assumed drive inertia per N m of effort limit [kg m^2 / (N m)]
ARMATURE_PER_EFFORT = 1e-3
#: default control period [s] (the controllers' rate_hz 1000)
DEFAULT_DT = 1e-3


def working_configuration(model) -> np.ndarray:
    """The middle of the joint limits (the trajectory node's default centre; 0 for a
    continuous joint)."""
    lo, hi = working_range(model.lower, model.upper)
    return 0.5 * (lo + hi)


def default_armature(effort_limit) -> list:
    """The assumed reflected drive inertia [kg m^2] per joint: ``ARMATURE_PER_EFFORT`` times
    the effort limit (rounded to 1e-6)."""
    tau = np.asarray(effort_limit, dtype=float)
    return [round(float(x), 6) for x in ARMATURE_PER_EFFORT * tau]


def armature_vector(armature, n: int) -> np.ndarray:
    """``armature`` [kg m^2] as ``n`` values (one value for every joint, or ``n``; ``None`` =
    none stated: zeros); ``ValueError`` otherwise (:func:`~adaptive_dynamics.validation.per_joint`)."""
    return per_joint(0.0 if armature is None else armature, n, "armature", one_for_all=True)


def _check_effort(model) -> np.ndarray:
    tau_max = np.asarray(model.effort_limit, dtype=float)
    if not np.all(np.isfinite(tau_max) & (tau_max > 0)):
        bad = [j for j, t in zip(model.joint_names, tau_max) if not (np.isfinite(t) and t > 0)]
        raise ValueError(f"joints {bad} have no effort limit in the URDF (<limit effort=...>): the default gains"
                         " and the simulator need one")
    return tau_max


def smallest_inertia(model, samples: int = 64, seed: int = 0) -> np.ndarray:
    """``min_q M_jj(q)`` per joint over the working configuration and ``samples`` random
    configurations inside the joint limits (a continuous joint: one turn)."""
    lo, hi = working_range(model.lower, model.upper)
    rng = np.random.default_rng(seed)
    out = np.diag(model.mass_matrix(working_configuration(model))).copy()
    for _ in range(samples):
        out = np.minimum(out, np.diag(model.mass_matrix(rng.uniform(lo, hi))))
    return out


def default_gains(model, q: Optional[np.ndarray] = None, *, dt: float = DEFAULT_DT,
                  armature: Optional[Sequence[float]] = None) -> dict:
    """``{"lam": [Lambda], "kd": [K_D,j ...]}`` for ``model`` (a
    :class:`~adaptive_dynamics.dynamics.RobotModel`) around ``q`` (default: the middle of
    the joint limits), control period ``dt`` [s] and drive inertia ``armature`` [kg m^2]
    (default :func:`default_armature`); see the module docstring:
    ``K_D,j = min(4 Lambda (M_jj(q) + I_a,j), KD_EFFORT_MAX tau_max,j,
    DT_MARGIN (min_q M_jj + I_a,j) / dt)``."""
    if not dt > 0:
        raise ValueError(f"dt must be > 0, got {dt}")
    tau_max = _check_effort(model)
    ia = armature_vector(default_armature(tau_max) if armature is None else armature, model.n)
    q = working_configuration(model) if q is None else np.asarray(q, dtype=float)
    m = np.diag(model.mass_matrix(q)) + ia
    m_min = smallest_inertia(model) + ia
    kd = np.minimum.reduce([4.0 * LAMBDA * m, KD_EFFORT_MAX * tau_max, DT_MARGIN * m_min / dt])
    return {"lam": [LAMBDA], "kd": [round(float(x), 6) for x in kd]}


def gain_margins(model, kd, dt: float, armature=None) -> np.ndarray:
    """``K_D,j dt / min_q (M_jj + I_a,j)`` per joint: the discrete-time margin of a gain set
    (< 1 stable with a period of delay; the defaults keep it <= ``DT_MARGIN``)."""
    kd = np.broadcast_to(np.asarray(kd, dtype=float), (model.n,))
    return kd * dt / (smallest_inertia(model) + armature_vector(armature, model.n))


def safe_damping(model, *, dt: float = DEFAULT_DT, armature=None) -> np.ndarray:
    """The joint damping of a controller's safe command [N m s/rad] per joint: as large as
    the discrete-time margin and the effort allow, ``min(DT_MARGIN (min_q M_jj + I_a,j) / dt,
    KD_EFFORT_MAX tau_max,j)`` -- a fixed damping (5 N m s/rad) is unstable on a wrist of
    1e-4 kg m^2 at 1 kHz and negligible on a 10 kg m^2 shoulder."""
    tau_max = _check_effort(model)
    return np.minimum(DT_MARGIN * (smallest_inertia(model) + armature_vector(armature, model.n)) / dt,
                      KD_EFFORT_MAX * tau_max)

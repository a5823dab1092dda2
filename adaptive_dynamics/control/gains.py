"""Default gains of the Slotine-Li / adaptive controllers for an arm nobody tuned,
derived from its model (no ROS import).

The sliding variable ``s = e_dot + Lambda e`` with ``tau = ... - K_D s`` gives, per joint
and with the model term exact, ``M_jj e_ddot + K_D,j e_dot + K_D,j Lambda e = 0``: natural
frequency ``sqrt(K_D,j Lambda / M_jj)`` and damping ratio ``K_D,j / (2 sqrt(K_D,j Lambda M_jj))``.
:func:`default_gains` takes ``Lambda = 10 1/s`` and ``K_D,j = 4 Lambda M_jj`` (both error
poles at ``-2 Lambda``, critically damped) with ``M`` the joint-space inertia at the
configuration the arm works around, then bounds ``K_D,j`` by the drive:
``[0.01, 0.2] x tau_max,j`` N m s/rad (at most 20 % of the rated torque for a 1 rad/s
sliding error; at least 1 % -- URDFs carry no rotor inertia, so a wrist's ``M_jj`` of
1e-4 kg m^2 alone would give a gain no real joint is run with).

Checked in closed loop on arms from example-robot-data the package does not ship (UR5,
xArm 7, with a 2 kg payload): composite adaptation from zero converges, the tracking
RMSE falls by two orders of magnitude (``test/test_any_robot.py``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["default_gains", "LAMBDA", "KD_BOUNDS", "GAINS_VERSION"]

#: part of the cache key of generated parameter files: change it with the rule below or
#: with anything else :func:`~adaptive_dynamics.robots.resolve_robot` writes into them
GAINS_VERSION = "2"

#: sliding-variable bandwidth [1/s]
LAMBDA = 10.0
#: K_D bounds as fractions of the effort limit [N m s/rad per N m]
KD_BOUNDS = (0.01, 0.2)


def working_configuration(model) -> np.ndarray:
    """The middle of the joint limits (the trajectory node's default centre)."""
    return 0.5 * (np.asarray(model.lower, float) + np.asarray(model.upper, float))


def default_gains(model, q: Optional[np.ndarray] = None) -> dict:
    """``{"lam": [Lambda], "kd": [K_D,j ...]}`` for ``model`` (a
    :class:`~adaptive_dynamics.dynamics.RobotModel`) around ``q`` (default: the middle
    of the joint limits); see the module docstring."""
    q = working_configuration(model) if q is None else np.asarray(q, dtype=float)
    m = np.diag(model.mass_matrix(q))
    tau_max = np.asarray(model.effort_limit, dtype=float)
    if not np.all(np.isfinite(tau_max) & (tau_max > 0)):
        bad = [j for j, t in zip(model.joint_names, tau_max) if not (np.isfinite(t) and t > 0)]
        raise ValueError(f"joints {bad} have no effort limit in the URDF (<limit effort=...>): the default gains"
                         " and the simulator need one")
    kd = np.clip(4.0 * LAMBDA * m, KD_BOUNDS[0] * tau_max, KD_BOUNDS[1] * tau_max)
    return {"lam": [LAMBDA], "kd": [round(float(x), 4) for x in kd]}

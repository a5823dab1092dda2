"""The two realistic proxies of ``experiment realdata`` (and of its closed loop,
:mod:`.closed_loop_regions`): the simulated robot's departures from its URDF.

* the **Panda** (:data:`REALITY`): Stribeck friction on top of 1.5x the Coulomb
  friction, a sensor bias and noise, jittered stamps and a heavier hand;
* the **iiwa 14** (:data:`SECOND_PROXY`): another friction law and a payload that
  changes between the training run and the other run.
"""
from __future__ import annotations

import numpy as np

from ..dynamics import RobotModel

__all__ = ["REALITY", "SECOND_PROXY", "torque_bias", "proxy_reality"]

#: the simulated robot's departures from the URDF (see the module docstring)
REALITY = {"coulomb_scale": 1.5, "coulomb_smoothing": 0.05, "stribeck_ratio": 0.5, "stribeck_velocity": 0.05,
           "tau_bias": [0.4, -0.6, 0.3, 0.5, -0.15, 0.1, 0.08], "noise_std_tau": 0.05, "noise_std_v": 0.003,
           "noise_std_q": 2e-5, "ee_extra_mass": 0.5, "ee_extra_com": [0.0, 0.0, 0.03], "stamp_jitter_s": 5e-5}
#: the second proxy (the iiwa 14): another friction law -- twice the viscous friction, no
#: Stribeck term, a position ripple a sin(N q) -- and a payload of 1 kg off the flange
#: axis that becomes 1.5 kg between the training and the other run
SECOND_PROXY = {"viscous_scale": 2.0, "coulomb_scale": 1.0, "stribeck_ratio": 0.0, "ripple_amplitude": 0.3,
                "ripple_periods": 6.0, "ee_extra_mass": 1.0, "ee_extra_com": [0.02, 0.0, 0.05],
                "test_ee_extra_mass": 1.5}


def torque_bias(robot: str, effort_limit) -> list:
    """The sensor bias of :data:`REALITY` (the Panda's); another arm gets the same fractions
    of its effort limits, the Panda's seven cycled over its joints."""
    if robot == "panda":
        return list(REALITY["tau_bias"])
    frac = np.asarray(REALITY["tau_bias"]) / RobotModel("panda").effort_limit
    lim = np.asarray(effort_limit, dtype=float)
    return [round(float(frac[j % frac.size] * lim[j]), 4) for j in range(lim.size)]


def proxy_reality(robot: str, effort_limit) -> tuple:
    """``(reality, test_reality)`` of a proxy: :data:`REALITY` (the sensor bias scaled to
    the arm) for the training run, and the second run's changes (:data:`SECOND_PROXY`'s
    payload change for the iiwa)."""
    base = dict(REALITY)
    base["tau_bias"] = torque_bias(robot, effort_limit)
    if robot == "iiwa14":
        base.update({k: v for k, v in SECOND_PROXY.items() if k != "test_ee_extra_mass"})
        return base, {**base, "ee_extra_mass": SECOND_PROXY["test_ee_extra_mass"]}
    return base, base

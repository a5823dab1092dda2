"""Baseline controllers: computed torque with an exact model gives the linear error
dynamics e'' + Kd e' + Kp e = 0 (checked against the analytic solution), PD gains
are validated, saturation counts."""
from __future__ import annotations

import numpy as np
import pinocchio as pin
import pytest

from adaptive_dynamics.control.baseline import ComputedTorqueController, PDController, make_controller, saturate
from adaptive_dynamics.dynamics import RobotModel


def test_computed_torque_linearises_exactly():
    rm = RobotModel("planar2")
    kp, kd = 100.0, 20.0  # critically damped, double pole at -10
    ctl = ComputedTorqueController(rm, kp=kp, kd=kd)
    m = pin.buildModelFromUrdf(rm.urdf_path)
    d = m.createData()
    q_d = np.array([0.3, -0.4])
    e0 = np.array([0.05, -0.02])
    q, v, h = q_d - e0, np.zeros(2), 1e-4
    for _ in range(round(0.3 / h)):  # RK2 (midpoint) of the true dynamics with a held set-point
        tau = ctl.compute(q, v, q_d, np.zeros(2), np.zeros(2))
        a = pin.aba(m, d, q, v, tau)
        qm, vm = q + 0.5 * h * v, v + 0.5 * h * a
        tau_m = ctl.compute(qm, vm, q_d, np.zeros(2), np.zeros(2))
        am = pin.aba(m, d, qm, vm, tau_m)
        q, v = q + h * vm, v + h * am
    t = 0.3
    e_exact = e0 * (1 + 10 * t) * np.exp(-10 * t)  # e = q_d - q for a double pole at -10
    np.testing.assert_allclose(q_d - q, e_exact, atol=1e-6)


def test_pd_gravity_compensation_and_gain_validation():
    rm = RobotModel("panda")
    pd = PDController(rm, kp=50.0, kd=[5.0] * 7, gravity_compensation=True)
    q = 0.5 * (rm.lower + rm.upper)
    np.testing.assert_allclose(pd.compute(q, np.zeros(7), q, np.zeros(7), np.zeros(7)), rm.gravity(q))
    with pytest.raises(ValueError, match="kd"):
        pd.set_gains(kd=[5.0] * 6 + [0.0])
    with pytest.raises(ValueError, match="kp"):
        pd.set_gains(kp=[np.nan] * 7)
    with pytest.raises(ValueError, match="kp"):
        pd.set_gains(kp=[1.0] * 3)
    np.testing.assert_array_equal(pd.kd, 5.0)  # refused: old gains kept
    with pytest.raises(ValueError, match="unknown control law"):
        make_controller("magic", rm, kp=1, kd=1)


def test_saturate_counts():
    counts = np.zeros(3, dtype=int)
    tau = np.array([5.0, -20.0, 1.0])
    saturate(tau, np.array([10.0, 10.0, 0.5]), counts)
    np.testing.assert_array_equal(tau, [5.0, -10.0, 0.5])
    np.testing.assert_array_equal(counts, [0, 1, 1])

"""Offline rigid-body identification (dynamics/identification.py): least squares on the
base regressor + friction recovers the URDF's base parameters and the friction exactly
from noise-free data of the model itself, and closely from a simulated excitation run
(MuJoCo plant with friction, PD control, filtered differentiation); the result loads into
the adaptive controller as its fixed estimate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from adaptive_dynamics.control.adaptive import AdaptiveController
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.dynamics.identification import estimate_file, identify, prepare
from adaptive_dynamics.trajectories import ModifiedFourier


def _excitation(m, seconds, rate=200.0, seed=0):
    traj = ModifiedFourier.random(m.n, np.random.default_rng(seed), q_center=0.5 * (m.lower + m.upper),
                                  amplitude=0.4, w_f=2 * math.pi * 0.2, L=4, lower=m.lower, upper=m.upper,
                                  vel_limit=m.velocity_limit, acc_limit=None)
    t = np.arange(0.0, seconds, 1.0 / rate)
    return (t, *traj.sample_many(t))


def test_noise_free_data_give_the_true_base_parameters_and_friction():
    truth = RobotModel("panda", friction=True, coulomb_smoothing=0.01)
    fv = np.linspace(0.05, 0.2, 7)
    fc = np.linspace(0.1, 0.4, 7)
    truth.set_friction(fv, fc)
    t, Q, V, A = _excitation(truth, 10.0)
    tau = np.array([truth.inverse_dynamics(q, v, a) for q, v, a in zip(Q, V, A)])
    model = RobotModel("panda", friction=True, coulomb_smoothing=0.01)
    res = identify(model, Q, V, A, tau)
    theta = model.base_parameters().to_base(truth.parameters)
    np.testing.assert_allclose(res.theta, theta, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(res.theta[-14:], np.concatenate([fv, fc]), rtol=1e-6)
    assert np.all(res.residual_rmse < 1e-8 * np.maximum(res.tau_rms, 1.0))
    assert res.samples == len(t) and res.condition < 1e4
    # the full pi it returns maps back to theta, and predicts the torque
    np.testing.assert_allclose(model.base_parameters().to_base(res.pi), res.theta, rtol=1e-12, atol=1e-12)
    k = 123
    np.testing.assert_allclose(model.regressor(Q[k], V[k], A[k]) @ res.pi, tau[k], atol=1e-8)


def test_simulated_excitation_run_identifies_the_plant(tmp_path):
    """The experiment's procedure on the MuJoCo plant (friction tanh(v/0.01) in the plant,
    sgn(v) in the model, PD tracking, acceleration by filtered differentiation)."""
    from adaptive_dynamics.robots import friction
    from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig

    m = RobotModel("panda")
    fv, fc = friction("panda")
    traj = ModifiedFourier.random(m.n, np.random.default_rng(0), q_center=0.5 * (m.lower + m.upper),
                                  amplitude=0.4, w_f=2 * math.pi * 0.1, L=4, lower=m.lower, upper=m.upper,
                                  vel_limit=m.velocity_limit, acc_limit=np.full(7, 10.0))
    t = np.arange(0.0, 20.0, 1e-3)
    Q, V, A = traj.sample_many(t)
    plant = MujocoPlant("panda", reality=RealityConfig(friction_viscous=fv, friction_coulomb=fc), q0=Q[0])
    pd = AdaptiveController(m, "direct", lam=10.0, kd=np.array([30, 30, 20, 20, 4, 4, 1.0]))
    q_, v_, tau_ = [], [], []
    for k in range(len(t)):
        _, q, v, tm = plant.state()
        q_.append(q)
        v_.append(v)
        tau_.append(tm)
        plant.step(pd.compute(q, v, Q[k], V[k], A[k], learn=False))
    model = RobotModel("panda", friction=True)
    res = identify(model, *prepare(t, np.array(q_), np.array(v_), np.array(tau_)))
    truth = model.base_parameters().to_base(np.concatenate([m.link_parameters, fv, fc]))
    assert np.linalg.norm(res.theta - truth) / np.linalg.norm(truth) < 0.15
    # the torque of the big joints is explained to < 1 %
    rel = res.residual_rmse / res.tau_rms
    assert rel[1] < 0.01 and rel[3] < 0.01, rel
    # the controller loads it as its (fixed) estimate: base parameters + friction columns
    path = estimate_file(model, res, str(tmp_path / "rbd.npz"))
    ctl = AdaptiveController(RobotModel("panda", friction=True), "direct")
    ctl.load_state(path)
    np.testing.assert_allclose(ctl.theta, res.theta, rtol=1e-12)


def test_prepare_checks_its_input():
    t = np.arange(100) * 1e-3
    x = np.zeros((100, 2))
    q, v, a, tau = prepare(t, x, x, x, cutoff_hz=20.0, decimate=5, trim=0.01)
    assert q.shape == (16, 2) and a.shape == (16, 2)
    with pytest.raises(ValueError, match="uniformly"):
        prepare(np.r_[t[:50], t[51:], 1.0], x, x, x)
    with pytest.raises(ValueError, match="cutoff_hz"):
        prepare(t, x, x, x, cutoff_hz=600.0)
    with pytest.raises(ValueError, match="too few"):
        identify(RobotModel("panda", friction=True), *(np.zeros((3, 7)),) * 4)

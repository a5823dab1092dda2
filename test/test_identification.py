"""Offline rigid-body identification (dynamics/identification.py): least squares on the
base regressor + friction recovers the URDF's base parameters and the friction exactly
from noise-free data of the model itself, and closely from a simulated excitation run
(MuJoCo plant with friction, PD control, filtered differentiation); the result loads into
the adaptive controller as its fixed estimate."""
from __future__ import annotations

import math

import numpy as np
import pytest

from adaptive_dynamics.control.adaptive import AdaptiveController, estimate_file
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.dynamics.identification import (
    identify,
    identify_consistent,
    nmse,
    prepare,
    segments,
)
from adaptive_dynamics.dynamics.inertial import pseudo_inertias
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
    truth = model.base_parameters().to_base(np.concatenate([m.parameters, fv, fc]))
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


def test_offset_and_consistent_fit_on_noisy_data_of_the_model():
    """A constant torque offset per joint is found; the consistent fit (SDP) predicts
    as well as least squares where the data are, while every link of its pi has a
    positive semidefinite pseudo-inertia (the least-squares pi, dependent entries zero,
    has not) and its friction is non-negative."""
    truth = RobotModel("panda", friction=True)
    fv, fc = np.linspace(0.05, 0.2, 7), np.linspace(0.1, 0.4, 7)
    truth.set_friction(fv, fc)
    t, Q, V, A = _excitation(truth, 10.0)
    off = np.linspace(-0.3, 0.3, 7)
    tau = np.array([truth.inverse_dynamics(q, v, a) for q, v, a in zip(Q, V, A)]) + off
    noisy = tau + 0.02 * np.random.default_rng(1).standard_normal(tau.shape)
    model = RobotModel("panda", friction=True)
    ls = identify(model, Q, V, A, noisy, offset=True)
    assert np.abs(ls.offset - off)[[0, 2, 4, 5, 6]].max() < 0.02     # (joints 2 and 4: offsets and gravity)
    cons = identify_consistent(model, Q, V, A, noisy, offset=True)
    assert cons.method == "consistent" and cons.pi.shape == (model.n_params,)
    eig = np.linalg.eigvalsh(pseudo_inertias(cons.pi[:70].reshape(7, 10)))[:, 0]
    assert eig.min() >= -1e-8 and np.allclose(eig, cons.min_pseudo_inertia_eig)
    assert np.linalg.eigvalsh(pseudo_inertias(ls.pi[:70].reshape(7, 10)))[:, 0].min() < 0
    assert np.all(cons.pi[70:] >= 0)
    e_ls, e_c = nmse(tau, ls.torque(model, Q, V, A)), nmse(tau, cons.torque(model, Q, V, A))
    assert np.all(e_c < 1e-3) and np.all(e_c < 3 * e_ls + 1e-5), (e_c, e_ls)
    np.testing.assert_allclose(model.base_parameters().to_base(cons.pi), cons.theta, rtol=1e-12, atol=1e-12)


def test_segments_count_and_repair_what_recordings_contain():
    t = np.arange(0.0, 3.0, 1e-3)
    x = np.column_stack([2.0 * t + 1.0, -t])           # linear: interpolation is exact
    t_bad, x_bad = t.copy(), x.copy()
    x_bad[[100, 101]] = np.nan                         # NaN rows
    t_bad[501] = t_bad[499]                            # a stamp back in time
    t_bad[700] = t_bad[699]                            # repeated stamp
    t_bad[1500:] += 0.5                                # a gap
    t_bad[2000:2600] += 1e-4 * np.sin(np.arange(600))  # jitter in the second segment
    pieces, c = segments(t_bad, x_bad)
    # (the first segment's dropped samples leave holes: it is resampled too)
    assert c["nonfinite"] == 2 and c["out_of_order"] == 2 and c["gaps"] == 1 and c["resampled_segments"] == 2
    assert len(pieces) == 2
    (t1, x1), (t2, x2) = pieces
    assert t1[-1] < 1.5 and t2[0] >= 2.0
    for ts, xs, shift in ((t1, x1, 0.0), (t2, x2, 0.5)):
        np.testing.assert_allclose(np.diff(ts), 1e-3, rtol=1e-9)     # the median step, uniform
        np.testing.assert_allclose(xs[:, 0], 2.0 * (ts - shift) + 1.0, atol=1e-3)
    clean, c = segments(t, x)
    assert c["resampled_segments"] == 0 and len(clean) == 1
    np.testing.assert_array_equal(clean[0][1], x)
    short, c = segments(t[:200], x[:200])
    assert short == [] and c["short_segments"] == 200


def test_near_rest_samples_of_coulomb_joints_are_left_out():
    """A joint's smooth Coulomb friction f_c tanh(v / 0.01) near rest is no sgn(v): with
    those samples (|v| < 0.05 rad/s) left out (the default, ``moving_rows``) the viscous and
    Coulomb levels and the rigid body come out at their truth (pinocchio's RNEA + the
    friction); fitting every sample splits the friction wrongly."""
    import math

    import pinocchio as pin

    from adaptive_dynamics.dynamics.identification import MIN_VELOCITY, moving_rows
    from adaptive_dynamics.trajectories import ModifiedFourier

    m = RobotModel("panda", friction=True)
    rng = np.random.default_rng(5)
    traj = ModifiedFourier.random(m.n, rng, q_center=0.5 * (m.lower + m.upper), amplitude=0.5,
                                  w_f=2 * math.pi * 0.1, L=4, lower=m.lower, upper=m.upper,
                                  vel_limit=0.8 * m.velocity_limit, acc_limit=np.full(m.n, 8.0))
    t = np.arange(0.0, 20.0, 0.005)
    Q, V, A = traj.sample_many(t)
    fv, fc = np.linspace(0.1, 0.4, m.n), np.linspace(0.3, 1.0, m.n)
    pm, d = m.model, m.model.createData()
    rigid = RobotModel("panda").parameters
    tau = np.array([pin.rnea(pm, d, q, v, a) for q, v, a in zip(Q, V, A)]) + fv * V + fc * np.tanh(V / 0.01)
    truth = m.base_parameters().to_base(np.concatenate([rigid, fv, fc]))
    keep = moving_rows(m, V)
    assert 0 < np.mean(keep == 0) < 0.2 and np.all(moving_rows(RobotModel("panda"), V) == 1)
    left_out = identify(m, Q, V, A, tau, min_velocity=MIN_VELOCITY)
    every = identify(m, Q, V, A, tau)                  # the default: every sample
    err = lambda ident: np.linalg.norm(ident.theta - truth) / np.linalg.norm(truth)   # noqa: E731
    assert err(left_out) < 1e-3 < err(every) and err(left_out) < err(every) / 10
    np.testing.assert_array_equal(left_out.rows_used, keep.sum(axis=0))
    assert MIN_VELOCITY == 0.05

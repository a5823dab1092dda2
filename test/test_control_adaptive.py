"""Direct / composite adaptive control core, against independent references.

References: pinocchio called directly on the URDF (M, C, g, RNEA), the MuJoCo plant
(the "real robot"), the Lyapunov function of the direct law, and analytic bounds.
planar2 where only speed matters, Panda where the claim is about a real arm.
"""
from __future__ import annotations

import math

import numpy as np
import pinocchio as pin
import pytest

from adaptive_dynamics.control.adaptive import AdaptiveController, spd_gain
from adaptive_dynamics.control.projection import consistency_margins, project_consistent, pseudo_inertias
from adaptive_dynamics.dynamics import RobotModel, pseudo_inertia
from adaptive_dynamics.evaluation.metrics import rmse
from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig
from adaptive_dynamics.trajectories import ModifiedFourier

DT = 1e-3


def fourier(model, seed=0, period=4.0, amplitude=0.8, q_center=None):
    return ModifiedFourier.random(model.n, np.random.default_rng(seed),
                                  q_center=0.5 * (model.lower + model.upper) if q_center is None else q_center,
                                  amplitude=amplitude, w_f=2 * math.pi / period, L=4,
                                  lower=model.lower, upper=model.upper, vel_limit=0.6 * model.velocity_limit,
                                  margin=0.1)


def closed_loop(robot, ctl, traj, T, *, reality=None, learn=True, q0_offset=None, robot_gravity=False,
                on_step=None):
    """Run plant + controller in lockstep for T seconds; returns (t, E) with E = q_d - q."""
    N = int(round(T / DT))
    ts = np.arange(N) * DT
    Q, V, A = traj.sample_many(ts)
    q0 = Q[0] if q0_offset is None else Q[0] + q0_offset
    plant = MujocoPlant(robot, reality=reality or RealityConfig(), timestep=DT, q0=q0)
    E = np.empty((N, plant.n))
    for k in range(N):
        _, q, v, tau_m = plant.state()
        lk = learn(ts[k]) if callable(learn) else learn
        tau = ctl.compute(q, v, Q[k], V[k], A[k], tau_m, learn=lk)
        E[k] = Q[k] - q
        if on_step is not None:
            on_step(k, plant, ctl)
        if robot_gravity:  # what franka_ros2 does: the robot adds its own g(q)
            tau = tau + plant.gravity_torque()
        plant.step(tau)
    assert plant.saturation_count.sum() == 0, ("the tests assume an unsaturated loop", plant.saturation_count)
    return ts, E


# ----------------------------------------------------------------------------- regressor consistency
def _pin_terms(urdf, q, v, vr, ar):
    m = pin.buildModelFromUrdf(urdf)
    d = m.createData()
    M = pin.crba(m, d, q)
    M = np.triu(M) + np.triu(M, 1).T
    C = pin.computeCoriolisMatrix(m, d, q, v)
    g = pin.computeGeneralizedGravity(m, d, q)
    return M @ ar + C @ vr + g, pin.rnea(m, d, q, v, ar)


@pytest.mark.parametrize("base", [True, False])
def test_true_parameters_give_slotine_li_torque(base):
    model = RobotModel("panda")
    kd = np.linspace(5.0, 30.0, 7)
    lam = np.diag(np.linspace(4.0, 12.0, 7))
    ctl = AdaptiveController(model, "direct", lam=lam, kd=kd, pi0=model.parameters, base_parameters=base)
    rng = np.random.default_rng(3)
    for _ in range(5):
        q, v, a = model.random_state(rng)
        qd, vd, ad = q + 0.1 * rng.standard_normal(7), v + 0.3 * rng.standard_normal(7), a
        tau = ctl.compute(q, v, qd, vd, ad, learn=False)
        vr = vd - lam @ (q - qd)
        ar = ad - lam @ (v - vd)
        s = v - vr
        ref, _ = _pin_terms(model.urdf_path, q, v, vr, ar)
        np.testing.assert_allclose(ctl.qd_r, vr, atol=1e-12)
        np.testing.assert_allclose(ctl.s, s, atol=1e-12)
        np.testing.assert_allclose(ctl.e, qd - q, atol=1e-15)
        np.testing.assert_allclose(ctl.parametric_torque, ref, atol=1e-8 * max(1.0, np.abs(ref).max()))
        np.testing.assert_allclose(ctl.feedback_torque, -kd * s, atol=1e-12)
        np.testing.assert_allclose(tau, ref - kd * s, atol=1e-8 * max(1.0, np.abs(ref).max()))


def test_model_input_desired_is_the_pure_feed_forward_of_the_reference():
    """``model_input = "desired"``: the model term is pinocchio's RNEA at the reference
    (q_d, qd_d, qdd_d), the feedback -K_D s of the measured state beside it."""
    model = RobotModel("panda")
    kd = np.linspace(5.0, 30.0, 7)
    ctl = AdaptiveController(model, "direct", lam=8.0, kd=kd, pi0=model.parameters)
    ctl.model_input = "desired"
    rng = np.random.default_rng(5)
    for _ in range(3):
        q, v, a = model.random_state(rng)
        qd, vd, ad = q + 0.1 * rng.standard_normal(7), v + 0.3 * rng.standard_normal(7), a
        tau = ctl.compute(q, v, qd, vd, ad, learn=False)
        _, ff = _pin_terms(model.urdf_path, qd, vd, vd, ad)
        s = v - (vd + 8.0 * (qd - q))
        np.testing.assert_allclose(ctl.parametric_torque, ff, atol=1e-8 * max(1.0, np.abs(ff).max()))
        np.testing.assert_allclose(tau, ff - kd * s, atol=1e-8 * max(1.0, np.abs(ff).max()))


def test_state_torque_is_the_model_at_the_learners_input_before_the_update():
    """``state_torque``: ``model_torque`` = pinocchio's RNEA at (q, qd, qdd_d) plus the
    estimate's friction, with the estimate the cycle's torque used (before its update); the
    law's own ``parametric_torque`` unchanged; off: never computed."""
    model = RobotModel("panda", friction=True)
    base = RobotModel("panda")
    fv, fc = np.linspace(0.5, 1.1, 7), np.linspace(0.2, 0.8, 7)
    pi0 = np.concatenate([base.parameters, fv, fc])
    ctl = AdaptiveController(model, "direct", lam=8.0, kd=10.0, pi0=pi0, gamma=50.0)
    off = AdaptiveController(model, "direct", lam=8.0, kd=10.0, pi0=pi0, gamma=50.0)
    ctl.state_torque = True
    pm = pin.buildModelFromUrdf(base.urdf_path)
    pd = pm.createData()
    rng = np.random.default_rng(6)
    for k in range(3):
        q, v, a = base.random_state(rng)
        qd, vd = q + 0.1 * rng.standard_normal(7), v + 0.3 * rng.standard_normal(7)
        pi_before = ctl.pi.copy()
        ctl.compute(q, v, qd, vd, a, learn=True)
        off.compute(q, v, qd, vd, a, learn=True)
        ref = pin.rnea(pm, pd, q, v, a) + fv * v + fc * np.sign(v)
        if k == 0:   # the URDF's estimate: pinocchio's RNEA with the friction columns
            np.testing.assert_allclose(ctl.model_torque, ref, atol=1e-8 * np.abs(ref).max())
        np.testing.assert_allclose(ctl.model_torque, model.regressor(q, v, a) @ pi_before, rtol=1e-10, atol=1e-9)
        assert np.any(ctl.pi != pi_before)       # the estimate moved after the cycle's torque
        np.testing.assert_allclose(ctl.parametric_torque, off.parametric_torque, rtol=1e-12, atol=1e-12)
    assert not np.any(off.model_torque)


def test_true_parameters_give_zero_prediction_error_and_no_update():
    """Along an exactly tracked trajectory with the true torque (pinocchio RNEA), the
    composite law's prediction error is O(h^2) and the update vanishes."""
    model = RobotModel("panda")
    ctl = AdaptiveController(model, "composite", pi0=model.parameters, p0=1.0, r=10.0)
    traj = fourier(model, period=4.0)
    m = pin.buildModelFromUrdf(model.urdf_path)
    d = m.createData()
    ts = np.arange(1500) * DT
    Q, V, A = traj.sample_many(ts)
    worst_e, worst_dpi, scale = 0.0, 0.0, 0.0
    for k in range(len(ts)):
        tau = pin.rnea(m, d, Q[k], V[k], A[k])
        ctl.compute(Q[k], V[k], Q[k], V[k], A[k], tau_measured=tau)
        np.testing.assert_allclose(ctl.s, 0.0, atol=1e-15)
        if k > 100:  # filter warmed up
            worst_e = max(worst_e, np.abs(ctl.prediction_error).max())
            worst_dpi = max(worst_dpi, np.abs(ctl.last_delta_pi).max())
            scale = max(scale, np.abs(ctl.filter.tau_f).max())
    assert worst_e < 1e-4 * scale, (worst_e, scale)
    assert worst_dpi < 1e-6
    np.testing.assert_allclose(ctl.theta, ctl.base.to_base(model.parameters), atol=1e-5)


def test_last_delta_pi_is_the_full_coordinates_of_the_base_update():
    model = RobotModel("panda", friction=True)
    ctl = AdaptiveController(model, "direct", gamma=0.5)
    rng = np.random.default_rng(1)
    q, v, a = model.random_state(rng)
    ctl.compute(q, v, q + 0.05, v - 0.1, a)
    assert np.abs(ctl.last_delta_theta).max() > 0
    for _ in range(5):
        x = model.random_state(rng)
        Y = model.regressor(*x)
        np.testing.assert_allclose(Y @ ctl.last_delta_pi, Y[:, ctl.index] @ ctl.last_delta_theta, atol=1e-12)
    np.testing.assert_allclose(ctl.base.to_base(ctl.last_delta_pi), ctl.last_delta_theta, atol=1e-12)


# ----------------------------------------------------------------------------- closed loop
def test_true_parameters_track_panda_in_mujoco():
    """Exact parameters, no learning, no friction: the sliding-mode closed loop
    M s' + (C + K_D) s = 0 drives an initial error to zero on the real (MuJoCo) arm."""
    model = RobotModel("panda")
    ctl = AdaptiveController(model, "direct", lam=10.0, kd=[30, 30, 20, 20, 4, 4, 1], pi0=model.parameters)
    traj = fourier(model, period=8.0, amplitude=0.6)
    ts, E = closed_loop("panda", ctl, traj, 1.5, learn=False, q0_offset=np.full(7, 0.02))
    en = np.linalg.norm(E, axis=1)
    assert en[0] > 0.05
    # what remains is the O(dt) error of the sampled (zero-order-hold) loop: ~1e-4 rad
    assert en[ts > 1.0].max() < 1e-2 * en[0]
    assert en[ts > 1.0].max() < 5e-4


def test_direct_law_lyapunov_function_decreases():
    """V = 1/2 s^T M s + 1/2 theta~^T Gamma^-1 theta~ is non-increasing (V' = -s^T K_D s)
    for the direct law on the MuJoCo plant: checks the sign convention of the update."""
    model = RobotModel("planar2")
    gamma = 2.0
    kd = np.array([10.0, 5.0])
    ctl = AdaptiveController(model, "direct", lam=5.0, kd=kd, gamma=gamma)
    theta = ctl.base.to_base(model.parameters)
    traj = fourier(model, period=4.0, amplitude=0.5)
    m = pin.buildModelFromUrdf(model.urdf_path)
    d = m.createData()
    V, dissip = [], []

    def record(k, plant, c):
        q, _ = plant.true_state()
        M = pin.crba(m, d, q)
        M = np.triu(M) + np.triu(M, 1).T
        tt = c.theta - theta
        # s and theta of the step *before* the update of this cycle was applied
        th_prev = tt - c.last_delta_theta
        V.append(0.5 * c.s @ M @ c.s + 0.5 * th_prev @ th_prev / gamma)
        dissip.append(c.s @ (kd * c.s))

    closed_loop("planar2", ctl, traj, 3.0, on_step=record)
    V = np.array(V)
    dV = np.diff(V)
    assert V[-1] < 0.5 * V[0]
    # the discrete V may rise by O(h^2) per step; the continuous bound is V' = -s^T K_D s
    assert dV.max() < 1e-3 * V[0], dV.max() / V[0]
    assert np.sum(np.maximum(dV, 0)) < 1e-2 * (V[0] - V[-1])
    # and the decrease matches the dissipation integral within 5 %
    np.testing.assert_allclose(V[0] - V[-1], DT * np.sum(dissip[:-1]), rtol=0.05)


PLANAR_GAINS = dict(lam=10.0, kd=[10.0, 5.0], gamma=2.0, p0=1.0, r=10.0, lambda0=0.5, k0=200.0, k1=100.0)


@pytest.fixture(scope="module")
def planar_feedback_rmse():
    """Last-3-s RMSE of the pure feedback loop (pi_hat = 0, no learning = the PD -K_D s)."""
    model = RobotModel("planar2")
    ctl = AdaptiveController(model, "direct", **PLANAR_GAINS)
    ts, E = closed_loop("planar2", ctl, fourier(model, period=3.0, amplitude=0.7), 9.0, learn=False)
    return rmse(E[ts >= 6.0]).mean()


@pytest.mark.parametrize("law", ["direct", "composite"])
def test_zero_initial_estimate_converges_planar2(law, planar_feedback_rmse):
    """pi_hat(0) = 0 (ARDL): both laws cut the tracking error of pure feedback by far
    within 9 s, and the composite law identifies the base parameters (persistent
    excitation, no friction)."""
    model = RobotModel("planar2")
    ctl = AdaptiveController(model, law, **PLANAR_GAINS)
    ts, E = closed_loop("planar2", ctl, fourier(model, period=3.0, amplitude=0.7), 9.0)
    last = rmse(E[ts >= 6.0]).mean()
    theta = ctl.base.to_base(model.parameters)
    err = np.linalg.norm(ctl.theta - theta) / np.linalg.norm(theta)
    if law == "composite":
        assert last < 0.005 * planar_feedback_rmse, (last, planar_feedback_rmse)
        assert err < 0.01, err
    else:
        assert last < 0.05 * planar_feedback_rmse, (last, planar_feedback_rmse)
        assert err < 0.5, err  # bounded; the direct law alone converges slowly


def test_composite_pd_covariance_stays_spd_and_bounded():
    """P stays symmetric positive definite and below max(|P0|, k1 e^(lambda0 dt)) in
    the spectral norm, both under rich excitation and with none (P grows in unexcited
    directions until forgetting stops at k1)."""
    model = RobotModel("panda", friction=True)
    p0, k1, lambda0 = 2.0, 20.0, 5.0
    ctl = AdaptiveController(model, "composite", p0=p0, r=3.0, lambda0=lambda0, k0=40.0, k1=k1,
                             refactor_every=250)
    rng = np.random.default_rng(0)
    bound = max(p0, k1 * math.exp(lambda0 * DT)) * (1 + 1e-9)
    q0 = model.random_state(rng)[0]
    for k in range(3000):
        if k < 1000:  # rich: random states and torques
            q, v, a = model.random_state(rng)
            tau = 20 * rng.standard_normal(7)
        else:         # none: robot at rest
            q, v, tau = q0, np.zeros(7), model.gravity(q0)
        ctl.compute(q, v, q, v, np.zeros(7), tau_measured=tau)
        if k % 97 == 0 or k == 2999:
            P = ctl.P
            assert np.array_equal(P, P.T)
            ev = np.linalg.eigvalsh(P)
            assert ev[0] > 0
            assert ev[-1] <= bound, (k, ev[-1], bound)
            np.testing.assert_allclose(P @ ctl.P_inv, np.eye(len(P)), atol=1e-6 * np.linalg.cond(P))
        if k == 999:
            rich = np.linalg.eigvalsh(ctl.P)[0]
    assert rich < 1e-2 * p0           # excitation shrank P
    assert ctl.p_norm > 0.9 * k1      # without excitation it grew to the forgetting bound ...
    assert ctl.forgetting == 0.0 or ctl.p_norm <= k1  # ... where forgetting is switched off


def _prior_controller(forget_to, lambda0=0.5, p0=None):
    """Panda composite controller with a constant forgetting rate (k0, k1 huge) fed
    external W, tau_f at s = 0 (q = q_d, v = v_d, a_d = 0): the update is the
    prediction-error term (+ the prior pull) alone."""
    model = RobotModel("panda")
    ctl = AdaptiveController(model, "composite", r=2.0, lambda0=lambda0, k0=1e12, k1=1e12,
                             p0=1.0 if p0 is None else p0, pi0=model.parameters, forget_to=forget_to)
    return model, ctl


def _feed(model, ctl, steps, rng, cols, theta_true, Wlog=None):
    q = np.zeros(7)
    Y = np.zeros((7, model.n_params))
    for _ in range(steps):
        W = np.zeros((7, model.n_params))
        Wb = rng.standard_normal((7, len(cols)))
        W[:, ctl.index[cols]] = Wb
        tau_f = Wb @ theta_true[cols]
        ctl.compute(q, q, q, q, q, Y=Y, W=W, tau_f=tau_f)
        if Wlog is not None:
            Wlog.append((Wb, tau_f))


def test_forget_to_prior_is_least_squares_with_an_unforgotten_prior():
    """forget_to "prior": P^-1 is the exact ZOH solution of d/dt P^-1 = -lambda (P^-1 - P0^-1)
    + W^T R W (up to the pending prior mass, which it reports), and theta_hat the
    regularised least squares P (P0^-1 theta_0 + sum a^(N-k) c W_k^T R tau_f,k) to the
    first order in dt; forget_to "zero" keeps ARDL's P^-1 = a^N P0^-1 + data."""
    rng = np.random.default_rng(3)
    lam, N, h = 0.5, 1500, DT
    a, c = math.exp(-lam * h), -math.expm1(-lam * h) / lam
    for forget_to in ("zero", "prior"):
        model, ctl = _prior_controller(forget_to, lam, p0=1.5)
        b = ctl.n_adapted
        cols = np.arange(b // 2)   # the first half of the base parameters is excited
        theta_true = ctl.theta + 0.3 * rng.standard_normal(b)
        theta0 = ctl.theta.copy()
        log = []
        _feed(model, ctl, N, np.random.default_rng(4), cols, theta_true, log)
        P0i = np.eye(b) / 1.5
        info = (a ** N) * P0i + ((1 - a ** N) * P0i if forget_to == "prior" else 0.0)
        rhs = info @ theta0
        for k, (Wb, tau_f) in enumerate(log):
            w = (a ** (N - 1 - k)) * c
            Wf = np.zeros((7, b))
            Wf[:, cols] = Wb
            info = info + w * 2.0 * Wf.T @ Wf
            rhs = rhs + w * 2.0 * Wf.T @ tau_f
        pending = ctl._prior_mass * P0i if forget_to == "prior" else 0.0
        np.testing.assert_allclose(ctl.P_inv + pending, info, rtol=1e-9, atol=1e-9)
        batch = np.linalg.solve(info, rhs)
        np.testing.assert_allclose(ctl.theta, batch, atol=2e-3)
        # unexcited directions: "prior" never lets P exceed P0, "zero" lets it grow
        grow = np.linalg.eigvalsh(ctl.P)[-1]
        if forget_to == "prior":
            assert grow <= 1.5 * (1 + PRIOR_SLACK), grow
        else:
            assert grow > 1.5 * math.exp(0.9 * lam * N * h), grow


PRIOR_SLACK = 0.011   # P lags its floor by at most the injection mass (PRIOR_INJECT)


def test_forget_to_prior_returns_unexcited_directions_to_the_prior_at_the_forgetting_rate():
    """Directions the data never excite: with "prior" the estimate returns to theta_0 as
    (1 - lambda dt)^N (P = P0 there, the pull lambda P P0^-1 (theta - theta_0); P lags its
    floor by the injection mass between injections); with
    "zero" it stays where it was; the excited directions approach the truth either way."""
    lam, N = 0.5, 2000
    for forget_to in ("zero", "prior"):
        model, ctl = _prior_controller(forget_to, lam)
        b = ctl.n_adapted
        cols = np.arange(b // 2)
        free = np.arange(b // 2, b)
        rng = np.random.default_rng(5)
        theta_true = ctl.theta + 0.2 * rng.standard_normal(b)
        start = ctl.theta + 0.1 * rng.standard_normal(b)
        ctl.set_estimate(theta=start)          # the prior stays the URDF's
        _feed(model, ctl, N, rng, cols, theta_true)
        err = np.abs(ctl.theta[cols] - theta_true[cols])
        assert err.max() < 0.1 * np.abs(start[cols] - theta_true[cols]).max(), err.max()   # (a prior's bias)
        moved = ctl.theta[free] - ctl.theta_prior[free]
        if forget_to == "prior":
            decay = (1 - lam * DT) ** N
            np.testing.assert_allclose(moved, decay * (start[free] - ctl.theta_prior[free]), rtol=PRIOR_SLACK)
        else:
            np.testing.assert_allclose(ctl.theta[free], start[free], atol=1e-12)


def test_forget_to_prior_survives_save_and_load(tmp_path):
    model, ctl = _prior_controller("prior")
    ctl.set_prior(theta=ctl.theta * 1.1)
    _feed(model, ctl, 50, np.random.default_rng(0), np.arange(5), ctl.theta)
    path = ctl.save(tmp_path / "est")
    new = AdaptiveController.load(path, RobotModel("panda"))
    assert new.forget_to == "prior"
    np.testing.assert_array_equal(new.theta_prior, ctl.theta_prior)
    with pytest.raises(ValueError, match="forget_to must be one of"):
        new.forget_to = "one"
    # a file written before forget_to: its estimate is the prior
    d = dict(np.load(path))
    del d["theta_prior"]
    np.savez(tmp_path / "old.npz", **d)
    old = AdaptiveController(model, "composite", forget_to="prior")
    old.load_state(tmp_path / "old.npz")
    np.testing.assert_array_equal(old.theta_prior, ctl.theta)


@pytest.mark.parametrize("law", ["direct", "composite"])
def test_adapt_to_feedforward_adapts_on_the_sliding_variable_the_feedback_would_have_had(law):
    """compute(feedforward=f): the command gains f exactly; the update is unchanged
    unless adapt_to_feedforward, then it is the one of s - K_D^-1 f (the s-driven
    term is linear in s: the difference is dt Gamma Y^T K_D^-1 f, P for composite)."""
    model = RobotModel("panda")
    kd = np.array([30.0, 30.0, 20.0, 20.0, 4.0, 4.0, 1.0])
    f = np.array([0.5, -1.0, 0.3, 0.8, -0.2, 0.1, 0.05])
    args = _state(model, 7)
    out = {}
    for name, ff, adapt in (("none", None, False), ("added", f, False), ("adapted", f, True)):
        ctl = AdaptiveController(model, law, kd=kd, gamma=0.5, pi0=model.parameters, adapt_to_feedforward=adapt)
        tau = ctl.compute(*args, feedforward=ff)
        out[name] = (tau, ctl.last_delta_theta.copy(), ctl)
    np.testing.assert_allclose(out["added"][0] - out["none"][0], f, atol=1e-12)
    np.testing.assert_array_equal(out["added"][1], out["none"][1])
    np.testing.assert_array_equal(out["adapted"][0], out["added"][0])
    ctl = out["adapted"][2]
    q, v, q_d, v_d, a_d = args[:5]
    e, ed = q_d - q, v_d - v
    Yb = model.slotine_li_regressor(q, v, v_d + ctl.lam @ e, a_d + ctl.lam @ ed)[:, ctl.index]
    gain = ctl.P if law == "composite" else ctl.gamma
    np.testing.assert_allclose(out["adapted"][1] - out["none"][1], DT * gain @ Yb.T @ (f / kd), rtol=1e-9, atol=1e-15)
    with pytest.raises(ValueError, match="feedforward must be"):
        ctl.compute(*args, feedforward=np.full(7, np.nan))


def test_fixed_friction_is_fed_forward_and_left_out_of_what_the_estimate_learns():
    """fixed_friction tau_s(qd): the command gains tau_s(qd) at the measured velocity, and
    the composite law learns exactly as a controller fed tau_measured - tau_s(qd)."""
    from adaptive_dynamics.dynamics.joint_friction import SigmoidFriction
    model = RobotModel("panda", friction=True)
    fs = SigmoidFriction([0.05] * 7, [0.5, 0.9, 0.6, 1.3, 0.8, 0.3, 0.6], [5.1, 9.1, 10.1, 5.6, 8.3, 17.1, 10.3],
                         [0.04, 0.03, -0.05, 0.04, 0.03, -0.02, 0.0])
    a = AdaptiveController(model, "composite", pi0=model.parameters, forget_to="prior")
    b = AdaptiveController(model, "composite", pi0=model.parameters, forget_to="prior")
    a.fixed_friction = fs
    rng = np.random.default_rng(2)
    for _ in range(30):
        q, v, acc = model.random_state(rng)
        tau = model.inverse_dynamics(q, v, acc) + fs.torque(v[None])[0]
        ta = a.compute(q, v, q + 0.01, v, acc, tau_measured=tau)
        tb = b.compute(q, v, q + 0.01, v, acc, tau_measured=tau - fs.torque(v[None])[0])
        np.testing.assert_allclose(ta - tb, fs.torque(v[None])[0], atol=1e-9)
        np.testing.assert_allclose(a.theta, b.theta, rtol=0, atol=1e-12)
    assert np.any(a.theta != a.theta_prior)
    with pytest.raises(ValueError, match="internal filter"):
        a.compute(q, v, q, v, acc, Y=np.zeros((7, model.n_params)), W=np.zeros((7, model.n_params)),
                  tau_f=np.zeros(7))


# ----------------------------------------------------------------------------- external regressors
EXTERNAL_CASES = {
    "direct": dict(law="direct", gamma=0.5),
    "composite": dict(law="composite", p0=1.0, r=10.0, lambda0=0.5, k0=200.0, k1=100.0),
    "composite_full_frozen": dict(law="composite", base_parameters=False, max_tracking_error=0.03),
    "composite_projection": dict(law="composite", projection=True, projection_min_mass=0.01),
    "composite_franka": dict(law="composite", robot_compensates_gravity=True, refactor_every=50),
}


@pytest.mark.parametrize("case", list(EXTERNAL_CASES))
def test_external_regressors_equal_the_inprocess_path(case):
    """compute(Y=, W=, tau_f=) with the regressors computed outside (as the regressor node
    does: q_dr = qd_d + Lambda (q_d - q), its own filter) gives the in-process result."""
    kw = dict(EXTERNAL_CASES[case])
    law = kw.pop("law")
    model = RobotModel("panda", friction=True, coulomb_smoothing=0.01)
    lam = np.linspace(6.0, 12.0, 7)
    common = dict(lam=lam, kd=np.linspace(5.0, 20.0, 7), filter_lambda=25.0, pi0=0.5 * model.parameters, **kw)
    inproc = AdaptiveController(model, law, **common)
    ext = AdaptiveController(model, law, **common)
    filt = ext.model.filtered_regressor(25.0, DT)  # the "regressor node's" filter
    theta0 = inproc.theta.copy()
    traj = fourier(model, seed=4, period=2.0, amplitude=0.4)
    N = 300
    Q, V, A = traj.sample_many(np.arange(N) * DT)
    rng = np.random.default_rng(5)
    q = Q + 0.02 * np.sin(np.arange(N) * 0.05)[:, None] + 1e-3 * rng.standard_normal(Q.shape)
    v = V + 1e-2 * rng.standard_normal(V.shape)
    for k in range(N):
        tau_m = model.inverse_dynamics(q[k], v[k], A[k])
        learn = k % 50 != 7
        t_in = inproc.compute(q[k], v[k], Q[k], V[k], A[k], tau_m, learn=learn)
        vr = V[k] + lam * (Q[k] - q[k])
        ar = A[k] + lam * (V[k] - v[k])
        Y = ext.model.slotine_li_regressor(q[k], v[k], vr, ar)
        W, tau_f = filt.update(q[k], v[k], tau_m)
        if law == "direct":
            t_ex = ext.compute(q[k], v[k], Q[k], V[k], A[k], learn=learn, Y=Y)
        else:  # no measured torque needed: W and tau_f carry it
            t_ex = ext.compute(q[k], v[k], Q[k], V[k], A[k], learn=learn, Y=Y, W=W, tau_f=tau_f)
        scale = 1.0 + np.abs(t_in).max()
        np.testing.assert_allclose(t_ex, t_in, rtol=0, atol=1e-12 * scale, err_msg=f"{case} step {k}")
        np.testing.assert_allclose(ext.theta, inproc.theta, rtol=0, atol=1e-12 * (1 + np.abs(inproc.theta).max()))
        np.testing.assert_allclose(ext.last_delta_pi, inproc.last_delta_pi, rtol=0, atol=1e-14)
        assert ext.frozen == inproc.frozen and ext.updated == inproc.updated
    np.testing.assert_allclose(ext.P, inproc.P, rtol=0, atol=1e-12 * np.abs(inproc.P).max())
    np.testing.assert_allclose(ext.prediction_error, inproc.prediction_error, rtol=0, atol=1e-10)
    assert inproc.updates > 0 and np.abs(inproc.theta - theta0).max() > 1e-6  # the estimate did move
    if case == "composite_full_frozen":
        assert 0 < inproc.frozen_cycles < N
    if law == "composite":
        assert ext.filter.samples == 0  # the internal filter was not used
    assert ext.diagnostics() == inproc.diagnostics()


def test_external_regressors_are_validated_before_any_state_change():
    model = RobotModel("planar2")
    ctl = AdaptiveController(model, "composite")
    q, v, qd, vd, a, tau = _state(model)
    P = model.n_params
    for _ in range(3):
        ctl.compute(q, v, qd, vd, a, tau)
    snap = (ctl.theta.copy(), ctl.P.copy(), ctl.filter.W.copy(), ctl.filter.samples)
    Y = model.slotine_li_regressor(q, v, vd, a)
    W, tau_f = np.ones((2, P)), np.ones(2)
    bad = {
        "Y must have shape": dict(Y=np.zeros((2, P - 1))),
        "Y has non-finite": dict(Y=np.where(np.eye(2, P) > 0, np.nan, Y)),
        "W must have shape": dict(Y=Y, W=np.zeros((P, 2)), tau_f=tau_f),
        "tau_f has non-finite": dict(Y=Y, W=W, tau_f=np.array([0.0, np.inf])),
        "W and tau_f must be given together": dict(Y=Y, W=W),
    }
    for needle, kw in bad.items():
        with pytest.raises(ValueError, match=needle):
            ctl.compute(q, v, qd, vd, a, tau, **kw)
    np.testing.assert_array_equal(ctl.theta, snap[0])
    np.testing.assert_array_equal(ctl.P, snap[1])
    np.testing.assert_array_equal(ctl.filter.W, snap[2])
    assert ctl.filter.samples == snap[3] and ctl.rejected_inputs == len(bad)
    # composite learning: W + tau_f stand in for the measured torque; the filter is not advanced
    ctl.compute(q, v, qd, vd, a, Y=Y, W=W, tau_f=tau_f)
    assert ctl.updated and ctl.filter.samples == snap[3]
    # the direct law ignores W
    d = AdaptiveController(model, "direct")
    np.testing.assert_array_equal(d.compute(q, v, qd, vd, a, Y=Y, W=W, tau_f=tau_f),
                                  AdaptiveController(model, "direct").compute(q, v, qd, vd, a, Y=Y))


# ----------------------------------------------------------------------------- gains
def test_gain_validation_reasons_and_atomicity():
    model = RobotModel("planar2")
    ctl = AdaptiveController(model, "composite", kd=3.0)
    with pytest.raises(ValueError, match=r"kd is not positive definite \(eigenvalue -1 < 0\)"):
        ctl.set_gains(kd=-1.0)
    with pytest.raises(ValueError, match="lam is not symmetric"):
        ctl.set_gains(lam=[[1.0, 0.5], [0.0, 1.0]])
    with pytest.raises(ValueError, match=r"r is not positive definite \(eigenvalue 0 <= 0\)"):
        ctl.set_gains(r=[1.0, 0.0])
    with pytest.raises(ValueError, match="gamma must be finite"):
        ctl.set_gains(gamma=float("nan"))
    with pytest.raises(ValueError, match="p0 must be a scalar"):
        ctl.set_gains(p0=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="lambda0 must be >= 0"):
        ctl.set_gains(lambda0=-0.1)
    with pytest.raises(ValueError, match="unknown gain"):
        ctl.set_gains(kp=1.0)
    # all-or-nothing: a good kd with a bad lam changes nothing
    with pytest.raises(ValueError, match="lam"):
        ctl.set_gains(kd=7.0, lam=[[1.0, 2.0], [2.0, 1.0]])  # eigenvalue -1
    np.testing.assert_array_equal(ctl.kd, 3.0 * np.eye(2))
    ctl.set_gains(kd=[4.0, 5.0], lam=[[2.0, 0.5], [0.5, 2.0]], filter_lambda=30.0)
    np.testing.assert_array_equal(ctl.kd, np.diag([4.0, 5.0]))
    assert ctl.filter.lam == 30.0
    with pytest.raises(ValueError, match="unknown adaptive law"):
        AdaptiveController(model, "pd")
    np.testing.assert_array_equal(spd_gain([1, 0, 0, 2], 2, "x"), [[1, 0], [0, 2]])  # flattened matrix


# ----------------------------------------------------------------------------- safety
def _state(model, seed=0):
    rng = np.random.default_rng(seed)
    q, v, a = model.random_state(rng)
    return q, v, q + 0.05, v + 0.1, a, model.inverse_dynamics(q, v, a) + 1.0


def test_non_finite_inputs_rejected_and_estimate_untouched():
    model = RobotModel("planar2")
    ctl = AdaptiveController(model, "composite")
    args = _state(model)
    for _ in range(5):
        ctl.compute(*args)
    snap = (ctl.theta.copy(), ctl.P.copy(), ctl.filter.W.copy(), ctl.filter.tau_f.copy(), ctl.filter.samples)
    names = ["q", "v", "q_d", "v_d", "a_d", "tau_measured"]
    for i, name in enumerate(names):
        for bad in (np.nan, np.inf):
            a = [np.array(x, dtype=float) for x in args]
            a[i][1] = bad
            with pytest.raises(ValueError, match=name):
                ctl.compute(*a)
    with pytest.raises(ValueError, match="q"):
        ctl.compute(np.zeros(3), *args[1:])
    with pytest.raises(ValueError, match="v"):
        ctl.compute(args[0], np.zeros(1), *args[2:])  # length 1 must not broadcast
    np.testing.assert_array_equal(ctl.theta, snap[0])
    np.testing.assert_array_equal(ctl.P, snap[1])
    np.testing.assert_array_equal(ctl.filter.W, snap[2])
    np.testing.assert_array_equal(ctl.filter.tau_f, snap[3])
    assert ctl.filter.samples == snap[4]
    assert ctl.rejected_inputs == 14
    with pytest.raises(ValueError, match="tau_measured"):
        ctl.compute(*args[:5])  # composite needs the measured torque to learn
    ctl.compute(*args[:5], learn=False)  # ... not without learning


def test_freeze_on_large_tracking_error_and_learn_off():
    model = RobotModel("planar2")
    q, v, qd, vd, a, tau = _state(model)
    ctl = AdaptiveController(model, "direct", max_tracking_error=0.01)
    ref = AdaptiveController(model, "direct")
    th0 = ctl.theta.copy()
    out = ctl.compute(q, v, qd, vd, a, tau)
    assert ctl.frozen and "max_tracking_error" in ctl.freeze_reason and ctl.frozen_cycles == 1
    np.testing.assert_array_equal(ctl.theta, th0)
    np.testing.assert_array_equal(ctl.last_delta_pi, 0.0)
    np.testing.assert_allclose(out, ref.compute(q, v, qd, vd, a, tau, learn=False))  # torque still computed
    np.testing.assert_array_equal(ref.theta, th0)  # learn=False: no update either
    out2 = ctl.compute(q, v, q + 1e-3, vd, a, tau)  # error back under the bound
    assert not ctl.frozen and ctl.freeze_reason == ""
    assert np.abs(ctl.theta - th0).max() > 0
    assert np.all(np.isfinite(out2))


# ----------------------------------------------------------------------------- projection
def test_projection_helpers_roundtrip_and_clip():
    model = RobotModel("panda")
    pi = model.parameters
    J = pseudo_inertias(pi, 7)
    for i in range(7):
        np.testing.assert_allclose(J[i], pseudo_inertia(pi[10 * i: 10 * i + 10]), atol=1e-14)
    x = pi.copy()
    assert not project_consistent(x, 7)  # consistent: unchanged
    np.testing.assert_array_equal(x, pi)
    bad = pi.copy()
    bad[4] = -1.0   # link 1 Ixx < 0
    bad[10] = -0.5  # link 2 mass < 0
    assert consistency_margins(bad, 7)[:2].max() < 0
    assert project_consistent(bad, 7, min_mass=1e-3)
    assert consistency_margins(bad, 7).min() >= -1e-12
    assert bad[10] >= 1e-3
    np.testing.assert_array_equal(bad[20:], pi[20:])  # untouched links stay bit-identical


def test_projection_keeps_estimate_physical_without_hurting_tracking():
    """Full-pi adaptation with a high gain from pi_hat(0) = 0: the plain direct law
    wanders into non-physical parameters (negative pseudo-inertia eigenvalues); with
    the projection every link stays consistent and tracking is no worse."""
    model = RobotModel("planar2")
    traj = fourier(model, period=3.0, amplitude=0.8)
    results = {}
    for proj in (False, True):
        ctl = AdaptiveController(model, "direct", lam=10.0, kd=[10.0, 5.0], gamma=20.0,
                                 base_parameters=False, projection=proj)
        worst = [np.inf]

        def watch(k, plant, c, worst=worst):
            if k % 50 == 0:
                worst[0] = min(worst[0], consistency_margins(c.theta, 2).min())

        ts, E = closed_loop("planar2", ctl, traj, 6.0, on_step=watch)
        results[proj] = (worst[0], rmse(E[ts >= 3.0]).mean(), ctl)
    assert results[False][0] < -1e-3, results[False][0]  # unprojected: inconsistent at some point
    assert results[True][0] >= -1e-12
    assert results[True][2].projections > 0
    assert results[True][1] <= 1.1 * results[False][1], (results[True][1], results[False][1])


# ----------------------------------------------------------------------------- persistence
def test_save_load_roundtrip_and_layout_checks(tmp_path):
    model = RobotModel("planar2")
    ctl = AdaptiveController(model, "composite", kd=[4.0, 3.0], r=5.0, lambda0=0.3)
    args = _state(model, 2)
    for k in range(20):
        ctl.compute(args[0] + 1e-3 * k, *args[1:])
    path = ctl.save(tmp_path / "est")
    assert path.endswith(".npz")
    new = AdaptiveController.load(path, RobotModel("planar2"))
    assert new.law == "composite"
    np.testing.assert_array_equal(new.theta, ctl.theta)
    np.testing.assert_array_equal(new.P, ctl.P)
    np.testing.assert_array_equal(new.kd, ctl.kd)
    assert new.lambda0 == 0.3 and new.parameter_names == ctl.parameter_names
    np.testing.assert_array_equal(new.compute(*args, learn=False), ctl.compute(*args, learn=False))
    # load_state into a fresh controller: the estimate survives a restart
    fresh = AdaptiveController(model, "direct")
    fresh.load_state(path)
    np.testing.assert_array_equal(fresh.pi, ctl.pi)
    with pytest.raises(ValueError, match="parameter layout differs"):
        AdaptiveController(model, "direct", friction=True).load_state(path)
    # the Coulomb column's shape is saved with the estimate (identify --arm-estimate takes it)
    shaped = AdaptiveController(RobotModel("planar2", friction=True, coulomb_smoothing=0.02), "direct")
    with np.load(shaped.save(tmp_path / "shaped")) as d:
        assert float(d["coulomb_smoothing"]) == 0.02 and bool(d["friction"])
    with pytest.raises(ValueError, match="robot 'planar2'"):
        AdaptiveController(RobotModel("panda"), "direct").load_state(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not an adaptive-controller state file"):
        fresh.load_state(tmp_path / "junk.npz")


# ----------------------------------------------------------------------------- franka mode
def test_robot_compensates_gravity_consistency():
    model = RobotModel("planar2")
    q, v, qd, vd, a, tau = _state(model, 4)
    full = AdaptiveController(model, "direct", pi0=model.parameters)
    fr = AdaptiveController(model, "direct", pi0=model.parameters, robot_compensates_gravity=True)
    t_full = full.compute(q, v, qd, vd, a, tau, learn=False)
    t_fr = fr.compute(q, v, qd, vd, a, tau, learn=False)
    np.testing.assert_allclose(fr.gravity_torque, model.gravity(q), atol=1e-10)
    np.testing.assert_allclose(t_fr + fr.gravity_torque, t_full, atol=1e-10)
    np.testing.assert_allclose(fr.parametric_torque, full.parametric_torque)  # model stays the full dynamics

    # closed loop where the robot adds its own (exact) g(q) and reports the full torque:
    # from pi_hat(0) = 0 the composite law still learns the full model, gravity included
    ctl = AdaptiveController(model, "composite", lam=10.0, kd=[10.0, 5.0], p0=1.0, r=10.0, lambda0=0.5,
                             robot_compensates_gravity=True)
    traj = fourier(model, period=3.0, amplitude=0.8)
    ts, E = closed_loop("planar2", ctl, traj, 9.0, robot_gravity=True)
    assert rmse(E[ts >= 6.0]).mean() < 0.05 * rmse(E[ts < 3.0]).mean()
    theta = ctl.base.to_base(model.parameters)
    assert np.linalg.norm(ctl.theta - theta) / np.linalg.norm(theta) < 0.02


# ----------------------------------------------------------------------------- adapted_links
@pytest.mark.parametrize("base", [True, False])
def test_adapting_every_link_is_the_default_law(base):
    """adapted_links naming every link is the whole-model controller, step for step."""
    model = RobotModel("panda", friction=True)
    pi0 = 0.8 * model.parameters
    a = AdaptiveController(model, "composite", pi0=pi0, base_parameters=base, p0=0.5)
    b = AdaptiveController(model, "composite", pi0=pi0, base_parameters=base, p0=0.5,
                           adapted_links=list(model.link_names))
    assert b.n_adapted == a.n_adapted and b.parameter_names == a.parameter_names
    rng = np.random.default_rng(5)
    for _ in range(20):
        q, v, qd = *model.random_state(rng)[:2], model.random_state(rng)[0]
        tau = rng.standard_normal(7)
        np.testing.assert_allclose(b.compute(q, v, qd, v, 0 * v, tau), a.compute(q, v, qd, v, 0 * v, tau),
                                   rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(b.pi, a.pi, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("base, projection", [(True, False), (False, False), (False, True)])
def test_adapted_links_hold_the_rest_and_update_only_their_columns(base, projection):
    """Only the named block (the hand names the last link's) and friction move; the torque
    is the Slotine-Li torque of the whole estimate (pinocchio on a model with that pi);
    the composite prediction error includes the fixed part."""
    model = RobotModel("panda", friction=True)
    truth = model.parameters
    pi0 = truth.copy()
    pi0[60] *= 0.5                         # the hand's link is wrong
    ctl = AdaptiveController(model, "composite", pi0=pi0, adapted_links=["panda_hand"], base_parameters=base,
                             projection=projection, p0=0.5)
    assert ctl.adapted_links == ["panda_link7"]
    cols = np.r_[60:70, 70:84]
    assert set(ctl.index) <= set(cols) and ctl.n_adapted == (24 if not base else ctl.base.n_base)
    rng = np.random.default_rng(6)
    check = RobotModel("panda", friction=True)
    for k in range(30):
        q, v, a = model.random_state(rng)
        qd = q + 0.05 * rng.standard_normal(7)
        est = ctl.pi
        tau_m = rng.standard_normal(7) * 5
        tau = ctl.compute(q, v, qd, v, a, tau_m)
        check.set_parameters(est, check=False)
        Y = check.slotine_li_regressor(q, v, ctl.qd_r, ctl.qdd_r)
        np.testing.assert_allclose(ctl.parametric_torque, Y @ est, rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(tau, Y @ est - ctl.kd @ ctl.s, rtol=1e-9, atol=1e-9)
        W, tau_f = ctl.filter.W, ctl.filter.tau_f
        np.testing.assert_allclose(ctl.prediction_error, W @ est - tau_f, rtol=1e-9, atol=1e-9)
        moved = np.flatnonzero(ctl.pi != est)
        assert moved.size and set(moved) <= set(cols), moved
    np.testing.assert_array_equal(np.delete(ctl.pi, cols), np.delete(pi0, cols))


def test_adapted_links_estimate_an_unknown_tool_on_the_mujoco_panda(tmp_path):
    """A 0.8 kg tool off the flange axis that the model does not have: adapting link 7
    (the hand's block) alone, from the URDF, finds the block's true mass and centre of
    mass (URDF block + the plant's payload, rigid-body sum) with both laws; the state file
    keeps the adapted links and the fixed part, and refuses another choice."""
    from adaptive_dynamics.control.gains import default_gains
    model = RobotModel("panda")
    reality = RealityConfig(payload_mass=0.8, payload_com=[0.05, 0.0, 0.15], payload_frame="panda_link7",
                            payload_enabled=True)
    truth = model.get_link_parameters("panda_link7") + MujocoPlant("panda", reality=reality).payload_parameters()
    kd = default_gains(model)["kd"]
    traj = fourier(model, period=4.0, amplitude=0.6)
    for law, extra in (("composite", dict(p0=1.0, lambda0=0.0, projection=True)), ("direct", dict(gamma=5.0))):
        ctl = AdaptiveController(model, law, lam=10.0, kd=kd, pi0=model.parameters, adapted_links=["panda_link7"],
                                 **extra)
        closed_loop("panda", ctl, traj, 8.0, reality=reality)
        est = ctl.link_estimate("panda_link7")
        assert abs(est["mass"] - truth[0]) < 0.03 * truth[0], (law, est)
        assert np.linalg.norm(np.array(est["com"]) - truth[1:4] / truth[0]) < 0.01, (law, est)
    path = ctl.save(tmp_path / "tool")
    again = AdaptiveController.load(path, RobotModel("panda"))
    assert again.adapted_links == ["panda_link7"]
    np.testing.assert_array_equal(again.pi, ctl.pi)
    with pytest.raises(ValueError, match="adapted_links"):
        AdaptiveController(model, "direct", adapted_links=["panda_link6"], gamma=5.0).load_state(path)
    with pytest.raises(ValueError, match="unknown link 'wrist'"):
        AdaptiveController(model, "direct", adapted_links=["wrist"])


def test_nominal_gamma_scale_is_the_squared_floored_size_of_each_adapted_parameter():
    """Base combinations (K pi), full columns or the adapted link's: |value|, floored at a
    fraction of the largest, squared; friction entries 1."""
    model = RobotModel("panda", friction=True)
    pi = model.parameters
    for kw in (dict(), dict(base_parameters=False), dict(adapted_links=["panda_link7"], base_parameters=False)):
        ctl = AdaptiveController(model, "direct", **kw)
        got = ctl.nominal_gamma_scale(pi, floor=0.05)
        K = ctl.base.K if ctl.use_base else np.eye(pi.size)[ctl.index if ctl.index is not None else slice(None)]
        size = np.abs(K @ pi)
        want = np.maximum(size, 0.05 * size.max()) ** 2
        friction = np.array([n.split(" ")[0].endswith((".fv", ".fc")) for n in ctl.parameter_names])
        assert friction.sum() == 14
        want[friction] = 1.0
        np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=str(kw))

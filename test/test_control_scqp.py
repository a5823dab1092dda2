"""SCQP's residual inverse-dynamics model (eq. 10-16) and the episodic loop
(Algorithm 1): the sign convention of the target against MuJoCo's dynamics with an
unmodelled payload and friction, the q-dot-dot block of the gradient against finite
differences, persistence, and episodes on the MuJoCo Panda."""
from __future__ import annotations

import numpy as np
import pytest

from adaptive_dynamics.control.scqp import ResidualModel, SCQPController
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig

Q0 = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
REALITY = RealityConfig(payload_mass=1.0, payload_enabled=True, friction_viscous=0.3, friction_coulomb=0.5,
                        coulomb_smoothing=0.05)


@pytest.fixture(scope="module")
def panda():
    return RobotModel("panda")


def _excite(plant, model, seconds, rng):
    """Gravity compensation of the (payload-free) model + a PD around a moving target:
    (q, v, true qdd, tau) per 1 ms step."""
    out = []
    q_ref = Q0.copy()
    for k in range(int(seconds * 1000)):
        if k % 300 == 0:
            q_ref = Q0 + rng.normal(0, 0.25, 7)
        q, v = plant.true_state()
        plant.step(model.gravity(q) + 60.0 * (q_ref - q) - 8.0 * v)
        out.append((q, v, plant.acceleration, plant.state()[3]))     # the torque applied (saturated)
    return out


def test_residual_target_sign_and_what_the_gp_learns(panda):
    """e = tau - h_bar(q, qd, qdd): the torque MuJoCo needed beyond the rigid-body model
    (payload + friction); learned by the GP, h_bar + e_h predicts held-out torques."""
    plant = MujocoPlant("panda", reality=REALITY, q0=Q0)
    rng = np.random.default_rng(0)
    data = _excite(plant, panda, 6.0, rng)
    res = ResidualModel(panda, subsample=5, max_points=1200)
    test = data[2::31]                      # between the kept samples (every 5th from 0)
    kept = sum(res.add(*s) for s in data)
    assert kept == 1200 and res.pending == 1200 and res.n_points == 0
    # before any fit: the prior model alone
    e0, E0 = res.predict(*test[0][:3])
    assert not e0.any() and not E0.any()
    assert res.refit() == 1200 and res.pending == 0
    q, v, a, tau = (np.array(x) for x in zip(*test))
    target = tau - np.array([panda.inverse_dynamics(*s) for s in zip(q, v, a)])
    # the sign: the missing torque is what the payload and the friction need
    fr = 0.3 * v + 0.5 * np.tanh(v / 0.05)
    import pinocchio as pin
    with_payload = RobotModel("panda")     # the plant's payload: 1 kg sphere (r = 2 cm) at the EE origin
    with_payload.set_payload(pin.Inertia(1.0, np.zeros(3), 0.4 * 0.02 ** 2 * np.eye(3)).toDynamicParameters(),
                             plant.payload_frame)
    truth = np.array([with_payload.inverse_dynamics(*s) for s in zip(q, v, a)]) + fr \
        - np.array([panda.inverse_dynamics(*s) for s in zip(q, v, a)])
    np.testing.assert_allclose(target, truth, rtol=0, atol=1e-5)
    pred = np.array([res.predict(*s)[0] for s in zip(q, v, a)])
    nmse = np.mean((pred - target) ** 2, axis=0) / np.var(target, axis=0)
    assert np.mean(nmse) < 0.15, nmse
    # the qdd block of the gradient (eq. 16) against finite differences of predict
    e, E = res.predict(q[3], v[3], a[3])
    h = 1e-4
    fd = np.stack([(res.predict(q[3], v[3], a[3] + h * ei)[0] - res.predict(q[3], v[3], a[3] - h * ei)[0])
                   / (2 * h) for ei in np.eye(7)], axis=1)
    np.testing.assert_allclose(E, fd, rtol=1e-4, atol=1e-7)
    # persistence
    again = ResidualModel(panda)
    again.load_bytes(res.to_bytes())
    # reloaded GP: refactorised from the stored arrays, BLAS may sum in another order (~n eps)
    np.testing.assert_allclose(again.predict(q[5], v[5], a[5])[0], res.predict(q[5], v[5], a[5])[0],
                               rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="expected 6 -> 2"):
        ResidualModel(RobotModel("planar2")).load_bytes(res.to_bytes())


def test_subsampling_and_non_finite_samples(panda):
    res = ResidualModel(panda, subsample=5)
    z = np.zeros(7)
    kept = [res.add(Q0, z, z, z) for _ in range(10)]
    assert kept == [True, False, False, False, False, True, False, False, False, False]
    assert res.add(Q0 * np.nan, z, z, z) is False          # its turn, but never kept when NaN
    assert res.pending == 2
    with pytest.raises(ValueError):
        ResidualModel(panda, subsample=0)


def _episode(ctrl, plant, model, seconds=4.0):
    """One episode of the z-sinusoid (5 cm, 0.5 Hz) at 200 Hz, five 1 ms MuJoCo steps per
    cycle: the mean squared position error [m^2]."""
    plant.reset(Q0, np.zeros(7))
    x0 = model.frame_pose(Q0)[:3, 3]
    R0 = model.frame_pose(Q0)[:3, :3]
    ctrl.start_episode(Q0, np.zeros(7))
    w = 2 * np.pi * 0.5
    se = []
    for k in range(int(seconds / 0.005)):
        t = k * 0.005
        q, v = plant.true_state()
        x_d = x0 + [0.0, 0.0, 0.05 * np.sin(w * t)]
        tau = ctrl.compute(q, v, x_d, [0.0, 0.0, 0.05 * w * np.cos(w * t)], [0.0, 0.0, -0.05 * w * w * np.sin(w * t)],
                        R_d=R0)
        assert np.isfinite(tau).all()
        for _ in range(5):
            plant.step(tau)
        se.append(np.sum((model.frame_pose(q)[:3, 3] - x_d) ** 2))
    ctrl.end_episode()
    return float(np.mean(se))


@pytest.mark.parametrize("mode", ["gp_pid", "scqp"])
def test_episodes_learn_the_unmodelled_payload_and_friction(panda, mode):
    """Algorithm 1 on the MuJoCo Panda with an unmodelled 1 kg payload and joint friction:
    the GP refitted between episodes cuts the tracking error, the QP never fails."""
    plant = MujocoPlant("panda", reality=REALITY, q0=Q0)
    ctrl = SCQPController(panda, dt=0.005, mode=mode, kp_task=100.0, kd_task=20.0,
                          qp={"q_posture": Q0}, residual={"subsample": 4})
    errs = [_episode(ctrl, plant, panda) for _ in range(3)]
    assert ctrl.qp.fallbacks == 0 and ctrl.episode == 3
    assert ctrl.residual.n_points == 2 * 200 + 200      # 800 cycles / 4 per episode, 3 episodes
    assert errs[2] < 0.3 * errs[0], errs


def test_refit_off_the_control_thread_equals_refit(panda):
    """begin_refit / RefitJob.run / finish_refit (what a node runs on a worker thread)
    gives the GP refit() gives; the GP in use is untouched until the swap; a failed job's
    samples go back to the pending ones; pending samples survive a save/restore."""
    rng = np.random.default_rng(2)
    samples = [(Q0 + rng.normal(0, 0.1, 7), rng.normal(0, 0.3, 7), rng.normal(0, 1.0, 7), rng.normal(0, 5.0, 7))
               for _ in range(120)]
    a, b = ResidualModel(panda, subsample=2), ResidualModel(panda, subsample=2)
    for s in samples[:60]:
        a.add(*s)
        b.add(*s)
    a.refit()
    b.refit()
    for s in samples[60:]:
        a.add(*s)
        b.add(*s)
    in_use = b.gp
    job = b.begin_refit()
    assert b.pending == 0 and b.gp is in_use and in_use.n_points == 30
    gp = job.run()
    assert b.gp is in_use and in_use.n_points == 30          # nothing shared was touched
    b.finish_refit(gp)
    assert a.refit() == b.n_points == 60
    x = samples[7][:3]
    np.testing.assert_array_equal(a.predict(*x)[0], b.predict(*x)[0])
    np.testing.assert_array_equal(a.predict(*x)[1], b.predict(*x)[1])
    # a failed job: its samples are pending again, in front of newer ones
    for s in samples[:4]:
        b.add(*s)
    X1, Y1 = b.pending_arrays()
    job = b.begin_refit()
    b.add(*samples[10])
    b.abort_refit(job)
    X2, Y2 = b.pending_arrays()
    assert X2.shape == (3, 21) and np.array_equal(X2[:2], X1) and np.array_equal(Y2[:2], Y1)
    c = ResidualModel(panda)
    c.restore_pending(X2, Y2)
    assert c.pending == 3 and np.array_equal(c.pending_arrays()[1], Y2)
    with pytest.raises(ValueError, match="pending"):
        c.restore_pending(X2 * np.nan, Y2)


def test_collect_off_and_angular_reference(panda):
    """collect = False: control without keeping samples (between episodes); w_d / wdot_d
    reach the QP's orientation task."""
    ctrl = SCQPController(panda, dt=0.005, mode="scqp", qp={"q_posture": Q0})
    ctrl.start_episode(Q0, np.zeros(7))
    x0 = panda.frame_pose(Q0)[:3, 3]
    z = np.zeros(3)
    ctrl.collect = False
    for _ in range(5):
        ctrl.compute(Q0, np.zeros(7), x0, z, z)
    assert ctrl.residual.pending == 0
    ctrl.collect = True
    for _ in range(5):
        ctrl.compute(Q0, np.zeros(7), x0, z, z)
    assert ctrl.residual.pending == 1                   # every 5th of the 5 samples after the first cycle
    R0 = panda.frame_pose(Q0)[:3, :3]
    still = ctrl.qp.solve(Q0, np.zeros(7), z, R_des=R0)
    spin = ctrl.qp.solve(Q0, np.zeros(7), z, R_des=R0, w_des=[0.0, 0.0, 1.0], wdot_des=[0.0, 0.0, 2.0])
    J = panda.jacobian(Q0)
    assert (J[5] @ spin.qdd) > (J[5] @ still.qdd) + 1.0  # the angular task asks for a z rotation
    tau = ctrl.compute(Q0, np.zeros(7), x0, z, z, R_d=R0, w_d=[0.0, 0.0, 1.0], wdot_d=[0.0, 0.0, 2.0])
    assert np.isfinite(tau).all() and ctrl.last.ok

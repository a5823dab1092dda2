"""Thunder's task-space adaptive backstepping (control/backstepping.py): the orientation
error of Appendix E (no NaN without a rotation error), the kinematic level's qdd_r and
error rate against finite differences along a motion (also where the damping of the
pseudo-inverse is rising), Proposition 2's Lyapunov function not increasing in closed
loop on the MuJoCo Panda with the true model, the non-adaptive controller with
adaptation off, and a bounded torque at a singular pose."""
from __future__ import annotations

import numpy as np
import pinocchio as pin
import pytest

from adaptive_dynamics.control.backstepping import BacksteppingController, TaskSpaceReference, orientation_error
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig

Q0 = np.array([0.0, -0.6, 0.0, -2.2, 0.0, 1.6, 0.785])


def test_orientation_error_is_axis_times_angle_and_zero_without_rotation():
    rng = np.random.default_rng(0)
    R = pin.exp3(rng.standard_normal(3))
    assert np.array_equal(orientation_error(np.eye(3), np.eye(3)), np.zeros(3))   # no NaN at e = 0
    e0 = orientation_error(R, R)
    assert np.all(np.isfinite(e0)) and np.abs(e0).max() < 1e-14
    axis = np.array([0.0, 0.6, 0.8])
    R_d = pin.exp3(0.3 * axis) @ R                                          # 0.3 rad about axis, base frame
    np.testing.assert_allclose(orientation_error(R, R_d), 0.3 * axis, atol=1e-12)


def test_vect_orientation_error_is_sin_angle_times_axis_and_its_rate_uses_L():
    """The lab's e_o = vect(R_d R^T) = sin(theta) r = 1/2 sum x_i x x_d,i (Siciliano eq.
    3.85), equal to log's theta r to first order; e_o_dot = L^T w_d - L w against finite
    differences of rotating frames."""
    from adaptive_dynamics.control.backstepping import _vect_L

    m = RobotModel("panda")
    ref = TaskSpaceReference(m, 5.0, orientation="vect", k_posture=0.0)
    T0 = m.frame_pose(Q0)
    axis = np.array([0.0, 0.6, 0.8])
    for angle in (1e-3, 0.3, 1.2):
        R_d = pin.exp3(angle * axis) @ T0[:3, :3]
        ref.compute(Q0, np.zeros(7), T0[:3, 3], R_d, np.zeros(6), np.zeros(6))
        np.testing.assert_allclose(ref.e[3:], np.sin(angle) * axis, atol=1e-12)
        R = T0[:3, :3]
        np.testing.assert_allclose(ref.e[3:], 0.5 * sum(np.cross(R[:, i], R_d[:, i]) for i in range(3)), atol=1e-12)
    assert np.abs(ref.e[3:] - 1.2 * axis).max() > 0.1           # not log's theta r at large errors
    rng = np.random.default_rng(3)
    R0, Rd0 = pin.exp3(rng.standard_normal(3)), pin.exp3(rng.standard_normal(3) * 0.3)
    w, w_d = rng.standard_normal(3), rng.standard_normal(3)

    def e_o(t):
        R, R_d = pin.exp3(w * t) @ R0, pin.exp3(w_d * t) @ Rd0
        Re = R_d @ R.T
        return 0.5 * np.array([Re[2, 1] - Re[1, 2], Re[0, 2] - Re[2, 0], Re[1, 0] - Re[0, 1]]), R, R_d

    h = 1e-6
    _, R, R_d = e_o(0.0)
    L, Ld = _vect_L(R, R_d, w, w_d)
    np.testing.assert_allclose(L.T @ w_d - L @ w, (e_o(h)[0] - e_o(-h)[0]) / (2 * h), atol=1e-8)
    L1, L0 = _vect_L(*e_o(h)[1:], w, w_d)[0], _vect_L(*e_o(-h)[1:], w, w_d)[0]
    np.testing.assert_allclose(Ld, (L1 - L0) / (2 * h), atol=1e-7)
    with pytest.raises(ValueError, match="orientation"):
        TaskSpaceReference(m, 5.0, orientation="quaternion")


def _motion(t, q0, v0, a0):
    return q0 + v0 * t + 0.5 * a0 * t * t, v0 + a0 * t


def _reference(t, p0, R0):
    """A moving pose: position on a circle, rotation about a fixed axis."""
    w = np.array([0.2, -0.1, 0.3])
    p = p0 + 0.05 * np.array([np.cos(2 * t) - 1, np.sin(2 * t), 0.3 * t * t])
    pd = 0.05 * np.array([-2 * np.sin(2 * t), 2 * np.cos(2 * t), 0.6 * t])
    pdd = 0.05 * np.array([-4 * np.cos(2 * t), -4 * np.sin(2 * t), 0.6])
    R = pin.exp3(w * t) @ R0
    return p, R, np.concatenate([pd, w]), np.concatenate([pdd, np.zeros(3)])


@pytest.mark.parametrize("orientation", ["log", "vect"])
@pytest.mark.parametrize("where", ["regular", "near_singular"])
def test_reference_acceleration_and_error_rate_are_the_time_derivatives(where, orientation):
    """qdd_r = d/dt qd_r and e_dot = d/dt e along a motion q(t) with the reference moving,
    by central differences; near a singular pose (the damping rising) too."""
    m = RobotModel("panda")
    rng = np.random.default_rng(1 if where == "regular" else 2)
    q0 = Q0.copy()
    if where == "near_singular":
        q0[3] = -0.08                      # elbow almost straight: sigma_min below the threshold
    ref = TaskSpaceReference(m, kp=[4.0, 5.0, 6.0, 3.0, 3.5, 2.5], damping=0.1, singular_threshold=0.1,
                             posture=q0 + 0.1, k_posture=1.5, orientation=orientation)
    v0, a0 = 0.3 * rng.standard_normal(7), 0.5 * rng.standard_normal(7)
    T0 = m.frame_pose(q0)
    p0, R0 = T0[:3, 3] + 0.02, pin.exp3(np.array([0.05, 0.0, -0.04])) @ T0[:3, :3]
    t, h = 0.3, 1e-6

    def at(tt):
        q, v = _motion(tt, q0, v0, a0)
        p, R, vd, ad = _reference(tt, p0, R0)
        qd_r, qdd_r = ref.compute(q, v, p, R, vd, ad)
        return qd_r, qdd_r, ref.e.copy(), ref.e_dot.copy(), ref.lam2

    qd_r, qdd_r, e, e_dot, lam2 = at(t)
    if where == "near_singular":
        assert lam2 > 0.0, "the damping should be active here"
    else:
        assert lam2 == 0.0
    plus, minus = at(t + h), at(t - h)
    fd_qdd = (plus[0] - minus[0]) / (2 * h)
    fd_e = (plus[2] - minus[2]) / (2 * h)
    np.testing.assert_allclose(qdd_r, fd_qdd, atol=2e-5 * max(1.0, np.abs(fd_qdd).max()))
    np.testing.assert_allclose(e_dot, fd_e, atol=1e-6 * max(1.0, np.abs(fd_e).max()))


def _closed_loop(ctl, plant, m, seconds, learn, path):
    """1 kHz loop on the plant; returns the times, |e| and V along it."""
    dt = 1e-3
    ts, en, V = [], [], []
    for k in range(int(seconds / dt)):
        t = k * dt
        _, q, v, tau_m = plant.state()
        p, R, vd, ad = path(t)
        tau = ctl.compute(q, v, p, R, vd, ad, tau_measured=tau_m, learn=learn)
        ts.append(t)
        en.append(float(np.linalg.norm(ctl.ref.e)))
        V.append(ctl.lyapunov(q, v, ctl.core.qd_r))
        plant.step(tau)
    return np.array(ts), np.array(en), np.array(V)


@pytest.mark.parametrize("orientation", ["log", "vect"])
def test_lyapunov_function_does_not_increase_with_the_true_model(orientation):
    """Proposition 2: pi_hat = pi (the plant's own parameters, MuJoCo's dynamics being
    pinocchio's), no adaptation: V = e^T e / 2 + s^T M s / 2 does not grow along the loop
    (up to the 1 kHz sampling), from an initial error, while the pose is held -- with the
    log orientation error and with the lab's vect(R_d R^T) and its L-matrix mapping."""
    m = RobotModel("panda")
    plant = MujocoPlant("panda", reality=RealityConfig(), q0=Q0)
    ctl = BacksteppingController(m, "direct", kp_task=5.0, kd=np.full(7, 5.0), lam=1.0, gamma=1.0,
                                 pi0=m.parameters.copy(), dt=1e-3, k_posture=0.0, orientation=orientation)
    T0 = m.frame_pose(Q0)
    p_goal, R_goal = T0[:3, 3] + np.array([0.05, -0.03, 0.04]), pin.exp3(np.array([0.0, 0.1, 0.05])) @ T0[:3, :3]
    _, en, V = _closed_loop(ctl, plant, m, 2.0, False, lambda t: (p_goal, R_goal, np.zeros(6), np.zeros(6)))
    assert en[0] > 0.05 and en[-1] < 0.02 * en[0]
    dV = np.diff(V)
    assert dV.max() <= 1e-6 * V[0], (dV.max(), V[0])       # never grows beyond sampling noise
    assert V[-1] < 1e-3 * V[0]


def test_adaptation_off_is_the_non_adaptive_controller_and_on_it_learns():
    """learn=False: the estimate never moves and the torque is Y pi0 - K_d s + J^T e (the
    non-adaptive backstepping controller, computed here independently from the model);
    learn=True moves it."""
    m = RobotModel("panda")
    pi0 = 0.8 * m.parameters
    ctl = BacksteppingController(m, "direct", kp_task=5.0, kd=np.full(7, 5.0), gamma=1.0, pi0=pi0,
                                 dt=1e-3)
    rng = np.random.default_rng(3)
    q, v = Q0 + 0.05 * rng.standard_normal(7), 0.2 * rng.standard_normal(7)
    T0 = m.frame_pose(Q0)
    p, R = T0[:3, 3], T0[:3, :3]
    vd, ad = np.r_[0.05, 0.0, 0.0, 0.0, 0.0, 0.1], np.zeros(6)
    theta = ctl.core.theta.copy()
    tau = ctl.compute(q, v, p, R, vd, ad, learn=False)
    np.testing.assert_array_equal(ctl.core.theta, theta)
    ref = TaskSpaceReference(m, 5.0, posture=q)
    qd_r, qdd_r = ref.compute(q, v, p, R, vd, ad)
    m_hat = RobotModel("panda")
    m_hat.set_parameters(np.concatenate([pi0, np.zeros(m_hat.n_params - pi0.size)]), check=False)
    want = (m_hat.mass_matrix(q) @ qdd_r + m_hat.coriolis_matrix(q, v) @ qd_r + m_hat.gravity(q)
            - 5.0 * (v - qd_r) + ref.J.T @ ref.e)
    np.testing.assert_allclose(tau, want, atol=1e-9 * max(1.0, np.abs(want).max()))
    ctl.compute(q, v, p, R, vd, ad, learn=True)
    assert np.abs(ctl.core.theta - theta).max() > 0


def test_a_singular_pose_gives_a_bounded_torque():
    """The arm stretched (elbow straight, sigma_min ~ 0): the damped pseudo-inverse keeps
    qd_r, qdd_r and the torque bounded, with a reference moving across the singular
    direction."""
    m = RobotModel("panda")
    q = np.array([0.0, 0.0, 0.0, m.upper[3], 0.0, 1.0, 0.0])       # joint 4 at its straight limit
    ctl = BacksteppingController(m, "direct", kp_task=5.0, kd=np.full(7, 5.0), gamma=1.0, pi0=m.parameters.copy(),
                                 dt=1e-3)
    T = m.frame_pose(q)
    tau = ctl.compute(q, np.zeros(7), T[:3, 3] + np.array([0.05, 0, 0]), T[:3, :3], np.r_[0.2, 0, 0, 0, 0, 0],
                      np.zeros(6), learn=False)
    assert ctl.ref.sigma_min < 0.05 and ctl.ref.lam2 > 0
    assert np.all(np.isfinite(tau)) and np.abs(tau).max() < 10 * m.effort_limit.max()
    assert np.abs(ctl.core.qd_r).max() < 20.0 and np.abs(ctl.core.qdd_r).max() < 1e3


def test_malformed_inputs_are_named_and_change_nothing():
    """A NaN or wrongly sized input raises ValueError naming it; the estimate, the
    covariance and the filter are untouched, and the next good cycle equals the same cycle
    on a controller that never saw the bad one."""
    m = RobotModel("panda")
    p0 = m.frame_pose(Q0)
    args = (Q0, np.full(7, 0.1), p0[:3, 3] + 0.01, p0[:3, :3], np.zeros(6), np.zeros(6), np.zeros(7))
    a = BacksteppingController(m, "composite", kd=5.0, pi0=0.9 * m.parameters, adapted_links=["panda_link7"])
    b = BacksteppingController(m, "composite", kd=5.0, pi0=0.9 * m.parameters, adapted_links=["panda_link7"])
    a.compute(*args)
    b.compute(*args)
    theta, P = a.core.theta.copy(), a.core.P.copy()
    bad = {"q": (0, np.r_[np.nan, Q0[1:]]), "v": (1, np.full(7, np.inf)), "p_d": (2, np.array([0.3, np.nan, 0.5])),
           "R_d": (3, np.full((3, 3), np.nan)), "v_d": (4, np.zeros(5)), "a_d": (5, np.r_[np.zeros(5), np.nan]),
           "tau_measured": (6, np.r_[np.nan, np.zeros(6)])}
    for name, (i, value) in bad.items():
        x = list(args)
        x[i] = value
        with pytest.raises(ValueError, match=name):
            a.compute(*x)
        np.testing.assert_array_equal(a.core.theta, theta, err_msg=name)
        np.testing.assert_array_equal(a.core.P, P, err_msg=name)
    q1 = Q0 + 0.001
    np.testing.assert_array_equal(a.compute(q1, *args[1:]), b.compute(q1, *args[1:]))

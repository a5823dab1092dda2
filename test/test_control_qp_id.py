"""QP inverse dynamics (SCQP eq. 1-3, 11-12, 17-18): the solution against pinocchio's
RNEA and a second solver (OSQP), J-dot q-dot against finite differences, the linearised
residual in the equations of motion, the limit bounds, the fallback, and a closed loop
on the MuJoCo Panda."""
from __future__ import annotations

import numpy as np
import pinocchio as pin
import pytest

from adaptive_dynamics.control.qp_id import QPInverseDynamics, reference_solve
from adaptive_dynamics.dynamics import RobotModel

Q0 = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])


@pytest.fixture(scope="module")
def panda():
    return RobotModel("panda")


def test_solution_satisfies_rnea_matches_osqp_and_reaches_the_task(panda):
    qp = QPInverseDynamics(panda, dt=0.005, w_posture=0.0)
    rng = np.random.default_rng(0)
    for k in range(10):
        q = Q0 + rng.normal(0, 0.2, 7)
        v = rng.normal(0, 0.4, 7)
        xdd = rng.normal(0, 1.0, 3)
        r = qp.solve(q, v, xdd)
        assert r.ok and np.isfinite(r.tau).all()
        # equations of motion: pinocchio's RNEA of the planned acceleration is the torque
        np.testing.assert_allclose(pin.rnea(panda.model, panda.model.createData(), q, v, r.qdd), r.tau,
                                   rtol=0, atol=1e-5)
        # a 6-D task on a 7-DoF arm is reachable: the end effector gets xdd, the rotation
        # its hold command (independent J and J-dot q-dot from RobotModel)
        J, Jd = panda.jacobian(q), panda.jacobian_dot(q, v)
        np.testing.assert_allclose(J[:3] @ r.qdd + Jd[:3] @ v, xdd, rtol=0, atol=2e-3)
        # the same QP, solved by OSQP: the same optimal cost (without a posture task the
        # null-space direction is flat up to w_qdd, so the minimisers may differ there)
        H, g, A, b, lb, ub = qp.qp_matrices()
        x = reference_solve(H, g, A, b, lb, ub)
        xp = np.concatenate([r.qdd, r.tau])

        def cost(z):
            return 0.5 * z @ H @ z + g @ z
        assert abs(cost(xp) - cost(x)) <= 1e-6 * (1.0 + abs(cost(x)))
        np.testing.assert_allclose(A @ x, b, atol=1e-6)
    assert qp.fallbacks == 0 and qp.solves == 10


def test_jdot_qdot_is_the_derivative_of_the_frame_velocity(panda):
    qp = QPInverseDynamics(panda, dt=0.005)
    rng = np.random.default_rng(1)
    q, v = Q0 + rng.normal(0, 0.2, 7), rng.normal(0, 0.5, 7)
    _, J, jdqd, M, c = qp.kinematics(q, v)
    h = 1e-6
    Jp = qp.kinematics(q + h * v, v)[1]
    Jm = qp.kinematics(q - h * v, v)[1]
    np.testing.assert_allclose(jdqd, (Jp - Jm) @ v / (2 * h), rtol=0, atol=1e-6)
    np.testing.assert_allclose(M, panda.mass_matrix(q), atol=1e-10)
    np.testing.assert_allclose(c, panda.inverse_dynamics(q, v, np.zeros(7)), atol=1e-10)


def test_the_linearised_residual_enters_the_equations_of_motion(panda):
    """tau = h_bar(qdd) + e_t + E (qdd - qdd_t) (eq. 11-12) for the planned qdd."""
    qp = QPInverseDynamics(panda, dt=0.005, residual_inertia_bounds=None)   # E as given
    rng = np.random.default_rng(2)
    q, v, qdd_t = Q0 + rng.normal(0, 0.1, 7), rng.normal(0, 0.3, 7), rng.normal(0, 1.0, 7)
    e_t = rng.normal(0, 2.0, 7)
    E = 0.05 * rng.normal(size=(7, 7))
    r = qp.solve(q, v, np.array([0.2, 0.0, -0.3]), residual=(e_t, E), qdd_measured=qdd_t)
    assert r.ok
    np.testing.assert_allclose(r.tau, panda.inverse_dynamics(q, v, r.qdd) + e_t + E @ (r.qdd - qdd_t),
                               rtol=0, atol=1e-5)
    # a non-finite residual falls back to the rigid-body model, not to a NaN torque
    r2 = qp.solve(q, v, np.array([0.2, 0.0, -0.3]), residual=(np.full(7, np.nan), E), qdd_measured=qdd_t)
    assert r2.ok
    np.testing.assert_allclose(r2.tau, panda.inverse_dynamics(q, v, r2.qdd), rtol=0, atol=1e-5)


def test_limits_bound_the_acceleration_and_the_torque(panda):
    qp = QPInverseDynamics(panda, dt=0.005, torque_limit_scale=0.5)
    q = Q0.copy()
    q[3] = panda.upper[3] - 0.05                      # joint 4 near its upper limit, moving up
    v = np.zeros(7)
    v[3] = 1.5
    lo, hi = qp.acceleration_bounds(q, v)
    T = qp.limit_horizon
    assert hi[3] < 0                                   # it must brake
    # braking at the bound keeps it inside the margin over the horizon
    assert q[3] + v[3] * T + 0.5 * hi[3] * T * T <= panda.upper[3] - qp.limit_margin + 1e-12
    r = qp.solve(q, v, np.array([0.0, 0.0, 5.0]))     # a task that pulls the arm anywhere
    assert r.ok and r.qdd[3] <= hi[3] + 1e-6 and np.all(r.qdd >= lo - 1e-6)
    assert np.all(np.abs(r.tau) <= 0.5 * panda.effort_limit + 1e-9)
    # past the bound already: the interval does not invert
    q[3] = panda.upper[3] + 0.01
    lo, hi = qp.acceleration_bounds(q, v)
    assert np.all(lo <= hi)


def test_failures_give_a_finite_fallback_and_are_counted(panda):
    qp = QPInverseDynamics(panda, dt=0.005, torque_limit_scale=1e-3)
    q = Q0.copy()
    q[1] = panda.upper[1] - 0.02
    v = np.zeros(7)
    v[1] = 2.0                          # must brake hard with almost no torque: infeasible
    r = qp.solve(q, v, np.zeros(3))
    assert not r.ok and r.status.startswith("fallback") and np.isfinite(r.tau).all()
    assert np.all(np.abs(r.tau) <= 1e-3 * panda.effort_limit + 1e-12) and qp.fallbacks == 1
    r = qp.solve(Q0, np.zeros(7), np.array([np.nan, 0.0, 0.0]))
    assert not r.ok and "non-finite" in r.status and np.isfinite(r.tau).all() and qp.fallbacks == 2
    # the next regular cycle solves again (cold start)
    qp.tau_max = panda.effort_limit.copy()
    assert qp.solve(Q0, np.zeros(7), np.zeros(3)).ok
    with pytest.raises(ValueError, match="xdd_ref"):
        qp.solve(Q0, np.zeros(7), np.zeros(2))
    with pytest.raises(ValueError, match="w_tau must be > 0"):
        qp.set_weights(w_tau=0.0)


def test_closed_loop_tracks_a_vertical_sinusoid_on_mujoco(panda):
    """Exact model, PD task feedback, 200 Hz with five 1 ms MuJoCo steps per cycle: the
    end effector follows a 5 cm, 0.5 Hz z-sinusoid to within a millimetre."""
    from adaptive_dynamics.sim.plant import MujocoPlant
    plant = MujocoPlant("panda", q0=Q0)
    qp = QPInverseDynamics(panda, dt=0.005, q_posture=Q0)
    x0 = panda.frame_pose(Q0)[:3, 3]
    R0 = panda.frame_pose(Q0)[:3, :3]
    err = []
    for k in range(600):
        t = k * 0.005
        q, v = plant.true_state()
        w = 2 * np.pi * 0.5
        x_d = x0 + [0, 0, 0.05 * np.sin(w * t)]
        xd_d = np.array([0, 0, 0.05 * w * np.cos(w * t)])
        xdd_d = np.array([0, 0, -0.05 * w * w * np.sin(w * t)])
        T = panda.frame_pose(q)
        xd = panda.jacobian(q)[:3] @ v
        xdd_r = xdd_d + 400.0 * (x_d - T[:3, 3]) + 40.0 * (xd_d - xd)
        r = qp.solve(q, v, xdd_r, R_des=R0)
        assert r.ok
        for _ in range(5):
            plant.step(r.tau)
        if t > 1.0:
            err.append(np.linalg.norm(x_d - T[:3, 3]))
    assert max(err) < 1e-3 and qp.fallbacks == 0


def test_the_residual_gradient_is_conditioned_against_the_inertia(panda):
    """lo M <= M + E' <= hi M (generalised eigenvalues by scipy), E' symmetric; an E
    already inside the bounds is kept (its symmetric part); None keeps E as learned."""
    from scipy.linalg import eigh
    qp = QPInverseDynamics(panda, dt=0.005, residual_inertia_bounds=(0.8, 1.25))
    M = panda.mass_matrix(Q0)
    rng = np.random.default_rng(3)
    E = 2.0 * rng.normal(size=(7, 7))                    # far outside: M + E indefinite
    assert eigh(M + 0.5 * (E + E.T), M, eigvals_only=True).min() < 0
    Ec = qp.condition_gradient(M, E)
    np.testing.assert_allclose(Ec, Ec.T, atol=1e-12)
    lam = eigh(M + Ec, M, eigvals_only=True)
    assert lam.min() >= 0.8 - 1e-9 and lam.max() <= 1.25 + 1e-9
    L = np.linalg.cholesky(M)                                          # generalised eigenvalues in bounds
    V = np.linalg.qr(rng.normal(size=(7, 7)))[0]
    inside = (L @ V * rng.uniform(-0.15, 0.2, 7)) @ (L @ V).T
    np.testing.assert_allclose(qp.condition_gradient(M, inside), inside, atol=1e-10)
    assert QPInverseDynamics(panda, dt=0.005, residual_inertia_bounds=None).condition_gradient(M, E) is E
    with pytest.raises(ValueError, match="residual_inertia_bounds"):
        QPInverseDynamics(panda, dt=0.005, residual_inertia_bounds=(1.2, 2.0))


def test_a_second_solver_through_qpsolvers_gives_the_same_torque(panda):
    """solver="qpsolvers:osqp": the same QP through qpsolvers; with the posture task the
    minimiser is unique and both solvers find it."""
    a = QPInverseDynamics(panda, dt=0.005, w_posture=1e-2)
    b = QPInverseDynamics(panda, dt=0.005, w_posture=1e-2, solver="qpsolvers:osqp")
    rng = np.random.default_rng(4)
    for _ in range(5):
        q, v, xdd = Q0 + rng.normal(0, 0.1, 7), rng.normal(0, 0.3, 7), rng.normal(0, 1.0, 3)
        ra, rb = a.solve(q, v, xdd), b.solve(q, v, xdd)
        assert ra.ok and rb.ok
        np.testing.assert_allclose(rb.tau, ra.tau, rtol=0, atol=1e-3)
        np.testing.assert_allclose(rb.qdd, ra.qdd, rtol=0, atol=1e-3)
    with pytest.raises(ValueError, match="qpsolvers:<name>"):
        QPInverseDynamics(panda, dt=0.005, solver="nope")

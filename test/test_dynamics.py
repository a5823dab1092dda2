"""Dynamics core against independent references.

References: pinocchio's rnea / crba / computeCoriolisMatrix / computeGeneralizedGravity
on a model built separately from the same URDF, MuJoCo's mj_inverse and mj_fullM,
finite differences, and a continuous-time ODE solve (scipy) for the filtered regressor.
Every test runs on the Panda, the KUKA iiwa 14 and the planar 2-DoF arm.
"""
from __future__ import annotations

import warnings

import mujoco
import numpy as np
import pinocchio as pin
import pytest
from scipy.integrate import solve_ivp

from adaptive_dynamics.dynamics import (
    PhysicalConsistencyError,
    RobotModel,
    convert_order,
    from_mass_com_inertia,
    pseudo_inertia,
    transform_matrix,
)
from adaptive_dynamics.robots import urdf_path
from adaptive_dynamics.sim.mujoco_model import joint_indices, load_mujoco_model

ROBOTS = ["panda", "iiwa14", "planar2"]


@pytest.fixture(scope="module", params=ROBOTS)
def robot(request):
    return RobotModel(request.param)


@pytest.fixture(scope="module")
def reference(robot):
    """An independent pinocchio model of the same URDF."""
    m = pin.buildModelFromUrdf(robot.urdf_path)
    return m, m.createData()


def states(robot, k=10, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(k):
        q, v, a = robot.random_state(rng)
        yield q, v, a, rng.standard_normal(robot.n), rng.standard_normal(robot.n)


def close(x, y, rtol=1e-9):
    scale = max(1.0, float(np.abs(y).max()))
    np.testing.assert_allclose(x, y, rtol=0, atol=rtol * scale)


# ---------------------------------------------------------------- rigid-body terms
def test_regressor_times_pi_is_rnea(robot, reference):
    m, d = reference
    pi = robot.parameters
    for q, v, a, _, _ in states(robot):
        close(robot.regressor(q, v, a) @ pi, pin.rnea(m, d, q, v, a))
        close(robot.inverse_dynamics(q, v, a), pin.rnea(m, d, q, v, a))


def test_M_C_g_match_pinocchio(robot, reference):
    m, d = reference
    for q, v, _, _, _ in states(robot):
        M = pin.crba(m, d, q)
        M = np.triu(M) + np.triu(M, 1).T
        close(robot.mass_matrix(q), M)
        close(robot.coriolis_matrix(q, v), pin.computeCoriolisMatrix(m, d, q, v))
        close(robot.gravity(q), pin.computeGeneralizedGravity(m, d, q))


def test_against_mujoco_inverse_dynamics(robot):
    """Y(q, v, a) pi equals MuJoCo's mj_inverse (armature/damping off) to 1e-6 relative."""
    mj = load_mujoco_model(robot.urdf_path)
    data = mujoco.MjData(mj)
    qi, di = joint_indices(mj, robot.joint_names)
    Mmj = np.zeros((mj.nv, mj.nv))
    for q, v, a, _, _ in states(robot):
        data.qpos[qi], data.qvel[di], data.qacc[di] = q, v, a
        mujoco.mj_inverse(mj, data)
        tau_mj = data.qfrc_inverse[di].copy()
        tau = robot.regressor(q, v, a) @ robot.parameters
        np.testing.assert_allclose(tau, tau_mj, rtol=1e-6, atol=1e-6 * np.abs(tau_mj).max())
        mujoco.mj_fullM(mj, data, Mmj)
        np.testing.assert_allclose(robot.mass_matrix(q), Mmj[np.ix_(di, di)], rtol=1e-6, atol=1e-9)


def test_coriolis_is_christoffel_and_skew(robot):
    for q, v, _, w, x in states(robot):
        C = robot.coriolis_matrix(q, v)
        Cw = robot.coriolis_matrix(q, w)
        close(C @ w, Cw @ v)  # Christoffel symmetry C(q,v)w = C(q,w)v
        S = robot.mass_matrix_dot(q, v) - 2 * C
        close(S, -S.T)
        assert abs(x @ S @ x) < 1e-9 * max(1.0, np.abs(S).max())


def test_mass_matrix_dot_finite_difference(robot):
    eps = 1e-6
    for q, v, _, _, _ in states(robot, k=5):
        fd = (robot.mass_matrix(q + eps * v) - robot.mass_matrix(q - eps * v)) / (2 * eps)
        np.testing.assert_allclose(robot.mass_matrix_dot(q, v), fd, atol=1e-6 * max(1, np.abs(fd).max()))


def test_jacobian_and_dot_finite_difference(robot):
    eps = 1e-6
    for q, v, _, _, _ in states(robot, k=5):
        J = robot.jacobian(q)
        p = lambda qq: robot.frame_pose(qq)[:3, 3]
        Jfd = np.column_stack([(p(q + eps * e) - p(q - eps * e)) / (2 * eps) for e in np.eye(robot.n)])
        np.testing.assert_allclose(J[:3], Jfd, atol=1e-7)
        # angular part: R(q + eps e) R^T ~ I + eps [w]x
        R = robot.frame_pose(q)[:3, :3]
        for k, e in enumerate(np.eye(robot.n)):
            dR = (robot.frame_pose(q + eps * e)[:3, :3] - robot.frame_pose(q - eps * e)[:3, :3]) / (2 * eps)
            W = dR @ R.T
            np.testing.assert_allclose([W[2, 1], W[0, 2], W[1, 0]], J[3:, k], atol=1e-7)
        Jdot_fd = (robot.jacobian(q + eps * v) - robot.jacobian(q - eps * v)) / (2 * eps)
        np.testing.assert_allclose(robot.jacobian_dot(q, v), Jdot_fd, atol=1e-6)


# ---------------------------------------------------------------- regressors
def test_slotine_li_regressor(robot):
    pi = robot.parameters
    for q, v, a, vr, ar in states(robot):
        Ysl = robot.slotine_li_regressor(q, v, vr, ar)
        expect = robot.mass_matrix(q) @ ar + robot.coriolis_matrix(q, v) @ vr + robot.gravity(q)
        close(Ysl @ pi, expect)
        # with vr = v, ar = a it is the standard regressor, column by column
        close(robot.slotine_li_regressor(q, v, v, a), robot.regressor(q, v, a))



# ------------------------------------------- compiled (numba) Slotine-Li regressor
def _tree_with_every_joint_type(gravity=(0.7, -1.3, -9.5)):
    """A 9-DoF tree (two branches at joint 3, joints numbered depth-first as pinocchio's
    algorithms require) with every joint type the compiled kernel handles: RX, RY, RZ,
    revolute about a skew axis, PX, PY, PZ, prismatic along a skew axis; random joint
    placements and random (physical) link inertias."""
    rng = np.random.default_rng(42)
    m = pin.Model()
    m.gravity.linear = np.asarray(gravity, dtype=float)
    ax1 = rng.standard_normal(3)
    ax2 = rng.standard_normal(3)
    joints = [pin.JointModelRX(), pin.JointModelRY(), pin.JointModelRZ(),
              pin.JointModelRevoluteUnaligned(ax1 / np.linalg.norm(ax1)), pin.JointModelPX(),
              pin.JointModelPY(), pin.JointModelPZ(),
              pin.JointModelPrismaticUnaligned(ax2 / np.linalg.norm(ax2)), pin.JointModelRZ()]
    parents = [0, 1, 2, 3, 4, 3, 6, 7, 8]
    lim = np.ones(1)
    for k, (jm, parent) in enumerate(zip(joints, parents)):
        place = pin.SE3(pin.exp3(rng.standard_normal(3)), 0.3 * rng.standard_normal(3))
        jid = m.addJoint(parent, jm, place, f"j{k}", 50 * lim, 5 * lim, -1.5 * lim, 1.5 * lim)
        L = rng.standard_normal((3, 3))
        inertia = pin.Inertia(rng.uniform(0.5, 3.0), 0.2 * rng.standard_normal(3), L @ L.T + 0.1 * np.eye(3))
        m.appendBodyToJoint(jid, inertia, pin.SE3.Identity())
        m.addBodyFrame(f"link{k}", jid, pin.SE3.Identity(), m.addJointFrame(jid))
    return m


def _slotine_li_models():
    yield "panda", RobotModel("panda")
    yield "iiwa14", RobotModel("iiwa14")
    yield "planar2", RobotModel("planar2")
    rm = RobotModel("panda", friction=True)
    rm.set_friction(np.linspace(0.1, 0.7, 7), np.linspace(0.2, 0.8, 7))
    yield "panda+friction", rm
    rm = RobotModel("iiwa14", friction=True, coulomb_smoothing=0.05)
    rm.set_friction(np.linspace(0.3, 0.9, 7), np.linspace(0.5, 0.1, 7))
    yield "iiwa14+smooth friction", rm
    tree = _tree_with_every_joint_type()
    yield "tree", RobotModel(tree, gravity=tree.gravity.linear)


def test_compiled_slotine_li_matches_polarised_and_christoffel_identity():
    """Compiled single pass == two-call polarisation (to 1e-12) and Y pi = M ar + C vr + g
    (+ friction) with M, C (Christoffel, pinocchio's computeCoriolisMatrix), g from an
    independent pinocchio model; also for a random non-physical pi (every column)."""
    for name, rm in _slotine_li_models():
        assert rm.slotine_li_implementation == "compiled", name
        ref = rm.model.copy()
        d = ref.createData()
        rng = np.random.default_rng(1)
        pi_rand = rng.standard_normal(rm.n_params)
        other = RobotModel(rm.model, friction=rm.friction, coulomb_smoothing=rm.coulomb_smoothing,
                           gravity=rm.model.gravity.linear)
        other.set_parameters(pi_rand, check=False)
        pi = rm.parameters
        fv, fc = pi[rm.n_inertial: rm.n_inertial + rm.n], pi[rm.n_inertial + rm.n:]
        for q, v, a, vr, ar in states(rm, k=8, seed=3):
            Y = rm.slotine_li_regressor(q, v, vr, ar)
            assert Y.shape == (rm.n, rm.n_params)
            close(Y, rm._slotine_li_polarised(q, v, vr, ar), rtol=1e-12)
            expect = _sym_full(pin.crba(ref, d, q)) @ ar
            expect = expect + pin.computeCoriolisMatrix(ref, d, q, v) @ vr
            expect = expect + pin.computeGeneralizedGravity(ref, d, q)
            if rm.friction:
                coul = np.tanh(v / rm.coulomb_smoothing) if rm.coulomb_smoothing > 0 else np.sign(v)
                expect = expect + fv * v + fc * coul
            close(Y @ pi, expect)
            close(Y @ pi, rm.mass_matrix(q) @ ar + rm.coriolis_matrix(q, v) @ vr + rm.gravity(q)
                  + (rm.friction_torque(v) if rm.friction else 0.0))
            f_rand = other.friction_torque(v) if rm.friction else 0.0
            close(Y @ pi_rand, other.mass_matrix(q) @ ar + other.coriolis_matrix(q, v) @ vr
                  + other.gravity(q) + f_rand)
            # vr = v, ar = a: the standard regressor
            close(rm.slotine_li_regressor(q, v, v, a), rm.regressor(q, v, a), rtol=1e-12)
            # a fresh array every call
            assert not np.shares_memory(Y, rm.slotine_li_regressor(q, v, vr, ar))


def _sym_full(M):
    M = np.triu(M)
    return M + np.triu(M, 1).T


def test_compiled_slotine_li_accepts_what_the_api_accepts():
    """Lists, integer arrays, (n, 1) columns, strided views and read-only arrays go
    through the validating slow path and give the same Y."""
    rm = RobotModel("panda")
    rng = np.random.default_rng(4)
    q, v, _ = rm.random_state(rng)
    vr, ar = rng.standard_normal(7), rng.standard_normal(7)
    Y = rm.slotine_li_regressor(q, v, vr, ar)
    ro = vr.copy()
    ro.flags.writeable = False
    strided = np.repeat(ar, 2)[::2]
    np.testing.assert_array_equal(rm.slotine_li_regressor(list(q), v.reshape(7, 1), ro, strided), Y)
    qi = np.arange(7) % 2
    close(rm.slotine_li_regressor(qi, v, vr, ar), rm._slotine_li_polarised(qi, v, vr, ar), rtol=1e-12)
    with pytest.raises(ValueError, match="non-finite result"):
        rm.slotine_li_regressor(q, np.full(7, 1e200), np.full(7, 1e200), ar)  # overflows


def test_slotine_li_fallback_when_numba_fails(monkeypatch):
    """numba import/compilation failure: one RuntimeWarning per process, then the
    two-call implementation, with the same results and the same input validation."""
    from adaptive_dynamics.dynamics import _slotine_li_compiled as slc

    compiled = RobotModel("panda")
    assert compiled.slotine_li_implementation == "compiled"

    def broken(cache=True):
        raise ImportError("No module named 'numba' (simulated)")

    monkeypatch.setattr(slc, "_build_kernel", broken)
    monkeypatch.setattr(slc, "_kernel", None)
    monkeypatch.setattr(slc, "_load_error", None)
    monkeypatch.setattr(slc, "_warned", set())
    rm = RobotModel("panda")
    with pytest.warns(RuntimeWarning, match="compiled Slotine-Li regressor unavailable"):
        rm.warm_up()  # the kernel is loaded on first use
    assert rm.slotine_li_implementation == "polarised"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rm2 = RobotModel("panda", friction=True)  # no second warning
        assert rm2.slotine_li_implementation == "polarised"
        # the regressor derivatives fall back to the ball-shifted pinocchio models
        assert rm._delta.implementation == "pinocchio"
    q, v, a = compiled.random_state(np.random.default_rng(1))
    dpi = np.random.default_rng(2).standard_normal(rm.n_params)
    for u, w in zip(rm.regressor_derivatives(q, v, a, dpi), compiled.regressor_derivatives(q, v, a, dpi)):
        np.testing.assert_allclose(u, w, rtol=0, atol=1e-10 * np.abs(w).max())
    for q, v, _, vr, ar in states(rm, k=5):
        close(rm.slotine_li_regressor(q, v, vr, ar), compiled.slotine_li_regressor(q, v, vr, ar),
              rtol=1e-12)
    bad = np.full(7, 0.1)
    bad[2] = np.nan
    with pytest.raises(ValueError, match=r"^vr: entry 2"):
        rm.slotine_li_regressor(np.zeros(7), np.zeros(7), bad, np.zeros(7))
    with pytest.raises(ValueError, match=r"^ar\b"):
        rm.slotine_li_regressor(np.zeros(7), np.zeros(7), np.zeros(7), np.zeros(1))


def test_slotine_li_numba_disabled_by_environment(monkeypatch):
    from adaptive_dynamics.dynamics import _slotine_li_compiled as slc

    monkeypatch.setenv(slc.ENV_DISABLE, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rm = RobotModel("planar2")
        assert rm.slotine_li_implementation == "polarised"
    assert rm.slotine_li_regressor is rm._slotine_li_polarised


@pytest.mark.parametrize("compiled", [True, False])
def test_regressor_batch_is_the_per_sample_regressor(robot, reference, compiled, monkeypatch):
    """regressor_batch against pinocchio's computeJointTorqueRegressor sample by sample
    (friction columns against their definition), the base projection against
    ``@ projector``, and a non-finite sample named; the compiled and the per-sample
    (numba disabled) implementations alike."""
    from adaptive_dynamics.dynamics import _slotine_li_compiled as slc

    if not compiled:
        monkeypatch.setenv(slc.ENV_DISABLE, "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rm = RobotModel(robot.urdf_path, friction=True)
    assert rm.slotine_li_implementation == ("compiled" if compiled else "polarised")
    m, d = reference
    S = list(states(rm, 25, seed=4))
    Q, V, A = (np.array([s[i] for s in S]) for i in range(3))
    Y = rm.regressor_batch(Q, V, A)
    n, P = rm.n, rm.n_inertial
    assert Y.shape == (25, n, rm.n_params)
    for k in range(25):
        close(Y[k, :, :P], pin.computeJointTorqueRegressor(m, d, Q[k], V[k], A[k]))
        np.testing.assert_array_equal(Y[k, :, P:P + n], np.diag(V[k]))
        np.testing.assert_array_equal(Y[k, :, P + n:], np.diag(np.sign(V[k])))
    b = rm.base_parameters()
    np.testing.assert_array_equal(rm.regressor_batch(Q, V, A, base=b), Y @ b.projector)
    assert rm.regressor_batch(Q[0], V[0], A[0]).shape == (1, n, rm.n_params)
    A[7, 0] = np.nan
    with pytest.raises(ValueError, match="sample 7 "):
        rm.regressor_batch(Q, V, A)
    with pytest.raises(ValueError, match="K x"):
        rm.regressor_batch(Q, V, A[:, :1])


def test_regressor_derivatives_finite_difference(robot):
    rng = np.random.default_rng(3)
    eps = 1e-6
    dpi = rng.standard_normal(robot.n_params)
    dpi[0] = 0.0  # a zero-mass block (not representable as a pinocchio Inertia)
    f = lambda q, v, a: robot.regressor(q, v, a) @ dpi
    for q, v, a, _, _ in states(robot, k=4):
        dq, dv, da = robot.regressor_derivatives(q, v, a, dpi)
        for D, which in ((dq, 0), (dv, 1), (da, 2)):
            fd = np.empty_like(D)
            for k, e in enumerate(np.eye(robot.n)):
                xp = [q, v, a]
                xm = [q, v, a]
                xp[which] = xp[which] + eps * e
                xm[which] = xm[which] - eps * e
                fd[:, k] = (f(*xp) - f(*xm)) / (2 * eps)
            np.testing.assert_allclose(D, fd, atol=1e-5 * max(1.0, np.abs(fd).max()))


def _tree_model():
    """A branched model with every joint type the compiled kernels support."""
    rng = np.random.default_rng(21)
    model = pin.Model()
    axis = np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8])
    joints = [pin.JointModelRX(), pin.JointModelRY(), pin.JointModelRZ(), pin.JointModelRevoluteUnaligned(axis),
              pin.JointModelPZ(), pin.JointModelPrismaticUnaligned(axis[::-1].copy()), pin.JointModelRZ()]
    parents = [0, 1, 2, 1, 4, 3, 2]  # two branches off joint 1, one off joint 2
    for j, (jm, parent) in enumerate(zip(joints, parents)):
        placement = pin.SE3(pin.exp3(rng.standard_normal(3)), rng.standard_normal(3) * 0.3)
        jid = model.addJoint(parent, jm, placement, f"j{j}")
        model.appendBodyToJoint(jid, pin.Inertia.Random(), pin.SE3.Identity())
    return model


@pytest.mark.parametrize("which", ["panda", "iiwa14", "tree"])
def test_compiled_rnea_derivatives_match_pinocchio(which):
    """The compiled RNEA-derivatives kernel (dpi used as it is) against pinocchio's
    rnea + computeRNEADerivatives on physical inertias, every supported joint type and
    a branched tree included."""
    from adaptive_dynamics.dynamics import _slotine_li_compiled as slc

    if slc.load_kernel() is None:
        pytest.skip("numba unavailable")
    model = _tree_model() if which == "tree" else RobotModel(which).model
    n = model.nv
    geo = slc.geometry(model)
    P = np.zeros((model.njoints, 10))
    for j in range(1, model.njoints):
        P[j] = model.inertias[j].toDynamicParameters()
    rng = np.random.default_rng(2)
    Q, V, A = (np.ascontiguousarray(rng.uniform(-1.5, 1.5, (5, n))) for _ in range(3))
    tau, D = np.empty((5, n)), np.empty((5, n, 3 * n))
    slc.rnea_derivatives_kernel(Q, V, A, geo, P, tau, D)
    data = model.createData()
    for k in range(5):
        dq, dv, da = (np.array(x) for x in pin.computeRNEADerivatives(model, data, Q[k], V[k], A[k]))
        da = np.triu(da) + np.triu(da, 1).T - np.diag(model.armature)
        want = np.hstack([dq, dv, da])
        np.testing.assert_allclose(D[k], want, rtol=0, atol=1e-12 * np.abs(want).max())
        t = pin.rnea(model, data, Q[k], V[k], A[k]) - model.armature * A[k]
        np.testing.assert_allclose(tau[k], t, rtol=0, atol=1e-12 * np.abs(t).max())


def test_shifted_parameter_change_starts_at_zero(robot):
    """Before any set(), the change is zero on either path (the first-use cross-check of
    the compiled kernel leaves nothing behind)."""
    from adaptive_dynamics.dynamics.parameter_change import ShiftedParameterChange

    q, v, a = robot.random_state(np.random.default_rng(3))
    for compiled in (True, False):
        for D in ShiftedParameterChange(robot.model, robot.n, compiled=compiled).derivatives(q, v, a):
            assert not D.any()


def test_shifted_parameter_change_compiled_equals_pinocchio_path(robot):
    """Non-physical dpi: the compiled evaluation equals the ball-shifted pinocchio pair."""
    from adaptive_dynamics.dynamics.parameter_change import ShiftedParameterChange

    fast = ShiftedParameterChange(robot.model, robot.n)
    slow = ShiftedParameterChange(robot.model, robot.n, compiled=False)
    if fast.implementation != "compiled":
        pytest.skip("numba unavailable")
    assert slow.implementation == "pinocchio"
    rng = np.random.default_rng(9)
    X = [np.ascontiguousarray(rng.uniform(-1, 1, (4, robot.n))) for _ in range(3)]
    for dpi in (rng.standard_normal(10 * robot.n), np.zeros(10 * robot.n), 1e3 * rng.standard_normal(10 * robot.n)):
        fast.set(dpi)
        slow.set(dpi)
        for u, w in zip(fast.evaluate(*X), slow.evaluate(*X)):
            np.testing.assert_allclose(u, w, rtol=0, atol=1e-11 * max(1e-300, np.abs(w).max()))


def test_regressor_derivatives_follow_a_changing_dpi(robot):
    """The model keeps the last dpi loaded: a new dpi, one mutated in place, a physical one
    and zero must each give the derivatives of that dpi (against a fresh model)."""
    rng = np.random.default_rng(8)
    q, v, a, _, _ = next(iter(states(robot, k=1)))
    first = rng.standard_normal(robot.n_params)
    mutated = first.copy()
    sequence = [first, rng.standard_normal(robot.n_params), mutated, robot.parameters,
                np.zeros(robot.n_params), first]
    robot.regressor_derivatives(q, v, a, mutated)
    mutated[3] += 0.5  # same array object, other values
    for dpi in sequence:
        got = robot.regressor_derivatives(q, v, a, dpi)
        want = RobotModel(robot.urdf_path).regressor_derivatives(q, v, a, dpi)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=0, atol=1e-10 * max(1.0, np.abs(w).max()))
    M = robot.regressor_derivatives(q, v, a, robot.parameters)[2]
    close(M, robot.mass_matrix(q))  # da = M(dpi): symmetric, both triangles


def test_non_physical_parameters_are_handled_linearly(robot):
    """pi with zero/negative masses (adaptive estimates, deltas): M, g, tau stay linear."""
    rng = np.random.default_rng(5)
    pi = rng.standard_normal(robot.n_params)
    pi[0] = 0.0
    pi[10] = -0.5 if robot.n > 1 else pi[10]
    other = RobotModel(robot.urdf_path)
    other.set_parameters(pi, check=False)
    for q, v, a, _, _ in states(robot, k=3):
        close(other.inverse_dynamics(q, v, a), robot.regressor(q, v, a) @ pi)
        close(other.gravity(q), robot.regressor(q, 0 * v, 0 * a) @ pi)


def test_friction_columns():
    rm = RobotModel("panda", friction=True)
    fv, fc = np.linspace(0.1, 0.7, 7), np.linspace(0.2, 0.8, 7)
    rm.set_friction(fv, fc)
    ref = RobotModel("panda")
    for q, v, a, vr, ar in states(rm, k=3):
        expect = ref.inverse_dynamics(q, v, a) + fv * v + fc * np.sign(v)
        close(rm.regressor(q, v, a) @ rm.parameters, expect)
        close(rm.inverse_dynamics(q, v, a), expect)
        expect_sl = ref.slotine_li_regressor(q, v, vr, ar) @ ref.parameters + fv * v + fc * np.sign(v)
        close(rm.slotine_li_regressor(q, v, vr, ar) @ rm.parameters, expect_sl)
    assert rm.parameter_names[-1] == "panda_joint7.fc" and rm.n_params == 84


# ---------------------------------------------------------------- filtered regressor
def _sine_traj(robot, seed=0):
    rng = np.random.default_rng(seed)
    c = 0.5 * (robot.lower + robot.upper)
    amp = 0.2 * np.minimum(robot.upper - robot.lower, 2.0)
    w = rng.uniform(0.8, 2.5, robot.n)
    ph = rng.uniform(0, 2 * np.pi, robot.n)
    q = lambda t: c + amp * np.sin(w * t + ph)
    qd = lambda t: amp * w * np.cos(w * t + ph)
    qdd = lambda t: -amp * w ** 2 * np.sin(w * t + ph)
    return q, qd, qdd


def test_filtered_regressor_second_order_exact(robot):
    """W pi vs the continuous filtered torque (solve_ivp, rtol 1e-11): error O(h^2)."""
    lam, T = 15.0, 0.6
    q, qd, qdd = _sine_traj(robot)
    pi = robot.parameters
    tau = lambda t: robot.inverse_dynamics(q(t), qd(t), qdd(t))
    sol = solve_ivp(lambda t, x: lam * (tau(t) - x), (0, T), np.zeros(robot.n),
                    rtol=1e-11, atol=1e-12, method="DOP853")
    ref = sol.y[:, -1]
    errs, terrs = [], []
    for h in (4e-3, 2e-3, 1e-3):
        F = robot.filtered_regressor(lam, h)
        for k in range(int(round(T / h)) + 1):
            t = k * h
            W, tf = F.update(q(t), qd(t), tau(t))
        errs.append(np.abs(W @ pi - ref).max())
        terrs.append(np.abs(tf - ref).max())
    scale = np.abs(ref).max()
    assert errs[-1] < 1e-4 * max(scale, 1.0)
    for e1, e2 in zip(errs, errs[1:]):
        assert 3.3 < e1 / e2 < 4.8, errs  # halving h quarters the error
    for e1, e2 in zip(terrs, terrs[1:]):
        assert 3.3 < e1 / e2 < 4.8, terrs


def test_filtered_regressor_on_simulated_trajectory(robot):
    """MuJoCo closed-loop-free rollout: W pi equals the numerically filtered applied torque."""
    h_sim, sub, lam = 1e-4, 10, 20.0
    mj = load_mujoco_model(robot.urdf_path, timestep=h_sim)
    mj.opt.integrator = mujoco.mjtIntegrator.mjINT_RK4
    data = mujoco.MjData(mj)
    qi, di = joint_indices(mj, robot.joint_names)
    q0 = 0.5 * (robot.lower + robot.upper)
    data.qpos[qi] = q0
    rng = np.random.default_rng(1)
    w, ph = rng.uniform(1, 3, robot.n), rng.uniform(0, 6, robot.n)
    scale = 0.3 * robot.effort_limit
    F = robot.filtered_regressor(lam, h_sim * sub)
    err, mag = 0.0, 0.0
    for k in range(1500):
        t = data.time
        # torque = gravity compensation + a smooth excitation (keeps the arm moving, bounded)
        q, v = data.qpos[qi].copy(), data.qvel[di].copy()
        tau = robot.gravity(q) + scale * np.sin(w * t + ph) * 0.2 - 2.0 * v - 5.0 * (q - q0)
        W, tf = F.update(q, v, tau)
        if k > 50:
            err = max(err, np.abs(W @ robot.parameters - tf).max())
            mag = max(mag, np.abs(tf).max())
        for _ in range(sub):
            tq = robot.gravity(data.qpos[qi]) + scale * np.sin(w * data.time + ph) * 0.2 \
                - 2.0 * data.qvel[di] - 5.0 * (data.qpos[qi] - q0)
            data.qfrc_applied[di] = tq
            mujoco.mj_step(mj, data)
    assert err < 2e-3 * mag, (err, mag)


@pytest.mark.parametrize("friction", [False, True])
def test_filtered_regressor_compiled_step_equals_numpy(friction):
    """The one-call compiled sample (midpoints, regressor, both recursions) and the numpy
    recursion around RobotModel.regressor give the same W and tau_f, with and without
    torque samples and friction columns."""
    rm = RobotModel("panda", friction=friction, coulomb_smoothing=0.02 if friction else 0.0)
    A, B = rm.filtered_regressor(20.0, 1e-3), rm.filtered_regressor(20.0, 1e-3)
    B._compiled = None
    assert A.implementation == "compiled" and B.implementation == "numpy"
    q, qd, _ = _sine_traj(rm, seed=4)
    rng = np.random.default_rng(2)
    for k in range(300):
        t = k * 1e-3
        tau = rng.standard_normal(rm.n) if k % 4 else None
        Wa, ta = A.update(q(t), list(qd(t)) if k % 7 == 0 else qd(t), tau)
        Wb, tb = B.update(q(t), qd(t), tau)
    assert np.abs(Wa).max() > 1.0
    np.testing.assert_allclose(Wa, Wb, rtol=0, atol=1e-12 * np.abs(Wb).max())
    np.testing.assert_allclose(ta, tb, rtol=0, atol=1e-12 * max(1.0, np.abs(tb).max()))


def test_filtered_regressor_rejects_bad_input_without_corrupting_state():
    rm = RobotModel("planar2")
    F = rm.filtered_regressor(10.0, 1e-3)
    q, v = np.array([0.1, 0.2]), np.array([0.3, -0.1])
    F.update(q, v, np.zeros(2))
    W, tf = F.update(q + 1e-3, v, np.ones(2))
    W0, tf0 = W.copy(), tf.copy()
    with pytest.raises(ValueError, match="v"):
        F.update(q, np.array([np.nan, 0.0]), np.ones(2))
    with pytest.raises(ValueError, match="tau"):
        F.update(q, v, np.array([np.inf, 0.0]))
    with pytest.raises(ValueError, match="q"):
        F.update(np.zeros(3), v, np.ones(2))
    np.testing.assert_array_equal(F.W, W0)
    np.testing.assert_array_equal(F.tau_f, tf0)
    with pytest.raises(ValueError, match="lam"):
        rm.filtered_regressor(-1.0, 1e-3)


# ---------------------------------------------------------------- base parameters
def test_base_parameters(robot):
    base = robot.base_parameters()
    rng = np.random.default_rng(11)
    pi = robot.parameters + 0.1 * rng.standard_normal(robot.n_params)
    pib = base.to_base(pi)
    stacked = []
    for q, v, a, _, _ in states(robot, k=20, seed=99):
        Y = robot.regressor(q, v, a)
        close(base.regressor(Y) @ pib, Y @ pi)
        close(Y @ base.projector, base.regressor(Y))
        stacked.append(Y)
    A = np.vstack(stacked * 1)
    # independent rank count by SVD on fresh states
    s = np.linalg.svd(A, compute_uv=False)
    assert base.n_base == int(np.sum(s > 1e-9 * s[0]))
    np.testing.assert_allclose(base.K @ base.projector, np.eye(base.n_base))
    np.testing.assert_allclose(base.to_base(base.from_base(pib)), pib, atol=1e-12)
    assert len(base.names) == base.n_base


def test_base_parameter_count_planar2():
    """A planar 2R arm in a vertical plane has 6 base parameters without friction
    (ZZ1R, MX1, MZ1 of link 1 after grouping, and ZZ2, MX2, MZ2 of link 2):
    here joints rotate about y, so the in-plane first moments are x and z."""
    assert RobotModel("planar2").base_parameters().n_base == 6


# ---------------------------------------------------------------- inertial utilities
def test_parameter_orders_round_trip_and_meaning():
    rng = np.random.default_rng(0)
    pi = rng.standard_normal(30)
    for o in ("ardl", "thunder"):
        np.testing.assert_array_equal(convert_order(convert_order(pi, "pinocchio", o), o, "pinocchio"), pi)
    blk = np.array([2.0, 0.1, 0.2, 0.3, 1.0, 0.01, 2.0, 0.02, 0.03, 3.0])  # pinocchio order
    ardl = convert_order(blk, "pinocchio", "ardl")
    # ARDL SpatialInertia(in): diag = in[4:7], (0,1)=in[7], (0,2)=in[8], (1,2)=in[9]
    np.testing.assert_array_equal(ardl[4:7], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(ardl[7:], [0.01, 0.02, 0.03])
    th = convert_order(blk, "pinocchio", "thunder")  # Ixx Ixy Ixz Iyy Iyz Izz
    np.testing.assert_array_equal(th[4:], [1.0, 0.01, 0.02, 2.0, 0.03, 3.0])
    with pytest.raises(ValueError, match="order"):
        convert_order(blk, "pinocchio", "nope")


def test_from_mass_com_inertia_matches_pinocchio():
    I = np.array([[0.02, 0.001, 0.0], [0.001, 0.03, 0.002], [0.0, 0.002, 0.04]])
    c = np.array([0.1, -0.05, 0.2])
    pi = from_mass_com_inertia(1.5, c, I)
    np.testing.assert_allclose(pi, pin.Inertia(1.5, c, I).toDynamicParameters(), atol=1e-14)


def test_transform_matrix_matches_pinocchio_se3_action():
    rng = np.random.default_rng(2)
    X = pin.SE3.Random()
    In = pin.Inertia.Random()
    L = transform_matrix(X.rotation, X.translation)
    np.testing.assert_allclose(L @ In.toDynamicParameters(), X.act(In).toDynamicParameters(), atol=1e-12)
    del rng


def test_physical_consistency_check_names_link():
    rm = RobotModel("panda")
    pi = rm.parameters
    rm.set_parameters(pi)  # the shipped parameters are consistent
    bad = pi.copy()
    bad[10 * 3] = -1.0  # negative mass of link 4
    with pytest.raises(PhysicalConsistencyError, match="panda_link4"):
        rm.set_parameters(bad)
    bad = pi.copy()
    bad[10 * 5 + 4] = 10.0  # Ixx of link 6 violates the triangle inequality
    with pytest.raises(PhysicalConsistencyError, match="panda_link6"):
        rm.set_parameters(bad)
    assert np.linalg.eigvalsh(pseudo_inertia(pi[:10]))[0] > 0
    np.testing.assert_array_equal(rm.parameters, pi)  # refused updates changed nothing


def test_payload_matches_a_model_with_the_payload_as_a_body():
    rm = RobotModel("panda")
    com, I = np.array([0.01, -0.02, 0.05]), np.diag([0.002, 0.003, 0.001])
    p10 = from_mass_com_inertia(1.0, com, I)
    rm.set_payload(p10)  # on the end-effector frame
    # reference: pinocchio model with the payload appended as a body to joint 7
    m = pin.buildModelFromUrdf(urdf_path("panda"))
    f = m.frames[m.getFrameId(rm.ee_frame)]
    m.appendBodyToJoint(f.parentJoint, pin.Inertia(1.0, com, I), f.placement)
    d = m.createData()
    for q, v, a, _, _ in states(rm, k=3):
        close(rm.inverse_dynamics(q, v, a), pin.rnea(m, d, q, v, a))
        Y = rm.regressor(q, v, a)
        bare = RobotModel("panda")
        close(rm.payload_regressor(Y) @ p10, Y @ rm.parameters - Y @ bare.parameters)
    np.testing.assert_allclose(rm.payload_parameters(), p10)
    np.testing.assert_allclose(rm.link_parameters, RobotModel("panda").link_parameters)
    rm.clear_payload()
    np.testing.assert_allclose(rm.parameters, RobotModel("panda").parameters)


def test_end_effector_is_declared_separately_and_removable():
    """The Panda URDF's Franka Hand (0.76 kg, fixed after joint 7) is the end effector:
    kept as its own 10 parameters, not merged into link 7; with end_effector="none" the
    model is the arm without it -- the same as pinocchio's model of the URDF with the
    hand's inertial deleted (and, with it, RNEA of the full URDF)."""
    import xml.etree.ElementTree as ET

    from adaptive_dynamics.robots import strip_inertials

    text = open(urdf_path("panda")).read()
    full = pin.buildModelFromUrdf(urdf_path("panda"))
    bare = pin.buildModelFromXML(strip_inertials(text, ["panda_hand"]))
    df, db = full.createData(), bare.createData()
    rm = RobotModel("panda")
    assert rm.end_effector_links == ["panda_hand"] and rm.end_effector == "hand"
    ee = rm.end_effector_parameters()
    assert ee[0] == pytest.approx(0.76)                       # the hand's mass, in joint 7's frame
    assert rm.link_parameters[60] == pytest.approx(bare.inertias[7].mass)
    none = RobotModel("panda", end_effector="none")
    for q, v, a, _, _ in states(rm, k=3):
        close(rm.inverse_dynamics(q, v, a), pin.rnea(full, df, q, v, a))
        close(none.inverse_dynamics(q, v, a), pin.rnea(bare, db, q, v, a))
    rm.set_end_effector("none")
    np.testing.assert_allclose(rm.parameters, none.parameters)
    rm.set_end_effector("hand")
    np.testing.assert_allclose(rm.parameters[60:70], bare.inertias[7].toDynamicParameters() + ee)
    # set_parameters takes the effective pi; the end effector stays declared
    rm.set_parameters(rm.parameters)
    np.testing.assert_allclose(rm.link_parameters[60:70], bare.inertias[7].toDynamicParameters(), atol=1e-12)
    with pytest.raises(ValueError, match="panda_hand"):
        rm.set_end_effector("gripper")
    assert RobotModel("iiwa14").end_effector_parameters() is None
    # a URDF given as text is split the same way
    assert RobotModel(ET.tostring(ET.fromstring(text), encoding="unicode")).end_effector_links == ["panda_hand"]


# ---------------------------------------------------------------- validation
BAD = {"short": np.zeros(1), "nan": None, "inf": None, "text": "abc"}


@pytest.mark.parametrize("fn,args", [
    ("regressor", ("q", "v", "a")),
    ("slotine_li_regressor", ("q", "v", "vr", "ar")),
    ("inverse_dynamics", ("q", "v", "a")),
    ("mass_matrix", ("q",)),
    ("coriolis_matrix", ("q", "v")),
    ("gravity", ("q",)),
    ("jacobian", ("q",)),
    ("jacobian_dot", ("q", "v")),
    ("regressor_derivatives", ("q", "v", "a")),
])
@pytest.mark.parametrize("kind", ["short", "nan", "inf", "text"])
def test_inputs_validated_with_named_errors(fn, args, kind):
    rm = RobotModel("panda")
    good = {k: np.full(rm.n, 0.1) for k in args}
    extra = (np.zeros(rm.n_params),) if fn == "regressor_derivatives" else ()
    for arg in args:
        vals = dict(good)
        if kind == "nan":
            bad = np.full(rm.n, 0.1)
            bad[3] = np.nan
        elif kind == "inf":
            bad = np.full(rm.n, 0.1)
            bad[6] = -np.inf
        else:
            bad = BAD[kind]
        vals[arg] = bad
        with pytest.raises(ValueError, match=rf"^{arg}\b"):
            getattr(rm, fn)(*vals.values(), *extra)


@pytest.mark.parametrize("name", ROBOTS)
def test_fast_path_catches_non_finite_in_every_entry(name):
    """The hot-path NaN/inf probe must see every entry of every argument."""
    rm = RobotModel(name)
    rng = np.random.default_rng(0)
    q, v, a = rm.random_state(rng)
    calls = {"regressor": (rm.regressor, ["q", "v", "a"]),
             "slotine_li_regressor": (rm.slotine_li_regressor, ["q", "v", "vr", "ar"])}
    for fn, args in calls.values():
        base = dict(zip(args, (q, v, a, a)))
        for arg in args:
            for k in range(rm.n):
                for bad in (np.nan, np.inf, -np.inf):
                    vals = {key: val.copy() for key, val in base.items()}
                    vals[arg][k] = bad
                    with pytest.raises(ValueError, match=rf"^{arg}: entry {k}"):
                        with np.errstate(invalid="ignore"):
                            fn(*vals.values())


def test_joint_index_by_name():
    rm = RobotModel("panda")
    names = list(reversed(rm.joint_names))
    idx = rm.joint_index(names)
    assert [names[i] for i in idx] == rm.joint_names
    with pytest.raises(ValueError, match="missing"):
        rm.joint_index(names[:-1])
    with pytest.raises(ValueError, match="unexpected"):
        rm.joint_index(names + ["bogus"])


def test_inverse_dynamics_checks_every_input_on_its_fast_path():
    """Valid float64 vectors take one combined finiteness test; a NaN or inf in any of
    q, v, a is still refused naming it, and other array-likes are converted as before."""
    import pinocchio as pin
    m = RobotModel("panda")
    rng = np.random.default_rng(3)
    q, v, a = m.random_state(rng)
    pm = pin.buildModelFromUrdf(m.urdf_path)
    ref = pin.rnea(pm, pm.createData(), q, v, a)
    np.testing.assert_allclose(m.inverse_dynamics(q, v, a), ref, atol=1e-9)
    a32 = a.astype(np.float32)                          # converted, not taken as is
    ref32 = pin.rnea(pm, pm.createData(), q, v, a32.astype(float))
    np.testing.assert_allclose(m.inverse_dynamics(list(q), tuple(v), a32), ref32, atol=1e-9)
    for name, bad in (("q", np.nan), ("v", np.inf), ("a", -np.inf)):
        args = {"q": q.copy(), "v": v.copy(), "a": a.copy()}
        args[name][2] = bad
        with pytest.raises(ValueError, match=f"^{name}: entry 2"):
            m.inverse_dynamics(**args)


@pytest.mark.parametrize("robot", ["panda", "iiwa14"])
def test_coriolis_and_gravity_time_derivatives_match_finite_differences(robot):
    """Thunder's get_C_dot / get_G_dot: dC/dt along (q_dot, q_ddot) and dg/dt along q_dot,
    analytical (pinocchio's RNEA / gravity derivatives), against central differences of
    C and g along the motion -- with the URDF's parameters and with non-physical ones
    (a negative mass, a scaled estimate), which the model evaluates as a difference."""
    m = RobotModel(robot)
    rng = np.random.default_rng(7)
    h = 1e-6
    for params in ("urdf", "nonphysical"):
        if params == "nonphysical":
            pi = m.parameters.copy()
            pi[10 * 2] = -0.5                                   # link 3 with a negative mass
            pi[10 * 5: 10 * 6] *= 3.0
            m.set_parameters(pi, check=False)
        for _ in range(3):
            q, v, a = m.random_state(rng)
            fd_c = (m.coriolis_matrix(q + h * v, v + h * a) - m.coriolis_matrix(q - h * v, v - h * a)) / (2 * h)
            Cd = m.coriolis_matrix_dot(q, v, a)
            assert np.abs(Cd - fd_c).max() <= 1e-6 * max(1.0, np.abs(fd_c).max()), (params, np.abs(Cd - fd_c).max())
            fd_g = (m.gravity(q + h * v) - m.gravity(q - h * v)) / (2 * h)
            gd = m.gravity_dot(q, v)
            assert np.abs(gd - fd_g).max() <= 1e-6 * max(1.0, np.abs(fd_g).max()), (params, np.abs(gd - fd_g).max())
        # d/dt (M_dot) = C_dot + C_dot^T: the skew-symmetry of M_dot - 2C holds along the motion
        Md = lambda qq, vv: m.mass_matrix_dot(qq, vv)        # noqa: E731
        fd_md = (Md(q + h * v, v + h * a) - Md(q - h * v, v - h * a)) / (2 * h)
        np.testing.assert_allclose(Cd + Cd.T, fd_md, atol=1e-6 * max(1.0, np.abs(fd_md).max()))


def test_thunder_parameter_files_round_trip_and_match_the_urdf(tmp_path):
    """A Thunder *_inertial_REG.yaml (link1..linkN; mass, m_CoM_*, inertia about the link
    frame in Thunder's order): written from the model, read back exactly; its numbers are
    the URDF's inertials by the parallel-axis theorem (computed here from the URDF text);
    blocks keyed by link name load too; a missing key or a non-physical block is refused
    naming the link, leaving the model unchanged; Thunder's friction terms are reported as
    not read."""
    import xml.etree.ElementTree as ET

    import yaml
    from adaptive_dynamics.dynamics.thunder_params import THUNDER_REG_KEYS
    m = RobotModel("planar2")
    path = m.save_thunder_yaml(tmp_path / "planar2_inertial_REG.yaml")
    doc = yaml.safe_load(open(path))
    assert sorted(doc) == ["link1", "link2"] and list(doc["link1"]) == list(THUNDER_REG_KEYS)
    root = ET.parse(m.urdf_path).getroot()
    for k, link in enumerate(m.link_names):
        el = root.find(f"link[@name='{link}']/inertial")
        mass = float(el.find("mass").get("value"))
        c = np.array([float(x) for x in el.find("origin").get("xyz").split()])
        assert el.find("origin").get("rpy", "0 0 0").split() == ["0", "0", "0"]
        ine = el.find("inertia")
        Ic = np.array([[float(ine.get("ixx")), float(ine.get("ixy")), float(ine.get("ixz"))],
                       [float(ine.get("ixy")), float(ine.get("iyy")), float(ine.get("iyz"))],
                       [float(ine.get("ixz")), float(ine.get("iyz")), float(ine.get("izz"))]])
        Io = Ic + mass * (c @ c * np.eye(3) - np.outer(c, c))            # about the link frame's origin
        want = {"mass": mass, "m_CoM_x": mass * c[0], "m_CoM_y": mass * c[1], "m_CoM_z": mass * c[2],
                "Ixx": Io[0, 0], "Ixy": Io[0, 1], "Ixz": Io[0, 2], "Iyy": Io[1, 1], "Iyz": Io[1, 2], "Izz": Io[2, 2]}
        for key, val in want.items():
            assert abs(doc[f"link{k + 1}"][key] - val) <= 1e-12 * max(1.0, abs(val)), (link, key)
    pi0 = m.parameters.copy()
    # read back, by link names, with Thunder's friction terms present
    doc2 = {m.link_names[0]: {**doc["link1"], "d1": 0.1, "d2": 0.01}, "link2": dict(doc["link2"])}
    doc2["link2"]["mass"] *= 2.0
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(doc2))
    out = m.load_thunder_yaml(tmp_path / "b.yaml")
    assert out["links"] == [m.link_names[0], "link2"] and out["ignored"] == {m.link_names[0]: ["d1", "d2"]}
    assert m.get_link_parameters(m.link_names[1])[0] == pytest.approx(2.0 * pi0[10])
    np.testing.assert_allclose(m.parameters[:10], pi0[:10], rtol=0, atol=0)
    m.load_thunder_yaml(path)
    np.testing.assert_allclose(m.parameters, pi0, rtol=0, atol=1e-15)
    # refused: a missing key, a negative mass -- the model keeps what it had
    bad = {"link1": dict(doc["link1"]), "link2": {k: v for k, v in doc["link2"].items() if k != "Iyz"}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match=r"link2 lacks \['Iyz'\]"):
        m.load_thunder_yaml(tmp_path / "c.yaml")
    bad = {"link1": dict(doc["link1"], mass=-1.0), "link2": dict(doc["link2"])}
    (tmp_path / "d.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match="link1"):
        m.load_thunder_yaml(tmp_path / "d.yaml")
    np.testing.assert_allclose(m.parameters, pi0, rtol=0, atol=1e-15)


def test_the_panda_link_frames_are_thunders_dh_frames(tmp_path):
    """Thunder's parameter files are in its Denavit-Hartenberg frames (Table 5): rows 1-6
    are the Panda URDF's link frames, row 7 carries the flange offset d = 0.107 m and is
    the URDF's panda_link8.  So a Thunder Panda file's link 7 block is about the flange:
    Table 8's initial estimate (0.736 kg, CoM z = -0.045 m) is the URDF's link 7 alone
    (CoM z = 0.0616 m about panda_link7), and files round-trip through that frame."""
    import pinocchio as pin
    import yaml
    m = RobotModel("panda")
    dh = [(0, 0, 0.333), (0, -np.pi / 2, 0), (0, np.pi / 2, 0.316), (0.0825, np.pi / 2, 0),
          (-0.0825, -np.pi / 2, 0.384), (0, np.pi / 2, 0), (0.088, np.pi / 2, 0.107)]   # a, alpha, d

    def mdh(a, al, d, th):
        ca, sa, ct, st = np.cos(al), np.sin(al), np.cos(th), np.sin(th)
        return np.array([[ct, -st, 0, a], [st * ca, ct * ca, -sa, -d * sa], [st * sa, ct * sa, ca, d * ca],
                         [0, 0, 0, 1]])

    data = m.model.createData()
    for q in np.random.default_rng(4).uniform(m.lower, m.upper, (3, 7)):
        pin.forwardKinematics(m.model, data, q)
        pin.updateFramePlacements(m.model, data)
        T = np.eye(4)
        for k, (a, al, d) in enumerate(dh):
            T = T @ mdh(a, al, d, q[k])
            frame = f"panda_link{k + 1}" if k < 6 else "panda_link8"
            np.testing.assert_allclose(data.oMf[m.model.getFrameId(frame)].homogeneous, T, atol=1e-12)
    # the file's link 7 block is about the flange: mass and CoM by hand
    m.set_end_effector("none")
    path = m.save_thunder_yaml(tmp_path / "panda_inertial_REG.yaml")
    blk = yaml.safe_load(open(path))["link7"]
    l7 = m.get_link_parameters("panda_link7")
    assert blk["mass"] == pytest.approx(l7[0], rel=1e-12)
    com = np.array([blk["m_CoM_x"], blk["m_CoM_y"], blk["m_CoM_z"]]) / blk["mass"]
    np.testing.assert_allclose(com, l7[1:4] / l7[0] - [0, 0, 0.107], atol=1e-12)
    np.testing.assert_allclose(com, [0.014, -0.004, -0.045], atol=0.004)   # Table 8, "Initial"
    pi0 = m.parameters.copy()
    m.set_link_parameters("panda_link7", 2 * l7)
    m.load_thunder_yaml(path)
    np.testing.assert_allclose(m.parameters, pi0, rtol=1e-12, atol=1e-14)
    # another arm (or a frame of choice): frames= names it
    m.load_thunder_yaml(path, frames={})          # read as if about panda_link7: the CoM moves by 0.107
    assert m.get_link_parameters("panda_link7")[3] / l7[0] == pytest.approx(com[2], abs=1e-12)


def test_a_thunder_estimate_leaves_the_model_as_it_was(tmp_path):
    """``thunder_estimate`` (the adaptive controller's ``initial_estimate: file``) reads the
    file into a parameter vector without touching the model: the vector equals what a
    second model gives after loading the same file (hand end effector, a payload and
    friction columns kept), and the model's parameters are bit-for-bit the same after."""
    import yaml
    from adaptive_dynamics.control.adaptive_setup import thunder_estimate
    m = RobotModel("panda", friction=True)
    m.set_friction(np.linspace(0.1, 0.7, 7), np.linspace(0.2, 0.8, 7))
    payload = pin.Inertia(0.8, np.array([0.01, 0.02, 0.05]), np.diag([2e-3, 2e-3, 1e-3])).toDynamicParameters()
    m.set_payload(payload)
    doc = yaml.safe_load(open(m.save_thunder_yaml(tmp_path / "a.yaml")))
    for k, block in enumerate(doc.values()):
        block["mass"] *= 1.0 + 0.1 * k
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(doc))
    before = m.parameters.copy()
    pi, info = thunder_estimate(m, str(tmp_path / "b.yaml"))
    np.testing.assert_array_equal(m.parameters, before)
    ref = RobotModel("panda", friction=True)
    ref.set_friction(np.linspace(0.1, 0.7, 7), np.linspace(0.2, 0.8, 7))
    ref.set_payload(payload)
    ref.load_thunder_yaml(tmp_path / "b.yaml")
    np.testing.assert_allclose(pi, ref.parameters, rtol=0, atol=1e-12)
    assert not np.allclose(pi, before) and info["links"] == list(doc)

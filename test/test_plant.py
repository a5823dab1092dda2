"""MujocoPlant: the simulated robot with injected "reality" (adaptive_dynamics.sim.plant).

Every check of the dynamics is against pinocchio on the same URDF (RobotModel), so the
plant is exactly "nominal model + what RealityConfig injects" and nothing else.
"""
from __future__ import annotations

import numpy as np
import pinocchio as pin
import pytest

from adaptive_dynamics.dynamics.inertial import from_mass_com_inertia
from adaptive_dynamics.dynamics.model import RobotModel
from adaptive_dynamics.robots import robot_config
from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig

DT = 1e-3


@pytest.fixture(scope="module")
def panda_model():
    return RobotModel("panda")


def _random_state(plant, rng, vscale=0.5):
    q = rng.uniform(plant.lower, plant.upper)
    v = rng.uniform(-1, 1, plant.n) * plant.velocity_limit * vscale
    return q, v


# ------------------------------------------------------------------ nominal dynamics


@pytest.mark.parametrize("robot", ["panda", "iiwa14", "planar2"])
@pytest.mark.parametrize("integrator", ["implicitfast", "rk4"])
def test_reality_off_acceleration_equals_aba(robot, integrator):
    plant = MujocoPlant(robot, integrator=integrator)
    rm = RobotModel(robot)
    assert plant.joint_names == rm.joint_names
    rng = np.random.default_rng(1)
    for _ in range(10):
        q, v = _random_state(plant, rng)
        tau = rng.uniform(-0.5, 0.5, plant.n) * plant.effort_limit
        plant.reset(q, v)
        plant.step(tau)
        a_pin = pin.aba(rm.model, rm.data, q, v, tau)
        np.testing.assert_allclose(plant.acceleration, a_pin, rtol=0, atol=1e-8 * max(1.0, np.abs(a_pin).max()))
        if integrator == "implicitfast":
            # semi-implicit Euler with exactly this acceleration (no damping when reality is off)
            qn, vn = plant.true_state()
            np.testing.assert_allclose(vn, v + DT * a_pin, rtol=0, atol=1e-10 * max(1.0, np.abs(a_pin).max()))
            np.testing.assert_allclose(qn, q + DT * vn, rtol=0, atol=1e-12)


def test_time_and_counters_advance():
    plant = MujocoPlant("planar2")
    t0 = plant.time
    for _ in range(25):
        plant.step(np.zeros(2))
    assert plant.time == pytest.approx(t0 + 25 * DT, abs=1e-12)
    assert plant.steps == 25
    t, q, v, tau = plant.state()
    assert t == plant.time and q.shape == v.shape == tau.shape == (2,)


def test_joint_names_reorder_every_array(panda_model):
    order = list(reversed(panda_model.joint_names))
    plant = MujocoPlant("panda", joint_names=order)
    assert plant.joint_names == order
    np.testing.assert_array_equal(plant.effort_limit, panda_model.effort_limit[::-1])
    q, _ = plant.true_state()
    np.testing.assert_allclose(plant.gravity_torque(), panda_model.gravity(q[::-1])[::-1], atol=1e-10)
    with pytest.raises(ValueError, match="missing.*panda_joint7"):
        MujocoPlant("panda", joint_names=order[1:])
    with pytest.raises(ValueError, match="unknown.*bogus"):
        MujocoPlant("panda", joint_names=order + ["bogus"])


# ------------------------------------------------------------------ friction


@pytest.mark.parametrize("integrator", ["implicitfast", "rk4"])
def test_friction_torque_matches_viscous_plus_coulomb(panda_model, integrator):
    fv, fc = np.array([0.3, 0.5, 0.2, 0.4, 0.1, 0.05, 0.08]), np.array([1.0, 2.0, 0.8, 1.2, 0.4, 0.3, 0.2])
    eps = 0.05
    plant = MujocoPlant("panda", integrator=integrator,
                        reality=RealityConfig(friction_viscous=fv, friction_coulomb=fc, coulomb_smoothing=eps))
    rng = np.random.default_rng(2)
    for k in range(20):
        q, v = _random_state(plant, rng, vscale=0.3 if k % 2 else 0.02)  # also |v| ~ eps (smooth zone)
        tau = rng.uniform(-0.3, 0.3, plant.n) * plant.effort_limit
        plant.reset(q, v)
        plant.step(tau)
        # observed friction: what the rigid body did not receive of the applied torque
        observed = tau - pin.rnea(panda_model.model, panda_model.data, q, v, plant.acceleration)
        expected = fv * v + fc * np.tanh(v / eps)
        np.testing.assert_allclose(observed, expected, rtol=0, atol=1e-8)
        np.testing.assert_allclose(plant.friction_torque, expected, rtol=0, atol=1e-12)
        np.testing.assert_allclose(plant.friction_model(v), expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize("integrator", ["implicitfast", "rk4"])
def test_stribeck_and_position_ripple_act_as_configured(panda_model, integrator):
    """Effects outside the rigid-body + viscous/Coulomb class: the torque the rigid body did
    not receive (pinocchio's inverse dynamics of MuJoCo's acceleration) is
    f_v v + (f_c + f_s exp(-(v/v_s)^2)) tanh(v/eps) + a sin(N q), written out here."""
    fv, fc = np.full(7, 0.1), np.full(7, 0.3)
    fs, vs, eps, a, N = np.linspace(0.5, 1.5, 7), 0.2, 0.02, np.linspace(0.2, 0.8, 7), 7.0
    plant = MujocoPlant("panda", integrator=integrator, reality=RealityConfig(
        friction_viscous=fv, friction_coulomb=fc, coulomb_smoothing=eps, friction_stribeck=fs,
        stribeck_velocity=vs, ripple_amplitude=a, ripple_periods=N))
    rng = np.random.default_rng(5)
    for k in range(20):
        q, v = _random_state(plant, rng, vscale=0.4 if k % 2 else 0.05)
        tau = rng.uniform(-0.3, 0.3, plant.n) * plant.effort_limit
        plant.reset(q, v)
        plant.step(tau)
        observed = tau - pin.rnea(panda_model.model, panda_model.data, q, v, plant.acceleration)
        expected = fv * v + (fc + fs * np.exp(-(v / vs) ** 2)) * np.tanh(v / eps) + a * np.sin(N * q)
        np.testing.assert_allclose(observed, expected, rtol=0, atol=1e-8)
        np.testing.assert_allclose(plant.friction_model(v, q), expected, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="needs q"):
        plant.friction_model(v)
    with pytest.raises(ValueError, match="stribeck_velocity must be > 0"):
        MujocoPlant("panda", reality=RealityConfig(stribeck_velocity=0.0))
    # the ripple makes the plant's joint torque leave the rigid-body model class: the best
    # linear fit on the base regressor + friction columns leaves it in the residual
    from adaptive_dynamics.dynamics import RobotModel
    m = RobotModel("panda", friction=True)
    Q = rng.uniform(m.lower, m.upper, (400, 7))
    V = rng.normal(0, 0.5, (400, 7))
    T = np.stack([plant.friction_model(v, q) for q, v in zip(Q, V)])
    Y = np.vstack([m.regressor(q, v, np.zeros(7)) for q, v in zip(Q, V)])
    res = T.reshape(-1) - Y @ np.linalg.lstsq(Y, T.reshape(-1), rcond=None)[0]
    assert np.sqrt(np.mean(res ** 2)) > 0.2


def test_steep_coulomb_is_stable_and_sticks():
    # eps = 1e-4 rad/s: slope f_c/eps = 10^4 N m s/rad on joints whose inertia is ~0.01 kg m^2;
    # an explicit step would explode, the linearly-implicit one must settle.
    plant = MujocoPlant("planar2", reality=RealityConfig(friction_viscous=0.0, friction_coulomb=[5.0, 5.0],
                                                         coulomb_smoothing=1e-4), q0=[0.0, 0.0])
    plant.reset([0.0, 0.0], [0.5, -0.5])
    g = plant.gravity_torque()
    for _ in range(2000):
        _, v = plant.true_state()
        # gravity compensated plus 2 N m (below the 5 N m Coulomb level): must stick
        plant.step(plant.gravity_torque() + 2.0)
    _, v = plant.true_state()
    assert np.all(np.abs(v) < 1e-3), v
    assert np.all(np.isfinite(g))


# ------------------------------------------------------------------ measured torque


def test_measured_torque_definition(panda_model):
    fv, fc = robot_config("panda")["friction_viscous"], robot_config("panda")["friction_coulomb"]
    bias = np.linspace(-0.5, 0.5, 7)
    plant = MujocoPlant("panda", reality=RealityConfig(friction_viscous=fv, friction_coulomb=fc, tau_bias=bias))
    rng = np.random.default_rng(3)
    q, v = _random_state(plant, rng)
    plant.reset(q, v)
    _, _, _, tau0 = plant.state()
    np.testing.assert_array_equal(tau0, bias)  # nothing applied yet: the sensor reads its bias
    tau = rng.uniform(-0.3, 0.3, 7) * plant.effort_limit
    tau[0] = 200.0  # saturates at 87
    plant.step(tau)
    _, _, _, meas = plant.state()
    applied = np.clip(tau, -plant.effort_limit, plant.effort_limit)
    np.testing.assert_array_equal(plant.applied_torque, applied)
    np.testing.assert_allclose(meas, applied + bias, rtol=0, atol=1e-14)
    # motor side of the friction: the measurement explains rigid-body dynamics AND friction
    rigid = pin.rnea(panda_model.model, panda_model.data, q, v, plant.acceleration)
    np.testing.assert_allclose(meas - bias, rigid + plant.friction_model(v), rtol=0, atol=1e-8)
    assert np.abs(meas - bias - rigid).max() > 0.05  # friction is really in there


# ------------------------------------------------------------------ payload and link scaling


PAYLOAD = dict(payload_mass=2.0, payload_com=(0.03, -0.02, 0.06),
               payload_inertia=[0.02, 0.002, 0.001, 0.03, 0.0, 0.025])


def _payload_pi10(plant):
    return from_mass_com_inertia(plant.payload_mass, plant.payload_com, plant.payload_inertia)


def test_payload_toggle_changes_gravity_as_pinocchio_predicts():
    plant = MujocoPlant("panda", reality=RealityConfig(**PAYLOAD, payload_enabled=False))
    assert plant.payload_frame == "panda_hand_tcp"
    nominal = RobotModel("panda")
    loaded = RobotModel("panda")
    loaded.set_payload(_payload_pi10(plant), "panda_hand_tcp")
    rng = np.random.default_rng(4)
    for _ in range(5):
        q = rng.uniform(plant.lower, plant.upper)
        plant.reset(q)
        plant.set_payload_enabled(False)
        g_off = plant.gravity_torque()
        plant.set_payload_enabled(True)
        g_on = plant.gravity_torque()
        np.testing.assert_allclose(g_on - g_off, loaded.gravity(q) - nominal.gravity(q), rtol=0, atol=1e-6)
        np.testing.assert_allclose(g_off, nominal.gravity(q), rtol=0, atol=1e-9)
        # full inertia (anisotropic, off-diagonal payload inertia) too
        np.testing.assert_allclose(plant.mass_matrix(), loaded.mass_matrix(q), rtol=0, atol=1e-9)
        # and the dynamics actually stepped: at rest under the loaded gravity torque nothing moves
        plant.step(loaded.gravity(q))
        np.testing.assert_allclose(plant.acceleration, 0.0, atol=1e-8)
        plant.reset(q)
        plant.set_payload_enabled(False)
        plant.step(loaded.gravity(q))
        np.testing.assert_allclose(plant.acceleration, pin.aba(nominal.model, nominal.data, q, np.zeros(7),
                                                                loaded.gravity(q)), atol=1e-8)
        assert np.abs(plant.acceleration).max() > 0.1
    np.testing.assert_array_equal(plant.payload_parameters(), np.zeros(10))
    plant.set_payload_enabled(True)
    np.testing.assert_allclose(plant.payload_parameters(), _payload_pi10(plant))


def test_payload_on_another_frame_and_runtime_change():
    plant = MujocoPlant("iiwa14", reality=RealityConfig(payload_mass=1.0, payload_com=(0.0, 0.0, 0.1),
                                                        payload_frame="iiwa_link_5", payload_enabled=True))
    rm = RobotModel("iiwa14")
    q = np.full(7, 0.4)
    rm.set_payload(from_mass_com_inertia(1.0, [0, 0, 0.1], plant.payload_inertia), "iiwa_link_5")
    np.testing.assert_allclose(plant.gravity_torque(q), rm.gravity(q), atol=1e-9)
    plant.set_payload(mass=3.0)  # new mass, default sphere inertia
    rm.set_payload(from_mass_com_inertia(3.0, [0, 0, 0.1], 0.4 * 3.0 * 0.02 ** 2 * np.eye(3)), "iiwa_link_5")
    np.testing.assert_allclose(plant.gravity_torque(q), rm.gravity(q), atol=1e-9)
    with pytest.raises(ValueError, match="not a link"):
        MujocoPlant("iiwa14", reality=RealityConfig(payload_mass=1.0, payload_frame="nope"))
    with pytest.raises(ValueError, match="not physical"):
        MujocoPlant("iiwa14", reality=RealityConfig(payload_mass=1.0, payload_inertia=[0.01, 0.01, 0.05]))


def test_link_scaling_scalar_and_per_link():
    nominal = RobotModel("panda")
    q = np.array([0.3, -0.5, 0.2, -2.0, 0.4, 1.5, 0.1])
    plant = MujocoPlant("panda", reality=RealityConfig(link_scale=1.25))
    np.testing.assert_allclose(plant.gravity_torque(q), 1.25 * nominal.gravity(q), atol=1e-9)
    np.testing.assert_allclose(plant.mass_matrix(q), 1.25 * nominal.mass_matrix(q), atol=1e-9)

    plant = MujocoPlant("panda", reality=RealityConfig(link_scale={"panda_link3": 1.5, "panda_link5": 0.8}))
    scaled = RobotModel("panda")
    for link, s in (("panda_link3", 1.5), ("panda_link5", 0.8)):
        scaled.set_link_parameters(link, s * nominal.get_link_parameters(link))
    plant.reset(q)
    g_nom = nominal.gravity(q)
    np.testing.assert_allclose(plant.gravity_torque() - g_nom, scaled.gravity(q) - g_nom, atol=1e-6)
    np.testing.assert_allclose(plant.mass_matrix(), scaled.mass_matrix(q), atol=1e-9)
    assert np.abs(plant.gravity_torque() - g_nom).max() > 0.1
    # scaling + payload compose: the payload is not scaled
    plant = MujocoPlant("panda", reality=RealityConfig(link_scale=1.1, **PAYLOAD, payload_enabled=True))
    both = RobotModel("panda")
    both.set_parameters(1.1 * nominal.parameters)
    both.set_payload(_payload_pi10(plant))
    np.testing.assert_allclose(plant.gravity_torque(q), both.gravity(q), atol=1e-6)
    with pytest.raises(ValueError, match="link_scale.*not a link"):
        MujocoPlant("panda", reality=RealityConfig(link_scale={"panda_link99": 2.0}))


# ------------------------------------------------------------------ limits, noise, determinism


def test_effort_saturation_is_clipped_and_counted():
    plant = MujocoPlant("panda")
    cmd = np.zeros(7)
    cmd[1], cmd[5] = 300.0, -20.0  # limits 87 and 12
    for _ in range(5):
        plant.step(cmd)
    plant.step(np.zeros(7))
    np.testing.assert_array_equal(plant.saturation_count, [0, 5, 0, 0, 0, 5, 0])
    assert not plant.saturated.any()
    plant.step(cmd)
    np.testing.assert_array_equal(plant.applied_torque[[1, 5]], [87.0, -12.0])
    np.testing.assert_array_equal(plant.saturated, [False, True, False, False, False, True, False])
    assert plant.diagnostics()["saturation_count"]["panda_joint2"] == 6


def test_noise_statistics_and_bias():
    std_q, std_v, std_tau = 1e-3, np.linspace(0.01, 0.04, 7), 0.2
    bias = np.arange(7) * 0.1
    plant = MujocoPlant("panda", reality=RealityConfig(noise_std_q=std_q, noise_std_v=std_v,
                                                       noise_std_tau=std_tau, tau_bias=bias, seed=7))
    N = 5000
    eq, ev, et = np.empty((N, 7)), np.empty((N, 7)), np.empty((N, 7))
    for k in range(N):
        q, _ = plant.true_state()
        cmd = plant.gravity_torque()
        plant.step(cmd)
        _, qm, vm, tm = plant.state()
        qt, vt = plant.true_state()
        eq[k], ev[k], et[k] = qm - qt, vm - vt, tm - plant.applied_torque
    for err, std in ((eq, np.full(7, std_q)), (ev, std_v), (et - bias, np.full(7, std_tau))):
        np.testing.assert_allclose(err.std(axis=0), std, rtol=0.1)
        assert np.all(np.abs(err.mean(axis=0)) < 4 * std / np.sqrt(N))
    # the same reading between two steps
    a, b = plant.state(), plant.state()
    assert all(np.array_equal(x, y) for x, y in zip(a, b))


def _run(seed, n_steps=300):
    fv, fc = robot_config("panda")["friction_viscous"], robot_config("panda")["friction_coulomb"]
    plant = MujocoPlant("panda", reality=RealityConfig(friction_viscous=fv, friction_coulomb=fc, noise_std_q=1e-4,
                                                       noise_std_v=1e-3, noise_std_tau=0.05, seed=seed, **PAYLOAD,
                                                       payload_enabled=True))
    out = []
    for k in range(n_steps):
        _, q, v, _ = plant.state()
        cmd = 20.0 * np.sin(0.01 * k + np.arange(7)) * plant.effort_limit / 87.0
        if k == 150:
            plant.set_payload_enabled(False)
        plant.step(cmd)
        out.append(np.concatenate([plant.state()[1], plant.state()[2], plant.state()[3], *plant.true_state()]))
    return np.array(out)


def test_determinism_same_seed_bit_for_bit():
    a, b = _run(11), _run(11)
    assert np.array_equal(a, b)
    c = _run(12)
    assert not np.array_equal(a, c)
    # the noise-free trajectory does not depend on the noise seed
    assert np.array_equal(a[:, 21:], c[:, 21:])


# ------------------------------------------------------------------ reset, bad commands, hold


def test_reset():
    plant = MujocoPlant("panda", q0=np.array([0.0, -0.3, 0.0, -2.0, 0.0, 1.8, 0.7]))
    for _ in range(100):
        plant.step(np.full(7, 3.0))
    t = plant.time
    plant.reset()
    q, v = plant.true_state()
    np.testing.assert_array_equal(q, plant.q0)
    np.testing.assert_array_equal(v, 0.0)
    np.testing.assert_array_equal(plant.applied_torque, 0.0)
    assert plant.time == t  # the clock never jumps back
    plant.reset(np.full(7, 0.1) - [0, 0, 0, 2, 0, -1, 0], np.full(7, 0.2))
    q, v = plant.true_state()
    np.testing.assert_allclose(q, [0.1, 0.1, 0.1, -1.9, 0.1, 1.1, 0.1])
    np.testing.assert_allclose(v, 0.2)
    with pytest.raises(ValueError, match="reset q"):
        plant.reset(np.zeros(3))
    default = MujocoPlant("panda")
    np.testing.assert_allclose(default.true_state()[0], 0.5 * (default.lower + default.upper))


@pytest.mark.parametrize("cmd, match", [
    (np.zeros(6), r"shape \(6,\).*expected 7"),
    (np.zeros(8), r"shape \(8,\).*expected 7"),
    (np.zeros((7, 1)), r"shape \(7, 1\)"),
    ([0, 0, float("nan"), 0, 0, 0, 0], r"not finite at panda_joint3 \(index 2\) = nan"),
    ([0, 0, 0, 0, 0, 0, float("-inf")], r"not finite at panda_joint7 \(index 6\) = -inf"),
    (["a"] * 7, r"expected 7 numbers"),
    (None, r"shape \(\)"),
])
def test_bad_commands_raise_and_leave_the_plant_alone(cmd, match):
    plant = MujocoPlant("panda")
    before = plant.true_state(), plant.time
    with pytest.raises(ValueError, match=match):
        plant.step(cmd)
    assert plant.rejected_commands == 1
    after = plant.true_state(), plant.time
    assert np.array_equal(before[0][0], after[0][0]) and before[1] == after[1]


def test_gravity_compensated_hold_keeps_the_panda_still(panda_model):
    plant = MujocoPlant("panda", q0=np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785]))
    q0 = plant.q0
    for _ in range(2000):
        _, q, _, _ = plant.state()
        plant.step(panda_model.gravity(q))
    q, v = plant.true_state()
    assert plant.time == pytest.approx(2.0)
    assert np.abs(q - q0).max() < 1e-9
    assert np.abs(v).max() < 1e-8


def test_safe_modes():
    fv, fc = robot_config("panda")["friction_viscous"], robot_config("panda")["friction_coulomb"]
    reality = RealityConfig(friction_viscous=fv, friction_coulomb=fc, noise_std_q=1e-5, noise_std_v=1e-4,
                            **PAYLOAD, payload_enabled=True, seed=3)
    q_start = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])
    # hold: latches the position when the command went stale, keeps it despite payload + friction
    plant = MujocoPlant("panda", reality=reality, q0=q_start)
    plant.reset(q_start, np.full(7, 0.3))
    for _ in range(2000):
        plant.step_safe("hold")
    latched = plant.hold_position
    assert np.abs(latched - q_start).max() < 1e-4  # the measured position at the first "hold"
    q, v = plant.true_state()
    assert np.abs(q - latched).max() < 0.02 and np.abs(v).max() < 1e-2
    assert plant.safe_steps == 2000 and plant.diagnostics()["holding"]
    plant.step(plant.gravity_torque())  # a valid command releases the hold
    assert plant.hold_position is None
    # damp: zero torque + damping, the arm sinks slowly but never runs away
    plant.reset(q_start, np.full(7, 0.5))
    tau = plant.safe_torque("zero_damping")
    _, qm, vm, _ = plant.state()  # the robot's safety controller uses its (noisy) sensors
    np.testing.assert_allclose(tau, -np.diag(plant.mass_matrix(qm)) / 0.01 * vm, rtol=1e-12)
    for _ in range(1000):
        plant.step_safe("damp")
    _, v = plant.true_state()
    assert np.abs(v).max() < 0.5
    np.testing.assert_allclose(plant.safe_torque("damp", damping=2.0), -2.0 * plant.state()[2])
    with pytest.raises(ValueError, match="unknown safe mode"):
        plant.safe_torque("explode")


@pytest.mark.parametrize("mode", ["damp", "hold"])
def test_safe_modes_stable_in_ill_conditioned_configurations(mode):
    # where eig(M^-1 diag(M)) is largest, explicit velocity feedback with the default
    # gains would blow up at 1 kHz; step_safe integrates it implicitly
    rm = RobotModel("panda")
    rng = np.random.default_rng(0)
    qs = rng.uniform(rm.lower, rm.upper, (300, 7))
    worst = max(qs, key=lambda q: np.linalg.eigvals(
        np.linalg.solve(rm.mass_matrix(q), np.diag(np.diag(rm.mass_matrix(q))))).real.max())
    plant = MujocoPlant("panda", q0=worst)
    plant.reset(worst, np.full(7, 0.2))
    for _ in range(1000):
        plant.step_safe(mode)
    q, v = plant.true_state()
    assert np.all(np.isfinite(q)) and np.abs(v).max() < 1.0
    if mode == "hold":
        assert np.abs(q - worst).max() < 0.02


# ------------------------------------------------------------------ configuration


def test_reality_from_params():
    cfg = robot_config("panda")
    r = RealityConfig.from_params(cfg)  # ignores the '/**' keys (robot, urdf, joint_names ...)
    np.testing.assert_allclose(r.friction_viscous, cfg["friction_viscous"])
    np.testing.assert_allclose(r.friction_coulomb, cfg["friction_coulomb"])
    params = {"payload_mass": 1.2, "payload_com": [0, 0, 0.05], "payload_inertia": [], "payload_frame": "",
              "payload_enabled": True, "link_scale": 1.1, "link_scale.panda_link2": 1.3, "noise_std_q": 1e-4,
              "noise_std_v": [1e-3] * 7, "noise_std_tau": 0.1, "tau_bias": [0.0] * 7, "seed": 5,
              "coulomb_smoothing": 0.02, "rate": 1000.0}
    r = RealityConfig.from_params(params)
    assert r.payload_inertia is None and r.payload_frame is None and r.payload_enabled is True
    assert r.link_scale == {"panda_link2": 1.3, "*": 1.1}
    plant = MujocoPlant("panda", reality=r)
    assert plant.link_scale["panda_link2"] == 1.3 and plant.link_scale["panda_link4"] == 1.1
    assert plant.payload_enabled and plant.payload_mass == 1.2
    back = RealityConfig.from_params(r.to_params())
    assert back == r
    with pytest.raises(ValueError, match="unknown reality parameter 'payload_mas'"):
        RealityConfig.from_params({"payload_mas": 1.0})
    with pytest.raises(ValueError, match="friction_viscous.*7 values"):
        MujocoPlant("panda", reality=RealityConfig(friction_viscous=[0.1, 0.2]))
    with pytest.raises(ValueError, match="coulomb_smoothing"):
        MujocoPlant("panda", reality=RealityConfig(coulomb_smoothing=0.0))
    assert set(RealityConfig.PARAMETERS) >= {"friction_viscous", "payload_mass", "link_scale", "seed"}


def test_time_stays_on_the_step_grid():
    """data.time += timestep drifts in double precision; the plant keeps it on the grid,
    so ns stamps of step k are exactly k * timestep (checked over 3.5 simulated minutes)."""
    plant = MujocoPlant("planar2", q0=[0.0, 0.0])
    g = plant.gravity_torque
    bad = 0
    for k in range(1, 210_001):
        plant.step(np.zeros(2) if k % 1000 else g())
        bad += int(round(plant.time * 1e9)) != k * 1_000_000
    assert bad == 0


def test_end_effector_none_is_the_arm_without_its_hand():
    """end_effector="none": the simulated Panda without the Franka Hand -- its torques are
    the RobotModel's without the hand (MuJoCo's inverse dynamics against pinocchio), and
    differ from the default plant's by the hand's weight."""
    import mujoco

    from adaptive_dynamics.dynamics import RobotModel

    q = np.array([0.1, -0.4, 0.2, -2.0, 0.3, 1.5, 0.4])
    taus = {}
    for kind in ("hand", "none"):
        plant = MujocoPlant("panda", end_effector=kind, q0=q)
        d = mujoco.MjData(plant.model)
        d.qpos[plant._qi] = q
        mujoco.mj_inverse(plant.model, d)                              # at rest: gravity
        taus[kind] = d.qfrc_inverse[plant._di].copy()
        model = RobotModel("panda", end_effector=kind)
        np.testing.assert_allclose(taus[kind], model.gravity(q), atol=1e-6)
    assert np.abs(taus["hand"] - taus["none"]).max() > 0.5          # the hand's 0.76 kg
    with pytest.raises(ValueError, match="end_effector"):
        MujocoPlant("panda", end_effector="gripper")


def test_holding_shortfall_names_the_joint_a_payload_overloads():
    """The bridge's start-time check: the bare arm holds itself everywhere; with a payload
    whose moment alone exceeds the shoulder's effort limit at a stretched pose (m g r > τ_max,
    computed here from the arm's length), the shoulder is named."""
    plant = MujocoPlant("planar2")
    assert plant.holding_shortfall() == ""
    model = RobotModel("planar2")
    reach = np.linalg.norm(model.frame_pose(np.zeros(2))[:3, 3])      # stretched
    mass = 2.0 * plant.effort_limit[0] / (9.81 * reach)
    heavy = MujocoPlant("planar2", reality=RealityConfig(payload_mass=mass, payload_enabled=True))
    why = heavy.holding_shortfall()
    assert heavy.joint_names[0] in why and "gravity torque" in why, why

"""Any arm, safely: model-derived gains that respect the control period and the drives'
inertia (checked on MuJoCo plants of light and heavy arms of example-robot-data, not on a
formula), the simulator's armature equal to what the gains assume, and the loop
watchdog that trips on a gain set the plant cannot take -- within 100 ms, no NaN torque,
the estimate kept."""
from __future__ import annotations

import os

import numpy as np
import pytest
import yaml

from adaptive_dynamics.control import AdaptiveController
from adaptive_dynamics.control.gains import (ARMATURE_PER_EFFORT, DT_MARGIN, default_armature, default_gains,
                                             gain_margins)
from adaptive_dynamics.control.watchdog import LoopWatchdog, default_error_bound
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.experiments.arms import ARMS, PAYLOAD_COM, payload_for, reference_samples, robots_dir
from adaptive_dynamics.robots import armature
from adaptive_dynamics.robot_setup import resolve_robot
from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig

try:
    ERD = robots_dir()
except FileNotFoundError:
    ERD = None
pytestmark = pytest.mark.skipif(ERD is None, reason="example-robot-data not installed")
DT = 1e-3


def _arm(label):
    _, rel, joints, ee = next(a for a in ARMS if a[0] == label)
    return resolve_robot(os.path.join(ERD, rel), joints=joints, ee_frame=ee)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _regulate(spec, kd, lam, T=1.0, ia=None, offset=0.05):
    """PD + the model's gravity (K_D (e_dot + Lambda e) + g) from an offset start on the
    MuJoCo plant with ``ia`` armature and no friction; the errors over time."""
    model = RobotModel(spec.urdf, ee_frame=spec.ee_frame)
    q_d = 0.5 * (model.lower + model.upper)
    reality = RealityConfig(armature=armature(spec.urdf) if ia is None else ia)
    plant = MujocoPlant(spec.urdf, reality=reality, timestep=DT, q0=q_d + offset)
    kd = np.asarray(kd, float)
    E = []
    for _ in range(int(T / DT)):
        _, q, v, _ = plant.state()
        tau = kd * ((0 - v) + lam * (q_d - q)) + model.gravity(q)
        assert np.all(np.isfinite(tau))
        plant.step(tau)
        E.append(q_d - q)
    return np.array(E)


def test_generated_file_states_the_armature_the_simulator_applies_and_the_gains_assume():
    spec = _arm("so101")
    doc = yaml.safe_load(open(spec.config))
    shared = doc["/**"]["ros__parameters"]
    model = RobotModel(spec.urdf)
    assert shared["armature"] == default_armature(model.effort_limit)
    np.testing.assert_allclose(shared["armature"], ARMATURE_PER_EFFORT * model.effort_limit)
    assert shared["friction"] is True
    assert doc["/**/adaptive_controller"]["ros__parameters"]["kd"] == default_gains(model, armature=shared["armature"])["kd"]
    plant = MujocoPlant(spec.urdf, reality=RealityConfig.from_params({"armature": shared["armature"]}))
    # the plant's joint-space inertia is the URDF's plus the armature (pinocchio as the reference)
    q = plant.q0
    np.testing.assert_allclose(plant.mass_matrix(q), model.mass_matrix(q) + np.diag(shared["armature"]), atol=1e-9)
    assert np.all(gain_margins(model, doc["/**/adaptive_controller"]["ros__parameters"]["kd"], DT,
                               shared["armature"]) <= DT_MARGIN + 1e-9)


@pytest.mark.parametrize("label", ["so101", "ur10"])
def test_default_gains_regulate_light_and_heavy_arms_on_the_plant(label):
    """The SO-101 (10 N m, wrist inertia 1e-5 kg m^2) and the UR10 (330 N m): the default
    gains settle an offset of 0.05 rad on every joint on the plant with the stated
    armature; on the SO-101 the rule the gains replace (K_D >= 1 % of the effort limit,
    no drive inertia) does not."""
    spec = _arm(label)
    g = yaml.safe_load(open(spec.config))["/**/adaptive_controller"]["ros__parameters"]
    E = _regulate(spec, g["kd"], g["lam"][0])
    assert np.abs(E[-100:]).max() < 0.01, np.abs(E[-100:]).max(axis=0)
    assert np.abs(E).max() < 0.1
    if label == "so101":
        model = RobotModel(spec.urdf)
        old = np.clip(4 * 10 * np.diag(model.mass_matrix(0.5 * (model.lower + model.upper))),
                      0.01 * model.effort_limit, 0.2 * model.effort_limit)
        assert gain_margins(model, old, DT).max() > 2.0            # K_D dt / M_jj beyond the explicit bound
        bad = _regulate(spec, old, 10.0, T=0.3, ia=0.0)
        assert not np.abs(bad[-50:]).max() < 0.05                   # it does not settle


def test_watchdog_core_trips_after_its_window_and_stays_until_reset():
    w = LoopWatchdog(["a", "b"], [0.1, 0.1], window=0.05, saturation_window=0.5)
    for k in range(200):                       # a transient shorter than the window: no trip
        assert not w.update(k * DT, [0.2 if k < 40 else 0.0, 0.0], [0, 0])
    # saturated at one limit: trips after the saturation window (a start-up transient does not)
    tripped = [w.update(0.2 + k * DT, [0.0, 0.0], [0, 1]) for k in range(600)]
    assert tripped.index(True) == 500 and w.joint == "b" and "saturated" in w.reason
    w.reset()
    # chattering between the limits (+, +, -, -, ...): trips after the (short) window
    tripped = [w.update(1.0 + k * DT, [0.0, 0.0], [(-1) ** (k // 2), 0]) for k in range(60)]
    # chatter from the first hit of the second limit (k = 2), tripped a window later
    assert tripped.index(True) == 52 and w.tripped and w.joint == "a" and "chattering" in w.reason
    assert not w.update(1.5, [0.0, 0.0], [0, 0]) and w.tripped      # latched
    w.reset()
    assert not w.tripped and w.trips == 2
    assert not any(w.update(2.0 + k * DT, [np.nan, 0.0], None) for k in range(50))
    assert w.update(2.05, [np.nan, 0.0], None) and w.joint == "a"            # NaN counts as an error
    np.testing.assert_allclose(default_error_bound([-3, -0.5, 0], [3, 0.5, np.inf]), [1.0, 0.2, 1.0])


def test_watchdog_trips_an_unstable_gain_set_within_100ms_and_keeps_the_estimate():
    """K_D 100x the default on the SO-101 plant (K_D dt / m ~ 4: the sampled damper
    multiplies a velocity error by ~-3 per step): the composite
    controller's command bangs between the limits; the watchdog trips within 100 ms of
    sim time, every command is finite, and the estimate at the trip is what the
    controller holds afterwards (nothing adapts in the safe command)."""
    spec = _arm("so101")
    model = RobotModel(spec.urdf, friction=True)
    g = yaml.safe_load(open(spec.config))["/**/adaptive_controller"]["ros__parameters"]
    kd = 100.0 * np.asarray(g["kd"])
    assert gain_margins(model, kd, DT, armature(spec.urdf)).min() > 3.0
    ctl = AdaptiveController(model, "composite", lam=10.0, kd=kd, pi0=model.parameters, p0=1.0, lambda0=0.0)
    plant = MujocoPlant(spec.urdf, reality=RealityConfig(armature=armature(spec.urdf)), timestep=DT)
    w = LoopWatchdog(model.joint_names, default_error_bound(model.lower, model.upper), window=0.05)
    q_d = plant.q0 + 0.02
    pi_trip = None
    for k in range(300):
        _, q, v, tau_m = plant.state()
        if w.tripped:
            tau = -5.0 * v                      # the shell's safe command (damping)
        else:
            tau = ctl.compute(q, v, q_d, np.zeros(model.n), np.zeros(model.n), tau_m, learn=True)
            assert np.all(np.isfinite(tau))
            if w.update(k * DT, q_d - q, np.sign(tau) * (np.abs(tau) > model.effort_limit)):
                pi_trip = ctl.pi.copy()
        plant.step(np.clip(tau, -model.effort_limit, model.effort_limit))
    assert w.tripped and w.tripped_at <= 0.1 and "chattering" in w.reason, (w.tripped_at, w.reason)
    np.testing.assert_array_equal(ctl.pi, pi_trip)
    assert np.all(np.isfinite(plant.state()[1]))


def test_payload_is_a_share_of_what_the_weakest_joint_holds():
    """At the capacity payload_for computes (the payload 5 cm out on the flange), the
    weakest joint's gravity torque on MuJoCo's plant reaches its limit somewhere along the
    reference and nowhere exceeds it."""
    spec = _arm("ur10")
    model = RobotModel(spec.urdf, ee_frame=spec.ee_frame)
    Q = reference_samples(model, 0.5 * (model.lower + model.upper), 0.4)
    p = payload_for(model, Q)
    assert p["mass_kg"] == pytest.approx(0.25 * p["capacity_kg"], abs=1e-3)
    plant = MujocoPlant(spec.urdf, reality=RealityConfig(payload_mass=p["capacity_kg"], payload_com=list(PAYLOAD_COM),
                                                         payload_enabled=True))
    worst = max(np.max(np.abs(plant.gravity_torque(q)) / model.effort_limit) for q in Q)
    assert worst == pytest.approx(1.0, rel=0.01)


def test_effort_check_finds_the_joint_that_cannot_hold_its_payload():
    """The start-time check of the simulator (gravity over poses in the joint ranges):
    with 25 % of the UR10's capacity nothing is flagged; with 4x its capacity the
    weakest joint is, with a torque equal to the plant's own gravity at that pose."""
    from adaptive_dynamics.dynamics.effort_check import over_limit, worst_torques
    spec = _arm("ur10")
    model = RobotModel(spec.urdf, ee_frame=spec.ee_frame)
    Q = reference_samples(model, 0.5 * (model.lower + model.upper), 0.4, n=64)
    p = payload_for(model, Q)
    for mass, flagged in ((p["mass_kg"], False), (4 * p["capacity_kg"], True)):
        plant = MujocoPlant(spec.urdf, reality=RealityConfig(payload_mass=mass, payload_com=list(PAYLOAD_COM),
                                                             payload_enabled=True))
        worst, k = worst_torques(plant.gravity_torque, Q)
        bad = over_limit(worst, model.effort_limit)
        assert bool(bad.size) == flagged, (mass, worst, model.effort_limit)
        for j in bad:
            assert worst[j] == pytest.approx(abs(plant.gravity_torque(Q[k[j]])[j]))
    assert p["weakest_joint"] in [model.joint_names[j] for j in bad]


def test_safe_damping_is_stable_on_the_lightest_arm_and_firm_on_a_heavy_one():
    """The derived safe-command damping: within the discrete-time margin on the hextilt's
    flying arm (0.3 N m joints) -- where the old fixed 5 N m s/rad is far beyond
    K_D dt / m = 2 -- and at the effort bound on the UR10's shoulder; on the plant the
    damped arm's velocity decays without growing (time constants m / K_D up to ~0.2 s
    where the effort bound binds)."""
    from adaptive_dynamics.control.gains import safe_damping
    light = _arm("hextilt_arm")
    m = RobotModel(light.urdf)
    ia = armature(light.urdf)
    kd = safe_damping(m, armature=ia)
    assert np.all(gain_margins(m, kd, DT, ia) <= DT_MARGIN + 1e-9)
    assert gain_margins(m, 5.0, DT, ia).max() > 2.0
    heavy = _arm("ur10")
    mh = RobotModel(heavy.urdf)
    assert safe_damping(mh, armature=armature(heavy.urdf))[1] == pytest.approx(0.2 * mh.effort_limit[1])
    plant = MujocoPlant(light.urdf, reality=RealityConfig(armature=ia), timestep=DT)
    g = RobotModel(light.urdf)
    plant.reset(v=np.full(plant.n, 0.5))
    speeds = []
    for _ in range(1000):
        _, q, v, _ = plant.state()
        plant.step(-kd * v + g.gravity(q))
        speeds.append(np.abs(v).max())
    assert speeds[-1] < 1e-3 * speeds[0] and max(speeds) <= 1.05 * speeds[0]


def _iiwa_track(friction: bool, kd, T: float = 4.0) -> np.ndarray:
    """Composite control of the shipped iiwa 14's simulator (its parameter file's friction
    and armature) along a 4 s Fourier trajectory from the URDF's model: RMSE of the
    second half per joint."""
    from adaptive_dynamics.robots import robot_config
    from adaptive_dynamics.trajectories.fourier import ModifiedFourier

    model = RobotModel("iiwa14", friction=friction)
    q0 = np.array([0.0, 0.6, 0.0, -1.2, 0.0, 0.6, 0.0])
    rng = np.random.default_rng(0)
    traj = ModifiedFourier(0.15 * rng.standard_normal((7, 3)), 0.15 * rng.standard_normal((7, 3)), 2 * np.pi / T, q0)
    plant = MujocoPlant("iiwa14", reality=RealityConfig.from_params(robot_config("iiwa14")), timestep=DT, q0=q0)
    ctl = AdaptiveController(model, "composite", lam=10.0, kd=kd, pi0=model.parameters, p0=1.0, lambda0=0.0)
    n = int(T / DT)
    E = np.empty((n, model.n))
    for k in range(n):
        _, q, v, tau_m = plant.state()
        qd, vd, ad = traj.sample(k * DT)
        tau = ctl.compute(q, v, qd, vd, ad, tau_m)
        plant.step(np.clip(tau, -model.effort_limit, model.effort_limit))
        E[k] = qd - q
    return np.sqrt(np.mean(E[n // 2:] ** 2, axis=0))


def test_shipped_iiwa_defaults_hold_its_wrist_where_the_paper_set_up_stick_slips():
    """The iiwa 14's parameter file states the drives' armature by the rule and friction
    columns, and leaves K_D to the model (``kd: [0]``): on its simulator (that friction and
    armature) the composite controller tracks every joint within 5 mrad; the set-up of the
    paper reproductions (``config/iiwa14.paper.yaml``: K_D 0.2 N m s/rad on joint 7, no
    friction columns) stick-slips there, its wrist error several times larger."""
    from adaptive_dynamics.scenarios import _resolved, build_graph
    from adaptive_dynamics.robots import paper_config, robot_config
    from adaptive_dynamics.robot_setup import controller_gains

    cfg = robot_config("iiwa14")
    model = RobotModel("iiwa14")
    np.testing.assert_allclose(cfg["armature"], default_armature(model.effort_limit))
    assert cfg["friction"] is True
    np.testing.assert_allclose(armature("iiwa14"), cfg["armature"])
    derived = controller_gains("iiwa14")["kd"]
    assert derived == default_gains(model, armature=cfg["armature"])["kd"]
    paper = controller_gains("iiwa14", paper=True)["kd"]
    assert paper == [30.0, 30.0, 10.0, 30.0, 2.0, 2.0, 0.2]
    np.testing.assert_array_equal(armature("iiwa14", paper=True), 0.0)
    assert [os.path.basename(f) for f in paper_config("panda")] == ["panda.paper.yaml"]
    assert paper_config("planar2") == [] and paper_config("/no/such.urdf") == []
    # the graph: every node reads the paper file after the robot's and the scenario's
    for files, kd, ia, fr in ((), [0.0], cfg["armature"], True),\
                             (paper_config("iiwa14"), paper, [0.0], False):
        nodes = {s.name: s for s in build_graph("sim", robot="iiwa14", controller="composite", param_files=files)}
        ctl, bridge = _resolved(nodes["adaptive_controller"], {}), _resolved(nodes["mujoco_bridge"], {})
        assert ctl["kd"] == kd and ctl["armature"] == ia and bridge["armature"] == ia and ctl["friction"] is fr
    new = _iiwa_track(True, derived)
    old = _iiwa_track(False, paper)
    assert np.all(new < 5e-3), new
    assert old[6] > 5.0 * new[6], (old, new)


def test_the_arms_reference_is_feasible_with_the_simulators_friction():
    """iCub's wrist: its URDF declares 1 N m s/rad of damping against 0.65 N m of effort.
    Along the middle-of-the-ranges reference (0.4 rad) the model's inverse dynamics plus
    that friction exceed the wrist's limit; the planned reference (its centre moved) and
    the payload sized on it keep every joint within its limit, the payload's gravity
    included, at every sample, the motion alone within 80 % of it (HEADROOM)."""
    from adaptive_dynamics.experiments.arms import HEADROOM, trajectory_plan
    from adaptive_dynamics.robots import friction
    spec = _arm("icub_left")
    model = RobotModel(spec.urdf, ee_frame=spec.ee_frame)
    fv, fc = friction(spec.urdf)

    def need(Q, V, A):
        return np.array([np.abs(model.inverse_dynamics(q, v, a) + fv * v + fc * np.sign(v)) for q, v, a in zip(Q, V, A)])

    mid = 0.5 * (model.lower + model.upper)
    assert np.any(need(*reference_samples(model, mid, 0.4, derivatives=True)) > model.effort_limit)
    centre, amp = trajectory_plan(model, (fv, fc))
    Q, V, A = reference_samples(model, centre, amp, derivatives=True)
    assert np.all(need(Q, V, A) <= (1.0 - HEADROOM) * model.effort_limit)     # the feedback's headroom
    p = payload_for(model, Q, V, A, friction=(fv, fc))
    assert p["mass_kg"] > 0
    plant = MujocoPlant(spec.urdf, reality=RealityConfig(payload_mass=p["mass_kg"], payload_com=list(PAYLOAD_COM),
                                                         payload_enabled=True))
    load = np.array([np.abs(plant.gravity_torque(q) - model.gravity(q)) for q in Q])   # the payload's share
    assert np.all(need(Q, V, A) + load <= model.effort_limit), (need(Q, V, A) + load).max(0) / model.effort_limit

"""``identify_payload`` / ``identify --payload``: the load on the flange with the arm fixed.

(a) noise-free torques of pinocchio's own RNEA on the URDF with a known load added to the
    last link's inertia (``placement.act(Inertia(m, c, I))``): mass, centre of mass and
    inertia recovered to rounding, in the end-effector frame and in another frame, with the
    arm's friction given as vectors or as friction columns of the arm's parameters;
(b) a simulated recording (the MuJoCo plant with a 1.5 kg load off the flange axis, joint
    friction, torque noise and sensor bias as the realistic proxy's; computed-torque
    tracking of a wrist excitation): mass within 2 %, centre of mass within 5 mm;
(c) the consistent estimate's pseudo-inertia is positive semidefinite where the least
    squares' is not; libfranka's dict and the URDF ``<inertial>`` hold the result's numbers;
(d) the command end to end on a CSV recording (URDF + configured friction, and an arm
    estimate file in the flange frame).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import xml.etree.ElementTree as ET

import numpy as np
import pinocchio as pin
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.dynamics.inertial import pseudo_inertia
from adaptive_dynamics.dynamics.payload import identify_payload
from adaptive_dynamics.evaluation import identify as ident_cli
from adaptive_dynamics.robots import friction, urdf_path
from adaptive_dynamics.trajectories import ModifiedFourier

#: the wrist excitation: only the last three joints move [rad]
WRIST_AMPLITUDE = np.array([0.0, 0.0, 0.0, 0.0, 0.9, 0.9, 1.2])
#: the load: 1.5 kg off the flange axis, an anisotropic inertia about its CoM (xx, xy, xz, yy, yz, zz)
LOAD = {"mass": 1.5, "com": (0.02, -0.01, 0.06), "inertia": (0.006, 0.0004, -0.0003, 0.008, 0.0002, 0.005)}
FRAME = "panda_hand_tcp"          # the Panda's end-effector frame (the plant's payload frame)
SIM_SECONDS = 15.0
TARGETS = {"payload_mass_rel_error_max": 0.02, "payload_com_error_m_max": 0.005}


def _inertia3(v):
    xx, xy, xz, yy, yz, zz = v
    return np.array([[xx, xy, xz], [xy, yy, yz], [xz, yz, zz]])


def _wrist_motion(m, seconds, rate, seed):
    traj = ModifiedFourier.random(m.n, np.random.default_rng(seed), q_center=0.5 * (m.lower + m.upper),
                                  amplitude=WRIST_AMPLITUDE, w_f=2 * math.pi * 0.2, L=4, lower=m.lower,
                                  upper=m.upper, vel_limit=0.8 * m.velocity_limit, acc_limit=np.full(m.n, 8.0))
    t = np.arange(0.0, seconds, 1.0 / rate)
    return (t, *traj.sample_many(t))


def _pin_with_load(mass, com, inertia, frame=FRAME):
    """The URDF's pinocchio model with the load added to the link that carries ``frame``."""
    pm = pin.buildModelFromUrdf(urdf_path("panda"))
    f = pm.frames[pm.getFrameId(frame)]
    pm.inertias[f.parentJoint] = pm.inertias[f.parentJoint] + f.placement.act(
        pin.Inertia(float(mass), np.asarray(com, dtype=float), np.asarray(inertia, dtype=float)))
    return pm


def _rnea(pm, Q, V, A):
    d = pm.createData()
    return np.array([pin.rnea(pm, d, q, v, a) for q, v, a in zip(Q, V, A)])


@pytest.fixture(scope="module")
def synthetic():
    m = RobotModel("panda")
    _, Q, V, A = _wrist_motion(m, 10.0, 200.0, seed=1)
    return m, Q, V, A, _rnea(_pin_with_load(LOAD["mass"], LOAD["com"], _inertia3(LOAD["inertia"])), Q, V, A)


def _assert_load(est, mass, com, inertia, atol):
    assert abs(est.mass - mass) < atol, (est.mass, mass)
    np.testing.assert_allclose(est.com, com, rtol=0, atol=atol)
    np.testing.assert_allclose(est.inertia, inertia, rtol=0, atol=atol)


# ----------------------------------------------------------------------------- (a) noise-free


def test_noise_free_load_recovered_in_any_frame(synthetic):
    m, Q, V, A, tau = synthetic
    est = identify_payload(m, Q, V, A, tau)
    assert est.frame == FRAME and est.link == "panda_link7" and est.method == "least_squares"
    _assert_load(est, LOAD["mass"], LOAD["com"], _inertia3(LOAD["inertia"]), 1e-6)
    np.testing.assert_allclose(est.offset, 0.0, atol=1e-6)
    assert est.residual_rmse.max() < 1e-8 and est.mass_std < 1e-6
    # the same load seen from the flange (panda_link8: the hand is rotated by -pi/4 and 0.1034 m
    # further along z): pinocchio's own frame placements give the truth there
    pm = m.model
    X = pm.frames[pm.getFrameId("panda_link8")].placement.inverse() * pm.frames[pm.getFrameId(FRAME)].placement
    truth = X.act(pin.Inertia(LOAD["mass"], np.array(LOAD["com"]), _inertia3(LOAD["inertia"])))
    flange = identify_payload(m, Q, V, A, tau, frame="panda_link8")
    assert flange.frame == "panda_link8"
    _assert_load(flange, truth.mass, truth.lever, truth.inertia, 1e-6)
    assert np.linalg.norm(np.array(flange.com) - np.array(LOAD["com"])) > 0.05    # another frame indeed


def test_noise_free_with_joint_friction_as_vectors_or_columns(synthetic):
    m, Q, V, A, tau = synthetic
    fv, fc = friction("panda")
    tau_f = tau + fv * V + fc * np.sign(V)
    est = identify_payload(m, Q, V, A, tau_f, friction=(fv, fc))
    _assert_load(est, LOAD["mass"], LOAD["com"], _inertia3(LOAD["inertia"]), 1e-6)
    # joints 1-4 stand still: with Coulomb friction their torque is left out, the wrist suffices
    assert est.rows_used[:4].sum() == 0 and np.all(est.rows_used[4:] > 0.8 * len(Q))
    np.testing.assert_allclose(est.offset, 0.0, atol=1e-6)
    mf = RobotModel("panda", friction=True)       # an arm estimate with friction columns
    arm_pi = np.concatenate([mf.parameters[:mf.n_inertial], fv, fc])
    est2 = identify_payload(mf, Q, V, A, tau_f, arm_pi=arm_pi)
    _assert_load(est2, LOAD["mass"], LOAD["com"], _inertia3(LOAD["inertia"]), 1e-6)
    with pytest.raises(ValueError, match="twice"):
        identify_payload(mf, Q, V, A, tau_f, arm_pi=arm_pi, friction=(fv, fc))
    # friction left out: the payload is fitted to it too (what the arm model must supply)
    blind = identify_payload(m, Q, V, A, tau_f)
    assert abs(blind.mass - LOAD["mass"]) > 1e-4


# ----------------------------------------------------------------------------- (c) consistency, outputs


def test_consistent_estimate_is_physical_where_least_squares_is_not(synthetic):
    m, Q, V, A, _ = synthetic
    # a point mass (pseudo-inertia of rank 1) and torque noise: the raw fit leaves the cone
    tau = _rnea(_pin_with_load(0.4, (0.0, 0.01, 0.03), np.zeros((3, 3))), Q, V, A)
    tau = tau + np.random.default_rng(2).normal(0.0, 0.02, tau.shape)
    raw = identify_payload(m, Q, V, A, tau, consistent=False)
    assert raw.method == "least_squares" and raw.min_pseudo_inertia_eig < 0
    est = identify_payload(m, Q, V, A, tau)
    assert est.method == "consistent"
    scale = np.abs(est.pi_link).max()
    assert est.min_pseudo_inertia_eig >= -1e-7 * scale
    assert np.linalg.eigvalsh(pseudo_inertia(est.pi_frame))[0] >= -1e-7 * scale    # in the flange frame too
    assert est.mass >= 1e-3 and abs(est.mass - 0.4) < 0.02 and np.linalg.norm(est.com - [0.0, 0.01, 0.03]) < 0.01
    assert est.to_dict()["least_squares"]["mass"] == pytest.approx(raw.mass)
    json.dumps(raw.to_dict(), allow_nan=False)


def test_franka_dict_and_urdf_inertial_hold_the_result(synthetic):
    m, Q, V, A, tau = synthetic
    est = identify_payload(m, Q, V, A, tau)
    fr = est.franka()
    assert set(fr) == {"mass", "F_x_Cload", "load_inertia"} and len(fr["load_inertia"]) == 9
    Ic = np.array(fr["load_inertia"]).reshape(3, 3, order="F")
    np.testing.assert_array_equal(Ic, Ic.T)
    np.testing.assert_allclose(Ic, est.inertia, rtol=0, atol=1e-15)
    assert fr["mass"] == est.mass and fr["F_x_Cload"] == list(est.com)
    el = ET.fromstring(est.urdf_inertial())
    assert el.tag == "inertial"
    np.testing.assert_allclose([float(x) for x in el.find("origin").get("xyz").split()], est.com, rtol=0, atol=0)
    assert float(el.find("mass").get("value")) == est.mass
    I = {k: float(v) for k, v in el.find("inertia").attrib.items()}
    for k, (a, b) in {"ixx": (0, 0), "ixy": (0, 1), "ixz": (0, 2), "iyy": (1, 1), "iyz": (1, 2), "izz": (2, 2)}.items():
        assert I[k] == pytest.approx(est.inertia[a, b], abs=1e-15)
    d = json.loads(json.dumps(est.to_dict(), allow_nan=False))
    assert d["franka"] == fr and d["frame"] == FRAME and len(d["std"]["com"]) == 3 and len(d["offset"]) == 7


# ----------------------------------------------------------------------------- (b) simulated recording


@pytest.fixture(scope="module")
def sim_recording():
    """15 s of the MuJoCo Panda with the load, the configured joint friction, the realistic
    proxy's torque noise and sensor bias (``experiments.proxies.REALITY``), computed-torque
    tracking (the URDF's model, the load unknown) of a wrist excitation; recorded as the
    robot reports it (q, v with noise, the measured torque of the last step)."""
    from adaptive_dynamics.experiments.proxies import REALITY, torque_bias
    from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig

    m = RobotModel("panda")
    fv, fc = friction("panda")
    t, Q, V, A = _wrist_motion(m, SIM_SECONDS, 1000.0, seed=5)
    reality = RealityConfig(friction_viscous=fv, friction_coulomb=fc, payload_mass=LOAD["mass"],
                            payload_com=LOAD["com"], payload_inertia=list(LOAD["inertia"]), payload_enabled=True,
                            noise_std_tau=REALITY["noise_std_tau"], noise_std_v=REALITY["noise_std_v"],
                            noise_std_q=REALITY["noise_std_q"], tau_bias=torque_bias("panda", m.effort_limit),
                            seed=11)
    plant = MujocoPlant("panda", reality=reality, q0=Q[0])
    assert plant.payload_frame == FRAME         # the plant's CoM is given in this frame's axes, as ours
    kp, kd = 400.0, 40.0
    rows = np.empty((t.size, 3 * m.n))
    for k in range(t.size):
        _, q, v, tm = plant.state()
        rows[k] = np.concatenate([q, v, tm])
        plant.step(m.inverse_dynamics(q, v, A[k] + kp * (Q[k] - q) + kd * (V[k] - v)))
    assert not plant.saturation_count.any()
    return m, t, rows


def _sim_estimate(m, t, rows, **kw):
    """As the command does: split at half the time, filter, identify on the first half."""
    n = m.n
    train, test, _ = ident_cli.split_prepared(t, rows[:, :n], rows[:, n:2 * n], rows[:, 2 * n:], 0.5)
    return identify_payload(m, *train, friction=friction("panda"), **kw), train, test


def test_simulated_recording_meets_the_targets(sim_recording):
    m, t, rows = sim_recording
    est, _, _ = _sim_estimate(m, t, rows)
    mass_err = abs(est.mass - LOAD["mass"]) / LOAD["mass"]
    com_err = float(np.linalg.norm(est.com - np.array(LOAD["com"])))
    print(f"payload: mass {est.mass:.4f} kg (rel. error {mass_err:.4f}, 1 sigma {est.mass_std:.4f}),"
          f" CoM {np.round(est.com, 4).tolist()} m (error {1e3 * com_err:.2f} mm), method {est.method}")
    assert mass_err <= TARGETS["payload_mass_rel_error_max"], est.to_dict()
    assert com_err <= TARGETS["payload_com_error_m_max"], est.to_dict()
    # joints 1-4 are held still: their friction is anything below the break-away level, so
    # they are left out (min_velocity); the moving wrist's sensor bias is the fitted offset
    # (REALITY's: 0.4, -0.6, 0.3, 0.5, -0.15, 0.1, 0.08 N m)
    from adaptive_dynamics.experiments.proxies import torque_bias
    assert np.all(est.rows_used[:4] < 0.1 * est.samples) and np.all(est.rows_used[4:] > 0.8 * est.samples)
    np.testing.assert_allclose(est.offset[4:], torque_bias("panda", m.effort_limit)[4:], atol=0.03)


# ----------------------------------------------------------------------------- (d) the command


def _csv(path, names, t, rows):
    cols = ["time"] + [f"{j}/{f}" for f in ("position", "velocity", "effort") for j in names]
    with open(path, "w") as fh:
        fh.write(",".join(cols) + "\n")
        for s, r in zip(t, rows):
            fh.write(f"{s:.9f}," + ",".join(repr(float(x)) for x in r) + "\n")
    return str(path)


def test_identify_payload_command_on_a_csv(sim_recording, tmp_path, capsys):
    from adaptive_dynamics.control.adaptive import AdaptiveController

    m, t, rows = sim_recording
    src = _csv(tmp_path / "rec.csv", m.joint_names, t, rows)
    assert ident_cli.main([src, "--robot", "panda", "--out", str(tmp_path / "out"), "--payload"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])      # the JSON is the last line
    with open(tmp_path / "out" / "payload.json") as fh:
        assert json.load(fh)["payload"] == res["payload"]
    p = res["payload"]
    for key in ("frame", "mass", "com", "inertia", "std", "franka", "method", "offset", "min_pseudo_inertia_eig"):
        assert key in p, key
    assert set(res["heldout_nmse"]) == {"arm", "arm+offset", "arm+payload"} and "config/panda.yaml" in res["arm"]
    # the library call on the same data gives the same load (the command's pipeline)
    lib, _, _ = _sim_estimate(m, t, rows)
    assert p["mass"] == pytest.approx(lib.mass, rel=1e-6) and np.allclose(p["com"], lib.com, atol=1e-6)
    held = {k: np.array(v) for k, v in res["heldout_nmse"].items()}
    assert np.all(held["arm+payload"] < held["arm+offset"]) and np.all(held["arm+payload"] < held["arm"]), held
    el = ET.parse(res["files"]["payload_urdf_inertial"]).getroot()
    assert float(el.find("mass").get("value")) == pytest.approx(p["mass"], rel=1e-15)
    # the arm with the load as a Thunder parameter file: the adaptive controller's start
    # (initial_estimate: file), its last link's block the URDF's + the load (pinocchio's sum)
    from adaptive_dynamics.control.adaptive_setup import initial_estimate
    pi = initial_estimate(m, "file", path=res["files"]["with_payload"])
    loaded = _pin_with_load(p["mass"], p["com"], np.array(p["inertia"]))
    d = loaded.createData()
    q, v, a = m.random_state(np.random.default_rng(4))
    np.testing.assert_allclose(m.regressor(q, v, a) @ pi, pin.rnea(loaded, d, q, v, a), rtol=0, atol=1e-6)
    np.testing.assert_allclose(pi[:60], m.parameters[:60], rtol=0, atol=1e-9)     # the other links: the URDF's

    # an arm estimate file (the URDF with the configured friction as friction columns, written as a
    # base-parameter estimate: another pi, the same torques) and the flange frame
    mf = RobotModel("panda", friction=True)
    fv, fc = friction("panda")
    path = AdaptiveController(mf, "direct", pi0=np.concatenate([mf.parameters[:mf.n_inertial], fv, fc])).save(
        os.fspath(tmp_path / "arm.npz"))
    ap = argparse.ArgumentParser()
    ident_cli.add_arguments(ap)
    res2 = ident_cli.run(ap.parse_args([src, "--robot", "panda", "--out", str(tmp_path / "out2"), "--payload",
                                        "--arm-estimate", path, "--payload-frame", "panda_link8"]))
    p2 = res2["payload"]
    assert p2["frame"] == "panda_link8" and "friction columns" in res2["arm"]
    assert p2["mass"] == pytest.approx(p["mass"], rel=1e-5)
    X = m.model.frames[m.model.getFrameId("panda_link8")].placement.inverse() \
        * m.model.frames[m.model.getFrameId(FRAME)].placement
    np.testing.assert_allclose(p2["com"], X.act(np.array(p["com"])), atol=1e-5)
    with pytest.raises(ValueError, match="goes with --payload"):
        ident_cli.run(ap.parse_args([src, "--robot", "panda", "--out", str(tmp_path / "o3"), "--arm-estimate", path]))
    with pytest.raises(ValueError, match="own friction"):
        ident_cli.run(ap.parse_args([src, "--robot", "panda", "--out", str(tmp_path / "o3"), "--payload",
                                     "--arm-estimate", path, "--no-arm-friction"]))

"""Any robot: arms from example-robot-data that the package does not ship (UR5, xArm 7,
the 9-joint Panda description with its fingers locked) resolved from their URDF files --
joints, locked joints, end-effector frame, a generated parameter file with
model-derived gains, clear errors for URDFs that cannot be controlled -- and composite
adaptive control with those default gains on the simulated arm carrying a 2 kg payload:
it converges from a zero estimate and the tracking error falls far below the
feedback-only phase's, without instability."""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pinocchio as pin
import pytest
import yaml

from adaptive_dynamics.control import AdaptiveController
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.robots import FRICTION_SMOOTHING, lock_joints
from adaptive_dynamics.robot_setup import resolve_robot

ERD = os.path.join(sys.prefix, "lib", "python3.11", "site-packages", "cmeel.prefix", "share", "example-robot-data",
                   "robots")
UR5 = os.path.join(ERD, "ur_description", "urdf", "ur5_robot.urdf")
XARM7 = os.path.join(ERD, "xarm_description", "urdf", "xarm7.urdf")
PANDA9 = os.path.join(ERD, "panda_description", "urdf", "panda.urdf")
EXE = os.path.join(os.path.dirname(sys.executable), "adaptive-dynamics")

pytestmark = pytest.mark.skipif(not os.path.isfile(UR5), reason="example-robot-data URDFs not found")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def test_resolve_a_urdf_robot_and_its_generated_parameter_file():
    spec = resolve_robot(UR5)
    assert not spec.shipped and spec.label == "ur5_robot" and spec.ee_frame == "tool0"
    assert spec.joint_names == ["shoulder_pan_joint", "shoulder_lift_joint", "elbow_joint", "wrist_1_joint",
                                "wrist_2_joint", "wrist_3_joint"]
    doc = yaml.safe_load(open(spec.config))
    p = doc["/**"]["ros__parameters"]
    assert p["urdf"] == spec.urdf and p["joint_names"] == spec.joint_names
    assert p["friction"] is True and p["friction_smoothing"] == FRICTION_SMOOTHING
    kd = np.array(doc["/**/adaptive_controller"]["ros__parameters"]["kd"])
    m = RobotModel(spec.urdf)
    assert kd.shape == (6,) and np.all(kd >= 0.01 * m.effort_limit - 1e-9) and np.all(kd <= 0.2 * m.effort_limit + 1e-9)
    assert resolve_robot(UR5).config == spec.config                    # content-addressed: the same files
    assert resolve_robot("panda").shipped


def test_joint_subset_locks_the_others_at_their_neutral_position():
    """The Panda description's two finger joints locked: a 7-joint model whose dynamics
    are the 9-joint model's with the fingers at 0 (pinocchio RNEA of the full URDF)."""
    arm = [f"panda_joint{i}" for i in range(1, 8)]
    spec = resolve_robot(PANDA9, joints=arm, ee_frame="panda_hand")
    assert spec.joint_names == arm and spec.label == "panda_urdf"
    m7 = RobotModel(spec.urdf)
    full = pin.buildModelFromUrdf(PANDA9)
    d = full.createData()
    rng = np.random.default_rng(0)
    for _ in range(3):
        q, v, a = m7.random_state(rng)
        z = np.zeros(2)
        tau9 = pin.rnea(full, d, np.r_[q, z], np.r_[v, z], np.r_[a, z])
        np.testing.assert_allclose(m7.inverse_dynamics(q, v, a), tau9[:7], atol=1e-9)
    # a revolute joint whose 0 is outside its limits is locked at the nearest limit
    text = open(PANDA9).read()
    locked = pin.buildModelFromXML(lock_joints(text, arm[:3] + arm[4:] + ["panda_finger_joint1",
                                                                          "panda_finger_joint2"]))
    free = pin.buildModelFromXML(text)
    q4 = float(free.upperPositionLimit[3])      # joint 4's range is [-3.07, -0.07]
    fd, ld = free.createData(), locked.createData()
    q = np.r_[0.1, 0.2, 0.3, q4, 0.4, 1.0, 0.5, 0.0, 0.0]
    pin.forwardKinematics(free, fd, q)
    pin.forwardKinematics(locked, ld, np.r_[q[:3], q[4:]])
    np.testing.assert_allclose(ld.oMi[-1].homogeneous, fd.oMi[-1].homogeneous, atol=1e-9)


def test_urdfs_that_cannot_be_controlled_are_clear_errors(tmp_path):
    import xml.etree.ElementTree as ET
    root = ET.parse(UR5).getroot()
    for link in root.findall("link"):
        if link.get("name") == "forearm_link":
            for el in link.findall("inertial"):
                link.remove(el)
    bad = tmp_path / "no_inertial.urdf"
    bad.write_text(ET.tostring(root, encoding="unicode"))
    from adaptive_dynamics.sim.plant import MujocoPlant
    for build in (resolve_robot, MujocoPlant):          # the graph and the bridge alike
        with pytest.raises(ValueError, match="'forearm_link'.*no mass"):
            build(str(bad))
    root = ET.parse(UR5).getroot()
    for j in root.findall("joint"):
        if j.get("name") == "elbow_joint":
            j.find("limit").set("effort", "0")
    bad = tmp_path / "no_effort.urdf"
    bad.write_text(ET.tostring(root, encoding="unicode"))
    for build in (resolve_robot, MujocoPlant):
        with pytest.raises(ValueError, match="elbow_joint.*effort limit"):
            build(str(bad))
    with pytest.raises(ValueError, match="not moving joints.*shoulder_pan_joint"):
        resolve_robot(UR5, joints=["no_such_joint"])
    with pytest.raises(ValueError, match="neither a shipped robot"):
        resolve_robot("no_such_robot")


@pytest.mark.parametrize("urdf", [UR5, XARM7], ids=["ur5", "xarm7"])
def test_composite_control_with_default_gains_converges_with_a_2kg_payload(urdf):
    from adaptive_dynamics.robots import armature
    from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig
    from adaptive_dynamics.trajectories import ModifiedFourier

    spec = resolve_robot(urdf)
    gains = yaml.safe_load(open(spec.config))["/**/adaptive_controller"]["ros__parameters"]
    m = RobotModel(spec.urdf, ee_frame=spec.ee_frame)
    qc = 0.5 * (m.lower + m.upper)
    traj = ModifiedFourier.random(m.n, np.random.default_rng(0), q_center=qc, amplitude=0.4, w_f=2 * math.pi * 0.1,
                                  L=4, lower=m.lower, upper=m.upper, vel_limit=m.velocity_limit, acc_limit=None,
                                  margin=0.1)
    t = np.arange(0.0, 40.0, 1e-3)
    Q, V, A = traj.sample_many(t)
    # the drive inertia the generated file states (and its gains assume), as demo's simulator applies it
    plant = MujocoPlant(spec.urdf, reality=RealityConfig(armature=armature(spec.urdf)), q0=Q[0])
    plant.set_payload(2.0, [0.0, 0.0, 0.05])
    ctl = AdaptiveController(m, "composite", pi0=np.zeros(m.n_params), p0=1.0, r=10.0, filter_lambda=20.0,
                             lambda0=0.5, k0=200.0, k1=100.0, **gains)
    err = np.empty((t.size, m.n))
    for k in range(t.size):
        _, q, v, tm = plant.state()
        tau = ctl.compute(q, v, Q[k], V[k], A[k], tm, learn=t[k] >= 10.0)   # feedback only for 10 s
        assert np.all(np.isfinite(tau))
        plant.step(tau)
        err[k] = Q[k] - q

    def rmse(a, b):
        s = (t >= a) & (t < b)
        return float(np.sqrt(np.mean(err[s] ** 2)))

    feedback_only, adapted = rmse(0.0, 10.0), rmse(30.0, 40.0)
    assert adapted * 5.0 <= feedback_only, (feedback_only, adapted)
    assert np.abs(err[t >= 30.0]).max() < 0.05


@pytest.mark.ros
def test_demo_runs_a_urdf_robot(tmp_path):
    out = tmp_path / "demo"
    r = subprocess.run([EXE, "demo", "--robot", UR5, "--controller", "composite", "--duration", "3", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env={**os.environ})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    res = __import__("json").loads(r.stdout.strip().splitlines()[-1])
    assert res["steps"] == 3000 and set(res["rmse_rad"]) == {"shoulder_pan_joint", "shoulder_lift_joint",
                                                              "elbow_joint", "wrist_1_joint", "wrist_2_joint",
                                                              "wrist_3_joint"}
    assert max(res["rmse_rad"].values()) < 0.2

"""Continuous joints (Kinova's six-joint arm: three of them) as one angle each: the model
equals pinocchio's own nq = 2 model at (cos, sin) -- RNEA, mass matrix, joint torque
regressor, frame placement --, MuJoCo's inverse dynamics agree past +-pi, the robot
resolves (no refusal), `info` says which joints are continuous, and the controller takes
the error the shortest way round."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pinocchio as pin
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.dynamics.continuous import CONTINUOUS_LIMIT, is_continuous, unbind_continuous, wrap_angle
from adaptive_dynamics.experiments.arms import robots_dir
from adaptive_dynamics.robot_setup import resolve_robot
from adaptive_dynamics.sim.plant import MujocoPlant

try:
    KINOVA = os.path.join(robots_dir(), "kinova_description", "robots", "kinova.urdf")
except FileNotFoundError:
    KINOVA = None
pytestmark = pytest.mark.skipif(KINOVA is None or not os.path.isfile(KINOVA), reason="example-robot-data missing")
ARM = [f"j2s6s200_joint_{i}" for i in range(1, 7)]
EXE = os.path.join(os.path.dirname(sys.executable), "adaptive-dynamics")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def spec():
    return resolve_robot(KINOVA, joints=ARM)


def _pin_q(pm, theta):
    """pinocchio's configuration of the original (nq = 2 for continuous) model."""
    q = np.zeros(pm.nq)
    for j in range(1, pm.njoints):
        jm = pm.joints[j]
        th = theta[jm.idx_v]
        if jm.nq == 2:
            q[jm.idx_q:jm.idx_q + 2] = [np.cos(th), np.sin(th)]
        else:
            q[jm.idx_q] = th
    return q


def test_the_angle_model_equals_pinocchios_continuous_model(spec):
    text = open(spec.urdf).read()
    ref = pin.buildModelFromXML(text)
    assert ref.nq == 9 and ref.nv == 6                       # three continuous joints in pinocchio
    m = RobotModel(spec.urdf)
    assert m.n == 6 and m.continuous.tolist() == [True, False, False, True, False, True]
    assert unbind_continuous(text)[1] == ["j2s6s200_joint_1", "j2s6s200_joint_4", "j2s6s200_joint_6"]
    d = ref.createData()
    rng = np.random.default_rng(0)
    for _ in range(5):
        th = rng.uniform(-7.0, 7.0, 6)                      # past +-pi and +-2 pi
        th[~m.continuous] = np.clip(th[~m.continuous], m.lower[~m.continuous], m.upper[~m.continuous])
        v, a = rng.standard_normal(6), rng.standard_normal(6)
        qp = _pin_q(ref, th)
        np.testing.assert_allclose(m.inverse_dynamics(th, v, a), pin.rnea(ref, d, qp, v, a), atol=1e-9)
        M = pin.crba(ref, d, qp)
        np.testing.assert_allclose(m.mass_matrix(th), np.triu(M) + np.triu(M, 1).T, atol=1e-9)
        Y = pin.computeJointTorqueRegressor(ref, d, qp, v, a)
        np.testing.assert_allclose(m.regressor(th, v, a)[:, :60], Y, atol=1e-9)
        fid = ref.getFrameId(m.ee_frame)
        pin.framesForwardKinematics(ref, d, qp)
        np.testing.assert_allclose(m.frame_pose(th), d.oMf[fid].homogeneous, atol=1e-9)


def test_mujoco_plant_and_model_agree_past_pi(spec):
    m = RobotModel(spec.urdf)
    q0 = np.zeros(6)
    q0[m.continuous] = [3.5, -4.0, 6.5]
    plant = MujocoPlant(spec.urdf, q0=q0)
    assert np.all(is_continuous(plant.lower, plant.upper) == m.continuous)
    np.testing.assert_allclose(plant.gravity_torque(q0), m.gravity(q0), atol=1e-6)
    np.testing.assert_allclose(plant.mass_matrix(q0), m.mass_matrix(q0), atol=1e-6)


def test_info_names_the_continuous_joints(spec):
    r = subprocess.run([EXE, "info", KINOVA, "--joints", ",".join(ARM)], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    lines = [ln for ln in r.stdout.splitlines() if "j2s6s200_joint_" in ln]
    assert len(lines) == 6
    assert all(("continuous" in ln) == (i in (0, 3, 5)) for i, ln in enumerate(lines)), lines


def test_wrap_is_the_shortest_way_round():
    np.testing.assert_allclose(wrap_angle([0.1, np.pi + 0.1, -np.pi - 0.1, 4 * np.pi + 0.2]),
                               [0.1, -np.pi + 0.1, np.pi - 0.1, 0.2], atol=1e-12)
    assert is_continuous([-CONTINUOUS_LIMIT, -1.0], [CONTINUOUS_LIMIT, 1.0]).tolist() == [True, False]


@pytest.mark.ros
def test_controller_takes_a_continuous_joints_error_the_shortest_way_round(ros, spec):
    """A PD controller (no gravity) on the Kinova: a reference of 3.1 rad and a state of
    -3.1 rad (= 3.183 rad) on a continuous joint is an error of 6.2 - 2 pi = -0.083 rad
    (the command kp * e), not +6.2 rad; a bounded joint's error is taken as it is."""
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory

    from adaptive_dynamics.nodes.controller import ControllerNode
    from adaptive_dynamics.ros import joint_state_msg
    from adaptive_dynamics.ros.qos import PUBLISHER_STREAM_QOS, REFERENCE_QOS, RELIABLE_STREAM_QOS
    from adaptive_dynamics.ros.references import reference_batch_msg

    ctl = ros.add(ControllerNode, robot=spec.urdf, law="pd", kp=[1.0], kd=[1e-6], watchdog=False,
                  reference_wait=0.3)
    probe = ros.node("probe")
    cmds = []
    state = probe.create_publisher(JointState, "joint_states", PUBLISHER_STREAM_QOS)
    ref = probe.create_publisher(JointTrajectory, "reference", REFERENCE_QOS)
    probe.create_subscription(Float64MultiArray, "effort_controller/commands", cmds.append, RELIABLE_STREAM_QOS)
    names = list(ctl.model.joint_names)
    Q = np.zeros((10, 6))
    Q[:, 0] = 3.1       # continuous
    Q[:, 1] = 2.0       # bounded (limits about +-2.3)
    ref.publish(reference_batch_msg(0, 1_000_000, names, Q, np.zeros_like(Q), np.zeros_like(Q)))
    assert ros.spin_until(lambda: len(ctl.refs) >= 10 and ctl.pub_cmd.get_subscription_count() >= 1
                          and state.get_subscription_count() >= 1, timeout=5.0)
    q = np.zeros(6)
    q[0], q[1] = -3.1, 1.9
    state.publish(joint_state_msg(1_000_000, names, q, np.zeros(6), np.zeros(6)))
    assert ros.spin_until(lambda: len(cmds) >= 1, timeout=3.0)
    tau = np.asarray(cmds[-1].data[:6])
    assert tau[0] == pytest.approx(6.2 - 2 * np.pi, abs=1e-6)
    assert tau[1] == pytest.approx(0.1, abs=1e-6)

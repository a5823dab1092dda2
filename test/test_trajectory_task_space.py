"""The trajectory node's task space (``space: task``) without DDS: the task_reference
batch it publishes for a Cartesian type is the path the joint-space mode realises by
differential IK (positions and velocities by forward kinematics of the joint path, the
start orientation held), decodes to the same numbers by stamp, follows live speed
scaling, and z_sine moves along z only."""
from __future__ import annotations

import numpy as np
import pytest
from rclpy.serialization import deserialize_message
from trajectory_msgs.msg import MultiDOFJointTrajectory

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.nodes.trajectory import CARTESIAN_TYPES, build_trajectory, scaled, specs, task_batch
from adaptive_dynamics.ros.task_references import TaskReferenceBuffer, base_frame_name

MS = 1_000_000


@pytest.fixture(scope="module")
def panda():
    return RobotModel("panda")


def params(**kw):
    p = {s.name: s.default for s in specs()}
    p.update(kw)
    return p


@pytest.mark.parametrize("kind", CARTESIAN_TYPES)
def test_task_batch_is_the_path_the_joint_mode_realises(panda, kind):
    p = params(type=kind, cartesian_size=0.08, cartesian_period=2.0, cartesian_plane="xz", speed=0.7)
    qc = 0.5 * (panda.lower + panda.upper)
    base = build_trajectory(p, panda, qc)
    t0 = 0.25
    joint, task = scaled(base, p, t0), scaled(base.task_space(), p, t0)
    stamps = int(t0 * 1e9) + np.arange(0, 1500) * MS          # the node's 1 kHz grid
    world, ee = base_frame_name(panda), panda.ee_frame
    raw = task_batch(task, stamps, MS, world, ee)                # the bytes the node publishes
    msg = deserialize_message(raw, MultiDOFJointTrajectory)      # rclpy reads them
    assert msg.header.frame_id == "panda_link0" and list(msg.joint_names) == ["panda_hand_tcp"]
    buf = TaskReferenceBuffer(world, ee, capacity=2000)
    assert buf.add_any(raw) == len(stamps)
    Q, QD, _ = joint.sample_many(stamps * 1e-9)
    for i in range(0, len(stamps), 37):
        r = buf.lookup(int(stamps[i]))
        assert r.stamp_ns == stamps[i]
        T = panda.frame_pose(Q[i])
        np.testing.assert_allclose(r.position, T[:3, 3], atol=2e-6)          # FK of the IK'd joint path
        np.testing.assert_allclose(r.rotation, base.R_start, atol=1e-12)      # the start orientation, held
        np.testing.assert_allclose(r.rotation, T[:3, :3], atol=2e-5)
        np.testing.assert_allclose(r.twist[:3], panda.jacobian(Q[i])[:3] @ QD[i], atol=2e-4)
        np.testing.assert_array_equal(r.twist[3:], 0.0)
        np.testing.assert_array_equal(r.accel[3:], 0.0)
    # the acceleration is the derivative of the velocity (central differences on the grid)
    V = np.array([buf.lookup(int(s)).twist[:3] for s in stamps])
    A = np.array([buf.lookup(int(s)).accel[:3] for s in stamps])
    fd = (V[2:] - V[:-2]) / 2e-3
    scale = max(1.0, np.abs(A).max())
    assert np.abs(fd - A[1:-1]).max() < 0.02 * scale        # (square_circle: jerk steps at the corners)
    # the path starts at the start pose and stays within the size
    P = np.array([buf.lookup(int(s)).position for s in stamps])
    np.testing.assert_allclose(P[0], base.p_start, atol=1e-12)
    assert np.abs(P - base.p_start).max() <= 0.08 + 1e-9
    if kind == "z_sine":
        np.testing.assert_allclose(P[:, :2], np.tile(base.p_start[:2], (len(P), 1)), atol=1e-15)
        np.testing.assert_allclose(P[:, 2] - base.p_start[2],
                                   0.08 * np.sin(2 * np.pi / 2.0 * 0.7 * (stamps * 1e-9 - t0)), atol=1e-12)


def test_task_space_follows_a_live_speed_change(panda):
    p = params(type="z_sine", cartesian_size=0.05, cartesian_period=2.0)
    base = build_trajectory(p, panda, 0.5 * (panda.lower + panda.upper))
    task = scaled(base.task_space(), p, 0.0)
    task.set_speed(0.5, t=1.0)
    P, V, _ = task.sample_many(np.array([0.999, 1.001, 1.5]))
    w = 2 * np.pi / 2.0
    assert V[0, 2] == pytest.approx(0.05 * w * np.cos(w * 0.999), rel=1e-9)
    assert V[1, 2] == pytest.approx(0.5 * 0.05 * w * np.cos(w * (1.0 + 0.5 * 0.001)), rel=1e-9)  # halved at once
    assert P[2, 2] - base.p_start[2] == pytest.approx(0.05 * np.sin(w * 1.25), rel=1e-9)     # phase continuous

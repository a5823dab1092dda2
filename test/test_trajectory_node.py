"""The ``trajectory`` node over DDS, driven by /clock as in simulation: what it publishes
is the trajectory core's samples on the rate grid, contiguous (no gap, no duplicate),
always at least ``lookahead - publish_period`` ahead of the clock, in one batch per
``publish_period`` (not one message per tick)."""
from __future__ import annotations

import numpy as np
import pytest
from rosgraph_msgs.msg import Clock
from trajectory_msgs.msg import JointTrajectory

from adaptive_dynamics.nodes.trajectory import TrajectoryNode
from adaptive_dynamics.ros.qos import CLOCK_QOS, REFERENCE_QOS
from adaptive_dynamics.ros.stamps import from_ns, to_ns

pytestmark = pytest.mark.ros
MS = 1_000_000


def _dur(d) -> int:
    return d.sec * 1_000_000_000 + d.nanosec


@pytest.mark.parametrize("publish_period", [0.1, 0.0])
def test_trajectory_batches_cover_the_grid_ahead_of_the_clock(ros, publish_period):
    lookahead = 0.2
    node = ros.add(TrajectoryNode, robot="planar2", use_sim_time=True, lookahead=lookahead,
                   publish_period=publish_period, type="fourier", seed=3, amplitude=0.3,
                   base_frequency=0.5, harmonics=3)
    probe = ros.node("traj_probe")
    batches = []
    probe.create_subscription(JointTrajectory, "reference", batches.append, REFERENCE_QOS)
    clock = probe.create_publisher(Clock, "/clock", CLOCK_QOS)
    assert ros.spin_until(lambda: len(batches) >= 1)  # the first window goes out at start
    last_ahead = []
    for k in range(0, 61):  # /clock at 100 Hz for 0.6 s
        t = k * 10 * MS
        clock.publish(Clock(clock=from_ns(t)))
        ros.spin_until(lambda: node.get_clock().now().nanoseconds == t, timeout=2.0)
        ros.spin_for(0.005)
        # the horizon published so far, seen by a consumer at sim time t
        stamps = [to_ns(b.header.stamp) + _dur(b.points[-1].time_from_start) for b in batches]
        last_ahead.append(max(stamps) - t)
    # everything published: contiguous 1 kHz grid from 0, each point once
    grid = np.concatenate([to_ns(b.header.stamp) + np.array([_dur(p.time_from_start) for p in b.points])
                           for b in batches])
    np.testing.assert_array_equal(grid, np.arange(grid.size) * MS)
    assert grid[-1] >= 600 * MS + (lookahead - publish_period) * 1e9 - 1
    # never less than lookahead - publish_period ahead of the clock
    assert min(last_ahead) >= (lookahead - publish_period) * 1e9 - 10 * MS
    # one batch per publish_period (every tick when 0)
    expected = 1 + (61 if publish_period == 0 else int(0.6 / publish_period))
    assert abs(len(batches) - expected) <= 1, (len(batches), expected)
    # values: the node's trajectory sampled on the grid, and qd the derivative of q
    Q = np.concatenate([[p.positions for p in b.points] for b in batches])
    QD = np.concatenate([[p.velocities for p in b.points] for b in batches])
    q_ref, qd_ref, _ = node.traj.sample_many(grid * 1e-9)
    np.testing.assert_allclose(Q, q_ref, atol=1e-12)
    np.testing.assert_allclose(QD, qd_ref, atol=1e-12)
    fd = (Q[2:] - Q[:-2]) / 2e-3
    np.testing.assert_allclose(fd, QD[1:-1], atol=1e-4 * max(1.0, np.abs(QD).max()))


def test_task_space_publishes_task_reference_batches(ros):
    """space: task: MultiDOFJointTrajectory batches on task_reference (the base frame, the
    end-effector frame, the grid from the start), nothing on reference; a joint-space
    type is refused at start."""
    from trajectory_msgs.msg import MultiDOFJointTrajectory

    from adaptive_dynamics.ros.task_references import TaskReferenceBuffer

    node = ros.add(TrajectoryNode, robot="panda", use_sim_time=True, space="task", type="z_sine",
                   cartesian_size=0.05, cartesian_period=2.0, lookahead=0.2, publish_period=0.1)
    probe = ros.node("task_probe")
    batches, joint = [], []
    probe.create_subscription(MultiDOFJointTrajectory, "task_reference", batches.append, REFERENCE_QOS)
    probe.create_subscription(JointTrajectory, "reference", joint.append, REFERENCE_QOS)
    clock = probe.create_publisher(Clock, "/clock", CLOCK_QOS)
    for k in range(0, 31):
        clock.publish(Clock(clock=from_ns(k * 10 * MS)))
        ros.spin_until(lambda: node.get_clock().now().nanoseconds == k * 10 * MS, timeout=2.0)
    ros.spin_for(0.1)
    assert len(batches) >= 3 and not joint
    buf = TaskReferenceBuffer("panda_link0", "panda_hand_tcp", capacity=1000)
    for b in batches:
        buf.add(b)
    stamps = buf.stamps()
    np.testing.assert_array_equal(stamps, np.arange(len(stamps)) * MS)
    assert stamps[-1] >= 300 * MS + 100 * MS
    r = buf.lookup(500 * MS)
    P, V, _ = node.task.sample_many(np.array([0.5]))
    np.testing.assert_allclose(r.position, P[0], atol=1e-12)
    np.testing.assert_allclose(r.twist[:3], V[0], atol=1e-12)
    with pytest.raises(ValueError, match="type must be one of"):
        ros.add(TrajectoryNode, robot="panda", use_sim_time=True, space="task", type="fourier")


def test_robot_from_the_robot_description_topic(ros, tmp_path, monkeypatch):
    """robot: robot_description -- the URDF comes from the latched robot_description topic
    (std_msgs/String, transient local), as ros2_control's robot_state_publisher gives it;
    without a publisher the node fails with an error naming the topic."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    from adaptive_dynamics.robots import urdf_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    pub_node = ros.node("robot_state_publisher")
    qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)
    pub = pub_node.create_publisher(String, "robot_description", qos)
    pub.publish(String(data=open(urdf_path("planar2")).read()))       # latched before the node exists
    node = ros.add(TrajectoryNode, robot="robot_description", use_sim_time=False, type="fourier")
    assert node.model.joint_names == ["joint1", "joint2"]
    assert str(tmp_path) in node.model.urdf_path
    pub_node.destroy_publisher(pub)                                       # the latched URDF is gone
    with pytest.raises(TimeoutError, match="robot_description"):
        ros.add(TrajectoryNode, robot="robot_description", robot_description_timeout=0.3, use_sim_time=False)


def test_file_type_plays_the_excite_file(ros, tmp_path):
    """type: file -- the JSON excite writes, played exactly (its Fourier series on the rate
    grid from t = 0); a file beyond the URDF's limits or for other joints is refused at
    start with the joint named; start_from_current moves a robot away from the start there first."""
    from adaptive_dynamics.dynamics import RobotModel
    from adaptive_dynamics.nodes.trajectory import file_start
    from adaptive_dynamics.trajectories.excitation import ExcitationTrajectory

    m = RobotModel("planar2")

    def write(scale, name, names=None):
        rng = np.random.default_rng(1)
        a, b = rng.uniform(-1, 1, (2, 3)) * scale, rng.uniform(-1, 1, (2, 3)) * scale
        a[:, 0], b[:, 0] = -a[:, 1:].sum(1), -(np.arange(2, 4) * b[:, 1:]).sum(1)
        tr = ExcitationTrajectory(a, b, 0.5 * (m.lower + m.upper), 4.0, names or m.joint_names)
        return tr, tr.save(str(tmp_path / name))["json"]

    tr, path = write(0.3, "ok.csv")
    node = ros.add(TrajectoryNode, robot="planar2", use_sim_time=True, type="file", trajectory_file=path,
                   lookahead=0.2, publish_period=0.1)
    probe = ros.node("file_probe")
    batches = []
    probe.create_subscription(JointTrajectory, "reference", batches.append, REFERENCE_QOS)
    clock = probe.create_publisher(Clock, "/clock", CLOCK_QOS)
    for k in range(0, 31):
        clock.publish(Clock(clock=from_ns(k * 10 * MS)))
        ros.spin_until(lambda: node.get_clock().now().nanoseconds == k * 10 * MS, timeout=2.0)
    ros.spin_for(0.1)
    grid = np.concatenate([to_ns(b.header.stamp) + np.array([_dur(p.time_from_start) for p in b.points])
                           for b in batches])
    np.testing.assert_array_equal(grid, np.arange(grid.size) * MS)
    assert grid[-1] >= 400 * MS
    Q = np.concatenate([[p.positions for p in b.points] for b in batches])
    QD = np.concatenate([[p.velocities for p in b.points] for b in batches])
    QDD = np.concatenate([[p.accelerations for p in b.points] for b in batches])
    q, qd, qdd = tr.sample_many(grid * 1e-9)
    np.testing.assert_allclose(Q, q, atol=1e-12)
    np.testing.assert_allclose(QD, qd, atol=1e-12)
    np.testing.assert_allclose(QDD, qdd, atol=1e-12)
    np.testing.assert_allclose(QD[0], 0.0, atol=1e-12)           # excite's trajectories start at rest
    _, fast = write(3.0, "fast.csv")
    with pytest.raises(ValueError, match=r"joint .joint1. \(index 0\): velocity .* exceeds the limit"):
        ros.add(TrajectoryNode, robot="planar2", use_sim_time=True, type="file", trajectory_file=fast)
    with pytest.raises(ValueError, match="other joints"):
        ros.add(TrajectoryNode, robot="panda", use_sim_time=True, type="file", trajectory_file=path)
    with pytest.raises(ValueError, match="trajectory_file"):
        ros.add(TrajectoryNode, robot="planar2", use_sim_time=True, type="file")
    # start_from_current: near the file's start it is played as it is; farther, a move there first
    q0 = tr.sample(0.0)[0]
    same, move = file_start(tr, q0 + 0.01, m, 10.0)
    assert same is tr and move == 0.0
    far = q0 + np.array([0.0, 0.4])
    moved, move = file_start(tr, far, m, 10.0)
    assert move >= 2.0 and moved.time == move
    np.testing.assert_allclose(moved.sample(0.0)[0], far, atol=1e-12)
    for dt in (0.0, 0.3):
        for x, y in zip(moved.sample(move + dt), tr.sample(dt)):
            np.testing.assert_allclose(x, y, atol=1e-12)

"""Shared by the tests of the task-space controller nodes (scqp_controller, adaptive_controller
with law backstepping): a controller fed by a test probe, and the drill of refused task
references (another frame, a NaN, points out of order) whose instants must get the safe
command at once with a log line naming the reason."""
from __future__ import annotations

import time

import numpy as np
from rcl_interfaces.msg import Log
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from trajectory_msgs.msg import MultiDOFJointTrajectory

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.ros import joint_state_msg
from adaptive_dynamics.ros.commands import command_stamp
from adaptive_dynamics.ros.qos import REFERENCE_QOS
from adaptive_dynamics.ros.task_references import matrix_to_quaternion, task_reference_msg
from test_node_safety import Probe

MS = 1_000_000
WORLD, EE = "panda_link0", "panda_hand_tcp"


def rosout(ros, name="logs") -> list:
    """Every /rosout message from now on (as rcl's QoS: late ones from the history too)."""
    logs = []
    ros.node(name).create_subscription(Log, "/rosout", logs.append,
                                       QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                                                  durability=DurabilityPolicy.TRANSIENT_LOCAL))
    return logs


def fed_by_probe(ros, ctl):
    """The Panda controller ``ctl`` fed by a probe; task references held still for 0-99 ms.
    Returns ``(probe, publisher, joint names, q0, pose at q0, its quaternion)``."""
    probe = Probe(ros)
    pub = probe.node.create_publisher(MultiDOFJointTrajectory, "task_reference", REFERENCE_QOS)
    model = RobotModel("panda")
    q0 = 0.5 * (model.lower + model.upper)
    p0 = model.frame_pose(q0)
    quat = matrix_to_quaternion(p0[:3, :3])
    pub.publish(task_reference_msg(0, MS, WORLD, EE, np.tile(p0[:3, 3], (100, 1)), quat, np.zeros(6), np.zeros(6)))
    assert ros.spin_until(lambda: len(ctl.refs) >= 100, timeout=5.0)
    assert ros.spin_until(lambda: ctl.pub_cmd.get_subscription_count() >= 1
                          and probe.state.get_subscription_count() >= 1, timeout=5.0)
    return probe, pub, list(model.joint_names), q0, p0, quat


def send_state(ros, probe, stamp, names, q, v, timeout=3.0) -> np.ndarray:
    """Publish one state, return the command that answers it (stamped with it)."""
    before = len(probe.commands)
    probe.state.publish(joint_state_msg(stamp, names, q, v, np.zeros(len(q))))
    assert ros.spin_until(lambda: len(probe.commands) > before, timeout=timeout), "no command"
    cmd = probe.commands[-1]
    assert command_stamp(cmd) == stamp
    return np.asarray(cmd.data)


def still_batch(start_ns, p0, quat, change=None):
    """Ten points holding the pose ``p0`` from ``start_ns``; ``change(msg)`` spoils it."""
    m = task_reference_msg(start_ns, MS, WORLD, EE, np.tile(p0[:3, 3], (10, 1)), quat, np.zeros(6), np.zeros(6))
    if change is not None:
        change(m)
    return m


def _frame(m):
    m.header.frame_id = "world"


def _nan(m):
    m.points[3].transforms[0].translation.x = float("nan")


def _order(m):
    m.points[5].time_from_start.nanosec = 0


#: what -> (start [ms], the fault, the reason's words in the log line)
FAULTS = {"frame": (200, _frame, "frame_id 'world' is not the world frame 'panda_link0'"),
          "NaN": (300, _nan, "non-finite position"), "order": (400, _order, "out of order")}


def refused_references_drill(ros, ctl, probe, pub, logs, names, q0, p0, quat, damping: float,
                             after_each=None) -> None:
    """Publish the faulty batches of :data:`FAULTS`; a state in each refused range gets the
    safe command (``-damping v``) at once and the reason is logged; ``after_each(what, ms)``
    checks more; then a good batch brings the law back."""
    v = np.full(7, 0.1)
    for ms, fn, _ in FAULTS.values():
        pub.publish(still_batch(ms * MS, p0, quat, fn))
    assert ros.spin_until(lambda: ctl.refs.counters["rejected"] >= len(FAULTS), timeout=5.0)
    for what, (ms, _, needle) in FAULTS.items():
        t0 = time.monotonic()
        cmd = send_state(ros, probe, (ms + 4) * MS, names, q0, v)
        assert time.monotonic() - t0 < 1.0, what                  # at once, not after reference_wait
        np.testing.assert_allclose(cmd, -damping * v, err_msg=what)  # the safe command (damping)
        if after_each is not None:
            after_each(what, ms)
        assert ros.spin_until(lambda: any(needle in m.msg for m in logs), timeout=3.0), (what, [m.msg for m in logs])
    assert ctl.counters.as_dict()["reference_refused_cycles"] == len(FAULTS)
    assert any("was refused" in m.msg and m.level >= Log.ERROR for m in logs)
    pub.publish(still_batch(500 * MS, p0, quat))
    assert ros.spin_until(lambda: ctl.refs.lookup(500 * MS, max_staleness_ns=-1) is not None, timeout=5.0)
    assert not np.allclose(send_state(ros, probe, 500 * MS, names, q0, v), -damping * v)

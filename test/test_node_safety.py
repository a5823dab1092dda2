"""Bad input to the nodes, over real DDS (nodes in-process, messages through the rmw).

* mujoco_bridge (lockstep): NaN and wrong-length commands -> one safe step each,
  counted; a stale stamp or an unstamped command -> ignored, counted; no command ->
  the lockstep timeout steps with the safe action; every published state is finite.
* mujoco_bridge (real time): holds still until the graph is connected; no command ->
  safe action; a NaN command is rejected and the command timeout takes over;
  counters in /diagnostics.
* controller: joint_states matched by name (shuffled + extra joints work), wrong
  names / count / NaN -> the safe command for that stamp (never a NaN), a missing
  reference -> the safe command after ``reference_wait``, silence -> the watchdog's
  zero command, shutdown -> a zero command; gains tuned live through the
  ``rcl_interfaces/SetParameters`` service from a separate node (what rqt does),
  invalid values refused with a reason.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from rcl_interfaces.srv import SetParameters
from rclpy.parameter import Parameter
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.nodes.controller import ControllerNode
from adaptive_dynamics.nodes.mujoco_bridge import MujocoBridgeNode
from adaptive_dynamics.ros import joint_state_msg
from adaptive_dynamics.ros.commands import command_stamp, stamped_command_msg
from adaptive_dynamics.ros.qos import COMMAND_QOS, PUBLISHER_STREAM_QOS, REFERENCE_QOS, RELIABLE_STREAM_QOS
from adaptive_dynamics.ros.references import reference_batch_msg

pytestmark = pytest.mark.ros
MS = 1_000_000
ROBOT = "planar2"


def _stamp(msg) -> int:
    return msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec


class Probe:
    """A test node: publishes commands / states / references, records what comes back."""

    def __init__(self, ros):
        self.node = ros.node("probe")
        self.states, self.commands, self.diag = [], [], []
        self.cmd = self.node.create_publisher(Float64MultiArray, "effort_controller/commands", COMMAND_QOS)
        self.state = self.node.create_publisher(JointState, "joint_states", PUBLISHER_STREAM_QOS)
        self.ref = self.node.create_publisher(JointTrajectory, "reference", REFERENCE_QOS)
        self.node.create_subscription(JointState, "joint_states", self.states.append, RELIABLE_STREAM_QOS)
        self.node.create_subscription(Float64MultiArray, "effort_controller/commands",
                                      self.commands.append, RELIABLE_STREAM_QOS)
        self.node.create_subscription(DiagnosticArray, "/diagnostics", self.diag.append, 10)

    def diag_value(self, node_name: str, key: str):
        for arr in reversed(self.diag):
            for st in arr.status:
                if node_name in st.name:
                    for kv in st.values:
                        if kv.key == key:
                            return float(kv.value)
        return None


def param_setter(ros, node, client_name: str = "tuner"):
    """``set_params(*Parameter) -> results``: SetParameters from another node, as rqt does."""
    cli = ros.node(client_name).create_client(SetParameters, f"{node.get_fully_qualified_name()}/set_parameters")

    def set_params(*params):
        return ros.call(cli, SetParameters.Request(parameters=[p.to_parameter_msg() for p in params])).results

    return set_params


# ---------------------------------------------------------------- mujoco_bridge


def test_bridge_lockstep_bad_commands(ros):
    bridge = ros.add(MujocoBridgeNode, robot=ROBOT, mode="lockstep", wait_for_nodes=0,
                     wait_for_state_subscribers=1, lockstep_timeout=0.4, diagnostics_period=0.1)
    probe = Probe(ros)
    n = bridge.n
    assert ros.spin_until(lambda: len(probe.states) >= 1, timeout=10.0), "bridge never started"
    assert _stamp(probe.states[0]) == 0

    def answer(values, stamp):
        before = len(probe.states)
        probe.cmd.publish(stamped_command_msg(np.asarray(values, float), stamp))
        return ros.spin_until(lambda: len(probe.states) > before, timeout=2.0)

    assert answer(np.zeros(n), 0)                                  # valid: one step
    assert _stamp(probe.states[-1]) == 1 * MS
    assert answer([np.nan] * n, 1 * MS)                            # NaN: safe step
    assert answer(np.zeros(n + 1), 2 * MS)                         # wrong length: safe step
    assert [_stamp(m) for m in probe.states] == [0, MS, 2 * MS, 3 * MS]
    c = bridge.counters.as_dict()
    assert c["rejected_commands"] == 2 and c["safe_steps"] == 2 and c["steps"] == 1

    # a stale stamp and an unstamped command do not step the lockstep simulation
    # (back to back: the lockstep command queue must not let one displace the other)
    probe.cmd.publish(stamped_command_msg(np.zeros(n), 1 * MS))
    probe.cmd.publish(stamped_command_msg(np.zeros(n), None))
    ros.spin_for(0.2)
    assert len(probe.states) == 4
    c = bridge.counters.as_dict()
    assert c["stale_commands"] == 1 and c["unstamped_commands"] == 1

    # silence: the lockstep timeout steps with the safe action (and keeps doing so)
    assert ros.spin_until(lambda: len(probe.states) >= 5, timeout=3.0)
    assert bridge.counters.as_dict()["lockstep_timeouts"] >= 1
    for m in probe.states:
        assert np.all(np.isfinite(m.position)) and np.all(np.isfinite(m.velocity))
        assert np.all(np.isfinite(m.effort))
    # the counters reach /diagnostics
    assert ros.spin_until(lambda: (probe.diag_value("mujoco_bridge", "rejected_commands") or 0) >= 2,
                          timeout=3.0)


def test_bridge_realtime_safe_action_on_nan_and_timeout(ros):
    bridge = ros.add(MujocoBridgeNode, robot=ROBOT, mode="realtime", command_timeout=0.05,
                     safe_mode="damping", diagnostics_period=0.1, wait_for_nodes=0)
    probe = Probe(ros)
    n = bridge.n
    assert ros.spin_until(lambda: len(probe.states) > 50, timeout=10.0)
    assert bridge.counters.as_dict().get("startup_steps", 0) > 0   # no command yet: safe action
    deadline = time.monotonic() + 3.0                             # valid commands at ~100 Hz until stepped
    t_min = time.monotonic() + 0.3
    while time.monotonic() < t_min or (time.monotonic() < deadline and not bridge.counters.as_dict().get("steps")):
        probe.cmd.publish(stamped_command_msg(np.zeros(n)))
        ros.spin_for(0.01)
    assert bridge.counters.as_dict().get("steps", 0) > 0
    # a slow host may already have timed out between two of those commands: count from here
    timeouts0 = bridge.counters.as_dict().get("command_timeouts", 0)
    probe.cmd.publish(stamped_command_msg(np.full(n, np.inf)))    # rejected, then silence
    assert ros.spin_until(lambda: bridge.counters.as_dict().get("rejected_commands", 0) >= 1
                          and bridge.counters.as_dict().get("command_timeouts", 0) > timeouts0, timeout=3.0)
    assert bridge.counters.as_dict()["rejected_commands"] == 1
    assert all(np.all(np.isfinite(m.effort)) for m in probe.states)
    assert ros.spin_until(lambda: (probe.diag_value("mujoco_bridge", "command_timeouts") or 0) > 0,
                          timeout=3.0)



def test_bridge_realtime_holds_still_until_the_graph_is_connected(ros):
    """Real time starts like lockstep, once wait_for_nodes /clock subscribers, a command
    publisher and a joint_states reader are matched: no step is simulated (no state, no
    /clock) before its controller can answer."""
    from rosgraph_msgs.msg import Clock
    from adaptive_dynamics.ros.qos import CLOCK_QOS
    bridge = ros.add(MujocoBridgeNode, robot=ROBOT, mode="realtime", wait_for_nodes=1)
    probe = Probe(ros)
    ros.spin_for(1.0)  # matched with the probe, but nobody on /clock yet
    assert not probe.states and bridge.plant.steps == 0 and not bridge._started
    clocks = []
    ros.node("clock_reader").create_subscription(Clock, "/clock", clocks.append, CLOCK_QOS)
    assert ros.spin_until(lambda: len(probe.states) > 20 and clocks, timeout=10.0)
    assert bridge.counters.as_dict().get("startup_steps", 0) > 0  # running, on the safe action



def _run_answered(ros, timeout, **params):
    """A lockstep bridge run to ``max_sim_time`` with a node answering every state at
    once with zeros; returns the bridge and the wall times the states were received."""
    bridge = ros.add(MujocoBridgeNode, robot=ROBOT, mode="lockstep", wait_for_nodes=0,
                     wait_for_state_subscribers=1, **params)
    node = ros.node("answer")
    pub = node.create_publisher(Float64MultiArray, "effort_controller/commands", COMMAND_QOS)
    times = []

    def answer(msg):
        times.append(time.monotonic())
        pub.publish(stamped_command_msg(np.zeros(bridge.n), _stamp(msg)))

    node.create_subscription(JointState, "joint_states", answer, RELIABLE_STREAM_QOS)
    try:
        ros.spin_until(lambda: bridge._done, timeout=timeout)
    except Exception:  # the bridge shuts the (test's own) context down when it finishes
        pass
    return bridge, times


def test_bridge_run_wall_time_ends_at_the_last_step(ros):
    """``wall_time`` / ``sim_per_wall`` (the lockstep throughput bench/loop.py reports)
    cover the stepping only: not the wait for the readers' final acknowledgements at the
    end (Fast DDS acknowledges on its heartbeat, up to ~3 s later)."""
    bridge, times = _run_answered(ros, 15.0, max_sim_time=0.05)
    deadline = time.monotonic() + 5.0
    while bridge.latency_ns.total < 50 and time.monotonic() < deadline:
        time.sleep(0.01)
    st = bridge.stats()
    assert st["plant_steps"] == 50 and len(times) == 50
    stepping = times[-1] - times[0]  # first state received .. last command sent
    assert stepping <= st["wall_time"] <= stepping + 0.15, (st["wall_time"], stepping)
    time.sleep(0.2)
    assert bridge.stats()["wall_time"] == st["wall_time"]  # frozen once finished


def test_bridge_lockstep_max_speed_caps_the_pace(ros):
    """``lockstep_max_speed``: a graph that answers at once still gets each state no
    sooner than dt / cap after the previous one (the pace an asynchronous learner needs)."""
    bridge, times = _run_answered(ros, 30.0, max_sim_time=0.04, lockstep_max_speed=0.02)
    assert bridge.plant.steps == 40 and len(times) == 40
    gaps = np.diff(times)                              # 1 ms of sim per 50 ms of wall
    assert np.median(gaps) == pytest.approx(0.05, rel=0.2), np.round(gaps * 1e3, 1)
    # (each gap also carries this test executor's reception jitter; their sum does not)
    assert 39 * 0.05 - 0.04 < gaps.sum() < 39 * 0.05 * 1.2


# ------------------------------------------------------------------- controller


@pytest.fixture
def ctl_setup(ros):
    ctl = ros.add(ControllerNode, robot=ROBOT, law="pd", kp=[10.0], kd=[1.0], state_timeout=0.3,
                  reference_wait=0.3, safe_mode="damping", safe_damping=2.0, diagnostics_period=0.1)
    probe = Probe(ros)
    names = list(RobotModel(ROBOT).joint_names)
    n = len(names)
    t = np.arange(200) * 1e-3
    Q = 0.3 * np.sin(np.outer(t, np.arange(1, n + 1)))
    QD = 0.3 * np.cos(np.outer(t, np.arange(1, n + 1))) * np.arange(1, n + 1)
    probe.ref.publish(reference_batch_msg(0, MS, names, Q, QD, np.zeros_like(Q)))
    assert ros.spin_until(lambda: len(ctl.refs) >= 200, timeout=5.0)
    assert ros.spin_until(lambda: ctl.pub_cmd.get_subscription_count() >= 1
                          and probe.state.get_subscription_count() >= 1, timeout=5.0)
    ros.spin_for(0.2)
    return ctl, probe, names, Q, QD


def _send_state(ros, probe, stamp, names, q, v, *, wait=True, timeout=2.0):
    before = len(probe.commands)
    probe.state.publish(joint_state_msg(stamp, names, q, v, np.zeros(len(q))))
    if wait:
        assert ros.spin_until(lambda: len(probe.commands) > before, timeout=timeout), "no command"
        return probe.commands[-1]
    return None


def test_controller_matches_joints_by_name_and_rejects_bad_states(ros, ctl_setup):
    ctl, probe, names, Q, QD = ctl_setup
    n = len(names)
    q = np.array([0.1, -0.2])[:n]
    v = np.array([0.5, -0.4])[:n]
    k = 5
    cmd = _send_state(ros, probe, k * MS, names, q, v)
    assert command_stamp(cmd) == k * MS
    np.testing.assert_allclose(cmd.data, 10.0 * (Q[k] - q) + 1.0 * (QD[k] - v), rtol=1e-12)

    # shuffled order with an extra (gripper) joint: matched by name, command in configured order
    k = 6
    cmd = _send_state(ros, probe, k * MS, ["gripper"] + names[::-1], np.r_[0.7, q[::-1]], np.r_[9.0, v[::-1]])
    np.testing.assert_allclose(cmd.data, 10.0 * (Q[k] - q) + 1.0 * (QD[k] - v), rtol=1e-12)

    safe = -2.0 * v   # damping on the last good velocity
    bad_states = {
        "missing joint": (names[:-1], q[:-1], v[:-1]),
        "unknown joint names": ([f"x{i}" for i in range(n)], q, v),
        "NaN position": (names, np.r_[np.nan, q[1:]], v),
        "inf velocity": (names, q, np.r_[v[:-1], np.inf]),
    }
    rejected0 = ctl.counters.as_dict().get("state_rejected", 0)
    for i, (what, (nm, qq, vv)) in enumerate(bad_states.items()):
        stamp = (10 + i) * MS
        cmd = _send_state(ros, probe, stamp, nm, qq, vv)
        assert command_stamp(cmd) == stamp, what
        assert np.all(np.isfinite(cmd.data)), what
        np.testing.assert_allclose(cmd.data, safe, err_msg=what)
    # a count mismatch inside the message (positions shorter than names)
    msg = joint_state_msg(20 * MS, names, q, v, np.zeros(n))
    msg.position = list(q[:-1])
    before = len(probe.commands)
    probe.state.publish(msg)
    assert ros.spin_until(lambda: len(probe.commands) > before)
    np.testing.assert_allclose(probe.commands[-1].data, safe)
    assert ctl.counters.as_dict()["state_rejected"] == rejected0 + len(bad_states) + 1
    # a reordered (older) state is ignored: no command, counted
    before = len(probe.commands)
    probe.state.publish(joint_state_msg(6 * MS, names, q, v, np.zeros(n)))
    ros.spin_for(0.2)
    assert len(probe.commands) == before
    assert ctl.counters.as_dict()["state_out_of_order"] == 1
    assert ros.spin_until(lambda: (probe.diag_value("controller", "state_rejected") or 0) >= 5, timeout=3.0)


def test_controller_missing_reference_watchdog_and_shutdown(ros, ctl_setup):
    ctl, probe, names, Q, QD = ctl_setup
    n = len(names)
    q, v = np.full(n, 0.1), np.full(n, 0.3)
    _send_state(ros, probe, 1 * MS, names, q, v)
    # a state far beyond the references: answered with the safe command after reference_wait
    t0 = time.monotonic()
    cmd = _send_state(ros, probe, 5000 * MS, names, q, v, timeout=3.0)
    assert time.monotonic() - t0 >= 0.25
    assert command_stamp(cmd) == 5000 * MS
    np.testing.assert_allclose(cmd.data, -2.0 * v)
    assert ctl.counters.as_dict()["reference_missed"] >= 1
    # silence on joint_states: the watchdog publishes an (unstamped) zero command
    before = len(probe.commands)
    assert ros.spin_until(lambda: len(probe.commands) > before, timeout=3.0)
    assert command_stamp(probe.commands[-1]) is None
    np.testing.assert_array_equal(probe.commands[-1].data, np.zeros(n))
    assert ctl.counters.as_dict()["state_timeouts"] >= 1
    # shutdown leaves the robot with a zero command (the effort controller holds the last one)
    ros.executor.remove_node(ctl)
    probe.commands.clear()
    ctl.destroy_node()
    ros.nodes.remove(ctl)
    assert ros.spin_until(lambda: len(probe.commands) >= 1, timeout=3.0)
    np.testing.assert_array_equal(probe.commands[-1].data, np.zeros(n))


def test_controller_live_tuning_through_set_parameters(ros, ctl_setup):
    """What rqt_reconfigure does: SetParameters from another node; valid gains take
    effect on the next cycle, invalid ones are refused with a reason."""
    ctl, probe, names, Q, QD = ctl_setup
    n = len(names)
    set_params = param_setter(ros, ctl, "rqt_like")
    q, v = np.full(n, 0.05), np.full(n, -0.1)
    kp, kd = np.array([50.0, 60.0])[:n], np.array([3.0, 4.0])[:n]
    (r1, r2) = set_params(Parameter("kp", value=kp.tolist()), Parameter("kd", value=kd.tolist()))
    assert r1.successful and r2.successful, (r1.reason, r2.reason)
    k = 7
    cmd = _send_state(ros, probe, k * MS, names, q, v)
    np.testing.assert_allclose(cmd.data, kp * (Q[k] - q) + kd * (QD[k] - v), rtol=1e-12)

    refused = {
        "wrong length": (Parameter("kp", value=[1.0] * (n + 1)), f"1 or {n} values"),
        "negative damping": (Parameter("kd", value=[-1.0]), "kd"),
        "unknown law": (Parameter("law", value="bogus"), "not one of"),
        "read-only robot": (Parameter("robot", value="panda"), "read-only"),
    }
    for what, (param, needle) in refused.items():
        (res,) = set_params(param)
        assert not res.successful, what
        assert needle in res.reason, (what, res.reason)
    np.testing.assert_array_equal(ctl.ctl.kp, kp)

    # switching the law live: computed torque with the nominal model
    (res,) = set_params(Parameter("law", value="computed_torque"))
    assert res.successful, res.reason
    k = 8
    cmd = _send_state(ros, probe, k * MS, names, q, v)
    rm = RobotModel(ROBOT)
    a = kd * (QD[k] - v) + kp * (Q[k] - q)
    np.testing.assert_allclose(cmd.data, rm.inverse_dynamics(q, v, a), rtol=1e-9, atol=1e-12)

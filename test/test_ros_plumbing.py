"""Tests of adaptive_dynamics.ros: QoS (with the stamped messages over real DDS), parameters,
node helper.  The message modules have their own files (test_ros_joint_states.py,
test_ros_references.py, test_ros_commands.py, test_ros_arrays.py, test_ros_stamps.py).

Everything that claims DDS behaviour is checked over real DDS on localhost
(./dev test sets ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST and a random
ROS_DOMAIN_ID).  Every spin has a timeout; nothing can hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from rcl_interfaces.msg import ParameterType
from rcl_interfaces.srv import DescribeParameters, GetParameters, SetParameters
from rclpy.parameter import Parameter
from rclpy.qos import QoSProfile, qos_profile_system_default
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from adaptive_dynamics.ros import (
    CLOCK_QOS,
    COMMAND_QOS,
    LATCHED_QOS,
    STREAM_QOS,
    ParamSpec,
    ReferenceBuffer,
    command_from_msg,
    declare_params,
    float64_array_msg,
    from_ns,
    load_param_file,
    matrix_from_msg,
    matrix_labels,
    reference_msg,
    stamped_matrix_msg,
    stamped_vector_msg,
    vector_from_msg,
)
from adaptive_dynamics.ros.node_base import ERROR, OK, WARN, Counters, diagnostic_array
from conftest import TIMEOUT, uniq
from rclpy.qos import DurabilityPolicy, HistoryPolicy, ReliabilityPolicy

JOINTS = ["fr3_joint1", "fr3_joint2", "fr3_joint3"]


# ----------------------------------------------------------------------- QoS


def test_qos_profiles():
    assert STREAM_QOS.reliability == ReliabilityPolicy.BEST_EFFORT
    assert STREAM_QOS.history == HistoryPolicy.KEEP_LAST and STREAM_QOS.depth == 1
    assert STREAM_QOS.durability == DurabilityPolicy.VOLATILE
    assert LATCHED_QOS.reliability == ReliabilityPolicy.RELIABLE
    assert LATCHED_QOS.durability == DurabilityPolicy.TRANSIENT_LOCAL and LATCHED_QOS.depth == 1
    assert COMMAND_QOS.reliability == ReliabilityPolicy.RELIABLE
    assert COMMAND_QOS.durability == DurabilityPolicy.VOLATILE
    assert 1 <= COMMAND_QOS.depth <= 10
    assert CLOCK_QOS.reliability == ReliabilityPolicy.BEST_EFFORT and CLOCK_QOS.depth == 1


def _publish_until(ros, pub, msg, got, timeout=TIMEOUT):
    deadline = time.monotonic() + timeout
    while not got and time.monotonic() < deadline:
        pub.publish(msg)
        ros.spin_for(0.02)
    return bool(got)


@pytest.mark.ros
def test_command_qos_reaches_forward_command_controller_style_subscribers(ros):
    """forward_command_controller subscribes with SystemDefaultsQoS, which the RMW
    resolves (Fast DDS: best effort) -- or a RELIABLE reader elsewhere.  A
    COMMAND_QOS publisher reaches both; a best-effort one misses the reliable one."""
    pub_node, sub_node = ros.node("cmd_pub"), ros.node("cmd_sub")
    reliable = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE)  # rclcpp::QoS(10)
    for sub_qos in (qos_profile_system_default, reliable):
        topic = uniq("commands")
        got = []
        sub_node.create_subscription(Float64MultiArray, topic, got.append, sub_qos)
        pub = pub_node.create_publisher(Float64MultiArray, topic, COMMAND_QOS)
        assert _publish_until(ros, pub, float64_array_msg([1.0, -2.0, 3.5]), got), sub_qos
        np.testing.assert_array_equal(command_from_msg(got[-1], 3), [1.0, -2.0, 3.5])

    # best effort publisher -> reliable subscriber: incompatible, nothing arrives
    topic = uniq("commands_be")
    got = []
    sub_node.create_subscription(Float64MultiArray, topic, got.append, reliable)
    pub = pub_node.create_publisher(Float64MultiArray, topic, STREAM_QOS)
    assert not _publish_until(ros, pub, float64_array_msg([1.0]), got, timeout=0.8)


@pytest.mark.ros
def test_clock_qos_drives_use_sim_time_node(ros):
    """A /clock publisher with CLOCK_QOS reaches rclpy's TimeSource subscription."""
    sim = ros.node("sim_time_user", parameter_overrides=[Parameter("use_sim_time", value=True)])
    bridge = ros.node("clock_pub")
    pub = bridge.create_publisher(Clock, "/clock", CLOCK_QOS)
    t_ns = 42_123_456_789

    def ticked():
        pub.publish(Clock(clock=from_ns(t_ns)))
        ros.spin_for(0.02)
        return sim.get_clock().now().nanoseconds == t_ns

    deadline = time.monotonic() + TIMEOUT
    while not ticked() and time.monotonic() < deadline:
        pass
    assert sim.get_clock().now().nanoseconds == t_ns


@pytest.mark.ros
def test_latched_reaches_late_joiner(ros):
    pub_node = ros.node("latched_pub")
    topic = uniq("gp_model")
    pub = pub_node.create_publisher(Float64MultiArray, topic, LATCHED_QOS)
    pub.publish(stamped_matrix_msg(1, np.zeros((2, 2)), "a", "b"))
    last = stamped_matrix_msg(2_000_000_001, np.arange(6.0).reshape(2, 3), "a", "b")
    pub.publish(last)
    ros.spin_for(0.2)
    # the subscriber is created only now
    got = []
    sub_node = ros.node("latched_late_sub")
    sub_node.create_subscription(Float64MultiArray, topic, got.append, LATCHED_QOS)
    assert ros.spin_until(lambda: len(got) >= 1), "late joiner did not get the latched message"
    ros.spin_for(0.2)
    assert len(got) == 1, "depth 1: only the last message is kept"
    stamp, M = matrix_from_msg(got[0])
    assert stamp == 2_000_000_001
    np.testing.assert_array_equal(M, np.arange(6.0).reshape(2, 3))


@pytest.mark.ros
@pytest.mark.parametrize("qos_name", ["LATCHED_QOS", "STREAM_QOS"])
def test_stamped_roundtrip_over_dds(ros, qos_name):
    qos = {"LATCHED_QOS": LATCHED_QOS, "STREAM_QOS": STREAM_QOS}[qos_name]
    pub_node, sub_node = ros.node("rt_pub"), ros.node("rt_sub")
    t_mat, t_vec, t_ref = uniq("regressor"), uniq("parameters"), uniq("reference")
    rng = np.random.default_rng(0)
    Y = rng.normal(size=(3, 30))
    pi = rng.normal(size=5)
    names = [f"link{i}.m" for i in range(5)]
    stamp = 1_234_567_890_123_456_789
    got = {"m": [], "v": [], "r": []}
    sub_node.create_subscription(Float64MultiArray, t_mat, got["m"].append, qos)
    sub_node.create_subscription(JointState, t_vec, got["v"].append, qos)
    sub_node.create_subscription(JointTrajectory, t_ref, got["r"].append, qos)
    pm = pub_node.create_publisher(Float64MultiArray, t_mat, qos)
    pv = pub_node.create_publisher(JointState, t_vec, qos)
    pr = pub_node.create_publisher(JointTrajectory, t_ref, qos)
    q, qd, qdd = rng.normal(size=3), rng.normal(size=3), rng.normal(size=3)

    def step():
        pm.publish(stamped_matrix_msg(stamp, Y, "joints", "base_params"))
        pv.publish(stamped_vector_msg(stamp, names, pi, field="position"))
        pr.publish(reference_msg(stamp, JOINTS, q, qd, qdd))
        ros.spin_for(0.02)
        return all(got.values())

    deadline = time.monotonic() + TIMEOUT
    while not step() and time.monotonic() < deadline:
        pass
    assert all(got.values()), {k: len(v) for k, v in got.items()}
    s, M = matrix_from_msg(got["m"][-1])
    assert s == stamp
    np.testing.assert_array_equal(M, Y)
    assert matrix_labels(got["m"][-1]) == ("joints", "base_params")
    s, v = vector_from_msg(got["v"][-1], list(reversed(names)), field="position")
    assert s == stamp
    np.testing.assert_array_equal(v, pi[::-1])
    buf = ReferenceBuffer(JOINTS)
    buf.add(got["r"][-1])
    ref = buf.lookup(stamp)
    assert ref is not None and ref.stamp_ns == stamp
    np.testing.assert_array_equal(ref.q, q)
    np.testing.assert_array_equal(ref.qd, qd)
    np.testing.assert_array_equal(ref.qdd, qdd)


# ---------------------------------------------------------------- parameters


def _specs():
    return [
        ParamSpec("kp", 100.0, "proportional gain [Nm/rad]", min=0.0, max=1000.0),
        ParamSpec("window", 50, "samples in the window", min=1, max=500),
        ParamSpec("learning", True, "learning on/off"),
        ParamSpec("mode", "direct", "adaptive law", choices=["direct", "composite"]),
        ParamSpec("gamma", [1.0, 2.0, 3.0], "adaptation rates", min=0.0, max=10.0, length=3),
        ParamSpec("lam", 0.5, "filter pole", min=0.0,
                  validator=lambda v: None if v != 0.25 else "0.25 is unstable here"),
        ParamSpec("robot", "fr3", "robot description", read_only=True),
        ParamSpec("joints", [], "joint names", type="str[]"),
    ]


def _set(ros, client, *params):
    req = SetParameters.Request()
    req.parameters = [p.to_parameter_msg() for p in params]
    return ros.call(client, req).results


@pytest.mark.ros
def test_params_through_real_parameter_service(ros):
    node_a = ros.node("param_target")
    store = declare_params(node_a, _specs())
    seen = []
    store.on_change("kp", lambda name, value: seen.append((name, value)))
    store.on_change("gamma", lambda name, value: seen.append((name, value)))
    assert store["kp"] == 100.0 and store["mode"] == "direct"
    assert isinstance(store["gamma"], np.ndarray) and not store["gamma"].flags.writeable
    assert store["joints"] == ()

    node_b = ros.node("rqt_like_client")
    name_a = node_a.get_fully_qualified_name()
    set_cli = node_b.create_client(SetParameters, f"{name_a}/set_parameters")
    desc_cli = node_b.create_client(DescribeParameters, f"{name_a}/describe_parameters")
    get_cli = node_b.create_client(GetParameters, f"{name_a}/get_parameters")

    # valid value: accepted, store updated, listener fired
    (res,) = _set(ros, set_cli, Parameter("kp", value=250.0))
    assert res.successful, res.reason
    assert store["kp"] == 250.0 and seen == [("kp", 250.0)]
    (res,) = _set(ros, set_cli, Parameter("gamma", value=[0.5, 0.5, 9.5]))
    assert res.successful, res.reason
    np.testing.assert_array_equal(store["gamma"], [0.5, 0.5, 9.5])
    assert seen[-1][0] == "gamma"
    # an INTEGER for a float parameter (what `ros2 param set /n kp 300` sends) is coerced
    (res,) = _set(ros, set_cli, Parameter("kp", value=300))
    assert res.successful, res.reason
    assert store["kp"] == 300.0 and isinstance(store["kp"], float)
    req = GetParameters.Request(names=["kp"])
    val = ros.call(get_cli, req).values[0]
    assert val.type == ParameterType.PARAMETER_DOUBLE and val.double_value == 300.0

    n_seen = len(seen)
    refusals = {
        "out of range": (Parameter("kp", value=5000.0), "kp"),
        "wrong type": (Parameter("kp", value="fast"), "type"),
        "int out of range": (Parameter("window", value=0), "window"),
        "array length": (Parameter("gamma", value=[1.0, 2.0]), "3 elements"),
        "element range": (Parameter("gamma", value=[1.0, -2.0, 3.0]), "'gamma'[1]"),
        "choices": (Parameter("mode", value="bogus"), "not one of"),
        "validator": (Parameter("lam", value=0.25), "unstable"),
        "one-sided bound": (Parameter("lam", value=-1.0), "out of range"),
        "nan": (Parameter("lam", value=float("nan")), "NaN"),
        "read only": (Parameter("robot", value="lbr"), "read-only"),
        "bool type": (Parameter("learning", value=1), "type"),
    }
    for what, (param, needle) in refusals.items():
        (res,) = _set(ros, set_cli, param)
        assert not res.successful, f"{what}: accepted {param.value!r}"
        assert needle in res.reason, f"{what}: reason {res.reason!r} lacks {needle!r}"
    assert store["kp"] == 300.0 and store["mode"] == "direct" and store["lam"] == 0.5
    np.testing.assert_array_equal(store["gamma"], [0.5, 0.5, 9.5])
    assert len(seen) == n_seen, "listeners must not fire on refused values"

    # DescribeParameters returns the descriptor with the range (what rqt_reconfigure reads)
    resp = ros.call(desc_cli, DescribeParameters.Request(names=["kp", "window", "gamma", "mode"]))
    kp, window, gamma, mode = resp.descriptors
    assert kp.type == ParameterType.PARAMETER_DOUBLE
    assert kp.description.startswith("proportional gain")
    assert (kp.floating_point_range[0].from_value, kp.floating_point_range[0].to_value) == (0.0, 1000.0)
    assert (window.integer_range[0].from_value, window.integer_range[0].to_value) == (1, 500)
    assert gamma.type == ParameterType.PARAMETER_DOUBLE_ARRAY
    assert "length 3" in gamma.additional_constraints
    assert "each element in [0.0, 10.0]" in gamma.additional_constraints
    assert "direct" in mode.additional_constraints


@pytest.mark.ros
def test_params_atomic_cross_validation_and_local_set(ros):
    node = ros.node("param_cross")
    store = declare_params(node, [ParamSpec("q_min", -1.0, "lower"), ParamSpec("q_max", 1.0, "upper")])
    store.add_validator(lambda v: None if v["q_min"] < v["q_max"] else "q_min must be < q_max")
    assert not store.set("q_min", 2.0).successful
    assert store.set("q_min", 0.5).successful and store["q_min"] == 0.5
    res = node.set_parameters_atomically([Parameter("q_min", value=3.0), Parameter("q_max", value=4.0)])
    assert res.successful and (store["q_min"], store["q_max"]) == (3.0, 4.0)
    assert "q_min must be < q_max" in store.set("q_max", 0.0).reason
    # second declare_params on the same node extends the same store
    assert declare_params(node, [ParamSpec("extra", 1, "x")]) is store and store["extra"] == 1
    with pytest.raises(ValueError, match="already declared"):
        declare_params(node, [ParamSpec("extra", 1, "x")])
    # foreign parameters are untouched by our callback
    node.declare_parameter("foreign", "x")
    assert node.set_parameters([Parameter("foreign", value="y")])[0].successful


@pytest.mark.ros
def test_param_file_loading_and_overrides(ros, tmp_path):
    f = tmp_path / "params.yaml"
    f.write_text(textwrap.dedent("""\
        /**:
          ros__parameters:
            kp: 10            # int in YAML for a float parameter
            mode: composite
            gamma: [1, 2, 3]
        adaptive_controller:
          ros__parameters:
            kp: 20.5
            gains:
              kd: 3.0
        /fr3/adaptive_controller:
          ros__parameters:
            window: 7
        other_node:
          ros__parameters:
            kp: 999.0
        """))
    vals = load_param_file(f, "adaptive_controller")
    assert vals == {"kp": 20.5, "mode": "composite", "gamma": [1, 2, 3], "gains.kd": 3.0,
                    "window": 7}
    assert load_param_file(f, "/fr3/adaptive_controller")["window"] == 7
    assert "window" not in load_param_file(f, "adaptive_controller", namespace="/lbr")
    assert load_param_file(f, "unrelated") == {"kp": 10, "mode": "composite", "gamma": [1, 2, 3]}

    specs = [s for s in _specs() if s.name in ("kp", "mode", "gamma", "window")]
    node = ros.node("param_overrides")
    store = declare_params(node, specs, overrides=load_param_file(f, "unrelated"))
    assert store["kp"] == 10.0 and isinstance(store["kp"], float)
    np.testing.assert_array_equal(store["gamma"], [1.0, 2.0, 3.0])
    assert node.get_parameter("gamma").type_ == Parameter.Type.DOUBLE_ARRAY
    assert store["mode"] == "composite"

    # --ros-args style node overrides (ints for floats) win over the dict
    node2 = ros.node("param_node_overrides",
                     parameter_overrides=[Parameter("kp", value=42), Parameter("window", value=9)])
    store2 = declare_params(node2, specs, overrides={"kp": 1.0})
    assert store2["kp"] == 42.0 and store2["window"] == 9

    # an invalid config value fails loudly at startup, with the reason
    node3 = ros.node("param_bad")
    with pytest.raises(ValueError, match=r"'kp'=5000.0 is out of range.*overrides"):
        declare_params(node3, specs, overrides={"kp": 5000.0})
    with pytest.raises(ValueError, match="must be float"):
        declare_params(ros.node("param_bad2"), specs, overrides={"kp": "high"})


def test_counters_diagnostics():
    c = Counters("adaptive_controller", "sim", warn_on=["deadline_misses"], error_on=["nonfinite"])
    st = c.status()
    assert st.level == OK and st.message == "OK"
    c.inc("deadline_misses", 2)
    c.set("rate_hz", 1000.0)
    st = c.status()
    assert st.level == WARN and "deadline_misses +2" in st.message
    kv = {k.key: k.value for k in st.values}
    assert kv["deadline_misses"] == "2" and kv["rate_hz"] == "1000.0"
    assert c.status().level == OK  # nothing new since last report; value still cumulative
    c.inc("nonfinite")
    assert c.status().level == ERROR
    arr = diagnostic_array(5, [c.status()])
    assert arr.header.stamp.nanosec == 5 and len(arr.status) == 1



@pytest.mark.parametrize("capacity", [1, 7, 100])
def test_sample_ring_matches_a_bounded_deque(capacity):
    """SampleRing (the bridge's latency store) keeps what ``deque(maxlen=capacity)``
    keeps, in the same order, at every fill level including wrap-around."""
    import collections
    from adaptive_dynamics.realtime import SampleRing
    ring, ref = SampleRing(capacity), collections.deque(maxlen=capacity)
    rng = np.random.default_rng(3)
    assert len(ring) == 0 and ring.all().size == 0 and ring.recent(5).size == 0
    for i, x in enumerate(rng.integers(0, 10**9, size=3 * capacity + 5)):
        ring.add(int(x))
        ref.append(int(x))
        assert len(ring) == len(ref) and ring.total == i + 1
        np.testing.assert_array_equal(ring.all(), list(ref))
        for k in (1, capacity // 2, capacity + 3):
            np.testing.assert_array_equal(ring.recent(k), list(ref)[-k:] if k else [])
    snapshot = ring.recent(capacity)
    ring.add(-1)
    assert snapshot[-1] != -1  # a copy, not a view the hot path keeps writing into
    with pytest.raises(ValueError):
        SampleRing(0)


# ------------------------------------------------------------------ run_node

_RUN_NODE_SCRIPT = """
import sys
from rclpy.node import Node
from adaptive_dynamics.ros.node_base import run_node

class Ready(Node):
    def __init__(self):
        super().__init__("ready_node")
        self.create_timer(0.05, self._tick)
        self._said = False
    def _tick(self):
        if not self._said:
            print("READY", flush=True)
            self._said = True

sys.exit(run_node(Ready, args=[]))
"""


@pytest.mark.ros
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_run_node_clean_shutdown_on_signal(sig):
    proc = subprocess.Popen([sys.executable, "-c", _RUN_NODE_SCRIPT], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        deadline = time.monotonic() + 20
        line = ""
        while time.monotonic() < deadline and "READY" not in line:
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
        assert "READY" in line, proc.stderr.read() if proc.poll() is not None else "no READY"
        proc.send_signal(sig)
        rc = proc.wait(timeout=10)
        assert rc == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)


@pytest.mark.ros
@pytest.mark.parametrize("loop", ["lean", "executor"])
def test_hot_path_delivers_in_order_survives_callback_errors_and_late_subscriptions(ros, monkeypatch, loop):
    """HotPath's lean wait-set loop (and the executor fallback, AD_HOT_PATH=executor)
    delivers every message of a reliable topic in order, serves a subscription created
    after start, and stops.  The lean loop also keeps going (logged, counted) when a
    callback raises (the executor's spin thread would die: not exercised for it)."""
    from adaptive_dynamics.ros.node_base import HotPath
    monkeypatch.setenv("AD_HOT_PATH", loop)
    owner = ros.node("hot_owner")
    hp = HotPath(owner)
    assert hp.node is not owner and hp.node.get_name() == f"{owner.get_name()}_io"
    assert hp.lean == (loop == "lean")
    topic, late_topic = uniq("hot"), uniq("hot_late")
    got, late = [], []

    bad = 13.0 if loop == "lean" else -1.0

    def on_msg(msg):
        if msg.data[0] == bad:
            raise RuntimeError("unlucky")
        got.append(msg.data[0])

    qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
    hp.node.create_subscription(Float64MultiArray, topic, on_msg, qos)
    hp.start()
    pub = ros.node("hot_pub").create_publisher(Float64MultiArray, topic, qos)
    assert ros.spin_until(lambda: pub.get_subscription_count() >= 1)
    for i in range(200):
        pub.publish(float64_array_msg([float(i)]))
    assert ros.spin_until(lambda: len(got) >= 199 + (bad < 0), timeout=TIMEOUT)
    assert got == [float(i) for i in range(200) if i != bad]  # all, in order, the bad one skipped
    if hp.lean:
        assert hp.callback_errors == 1 and hp.running
        c = Counters("hot")
        hp.report(c)
        assert c.as_dict()["callback_errors"] == 1

    # a subscription added while the loop runs is served too
    hp.node.create_subscription(Float64MultiArray, late_topic, lambda m: late.append(m.data[0]), qos)
    late_pub = ros.node("hot_late_pub").create_publisher(Float64MultiArray, late_topic, qos)
    assert _publish_until(ros, late_pub, float64_array_msg([7.0]), late)
    hp.stop()
    assert not hp.running
    hp.stop()  # idempotent


@pytest.mark.ros
def test_hot_path_periodic_runs_on_the_hot_thread_and_survives_errors(ros, monkeypatch):
    """HotPath.add_periodic: the function runs at its period on the companion's thread
    (where the hot callbacks run), between messages; one that raises is logged and
    counted and the loop goes on.  Without a lean thread it declines (the caller then
    uses an owner timer)."""
    import threading

    from adaptive_dynamics.ros.node_base import HotPath
    owner = ros.node("periodic_owner")
    hp = HotPath(owner)
    calls, threads = [], set()

    def tick():
        calls.append(time.monotonic())
        threads.add(threading.current_thread().name)
        if len(calls) == 3:
            raise RuntimeError("third call fails")

    assert hp.add_periodic(0.02, tick)
    hot_name = hp.node.get_name()
    hp.start()
    assert not hp.add_periodic(0.02, tick)      # not after start
    time.sleep(0.5)
    hp.stop()
    n = len(calls)
    assert 5 <= n <= 40, n                         # ~25 at 20 ms; loose: a loaded machine delays it
    assert threads == {hot_name}                   # the hot thread, not the main thread
    assert hp.callback_errors == 1
    assert 0.015 <= np.median(np.diff(calls)) <= 0.06   # the period, not the 0.2 s idle wait
    assert not HotPath(ros.node("periodic_owner2"), enabled=False).add_periodic(0.02, tick)
    monkeypatch.setenv("AD_HOT_PATH", "executor")
    assert not HotPath(ros.node("periodic_owner3")).add_periodic(0.02, tick)

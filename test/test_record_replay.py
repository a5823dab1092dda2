"""Recording and replay plumbing over real DDS (`adaptive-dynamics record` / `replay`).

* A lockstep sim graph (bridge + trajectory + controller + recorder, on threads of this
  process, each node in its own rclpy context: what is replayed is the bag) records 2 s of
  sim time; ``replay --rate 5`` republishes it while a
  subscriber in this process (reliable, KEEP_ALL) takes ``joint_states`` and
  ``/clock``: every message arrives, in order, byte-identical to the bag and equal
  field by field to what the independent reader (``mcap`` + ``mcap-ros2-support``)
  decodes; ``/clock`` is the recorded one, monotonic, covering the bag; the replay
  takes bag time / 5 of wall time.
* ``replay --fast`` of a bag without ``/clock`` delivers everything in order and
  generates a monotonic 100 Hz ``/clock`` over the bag's span.
* ``record`` (its own process) against a running graph (in this process; one run
  stopped by ``--duration``, one by SIGTERM) leaves a closed, readable bag (metadata.yaml, counts > 0, contiguous
  lockstep states).
* Bad arguments exit with code 2 and say why.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from mcap.reader import make_reader
from mcap_ros2.decoder import DecoderFactory

from adaptive_dynamics import cli
from adaptive_dynamics.evaluation.bags import BagWriter, bag_info, read_raw
from adaptive_dynamics.inprocess import InProcessGraph
from adaptive_dynamics.scenarios import build_graph
from adaptive_dynamics.launcher import run_to_end

pytestmark = [pytest.mark.ros, pytest.mark.filterwarnings("ignore::DeprecationWarning:lark.*")]
EXE = os.path.join(os.path.dirname(sys.executable), "adaptive-dynamics")
RATE = 5.0


def _ns(stamp) -> int:
    return stamp.sec * 10 ** 9 + stamp.nanosec


@pytest.fixture(scope="module")
def sim_bag(tmp_path_factory):
    """2 s of lockstep sim time recorded by the graph's own recorder (record:=true; it closes
    the bag once idle *and* the joint_states publisher is gone, so a stalled loop does not
    end the recording).  The graph in this process (run_to_end's ``inprocess``: the same
    nodes and parameters over DDS, no interpreter start per node -- 6 s here, 7-15 s as
    processes); a failed graph raises GraphFailed with the nodes' tracebacks."""
    bag = tmp_path_factory.mktemp("rec") / "bag"
    res = run_to_end(build_graph("sim", robot="panda", duration=2.0, record=True, bag=str(bag)), timeout=120,
                     graph="inprocess")
    assert res.code == 0, res.why
    return bag


def _independent(bag, topic):
    """(raw CDR, decoded message, log time) per message of ``topic``, in log-time order,
    read with the independent reader (``mcap`` + ``mcap-ros2-support``'s decoder)."""
    (mcap_file,) = list(bag.glob("*.mcap"))
    with open(mcap_file, "rb") as fh:
        reader = make_reader(fh, decoder_factories=[DecoderFactory()])
        return [(bytes(m.data), msg, m.log_time)
                for _, _, m, msg in reader.iter_decoded_messages(topics=[topic], log_time_order=True)]


class Sink:
    """Reliable KEEP_ALL subscriptions (raw bytes + DDS reception time) in a private context."""

    def __init__(self, ros, topics):
        from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy
        from rosgraph_msgs.msg import Clock
        from sensor_msgs.msg import JointState
        from rclpy.parameter import Parameter
        self.ros = ros
        # use_sim_time: rclpy's TimeSource subscribes /clock best effort; it must connect too
        node = self.node = ros.node("replay_sink", parameter_overrides=[Parameter("use_sim_time", value=True)])
        qos = QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE)
        self.got = {t: [] for t in topics}
        types = {"/joint_states": JointState, "/clock": Clock}
        for t in topics:
            node.create_subscription(types[t], t, lambda raw, info, t=t: self.got[t].append(
                (bytes(raw), info["received_timestamp"])), qos, raw=True)

    def run(self, cmd, expect: dict, timeout=90.0):
        """Start ``cmd``, spin until it exited and ``expect`` {topic: n} messages arrived."""
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            done = self.ros.spin_until(lambda: proc.poll() is not None and all(
                len(self.got[t]) >= n for t, n in expect.items()), timeout=timeout)
            out, err = proc.communicate(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err[-3000:]
        assert done, ({t: len(v) for t, v in self.got.items()}, expect, err[-2000:])
        self.ros.spin_for(0.3)  # nothing beyond the expected may arrive
        return json.loads(out.strip().splitlines()[-1]), out, err


def test_replay_scaled_rate_every_message_in_order_identical(sim_bag, ros):
    from rclpy.serialization import deserialize_message
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import JointState

    states = _independent(sim_bag, "/joint_states")
    clocks = _independent(sim_bag, "/clock")
    # (test_e2e_loop checks the recording's completeness; here the bag is the reference)
    # (the recorder takes /clock best effort, as rclpy's TimeSource: some may be missing)
    assert len(states) > 1000 and len(clocks) > 50
    sink = Sink(ros, ["/joint_states", "/clock"])
    summary, out, _ = sink.run([EXE, "replay", str(sim_bag), "--rate", str(RATE), "--topics", "joint_states",
                                "--wait-for-subscribers"], {"/joint_states": len(states), "/clock": len(clocks)})
    assert summary["counts"] == {"/joint_states": len(states), "/clock": len(clocks)} and summary["clock"] == "bag"
    assert "/joint_states" in out and "achieved rate" in out

    got = sink.got["/joint_states"]
    assert len(got) == len(states)  # nothing lost, nothing extra
    for (raw, _), (ref_raw, ref, _) in zip(got, states):
        assert raw == ref_raw  # byte-identical, in the bag's order
        msg = deserialize_message(raw, JointState)
        assert _ns(msg.header.stamp) == _ns(ref.header.stamp) and list(msg.name) == list(ref.name)
        for f in ("position", "velocity", "effort"):
            np.testing.assert_array_equal(np.asarray(getattr(msg, f)), np.asarray(getattr(ref, f)))
    stamps = [_ns(deserialize_message(r, JointState).header.stamp) for r, _ in got]
    assert np.all(np.diff(stamps) > 0)  # in time order

    clk = [_ns(deserialize_message(r, Clock).clock) for r, _ in sink.got["/clock"]]
    assert clk == [_ns(c.clock) for _, c, _ in clocks]  # the recorded /clock, all of it
    # a sim-time node follows it (its TimeSource takes /clock best effort: allow a lost tail)
    assert clk[-1] - 50_000_000 <= sink.node.get_clock().now().nanoseconds <= clk[-1]
    assert np.all(np.diff(clk) >= 0)
    info = bag_info(sim_bag)
    span_ns = info["duration_s"] * 1e9
    # covers the bag (100 Hz clock); the recorder may miss the first best-effort /clock messages
    # while discovery completes on a loaded machine: the first within 50 ms
    assert clk[0] <= 50_000_000 and clk[-1] >= span_ns - 10_000_000
    assert clk[0] <= stamps[0] + 50_000_000 and clk[-1] >= stamps[-1] - 10_000_000

    # timing: the bag's span of joint_states log times, scaled by the rate.  The replayer
    # never publishes ahead of its schedule (lower bound is tight); a loaded 2-core VM can
    # only make it late, and it catches up, so the upper bound is generous.
    expected = (states[-1][2] - states[0][2]) * 1e-9 / RATE
    recv_span = (got[-1][1] - got[0][1]) * 1e-9
    assert 0.9 * expected <= summary["wall_s"] <= 1.5 * expected + 0.3, (summary, expected)
    assert 0.8 * expected <= recv_span <= 1.5 * expected + 0.3, (recv_span, expected)
    assert 0.6 * RATE <= summary["achieved_rate"] <= 1.1 * RATE


def test_replay_fast_with_generated_clock(sim_bag, ros, tmp_path):
    from rclpy.serialization import deserialize_message
    from rosgraph_msgs.msg import Clock

    bag = tmp_path / "no_clock"  # the same states, without /clock
    with BagWriter(bag) as w:
        w.add_topic("/joint_states", "sensor_msgs/msg/JointState")
        for topic, _, t, raw in read_raw(sim_bag, ["/joint_states"]):
            w.write(topic, t, raw)
    states = _independent(bag, "/joint_states")
    span = states[-1][2] - states[0][2]
    n_clock = span // 10_000_000 + 1
    sink = Sink(ros, ["/joint_states", "/clock"])
    summary, _, _ = sink.run([EXE, "replay", str(bag), "--fast", "--clock-rate", "100", "--wait-for-subscribers"],
                             {"/joint_states": len(states), "/clock": n_clock})
    assert summary["clock"] == "generated" and summary["rate"] == 0.0
    assert [r for r, _ in sink.got["/joint_states"]] == [r for r, _, _ in states]
    clk = [_ns(deserialize_message(r, Clock).clock) for r, _ in sink.got["/clock"]]
    assert len(clk) == n_clock and np.all(np.diff(clk) == 10_000_000)
    assert clk[0] == states[0][2] and clk[-1] >= states[-1][2] - 10_000_000


def test_record_on_running_graph(ros, tmp_path):
    """`record` joins a running lockstep graph; stopped by --duration and by SIGTERM.  The
    recorders are processes (the CLI as a user runs it), the graph runs in this process
    (InProcessGraph: its nodes over DDS as processes would be, without their start-up)."""
    from rosgraph_msgs.msg import Clock

    from adaptive_dynamics.ros.qos import CLOCK_QOS

    ticks = []
    watch = ros.node("clock_watch")
    sub = watch.create_subscription(Clock, "/clock", ticks.append, CLOCK_QOS)
    g = InProcessGraph(build_graph("sim", robot="panda", duration=0.0), echo=False)
    rec_a = rec_b = None
    try:
        deadline = time.monotonic() + 60  # the loop runs once the bridge publishes /clock
        while not ticks and time.monotonic() < deadline:
            assert all(t.is_alive() for t in g.threads.values()), g.logs
            ros.executor.spin_once(timeout_sec=0.05)
        watch.destroy_subscription(sub)
        assert ticks, "the graph's loop did not start within 60 s"
        rec_a = subprocess.Popen([EXE, "record", "--out", str(tmp_path / "a"), "--duration", "4"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        rec_b = subprocess.Popen([EXE, "record", "--out", str(tmp_path / "b"), "--topics", "joint_states",
                                  "/clock", "--use-sim-time", "true"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out_a = rec_a.communicate(timeout=60)
        rec_b.send_signal(signal.SIGTERM)  # b has recorded at least as long as a
        outs = [out_a, rec_b.communicate(timeout=60)]
        for p, (out, err) in zip((rec_a, rec_b), outs):
            assert p.returncode == 0, err[-3000:]
        assert all(t.is_alive() for t in g.threads.values()), ("the graph died while being recorded", g.logs)
    finally:
        for p in (rec_a, rec_b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        g.stop()
    for name, (out, _) in zip("ab", outs):
        bag = tmp_path / name
        summary = json.loads(out.strip().splitlines()[-1])
        assert summary["bag"] == str(bag) and (bag / "metadata.yaml").exists()
        assert summary["use_sim_time"] is True  # a: auto (the bridge publishes /clock); b: explicit
        assert "/joint_states" in out
        counts = {}
        for topic in summary["counts"]:
            counts[topic] = len(_independent(bag, topic))
        counts = {t: c for t, c in counts.items() if c}
        stamps = [_ns(msg.header.stamp) for _, msg, _ in _independent(bag, "/joint_states")]
        assert counts.get("/joint_states", 0) > 0 and counts.get("/clock", 0) > 0, (name, counts, out)
        assert {t: c for t, c in summary["counts"].items() if c} == counts
        assert np.all(np.diff(stamps) == 1_000_000)  # lockstep: contiguous, none dropped
    info_a = bag_info(tmp_path / "a")
    assert info_a["topics"]["/effort_controller/commands"][1] > 0
    assert {"/reference", "/diagnostics"} <= set(info_a["topics"])
    assert set(bag_info(tmp_path / "b")["topics"]) == {"/joint_states", "/clock"}


def test_bad_arguments_exit_2_with_reason(sim_bag, tmp_path, capsys):
    r = subprocess.run([EXE, "replay", str(tmp_path / "missing")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "does not exist" in r.stderr
    cases = [
        (["replay", str(sim_bag), "--topics", "no_such_topic"], ["not in the bag", "/joint_states"]),
        (["replay", str(sim_bag), "--rate", "-1"], ["--rate"]),
        (["replay", str(sim_bag), "--topics", "/clock", "--no-clock"], ["--no-clock"]),
        (["replay", str(tmp_path)], ["no metadata.yaml"]),
        (["record", "--topics", "no/such/topic"], ["no known message type", "no/such/topic"]),
        (["record", "--out", str(sim_bag)], ["already exists"]),
        (["record", "--duration", "-1"], [">= 0"]),
    ]
    for argv, words in cases:
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert all(w in err for w in words), (argv, err)


def test_replayer_loop_stop_and_plan(ros, tmp_path):
    """In process: --loop restarts at the bag's beginning, stop() interrupts; planning
    drops empty topics and generates /clock over the bag's span."""
    from rclpy.serialization import serialize_message
    from sensor_msgs.msg import JointState

    from adaptive_dynamics.nodes.replay import Replayer, plan_replay

    bag = tmp_path / "tiny"
    with BagWriter(bag) as w:
        w.add_topic("/joint_states", "sensor_msgs/msg/JointState")
        w.add_topic("/feedforward/residual", "sensor_msgs/msg/JointState")  # stays empty
        for k in range(10):
            msg = JointState(name=["j"], position=[float(k)])
            msg.header.stamp.nanosec = k * 1_000_000
            w.write("/joint_states", 5_000_000_000 + k * 1_000_000, serialize_message(msg))
    plan = plan_replay(bag, clock_rate=1000.0)
    assert plan.clock == "generated" and plan.empty == ["/feedforward/residual"]
    assert plan.published_topics == ["/joint_states", "/clock"] and plan.span_s == pytest.approx(0.009)
    published = []
    rep = Replayer(ros.node("replayer"), plan, rate=0.0, loop=True, ack_timeout=0.0)
    orig = rep.pubs["/joint_states"].publish
    rep.pubs["/joint_states"].publish = lambda raw: (published.append(raw), orig(raw))
    res = rep.run(stop=lambda: len(published) >= 25)
    assert res.interrupted and res.loops == 2 and res.counts["/joint_states"] == 25
    assert res.counts["/clock"] == 25  # 10 ticks per pass (1 kHz over 9 ms), each before its message
    assert published[:10] == published[10:20]  # the second pass repeats the first
    with pytest.raises(ValueError, match="rate"):
        Replayer(ros.node("bad"), plan, rate=-1.0)


@pytest.mark.ros
def test_recorder_ends_only_after_the_simulator_it_saw_is_gone(ros, ctx, tmp_path):
    """exit_when_idle: a /diagnostics message from a node that started before the
    simulator must not end the recording; once a joint_states publisher came, published
    and went, the recorder closes the bag and ends."""
    from diagnostic_msgs.msg import DiagnosticArray
    from sensor_msgs.msg import JointState

    from adaptive_dynamics.nodes.recorder import RecorderNode
    from adaptive_dynamics.ros.qos import PUBLISHER_STREAM_QOS

    rec = ros.add(RecorderNode, bag=str(tmp_path / "bag"), exit_when_idle=0.3,
                  topics=["joint_states", "/diagnostics"])
    other = ros.node("early")
    diag = other.create_publisher(DiagnosticArray, "/diagnostics", 10)
    assert ros.spin_until(lambda: diag.get_subscription_count() >= 1)
    diag.publish(DiagnosticArray())
    ros.spin_for(1.5)                                    # idle, but no simulator seen: keeps going
    assert ctx.ok() and not rec.writer.closed
    sim = ros.node("sim")
    pub = sim.create_publisher(JointState, "joint_states", PUBLISHER_STREAM_QOS)
    assert ros.spin_until(lambda: pub.get_subscription_count() >= 1)
    pub.publish(JointState(name=["j"], position=[0.0]))
    ros.spin_for(0.5)
    assert ctx.ok() and not rec.writer.closed            # the simulator is still there
    sim.destroy_publisher(pub)
    assert ros.spin_until(lambda: rec.writer.closed, timeout=5.0)
    assert rec.writer.counts.get("/joint_states") == 1


def test_recorder_records_the_extra_topics(ros, tmp_path):
    """extra_topics (the launchers' --monitor outputs) are recorded beside `topics`, each
    with its message type; a topic whose type the recorder does not know is refused."""
    from geometry_msgs.msg import WrenchStamped
    from sensor_msgs.msg import JointState

    from adaptive_dynamics.nodes.recorder import RecorderNode, _msg_classes
    from adaptive_dynamics.ros.qos import PUBLISHER_STREAM_QOS

    assert {"external_torque", "contact", "external_wrench", "residual/state"} <= set(_msg_classes())
    rec = ros.add(RecorderNode, bag=str(tmp_path / "bag"), topics=["joint_states"],
                  extra_topics=["contact", "external_wrench", "joint_states"])
    node = ros.node("monitor_like")
    pubs = {"contact": node.create_publisher(JointState, "contact", PUBLISHER_STREAM_QOS),
            "external_wrench": node.create_publisher(WrenchStamped, "external_wrench", PUBLISHER_STREAM_QOS)}
    assert ros.spin_until(lambda: all(p.get_subscription_count() >= 1 for p in pubs.values()))
    pubs["contact"].publish(JointState(name=["j1"], effort=[1.0]))
    pubs["external_wrench"].publish(WrenchStamped())
    assert ros.spin_until(lambda: rec.writer.counts.get("/contact") == 1 and rec.writer.counts.get(
        "/external_wrench") == 1, timeout=5.0), rec.writer.counts
    with pytest.raises(Exception, match="unknown message type"):
        ros.add(RecorderNode, bag=str(tmp_path / "bag2"), topics=["joint_states"], extra_topics=["no/such"])

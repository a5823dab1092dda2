"""``recorder`` node: live topics -> rosbag2 MCAP bag (via ``rosbags``).

Subscribes to each configured topic with raw (serialized) delivery and writes the
CDR bytes unchanged, stamped with the node's clock (sim time when ``use_sim_time``).
Streams are subscribed RELIABLE with KEEP_ALL history, so in lockstep nothing is
dropped (back-pressure slows the loop instead).  The bag is closed (``metadata.yaml``
written) on shutdown, also on SIGINT/SIGTERM.

Parameters: ``bag`` (directory to create; default ``bags/run_<wall time>``),
``topics`` (relative names are resolved in the node's namespace),
``wait_for_publishers`` (topics whose publisher must be matched before the
recorder subscribes ``joint_states``).  The lockstep bridge starts only when
``joint_states`` has its expected subscribers, so this gate makes the recorder's
readiness mean "connected to the whole graph": discovery between the recorder and
another node can lag behind discovery with the bridge on a loaded machine, and a
volatile stream (the first commands) or an old reference window would be lost.
"""
from __future__ import annotations

import time

import rclpy
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from ..evaluation.bags import BagWriter, ros_type_name
from ..ros.node_base import run_node
from ..ros.params import ParamSpec, declare_params
from ..ros.qos import CLOCK_QOS, LATCHED_QOS

DEFAULT_TOPICS = ["joint_states", "reference", "task_reference", "effort_controller/commands",
                  "controller/tracking_error", "/clock", "adaptive/parametric_torque",
                  "adaptive/parameter_update", "adaptive/parameters", "feedforward/residual", "/diagnostics"]

_RECORD_QOS = QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.VOLATILE)
# references are published ahead and transient-local: a late recorder still gets the window
_RECORD_LATCHED_QOS = QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE,
                                 durability=DurabilityPolicy.TRANSIENT_LOCAL)


def _msg_classes() -> dict:
    """The recorded topics whose message type the recorder knows, and their classes."""
    from rosgraph_msgs.msg import Clock
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float64MultiArray
    from trajectory_msgs.msg import JointTrajectory, MultiDOFJointTrajectory
    from diagnostic_msgs.msg import DiagnosticArray
    from geometry_msgs.msg import WrenchStamped
    known = {
        "joint_states": JointState, "reference": JointTrajectory, "task_reference": MultiDOFJointTrajectory,
        "effort_controller/commands": Float64MultiArray, "controller/tracking_error": JointState,
        "/clock": Clock, "/diagnostics": DiagnosticArray,
        "feedforward/residual": JointState, "adaptive/parameters": JointState,
        "adaptive/parameter_update": JointState, "adaptive/parametric_torque": JointState,
        "residual_learner/prediction": JointState, "learner/prediction": JointState,
        "external_torque": JointState, "contact": JointState, "external_wrench": WrenchStamped,
        "residual/state": JointState, "feedforward/residual_std": JointState,
    }
    return known


def _msg_class(topic: str):
    return _msg_classes().get(topic)


class RecorderNode(Node):
    def __init__(self, **kwargs):
        super().__init__("recorder", **kwargs)
        self.p = declare_params(self, [
            ParamSpec("bag", "", "bag directory to create (must not exist); empty ="
                      " bags/run_<YYYYmmdd_HHMMSS>", read_only=True),
            ParamSpec("topics", DEFAULT_TOPICS, "topics to record", read_only=True, type="str[]"),
            ParamSpec("extra_topics", [""], "topics recorded beside `topics` (the launchers add the monitor's"
                      " with --monitor); [''] = none", read_only=True, type="str[]"),
            ParamSpec("exit_when_idle", 0.0, "> 0: after the first message, close the bag and exit (code 0)"
                      " once the joint_states publisher it saw is gone (the simulation ended) and nothing"
                      " arrived for this many wall seconds (the queue is drained); a stalled but"
                      " living graph never ends the recording", min=0.0, read_only=True),
            ParamSpec("wait_for_publishers", [""], "subscribe joint_states (which the lockstep bridge"
                      " counts before it starts) only once each of these recorded topics has a matched"
                      " publisher ([''] = no wait)", read_only=True, type="str[]"),
        ])
        self._last_msg = None
        self._state_source_seen = False   # a joint_states publisher was matched, or a state arrived
        if self.p["exit_when_idle"] > 0:
            steady = rclpy.clock.Clock(clock_type=rclpy.clock.ClockType.STEADY_TIME)
            self.create_timer(0.2, self._idle_check, clock=steady)
        path = self.p["bag"] or time.strftime("bags/run_%Y%m%d_%H%M%S")
        self.writer = BagWriter(path)
        self._subs = {}
        self._deferred = []
        wait = [t for t in self.p["wait_for_publishers"] if t]
        unknown = [t for t in wait if t not in self.p["topics"]]
        if unknown:
            raise ValueError(f"recorder: wait_for_publishers {unknown} are not recorded topics {self.p['topics']}")
        topics = list(dict.fromkeys([*self.p["topics"], *(t for t in self.p["extra_topics"] if t)]))
        for topic in topics:
            cls = _msg_class(topic)
            if cls is None:
                raise ValueError(f"recorder: unknown message type for topic {topic!r};"
                                 f" known: {sorted(_msg_classes())}")
            resolved = self.resolve_topic_name(topic)
            self.writer.add_topic(resolved, ros_type_name(cls))
            qos = CLOCK_QOS if topic == "/clock" else (
                LATCHED_QOS if topic.startswith("adaptive/parameters") else
                _RECORD_LATCHED_QOS if topic in ("reference", "task_reference") else _RECORD_QOS)
            sub = (cls, topic, lambda data, t=resolved: self._write(t, data), qos)
            if wait and topic == "joint_states":
                self._deferred.append(sub)
            else:
                self._subs[topic] = self.create_subscription(*sub, raw=True)
        self.get_logger().info(f"recording {[self.resolve_topic_name(t) for t in self.p['topics']]}"
                               f" to {self.writer.path}")
        if self._deferred:
            self._wait, self._wait_t0 = wait, time.monotonic()
            self._wait_timer = self.create_timer(0.02, self._gate, clock=rclpy.clock.Clock(
                clock_type=rclpy.clock.ClockType.STEADY_TIME))

    def _gate(self) -> None:
        missing = [t for t in self._wait if self._subs[t].get_publisher_count() < 1]
        if missing:
            waited = time.monotonic() - self._wait_t0
            if int(waited / 5.0) != int((waited - 0.02) / 5.0):
                self.get_logger().warning(f"waiting {waited:.0f} s for publishers of {missing}"
                                          " before subscribing joint_states")
            return
        self.destroy_timer(self._wait_timer)
        for cls, topic, cb, qos in self._deferred:
            self._subs[topic] = self.create_subscription(cls, topic, cb, qos, raw=True)
        self._deferred = []
        self.get_logger().info(f"matched publishers of {self._wait}: recording joint_states")

    def _idle_check(self) -> None:
        publishers = self.count_publishers(self.resolve_topic_name("joint_states"))
        self._state_source_seen = self._state_source_seen or publishers > 0
        if self._last_msg is None or time.monotonic() - self._last_msg <= self.p["exit_when_idle"]:
            return
        # "gone" needs it to have been there: a /diagnostics message from a node that started
        # first must not end the recording before the simulator is even discovered
        if publishers == 0 and self._state_source_seen:
            self.get_logger().info("idle: closing the bag and exiting")
            self.writer.close()
            rclpy.try_shutdown(context=self.context)

    def _write(self, topic: str, data: bytes) -> None:
        # the idle timer is armed by the streams, not by latched/transient-local history
        if self._last_msg is not None or not topic.endswith(("reference", "parameters")):
            self._last_msg = time.monotonic()
        if topic.endswith("joint_states"):
            self._state_source_seen = True
        if not self.writer.closed:
            self.writer.write(topic, self.get_clock().now().nanoseconds, data)

    def destroy_node(self):
        self.writer.close()
        self.get_logger().info(f"bag closed: {self.writer.path} {self.writer.counts}")
        return super().destroy_node()


def main(args=None) -> int:
    return run_node(RecorderNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

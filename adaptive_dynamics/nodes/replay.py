"""Republish a rosbag2 bag over DDS at real or scaled time (``adaptive-dynamics replay``).

Core pieces, usable from Python as well as from the CLI:

* :func:`plan_replay` (no node needed): validates the bag and the topic selection, resolves
  each topic's message class, and decides where ``/clock`` comes from.
* :class:`Replayer`: publishes a plan on an rclpy node.  Messages go out as the CDR
  bytes stored in the bag (``publish_raw``; no re-serialisation, so what a subscriber
  receives is byte-identical to what was recorded) with their recorded types, in the
  bag's order (log time; the recorder writes in arrival order).
* :class:`ReplayNode`: a node wrapping both (parameters below); ``python -m
  adaptive_dynamics.nodes.replay --ros-args -p bag:=... -p rate:=5.0`` runs it
  like any other node.

Timing.  Message *k* is published at ``wall0 + (t_k - t_0) / rate`` where ``t_k`` is
its log time (the recording node's clock: sim time when the recorder ran with
``use_sim_time``), as ``ros2 bag play`` does.  ``rate = 0`` publishes as fast as
possible, still in order.  A replay that falls behind (loaded machine) publishes the
late messages at once and catches up, so the overall rate stays right; the worst lag
is reported.  ``loop`` starts again from the bag's beginning (``/clock`` jumps back,
as with ``ros2 bag play --loop``).

``/clock``.  The recorded ``/clock`` messages are republished in order when the bag
has them; otherwise ``/clock`` is generated from the bag's time axis (log time) at
``clock_rate`` Hz, from the first to the last message.  ``clock: false`` (CLI
``--no-clock``) publishes no ``/clock`` at all.

QoS (the project's profiles, see :mod:`adaptive_dynamics.ros.qos`; every publisher is
RELIABLE, which also serves best-effort subscribers such as rclpy's ``TimeSource`` or
the controller in real time):

* streams (``joint_states``, commands, regressors, feed-forward, ``/diagnostics``,
  anything else): as ``PUBLISHER_STREAM_QOS`` — reliable, volatile, KEEP_LAST;
* ``reference``: as ``REFERENCE_QOS`` — reliable, transient local (as the trajectory
  node, so the controller's transient-local subscription matches);
* parameter estimates / models (``*parameters``, ``gp/model``): as ``LATCHED_QOS`` —
  reliable, transient local;
* ``/clock``: reliable, volatile (best-effort ``TimeSource`` readers connect too).

Why reliable, and how deep: at a high ``rate`` (or ``rate = 0``) a best-effort sample
is simply lost whenever a reader's queue or socket buffer is full.  A reliable writer
re-sends what a reliable reader missed, as long as the sample is still in the writer's
history, so each writer's KEEP_LAST depth covers one whole pass of its topic
(at least the profile's depth; capped at 10^6 for volatile topics, which hold only
unacknowledged samples, and 2·10^4 for transient-local ones, which hold their history).
A reliable subscriber then receives every message in order *provided its own history
keeps them*: subscribe with ``KEEP_ALL`` (or a depth covering the burst) when you need
all of them.  No per-message back-pressure is applied: a DDS acknowledgement only
arrives with the writer's next heartbeat (~3 s in Fast DDS), so waiting for them would
stall the schedule; at the end the replayer waits (up to ``ack_timeout``) for the
reliable readers to acknowledge the tail, so exiting does not cut it off.  With
``loop`` and ``rate = 0`` a reader more than one pass behind can lose samples.

Start.  ``wait_for_subscribers``: before the first message, wait (up to
``wait_timeout`` s) until every replayed topic has a matched subscription, then let
the match settle for 0.2 s; otherwise the first messages of a freshly started graph
would go to nobody (volatile topics keep no history for late joiners).
"""
from __future__ import annotations

import heapq
import importlib
import math
import pathlib
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Sequence

from rclpy.node import Node

from ..evaluation.bags import open_bag, read_raw
from ..ros.params import declare_params, ParamSpec
from ..ros.qos import LATCHED_QOS, PUBLISHER_STREAM_QOS, REFERENCE_QOS

CLOCK_TOPIC = "/clock"
CLOCK_TYPE = "rosgraph_msgs/msg/Clock"


# ---------------------------------------------------------------------------- plan

@dataclass
class ReplayPlan:
    """What to publish, validated against the bag."""

    bag: pathlib.Path
    topics: dict[str, str]              # topic -> msgtype ("pkg/msg/Name"), in bag order
    counts: dict[str, int]              # recorded messages per topic (one pass)
    clock: str                          # "bag" | "generated" | "none"
    clock_rate: float                   # Hz, for "generated"
    start_ns: int                       # bag time axis (log time)
    end_ns: int
    msg_classes: dict = field(default_factory=dict)
    empty: list = field(default_factory=list)   # selected but without messages (not published)
    source: Optional[object] = None             # the opened bag (bags.BagSource)
    recovered: Optional[str] = None             # a cut-off MCAP: what could be read

    @property
    def span_s(self) -> float:
        return max(0.0, (self.end_ns - self.start_ns) * 1e-9)

    @property
    def published_topics(self) -> list[str]:
        out = [t for t in self.topics if t != CLOCK_TOPIC]
        return out + ([CLOCK_TOPIC] if self.clock != "none" else [])


def message_class(msgtype: str):
    """rclpy message class for ``pkg/msg/Name`` (``ValueError`` if not importable)."""
    parts = msgtype.split("/")
    if len(parts) != 3 or parts[1] != "msg":
        raise ValueError(f"unsupported message type name {msgtype!r} (expected pkg/msg/Name)")
    try:
        return getattr(importlib.import_module(f"{parts[0]}.msg"), parts[2])
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"message type {msgtype!r} is not available in this environment ({exc})") from None


def _match_topic(name: str, available: Sequence[str], where: str = "in the bag") -> str:
    """Exact name (a missing leading '/' is added), else a unique namespace suffix."""
    full = name if name.startswith("/") else "/" + name
    if full in available:
        return full
    cands = [t for t in available if t.endswith("/" + name.lstrip("/"))]
    if len(cands) == 1:
        return cands[0]
    if len(cands) > 1:
        raise ValueError(f"topic {name!r} is ambiguous {where}: {cands}")
    raise ValueError(f"topic {name!r} is not {where}; topics: {sorted(available)}")


def plan_replay(bag, topics: Optional[Sequence[str]] = None, *, clock: bool = True,
                clock_rate: float = 100.0) -> ReplayPlan:
    """Validate ``bag`` and the selection; ``ValueError``/``FileNotFoundError`` with the
    reason (missing bag, unknown topic, unavailable type, empty selection)."""
    src = open_bag(bag)        # a cut-off MCAP recording: up to its last complete message, with a warning
    path = src.path if src.recovered else src.dir
    if not (clock_rate > 0 and math.isfinite(clock_rate)):
        raise ValueError(f"clock rate must be > 0 Hz, got {clock_rate}")
    recorded = {t: mt for t, (mt, _) in src.topics.items()}
    counts: dict[str, int] = {t: c for t, (_, c) in src.topics.items()}
    start_ns, end_ns = src.start_ns, src.end_ns
    if sum(counts.values()) == 0:
        raise ValueError(f"bag {str(bag)!r} contains no messages")
    if topics:
        wanted = [_match_topic(t, list(recorded)) for t in topics]
        if CLOCK_TOPIC in wanted and not clock:
            raise ValueError("/clock is both selected (--topics) and disabled (--no-clock)")
    else:
        wanted = list(recorded)
    selected = {t: recorded[t] for t in recorded if t in set(wanted) or (t == CLOCK_TOPIC and clock)}
    if clock and CLOCK_TOPIC in recorded and counts.get(CLOCK_TOPIC, 0) > 0:
        clock_src = "bag"
    elif clock:
        clock_src = "generated"
        selected.pop(CLOCK_TOPIC, None)
    else:
        clock_src = "none"
        selected.pop(CLOCK_TOPIC, None)
    empty = [t for t in selected if counts.get(t, 0) == 0]
    selected = {t: mt for t, mt in selected.items() if counts.get(t, 0) > 0}  # nothing to publish
    if not selected or (topics and set(selected) <= {CLOCK_TOPIC} and CLOCK_TOPIC not in wanted):
        raise ValueError(f"the selected topics {sorted(empty)} have no messages in the bag")
    classes = {t: message_class(mt) for t, mt in selected.items()}
    if clock_src == "generated":
        classes[CLOCK_TOPIC] = message_class(CLOCK_TYPE)
    if clock_src == "bag" and recorded[CLOCK_TOPIC] != CLOCK_TYPE:
        raise ValueError(f"/clock in the bag has type {recorded[CLOCK_TOPIC]}, expected {CLOCK_TYPE}")
    return ReplayPlan(path, selected, {t: counts.get(t, 0) for t in selected}, clock_src,
                      float(clock_rate), int(start_ns), int(end_ns), classes, empty, src, src.recovered)


def _clock_cdr(t_ns: int) -> bytes:
    from rclpy.serialization import serialize_message
    from rosgraph_msgs.msg import Clock
    msg = Clock()
    msg.clock.sec, msg.clock.nanosec = divmod(int(t_ns), 10 ** 9)
    return serialize_message(msg)


def iter_events(plan: ReplayPlan) -> Iterator[tuple[int, str, bytes]]:
    """``(t_ns, topic, cdr_bytes)`` in publication order, generated ``/clock`` merged in."""
    msgs = ((t, topic, raw) for topic, _, t, raw in read_raw(plan.source or plan.bag, list(plan.topics)))
    if plan.clock != "generated":
        yield from msgs
        return
    period = int(round(1e9 / plan.clock_rate))
    n_ticks = (plan.end_ns - plan.start_ns) // period + 1
    # clock ticks sort before messages of the same instant (key 0 < 1)
    ticks = ((plan.start_ns + k * period, 0, CLOCK_TOPIC) for k in range(n_ticks))
    tagged = ((t, 1, topic, raw) for t, topic, raw in msgs)
    for ev in heapq.merge(((t, k, topic, None) for t, k, topic in ticks), tagged, key=lambda e: (e[0], e[1])):
        t, _, topic, raw = ev
        yield t, topic, (raw if raw is not None else _clock_cdr(t))


# ----------------------------------------------------------------------- publisher

STREAM_DEPTH_CAP = 1_000_000     # volatile writers keep only unacknowledged samples
LATCHED_DEPTH_CAP = 20_000       # transient-local writers keep their whole history in memory


def replay_qos(topic: str, count: int = 0):
    """The project's QoS profile for republishing ``topic``, with a writer history deep
    enough for the ``count`` messages of one pass (module docstring)."""
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    base = topic.rstrip("/").rsplit("/", 1)[-1]
    if topic == CLOCK_TOPIC:
        proto, cap = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                                durability=DurabilityPolicy.VOLATILE), STREAM_DEPTH_CAP
    elif base in ("reference", "task_reference"):
        proto, cap = REFERENCE_QOS, LATCHED_DEPTH_CAP
    elif base == "parameters" or topic.endswith("gp/model"):
        proto, cap = LATCHED_QOS, LATCHED_DEPTH_CAP
    else:
        proto, cap = PUBLISHER_STREAM_QOS, STREAM_DEPTH_CAP
    return QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=int(min(max(proto.depth, count + 1), cap)),
                      reliability=proto.reliability, durability=proto.durability)


@dataclass
class ReplayResult:
    counts: dict[str, int]
    wall_s: float                 # first to last publication
    bag_s: float                  # bag time covered (log time, last - first; summed over loops)
    rate: float                   # requested (0 = as fast as possible)
    loops: int                    # complete passes
    max_lag_ms: float             # worst delay behind the schedule (0 when rate = 0)
    unconfirmed: list             # topics whose reliable readers had not acknowledged all at the end
    interrupted: bool

    @property
    def achieved_rate(self) -> float:
        return (self.bag_s / self.wall_s) if self.wall_s > 0 else float("inf")

    def as_dict(self) -> dict:
        ach = self.achieved_rate
        return {"counts": self.counts, "messages": sum(self.counts.values()), "wall_s": round(self.wall_s, 4),
                "bag_s": round(self.bag_s, 4), "rate": self.rate,
                "achieved_rate": round(ach, 4) if math.isfinite(ach) else None, "loops": self.loops,
                "max_lag_ms": round(self.max_lag_ms, 3), "unconfirmed": self.unconfirmed,
                "interrupted": self.interrupted}


class Replayer:
    """Publishes a :class:`ReplayPlan` on ``node`` (one publisher per topic)."""

    def __init__(self, node, plan: ReplayPlan, *, rate: float = 1.0, loop: bool = False,
                 ack_timeout: float = 4.0):
        if not (rate >= 0 and math.isfinite(rate)):
            raise ValueError(f"rate must be >= 0 (0 = as fast as possible), got {rate}")
        self.node, self.plan, self.rate, self.loop = node, plan, float(rate), bool(loop)
        self.ack_timeout = float(ack_timeout)
        self.pubs = {}
        for topic in plan.published_topics:
            count = plan.counts.get(topic, 0)
            if topic == CLOCK_TOPIC and plan.clock == "generated":
                count = int(plan.span_s * plan.clock_rate) + 1
            self.pubs[topic] = node.create_publisher(plan.msg_classes[topic], topic, replay_qos(topic, count))

    def other_publishers(self) -> dict[str, int]:
        """Topics that already have publishers besides ours (a live graph would interleave)."""
        out = {}
        for topic in self.pubs:
            n = self.node.count_publishers(topic) - 1
            if n > 0:
                out[topic] = n
        return out

    def wait_for_subscribers(self, timeout: float, stop: Callable[[], bool] = lambda: False,
                             topics: Optional[Sequence[str]] = None) -> list[str]:
        """Wait until every publisher (of ``topics``, default all) has a matched subscription;
        returns the topics still without one."""
        watch = {t: self.pubs[t] for t in ([_match_topic(x, list(self.pubs), "replayed") for x in topics] if topics
                                          else self.pubs)}
        t_end = time.monotonic() + timeout
        while True:
            missing = [t for t, p in watch.items() if p.get_subscription_count() < 1]
            if not missing or time.monotonic() > t_end or stop():
                break
            time.sleep(0.02)
        if not missing:
            time.sleep(0.2)  # let the readers' side of the match settle
        return missing

    def run(self, stop: Callable[[], bool] = lambda: False) -> ReplayResult:
        """Publish the plan (again and again with ``loop``) until done or ``stop()``."""
        from rclpy.duration import Duration
        counts = {t: 0 for t in self.pubs}
        first_wall = last_wall = None
        max_lag, loops, bag_ns, interrupted = 0.0, 0, 0, False
        pubs = self.pubs
        while not interrupted:
            wall0 = t0 = t_last = None
            for t_ns, topic, raw in iter_events(self.plan):
                if stop():
                    interrupted = True
                    break
                if wall0 is None:
                    wall0, t0 = time.perf_counter(), t_ns
                if self.rate > 0:
                    target = wall0 + (t_ns - t0) * 1e-9 / self.rate
                    d = target - time.perf_counter()
                    while d > 5e-4 and not interrupted:
                        time.sleep(min(d, 0.1))
                        interrupted = stop()
                        d = target - time.perf_counter()
                    if interrupted:
                        break
                    max_lag = max(max_lag, -d)
                pubs[topic].publish(raw)
                last_wall = time.perf_counter()
                if first_wall is None:
                    first_wall = last_wall
                t_last = t_ns
                counts[topic] += 1
            if t0 is not None and t_last is not None:
                bag_ns += t_last - t0
            if not interrupted:
                loops += 1
            if not self.loop:
                break
        # let the last messages reach the reliable readers before the caller tears down
        # (an acknowledgement waits for the writer's next heartbeat: up to ~3 s in Fast DDS)
        unconfirmed = []
        t_end = time.monotonic() + self.ack_timeout
        for topic, pub in pubs.items():
            left = max(0.0, t_end - time.monotonic())
            if counts[topic] and not pub.wait_for_all_acked(Duration(nanoseconds=int(left * 1e9))):
                unconfirmed.append(topic)
        wall = (last_wall - first_wall) if first_wall is not None else 0.0
        return ReplayResult(counts, wall, bag_ns * 1e-9, self.rate, loops, max_lag * 1e3, unconfirmed,
                            interrupted)


# ---------------------------------------------------------------------------- node

def _node_specs():
    return [
        ParamSpec("bag", "", "rosbag2 directory to replay", read_only=True),
        ParamSpec("rate", 1.0, "playback rate: bag seconds per wall second; 0 = as fast as possible"
                  " (order kept)", min=0.0, max=1000.0, read_only=True),
        ParamSpec("topics", [""], "topics to replay ([''] = all)", type="str[]", read_only=True),
        ParamSpec("clock", True, "publish /clock (recorded, else generated at clock_rate)", read_only=True),
        ParamSpec("clock_rate", 100.0, "rate of a generated /clock [Hz] (bag without /clock)", min=0.1,
                  max=10000.0, read_only=True),
        ParamSpec("loop", False, "start again at the end", read_only=True),
        ParamSpec("wait_for_subscribers", False, "wait until every replayed topic (or each of"
                  " wait_topics) has a subscriber", read_only=True),
        ParamSpec("wait_topics", [""], "topics wait_for_subscribers watches ([''] = all replayed)",
                  type="str[]", read_only=True),
        ParamSpec("wait_timeout", 10.0, "longest wait for subscribers [s]", min=0.0, read_only=True),
        ParamSpec("ack_timeout", 4.0, "at the end, longest wait for reliable readers to acknowledge"
                  " everything [s]", min=0.0, read_only=True),
    ]


class ReplayNode(Node):
    """``replay`` node: publishes a bag (parameters: :func:`_node_specs`)."""

    def __init__(self, **kwargs):
        super().__init__("replay", **kwargs)
        p = self.p = declare_params(self, _node_specs())
        if not p["bag"]:
            raise ValueError("replay: parameter 'bag' is required")
        topics = [t for t in p["topics"] if t] or None
        self.plan = plan_replay(p["bag"], topics, clock=p["clock"], clock_rate=p["clock_rate"])
        self.replayer = Replayer(self, self.plan, rate=p["rate"], loop=p["loop"], ack_timeout=p["ack_timeout"])

    def play(self, stop: Callable[[], bool] = lambda: False) -> ReplayResult:
        log = self.get_logger()
        others = self.replayer.other_publishers()
        if others:
            log.warning(f"these topics already have other publishers (a live graph?): {others}")
        if self.p["wait_for_subscribers"]:
            missing = self.replayer.wait_for_subscribers(self.p["wait_timeout"], stop,
                                                         [t for t in self.p["wait_topics"] if t])
            if missing:
                log.warning(f"no subscriber after {self.p['wait_timeout']} s on {missing}; starting anyway")
        log.info(f"replaying {self.plan.bag} ({self.plan.span_s:.3f} s, topics {self.plan.published_topics},"
                 f" /clock {self.plan.clock}) at rate {self.p['rate'] or 'max'}")
        res = self.replayer.run(stop)
        log.info(f"done: {res.as_dict()}")
        return res


def main(args=None) -> int:
    import signal
    import sys

    import rclpy
    from rclpy.signals import SignalHandlerOptions

    rclpy.init(args=list(sys.argv if args is None else args), signal_handler_options=SignalHandlerOptions.NO)
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    node = None
    try:
        node = ReplayNode()
        node.play(stop.is_set)
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

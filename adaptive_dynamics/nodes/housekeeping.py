"""A node's housekeeping: a throttled logger, saving what it learned (on a service call
and at shutdown), real-time scheduling, stall injection for tests, the discovery hint."""
from __future__ import annotations

import os
import time

from ..realtime import set_fifo_priority
from ..ros.params import ParamSpec


def discovery_hint() -> str:
    """``ROS_DOMAIN_ID=..., ROS_AUTOMATIC_DISCOVERY_RANGE=...`` of this process: what a node
    waiting for a topic names, so that a graph split across domains is found."""
    return (f"ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '0 (unset)')},"
            f" ROS_AUTOMATIC_DISCOVERY_RANGE={os.environ.get('ROS_AUTOMATIC_DISCOVERY_RANGE', 'unset')}")


def realtime_spec() -> ParamSpec:
    """``realtime_priority``: the hot nodes' (bridge, controllers) real-time scheduling."""
    return ParamSpec("realtime_priority", 0, "SCHED_FIFO priority (1-98) for every thread of this"
                     " node's process (hot path, DDS threads; adaptive_dynamics.realtime); 0 = normal"
                     " scheduling.  Needs root, CAP_SYS_NICE or an rtprio limit: without, a warning"
                     " and normal scheduling", min=0, max=98, read_only=True)


def apply_realtime_priority(node, counters) -> bool:
    """Apply the node's ``realtime_priority`` (call it once every thread exists: threads
    created later inherit the policy).  Logs the outcome, puts it in the diagnostics
    (``sched``) and returns whether SCHED_FIFO is in effect."""
    prio = int(node.p["realtime_priority"])
    if prio <= 0:
        return False
    ok, msg = set_fifo_priority(prio)
    if ok:
        node.get_logger().info(f"realtime_priority: {msg}")
        counters.set("sched", f"SCHED_FIFO {prio}")
    else:
        node.get_logger().warning(f"realtime_priority {prio} not applied: {msg}; running with normal"
                                  f" scheduling")
        counters.set("sched", f"normal (SCHED_FIFO {prio} not permitted)")
    return ok


def stall_spec() -> ParamSpec:
    """``inject_stall_ms``: a fault drill for the hot nodes (bridge, controllers)."""
    return ParamSpec("inject_stall_ms", 0.0, "fault drill: each set > 0 stalls this node's hot loop once for"
                     " that many ms (what a page fault storm, a GC pause or a neighbour does), to watch the"
                     " loop recover: the bridge reports the overload episode in /diagnostics; 0 = nothing",
                     min=0.0, max=10000.0)


class StallInjector:
    """The hot loop's side of ``inject_stall_ms``: :meth:`take` sleeps once for each
    value set (a plain attribute read otherwise)."""

    def __init__(self, node):
        self.node, self.pending_s, self.injected = node, 0.0, 0
        node.p.on_change("inject_stall_ms", self._on_set)

    def _on_set(self, _name, value) -> None:
        if value > 0:
            self.pending_s = float(value) * 1e-3

    def take(self) -> None:
        if self.pending_s:
            s, self.pending_s = self.pending_s, 0.0
            self.injected += 1
            self.node.get_logger().warning(f"inject_stall_ms: stalling the hot loop for {1e3 * s:.0f} ms")
            time.sleep(s)


class Throttle:
    """At most one log line per ``period`` seconds per key (wall clock)."""

    def __init__(self, period: float = 1.0):
        self.period = period
        self._last: dict = {}

    def __call__(self, key: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, -1e9) >= self.period:
            self._last[key] = now
            return True
        return False


def trigger_save(res, save, *, what: str, unset: str):
    """Fill a ``std_srvs/Trigger`` response from ``save()`` (a path, or None when there is
    nothing to save -- ``unset`` says why)."""
    try:
        path = save()
    except OSError as exc:
        res.success, res.message = False, f"save failed: {exc}"
        return res
    res.success = path is not None
    res.message = f"{what} saved to {path}" if path else unset
    return res


def logged_save(node, save, what: str) -> None:
    """A node's save, logged (at shutdown, after a watchdog trip): ``save()`` returns a path
    (or None: nothing to save); a failure is logged, never raised (the rest of the
    shutdown -- the zero command -- must run)."""
    try:
        path = save()
        if path:
            node.get_logger().info(f"{what} saved to {path}")
    except Exception as exc:
        node.get_logger().error(f"saving the {what} failed: {exc}")


def core_logger(node, throttle):
    """The ``log(level, text, key)`` a ROS-free core reports through: ``node``'s logger,
    a message with a ``key`` (one that may repeat every cycle) throttled by ``throttle``.
    rclpy ties a call site to one severity, hence one call per level."""
    logger = node.get_logger()

    def log(level: str, text: str, key=None) -> None:
        if key is not None and not throttle(key):
            return
        if level == "error":
            logger.error(text)
        elif level == "warning":
            logger.warning(text)
        elif level == "info":
            logger.info(text)
        else:
            logger.debug(text)
    return log

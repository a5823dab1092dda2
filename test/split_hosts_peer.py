"""The stream ends of ``test_learner_split_hosts.py``, each run as its own process in one
of the two network namespaces (``ip netns exec NS python split_hosts_peer.py ROLE``).

``learn`` (next to ``model_update``): publishes ``learn/reference`` and
``learn/joint_states`` (q, qd and a torque that is a smooth function of them) at
``--rate`` Hz, stamped ``k / rate`` s, for ``model_update`` (``target: torque``, its
topics remapped to ``learn/...`` so they never meet the other host's streams).

``robot`` (next to ``prediction``): publishes ``reference`` (chunks, 0.2 s ahead) and
``joint_states`` at ``--rate`` Hz, paced by the monotonic clock, stamped ``k / rate`` s
-- the control loop the prediction node serves -- and subscribes
``feedforward/residual`` and ``/diagnostics``.  It prints JSON lines on stdout:

* ``{"ev": "tick", ...}`` every 0.1 s: states sent, residuals received, the newest
  residual stamp, residual stamps that did not follow the previous one by one period
  (``stamp_breaks``), non-finite residuals, all-zero residuals, the longest wall gap
  between two residuals and between two sent states since the last tick (ms);
* ``{"ev": "diag", "name": ..., "values": {...}}`` for every ``/diagnostics`` status of
  ``prediction`` and ``model_update`` (the latter only while the link carries it);
* ``{"ev": "break", "after": stamp, "got": stamp}`` for a residual stamp that does not
  follow the previous one by one period (instants skipped);
* ``{"ev": "stall", "ms": ...}`` when this process itself did not run for over
  ``STALL`` (the host was busy elsewhere: its states went out late, in a burst).

Both end on SIGINT / SIGTERM.  ``t`` fields are ``time.monotonic()``: one clock for
every network namespace of the host, so the test compares them with its own.
"""
from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import threading
import time

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.qos import QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory

from adaptive_dynamics.ros.joint_states import joint_state_msg
from adaptive_dynamics.ros.qos import PUBLISHER_STREAM_QOS, REFERENCE_QOS
from adaptive_dynamics.ros.references import reference_batch_msg
from adaptive_dynamics.ros.stamps import to_ns

AHEAD = 0.2        # s of reference published ahead of the newest state
CHUNK = 0.05       # s of reference per message
STALL = 0.02       # s: a longer pause of this loop (the host did not run it) is reported
W = np.array([0.9, 1.4])


def motion(t: np.ndarray, n: int):
    w = W[:n]
    Q = 0.7 * np.sin(np.outer(t, w))
    QD = 0.7 * w * np.cos(np.outer(t, w))
    QDD = -0.7 * w ** 2 * np.sin(np.outer(t, w))
    return Q, QD, QDD


def torque(q: np.ndarray, v: np.ndarray) -> np.ndarray:
    return 1.5 * v + 0.4 * np.tanh(v / 0.05) + np.sin(q)


_out = threading.Lock()


def emit(obj) -> None:
    """One JSON line on stdout, whole, from any thread."""
    line = json.dumps(obj) + "\n"
    with _out:
        sys.stdout.write(line)
        sys.stdout.flush()


class Peer:
    def __init__(self, role: str, names: list[str], rate: float, prefix: str):
        self.role = role
        self.names = names
        self.n = len(names)
        self.dt_ns = int(round(1e9 / rate))
        self.node = rclpy.create_node(f"split_hosts_{role}")
        self.pub_state = self.node.create_publisher(JointState, f"{prefix}joint_states", PUBLISHER_STREAM_QOS)
        self.pub_ref = self.node.create_publisher(JointTrajectory, f"{prefix}reference", REFERENCE_QOS)
        self.ref_until = 0          # index of the first reference point not yet published
        self.lock = threading.Lock()
        self.sent = 0
        self.res = 0
        self.res_stamp = None
        self.stamp_breaks = 0
        self.nonfinite = 0
        self.zero = 0
        self.res_gap = 0.0
        self.send_gap = 0.0
        self._last_res = None
        if role == "robot":
            deep = QoSProfile(depth=5000, reliability=ReliabilityPolicy.RELIABLE)
            self.node.create_subscription(JointState, "feedforward/residual", self._on_residual, deep)
            self.node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50)

    # ------------------------------------------------------------ subscriptions
    def _on_residual(self, msg: JointState) -> None:
        now = time.monotonic()
        s = to_ns(msg.header.stamp)
        e = np.asarray(msg.effort, dtype=float)
        with self.lock:
            if self.res_stamp is not None and s != self.res_stamp + self.dt_ns:
                self.stamp_breaks += 1
                emit({"ev": "break", "t": now, "after": self.res_stamp, "got": s})
            self.res_stamp = s
            self.res += 1
            if not np.isfinite(e).all():
                self.nonfinite += 1
            elif not e.any():
                self.zero += 1
            if self._last_res is not None:
                self.res_gap = max(self.res_gap, now - self._last_res)
            self._last_res = now

    def _on_diag(self, msg: DiagnosticArray) -> None:
        now = time.monotonic()
        for st in msg.status:
            if st.name in ("prediction", "model_update"):
                emit({"ev": "diag", "t": now, "name": st.name, "values": {kv.key: kv.value for kv in st.values}})

    # ------------------------------------------------------------------ streams
    def _publish_reference(self, k_state: int) -> None:
        per_chunk = max(1, int(round(CHUNK * 1e9 / self.dt_ns)))
        want = k_state + int(round(AHEAD * 1e9 / self.dt_ns))
        while self.ref_until <= want:
            ks = np.arange(self.ref_until, self.ref_until + per_chunk)
            Q, QD, QDD = motion(ks * self.dt_ns * 1e-9, self.n)
            self.pub_ref.publish(reference_batch_msg(int(ks[0]) * self.dt_ns, self.dt_ns, self.names, Q, QD, QDD))
            self.ref_until += per_chunk

    def _publish_state(self, k: int) -> None:
        t = k * self.dt_ns * 1e-9
        Q, QD, _ = motion(np.array([t]), self.n)
        q = Q[0] + 0.01 * math.cos(3 * t)
        v = QD[0] - 0.02 * math.sin(3 * t)
        self.pub_state.publish(joint_state_msg(k * self.dt_ns, self.names, q, v, torque(q, v)))

    def tick(self) -> None:
        with self.lock:
            emit({"ev": "tick", "t": time.monotonic(), "sent": self.sent, "res": self.res,
                  "res_stamp": self.res_stamp, "stamp_breaks": self.stamp_breaks, "nonfinite": self.nonfinite,
                  "zero": self.zero, "res_gap_ms": round(1e3 * self.res_gap, 2),
                  "send_gap_ms": round(1e3 * self.send_gap, 2)})
            self.res_gap = 0.0
            self.send_gap = 0.0

    def run(self, stop: threading.Event) -> None:
        """Publish state k at t0 + k dt (all that are due after a late wake-up, so the
        stamps stay contiguous); a tick line every 0.1 s."""
        self._publish_reference(0)
        t0 = time.monotonic() + 0.05
        dt = self.dt_ns * 1e-9
        next_tick = t0
        last_send = None
        k = 0
        while not stop.is_set():
            now = time.monotonic()
            if now >= next_tick:
                self.tick()
                next_tick += 0.1
            due = t0 + k * dt
            if now < due:
                time.sleep(min(due - now, 0.002))
                continue
            while t0 + k * dt <= now:
                self._publish_reference(k)
                self._publish_state(k)
                k += 1
            with self.lock:
                self.sent = k
                if last_send is not None:
                    self.send_gap = max(self.send_gap, now - last_send)
                    if now - last_send >= STALL:
                        emit({"ev": "stall", "t": now, "ms": round(1e3 * (now - last_send), 2)})
            last_send = now


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=["learn", "robot"])
    ap.add_argument("--names", default="joint1,joint2")
    ap.add_argument("--rate", type=float, default=1000.0)
    ap.add_argument("--prefix", default="", help="topic prefix, e.g. learn/")
    a = ap.parse_args(argv)
    rclpy.init(signal_handler_options=SignalHandlerOptions.NO)   # SIGINT/SIGTERM: stop below
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    peer = Peer(a.role, a.names.split(","), a.rate, a.prefix)
    ex = SingleThreadedExecutor()
    ex.add_node(peer.node)

    def spin():
        try:
            ex.spin()
        except (ExternalShutdownException, Exception):
            pass

    th = threading.Thread(target=spin, daemon=True)
    th.start()
    emit({"ev": "start", "t": time.monotonic(), "role": a.role})
    try:
        peer.run(stop)
    finally:
        peer.tick()
        ex.shutdown(timeout_sec=1.0)
        th.join(timeout=2.0)
        peer.node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``model_update`` node: the learning half of the prediction / model-update split (PGPOL).

Manual (topics, modes, services, persistence, diagnostics): ``docs/nodes.md#model_update``;
parameters: ``ros2 param describe /model_update <name>``.
"""
from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from typing import Optional, Tuple

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.duration import Duration
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import MultiArrayDimension, UInt8MultiArray
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from ..learning.snapshot import read_snapshot_file, write_snapshot_file
from ..ros.node_base import Counters, HotPath, diagnostic_array, run_node
from ..ros.params import ParamSpec, declare_params
from ..ros.qos import DEEP_RELIABLE_QOS, LATCHED_QOS, REFERENCE_QOS, stream_qos
from ..ros.references import ReferenceBuffer
from .housekeeping import Throttle, trigger_save
from .robot_params import load_robot, robot_specs
from .learner_streams import (SampleAssembler, close_learner, learner_config, learner_specs, make_core,
                             snapshot_bytes_spec, stream_specs)


def specs() -> list[ParamSpec]:
    return robot_specs() + learner_specs() + [
        ParamSpec("target", "residual", "residual: learn tau - adaptive/parametric_torque (next to the"
                  " adaptive controller; tau: target_torque) | torque: learn tau itself (no parametric model; the"
                  " parametric torque and parameter updates are not used)", choices=["residual", "torque"],
                  read_only=True),
        ParamSpec("publish_period", 0.1, "s (wall) between learner/model snapshots at most; one is published"
                  " only when the learner changed", min=0.001, max=60.0),
        ParamSpec("ack_timeout", 10.0, "s: a new snapshot waits until every reader acknowledged the previous"
                  " one (a snapshot slower to cross the link than publish_period would otherwise be replaced"
                  " in flight, again and again), but never longer than this (a stalled reader must not starve"
                  " the others); 0 = do not wait", min=0.0, max=600.0),
        snapshot_bytes_spec("bytes: a larger snapshot is not published and takes no version (counted in"
                            " snapshots_oversize, logged)"),
        ParamSpec("hint_lead", 0.01, "s: before each sample the learner is told the reference point this far"
                  " ahead of the newest state (Learner.hint: PGPOL's k-nearest-neighbour query)", min=0.0, max=1.0),
        ParamSpec("model_file", "", "snapshot file: loaded at start if it exists (or a learner .npz, as"
                  " version 0), saved on shutdown, ~/save_model and every autosave_period; versions continue"
                  " from it; empty = no persistence", read_only=True),
        ParamSpec("autosave_period", 0.0, "> 0: also save every this many wall seconds", min=0.0),
    ] + stream_specs()


class ModelUpdateNode(Node):
    def __init__(self, **kwargs):
        super().__init__("model_update", **kwargs)
        p = self.p = declare_params(self, specs())
        self.model, _ = load_robot(p, self, friction=p["friction"], coulomb_smoothing=p["friction_smoothing"])
        self.names = list(self.model.joint_names)
        self.torque_target = p["target"] == "torque"
        config = learner_config(p["learner_config"])
        if self.torque_target and p["learner"] in ("rbfn", "joint_local"):
            config.setdefault("n_params", 0)   # no parametric model to stay consistent with
        self.core = make_core(p, self.model, config, transform=False if self.torque_target else None,
                              prior="mean" if self.torque_target else "zero")
        self.source = f"{socket.gethostname()}:{self.get_fully_qualified_name()}"
        self.version = 0
        self.epoch = secrets.token_hex(8)        # this run's id in every snapshot header
        self._snap_lock = threading.Lock()
        self._save_lock = threading.Lock()       # one save at a time: a file is never replaced by an older one
        self._snap_rev: Optional[int] = None     # core.revision of the newest snapshot
        self._snap_data: Optional[bytes] = None  # its bytes
        self._oversize_rev: Optional[int] = None  # core.revision whose snapshot was too large to publish
        self._saved_rev: Optional[int] = None
        loaded = None
        if p["model_file"] and os.path.exists(p["model_file"]):
            snap = read_snapshot_file(p["model_file"])   # raises with the reason: never silently drop a model
            self.core.set_learner(snap.learner, where=p["model_file"])
            self.version = snap.version
            if snap.version > 0:   # republish it as it is; a plain .npz becomes version 1 at the first tick
                self._snap_rev, self._snap_data = self.core.revision, snap.data
            self._saved_rev = self.core.revision
            loaded = snap
            self.get_logger().info(f"learner loaded from {p['model_file']}: {snap.learner!r}, version"
                                   f" {snap.version} (epoch {snap.epoch or '(none)'}); new epoch {self.epoch}")
        self.p.on_change("learning", lambda _n, v: setattr(self.core, "learning", bool(v)))
        self.p.on_change("transform", lambda _n, v: setattr(self.core, "transform",
                                                            bool(v) and not self.torque_target))
        self.p.on_change("learn_decimation", lambda _n, v: setattr(self.core, "learn_every", int(v)))
        self.p.on_change("hint_lead", lambda _n, v: setattr(self.samples, "hint_lead_ns", int(v * 1e9)))
        self.p.on_change("publish_period", lambda _n, v: self._start_publish_timer())

        self.counters = Counters("model_update", self.get_fully_qualified_name(),
                                 warn_on=("joint_states_rejected", "reference_rejected", "parametric_torque_rejected",
                                          "command_rejected", "parameter_update_rejected", "sample_rejected",
                                          "snapshots_oversize"))
        for k in ("snapshots_published", "bytes_published", "snapshots_oversize"):
            self.counters.set(k, 0)
        self.counters.set("epoch", self.epoch)
        self.log_throttle = Throttle(1.0)
        self.refs = ReferenceBuffer(self.names, capacity=4096, where="reference")
        self.samples = SampleAssembler(self.core, self.names, self.refs, self.counters, self._reject,
                                       param_names=self.model.parameter_names, target=p["target"],
                                       torque=p["target_torque"], acceleration=p["acceleration"],
                                       acceleration_filter_hz=p["acceleration_filter_hz"],
                                       hint_lead_ns=int(p["hint_lead"] * 1e9))
        self._last_save = time.monotonic()
        self._rate_prev = None

        self.pub_model = self.create_publisher(UInt8MultiArray, "learner/model", LATCHED_QOS)
        self._published_at: Optional[float] = None   # monotonic s of the last snapshot published
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.io = HotPath(self, enabled=p["hot_path_thread"])
        io = self.io.node
        io.create_subscription(JointTrajectory, "reference", self._on_reference, REFERENCE_QOS, raw=True)
        io.create_subscription(JointState, "joint_states", self.samples.on_state, stream_qos(p["reliable_streams"]),
                               raw=True)
        if p["target_torque"] == "commanded":
            io.create_subscription(JointState, "controller/tracking_error", self.samples.on_command,
                                   DEEP_RELIABLE_QOS)
        if not self.torque_target:
            io.create_subscription(JointState, "adaptive/parametric_torque", self.samples.on_parametric_torque,
                                   DEEP_RELIABLE_QOS)
            io.create_subscription(JointState, "adaptive/parameter_update", self.samples.on_parameter_update,
                                   DEEP_RELIABLE_QOS)
        self.create_service(Trigger, "~/save_model", self._srv_save)
        self.create_service(Trigger, "~/reset_model", self._srv_reset)
        self._steady = rclpy.clock.Clock(clock_type=rclpy.clock.ClockType.STEADY_TIME)
        self._pub_timer = None
        self._start_publish_timer()
        self.create_timer(p["diagnostics_period"], self._housekeeping, clock=self._steady)
        if loaded is not None and loaded.version > 0:
            self._publish(loaded.data, loaded.version)
        self.get_logger().info(f"learner {p['learner']} {config or '(defaults)'}; target={p['target']},"
                               f" learning={p['learning']}, transform={self.core.transform}; snapshots on"
                               f" {self.resolve_topic_name('learner/model')} every >= {p['publish_period']} s;"
                               f" joints {self.names}")
        self._constructed = True
        self.io.start()

    # ------------------------------------------------------------- callbacks
    def _reject(self, what: str, exc: Exception) -> None:
        self.counters.inc(f"{what}_rejected")
        if self.log_throttle(what):
            self.get_logger().error(f"{what} rejected: {exc}")

    def _on_reference(self, msg) -> None:
        try:
            self.refs.add_any(msg)
        except ValueError as exc:
            self._reject("reference", exc)

    # ------------------------------------------------------------- snapshots
    def _start_publish_timer(self) -> None:
        if self._pub_timer is not None:
            self.destroy_timer(self._pub_timer)
        self._pub_timer = self.create_timer(self.p["publish_period"], self._tick, clock=self._steady)

    def _tick(self) -> None:
        rev = self.core.revision
        if self.core.ready and rev != self._snap_rev and rev != self._oversize_rev:
            if self._in_flight():
                self.counters.inc("publish_deferred_unacked")
                return
            self.snapshot(publish=True)

    def _in_flight(self) -> bool:
        """Whether the last snapshot is still crossing to a reader (reliable QoS: not yet
        acknowledged by all of them), for less than ``ack_timeout``."""
        limit = self.p["ack_timeout"]
        if not limit or self._published_at is None or time.monotonic() - self._published_at >= limit:
            return False
        return not self.pub_model.wait_for_all_acked(Duration(nanoseconds=0))

    def snapshot(self, *, publish: bool, for_file: bool = False) -> Optional[Tuple[int, bytes]]:
        """``(core revision, bytes)`` of the snapshot of the learner as it is now: the
        newest one if the learner has not changed since, else a new version (published if
        ``publish`` and within ``max_snapshot_bytes``; a file copy, ``for_file``, is made
        even when too large to publish).  None before the learner exists or when too
        large (not for a file; a revision found too large is not encoded again)."""
        with self._snap_lock:
            if self.core.revision == self._snap_rev:
                return self._snap_rev, self._snap_data
            if self.core.revision == self._oversize_rev and not for_file:
                return None
            t0 = time.perf_counter()
            out = self.core.snapshot(self.version + 1, source=self.source, epoch=self.epoch)
            if out is None:
                return None
            rev, data = out
            self.counters.set("encode_ms_last", round(1e3 * (time.perf_counter() - t0), 3))
            oversize = len(data) > self.p["max_snapshot_bytes"]
            if oversize:
                if rev != self._oversize_rev:
                    self._oversize_rev = rev
                    self.counters.inc("snapshots_oversize")
                    if self.log_throttle("oversize"):
                        self.get_logger().error(f"snapshot of {len(data)} bytes is over max_snapshot_bytes"
                                                f" ({self.p['max_snapshot_bytes']}): not published (no version"
                                                f" used; not encoded again until the learner changes)")
                if not for_file:
                    return None
            self.version += 1
            self._snap_rev, self._snap_data = rev, data
            if publish and not oversize:
                try:
                    self._publish(data, self.version)
                except Exception as exc:  # shutting down (context gone): the file copy still counts
                    self.get_logger().error(f"publishing snapshot v{self.version} failed: {exc}")
            return rev, data

    def _publish(self, data: bytes, version: int) -> None:
        msg = UInt8MultiArray()
        msg.layout.dim = [MultiArrayDimension(label=f"{self.p['learner']} v{version}", size=len(data),
                                              stride=len(data))]
        msg.data = data
        self.pub_model.publish(msg)
        self._published_at = time.monotonic()
        self.counters.inc("snapshots_published")
        self.counters.inc("bytes_published", len(data))
        self.counters.set("snapshot_bytes", len(data))
        self.counters.set("version", version)

    # ----------------------------------------------------------- housekeeping
    def _housekeeping(self) -> None:
        d = self.core.diagnostics()
        for k, v in d.items():
            self.counters.set(k, v)
        self.counters.set("version", self.version)
        self.counters.set("target", self.p["target"])
        now = time.monotonic()
        c = self.counters
        cur = (now, d["samples_learned"], d["fit_calls"], c["snapshots_published"])
        if self._rate_prev is not None:
            dt = max(now - self._rate_prev[0], 1e-9)
            for key, a, b in (("samples_learned_per_s", cur[1], self._rate_prev[1]),
                              ("updates_per_s", cur[2], self._rate_prev[2]),
                              ("snapshots_per_s", cur[3], self._rate_prev[3])):
                c.set(key, round((a - b) / dt, 2))
        self._rate_prev = cur
        if self.core.last_error and self.log_throttle("worker"):
            self.get_logger().error(f"learner worker: {self.core.last_error}")
        level = DiagnosticStatus.WARN if self.core.last_error or d["samples_dropped"] else None
        self.io.report(self.counters)
        self.pub_diag.publish(diagnostic_array(self.get_clock().now().to_msg(), [self.counters.status(level)]))
        if self.p["autosave_period"] > 0 and now - self._last_save > self.p["autosave_period"] \
                and self.core.ready and self.core.revision != self._saved_rev:
            try:
                self.save_model(flush=False)   # what is learnt so far: never wait for the worker here
            except OSError as exc:
                if self.log_throttle("save"):
                    self.get_logger().error(f"autosave failed: {exc}")

    def save_model(self, *, flush: bool = True) -> Optional[str]:
        """Save the current snapshot to ``model_file`` (None if unset or nothing learnt);
        ``flush``: first wait up to 5 s for the queued samples to be learnt."""
        path = self.p["model_file"]
        if not path:
            return None
        with self._save_lock:
            if flush:
                self.core.flush(timeout=5.0)
            out = self.snapshot(publish=True, for_file=True)
            if out is None:
                return None
            rev, data = out
            written = write_snapshot_file(path, data)
            self._last_save = time.monotonic()
            self._saved_rev = rev
            return written

    def _srv_save(self, req, res):
        return trigger_save(res, self.save_model, what=f"learner v{self.version}",
                            unset="model_file is not set" if not self.p["model_file"] else "nothing learnt yet")

    def _srv_reset(self, req, res):
        self.core.reset()
        res.success, res.message = True, (f"learner reset (empty; rebuilt after the warm-up, then published as"
                                          f" v{self.version + 1})")
        return res

    def destroy_node(self):
        close_learner(self, lambda: f"learner v{self.version}")
        return super().destroy_node()


def main(args=None) -> int:
    return run_node(ModelUpdateNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

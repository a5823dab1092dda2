"""``prediction`` node: the prediction half of the prediction / model-update split (PGPOL).

Manual (topics, modes, services, persistence, diagnostics): ``docs/nodes.md#prediction``;
parameters: ``ros2 param describe /prediction <name>``.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import NamedTuple, Optional

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.node import Node
from rclpy.serialization import deserialize_message
from sensor_msgs.msg import JointState
from std_msgs.msg import UInt8MultiArray
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from ..learning import LEARNERS, Learner
from ..learning.snapshot import (Snapshot, SnapshotError, decode_snapshot, newer, read_snapshot_file,
                                  write_snapshot_file)
from ..ros.joint_states import JointStateMapper
from ..ros.node_base import Counters, HotPath, diagnostic_array, run_node
from ..ros.params import ParamSpec, declare_params
from ..ros.qos import LATCHED_QOS, REFERENCE_QOS, stream_qos
from ..ros.references import ReferenceBuffer
from .housekeeping import Throttle, trigger_save
from .robot_params import load_robot, robot_specs
from ..wire import WireError, decode_bytes
from .learner_streams import (ResidualOutput, final_save, output_specs, reference_input, snapshot_bytes_spec,
                             stream_specs)

#: how many of the last applied versions ``versions_applied`` lists
APPLIED_KEPT = 16
#: bytes a ``learner/model`` message may carry beyond its snapshot (CDR header, layout)
MESSAGE_SLACK = 4096


def specs() -> list[ParamSpec]:
    return robot_specs() + [
        ParamSpec("learner", "", "accept only snapshots of this learner kind; empty = any kind of"
                  " adaptive_dynamics.learning.LEARNERS", choices=[""] + sorted(LEARNERS), read_only=True),
        snapshot_bytes_spec("bytes: a larger snapshot is refused unread (a larger message before it is queued)"),
        ParamSpec("model_file", "", "snapshot file: loaded at start if it exists (checked like a received"
                  " snapshot), the current model saved there on shutdown and ~/save_model; empty = no"
                  " persistence", read_only=True),
    ] + output_specs("learner/prediction") + [
        ParamSpec("extrapolate", True, "when the reference does not reach the newest state + prediction_lead,"
                  " predict on its grid beyond its newest point from the reference extrapolated linearly from"
                  " its last two points (PGPOL sec. III)"),
        ParamSpec("extrapolation_limit", 0.05, "s: extrapolate the reference at most this far beyond its"
                  " newest point", min=0.0, max=1.0),
    ] + stream_specs()


class Model(NamedTuple):
    """The model in use: swapped as a whole."""

    learner: Learner
    version: int
    epoch: str         # the model_update run that made it
    kind: str
    source: str
    created: float     # Unix s (the encoder's wall clock)
    received: float    # time.monotonic() here
    data: bytes        # the snapshot's bytes (what model_file keeps)


class PredictionNode(Node):
    def __init__(self, **kwargs):
        super().__init__("prediction", **kwargs)
        p = self.p = declare_params(self, specs())
        self.robot, _ = load_robot(p, self)
        self.names = list(self.robot.joint_names)
        self.n = self.robot.n
        self.counters = Counters("prediction", self.get_fully_qualified_name(),
                                 warn_on=("joint_states_rejected", "reference_rejected", "snapshots_refused",
                                          "prediction_failed", "std_failed"))
        for k in ("snapshots_received", "snapshots_applied", "held_outputs", "residuals_published"):
            self.counters.set(k, 0)
        self.log_throttle = Throttle(1.0)
        self.model: Optional[Model] = None
        self._applied: deque = deque(maxlen=APPLIED_KEPT)   # versions applied, newest last
        self._cv = threading.Condition()
        self._pending = None      # (serialized message, time received): the newest snapshot to load
        self._stop = False
        self._saved: Optional[bytes] = None
        self.mapper = JointStateMapper(self.names)
        self.refs = ReferenceBuffer(self.names, capacity=4096, where="reference")
        self._newest_state: Optional[int] = None
        if p["model_file"] and os.path.exists(p["model_file"]):
            self._load_file(p["model_file"])

        self.output = ResidualOutput(self, self.names, self.refs, self.counters, self._log_error,
                                     monitor_topic="learner/prediction", hold=True, std=p["publish_std"])
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # snapshots: on the owner's executor (their bytes are only queued there), never on the hot path
        self.create_subscription(UInt8MultiArray, "learner/model", self._on_snapshot, LATCHED_QOS, raw=True)
        self.io = HotPath(self, enabled=p["hot_path_thread"])
        io = self.io.node
        io.create_subscription(JointTrajectory, "reference", self._on_reference, REFERENCE_QOS, raw=True)
        io.create_subscription(JointState, "joint_states", self._on_state, stream_qos(p["reliable_streams"]),
                               raw=True)
        self.create_service(Trigger, "~/save_model", self._srv_save)
        steady = rclpy.clock.Clock(clock_type=rclpy.clock.ClockType.STEADY_TIME)
        self.create_timer(p["diagnostics_period"], self._housekeeping, clock=steady)
        self._worker = threading.Thread(target=self._run, name="prediction-loader", daemon=True)
        self._worker.start()
        self.get_logger().info(f"predicting {p['learner'] or 'any learner'} from"
                               f" {self.resolve_topic_name('learner/model')}; lead {p['prediction_lead']} s,"
                               f" extrapolate={p['extrapolate']}; joints {self.names}")
        self._constructed = True
        self.io.start()

    # -------------------------------------------------------------- the hot path
    def _log_error(self, key: str, text: str) -> None:
        if self.log_throttle(key):
            self.get_logger().error(text)

    def _on_reference(self, msg) -> None:
        try:
            self.refs.add_any(msg)
        except ValueError as exc:
            self.counters.inc("reference_rejected")
            self._log_error("reference", f"reference rejected: {exc}")

    def _on_state(self, msg) -> None:
        try:
            stamp = self.mapper.map(msg)[0]
        except ValueError as exc:
            self.counters.inc("joint_states_rejected")
            self._log_error("joint_states", f"joint_states rejected: {exc}")
            return
        if self._newest_state is not None and stamp <= self._newest_state:
            self.counters.inc("state_out_of_order")
            return
        self._newest_state = stamp
        p = self.p
        self.output.publish_until(stamp, stamp + int(p["prediction_lead"] * 1e9), self._predict,
                                  output=p["output"], monitor_every=p["monitor_decimation"],
                                  extrapolate_ns=int(p["extrapolation_limit"] * 1e9) if p["extrapolate"] else 0)

    def _predict(self, X: np.ndarray, return_var: bool = False):
        m = self.model   # one read: a swap meanwhile does not mix two models
        if m is None:
            return None
        return m.learner.predict(X, return_var=return_var)

    # ----------------------------------------------------------------- snapshots
    def _on_snapshot(self, raw: bytes) -> None:
        self.counters.inc("snapshots_received")
        limit = self.p["max_snapshot_bytes"] + MESSAGE_SLACK
        if len(raw) > limit:   # refused before it is queued, parsed or copied
            self._refuse("learner/model", SnapshotError(
                "size", f"message of {len(raw)} bytes is over max_snapshot_bytes"
                        f" ({self.p['max_snapshot_bytes']}) + {MESSAGE_SLACK}"))
            return
        with self._cv:
            if self._pending is not None:
                self.counters.inc("snapshots_superseded")
            self._pending = (raw, time.monotonic())
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._stop:
                    self._cv.wait()
                if self._stop:
                    return
                raw, received = self._pending
                self._pending = None
            try:
                self._receive(raw, received)
            except Exception as exc:  # never kill the loader: log, count, keep the model
                self.counters.inc("snapshots_refused")
                self._log_error("loader", f"learner/model: snapshot refused (unexpected {exc!r})")

    def _receive(self, raw: bytes, received: float) -> None:
        t0 = time.perf_counter()
        try:
            try:
                data = decode_bytes(raw)[1]   # a view of raw: no copy
            except WireError:
                try:   # a big-endian or otherwise unusual encoding: rclpy's deserializer
                    data = deserialize_message(raw, UInt8MultiArray).data
                except Exception as exc:
                    raise SnapshotError("message", f"not a std_msgs/UInt8MultiArray ({exc})") from None
            snap = decode_snapshot(data, max_bytes=self.p["max_snapshot_bytes"], accept=self._check_header)
            self._accept(snap, received, "learner/model")
        except SnapshotError as exc:
            self._refuse("learner/model", exc)
        finally:
            self.counters.set("load_ms_last", round(1e3 * (time.perf_counter() - t0), 3))

    def _check_header(self, header: dict) -> None:
        """What the codec cannot know, from the header alone (before the checksum and the
        payload): the kind wanted, the robot's sizes, newer than the model in use (see
        the module); raises SnapshotError."""
        v, kind = header["version"], header["kind"]
        want = self.p["learner"]
        if want and kind != want:
            raise SnapshotError("kind", f"snapshot v{v} holds a {kind!r} learner, this node takes {want!r}")
        if (header["input_dim"], header["output_dim"]) != (3 * self.n, self.n):
            raise SnapshotError("dims", f"snapshot v{v} maps {header['input_dim']} -> {header['output_dim']} values,"
                                        f" this robot needs x = (q, qd, qdd) of {3 * self.n} -> {self.n}")
        cur = self.model
        if cur is not None:
            ok, why = newer(header, cur.version, cur.epoch, cur.created)
            if not ok:
                raise SnapshotError("version", why)

    def _accept(self, snap: Snapshot, received: float, where: str) -> None:
        """Swap in a snapshot that passed :meth:`_check_header` once its learner's trial
        prediction is finite; raises SnapshotError."""
        v = snap.version
        cur = self.model
        x = self._probe_input()
        try:
            f = snap.learner.predict(x)
            if not np.isfinite(f).all():
                raise ValueError("non-finite output")
        except ValueError as exc:
            raise SnapshotError("prediction", f"snapshot v{v}: the learner's trial prediction failed ({exc})") from None
        if self.p["publish_std"]:   # the mean decides (as without publish_std); a missing std is only reported
            try:
                _f, var = snap.learner.predict(x, return_var=True)
                finite = var is not None and bool(np.isfinite(var).all())
            except ValueError:
                finite = False
            if not finite:
                self.get_logger().warning(f"snapshot v{v}: no finite predictive variance in the trial prediction:"
                                          " feedforward/residual_std left out where it is missing (std_failed)")
        self.model = Model(snap.learner, v, snap.epoch, snap.kind, snap.source, snap.created, received, snap.data)
        self._applied.append(v)   # only the loader thread (or the constructor) gets here
        self.counters.update({"snapshots_applied": self.counters["snapshots_applied"] + 1,
                              "versions_applied": " ".join(map(str, self._applied))})
        first = cur is None
        if not first and snap.epoch != cur.epoch:
            self.get_logger().info(f"{where}: model_update restarted: new epoch {snap.epoch or '(none)'} (was"
                                   f" {cur.epoch or '(none)'}); v{v} applied after v{cur.version}")
        elif first or self.log_throttle("applied"):
            self.get_logger().info(f"{where}: model {snap.kind} v{v} applied ({snap.nbytes} bytes from"
                                   f" {snap.source or '?'})" + ("" if first else "; further ones every second"
                                                                              " in /diagnostics"))

    def _refuse(self, where: str, exc: SnapshotError) -> None:
        self.counters.inc(f"refused_{exc.reason}")   # first: a reader that sees the total sees the reason
        self.counters.inc("snapshots_refused")
        cur = self.model
        keep = f"keeping model v{cur.version}" if cur is not None else "still no model (holding zeros)"
        if self.log_throttle(f"refused_{exc.reason}"):
            self.get_logger().warning(f"{where}: snapshot refused ({exc.reason}): {exc}; {keep}")

    def _probe_input(self) -> np.ndarray:
        last = self.refs.latest(1)
        return reference_input(last[0], self.n) if last else np.zeros(3 * self.n)

    # --------------------------------------------------------------- persistence
    def _load_file(self, path: str) -> None:
        try:
            snap = read_snapshot_file(path, max_bytes=self.p["max_snapshot_bytes"], accept=self._check_header)
            self._accept(snap, time.monotonic(), path)
            self._saved = snap.data
        except SnapshotError as exc:
            self._refuse(path, exc)
        except OSError as exc:
            self.counters.inc("snapshots_refused")
            self.get_logger().error(f"{path}: not readable ({exc}); starting without a model")

    def save_model(self) -> Optional[str]:
        path = self.p["model_file"]
        m = self.model
        if not path or m is None:
            return None
        if self._saved is not m.data or not os.path.exists(path):
            write_snapshot_file(path, m.data)
            self._saved = m.data
        return path

    def _srv_save(self, req, res):
        return trigger_save(res, self.save_model, what="model",
                            unset="model_file is not set" if not self.p["model_file"] else "no model yet")

    # -------------------------------------------------------------- diagnostics
    def _housekeeping(self) -> None:
        c = self.counters
        m = self.model
        if m is not None:
            c.set("model_version", m.version)
            c.set("model_epoch", m.epoch)
            c.set("model_kind", m.kind)
            c.set("pulled_back_fraction", round(m.learner.pulled_back_fraction, 4))
            c.set("raw_prediction", m.learner.raw)
            c.set("model_source", m.source)
            c.set("model_age_s", round(time.time() - m.created, 3))
            c.set("model_received_s_ago", round(time.monotonic() - m.received, 3))
        else:
            c.set("model_version", 0)
        self.io.report(c)
        self.pub_diag.publish(diagnostic_array(self.get_clock().now().to_msg(), [c.status()]))

    def destroy_node(self):
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        worker = getattr(self, "_worker", None)
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=2.0)   # a snapshot being applied lands before the final save
        final_save(self, lambda: f"model v{self.model.version}" if self.model else "model")
        if getattr(self, "io", None) is not None:
            self.io.stop()
        return super().destroy_node()


def main(args=None) -> int:
    return run_node(PredictionNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

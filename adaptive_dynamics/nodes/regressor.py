"""``regressor`` node: publishes the dynamics regressors of the measured state, stamped.

Thin adapter over :class:`adaptive_dynamics.dynamics.RobotModel`.  For every
``joint_states`` message (matched by joint name) and, where needed, the reference
stamped with the same instant:

* ``regressor/standard``   Y(q, q̇, q̈) -- ``standard_input: measured`` uses q̈ from the
  backward difference of consecutive velocities (the first state: q̈ = 0);
  ``reference`` evaluates Y(q_d, q̇_d, q̈_d) of the reference (the feed-forward regressor);
* ``regressor/slotine_li`` Y(q, q̇, q̇r, q̈r) with q̇r = q̇_d + Λ(q_d − q),
  q̈r = q̈_d + Λ(q̇_d − q̇) (``lam``);
* ``regressor/filtered``   [W | τ_f]: the filtered regressor W (filter λ/(s+λ),
  ``filter_lambda``) with the filtered measured torque τ_f appended as the last column
  (so W π = τ_f for the true π; no measured q̈ needed).

Layout (README "interfaces"): stamped matrices as ``std_msgs/Float64MultiArray``,
``data[0:2]`` = stamp (sec, nanosec), then row-major, ``layout.data_offset = 2``; dims
``rows:joints`` (model joint order = ``joint_names``) and ``cols:<parameter coordinates>``.
Column names are published latched on ``regressor/columns`` (JointState: ``name`` =
column names, ``position`` = the URDF's parameters in those columns, ``header.frame_id``
= the settings the matrices are computed with, as JSON: ``{"lam": [...] (1 or n
values), "filter_lambda": ..., "rate_hz": ..., "coordinates": "pi" | "base",
"friction": ...}``; republished when ``lam`` or ``filter_lambda`` change), so a
consumer -- the ``adaptive_controller`` with ``regressor_source: topics`` -- can check
that they match its own.  A state whose reference has not arrived yet is held
(``reference_wait``, wall s; a newer state ends the wait), as the controllers do.  Each
regressor has a decimation (0 = off).  Base-parameter columns (``base_parameters``) and
friction columns (``friction``) are options.
"""
from __future__ import annotations

import json
import threading
import time

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from trajectory_msgs.msg import JointTrajectory

from ..ros.joint_states import JointStateMapper, joint_state_msg
from ..ros.node_base import Counters, HotPath, diagnostic_array, run_node
from ..ros.params import ParamSpec, declare_params
from ..ros.qos import LATCHED_QOS, PUBLISHER_STREAM_QOS, REFERENCE_QOS, stream_qos
from ..ros.references import ReferenceBuffer
from ..ros.arrays import stamped_matrix_msg
from .housekeeping import Throttle, apply_realtime_priority, realtime_spec
from .robot_params import friction_smoothing_spec, load_robot, robot_specs


def specs() -> list[ParamSpec]:
    return robot_specs() + [realtime_spec()] + [
        ParamSpec("standard_decimation", 1, "publish regressor/standard every k states (0 = off)", min=0),
        ParamSpec("slotine_li_decimation", 1, "publish regressor/slotine_li every k states (0 = off)", min=0),
        ParamSpec("filtered_decimation", 1, "publish regressor/filtered every k states (0 = off; the"
                  " filter itself runs on every state)", min=0),
        ParamSpec("standard_input", "measured", "measured (q, qd, backward-difference qdd) | reference"
                  " (q_d, qd_d, qdd_d)", choices=["measured", "reference"]),
        ParamSpec("lam", [10.0], "Lambda of the Slotine-Li reference velocity [1/s], 1 or n values",
                  type="float[]", min=0.0),
        ParamSpec("filter_lambda", 20.0, "filter bandwidth of W and tau_f [rad/s]", min=1e-3, max=1e4),
        ParamSpec("rate_hz", 1000.0, "joint_states rate [Hz] (filter step)", min=1.0, read_only=True),
        ParamSpec("base_parameters", False, "columns = base parameters (else the full pi)", read_only=True),
        ParamSpec("friction", False, "append viscous + Coulomb friction columns", read_only=True),
        friction_smoothing_spec(),
        ParamSpec("reference_tolerance", 0.0005, "max |reference stamp - state stamp| [s]", min=0.0),
        ParamSpec("reference_wait", 1.0, "wall time [s] to hold a state whose reference (needed by"
                  " slotine_li or a reference standard regressor) has not arrived yet; a newer state ends"
                  " the wait at once; 0 = never wait (the regressor is skipped, reference_missing)",
                  min=0.0, max=60.0),
        ParamSpec("reliable_streams", True, "subscribe to joint_states reliably", read_only=True),
        ParamSpec("hot_path_thread", True, "take joint_states on a lean companion node (see HotPath)",
                  read_only=True),
        ParamSpec("diagnostics_period", 1.0, "diagnostics period [s] (wall)", min=0.05, max=60.0),
    ]


class RegressorNode(Node):
    def __init__(self, **kwargs):
        super().__init__("regressor", **kwargs)
        p = self.p = declare_params(self, specs())
        self.model, _ = load_robot(p, self, friction=p["friction"], coulomb_smoothing=p["friction_smoothing"])
        m = self.model
        self.n = m.n
        self.base = m.base_parameters() if p["base_parameters"] else None
        self.columns = list(self.base.names) if self.base else list(m.parameter_names)
        self.col_label = "base" if self.base else "pi"
        self.mapper = JointStateMapper(m.joint_names)
        self.refs = ReferenceBuffer(m.joint_names, capacity=4096)
        self.filter = m.filtered_regressor(p["filter_lambda"], 1.0 / p["rate_hz"])
        m.warm_up()  # the compiled Slotine-Li kernel now, not in the first cycle
        self.p.on_change("filter_lambda", lambda _n, v: setattr(self.filter, "lam", float(v)))
        self.p.add_validator(self._validate)
        self.counters = Counters("regressor", self.get_fully_qualified_name())
        self.throttle = Throttle(1.0)
        self._prev = None  # (stamp, v) for the backward difference
        self._k = 0
        self._lock = threading.Lock()  # state processing: io thread vs the wait timer
        self._pending = None  # (stamp, q, v, tau) waiting for its reference
        self._pending_since = 0.0
        self._last_in = None  # newest accepted state stamp
        qos = PUBLISHER_STREAM_QOS
        self.pub = {name: self.create_publisher(Float64MultiArray, f"regressor/{name}", qos)
                    for name in ("standard", "slotine_li", "filtered")}
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._cols_pub = self.create_publisher(JointState, "regressor/columns", LATCHED_QOS)
        self._publish_columns()
        self.p.on_change("lam", lambda *_: self._publish_columns())
        self.p.on_change("filter_lambda", lambda *_: self._publish_columns())
        self.io = HotPath(self, enabled=p["hot_path_thread"])
        self.io.node.create_subscription(JointTrajectory, "reference", self._on_reference, REFERENCE_QOS,
                                       raw=True)  # batch -> arrays: ReferenceBuffer.add_serialized
        self.io.node.create_subscription(JointState, "joint_states", self._on_state,
                                         stream_qos(p["reliable_streams"]),
                                         raw=True)  # serialized -> arrays (wire.py)
        self.create_timer(p["diagnostics_period"], self._diag)
        # wall clock: in lockstep sim time stands still while a state waits
        self.create_timer(0.01, self._wait_timer, clock=Clock(clock_type=ClockType.STEADY_TIME))
        self.get_logger().info(f"{len(self.columns)} {self.col_label} columns; standard from"
                               f" {p['standard_input']}")
        self.io.start()
        apply_realtime_priority(self, self.counters)  # last: every thread exists

    def settings(self) -> dict:
        """What the published matrices depend on besides the state (``regressor/columns``)."""
        return {"lam": [float(x) for x in self.p["lam"]], "filter_lambda": float(self.p["filter_lambda"]),
                "rate_hz": float(self.p["rate_hz"]), "coordinates": self.col_label,
                "friction": bool(self.p["friction"]), "friction_smoothing": float(self.p["friction_smoothing"])}

    def _publish_columns(self) -> None:
        nominal = self.model.parameters
        cols = self.base.to_base(nominal) if self.base else nominal
        self._cols_pub.publish(joint_state_msg(0, self.columns, q=cols, frame_id=json.dumps(self.settings())))

    def _validate(self, cand) -> str | None:
        if len(cand["lam"]) not in (1, self.n):
            return f"lam needs 1 or {self.n} values, got {len(cand['lam'])}"
        return None

    def _cols(self, Y):
        return self.base.regressor(Y) if self.base else Y

    def _on_reference(self, msg) -> None:
        try:
            self.refs.add_any(msg)
        except ValueError as exc:
            self.counters.inc("reference_rejected")
            if self.throttle("ref"):
                self.get_logger().error(f"reference rejected: {exc}")
            return
        with self._lock:
            if self._pending is not None and self._ref(self._pending[0]) is not None:
                self._flush()

    def _ref(self, stamp):
        return self.refs.lookup(stamp, int(self.p["reference_tolerance"] * 1e9), max_staleness_ns=-1)

    def _needs_ref(self, k: int) -> bool:
        dec_std, dec_sl = self.p["standard_decimation"], self.p["slotine_li_decimation"]
        return bool((dec_sl and k % dec_sl == 0)
                    or (dec_std and k % dec_std == 0 and self.p["standard_input"] == "reference"))

    def _flush(self) -> None:
        """Process the waiting state now (with its reference if it came, else without)."""
        pend, self._pending = self._pending, None
        self._process(*pend)

    def _wait_timer(self) -> None:
        with self._lock:
            if self._pending is not None and time.monotonic() - self._pending_since > self.p["reference_wait"]:
                self._flush()

    def _on_state(self, msg) -> None:
        try:
            stamp, q, v, tau = self.mapper.map(msg)
            if v is None:
                raise ValueError("joint_states carries no velocities")
        except ValueError as exc:
            self.counters.inc("state_rejected")
            if self.throttle("state"):
                self.get_logger().error(f"joint_states rejected: {exc}")
            return
        with self._lock:
            if self._last_in is not None and stamp <= self._last_in:
                self.counters.inc("out_of_order")
                if self.throttle("order"):
                    self.get_logger().warning(f"joint_states stamp {stamp} not after {self._last_in}: ignored")
                return
            self._last_in = stamp
            if self._pending is not None:  # a newer state: the waiting one goes out as it is
                self._flush()
            if self.p["reference_wait"] > 0 and self._needs_ref(self._k) and self._ref(stamp) is None:
                # like the controller, wait for the reference stamped for this instant (in
                # lockstep the first states can arrive before the trajectory's references)
                self._pending = (stamp, q, v, tau)
                self._pending_since = time.monotonic()
                return
            self._process(stamp, q, v, tau)

    def _process(self, stamp, q, v, tau) -> None:
        p = self._k
        self._k += 1
        dec_std, dec_sl, dec_f = (self.p["standard_decimation"], self.p["slotine_li_decimation"],
                                  self.p["filtered_decimation"])
        ref = None
        if self._needs_ref(p):
            ref = self._ref(stamp)
            if ref is None:
                self.counters.inc("reference_missing")
        if dec_std and p % dec_std == 0:
            if self.p["standard_input"] == "reference":
                Y = None if ref is None else self.model.regressor(ref.q, _or0(ref.qd, self.n), _or0(ref.qdd, self.n))
            else:
                a = np.zeros(self.n) if self._prev is None else (v - self._prev[1]) / ((stamp - self._prev[0]) * 1e-9)
                Y = self.model.regressor(q, v, a)
            if Y is not None:
                self.pub["standard"].publish(stamped_matrix_msg(stamp, self._cols(Y), "joints", self.col_label))
        if dec_sl and p % dec_sl == 0 and ref is not None:
            lam = np.asarray(self.p["lam"], dtype=float)
            vr = _or0(ref.qd, self.n) + lam * (ref.q - q)
            ar = _or0(ref.qdd, self.n) + lam * (_or0(ref.qd, self.n) - v)
            Y = self.model.slotine_li_regressor(q, v, vr, ar)
            self.pub["slotine_li"].publish(stamped_matrix_msg(stamp, self._cols(Y), "joints", self.col_label))
        if tau is not None:
            W, tau_f = self.filter.update(q, v, tau)
            if dec_f and p % dec_f == 0:
                M = np.column_stack([self._cols(W), tau_f])
                self.pub["filtered"].publish(stamped_matrix_msg(stamp, M, "joints", self.col_label + "+tau_f"))
        else:
            self.counters.inc("no_measured_torque")
        self._prev = (stamp, v)
        self.counters.inc("states")

    def _diag(self) -> None:
        self.io.report(self.counters)
        self.pub_diag.publish(diagnostic_array(self.get_clock().now().to_msg(), [self.counters.status()]))

    def destroy_node(self):
        if hasattr(self, "io"):
            self.io.stop()
        return super().destroy_node()


def _or0(x, n):
    return x if x is not None else np.zeros(n)


def main(args=None) -> int:
    return run_node(RegressorNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

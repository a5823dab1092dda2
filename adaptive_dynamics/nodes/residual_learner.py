"""``residual_learner`` node: online semi-parametric residual learning (Smith & Mistry 2020,
ARDL §3.1) next to the adaptive controller.

Thin adapter over :class:`adaptive_dynamics.learning.OnlineResidual` (no ROS in there).

Learns ``f(x) = tau_measured - tau_parametric`` with ``x = (q, qd, qdd)``:

* ``joint_states`` (stamped per step: q, qd and the measured joint torque in ``effort``);
* ``adaptive/parametric_torque`` (the controller's ``Y pi_hat`` for the same stamp);
* ``reference`` (stamped points; ``qdd`` of the sample = the desired acceleration at
  the state's stamp by default, ``acceleration: measured`` = the backward difference of
  the measured velocity, low-pass filtered at ``acceleration_filter_hz``).

A sample is assembled when the parametric torque of a stamp arrives (the state and the
reference of that stamp are buffered); every ``learn_decimation``-th one is queued
for the learner's worker thread, which never blocks prediction.

``adaptive/parameter_update`` (full parameter names in ``name``, Delta pi_hat in
``position``): each one is applied as the consistency transform (``transform: true``)
in order with the samples, or ignored (``transform: false``: the ablation).

Prediction: on each ``joint_states`` stamp ``t`` the node predicts the residual for
every reference point stamped in ``(last published, t + prediction_lead]`` and not
before ``t`` from the
*reference* state ``(q_d, qd_d, qdd_d)`` and publishes one ``feedforward/residual``
(JointState, ``effort`` by joint name, stamped with the instant it applies to) per
point -- ahead of the state it is for, so the controller finds the exact stamp.  With
``output: false`` the published residual is zero (the learner keeps learning);
``residual_learner/prediction`` carries the learner's prediction regardless of
``output``, every ``monitor_decimation``-th point (the torque-contribution plot).

Live parameters: ``learning``, ``output``, ``transform``, ``learn_decimation`` -- the 4
phases of the paper's online experiment are set through them.  Services
``~/save_model`` and ``~/reset_model`` (std_srvs/Trigger).  ``model_file``: loaded at
start when it exists (kind and sizes checked), saved on shutdown and on
``~/save_model`` (atomic write), and every ``autosave_period`` s.

Bad input (wrong joint names, NaN/inf, wrong parameter names) is rejected, counted in
``/diagnostics`` and logged (throttled); it never reaches the model.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from ..learning import LEARNERS, OnlineResidual
from ..ros.joint_states import JointStateMapper, joint_state_msg
from ..ros.node_base import Counters, HotPath, diagnostic_array, run_node
from ..ros.params import ParamSpec, declare_params
from ..ros.qos import REFERENCE_QOS, PUBLISHER_STREAM_QOS, stream_qos
from ..ros.references import ReferenceBuffer
from ..ros.stamped import vector_from_msg
from .common import Throttle, load_robot, robot_specs, trigger_save

# every parametric torque and every parameter update must be seen (lockstep and real time)
_DEEP_RELIABLE = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1000, reliability=ReliabilityPolicy.RELIABLE,
                            durability=DurabilityPolicy.VOLATILE)
_BUFFER = 2000   # states / parametric torques kept for stamp matching


def specs() -> list[ParamSpec]:
    return robot_specs() + [
        ParamSpec("learner", "gmm", "gmm (incremental GMM + GMR) | rbfn (RBF network + RLS) | gp (exact GP, FIFO window)",
                  choices=sorted(LEARNERS), read_only=True),
        ParamSpec("learner_config", "", "JSON object of the learner's constructor arguments, e.g."
                  ' {"max_components": 64} or {"n_basis": 512, "width": 0.5}; empty = defaults',
                  read_only=True),
        ParamSpec("friction", False, "the controller adapts friction columns too (its parameter_update then"
                  " carries <joint>.fv/.fc)", read_only=True),
        ParamSpec("model_file", "", "learner file (.npz): loaded at start if it exists, saved on shutdown"
                  " and ~/save_model; empty = no persistence", read_only=True),
        ParamSpec("autosave_period", 0.0, "> 0: also save every this many wall seconds", min=0.0),
        ParamSpec("learning", True, "learn from the stream (phases 1, 2, 4)"),
        ParamSpec("output", True, "publish the prediction as feedforward/residual (else zeros)"),
        ParamSpec("transform", True, "apply the consistency transform on every parameter update"),
        ParamSpec("learn_decimation", 10, "learn every k-th sample", min=1, max=1000),
        ParamSpec("block_size", 50, "most samples per learner update on the worker", min=1, max=10000,
                  read_only=True),
        ParamSpec("warmup", 200, "samples collected before the learner is built (GMM scale, RBFN box)",
                  min=2, max=100000, read_only=True),
        ParamSpec("rbfn_box", "data", "RBF input box: data (warm-up range + margin) | limits (joint,"
                  " velocity and acceleration limits)", choices=["data", "limits"], read_only=True),
        ParamSpec("box_margin", 0.2, "rbfn_box data: widen the range by this fraction of the span",
                  min=0.0, max=10.0, read_only=True),
        ParamSpec("acceleration_limit", 10.0, "rad/s^2: the acceleration range of rbfn_box limits",
                  min=1e-3, read_only=True),
        ParamSpec("acceleration", "desired", "qdd of the learning input: desired (reference) | measured"
                  " (filtered difference of the measured velocity)", choices=["desired", "measured"],
                  read_only=True),
        ParamSpec("acceleration_filter_hz", 20.0, "acceleration measured: low-pass cut-off [Hz]",
                  min=0.1, read_only=True),
        ParamSpec("prediction_lead", 0.01, "predict and publish references up to this far [s] ahead of"
                  " the newest state", min=0.0, max=1.0),
        ParamSpec("monitor_decimation", 10, "publish residual_learner/prediction every k-th point (0 = off)",
                  min=0, max=10000),
        ParamSpec("queue_limit", 20000, "queued samples beyond this are dropped (counted)", min=1,
                  read_only=True),
        ParamSpec("reliable_streams", True, "subscribe joint_states reliably (lockstep); false = best"
                  " effort depth 1 (real time)", read_only=True),
        ParamSpec("hot_path_thread", True, "take the 1 kHz topics on a lean companion node with its own"
                  " executor thread", read_only=True),
        ParamSpec("diagnostics_period", 1.0, "s between /diagnostics messages", min=0.05),
    ]


class ResidualLearnerNode(Node):
    def __init__(self, **kwargs):
        super().__init__("residual_learner", **kwargs)
        p = self.p = declare_params(self, specs())
        self.model, _ = load_robot(p, friction=p["friction"])
        self.names = list(self.model.joint_names)
        n = self.n = self.model.n
        try:
            config = json.loads(p["learner_config"]) if p["learner_config"].strip() else {}
            if not isinstance(config, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            raise ValueError(f"learner_config must be a JSON object of constructor arguments: {exc}") from None
        self.core = OnlineResidual(
            self.model, p["learner"], config, learn_every=p["learn_decimation"], block_size=p["block_size"],
            warmup=p["warmup"], box=p["rbfn_box"], box_margin=p["box_margin"],
            acceleration_limit=p["acceleration_limit"], queue_limit=p["queue_limit"],
            learning=p["learning"], transform=p["transform"])
        if p["model_file"] and os.path.exists(p["model_file"]):
            L = self.core.load(p["model_file"])  # raises with what differs: never silently drop a model
            self.get_logger().info(f"learner loaded from {p['model_file']}: {L!r}")
        self.p.on_change("learning", lambda _n, v: setattr(self.core, "learning", bool(v)))
        self.p.on_change("transform", lambda _n, v: setattr(self.core, "transform", bool(v)))
        self.p.on_change("learn_decimation", lambda _n, v: setattr(self.core, "learn_every", int(v)))

        self.counters = Counters("residual_learner", self.get_fully_qualified_name(),
                                 warn_on=("joint_states_rejected", "reference_rejected", "parametric_torque_rejected",
                                          "parameter_update_rejected", "sample_rejected", "prediction_failed"))
        self.log_throttle = Throttle(1.0)
        self.mapper = JointStateMapper(self.names)
        self.refs = ReferenceBuffer(self.names, capacity=4096, where="reference")
        self._lock = threading.Lock()
        self._states: OrderedDict = OrderedDict()   # stamp -> (q, v, tau, qdd_measured)
        self._ptorques: OrderedDict = OrderedDict()  # stamp -> parametric torque (arrived first)
        self._last_pub = None     # stamp of the last published residual
        self._last_state = None   # (stamp, v, filtered acc) for acceleration: measured
        self._acc = np.zeros(n)
        self._k_pred = 0
        self._x = np.empty(3 * n)
        self._dirty = False
        self._last_save = time.monotonic()
        self._param_names = list(self.model.parameter_names)

        self.pub_res = self.create_publisher(JointState, "feedforward/residual", PUBLISHER_STREAM_QOS)
        self.pub_mon = self.create_publisher(JointState, "residual_learner/prediction", PUBLISHER_STREAM_QOS)
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.io = HotPath(self, enabled=p["hot_path_thread"])
        io = self.io.node
        io.create_subscription(JointTrajectory, "reference", self._on_reference, REFERENCE_QOS,
                                       raw=True)  # batch -> arrays: ReferenceBuffer.add_serialized
        io.create_subscription(JointState, "joint_states", self._on_state, stream_qos(p["reliable_streams"]),
                               raw=True)  # serialized -> arrays (wire.py)
        io.create_subscription(JointState, "adaptive/parametric_torque", self._on_ptorque, _DEEP_RELIABLE)
        io.create_subscription(JointState, "adaptive/parameter_update", self._on_update, _DEEP_RELIABLE)
        self.create_service(Trigger, "~/save_model", self._srv_save)
        self.create_service(Trigger, "~/reset_model", self._srv_reset)
        steady = rclpy.clock.Clock(clock_type=rclpy.clock.ClockType.STEADY_TIME)
        self.create_timer(p["diagnostics_period"], self._housekeeping, clock=steady)
        self.get_logger().info(f"learner {p['learner']} {config or '(defaults)'}; learning={p['learning']},"
                               f" output={p['output']}, transform={p['transform']}; joints {self.names}")
        self._constructed = True
        self.io.start()

    # ------------------------------------------------------------- callbacks
    def _reject(self, what: str, exc: Exception) -> None:
        self.counters.inc(f"{what}_rejected")
        if self.log_throttle(what):
            self.get_logger().error(f"{what} rejected: {exc}")

    def _on_reference(self, msg: JointTrajectory) -> None:
        try:
            self.refs.add_any(msg)
        except ValueError as exc:
            self._reject("reference", exc)

    def _on_state(self, msg) -> None:
        try:
            stamp, q, v, tau = self.mapper.map(msg)
            if v is None or tau is None:
                raise ValueError("joint_states needs velocities and efforts (the measured torque)")
        except ValueError as exc:
            self._reject("joint_states", exc)
            return
        with self._lock:
            if self._states and stamp <= next(reversed(self._states)):
                self.counters.inc("state_out_of_order")
                return
            acc = None
            if self.p["acceleration"] == "measured":
                acc = self._measured_acc(stamp, v)
            self._states[stamp] = (q.copy(), v.copy(), tau.copy(), acc)
            while len(self._states) > _BUFFER:
                self._states.popitem(last=False)
            pt = self._ptorques.pop(stamp, None)
        if pt is not None:
            self._learn(stamp, pt)
        self._predict_until(stamp, stamp + int(self.p["prediction_lead"] * 1e9))

    def _measured_acc(self, stamp: int, v: np.ndarray) -> np.ndarray:
        last = self._last_state
        self._last_state = (stamp, v.copy())
        if last is None:
            return self._acc.copy()
        dt = (stamp - last[0]) * 1e-9
        raw = (v - last[1]) / dt
        alpha = 1.0 - np.exp(-2.0 * np.pi * self.p["acceleration_filter_hz"] * dt)
        self._acc += alpha * (raw - self._acc)
        return self._acc.copy()

    def _on_ptorque(self, msg: JointState) -> None:
        try:
            stamp, pt = vector_from_msg(msg, self.names, "effort", where="adaptive/parametric_torque")
        except ValueError as exc:
            self._reject("parametric_torque", exc)
            return
        with self._lock:
            if stamp not in self._states:   # the state has not arrived yet: keep it for _on_state
                self._ptorques[stamp] = pt
                while len(self._ptorques) > _BUFFER:
                    self._ptorques.popitem(last=False)
                return
        self._learn(stamp, pt)

    def _learn(self, stamp: int, pt: np.ndarray) -> None:
        if not self.core.learning:
            return
        with self._lock:
            q, v, tau, acc = self._states[stamp]
        if acc is None:
            ref = self.refs.lookup(stamp, 0, 0)
            if ref is None or ref.qdd is None:
                self.counters.inc("sample_no_reference")
                return
            acc = ref.qdd
        n = self.n
        x = self._x
        x[:n], x[n:2 * n], x[2 * n:] = q, v, acc
        try:
            self.core.add_sample(x, tau - pt)
        except ValueError as exc:
            self._reject("sample", exc)

    def _on_update(self, msg: JointState) -> None:
        try:
            if list(msg.name) != self._param_names:
                missing = [k for k in self._param_names if k not in msg.name]
                extra = [k for k in msg.name if k not in self._param_names]
                raise ValueError(f"parameter names differ from the model's ({len(msg.name)} vs"
                                 f" {len(self._param_names)}; missing {missing[:4]}, unexpected {extra[:4]};"
                                 f" friction columns need friction:=true)")
            _, dpi = vector_from_msg(msg, None, "position", where="adaptive/parameter_update")
        except ValueError as exc:
            self._reject("parameter_update", exc)
            return
        if self.core.add_parameter_update(dpi):
            self._dirty = True

    def _predict_until(self, now: int, horizon: int) -> None:
        # never for instants before the newest state (a late start or a stall would
        # otherwise burst out residuals for the past)
        after = self._last_pub if self._last_pub is not None and self._last_pub >= now else now - 1
        refs = self.refs.between(after, horizon)
        if not refs:
            return
        n = self.n
        X = np.empty((len(refs), 3 * n))
        todo = [r.stamp_ns for r in refs]
        for i, r in enumerate(refs):
            X[i, :n] = r.q
            X[i, n:2 * n] = r.qd if r.qd is not None else 0.0
            X[i, 2 * n:] = r.qdd if r.qdd is not None else 0.0
        try:
            F = self.core.predict(X)
            if not np.isfinite(F).all():
                raise ValueError("non-finite prediction")
        except ValueError as exc:
            self.counters.inc("prediction_failed")
            if self.log_throttle("predict"):
                self.get_logger().error(f"prediction failed ({exc}): publishing zero residuals")
            F = np.zeros((len(todo), n))
        output = self.p["output"]
        mon = self.p["monitor_decimation"]
        for s, f in zip(todo, F):
            self.pub_res.publish(joint_state_msg(s, self.names, effort=f if output else np.zeros(n)))
            if mon and self._k_pred % mon == 0:
                self.pub_mon.publish(joint_state_msg(s, self.names, effort=f))
            self._k_pred += 1
        self.counters.inc("residuals_published", len(todo))
        self._last_pub = todo[-1]

    # ----------------------------------------------------------- housekeeping
    def _housekeeping(self) -> None:
        d = self.core.diagnostics()
        for k, v in d.items():
            self.counters.set(k, v)
        self.counters.set("output", self.p["output"])
        if self.core.last_error and self.log_throttle("worker"):
            self.get_logger().error(f"learner worker: {self.core.last_error}")
        level = DiagnosticStatus.WARN if self.core.last_error or d["samples_dropped"] else None
        self.io.report(self.counters)
        self.pub_diag.publish(diagnostic_array(self.get_clock().now().to_msg(), [self.counters.status(level)]))
        if self.p["autosave_period"] > 0 and time.monotonic() - self._last_save > self.p["autosave_period"] \
                and (self._dirty or d["samples_learned"]):
            try:
                self.save_model()
            except OSError as exc:
                if self.log_throttle("save"):
                    self.get_logger().error(f"autosave failed: {exc}")

    def save_model(self) -> str | None:
        path = self.p["model_file"]
        if not path:
            return None
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.core.flush(timeout=5.0)
        written = self.core.save(path)
        self._last_save = time.monotonic()
        self._dirty = False
        return written

    def _srv_save(self, req, res):
        return trigger_save(res, self.save_model, what="learner",
                            unset="model_file is not set" if not self.p["model_file"] else "nothing learnt yet")

    def _srv_reset(self, req, res):
        self.core.reset()
        res.success, res.message = True, "learner reset (empty; rebuilt after the warm-up)"
        return res

    def destroy_node(self):
        if getattr(self, "_constructed", False):  # a node that failed to load never overwrites the file
            self._constructed = False
            try:
                path = self.save_model()
                if path:
                    self.get_logger().info(f"learner saved to {path}")
            except Exception as exc:
                self.get_logger().error(f"saving the learner failed: {exc}")
        if getattr(self, "core", None) is not None:
            self.core.stop()
        if getattr(self, "io", None) is not None:
            self.io.stop()
        return super().destroy_node()


def main(args=None) -> int:
    return run_node(ResidualLearnerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

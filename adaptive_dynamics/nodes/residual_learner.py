"""``residual_learner`` node: online semi-parametric residual learning next to the adaptive
controller (:class:`adaptive_dynamics.learning.OnlineResidual`).

Manual (topics, modes, services, persistence, diagnostics): ``docs/nodes.md#residual_learner``;
parameters: ``ros2 param describe /residual_learner <name>``.
"""
from __future__ import annotations

import os
import time

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from ..ros.node_base import Counters, HotPath, diagnostic_array, run_node
from ..ros.params import ParamSpec, declare_params
from ..ros.joint_states import joint_state_msg
from ..ros.qos import DEEP_RELIABLE_QOS, PUBLISHER_STREAM_QOS, REFERENCE_QOS, stream_qos
from ..ros.references import ReferenceBuffer
from .housekeeping import Throttle, trigger_save
from .robot_params import load_robot, robot_specs
from .learner_streams import (ResidualOutput, SampleAssembler, close_learner, learner_config, learner_specs, make_core,
                             output_specs, rowwise, stream_specs)


def specs() -> list[ParamSpec]:
    return robot_specs() + learner_specs() + [
        ParamSpec("model_file", "", "learner file (.npz): loaded at start if it exists, saved on shutdown"
                  " and ~/save_model; empty = no persistence", read_only=True),
        ParamSpec("autosave_period", 0.0, "> 0: also save every this many wall seconds", min=0.0),
        ParamSpec("state_residual", False, "also publish residual/state: the prediction at each measured state,"
                  " x = (q, qd, qdd_d at the state's stamp), stamped like the state (external_torque's"
                  " residual_input: state: the observer compares the measured motion with the model at it)",
                  read_only=True),
    ] + output_specs("residual_learner/prediction") + stream_specs()


class ResidualLearnerNode(Node):
    def __init__(self, **kwargs):
        super().__init__("residual_learner", **kwargs)
        p = self.p = declare_params(self, specs())
        self.model, _ = load_robot(p, self, friction=p["friction"], coulomb_smoothing=p["friction_smoothing"])
        self.names = list(self.model.joint_names)
        self.n = self.model.n
        config = learner_config(p["learner_config"])
        self.core = make_core(p, self.model, config)
        if p["model_file"] and os.path.exists(p["model_file"]):
            L = self.core.load(p["model_file"])  # raises with what differs: never silently drop a model
            self.get_logger().info(f"learner loaded from {p['model_file']}: {L!r}")
        self.p.on_change("learning", lambda _n, v: setattr(self.core, "learning", bool(v)))
        self.p.on_change("transform", lambda _n, v: setattr(self.core, "transform", bool(v)))
        self.p.on_change("learn_decimation", lambda _n, v: setattr(self.core, "learn_every", int(v)))

        self.counters = Counters("residual_learner", self.get_fully_qualified_name(),
                                 warn_on=("joint_states_rejected", "reference_rejected", "parametric_torque_rejected",
                                          "command_rejected", "parameter_update_rejected", "sample_rejected",
                                          "prediction_failed", "std_failed"))
        self.log_throttle = Throttle(1.0)
        self.refs = ReferenceBuffer(self.names, capacity=4096, where="reference")
        self.samples = SampleAssembler(self.core, self.names, self.refs, self.counters, self._reject,
                                       param_names=self.model.parameter_names, torque=p["target_torque"],
                                       acceleration=p["acceleration"],
                                       acceleration_filter_hz=p["acceleration_filter_hz"],
                                       hint_lead_ns=int(p["prediction_lead"] * 1e9))
        self.p.on_change("prediction_lead", lambda _n, v: setattr(self.samples, "hint_lead_ns", int(v * 1e9)))
        self._dirty = False
        self._last_save = time.monotonic()

        self.output = ResidualOutput(self, self.names, self.refs, self.counters, self._log_error,
                                     monitor_topic="residual_learner/prediction", std=p["publish_std"])
        # lockstep: each reference point predicted on its own (the same bits however they came)
        self._predict = rowwise(self.core.predict) if self.core.lockstep else self.core.predict
        self.samples.on_step = self._output if self.core.lockstep else None
        self.pub_state = (self.create_publisher(JointState, "residual/state", PUBLISHER_STREAM_QOS)
                          if p["state_residual"] else None)
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.io = HotPath(self, enabled=p["hot_path_thread"])
        io = self.io.node
        io.create_subscription(JointTrajectory, "reference", self._on_reference, REFERENCE_QOS,
                               raw=True)  # batch -> arrays: ReferenceBuffer.add_serialized
        io.create_subscription(JointState, "joint_states", self._on_state, stream_qos(p["reliable_streams"]),
                               raw=True)  # serialized -> arrays (wire.py)
        io.create_subscription(JointState, "adaptive/parametric_torque", self.samples.on_parametric_torque,
                               DEEP_RELIABLE_QOS)
        io.create_subscription(JointState, "adaptive/parameter_update", self._on_update, DEEP_RELIABLE_QOS)
        if p["target_torque"] == "commanded":
            io.create_subscription(JointState, "controller/tracking_error", self.samples.on_command,
                                   DEEP_RELIABLE_QOS)
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

    def _log_error(self, key: str, text: str) -> None:
        if self.log_throttle(key):
            self.get_logger().error(text)

    def _on_reference(self, msg: JointTrajectory) -> None:
        try:
            self.refs.add_any(msg)
        except ValueError as exc:
            self._reject("reference", exc)

    def _on_state(self, msg) -> None:
        stamp = self.samples.on_state(msg)
        if stamp is not None and not self.core.lockstep:   # lockstep: once its step ran (on_step)
            self._output(stamp)

    def _output(self, stamp: int) -> None:
        """The residuals ahead of the state stamped ``stamp`` (and residual/state for it)."""
        self.output.publish_until(stamp, stamp + int(self.p["prediction_lead"] * 1e9), self._predict,
                                  output=self.p["output"], monitor_every=self.p["monitor_decimation"])
        if self.pub_state is not None:
            self._publish_state_residual(stamp)

    def _publish_state_residual(self, stamp: int) -> None:
        """``residual/state`` for the state stamped ``stamp`` (zeros with ``output`` off or
        before the learner exists; nothing when the state has no reference acceleration
        or the prediction fails: never a NaN residual)."""
        x = self.samples.state_input(stamp)
        if x is None:
            self.counters.inc("state_residual_no_reference")
            return
        try:
            f = np.asarray(self.core.predict(x), dtype=float)
            if f.shape != (self.n,) or not np.isfinite(f).all():
                raise ValueError(f"prediction {f.tolist()}")
        except ValueError as exc:
            self.counters.inc("prediction_failed")
            self._log_error("predict_state", f"prediction at the state failed ({exc}): no residual/state")
            return
        self.pub_state.publish(joint_state_msg(stamp, self.names, effort=f if self.p["output"] else 0.0 * f))

    def _on_update(self, msg: JointState) -> None:
        if self.samples.on_parameter_update(msg):
            self._dirty = True

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
        close_learner(self, lambda: "learner")
        return super().destroy_node()


def main(args=None) -> int:
    return run_node(ResidualLearnerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

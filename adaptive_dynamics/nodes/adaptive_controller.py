"""``adaptive_controller`` node: direct and composite adaptive control, adaptive backstepping
and the fixed-estimate laws; its cycle is
:class:`adaptive_dynamics.control.adaptive_session.AdaptiveSession`.

Manual (topics, modes, services, persistence, diagnostics): ``docs/nodes.md#adaptive_controller``;
parameters: ``ros2 param describe /adaptive_controller <name>``.
"""
from __future__ import annotations

import time

import numpy as np
from sensor_msgs.msg import JointState
from std_srvs.srv import Trigger
from trajectory_msgs.msg import MultiDOFJointTrajectory

from ..control.adaptive import spd_gain
from ..control.adaptive_session import ADAPTIVE_LAWS, AdaptiveSession
from ..control.adaptive_setup import build_laws, derived_kd, estimate_over_limits, is_thunder_file
from ..ros.joint_states import joint_state_msg
from ..ros.node_base import run_node
from ..ros.params import ParamSpec
from ..ros.qos import DEEP_RELIABLE_QOS, LATCHED_QOS, PUBLISHER_STREAM_QOS
from ..ros.arrays import VectorBuffer, vector_from_msg
from ..ros.task_references import TASK_REFERENCE_TOPIC, TaskReferenceBuffer, base_frame_name
from .housekeeping import core_logger, logged_save, trigger_save
from .controller_shell import JointControllerShell, shell_specs
from .regressor_inputs import RegressorInputs
from .robot_params import friction_smoothing_spec

LAWS = ("sliding_pd", "slotine_li", "direct", "composite", "backstepping")
REGRESSOR_SOURCES = ("inprocess", "topics")
#: controller/tracking_error names of the backstepping law: position, then orientation error
TASK_ERROR_NAMES = ("x", "y", "z", "rx", "ry", "rz")
_GAIN_PARAMS = ("lam", "kd", "gamma", "p0", "r", "filter_lambda", "lambda0", "k0", "k1", "max_tracking_error")


def specs() -> list[ParamSpec]:
    return shell_specs() + [
        ParamSpec("law", "composite", "sliding_pd (-K_D s) | slotine_li (the URDF's model, not adapted) |"
                  " direct | composite (joint space, on `reference`; switchable live) | backstepping (task space,"
                  " on `task_reference`; chosen at start); pd and computed_torque are the controller node's",
                  choices=list(LAWS)),
        ParamSpec("adaptation", "direct", "law backstepping: the parameter update, direct (Thunder's (34):"
                  " -Gamma Y^T s) or composite (+ the filtered prediction error, gains p0, r, ...)",
                  choices=["direct", "composite"]),
        ParamSpec("kp_task", [10.0], "law backstepping: K of q_dot_r = J# (v_d + K e) [1/s], 1 value or 6"
                  " (x y z, then the three orientation rows)", type="float[]", min=1e-6, max=1e4),
        ParamSpec("k_posture", 1.0, "law backstepping: null-space pull towards the start posture [1/s]"
                  " (redundant arms; 0 = off)", min=0.0, max=1e3),
        ParamSpec("singular_damping", 0.05, "law backstepping: largest damping of the pseudo-inverse of J,"
                  " reached at a singular pose", min=0.0, max=10.0, read_only=True),
        ParamSpec("singular_threshold", 0.05, "law backstepping: smallest singular value of J below which the"
                  " damping rises (above it J# is the exact pseudo-inverse)", min=1e-6, max=10.0,
                  read_only=True),
        ParamSpec("orientation_error", "log", "law backstepping: the orientation error e_o -- log (theta r of"
                  " R_d R^T) or vect (sin(theta) r, the lab controller's, with its L-matrix mapping in q_dot_r"
                  " and the cross term)", choices=["log", "vect"], read_only=True),
        ParamSpec("adapted_links", [""], "estimate only these links' inertial parameters (+ friction), the"
                  " others keep the URDF's values; a body fixed to a link (the Panda's panda_hand) names that"
                  " link; [''] = every link", type="str[]", read_only=True),
        ParamSpec("lam", [10.0], "Lambda [1/s] of the sliding variable: 1 or n values (diagonal), or n*n"
                  " (symmetric positive definite)", type="float[]"),
        ParamSpec("kd", [0.0], "K_D [Nm s/rad]: 1, n or n*n values (SPD); [0] = derived from the robot's model"
                  " (adaptive_dynamics.control.gains: 4 x 10/s x M_jj at the middle of the joint ranges, within"
                  " 1-20 % of each joint's effort limit per rad/s), what a robot without tuned gains gets, e.g."
                  " one whose URDF comes from robot_description", type="float[]"),
        ParamSpec("gamma", [1.0], "direct law: Gamma, 1, b or b*b values (SPD; b = adapted parameters)",
                  type="float[]"),
        ParamSpec("gamma_scaling", "nominal", "direct law: Gamma = gamma * diag(s_i^2), s_i = |base parameter"
                  " i of the URDF| (floored at 1 % of the largest; friction: 1) -- each parameter moves"
                  " relative to its own size | none (Gamma = gamma as given)", choices=["nominal", "none"],
                  read_only=True),
        ParamSpec("p0", [1.0], "composite law: initial P, 1, b or b*b values (SPD); setting it resets P",
                  type="float[]"),
        ParamSpec("r", [1.0], "composite law: prediction-error weight R, 1, n or n*n values (SPD)",
                  type="float[]"),
        ParamSpec("filter_lambda", 20.0, "composite law: filter bandwidth of W and tau_f [rad/s]",
                  min=1e-3, max=1e4),
        ParamSpec("lambda0", 0.1, "composite law: maximum forgetting rate [1/s] (bounded-gain forgetting)",
                  min=0.0, max=1e3),
        ParamSpec("forget_to", "prior", "composite law: what forgetting forgets toward: zero (ARDL, Slotine & Li:"
                  " all information) | prior (the initial estimate with covariance p0: directions the motion"
                  " does not excite return to it at the forgetting rate instead of drifting)",
                  choices=["zero", "prior"], read_only=True),
        ParamSpec("adapt_to_feedforward", True, "with a feedforward/residual: the s-driven law adapts on"
                  " s - K_D^-1 f, as if the feedback had supplied the residual f, so the parametric estimate"
                  " adapts as it would alone and is what remains where the residual falls back (off: the"
                  " residual is only added to the command, the papers')",
                  read_only=True),
        ParamSpec("k0", 1000.0, "composite law: |P| at which forgetting would vanish", min=1e-9),
        ParamSpec("k1", 100.0, "composite law: |P| above which forgetting is off", min=1e-9),
        ParamSpec("max_tracking_error", 0.0, "freeze learning while |q_d - q| exceeds this [rad] (law"
                  " backstepping: the task-space error norm [m, rad]); 0 = never", min=0.0),
        ParamSpec("learning", True, "adapt the estimate (direct, composite, backstepping; off: the law with"
                  " the estimate held)"),
        ParamSpec("learning_until", 0.0, "> 0: adapt only on states stamped before this time [s] (a scheduled"
                  " freeze, at the same state on any machine; learning set off over the parameter service lands"
                  " when the call does); 0 = no end", min=0.0),
        ParamSpec("feedforward", True, "add feedforward/residual when one is available"),
        ParamSpec("model_input", "state", "where the model term Y pi_hat is evaluated: state (Slotine-Li,"
                  " Y(q, qd, qd_r, qdd_r)) | desired (a pure feed-forward Y(q_d, qd_d, qd_d, qdd_d): PGPOL's"
                  " rigid-body baseline; joint space only)", choices=["state", "desired"], read_only=True),
        ParamSpec("parametric_torque", "law", "what adaptive/parametric_torque (the residual learner's"
                  " parametric part) carries: law: the control law's model torque Y(q, qd, qd_r, qdd_r) pi_hat"
                  " (ARDL's residual) | state: the model at the learner's input x = (q, qd, qdd_d), Y(x) pi_hat"
                  " -- the learnt residual a function of the state and the consistency transform exact"
                  " (monitoring: docs/contact.md; one more regressor per cycle; joint space only)",
                  choices=["law", "state"], read_only=True),
        ParamSpec("residual_wait", 0.0, "lockstep: once residuals have been received, wait up to this many"
                  " wall s for the residual stamped for the state before answering it (0 = never wait)",
                  min=0.0, max=60.0),
        ParamSpec("residual_staleness", 0.01, "use the newest residual at most this old [s] when none is"
                  " stamped for the state's instant", min=0.0, max=10.0),
        ParamSpec("base_parameters", True, "adapt base parameters (else the full pi)", read_only=True),
        ParamSpec("friction", False, "add viscous + Coulomb friction columns to the estimate", read_only=True),
        friction_smoothing_spec(),
        ParamSpec("projection", False, "physical-consistency projection of the estimate (adapts the"
                  " full pi)", read_only=True),
        ParamSpec("robot_compensates_gravity", False, "the robot adds g(q) itself (franka_ros2): the"
                  " estimated gravity is left out of the command", read_only=True),
        ParamSpec("initial_estimate", "zero", "zero (ARDL) | nominal (URDF) | scaled (nominal_scale x URDF) |"
                  " file (initial_estimate_file)", choices=["zero", "nominal", "scaled", "file"], read_only=True),
        ParamSpec("initial_estimate_file", "", "initial_estimate=file: the estimate to start from (e.g."
                  " estimate_consistent.npz of `adaptive-dynamics identify`, or a Thunder Dynamics"
                  " *_inertial_REG.yaml); read, never written", read_only=True),
        ParamSpec("nominal_scale", 0.5, "scale of the URDF parameters for initial_estimate=scaled",
                  min=0.0, read_only=True),
        ParamSpec("friction_model_file", "", "a fixed joint-friction feed-forward tau_s(qd) beside the estimate:"
                  " friction_<kind>.json of `adaptive-dynamics identify --friction sigmoid|stribeck` (start from"
                  " its estimate_<kind>.npz); the composite law learns tau_measured - tau_s(qd); joint space,"
                  " regressor_source inprocess", read_only=True),
        ParamSpec("estimate_file", "", "load the estimate from this .npz at start (if it exists) and save"
                  " it there on shutdown, on ~/save_estimate and every autosave_period", read_only=True),
        ParamSpec("autosave_period", 10.0, "wall s between automatic saves (0 = off)", min=0.0),
        ParamSpec("update_decimation", 10, "publish the accumulated parameter update every k cycles",
                  min=1, max=10000),
        ParamSpec("parameters_decimation", 100, "publish the estimate every k cycles", min=1, max=100000),
        ParamSpec("rate_hz", 1000.0, "control rate [Hz] (the update is integrated with 1/rate_hz)",
                  min=1.0, max=10000.0, read_only=True),
        ParamSpec("regressor_source", "inprocess", "inprocess: compute the regressors in the cycle (lowest"
                  " latency) | topics: use the regressor node's regressor/slotine_li + regressor/filtered"
                  " with the state's stamp (its lam, filter_lambda, rate_hz and full columns must match)",
                  choices=list(REGRESSOR_SOURCES), read_only=True),
    ]


class AdaptiveControllerNode(JointControllerShell):
    def __init__(self, **kwargs):
        super().__init__("adaptive_controller", specs(), **kwargs)

    # ------------------------------------------------------------------ setup
    def _model_kwargs(self) -> dict:
        return {"friction": bool(self.p["friction"]), "coulomb_smoothing": float(self.p["friction_smoothing"])}

    def _make_references(self):
        if self.p["law"] != "backstepping":
            return super()._make_references()
        # task space: the end-effector stream of the trajectory node's space: task
        self.REFERENCE_TOPIC, self.REFERENCE_TYPE = TASK_REFERENCE_TOPIC, MultiDOFJointTrajectory
        self.world_frame = base_frame_name(self.model)
        return TaskReferenceBuffer(self.world_frame, self.model.ee_frame, capacity=4096,
                                   max_staleness_ns=int(self.p["reference_staleness"] * 1e9))

    def _setup_law(self) -> None:
        p = self.p
        if p["law"] == "backstepping" and p["regressor_source"] == "topics":
            raise ValueError("law backstepping computes its regressor in the cycle (its q_dot_r comes from the"
                             " task-space reference, which the regressor node does not see): set"
                             " regressor_source: inprocess")
        if p["friction_model_file"] and p["regressor_source"] == "topics":
            raise ValueError("friction_model_file takes the fixed friction out of the measured torque before the"
                             " composite law's filter, which regressor_source: topics runs elsewhere: set"
                             " regressor_source: inprocess")
        laws = build_laws(self.model, p, self._gain_kwargs(p), log=self.get_logger().info)
        self.laws, self.task, self.core, self.bs = laws, laws.task, laws.core, laws.bs
        if p["initial_estimate"] == "file" and not is_thunder_file(p["initial_estimate_file"]):
            self._check_estimate(p["initial_estimate_file"])
        self.session = AdaptiveSession(laws, lock=self._lock, estimate_file=p["estimate_file"],
                                       log=core_logger(self, self.log_throttle), count=self.counters.inc)
        self.model.warm_up()
        self.p.add_validator(self._validate)
        for name in _GAIN_PARAMS:
            self.p.on_change(name, self._on_gain)
        self.p.on_change("law", self._on_law)
        self.p.on_change("adaptation", self._on_law)
        for name in ("kp_task", "k_posture"):
            self.p.on_change(name, self._on_task_gain)
        if self.task:
            self.counters.warn_on += ("reference_refused_cycles",)
            self.counters.set("reference_refused_cycles", 0)
        self.residuals = VectorBuffer(4096)
        self._waiting_for_residual = None  # stamp of the state waiting for its residual
        # regressor_source: topics -- per-stamp buffers, the regressor node's settings
        self.counters.set("regressor_source", p["regressor_source"])
        self.regressors = RegressorInputs(self) if p["regressor_source"] == "topics" else None
        if self.session.resume():
            self.get_logger().info(f"estimate loaded from {p['estimate_file']} ({self.core.coordinates} parameters)")
            self._check_estimate(p["estimate_file"])

    def _check_estimate(self, src: str) -> None:
        """WARN when an estimate loaded from a file asks more torque than a joint's effort
        limit to hold the arm against gravity somewhere in the joint ranges: a file of
        another robot or payload, or an estimate that diverged -- the command would
        saturate (the watchdog's business) from the first cycle."""
        bad, why = estimate_over_limits(self.model, self.core.pi)
        if bad:
            self.counters.set("estimate_over_limit_joints", bad)
            self.get_logger().warning(f"the estimate loaded from {src} {why}")

    def _setup_topics(self) -> None:
        self.pub_ptorque = self.create_publisher(JointState, "adaptive/parametric_torque", PUBLISHER_STREAM_QOS)
        self.pub_update = self.create_publisher(JointState, "adaptive/parameter_update", PUBLISHER_STREAM_QOS)
        self.pub_params = self.create_publisher(JointState, "adaptive/parameters", LATCHED_QOS)
        # deep: the residual node publishes one message per reference point up to its lead
        # ahead, in bursts after any stall, and none of them may be lost (residual_wait)
        self.io.node.create_subscription(JointState, "feedforward/residual", self._on_residual,
                                         DEEP_RELIABLE_QOS)
        self.create_service(Trigger, "~/save_estimate", self._srv_save)
        self.create_service(Trigger, "~/reset_estimate", self._srv_reset)
        if self.regressors is not None:
            self.regressors.subscribe()

    def _describe(self) -> str:
        c = self.core
        where = (f" ({c.law} adaptation) of {self.model.ee_frame} in {self.world_frame} on {TASK_REFERENCE_TOPIC}"
                 if self.task else "")
        links = f" of {', '.join(c.adapted_links)}" if c.adapted_links else ""
        return (f"law={self.p['law']}{where}, {c.n_adapted} {c.coordinates} parameters{links}"
                f"{' + friction' if c.friction else ''}{', projection' if c.projection else ''}"
                f", regressors {self.p['regressor_source']}")

    # ------------------------------------------------------------- parameters
    def _kd(self, value) -> np.ndarray:
        """``kd`` as given, or the model-derived K_D for the ``[0]`` of "derive it"."""
        kd = np.asarray(value, dtype=float)
        if kd.size == 1 and kd[0] == 0.0:
            if getattr(self, "_kd_model", None) is None:
                self._kd_model = derived_kd(self.model, self.p["rate_hz"], self.p["armature"])
                self.get_logger().info(f"kd: derived from the model (adaptive_dynamics.control.gains):"
                                       f" {self._kd_model.tolist()} N m s/rad")
            return self._kd_model
        return kd

    def _gain_kwargs(self, p) -> dict:
        g = {k: np.asarray(p[k], dtype=float) for k in ("lam", "gamma", "p0", "r")}
        g["kd"] = self._kd(p["kd"])
        self.counters.set("kd_source", "model-derived" if g["kd"] is getattr(self, "_kd_model", None) else "parameter")
        g.update({k: float(p[k]) for k in ("filter_lambda", "lambda0", "k0", "k1")})
        g["max_tracking_error"] = float(p["max_tracking_error"]) or np.inf
        return g

    def _validate(self, cand) -> str | None:
        n, b = self.n, self.core.n_adapted
        if (cand["law"] == "backstepping") != self.task:
            return (f"law {cand['law']!r}: the backstepping law (task space, on {TASK_REFERENCE_TOPIC}) and the"
                    f" joint-space laws (on reference) take different reference streams; it is chosen at start"
                    f" (this node runs {self.p['law']!r}){'; switch its adaptation instead' if self.task else ''}")
        if len(cand["kp_task"]) not in (1, 6):
            return f"kp_task needs 1 or 6 values (x y z, then orientation), got {len(cand['kp_task'])}"
        try:
            for name, dim in (("lam", n), ("kd", n), ("gamma", b), ("p0", b), ("r", n)):
                spd_gain(self._kd(cand[name]) if name == "kd" else np.asarray(cand[name], dtype=float), dim, name)
        except ValueError as exc:
            return str(exc)
        return None

    def _on_gain(self, name, _value) -> None:
        g = self._gain_kwargs(self.p)
        with self._lock:
            self.laws.set_gains(**{name: g[name]})
        if name in ("lam", "filter_lambda") and self.regressors is not None:
            self.regressors.invalidate()

    def _on_law(self, _name, value) -> None:
        with self._lock:
            if value in ("direct", "composite") and (self.task == (_name == "adaptation")):
                self.core.law = value

    def _on_task_gain(self, name, value) -> None:
        if not self.task:
            return
        with self._lock:
            if name == "kp_task":
                self.bs.ref.set_gains(kp=np.asarray(value, dtype=float))
            else:
                self.bs.ref.k_posture = float(value)

    # ------------------------------------------------------------------ cycle
    def _on_residual(self, msg: JointState) -> None:
        try:
            stamp, tau = vector_from_msg(msg, self.model.joint_names, "effort", where="feedforward/residual")
            if not np.all(np.isfinite(tau)):
                raise ValueError("non-finite residual")
        except ValueError as exc:
            self.counters.inc("residual_rejected")
            if self.log_throttle("residual"):
                self.get_logger().error(f"feedforward/residual rejected: {exc}")
            return
        with self._cb_lock:
            self.residuals.add(stamp, tau)
            if self._pending is not None and self._pending[0] == stamp:
                self._try_pending()

    def _residual(self, stamp: int):
        """The residual stamped for ``stamp``, else the newest older one within
        ``residual_staleness``, else None."""
        return self.residuals.get(stamp, self.p["residual_staleness"] * 1e9)

    def _residual_wait(self, stamp: int, allow_stale: bool) -> bool:
        """Whether the pending state still waits for its residual (``residual_wait``)."""
        wait = self.p["residual_wait"]
        if wait <= 0 or allow_stale or not self.p["feedforward"] or not self.residuals or stamp in self.residuals:
            return False
        if self.residuals.newest > stamp:   # residuals come in stamp order: this one was lost
            return False
        if time.monotonic() - self._pending_since > wait:
            self.counters.inc("residual_wait_expired")
            return False
        return True

    def _extra_wait(self, stamp: int, effort, allow_stale: bool) -> str | None:
        """The regressors from the topics, then the residual stamped for the state."""
        if self.regressors is not None and (why := self.regressors.waiting_for(stamp, effort)) is not None:
            return why   # the regressor callback (or the watchdog) comes back to it
        if self._residual_wait(stamp, allow_stale):
            if self._waiting_for_residual != stamp:
                self._waiting_for_residual = stamp
                self.counters.inc("residual_waited")
            return "residual"   # the residual callback (or the watchdog) comes back to it
        return None

    def _superseded(self, pend) -> bool:
        return self.regressors is not None and self.regressors.superseded(pend)

    def _expire_waits(self) -> None:
        pend = self._pending
        if pend is not None and self._waiting_for_residual == pend[0] \
                and time.monotonic() - self._pending_since > self.p["residual_wait"]:
            self._try_pending()   # the wait expired: answer with what there is
        if self.regressors is not None:
            self.regressors.expire()

    def _control(self, stamp, q, v, effort, ref, qd, qdd):
        t0 = time.perf_counter()
        law = self.p["law"]
        ext = None
        if self.regressors is not None and law != "sliding_pd":
            ext = self.regressors.take(stamp, law, effort)
            if ext is None:
                return None
        ff = self.p["feedforward"]
        until = self.p["learning_until"]
        learning = self.p["learning"] and not (until > 0 and stamp >= until * 1e9)
        tau = self.session.cycle(law, q, v, ref, qd, qdd, effort, learning=learning, regressors=ext,
                                 residual=self._residual(stamp) if ff else None,
                                 residuals_seen=ff and bool(self.residuals))
        if tau is not None:
            if law in ADAPTIVE_LAWS:
                self._publish_learning(stamp, self.laws.law_core(law))
            self.session.cycle_time(time.perf_counter() - t0)
        return tau

    def _after_command(self, stamp: int, q, v, ref, qd, tau) -> None:
        if not self.task:
            return super()._after_command(stamp, q, v, ref, qd, tau)
        if self.p["publish_tracking_error"]:   # task space: e (27) and its rate
            r = self.bs.ref
            self.pub_err.publish(joint_state_msg(stamp, list(TASK_ERROR_NAMES), r.e, r.e_dot))

    def _publish_learning(self, stamp: int, core) -> None:
        names = self.model.joint_names
        if self.pub_ptorque.get_subscription_count():  # a pure stream: skip the ~40 us when nobody listens
            self.pub_ptorque.publish(joint_state_msg(stamp, names, effort=core.model_torque if core.state_torque
                                                     else core.parametric_torque))
        dpi = self.session.update_due(self.p["update_decimation"])
        if dpi is not None:
            self.pub_update.publish(joint_state_msg(stamp, core.full_parameter_names, q=dpi))
        if self.session.cycles % self.p["parameters_decimation"] == 0:
            self.pub_params.publish(joint_state_msg(stamp, core.parameter_names, q=core.theta))

    # ------------------------------------------------------------ services etc.
    def save_estimate(self) -> str | None:
        return self.session.save()

    def _srv_save(self, req, res):
        return trigger_save(res, self.session.save, what="estimate", unset="estimate_file is not set")

    def _srv_reset(self, req, res):
        with self._cb_lock:
            self.session.reset_estimate()
        res.success, res.message = True, "estimate reset to the initial estimate"
        return res

    def _on_trip(self) -> None:
        """The estimate stays as it is (the safe command adapts nothing); the next
        housekeeping writes it to ``estimate_file`` at once."""
        self.session.tripped()

    def _on_release(self) -> None:
        """The composite law's filters restart: the states they hold are from before the trip."""
        self.session.released()

    def _diagnostics(self) -> None:
        if self.regressors is not None:
            with self._cb_lock:
                err = self.regressors.refusal()
            self.counters.set("regressor_config", err or "ok")
        self.counters.update(self.session.diagnostics())

    def _periodic(self) -> None:
        # outside the callback lock: writing the file must not delay a control cycle
        if self.session.autosave_due(self.p["autosave_period"]):
            try:
                self.session.save()
            except OSError as exc:
                if self.log_throttle("save"):
                    self.get_logger().error(f"autosave failed: {exc}")

    def _shutdown(self) -> None:
        logged_save(self, self.session.save, "estimate")


def main(args=None) -> int:
    return run_node(AdaptiveControllerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

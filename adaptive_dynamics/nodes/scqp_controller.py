"""``scqp_controller`` node: self-correcting QP control of the end effector; its episodes, rate
and state file are :class:`adaptive_dynamics.control.scqp_episodes.SCQPSession`.

Manual (topics, modes, services, persistence, diagnostics): ``docs/nodes.md#scqp_controller``;
parameters: ``ros2 param describe /scqp_controller <name>``.
"""

from __future__ import annotations

import numpy as np
from std_srvs.srv import Trigger
from trajectory_msgs.msg import MultiDOFJointTrajectory

from ..control.baseline import saturate
from ..control.mrac import REFERENCES, TaskSpaceMRAC
from ..control.scqp import MODES, TARGET_ACCELERATIONS, SCQPController
from ..control.scqp_episodes import SCQPSession
from ..ros.joint_states import joint_state_msg
from ..ros.node_base import run_node
from ..ros.params import ParamSpec
from ..ros.task_references import TASK_REFERENCE_TOPIC, TaskReferenceBuffer, base_frame_name
from .housekeeping import core_logger, logged_save, trigger_save
from .controller_shell import JointControllerShell, shell_specs

WEIGHTS = ("w_position", "w_orientation", "w_posture", "w_qdd", "w_tau")
QP_GAINS = ("kp_orientation", "kd_orientation", "kp_posture", "kd_posture")
RATES = ("rate_zeta", "rate_r", "rate_phi")
BOUNDS = ("bound_zeta", "bound_r", "bound_phi")


def _rate_ok(value) -> str | None:
    v = [float(x) for x in value]
    if v == [0.0]:
        return None
    if len(v) not in (1, 3) or any(x <= 0 for x in v):
        return "[0.0] (the default, scaled with kp_task) or 1 or 3 values > 0 (per task axis)"
    return None


def _bound_ok(value) -> str | None:
    if value == -1.0 or value >= 0:
        return None
    return "-1 (the default) or >= 0"


def _inertia_bounds_ok(value) -> str | None:
    v = list(value)
    if not v or (len(v) == 2 and 0 < v[0] <= 1 <= v[1]):
        return None
    return "[] (none) or [lo, hi] with 0 < lo <= 1 <= hi"


def specs() -> list[ParamSpec]:
    return shell_specs() + [
        ParamSpec("mode", "scqp", "scqp: MRAC + GP residual | gp_pid: task PID + GP residual | mrac: MRAC,"
                  " rigid-body model only", choices=list(MODES), read_only=True),
        ParamSpec("rate_hz", 200.0, "control rate [Hz]: states between control instants get the held torque;"
                  " at most the joint_states rate", min=1.0, max=10000.0, read_only=True),
        ParamSpec("w_position", 1.0, "QP weight of the end-effector linear acceleration task", min=0.0, max=1e6),
        ParamSpec("w_orientation", 0.1, "QP weight of the angular acceleration task", min=0.0, max=1e6),
        ParamSpec("w_posture", 1e-3, "QP weight of the null-space posture task", min=0.0, max=1e6),
        ParamSpec("w_qdd", 1e-6, "QP regularisation of qdd (> 0: keeps the QP strictly convex)", min=1e-12,
                  max=1e3),
        ParamSpec("w_tau", 1e-8, "QP regularisation of tau (> 0)", min=1e-15, max=1e3),
        ParamSpec("kp_orientation", 100.0, "orientation servo [1/s^2] (log3(R_d R^T))", min=0.0, max=1e5),
        ParamSpec("kd_orientation", 20.0, "angular velocity servo [1/s]", min=0.0, max=1e4),
        ParamSpec("kp_posture", 25.0, "null-space posture servo [1/s^2]", min=0.0, max=1e5),
        ParamSpec("kd_posture", 10.0, "null-space posture damping [1/s]", min=0.0, max=1e4),
        ParamSpec("q_posture", [0.0], "preferred posture [rad] in joint_names order; [0.0] = the first"
                  " measured configuration", type="float[]", read_only=True),
        ParamSpec("kp_task", 100.0, "task stiffness [1/s^2]: the MRAC reference model's Kp (scqp, mrac) or the"
                  " PID's (gp_pid)", min=1e-6, max=1e5),
        ParamSpec("kd_task", 20.0, "task damping [1/s]: the reference model's Kd or the PID's", min=1e-6,
                  max=1e4),
        ParamSpec("ki_task", 0.0, "gp_pid: integral gain [1/s^3] (unused by the MRAC modes)", min=0.0, max=1e6),
        ParamSpec("adapt", True, "MRAC: adapt the gains (false: the fixed law of the current gains)"),
        ParamSpec("rate_zeta", [0.0], "MRAC adaptation rate of Psi_zeta: 1 or 3 values > 0; [0.0] = default"
                  " (scaled with kp_task, adapt_stiffness)", type="float[]", validator=_rate_ok),
        ParamSpec("rate_r", [0.0], "MRAC adaptation rate of Psi_r (as rate_zeta)", type="float[]",
                  validator=_rate_ok),
        ParamSpec("rate_phi", [0.0], "MRAC adaptation rate of Psi_phi (as rate_zeta)", type="float[]",
                  validator=_rate_ok),
        ParamSpec("bound_zeta", -1.0, "MRAC: element-wise bound of Psi_zeta around its initial value; -1 ="
                  " default (Kp / Kd per column)", min=-1.0, max=1e9, validator=_bound_ok),
        ParamSpec("bound_r", -1.0, "MRAC: bound of Psi_r around I; -1 = default (1)", min=-1.0, max=1e9,
                  validator=_bound_ok),
        ParamSpec("bound_phi", -1.0, "MRAC: bound of the RBF weights; -1 = default", min=-1.0, max=1e9,
                  validator=_bound_ok),
        ParamSpec("adapt_stiffness", 0.5, "MRAC: scale of the default adaptation rates", min=1e-6, max=1e3,
                  read_only=True),
        ParamSpec("mrac_reference", "trajectory", "MRAC reference input: trajectory (r contains xdd_d: the"
                  " reference model follows a moving target) | paper (r = -B_r^+ A_r zeta_d)",
                  choices=list(REFERENCES), read_only=True),
        ParamSpec("mrac_basis", "position", "MRAC RBF basis over the position error (3 dims) | state: the whole"
                  " error e in R^2l (the paper's; rbf_per_dim^6 nodes)", choices=["position", "state"],
                  read_only=True),
        ParamSpec("rbf_per_dim", 3, "MRAC RBF nodes per task axis", min=1, max=9, read_only=True),
        ParamSpec("rbf_span", 0.05, "MRAC RBF centre half-range [m]", min=0.0, max=10.0, read_only=True),
        ParamSpec("gp_subsample", 5, "keep every k-th control cycle as a GP sample", min=1, max=100000,
                  read_only=True),
        ParamSpec("gp_max_points", 2000, "GP training-set cap (oldest dropped); a refit costs O(n^3)",
                  min=1, max=20000, read_only=True),
        ParamSpec("gp_length_scale", [0.0], "GP length scale(s), standardised inputs: 1 or 3n values; [0.0] ="
                  " sqrt(3n)", type="float[]", read_only=True),
        ParamSpec("gp_signal_var", 1.0, "GP signal variance (standardised)", min=1e-9, max=1e6, read_only=True),
        ParamSpec("gp_noise_var", 0.01, "GP noise variance (standardised)", min=1e-9, max=1e6, read_only=True),
        ParamSpec("gp_optimize", False, "fit the GP hyperparameters (type-II ML) at every refit", read_only=True),
        ParamSpec("gp_prior_mean", "data", "what the GP residual returns to away from its data: data (the mean"
                  " residual) | zero (the paper: the rigid-body model)", choices=["data", "zero"], read_only=True),
        ParamSpec("gp_target_acceleration", "measured", "GP samples: measured (input and target at the"
                  " acceleration the torque produced) | commanded (the paper: target at the QP's planned"
                  " acceleration, which makes it the GP's own previous output)",
                  choices=list(TARGET_ACCELERATIONS), read_only=True),
        ParamSpec("residual_inertia_bounds", [0.8, 1.25], "[lo, hi]: the GP's dtau/dqdd E conditioned so that"
                  " lo M <= M + E <= hi M; [] = E as learned (the paper's eq. 12)", type="float[]",
                  read_only=True, validator=_inertia_bounds_ok),
        ParamSpec("torque_limit_scale", 1.0, "fraction of the URDF effort limits the QP may use", min=1e-3,
                  max=1.0, read_only=True),
        ParamSpec("kd_fallback", 5.0, "damping [Nm s/rad] of the torque a failed QP solve falls back to",
                  min=0.0, max=1e3, read_only=True),
        ParamSpec("auto_start_episode", True, "start episode 1 with the first state (else: ~/start_episode)",
                  read_only=True),
        ParamSpec("state_file", "", "GP data and MRAC gains: loaded at start, saved after each episode's refit,"
                  " on ~/save_state and on shutdown (.npz); empty = not kept", read_only=True),
        ParamSpec("robot_compensates_gravity", False, "the robot adds g(q) itself (franka_ros2): the model's"
                  " gravity is left out of the command", read_only=True),
    ]


class SCQPControllerNode(JointControllerShell):
    REFERENCE_TOPIC = TASK_REFERENCE_TOPIC
    REFERENCE_TYPE = MultiDOFJointTrajectory

    def __init__(self, **kwargs):
        super().__init__("scqp_controller", specs(), **kwargs)

    # ------------------------------------------------------------------ setup
    def _make_references(self):
        self.world_frame = base_frame_name(self.model)
        return TaskReferenceBuffer(self.world_frame, self.model.ee_frame, capacity=4096,
                                   max_staleness_ns=int(self.p["reference_staleness"] * 1e9))

    def _qp_kwargs(self) -> dict:
        p = self.p
        kw = {k: p[k] for k in WEIGHTS + QP_GAINS}
        kw.update(torque_limit_scale=p["torque_limit_scale"], kd_fallback=p["kd_fallback"],
                  residual_inertia_bounds=tuple(p["residual_inertia_bounds"]) or None)
        q_post = np.asarray(p["q_posture"], dtype=float)
        if q_post.size == self.n:
            kw["q_posture"] = q_post[self.cmd_index]          # joint_names order -> model order
        elif q_post.tolist() != [0.0]:
            raise ValueError(f"q_posture needs {self.n} values in joint_names order (or [0.0]), got {q_post.size}")
        return kw

    def _mrac_kwargs(self) -> dict:
        p = self.p
        kw = dict(kp=p["kp_task"], kd=p["kd_task"], adapt=p["adapt"], reference=p["mrac_reference"],
                  adapt_stiffness=p["adapt_stiffness"], rbf_per_dim=p["rbf_per_dim"], rbf_span=p["rbf_span"],
                  rbf_velocity=p["mrac_basis"] == "state")
        for name in RATES:
            kw[name] = None if list(p[name]) == [0.0] else list(p[name])
        for name in BOUNDS:
            kw[name] = None if p[name] == -1.0 else p[name]
        return kw

    def _gp_kwargs(self) -> dict:
        p = self.p
        ls = list(p["gp_length_scale"])
        return dict(subsample=p["gp_subsample"], max_points=p["gp_max_points"],
                    length_scale=None if ls == [0.0] else (ls[0] if len(ls) == 1 else ls),
                    signal_var=p["gp_signal_var"], noise_var=p["gp_noise_var"], optimize=p["gp_optimize"],
                    prior_mean=p["gp_prior_mean"])

    def _setup_law(self) -> None:
        p = self.p
        ctrl = SCQPController(self.model, dt=1.0 / p["rate_hz"], mode=p["mode"], kp_task=p["kp_task"],
                              kd_task=p["kd_task"], ki_task=p["ki_task"], qp=self._qp_kwargs(),
                              mrac=self._mrac_kwargs(), residual=self._gp_kwargs(),
                              target_acceleration=p["gp_target_acceleration"])
        header = {"robot": p["robot"], "joints": list(self.model.joint_names), "frame": self.model.ee_frame,
                  "world_frame": self.world_frame}
        self.session = SCQPSession(ctrl, rate_hz=p["rate_hz"], lock=self._lock, header=header,
                                   state_file=p["state_file"], auto_start=p["auto_start_episode"],
                                   posture_from_state=np.asarray(p["q_posture"]).size != self.n,
                                   compensates_gravity=p["robot_compensates_gravity"],
                                   log=core_logger(self, self.log_throttle), count=self.counters.inc)
        self.ctrl = ctrl
        # the watchdog's saturation: at the QP's torque bounds (read-only settings)
        self._qp_bound = self.limit * p["torque_limit_scale"] * (1.0 - 1e-6)
        warn = ("qp_fallbacks", "overruns", "reference_refused_cycles", "rejected_inputs", "refit_failures")
        self.counters.warn_on += warn
        self.counters.update({**{k: 0 for k in warn}, "mode": p["mode"],
                              "state_file": self.session.load_or_set_aside(residual=self._gp_kwargs(),
                                                                           mrac=self._mrac_kwargs())})
        self.p.add_validator(self._validate)
        for name in WEIGHTS:
            self.p.on_change(name, self._on_weight)
        for name in QP_GAINS:
            self.p.on_change(name, self._on_qp_gain)
        for name in ("kp_task", "kd_task", "ki_task"):
            self.p.on_change(name, self._on_task_gain)
        self.p.on_change("adapt", self._on_adapt)
        for name in RATES + BOUNDS:
            self.p.on_change(name, self._on_adaptation)

    def _setup_topics(self) -> None:
        self.create_service(Trigger, "~/start_episode", self._srv_start)
        self.create_service(Trigger, "~/end_episode", self._srv_end)
        self.create_service(Trigger, "~/save_state", self._srv_save)

    def _describe(self) -> str:
        return (f"mode={self.p['mode']} at {self.p['rate_hz']:g} Hz, {self.model.ee_frame} in {self.world_frame}"
                f" on {TASK_REFERENCE_TOPIC}, episode {self.session.episode}, GP {self.ctrl.residual.n_points}"
                " points")

    # ------------------------------------------------------------- parameters
    def _validate(self, cand) -> str | None:
        try:
            TaskSpaceMRAC(kp=cand["kp_task"], kd=cand["kd_task"], adapt_stiffness=self.p["adapt_stiffness"],
                          rbf_per_dim=self.p["rbf_per_dim"], rbf_span=self.p["rbf_span"])
        except ValueError as exc:
            return f"kp_task / kd_task: {exc}"
        return None

    def _on_weight(self, name, value) -> None:
        with self._lock:
            self.ctrl.qp.set_weights(**{name: value})

    def _on_qp_gain(self, name, value) -> None:
        with self._lock:
            setattr(self.ctrl.qp, name, float(value))

    def _on_task_gain(self, name, value) -> None:
        with self._lock:
            setattr(self.ctrl, name, float(value))
            if name in ("kp_task", "kd_task"):
                # a new reference model; what was adapted is carried over onto its ideal gains
                old = self.ctrl.mrac
                new = TaskSpaceMRAC(**self._mrac_kwargs())
                new.transfer_gains(old.state_dict())
                self.ctrl.mrac = new

    def _on_adapt(self, _name, value) -> None:
        with self._lock:
            self.ctrl.mrac.adapt = bool(value)

    def _on_adaptation(self, name, value) -> None:
        if name in RATES:
            value = None if list(value) == [0.0] else list(value)
        else:
            value = None if value == -1.0 else value
        with self._lock:
            self.ctrl.mrac.set_adaptation(**{name: value})

    # ------------------------------------------------------------- the cycle
    def _try_pending(self, allow_stale: bool = False) -> bool:
        """Answer the pending state: while the watchdog is tripped at once with the safe
        command; between control instants at once with the held torque; at a control
        instant once its task reference is here (:class:`SCQPSession`)."""
        stamp, q, v, _effort = self._pending
        if self.loop_watch.tripped:   # the safe command until ~/reset_watchdog: nothing computed or learned
            self._pending = None
            self.counters.inc("watchdog_cycles")
            self.session.answered_safe(stamp)
            self._answer(stamp, self._safe_command(), watch=False)
            return True
        tol = int(self.p["reference_tolerance"] * 1e9)
        held, tau = self.session.held(stamp, tol)
        if held:
            self._pending = None
            self._answer(stamp, tau if tau is not None else self._safe_command())
            return True
        ref = self.refs.lookup(stamp, tol, max_staleness_ns=None if allow_stale else -1)
        if ref is None:
            if not self._answer_refused(stamp):
                return False   # wait for it (the watchdog gives up after reference_wait)
            self.session.answered_safe(stamp)
            return True
        self._pending = None
        tau = self.session.control(stamp, q, v, ref)
        self._answer(stamp, tau if tau is not None else self._safe_command())
        if self.p["publish_tracking_error"]:
            x = self.model.frame_pose(q)[:3, 3]
            xd = self.model.jacobian(q)[:3] @ v
            vd = ref.twist[:3] if ref.twist is not None else np.zeros(3)
            self.pub_err.publish(joint_state_msg(stamp, ["x", "y", "z"], ref.position - x, vd - xd))
        return True

    def _answer(self, stamp: int, tau: np.ndarray, watch: bool = True) -> None:
        """Publish ``tau`` for ``stamp``; the loop watchdog sees every torque applied (task
        space: saturation only, at the QP's torque bounds)."""
        if watch and self.p["watchdog"]:
            if self.loop_watch.update(stamp * 1e-9, None, np.sign(tau) * (np.abs(tau) >= self._qp_bound)):
                self._trip()
                tau = self._safe_command()
                self.session.answered_safe(stamp)
        saturate(tau, self.limit, self.sat)
        self._publish(tau, stamp)

    def _on_trip(self) -> None:
        self.session.tripped()

    def _on_release(self) -> None:
        self.session.released()

    def _periodic(self) -> None:
        # outside the callback lock: a watchdog trip's save must not delay a control cycle
        if self.session.save_requested:
            self.session.save_requested = False
            logged_save(self, self.session.save, "state")

    # ------------------------------------------------------------- services
    def _srv_start(self, req, res):
        res.success, res.message = self.session.request_start()
        return res

    def _srv_end(self, req, res):
        res.success, res.message = self.session.end_episode()
        return res

    def _srv_save(self, req, res):
        return trigger_save(res, self.session.save, what="GP data and MRAC gains", unset="state_file is not set")

    # ------------------------------------------------------------- diagnostics, shutdown
    def _diagnostics(self) -> None:
        self.counters.update(self.session.diagnostics())

    def _shutdown(self) -> None:
        self.session.wait_refit(timeout=60.0)
        logged_save(self, self.session.save, "state")


def main(args=None) -> int:
    return run_node(SCQPControllerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

"""``scqp_controller`` node: self-correcting QP control (SCQP; Khadivar, Chatzilygeroudis &
Billard) of the end effector -> ``effort_controller/commands``.

Thin adapter over :class:`adaptive_dynamics.control.scqp.SCQPController` (task-space MRAC
or PID -> QP inverse dynamics with the GP residual, linearised) on the shell shared with
the joint controllers (:class:`~adaptive_dynamics.nodes.controller_shell.JointControllerShell`:
joints by name, stamp-matched references, safe command, saturation counted, watchdog,
zero command on shutdown, commands stamped with the state they answer so the lockstep
bridge steps on them).

Reference: ``task_reference`` (``trajectory_msgs/MultiDOFJointTrajectory``, the contract
of :mod:`adaptive_dynamics.ros.task_references`: frame ``header.frame_id`` = the model's
base frame, ``joint_names`` = ``ee_frame``); a control instant uses the reference stamped
for its state (waiting up to ``reference_wait``, as the joint controllers do).  A refused
reference (another frame, NaN, points out of order, stale) is logged with the reason and
the instants it covered are answered with the safe command at once.

Rate: the law runs at ``rate_hz`` (default 200 Hz).  A state stamped at least one period
(less ``reference_tolerance``) after the last control instant is a control instant;
every other state is answered at once with that instant's torque (zero-order hold: what
the core's residual model assumes), so a 1 kHz bridge still gets one command per state.
``rate_hz`` must not exceed the ``joint_states`` rate; a gap of more than 1.5 periods
between control instants (states missing) is counted (``overruns``) and keeps no GP
sample across it.

Episodes (Algorithm 1): ``~/start_episode`` (std_srvs/Trigger) starts one at the next
control instant (MRAC reference model reset to the arm's state, GP samples collected:
every ``gp_subsample``-th); ``~/end_episode`` stops collecting and refits the GP on a
worker thread -- the control cycle never waits for it -- swapping the new GP in as one
reference when done, then saves ``state_file``.  With ``auto_start_episode`` the first
episode starts with the first state.  Between episodes the arm stays under control with
the current model.  ``~/save_state`` writes ``state_file`` now.

Persistence (``state_file``, ``.npz``, written atomically and durably): the GP (data,
scalers, hyperparameters: the saved GP keeps its own; ``gp_max_points`` applies to the
next refit), the samples not yet in it, the
MRAC gains and the episode count; saved after every refit, on ``~/save_state`` and on
shutdown (after a running refit finishes), loaded at start.  A file that cannot be
loaded (corrupt, another robot or frame, another RBF grid) is renamed to
``<state_file>.corrupt-<time>`` -- nothing learned is deleted -- logged with the reason,
and the node starts fresh.  MRAC gains saved with other ``kp_task``/``kd_task`` carry
over what was adapted (:meth:`TaskSpaceMRAC.transfer_gains`).

Parameters: ``ros2 param describe /scqp_controller <name>``; live: the task weights,
``kp_task``/``kd_task``/``ki_task`` (a new MRAC reference model keeps what was adapted),
orientation and posture gains, MRAC ``adapt``, rates and bounds, and the shell's.

Diagnostics (``/diagnostics``): ``qp_status`` (of the last cycle), ``solve_p50_us`` /
``solve_max_us`` (since the last report), ``qp_solves``, ``qp_fallbacks``, MRAC gain
norms (``psi_zeta_norm``, ``psi_r_norm``, ``psi_phi_norm``) and ``mrac_clipped``,
``gp_points``, ``gp_pending``, ``refit_running``, ``last_refit_s``, ``episode``,
``in_episode``, ``task_error_rms_mm`` / ``task_error_max_mm`` (since the last report),
``computed_cycles``, ``held_cycles``, ``overruns``, ``reference_refused_cycles``.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
from std_srvs.srv import Trigger
from trajectory_msgs.msg import MultiDOFJointTrajectory

from ..control.baseline import saturate
from ..control.mrac import REFERENCES, TaskSpaceMRAC
from ..control.scqp import MODES, SCQPController
from ..files import atomic_write
from ..ros.joint_states import joint_state_msg
from ..ros.node_base import run_node
from ..ros.params import ParamSpec
from ..ros.task_references import TASK_REFERENCE_TOPIC, TaskReferenceBuffer, base_frame_name
from .housekeeping import shutdown_save, trigger_save
from .controller_shell import JointControllerShell, shell_specs

STATE_FORMAT = "adaptive_dynamics.scqp_state"
STATE_VERSION = 1
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
        kw.update(torque_limit_scale=p["torque_limit_scale"], kd_fallback=p["kd_fallback"])
        q_post = np.asarray(p["q_posture"], dtype=float)
        if q_post.size == self.n:
            kw["q_posture"] = q_post[self.cmd_index]          # joint_names order -> model order
        elif q_post.tolist() != [0.0]:
            raise ValueError(f"q_posture needs {self.n} values in joint_names order (or [0.0]), got {q_post.size}")
        return kw

    def _mrac_kwargs(self) -> dict:
        p = self.p
        kw = dict(kp=p["kp_task"], kd=p["kd_task"], adapt=p["adapt"], reference=p["mrac_reference"],
                  adapt_stiffness=p["adapt_stiffness"], rbf_per_dim=p["rbf_per_dim"], rbf_span=p["rbf_span"])
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
                    signal_var=p["gp_signal_var"], noise_var=p["gp_noise_var"], optimize=p["gp_optimize"])

    def _setup_law(self) -> None:
        p = self.p
        self.period_ns = int(round(1e9 / p["rate_hz"]))
        self.ctrl = SCQPController(self.model, dt=1.0 / p["rate_hz"], mode=p["mode"], kp_task=p["kp_task"],
                                   kd_task=p["kd_task"], ki_task=p["ki_task"], qp=self._qp_kwargs(),
                                   mrac=self._mrac_kwargs(), residual=self._gp_kwargs())
        self.ctrl.collect = False
        self._posture_from_state = np.asarray(p["q_posture"]).size != self.n
        self.episode = 0
        self.in_episode = False
        self._start_request = bool(p["auto_start_episode"])
        self._last_compute = None          # stamp of the last control instant
        self._held = None                  # its torque (None: the safe command)
        self._refit_thread = None
        self._refit_job = None
        self._refits = 0
        self._last_refit_s = 0.0
        self._save_lock = threading.Lock()
        self._solve_us: list = []
        self._cycle_us: list = []
        self._err: list = []
        self._n_computed = self._n_held = 0
        self.counters.warn_on += ("qp_fallbacks", "overruns", "reference_refused_cycles", "rejected_inputs")
        for k in ("qp_fallbacks", "overruns", "reference_refused_cycles", "rejected_inputs"):
            self.counters.set(k, 0)
        self.counters.set("mode", p["mode"])
        self.counters.set("state_file", "not set" if not p["state_file"] else "new")
        if p["state_file"]:
            self._load_or_set_aside(p["state_file"])
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
                f" on {TASK_REFERENCE_TOPIC}, episode {self.episode}, GP {self.ctrl.residual.n_points} points")

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
        """Answer the pending state: between control instants at once with the held
        torque; at a control instant once its task reference is here (see the module)."""
        stamp, q, v, effort = self._pending
        tol = int(self.p["reference_tolerance"] * 1e9)
        if self._last_compute is not None and stamp - self._last_compute < self.period_ns - tol:
            self._pending = None
            self._n_held += 1
            self._answer(stamp, self._held.copy() if self._held is not None else self._safe_command())
            return True
        ref = self.refs.lookup(stamp, tol, max_staleness_ns=None if allow_stale else -1)
        if ref is None:
            if not self._answer_refused(stamp):
                return False   # wait for it (the watchdog gives up after reference_wait)
            self._after_safe(stamp)
            return True
        self._pending = None
        tau = self._control(stamp, q, v, effort, ref, None, None)
        if tau is not None and not np.all(np.isfinite(tau)):
            self.counters.inc("nonfinite_torque")
            if self.log_throttle("nan"):
                self.get_logger().error("the controller produced a non-finite torque; safe command")
            tau = None
        if tau is None:
            self._after_safe(stamp)
            tau = self._safe_command()
        else:
            self._held = tau.copy()
            self._last_compute = stamp
        self._answer(stamp, tau)
        self._after_command(stamp, q, v, ref, None, tau)
        return True

    def _after_safe(self, stamp: int) -> None:
        """A control instant answered with the safe command: held until the next one, and
        the core keeps no sample of this period."""
        self._held = None
        self._last_compute = stamp
        with self._lock:
            self.ctrl.discard_last()

    def _answer(self, stamp: int, tau: np.ndarray) -> None:
        saturate(tau, self.limit, self.sat)
        self._publish(tau, stamp)

    def _control(self, stamp, q, v, effort, ref, qd, qdd):
        t0 = time.perf_counter()
        ctrl = self.ctrl
        with self._lock:
            if self._posture_from_state:
                ctrl.qp.q_posture = q.copy()
                self._posture_from_state = False
            if self._start_request:
                ctrl.start_episode(q, v)
                self._start_request = False
                self.episode += 1
                self.in_episode = True
                ctrl.collect = ctrl.uses_gp
                self.get_logger().info(f"episode {self.episode} started at t={stamp * 1e-9:.4f} s")
            if self._last_compute is not None and stamp - self._last_compute > 1.5 * self.period_ns:
                ctrl.discard_last()
                self.counters.inc("overruns")
            tw = ref.twist if ref.twist is not None else np.zeros(6)
            acc = ref.accel if ref.accel is not None else np.zeros(6)
            try:
                tau = ctrl.compute(q, v, ref.position, tw[:3], acc[:3], R_d=ref.rotation, w_d=tw[3:], wdot_d=acc[3:])
            except ValueError as exc:   # non-finite reference model / gains: nothing changed
                self.counters.inc("rejected_inputs")
                if self.log_throttle("core"):
                    self.get_logger().error(f"cycle rejected ({exc}); safe command")
                return None
            res = ctrl.last
        self._solve_us.append(res.solve_time_s * 1e6)
        if not res.ok and self.log_throttle("qp"):
            self.get_logger().warning(f"QP {res.status} (fallback torque; {ctrl.qp.fallbacks} so far)")
        self._n_computed += 1
        self._err.append(float(np.linalg.norm(ref.position - self.model.frame_pose(q)[:3, 3])))
        if self.p["robot_compensates_gravity"]:
            tau = tau - self.model.gravity(q)
        self._cycle_us.append((time.perf_counter() - t0) * 1e6)
        return tau

    def _after_command(self, stamp, q, v, ref, qd, tau) -> None:
        if self.p["publish_tracking_error"]:
            x = self.model.frame_pose(q)[:3, 3]
            xd = self.model.jacobian(q)[:3] @ v
            vd = ref.twist[:3] if ref.twist is not None else np.zeros(3)
            self.pub_err.publish(joint_state_msg(stamp, ["x", "y", "z"], ref.position - x, vd - xd))

    # ------------------------------------------------------------- episodes
    def _srv_start(self, req, res):
        with self._lock:
            if self.in_episode or self._start_request:
                res.success = False
                res.message = f"episode {self.episode + int(self._start_request)} is running: end it first"
                return res
            self._start_request = True
            refit = self._refit_thread is not None and self._refit_thread.is_alive()
        res.success = True
        res.message = (f"episode {self.episode + 1} starts at the next control instant"
                       + (" (the GP refit of the last episode is still running; its GP is swapped in when done)"
                          if refit else ""))
        return res

    def _srv_end(self, req, res):
        with self._lock:
            if not self.in_episode:
                res.success, res.message = False, "no episode is running"
                return res
            if self._refit_thread is not None and self._refit_thread.is_alive():
                res.success, res.message = False, "the refit of the previous episode is still running"
                return res
            self.in_episode = False
            self.ctrl.collect = False
            ep = self.episode
            job = self.ctrl.residual.begin_refit() if self.ctrl.uses_gp else None
            self._refit_job = job
            new = 0 if job is None else job.new_X.shape[0]
            total = 0 if job is None else min(job.X.shape[0] + new, self.ctrl.residual.gp.max_points)
            self._refit_thread = threading.Thread(target=self._refit, args=(job, ep), name="scqp_refit",
                                                  daemon=True)
            self._refit_thread.start()
        res.success = True
        res.message = (f"episode {ep} ended: " + (f"{new} new samples; the GP is refitted on {total} points in the"
                                                  " background" if job is not None else "no GP in mode mrac")
                       + (", then saved" if self.p["state_file"] else ""))
        return res

    def _refit(self, job, episode: int) -> None:
        """Worker thread: the refit (nothing shared touched), the swap, the save."""
        if job is not None:
            t0 = time.perf_counter()
            try:
                gp = job.run()
            except Exception as exc:  # noqa: BLE001 -- a failed refit keeps the old GP and the samples
                with self._lock:
                    self.ctrl.residual.abort_refit(job)
                    self._refit_job = None
                self.counters.inc("refit_failures")
                self.get_logger().error(f"episode {episode}: GP refit failed ({type(exc).__name__}: {exc}); the"
                                        " previous GP stays, the samples are kept for the next refit")
                return
            dt = time.perf_counter() - t0
            with self._lock:
                self.ctrl.residual.finish_refit(gp)
                self._refit_job = None
                self._refits += 1
                self._last_refit_s = dt
            self.get_logger().info(f"episode {episode}: GP refitted on {gp.n_points} points in {dt:.2f} s,"
                                   " now in use")
        try:
            path = self.save_state()
            if path:
                self.get_logger().info(f"state saved to {path}")
        except OSError as exc:
            self.get_logger().error(f"saving the state failed: {exc}")

    # ------------------------------------------------------------- persistence
    def save_state(self) -> str | None:
        path = self.p["state_file"]
        if not path:
            return None
        with self._save_lock:
            with self._lock:   # references and small copies only: the cycle waits microseconds
                job = self._refit_job   # a refit in flight: its new samples are not in the GP yet
                snap = self.ctrl.snapshot(None if job is None else (job.new_X, job.new_Y))
                episode = self.episode
            arrays = {"format": np.array(STATE_FORMAT), "version": np.array(STATE_VERSION),
                      "robot": np.array(self.p["robot"]), "joints": np.array(list(self.model.joint_names)),
                      "frame": np.array(self.model.ee_frame), "world_frame": np.array(self.world_frame),
                      "episode": np.array(episode), **self.ctrl.state_dict(snap)}
            atomic_write(path, lambda fh: np.savez(fh, **arrays))
            return path

    def _load_or_set_aside(self, path: str) -> None:
        if not os.path.exists(path):
            self.get_logger().info(f"state_file {path} does not exist yet: starting fresh")
            return
        try:
            self._load_state(path)
        except Exception as exc:  # noqa: BLE001 -- any unreadable file: keep it, start fresh
            kept = f"{path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
            try:
                os.replace(path, kept)
            except OSError as exc2:
                kept = f"{path} (could not be renamed: {exc2})"
            self.counters.set("state_file", f"refused: {exc}")
            self.get_logger().error(f"state_file {path} refused ({type(exc).__name__}: {exc}); kept as {kept};"
                                    " starting with no learned state")

    def _load_state(self, path: str) -> None:
        with np.load(path, allow_pickle=False) as f:
            d = {k: f[k] for k in f.files}
        if str(d.get("format", "")) != STATE_FORMAT:
            raise ValueError(f"not an SCQP state file (format {str(d.get('format', 'missing'))!r})")
        if int(d["version"]) != STATE_VERSION:
            raise ValueError(f"state file version {int(d['version'])}, this node reads {STATE_VERSION}")
        joints, frame = [str(j) for j in d["joints"]], str(d["frame"])
        if joints != list(self.model.joint_names) or frame != self.model.ee_frame \
                or str(d["world_frame"]) != self.world_frame:
            raise ValueError(f"saved for joints {joints}, frame {frame!r} in {str(d['world_frame'])!r}; this"
                             f" node controls {list(self.model.joint_names)}, {self.model.ee_frame!r} in"
                             f" {self.world_frame!r}")
        # the GP (this node's cap on its points), its pending samples, the MRAC's gains (a new
        # episode starts from the arm's state)
        self.ctrl.load_state_dict(d, where=path, residual=self._gp_kwargs(), mrac=self._mrac_kwargs())
        residual, episode = self.ctrl.residual, int(d["episode"])
        self.episode = episode
        self.counters.set("state_file", f"loaded ({episode} episodes)")
        self.get_logger().info(f"state loaded from {path}: episode {episode}, GP {residual.n_points} points"
                               f" (+{residual.pending} pending samples), MRAC gains of mode {str(d['mode'])}")

    def _srv_save(self, req, res):
        return trigger_save(res, self.save_state, what="GP data and MRAC gains", unset="state_file is not set")

    # ------------------------------------------------------------- diagnostics, shutdown
    def _diagnostics(self) -> None:
        c, ctrl = self.counters, self.ctrl
        qp = ctrl.qp
        vals = {"qp_status": qp.last_status, "qp_solves": qp.solves, "qp_fallbacks": qp.fallbacks,
                "episode": self.episode, "in_episode": self.in_episode,
                "gp_points": ctrl.residual.n_points, "gp_pending": ctrl.residual.pending,
                "refit_running": self._refit_thread is not None and self._refit_thread.is_alive(),
                "refits": self._refits, "last_refit_s": round(self._last_refit_s, 3),
                "computed_cycles": self._n_computed, "held_cycles": self._n_held,
                "mrac_adapt": ctrl.mrac.adapt, "mrac_clipped": sum(ctrl.mrac.clip_counts.values())}
        for k, val in ctrl.mrac.gain_norms.items():
            vals[f"{k}_norm"] = round(val, 6)
        if self._solve_us:
            t = np.asarray(self._solve_us)
            vals["solve_p50_us"] = round(float(np.percentile(t, 50)), 1)
            vals["solve_max_us"] = round(float(t.max()), 1)
            self._solve_us.clear()
        if self._cycle_us:
            t = np.asarray(self._cycle_us)
            vals["cycle_p50_us"] = round(float(np.percentile(t, 50)), 1)
            vals["cycle_p99_us"] = round(float(np.percentile(t, 99)), 1)
            self._cycle_us.clear()
        if self._err:
            e = np.asarray(self._err)
            vals["task_error_rms_mm"] = round(float(np.sqrt(np.mean(e ** 2))) * 1e3, 4)
            vals["task_error_max_mm"] = round(float(e.max()) * 1e3, 4)
            self._err.clear()
        c.update(vals)

    def _shutdown(self) -> None:
        t = self._refit_thread
        if t is not None and t.is_alive():
            self.get_logger().info("waiting for the running GP refit before saving")
            t.join(timeout=60.0)
        shutdown_save(self, self.save_state, "state")


def main(args=None) -> int:
    return run_node(SCQPControllerNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

"""The shell every controller node shares (``controller``, ``adaptive_controller``,
``scqp_controller``): :class:`JointControllerShell` does everything but the law.

Event driven: every ``joint_states`` message (matched by joint name) is answered by
exactly one command, computed for the reference stamped with the state's time
(references arrive ahead of time; the node never uses "the latest").  In lockstep the
command carries the state stamp (see
:func:`adaptive_dynamics.ros.commands.stamped_command_msg`).

Safety: NaN/inf or mismatched joint states are rejected (logged, counted) and
answered with the safe command; a state not newer than the last one is ignored
(counted); no state for ``state_timeout`` s (wall clock) after the first one -> the
safe command is published by the watchdog; the safe command is also sent on shutdown
(ros2_control's effort controller holds the last command forever); torques are
clipped to the URDF effort limits (counted); a non-finite torque is never published;
the loop watchdog trips on a diverging or saturating loop.

A node subclasses it with its parameter specs (:func:`shell_specs` + its own) and
overrides ``_setup_law``, ``_control`` (the law's torque, or None for the safe
command) and, where it needs them, ``_setup_topics``, ``_describe``,
``_after_command``, ``_diagnostics``, ``_periodic``, ``_shutdown``, ``_on_trip`` /
``_on_release`` (the watchdog), and ``_extra_wait`` / ``_superseded`` /
``_expire_waits`` for a state that waits for inputs besides its reference.
"""
from __future__ import annotations

import re
import threading
import time

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rclpy.node import Node
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import Trigger
from trajectory_msgs.msg import JointTrajectory

from ..control.baseline import saturate
from ..control.gains import safe_damping
from ..control.watchdog import LoopWatchdog, default_error_bound
from ..dynamics.continuous import wrap_angle
from ..ros.commands import encode_stamped_command
from ..ros.joint_states import JointStateMapper, joint_state_msg, state_stamp
from ..ros.node_base import Counters, HotPath, diagnostic_array
from ..ros.params import ParamSpec, declare_params
from ..ros.qos import COMMAND_QOS, PUBLISHER_STREAM_QOS, REFERENCE_QOS, RELIABLE_STREAM_QOS, stream_qos
from ..ros.references import ReferenceBuffer
from .housekeeping import StallInjector, Throttle, apply_realtime_priority, discovery_hint, realtime_spec, stall_spec
from .robot_params import armature_of, load_robot, robot_specs


def shell_specs() -> list[ParamSpec]:
    """Parameters every joint controller node shares (matching, safety, diagnostics)."""
    return robot_specs() + [stall_spec()] + [
        ParamSpec("reliable_streams", True, "subscribe to joint_states reliably (lockstep);"
                  " false = best effort (real-time streams)", read_only=True),
        ParamSpec("reference_tolerance", 0.0005, "max |reference stamp - state stamp| [s] for an exact"
                  " reference match", min=0.0, max=1.0),
        ParamSpec("reference_staleness", 0.02, "hold the last reference at most this long [s] when none"
                  " is stamped for the state's instant", min=0.0, max=10.0),
        ParamSpec("reference_wait", 1.0, "wall time [s] to wait for a missing reference before"
                  " answering a state with the newest reference within reference_staleness (held), else"
                  " the safe command; 0 = never wait (real time: a late reference batch must not delay"
                  " the answer)", min=0.0, max=60.0),
        ParamSpec("state_timeout", 0.1, "watchdog: wall time [s] without joint_states before the"
                  " safe command is published", min=0.001, max=60.0),
        ParamSpec("safe_mode", "damping", "safe command: zero torque, or zero + joint damping",
                  choices=["zero", "damping"]),
        ParamSpec("safe_damping", 0.0, "joint damping of the safe command [Nm s/rad]; 0 = per joint from the arm"
                  " (control.gains.safe_damping: K_D dt / (M_jj + armature) <= 0.2 at 1 kHz, <= 20 % of the effort"
                  " limit per rad/s)", min=0.0, max=1e3),
        ParamSpec("publish_tracking_error", False, "publish controller/tracking_error (JointState:"
                  " position = q_d - q, velocity = qd_d - qd, effort = command) every cycle; false: only while"
                  " something subscribes (e.g. a learner with target_torque commanded)"),
        ParamSpec("diagnostics_period", 1.0, "diagnostics publishing period [s] (wall)", min=0.05, max=60.0),
        ParamSpec("hot_path_thread", True, "take joint_states and references on a lean companion node"
                  " (<name>_io) with its own executor thread (lower latency; see HotPath)", read_only=True),
        realtime_spec(),
        ParamSpec("watchdog", True, "loop watchdog (control.watchdog): |q_d - q| above watchdog_error or the"
                  " command chattering between its limits for watchdog_window, or saturated at one limit for"
                  " watchdog_saturation_window -> safe command, learning frozen (the"
                  " estimate kept), ERROR in /diagnostics, until ~/reset_watchdog"),
        ParamSpec("watchdog_error", [0.0], "watchdog position-error bound [rad], 1 or n values; [0.0] = 20 %"
                  " of each joint's range within [0.2, 1.0] rad", min=0.0, max=100.0, type="float[]",
                  read_only=True),
        ParamSpec("watchdog_window", 0.05, "how long [s of state stamps] a position error or a command"
                  " chattering between its limits must last to trip the watchdog", min=0.002, max=10.0,
                  read_only=True),
        ParamSpec("watchdog_saturation_window", 0.5, "how long [s of state stamps] a command saturated at one"
                  " limit must last to trip the watchdog", min=0.002, max=60.0, read_only=True),
        ParamSpec("wait_warn_after", 3.0, "no joint_states this long [s, wall] after start -> a WARN naming"
                  " the topic, the joints and ROS_DOMAIN_ID, repeated with doubling intervals", min=0.1,
                  max=3600.0, read_only=True),
    ]


class JointControllerShell(Node):
    """Everything a joint-space controller node does except its law: joint matching by
    name, stamp-matched references, the safe command, saturation, the watchdog,
    diagnostics, the zero command on shutdown and the lean hot path.

    Subclasses implement :meth:`_setup_law` (build the core, register parameter
    listeners/validators) and :meth:`_control` (one cycle: torque in model joint order
    or ``None`` for the safe command), and may extend :meth:`_after_command`,
    :meth:`_setup_topics`, :meth:`_diagnostics` and :meth:`_shutdown`.  A state that
    waits for another input besides its reference (a residual, regressors from topics)
    says so through :meth:`_extra_wait`, :meth:`_superseded` and :meth:`_expire_waits`.  A controller of
    another reference stream sets :attr:`REFERENCE_TOPIC` / :attr:`REFERENCE_TYPE` and
    :meth:`_make_references` (a buffer with ``add_any`` and ``lookup`` by stamp).
    """

    REFERENCE_TOPIC = "reference"
    REFERENCE_TYPE = JointTrajectory

    def __init__(self, node_name: str, param_specs, **kwargs):
        super().__init__(node_name, **kwargs)
        self.p = declare_params(self, param_specs)
        self.model, self.joint_names = load_robot(self.p, self, **self._model_kwargs())
        n = self.n = self.model.n
        self.cmd_index = self.model.joint_index(self.joint_names)  # model joint k -> command slot
        self._cmd_identity = bool(np.array_equal(self.cmd_index, np.arange(n)))
        self.limit = self.model.effort_limit.copy()
        self.mapper = JointStateMapper(self.model.joint_names)
        self.refs = self._make_references()
        self.counters = Counters(node_name, self.get_fully_qualified_name())
        self.sat = np.zeros(n, dtype=np.int64)
        self._lock = threading.Lock()  # the law's core (cycle vs parameter callbacks)
        self._pending = None  # (stamp, q, v, effort) waiting for its reference
        self._pending_since = 0.0
        self._last_state_wall = None
        self._last_stamp = None
        self._last_q = None
        self._last_v = np.zeros(n)
        self._zeros = np.zeros(n)
        self.log_throttle = Throttle(1.0)
        self.stall = StallInjector(self)
        werr = np.asarray(self.p["watchdog_error"], dtype=float)
        if werr.size not in (1, n):
            raise ValueError(f"watchdog_error: {werr.size} values for {n} joints (give 1 or {n})")
        self.loop_watch = LoopWatchdog(self.model.joint_names,
                                       default_error_bound(self.model.lower, self.model.upper)
                                       if werr.size == 1 and werr[0] == 0.0 else werr,
                                       window=self.p["watchdog_window"],
                                       saturation_window=self.p["watchdog_saturation_window"])
        self._continuous = self.model.continuous if self.model.continuous.any() else None
        self._safe_kd_model = safe_damping(self.model, armature=armature_of(self.p, n))
        self._set_safe_damping(None, self.p["safe_damping"])
        self.p.on_change("safe_damping", self._set_safe_damping)
        self.counters.update({"watchdog_trips": 0, "watchdog": "armed" if self.p["watchdog"] else "off"})
        self._started_wall = time.monotonic()
        self._wait_warn_next = float(self.p["wait_warn_after"])
        self._setup_law()
        self.p.on_change("reference_staleness",
                         lambda _n, v: setattr(self.refs, "max_staleness_ns", int(v * 1e9)))

        # lockstep: deep history so a recorder never misses a command; real time: depth 1
        self.pub_cmd = self.create_publisher(Float64MultiArray, "effort_controller/commands",
                                             PUBLISHER_STREAM_QOS if self.p["reliable_streams"] else COMMAND_QOS)
        self.pub_err = self.create_publisher(JointState, "controller/tracking_error", RELIABLE_STREAM_QOS)
        self._err_listened = False
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._cb_lock = threading.RLock()  # state/reference (io thread) vs watchdog (main thread)
        self.io = HotPath(self, enabled=self.p["hot_path_thread"])
        self._setup_topics()
        self.io.node.create_subscription(self.REFERENCE_TYPE, self.REFERENCE_TOPIC, self._on_reference,
                                         REFERENCE_QOS, raw=True)  # batch -> arrays: ReferenceBuffer.add_serialized
        self.io.node.create_subscription(JointState, "joint_states", self._on_state,
                                         stream_qos(self.p["reliable_streams"]), raw=True)  # wire.py
        self.create_service(Trigger, "~/reset_watchdog", self._srv_reset_watchdog)
        steady = rclpy.clock.Clock(clock_type=rclpy.clock.ClockType.STEADY_TIME)
        # the 10 ms watchdog runs on the hot thread (it shares the pending state; no main
        # executor wake-up at 100 Hz); diagnostics and slow work on the main executor
        if not self.io.add_periodic(0.01, self._watchdog):
            self.create_timer(0.01, self._watchdog, clock=steady)
        self._housekeeping_timer = None
        self._arm_housekeeping()
        self.p.on_change("diagnostics_period", lambda *_: self._arm_housekeeping())
        self._diag_last = time.monotonic()
        self.get_logger().info(f"{self._describe()}; joints {self.joint_names}")
        self.io.start()
        # last: every thread (companion, DDS) exists now; threads created later inherit it
        apply_realtime_priority(self, self.counters)

    # ------------------------------------------------------------ subclass hooks
    def _model_kwargs(self) -> dict:
        return {}

    def _make_references(self):
        """The buffer of the reference stream (``add_any``, ``lookup`` by stamp, ``counters``)."""
        return ReferenceBuffer(self.model.joint_names, capacity=4096,
                               max_staleness_ns=int(self.p["reference_staleness"] * 1e9))

    def _setup_law(self) -> None:
        raise NotImplementedError

    def _setup_topics(self) -> None:
        """Extra publishers/subscriptions (hot ones on ``self.io.node``)."""

    def _describe(self) -> str:
        return f"law={self.p['law']}"

    def _control(self, stamp: int, q, v, effort, ref, qd, qdd):
        """Torque (model joint order) for this state and reference, or ``None`` to
        answer with the safe command.  Called with ``self._cb_lock`` held."""
        raise NotImplementedError

    def _after_command(self, stamp: int, q, v, ref, qd, tau) -> None:
        if self.p["publish_tracking_error"] or self._err_listened:
            self.pub_err.publish(joint_state_msg(stamp, self.model.joint_names, ref.q - q, qd - v, tau))

    def _diagnostics(self) -> None:
        """Update gauges in ``self.counters`` before diagnostics are published (called
        with ``self._cb_lock`` held: no blocking work here, see :meth:`_periodic`)."""

    def _shutdown(self) -> None:
        """Called on destroy, before the zero command."""

    # ------------------------------------------------------------- callbacks
    def _on_reference(self, msg) -> None:
        with self._cb_lock:
            try:
                self.refs.add_any(msg)
            except ValueError as exc:
                self.counters.inc("reference_rejected")
                # throttled per kind of reason, so each different fault is reported
                if self.log_throttle("ref " + re.sub(r"[-+\d.e]+", "#", str(exc))[:80]):
                    self.get_logger().error(f"{self.REFERENCE_TOPIC} rejected: {exc}")
                return
            if self._pending is not None:
                self._try_pending()

    def _on_state(self, msg) -> None:
        """A joint state, serialized (``raw=True``) or as a message."""
        self.stall.take()   # a fault drill (inject_stall_ms): the state waits like a stalled process's
        with self._cb_lock:
            pend = self._pending
            if pend is not None and (newer := state_stamp(msg)) is not None and newer > pend[0]:
                self._superseded(pend)   # its own input missing: the subclass may answer it now
            self._last_state_wall = time.monotonic()
            try:
                stamp, q, v, effort = self.mapper.map(msg)
                if v is None:
                    raise ValueError("joint_states carries no velocities")
            except ValueError as exc:
                self.counters.inc("state_rejected")
                if self.log_throttle("state"):
                    self.get_logger().error(f"joint_states rejected ({exc}); sending the safe command")
                self._publish(self._safe_command(), state_stamp(msg))
                return
            if self._last_stamp is not None and stamp <= self._last_stamp:
                # a duplicate or reordered sample: answering it would feed the learners an
                # out-of-order state (the composite filter assumes one step per state)
                self.counters.inc("state_out_of_order")
                if self.log_throttle("order"):
                    self.get_logger().warning(f"joint_states stamp {stamp * 1e-9:.4f} s is not after"
                                              f" {self._last_stamp * 1e-9:.4f} s: ignored")
                return
            self._last_stamp = stamp
            self.counters.inc("states")
            self._last_q, self._last_v = q, v
            if self._pending is not None:  # a newer state supersedes one still waiting
                self.counters.inc("reference_missed")
                self._publish(self._safe_command(), self._pending[0])
            self._pending = (stamp, q, v, effort)
            self._pending_since = time.monotonic()
            if not self._try_pending() and self.p["reference_wait"] <= 0.0 and self._reference_missing(stamp):
                self._stop_waiting()   # real time: answer now, never wait for a reference

    def _try_pending(self, allow_stale: bool = False) -> bool:
        """Answer the pending state if its reference is here.  Only an exact stamp match
        is used while waiting (so lockstep results never depend on arrival timing); after
        ``reference_wait`` the last reference within ``reference_staleness`` is held."""
        stamp, q, v, effort = self._pending
        if self._extra_wait(stamp, effort, allow_stale) is not None:
            return False   # its callback (or the watchdog) comes back to it
        ref = self.refs.lookup(stamp, int(self.p["reference_tolerance"] * 1e9),
                               max_staleness_ns=None if allow_stale else -1)
        if ref is None:   # refused: the safe command now; else wait (the watchdog gives up after reference_wait)
            return self._answer_refused(stamp)
        self._pending = None
        qd = getattr(ref, "qd", None)      # (a task-space reference has none)
        qdd = getattr(ref, "qdd", None)
        if qd is None:
            qd = self._zeros
        if qdd is None:
            qdd = self._zeros
        if self.loop_watch.tripped:   # stays in the safe command, nothing adapted, until ~/reset_watchdog
            self.counters.inc("watchdog_cycles")
            self._publish(saturate(self._safe_command(), self.limit, self.sat), stamp)
            return True
        q_ref = getattr(ref, "q", None)    # (a task-space reference has none)
        if self._continuous is not None and q_ref is not None:   # the shortest way round
            q = q.copy()
            c = self._continuous
            q[c] = q_ref[c] - wrap_angle(q_ref[c] - q[c])
        tau = self._control(stamp, q, v, effort, ref, qd, qdd)
        if tau is None:
            tau = self._safe_command()
        elif not np.isfinite(tau).all():
            self.counters.inc("nonfinite_torque")
            if self.log_throttle("nan"):
                self.get_logger().error("control law produced a non-finite torque; sending the safe command")
            tau = self._safe_command()
        if self.p["watchdog"]:   # (task space: saturation only)
            if self.loop_watch.update(stamp * 1e-9, None if q_ref is None else q_ref - q,
                                      np.sign(tau) * (np.abs(tau) > self.limit)):
                self._trip()
                tau = self._safe_command()
        saturate(tau, self.limit, self.sat)
        self._publish(tau, stamp)
        self._after_command(stamp, q, v, ref, qd, tau)
        return True

    def _extra_wait(self, stamp: int, effort, allow_stale: bool) -> str | None:
        """Subclass hook: what else the pending state ``stamp`` still waits for besides its
        reference (None: nothing); ``allow_stale``: the reference wait is over."""
        return None

    def _superseded(self, pending) -> bool:
        """Subclass hook: a state stamped after ``pending`` came while it waits (called
        before that state is checked).  True when the subclass answered it (an input of
        its own was missing); else the shell answers it with the safe command as a
        missed reference once the newer state is accepted."""
        return False

    def _expire_waits(self) -> None:
        """Subclass hook, every watchdog tick (callback lock held): end the waits of
        :meth:`_extra_wait` whose time is up."""

    def _trip(self) -> None:
        """The watchdog tripped: one ERROR line, the counters; :meth:`_on_trip` for the law."""
        w = self.loop_watch
        self.counters.inc("watchdog_trips")
        self.counters.set("watchdog", f"TRIPPED at t={w.tripped_at:.3f} s: {w.reason}")
        self.get_logger().error(f"watchdog: {w.reason} -> safe command ({self.p['safe_mode']}), learning frozen"
                                f" with the estimate kept; call {self.get_fully_qualified_name()}/reset_watchdog"
                                " to resume")
        self._on_trip()

    def _on_trip(self) -> None:
        """Subclass hook: the watchdog tripped (freeze and keep what was learned)."""

    def _on_release(self) -> None:
        """Subclass hook: ``~/reset_watchdog`` released a trip (called with the locks held)."""

    def _srv_reset_watchdog(self, req, res):
        with self._cb_lock:
            was = self.loop_watch.tripped
            self.loop_watch.reset()
            if was:
                self._on_release()
            self.counters.set("watchdog", "armed")
        res.success = True
        res.message = "watchdog released: the law is back in command" if was else "watchdog was not tripped"
        self.get_logger().info(res.message)
        return res

    def _answer_refused(self, stamp: int) -> bool:
        """When the reference for ``stamp`` was refused (a buffer that remembers refused
        stamp ranges, as the task-space one does; the reason was logged with the refusal),
        answer the pending state with the safe command at once instead of waiting for a
        reference that will not come; returns whether it did."""
        refused_at = getattr(self.refs, "refused_at", None)
        if refused_at is None or not refused_at(stamp, int(self.p["reference_tolerance"] * 1e9)):
            return False
        self._pending = None
        self.counters.inc("reference_refused_cycles")
        if self.log_throttle("refused"):
            self.get_logger().error(f"the {self.REFERENCE_TOPIC} for t={stamp * 1e-9:.4f} s was refused (see the"
                                    " reason logged with it): safe command")
        self._publish(saturate(self._safe_command(), self.limit, self.sat), stamp)
        return True

    def _set_safe_damping(self, _name, value) -> None:
        """``safe_damping`` 0: the per-joint damping derived from the arm; else that value."""
        self._safe_kd = self._safe_kd_model if value == 0.0 else np.full(self.n, float(value))

    def _safe_command(self) -> np.ndarray:
        if self.p["safe_mode"] == "damping" and self._last_v is not None:
            return -self._safe_kd * np.clip(self._last_v, -10, 10)
        return np.zeros(self.n)

    def _publish(self, tau_model: np.ndarray, stamp) -> None:
        if self._cmd_identity:   # command order = model order (the usual case)
            out = tau_model
        else:
            out = np.empty(self.n)
            out[self.cmd_index] = tau_model
        self.pub_cmd.publish(encode_stamped_command(out, stamp))

    def _reference_missing(self, stamp: int) -> bool:
        """No reference stamped for this state's instant (what ``reference_wait`` waits for;
        a subclass may be waiting for another input of the state, e.g. its regressors)."""
        return self.refs.lookup(stamp, int(self.p["reference_tolerance"] * 1e9), max_staleness_ns=-1) is None

    def _stop_waiting(self) -> None:
        """The pending state's reference did not come (within ``reference_wait``): answer
        it with the newest reference within ``reference_staleness`` (held), else with the
        safe command."""
        stamp = self._pending[0]
        if self._try_pending(allow_stale=True):
            self.counters.inc("reference_held")
        else:
            self._pending = None
            self.counters.inc("reference_missed")
            if self.log_throttle("miss"):
                self.get_logger().warning(f"no reference for t={stamp * 1e-9:.4f} s within"
                                          f" {self.p['reference_wait']} s; safe command sent")
            self._publish(self._safe_command(), stamp)

    def _watchdog(self) -> None:
        # (every 10 ms, not every cycle: whether controller/tracking_error has a reader)
        self._err_listened = self.pub_err.get_subscription_count() > 0
        with self._cb_lock:
            self._expire_waits()
            now = time.monotonic()
            if self._last_state_wall is None and now - self._started_wall >= self._wait_warn_next:
                self._wait_warn_next *= 2.0
                self.get_logger().warning(
                    f"no joint_states for {now - self._started_wall:.0f} s: waiting on"
                    f" {self.io.node.resolve_topic_name('joint_states')} for joints {self.model.joint_names}"
                    f" ({discovery_hint()}); is the robot's driver or the simulator running on this domain?")
            if self._pending is not None and now - self._pending_since > self.p["reference_wait"] \
                    and self._reference_missing(self._pending[0]):   # other inputs: the subclass's wait
                self._stop_waiting()
            # a state still waiting for its reference is our silence, not the robot's: in
            # lockstep the bridge is waiting for us
            if self._pending is None and self._last_state_wall is not None \
                    and now - self._last_state_wall > self.p["state_timeout"]:
                self.counters.inc("state_timeouts")
                if self.log_throttle("timeout"):
                    self.get_logger().warning(f"no joint_states for {self.p['state_timeout']} s: safe command")
                self._publish(np.zeros(self.n), None)
                self._last_state_wall = now

    def _arm_housekeeping(self) -> None:
        """(Re)start the housekeeping timer: 4 Hz, or twice per diagnostics period when that is
        shorter (every wake-up of the main executor costs ~0.1 ms of this process's CPU)."""
        if self._housekeeping_timer is not None:
            self.destroy_timer(self._housekeeping_timer)
        period = max(0.025, min(0.25, 0.5 * float(self.p["diagnostics_period"])))
        self._housekeeping_timer = self.create_timer(
            period, self._housekeeping, clock=rclpy.clock.Clock(clock_type=rclpy.clock.ClockType.STEADY_TIME))

    def _housekeeping(self) -> None:
        """Main executor, 4 Hz (or twice per diagnostics period): diagnostics, then :meth:`_periodic`."""
        with self._cb_lock:
            now = time.monotonic()
            if now - self._diag_last >= self.p["diagnostics_period"]:
                self._diag_last = now
                for k, val in self.refs.counters.items():
                    self.counters.set(f"ref_{k}", val)
                self._diagnostics()
                self.io.report(self.counters)
                self._publish_status()
        self._periodic()

    def _periodic(self) -> None:
        """Slow work of the housekeeping timer that must not hold ``self._cb_lock`` (file I/O)."""

    def send_safe_and_stop(self) -> None:
        """Shutdown hook: leave the robot with a zero torque command."""
        try:
            self._publish(np.zeros(self.n), None)
        except Exception:  # context may already be gone
            pass

    def destroy_node(self):
        if not hasattr(self, "pub_cmd"):  # construction failed half way: nothing to stop
            return super().destroy_node()
        self.io.stop()
        try:
            self._shutdown()
        finally:
            self.send_safe_and_stop()
            self._final_diagnostics()
        return super().destroy_node()

    def _publish_status(self) -> None:
        """Publish the ``/diagnostics`` status: saturation counts, ERROR while the watchdog is
        tripped (call with ``self._cb_lock`` held)."""
        self.counters.set("saturated_steps", int(self.sat.sum()))
        self.counters.set("saturated_cycles", [int(x) for x in self.sat])   # per joint, model order
        w = self.loop_watch
        status = self.counters.status(level=DiagnosticStatus.ERROR, message=f"watchdog: {w.reason}") \
            if w.tripped else self.counters.status()
        self.pub_diag.publish(diagnostic_array(self.get_clock().now().to_msg(), [status]))

    def _final_diagnostics(self) -> None:
        """One last ``/diagnostics`` status (a trip in the last period is not lost to a recorder)."""
        try:
            with self._cb_lock:
                self._publish_status()
        except Exception:  # noqa: BLE001 -- the context may already be gone
            pass

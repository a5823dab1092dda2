"""``mujoco_bridge`` node: the simulated robot; its policy is
:class:`adaptive_dynamics.sim.stepping.PlantStepper`.

Manual (topics, modes, services, persistence, diagnostics): ``docs/nodes.md#mujoco_bridge``;
parameters: ``ros2 param describe /mujoco_bridge <name>``.
"""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import rclpy
import rclpy.duration
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import WrenchStamped
from rclpy.node import Node
from rosgraph_msgs.msg import Clock
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray
from std_srvs.srv import SetBool, Trigger

from ..ros.commands import command_values, split_command
from ..ros.node_base import Counters, diagnostic_array, HotPath, run_node
from ..ros.params import declare_params, ParamSpec
from ..ros.qos import CLOCK_QOS, LOCKSTEP_COMMAND_QOS, PUBLISHER_STREAM_QOS, REALTIME_COMMAND_QOS
from ..ros.stamps import from_ns
from ..sim.plant import ExternalPush, MujocoPlant, PUSH_FRAMES, RealityConfig, push_schedule
from ..sim.stepping import PlantStepper
from ..wire import JointStateEncoder
from .housekeeping import apply_realtime_priority, core_logger, realtime_spec, stall_spec, StallInjector, Throttle
from .robot_params import resolve_urdf, robot_specs


#: wall seconds the bridge waits at the end for reliable readers to acknowledge the last states
ACK_WAIT_S = 30.0


def specs() -> list[ParamSpec]:
    return robot_specs() + [
        ParamSpec("mode", "lockstep", "lockstep | realtime", choices=["lockstep", "realtime"], read_only=True),
        ParamSpec("rate_hz", 1000.0, "simulation / joint_states rate [Hz]", min=10.0, max=10000.0, read_only=True),
        ParamSpec("integrator", "implicitfast", "MuJoCo integrator", choices=["implicitfast", "implicit",
                  "euler", "rk4"], read_only=True),
        ParamSpec("lockstep_timeout", 0.5, "lockstep: wall s to wait for the command of a step", min=0.001, max=600.0),
        ParamSpec("lockstep_max_speed", 0.0, "lockstep: at most this many sim s per wall s (0 = as fast as"
                  " the graph answers); leaves CPU to asynchronous nodes, e.g. a learner that should keep"
                  " up as it would on a faster machine", min=0.0, max=1000.0),
        ParamSpec("lockstep_accept_unstamped", False, "lockstep: take a command without a state stamp"
                  " as the current step's (for controllers that cannot stamp; not deterministic)",
                  read_only=True),
        ParamSpec("command_timeout", 0.05, "realtime: sim s without a valid command before the safe"
                  " action", min=0.001, max=60.0),
        ParamSpec("safe_mode", "damping", "safe action: damping (zero torque + joint damping) | hold",
                  choices=["damping", "hold"]),
        ParamSpec("safe_damping", 5.0, "joint damping of the safe action [Nm s/rad]", min=0.0, max=1e4),
        ParamSpec("reliable_streams", True, "(kept for symmetry: joint_states is always published"
                  " reliably, which also serves best-effort readers)", read_only=True),
        ParamSpec("wait_for_nodes", 1, "start (either mode) only when this many other nodes subscribe to"
                  " /clock (every use_sim_time node does) and a command publisher is matched", min=0,
                  max=100, read_only=True),
        ParamSpec("wait_for_state_subscribers", 1, "start (either mode) only when this many joint_states"
                  " subscribers are matched (controller, recorder, ...)", min=0, max=100, read_only=True),
        ParamSpec("clock_decimation", 1, "publish /clock every k-th step (joint_states carry exact"
                  " stamps; sim-time nodes then tick at rate_hz / k)", min=1, max=1000, read_only=True),
        ParamSpec("max_sim_time", 0.0, "> 0: exit (code 0) after this much simulated time [s]", min=0.0),
        ParamSpec("q0", [0.0], "start configuration [rad] in joint_names order; [0.0] = mid-range",
                  type="float[]", read_only=True),
        ParamSpec("stats_file", "", "write the final counters/latency statistics as JSON here on exit",
                  read_only=True),
        ParamSpec("diagnostics_period", 1.0, "diagnostics period [s] (wall)", min=0.05, max=60.0),
        realtime_spec(),
        stall_spec(),
        ParamSpec("hot_path_thread", True, "take commands on a lean companion node (<name>_io) with its"
                  " own executor thread (faster lockstep; see HotPath); in real time the 1 kHz loop"
                  " takes them itself between its ticks", read_only=True),
        # "reality" (RealityConfig): the controller's model never sees these
        ParamSpec("friction_viscous", [0.0], "joint viscous friction [Nm s/rad], 1 or n values", min=0.0,
                  type="float[]", read_only=True),
        ParamSpec("friction_coulomb", [0.0], "joint Coulomb friction [Nm], 1 or n values", min=0.0,
                  type="float[]", read_only=True),
        ParamSpec("coulomb_smoothing", 0.01, "Coulomb friction f_c tanh(v/eps): eps [rad/s]", min=1e-6,
                  read_only=True),
        ParamSpec("friction_stribeck", [0.0], "Stribeck friction f_s [Nm] above the Coulomb level at rest,"
                  " f_s exp(-(v/v_s)^2) tanh(v/eps), 1 or n values (outside the rigid-body model class)",
                  min=0.0, type="float[]", read_only=True),
        ParamSpec("stribeck_velocity", 0.1, "Stribeck velocity v_s [rad/s]", min=1e-6, read_only=True),
        ParamSpec("ripple_amplitude", [0.0], "position ripple a [Nm], a sin(N q) (gear / cogging), 1 or n"
                  " values (outside the rigid-body model class)", min=0.0, type="float[]", read_only=True),
        ParamSpec("ripple_periods", 10.0, "ripple periods N per rad of joint travel", min=1e-6, read_only=True),
        ParamSpec("payload_mass", 0.0, "unknown payload mass [kg] on payload_frame", min=0.0, read_only=True),
        ParamSpec("payload_com", [0.0, 0.0, 0.0], "payload CoM in payload_frame [m]", type="float[]",
                  length=3, read_only=True),
        ParamSpec("payload_inertia", [0.0], "payload inertia about its CoM: [] / [0.0] = sphere r=2 cm,"
                  " 3 (diagonal), 6 (URDF order) or 9 values [kg m^2]", type="float[]", read_only=True),
        ParamSpec("payload_frame", "", "frame carrying the payload; empty = end effector", read_only=True),
        ParamSpec("payload_enabled", False, "payload attached at start (toggle with ~/toggle_payload)",
                  read_only=True),
        ParamSpec("link_scale", 1.0, "scale of every link's mass and inertia (model mismatch)", min=0.0,
                  read_only=True),
        ParamSpec("link_scales", [""], "per-link scale overrides 'link:factor'", type="str[]", read_only=True),
        ParamSpec("noise_std_q", [0.0], "position noise std [rad], 1 or n values", min=0.0, type="float[]",
                  read_only=True),
        ParamSpec("noise_std_v", [0.0], "velocity noise std [rad/s]", min=0.0, type="float[]", read_only=True),
        ParamSpec("noise_std_tau", [0.0], "measured torque noise std [Nm]", min=0.0, type="float[]",
                  read_only=True),
        ParamSpec("tau_bias", [0.0], "torque-sensor bias [Nm], 1 or n values", type="float[]", read_only=True),
        ParamSpec("seed", 0, "noise seed (same seed + same commands = same run)", min=0, read_only=True),
    ] + push_specs()


def push_specs() -> list[ParamSpec]:
    """Scripted external forces (the plant's ExternalPush): a schedule fixed at start
    (parallel lists, one entry per push) and the push ~/push fires (live)."""
    frames = list(PUSH_FRAMES)
    return [
        ParamSpec("push_links", [""], "scheduled pushes: the link (URDF link = MuJoCo body) of each; [''] = none",
                  type="str[]", read_only=True),
        ParamSpec("push_points", [0.0], "each push's point in its link's frame [m], 3 values per push; [0.0] ="
                  " every push at its link's origin", type="float[]", read_only=True),
        ParamSpec("push_directions", [0.0], "each push's direction (normalised), 3 values per push, in the axes"
                  " push_frames names", type="float[]", read_only=True),
        ParamSpec("push_frames", ["world"], "axes of push_directions: world | link, 1 (every push) or one per push",
                  type="str[]", choices=frames, read_only=True),
        ParamSpec("push_magnitudes", [10.0], "each push's force [N], 1 (every push) or one per push", min=0.0,
                  type="float[]", read_only=True),
        ParamSpec("push_starts", [0.0], "each push's start [sim s], one per push", type="float[]", read_only=True),
        ParamSpec("push_durations", [0.2], "each push's duration [s], 1 (every push) or one per push", min=1e-9,
                  type="float[]", read_only=True),
        ParamSpec("push_now_link", "", "~/push: the link pushed; '' = the end effector's (ee_frame)"),
        ParamSpec("push_now_point", [0.0, 0.0, 0.0], "~/push: the point in the link's frame [m]", type="float[]",
                  length=3),
        ParamSpec("push_now_direction", [0.0, 0.0, -1.0], "~/push: the direction (normalised; non-zero) in"
                  " push_now_frame's axes", type="float[]", length=3),
        ParamSpec("push_now_frame", "world", "~/push: axes of push_now_direction: world | link", choices=frames),
        ParamSpec("push_now_magnitude", 10.0, "~/push: the force [N]", min=0.0, max=1e4),
        ParamSpec("push_now_duration", 0.2, "~/push: how long [s]", min=1e-3, max=3600.0),
        ParamSpec("publish_external_truth", False, "publish external_torque/truth on every step from the start"
                  " (else from the first push: scheduled or fired)", read_only=True),
    ]


class MujocoBridgeNode(Node):
    def __init__(self, **kwargs):
        super().__init__("mujoco_bridge", **kwargs)
        p = self.p = declare_params(self, specs())
        names = [n for n in p["joint_names"] if n] or None
        q0 = None if list(p["q0"]) == [0.0] else np.asarray(p["q0"], dtype=float)
        self.dt = 1.0 / p["rate_hz"]
        self.plant = MujocoPlant(resolve_urdf(p, self), joint_names=names,
                                 reality=RealityConfig.from_node_parameters(p),
                                 timestep=self.dt, integrator=p["integrator"], q0=q0,
                                 end_effector=p["end_effector"])
        self.n = self.plant.n
        self.names = list(self.plant.joint_names)
        for push in push_schedule(p["push_links"], p["push_directions"], p["push_magnitudes"], p["push_starts"],
                                  p["push_durations"], p["push_points"], p["push_frames"]):
            self.plant.add_push(push)   # raises naming the links for an unknown one
        self.p.add_validator(self._check_push_now)
        self._check_holding()
        self.counters = Counters("mujoco_bridge", self.get_fully_qualified_name(), warn_on=("overload_episodes",))
        self.stall = StallInjector(self)
        self.throttle = Throttle(1.0)
        self.lockstep = p["mode"] == "lockstep"
        self.stepper = PlantStepper(self.plant, p, lockstep=self.lockstep, count=self.counters.inc,
                                    gauge=self.counters.set, log=core_logger(self, self.throttle))
        self.lock = self.stepper.lock
        self.latency_ns = self.stepper.latency_ns
        self.pub_state = self.create_publisher(JointState, "joint_states", PUBLISHER_STREAM_QOS)
        self.pub_clock = self.create_publisher(Clock, "/clock", CLOCK_QOS)
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # the environment's pushes: the truth, stamped like joint_states (from the first push on)
        self.pub_truth = self.create_publisher(JointState, "external_torque/truth", PUBLISHER_STREAM_QOS)
        self.pub_truth_wrench = self.create_publisher(WrenchStamped, "external_torque/truth_wrench",
                                                      PUBLISHER_STREAM_QOS)
        self._truth_encoder = JointStateEncoder(self.names)
        self.io = HotPath(self, enabled=p["hot_path_thread"])
        # real time: the 1 kHz loop takes the commands itself between its ticks (one thread
        # reads, steps and writes, like a ros2_control update loop; no hand-over to a second
        # thread on the critical path)
        self._loop_takes_commands = (not self.lockstep) and self.io.enabled and self.io.lean
        # the 1 kHz streams go as bytes through adaptive_dynamics.wire (same wire format,
        # a few us instead of rclpy's message objects)
        self._state_encoder = JointStateEncoder(self.names)
        self.io.node.create_subscription(Float64MultiArray, "effort_controller/commands", self._on_command,
                                         LOCKSTEP_COMMAND_QOS if self.lockstep else REALTIME_COMMAND_QOS, raw=True)
        self.create_service(Trigger, "~/reset", self._srv_reset)
        self.create_service(Trigger, "~/toggle_payload", self._srv_toggle)
        self.create_service(SetBool, "~/set_payload", self._srv_set_payload)
        self.create_service(Trigger, "~/push", self._srv_push)
        self.create_service(Trigger, "~/clear_pushes", self._srv_clear_pushes)
        steady = rclpy.clock.Clock(clock_type=rclpy.clock.ClockType.STEADY_TIME)
        self._diag_last = time.monotonic()
        self._done = False
        self._start_wall = time.monotonic()
        self._pace_wall = 0.0
        # both modes start once the graph is connected (_ready): checked at 100 Hz until then;
        # lockstep keeps the timer at 10 Hz for its command timeout (every wake-up of this
        # executor costs the hot path GIL time), real time cancels it (its loop keeps time)
        self._watchdog_timer = self.create_timer(0.01, self._watchdog, clock=steady)
        # diagnostics: checked at 20 Hz on the executor until real time starts; the real-time
        # loop then does it itself in the slack after a step (no second Python thread
        # taking the GIL from the 1 kHz loop)
        self._housekeeping_timer = self.create_timer(0.05, self._housekeeping, clock=steady)
        self.get_logger().info(f"{p['mode']} at {p['rate_hz']:.0f} Hz, joints {self.names},"
                               f" reality {self.plant.reality}")
        if not self._loop_takes_commands:
            self.io.start()
        # last: every thread (real-time loop, companion, DDS) exists now; later ones inherit it
        apply_realtime_priority(self, self.counters)

    # ----------------------------------------------------------------- helpers
    def _check_holding(self) -> None:
        """WARN when the simulated arm (its payload included) cannot hold itself against
        gravity somewhere in its joint ranges (:meth:`MujocoPlant.holding_shortfall`)."""
        why = self.plant.holding_shortfall()
        if why:
            self.get_logger().warning(why)

    def _ready(self) -> bool:
        """Start condition: the graph is connected, so step 0 is not lost."""
        clock_subs = self.count_subscribers("/clock")
        state_subs = self.pub_state.get_subscription_count()
        cmd_pubs = self.count_publishers(self.resolve_topic_name("effort_controller/commands"))
        return (clock_subs >= self.p["wait_for_nodes"] and cmd_pubs >= 1
                and state_subs >= max(1, self.p["wait_for_state_subscribers"]))

    def _start(self) -> None:
        self.stepper.start()
        self._pace_wall = time.monotonic()
        self._publish_state()
        if not self.lockstep:
            self._housekeeping_timer.cancel()
            self._rt_thread = threading.Thread(target=self._realtime_loop, daemon=True)
            self._rt_thread.start()
        self.get_logger().info(f"started after {time.monotonic() - self._start_wall:.2f} s (wall)")

    @property
    def _started(self) -> bool:
        return self.stepper.started

    def _now_ns(self) -> int:
        return int(round(self.plant.time * 1e9))

    def _publish_state(self) -> None:
        stamp, q, v, tau = self.stepper.state()
        self.pub_state.publish(self._state_encoder.encode(stamp, q, v, tau))
        # /clock after the state: the controller answering this state is on the critical
        # path, the /clock readers (trajectory, time sources) are not
        if self.plant.steps % self.p["clock_decimation"] == 0:
            self.pub_clock.publish(Clock(clock=from_ns(stamp)))
        if self.plant.pushes_added or self.p["publish_external_truth"]:
            self._publish_truth(stamp)

    def _publish_truth(self, stamp: int) -> None:
        """``external_torque/truth`` (the joint torques the pushes applied over the step
        that ended at ``stamp``) and one ``external_torque/truth_wrench`` per push acting."""
        self.pub_truth.publish(self._truth_encoder.encode(stamp, effort=self.plant.external_torque))
        for f in self.plant.external_forces:
            msg = WrenchStamped()
            msg.header.stamp = from_ns(stamp)
            msg.header.frame_id = f["push"].link
            w = f["wrench_link"]
            msg.wrench.force.x, msg.wrench.force.y, msg.wrench.force.z = (float(x) for x in w[:3])
            msg.wrench.torque.x, msg.wrench.torque.y, msg.wrench.torque.z = (float(x) for x in w[3:])
            self.pub_truth_wrench.publish(msg)

    def _after_step(self) -> None:
        if self.lockstep:
            self.stall.take()
        if self.stepper.at_end(self.p["max_sim_time"]):
            self._finish()
            return
        cap = self.p["lockstep_max_speed"] if self.lockstep else 0.0
        if cap > 0.0:   # hold the next state until its time at the capped pace
            target = self._pace_wall + self.dt / cap
            now = time.monotonic()
            if target > now:
                time.sleep(target - now)
            # a slow stretch earns at most 10 ms of catching up (the pace is a cap, not a schedule)
            self._pace_wall = max(target, now - 0.01)
        self._publish_state()

    def _finish(self) -> None:
        if self._done:
            return
        self._done = True
        self.get_logger().info(f"max_sim_time {self.p['max_sim_time']} s reached after"
                               f" {self.plant.steps} steps; exiting")
        # let reliable readers (the recorder) acknowledge the last states before we go: a
        # reader behind on a loaded machine would lose the run's tail with our writer's history
        try:
            acked = self.pub_state.wait_for_all_acked(rclpy.duration.Duration(seconds=ACK_WAIT_S))
        except Exception:  # pragma: no cover - best effort
            acked = True
        if not acked:
            self.get_logger().warning(f"a reliable joint_states reader (the recorder?) had not acknowledged the last"
                                      f" states {ACK_WAIT_S:g} s after the end: its recording ends early")
        self._write_stats()
        rclpy.try_shutdown(context=self.context)

    # ---------------------------------------------------------------- commands
    def _on_command(self, msg, info) -> None:
        """A command, serialized (``raw=True``) or as a message, with its message info."""
        with self.lock:
            if self._done or not self._started:
                return
            try:
                stamp, offset, data = split_command(msg)
            except ValueError as exc:   # undecodable bytes: no stamp to pair it with
                self.counters.inc("rejected_commands")
                if self.throttle("bad"):
                    self.get_logger().error(f"command rejected ({exc})")
                return
            # arrival as the DDS layer stamped it (not when this thread took it); the local
            # clock if the RMW does not stamp receptions
            arrived = (info.get("received_timestamp") if isinstance(info, dict) else 0) or time.time_ns()
            tau, error = None, None
            try:
                tau = command_values(data, offset, self.n)
            except ValueError as exc:
                error = str(exc)
            if self.stepper.on_command(stamp, tau, arrived, error):
                self._after_step()

    def _watchdog(self) -> None:
        with self.lock:
            if self._done:
                return
            if not self._started:
                if self._ready():
                    time.sleep(0.2)  # let the matched readers finish their handshake
                    self._start()
                    if self.lockstep:
                        self._watchdog_timer.timer_period_ns = 100_000_000
                    else:
                        self._watchdog_timer.cancel()
                elif self.throttle("waiting") and time.monotonic() - self._start_wall > 5.0:
                    self.get_logger().info(f"{self.p['mode']}: waiting for the controller and"
                                           f" {self.p['wait_for_nodes']} /clock subscribers")
                return
            if self.stepper.lockstep_timed_out():
                self.stepper.safe_step()
                self._after_step()

    def _realtime_loop(self) -> None:
        """The real-time stepping (:meth:`PlantStepper.run_realtime`): between ticks this
        thread takes the commands itself (``io``: the loop's own wait set; with the
        executor fallback they come in on another thread)."""
        io = self.io if self._loop_takes_commands else None
        HotPath.shorten_switch_interval()
        try:
            self.stepper.run_realtime(wait_until=lambda deadline: self._wait_until(deadline, io),
                                      running=lambda: self.context.ok() and not self._done,
                                      done=lambda: self._done,
                                      after_step=self._after_step, between=self._housekeeping,
                                      stall=self.stall.take)
        finally:
            if io is not None:
                io.release()

    def _wait_until(self, deadline_ns: int, io) -> None:
        """Until the tick: take commands as they arrive (``io``: block in the loop's own
        wait set until a command or the tick), else sleep (the companion's thread takes
        them).  Sleep, never spin: a busy wait takes the core the DDS receive threads need."""
        clock = time.perf_counter_ns
        while (rem := deadline_ns - clock()) > 0:
            if io is None or self.stepper.answered:
                # nothing left to take before the tick (the answer is in and stepped; a
                # second command waits in the reader until then): sleeping costs a few us
                # of CPU, a DDS wait set tens
                time.sleep(rem * 1e-9)
                return
            io.spin_once(rem)
            if self._done or not self.context.ok():
                return

    # ---------------------------------------------------------------- services
    def _srv_reset(self, req, res):
        self.stepper.reset()
        res.success, res.message = True, f"reset at t={self.plant.time:.3f} s"
        return res

    def _srv_toggle(self, req, res):
        with self.lock:
            on = not self.plant.payload_enabled
            self.plant.set_payload_enabled(on)
        res.success, res.message = True, f"payload {'attached' if on else 'removed'}"
        self.get_logger().info(res.message)
        return res

    def _srv_set_payload(self, req, res):
        with self.lock:
            self.plant.set_payload_enabled(bool(req.data))
        res.success, res.message = True, f"payload {'attached' if req.data else 'removed'}"
        return res

    def _check_push_now(self, values) -> str | None:
        """Cross-parameter check of the ``push_now_*`` parameters (a known link, a non-zero direction)."""
        try:
            self._push_now(values)
        except ValueError as exc:
            return str(exc)
        return None

    def _push_now(self, values, start: float = 0.0) -> ExternalPush:
        link = values["push_now_link"] or self.plant.ee_frame
        self.plant.check_link(link, "push_now_link")   # raises listing the links
        return ExternalPush(link, tuple(values["push_now_direction"]), values["push_now_magnitude"],
                            tuple(values["push_now_point"]), values["push_now_frame"], start,
                            values["push_now_duration"])

    def _srv_push(self, req, res):
        with self.lock:
            try:
                push = self.plant.add_push(self._push_now(self.p.snapshot(), start=self.plant.time))
            except ValueError as exc:
                res.success, res.message = False, f"no push: {exc}"
                return res
        self.counters.inc("pushes_fired")
        res.success, res.message = True, f"pushing: {push.describe()}"
        self.get_logger().info(res.message)
        return res

    def _srv_clear_pushes(self, req, res):
        with self.lock:
            k = self.plant.clear_pushes()
        res.success, res.message = True, f"{k} push(es) removed"
        return res

    # ------------------------------------------------------------- diagnostics
    #: live diagnostics: latency percentiles over this many most recent answered states
    DIAG_WINDOW = 1000

    def stats(self, window: int | None = None) -> dict:
        """Counters and latency statistics: over every retained sample (the final
        ``stats_file``) or the last ``window`` (the periodic diagnostics: cheap)."""
        return self.stepper.stats(self.counters.as_dict(), window)

    def _write_stats(self) -> None:
        if self.p["stats_file"]:
            with self.lock:   # the loop thread may still be running (shutdown)
                st = self.stats()
            with open(self.p["stats_file"], "w") as fh:
                json.dump(st, fh, indent=1)

    def _housekeeping(self) -> None:
        if time.monotonic() - self._diag_last >= self.p["diagnostics_period"]:
            self._diag_last = time.monotonic()
            st = self.stats(window=self.DIAG_WINDOW)
            for k in ("latency_p50_ms", "latency_p99_ms", "tick_late_p99_ms", "sim_time"):
                if k in st:
                    self.counters.set(k, round(st[k], 4))
            self.counters.set("saturated_steps", int(np.sum(st["saturation_count"])))
            if self.plant.pushes_added:
                self.counters.set("pushes_pending", len(self.plant.pushes))
                self.counters.set("pushing_now", ",".join(f["push"].link for f in self.plant.external_forces)
                                  or "none")
            self.io.report(self.counters)
            self.pub_diag.publish(diagnostic_array(from_ns(self._now_ns()), [self.counters.status()]))

    def destroy_node(self):
        self._done = True
        rt = getattr(self, "_rt_thread", None)
        if rt is not None and rt is not threading.current_thread():
            rt.join(timeout=1.0)  # the loop checks _done every step
        if hasattr(self, "io"):   # (not when the constructor refused the parameters: its error stands)
            self.io.stop()
        if hasattr(self, "stepper"):
            self._write_stats()
        return super().destroy_node()


def main(args=None) -> int:
    return run_node(MujocoBridgeNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

"""How the simulated robot steps on its controller's commands, without ROS.

:class:`PlantStepper` is the ``mujoco_bridge`` node's policy; the node converts messages
and publishes.

* **lockstep** -- deterministic and faster than real time: the state of step k waits for
  the command stamped with it (:meth:`~PlantStepper.on_command` steps the plant and the
  caller publishes the next state).  A command for another stamp is ignored; an
  unstamped one too unless ``lockstep_accept_unstamped``; a malformed one steps with the
  safe action; no answer within ``lockstep_timeout`` wall seconds
  (:meth:`~PlantStepper.lockstep_timed_out`) steps with the safe action.
* **real time** -- :meth:`~PlantStepper.run_realtime` keeps a wall-clock tick per period.
  The command answering the last state steps the plant as soon as it arrives, so the
  tick only releases the state already computed; if it has not come by the tick (a
  *deadline miss*), the step runs there on the newest valid command, or with the safe
  action once no valid command came for ``command_timeout`` sim seconds.  Overload
  episodes (sustained misses) are tracked by :class:`~adaptive_dynamics.realtime.OverloadTracker`.

Measured: the latency from a state's publication to its command's reception (the
reception stamp the caller passes), how late each tick woke, the missed ticks.
``settings`` is read live (a mapping: ``safe_mode``, ``safe_damping``,
``command_timeout``, ``lockstep_timeout``, ``lockstep_accept_unstamped``); counters go to
``count(key, n)`` and gauges to ``gauge(key, value)``, messages to ``log(level, text,
key)`` (``key``: a message that may repeat every step, throttled by the caller).
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Mapping, Optional

import numpy as np

from ..realtime import OverloadTracker, SampleRing, raise_thread_priority
from .plant import MujocoPlant

__all__ = ["PlantStepper"]

#: retained samples of the latency, tick and missed-tick statistics
RING = 100_000


class PlantStepper:
    """The stepping of one simulated robot (see the module)."""

    def __init__(self, plant: MujocoPlant, settings: Mapping, *, lockstep: bool, count: Callable[..., None],
                 gauge: Callable[[str, object], None], log: Callable[..., None]):
        self.plant, self.p, self.lockstep = plant, settings, bool(lockstep)
        self.count, self.gauge, self.log = count, gauge, log
        self.dt = float(plant.timestep)
        self.lock = threading.RLock()
        # real time: the periods (counted from the first tick) that missed their deadline, and
        # the stretches of sustained misses with their recovery
        self.missed_ticks = SampleRing(RING)
        self.overload = OverloadTracker(self.dt, miss_log=self.missed_ticks)
        self.latency_ns = SampleRing(RING)     # state published -> its command received
        self.tick_late_ns = SampleRing(RING)   # real time: how late each tick woke
        # state stamp -> wall time it was published (CLOCK_REALTIME ns, the clock of the
        # DDS reception stamps the latency is measured against)
        self._published_at: dict = {}
        self.stamp = 0               # stamp (ns) of the state awaiting its command
        self.sent_wall = 0.0
        self.started = False
        self.run_wall0 = 0.0
        self.end_wall: Optional[float] = None   # wall time of the last step
        # real time
        self._latest_cmd = None
        self._latest_cmd_time = -np.inf
        self._latest_stamp = None   # stamp of the state _latest_cmd answers (None: unstamped)
        self._ahead = False         # the step to the next tick's state is done (its answer came)
        self._ahead_late = False    # ... but its answer was received after the tick was due
        self._deadline_rt = 0       # the next tick, CLOCK_REALTIME ns (the reception stamps' clock)
        self._cmd_age_max = 0.0     # oldest command a step ran on [sim s]

    # ------------------------------------------------------------------ states
    def start(self) -> None:
        self.started = True
        self.run_wall0 = time.monotonic()

    def state(self) -> tuple:
        """The state to publish now ``(stamp_ns, q, v, tau)``; it awaits its command."""
        t, q, v, tau = self.plant.state()
        stamp = int(round(t * 1e9))
        self.stamp = stamp
        self.sent_wall = time.monotonic()
        pub = self._published_at
        pub[stamp] = time.time_ns()
        if len(pub) > 2000:  # oldest first (insertion order): O(1) per step, no periodic sort
            del pub[next(iter(pub))]
        return stamp, q, v, tau

    def at_end(self, max_sim_time: float) -> bool:
        """``max_sim_time`` (> 0) reached: the run's wall time stops here."""
        if max_sim_time > 0 and self.plant.time >= max_sim_time - 1e-12:
            if self.end_wall is None:
                self.end_wall = time.monotonic()
            return True
        return False

    def safe_step(self) -> None:
        mode = "hold" if self.p["safe_mode"] == "hold" else "damp"
        gains = {} if mode == "hold" else {"damping": self.p["safe_damping"]}
        self.plant.step_safe(mode, **gains)
        self.count("safe_steps")

    def reset(self) -> None:
        with self.lock:
            self.plant.reset()
            self._latest_cmd = None

    # ------------------------------------------------------------------ commands
    def on_command(self, stamp: Optional[int], tau, arrived_ns: int, error: Optional[str] = None) -> bool:
        """A command answering the state ``stamp`` (None: unstamped) with ``tau`` (or
        refused with ``error``), received at ``arrived_ns`` (CLOCK_REALTIME).  Returns
        whether lockstep stepped the plant (the caller then publishes the next state).
        Call with :attr:`lock` held."""
        if stamp is not None:
            sent = self._published_at.get(stamp)
            if sent is not None:
                lat = arrived_ns - sent
                self.latency_ns.add(lat)
                if lat > self.dt * 1e9:
                    self.count("late_commands")
        if error is not None:
            self.count("rejected_commands")
            self.log("error", f"command rejected ({error}); safe action ({self.p['safe_mode']})", "bad")
            if self.lockstep and (stamp == self.stamp or (stamp is None and self._accepts_unstamped)):
                self.safe_step()
                return True
            return False
        if self.lockstep:
            if stamp is not None and stamp != self.stamp:
                self.count("stale_commands")
                self.log("warning", f"command for t={stamp * 1e-9:.4f} s ignored: waiting for"
                                    f" t={self.stamp * 1e-9:.4f} s", "stale")
                return False
            if stamp is None:
                self.count("unstamped_commands")
                if not self._accepts_unstamped:
                    self.log("warning", "unstamped command ignored in lockstep (commands must carry the stamp of"
                                        " the state they answer; set lockstep_accept_unstamped to accept them)",
                             "unstamped")
                    return False
            self.plant.step(tau)
            self.count("steps")
            return True
        self._latest_cmd = tau
        self._latest_cmd_time = self.plant.time
        self._latest_stamp = stamp
        if not self._ahead and stamp is not None and stamp == self.stamp:
            # the answer to the last state: step now, while the loop waits for its tick;
            # the tick then only publishes (the state is released at its time)
            self.plant.step(tau)
            self.count("steps")
            self._ahead = True
            # the loop may take it only after the tick was due (it woke late): the step
            # still uses it, but the answer missed its deadline
            self._ahead_late = arrived_ns > self._deadline_rt
        return False

    @property
    def answered(self) -> bool:
        """Real time: the step to the next tick's state is done (its command came)."""
        return self._ahead

    @property
    def _accepts_unstamped(self) -> bool:
        return bool(self.p["lockstep_accept_unstamped"])

    def lockstep_timed_out(self) -> bool:
        """Lockstep: no command for the last state within ``lockstep_timeout`` wall seconds
        (counted and logged; the caller steps with the safe action)."""
        if time.monotonic() - self.sent_wall <= self.p["lockstep_timeout"]:
            return False
        self.count("lockstep_timeouts")
        self.log("warning", f"no command for t={self.stamp * 1e-9:.4f} s within {self.p['lockstep_timeout']} s"
                            " (wall); stepping with the safe action", "lockstep")
        return True

    # ------------------------------------------------------------------ real time
    def run_realtime(self, *, wait_until: Callable[[int], None], running: Callable[[], bool],
                     done: Callable[[], bool], after_step: Callable[[], None], between: Callable[[], None],
                     stall: Callable[[], None] = lambda: None) -> None:
        """Every period: ``wait_until(tick)`` (taking commands as they arrive), then the
        step due at the tick (:meth:`_tick`) and ``after_step()`` (publish), then
        ``between()`` (diagnostics in the slack); until ``running()`` is false, or
        ``done()`` (checked with :attr:`lock` held: it must take no other lock, e.g. not
        rclpy's context, which a shutdown holds while it waits for this lock).  The loop
        thread runs one SCHED_FIFO priority above its process (when the process has
        one): the ticks go first.  ``stall``: a fault drill, called once per period."""
        period_ns = int(round(self.dt * 1e9))
        clock = time.perf_counter_ns
        raise_thread_priority(1)
        nxt = clock() + period_ns
        self._deadline_rt = nxt + (time.time_ns() - clock())
        while running():
            wait_until(nxt)
            late = clock() - nxt
            self.tick_late_ns.add(max(late, 0))
            events = []
            if late > period_ns:
                self.count("late_steps")
            nxt += period_ns
            if (behind := clock() - nxt) > 10 * period_ns:
                # far behind: resynchronise.  The periods given up had no control at all
                # (the loop itself stalled): missed, as far as the robot is concerned
                nxt = clock() + period_ns
                skipped = behind // period_ns + 1    # the tick slots up to now, this one's aside
                events = self.overload.skipped(skipped)
                self.count("skipped_periods", skipped)
            stall()
            with self.lock:
                if done():
                    break
                self._deadline_rt = nxt + (time.time_ns() - clock())
                event = self._tick()
                if event is not None:
                    events.append(event)
                after_step()
            for event in events:
                self._overload_event(event)
            between()

    def _tick(self) -> Optional[str]:
        """The step due at a tick: done already if its answer came, else on the newest
        valid command within ``command_timeout`` (a deadline miss), else the safe action."""
        missed = self._ahead_late
        if not self._ahead:
            cmd = self._latest_cmd
            # the answer to the last state is not here (before the first one: start-up)
            missed = missed or (cmd is not None and self._latest_stamp is not None)
            age = self.plant.time - self._latest_cmd_time
            if cmd is not None and age <= self.p["command_timeout"]:
                self.plant.step(cmd)
                self.count("steps")
                if age > self._cmd_age_max:
                    self._cmd_age_max = age
                    self.gauge("command_age_max_ms", round(1e3 * age, 3))
            else:
                if cmd is not None:
                    self.log("warning", f"no valid command for {self.p['command_timeout']} s: safe action"
                                        f" ({self.p['safe_mode']})", "rt_timeout")
                self.count("command_timeouts" if cmd is not None else "startup_steps")
                self.safe_step()
        if missed:
            self.count("deadline_misses")
        self._ahead = self._ahead_late = False
        return self.overload.tick(missed)

    def _overload_event(self, event: str) -> None:
        """Log an overload episode's start and end (at most one line per episode)."""
        o = self.overload
        o_sum = o.summary()
        for k in ("overload_active", "overload_longest_ms", "overload_last_ms"):
            self.gauge(k, o_sum[k])
        if event == "start":
            self.gauge("overload_episodes", o.count)
            self.log("warning", f"overload: {o.start_misses} of the last {o.window} cycles missed their deadline"
                                f" (episode {o.count}); running on the newest command within command_timeout,"
                                " then the safe action")
        else:
            e = o.episodes[-1]
            self.log("info", f"overload episode {o.count} over: {e['missed']} missed cycles in"
                             f" {e['duration_ms']:.0f} ms; back on time for {o.quiet} cycles")

    # ------------------------------------------------------------------ statistics
    def stats(self, counters: dict, window: Optional[int] = None) -> dict:
        """``counters`` with the run's figures: over every retained sample (the final
        statistics) or the last ``window`` (periodic diagnostics: cheap)."""
        lat = (self.latency_ns.all() if window is None else self.latency_ns.recent(window)) * 1e-6
        out = dict(counters)
        end = self.end_wall if self.end_wall is not None else time.monotonic()
        wall = (end - self.run_wall0) if self.started else 0.0
        out.update({"wall_time": wall, "sim_per_wall": (self.plant.time / wall) if wall > 0 else 0.0,
                    "sim_time": self.plant.time, "plant_steps": int(self.plant.steps),
                    "saturation_count": self.plant.saturation_count.tolist(),
                    "latency_samples": int(self.latency_ns.total)})
        if lat.size:
            out.update({"latency_p50_ms": float(np.percentile(lat, 50)),
                        "latency_p99_ms": float(np.percentile(lat, 99)),
                        "latency_max_ms": float(lat.max())})
        tick = (self.tick_late_ns.all() if window is None else self.tick_late_ns.recent(window)) * 1e-6
        if tick.size:
            out.update({"tick_late_p99_ms": float(np.percentile(tick, 99)), "tick_late_max_ms": float(tick.max())})
        if not self.lockstep:
            out.update(self.overload.summary())
            out["command_age_max_ms"] = round(1e3 * self._cmd_age_max, 3)
            if window is None:
                out["overload"] = self.overload.all_episodes()   # an episode still running at the end too
                out["missed_ticks"] = self.missed_ticks.all().tolist()
                out["ticks"] = self.overload.ticks
        return out

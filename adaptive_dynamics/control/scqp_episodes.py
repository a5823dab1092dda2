"""SCQP's episodes (Algorithm 1) around one :class:`~.scqp.SCQPController`, without ROS.

:class:`SCQPSession` is everything the ``scqp_controller`` node does besides converting
messages:

* **control instants** at ``rate_hz``: a state stamped at least one period (less the
  tolerance) after the last instant is one; any other state gets that instant's torque
  again (zero-order hold, what the residual model assumes).  A gap of more than 1.5
  periods is an overrun: no GP sample is kept across it;
* **episodes**: :meth:`~SCQPSession.request_start` starts one at the next control instant
  (the MRAC reference model reset to the arm's state, GP samples collected);
  :meth:`~SCQPSession.end_episode` stops collecting and refits the GP on a worker thread
  -- the cycle never waits for it -- swapping the new GP in when done, then saves;
* **the state file** (``.npz``, atomic): the GP, the samples not in it yet (also those of
  a refit in flight), the MRAC gains and the episode count, with the robot, joints and
  frames it belongs to.  A file that cannot be loaded is renamed
  ``<file>.corrupt-<time>`` (nothing learned is deleted) and the session starts fresh.

The cycle, the episodes, the refit's swap, the save and the load take ``lock`` (the
node's: its parameter callbacks change the controller under the same lock);
:meth:`~SCQPSession.diagnostics` reads counters and norms without it.  Messages go to ``log(level,
text, key)``; ``key`` names a message that may repeat every cycle (a node throttles by it).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Optional

import numpy as np

from ..files import atomic_write
from .reporting import Reporting
from .scqp import SCQPController

__all__ = ["STATE_FORMAT", "STATE_VERSION", "SCQPSession"]

STATE_FORMAT = "adaptive_dynamics.scqp_state"
STATE_VERSION = 1
#: events counted as they happen (the caller's ``count``); the cycle counts are figures
LIVE_COUNTS = ("overruns", "rejected_inputs", "nonfinite_torque", "refit_failures")

class SCQPSession(Reporting):
    """One SCQP controller run in episodes, with its rate, refits and state file.

    Parameters
    ----------
    ctrl:
        The controller (its ``collect`` is switched by the episodes).
    rate_hz:
        Control instants per second.
    lock:
        Guards ``ctrl`` (shared with whoever changes its settings live).
    header:
        ``robot``, ``joints``, ``frame`` and ``world_frame`` written with the state and
        required of a loaded one.
    state_file:
        Where the state is saved and loaded from (``""``: nowhere).
    auto_start:
        Start the first episode with the first control instant.
    posture_from_state:
        Take the QP's posture target from the first state.
    compensates_gravity:
        The robot adds g(q): it is taken off the computed torque.
    log, count:
        Where messages go (``log(level, text, key)``) and the events of :data:`LIVE_COUNTS`
        as they happen (``count(key)``; without it they are in :meth:`diagnostics`).
    """

    def __init__(self, ctrl: SCQPController, *, rate_hz: float, lock, header: dict, state_file: str = "",
                 auto_start: bool = False, posture_from_state: bool = False, compensates_gravity: bool = False,
                 log: Optional[Callable[..., None]] = None, count: Optional[Callable[[str], None]] = None):
        self.ctrl, self.lock, self.header = ctrl, lock, dict(header)
        self.period_ns = int(round(1e9 / float(rate_hz)))
        self.state_file = state_file
        self.compensates_gravity = bool(compensates_gravity)
        super().__init__("scqp", LIVE_COUNTS, log, count)
        self.counts.update(computed_cycles=0, held_cycles=0)   # figures, in the diagnostics
        ctrl.collect = False
        self.episode = 0
        self.in_episode = False
        self._start_request = bool(auto_start)
        self._restart = False                      # a watchdog trip released: start from the arm's state
        self.save_requested = False                # a watchdog trip: save at the next chance
        self._posture_from_state = bool(posture_from_state)
        self._last_compute: Optional[int] = None   # stamp of the last control instant
        self._held: Optional[np.ndarray] = None    # its torque (None: the safe command)
        self._refit_thread: Optional[threading.Thread] = None
        self._refit_job = None
        self._save_lock = threading.Lock()
        self.refits = 0
        self.last_refit_s = 0.0
        self._solve_us: list = []
        self._cycle_us: list = []
        self._err: list = []

    # ------------------------------------------------------------- the cycle
    def held(self, stamp: int, tolerance_ns: int) -> tuple:
        """``(True, torque)`` for a state between control instants (``torque`` None: the
        safe command was held), ``(False, None)`` at a control instant."""
        if self._last_compute is not None and stamp - self._last_compute < self.period_ns - tolerance_ns:
            self.counts["held_cycles"] += 1
            return True, None if self._held is None else self._held.copy()
        return False, None

    def control(self, stamp: int, q, v, ref) -> Optional[np.ndarray]:
        """The torque of the control instant ``stamp`` for the task reference ``ref``
        (``position``, ``rotation``, ``twist``, ``accel``), in model joint order; ``None``:
        send the safe command (the reason was logged; no sample of this period is kept)."""
        t0 = time.perf_counter()
        ctrl = self.ctrl
        with self.lock:
            if self._posture_from_state:
                ctrl.qp.q_posture = np.array(q, dtype=float)
                self._posture_from_state = False
            if self._restart or self._start_request:   # the MRAC reference model from the arm's state
                ctrl.start_episode(q, v)
                self._restart = False
            if self._start_request:
                self._start_request = False
                self.episode += 1
                self.in_episode = True
                ctrl.collect = ctrl.uses_gp
                self.log("info", f"episode {self.episode} started at t={stamp * 1e-9:.4f} s")
            if self._last_compute is not None and stamp - self._last_compute > 1.5 * self.period_ns:
                ctrl.discard_last()
                self._count("overruns")
            tw = ref.twist if ref.twist is not None else np.zeros(6)
            acc = ref.accel if ref.accel is not None else np.zeros(6)
            try:
                tau = ctrl.compute(q, v, ref.position, tw[:3], acc[:3], R_d=ref.rotation, w_d=tw[3:], wdot_d=acc[3:])
            except ValueError as exc:   # non-finite reference model / gains: nothing changed
                self._count("rejected_inputs")
                self.log("error", f"cycle rejected ({exc}); safe command", "core")
                tau = None
            res = ctrl.last
        if tau is not None:
            self._solve_us.append(res.solve_time_s * 1e6)
            if not res.ok:
                self.log("warning", f"QP {res.status} (fallback torque; {ctrl.qp.fallbacks} so far)", "qp")
            self.counts["computed_cycles"] += 1
            self._err.append(float(np.linalg.norm(ref.position - ctrl.model.frame_pose(q)[:3, 3])))
            if self.compensates_gravity:
                tau = tau - ctrl.model.gravity(q)
            self._cycle_us.append((time.perf_counter() - t0) * 1e6)
            if not np.all(np.isfinite(tau)):
                self._count("nonfinite_torque")
                self.log("error", "the controller produced a non-finite torque; safe command", "nan")
                tau = None
        if tau is None:
            self.answered_safe(stamp)
            return None
        self._held = tau.copy()
        self._last_compute = stamp
        return tau

    def answered_safe(self, stamp: int) -> None:
        """A control instant answered with the safe command: held until the next one, and
        the controller keeps no sample of this period."""
        self._held = None
        self._last_compute = stamp
        with self.lock:
            self.ctrl.discard_last()

    def tripped(self) -> None:
        """The loop watchdog tripped: the caller answers with its safe command (nothing is
        computed, so nothing is learned) until :meth:`released`; the state is saved at
        the caller's next chance (:attr:`save_requested`)."""
        self.save_requested = True

    def released(self) -> None:
        """A trip released: the next control instant starts from the arm's state (the MRAC
        reference model reset, no sample across the trip), an episode goes on."""
        self._restart = True

    # ------------------------------------------------------------- episodes
    @property
    def refit_running(self) -> bool:
        return self._refit_thread is not None and self._refit_thread.is_alive()

    def request_start(self) -> tuple:
        """Start an episode at the next control instant: ``(accepted, message)``."""
        with self.lock:
            if self.in_episode or self._start_request:
                return False, f"episode {self.episode + int(self._start_request)} is running: end it first"
            self._start_request = True
            refit = self.refit_running
        return True, (f"episode {self.episode + 1} starts at the next control instant"
                      + (" (the GP refit of the last episode is still running; its GP is swapped in when done)"
                         if refit else ""))

    def end_episode(self) -> tuple:
        """Stop collecting and refit the GP in the background: ``(accepted, message)``."""
        with self.lock:
            if not self.in_episode:
                return False, "no episode is running"
            if self.refit_running:
                return False, "the refit of the previous episode is still running"
            self.in_episode = False
            self.ctrl.collect = False
            ep = self.episode
            job = self.ctrl.residual.begin_refit() if self.ctrl.uses_gp else None
            self._refit_job = job
            new = 0 if job is None else job.new_X.shape[0]
            total = 0 if job is None else min(job.X.shape[0] + new, self.ctrl.residual.gp.max_points)
            self._refit_thread = threading.Thread(target=self._refit, args=(job, ep), name="scqp_refit", daemon=True)
            self._refit_thread.start()
        return True, (f"episode {ep} ended: " + (f"{new} new samples; the GP is refitted on {total} points in the"
                                                 " background" if job is not None else "no GP in mode mrac")
                      + (", then saved" if self.state_file else ""))

    def _refit(self, job, episode: int) -> None:
        """Worker thread: the refit (nothing shared touched), the swap, the save."""
        if job is not None:
            t0 = time.perf_counter()
            try:
                gp = job.run()
            except Exception as exc:  # noqa: BLE001 -- a failed refit keeps the old GP and the samples
                with self.lock:
                    self.ctrl.residual.abort_refit(job)
                    self._refit_job = None
                self._count("refit_failures")
                self.log("error", f"episode {episode}: GP refit failed ({type(exc).__name__}: {exc}); the previous"
                                  " GP stays, the samples are kept for the next refit")
                return
            dt = time.perf_counter() - t0
            with self.lock:
                self.ctrl.residual.finish_refit(gp)
                self._refit_job = None
                self.refits += 1
                self.last_refit_s = dt
            self.log("info", f"episode {episode}: GP refitted on {gp.n_points} points in {dt:.2f} s, now in use")
        try:
            path = self.save()
            if path:
                self.log("info", f"state saved to {path}")
        except OSError as exc:
            self.log("error", f"saving the state failed: {exc}")

    def wait_refit(self, timeout: float = 60.0) -> None:
        t = self._refit_thread
        if t is not None and t.is_alive():
            self.log("info", "waiting for the running GP refit before saving")
            t.join(timeout=timeout)

    # ------------------------------------------------------------- the state file
    def save(self) -> Optional[str]:
        """Write the state file now (``None``: no ``state_file``)."""
        path = self.state_file
        if not path:
            return None
        with self._save_lock:
            with self.lock:   # references and small copies only: the cycle waits microseconds
                job = self._refit_job   # a refit in flight: its new samples are not in the GP yet
                snap = self.ctrl.snapshot(None if job is None else (job.new_X, job.new_Y))
                episode = self.episode
            h = self.header
            arrays = {"format": np.array(STATE_FORMAT), "version": np.array(STATE_VERSION),
                      "robot": np.array(h["robot"]), "joints": np.array(list(h["joints"])),
                      "frame": np.array(h["frame"]), "world_frame": np.array(h["world_frame"]),
                      "episode": np.array(episode), **self.ctrl.state_dict(snap)}
            atomic_write(path, lambda fh: np.savez(fh, **arrays))
            return path

    def load_or_set_aside(self, *, residual: dict, mrac: dict) -> str:
        """Load ``state_file`` if there is one (``residual`` / ``mrac``: the settings to
        rebuild them with); a file that cannot be loaded is kept under another name and
        the session starts fresh.  Returns what happened, for the node's diagnostics."""
        path = self.state_file
        if not path:
            return "not set"
        if not os.path.exists(path):
            self.log("info", f"state_file {path} does not exist yet: starting fresh")
            return "new"
        try:
            return self._load(path, residual, mrac)
        except Exception as exc:  # noqa: BLE001 -- any unreadable file: keep it, start fresh
            kept = f"{path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
            try:
                os.replace(path, kept)
            except OSError as exc2:
                kept = f"{path} (could not be renamed: {exc2})"
            self.log("error", f"state_file {path} refused ({type(exc).__name__}: {exc}); kept as {kept};"
                              " starting with no learned state")
            return f"refused: {exc}"

    def _load(self, path: str, residual: dict, mrac: dict) -> str:
        with np.load(path, allow_pickle=False) as f:
            d = {k: f[k] for k in f.files}
        if str(d.get("format", "")) != STATE_FORMAT:
            raise ValueError(f"not an SCQP state file (format {str(d.get('format', 'missing'))!r})")
        if int(d["version"]) != STATE_VERSION:
            raise ValueError(f"state file version {int(d['version'])}, this node reads {STATE_VERSION}")
        h = self.header
        joints, frame = [str(j) for j in d["joints"]], str(d["frame"])
        if joints != list(h["joints"]) or frame != h["frame"] or str(d["world_frame"]) != h["world_frame"]:
            raise ValueError(f"saved for joints {joints}, frame {frame!r} in {str(d['world_frame'])!r}; this"
                             f" node controls {list(h['joints'])}, {h['frame']!r} in {h['world_frame']!r}")
        # the GP (this node's cap on its points), its pending samples, the MRAC's gains (a new
        # episode starts from the arm's state)
        with self.lock:
            self.ctrl.load_state_dict(d, where=path, residual=residual, mrac=mrac)
            self.episode = int(d["episode"])
        res = self.ctrl.residual
        self.log("info", f"state loaded from {path}: episode {self.episode}, GP {res.n_points} points"
                         f" (+{res.pending} pending samples), MRAC gains of mode {str(d['mode'])}")
        return f"loaded ({self.episode} episodes)"

    # ------------------------------------------------------------- diagnostics
    def diagnostics(self) -> dict:
        """Figures since the last call (timings and task error drained) and counts."""
        ctrl = self.ctrl
        qp = ctrl.qp
        vals = {"qp_status": qp.last_status, "qp_solves": qp.solves, "qp_fallbacks": qp.fallbacks,
                "episode": self.episode, "in_episode": self.in_episode,
                "gp_points": ctrl.residual.n_points, "gp_pending": ctrl.residual.pending,
                "refit_running": self.refit_running, "refits": self.refits,
                "last_refit_s": round(self.last_refit_s, 3),
                "mrac_adapt": ctrl.mrac.adapt, "mrac_clipped": sum(ctrl.mrac.clip_counts.values()),
                "computed_cycles": self.counts["computed_cycles"], "held_cycles": self.counts["held_cycles"],
                **self.unreported_counts()}
        for k, val in ctrl.mrac.gain_norms.items():
            vals[f"{k}_norm"] = round(val, 6)
        for name, buf, top, pct in (("solve", self._solve_us, "max", 100), ("cycle", self._cycle_us, "p99", 99)):
            if buf:
                t = np.asarray(buf)
                buf.clear()
                vals[f"{name}_p50_us"] = round(float(np.percentile(t, 50)), 1)
                vals[f"{name}_{top}_us"] = round(float(np.percentile(t, pct)), 1)
        if self._err:
            e = np.asarray(self._err)
            self._err.clear()
            vals["task_error_rms_mm"] = round(float(np.sqrt(np.mean(e ** 2))) * 1e3, 4)
            vals["task_error_max_mm"] = round(float(e.max()) * 1e3, 4)
        return vals

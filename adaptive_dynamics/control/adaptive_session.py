"""The ``adaptive_controller`` node's laws run cycle by cycle, without ROS.

:class:`AdaptiveSession` takes one state (and its reference, measured torque, residual
feed-forward and, with ``regressor_source: topics``, its regressors) to one torque
through the law named for the cycle (:class:`~.adaptive_setup.AdaptiveLaws`: the
learning core, adaptive backstepping around it, or a fixed-estimate law), and keeps what
the node publishes and saves about the estimate: the updates summed between two
``adaptive/parameter_update`` messages, the cycle count that decimates the streams,
whether the estimate changed since it was saved, the initial estimate a reset returns to.

``lock`` guards the laws (shared with whoever changes gains live); messages go to
``log(level, text, key)`` (``key``: a message that may repeat every cycle, throttled by
the caller), counted events to ``count(key)`` as they happen.
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable, Optional

import numpy as np

from .adaptive_setup import AdaptiveLaws
from .reporting import Reporting

__all__ = ["ADAPTIVE_LAWS", "AdaptiveSession"]

#: the laws that learn (the others use a fixed estimate)
ADAPTIVE_LAWS = ("direct", "composite", "backstepping")
_ZERO6 = np.zeros(6)


class AdaptiveSession(Reporting):
    """One node's adaptive laws, their streams and their estimate file (see the module)."""

    def __init__(self, laws: AdaptiveLaws, *, lock, estimate_file: str = "",
                 log: Optional[Callable[..., None]] = None, count: Optional[Callable[[str], None]] = None):
        self.laws, self.lock, self.estimate_file = laws, lock, estimate_file
        self.core, self.bs, self.task = laws.core, laws.bs, laws.task
        self.theta0 = laws.theta0
        super().__init__("adaptive", ("no_measured_torque", "singular_damping_cycles", "residual_used",
                                      "residual_missing"), log, count)
        self.cycles = 0
        self.dirty = False
        self.last_save = time.monotonic()
        self._save_lock = threading.Lock()
        self._dpi_acc = np.zeros(self.core.model.n_params)
        self._acc_n = 0
        self._task_err: list = []
        self._timing_us: list = []

    # ------------------------------------------------------------------ the cycle
    def cycle(self, law: str, q, v, ref, qd, qdd, effort, *, learning: bool, regressors: Optional[dict] = None,
              residual=None, residuals_seen: bool = False) -> Optional[np.ndarray]:
        """The torque of ``law`` for one state (model joint order), or ``None`` for the
        safe command (a non-finite input: the estimate is untouched).  ``ref``: the joint
        reference (``.q``; ``qd``, ``qdd`` beside it) or, for backstepping, the task
        reference (``position``, ``rotation``, ``twist``, ``accel``); ``effort``: the
        measured torque (None: the composite law does not learn this cycle);
        ``residual``: the feed-forward stamped for this state (``residuals_seen``: some
        were received, so a missing one is counted)."""
        adaptive = law in ADAPTIVE_LAWS
        core = self.laws.law_core(law)
        learn = adaptive and learning
        if learn and core.law == "composite" and effort is None:
            learn = False
            self._count("no_measured_torque")
        try:
            with self.lock:
                if self.task:
                    bs = self.bs
                    tau = bs.compute(q, v, ref.position, ref.rotation,
                                     ref.twist if ref.twist is not None else _ZERO6,
                                     ref.accel if ref.accel is not None else _ZERO6, tau_measured=effort, learn=learn)
                    e = bs.ref.e
                    self._task_err.append(math.sqrt(e.dot(e)))
                    if bs.ref.lam2 > 0.0:
                        self._count("singular_damping_cycles")
                else:
                    tau = core.compute(q, v, ref.q, qd, qdd, tau_measured=effort, learn=learn,
                                       feedforward=residual, **(regressors or {}))
        except ValueError as exc:  # non-finite input: estimate untouched
            self.log("error", f"cycle rejected ({exc}); safe command, estimate frozen", "core")
            return None
        if core.frozen:
            self.log("warning", f"learning frozen: {core.freeze_reason}", "frozen")
        if residual is not None:
            if self.task:   # (the joint-space law adds it itself)
                tau += residual
            self._count("residual_used")
        elif residuals_seen:
            self._count("residual_missing")
        self.cycles += 1
        if adaptive and core.updated:
            self._dpi_acc += core.last_delta_pi
            self._acc_n += 1
            self.dirty = True
        return tau

    def cycle_time(self, seconds: float) -> None:
        """The caller's whole cycle of a computed torque (conversions and publishing
        included), for the figures."""
        self._timing_us.append(seconds * 1e6)

    def update_due(self, decimation: int) -> Optional[np.ndarray]:
        """The estimate's updates summed since the last call that returned them (full
        coordinates), every ``decimation`` cycles that follow an update; else None."""
        if not self._acc_n or self.cycles % decimation:
            return None
        out = self._dpi_acc.copy()
        self._dpi_acc.fill(0.0)
        self._acc_n = 0
        return out

    # ------------------------------------------------------------------ the estimate
    def resume(self) -> bool:
        """Load ``estimate_file`` when it exists (``ValueError`` naming what differs: a
        learned estimate is never silently discarded); whether one was loaded."""
        path = self.estimate_file
        if not path or not os.path.exists(path):
            return False
        with self.lock:
            self.core.load_state(path)
        return True

    def save(self) -> Optional[str]:
        """Write ``estimate_file`` now (None: not set); the cycle only waits for the snapshot."""
        path = self.estimate_file
        if not path:
            return None
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with self._save_lock:   # one writer at a time
            with self.lock:
                state = self.core.state_dict()
                self.dirty = False
            last, self.last_save = self.last_save, time.monotonic()
            try:
                return self.core.save(path, state)
            except BaseException:
                self.dirty, self.last_save = True, last   # not written: retry at the next period
                raise

    def autosave_due(self, period: float) -> bool:
        return self.dirty and period > 0 and time.monotonic() - self.last_save > period

    def reset_estimate(self) -> None:
        """Back to the initial estimate, covariance and filters restarted."""
        with self.lock:
            self.core.set_estimate(theta=self.theta0)
            self.core.reset_covariance()
            self.core.reset_filter()
            self._dpi_acc.fill(0.0)
            self._acc_n = 0

    def tripped(self) -> None:
        """The watchdog tripped: the estimate stays (the safe command adapts nothing) and is
        due for saving at once."""
        self.last_save = -float("inf")

    def released(self) -> None:
        """A trip released: the composite law's filters restart (their states are from before)."""
        with self.lock:
            self.core.reset_filter()

    # ------------------------------------------------------------------ diagnostics
    def diagnostics(self) -> dict:
        """The core's figures, per adapted link its mass and CoM, the task error and the
        cycle time since the last call."""
        d = self.core.diagnostics()
        vals = {k: d[k] if not isinstance(d[k], float) else round(d[k], 6)
                for k in ("updates", "frozen_cycles", "rejected_inputs", "projections", "p_norm", "forgetting")}
        vals.update(self.unreported_counts())
        if self._task_err:
            e = np.asarray(self._task_err)
            self._task_err.clear()
            vals["task_error_rms"] = round(float(np.sqrt(np.mean(e * e))), 6)
            vals["task_error_max"] = round(float(e.max()), 6)
        for link in self.core.adapted_links or ():
            est = self.core.link_estimate(link)
            vals[f"{link}_mass"] = round(est["mass"], 5)
            vals[f"{link}_com"] = [round(c, 5) for c in est["com"]]
        if self._timing_us:
            t = np.asarray(self._timing_us)
            self._timing_us.clear()
            vals["cycle_p50_us"] = round(float(np.percentile(t, 50)), 1)
            vals["cycle_p99_us"] = round(float(np.percentile(t, 99)), 1)
        return vals

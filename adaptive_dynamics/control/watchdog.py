"""A controller that notices: the loop watchdog of every joint-space controller (no ROS).

Fed once per control cycle with the state's stamp, the position error ``q_d - q`` (when
the reference is a joint one) and the sign of each joint's saturation (+1 / -1 at the
upper / lower effort limit, 0 inside), it *trips* when on some joint

* ``|q_d - q|`` stayed above its bound (or non-finite) for ``window`` s, or
* the command *chattered* between its limits -- saturated within the last
  :data:`CHATTER_GAP` s at both limits -- for ``window`` s (a gain set the plant cannot
  take: the sampled loop's oscillation at a few periods per cycle), or
* the command stayed saturated at one limit for ``saturation_window`` s (an arm that
  cannot hold its load; a start-up transient from a zero estimate saturates for some
  tens of ms and recovers).

Times are in seconds of state stamps (consecutive cycles).
Tripped, it stays tripped -- the controller answers with its safe command and adapts
nothing -- until :meth:`reset`.  :meth:`default_error_bound` scales the error bound to
each joint's range.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["LoopWatchdog", "default_error_bound", "CHATTER_GAP"]

#: saturation at the other limit within this many seconds counts as chatter
CHATTER_GAP = 0.01


def default_error_bound(lower, upper) -> np.ndarray:
    """Per joint: 20 % of the joint's range, within [0.2, 1.0] rad (a joint without limits:
    1.0 rad)."""
    rng = np.asarray(upper, dtype=float) - np.asarray(lower, dtype=float)
    rng = np.where(np.isfinite(rng), rng, np.inf)
    return np.clip(0.2 * rng, 0.2, 1.0)


class LoopWatchdog:
    """See the module docstring.  ``error_bound`` [rad] (scalar or per joint), ``window``
    [s]; ``names`` label the joints in :attr:`reason`."""

    def __init__(self, names, error_bound, window: float = 0.05, saturation_window: float = 0.5):
        self.names = list(names)
        n = len(self.names)
        self.error_bound = np.broadcast_to(np.asarray(error_bound, dtype=float), (n,)).copy()
        if not np.all(self.error_bound > 0):
            raise ValueError(f"error_bound must be > 0, got {self.error_bound.tolist()}")
        if not window > 0:
            raise ValueError(f"window must be > 0 [s], got {window}")
        if not saturation_window > 0:
            raise ValueError(f"saturation_window must be > 0 [s], got {saturation_window}")
        self.window, self.saturation_window = float(window), float(saturation_window)
        self.trips = 0
        self.tripped = False
        self.reason = ""
        self.joint: Optional[str] = None
        self.tripped_at: Optional[float] = None
        self._err_since = np.full(n, np.nan)   # stamp [s] since which the condition holds, NaN = not holding
        self._sat_since = np.full(n, np.nan)
        self._chat_since = np.full(n, np.nan)
        self._last_hi = np.full(n, -np.inf)     # stamp of the last saturation at +limit / -limit
        self._last_lo = np.full(n, -np.inf)

    def reset(self) -> None:
        """Release a trip (the counters of held conditions restart)."""
        self.tripped, self.reason, self.joint, self.tripped_at = False, "", None, None
        for a in (self._err_since, self._sat_since, self._chat_since):
            a[:] = np.nan
        self._last_hi[:] = -np.inf
        self._last_lo[:] = -np.inf

    @staticmethod
    def _hold(since: np.ndarray, now: float, cond: np.ndarray) -> np.ndarray:
        since[~cond] = np.nan
        start = cond & np.isnan(since)
        since[start] = now
        return np.where(cond, now - since, 0.0)

    def update(self, t: float, error=None, saturated=None) -> bool:
        """One cycle at stamp ``t`` [s]; ``saturated``: per joint +1 / -1 (at the upper /
        lower limit) or 0; True when this cycle trips the watchdog."""
        if self.tripped:
            return False
        t = float(t)
        lasting_e = np.zeros(len(self.names))
        if error is not None:
            e = np.abs(np.asarray(error, dtype=float))
            bad = ~np.isfinite(e) | (e > self.error_bound)
            lasting_e = self._hold(self._err_since, t, bad)
        lasting_s = lasting_c = np.zeros(len(self.names))
        if saturated is not None:
            sgn = np.sign(np.asarray(saturated, dtype=float))
            self._last_hi[sgn > 0] = t
            self._last_lo[sgn < 0] = t
            lasting_s = self._hold(self._sat_since, t, sgn != 0)
            chatter = (t - self._last_hi <= CHATTER_GAP + 5e-7) & (t - self._last_lo <= CHATTER_GAP + 5e-7)
            lasting_c = self._hold(self._chat_since, t, chatter)
        # ">= window - half a microsecond": stamps in ns, cycles of exact periods
        hit_e = lasting_e >= self.window - 5e-7
        hit_c = lasting_c >= self.window - 5e-7
        hit_s = lasting_s >= self.saturation_window - 5e-7
        if not (hit_e.any() or hit_c.any() or hit_s.any()):
            return False
        self.tripped, self.trips, self.tripped_at = True, self.trips + 1, t
        kind = "chatter" if hit_c.any() else "saturation" if hit_s.any() else "error"
        lasting = {"chatter": lasting_c, "saturation": lasting_s, "error": lasting_e}[kind]
        j = int(np.argmax(lasting))
        ms, self.joint = lasting[j] * 1e3, self.names[j]
        what = {
            "chatter": f"command chattering between its effort limits for {ms:.0f} ms (window"
                       f" {self.window * 1e3:.0f} ms): the loop is unstable (gains too high for the control period"
                       " and the joint's inertia?)",
            "saturation": f"command saturated at its effort limit for {ms:.0f} ms (window"
                          f" {self.saturation_window * 1e3:.0f} ms): the arm cannot hold its load or follow the"
                          " reference",
            "error": f"|q_d - q| above {self.error_bound[j]:.3g} rad for {ms:.0f} ms"
                     f" (window {self.window * 1e3:.0f} ms)",
        }[kind]
        self.reason = f"joint {self.joint}: {what}"
        return True

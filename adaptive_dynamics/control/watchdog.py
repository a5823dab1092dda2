"""A controller that notices: the loop watchdog of every joint-space controller (no ROS).

Fed once per control cycle with the state's stamp, the position error ``q_d - q`` (when
the reference is a joint one) and which joints' commands hit their effort limit, it
*trips* when on some joint

* ``|q_d - q|`` stayed above its bound, or
* the command stayed saturated

for longer than ``window`` seconds of stamps (consecutive cycles).  A diverging loop or
a gain set the plant cannot take (a wrist banging between its limits) shows both within
a few cycles; a tracking transient or a brief saturation peak does not last the window.
Tripped, it stays tripped -- the controller answers with its safe command and adapts
nothing -- until :meth:`reset`.  :meth:`default_error_bound` scales the error bound to
each joint's range.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

__all__ = ["LoopWatchdog", "default_error_bound"]


def default_error_bound(lower, upper) -> np.ndarray:
    """Per joint: 20 % of the joint's range, within [0.2, 1.0] rad (a joint without limits:
    1.0 rad)."""
    rng = np.asarray(upper, dtype=float) - np.asarray(lower, dtype=float)
    rng = np.where(np.isfinite(rng), rng, np.inf)
    return np.clip(0.2 * rng, 0.2, 1.0)


class LoopWatchdog:
    """See the module docstring.  ``error_bound`` [rad] (scalar or per joint), ``window``
    [s]; ``names`` label the joints in :attr:`reason`."""

    def __init__(self, names, error_bound, window: float = 0.05):
        self.names = list(names)
        n = len(self.names)
        self.error_bound = np.broadcast_to(np.asarray(error_bound, dtype=float), (n,)).copy()
        if not np.all(self.error_bound > 0):
            raise ValueError(f"error_bound must be > 0, got {self.error_bound.tolist()}")
        if not window > 0:
            raise ValueError(f"window must be > 0 [s], got {window}")
        self.window = float(window)
        self.trips = 0
        self.tripped = False
        self.reason = ""
        self.joint: Optional[str] = None
        self.tripped_at: Optional[float] = None
        self._err_since = np.full(n, np.nan)   # stamp [s] since which the condition holds, NaN = not holding
        self._sat_since = np.full(n, np.nan)

    def reset(self) -> None:
        """Release a trip (the counters of held conditions restart)."""
        self.tripped, self.reason, self.joint, self.tripped_at = False, "", None, None
        self._err_since[:] = np.nan
        self._sat_since[:] = np.nan

    @staticmethod
    def _hold(since: np.ndarray, now: float, cond: np.ndarray) -> np.ndarray:
        since[~cond] = np.nan
        start = cond & np.isnan(since)
        since[start] = now
        return np.where(cond, now - since, 0.0)

    def update(self, t: float, error=None, saturated=None) -> bool:
        """One cycle at stamp ``t`` [s]; True when this cycle trips the watchdog."""
        if self.tripped:
            return False
        t = float(t)
        lasting_e = np.zeros(len(self.names))
        if error is not None:
            e = np.abs(np.asarray(error, dtype=float))
            bad = ~np.isfinite(e) | (e > self.error_bound)
            lasting_e = self._hold(self._err_since, t, bad)
        lasting_s = np.zeros(len(self.names))
        if saturated is not None:
            lasting_s = self._hold(self._sat_since, t, np.asarray(saturated, dtype=bool))
        # ">= window - half a microsecond": stamps in ns, cycles of exact periods
        hit_e = lasting_e >= self.window - 5e-7
        hit_s = lasting_s >= self.window - 5e-7
        if not (hit_e.any() or hit_s.any()):
            return False
        self.tripped, self.trips, self.tripped_at = True, self.trips + 1, t
        if hit_s.any():
            j = int(np.argmax(lasting_s))
            self.joint = self.names[j]
            self.reason = (f"joint {self.joint}: command saturated at its effort limit for {lasting_s[j] * 1e3:.0f} ms"
                           f" (window {self.window * 1e3:.0f} ms)")
        else:
            j = int(np.argmax(lasting_e))
            self.joint = self.names[j]
            self.reason = (f"joint {self.joint}: |q_d - q| above {self.error_bound[j]:.3g} rad for"
                           f" {lasting_e[j] * 1e3:.0f} ms (window {self.window * 1e3:.0f} ms)")
        return True

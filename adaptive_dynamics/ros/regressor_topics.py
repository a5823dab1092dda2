"""Regressors from topics: what a controller with ``regressor_source: topics`` takes from
the ``regressor`` node, per stamp, and whether that node computes what the controller
would (the protocol in ``docs/nodes.md#adaptive_controller``).

:class:`RegressorTopics` holds the stamped ``regressor/slotine_li`` (Y) and
``regressor/filtered`` ([W | tau_f]) matrices and the latched ``regressor/columns``
(column names and the node's ``lam``, ``filter_lambda``, ``rate_hz`` in
``header.frame_id`` as JSON).  It does no logging and keeps no counters: its methods
return what happened, and the node logs and counts it.  Not thread-safe: the node calls
it under its callback lock.
"""
from __future__ import annotations

import json
from typing import Optional

import numpy as np
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from .arrays import MATRIX_STAMP_OFFSET, matrix_from_msg

__all__ = ["RegressorTopics", "BAD", "matrix_stamp"]

#: a regressor message for this stamp was rejected: the safe command answers its state
BAD = object()


def matrix_stamp(msg: Float64MultiArray) -> Optional[int]:
    """The stamp of a stamped matrix whose content was rejected (None: unreadable)."""
    try:
        sec, nsec = float(msg.data[0]), float(msg.data[1])
        if msg.layout.data_offset == MATRIX_STAMP_OFFSET and sec == int(sec) and nsec == int(nsec) \
                and sec >= 0 and 0 <= nsec < 1e9:
            return int(sec) * 1_000_000_000 + int(nsec)
    except (IndexError, ValueError, OverflowError):
        pass
    return None


class RegressorTopics:
    """Per-stamp buffers of the regressor node's matrices and its settings, checked
    against a controller core (``n`` joints, the core's ``lam``, ``filter_lambda``,
    parameter names and friction, the loop's ``rate_hz``)."""

    def __init__(self, n: int, rate_hz: float):
        self.n, self.rate_hz = int(n), float(rate_hz)
        self.y: dict = {}       # stamp -> Y (n x n_params) or BAD
        self.w: dict = {}       # stamp -> (W, tau_f) or BAD
        self.meta = None        # {"columns": [...], "settings": {...}} from regressor/columns
        self._check = None      # cached {"Y": error | None, "W": error | None}

    def invalidate(self) -> None:
        """Check again at the next :meth:`check` (``lam`` or ``filter_lambda`` changed)."""
        self._check = None

    def on_columns(self, msg: JointState) -> dict:
        """A ``regressor/columns`` message: kept; its settings are read (unreadable ones
        make every check refuse).  Returns the settings read."""
        try:
            settings = json.loads(msg.header.frame_id) if msg.header.frame_id else None
            if settings is not None and not isinstance(settings, dict):
                raise ValueError("not a JSON object")
        except ValueError as exc:
            settings = {"error": f"unreadable settings in header.frame_id ({exc})"}
        self.meta = {"columns": list(msg.name), "settings": settings}
        self._check = None
        return settings

    def check(self, core) -> dict:
        """Does the regressor node compute what ``core`` would?  ``{"Y": reason or None,
        "W": reason or None}`` (W: the composite law's filter), cached until the columns
        message or :meth:`invalidate`."""
        chk = self._check
        if chk is not None:
            return chk
        meta = self.meta
        chk = {"Y": None, "W": None}
        if meta is None:
            return chk  # not cached: nothing received yet (cycles wait)
        names, want = meta["columns"], core.full_parameter_names
        st = meta["settings"]
        if names != want:
            diff = [f"{a!r} != {b!r}" for a, b in zip(names, want) if a != b][:3]
            chk["Y"] = chk["W"] = (
                f"the regressor node's {len(names)} columns differ from this controller's {len(want)} full"
                f" parameters{' with friction columns' if core.friction else ''} (set base_parameters: false"
                f" and friction: {str(core.friction).lower()} on the regressor node)"
                + (f"; first differences: {', '.join(diff)}" if diff else ""))
        elif core.friction and st is not None and "error" not in st and not np.isclose(
                float(st.get("friction_smoothing", 0.0)), core.model.coulomb_smoothing, rtol=1e-12, atol=0.0):
            chk["Y"] = chk["W"] = (f"the regressor node's friction_smoothing = {st.get('friction_smoothing', 0.0)}"
                                   f" differs from this controller's {core.model.coulomb_smoothing}: its Coulomb"
                                   " columns are not this law's; set the same on both")
        elif st is None or "error" in st or "lam" not in st:
            chk["Y"] = chk["W"] = ("regressor/columns carries no settings (" + (st or {}).get("error", "no lam")
                                   + "): cannot check its Lambda against lam; refusing")
        else:
            lam = np.asarray(st["lam"], dtype=float).reshape(-1)
            mine = core.lam
            theirs = np.diag(np.full(self.n, lam[0]) if lam.size == 1 else lam) if lam.size in (1, self.n) \
                else None
            if theirs is None or not np.allclose(theirs, mine, rtol=1e-12, atol=0.0):
                shown = np.diag(mine).tolist() if np.array_equal(mine, np.diag(np.diag(mine))) \
                    else f"a non-diagonal {self.n}x{self.n} matrix (the regressor node's is diagonal)"
                chk["Y"] = chk["W"] = (f"the regressor node's Lambda (lam = {lam.tolist()}) differs from this"
                                       f" controller's lam = {shown}: its q_dr, q_ddr would not be this"
                                       " controller's; set the same lam on both nodes")
            else:
                fl, rate = st.get("filter_lambda"), st.get("rate_hz")
                if fl is None or not np.isclose(float(fl), core.filter_lambda, rtol=1e-12, atol=0.0):
                    chk["W"] = (f"the regressor node's filter_lambda = {fl} differs from this controller's"
                                f" {core.filter_lambda}: its W, tau_f are not this law's; set the same on both")
                elif rate is None or not np.isclose(float(rate), self.rate_hz, rtol=1e-12, atol=0.0):
                    chk["W"] = (f"the regressor node's rate_hz = {rate} differs from this controller's"
                                f" {self.rate_hz} (filter step); set the same on both")
        self._check = chk
        return chk

    def refusal(self, core, law: str) -> Optional[str]:
        """Why cycles of ``law`` are refused now (None: they are not)."""
        if self.meta is None:
            return "no regressor/columns received"
        chk = self.check(core)
        return chk["Y"] or (chk["W"] if law == "composite" else None)

    @staticmethod
    def parse(msg: Float64MultiArray, kind: str, n: int, n_params: int):
        """``(stamp, value)`` of a ``regressor/<kind>`` message: Y, or (W, tau_f) of the
        filtered one; a malformed one gives ``(its stamp or None, BAD, reason)``."""
        where = f"regressor/{kind}"
        try:
            stamp, M = matrix_from_msg(msg, expected_shape=(n, n_params if kind == "slotine_li" else n_params + 1),
                                       where=where)
            return stamp, (M if kind == "slotine_li" else (np.ascontiguousarray(M[:, :-1]), M[:, -1].copy())), None
        except ValueError as exc:
            return matrix_stamp(msg), BAD, str(exc)

    def store(self, kind: str, stamp: int, value) -> None:
        buf = self.y if kind == "slotine_li" else self.w
        buf[stamp] = value
        if len(buf) > 1024:  # nobody consumes them (no joint_states here?): keep the newest
            for k in sorted(buf)[:512]:
                del buf[k]

    def waiting_for(self, stamp: int, law: str, effort, core) -> Optional[str]:
        """What the state ``stamp`` still waits for (None: nothing -- either here, refused
        at once, or not needed: ``sliding_pd`` needs no regressor)."""
        if law == "sliding_pd":
            return None
        if self.meta is None:
            return "regressor/columns (the regressor node's settings)"
        chk = self.check(core)
        need_w = law == "composite" and effort is not None
        if chk["Y"] or (need_w and chk["W"]):
            return None  # refused in the cycle
        if stamp not in self.y:
            return "regressor/slotine_li"
        if need_w and stamp not in self.w:
            return "regressor/filtered"
        return None

    def drop(self, stamp: int) -> None:
        """Forget what arrived for ``stamp`` (its state was answered without it)."""
        self.y.pop(stamp, None)
        self.w.pop(stamp, None)

    def take(self, stamp: int, law: str, effort, core):
        """This stamp's regressors as ``compute`` keyword arguments: ``(kwargs, None)``,
        or ``(None, why)`` -- ``why`` "mismatch: ..." (refused, to be logged), "missing" or
        "rejected" (counted on reception)."""
        Y = self.y.pop(stamp, None)
        Wt = self.w.pop(stamp, None)
        for buf in (self.y, self.w):  # leftovers of older stamps (given up / superseded)
            if len(buf) > 8:
                for k in [k for k in buf if k < stamp]:
                    del buf[k]
        need_w = law == "composite" and effort is not None
        err = self.refusal(core, "composite" if need_w else "direct")
        if err:
            return None, f"mismatch: {err}"
        if Y is None or (need_w and Wt is None):  # pragma: no cover - the node waits for them
            return None, "missing"
        if Y is BAD or (need_w and Wt is BAD):
            return None, "rejected"
        kw = {"Y": Y}
        if need_w:
            kw["W"], kw["tau_f"] = Wt
        return kw, None

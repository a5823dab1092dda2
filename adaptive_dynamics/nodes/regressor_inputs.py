"""``regressor_source: topics``: the adaptive controller's regressors from the ``regressor``
node, as inputs its states wait for (the protocol: ``docs/nodes.md#adaptive_controller``;
the per-stamp buffers and the check of the regressor node's settings:
:class:`~adaptive_dynamics.ros.regressor_topics.RegressorTopics`).

:class:`RegressorInputs` is composed into the controller node: it subscribes the stamped
``regressor/slotine_li`` and ``regressor/filtered`` matrices and the latched
``regressor/columns``; a state waits for its regressors (exact stamp only) like for its
reference; a newer state or the end of the wait gives it up with the safe command
(``regressor_missing``); malformed matrices are ``regressor_rejected``, late ones
``regressor_stale``, those computed with other settings ``regressor_mismatch``.  Called
with the node's callback lock held, except the subscriptions' callbacks, which take it.
"""
from __future__ import annotations

import time

from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from ..ros.qos import LATCHED_QOS, stream_qos
from ..ros.regressor_topics import RegressorTopics

__all__ = ["RegressorInputs"]


class RegressorInputs:
    """The regressors of ``node`` (a joint controller shell with an adaptive ``core``)."""

    def __init__(self, node):
        self.node = node
        self.regs = RegressorTopics(node.n, node.p["rate_hz"])
        c = node.counters   # shown from the start; their increase raises the diagnostics level
        c.warn_on += ("regressor_missing", "regressor_rejected", "regressor_stale")
        c.error_on += ("regressor_mismatch",)
        for k in ("regressor_missing", "regressor_rejected", "regressor_stale", "regressor_mismatch"):
            c.set(k, 0)

    def subscribe(self) -> None:
        node = self.node
        qos = stream_qos(node.p["reliable_streams"])
        node.io.node.create_subscription(Float64MultiArray, "regressor/slotine_li",
                                         lambda m: self._on_regressor(m, "slotine_li"), qos)
        node.io.node.create_subscription(Float64MultiArray, "regressor/filtered",
                                         lambda m: self._on_regressor(m, "filtered"), qos)
        node.create_subscription(JointState, "regressor/columns", self._on_columns, LATCHED_QOS)

    # ------------------------------------------------------------ the state's wait
    def waiting_for(self, stamp: int, effort) -> str | None:
        """What the state ``stamp`` still waits for (None: nothing -- here, refused at
        once, or not needed)."""
        return self.regs.waiting_for(stamp, self.node.p["law"], effort, self.node.core)

    def superseded(self, pend) -> bool:
        """A newer state: a pending state missing only its regressors is given up."""
        node = self.node
        why = self.waiting_for(pend[0], pend[3])
        ref = node.refs.lookup(pend[0], int(node.p["reference_tolerance"] * 1e9), max_staleness_ns=-1)
        if why is None or ref is None:
            return False
        self._give_up(pend, f"{why} before a newer state")
        return True

    def expire(self) -> None:
        """The watchdog tick: a wait longer than ``reference_wait`` (real time, 0: a newer
        state supersedes it, else ``state_timeout``) is given up."""
        node = self.node
        pend = node._pending
        if pend is None:
            return
        wait = node.p["reference_wait"] if node.p["reference_wait"] > 0 else node.p["state_timeout"]
        if time.monotonic() - node._pending_since > wait:
            why = self.waiting_for(pend[0], pend[3])
            if why is not None:
                self._give_up(pend, f"{why} within {wait:g} s")

    def take(self, stamp: int, law: str, effort) -> dict | None:
        """This stamp's regressors as ``compute`` keyword arguments, or None (refused:
        logged and counted; the caller sends the safe command)."""
        node = self.node
        kw, why = self.regs.take(stamp, law, effort, node.core)
        if why is not None and why.startswith("mismatch"):
            node.counters.inc("regressor_mismatch")
            if node.log_throttle("reg_mismatch"):
                node.get_logger().error(f"regressor_source=topics refused: {why[len('mismatch: '):]}; safe command")
        elif why == "missing":  # pragma: no cover - the state waits for them
            node.counters.inc("regressor_missing")
        return kw

    def refusal(self) -> str | None:
        return self.regs.refusal(self.node.core, self.node.p["law"])

    def invalidate(self) -> None:
        """``lam`` or ``filter_lambda`` changed: check the regressor node's settings again."""
        self.regs.invalidate()

    # ------------------------------------------------------------ callbacks
    def _give_up(self, pend, why: str) -> None:
        node = self.node
        node._pending = None
        self.regs.drop(pend[0])
        node.counters.inc("regressor_missing")
        if node.log_throttle("reg_miss"):
            node.get_logger().warning(f"no {why} for the state t={pend[0] * 1e-9:.4f} s: safe command sent")
        node._publish(node._safe_command(), pend[0])

    def _on_columns(self, msg: JointState) -> None:
        node = self.node
        with node._cb_lock:
            settings = self.regs.on_columns(msg)
            errs = self.regs.check(node.core)
            for key, err in errs.items():
                if err and (key == "Y" or node.p["law"] == "composite"):
                    node.get_logger().error(f"regressor_source=topics: {err}; cycles needing it get the safe"
                                            " command")
            if not any(errs.values()):
                node.get_logger().info(f"regressor node's columns received ({len(msg.name)}, settings"
                                       f" {settings}): consistent with this controller")
            if node._pending is not None:
                node._try_pending()

    def _on_regressor(self, msg: Float64MultiArray, kind: str) -> None:
        node = self.node
        stamp, val, err = RegressorTopics.parse(msg, kind, node.n, node.core.model.n_params)
        if err is not None:
            node.counters.inc("regressor_rejected")
            if node.log_throttle("reg_bad"):
                node.get_logger().error(f"regressor/{kind} rejected ({err}); the safe command answers its state")
            if stamp is None:
                return
        with node._cb_lock:
            pend = node._pending
            last = node._last_stamp
            if last is not None and (stamp < last or (stamp == last and (pend is None or pend[0] != stamp))):
                node.counters.inc("regressor_stale")  # its state was answered already (or superseded)
                return
            self.regs.store(kind, stamp, val)
            if pend is not None and pend[0] == stamp:
                node._try_pending()

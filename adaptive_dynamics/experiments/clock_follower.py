"""A node of an experiment's own process that follows a running graph's ``/clock``.

The experiments that run the node graph as separate processes act on it from their own
process at given sim times (phase switches, a payload picked up) and watch it (learner
snapshots).  :class:`ClockFollower` owns what that takes -- its own rclpy context (the
process may run several graphs one after the other), a node, a ``/clock`` subscription
and an executor thread -- and calls :meth:`ClockFollower.on_clock` with every sim time.
:class:`PhaseDirector` switches nodes' parameters at sim-time boundaries.  Both are
companions of :func:`~adaptive_dynamics.launcher.run_to_end` (``close()``,
``problems()``).
"""
from __future__ import annotations

import threading
from typing import Any
from ..ros.params import to_parameters
from ..ros.qos import CLOCK_QOS


class ClockFollower:
    """Base of the experiments' side nodes; subclasses override :meth:`on_clock` and add
    their clients and subscriptions to :attr:`node` before calling :meth:`start`."""

    def __init__(self, name: str, namespace: str = ""):
        import rclpy
        from rclpy.context import Context
        from rclpy.node import Node

        self.ctx = Context()
        rclpy.init(context=self.ctx)
        self.node = Node(name, context=self.ctx, namespace=namespace or None)
        self.last_clock = 0.0
        self.errors: list[str] = []
        self._thread = None

    def start(self) -> None:
        from rclpy.executors import SingleThreadedExecutor
        from rosgraph_msgs.msg import Clock


        self.node.create_subscription(Clock, "/clock", self._on_clock, CLOCK_QOS)
        self.executor = SingleThreadedExecutor(context=self.ctx)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:   # the context is shut down under it at close()
            pass

    def _on_clock(self, msg) -> None:
        t = msg.clock.sec + 1e-9 * msg.clock.nanosec
        self.last_clock = t
        self.on_clock(t)

    def on_clock(self, t: float) -> None:
        """Called with every ``/clock`` [s] (the executor thread)."""

    def close(self) -> None:
        import rclpy
        if self._thread is not None:
            try:
                self.executor.shutdown(timeout_sec=1.0)
            except Exception:
                pass
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.ctx)
        if self._thread is not None:
            self._thread.join(timeout=2.0)


class PhaseDirector(ClockFollower):
    """Switch the phases at sim-time boundaries through SetParameters (own rclpy context):
    a companion of :func:`~adaptive_dynamics.launcher.run_to_end`.

    ``settings``: phase (1, 2, ...) -> node name -> parameter values set at the phase's
    start; ``boundaries``: the start of phases 2, 3, ... [sim s]."""

    def __init__(self, boundaries: list[float], settings: dict[int, dict[str, dict[str, Any]]], namespace: str = ""):
        from rcl_interfaces.srv import SetParameters


        super().__init__("phase_director", namespace)
        self._to_parameters = to_parameters
        self.settings = settings
        self.boundaries = list(boundaries)   # start of phases 2, 3, ...
        if len(self.boundaries) != len(self.settings) - 1:
            raise ValueError(f"{len(self.settings)} phases need {len(self.settings) - 1} boundaries,"
                             f" got {self.boundaries}")
        names = sorted({name for values in self.settings.values() for name in values})
        self.clients = {name: self.node.create_client(SetParameters, f"{name}/set_parameters") for name in names}
        self.phase = 1
        self.switches: list[dict[str, Any]] = []
        self.start()

    def on_clock(self, t: float) -> None:
        while self.phase < len(self.settings) and t >= self.boundaries[self.phase - 1]:
            self.phase += 1
            self._switch(self.phase, t)

    def _switch(self, phase: int, t: float) -> None:
        from rcl_interfaces.srv import SetParameters
        entry = {"phase": phase, "clock_s": round(t, 4), "acknowledged_s": {}}
        self.switches.append(entry)
        for name, values in self.settings[phase].items():
            req = SetParameters.Request()
            req.parameters = [p.to_parameter_msg() for p in self._to_parameters(values)]
            fut = self.clients[name].call_async(req)

            def done(f, name=name, values=values):
                try:
                    res = f.result()
                    bad = [r.reason for r in res.results if not r.successful]
                    if bad:
                        self.errors.append(f"phase {phase}: {name} refused {values}: {bad}")
                except Exception as exc:  # pragma: no cover - service died
                    self.errors.append(f"phase {phase}: {name}: {exc!r}")
                entry["acknowledged_s"][name] = round(self.last_clock, 4)
            fut.add_done_callback(done)

    def problems(self) -> list[str]:
        """Refused switches, and switches that did not happen (the graph ended first)."""
        out = list(self.errors)
        expected = len(self.settings) - 1
        if len(self.switches) != expected:
            out.append(f"only {len(self.switches)} of {expected} phase switches happened (clock reached"
                       f" {self.last_clock:.2f} s; boundaries {self.boundaries} s)")
        return out

"""A node of an experiment's own process that follows a running graph's ``/clock``.

The experiments that run the node graph as separate processes act on it from their own
process at given sim times (phase switches, a payload picked up) and watch it (learner
snapshots).  :class:`ClockFollower` owns what that takes -- its own rclpy context (the
process may run several graphs one after the other), a node, a ``/clock`` subscription
and an executor thread -- and calls :meth:`ClockFollower.on_clock` with every sim time.
"""
from __future__ import annotations

import threading


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

        from ..ros.qos import CLOCK_QOS

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

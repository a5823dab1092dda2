"""Shared pytest fixtures: a private rclpy context and an executor spinning test nodes.

Every spin has a timeout; nothing can hang.  ``./dev test`` keeps DDS on localhost
with a per-run ROS_DOMAIN_ID, so parallel runs never cross-talk.
"""
from __future__ import annotations

import os
import time
import uuid

# BLAS on one thread, in this process and the graphs' node processes it starts (they inherit
# the environment): the suite's matrices are tiny, and a threaded OpenBLAS on the loaded 2-core
# host spins its second thread against the other tests' processes -- test_learning_pgpol's
# change-statistics test took 31 s with it, 4.8 s without.  The package's own learners set
# the same (learning.online._one_blas_thread) once one is made, so before this the thread
# count of every later test depended on the order the tests ran in.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
try:   # numpy already imported by a plugin: its BLAS is loaded, limit it as well
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
except ImportError:  # pragma: no cover - threadpoolctl is scikit-learn's dependency
    pass

import pytest

TIMEOUT = 5.0


def pytest_collection_modifyitems(session, config, items):
    """Tests marked ``realtime`` run first: their deadline-miss statistics are about the
    loop, and after hundreds of tests in one process (contexts, DDS participants and
    shared-memory segments come and go) the 2-vCPU host's noise in them doubles."""
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("realtime") is None)


def uniq(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


@pytest.fixture
def ctx():
    import rclpy
    from rclpy.context import Context

    context = Context()
    rclpy.init(context=context)
    yield context
    rclpy.try_shutdown(context=context)


@pytest.fixture
def ros(ctx):
    """Factory for nodes in a private context plus one executor spinning them all.

    ``ros.node(prefix)`` makes a plain test node; ``ros.add(node_cls, **params)`` builds
    one of the package's nodes in the same context with parameter overrides."""
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.node import Node
    from rclpy.parameter import Parameter

    class Ros:
        def __init__(self):
            self.executor = SingleThreadedExecutor(context=ctx)
            self.nodes = []

        def node(self, prefix="ad_test", **kw):
            n = Node(uniq(prefix), context=ctx, **kw)
            self.nodes.append(n)
            self.executor.add_node(n)
            return n

        def add(self, node_cls, **params):
            overrides = [Parameter(k, value=v) for k, v in params.items()]
            n = node_cls(context=ctx, parameter_overrides=overrides)
            self.nodes.append(n)
            self.executor.add_node(n)
            return n

        def spin_until(self, cond, timeout=TIMEOUT):
            deadline = time.monotonic() + timeout
            while not cond() and time.monotonic() < deadline:
                self.executor.spin_once(timeout_sec=0.02)
            return cond()

        def spin_for(self, seconds):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                self.executor.spin_once(timeout_sec=0.02)

        def call(self, client, request):
            assert client.wait_for_service(timeout_sec=TIMEOUT), f"{client.srv_name} not available"
            fut = client.call_async(request)
            self.executor.spin_until_future_complete(fut, timeout_sec=TIMEOUT)
            assert fut.done(), f"{client.srv_name} did not answer within {TIMEOUT}s"
            return fut.result()

    r = Ros()
    yield r
    r.executor.shutdown(timeout_sec=1.0)
    for n in r.nodes:
        try:
            n.destroy_node()
        except Exception:  # a node may already be gone with its context
            pass

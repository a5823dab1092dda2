"""A graph's nodes in this process: each node on its own thread, in its own rclpy context.

:class:`InProcessGraph` runs the node list of :mod:`.scenarios` as
:class:`~adaptive_dynamics.launcher.GraphProcess` does, with the same command-line
arguments (parameter files, overrides, remaps) parsed by each node's own
``rclpy.init``, but without starting a Python interpreter per node: each node's
``main`` runs on a thread of this process inside :func:`~adaptive_dynamics.ros.node_base.node_context`
(its own ``rclpy`` context, hence its own DDS participant: the nodes still talk over
DDS, discover each other and end as processes do; no signal handlers).  What it saves
is the interpreter start and the imports of every node (a few seconds of CPU per node,
per graph); what it costs is one GIL for the whole graph -- in lockstep the nodes take
turns anyway.  The experiments' quick runs use it (``--graph inprocess``,
:func:`~adaptive_dynamics.launcher.run_to_end`); the user's paths (``demo``, ``launch``)
start processes.

Ends as the process launcher does: the *required* node (the simulator with a
``max_sim_time``) returning 0 ends the graph -- the others are shut down, draining ones
(the recorder) are left to end by themselves first (up to ``limit``); a node that raises
or returns non-zero fails it; :meth:`stop` shuts every context down (a node's
``destroy_node`` then runs as on SIGINT: what it learned is saved, the zero command
sent).  A node's exception and traceback are kept in :attr:`logs`; its log lines go to
this process's stderr as rclpy writes them (``[node name]`` in each).
"""
from __future__ import annotations

import importlib
import shutil
import sys
import tempfile
import threading
import time
import traceback

import rclpy
import rclpy.context

from .ros.node_base import node_context
from .scenarios import STOP_RANK, NodeSpec, command_line

__all__ = ["InProcessGraph"]

#: how a node's module is found (its ``main(argv)`` is run)
import_node_module = importlib.import_module



class InProcessGraph:
    """The running nodes of a graph in this process (see the module)."""

    def __init__(self, nodes: list[NodeSpec], *, echo: bool = False, env: dict | None = None):
        if env:
            raise ValueError("an in-process graph shares this process's environment: env is not supported")
        self.nodes = nodes
        self.echo = echo
        self.logs: dict[str, list[str]] = {s.name: [] for s in nodes}
        self.codes: dict[str, int] = {}
        self.workdir = tempfile.mkdtemp(prefix="ad_inprocess_")
        self.contexts: dict = {}
        self.threads: dict[str, threading.Thread] = {}
        self._closed = False
        try:
            for spec in nodes:
                argv = command_line(spec, self.workdir)
                module = import_node_module(spec.module)   # imported here, once: errors say so at once
                ctx = rclpy.context.Context()
                self.contexts[spec.name] = ctx
                t = threading.Thread(target=self._run, args=(spec, module, ctx, [spec.module, *argv[3:]]),
                                     name=f"node {spec.name}", daemon=True)
                self.threads[spec.name] = t
            for t in self.threads.values():
                t.start()
        except BaseException:
            self.stop(grace=2.0)
            raise

    def _run(self, spec: NodeSpec, module, ctx, argv: list[str]) -> None:
        try:
            with node_context(ctx):
                rc = module.main(argv)
            self.codes[spec.name] = int(rc or 0)
        except SystemExit as exc:
            self.codes[spec.name] = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException as exc:   # the node failed: say how, end the graph
            self.logs[spec.name].extend(traceback.format_exception(exc)[-12:])
            self.codes[spec.name] = 1
            if self.echo:
                print(f"[{spec.name}] {''.join(traceback.format_exception(exc))}", file=sys.stderr, flush=True)

    def wait(self, timeout: float | None = None) -> tuple[int, str]:
        """Block until the graph ends: (exit code, message), as :meth:`GraphProcess.wait
        <adaptive_dynamics.launcher.GraphProcess.wait>`; the graph is stopped on every way out."""
        try:
            return self._wait(timeout)
        finally:
            self.stop()

    def _wait(self, timeout: float | None) -> tuple[int, str]:
        t_end = None if timeout is None else time.monotonic() + timeout
        required = {s.name for s in self.nodes if s.required}
        while True:
            for spec in self.nodes:
                if self.threads[spec.name].is_alive():
                    continue
                rc = self.codes.get(spec.name, 1)
                if spec.drains and rc == 0 and required:
                    continue
                if spec.name in required and rc == 0:
                    self._drain()
                    return 0, f"{spec.name} finished"
                return (rc or 1), f"node {spec.name!r} exited with code {rc}"
            if t_end is not None and time.monotonic() > t_end:
                return 124, f"timeout after {timeout} s"
            time.sleep(0.02)

    def _shutdown(self, name: str, grace: float = 0.0) -> None:
        """Shut the node's context down; with ``grace``, wait up to that long for its thread
        (retrying: a thread that had not initialised its context yet does so meanwhile)."""
        t_end = time.monotonic() + grace
        t = self.threads.get(name)
        while True:
            try:
                rclpy.try_shutdown(context=self.contexts[name])
            except Exception:   # not initialised yet
                pass
            if t is None or t.ident is None or not t.is_alive() or time.monotonic() >= t_end:
                return
            t.join(timeout=0.05)

    def _drain(self, limit: float = 120.0) -> None:
        """Shut the other nodes down, then let draining ones (the recorder) end by themselves."""
        for spec in self.nodes:
            if not spec.drains and not spec.required:
                self._shutdown(spec.name)
        for spec in self.nodes:
            if not spec.drains:
                self._shutdown(spec.name, grace=8.0)
        t_end = time.monotonic() + limit
        for spec in self.nodes:
            if spec.drains:
                self.threads[spec.name].join(timeout=max(0.1, t_end - time.monotonic()))

    def stop(self, grace: float = 8.0) -> None:
        """Shut every node's context down in order (the driver first, the recorder last),
        wait for their threads, remove the graph's files."""
        if self._closed:
            return
        self._closed = True
        try:
            for spec in sorted(self.nodes, key=lambda s: STOP_RANK.get(s.executable, 5)):
                if spec.name in self.contexts:
                    self._shutdown(spec.name, grace=grace)
        finally:
            shutil.rmtree(self.workdir, ignore_errors=True)

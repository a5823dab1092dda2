"""Pip-path launcher: start a scenario of :mod:`.scenarios` as separate node processes.

The same node list and parameter files as ``ros2 launch adaptive_dynamics ...``:
each node runs as ``python -m adaptive_dynamics.nodes.<exe> --ros-args -r __node:=...
--params-file ... -p ...``.  Log lines are forwarded with a ``[node]`` prefix.
Ctrl-C / SIGTERM stops every node cleanly (SIGINT, then SIGTERM, then SIGKILL after
timeouts; the recorder is stopped last so its bag is closed with everything in it);
a second Ctrl-C while stopping kills what is left.
If a node dies, the others are stopped and the launcher exits non-zero naming it;
when the *required* node (the simulator, with ``duration``) exits 0, the graph
ends normally.

Nothing is left behind: every file a launch writes (the nodes' parameter override
files) goes into one private temporary directory per launch
(``$TMPDIR/ad_launch_*``), removed when the graph is stopped, however it ends (normal
end, a node dying, Ctrl-C, SIGTERM, an exception in the caller; ``atexit`` as the
last resort).  While a graph runs in a process that has no SIGTERM handler of its own,
:class:`GraphProcess` installs one that turns SIGTERM into ``SystemExit(143)``, so the
same orderly shutdown runs instead of the process vanishing and orphaning its nodes
(which run in their own process groups and never see the launcher's signals).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from .scenarios import STOP_RANK, NodeSpec, command_line



#: s a node stopped before the drainers (the recorder) has to end on its SIGINT
DRAIN_GRACE_S = 8.0

# Live graphs of this process and the SIGTERM handler they share (installed only when
# the process had none: a caller's own handler, e.g. run_graph's, is left alone).
_live: set = set()
_lock = threading.Lock()
_term_installed = False


def _on_sigterm(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through GraphProcess.wait's finally: orderly stop


def _track(graph: "GraphProcess") -> None:
    global _term_installed
    with _lock:
        _live.add(graph)
        if _term_installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
                signal.signal(signal.SIGTERM, _on_sigterm)
                _term_installed = True
        except (ValueError, OSError):  # not the main interpreter / no signals here
            pass


def _untrack(graph: "GraphProcess") -> None:
    global _term_installed
    with _lock:
        _live.discard(graph)
        if _live or not _term_installed or threading.current_thread() is not threading.main_thread():
            return
        try:
            if signal.getsignal(signal.SIGTERM) is _on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _term_installed = False
        except (ValueError, OSError):
            pass


class GraphProcess:
    """Running processes of a graph (also used by the tests and the demo).

    ``workdir`` is the launch's private temporary directory (override files); it and
    the processes are gone once :meth:`stop` returns, which :meth:`wait` always calls,
    whatever ends it."""

    def __init__(self, nodes: list[NodeSpec], *, echo: bool = True, env: dict | None = None):
        self.nodes = nodes
        self.echo = echo
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, list[str]] = {}
        self._threads = []
        self._closed = False
        self._interrupted: set = set()   # nodes sent SIGINT already (a second one would cut their shutdown short)
        environ = dict(os.environ)
        environ.update(env or {})
        environ.setdefault("PYTHONUNBUFFERED", "1")
        environ.setdefault("RCUTILS_COLORIZED_OUTPUT", "0")
        self.workdir = tempfile.mkdtemp(prefix="ad_launch_")
        try:
            atexit.register(self._at_exit)  # never leave orphans or files, whatever ends the launcher
            _track(self)
            for spec in nodes:
                self.logs[spec.name] = []
                cmd = command_line(spec, self.workdir)
                p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, bufsize=1, env=environ, start_new_session=True)
                self.procs[spec.name] = p
                t = threading.Thread(target=self._pump, args=(spec.name, p), daemon=True)
                t.start()
                self._threads.append(t)
        except BaseException:  # a node that cannot start, Ctrl-C/SIGTERM while starting
            self.stop(grace=2.0)
            raise

    def _pump(self, name: str, p: subprocess.Popen) -> None:
        for line in p.stdout:
            line = line.rstrip("\n")
            self.logs[name].append(line)
            if self.echo:
                print(f"[{name}] {line}", flush=True)

    def wait(self, timeout: float | None = None) -> tuple[int, str]:
        """Block until the graph ends. Returns (exit code, message).  The graph is stopped
        (and its files removed) on every way out, an exception such as KeyboardInterrupt
        or SIGTERM's SystemExit included."""
        try:
            return self._wait(timeout)
        finally:
            self.stop()  # no-op when a rule below has already stopped it

    def _wait(self, timeout: float | None) -> tuple[int, str]:
        t_end = None if timeout is None else time.monotonic() + timeout
        required = {s.name for s in self.nodes if s.required}
        while True:
            for spec in self.nodes:
                rc = self.procs[spec.name].poll()
                if rc is None:
                    continue
                if spec.drains and rc == 0 and required:
                    # the recorder ends by itself once the state stream's publisher is gone,
                    # which can be seen before the finishing bridge's process has exited:
                    # not a failure, the required node decides (a hang hits the timeout)
                    continue
                if spec.name in required and rc == 0:
                    self._drain()
                    self.stop()
                    return 0, f"{spec.name} finished"
                self.stop()
                return (rc or 1), f"node {spec.name!r} exited with code {rc}"
            if t_end is not None and time.monotonic() > t_end:
                self.stop()
                return 124, f"timeout after {timeout} s"
            time.sleep(0.05)

    def _drain(self, limit: float = 120.0) -> None:
        """Stop the other nodes, then give draining nodes (the recorder) time to empty
        their queues and exit by themselves."""
        drainers = [s for s in self.nodes if s.drains]
        others = [s for s in self.nodes if not s.drains and not s.required
                  and self.procs[s.name].poll() is None]
        for spec in others:
            self.procs[spec.name].send_signal(signal.SIGINT)
            self._interrupted.add(spec.name)
        # a node that does not end on its SIGINT within the grace (its shutdown blocked) is
        # terminated, then killed, as stop() does: a drainer waits for its publishers to go
        t_grace = time.monotonic() + DRAIN_GRACE_S
        for spec in others:
            _end(self.procs[spec.name], max(0.1, t_grace - time.monotonic()))
        t_end = time.monotonic() + limit
        for spec in drainers:
            try:
                self.procs[spec.name].wait(timeout=max(0.1, t_end - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass

    def kill_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
        for p in self.procs.values():
            try:
                p.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass

    def _at_exit(self) -> None:
        self.kill_all()
        self._close()

    def _close(self) -> None:
        """Remove the launch's directory and forget the graph (idempotent)."""
        if self._closed:
            return
        self._closed = True
        shutil.rmtree(self.workdir, ignore_errors=True)
        atexit.unregister(self._at_exit)
        _untrack(self)

    def stop(self, grace: float = 8.0) -> None:
        """Stop every node in order (SIGINT, then SIGTERM, then SIGKILL), then remove the
        launch's files.  Interrupted (a second Ctrl-C), it kills what is left and still
        cleans up."""
        if self._closed:
            return
        try:
            order = sorted(self.nodes, key=lambda s: STOP_RANK.get(s.executable, 5))
            for spec in order:
                p = self.procs.get(spec.name)
                if p is not None and p.poll() is None:
                    if spec.name not in self._interrupted:   # one SIGINT: a second interrupts the node's
                        p.send_signal(signal.SIGINT)         # shutdown (saving what it learned, zero command)
                        self._interrupted.add(spec.name)
                    _end(p, grace)
            for t in self._threads:
                t.join(timeout=1.0)
        finally:
            self.kill_all()  # only does something when the orderly part was interrupted
            self._close()


def _end(p: subprocess.Popen, grace: float) -> None:
    """Wait up to ``grace`` s for a node told to stop (SIGINT); then SIGTERM, 2 s, SIGKILL."""
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.terminate()
        try:
            p.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class GraphFailed(RuntimeError):
    """A graph that did not end as planned: :attr:`code`, :attr:`why` and the nodes' last
    log lines (:attr:`logs`) -- also in the message."""

    def __init__(self, what: str, code: int, why: str, logs: dict):
        self.code, self.why, self.logs = code, why, logs
        super().__init__(f"{what} ({why}); last log lines: {json.dumps(logs, indent=1)}")


@dataclass
class RunResult:
    """What :func:`run_to_end` returns: wall time [s], exit code and reason, the logs."""
    wall_s: float
    code: int
    why: str
    logs: dict


#: how :func:`run_to_end` runs a graph: a process per node, or every node in this process
GRAPH_KINDS = ("processes", "inprocess")
_graph_kind = ["processes"]


@contextlib.contextmanager
def graph_kind(kind: str):
    """Within it, :func:`run_to_end` runs graphs as ``kind`` (:data:`GRAPH_KINDS`) unless
    told otherwise: an experiment's ``--graph`` for every graph it runs."""
    if kind not in GRAPH_KINDS:
        raise ValueError(f"graph {kind!r}: one of {GRAPH_KINDS}")
    _graph_kind.append(kind)
    try:
        yield kind
    finally:
        _graph_kind.pop()


def run_to_end(nodes: list[NodeSpec], *, timeout: float | None, companions=(), echo: bool = False,
               timeout_ok: bool = False, what: str = "the graph failed", tail: int = 12,
               graph: str | None = None) -> RunResult:
    """The one way experiments, the demo and the benches run a graph: start ``nodes``,
    wait (up to ``timeout`` wall s) for the required node to finish, stop everything.

    ``companions``: objects running beside the graph in this process (a phase director
    switching parameters on the sim clock, a monitor, a CPU sampler): ``attach(graph)``
    is called once the processes are started (if they have it), ``close()`` always at the
    end, and ``problems()`` (a list of strings) after a clean end.  :class:`GraphFailed`
    (with the nodes' last ``tail`` log lines) when the graph failed or timed out (a timeout
    is the planned end with ``timeout_ok``) or a companion reports a problem.
    ``graph``: ``processes`` (:class:`GraphProcess`) or ``inprocess``
    (:class:`~adaptive_dynamics.inprocess.InProcessGraph`: the same nodes and arguments on
    threads of this process, each in its own rclpy context); None: :func:`graph_kind`'s."""
    graph = graph or _graph_kind[-1]
    if graph not in GRAPH_KINDS:
        raise ValueError(f"graph {graph!r}: one of {GRAPH_KINDS}")
    kind, graph = graph, None
    t0 = time.monotonic()
    try:
        if kind == "inprocess":
            from .inprocess import InProcessGraph  # lazy: rclpy is only loaded for a graph in this process
            graph = InProcessGraph(nodes, echo=echo)
        else:
            graph = GraphProcess(nodes, echo=echo)
        for c in companions:
            if hasattr(c, "attach"):
                c.attach(graph)
        rc, why = graph.wait(timeout=timeout)
    finally:
        if graph is not None:
            graph.stop()   # (a no-op after wait; an interrupt before it)
        for c in companions:
            c.close()
    wall = time.monotonic() - t0
    logs = {k: v[-tail:] for k, v in graph.logs.items()}
    if rc != 0 and not (timeout_ok and rc == 124):
        raise GraphFailed(what, rc, why, logs)
    problems = [p for c in companions if hasattr(c, "problems") for p in c.problems()]
    if problems:
        raise GraphFailed(f"{what}: {problems[:5]}", rc, why, logs)
    return RunResult(wall, rc, why, logs)


def run_graph(nodes: list[NodeSpec], *, timeout: float | None = None, timeout_ok: bool = False) -> int:
    """Foreground launcher for the CLI: forwards logs, handles Ctrl-C/SIGTERM (installed
    before the nodes start, so a signal during start-up also stops them in order).
    ``timeout`` [s, wall] stops the graph in order; ``timeout_ok``: that is the planned end
    (exit code 0, ``launch real --duration``), else code 124."""
    stopping = {"sig": None}

    def on_signal(signum, _frame):
        stopping["sig"] = stopping["sig"] or signum
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            res = run_to_end(nodes, timeout=timeout, echo=True, timeout_ok=timeout_ok)
            rc, why = res.code, res.why
            if timeout_ok and rc == 124:
                rc, why = 0, f"--duration: {timeout:g} s of wall time elapsed"
        except GraphFailed as exc:
            rc, why = exc.code, exc.why
        except KeyboardInterrupt:   # run_to_end has stopped the graph
            rc, why = 0, f"stopped by {signal.Signals(stopping['sig'] or signal.SIGINT).name}"
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    print(f"[launch] {why}", file=sys.stderr if rc else sys.stdout, flush=True)
    return rc

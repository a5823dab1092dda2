"""Pip-path launcher: start a :mod:`launch_graph` as separate node processes.

The same node list and parameter files as ``ros2 launch adaptive_dynamics ...``:
each node runs as ``python -m adaptive_dynamics.nodes.<exe> --ros-args -r __node:=...
--params-file ... -p ...``.  Log lines are forwarded with a ``[node]`` prefix.
Ctrl-C / SIGTERM stops every node cleanly (SIGINT, then SIGTERM, then SIGKILL after
timeouts; the recorder is stopped last so its bag is closed with everything in it).
If a node dies, the others are stopped and the launcher exits non-zero naming it;
when the *required* node (the simulator, with ``duration``) exits 0, the graph
ends normally.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

from .launch_graph import NodeSpec

# stop order: the loop's driver first, the recorder last
_STOP_RANK = {"mujoco_bridge": 0, "trajectory": 1, "controller": 1, "recorder": 9}


def _override_file(spec: NodeSpec) -> str:
    """The node's explicit parameters as one more ROS 2 parameter file.

    rcl gives ``--params-file`` values precedence over ``-p`` ones, so explicit
    overrides go in a file placed after the configuration files (later files win).
    """
    import tempfile

    import yaml
    fd, path = tempfile.mkstemp(prefix=f"ad_{spec.name}_", suffix=".yaml")
    with os.fdopen(fd, "w") as fh:
        key = f"/{spec.namespace.strip('/')}/{spec.name}" if spec.namespace else spec.name
        yaml.safe_dump({key: {"ros__parameters": dict(spec.params)}}, fh)
    return path


def command_line(spec: NodeSpec) -> list[str]:
    cmd = [sys.executable, "-m", spec.module, "--ros-args", "-r", f"__node:={spec.name}"]
    if spec.namespace:
        cmd += ["-r", f"__ns:=/{spec.namespace.strip('/')}"]
    for f in spec.param_files:
        cmd += ["--params-file", f]
    if spec.params:
        cmd += ["--params-file", _override_file(spec)]
    for a, b in spec.remappings:
        cmd += ["-r", f"{a}:={b}"]
    return cmd


class GraphProcess:
    """Running processes of a graph (also used by the tests and the demo)."""

    def __init__(self, nodes: list[NodeSpec], *, echo: bool = True, env: dict | None = None):
        self.nodes = nodes
        self.echo = echo
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, list[str]] = {}
        self._threads = []
        environ = dict(os.environ)
        environ.update(env or {})
        environ.setdefault("PYTHONUNBUFFERED", "1")
        environ.setdefault("RCUTILS_COLORIZED_OUTPUT", "0")
        import atexit
        atexit.register(self.kill_all)  # never leave orphans, whatever ends the launcher
        for spec in nodes:
            p = subprocess.Popen(command_line(spec), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, bufsize=1, env=environ, start_new_session=True)
            self.procs[spec.name] = p
            self.logs[spec.name] = []
            t = threading.Thread(target=self._pump, args=(spec.name, p), daemon=True)
            t.start()
            self._threads.append(t)

    def _pump(self, name: str, p: subprocess.Popen) -> None:
        for line in p.stdout:
            line = line.rstrip("\n")
            self.logs[name].append(line)
            if self.echo:
                print(f"[{name}] {line}", flush=True)

    def wait(self, timeout: float | None = None) -> tuple[int, str]:
        """Block until the graph ends. Returns (exit code, message)."""
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
        for spec in self.nodes:
            if not spec.drains and not spec.required and self.procs[spec.name].poll() is None:
                self.procs[spec.name].send_signal(signal.SIGINT)
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

    def stop(self, grace: float = 8.0) -> None:
        order = sorted(self.nodes, key=lambda s: _STOP_RANK.get(s.executable, 5))
        for spec in order:
            p = self.procs[spec.name]
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                try:
                    p.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    p.terminate()
                    try:
                        p.wait(timeout=2.0)
                    except subprocess.TimeoutExpired:
                        p.kill()
                        p.wait()
        for t in self._threads:
            t.join(timeout=1.0)


def run_graph(nodes: list[NodeSpec], *, timeout: float | None = None) -> int:
    """Foreground launcher for the CLI: forwards logs, handles Ctrl-C/SIGTERM."""
    graph = GraphProcess(nodes)
    stopping = {"sig": None}

    def on_signal(signum, _frame):
        stopping["sig"] = signum
        raise KeyboardInterrupt

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        rc, why = graph.wait(timeout)
    except KeyboardInterrupt:
        graph.stop()
        rc, why = 0, f"stopped by {signal.Signals(stopping['sig'] or signal.SIGINT).name}"
    finally:
        for s, h in old.items():
            signal.signal(s, h)
    print(f"[launch] {why}", file=sys.stderr if rc else sys.stdout, flush=True)
    return rc

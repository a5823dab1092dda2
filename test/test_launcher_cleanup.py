"""Nothing left behind (issue 12 §4): `adaptive-dynamics launch` and `demo` leave the
temporary directory exactly as they found it -- after a normal end, Ctrl-C (SIGINT),
SIGTERM, and a node that dies -- and leave no node process running.

Each launch runs in a child process whose environment points TMPDIR at a fresh
directory (tempfile caches the temp directory per process, so it cannot be changed in
this one).  While the nodes run, their parameter override files are checked to be in
the launch's one private directory; afterwards the directory must hold exactly what it
held before (a sentinel file, untouched).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ros]

EXE = os.path.join(os.path.dirname(sys.executable), "adaptive-dynamics")
STARTED = "started after"  # mujoco_bridge's log line once the loop runs


def snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.is_dir(), None if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


def children(pid: int) -> dict[int, str]:
    """Direct children of ``pid``: {pid: command line}."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == pid:
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError, IndexError):
            continue
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Launch:
    """``adaptive-dynamics ARGS`` in a child process with TMPDIR = a fresh directory."""

    def __init__(self, tmp_path: Path, *args: str):
        self.tmp = tmp_path / "tmpdir"
        self.tmp.mkdir()
        (self.tmp / "sentinel.txt").write_text("must survive\n")
        self.before = snapshot(self.tmp)
        self.log = tmp_path / "output.txt"
        self.nodes: dict[int, str] = {}
        env = dict(os.environ, TMPDIR=str(self.tmp), MPLBACKEND="Agg")
        with open(self.log, "w") as fh:
            # SIGINT at its default, as in a terminal: a test run started in the background
            # by a non-interactive shell inherits SIGINT ignored, and so would the launcher
            self.proc = subprocess.Popen([EXE, *args], stdout=fh, stderr=subprocess.STDOUT, env=env,
                                         cwd=tmp_path, preexec_fn=_default_sigint)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_running(self, timeout: float = 90.0) -> None:
        """Until the loop runs; then check the override files sit in one private directory."""
        deadline = time.monotonic() + timeout
        while STARTED not in self.output():
            assert self.proc.poll() is None, f"launcher ended early:\n{self.output()[-3000:]}"
            assert time.monotonic() < deadline, f"no {STARTED!r} within {timeout} s:\n{self.output()[-3000:]}"
            self.nodes.update(children(self.proc.pid))
            time.sleep(0.1)
        self.nodes.update(children(self.proc.pid))
        assert len(self.nodes) >= 3, self.nodes
        (workdir,) = [p for p in self.tmp.iterdir() if p.name != "sentinel.txt"]
        assert workdir.is_dir() and workdir.name.startswith("ad_launch_")
        files = [p.name for p in workdir.iterdir()]
        for node in ("mujoco_bridge", "trajectory", "controller"):
            assert any(f.startswith(f"ad_{node}_") and f.endswith(".yaml") for f in files), files

    def node_pid(self, module: str) -> int:
        (pid,) = [p for p, cmd in self.nodes.items() if f"adaptive_dynamics.nodes.{module} " in cmd]
        return pid

    def finish(self, timeout: float = 60.0) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"launcher still running after {timeout} s:\n{self.output()[-3000:]}")
        return rc, self.output()

    def assert_nothing_left(self) -> None:
        assert snapshot(self.tmp) == self.before, sorted(snapshot(self.tmp))
        left = {p: cmd for p, cmd in self.nodes.items() if alive(p)}
        assert not left, f"node processes still running: {left}"

    def cleanup(self) -> None:
        """Only after a failed test: end what this test started, by pid (the launcher's
        children too when the test failed before it listed them: orphaned nodes of a
        hung graph would talk to the next tests on the same domain)."""
        if self.proc.poll() is None:
            self.nodes.update(children(self.proc.pid))
        for pid in [self.proc.pid, *self.nodes]:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


@pytest.fixture
def launch(tmp_path):
    started = []

    def start(*args: str) -> Launch:
        started.append(Launch(tmp_path, *args))
        return started[-1]

    yield start
    for la in started:
        la.cleanup()


def test_launch_normal_end(launch):
    la = launch("launch", "sim", "--duration", "1")
    rc, out = la.finish()
    assert rc == 0 and "[launch] mujoco_bridge finished" in out, out[-3000:]
    la.assert_nothing_left()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_launch_stopped_by_signal(launch, sig):
    la = launch("launch", "sim", "--duration", "0")  # runs until stopped
    la.wait_running()
    la.proc.send_signal(sig)
    rc, out = la.finish()
    assert rc == 0 and f"[launch] stopped by {sig.name}" in out, out[-3000:]
    la.assert_nothing_left()


def test_launch_node_dies(launch):
    la = launch("launch", "sim", "--duration", "0")
    la.wait_running()
    os.kill(la.node_pid("controller"), signal.SIGKILL)
    rc, out = la.finish()
    assert rc != 0 and "node 'controller' exited with code -9" in out, out[-3000:]
    la.assert_nothing_left()


def test_launch_node_with_invalid_parameter(launch):
    """A node that refuses its parameters and exits at start-up ends the launch too."""
    la = launch("launch", "sim", "--duration", "0", "--set", "controller.law=no_such_law")
    rc, out = la.finish()
    assert rc != 0 and "node 'controller' exited with code" in out, out[-3000:]
    la.assert_nothing_left()


def test_demo_normal_end(launch, tmp_path):
    la = launch("demo", "--controller", "computed_torque", "--duration", "1", "--out", str(tmp_path / "demo"))
    rc, out = la.finish(timeout=120)
    assert rc == 0 and (tmp_path / "demo" / "demo.json").exists(), out[-3000:]
    la.assert_nothing_left()


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 128 + signal.SIGTERM)],
                         ids=["SIGINT", "SIGTERM"])
def test_demo_stopped_by_signal(launch, tmp_path, sig, code):
    """The demo has no signal handler of its own: SIGINT is Python's KeyboardInterrupt,
    SIGTERM the launcher's SystemExit; both stop the nodes in order (the recorder closes
    its bag) and remove the launch's files."""
    la = launch("demo", "--controller", "computed_torque", "-v", "--duration", "300", "--out", str(tmp_path / "demo"))  # -v: node logs
    la.wait_running()
    la.proc.send_signal(sig)
    rc, out = la.finish()
    assert rc == code, out[-3000:]
    assert not any("--- " in ln for ln in out.splitlines()), out[-3000:]  # no failure report
    la.assert_nothing_left()
    (bag,) = (tmp_path / "demo").glob("bag_*")
    assert list(bag.glob("*.mcap")) and (bag / "metadata.yaml").exists()  # closed, not killed

"""The pip launcher stops each node with one SIGINT: when the required node (the bridge)
finishes, the others are interrupted once and given their grace time -- also while the
launcher waits for a draining node (the recorder) -- so a node that saves what it learned
on shutdown is not cut short by a second SIGINT.  Plain Python child processes stand in
for the nodes (no ROS)."""
from __future__ import annotations

import sys

from adaptive_dynamics import launcher
from adaptive_dynamics.scenarios import NodeSpec

SLOW_SHUTDOWN = """
import signal, sys, time
log = open(sys.argv[1], "a")
stop = []
def on_int(*_):
    log.write("SIGINT\\n"); log.flush(); stop.append(1)
signal.signal(signal.SIGINT, on_int)
while not stop:
    time.sleep(0.01)
time.sleep(1.0)          # a shutdown that takes a while (saving a model)
log.write("saved\\n"); log.flush()
"""


def test_each_node_gets_one_sigint_and_finishes_its_shutdown(tmp_path, monkeypatch):
    log = tmp_path / "signals.log"
    scripts = {"bridge": ["-c", "import time; time.sleep(0.5)"], "learner": ["-c", SLOW_SHUTDOWN, str(log)],
               "recorder": ["-c", "import time; time.sleep(1.0)"]}   # drains: the launcher waits for it
    monkeypatch.setattr(launcher, "command_line", lambda spec, workdir=None: [sys.executable, *scripts[spec.name]])
    nodes = [NodeSpec("bridge", "mujoco_bridge", required=True), NodeSpec("learner", "scqp_controller"),
             NodeSpec("recorder", "recorder", drains=True)]
    graph = launcher.GraphProcess(nodes, echo=False)
    rc, why = graph.wait(timeout=30.0)
    assert rc == 0 and why == "bridge finished", why
    assert log.read_text().splitlines() == ["SIGINT", "saved"]
    assert graph.procs["learner"].returncode == 0

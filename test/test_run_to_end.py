"""launcher.run_to_end, the one way a graph is run: companions attached to the running
graph and always closed, their problems and a node's failure raised with the nodes' last
log lines, a timeout that is the planned end.  The "nodes" are tiny Python processes
(the launcher's command line is replaced), so this runs without DDS."""
from __future__ import annotations

import sys

import pytest

from adaptive_dynamics import launcher
from adaptive_dynamics.scenarios import NodeSpec
from adaptive_dynamics.launcher import GraphFailed, run_to_end

SCRIPTS = {"ok": "print('working'); print('done')", "fails": "print('something broke'); raise SystemExit(3)",
           "hangs": "import time; print('waiting'); time.sleep(60)"}


@pytest.fixture
def fake_nodes(monkeypatch):
    monkeypatch.setattr(launcher, "command_line", lambda spec, workdir=None: [sys.executable, "-c", SCRIPTS[spec.name]])

    def nodes(*names):
        return [NodeSpec(name, "trajectory", required=(k == 0)) for k, name in enumerate(names)]
    return nodes


class Companion:
    def __init__(self, problems=()):
        self.graph, self.closed, self._problems = None, 0, list(problems)

    def attach(self, graph):
        self.graph = graph

    def close(self):
        self.closed += 1

    def problems(self):
        return self._problems


def test_a_clean_end_with_a_companion(fake_nodes):
    c = Companion()
    res = run_to_end(fake_nodes("ok"), timeout=30, companions=[c])
    assert (res.code, res.why) == (0, "ok finished") and res.wall_s > 0
    assert c.graph is not None and c.closed == 1
    assert res.logs == {"ok": ["working", "done"]}


def test_a_companion_problem_fails_the_run(fake_nodes):
    class Plain:   # a companion without attach() or problems() (a sampler started beforehand) is fine
        closed = 0

        def close(self):
            self.closed += 1
    c, plain = Companion(["a switch was refused"]), Plain()
    with pytest.raises(GraphFailed, match="the run: \\['a switch was refused'\\]"):
        run_to_end(fake_nodes("ok"), timeout=30, companions=[c, plain], what="the run")
    assert c.closed == plain.closed == 1


def test_a_failing_node_raises_with_its_last_log_lines(fake_nodes):
    c = Companion()
    with pytest.raises(GraphFailed) as err:
        run_to_end(fake_nodes("hangs", "fails"), timeout=30, companions=[c], tail=1)
    assert err.value.code == 3 and "'fails' exited with code 3" in err.value.why
    assert err.value.logs["fails"] == ["something broke"] and "something broke" in str(err.value)
    assert c.closed == 1


def test_a_timeout_is_a_failure_unless_it_is_the_planned_end(fake_nodes):
    with pytest.raises(GraphFailed) as err:
        run_to_end(fake_nodes("hangs"), timeout=1.0)
    assert err.value.code == 124
    res = run_to_end(fake_nodes("hangs"), timeout=1.0, timeout_ok=True)
    assert res.code == 124 and res.logs["hangs"][0] == "waiting"   # then the SIGINT it was stopped with


# ----------------------------------------------------------------------------- in process
def _hangs(argv):
    """A node that runs until its context is shut down (what InProcessGraph.stop does)."""
    import time

    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from adaptive_dynamics.ros.node_base import _thread_graph
    ctx = _thread_graph.context
    rclpy.init(args=argv, context=ctx, signal_handler_options=SignalHandlerOptions.NO)
    while ctx.ok():
        time.sleep(0.01)
    return 0


def _fails(argv):
    raise RuntimeError("something broke")


@pytest.fixture
def fake_modules(monkeypatch):
    """InProcessGraph imports ``spec.module`` and runs its ``main`` on a thread: fakes by name."""
    import types

    from adaptive_dynamics import inprocess
    mains = {"ok": lambda argv: 0, "fails": _fails, "hangs": _hangs, "exits": lambda argv: (_ for _ in ()).throw(
        SystemExit(3))}
    monkeypatch.setattr(inprocess, "import_node_module",
                        lambda module: types.SimpleNamespace(main=mains[module.rsplit(".", 1)[1]]))

    def nodes(*names):
        return [NodeSpec(name, name, required=(k == 0)) for k, name in enumerate(names)]
    return nodes


def test_in_process_a_clean_end_stops_the_others(fake_modules):
    from adaptive_dynamics.inprocess import InProcessGraph
    c = Companion()
    res = run_to_end(fake_modules("ok", "hangs"), timeout=30, companions=[c], graph="inprocess")
    assert (res.code, res.why) == (0, "ok finished") and isinstance(c.graph, InProcessGraph)
    assert c.closed == 1 and not any(t.is_alive() for t in c.graph.threads.values())


def test_in_process_a_failing_node_raises_with_its_traceback(fake_modules):
    with pytest.raises(GraphFailed) as err:
        run_to_end(fake_modules("hangs", "fails"), timeout=30, graph="inprocess")
    assert err.value.code == 1 and "'fails' exited with code 1" in err.value.why
    assert "RuntimeError: something broke" in "".join(err.value.logs["fails"])
    with pytest.raises(GraphFailed) as err:
        run_to_end(fake_modules("hangs", "exits"), timeout=30, graph="inprocess")
    assert err.value.code == 3


def test_in_process_timeout_and_the_graph_kind(fake_modules):
    from adaptive_dynamics.launcher import graph_kind
    with pytest.raises(GraphFailed) as err:
        with graph_kind("inprocess"):   # what an experiment's --graph inprocess sets
            run_to_end(fake_modules("hangs"), timeout=0.5)
    assert err.value.code == 124
    with pytest.raises(ValueError, match="graph 'threads'"):
        run_to_end(fake_modules("ok"), timeout=1, graph="threads")
    with pytest.raises(ValueError, match="graph 'threads'"):
        with graph_kind("threads"):
            pass

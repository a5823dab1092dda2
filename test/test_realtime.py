"""adaptive_dynamics.realtime: SCHED_FIFO for every thread of a node process.

Each case runs in a child process (a FIFO pytest would outrank everything else on the
machine); the child's threads are read back from outside with ``os.sched_getscheduler``
(the kernel's view, independent of the module's own bookkeeping).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from adaptive_dynamics.realtime import MAX_PRIORITY, raise_thread_priority, set_fifo_priority, thread_policies

pytestmark = pytest.mark.skipif(not hasattr(os, "sched_setscheduler"), reason="Linux only")


def _fifo_permitted() -> bool:
    code = "import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


needs_rt = pytest.mark.skipif(not _fifo_permitted(), reason="SCHED_FIFO not permitted here (no rtprio)")

_CHILD = textwrap.dedent("""
    import json, os, sys, threading, time
    from adaptive_dynamics.realtime import set_fifo_priority
    stop = threading.Event()
    early = [threading.Thread(target=stop.wait, daemon=True) for _ in range(3)]
    for t in early:
        t.start()
    if sys.argv[2] == "deny":  # the 3rd thread refuses: nothing may be left changed
        real, calls = os.sched_setscheduler, []
        def flaky(tid, policy, param):
            calls.append(tid)
            if len(calls) == 3:
                raise PermissionError(1, "Operation not permitted")
            return real(tid, policy, param)
        os.sched_setscheduler = flaky
    ok, msg = set_fifo_priority(int(sys.argv[1]))
    late = threading.Thread(target=stop.wait, daemon=True)  # created after: inherits the policy
    late.start()
    print(json.dumps({"ok": ok, "msg": msg, "late": late.native_id}), flush=True)
    sys.stdin.readline()
""")


def _run_child(priority: int, mode: str = "ok"):
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(priority), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        out = json.loads(proc.stdout.readline())
        return out, thread_policies(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)


@needs_rt
def test_every_thread_and_later_ones_become_fifo():
    out, pol = _run_child(37)
    assert out["ok"], out["msg"]
    assert len(pol) >= 5  # main + 3 early + the late one
    assert set(pol.values()) == {("SCHED_FIFO", 37)}
    assert pol[out["late"]] == ("SCHED_FIFO", 37)
    assert f"on {len(pol) - 1} threads" in out["msg"]  # every thread that existed at the call


def test_refusal_changes_nothing_and_says_how_to_allow_it():
    out, pol = _run_child(20, "deny")
    assert not out["ok"]
    assert "not permitted" in out["msg"] and "rtprio" in out["msg"]
    assert set(p for p, _ in pol.values()) == {"SCHED_OTHER"}  # the two changed threads restored


_RAISE_CHILD = textwrap.dedent("""
    import json, sys, threading
    from adaptive_dynamics.realtime import raise_thread_priority, set_fifo_priority
    ok, msg = set_fifo_priority(int(sys.argv[1]))
    stop, out = threading.Event(), {}
    def loop():
        out["prio"] = raise_thread_priority(1)
        out["tid"] = threading.get_native_id()
        ready.set()
        stop.wait()
    ready = threading.Event()
    threading.Thread(target=loop, daemon=True).start()
    ready.wait()
    print(json.dumps({"ok": ok, "msg": msg, **out}), flush=True)
    sys.stdin.readline()
""")


@needs_rt
@pytest.mark.parametrize("priority", [40, MAX_PRIORITY])
def test_a_loop_thread_goes_one_priority_above_its_process(priority):
    """The bridge's tick loop: only the calling thread is raised (capped at MAX_PRIORITY)."""
    proc = subprocess.Popen([sys.executable, "-c", _RAISE_CHILD, str(priority)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        out = json.loads(proc.stdout.readline())
        pol = thread_policies(proc.pid)
    finally:
        proc.stdin.close()
        proc.wait(timeout=10)
    assert out["ok"], out["msg"]
    want = min(priority + 1, MAX_PRIORITY)
    assert out["prio"] == want and pol[out["tid"]] == ("SCHED_FIFO", want)
    assert {v for t, v in pol.items() if t != out["tid"]} == {("SCHED_FIFO", priority)}


def test_raising_a_normally_scheduled_thread_changes_nothing():
    before = thread_policies()
    assert raise_thread_priority(1) is None
    assert thread_policies() == before


@pytest.mark.parametrize("priority", [0, -1, MAX_PRIORITY + 1])
def test_priority_out_of_range_is_refused(priority):
    before = thread_policies()
    ok, msg = set_fifo_priority(priority)
    assert not ok and "outside" in msg
    assert thread_policies() == before


@needs_rt
@pytest.mark.ros
def test_node_parameter_puts_the_node_process_on_fifo(tmp_path):
    """``realtime_priority`` on a controller node: every thread of its process (executor,
    hot path, DDS) is SCHED_FIFO at that priority, and its diagnostics say so."""
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-m", "adaptive_dynamics.nodes.controller", "--ros-args",
                             "-r", f"__ns:=/rt_{os.getpid()}", "-p", "robot:=planar2",
                             "-p", "realtime_priority:=23"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        lines = []
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
            if "realtime_priority:" in line:
                break
        assert any("SCHED_FIFO priority 23" in ln for ln in lines), "".join(lines)
        pol = thread_policies(proc.pid)
        assert len(pol) > 5 and set(pol.values()) == {("SCHED_FIFO", 23)}, pol
        names = {open(f"/proc/{proc.pid}/task/{t}/comm").read().strip() for t in pol}
        assert any(n.startswith("dds.") for n in names)  # the DDS receive threads too
    finally:
        proc.terminate()
        proc.wait(timeout=15)


# ------------------------------------------------------------------ overload episodes
def _episodes(seq, **kw):
    from adaptive_dynamics.realtime import OverloadTracker
    o = OverloadTracker(1e-3, **kw)
    events = [(i, e) for i, m in enumerate(seq) if (e := o.tick(bool(m)))]
    return o, events


def test_a_stall_is_one_episode_and_isolated_misses_are_none():
    rng = np.random.default_rng(0)
    base = rng.random(20000) < 0.01                       # a 1 % baseline of isolated misses
    o, ev = _episodes(base)
    assert o.count == 0 and ev == []
    seq = base.copy()
    seq[5000:5050] = True                                 # 50 ms without answers
    o, ev = _episodes(seq)
    assert o.count == 1 and [e for _, e in ev] == ["start", "end"]
    (ep,) = o.episodes
    assert ep["start_tick"] <= 5000 and 5049 <= ep["end_tick"] <= 5060, ep   # not prolonged by the baseline
    assert 50.0 <= ep["duration_ms"] <= 62.0 and ep["missed"] >= 50
    assert ev[1][0] == ep["end_tick"] + o.quiet           # declared over after `quiet` calm periods
    s = o.summary()
    assert s["overload_episodes"] == 1 and not s["overload_active"] and s["overload_last_ms"] == ep["duration_ms"]


def test_episode_threshold_and_skipped_periods():
    seq = np.zeros(1000, dtype=bool)
    seq[100:109] = True                                   # 9 of 20: below the 10 that start one
    o, _ = _episodes(seq)
    assert o.count == 0
    from adaptive_dynamics.realtime import OverloadTracker
    log = []
    o = OverloadTracker(1e-3, miss_log=type("Log", (), {"add": lambda self, t: log.append(t)})())
    for _ in range(10):
        o.tick(False)
    assert o.skipped(50) == ["start"] and o.active and o.ticks == 60 and o.current_ms == 50.0
    assert log == list(range(10, 60))                     # every missed period's index, skipped ones too
    for _ in range(200):
        o.tick(False)
    assert not o.active and o.episodes[0]["duration_ms"] == 50.0 and o.episodes[0]["start_tick"] == 10
    o.tick(True)
    assert log[-1] == o.ticks - 1 and len(log) == 51
    # a final report lists an episode still running (open) too: count entries
    assert o.all_episodes() == o.episodes and o.count == 1
    o.skipped(30)
    open_ep = o.all_episodes()[-1]
    assert o.active and o.count == 2 == len(o.all_episodes()) and open_ep["open"]
    assert open_ep["end_tick"] == o.ticks - 1 and open_ep["missed"] >= 30
    with pytest.raises(ValueError):
        OverloadTracker(1e-3, window=5, start_misses=6)


def test_an_episode_starts_at_the_oldest_miss_of_its_window_not_an_old_isolated_one():
    """Isolated misses every 15 periods keep the window non-empty; the episode of a later
    burst starts within the burst's window, and a second burst's episode after the first."""
    seq = np.zeros(3000, dtype=bool)
    seq[100:1000:15] = True                               # a dense baseline of isolated misses
    seq[1000:1030] = True                                 # burst 1 (30 periods)
    seq[1200:1300:15] = True
    seq[1300:1340] = True                                 # burst 2 (40 periods)
    o, _ = _episodes(seq)
    e1, e2 = o.episodes
    assert 1000 - 20 < e1["start_tick"] <= 1000 and e1["end_tick"] == 1029
    assert e1["duration_ms"] <= 50.0 and e1["missed"] >= 30
    assert e2["start_tick"] > e1["end_tick"] and 1300 - 20 < e2["start_tick"] <= 1300 and e2["end_tick"] == 1339


def test_skipped_periods_are_bounded_work_and_every_event_is_returned():
    from adaptive_dynamics.realtime import OverloadTracker
    o = OverloadTracker(1e-3)
    t0 = time.perf_counter()
    assert o.skipped(5_000_000) == ["start"]              # 83 minutes asleep: no 5 M Python ticks
    assert time.perf_counter() - t0 < 0.5
    assert o.ticks == 5_000_000 and o.current_ms == 5_000_000.0
    for _ in range(100):
        o.tick(False)
    assert not o.active and o.episodes[0]["duration_ms"] == 5_000_000.0 and o.episodes[0]["missed"] == 5_000_000

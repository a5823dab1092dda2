"""Recovery of the 1 kHz real-time loop from a transient overload, over real DDS with
the nodes as separate processes (bridge, trajectory, controller as `launch sim
mode:=realtime` starts them).

A 50 ms stall is injected into the controller's hot path, later a 50 ms stall into the
bridge's own loop, later a 120 ms controller stall (``inject_stall_ms``, the fault
drill every hot node has).  Each one is an overload episode the bridge counts and
reports in ``/diagnostics``; the deadline-miss rate is back at its baseline (+ 1 %, within
the counting noise of the window) within 1 s of each stall; the plant never ran on a command older than ``command_timeout``: the
120 ms stall ends in the safe action."""
from __future__ import annotations

import gc
import json

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from rcl_interfaces.srv import SetParameters
from rclpy.parameter import Parameter
from rosgraph_msgs.msg import Clock

from adaptive_dynamics.scenarios import build_graph
from adaptive_dynamics.launcher import GraphProcess
from adaptive_dynamics.ros.qos import CLOCK_QOS

pytestmark = [pytest.mark.ros, pytest.mark.slow, pytest.mark.realtime]
STALLS = ((2.5, "controller", 50.0), (4.5, "mujoco_bridge", 50.0), (6.5, "controller", 120.0))   # sim s
DURATION = 9.0
COMMAND_TIMEOUT_MS = 50.0


def test_the_loop_recovers_from_stalls_and_reports_them(ros, tmp_path):
    stats_file = tmp_path / "stats.json"
    nodes = build_graph("sim", robot="panda", mode="realtime", duration=DURATION,
                        overrides={"mujoco_bridge": {"stats_file": str(stats_file),
                                                     "command_timeout": COMMAND_TIMEOUT_MS * 1e-3}})
    probe = ros.node("stall_driver")
    clients = {n: probe.create_client(SetParameters, f"/{n}/set_parameters") for n in ("controller", "mujoco_bridge")}
    clock, diags = [0.0], []
    probe.create_subscription(Clock, "/clock", lambda m: clock.__setitem__(0, m.clock.sec + 1e-9 * m.clock.nanosec),
                              CLOCK_QOS)
    probe.create_subscription(DiagnosticArray, "/diagnostics",
                              lambda m: diags.extend(s for s in m.status if "mujoco_bridge" in s.name), 50)
    # this test process shares the two CPUs with the real-time graph: after hundreds of tests
    # its heap is large, and a full garbage collection in the middle of the run would be
    # the host's noise in the loop's statistics -- frozen for the run
    gc.collect()
    gc.freeze()
    g = GraphProcess(nodes, echo=False)
    try:
        for at, node, ms in STALLS:
            assert ros.spin_until(lambda: clock[0] >= at, timeout=60.0), f"sim time stuck at {clock[0]}"
            req = SetParameters.Request(parameters=[Parameter("inject_stall_ms", value=ms).to_parameter_msg()])
            (res,) = ros.call(clients[node], req).results
            assert res.successful, res.reason
        ros.spin_until(lambda: clock[0] >= DURATION - 0.3, timeout=60.0)   # the last diagnostics too
        rc, why = g.wait(timeout=60.0)
    finally:
        g.stop()
        gc.unfreeze()
    assert rc == 0, (why, {k: v[-10:] for k, v in g.logs.items()})
    st = json.loads(stats_file.read_text())

    # every stall is an overload episode, over (the misses back to isolated ones) well within 1 s
    # of its start; the host may add short episodes of its own (a vCPU taken away)
    eps = st["overload"]
    assert st["overload_episodes"] == len(eps) >= len(STALLS), eps
    # a host that overloads the loop by itself, away from every stall, is no place for a
    # recovery drill (a slow VM: its episodes fell inside the stalls' windows too) -- said, not passed
    windows = [(1000 * at, 1000 * at + 1000) for at, _, _ in STALLS]
    host = [e for e in eps if e["end_tick"] >= 500      # the start-up is before the baseline window
            and not any(e["start_tick"] <= b and e["end_tick"] >= a for a, b in windows)]
    if host:
        pytest.skip(f"the host overloaded the 1 kHz loop by itself, away from the stalls: {host}")
    stall_eps = []
    for at, node, ms in STALLS:   # the drill is set once the probe sees /clock (20 Hz) pass `at`
        match = [e for e in eps if e["start_tick"] <= 1000 * at + 400 and e["end_tick"] >= 1000 * at]
        assert match, (node, at, eps)
        # the stall is the longest episode there; a short one of the host's beside it (a vCPU
        # taken away a few hundred ms later) is allowed if it too is over within 1 s of the stall
        e = max(match, key=lambda m: m["duration_ms"])
        assert all(m["end_tick"] <= 1000 * at + 1000 for m in match), (node, at, match)
        assert ms - 5 <= e["duration_ms"] <= 1000.0, (node, ms, e)
        stall_eps.append(e)
    assert all(e["duration_ms"] <= 1000.0 for e in eps), eps
    # the miss rate: before the first stall (baseline) and from 1 s after each stall's start
    # to the next stall, at most the baseline + 1 %; the periods of the host's own episodes
    # (each reported, each over within 1 s: asserted above) and its shorter bursts (a window
    # of 20 periods with the 5 misses OverloadTracker calls dense, away from the stalls: a
    # vCPU taken away for a few ms) are left out of both -- what is measured is the
    # controller's and the bridge's own rate of isolated misses
    missed = np.asarray(st["missed_ticks"])
    ticks = np.arange(st["ticks"])
    own = np.zeros(st["ticks"], dtype=bool)
    for e in eps:
        if e not in stall_eps:
            own[e["start_tick"]:e["end_tick"] + 1] = True
    is_missed = np.zeros(st["ticks"], dtype=bool)
    is_missed[missed[missed < st["ticks"]]] = True
    near_episode = np.zeros(st["ticks"], dtype=bool)   # windows that still hold an episode's misses
    for e in eps:
        near_episode[e["start_tick"]:e["end_tick"] + 20] = True
    window = np.convolve(is_missed.astype(int), np.ones(20, dtype=int))[:st["ticks"]]   # misses in [t-19, t]
    burst = np.zeros(st["ticks"], dtype=bool)
    for t in np.flatnonzero((window >= 5) & ~near_episode):
        burst[max(0, t - 19):t + 1] = True
    starts = np.flatnonzero(np.diff(np.r_[0, burst.astype(int)]) == 1)
    ends = np.flatnonzero(np.diff(np.r_[burst.astype(int), 0]) == -1)
    bursts = len(starts)
    # ... and they are the host's only if short and few: a loop that stays in a dense pattern
    # after a stall (a collapse below the episode threshold) makes one long stretch
    assert np.sum(burst) <= 0.05 * st["ticks"] and np.all(ends - starts < 200), list(zip(starts, ends))
    own |= burst

    def rate(a, b):
        keep = (ticks >= a) & (ticks < b) & ~own
        return float(np.sum(is_missed & keep)) / max(1, int(np.sum(keep)))

    baseline = rate(500, stall_eps[0]["start_tick"])
    nxt = [e["start_tick"] for e in stall_eps[1:]] + [st["ticks"]]
    print(f"miss rate: baseline {baseline:.4f}, after each stall "
          f"{[round(rate(e['start_tick'] + 1000, end), 4) for e, end in zip(stall_eps, nxt)]},"
          f" {bursts} host bursts left out")
    for e, end in zip(stall_eps, nxt):
        after = rate(e["start_tick"] + 1000, end)
        where = [int(t) for t in missed if e["start_tick"] + 1000 <= t < end and not own[t]]
        # back at the baseline + 1 %, within the counting noise of a window of ~1000 periods
        # (isolated misses are a Poisson count: three standard deviations at the baseline rate)
        n_after = int(np.sum((ticks >= e["start_tick"] + 1000) & (ticks < end) & ~own))
        noise = 3.0 * np.sqrt(max(baseline, 0.002) / max(1, n_after))
        assert after <= baseline + 0.01 + noise, (e, after, baseline, noise, where[:40], eps,
                                                  f"{bursts} host stretches left out")
    # the plant ran on ageing commands up to command_timeout, never beyond: the 120 ms stall
    # ends in the safe action
    assert COMMAND_TIMEOUT_MS - 5.0 <= st["command_age_max_ms"] <= COMMAND_TIMEOUT_MS + 1.0, st["command_age_max_ms"]
    assert st["command_timeouts"] >= 60, st["command_timeouts"]
    # /diagnostics said so
    last = {kv.key: kv.value for kv in diags[-1].values}
    assert int(last["overload_episodes"]) == len(eps), last
    assert float(last["overload_longest_ms"]) >= 100.0
    assert any(s.level == DiagnosticStatus.WARN for s in diags), "no WARN status for the overload episodes"

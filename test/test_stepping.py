"""The simulated robot's stepping policy (``sim/stepping.PlantStepper``) without ROS:
lockstep steps only on the command stamped for the waiting state, the real-time tick
runs on the newest valid command within ``command_timeout`` and then on the safe action;
each compared with the plant stepped by hand."""
from __future__ import annotations

import time
from collections import Counter

import numpy as np

from adaptive_dynamics.sim.plant import MujocoPlant
from adaptive_dynamics.sim.stepping import PlantStepper

SETTINGS = {"safe_mode": "damping", "safe_damping": 2.0, "command_timeout": 0.005, "lockstep_timeout": 0.05,
            "lockstep_accept_unstamped": False}


def _stepper(lockstep: bool, **over):
    counts, logs = Counter(), []
    st = PlantStepper(MujocoPlant("planar2"), {**SETTINGS, **over}, lockstep=lockstep,
                      count=lambda k, n=1: counts.update({k: n}), gauge=lambda k, v: None,
                      log=lambda level, text, key=None: logs.append((level, text)))
    return st, counts, logs


def test_lockstep_steps_on_the_answer_to_the_waiting_state_only():
    st, counts, logs = _stepper(True)
    twin = MujocoPlant("planar2")
    tau = np.array([0.3, -0.2])
    stamp = st.state()[0]
    assert not st.on_command(stamp + 1_000_000, tau, time.time_ns())         # another state's answer
    assert not st.on_command(None, tau, time.time_ns())                       # unstamped
    assert st.plant.steps == 0 and counts["stale_commands"] == 1 and counts["unstamped_commands"] == 1
    assert st.on_command(stamp, tau, time.time_ns())
    twin.step(tau)
    np.testing.assert_array_equal(st.plant.state()[1], twin.state()[1])
    # a malformed answer to the waiting state: one step with the safe action (damping)
    stamp = st.state()[0]
    assert st.on_command(stamp, None, time.time_ns(), error="3 values for 2 joints")
    twin.step_safe("damp", damping=2.0)
    np.testing.assert_array_equal(st.plant.state()[2], twin.state()[2])
    assert counts["rejected_commands"] == 1 and counts["safe_steps"] == 1 and counts["steps"] == 1
    assert st.latency_ns.total == 2 and logs[-1][0] == "error"


def test_lockstep_accepts_unstamped_commands_when_told_to_and_times_out():
    st, counts, _ = _stepper(True, lockstep_accept_unstamped=True, lockstep_timeout=0.0)
    st.state()
    assert st.on_command(None, np.zeros(2), time.time_ns()) and st.plant.steps == 1
    st.state()
    time.sleep(0.002)
    assert st.lockstep_timed_out() and counts["lockstep_timeouts"] == 1


def test_realtime_tick_holds_the_newest_command_then_the_safe_action():
    st, counts, _ = _stepper(False)
    twin = MujocoPlant("planar2")
    assert st._tick() is None                    # start-up: no command yet -> safe action
    twin.step_safe("damp", damping=2.0)
    assert counts["startup_steps"] == 1
    stamp = st.state()[0]
    tau = np.array([1.0, 0.5])
    st.on_command(stamp, tau, 0)                 # the answer in time: stepped at once
    twin.step(tau)
    assert st.answered and counts["steps"] == 1
    st._tick()                                   # the tick only publishes
    assert st.plant.steps == twin.steps == 2 and counts["deadline_misses"] == 0
    for _ in range(5):                           # no answer: the newest command, each a miss
        st._tick()
        twin.step(tau)
    np.testing.assert_array_equal(st.plant.state()[1], twin.state()[1])
    assert counts["deadline_misses"] == 5
    while st.plant.time - st._latest_cmd_time <= SETTINGS["command_timeout"]:
        st._tick()
    st._tick()                                   # older than command_timeout: safe action
    assert counts["command_timeouts"] >= 1 and counts["safe_steps"] == 2
    out = st.stats(dict(counts))
    assert out["plant_steps"] == st.plant.steps and out["deadline_misses"] == counts["deadline_misses"]

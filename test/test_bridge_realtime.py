"""The real-time bridge's cycle, over real DDS (bridge in-process, its loop on its own thread).

Each published state is checked against an independent one-step simulation (a second
:class:`MujocoPlant` reset to the previous published state): which command actually
drove each step.

* Answers that arrive within the period drive the very next step (the bridge steps
  when the answer arrives and publishes at the tick), and only steps that ran on an
  older command are counted as deadline misses.
* Answers that always come one cycle late: every tick misses, each step runs on the
  newest command in hand (the previous state's answer), and the latency (state
  published -> command received by DDS) is at least a period.
"""
from __future__ import annotations

import numpy as np
import pytest
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray

from adaptive_dynamics.nodes.robot_params import resolve_urdf
from adaptive_dynamics.nodes.mujoco_bridge import MujocoBridgeNode
from adaptive_dynamics.ros.commands import stamped_command_msg
from adaptive_dynamics.ros.qos import COMMAND_QOS, RELIABLE_STREAM_QOS
from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig

pytestmark = pytest.mark.ros
ROBOT = "planar2"
RATE = 100.0   # 10 ms periods: an in-process Python answer comes well inside one
PERIOD_NS = int(1e9 / RATE)


def _stamp(msg) -> int:
    return msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec


def _law(q, v, stamp):
    """A stabilising PD plus a stamp-dependent offset, so every cycle's command differs."""
    return -20.0 * q - 2.0 * v + (0.3 if (stamp // PERIOD_NS) % 2 else -0.3)


def _run(ros, late: bool, cycles: int = 60):
    bridge = ros.add(MujocoBridgeNode, robot=ROBOT, mode="realtime", rate_hz=RATE, wait_for_nodes=0,
                     command_timeout=1.0, friction_viscous=[0.05], friction_coulomb=[0.1])
    node = ros.node("answer")
    pub = node.create_publisher(Float64MultiArray, "effort_controller/commands", COMMAND_QOS)
    states, answers = [], {}

    def on_state(msg):
        states.append(msg)
        if late and len(states) < 2:
            return
        src = states[-2] if late else msg      # late: answer the previous state now
        st = _stamp(src)
        tau = _law(np.asarray(src.position), np.asarray(src.velocity), st)
        answers[st] = tau
        pub.publish(stamped_command_msg(tau, st))

    node.create_subscription(JointState, "joint_states", on_state, RELIABLE_STREAM_QOS)
    assert ros.spin_until(lambda: len(states) > cycles, timeout=20.0), "the bridge did not run"
    with bridge.lock:   # the loop steps under this lock: counters and plant are consistent
        stats = bridge.stats()
    return bridge, states[:cycles + 1], answers, stats


def _driver(bridge, states, answers):
    """For each published step k -> k+1: the stamp of the answer that reproduces it
    (one step of an independent plant from the published state k), or None."""
    p = bridge.p
    off = MujocoPlant(resolve_urdf(p), joint_names=bridge.names, reality=RealityConfig.from_node_parameters(p),
                      timestep=bridge.dt, integrator=p["integrator"])
    out = []
    for a, b in zip(states[:-1], states[1:]):
        found = None
        for st in sorted(answers, reverse=True):
            if st > _stamp(a):
                continue
            off.reset(np.asarray(a.position), np.asarray(a.velocity))
            off.step(answers[st])
            q, v = off.true_state()
            if np.allclose(q, b.position, rtol=0, atol=1e-12) and np.allclose(v, b.velocity, rtol=0, atol=1e-10):
                found = st
                break
        out.append(found)
    return out


def test_in_time_answers_drive_the_next_step(ros):
    bridge, states, answers, stats = _run(ros, late=False)
    first = min(answers)
    steps = [(a, d) for a, d in zip(states[:-1], _driver(bridge, states, answers)) if _stamp(a) >= first]
    assert len(steps) >= 40
    # every step ran on a command that had been sent for it or for an earlier state
    assert all(d is not None for _a, d in steps), "a step ran on a command nobody sent"
    own = sum(d == _stamp(a) for a, d in steps)
    older = len(steps) - own
    assert own >= 0.8 * len(steps), f"only {own} of {len(steps)} steps ran on their own answer"
    # the misses the bridge counted are the steps that ran on an older command (it has
    # stepped a little further than the states collected here; those cycles are answered too)
    assert older <= stats.get("deadline_misses", 0) <= older + 3
    assert stats["latency_samples"] >= len(steps) and stats["latency_p50_ms"] < 1e3 / RATE


def test_late_answers_are_deadline_misses(ros):
    bridge, states, answers, stats = _run(ros, late=True)
    first = min(answers)
    steps = [(a, d) for a, d in zip(states[:-1], _driver(bridge, states, answers)) if _stamp(a) > first]
    assert len(steps) >= 40
    # the answer to state k comes after tick k+1: each step runs on an older answer
    assert all(d is not None and d < _stamp(a) for a, d in steps)
    assert sum(d == _stamp(a) - PERIOD_NS for a, d in steps) >= 0.8 * len(steps)
    assert stats["deadline_misses"] >= len(steps)
    assert stats["late_commands"] >= 0.8 * len(steps)
    assert stats["latency_p50_ms"] >= 1e3 / RATE

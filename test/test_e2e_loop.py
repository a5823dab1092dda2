"""End to end over real DDS: mujoco_bridge + trajectory + computed-torque controller
(+ recorder) in lockstep as separate processes, started by the pip launcher -- and the
same graph in one process (:class:`~adaptive_dynamics.inprocess.InProcessGraph`, what the
experiments' quick runs use).

Asserts: the graph ends by itself after 5 s of sim time; the MCAP bag is complete
(one joint_states and one command per step, checked with an independent reader,
``mcap`` + ``mcap-ros2-support``); tracking error below a bound derived from the
unmodelled friction; identical results on the second run, in process (lockstep
determinism: the same nodes on the same inputs, however they are hosted).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from mcap_ros2.reader import read_ros2_messages

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.scenarios import build_graph, config_path
from adaptive_dynamics.ros.params import load_param_file
from adaptive_dynamics.inprocess import InProcessGraph
from adaptive_dynamics.launcher import GraphProcess
from adaptive_dynamics.robots import friction

pytestmark = [pytest.mark.ros, pytest.mark.slow]
DURATION = 5.0


def run_loop(tmp_path, tag, graph=GraphProcess):
    bag = tmp_path / f"bag_{tag}"
    stats = tmp_path / f"stats_{tag}.json"
    nodes = build_graph("sim", robot="panda", controller="computed_torque", duration=DURATION, record=True,
                        bag=str(bag), overrides={"mujoco_bridge": {"stats_file": str(stats)}})
    g = graph(nodes, echo=False)
    rc, why = g.wait(timeout=240)
    assert rc == 0, (why, {k: v[-15:] for k, v in g.logs.items()})
    return bag, json.loads(stats.read_text())


def read_bag(bag):
    (mcap_file,) = list(bag.glob("*.mcap"))
    counts, states, refs = {}, {}, {}
    answered = []
    for m in read_ros2_messages(str(mcap_file)):
        topic = m.channel.topic
        counts[topic] = counts.get(topic, 0) + 1
        msg = m.ros_msg
        if topic == "/joint_states":
            t = msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec
            states[t] = (np.array(msg.position), np.array(msg.velocity), np.array(msg.effort))
        elif topic == "/effort_controller/commands":
            label = msg.layout.dim[0].label
            if label.startswith("joints@"):
                answered.append(int(label.split("@")[1]))
        elif topic == "/reference":
            t0 = msg.header.stamp.sec * 10 ** 9 + msg.header.stamp.nanosec
            for pt in msg.points:
                dt = pt.time_from_start.sec * 10 ** 9 + pt.time_from_start.nanosec
                refs[t0 + dt] = np.array(pt.positions)
    counts["answered"] = answered
    return counts, states, refs


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("loop")
    return [run_loop(tmp, "a"), run_loop(tmp, "b", InProcessGraph)]


def test_bag_complete_and_readable_by_independent_reader(two_runs):
    (bag, stats), _ = two_runs
    steps = int(round(DURATION * 1000))
    counts, states, refs = read_bag(bag)
    assert stats["plant_steps"] == steps and stats.get("lockstep_timeouts", 0) == 0
    assert counts["/joint_states"] == steps  # states of steps 0 .. steps-1, none dropped
    # exactly one stamped command answers each state;
    assert sorted(counts["answered"]) == sorted(states)
    # the others are the controller's unstamped watchdog/shutdown zeros, which the lockstep
    # bridge ignores (and counts)
    assert len(counts["answered"]) == steps
    assert len(states) == steps and all(t in refs for t in states)
    assert (bag / "metadata.yaml").exists()


def test_tracking_error_bound(two_runs):
    """Computed torque with the exact rigid-body model: the only mismatch is the joint
    friction f (viscous + Coulomb), so e'' + Kd e' + Kp e = M^-1 f and the error stays
    below max |M^-1 f| / Kp (steady-state bound; x2 margin for transients)."""
    (bag, _), _ = two_runs
    _, states, refs = read_bag(bag)
    ts = sorted(states)
    E = np.array([refs[t] - states[t][0] for t in ts])
    rmse = np.sqrt(np.mean(E[len(ts) // 10:] ** 2, axis=0))
    rm = RobotModel("panda")
    fv, fc = friction("panda")
    bound = 0.0
    for t in ts[::500]:
        q, v, _ = states[t]
        f = np.abs(fv * v) + fc
        bound = max(bound, float(np.max(np.abs(np.linalg.solve(rm.mass_matrix(q), f)))))
    kp = load_param_file(config_path("sim.yaml"), "controller")["kp"][0]
    bound = 2.0 * bound / kp
    assert np.all(rmse < bound), (rmse, bound)


def test_lockstep_is_deterministic_in_processes_and_in_process(two_runs):
    """The same code path on the same inputs: bit-identical states, whether each node is a
    process or a thread of one."""
    (bag_a, _), (bag_b, _) = two_runs
    _, sa, _ = read_bag(bag_a)
    _, sb, _ = read_bag(bag_b)
    assert sorted(sa) == sorted(sb)
    for t in sa:
        for x, y in zip(sa[t], sb[t]):
            np.testing.assert_array_equal(x, y)

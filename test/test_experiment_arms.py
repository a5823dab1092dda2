"""`experiment arms --quick` through the user's graph (demo's nodes, parameter files and DDS
topics; here on threads of the test's process) on one light, one medium and one heavy arm
of example-robot-data, each with a payload sized to it; and `demo` (processes) with a gain
set the plant cannot take: the watchdog trips, says why, and no torque is NaN."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from adaptive_dynamics.experiments.arms import ARMS, QUICK_ARMS, TARGETS, main, robots_dir

EXE = os.path.join(os.path.dirname(sys.executable), "adaptive-dynamics")
try:
    ERD = robots_dir()
except FileNotFoundError:
    ERD = None
pytestmark = [pytest.mark.ros, pytest.mark.skipif(ERD is None, reason="example-robot-data not installed")]


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    return e


@pytest.mark.parametrize("arm", QUICK_ARMS)
def test_arms_quick_meets_its_targets(arm, tmp_path, capsys, monkeypatch):
    """`experiment arms --quick`, one arm a test, its graph in this process (the same nodes,
    parameter files and DDS topics as `demo --robot <URDF>` starts as processes)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))   # the generated files, made anew
    out = tmp_path / "arms"
    assert main(["--quick", "--arms", arm, "--graph", "inprocess", "--out", str(out)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (a,) = res["arms"]
    assert a["arm"] == arm, a
    assert a["payload"]["mass_kg"] > 0 and len(a["rmse_rad"]) == a["dof"]
    assert os.path.isfile(out / f"arm_{a['arm']}.png")
    for key, bound in TARGETS.items():
        assert res[key] <= bound, (key, res[key], res["arms"])
    assert res["targets_met"] is True and json.load(open(out / "arms.json"))["targets_met"] is True


def test_the_quick_arms_are_light_medium_and_heavy():
    """QUICK_ARMS spans the arms: the strongest joint of the first <= 10 N m < the second's < the third's."""
    from adaptive_dynamics.dynamics import RobotModel
    from adaptive_dynamics.robot_setup import resolve_robot
    weights = {}
    for label, rel, joints, ee in ARMS:
        if label in QUICK_ARMS:
            spec = resolve_robot(os.path.join(ERD, rel), joints=joints, ee_frame=ee)
            weights[label] = float(max(RobotModel(spec.urdf, ee_frame=spec.ee_frame).effort_limit))
    assert weights["so101"] <= 10 < weights["xarm7"] < weights["ur10"], weights


def test_demo_with_unstable_gains_trips_the_watchdog(tmp_path, env):
    so101 = os.path.join(ERD, "so_arm_description", "urdf", "so101.urdf")
    out = tmp_path / "demo"
    r = subprocess.run([EXE, "demo", "--robot", so101, "--controller", "composite", "--duration", "3", "--out",
                        str(out), "--set", "adaptive_controller.kd=[40.0]", "-v"], capture_output=True, text=True,
                       timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["watchdog_trips"] == 1, res
    text = r.stdout + r.stderr
    assert "watchdog: joint" in text and "chattering" in text and "reset_watchdog" in text
    assert "[adaptive_controller]" in text


def test_launch_real_without_a_robot_says_what_it_waits_for_and_ends_at_duration(env):
    """`launch real` with nobody on the domain: the controller (and the trajectory node
    starting from the current state) WARN naming the topic, the joints and ROS_DOMAIN_ID,
    and --duration bounds the wall time: a clean stop, exit 0."""
    import time
    t0 = time.monotonic()
    r = subprocess.run([EXE, "launch", "real", "--robot", "panda", "--preset", "franka", "--duration", "9"],
                       capture_output=True, text=True, timeout=120, env=env)
    wall = time.monotonic() - t0
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-3000:]
    assert wall < 40, wall
    assert "--duration: 9 s of wall time elapsed" in text
    warns = [ln for ln in text.splitlines() if "no joint_states for" in ln]
    assert any("[controller]" in ln or "controller" in ln for ln in warns), text[-3000:]
    assert all("ROS_DOMAIN_ID=" in ln and "panda_joint1" in ln for ln in warns), warns
    assert any("/joint_states" in ln for ln in warns)

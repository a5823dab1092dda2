"""`experiment arms --quick` through the user's path (demo's graph as processes over DDS) on
one light, one medium and one heavy arm of example-robot-data, each with a payload sized to
it; and `demo` with a gain set the plant cannot take: the watchdog trips, says why, and
no torque is NaN."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from adaptive_dynamics.experiments.arms import QUICK_ARMS, TARGETS, robots_dir

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


def test_arms_quick_meets_its_targets(tmp_path, env):
    out = tmp_path / "arms"
    r = subprocess.run([EXE, "experiment", "arms", "--quick", "--out", str(out)], capture_output=True, text=True,
                       timeout=900, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert [a["arm"] for a in res["arms"]] == list(QUICK_ARMS)
    weights = {a["arm"]: max(a["effort_limit"]) for a in res["arms"]}
    assert weights["so101"] <= 10 < weights["xarm7"] < weights["ur10"]        # light, medium, heavy
    for a in res["arms"]:
        assert a["payload"]["mass_kg"] > 0 and len(a["rmse_rad"]) == a["dof"]
        assert os.path.isfile(out / f"arm_{a['arm']}.png")
    for key, bound in TARGETS.items():
        assert res[key] <= bound, (key, res[key], res["arms"])
    assert res["targets_met"] is True and json.load(open(out / "arms.json"))["targets_met"] is True


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

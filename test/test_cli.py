"""The console entry points a user reaches: `adaptive-dynamics demo` and `info`."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

EXE = os.path.join(os.path.dirname(sys.executable), "adaptive-dynamics")


def run(*args, timeout=300):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=timeout)


def test_selfcheck_runs_and_prints_json(tmp_path):
    out = tmp_path / "selfcheck"
    r = run("selfcheck", "--out", str(out))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["dof"] == 7 and summary["base_parameters"] == 43
    assert summary["max_abs_error_Nm"]["standard"] < 1e-8
    assert (out / "filtered_regressor.png").stat().st_size > 10_000
    assert json.loads((out / "selfcheck.json").read_text())["robot"] == "panda"


@pytest.mark.ros
def test_demo_one_controller(tmp_path):
    """`demo --controller X`, shortened: lockstep loop over DDS, table, plots, bag."""
    out = tmp_path / "demo"
    r = run("demo", "--controller", "computed_torque", "--out", str(out), "--duration", "3", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 3000 and summary["lockstep_timeouts"] == 0
    assert max(summary["rmse_rad"].values()) < 0.2
    assert "panda_joint7" in r.stdout  # the per-joint table
    for png in summary["plots"]:
        assert os.path.getsize(png) > 10_000


@pytest.mark.ros
@pytest.mark.slow
def test_demo_shows_learning(tmp_path):
    """The README's main job as a user runs it (`demo`, defaults, one run of the graph over
    DDS): the Panda with an unmodelled 1.5 kg tool and joint friction, computed torque on
    the URDF's model for one period, then composite adaptive control + the GMM residual.
    The learning controller's RMSE over the last period is at most 0.3 of the baseline's
    on every joint, the tool's mass is found within 5 % and its centre of mass within
    1 cm of the simulator's (RobotModel.set_payload's block, an independent path), the
    phase switch happened once, the plots exist."""
    out = tmp_path / "demo"
    r = run("demo", "--out", str(out), timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    s = json.loads(r.stdout.strip().splitlines()[-1])
    assert s["learned_vs_baseline_rmse_max"] <= 0.3 and s["target_met"], s["learned_vs_baseline_rmse"]
    assert min(s["baseline_rmse_rad"].values()) > 1e-3      # the tool and friction do show without learning
    assert s["tool_mass_rel_error"] <= 0.05 and s["tool_com_error_m"] <= 0.01, s
    assert s["recorded_coverage"] > 0.99, s["recorded_coverage"]
    assert len(s["phase_switches"]) == 1 and s["phase_switches"][0]["acknowledged_s"]
    assert "panda_joint7" in r.stdout and "tool on panda_link7" in r.stdout
    for png in s["plots"]:
        assert os.path.getsize(png) > 10_000
    assert json.loads((out / "demo.json").read_text())["tool_mass_kg"] == s["tool_mass_kg"]


def test_demo_takes_set_overrides_as_launch(monkeypatch, tmp_path):
    """`demo --set NODE.PARAM=VALUE` reaches the graph's parameter overrides like `launch`'s
    (the graph builder is stopped before any process starts)."""
    from adaptive_dynamics import cli, scenarios

    seen = {}

    def fake(scenario, **kw):
        seen.update(kw)
        raise SystemExit(0)

    monkeypatch.setattr(scenarios, "build_graph", fake)
    args = cli.build_parser().parse_args(["demo", "--controller", "pd", "--out", str(tmp_path),
                                          "--set", "controller.kd=[30.0]",
                                          "--set", "trajectory.speed=0.5"])
    with pytest.raises(SystemExit):
        args.fn(args)
    assert seen["overrides"]["controller"] == {"kd": [30.0]}
    assert seen["overrides"]["trajectory"] == {"speed": 0.5} and "stats_file" in seen["overrides"]["mujoco_bridge"]


def test_info_and_clear_error():
    r = run("info", "planar2")
    assert r.returncode == 0 and "joint2" in r.stdout and "base parameters: 6" in r.stdout
    r = run("info", "no_such_robot")
    assert r.returncode == 2 and "no_such_robot" in r.stderr
    r = run("--help")
    assert r.returncode == 0 and "demo" in r.stdout


def test_the_parser_loads_no_heavy_layer():
    """``adaptive-dynamics --help`` (and every command's parser) starts without the
    dynamics, control, learning, ROS or simulator layers: their imports wait for the
    command that needs them (the lazy imports the layering test asks a reason for)."""
    code = ("import sys, adaptive_dynamics.cli as c; c.build_parser(); "
            "print(' '.join(sorted(m for m in sys.modules)))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                timeout=60).stdout.split())
    heavy = {"rclpy", "mujoco", "pinocchio", "sklearn", "GPy", "rosbags", "numba", "matplotlib",
             *(f"adaptive_dynamics.{u}" for u in ("dynamics", "control", "learning", "sim", "nodes", "ros",
                                                   "experiments", "robot_setup", "launcher"))}
    assert "adaptive_dynamics.cli" in loaded
    assert not heavy & loaded, sorted(heavy & loaded)

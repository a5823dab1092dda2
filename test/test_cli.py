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


def test_demo_runs_and_prints_json(tmp_path):
    out = tmp_path / "demo"
    r = run("demo", "--out", str(out))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    assert summary["dof"] == 7 and summary["base_parameters"] == 43
    assert summary["max_abs_error_Nm"]["standard"] < 1e-8
    assert (out / "filtered_regressor.png").stat().st_size > 10_000
    assert json.loads((out / "demo.json").read_text())["robot"] == "panda"


def test_info_and_clear_error():
    r = run("info", "planar2")
    assert r.returncode == 0 and "joint2" in r.stdout and "base parameters: 6" in r.stdout
    r = run("info", "no_such_robot")
    assert r.returncode == 2 and "no_such_robot" in r.stderr
    r = run("--help")
    assert r.returncode == 0 and "demo" in r.stdout

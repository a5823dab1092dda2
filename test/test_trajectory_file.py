"""Trajectory files (``trajectories/from_file.py``): what ``excite`` writes, played exactly
from its JSON (Fourier coefficients) or interpolated from a CSV; joints matched by name;
clear errors; and ``type: file`` through the launch graph (the bridge starts where the
file starts).  No optimisation here: the files are written by ``ExcitationTrajectory.save``,
the writer ``excite`` uses."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.trajectories import SplineTrajectory, load_trajectory_file
from adaptive_dynamics.trajectories.excitation import ExcitationTrajectory

T = 4.0


def _excitation(model, scale=0.3, seed=0) -> ExcitationTrajectory:
    """A Swevers trajectory at rest at t = 0 (sum a = 0, sum k b = 0) inside the limits."""
    rng = np.random.default_rng(seed)
    n, H = model.n, 3
    a = rng.uniform(-1, 1, (n, H)) * scale
    b = rng.uniform(-1, 1, (n, H)) * scale
    a[:, 0] = -a[:, 1:].sum(1)
    b[:, 0] = -(np.arange(2, H + 1) * b[:, 1:]).sum(1)
    q0 = 0.5 * (model.lower + model.upper)
    return ExcitationTrajectory(a, b, q0, T, model.joint_names, condition_number=12.5)


@pytest.fixture(scope="module")
def planar():
    return RobotModel("planar2")


@pytest.fixture()
def written(planar, tmp_path):
    tr = _excitation(planar)
    files = tr.save(str(tmp_path / "exc" / "excitation.csv"))
    data = np.loadtxt(files["csv"], delimiter=",", skiprows=1)
    return tr, files, data


def _columns(data, n):
    return data[:, 0], data[:, 1:1 + n], data[:, 1 + n:1 + 2 * n], data[:, 1 + 2 * n:1 + 3 * n]


def test_json_plays_the_exact_fourier_series(planar, written):
    tr, files, data = written
    t, q, qd, qdd = _columns(data, planar.n)
    for path in (files["json"], files["csv"]):      # the CSV named: its JSON is played (after a check)
        got = load_trajectory_file(path, planar.joint_names)
        assert isinstance(got, ExcitationTrajectory) and got.period == T and got.duration is None
        Q, QD, QDD = got.sample_many(t)
        np.testing.assert_allclose(Q, q, atol=1e-7)            # the CSV's 9 significant digits
        np.testing.assert_allclose(QD, qd, atol=1e-7)
        np.testing.assert_allclose(QDD, qdd, atol=1e-6)
        # analytic derivatives: central differences of q and qd
        h = 1e-5
        Qp, QDp, _ = got.sample_many(t + h)
        Qm, QDm, _ = got.sample_many(t - h)
        np.testing.assert_allclose((Qp - Qm) / (2 * h), QD, atol=1e-6)
        np.testing.assert_allclose((QDp - QDm) / (2 * h), QDD, atol=1e-5)
        # periodic: the next period repeats, at rest at its start
        for x, y in zip(got.sample_many(t + T), (Q, QD, QDD)):
            np.testing.assert_allclose(x, y, atol=1e-9)
        np.testing.assert_allclose(got.sample(0.0)[1], 0.0, atol=1e-12)
        assert got.condition_number == 12.5


def test_a_csv_alone_is_a_cubic_spline(planar, written, tmp_path):
    tr, files, data = written
    alone = tmp_path / "alone.csv"
    shutil.copy(files["csv"], alone)
    t, q, qd, qdd = _columns(data, planar.n)
    got = load_trajectory_file(alone, planar.joint_names)
    assert isinstance(got, SplineTrajectory)
    assert got.period is None and got.duration == pytest.approx(T)   # no JSON: played once, then held
    Q, QD, QDD = got.sample_many(t)
    np.testing.assert_allclose(Q, q, atol=1e-12)                      # through every sample
    inner = slice(20, -20)                                            # not-a-knot ends: looser there
    np.testing.assert_allclose(QD[inner], qd[inner], atol=1e-6)
    # the CSV's 9 digits (1e-9 rad) over a 1 ms grid: ~1e-3 rad/s^2 of noise in the second derivative
    np.testing.assert_allclose(QDD[inner], qdd[inner], atol=1e-2)
    h = 1e-6
    fd = (got.sample_many(t[inner] + h)[0] - got.sample_many(t[inner] - h)[0]) / (2 * h)
    np.testing.assert_allclose(fd, QD[inner], atol=1e-6)
    end = got.sample_many(np.array([T + 1.0, -1.0]))
    np.testing.assert_allclose(end[0], q[[-1, 0]], atol=1e-12)
    np.testing.assert_array_equal(end[1], 0.0)
    # a JSON beside it that says periodic (without coefficients): a periodic spline
    alone.with_suffix(".json").write_text(json.dumps({"periodic": True}))
    per = load_trajectory_file(alone, planar.joint_names)
    assert isinstance(per, SplineTrajectory) and per.period == pytest.approx(T) and per.duration is None
    np.testing.assert_allclose(per.sample_many(t[inner])[2], qdd[inner], atol=1e-2)
    for x, y in zip(per.sample_many(t[inner] + T), per.sample_many(t[inner])):
        np.testing.assert_allclose(x, y, atol=1e-9)


def test_joints_matched_by_name_and_wrong_files_are_named(planar, written, tmp_path):
    tr, files, data = written
    names = planar.joint_names[::-1]                                  # the robot lists them the other way
    for path in (files["json"], files["csv"]):
        got = load_trajectory_file(path, names)
        np.testing.assert_allclose(got.sample_many([0.7])[0][0], tr.sample_many([0.7])[0][0][::-1], atol=1e-7)
    alone = tmp_path / "alone.csv"
    shutil.copy(files["csv"], alone)
    got = load_trajectory_file(alone, names)
    np.testing.assert_allclose(got.sample_many([0.7])[0][0], tr.sample_many([0.7])[0][0][::-1], atol=1e-6)
    with pytest.raises(FileNotFoundError, match="not found"):
        load_trajectory_file(tmp_path / "nope.json", planar.joint_names)
    with pytest.raises(ValueError, match="empty"):
        load_trajectory_file("", planar.joint_names)
    panda = RobotModel("panda")
    with pytest.raises(ValueError, match=r"other joints: it has 2 \['joint1', 'joint2'\], the robot has 7"):
        load_trajectory_file(files["json"], panda.joint_names)
    with pytest.raises(ValueError, match="missing from the file: \\['jointX'\\]"):
        load_trajectory_file(alone, ["joint1", "jointX"])
    # a CSV edited after excite is not silently replaced by its JSON
    text = open(files["csv"]).read().splitlines()
    row = text[100].split(",")
    row[1] = repr(float(row[1]) + 0.01)
    text[100] = ",".join(row)
    open(files["csv"], "w").write("\n".join(text) + "\n")
    with pytest.raises(ValueError, match="differs from the samples of its JSON"):
        load_trajectory_file(files["csv"], planar.joint_names)
    bad = tmp_path / "bad.csv"
    bad.write_text("t,joint1/position\n0,0\n")
    with pytest.raises(ValueError, match="no 'time' column"):
        load_trajectory_file(bad, planar.joint_names)


def test_limits_are_checked_like_every_type(planar, tmp_path):
    """The node's check (``Trajectory.check_limits`` with the URDF's limits) names the joint."""
    tr = _excitation(planar, scale=3.0)                   # far too fast for the planar arm
    files = tr.save(str(tmp_path / "fast.csv"))
    got = load_trajectory_file(files["json"], planar.joint_names)
    with pytest.raises(ValueError, match="joint 'joint[12]'.*velocity"):
        got.check_limits(planar.lower, planar.upper, planar.velocity_limit, 10.0)


def test_launch_graph_starts_the_bridge_where_the_file_starts(planar, written, tmp_path, monkeypatch):
    from adaptive_dynamics.scenarios import build_graph

    tr, files, data = written
    monkeypatch.chdir(tmp_path)
    rel = os.path.relpath(files["json"], tmp_path)
    nodes = {s.name: s for s in build_graph("sim", robot="planar2", overrides={
        "trajectory": {"type": "file", "trajectory_file": rel}})}
    assert nodes["trajectory"].params["trajectory_file"] == files["json"]        # absolute
    np.testing.assert_allclose(nodes["mujoco_bridge"].params["q0"], tr.sample(0.0)[0], atol=1e-12)
    # a q0 given wins; a real robot gets the path only
    nodes = {s.name: s for s in build_graph("sim", robot="planar2", overrides={
        "trajectory": {"type": "file", "trajectory_file": rel}, "mujoco_bridge": {"q0": [0.1, 0.2]}})}
    assert nodes["mujoco_bridge"].params["q0"] == [0.1, 0.2]
    real = {s.name: s for s in build_graph("real", robot="planar2", overrides={
        "trajectory": {"type": "file", "trajectory_file": rel}})}
    assert real["trajectory"].params["trajectory_file"] == files["json"]
    with pytest.raises(ValueError, match="trajectory_file"):
        build_graph("sim", robot="planar2", overrides={"trajectory": {"type": "file"}})
    with pytest.raises(FileNotFoundError):
        build_graph("sim", robot="planar2", overrides={"trajectory": {"type": "file", "trajectory_file": "x.json"}})


def test_approach_moves_to_the_start_within_a_fifth_of_the_limits():
    """``Approach``: from the robot's pose to the file's start by minimum jerk -- at rest at
    both ends, continuous into the file, its velocity and acceleration the derivatives of
    its position (finite differences), within a fifth of the limits."""
    from adaptive_dynamics.trajectories.excitation import ExcitationTrajectory
    from adaptive_dynamics.trajectories.from_file import Approach

    rng = np.random.default_rng(3)
    a, b = rng.uniform(-0.3, 0.3, (2, 2, 4))
    a[:, 0], b[:, 0] = -a[:, 1:].sum(1), -(np.arange(2, 5) * b[:, 1:]).sum(1)
    base = ExcitationTrajectory(a, b, [0.1, -0.2], 5.0)
    vmax, amax = np.array([2.0, 1.0]), np.array([10.0, 10.0])
    q_from = np.array([1.0, 0.5])
    tr = Approach(base, q_from, velocity_limit=vmax, acceleration_limit=amax)
    T = tr.time
    assert T >= 2.0 and tr.period is None
    t = np.linspace(0.0, T + 2.0, 20001)
    q, qd, qdd = tr.sample_many(t)
    np.testing.assert_allclose(q[0], q_from, atol=1e-12)
    np.testing.assert_allclose(qd[0], 0.0, atol=1e-12)
    h = t[1] - t[0]
    np.testing.assert_allclose(np.gradient(q, h, axis=0)[1:-1], qd[1:-1], atol=2e-3)
    np.testing.assert_allclose(np.gradient(qd, h, axis=0)[1:-1], qdd[1:-1], atol=2e-2)
    move = t < T
    assert np.all(np.abs(qd[move]) <= 0.2 * vmax + 1e-9) and np.all(np.abs(qdd[move]) <= 0.2 * amax + 1e-9)
    for x, y in zip(tr.sample_many(T + np.array([0.0, 0.7])), base.sample_many([0.0, 0.7])):
        np.testing.assert_allclose(x, y, atol=1e-12)
    with pytest.raises(ValueError, match="values"):
        Approach(base, [0.0], velocity_limit=vmax, acceleration_limit=amax)

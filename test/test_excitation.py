"""Optimal excitation trajectory (``trajectories/excitation.py``) and ``adaptive-dynamics excite``.

Small settings (3 harmonics, few samples, 2 starts) keep the whole file well under a minute.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.trajectories.excitation import (ExcitationTrajectory, default_fourier_condition,
                                                       optimise_excitation)

ACC = 10.0
T = 20.0


@pytest.fixture(scope="module")
def planar():
    m = RobotModel("planar2")
    return m, optimise_excitation(m, duration=T, harmonics=3, starts=2, samples=60, acc_limit=ACC)


@pytest.fixture(scope="module")
def panda():
    m = RobotModel("panda")
    return m, optimise_excitation(m, duration=T, harmonics=3, starts=2, samples=60, acc_limit=ACC, maxiter=60)


def _both(planar, panda):
    return [planar, panda]


def test_derivatives_match_finite_differences(planar, panda):
    for m, tr in _both(planar, panda):
        ts = np.linspace(0.3, T - 0.3, 400)
        h = 1e-5
        q, qd, qdd = tr.sample_many(ts)
        qp, qdp, _ = tr.sample_many(ts + h)
        qm, qdm, _ = tr.sample_many(ts - h)
        np.testing.assert_allclose(qd, (qp - qm) / (2 * h), atol=1e-6)
        np.testing.assert_allclose(qdd, (qdp - qdm) / (2 * h), atol=1e-5)


def test_rest_at_both_ends_and_periodic(planar, panda):
    for m, tr in _both(planar, panda):
        q0, qd0, qdd0 = tr.sample(0.0)
        q1, qd1, qdd1 = tr.sample(T)
        np.testing.assert_allclose(qd0, 0.0, atol=1e-12)
        np.testing.assert_allclose(qdd0, 0.0, atol=1e-12)
        np.testing.assert_allclose(qd1, 0.0, atol=1e-9)
        np.testing.assert_allclose(qdd1, 0.0, atol=1e-9)
        np.testing.assert_allclose(q1, q0, atol=1e-9)


def test_limits_hold_at_1khz(planar, panda):
    for m, tr in _both(planar, panda):
        ts = np.linspace(0.0, T, int(T * 1000) + 1)
        q, qd, qdd = tr.sample_many(ts)
        assert np.all(q >= m.lower) and np.all(q <= m.upper)
        assert np.all(np.abs(qd) <= m.velocity_limit)
        assert np.all(np.abs(qdd) <= ACC)
        tau = np.array([m.inverse_dynamics(q[k], qd[k], qdd[k]) for k in range(len(ts))])
        assert np.all(np.abs(tau) <= m.effort_limit)
        assert tr.info["feasible"]
        assert all(min(v) >= 0 for v in tr.margins.values())


def test_panda_condition_vs_default(panda):
    m, tr = panda
    N, cols = tr.info["samples"], tr.info["columns"]
    default = default_fourier_condition(m, samples=N, acc_limit=ACC, columns=cols)        # node defaults
    same = default_fourier_condition(m, T, 3, samples=N, acc_limit=ACC, columns=cols)     # same period/harmonics
    print(f"panda: optimised {tr.condition_number:.4g}, default {default:.4g} (ratio"
          f" {tr.condition_number / default:.3f}), default at 20 s / 3 harmonics {same:.4g}")
    assert tr.condition_number <= default / 3.0
    assert tr.condition_number <= same / 3.0


def test_condition_number_matches_numpy(planar, panda):
    for m, tr in _both(planar, panda):
        mf = RobotModel(m.urdf_path, ee_frame=m.ee_frame, friction=True)
        N = tr.info["samples"]
        ts = np.arange(N) * T / N
        q, qd, qdd = tr.sample_many(ts)
        Y = mf.regressor_batch(q, qd, qdd, base=True)             # base columns, friction included
        W = Y.reshape(-1, Y.shape[-1])
        assert W.shape[1] == len(tr.info["columns"])
        assert tr.condition_number == pytest.approx(np.linalg.cond(W), rel=1e-8)


def test_save_and_round_trip(planar, tmp_path):
    m, tr = planar
    files = tr.save(str(tmp_path / "exc.csv"))
    data = np.loadtxt(files["csv"], delimiter=",", skiprows=1)
    with open(files["csv"]) as fh:
        header = fh.readline().strip().split(",")
    assert header[0] == "time" and f"{m.joint_names[0]}/position" in header
    assert data.shape == (int(T * 1000) + 1, 1 + 3 * m.n)
    np.testing.assert_allclose(np.diff(data[:, 0]), 1e-3, atol=1e-9)
    q, qd, qdd = tr.sample_many(data[:, 0])
    np.testing.assert_allclose(data[:, 1:], np.hstack([q, qd, qdd]), atol=1e-7)
    with open(files["json"]) as fh:
        back = ExcitationTrajectory.from_dict(json.load(fh))
    ts = np.linspace(0, 2 * T, 77)
    for x, y in zip(back.sample_many(ts), tr.sample_many(ts)):
        np.testing.assert_allclose(x, y, atol=1e-12)
    assert back.condition_number == tr.condition_number
    again = ExcitationTrajectory.from_dict(tr.to_dict())
    np.testing.assert_array_equal(again.a, tr.a)
    assert again.margins == tr.margins


def test_joint_subset_rest_in_the_middle():
    m = RobotModel("planar2")
    tr = optimise_excitation(m, duration=10.0, harmonics=2, joints=["joint2"], starts=1, samples=30, maxiter=30)
    q, qd, _ = tr.sample_many(np.linspace(0, 10, 101))
    np.testing.assert_allclose(q[:, 0], 0.5 * (m.lower[0] + m.upper[0]))
    np.testing.assert_allclose(qd[:, 0], 0.0)
    assert np.ptp(q[:, 1]) > 0.1 and np.isfinite(tr.condition_number)


def test_bad_input():
    m = RobotModel("planar2")
    with pytest.raises(ValueError, match="harmonics"):
        optimise_excitation(m, harmonics=1)
    with pytest.raises(ValueError, match="criterion"):
        optimise_excitation(m, criterion="bogus")
    with pytest.raises(ValueError, match="unknown joint"):
        optimise_excitation(m, joints=["nope"])


def test_cli_end_to_end(tmp_path):
    out = tmp_path / "exc"
    r = subprocess.run([sys.executable, "-m", "adaptive_dynamics.cli", "excite", "--robot", "planar2",
                        "--harmonics", "3", "--samples", "40", "--starts", "1", "--maxiter", "40",
                        "--duration", "10", "--criterion", "logdet", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for f in ("excitation.csv", "excitation.json", "excitation.png"):
        assert os.path.getsize(out / f) > 0
    assert res["condition_vs_default"] == pytest.approx(res["condition_number"] / res["default_condition_number"])
    assert res["criterion"] == "logdet" and res["feasible"]
    with open(out / "excitation.json") as fh:
        assert json.load(fh)["condition_number"] == res["condition_number"]

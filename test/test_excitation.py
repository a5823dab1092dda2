"""Optimal excitation trajectory (``trajectories/excitation.py``) and ``adaptive-dynamics excite``:
the full excitation, the wrist-only payload excitation (``--payload``) and the self-collision
constraint (``trajectories/self_collision.py``).

Small settings (3 harmonics, few samples, 2 starts) keep each test under ~30 s.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.dynamics.payload import payload_columns
from adaptive_dynamics.trajectories import ModifiedFourier
from adaptive_dynamics.trajectories.excitation import (ExcitationTrajectory, default_fourier_condition,
                                                       optimise_excitation, payload_excitation_columns,
                                                       payload_joints)

ACC = 10.0
T = 20.0


@pytest.fixture(scope="module")
def planar():
    m = RobotModel("planar2")
    return m, optimise_excitation(m, duration=T, harmonics=3, starts=2, samples=60, acc_limit=ACC)


@pytest.fixture(scope="module")
def panda():
    m = RobotModel("panda")
    return m, optimise_excitation(m, duration=T, harmonics=3, starts=2, samples=60, acc_limit=ACC, maxiter=60,
                                  self_collision=False)      # (tested on its own below)


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
        assert all(min(np.atleast_1d(v)) >= 0 for v in tr.margins.values())


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


# ------------------------------------------------------------------ payload (wrist-only) excitation
def test_payload_excitation_moves_the_wrist_only_and_conditions_the_payload():
    m = RobotModel("panda")
    tr = optimise_excitation(m, payload=True, harmonics=3, starts=2, samples=60, acc_limit=ACC, maxiter=60,
                             self_collision=False)
    P = 10.0                                                      # the default period of --payload
    assert tr.period == P and tr.info["moving_joints"] == m.joint_names[-3:]
    mid = 0.5 * (m.lower + m.upper)
    ts = np.linspace(0.0, P, int(P * 1000) + 1)
    q, qd, qdd = tr.sample_many(ts)
    np.testing.assert_array_equal(q[:, :4], np.tile(mid[:4], (len(ts), 1)))     # joints 1..n-3 constant
    assert not np.any(qd[:, :4]) and not np.any(qdd[:, :4])
    assert np.ptp(q[:, 4:], axis=0).min() > 0.3                                  # the wrist moves
    assert np.all(q >= m.lower) and np.all(q <= m.upper) and np.all(np.abs(qd) <= m.velocity_limit)
    assert np.all(np.abs(qdd) <= ACC) and tr.info["feasible"]
    tau = m.regressor_batch(q[::10], qd[::10], qdd[::10]) @ m.parameters
    assert np.all(np.abs(tau) <= m.effort_limit)
    # the payload regressor (dynamics.payload, the columns identify_payload fits), stacked
    block = m.model.frames[m.frame_id(m.ee_frame)].parentJoint - 1
    N = tr.info["samples"]
    tg = np.arange(N) * P / N
    # the wrist joints' rows: identify --payload leaves out the held joints' (their friction)
    w = slice(4, 7)
    c_opt = np.linalg.cond(payload_columns(m, *tr.sample_many(tg), block)[:, w].reshape(-1, 10))
    assert c_opt == pytest.approx(tr.condition_number, rel=1e-8)
    # the trajectory node's default Fourier excitation (seed 0, 0.4 rad, 4 harmonics) of the
    # same length on the same three joints, the others held alike
    dflt = ModifiedFourier.random(3, np.random.default_rng(0), q_center=mid[w], amplitude=0.4, w_f=2 * np.pi / P,
                                  L=4, lower=m.lower[w], upper=m.upper[w], vel_limit=m.velocity_limit[w],
                                  acc_limit=np.full(3, ACC))
    Q, V, A = np.tile(mid, (N, 1)), np.zeros((N, 7)), np.zeros((N, 7))
    Q[:, w], V[:, w], A[:, w] = dflt.sample_many(tg)
    c_def = np.linalg.cond(payload_columns(m, Q, V, A, block)[:, w].reshape(-1, 10))
    print(f"payload regressor: optimised wrist {c_opt:.4g}, default Fourier on the wrist {c_def:.4g}"
          f" (ratio {c_opt / c_def:.3f})")
    # the wrist rows' optimum is ~12 at 3-5 harmonics (the load's mass is weakly seen by the
    # wrist alone), the default's 29.6: 0.40-0.42
    assert c_opt <= c_def / 2.0
    assert default_fourier_condition(m, P, joints=m.joint_names[-3:], samples=N, acc_limit=ACC,
                                     columns=tr.info["columns"], rows=[4, 5, 6]) == pytest.approx(c_def, rel=1e-8)
    with pytest.raises(ValueError, match="<= 15"):
        optimise_excitation(m, payload=True, duration=16.0)
    ready = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])       # held elsewhere: q_hold (--hold)
    tr2 = optimise_excitation(m, payload=True, harmonics=2, starts=1, samples=30, maxiter=20, q_hold=ready,
                              self_collision=False)
    np.testing.assert_array_equal(tr2.sample_many([0.0, 3.3])[0][:, :4], np.tile(ready[:4], (2, 1)))
    with pytest.raises(ValueError, match="outside the position limits: panda_joint4"):
        optimise_excitation(m, payload=True, q_hold=np.zeros(7))
    with pytest.raises(ValueError, match="last three"):
        optimise_excitation(RobotModel("planar2"), payload=True)


def test_payload_excitation_of_a_spherical_wrist_moves_four_joints():
    """The iiwa's last three axes meet at the wrist centre: held still, the load's mass is
    seen only by the held joints (whose friction hides it), so the wrist rows alone are
    rank deficient; joint 4 moves too, and the 10 parameters are conditioned."""
    m = RobotModel("iiwa14")
    cols = payload_excitation_columns(m)[0]
    mid = 0.5 * (m.lower + m.upper)
    rng = np.random.default_rng(0)
    Q, V, A = np.tile(mid, (50, 1)), np.zeros((50, 7)), np.zeros((50, 7))
    for i in range(50):
        q, v, a = m.random_state(rng)
        Q[i, 4:], V[i, 4:], A[i, 4:] = q[4:], v[4:], a[4:]
    s = np.linalg.svd(m.regressor_batch(Q, V, A)[:, 4:][:, :, cols].reshape(-1, 10), compute_uv=False)
    assert s[-1] < 1e-9 * s[0]                                       # the last three alone: singular
    assert list(payload_joints(m, cols, mid)[0]) == [3, 4, 5, 6]
    assert list(payload_joints(RobotModel("panda"), payload_excitation_columns(RobotModel("panda"))[0],
                               0.5 * (RobotModel("panda").lower + RobotModel("panda").upper))[0]) == [4, 5, 6]
    tr = optimise_excitation(m, payload=True, harmonics=3, starts=1, samples=40, maxiter=40, self_collision=False)
    assert tr.info["moving_joints"] == m.joint_names[3:] and "spherical wrist" in tr.info["payload"]["moving_joints_reason"]
    q = tr.sample_many(np.linspace(0.0, tr.period, 50))[0]
    assert not np.any(np.ptp(q[:, :3], axis=0)) and np.ptp(q[:, 3:], axis=0).min() > 0.1
    assert tr.condition_number < 50


# ------------------------------------------------------------------ self-collision
def _erd_panda():
    """example-robot-data's Panda with its collision meshes (not convex hulls), fingers
    locked at 0, every pair but the SRDF's disabled ones and adjacent bodies."""
    import glob

    import pinocchio as pin
    share = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "cmeel.prefix", "share"))
    if not share:
        pytest.skip("example-robot-data not installed")
    base = os.path.join(share[0], "example-robot-data", "robots", "panda_description")
    urdf, srdf = os.path.join(base, "urdf", "panda.urdf"), os.path.join(base, "srdf", "panda.srdf")
    full = pin.buildModelFromUrdf(urdf)
    geom = pin.buildGeomFromUrdf(full, urdf, pin.GeometryType.COLLISION, package_dirs=[share[0]])
    fingers = [full.getJointId(n) for n in ("panda_finger_joint1", "panda_finger_joint2")]
    model, geom = pin.buildReducedModel(full, geom, fingers, pin.neutral(full))
    geom.addAllCollisionPairs()
    pin.removeCollisionPairs(model, geom, srdf)
    for cp in list(geom.collisionPairs):
        a, b = (geom.geometryObjects[i].parentJoint for i in (cp.first, cp.second))
        if a == b or model.parents[a] == b or model.parents[b] == a:
            geom.removeCollisionPair(cp)
    return model, geom


def test_self_collision_margin_holds_on_the_meshes():
    """With a 5 cm margin (the same optimisation without the constraint comes to 1.5 cm):
    the closest non-adjacent bodies, computed here on the meshes at 100 Hz, stay apart."""
    import pinocchio as pin

    model, geom = _erd_panda()
    m = RobotModel("panda")
    margin, P = 0.05, 10.0
    tr = optimise_excitation(m, duration=P, harmonics=3, starts=2, samples=60, acc_limit=ACC, maxiter=60,
                             collision_margin=margin)              # self_collision: on (the geometry exists)
    sc = tr.info["self_collision"]
    assert sc["checked"] and sc["margin_m"] == margin and sc["srdf"].endswith("panda.srdf")
    assert sc["min_distance_m"] >= margin and tr.margins["self_collision"] >= 0 and tr.info["feasible"]
    data, gdata = model.createData(), pin.GeometryData(geom)
    assert list(model.names)[1:] == m.joint_names
    dmin = np.inf
    for qk in tr.sample_many(np.linspace(0.0, P, 1001))[0]:
        pin.computeDistances(model, data, geom, gdata, qk)
        dmin = min(dmin, min(r.min_distance for r in gdata.distanceResults))
    print(f"self-collision: closest bodies {dmin * 1e3:.1f} mm apart on the meshes (hulls"
          f" {sc['min_distance_m'] * 1e3:.1f} mm, {sc['bodies']}), margin {margin * 1e3:.0f} mm;"
          f" cond {tr.condition_number:.4g}")
    assert dmin >= margin


def test_self_collision_gradients_and_robots_without_geometry(planar):
    from adaptive_dynamics.trajectories.self_collision import self_collision_model

    m = RobotModel("panda")
    sc, note = self_collision_model(m)
    assert sc is not None and "example-robot-data" in note and sc.n_pairs > 10
    rng = np.random.default_rng(3)
    Q = np.array([m.random_state(rng)[0] for _ in range(12)])
    D, dD = sc.distances_and_gradients(Q)
    np.testing.assert_array_equal(D, sc.distances(Q))
    h = 1e-3
    for k in range(len(Q)):
        for j in range(m.n):
            e = np.zeros(m.n)
            e[j] = h
            fd = (sc.distances(Q[k] + e) - sc.distances(Q[k] - e))[0] / (2 * h)
            sep = D[k] > 0.01          # separated: the distance is smooth there
            np.testing.assert_allclose(fd[sep], dD[k, sep, j], atol=5e-3)
    # a robot without collision geometry: not checked, and said so; required: an error
    _, tr = planar
    assert tr.info["self_collision"]["checked"] is False
    assert "no collision geometry" in tr.info["self_collision"]["reason"]
    with pytest.raises(ValueError, match="self-collision check requested"):
        optimise_excitation(planar[0], harmonics=2, starts=1, samples=20, maxiter=5, self_collision=True)


def test_cli_payload(tmp_path):
    out = tmp_path / "wrist"
    r = subprocess.run([sys.executable, "-m", "adaptive_dynamics.cli", "excite", "--robot", "panda", "--payload",
                        "--harmonics", "3", "--samples", "40", "--starts", "1", "--maxiter", "30",
                        "--collision-samples", "20", "--out", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["period"] == 10.0 and res["moving_joints"] == ["panda_joint5", "panda_joint6", "panda_joint7"]
    assert res["payload"]["link"] == "panda_link7" and len(res["columns"]) == 10
    assert res["self_collision"]["checked"] and res["self_collision"]["min_distance_m"] >= 0.01
    assert res["condition_vs_default"] < 1.0
    r = subprocess.run([sys.executable, "-m", "adaptive_dynamics.cli", "excite", "--robot", "panda", "--payload",
                        "--duration", "16", "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "<= 15" in r.stderr

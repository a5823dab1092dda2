"""Reference trajectories (adaptive_dynamics.trajectories): derivatives, boundary
conditions, limits, speed scaling, pick-and-place, Cartesian tracking (figure-8,
Lissajous, the PGPOL square + circle), and the trajectory node's trajectory builder."""
from __future__ import annotations

import math

import numpy as np
import pytest

from adaptive_dynamics.dynamics.model import RobotModel
from adaptive_dynamics.trajectories import (
    PGPOL_SPEEDS,
    CartesianTrajectory,
    LissajousPath,
    ModifiedFourier,
    MultiSine,
    PickAndPlace,
    ScaledTrajectory,
    Trajectory,
    figure_eight,
    lissajous,
    minimum_jerk,
    pgpol_speed_schedule,
    square_circle,
)

Q_READY = np.array([0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785])  # Panda "ready" pose


@pytest.fixture(scope="module")
def panda():
    return RobotModel("panda")


@pytest.fixture(scope="module")
def figure8(panda):
    return CartesianTrajectory(panda, Q_READY, figure_eight(0.1, period=4.0, plane="xy"))


def _fourier(n=3, L=4, seed=0):
    rng = np.random.default_rng(seed)
    return ModifiedFourier(rng.normal(0, 0.3, (n, L)), rng.normal(0, 0.3, (n, L)), 2 * math.pi / 5.0,
                           rng.uniform(-1, 1, n))


def _all_trajectories(figure8):
    pp = PickAndPlace(np.zeros(3), [0.5, -0.4, 1.0], move_time=[1.2, 0.8], dwell_time=0.3)
    return {
        "fourier": _fourier(),
        "multisine": MultiSine([0.1, -0.2], [[0.3, 0.1], [0.2, 0.05]], [0.2, 0.7], [[0.0, 1.0], [0.5, 2.0]]),
        "pick_place": pp,
        "scaled_fourier": ScaledTrajectory(_fourier(), 0.66),
        "scaled_pick_place": ScaledTrajectory(pp, 1.7),
        "cartesian": figure8,
    }


def _fd_check(traj, ts, h=1e-5, rtol=1e-5):
    q, qd, qdd = traj.sample_many(ts)
    qp, qdp, _ = traj.sample_many(ts + h)
    qm, qdm, _ = traj.sample_many(ts - h)
    scale_v = max(1.0, np.abs(qd).max())
    scale_a = max(1.0, np.abs(qdd).max())
    np.testing.assert_allclose((qp - qm) / (2 * h), qd, rtol=0, atol=rtol * scale_v)
    np.testing.assert_allclose((qdp - qdm) / (2 * h), qdd, rtol=0, atol=rtol * scale_a)


# ------------------------------------------------------------------ interface + derivatives


@pytest.mark.parametrize("name", ["fourier", "multisine", "pick_place", "scaled_fourier", "scaled_pick_place",
                                  "cartesian"])
def test_finite_difference_derivatives(name, figure8):
    traj = _all_trajectories(figure8)[name]
    assert isinstance(traj, Trajectory)
    rng = np.random.default_rng(1)
    horizon = 2 * (traj.period or 10.0)
    ts = rng.uniform(0.0, horizon, 200)
    _fd_check(traj, ts, rtol=1e-4 if name == "cartesian" else 1e-5)
    if name == "pick_place":  # dwell/move joints: C2 (q, qd, qdd continuous; the jerk jumps)
        for tb in (0.3, 1.5, 1.8, 2.6):
            for lo, hi in zip(traj.sample(tb - 1e-9), traj.sample(tb + 1e-9)):
                np.testing.assert_allclose(lo, hi, atol=1e-6)
    # scalar sample == vectorised sample
    q, qd, qdd = traj.sample(float(ts[3]))
    Q, QD, QDD = traj.sample_many(ts[3:4])
    assert q.shape == (traj.n,)
    np.testing.assert_array_equal(q, Q[0])
    np.testing.assert_array_equal(qd, QD[0])
    np.testing.assert_array_equal(qdd, QDD[0])


def test_periodicity(figure8):
    for name, traj in _all_trajectories(figure8).items():
        if traj.period is None:
            continue
        ts = np.linspace(0.0, traj.period, 37)
        a = traj.sample_many(ts)
        b = traj.sample_many(ts + traj.period)
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, atol=1e-9, err_msg=name)


# ------------------------------------------------------------------ modified Fourier


def test_fourier_boundary_conditions_and_cycle():
    traj = _fourier(n=4, L=5, seed=3)
    T = traj.period
    assert T == pytest.approx(5.0) and traj.duration is None
    for t in (0.0, T, 3 * T):
        q, qd, qdd = traj.sample(t)
        np.testing.assert_allclose(q, traj.q_start, atol=1e-10)
        np.testing.assert_allclose(qd, 0.0, atol=1e-10)
        np.testing.assert_allclose(qdd, 0.0, atol=1e-9)
    # C2 across the period boundary (the polynomial closes the cycle)
    eps = 1e-6
    for before, after in zip(traj.sample(T - eps), traj.sample(T + eps)):
        np.testing.assert_allclose(before, after, atol=1e-4)
    # the polynomial correction is really needed: the plain Fourier part alone does not start at rest
    F, F1, F2 = traj._fourier(np.array([0.0]))
    assert np.abs(F1).max() > 1e-3


def test_fourier_matches_park_formula_plus_quintic():
    a = np.array([[0.2, -0.1, 0.05]])
    b = np.array([[0.1, 0.3, -0.2]])
    wf = 2 * math.pi / 4.0
    traj = ModifiedFourier(a, b, wf, [0.4])
    t = np.linspace(0, 4.0, 9)
    F = sum(a[0, l] / (wf * (l + 1)) * np.sin(wf * (l + 1) * t) - b[0, l] / (wf * (l + 1)) * np.cos(wf * (l + 1) * t)
            for l in range(3))
    P = np.polyval(traj.c[0, ::-1], t)
    np.testing.assert_allclose(traj.sample_many(t)[0][:, 0], F + P, atol=1e-12)


def test_random_fourier_within_panda_limits(panda):
    rng = np.random.default_rng(42)
    acc = np.full(7, 10.0)
    for _ in range(5):
        traj = ModifiedFourier.random(7, rng, q_center=Q_READY, amplitude=1.5, w_f=2 * math.pi / 8, L=5,
                                      lower=panda.lower, upper=panda.upper, vel_limit=panda.velocity_limit,
                                      acc_limit=acc, joint_names=panda.joint_names)
        traj.check_limits(panda.lower, panda.upper, panda.velocity_limit, acc, n_check=20000)
        q, qd, _ = traj.sample_many(np.linspace(0, traj.period, 2000))
        # excitation: it really moves (the scaling does not collapse it to a point)
        assert np.all(q.max(axis=0) - q.min(axis=0) > 0.05)
        np.testing.assert_allclose(traj.sample(0.0)[0], Q_READY, atol=1e-10)
    # same generator state -> same trajectory
    a = ModifiedFourier.random(7, np.random.default_rng(5), lower=panda.lower, upper=panda.upper)
    b = ModifiedFourier.random(7, np.random.default_rng(5), lower=panda.lower, upper=panda.upper)
    np.testing.assert_array_equal(a.a, b.a)
    with pytest.raises(ValueError, match="q_center of joint panda_joint4"):
        ModifiedFourier.random(7, rng, q_center=np.zeros(7), lower=panda.lower, upper=panda.upper,
                               joint_names=panda.joint_names)


# ------------------------------------------------------------------ limits


def test_limit_check_errors_name_the_joint(panda):
    traj = ModifiedFourier(np.zeros((7, 2)), np.zeros((7, 2)), 1.0, Q_READY, joint_names=panda.joint_names)
    traj.check_limits(panda.lower, panda.upper, panda.velocity_limit, 1.0)  # at rest: fine
    big = np.zeros((7, 2))
    big[3] = [3.0, -3.0]  # joint 4 swings by ~ +-4 rad (velocity 3 cos t - 3 cos 2t: zero at t=0)
    traj = ModifiedFourier(big, np.zeros((7, 2)), 1.0, Q_READY, joint_names=panda.joint_names)
    with pytest.raises(ValueError, match=r"joint 'panda_joint4' \(index 3\): position -?[\d.]+ rad (below|above)"
                                         r" the (lower|upper) limit .* at t=[\d.]+ s") as err:
        traj.check_limits(panda.lower, panda.upper)
    assert "panda_joint1" not in str(err.value)
    with pytest.raises(ValueError, match=r"joint 'panda_joint4' \(index 3\): velocity .* exceeds the limit \+-2\.175"):
        traj.check_limits(vel_limit=panda.velocity_limit)
    with pytest.raises(ValueError, match=r"joint 'panda_joint4' \(index 3\): acceleration"):
        traj.check_limits(acc_limit=0.5)
    unnamed = MultiSine(np.zeros(2), [[0.0], [2.0]], [1.0])
    with pytest.raises(ValueError, match=r"joint index 1: position 2 rad above the upper limit 1 at t=0.25"):
        unnamed.check_limits(-1.0, 1.0, n_check=401)


# ------------------------------------------------------------------ speed scaling


def test_speed_scaling_derivatives():
    base = _fourier()
    scaled = ScaledTrajectory(base, 0.5)
    assert scaled.period == pytest.approx(2 * base.period)
    ts = np.linspace(0, 7, 50)
    q, qd, qdd = scaled.sample_many(ts)
    bq, bqd, bqdd = base.sample_many(0.5 * ts)
    np.testing.assert_allclose(q, bq, atol=1e-14)
    np.testing.assert_allclose(qd, 0.5 * bqd, atol=1e-14)
    np.testing.assert_allclose(qdd, 0.25 * bqdd, atol=1e-14)


@pytest.mark.parametrize("ramp", [0.0, 0.4])
def test_speed_change_mid_run_is_continuous(ramp):
    base = _fourier()
    traj = ScaledTrajectory(base, 1.0)
    dt = 1e-3
    ts = np.arange(0, 6.0, dt)
    out = []
    for t in ts:  # as the node does: sample at control rate, change speed live
        if abs(t - 4.0) < dt / 2:
            traj.set_speed(1.0, t=4.0, ramp_time=ramp)
        out.append(traj.sample(t))
        if abs(t - 2.0) < dt / 2:
            traj.set_speed(0.33, ramp_time=ramp)  # from the latest sampled time on
    q = np.array([o[0] for o in out])
    qd = np.array([o[1] for o in out])
    # position continuous: steps are bounded by max|qd| * dt everywhere
    assert np.abs(np.diff(q, axis=0)).max() <= 1.01 * np.abs(qd).max() * dt
    # the phase is the integral of the speed
    p, sd, _ = traj.phase(np.array([5.0]))
    r = ramp
    expected = 2.0 + (0.5 * (1 + 0.33) * r + 0.33 * (2.0 - r)) + (0.5 * (0.33 + 1) * r + 1.0 * (1.0 - r))
    assert p[0] == pytest.approx(expected, abs=1e-6)
    assert sd[0] == 1.0
    jump = np.abs(np.diff(qd, axis=0)).max()
    if ramp > 0:  # velocity continuous too
        assert jump < 0.05
        _fd_check(traj, np.array([2.1, 2.3, 4.2]), rtol=1e-5)
    else:
        assert jump > 0.05  # the velocity jumps by the speed ratio
    # sampling is a pure function of time: re-sampling the past gives the same values
    again = traj.sample(3.0)
    np.testing.assert_array_equal(again[0], out[3000][0])
    assert traj.speed == 1.0 and traj.change_times() == pytest.approx([0.0, 2.0, 4.0])
    with pytest.raises(ValueError, match="speed"):
        traj.set_speed(-1.0)
    with pytest.raises(ValueError, match="speed"):
        traj.set_speed(float("nan"))


def test_scaled_check_limits_validates_a_new_speed():
    base = MultiSine([0.0], [[1.0]], [0.5])  # |qd| <= pi, |qdd| <= pi^2
    traj = ScaledTrajectory(base, 1.0)
    traj.check_limits(vel_limit=3.2, acc_limit=10.0)
    with pytest.raises(ValueError, match=r"(?s)at speed 1.5.*velocity"):
        traj.check_limits(vel_limit=3.2, speed=1.5)


# ------------------------------------------------------------------ pick and place


def test_pick_and_place_hits_poses_at_rest():
    pick, place = np.array([0.0, -0.5, 0.2]), np.array([0.8, 0.1, -0.4])
    traj = PickAndPlace(pick, place, move_time=1.5, dwell_time=0.5)
    assert traj.period == pytest.approx(4.0)
    # end of dwell at pick / start of move, end of move / dwell at place
    for t, target in ((0.0, pick), (0.5, pick), (2.0, place), (2.5, place), (4.0, pick), (8.5, pick)):
        q, qd, qdd = traj.sample(t)
        np.testing.assert_allclose(q, target, atol=1e-12)
        np.testing.assert_allclose(qd, 0.0, atol=1e-12)
        np.testing.assert_allclose(qdd, 0.0, atol=1e-12)
    # minimum jerk: peak speed 1.875 * distance / move_time at mid-move
    q, qd, qdd = traj.sample(1.25)
    np.testing.assert_allclose(q, 0.5 * (pick + place), atol=1e-12)
    np.testing.assert_allclose(qd, 1.875 * (place - pick) / 1.5, atol=1e-12)
    assert traj.segment(0.2) == ("dwell", 0) and traj.segment(1.0) == ("move", 0)
    assert traj.segment(2.2) == ("dwell", 1) and traj.segment(3.0) == ("move", 1)
    s, ds, dds = minimum_jerk(np.array([0.0, 1.0]))
    np.testing.assert_array_equal(s, [0, 1])
    np.testing.assert_array_equal(ds, [0, 0])
    np.testing.assert_array_equal(dds, [0, 0])
    with pytest.raises(ValueError, match="move_time"):
        PickAndPlace(pick, place, move_time=0.0)


def test_pick_and_place_speed_scaling_pgpol():
    pick, place = np.zeros(2), np.array([1.0, -1.0])
    traj = PickAndPlace(pick, place, move_time=1.0, dwell_time=0.25)
    assert PGPOL_SPEEDS == (0.33, 0.66, 1.0)
    for s in PGPOL_SPEEDS:
        scaled = ScaledTrajectory(traj, s)
        assert scaled.period == pytest.approx(traj.period / s)
        # the place pose is reached after (dwell + move) / s, at rest
        q, qd, _ = scaled.sample(1.25 / s)
        np.testing.assert_allclose(q, place, atol=1e-12)
        np.testing.assert_allclose(qd, 0.0, atol=1e-12)
        # peak speed scales with s
        np.testing.assert_allclose(scaled.sample(0.75 / s)[1], 1.875 * place * s, atol=1e-12)
    sched = pgpol_speed_schedule(traj, cycles_per_speed=5)
    P = traj.period
    expected = [0.0, 5 * P / 0.33, 5 * P / 0.33 + 5 * P / 0.66]
    assert sched.change_times() == pytest.approx(expected)
    t_end = expected[-1] + 5 * P
    ts = np.linspace(0, t_end, 200001)
    q, qd, qdd = sched.sample_many(ts)
    assert np.abs(np.diff(q, axis=0)).max() < 1.01 * np.abs(qd).max() * (ts[1] - ts[0])
    # changes fall on cycle boundaries at rest: velocity and acceleration continuous there
    for tc in expected[1:]:
        for x in sched.sample(tc)[1:]:
            np.testing.assert_allclose(x, 0.0, atol=1e-12)
    # 15 cycles in total
    assert sched.phase(np.array([t_end]))[0][0] == pytest.approx(15 * P)


def test_multi_point_pick_and_place():
    w = [np.zeros(2), np.ones(2), np.array([1.0, -1.0])]
    traj = PickAndPlace(w[0], w[1], via=[w[2]], move_time=1.0, dwell_time=0.5)
    assert traj.period == pytest.approx(4.5)
    for i, t in enumerate((0.0, 1.5, 3.0)):
        np.testing.assert_allclose(traj.sample(t)[0], w[i], atol=1e-12)


# ------------------------------------------------------------------ multi-sine


def test_multisine_values_and_period():
    traj = MultiSine([0.1, 0.2], [[0.3, 0.1], [0.2, 0.0]], [0.2, 0.5], phases=[0.0, 0.5])
    assert traj.period == pytest.approx(10.0)  # gcd(0.2, 0.5) = 0.1 Hz
    t = 1.3
    q, qd, qdd = traj.sample(t)
    expect = 0.1 + 0.3 * math.sin(2 * math.pi * 0.2 * t) + 0.1 * math.sin(2 * math.pi * 0.5 * t + 0.5)
    assert q[0] == pytest.approx(expect, abs=1e-14)
    assert MultiSine([0.0], [[1.0, 1.0]], [1.0, math.sqrt(2)]).period is None
    with pytest.raises(ValueError, match="frequencies"):
        MultiSine([0.0, 0.0], [[1.0], [1.0]], [[1.0, 2.0, 3.0]])


# ------------------------------------------------------------------ Cartesian


def test_cartesian_figure8_tracks_within_1mm(panda, figure8):
    traj = figure8
    assert traj.period == 4.0 and traj.n == 7
    ts = np.linspace(0.0, 4.0, 1001) + 0.00037  # off the IK grid
    q, _, _ = traj.sample_many(ts)
    P, _ = traj.cartesian_reference(ts)
    err_p = max(np.linalg.norm(panda.frame_pose(qi)[:3, 3] - pi) for qi, pi in zip(q, P))
    assert err_p < 1e-3
    ep, eo = traj.tracking_error()
    assert ep < 1e-6 and eo < 1e-6  # in fact ~1e-12: IK corrected to 1e-12 on a 1 kHz spline
    # the path is a figure-8 of 0.1 m width around the start pose, orientation held
    np.testing.assert_allclose(P[0], panda.frame_pose(Q_READY)[:3, 3], atol=1e-3)
    extent = P.max(axis=0) - P.min(axis=0)
    assert extent[0] == pytest.approx(0.1, abs=1e-4) and extent[1] == pytest.approx(0.05, abs=1e-4)
    assert extent[2] < 1e-12
    # joint path is closed (periodic) and starts near the given posture
    assert traj.closure_error < 1e-8 and traj.start_offset < 0.01
    traj.check_limits(panda.lower, panda.upper, panda.velocity_limit)
    # end-effector velocity from the joint velocity matches the path velocity
    qs, qds, _ = traj.sample(1.1)
    _, Xd = traj.cartesian_reference(np.array([1.1]))
    np.testing.assert_allclose(panda.jacobian(qs)[:3] @ qds, Xd[0], atol=1e-6)
    np.testing.assert_allclose(panda.jacobian(qs)[3:] @ qds, 0.0, atol=1e-6)


def test_lissajous_path_and_position_only_task(panda):
    path = lissajous([0.04, 0.03], [3, 2], period=5.0, plane="yz")
    X, Xd, Xdd = path.sample_many(np.array([0.0, 1.0]))
    np.testing.assert_allclose(X[0], 0.0, atol=1e-15)
    assert abs(X[1, 0]) < 1e-15  # x untouched in the yz plane
    traj = CartesianTrajectory(panda, Q_READY, path, orientation=False, dt=2e-3)
    ep, _ = traj.tracking_error(500)
    assert ep < 1e-3
    with pytest.raises(ValueError, match="harmonics"):
        LissajousPath([0.1, 0.1, 0], [1.5, 2, 0])


def test_square_circle_path_geometry_rests_and_derivatives():
    path = square_circle(0.2, edge_time=1.0, circle_time=3.0, dwell_time=0.5, plane="xz")
    assert path.period == pytest.approx(7.5)
    corners = [0.0, 0.5, 1.5, 2.5, 3.5, 4.0]          # start, four corners, back at the start
    X, Xd, Xdd = path.sample_many(np.array(corners))
    np.testing.assert_allclose(X[:, [0, 2]], [[0, 0], [0.1, 0], [0.1, 0.2], [-0.1, 0.2], [-0.1, 0], [0, 0]],
                               atol=1e-12)
    np.testing.assert_allclose(Xd, 0.0, atol=1e-12)   # at rest at every corner
    np.testing.assert_allclose(Xdd, 0.0, atol=1e-12)
    assert np.all(X[:, 1] == 0.0)                       # in the xz plane
    # the circle: inscribed (radius 0.1 around (0, 0.1)), through the start, then the dwell
    ts = np.linspace(4.0, 7.0, 301)
    Xc, _, _ = path.sample_many(ts)
    np.testing.assert_allclose(np.hypot(Xc[:, 0], Xc[:, 2] - 0.1), 0.1, atol=1e-12)
    assert Xc[:, 2].max() == pytest.approx(0.2, abs=1e-6)
    Xe, Xde, _ = path.sample_many(np.array([7.0, 7.2, 7.49]))
    np.testing.assert_allclose(Xe, 0.0, atol=1e-12)
    np.testing.assert_allclose(Xde, 0.0, atol=1e-12)
    # velocity and acceleration are the derivatives of the position (continuous everywhere)
    ts = np.linspace(0.0, 7.5, 3001)[1:-1] + 1e-4
    h = 1e-6
    Xp, Xdp, _ = path.sample_many(ts + h)
    Xm, Xdm, _ = path.sample_many(ts - h)
    _, Xd, Xdd = path.sample_many(ts)
    np.testing.assert_allclose((Xp - Xm) / (2 * h), Xd, atol=1e-6)
    np.testing.assert_allclose((Xdp - Xdm) / (2 * h), Xdd, atol=1e-4)
    with pytest.raises(ValueError, match="side"):
        square_circle(0.0)


def test_cartesian_square_circle_on_the_panda(panda):
    traj = CartesianTrajectory(panda, Q_READY, square_circle(0.2, 1.0, 3.0, plane="xy"))
    assert traj.period == pytest.approx(7.0) and traj.closure_error < 1e-8
    ep, eo = traj.tracking_error(700)
    assert ep < 1e-6 and eo < 1e-6
    q0, qd0, _ = traj.sample(0.0)
    # the end effector starts at rest (the joints only drift in the null space, towards the
    # limit cycle of the redundancy resolution)
    np.testing.assert_allclose(panda.jacobian(q0) @ qd0, 0.0, atol=1e-6)
    assert np.abs(qd0).max() < 0.05
    traj.check_limits(panda.lower, panda.upper, panda.velocity_limit, 10.0)


def test_trajectory_node_builds_square_circle_via_points_and_speed_schedule(panda):
    from adaptive_dynamics.nodes.trajectory import build_trajectory, scaled, specs

    p = {s.name: s.default for s in specs()}
    p.update(type="square_circle", cartesian_size=0.2, cartesian_period=7.0, cartesian_plane="xy")
    traj = build_trajectory(p, panda, Q_READY)
    assert isinstance(traj, CartesianTrajectory) and traj.period == pytest.approx(7.0)
    w = [Q_READY + d for d in (0.0, 0.2, -0.2)]
    p.update(type="pick_place", q_pick=list(w[0]), q_place=list(w[1]), via=list(w[2]), move_time=1.0,
             dwell_time=0.5)
    pp = build_trajectory(p, panda, Q_READY)
    assert len(pp.waypoints) == 3 and pp.period == pytest.approx(4.5)
    np.testing.assert_allclose(pp.sample(3.0)[0], w[2], atol=1e-12)
    p["via"] = [0.1, 0.2]
    with pytest.raises(ValueError, match="k x 7"):
        build_trajectory(p, panda, Q_READY)
    # constant speed by default; a schedule plays cycles_per_speed periods per speed
    p.update(via=[0.0], speed=0.5)
    assert scaled(pp, p, 1.0).speed == 0.5
    p.update(speed_schedule=[0.33, 0.66, 1.0], cycles_per_speed=2)
    sched = scaled(pp, p, 1.0)
    np.testing.assert_allclose(sched.change_times(), [1.0, 1.0 + 2 * 4.5 / 0.33, 1.0 + 2 * 4.5 / 0.33 + 2 * 4.5 / 0.66])
    assert sched.speed == 1.0

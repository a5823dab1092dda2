"""adaptive_dynamics.ros.task_references: the task_reference contract
(MultiDOFJointTrajectory) -- a batch encoded, serialized and decoded again, looked up by
stamp, and every refusal (wrong frame, missing name, NaN, out of order, stale,
non-unit quaternion) with its stamp range remembered.  No DDS."""
from __future__ import annotations

import numpy as np
import pytest
from rclpy.serialization import serialize_message

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.ros.stamps import to_ns
from adaptive_dynamics.ros.task_references import (
    TaskReferenceBuffer,
    base_frame_name,
    matrix_to_quaternion,
    quaternion_to_matrix,
    task_reference_msg,
)

MS = 1_000_000
WORLD, EE = "panda_link0", "panda_hand_tcp"


def _batch(k=20, t0=100 * MS, seed=0):
    rng = np.random.default_rng(seed)
    P = rng.normal(size=(k, 3))
    Qr = rng.normal(size=(k, 4))
    Qr /= np.linalg.norm(Qr, axis=1)[:, None]
    V, A = rng.normal(size=(k, 6)), rng.normal(size=(k, 6))
    return t0, P, Qr, V, A


def test_base_frame_and_quaternions():
    assert base_frame_name(RobotModel("panda")) == "panda_link0"
    assert base_frame_name(RobotModel("planar2")) == "base_link"
    rng = np.random.default_rng(1)
    for _ in range(20):
        q = rng.normal(size=4)
        q /= np.linalg.norm(q)
        R = quaternion_to_matrix(q)
        np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-12)
        assert np.linalg.det(R) == pytest.approx(1.0)
        q2 = matrix_to_quaternion(R)
        np.testing.assert_allclose(q2, q if q[3] >= 0 else -q, atol=1e-12)   # the same rotation


def test_batch_round_trip_through_the_wire_and_lookup_by_stamp():
    t0, P, Qr, V, A = _batch()
    msg = task_reference_msg(t0, MS, WORLD, EE, P, Qr, V, A)
    assert msg.header.frame_id == WORLD and list(msg.joint_names) == [EE] and to_ns(msg.header.stamp) == t0
    buf = TaskReferenceBuffer(WORLD, EE, max_staleness_ns=2 * MS)
    assert buf.add_any(serialize_message(msg)) == 20            # serialized, as a raw subscription gets it
    assert buf.stamps() == [t0 + i * MS for i in range(20)]
    for i in (0, 7, 19):
        r = buf.lookup(t0 + i * MS)
        assert r.stamp_ns == t0 + i * MS
        np.testing.assert_array_equal(r.position, P[i])
        np.testing.assert_allclose(r.quaternion, Qr[i], rtol=0, atol=1e-15)
        np.testing.assert_array_equal(r.twist, V[i])
        np.testing.assert_array_equal(r.accel, A[i])
        np.testing.assert_allclose(r.rotation, quaternion_to_matrix(Qr[i]), atol=1e-15)
    # never "the latest": nearest within tolerance, then the last within the staleness
    assert buf.lookup(t0 + 5 * MS + 400_000, tolerance_ns=500_000).stamp_ns == t0 + 5 * MS
    assert buf.lookup(t0 + 21 * MS).stamp_ns == t0 + 19 * MS
    assert buf.lookup(t0 + 22 * MS) is None
    # other names are ignored, the tracked frame is found by name; twists may be left out
    msg2 = task_reference_msg(t0 + 50 * MS, MS, WORLD, EE, P[:3], Qr[0])
    msg2.joint_names = ["gripper", EE]
    for pt in msg2.points:
        pt.transforms = [pt.transforms[0], pt.transforms[0]]
    buf2, buf3 = TaskReferenceBuffer(WORLD, EE), TaskReferenceBuffer(WORLD, EE)
    assert buf2.add(msg2) == 3
    assert buf3.add_any(serialize_message(msg2)) == 3
    for b in (buf2, buf3):
        r = b.lookup(t0 + 51 * MS)
        assert r.twist is None and r.accel is None
        np.testing.assert_array_equal(r.position, P[1])
    # a quaternion off by less than the tolerance is normalised
    buf2.add_arrays(t0 + 60 * MS, [0.1, 0.2, 0.3], [0.0, 0.0, 0.0, 1.0005])
    np.testing.assert_allclose(buf2.lookup(t0 + 60 * MS).quaternion, [0, 0, 0, 1], atol=1e-15)


def test_refusals_are_counted_and_their_stamps_remembered():
    t0, P, Qr, V, A = _batch(k=5)
    buf = TaskReferenceBuffer(WORLD, EE)

    def msg(start=t0, **changes):
        m = task_reference_msg(start, MS, WORLD, EE, P, Qr, V, A)
        for key, fn in changes.items():
            fn(m)
        return m

    def nan_position(m):
        m.points[2].transforms[0].translation.y = float("nan")

    def inf_twist(m):
        m.points[1].accelerations[0].angular.z = float("inf")

    def reorder(m):
        m.points[3].time_from_start, m.points[2].time_from_start = m.points[2].time_from_start, \
            m.points[3].time_from_start

    def half_velocities(m):
        m.points[4].velocities = []

    def bad_quaternion(m):
        m.points[0].transforms[0].rotation.w = 3.0

    def frame(m):
        m.header.frame_id = "world"

    def names(m):
        m.joint_names = ["panda_link8"]

    cases = [
        (msg(f=frame), "not the world frame 'panda_link0'"),
        (msg(n=names), "do not name the tracked frame 'panda_hand_tcp'"),
        (msg(x=nan_position), "non-finite position of 'panda_hand_tcp' in point 2"),
        (msg(x=inf_twist), "non-finite acceleration"),
        (msg(x=reorder), "out of order: point 3"),
        (msg(x=half_velocities), "velocities per point"),
        (msg(x=bad_quaternion), "not a unit quaternion"),
    ]
    raw_buf = TaskReferenceBuffer(WORLD, EE)          # the same refusals from the bytes (wire.py)
    for i, (m, needle) in enumerate(cases):
        m.header.stamp.sec = 10 * (i + 1)            # each its own stamp range
        with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
            buf.add(m)
        with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
            raw_buf.add_any(serialize_message(m))
    assert len(buf) == 0 and buf.counters["rejected"] == len(cases)
    assert len(raw_buf) == 0 and raw_buf.counters["rejected"] == len(cases)
    # the refused ranges: a controller answers these instants with its safe command at once
    for i in range(len(cases)):
        assert buf.refused_at(10 * (i + 1) * 1_000_000_000 + t0 + 4 * MS)
        assert raw_buf.refused_at(10 * (i + 1) * 1_000_000_000 + t0 + 4 * MS)
    assert not buf.refused_at(5 * 1_000_000_000)
    empty = msg()
    empty.points = []
    with pytest.raises(ValueError, match="no points"):
        buf.add(empty)
    # stale: every point before the last instant looked up
    assert buf.add(msg(start=t0)) == 5
    buf.lookup(t0 + 100 * MS)                          # a control instant after the batch
    with pytest.raises(ValueError, match="stale"):
        buf.add(msg(start=t0 + 50 * MS))
    assert buf.add(msg(start=t0 + 98 * MS)) == 5       # partly ahead: kept
    assert buf.refused_at(t0 + 52 * MS) and not buf.refused_at(t0 + 99 * MS)
    buf.clear()
    assert not buf.refused_at(t0 + 52 * MS)
    with pytest.raises(ValueError, match="MultiDOFJointTrajectory"):
        buf.add_any(b"\x00\x01\x00\x00garbage")

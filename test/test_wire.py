"""adaptive_dynamics.wire: the vectorised JointTrajectory, MultiDOFJointTrajectory, JointState and Float64MultiArray CDR
against two independent implementations (rosbags' serializer byte for byte, rclpy's
deserializer both ways), every alignment case (frame_id and name lengths, joint counts,
point counts, optional fields), the fallback for what it does not handle (big-endian via
rclpy; corrupt bytes are ValueErrors), and that the node-facing helpers (ReferenceBuffer,
JointStateMapper, split_command / command_from_msg) give the same for bytes as for messages."""
from __future__ import annotations

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message
from rosbags.typesys import Stores, get_typestore
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint, MultiDOFJointTrajectory

from adaptive_dynamics.ros.references import ReferenceBuffer, reference_batch_msg
from adaptive_dynamics.ros.task_references import TaskReferenceBuffer, task_reference_msg
from adaptive_dynamics.wire import (
    WireError,
    decode_multidof,
    decode_trajectory,
    encode_multidof,
    encode_trajectory,
)

TS = get_typestore(Stores.ROS2_HUMBLE)
MS = 1_000_000
T0 = 123_456_789_012


def _rosbags_bytes(frame, names, Q, QD, QDD, dt=MS):
    T = TS.types["trajectory_msgs/msg/JointTrajectory"]
    P = TS.types["trajectory_msgs/msg/JointTrajectoryPoint"]
    H, Tm = TS.types["std_msgs/msg/Header"], TS.types["builtin_interfaces/msg/Time"]
    D = TS.types["builtin_interfaces/msg/Duration"]
    e = np.zeros(0)
    pts = [P(positions=Q[i], velocities=e if QD is None else QD[i], accelerations=e if QDD is None else QDD[i],
             effort=e, time_from_start=D(sec=(i * dt) // 10**9, nanosec=(i * dt) % 10**9)) for i in range(len(Q))]
    msg = T(header=H(stamp=Tm(sec=T0 // 10**9, nanosec=T0 % 10**9), frame_id=frame), joint_names=names, points=pts)
    return bytes(TS.serialize_cdr(msg, "trajectory_msgs/msg/JointTrajectory"))


@pytest.mark.parametrize("frame", ["", "a", "abcd"])
@pytest.mark.parametrize("n", [1, 2, 7])
@pytest.mark.parametrize("fields", [(True, True), (True, False), (False, False), (False, True)])
def test_encode_decode_match_rosbags_and_rclpy(frame, n, fields):
    rng = np.random.default_rng(n)
    for k in (1, 2, 3, 4, 101):
        Q = rng.standard_normal((k, n))
        QD = rng.standard_normal((k, n)) if fields[0] else None
        QDD = rng.standard_normal((k, n)) if fields[1] else None
        names = [f"joint_{i}" * (1 + i % 3) for i in range(n)]
        mine = encode_trajectory(T0, MS, names, Q, QD, QDD, frame_id=frame)
        assert mine == _rosbags_bytes(frame, names, Q, QD, QDD), (k, n, fields)
        # rclpy reads ours, we read rclpy's
        back = deserialize_message(mine, JointTrajectory)
        assert back.header.frame_id == frame and len(back.points) == k
        np.testing.assert_array_equal(np.array([p.positions for p in back.points]), Q)
        msg = reference_batch_msg(T0, MS, names, Q, QD, QDD)
        msg.header.frame_id = frame
        d = decode_trajectory(bytes(serialize_message(msg)))
        assert d.names == tuple(names) and d.stamp_ns == T0
        np.testing.assert_array_equal(d.t_ns, T0 + np.arange(k) * MS)
        np.testing.assert_array_equal(d.Q, Q)
        for got, want in ((d.QD, QD), (d.QDD, QDD)):
            assert (got is None) == (want is None)
            if want is not None:
                np.testing.assert_array_equal(got, want)


def test_unhandled_shapes_raise_and_the_buffer_falls_back_to_rclpy():
    names = ["a", "b"]
    msg = JointTrajectory()
    msg.joint_names = names
    msg.points = [JointTrajectoryPoint(positions=[1.0, 2.0], velocities=[0.1, 0.2]),
                  JointTrajectoryPoint(positions=[3.0, 4.0])]           # no velocities here
    msg.points[1].time_from_start.nanosec = MS
    raw = bytes(serialize_message(msg))
    with pytest.raises(WireError):
        decode_trajectory(raw)
    with pytest.raises(WireError):
        decode_trajectory(raw[:40])
    fast, slow = ReferenceBuffer(names, capacity=16), ReferenceBuffer(names, capacity=16)
    assert fast.add_serialized(raw) == slow.add(msg) == 2
    for s in (0, MS):
        a, b = fast.lookup(s), slow.lookup(s)
        np.testing.assert_array_equal(a.q, b.q)
        assert (a.qd is None) == (b.qd is None)
    with pytest.raises(ValueError):
        fast.add_serialized(b"\x00\x01\x00\x00garbage")
    assert fast.counters["rejected"] == 1


def test_add_serialized_equals_add_message_and_validates():
    rng = np.random.default_rng(0)
    names = ["j1", "j2", "j3"]
    Q, QD, QDD = rng.standard_normal((3, 50, 3))
    msg = reference_batch_msg(T0, MS, names[::-1], Q[:, ::-1], QD[:, ::-1], QDD[:, ::-1])  # other order
    fast, slow = ReferenceBuffer(names, capacity=100), ReferenceBuffer(names, capacity=100)
    assert fast.add_serialized(encode_trajectory(T0, MS, names[::-1], Q[:, ::-1], QD[:, ::-1], QDD[:, ::-1])) \
        == slow.add(msg) == 50
    for i in (0, 17, 49):
        a, b = fast.lookup(T0 + i * MS), slow.lookup(T0 + i * MS)
        assert a.stamp_ns == b.stamp_ns == T0 + i * MS
        for x, y, want in ((a.q, b.q, Q[i]), (a.qd, b.qd, QD[i]), (a.qdd, b.qdd, QDD[i])):
            np.testing.assert_array_equal(x, want)
            np.testing.assert_array_equal(y, want)
    bad = Q.copy()
    bad[7, 1] = np.nan
    with pytest.raises(ValueError, match="j2"):
        fast.add_serialized(encode_trajectory(T0, MS, names, bad, QD, QDD))
    with pytest.raises(ValueError, match="j2"):
        slow.add(reference_batch_msg(T0, MS, names, bad, QD, QDD))
    assert fast.counters["rejected"] == slow.counters["rejected"] == 1
    with pytest.raises(ValueError, match="missing"):
        fast.add_serialized(encode_trajectory(T0, MS, ["j1", "j2"], Q[:, :2]))


def test_points_not_matching_joint_names_and_corrupt_bytes_are_rejected_not_raised():
    """A point with fewer or more values than joint_names, or corrupt bytes, is a
    ValueError counted in ``rejected`` -- as on the message path -- never another
    exception (which would escape the node's callback) nor a silently cut matrix."""
    names = ["a", "b", "c"]
    buf = ReferenceBuffer(names, capacity=16)
    for m in (2, 4):
        raw = encode_trajectory(T0, MS, [f"j{i}" for i in range(m)], np.ones((3, m)))
        raw = raw.replace(b"j0", b"a\x00").replace(b"j1", b"b\x00")   # same lengths: 2 bytes + NUL
        msg = deserialize_message(raw, JointTrajectory)
        msg.joint_names = names                                          # 3 names, m values per point
        with pytest.raises(ValueError, match="joint names but"):
            buf.add_serialized(bytes(serialize_message(msg)))
    corrupt = bytearray(encode_trajectory(T0, MS, names, np.ones((2, 3))))
    corrupt[12:16] = (10**6).to_bytes(4, "little")                       # frame_id length
    with pytest.raises(ValueError):
        decode_trajectory(bytes(corrupt))
    with pytest.raises(ValueError):
        buf.add_serialized(bytes(corrupt))
    corrupt = bytearray(encode_trajectory(T0, MS, names, np.ones((2, 3))))
    corrupt[28:29] = b"\xff"                                           # first name "a": not UTF-8
    with pytest.raises(WireError):
        decode_trajectory(bytes(corrupt))
    assert buf.counters["rejected"] == 3 and len(buf) == 0


# ------------------------------------------------------------------ MultiDOFJointTrajectory

def _rosbags_multidof(frame, names, T, V, A, dt=MS):
    ty = TS.types
    Vec, Quat = ty["geometry_msgs/msg/Vector3"], ty["geometry_msgs/msg/Quaternion"]
    Tf, Tw = ty["geometry_msgs/msg/Transform"], ty["geometry_msgs/msg/Twist"]
    P = ty["trajectory_msgs/msg/MultiDOFJointTrajectoryPoint"]
    H, Tm = ty["std_msgs/msg/Header"], ty["builtin_interfaces/msg/Time"]
    D = ty["builtin_interfaces/msg/Duration"]

    def twists(X):
        return [] if X is None else [Tw(linear=Vec(*x[:3]), angular=Vec(*x[3:])) for x in X]

    pts = [P(transforms=[Tf(translation=Vec(*x[:3]), rotation=Quat(*x[3:])) for x in T[i]],
             velocities=twists(None if V is None else V[i]), accelerations=twists(None if A is None else A[i]),
             time_from_start=D(sec=(i * dt) // 10**9, nanosec=(i * dt) % 10**9)) for i in range(len(T))]
    msg = ty["trajectory_msgs/msg/MultiDOFJointTrajectory"](
        header=H(stamp=Tm(sec=T0 // 10**9, nanosec=T0 % 10**9), frame_id=frame), joint_names=names, points=pts)
    return bytes(TS.serialize_cdr(msg, "trajectory_msgs/msg/MultiDOFJointTrajectory"))


@pytest.mark.parametrize("frame", ["", "a", "abcd"])
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("fields", [(True, True), (True, False), (False, False), (False, True)])
def test_multidof_encode_decode_match_rosbags_and_rclpy(frame, n, fields):
    rng = np.random.default_rng(n)
    for k in (1, 2, 3, 4, 101):
        T = rng.standard_normal((k, n, 7))
        V = rng.standard_normal((k, n, 6)) if fields[0] else None
        A = rng.standard_normal((k, n, 6)) if fields[1] else None
        names = [f"frame_{i}" * (1 + i % 3) for i in range(n)]
        mine = encode_multidof(T0, MS, names, T, V, A, frame_id=frame)
        assert mine == _rosbags_multidof(frame, names, T, V, A), (k, n, fields)
        back = deserialize_message(mine, MultiDOFJointTrajectory)          # rclpy reads ours
        assert back.header.frame_id == frame and list(back.joint_names) == names and len(back.points) == k
        tf = back.points[-1].transforms[-1]
        assert (tf.translation.z, tf.rotation.w) == (T[-1, -1, 2], T[-1, -1, 6])
        d = decode_multidof(bytes(serialize_message(back)))               # we read rclpy's
        assert d.names == tuple(names) and d.frame_id == frame and d.stamp_ns == T0
        np.testing.assert_array_equal(d.t_ns, T0 + np.arange(k) * MS)
        np.testing.assert_array_equal(d.T, T)
        for got, want in ((d.V, V), (d.A, A)):
            assert (got is None) == (want is None)
            if want is not None:
                np.testing.assert_array_equal(got, want)


def test_multidof_fast_path_equals_rclpy_path_and_falls_back(monkeypatch):
    """TaskReferenceBuffer reads the bytes through decode_multidof: the same references as
    from the message; a batch the fast path does not take (points with differing field
    counts, big-endian) goes to rclpy's deserializer and is refused with its reason."""
    rng = np.random.default_rng(3)
    P, V, A = rng.standard_normal((40, 3)), rng.standard_normal((40, 6)), rng.standard_normal((40, 6))
    Qr = rng.standard_normal((40, 4))
    Qr /= np.linalg.norm(Qr, axis=1)[:, None]
    msg = task_reference_msg(T0, MS, "base", "tcp", P, Qr, V, A)
    fast, slow = TaskReferenceBuffer("base", "tcp"), TaskReferenceBuffer("base", "tcp")
    from adaptive_dynamics.ros import task_references
    with monkeypatch.context() as mp:        # no rclpy deserializer: the bytes take the fast path
        mp.setattr(task_references, "deserialize", None)
        assert fast.add_any(serialize_message(msg)) == slow.add(msg) == 40
    for i in (0, 13, 39):
        a, b = fast.lookup(T0 + i * MS), slow.lookup(T0 + i * MS)
        for f in ("position", "quaternion", "twist", "accel"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    msg.points[5].velocities = []
    raw = bytes(serialize_message(msg))
    with pytest.raises(WireError):
        decode_multidof(raw)
    with pytest.raises(ValueError, match="velocities per point"):
        fast.add_any(raw)
    for cut in (10, 40, len(raw) - 3):
        with pytest.raises(WireError):
            decode_multidof(raw[:cut])
    assert fast.counters["rejected"] == 1


# ------------------------------------------------------------------ JointState and commands

def _rosbags_joint_state(stamp, frame, names, fields):
    H, Tm = TS.types["std_msgs/msg/Header"], TS.types["builtin_interfaces/msg/Time"]
    J = TS.types["sensor_msgs/msg/JointState"]
    e = np.zeros(0)
    q, v, f = (e if x is None else np.asarray(x, float) for x in fields)
    msg = J(header=H(stamp=Tm(sec=stamp // 10**9, nanosec=stamp % 10**9), frame_id=frame), name=list(names),
            position=q, velocity=v, effort=f)
    return msg


def _rosbags_command(values, label):
    L, D = TS.types["std_msgs/msg/MultiArrayLayout"], TS.types["std_msgs/msg/MultiArrayDimension"]
    F = TS.types["std_msgs/msg/Float64MultiArray"]
    return F(layout=L(dim=[D(label=label, size=len(values), stride=len(values))], data_offset=0),
             data=np.asarray(values, float))


@pytest.mark.parametrize("frame", ["", "a", "base_link"])
@pytest.mark.parametrize("n", [1, 2, 7])
@pytest.mark.parametrize("present", [(1, 1, 1), (1, 0, 0), (1, 1, 0), (1, 0, 1), (0, 1, 1)])
def test_joint_state_encode_decode_match_rosbags_and_rclpy(frame, n, present):
    from sensor_msgs.msg import JointState

    from adaptive_dynamics.ros.joint_states import JointStateMapper, joint_state_msg
    from adaptive_dynamics.wire import JointStateEncoder, NameCache, decode_joint_state
    rng = np.random.default_rng(n)
    names = [f"j{'x' * i}" for i in range(n)]           # names of every length mod 4
    fields = [rng.normal(size=n) if p else None for p in present]
    enc = JointStateEncoder(names, frame)
    for stamp in (0, T0, T0 + 999_999_999):
        mine = enc.encode(stamp, *fields)
        assert mine == bytes(TS.serialize_cdr(_rosbags_joint_state(stamp, frame, names, fields),
                                              "sensor_msgs/msg/JointState"))
        back = deserialize_message(mine, JointState)          # rclpy reads ours
        assert list(back.name) == names and back.header.frame_id == frame
        # ours reads rclpy's (whose padding bytes are not zeroed)
        theirs = bytes(serialize_message(joint_state_msg(stamp, names, *fields, frame_id=frame)))
        s, nm, *arrays = decode_joint_state(theirs, NameCache())
        assert s == stamp and nm == tuple(names)
        for got, want in zip(arrays, fields):
            assert got.size == 0 if want is None else np.array_equal(got, want)
    if present[0] and present[1]:  # the mapper takes the bytes like the message, any name order
        mapper = JointStateMapper(names[::-1])
        raw = bytes(serialize_message(joint_state_msg(T0, names, *fields)))
        for a, b in zip(mapper.map(raw), mapper.map(joint_state_msg(T0, names, *fields))):
            assert (a is None and b is None) or np.array_equal(a, b)


def test_joint_state_bytes_rejected_or_handed_to_rclpy():
    from adaptive_dynamics.ros.fields import NonFiniteError
    from adaptive_dynamics.ros.joint_states import JointStateMapper, joint_state_msg, state_stamp
    from adaptive_dynamics.wire import JointStateEncoder, NameCache, decode_joint_state
    names = ["a", "b", "c"]
    good = JointStateEncoder(names).encode(T0, [1.0, 2.0, 3.0], [0.0] * 3, [0.0] * 3)
    for bad in (good[:-3], good[:20], b"\x00\x01\x00\x00", b"", good[:12] + b"\xff\xff\xff\x7f" + good[16:]):
        with pytest.raises(WireError):
            decode_joint_state(bad, NameCache())
    mapper = JointStateMapper(names)
    with pytest.raises(ValueError):   # not even rclpy can read it: a ValueError, as for a bad message
        mapper.map(good[:-3])
    assert state_stamp(good) == T0 and state_stamp(b"junk") is None
    # big-endian CDR (rosbags writes it): the fast path declines, rclpy reads it
    be = bytes(TS.serialize_cdr(_rosbags_joint_state(T0, "", names, ([1.0, 2.0, 3.0], [4.0, 5.0, 6.0], None)),
                                "sensor_msgs/msg/JointState", little_endian=False))
    with pytest.raises(WireError):
        decode_joint_state(be, NameCache())
    stamp, q, v, e = mapper.map(be)
    assert stamp == T0 and q.tolist() == [1.0, 2.0, 3.0] and v.tolist() == [4.0, 5.0, 6.0] and e is None
    # the same validation as for messages
    nan = JointStateEncoder(names).encode(T0, [1.0, float("nan"), 3.0])
    with pytest.raises(NonFiniteError, match="b="):
        mapper.map(nan)
    with pytest.raises(ValueError, match="missing"):
        JointStateMapper(["a", "z"]).map(bytes(serialize_message(joint_state_msg(T0, names, [1.0, 2.0, 3.0]))))


@pytest.mark.parametrize("label", ["joints", "joints@1", f"joints@{T0}", "ab"])
@pytest.mark.parametrize("n", [0, 1, 7])
def test_command_encode_decode_match_rosbags_and_rclpy(label, n):
    from std_msgs.msg import Float64MultiArray

    from adaptive_dynamics.ros.commands import (command_from_msg, command_stamp, encode_stamped_command,
                                                float64_array_msg, split_command, stamped_command_msg)
    from adaptive_dynamics.wire import decode_command, encode_command
    x = np.random.default_rng(n).normal(size=n)
    mine = encode_command(x, label)
    assert mine == bytes(TS.serialize_cdr(_rosbags_command(x, label), "std_msgs/msg/Float64MultiArray"))
    assert list(deserialize_message(mine, Float64MultiArray).data) == list(x)
    lab, off, data = decode_command(bytes(serialize_message(float64_array_msg(x, label=label))))
    assert lab == label and off == 0 and np.array_equal(data, x)
    # stamped commands: bytes and messages give the same stamp and values
    for stamp in (None, T0):
        raw, msg = encode_stamped_command(x, stamp), stamped_command_msg(x, stamp)
        assert raw == bytes(TS.serialize_cdr(_rosbags_command(x, "joints" if stamp is None else f"joints@{stamp}"),
                                             "std_msgs/msg/Float64MultiArray"))
        assert command_stamp(raw) == command_stamp(msg) == stamp
        assert split_command(raw)[0] == split_command(msg)[0] == stamp
        if n:
            assert np.array_equal(command_from_msg(raw, n), command_from_msg(msg, n))
            with pytest.raises(ValueError, match=f"expected {n + 1} values"):
                command_from_msg(raw, n + 1)


def test_command_bytes_edge_cases():
    from std_msgs.msg import Float64MultiArray

    from adaptive_dynamics.ros.commands import command_from_msg, split_command
    from adaptive_dynamics.wire import decode_command, encode_command
    m = Float64MultiArray()                     # no layout dimension, data_offset used
    m.layout.data_offset = 1
    m.data = [9.0, 1.0, 2.0]
    raw = bytes(serialize_message(m))
    assert decode_command(raw)[0] is None and split_command(raw)[:2] == (None, 1)
    assert command_from_msg(raw, 2).tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="not finite"):
        command_from_msg(encode_command([1.0, float("inf")], "joints"), 2)
    good = encode_command([1.0, 2.0], "joints@5")
    for bad in (good[:-1], good[:10], b"\x00\x01\x00\x00"):
        with pytest.raises(WireError):
            decode_command(bad)
        with pytest.raises(ValueError):
            split_command(bad)

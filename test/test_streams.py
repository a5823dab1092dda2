"""evaluation.streams.read_streams (the one reader of a recording's streams) against
rclpy's own deserialisation of the same bag: joints reordered between messages, a field
left empty, overlapping reference batches (the later point of an instant wins), vectors
with non-joint names, /diagnostics, a message without the model's joints."""
from __future__ import annotations

import numpy as np
import pytest
from rclpy.serialization import deserialize_message, serialize_message

from diagnostic_msgs.msg import DiagnosticArray
from sensor_msgs.msg import JointState
from trajectory_msgs.msg import JointTrajectory

from adaptive_dynamics.evaluation.bags import BagWriter, read_raw
from adaptive_dynamics.evaluation.streams import read_streams
from adaptive_dynamics.ros.joint_states import joint_state_msg
from adaptive_dynamics.ros.references import reference_batch_msg

NAMES = ["a", "b", "c"]
TYPES = {"sensor_msgs/msg/JointState": JointState, "trajectory_msgs/msg/JointTrajectory": JointTrajectory,
         "diagnostic_msgs/msg/DiagnosticArray": DiagnosticArray}
MS = 1_000_000


def _stamp(h) -> int:
    return h.stamp.sec * 10 ** 9 + h.stamp.nanosec


def write(path, rng, bad_row=None):
    from diagnostic_msgs.msg import DiagnosticStatus, KeyValue
    N = 40
    with BagWriter(path) as w:
        for topic, kind in (("/joint_states", "sensor_msgs/msg/JointState"), ("/pt", "sensor_msgs/msg/JointState"),
                            ("/reference", "trajectory_msgs/msg/JointTrajectory"),
                            ("/params", "sensor_msgs/msg/JointState"), ("/diagnostics",
                                                                        "diagnostic_msgs/msg/DiagnosticArray")):
            w.add_topic(topic, kind)
        for k in range(0, N, 8):   # batches of 10 points every 8 steps: 2 instants overlap
            Q, QD, QDD = (rng.normal(size=(10, 3)) for _ in range(3))
            w.write("/reference", k * MS, serialize_message(reference_batch_msg(k * MS, MS, NAMES, Q, QD, QDD)))
        for k in range(N):
            order = [2, 0, 1] if k % 3 == 0 else [0, 1, 2]
            names = [NAMES[i] for i in order]
            if k == bad_row:
                names = ["a", "b", "x"]
            q, v, e = rng.normal(size=(3, 3))
            w.write("/joint_states", k * MS, serialize_message(joint_state_msg(k * MS, names, q, v, e)))
            w.write("/pt", k * MS, serialize_message(joint_state_msg(k * MS, NAMES, effort=rng.normal(size=3))))
            if k % 10 == 0:
                w.write("/params", k * MS, serialize_message(joint_state_msg(k * MS, ["p1", "p2"], q=rng.normal(size=2))))
                arr = DiagnosticArray(status=[DiagnosticStatus(name="node", values=[KeyValue(key="k", value=str(k))])])
                w.write("/diagnostics", k * MS, serialize_message(arr))
    return str(path)


def reference(path):
    """The same streams through rclpy's deserialisation."""
    js, pt, refs, params, diag = [], [], {}, [], {}
    for topic, msgtype, _, raw in read_raw(path, ["/joint_states", "/pt", "/reference", "/params", "/diagnostics"]):
        m = deserialize_message(bytes(raw), TYPES[msgtype])
        if topic in ("/joint_states", "/pt"):
            idx = [list(m.name).index(j) for j in NAMES]
            f = [np.asarray(x)[idx] if len(x) else np.full(3, np.nan) for x in (m.position, m.velocity, m.effort)]
            (js if topic == "/joint_states" else pt).append((_stamp(m.header), *f))
        elif topic == "/reference":
            idx = [list(m.joint_names).index(j) for j in NAMES]
            for p in m.points:
                t = _stamp(m.header) + p.time_from_start.sec * 10 ** 9 + p.time_from_start.nanosec
                refs[t] = tuple(np.asarray(x)[idx] for x in (p.positions, p.velocities, p.accelerations))
        elif topic == "/params":
            params.append((_stamp(m.header), list(m.name), np.asarray(m.position)))
        else:
            for s in m.status:
                diag[s.name] = {kv.key: kv.value for kv in s.values}
    return js, pt, refs, params, diag


def test_streams_equal_rclpy_deserialisation(tmp_path):
    path = write(tmp_path / "bag", np.random.default_rng(0))
    s = read_streams(path, NAMES, joints=["/joint_states", "/pt"], vectors=["/params"], diagnostics=True)
    js, pt, refs, params, diag = reference(path)
    for got, want in ((s.joints("/joint_states"), js), (s.joints("/pt"), pt)):
        np.testing.assert_array_equal(got.t_ns, [w[0] for w in want])
        for k, fld in enumerate(("position", "velocity", "effort")):
            np.testing.assert_array_equal(getattr(got, fld), np.array([w[k + 1] for w in want]))
    assert np.isnan(s.joints("/pt").position).all()   # the parametric torque carries effort only
    np.testing.assert_array_equal(s.reference.t_ns, sorted(refs))
    for k, fld in enumerate(("q", "qd", "qdd")):
        np.testing.assert_array_equal(getattr(s.reference, fld), np.array([refs[t][k] for t in sorted(refs)]))
    assert [(t, n) for t, n, _ in s.vectors["/params"]] == [(t, n) for t, n, _ in params]
    assert s.diagnostics == diag == {"node": {"k": "30"}}
    # aligned: every state whose instant the reference covers, row by row
    st, r = s.referenced()
    covered = [w for w in js if w[0] in refs]
    np.testing.assert_array_equal(st.t_ns, [w[0] for w in covered])
    np.testing.assert_array_equal(r.q, np.array([refs[w[0]][0] for w in covered]))
    np.testing.assert_array_equal(r.t_ns, st.t_ns)


def test_missing_joints_raise_or_count(tmp_path):
    path = write(tmp_path / "bag", np.random.default_rng(1), bad_row=5)
    with pytest.raises(ValueError, match=r"/joint_states .* has joints \['a', 'b', 'x'\], expected \['a', 'b', 'c'\]"):
        read_streams(path, NAMES)
    s = read_streams(path, NAMES, missing="skip")
    assert s.damage == {"missing_joints": 1, "missing_joint_names": ["c"]} and len(s.joints().t_ns) == 39 and 5 * MS not in s.joints().t_ns
    with pytest.raises(ValueError, match="no /nothing messages"):
        read_streams(path, NAMES, joints=["/nothing"]).joints("/nothing")

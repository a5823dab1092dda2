"""adaptive_dynamics.ros.joint_states: joint_states mapped by name (messages; the
serialized path is in test_wire.py)."""

from __future__ import annotations

import numpy as np
import pytest
from sensor_msgs.msg import JointState

from adaptive_dynamics.ros.fields import JointMismatchError, NonFiniteError
from adaptive_dynamics.ros.joint_states import JointStateMapper, joint_state_msg

JOINTS = ["fr3_joint1", "fr3_joint2", "fr3_joint3"]


def test_joint_state_mapper_by_name_shuffled_and_extra_joints():
    m = JointStateMapper(JOINTS)
    names = ["finger_left", "fr3_joint3", "fr3_joint1", "finger_right", "fr3_joint2"]
    q = np.array([0.04, 3.0, 1.0, 0.04, 2.0])
    msg = joint_state_msg(7_000_000_001, names, q, q * 10, q * 100)
    stamp, qq, vv, ee = m.map(msg)
    assert stamp == 7_000_000_001
    np.testing.assert_array_equal(qq, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(vv, [10.0, 20.0, 30.0])
    np.testing.assert_array_equal(ee, [100.0, 200.0, 300.0])
    # cached permutation: a second message with the same names reuses it
    assert len(m._perms._cache) == 1
    m.map(msg)
    assert len(m._perms._cache) == 1
    # arrays do not alias message memory
    qq[0] = -1.0
    assert msg.position[2] == 1.0
    # empty velocity / effort -> None
    _, _, v2, e2 = m.map(joint_state_msg(0, JOINTS, [1, 2, 3]))
    assert v2 is None and e2 is None
    # reuse_buffers writes into the same arrays
    mb = JointStateMapper(JOINTS, reuse_buffers=True)
    a = mb.map(msg)[1]
    b = mb.map(joint_state_msg(0, JOINTS, [7, 8, 9]))[1]
    assert a is b and list(b) == [7, 8, 9]


def test_joint_state_mapper_missing_joint_message():
    m = JointStateMapper(JOINTS)
    msg = joint_state_msg(0, ["fr3_joint1", "fr3_joint3", "finger"], [1, 2, 3])
    with pytest.raises(JointMismatchError) as ei:
        m.map(msg)
    text = str(ei.value)
    assert "missing" in text and "'fr3_joint2'" in text
    for n in ["fr3_joint1", "fr3_joint3", "finger"]:
        assert n in text  # present names are listed too
    assert isinstance(ei.value, ValueError)


def test_joint_state_mapper_rejects_nonfinite_and_bad_lengths():
    m = JointStateMapper(JOINTS)
    with pytest.raises(NonFiniteError, match=r"'position'.*fr3_joint2=nan"):
        m.map(joint_state_msg(0, JOINTS, [0.0, np.nan, 0.0]))
    with pytest.raises(NonFiniteError, match=r"'velocity'.*fr3_joint3=inf"):
        m.map(joint_state_msg(0, JOINTS, [0, 0, 0], [0.0, 0.0, np.inf]))
    # partial NaN effort is an error ...
    with pytest.raises(NonFiniteError, match=r"'effort'.*fr3_joint1"):
        m.map(joint_state_msg(0, JOINTS, [0, 0, 0], None, [np.nan, 1.0, 1.0]))
    # ... but an all-NaN field is joint_state_broadcaster's "no such interface"
    assert m.map(joint_state_msg(0, JOINTS, [0, 0, 0], None, [np.nan] * 3))[3] is None
    with pytest.raises(NonFiniteError):
        JointStateMapper(JOINTS, all_nan_as_missing=False).map(
            joint_state_msg(0, JOINTS, [0, 0, 0], None, [np.nan] * 3))
    # NaN in an ignored extra joint is fine
    m.map(joint_state_msg(0, JOINTS + ["gripper"], [0, 0, 0, np.nan]))
    bad = JointState(name=JOINTS)
    bad.position = [1.0, 2.0]
    with pytest.raises(ValueError, match="3 names but 2 values in 'position'"):
        m.map(bad)
    bad = JointState(name=JOINTS, position=[1.0, 2.0, 3.0], velocity=[1.0])
    with pytest.raises(ValueError, match="'velocity'"):
        m.map(bad)
    with pytest.raises(JointMismatchError, match="duplicate"):
        m.map(joint_state_msg(0, JOINTS + ["fr3_joint1"], [0, 0, 0, 0]))


def test_serialized_states_take_the_one_test_path_with_the_same_answers(monkeypatch):
    """A serialized state with all three fields is checked with one finiteness test; any
    NaN/inf then falls back to the per-field checks: the same error naming the field and
    joint, the same all-NaN-as-missing rule, the same arrays as the message path."""
    from rclpy.serialization import serialize_message
    m = JointStateMapper(JOINTS)
    names = [JOINTS[2], JOINTS[0], JOINTS[1]]

    def both(p, v, e):
        msg = joint_state_msg(5, names, p, v, e)
        return m.map(serialize_message(msg)), msg

    per_field = JointStateMapper._field
    with monkeypatch.context() as mp:                     # all finite: no per-field check runs
        mp.setattr(JointStateMapper, "_field", lambda *a: pytest.fail("per-field path taken"))
        (stamp, q, v, e), msg = both([0.3, 0.1, 0.2], [3.0, 1.0, 2.0], [30.0, 10.0, 20.0])
    assert JointStateMapper._field is per_field
    ref = m.map(msg)
    assert stamp == ref[0] == 5
    for a, b in zip((q, v, e), ref[1:]):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(q, [0.1, 0.2, 0.3])
    with pytest.raises(NonFiniteError, match=r"'velocity'.*" + JOINTS[1] + "=inf"):
        both([0.3, 0.1, 0.2], [3.0, 1.0, np.inf], [0.0] * 3)
    assert both([0.3, 0.1, 0.2], [3.0, 1.0, 2.0], [np.nan] * 3)[0][3] is None

"""adaptive_dynamics.ros.arrays: the stamped matrix and vector conventions (over DDS:
test_ros_plumbing.py)."""

from __future__ import annotations

import numpy as np
import pytest

from adaptive_dynamics.ros.fields import JointMismatchError, NonFiniteError
from adaptive_dynamics.ros.arrays import matrix_from_msg, stamped_matrix_msg, stamped_vector_msg, vector_from_msg


def test_stamped_matrix_and_vector_conventions():
    M = np.arange(12.0).reshape(3, 4)
    msg = stamped_matrix_msg(5_000_000_007, M, "joints", "params")
    assert msg.layout.data_offset == 2
    assert [(d.label, d.size, d.stride) for d in msg.layout.dim] == [
        ("rows:joints", 3, 12), ("cols:params", 4, 4)]
    assert list(msg.data[:2]) == [5.0, 7.0]
    # a generic consumer honouring the layout finds the matrix after data_offset
    off = msg.layout.data_offset
    np.testing.assert_array_equal(np.array(msg.data[off:]).reshape(3, 4), M)
    stamp, M2 = matrix_from_msg(msg, expected_shape=(3, 4))
    assert stamp == 5_000_000_007
    np.testing.assert_array_equal(M2, M)
    with pytest.raises(ValueError, match="shape"):
        matrix_from_msg(msg, expected_shape=(4, 3))
    bad = stamped_matrix_msg(0, M)
    bad.data = bad.data[:-1]
    with pytest.raises(ValueError, match="data elements"):
        matrix_from_msg(bad)
    bad = stamped_matrix_msg(0, M)
    bad.layout.data_offset = 0
    with pytest.raises(ValueError, match="data_offset"):
        matrix_from_msg(bad)
    bad = stamped_matrix_msg(0, M)
    bad.layout.dim[1].stride = 3
    with pytest.raises(ValueError, match="stride"):
        matrix_from_msg(bad)
    with pytest.raises(NonFiniteError, match=r"\[\[1, 2\]\]"):
        matrix_from_msg(stamped_matrix_msg(0, np.where(M == 6.0, np.nan, M)))

    v = stamped_vector_msg(3, ["a", "b", "c"], [1.0, 2.0, 3.0])
    assert list(v.effort) == [1.0, 2.0, 3.0] and len(v.position) == 0
    assert vector_from_msg(v)[0] == 3
    np.testing.assert_array_equal(vector_from_msg(v, ["c", "a"])[1], [3.0, 1.0])
    with pytest.raises(JointMismatchError, match="missing"):
        vector_from_msg(v, ["a", "z"])
    with pytest.raises(JointMismatchError):
        vector_from_msg(v, ["a"], field="position")  # empty field
    p = stamped_vector_msg(3, ["m1", "m2"], [1.5, np.inf], field="position")
    with pytest.raises(NonFiniteError, match="m2=inf"):
        vector_from_msg(p, field="position")


def test_vector_buffer_exact_then_newest_older_within_staleness():
    from adaptive_dynamics.ros.arrays import VectorBuffer
    b = VectorBuffer(capacity=4)
    assert b.get(5) is None and b.newest is None and not b
    for t in (10, 30, 20):
        b.add(t, np.full(2, float(t)))
    assert b.newest == 30 and 20 in b and len(b) == 3
    np.testing.assert_array_equal(b.get(20), [20.0, 20.0])
    assert b.get(25, staleness_ns=4) is None                            # 20 is 5 ns older
    np.testing.assert_array_equal(b.get(25, staleness_ns=5), [20.0, 20.0])
    assert b.get(5, staleness_ns=100) is None                           # nothing older
    b.add(40, np.zeros(2))
    b.add(50, np.ones(2))                                                # over capacity: the oldest half goes
    assert len(b) == 3 and 10 not in b and 20 not in b and b.newest == 50

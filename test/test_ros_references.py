"""adaptive_dynamics.ros.references: references kept by stamp and looked up by control
instant (messages; the serialized path is in test_wire.py)."""

from __future__ import annotations

import numpy as np
import pytest
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from adaptive_dynamics.ros.fields import JointMismatchError, NonFiniteError
from adaptive_dynamics.ros.references import ReferenceBuffer, reference_msg
from adaptive_dynamics.ros.stamps import from_ns

JOINTS = ["fr3_joint1", "fr3_joint2", "fr3_joint3"]


def test_reference_buffer_lookup_by_stamp():
    ms = 1_000_000
    t0 = 100 * ms
    buf = ReferenceBuffer(JOINTS, capacity=64, max_staleness_ns=3 * ms)
    shuffled = [JOINTS[2], "extra", JOINTS[0], JOINTS[1]]
    # published ahead of time: the references for t0..t0+9ms arrive before t0
    for k in range(10):
        q = np.array([k, 10 + k, 20 + k], float)
        perm_q = [q[2], 99.0, q[0], q[1]]
        buf.add(reference_msg(t0 + k * ms, shuffled, perm_q, perm_q, perm_q))
    assert len(buf) == 10
    # exact stamp
    r = buf.lookup(t0 + 4 * ms)
    assert r.stamp_ns == t0 + 4 * ms
    np.testing.assert_array_equal(r.q, [4, 14, 24])
    # never "the latest": the latest stored is t0+9ms, but we get the one for t
    assert buf.lookup(t0).stamp_ns == t0
    # within tolerance picks the nearest stamp
    assert buf.lookup(t0 + 4 * ms + 400_000, tolerance_ns=500_000).stamp_ns == t0 + 4 * ms
    assert buf.lookup(t0 + 4 * ms + 600_000, tolerance_ns=500_000).stamp_ns == t0 + 5 * ms
    # beyond tolerance: latest not after t, within the staleness limit
    r = buf.lookup(t0 + 11 * ms)
    assert r.stamp_ns == t0 + 9 * ms
    assert buf.counters["stale_hits"] == 1
    # too stale / before the first one -> None
    assert buf.lookup(t0 + 13 * ms) is None
    assert buf.lookup(t0 - 1) is None
    assert buf.counters["misses"] == 2
    assert buf.counters["exact_hits"] == 4


def test_reference_buffer_out_of_order_duplicates_late_eviction():
    buf = ReferenceBuffer(JOINTS, capacity=4, max_staleness_ns=0)
    for s in (10, 30, 20):
        buf.add_arrays(s, [s, s, s])
    assert buf.stamps() == [10, 20, 30]
    assert buf.counters["out_of_order"] == 1
    buf.add(reference_msg(20, JOINTS, [7, 7, 7]))  # duplicate stamp: replaced
    assert buf.counters["duplicates"] == 1
    np.testing.assert_array_equal(buf.lookup(20).q, [7, 7, 7])
    assert buf.lookup(20).qd is None  # absent fields are None, caller decides
    buf.add_arrays(15, [1, 1, 1])  # stamped before the last looked-up instant
    assert buf.counters["late"] == 1
    buf.add_arrays(40, [4, 4, 4])  # 5 entries > capacity 4: oldest evicted
    assert buf.stamps() == [15, 20, 30, 40] and buf.counters["evicted"] == 1
    assert buf.lookup(25) is None  # staleness 0 -> exact only
    assert buf.lookup(25, max_staleness_ns=10).stamp_ns == 20
    # a multi-point message: point i applies at header.stamp + time_from_start
    msg = JointTrajectory(joint_names=JOINTS)
    msg.header.stamp = from_ns(1_000)
    for k in range(3):
        pt = JointTrajectoryPoint(positions=[float(k)] * 3)
        pt.time_from_start.nanosec = 100 * k
        msg.points.append(pt)
    buf2 = ReferenceBuffer(JOINTS)
    assert buf2.add(msg) == 3
    assert buf2.stamps() == [1_000, 1_100, 1_200]
    # invalid references are refused and counted
    with pytest.raises(JointMismatchError, match="missing"):
        buf2.add(reference_msg(5, JOINTS[:2], [1, 2]))
    with pytest.raises(NonFiniteError, match="fr3_joint2"):
        buf2.add(reference_msg(5, JOINTS, [1, np.nan, 2]))
    assert buf2.counters["rejected"] == 2

"""adaptive_dynamics.ros.stamps: stamps as integer nanoseconds."""

from __future__ import annotations

import pytest
import rclpy.time

from adaptive_dynamics.ros.stamps import from_ns, to_ns


def test_time_helpers():
    t = from_ns(12_000_000_345)
    assert (t.sec, t.nanosec) == (12, 345)
    assert to_ns(t) == 12_000_000_345
    assert to_ns(rclpy.time.Time(nanoseconds=77)) == 77
    assert to_ns(5) == 5
    with pytest.raises(TypeError):
        to_ns("now")

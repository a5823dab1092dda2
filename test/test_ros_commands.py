"""adaptive_dynamics.ros.commands: effort command messages (the serialized and stamped
paths are in test_wire.py)."""

from __future__ import annotations

import numpy as np
import pytest
from std_msgs.msg import Float64MultiArray

from adaptive_dynamics.ros.commands import command_from_msg, float64_array_msg
from adaptive_dynamics.ros.fields import NonFiniteError


def test_command_msgs():
    msg = float64_array_msg(np.array([1.0, 2.0]))
    assert msg.layout.dim[0].label == "joints" and msg.layout.dim[0].size == 2
    assert msg.layout.data_offset == 0
    np.testing.assert_array_equal(command_from_msg(msg, 2), [1.0, 2.0])
    with pytest.raises(ValueError, match="expected 3 values, got 2"):
        command_from_msg(msg, 3)
    with pytest.raises(NonFiniteError):
        command_from_msg(float64_array_msg([1.0, np.nan]), 2)
    plain = Float64MultiArray(data=[4.0, 5.0])  # e.g. from `ros2 topic pub`, no layout
    np.testing.assert_array_equal(command_from_msg(plain, 2), [4.0, 5.0])

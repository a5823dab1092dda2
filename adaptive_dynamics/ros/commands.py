"""Effort commands: ``std_msgs/Float64MultiArray`` <-> the torque vector, with the stamp
of the state each command answers.

Serves the topic contract (docs/interfaces.md, "Topics"), ``effort_controller/commands``: 1-D,
``layout.dim = [("joints", n, n)]``, ``data_offset = 0``, torques [Nm] in the
configured joint order -- the input of ros2_control's ``forward_command_controller``.
A controller labels the dimension ``joints@<stamp ns>`` with the ``joint_states`` stamp
the command answers (:func:`stamped_command_msg`): ros2_control reads only ``data``,
while the lockstep bridge (docs/interfaces.md, "Time, lockstep and real time") pairs each command
with the step it was computed for.

Entry points: publishers send :func:`encode_stamped_command` (the serialized message);
subscribers take a message or its bytes with :func:`split_command` (stamp, offset, data)
and validate the values with :func:`command_values`, or do both with
:func:`command_from_msg`.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
from std_msgs.msg import Float64MultiArray, MultiArrayDimension

from .. import wire
from .fields import RAW, deserialize, f64_array, f64_view, nonfinite_error

__all__ = [
    "COMMAND_STAMP_PREFIX",
    "float64_array_msg",
    "stamped_command_msg",
    "encode_stamped_command",
    "split_command",
    "command_stamp",
    "command_values",
    "command_from_msg",
]

COMMAND_STAMP_PREFIX = "joints@"


def float64_array_msg(values, label: str = "joints") -> Float64MultiArray:
    """1-D ``std_msgs/Float64MultiArray`` (e.g. an effort command)."""
    data = f64_array(values)
    msg = Float64MultiArray()
    n = len(data)
    msg.layout.dim = [MultiArrayDimension(label=label, size=n, stride=n)]
    msg.layout.data_offset = 0
    msg.data = data
    return msg


def stamped_command_msg(values, stamp_ns: Optional[int] = None) -> Float64MultiArray:
    """An effort command; with ``stamp_ns`` its one layout dimension is labelled
    ``joints@<stamp_ns>``: the ``joint_states`` stamp the command answers.

    ros2_control's ``forward_command_controller`` reads only ``data`` (it ignores the
    layout), so the label is invisible to a real robot, while the lockstep bridge uses
    it to pair each command with the step it was computed for (a stray or duplicate
    command can never shift the lockstep sequence).
    """
    msg = float64_array_msg(values, label="joints" if stamp_ns is None else f"{COMMAND_STAMP_PREFIX}{int(stamp_ns)}")
    return msg


def encode_stamped_command(values, stamp_ns: Optional[int] = None) -> bytes:
    """:func:`stamped_command_msg` serialized (publish the bytes): the same wire bytes
    from :func:`adaptive_dynamics.wire.encode_command` in ~2 us instead of ~15 us."""
    return wire.encode_command(values, "joints" if stamp_ns is None else f"{COMMAND_STAMP_PREFIX}{int(stamp_ns)}")


def _label_stamp(label: Optional[str]) -> Optional[int]:
    if label and label.startswith(COMMAND_STAMP_PREFIX):
        try:
            return int(label[len(COMMAND_STAMP_PREFIX):])
        except ValueError:
            return None
    return None


def split_command(msg, *, where: str = "command") -> Tuple[Optional[int], int, np.ndarray]:
    """``(stamp or None, data_offset, data)`` of a command, given as a message or
    serialized (a ``raw=True`` subscription; read by
    :func:`adaptive_dynamics.wire.decode_command`, rclpy's deserializer as fallback).
    ``data`` is a read-only view; validate it with :func:`command_values`."""
    if isinstance(msg, RAW):
        try:
            label, off, data = wire.decode_command(msg)
        except wire.WireError:
            msg = deserialize(msg, Float64MultiArray, where)
        else:
            return _label_stamp(label), int(off), data
    dims = msg.layout.dim
    return _label_stamp(dims[0].label if dims else None), int(msg.layout.data_offset), f64_view(msg.data)


def command_stamp(msg) -> Optional[int]:
    """The stamp a command answers (see :func:`stamped_command_msg`), or None."""
    if isinstance(msg, RAW):
        return split_command(msg)[0]
    dims = msg.layout.dim
    return _label_stamp(dims[0].label) if dims else None


def command_values(data: np.ndarray, data_offset: int, n: int, *, where: str = "command") -> np.ndarray:
    """Validated copy of a 1-D command's values: exactly ``n`` finite values after
    ``data_offset`` (which is 0 for every known publisher)."""
    if data_offset:
        if data_offset > len(data):
            raise ValueError(f"{where}: data_offset {data_offset} beyond {len(data)} data elements")
        data = data[data_offset:]
    if len(data) != n:
        raise ValueError(f"{where}: expected {n} values, got {len(data)}")
    if not np.isfinite(data).all():
        raise nonfinite_error(data, [], "data", where)
    return np.array(data, dtype=np.float64)


def command_from_msg(msg, n: int, *, where: str = "command") -> np.ndarray:
    """Validated copy of a 1-D command (message or serialized): exactly ``n`` finite values.

    ``layout.data_offset`` is honoured (it is 0 for every known publisher).
    """
    _, off, data = split_command(msg, where=where)
    return command_values(data, off, n, where=where)

"""Stamps: ``builtin_interfaces/Time`` <-> integer nanoseconds.

Serves docs/interfaces.md, "Time, lockstep and real time": every message that matters carries the stamp
of the instant it belongs to and consumers select by stamp, so stamps are handled as
integer nanoseconds internally (exact, ordered, usable as keys).  Every message builder
in this package accepts int nanoseconds, a ``builtin_interfaces/Time`` or an
``rclpy.time.Time``.

Entry points: :func:`to_ns` (message -> int), :func:`from_ns` (int -> message).
"""

from __future__ import annotations

from typing import Any, Union

import numpy as np
from builtin_interfaces.msg import Duration, Time

__all__ = ["NS_PER_S", "StampLike", "to_ns", "from_ns", "duration_ns"]

NS_PER_S = 1_000_000_000

# int nanoseconds, builtin_interfaces/Time or rclpy.time.Time
StampLike = Union[int, np.integer, Time, Any]


def to_ns(stamp: StampLike) -> int:
    """Integer nanoseconds from a ``builtin_interfaces/Time``, an ``rclpy.time.Time``
    or an int (returned unchanged)."""
    if isinstance(stamp, (int, np.integer)) and not isinstance(stamp, bool):
        return int(stamp)
    if isinstance(stamp, Time):
        return stamp.sec * NS_PER_S + stamp.nanosec
    ns = getattr(stamp, "nanoseconds", None)  # rclpy.time.Time
    if ns is not None:
        return int(ns)
    raise TypeError(f"cannot convert {type(stamp).__name__} to a time stamp")


def from_ns(ns: StampLike) -> Time:
    """``builtin_interfaces/Time`` from integer nanoseconds (or any stamp-like)."""
    if isinstance(ns, Time):
        return ns
    sec, nsec = divmod(to_ns(ns), NS_PER_S)
    return Time(sec=int(sec), nanosec=int(nsec))


def duration_ns(d: Duration) -> int:
    """Integer nanoseconds of a ``builtin_interfaces/Duration``."""
    return d.sec * NS_PER_S + d.nanosec

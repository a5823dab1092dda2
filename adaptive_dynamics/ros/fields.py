"""Message fields <-> numpy: the rules every topic module of this package shares.

Serves the topic contract (docs/interfaces.md, "Topics") (joint-indexed data "matched by joint name, never by
index"; only standard message types):

Joint order
    Joint-indexed data (``sensor_msgs/JointState``, ``trajectory_msgs/JointTrajectory``,
    stamped vectors) is matched **by name**, never by index (:class:`NameOrder`).
    Extra names in a message (gripper fingers, ...) are ignored; a configured name
    missing from a message is an error (:class:`JointMismatchError`).  Non-finite values
    in a used field raise :class:`NonFiniteError` naming joint and field.  Outgoing
    arrays are in the configured joint order.

Float64 sequence fields
    rclpy gives them as ``array.array('d')``; they are read with ``np.frombuffer`` (no
    copy, :func:`f64_view`) and written with ``array.array('d', ndarray.tobytes())``
    (one memcpy, :func:`f64_array`), which avoids the per-element type checks rclpy does
    for Python lists/ndarrays.  Arrays the topic modules return never alias message
    memory.

Serialized messages
    The hot streams arrive as bytes (``raw=True`` subscriptions, :data:`RAW`) and are
    decoded by :mod:`adaptive_dynamics.wire`; :func:`deserialize` is rclpy's fallback for
    what that fast path does not handle (big-endian, ...).

This module holds no topic of its own: :mod:`.joint_states`, :mod:`.references`,
:mod:`.commands` and :mod:`.arrays` build on it.
"""

from __future__ import annotations

import array
import functools
from typing import Sequence, Tuple

import numpy as np

__all__ = [
    "JointMismatchError",
    "NonFiniteError",
    "RAW",
    "deserialize",
    "f64_array",
    "f64_view",
    "nonfinite_error",
    "check_finite",
    "permutation",
    "cached_permutation",
    "NameOrder",
]

RAW = (bytes, bytearray, memoryview)


class JointMismatchError(ValueError):
    """A message's names do not cover the configured names (or are malformed)."""


class NonFiniteError(ValueError):
    """A NaN or infinite value where a finite number is required."""


def deserialize(raw, msg_type, where: str):
    """rclpy's deserializer for what the fast decoders do not handle (big-endian, ...)."""
    from rclpy.serialization import deserialize_message
    try:
        return deserialize_message(bytes(raw), msg_type)
    except Exception as exc:  # rclpy raises its own error types for undecodable bytes
        raise ValueError(f"{where}: undecodable message ({exc})") from None


def f64_array(values, what: str = "values") -> array.array:
    """``array.array('d')`` for a message field (one memcpy from numpy)."""
    a = np.ascontiguousarray(values, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D sequence, got shape {a.shape}")
    return array.array("d", a.tobytes())


def f64_view(field) -> np.ndarray:
    """Read-only float64 view of a message sequence field (no copy when possible)."""
    if isinstance(field, array.array) and field.typecode == "d":
        if len(field) == 0:
            return np.empty(0)
        return np.frombuffer(field, dtype=np.float64)
    return np.asarray(field, dtype=np.float64)


def nonfinite_error(values: np.ndarray, names: Sequence[str], field: str, where: str) -> NonFiniteError:
    """The :class:`NonFiniteError` naming every non-finite entry of ``values``."""
    bad = [
        f"{names[i]}={float(values[i])!r}" if i < len(names) else f"[{i}]={float(values[i])!r}"
        for i in np.flatnonzero(~np.isfinite(values))
    ]
    return NonFiniteError(f"{where}: field '{field}' is not finite for {', '.join(bad)}")


def check_finite(values: np.ndarray, names: Sequence[str], field: str, where: str) -> None:
    if not np.isfinite(values).all():
        raise nonfinite_error(values, names, field, where)


def permutation(expected: Tuple[str, ...], got: Tuple[str, ...], where: str) -> np.ndarray:
    """Indices into ``got`` giving the ``expected`` order; extra names ignored."""
    index = {}
    dups = []
    for i, n in enumerate(got):
        if n in index:
            dups.append(n)
        index[n] = i
    if dups:
        raise JointMismatchError(f"{where}: duplicate name(s) {sorted(set(dups))} in {list(got)}")
    missing = [n for n in expected if n not in index]
    if missing:
        raise JointMismatchError(
            f"{where}: missing joint(s) {missing}; expected {list(expected)}; "
            f"message has {list(got)}"
        )
    return np.fromiter((index[n] for n in expected), dtype=np.intp, count=len(expected))


@functools.lru_cache(maxsize=256)
def cached_permutation(expected: Tuple[str, ...], got: Tuple[str, ...], where: str) -> np.ndarray:
    """:func:`permutation`, cached process-wide (read-only result)."""
    perm = permutation(expected, got, where)
    perm.flags.writeable = False
    return perm


class NameOrder:
    """The configured names and a per-name-list permutation cache (bounded; a stream
    normally has one list): ``get(names)`` -> indices into ``names`` in the configured
    order."""

    __slots__ = ("expected", "where", "_cache", "_max")

    def __init__(self, expected: Sequence[str], where: str, max_entries: int = 16):
        expected = tuple(str(n) for n in expected)
        if len(expected) == 0:
            raise ValueError(f"{where}: expected names must not be empty")
        if len(set(expected)) != len(expected):
            raise ValueError(f"{where}: duplicate expected names {list(expected)}")
        self.expected = expected
        self.where = where
        self._cache: dict = {}
        self._max = max_entries

    def get(self, names) -> np.ndarray:
        key = tuple(names)
        perm = self._cache.get(key)
        if perm is None:
            perm = permutation(self.expected, key, self.where)
            if len(self._cache) >= self._max:
                self._cache.clear()
            self._cache[key] = perm
        return perm

"""The ``joint_states`` stream: ``sensor_msgs/JointState`` <-> arrays in the configured
joint order.

Serves the topic contract (docs/interfaces.md, "Topics"), ``joint_states``: position [rad], velocity [rad/s],
effort = measured joint torque [Nm], matched **by joint name** (the rules are in
:mod:`.fields`).  ``header.stamp`` is the instant of the state; a controller answers it
with a command carrying that stamp (:mod:`.commands`).

Entry point: :meth:`JointStateMapper.map` -- a message or its serialized bytes (a
``raw=True`` subscription) -> ``(stamp_ns, q, v, effort)``.  :func:`state_stamp` gives
the stamp of a state the mapper rejected (to answer it anyway); :func:`joint_state_msg`
builds the message (also the carrier of stamped vectors, :mod:`.arrays`).
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np
from sensor_msgs.msg import JointState

from .. import wire
from .fields import RAW, JointMismatchError, NameOrder, deserialize, f64_array, f64_view, nonfinite_error
from .stamps import NS_PER_S, StampLike, from_ns, to_ns

__all__ = ["JointStateMapper", "state_stamp", "joint_state_msg"]


class JointStateMapper:
    """Map ``sensor_msgs/JointState`` to arrays in the configured joint order, by name.

    ``map(msg) -> (stamp_ns, q, v, effort)``; ``v``/``effort`` are ``None`` when
    the message leaves that field empty.  With ``all_nan_as_missing`` (default)
    a velocity/effort field that is NaN for *every* configured joint is also
    reported as ``None``: ros2_control's ``joint_state_broadcaster`` fills
    interfaces a joint does not have with NaN.  A partial NaN/inf is always an
    error, as is any non-finite position.

    ``msg`` may also be the serialized message (a ``raw=True`` subscription): it is
    read straight into arrays by :func:`adaptive_dynamics.wire.decode_joint_state`
    (~6 us instead of ~20 us for rclpy's message object), falling back to rclpy's
    deserializer for encodings the fast path does not handle.

    The index permutation is cached per incoming name list, so the hot path is
    one fancy-index per field.  With ``reuse_buffers=True`` the returned arrays
    are preallocated buffers overwritten by the next call (copy if kept).
    """

    def __init__(
        self,
        expected_names: Sequence[str],
        *,
        reuse_buffers: bool = False,
        all_nan_as_missing: bool = True,
        where: str = "joint_states",
    ):
        self._perms = NameOrder(expected_names, where)
        self.names: Tuple[str, ...] = self._perms.expected
        self.n = len(self.names)
        self.where = where
        self.all_nan_as_missing = all_nan_as_missing
        self._bufs = (
            tuple(np.empty(self.n) for _ in range(3)) if reuse_buffers else None
        )
        self._wire_names = wire.NameCache()

    def permutation(self, names: Sequence[str]) -> np.ndarray:
        """Indices into ``names`` that give the configured order (cached)."""
        return self._perms.get(names)

    def _field(self, msg_field, perm, n_msg, fname, slot, optional):
        if len(msg_field) != n_msg:
            if optional and len(msg_field) == 0:
                return None
            raise JointMismatchError(
                f"{self.where}: {n_msg} names but {len(msg_field)} values in '{fname}'"
            )
        src = f64_view(msg_field)
        if self._bufs is not None:
            out = np.take(src, perm, out=self._bufs[slot])
        else:
            out = src[perm]
        if not np.isfinite(out).all():
            if optional and self.all_nan_as_missing and np.isnan(out).all():
                return None
            raise nonfinite_error(out, self.names, fname, self.where)
        return out

    def map(self, msg):
        if isinstance(msg, RAW):
            try:
                stamp, names, P, V, E = wire.decode_joint_state(msg, self._wire_names)
            except wire.WireError:
                msg = deserialize(msg, JointState, self.where)
            else:
                return self._map(stamp, names, P, V, E)
        return self._map(to_ns(msg.header.stamp), msg.name, msg.position, msg.velocity, msg.effort)

    def _map(self, stamp, names, P, V, E):
        perm = self._perms.get(names)
        n_msg = len(names)
        if self._bufs is None and type(P) is np.ndarray and len(P) == len(V) == len(E) == n_msg:
            # the hot path's case (a wire-decoded state with every field): one finiteness
            # test for the three (a NaN or inf propagates into the sum); otherwise the
            # per-field checks below say which entry, or take an all-NaN field as missing
            q, v, e = P[perm], V[perm], E[perm]
            if np.isfinite(q + v + e).all():
                return stamp, q, v, e
        q = self._field(P, perm, n_msg, "position", 0, False)
        v = self._field(V, perm, n_msg, "velocity", 1, True)
        e = self._field(E, perm, n_msg, "effort", 2, True)
        return stamp, q, v, e

    __call__ = map


def state_stamp(msg) -> Optional[int]:
    """The header stamp [ns] of a JointState (or any message starting with a
    ``std_msgs/Header``), given as a message or serialized; None if unreadable."""
    if isinstance(msg, RAW):
        if len(msg) < 12 or bytes(msg[:2]) != b"\x00\x01":
            return None
        sec, nsec = wire._I32U32.unpack_from(msg, 4)
        return sec * NS_PER_S + nsec
    return to_ns(msg.header.stamp)


def joint_state_msg(
    stamp: StampLike,
    names: Sequence[str],
    q=None,
    v=None,
    effort=None,
    frame_id: str = "",
) -> JointState:
    """``sensor_msgs/JointState``; ``None`` fields are left empty."""
    msg = JointState()
    msg.header.stamp = from_ns(stamp)
    msg.header.frame_id = frame_id
    msg.name = list(names)
    n = len(msg.name)
    for fname, vals in (("position", q), ("velocity", v), ("effort", effort)):
        if vals is None:
            continue
        arr = f64_array(vals, fname)
        if len(arr) != n and len(arr) != 0:  # empty = field not provided
            raise ValueError(f"joint_state_msg: {n} names but {len(arr)} values in '{fname}'")
        setattr(msg, fname, arr)
    return msg

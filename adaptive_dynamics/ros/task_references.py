"""The ``task_reference`` stream: end-effector references as
``trajectory_msgs/MultiDOFJointTrajectory`` points, kept by the instant they apply to and
looked up by control instant -- the task-space counterpart of :mod:`.references`.

Contract (what the ``trajectory`` node publishes with ``space: task`` and the
``scqp_controller`` consumes):

* ``header.frame_id`` = the world frame of every pose, twist and acceleration: the robot
  model's base frame (its URDF root link, :func:`base_frame_name`; ``panda_link0`` for the
  Panda).  A reference in any other frame is refused.
* ``joint_names`` = the tracked frame's name (the model's ``ee_frame``, e.g.
  ``panda_hand_tcp``); matched by name (other names, with their values, are ignored); a
  message without it is refused.
* point *i* applies at ``header.stamp + points[i].time_from_start`` (as for
  ``reference``); the points of a message must be in strictly increasing time.  Each
  point has, per name, one ``transforms`` entry (position of the frame's origin [m] and
  orientation as a unit quaternion, x y z w), and optionally one ``velocities`` (Twist:
  linear velocity of the origin [m/s] and angular velocity [rad/s]) and one
  ``accelerations`` entry (Twist: linear [m/s^2] and angular acceleration [rad/s^2]),
  all in the world frame's axes; a message leaves ``velocities``/``accelerations``
  empty in every point or in none (empty: zero).
* References are published ahead of their instant; consumers select by stamp, never
  "the latest".

Refused -- :class:`ValueError` naming the reason, counted in ``rejected``: another
``frame_id``; no point or no entry for the tracked frame; a field with the wrong number
of entries; a NaN/inf value; a quaternion whose norm is not 1 (within 1e-3; within that
it is normalised); points out of time order; a message whose every point lies before the
last instant looked up (stale: its instants have passed).  The stamp range of a refused
message whose stamps could be read is remembered (:meth:`TaskReferenceBuffer.refused_at`)
so a controller answers those instants with its safe command at once instead of waiting
for a reference that will not come.

Entry points: :func:`task_reference_msg` (a batch) and :func:`task_reference_bytes` (the
same, serialized by :mod:`adaptive_dynamics.wire`), :class:`TaskReferenceBuffer`
(``add_any``, ``lookup``, ``refused_at``), :func:`base_frame_name`.
"""

from __future__ import annotations

import collections
from typing import NamedTuple, Optional

import numpy as np
from builtin_interfaces.msg import Duration
from geometry_msgs.msg import Transform, Twist
from trajectory_msgs.msg import MultiDOFJointTrajectory, MultiDOFJointTrajectoryPoint

from ..wire import NameCache, TaskBatch, WireError, decode_multidof, encode_multidof
from .fields import RAW, deserialize
from .references import ReferenceBuffer
from .stamps import StampLike, duration_ns, from_ns, to_ns

__all__ = ["TASK_REFERENCE_TOPIC", "TaskReference", "TaskReferenceBuffer", "task_reference_msg", "task_reference_bytes",
           "base_frame_name", "quaternion_to_matrix", "matrix_to_quaternion"]

TASK_REFERENCE_TOPIC = "task_reference"
#: accepted deviation of a quaternion's norm from 1 (then normalised)
QUATERNION_TOLERANCE = 1e-3


def base_frame_name(model) -> str:
    """The world frame of a fixed-base :class:`~adaptive_dynamics.dynamics.RobotModel`:
    its URDF root link (the first body frame on pinocchio's universe joint)."""
    import pinocchio as pin
    for f in model.model.frames:
        if f.parentJoint == 0 and f.type == pin.FrameType.BODY:
            return f.name
    return model.model.frames[0].name


def quaternion_to_matrix(qxyzw) -> np.ndarray:
    """3x3 rotation of a unit quaternion (x, y, z, w)."""
    x, y, z, w = (float(c) for c in qxyzw)
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
        [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
        [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
    ])


def matrix_to_quaternion(R) -> np.ndarray:
    """Unit quaternion (x, y, z, w), w >= 0, of a 3x3 rotation."""
    import pinocchio as pin
    q = pin.Quaternion(np.asarray(R, dtype=float))
    out = np.array([q.x, q.y, q.z, q.w])
    return -out if out[3] < 0 else out


class TaskReference(NamedTuple):
    """A task-space reference sample (world-frame axes).  ``twist``/``accel`` are
    ``[linear, angular]`` (6 values) or None when the message carried none (zero)."""

    stamp_ns: int
    position: np.ndarray       # 3
    quaternion: np.ndarray     # 4: x, y, z, w (unit)
    twist: Optional[np.ndarray]
    accel: Optional[np.ndarray]

    @property
    def rotation(self) -> np.ndarray:
        return quaternion_to_matrix(self.quaternion)


def _rows(value, k: int, width: int, what: str) -> Optional[np.ndarray]:
    if value is None:
        return None
    a = np.asarray(value, dtype=float)
    if a.ndim == 1:
        a = np.broadcast_to(a, (k, a.size))
    if a.shape != (k, width):
        raise ValueError(f"task_reference_msg: {what} must be {width} values or {k} x {width}, got {a.shape}")
    return a


def _batch_rows(P, quaternion, V, A) -> tuple:
    """``(P k x 3, quaternions k x 4, V, A k x 6 or None)`` of the batch helpers' arguments."""
    P = np.asarray(P, dtype=float)
    if P.ndim == 1:
        P = P[None]
    if P.ndim != 2 or P.shape[1] != 3:
        raise ValueError(f"task_reference_msg: positions must be k x 3, got {P.shape}")
    k = P.shape[0]
    Qr = _rows([0.0, 0.0, 0.0, 1.0] if quaternion is None else quaternion, k, 4, "quaternion")
    return P, Qr, _rows(V, k, 6, "V"), _rows(A, k, 6, "A")


def task_reference_msg(stamp0_ns: StampLike, dt_ns: int, frame_id: str, name: str, P, quaternion=None,
                       V=None, A=None) -> MultiDOFJointTrajectory:
    """A batch of task references: point ``i`` applies at ``stamp0 + i dt``.

    ``P``: k x 3 positions (or 3 values: one point); ``quaternion``: 4 values (x y z w)
    for all points or k x 4 (default identity); ``V``/``A``: k x 6 twists and
    accelerations ``[linear, angular]`` (or 6 values for all; None: left empty)."""
    P, Qr, V, A = _batch_rows(P, quaternion, V, A)
    k = P.shape[0]
    msg = MultiDOFJointTrajectory()
    msg.header.stamp = from_ns(stamp0_ns)
    msg.header.frame_id = str(frame_id)
    msg.joint_names = [str(name)]
    pts = []
    for i in range(k):
        pt = MultiDOFJointTrajectoryPoint()
        tf = Transform()
        tf.translation.x, tf.translation.y, tf.translation.z = (float(c) for c in P[i])
        tf.rotation.x, tf.rotation.y, tf.rotation.z, tf.rotation.w = (float(c) for c in Qr[i])
        pt.transforms = [tf]
        for field_name, rows in (("velocities", V), ("accelerations", A)):
            if rows is not None:
                tw = Twist()
                tw.linear.x, tw.linear.y, tw.linear.z = (float(c) for c in rows[i, :3])
                tw.angular.x, tw.angular.y, tw.angular.z = (float(c) for c in rows[i, 3:])
                setattr(pt, field_name, [tw])
        off = i * int(dt_ns)
        pt.time_from_start = Duration(sec=off // 1_000_000_000, nanosec=off % 1_000_000_000)
        pts.append(pt)
    msg.points = pts
    return msg


def task_reference_bytes(stamp0_ns: StampLike, dt_ns: int, frame_id: str, name: str, P, quaternion=None,
                         V=None, A=None) -> bytes:
    """:func:`task_reference_msg` serialized (publish the bytes): the same wire bytes from
    :func:`adaptive_dynamics.wire.encode_multidof` without building a Python object per point."""
    P, Qr, V, A = _batch_rows(P, quaternion, V, A)
    return encode_multidof(to_ns(stamp0_ns), int(dt_ns), [str(name)], np.hstack([P, Qr])[:, None],
                           None if V is None else V[:, None], None if A is None else A[:, None],
                           frame_id=str(frame_id))


def _twist(tw) -> tuple:
    return (tw.linear.x, tw.linear.y, tw.linear.z, tw.angular.x, tw.angular.y, tw.angular.z)


class TaskReferenceBuffer(ReferenceBuffer):
    """Task references (:class:`TaskReference`) received ahead of time, looked up by
    control instant; validation as in the module docstring.

    ``lookup`` (exact within a tolerance, else the latest within ``max_staleness_ns``,
    else None), capacity, eviction and the counters are :class:`ReferenceBuffer`'s.
    ``frame_id`` is the required world frame, ``name`` the tracked frame."""

    #: refused stamp ranges remembered for :meth:`refused_at`
    REFUSED_MEMORY = 64

    def __init__(self, frame_id: str, name: str, capacity: int = 4096, *, max_staleness_ns: int = 10_000_000,
                 where: str = "task_reference"):
        super().__init__([name], capacity, max_staleness_ns=max_staleness_ns, where=where)
        self.frame_id = str(frame_id)
        self.name = str(name)
        self._refused = collections.deque(maxlen=self.REFUSED_MEMORY)
        self._names = NameCache()

    # ------------------------------------------------------------------ parsing
    def _stamps_of(self, msg) -> Optional[np.ndarray]:
        try:
            t0 = to_ns(msg.header.stamp)
            return t0 + np.array([duration_ns(pt.time_from_start) for pt in msg.points], dtype=np.int64)
        except Exception:  # noqa: BLE001 -- only for remembering a refused range
            return None

    def _check_header(self, frame_id: str, names: list, k: int) -> int:
        """The tracked frame's index in ``names``, or ValueError."""
        w = self.where
        if frame_id != self.frame_id:
            raise ValueError(f"{w}: frame_id {frame_id!r} is not the world frame {self.frame_id!r}"
                             " (the robot model's base frame)")
        if self.name not in names:
            raise ValueError(f"{w}: joint_names {names} do not name the tracked frame {self.name!r}")
        if not k:
            raise ValueError(f"{w}: MultiDOFJointTrajectory has no points")
        return names.index(self.name)

    def parse(self, msg: MultiDOFJointTrajectory) -> list:
        """Validated :class:`TaskReference` list of a message (nothing stored)."""
        w = self.where
        names = list(msg.joint_names)
        j, m = self._check_header(msg.header.frame_id, names, len(msg.points)), len(names)
        pts = msg.points
        lens = {len(pt.transforms) for pt in pts}
        if lens != {m}:
            raise ValueError(f"{w}: {m} joint names but {sorted(lens)} transforms per point")
        for fname in ("velocities", "accelerations"):
            lens = {len(getattr(pt, fname)) for pt in pts}
            if lens not in ({m}, {0}):
                raise ValueError(f"{w}: {m} joint names but {sorted(lens)} {fname} per point (every point"
                                 " one per name, or none)")
        P = np.array([(pt.transforms[j].translation.x, pt.transforms[j].translation.y,
                       pt.transforms[j].translation.z) for pt in pts], dtype=float)
        Qr = np.array([(pt.transforms[j].rotation.x, pt.transforms[j].rotation.y, pt.transforms[j].rotation.z,
                        pt.transforms[j].rotation.w) for pt in pts], dtype=float)
        V = np.array([_twist(pt.velocities[j]) for pt in pts]) if len(pts[0].velocities) else None
        A = np.array([_twist(pt.accelerations[j]) for pt in pts]) if len(pts[0].accelerations) else None
        return self._references(self._stamps_of(msg), P, Qr, V, A)

    def parse_batch(self, batch: TaskBatch) -> list:
        """:meth:`parse` for a message decoded by :func:`adaptive_dynamics.wire.decode_multidof`."""
        names = list(batch.names)
        j = self._check_header(batch.frame_id, names, batch.t_ns.size)
        T = batch.T[:, j]
        return self._references(batch.t_ns, T[:, :3], T[:, 3:],
                                None if batch.V is None else batch.V[:, j], None if batch.A is None else batch.A[:, j])

    def _references(self, t: np.ndarray, P, Qr, V, A) -> list:
        """Points (stamps ``t``, the tracked frame's k x 3 positions, k x 4 quaternions,
        k x 6 twists and accelerations or None) validated into :class:`TaskReference` samples."""
        w = self.where
        if t.size > 1 and np.any(np.diff(t) <= 0):
            bad = int(np.flatnonzero(np.diff(t) <= 0)[0]) + 1
            raise ValueError(f"{w}: points out of order: point {bad} at {t[bad] * 1e-9:.6f} s is not after point"
                             f" {bad - 1} at {t[bad - 1] * 1e-9:.6f} s")
        for what, X in (("position", P), ("orientation", Qr), ("velocity", V), ("acceleration", A)):
            if X is not None and not np.isfinite(X).all():
                bad = int(np.flatnonzero(~np.isfinite(X).all(axis=1))[0])
                raise ValueError(f"{w}: non-finite {what} of {self.name!r} in point {bad}: {X[bad].tolist()}")
        norm = np.linalg.norm(Qr, axis=1)
        if np.any(np.abs(norm - 1.0) > QUATERNION_TOLERANCE):
            bad = int(np.flatnonzero(np.abs(norm - 1.0) > QUATERNION_TOLERANCE)[0])
            raise ValueError(f"{w}: the orientation of point {bad} is not a unit quaternion (norm {norm[bad]:.6g})")
        P, Qr = np.array(P, dtype=float), Qr / norm[:, None]
        V = None if V is None else np.array(V, dtype=float)
        A = None if A is None else np.array(A, dtype=float)
        last = self._last_lookup
        if last is not None and int(t[-1]) < last:
            raise ValueError(f"{w}: stale: its last point ({t[-1] * 1e-9:.6f} s) is before the last control"
                             f" instant {last * 1e-9:.6f} s")
        return [TaskReference(int(t[i]), P[i], Qr[i], None if V is None else V[i], None if A is None else A[i])
                for i in range(t.size)]

    def add(self, msg) -> int:
        """Store a message's (or a :class:`~adaptive_dynamics.wire.TaskBatch`'s) points;
        returns how many.  Refused messages raise ``ValueError`` (counted in ``rejected``;
        their stamp range remembered)."""
        batch = isinstance(msg, TaskBatch)
        try:
            refs = self.parse_batch(msg) if batch else self.parse(msg)
        except ValueError:
            self.counters["rejected"] += 1
            t = msg.t_ns if batch else self._stamps_of(msg)
            if t is not None and t.size:
                with self._lock:
                    self._refused.append((int(t.min()), int(t.max())))
            raise
        self._insert_many(refs)
        return len(refs)

    def add_any(self, msg) -> int:
        """:meth:`add` for a message or its serialized bytes (a ``raw=True`` subscription:
        decoded by :func:`adaptive_dynamics.wire.decode_multidof`, rclpy's deserializer for
        what that does not handle)."""
        if isinstance(msg, RAW):
            try:
                return self.add(decode_multidof(msg, self._names))
            except WireError:
                pass
            try:
                msg = deserialize(bytes(msg), MultiDOFJointTrajectory, f"{self.where}: MultiDOFJointTrajectory")
            except ValueError:
                self.counters["rejected"] += 1
                raise
        return self.add(msg)

    def add_serialized(self, raw: bytes) -> int:
        return self.add_any(raw)

    def add_arrays(self, stamp_ns: int, position, quaternion=(0.0, 0.0, 0.0, 1.0), twist=None,
                   accel=None) -> None:
        """Store one reference given as arrays (validated like a message's point)."""
        msg = task_reference_msg(int(stamp_ns), 0, self.frame_id, self.name, position, quaternion,
                                 None if twist is None else np.asarray(twist, float).reshape(1, 6),
                                 None if accel is None else np.asarray(accel, float).reshape(1, 6))
        self.add(msg)

    def refused_at(self, t_ns: int, tolerance_ns: int = 0) -> bool:
        """Whether a refused message covered the instant ``t_ns`` (its first..last stamp,
        widened by ``tolerance_ns``)."""
        t = int(t_ns)
        with self._lock:
            return any(lo - tolerance_ns <= t <= hi + tolerance_ns for lo, hi in self._refused)

    def clear(self) -> None:
        super().clear()
        with self._lock:
            self._refused.clear()

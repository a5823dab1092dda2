"""The ``reference`` stream: ``trajectory_msgs/JointTrajectory`` points kept by the
instant they apply to, looked up by control instant.

Serves the topic contract (docs/interfaces.md, "Topics"), ``reference``, and "Time, lockstep and real time":
``joint_names`` (matched by name, :mod:`.fields`) and points (positions, velocities,
accelerations); point *i* applies at ``header.stamp + points[i].time_from_start``
(ros2_control's ``joint_trajectory_controller`` reading of the same message; a
one-point message has ``time_from_start = 0``).  References are published *ahead* of
that instant and consumers select by stamp, never "the latest".

Entry points: :meth:`ReferenceBuffer.add_any` (a message or its serialized bytes, a
``raw=True`` subscription) and :meth:`ReferenceBuffer.lookup` (the reference for a
state's stamp).  :func:`reference_msg` and :func:`reference_batch_msg` build messages.
"""

from __future__ import annotations

import bisect
import threading
from typing import NamedTuple, Optional, Sequence

import numpy as np
from builtin_interfaces.msg import Duration
from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

from .. import wire
from .fields import JointMismatchError, NameOrder, check_finite, deserialize, f64_array, f64_view, nonfinite_error
from .stamps import StampLike, duration_ns, from_ns, to_ns

__all__ = ["reference_msg", "reference_batch_msg", "Reference", "ReferenceBuffer"]


def reference_msg(stamp_ns: StampLike, names: Sequence[str], q, qd=None, qdd=None) -> JointTrajectory:
    """One-point ``JointTrajectory``; ``header.stamp`` is the instant it applies to."""
    msg = JointTrajectory()
    msg.header.stamp = from_ns(stamp_ns)
    msg.joint_names = list(names)
    n = len(msg.joint_names)
    pt = JointTrajectoryPoint()
    for fname, vals in (("positions", q), ("velocities", qd), ("accelerations", qdd)):
        if vals is None:
            continue
        arr = f64_array(vals, fname)
        if len(arr) != n:
            raise ValueError(f"reference_msg: {n} joint names but {len(arr)} {fname}")
        setattr(pt, fname, arr)
    pt.time_from_start = Duration(sec=0, nanosec=0)
    msg.points = [pt]
    return msg


def reference_batch_msg(stamp0_ns: int, dt_ns: int, names: Sequence[str], Q, QD=None, QDD=None) -> JointTrajectory:
    """Several references in one ``JointTrajectory``: point ``i`` applies at
    ``header.stamp + time_from_start = stamp0 + i dt`` (how joint_trajectory_controller
    reads points).  Rows of ``Q``/``QD``/``QDD`` are the points."""
    msg = JointTrajectory()
    msg.header.stamp = from_ns(stamp0_ns)
    msg.joint_names = list(names)
    Q = np.asarray(Q, dtype=float)
    pts = []
    for i in range(Q.shape[0]):
        pt = JointTrajectoryPoint()
        pt.positions = Q[i].tolist()
        if QD is not None:
            pt.velocities = QD[i].tolist()
        if QDD is not None:
            pt.accelerations = QDD[i].tolist()
        off = i * int(dt_ns)
        pt.time_from_start = Duration(sec=off // 1_000_000_000, nanosec=off % 1_000_000_000)
        pts.append(pt)
    msg.points = pts
    return msg


class Reference(NamedTuple):
    """A reference sample in the configured joint order (``qd``/``qdd`` may be None)."""

    stamp_ns: int
    q: np.ndarray
    qd: Optional[np.ndarray]
    qdd: Optional[np.ndarray]


class ReferenceBuffer:
    """Stamped references received ahead of time, looked up by control instant.

    ``add(msg)`` stores every point of a ``JointTrajectory`` (mapped by joint
    name) keyed by ``header.stamp + time_from_start``.  ``lookup(t_ns,
    tolerance_ns)`` returns:

    1. the reference whose stamp is nearest to ``t_ns`` if within
       ``tolerance_ns`` (an "exact" hit), else
    2. the latest reference stamped before ``t_ns`` if it is at most
       ``max_staleness_ns`` old (a "stale" hit: hold the last reference), else
    3. ``None`` (a miss) -- the caller decides (hold, zero torque, ...).

    Duplicate stamps replace the stored entry (counted in ``duplicates``);
    out-of-order arrivals are inserted in place (``out_of_order``); arrivals
    stamped before the last looked-up instant are counted in ``late``.  When
    more than ``capacity`` entries are held the oldest is evicted
    (``evicted``): capacity must exceed the publish-ahead horizon in control
    periods.  Thread-safe (one lock; add and lookup are O(log n)).
    """

    COUNTERS = ("received", "duplicates", "out_of_order", "late", "evicted",
                "rejected", "exact_hits", "stale_hits", "misses")

    def __init__(
        self,
        expected_names: Sequence[str],
        capacity: int = 64,
        *,
        max_staleness_ns: int = 10_000_000,
        where: str = "reference",
    ):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._perms = NameOrder(expected_names, where)
        self.names = self._perms.expected
        self.n = len(self.names)
        self.capacity = int(capacity)
        self.max_staleness_ns = int(max_staleness_ns)
        self.where = where
        self._stamps: list = []
        self._items: dict = {}
        self._last_lookup: Optional[int] = None
        self._lock = threading.Lock()
        self._wire_names = wire.NameCache()
        self.counters = {k: 0 for k in self.COUNTERS}

    def __len__(self) -> int:
        return len(self._stamps)

    def stamps(self) -> list:
        with self._lock:
            return list(self._stamps)

    def clear(self) -> None:
        with self._lock:
            self._stamps.clear()
            self._items.clear()
            self._last_lookup = None

    def _field(self, pt_field, perm, n_msg, fname, optional):
        if len(pt_field) == 0 and optional:
            return None
        if len(pt_field) != n_msg:
            raise JointMismatchError(
                f"{self.where}: {n_msg} joint names but {len(pt_field)} {fname}"
            )
        out = f64_view(pt_field)[perm]
        check_finite(out, self.names, fname, self.where)
        return out

    def parse(self, msg: JointTrajectory) -> list:
        """Validated :class:`Reference` list of a message (no storing)."""
        n_msg = len(msg.joint_names)
        if not msg.points:
            raise ValueError(f"{self.where}: JointTrajectory has no points")
        t0 = to_ns(msg.header.stamp)
        pts = msg.points
        t = np.fromiter((duration_ns(pt.time_from_start) for pt in pts), dtype=np.int64, count=len(pts))
        fields = []
        for fname, optional in (("positions", False), ("velocities", True), ("accelerations", True)):
            rows = [getattr(pt, fname) for pt in pts]
            lens = {len(r) for r in rows}
            if lens == {0} and optional:
                fields.append(None)
                continue
            if lens != {n_msg}:
                if optional and 0 in lens:
                    # some points carry the field, others not: per point (rare)
                    fields.append([None if len(r) == 0 else self._row(r, n_msg, fname) for r in rows])
                    continue
                bad = sorted(lens - {n_msg})
                raise JointMismatchError(f"{self.where}: {n_msg} joint names but {bad[0]} {fname}")
            fields.append(np.array(rows, dtype=np.float64).reshape(len(pts), n_msg))
        return self._references(msg.joint_names, t0 + t, *fields)

    def _row(self, r, n_msg, fname):
        if len(r) != n_msg:
            raise JointMismatchError(f"{self.where}: {n_msg} joint names but {len(r)} {fname}")
        return np.asarray(r, dtype=np.float64)

    def _references(self, names, t_ns, Q, QD=None, QDD=None) -> list:
        """Rows (message joint order) -> validated references in the configured order."""
        perm = self._perms.get(names)
        out = []
        cols = {}
        for fname, X in (("positions", Q), ("velocities", QD), ("accelerations", QDD)):
            if X is None:
                cols[fname] = [None] * len(t_ns)
            elif isinstance(X, list):   # per-point optional rows
                rows = []
                for r in X:
                    if r is not None:
                        r = r[perm]
                        check_finite(r, self.names, fname, self.where)
                    rows.append(r)
                cols[fname] = rows
            else:
                Y = X[:, perm]
                if not np.isfinite(Y).all():
                    bad = int(np.flatnonzero(~np.isfinite(Y).all(axis=1))[0])
                    raise nonfinite_error(Y[bad], self.names, f"{fname} (point {bad})", self.where)
                cols[fname] = Y
        for i, s in enumerate(t_ns.tolist()):
            out.append(Reference(s, cols["positions"][i], cols["velocities"][i], cols["accelerations"][i]))
        return out

    def add(self, msg: JointTrajectory) -> int:
        """Store a message's points; returns how many.  Invalid messages raise
        (and count in ``rejected``)."""
        try:
            refs = self.parse(msg)
        except ValueError:
            self.counters["rejected"] += 1
            raise
        self._insert_many(refs)
        return len(refs)

    def add_any(self, msg) -> int:
        """:meth:`add_serialized` for bytes (a ``raw=True`` subscription), else :meth:`add`."""
        if isinstance(msg, (bytes, bytearray, memoryview)):
            return self.add_serialized(bytes(msg))
        return self.add(msg)

    def add_serialized(self, raw: bytes) -> int:
        """Store the points of a serialized ``JointTrajectory`` (a ``raw=True``
        subscription): decoded straight into arrays by :mod:`adaptive_dynamics.wire` (~0.1 ms for 100
        points instead of rclpy's several ms), or by rclpy when the message has a shape
        the fast path does not handle (points with differing fields, big-endian).
        Same validation, counters and errors as :meth:`add`."""
        try:
            batch = wire.decode_trajectory(raw, self._wire_names)
        except wire.WireError:
            try:
                msg = deserialize(raw, JointTrajectory, f"{self.where}: JointTrajectory")
            except ValueError:
                self.counters["rejected"] += 1
                raise
            return self.add(msg)
        try:
            refs = self._references(batch.names, batch.t_ns, batch.Q, batch.QD, batch.QDD)
        except ValueError:
            self.counters["rejected"] += 1
            raise
        self._insert_many(refs)
        return len(refs)

    def add_arrays(self, stamp_ns: int, q, qd=None, qdd=None) -> None:
        """Store a reference given as arrays already in the configured order."""
        def arr(x, fname):
            if x is None:
                return None
            a = np.array(x, dtype=np.float64).reshape(-1)
            if a.shape != (self.n,):
                raise ValueError(f"{self.where}: {fname} has {a.size} values, expected {self.n}")
            check_finite(a, self.names, fname, self.where)
            return a
        self._insert(Reference(int(stamp_ns), arr(q, "positions"), arr(qd, "velocities"),
                               arr(qdd, "accelerations")))

    def _insert_many(self, refs: list) -> None:
        with self._lock:
            for r in refs:
                self._insert_locked(r)
            self._evict_locked()

    def _insert(self, ref: Reference) -> None:
        with self._lock:
            self._insert_locked(ref)
            self._evict_locked()

    def _evict_locked(self) -> None:
        extra = len(self._stamps) - self.capacity
        if extra > 0:
            for old in self._stamps[:extra]:
                del self._items[old]
            del self._stamps[:extra]
            self.counters["evicted"] += extra

    def _insert_locked(self, ref: Reference) -> None:
        c = self.counters
        c["received"] += 1
        s = ref.stamp_ns
        if self._last_lookup is not None and s < self._last_lookup:
            c["late"] += 1
        if s in self._items:
            c["duplicates"] += 1
            self._items[s] = ref
            return
        if self._stamps and s < self._stamps[-1]:
            c["out_of_order"] += 1
            bisect.insort(self._stamps, s)
        else:
            self._stamps.append(s)
        self._items[s] = ref

    def between(self, after_ns: Optional[int], upto_ns: int) -> list:
        """References stamped in ``(after_ns, upto_ns]`` (``after_ns=None``: from the
        oldest held), in stamp order; O(log n + k), no counters touched."""
        with self._lock:
            st = self._stamps
            i = 0 if after_ns is None else bisect.bisect_right(st, int(after_ns))
            j = bisect.bisect_right(st, int(upto_ns))
            return [self._items[s] for s in st[i:j]]

    def latest(self, k: int = 1) -> list:
        """The ``k`` newest references (fewer if fewer are held), in stamp order; no
        counters touched."""
        with self._lock:
            return [self._items[s] for s in self._stamps[-int(k):]] if k > 0 else []

    def lookup(self, t_ns: int, tolerance_ns: int = 0,
               max_staleness_ns: Optional[int] = None) -> Optional[Reference]:
        t = int(t_ns)
        stale = self.max_staleness_ns if max_staleness_ns is None else int(max_staleness_ns)
        c = self.counters
        with self._lock:
            self._last_lookup = t if self._last_lookup is None else max(self._last_lookup, t)
            st = self._stamps
            if not st:
                c["misses"] += 1
                return None
            i = bisect.bisect_left(st, t)
            # nearest neighbour among st[i-1], st[i]
            best = None
            for j in (i - 1, i):
                if 0 <= j < len(st) and abs(st[j] - t) <= tolerance_ns:
                    if best is None or abs(st[j] - t) < abs(best - t):
                        best = st[j]
            if best is not None:
                c["exact_hits"] += 1
                return self._items[best]
            # latest not after t
            k = bisect.bisect_right(st, t) - 1
            if k >= 0 and t - st[k] <= stale:
                c["stale_hits"] += 1
                return self._items[st[k]]
            c["misses"] += 1
            return None

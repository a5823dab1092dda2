"""One reader of a recording's streams: stamped arrays in the model's joint order.

:func:`read_streams` reads a bag (a directory or ``.mcap`` file, :func:`~.bags.resolve_bag`)
in one pass through the fast CDR decoders of :mod:`adaptive_dynamics.wire` and returns
:class:`Streams`:

* ``joint[topic]`` -- every ``sensor_msgs/JointState`` topic asked for (``joint_states``,
  ``adaptive/parametric_torque``, a learner's prediction, ...) as a :class:`JointStream`:
  header stamps [ns] and position / velocity / effort rows with columns in ``names``
  order (a field a message does not carry is NaN);
* ``reference`` -- the ``trajectory_msgs/JointTrajectory`` points of ``reference`` by
  their instant (header stamp + time from start; a later message's point of the same
  instant wins, as in the controller's buffer), a :class:`ReferenceStream`;
* ``task_reference`` -- the ``MultiDOFJointTrajectory`` poses of one frame
  ``(x, y, z, qx, qy, qz, qw)`` by instant;
* ``vectors[topic]`` -- ``(stamp, names, position)`` of JointState messages whose names
  are not joints (parameter estimates and updates), as they come;
* ``diagnostics`` -- each ``/diagnostics`` status's last key/values;
* ``damage`` -- what was skipped: messages of a joint topic without the model's joints
  (``missing="skip"``: their count and the model's joints they lacked; ``"raise"``, the
  default, names the topic and its joints instead), and what was recovered from a
  truncated bag.

Decoding goes through :class:`FastReader` (``wire``'s little-endian fast path, rosbags
for anything else), also what the learner tools (:mod:`.offline`) read samples with.

:meth:`Streams.referenced` aligns a joint stream with the reference at equal stamps
(the lockstep graph answers each state with the reference point of its instant).
No ROS import.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .. import wire
from .bags import open_bag, read_raw, TYPESTORE

__all__ = ["JointStream", "ReferenceStream", "Streams", "read_streams", "FastReader", "decode", "find_topics",
           "TOPIC_ROLES"]


#: role -> (relative topic name, message type) of the recordings the learner tools read
TOPIC_ROLES = {
    "joint_states": ("joint_states", "sensor_msgs/msg/JointState"),
    "reference": ("reference", "trajectory_msgs/msg/JointTrajectory"),
    "parametric": ("adaptive/parametric_torque", "sensor_msgs/msg/JointState"),
    "update": ("adaptive/parameter_update", "sensor_msgs/msg/JointState"),
}


def decode(raw: bytes, msgtype: str):
    """CDR bytes -> rosbags message.  Like rclpy (and unlike ``deserialize_cdr``),
    trailing bytes after the message are ignored: ``rclpy.serialization`` can return a
    buffer longer than the message (seen for JointTrajectory)."""
    msgdef = TYPESTORE.get_msgdef(msgtype)
    view = memoryview(raw)
    if len(raw) < 4 or bytes(view[:2]) not in (b"\x00\x00", b"\x00\x01"):
        raise ValueError(f"a {msgtype} message is not CDR (bad encapsulation header)")
    func = msgdef.deserialize_cdr_le if raw[1] else msgdef.deserialize_cdr_be
    try:
        return func(view[4:], 0, msgdef.cls, TYPESTORE)[0]
    except Exception as exc:  # struct.error, IndexError, UnicodeDecodeError, ... on a corrupt message
        raise ValueError(f"cannot decode a {msgtype} message ({type(exc).__name__}: {exc})") from None


_U32 = struct.Struct("<I")


class FastReader:
    """Fast little-endian CDR decoding of the bulk of a bag: ``sensor_msgs/JointState``
    -> ``(stamp_ns, names, position, velocity, effort)`` and
    ``trajectory_msgs/JointTrajectory`` -> ``(stamp_ns, names, [(time_from_start_ns,
    accelerations), ...])``.  Header and name blocks and whole reference batches go
    through :mod:`adaptive_dynamics.wire` (names decoded once per distinct block);
    an empty double sequence is not padded (as rosbags and Fast CDR).  Anything
    unexpected falls back to rosbags (:func:`decode`); tested against it."""

    def __init__(self):
        self._names = wire.NameCache()

    @staticmethod
    def _doubles(b, off: int, size: int):
        off = (off + 3) & ~3
        m = _U32.unpack_from(b, off)[0]
        off += 4
        if m:
            off = (off + 7) & ~7
        if off + 8 * m > size:
            raise ValueError("truncated")
        return np.frombuffer(b, "<f8", m, off), off + 8 * m

    def joint_state(self, raw: bytes, msgtype: str = "sensor_msgs/msg/JointState"):
        try:
            if bytes(raw[:2]) != b"\x00\x01":
                raise ValueError("not little-endian CDR")
            b = memoryview(raw)[4:]
            size = len(b)
            stamp, names, off = wire.header_names(b, size, self._names)
            pos, off = self._doubles(b, off, size)
            vel, off = self._doubles(b, off, size)
            eff, off = self._doubles(b, off, size)
            return stamp, names, pos, vel, eff
        except (ValueError, struct.error, UnicodeDecodeError):
            msg = decode(raw, msgtype)
            return _stamp(msg.header), tuple(msg.name), msg.position, msg.velocity, msg.effort

    def trajectory(self, raw: bytes, msgtype: str = "trajectory_msgs/msg/JointTrajectory"):
        try:
            tb = wire.decode_trajectory(raw, self._names)
            acc = tb.QDD if tb.QDD is not None else np.zeros((len(tb.t_ns), 0))
            return tb.stamp_ns, tb.names, list(zip((tb.t_ns - tb.stamp_ns).tolist(), acc))
        except ValueError:
            msg = decode(raw, msgtype)
            return _stamp(msg.header), tuple(msg.joint_names), [
                (int(p.time_from_start.sec) * 1_000_000_000 + int(p.time_from_start.nanosec), p.accelerations)
                for p in msg.points]


    def batch(self, raw: bytes, msgtype: str = "trajectory_msgs/msg/JointTrajectory") -> "wire.TrajectoryBatch":
        """A ``JointTrajectory`` as a :class:`~adaptive_dynamics.wire.TrajectoryBatch`
        (points' instants, positions, velocities, accelerations)."""
        try:
            return wire.decode_trajectory(raw, self._names)
        except ValueError:
            msg = decode(raw, msgtype)
            t0 = _stamp(msg.header)
            pts = msg.points
            t = np.array([t0 + int(p.time_from_start.sec) * 1_000_000_000 + int(p.time_from_start.nanosec)
                          for p in pts], dtype=np.int64)

            def rows(field):
                vals = [np.asarray(getattr(p, field), dtype=float) for p in pts]
                return np.array(vals) if vals and all(len(v) == len(msg.joint_names) for v in vals) else None
            Q = rows("positions")
            return wire.TrajectoryBatch(t0, tuple(msg.joint_names), t, Q if Q is not None else
                                        np.full((len(pts), len(msg.joint_names)), np.nan),
                                        rows("velocities"), rows("accelerations"))


def _stamp(header) -> int:
    return int(header.stamp.sec) * 1_000_000_000 + int(header.stamp.nanosec)


def find_topics(path, roles: Optional[dict] = None) -> tuple[dict, dict]:
    """role -> topic in the bag (exact relative name with a leading '/', else a unique
    namespace suffix) and topic -> (msgtype, count), for ``roles`` ({role: (relative
    name, message type)}; default :data:`TOPIC_ROLES`).  ``path``: a bag or a
    :class:`~.bags.BagSource`."""
    src = open_bag(path)
    info, where = src.topics, str(src.path)
    found = {}
    for role, (name, msgtype) in (TOPIC_ROLES if roles is None else roles).items():
        topic = _in_bag(info, "/" + name, where)
        if topic is not None and info[topic][1] > 0:
            if info[topic][0] != msgtype:
                raise ValueError(f"bag {where!r}: {topic} has type {info[topic][0]}, expected {msgtype}")
            found[role] = topic
    return found, info


@dataclass
class JointStream:
    """Stamps [ns] (int64) and ``(N, n)`` position / velocity / effort in joint order."""
    t_ns: np.ndarray
    position: np.ndarray
    velocity: np.ndarray
    effort: np.ndarray

    @property
    def t(self) -> np.ndarray:
        """Stamps [s]."""
        return self.t_ns * 1e-9

    def rows(self, keep) -> "JointStream":
        """The rows selected by a boolean mask or an index array."""
        return JointStream(self.t_ns[keep], self.position[keep], self.velocity[keep], self.effort[keep])


@dataclass
class ReferenceStream:
    """Reference points by instant: sorted stamps [ns] and ``(N, n)`` q, qd, qdd."""
    t_ns: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    qdd: np.ndarray

    def index(self, t_ns) -> np.ndarray:
        """Row of each stamp in ``t_ns`` (-1 where no point has exactly that instant)."""
        t_ns = np.asarray(t_ns, dtype=np.int64)
        if not len(self.t_ns):
            return np.full(t_ns.shape, -1)
        i = np.minimum(np.searchsorted(self.t_ns, t_ns), len(self.t_ns) - 1)
        return np.where(self.t_ns[i] == t_ns, i, -1)


@dataclass
class Streams:
    path: str
    names: List[str]
    joint: Dict[str, JointStream] = field(default_factory=dict)
    reference: Optional[ReferenceStream] = None
    task_reference: Optional[Tuple[np.ndarray, np.ndarray]] = None
    vectors: Dict[str, List[tuple]] = field(default_factory=dict)
    diagnostics: Dict[str, Dict[str, str]] = field(default_factory=dict)
    damage: Dict[str, Any] = field(default_factory=dict)

    def joints(self, topic: str = "/joint_states") -> JointStream:
        """The joint stream of ``topic``; ``ValueError`` when the recording has none."""
        s = self.joint.get(topic)
        if s is None or not len(s.t_ns):
            raise ValueError(f"no {topic} messages in {self.path}")
        return s

    def referenced(self, topic: str = "/joint_states") -> Tuple[JointStream, ReferenceStream]:
        """``topic``'s rows at the instants the reference covers, and the reference rows
        of the same instants (row k of one belongs to row k of the other)."""
        s = self.joints(topic)
        if self.reference is None or not len(self.reference.t_ns):
            raise ValueError(f"no /reference points in {self.path}")
        i = self.reference.index(s.t_ns)
        keep = i >= 0
        r, i = self.reference, i[keep]
        return s.rows(keep), ReferenceStream(r.t_ns[i], r.q[i], r.qd[i], r.qdd[i])


def _in_bag(topics: dict, name: str, where) -> Optional[str]:
    """The bag's topic for ``name`` (exact, else the unique one ending in ``name``: a
    namespaced recording), None when it has none."""
    if name in topics:
        return name
    cands = [t for t in topics if t.endswith("/" + name.lstrip("/"))]
    if len(cands) > 1:
        raise ValueError(f"bag {str(where)!r}: topic {name!r} is ambiguous: {sorted(cands)}")
    return cands[0] if cands else None


def _order(got: Sequence[str], names: Sequence[str]) -> Optional[List[int]]:
    pos = {j: k for k, j in enumerate(got)}
    try:
        return [pos[j] for j in names]
    except KeyError:
        return None


def _field(a: np.ndarray, order: List[int], m: int) -> np.ndarray:
    return a[order] if len(a) == m else np.full(len(order), np.nan)


def read_streams(bag, names: Sequence[str], *, joints: Iterable[str] = ("/joint_states",),
                 reference: Optional[str] = "/reference", task_reference: Optional[str] = None,
                 frame: Optional[str] = None, vectors: Iterable[str] = (), diagnostics: bool = False,
                 missing: str = "raise") -> Streams:
    """Read the streams named (module docstring) in one pass.  ``bag``: a path or a
    :class:`~.bags.BagSource`; ``names``: the model's joint order; a topic is found by
    its exact name, else by a unique namespaced name ending in it.  ``task_reference``
    needs ``frame`` (the end effector's)."""
    if missing not in ("raise", "skip"):
        raise ValueError(f"missing must be 'raise' or 'skip', got {missing!r}")
    if task_reference is not None and not frame:
        raise ValueError("a task reference needs the frame whose poses to read")
    src = open_bag(bag)
    path = src.path
    names = list(names)
    n = len(names)
    asked = {"joint": list(joints), "vector": list(vectors), "reference": [reference] if reference else [],
             "task": [task_reference] if task_reference else [], "diagnostics": ["/diagnostics"] if diagnostics else []}
    in_bag = {t: _in_bag(src.topics, t, path) for ts in asked.values() for t in ts}   # asked name -> bag topic
    role = {in_bag[t]: (kind, t) for kind, ts in asked.items() for t in ts if in_bag[t] is not None}
    fast = FastReader()
    rows: Dict[str, list] = {t: [] for t in asked["joint"]}
    orders: Dict[tuple, Optional[List[int]]] = {}
    refs: Dict[int, tuple] = {}
    poses: Dict[int, np.ndarray] = {}
    out = Streams(str(path), names, vectors={t: [] for t in asked["vector"]})
    for topic, msgtype, _, raw in read_raw(src, list(role)):
        kind, asked_as = role[topic]
        if kind == "joint":
            stamp, got, q, v, e = fast.joint_state(raw, msgtype)
            got = tuple(got)
            key = (topic, got)
            if key not in orders:
                orders[key] = _order(got, names)
            order = orders[key]
            if order is None:
                if missing == "raise":
                    raise ValueError(f"{topic} in {path} has joints {list(got)}, expected {names}")
                out.damage["missing_joints"] = out.damage.get("missing_joints", 0) + 1
                lacking = set(out.damage.get("missing_joint_names", [])) | (set(names) - set(got))
                out.damage["missing_joint_names"] = sorted(lacking)
                continue
            m = len(got)
            rows[asked_as].append((stamp, *(_field(np.asarray(a, dtype=float), order, m) for a in (q, v, e))))
        elif kind == "reference":
            b = fast.batch(raw, msgtype)
            order = _order(b.names, names)
            if order is None:
                raise ValueError(f"{topic} in {path} has joints {list(b.names)}, expected {names}")
            nan = np.full((len(b.t_ns), n), np.nan)
            Q = b.Q[:, order]
            QD = b.QD[:, order] if b.QD is not None else nan
            QDD = b.QDD[:, order] if b.QDD is not None else nan
            for k, t in enumerate(b.t_ns):
                refs[int(t)] = (Q[k], QD[k], QDD[k])
        elif kind == "task":
            b = wire.decode_multidof(raw, fast._names)
            if frame not in b.names:
                raise ValueError(f"{topic} in {path} has frames {list(b.names)}, not {frame!r}")
            j = list(b.names).index(frame)
            for k, t in enumerate(b.t_ns):
                poses[int(t)] = b.T[k, j].copy()
        elif kind == "vector":
            stamp, got, q, _v, _e = fast.joint_state(raw, msgtype)
            out.vectors[asked_as].append((stamp, list(got), np.asarray(q, dtype=float).copy()))
        else:
            msg = TYPESTORE.deserialize_cdr(raw, msgtype)
            for st in msg.status:
                out.diagnostics[st.name] = {kv.key: kv.value for kv in st.values}
    if getattr(src, "recovered", 0):
        out.damage["truncated"] = src.recovered
    for topic, r in rows.items():
        if r:
            t, q, v, e = zip(*r)
            out.joint[topic] = JointStream(np.array(t, dtype=np.int64), np.array(q), np.array(v), np.array(e))
        else:
            empty = np.zeros((0, n))
            out.joint[topic] = JointStream(np.zeros(0, dtype=np.int64), empty, empty.copy(), empty.copy())
    if reference:
        ts = np.array(sorted(refs), dtype=np.int64)
        z = np.zeros((0, n))
        out.reference = ReferenceStream(ts, *(np.array([refs[t][k] for t in ts]).reshape(-1, n) if len(ts) else z
                                              for k in range(3)))
    if task_reference:
        ts = np.array(sorted(poses), dtype=np.int64)
        out.task_reference = (ts, np.array([poses[t] for t in ts]).reshape(-1, 7))
    return out

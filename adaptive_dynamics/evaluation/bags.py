"""rosbag2 (MCAP) writing and reading with ``rosbags`` (no ROS install needed).

Bags written here are standard rosbag2 directories (``metadata.yaml`` + one ``.mcap``
file), readable by ``ros2 bag info/play`` on a ROS 2 install and by independent
readers (``mcap`` + ``mcap-ros2-support``; tested).  Messages are stored as the CDR
bytes that arrived over DDS (no re-serialisation).
"""
from __future__ import annotations

import os
import pathlib
from typing import Iterable

import numpy as np
from rosbags.rosbag2 import Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_typestore

TYPESTORE = get_typestore(Stores.ROS2_KILTED)


def ros_type_name(msg_class) -> str:
    """'sensor_msgs/msg/JointState' from an rclpy message class."""
    mod = msg_class.__module__.split(".")  # sensor_msgs.msg._joint_state
    return f"{mod[0]}/msg/{msg_class.__name__}"


class BagWriter:
    """Append-only MCAP rosbag2 writer: ``add_topic`` then ``write(topic, t_ns, cdr_bytes)``.

    The directory must not exist yet (rosbag2 convention); ``close()`` writes
    ``metadata.yaml``.  Counts per topic are kept in :attr:`counts`.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        if self.path.exists():
            raise FileExistsError(f"bag {self.path} already exists; choose a new name")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._writer = Writer(self.path, version=9, storage_plugin=StoragePlugin.MCAP)
        self._writer.open()
        self._conns: dict = {}
        self.counts: dict[str, int] = {}
        self.closed = False

    def add_topic(self, topic: str, msgtype: str) -> None:
        if topic in self._conns:
            return
        self._conns[topic] = self._writer.add_connection(topic, msgtype, typestore=TYPESTORE)
        self.counts[topic] = 0

    def write(self, topic: str, t_ns: int, data: bytes) -> None:
        self._writer.write(self._conns[topic], int(t_ns), bytes(data))
        self.counts[topic] += 1

    def close(self) -> None:
        if not self.closed:
            self._writer.close()
            self.closed = True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def resolve_bag(path: str | os.PathLike) -> pathlib.Path:
    """The rosbag2 directory for ``path`` (the directory itself, its ``metadata.yaml``
    or one of its storage files); ``FileNotFoundError``/``ValueError`` with the reason."""
    p = pathlib.Path(path)
    if not p.exists():
        raise FileNotFoundError(f"bag {str(path)!r} does not exist")
    if p.is_file():
        p = p.parent
    if not (p / "metadata.yaml").is_file():
        what = "recording still open, or not a rosbag2 directory" if any(p.glob("*.mcap")) else \
            "not a rosbag2 directory"
        raise ValueError(f"bag {str(path)!r}: no metadata.yaml in {p} ({what})")
    return p


def read_raw(path: str | os.PathLike, topics: Iterable[str] | None = None):
    """Yield ``(topic, msgtype, log_time_ns, cdr_bytes)`` in the bag's order (log time),
    without deserialising."""
    with Reader(resolve_bag(path)) as reader:
        conns = [c for c in reader.connections if topics is None or c.topic in set(topics)]
        if not conns:  # rosbags reads *every* connection when given none
            return
        for conn, t, raw in reader.messages(connections=conns):
            yield conn.topic, conn.msgtype, t, bytes(raw)


def read_messages(path: str | os.PathLike, topics: Iterable[str] | None = None):
    """Yield ``(topic, log_time_ns, message)`` with messages deserialised by rosbags."""
    with Reader(pathlib.Path(path)) as reader:
        conns = [c for c in reader.connections if topics is None or c.topic in set(topics)]
        if not conns:  # rosbags reads *every* connection when given none
            return
        for conn, t, raw in reader.messages(connections=conns):
            yield conn.topic, t, TYPESTORE.deserialize_cdr(raw, conn.msgtype)


def bag_info(path: str | os.PathLike) -> dict:
    """{topic: (msgtype, count)} and duration from the bag's metadata."""
    with Reader(pathlib.Path(path)) as reader:
        return {
            "topics": {c.topic: (c.msgtype, c.msgcount) for c in reader.connections},
            "duration_s": reader.duration * 1e-9,
            "messages": reader.message_count,
        }


def joint_states_arrays(path, topic: str = "/joint_states", names=None):
    """Stamps [s] and position/velocity/effort arrays (rows = messages) from a bag,
    columns ordered by ``names`` (default: the first message's order)."""
    ts, q, v, e = [], [], [], []
    order = None
    for _, _, msg in read_messages(path, [topic]):
        if order is None:
            names = list(names or msg.name)
            order = [list(msg.name).index(n) for n in names]
        ts.append(msg.header.stamp.sec + 1e-9 * msg.header.stamp.nanosec)
        q.append(np.asarray(msg.position)[order])
        v.append(np.asarray(msg.velocity)[order] if len(msg.velocity) else np.full(len(order), np.nan))
        e.append(np.asarray(msg.effort)[order] if len(msg.effort) else np.full(len(order), np.nan))
    if order is None:
        raise ValueError(f"no {topic} messages in {path}")
    return np.array(ts), np.array(q), np.array(v), np.array(e), names

"""rosbag2 (MCAP) writing and reading with ``rosbags`` (no ROS install needed).

Bags written here are standard rosbag2 directories (``metadata.yaml`` + one ``.mcap``
file), readable by ``ros2 bag info/play`` on a ROS 2 install and by independent
readers (``mcap`` + ``mcap-ros2-support``; tested).  Messages are stored as the CDR
bytes that arrived over DDS (no re-serialisation).

Reading (:func:`open_bag`, used by ``replay``, ``replay --learner`` and ``identify``): a
rosbag2 directory through ``rosbags``; an MCAP file that ``rosbags`` cannot open -- a
recording cut off by a killed recorder has no summary, no end magic and often no
``metadata.yaml`` -- is streamed record by record with the ``mcap`` reader up to its last
complete message, with a :class:`TruncatedBagWarning` saying how much was recovered.
"""
from __future__ import annotations

import os
import pathlib
import warnings
from typing import Iterable, Optional

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


class TruncatedBagWarning(UserWarning):
    """A bag read only up to its last complete message (see :func:`open_bag`)."""


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


class BagSource:
    """A bag to read: ``topics`` ({topic: (msgtype, count)}), ``start_ns``/``end_ns``
    (log times), :meth:`messages`; ``recovered`` is None for an intact bag, else what the
    stream reader could read of a cut-off MCAP file."""

    def __init__(self, path: str | os.PathLike):
        self.path = pathlib.Path(path)
        self.recovered: Optional[str] = None
        self._mcap: Optional[pathlib.Path] = None
        try:
            self.dir = resolve_bag(path)
            with Reader(self.dir) as reader:
                self.topics = {}
                for c in reader.connections:
                    mt, cnt = self.topics.get(c.topic, (c.msgtype, 0))
                    self.topics[c.topic] = (mt, cnt + c.msgcount)
                self.start_ns, self.end_ns = int(reader.start_time), int(reader.end_time)
                if reader.message_count == 0:
                    self.start_ns = self.end_ns = 0
            return
        except FileNotFoundError:
            raise
        except Exception as exc:  # noqa: BLE001 -- rosbags' ReaderError, a missing metadata.yaml, ...
            self._mcap = self._mcap_file(exc)
            self.dir = self._mcap.parent
            self._why = f"{type(exc).__name__}: {exc}"
        self._scan()

    def _mcap_file(self, exc: Exception) -> pathlib.Path:
        p = self.path
        files = [p] if p.is_file() and p.suffix == ".mcap" else sorted((p if p.is_dir() else p.parent).glob("*.mcap"))
        if len(files) != 1:
            raise ValueError(f"bag {str(self.path)!r}: {exc}") from None
        return files[0]

    def _records(self, channels: dict, status: dict):
        """Message records of the MCAP stream, stopping quietly at the first incomplete
        record (its error in ``status["error"]``); fills ``channels`` (id -> (topic,
        msgtype)) as the stream declares them -- both the caller's own, so iterations
        may overlap."""
        from mcap import records as R
        from mcap.stream_reader import StreamReader
        schemas: dict = {}
        with open(self._mcap, "rb") as fh:
            try:
                for rec in StreamReader(fh).records:
                    if isinstance(rec, R.Schema):
                        schemas[rec.id] = rec.name
                    elif isinstance(rec, R.Channel):
                        channels[rec.id] = (rec.topic, schemas.get(rec.schema_id, ""))
                    elif isinstance(rec, R.Message):
                        yield rec
            except Exception as exc:  # noqa: BLE001 -- the cut: struct.error, EndOfFile, bad CRC, ...
                status["error"] = f"{type(exc).__name__}: {exc}"

    def _scan(self) -> None:
        counts: dict = {}
        channels: dict = {}
        status: dict = {"error": None}
        n, first, last = 0, None, None
        for rec in self._records(channels, status):
            counts[rec.channel_id] = counts.get(rec.channel_id, 0) + 1
            n += 1
            first = rec.log_time if first is None else min(first, rec.log_time)
            last = rec.log_time if last is None else max(last, rec.log_time)
        self._error = status["error"]
        self.topics = {}
        for cid, (topic, mt) in channels.items():
            t_mt, cnt = self.topics.get(topic, (mt, 0))
            self.topics[topic] = (t_mt, cnt + counts.get(cid, 0))
        self.start_ns, self.end_ns = int(first or 0), int(last or 0)
        size = self._mcap.stat().st_size
        self.recovered = (f"{self._mcap.name} could not be opened as a rosbag2 ({self._why}); read as a stream:"
                          f" {n} complete messages, {(self.end_ns - self.start_ns) * 1e-9:.3f} s"
                          f"{', up to a cut-off record (' + self._error + ')' if self._error else ''}"
                          f" in {size} bytes")
        warnings.warn(f"bag {str(self.path)!r}: {self.recovered}", TruncatedBagWarning, stacklevel=3)

    def messages(self, topics: Iterable[str] | None = None):
        """``(topic, msgtype, log_time_ns, cdr_bytes)`` in the bag's order (log time)."""
        want = None if topics is None else set(topics)
        if self._mcap is None:
            with Reader(self.dir) as reader:
                conns = [c for c in reader.connections if want is None or c.topic in want]
                if not conns:  # rosbags reads *every* connection when given none
                    return
                for conn, t, raw in reader.messages(connections=conns):
                    yield conn.topic, conn.msgtype, t, bytes(raw)
            return
        channels: dict = {}
        for rec in self._records(channels, {}):
            topic, mt = channels[rec.channel_id]
            if want is None or topic in want:
                yield topic, mt, int(rec.log_time), bytes(rec.data)


_OPENED: dict = {}


def open_bag(path: str | os.PathLike) -> BagSource:
    """A :class:`BagSource` for a rosbag2 directory, its ``metadata.yaml``, its ``.mcap``
    file, or a cut-off ``.mcap`` recording (streamed, with a :class:`TruncatedBagWarning`,
    once per file: sources are kept per path, size and modification time)."""
    if isinstance(path, BagSource):
        return path
    p = pathlib.Path(path)
    if not p.exists():
        raise FileNotFoundError(f"bag {str(path)!r} does not exist")
    # keyed by the storage files' sizes and times (a directory's own do not change as they grow)
    d = p if p.is_dir() else p.parent
    files = sorted(d.glob("*.mcap")) + sorted(d.glob("*.db3"))
    stats = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files) or ((p.name, p.stat().st_mtime_ns),)
    key = (str(p.resolve()), stats)
    src = _OPENED.get(key)
    if src is None:
        if len(_OPENED) > 16:
            _OPENED.clear()
        src = _OPENED[key] = BagSource(p)
    return src


def read_raw(path: str | os.PathLike, topics: Iterable[str] | None = None):
    """Yield ``(topic, msgtype, log_time_ns, cdr_bytes)`` in the bag's order (log time),
    without deserialising (any bag :func:`open_bag` reads)."""
    yield from open_bag(path).messages(topics)


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


def diagnostic_value(path, key: str, node: str | None = None) -> list:
    """The values of ``key`` in a recording's ``/diagnostics`` (of the status named ``node``,
    or of every status), in order; ``[]`` when the bag has none."""
    out = []
    try:
        for _, _, m in read_messages(resolve_bag(path), ["/diagnostics"]):
            for status in m.status:
                if node is not None and status.name != node:
                    continue
                out.extend(kv.value for kv in status.values if kv.key == key)
    except KeyError:   # no /diagnostics in the bag
        return []
    return out


def watchdog_trips(path) -> int:
    """How often the controllers' loop watchdog tripped in a recording (the largest
    ``watchdog_trips`` its ``/diagnostics`` reported; 0 when none)."""
    vals = [int(float(v)) for v in diagnostic_value(path, "watchdog_trips")]
    return max(vals, default=0)


def controller_saturation(path) -> list:
    """Per joint, the control cycles whose command the controller clipped at the effort
    limit (its last ``saturated_cycles`` in ``/diagnostics``, model joint order); ``[]``
    when the recording has none."""
    import ast
    vals = diagnostic_value(path, "saturated_cycles")
    return [int(x) for x in ast.literal_eval(vals[-1])] if vals else []

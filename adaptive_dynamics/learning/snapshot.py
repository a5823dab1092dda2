"""Versioned learner snapshots: one learner as bytes, checked before it is trusted (no ROS).

The prediction / model-update split (PGPOL, Habich et al. 2019, sec. III, Fig. 2) moves
the learned model from the process that trains it to the process that predicts with
it.  A snapshot is that model as bytes:

========  ===========================================================================
bytes     content
========  ===========================================================================
0-7       :data:`MAGIC` (``\\x89ADSNAP\\n``: a text-mode transfer or a foreign buffer
          breaks it)
8-11      header length ``h``, unsigned 32 bit little endian (at most
          :data:`MAX_HEADER_BYTES`)
12-12+h   header: UTF-8 JSON object ``{"format", "kind", "version", "epoch",
          "input_dim", "output_dim", "payload_bytes", "sha256", "source", "created"}``
rest      payload: ``learner.to_bytes()``, the learner's own ``.npz`` (numeric arrays
          and a JSON config; :meth:`Learner.from_bytes` never unpickles)
========  ===========================================================================

``format`` is :data:`FORMAT` (the layout's version), ``version`` the model's version
(the trainer numbers its snapshots 1, 2, ...), ``epoch`` the trainer's run (a random
id ``model_update`` draws when it starts; versions are ordered only within one epoch,
see :func:`newer`; a header without it, as written before it existed, reads as
``""``), ``sha256`` the hex digest of the payload, ``source`` who made it (free text,
e.g. ``host:/node``), ``created`` the wall time of the encoding (Unix seconds).

:func:`decode_snapshot` refuses with a :class:`SnapshotError` (a ``ValueError``) whose
``reason`` is one short word and whose message says what is wrong: ``size`` (over
``max_bytes``), ``magic``, ``truncated``, ``header`` (malformed JSON or fields),
``format`` (an unknown layout version), ``trailing`` (bytes after the payload),
``checksum``, ``kind`` (not a registered learner), ``payload`` (the ``.npz`` does not
load) and ``mismatch`` (the payload's learner is not the kind or size the header
says).  Nothing half-decoded is ever returned.  The checks run cheapest first: the
header is parsed (size, magic, lengths, fields, kind) and handed to ``accept`` -- the
receiver's own checks (kind wanted, sizes, version order) -- before the checksum is
computed or the payload loaded, so a snapshot the receiver does not want costs a JSON
parse.

Files: :func:`write_snapshot_file` (durable and atomic: :func:`.files.atomic_write`) and
:func:`read_snapshot_file` (a snapshot file, or a plain learner ``.npz`` such as the
``residual_learner`` saves, taken as version 0).
"""
from __future__ import annotations

import hashlib
import json
import os
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

from .base import LEARNERS, Learner
from ..files import atomic_write

__all__ = ["MAGIC", "FORMAT", "MAX_HEADER_BYTES", "Snapshot", "SnapshotError", "encode_snapshot",
           "pack_snapshot", "read_header", "newer", "decode_snapshot", "write_snapshot_file", "read_snapshot_file"]

MAGIC = b"\x89ADSNAP\n"
FORMAT = 1
MAX_HEADER_BYTES = 65536
_PREFIX = len(MAGIC) + 4
_LEN = struct.Struct("<I")
_FIELDS = {"format": int, "kind": str, "version": int, "input_dim": int, "output_dim": int,
           "payload_bytes": int, "sha256": str, "source": str, "created": (int, float)}   # + optional "epoch"


class SnapshotError(ValueError):
    """A snapshot was refused; ``reason`` names the check that failed (see the module)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class Snapshot:
    """A decoded, checked snapshot: the learner and what its header said."""

    kind: str
    version: int
    epoch: str               # the trainer's run ("" in a header written before epochs)
    input_dim: int
    output_dim: int
    source: str
    created: float           # Unix seconds (wall clock of the encoder's host)
    learner: Learner
    data: bytes = field(default=b"", repr=False)   # the snapshot's bytes (bytes, or a read-only view of them)

    @property
    def nbytes(self) -> int:
        return len(self.data)


def newer(header: Dict[str, Any], version: int, epoch: str, created: float) -> Tuple[bool, str]:
    """Whether a snapshot with ``header`` replaces a model of ``version``/``epoch``/
    ``created``: in the same epoch when its version is greater; of another epoch (the
    trainer restarted, or another trainer) when it was created later.  Returns
    ``(newer, why not)``."""
    v, e = header["version"], header.get("epoch", "")
    if e == epoch:
        return v > version, f"snapshot v{v} is not newer than the model in use (v{version})"
    return float(header["created"]) > created, (
        f"snapshot v{v} of epoch {e or '(none)'!r} was created at {float(header['created']):.3f}, not after the"
        f" model in use (v{version} of epoch {epoch or '(none)'!r}, created {created:.3f})")


def pack_snapshot(payload: bytes, *, kind: str, version: int, input_dim: int, output_dim: int,
                  source: str = "", created: Optional[float] = None, epoch: str = "") -> bytes:
    """A snapshot around a learner's ``.npz`` bytes (:func:`encode_snapshot` without the
    ``to_bytes`` call, for a caller that serialised the learner under its own lock)."""
    version = int(version)
    if version < 0:
        raise ValueError(f"snapshot version must be >= 0, got {version}")
    header = {"format": FORMAT, "kind": str(kind), "version": version, "epoch": str(epoch), "input_dim": int(input_dim),
              "output_dim": int(output_dim), "payload_bytes": len(payload),
              "sha256": hashlib.sha256(payload).hexdigest(), "source": str(source),
              "created": float(time.time() if created is None else created)}
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    if len(raw) > MAX_HEADER_BYTES:
        raise ValueError(f"snapshot header of {len(raw)} bytes (source too long?); at most {MAX_HEADER_BYTES}")
    return b"".join((MAGIC, _LEN.pack(len(raw)), raw, payload))


def encode_snapshot(learner: Learner, version: int, *, source: str = "", created: Optional[float] = None,
                    epoch: str = "") -> bytes:
    """The bytes of a snapshot of ``learner`` numbered ``version`` in ``epoch`` (see the
    module)."""
    return pack_snapshot(learner.to_bytes(), kind=learner.kind, version=version, input_dim=learner.input_dim,
                         output_dim=learner.output_dim, source=source, created=created, epoch=epoch)


def _view(data) -> memoryview:
    try:
        view = memoryview(data)
    except TypeError:
        raise SnapshotError("header", f"a snapshot is bytes, got {type(data).__name__}") from None
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def read_header(data, *, max_bytes: Optional[int], checksum: bool = True) -> Tuple[Dict[str, Any], memoryview]:
    """Check everything but the payload's content (size, magic, header, length, kind
    and, unless ``checksum`` is False, the checksum) and return ``(header, payload
    view)``.  Cheap: a receiver can refuse a snapshot on its header before loading the
    learner (without the checksum: before reading the payload at all)."""
    header, payload = _parse(_view(data), max_bytes)
    if checksum:
        _verify(header, payload)
    return header, payload


def _verify(header: Dict[str, Any], payload: memoryview) -> None:
    digest = hashlib.sha256(payload).hexdigest()
    if digest != header["sha256"]:
        raise SnapshotError("checksum", f"snapshot v{header['version']}: payload checksum mismatch (sha256"
                                        f" {digest[:12]}..., header says {header['sha256'][:12]}...)")


def _parse(view: memoryview, max_bytes: Optional[int]) -> Tuple[Dict[str, Any], memoryview]:
    size = len(view)
    if max_bytes is not None and size > max_bytes:
        raise SnapshotError("size", f"snapshot of {size} bytes is over the {int(max_bytes)} byte limit")
    head = bytes(view[:len(MAGIC)])
    if head != MAGIC:
        if size < len(MAGIC) and MAGIC.startswith(head):
            raise SnapshotError("truncated", f"truncated snapshot: {size} bytes, not even the magic")
        raise SnapshotError("magic", f"not a learner snapshot (bad magic {head[:8]!r})")
    if size < _PREFIX:
        raise SnapshotError("truncated", f"truncated snapshot: {size} bytes, no header length")
    (hlen,) = _LEN.unpack(view[len(MAGIC):_PREFIX])
    if hlen > MAX_HEADER_BYTES:
        raise SnapshotError("header", f"snapshot header length {hlen} is over {MAX_HEADER_BYTES} bytes")
    if size < _PREFIX + hlen:
        raise SnapshotError("truncated", f"truncated snapshot: header of {hlen} bytes, {size - _PREFIX} present")
    try:
        header = json.loads(bytes(view[_PREFIX:_PREFIX + hlen]).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotError("header", f"snapshot header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise SnapshotError("header", "snapshot header is not a JSON object")
    if header.get("format") != FORMAT or isinstance(header.get("format"), bool):
        raise SnapshotError("format", f"unsupported snapshot format {header.get('format')!r}"
                                      f" (this code reads {FORMAT})")
    for key, typ in _FIELDS.items():
        v = header.get(key)
        if v is None or isinstance(v, bool) or not isinstance(v, typ):
            raise SnapshotError("header", f"snapshot header field {key!r} missing or of the wrong type ({v!r})")
    header.setdefault("epoch", "")
    if not isinstance(header["epoch"], str):
        raise SnapshotError("header", f"snapshot header field 'epoch' is not a string ({header['epoch']!r})")
    for key in ("version", "input_dim", "output_dim", "payload_bytes"):
        if header[key] < 0:
            raise SnapshotError("header", f"snapshot header field {key!r} is negative ({header[key]})")
    payload = view[_PREFIX + hlen:]
    want = header["payload_bytes"]
    if len(payload) < want:
        raise SnapshotError("truncated", f"truncated snapshot v{header['version']}: payload {len(payload)} of"
                                         f" {want} bytes")
    if len(payload) > want:
        raise SnapshotError("trailing", f"snapshot v{header['version']}: {len(payload) - want} bytes after the"
                                        f" {want} byte payload")
    if header["kind"] not in LEARNERS:
        raise SnapshotError("kind", f"snapshot v{header['version']}: unknown learner kind {header['kind']!r};"
                                    f" this process knows {sorted(LEARNERS)}")
    return header, payload


def decode_snapshot(data, *, max_bytes: Optional[int],
                    accept: Optional[Callable[[Dict[str, Any]], None]] = None) -> Snapshot:
    """Check and load a snapshot (``max_bytes=None``: no size limit).  ``accept(header)``
    (optional) runs once the header is parsed, before the checksum and the payload: it
    refuses by raising :class:`SnapshotError`.  Raises :class:`SnapshotError` with the
    reason (see the module); never unpickles.  ``data`` that is ``bytes`` (or a
    read-only view) is kept as the snapshot's :attr:`Snapshot.data` without a copy."""
    view = _view(data)
    header, payload = _parse(view, max_bytes)
    if accept is not None:
        accept(header)
    _verify(header, payload)
    v = header["version"]
    try:
        learner = Learner.from_bytes(payload)
    except Exception as exc:  # a payload that passed the checksum but does not load
        raise SnapshotError("payload", f"snapshot v{v}: the {header['kind']!r} learner does not load: {exc}") from None
    got = (learner.kind, learner.input_dim, learner.output_dim)
    said = (header["kind"], header["input_dim"], header["output_dim"])
    if got != said:
        raise SnapshotError("mismatch", f"snapshot v{v}: header says {said[0]!r} {said[1]} -> {said[2]}, the payload"
                                        f" holds {got[0]!r} {got[1]} -> {got[2]}")
    if not isinstance(data, bytes):
        data = view if view.readonly else bytes(view)
    return Snapshot(kind=header["kind"], version=v, epoch=header["epoch"], input_dim=header["input_dim"],
                    output_dim=header["output_dim"], source=header["source"], created=float(header["created"]),
                    learner=learner, data=data)


def write_snapshot_file(path, data) -> str:
    """Write snapshot bytes to ``path`` durably and atomically (a crash mid-write leaves
    the previous file, see :func:`.files.atomic_write`); returns the path."""
    return atomic_write(path, _view(data), suffix=".snap")


def read_snapshot_file(path, *, max_bytes: Optional[int] = None,
                       accept: Optional[Callable[[Dict[str, Any]], None]] = None) -> Snapshot:
    """A snapshot file (checked as :func:`decode_snapshot` does), or a plain learner
    ``.npz`` (:meth:`Learner.save`), which becomes a version-0 snapshot."""
    path = os.fspath(path)
    size = os.path.getsize(path)
    if max_bytes is not None and size > max_bytes:
        raise SnapshotError("size", f"{path}: snapshot of {size} bytes is over the {int(max_bytes)} byte limit")
    with open(path, "rb") as fh:
        data = fh.read()
    if data.startswith(b"PK"):
        try:
            learner = Learner.from_bytes(data)
        except ValueError as exc:
            raise SnapshotError("payload", f"{path}: {exc}") from None
        created = os.path.getmtime(path)
        snap_bytes = encode_snapshot(learner, 0, source=path, created=created)
        snap = Snapshot(kind=learner.kind, version=0, epoch="", input_dim=learner.input_dim,
                        output_dim=learner.output_dim, source=path, created=created, learner=learner,
                        data=snap_bytes)
        if accept is not None:
            accept(read_header(snap_bytes, max_bytes=None, checksum=False)[0])
        return snap
    try:
        return decode_snapshot(data, max_bytes=max_bytes, accept=accept)
    except SnapshotError as exc:
        raise SnapshotError(exc.reason, f"{path}: {exc}") from None

"""Vectorised CDR for ``trajectory_msgs/JointTrajectory`` reference batches (no ROS import).

Why: a reference batch of 100 points costs rclpy ~2 ms to build and ~4-10 ms to
deserialize into Python objects (one ``JointTrajectoryPoint`` with four
``array.array`` fields per point), and the consumer then walked the points in Python:
a 1 kHz controller's hot thread stalled for 10+ ms on every batch.  Here a batch is
encoded from / decoded into numpy matrices in a few tens of microseconds: nodes publish
the bytes (``Publisher.publish(bytes)`` publishes serialized data) and subscribe with
``raw=True``.  The wire format is unchanged -- any ROS 2 node reads these messages and
they read any publisher's -- and the test suite checks byte equality with
``rclpy.serialization`` both ways.

Format: little-endian plain CDR (XCDR1) with the 4-byte encapsulation header, as Fast DDS
writes for ROS 2; alignment is relative to the payload (after the header); a sequence's
length is a 4-aligned uint32 and its doubles are 8-aligned unless the sequence is empty.
A point's layout therefore depends on its start offset modulo 8 only, so the points of a
batch whose sequences all have the same lengths repeat with a period of one or two
points: the decoder parses those one or two points, checks every length field of the
batch at the predicted offsets and reads all points through strided views.  Anything
else (big-endian, points with differing field lengths, a truncated message) raises
:class:`WireError`; callers fall back to rclpy's deserializer.
"""
from __future__ import annotations

import struct
from typing import Optional, Sequence

import numpy as np

__all__ = ["WireError", "TrajectoryBatch", "decode_trajectory", "encode_trajectory"]

_U32 = struct.Struct("<I")
_I32U32 = struct.Struct("<iI")
ENCAPSULATION_LE = b"\x00\x01\x00\x00"
NS = 1_000_000_000


class WireError(ValueError):
    """The bytes are not a message this fast path handles (use the generic deserializer)."""


class TrajectoryBatch:
    """A decoded ``JointTrajectory``: ``stamp_ns`` (header), ``names`` (tuple),
    ``t_ns`` (int64, header stamp + time_from_start per point), ``Q`` (k x m) and
    ``QD``/``QDD`` (k x m, or ``None`` when every point leaves the field empty).
    ``efforts`` is True when the points carry efforts (ignored by the references)."""

    __slots__ = ("stamp_ns", "names", "t_ns", "Q", "QD", "QDD", "efforts")

    def __init__(self, stamp_ns, names, t_ns, Q, QD, QDD, efforts=False):
        self.stamp_ns, self.names, self.t_ns = stamp_ns, names, t_ns
        self.Q, self.QD, self.QDD, self.efforts = Q, QD, QDD, efforts


def _align(off: int, a: int) -> int:
    return (off + a - 1) & ~(a - 1)


# ----------------------------------------------------------------------------- decoding

class NameCache:
    """Decoded name blocks (a ``string[]`` as it appears on the wire): a stream repeats
    the same block in every message, so it is compared to the previous one and, for
    streams that alternate between a few lists, looked up by its bytes; the strings are
    decoded once per distinct block.  One cache per consumer thread."""

    def __init__(self, max_entries: int = 32):
        self.last: Optional[tuple] = None      # (block bytes, names)
        self.blocks: dict = {}
        self.max_entries = max_entries


def header_names(b, size: int, cache: NameCache):
    """``std_msgs/Header`` then a ``string[]`` at the start of a CDR payload ``b``
    (after the encapsulation): ``(stamp_ns, names, offset after the names)``."""
    if size < 16:
        raise WireError("truncated header")
    sec, nsec = _I32U32.unpack_from(b, 0)
    off = _align(12 + _U32.unpack_from(b, 8)[0], 4)        # after frame_id
    if off + 4 > size:
        raise WireError("truncated header")
    start = off
    last = cache.last
    if last is not None and b[start:start + len(last[0])] == last[0]:
        return sec * NS + nsec, last[1], start + len(last[0])
    count = _U32.unpack_from(b, off)[0]
    off += 4
    for _ in range(count):                  # offsets only; strings decoded once per block
        off = _align(off, 4)
        if off + 4 > size:
            raise WireError("truncated names")
        n = _U32.unpack_from(b, off)[0]
        if n == 0 or off + 4 + n > size:
            raise WireError("bad string length")
        off += 4 + n
    block = bytes(b[start:off])
    names = cache.blocks.get(block)
    if names is None:
        out, k = [], 4   # offsets in `block` keep the payload's alignment (start is 4-aligned)
        for _ in range(count):
            k = _align(k, 4)
            n = _U32.unpack_from(block, k)[0]
            out.append(block[k + 4:k + 3 + n].decode())
            k += 4 + n
        names = tuple(out)
        if len(cache.blocks) >= cache.max_entries:
            cache.blocks.clear()
        cache.blocks[block] = names
    cache.last = (block, names)
    return sec * NS + nsec, names, off


def _point_layout(b, off: int, size: int):
    """Offsets of one point starting at ``off``: ([(len_off, data_off, length) x 4],
    time_off, end)."""
    seqs = []
    for _ in range(4):
        off = _align(off, 4)
        if off + 4 > size:
            raise WireError("truncated point")
        m = _U32.unpack_from(b, off)[0]
        len_off = off
        off += 4
        if m:
            off = _align(off, 8)
        seqs.append((len_off, off, m))
        off += 8 * m
    off = _align(off, 4)
    time_off = off
    off += 8
    if off > size:
        raise WireError("truncated point")
    return seqs, time_off, off


def decode_trajectory(raw, cache: Optional[NameCache] = None) -> TrajectoryBatch:
    """Decode a serialized ``JointTrajectory`` (see the module docstring).  Raises
    :class:`WireError` (a ``ValueError``) for anything it does not decode, corrupt bytes
    included."""
    try:
        return _decode_trajectory(raw, cache or NameCache())
    except (struct.error, UnicodeDecodeError, IndexError, TypeError) as exc:
        raise WireError(f"undecodable JointTrajectory ({type(exc).__name__}: {exc})") from None


def _decode_trajectory(raw, cache: NameCache) -> TrajectoryBatch:
    if len(raw) < 8 or bytes(raw[:2]) != b"\x00\x01":
        raise WireError("not little-endian CDR")
    b = memoryview(raw)[4:]
    size = len(b)
    stamp, names, off = header_names(b, size, cache)
    off = _align(off, 4)
    if off + 4 > size:
        raise WireError("truncated")
    k = _U32.unpack_from(b, off)[0]
    off += 4
    if k == 0:
        raise WireError("no points")
    # Parse points one by one until a start offset repeats modulo 8: from point j on the
    # layout is periodic with P = 1 or 2 points (starts are 4-aligned: two phases only).
    layouts, seen, pos, lengths = [], {}, off, None
    j = P = None
    for i in range(min(k, 3)):
        if pos % 8 in seen:
            j = seen[pos % 8]
            P = i - j
            break
        seen[pos % 8] = i
        seqs, t_off, end = _point_layout(b, pos, size)
        ln = [q[2] for q in seqs]
        if lengths is None:
            lengths = ln
            if ln[0] != len(names) or any(m_ not in (0, ln[0]) for m_ in ln):
                raise WireError("point fields do not match joint_names")  # the generic path says how
        elif ln != lengths:
            raise WireError("field lengths differ")
        layouts.append((pos, seqs, t_off, end))
        pos = end
    if j is None:            # every point parsed (k <= 2): a degenerate period
        j, P = 0, len(layouts)
        period = 0
    else:
        period = pos - layouts[j][0]
        if period % 8:
            raise WireError("no periodic layout")  # cannot happen for CDR; be safe
    last = k - 1
    t_last = last if last < j else j + (last - j) % P
    end = layouts[t_last][3] + (0 if last < j else ((last - j) // P) * period)
    if end > size:
        raise WireError("truncated")
    buf = raw if isinstance(raw, (bytes, bytearray)) else bytes(raw)
    base = 4  # offsets above are relative to the payload; the buffer starts at the header
    m = lengths[0]
    out = [np.empty((k, m)), np.empty((k, m)) if lengths[1] else None,
           np.empty((k, m)) if lengths[2] else None]
    t = np.empty(k, dtype=np.int64)
    # classes of points sharing a template: each prefix point alone, then j + r + P i
    classes = [(i, 1, 0) for i in range(j)] + [(j + r, len(range(j + r, k, P)), period) for r in range(P)]
    for tpl, cnt, stride in classes:
        if cnt <= 0:
            continue
        _, seqs, t_off, _ = layouts[tpl]
        idx = slice(tpl, tpl + 1) if stride == 0 and tpl < j else slice(tpl, None, P)
        stride = stride or 8  # a single point: any stride
        for f, (len_off, data_off, ln) in enumerate(seqs):
            lens = np.ndarray((cnt,), "<u4", buf, base + len_off, (stride,))
            if not (lens == ln).all():
                raise WireError("field lengths differ")
            if f < 3 and ln:
                out[f][idx] = np.ndarray((cnt, m), "<f8", buf, base + data_off, (stride, 8))
        sec = np.ndarray((cnt,), "<i4", buf, base + t_off, (stride,))
        nsec = np.ndarray((cnt,), "<u4", buf, base + t_off + 4, (stride,))
        t[idx] = sec.astype(np.int64) * NS + nsec
    t += stamp
    return TrajectoryBatch(stamp, names, t, out[0], out[1], out[2], efforts=bool(lengths[3]))


# ----------------------------------------------------------------------------- encoding

class _Writer:
    def __init__(self):
        self.buf = bytearray()

    def pad(self, a: int) -> None:
        self.buf += b"\x00" * ((-len(self.buf)) % a)

    def u32(self, v: int) -> None:
        self.pad(4)
        self.buf += _U32.pack(v)

    def string(self, s: str) -> None:
        data = s.encode() + b"\x00"
        self.u32(len(data))
        self.buf += data


def _head(stamp_ns: int, names: Sequence[str], frame_id: str) -> bytearray:
    w = _Writer()
    sec, nsec = divmod(int(stamp_ns), NS)
    w.buf += _I32U32.pack(sec, nsec)
    w.string(frame_id)
    w.u32(len(names))
    for n in names:
        w.string(n)
    return w.buf


_TEMPLATES: dict = {}


def _template(names: tuple, frame_id: str, k: int, m: int, present: tuple):
    """The message with zero data and times for this shape, and where the data go."""
    key = (names, frame_id, k, present)
    hit = _TEMPLATES.get(key)
    if hit is not None:
        return hit
    payload = _head(0, names, frame_id)
    w = _Writer()
    w.buf = payload
    w.u32(k)
    # write points (zeros for the data) until a start offset repeats modulo 8; from
    # point j on the layout repeats every P points (see decode_trajectory)
    layouts, seen = [], {}
    j = P = None
    for i in range(min(k, 3)):
        p_start = len(w.buf)
        if p_start % 8 in seen:
            j = seen[p_start % 8]
            P = i - j
            break
        seen[p_start % 8] = i
        seqs = []
        for has in list(present) + [False]:  # positions, velocities, accelerations, effort
            w.u32(m if has else 0)
            if has:
                w.pad(8)
                seqs.append(len(w.buf))
                w.buf += b"\x00" * (8 * m)
            else:
                seqs.append(None)
        w.pad(4)
        t_off = len(w.buf)
        w.buf += b"\x00" * 8
        layouts.append((p_start, seqs, t_off, len(w.buf)))
    if j is None:                          # every point written (k <= 2)
        body = bytearray(ENCAPSULATION_LE) + w.buf
        j, P, period = 0, len(layouts), 0
    else:
        period = layouts[j + P - 1][3] - layouts[j][0]
        block = bytes(w.buf[layouts[j][0]:layouts[j + P - 1][3]])
        n_per = k - j
        reps = -(-n_per // P)
        body = bytearray(ENCAPSULATION_LE) + w.buf[:layouts[j][0]] + block * reps
        last = k - 1
        t_last = j + (last - j) % P
        end = layouts[t_last][3] + ((last - j) // P) * period
        del body[4 + end:]
    classes = [(i, 1, 0) for i in range(j)] + [(j + r, len(range(j + r, k, P)), period) for r in range(P)]
    plan = []
    for tpl, cnt, stride in classes:
        if cnt <= 0:
            continue
        _, seqs, t_off, _ = layouts[tpl]
        idx = slice(tpl, tpl + 1) if tpl < j or stride == 0 else slice(tpl, None, P)
        plan.append((idx, cnt, stride or 8, seqs, t_off))
    if len(_TEMPLATES) > 64:
        _TEMPLATES.clear()
    hit = _TEMPLATES[key] = (bytes(body), plan)
    return hit


def encode_trajectory(stamp0_ns: int, dt_ns: int, names: Sequence[str], Q, QD=None, QDD=None,
                      frame_id: str = "") -> bytes:
    """Serialized ``JointTrajectory`` whose point ``i`` applies at
    ``stamp0 + i * dt`` (``time_from_start = i * dt``), rows of ``Q``/``QD``/``QDD``
    the points (what :func:`~adaptive_dynamics.ros.conversions.reference_batch_msg`
    builds, byte for byte)."""
    Q = np.ascontiguousarray(Q, dtype="<f8")
    k, m = Q.shape
    if m != len(names) or k == 0:
        raise ValueError(f"encode_trajectory: {k} x {m} positions for {len(names)} joints")
    fields = [Q]
    for X in (QD, QDD):
        if X is None:
            fields.append(None)
        else:
            X = np.ascontiguousarray(X, dtype="<f8")
            if X.shape != Q.shape:
                raise ValueError(f"encode_trajectory: a field has shape {X.shape}, positions {Q.shape}")
            fields.append(X)
    present = tuple(X is not None for X in fields)
    template, plan = _template(tuple(names), frame_id, k, m, present)
    body = bytearray(template)
    sec0, nsec0 = divmod(int(stamp0_ns), NS)
    _I32U32.pack_into(body, 4, sec0, nsec0)
    t = np.arange(k, dtype=np.int64) * int(dt_ns)
    sec, nsec = np.divmod(t, NS)
    base = 4
    for idx, cnt, stride, seqs, t_off in plan:
        for X, data_off in zip(fields, seqs):
            if X is not None:
                np.ndarray((cnt, m), "<f8", body, base + data_off, (stride, 8))[:] = X[idx]
        np.ndarray((cnt,), "<i4", body, base + t_off, (stride,))[:] = sec[idx]
        np.ndarray((cnt,), "<u4", body, base + t_off + 4, (stride,))[:] = nsec[idx]
    return bytes(body)

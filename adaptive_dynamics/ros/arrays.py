"""Stamped matrices and named vectors: numbers a consumer must align in time with the
state they belong to (regressors, parameter estimates, feed-forward torques).

Serves the topic contract (docs/interfaces.md, "Topics") (matrices and vectors "carry a stamp", in standard
message types only; the README interface table repeats this):

Stamped vectors (named elements): ``sensor_msgs/JointState``
    ``header.stamp`` = the instant the vector belongs to; ``name`` = element
    names; the numbers go in ``effort`` for torques (feed-forward residuals,
    parametric torque) and in ``position`` for other quantities (e.g. the
    inertial parameter vector, with element names such as ``link3.m``); the
    unused fields are empty.  (:func:`stamped_vector_msg`,
    :func:`vector_from_msg`.)

Stamped matrices: ``std_msgs/Float64MultiArray``
    ``layout.data_offset = 2``; ``data[0]`` = stamp seconds and ``data[1]`` =
    stamp nanoseconds (both integers stored as float64, exact), then the matrix
    in row-major order; ``layout.dim = [MultiArrayDimension(label="rows:<name>",
    size=r, stride=r*c), MultiArrayDimension(label="cols:<name>", size=c,
    stride=c)]``.  ``data_offset`` is the standard field for "padding elements at
    front of data", so a generic consumer honouring the layout skips the stamp.
    (:func:`stamped_matrix_msg`, :func:`matrix_from_msg`, :func:`matrix_labels`.)

Entry points: publishers build :func:`stamped_matrix_msg` / :func:`stamped_vector_msg`;
subscribers read ``(stamp_ns, values)`` with :func:`matrix_from_msg` /
:func:`vector_from_msg`.
"""

from __future__ import annotations

import array
import bisect
from typing import Optional, Sequence, Tuple

import numpy as np
from sensor_msgs.msg import JointState
from std_msgs.msg import Float64MultiArray, MultiArrayDimension

from .fields import JointMismatchError, NonFiniteError, cached_permutation, check_finite, f64_view
from .joint_states import joint_state_msg
from .stamps import NS_PER_S, StampLike, to_ns

__all__ = [
    "MATRIX_STAMP_OFFSET",
    "VECTOR_FIELDS",
    "stamped_matrix_msg",
    "matrix_from_msg",
    "matrix_labels",
    "stamped_vector_msg",
    "vector_from_msg",
    "VectorBuffer",
]

MATRIX_STAMP_OFFSET = 2
VECTOR_FIELDS = ("position", "velocity", "effort")


def stamped_matrix_msg(stamp_ns: StampLike, M, row_label: str = "", col_label: str = "") -> Float64MultiArray:
    """Stamped matrix as ``Float64MultiArray`` (see module docstring)."""
    A = np.asarray(M, dtype=np.float64)
    if A.ndim == 1:
        A = A.reshape(1, -1)
    if A.ndim != 2:
        raise ValueError(f"stamped_matrix_msg: expected a 2-D matrix, got shape {A.shape}")
    r, c = A.shape
    sec, nsec = divmod(to_ns(stamp_ns), NS_PER_S)
    buf = np.empty(MATRIX_STAMP_OFFSET + r * c)
    buf[0] = float(sec)
    buf[1] = float(nsec)
    buf[MATRIX_STAMP_OFFSET:] = A.reshape(-1)  # row-major (C order)
    msg = Float64MultiArray()
    msg.layout.dim = [
        MultiArrayDimension(label=f"rows:{row_label}", size=r, stride=r * c),
        MultiArrayDimension(label=f"cols:{col_label}", size=c, stride=c),
    ]
    msg.layout.data_offset = MATRIX_STAMP_OFFSET
    msg.data = array.array("d", buf.tobytes())
    return msg


def _matrix_layout(msg: Float64MultiArray, where: str):
    dims = msg.layout.dim
    if len(dims) != 2:
        raise ValueError(f"{where}: stamped matrix needs 2 layout dims, got {len(dims)}")
    d0, d1 = dims
    if not d0.label.startswith("rows:") or not d1.label.startswith("cols:"):
        raise ValueError(
            f"{where}: layout labels must be 'rows:<name>', 'cols:<name>', got "
            f"{d0.label!r}, {d1.label!r}"
        )
    r, c = int(d0.size), int(d1.size)
    if d1.stride != c or d0.stride != r * c:
        raise ValueError(
            f"{where}: inconsistent strides ({d0.stride}, {d1.stride}) for a {r}x{c} matrix"
        )
    if msg.layout.data_offset != MATRIX_STAMP_OFFSET:
        raise ValueError(
            f"{where}: stamped matrix needs data_offset={MATRIX_STAMP_OFFSET}, "
            f"got {msg.layout.data_offset}"
        )
    return r, c, d0.label[5:], d1.label[5:]


def matrix_labels(msg: Float64MultiArray) -> Tuple[str, str]:
    """``(row_label, col_label)`` of a stamped matrix message."""
    _, _, rl, cl = _matrix_layout(msg, "stamped matrix")
    return rl, cl


def matrix_from_msg(msg: Float64MultiArray, *, expected_shape: Optional[Tuple[int, int]] = None,
                    where: str = "stamped matrix") -> Tuple[int, np.ndarray]:
    """``(stamp_ns, M)`` from a stamped matrix message, validated (sizes, finite)."""
    r, c, _, _ = _matrix_layout(msg, where)
    data = f64_view(msg.data)
    if len(data) != MATRIX_STAMP_OFFSET + r * c:
        raise ValueError(
            f"{where}: {len(data)} data elements, expected {MATRIX_STAMP_OFFSET} + {r}*{c}"
        )
    if expected_shape is not None and (r, c) != tuple(expected_shape):
        raise ValueError(f"{where}: shape {(r, c)}, expected {tuple(expected_shape)}")
    sec, nsec = float(data[0]), float(data[1])
    if not (np.isfinite(sec) and sec == int(sec) and np.isfinite(nsec) and nsec == int(nsec)
            and 0 <= nsec < NS_PER_S):
        raise ValueError(f"{where}: invalid stamp (sec={sec!r}, nanosec={nsec!r})")
    M = np.array(data[MATRIX_STAMP_OFFSET:], dtype=np.float64).reshape(r, c)
    if not np.isfinite(M).all():
        bad = np.argwhere(~np.isfinite(M))[:5].tolist()
        raise NonFiniteError(f"{where}: non-finite entries at (row, col) {bad}")
    return int(sec) * NS_PER_S + int(nsec), M


def stamped_vector_msg(stamp_ns: StampLike, names: Sequence[str], values,
                       field: str = "effort") -> JointState:
    """Stamped named vector as ``sensor_msgs/JointState`` (numbers in ``field``)."""
    if field not in VECTOR_FIELDS:
        raise ValueError(f"field must be one of {VECTOR_FIELDS}, got {field!r}")
    kwargs = {"position": "q", "velocity": "v", "effort": "effort"}
    return joint_state_msg(stamp_ns, names, **{kwargs[field]: values})


def vector_from_msg(msg: JointState, expected_names: Optional[Sequence[str]] = None,
                    field: str = "effort", *, where: str = "stamped vector") -> Tuple[int, np.ndarray]:
    """``(stamp_ns, values)``; by name in ``expected_names`` order if given
    (extra elements ignored, missing ones an error), else in message order."""
    if field not in VECTOR_FIELDS:
        raise ValueError(f"field must be one of {VECTOR_FIELDS}, got {field!r}")
    vals = getattr(msg, field)
    names = msg.name
    if len(vals) != len(names):
        raise JointMismatchError(f"{where}: {len(names)} names but {len(vals)} values in '{field}'")
    src = f64_view(vals)
    if expected_names is not None:
        expected = tuple(expected_names)
        perm = cached_permutation(expected, tuple(names), where)
        out = src[perm]
        check_finite(out, expected, field, where)
    else:
        out = np.array(src, dtype=np.float64)
        check_finite(out, names, field, where)
    return to_ns(msg.header.stamp), out


class VectorBuffer:
    """Stamped vectors by stamp (a consumer's buffer of, e.g., ``feedforward/residual``):
    :meth:`get` the exact stamp, else the newest older one within a staleness.  Holds at
    most ``capacity`` stamps (the oldest half goes when it is full).  Not thread-safe."""

    def __init__(self, capacity: int = 4096):
        self.capacity = int(capacity)
        self._items: dict = {}
        self._keys: list = []   # sorted stamps

    def add(self, stamp: int, value) -> None:
        if stamp not in self._items:
            bisect.insort(self._keys, stamp)
        self._items[stamp] = value
        if len(self._keys) > self.capacity:
            half = self.capacity // 2
            for k in self._keys[:half]:
                del self._items[k]
            del self._keys[:half]

    def get(self, stamp: int, staleness_ns: float = 0):
        """The vector stamped ``stamp``, else the newest older one at most
        ``staleness_ns`` older, else None."""
        r = self._items.get(stamp)
        if r is not None:
            return r
        i = bisect.bisect_right(self._keys, stamp)
        if i and stamp - self._keys[i - 1] <= staleness_ns:
            return self._items[self._keys[i - 1]]
        return None

    def nearest(self, stamp: int, tolerance_ns: float = 0):
        """The vector stamped ``stamp``, else the one nearest to it (older or newer) at most
        ``tolerance_ns`` away (the older on a tie), else None."""
        r = self._items.get(stamp)
        if r is not None:
            return r
        i = bisect.bisect_right(self._keys, stamp)
        near = [k for k in (self._keys[i - 1] if i else None, self._keys[i] if i < len(self._keys) else None)
                if k is not None and abs(k - stamp) <= tolerance_ns]
        return self._items[min(near, key=lambda k: (abs(k - stamp), k))] if near else None

    @property
    def newest(self) -> Optional[int]:
        return self._keys[-1] if self._keys else None

    def __contains__(self, stamp) -> bool:
        return stamp in self._items

    def __len__(self) -> int:
        return len(self._keys)

"""Joint-state recordings for identification: a rosbag2 (``joint_states``) or a CSV file
read into arrays in the robot's joint order, with every left-out message counted by
reason (no ROS import).

* **bag** (a directory, its ``.mcap`` file, or a cut-off ``.mcap`` recording read up to its
  last complete message: :func:`~.bags.open_bag`): the
  ``sensor_msgs/JointState`` messages of its ``joint_states`` topic (a namespaced
  ``/ns/joint_states`` is found by suffix), stamped by their header; joints matched by
  name, extra names ignored.
* **CSV** (``*.csv``): a header row, a time column ``time`` (or ``t``) in seconds, and per
  joint the columns ``<joint>/position``, ``<joint>/velocity`` and ``<joint>/effort``
  (other columns ignored); an unparsable cell reads as NaN.

Left out and counted (:attr:`Recording.counts`): ``missing_joints`` (a message without
one of the robot's joints, or a field with fewer values than names), ``nonfinite`` (a NaN
or inf in a used value); repeated and out-of-order stamps are counted later by
:func:`~adaptive_dynamics.dynamics.identification.segments`, which needs the order.
"""
from __future__ import annotations

import csv
import math
import os
import pathlib
from dataclasses import dataclass, field

import numpy as np

from .bags import open_bag
from .streams import find_topics, read_streams, TOPIC_ROLES

__all__ = ["Recording", "load_recording"]


@dataclass
class Recording:
    """Samples in recording order: ``t`` [s] (N,), ``q``, ``qd``, ``tau`` (N x n) in
    ``joint_names`` order; ``counts``: messages read and left out by reason."""

    source: str
    joint_names: list
    t: np.ndarray
    q: np.ndarray
    qd: np.ndarray
    tau: np.ndarray
    counts: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.t.size)


def load_recording(source, joint_names) -> Recording:
    """A :class:`Recording` of the joints ``joint_names`` from a bag or a CSV file."""
    path = pathlib.Path(os.fspath(source))
    if not path.exists():
        raise ValueError(f"{str(source)!r}: no such bag or CSV file")
    if path.suffix.lower() == ".csv":
        return _load_csv(path, list(joint_names))
    return _load_bag(path, list(joint_names))


def _finish(source, joints, t, q, qd, tau, counts) -> Recording:
    t, q, qd, tau = (np.asarray(a, dtype=float) for a in (t, q, qd, tau))
    n = len(joints)
    q, qd, tau = (a.reshape(-1, n) for a in (q, qd, tau))
    bad = ~(np.isfinite(t) & np.isfinite(q).all(1) & np.isfinite(qd).all(1) & np.isfinite(tau).all(1))
    counts["nonfinite"] = int(bad.sum())
    keep = ~bad
    counts["samples"] = int(keep.sum())
    if not counts["samples"]:
        raise ValueError(f"{source!r}: no usable joint-state samples ({counts})")
    return Recording(str(source), list(joints), t[keep], q[keep], qd[keep], tau[keep], counts)


def _load_bag(path: pathlib.Path, joints: list) -> Recording:
    src = open_bag(path)
    if find_topics(src, {"joint_states": TOPIC_ROLES["joint_states"]})[0].get("joint_states") is None:
        raise ValueError(f"bag {str(path)!r} has no joint_states messages (sensor_msgs/msg/JointState); topics in"
                         f" the bag: {sorted(src.topics) or 'none'}")
    rec = read_streams(src, joints, reference=None, missing="skip")
    st = rec.joint["/joint_states"]
    counts = {"messages": len(st.t_ns) + rec.damage.get("missing_joints", 0),
              "missing_joints": rec.damage.get("missing_joints", 0)}
    for key in ("missing_joint_names", "truncated"):
        if key in rec.damage:
            counts[key] = rec.damage[key]
    return _finish(str(path), joints, st.t, st.position, st.velocity, st.effort, counts)


def _load_csv(path: pathlib.Path, joints: list) -> Recording:
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise ValueError(f"{str(path)!r}: empty CSV file") from None
        col = {h: k for k, h in enumerate(header)}
        tcol = col.get("time", col.get("t"))
        if tcol is None:
            raise ValueError(f"{str(path)!r}: no time column ('time' or 't', seconds); columns: {header}")
        want = [f"{j}/{f}" for f in ("position", "velocity", "effort") for j in joints]
        missing = [w for w in want if w not in col]
        if missing:
            raise ValueError(f"{str(path)!r}: missing columns {missing[:6]}{' ...' if len(missing) > 6 else ''}"
                             " (per joint <joint>/position, <joint>/velocity, <joint>/effort)")
        idx = [tcol] + [col[w] for w in want]
        counts = {"rows": 0, "missing_joints": 0}

        def num(cell: str) -> float:
            try:
                return float(cell)
            except ValueError:
                return math.nan

        data = []
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            counts["rows"] += 1
            if len(row) < len(header):
                counts["missing_joints"] += 1
                continue
            data.append([num(row[k]) for k in idx])
    A = np.array(data, dtype=float).reshape(-1, 1 + 3 * len(joints))
    n = len(joints)
    return _finish(str(path), joints, A[:, 0], A[:, 1:1 + n], A[:, 1 + n:1 + 2 * n], A[:, 1 + 2 * n:], counts)

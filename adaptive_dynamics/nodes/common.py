"""Pieces every node shares: the robot parameters and a throttled logger."""
from __future__ import annotations

import os
import time

from ..dynamics import RobotModel
from ..robots import share_dir
from ..ros.params import ParamSpec


def robot_specs() -> list[ParamSpec]:
    """Parameters of the robot description (set by config/<robot>.yaml's ``/**``)."""
    return [
        ParamSpec("robot", "panda", "robot name (panda | iiwa14 | planar2) or label", read_only=True),
        ParamSpec("urdf", "", "URDF file: absolute, or relative to the package's urdf/ dir;"
                  " empty = urdf/<robot>.urdf", read_only=True),
        ParamSpec("joint_names", [""], "joint names in command order (matched by name on"
                  " joint_states); [''] = the URDF's order", read_only=True, type="str[]"),
        ParamSpec("ee_frame", "", "end-effector frame; empty = last frame of the URDF", read_only=True),
    ]


def resolve_urdf(store) -> str:
    urdf = store["urdf"] or f"{store['robot']}.urdf"
    if not os.path.isabs(urdf):
        urdf = str(share_dir() / "urdf" / urdf)
    if not os.path.exists(urdf):
        raise FileNotFoundError(f"URDF not found: {urdf} (parameters robot={store['robot']!r},"
                                f" urdf={store['urdf']!r})")
    return urdf


def load_robot(store, **kwargs) -> tuple[RobotModel, list[str]]:
    """RobotModel from the node's parameters and the joint order to use.

    ``joint_names`` must name exactly the URDF's joints (any order): commands are
    published in that order.  A mismatch raises ``ValueError`` listing the names.
    """
    rm = RobotModel(resolve_urdf(store), ee_frame=store["ee_frame"] or None, **kwargs)
    names = [n for n in store["joint_names"] if n]
    if not names:
        names = list(rm.joint_names)
    rm.joint_index(names)  # raises with missing/unexpected names
    return rm, names


class Throttle:
    """At most one log line per ``period`` seconds per key (wall clock)."""

    def __init__(self, period: float = 1.0):
        self.period = period
        self._last: dict = {}

    def __call__(self, key: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, -1e9) >= self.period:
            self._last[key] = now
            return True
        return False


def trigger_save(res, save, *, what: str, unset: str):
    """Fill a ``std_srvs/Trigger`` response from ``save()`` (a path, or None when there is
    nothing to save -- ``unset`` says why)."""
    try:
        path = save()
    except OSError as exc:
        res.success, res.message = False, f"save failed: {exc}"
        return res
    res.success = path is not None
    res.message = f"{what} saved to {path}" if path else unset
    return res

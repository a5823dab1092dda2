"""The robots this package ships: where their URDFs and parameter files live.

No ROS import: works from a source checkout, a pip install or a colcon install.

* ``share_dir()``     the package share directory (holding ``urdf/`` and ``config/``)
* ``ROBOT_NAMES``     robots with a ``urdf/<name>.urdf`` and a ``config/<name>.yaml``
* ``robot_config()``  the ROS 2 parameter file of a robot, flattened to one dict
* ``urdf_path()``     a robot name or an existing file -> URDF path
* ``friction()``      the simulated ("reality") joint friction of a robot
* ``end_effector_links()`` / ``strip_inertials()``  the massive bodies a URDF fixes after
  its last moving joint (a gripper, a tool), and the URDF without their inertials
"""
from __future__ import annotations

import os
import pathlib
import sys
from typing import Any, Dict, List, Tuple

import numpy as np
import yaml

__all__ = ["PACKAGE", "ROBOT_NAMES", "share_dir", "robot_config", "urdf_path", "friction", "end_effector_links",
           "strip_inertials"]

PACKAGE = "adaptive_dynamics"
ROBOT_NAMES: Tuple[str, ...] = ("panda", "iiwa14", "planar2")

# The parameter-file sections robot_config() merges, in order (later wins).
_WILDCARD_NODE = "/**"
_BRIDGE_NODE = "mujoco_bridge"


def _candidates() -> List[Tuple[str, pathlib.Path]]:
    found: List[Tuple[str, pathlib.Path]] = []
    try:
        from ament_index_python.packages import get_package_share_directory  # type: ignore

        try:
            found.append(("ament index", pathlib.Path(get_package_share_directory(PACKAGE))))
        except Exception as exc:  # PackageNotFoundError, or no AMENT_PREFIX_PATH
            found.append((f"ament index ({type(exc).__name__})", pathlib.Path("<not found>")))
    except ImportError:
        found.append(("ament index (ament_index_python not importable)", pathlib.Path("<not found>")))
    found.append(("source tree", pathlib.Path(__file__).resolve().parent.parent))
    found.append(("sys.prefix", pathlib.Path(sys.prefix) / "share" / PACKAGE))
    return found


def share_dir() -> pathlib.Path:
    """The package share directory: the first of these that contains ``urdf/``.

    1. ``ament_index_python``'s ``get_package_share_directory('adaptive_dynamics')``
       (a colcon/ROS 2 install);
    2. the repository root (parent of the ``adaptive_dynamics`` package directory),
       i.e. a source checkout or an editable pip install;
    3. ``sys.prefix/share/adaptive_dynamics`` (the data_files of a plain pip install).
    """
    tried = []
    for how, path in _candidates():
        if (path / "urdf").is_dir():
            return path
        tried.append(f"{how}: {path}")
    raise FileNotFoundError(
        f"cannot find the {PACKAGE} share directory (a directory containing urdf/); tried:\n  "
        + "\n  ".join(tried)
    )


def _unknown(name: str) -> ValueError:
    return ValueError(f"unknown robot {name!r}; valid robot names: {', '.join(ROBOT_NAMES)}")


def _config_file(name: str) -> pathlib.Path:
    if name not in ROBOT_NAMES:
        raise _unknown(name)
    path = share_dir() / "config" / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"parameter file of robot {name!r} not found: {path}")
    return path


def robot_config(name: str) -> Dict[str, Any]:
    """The robot's ``config/<name>.yaml`` as one dict.

    The ``/**`` ``ros__parameters`` (shared by every node) merged with the
    ``mujoco_bridge`` ``ros__parameters`` (the simulated plant's "reality").
    """
    path = _config_file(name)
    with open(path, "r", encoding="utf-8") as fh:
        doc = yaml.safe_load(fh) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a ROS 2 parameter file (a mapping of node names)")
    merged: Dict[str, Any] = {}
    for node in (_WILDCARD_NODE, _BRIDGE_NODE):
        section = doc.get(node) or doc.get(f"/**/{node}") or {}
        params = section.get("ros__parameters") if isinstance(section, dict) else None
        if params is None:
            raise ValueError(f"{path}: missing '{node}: ros__parameters:' section")
        merged.update(params)
    return merged


def urdf_path(name_or_path: "str | os.PathLike[str]") -> str:
    """URDF path of a known robot name, or ``name_or_path`` itself if it is a file.

    A relative path is taken as is (relative to the working directory).  Anything
    else raises ``ValueError`` listing the valid robot names.
    """
    text = os.fspath(name_or_path)
    if text in ROBOT_NAMES:
        cfg = robot_config(text)
        path = pathlib.Path(cfg.get("urdf", f"{text}.urdf"))
        if not path.is_absolute():
            path = share_dir() / "urdf" / path
        if not path.is_file():
            raise FileNotFoundError(f"URDF of robot {text!r} not found: {path}")
        return str(path)
    if os.path.isfile(text):
        return os.path.abspath(text)
    raise ValueError(
        f"{text!r} is neither a known robot nor an existing file; "
        f"valid robot names: {', '.join(ROBOT_NAMES)}"
    )


def friction(name: str) -> Tuple[np.ndarray, np.ndarray]:
    """(viscous [N m s/rad], Coulomb [N m]) per joint, in the config's joint order."""
    cfg = robot_config(name)
    n = len(cfg["joint_names"])
    out = []
    for key in ("friction_viscous", "friction_coulomb"):
        arr = np.asarray(cfg.get(key, [0.0] * n), dtype=float)
        if arr.shape != (n,):
            raise ValueError(f"robot {name!r}: {key} has {arr.size} values for {n} joints")
        if not np.all(np.isfinite(arr)) or np.any(arr < 0):
            raise ValueError(f"robot {name!r}: {key} must be finite and >= 0, got {arr.tolist()}")
        out.append(arr)
    return out[0], out[1]


_MOVING = ("revolute", "continuous", "prismatic")


def end_effector_links(urdf_text: str) -> List[str]:
    """The links with mass that the URDF attaches by fixed joints after its last moving
    joint (the end effector: the Franka Hand of the Panda, a tool), in document order;
    ``[]`` when there are none."""
    import xml.etree.ElementTree as ET
    root = ET.fromstring(urdf_text)
    joints = root.findall("joint")
    children: Dict[str, List[Tuple[str, str]]] = {}
    for j in joints:
        parent, child = j.find("parent"), j.find("child")
        if parent is not None and child is not None:
            children.setdefault(parent.get("link"), []).append((j.get("type", ""), child.get("link")))
    moving = [j for j in joints if j.get("type") in _MOVING]
    if not moving:
        return []
    last = moving[-1].find("child").get("link")
    found, stack = [], [last]
    while stack:
        for jtype, child in children.get(stack.pop(), []):
            if jtype == "fixed":
                found.append(child)
                stack.append(child)
    mass = {}
    for link in root.findall("link"):
        m = link.find("inertial/mass")
        mass[link.get("name")] = float(m.get("value", 0.0)) if m is not None else 0.0
    order = [link.get("name") for link in root.findall("link")]
    return [n for n in order if n in found and mass.get(n, 0.0) > 0.0]


def strip_inertials(urdf_text: str, links) -> str:
    """The URDF text with the ``<inertial>`` of ``links`` removed (massless links)."""
    import xml.etree.ElementTree as ET
    root = ET.fromstring(urdf_text)
    drop = set(links)
    for link in root.findall("link"):
        if link.get("name") in drop:
            for inertial in link.findall("inertial"):
                link.remove(inertial)
    return ET.tostring(root, encoding="unicode")

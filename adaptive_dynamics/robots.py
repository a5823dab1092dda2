"""The robots this package ships: where their URDFs and parameter files live.

No ROS import: works from a source checkout, a pip install or a colcon install.

* ``share_dir()``     the package share directory (holding ``urdf/`` and ``config/``)
* ``ROBOT_NAMES``     robots with a ``urdf/<name>.urdf`` and a ``config/<name>.yaml``
* ``robot_config()``  the ROS 2 parameter file of a robot, flattened to one dict
* ``urdf_path()``     a robot name or an existing file -> URDF path
* ``friction()``      the simulated ("reality") joint friction of a robot
* ``armature()``      the drive inertia its parameter file states (simulator and gains)
* ``end_effector_links()`` / ``strip_inertials()``  the massive bodies a URDF fixes after
  its last moving joint (a gripper, a tool), and the URDF without their inertials
* ``node_section()``  one node's section of a robot's parameter file (and of its paper
  set-up file)
* ``config_file()`` / ``generated_config()`` / ``cache_dir()``  where a robot's parameter
  file is (shipped, or generated for a URDF by :mod:`adaptive_dynamics.robot_setup`)

The bottom of the package's layers (``docs/design.md``): it reads files and URDF text and
imports no other layer but the base (``files``, ``validation``).
"""
from __future__ import annotations

import os
import pathlib
import sys
from typing import Any, Dict, List, Tuple

import numpy as np
import yaml

from .validation import per_joint

__all__ = ["PACKAGE", "ROBOT_NAMES", "share_dir", "robot_config", "paper_config", "urdf_path", "friction", "end_effector_links",
           "strip_inertials", "moving_joints", "lock_joints", "node_section", "config_file", "generated_config",
           "merged_config", "cache_dir", "robot_label", "default_ee_frame", "urdf_friction",
           "DEFAULT_FRICTION_PER_EFFORT", "armature", "friction_smoothing", "FRICTION_SMOOTHING"]

#: the friction columns' Coulomb shape tanh(qd / eps) of a generated parameter file [rad/s]
#: (``friction_smoothing``; the shipped arms' files state the same): ten times a joint-velocity
#: noise of 0.003 rad/s, so the term does not flip with the noise near a reversal
FRICTION_SMOOTHING = 0.03

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


def generated_config(robot: str) -> "pathlib.Path | None":
    """The parameter file :func:`resolve_robot` generated for the URDF file ``robot`` (its
    sibling ``<stem>.yaml`` whose ``urdf`` names it and which has every section this
    version writes), or None when ``robot`` is not such a file (a file of an older version
    lacking a section is then resolved again, into its own cache entry)."""
    if not os.path.isfile(robot):
        return None
    path = pathlib.Path(os.path.abspath(robot))
    cfg = path.with_suffix(".yaml")
    if not cfg.is_file():
        return None
    try:
        doc = yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}
        params = doc[_WILDCARD_NODE]["ros__parameters"]
        complete = all(isinstance(doc[f"/**/{node}"]["ros__parameters"], dict)
                       for node in (_BRIDGE_NODE, "adaptive_controller"))
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return cfg if complete and params.get("urdf") == str(path) else None


def config_file(name: str) -> pathlib.Path:
    if name not in ROBOT_NAMES:
        generated = generated_config(name)
        if generated is None:
            raise _unknown(name)
        return generated
    path = share_dir() / "config" / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"parameter file of robot {name!r} not found: {path}")
    return path


def robot_config(name: str) -> Dict[str, Any]:
    """The robot's ``config/<name>.yaml`` as one dict (``name``: a shipped robot, or the URDF
    file of a :func:`resolve_robot` result: its generated parameter file).

    The ``/**`` ``ros__parameters`` (shared by every node) merged with the
    ``mujoco_bridge`` ``ros__parameters`` (the simulated plant's "reality").
    """
    return merged_config(config_file(name))


def _parameter_doc(path: pathlib.Path) -> Dict[str, Any]:
    with open(path, "r", encoding="utf-8") as fh:
        doc = yaml.safe_load(fh) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a ROS 2 parameter file (a mapping of node names)")
    return doc


def _section(doc: Dict[str, Any], node: str, path: pathlib.Path, required: bool = True) -> Dict[str, Any]:
    """The ``ros__parameters`` of ``node`` (as ``node`` or ``/**/node``) in a parameter file."""
    section = doc.get(node) or doc.get(f"/**/{node}") or {}
    params = section.get("ros__parameters") if isinstance(section, dict) else None
    if params is None:
        if required:
            raise ValueError(f"{path}: missing '{node}: ros__parameters:' section")
        return {}
    return dict(params)


def merged_config(path: pathlib.Path) -> Dict[str, Any]:
    doc = _parameter_doc(path)
    merged: Dict[str, Any] = {}
    for node in (_WILDCARD_NODE, _BRIDGE_NODE):
        merged.update(_section(doc, node, path))
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


def node_section(name: str, node: str, paper: bool = False) -> Dict[str, Any]:
    """``node``'s section of the robot's parameter file (empty when it has none), with
    ``paper`` :func:`paper_config`'s on top."""
    path = config_file(name)
    return {**_section(_parameter_doc(path), node, path, required=False), **_paper_section(name, node, paper)}


def _paper_section(name: str, node: str, paper: bool) -> Dict[str, Any]:
    """``node``'s section of :func:`paper_config`'s file with ``paper``, else empty."""
    out: Dict[str, Any] = {}
    for p in (paper_config(name) if paper else []):
        out.update(_section(_parameter_doc(pathlib.Path(p)), node, pathlib.Path(p), required=False))
    return out


def paper_config(name: str) -> "list[str]":
    """The parameter file that puts a shipped robot back in the set-up its paper
    reproductions were measured in (``config/<robot>.paper.yaml``: e.g. the iiwa 14
    without drive armature or friction columns, with the gains tuned in ``experiment
    ardl``), as a list to pass after the robot's own file; ``[]`` where the robot's
    defaults are that set-up (or for a URDF robot)."""
    if name not in ROBOT_NAMES:
        return []
    path = config_file(name).with_suffix(".paper.yaml")
    return [str(path)] if path.exists() else []


def robot_label(name: str) -> str:
    """A shipped robot's name, or the label of a resolved URDF (its file stem): for file
    names and tables."""
    return name if name in ROBOT_NAMES else str(robot_config(name).get("robot") or pathlib.Path(name).stem)


def default_ee_frame(name: str) -> "str | None":
    """The end-effector frame the robot's parameter file names (shipped robot or resolved
    URDF), else None."""
    path = config_file(name) if name in ROBOT_NAMES else generated_config(name)
    return None if path is None else (merged_config(path).get("ee_frame") or None)


#: friction of a URDF whose ``<dynamics>`` declare none, per N m of the joint's effort
#: limit: viscous [N m s/rad], Coulomb [N m] (the order of the Panda's identified friction,
#: Gaz et al. 2019: 0.0001-0.002 and 0.002-0.01 of its ratings)
DEFAULT_FRICTION_PER_EFFORT = (0.001, 0.004)


def urdf_friction(urdf_text: str, joints, effort_limit) -> Tuple[List[float], List[float], str]:
    """(viscous, Coulomb, source) of the simulated joints of a URDF: its ``<dynamics
    damping friction>`` when any is non-zero, else :data:`DEFAULT_FRICTION_PER_EFFORT`
    times the effort limits."""
    import xml.etree.ElementTree as ET
    by_name = {j.get("name"): j for j in ET.fromstring(urdf_text).findall("joint")}
    fv, fc = [], []
    for name in joints:
        dyn = by_name[name].find("dynamics") if name in by_name else None
        fv.append(float(dyn.get("damping", 0.0)) if dyn is not None else 0.0)
        fc.append(float(dyn.get("friction", 0.0)) if dyn is not None else 0.0)
    if any(x > 0 for x in fv + fc):
        return fv, fc, "the URDF's <dynamics damping friction>"
    lim = np.asarray(effort_limit, dtype=float)
    return ([round(float(x), 4) for x in DEFAULT_FRICTION_PER_EFFORT[0] * lim],
            [round(float(x), 4) for x in DEFAULT_FRICTION_PER_EFFORT[1] * lim],
            f"none in the URDF: {DEFAULT_FRICTION_PER_EFFORT[0]} / {DEFAULT_FRICTION_PER_EFFORT[1]} of the effort"
            " limits (adaptive_dynamics.robots.DEFAULT_FRICTION_PER_EFFORT)")


def armature(name: str, paper: bool = False) -> np.ndarray:
    """The drive inertia [kg m^2] per joint its parameter file states (``armature`` in the
    ``/**`` section, read by the simulator, the gains and ``info``); zeros when it states
    none (the Panda's simulator: the URDF's inertia exactly).  ``paper``: as
    :func:`paper_config` sets it (the set-up of the paper reproductions)."""
    cfg = {**robot_config(name), **_paper_section(name, "/**", paper)}
    try:
        return per_joint(cfg.get("armature", 0.0), len(cfg["joint_names"]), "armature", one_for_all=True)
    except ValueError as exc:
        raise ValueError(f"robot {name!r}: {exc}") from None


def friction_smoothing(name: str, paper: bool = False) -> float:
    """The ``friction_smoothing`` [rad/s] the robot's parameter file gives every node (``/**``;
    ``paper``: as :func:`paper_config` sets it); 0 (sgn) when it states none."""
    cfg = {**robot_config(name), **_paper_section(name, "/**", paper)}
    return float(cfg.get("friction_smoothing", 0.0))


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


def end_effector_links(urdf_text: str, model=None) -> List[str]:
    """The links with mass that the URDF attaches by fixed joints to the body of its last
    joint in the kinematic tree (pinocchio's order, whatever the document order) other
    than that joint's own link: the end effector (the Franka Hand of the Panda, a tool);
    ``[]`` when there are none.  ``model``: the URDF's ``pinocchio.Model`` if already
    built."""
    import xml.etree.ElementTree as ET

    import pinocchio as pin
    pm = model
    if pm is None:
        try:
            pm = pin.buildModelFromXML(urdf_text)
        except Exception:  # noqa: BLE001 -- not loadable: no end effector to split off
            return []
    if pm.njoints < 2:
        return []
    last = pm.njoints - 1
    own = next((f.name for f in pm.frames if f.type == pin.FrameType.BODY and f.parentJoint == last), None)
    bodies = {f.name for f in pm.frames if f.type == pin.FrameType.BODY and f.parentJoint == last} - {own}
    root = ET.fromstring(urdf_text)
    out = []
    for link in root.findall("link"):
        m = link.find("inertial/mass")
        if link.get("name") in bodies and m is not None and float(m.get("value", 0.0)) > 0.0:
            out.append(link.get("name"))
    return out


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


def moving_joints(urdf_text: str) -> List[str]:
    """The URDF's revolute / continuous / prismatic joints, in document order."""
    import xml.etree.ElementTree as ET
    return [j.get("name") for j in ET.fromstring(urdf_text).findall("joint") if j.get("type") in _MOVING]


def lock_joints(urdf_text: str, keep) -> str:
    """The URDF with every moving joint not in ``keep`` made fixed at its neutral position
    (0, or the nearest limit when 0 is outside them: a gripper's fingers, a mobile base's
    wheels), its ``origin`` then carrying that displacement."""
    import xml.etree.ElementTree as ET

    import pinocchio as pin
    root = ET.fromstring(urdf_text)
    keep = set(keep)
    for j in root.findall("joint"):
        if j.get("type") not in _MOVING or j.get("name") in keep:
            continue
        lim = j.find("limit")
        lo = float(lim.get("lower", 0.0)) if lim is not None else 0.0
        hi = float(lim.get("upper", 0.0)) if lim is not None else 0.0
        q0 = min(max(0.0, lo), hi) if lim is not None and hi >= lo and j.get("type") != "continuous" else 0.0
        origin = j.find("origin")
        if origin is None:
            origin = ET.SubElement(j, "origin")
        xyz = np.array([float(x) for x in origin.get("xyz", "0 0 0").split()])
        rpy = np.array([float(x) for x in origin.get("rpy", "0 0 0").split()])
        axis_el = j.find("axis")
        axis = np.array([float(x) for x in (axis_el.get("xyz", "1 0 0") if axis_el is not None else "1 0 0").split()])
        M = pin.SE3(pin.rpy.rpyToMatrix(*rpy), xyz)
        if q0 != 0.0:
            u = axis / np.linalg.norm(axis)
            step = pin.SE3(np.eye(3), q0 * u) if j.get("type") == "prismatic" else \
                pin.SE3(pin.exp3(q0 * u), np.zeros(3))
            M = M * step
        origin.set("xyz", " ".join(repr(float(x)) for x in M.translation))
        origin.set("rpy", " ".join(repr(float(x)) for x in pin.rpy.matrixToRpy(M.rotation)))
        j.set("type", "fixed")
        for tag in ("axis", "limit", "dynamics", "mimic", "safety_controller", "calibration"):
            for el in j.findall(tag):
                j.remove(el)
    return ET.tostring(root, encoding="unicode")


def cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / PACKAGE / "robots"

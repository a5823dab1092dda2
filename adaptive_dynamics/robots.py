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
* ``resolve_robot()``  any robot: a shipped name, or a URDF file (its moving joints or a
  chosen subset, the others locked; checked for inertials and effort limits) with a
  generated parameter file (``/**`` description + model-derived gains)
"""
from __future__ import annotations

import os
import pathlib
import sys
from typing import Any, Dict, List, Tuple

import numpy as np
import yaml

__all__ = ["PACKAGE", "ROBOT_NAMES", "share_dir", "robot_config", "paper_config", "urdf_path", "friction", "end_effector_links",
           "strip_inertials", "moving_joints", "lock_joints", "RobotSpec", "resolve_robot", "controller_gains",
           "robot_label", "default_ee_frame", "urdf_friction", "DEFAULT_FRICTION_PER_EFFORT", "armature"]

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


def _generated_config(robot: str) -> "pathlib.Path | None":
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


def _config_file(name: str) -> pathlib.Path:
    if name not in ROBOT_NAMES:
        generated = _generated_config(name)
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
    return _merged_config(_config_file(name))


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


def _merged_config(path: pathlib.Path) -> Dict[str, Any]:
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


def controller_gains(name: str, paper: bool = False) -> Dict[str, Any]:
    """The ``adaptive_controller`` section of the robot's parameter file (``lam``, ``kd``,
    ...; generated: :func:`~adaptive_dynamics.control.gains.default_gains`); ``paper``:
    with :func:`paper_config`'s on top.  A ``kd: [0]`` ("derive it", as the controller
    nodes read it) comes back as the K_D the nodes derive:
    :func:`~adaptive_dynamics.control.gains.default_gains` with the file's ``armature``
    at 1 kHz."""
    path = _config_file(name)
    section = {**_section(_parameter_doc(path), "adaptive_controller", path, required=False),
               **_paper_section(name, "adaptive_controller", paper)}
    kd = section.get("kd")
    if kd is not None and len(kd) == 1 and float(kd[0]) == 0.0:
        from .control.gains import default_gains
        from .dynamics import RobotModel
        section["kd"] = default_gains(RobotModel(urdf_path(name)), armature=armature(name, paper))["kd"]
    return section


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
    path = _config_file(name).with_suffix(".paper.yaml")
    return [str(path)] if path.exists() else []


def robot_label(name: str) -> str:
    """A shipped robot's name, or the label of a resolved URDF (its file stem): for file
    names and tables."""
    return name if name in ROBOT_NAMES else str(robot_config(name).get("robot") or pathlib.Path(name).stem)


def default_ee_frame(name: str) -> "str | None":
    """The end-effector frame the robot's parameter file names (shipped robot or resolved
    URDF), else None."""
    path = _config_file(name) if name in ROBOT_NAMES else _generated_config(name)
    return None if path is None else (_merged_config(path).get("ee_frame") or None)


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
    from .dynamics.validation import per_joint
    cfg = {**robot_config(name), **_paper_section(name, "/**", paper)}
    try:
        return per_joint(cfg.get("armature", 0.0), len(cfg["joint_names"]), "armature", one_for_all=True)
    except ValueError as exc:
        raise ValueError(f"robot {name!r}: {exc}") from None


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


class RobotSpec:
    """What the graph needs to know about a robot: ``label``, ``urdf`` (a file; for a
    joint subset the locked URDF), ``joint_names``, ``ee_frame``, ``config`` (the
    parameter file: shipped, or generated next to the locked URDF)."""

    def __init__(self, label: str, urdf: str, joint_names: List[str], ee_frame: str, config: str, shipped: bool):
        self.label, self.urdf, self.joint_names, self.ee_frame = label, urdf, joint_names, ee_frame
        self.config, self.shipped = config, shipped

    def __repr__(self) -> str:
        return f"RobotSpec({self.label!r}, {len(self.joint_names)} joints, ee {self.ee_frame!r})"


def _atomic_text(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file of this process (concurrent
    writers of the same content never see a partial file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _cache_dir() -> pathlib.Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / PACKAGE / "robots"


def resolve_robot(robot: str, joints=None, ee_frame: str | None = None) -> RobotSpec:
    """A :class:`RobotSpec` for a shipped robot name or a URDF file.

    For a URDF: its moving joints, or ``joints`` (the others locked, e.g. a gripper's
    fingers); ``ee_frame``, else for a chosen chain the link its last joint moves, else
    the URDF's last frame; every moving link must have mass and every
    joint an effort limit (a clear error names the link or joint).  The locked URDF and a
    parameter file -- ``/**`` (robot, urdf, joint_names, ee_frame, the assumed drive
    ``armature`` of :func:`~adaptive_dynamics.control.gains.default_armature`, ``friction:
    true``: friction columns in every model), the adaptive
    controller's ``lam``/``kd`` from :func:`~adaptive_dynamics.control.gains.default_gains`
    and the simulator's joint friction (:func:`urdf_friction`) -- are written to
    ``~/.cache/adaptive_dynamics/robots/<hash>/`` (content-addressed: the same robot gives
    the same files).  The URDF file of a result resolves to that result again."""
    import hashlib

    text_robot = os.fspath(robot)
    if text_robot in ROBOT_NAMES:
        if joints or ee_frame:
            raise ValueError(f"--joints / --ee-frame are for a URDF file; robot {text_robot!r} ships its own"
                             f" config/{text_robot}.yaml")
        cfg = robot_config(text_robot)
        return RobotSpec(text_robot, urdf_path(text_robot), list(cfg["joint_names"]), cfg.get("ee_frame", ""),
                         str(_config_file(text_robot)), True)
    if not os.path.isfile(text_robot):
        raise ValueError(f"unknown robot {text_robot!r}: neither a shipped robot ({', '.join(ROBOT_NAMES)}) nor a"
                         " URDF file")
    path = os.path.abspath(text_robot)
    generated = _generated_config(path)
    if generated is not None and not joints and not ee_frame:   # a URDF this function wrote: as it is
        cfg = _merged_config(generated)
        return RobotSpec(str(cfg["robot"]), path, list(cfg["joint_names"]), str(cfg["ee_frame"]), str(generated),
                         False)
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    try:
        movable = moving_joints(text)
    except Exception as exc:  # noqa: BLE001 -- xml.etree.ElementTree.ParseError and friends
        raise ValueError(f"{path}: not a URDF ({type(exc).__name__}: {exc})") from None
    keep = list(movable) if not joints else [str(j) for j in joints]
    unknown = [j for j in keep if j not in movable]
    if unknown or not keep:
        raise ValueError(f"{path}: joints {unknown or keep} are not moving joints of the URDF; its moving joints:"
                         f" {movable}")
    if set(keep) != set(movable):
        text = lock_joints(text, keep)
    import pinocchio as pin

    from .dynamics.continuous import unbind_continuous
    try:
        pm = pin.buildModelFromXML(unbind_continuous(text)[0])   # continuous joints: one angle each
    except Exception as exc:  # noqa: BLE001
        raise ValueError(f"{path}: pinocchio cannot load it ({exc})") from None
    names = [pm.names[j] for j in range(1, pm.njoints)]
    for j in range(1, pm.njoints):
        if pm.joints[j].nq != 1:   # pragma: no cover - moving joints are revolute/continuous/prismatic
            raise ValueError(f"{path}: joint {pm.names[j]!r} is not a 1-DoF joint; pass --joints to lock it")
        if not pm.inertias[j].mass > 0:
            link = next((f.name for f in pm.frames if f.parentJoint == j and f.type == pin.FrameType.BODY),
                        names[j - 1])
            raise ValueError(f"{path}: link {link!r} (moved by joint {pm.names[j]!r}) has no mass: the URDF needs"
                             " <inertial> for every moving link")
    lim = np.array(pm.effortLimit, dtype=float)
    bad = [n for n, e in zip(names, lim) if not (np.isfinite(e) and e > 0)]
    if bad:
        raise ValueError(f"{path}: joints {bad} have no effort limit (<limit effort=...>): torque control and the"
                         " simulator need one")
    if ee_frame:
        ee = ee_frame
    elif set(keep) != set(movable):   # a chain chosen out of a larger robot: the link its last joint moves
        ee = next(f.name for f in pm.frames if f.type == pin.FrameType.BODY and f.parentJoint == pm.njoints - 1)
    else:
        ee = pm.frames[pm.nframes - 1].name
    if not pm.existFrame(ee):
        raise ValueError(f"{path}: no frame {ee!r}; frames: {[f.name for f in pm.frames]}")
    from .control.gains import GAINS_VERSION
    key = hashlib.sha256((text + "\0" + ee + "\0" + GAINS_VERSION).encode()).hexdigest()[:16]
    out = _cache_dir() / key
    out.mkdir(parents=True, exist_ok=True)
    label = pathlib.Path(path).stem
    if label in ROBOT_NAMES:           # not to be taken for the shipped robot of that name
        label += "_urdf"
    locked = out / f"{label}.urdf"
    if not locked.exists():
        _atomic_text(locked, text)
    config = out / f"{label}.yaml"
    if not config.exists():
        from .control.gains import ARMATURE_PER_EFFORT, default_armature, default_gains
        from .dynamics import RobotModel
        ia = default_armature(lim)
        gains = default_gains(RobotModel(str(locked), ee_frame=ee), armature=ia)
        fv, fc, source = urdf_friction(text, names, lim)
        doc = {"/**": {"ros__parameters": {"robot": label, "urdf": str(locked), "joint_names": names,
                                           "ee_frame": ee, "armature": ia, "friction": True}},
               "/**/mujoco_bridge": {"ros__parameters": {"friction_viscous": fv, "friction_coulomb": fc}},
               "/**/adaptive_controller": {"ros__parameters": gains}}
        header = (f"# Generated by adaptive_dynamics from {path}" +
                  (f" (joints {keep}; the others locked)" if set(keep) != set(movable) else "") +
                  "\n# Gains: adaptive_dynamics.control.gains.default_gains (model-derived, 1 kHz)."
                  f"\n# armature (drive inertia, simulator and gains): assumed {ARMATURE_PER_EFFORT} kg m^2 per N m of"
                  " effort limit -- state your drives' values here.\n# friction: true -- every node adds viscous +"
                  " Coulomb friction columns (estimated by the adaptive laws)."
                  f"\n# Simulated friction (mujoco_bridge): {source}.\n")
        _atomic_text(config, header + yaml.safe_dump(doc, sort_keys=False))
    return RobotSpec(label, str(locked), names, ee, str(config), False)

"""Any robot, set up for the graph: a shipped name or a URDF file resolved to a
:class:`RobotSpec` (its chain checked, a parameter file with model-derived gains
generated), and the adaptive controller's gains as the nodes read them.

Above ``dynamics`` and ``control`` (it builds the model and derives the gains); the
robot catalog it reads is :mod:`adaptive_dynamics.robots`.  No ROS import.
"""
from __future__ import annotations

import hashlib
import os
import pathlib
from typing import Any, Dict, List

import numpy as np
import pinocchio as pin
import yaml

from .control.gains import ARMATURE_PER_EFFORT, GAINS_VERSION, default_armature, default_gains
from .dynamics import RobotModel
from .dynamics.continuous import unbind_continuous
from .files import atomic_write_text
from .robots import (FRICTION_SMOOTHING, ROBOT_NAMES, armature, cache_dir, config_file, generated_config,
                     lock_joints, merged_config, moving_joints, node_section, robot_config, urdf_friction, urdf_path)

__all__ = ["RobotSpec", "resolve_robot", "controller_gains"]


def controller_gains(name: str, paper: bool = False) -> Dict[str, Any]:
    """The ``adaptive_controller`` section of the robot's parameter file (``lam``, ``kd``,
    ...; generated: :func:`~adaptive_dynamics.control.gains.default_gains`); ``paper``:
    with :func:`paper_config`'s on top.  A ``kd: [0]`` ("derive it", as the controller
    nodes read it) comes back as the K_D the nodes derive:
    :func:`~adaptive_dynamics.control.gains.default_gains` with the file's ``armature``
    at 1 kHz."""
    section = node_section(name, "adaptive_controller", paper)
    kd = section.get("kd")
    if kd is not None and len(kd) == 1 and float(kd[0]) == 0.0:
        section["kd"] = default_gains(RobotModel(urdf_path(name)), armature=armature(name, paper))["kd"]
    return section


class RobotSpec:
    """What the graph needs to know about a robot: ``label``, ``urdf`` (a file; for a
    joint subset the locked URDF), ``joint_names``, ``ee_frame``, ``config`` (the
    parameter file: shipped, or generated next to the locked URDF)."""

    def __init__(self, label: str, urdf: str, joint_names: List[str], ee_frame: str, config: str, shipped: bool):
        self.label, self.urdf, self.joint_names, self.ee_frame = label, urdf, joint_names, ee_frame
        self.config, self.shipped = config, shipped

    def __repr__(self) -> str:
        return f"RobotSpec({self.label!r}, {len(self.joint_names)} joints, ee {self.ee_frame!r})"


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
    text_robot = os.fspath(robot)
    if text_robot in ROBOT_NAMES:
        if joints or ee_frame:
            raise ValueError(f"--joints / --ee-frame are for a URDF file; robot {text_robot!r} ships its own"
                             f" config/{text_robot}.yaml")
        cfg = robot_config(text_robot)
        return RobotSpec(text_robot, urdf_path(text_robot), list(cfg["joint_names"]), cfg.get("ee_frame", ""),
                         str(config_file(text_robot)), True)
    if not os.path.isfile(text_robot):
        raise ValueError(f"unknown robot {text_robot!r}: neither a shipped robot ({', '.join(ROBOT_NAMES)}) nor a"
                         " URDF file")
    path = os.path.abspath(text_robot)
    generated = generated_config(path)
    if generated is not None and not joints and not ee_frame:   # a URDF this function wrote: as it is
        cfg = merged_config(generated)
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
    key = hashlib.sha256((text + "\0" + ee + "\0" + GAINS_VERSION).encode()).hexdigest()[:16]
    out = cache_dir() / key
    out.mkdir(parents=True, exist_ok=True)
    label = pathlib.Path(path).stem
    if label in ROBOT_NAMES:           # not to be taken for the shipped robot of that name
        label += "_urdf"
    locked = out / f"{label}.urdf"
    if not locked.exists():
        atomic_write_text(locked, text)
    config = out / f"{label}.yaml"
    if not config.exists():
        ia = default_armature(lim)
        gains = default_gains(RobotModel(str(locked), ee_frame=ee), armature=ia)
        fv, fc, source = urdf_friction(text, names, lim)
        doc = {"/**": {"ros__parameters": {"robot": label, "urdf": str(locked), "joint_names": names,
                                           "ee_frame": ee, "armature": ia, "friction": True,
                                           "friction_smoothing": FRICTION_SMOOTHING}},
               "/**/mujoco_bridge": {"ros__parameters": {"friction_viscous": fv, "friction_coulomb": fc}},
               "/**/adaptive_controller": {"ros__parameters": gains}}
        header = (f"# Generated by adaptive_dynamics from {path}" +
                  (f" (joints {keep}; the others locked)" if set(keep) != set(movable) else "") +
                  "\n# Gains: adaptive_dynamics.control.gains.default_gains (model-derived, 1 kHz)."
                  f"\n# armature (drive inertia, simulator and gains): assumed {ARMATURE_PER_EFFORT} kg m^2 per N m of"
                  " effort limit -- state your drives' values here.\n# friction: true -- every node adds viscous +"
                  " Coulomb friction columns (estimated by the adaptive laws),"
                  f" the Coulomb term tanh(qd / {FRICTION_SMOOTHING:g})."
                  f"\n# Simulated friction (mujoco_bridge): {source}.\n")
        atomic_write_text(config, header + yaml.safe_dump(doc, sort_keys=False))
    return RobotSpec(label, str(locked), names, ee, str(config), False)

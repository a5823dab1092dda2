"""Build a MuJoCo model from the same URDF the controller's pinocchio model uses.

The point of this module is that the rigid-body dynamics of the MuJoCo plant are
*identical* to pinocchio's on the same URDF (checked to 1e-6 relative in
``test/test_robots.py``: ``mj_inverse`` == ``pinocchio.rnea``).  Any model mismatch the
controller sees must therefore be injected on purpose (friction, armature, damping,
payload ...), never come from the URDF import.  What that takes:

* ``inertiafromgeom="false"``: the URDF ``<inertial>`` is the only source of mass and
  inertia (a link without one is massless, as in URDF/pinocchio); geometry never
  overrides it.
* ``balanceinertia="false"``: MuJoCo must not "fix" inertia tensors; an inconsistent
  tensor is a compile error instead of a silent change.
* ``fusestatic="false"``: every URDF link stays its own body (nothing is merged
  behind our back; frames such as the end-effector stay addressable by name).
* ``discardvisual="true"`` and removal of every ``<visual>``/``<collision>`` that
  references a mesh: MuJoCo cannot read the ``.dae`` meshes ROS descriptions use, and
  geometry is irrelevant to the dynamics here.
* The URDF root link is welded to the world (MuJoCo adds no free joint for a URDF).
* Joint armature / damping / frictionloss are overwritten with the given values
  (default 0, whatever ``<dynamics>`` the URDF carries); contacts and joint-limit
  constraints are disabled unless asked for.

No ROS import here: the bridge node is a thin shell over this.
"""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET
from typing import Iterable, Sequence, Tuple, Union

import numpy as np

import mujoco
from adaptive_dynamics.robots import urdf_path

__all__ = ["urdf_to_mujoco_xml", "load_mujoco_model", "joint_indices"]

_COMPILER_ATTRS = {
    "discardvisual": "true",
    "balanceinertia": "false",
    "fusestatic": "false",
    "inertiafromgeom": "false",
    "strippath": "false",
}


def _read_urdf(urdf: Union[str, os.PathLike]) -> str:
    text = str(urdf)
    if text.lstrip().startswith("<"):
        return text  # already an XML string
    path = os.fspath(urdf)
    if not os.path.isfile(path):
        # A known robot name ("panda", "iiwa14", ...) is accepted too.

        path = urdf_path(path)
    with open(path, "r", encoding="utf-8") as fh:
        return fh.read()


def _welded_to_base(root) -> set:
    """Names of the URDF links joined to the root link by fixed joints only (the root included)."""
    joints = [j for j in root.findall("joint") if j.find("parent") is not None and j.find("child") is not None]
    children = {j.find("child").get("link") for j in joints}
    fixed: dict = {}
    for j in joints:
        if j.get("type") == "fixed":
            fixed.setdefault(j.find("parent").get("link"), []).append(j.find("child").get("link"))
    welded = {lk.get("name") for lk in root.findall("link") if lk.get("name") not in children}
    stack = list(welded)
    while stack:
        for child in fixed.get(stack.pop(), []):
            if child not in welded:
                welded.add(child)
                stack.append(child)
    return welded


def urdf_to_mujoco_xml(urdf: Union[str, os.PathLike]) -> str:
    """Return the URDF text with the ``<mujoco><compiler .../></mujoco>`` extension.

    ``urdf`` is a file path, a robot name known to :mod:`adaptive_dynamics.robots`, or
    the URDF XML itself.  Mesh-bearing ``<visual>``/``<collision>`` elements are
    removed, and the inertials of links welded to the base; an existing ``<mujoco>``
    extension is kept but its compiler flags that matter for dynamics fidelity are
    overridden.
    """
    root = ET.fromstring(_read_urdf(urdf))
    if root.tag != "robot":
        raise ValueError(f"not a URDF: the root element is <{root.tag}>, expected <robot>")

    for link in root.findall("link"):
        for tag in ("visual", "collision"):
            for elem in list(link.findall(tag)):
                if elem.find(".//mesh") is not None:
                    link.remove(elem)
    # links welded to the base (no moving joint on their way to it) do not enter the dynamics of
    # a fixed-base arm: their inertials are dropped (a locked mobile base's antenna or sensor
    # mount with an inertia MuJoCo refuses -- not positive definite, A + B < C -- then cannot
    # stop the simulator; pinocchio ignores them the same way).  A link a joint moves without
    # mass or rotational inertia of its own (its mass on a link fixed to it; iCub's wrist: a
    # 0.1 kg point): MuJoCo needs every moving body to have both; 1e-6 kg and 1e-9 kg m^2 are
    # far below any torque the simulation resolves (pinocchio merges the fixed children into
    # the joint's body instead)
    welded = _welded_to_base(root)
    moved = {j.find("child").get("link") for j in root.findall("joint")
             if j.get("type") in ("revolute", "continuous", "prismatic") and j.find("child") is not None}
    for link in root.findall("link"):
        name = link.get("name")
        if name in welded:
            for inertial in link.findall("inertial"):
                link.remove(inertial)
            continue
        if name not in moved:
            continue
        mass = link.find("inertial/mass")
        if mass is None or float(mass.get("value", 0.0)) <= 0.0:
            for inertial in link.findall("inertial"):
                link.remove(inertial)
            inertial = ET.SubElement(link, "inertial")
            ET.SubElement(inertial, "mass", value="1e-06")
            ET.SubElement(inertial, "inertia", ixx="1e-09", iyy="1e-09", izz="1e-09", ixy="0", ixz="0", iyz="0")
            continue
        inertia = link.find("inertial/inertia")     # a point mass (iCub's wrist: 0.1 kg, no inertia)
        if inertia is None:
            inertia = ET.SubElement(link.find("inertial"), "inertia")
        for key in ("ixx", "iyy", "izz"):
            if float(inertia.get(key, 0.0)) < 1e-9:
                inertia.set(key, "1e-09")

    ext = root.find("mujoco")
    if ext is None:
        ext = ET.Element("mujoco")
        root.insert(0, ext)
    compiler = ext.find("compiler")
    if compiler is None:
        compiler = ET.SubElement(ext, "compiler")
    for key, value in _COMPILER_ATTRS.items():
        compiler.set(key, value)
    compiler.attrib.pop("meshdir", None)
    return ET.tostring(root, encoding="unicode")


def _per_dof(value: Union[float, Sequence[float]], nv: int, what: str) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.ndim == 0:
        return np.full(nv, float(arr))
    if arr.shape != (nv,):
        raise ValueError(f"{what}: expected a scalar or {nv} values (one per DoF), got shape {arr.shape}")
    return arr


def load_mujoco_model(
    urdf: Union[str, os.PathLike],
    *,
    timestep: float = 1e-3,
    armature: Union[float, Sequence[float]] = 0.0,
    damping: Union[float, Sequence[float]] = 0.0,
    frictionloss: Union[float, Sequence[float]] = 0.0,
    gravity: Iterable[float] = (0.0, 0.0, -9.81),
    contacts: bool = False,
    joint_limits: bool = False,
) -> "mujoco.MjModel":
    """Build a :class:`mujoco.MjModel` whose rigid-body dynamics equal pinocchio's.

    ``armature``/``damping``/``frictionloss`` are a scalar or one value per DoF in
    MuJoCo's DoF order (use :func:`joint_indices` to place per-joint values by name).
    Contacts and joint-limit constraints are disabled by default (``contacts``,
    ``joint_limits`` turn them back on).
    """
    if not timestep > 0:
        raise ValueError(f"timestep must be > 0, got {timestep}")
    xml = urdf_to_mujoco_xml(urdf)
    try:
        model = mujoco.MjModel.from_xml_string(xml)
    except ValueError as exc:
        # a URDF inertia outside the triangle inequality (A + B >= C), which pinocchio accepts: the
        # simulator balances it and says which link (its dynamics then differ from the URDF's unless
        # the link is welded to the base, as locked sensor mounts are)
        if "A + B >= C" not in str(exc):
            raise
        import warnings
        warnings.warn(f"MuJoCo refuses a URDF inertia ({' '.join(str(exc).split())}): the simulator balances it"
                      " (compiler balanceinertia); that link's simulated inertia differs from the URDF's",
                      RuntimeWarning, stacklevel=2)
        model = mujoco.MjModel.from_xml_string(xml.replace('balanceinertia="false"', 'balanceinertia="true"', 1))

    model.opt.timestep = float(timestep)
    g = np.asarray(tuple(gravity), dtype=float)
    if g.shape != (3,):
        raise ValueError(f"gravity must have 3 components, got {g.shape}")
    model.opt.gravity[:] = g

    nv = model.nv
    model.dof_armature[:] = _per_dof(armature, nv, "armature")
    model.dof_damping[:] = _per_dof(damping, nv, "damping")
    model.dof_frictionloss[:] = _per_dof(frictionloss, nv, "frictionloss")
    model.jnt_stiffness[:] = 0.0

    if not contacts:
        model.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT)
    if not joint_limits:
        model.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_LIMIT)
    return model


def joint_indices(mj_model: "mujoco.MjModel", joint_names: Sequence[str]) -> Tuple[np.ndarray, np.ndarray]:
    """Map joint names to (qpos indices, dof indices), by NAME, never by order.

    Only 1-DoF joints (hinge/slide) are supported.  Raises ``ValueError`` naming every
    missing joint (and listing the joints the model has).
    """
    names = list(joint_names)
    qpos_idx, dof_idx, missing = [], [], []
    for name in names:
        jid = mujoco.mj_name2id(mj_model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if jid < 0:
            missing.append(name)
            continue
        jtype = int(mj_model.jnt_type[jid])
        if jtype not in (int(mujoco.mjtJoint.mjJNT_HINGE), int(mujoco.mjtJoint.mjJNT_SLIDE)):
            raise ValueError(f"joint {name!r} is not a 1-DoF (hinge/slide) joint")
        qpos_idx.append(int(mj_model.jnt_qposadr[jid]))
        dof_idx.append(int(mj_model.jnt_dofadr[jid]))
    if missing:
        have = [mujoco.mj_id2name(mj_model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(mj_model.njnt)]
        raise ValueError(f"joints not in the MuJoCo model: {missing}; the model has {have}")
    return np.asarray(qpos_idx, dtype=int), np.asarray(dof_idx, dtype=int)

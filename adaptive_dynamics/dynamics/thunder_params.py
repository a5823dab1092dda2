"""Thunder Dynamics' parameter files (``*_inertial_REG.yaml``, its ``load_conf`` /
``save_par_REG``) for :class:`~adaptive_dynamics.dynamics.RobotModel`.

The layout, one mapping per link in joint order::

    link1:
      mass: 4.97
      m_CoM_x: 0.019      # first moment m c [kg m]
      m_CoM_y: 0.237
      m_CoM_z: 0.010
      Ixx: 0.714          # inertia about the link frame's origin [kg m^2]
      Ixy: -0.0077
      Ixz: -0.0002
      Iyy: 0.0092
      Iyz: -0.0197
      Izz: 0.718
      d1: 0.1             # optional: Thunder's friction terms (not read here)
      d2: 0.01
    link2: ...

i.e. the regressor ("REG") parameters, Thunder's order ``[m, mx, my, mz, Ixx, Ixy,
Ixz, Iyy, Iyz, Izz]`` (:func:`~adaptive_dynamics.dynamics.inertial.convert_order`
``"thunder"``), with both moments about the link frame -- the same quantities as this
package's π, reordered.  Thunder expresses them in its Denavit-Hartenberg frames.  The
Panda's URDF link frames are those of Thunder's DH table (Table 5) except the last: its
row 7 carries the flange offset d = 0.107 m, so Thunder's link 7 frame is the URDF's
``panda_link8`` (the flange), and the file's link 7 block is moved between the two by the
parallel-axis theorem (:data:`THUNDER_FRAMES`; ``frames=`` names the frame of any link
for another arm, whose frames otherwise need to agree).  Links may also be named
by the model's link names.  Each link's block is the *effective* one
(:meth:`~adaptive_dynamics.dynamics.RobotModel.get_link_parameters`: the last link with
the end effector it carries), as Thunder has no separate end effector.
"""
from __future__ import annotations

import os

import numpy as np
import yaml

from ..files import atomic_write
from .inertial import check_physical_consistency, convert_order, transform_matrix

__all__ = ["THUNDER_REG_KEYS", "THUNDER_FRAMES", "load_thunder_parameters", "read_thunder_parameters",
           "save_thunder_parameters", "thunder_frames"]

#: link -> the model frame Thunder's block of that link is expressed in, where the two differ
#: (applied when the model has both): Thunder's Panda table ends at the flange (Table 5, row 7)
THUNDER_FRAMES = {"panda_link7": "panda_link8"}

#: the keys of one link's block, in Thunder's order
THUNDER_REG_KEYS = ("mass", "m_CoM_x", "m_CoM_y", "m_CoM_z", "Ixx", "Ixy", "Ixz", "Iyy", "Iyz", "Izz")


def _link_key(model, i: int, doc: dict) -> str:
    """The document's key of the model's link ``i``: ``link<i+1>`` or the link's name."""
    for key in (f"link{i + 1}", model.link_names[i]):
        if key in doc:
            return key
    raise ValueError(f"no block for link {i + 1} ({model.link_names[i]!r}): expected key 'link{i + 1}' or"
                     f" '{model.link_names[i]}'; the file has {sorted(doc)}")


def thunder_frames(model, frames=None) -> dict:
    """``{link index: 10x10 L}`` with ``pi_link = L @ pi_thunder`` for the links whose Thunder
    frame is another frame of the model (``frames``: link name -> frame name; default
    :data:`THUNDER_FRAMES` where it applies)."""
    if frames is None:
        frames = {k: v for k, v in THUNDER_FRAMES.items()
                  if k in model.link_names and model.model.existFrame(v)}
    out = {}
    for link, frame in frames.items():
        i = model.link_block(link)
        f = model.model.frames[model.frame_id(frame)]
        if f.parentJoint != i + 1:
            raise ValueError(f"frame {frame!r} does not move with link {link!r}")
        out[i] = transform_matrix(f.placement.rotation, f.placement.translation)
    return out


def load_thunder_parameters(model, path: "str | os.PathLike[str]", *, check: bool = True,
                            frames=None) -> dict:
    """Set ``model``'s link parameters from a Thunder ``*_inertial_REG.yaml`` file
    (:func:`read_thunder_parameters`, then every link set); returns what it reads."""
    pi, info = read_thunder_parameters(model, path, check=check, frames=frames)
    for i, link in enumerate(model.link_names):
        model.set_link_parameters(link, pi[10 * i: 10 * i + 10], check=False)
    return info


def read_thunder_parameters(model, path: "str | os.PathLike[str]", *, check: bool = True,
                            frames=None) -> tuple:
    """The link parameters of a Thunder ``*_inertial_REG.yaml`` file for ``model``'s links
    (pinocchio's order, ``model``'s frames, the end effector included as
    :meth:`~adaptive_dynamics.dynamics.RobotModel.get_link_parameters` gives them), and
    what was read; the model is not changed.

    Every link needs its block with every key of :data:`THUNDER_REG_KEYS` (a clear error
    names what is missing or not finite); ``check`` asks for physical consistency as
    :meth:`~adaptive_dynamics.dynamics.RobotModel.set_link_parameters` does.  The second
    value is ``{"links": [...], "ignored": {...}}``: the keys read per link and those not used
    (Thunder's friction terms ``d1``, ``d2``, anything else).  ``frames``: see
    :func:`thunder_frames`."""
    with open(path, encoding="utf-8") as fh:
        doc = yaml.safe_load(fh)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a Thunder parameter file (a mapping of link blocks)")
    blocks, used, ignored = [], [], {}
    for i in range(model.n):
        key = _link_key(model, i, doc)
        entry = doc[key]
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: {key} is not a mapping of parameters")
        missing = [k for k in THUNDER_REG_KEYS if k not in entry]
        if missing:
            raise ValueError(f"{path}: {key} lacks {missing}")
        try:
            values = np.array([float(entry[k]) for k in THUNDER_REG_KEYS])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {key}: {exc}") from None
        if not np.all(np.isfinite(values)):
            bad = [k for k, x in zip(THUNDER_REG_KEYS, values) if not np.isfinite(x)]
            raise ValueError(f"{path}: {key}: {bad} not finite")
        extra = sorted(set(entry) - set(THUNDER_REG_KEYS))
        if extra:
            ignored[key] = extra
        blocks.append(values)
        used.append(key)
    pi = convert_order(np.concatenate(blocks), "thunder", "pinocchio")
    for i, L in thunder_frames(model, frames).items():
        pi[10 * i: 10 * i + 10] = L @ pi[10 * i: 10 * i + 10]
    if check:   # all or nothing: every block checked before any is set
        for i, link in enumerate(model.link_names):
            check_physical_consistency(pi[10 * i: 10 * i + 10], [f"{used[i]} ({link})"])
    return pi, {"links": used, "ignored": ignored}


def save_thunder_parameters(model, path: "str | os.PathLike[str]", comment: str = "", *, frames=None) -> str:
    """Write ``model``'s (effective) link parameters as a Thunder ``*_inertial_REG.yaml``
    file (``link1`` ... ``linkN``, Thunder's keys, Thunder's frames); returns the path."""
    moved = thunder_frames(model, frames)
    lines = ["# Inertial parameters (regressor form: mass, first moments m*CoM, inertia about the link",
             "# frame's origin), one block per link in joint order; written by adaptive_dynamics"
             + (f": {comment}" if comment else "")]
    for i, link in enumerate(model.link_names):
        blk = model.get_link_parameters(link)
        if i in moved:
            blk = np.linalg.solve(moved[i], blk)
        blk = convert_order(blk, "pinocchio", "thunder")
        lines.append("")
        lines.append(f"link{i + 1}:   # {link}" + (" (about the flange frame)" if i in moved else ""))
        lines += [f"  {k}: {float(x)!r}" for k, x in zip(THUNDER_REG_KEYS, blk)]
    return atomic_write(path, ("\n".join(lines) + "\n").encode("utf-8"))

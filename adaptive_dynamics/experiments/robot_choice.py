"""Which robot an experiment runs: a shipped robot (the experiment's tuned settings) or
any URDF file (settings derived from its model).

Every experiment takes ``--robots NAME|URDF[,...]`` (``pgpol``: ``--robot``) with
``--joints`` / ``--ee-frame`` for URDF files, as ``demo`` does.  A URDF resolves through
:func:`~adaptive_dynamics.robot_setup.resolve_robot`; the experiment then names the robot by
the resolved (locked) URDF file, which every model, plant and graph accepts, and labels
its plots and tables with the file's stem.  In place of an experiment's per-robot table a
URDF robot gets:

* **gains**: its generated parameter file's (:func:`~adaptive_dynamics.control.gains.default_gains`:
  critically damped around the middle of the joint ranges, bounded by the effort limits);
* **simulated friction**: the URDF's ``<dynamics>``, else a fraction of the effort limits
  (:func:`~adaptive_dynamics.robots.urdf_friction`);
* **a task pose** (task-space paths, pick-and-place): :func:`task_configuration`.
"""
from __future__ import annotations

import numpy as np
from ..robot_setup import controller_gains, resolve_robot
from ..robots import robot_label, ROBOT_NAMES

__all__ = ["add_robot_args", "chosen_robots", "label", "is_shipped", "gains", "task_configuration"]


def add_robot_args(ap, default: str, *, plural: bool = True, extra_help: str = "") -> None:
    """``--robots`` (or ``--robot``), ``--joints``, ``--ee-frame`` on an experiment's parser."""
    flag = "--robots" if plural else "--robot"
    what = "comma-separated: shipped robots (panda, iiwa14) or URDF files" if plural else \
        "a shipped robot (panda, iiwa14) or a URDF file"
    ap.add_argument(flag, dest="robots", default=default,
                    help=f"{what} (default {default}){extra_help}; a URDF robot runs with settings derived from"
                         " its model (gains, friction, task pose: adaptive_dynamics.experiments.robot_choice)")
    ap.add_argument("--joints", default=None, metavar="J1,J2,...",
                    help="URDF robots: the joints to move (the others locked at their neutral position)")
    ap.add_argument("--ee-frame", default=None, metavar="FRAME", help="URDF robots: the end-effector frame")


def chosen_robots(args, allowed=None) -> list[str]:
    """The robots of ``args.robots``: shipped names as they are, URDF files resolved (the
    locked URDF's path).  ``allowed``: the shipped robots the experiment has settings for.
    Raises ``SystemExit`` with the reason for anything else."""

    joints = [j for j in (args.joints or "").split(",") if j] or None
    out = []
    for r in (x.strip() for x in str(args.robots).split(",")):
        if not r:
            continue
        if r in ROBOT_NAMES:
            if allowed is not None and r not in allowed:
                raise SystemExit(f"robot {r!r}: this experiment has settings for {sorted(allowed)}"
                                 " (or give a URDF file)")
            out.append(r)
            continue
        try:
            out.append(resolve_robot(r, joints, args.ee_frame).urdf)
        except (ValueError, FileNotFoundError) as exc:
            raise SystemExit(f"robot {r!r}: {exc}") from None
    if not out:
        raise SystemExit("no robot given")
    return out


def is_shipped(robot: str) -> bool:
    return robot in ROBOT_NAMES


def label(robot: str) -> str:
    """The robot's name in file names, tables and titles."""
    return robot_label(robot)


def gains(robot: str) -> dict:
    """``lam`` and ``kd`` (lists) the experiments run a robot with: a shipped robot's in
    the set-up of its paper reproductions (:func:`~adaptive_dynamics.robots.paper_config`),
    model-derived for a URDF."""
    p = controller_gains(robot, paper=True)
    return {"lam": [float(x) for x in p["lam"]], "kd": [float(x) for x in p["kd"]]}


def task_configuration(model, seed: int = 0, samples: int = 400, feasible=None, tries: int = 30) -> np.ndarray:
    """A pose to run task-space paths around on an arm nobody configured: of the middle of
    the joint ranges and ``samples`` poses drawn from the middle half of each range
    (deterministic, ``seed``), the one of largest manipulability (the product of the
    end-effector Jacobian's singular values: position rows for an arm of fewer than six
    joints) with the end effector above the base -- the first of the ``tries`` best for
    which ``feasible(q)`` holds, when given (the experiment's paths stay within the joint
    limits from there).  Every joint keeps a quarter of its range to either limit; a joint
    that turns more than a full revolution is taken over one turn around its middle.
    ``ValueError`` when none of them is feasible."""
    lo, hi = np.asarray(model.lower, float), np.asarray(model.upper, float)
    mid = 0.5 * (lo + hi)
    half = np.minimum(0.5 * (hi - lo), np.pi)
    rng = np.random.default_rng(seed)
    cands = np.vstack([mid, mid + rng.uniform(-0.5, 0.5, (samples, model.n)) * half])
    scores = np.empty(len(cands))
    for i, q in enumerate(cands):
        J = np.asarray(model.jacobian(q), float)
        rows = J[:3] if model.n < 6 else J
        sv = np.linalg.svd(rows, compute_uv=False)[:min(model.n, rows.shape[0])]
        scores[i] = float(np.prod(sv)) * (1.0 if model.frame_pose(q)[2, 3] > 0.0 else 1e-3)
    order = np.argsort(-scores, kind="stable")
    for i in order[:tries] if feasible is not None else order[:1]:
        if feasible is None or feasible(cands[i].copy()):
            return cands[i].copy()
    raise ValueError(f"none of the {tries} most manipulable poses in the middle of the joint ranges keeps the"
                     " experiment's paths within the joint, velocity and acceleration limits")

"""``adaptive-dynamics excite --robot R --out DIR``: an optimal excitation trajectory for
identification (no ROS import).

Optimises a periodic finite Fourier trajectory (Swevers et al. 1997; the formulation is in
:mod:`adaptive_dynamics.trajectories.excitation`) that minimises the condition number of the
stacked base regressor with viscous + Coulomb friction columns (``--criterion logdet``:
maximises log det of its information matrix) inside the joint position, velocity,
acceleration (``--acc-limit``) and effort limits, at rest at the start and end of the period,
optionally with the end effector above ``--floor-z``, and -- where the robot has collision
geometry (its URDF's, or example-robot-data's for the shipped Panda) -- every pair of
non-adjacent bodies at least ``--collision-margin`` apart (``--no-self-collision``: not
checked).

``--payload``: a wrist-only excitation for payload identification (``identify --payload``):
only the last three joints move (four on a spherical wrist; the others held at ``--hold``,
default mid-range), for
``--duration`` 10 s by default (at most 15 s), minimising the condition number of the
stacked payload regressor (the 10 inertial parameters of a load on ``--payload-frame``,
default the end-effector frame) instead of the base regressor's.

Writes to ``--out``: ``excitation.csv`` (time, ``<joint>/position``, ``<joint>/velocity``,
``<joint>/acceleration`` at 1 kHz over one period), ``excitation.json`` (coefficients,
``condition_number``, the trajectory node's default excitation's ``default_condition_number``,
``condition_vs_default`` = their ratio, ``margins``: the room left to every limit, min over the
period per joint) and ``excitation.png`` (q and qd per joint with the limits).  The JSON is the
last line printed.  Play it with the trajectory node: ``launch sim --set trajectory.type=file
--set trajectory.trajectory_file=DIR/excitation.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

from ..files import json_default

DESCRIPTION = __doc__


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--robot", default="panda", help="robot name (panda | iiwa14 | planar2) or URDF path")
    p.add_argument("--joints", default=None, metavar="J1,J2,...",
                   help="the joints that move (default all); the others rest at --hold")
    p.add_argument("--ee-frame", default=None, metavar="FRAME", help="URDF robot: the end-effector frame")
    p.add_argument("--duration", type=float, default=None,
                   help="period of the trajectory [s] (default 20; --payload: 10, at most 15)")
    p.add_argument("--harmonics", type=int, default=5, help="Fourier harmonics per joint (>= 2, default 5)")
    p.add_argument("--criterion", default="condition", choices=["condition", "logdet"],
                   help="minimise the condition number (default) or maximise log det of the information matrix")
    p.add_argument("--starts", type=int, default=4, help="random starts of SLSQP (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random starts")
    p.add_argument("--samples", type=int, default=None,
                   help="samples per period of the criterion and the constraints (default 40 x harmonics)")
    p.add_argument("--maxiter", type=int, default=100, help="SLSQP iterations per start (default 100)")
    p.add_argument("--acc-limit", type=float, default=None, metavar="RAD_S2",
                   help="joint acceleration limit [rad/s^2] (default the trajectory node's, 10)")
    p.add_argument("--floor-z", type=float, default=None, metavar="Z",
                   help="keep the end-effector frame at or above this height [m, base frame]")
    p.add_argument("--payload", action="store_true",
                   help="wrist-only excitation for payload identification: the last three joints move (four on a"
                   " spherical wrist, whose centre must move for the load's mass), the others are held (--hold);"
                   " criterion: the condition number of the payload regressor (10 parameters, the moving joints'"
                   " rows)")
    p.add_argument("--payload-frame", default=None, metavar="FRAME",
                   help="--payload: the frame the load is fixed to (default the end-effector frame)")
    p.add_argument("--hold", default=None, metavar="Q1,...,Qn",
                   help="configuration [rad] of the joints that do not move, one value per joint (default the middle"
                   " of each range, the trajectory node's q_center default)")
    p.add_argument("--self-collision", action=argparse.BooleanOptionalAction, default=None,
                   help="keep non-adjacent bodies --collision-margin apart (pinocchio + coal; SRDF pairs disabled);"
                   " default: on where collision geometry exists (the URDF's, example-robot-data's for panda)")
    p.add_argument("--collision-margin", type=float, default=0.01, metavar="M",
                   help="smallest distance between two non-adjacent bodies [m] (default 0.01)")
    p.add_argument("--collision-samples", type=int, default=40, metavar="K",
                   help="samples of the optimisation grid the self-collision constraint is imposed on (default 40;"
                   " the result is checked at 200 Hz)")
    p.add_argument("--out", required=True, help="output directory (created)")


def _robot_model(args):
    from ..dynamics import RobotModel  # lazy: the CLI starts fast
    from ..robot_setup import resolve_robot  # lazy: the CLI starts fast
    spec = resolve_robot(args.robot, ee_frame=args.ee_frame) if args.ee_frame else resolve_robot(args.robot)
    return RobotModel(spec.urdf, ee_frame=spec.ee_frame or None), spec


def run(args) -> dict:
    from ..trajectories.base import ACCELERATION_LIMIT  # lazy: the CLI parser imports this module
    from ..trajectories.excitation import (  # lazy: as above
        DEFAULT_FOURIER, default_fourier_condition, optimise_excitation)

    t0 = time.monotonic()
    model, spec = _robot_model(args)
    acc = ACCELERATION_LIMIT if args.acc_limit is None else float(args.acc_limit)
    if not (math.isfinite(acc) and acc > 0):
        raise ValueError(f"--acc-limit must be > 0, got {args.acc_limit}")
    joints = [j for j in (args.joints or "").split(",") if j] or None
    if args.payload and joints:
        raise ValueError("--payload moves the last three joints: drop --joints")
    hold = None
    if args.hold:
        try:
            hold = [float(x) for x in args.hold.split(",") if x.strip()]
        except ValueError:
            raise ValueError(f"--hold expects comma-separated numbers [rad], got {args.hold!r}") from None
    traj = optimise_excitation(model, duration=args.duration, harmonics=args.harmonics, joints=joints,
                               criterion=args.criterion, starts=args.starts, seed=args.seed,
                               floor_z=args.floor_z, samples=args.samples, acc_limit=acc, maxiter=args.maxiter,
                               payload=args.payload, payload_frame=args.payload_frame, q_hold=hold,
                               self_collision=args.self_collision, collision_margin=args.collision_margin,
                               collision_samples=args.collision_samples)
    N, cols = traj.info["samples"], traj.info["columns"]
    moving, rest = traj.info["moving_joints"], traj.info["q_hold"]
    rows = [model.joint_names.index(j) for j in moving] if args.payload else None   # as the criterion's
    default = default_fourier_condition(model, joints=moving, samples=N, acc_limit=acc, columns=cols, q_hold=rest,
                                        rows=rows)
    same = default_fourier_condition(model, traj.period, args.harmonics, joints=moving, samples=N,
                                     acc_limit=acc, columns=cols, q_hold=rest, rows=rows)
    os.makedirs(args.out, exist_ok=True)
    csv = os.path.join(args.out, "excitation.csv")
    extra = {
        "robot": spec.label, "default_condition_number": default,
        "condition_vs_default": traj.condition_number / default,
        "default_trajectory": dict(DEFAULT_FOURIER, period=1.0 / DEFAULT_FOURIER["base_frequency"],
                                   note="the trajectory node's default fourier excitation"
                                   + (" of the same joints (the others held alike)" if len(moving) < model.n else "")),
        "default_same_period_condition_number": same,
        "condition_vs_default_same_period": traj.condition_number / same,
        "files": {"csv": csv, "json": traj.sidecar(csv),
                  "png": _plot(os.path.join(args.out, "excitation.png"), traj, model, acc)},
        "wall_s": round(time.monotonic() - t0, 2)}
    traj.save(csv, extra=extra)
    return {**traj.to_dict(), **extra}


def _plot(path: str, traj, model, acc) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ts = np.linspace(0.0, traj.period, 2001)
    q, qd, _ = traj.sample_many(ts)
    n = traj.n
    fig, axes = plt.subplots(n, 2, figsize=(10, 1.6 * n + 1), sharex=True, squeeze=False)
    for j in range(n):
        ax = axes[j, 0]
        ax.plot(ts, q[:, j], lw=1)
        for lim in (model.lower[j], model.upper[j]):
            if np.isfinite(lim) and abs(lim) < 1e6:
                ax.axhline(lim, color="r", ls="--", lw=0.8)
        ax.set_ylabel(f"{model.joint_names[j]}\nq [rad]", fontsize=7)
        ax = axes[j, 1]
        ax.plot(ts, qd[:, j], lw=1, color="C1")
        for lim in (-model.velocity_limit[j], model.velocity_limit[j]):
            ax.axhline(lim, color="r", ls="--", lw=0.8)
        ax.set_ylabel("qd [rad/s]", fontsize=7)
    axes[-1, 0].set_xlabel("t [s]")
    axes[-1, 1].set_xlabel("t [s]")
    sc = traj.info.get("self_collision") or {}
    what = "payload excitation (payload regressor)" if traj.info.get("payload") else "excitation trajectory"
    fig.suptitle(f"{what}: cond = {traj.condition_number:.4g} (limits dashed; acceleration limit {acc:g} rad/s^2"
                 + (f"; closest bodies {sc['min_distance_m'] * 1e3:.0f} mm apart" if sc.get("checked") else "")
                 + ")", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics excite", description=DESCRIPTION)
    add_arguments(ap)
    return main_args(ap.parse_args(argv))


def main_args(args) -> int:
    """Run with parsed arguments; the JSON is the last line printed; 2 on bad input."""
    try:
        out = run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"excite: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(out, default=json_default))
    return 0


if __name__ == "__main__":
    sys.exit(main())

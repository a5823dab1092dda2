"""``adaptive-dynamics excite --robot R --out DIR``: an optimal excitation trajectory for
identification (no ROS import).

Optimises a periodic finite Fourier trajectory (Swevers et al. 1997; the formulation is in
:mod:`adaptive_dynamics.trajectories.excitation`) that minimises the condition number of the
stacked base regressor with viscous + Coulomb friction columns (``--criterion logdet``:
maximises log det of its information matrix) inside the joint position, velocity,
acceleration (``--acc-limit``) and effort limits, at rest at the start and end of the period,
optionally with the end effector above ``--floor-z``.

Writes to ``--out``: ``excitation.csv`` (time, ``<joint>/position``, ``<joint>/velocity``,
``<joint>/acceleration`` at 1 kHz over one period), ``excitation.json`` (coefficients,
``condition_number``, the trajectory node's default excitation's ``default_condition_number``,
``condition_vs_default`` = their ratio, ``margins``: the room left to every limit, min over the
period per joint) and ``excitation.png`` (q and qd per joint with the limits).  The JSON is the
last line printed.
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
                   help="the joints that move (default all); the others rest at the middle of their range")
    p.add_argument("--ee-frame", default=None, metavar="FRAME", help="URDF robot: the end-effector frame")
    p.add_argument("--duration", type=float, default=20.0, help="period of the trajectory [s] (default 20)")
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
    traj = optimise_excitation(model, duration=args.duration, harmonics=args.harmonics, joints=joints,
                               criterion=args.criterion, starts=args.starts, seed=args.seed,
                               floor_z=args.floor_z, samples=args.samples, acc_limit=acc, maxiter=args.maxiter)
    N, cols = traj.info["samples"], traj.info["columns"]
    default = default_fourier_condition(model, joints=joints, samples=N, acc_limit=acc, columns=cols)
    same = default_fourier_condition(model, args.duration, args.harmonics, joints=joints, samples=N,
                                     acc_limit=acc, columns=cols)
    os.makedirs(args.out, exist_ok=True)
    csv = os.path.join(args.out, "excitation.csv")
    extra = {
        "robot": spec.label, "default_condition_number": default,
        "condition_vs_default": traj.condition_number / default,
        "default_trajectory": dict(DEFAULT_FOURIER, period=1.0 / DEFAULT_FOURIER["base_frequency"],
                                   note="the trajectory node's default fourier excitation"),
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
    fig.suptitle(f"excitation trajectory: cond = {traj.condition_number:.4g} (limits dashed;"
                 f" acceleration limit {acc:g} rad/s^2)", fontsize=9)
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

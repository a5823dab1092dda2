"""`adaptive-dynamics` console entry point.

Sub-commands (``adaptive-dynamics <cmd> --help`` for each):

* ``demo``       the README's main job: Panda sim + trajectory + controller in lockstep
                 over DDS for a fixed sim time; per-joint tracking table, plots, bag.
* ``launch``     start a scenario's nodes as processes (pip path of ``ros2 launch``).
* ``selfcheck``  dynamics-core smoke run: every regressor against pinocchio's RNEA, the
                 filtered regressor against the filtered torque, base parameters, plot.
* ``info``       a robot's joints, limits, frames and parameter layout.
* ``experiment`` reproduce a paper's tables and figures (``experiment --list``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _cmd_info(args) -> int:
    from .dynamics import RobotModel

    rm = RobotModel(args.robot, friction=args.friction)
    print(f"robot {args.robot}: {rm.n} joints, {rm.n_params} parameters, end effector {rm.ee_frame!r}")
    print(f"URDF: {rm.urdf_path}")
    for j, name in enumerate(rm.joint_names):
        print(f"  {name:16s} link {rm.link_names[j]:16s} q in [{rm.lower[j]:+.3f}, {rm.upper[j]:+.3f}] rad,"
              f" |v| <= {rm.velocity_limit[j]:.3f} rad/s, |tau| <= {rm.effort_limit[j]:.1f} Nm")
    base = rm.base_parameters()
    print(f"base parameters: {base.n_base}")
    if args.verbose:
        for nm in base.names:
            print("  ", nm)
    return 0


def _cmd_demo(args) -> int:
    """Closed loop: MuJoCo bridge + trajectory + controller (+ recorder) in lockstep over
    DDS for a fixed sim time; then a per-joint tracking table and plots from the bag."""
    import numpy as np

    from .evaluation.bags import read_messages
    from .launch_graph import build_graph
    from .launcher import GraphProcess

    os.makedirs(args.out, exist_ok=True)
    bag = os.path.join(args.out, time.strftime("bag_%Y%m%d_%H%M%S"))
    stats_file = os.path.join(args.out, "bridge_stats.json")
    nodes = build_graph("sim", robot=args.robot, controller=args.controller, duration=args.duration,
                        record=True, bag=bag, overrides={"mujoco_bridge": {"stats_file": stats_file}})
    print(f"demo: {args.robot}, {args.controller}, lockstep, {args.duration:g} s sim time;"
          f" nodes {[s.name for s in nodes]}", flush=True)
    t0 = time.perf_counter()
    graph = GraphProcess(nodes, echo=args.verbose)
    rc, why = graph.wait(timeout=max(120.0, 30 * args.duration))
    if rc != 0:
        for name, lines in graph.logs.items():
            print(f"--- {name} (last lines)", file=sys.stderr)
            print("\n".join(lines[-10:]), file=sys.stderr)
        print(f"demo: {why}", file=sys.stderr)
        return rc
    wall = time.perf_counter() - t0
    states, refs, names = {}, {}, None
    for topic, _, msg in read_messages(bag, ["/joint_states", "/reference"]):
        if topic == "/joint_states":
            t = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
            states[t] = (np.asarray(msg.position), np.asarray(msg.effort))
            names = names or list(msg.name)
        else:
            t0r = msg.header.stamp.sec * 10**9 + msg.header.stamp.nanosec
            for pt in msg.points:
                refs[t0r + pt.time_from_start.sec * 10**9 + pt.time_from_start.nanosec] = np.asarray(pt.positions)
    ts = np.array(sorted(t for t in states if t in refs))
    Q = np.array([states[t][0] for t in ts])
    QD = np.array([refs[t] for t in ts])
    TAU = np.array([states[t][1] for t in ts])
    E = QD - Q
    rmse = np.sqrt(np.mean(E ** 2, axis=0))
    emax = np.abs(E).max(axis=0)
    tsec = ts * 1e-9
    with open(stats_file) as fh:
        stats = json.load(fh)
    print(f"\n{'joint':16s} {'RMSE [rad]':>11s} {'max |e| [rad]':>14s} {'RMS tau [Nm]':>13s}")
    for j, nm in enumerate(names):
        print(f"{nm:16s} {rmse[j]:11.5f} {emax[j]:14.5f} {np.sqrt(np.mean(TAU[:, j] ** 2)):13.3f}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = len(names)
    fig, axes = plt.subplots(n, 1, figsize=(10, 1.6 * n + 1), sharex=True)
    for j, ax in enumerate(np.atleast_1d(axes)):
        ax.plot(tsec, QD[:, j], "k--", lw=1, label="reference")
        ax.plot(tsec, Q[:, j], lw=1, label="measured")
        ax.set_ylabel(names[j].split("_")[-1], fontsize=8)
    np.atleast_1d(axes)[0].legend(loc="upper right", fontsize=7)
    np.atleast_1d(axes)[-1].set_xlabel("sim time [s]")
    fig.suptitle(f"{args.robot}: {args.controller} tracking (lockstep MuJoCo, unmodelled friction)")
    fig.tight_layout()
    p1 = os.path.join(args.out, "tracking.png")
    fig.savefig(p1, dpi=100)
    fig, ax = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    ax[0].plot(tsec, E, lw=0.8)
    ax[0].set_ylabel("q_d - q [rad]")
    ax[0].legend(names, fontsize=6, ncol=4)
    ax[1].plot(tsec, TAU, lw=0.8)
    ax[1].set_ylabel("measured torque [Nm]")
    ax[1].set_xlabel("sim time [s]")
    fig.tight_layout()
    p2 = os.path.join(args.out, "errors_torques.png")
    fig.savefig(p2, dpi=100)
    summary = {"robot": args.robot, "controller": args.controller, "sim_time_s": float(tsec[-1] + 1e-3),
               "wall_time_s": round(wall, 2), "steps": int(stats.get("plant_steps", 0)),
               "sim_per_wall": round(stats.get("sim_per_wall", 0.0), 3),
               "lockstep_timeouts": int(stats.get("lockstep_timeouts", 0)),
               "rmse_rad": dict(zip(names, np.round(rmse, 6).tolist())),
               "max_error_rad": dict(zip(names, np.round(emax, 6).tolist())),
               "bag": bag, "plots": [p1, p2]}
    with open(os.path.join(args.out, "demo.json"), "w") as fh:
        json.dump(summary, fh, indent=2)
    print(f"\nbag: {bag}\nplots: {p1}, {p2}")
    print(json.dumps(summary))
    return 0


def _cmd_selfcheck(args) -> int:
    import numpy as np

    from .dynamics import RobotModel

    t0 = time.perf_counter()
    rm = RobotModel(args.robot)
    rng = np.random.default_rng(args.seed)
    pi = rm.parameters
    worst = {"standard": 0.0, "slotine_li": 0.0}
    for _ in range(200):
        q, v, a = rm.random_state(rng)
        vr, ar = rng.standard_normal(rm.n), rng.standard_normal(rm.n)
        tau = rm.inverse_dynamics(q, v, a)
        worst["standard"] = max(worst["standard"], float(np.abs(rm.regressor(q, v, a) @ pi - tau).max()))
        expect = rm.mass_matrix(q) @ ar + rm.coriolis_matrix(q, v) @ vr + rm.gravity(q)
        worst["slotine_li"] = max(worst["slotine_li"],
                                  float(np.abs(rm.slotine_li_regressor(q, v, vr, ar) @ pi - expect).max()))
    # filtered regressor along a smooth trajectory vs the filtered torque
    dt, lam, T = 1e-3, 20.0, 3.0
    c = 0.5 * (rm.lower + rm.upper)
    amp = 0.3 * np.minimum(rm.upper - rm.lower, 2.0)
    w = np.linspace(0.6, 1.8, rm.n)
    F = rm.filtered_regressor(lam, dt)
    ts = np.arange(0.0, T, dt)
    Wpi, tauf = np.empty((ts.size, rm.n)), np.empty((ts.size, rm.n))
    for k, t in enumerate(ts):
        q = c + amp * np.sin(w * t)
        v = amp * w * np.cos(w * t)
        a = -amp * w ** 2 * np.sin(w * t)
        W, tf = F.update(q, v, rm.inverse_dynamics(q, v, a))
        Wpi[k], tauf[k] = W @ pi, tf
    worst["filtered"] = float(np.abs(Wpi - tauf).max())
    base = rm.base_parameters()
    summary = {"robot": args.robot, "dof": rm.n, "parameters": rm.n_params, "base_parameters": base.n_base,
               "max_abs_error_Nm": worst, "filtered_rms_Nm": float(np.sqrt(np.mean(tauf ** 2))),
               "seconds": round(time.perf_counter() - t0, 2)}
    os.makedirs(args.out, exist_ok=True)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for j in range(rm.n):
        axes[0].plot(ts, tauf[:, j], label=rm.joint_names[j])
        axes[1].plot(ts, Wpi[:, j] - tauf[:, j])
    axes[0].set_ylabel("filtered torque [Nm]")
    axes[0].legend(ncol=4, fontsize=7)
    axes[1].set_ylabel("W pi - filtered torque [Nm]")
    axes[1].set_xlabel("t [s]")
    fig.suptitle(f"{args.robot}: filtered regressor (lambda = {lam}/s, h = {dt * 1e3:.0f} ms)")
    fig.tight_layout()
    png = os.path.join(args.out, "filtered_regressor.png")
    fig.savefig(png, dpi=110)
    summary["plot"] = png
    with open(os.path.join(args.out, "selfcheck.json"), "w") as fh:
        json.dump(summary, fh, indent=2)
    print(f"{args.robot}: {rm.n} DoF, {rm.n_params} inertial parameters, {base.n_base} base parameters")
    print(f"  |Y pi - rnea|            max {worst['standard']:.2e} Nm")
    print(f"  |Y_SL pi - (M ar+C vr+g)| max {worst['slotine_li']:.2e} Nm")
    print(f"  |W pi - filtered torque| max {worst['filtered']:.2e} Nm (O(h^2) discretisation)")
    print(f"  plot: {png}")
    print(json.dumps(summary))
    ok = worst["standard"] < 1e-8 and worst["slotine_li"] < 1e-8 and worst["filtered"] < 1e-2
    return 0 if ok else 1


def _add_graph_args(p, *, sim_default=True) -> None:
    from .launch_graph import CONTROLLERS, LEARNERS, MODES, REAL_PRESETS
    from .robots import ROBOT_NAMES
    p.add_argument("--robot", default="panda", choices=ROBOT_NAMES)
    p.add_argument("--controller", default="computed_torque", choices=CONTROLLERS)
    p.add_argument("--learner", default="none", choices=LEARNERS)
    p.add_argument("--mode", default="lockstep", choices=MODES, help="sim: lockstep (deterministic) or realtime")
    p.add_argument("--duration", type=float, default=0.0, help="sim: stop after this many sim seconds (0 = run)")
    p.add_argument("--record", action="store_true", help="also record an MCAP bag (see --bag)")
    p.add_argument("--bag", default=None, help="bag directory (must not exist)")
    p.add_argument("--namespace", default="", help="namespace of every node and topic")
    p.add_argument("--preset", default="franka", choices=sorted(REAL_PRESETS), help="real: robot stack")
    p.add_argument("--use-sim-time", default=None, choices=["true", "false"])
    p.add_argument("--set", action="append", default=[], metavar="NODE.PARAM=VALUE",
                   help="parameter override, e.g. --set controller.kp=[200.0] (YAML value)")


def _overrides(items) -> dict:
    import yaml
    out: dict = {}
    for item in items:
        key, sep, val = item.partition("=")
        node, dot, param = key.partition(".")
        if not sep or not dot:
            raise ValueError(f"--set expects NODE.PARAM=VALUE, got {item!r}")
        out.setdefault(node, {})[param] = yaml.safe_load(val)
    return out


def _graph_from_args(args, scenario):
    from .launch_graph import build_graph
    ust = None if args.use_sim_time is None else args.use_sim_time == "true"
    return build_graph(scenario, robot=args.robot, controller=args.controller, learner=args.learner,
                       use_sim_time=ust, record=args.record, mode=args.mode, duration=args.duration,
                       namespace=args.namespace, preset=args.preset, bag=args.bag,
                       overrides=_overrides(args.set))


def _cmd_launch(args) -> int:
    from .launcher import run_graph
    nodes = _graph_from_args(args, args.scenario)
    print("[launch] " + ", ".join(f"{s.name} ({s.executable})" for s in nodes), flush=True)
    return run_graph(nodes)


def _cmd_experiment(args) -> int:
    from .experiments import EXPERIMENTS, run

    if args.list or not args.name:
        for name, (_, what) in EXPERIMENTS.items():
            print(f"{name:12s} {what}")
        return 0
    return run(args.name, args.rest)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics",
                                 description="Learn a torque-controlled robot's dynamics online while controlling it.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("demo", help="the main job: closed-loop lockstep simulation, tracking table, plots, bag")
    p.add_argument("--robot", default="panda", help="panda | iiwa14 | planar2 (default panda)")
    p.add_argument("--controller", default="computed_torque", help="pd | computed_torque")
    p.add_argument("--duration", type=float, default=10.0, help="sim seconds (default 10)")
    p.add_argument("--out", default="out/demo", help="directory for the bag, plots and demo.json")
    p.add_argument("-v", "--verbose", action="store_true", help="forward the nodes' logs")
    p.set_defaults(fn=_cmd_demo)
    p = sub.add_parser("selfcheck", help="dynamics-core smoke run (regressors vs RNEA, filtered regressor)")
    p.add_argument("--robot", default="panda", help="panda | iiwa14 | planar2 (default panda)")
    p.add_argument("--out", default="out/selfcheck", help="directory for the plot and JSON summary")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_cmd_selfcheck)
    p = sub.add_parser("launch", help="start a scenario's nodes as processes (pip path of ros2 launch)")
    p.add_argument("scenario", choices=["sim", "real"], help="sim: MuJoCo bridge + trajectory + controller;"
                   " real: trajectory + controller against a ros2_control robot")
    _add_graph_args(p)
    p.set_defaults(fn=_cmd_launch)
    p = sub.add_parser("info", help="joints, limits and parameter layout of a robot")
    p.add_argument("robot", nargs="?", default="panda")
    p.add_argument("--friction", action="store_true", help="include friction parameters")
    p.add_argument("-v", "--verbose", action="store_true", help="list the base-parameter combinations")
    p.set_defaults(fn=_cmd_info)
    p = sub.add_parser("experiment", help="reproduce a paper's tables and figures (--out DIR; JSON last line)",
                       description="adaptive-dynamics experiment NAME --out DIR [--quick] [...];"
                       " `adaptive-dynamics experiment NAME --help` lists an experiment's options")
    p.add_argument("name", nargs="?", help="experiment name (see --list)")
    p.add_argument("rest", nargs=argparse.REMAINDER, help="the experiment's own arguments")
    p.add_argument("--list", action="store_true", help="list the experiments")
    p.set_defaults(fn=_cmd_experiment)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"adaptive-dynamics {args.cmd}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

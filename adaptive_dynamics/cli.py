"""`adaptive-dynamics` console entry point.

Sub-commands (``adaptive-dynamics <cmd> --help`` for each):

* ``demo``       the README's main job: Panda sim + trajectory + controller in lockstep
                 over DDS for a fixed sim time; per-joint tracking table, plots, bag.
* ``launch``     start a scenario's nodes as processes (pip path of ``ros2 launch``).
* ``selfcheck``  dynamics-core smoke run: every regressor against pinocchio's RNEA, the
                 filtered regressor against the filtered torque, base parameters, plot.
* ``info``       a robot's joints, limits, frames and parameter layout.
* ``experiment`` reproduce a paper's tables and figures (``experiment --list``).
* ``record``     record live topics into an MCAP rosbag2 with the recorder node (counts,
                 bag path).
* ``replay``     republish a bag over DDS at real or scaled time with ``/clock`` from the
                 bag (counts, wall time, achieved rate); with ``--learner gmm|rbfn|gp``
                 instead evaluate a residual learner offline on the bag, without DDS
                 (prequential nMSE per joint over time, PNG + JSON in ``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time


def _cmd_info(args) -> int:
    import numpy as np

    from .dynamics import RobotModel  # lazy: the CLI starts fast

    spec = _robot_spec(args)
    rm = RobotModel(spec.urdf, ee_frame=spec.ee_frame or None, friction=args.friction)
    print(f"robot {spec.label}: {rm.n} joints, {rm.n_params} parameters, end effector {rm.ee_frame!r}"
          + (f" (end-effector bodies {rm.end_effector_links})" if rm.end_effector_links else ""))
    from .control.gains import DEFAULT_DT, gain_margins  # lazy: the CLI starts fast
    from .robots import armature  # lazy: the CLI starts fast
    from .robot_setup import controller_gains  # lazy: the CLI starts fast
    name = spec.label if spec.shipped else spec.urdf     # what the parameter file is found by
    ia = armature(name)
    kd = controller_gains(name).get("kd")
    print(f"URDF: {rm.urdf_path}\nparameter file: {spec.config}")
    print("armature: the drive inertia the parameter file states (simulator and gains; URDFs carry none)"
          + ("" if np.any(ia) else ": none stated"))
    margin = gain_margins(rm, kd, DEFAULT_DT, ia) if kd and len(kd) in (1, rm.n) else None
    for j, name in enumerate(rm.joint_names):
        pos = "continuous (one angle, no position limit)" if rm.continuous[j] else \
            f"q in [{rm.lower[j]:+.3f}, {rm.upper[j]:+.3f}] rad"
        print(f"  {name:16s} link {rm.link_names[j]:16s} {pos},"
              f" |v| <= {rm.velocity_limit[j]:.3f} rad/s, |tau| <= {rm.effort_limit[j]:.1f} Nm,"
              f" armature {ia[j]:.4g} kg m^2" + ("" if margin is None else
                                                 f", K_D {np.broadcast_to(kd, (rm.n,))[j]:.4g} (K_D dt/m {margin[j]:.3f}"
                                                 " at 1 kHz)"))
    base = rm.base_parameters()
    print(f"base parameters: {base.n_base}")
    if args.verbose:
        for nm in base.names:
            print("  ", nm)
    return 0


def _cmd_demo(args) -> int:
    """Without ``--controller``: the learning demo (before and after,
    :mod:`~adaptive_dynamics.experiments.learning_demo`).  With it: closed loop of MuJoCo
    bridge + trajectory + that controller (+ recorder) in lockstep over DDS for a fixed
    sim time; then a per-joint tracking table and plots from the bag."""
    import numpy as np

    if args.controller is None:
        from .experiments import learning_demo  # lazy: the CLI starts fast
        kw = {} if args.learning_periods is None else {"learning_periods": args.learning_periods}
        try:
            summary = learning_demo.run(args.robot, args.out, overrides=_overrides(args.set), echo=args.verbose,
                                        joints=[j for j in (args.joints or "").split(",") if j] or None,
                                        ee_frame=args.ee_frame, **kw)
        except KeyboardInterrupt:
            print("demo: interrupted; nodes stopped", file=sys.stderr)
            return 130
        except RuntimeError as exc:
            print(f"demo: {exc}", file=sys.stderr)
            return 1
        print(f"\nbag: {summary['bag']}\nplots: {', '.join(summary['plots'])}")
        print(json.dumps(summary))
        return 0

    from .evaluation.bags import controller_saturation, diagnostic_value, watchdog_trips  # lazy: the CLI starts fast
    from .evaluation.streams import read_streams  # lazy: the CLI starts fast
    from .scenarios import build_graph  # lazy: the CLI starts fast
    from .robot_setup import resolve_robot  # lazy: the CLI starts fast
    from .launcher import GraphFailed, run_to_end  # lazy: the CLI starts fast

    os.makedirs(args.out, exist_ok=True)
    bag = os.path.join(args.out, time.strftime("bag_%Y%m%d_%H%M%S"))
    stats_file = os.path.join(args.out, "bridge_stats.json")
    overrides = _overrides(args.set)
    overrides.setdefault("mujoco_bridge", {})["stats_file"] = stats_file
    joints = [j for j in (args.joints or "").split(",") if j] or None
    nodes = build_graph("sim", robot=args.robot, joints=joints,
                        ee_frame=args.ee_frame, controller=args.controller, duration=args.duration,
                        record=True, bag=bag, overrides=overrides)
    print(f"demo: {args.robot}, {args.controller}, lockstep, {args.duration:g} s sim time;"
          f" nodes {[s.name for s in nodes]}", flush=True)
    try:  # every way out stops the nodes and removes the launch's temporary files
        wall = run_to_end(nodes, timeout=max(120.0, 30 * args.duration), echo=args.verbose, tail=10).wall_s
    except KeyboardInterrupt:
        print("demo: interrupted; nodes stopped", file=sys.stderr)
        return 130
    except GraphFailed as exc:
        for name, lines in exc.logs.items():
            print(f"--- {name} (last lines)", file=sys.stderr)
            print("\n".join(lines), file=sys.stderr)
        print(f"demo: {exc.why}", file=sys.stderr)
        return exc.code
    names = list(resolve_robot(args.robot, joints, args.ee_frame).joint_names)
    st, ref = read_streams(bag, names).referenced()
    ts, Q, QD, TAU = st.t_ns, st.position, ref.q, st.effort
    E = QD - Q
    rmse = np.sqrt(np.mean(E ** 2, axis=0))
    emax = np.abs(E).max(axis=0)
    tsec = ts * 1e-9
    with open(stats_file) as fh:
        stats = json.load(fh)
    trips = watchdog_trips(bag)
    if trips:
        why = [v for v in diagnostic_value(bag, "watchdog") if v.startswith("TRIPPED")]
        print(f"demo: the controller's watchdog tripped {trips}x ({why[-1] if why else 'see its log'}); the rest of"
              " the run is its safe command", file=sys.stderr)
    print(f"\n{'joint':16s} {'RMSE [rad]':>11s} {'max |e| [rad]':>14s} {'RMS tau [Nm]':>13s}")
    for j, nm in enumerate(names):
        print(f"{nm:16s} {rmse[j]:11.5f} {emax[j]:14.5f} {np.sqrt(np.mean(TAU[:, j] ** 2)):13.3f}")
    from .experiments.learning_demo import tracking_plots  # lazy: the CLI starts fast
    p1, p2 = tracking_plots(args.out, f"{args.robot}: {args.controller} tracking (lockstep MuJoCo, unmodelled friction)",
                            names, tsec, Q, QD, TAU)
    summary = {"robot": args.robot, "controller": args.controller, "sim_time_s": float(tsec[-1] + 1e-3),
               "wall_time_s": round(wall, 2), "steps": int(stats.get("plant_steps", 0)),
               "sim_per_wall": round(stats.get("sim_per_wall", 0.0), 3),
               "lockstep_timeouts": int(stats.get("lockstep_timeouts", 0)), "watchdog_trips": trips,
               "saturated_cycles": controller_saturation(bag) or [int(x) for x in stats.get("saturation_count", [])],
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

    from .dynamics import RobotModel  # lazy: the CLI starts fast

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


def _add_robot_args(p) -> None:
    p.add_argument("--robot", default="panda", help="a shipped robot (panda | iiwa14 | planar2) or a URDF file"
                   " (default panda)")
    p.add_argument("--joints", default=None, metavar="J1,J2,...", help="URDF robot: the joints to control"
                   " (default: every moving joint; the others, e.g. a gripper's, are locked at 0)")
    p.add_argument("--ee-frame", default=None, metavar="FRAME", help="URDF robot: the end-effector frame"
                   " (default: the URDF's last link)")


def _robot_spec(args):
    from .robot_setup import resolve_robot  # lazy: the CLI starts fast
    joints = [j for j in (args.joints or "").split(",") if j] or None
    return resolve_robot(args.robot, joints, args.ee_frame)


def _add_graph_args(p, *, sim_default=True) -> None:
    from .scenarios import CONTROLLERS, LEARNERS, MODES, REAL_PRESETS  # lazy: the CLI starts fast
    _add_robot_args(p)
    p.add_argument("--controller", default="computed_torque", choices=CONTROLLERS,
                   help="pd | computed_torque (node controller) | direct | composite (adaptive_controller) |"
                   " scqp (scqp_controller: the end effector on task_reference, the trajectory in task space) |"
                   " backstepping (adaptive_controller's task-space law on task_reference, from the URDF's model)")
    p.add_argument("--learner", default="none", choices=LEARNERS)
    p.add_argument("--learner-split", action="store_true", help="run the learner as model_update + prediction"
                   " (the PGPOL prediction / model-update split) instead of residual_learner")
    p.add_argument("--mode", default="lockstep", choices=MODES, help="sim: lockstep (deterministic) or realtime")
    p.add_argument("--duration", type=float, default=0.0, help="sim: stop after this many sim seconds; real: after"
                   " this many wall seconds, whether or not a robot answers (0 = run until Ctrl-C)")
    p.add_argument("--record", action="store_true", help="also record an MCAP bag (see --bag)")
    p.add_argument("--monitor", action="store_true", help="add the external_torque node: external joint torques,"
                   " end-effector wrench and contact flag from the momentum observer (launch monitor:=true); its"
                   " calibration (--set external_torque.calibrate=S) first turns the graph's learning off")
    p.add_argument("--bag", default=None, help="bag directory (must not exist)")
    p.add_argument("--namespace", default="", help="namespace of every node and topic")
    p.add_argument("--preset", default="franka", choices=sorted(REAL_PRESETS), help="real: robot stack")
    p.add_argument("--use-sim-time", default=None, choices=["true", "false"])
    p.add_argument("--without", action="append", default=[], metavar="NODE",
                   help="do not start this node of the graph here (it runs on another host); repeatable")
    p.add_argument("--set", action="append", default=[], metavar="NODE.PARAM=VALUE",
                   help="parameter override, e.g. --set controller.kp=[200.0] (YAML value)")


def _overrides(items) -> dict:
    from .scenarios import parse_overrides  # lazy: the CLI starts fast
    return parse_overrides(items)


def _graph_from_args(args, scenario):
    from .scenarios import build_graph  # lazy: the CLI starts fast
    ust = None if args.use_sim_time is None else args.use_sim_time == "true"
    return build_graph(scenario, robot=args.robot, joints=[j for j in (args.joints or "").split(",") if j] or None,
                       ee_frame=args.ee_frame, controller=args.controller, learner=args.learner,
                       learner_split=args.learner_split, use_sim_time=ust, record=args.record, mode=args.mode,
                       duration=args.duration, namespace=args.namespace, preset=args.preset, bag=args.bag,
                       overrides=_overrides(args.set), without=tuple(args.without), monitor=args.monitor)


def _cmd_launch(args) -> int:
    from .launcher import run_graph  # lazy: the CLI starts fast
    nodes = _graph_from_args(args, args.scenario)
    print("[launch] " + ", ".join(f"{s.name} ({s.executable})" for s in nodes), flush=True)
    if args.scenario == "real" and args.duration > 0:   # wall seconds: a robot that never answers cannot hold it
        return run_graph(nodes, timeout=args.duration, timeout_ok=True)
    return run_graph(nodes)


def _cmd_experiment(args) -> int:
    from .experiments import EXPERIMENTS, run  # lazy: the CLI starts fast

    if args.list or not args.name:
        for name, (_, what) in EXPERIMENTS.items():
            print(f"{name:12s} {what}")
        return 0
    return run(args.name, args.rest)


# topics `record` subscribes to by default (every topic the recorder node knows the type
# of; a topic without publisher yet is recorded once one appears, else stays empty)
RECORD_TOPICS = ["joint_states", "effort_controller/commands", "reference", "task_reference", "/clock",
                 "/diagnostics", "controller/tracking_error", "adaptive/parameters", "adaptive/parameter_update",
                 "adaptive/parametric_torque", "feedforward/residual"]
_INFRA_TOPICS = {"/rosout", "/parameter_events"}


def _relative_topic(name: str, namespace: str) -> str:
    """The recorder's (namespace-relative) name for a topic given absolute or relative."""
    if name in ("/clock", "/diagnostics") or not name.startswith("/"):
        return name
    prefix = f"/{namespace.strip('/')}/" if namespace.strip("/") else "/"
    return name[len(prefix):] if name.startswith(prefix) else name


def _stop_event():
    """SIGINT/SIGTERM set an event (installed after rclpy.init without its handlers)."""
    import signal
    import threading
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    return stop


def _cmd_record(args) -> int:
    """Record live topics into an MCAP rosbag2 with the ``recorder`` node, run in this
    process: the configured topics (default :data:`RECORD_TOPICS`) plus the topics
    discovered at start whose type the recorder knows.  Stops on Ctrl-C/SIGTERM or after
    ``--duration`` wall seconds; the bag is closed (metadata.yaml written) either way."""
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.signals import SignalHandlerOptions

    from .evaluation.bags import bag_info, ros_type_name  # lazy: the CLI starts fast
    from .nodes.recorder import RecorderNode, _msg_class  # lazy: the CLI starts fast
    from .ros.params import to_parameters  # lazy: the CLI starts fast

    if args.duration < 0 or args.discovery < 0:
        raise ValueError("--duration and --discovery must be >= 0")
    out = args.out or time.strftime("bags/rec_%Y%m%d_%H%M%S")
    if os.path.exists(out):
        raise ValueError(f"bag directory {out!r} already exists; choose a new --out")
    ns = args.namespace.strip("/")
    explicit = [_relative_topic(t, ns) for t in (args.topics or [])]
    unknown = [t for t in explicit if _msg_class(t) is None]
    if unknown:
        raise ValueError(f"no known message type for {unknown} (the recorder types topics by name);"
                         f" recordable: {RECORD_TOPICS}")
    rclpy.init(args=["--ros-args"], signal_handler_options=SignalHandlerOptions.NO)
    stop = _stop_event()
    node = executor = None
    try:
        probe = rclpy.create_node("_record_probe", namespace=ns or None)
        # discovery: at least --discovery s, then until the graph looks settled (no change
        # for 1 s and some topic seen); a loaded machine discovers participants slowly
        t0 = time.monotonic()
        t_max = t0 + max(3 * args.discovery, args.discovery + 4.0)
        last, stable_since = None, t0
        while not stop.is_set():
            now = time.monotonic()
            discovered = dict(probe.get_topic_names_and_types())
            snap = (frozenset(discovered), probe.count_publishers("/clock"))
            if snap != last:
                last, stable_since = snap, now
            seen = set(discovered) - _INFRA_TOPICS
            # auto sim time: a /clock that has subscribers (nodes on sim time) but no publisher
            # yet is a bridge or replay not discovered yet; wait for it up to t_max
            clock_pending = (args.use_sim_time == "auto" and "/clock" in discovered and snap[1] == 0)
            if now >= t_max or (now >= t0 + args.discovery and seen and not clock_pending
                                and now - stable_since >= 1.0):
                break
            time.sleep(0.05)
        clock_pubs = probe.count_publishers("/clock")
        probe.destroy_node()
        topics = list(dict.fromkeys(explicit or RECORD_TOPICS))
        skipped = {}
        if not explicit:
            for name, types in sorted(discovered.items()):
                rel = _relative_topic(name, ns)
                cls = _msg_class(rel)
                if cls is not None and ros_type_name(cls) in types:
                    if rel not in topics:
                        topics.append(rel)
                elif name not in _INFRA_TOPICS:
                    skipped[name] = ",".join(types)
        for t in topics:  # a known name published with another type would never match
            types = discovered.get(_absolute(t, ns), [])
            if types and ros_type_name(_msg_class(t)) not in types:
                skipped[_absolute(t, ns)] = ",".join(types)
        wrong = {_absolute(t, ns): skipped[_absolute(t, ns)] for t in explicit if _absolute(t, ns) in skipped}
        if wrong:
            raise ValueError(f"published with another type than the recorder knows: {wrong}")
        topics = [t for t in topics if _absolute(t, ns) not in skipped]
        use_sim_time = clock_pubs > 0 if args.use_sim_time == "auto" else args.use_sim_time == "true"
        if skipped:
            print(f"record: not recording {skipped} (message type not known to the recorder)", file=sys.stderr)
        node = RecorderNode(namespace=ns or None, parameter_overrides=to_parameters(
            {"bag": out, "topics": topics, "use_sim_time": use_sim_time}))
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        print(f"record: {node.writer.path} <- {[_absolute(t, ns) for t in topics]}"
              f" (use_sim_time {use_sim_time}); " + (f"{args.duration:g} s" if args.duration else "Ctrl-C to stop"),
              flush=True)
        t0 = time.monotonic()
        t_end = t0 + args.duration if args.duration > 0 else float("inf")
        while not stop.is_set() and time.monotonic() < t_end and rclpy.ok():
            executor.spin_once(timeout_sec=min(0.1, max(0.0, t_end - time.monotonic())))
        wall = time.monotonic() - t0
        node.writer.close()
    finally:
        if executor is not None:
            executor.shutdown(timeout_sec=1.0)
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    info = bag_info(out)
    print(f"\n{'topic':36s} {'type':36s} {'messages':>9s}")
    for topic, (msgtype, count) in info["topics"].items():
        print(f"{topic:36s} {msgtype:36s} {count:9d}")
    print(f"\nbag: {out} ({info['messages']} messages, {info['duration_s']:.3f} s of bag time,"
          f" {wall:.2f} s wall)")
    print(json.dumps({"bag": str(out), "counts": {t: c for t, (_, c) in info["topics"].items()},
                      "messages": info["messages"], "bag_duration_s": round(info["duration_s"], 4),
                      "wall_s": round(wall, 3), "use_sim_time": use_sim_time, "skipped": skipped}))
    return 0


def _absolute(topic: str, namespace: str) -> str:
    if topic.startswith("/"):
        return topic
    return f"/{namespace.strip('/')}/{topic}" if namespace.strip("/") else f"/{topic}"


_OFFLINE_OPTIONS = ("out", "robot", "decimation", "acceleration", "target", "window", "block", "transform",
                    "save_model", "learner_config", "region_radius")
_DDS_OPTIONS = {"fast": "--fast", "topics": "--topics", "no_clock": "--no-clock", "loop": "--loop",
                "wait_for_subscribers": "--wait-for-subscribers", "remap": "--remap"}


def _cmd_replay_offline(args) -> int:
    """``replay BAG --learner KIND``: offline prequential evaluation of a residual learner
    (``evaluation.offline``, no DDS, no rclpy): per-joint table, JSON last line."""
    from .evaluation.offline import DEFAULTS, evaluate_learner, format_table  # lazy: the CLI starts fast

    used = [flag for key, flag in _DDS_OPTIONS.items()
            if getattr(args, key) is not None and (key == "wait_for_subscribers" or getattr(args, key))]
    if args.rate != 1.0:
        used.append("--rate")
    if used:
        raise ValueError(f"{', '.join(used)}: only for the DDS replay, not with --learner (offline evaluation)")
    cfg = None
    if args.learner_config:
        try:
            cfg = json.loads(args.learner_config)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--learner-config is not valid JSON ({exc})") from None
        if not isinstance(cfg, dict):
            raise ValueError("--learner-config must be a JSON object of constructor arguments, e.g."
                             " '{\"n_basis\": 1024}'")

    def opt(value, key):
        return DEFAULTS[key] if value is None else value

    res = evaluate_learner(args.bag, args.learner, robot=args.robot, learner_config=cfg,
                           decimation=opt(args.decimation, "decimation"),
                           acceleration=opt(args.acceleration, "acceleration"), target=opt(args.target, "target"),
                           window_s=opt(args.window, "window_s"),
                           block=args.block if args.block is not None else (
                               DEFAULTS["update_block"] if args.learner in ("pgpol", "sgpol") else DEFAULTS["block"]),
                           transform=args.transform, out_dir=args.out or "replay_eval", model_out=args.save_model,
                           **({} if args.region_radius is None else {"region_radius": args.region_radius}))
    print(format_table(res))
    print(json.dumps(res))
    return 0


def _cmd_replay(args) -> int:
    """Republish a bag over DDS (``nodes.replay``): summary table, JSON last line.
    With ``--learner``: the offline evaluation instead (before any rclpy import)."""
    if args.learner is not None:
        return _cmd_replay_offline(args)
    given = [f"--{k.replace('_', '-')}" for k in _OFFLINE_OPTIONS if getattr(args, k) not in (None, False)]
    if given:
        raise ValueError(f"{', '.join(given)}: only with --learner KIND (offline learner evaluation)")
    import rclpy
    from rclpy.signals import SignalHandlerOptions

    from .nodes.replay import ReplayNode, _match_topic, plan_replay  # lazy: the CLI starts fast
    from .ros.params import to_parameters  # lazy: the CLI starts fast

    rate = 0.0 if args.fast else args.rate
    if not (0.0 <= rate <= 1000.0):
        raise ValueError(f"--rate must be in [0, 1000] (0 = as fast as possible), got {args.rate}")
    if args.wait_timeout < 0:
        raise ValueError("--wait-timeout must be >= 0")
    ros_args = ["--ros-args"]
    for item in args.remap:
        a, sep, b = item.partition(":=")
        if not sep or not a or not b:
            raise ValueError(f"--remap expects FROM:=TO, got {item!r}")
        ros_args += ["-r", item]
    plan = plan_replay(args.bag, args.topics, clock=not args.no_clock, clock_rate=args.clock_rate)
    for t in args.wait_for_subscribers or []:
        _match_topic(t, plan.published_topics, "replayed")  # ValueError with the reason
    rclpy.init(args=ros_args, signal_handler_options=SignalHandlerOptions.NO)
    stop = _stop_event()
    node = None
    try:
        node = ReplayNode(parameter_overrides=to_parameters({
            "bag": str(plan.bag), "rate": rate, "topics": list(plan.topics) or [""],
            "clock": not args.no_clock, "clock_rate": args.clock_rate, "loop": args.loop,
            "wait_for_subscribers": args.wait_for_subscribers is not None,
            "wait_topics": list(args.wait_for_subscribers or []) or [""], "wait_timeout": args.wait_timeout}))
        res = node.play(stop.is_set)
    finally:
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    print(f"\n{'topic':36s} {'type':36s} {'published':>9s} {'recorded':>9s}")
    for topic, count in res.counts.items():
        msgtype = plan.topics.get(topic, "rosgraph_msgs/msg/Clock (generated)")
        print(f"{topic:36s} {msgtype:36s} {count:9d} {plan.counts.get(topic, 0):9d}")
    for topic in plan.empty:
        print(f"{topic:36s} {'(no messages: not published)':36s} {0:9d} {0:9d}")
    d = res.as_dict()
    ach = "max" if d["achieved_rate"] is None else f"{d['achieved_rate']:.3f}"
    print(f"\n{d['messages']} messages, {d['bag_s']:.3f} s of bag in {d['wall_s']:.3f} s wall: achieved rate"
          f" {ach} (requested {'max' if rate == 0 else f'{rate:g}'}), max lag {d['max_lag_ms']:.1f} ms"
          f"{', interrupted' if res.interrupted else ''}")
    if res.unconfirmed:
        print(f"replay: reliable subscribers of {res.unconfirmed} had not acknowledged every message at the"
              " end (slow or gone readers may have missed the tail)", file=sys.stderr)
    print(json.dumps({"bag": str(plan.bag), "clock": plan.clock, **d,
                      **({"truncated": plan.recovered} if plan.recovered else {})}))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .scenarios import JOINT_CONTROLLERS  # lazy: the CLI starts fast

    ap = argparse.ArgumentParser(prog="adaptive-dynamics",
                                 description="Learn a torque-controlled robot's dynamics online while controlling it.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("demo", help="the main job: learning the dynamics while controlling, before and after"
                       " (or one controller: --controller); lockstep simulation over DDS, table, plots, bag",
                       description="Without --controller: the arm with an unmodelled tool and joint friction, one"
                       " Fourier trajectory, first computed torque on the URDF's model, then composite adaptive"
                       " control + the GMM residual from the same model, in one run of the graph; prints the"
                       " per-joint RMSE of both, their ratio and the tool's estimated mass and centre of mass"
                       " (adaptive_dynamics.experiments.learning_demo).  With --controller: that controller alone"
                       " for --duration s.")
    _add_robot_args(p)
    p.add_argument("--controller", default=None, choices=JOINT_CONTROLLERS,
                   help="one controller alone: pd | computed_torque (baseline node) | direct | composite"
                   " (adaptive_controller); joint references (scqp, backstepping: `launch sim --controller ...`)")
    p.add_argument("--duration", type=float, default=10.0, help="--controller: sim seconds (default 10)")
    p.add_argument("--learning-periods", type=int, default=None,
                   help="learning demo: trajectory periods (5 s) of learning after the baseline's one (default 3)")
    p.add_argument("--out", default="out/demo", help="directory for the bag, plots and demo.json")
    p.add_argument("--set", action="append", default=[], metavar="NODE.PARAM=VALUE",
                   help="parameter override as for launch, e.g. --set adaptive_controller.kd=[20.0] (YAML value)")
    p.add_argument("-v", "--verbose", action="store_true", help="forward the nodes' logs")
    p.set_defaults(fn=_cmd_demo)
    p = sub.add_parser("selfcheck", help="dynamics-core smoke run (regressors vs RNEA, filtered regressor)")
    p.add_argument("--robot", default="panda", help="panda | iiwa14 | planar2 (default panda)")
    p.add_argument("--out", default="out/selfcheck", help="directory for the plot and JSON summary")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(fn=_cmd_selfcheck)
    p = sub.add_parser("launch", help="start a scenario's nodes as processes (pip path of ros2 launch)",
                       description="Start a scenario's nodes as processes (pip path of ros2 launch), their"
                       " logs prefixed with [node].  Ctrl-C or SIGTERM stops every node in order (the"
                       " recorder last); a node dying stops the others and exits non-zero.  The nodes'"
                       " parameter override files live in one private temporary directory"
                       " ($TMPDIR/ad_launch_*), removed however the launch ends.")
    p.add_argument("scenario", choices=["sim", "real"], help="sim: MuJoCo bridge + trajectory + controller;"
                   " real: trajectory + controller against a ros2_control robot")
    _add_graph_args(p)
    p.set_defaults(fn=_cmd_launch)
    p = sub.add_parser("info", help="joints, limits and parameter layout of a robot")
    p.add_argument("robot", nargs="?", default="panda", help="a shipped robot or a URDF file")
    p.add_argument("--joints", default=None, metavar="J1,J2,...", help="URDF robot: the joints (others locked)")
    p.add_argument("--ee-frame", default=None, metavar="FRAME", help="URDF robot: the end-effector frame")
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
    p = sub.add_parser("record", help="record live topics into an MCAP rosbag2 (recorder node)",
                       description="Record live topics into an MCAP rosbag2 (metadata.yaml included, so"
                       " `ros2 bag info/play` work).  Default topics: " + ", ".join(RECORD_TOPICS) +
                       ", plus the topics discovered at start whose type the recorder knows.  Stops on"
                       " Ctrl-C/SIGTERM or after --duration; prints per-topic counts, the bag path and a"
                       " JSON line.")
    p.add_argument("--out", default=None, help="bag directory to create (default bags/rec_<date>_<time>)")
    p.add_argument("--topics", nargs="+", default=None, metavar="TOPIC",
                   help="record exactly these (relative names resolve in --namespace)")
    p.add_argument("--duration", type=float, default=0.0, help="stop after this many wall seconds (0 = until"
                   " Ctrl-C/SIGTERM)")
    p.add_argument("--namespace", default="", help="namespace of the graph (e.g. fr3, lbr)")
    p.add_argument("--use-sim-time", default="auto", choices=["auto", "true", "false"],
                   help="stamp messages with /clock time (auto: if /clock has a publisher at start)")
    p.add_argument("--discovery", type=float, default=2.0, help="seconds to discover the graph before"
                   " subscribing (default 2; longer while topics keep appearing, at most max(3x, +4 s))")
    p.set_defaults(fn=_cmd_record)
    p = sub.add_parser("replay", help="republish a bag over DDS at real or scaled time, with /clock; or, with"
                       " --learner, evaluate a residual learner on the bag offline (no DDS)",
                       description="Republish a rosbag2's topics over DDS with their recorded types and"
                       " bytes, in order, at real time x --rate, publishing /clock from the bag (recorded, or"
                       " generated from the bag's time axis).  Every publisher is reliable (best-effort"
                       " readers connect too); subscribe reliable + KEEP_ALL to receive every message at"
                       " high rates.  Prints per-topic counts, wall time, achieved rate and a JSON line.  "
                       "With --learner KIND: no DDS; the residual learner runs over the bag as fast as"
                       " possible, test-then-train in time order (each block is predicted before it is"
                       " learnt), on inputs x = (q, qd, qdd) from joint_states (+ reference) and target"
                       " y = measured torque - adaptive/parametric_torque (the measured torque when the bag"
                       " has no parametric torque); prints a per-joint nMSE table and a JSON line, and writes"
                       " replay_<KIND>.png (nMSE per joint over time) and replay_<KIND>.json to --out.")
    p.add_argument("bag", help="rosbag2 directory (or its .mcap / metadata.yaml)")
    p.add_argument("--rate", type=float, default=1.0, help="bag seconds per wall second (default 1;"
                   " 0 = as fast as possible)")
    p.add_argument("--fast", action="store_true", help="as fast as possible, order kept (= --rate 0)")
    p.add_argument("--topics", nargs="+", default=None, metavar="TOPIC",
                   help="replay only these (default all; /clock follows --no-clock)")
    p.add_argument("--no-clock", action="store_true", help="do not publish /clock")
    p.add_argument("--clock-rate", type=float, default=100.0, help="Hz of a generated /clock when the bag"
                   " has none (default 100)")
    p.add_argument("--loop", action="store_true", help="start again at the end (until Ctrl-C)")
    p.add_argument("--wait-for-subscribers", nargs="*", default=None, metavar="TOPIC",
                   help="start once every replayed topic (or each TOPIC given) has a subscriber, up to"
                   " --wait-timeout")
    p.add_argument("--wait-timeout", type=float, default=10.0, help="seconds (default 10)")
    p.add_argument("--remap", action="append", default=[], metavar="FROM:=TO",
                   help="remap a topic, e.g. --remap /joint_states:=/replay/joint_states")
    g = p.add_argument_group("offline learner evaluation (--learner; no DDS)")
    # choices are checked against adaptive_dynamics.learning.LEARNERS when used: importing the
    # learners (scipy.stats) here would add ~1 s to every adaptive-dynamics command
    g.add_argument("--learner", default=None, metavar="KIND",
                   help="evaluate this residual learner offline instead of republishing:"
                   " gmm | rbfn | gp | pgpol | sgpol")
    g.add_argument("--out", default=None, metavar="DIR", help="directory for replay_<KIND>.png/.json"
                   " (default replay_eval/)")
    g.add_argument("--robot", default=None, metavar="NAME|URDF", help="robot model whose joints are"
                   " matched by name (default: the shipped robot whose joints the bag carries, else panda)")
    g.add_argument("--decimation", type=int, default=None, metavar="N",
                   help="learn every N-th sample, predict all (default 3)")
    g.add_argument("--acceleration", default=None, choices=["desired", "measured"],
                   help="qdd input: the reference acceleration at the state's stamp (desired, default) or"
                   " the backward difference of the measured qd (measured)")
    g.add_argument("--target", default=None, choices=["auto", "residual", "torque"],
                   help="residual = measured torque - adaptive/parametric_torque, torque = measured torque"
                   " (the whole dynamics); auto (default): residual if the bag has parametric torques")
    g.add_argument("--window", type=float, default=None, metavar="S",
                   help="nMSE window [bag seconds] (default 1)")
    g.add_argument("--block", type=int, default=None, metavar="N",
                   help="samples predicted, then learnt, per step (default 100; 10 for pgpol/sgpol, whose"
                   " every step is one GP refit)")
    g.add_argument("--transform", action="store_true",
                   help="apply adaptive/parameter_update (the consistency transform) in stamp order")
    g.add_argument("--save-model", default=None, metavar="PATH", help="save the trained learner (.npz)")
    g.add_argument("--region-radius", type=float, default=None, metavar="RAD",
                   help="a sample is inside the training region when a sample learnt before its block has"
                   " joint positions within this distance [rad, Euclidean] (default 0.1); the nMSE is"
                   " reported inside and outside it")
    g.add_argument("--learner-config", default=None, metavar="JSON",
                   help="learner constructor arguments, e.g. '{\"n_basis\": 1024}' or '{\"max_components\": 32}'")
    p.set_defaults(fn=_cmd_replay)
    from .evaluation import identify as _identify  # lazy: the CLI starts fast
    p = sub.add_parser("identify", help="identify the rigid-body model (+ friction) from a recorded bag or CSV,"
                       " evaluated on held-out data; writes estimate files the adaptive controller loads",
                       description=_identify.DESCRIPTION)
    _identify.add_arguments(p)
    p.set_defaults(fn=lambda args: _identify.main_args(args))
    from .evaluation import excite as _excite  # lazy: the CLI starts fast
    p = sub.add_parser("excite", help="optimise an excitation trajectory for identification (min condition number"
                       " of the base regressor within the joint, effort, floor and self-collision limits; --payload:"
                       " the wrist alone, for the payload); CSV + JSON + plot, played by trajectory type file",
                       description=_excite.DESCRIPTION)
    _excite.add_arguments(p)
    p.set_defaults(fn=lambda args: _excite.main_args(args))
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

"""The node graph of each scenario, in one place (no ROS import).

Both the ROS 2 launch files (``launch/*.launch.py``, for a full ROS 2 install) and the
pip-path launcher (``adaptive-dynamics launch``) build their processes from
:func:`build_graph`, so they start the same nodes with the same parameter files.

Parameter files are ROS 2 parameter YAMLs under ``config/``; later files win:
``<robot>.yaml`` (robot description, simulator "reality"), ``sim.yaml`` or
``real.yaml`` (scenario defaults for every node), then explicit overrides.
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from typing import Any

from .robots import share_dir

CONTROLLERS = ("pd", "computed_torque", "direct", "composite", "scqp", "backstepping")
#: laws served by the adaptive_controller node (the lean baseline `controller` serves pd, computed_torque)
ADAPTIVE_LAWS = ("direct", "composite")
#: controllers of the end effector on task_reference (the trajectory node in space: task): scqp
#: (node scqp_controller), backstepping (adaptive_controller, law backstepping); the others track
#: joint references
TASK_CONTROLLERS = ("scqp", "backstepping")
JOINT_CONTROLLERS = tuple(c for c in CONTROLLERS if c not in TASK_CONTROLLERS)
#: the trajectory of a task-space controller when the parameter files name a joint-space type
DEFAULT_TASK_TRAJECTORY = {"scqp": "figure8", "backstepping": "lissajous3d"}
#: trajectory types the trajectory node publishes in task space (nodes/trajectory.py)
CARTESIAN_TYPES = ("figure8", "lissajous", "lissajous3d", "square_circle", "z_sine")
LEARNERS = ("none", "gmm", "rbfn", "gp", "pgpol", "sgpol", "joint_local")  # "none" + adaptive_dynamics.learning.LEARNERS (tested)
MODES = ("lockstep", "realtime")
SCENARIOS = ("sim", "real")

# Presets for real-robot stacks: (namespace, remappings).  The topic names the nodes
# use are relative, so a namespace retargets the whole graph.
REAL_PRESETS = {
    # franka_ros2: joint_state_broadcaster on joint_states, an effort
    # forward_command_controller named effort_controller.
    "franka": ("", []),
    # lbr_fri_ros2_stack (KUKA FRI, ros2_control): everything under /lbr.
    "lbr": ("lbr", []),
    # gz_ros2_control in Gazebo with the same controller names.
    "gazebo": ("", []),
}
#: presets whose robot adds g(q) to the commanded torque (robot_compensates_gravity)
GRAVITY_COMPENSATING_PRESETS = ("franka",)


#: the order a graph's nodes are stopped in (by executable): the loop's driver first, the recorder last
STOP_RANK = {"mujoco_bridge": 0, "trajectory": 1, "controller": 1, "recorder": 9}


@dataclass
class NodeSpec:
    """One node process: what both launchers need to start it."""

    name: str                       # node name
    executable: str                 # console script == module adaptive_dynamics.nodes.<executable>
    param_files: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    remappings: list[tuple[str, str]] = field(default_factory=list)
    namespace: str = ""
    required: bool = False          # the graph ends when a required node exits
    drains: bool = False            # at the end, let it finish by itself (recorder emptying its queue)

    @property
    def module(self) -> str:
        return f"adaptive_dynamics.nodes.{self.executable}"


def _override_file(spec: NodeSpec, workdir: str) -> str:
    """The node's explicit parameters as one more ROS 2 parameter file, in ``workdir``.

    rcl gives ``--params-file`` values precedence over ``-p`` ones, so explicit
    overrides go in a file placed after the configuration files (later files win).
    """
    import yaml
    fd, path = tempfile.mkstemp(prefix=f"ad_{spec.name}_", suffix=".yaml", dir=workdir)
    with os.fdopen(fd, "w") as fh:
        key = f"/{spec.namespace.strip('/')}/{spec.name}" if spec.namespace else spec.name
        yaml.safe_dump({key: {"ros__parameters": dict(spec.params)}}, fh)
    return path


_process_dir: str | None = None


def _default_workdir() -> str:
    """For :func:`command_line` called on its own (no launch to own the files): one
    private directory per process, removed when the process exits."""
    global _process_dir
    if _process_dir is None or not os.path.isdir(_process_dir):
        _process_dir = tempfile.mkdtemp(prefix="ad_cmdline_")
        atexit.register(shutil.rmtree, _process_dir, True)
    return _process_dir


def command_line(spec: NodeSpec, workdir: str | None = None) -> list[str]:
    """The node's command line; a parameter override file, if needed, is written into
    ``workdir`` (a :class:`GraphProcess` passes its private directory; without one, a
    per-process directory removed at exit)."""
    cmd = [sys.executable, "-m", spec.module, "--ros-args", "-r", f"__node:={spec.name}"]
    if spec.namespace:
        cmd += ["-r", f"__ns:=/{spec.namespace.strip('/')}"]
    for f in spec.param_files:
        cmd += ["--params-file", f]
    if spec.params:
        cmd += ["--params-file", _override_file(spec, workdir or _default_workdir())]
    for a, b in spec.remappings:
        cmd += ["-r", f"{a}:={b}"]
    return cmd



def config_path(name: str) -> str:
    path = share_dir() / "config" / name
    if not path.exists():
        raise FileNotFoundError(f"parameter file {name!r} not found in {path.parent}")
    return str(path)


#: real time: /clock every 50th step (20 Hz at 1 kHz).  Every /clock message wakes each
#: sim-time node's rclpy executor (~0.3 ms of Python holding that process's GIL); at
#: 100 Hz that interference tripled the loop's deadline misses (bench/loop.py).  Nodes
#: that need exact time read the joint_states stamps; references are published 0.2 s ahead.
REALTIME_CLOCK_DECIMATION = 50

#: real time: SCHED_FIFO priority of the nodes on the 1 kHz critical path (bridge,
#: controller, the regressor node when the controller consumes it), as ros2_control's
#: controller manager gives its update loop.  Their threads then run ahead of the other
#: nodes' (trajectory, recorder, learner), whose /clock and batch work otherwise lands in
#: the middle of the exchange: 40-55 % late cycles in the millisecond after each /clock
#: message without it, ~5 % with it (bench/loop.py).  Without permission the nodes warn
#: and run normally scheduled (adaptive_dynamics.realtime).
REALTIME_PRIORITY = 50


def parse_overrides(items) -> dict[str, dict[str, Any]]:
    """``["NODE.PARAM=VALUE", ...]`` (the CLI's ``--set``; VALUE in YAML) as
    ``{node: {param: value}}``; ``ValueError`` for another form."""
    import yaml
    out: dict = {}
    for item in items:
        key, sep, val = item.partition("=")
        node, dot, param = key.partition(".")
        if not sep or not dot:
            raise ValueError(f"--set expects NODE.PARAM=VALUE, got {item!r}")
        value = yaml.safe_load(val)
        if isinstance(value, list) and any(isinstance(x, float) for x in value) \
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in value):
            value = [float(x) for x in value]   # [1, 2.5]: a ROS parameter array has one type
        out.setdefault(node, {})[param] = value
    return out


def build_graph(scenario: str = "sim", *, robot: str = "panda", controller: str = "computed_torque",
                learner: str = "none", learner_split: bool = False, use_sim_time: bool | None = None,
                record: bool = False, mode: str = "lockstep", duration: float = 0.0, namespace: str = "",
                preset: str = "franka", bag: str | None = None,
                overrides: dict[str, dict[str, Any]] | None = None, without: tuple[str, ...] = (),
                joints=None, ee_frame: str | None = None, param_files: tuple = (),
                monitor: bool = False) -> list[NodeSpec]:
    """The nodes of ``scenario`` ("sim": MuJoCo bridge + trajectory + controller; "real":
    trajectory + controller against a robot's ros2_control stack).

    ``controller`` "scqp" starts ``scqp_controller``, "backstepping" ``adaptive_controller``
    with ``law: backstepping``; both switch the trajectory node to ``space: task`` (its
    ``type`` from the parameter files and overrides if that is a Cartesian type, else
    :data:`DEFAULT_TASK_TRAJECTORY`).

    ``duration`` > 0 stops the simulation after that much sim time (the bridge exits
    cleanly and the launcher stops the rest).  ``overrides`` maps node name -> params.
    ``param_files``: more ROS parameter files, read by every node after the robot's and
    the scenario's (e.g. :func:`~adaptive_dynamics.robots.paper_config`).
    A ``learner`` other than "none" adds the ``residual_learner`` node, or with
    ``learner_split`` the PGPOL split: ``model_update`` (learns, publishes snapshots on
    ``learner/model``) and ``prediction`` (publishes ``feedforward/residual`` from them).
    ``without`` names nodes of the graph not to start here: they run elsewhere (another
    host on the same ROS_DOMAIN_ID), and the lockstep bridge still waits for them.
    ``monitor`` adds the ``external_torque`` node (external joint torques, end-effector
    wrench, contact flag; :func:`monitor_node_for`): on the adaptive controller's estimate
    when the graph has one (its ``friction``, ``adapted_links`` and ``friction_model_file``),
    else on the URDF's model, with the learner's residual when a learner runs; a
    calibration of it first sets ``learning`` false on the graph's learning nodes (the
    adaptive controller, the residual learner or ``model_update``: ``hold_learning``).

    ``robot``: a shipped robot name, or a URDF file (:func:`~adaptive_dynamics.robot_setup.resolve_robot`:
    ``joints`` to use a subset of its moving joints, the others locked; ``ee_frame``; a
    generated parameter file with model-derived gains replaces ``config/<robot>.yaml``),
    or ``robot_description``: every node takes the URDF from that topic at start (gains
    from the scenario's parameter file and the overrides; the adaptive controller's K_D,
    unless set, derived from the model it received).
    """
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; available: {list(SCENARIOS)}")
    from_topic = robot == "robot_description"
    from .robot_setup import resolve_robot  # lazy: the CLI parser imports this module (robot_setup loads the dynamics)
    robot_spec = None if from_topic else resolve_robot(robot, joints, ee_frame)
    if controller not in CONTROLLERS:
        raise ValueError(f"unknown controller {controller!r}; available: {list(CONTROLLERS)}")
    if learner not in LEARNERS:
        raise ValueError(f"unknown learner {learner!r}; available: {list(LEARNERS)}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; available: {list(MODES)}")
    if learner_split and learner == "none":
        raise ValueError("learner_split splits a learner into model_update + prediction: choose a learner")
    if learner != "none" and controller not in ADAPTIVE_LAWS:
        raise ValueError(f"learner {learner!r} learns the residual of the adaptive controller's parametric"
                         f" torque: use controller {' or '.join(ADAPTIVE_LAWS)}, not {controller!r}")
    sim = scenario == "sim"
    # learner nodes that subscribe /clock and joint_states (the lockstep bridge counts them)
    n_learners = 0 if learner == "none" else 2 if learner_split else 1
    if use_sim_time is None:
        use_sim_time = sim
    if not sim:
        if preset not in REAL_PRESETS:
            raise ValueError(f"unknown real-robot preset {preset!r}; available: {list(REAL_PRESETS)}")
        ns, remaps = REAL_PRESETS[preset]
        namespace = namespace or ns
    else:
        remaps = []
    files = ([] if from_topic else [robot_spec.config]) + [config_path("sim.yaml" if sim else "real.yaml")] \
        + [str(f) for f in param_files]
    common = {"use_sim_time": bool(use_sim_time)}
    if from_topic:   # every node reads the URDF from the latched topic (gains: the parameter files')
        common["robot"] = "robot_description"
    overrides = overrides or {}
    nodes: list[NodeSpec] = []
    if sim:
        # the bridge *is* the clock: it never runs on sim time itself
        nodes.append(NodeSpec("mujoco_bridge", "mujoco_bridge", files,
                              {**common, "use_sim_time": False, "mode": mode, "max_sim_time": float(duration),
                               **({"clock_decimation": REALTIME_CLOCK_DECIMATION,
                                   "realtime_priority": REALTIME_PRIORITY} if mode == "realtime" else {}),
                               "wait_for_nodes": 2 + int(record) + n_learners,
                               "wait_for_state_subscribers": 1 + int(record) + n_learners},
                              namespace=namespace, required=True))
    traj = NodeSpec("trajectory", "trajectory", files, dict(common), list(remaps), namespace)
    nodes.append(traj)
    task_space = controller in TASK_CONTROLLERS
    if task_space:
        traj.params["space"] = "task"
        if _resolved(traj, overrides.get("trajectory", {})).get("type", "fourier") not in CARTESIAN_TYPES:
            traj.params["type"] = DEFAULT_TASK_TRAJECTORY[controller]
    ctl = "scqp_controller" if controller == "scqp" else \
        "adaptive_controller" if controller in ADAPTIVE_LAWS + ("backstepping",) else "controller"
    ctl_params = {**common} if controller == "scqp" else {**common, "law": controller}
    if controller == "backstepping":
        # Thunder's set-up: from the URDF's model, whatever the files' default; with the joints'
        # friction estimated too (every arm has it; unmodelled, it is most of the task error)
        ctl_params.update(initial_estimate="nominal", friction=True)
    if not sim:  # franka_ros2 adds gravity to the command itself; FRI torque mode and Gazebo do not
        ctl_params["robot_compensates_gravity"] = preset in GRAVITY_COMPENSATING_PRESETS
    else:  # lockstep must not lose a state; in real time the latest state is what matters
        ctl_params["reliable_streams"] = mode == "lockstep"
        if mode == "realtime":
            ctl_params["realtime_priority"] = REALTIME_PRIORITY
            # never wait for a late reference batch (held reference or safe command at once):
            # a wait makes every answer one period late for as long as the batches are late
            ctl_params["reference_wait"] = 0.0
    nodes.append(NodeSpec(ctl, ctl, files, ctl_params, list(remaps), namespace))
    reg = regressor_node_for(nodes[-1], overrides.get(ctl, {})) if ctl == "adaptive_controller" else None
    if reg is not None:  # adaptive_controller.regressor_source: topics -> start the regressor node too
        nodes.append(reg)
        if sim:  # one more /clock and joint_states subscriber before the lockstep bridge starts
            nodes[0].params["wait_for_nodes"] += 1
            nodes[0].params["wait_for_state_subscribers"] += 1
    if learner != "none":
        lrn = {**common, "learner": learner}
        if sim:
            lrn["reliable_streams"] = mode == "lockstep"
        # the split's nodes may run on other hosts: the same parameter files, a ROS_DOMAIN_ID in common
        shared = {}
        if ctl == "adaptive_controller":   # the learners' transform takes the controller's columns
            resolved = _resolved(next(s for s in nodes if s.name == ctl), overrides.get(ctl, {}))
            shared = {k: resolved[k] for k in LEARNER_SHARED if k in resolved}
        for name in (("model_update", "prediction") if learner_split else ("residual_learner",)):
            nodes.append(NodeSpec(name, name, files, {**lrn, **(shared if name != "prediction" else {})},
                                  list(remaps), namespace))
    if monitor:
        mon = monitor_node_for(nodes, ctl, overrides.get(ctl, {}), learner != "none", common, mode)
        nodes.append(mon)
        for spec in nodes:   # the learner's predictive std beside its residual, for the thresholds
            if spec.name in ("residual_learner", "prediction"):
                spec.params["publish_std"] = True
        # a calibration first holds the graph's learning (the thresholds hold for the model they
        # were calibrated on; docs/contact.md)
        hold = [ctl] if ctl == "adaptive_controller" else []
        hold += [] if learner == "none" else ["model_update" if learner_split else "residual_learner"]
        if hold:
            mon.params["hold_learning"] = hold
        if learner != "none" and not learner_split and ctl == "adaptive_controller":
            # the residual learnt as a function of the state (the controller's model at the
            # learner's input) and taken at the measured state (docs/contact.md)
            next(s for s in nodes if s.name == ctl).params["parametric_torque"] = "state"
            next(s for s in nodes if s.name == "residual_learner").params["state_residual"] = True
            mon.params["residual_input"] = "state"
        if sim:  # one more /clock and joint_states subscriber before the lockstep bridge starts
            nodes[0].params["wait_for_nodes"] += 1
            nodes[0].params["wait_for_state_subscribers"] += 1
    if record:
        rec = {**common, **({"bag": bag} if bag else {})}
        if sim and duration > 0:
            rec["exit_when_idle"] = 1.0  # bridge gone + 1 s quiet: queue drained, close the bag, exit 0
        if monitor:   # the monitor's outputs (and the learner's residual at the state it takes)
            rec["extra_topics"] = [*MONITOR_TOPICS, *(["residual/state"] if any(
                s.params.get("state_residual") for s in nodes) else [])]
        if sim and mode == "lockstep":  # the bridge starts only once the recorder hears the whole graph
            rec["wait_for_publishers"] = ["task_reference" if task_space else "reference",
                                          "effort_controller/commands"]
        nodes.append(NodeSpec("recorder", "recorder", files, rec, list(remaps), namespace,
                              drains=sim and duration > 0))
    for spec in nodes:
        spec.params.update(overrides.get(spec.name, {}))
    if not task_space and (traj.params.get("type") == "file" or any(_sets(f, "type", "file") for f in files)):
        _file_trajectory(traj, nodes[0] if sim else None, robot_spec, overrides.get("mujoco_bridge", {}))
    unknown = sorted(set(without) - {s.name for s in nodes})
    if unknown:
        raise ValueError(f"without: {unknown} not in this graph ({[s.name for s in nodes]})")
    return [s for s in nodes if s.name not in without]


def _file_trajectory(traj: NodeSpec, bridge: NodeSpec | None, robot_spec, bridge_overrides: dict) -> None:
    """``type: file``: the trajectory file's path made absolute (the nodes may start
    elsewhere), and in simulation the bridge starting where the file starts (``q0``,
    unless set), so the reference does not jump at t = 0."""
    resolved = _resolved(traj, {})
    if resolved.get("type") != "file":
        return
    path = str(resolved.get("trajectory_file") or "")
    if not path:
        raise ValueError("trajectory type file: set trajectory.trajectory_file (e.g. --set"
                         " trajectory.trajectory_file=out/excite/excitation.json)")
    path = os.path.abspath(path)
    traj.params["trajectory_file"] = path
    if bridge is None or "q0" in bridge_overrides or robot_spec is None:
        return
    from .trajectories.from_file import load_trajectory_file  # lazy: scipy
    start = load_trajectory_file(path, robot_spec.joint_names).sample(0.0)[0]
    bridge.params["q0"] = [float(x) for x in start]


def _resolved(spec: NodeSpec, spec_overrides: dict[str, Any]) -> dict[str, Any]:
    """The parameters ``spec`` would get from its files, its own params and the overrides."""
    from .ros.params import load_param_file  # only here: the rest of this module needs no ROS

    out: dict[str, Any] = {}
    for f in spec.param_files:
        out.update(load_param_file(f, spec.name, namespace="/" + spec.namespace if spec.namespace else ""))
    out.update(spec.params)
    out.update(spec_overrides)
    return out


#: what the external_torque node publishes (recorded with ``record`` and ``monitor``)
MONITOR_TOPICS = ("external_torque", "contact", "external_wrench")

#: adaptive-controller parameters the learners must share (their consistency transform takes its
#: regressor's columns: the friction columns and their Coulomb shape)
LEARNER_SHARED = ("friction", "friction_smoothing")

#: adaptive-controller parameters the external_torque node must share to read its estimate
MONITOR_SHARED = ("friction", "friction_smoothing", "adapted_links", "friction_model_file")


def monitor_node_for(nodes: list[NodeSpec], ctl: str, ctl_overrides: dict[str, Any], learner: bool,
                     common: dict[str, Any], mode: str) -> NodeSpec:
    """The ``external_torque`` node of ``monitor``: ``model_source: estimate`` next to an
    ``adaptive_controller`` (with its resolved :data:`MONITOR_SHARED` parameters), else
    ``urdf``; ``use_residual`` and ``use_residual_std`` when a learner publishes
    ``feedforward/residual`` (:func:`build_graph` has it publish ``feedforward/residual_std``
    too; ``uncertainty_gain``, live, sets how much the std raises the thresholds); on the
    estimate the node adds no ``armature`` (the controller's regressor has none).  Beside an
    ``adaptive_controller`` and a ``residual_learner``, :func:`build_graph` also has the
    controller publish its model at the learner's input (``parametric_torque: state``) and
    the learner its prediction at the measured state (``state_residual``), which this node
    takes (``residual_input: state``)."""
    spec = next(s for s in nodes if s.name == ctl)
    params: dict[str, Any] = {**common, "use_residual": bool(learner), "use_residual_std": bool(learner)}
    if nodes[0].name == "mujoco_bridge":
        params["reliable_streams"] = mode == "lockstep"
    if ctl == "adaptive_controller":
        resolved = _resolved(spec, ctl_overrides)
        params["model_source"] = "estimate"   # (the node adds no drive armature to the estimate)
        params.update({k: resolved[k] for k in MONITOR_SHARED if k in resolved})
    else:
        params["model_source"] = "urdf"
    return NodeSpec("external_torque", "external_torque", list(spec.param_files), params, list(spec.remappings),
                    spec.namespace)


#: controller parameters the regressor node must share for ``regressor_source: topics``
REGRESSOR_SHARED = ("lam", "filter_lambda", "rate_hz", "friction", "friction_smoothing", "reliable_streams", "reference_tolerance",
                    "reference_wait", "hot_path_thread", "realtime_priority")


def regressor_node_for(ctl: NodeSpec, ctl_overrides: dict[str, Any]) -> NodeSpec | None:
    """The ``regressor`` node an ``adaptive_controller`` with ``regressor_source: topics``
    consumes (None for ``inprocess``): full columns (``base_parameters: false``), every
    Slotine-Li and filtered regressor, no standard one, and the controller's resolved
    ``lam``, ``filter_lambda``, ``rate_hz``, ``friction`` (and stream settings), so the
    controller's consistency check passes.  ``overrides["regressor"]`` still win."""
    explicit = {**ctl.params, **ctl_overrides}
    if explicit.get("regressor_source", "inprocess") != "topics" and "regressor_source" in explicit:
        return None
    if "regressor_source" not in explicit and not any(_sets_topics(f) for f in ctl.param_files):
        return None
    from .ros.params import load_param_file  # only here: the rest of this module needs no ROS

    resolved: dict[str, Any] = {}
    for f in ctl.param_files:
        resolved.update(load_param_file(f, ctl.name, namespace="/" + ctl.namespace if ctl.namespace else ""))
    resolved.update(explicit)
    if resolved.get("regressor_source", "inprocess") != "topics":
        return None
    params = {"use_sim_time": resolved.get("use_sim_time", False), "base_parameters": False,
              "standard_decimation": 0, "slotine_li_decimation": 1, "filtered_decimation": 1}
    params.update({k: resolved[k] for k in REGRESSOR_SHARED if k in resolved})
    return NodeSpec("regressor", "regressor", list(ctl.param_files), params, list(ctl.remappings), ctl.namespace)


def _sets_topics(path: str) -> bool:
    """Whether a parameter file sets ``regressor_source: topics`` anywhere (a cheap
    pre-check; which node it applies to is resolved by ``load_param_file``)."""
    return _sets(path, "regressor_source", "topics")


def _sets(path: str, key: str, value: Any) -> bool:
    """Whether a parameter file sets ``key: value`` anywhere (a cheap pre-check)."""
    import yaml

    def walk(x) -> bool:
        if isinstance(x, dict):
            return x.get(key) == value or any(walk(v) for v in x.values())
        return False

    with open(path, encoding="utf-8") as f:
        return walk(yaml.safe_load(f))

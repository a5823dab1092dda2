"""The shared graph description both launchers use (launch files cannot run here:
``launch_ros`` is not on PyPI), checked without starting processes: which nodes, which
parameter files in which order, presets, and the exact parameters each node would get
(the config files + overrides resolved the way rcl does, via ``load_param_file``)."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from adaptive_dynamics.scenarios import CONTROLLERS, build_graph, config_path
from adaptive_dynamics.launcher import command_line
from adaptive_dynamics.ros.params import load_param_file

ROOT = Path(__file__).resolve().parents[1]


def by_name(nodes):
    return {s.name: s for s in nodes}


def resolved(spec):
    """What the node would see: its files in order, then its explicit parameters."""
    out = {}
    for f in spec.param_files:
        out.update(load_param_file(f, spec.name, namespace="/" + spec.namespace if spec.namespace else ""))
    out.update(spec.params)
    return out


@pytest.mark.parametrize("controller", CONTROLLERS)
def test_sim_graph_nodes_and_controller_selection(controller):
    nodes = by_name(build_graph("sim", robot="panda", controller=controller, duration=3.0, record=True))
    ctl = {"direct": "adaptive_controller", "composite": "adaptive_controller", "scqp": "scqp_controller",
           "backstepping": "adaptive_controller"}.get(controller, "controller")
    assert set(nodes) == {"mujoco_bridge", "trajectory", ctl, "recorder"}
    assert nodes[ctl].executable == ctl
    if ctl != "scqp_controller":
        assert nodes[ctl].params["law"] == controller
    assert nodes["mujoco_bridge"].required and nodes["recorder"].drains
    # the bridge is the clock; every other node runs on sim time
    assert nodes["mujoco_bridge"].params["use_sim_time"] is False
    assert all(s.params["use_sim_time"] for n, s in nodes.items() if n != "mujoco_bridge")
    p = resolved(nodes["mujoco_bridge"])
    assert p["max_sim_time"] == 3.0 and p["mode"] == "lockstep"
    assert p["wait_for_state_subscribers"] == 2  # controller + recorder
    assert p["robot"] == "panda" and len(p["joint_names"]) == 7
    c = resolved(nodes[ctl])
    assert c["robot"] == "panda"
    if ctl == "adaptive_controller":   # backstepping starts from the URDF's model (the paper's set-up)
        assert len(c["kd"]) == 7 and c["initial_estimate"] == ("nominal" if controller == "backstepping" else "zero")
    t = resolved(nodes["trajectory"])
    if controller in ("scqp", "backstepping"):   # the end effector: task references from the trajectory node
        if controller == "scqp":
            assert c["mode"] == "scqp" and c["rate_hz"] == 200.0 and "law" not in c
        assert t["space"] == "task" and t["type"] == {"scqp": "figure8", "backstepping": "lissajous3d"}[controller]
        assert resolved(nodes["recorder"])["wait_for_publishers"] == ["task_reference", "effort_controller/commands"]
    else:
        assert c["law"] == controller and t.get("space", "joint") == "joint"
        assert resolved(nodes["recorder"])["wait_for_publishers"] == ["reference", "effort_controller/commands"]


def test_scqp_graph_keeps_a_cartesian_trajectory_type_and_refuses_a_learner():
    from adaptive_dynamics.scenarios import CARTESIAN_TYPES
    from adaptive_dynamics.nodes.trajectory import CARTESIAN_TYPES as NODE_TYPES
    assert CARTESIAN_TYPES == NODE_TYPES
    for kind in CARTESIAN_TYPES:
        nodes = by_name(build_graph("sim", controller="scqp", overrides={"trajectory": {"type": kind}}))
        assert resolved(nodes["trajectory"])["type"] == kind
    real = by_name(build_graph("real", controller="scqp", preset="franka"))
    c, t = resolved(real["scqp_controller"]), resolved(real["trajectory"])
    assert c["robot_compensates_gravity"] is True and c["state_file"] and t["space"] == "task"
    assert t["start_from_current"] is True and t["type"] == "figure8"
    with pytest.raises(ValueError, match="adaptive controller"):
        build_graph("sim", controller="scqp", learner="gmm")


def test_backstepping_graph_on_a_real_robot_and_without_a_learner():
    real = by_name(build_graph("real", controller="backstepping", preset="franka"))
    c, t = resolved(real["adaptive_controller"]), resolved(real["trajectory"])
    assert c["law"] == "backstepping" and c["robot_compensates_gravity"] is True
    assert c["initial_estimate"] == "nominal" and c["friction"] is True and c["reference_wait"] == 0.0
    assert t["space"] == "task" and t["start_from_current"] is True and t["type"] == "lissajous3d"
    sim = by_name(build_graph("sim", controller="backstepping", overrides={"trajectory": {"type": "z_sine"}}))
    assert resolved(sim["trajectory"])["type"] == "z_sine"        # a Cartesian type is kept
    with pytest.raises(ValueError, match="adaptive controller"):
        build_graph("sim", controller="backstepping", learner="rbfn")


def test_config_files_order_and_overrides_win(tmp_path):
    nodes = by_name(build_graph("sim", robot="iiwa14", controller="composite",
                                overrides={"adaptive_controller": {"lam": [5.0]}}))
    spec = nodes["adaptive_controller"]
    assert [Path(f).name for f in spec.param_files] == ["iiwa14.yaml", "sim.yaml"]
    assert resolved(spec)["lam"] == [5.0]
    cmd = command_line(spec)
    files = [cmd[i + 1] for i, a in enumerate(cmd) if a == "--params-file"]
    assert files[:2] == spec.param_files and len(files) == 3  # overrides last (rcl: later files win)
    assert yaml.safe_load(Path(files[2]).read_text())["adaptive_controller"]["ros__parameters"]["lam"] == [5.0]
    assert cmd[cmd.index("-r") + 1] == "__node:=adaptive_controller"


@pytest.mark.parametrize("preset,namespace,gravity", [("franka", "", True), ("lbr", "lbr", False),
                                                      ("gazebo", "", False)])
def test_real_presets(preset, namespace, gravity):
    nodes = by_name(build_graph("real", robot="panda", controller="composite", preset=preset))
    assert "mujoco_bridge" not in nodes
    ctl = nodes["adaptive_controller"]
    assert ctl.namespace == namespace
    assert ctl.params["use_sim_time"] is False
    assert ctl.params["robot_compensates_gravity"] is gravity
    assert "__ns:=/lbr" in command_line(ctl) if namespace else all("__ns" not in a for a in command_line(ctl))
    p = resolved(ctl)
    assert p["initial_estimate"] == "nominal" and p["reliable_streams"] is False


def test_bad_arguments_are_named():
    for kw, needle in [({"robot": "ur5"}, "unknown robot"), ({"controller": "mpc"}, "unknown controller"),
                       ({"mode": "fast"}, "unknown mode")]:
        with pytest.raises(ValueError, match=needle):
            build_graph("sim", **kw)
    with pytest.raises(ValueError, match="unknown real-robot preset"):
        build_graph("real", preset="ur")
    with pytest.raises(FileNotFoundError):
        config_path("nope.yaml")


def test_launch_files_use_the_shared_description():
    """The launch files stay thin: they only call build_graph through _graph_launch."""
    helper = ast.parse((ROOT / "launch" / "_graph_launch.py").read_text())
    calls = {n.func.id for n in ast.walk(helper) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert "build_graph" in calls
    for name in ("sim.launch.py", "real.launch.py"):
        tree = ast.parse((ROOT / "launch" / name).read_text())
        fns = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert "generate_launch_description" in fns, name


def test_graph_process_exit_rules(monkeypatch):
    """GraphProcess.wait: the required node finishing ends the graph (0); any other node
    exiting is a failure named in the message -- except a draining node (the recorder)
    that ends cleanly on its own before the required node's process is gone."""
    import sys

    from adaptive_dynamics import launcher
    from adaptive_dynamics.scenarios import NodeSpec

    def fake(spec, workdir=None):  # node "<name>" sleeps <params['t']> s and exits with <params['rc']>
        return [sys.executable, "-c", f"import time, sys; time.sleep({spec.params['t']}); sys.exit({spec.params['rc']})"]

    monkeypatch.setattr(launcher, "command_line", fake)

    def run(*specs):
        g = launcher.GraphProcess(list(specs), echo=False)
        return g.wait(timeout=20)

    bridge = NodeSpec("bridge", "x", params={"t": 1.0, "rc": 0}, required=True)
    assert run(bridge, NodeSpec("recorder", "x", params={"t": 0.1, "rc": 0}, drains=True)) == (0, "bridge finished")
    assert run(bridge, NodeSpec("ctl", "x", params={"t": 0.1, "rc": 0})) == (1, "node 'ctl' exited with code 0")
    assert run(bridge, NodeSpec("recorder", "x", params={"t": 0.1, "rc": 3}, drains=True)) == \
        (3, "node 'recorder' exited with code 3")
    assert run(NodeSpec("bridge", "x", params={"t": 0.2, "rc": 2}, required=True),
               NodeSpec("ctl", "x", params={"t": 5, "rc": 0})) == (2, "node 'bridge' exited with code 2")


def test_realtime_puts_the_critical_path_on_fifo():
    """Real time: bridge, controller (and the regressor node it consumes) get
    REALTIME_PRIORITY; the trajectory and every node of a lockstep graph stay normally
    scheduled; an override still wins."""
    from adaptive_dynamics.scenarios import REALTIME_PRIORITY
    assert 1 <= REALTIME_PRIORITY <= 98
    rt = {k: resolved(v).get("realtime_priority", 0) for k, v in by_name(build_graph(
        "sim", mode="realtime", controller="composite",
        overrides={"adaptive_controller": {"regressor_source": "topics"}})).items()}
    assert rt == {"mujoco_bridge": REALTIME_PRIORITY, "trajectory": 0,
                  "adaptive_controller": REALTIME_PRIORITY, "regressor": REALTIME_PRIORITY}
    ls = by_name(build_graph("sim", mode="lockstep"))
    assert all(resolved(v).get("realtime_priority", 0) == 0 for v in ls.values())
    ov = build_graph("sim", mode="realtime", overrides={"controller": {"realtime_priority": 0}})
    assert resolved(by_name(ov)["controller"])["realtime_priority"] == 0


def test_realtime_decimates_clock():
    """Real time publishes /clock at 20 Hz (see REALTIME_CLOCK_DECIMATION); lockstep keeps
    config/sim.yaml's value; an override still wins."""
    from adaptive_dynamics.scenarios import REALTIME_CLOCK_DECIMATION
    rt = resolved(by_name(build_graph("sim", mode="realtime"))["mujoco_bridge"])
    ls = resolved(by_name(build_graph("sim", mode="lockstep"))["mujoco_bridge"])
    assert rt["clock_decimation"] == REALTIME_CLOCK_DECIMATION == 50
    assert ls["clock_decimation"] == 10
    ov = build_graph("sim", mode="realtime", overrides={"mujoco_bridge": {"clock_decimation": 5}})
    assert resolved(by_name(ov)["mujoco_bridge"])["clock_decimation"] == 5


@pytest.mark.parametrize("mode", ["lockstep", "realtime"])
def test_learner_split_starts_model_update_and_prediction(mode):
    """learner_split: model_update + prediction instead of residual_learner, both with the
    learner kind and the stream QoS of the mode; the lockstep bridge waits for both (each
    subscribes /clock and joint_states)."""
    plain = by_name(build_graph("sim", controller="composite", learner="gmm", record=True, mode=mode))
    split = by_name(build_graph("sim", controller="composite", learner="rbfn", learner_split=True, record=True,
                                mode=mode, overrides={"prediction": {"prediction_lead": 0.02}}))
    assert "residual_learner" in plain and not {"model_update", "prediction"} & set(plain)
    assert set(split) == {"mujoco_bridge", "trajectory", "adaptive_controller", "model_update", "prediction",
                          "recorder"}
    b0, b1 = resolved(plain["mujoco_bridge"]), resolved(split["mujoco_bridge"])
    assert (b1["wait_for_nodes"], b1["wait_for_state_subscribers"]) == \
        (b0["wait_for_nodes"] + 1, b0["wait_for_state_subscribers"] + 1) == (2 + 1 + 2, 1 + 1 + 2)
    # /clock: trajectory + controller + recorder + 2 learner nodes; joint_states: controller + recorder + 2
    mu, pr = resolved(split["model_update"]), resolved(split["prediction"])
    assert split["model_update"].executable == "model_update" and split["prediction"].executable == "prediction"
    assert mu["learner"] == pr["learner"] == "rbfn"
    assert mu["use_sim_time"] and pr["use_sim_time"]
    assert mu["reliable_streams"] is pr["reliable_streams"] is (mode == "lockstep")
    assert mu["target"] == "residual" and mu["publish_period"] == 0.1 and mu["hint_lead"] == 0.01
    assert mu["learn_decimation"] == resolved(plain["residual_learner"])["learn_decimation"]
    assert pr["prediction_lead"] == 0.02 and pr["extrapolate"] is True   # the override wins
    with pytest.raises(ValueError, match="choose a learner"):
        build_graph("sim", controller="composite", learner_split=True)
    with pytest.raises(ValueError, match="adaptive controller"):
        build_graph("sim", controller="pd", learner="gmm", learner_split=True)


def test_learner_split_on_a_real_robot_and_from_the_cli():
    """Real robot: both nodes keep their model in a file (config/real.yaml); the CLI's
    --learner-split and the launch files' learner_split reach build_graph."""
    from adaptive_dynamics.cli import _graph_from_args, build_parser

    nodes = by_name(build_graph("real", controller="composite", learner="gmm", learner_split=True, preset="lbr"))
    mu, pr = resolved(nodes["model_update"]), resolved(nodes["prediction"])
    assert mu["model_file"].endswith(".snap") and pr["model_file"].endswith(".snap")
    assert mu["model_file"] != pr["model_file"]
    assert nodes["model_update"].namespace == nodes["prediction"].namespace == "lbr"
    assert mu["reliable_streams"] is False and pr["reliable_streams"] is False and mu["use_sim_time"] is False
    args = build_parser().parse_args(["launch", "sim", "--controller", "composite", "--learner", "gmm",
                                      "--learner-split"])
    assert {"model_update", "prediction"} <= set(by_name(_graph_from_args(args, "sim")))
    args = build_parser().parse_args(["launch", "sim", "--controller", "composite", "--learner", "gmm"])
    assert "residual_learner" in by_name(_graph_from_args(args, "sim"))
    helper = ast.parse((ROOT / "launch" / "_graph_launch.py").read_text())
    keys = [k.value for n in ast.walk(helper) if isinstance(n, ast.Dict) for k in n.keys
            if isinstance(k, ast.Constant)]
    assert "learner_split" in keys
    call = next(n for n in ast.walk(helper) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "build_graph")
    assert "learner_split" in {kw.arg for kw in call.keywords}


def test_without_leaves_nodes_to_another_host():
    """without: those nodes are not started here (another host runs them); the lockstep
    bridge still waits for them, since they subscribe in the same ROS domain."""
    from adaptive_dynamics.cli import _graph_from_args, build_parser

    full = by_name(build_graph("sim", controller="composite", learner="gmm", learner_split=True))
    here = by_name(build_graph("sim", controller="composite", learner="gmm", learner_split=True,
                               without=("model_update",)))
    assert set(full) - set(here) == {"model_update"}
    assert resolved(here["mujoco_bridge"])["wait_for_nodes"] == resolved(full["mujoco_bridge"])["wait_for_nodes"]
    with pytest.raises(ValueError, match=r"without: \['residual_learner'\] not in this graph"):
        build_graph("sim", controller="composite", learner="gmm", learner_split=True, without=("residual_learner",))
    args = build_parser().parse_args(["launch", "real", "--controller", "composite", "--learner", "gmm",
                                      "--learner-split", "--without", "model_update", "--without", "trajectory"])
    assert set(by_name(_graph_from_args(args, "real"))) == {"adaptive_controller", "prediction"}
    helper = (ROOT / "launch" / "_graph_launch.py").read_text()
    assert '"without"' in helper and "without=" in helper


def test_set_overrides_give_ros_parameter_arrays_one_type():
    """`--set adaptive_controller.kd=[1, 2.5]`: YAML reads an int and a float, a ROS 2
    parameter array must have one type (rcl refuses the file otherwise): floats."""
    from adaptive_dynamics.scenarios import parse_overrides
    got = parse_overrides(["adaptive_controller.kd=[1, 2.5]", "trajectory.seed=3", "x.names=[a, b]",
                           "x.ints=[1, 2]"])
    assert got == {"adaptive_controller": {"kd": [1.0, 2.5]}, "trajectory": {"seed": 3},
                   "x": {"names": ["a", "b"], "ints": [1, 2]}}
    assert all(isinstance(v, float) for v in got["adaptive_controller"]["kd"])
    with pytest.raises(ValueError, match="NODE.PARAM=VALUE"):
        parse_overrides(["kd=[1.0]"])

"""Shared helper of the launch files: turn adaptive_dynamics.scenarios into Node actions."""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

from adaptive_dynamics.scenarios import build_graph

ARGS = {
    "robot": ("panda", "panda | iiwa14 | planar2"),
    "controller": ("computed_torque", "pd | computed_torque (node controller) | direct | composite"
                   " (node adaptive_controller) | scqp (node scqp_controller; the trajectory in task space)"
                   " | backstepping (node adaptive_controller, law backstepping; the trajectory in task space)"),
    "learner": ("none", "none | gmm | rbfn | gp | pgpol | sgpol: add the residual_learner node (needs controller direct|composite)"),
    "learner_split": ("false", "true: the learner runs as model_update + prediction (the PGPOL split) instead of"
                      " residual_learner"),
    "use_sim_time": ("", "default: true in sim, false on a real robot"),
    "record": ("false", "record an MCAP bag"),
    "mode": ("lockstep", "sim: lockstep | realtime"),
    "duration": ("0.0", "sim: stop after this much sim time (0 = run forever)"),
    "namespace": ("", "namespace of every node/topic (e.g. fr3, lbr)"),
    "preset": ("franka", "real: franka | lbr | gazebo"),
    "without": ("", "comma-separated nodes of the graph not to start here (they run on another host)"),
    "monitor": ("false", "true: add the external_torque node (external joint torques, end-effector wrench,"
                " contact flag from the momentum observer on the controller's model; its calibration first"
                " turns the graph's learning off: hold_learning)"),
    "trajectory": ("", "the trajectory node's type (default: the parameter files'), e.g. file"),
    "trajectory_file": ("", "trajectory:=file: the file to play (excitation.json / .csv of `adaptive-dynamics"
                        " excite`)"),
}


def generate(scenario):
    def make(context):
        a = {k: LaunchConfiguration(k).perform(context) for k in ARGS}
        ust = None if a["use_sim_time"] == "" else a["use_sim_time"].lower() == "true"
        traj = {k: v for k, v in (("type", a["trajectory"]), ("trajectory_file", a["trajectory_file"])) if v}
        nodes = build_graph(scenario, robot=a["robot"], controller=a["controller"], learner=a["learner"],
                            learner_split=a["learner_split"].lower() == "true", use_sim_time=ust,
                            record=a["record"].lower() == "true", mode=a["mode"], duration=float(a["duration"]),
                            namespace=a["namespace"], preset=a["preset"],
                            overrides={"trajectory": traj} if traj else None,
                            without=tuple(n.strip() for n in a["without"].split(",") if n.strip()),
                            monitor=a["monitor"].lower() == "true")
        return [Node(package="adaptive_dynamics", executable=s.executable, name=s.name,
                     namespace=s.namespace or None, parameters=[*s.param_files, s.params],
                     remappings=s.remappings, output="screen") for s in nodes]

    return LaunchDescription([DeclareLaunchArgument(k, default_value=d, description=h)
                              for k, (d, h) in ARGS.items()] + [OpaqueFunction(function=make)])

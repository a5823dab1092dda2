"""MuJoCo simulation graph: `ros2 launch adaptive_dynamics sim.launch.py robot:=panda controller:=computed_torque`.

Same nodes and parameter files as `adaptive-dynamics launch sim` (the pip path).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _graph_launch import generate  # noqa: E402


def generate_launch_description():
    return generate("sim")

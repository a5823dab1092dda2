"""Real robot (no simulator): trajectory + controller against a ros2_control stack.

    ros2 launch adaptive_dynamics real.launch.py robot:=panda preset:=franka
    ros2 launch adaptive_dynamics real.launch.py robot:=iiwa14 preset:=lbr   # KUKA FRI, topics under /lbr

The same interface serves gz_ros2_control in Gazebo (preset:=gazebo).  The robot's
effort controller must be a forward_command_controller named `effort_controller`.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from _graph_launch import generate  # noqa: E402


def generate_launch_description():
    return generate("real")

"""ament_python package setup for adaptive_dynamics.

Works both with `colcon build` in a ROS 2 workspace and with `pip install -e .`
(the pip path used by ./dev). Keep data_files in sync with launch/, config/, urdf/.
"""
import os
from glob import glob

from setuptools import find_packages, setup

package_name = "adaptive_dynamics"

# One console script per node plus the umbrella CLI.  Nodes are added here as
# they are implemented (adaptive_dynamics/nodes/<name>.py exposes main()).
NODES = ["mujoco_bridge", "trajectory", "controller", "adaptive_controller", "scqp_controller", "regressor",
         "recorder", "residual_learner", "model_update", "prediction", "external_torque"]


def _files(pattern):
    return [f for f in glob(pattern) if os.path.isfile(f)]


setup(
    name=package_name,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*", "bench"]),
    data_files=[
        ("share/ament_index/resource_index/packages", ["resource/" + package_name]),
        ("share/" + package_name, ["package.xml"]),
        ("share/" + package_name + "/launch", _files("launch/*.py")),
        ("share/" + package_name + "/config", _files("config/*.yaml")),
        ("share/" + package_name + "/urdf", _files("urdf/*.urdf")),
    ],
    package_data={package_name: ["py.typed"]},
    include_package_data=True,
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="adaptive_dynamics developers",
    maintainer_email="adaptive-dynamics@example.org",
    description="ROS 2 nodes that learn a torque-controlled robot's dynamics online while controlling it.",
    license="Apache-2.0",
    entry_points={
        "console_scripts": [
            "adaptive-dynamics = adaptive_dynamics.cli:main",
        ]
        + ["{0} = adaptive_dynamics.nodes.{0}:main".format(n) for n in NODES],
    },
)

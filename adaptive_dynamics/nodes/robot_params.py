"""The robot a node runs: its parameters (``robot``, ``urdf``, ``joint_names``,
``ee_frame``, ``armature``, ...), the URDF they name (a shipped robot, a file, or the
``robot_description`` topic) and the model built from it."""
from __future__ import annotations

import os
import time

from ..control.gains import armature_vector
from ..dynamics import RobotModel
from ..files import atomic_write_text
from ..robots import cache_dir, share_dir
from ..ros.params import ParamSpec

#: ``robot`` value (and topic) of a URDF taken from the robot_description topic
ROBOT_DESCRIPTION = "robot_description"


def robot_specs() -> list[ParamSpec]:
    """Parameters of the robot description (set by config/<robot>.yaml's ``/**``)."""
    return [
        ParamSpec("robot", "panda", "robot name (panda | iiwa14 | planar2), a URDF file, or robot_description"
                  " (the URDF from the robot_description topic, std_msgs/String, transient local, as"
                  " ros2_control's robot_state_publisher gives it); a label when urdf is set", read_only=True),
        ParamSpec("urdf", "", "URDF file: absolute, or relative to the package's urdf/ dir;"
                  " empty = urdf/<robot>.urdf", read_only=True),
        ParamSpec("joint_names", [""], "joint names in command order (matched by name on"
                  " joint_states); [''] = the URDF's order", read_only=True, type="str[]"),
        ParamSpec("ee_frame", "", "end-effector frame; empty = last frame of the URDF", read_only=True),
        ParamSpec("robot_description_timeout", 30.0, "robot robot_description: wall s to wait for the topic",
                  min=0.1, read_only=True),
        ParamSpec("end_effector", "hand", "hand: the bodies the URDF fixes after the last joint (the Panda's"
                  " Franka Hand) are part of the model, as their own parameters | none: the arm without them",
                  choices=["hand", "none"], read_only=True),
        ParamSpec("armature", [0.0], "drive (rotor) inertia reflected to each joint [kg m^2], 1 or n values:"
                  " the simulator's MuJoCo dof_armature, the model-derived gains' and the controllers' gain"
                  " check; URDFs carry none -- generated parameter files state an assumed"
                  " control.gains.default_armature, a real arm states its drives'", min=0.0, type="float[]",
                  read_only=True),
    ]


def friction_smoothing_spec() -> ParamSpec:
    """``friction_smoothing``: the Coulomb column's shape in every model with friction columns
    (the adaptive controller's, the regressor's, the learners', the external-torque
    observer's: they must agree; config/<robot>.yaml sets it in ``/**``)."""
    return ParamSpec("friction_smoothing", 0.0, "eps [rad/s] of the friction columns' Coulomb term tanh(qd / eps); 0"
                     " = sgn(qd) (the papers'); the shipped configs set 0.03, ten times a joint-velocity noise of"
                     " 0.003 rad/s: sgn of a noisy velocity flips the term by 2 f_c near every reversal; every"
                     " node of a graph must take the same value", min=0.0, max=10.0, read_only=True)


def armature_of(store, n: int):
    """The ``armature`` parameter as ``n`` values (:func:`~adaptive_dynamics.control.gains.armature_vector`)."""
    return armature_vector(store["armature"], n)


def fetch_robot_description(node, timeout: float) -> str:
    """The URDF text of the ``robot_description`` topic (std_msgs/String, reliable,
    transient local: the latched message ros2_control's robot_state_publisher keeps),
    spinning ``node`` on a private executor until it arrives; ``TimeoutError`` naming the
    topic after ``timeout`` wall seconds."""
    from rclpy.executors import SingleThreadedExecutor
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
    from std_msgs.msg import String

    qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=1, reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.TRANSIENT_LOCAL)
    got: list = []
    sub = node.create_subscription(String, ROBOT_DESCRIPTION, lambda m: got.append(m.data), qos)
    ex = SingleThreadedExecutor(context=node.context)
    ex.add_node(node)
    node.get_logger().info(f"waiting up to {timeout:g} s for the URDF on {node.resolve_topic_name(ROBOT_DESCRIPTION)}")
    deadline = time.monotonic() + timeout
    try:
        while not got and time.monotonic() < deadline:
            ex.spin_once(timeout_sec=0.05)
    finally:
        ex.remove_node(node)
        ex.shutdown()
        node.destroy_subscription(sub)
    if not got:
        raise TimeoutError(f"no URDF on {node.resolve_topic_name(ROBOT_DESCRIPTION)} within {timeout:g} s"
                           " (robot: robot_description needs a publisher, e.g. robot_state_publisher)")
    return got[-1]


def resolve_urdf(store, node=None) -> str:
    """The URDF file of the node's robot parameters: ``urdf``, else ``robot`` as a shipped
    name, a URDF file, or ``robot_description`` (fetched from the topic -- needs
    ``node`` -- and cached as a file by its content)."""
    robot = store["robot"]
    if not store["urdf"] and robot == ROBOT_DESCRIPTION:
        if node is None:
            raise ValueError("robot: robot_description needs the node to subscribe with")
        import hashlib
        text = fetch_robot_description(node, float(store["robot_description_timeout"]))
        path = cache_dir() / "robot_description" / (hashlib.sha256(text.encode()).hexdigest()[:16] + ".urdf")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, text)
        return str(path)
    if not store["urdf"] and os.path.isfile(robot):
        return os.path.abspath(robot)
    urdf = store["urdf"] or f"{robot}.urdf"
    if not os.path.isabs(urdf):
        urdf = str(share_dir() / "urdf" / urdf)
    if not os.path.exists(urdf):
        raise FileNotFoundError(f"URDF not found: {urdf} (parameters robot={store['robot']!r},"
                                f" urdf={store['urdf']!r})")
    return urdf


def load_robot(store, node=None, **kwargs) -> tuple[RobotModel, list[str]]:
    """RobotModel from the node's parameters and the joint order to use.

    ``joint_names`` must name exactly the URDF's joints (any order): commands are
    published in that order.  A mismatch raises ``ValueError`` listing the names.
    """
    rm = RobotModel(resolve_urdf(store, node), ee_frame=store["ee_frame"] or None, end_effector=store["end_effector"],
                    **kwargs)
    names = [n for n in store["joint_names"] if n]
    if not names:
        names = list(rm.joint_names)
    rm.joint_index(names)  # raises with missing/unexpected names
    return rm, names

"""Pieces every node shares: the robot parameters, real-time scheduling, a throttled
logger and a preallocated sample ring."""
from __future__ import annotations

import os
import time

from ..dynamics import RobotModel
from ..robots import share_dir
from ..ros.params import ParamSpec


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


def armature_of(store, n: int):
    """The ``armature`` parameter as ``n`` values (:func:`~adaptive_dynamics.control.gains.armature_vector`)."""
    from ..control.gains import armature_vector
    return armature_vector(store["armature"], n)


def discovery_hint() -> str:
    """``ROS_DOMAIN_ID=..., ROS_AUTOMATIC_DISCOVERY_RANGE=...`` of this process: what a node
    waiting for a topic names, so that a graph split across domains is found."""
    return (f"ROS_DOMAIN_ID={os.environ.get('ROS_DOMAIN_ID', '0 (unset)')},"
            f" ROS_AUTOMATIC_DISCOVERY_RANGE={os.environ.get('ROS_AUTOMATIC_DISCOVERY_RANGE', 'unset')}")


def realtime_spec() -> ParamSpec:
    """``realtime_priority``: the hot nodes' (bridge, controllers) real-time scheduling."""
    return ParamSpec("realtime_priority", 0, "SCHED_FIFO priority (1-98) for every thread of this"
                     " node's process (hot path, DDS threads; adaptive_dynamics.realtime); 0 = normal"
                     " scheduling.  Needs root, CAP_SYS_NICE or an rtprio limit: without, a warning"
                     " and normal scheduling", min=0, max=98, read_only=True)


def apply_realtime_priority(node, counters) -> bool:
    """Apply the node's ``realtime_priority`` (call it once every thread exists: threads
    created later inherit the policy).  Logs the outcome, puts it in the diagnostics
    (``sched``) and returns whether SCHED_FIFO is in effect."""
    from ..realtime import set_fifo_priority
    prio = int(node.p["realtime_priority"])
    if prio <= 0:
        return False
    ok, msg = set_fifo_priority(prio)
    if ok:
        node.get_logger().info(f"realtime_priority: {msg}")
        counters.set("sched", f"SCHED_FIFO {prio}")
    else:
        node.get_logger().warning(f"realtime_priority {prio} not applied: {msg}; running with normal"
                                  f" scheduling")
        counters.set("sched", f"normal (SCHED_FIFO {prio} not permitted)")
    return ok


def stall_spec() -> ParamSpec:
    """``inject_stall_ms``: a fault drill for the hot nodes (bridge, controllers)."""
    return ParamSpec("inject_stall_ms", 0.0, "fault drill: each set > 0 stalls this node's hot loop once for"
                     " that many ms (what a page fault storm, a GC pause or a neighbour does), to watch the"
                     " loop recover: the bridge reports the overload episode in /diagnostics; 0 = nothing",
                     min=0.0, max=10000.0)


class StallInjector:
    """The hot loop's side of ``inject_stall_ms``: :meth:`take` sleeps once for each
    value set (a plain attribute read otherwise)."""

    def __init__(self, node):
        self.node, self.pending_s, self.injected = node, 0.0, 0
        node.p.on_change("inject_stall_ms", self._on_set)

    def _on_set(self, _name, value) -> None:
        if value > 0:
            self.pending_s = float(value) * 1e-3

    def take(self) -> None:
        if self.pending_s:
            s, self.pending_s = self.pending_s, 0.0
            self.injected += 1
            self.node.get_logger().warning(f"inject_stall_ms: stalling the hot loop for {1e3 * s:.0f} ms")
            time.sleep(s)


ROBOT_DESCRIPTION = "robot_description"


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
        from ..robots import cache_dir
        text = fetch_robot_description(node, float(store["robot_description_timeout"]))
        path = cache_dir() / "robot_description" / (hashlib.sha256(text.encode()).hexdigest()[:16] + ".urdf")
        if not path.exists():
            from ..files import atomic_write_text
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


class Throttle:
    """At most one log line per ``period`` seconds per key (wall clock)."""

    def __init__(self, period: float = 1.0):
        self.period = period
        self._last: dict = {}

    def __call__(self, key: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, -1e9) >= self.period:
            self._last[key] = now
            return True
        return False


def trigger_save(res, save, *, what: str, unset: str):
    """Fill a ``std_srvs/Trigger`` response from ``save()`` (a path, or None when there is
    nothing to save -- ``unset`` says why)."""
    try:
        path = save()
    except OSError as exc:
        res.success, res.message = False, f"save failed: {exc}"
        return res
    res.success = path is not None
    res.message = f"{what} saved to {path}" if path else unset
    return res


def shutdown_save(node, save, what: str) -> None:
    """A node's save at shutdown, logged: ``save()`` returns a path (or None: nothing to
    save); a failure is logged, never raised (the rest of the shutdown -- the zero
    command -- must run)."""
    try:
        path = save()
        if path:
            node.get_logger().info(f"{what} saved to {path}")
    except Exception as exc:
        node.get_logger().error(f"saving the {what} failed: {exc}")


class SampleRing:
    """The last ``capacity`` integer samples (e.g. latencies in ns) in a preallocated
    ring: :meth:`add` is O(1) and allocates nothing (it runs on a 1 kHz hot path).

    A ``collections.deque`` of Python ints had to be converted to an array for every
    statistic: ~8 ms with the GIL held for 100k samples, i.e. eight missed 1 kHz cycles
    of the thread that shares the GIL, once per diagnostics period.  Here a periodic
    report takes percentiles of the :meth:`recent` samples (a copy of at most ``k``
    values, tens of us), and only the final statistics read them :meth:`all`."""

    def __init__(self, capacity: int):
        import numpy as np
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._buf = np.zeros(int(capacity), dtype=np.int64)
        self._count = 0

    def add(self, value: int) -> None:
        self._buf[self._count % self._buf.size] = value
        self._count += 1

    def __len__(self) -> int:
        return min(self._count, self._buf.size)

    @property
    def total(self) -> int:
        """Samples ever added (including those overwritten)."""
        return self._count

    def recent(self, k: int):
        """A copy of the last ``min(k, len(self))`` samples, oldest first."""
        import numpy as np
        k = min(int(k), len(self))
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        end = self._count % self._buf.size
        if end >= k:
            return self._buf[end - k:end].copy()
        return np.concatenate((self._buf[self._buf.size - (k - end):], self._buf[:end]))

    def all(self):
        """A copy of every retained sample, oldest first."""
        return self.recent(len(self))

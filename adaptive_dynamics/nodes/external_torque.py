"""``external_torque`` node: external joint torques, the end-effector wrench and a contact
flag from the generalized-momentum observer (:mod:`adaptive_dynamics.control.momentum_observer`,
:mod:`adaptive_dynamics.control.contact`) on the URDF's model or the adaptive
controller's estimate, plus the residual learner's prediction.

A thin adapter: parameters -> the cores; every ``joint_states`` (measured torque in
``effort``; matched by joint name) -> one observer step -> ``external_torque``,
``external_wrench`` and ``contact``, all stamped with the state's stamp.

Manual (topics, parameters, calibration, diagnostics): ``docs/nodes.md#external_torque``;
parameters: ``ros2 param describe /external_torque <name>``.
"""
from __future__ import annotations

import collections
import datetime
import os
import threading
import time

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import WrenchStamped
from rcl_interfaces.msg import ParameterEvent, ParameterType
from rclpy.clock import Clock, ClockType
from rclpy.expand_topic_name import expand_topic_name
from rclpy.node import Node
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient
from rclpy.qos import qos_profile_parameter_events
from sensor_msgs.msg import JointState

from ..control.adaptive_setup import friction_model
from ..control.contact import (CALIBRATION_METHODS, CHANGE_HOLD, CHANGE_WINDOW, WHITENING_WINDOW, ContactDetector,
                               NoiseWhitening, ThresholdCalibration, calibrate_change, calibrate_residual_joints,
                               calibrate_whitening)
from ..control.momentum_observer import (TORQUE_TIMINGS, EstimateLayout, MomentumObserver, damped_transpose_pinv,
                                         observer_model)
from ..ros.arrays import VectorBuffer, vector_from_msg
from ..ros.joint_states import JointStateMapper, joint_state_msg
from ..ros.node_base import Counters, diagnostic_array, run_node
from ..files import atomic_write_text
from ..ros.params import ParamSpec, declare_params, load_param_file
from ..ros.qos import DEEP_RELIABLE_QOS, LATCHED_QOS, PUBLISHER_STREAM_QOS, stream_qos
from ..ros.stamps import from_ns
from ..validation import per_joint
from .housekeeping import Throttle
from .robot_params import armature_of, friction_smoothing_spec, load_robot, robot_specs

MODEL_SOURCES = ("urdf", "estimate")
#: declared with the robot's parameters (the model is built from them)
_MODEL_PARAMS = ("friction", "friction_smoothing")


def _lengths(n):
    """Validator of a per-joint array parameter: 1 or ``n`` values (any while ``n`` is unknown)."""
    def check(value) -> str | None:
        return None if n is None or len(value) in (1, n) else f"needs 1 or {n} values (one per joint), got {len(value)}"
    return check


def _thresholds_check(n):
    lengths = _lengths(n)

    def check(value) -> str | None:
        v = np.asarray(value, dtype=float)
        if (why := lengths(v)) is not None:
            return why
        if np.any(v < 0) or (np.any(v == 0) and not np.all(v == 0)):
            return "each threshold must be > 0 [N m] ([0] = none: no contact detection until calibrated)"
        return None
    return check


def _whitening_check(n, what: str):
    """Validator of a whitening array: ``n`` values >= 0, or [0] (none)."""
    def check(value) -> str | None:
        v = np.asarray(value, dtype=float)
        if v.size == 1 and v[0] == 0:
            return None
        if n is not None and v.size != n:
            return f"needs {n} values (one per joint) or [0] (none), got {v.size}"
        if np.any(v < 0) or (what == "thresholds" and np.any(v == 0)):
            return f"each value must be {'> 0' if what == 'thresholds' else '>= 0'} ([0] = none)"
        return None
    return check


#: the live parameters a running calibration is taken under (a change cancels it)
_CALIBRATION_INPUTS = ("use_residual", "residual_select", "residual_joints", "uncertainty_gain", "model_std",
                       "min_samples", "calibration_margin", "calibration_method", "whiten", "whitening_window",
                       "change_window")
#: the most states waiting for their residual (residual_wait) before the oldest is taken without
MAX_PENDING = 2000
#: the most states a calibration keeps for the whitening (r and M(q) of each; the first ones)
WHITENING_MAX_SAMPLES = 50_000
#: the whitening's parameters (set together by a calibration)
_WHITENING_PARAMS = ("whitening_white", "whitening_slow", "whitened_thresholds", "change_thresholds")
#: what a calibration sets, the parameters calibration_file keeps
CALIBRATED_PARAMS = ("thresholds", "residual_joints", *_WHITENING_PARAMS)
#: observer time constants (1 / K_O) d is not watched after the residual came or went (r settles to 5 %)
CHANGE_SETTLE = 3.0
#: a calibration chooses residual_joints only when the residual came with at least this share of its states
RESIDUAL_COVERAGE = 0.9
#: stamp time [s] a calibration lets pass once hold_learning's nodes acknowledged (the estimate, the
#: residuals and a model snapshot already on their way were made by the model before the hold)
HOLD_SETTLE_S = 0.5


class _Hold:
    """hold_learning of one calibration: the nodes asked to set ``learning`` false, those
    that did, those that did not (with why), the wall time it started and the stamp at
    which every node had answered (or hold_timeout ran out)."""

    def __init__(self, names: list, t0: float):
        self.names, self.t0 = list(names), t0
        self.asked, self.held, self.failed = set(), [], []
        self.done_stamp = None
        self.note = ""
        #: the node's record of what is held was set from it (calibration done or cancelled)
        self.committed = False

    @property
    def pending(self) -> list:
        answered = set(self.held) | {x for x, _why in self.failed}
        return [x for x in self.names if x not in answered]


class _Calibration:
    """A running calibration: the statistics (with, and without, the residual), its
    length [s], the states that came with a residual and, for the whitening, the states'
    r (with, without the residual) and inertia (``samples``: None without ``whiten``)."""

    def __init__(self, cals: list, seconds: float, whiten: bool = False, after: float = 0.0):
        self.cals, self.seconds, self.with_residual = cals, seconds, 0
        self.samples = ([], [], [], []) if whiten else None     # r with, r without, M(q), d suspended
        #: states (stamp time [s]) let pass before the first one taken; the first state's time
        self.after, self.t_first = float(after), None
        #: hold_learning (a _Hold once the calibration reached it; None: not yet or no nodes)
        self.hold = None


def _node_names_check(value) -> str | None:
    """Validator of ``hold_learning``: ROS node names, relative or absolute, [''] = none."""
    from rclpy.validate_namespace import validate_namespace
    from rclpy.validate_node_name import validate_node_name
    for name in (x for x in value if x):
        ns, _, base = name.rpartition("/")
        try:
            validate_node_name(base)
            if ns or name.startswith("/"):
                validate_namespace(ns if ns.startswith("/") else "/" + ns)
        except Exception as exc:   # noqa: BLE001 -- rclpy's Invalid*Exception: say which name and why
            return f"{name!r} is not a node name ({str(exc).splitlines()[0]})"
    return None


def _joint_names_check(names):
    """Validator of ``residual_joints``: ['all'], [''] or the robot's joint names."""
    def check(value) -> str | None:
        got = [x for x in value if x]
        if names is None or got == ["all"]:
            return None
        unknown = [x for x in got if x not in names]
        return None if not unknown else (f"unknown joints {unknown}; the robot's are {list(names)} (or ['all'],"
                                         " [''] = none)")
    return check


def specs(n: int | None = None, names=None) -> list[ParamSpec]:
    """Every parameter (``n``: the robot's joints, for the per-joint arrays' lengths;
    ``names``: its joint names, for ``residual_joints``)."""
    return robot_specs() + monitor_specs(n, names)


def monitor_specs(n: int | None = None, names=None) -> list[ParamSpec]:
    """The observer's, the detector's and the streams' parameters (beside the robot's)."""
    lengths = _lengths(n)
    return [
        ParamSpec("model_source", "urdf", "urdf: the URDF's rigid-body model | estimate: the adaptive controller's"
                  " estimate on adaptive/parameters (the URDF's model until the first arrives)",
                  choices=list(MODEL_SOURCES), read_only=True),
        ParamSpec("friction", False, "the estimate carries viscous + Coulomb friction columns (as the adaptive"
                  " controller's `friction`); with model_source urdf they are zero", read_only=True),
        friction_smoothing_spec(),
        ParamSpec("adapted_links", [""], "the adaptive controller's adapted_links (to read its estimate; the"
                  " other links keep the URDF's values); [''] = every link", type="str[]", read_only=True),
        ParamSpec("friction_model_file", "", "a fixed joint-friction model beside the estimate (the adaptive"
                  " controller's friction_model_file: friction_<kind>.json of `adaptive-dynamics identify`)",
                  read_only=True),
        ParamSpec("use_residual", False, "subtract the learned residual feedforward/residual (stamped for the"
                  " state's instant, else the newest within residual_staleness) from what the observer reports,"
                  " on residual_joints"),
        ParamSpec("residual_input", "reference", "which residual use_residual takes: reference"
                  " (feedforward/residual, the learner's prediction at the reference, as the controller takes it)"
                  " | state (residual/state of a residual_learner with state_residual: its prediction at the"
                  " measured state -- the observer compares the measured motion with the model at it)",
                  choices=["reference", "state"], read_only=True),
        ParamSpec("use_residual_std", False, "with use_residual: add the learner's predictive std"
                  " (feedforward/residual_std, stamped like the residual) to the thresholds' uncertainty term:"
                  " threshold = thresholds + uncertainty_gain x sqrt(model_std^2 + std^2)", read_only=True),
        ParamSpec("residual_joints", ["all"], "with use_residual: the joints whose external torque takes the"
                  " residual, ['all'] or joint names ([''] = none); set by a calibration with residual_select",
                  type="str[]", validator=_joint_names_check(names)),
        ParamSpec("residual_select", True, "a calibration with use_residual also sets residual_joints: it"
                  " calibrates the estimate with and without the residual over the same free motion and keeps"
                  " the residual on a joint only where its threshold is not higher"),
        ParamSpec("residual_staleness", 0.01, "use a residual (and its std) at most this old [s] when none is"
                  " stamped for the state's instant", min=0.0, max=10.0),
        ParamSpec("residual_wait", 0.2, "with use_residual: a state whose residual is not there yet waits up to"
                  " this many wall s for it, the states taken in order (the learner's residual/state comes just"
                  " after its state, later when the learner lags), then is taken without it (residual_missing);"
                  " 0 = never wait", min=0.0, max=10.0),
        ParamSpec("gains", [50.0], "observer gains K_O [1/s], 1 or n values (> 0): r follows the external"
                  " torque with time constant 1/K_O", type="float[]", min=1e-3, max=1e5, validator=lengths),
        ParamSpec("filter_gains", [0.0], "K_F [1/s] of a second low pass on r, 1 or n values (0 = off): the"
                  " velocity noise reaches r as K_O M(q) times a differenced white noise, which this removes"
                  " at a lag of 1/K_F", type="float[]", min=0.0, max=1e5, validator=lengths),
        ParamSpec("torque_timing", "held", "held: the effort of a state is the torque applied over the step"
                  " before it (the simulator; an effort command held) | sampled: a torque sensor read at the"
                  " instants (the step uses the mean of the two samples)", choices=list(TORQUE_TIMINGS),
                  read_only=True),
        ParamSpec("max_gap", 0.1, "a gap between states longer than this [s] holds the estimate and restarts"
                  " the integration (counted in gaps)", min=1e-4, max=60.0),
        ParamSpec("thresholds", [0.0], "contact thresholds on |external torque| [N m], 1 or n values (> 0);"
                  " [0] = none (no contact detection until calibrated); set by a calibration",
                  type="float[]", min=0.0, validator=_thresholds_check(n)),
        ParamSpec("calibrate", 0.0, "> 0: calibrate the thresholds from this many seconds of (free-motion!)"
                  " states from now on, then set `thresholds` and return to 0 (at start too)", min=0.0, max=3600.0),
        ParamSpec("calibrate_after", 0.0, "s of states (stamp time) a calibration lets pass before it takes"
                  " any: set with calibrate at start (a launch file, the pip launcher's --set), it calibrates"
                  " once the estimate has settled, with no parameter call later", min=0.0, max=36000.0),
        ParamSpec("calibration_file", "", "a ROS parameter file (YAML) that keeps what a calibration sets"
                  f" ({', '.join(CALIBRATED_PARAMS)}) under this node's name: written after each calibration"
                  " (atomically; the file's other sections kept), read at start when it exists -- the monitor starts"
                  " calibrated; values given at launch win; a file for other joints, model or residual is not"
                  " used; empty = none", read_only=True),
        ParamSpec("hold_learning", [""], "nodes (names, relative to this node's namespace) whose `learning`"
                  " parameter a calibration sets false before it takes a state, so that the thresholds hold for"
                  " the model they were calibrated on (e.g. ['adaptive_controller', 'residual_learner']; the"
                  " launchers' --monitor sets the graph's learning nodes); learning stays off -- set it true on"
                  " them to resume: the node then reports its thresholds stale; [''] = none", type="str[]",
                  validator=_node_names_check),
        ParamSpec("hold_timeout", 5.0, "wall s a calibration waits for hold_learning's nodes to answer; then it"
                  " calibrates anyway (warning, diagnostics)", min=0.1, max=600.0),
        ParamSpec("calibration_method", "max", "max: calibration_margin x max |r| over the segment (the largest"
                  " level |r| stayed above for min_samples consecutive samples) | std: |mean r| + calibration_k x"
                  " std r", choices=list(CALIBRATION_METHODS)),
        ParamSpec("calibration_margin", 1.5, "calibration_method max: factor on the largest |r| seen",
                  min=1.0, max=100.0),
        ParamSpec("calibration_k", 5.0, "calibration_method std: standard deviations above |mean|",
                  min=0.0, max=100.0),
        ParamSpec("threshold_floor", [0.0], "smallest calibrated threshold [N m], 1 or n values", type="float[]",
                  min=0.0, validator=lengths),
        ParamSpec("model_std", [0.0], "the model's own torque uncertainty [N m] per joint, 1 or n values (e.g."
                  " the identification residual's standard deviation), added as uncertainty_gain x std",
                  type="float[]", min=0.0, validator=lengths),
        ParamSpec("uncertainty_gain", 0.0, "k_u: threshold = thresholds + k_u x model_std (x sqrt(model_std^2 +"
                  " std^2) with use_residual_std)", min=0.0, max=100.0),
        ParamSpec("whiten", True, "the detector also watches the noise-whitened estimate z = L(q)^-1 r, L L^T ="
                  " M(q) diag(whitening_white^2) M(q) + diag(whitening_slow^2) (the velocity noise reaches r through"
                  " M(q), coupled): a calibration sets the noise model and whitened_thresholds from the same free"
                  " motion; a joint is in contact when |r| or |z| is above its threshold | false: r alone"),
        ParamSpec("whitening_white", [0.0], "the noise model's white part per joint (of M^-1 r), n values; [0] ="
                  " none (r alone); set by a calibration with whiten", type="float[]", min=0.0,
                  validator=_whitening_check(n, "white")),
        ParamSpec("whitening_slow", [0.0], "the noise model's slow part per joint [N m] (r averaged over"
                  " whitening_window states), n values; set by a calibration with whiten", type="float[]", min=0.0,
                  validator=_whitening_check(n, "slow")),
        ParamSpec("whitened_thresholds", [0.0], "thresholds on |z| (no unit), n values (> 0); [0] = none (r"
                  " alone); set by a calibration with whiten", type="float[]", min=0.0,
                  validator=_whitening_check(n, "thresholds")),
        ParamSpec("whitening_window", WHITENING_WINDOW, "states r is averaged over for the noise model's slow"
                  f" part (a calibration with whiten keeps r and M(q) of its first {WHITENING_MAX_SAMPLES} states)",
                  min=2, max=10000),
        ParamSpec("change_window", CHANGE_WINDOW, "with whiten: the detector also watches the change of r over"
                  " this many states, d = L_w(q)^-1 (r_k - r_(k-change_window)), L_w L_w^T = M(q)"
                  " diag(whitening_white^2) M(q): a model error is slow, a contact a step -- d sees a push's onset"
                  " through a model error that raises z's thresholds; a calibration sets change_thresholds; 0 = off",
                  min=0, max=10000),
        ParamSpec("change_hold", CHANGE_HOLD, "states a contact d flagged stays flagged (d marks the onset; r"
                  " or z rises above its threshold meanwhile)", min=0, max=1000000),
        ParamSpec("change_thresholds", [0.0], "thresholds on |d| (no unit), n values (> 0); [0] = none; set by a"
                  " calibration with whiten and change_window > 0 (for that window)", type="float[]", min=0.0,
                  validator=_whitening_check(n, "thresholds")),
        ParamSpec("release", 0.8, "a joint leaves contact below release x its threshold (hysteresis)",
                  min=0.01, max=1.0),
        ParamSpec("min_samples", 1, "consecutive samples above the threshold before a joint is in contact",
                  min=1, max=1000),
        ParamSpec("publish_wrench", True, "publish external_wrench (the damped pseudo-inverse of J^T)"),
        ParamSpec("wrench_frame", "", "frame of external_wrench (its axes, moment about its origin); empty ="
                  " the end effector (ee_frame)", read_only=True),
        ParamSpec("wrench_damping", 0.05, "largest damping of the pseudo-inverse of J^T, reached at a singular"
                  " pose", min=0.0, max=10.0),
        ParamSpec("wrench_threshold", 0.05, "smallest singular value of J below which the damping rises",
                  min=1e-6, max=10.0),
        ParamSpec("reliable_streams", True, "subscribe joint_states reliably, 1000 deep (lockstep: every state,"
                  " late rather than lost); false = best effort depth 1 (real time: the newest)", read_only=True),
        ParamSpec("diagnostics_period", 1.0, "s between /diagnostics messages (wall)", min=0.05, max=60.0),
    ]


class ExternalTorqueNode(Node):
    def __init__(self, **kwargs):
        super().__init__("external_torque", **kwargs)
        p = self.p = declare_params(self, robot_specs() + [s for s in monitor_specs() if s.name in _MODEL_PARAMS])
        model, _ = load_robot(p, self, friction=p["friction"], coulomb_smoothing=p["friction_smoothing"])
        self.model = model
        self.n = n = model.n
        self.names = list(model.joint_names)
        declare_params(self, [s for s in monitor_specs(n, self.names) if s.name not in _MODEL_PARAMS])
        self.counters = Counters("external_torque", self.get_fully_qualified_name(),
                                 warn_on=("joint_states_rejected", "out_of_order", "estimate_rejected",
                                          "residual_rejected", "residual_std_rejected", "nonfinite_output"))
        self.log_throttle = Throttle(1.0)
        self._lock = threading.RLock()
        self._last_stamp = None              # stamp [ns] of the last state taken
        self._change_settle_until = None     # stamp [ns] until which d is not watched (the model changed)
        # ---- the cores
        fixed = friction_model(model, p["friction_model_file"]) if p["friction_model_file"] else None
        # the drives' inertia: added to the URDF's M; not to the adaptive estimate's (the controller's
        # regressor has none: its estimate carries what of it the link inertias can, a learner the rest)
        arm = armature_of(p, n)
        self.observer_armature = arm if p["model_source"] == "urdf" else np.zeros(n)
        # the whitening's inertia: the URDF's M plus the drives' (physical: an adapted estimate's M
        # need not be positive definite, and its inverse is what the noise model takes)
        self._drive_inertia = np.diag(arm)
        self.observer = MomentumObserver(observer_model(model), p["gains"], fixed_friction=fixed,
                                         armature=self.observer_armature, torque_timing=p["torque_timing"],
                                         max_gap=p["max_gap"], copy=False, filter_gains=p["filter_gains"])
        self._set_residual_joints(p["residual_joints"])
        self.layout = None
        if p["model_source"] == "estimate":
            self.layout = EstimateLayout(model, adapted_links=[x for x in p["adapted_links"] if x])
        self.detector = ContactDetector(None, n=n, joint_names=self.names, uncertainty_gain=p["uncertainty_gain"],
                                        model_std=p["model_std"], release=p["release"],
                                        min_samples=p["min_samples"])
        self._set_thresholds(p["thresholds"])
        self._set_whitening()
        self.wrench_frame = p["wrench_frame"] or model.ee_frame
        model.frame_id(self.wrench_frame)   # raises naming the frames
        self.mapper = JointStateMapper(model.joint_names)
        self.residuals = VectorBuffer(4096)
        self.residual_stds = VectorBuffer(4096)
        self._origin = None          # stamp [ns] of the first state: t = (stamp - origin) * 1e-9
        self._pending = collections.deque()   # (stamp, q, v, tau, wall t) waiting for their residual
        self._estimate_stamp = None
        self._calibration = None     # _Calibration while one runs
        self._last_std = None        # the last learner std received (stands in for a missing one)
        self._calibrate_reset = False
        self._peak = np.zeros(n)     # max |r| since the last diagnostics
        self._residual_present = None        # whether the last state had its residual (use_residual)
        self._change_suspended = False       # d not watched at the last state
        self._change_reset = False           # change_thresholds back to [0] with the next state
        self._at_report = (0, 0)             # the states and change_suspended counters at the last diagnostics
        self._hold_clients = {}      # hold_learning: node name -> AsyncParameterClient
        self._held = {}              # the last calibration's held nodes: fully qualified name -> given name
        self._hold_warning = None    # a hold that failed, or learning resumed on a held node (stale thresholds)
        self.counters.set("model", "urdf" if self.layout is None else "estimate (waiting for adaptive/parameters)")
        hold = [x for x in p["hold_learning"] if x]
        self.counters.set("hold", f"{hold} at a calibration" if hold else "off")
        # ---- live parameters
        for name in ("gains", "max_gap", "filter_gains"):
            self.p.on_change(name, self._on_observer_param)
        for name in ("uncertainty_gain", "model_std", "release", "min_samples"):
            self.p.on_change(name, self._on_detector_param)
        self.p.on_change("thresholds", self._on_thresholds)
        for name in (*_WHITENING_PARAMS, "change_hold"):
            self.p.on_change(name, lambda _n, _v: self._set_whitening())
        self.p.on_change("change_window", self._on_change_window)
        self.p.on_change("residual_joints", lambda _n, v: self._set_residual_joints(v))
        self.p.on_change("calibrate", lambda _n, v: self._start_calibration(v))
        for name in _CALIBRATION_INPUTS:   # a running calibration is taken under these: a change cancels it
            self.p.on_change(name, self._cancel_calibration)
        # ---- topics
        self.pub_torque = self.create_publisher(JointState, "external_torque", PUBLISHER_STREAM_QOS)
        self.pub_wrench = self.create_publisher(WrenchStamped, "external_wrench", PUBLISHER_STREAM_QOS)
        self.pub_contact = self.create_publisher(JointState, "contact", PUBLISHER_STREAM_QOS)
        self.pub_diag = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        # reliable: every state, 1000 deep (the observer integrates each step: one the monitor is slow
        # for is better late than lost); best effort: the newest
        self.create_subscription(JointState, "joint_states", self._on_state,
                                 DEEP_RELIABLE_QOS if p["reliable_streams"] else stream_qos(False),
                                 raw=True)   # serialized -> arrays (wire.py)
        self.residual_topic = "residual/state" if p["residual_input"] == "state" else "feedforward/residual"
        self.create_subscription(JointState, self.residual_topic, self._on_residual, DEEP_RELIABLE_QOS)
        self.use_std = bool(p["use_residual_std"])
        if self.use_std:
            self.create_subscription(JointState, "feedforward/residual_std", self._on_residual_std,
                                     DEEP_RELIABLE_QOS)
        if self.layout is not None:
            self.create_subscription(JointState, "adaptive/parameters", self._on_estimate, LATCHED_QOS)
        # hold_learning: learning set true again on a held node makes the thresholds stale
        self.create_subscription(ParameterEvent, "/parameter_events", self._on_parameter_event,
                                 qos_profile_parameter_events)
        steady = Clock(clock_type=ClockType.STEADY_TIME)
        self.create_timer(p["diagnostics_period"], self._diagnostics, clock=steady)
        self.create_timer(0.02, self._drain, clock=steady)     # states whose residual_wait ran out
        self.calibration_file = os.path.abspath(p["calibration_file"]) if p["calibration_file"] else ""
        self.counters.set("calibration_file", "none")
        if self.calibration_file:
            self._read_calibration(self.calibration_file)
        self._start_calibration(p["calibrate"])
        self.get_logger().info(
            f"model {p['model_source']}{' + friction' if p['friction'] else ''}"
            f"{' + fixed friction' if fixed is not None else ''}, residual "
            f"{('on (' + self.residual_topic + ')') if p['use_residual'] else 'off'}"
            f"{' (+ its std in the thresholds)' if self.use_std and p['use_residual'] else ''},"
            f" armature {self.observer_armature.tolist()}{' (none on the estimate)' if self.layout else ''}, K_O {np.asarray(p['gains']).tolist()} 1/s,"
            f" thresholds "
            f"{self.detector.thresholds.tolist() if self.detector.configured else 'none'}; joints {self.names}")

    # ------------------------------------------------------------- parameters
    def _calibration_context(self) -> dict:
        """What a calibration holds for: written beside it and checked when it is read (a file
        of another robot, model or residual is not used)."""
        p = self.p
        return {"calibration_joints": list(self.names), "calibration_model": p["model_source"],
                "calibration_residual": (p["residual_input"] if p["use_residual"] else "none")}

    def _read_calibration(self, path: str) -> None:
        """calibration_file at start: its calibrated parameters set together (all refused if
        one is: a file of another robot, model or residual, or corrupt, leaves the node
        uncalibrated), except those given at launch (not at their defaults: they win); logged."""
        if not os.path.exists(path):
            self.counters.set("calibration_file", f"{path} (not there yet: written by the next calibration)")
            return
        given = [name for name in CALIBRATED_PARAMS
                 if list(self.p[name]) != list(self.p.spec(name).default)]
        try:
            values = load_param_file(path, self.get_fully_qualified_name())
            for key, want in self._calibration_context().items():
                if key in values and values[key] != want:
                    raise ValueError(f"it holds a calibration for {key.split('_', 1)[1]} {values[key]!r}, this node"
                                     f" has {want!r}")
            params = []
            window = values.get("calibration_change_window")
            skip = set()
            if "change_thresholds" in values and (window is None or int(window) != self.p["change_window"]):
                skip.add("change_thresholds")      # d's thresholds are its window's
                self.get_logger().warning(f"calibration_file {path}: change_thresholds were calibrated for"
                                          f" change_window {window if window is not None else '(not said)'}, this"
                                          f" node has {self.p['change_window']}: not used (the next calibration"
                                          " sets them)")
            for name in CALIBRATED_PARAMS:
                if name in values and name not in given and name not in skip:
                    spec = self.p.spec(name)
                    params.append(Parameter(name, spec.ros_type, spec.coerce(values[name])))
            if not params and not given:
                raise ValueError(f"no section for {self.get_fully_qualified_name()} with any of {CALIBRATED_PARAMS}")
            if params:
                res = self.set_parameters_atomically(params)
                if not res.successful:
                    raise ValueError(res.reason)
        except Exception as exc:   # noqa: BLE001 -- unreadable, corrupt or refused: said, not fatal
            why = str(exc).splitlines()[0] if str(exc) else repr(exc)
            self.counters.set("calibration_file", f"{path}: not used ({why})")
            self.get_logger().error(f"calibration_file {path} not used: {exc}; the node starts uncalibrated"
                                    " (calibrate: the next calibration rewrites it)")
            return
        self.counters.set("calibration_file", f"{path} (read)" + (f"; given at launch: {given}" if given else ""))
        self.get_logger().info(f"calibration read from {path}: {', '.join(p.name for p in params) or 'nothing'}"
                               + (f" ({given} given at launch kept)" if given else ""))

    def _write_calibration(self, path: str) -> None:
        """After a calibration: this node's calibrated parameters (and what they hold for) into
        calibration_file, under the node's name -- the file's other sections and this
        section's other parameters kept; one that is not YAML is moved aside (``.unreadable``)."""
        import yaml
        values = {name: [str(x) if name == "residual_joints" else float(x) for x in self.p[name]]
                  for name in CALIBRATED_PARAMS}
        values.update(self._calibration_context())
        values["calibration_change_window"] = int(self.p["change_window"])
        key = self.get_fully_qualified_name()
        head = (f"# external_torque calibration_file: each node's section written after its calibration, read at"
                f" start\n# last: {key}, {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}\n")
        try:
            doc = {}
            if os.path.exists(path):
                try:
                    with open(path, encoding="utf-8") as fh:
                        doc = yaml.safe_load(fh) or {}
                    if not isinstance(doc, dict):
                        raise ValueError("its top level is not a mapping")
                except (yaml.YAMLError, ValueError) as exc:
                    os.replace(path, path + ".unreadable")
                    self.get_logger().warning(f"calibration_file {path} was not a parameter file ({exc}): moved to"
                                              f" {path}.unreadable")
                    doc = {}
            section = doc.setdefault(key, {})
            if not isinstance(section, dict):
                section = doc[key] = {}
            params = section.setdefault("ros__parameters", {})
            if not isinstance(params, dict):
                params = section["ros__parameters"] = {}
            params.update(values)
            atomic_write_text(path, head + yaml.safe_dump(doc, default_flow_style=None, sort_keys=False))
        except OSError as exc:
            self.counters.set("calibration_file", f"{path}: write failed ({exc})")
            self.get_logger().error(f"calibration_file {path} not written: {exc}")
            return
        self.counters.set("calibration_file", f"{path} (written)")
        self.get_logger().info(f"calibration written to {path}")

    def _on_thresholds(self, _name, value) -> None:
        """thresholds set (by hand, or by a calibration, which then records its hold): a
        stale-thresholds warning is the user's to clear this way."""
        with self._lock:
            self._hold_warning = None
        self._set_thresholds(value)

    def _set_thresholds(self, value) -> None:
        v = np.asarray(value, dtype=float)
        with self._lock:
            if v.size == 0 or np.all(v == 0):
                self.detector.clear_thresholds()
            else:
                self.detector.set_thresholds(v)

    def _set_whitening(self) -> None:
        """whitening_white, whitening_slow, whitened_thresholds -> the detector's whitening
        (none while one is [0]); change_thresholds, change_window, change_hold -> its change
        statistic (none while the thresholds are [0] or the window 0)."""
        vals = [np.asarray(self.p[name], dtype=float) for name in _WHITENING_PARAMS]
        with self._lock:
            if any(v.size != self.n for v in vals[:3]):   # [0] (none) or a calibration midway
                self.detector.set_whitening(None)
                return
            try:
                self.detector.set_whitening(NoiseWhitening(vals[0], vals[1]), vals[2])
            except ValueError as exc:
                self.detector.set_whitening(None)
                self.get_logger().warning(f"whitening off: {exc}")
                return
            window = int(self.p["change_window"])
            if vals[3].size != self.n or window == 0:
                self.detector.set_change(None)
                return
            try:
                self.detector.set_change(vals[3], window, int(self.p["change_hold"]))
            except ValueError as exc:
                self.detector.set_change(None)
                self.get_logger().warning(f"change statistic off: {exc}")

    def _on_change_window(self, _name, value) -> None:
        """change_thresholds hold for the window they were calibrated with: another window
        switches d off and sets them back to [0] (with the next state; calibrate again)."""
        with self._lock:
            self.detector.set_change(None)
            stale = np.asarray(self.p["change_thresholds"], dtype=float).size == self.n
            self._change_reset = stale
        if stale:
            self.get_logger().warning(f"change_window {value}: change_thresholds were calibrated for another window"
                                      " -- d is off until the next calibration")

    def _set_residual_joints(self, value) -> None:
        """``residual_joints`` (validated: ['all'], [''] or joint names) -> the observer's
        residual mask."""
        names = [x for x in value if x]
        mask = np.ones(self.n, dtype=bool) if names == ["all"] else np.isin(self.names, names)
        with self._lock:
            self.observer.set_residual_mask(mask)
            self._suspend_change(None)           # r steps between its two estimates

    def _on_observer_param(self, _name, _value) -> None:
        with self._lock:
            self.observer.set_gains(self.p["gains"])
            self.observer.set_filter_gains(self.p["filter_gains"])
            self.observer.max_gap = float(self.p["max_gap"])

    def _on_detector_param(self, _name, _value) -> None:
        p = self.p
        with self._lock:
            d = self.detector
            d.uncertainty_gain = float(p["uncertainty_gain"])
            d.model_std = per_joint(p["model_std"], self.n, "model_std", one_for_all=True)
            d.release = float(p["release"])
            d.min_samples = int(p["min_samples"])

    def _start_calibration(self, seconds) -> None:
        if seconds > 0:
            pair = bool(self.p["use_residual"] and self.p["residual_select"])
            with self._lock:
                self._calibration = _Calibration(
                    [ThresholdCalibration(self.n, min_samples=self.p["min_samples"],
                                          margin=self.p["calibration_margin"]) for _ in range(2 if pair else 1)],
                    float(seconds), whiten=bool(self.p["whiten"]), after=self.p["calibrate_after"])
            after = self.p["calibrate_after"]
            self.counters.set("calibration", f"running ({seconds:g} s)" if after <= 0 else
                              f"waiting {after:g} s, then {seconds:g} s")
            self.get_logger().info(f"calibrating the contact thresholds from {seconds:g} s of states"
                                   + (f" after the next {after:g} s" if after > 0 else " from now")
                                   + " (free motion, please)")

    def _cancel_calibration(self, name, _value) -> None:
        with self._lock:
            if self._calibration is None:
                return
            hold = self._calibration.hold
            held = [] if hold is None else hold.held
            if hold is not None:     # learning stays off where it was held: say so
                self._commit_hold(hold, " (its calibration cancelled)")
            self._calibration = None
            self._calibrate_reset = True   # `calibrate` back to 0 with the next state (not inside a set)
        self.counters.set("calibration", f"cancelled ({name} changed)")
        self.get_logger().warning(f"calibration cancelled: {name} changed while it ran (it is taken under it);"
                                  " set calibrate again" + (f" (learning stays off on {held})" if held else ""))

    def _finish_calibration(self, cal: "_Calibration") -> tuple:
        """``(thresholds, residual_joints or None, whitening or None)`` of a finished
        calibration (whitening: ``(white, slow, thresholds)``)."""
        p = self.p
        kw = {"k": p["calibration_k"], "floor": p["threshold_floor"]}
        cals = cal.cals
        joints = None
        if len(cals) == 2:
            if cal.with_residual < RESIDUAL_COVERAGE * cals[0].count:   # no fair comparison: keep the choice
                mask = self.observer.residual_mask
                thr = np.where(mask, cals[0].thresholds(p["calibration_method"], **kw),
                               cals[1].thresholds(p["calibration_method"], **kw))
                self.get_logger().warning(
                    f"calibration: the residual came with {cal.with_residual} of {cals[0].count} states (fewer than"
                    f" {RESIDUAL_COVERAGE:.0%}): residual_joints left as they are")
            else:
                thr, mask = calibrate_residual_joints(cals[0], cals[1], p["calibration_method"], **kw)
                joints = [x for x, m in zip(self.names, mask) if m] if not mask.all() else ["all"]
                joints = joints or [""]
        else:
            mask = self.observer.residual_mask
            thr = cals[0].thresholds(p["calibration_method"], **kw)
        return np.maximum(thr, 1e-9).tolist(), joints, self._finish_whitening(cal, mask)

    def _finish_whitening(self, cal: "_Calibration", mask) -> tuple | None:
        """The noise model, z's thresholds and d's (change_window > 0) over the calibration's
        states (r of each joint with or without the residual, as ``mask`` chose); none
        (``[0]`` x 4) without ``whiten``: a whitening calibrated under other thresholds would
        be stale."""
        none = [0.0], [0.0], [0.0], [0.0]
        if cal.samples is None:
            return none
        r_with, r_without, inertia, suspended = (np.asarray(x) for x in cal.samples)
        p = self.p
        R = np.where(mask, r_with, r_without)
        kw = {"min_samples": p["min_samples"], "margin": p["calibration_margin"], "k": p["calibration_k"]}
        try:
            w, thr_z = calibrate_whitening(R, inertia, p["calibration_method"], window=p["whitening_window"], **kw)
        except ValueError as exc:
            self.get_logger().warning(f"calibration: no whitening ({exc}); the detector watches r alone")
            return none
        thr_d = [0.0]
        if p["change_window"] > 0:
            try:
                window = p["change_window"]      # d where the detector watches it: no suspended state in its window
                valid = ~np.convolve(suspended.astype(int), np.ones(window, int))[:len(suspended)].astype(bool)
                thr_d = np.maximum(calibrate_change(R, inertia, w, window, p["calibration_method"], valid=valid,
                                                    **kw), 1e-9).tolist()
            except ValueError as exc:
                self.get_logger().warning(f"calibration: no change statistic ({exc})")
        if len(r_with) < cal.cals[0].count:
            self.get_logger().warning(f"calibration: the whitening took the first {len(r_with)} states of"
                                      f" {cal.cals[0].count}")
        return w.white.tolist(), w.slow.tolist(), np.maximum(thr_z, 1e-9).tolist(), thr_d

    # ------------------------------------------------------------- hold_learning
    def _full_name(self, name: str) -> str:
        """A node name of hold_learning, expanded against this node's namespace."""
        return expand_topic_name(name, self.get_name(), self.get_namespace())

    def _hold_ready(self, cal: "_Calibration", stamp: int) -> bool:
        """hold_learning (under the lock, from the calibration's first state on): ask the
        nodes to set ``learning`` false (each once its parameter services are there), wait
        for their answers (hold_timeout), then HOLD_SETTLE_S of states; True once the
        calibration may take states."""
        h = cal.hold
        if h is None:
            names = [x for x in self.p["hold_learning"] if x]
            if not names:
                return True
            h = cal.hold = _Hold(names, time.monotonic())
            self.counters.set("calibration", f"holding learning on {names}")
            self.get_logger().info(f"calibration: setting learning false on {names} first (hold_learning)")
        if h.done_stamp is None:
            for name in h.pending:
                if name in h.asked:
                    continue
                try:
                    client = self._hold_clients.get(name)
                    if client is None:
                        client = self._hold_clients[name] = AsyncParameterClient(self, name)
                    if client.services_are_ready():
                        h.asked.add(name)
                        client.set_parameters([Parameter("learning", value=False)],
                                              callback=lambda fut, name=name, h=h: self._on_hold_reply(h, name, fut))
                except Exception as exc:   # noqa: BLE001 -- a name rclpy refuses: reported, not fatal
                    h.failed.append((name, str(exc).splitlines()[0] or type(exc).__name__))
            timeout = self.p["hold_timeout"]
            if h.pending and time.monotonic() - h.t0 < timeout:
                return False
            h.failed += [(x, f"no answer in {timeout:g} s") for x in h.pending]
            h.done_stamp = stamp
            summary = self._hold_summary(h)
            self.counters.set("hold", summary)
            log = self.get_logger().warning if h.failed else self.get_logger().info
            log(f"calibration: {summary}" + (": the thresholds are calibrated on a model that may move" if h.failed
                                             else " (set learning true on them to resume; the thresholds are then"
                                             " stale)"))
        return (stamp - h.done_stamp) * 1e-9 >= HOLD_SETTLE_S

    @staticmethod
    def _hold_summary(h: "_Hold") -> str:
        failed = ", ".join(f"{x} ({why})" for x, why in h.failed)
        return f"learning held on {h.held or 'no node'}" + (f"; NOT on {failed}" if failed else "")

    def _commit_hold(self, h: "_Hold | None", note: str = "") -> None:
        """The calibration ended (done, or cancelled: ``note``): what is held from now on --
        learning resumed on one of these makes the thresholds stale -- and what did not hold
        (under the lock)."""
        if h is None:
            self._held, self._hold_warning = {}, None
            self.counters.set("hold", "off")
            return
        h.committed, h.note = True, note
        if note:   # cancelled: the thresholds (if any) are an earlier calibration's -- its record stands,
            self._held.update({self._full_name(x): x for x in h.held})   # and these are held too now
            self.counters.set("hold", self._hold_summary(h) + note)
            return
        self._held = {self._full_name(x): x for x in h.held}
        failed = ", ".join(f"{x} ({why})" for x, why in h.failed)
        self._hold_warning = f"learning not held on {failed}" if failed else None
        self.counters.set("hold", self._hold_summary(h))

    def _on_hold_reply(self, h: "_Hold", name: str, fut) -> None:
        try:
            res = fut.result().results[0]
            ok, why = bool(res.successful), res.reason or "refused"
        except Exception as exc:   # noqa: BLE001 -- a failed call is reported, whatever it was
            ok, why = False, str(exc) or type(exc).__name__
        with self._lock:
            if name in h.pending:
                if ok:
                    h.held.append(name)
                else:
                    h.failed.append((name, why))
            elif ok and name not in h.held:   # after hold_timeout: it did hold, late
                h.failed = [(x, w) for x, w in h.failed if x != name]
                h.held.append(name)
                if h.committed:
                    self._commit_hold(h, h.note)
                else:
                    self.counters.set("hold", self._hold_summary(h))

    def _on_parameter_event(self, msg: ParameterEvent) -> None:
        with self._lock:
            name = self._held.get(msg.node)
            if name is None:
                return
            resumed = any(p.name == "learning" and p.value.type == ParameterType.PARAMETER_BOOL and p.value.bool_value
                          for p in (*msg.changed_parameters, *msg.new_parameters))
            if not resumed:
                return
            del self._held[msg.node]
            self._hold_warning = (f"learning resumed on {name} since the calibration: the thresholds may be stale"
                                  " (calibrate again)")
            still = list(self._held.values())
        self.counters.set("hold", f"learning resumed on {name}: thresholds stale" + (f"; held on {still}" if still
                                                                                       else ""))
        self.get_logger().warning(self._hold_warning)

    # ------------------------------------------------------------- callbacks
    def _reject(self, what: str, exc) -> None:
        self.counters.inc(f"{what}_rejected")
        if self.log_throttle(what):
            self.get_logger().error(f"{what} rejected: {exc}")

    def _on_residual(self, msg: JointState) -> None:
        try:
            stamp, f = vector_from_msg(msg, self.names, "effort", where=self.residual_topic)
        except ValueError as exc:
            return self._reject("residual", exc)
        with self._lock:
            self.residuals.add(stamp, f)
        self._drain()

    def _on_residual_std(self, msg: JointState) -> None:
        try:
            stamp, d = vector_from_msg(msg, self.names, "effort", where="feedforward/residual_std")
            if np.any(d < 0):
                raise ValueError(f"feedforward/residual_std: negative standard deviation {d.tolist()}")
        except ValueError as exc:
            return self._reject("residual_std", exc)
        with self._lock:
            self.residual_stds.add(stamp, d)

    def _on_estimate(self, msg: JointState) -> None:
        try:
            stamp, theta = vector_from_msg(msg, None, "position", where="adaptive/parameters")
            pi = self.layout.to_pi(msg.name, theta)
        except ValueError as exc:
            return self._reject("estimate", exc)
        with self._lock:
            if self._estimate_stamp is not None and stamp < self._estimate_stamp:
                self.counters.inc("estimate_out_of_order")
                return
            self._estimate_stamp = stamp
            self.observer.set_parameters(pi)
            self._suspend_change(None)           # the model changed: r moves to its new level
        self.counters.inc("estimates_applied")
        self.counters.set("model", "estimate")

    def _on_state(self, msg) -> None:
        try:
            stamp, q, v, tau = self.mapper.map(msg)
            if v is None or tau is None:
                raise ValueError("joint_states carries no " + ("velocities" if v is None else "efforts (measured"
                                                               " torques)"))
        except ValueError as exc:
            return self._reject("joint_states", exc)
        with self._lock:
            self._pending.append((stamp, q, v, tau, time.monotonic()))
        self._drain()

    def _residual_at(self, stamp: int):
        """The residual for the state stamped ``stamp``: the one stamped for it, else the
        newest older one within residual_staleness, else (residual/state: the learner
        skipped the state) the nearest newer one within it; None without one."""
        stal = self.p["residual_staleness"] * 1e9
        r = self.residuals.get(stamp, stal)
        if r is None and self.residual_topic == "residual/state":
            r = self.residuals.nearest(stamp, stal)
        return r

    def _settle_ns(self) -> int:
        """CHANGE_SETTLE time constants of the observer (1 / min K_O, plus 1 / min K_F with
        the second low pass) [ns]: how long r takes to settle after a change of the model."""
        t = CHANGE_SETTLE / float(np.min(self.p["gains"]))
        kf = np.asarray(self.p["filter_gains"], dtype=float)
        if np.any(kf > 0):
            t += CHANGE_SETTLE / float(np.min(kf[kf > 0]))
        return int(t * 1e9)

    def _suspend_change(self, stamp) -> None:
        """(Under the lock.)  The model r is computed with changed at ``stamp`` (None: the
        last state's): d is not watched until r has settled (:meth:`_settle_ns`)."""
        stamp = self._last_stamp if stamp is None else stamp
        if stamp is None:          # before the first state: the first state suspends it anyway
            return
        until = int(stamp) + self._settle_ns()
        self._change_settle_until = until if self._change_settle_until is None else max(until,
                                                                                        self._change_settle_until)

    def _watch_change(self, stamp: int, residual) -> None:
        """d compares r with r change_window states back under the same model: from the
        first state (r rising from 0 to the model's level), a residual that comes or goes
        (a learner that skips states, use_residual switched), a new estimate or
        residual_joints on, r moves by the model's change and settles with the observer's
        time constants -- d is not watched meanwhile (``change_suspended`` counts the states,
        the calibration leaves them out)."""
        present = bool(self.p["use_residual"]) and residual is not None
        if present != self._residual_present or self._residual_present is None:
            self._suspend_change(stamp)
            self._residual_present = present
        self._change_suspended = self._change_settle_until is not None and stamp <= self._change_settle_until
        if self._change_suspended:
            self.detector.restart_change()
            self.counters.inc("change_suspended")

    def _drain(self) -> None:
        """Take the waiting states in order: each once the residual stream has reached it
        (use_residual: one stamped for it, or a newer one -- a learner that skipped the state
        sends none for it), or once it waited residual_wait wall seconds (or MAX_PENDING
        states wait behind it)."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                stamp = self._pending[0][0]
                newest = self.residuals.newest
                if (self.p["use_residual"] and self.p["residual_wait"] > 0 and len(self._pending) < MAX_PENDING
                        and (newest is None or newest < stamp)
                        and time.monotonic() - self._pending[0][4] < self.p["residual_wait"]):
                    return
                stamp, q, v, tau, _t = self._pending.popleft()
            self._process(stamp, q, v, tau)

    def _process(self, stamp: int, q, v, tau) -> None:
        done = hold_done = None
        with self._lock:
            if self._last_stamp is not None and stamp <= self._last_stamp:
                self.counters.inc("out_of_order")
                if self.log_throttle("order"):
                    self.get_logger().warning(f"joint_states stamp {stamp} ns not after {self._last_stamp} ns:"
                                              " ignored")
                return
            if self._origin is None:
                self._origin = stamp
            residual = std = None
            if self.p["use_residual"]:
                residual = self._residual_at(stamp)
                if residual is None:
                    self.counters.inc("residual_missing")
                if self.use_std:
                    std = self.residual_stds.get(stamp, self.p["residual_staleness"] * 1e9)
                    if std is None:   # the last one stands in (the bases were calibrated under it)
                        self.counters.inc("residual_std_missing")
                        std = self._last_std
                    else:
                        self._last_std = std
            raw_std = std
            self._watch_change(stamp, residual)
            gaps = self.observer.gaps
            try:
                r = self.observer.update((stamp - self._origin) * 1e-9, q, v, tau, residual)
            except ValueError as exc:
                return self._reject("joint_states", exc)
            self._last_stamp = stamp
            if self.observer.gaps != gaps:
                self.counters.inc("gaps")
            ob = self.observer
            r_with, r_without = ob.r_with_residual, ob.r_without_residual
            if not (np.isfinite(r_with).all() and np.isfinite(r_without).all()):   # never publish NaN: start over
                ob.reset()
                self._suspend_change(stamp)      # r restarts from 0
                self.counters.inc("nonfinite_output")
                return
            if std is not None:   # the learner's std only where its residual is used (residual_joints)
                std = np.where(ob.residual_mask, std, 0.0)
            cal = self._calibration
            if cal is not None:     # calibrate_after: the states before it pass untaken
                t_now = (stamp - self._origin) * 1e-9
                cal.t_first = t_now if cal.t_first is None else cal.t_first
                if t_now - cal.t_first < cal.after or not self._hold_ready(cal, stamp):
                    cal = None
                elif (cal.after > 0 or cal.hold is not None) and cal.cals[0].count == 0:
                    self.counters.set("calibration", f"running ({cal.seconds:g} s)")
            keep = (cal is not None and cal.samples is not None and self.p["whiten"]
                    and len(cal.samples[0]) < WHITENING_MAX_SAMPLES)
            inertia = None
            if self.p["whiten"] and (self.detector.whitening is not None or keep):
                inertia = self.model.mass_matrix(q) + self._drive_inertia
            contact, joints = self.detector.update(r, std, inertia=inertia)
            if cal is not None:
                cals = cal.cals
                if keep:
                    for store, x in zip(cal.samples, (r_with, r_without, inertia, self._change_suspended)):
                        store.append(x)
                t_cal = (stamp - self._origin) * 1e-9
                d = self.detector   # the bases are calibrated under the uncertainty term they will sit below
                if len(cals) == 2:
                    cals[0].add(t_cal, r_with, d.uncertainty(raw_std))
                    cals[1].add(t_cal, r_without, d.uncertainty(None))
                    cal.with_residual += residual is not None
                else:
                    cals[0].add(t_cal, r, d.uncertainty(std))
                if cals[0].duration >= cal.seconds:
                    self._calibration = None
                    done = self._finish_calibration(cal)
                    hold_done = cal.hold
            np.maximum(self._peak, np.abs(r), out=self._peak)
            wrench = None
            if self.p["publish_wrench"]:
                J = self.model.jacobian(q, self.wrench_frame, "local")
                Jp, _smin, lam2 = damped_transpose_pinv(J, damping=self.p["wrench_damping"],
                                                        threshold=self.p["wrench_threshold"])
                wrench = Jp @ r
                if lam2 > 0:
                    self.counters.inc("wrench_damped")
        self.counters.inc("states")
        self.pub_torque.publish(joint_state_msg(stamp, self.names, effort=r))
        if wrench is not None and np.all(np.isfinite(wrench)):
            self.pub_wrench.publish(_wrench_msg(stamp, self.wrench_frame, wrench))
        idx = np.flatnonzero(joints)
        self.pub_contact.publish(joint_state_msg(stamp, [self.names[i] for i in idx], effort=r[idx]))
        if contact and self.log_throttle("contact"):
            self.get_logger().info(f"contact at {[self.names[i] for i in idx]}: external torque"
                                   f" {np.round(r[idx], 3).tolist()} N m")
        if self._calibrate_reset:
            self._calibrate_reset = False
            self.p.set("calibrate", 0.0)
        if self._change_reset:
            self._change_reset = False
            self.p.set("change_thresholds", [0.0])
        if done is not None:
            thr, joints, whitening = done
            self.get_logger().info(f"calibrated contact thresholds {np.round(thr, 4).tolist()} N m")
            if joints is not None:
                dropped = [x for x in self.names if joints != ["all"] and x not in joints]
                self.get_logger().info("calibration: the residual kept on " + ("every joint" if not dropped else
                                       f"{[x for x in joints if x] or 'no joint'}, dropped on {dropped} (its"
                                       " threshold there above the estimate's alone)"))
                self.p.set("residual_joints", joints)
            thresholds_set = self.p.set("thresholds", thr).successful
            if whitening is not None:
                for name, value in zip(_WHITENING_PARAMS, whitening):
                    if not self.p.set(name, value).successful:
                        self.get_logger().error(f"calibration: {name} {value} refused")
                if len(whitening[0]) == self.n:
                    self.get_logger().info(f"calibrated the whitening: white {np.round(whitening[0], 4).tolist()},"
                                           f" slow {np.round(whitening[1], 4).tolist()} N m, thresholds on |z|"
                                           f" {np.round(whitening[2], 3).tolist()}" + (
                                               f", on |d| {np.round(whitening[3], 3).tolist()}"
                                               if len(whitening[3]) == self.n else ""))
            self.p.set("calibrate", 0.0)
            self.counters.set("calibration", "done")
            with self._lock:
                self._commit_hold(hold_done)
            if self.calibration_file and thresholds_set:      # (not when its thresholds were refused)
                self._write_calibration(self.calibration_file)

    # ------------------------------------------------------------- housekeeping
    def _diagnostics(self) -> None:
        with self._lock:
            peak, self._peak = self._peak, np.zeros(self.n)
            d = self.detector
            states, held = self.counters["states"], self.counters["change_suspended"]
            suspended = (held - self._at_report[1]) / max(states - self._at_report[0], 1)
            self._at_report = (states, held)
            self.counters.update({
                "contacts": d.contacts, "in_contact": ",".join(d.joints_in_contact()) or "none",
                "thresholds": np.round(d.effective_thresholds(), 4).tolist() if d.configured else "none",
                "whitening": ("on" if d.whitening is not None else "off") if self.p["whiten"] else "off (whiten false)",
                "change": ("off (change_window 0)" if self.p["change_window"] == 0 else
                           f"on ({d.change_window} states; not watched on {suspended:.0%} of the states since the"
                           " last report: the model changed)" if d.change_thresholds is not None else "off"),
                "max_abs_external_torque": np.round(peak, 4).tolist()})
        st = self.counters.status()
        why = None
        if not self.detector.configured and self._calibration is None:
            why = "no contact thresholds (set thresholds or calibrate)"
        elif self._hold_warning is not None and self.detector.configured:
            why = self._hold_warning
        if why is not None:
            st.level = max(st.level, DiagnosticStatus.WARN)
            st.message = why if st.message == "OK" else f"{why}; {st.message}"
        self.pub_diag.publish(diagnostic_array(self.get_clock().now().to_msg(), [st]))


def _wrench_msg(stamp: int, frame: str, w) -> WrenchStamped:
    msg = WrenchStamped()
    msg.header.stamp = from_ns(stamp)
    msg.header.frame_id = frame
    f, m = msg.wrench.force, msg.wrench.torque
    f.x, f.y, f.z = (float(x) for x in w[:3])
    m.x, m.y, m.z = (float(x) for x in w[3:])
    return msg


def main(args=None) -> int:
    return run_node(ExternalTorqueNode, args)


if __name__ == "__main__":
    raise SystemExit(main())

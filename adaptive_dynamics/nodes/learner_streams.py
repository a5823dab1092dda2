"""What the learner nodes share: ``residual_learner`` (learning and prediction in one
process) and the PGPOL split's ``model_update`` (learning) and ``prediction``.

* Parameter groups (:func:`learner_specs`, :func:`output_specs`, :func:`stream_specs`,
  :func:`snapshot_bytes_spec`) and the learner's construction from them
  (:func:`make_core`); :func:`reference_input`, the learner input ``x = (q, qd, qdd)``
  of a reference point.
* :class:`SampleAssembler` -- learning samples from the streams: ``joint_states``
  (q, qd and the measured torque), ``adaptive/parametric_torque`` and ``reference``
  matched **by stamp**, joints by name; ``adaptive/parameter_update`` checked and handed
  to the core in stream order.  ``target: residual`` learns
  ``y = tau - tau_parametric``; ``target: torque`` learns the torque ``tau`` itself (no
  parametric model).  ``tau`` is the measured joint torque (``target_torque:
  measured``, the state's ``effort``) or the torque the controller commanded for that
  state (``commanded``: ``controller/tracking_error``'s ``effort``, matched by stamp):
  feedback-error learning, which a torque-sensor bias or noise cannot enter.
* :class:`ResidualOutput` -- the stamped ``feedforward/residual`` stream: on each state
  stamped ``t`` one message per reference point in ``(last published, t + lead]`` and
  not before ``t``, predicted from the reference state ``(q_d, qd_d, qdd_d)`` and
  stamped with the instant it applies to, so the controller finds the exact stamp;
  with ``publish_std`` also ``feedforward/residual_std``, the learner's predictive
  standard deviation of each published residual (same stamps, from the same prediction).

The nodes stay thin: they create the subscriptions and hand the messages to these.
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict, deque
from typing import Callable, Optional

import numpy as np
from sensor_msgs.msg import JointState

from ..learning import LEARNERS, OnlineResidual
from ..learning.online import UPDATE_SAMPLES
from ..ros.joint_states import JointStateMapper, joint_state_msg
from ..ros.params import ParamSpec
from .housekeeping import logged_save
from .robot_params import friction_smoothing_spec
from ..ros.qos import PUBLISHER_STREAM_QOS
from ..ros.references import ReferenceBuffer
from ..ros.arrays import vector_from_msg

__all__ = ["learner_specs", "output_specs", "stream_specs", "snapshot_bytes_spec", "learner_config", "make_core",
           "reference_input", "rowwise", "SampleAssembler", "ResidualOutput", "BUFFER", "MAX_SNAPSHOT_BYTES"]

BUFFER = 2000   # states / parametric torques kept for stamp matching
#: lockstep: a state whose sample is still not whole this many states later is given up
LOCKSTEP_GIVE_UP = 500
MAX_SNAPSHOT_BYTES = 64 * 1024 * 1024


def reference_input(r, n: int, out: Optional[np.ndarray] = None) -> np.ndarray:
    """The learner input ``x = (q, qd, qdd)`` (3n) of reference point ``r`` (a missing
    velocity or acceleration is zero), written into ``out`` if given."""
    x = np.empty(3 * n) if out is None else out
    x[:n] = r.q
    x[n:2 * n] = r.qd if r.qd is not None else 0.0
    x[2 * n:] = r.qdd if r.qdd is not None else 0.0
    return x


def learner_kind_description() -> str:
    return ("gmm (incremental GMM + GMR) | rbfn (RBF network + RLS) | gp (exact GP, FIFO window) |"
            " pgpol (parallel drifting sparse GPs + database) | sgpol (one drifting sparse GP) | joint_local (an"
            " RBF network per joint on its own q, qd, qdd: a repeated task, contact monitoring); any kind of"
            " adaptive_dynamics.learning.LEARNERS")


def learner_specs() -> list[ParamSpec]:
    """The learning side: which learner, how samples reach it."""
    return [
        ParamSpec("learner", "gmm", learner_kind_description(), choices=sorted(LEARNERS), read_only=True),
        ParamSpec("learner_config", "", "JSON object of the learner's constructor arguments, e.g."
                  ' {"max_components": 64} or {"n_basis": 512, "width": 0.5}; empty = defaults',
                  read_only=True),
        ParamSpec("friction", False, "the controller adapts friction columns too (its parameter_update then"
                  " carries <joint>.fv/.fc)", read_only=True),
        friction_smoothing_spec(),
        ParamSpec("learning", True, "learn from the stream (phases 1, 2, 4)"),
        ParamSpec("transform", True, "apply the consistency transform on every parameter update"),
        ParamSpec("learn_decimation", 5, "learn every k-th sample (5: 200 Hz from a 1 kHz loop)", min=1, max=1000),
        ParamSpec("block_size", 50, "most samples per learner update on the worker", min=1, max=10000,
                  read_only=True),
        ParamSpec("update_samples", "all", "all: every queued sample is learnt (up to block_size per update) |"
                  " latest: each learner update takes the newest queued sample alone and skips the rest"
                  " (samples_skipped; PGPOL's paper: one current point per update)", choices=list(UPDATE_SAMPLES),
                  read_only=True),
        ParamSpec("warmup", 2000, "samples collected before the learner is built and feeds anything forward"
                  " (GMM scale, RBFN box; 2000 = 10 s at learn_decimation 5: the parametric estimate adapts"
                  " alone first and takes what it can express everywhere)",
                  min=2, max=100000, read_only=True),
        ParamSpec("rbfn_box", "data", "RBF input box: data (warm-up range + margin) | limits (joint,"
                  " velocity and acceleration limits)", choices=["data", "limits"], read_only=True),
        ParamSpec("box_margin", 0.2, "rbfn_box data: widen the range by this fraction of the span",
                  min=0.0, max=10.0, read_only=True),
        ParamSpec("acceleration_limit", 10.0, "rad/s^2: the acceleration range of rbfn_box limits",
                  min=1e-3, read_only=True),
        ParamSpec("target_torque", "commanded", "the torque tau of the target (tau - parametric torque):"
                  " commanded (the controller's command for the state, controller/tracking_error; a"
                  " torque-sensor bias or noise cannot enter the feed-forward, and joint_states needs no"
                  " efforts) | measured (joint_states effort)", choices=["commanded", "measured"],
                  read_only=True),
        ParamSpec("acceleration", "desired", "qdd of the learning input: desired (reference) | measured"
                  " (filtered difference of the measured velocity)", choices=["desired", "measured"],
                  read_only=True),
        ParamSpec("acceleration_filter_hz", 20.0, "acceleration measured: low-pass cut-off [Hz]",
                  min=0.1, read_only=True),
        ParamSpec("queue_limit", 20000, "queued samples beyond this are dropped (counted)", min=1,
                  read_only=True),
        ParamSpec("learning_until", 0.0, "> 0: learn only the samples stamped before this time [s] (a"
                  " scheduled freeze, at the same sample on any machine; learning set off over the parameter"
                  " service lands when the call does); 0 = no end", min=0.0, read_only=True),
        ParamSpec("learn_in_lockstep", False, "learn on the stream's own thread, in stamp order, a block of"
                  " block_size samples as soon as 5 states newer than its last sample have come: what the"
                  " learner knows at each stamp is then a function of the streams alone (a lockstep"
                  " simulation learns the same on any machine, under any load; the loop waits for each"
                  " block's fit); false (default): a worker thread learns as fast as the machine lets it,"
                  " beside the loop (real time)", read_only=True),
        ParamSpec("raw_prediction", False, "predict the learner's raw mean everywhere; false (default): the"
                  " prediction falls back continuously to the prior (zero residual, the mean torque for"
                  " target torque) where the learner's data does not reach (pulled_back_fraction in"
                  " /diagnostics)", read_only=True),
    ]


def output_specs(monitor_topic: str) -> list[ParamSpec]:
    """The feed-forward side: the stamped residual stream."""
    return [
        ParamSpec("output", True, "publish the prediction as feedforward/residual (else zeros)"),
        ParamSpec("prediction_lead", 0.01, "predict and publish references up to this far [s] ahead of"
                  " the newest state", min=0.0, max=1.0),
        ParamSpec("monitor_decimation", 10, f"publish {monitor_topic} every k-th point (0 = off)",
                  min=0, max=10000),
        ParamSpec("publish_std", False, "also publish feedforward/residual_std: the learner's predictive"
                  " standard deviation of each published residual [N m] (JointState effort, the same stamps; none"
                  " for a residual whose variance is not finite; for external_torque's contact thresholds)",
                  read_only=True),
    ]


def stream_specs() -> list[ParamSpec]:
    return [
        ParamSpec("reliable_streams", True, "subscribe joint_states reliably (lockstep); false = best"
                  " effort depth 1 (real time)", read_only=True),
        ParamSpec("hot_path_thread", True, "take the 1 kHz topics on a lean companion node with its own"
                  " executor thread", read_only=True),
        ParamSpec("diagnostics_period", 1.0, "s between /diagnostics messages", min=0.05),
    ]


def snapshot_bytes_spec(what: str) -> ParamSpec:
    """``max_snapshot_bytes`` of the split's nodes (``what``: what happens above it)."""
    return ParamSpec("max_snapshot_bytes", MAX_SNAPSHOT_BYTES, what, min=1024, max=2 ** 31 - 1)


def learner_config(text: str) -> dict:
    """``learner_config`` (a JSON object, or empty) as keyword arguments."""
    try:
        config = json.loads(text) if text.strip() else {}
        if not isinstance(config, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        raise ValueError(f"learner_config must be a JSON object of constructor arguments: {exc}") from None
    return config


def make_core(p, model, config: dict, *, transform: Optional[bool] = None, prior: str = "zero") -> OnlineResidual:
    """The :class:`OnlineResidual` the parameters in ``p`` (:func:`learner_specs`) describe
    (``prior``: ``"zero"`` for a residual, ``"mean"`` for a learner of the torque)."""
    return OnlineResidual(
        model, p["learner"], config, learn_every=p["learn_decimation"], block_size=p["block_size"],
        warmup=p["warmup"], box=p["rbfn_box"], box_margin=p["box_margin"],
        acceleration_limit=p["acceleration_limit"], queue_limit=p["queue_limit"],
        learning=p["learning"], transform=p["transform"] if transform is None else transform,
        prior=prior, raw=p["raw_prediction"], update_samples=p["update_samples"],
        lockstep=p["learn_in_lockstep"],
        learn_until_ns=int(p["learning_until"] * 1e9) if p["learning_until"] > 0 else None)


def rowwise(predict: Callable):
    """``predict`` taken one row at a time: a row's prediction then has the same bits
    whatever else is asked with it (a batch sums in another order, ~1e-16) -- in a lockstep
    run (``learn_in_lockstep``) the outputs no longer depend on how many reference points
    happened to be new at a state, and a closed loop that grows 1e-16 into another run
    stays the same run."""
    def predict_rows(X, return_var: bool = False):
        X = np.atleast_2d(np.asarray(X, dtype=float))
        out = [predict(X[i:i + 1], return_var=return_var) for i in range(len(X))]
        if any(o is None for o in out):
            return None
        if return_var:
            return np.vstack([o[0] for o in out]), np.vstack([o[1] for o in out])
        return np.vstack(out)
    return predict_rows


class SampleAssembler:
    """Learning samples from the streams, matched by stamp (see the module docstring).

    A sample is assembled when the last of its parts has arrived: the state, its
    parametric torque (``target="residual"``) and, with ``torque="commanded"``, the
    command for it (:meth:`on_command`); parts that come before their state wait for it
    (``buffer`` stamps at most).  Its
    ``qdd`` is the reference's acceleration at the state's stamp
    (``acceleration="desired"``) or the low-pass filtered backward difference of the
    measured velocity (``"measured"``).  ``hint_lead_ns`` (not None): on every state
    stamped ``t``, before its sample is offered, the newest reference point stamped in
    ``[t, t + hint_lead_ns]`` goes to :meth:`OnlineResidual.hint`.

    Rejections (wrong joint names, NaN/inf, wrong parameter names) call
    ``reject(what, exc)`` and never reach the core.  Callbacks may run on any one
    thread; the buffers are guarded by a lock.
    """

    def __init__(self, core: OnlineResidual, names, refs: ReferenceBuffer, counters,
                 reject: Callable[[str, Exception], None], *, param_names, target: str = "residual",
                 torque: str = "measured", acceleration: str = "desired", acceleration_filter_hz: float = 20.0,
                 hint_lead_ns: Optional[int] = None, buffer: int = BUFFER):
        if target not in ("residual", "torque"):
            raise ValueError(f"target must be 'residual' or 'torque', got {target!r}")
        if torque not in ("measured", "commanded"):
            raise ValueError(f"torque must be 'measured' or 'commanded', got {torque!r}")
        self.torque = torque
        #: the parts a sample waits for besides its state
        self._needs = (("pt",) if target == "residual" else ()) + (("cmd",) if torque == "commanded" else ())
        self.core = core
        self.names = list(names)
        self.n = len(self.names)
        self.refs = refs
        self.counters = counters
        self.reject = reject
        self.target = target
        self.acceleration = acceleration
        self.acceleration_filter_hz = float(acceleration_filter_hz)
        self.hint_lead_ns = hint_lead_ns
        self.buffer = int(buffer)
        self.mapper = JointStateMapper(self.names)
        self.param_names = list(param_names)
        self._lock = threading.Lock()
        self._states: OrderedDict = OrderedDict()    # stamp -> (q, v, tau measured or None, qdd_measured)
        self._parts: OrderedDict = OrderedDict()     # stamp -> {"pt": parametric torque, "cmd": command}
        self._waiting: OrderedDict = OrderedDict()   # lockstep: states whose sample is not whole yet
        self._steps: deque = deque()                  # lockstep: (state stamp, its cutoff) not run yet
        self.lockstep = bool(getattr(core, "lockstep", False))   # OnlineResidual(lockstep=True)
        self._margin = int(getattr(core, "lockstep_margin", 0))
        self._recent: deque = deque(maxlen=self._margin + 1)
        #: lockstep: called with each state's stamp once its step ran (the node's output)
        self.on_step: Optional[Callable[[int], None]] = None
        self._last_state = None   # (stamp, v) for acceleration: measured
        self._acc = np.zeros(self.n)
        self._x = np.empty(3 * self.n)
        self._zeros = np.zeros(self.n)

    @property
    def newest_stamp(self) -> Optional[int]:
        with self._lock:
            return next(reversed(self._states)) if self._states else None

    def on_state(self, msg) -> Optional[int]:
        """A ``joint_states`` message (or its bytes); returns its stamp, or None when it
        was rejected or out of order."""
        try:
            stamp, q, v, tau = self.mapper.map(msg)
            if v is None or (tau is None and self.torque == "measured"):
                raise ValueError("joint_states needs velocities and efforts (the measured torque; without"
                                 " efforts: target_torque commanded)" if v is not None else
                                 "joint_states needs velocities")
        except ValueError as exc:
            self.reject("joint_states", exc)
            return None
        with self._lock:
            if self._states and stamp <= next(reversed(self._states)):
                self.counters.inc("state_out_of_order")
                return None
            acc = None
            if self.acceleration == "measured":
                acc = self._measured_acc(stamp, v)
            self._states[stamp] = (q.copy(), v.copy(), None if tau is None else tau.copy(), acc)
            while len(self._states) > self.buffer:
                self._states.popitem(last=False)
            if self.lockstep and self._needs:
                self._waiting[stamp] = None
        if self.hint_lead_ns is not None:
            self._hint(stamp)
        self._arrived(stamp, None, None)
        if self.lockstep:   # its step (learning, the node's output) once what it needs is whole
            with self._lock:
                self._recent.append(stamp)
                cutoff = self._recent[0] if len(self._recent) > self._margin else None
                self._steps.append((stamp, cutoff))
            self._run_steps()
        return stamp

    def _run_steps(self) -> None:
        """Lockstep (``learn_in_lockstep``): each state's step, in order, once every sample
        it hands on is whole -- those stamped up to the state ``lockstep_margin`` states back
        (:meth:`OnlineResidual.advance`) -- then ``on_step(stamp)`` (the node publishes its
        output for that state there).  So what is learnt, and what is predicted with it, at
        each state is a function of the streams alone, however late this thread takes the
        parts (a thread behind the loop takes a burst of states before the parts that came
        with them).  A state still waiting for a part ``LOCKSTEP_GIVE_UP`` states later is
        given up (``lockstep_incomplete``)."""
        while True:
            with self._lock:
                if not self._steps:
                    return
                while len(self._waiting) > LOCKSTEP_GIVE_UP:
                    self._waiting.popitem(last=False)
                    self.counters.inc("lockstep_incomplete")
                stamp, cutoff = self._steps[0]
                if cutoff is not None and self._waiting and next(iter(self._waiting)) <= cutoff:
                    return   # a sample it hands on is not whole yet: its parts will run it
                self._steps.popleft()
            self.core.advance(stamp)
            if self.on_step is not None:
                self.on_step(stamp)

    def _arrived(self, stamp: int, part: Optional[str], value) -> None:
        """``part`` of ``stamp`` arrived (None: its state); the sample is learnt once it is whole."""
        with self._lock:
            parts = self._parts.get(stamp)
            if part is not None:
                if parts is None:
                    if self._states and stamp < next(iter(self._states)):
                        return                      # its state is gone from the buffer already
                    parts = self._parts[stamp] = {}
                    while len(self._parts) > self.buffer:
                        self._parts.popitem(last=False)
                parts[part] = value
            if stamp not in self._states or any(k not in (parts or ()) for k in self._needs):
                return
            self._parts.pop(stamp, None)
            self._waiting.pop(stamp, None)
        parts = parts or {}
        self._learn(stamp, parts.get("pt", self._zeros), parts.get("cmd"))
        if part is not None and self.lockstep:
            self._run_steps()   # a step may have waited for this sample

    def _hint(self, stamp: int) -> None:
        ahead = self.refs.between(stamp - 1, stamp + int(self.hint_lead_ns))
        if not ahead:
            self.counters.inc("hint_no_reference")
            return
        self.core.hint(reference_input(ahead[-1], self.n))

    def _measured_acc(self, stamp: int, v: np.ndarray) -> np.ndarray:
        last = self._last_state
        self._last_state = (stamp, v.copy())
        if last is None:
            return self._acc.copy()
        dt = (stamp - last[0]) * 1e-9
        raw = (v - last[1]) / dt
        alpha = 1.0 - np.exp(-2.0 * np.pi * self.acceleration_filter_hz * dt)
        self._acc += alpha * (raw - self._acc)
        return self._acc.copy()

    def on_parametric_torque(self, msg: JointState) -> None:
        """An ``adaptive/parametric_torque`` (``effort``: Y pi_hat for the state of its stamp)."""
        self._part(msg, "pt", "parametric_torque", "adaptive/parametric_torque")

    def on_command(self, msg: JointState) -> None:
        """A ``controller/tracking_error`` (``effort``: the torque commanded for the state
        of its stamp), with ``torque="commanded"``."""
        self._part(msg, "cmd", "command", "controller/tracking_error")

    def _part(self, msg: JointState, part: str, what: str, topic: str) -> None:
        try:
            stamp, value = vector_from_msg(msg, self.names, "effort", where=topic)
        except ValueError as exc:
            self.reject(what, exc)
            return
        self._arrived(stamp, part, value)

    def state_input(self, stamp: int) -> Optional[np.ndarray]:
        """The learner input ``x = (q, qd, qdd)`` of the state stamped ``stamp`` (its
        acceleration as the samples take it: the reference's at that stamp, or the
        filtered measured one); None when the state is gone or no reference is there."""
        with self._lock:
            got = self._states.get(stamp)
        if got is None:
            return None
        q, v, _tau, acc = got
        acc = self._acceleration(stamp, acc)
        return None if acc is None else np.concatenate([q, v, acc])

    def _acceleration(self, stamp: int, measured: Optional[np.ndarray]) -> Optional[np.ndarray]:
        """The learning input's acceleration of a state: the filtered measured one when the
        samples take it, else the reference's at ``stamp`` (None when there is none)."""
        if measured is not None:
            return measured
        ref = self.refs.lookup(stamp, 0, 0)
        return None if ref is None else ref.qdd

    def _learn(self, stamp: int, pt: np.ndarray, cmd: Optional[np.ndarray]) -> None:
        if not self.core.learning:
            return
        with self._lock:
            q, v, tau, acc = self._states[stamp]
        if cmd is not None:
            tau = cmd
        acc = self._acceleration(stamp, acc)
        if acc is None:
            self.counters.inc("sample_no_reference")
            return
        n = self.n
        x = self._x
        x[:n], x[n:2 * n], x[2 * n:] = q, v, acc
        try:
            self.core.add_sample(x, tau - pt, stamp=stamp)
        except ValueError as exc:
            self.reject("sample", exc)

    def on_parameter_update(self, msg: JointState) -> bool:
        """An ``adaptive/parameter_update``: checked (full parameter names, finite) and
        handed to the core; True if the core will apply it (transform on)."""
        try:
            if list(msg.name) != self.param_names:
                missing = [k for k in self.param_names if k not in msg.name]
                extra = [k for k in msg.name if k not in self.param_names]
                raise ValueError(f"parameter names differ from the model's ({len(msg.name)} vs"
                                 f" {len(self.param_names)}; missing {missing[:4]}, unexpected {extra[:4]};"
                                 f" friction columns need friction:=true)")
            stamp, dpi = vector_from_msg(msg, None, "position", where="adaptive/parameter_update")
        except ValueError as exc:
            self.reject("parameter_update", exc)
            return False
        return self.core.add_parameter_update(dpi, stamp=stamp)


class ResidualOutput:
    """The stamped ``feedforward/residual`` stream (and a monitor copy), see the module.

    :meth:`publish_until` is called on every state with the prediction function
    ``predict(X) -> F`` (rows of ``X`` are reference states ``(q_d, qd_d, qdd_d)``);
    ``predict`` may return None (no model yet) or raise ``ValueError``.  What is
    published then depends on ``hold``: False -- zeros (``residual_learner``); True --
    the last valid output row, zeros before any (``prediction``, as PGPOL pre-controls
    the previous torques when no new ones are available); counted in
    ``held_outputs``.  With ``hold`` also when a state's instant has no residual because
    the reference no longer reaches it (the reference ended; extrapolation off or past
    its limit): the last valid output is published stamped with that state's stamp (one
    per state, counted in ``held_outputs``), so the controller keeps its feed-forward.
    A non-finite prediction counts as failed: never a NaN residual.

    ``std`` (``publish_std``): ``predict`` is called as ``predict(X, return_var=True)
    -> (F, V)`` (or None), and every residual published on ``feedforward/residual`` is
    preceded by ``feedforward/residual_std`` stamped alike, ``effort = sqrt(V)`` of the
    same row (a negative rounding of ``V`` is taken as 0).  A non-finite or missing ``V``
    in a row leaves the residual as it is (the feed-forward does not depend on whether a
    monitor reads the std): that residual goes out without its std message (counted in
    ``std_failed``; the reader holds the last std it had).  Held outputs
    re-publish the last valid standard deviation with the last valid residual (zeros
    before any), and ``output`` false publishes zeros on both.

    ``extrapolate_ns`` > 0: when the reference buffer does not reach ``t + lead``,
    instants on the reference's grid beyond its newest point (at most
    ``extrapolate_ns`` beyond it) are predicted from the reference extrapolated
    linearly from its last two points (PGPOL sec. III: x_d(t+2) from x_d(t), x_d(t+1));
    counted in ``extrapolated``.
    """

    def __init__(self, node, names, refs: ReferenceBuffer, counters, log_error: Callable[[str, str], None], *,
                 monitor_topic: str, hold: bool = False, std: bool = False):
        self.names = list(names)
        self.n = len(self.names)
        self.refs = refs
        self.counters = counters
        self.log_error = log_error
        self.hold = bool(hold)
        self.std = bool(std)
        self.pub_std = (node.create_publisher(JointState, "feedforward/residual_std", PUBLISHER_STREAM_QOS)
                        if self.std else None)
        self.pub_res = node.create_publisher(JointState, "feedforward/residual", PUBLISHER_STREAM_QOS)
        self.pub_mon = node.create_publisher(JointState, monitor_topic, PUBLISHER_STREAM_QOS)
        self.last_published: Optional[int] = None   # stamp of the last published residual
        self.last_output = np.zeros(self.n)          # the last valid prediction (hold)
        self.last_std = np.zeros(self.n)             # its standard deviation (std)
        self._k = 0

    def _points(self, now: int, horizon: int, extrapolate_ns: int):
        # never for instants before the newest state (a late start or a stall would
        # otherwise burst out residuals for the past)
        last = self.last_published
        after = last if last is not None and last >= now else now - 1
        refs = self.refs.between(after, horizon)
        n = self.n
        stamps = [r.stamp_ns for r in refs]
        rows = [reference_input(r, n) for r in refs]
        if extrapolate_ns > 0 and (not stamps or stamps[-1] < horizon):
            tail = self.refs.latest(2)
            if len(tail) == 2 and tail[1].stamp_ns > tail[0].stamp_ns:
                a, b = (reference_input(r, n) for r in tail)
                t_b, dt = tail[1].stamp_ns, tail[1].stamp_ns - tail[0].stamp_ns
                s = t_b + dt
                k_extra = 0
                while s <= horizon and s - t_b <= extrapolate_ns:
                    if s > after and (not stamps or s > stamps[-1]):
                        stamps.append(s)
                        rows.append(b + (s - t_b) / dt * (b - a))
                        k_extra += 1
                    s += dt
                if k_extra:
                    self.counters.inc("extrapolated", k_extra)
        return stamps, rows

    def _uncovered(self, now: int, todo: list) -> bool:
        """Holding: the reference (extrapolated, if on) reaches neither ``now`` nor
        anything after it, and nothing was published for ``now`` yet."""
        if todo or (self.last_published is not None and self.last_published >= now):
            return False
        last = self.refs.latest(1)
        return bool(last) and last[0].stamp_ns < now

    def publish_until(self, now: int, horizon: int, predict, *, output: bool = True, monitor_every: int = 0,
                      extrapolate_ns: int = 0) -> int:
        """Publish the residuals for ``(last published, horizon]`` (not before ``now``);
        returns how many.  With ``hold``, a state the reference no longer reaches gets
        the last valid output stamped ``now`` (counted in ``held_outputs``)."""
        todo, rows = self._points(now, horizon, extrapolate_ns)
        if not todo:
            if self.hold and self._uncovered(now, todo):
                self._publish([now], self.last_output[None], self.last_std[None], output, monitor_every)
                self.counters.inc("held_outputs")
                return 1
            return 0
        n = self.n
        X = np.array(rows)
        held = False
        D = None
        try:
            F = predict(X, return_var=True) if self.std else predict(X)
            if F is None:
                held = True
            else:
                if self.std:
                    F, V = F
                    V = None if V is None else np.asarray(V, dtype=float)
                    D = (np.sqrt(np.maximum(V, 0.0)) if V is not None and V.shape == np.shape(F)
                         else np.full(np.shape(F), np.nan))          # rows with a NaN: no std message
                if not np.isfinite(F).all():
                    raise ValueError("non-finite prediction")
                bad = 0 if D is None else int((~np.isfinite(D).all(axis=1)).sum())
                if bad:
                    self.counters.inc("std_failed", bad)
                    self.log_error("predict_std", "the learner gives no finite predictive variance: the"
                                   " residual published without its std")
        except ValueError as exc:
            self.counters.inc("prediction_failed")
            self.log_error("predict", f"prediction failed ({exc}): publishing "
                           + ("the last valid residual" if self.hold else "zero residuals"))
            F = None
            held = self.hold
        if F is None:
            F = np.tile(self.last_output, (len(todo), 1)) if held else np.zeros((len(todo), n))
            D = np.tile(self.last_std, (len(todo), 1)) if held else np.zeros((len(todo), n))
            if held:
                self.counters.inc("held_outputs", len(todo))
        else:
            self.last_output = np.array(F[-1], dtype=float)
            if D is not None and np.isfinite(D[-1]).all():
                self.last_std = np.array(D[-1], dtype=float)
        self._publish(todo, F, D, output, monitor_every)
        return len(todo)

    def _publish(self, todo: list, F: np.ndarray, D: Optional[np.ndarray], output: bool, monitor_every: int) -> None:
        zeros = np.zeros(self.n)
        for i, (s, f) in enumerate(zip(todo, F)):
            if self.pub_std is not None and (not output or np.isfinite(D[i]).all()):   # first: before its residual
                self.pub_std.publish(joint_state_msg(s, self.names, effort=D[i] if output else zeros))
            self.pub_res.publish(joint_state_msg(s, self.names, effort=f if output else zeros))
            if monitor_every and self._k % monitor_every == 0:
                self.pub_mon.publish(joint_state_msg(s, self.names, effort=f))
            self._k += 1
        self.counters.inc("residuals_published", len(todo))
        self.last_published = todo[-1]


def final_save(node, what: Callable[[], str]) -> None:
    """A learner node's save at shutdown: once, only if it finished constructing (a node
    that failed to load never overwrites its file), logged; a failure is logged, never
    raised (the rest of the shutdown must run).  ``what()`` names what was saved."""
    if not getattr(node, "_constructed", False):
        return
    node._constructed = False
    logged_save(node, node.save_model, what())


def close_learner(node, what: Callable[[], str]) -> None:
    """A learning node's end (``residual_learner``, ``model_update``): :func:`final_save`,
    then its learner's worker and its hot-path thread stopped."""
    final_save(node, what)
    if getattr(node, "core", None) is not None:
        node.core.stop()
    if getattr(node, "io", None) is not None:
        node.io.stop()

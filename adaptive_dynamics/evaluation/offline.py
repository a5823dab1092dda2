"""Offline evaluation of a residual learner on a recorded rosbag2 (no DDS, no rclpy).

``adaptive-dynamics replay BAG --learner gmm|rbfn|gp`` runs :func:`evaluate_learner`: the
bag is read with :mod:`.bags` (``rosbags``), the learner is trained and scored in time
order as fast as the CPU allows, and the result is a per-joint nMSE over time, a JSON
summary and a PNG plot.

Data (topics as the ``recorder`` writes them; a namespaced bag is matched by suffix,
e.g. ``/fr3/joint_states``; joints are matched by NAME against the
:class:`~adaptive_dynamics.dynamics.RobotModel`, extra joints are ignored):

* ``joint_states`` (required): q, qd and the measured torque (``effort``), stamped per step;
* ``reference`` (required for ``acceleration="desired"``): JointTrajectory batches, point i
  applies at ``header.stamp + points[i].time_from_start``;
* ``adaptive/parametric_torque`` (optional): ``effort`` = the adaptive controller's
  parametric torque Y_SL(q, qd, qd_r, qdd_r) pi_hat, stamped with the state it answers;
* ``adaptive/parameter_update`` (only for ``transform=True``): name = full parameter
  names, position = sum of Delta pi_hat since the previous message, stamp = last cycle
  included.

Samples: one per ``joint_states`` stamp.  Input ``x = (q, qd, qdd)`` (measured q, qd):

* ``acceleration="desired"`` (default): qdd = the reference acceleration of the
  reference point nearest to the state's stamp, within ``reference_tolerance_s``
  (0.5 ms, as the controller's ``reference_tolerance``); states without one are left out
  (counted ``no_reference``);
* ``acceleration="measured"``: qdd = the backward difference
  ``(qd_k - qd_{k-1}) / (t_k - t_{k-1})`` of consecutive states -- the acceleration the
  torque reported at stamp k produced (the simulator reports the torque applied over
  the step that ended at k); the first state has none and is left out.

Target ``y`` (``target="auto"``): ``tau_measured - parametric_torque`` when the bag has
parametric torques (``"residual"``: what the controller's parametric model did not
supply -- feedback plus unmodelled dynamics; states without a parametric torque at the
same stamp are left out, counted ``no_parametric``), else ``tau_measured`` (``"torque"``:
the whole inverse dynamics).  The result's ``target`` says which.

Protocol: prequential ("test-then-train"), in stamp order.  For each block of ``block``
samples the learner first PREDICTS every sample of the block (before it has learnt any
of them) and the error is recorded; then it ``partial_fit``s every ``decimation``-th
sample (counted from the first).  The first block is long enough to hold ``warmup``
(200) learnt rows, so the GMM can estimate its scale and novelty radius from it; before
the first fit the prediction is 0.  Samples with a NaN/inf in x or y are neither
predicted nor scored (counted ``nonfinite``); learnt ones are handed to ``partial_fit``,
which rejects and counts them (``learner.n_rejected``).  Before each ``partial_fit`` the
learner is told the next block's first input (``Learner.hint``: PGPOL's kNN query).

``transform=True`` (the consistency transform): the parametric torque at stamp s used
``pi_hat(s) = pi_0 + sum of the updates stamped before s``.  The learner is kept
consistent with pi_hat at the start of each block: the block's predictions are shifted
by ``-Y(x) (pi_hat(s) - pi_hat(block start))``, then the updates of the block are applied
at once with ``learner.apply_parameter_update`` (it is linear and composes), and the
learnt rows' targets are moved to the block-end estimate,
``y - Y(x) (pi_hat(end) - pi_hat(s))``, before ``partial_fit`` -- so the result does not
depend on the block size.  Y is the standard regressor at x = (q, qd, qdd); the
controller's torque used the Slotine-Li regressor Y(q, qd, qd_r, qdd_r), which matches
it only up to the tracking error (a first-order approximation).

Learner set-up: ``make_learner(kind, input_dim=3n, output_dim=n, **learner_config)``;
``rbfn`` gets its input box ``low/high`` from the range of ALL the bag's finite inputs
plus 10 % of the span on each side (offline, so the whole bag is known; only the input
normalisation looks ahead, never the targets) unless ``learner_config`` gives one, and
``n_params = model.n_params`` with ``transform=True``.

Metrics (:mod:`.metrics`): ``running_nmse`` over consecutive windows of ``window_s``
sim seconds of scored samples (each normalised by the variance of the whole scored
target, so windows are comparable), the nMSE of the first and last window and of the
whole bag per joint, the nMSE inside and outside the training region (:mod:`.regions`:
a sample is inside when a sample learnt before its block has joint positions within
``region_radius``, 0.1 rad), and -- for scale -- the nMSE of always predicting 0.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from ..dynamics import RobotModel
from ..learning import LEARNERS, make_learner
from ..robots import ROBOT_NAMES, friction_smoothing
from .bags import open_bag, read_raw
from .metrics import nmse, running_nmse
from .regions import check_radius, GrowingNearest, REGION_RADIUS, split_nmse
from .streams import FastReader, find_topics

__all__ = ["ReplayData", "load_samples", "evaluate_learner", "format_table", "ACCELERATIONS", "TARGETS",
           "DEFAULTS"]

ACCELERATIONS = ("desired", "measured")
TARGETS = ("auto", "residual", "torque")
TARGET_NAMES = {"residual": "tau_measured - parametric_torque", "torque": "tau_measured"}
#: defaults of :func:`evaluate_learner` (the CLI's too)
DEFAULTS = {"decimation": 3, "acceleration": "desired", "target": "auto", "window_s": 1.0, "block": 100,
            "update_block": 10,   # pgpol/sgpol (CLI default): one call = one refit
            "warmup": 200, "box_margin": 0.1, "reference_tolerance_s": 5e-4}

class _JointMap:
    """Per name-tuple index arrays from a message's names to the model's joints (None for
    a message that lacks one of them; :attr:`missing` collects their names)."""

    def __init__(self, joints, robot: str, topic: str):
        self.joints, self.robot, self.topic = list(joints), robot, topic
        self._cache: dict = {}
        self.missing: set = set()
        self.seen: list = []

    def __call__(self, names) -> Optional[np.ndarray]:
        key = tuple(names)
        if key in self._cache:
            return self._cache[key]
        pos = {nm: k for k, nm in enumerate(key)}
        missing = [j for j in self.joints if j not in pos]
        self.seen.append(key)
        if missing:
            self.missing.update(missing)
            idx = None
        else:
            idx = np.array([pos[j] for j in self.joints])
        self._cache[key] = idx
        return idx

    def error(self) -> ValueError:
        """The error for a stream in which no message carries every joint."""
        return ValueError(f"{self.topic} lacks joints {sorted(self.missing)} of robot {self.robot!r} (message"
                          f" joints {list(self.seen[0]) if self.seen else []}); pass --robot NAME|URDF for"
                          " another robot")


def _gather(names_seq, values_seq, jmap: "_JointMap") -> np.ndarray:
    """Rows of ``values_seq`` (one field per message) in the model's joint order, (M, n);
    a NaN row where a message lacks a joint of the model or the field does not have one
    value per name (e.g. empty)."""
    out = np.full((len(values_seq), len(jmap.joints)), np.nan)
    groups: dict = {}
    for k, names in enumerate(names_seq):
        groups.setdefault(names, []).append(k)
    for names, rows in groups.items():
        idx, m = jmap(names), len(names)
        if idx is None:
            continue
        good = [k for k in rows if len(values_seq[k]) == m]
        if good:
            out[good] = np.array([values_seq[k] for k in good], dtype=float)[:, idx]
    return out


def _detect_robot(names) -> Optional[str]:
    """The shipped robot whose joints all appear in ``names`` (the one with most joints)."""
    names = set(names)
    best = None
    for robot in ROBOT_NAMES:
        joints = RobotModel(robot).joint_names
        if set(joints) <= names and (best is None or len(joints) > best[1]):
            best = (robot, len(joints))
    return None if best is None else best[0]


@dataclass
class ReplayData:
    """Samples of a bag in stamp order: ``X`` (N x 3n) = (q, qd, qdd), ``Y`` (N x n)."""

    bag: pathlib.Path
    robot: str
    joint_names: list
    t_ns: np.ndarray
    X: np.ndarray
    Y: np.ndarray
    target: str                      # "residual" | "torque"
    acceleration: str
    topics: dict                     # role -> topic in the bag
    counts: dict                     # messages and left-out samples
    update_t_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    update_names: list = field(default_factory=list)
    updates: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))   # rows: Delta pi (update_names order)

    @property
    def n(self) -> int:
        return len(self.joint_names)

    @property
    def target_name(self) -> str:
        return TARGET_NAMES[self.target]


def load_samples(bag, *, robot=None, acceleration: str = "desired", target: str = "auto",
                 reference_tolerance_s: float = DEFAULTS["reference_tolerance_s"],
                 with_updates: bool = False) -> ReplayData:
    """Read a bag into learner samples (module docstring).  ``robot``: a robot name or
    URDF path; ``None`` = the shipped robot whose joints the bag's ``joint_states``
    carry, else ``panda``.  ``ValueError`` names missing topics, joints or fields."""
    if acceleration not in ACCELERATIONS:
        raise ValueError(f"acceleration must be one of {ACCELERATIONS}, got {acceleration!r}")
    if target not in TARGETS:
        raise ValueError(f"target must be one of {TARGETS}, got {target!r}")
    if not (reference_tolerance_s >= 0 and math.isfinite(reference_tolerance_s)):
        raise ValueError(f"reference tolerance must be >= 0 s, got {reference_tolerance_s}")
    src = open_bag(bag)
    path = src.dir
    topics, info = find_topics(src)
    where = f"bag {str(bag)!r}"
    listing = f"topics in the bag: {sorted(info) or 'none'}"
    if "joint_states" not in topics:
        raise ValueError(f"{where} has no joint_states messages (sensor_msgs/msg/JointState; q, qd and the measured"
                         f" torque); {listing}")
    if acceleration == "desired" and "reference" not in topics:
        raise ValueError(f"{where} has no reference messages (trajectory_msgs/msg/JointTrajectory), needed for"
                         f" acceleration 'desired'; use acceleration 'measured' or record 'reference'; {listing}")
    if target == "residual" and "parametric" not in topics:
        raise ValueError(f"{where} has no adaptive/parametric_torque messages, needed for target 'residual';"
                         f" {listing}")
    if with_updates and "update" not in topics:
        raise ValueError(f"{where} has no adaptive/parameter_update messages, needed for the consistency"
                         f" transform; {listing}")
    tgt = "torque" if target == "torque" or "parametric" not in topics else "residual"
    wanted = {topics["joint_states"]: "joint_states"}
    if acceleration == "desired":
        wanted[topics["reference"]] = "reference"
    if tgt == "residual":
        wanted[topics["parametric"]] = "parametric"
    if with_updates:
        wanted[topics["update"]] = "update"

    # collect first (references usually precede the first state), map joints afterwards
    states, refs, ptorque = [], [], []
    up_t, up_v, up_names = [], [], None
    fast = FastReader()
    for topic, msgtype, _, raw in read_raw(src, list(wanted)):
        role = wanted[topic]
        if role == "joint_states":
            states.append(fast.joint_state(raw))
        elif role == "parametric":
            s, names, _, _, eff = fast.joint_state(raw)
            ptorque.append((s, names, eff))
        elif role == "reference":
            t0, names, points = fast.trajectory(raw)
            refs.extend((t0 + dt, names, acc) for dt, acc in points)
        else:
            stamp, names, pos, _, _ = fast.joint_state(raw)
            names = list(names)
            if up_names is None:
                up_names = names
            vals = np.asarray(pos, dtype=float)
            if vals.shape != (len(names),) or set(names) != set(up_names) or len(names) != len(up_names):
                raise ValueError(f"{topic}: parameter names or sizes change between messages")
            if names != up_names:
                vals = vals[[names.index(nm) for nm in up_names]]
            if not np.isfinite(vals).all():
                raise ValueError(f"{topic}: non-finite parameter update at stamp {stamp} ns")
            up_t.append(stamp)
            up_v.append(vals)
    if not states:
        raise ValueError(f"{where}: no joint_states messages could be read")
    robot_name = robot if robot is not None else (_detect_robot(states[0][1]) or "panda")
    model = RobotModel(robot_name)
    joints, n = model.joint_names, model.n
    jmap = _JointMap(joints, robot_name, topics["joint_states"])
    counts = {"joint_states": len(states), "reference_points": len(refs), "parametric_torque": len(ptorque),
              "parameter_update": len(up_t)}
    has = np.array([jmap(s[1]) is not None for s in states], dtype=bool)
    if not has.any():
        raise jmap.error()
    counts["missing_joints"] = int((~has).sum())   # e.g. a joint renamed part-way: those messages only
    if jmap.missing:
        counts["missing_joint_names"] = sorted(jmap.missing)
    states = [s for s, h in zip(states, has) if h]
    st_t = [s[0] for s in states]
    st_names = [s[1] for s in states]
    st_q = _gather(st_names, [s[2] for s in states], jmap)
    st_v = _gather(st_names, [s[3] for s in states], jmap)
    st_e = _gather(st_names, [s[4] for s in states], jmap)
    rf_t = np.asarray([r[0] for r in refs], dtype=np.int64)
    rf_a = np.zeros((0, n))
    if refs:
        rf_a = _gather([r[1] for r in refs], [r[2] for r in refs],
                       _JointMap(joints, robot_name, topics["reference"]))
    pt_t = np.asarray([p[0] for p in ptorque], dtype=np.int64)
    pt_e = np.zeros((0, n))
    if ptorque:
        pt_e = _gather([p[1] for p in ptorque], [p[2] for p in ptorque],
                       _JointMap(joints, robot_name, topics["parametric"]))

    # states in stamp order (a repeated stamp: the last message wins); a stamp before one
    # received earlier is counted out_of_order (and sorted into place)
    t = np.asarray(st_t, dtype=np.int64)
    n_back = int(np.sum(t[1:] < np.maximum.accumulate(t)[:-1])) if t.size > 1 else 0
    order = np.argsort(t, kind="stable")
    t = t[order]
    keep = np.ones(t.size, dtype=bool)
    keep[:-1] = t[1:] != t[:-1]
    sel = order[keep]
    t = t[keep]
    Q, V, E = st_q[sel], st_v[sel], st_e[sel]
    for what, arr in (("velocity", V), ("effort (the measured torque)", E)):
        if not np.isfinite(arr).any():
            raise ValueError(f"{where}: {topics['joint_states']} carries no {what} for the joints {joints}")
    ok = np.ones(t.size, dtype=bool)
    counts.update({"states": int(t.size), "duplicate_stamps": int((~keep).sum()), "out_of_order": n_back,
                   "no_reference": 0,
                   "no_previous_state": 0, "no_parametric": 0})

    if acceleration == "measured":
        A = np.full_like(V, np.nan)
        if t.size > 1:
            A[1:] = (V[1:] - V[:-1]) / ((t[1:] - t[:-1]) * 1e-9)[:, None]
        ok[0] = False
        counts["no_previous_state"] = 1
    else:
        rt, ra = rf_t, rf_a
        if not np.isfinite(ra).any() and ra.size:
            raise ValueError(f"{where}: the reference points carry no accelerations; use acceleration 'measured'")
        ro = np.argsort(rt, kind="stable")
        rt, ra = rt[ro], ra[ro]
        A = np.full_like(V, np.nan)
        if rt.size:
            j = np.clip(np.searchsorted(rt, t), 1, max(rt.size - 1, 1))
            j0 = np.clip(j - 1, 0, rt.size - 1)
            j1 = np.clip(j, 0, rt.size - 1)
            near = np.where(np.abs(rt[j1] - t) < np.abs(rt[j0] - t), j1, j0)
            # the last of equal stamps (a re-sent window) wins
            near = np.searchsorted(rt, rt[near], side="right") - 1
            hit = np.abs(rt[near] - t) <= int(round(reference_tolerance_s * 1e9))
            A[hit] = ra[near[hit]]
        else:
            hit = np.zeros(t.size, dtype=bool)
        counts["no_reference"] = int((~hit & ok).sum())
        ok &= hit

    if tgt == "residual":
        po = np.argsort(pt_t, kind="stable")
        pt_t, pt_e = pt_t[po], pt_e[po]
        P = np.full_like(E, np.nan)
        j = np.searchsorted(pt_t, t, side="right") - 1      # the last message with stamp <= t
        has = (j >= 0) & (pt_t[np.maximum(j, 0)] == t) if pt_t.size else np.zeros(t.size, dtype=bool)
        P[has] = pt_e[j[has]]
        counts["no_parametric"] = int((~has & ok).sum())
        ok &= has
        Y = E - P
    else:
        Y = E.copy()
    X = np.hstack([Q, V, A])[ok]
    counts["samples"] = int(ok.sum())
    if counts["samples"] == 0:
        raise ValueError(f"{where}: no usable samples ({counts})")
    if src.recovered:
        counts["truncated"] = src.recovered
    data = ReplayData(path, robot_name, list(joints), t[ok], X, Y[ok], tgt, acceleration, topics, counts)
    if with_updates:
        ut = np.asarray(up_t, dtype=np.int64)
        uo = np.argsort(ut, kind="stable")
        data.update_t_ns = ut[uo]
        data.update_names = list(up_names or [])
        data.updates = np.asarray(up_v, dtype=float)[uo]
    return data


# --------------------------------------------------------------------------- evaluation

def _sig(x, digits: int = 4):
    x = float(x)
    return None if not math.isfinite(x) else float(f"{x:.{digits}g}")


def _per_joint(values, joints) -> dict:
    return {j: _sig(v) for j, v in zip(joints, np.asarray(values).reshape(-1))}


def _friction_smoothing(robot: str) -> float:
    """The robot's ``friction_smoothing`` (its parameter file's; 0 for a URDF without one)."""
    try:
        return friction_smoothing(robot)
    except (ValueError, OSError, KeyError):
        return 0.0


def _transform_model(robot: str, names: list):
    """The RobotModel whose ``parameter_names`` hold the update's names, and the index of
    each update entry in them (friction columns with the Coulomb shape the robot's parameter
    file gives the graph, ``friction_smoothing``)."""
    friction = any(nm.endswith((".fv", ".fc")) for nm in names)
    model = RobotModel(robot, friction=friction, coulomb_smoothing=_friction_smoothing(robot) if friction else 0.0)
    pos = {nm: k for k, nm in enumerate(model.parameter_names)}
    unknown = [nm for nm in names if nm not in pos]
    if unknown:
        raise ValueError(f"adaptive/parameter_update names {unknown[:5]}{' ...' if len(unknown) > 5 else ''}"
                         f" are not parameters of robot {robot!r} (model.parameter_names)")
    return model, np.array([pos[nm] for nm in names], dtype=int)


def _make(kind: str, data: ReplayData, cfg: dict, margin: float, n_params: int):
    n = data.n
    cfg = dict(cfg)
    for key, want in (("input_dim", 3 * n), ("output_dim", n)):
        if key in cfg and int(cfg.pop(key)) != want:
            raise ValueError(f"learner config {key} must be {want} for x = (q, qd, qdd) of {n} joints")
    box = None
    if kind == "rbfn":
        if ("low" in cfg) != ("high" in cfg):
            raise ValueError("learner config: give both low and high (the RBFN input box) or neither")
        if "low" not in cfg:
            fin = data.X[np.isfinite(data.X).all(axis=1)]
            lo, hi = (fin.min(axis=0), fin.max(axis=0)) if fin.size else (np.full(3 * n, -1.0), np.full(3 * n, 1.0))
            span = np.maximum(hi - lo, 1e-3)
            cfg["low"], cfg["high"] = lo - margin * span, hi + margin * span
            box = "whole bag's inputs +/- %g of the span" % margin
    if n_params and kind in ("rbfn", "joint_local"):   # the learners that carry dW/dpi
        if int(cfg.setdefault("n_params", n_params)) != n_params:
            raise ValueError(f"learner config n_params must be {n_params} (model.n_params) with the transform")
    try:
        return make_learner(kind, input_dim=3 * n, output_dim=n, **cfg), box
    except TypeError as exc:  # an unknown keyword
        raise ValueError(f"learner config for {kind!r}: {exc}") from None


def _shift(model, X: np.ndarray, rows: np.ndarray, dpi: np.ndarray) -> np.ndarray:
    """Y(x_r) @ dpi_r for each row r (Y: the standard regressor at x = (q, qd, qdd));
    zero where dpi_r = 0 or x_r is not finite."""
    n = model.n
    out = np.zeros((rows.size, n))
    live = np.flatnonzero(np.any(dpi != 0.0, axis=1) & np.isfinite(X[rows]).all(axis=1))
    for k in live:
        x = X[rows[k]]
        out[k] = model.regressor(x[:n], x[n:2 * n], x[2 * n:]) @ dpi[k]
    return out


def _transform_counts(data: ReplayData, transform: bool) -> dict:
    if not transform:
        return {"enabled": False}
    ut, t = data.update_t_ns, data.t_ns
    before = int(np.searchsorted(ut, t[0], side="left"))
    after = int(ut.size - np.searchsorted(ut, t[-1], side="left"))
    return {"enabled": True, "updates": int(ut.size), "updates_within": int(ut.size - before - after),
            "updates_before_first_sample": before, "updates_after_last_sample": after}


def evaluate_learner(bag, learner: str = "gmm", *, robot=None, learner_config: Optional[dict] = None,
                     decimation: int = DEFAULTS["decimation"], acceleration: str = DEFAULTS["acceleration"],
                     target: str = DEFAULTS["target"], window_s: float = DEFAULTS["window_s"],
                     block: int = DEFAULTS["block"], warmup: int = DEFAULTS["warmup"], transform: bool = False,
                     out_dir=None, model_out=None, plot: bool = True,
                     reference_tolerance_s: float = DEFAULTS["reference_tolerance_s"],
                     region_radius: float = REGION_RADIUS) -> dict:
    """Prequential evaluation of residual learner ``learner`` on ``bag`` (module
    docstring).  Writes ``replay_<learner>.json`` and ``replay_<learner>.png`` to
    ``out_dir`` (when given) and the trained learner to ``model_out`` (``learner.save``).
    Returns the JSON summary as a dict."""
    from threadpoolctl import threadpool_limits

    if learner not in LEARNERS:
        raise ValueError(f"unknown learner {learner!r}; available: {sorted(LEARNERS)}")
    if int(decimation) != decimation or decimation < 1:
        raise ValueError(f"decimation must be an integer >= 1, got {decimation}")
    if int(block) != block or block < 1 or int(warmup) != warmup or warmup < 0:
        raise ValueError(f"block must be >= 1 and warmup >= 0 (integers), got {block}, {warmup}")
    if not (window_s > 0 and math.isfinite(window_s)):
        raise ValueError(f"window must be > 0 s, got {window_s}")
    region_radius = check_radius(region_radius)
    if learner_config is not None and not isinstance(learner_config, dict):
        raise ValueError(f"learner config must be a dict of constructor arguments, got {type(learner_config).__name__}")
    decimation, block, warmup = int(decimation), int(block), int(warmup)
    t_start = time.perf_counter()
    with threadpool_limits(1):
        data = load_samples(bag, robot=robot, acceleration=acceleration, target=target,
                            reference_tolerance_s=reference_tolerance_s, with_updates=transform)
        model = upd_idx = None
        if transform:
            model, upd_idx = _transform_model(data.robot, data.update_names)
        L, box = _make(learner, data, learner_config or {}, DEFAULTS["box_margin"],
                       model.n_params if (transform and learner in ("rbfn", "joint_local")) else 0)
        if L.uses_regressors and model is None:
            raise ValueError("learner config n_params > 0 (the RBFN's parameter sensitivity) is only used with"
                             " the transform (--transform)")
        fit_model = model if L.uses_regressors else None
        t_loaded = time.perf_counter()

        X, Y, t = data.X, data.Y, data.t_ns
        N, n = Y.shape
        finite = np.isfinite(X).all(axis=1) & np.isfinite(Y).all(axis=1)
        learn = np.zeros(N, dtype=bool)
        learn[::decimation] = True
        pred = np.full((N, n), np.nan)
        dist = np.full(N, np.inf)        # to the nearest joint position learnt before the sample's block
        seen = GrowingNearest(n)
        first = min(N, max(1, warmup * decimation)) if warmup else min(N, block)
        bounds = list(range(first, N, block)) + [N]
        if transform:
            # cum[k] = sum of the first k updates (model order); the parametric torque at
            # stamp s used pi_hat = pi_0 + cum[#updates with stamp < s]
            dpis = np.zeros((data.updates.shape[0], model.n_params))
            dpis[:, upd_idx] = data.updates
            cum = np.vstack([np.zeros((1, model.n_params)), np.cumsum(dpis, axis=0)])
            ui = np.searchsorted(data.update_t_ns, t, side="left")      # per sample
        a = 0
        for b in bounds:
            rows = a + np.flatnonzero(finite[a:b])
            fit = a + np.flatnonzero(learn[a:b])
            if transform:
                # the learner is consistent with pi_hat at t[a]; the block ends at pi_hat of
                # the next block's first sample (of the last sample for the last block)
                i0, i1 = ui[a], (ui[b] if b < N else ui[N - 1])
            if rows.size and len(seen):
                dist[rows] = seen.query(X[rows, :n])
            if rows.size and not L.n_updates:
                pred[rows] = 0.0                 # nothing learnt yet
            elif rows.size:
                pred[rows] = L.predict(X[rows])
                if transform:  # the updates inside the block before each sample
                    pred[rows] -= _shift(model, X, rows, cum[ui[rows]] - cum[i0])
            if transform and i1 > i0 and L.n_updates:
                L.apply_parameter_update(cum[i1] - cum[i0], model)
            if fit.size:
                yf = Y[fit]
                if transform:  # targets moved to pi_hat at the block's end (the learner's now)
                    yf = yf - _shift(model, X, fit, cum[i1] - cum[ui[fit]])
                if b < N and np.isfinite(X[b]).all():
                    L.hint(X[b])                 # the next block's first query (PGPOL's kNN)
                L.partial_fit(X[fit], yf, model=fit_model)
                ok = np.isfinite(X[fit]).all(axis=1) & np.isfinite(yf).all(axis=1)
                seen.add(X[fit[ok], :n])
            a = b
        t_done = time.perf_counter()

    scored = np.flatnonzero(finite)
    if scored.size == 0:
        raise ValueError(f"bag {str(bag)!r}: every sample has a NaN/inf in its input or target")
    P, T = pred[scored], Y[scored]
    inside = dist[scored] <= region_radius
    parts = split_nmse(T, P, inside)
    dt_s = float(np.median(np.diff(t))) * 1e-9 if N > 1 else 1e-3
    w = int(min(scored.size, max(1, round(window_s / dt_s))))
    R = running_nmse(P, T, w)
    tw = (t[scored][: R.shape[0] * w].reshape(R.shape[0], w).mean(axis=1) - t[0]) * 1e-9
    joints = data.joint_names
    size = getattr(L, "n_components", None)
    if size is None:
        size = getattr(L, "n_basis", None)
    eval_s, wall_s = t_done - t_loaded, t_done - t_start
    res = {
        "bag": str(data.bag), "robot": data.robot, "learner": learner, "joints": joints,
        "target": data.target_name, "inputs": "q, qd (measured), qdd (" + (
            "reference acceleration at the state's stamp)" if acceleration == "desired" else
            "backward difference of measured qd)"),
        "acceleration": acceleration, "protocol": "prequential (predict each block, then learn it)",
        "decimation": decimation, "block": block, "window_s": window_s, "window_samples": w,
        "duration_s": _sig((t[-1] - t[0]) * 1e-9, 6),
        "samples": {"total": int(N), "scored": int(scored.size), "learned": int((learn & finite).sum()),
                    "nonfinite": int(N - scored.size), "nonfinite_learn_rows": int((learn & ~finite).sum()),
                    **{k: v for k, v in data.counts.items() if k in (
                        "no_reference", "no_parametric", "no_previous_state", "duplicate_stamps", "out_of_order",
                        "missing_joints", "missing_joint_names")}},
        "messages": {k: v for k, v in data.counts.items() if k in ("joint_states", "reference_points",
                                                                   "parametric_torque", "parameter_update")},
        **({"truncated": data.counts["truncated"]} if "truncated" in data.counts else {}),
        "nmse_first_window": _per_joint(R[0], joints),
        "nmse_last_window": _per_joint(R[-1], joints),
        "nmse_overall": _per_joint(nmse(P, T), joints),
        "nmse_zero_predictor": _per_joint(nmse(np.zeros_like(T), T), joints),
        "nmse_inside": None if parts["inside"] is None else _per_joint(np.asarray(parts["inside"]), joints),
        "nmse_outside": None if parts["outside"] is None else _per_joint(np.asarray(parts["outside"]), joints),
        "region": {"radius_rad": region_radius, "distance": "nearest joint position learnt before the sample's"
                   " block, Euclidean [rad]", "fraction_outside": _sig(1.0 - inside.mean()),
                   "pulled_back_fraction": _sig(L.pulled_back_fraction)},
        "nmse_last_window_mean": _sig(R[-1].mean()),
        "nmse_windows": {"t_s": [_sig(x, 6) for x in tw], "nmse": [[_sig(v) for v in row] for row in R]},
        "learner_counters": {**{k: int(v) for k, v in L._counters().items()},
                             "size": None if size is None else int(size)},
        "learner_config": {k: v for k, v in L.get_config().items() if k not in ("low", "high", "scale")},
        "rbfn_box": box,
        "transform": _transform_counts(data, transform),
        "load_s": round(t_loaded - t_start, 3), "eval_s": round(eval_s, 3), "wall_s": round(wall_s, 3),
        "samples_per_s": _sig(N / eval_s if eval_s > 0 else float("inf")),
        "samples_per_s_with_loading": _sig(N / wall_s if wall_s > 0 else float("inf")),
        "json": None, "plot": None, "model": None,
    }
    if model_out:
        res["model"] = L.save(model_out)
    if out_dir is not None:
        out = pathlib.Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        if plot:
            res["plot"] = str(out / f"replay_{learner}.png")
            _plot(res["plot"], tw, R, joints, res)
        res["json"] = str(out / f"replay_{learner}.json")
        tmp = out / f".replay_{learner}.json.tmp"
        tmp.write_text(json.dumps(res, indent=2))
        os.replace(tmp, res["json"])
    return res


def _plot(path: str, tw, R, joints, res: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.8))
    for j, name in enumerate(joints):
        ax.semilogy(tw, np.maximum(R[:, j], 1e-12), marker="." if len(tw) < 30 else None, lw=1.2, label=name)
    ax.axhline(1.0, color="k", ls=":", lw=1)
    ax.set_xlabel("bag time [s]")
    ax.set_ylabel(f"nMSE per {res['window_s']:g} s window")
    ax.set_title(f"{res['learner']} on {pathlib.Path(res['bag']).name}: prequential nMSE\n"
                 f"target {res['target']}, qdd {res['acceleration']}, learn every {res['decimation']}",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_table(res: dict) -> str:
    """The per-joint table the CLI prints."""
    lines = [f"{'joint':18s} {'nMSE first':>11s} {'nMSE last':>11s} {'nMSE all':>11s} {'inside':>11s}"
             f" {'outside':>11s} {'predict 0':>11s}"]
    for j in res["joints"]:
        vals = [(res[k] or {}).get(j) for k in ("nmse_first_window", "nmse_last_window", "nmse_overall",
                                               "nmse_inside", "nmse_outside", "nmse_zero_predictor")]
        lines.append(f"{j:18s} " + " ".join(f"{v:11.4g}" if v is not None else f"{'-':>11s}" for v in vals))
    s, c = res["samples"], res["learner_counters"]
    lines.append("")
    lines.append(f"{res['learner']} on {res['robot']}, target {res['target']}: {s['total']} samples"
                 f" ({s['scored']} scored, {s['learned']} learnt, {s['nonfinite']} non-finite), windows of"
                 f" {res['window_s']:g} s; learner size {c['size']}, {c['n_updates']} updates, {c['n_rejected']}"
                 f" rejected, {c['n_transforms']} transforms; {res['eval_s']:.2f} s"
                 f" ({res['samples_per_s']:.0f} samples/s), {res['wall_s']:.2f} s with loading")
    r = res["region"]
    lines.append(f"training region: joint positions within {r['radius_rad']:g} rad of a sample learnt before;"
                 f" {100 * r['fraction_outside']:.1f} % of the scored samples outside it; predictions pulled back"
                 f" to the prior: {100 * r['pulled_back_fraction']:.1f} %")
    if res.get("plot"):
        lines.append(f"plot: {res['plot']}   json: {res['json']}")
    if res.get("model"):
        lines.append(f"model: {res['model']}")
    return "\n".join(lines)

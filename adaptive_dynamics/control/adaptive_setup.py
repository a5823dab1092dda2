"""The ``adaptive_controller`` node's laws, built from its settings (no ROS).

:func:`build_laws` turns the node's parameters (a plain mapping) into
:class:`AdaptiveLaws`: the learning core (an
:class:`~adaptive_dynamics.control.adaptive.AdaptiveController`, or adaptive
backstepping's, :class:`~adaptive_dynamics.control.backstepping.BacksteppingController`),
and the fixed-estimate laws that share its Lambda and K_D (``sliding_pd``: -K_D s;
``slotine_li``: the URDF's model, not adapted), started from :func:`initial_estimate` and
an initial estimate file where one is named.  :func:`derived_kd` is the model-derived
K_D of ``kd: [0]``; :func:`estimate_over_limits` the start-time check of a loaded
estimate.  The node keeps what is ROS: parameters, logs, counters, topics.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional

import numpy as np

from ..dynamics.effort_check import describe, over_limit, range_poses, worst_torques
from ..dynamics.joint_friction import from_dict
from ..dynamics.thunder_params import read_thunder_parameters
from .adaptive import AdaptiveController
from .backstepping import BacksteppingController
from .gains import armature_vector, default_gains

__all__ = ["AdaptiveLaws", "build_laws", "initial_estimate", "derived_kd", "estimate_over_limits",
           "is_thunder_file", "FIXED_LAWS"]

#: the node's fixed-estimate laws: name -> the estimate they use ("zero" or the URDF's)
FIXED_LAWS = {"sliding_pd": "zero", "slotine_li": "urdf"}


def is_thunder_file(path) -> bool:
    """An ``initial_estimate_file`` in Thunder's YAML layout (else a state file, ``.npz``)."""
    return str(path).endswith((".yaml", ".yml"))


def _urdf_outside(nominal: np.ndarray, pi, cols) -> np.ndarray:
    """``pi`` on the adapted columns ``cols``, the URDF's values elsewhere."""
    out = nominal.copy()
    out[cols] = np.asarray(pi)[cols]
    return out


def thunder_estimate(model, path: str) -> tuple[np.ndarray, dict]:
    """The full pi of a Thunder ``*_inertial_REG.yaml`` (the model keeps the URDF's) and
    what the reader ignored."""
    if not os.path.exists(path):
        raise ValueError(f"initial_estimate=file needs an existing initial_estimate_file, got {path!r}")
    links, info = read_thunder_parameters(model, path)
    return model.parameters_with_links(links), info


def initial_estimate(model, kind: str, *, scale: float = 1.0, path: str = "", links: Optional[List[str]] = None,
                     log: Callable[[str], None] = lambda _m: None) -> np.ndarray:
    """The start estimate (full pi) of ``initial_estimate`` ``kind`` ("nominal", "scaled",
    "zero", "file": a Thunder YAML here, a state file later, :func:`build_laws`); with
    ``links`` the other links' entries are the URDF's."""
    nominal = model.parameters.copy()
    if kind == "nominal":
        pi0 = nominal.copy()
    elif kind == "scaled":
        pi0 = scale * nominal
    elif kind == "file" and is_thunder_file(path):
        pi0, info = thunder_estimate(model, path)
        log(f"initial estimate from the Thunder parameter file {path}"
            + (f" (not read: {info['ignored']})" if info["ignored"] else ""))
    else:
        pi0 = np.zeros_like(nominal)
    if links:
        pi0 = _urdf_outside(nominal, pi0, AdaptiveController._adapted_columns(model, links)[1])
    return pi0


def derived_kd(model, rate_hz: float, armature) -> np.ndarray:
    """The model-derived K_D of ``kd: [0]`` (:func:`~adaptive_dynamics.control.gains.default_gains`
    at the loop's rate with the drives' ``armature``)."""
    try:
        return np.asarray(default_gains(model, dt=1.0 / rate_hz, armature=armature_vector(armature, model.n))["kd"],
                          dtype=float)
    except ValueError as exc:
        raise ValueError(f"kd [0] derives K_D from the model, which cannot here ({exc}): set kd explicitly") from None


@dataclass
class AdaptiveLaws:
    """The node's laws: ``core`` (learning), ``bs`` (backstepping around it, task space)
    or None, ``fixed`` (``sliding_pd``, ``slotine_li``; joint space only)."""
    task: bool
    core: AdaptiveController
    bs: Optional[BacksteppingController]
    fixed: Dict[str, AdaptiveController] = field(default_factory=dict)
    pi_nominal: np.ndarray = None
    theta0: np.ndarray = None
    #: diag(s_i^2) of ``gamma_scaling: nominal`` in the core's coordinates (None: off): a
    #: scalar ``gamma`` given to :meth:`set_gains` is multiplied by it
    gamma_scale: Optional[np.ndarray] = None

    def set_gains(self, **gains) -> None:
        """Gains of the core (a scalar ``gamma`` scaled by :attr:`gamma_scale`); Lambda and
        K_D also of the fixed-estimate laws."""
        g = np.asarray(gains.get("gamma", ()), dtype=float)
        if self.gamma_scale is not None and g.size == 1:
            gains["gamma"] = float(g.reshape(-1)[0]) * self.gamma_scale
        self.core.set_gains(**gains)
        shared = {k: v for k, v in gains.items() if k in ("lam", "kd")}
        if shared:
            for core in self.fixed.values():
                core.set_gains(**shared)

    def law_core(self, law: str) -> AdaptiveController:
        """The core that computes ``law`` (the learning core for the adaptive laws)."""
        return self.fixed.get(law, self.core)


def build_laws(model, p: Mapping, gains: Mapping, *, log: Callable[[str], None] = lambda _m: None) -> AdaptiveLaws:
    """The laws of the settings ``p`` (the node's parameters: ``law``, ``adaptation``,
    ``rate_hz``, ``base_parameters``, ``friction``, ``projection``,
    ``robot_compensates_gravity``, ``adapted_links``, ``initial_estimate``,
    ``nominal_scale``, ``initial_estimate_file``, ``kp_task``, ``singular_damping``,
    ``singular_threshold``, ``k_posture``, ``gamma_scaling``) with ``gains`` (the core's
    keyword gains: ``lam``, ``kd``, ``gamma``, ...; ``gamma_scaling: nominal`` scales a
    scalar ``gamma`` per parameter by the nominal estimate's magnitudes, in the core's
    coordinates).  An ``initial_estimate: file`` state file is loaded (the estimate only;
    P stays ``p0``); ``ValueError`` with what differs."""
    task = p["law"] == "backstepping"
    nominal = model.parameters.copy()
    links = [str(x) for x in p["adapted_links"] if str(x)] or None
    pi0 = initial_estimate(model, p["initial_estimate"], scale=p["nominal_scale"], path=p["initial_estimate_file"],
                           links=links, log=log)
    common = dict(dt=1.0 / p["rate_hz"], base_parameters=p["base_parameters"], friction=p["friction"],
                  projection=p["projection"], robot_compensates_gravity=p["robot_compensates_gravity"],
                  forget_to=p.get("forget_to", "prior"), adapt_to_feedforward=p.get("adapt_to_feedforward", True))
    law = p["adaptation"] if task else p["law"] if p["law"] in ("direct", "composite") else "composite"
    if task and p.get("parametric_torque", "law") == "state":
        log("parametric_torque: state is joint space only: law backstepping publishes the law's model torque")
    if task:
        bs = BacksteppingController(
            model, law, kp_task=np.asarray(p["kp_task"], dtype=float), damping=p["singular_damping"],
            singular_threshold=p["singular_threshold"], k_posture=p["k_posture"], pi0=pi0, adapted_links=links,
            orientation=p.get("orientation_error", "log"),
            **common, **gains)
        core = bs.core
    else:
        bs = None
        core = AdaptiveController(model, law, pi0=pi0, adapted_links=links, **common, **gains)
        core.model_input = p["model_input"]
        core.state_torque = p.get("parametric_torque", "law") == "state"
    src = p["initial_estimate_file"]
    if p["initial_estimate"] == "file" and not is_thunder_file(src):
        if not src or not os.path.exists(src):
            raise ValueError(f"initial_estimate=file needs an existing initial_estimate_file (.npz, or a"
                             f" Thunder *_inertial_REG.yaml), got {src!r}")
        core.load_state(src, covariance=False)   # raises with what differs: friction, base parameters
        if links:   # the links not adapted keep the URDF's values
            core.set_estimate(pi=_urdf_outside(nominal, core.pi, core.columns))
        core.set_prior()   # the estimate the user starts from is the one forgetting returns to
        log(f"initial estimate loaded from {src}")
    if p.get("friction_model_file"):
        core.fixed_friction = friction_model(model, p["friction_model_file"])
        log(f"fixed friction feed-forward: {core.fixed_friction!r} from {p['friction_model_file']}")
    fixed_gains = {k: gains[k] for k in ("lam", "kd")}
    fixed = {} if task else {
        name: AdaptiveController(model, "direct", pi0=np.zeros_like(nominal) if which == "zero" else nominal,
                                 **common, **fixed_gains)
        for name, which in FIXED_LAWS.items()}
    laws = AdaptiveLaws(task, core, bs, fixed, nominal, core.theta.copy())
    if p["gamma_scaling"] == "nominal":
        laws.gamma_scale = core.nominal_gamma_scale(nominal)
        laws.set_gains(gamma=gains["gamma"])
    return laws


def friction_model(model, path: str):
    """The joint-friction model in the JSON file ``path`` (``friction_<kind>.json`` of
    ``adaptive-dynamics identify --friction``: :func:`~adaptive_dynamics.dynamics.joint_friction.from_dict`'s
    form) for ``model``'s joints; ``ValueError`` saying what is wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            d = json.load(fh)
    except OSError as exc:
        raise ValueError(f"friction_model_file {path!r}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"friction_model_file {path!r} is not JSON ({exc})") from None
    fm = from_dict(d)
    if fm.n != model.n:
        raise ValueError(f"friction_model_file {path!r} has {fm.n} joints, the model {model.n}")
    return fm


def estimate_over_limits(model, pi) -> tuple[int, str]:
    """Does holding the arm against gravity with the estimate ``pi`` need more than the
    effort limits somewhere in the joint ranges (256 poses)?  ``(number of joints, what
    to log)``; ``(0, "")`` when it does not."""
    zero = np.zeros(model.n)
    Q = range_poses(model.lower, model.upper)
    worst, k = worst_torques(lambda q: model.regressor(q, zero, zero).dot(pi), Q)
    bad = over_limit(worst, model.effort_limit)
    if not bad.size:
        return 0, ""
    urdf, _ = worst_torques(model.gravity, Q)
    return int(bad.size), (
        "needs more than the effort limits to hold the arm against gravity: "
        + describe(model.joint_names, worst, [f"q={np.round(Q[i], 2).tolist()}" for i in k], model.effort_limit,
                   bad, "gravity torque")
        + f" (the URDF's model: {', '.join(f'{urdf[j]:.3g}' for j in bad)} N m) -- another robot's or"
        " payload's file, or a diverged estimate? The command will saturate there.")

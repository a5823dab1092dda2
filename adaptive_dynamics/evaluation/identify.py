"""``adaptive-dynamics identify SOURCE --robot R --out DIR``: rigid-body identification
from a recording, evaluated on held-out data (no ROS import).

1. Read the joint states (:mod:`.recordings`: a bag's ``joint_states`` or a CSV file),
   counting what is left out (missing joints, NaN/inf rows); split at ``--train`` of the
   recorded time (the first part identifies, the rest evaluates).
2. Each part cut into clean segments (:func:`~adaptive_dynamics.dynamics.identification.segments`:
   out-of-order or repeated stamps dropped and counted, gaps split, jittered stamps
   resampled), each segment filtered forward-backward (Butterworth, ``--cutoff-hz``) with
   qdd from the filtered velocity (:func:`~adaptive_dynamics.dynamics.identification.prepare`).
3. Identification of the base parameters + viscous and Coulomb friction (+ a constant
   torque offset per joint, unless ``--no-offset``) by weighted least squares, and its
   physically consistent variant (every link's pseudo-inertia positive semidefinite, a
   semidefinite program; ``--no-consistent`` skips it).
4. Per-joint nMSE on the held-out part for the URDF's own model (no friction), the
   least-squares and the consistent identification (and the learner's, with
   ``--learner``): overall, and inside and outside the training region
   (:mod:`.regions`: a held-out sample is inside when a training sample's joint
   positions lie within ``--region-radius``, 0.1 rad by default).
5. With ``--friction sigmoid|stribeck|all``: the rigid body identified again together
   with a smooth friction model per joint
   (:func:`~adaptive_dynamics.dynamics.joint_friction.identify_friction`: the Gaz et
   al. sigmoid + viscous, or Stribeck), each model's held-out nMSE per joint beside the
   linear (viscous + Coulomb) model's in ``friction_models``, and
   ``friction_heldout_nmse_ratio`` (smooth / linear, per joint).  ``--friction linear``
   (the default) leaves them out.

Writes to ``--out``: ``estimate_ls.npz`` and ``estimate_consistent.npz`` (adaptive
controller state files: ``adaptive_controller`` with ``friction: true``,
``initial_estimate: file`` and ``initial_estimate_file``), ``warmstart.npz`` (the identification part's inputs
x = (q, qd, qdd) and the torque the least-squares model leaves, y = tau - Y theta (the
offset is not part of the controller's model, so it stays in y): the training data of a
residual learner; with ``--learner KIND`` also that learner
trained on it, ``learner_KIND.npz``, a ``residual_learner`` ``model_file``, whose prior is
the identified offsets: where its data does not reach it predicts the identification), plots of
measured vs predicted torque on the held-out part (``identify_torque.png``) and
``identify.json`` (printed last; with a smooth ``--friction`` model also its fitted
parameters, ``friction_models.KIND.model``, which
:func:`~adaptive_dynamics.dynamics.joint_friction.from_dict` reads).  With a smooth
model also ``friction_KIND.json`` (the model alone: the ``adaptive_controller``'s
``friction_model_file``) and ``estimate_KIND.npz`` (the rigid body identified with it,
friction columns zero: its ``initial_estimate_file``).

``--payload``: what is the load on the flange?  The arm's model is held fixed -- the
URDF's parameters with the robot's configured joint friction (a shipped robot:
``friction_viscous`` / ``friction_coulomb`` of its parameter file; a URDF robot: none), or
an earlier estimate (``--arm-estimate estimate_consistent.npz``: its parameters and
friction columns) -- and only the 10 inertial parameters of a rigid load fixed to
``--payload-frame`` (default the end-effector frame) are identified on the ``--train``
part, with a torque offset per joint (unless ``--no-offset``), physically consistent
(unless ``--no-consistent``; :func:`~adaptive_dynamics.dynamics.payload.identify_payload`).
Writes ``payload.json`` (mass, centre of mass and inertia about it in the frame, 1-sigma
intervals, libfranka's ``setLoad`` values under ``franka``, and the held-out nMSE per joint
of the arm alone, the arm + offset and the arm + payload; printed last) and
``payload_urdf_inertial.xml`` (the load as a URDF ``<inertial>`` of a link whose frame is
the payload frame).  ``--no-arm-friction``: the URDF's arm without joint friction (torques
measured on the link side of the gears, a Franka's ``tau_J``).  Nothing else is identified
or written.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from ..files import json_default
from .regions import REGION_RADIUS, region_summary, split_nmse

__all__ = ["add_arguments", "run", "run_payload", "main", "main_args", "split_prepared", "prepared_pieces",
           "DESCRIPTION"]

DESCRIPTION = (
    "Identify the rigid-body model (base parameters + viscous/Coulomb friction + a torque offset per joint) from"
    " a recording by weighted least squares, and a physically consistent variant (every link's pseudo-inertia"
    " positive semidefinite, a semidefinite program), on the first --train part of the recorded time; report the"
    " per-joint nMSE of the URDF's model and of both fits on the rest, overall and inside / outside the training"
    " region (held-out joint positions within / beyond --region-radius of every training sample).  Left-out samples (missing joints, NaN,"
    " out-of-order stamps, gaps) are counted by reason.  Writes to --out: estimate_ls.npz and"
    " estimate_consistent.npz (adaptive_controller estimates: friction true, initial_estimate file,"
    " initial_estimate_file PATH), warmstart.npz (inputs and the identified"
    " model's residual: a residual learner's training data; --learner KIND also trains and saves that learner),"
    " identify_torque.png (measured vs predicted torque, held-out part) and identify.json, printed last."
    "  --friction sigmoid|stribeck|all also identifies the rigid body together with a smooth friction model per"
    " joint (the Gaz et al. sigmoid + viscous, or Stribeck with an estimated Stribeck velocity) and reports its"
    " held-out nMSE per joint beside the linear (viscous + Coulomb) model's: friction_models and"
    " friction_heldout_nmse_ratio (smooth / linear) in identify.json."
    "  --payload identifies only the load on the flange instead: the arm's model held fixed (the URDF's with the"
    " robot's configured friction, or --arm-estimate FILE), the 10 inertial parameters of a rigid load fixed to"
    " --payload-frame (default the end-effector frame) and a torque offset per joint, physically consistent; writes"
    " payload.json (mass, centre of mass and inertia about it in that frame with 1-sigma intervals, libfranka's"
    " setLoad values, held-out nMSE of the arm alone and with the payload; printed last) and"
    " payload_urdf_inertial.xml.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="rosbag2 (directory, .mcap or .db3) with joint_states, or a CSV file (time,"
                   " <joint>/position, <joint>/velocity, <joint>/effort)")
    p.add_argument("--robot", default="panda", help="robot name (panda | iiwa14 | planar2) or URDF path")
    p.add_argument("--joints", default=None, metavar="J1,J2,...", help="URDF robot: the recorded joints (the"
                   " others locked at 0)")
    p.add_argument("--ee-frame", default=None, metavar="FRAME", help="URDF robot: the end-effector frame")
    p.add_argument("--out", required=True, help="output directory (created)")
    p.add_argument("--train", type=float, default=0.5, help="fraction of the recorded time that identifies"
                   " (the first part; default 0.5); the rest is held out")
    p.add_argument("--cutoff-hz", type=float, default=20.0, help="zero-phase low-pass of q, qd, tau [Hz]")
    p.add_argument("--decimate", type=int, default=0, help="keep every k-th filtered sample (0: to ~200 Hz)")
    p.add_argument("--no-offset", action="store_true", help="no constant torque offset per joint")
    p.add_argument("--min-velocity", type=float, default=0.0, metavar="V",
                   help="leave out each joint's samples slower than V [rad/s] (its friction near rest follows no"
                   " friction law: 0.05 on an excitation that keeps the joints moving, e.g. excite's; default 0:"
                   " every sample)")
    p.add_argument("--no-consistent", action="store_true", help="skip the physically consistent variant")
    p.add_argument("--law", default="direct", choices=["direct", "composite"],
                   help="adaptive law the estimate files are written for (default direct)")
    p.add_argument("--learner", default=None, metavar="KIND",
                   help="also train this residual learner on the identified model's residual (gmm | rbfn | gp"
                   " | pgpol | sgpol) and save it as learner_KIND.npz; its prior is the identified offsets, so"
                   " where its data does not reach it predicts the identification")
    p.add_argument("--friction", default="linear", choices=["linear", "sigmoid", "stribeck", "all"],
                   help="joint friction model to compare with the linear one: linear (viscous f_v v + Coulomb"
                   " f_c sgn(v), the default, nothing more is fitted) | sigmoid (f_v v + the Gaz et al. sigmoid"
                   " phi1/(1+exp(-phi2 (v+phi3))) - phi1/(1+exp(-phi2 phi3))) | stribeck (f_v v + f_c tanh(v/eps)"
                   " + f_s exp(-(v/v_s)^2) tanh(v/eps), eps 0.01 rad/s) | all (both smooth models); each smooth"
                   " model is identified jointly with the rigid body and its held-out nMSE per joint is reported"
                   " beside the linear model's (friction_models, friction_heldout_nmse_ratio in identify.json)")
    p.add_argument("--region-radius", type=float, default=REGION_RADIUS, metavar="RAD",
                   help="held-out samples whose joint positions are farther than this from every training"
                   f" sample [rad, Euclidean] are outside the training region (default {REGION_RADIUS}); the"
                   " nMSE is reported inside and outside it")
    p.add_argument("--payload", action="store_true",
                   help="identify only the load on the flange, the arm's model held fixed (the URDF's with the"
                   " robot's configured joint friction, or --arm-estimate): mass, centre of mass and inertia about it"
                   " in --payload-frame, a torque offset per joint (unless --no-offset), physically consistent (unless"
                   " --no-consistent); writes payload.json (printed last) and payload_urdf_inertial.xml")
    p.add_argument("--arm-estimate", default=None, metavar="PATH",
                   help="with --payload: the arm's model from an earlier identify estimate (estimate_consistent.npz or"
                   " estimate_ls.npz, an adaptive_controller state file: its parameters and friction columns) instead"
                   " of the URDF's")
    p.add_argument("--payload-frame", default=None, metavar="FRAME",
                   help="with --payload: the frame the load is fixed to and its result is expressed in (default the"
                   " end-effector frame; libfranka's setLoad wants the flange, panda_link8 on a Panda)")
    p.add_argument("--no-arm-friction", action="store_true",
                   help="with --payload and the URDF's arm: no joint friction in the arm's model (torques measured"
                   " on the link side of the gears, e.g. a Franka's tau_J) instead of the robot's configured friction")


def prepared_pieces(pieces, cutoff_hz: float, decimate: int = 0):
    """Clean pieces (:func:`segments`) filtered and differentiated into one ``(q, qd,
    qdd, tau)`` (``decimate`` 0: to ~200 Hz); None when no piece is long enough."""
    from ..dynamics.identification import prepare  # lazy: the CLI parser imports this module
    out = []
    for t, q, qd, tau in pieces:
        h = float(np.median(np.diff(t)))
        k = decimate or max(1, int(round(1.0 / (200.0 * h))))
        cut = min(cutoff_hz, 0.45 / h)
        if t.size < 30:
            continue
        out.append(prepare(t, q, qd, tau, cutoff_hz=cut, decimate=k, trim=min(0.1, 0.1 * (t[-1] - t[0]))))
    if not out:
        return None
    return tuple(np.concatenate([o[i] for o in out]) for i in range(4))


def split_prepared(t, q, qd, tau, train: float, cutoff_hz: float = 20.0, decimate: int = 0, where: str = ""):
    """``(train, test, counts)``: the recording split at ``train`` of its time span, each
    part cut into segments, filtered and differentiated into ``(q, qd, qdd, tau)``
    (``decimate`` 0: to ~200 Hz); ``counts`` per part as :func:`segments` gives them.
    ValueError when a part has no usable segment."""
    from ..dynamics.identification import segments  # lazy: the CLI parser imports this module
    t_split = t.min() + train * (t.max() - t.min())
    parts, counts = {}, {}
    for name, sel in (("train", t < t_split), ("test", t >= t_split)):
        pieces, counts[name] = segments(t[sel], q[sel], qd[sel], tau[sel])
        parts[name] = prepared_pieces(pieces, cutoff_hz, decimate)
        if parts[name] is None:
            raise ValueError(f"{where}: no usable {name} segment (counts {counts})")
    return parts["train"], parts["test"], counts


def run(args) -> dict:
    from ..control.adaptive import AdaptiveController, estimate_file  # lazy: the CLI parser imports this module
    from ..dynamics import RobotModel  # lazy: the CLI parser imports this module
    from ..dynamics.identification import identify, identify_consistent, nmse  # lazy: the CLI parser imports this module
    from ..dynamics.joint_friction import identify_friction  # lazy: the CLI parser imports this module
    from ..learning import make_learner  # lazy: the CLI parser imports this module
    from ..robot_setup import resolve_robot  # lazy: the CLI parser imports this module
    from .recordings import load_recording  # lazy: the CLI parser imports this module (rosbags)

    t0 = time.perf_counter()
    if not 0.05 <= args.train <= 0.95:
        raise ValueError(f"--train must be in [0.05, 0.95], got {args.train}")
    if getattr(args, "payload", False):
        return run_payload(args, t0)
    for opt in ("arm_estimate", "payload_frame", "no_arm_friction"):
        if getattr(args, opt, None):
            raise ValueError(f"--{opt.replace('_', '-')} goes with --payload")
    friction = getattr(args, "friction", "linear") or "linear"
    if friction not in ("linear", "sigmoid", "stribeck", "all"):
        raise ValueError(f"--friction must be linear, sigmoid, stribeck or all, got {friction!r}")
    joints = [j for j in (getattr(args, "joints", None) or "").split(",") if j] or None
    spec = resolve_robot(args.robot, joints, getattr(args, "ee_frame", None))
    model = RobotModel(spec.urdf, ee_frame=spec.ee_frame or None, friction=True)
    rec = load_recording(args.source, model.joint_names)
    os.makedirs(args.out, exist_ok=True)
    (q, qd, qdd, tau), (qt, qdt, qddt, taut), counts = split_prepared(
        rec.t, rec.q, rec.qd, rec.tau, args.train, args.cutoff_hz, args.decimate, where=repr(args.source))
    counts = {"recording": rec.counts, **counts}
    radius = getattr(args, "region_radius", REGION_RADIUS)
    region = region_summary(q, qt, radius)
    inside = region.pop("inside")
    offset = not args.no_offset
    results, files = {}, {}
    nominal = model.regressor_batch(qt, qdt, qddt) @ model.parameters
    results["nominal"] = {"test_nmse": nmse(taut, nominal)}
    vmin = float(getattr(args, "min_velocity", 0.0) or 0.0)
    if not (vmin >= 0):
        raise ValueError(f"--min-velocity must be >= 0 [rad/s], got {vmin}")
    fits = {"ls": identify(model, q, qd, qdd, tau, offset=offset, min_velocity=vmin)}
    if not args.no_consistent:
        w = 1.0 / np.maximum(fits["ls"].residual_rmse, 1e-9)
        fits["consistent"] = identify_consistent(model, q, qd, qdd, tau, weights=w, offset=offset, min_velocity=vmin)
    pred, train_pred = {"nominal": nominal}, {}
    for key, ident in fits.items():
        pred[key] = ident.torque(model, qt, qdt, qddt)
        train_pred[key] = ident.torque(model, q, qd, qdd)
        results[key] = {"test_nmse": nmse(taut, pred[key]), "train_nmse": nmse(tau, train_pred[key]),
                        **ident.to_dict()}
        path = os.path.join(args.out, f"estimate_{key}.npz")
        estimate_file(model, ident, path, law=args.law)
        files[f"estimate_{key}"] = path
    # the residual of the model the controller runs: its estimate has no offset column, so
    # the learner takes the offset up with the rest
    offsets = fits["ls"].offset if fits["ls"].offset.size else 0.0
    resid = tau - (train_pred["ls"] - offsets)
    X = np.hstack([q, qd, qdd])
    path = os.path.join(args.out, "warmstart.npz")
    np.savez(path, X=X, Y=resid, joint_names=np.array(model.joint_names), target=np.array("tau - Y theta_ls"))
    files["warmstart"] = path
    if args.learner:
        L = make_learner(args.learner, input_dim=3 * model.n, output_dim=model.n,
                         prior=offsets if np.size(offsets) == model.n else "zero",
                         **_learner_defaults(args.learner, X))
        for i in range(0, len(X), 200):
            L.partial_fit(X[i:i + 200], resid[i:i + 200])
        path = os.path.join(args.out, f"learner_{args.learner}.npz")
        L.save(path)
        files[f"learner_{args.learner}"] = path
        base_t = pred["ls"] - offsets
        pred["ls+" + args.learner] = base_t + L.predict(np.hstack([qt, qdt, qddt]))
        results["ls+" + args.learner] = {"test_nmse": nmse(taut, pred["ls+" + args.learner]),
                                         "pulled_back_fraction": round(L.pulled_back_fraction, 4)}
    extra = {}
    if friction != "linear":
        kinds = ["sigmoid", "stribeck"] if friction == "all" else [friction]
        base = model.base_parameters()
        lin = identify_friction(model, q, qd, qdd, tau, "linear", offset=offset, linear=fits["ls"], base=base)
        models = {"linear": {"heldout_nmse": results["ls"]["test_nmse"], "train_nmse": results["ls"]["train_nmse"],
                             "parameters": lin.friction.parameters(), "model": lin.friction.to_dict()}}
        ratio = {}
        # the smooth models start from a linear fit of every sample: fits["ls"] itself unless
        # --min-velocity left samples out of it; one start for every kind
        start = fits["ls"] if vmin == 0 else identify(model, q, qd, qdd, tau, offset=offset)
        for kind in kinds:
            fit = identify_friction(model, q, qd, qdd, tau, kind, offset=offset, linear=start, base=base)
            pred[kind] = fit.torque(model, qt, qdt, qddt)
            held = nmse(taut, pred[kind])
            models[kind] = {"heldout_nmse": held, "train_nmse": nmse(tau, fit.torque(model, q, qd, qdd)),
                            "parameters": fit.friction.parameters(), "model": fit.friction.to_dict(),
                            "iterations": fit.iterations,
                            "residual_rmse": [round(float(x), 6) for x in fit.residual_rmse]}
            ratio[kind] = [round(float(a / max(b, 1e-300)), 4) for a, b in zip(held, results["ls"]["test_nmse"])]
            # for the adaptive controller: the fixed friction model and the rigid body identified with it
            path = os.path.join(args.out, f"friction_{kind}.json")
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(fit.friction.to_dict(), fh, indent=1)
            files[f"friction_{kind}"] = path
            files[f"estimate_{kind}"] = AdaptiveController(model, args.law, pi0=fit.pi).save(
                os.path.join(args.out, f"estimate_{kind}.npz"))
        for m in models.values():
            for k in ("heldout_nmse", "train_nmse"):
                m[k] = [round(float(x), 5) for x in m[k]]
        extra = {"friction_models": models, "friction_heldout_nmse_ratio": ratio}
    for key, r in results.items():
        parts = split_nmse(taut, pred[key], inside)
        r["test_nmse_inside"], r["test_nmse_outside"] = parts["inside"], parts["outside"]
    files["plot"] = _plot(os.path.join(args.out, "identify_torque.png"), taut, pred, model.joint_names)
    for r in results.values():
        for k in ("test_nmse", "train_nmse", "test_nmse_inside", "test_nmse_outside"):
            if r.get(k) is not None:
                r[k] = [round(float(x), 5) for x in r[k]]
    out = {"command": "identify", "source": str(args.source), "robot": str(args.robot), "joints": model.joint_names,
           "train_fraction": args.train, "samples": {"train": int(len(q)), "test": int(len(qt))},
           "region": region,
           "counts": counts, "offset": offset, "results": results, "files": files,
           **extra, "runtime_s": round(time.perf_counter() - t0, 2)}
    with open(os.path.join(args.out, "identify.json"), "w") as fh:
        json.dump(out, fh, indent=1, default=json_default)
    return out


def _arm_model(args, spec):
    """``(model, arm_pi, friction, description)`` of the fixed arm for ``--payload``."""
    from ..control.adaptive import AdaptiveController  # lazy: the CLI parser imports this module
    from ..dynamics import RobotModel  # lazy: the CLI parser imports this module
    from ..robots import friction as config_friction  # lazy: the CLI parser imports this module

    path = getattr(args, "arm_estimate", None)
    if path:
        if getattr(args, "no_arm_friction", False):
            raise ValueError("--no-arm-friction is for the URDF's arm; --arm-estimate brings its own friction columns")
        if not os.path.isfile(path):
            raise FileNotFoundError(f"--arm-estimate {path!r}: no such file")
        with np.load(path) as d:
            if "friction" not in d:
                raise ValueError(f"--arm-estimate {path!r}: not an adaptive-controller state file (no 'friction')")
            with_friction = bool(d["friction"])
            eps = float(d["coulomb_smoothing"]) if "coulomb_smoothing" in d else 0.0   # (older files: sgn)
        model = RobotModel(spec.urdf, ee_frame=spec.ee_frame or None, friction=with_friction,
                           coulomb_smoothing=eps if with_friction else 0.0)
        pi = AdaptiveController.load(path, model).pi
        return model, pi, None, f"estimate {path}" + (" (with its friction columns)" if with_friction else "")
    model = RobotModel(spec.urdf, ee_frame=spec.ee_frame or None)
    if getattr(args, "no_arm_friction", False):
        return model, None, None, "the URDF's parameters, no joint friction (--no-arm-friction)"
    if not spec.shipped:
        return model, None, None, "the URDF's parameters, no joint friction (a URDF robot: none configured)"
    fv, fc = config_friction(spec.label)
    idx = model.joint_index(spec.joint_names)           # the parameter file's joint order -> the model's
    return (model, None, (fv[idx], fc[idx]),
            f"the URDF's parameters + the friction of config/{spec.label}.yaml (viscous + Coulomb)")


def _with_payload_file(model, arm_pi, est, path: str, comment: str) -> str:
    """The arm (its parameters: the URDF's or ``arm_pi``'s inertial part) with the load
    added to the link that carries it, as a Thunder parameter file: what the
    ``adaptive_controller`` starts from with ``initial_estimate: file`` (any
    ``adapted_links``: e.g. the last link alone, its estimate starting at arm + load)."""
    from ..dynamics import RobotModel  # lazy: the CLI parser imports this module
    from ..dynamics.thunder_params import save_thunder_parameters  # lazy: as above

    loaded = RobotModel(model.urdf_path, ee_frame=model.ee_frame)
    if arm_pi is not None:
        loaded.set_parameters(np.asarray(arm_pi)[:loaded.n_inertial], check=False)
    loaded.set_payload(est.pi_frame, est.frame, check=False)
    return save_thunder_parameters(loaded, path, comment)


def run_payload(args, t0: float) -> dict:
    """``identify --payload``: the load on the flange with the arm's model fixed."""
    from ..dynamics.identification import nmse  # lazy: the CLI parser imports this module
    from ..dynamics.payload import arm_torque, identify_payload  # lazy: the CLI parser imports this module
    from ..robot_setup import resolve_robot  # lazy: the CLI parser imports this module
    from .recordings import load_recording  # lazy: the CLI parser imports this module (rosbags)

    if getattr(args, "learner", None) or (getattr(args, "friction", "linear") or "linear") != "linear":
        raise ValueError("--payload identifies only the payload (the arm fixed): --learner and --friction do not apply")
    joints = [j for j in (getattr(args, "joints", None) or "").split(",") if j] or None
    spec = resolve_robot(args.robot, joints, getattr(args, "ee_frame", None))
    model, arm_pi, fric, arm_what = _arm_model(args, spec)
    rec = load_recording(args.source, model.joint_names)
    (q, qd, qdd, tau), (qt, qdt, qddt, taut), counts = split_prepared(
        rec.t, rec.q, rec.qd, rec.tau, args.train, args.cutoff_hz, args.decimate, where=repr(args.source))
    os.makedirs(args.out, exist_ok=True)
    offset = not args.no_offset
    est = identify_payload(model, q, qd, qdd, tau, arm_pi=arm_pi, frame=getattr(args, "payload_frame", None),
                           friction=fric, offset=offset, consistent=not args.no_consistent)
    arm_t = arm_torque(model, qt, qdt, qddt, arm_pi, fric)
    # the offset alone (the mean training residual of the arm): how much the payload adds beyond a bias
    bias = np.mean(tau - arm_torque(model, q, qd, qdd, arm_pi, fric), axis=0) if offset else 0.0
    held = {"arm": nmse(taut, arm_t), "arm+offset": nmse(taut, arm_t + bias),
            "arm+payload": nmse(taut, arm_t + est.torque(model, qt, qdt, qddt))}
    files = {"payload_urdf_inertial": os.path.join(args.out, "payload_urdf_inertial.xml")}
    with open(files["payload_urdf_inertial"], "w", encoding="utf-8") as fh:
        src = str(args.source).replace("--", "- -")          # (no "--" inside an XML comment)
        fh.write(f"<!-- the load on {est.frame!r} of {spec.label}, identified (adaptive-dynamics identify, payload)"
                 f" from {src}: the inertial of the URDF link whose frame is {est.frame!r} -->\n")
        fh.write(est.urdf_inertial())
    files["with_payload"] = _with_payload_file(model, arm_pi, est, os.path.join(args.out, "with_payload_inertial_REG.yaml"),
                                               f"{spec.label} ({arm_what}) with the load identified on {est.frame!r}"
                                               f" from {args.source}")
    out = {"command": "identify --payload", "source": str(args.source), "robot": str(args.robot),
           "joints": model.joint_names, "arm": arm_what, "train_fraction": args.train,
           "samples": {"train": int(len(q)), "test": int(len(qt))}, "counts": {"recording": rec.counts, **counts},
           "offset": offset, "payload": est.to_dict(),
           "heldout_nmse": {k: [round(float(x), 5) for x in v] for k, v in held.items()},
           "files": {**files, "payload": os.path.join(args.out, "payload.json")},
           "runtime_s": round(time.perf_counter() - t0, 2)}
    with open(out["files"]["payload"], "w") as fh:
        json.dump(out, fh, indent=1, default=json_default)
    return out


def _learner_defaults(kind: str, X: np.ndarray) -> dict:
    if kind == "rbfn":          # the box of the training inputs with a margin
        lo, hi = X.min(0), X.max(0)
        span = np.maximum(hi - lo, 1e-6)
        return {"low": lo - 0.2 * span, "high": hi + 0.2 * span}
    return {}


def _plot(path: str, tau: np.ndarray, pred: dict, joints: list) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n = tau.shape[1]
    cols = 2 if n > 3 else 1
    rows = int(np.ceil(n / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(6 * cols, 1.9 * rows), sharex=True, squeeze=False)
    k = np.arange(len(tau))
    for j in range(n):
        ax = axes[j // cols, j % cols]
        ax.plot(k, tau[:, j], color="k", lw=1.2, label="measured")
        for key, color in (("nominal", "#999999"), ("ls", "#4c72b0"), ("consistent", "#c44e52"),
                           ("sigmoid", "#55a868"), ("stribeck", "#dd8452")):
            if key in pred:
                ax.plot(k, pred[key][:, j], color=color, lw=0.8, label=key)
        ax.set_ylabel(f"{joints[j]}\n[N m]", fontsize=7)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    axes[0, 0].legend(fontsize=7, ncol=4, loc="upper right")
    fig.suptitle("held-out part: measured vs predicted joint torque", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="adaptive-dynamics identify", description=DESCRIPTION)
    add_arguments(ap)
    return main_args(ap.parse_args(argv))


def main_args(args) -> int:
    """Run with parsed arguments; the JSON is the last line printed; 2 on bad input."""
    try:
        out = run(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"identify: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, ImportError) as exc:       # the SDP solver (cvxpy / Clarabel) failed or is missing
        print(f"identify: the consistent identification failed ({exc}); --no-consistent skips it", file=sys.stderr)
        return 2
    print(json.dumps(out, default=json_default))
    return 0

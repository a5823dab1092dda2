"""``adaptive-dynamics experiment contact --quick``: the Panda in MuJoCo with an unmodelled
tool and the proxy's joint friction, 20 s of adaptation and residual learning, then the
observers on the URDF, the adapted estimate and the adapted + learned model (in process,
no DDS).

The quick run is too short for the full run's figures; what it must show: the JSON's
structure (last line = the file), thresholds finite and positive with no false alarm on
the held-out free motion, the pushes the adapted model sees (every push of 20 N and
more, at the end effector and at the elbow), the learned model's thresholds and RMSE
below the URDF's on every joint and never above the adapted model's (the residual kept per
joint where it lowers the calibrated threshold, as the node's calibration does), and the
plots.  Plus the debounced calibration of
``ThresholdCalibration`` the experiment relies on.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from adaptive_dynamics.control.contact import ContactDetector, ThresholdCalibration
from adaptive_dynamics.experiments import contact

pytestmark = pytest.mark.slow


def test_contact_quick(tmp_path, capsys):
    out = tmp_path / "contact"
    assert contact.main(["--out", str(out), "--quick"]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res == json.loads((out / "contact.json").read_text())
    assert res["experiment"] == "contact" and res["quick"] and res["robots"] == ["panda"]
    # the joint-local learner on the state-form target, taken at the measured state, no armature on
    # the estimate (--learner, --parametric-torque, --residual-input pick others)
    assert res["config"]["learner"] == "joint_local"
    assert res["config"]["parametric_torque"] == res["config"]["residual_input"] == "state"
    assert res["config"]["estimate_armature"] == 0.0
    # the graph's Coulomb shape (config/panda.yaml's friction_smoothing) and the detector on r, z and d
    assert res["config"]["friction_smoothing"] == {"panda": 0.03} and res["config"]["detector"] == "change"
    with pytest.raises(SystemExit):
        contact.main(["--out", str(out), "--quick", "--learner", "no_such_learner"])
    with pytest.raises(SystemExit):
        contact.main(["--out", str(out), "--quick", "--friction-smoothing", "-0.1"])
    for key in ("threshold_vs_urdf_max", "detection_delay_ms_max", "external_torque_rmse_vs_urdf",
                "learned_never_worse", "targets", "targets_met", "smallest_push_detected_n",
                "wrench_direction_error_deg", "heldout_false_alarm_samples"):
        assert key in res, key
    assert set(res["targets_met"]) == {"threshold_vs_urdf_max", "detection_delay_ms_max",
                                       "external_torque_rmse_vs_urdf", "learned_never_worse"}
    r = res["per_robot"]["panda"]
    n = len(r["joints"])
    assert set(r["models"]) == {"urdf", "adapted", "learned"}
    for name, m in r["models"].items():
        thr = np.array(m["thresholds"])
        assert thr.shape == (n,) and np.all(np.isfinite(thr)) and np.all(thr > 0), (name, thr)
        assert m["heldout_false_alarm_samples"] == 0, name       # calibrated on one period, held out on the next
        assert len(m["pushes"]) == len(r["pushes"]) == 8
    # the pushes the adapted model sees: every one of 20 N and more, at both places, within 0.1 s
    for p in r["models"]["adapted"]["pushes"]:
        if p["magnitude"] >= 20.0:
            assert p["detected"] and p["delay_ms"] < 100.0, p
    assert r["models"]["adapted"]["smallest_push_detected_n"] <= 20.0
    # the learned model against the URDF: every joint's threshold, the RMSE
    assert max(r["ratios"]["threshold_vs_urdf"]["learned"]) < 1.0
    assert r["ratios"]["rmse_vs_urdf"]["learned"] < 1.0
    assert max(r["ratios"]["rmse_per_joint_vs_urdf"]["learned"]) < 1.0
    assert res["threshold_vs_urdf_max"] < 1.0 and res["external_torque_rmse_vs_urdf"] < 1.0
    # the residual kept per joint where it lowers the calibrated threshold (the node's
    # residual_select): never above the adapted model's, and the residual on every joint beside it
    assert set(r["residual_joints"]) <= set(r["joints"]) and res["residual_joints"]["panda"] == r["residual_joints"]
    assert max(r["ratios"]["learned_vs_adapted"]["thresholds"]) <= 1.0 + 1e-9
    every = r["ratios"]["learned_every_joint"]
    keep = np.isin(r["joints"], r["residual_joints"])
    np.testing.assert_allclose(np.where(keep, every["threshold_vs_urdf"], r["ratios"]["threshold_vs_urdf"]["adapted"]),
                               r["ratios"]["threshold_vs_urdf"]["learned"], rtol=2e-3)
    assert res["every_joint"]["learned_vs_adapted_max"] >= res["learned_vs_adapted_max"] - 1e-9
    # the learner's std in the thresholds: k_u = 0 is the table's learned model; each row calibrated
    # under its term (no false alarm on the calibration segment's own model: held-out counted)
    unc = r["uncertainty"]
    assert [u["uncertainty_gain"] for u in unc] == list(contact.UNCERTAINTY_GAINS)
    np.testing.assert_allclose(unc[0]["threshold_vs_urdf"], r["ratios"]["threshold_vs_urdf"]["learned"], rtol=2e-3)
    assert unc[0]["residual_joints"] == r["residual_joints"]
    assert all(max(u["threshold_vs_urdf"]) < 1.0 for u in unc)
    assert [u["uncertainty_gain"] for u in res["uncertainty"]] == list(contact.UNCERTAINTY_GAINS)
    # d beside r and z only adds alarms (r's and z's thresholds are the same): no push later than
    # with r and z alone
    other = r["other_detector"]
    assert other["detector"] == "whitened" and res["other_detector"]["detector"] == "whitened"
    mine, alone = r["models"]["learned"]["detection_delay_ms_10n"], other["learned"]["detection_delay_ms_10n"]
    assert all(b is None or (a is not None and a <= b) for a, b in zip(mine, alone)), (mine, alone)
    if other["true"]["detection_delay_ms_10n_max"] is not None:
        assert r["true_model"]["detection_delay_ms_10n_max"] <= other["true"]["detection_delay_ms_10n_max"]
    # off the motion learnt (another draw of the excitation, the models frozen): the learner's
    # support falls away and the learned model is no worse than the adapted one there
    om = r["other_motion"]
    assert om["seconds"] == contact.QUICK["other_motion_s"] and om["seed"] == contact.OTHER_SEED_OFFSET
    assert set(om["level"]) == {"adapted", "learned", "true"} and len(om["learned_vs_adapted_level"]) == n
    np.testing.assert_allclose(om["learned_vs_adapted_level"],
                               np.array(om["level"]["learned"]) / np.array(om["level"]["adapted"]), rtol=1e-3)
    assert min(om["support_below_half"]) > 0.5, om        # mostly outside what the learner has seen
    assert res["learned_vs_adapted_other_motion_max"] == pytest.approx(max(om["learned_vs_adapted_level"]))
    assert res["learned_vs_adapted_other_motion_max"] <= contact.TARGETS["learned_vs_adapted_max"], om
    # one seed (--quick): its figures are the run's
    assert res["seeds"] == [0] and len(res["per_seed"]) == 1
    assert res["over_seeds"]["threshold_vs_urdf_max"]["median"] == pytest.approx(res["threshold_vs_urdf_max"], abs=1e-4)
    # the URDF misses the tool: its estimate's wrench points elsewhere than the adapted model's
    we = res["wrench_direction_error_deg"]
    assert we["adapted"]["panda"]["ee"] < we["urdf"]["panda"]["ee"]
    for name in res["plots"]:
        assert (out / name).stat().st_size > 10_000, name
    assert set(res["plots"]) == {"contact_timeline_panda.png", "contact_thresholds.png"}


def test_debounced_calibration_is_what_the_debounced_detector_flags():
    rng = np.random.default_rng(4)
    n, m = 3, 5
    R = rng.normal(0.0, 1.0, (20_000, n)) + np.array([0.0, 2.0, -1.0])
    plain, deb = ThresholdCalibration(n), ThresholdCalibration(n, min_samples=m)
    for k, r in enumerate(R):
        plain.add(k * 1e-3, r)
        deb.add(k * 1e-3, r)
    A = np.abs(R)
    level = np.min(np.stack([A[j:len(A) - m + 1 + j] for j in range(m)]), axis=0).max(axis=0)
    np.testing.assert_allclose(deb.max_abs, level)
    np.testing.assert_allclose(plain.max_abs, A.max(axis=0))
    assert np.all(deb.max_abs < 0.75 * plain.max_abs)            # white noise: much lower
    np.testing.assert_allclose(deb.mean, plain.mean)              # the other statistics are the same
    np.testing.assert_allclose(deb.std, plain.std)
    # margin 1: the detector with that debounce never fires on the segment; a hair lower, it does
    for scale, fires in ((1.0 + 1e-9, False), (1.0 - 1e-6, True)):
        det = ContactDetector(deb.thresholds("max", margin=scale), min_samples=m)
        assert any(det.update(r)[0] for r in R) is fires
    with pytest.raises(ValueError, match="min_samples"):
        ThresholdCalibration(n, min_samples=0)
    assert math.isnan(ThresholdCalibration(n, min_samples=m).t_first)


def test_over_seeds_medians_and_missed_pushes():
    """Medians, spreads and the targets met on every seed; a missed push (delay None)
    counts as longer than any."""
    keys = contact.SEED_KEYS
    base = {k: 1.0 for k in keys}
    per_seed = []
    for seed, (thr, delay, met) in enumerate([(0.3, 15.0, True), (0.5, None, False), (0.4, 30.0, True)]):
        per_seed.append({**base, "seed": seed, "threshold_vs_urdf_max": thr, "detection_delay_ms_max": delay,
                         "every_joint_threshold_vs_urdf_max": thr + 0.1,
                         "targets_met": {"threshold_vs_urdf_max": met, "learned_never_worse": True}})
    o = contact.over_seeds(per_seed)
    assert o["threshold_vs_urdf_max"] == {"median": 0.4, "min": 0.3, "max": 0.5, "values": [0.3, 0.5, 0.4]}
    assert o["detection_delay_ms_max"]["median"] == 30.0 and o["detection_delay_ms_max"]["max"] is None
    assert o["every_joint_threshold_vs_urdf_max"]["median"] == pytest.approx(0.5)
    assert o["targets_met_every_seed"] == {"threshold_vs_urdf_max": False, "learned_never_worse": True}
    per_seed[2]["detection_delay_ms_max"] = None      # two of three missed: no median
    assert contact.over_seeds(per_seed)["detection_delay_ms_max"]["median"] is None


def test_observers_take_the_residual_input_and_no_armature_on_the_estimate():
    """``observers``: the learned model's observer takes the learner's prediction at the
    measured state (``residual_input: state``, the run's setting; each state's own, which
    the node waits for) or at the reference; the
    estimate's observers add no armature, the URDF's the robot's (the iiwa states one)."""
    from adaptive_dynamics.control.momentum_observer import MomentumObserver, observer_model
    from adaptive_dynamics.dynamics import RobotModel
    from adaptive_dynamics.robots import armature

    m = RobotModel("iiwa14", friction=True)
    rng = np.random.default_rng(0)
    K, n = 200, m.n
    t = np.arange(K) * contact.DT
    q = 0.3 * np.sin(np.outer(t, np.linspace(1, 2, n)))
    v = 0.3 * np.linspace(1, 2, n) * np.cos(np.outer(t, np.linspace(1, 2, n)))
    run = {"robot": "iiwa14", "model": m, "pi": m.parameters * 1.05, "t": t, "q": q, "v": v,
           "tau": rng.standard_normal((K, n)), "f": rng.standard_normal((K, n)),
           "f_state": rng.standard_normal((K, n)), "residual_input": "state"}
    assert np.any(armature("iiwa14") > 0)
    R = contact.observers(run, models=("urdf", "adapted", "learned"))
    est = observer_model(m, run["pi"])
    for name, f in (("adapted", None), ("learned", run["f_state"])):
        want = MomentumObserver(est, contact.GAIN, armature=0.0).run(t, q, v, run["tau"], f)
        np.testing.assert_allclose(R[name], want, rtol=1e-12, atol=1e-12)
    want = MomentumObserver(RobotModel("iiwa14"), contact.GAIN, armature=armature("iiwa14")).run(t, q, v, run["tau"])
    np.testing.assert_allclose(R["urdf"], want, rtol=1e-12, atol=1e-12)
    ref = contact.observers(run, models=("learned",), residual_input="reference")["learned"]
    np.testing.assert_allclose(ref, MomentumObserver(est, contact.GAIN, armature=0.0).run(t, q, v, run["tau"], run["f"]),
                               rtol=1e-12, atol=1e-12)

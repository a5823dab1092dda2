"""`experiment realdata --quick`: two realistic proxies (the Panda: sigmoid + Stribeck
friction, sensor bias and noise, jittered stamps, a heavier end effector; the iiwa 14:
another friction law with a position ripple and a payload that changes between the
runs), identified on the first half of one excitation and judged on its second half and
on another excitation.  Every residual learner with its defaults improves on the
identification inside the training region and is no worse outside it, where the raw
learners are; the JSON has the experiment's figures."""
from __future__ import annotations

import json

import numpy as np
import pytest

from adaptive_dynamics.experiments.realdata import LEARNERS, main


def test_realdata_quick(tmp_path, capsys):
    assert main(["--quick", "--part", "offline", "--out", str(tmp_path)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads((tmp_path / "realdata.json").read_text()) == res
    assert res["robots"] == ["panda", "iiwa14"] and set(res["learners"]) == set(LEARNERS)
    nominal, ls, cons = (np.array(res[k]) for k in ("nominal_nmse", "id_nmse", "id_consistent_nmse"))
    assert np.all(ls < nominal) and np.all(cons < 3 * ls + 1e-4)
    assert res["counts"]["train"]["resampled_segments"] >= 1          # the jittered stamps were regridded
    # the sensor bias is found as the offsets (0.4 / -0.6 / 0.3 / 0.5 N m on joints 1-4)
    np.testing.assert_allclose(res["offsets_identified"][:4], res["reality"]["tau_bias"][:4], atol=0.15)
    for name, p in res["proxies"].items():
        # the same-trajectory test revisits the training states; the other excitation leaves them
        assert p["regions"]["same"]["fraction_outside"] < 0.05, name
        assert p["regions"]["other"]["fraction_outside"] > 0.5, name
        # 15 s of training data: the learners that keep every region they saw improve on the
        # identification inside it (the full run's best learner meets 0.5)
        for kind in ("gmm", "rbfn"):
            assert p["in_region_vs_id"][kind] < 0.9, (name, p["in_region_vs_id"])
    # outside the region no learner makes the identified model worse (target 1.05) ...
    assert res["out_of_region_vs_id_max"] <= res["targets"]["out_of_region_vs_id_max"], \
        res["out_of_region_vs_id_max_per_learner"]
    # ... where the same learners without the fall-back do, by far
    raw = res["out_of_region_vs_id_raw_max_per_learner"]
    assert raw["gmm"] > 2.0 and raw["rbfn"] > 2.0, raw
    # learners of the torque itself asked about far states: their prior (the training mean)
    # or within 1 % of it (target 1.0; the raw learners: several times worse)
    assert res["batch_far_vs_prior_max"] <= 1.01, res["batch_far_vs_prior_max_per_learner"]
    assert max(res["batch_far_vs_prior_raw_max_per_learner"].values()) > 1.5
    assert res["targets_met"]["out_of_region_vs_id_max"]
    assert res["in_region_vs_id_max"] == min(res["in_region_vs_id_max_per_learner"].values())
    # the Panda proxy's Stribeck friction: the smooth sigmoid model halves the linear one's
    # held-out error on the wrist (target 0.5), on both test sets
    assert res["sigmoid_vs_linear_wrist_max"] <= 0.5, res["friction_vs_linear_wrist_max_per_proxy"]
    assert set(res["friction_vs_linear_wrist_max_per_proxy"]["sigmoid"]) == {"panda", "iiwa14"}
    assert res["target_met"] == all(res["targets_met"].values())
    for name in res["robots"]:
        assert (tmp_path / f"realdata_regions_{name}.png").stat().st_size > 10_000


def _stage(out, stage, robots, *extra):
    """``experiment realdata --quick --part closed_loop`` of one stage, its graphs in this process
    (the nodes, parameter files and DDS topics of `launch sim`); the stages share out/work."""
    assert main(["--quick", "--part", "closed_loop", "--robots", robots, *extra, "--closed-loop-stage", stage,
                 "--closed-loop-work", str(out / "work"), "--graph", "inprocess", "--out", str(out / stage)]) == 0
    return json.loads((out / stage / "realdata.json").read_text())


@pytest.fixture(scope="module")
def panda_learnt(tmp_path_factory):
    out = tmp_path_factory.mktemp("closed_loop_panda")
    return out, _stage(out, "learn", "panda", "--closed-loop-reality", "config")


@pytest.fixture(scope="module")
def iiwa_learnt(tmp_path_factory):
    out = tmp_path_factory.mktemp("closed_loop_iiwa")
    return out, _stage(out, "learn", "iiwa14")


@pytest.mark.ros
def test_realdata_closed_loop_quick(panda_learnt):
    """The composite controller + the residual learner (its defaults but a 2 s warm-up and
    learning in lockstep, CLOSED_LOOP_QUICK: the default 10 s outlasts the quick run's 8 s;
    in lockstep what it learns does not depend on the machine's load), A's stage: where it
    learned, the residual pays (the quick run's 8 s: at least a third off on average; per
    joint no joint beyond 1.5x its error without the residual plus 0.5 mrad, a ratio of two
    sub-mrad errors being mostly their noise -- the full run's 30 s hold every joint to the
    target 0.5, docs/learners.md)."""
    _, res = panda_learnt
    assert res["part"] == "closed_loop" and "out_of_region_vs_id_max" not in res
    assert "new_region_vs_no_residual_max" not in res   # (B's stage gives it)
    p = res["closed_loop"]["robots"]["panda"]
    assert p["reality"] == "config" and p["controller"]["friction"] is False and p["stage"] == "learn"
    assert p["learner_settings"]["learn_in_lockstep"] is True and p["runs"]["learn_residual"]["freeze"] == "learning_until"
    learned = np.array(p["learned_vs_no_residual"])
    with_r, without = (np.array(p["learned_rmse"][k]) for k in ("residual", "none"))
    np.testing.assert_allclose(learned, with_r / without, rtol=1e-3)
    assert np.all(with_r <= 1.5 * without + 0.5e-3) and learned.mean() < 0.67, p
    assert res["learned_region_vs_no_residual_max"] == pytest.approx(learned.max())


@pytest.mark.ros
def test_realdata_closed_loop_quick_new_region(panda_learnt):
    """B's stage, from what A's left: on a trajectory far from A the learner falls back to
    zero and the tracking is that of the same controller without it (target 1.05 in the
    full run; the quick run's 4 s evaluation within 1.1)."""
    out, learnt = panda_learnt
    res = _stage(out, "new", "panda", "--closed-loop-reality", "config")
    p = res["closed_loop"]["robots"]["panda"]
    new = np.array(p["new_vs_no_residual"])
    # A's figures, read back from A's recordings: the learn stage's
    np.testing.assert_allclose(p["learned_vs_no_residual"], learnt["closed_loop"]["robots"]["panda"]["learned_vs_no_residual"],
                               rtol=1e-12)
    # B leaves A's region entirely; the learner's output there is (all but) nothing
    assert p["new_region_outside_fraction"] > 0.9, p
    assert p["residual_mean_abs_nm"]["new_residual"] < 0.05 * p["residual_mean_abs_nm"]["learned_residual"], p
    assert res["new_region_vs_no_residual_max"] == pytest.approx(new.max())
    # on B the ratio compares two parametric estimates (one adapted beside the residual):
    # full runs give 0.76-1.07 against the target 1.05 (docs/learners.md), a 4 s quick
    # evaluation spreads more -- the quick version holds it to 1.1, the flag is the JSON's
    assert res["new_region_vs_no_residual_max"] <= 1.1, p
    assert res["targets_met"]["new_region_vs_no_residual_max"] == (
        res["new_region_vs_no_residual_max"] <= res["targets"]["new_region_vs_no_residual_max"])
    assert (out / "new" / "closed_loop_regions_panda.png").stat().st_size > 10_000


@pytest.mark.ros
def test_realdata_closed_loop_quick_on_the_iiwa_proxy(iiwa_learnt):
    """The other arm on its realistic proxy (``--closed-loop-reality proxy``, the default: doubled viscous
    friction, a position ripple, sensor bias and noise, 1 kg payload; the controller with
    friction columns, forgetting toward the URDF's estimate), A's stage: where it learned
    the residual pays.  The learner learns in lockstep: measured 0.63-0.72 (worst joint)
    and 0.32-0.34 (mean) over four runs, joint 5 0.47-0.51 (0.07-1.5 with the learner
    racing the loop for the CPU, which a loaded suite starved)."""
    _, res = iiwa_learnt
    p = res["closed_loop"]["robots"]["iiwa14"]
    assert p["reality"] == "proxy" and p["controller"]["friction"] is True
    learned = np.array(p["learned_vs_no_residual"])
    assert np.all(learned <= 1.0) and learned.mean() < 0.5, p


@pytest.mark.ros
def test_realdata_closed_loop_quick_on_the_iiwa_proxy_new_region(iiwa_learnt):
    """B's stage: every state outside A's region, the learner's output is zero and both
    controllers follow it (no divergence; measured 0.87-1.06, the 4 s evaluation's spread)."""
    out, _ = iiwa_learnt
    res = _stage(out, "new", "iiwa14")
    p = res["closed_loop"]["robots"]["iiwa14"]
    new = np.array(p["new_vs_no_residual"])
    assert p["new_region_outside_fraction"] > 0.9 and p["residual_mean_abs_nm"]["new_residual"] == 0.0, p
    assert np.all(new <= 1.2), p
    # neither controller leaves B (forgetting toward zero made the one without the residual diverge)
    assert max(p["new_rmse"]["none"]) < 0.2 and max(p["new_rmse"]["residual"]) < 0.2, p
    assert (out / "new" / "closed_loop_regions_iiwa14_proxy.png").stat().st_size > 10_000


def test_closed_loop_proxy_reality_is_the_offline_proxy():
    """``--closed-loop-reality proxy`` gives the bridge the realities the offline part
    records with, through parameters the bridge declares; B's centre lies inside the
    trajectory node's limits, on the other side of the middle joint by joint."""
    from adaptive_dynamics.dynamics import RobotModel
    from adaptive_dynamics.experiments.closed_loop_regions import CENTRE_SHIFT, bridge_reality, run_robot, trajectory_b
    from adaptive_dynamics.experiments.proxies import REALITY, SECOND_PROXY
    from adaptive_dynamics.nodes.mujoco_bridge import specs
    from adaptive_dynamics.robots import friction

    declared = {p.name for p in specs()}
    for robot in ("panda", "iiwa14"):
        b = bridge_reality(robot)
        assert set(b) <= declared, set(b) - declared
        fv, fc = friction(robot)
        assert b["payload_enabled"] and b["noise_std_tau"] == [REALITY["noise_std_tau"]]
        if robot == "panda":
            np.testing.assert_allclose(b["friction_stribeck"], REALITY["stribeck_ratio"] * REALITY["coulomb_scale"] * fc)
            assert b["tau_bias"] == REALITY["tau_bias"] and b["payload_mass"] == REALITY["ee_extra_mass"]
        else:
            np.testing.assert_allclose(b["friction_viscous"], SECOND_PROXY["viscous_scale"] * fv)
            assert b["ripple_amplitude"] == [SECOND_PROXY["ripple_amplitude"]]
            assert b["payload_mass"] == SECOND_PROXY["ee_extra_mass"]
        m = RobotModel(robot)
        mid, half = 0.5 * (m.lower + m.upper), 0.5 * (m.upper - m.lower)
        c = np.array(trajectory_b(robot, 0)["q_center"])
        np.testing.assert_allclose(np.abs(c - mid), CENTRE_SHIFT * half)
        assert np.all(np.diff(np.sign(c - mid)) != 0) and np.all((c > m.lower) & (c < m.upper))
    with pytest.raises(ValueError, match="reality"):
        run_robot("panda", reality="mars")

"""`adaptive-dynamics experiment pgpol` (PGPOL, Habich et al. 2019): the metrics and the
change-test replica on their own, and the quick run over DDS -- identification, the
no-feed-forward / rigid-body / learned feed-forward runs with the split in lockstep, the
payload run -- with its JSON and plots."""
from __future__ import annotations

import json

import numpy as np
import pytest

from adaptive_dynamics.experiments import EXPERIMENTS, run
from adaptive_dynamics.experiments import pgpol as P


def test_registered():
    assert EXPERIMENTS["pgpol"][0] == "adaptive_dynamics.experiments.pgpol"


def test_a_total_is_the_trapezoidal_squared_error_area_in_deg2_ms():
    t = np.linspace(0.0, 2.0, 2001)
    e = np.zeros((t.size, 2))
    e[:, 0] = np.deg2rad(1.0)                 # 1 deg on joint 1 for the whole run
    e[:, 1] = np.deg2rad(2.0) * t             # a ramp on joint 2
    A, Aj = P.a_total(t, e, 0.5, 1.5)
    assert Aj[0] == pytest.approx(1000.0)      # 1 deg^2 x 1000 ms
    assert Aj[1] == pytest.approx(4.0 * (1.5 ** 3 - 0.5 ** 3) / 3 * 1000.0, rel=1e-6)
    assert A == pytest.approx(sum(Aj))
    with pytest.raises(ValueError, match="no samples"):
        P.a_total(t, e, 5.0, 6.0)


def test_nmse_curves_and_recovery_time():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(500, 3)) * [1.0, 10.0, 0.1]
    yh = y + rng.normal(size=(500, 3)) * [0.1, 1.0, 0.01]
    cum = P.nmse_cumulative(y, yh)
    expect = np.mean(np.mean((y - yh) ** 2, axis=0) / np.var(y, axis=0))
    assert cum[-1] == pytest.approx(expect, rel=1e-9) and np.isnan(cum[0])
    t = np.arange(500) * 0.01
    cen, val = P.nmse_windowed(t, y, yh, 1.0)
    assert len(cen) == 5 and np.all(val < 0.05)
    # a step up at 2 s, back to the steady level 1.5 s later
    cen = np.arange(0.5, 10.0, 0.5)
    val = np.where((cen > 2.0) & (cen < 3.5), 1.0, 0.01)
    r, level = P.recovery_time(cen, val, 2.0, 10.0)
    assert r == pytest.approx(1.5) and level == pytest.approx(0.01)


def test_detect_changes_is_pgpols_own_test():
    """The replica used for the change-detection study fires exactly where the learner
    clears its database, fed the learner's prequential predictions (raw: the learner's
    own test runs on its GPs' mean, not on the fall-back to the prior)."""
    from adaptive_dynamics.learning import make_learner

    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (900, 3))
    Y = np.stack([np.sin(2 * X[:, 0]), X[:, 1] * X[:, 2]], axis=1) + 0.05 * rng.normal(size=(900, 2))
    Y[600:] += 2.0                                     # a change of the dynamics
    settings = {"change_threshold": 0.05, "change_horizon": 100, "change_warmup": 60, "change_lag": 20}
    L = make_learner("pgpol", input_dim=3, output_dim=2, windows=[30, 120], knn=10, n_inducing=8, max_iter=2,
                     raw=True, **settings)
    Pq = np.zeros_like(Y)
    for i in range(0, 900, 3):
        Pq[i:i + 3] = L.predict(X[i:i + 3])
        L.partial_fit(X[i:i + 3], Y[i:i + 3])
    hits = P.detect_changes((Y - Pq) ** 2, Y, *(settings[k] for k in P.CHANGE_KEYS))
    assert L.n_changes >= 1 and len(hits) == L.n_changes and hits[-1] == L.last_change
    assert any(600 <= h < 650 for h in hits)


def test_snapshot_stats_reads_the_learner_inside_a_learner_model_message():
    from rclpy.serialization import serialize_message
    from std_msgs.msg import MultiArrayDimension, UInt8MultiArray

    from adaptive_dynamics.learning import make_learner
    from adaptive_dynamics.learning.snapshot import encode_snapshot

    rng = np.random.default_rng(1)
    L = make_learner("pgpol", input_dim=6, output_dim=2, windows=[10, 40], knn=5, n_inducing=5, max_iter=1)
    for _ in range(12):
        L.partial_fit(rng.normal(size=(5, 6)), rng.normal(size=(5, 2)))
    data = encode_snapshot(L, 42, source="test")
    msg = UInt8MultiArray()
    msg.layout.dim = [MultiArrayDimension(label="pgpol v42", size=len(data), stride=len(data))]
    msg.data = data
    st = P.snapshot_stats(serialize_message(msg))
    assert st["version"] == 42 and st["kind"] == "pgpol" and st["bytes"] == len(data)
    assert st["samples"] == 60 and st["database"] == L.database_points and st["n_refits"] == L.n_refits
    assert st["n_changes"] == L.n_changes and st["nmse"] == pytest.approx(L.nmse, nan_ok=True)
    assert st["newest_q"] == L._X[-1, :2].tobytes()


def test_pick_place_waypoints_descend_vertically_within_the_limits():
    from adaptive_dynamics.dynamics import RobotModel
    m = RobotModel("panda")
    for which, k in (("test", 6), ("train", 12)):
        W = P.pick_place_waypoints("panda", which)
        assert W.shape == (2 * k, 7)
        assert np.all(W >= m.lower) and np.all(W <= m.upper)
        # A_k (odd index, above the next point) -> D_k (even): straight down by the lift height
        for i in range(1, 2 * k, 2):
            above, down = m.frame_pose(W[i])[:3, 3], m.frame_pose(W[(i + 1) % (2 * k)])[:3, 3]
            np.testing.assert_allclose(above - down, [0.0, 0.0, P.PICK_PLACE["height"]], atol=1e-8)


#: `--quick --part 1` in five invocations sharing --runs-dir (each under a minute: 30-45 s
#: measured beside other tests): the runs each runs anew, in the experiment's order --
#: excitation, I no_ff | I rbd, I rbd_ff | the first constellation | the second | the paper
#: mode's, then Table I from every run read back
TABLE_I_STAGES = (2, 2, 1, 1, 1)


def _table_i_stage(runs_dir, out, budget):
    assert run("pgpol", ["--quick", "--part", "1", "--runs-dir", str(runs_dir), "--max-new-runs", str(budget),
                         "--out", str(out)]) == 0
    return json.loads((out / "pgpol.json").read_text()), out


@pytest.fixture(scope="module")
def table_i_runs(tmp_path_factory):
    return tmp_path_factory.mktemp("pgpol_runs")


@pytest.fixture(scope="module")
def table_i_stages(table_i_runs, tmp_path_factory):
    """``upto(k)``: stage k's (JSON, out dir), the stages before it run first (each continues the last)."""
    done: list = []

    def upto(k):
        while len(done) < k:
            out = tmp_path_factory.mktemp(f"pgpol_stage{len(done) + 1}")
            done.append(_table_i_stage(table_i_runs, out, TABLE_I_STAGES[len(done)]))
        return done[k - 1]
    return upto


@pytest.mark.ros
@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3, 4])
def test_quick_table_i_stages_over_dds(table_i_stages, stage):
    """A stage runs its new runs and ends before the next (JSON ``incomplete``); runs an
    earlier stage ran are read back, not run again; the identification is there from the
    first on (its excitation run read back later)."""
    res, _ = table_i_stages(stage)
    assert res["incomplete"].startswith("I ") and "table_i" not in res, res.get("incomplete")
    assert res["identification"]["relative_residual"][1] < 0.05
    assert len(res["runs"]) == sum(TABLE_I_STAGES[:stage])


@pytest.mark.ros
@pytest.mark.slow
def test_quick_table_i_over_dds(table_i_stages):
    """`--quick --part 1`: the identification and Table I, the split over DDS in lockstep
    (the last stage: the paper mode's run, then every run read back)."""
    res, tmp_path = table_i_stages(len(TABLE_I_STAGES))
    assert "incomplete" not in res and len(res["runs"]) == sum(TABLE_I_STAGES)
    for key in ("table_i", "a_total_reduction_best", "a_total_reduction_rbd", "beats_rbd", "best_constellation",
                "identification", "runs", "plots"):
        assert key in res, key
    assert "payload" not in res
    tab = res["table_i"]
    cons = res["experiment_1"]["constellations"]
    assert set(tab) == {"no_ff", "rbd", "rbd_ff", *cons} and len(cons) == 2
    # the identified rigid-body model explains most of the simulated arm (not its ripple and
    # Stribeck friction); the learned feed-forward (split over DDS, in lockstep) lowers the
    # error area against PD alone
    assert res["reality"] == "unmodelled" and res["reality_parameters"]["ripple_amplitude"][0] > 0
    assert res["identification"]["relative_residual"][1] < 0.05
    assert 0.5 < res["a_total_reduction_rbd"] < 0.99
    assert tab[res["best_constellation"]] == min(tab[c] for c in cons)
    assert res["a_total_reduction_best"] == pytest.approx(1 - tab[res["best_constellation"]] / tab["no_ff"],
                                                          abs=1e-4)
    assert res["a_total_reduction_best"] > 0.3
    assert res["beats_rbd"] == (tab[res["best_constellation"]] < tab["rbd"])
    # the paper's baseline, the identified model as a pure feed-forward, also beats PD alone
    assert res["beats_rbd_ff"] == (tab[res["best_constellation"]] < tab["rbd_ff"])
    assert 0.3 < res["a_total_reduction_rbd_ff"] < 0.99
    # both modes (--mode both, the default): the paper's algorithm (raw fused mean, its change
    # test) on one constellation beside the project's two, each with its own best and reduction
    proj, paper = res["experiment_1"]["project_mode"], res["experiment_1"]["paper_mode"]
    assert proj["constellations"] == cons and proj["best_constellation"] == res["best_constellation"]
    # the project mode learns the residual of the identified rigid-body model (--project-prior rbd)
    assert proj["prior"] == "rbd" and "prior" not in paper
    assert paper["constellations"] == [f"paper {cons[0]}"] and paper["learner"]["raw"] is True
    a_paper = res["experiment_1"]["a_j"][paper["constellations"][0]]
    assert len(a_paper) == 7 and paper["a_total_reduction_best"] > 0.3
    assert res["paper_mode"]["a_total_reduction_best"] == paper["a_total_reduction_best"]
    assert res["runs"][f"I {paper['constellations'][0]}"]["versions_applied"] > 0
    for c in cons:
        r = res["runs"][f"I {c}"]
        assert r["updates_per_sim_s"] > 1 and r["versions_applied"] >= 5 and r["residual_used"] > 1000
        assert r["data_lag_s"]["median"] < 1.0
    assert set(res["plots"]) == {"pgpol_table1_panda.png", "pgpol_tracking_panda.png"}
    for f in res["plots"]:
        data = (tmp_path / f).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@pytest.mark.ros
@pytest.mark.slow
def test_quick_payload_run_over_dds(tmp_path, capsys):
    """`--quick --part payload`: the payload picked up during a learned run."""
    assert run("pgpol", ["--quick", "--part", "payload", "--out", str(tmp_path)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("change_detected", "payload", "runs", "plots"):
        assert key in res, key
    # the payload run: attached when asked, no database clear before it, any clear after it
    pay = res["payload"]
    assert 0 <= pay["payload_clock_s"] - pay["t_payload_s"] < 0.5
    assert pay["clears_before_payload"] == 0
    assert pay["first_clear_after_s"] is None or pay["first_clear_after_s"] > pay["t_payload_s"]
    assert res["change_detected"] == (pay["first_clear_after_s"] is not None)
    assert pay["database_final"] >= 0 and pay["run"]["versions_applied"] >= 5
    assert set(res["plots"]) == {"pgpol_payload_panda_defaults.png"}
    for f in res["plots"]:
        data = (tmp_path / f).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_the_stated_change_defaults_are_the_learners():
    """The experiment's docstring states the change test it runs with: the numbers it
    gives are ``CHANGE_DEFAULTS`` of the learner (a comment that drifts from the code
    misleads whoever reproduces the paper)."""
    import re
    from adaptive_dynamics.experiments import pgpol as exp
    from adaptive_dynamics.learning.pgpol import CHANGE_DEFAULTS
    text = " ".join(exp.__doc__.split())
    m = re.search(r"learner's defaults \(eta ([\d.e-]+), horizon (\d+), lag (\d+), warm-up (\d+)", text)
    assert m, "the module docstring no longer states the defaults"
    stated = dict(zip(("change_threshold", "change_horizon", "change_lag", "change_warmup"),
                      (float(m[1]), int(m[2]), int(m[3]), int(m[4]))))
    assert stated == {k: CHANGE_DEFAULTS[k] for k in stated}
    assert exp.CHANGE == CHANGE_DEFAULTS


def test_offline_gp_size_argument():
    assert P.offline_gp_size("15000,1500") == {"n_points": 15000, "n_inducing": 1500}
    assert P.offline_gp_size("3000,100,0") == {"n_points": 3000, "n_inducing": 100, "max_iter": 0}
    assert P.offline_gp_size("paper") == {"n_points": 15000, "n_inducing": 1500, "max_iter": 100, "groups": "shared"}
    for bad in ("100,200", "1,1", "3000", "3000,100,5,1", "a,b", "3000,100,-1"):
        with pytest.raises(Exception, match="POINTS,INDUCING"):
            P.offline_gp_size(bad)


def test_table_ii_rows_run_each_mode_as_table_i_does():
    """Table II in both modes: the paper's rows as the paper runs them (raw means, one
    sample per update, its change test, scaled-sigma fusion and window scalers, the
    offline GP raw), the project's with the learners' defaults on the identified model's
    residual; the baselines once."""
    from types import SimpleNamespace

    R = SimpleNamespace(gains={"kd": [1.0]})
    R.controller = lambda mode, est="": P.Runner.controller(R, mode, est)
    rows = P.table_ii_rows(R, "/tmp/off.snap", ["project", "paper"], "/tmp/est.npz")
    keys = [r[0] for r in rows]
    assert keys == ["no_ff", "rbd_ff", "sgpol", "pgpol", "paper offline_gp", "paper sgpol", "paper pgpol"]
    by = {r[0]: r for r in rows}
    assert by["no_ff"][1] is None and by["no_ff"][3] is None and by["rbd_ff"][2]["model_input"] == "desired"
    for k in ("sgpol", "pgpol"):
        _, mode, ctl, lrn = by[k]
        assert mode == "project" and lrn["target"] == "residual" and "raw" not in lrn
        assert ctl["estimate_file"] == "/tmp/est.npz" and ctl["feedforward"] is True
        assert {key: lrn["config"][key] for key in P.CHANGE} == P.CHANGE
        _, mode, ctl, lrn = by[f"paper {k}"]
        assert mode == "paper" and "target" not in lrn and "estimate_file" not in ctl
        assert lrn["raw"] is True and lrn["update_samples"] == P.PAPER_LEARNER["update_samples"]
        assert lrn["config"]["fusion"] == "scaled" and lrn["config"]["scale_on"] == "window"
        assert {key: lrn["config"][key] for key in P.PAPER_LEARNER["change"]} == P.PAPER_LEARNER["change"]
    assert by["paper offline_gp"][3] == {"kind": "sgpol", "model_file": "/tmp/off.snap", "raw": True}
    assert by["pgpol"][3]["config"]["windows"] == [60, 480] and by["pgpol"][3]["config"]["knn"] == 20
    # one mode: its keys bare; no estimate: no rigid-body row, the project's learners on the torque
    rows = P.table_ii_rows(R, "/tmp/off.snap", ["paper"])
    assert [r[0] for r in rows] == ["no_ff", "offline_gp", "sgpol", "pgpol"]
    rows = P.table_ii_rows(R, "/tmp/off.snap", ["project"])
    assert [r[0] for r in rows] == ["no_ff", "sgpol", "pgpol"] and "target" not in rows[1][3]

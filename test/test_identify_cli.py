"""``adaptive-dynamics identify``: a simulated excitation run of the MuJoCo Panda (joint
friction, a 1 kg payload the URDF does not have, PD tracking) recorded as a bag and as a
CSV file, damaged as real recordings are (NaN rows, stamps out of order, messages where
a joint is renamed), identified on the first half and evaluated on the second: every
left-out sample counted by reason, the fits far better than the URDF's model on the
held-out part, the consistent fit physically consistent, the estimate files loadable by
the adaptive controller, and the learner's warm start usable."""
from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

from adaptive_dynamics.control.adaptive import AdaptiveController
from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.dynamics.inertial import pseudo_inertias
from adaptive_dynamics.evaluation import identify as ident_cli
from adaptive_dynamics.trajectories import ModifiedFourier

SECONDS = 16.0
NAN_ROWS = [1500, 1501, 9000]
SWAPPED = [(4000, 4001), (12000, 12001)]          # neighbouring stamps exchanged
RENAMED = range(7000, 7010)                        # panda_joint3 renamed in these messages


@pytest.fixture(scope="module")
def recording():
    from adaptive_dynamics.robots import friction
    from adaptive_dynamics.sim.plant import MujocoPlant, RealityConfig

    m = RobotModel("panda")
    fv, fc = friction("panda")
    traj = ModifiedFourier.random(m.n, np.random.default_rng(3), q_center=0.5 * (m.lower + m.upper),
                                  amplitude=0.4, w_f=2 * math.pi * 0.1, L=4, lower=m.lower, upper=m.upper,
                                  vel_limit=m.velocity_limit, acc_limit=np.full(7, 10.0))
    t = np.arange(0.0, SECONDS, 1e-3)
    Q, V, A = traj.sample_many(t)
    plant = MujocoPlant("panda", reality=RealityConfig(friction_viscous=fv, friction_coulomb=fc), q0=Q[0])
    plant.set_payload(1.0, [0.0, 0.0, 0.05])
    pd = AdaptiveController(m, "direct", lam=10.0, kd=np.array([30, 30, 20, 20, 4, 4, 1.0]))
    rows = []
    for k in range(len(t)):
        _, q, v, tm = plant.state()
        rows.append(np.concatenate([q, v, tm]))
        plant.step(pd.compute(q, v, Q[k], V[k], A[k], learn=False))
    R = np.array(rows)
    stamps = np.round(t * 1e9).astype(np.int64)
    for a, b in SWAPPED:
        stamps[a], stamps[b] = stamps[b], stamps[a]
    R[NAN_ROWS, 3] = np.nan
    return m.joint_names, stamps, R


def _bag(path, names, stamps, R):
    from adaptive_dynamics.evaluation.bags import BagWriter
    from adaptive_dynamics.wire import JointStateEncoder

    enc, renamed = JointStateEncoder(names), JointStateEncoder([n.replace("joint3", "jointX") for n in names])
    with BagWriter(path) as w:
        w.add_topic("/joint_states", "sensor_msgs/msg/JointState")
        for k, (s, r) in enumerate(zip(stamps, R)):      # received in order, header stamps as recorded
            e = renamed if k in RENAMED else enc
            w.write("/joint_states", 1_000_000 * k, e.encode(int(s), r[:7], r[7:14], r[14:]))
    return str(path)


def _csv(path, names, stamps, R):
    cols = ["time"] + [f"{j}/{f}" for f in ("position", "velocity", "effort") for j in names]
    with open(path, "w") as fh:
        fh.write(",".join(cols) + "\n")
        for k, (s, r) in enumerate(zip(stamps, R)):
            if k in RENAMED:
                fh.write(f"{s * 1e-9:.9f}\n")          # a cut line: counted, not read
                continue
            fh.write(f"{s * 1e-9:.9f}," + ",".join("nan" if not np.isfinite(x) else repr(float(x)) for x in r) + "\n")
    return str(path)


def _args(source, out, **kw):
    p = argparse.ArgumentParser()
    ident_cli.add_arguments(p)
    argv = [str(source), "--robot", "panda", "--out", str(out)]
    for k, v in kw.items():
        argv += [f"--{k}"] + ([] if v is True else [str(v)])
    return p.parse_args(argv)


def test_identify_a_damaged_bag_and_csv(recording, tmp_path):
    names, stamps, R = recording
    res = ident_cli.run(_args(_bag(tmp_path / "bag", names, stamps, R), tmp_path / "out", learner="rbfn"))
    c = res["counts"]
    assert c["recording"]["messages"] == len(stamps)
    assert c["recording"]["missing_joints"] == len(RENAMED)
    assert c["recording"]["missing_joint_names"] == ["panda_joint3"]
    assert c["recording"]["nonfinite"] == len(NAN_ROWS)
    assert c["train"]["out_of_order"] + c["test"]["out_of_order"] == len(SWAPPED)
    r = res["results"]
    nominal, ls, cons = (np.array(r[k]["test_nmse"]) for k in ("nominal", "ls", "consistent"))
    # the URDF's model lacks friction and the payload; both fits explain the held-out torque
    assert np.all(ls < 0.2 * nominal), (ls, nominal)
    assert np.all(ls[[1, 3]] < 0.01) and np.all(cons[[1, 3]] < 0.01), (ls, cons)
    assert np.all(cons < 0.2 * nominal), (cons, nominal)
    model = RobotModel("panda", friction=True)
    for key in ("ls", "consistent"):        # the adaptive controller loads both as its estimate
        ctl = AdaptiveController(RobotModel("panda", friction=True), "direct")
        ctl.load_state(res["files"][f"estimate_{key}"])
        assert ctl.theta.shape == (model.base_parameters().n_base,) and np.isfinite(ctl.theta).all()
    eig = np.array(r["consistent"]["min_pseudo_inertia_eig"])   # every link a physical body
    assert eig.min() >= -1e-7 * np.abs(model.link_parameters).max()
    assert r["consistent"]["method"] == "consistent" and len(r["ls"]["offset"]) == 7
    ws = np.load(res["files"]["warmstart"])
    assert ws["X"].shape[1] == 21 and ws["Y"].shape == (ws["X"].shape[0], 7)
    from adaptive_dynamics.learning import load_learner
    L = load_learner(res["files"]["learner_rbfn"])            # a residual_learner model_file
    assert L.predict(ws["X"][:5]).shape == (5, 7) and len(r["ls+rbfn"]["test_nmse"]) == 7
    # the CSV of the same recording gives the same samples and fits
    res_csv = ident_cli.run(_args(_csv(tmp_path / "rec.csv", names, stamps, R), tmp_path / "out_csv",
                                  **{"no-consistent": True}))
    assert res_csv["counts"]["recording"]["missing_joints"] == len(RENAMED)
    assert res_csv["samples"] == res["samples"]
    np.testing.assert_allclose(res_csv["results"]["ls"]["test_nmse"], r["ls"]["test_nmse"], rtol=1e-4, atol=1e-7)


def test_identify_reports_inside_and_outside_the_training_region(recording, tmp_path):
    """Trained on the first 30 % (under half the excitation's period), the held-out part
    partly revisits its states and partly leaves them: every model's nMSE is reported in
    both parts; the learner, whose prior is the identified offsets, is no worse than the
    identification outside (where it falls back) and better inside."""
    names, stamps, R = recording
    res = ident_cli.run(_args(_csv(tmp_path / "rec.csv", names, stamps, R), tmp_path / "out", train=0.3,
                              learner="gmm", **{"no-consistent": True}))
    reg, r = res["region"], res["results"]
    assert reg["radius_rad"] == 0.1 and 0.2 < reg["fraction_outside"] < 0.95, reg
    for key in ("nominal", "ls", "ls+gmm"):
        assert len(r[key]["test_nmse_inside"]) == len(r[key]["test_nmse_outside"]) == 7, key
    ls_in, ls_out = np.array(r["ls"]["test_nmse_inside"]), np.array(r["ls"]["test_nmse_outside"])
    gmm_in, gmm_out = np.array(r["ls+gmm"]["test_nmse_inside"]), np.array(r["ls+gmm"]["test_nmse_outside"])
    assert np.all(gmm_out <= 1.05 * ls_out), (gmm_out, ls_out)
    assert np.median(gmm_in / ls_in) < 1.0, (gmm_in, ls_in)
    assert 0.0 < r["ls+gmm"]["pulled_back_fraction"] <= 1.0
    from adaptive_dynamics.learning import load_learner
    np.testing.assert_allclose(load_learner(res["files"]["learner_gmm"]).prior, r["ls"]["offset"], rtol=1e-12)
    narrow = ident_cli.run(_args(_csv(tmp_path / "rec.csv", names, stamps, R), tmp_path / "out2", train=0.3,
                                 **{"no-consistent": True, "region-radius": 0.01}))
    assert narrow["region"]["fraction_outside"] > reg["fraction_outside"]


def test_identify_a_cut_off_recording(recording, tmp_path):
    """The MCAP of a killed recorder (no summary, no metadata.yaml): identified from what
    it holds, the recovery reported."""
    import pathlib

    from adaptive_dynamics.evaluation.bags import TruncatedBagWarning

    names, stamps, R = recording
    d = pathlib.Path(_bag(tmp_path / "bag", names, stamps, R))
    mcap = next(d.glob("*.mcap"))
    mcap.write_bytes(mcap.read_bytes()[: int(0.8 * mcap.stat().st_size)])
    (d / "metadata.yaml").unlink()
    with pytest.warns(TruncatedBagWarning):
        res = ident_cli.run(_args(d, tmp_path / "out", **{"no-consistent": True}))
    c = res["counts"]["recording"]
    assert "complete messages" in c["truncated"] and 0.5 * len(stamps) < c["messages"] < 0.85 * len(stamps)
    assert np.all(np.array(res["results"]["ls"]["test_nmse"])[[1, 3]] < 0.01)


def test_identify_reports_bad_input(tmp_path, capsys):
    csv = tmp_path / "bad.csv"
    csv.write_text("t,foo\n0.0,1\n")
    assert ident_cli.main([str(csv), "--out", str(tmp_path / "o")]) == 2
    assert "missing columns" in capsys.readouterr().err
    assert ident_cli.main([str(tmp_path / "nope.csv"), "--out", str(tmp_path / "o")]) == 2
    assert "no such bag" in capsys.readouterr().err

"""``adaptive-dynamics experiment thunder --quick``: the sweeps in process, the headline
through the adaptive_controller node over DDS, read back from its bag.

The quick runs (12 s) are too short for the full run's targets (60 s: mass <= 3 %, CoM
<= 1 cm); what they must show: the node over DDS reproduces the in-process core's
steady-state error (the same law, the same plant), adaptation cuts the error below a
quarter of the non-adaptive law's, the estimate of link 7 + hand moves from Table 8's
initial value most of the way to the truth, the controller started from the Thunder
parameter file the experiment wrote (checked by reading that file here), every plot is
written and the JSON is the last line.

Each arm's run in stages, a test each (the Panda's whole run took 45-62 s on the loaded
2-core host, the UR5's 30-57 s): ``--part runs --runs-dir DIR`` -- the in-process runs
alone, kept in the module's DIR (the Panda's in two calls: the project's law, then the
paper mode's pair) --, then the whole experiment with ``--runs-dir DIR``, which reads them
back (bit-identical arrays: its figures equal the earlier stages') and runs the headline
over DDS; a stage run alone runs what it does not find.
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import yaml

from adaptive_dynamics.experiments import thunder

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def panda_runs(tmp_path_factory):
    """The Panda's --runs-dir, shared by its three stages; ``json``: the paper-mode stage's
    result (every in-process figure)."""
    return {"dir": tmp_path_factory.mktemp("thunder_runs"), "json": None}


def test_thunder_quick_runs(panda_runs, tmp_path, capsys):
    """``--part runs --mode project``: the sweeps, the non-adaptive and composite runs in
    process, no node graph (the JSON has no headline figures); their arrays stay in the
    module's runs directory for the next stages."""
    out = tmp_path / "runs"
    assert thunder.main(["--out", str(out), "--quick", "--part", "runs", "--mode", "project",
                         "--runs-dir", str(panda_runs["dir"])]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res == json.loads((out / "thunder.json").read_text())
    assert res["part"] == "runs" and not {"headline", "table8", "payload_mass_rel_error", "targets_met"} & set(res)
    assert not (out / "thunder_headline.png").exists() and not (out / "thunder_estimate.npz").exists()
    assert len(list(panda_runs["dir"].glob("run_panda_12s_*.npz"))) == 7     # 5 sweeps, fixed, composite
    assert set(res["steady_state_error"]) == {"kd_x0.5", "kd_x1", "kd_x2", "gamma_25", "gamma_100", "gamma_400"}
    for name in res["plots"]:
        assert (out / name).stat().st_size > 10_000, name
    assert res["adaptive_vs_nonadaptive"] < 0.25
    ss = res["steady_state_error"]
    assert ss["gamma_400"] < ss["gamma_100"] < ss["gamma_25"]
    assert res["composite"]["steady_state_error"] < ss["gamma_100"]
    assert res["project_mode"]["steady_state_error"] == res["steady_state_error"]["kd_x1"]
    assert "paper_mode" not in res


def test_thunder_quick_paper_mode_runs(panda_runs, tmp_path, capsys):
    """``--part runs --mode both`` on the previous stage's runs (read back): the paper
    mode's adaptive and non-adaptive pair run in process, kept for test_thunder_quick."""
    out = tmp_path / "paper_runs"
    assert thunder.main(["--out", str(out), "--quick", "--part", "runs", "--runs-dir", str(panda_runs["dir"])]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(list(panda_runs["dir"].glob("run_panda_12s_*.npz"))) == 9     # + the paper mode's two
    panda_runs["json"] = res
    proj, paper = res["project_mode"], res["paper_mode"]
    assert proj["steady_state_error"] == res["steady_state_error"]["kd_x1"]
    assert paper["settings"] == thunder.PAPER and paper["adaptive_vs_nonadaptive"] < 1.0, paper


def test_thunder_quick(panda_runs, tmp_path, capsys):
    """The whole quick experiment on the runs test_thunder_quick_runs left in the module's
    runs directory (read back; run here when that test did not run first) and the headline
    over DDS."""
    out = tmp_path / "thunder"
    assert thunder.main(["--out", str(out), "--quick", "--runs-dir", str(panda_runs["dir"])]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    res = json.loads(last)
    assert res == json.loads((out / "thunder.json").read_text())
    if panda_runs["json"] is not None:     # read back: the first stage's figures, exactly
        for key in ("steady_state_error", "rise_time_s", "nonadaptive_steady_state_error", "composite",
                    "saturated_steps", "project_mode", "paper_mode"):
            assert res[key] == panda_runs["json"][key], key
    for key in ("payload_mass_rel_error", "payload_com_error_m", "steady_state_error", "rise_time_s",
                "adaptive_vs_nonadaptive"):
        assert key in res, key
    assert set(res["steady_state_error"]) == {"kd_x0.5", "kd_x1", "kd_x2", "gamma_25", "gamma_100", "gamma_400"}
    for name in res["plots"]:
        assert (out / name).stat().st_size > 10_000, name
    # the node over DDS and the core in process: one law, one plant -> one steady state
    ss_node, ss_core = res["headline"]["steady_state_error"], res["steady_state_error"]["kd_x1"]
    assert abs(ss_node - ss_core) < 0.05 * ss_core, (ss_node, ss_core)
    assert res["headline"]["states"] >= 11_900
    assert res["adaptive_vs_nonadaptive"] < 0.25
    # a larger Gamma adapts faster: lower error at the end of the short run
    ss = res["steady_state_error"]
    assert ss["gamma_400"] < ss["gamma_100"] < ss["gamma_25"]
    # the estimate: most of the way from Table 8's initial mass to the truth
    t8 = res["table8"]
    start_err = abs(t8["initial"]["mass"] - t8["true"]["mass"]) / t8["true"]["mass"]
    assert res["payload_mass_rel_error"] < 0.15 * start_err
    # the composite update (beyond the paper): lower error, a closer estimate
    assert res["composite"]["steady_state_error"] < ss["gamma_100"]
    assert res["composite"]["payload_mass_rel_error"] < res["payload_mass_rel_error"]
    # the controller's start model: the Thunder file the experiment wrote (link 7 about the flange)
    doc = yaml.safe_load(open(out / "panda_initial_inertial_REG.yaml"))
    l7 = doc["link7"]
    com = np.array([l7["m_CoM_x"], l7["m_CoM_y"], l7["m_CoM_z"]]) / l7["mass"]
    assert l7["mass"] == pytest.approx(0.736) and np.allclose(com, [0.014, -0.004, -0.045], atol=1e-12)
    assert os.path.exists(out / "thunder_estimate.npz")
    # both modes (--mode both): the project's is the middle setting above; the lab's law
    # (vect orientation error, no posture pull, exact pseudo-inverse, every link adapted)
    proj, paper = res["project_mode"], res["paper_mode"]
    assert proj["steady_state_error"] == res["steady_state_error"]["kd_x1"]
    assert paper["settings"] == thunder.PAPER and paper["adaptive_vs_nonadaptive"] < 1.0, paper


@pytest.fixture(scope="module")
def ur5_runs(tmp_path_factory):
    """The UR5's --runs-dir, shared by its two stages; ``json``: the first stage's result."""
    return {"dir": tmp_path_factory.mktemp("thunder_ur5_runs"), "json": None}


def test_thunder_quick_runs_on_a_urdf_arm(ur5_runs, tmp_path, capsys):
    """The UR5's in-process runs (``--part runs``, the project's law), kept for the next test:
    the tool's link adapted, adaptation beats the fixed model."""
    from test_any_robot import UR5
    out = tmp_path / "ur5_runs"
    assert thunder.main(["--out", str(out), "--quick", "--robot", UR5, "--mode", "project", "--part", "runs",
                         "--runs-dir", str(ur5_runs["dir"])]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert res["part"] == "runs" and "headline" not in res and "paper_mode" not in res
    assert len(list(ur5_runs["dir"].glob("run_ur5_robot_12s_*.npz"))) == 7     # 5 sweeps, fixed, composite
    ur5_runs["json"] = res
    assert res["robot"] == "ur5_robot" and res["adapted_link"] == res["com_frame"] == "wrist_3_link"
    assert res["adaptive_vs_nonadaptive"] < 0.25


def test_thunder_quick_on_a_urdf_arm(ur5_runs, tmp_path, capsys):
    """Another arm (the UR5's URDF): a 1 kg tool on its last link, the bare link as the
    start, a start pose from which the path stays within the limits (the trajectory node
    checks it again in the headline graph); the node over DDS still reproduces the core,
    adaptation still beats the fixed model, the tool's mass is found (the project's law: the paper's
    mode is the Panda test's).  The in-process runs read back from the previous test's
    runs directory (run here when it did not run first)."""
    from test_any_robot import UR5
    out = tmp_path / "ur5"
    assert thunder.main(["--out", str(out), "--quick", "--robot", UR5, "--mode", "project",
                         "--runs-dir", str(ur5_runs["dir"])]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    if ur5_runs["json"] is not None:     # read back: the first stage's figures, exactly
        for key in ("steady_state_error", "nonadaptive_steady_state_error", "composite", "project_mode"):
            assert res[key] == ur5_runs["json"][key], key
    assert res["robot"] == "ur5_robot" and res["adapted_link"] == res["com_frame"] == "wrist_3_link"
    assert "paper_estimate" not in res["table8"] and res["table8"]["true"]["mass"] == pytest.approx(
        res["table8"]["initial"]["mass"] + thunder.TOOL[0])
    ss_node, ss_core = res["headline"]["steady_state_error"], res["steady_state_error"]["kd_x1"]
    assert abs(ss_node - ss_core) < 0.05 * ss_core, (ss_node, ss_core)
    assert res["adaptive_vs_nonadaptive"] < 0.25
    assert res["payload_mass_rel_error"] < 0.1

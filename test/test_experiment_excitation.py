"""``experiment excitation --quick``: the optimised excitation against the default Fourier
trajectory on the simulated Panda (condition number, identified parameter error, held-out
nMSE), and a flange load identified from the wrist excitation and from the whole-arm
recording; the JSON is the last line and holds its targets."""
from __future__ import annotations

import json

import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.experiments import excitation as E
from adaptive_dynamics.trajectories.excitation import default_fourier_condition


def test_quick(tmp_path, capsys):
    assert E.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads((tmp_path / "excitation.json").read_text()) == res
    p = res["robots"]["panda"]
    # the default's condition number through the command's own public function (another path)
    ref = default_fourier_condition(RobotModel("panda"), E.QUICK["duration"], E.QUICK["harmonics"],
                                    samples=E.CONDITION_SAMPLES)
    assert p["default"]["condition"] == pytest.approx(ref, rel=1e-4)
    # optimised: far better conditioned, and so identified far closer to the simulator's truth,
    # and better on a trajectory neither saw
    assert p["condition_vs_default"] <= E.TARGETS["condition_vs_default_max"]
    assert p["param_error_vs_default"] <= E.TARGETS["param_error_vs_default_max"]
    assert np.mean(np.log(np.array(p["optimised"]["heldout_nmse"]) / np.array(p["default"]["heldout_nmse"]))) < 0
    assert p["feasible"] and p["optimised"]["saturated_steps"] == 0
    assert res["condition_vs_default_max"] == pytest.approx(p["condition_vs_default"], rel=1e-4)
    # the flange load: one tool, from the wrist excitation (and from the whole-arm recording)
    tool = res["payload"]["panda"]["tools"][0]
    assert tool["mass"] == E.QUICK_TOOLS[0]["mass"]
    assert tool["wrist"]["mass_rel_error"] <= E.TARGETS["payload_mass_rel_error_max"]
    assert tool["wrist"]["com_error_m"] <= E.TARGETS["payload_com_error_m_max"]
    assert res["payload"]["panda"]["wrist_seconds"] <= 15.0
    assert set(res["targets_met"]) == set(E.TARGETS)
    for name in ("excitation_arms.png", "excitation_payload.png"):
        assert (tmp_path / name).stat().st_size > 10_000

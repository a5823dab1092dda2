"""`adaptive-dynamics experiment scqp --quick`: the episodes of the three approaches on
the MuJoCo Panda with an unmodelled mass, friction and sensor noise, the JSON and the
plots."""
from __future__ import annotations

import json

import numpy as np

from adaptive_dynamics.experiments import EXPERIMENTS, run


def test_quick_run(tmp_path, capsys):
    assert "scqp" in EXPERIMENTS
    assert run("scqp", ["--quick", "--jobs", "1", "--out", str(tmp_path)]) == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with open(tmp_path / "scqp.json", encoding="utf-8") as fh:
        assert json.load(fh) == res
    t = res["table"]["panda/z"]
    med = {m: np.array(v) for m, v in t["median"].items()}
    assert set(med) == {"scqp", "gp_pid", "mrac"} and all(v.size == 3 for v in med.values())
    # learning between episodes: every approach ends below its first episode; the two
    # MRAC approaches share the first episode (no GP yet)
    for m, v in med.items():
        assert v[-1] < 0.7 * v[0], (m, v)
    np.testing.assert_allclose(med["scqp"][0], med["mrac"][0], rtol=1e-9)
    assert res["qp_failures"] == 0 and t["qp_solves"] == 3 * 2 * 3 * 600 and res["paper_mode"]["qp_failures"] == 0
    assert t["scqp_final_vs_gp_pid"] == round(med["scqp"][-1] / med["gp_pid"][-1], 4)
    reach = [i + 1 for i, e in enumerate(med["scqp"]) if e <= med["gp_pid"][-1]]
    assert t["episodes_to_baseline"] == (reach[0] if reach else None)
    # both modes ran: the headline is the project's; the paper's as written (control.scqp.PAPER)
    assert res["modes"] == ["project", "paper"] and res["project_mode"]["table"] == res["table"]
    paper = res["paper_mode"]
    assert paper["settings"]["target_acceleration"] == "commanded" and paper["settings"]["qp"] == {
        "residual_inertia_bounds": None}
    pm = {m: np.array(v) for m, v in paper["table"]["panda/z"]["median"].items()}
    # its GP's target at the QP's planned acceleration is the GP's own previous output: it
    # learns nothing -- GP + PID does not improve, SCQP is the MRAC alone (docs/decisions.md)
    assert pm["gp_pid"][-1] > 0.95 * pm["gp_pid"][0], pm
    np.testing.assert_allclose(pm["scqp"], pm["mrac"], rtol=1e-3)
    assert any("_paper_" in f for f in res["plots"])
    for f in res["plots"]:
        data = (tmp_path / f).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

"""End to end over real DDS with the PGPOL split: mujoco_bridge + trajectory +
adaptive_controller + model_update + prediction (+ recorder) in lockstep as separate
processes, started by the pip launcher with ``learner_split``, for a few seconds of sim
time.

Asserts from the bag (``/diagnostics`` and the streams): the graph ends by itself; the
prediction node applied several model versions (> 1) from model_update's snapshots
and refused none, every applied version greater than the one before (rebuilt from
``versions_applied`` and ``snapshots_applied`` of every status); the controller used
the residuals it published (``residual_used``); the residuals are finite and not all
zero once a model is in use."""
from __future__ import annotations

import json

import numpy as np
import pytest

from adaptive_dynamics.evaluation.bags import read_messages, resolve_bag
from adaptive_dynamics.scenarios import build_graph
from adaptive_dynamics.launcher import GraphProcess

pytestmark = [pytest.mark.ros, pytest.mark.slow]
DURATION = 3.0
DIAG = 0.25


def last_values(bag):
    """The last /diagnostics values of each status name, and the maxima of numeric ones."""
    last, peak = {}, {}
    for _, _, msg in read_messages(bag, ["/diagnostics"]):
        for st in msg.status:
            values = {kv.key: kv.value for kv in st.values}
            last[st.name] = values
            for k, v in values.items():
                try:
                    peak.setdefault(st.name, {})[k] = max(float(v), peak.get(st.name, {}).get(k, -np.inf))
                except ValueError:
                    pass
    return last, peak


def applied_versions(bag):
    """The sequence of versions the prediction node applied, rebuilt from each status's
    ``versions_applied`` (the last few, oldest first) and ``snapshots_applied`` (the
    count they end at); a version seen twice at one position fails."""
    seq = {}
    for _, _, msg in read_messages(bag, ["/diagnostics"]):
        for st in msg.status:
            if st.name != "prediction":
                continue
            values = {kv.key: kv.value for kv in st.values}
            listed = [int(x) for x in values.get("versions_applied", "").split()]
            count = int(values.get("snapshots_applied", 0))
            for i, ver in enumerate(listed):
                pos = count - len(listed) + i
                assert seq.setdefault(pos, ver) == ver, (pos, seq[pos], ver)
    return [seq[k] for k in sorted(seq)]


def test_closed_loop_with_the_split(tmp_path):
    bag = tmp_path / "bag"
    stats = tmp_path / "stats.json"
    overrides = {
        "mujoco_bridge": {"stats_file": str(stats)},
        "adaptive_controller": {"diagnostics_period": DIAG},
        "model_update": {"learner_config": json.dumps({"n_basis": 64, "width": 0.5}), "warmup": 40,
                         "learn_decimation": 5, "publish_period": 0.05, "diagnostics_period": DIAG},
        "prediction": {"diagnostics_period": DIAG},
        "recorder": {"topics": ["joint_states", "reference", "effort_controller/commands", "feedforward/residual",
                                "/diagnostics"]},
    }
    nodes = build_graph("sim", robot="planar2", controller="composite", learner="rbfn", learner_split=True,
                        duration=DURATION, record=True, bag=str(bag), overrides=overrides)
    assert {"model_update", "prediction"} <= {s.name for s in nodes}
    assert "residual_learner" not in {s.name for s in nodes}
    g = GraphProcess(nodes, echo=False)
    rc, why = g.wait(timeout=240)
    assert rc == 0, (why, {k: v[-15:] for k, v in g.logs.items()})
    s = json.loads(stats.read_text())
    assert s["plant_steps"] == int(round(DURATION * 1000)) and s.get("lockstep_timeouts", 0) == 0

    path = resolve_bag(bag)
    last, peak = last_values(path)
    pred, upd, ctl = peak["prediction"], peak["model_update"], peak["adaptive_controller"]
    assert pred["model_version"] > 1 and pred["snapshots_applied"] > 1, last["prediction"]
    assert pred.get("snapshots_refused", 0) == 0 and pred.get("prediction_failed", 0) == 0, last["prediction"]
    assert upd["snapshots_published"] >= pred["snapshots_applied"] and upd["version"] >= pred["model_version"]
    applied = applied_versions(path)
    assert len(applied) > 1 and all(b > a for a, b in zip(applied, applied[1:])), applied
    assert ctl["residual_used"] > 0, last["adaptive_controller"]

    res = np.array([m.effort for _, _, m in read_messages(path, ["/feedforward/residual"])])
    assert len(res) > 0.5 * DURATION * 1000 and np.isfinite(res).all()
    assert np.abs(res).max() > 0.0     # the learnt model's residuals reached the controller's topic

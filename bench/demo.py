#!/usr/bin/env python3
"""The README's main job as a user runs it: `adaptive-dynamics demo` with its defaults
(a process of its own: start-up, the graph over DDS, the analysis, the plots), timed
from the command's start to its exit.

Figures (last line, one JSON object): ``demo_wall_s`` (median over ``--repeat`` runs,
with ``demo_wall_spread_s`` = min, max) against the target ``demo_wall_target_s`` (90 s
on 2 cores, start-up included), ``demo_wall_units`` (the same in machine units,
measured in the same run: ``machine_unit.py``), the graph's own ``graph_wall_s`` and
sim-s per wall-s, and what the demo shows: ``learned_vs_baseline_rmse_max`` (target
<= 0.3) and ``tool_mass_rel_error`` of the last run.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine_unit import MachineUnit  # noqa: E402

TARGET_S = 90.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=1, help="demo runs (default 1: each is about a minute)")
    args = ap.parse_args()
    unit = MachineUnit()
    exe = shutil.which("adaptive-dynamics") or os.path.join(os.path.dirname(sys.executable), "adaptive-dynamics")
    walls, last = [], None
    for _ in range(args.repeat):
        out = tempfile.mkdtemp(prefix="bench_demo_")
        t0 = time.monotonic()
        r = subprocess.run([exe, "demo", "--out", out], capture_output=True, text=True, timeout=900)
        walls.append(time.monotonic() - t0)
        if r.returncode != 0:
            print(r.stdout[-2000:] + r.stderr[-2000:], file=sys.stderr)
            return 1
        last = json.loads(r.stdout.strip().splitlines()[-1])
        shutil.rmtree(out, ignore_errors=True)
        unit.sample()
    res = {"demo_wall_s": round(float(np.median(walls)), 1),
           "demo_wall_spread_s": [round(min(walls), 1), round(max(walls), 1)], "runs": len(walls),
           "demo_wall_target_s": TARGET_S, "demo_wall_met": bool(np.median(walls) <= TARGET_S),
           "graph_wall_s": last["wall_s"], "sim_time_s": last["sim_time_s"],
           "graph_sim_s_per_wall_s": round(last["sim_time_s"] / last["wall_s"], 3),
           "learned_vs_baseline_rmse_max": last["learned_vs_baseline_rmse_max"],
           "tool_mass_rel_error": last["tool_mass_rel_error"]}
    res["demo_wall_units"] = unit.units(1e6 * res["demo_wall_s"], 0)
    res.update(unit.report())
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Experiment commands: reproductions of the papers' tables and figures.

``adaptive-dynamics experiment NAME --out DIR [...]`` imports
``adaptive_dynamics.experiments.<module>`` and calls its ``main(argv) -> int``.
Each experiment writes its PNG plots and ``<name>.json`` (its table) into ``--out``
and prints that JSON as the **last line** of its output.  Every experiment has a
``--quick`` flag (short version used by the tests).
"""
from __future__ import annotations

import importlib

#: experiment name -> (module, one-line description)
EXPERIMENTS: dict[str, tuple[str, str]] = {
    "ardl": ("adaptive_dynamics.experiments.ardl",
             "ARDL §4.1: PD / computed torque / direct / composite adaptive control (Panda, KUKA)"),
    "arms": ("adaptive_dynamics.experiments.arms",
             "any arm with no tuning: composite adaptive control + friction on example-robot-data's arms with a"
             " payload sized to each (RMSE, saturation, watchdog trips)"),
    "contact": ("adaptive_dynamics.experiments.contact",
                "contact detection with the momentum observer on the URDF, the adapted estimate and the adapted"
                " estimate + residual learner (Panda, iiwa; unmodelled tool, joint friction, pushes of 5-30 N)"),
    "consistency": ("adaptive_dynamics.experiments.consistency",
                    "Smith & Mistry 2020: consistency transform, virtual-model table and 4-phase online run"),
    "excitation": ("adaptive_dynamics.experiments.excitation",
                   "optimised excitation vs the default Fourier trajectory (condition number, identified parameter"
                   " error, held-out nMSE) and flange-load identification, MuJoCo"),
    "pgpol": ("adaptive_dynamics.experiments.pgpol",
              "Habich et al. 2019: PGPOL/SGPOL feed-forward over DDS, Tables I-II, Fig. 5, payload change detection"),
    "realdata": ("adaptive_dynamics.experiments.realdata",
                 "realistic Panda / iiwa recordings: identification and ID + residual learners with their"
                 " defaults, inside and outside the training region; the same in closed loop"),
    "scqp": ("adaptive_dynamics.experiments.scqp",
             "Khadivar et al.: SCQP vs GP + PID vs MRAC alone over episodes, unmodelled mass/friction/noise (Fig. 2-5)"),
    "thunder": ("adaptive_dynamics.experiments.thunder",
                "Thunder Dynamics: task-space adaptive backstepping estimating an unmodelled hand (Tables 6-8, Fig."
                " 6-13), headline over DDS"),
}


def add_graph_argument(ap) -> None:
    """``--graph processes|inprocess`` for an experiment that runs node graphs (see
    :func:`~adaptive_dynamics.launcher.run_to_end`); its ``main`` runs within
    ``launcher.graph_kind(args.graph)``."""
    from ..launcher import GRAPH_KINDS  # lazy: listing the experiments imports no launcher
    ap.add_argument("--graph", choices=GRAPH_KINDS, default="processes",
                    help="how the node graphs run: a process per node (default, as `launch` does) or every node"
                         " on a thread of this process, each in its own rclpy context (same nodes, parameters and"
                         " DDS topics, no interpreter start per node: the tests' quick runs)")


def save_plot(fig, out_dir: str, name: str, files: list) -> str:
    """Write ``fig`` as ``out_dir/name`` (PNG, 110 dpi), close it and append the path to
    ``files`` (the experiment's list of written plots); returns the path."""
    import os

    import matplotlib.pyplot as plt
    path = os.path.join(out_dir, name)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)
    return path


def write_result(out_dir: str, name: str, summary: dict, default=None) -> int:
    """Write ``summary`` as ``out_dir/name.json`` and print it as the last line (compact);
    returns 0 (the experiment's exit status)."""
    import json
    import os

    with open(os.path.join(out_dir, f"{name}.json"), "w", encoding="utf-8") as fh:
        json.dump(summary, fh, indent=1, default=default)
    print(json.dumps(summary, separators=(",", ":"), default=default))
    return 0


def run(name: str, argv: list[str]) -> int:
    if name not in EXPERIMENTS:
        raise ValueError(f"unknown experiment {name!r}; choose from {sorted(EXPERIMENTS)}")
    module = importlib.import_module(EXPERIMENTS[name][0])
    return int(module.main(argv) or 0)

"""Residual learners (no ROS): incremental GMM + GMR and an RBF network with RLS, both
with the semi-parametric consistency transform.

scikit-learn habits: ``partial_fit`` / ``predict`` / ``save`` / ``load``; see
:mod:`.base` for the common API and :mod:`.consistency` for the transforms.

* :class:`IncrementalGMM` (``"gmm"``) -- Pinto & Engel's IGMM, GMR prediction with
  variance, consistency transform eq. 16-19 of Smith & Mistry 2020.
* :class:`RBFNetwork` (``"rbfn"``) -- Gaussian basis functions on a scrambled Sobol
  grid, (block-)recursive least squares, consistency by carrying dW/dpi (ARDL eq. 13-14).
* :class:`ExactGP` (``"gp"``) -- exact GP regression per output joint (SE-ARD kernel,
  optional type-II ML fit), mean, variance and mean gradient (PGPOL sec. II-A, SCQP eq. 16).
* :class:`PGPOL` (``"pgpol"``) / :class:`SGPOL` (``"sgpol"``) -- parallel drifting sparse
  GPs with a database, kNN of the next query, 1/sigma fusion and change detection
  (Habich et al. 2019); SGPOL is the single-GP case.
* :class:`JointLocal` (``"joint_local"``) -- one small RBF network per joint on that
  joint's own (q_i, qd_i, qdd_i): the friction, ripple, offsets and drive inertia a
  rigid-body model leaves, without slopes in the other joints' directions; it falls back
  away from the configurations it learnt (a repeated task: contact monitoring).
* :class:`OnlineResidual` -- either learner fed online from a stream on a worker
  thread, with the transforms applied in order (the ``residual_learner`` node's core).
* :mod:`.snapshot` -- any learner as versioned, checksummed bytes (the ``learner/model``
  snapshots of the prediction / model-update split).
"""
from .base import LEARNERS, Learner, load_learner, make_learner
from .consistency import ParameterChange, transform_gaussians
from .gp import ExactGP
from .igmm import IncrementalGMM
from .joint_local import JointLocal
from .pgpol import PGPOL, SGPOL
from .online import OnlineResidual
from .rbfn import RBFNetwork
from .snapshot import Snapshot, SnapshotError, decode_snapshot, encode_snapshot

__all__ = ["Learner", "LEARNERS", "make_learner", "load_learner", "IncrementalGMM", "RBFNetwork",
           "OnlineResidual", "ParameterChange", "transform_gaussians", "ExactGP",
           "PGPOL", "SGPOL", "JointLocal"]
__all__ += ["Snapshot", "SnapshotError", "encode_snapshot", "decode_snapshot"]  # the split's model snapshots

"""Joint-local residual: one small RBF network per joint on that joint's own state.

Model: ``f_i(x) = g_i(q_i, qd_i, qdd_i)`` (``inputs="qva"``, the default) or
``g_i(q_i, qd_i)`` (``inputs="qv"``), each ``g_i`` an :class:`~.rbfn.RBFNetwork` with one
output (its box from the data, growing; targets standardised; a constant basis function).

Why: what a rigid-body model with viscous and Coulomb columns leaves on a torque-
controlled arm is much of it joint-local -- Stribeck and load-dependent friction, cogging
and position ripple of the drive, torque-sensor offsets, the drive's own inertia -- and a
learner on the whole 3n-dimensional state has to find that out from data: along one
motion it fits slopes in the other joints' directions that nothing constrains.  A
joint-local learner has no such directions, and on a motion it has seen (the same task
again: ``experiment contact``) its residual comes closer to what the sensors allow.  What
it cannot tell apart along one motion is a joint-local effect from a coupled one (an
inertial error moves torque with the other joints' accelerations) that happens to follow
the joint's own state there: on another motion that part is wrong.  So its support also
falls with the distance of the whole configuration ``q`` to the configurations it learnt
(``reach``; ``experiment realdata`` measures it on another excitation), and it is the
learner for a motion that repeats, not for generalising.

Support (where the prediction falls back to the prior, :mod:`.base`): each network's
``exp(-q^2 / 2)`` (:mod:`.rbfn`) times ``exp(-d^2 / (2 width^2))``, d how far the joint's
input lies beyond the network's box (unit-box coordinates: beyond its data the Gaussians
fade and the constant basis function alone would claim to know the residual), times
1 within ``reach`` [rad] of a configuration learnt and ``exp(-2 (D / reach)^2)`` beyond, D
how much farther than ``reach`` the configuration ``q`` lies from the nearest one learnt
(they are kept ``reach / 2`` apart, in a k-d tree).  With ``velocity_scale`` tau > 0 [s]
the distance is the state's, ``(q, tau qd)``: another motion through a configuration
learnt, at another velocity, is not where the learner learnt its coupled part either
(``experiment contact``'s other motion: docs/contact.md).

Learning is each network's (block) recursive least squares; with the consistency
transform (``n_params > 0``) each network carries its ``dW/dpi`` with the regressor's row
of its joint as targets (ARDL eq. 14), so a parameter change moves every network exactly
as if it had been trained on ``y - Y dpi`` (tested).  Prediction, variance and support
are the networks', per joint: the support (:meth:`~.base.Learner.support`) is an N x n
array, and a query far from joint i's data falls back to the prior on joint i only.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from .base import Learner, register
from .rbfn import RBFNetwork, regressors_for

__all__ = ["JointLocal", "INPUTS", "MAX_COVER"]

#: which of the joint's own inputs each network sees
INPUTS = {"qv": 2, "qva": 3}
#: counters kept per network and summed for the learner
_SUB_COUNTERS = ("n_box_growths", "n_outside_box", "n_queries_outside")
#: most configurations kept for the support (7 joints: 1.1 MB)
MAX_COVER = 20000
#: the support's distance is the state's, (q, VELOCITY_SCALE qd) [s]: along another motion through a
#: configuration learnt, at another velocity, the coupled part learnt along the first is wrong
#: (``experiment contact``'s other motion: 1.11 x the adapted model's level on one joint with the
#: configuration alone, 1.00 x with 0.2 s, the same on the motion learnt)
VELOCITY_SCALE = 0.2
#: configurations searched one by one before the k-d tree is rebuilt over them all
_TREE_EVERY = 256


@register
class JointLocal(Learner):
    """Joint-local residual: n RBF networks, network i maps joint i's
    ``(q_i, qd_i[, qdd_i])`` to output i.

    Parameters
    ----------
    input_dim, output_dim:
        ``3 n`` (x = (q, qd, qdd)) and ``n``.
    inputs:
        ``"qva"`` (position, velocity and acceleration of the joint: its own inertia's
        error too, e.g. the drive's) or ``"qv"`` (position and velocity).
    n_basis, width, reg, forgetting, bias, standardize, warmup, box_margin, grow, memory,
    seed, block_size:
        Each network's (:class:`~.rbfn.RBFNetwork`; its box always from the data).
    n_params:
        Length of pi to carry dW/dpi for (0 = no consistency transform).
    reach:
        [rad] Full support within this distance of a configuration learnt, falling as
        ``exp(-2 (D / reach)^2)`` with the distance D beyond it.
    velocity_scale:
        [s] > 0 (default :data:`VELOCITY_SCALE`): the distance is the state's,
        ``(q, velocity_scale * qd)``; 0: the configuration's alone.
    """

    kind = "joint_local"

    def __init__(self, input_dim: int, output_dim: int, *, inputs: str = "qva", n_basis: int = 64,
                 width: float = 0.15, reg: float = 1e-3, forgetting: float = 1.0, n_params: int = 0,
                 seed: int = 0, block_size: int = 256, bias: bool = True, standardize: bool = True,
                 warmup: int = 200, box_margin: float = 0.2, grow: bool = True, memory: int = 4096,
                 reach: float = 0.05, velocity_scale: float = VELOCITY_SCALE):
        super().__init__(input_dim, output_dim)
        n = self.output_dim
        if self.input_dim != 3 * n:
            raise ValueError(f"a joint-local learner takes x = (q, qd, qdd): input_dim must be 3 x output_dim ="
                             f" {3 * n}, got {self.input_dim}")
        if inputs not in INPUTS:
            raise ValueError(f"inputs must be one of {sorted(INPUTS)}, got {inputs!r}")
        self.inputs = inputs
        self.n_params = int(n_params)
        sub = dict(n_basis=int(n_basis), width=float(width), reg=float(reg), forgetting=float(forgetting),
                   n_params=self.n_params, seed=int(seed), block_size=int(block_size), bias=bool(bias),
                   standardize=bool(standardize), warmup=int(warmup), box_margin=float(box_margin),
                   grow=bool(grow), memory=int(memory))
        self._sub_config = sub
        self.reach = float(reach)
        if not self.reach > 0:
            raise ValueError(f"reach must be > 0 [rad], got {reach}")
        self.velocity_scale = float(velocity_scale)
        if not (self.velocity_scale >= 0 and np.isfinite(self.velocity_scale)):
            raise ValueError(f"velocity_scale must be >= 0 [s], got {velocity_scale}")
        # the states learnt (q, or (q, velocity_scale qd)), ~reach / 2 apart, in a buffer that doubles
        # when full; what predict reads, swapped whole: (cKDTree of buf[:n_tree] or None, buf, n_tree, count)
        self._cover_dim = 2 * n if self.velocity_scale > 0 else n
        self._cover_snap = (None, np.empty((64, self._cover_dim)), 0, 0)
        self.nets = [RBFNetwork(INPUTS[inputs], 1, **sub) for _ in range(n)]
        self.n_basis = n * self.nets[0].n_basis
        # column indices of joint i's inputs in x = (q, qd, qdd)
        self._cols = [np.array([i + k * n for k in range(INPUTS[inputs])]) for i in range(n)]
        self._col_index = np.array(self._cols)

    @property
    def uses_regressors(self) -> bool:  # type: ignore[override]
        return self.n_params > 0

    def get_config(self) -> Dict[str, Any]:
        return {"input_dim": self.input_dim, "output_dim": self.output_dim, "inputs": self.inputs,
                "reach": self.reach, "velocity_scale": self.velocity_scale, **self._sub_config}

    def _cover_coords(self, X: np.ndarray) -> np.ndarray:
        """Where the support measures the rows of X from: q, or (q, velocity_scale qd)."""
        n = self.output_dim
        if self.velocity_scale > 0:
            return np.hstack([X[:, :n], self.velocity_scale * X[:, n:2 * n]])
        return X[:, :n]

    def joint_inputs(self, X: np.ndarray, i: int) -> np.ndarray:
        """Network i's inputs for the rows of X: ``(q_i, qd_i, qdd_i)`` (``"qva"``) or
        ``(q_i, qd_i)`` (``"qv"``)."""
        return np.ascontiguousarray(X[:, self._cols[i]], dtype=float)

    def _counters(self) -> Dict[str, int]:
        out = super()._counters()
        for name in _SUB_COUNTERS:
            out[name] = int(sum(getattr(net, name) for net in self.nets))
        return out

    def support(self, X) -> np.ndarray:
        """As :meth:`Learner.support` (an inspection: the networks' counters do not move)."""
        before = [net.n_queries_outside for net in self.nets]
        try:
            return super().support(X)
        finally:
            for net, c in zip(self.nets, before):
                net.n_queries_outside = c

    @property
    def ready(self) -> bool:
        return all(net.ready for net in self.nets)

    # ------------------------------------------------------------------ learning
    def _regressors(self, X, regressors, model) -> Optional[np.ndarray]:
        return regressors_for(X, regressors, model, self.output_dim, self.n_params, "this joint-local learner")

    def _fit(self, X: np.ndarray, y: np.ndarray, R: Optional[np.ndarray]) -> None:
        self._cover_add(self._cover_coords(X))
        for i, net in enumerate(self.nets):
            net._fit(self.joint_inputs(X, i), y[:, i:i + 1], None if R is None else R[:, i:i + 1, :])
            net.n_updates += X.shape[0]

    # ------------------------------------------------------------------ the configurations learnt
    @property
    def cover(self) -> np.ndarray:
        """The configurations learnt that the support measures from (a copy)."""
        _, buf, _, count = self._cover_snap
        return buf[:count].copy()

    def _nearest(self, Q: np.ndarray) -> np.ndarray:
        """Distance [rad] of each configuration to the nearest one learnt (inf before any)."""
        tree, buf, n_tree, count = self._cover_snap
        d = np.full(Q.shape[0], np.inf)
        if tree is not None:
            d = tree.query(Q, k=1)[0]
        tail = buf[n_tree:count]
        if tail.shape[0]:
            d = np.minimum(d, np.sqrt(((Q[:, None, :] - tail[None]) ** 2).sum(axis=2)).min(axis=1))
        return d

    def _near(self, Q: np.ndarray) -> np.ndarray:
        """1 within ``reach`` of a configuration learnt, ``exp(-2 (D / reach)^2)`` beyond, D
        the distance beyond ``reach`` (a Gaussian of width reach / 2)."""
        D = np.maximum(self._nearest(Q) - self.reach, 0.0)
        return np.exp(-2.0 * np.square(D / self.reach))

    def _cover_add(self, Q: np.ndarray) -> None:
        """Keep each learnt configuration farther than reach / 2 from those kept (a cover of
        where the learner has data: it grows with the part of the configuration space a
        motion visits, not with its duration), at most :data:`MAX_COVER` of them (then the
        support stays where it was)."""
        for q in Q:
            tree, buf, n_tree, count = self._cover_snap
            if count >= MAX_COVER:
                break
            if self._nearest(q[None])[0] <= 0.5 * self.reach:
                continue
            if count == buf.shape[0]:                  # full: a new buffer (readers keep the old one)
                buf = np.concatenate([buf, np.empty_like(buf)])
                buf[:count] = self._cover_snap[1][:count]
            buf[count] = q                             # beyond what any reader reads
            self._cover_snap = (tree, buf, n_tree, count + 1)
            if count + 1 - n_tree >= _TREE_EVERY:
                self._rebuild_tree()

    def _rebuild_tree(self) -> None:
        from scipy.spatial import cKDTree
        _, buf, _, count = self._cover_snap
        self._cover_snap = (cKDTree(buf[:count]) if count else None, buf, count, count)

    # ------------------------------------------------------------------ prediction
    def _predict(self, X: np.ndarray, return_var: bool):
        stack = self._stacked()
        if stack is None:                    # a network still warming up: one at a time
            return self._predict_each(X, return_var)
        low, inv_span, Ct2, cnorm, beta, Wg, const, P, nv, bias = stack
        n, K = self.output_dim, Wg.shape[1]
        Zs = (X[:, self._col_index] - low) * inv_span                # N x n x d, in each box
        tol = self.nets[0]._unit_tolerance
        out = ((Zs < -tol) | (Zs > 1.0 + tol)).any(axis=2)           # N x n: beyond each box
        if out.any():
            for i, net in enumerate(self.nets):
                net.n_queries_outside += int(np.count_nonzero(out[:, i]))
        Th = np.ones((n, X.shape[0], K + int(bias)))                 # per joint: N x (K [+ 1])
        E = Th[:, :, :K]
        np.matmul(Zs.transpose(1, 0, 2), Ct2, out=E)
        E -= cnorm
        E -= beta * np.square(Zs).sum(axis=2).T[:, :, None]
        np.exp(E, out=E)
        mean = (E * Wg[:, None, :]).sum(axis=2).T + const
        q = (np.matmul(Th, P) * Th).sum(axis=2).T                    # posterior variance / noise variance
        var = (1.0 + q) * nv if return_var else None
        near = self._near(self._cover_coords(X))[:, None]
        return mean, var, np.exp(-0.5 * q * q) * self._reach(Zs) * near

    def _reach(self, Zs: np.ndarray) -> np.ndarray:
        """``exp(-d^2 / (2 width^2))``, d the distance of each network's input beyond its
        box (unit-box coordinates; 1 inside): where the Gaussians have faded, the constant
        basis function alone would still claim full support."""
        beyond = np.maximum(0.0, np.maximum(-Zs, Zs - 1.0))
        return np.exp(-0.5 * np.square(beyond).sum(axis=-1) / self.nets[0].width ** 2)

    def _stacked(self):
        """The networks' prediction snapshots stacked (one einsum for every joint), rebuilt
        when one of them changes; None while one has none (warm-up)."""
        snaps = [net._pred for net in self.nets]
        if any(sn is None for sn in snaps):
            return None
        key = tuple(id(sn) for sn in snaps)
        cache = getattr(self, "_stack_cache", None)
        if cache is not None and cache[0] == key:
            return cache[1]
        net0 = self.nets[0]
        geo = [sn[5] for sn in snaps]
        stack = (np.array([g[0] for g in geo])[None], np.array([g[1] for g in geo])[None], geo[0][2], geo[0][3],
                 net0.beta, np.array([sn[3][:, 0] for sn in snaps]), np.array([sn[4][0] for sn in snaps]),
                 np.array([sn[1] for sn in snaps]), np.array([sn[2][0] for sn in snaps]), net0.bias)
        self._stack_cache = (key, stack, snaps)       # (the snapshots kept alive: their ids stay theirs)
        return stack

    def _predict_each(self, X: np.ndarray, return_var: bool):
        N, n = X.shape[0], self.output_dim
        mean = np.empty((N, n))
        var = np.empty((N, n)) if return_var else None
        support = np.empty((N, n))
        for i, net in enumerate(self.nets):
            Z = self.joint_inputs(X, i)
            snap = net._pred                       # the box the prediction below belongs to
            m, v, s = net._predict(Z, return_var)
            mean[:, i] = m[:, 0]
            if return_var:
                var[:, i] = v[:, 0]
            support[:, i] = s if snap is None else s * self._reach((Z - snap[5][0]) * snap[5][1])
        return mean, var, support * self._near(self._cover_coords(X))[:, None]

    # ------------------------------------------------------------------ consistency
    def _transform(self, dpi: np.ndarray, model) -> None:
        if not self.n_params:
            raise ValueError("this joint-local learner does not carry dW/dpi: build it with n_params ="
                             " model.n_params")
        for net in self.nets:
            net._transform(dpi, model)

    # ------------------------------------------------------------------ persistence
    def _get_arrays(self) -> Dict[str, np.ndarray]:
        out = {"cover": self.cover}
        for i, net in enumerate(self.nets):
            for k, v in net._get_arrays().items():
                out[f"j{i}_{k}"] = v
            out[f"j{i}_counters"] = np.array([getattr(net, c) for c in _SUB_COUNTERS + ("n_updates",)])
        return out

    def _set_arrays(self, arrays: Dict[str, np.ndarray]) -> None:
        cover = np.asarray(arrays.get("cover", np.empty((0, self._cover_dim))), dtype=float)
        if cover.ndim != 2 or cover.shape[1] != self._cover_dim or not np.isfinite(cover).all():
            raise ValueError(f"saved joint-local learner has configurations of shape {cover.shape}")
        buf = np.empty((max(64, cover.shape[0]), self._cover_dim))
        buf[:cover.shape[0]] = cover
        self._cover_snap = (None, buf, 0, cover.shape[0])
        self._rebuild_tree()
        for i, net in enumerate(self.nets):
            pre = f"j{i}_"
            sub = {k[len(pre):]: v for k, v in arrays.items() if k.startswith(pre)}
            if "W" not in sub:
                raise ValueError(f"saved joint-local learner has no network for joint {i + 1}")
            cnt = np.asarray(sub.pop("counters", np.zeros(len(_SUB_COUNTERS) + 1)), dtype=float).reshape(-1)
            net._set_arrays(sub)
            for c, v in zip(_SUB_COUNTERS + ("n_updates",), cnt):
                setattr(net, c, int(v))

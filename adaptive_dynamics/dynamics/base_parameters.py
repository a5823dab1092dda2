"""Base (identifiable) parameters, identified numerically (Gautier 1990 style).

Y(q, v, a) has linearly dependent columns for every robot: some parameters never
affect the torque, others only in fixed combinations.  Stacking Y at many random
states and running a rank-revealing QR (column pivoting) picks ``b`` independent
columns ``idx``; the others satisfy ``Y[:, dep] = Y[:, idx] @ beta`` for every state.

* ``projector`` (P x b, a column selection as ARDL's ``getRegressorProjector``):
  ``Y_b = Y @ projector``.
* ``K`` (b x P): ``pi_b = K @ pi``, with ``K[:, idx] = I`` and ``K[:, dep] = beta``.
* Then ``Y_b @ pi_b == Y @ pi`` for every state and every pi.

``columns`` restricts the identification to a subset of the full columns (the
parameters of chosen links, as an adaptive controller that estimates only a tool and
the link carrying it): ``idx`` and ``dep`` are then taken among those columns, ``K``
is zero outside them, and ``Y_b @ pi_b == Y[:, columns] @ pi[columns]``.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg


class BaseParameters:
    def __init__(self, model, *, n_samples: int | None = None, seed: int = 0, rtol: float = 1e-9,
                 columns=None):
        self.model = model
        P, n = model.n_params, model.n
        if columns is None:
            sub = np.arange(P)
        else:
            sub = np.unique(np.asarray(columns, dtype=int).reshape(-1))
            if sub.size == 0 or sub[0] < 0 or sub[-1] >= P:
                raise ValueError(f"columns must be indices in [0, {P}), got {columns!r}")
        self.columns = sub
        if n_samples is None:
            n_samples = max(60, int(np.ceil(4 * sub.size / n)))
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(n_samples):
            q, v, a = model.random_state(rng)
            rows.append(model.regressor(q, v, a)[:, sub])
        A = np.vstack(rows)
        # equilibrate column scales so the rank decision is not dominated by units
        scale = np.linalg.norm(A, axis=0)
        # columns that are zero up to rounding (e.g. 3e-15 where the exact value is 0)
        # must not be equilibrated into unit-norm noise
        nonzero = scale > 1e-10 * scale.max()
        As = A[:, nonzero] / scale[nonzero]
        _, R, piv = scipy.linalg.qr(As, mode="economic", pivoting=True)
        d = np.abs(np.diag(R))
        rank = int(np.sum(d > rtol * max(d[0], 1e-300)))
        cols = np.flatnonzero(nonzero)
        ia = np.sort(cols[piv[:rank]])              # positions in A (= in sub)
        da = np.setdiff1d(np.arange(sub.size), ia)
        beta, *_ = np.linalg.lstsq(A[:, ia], A[:, da], rcond=None)
        beta[np.abs(beta) < 1e-10] = 0.0
        resid = np.abs(A[:, ia] @ beta - A[:, da]).max() if da.size else 0.0
        idx, dep = sub[ia], sub[da]
        if resid > 1e-6 * max(1.0, np.abs(A).max()):
            raise RuntimeError(f"base-parameter identification failed (residual {resid:.3g}); "
                               "increase n_samples or loosen rtol")
        self.index = idx
        self.dependent = dep
        self.beta = beta
        self.n_base = rank
        self.projector = np.zeros((P, rank))
        self.projector[idx, np.arange(rank)] = 1.0
        self.K = np.zeros((rank, P))
        self.K[:, idx] = np.eye(rank)
        self.K[:, dep] = beta
        self.names = self._names(model.parameter_names)

    def _names(self, full):
        names = []
        for j, i in enumerate(self.index):
            terms = [full[i]]
            for k, d in enumerate(self.dependent):
                c = self.beta[j, k]
                if c != 0.0:
                    terms.append(f"{c:+.6g}*{full[d]}")
            names.append(" ".join(terms))
        return names

    def to_base(self, pi) -> np.ndarray:
        return self.K @ np.asarray(pi, dtype=float)

    def from_base(self, pi_b) -> np.ndarray:
        """A full pi with ``to_base(pi) == pi_b`` (dependent entries zero)."""
        return self.projector @ np.asarray(pi_b, dtype=float)

    def regressor(self, Y) -> np.ndarray:
        """Base regressor from a full one: ``Y[:, index]`` (== ``Y @ projector``)."""
        return Y[:, self.index]

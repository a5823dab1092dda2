"""Squared-exponential (RBF) kernel with ARD length scales, batched over independent GPs.

Shared by the exact GP (:mod:`.gp`) and the sparse DTC GP (:mod:`.sparse_gp`).  Every
function works on a stack of ``G`` GPs that share their inputs (the output joints of
one learner, or one group of joints with shared hyperparameters):

    k_g(x, x') = sf2_g * exp(-1/2 * sum_d (x_d - x'_d)^2 / ls_gd^2)      (PGPOL eq. 6)

``ls`` is ``G x d`` (ARD) or ``G x 1`` (one length scale, the paper's kernel),
``sf2`` ``G``.  Hyperparameters are handled in log space by the optimisers.
"""
from __future__ import annotations

import numpy as np
from scipy.special import gammaincc

__all__ = ["scaled", "sqdist", "se_kernel", "se_kernel_grads", "OUTSIDE_CORRELATION", "SPREAD_LEVEL",
           "spread_support"]

#: a query whose kernel correlation k / sf2 with every training (or inducing) input of
#: every GP is below this -- farther than 3 length scales from all of them -- is outside
#: the region the model has data for: its prediction is the prior's (counted by the GP
#: learners as ``n_queries_outside``)
OUTSIDE_CORRELATION = float(np.exp(-4.5))


#: chi^2 tail probability of a query's standardised distance to a GP's training inputs
#: below which the query lies beyond their spread (see :func:`spread_support`)
SPREAD_LEVEL = 1e-3


def spread_support(U: np.ndarray) -> np.ndarray:
    """The second factor of a GP's support (:mod:`.base`): for inputs ``U`` standardised by
    the training set's per-coordinate mean and standard deviation (... x d), the chi^2
    (d degrees of freedom) tail probability of ``|u|^2`` relative to :data:`SPREAD_LEVEL`,
    capped at 1: 1 within the spread of the data, falling continuously to 0 beyond it.  A
    fitted length scale can be long (a window of a smooth trajectory is fitted well by
    an almost linear GP) and the kernel's explained variance then stays high far from
    every sample; this factor keeps the support within the data's own spread."""
    d = U.shape[-1]
    r2 = np.einsum("...d,...d->...", U, U)
    return np.minimum(1.0, gammaincc(0.5 * d, 0.5 * r2) / SPREAD_LEVEL)


def _per_gp(X: np.ndarray, G: int) -> np.ndarray:
    """Inputs shared by every GP (n x d) or per GP (G x n x d), as G x n x d (a view)."""
    return np.broadcast_to(X, (G,) + X.shape[-2:]) if X.ndim == 2 else X


def scaled(X: np.ndarray, ls: np.ndarray) -> np.ndarray:
    """``X / ls`` per GP: X (n x d, or G x n x d), ls (G x d or G x 1) -> G x n x d."""
    return _per_gp(X, ls.shape[0]) / ls[:, None, :]


def sqdist(A: np.ndarray, B: np.ndarray, ls: np.ndarray) -> np.ndarray:
    """Scaled squared distances ``sum_d (a_d - b_d)^2 / ls_gd^2``: G x n x m (>= 0)."""
    As, Bs = scaled(A, ls), scaled(B, ls)
    D = np.einsum("gnd,gnd->gn", As, As)[:, :, None] + np.einsum("gmd,gmd->gm", Bs, Bs)[:, None, :]
    D -= 2.0 * (As @ np.swapaxes(Bs, 1, 2))
    np.maximum(D, 0.0, out=D)
    return D


def se_kernel(A: np.ndarray, B: np.ndarray, ls: np.ndarray, sf2: np.ndarray) -> np.ndarray:
    """Kernel matrices k_g(A, B): G x n x m."""
    K = sqdist(A, B, ls)
    K *= -0.5
    np.exp(K, out=K)
    K *= sf2[:, None, None]
    return K


def se_kernel_grads(A: np.ndarray, B: np.ndarray, ls: np.ndarray, K: np.ndarray, dK: np.ndarray,
                    *, wrt_B: bool = False, symmetric: bool = False):
    """Chain rule of a scalar F through ``K = k(A, B)`` given ``dK = dF/dK`` (G x n x m).

    ``A``, ``B``: n x d / m x d shared by every GP, or G x n x d / G x m x d per GP.
    Returns ``(d_log_ls, d_log_sf2, d_B)``: G x d_ls, G, and (``wrt_B``) G x m x d, the
    gradient with respect to the inputs B (for ``symmetric`` K = k(B, B), both
    arguments move together: twice the one-sided term, dK taken symmetric).
    """
    W = dK * K                                                   # G x n x m
    d_log_sf2 = W.sum(axis=(1, 2))
    G, d_ls = ls.shape
    A3, B3 = _per_gp(A, G), _per_gp(B, G)
    inv2 = 1.0 / ls ** 2                                         # G x d_ls
    # sum_nm W_nm (a_nd - b_md)^2 = sum_n a^2 rowsum + sum_m b^2 colsum - 2 a^T W b
    rs, cs = W.sum(axis=2), W.sum(axis=1)                        # G x n, G x m
    S = (np.einsum("gnd,gn->gd", A3 * A3, rs) + np.einsum("gmd,gm->gd", B3 * B3, cs)
         - 2.0 * np.einsum("gnd,gnm,gmd->gd", A3, W, B3, optimize=True))
    if d_ls == 1:
        d_log_ls = (S * inv2).sum(axis=1, keepdims=True)        # d k / d log l = k r^2 / l^2
    else:
        d_log_ls = S * inv2
    d_B = None
    if wrt_B:
        # d k(a, b) / d b_d = k (a_d - b_d) / l_d^2
        d_B = (np.swapaxes(W, 1, 2) @ A3 - cs[:, :, None] * B3) * inv2[:, None, :]
        if symmetric:
            d_B = 2.0 * d_B
    return d_log_ls, d_log_sf2, d_B

"""Sparse GP regression with the Deterministic Training Conditional (PGPOL eq. 4-5).

With m inducing inputs Z, Kmm = k(Z, Z), Knm = k(X, Z), the DTC likelihood
p(y | f_m) = N(Knm Kmm^-1 f_m, sn2 I) (eq. 4) gives the approximate marginal likelihood

    q(y) = N(0, Q),   Q = Knm Kmm^-1 Kmn + sn2 I                          (eq. 5)

which is maximised over (Z, theta, sn2) -- the inducing inputs are extra kernel
hyperparameters, as in the paper (9 inputs, m = 20: 183 of them) -- with the analytic
gradient, at most ``max_iter`` L-BFGS-B iterations, warm-started from the previous fit.
With A = sn2 Kmm + Kmn Knm (Woodbury) the predictive distribution is

    mean(x) = k_m(x) A^-1 Kmn y,   var(x) = k(x, x) - k_m(x) (Kmm^-1 - sn2 A^-1) k_m(x)^T

(latent f).  Gradient: with W = c Q^-1 - beta beta^T (beta = Q^-1 Y, c columns) and
P = Kmm^-1 Kmn, dF/dKnm = W P^T, dF/dKmm = -P W P^T / 2, dF/dsn2 = tr W / 2,
then through the kernel (:mod:`.gp_kernel`).  Q^-1 and W are never formed: every
product goes through Woodbury's m x m factor -- A = sn2 Kmm + Kmn Knm, factorised as
sn2 Lm (I + B B^T / sn2) Lm^T with B = Lm^-1 Kmn (GPy's form: A itself has Kmm's condition
number squared and fails at hundreds of inducing inputs on densely sampled data) -- so a value and gradient cost
O(n m^2 + n m d) (n = 480 costs ~10x n = 60, not ~64x); every quantity is a stack over the G
independent GPs (one per output joint, or one for all joints with shared
hyperparameters as GPy fits a multi-output Y), never a Python loop over joints.

Everything here works in standardised coordinates; :class:`SparseGP` keeps the
inducing inputs in raw units between fits so a warm start survives a new scaler.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
from scipy.linalg import cho_solve, solve_triangular

from .gp import LOG2PI, Standardiser, hyper_bounds, minimise_nlml
from .gp_kernel import se_kernel, se_kernel_grads

__all__ = ["dtc_nlml", "SparseGP", "JITTER"]

#: added to the diagonal of Kmm (standardised units) for a stable factorisation
JITTER = 1e-8


def _chol_logdet(L: np.ndarray) -> np.ndarray:
    return 2.0 * np.log(np.diagonal(L, axis1=1, axis2=2)).sum(axis=1)


def dtc_nlml(Xs: np.ndarray, Ys: np.ndarray, Z: np.ndarray, ls: np.ndarray, sf2: np.ndarray,
             sn2: np.ndarray, grad: bool = True, jitter: float = JITTER):
    """-log q(y) of G DTC GPs and its gradient.

    ``Xs`` n x d (shared inputs), ``Ys`` G x n x c (c output columns per GP), ``Z`` G x m x d,
    ``ls`` G x d_ls, ``sf2``/``sn2`` G.  Returns ``(F (G,), grads)`` with grads
    ``(d_Z (G x m x d), d_log_ls, d_log_sf2, d_log_sn2)``."""
    G, n, c = Ys.shape
    m = Z.shape[1]
    Kmm_f = se_kernel(Z, Z, ls, sf2)
    Kmm = Kmm_f + jitter * np.eye(m)[None]
    Knm = se_kernel(Xs, Z, ls, sf2)                                      # G x n x m
    Kmn = np.swapaxes(Knm, 1, 2)
    Lm = np.linalg.cholesky(Kmm)
    s2 = sn2[:, None, None]
    # A = sn2 Kmm + Kmn Knm = sn2 Lm Ab Lm^T with Ab = I + B B^T / sn2, B = Lm^-1 Kmn: Ab's
    # eigenvalues are >= 1, where factorising A itself squares Kmm's condition number (at
    # hundreds of inducing inputs on densely sampled data it fails or loses every digit)
    B = solve_triangular(Lm, Kmn, lower=True)                            # G x m x n
    LA = np.linalg.cholesky(np.eye(m)[None] + (B @ np.swapaxes(B, 1, 2)) / s2)

    def solve_A(R):   # A^-1 R
        y = cho_solve((LA, True), solve_triangular(Lm, R, lower=True))
        return solve_triangular(np.swapaxes(Lm, 1, 2), y, lower=False) / s2

    # beta = Q^-1 Y with Q^-1 = (I - Knm A^-1 Kmn) / sn2 (never formed: O(n m^2))
    beta = (Ys - Knm @ solve_A(Kmn @ Ys)) / s2                           # G x n x c
    logdetQ = n * np.log(sn2) + _chol_logdet(LA)                         # det Q = sn2^n det Ab
    F = 0.5 * np.einsum("gnc,gnc->g", Ys, beta) + 0.5 * c * logdetQ + 0.5 * n * c * LOG2PI
    if not grad:
        return F, None
    KK = Kmn @ Knm                                                       # G x m x m
    Pt = np.swapaxes(solve_triangular(np.swapaxes(Lm, 1, 2), B, lower=False), 1, 2)   # P^T = Knm Kmm^-1 = (Lm^-T B)^T
    C = np.swapaxes(cho_solve((Lm, True), KK), 1, 2)                     # Kmn P^T = Kmn Knm Kmm^-1
    QiPt = (Pt - Knm @ solve_A(C)) / s2                                  # Q^-1 P^T
    bP = np.swapaxes(beta, 1, 2) @ Pt                                    # beta^T P^T, c x m
    dKnm = c * QiPt - beta @ bP                                          # W P^T
    dKmm = -0.5 * (c * (np.swapaxes(Pt, 1, 2) @ QiPt) - np.swapaxes(bP, 1, 2) @ bP)   # -P W P^T / 2
    dKmm = 0.5 * (dKmm + np.swapaxes(dKmm, 1, 2))
    # tr Q^-1 = (n - tr(A^-1 KK)) / sn2, tr(A^-1 KK) = tr(Ab^-1 (Ab - I)) = m - tr Ab^-1
    LAi = solve_triangular(LA, np.broadcast_to(np.eye(m), LA.shape), lower=True)
    trQi = (n - m + np.einsum("gij,gij->g", LAi, LAi)) / sn2
    d_ls1, d_sf1, d_Z1 = se_kernel_grads(Xs, Z, ls, Knm, dKnm, wrt_B=True)
    d_ls2, d_sf2_, d_Z2 = se_kernel_grads(Z, Z, ls, Kmm_f, dKmm, wrt_B=True, symmetric=True)
    d_sn2 = 0.5 * sn2 * (c * trQi - np.einsum("gnc,gnc->g", beta, beta))  # sn2 tr(W) / 2
    return F, (d_Z1 + d_Z2, d_ls1 + d_ls2, d_sf1 + d_sf2_, d_sn2)


def _posterior(Kmm: np.ndarray, Knm: np.ndarray, Ys: np.ndarray, sn2: np.ndarray):
    """Prediction weights of the DTC posterior: ``w`` (G x m x c) with mean(x) = k_m(x) w,
    and ``R`` (G x m x m) with var(x) = k(x, x) - k_m(x) R k_m(x)^T.

    In GPy's well-conditioned form: Kmm = Lm Lm^T, B = Lm^-1 Kmn / sn, A = I + B B^T =
    LA LA^T (eigenvalues >= 1), w = Lm^-T A^-1 B Y / sn, R = Kmm^-1 - (Kmm + Kmn Knm /
    sn2)^-1 = Li^T Li - T^T T with Li = Lm^-1, T = LA^-1 Li.  (sn2 Kmm + Kmn Knm,
    factorised directly, squares Kmm's condition number.)"""
    G, m, _ = Kmm.shape
    sn = np.sqrt(sn2)[:, None, None]
    Lm = np.linalg.cholesky(Kmm)
    B = solve_triangular(Lm, np.swapaxes(Knm, 1, 2), lower=True) / sn      # G x m x n
    LA = np.linalg.cholesky(np.eye(m)[None] + B @ np.swapaxes(B, 1, 2))
    c = solve_triangular(LA, B @ Ys / sn, lower=True)                       # G x m x c
    w = solve_triangular(np.swapaxes(Lm, 1, 2), solve_triangular(np.swapaxes(LA, 1, 2), c, lower=False),
                         lower=False)
    Li = solve_triangular(Lm, np.broadcast_to(np.eye(m), Kmm.shape), lower=True)
    T = solve_triangular(LA, Li, lower=True)
    R = np.swapaxes(Li, 1, 2) @ Li - np.swapaxes(T, 1, 2) @ T
    return w, 0.5 * (R + np.swapaxes(R, 1, 2))


class SparseGP:
    """A stack of G DTC GPs over the same inputs (the PGPOL ensemble's member model).

    ``groups``: ``"joint"`` -- one GP per output column (G = output_dim), or
    ``"shared"`` -- one GP for all columns with shared Z and hyperparameters (GPy's
    multi-output regression, the paper's 183 hyperparameters at 9 -> 3).
    ``fit(X, Y)`` standardises X and Y, optimises (Z, theta, sn2) for at most
    ``max_iter`` iterations (``optimize``), warm-started, and factorises; ``predict``
    returns raw-unit mean and latent variance.  ``refit_targets(Y)`` re-solves the
    posterior weights for new targets on the same inputs (same Z, hyperparameters and
    scalers: exactly the DTC posterior of the shifted data); ``restore`` rebuilds a
    fitted model from its data, Z and hyperparameters without optimising.
    """

    def __init__(self, input_dim: int, output_dim: int, *, n_inducing: int = 20, length_scale=1.0,
                 signal_var: float = 1.0, noise_var: float = 0.01, ard: bool = False,
                 groups: str = "joint", optimize: bool = True, max_iter: int = 10, seed: int = 0):
        if groups not in ("joint", "shared"):
            raise ValueError(f"groups must be 'joint' or 'shared', got {groups!r}")
        self.d, self.o = int(input_dim), int(output_dim)
        self.m = int(n_inducing)
        if self.m < 1 or int(max_iter) < 0:
            raise ValueError("n_inducing must be >= 1 and max_iter >= 0")
        self.G = self.o if groups == "joint" else 1
        self.groups = groups
        d_ls = self.d if ard else 1
        self.ls = np.broadcast_to(np.asarray(length_scale, dtype=float), (self.G, d_ls)).copy()
        self.sf2 = np.full(self.G, float(signal_var))
        self.sn2 = np.full(self.G, float(noise_var))
        if not ((self.ls > 0).all() and (self.sf2 > 0).all() and (self.sn2 > 0).all()):
            raise ValueError("length_scale, signal_var and noise_var must be > 0")
        self.optimize = bool(optimize)
        self.max_iter = int(max_iter)
        self.rng = np.random.default_rng(seed)
        self.Z_raw: Optional[np.ndarray] = None      # G x m x d, raw input units
        self.X: Optional[np.ndarray] = None          # training set of the last fit (raw units)
        self.Y: Optional[np.ndarray] = None
        self.snap = None
        self.n_fits = 0

    # -------------------------------------------------------------- internals
    def _group(self, Ys: np.ndarray) -> np.ndarray:
        """n x o standardised targets -> G x n x c."""
        return Ys.T[:, :, None] if self.G == self.o else Ys[None]

    def _init_Z(self, X: np.ndarray) -> np.ndarray:
        idx = self.rng.choice(X.shape[0], size=self.m, replace=X.shape[0] < self.m)
        Z = X[idx] + (1e-3 * self.rng.standard_normal((self.m, self.d)) if X.shape[0] < self.m else 0.0)
        return np.broadcast_to(Z, (self.G, self.m, self.d)).copy()

    def fit(self, X: np.ndarray, Y: np.ndarray, xs=None, ys=None) -> None:
        """Fit to raw X (n x d), Y (n x o); ``xs``/``ys``: the standardisers (default:
        from this data)."""
        xs = xs or Standardiser.fit(X)
        ys = ys or Standardiser.fit(Y)
        Xs, Ys = xs(X), self._group(ys(Y))
        Z = xs(self._init_Z(X) if self.Z_raw is None else self.Z_raw)
        hyper = (self.ls, self.sf2, self.sn2)
        if self.optimize and self.max_iter > 0 and X.shape[0] > 1:
            Z, *hyper = self._optimise(Xs, Ys, Z)
        Z_raw = Z * xs.std + xs.mean
        # factorised from the raw Z exactly as restore() does (a reloaded model is
        # bit-identical); the state changes only once it succeeded (a LinAlgError leaves
        # the previous fit whole)
        snap = self._factorise(Xs, Ys, xs(Z_raw), xs, ys, *hyper)
        self.ls, self.sf2, self.sn2 = hyper
        self.Z_raw, self.X, self.Y, self.snap = Z_raw, X, Y, snap
        self.n_fits += 1

    def restore(self, X: np.ndarray, Y: np.ndarray, Z_raw: np.ndarray, ls, sf2, sn2,
                scalers: Optional[np.ndarray] = None) -> None:
        """A fitted model from its training set, inducing inputs, hyperparameters and
        ``scalers`` (:meth:`scalers`; default: fitted to X, Y as :meth:`fit` does) --
        what :meth:`fit` and :meth:`refit_targets` left -- without optimising: the same
        prediction."""
        Z_raw = np.asarray(Z_raw, dtype=float)
        if Z_raw.shape != (self.G, self.m, self.d) or X.ndim != 2 or X.shape[1] != self.d \
                or Y.shape != (X.shape[0], self.o) or X.shape[0] < 1:
            raise ValueError(f"sparse GP state has shapes Z {Z_raw.shape}, X {X.shape}, Y {Y.shape}; expected Z"
                             f" {(self.G, self.m, self.d)} and n x {self.d}, n x {self.o}")
        hyper = (np.asarray(ls, dtype=float).reshape(self.ls.shape).copy(),
                 np.asarray(sf2, dtype=float).reshape(self.G).copy(),
                 np.asarray(sn2, dtype=float).reshape(self.G).copy())
        if not all(np.isfinite(h).all() and (h > 0).all() for h in hyper) or not np.isfinite(Z_raw).all():
            raise ValueError("sparse GP state: hyperparameters must be finite and > 0, Z finite")
        if scalers is None:
            xs, ys = Standardiser.fit(X), Standardiser.fit(Y)
        else:
            S = np.asarray(scalers, dtype=float)
            d = self.d
            if S.shape != (2, d + self.o) or not np.isfinite(S).all() or (S[1] <= 0).any():
                raise ValueError(f"sparse GP scalers have shape {S.shape} (or bad values); expected"
                                 f" {(2, d + self.o)}")
            xs, ys = Standardiser(S[0, :d], S[1, :d]), Standardiser(S[0, d:], S[1, d:])
        self.snap = self._factorise(xs(X), self._group(ys(Y)), xs(Z_raw), xs, ys, *hyper)
        self.ls, self.sf2, self.sn2 = hyper
        self.Z_raw, self.X, self.Y = Z_raw, X, Y

    def support_inputs(self) -> np.ndarray:
        """The training inputs standardised by the model's input scaler, ``xs(X)`` (n x
        d): the support of a query is set by its distance to the nearest of them
        (:mod:`.pgpol`)."""
        return self.snap[3](self.X)

    def scalers(self) -> np.ndarray:
        """The input and output standardisers of the model in use: 2 x (d + o) (means,
        standard deviations); a consistency shift keeps them, so a saved model needs them."""
        xs, ys = self.snap[3], self.snap[4]
        return np.stack([np.concatenate([xs.mean, ys.mean]), np.concatenate([xs.std, ys.std])])

    def refit_targets(self, Y: np.ndarray) -> None:
        """New targets for the training inputs of the last fit; Z, hyperparameters and
        scalers stay, so the posterior mean is linear in Y (the consistency shift)."""
        Z, _, R, xs, ys, ls, sf2 = self.snap
        Kmm = se_kernel(Z, Z, ls, sf2) + JITTER * np.eye(self.m)[None]
        w, _ = _posterior(Kmm, se_kernel(xs(self.X), Z, ls, sf2), self._group(ys(Y)), self.sn2)
        self.Y = Y
        self.snap = (Z, w, R, xs, ys, ls, sf2)

    def _optimise(self, Xs, Ys, Z) -> np.ndarray:
        G, m, d = Z.shape
        d_ls = self.ls.shape[1]
        nz, nl = G * m * d, G * d_ls

        def unpack(t):
            return (t[:nz].reshape(G, m, d), np.exp(t[nz: nz + nl]).reshape(G, d_ls),
                    np.exp(t[nz + nl: nz + nl + G]), np.exp(t[nz + nl + G:]))

        def f(t):
            F, (gZ, gl, gs, gn) = dtc_nlml(Xs, Ys, *unpack(t))
            return float(F.sum()), np.concatenate([gZ.ravel(), gl.ravel(), gs, gn])

        t0 = np.concatenate([Z.ravel(), np.log(self.ls).ravel(), np.log(self.sf2), np.log(self.sn2)])
        bounds = [(None, None)] * nz + hyper_bounds(d, nl, G)
        lo = np.array([-np.inf if b[0] is None else b[0] for b in bounds])
        hi = np.array([np.inf if b[1] is None else b[1] for b in bounds])
        t0 = np.clip(t0, lo, hi)
        return unpack(minimise_nlml(f, t0, bounds, self.max_iter))

    @staticmethod
    def _factorise(Xs, Ys, Z, xs, ys, ls, sf2, sn2) -> tuple:
        """The prediction snapshot ``(Z, w, R, xs, ys, ls, sf2)``."""
        Kmm = se_kernel(Z, Z, ls, sf2) + JITTER * np.eye(Z.shape[1])[None]
        w, R = _posterior(Kmm, se_kernel(Xs, Z, ls, sf2), Ys, sn2)
        return (Z, w, R, xs, ys, ls.copy(), sf2.copy())

    def predict(self, X: np.ndarray, return_var: bool = False):
        """Mean (N x o) and latent variance (N x o) in raw units."""
        Z, w, R, xs, ys, ls, sf2 = self.snap
        Ks = se_kernel(xs(X), Z, ls, sf2)                                  # G x N x m
        M = Ks @ w                                                         # G x N x c
        mean = (M[:, :, 0].T if self.G == self.o else M[0]) * ys.std + ys.mean
        if not return_var:
            return mean, None
        v = np.maximum(sf2[:, None] - np.einsum("gnm,gmk,gnk->gn", Ks, R, Ks), 0.0)   # G x N
        var_s = v.T if self.G == self.o else np.repeat(v.T, self.o, axis=1)
        return mean, var_s * ys.std ** 2

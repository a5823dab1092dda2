"""Consistency transforms: the state Jacobian of Y(x) dpi against the dynamics core and
finite differences; the Gaussian transform exact for affine shifts and first-order
(mean error O(eps^2)) for the robot's; the paper's Fig. 2 sine example; a transformed
GMM against one learnt on the transformed data (brute force); the RBF network's
transform equal to retraining on the shifted targets; composition and no-ops."""
from __future__ import annotations

import os
import tempfile
import time

import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import IncrementalGMM, ParameterChange, RBFNetwork, transform_gaussians
from adaptive_dynamics.learning.consistency import linearised_shift


def _points(rm, K, seed=0):
    rng = np.random.default_rng(seed)
    return np.array([np.concatenate(rm.random_state(rng)) for _ in range(K)])


@pytest.mark.parametrize("robot,friction", [("panda", False), ("planar2", True)])
def test_parameter_change_jacobian(robot, friction):
    rm = RobotModel(robot, friction=friction, coulomb_smoothing=0.05 if friction else 0.0)
    n = rm.n
    X = _points(rm, 6)
    rng = np.random.default_rng(1)
    cases = {"random (non-physical)": rng.standard_normal(rm.n_params),
             "physical": 0.5 * rm.parameters, "tiny": 1e-9 * rng.standard_normal(rm.n_params)}
    ev = ParameterChange.for_model(rm)
    assert ParameterChange.for_model(rm) is ev
    for name, dpi in cases.items():
        ev.set(dpi)
        g, J = ev.jacobians(X)
        g2 = ev.values(X[:, :n], X[:, n:2 * n], X[:, 2 * n:])
        for k, x in enumerate(X):
            q, v, a = x[:n], x[n:2 * n], x[2 * n:]
            ref_g = rm.regressor(q, v, a) @ dpi
            scale = np.abs(ref_g).max()
            np.testing.assert_allclose(g[k], ref_g, atol=1e-11 * scale, err_msg=name)
            np.testing.assert_allclose(g2[k], ref_g, atol=1e-11 * scale, err_msg=name)
            dq, dv, da = rm.regressor_derivatives(q, v, a, dpi)
            ref_J = np.hstack([dq, dv, da])
            # the core's reference loses digits for a tiny dpi (it shifts by a unit ball)
            tol = 1e-5 if name == "tiny" else 1e-10
            np.testing.assert_allclose(J[k], ref_J, atol=tol * np.abs(ref_J).max(), err_msg=name)
            # central differences of Y(x) dpi
            h = 1e-6
            fd = np.empty((n, 3 * n))
            for j in range(3 * n):
                e = np.zeros(3 * n)
                e[j] = h
                xp, xm = x + e, x - e
                fd[:, j] = (rm.regressor(xp[:n], xp[n:2 * n], xp[2 * n:]) @ dpi
                            - rm.regressor(xm[:n], xm[n:2 * n], xm[2 * n:]) @ dpi) / (2 * h)
            np.testing.assert_allclose(J[k], fd, atol=1e-5 * np.abs(ref_J).max() + 1e-300, err_msg=name)


def test_parameter_change_cached_ball_terms_and_mirrored_mass_matrix():
    """Ball terms kept from the previous call (same rows), refreshed where a row moved,
    and the mirrored lower triangle of dtau/da, all equal a fresh evaluator's result."""
    rm = RobotModel("panda")
    X = _points(rm, 8, seed=3)
    rng = np.random.default_rng(4)
    ev = ParameterChange(rm, compiled=False)
    compiled = ParameterChange(rm)
    assert ev.shift.implementation == "pinocchio"
    for step in range(3):
        dpi = rng.standard_normal(rm.n_params)
        if step == 2:
            X = X.copy()
            X[5] += 0.01  # one component mean moved
        g, J = ev.set(dpi).jacobians(X)
        fresh = ParameterChange(rm, compiled=False)
        fresh.shift.fills_lower = False  # force the mirroring path
        g0, J0 = fresh.set(dpi).jacobians(X)
        np.testing.assert_allclose(g, g0, rtol=0, atol=1e-11 * np.abs(g0).max())
        np.testing.assert_allclose(J, J0, rtol=0, atol=1e-11 * np.abs(J0).max())
        # the compiled evaluator (dpi used directly, no ball shift) gives the same numbers
        if compiled.shift.implementation == "compiled":
            g1, J1 = compiled.set(dpi).jacobians(X)
            np.testing.assert_allclose(g1, g0, rtol=0, atol=1e-11 * np.abs(g0).max())
            np.testing.assert_allclose(J1, J0, rtol=0, atol=1e-11 * np.abs(J0).max())


def test_gaussian_transform_exact_for_affine_shift():
    rng = np.random.default_rng(0)
    K, i, o = 3, 4, 2
    A = rng.standard_normal((K, i + o, i + o))
    covs = A @ np.swapaxes(A, 1, 2) + 0.1 * np.eye(i + o)
    means = rng.standard_normal((K, i + o))
    Jm, c = rng.standard_normal((o, i)), rng.standard_normal(o)
    g = means[:, :i] @ Jm.T + c
    J = np.broadcast_to(Jm, (K, o, i))
    m2, C2 = transform_gaussians(means, covs, i, g, J)
    T = np.block([[np.eye(i), np.zeros((i, o))], [-Jm, np.eye(o)]])
    for k in range(K):       # y' = y - (J x + c) is linear: moments transform exactly
        np.testing.assert_allclose(m2[k], T @ means[k] - np.r_[np.zeros(i), c], atol=1e-12)
        np.testing.assert_allclose(C2[k], T @ covs[k] @ T.T, atol=1e-12)
        # positive definite, Sigma_ii and the conditional covariance unchanged
        assert np.linalg.eigvalsh(C2[k]).min() > 0
        np.testing.assert_allclose(C2[k][:i, :i], covs[k][:i, :i])
        cond = lambda S: S[i:, i:] - S[i:, :i] @ np.linalg.solve(S[:i, :i], S[:i, i:])  # noqa: E731
        np.testing.assert_allclose(cond(C2[k]), cond(covs[k]), atol=1e-10)


def test_gaussian_transform_is_first_order_for_the_robot():
    """Moments of the exactly shifted samples (x, y - Y(x) dpi) versus the transformed
    moments of the samples: the mismatch is the Taylor remainder, so shrinking the
    component by 2 shrinks the mean error ~4x and the covariance error ~8x."""
    rm = RobotModel("planar2")
    n, i = rm.n, 3 * rm.n
    dpi = 0.5 * rm.parameters
    ev = ParameterChange.for_model(rm).set(dpi)
    rng = np.random.default_rng(5)
    x0 = np.concatenate(rm.random_state(rng))
    B = rng.standard_normal((i + n, i + n))
    base = B @ B.T / (i + n)
    errs = []
    for eps in (0.1, 0.05, 0.025):
        Z = rng.multivariate_normal(np.r_[x0, np.zeros(n)], eps ** 2 * base, size=4000)
        mu, C = Z.mean(0), np.cov(Z.T)
        g, J = ev.jacobians(mu[:i][None])
        m2, C2 = transform_gaussians(mu[None], C[None], i, g, J)
        Zs = Z.copy()
        Zs[:, i:] -= ev.values(Z[:, :n], Z[:, n:2 * n], Z[:, 2 * n:i])
        errs.append((np.abs(Zs.mean(0) - m2[0]).max(), np.abs(np.cov(Zs.T) - C2[0]).max()))
    errs = np.array(errs)
    assert np.all(errs[1:, 0] / errs[:-1, 0] < 0.35), errs   # O(eps^2)
    assert np.all(errs[1:, 1] / errs[:-1, 1] < 0.2), errs    # O(eps^3)


def test_fig2_sine_example():
    """Consistency paper Fig. 2: a GMM learnt on sin(x), then the function changes to
    0.2 sin(x) (a shift g = 0.8 sin).  No learning: the mean shift alone leaves the
    components' slopes wrong; mean + covariance transform follows the new function."""
    x = np.linspace(-np.pi, np.pi, 3000)
    L = IncrementalGMM(1, 1, max_components=20, scale=[1.8, 0.7])
    L.partial_fit(x[:, None], np.sin(x)[:, None])
    xt = np.linspace(-3, 3, 500)[:, None]
    assert np.sqrt(np.mean((L.predict(xt)[:, 0] - np.sin(xt[:, 0])) ** 2)) < 0.02
    shift = lambda z: np.array([0.8 * np.sin(z[0])])  # noqa: E731
    g, J = linearised_shift(shift, L.input_means())
    full = _clone(L)
    full.apply_output_shift(g, J)
    mo = _clone(L)
    mo.apply_output_shift(g, np.zeros_like(J))
    target = 0.2 * np.sin(xt[:, 0])
    e_full = np.sqrt(np.mean((full.predict(xt)[:, 0] - target) ** 2))
    e_mean = np.sqrt(np.mean((mo.predict(xt)[:, 0] - target) ** 2))
    e_none = np.sqrt(np.mean((L.predict(xt)[:, 0] - target) ** 2))
    assert e_full < 0.25 * e_mean < 0.25 * e_none, (e_full, e_mean, e_none)
    assert e_full < 0.02


def _clone(L):
    with tempfile.TemporaryDirectory() as d:
        return type(L).load(L.save(os.path.join(d, "m")))


def _planar2_data(rm, T=30.0, dt=0.01):
    t = np.arange(0.0, T, dt)
    q = np.column_stack([0.7 * np.sin(0.6 * t) + 0.2 * np.sin(1.7 * t), 0.8 * np.cos(0.45 * t)])
    v = np.column_stack([0.42 * np.cos(0.6 * t) + 0.34 * np.cos(1.7 * t), -0.36 * np.sin(0.45 * t)])
    a = np.column_stack([-0.252 * np.sin(0.6 * t) - 0.578 * np.sin(1.7 * t), -0.162 * np.cos(0.45 * t)])
    X = np.hstack([q, v, a])
    tau = np.array([rm.inverse_dynamics(x[:2], x[2:4], x[4:]) for x in X])
    return X, tau


def test_gmm_transform_vs_gmm_learnt_on_transformed_data():
    """Brute force: learn tau with the parametric model at 0 pi, transform by
    dpi = 0.5 pi, and compare with a GMM learnt directly on tau - Y (0.5 pi)."""
    rm = RobotModel("planar2")
    X, tau = _planar2_data(rm)
    dpi = 0.5 * rm.parameters
    shifted = tau - 0.5 * tau                     # Y (0.5 pi) = 0.5 tau for this rigid body
    tr, te = slice(0, None, 3), slice(1, None, 3)
    L = IncrementalGMM(6, 2, max_components=32).set_prediction(raw=True)
    L.partial_fit(X[tr], tau[tr])
    before = L.predict(X[te])
    L.apply_parameter_update(dpi, rm)
    assert L.n_transforms == 1
    brute = IncrementalGMM(6, 2, max_components=32).set_prediction(raw=True)
    brute.partial_fit(X[tr], shifted[tr])
    e_tr = np.sqrt(np.mean((L.predict(X[te]) - shifted[te]) ** 2, axis=0))
    e_brute = np.sqrt(np.mean((brute.predict(X[te]) - shifted[te]) ** 2, axis=0))
    e_none = np.sqrt(np.mean((before - shifted[te]) ** 2, axis=0))
    # the transform removes > 97 % of the inconsistency; what is left is its first-order
    # (Taylor) error, a few times the error of relearning from scratch (2.7 % / 11 % of
    # the target's standard deviation on joint 1 here)
    assert np.all(e_tr < 0.03 * e_none), (e_tr, e_none)
    assert np.all(e_tr < 6.0 * e_brute), (e_tr, e_brute)


def test_transforms_compose_and_zero_is_noop():
    rm = RobotModel("planar2")
    X, tau = _planar2_data(rm, T=12.0)
    rng = np.random.default_rng(0)
    d1, d2 = 0.1 * rng.standard_normal(rm.n_params), 0.1 * rng.standard_normal(rm.n_params)
    for make in (lambda: IncrementalGMM(6, 2, max_components=16),
                 lambda: RBFNetwork(6, 2, n_basis=64, low=X.min(0), high=X.max(0), n_params=rm.n_params)):
        A, B = make(), make()
        A.partial_fit(X[::2], tau[::2], model=rm)
        B.partial_fit(X[::2], tau[::2], model=rm)
        p0 = A.predict(X[1::2])
        A.apply_parameter_update(np.zeros(rm.n_params), rm)
        np.testing.assert_array_equal(A.predict(X[1::2]), p0)
        assert A.n_transforms == 0
        A.apply_parameter_update(d1, rm)
        A.apply_parameter_update(d2, rm)
        B.apply_parameter_update(d1 + d2, rm)
        np.testing.assert_allclose(A.predict(X[1::2]), B.predict(X[1::2]), rtol=1e-9, atol=1e-9)
        with pytest.raises(ValueError, match="delta_pi"):
            A.apply_parameter_update(d1[:-1], rm)
        with pytest.raises(ValueError, match="delta_pi"):
            A.apply_parameter_update(np.full(rm.n_params, np.nan), rm)


@pytest.mark.parametrize("forgetting", [1.0, 0.995])
def test_rbfn_transform_equals_retraining(forgetting):
    """ARDL eq. 13-14: with dW/dpi carried through the RLS, a transform by dpi gives
    exactly the network trained on y - Y dpi (same samples, same order)."""
    rm = RobotModel("planar2")
    X, tau = _planar2_data(rm, T=20.0)
    rng = np.random.default_rng(1)
    pi_hat = rm.parameters * (1 + 0.3 * rng.standard_normal(rm.n_params))
    Ys = np.array([rm.regressor(x[:2], x[2:4], x[4:]) for x in X])
    y = tau - Ys @ pi_hat                         # residual target with the current estimate
    dpi = 0.2 * rng.standard_normal(rm.n_params)
    kw = dict(n_basis=128, low=X.min(0), high=X.max(0), width=0.4, n_params=rm.n_params, forgetting=forgetting,
              standardize=False)
    A = RBFNetwork(6, 2, **kw).set_prediction(raw=True)
    A.partial_fit(X[::2], y[::2], regressors=Ys[::2])
    old = A.predict(X)
    A.apply_parameter_update(dpi, rm)
    B = RBFNetwork(6, 2, **kw).set_prediction(raw=True)
    B.partial_fit(X[::2], (y - Ys @ dpi)[::2], model=rm)      # Y evaluated from x this time
    np.testing.assert_allclose(A.W, B.W, rtol=1e-7, atol=1e-9 * np.abs(B.W).max())
    np.testing.assert_allclose(A.predict(X), B.predict(X), rtol=1e-7, atol=1e-8 * np.abs(y).max())
    # in the learnt region the prediction moved by about -Y(x) dpi
    moved = A.predict(X[1::2]) - old[1::2]
    expect = -(Ys[1::2] @ dpi)
    assert np.sqrt(np.mean((moved - expect) ** 2)) < 0.05 * np.sqrt(np.mean(expect ** 2))


def test_rbfn_transform_with_standardised_targets_is_exact_in_its_scaling():
    """With target standardisation (the default) the scaling is fixed by the warm-up;
    a transform by dpi gives exactly the network trained on (y - Y dpi) in that scaling
    (a plain network on (y - Y dpi - mean) / std), whose prediction it returns in the
    torque's units -- and the warm-up buffer itself is moved when dpi comes before it
    is learnt."""
    rm = RobotModel("planar2")
    X, tau = _planar2_data(rm, T=20.0)
    rng = np.random.default_rng(2)
    Ys = np.array([rm.regressor(x[:2], x[2:4], x[4:]) for x in X])
    y = tau - Ys @ (rm.parameters * (1 + 0.3 * rng.standard_normal(rm.n_params)))
    dpi = 0.2 * rng.standard_normal(rm.n_params)
    A = RBFNetwork(6, 2, n_basis=128, width=0.4, n_params=rm.n_params, warmup=100).set_prediction(raw=True)
    A.partial_fit(X[:60], y[:60], regressors=Ys[:60])
    assert not A.ready
    A.apply_parameter_update(dpi, rm)                            # still in the warm-up buffer
    A.partial_fit(X[60::2], (y - Ys @ dpi)[60::2], regressors=Ys[60::2])
    A.apply_parameter_update(dpi, rm)
    target = y - 2.0 * (Ys @ dpi)         # every sample: one dpi before it was learnt, one after
    mu, sd = A.y_mean, A.y_scale
    B = RBFNetwork(6, 2, n_basis=128, width=0.4, n_params=rm.n_params, low=A.low, high=A.high, standardize=False).set_prediction(raw=True)
    idx = np.r_[0:60, 60:len(X):2]
    B.partial_fit(X[idx], (target[idx] - mu) / sd, regressors=Ys[idx] / sd[None, :, None])
    np.testing.assert_allclose(A.W, B.W, rtol=1e-7, atol=1e-9 * np.abs(B.W).max())
    np.testing.assert_allclose(A.predict(X), mu + sd * B.predict(X), rtol=1e-7, atol=1e-8 * np.abs(y).max())


def test_rbfn_transform_needs_sensitivity():
    rm = RobotModel("planar2")
    net = RBFNetwork(6, 2, n_basis=16)
    with pytest.raises(ValueError, match="n_params"):
        net.apply_parameter_update(np.ones(rm.n_params), rm)
    net2 = RBFNetwork(6, 2, n_basis=16, n_params=rm.n_params)
    with pytest.raises(ValueError, match="regressors"):
        net2.partial_fit(np.zeros((3, 6)), np.zeros((3, 2)))


def test_gmm_transform_cost_64_components_panda():
    """64 components on the Panda: well under the 2 ms budget of bench/learners.py
    (checked here with slack for a loaded machine)."""
    rm = RobotModel("panda")
    X = _points(rm, 64, seed=2)
    rng = np.random.default_rng(0)
    Y = rng.standard_normal((64, 7))
    L = IncrementalGMM.from_mixture(np.ones(64), np.hstack([X, Y]), np.tile(np.eye(28), (64, 1, 1)) * 0.1, 21)
    dpi = 1e-3 * rng.standard_normal(rm.n_params)
    L.apply_parameter_update(dpi, rm)           # warm the per-point cache
    best = np.inf
    for _ in range(5):
        t0 = time.perf_counter()
        L.apply_parameter_update(dpi, rm)
        best = min(best, time.perf_counter() - t0)
    assert best < 10e-3, best

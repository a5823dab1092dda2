"""Gaussian-process learners (PGPOL sec. II-A): the exact GP against scikit-learn and GPy,
the sparse DTC GP (eq. 4-5) against GPy's DTC inference and the exact GP, analytic
gradients against finite differences."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import Learner, make_learner
from adaptive_dynamics.learning.gp import ExactGP, Standardiser, nlml_exact
from adaptive_dynamics.learning.sparse_gp import SparseGP, dtc_nlml


def _data(n=40, d=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.uniform(-2, 2, (n, d))
    Y = np.c_[np.sin(X[:, 0]) + X[:, 1], 3 * np.cos(X[:, 2]) + 10]
    return X, Y + 0.01 * rng.standard_normal(Y.shape)


def _gpy():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import GPy
    return GPy


def test_exact_gp_equals_scikit_learn():
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    X, Y = _data(60)
    ls, sf2, sn2 = [0.7, 1.3, 2.0], 1.5, 0.05
    gp = ExactGP(3, 2, length_scale=ls, signal_var=sf2, noise_var=sn2).set_prediction(raw=True).partial_fit(X, Y)
    Xq = np.random.default_rng(1).uniform(-2, 2, (7, 3))
    mean, var = gp.predict(Xq, return_var=True)
    xs, ys = Standardiser.fit(X), Standardiser.fit(Y)
    for j in range(2):
        sk = GaussianProcessRegressor(ConstantKernel(sf2, "fixed") * RBF(ls, "fixed"), alpha=sn2, optimizer=None)
        sk.fit(xs(X), ys(Y)[:, j])
        m, s = sk.predict(xs(Xq), return_std=True)
        np.testing.assert_allclose(mean[:, j], ys.mean[j] + ys.std[j] * m, rtol=0, atol=1e-10)
        np.testing.assert_allclose(var[:, j], ys.std[j] ** 2 * s ** 2, rtol=0, atol=1e-10)


def test_exact_gp_with_a_zero_prior_mean_equals_scikit_learn_on_raw_targets():
    """``prior_mean="zero"`` (SCQP's GP on the rigid-body prior): scikit-learn's GP on the
    uncentred targets with the signal and noise variances in their units; far from the
    data it returns 0 where ``"data"`` returns the targets' mean."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    X, Y = _data(60)
    ls, sf2, sn2 = [0.7, 1.3, 2.0], 1.5, 0.05
    gp = ExactGP(3, 2, length_scale=ls, signal_var=sf2, noise_var=sn2, prior_mean="zero")
    gp.set_prediction(raw=True).partial_fit(X, Y)
    Xq = np.random.default_rng(1).uniform(-2, 2, (7, 3))
    mean, var = gp.predict(Xq, return_var=True)
    xs = Standardiser.fit(X)
    rms = np.sqrt(np.mean(Y * Y, axis=0))
    for j in range(2):
        c = rms[j] ** 2
        sk = GaussianProcessRegressor(ConstantKernel(sf2 * c, "fixed") * RBF(ls, "fixed"), alpha=sn2 * c,
                                      optimizer=None, normalize_y=False)
        sk.fit(xs(X), Y[:, j])
        m, sd = sk.predict(xs(Xq), return_std=True)
        np.testing.assert_allclose(mean[:, j], m, rtol=0, atol=1e-9)
        np.testing.assert_allclose(var[:, j], sd ** 2, rtol=1e-9, atol=1e-10)
    far = np.full((1, 3), 50.0)
    np.testing.assert_allclose(gp.predict(far), 0.0, atol=1e-9)
    data = ExactGP(3, 2, length_scale=ls, signal_var=sf2, noise_var=sn2).set_prediction(raw=True).partial_fit(X, Y)
    np.testing.assert_allclose(data.predict(far)[0], Y.mean(axis=0), atol=1e-9)
    assert ExactGP.from_bytes(gp.to_bytes()).prior_mean == "zero"
    with pytest.raises(ValueError, match="prior_mean"):
        ExactGP(3, 2, prior_mean="window")


def test_exact_marginal_likelihood_and_gradient_equal_gpy_and_finite_differences():
    GPy = _gpy()
    X, Y = _data(30)
    Xs, Ys = Standardiser.fit(X)(X), Standardiser.fit(Y)(Y)
    ls, sf2, sn2 = np.array([0.7, 1.3, 2.0]), 1.5, 0.05
    F, (g_ls, g_sf2, g_sn2) = nlml_exact(Xs, Ys[:, :1], ls[None], np.array([sf2]), np.array([sn2]))
    m = GPy.models.GPRegression(Xs, Ys[:, :1], GPy.kern.RBF(3, variance=sf2, lengthscale=ls, ARD=True),
                                noise_var=sn2)
    assert F[0] == pytest.approx(-m.log_likelihood(), rel=1e-6)
    # GPy: d log-likelihood / d parameter; ours: d (-log-likelihood) / d log parameter
    np.testing.assert_allclose(g_ls[0], -m.kern.lengthscale.gradient * ls, rtol=1e-5)
    assert g_sf2[0] == pytest.approx(-m.kern.variance.gradient[0] * sf2, rel=1e-5)
    assert g_sn2[0] == pytest.approx(-m.likelihood.variance.gradient[0] * sn2, rel=1e-5)
    # two GPs at once (different hyperparameters), one length scale each, by differences
    ls2, sf, sn = np.array([[0.8], [1.4]]), np.array([1.2, 0.8]), np.array([0.05, 0.1])
    _, (a, b, c) = nlml_exact(Xs, Ys, ls2, sf, sn)
    f = lambda *h: nlml_exact(Xs, Ys, *h, grad=False)[0]
    h = 1e-6
    for g in range(2):
        e = np.exp(h * (np.arange(2) == g))
        assert (f(ls2 * e[:, None], sf, sn) - f(ls2 / e[:, None], sf, sn))[g] / (2 * h) == pytest.approx(a[g, 0], rel=1e-6)
        assert (f(ls2, sf * e, sn) - f(ls2, sf / e, sn))[g] / (2 * h) == pytest.approx(b[g], rel=1e-6)
        assert (f(ls2, sf, sn * e) - f(ls2, sf, sn / e))[g] / (2 * h) == pytest.approx(c[g], rel=1e-6)


def test_dtc_marginal_likelihood_and_gradient_equal_gpy():
    GPy = _gpy()
    X, Y = _data(30)
    Z = np.random.default_rng(3).standard_normal((5, 3))
    ls, sf2, sn2 = 1.1, 1.5, 0.05
    m = GPy.core.SparseGP(X, Y[:, :1], Z.copy(), GPy.kern.RBF(3, variance=sf2, lengthscale=ls),
                          GPy.likelihoods.Gaussian(variance=sn2),
                          inference_method=GPy.inference.latent_function_inference.DTC())
    F, (gZ, g_ls, g_sf2, g_sn2) = dtc_nlml(X, Y[None, :, :1], Z[None], np.array([[ls]]), np.array([sf2]),
                                           np.array([sn2]), jitter=0.0)
    assert F[0] == pytest.approx(-m.log_likelihood(), rel=1e-9)
    np.testing.assert_allclose(gZ[0], -m.Z.gradient, rtol=1e-6, atol=1e-9)
    assert g_ls[0, 0] == pytest.approx(-m.kern.lengthscale.gradient[0] * ls, rel=1e-6)
    assert g_sf2[0] == pytest.approx(-m.kern.variance.gradient[0] * sf2, rel=1e-6)
    assert g_sn2[0] == pytest.approx(-m.likelihood.variance.gradient[0] * sn2, rel=1e-6)


def test_dtc_likelihood_with_many_inducing_inputs_on_dense_data():
    """Hundreds of inducing inputs on densely sampled data (Kmm's condition number ~1e9 at
    the jitter): the likelihood equals the dense computation of N(0, Q), where a factorisation
    of sn2 Kmm + Kmn Knm (Kmm's condition number squared) fails."""
    from scipy.linalg import cho_factor, cho_solve

    from adaptive_dynamics.learning.gp_kernel import se_kernel
    from adaptive_dynamics.learning.sparse_gp import JITTER

    n, m = 1200, 120
    X = np.linspace(0.0, 6.0, n)[:, None]
    Y = np.sin(2 * X) + 0.01 * np.random.default_rng(0).standard_normal((n, 1))
    Z = np.linspace(0.0, 6.0, m)[None, :, None]
    ls, sf2, sn2 = np.array([[1.0]]), np.array([1.0]), np.array([1e-4])
    F, (_, g_ls, _, g_sn2) = dtc_nlml(X, Y[None], Z, ls, sf2, sn2)
    Kmm = se_kernel(Z, Z, ls, sf2)[0] + JITTER * np.eye(m)
    assert np.linalg.cond(Kmm) > 1e8
    Knm = se_kernel(X, Z, ls, sf2)[0]
    w, V = np.linalg.eigh(Kmm)
    Q = (Knm @ V) @ np.diag(1.0 / w) @ (Knm @ V).T + sn2[0] * np.eye(n)
    c = cho_factor(Q, lower=True)
    ref = 0.5 * Y[:, 0] @ cho_solve(c, Y[:, 0]) + np.log(np.diag(c[0])).sum() + 0.5 * n * np.log(2 * np.pi)
    assert F[0] == pytest.approx(ref, rel=1e-9)
    f = lambda ls, sn2: dtc_nlml(X, Y[None], Z, ls, sf2, sn2, grad=False)[0][0]
    e = np.exp(1e-4)   # the gradient goes through P = Kmm^-1 Kmn: a few digits fewer
    assert g_ls[0, 0] == pytest.approx((f(ls * e, sn2) - f(ls / e, sn2)) / 2e-4, rel=1e-3)
    assert g_sn2[0] == pytest.approx((f(ls, sn2 * e) - f(ls, sn2 / e)) / 2e-4, rel=1e-3)


def test_dtc_gradient_finite_differences_ard_two_gps():
    X, Y = _data(25)
    rng = np.random.default_rng(4)
    Yg = Y.T[:, :, None]
    Z = rng.standard_normal((2, 6, 3))
    ls, sf2, sn2 = np.array([[0.8, 1.2, 2.0], [1.5, 0.9, 1.1]]), np.array([1.2, 0.8]), np.array([0.05, 0.1])
    _, (gZ, gl, gs, gn) = dtc_nlml(X, Yg, Z, ls, sf2, sn2)
    f = lambda Z, ls, sf2, sn2: dtc_nlml(X, Yg, Z, ls, sf2, sn2, grad=False)[0].sum()
    h = 1e-6
    for idx in [(0, 0, 0), (1, 5, 2), (0, 3, 1)]:
        Zp, Zm = Z.copy(), Z.copy()
        Zp[idx] += h
        Zm[idx] -= h
        assert (f(Zp, ls, sf2, sn2) - f(Zm, ls, sf2, sn2)) / (2 * h) == pytest.approx(gZ[idx], rel=1e-5, abs=1e-6)
    for idx in [(0, 0), (1, 2)]:
        lp, lm = ls.copy(), ls.copy()
        lp[idx] *= np.exp(h)
        lm[idx] *= np.exp(-h)
        assert (f(Z, lp, sf2, sn2) - f(Z, lm, sf2, sn2)) / (2 * h) == pytest.approx(gl[idx], rel=1e-5, abs=1e-6)
    e = np.exp(h * np.array([0.0, 1.0]))
    assert (f(Z, ls, sf2 * e, sn2) - f(Z, ls, sf2 / e, sn2)) / (2 * h) == pytest.approx(gs[1], rel=1e-5)
    assert (f(Z, ls, sf2, sn2 * e) - f(Z, ls, sf2, sn2 / e)) / (2 * h) == pytest.approx(gn[1], rel=1e-5)


def test_sparse_equals_exact_with_inducing_inputs_at_the_data():
    X, Y = _data(40)
    sp = SparseGP(3, 2, n_inducing=40, length_scale=1.0, noise_var=0.05, optimize=False)
    sp.Z_raw = np.broadcast_to(X, (2, 40, 3)).copy()
    sp.fit(X, Y)
    ex = ExactGP(3, 2, length_scale=1.0, noise_var=0.05, ard=False).set_prediction(raw=True).partial_fit(X, Y)
    Xq = np.random.default_rng(2).uniform(-2, 2, (6, 3))
    m1, v1 = sp.predict(Xq, True)
    m2, v2 = ex.predict(Xq, return_var=True)
    np.testing.assert_allclose(m1, m2, rtol=0, atol=1e-6)
    np.testing.assert_allclose(v1, v2, rtol=0, atol=1e-6)
    xs, ys = Standardiser.fit(X), Standardiser.fit(Y)
    F, _ = dtc_nlml(xs(X), ys(Y).T[:, :, None], np.broadcast_to(xs(X), (2, 40, 3)), np.ones((2, 1)),
                    np.ones(2), np.full(2, 0.05), grad=False)
    np.testing.assert_allclose(F, -ex.log_marginal_likelihood(), rtol=1e-6)


def test_sparse_fit_optimises_and_predicts():
    X, Y = _data(80)
    sp = SparseGP(3, 2, n_inducing=12, max_iter=30)
    xs, ys = Standardiser.fit(X), Standardiser.fit(Y)
    Z0 = xs(sp._init_Z(X))
    sp.Z_raw = None
    sp.rng = np.random.default_rng(0)
    F0 = dtc_nlml(xs(X), ys(Y).T[:, :, None], Z0, sp.ls, sp.sf2, sp.sn2, grad=False)[0].sum()
    sp.fit(X, Y)
    Z = xs(sp.Z_raw)
    F1 = dtc_nlml(xs(X), ys(Y).T[:, :, None], Z, sp.ls, sp.sf2, sp.sn2, grad=False)[0].sum()
    assert F1 < F0
    Xq, Yq = _data(50, seed=9)
    nmse = ((sp.predict(Xq)[0] - Yq) ** 2).mean(0) / Yq.var(0)
    assert (nmse < 0.05).all(), nmse


def test_exact_gp_mean_gradient_finite_differences():
    X, Y = _data(50)
    gp = ExactGP(3, 2, length_scale=[0.8, 1.1, 1.6], noise_var=0.02).set_prediction(raw=True).partial_fit(X, Y)
    rng = np.random.default_rng(5)
    Xq = rng.uniform(-2, 2, (4, 3))
    G = gp.mean_gradient(Xq)
    assert G.shape == (4, 2, 3)
    np.testing.assert_allclose(gp.mean_gradient(Xq[1]), G[1])
    h = 1e-6
    for k in range(3):
        e = np.zeros(3)
        e[k] = h
        fd = (gp.predict(Xq + e) - gp.predict(Xq - e)) / (2 * h)
        np.testing.assert_allclose(G[:, :, k], fd, rtol=1e-6, atol=1e-7)


def test_exact_gp_hyperparameter_fit_raises_the_likelihood_and_survives_save_load(tmp_path):
    X, Y = _data(60)
    fixed = ExactGP(3, 2).partial_fit(X, Y)
    fitted = make_learner("gp", input_dim=3, output_dim=2, optimize=True, max_iter=30).partial_fit(X, Y)
    assert (fitted.log_marginal_likelihood() > fixed.log_marginal_likelihood()).all()
    back = Learner.load(fitted.save(tmp_path / "gp"))
    assert isinstance(back, ExactGP) and back.n_points == 60
    Xq = np.random.default_rng(6).uniform(-2, 2, (5, 3))
    for a, b in zip(fitted.predict(Xq, return_var=True), back.predict(Xq, return_var=True)):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-10)


def test_exact_gp_window_rejection_and_empty_model():
    gp = ExactGP(3, 2, max_points=30, refit_every=5)
    m, v = gp.predict(np.zeros(3), return_var=True)
    assert (m == 0).all() and np.isinf(v).all()
    X, Y = _data(50)
    Y[3, 1] = np.nan
    gp.partial_fit(X, Y)
    assert gp.n_points == 30 and gp.n_rejected == 1
    np.testing.assert_array_equal(gp.X, np.delete(X, 3, axis=0)[-30:])
    with pytest.raises(ValueError, match="NaN"):
        gp.predict(np.full(3, np.nan))


def test_exact_gp_consistency_transform_shifts_the_data_exactly():
    """With (almost) no noise the GP interpolates its data: after a parameter change the
    prediction at the stored inputs is the old target minus Y(x) dpi."""
    rm = RobotModel("planar2")
    n = rm.n
    rng = np.random.default_rng(7)
    X = np.hstack([rng.uniform(-1, 1, (30, n)) for _ in range(3)])
    T = np.array([rm.regressor(x[:n], x[n:2 * n], x[2 * n:]) @ (0.3 * rm.parameters) for x in X])
    gp = ExactGP(3 * n, n, noise_var=1e-9, length_scale=1.0).partial_fit(X, T)
    np.testing.assert_allclose(gp.predict(X), T, atol=1e-5 * np.abs(T).max())
    dpi = 0.05 * rng.standard_normal(rm.n_params)
    gp.apply_parameter_update(dpi, rm)
    shift = np.array([rm.regressor(x[:n], x[n:2 * n], x[2 * n:]) @ dpi for x in X])
    np.testing.assert_allclose(gp.predict(X), T - shift, atol=1e-5 * np.abs(T).max())
    assert gp.n_transforms == 1


def test_exact_gp_shares_one_kernel_when_outputs_share_hyperparameters():
    """Identical hyperparameters for every output (the default): one Cholesky factor for
    all outputs, predictions (mean, variance, mean gradient) equal to the per-output
    stack (forced by a 1e-12 relative difference in one length scale), 1/o of its factor
    memory, and the same after a consistency-free save/load."""
    rng = np.random.default_rng(8)
    X = rng.normal(size=(120, 4))
    Y = np.stack([np.sin(X[:, 0]), X[:, 1] * X[:, 2], np.cos(X[:, 3]) + 0.1 * X[:, 0]], axis=1)
    shared = ExactGP(4, 3, length_scale=1.3, max_points=200)
    split = ExactGP(4, 3, length_scale=[[1.3] * 4, [1.3] * 4, [1.3 * (1 + 1e-12)] + [1.3] * 3], max_points=200)
    shared.partial_fit(X, Y)
    split.partial_fit(X, Y)
    assert shared.shared_kernel and not split.shared_kernel
    assert shared._snap[1].shape == (1, 120, 120) and split._snap[1].shape == (3, 120, 120)
    Q = rng.normal(size=(9, 4))
    m1, v1 = shared.predict(Q, return_var=True)
    m2, v2 = split.predict(Q, return_var=True)
    np.testing.assert_allclose(m1, m2, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(v1, v2, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(shared.mean_gradient(Q), split.mean_gradient(Q), rtol=1e-7, atol=1e-10)
    assert shared.memory_bytes() < split.memory_bytes() / 2
    again = ExactGP.from_bytes(shared.to_bytes())
    np.testing.assert_allclose(again.predict(Q), m1, rtol=0, atol=1e-12)


def test_predict_with_gradient_equals_predict_and_mean_gradient():
    """One kernel evaluation for both (SCQP's per-cycle query), shared kernel and per
    output hyperparameters alike."""
    rng = np.random.default_rng(9)
    X = rng.normal(size=(80, 5))
    Y = np.stack([np.sin(X[:, 0]) * X[:, 1], X[:, 2] ** 2, np.cos(X[:, 3] + X[:, 4])], axis=1)
    for ls in (1.2, [[0.8, 1.0, 1.2, 1.4, 1.6], [1.0] * 5, [2.0] * 5]):
        gp = ExactGP(5, 3, length_scale=ls, max_points=100).set_prediction(raw=True).partial_fit(X, Y)
        for x in rng.normal(size=(4, 5)):
            m, g = gp.predict_with_gradient(x)
            np.testing.assert_allclose(m, gp.predict(x[None])[0], rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(g, gp.mean_gradient(x), rtol=1e-10, atol=1e-12)
    m, g = ExactGP(5, 3).predict_with_gradient(np.zeros(5))
    assert not m.any() and g.shape == (3, 5) and not g.any()

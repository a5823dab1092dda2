"""PGPOL / SGPOL (Habich et al. 2019 sec. II-B, III): windows and database against a
direct bookkeeping of the stream, kNN against scikit-learn's NearestNeighbors, the
member GPs against GPy's DTC posterior, 1/sigma fusion recomputed from the members,
round-robin refits, the change statistics (eq. 7-9) against a direct (non-incremental)
computation, the consistency shift against the robot regressor, persistence."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import PGPOL, SGPOL, Learner, make_learner


def _stream(T=400, d=3, o=2, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(T) * 0.05
    X = np.column_stack([np.sin((k + 1) * 0.37 * t + k) for k in range(d)])
    Y = np.column_stack([np.sin(X[:, j % d] + X[:, (j + 1) % d]) * (j + 1) for j in range(o)])
    return X, Y + 0.01 * rng.standard_normal(Y.shape)


def test_windows_database_and_knn_follow_the_paper_rule():
    """Samples leaving the *smallest* window enter the bounded database; GP i trains on
    its window plus the knn database samples nearest the hinted query that are not in
    its own window (the reference: NearestNeighbors over exactly those samples)."""
    from sklearn.neighbors import NearestNeighbors

    X, Y = _stream(300)
    X[:, 0] += np.arange(300) * 1e-3   # every input distinct
    L = PGPOL(3, 2, windows=[20, 50], knn=7, database_size=120, max_iter=0, change_threshold=None)
    for k in range(0, 237, 3):         # batches of 3: one refit per call
        L.hint(X[min(k + 5, 299)])
        L.partial_fit(X[k:k + 3], Y[k:k + 3])
    T = 237
    np.testing.assert_array_equal(L._X, X[T - 50:T])                     # the largest window
    np.testing.assert_array_equal(L._dbX, X[T - 20 - 120:T - 20])       # left the smallest, FIFO-bounded
    np.testing.assert_array_equal(L._dbseq, np.arange(T - 140, T - 20))
    # the GP refitted last: its training set = its window + the neighbours outside it
    i = (L._rr - 1) % 2
    n_i = L.windows[i]
    g = L.members[i]
    np.testing.assert_array_equal(g.X[:n_i], X[T - n_i:T])
    cand = L._dbX[L._dbseq < T - n_i]
    std = X[T - 50:T].std(axis=0)
    nn = NearestNeighbors(n_neighbors=7).fit(cand / std)
    idx = nn.kneighbors((X[min(234 + 5, 299)] / std)[None], return_distance=False)[0]
    assert sorted(map(tuple, g.X[n_i:])) == sorted(map(tuple, cand[idx]))
    assert g.X.shape[0] == n_i + 7
    # knn = 0: no database at all
    S = SGPOL(3, 2, windows=[30], knn=0, max_iter=0).partial_fit(X[:100], Y[:100])
    assert S.database_points == 0 and S.members[0].X.shape[0] == 30


def test_one_gp_refitted_per_update_round_robin():
    X, Y = _stream(200)
    L = PGPOL(3, 2, windows=[10, 20, 40], knn=5, max_iter=2, change_threshold=None)
    fits = []
    for k in range(0, 120, 4):
        L.partial_fit(X[k:k + 4], Y[k:k + 4])
        fits.append([g.n_fits for g in L.members])
    steps = np.diff(np.array(fits), axis=0)
    assert (steps.sum(axis=1) == 1).all()                      # exactly one refit per update
    assert [int(np.argmax(s)) for s in steps[:6]] == [1, 2, 0, 1, 2, 0]


def test_member_posterior_equals_gpy_dtc_and_fusion_is_inverse_sigma_weighted(monkeypatch):
    """Each member predicts GPy's DTC posterior for its fitted Z and hyperparameters
    (standardised data, one output: GPy's DTC handles a single column); the ensemble
    fuses the members with weights 1/sigma (sigma of y: latent + noise, raw units) and
    the fused latent variance sum(w var) / sum(w)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import GPy
    X, Y = _stream(260, o=1)
    L = PGPOL(3, 1, windows=[40, 120], knn=10, n_inducing=8, max_iter=5, change_threshold=None).set_prediction(raw=True)
    for k in range(0, 260, 5):
        L.hint(X[min(k + 7, 259)])
        L.partial_fit(X[k:k + 5], Y[k:k + 5])
    Xq = X[::13] + 0.05
    means, vars_, noise = [], [], []
    from adaptive_dynamics.learning import sparse_gp

    # GPy factorises Kmm without jitter (optimised inducing inputs crowd, so 1e-8 on the
    # diagonal moves the posterior by ~1e-4): compare the formulas at equal jitter
    monkeypatch.setattr(sparse_gp, "JITTER", 0.0)
    for g in L.members:
        g.restore(g.X, g.Y, g.Z_raw, g.ls, g.sf2, g.sn2)
    L._publish()
    for g in L.members:
        Z, _, _, xs, ys, ls, sf2 = g.snap
        m = GPy.core.SparseGP(xs(g.X), ys(g.Y), Z[0].copy(),
                              GPy.kern.RBF(3, variance=float(sf2[0]), lengthscale=float(ls[0, 0])),
                              GPy.likelihoods.Gaussian(variance=float(g.sn2[0])),
                              inference_method=GPy.inference.latent_function_inference.DTC())
        mu, var = m.predict_noiseless(xs(Xq))
        mine_mu, mine_var = g.predict(Xq, return_var=True)
        np.testing.assert_allclose(mine_mu, ys.mean + ys.std * mu, rtol=1e-6, atol=1e-8)
        np.testing.assert_allclose(mine_var, ys.std ** 2 * var, rtol=1e-5, atol=1e-9)
        means.append(mine_mu)
        vars_.append(mine_var)
        noise.append(ys.std ** 2 * g.sn2[0])
    w = [1.0 / np.sqrt(v + s) for v, s in zip(vars_, noise)]
    fused = sum(wi * mi for wi, mi in zip(w, means)) / sum(w)
    fused_var = sum(wi * vi for wi, vi in zip(w, vars_)) / sum(w)
    mu, var = L.predict(Xq, return_var=True)   # the stacked evaluation: equal to rounding
    np.testing.assert_allclose(mu, fused, rtol=1e-7, atol=1e-8)
    np.testing.assert_allclose(var, fused_var, rtol=1e-6, atol=1e-8)   # sf2 - k R k cancels
    # SGPOL: the single GP's own prediction
    S = SGPOL(3, 1, windows=[60], knn=0, n_inducing=8, max_iter=3).set_prediction(raw=True).partial_fit(X[:100], Y[:100])
    np.testing.assert_allclose(S.predict(Xq), S.members[0].predict(Xq)[0], rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("groups", ["shared", "joint"])
def test_paper_fusion_weights_each_gp_by_its_scaled_sigma(groups):
    """``fusion="scaled"`` (the paper's): one weight per GP, 1 / sigma with sigma the root
    of the mean over outputs of its latent variance + noise in its own standardised output
    units -- recomputed here from the members' predictions and scalers; the single-query
    path gives the same; the default (raw, per output) differs; saved and loaded."""
    rng = np.random.default_rng(7)
    X = rng.normal(size=(240, 3))
    Y = np.c_[np.sin(X[:, 0]), 10.0 * X[:, 1] ** 2, 0.1 * X[:, 2]]
    kw = dict(windows=[40, 120], knn=5, n_inducing=8, max_iter=3, groups=groups, change_threshold=None)
    L = PGPOL(3, 3, fusion="scaled", **kw).set_prediction(raw=True)
    R = PGPOL(3, 3, **kw).set_prediction(raw=True)
    for k in range(0, 240, 6):
        L.partial_fit(X[k:k + 6], Y[k:k + 6])
        R.partial_fit(X[k:k + 6], Y[k:k + 6])
    Xq = X[::17] + 0.1
    means, vars_, w = [], [], []
    for g in L.members:
        ys = g.snap[4]
        mu_g, var_g = g.predict(Xq, return_var=True)
        noise_scaled = np.broadcast_to(np.asarray(g.sn2, float), (3,)) if groups == "joint" else np.full(3, g.sn2[0])
        w.append(1.0 / np.sqrt(np.mean(var_g / ys.std ** 2 + noise_scaled, axis=1, keepdims=True)))
        means.append(mu_g)
        vars_.append(var_g)
    fused = sum(wi * mi for wi, mi in zip(w, means)) / sum(w)
    fused_var = sum(wi * vi for wi, vi in zip(w, vars_)) / sum(w)
    mu, var = L.predict(Xq, return_var=True)
    np.testing.assert_allclose(mu, fused, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(var, fused_var, rtol=1e-5, atol=1e-8)
    for i, q in enumerate(Xq[:4]):
        np.testing.assert_allclose(L.predict(q), mu[i], rtol=1e-6, atol=1e-9)
    assert not np.allclose(R.predict(Xq), mu, rtol=1e-6, atol=1e-9)       # the raw weights differ
    assert L.get_config()["fusion"] == "scaled" and R.get_config()["fusion"] == "raw"
    with pytest.raises(ValueError, match="fusion"):
        PGPOL(3, 3, fusion="mean")


def test_scalers_on_the_window_alone():
    """``scale_on="window"`` (the paper's): each GP's input and output scalers are those of
    its window, not of its window + neighbours (the default)."""
    from adaptive_dynamics.learning.gp import Standardiser

    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 3)) * [1.0, 2.0, 0.5]
    Y = np.c_[np.sin(X[:, 0]), X[:, 1]]
    out = {}
    for where in ("window", "training"):
        L = PGPOL(3, 2, windows=[30], knn=15, n_inducing=6, max_iter=2, change_threshold=None, scale_on=where)
        for k in range(0, 200, 5):
            L.hint(X[min(k + 5, 199)])
            L.partial_fit(X[k:k + 5], Y[k:k + 5])
        g = L.members[0]
        xs, ys = g.snap[3], g.snap[4]
        assert g.X.shape[0] > 30                                # window + neighbours
        ref_x = Standardiser.fit(g.X[:30] if where == "window" else g.X)
        np.testing.assert_allclose(xs.mean, ref_x.mean, rtol=1e-12)
        np.testing.assert_allclose(ys.std, Standardiser.fit(g.Y[:30] if where == "window" else g.Y).std, rtol=1e-12)
        out[where] = xs.std
        assert L.get_config()["scale_on"] == where
    assert not np.allclose(out["window"], out["training"])
    with pytest.raises(ValueError, match="scale_on"):
        PGPOL(3, 2, scale_on="all")


def test_joint_groups_give_one_gp_per_output():
    X, Y = _stream(200, o=3)
    L = PGPOL(3, 3, windows=[30, 60], groups="joint", n_inducing=6, max_iter=3, change_threshold=None)
    for k in range(0, 200, 10):
        L.partial_fit(X[k:k + 10], Y[k:k + 10])
    for g in L.members:
        assert g.G == 3 and g.ls.shape == (3, 1)
    mu = L.predict(X[150:190])
    assert np.mean((mu - Y[150:190]) ** 2) / Y.var() < 0.05


@pytest.mark.parametrize("groups", ["shared", "joint"])
@pytest.mark.parametrize("windows", [[40], [30, 50, 70]])
def test_one_query_path_equals_the_batch_path(groups, windows):
    """A single query (the prediction node's case) takes a rearranged product of the
    same snapshot: the same means and variances as the batch path, to rounding, also on
    inputs far from zero mean and unit scale.  The variance ``sf2 - k R k`` cancels:
    here both paths are ~5e-3 off an extended-precision evaluation (to the same digits),
    hence its tolerance."""
    rng = np.random.default_rng(len(windows))
    scale, shift = np.array([1, 2, 3, 0.5, 10]), np.array([0, 5, -2, 0, 100])
    X = rng.normal(size=(200, 5)) * scale + shift
    Y = np.c_[np.sin(X[:, 0]), X[:, 1] ** 2, X[:, 4]]
    L = PGPOL(5, 3, windows=windows, knn=5, n_inducing=8, max_iter=3, groups=groups, change_threshold=None)
    for k in range(0, 200, 4):          # every member refitted several times
        L.partial_fit(X[k:k + 4], Y[k:k + 4])
    Q = rng.normal(size=(20, 5)) * scale + shift
    mb, vb = L.predict(Q, return_var=True)
    for i, q in enumerate(Q):
        m1, v1 = L.predict(q, return_var=True)
        np.testing.assert_allclose(m1, mb[i], rtol=1e-6, atol=1e-10)
        np.testing.assert_allclose(v1, vb[i], rtol=2e-2, atol=1e-12)
        np.testing.assert_array_equal(L.predict(q), m1)


@pytest.mark.parametrize("horizon, eta", [(0, 1e-3), (50, 1e-2)])
def test_change_statistics_match_eq_7_to_9_and_a_step_clears_the_database(horizon, eta):
    """nmse-bar (eq. 8-9) computed incrementally from the prequential predictions equals
    the direct formula (cumulative: the paper's; or an exponential mean over ~N samples);
    a sudden change of the function (a payload) makes gamma (eq. 7) exceed eta and
    clears the database; the stationary part (gamma <= 6e-4 here) never does."""
    X, Y = _stream(700)
    Y2 = Y.copy()
    Y2[450:] += np.array([3.0, -2.0])                  # the dynamics change at sample 450
    L = PGPOL(3, 2, windows=[20, 60], knn=10, database_size=300, max_iter=3, change_threshold=eta,
              change_horizon=horizon, change_warmup=20).set_prediction(raw=True)
    preds = []
    for k in range(450):
        preds.append(L.predict(X[k]))
        L.partial_fit(X[k], Y2[k])
    assert L.n_changes == 0 and L.database_points > 0
    E = np.square(Y2[:450] - np.array(preds))
    if horizon == 0:   # eq. 9 directly: mean squared prequential error so far / var(y)
        nmse = np.mean(E.mean(axis=0) / Y2[:450].var(axis=0))
        assert L.nmse == pytest.approx(nmse, rel=1e-9)
    else:              # the first N samples averaged, then exponential forgetting by (1 - 1/N)
        i, T, N = np.arange(450), 450, horizon
        wgt = np.where(i < N, (1 - 1 / N) ** (T - N), (1 - 1 / N) ** (T - 1 - i)) / N
        assert wgt.sum() == pytest.approx(1.0)
        np.testing.assert_allclose(L._cd.err, wgt @ E, rtol=1e-9)
    for k in range(450, 470):
        L.partial_fit(X[k], Y2[k])
    assert L.n_changes == 1 and 450 <= L.last_change < 455
    # cleared at the triggering sample; since then only the samples leaving the 20-window
    assert L.database_points == 470 - L.last_change


def test_consistency_shift_moves_every_stored_target_by_the_regressor():
    """A parameter change dpi shifts the windows, the database and the members' training
    targets by -Y(x) dpi (Y from the robot model, evaluated independently per sample);
    the members' posterior changes linearly (two halves compose to the whole; +dpi then
    -dpi is the identity)."""
    model = RobotModel("planar2")
    n = model.n
    rng = np.random.default_rng(3)
    T = 160
    t = np.arange(T) * 0.02
    Q = np.column_stack([np.sin(t), np.cos(0.7 * t)])
    X = np.hstack([Q, np.gradient(Q, t, axis=0), -Q])
    Yt = np.sin(Q) + 0.3 * X[:, n:2 * n] + 0.01 * rng.standard_normal((T, n))
    L = PGPOL(3 * n, n, windows=[20, 60], knn=5, database_size=80, n_inducing=10, max_iter=3,
              change_threshold=None)
    for k in range(0, T, 4):
        L.hint(X[min(k + 4, T - 1)])
        L.partial_fit(X[k:k + 4], Yt[k:k + 4])
    dpi = rng.normal(0, 0.05, model.n_params)
    before = {"X": L._Y.copy(), "db": L._dbY.copy(), "m": [g.Y.copy() for g in L.members]}
    Xq = X[::9] + 0.01
    p0 = L.predict(Xq)
    M = L.to_bytes()
    L.apply_parameter_update(dpi, model)

    def shift(Xs):
        return np.array([model.regressor(x[:n], x[n:2 * n], x[2 * n:]) @ dpi for x in Xs])

    np.testing.assert_allclose(L._Y, before["X"] - shift(L._X), atol=1e-10)
    np.testing.assert_allclose(L._dbY, before["db"] - shift(L._dbX), atol=1e-10)
    for g, y0 in zip(L.members, before["m"]):
        np.testing.assert_allclose(g.Y, y0 - shift(g.X), atol=1e-10)
    p1 = L.predict(Xq)
    assert np.abs(p1 - p0).max() > 1e-3
    L.apply_parameter_update(-dpi, model)
    np.testing.assert_allclose(L.predict(Xq), p0, atol=1e-9)
    H = Learner.from_bytes(M)
    H.apply_parameter_update(0.5 * dpi, model)
    H.apply_parameter_update(0.5 * dpi, model)
    np.testing.assert_allclose(H.predict(Xq), p1, atol=1e-9)


def test_save_load_continues_identically(tmp_path):
    X, Y = _stream(400)
    L = make_learner("pgpol", input_dim=3, output_dim=2, windows=[30, 90], knn=8, n_inducing=8, max_iter=4,
                     change_threshold=0.05, change_warmup=20)
    for k in range(0, 240, 6):
        L.hint(X[k + 8])
        L.partial_fit(X[k:k + 6], Y[k:k + 6])
    R = Learner.load(L.save(tmp_path / "pgpol"))
    assert type(R) is PGPOL and R.get_config() == L.get_config()
    # reloaded: the members' factors are rebuilt from the stored arrays (BLAS may sum in another order, ~n eps)
    np.testing.assert_allclose(R.predict(X[240:300], return_var=True)[0], L.predict(X[240:300]), rtol=1e-9, atol=1e-10)
    assert (R.n_refits, R.database_points, R.nmse) == (L.n_refits, L.database_points, L.nmse)
    for A in (L, R):
        for k in range(240, 300, 6):
            A.hint(X[k + 8])
            A.partial_fit(X[k:k + 6], Y[k:k + 6])
    np.testing.assert_allclose(R.predict(X[300:]), L.predict(X[300:]), rtol=1e-9, atol=1e-10)
    # a damaged file is refused, not half-loaded
    arrays = dict(np.load(tmp_path / "pgpol.npz", allow_pickle=False))
    arrays["a_dbseq"] = arrays["a_dbseq"][:-1]
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError, match="sizes disagree"):
        Learner.load(tmp_path / "bad.npz")


def test_configuration_is_validated():
    for bad in ({"windows": [1]}, {"windows": []}, {"knn": -1}, {"change_threshold": 0.0},
                {"change_warmup": 1}, {"groups": "all"}, {"n_inducing": 0}):
        with pytest.raises(ValueError):
            PGPOL(3, 1, **bad)
    assert SGPOL(3, 1).windows == [480] and PGPOL(3, 1).windows == [60, 480]


@pytest.mark.parametrize("kind, cfg", [
    ("pgpol", {"windows": [20, 60], "knn": 5, "database_size": 80, "n_inducing": 10, "max_iter": 3}),
    ("sgpol", {"windows": [60], "knn": 0, "n_inducing": 10, "max_iter": 3}),
    ("gp", {"max_points": 80, "refit_every": 1}),
    ("gp", {"max_points": 80, "refit_every": 7}),   # samples since the last refit are kept apart
])
def test_saved_model_is_the_model_in_use_after_a_consistency_shift(kind, cfg):
    """A consistency shift keeps each GP's scalers (the posterior moves linearly); the
    saved model (the split's snapshots, model files) must reproduce it exactly, and go
    on learning identically."""
    model = RobotModel("planar2")
    n = model.n
    T = 150
    t = np.arange(T) * 0.02
    Q = np.column_stack([np.sin(t), np.cos(0.7 * t)])
    X = np.hstack([Q, np.gradient(Q, t, axis=0), -Q])
    Yt = np.sin(Q) + 0.3 * X[:, n:2 * n]
    L = make_learner(kind, input_dim=3 * n, output_dim=n, **cfg)
    for k in range(0, 120, 4):
        L.hint(X[k + 4])
        L.partial_fit(X[k:k + 4], Yt[k:k + 4])
    L.apply_parameter_update(np.random.default_rng(5).normal(0, 0.2, model.n_params), model)
    Xq = np.vstack([X[::7], X[::11] + 0.3])
    R = Learner.from_bytes(L.to_bytes())
    # reloaded: each GP refactorised from its stored arrays, BLAS may sum in another order (~n eps; a refit: far more)
    np.testing.assert_allclose(R.predict(Xq), L.predict(Xq), rtol=1e-9, atol=1e-10)
    for A in (L, R):
        for k in range(120, 148, 4):
            A.hint(X[k + 1])
            A.partial_fit(X[k:k + 4], Yt[k:k + 4])
    np.testing.assert_allclose(R.predict(Xq), L.predict(Xq), rtol=1e-9, atol=1e-10)


def test_change_lag_tells_a_sustained_step_from_single_spikes():
    """gamma over L samples (beyond the paper): a sustained error step of r moves it by
    ~r L / N and one spike of z by z / N, so with L = 50 a threshold exists that fires on
    the step and never on the spikes; with the paper's L = 1 any threshold low enough for
    the step also fires on the spikes.  Checked on the raw statistics (E2, Y) and through
    PGPOL, whose change test is the same object, with its history kept by save/load."""
    from adaptive_dynamics.learning.pgpol import ChangeTest

    rng = np.random.default_rng(4)
    n, o, step = 3000, 3, 2000
    Y = rng.normal(size=(n, o))
    E2 = 0.05 * rng.chisquare(1, size=(n, o))
    E2[rng.choice(np.arange(400, step), 20, replace=False)] += 12.0      # spikes: z ~ 12
    E2[step:] += 1.0                                                      # the step: r ~ 1

    def hits(lag, eta):
        t = ChangeTest(o, eta, horizon=300, warmup=300, lag=lag)
        return [i for i in range(n) if t.update(E2[i], Y[i])]

    h = hits(50, 0.1)       # the step: ~0.15 over 50 samples; a spike: 12 / 300 = 0.04
    assert h and all(step <= i < step + 100 for i in h)
    for eta in (1e-3, 3e-3, 1e-2, 3e-2):      # lag 1: the step is seen only if the spikes are seen too
        h1 = hits(1, eta)
        assert not any(i >= step for i in h1) or any(i < step for i in h1)
    # the learner's history survives save/load: a reload mid-stream fires where the original does
    a = ChangeTest(o, 0.1, 300, 300, 50)
    for i in range(step + 10):
        a.update(E2[i], Y[i])
    b = ChangeTest(o, 0.1, 300, 300, 50)
    b.set_arrays({k: v.copy() for k, v in a.get_arrays().items()})
    fa = [i for i in range(step + 10, n) if a.update(E2[i], Y[i])]
    fb = [i for i in range(step + 10, n) if b.update(E2[i], Y[i])]
    assert fa == fb and fa
    L = make_learner("pgpol", input_dim=2, output_dim=1, windows=[10, 40], knn=5, n_inducing=5, max_iter=1,
                     change_threshold=0.02, change_lag=50)
    assert L.get_config()["change_lag"] == 50 and L._cd.lag == 50
    with pytest.raises(ValueError, match="change_lag >= 1"):
        make_learner("pgpol", input_dim=2, output_dim=1, change_lag=0)

"""OnlineResidual (the residual_learner node's core): the streamed, threaded learning
must equal the plain learner fed the same samples in the same order, with every
parameter update applied exactly where it arrived in the stream."""
from __future__ import annotations

import numpy as np
import pytest

from adaptive_dynamics.dynamics import RobotModel
from adaptive_dynamics.learning import OnlineResidual, make_learner

ROBOT = "planar2"


@pytest.fixture(scope="module")
def model():
    return RobotModel(ROBOT)


def stream(model, N=600, seed=0):
    """x = (q, qd, qdd) along a smooth motion; y = a friction-like residual."""
    n = model.n
    t = np.arange(N) * 0.01
    rng = np.random.default_rng(seed)
    w = rng.uniform(0.5, 1.5, n)
    q = 0.6 * np.sin(np.outer(t, w))
    qd = 0.6 * w * np.cos(np.outer(t, w))
    qdd = -0.6 * w ** 2 * np.sin(np.outer(t, w))
    X = np.hstack([q, qd, qdd])
    Y = 0.8 * qd + 0.3 * np.tanh(qd / 0.05) + 0.2 * np.sin(q)
    return X, Y


def dpi_for(model, scale=0.05, seed=1):
    rng = np.random.default_rng(seed)
    return scale * rng.standard_normal(model.n_params) * np.abs(model.parameters)


def regressor_times(model, X, d):
    n = model.n
    return np.array([model.regressor(x[:n], x[n:2 * n], x[2 * n:]) @ d for x in X])


def feed(core, X, Y, updates):
    """Offer the stream; updates = {sample index: dpi} offered before that sample."""
    for k, (x, y) in enumerate(zip(X, Y)):
        if k in updates:
            core.add_parameter_update(updates[k])
        core.add_sample(x, y)


def manual(model, kind, X, Y, warmup, cut, d, cfg):
    """The same learning by hand: build from the first `warmup` samples, fit them, fit up
    to `cut`, transform, fit the rest."""
    cfg = dict(cfg)
    if kind == "rbfn":
        lo, hi = X[:warmup].min(0), X[:warmup].max(0)
        span = np.maximum(hi - lo, 1e-3)
        cfg.update(low=lo - 0.2 * span, high=hi + 0.2 * span, n_params=model.n_params, warmup=warmup)
    else:   # the stream's warm-up is the mixture's too (its geometry from the same samples)
        cfg.update(warmup=warmup)
    L = make_learner(kind, input_dim=X.shape[1], output_dim=Y.shape[1], **cfg)
    if cut < warmup:  # the update lands in the warm-up buffer: targets shifted exactly
        Y = Y.copy()
        Y[:cut] -= regressor_times(model, X[:cut], d)
        L.partial_fit(X[:warmup], Y[:warmup], model=model)
        L.partial_fit(X[warmup:], Y[warmup:], model=model)
    else:
        L.partial_fit(X[:warmup], Y[:warmup], model=model)
        L.partial_fit(X[warmup:cut], Y[warmup:cut], model=model)
        L.apply_parameter_update(d, model)
        if cut < len(X):
            L.partial_fit(X[cut:], Y[cut:], model=model)
    return L


@pytest.mark.parametrize("kind,cfg", [("gmm", {"max_components": 16}), ("rbfn", {"n_basis": 64, "width": 0.4})])
@pytest.mark.parametrize("cut", [400, 50])
def test_streamed_learning_equals_the_plain_learner(model, kind, cfg, cut):
    X, Y = stream(model)
    d = dpi_for(model)
    ref = manual(model, kind, X, Y, 100, cut, d, cfg)
    Xt = X[::7] + 0.01
    want, want_var = ref.predict(Xt, return_var=True)
    for threaded in (True, False):
        core = OnlineResidual(model, kind, cfg, learn_every=1, block_size=37, warmup=100, threaded=threaded)
        try:
            assert not core.ready and np.all(core.predict(Xt) == 0.0)   # zeros before the warm-up
            m0, v0 = core.predict(Xt, return_var=True)                  # and nothing uncertain added
            assert m0.shape == v0.shape == want.shape and np.all(m0 == 0.0) and np.all(v0 == 0.0)
            feed(core, X, Y, {cut: d})
            assert core.flush(timeout=60.0)
            got = core.predict(Xt)
            got_mean, got_var = core.predict(Xt, return_var=True)
            c = core.diagnostics()
        finally:
            core.stop()
        assert c["samples_learned"] == len(X) and c["transforms_applied"] == 1 and c["fit_errors"] == 0
        # IGMM is sequential per sample: identical; RLS in other blocks: equal to rounding
        np.testing.assert_allclose(got, want, rtol=1e-7, atol=1e-9 * np.abs(want).max())
        np.testing.assert_array_equal(got_mean, got)
        assert got_var.shape == want_var.shape and np.all(np.isfinite(got_var)) and np.all(got_var > 0)
        if kind == "gmm":   # (RLS's noise variance comes from each block's a-priori errors: block-dependent)
            np.testing.assert_allclose(got_var, want_var, rtol=1e-7, atol=1e-9 * np.abs(want_var).max())


def test_decimation_and_consecutive_updates_sum(model):
    X, Y = stream(model, N=900)
    d1, d2 = dpi_for(model, seed=3), dpi_for(model, seed=4)
    cfg = {"n_basis": 64, "width": 0.4}
    core = OnlineResidual(model, "rbfn", cfg, learn_every=3, warmup=100, threaded=False)
    for k, (x, y) in enumerate(zip(X, Y)):
        if k == 600:
            core.add_parameter_update(d1)
            core.add_parameter_update(d2)   # back to back: one transform of d1 + d2
        core.add_sample(x, y)
    core.process()
    c = core.diagnostics()
    assert c["samples_offered"] == 900 and c["samples_queued"] == 300 and c["samples_learned"] == 300
    assert c["updates_received"] == 2 and c["transforms_applied"] == 1
    ref = manual(model, "rbfn", X[::3], Y[::3], 100, 200, d1 + d2, cfg)
    np.testing.assert_allclose(core.predict(X[::11]), ref.predict(X[::11]), rtol=1e-7, atol=1e-9)


def test_latest_sample_per_update(model):
    """update_samples "latest" (PGPOL's paper: one current point per update): after the
    warm-up each update learns only the newest sample queued since the previous one,
    and a parameter update between samples still lands in stream order."""
    X, Y = stream(model, N=400)
    d = dpi_for(model, seed=5)
    cfg = {"n_basis": 64, "width": 0.4}
    core = OnlineResidual(model, "rbfn", cfg, learn_every=1, warmup=100, threaded=False,
                          update_samples="latest")
    core.add_sample(X[0], Y[0])
    core.process()
    for k in range(1, 100):   # the warm-up collects every sample
        core.add_sample(X[k], Y[k])
    core.process()
    kept = list(range(100))
    chunk = 7
    for start in range(100, 400, chunk):
        for k in range(start, min(start + chunk, 400)):
            if k == 250:   # an update in the middle of a chunk: the samples before it end their own update
                core.add_parameter_update(d)
                kept.append(k - 1)
            core.add_sample(X[k], Y[k])
        core.process()
        kept.append(min(start + chunk, 400) - 1)
    kept = sorted(set(kept))
    c = core.diagnostics()
    assert c["samples_learned"] == len(kept) and c["samples_skipped"] == 400 - len(kept)
    cut = kept.index(250 - 1) + 1   # learnt samples before the update
    ref = manual(model, "rbfn", X[kept], Y[kept], 100, cut, d, cfg)
    np.testing.assert_allclose(core.predict(X[::11]), ref.predict(X[::11]), rtol=1e-7, atol=1e-9)
    with pytest.raises(ValueError, match="update_samples"):
        OnlineResidual(model, "rbfn", cfg, threaded=False, update_samples="newest")


def test_bad_input_never_reaches_the_learner(model):
    X, Y = stream(model, N=300)
    core = OnlineResidual(model, "gmm", {"max_components": 8}, learn_every=1, warmup=50, threaded=False)
    clean = OnlineResidual(model, "gmm", {"max_components": 8}, learn_every=1, warmup=50, threaded=False)
    for k, (x, y) in enumerate(zip(X, Y)):
        if k % 50 == 7:
            bad_x = x.copy()
            bad_x[k % x.size] = np.nan
            assert not core.add_sample(bad_x, y)
            assert not core.add_sample(x, np.full_like(y, np.inf))
        core.add_sample(x, y)
        clean.add_sample(x, y)
    with pytest.raises(ValueError, match="shapes"):
        core.add_sample(X[0][:-1], Y[0])
    assert not core.add_parameter_update(np.full(model.n_params, np.nan))
    assert not core.add_parameter_update(np.zeros(model.n_params + 1))
    core.process()
    clean.process()
    c = core.diagnostics()
    assert c["samples_rejected"] == 2 * 6 + 1 and c["updates_rejected"] == 2 and c["transforms_applied"] == 0
    # the model is exactly the one learnt from the clean stream
    np.testing.assert_array_equal(core.predict(X[::5]), clean.predict(X[::5]))


def test_switches_learning_off_and_transform_off(model):
    X, Y = stream(model, N=400)
    # (fixed target scaling, so "as if trained on y - Y d" is exact without a common scale;
    # the standardised case: test_learning_consistency)
    core = OnlineResidual(model, "rbfn", {"n_basis": 32, "standardize": False}, learn_every=1, warmup=100,
                          threaded=False)
    feed(core, X[:200], Y[:200], {})
    core.process()
    before = core.predict(X)
    core.learning = False                      # phase 3: no learning ...
    feed(core, X[200:], Y[200:], {})
    core.process()
    np.testing.assert_array_equal(core.predict(X), before)
    d = dpi_for(model)
    core.transform = False                     # ... and the ablation: updates ignored
    assert not core.add_parameter_update(d)
    core.process()
    np.testing.assert_array_equal(core.predict(X), before)
    core.transform = True     # with the transform: as if trained on y - Y(x) d (exact for RLS)
    assert core.add_parameter_update(d)
    core.process()
    ref = manual(model, "rbfn", X[:200], Y[:200] - regressor_times(model, X[:200], d), 100, 200, 0 * d,
                 {"n_basis": 32, "standardize": False})
    np.testing.assert_allclose(core.predict(X), ref.predict(X), rtol=1e-7, atol=1e-9)
    assert np.abs(core.predict(X) - before).max() > 1e-3
    c = core.diagnostics()
    assert c["updates_ignored"] == 1 and c["transforms_applied"] == 1


def test_learning_off_discards_what_is_still_queued(model):
    """learning switched off with samples queued (a worker behind the stream): they are
    discarded, not learnt -- the model stops moving at once -- while a queued parameter
    update is still applied (the transform keeps it consistent with the estimate)."""
    X, Y = stream(model, N=400)
    cfg = {"n_basis": 32, "standardize": False}
    core = OnlineResidual(model, "rbfn", cfg, learn_every=1, warmup=100, threaded=False)
    feed(core, X[:200], Y[:200], {})
    core.process()
    before = core.predict(X)
    feed(core, X[200:], Y[200:], {})           # queued, not learnt yet ...
    d = dpi_for(model)
    assert core.add_parameter_update(d)
    core.learning = False                      # ... when learning goes off
    core.process()
    c = core.diagnostics()
    assert c["samples_discarded"] == 200 and c["samples_learned"] == 200 and c["transforms_applied"] == 1
    ref = manual(model, "rbfn", X[:200], Y[:200] - regressor_times(model, X[:200], d), 100, 200, 0 * d, cfg)
    np.testing.assert_allclose(core.predict(X), ref.predict(X), rtol=1e-7, atol=1e-9)
    assert np.abs(core.predict(X) - before).max() > 1e-3


def test_queue_limit_drops_and_counts(model):
    X, Y = stream(model, N=50)
    core = OnlineResidual(model, "gmm", learn_every=1, warmup=10, queue_limit=20, threaded=False)
    feed(core, X, Y, {})
    c = core.diagnostics()
    assert c["samples_queued"] == 20 and c["samples_dropped"] == 30 and c["queue"] == 20


def test_save_load_and_mismatch(model, tmp_path):
    X, Y = stream(model, N=300)
    core = OnlineResidual(model, "gmm", {"max_components": 8}, learn_every=1, warmup=50, threaded=False)
    assert core.save(tmp_path / "empty.npz") is None          # nothing learnt yet
    feed(core, X, Y, {})
    core.process()
    path = core.save(tmp_path / "m.npz")
    again = OnlineResidual(model, "gmm", learn_every=1, warmup=50, threaded=False)
    again.load(path)
    # reloaded mixture: its factors are recomputed from the stored covariances (BLAS may sum in another order, ~n eps)
    np.testing.assert_allclose(again.predict(X[::9]), core.predict(X[::9]), rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="holds a 'gmm' learner"):
        OnlineResidual(model, "rbfn", threaded=False).load(path)
    with pytest.raises(ValueError, match="x = \\(q, qd, qdd\\)"):
        OnlineResidual(RobotModel("panda"), "gmm", threaded=False).load(path)


# ------------------------------------------------------------------------------ lockstep
MS = 1_000_000


def lockstep_feed(core, X, Y, updates, order_seed=None):
    """Stamp k ms for sample k; the update of ``updates[k]`` is stamped (k - 1) ms (it was
    published with the state before sample k: learnt after sample k - 1, before sample k).
    ``order_seed``: the items of every 4 consecutive stamps arrive shuffled (other
    publishers), well within the 5-state margin.  Each state is advanced to once, in
    order, when the first item of its stamp comes (the stream's states come in order)."""
    items = []
    for k, (x, y) in enumerate(zip(X, Y)):
        if k in updates:
            items.append(("u", (k - 1) * MS, updates[k]))
        items.append(("s", k * MS, (x, y)))
    if order_seed is not None:
        rng = np.random.default_rng(order_seed)
        chunks = [items[i:i + 4] for i in range(0, len(items), 4)]
        items = [it for c in chunks for it in rng.permutation(np.array(c, dtype=object)).tolist()]
    newest = -1
    for kind, stamp, payload in items:
        if kind == "u":
            core.add_parameter_update(payload, stamp=stamp)
        else:
            core.add_sample(*payload, stamp=stamp)
        while newest < stamp // MS:   # the states up to this one have come
            newest += 1
            core.advance(newest * MS)


@pytest.mark.parametrize("kind,cfg", [("gmm", {"max_components": 16}), ("rbfn", {"n_basis": 64, "width": 0.4})])
def test_lockstep_learns_the_plain_learners_model_in_stamp_order(model, kind, cfg):
    """Items arriving out of order (within the margin) are learnt in stamp order, the
    update exactly between its samples: the plain learner's model (as the threaded core's)."""
    X, Y = stream(model)
    d = dpi_for(model)
    cut = 400
    ref = manual(model, kind, X, Y, 100, cut, d, cfg)
    Xt = X[::7] + 0.01
    core = OnlineResidual(model, kind, cfg, learn_every=1, block_size=37, warmup=100, lockstep=True)
    assert core._thread is None
    lockstep_feed(core, X, Y, {cut: d}, order_seed=0)
    assert core.flush()
    c = core.diagnostics()
    assert c["samples_learned"] == len(X) and c["transforms_applied"] == 1 and c["lockstep_late"] == 0
    np.testing.assert_allclose(core.predict(Xt), ref.predict(Xt), rtol=1e-7, atol=1e-9 * np.abs(ref.predict(Xt)).max())


def test_lockstep_what_is_learnt_by_a_stamp_depends_on_the_stream_alone(model):
    """Whatever the arrival order and however often the stream advances, the model after
    the stream reached a stamp is the same: the same blocks learnt in the same order
    (bit-identical: the very same computation); it holds every whole block of the samples
    stamped at least the margin (5 states) before, and nothing newer."""
    X, Y = stream(model, N=500)
    d = dpi_for(model)
    cfg = {"max_components": 16}
    cores = []
    for seed in (None, 1, 2):
        core = OnlineResidual(model, "gmm", cfg, learn_every=1, block_size=40, warmup=60, lockstep=True)
        lockstep_feed(core, X[:300], Y[:300], {150: d}, order_seed=seed)
        cores.append(core)
    # due: stamps <= 294 ms -> 295 samples; whole blocks of 40 (the warm-up's 60 among them): 280
    for core in cores:
        assert core.counters["samples_learned"] == 280, core.counters
    for core in cores[1:]:
        np.testing.assert_array_equal(core.predict(X[::9]), cores[0].predict(X[::9]))


def test_lockstep_late_items_learning_off_and_flush(model):
    X, Y = stream(model, N=200)
    cfg = {"n_basis": 64, "width": 0.4}
    core = OnlineResidual(model, "rbfn", cfg, learn_every=1, block_size=20, warmup=40, lockstep=True)
    for k in range(100):
        core.add_sample(X[k], Y[k], stamp=k * MS)
        core.advance(k * MS)                            # at 99 ms: stamps <= 94 ms due, 95: 4 blocks of 20
    assert core.counters["samples_learned"] == 80 and core.ready
    core.add_sample(X[100], Y[100], stamp=50 * MS)      # its stamp was handed on already: late
    assert core.counters["lockstep_late"] == 1
    core.advance(100 * MS)                              # handed on now (95..95 ms + the late one)
    assert core.counters["samples_queued"] == 97
    core.learning = False      # a freeze: the 17 queued are discarded, 96-99 ms not taken, updates applied at once
    assert core.add_parameter_update(dpi_for(model), stamp=101 * MS) is True
    for k in range(101, 108):
        core.advance(k * MS)                            # up to 102 ms handed on
    assert core.counters["transforms_applied"] == 1 and core.counters["samples_discarded"] == 17
    core.learning = True
    for k in range(101, 120):
        core.add_sample(X[k], Y[k], stamp=(k + 10) * MS)
    assert core.flush()                                 # everything still waiting is learnt
    assert core.counters["samples_queued"] == 116 and core.diagnostics()["queue"] == 0
    with pytest.raises(ValueError, match="stamp"):
        core.add_sample(X[0], Y[0])
    with pytest.raises(ValueError, match="whole blocks"):
        OnlineResidual(model, "rbfn", cfg, lockstep=True, update_samples="latest")

"""Every learner counts the queries that leave the region it has data for
(``n_queries_outside``, in its counters and saved with it): a query far from the data is
counted, one among the data is not, for a single query and a batch alike."""
from __future__ import annotations

import numpy as np
import pytest

from adaptive_dynamics.learning import Learner, make_learner

CONFIGS = {
    "gmm": {"max_components": 8},
    "rbfn": {"n_basis": 64},
    "gp": {},
    "pgpol": {"windows": [40, 120], "knn": 10, "n_inducing": 10, "max_iter": 2},
    "sgpol": {"windows": [120], "n_inducing": 10, "max_iter": 2},
}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_far_queries_are_counted(kind):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 2))
    Y = np.sin(X[:, :1]) + 0.01 * rng.normal(size=(400, 1))
    L = make_learner(kind, input_dim=2, output_dim=1, **CONFIGS[kind])
    for i in range(0, 400, 50):
        L.partial_fit(X[i:i + 50], Y[i:i + 50])
    L.predict(X[-20:])
    L.predict(X[-1])
    base = L._counters()["n_queries_outside"]
    assert base <= 1, base
    L.predict(np.array([[40.0, 0.0], [0.0, -40.0], [0.1, 0.2]]))     # a batch: two far
    L.predict(np.array([50.0, 50.0]))                                   # one query, far
    assert L._counters()["n_queries_outside"] == base + 3
    assert Learner.from_bytes(L.to_bytes())._counters()["n_queries_outside"] == base + 3

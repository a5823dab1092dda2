"""Online semi-parametric residual learning: a learner fed from a stream, on a worker thread.

:class:`OnlineResidual` is the ROS-free core of the ``residual_learner`` node (and of any
in-process loop).  It owns one :mod:`~adaptive_dynamics.learning` learner that models
the residual ``f(x) = tau - Y(x) pi_hat`` of a parametric model that keeps changing:

* :meth:`add_sample` (any thread, cheap): a sample ``(x, y)`` with ``x = (q, qd, qdd)``
  and ``y = tau_measured - tau_parametric``; every ``learn_every``-th offered sample is
  queued (the decimation), the others are dropped.  Non-finite samples are rejected
  and counted; they never reach the learner.
* :meth:`add_parameter_update` (any thread, cheap): the parametric model changed by
  ``delta_pi`` (full coordinates).  With ``transform`` on, the learner is made
  consistent (consistency paper eq. 15-19, ARDL eq. 12-14) -- applied on the worker,
  *in arrival order* with the samples: samples offered before the update were
  measured against the old ``pi_hat`` and are learnt before the transform; later
  ones after it.  Consecutive updates are summed before one transform (the transform
  is linear in ``delta_pi`` and composes exactly).  With ``transform`` off the update
  is ignored: the ablation of the paper's Fig. 4a.
* :meth:`predict` (any thread, never blocks on learning): the learners publish an
  immutable prediction snapshot (see :mod:`.base`), so the control-rate prediction
  never waits for a ``partial_fit`` in progress; ``return_var=True`` adds the predictive
  variance.  Before the learner exists it returns zeros, variance zeros too (:attr:`ready`
  is False).
* :meth:`hint` (any thread, cheap): the input of the next prediction (the reference
  ahead), forwarded to :meth:`Learner.hint` -- learners that select training data
  around the query (PGPOL's k nearest database points) use it at their next update;
  kept and handed over when the learner is built after the warm-up.
* The worker thread (``threaded=True``) drains the queue in blocks of up to
  ``block_size`` samples; ``threaded=False`` learns synchronously in :meth:`process`
  (deterministic runs, tests).
* **Lockstep** (``lockstep=True``, no worker): samples and parameter updates carry the
  stamp of their state (``stamp=``) and wait in stamp order (a sample before an update
  of the same stamp: it was measured against the model before that update); the
  stream's :meth:`advance` to each state hands on what is stamped at or before the state
  ``lockstep_margin`` states back and learns on the calling thread each time ``block_size``
  samples are queued (while learning is off, the updates at once).  What the learner
  knows at ``t`` is then a function of the streams alone, not of how fast this machine
  learns beside the loop: a lockstep simulation gives the same model on any machine,
  under any load (the loop waits for each block's fit).  An item that comes after its
  stamp was handed on is handed on at the next :meth:`advance` (``lockstep_late``).  ``update_samples="latest"`` (PGPOL's paper: one current
  point per model update) takes only the newest of the samples queued since the last
  update and drops the others (``samples_skipped``); the warm-up still collects every
  queued sample.  With :attr:`learning` off, samples still queued are discarded, not
  learnt (``samples_discarded``): the model stops moving at once (parameter updates are
  still applied, so that it stays consistent with the estimate).

Warm-up: the learner is built from the first ``warmup`` queued samples: the GMM takes
its per-coordinate scale from them (its novelty test is in scaled units), the RBF
network its input box (``box="data"``: their range widened by ``box_margin`` of the
span on each side; ``box="limits"``: joint limits, velocity limits and
``acceleration_limit``).  Parameter updates that arrive during the warm-up are applied
exactly to the buffered targets (``y -= Y(x) delta_pi``).

Persistence: :meth:`save` / :meth:`load` (the learner's ``.npz``; writes are atomic).
Snapshots (the prediction / model-update split): :attr:`revision` counts the changes
of the learner (every successful update, transform, load, reset); :meth:`snapshot`
encodes the learner as a versioned snapshot (:mod:`.snapshot`) with its writers held
off, and :meth:`set_learner` adopts a learner object (kind and sizes checked).
"""
from __future__ import annotations

import collections
import heapq
import itertools
import threading
import time
from typing import Any, Dict, Optional, Tuple

import numpy as np

from .base import LEARNERS, Learner, load_learner, make_learner
from .snapshot import encode_snapshot

__all__ = ["OnlineResidual"]

_SAMPLE, _UPDATE = 0, 1
#: ``update_samples``: every queued sample, or the newest one per learner update
UPDATE_SAMPLES = ("all", "latest")
#: lockstep: a state's sample is handed on once this many newer states have come (its parts --
#: the command, the parametric torque -- come from other publishers than the state, and one
#: wake-up of the stream's thread may take a state before a part that came with it)
LOCKSTEP_MARGIN = 5


def _one_blas_thread() -> None:
    """BLAS on one thread, for the whole process (threadpoolctl; nothing without it): the
    worker's setting (tiny matrices: a threaded BLAS thrashes a loaded 2-core machine), and
    what makes a lockstep learner's fits the same from run to run (a multi-threaded BLAS
    splits its sums by thread timing; a closed loop grows 1e-11 into another run)."""
    try:
        from threadpoolctl import threadpool_limits   # optional: scikit-learn's dependency
    except ImportError:  # pragma: no cover
        return
    threadpool_limits(1)


class OnlineResidual:
    """Residual learner fed online (see the module docstring).

    Parameters
    ----------
    model:
        :class:`~adaptive_dynamics.dynamics.RobotModel` whose regressor defines the
        parametric part (its ``parameter_names`` are the coordinates of ``delta_pi``).
    kind:
        ``"gmm"``, ``"rbfn"``, ``"joint_local"``, ... (:data:`~adaptive_dynamics.learning.LEARNERS`).
    config:
        Keyword arguments of the learner's constructor (the RBF network's ``low``,
        ``high`` and ``n_params`` are filled in here unless given).
    learn_every:
        Queue every k-th offered sample.
    block_size:
        Most samples per ``partial_fit`` call on the worker.
    warmup:
        Samples collected before the learner is built (>= 2).
    queue_limit:
        Queued samples beyond this are dropped (counted in ``samples_dropped``): a
        learner slower than the stream loses samples, never memory or latency.
    update_samples:
        ``"all"`` (default): every queued sample is learnt, up to ``block_size`` per
        update; ``"latest"``: each update learns the newest queued sample alone.
    prior, raw:
        What the learner falls back to where its data does not reach, and whether it
        does (:meth:`Learner.set_prediction`): ``"zero"`` for a residual, ``"mean"`` for
        a learner of the torque itself.  A loaded learner keeps its file's prior and
        takes ``raw`` from here.
    lockstep, lockstep_margin:
        Learn in stamp order on the stream's own thread (:meth:`advance`; see the module
        docstring): no worker thread.
    learn_until_ns:
        A scheduled freeze: samples stamped at or after it are not learnt
        (``samples_after_until``); in lockstep the part-block before it is learnt once the
        stream has passed it (parameter updates are applied as ever).
    """

    def __init__(self, model, kind: str = "gmm", config: Optional[Dict[str, Any]] = None, *,
                 learn_every: int = 5, block_size: int = 50, warmup: int = 2000,
                 box: str = "data", box_margin: float = 0.2, acceleration_limit: float = 10.0,
                 queue_limit: int = 20000, learning: bool = True, transform: bool = True,
                 threaded: bool = True, prior="zero", raw: bool = False, update_samples: str = "all",
                 lockstep: bool = False, lockstep_margin: int = LOCKSTEP_MARGIN,
                 learn_until_ns: Optional[int] = None):
        if kind not in LEARNERS:
            raise ValueError(f"unknown learner {kind!r}; available: {sorted(LEARNERS)}")
        if box not in ("data", "limits"):
            raise ValueError(f"box must be 'data' or 'limits', got {box!r}")
        if update_samples not in UPDATE_SAMPLES:
            raise ValueError(f"update_samples must be one of {UPDATE_SAMPLES}, got {update_samples!r}")
        if int(warmup) < 2 or int(learn_every) < 1 or int(block_size) < 1 or int(queue_limit) < 1:
            raise ValueError("warmup must be >= 2; learn_every, block_size and queue_limit >= 1")
        self.model = model
        self.n = n = model.n
        self.kind = kind
        self.config = dict(config or {})
        self.learn_every = int(learn_every)
        self.block_size = int(block_size)
        self.warmup = int(warmup)
        self.box = box
        self.box_margin = float(box_margin)
        self.acceleration_limit = float(acceleration_limit)
        self.queue_limit = int(queue_limit)
        self.learning = bool(learning)
        self.transform = bool(transform)
        self.prior = prior
        self.raw = bool(raw)
        self.latest_only = update_samples == "latest"
        self.learner: Optional[Learner] = None
        self._zeros = np.zeros(n)
        self._queue: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._busy = False
        self._fit_lock = threading.Lock()   # serialises the learner's writers (worker, save, load)
        self._warm_X: list = []
        self._warm_y: list = []
        self._offered = 0
        self.counters: Dict[str, Any] = {k: 0 for k in (
            "samples_offered", "samples_queued", "samples_learned", "samples_rejected", "samples_dropped",
            "updates_received", "updates_rejected", "transforms_applied", "updates_ignored",
            "fit_calls", "fit_errors", "samples_skipped", "samples_discarded", "lockstep_late", "samples_after_until")}
        self.counters["fit_ms_last"] = 0.0
        self.counters["transform_ms_last"] = 0.0
        self.last_error = ""
        self.revision = 0        # +1 on every change of the learner (see snapshot)
        self._hint: Optional[np.ndarray] = None
        self._stop = False
        self._thread = None
        self.lockstep = bool(lockstep)
        self.lockstep_margin = int(lockstep_margin)
        self._recent = collections.deque(maxlen=self.lockstep_margin + 1)   # lockstep: the newest states
        self._due: list = []                 # lockstep: (stamp, kind, seq, payload) in stamp order
        self._seq = itertools.count()
        self._handed_to: Optional[int] = None   # lockstep: stamps up to this were handed on
        self._due_samples = 0                # lockstep: samples queued since the last fit
        self.learn_until_ns = None if learn_until_ns is None else int(learn_until_ns)
        if lockstep and self.latest_only:
            raise ValueError("lockstep learns whole blocks: update_samples must be 'all'")
        if lockstep:
            _one_blas_thread()
        if threaded and not self.lockstep:
            self._thread = threading.Thread(target=self._run, name="residual-learner", daemon=True)
            self._thread.start()

    # ----------------------------------------------------------------- inputs
    @property
    def ready(self) -> bool:
        return self.learner is not None

    def add_sample(self, x, y, stamp: Optional[int] = None) -> bool:
        """Offer one sample (lockstep: of the state stamped ``stamp``, ns); returns True if
        it was queued for learning (lockstep: taken to be handed on in stamp order)."""
        if self.learn_until_ns is not None and stamp is not None and stamp >= self.learn_until_ns:
            self.counters["samples_after_until"] += 1
            return False
        if self.lockstep:
            return self._hold(stamp, _SAMPLE, (np.array(x, dtype=float), np.array(y, dtype=float)))
        return self._offer(x, y)

    def _offer(self, x, y) -> bool:
        c = self.counters
        c["samples_offered"] += 1
        if not self.learning:
            return False
        self._offered += 1
        if (self._offered - 1) % self.learn_every:
            return False
        x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        if x.shape != (3 * self.n,) or y.shape != (self.n,):
            c["samples_rejected"] += 1
            raise ValueError(f"sample shapes {x.shape}, {y.shape}; expected ({3 * self.n},), ({self.n},)")
        if not (np.isfinite(x).all() and np.isfinite(y).all()):
            c["samples_rejected"] += 1
            return False
        with self._cv:
            if len(self._queue) >= self.queue_limit:
                c["samples_dropped"] += 1
                return False
            self._queue.append((_SAMPLE, x.copy(), y.copy()))
            c["samples_queued"] += 1
            self._cv.notify()
        return True

    def add_parameter_update(self, delta_pi, stamp: Optional[int] = None) -> bool:
        """The parametric model moved by ``delta_pi`` (full coordinates; lockstep: at the
        state stamped ``stamp``).  Returns True if it will be applied (transform on),
        False if ignored (off) or rejected."""
        if self.lockstep:
            d = np.asarray(delta_pi, dtype=float).reshape(-1)
            if d.shape != (self.model.n_params,) or not np.isfinite(d).all():
                self.counters["updates_received"] += 1
                self.counters["updates_rejected"] += 1
                return False
            self._hold(stamp, _UPDATE, d.copy())
            return self.transform
        return self._update(delta_pi)

    def _hold(self, stamp: Optional[int], kind: int, payload) -> bool:
        if stamp is None:
            raise ValueError("a lockstep learner takes each sample and update with its state's stamp")
        with self._cv:
            if self._handed_to is not None and stamp <= self._handed_to:
                self.counters["lockstep_late"] += 1
            heapq.heappush(self._due, (int(stamp), kind, next(self._seq), payload))
        return True

    def advance(self, stamp: int) -> int:
        """Lockstep: the stream reached the state stamped ``stamp`` (call it once per state,
        in order): hand on, in stamp order, what is stamped at or before the state
        ``lockstep_margin`` states back, plus what came late, and learn on this thread each
        time ``block_size`` samples are queued (while learning is off, the updates at once).
        Returns the items learnt or applied."""
        if not self.lockstep:
            return 0
        self._recent.append(int(stamp))
        if len(self._recent) <= self.lockstep_margin:
            return 0
        cutoff = self._recent[0]
        updates = 0
        with self._cv:
            due = []
            while self._due and self._due[0][0] <= cutoff:
                due.append(heapq.heappop(self._due))
            self._handed_to = cutoff if self._handed_to is None else max(self._handed_to, cutoff)
        for _stamp, kind, _seq, payload in due:
            if kind == _SAMPLE:
                if self._offer(*payload):
                    self._due_samples += 1
            else:
                self._update(payload)
        if not self.learning:   # the updates now (what is queued is discarded, as ever)
            self._due_samples = 0
            return self.process()
        done = 0
        while self._due_samples >= self.block_size:   # whole blocks only: the same blocks however
            done += self.process(max_samples=self.block_size)   # often the stream advances
            self._due_samples -= self.block_size
        if self._due_samples and self.learn_until_ns is not None and cutoff >= self.learn_until_ns:
            self._due_samples = 0   # the stream passed the freeze: no sample comes to fill the block
            return done + self.process()
        return done + self.process(max_samples=0)   # the updates before the next sample queued

    def _update(self, delta_pi) -> bool:
        c = self.counters
        c["updates_received"] += 1
        d = np.asarray(delta_pi, dtype=float).reshape(-1)
        if d.shape != (self.model.n_params,) or not np.isfinite(d).all():
            c["updates_rejected"] += 1
            return False
        if not self.transform:
            c["updates_ignored"] += 1
            return False
        with self._cv:
            if self._queue and self._queue[-1][0] == _UPDATE:   # sum consecutive updates
                self._queue[-1] = (_UPDATE, self._queue[-1][1] + d, None)
            else:
                self._queue.append((_UPDATE, d.copy(), None))
            self._cv.notify()
        return True

    def hint(self, x) -> bool:
        """The input the next prediction will be asked for (``x = (q, qd, qdd)`` of the
        reference ahead), forwarded to the learner's :meth:`Learner.hint`; before the
        learner exists it is kept for it.  A wrong shape or a non-finite ``x`` is
        ignored (returns False)."""
        x = np.asarray(x, dtype=float).reshape(-1)
        if x.shape != (3 * self.n,) or not np.isfinite(x).all():
            return False
        self._hint = x = x.copy()
        L = self.learner
        if L is not None:
            L.hint(x)
        return True

    # ------------------------------------------------------------- prediction
    def predict(self, X, return_var: bool = False):
        """Residual for the rows of ``X`` (N x 3n, or one 3n vector); with ``return_var``
        ``(mean, var)``, ``var`` the learner's predictive variance (:meth:`Learner.predict`).
        Before the learner exists the residual is zero -- the parametric model alone,
        which contributes nothing uncertain of the learner's -- so mean and variance are
        zeros.  Never waits for learning."""
        L = self.learner
        X = np.asarray(X, dtype=float)
        if L is None:
            zeros = np.zeros(X.shape[:-1] + (self.n,))
            return (zeros, zeros.copy()) if return_var else zeros
        return L.predict(X, return_var=return_var)

    # ----------------------------------------------------------------- worker
    def _run(self) -> None:
        _one_blas_thread()
        while True:
            with self._cv:
                while not self._queue and not self._stop:
                    self._busy = False
                    self._cv.notify_all()
                    self._cv.wait()
                if self._stop and not self._queue:
                    self._busy = False
                    self._cv.notify_all()
                    return
                self._busy = True
            self.process()

    def process(self, max_items: Optional[int] = None, max_samples: Optional[int] = None) -> int:
        """Learn what is queued (on the calling thread); returns the items handled.
        ``max_samples``: stop before the sample after that many (the updates before it
        applied; 0: only the updates at the head of the queue)."""
        done = 0
        samples = 0
        while max_items is None or done < max_items:
            with self._cv:
                if not self._queue:
                    break
                kind = self._queue[0][0]
                if kind == _SAMPLE and max_samples is not None and samples >= max_samples:
                    break
                if kind == _UPDATE:
                    item = self._queue.popleft()
                    batch = None
                else:
                    batch = []
                    if self.latest_only and self.learner is not None:
                        while self._queue and self._queue[0][0] == _SAMPLE:   # up to the next update
                            batch.append(self._queue.popleft())
                        self.counters["samples_skipped"] += len(batch) - 1
                        done += len(batch) - 1
                        batch = batch[-1:]
                    else:
                        size = self.block_size if max_samples is None else min(self.block_size, max_samples - samples)
                        while self._queue and self._queue[0][0] == _SAMPLE and len(batch) < size:
                            batch.append(self._queue.popleft())
                    samples += len(batch)
            if batch is None:
                self._apply_update(item[1])
                done += 1
            elif not self.learning:   # learning turned off: what was still queued is not learnt
                self.counters["samples_discarded"] += len(batch)
                done += len(batch)
            else:
                self._fit(np.array([b[1] for b in batch]), np.array([b[2] for b in batch]))
                done += len(batch)
        return done

    def _fit(self, X: np.ndarray, Y: np.ndarray) -> None:
        with self._fit_lock:
            if self.learner is None:
                self._warm_X.append(X)
                self._warm_y.append(Y)
                if sum(len(a) for a in self._warm_X) < self.warmup:
                    return
                X, Y = np.vstack(self._warm_X), np.vstack(self._warm_y)
                self._warm_X, self._warm_y = [], []
                w = self.warmup
                # exactly the first `warmup` samples set the GMM's scale/novelty radius and the
                # RBF box, and form the first batch: the result does not depend on the blocking
                learner = self._build(X[:w])
                if self._hint is not None:
                    learner.hint(self._hint)
                self.learner = learner
                self._partial_fit(X[:w], Y[:w])
                X, Y = X[w:], Y[w:]
            if len(X):
                self._partial_fit(X, Y)

    def _partial_fit(self, X: np.ndarray, Y: np.ndarray) -> None:
        """One learner update (``_fit_lock`` held)."""
        c = self.counters
        t0 = time.perf_counter()
        try:
            self.learner.partial_fit(X, Y, model=self.model)
        except Exception as exc:   # must not kill the worker: count it, keep the model
            c["fit_errors"] += 1
            self.last_error = f"partial_fit failed: {exc!r}"
            return
        finally:
            c["fit_ms_last"] = round(1e3 * (time.perf_counter() - t0), 3)
        c["fit_calls"] += 1
        c["samples_learned"] += len(X)
        self.revision += 1

    def _apply_update(self, dpi: np.ndarray) -> None:
        c = self.counters
        with self._fit_lock:
            t0 = time.perf_counter()
            if self.learner is None:
                # warm-up buffer: exact, y <- y - Y(x) dpi per sample
                n = self.n
                for X, Y in zip(self._warm_X, self._warm_y):
                    for k in range(len(X)):
                        Y[k] -= self.model.regressor(X[k, :n], X[k, n:2 * n], X[k, 2 * n:]) @ dpi
            else:
                try:
                    self.learner.apply_parameter_update(dpi, self.model)
                except Exception as exc:
                    c["fit_errors"] += 1
                    self.last_error = f"consistency transform failed: {exc!r}"
                    return
            c["transform_ms_last"] = round(1e3 * (time.perf_counter() - t0), 3)
            c["transforms_applied"] += 1
            if self.learner is not None:
                self.revision += 1

    def _build(self, X: np.ndarray) -> Learner:
        cfg = dict(self.config)
        n = self.n
        if self.kind == "rbfn":
            if "low" not in cfg or "high" not in cfg:
                if self.box == "data":
                    lo, hi = X.min(axis=0), X.max(axis=0)
                    span = np.maximum(hi - lo, 1e-3)
                    lo, hi = lo - self.box_margin * span, hi + self.box_margin * span
                else:
                    m = self.model
                    a = np.full(n, self.acceleration_limit)
                    lo = np.concatenate([m.lower, -m.velocity_limit, -a])
                    hi = np.concatenate([m.upper, m.velocity_limit, a])
                cfg.setdefault("low", lo)
                cfg.setdefault("high", hi)
            cfg.setdefault("n_params", self.model.n_params)
        if self.kind == "joint_local":
            cfg.setdefault("n_params", self.model.n_params)
        if self.kind in ("rbfn", "gmm", "joint_local"):
            # this stream's warm-up is the learner's: the network's target scaling, the
            # mixture's geometry come from the same samples, and it predicts from the first update
            cfg.setdefault("warmup", max(1, X.shape[0]))
        cfg.setdefault("prior", self.prior)
        cfg.setdefault("raw", self.raw)
        return make_learner(self.kind, input_dim=3 * n, output_dim=n, **cfg)

    # ---------------------------------------------------------------- control
    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued has been learnt (True) or ``timeout`` passed."""
        if self._thread is None:
            if self.lockstep:   # everything still waiting for its stamp's turn, in order
                with self._cv:
                    due = [heapq.heappop(self._due) for _ in range(len(self._due))]
                for _stamp, kind, _seq, payload in due:
                    if kind == _SAMPLE:
                        self._offer(*payload)
                    else:
                        self._update(payload)
                self._due_samples = 0
            self.process()
            return True
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def stop(self, timeout: float = 5.0) -> None:
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def reset(self) -> None:
        """Forget the learned model and anything queued."""
        with self._cv:
            self._queue.clear()
            self._due.clear()
            self._due_samples = 0
            self._recent.clear()
        with self._fit_lock:
            self.learner = None
            self._warm_X, self._warm_y = [], []
            self.revision += 1

    def save(self, path) -> Optional[str]:
        """Save the learner (None if nothing is learnt yet)."""
        with self._fit_lock:
            if self.learner is None:
                return None
            return self.learner.save(path)

    def load(self, path) -> Learner:
        """Replace the learner by a saved one (kind and sizes checked)."""
        return self.set_learner(load_learner(path), where=str(path))

    def set_learner(self, L: Learner, where: str = "the learner") -> Learner:
        """Replace the learner by ``L`` (kind and sizes checked; raises ValueError naming
        ``where`` and what differs)."""
        if L.kind != self.kind:
            raise ValueError(f"{where} holds a {L.kind!r} learner but the configured learner is {self.kind!r}")
        if (L.input_dim, L.output_dim) != (3 * self.n, self.n):
            raise ValueError(f"{where}: learner maps {L.input_dim} -> {L.output_dim} values, this robot needs"
                             f" x = (q, qd, qdd) of {3 * self.n} -> {self.n}")
        if L.kind in ("rbfn", "joint_local") and getattr(L, "n_params", 0) not in (0, self.model.n_params):
            raise ValueError(f"{where}: the {L.kind} learner carries dW/dpi for {L.n_params} parameters, the model has"
                             f" {self.model.n_params} (friction columns on/off?)")
        L.set_prediction(raw=self.raw)    # the prior is the file's (e.g. identify's torque offsets)
        with self._fit_lock:
            if self._hint is not None:
                L.hint(self._hint)
            self.learner = L
            self.revision += 1
        return L

    def snapshot(self, version: int, *, source: str = "", epoch: str = "") -> Optional[Tuple[int, bytes]]:
        """``(revision, bytes)``: the learner as a snapshot numbered ``version`` in
        ``epoch`` (:func:`~adaptive_dynamics.learning.snapshot.encode_snapshot`), encoded
        while no update runs, with the :attr:`revision` it shows; None before the learner
        exists."""
        with self._fit_lock:
            if self.learner is None:
                return None
            return self.revision, encode_snapshot(self.learner, version, source=source, epoch=epoch)

    def size(self) -> int:
        L = self.learner
        if L is None:
            return 0
        return int(getattr(L, "n_components", getattr(L, "n_basis", 0)))

    def diagnostics(self) -> Dict[str, Any]:
        d = dict(self.counters)
        d.update(ready=self.ready, learner=self.kind, size=self.size(), queue=len(self._queue) + len(self._due),
                 learning=self.learning, transform=self.transform,
                 warmup_buffered=sum(len(a) for a in self._warm_X))
        d["raw_prediction"] = self.raw
        if self.learner is not None:
            d.update(self.learner._counters())   # n_updates, n_rejected, n_queries_outside, ...
            d["pulled_back_fraction"] = round(self.learner.pulled_back_fraction, 4)
        return d

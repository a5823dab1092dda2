"""Real-time scheduling of a node process: ``SCHED_FIFO`` for its threads.

What ros2_control's controller manager does for its update loop
(``realtime_tools::configure_sched_fifo``), for a Python node: every thread of the
process -- the hot path, the DDS receive and event threads, the executor thread that
shares the GIL with them -- is put on ``SCHED_FIFO`` at one priority, and threads they
create later inherit it.  A FIFO thread runs as soon as it is runnable, ahead of every
normally scheduled thread, so the other nodes' work (a ``/clock`` message waking every
sim-time node, a trajectory batch, a plotting tool) no longer delays the 1 kHz
exchange: measured with ``bench/loop.py`` on the 2-vCPU VM, the bursts after each
``/clock`` message went from 40-55 % late cycles to ~5 %.

It needs permission: root, ``CAP_SYS_NICE``, or an ``rtprio`` limit at least the
priority (``ulimit -r``; e.g. ``@realtime - rtprio 98`` in
``/etc/security/limits.conf``, as Franka's and ros2_control's real-time set-up guides
ask).  Without it :func:`set_fifo_priority` changes nothing and says why; the caller
logs that and runs with normal scheduling.  Linux only (``os.sched_setscheduler``).

No ROS import here: the nodes call it (parameter ``realtime_priority``).
"""
from __future__ import annotations

import os

import numpy as np

__all__ = ["MAX_PRIORITY", "OverloadTracker", "SampleRing", "raise_thread_priority", "set_fifo_priority",
           "thread_policies"]

#: highest priority offered: 99 is left to the kernel's own threads (watchdogs, migration)
MAX_PRIORITY = 98


def _tids(pid: int | None = None) -> list[int]:
    try:
        return sorted(int(t) for t in os.listdir(f"/proc/{pid or 'self'}/task"))
    except OSError:
        return [0]  # no /proc: the calling thread only


def set_fifo_priority(priority: int) -> tuple[bool, str]:
    """Put every thread of this process on ``SCHED_FIFO`` at ``priority`` (1..98).

    Returns ``(True, summary)`` or ``(False, reason)``; on failure no thread is left
    changed.  Threads that exit meanwhile are skipped."""
    priority = int(priority)
    if not 1 <= priority <= MAX_PRIORITY:
        return False, f"priority {priority} outside 1..{MAX_PRIORITY}"
    if not hasattr(os, "sched_setscheduler"):
        return False, "SCHED_FIFO needs Linux (os.sched_setscheduler is missing)"
    done: list[tuple[int, int, int]] = []  # (tid, old policy, old priority) to undo on failure
    try:
        for tid in _tids():
            try:
                old = (os.sched_getscheduler(tid), os.sched_getparam(tid).sched_priority)
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
            except ProcessLookupError:  # the thread ended
                continue
            done.append((tid, *old))
    except PermissionError:
        for tid, policy, prio in done:
            try:
                os.sched_setscheduler(tid, policy, os.sched_param(prio))
            except OSError:
                pass
        limit = _rtprio_limit()
        return False, (f"not permitted (rtprio limit {limit}; run as root, grant CAP_SYS_NICE or raise"
                       f" the rtprio limit to >= {priority}, e.g. '@realtime - rtprio 98' in"
                       f" /etc/security/limits.conf)")
    return True, f"SCHED_FIFO priority {priority} on {len(done)} threads"


def raise_thread_priority(delta: int = 1) -> int | None:
    """Raise the *calling* thread's ``SCHED_FIFO`` priority by ``delta`` (capped at
    :data:`MAX_PRIORITY`) above the process's, e.g. a loop that keeps the ticks over the
    DDS threads of its own process; returns the new priority, or ``None`` when the
    thread is not FIFO (nothing changed) or the change is refused."""
    if not hasattr(os, "sched_setscheduler"):
        return None
    try:
        if os.sched_getscheduler(0) != os.SCHED_FIFO:
            return None
        prio = min(os.sched_getparam(0).sched_priority + int(delta), MAX_PRIORITY)
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(prio))  # 0: this thread (Linux)
        return prio
    except OSError:
        return None


def _rtprio_limit() -> str:
    try:
        import resource
        soft, _hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
        return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    except (ImportError, AttributeError, OSError):
        return "unknown"


def thread_policies(pid: int | None = None) -> dict[int, tuple[str, int]]:
    """``{tid: (policy name, priority)}`` of a process's threads (this one by default)."""
    names = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_FIFO", "SCHED_RR", "SCHED_BATCH",
                                          "SCHED_IDLE") if hasattr(os, n)}
    out = {}
    for tid in _tids(pid):
        try:
            out[tid] = (names.get(os.sched_getscheduler(tid), "?"), os.sched_getparam(tid).sched_priority)
        except OSError:
            continue
    return out


class OverloadTracker:
    """Episodes of sustained deadline misses in a periodic loop, and their recovery.

    :meth:`tick` is told, once per period, whether that period missed its deadline.
    Isolated misses (a late wake-up, a DDS hiccup) are the loop's baseline; an
    **episode** is a stretch in which at least ``start_misses`` of the last ``window``
    periods missed (a stalled controller, a stalled simulator, a neighbour taking the
    CPU).  A missed period is *dense* when at least half that many of the last
    ``window`` missed; the episode is over once ``quiet`` periods have passed without a
    dense one (isolated misses do not prolong it).  Its ``duration_ms`` runs from the
    oldest miss in the window that started it to its last dense period (the time the loop
    was not keeping up), ``missed`` counts the misses in between.

    Allocation-free per tick (a fixed ring of booleans); the episode list keeps the
    last ``keep`` episodes.  ``miss_log`` (anything with ``add(int)``, e.g. a
    preallocated ring) receives the index of every missed period, skipped ones included
    (at most ``MISS_LOG_SKIPPED`` of one stall).  No ROS import: the bridge's real-time
    loop feeds it and reports it in ``/diagnostics`` and its statistics.
    """

    #: the most skipped periods of one stall written to ``miss_log``
    MISS_LOG_SKIPPED = 100_000

    def __init__(self, period_s: float, window: int = 20, start_misses: int = 10, quiet: int = 100,
                 keep: int = 100, miss_log=None):
        if not (0 < start_misses <= window) or quiet < 1 or period_s <= 0:
            raise ValueError("need 0 < start_misses <= window, quiet >= 1, period_s > 0")
        self.period_ms = 1e3 * period_s
        self.window, self.start_misses, self.quiet, self.keep = int(window), int(start_misses), int(quiet), int(keep)
        self.dense_misses = max(1, self.start_misses // 2)
        self._ring = [False] * self.window
        self._i = 0
        self._recent = 0           # misses among the last `window` periods
        self._ticks = 0
        self._first_miss = None    # the episode's first miss
        self._last_dense = None    # the episode's last dense period
        self._missed = 0           # misses since the episode started (its window's included)
        self._missed_at_dense = 0  # ... up to its last dense period
        self.active = False
        self.episodes: list[dict] = []
        self.count = 0
        self.miss_log = miss_log

    def tick(self, missed: bool) -> "str | None":
        """Record one period; returns ``"start"`` / ``"end"`` when an episode starts or
        ends at this period, else None."""
        t = self._ticks
        self._ticks += 1
        if missed and self.miss_log is not None:
            self.miss_log.add(t)
        old = self._ring[self._i]
        self._ring[self._i] = missed
        self._i = (self._i + 1) % self.window
        self._recent += int(missed) - int(old)
        if self.active:
            self._missed += int(missed)
            if missed and self._recent >= self.dense_misses:
                self._last_dense, self._missed_at_dense = t, self._missed
            elif t - self._last_dense >= self.quiet:
                self.active = False
                self.episodes.append(self._episode())
                del self.episodes[:-self.keep]
                return "end"
            return None
        if missed and self._recent >= self.start_misses:
            self.active = True
            self.count += 1
            self._first_miss = self._oldest_miss(t)
            self._last_dense = t
            self._missed = self._missed_at_dense = self._recent
            return "start"
        return None

    def _episode(self) -> dict:
        """The current episode as reported: first miss to last dense period."""
        return {"start_tick": self._first_miss, "end_tick": self._last_dense,
                "duration_ms": round((self._last_dense - self._first_miss + 1) * self.period_ms, 3),
                "missed": self._missed_at_dense}

    def _oldest_miss(self, t: int) -> int:
        """The tick of the oldest miss among the last ``window`` periods (``t`` the newest)."""
        w = self.window
        for k in range(w):                       # the ring from its oldest slot on
            if self._ring[(self._i + k) % w]:
                return t - (w - 1 - k)
        return t

    def skipped(self, periods: int) -> list:
        """Record ``periods`` periods the loop did not run at all (it woke that late: the
        loop itself stalled) as missed; returns the events, as :meth:`tick` gives them.
        Bounded work: after ``window`` missed periods an episode is running and the rest
        only lengthens it."""
        periods = max(0, int(periods))
        head = min(periods, self.window)
        events = [e for e in (self.tick(True) for _ in range(head)) if e]
        rest = periods - head
        if rest:
            if self.miss_log is not None:
                for k in range(min(rest, self.MISS_LOG_SKIPPED - head)):
                    self.miss_log.add(self._ticks + k)
            self._ticks += rest
            self._missed += rest
            self._last_dense, self._missed_at_dense = self._ticks - 1, self._missed
        return events

    @property
    def ticks(self) -> int:
        """Periods recorded so far (run or skipped)."""
        return self._ticks

    @property
    def current_ms(self) -> float:
        """How long the episode in progress has lasted so far (0 when none)."""
        if not self.active or self._first_miss is None:
            return 0.0
        return (self._ticks - self._first_miss) * self.period_ms

    def all_episodes(self) -> list:
        """The ended episodes, and the one in progress (``"open": True``, up to its last
        dense period so far) -- what a final report lists, so that it has
        :attr:`count` entries (of the last ``keep``)."""
        out = list(self.episodes)
        if self.active and self._first_miss is not None:
            out.append({**self._episode(), "open": True})
        return out[-self.keep:]

    def summary(self) -> dict:
        """``overload_episodes``, ``overload_active``, ``overload_longest_ms``,
        ``overload_last_ms`` (0 before any)."""
        durations = [e["duration_ms"] for e in self.episodes]
        return {"overload_episodes": self.count, "overload_active": self.active,
                "overload_longest_ms": max(durations + [self.current_ms]) if durations or self.active else 0.0,
                "overload_last_ms": durations[-1] if durations else 0.0}


class SampleRing:
    """The last ``capacity`` integer samples (e.g. latencies in ns) in a preallocated
    ring: :meth:`add` is O(1) and allocates nothing (it runs on a 1 kHz hot path).

    A ``collections.deque`` of Python ints had to be converted to an array for every
    statistic: ~8 ms with the GIL held for 100k samples, i.e. eight missed 1 kHz cycles
    of the thread that shares the GIL, once per diagnostics period.  Here a periodic
    report takes percentiles of the :meth:`recent` samples (a copy of at most ``k``
    values, tens of us), and only the final statistics read them :meth:`all`."""

    def __init__(self, capacity: int):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self._buf = np.zeros(int(capacity), dtype=np.int64)
        self._count = 0

    def add(self, value: int) -> None:
        self._buf[self._count % self._buf.size] = value
        self._count += 1

    def __len__(self) -> int:
        return min(self._count, self._buf.size)

    @property
    def total(self) -> int:
        """Samples ever added (including those overwritten)."""
        return self._count

    def recent(self, k: int):
        """A copy of the last ``min(k, len(self))`` samples, oldest first."""
        k = min(int(k), len(self))
        if k <= 0:
            return np.empty(0, dtype=np.int64)
        end = self._count % self._buf.size
        if end >= k:
            return self._buf[end - k:end].copy()
        return np.concatenate((self._buf[self._buf.size - (k - end):], self._buf[:end]))

    def all(self):
        """A copy of every retained sample, oldest first."""
        return self.recent(len(self))

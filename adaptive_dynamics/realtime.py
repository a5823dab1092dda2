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

__all__ = ["MAX_PRIORITY", "raise_thread_priority", "set_fifo_priority", "thread_policies"]

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

"""How the control layer's runners (:class:`~.adaptive_session.AdaptiveSession`,
:class:`~.scqp_episodes.SCQPSession`) report without ROS: messages go to ``log(level,
text, key)`` (``key``: a message that may repeat every cycle, for the caller to throttle;
default: Python's ``logging``), counted events to ``count(key)`` as they happen (a node
passes its diagnostics counters) and are kept in :attr:`Reporting.counts` either way."""
from __future__ import annotations

import logging
from typing import Callable, Iterable, Optional

__all__ = ["Reporting"]


class Reporting:
    """``counts``: the events kept (all zero at start); ``log`` / ``count``: see the module."""

    def __init__(self, name: str, counts: Iterable[str], log: Optional[Callable[..., None]] = None,
                 count: Optional[Callable[[str], None]] = None):
        self.counts = {k: 0 for k in counts}
        self._sink = count
        if log is None:
            logger = logging.getLogger(f"adaptive_dynamics.{name}")

            def log(level: str, text: str, key: Optional[str] = None) -> None:
                logger.log(getattr(logging, level.upper()), text)
        self.log = log

    def _count(self, key: str) -> None:
        self.counts[key] += 1
        if self._sink is not None:
            self._sink(key)

    def unreported_counts(self) -> dict:
        """The counts a caller without ``count`` reads in the diagnostics (empty with it)."""
        return dict(self.counts) if self._sink is None else {}

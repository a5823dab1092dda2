"""The one protocol of the control laws (no ROS).

Every law of :mod:`adaptive_dynamics.control` -- PD and computed torque
(:mod:`.baseline`), the direct and composite adaptive laws (:mod:`.adaptive`), adaptive
backstepping (:mod:`.backstepping`), the task-space MRAC (:mod:`.mrac`) and SCQP
(:mod:`.scqp`) -- answers to the same names:

``compute(state, reference, ...) -> tau``
    one control cycle (the arguments are the law's: joint or task-space reference; a
    learning law also takes the measured torque and ``learn``);
``state_dict() -> dict``
    what the law has learned and needs to go on (plain numpy arrays, no pickle);
``load_state_dict(state)``
    the inverse; checks everything before it changes anything (``ValueError`` names
    what differs);
``save(path) -> str`` / ``load_state(path)``
    :meth:`state_dict` as an ``.npz`` file, written durably and atomically
    (:func:`adaptive_dynamics.files.atomic_write`), and read back.

:class:`NpzState` gives a law ``save`` and ``load_state`` from its ``state_dict`` and
``load_state_dict``; ``test/test_control_protocol.py`` checks every law class.
"""
from __future__ import annotations

import io
import os
from typing import Optional, Protocol, runtime_checkable

import numpy as np

from ..files import atomic_write

__all__ = ["ControlLaw", "NpzState", "read_npz"]


@runtime_checkable
class ControlLaw(Protocol):
    def compute(self, *args, **kwargs) -> np.ndarray: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict, **kwargs) -> None: ...

    def save(self, path, state: Optional[dict] = None) -> str: ...

    def load_state(self, path, **kwargs) -> None: ...


def read_npz(path, what: str) -> dict:
    """The arrays of an ``.npz`` state file (no pickle); ``ValueError`` naming ``what`` it
    should have been when it cannot be read (``FileNotFoundError`` as it is)."""
    try:
        with np.load(os.fspath(path), allow_pickle=False) as f:
            return {k: f[k] for k in f.files}
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ValueError(f"{os.fspath(path)}: not {what} ({exc})") from None


class NpzState:
    """``save`` / ``load_state`` of a law from its ``state_dict`` / ``load_state_dict``."""

    #: what the file is, for error messages
    STATE_WHAT = "a controller state file"

    def save(self, path, state: Optional[dict] = None) -> str:
        """Write :meth:`state_dict` (or the snapshot ``state`` taken earlier: a node takes
        it under its lock and writes outside it) to ``path`` (``.npz`` added if missing),
        durably and atomically.  Returns the path."""
        path = os.fspath(path)
        if not path.endswith(".npz"):
            path += ".npz"
        buf = io.BytesIO()
        np.savez(buf, **(self.state_dict() if state is None else state))
        return atomic_write(path, buf.getvalue())

    def load_state(self, path, **kwargs) -> None:
        """:meth:`load_state_dict` of a file written by :meth:`save` (keyword arguments
        are the law's, e.g. ``covariance``)."""
        self.load_state_dict(read_npz(path, self.STATE_WHAT), where=os.fspath(path), **kwargs)

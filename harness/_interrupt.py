"""Ctrl-C as a run owns it, with nothing heavier than :mod:`signal` imported: the command line
installs it before it imports the command it runs, so a Ctrl-C while the harness itself loads
is not lost (an interrupt raised in the middle of an import can land in a callback where Python
ignores it, and the run would go on)."""

from __future__ import annotations

import signal
import threading
from typing import Any

__all__ = ["StopOnSigint"]


class StopOnSigint:
    """Ctrl-C stops a run between trials: the first SIGINT asks, the run ends after the trials
    in flight; a second one interrupts at once (KeyboardInterrupt, :attr:`hard`).

    An interrupt raised at an arbitrary point can land where Python ignores it (a weakref
    callback, a finaliser) and be lost; a flag read between trials cannot. One is active at a
    time in a process (:meth:`active`): a command installs it before it loads anything, so a
    Ctrl-C while the suite loads stops the run too, and the run's lifecycle uses it.
    """

    _current: StopOnSigint | None = None

    def __init__(self) -> None:
        self.requested = False
        self.hard = False
        self._previous: Any = None
        self._installed = False
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._ask)
            self._installed = True
            StopOnSigint._current = self

    @classmethod
    def active(cls) -> tuple[StopOnSigint, bool]:
        """The stop installed in this process, or a new one; whether it is new (its maker
        restores the handler)."""
        current = cls._current
        if current is not None and current._installed:
            return current, False
        return cls(), True

    def _ask(self, _signum: int, _frame: Any) -> None:
        if self.requested:
            self.hard = True
            raise KeyboardInterrupt
        self.requested = True

    def restore(self) -> None:
        """Put the handler back as it was."""
        if self._installed:
            signal.signal(signal.SIGINT, self._previous)
            self._installed = False
            if StopOnSigint._current is self:
                StopOnSigint._current = None

    def __enter__(self) -> StopOnSigint:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.restore()

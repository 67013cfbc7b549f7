"""Hooks for an observer of episodes and calls (tracing), costing one check each when unused.

The engine calls these hooks where an episode opens and closes, where a call of an action
runs, where a transaction reaches an outcome and where a compensation runs. With no observer
installed (the default) each hook is one ``is None`` check; :mod:`harness.integrations.otel`
installs one that makes OpenTelemetry spans. This module imports nothing of the harness and
nothing of any tracing library, so every layer of the engine may call it.

An adapter that knows the model's id for a tool call says so with :func:`tool_call`, so an
observer can record it (OpenTelemetry's ``gen_ai.tool.call.id``)::

    with observe.tool_call(call.id):
        answer = call(action, call.arguments)
"""

from __future__ import annotations

import contextvars
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

__all__ = [
    "CallObservation",
    "EpisodeObservation",
    "Observer",
    "current_tool_call",
    "install",
    "installed",
    "tool_call",
    "uninstall",
]

# A call's steps, as the engine drives them (harness.transaction.Steps).
Steps = Generator[Any, Any, Any]


class EpisodeObservation(Protocol):
    """What an observer keeps of one open episode."""

    def close(self, error: BaseException | None) -> None:
        """The episode ended (its outcome is set), ``error`` the exception that ended it."""


class CallObservation(Protocol):
    """What an observer keeps of one transaction while it runs; the recorder reports to it."""

    def refused(self, status: str, failure_class: str, decision: str, reason: str) -> None:
        """Nothing ran: a precondition refused it, or it is held for a person."""

    def failed(self, status: str, failure_class: str, decision: str, reason: str) -> None:
        """It ran and did not commit (or its undo failed): its class, the decision, why."""

    def committed(self, status: str, step: int | None) -> None:
        """It committed (``committed``, or ``recovered``: its effect found without an answer)."""

    def retrying(self, attempt: int, wait: float, error: BaseException | None) -> None:
        """An attempt failed and another follows after ``wait`` seconds."""

    def escalated(self, escalation_id: str) -> None:
        """A person is asked to decide (the escalation's id)."""


class Observer(Protocol):
    """Watches episodes and calls: what :func:`install` takes."""

    def episode(self, episode: Any) -> EpisodeObservation | None:
        """An episode opened (its log is bound, it is about to say it started)."""

    def call(self, episode: Any, observed: Any, action: Any, steps: Steps) -> Steps:
        """One call of ``action`` in ``episode`` (``observed``: the episode's observation, or
        None): returns the steps to drive in place of ``steps``, which it must run."""

    def transaction(self, txn: Any) -> CallObservation | None:
        """A transaction of the call running in this context starts its steps."""

    def compensation(self, action: Any, ctx: Any, steps: Steps) -> Steps:
        """A compensation of ``action`` (its call's context ``ctx``): steps to drive instead."""


# The installed observer; the engine reads it as ``observe.hook`` at each hook.
hook: Observer | None = None

_TOOL_CALL: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "harness_tool_call", default=None
)


def install(observer: Observer) -> None:
    """Make ``observer`` watch every episode opened and every call made from now on."""
    global hook
    hook = observer


def uninstall() -> None:
    """Stop observing (episodes already open keep their observation until they close)."""
    global hook
    hook = None


def installed() -> Observer | None:
    """The observer installed, if any."""
    return hook


@contextmanager
def tool_call(call_id: str | None) -> Iterator[None]:
    """Within the block, calls of actions answer the model's tool call ``call_id``."""
    token = _TOOL_CALL.set(call_id)
    try:
        yield
    finally:
        _TOOL_CALL.reset(token)


def current_tool_call() -> str | None:
    """The model's id of the tool call being answered in this context, if an adapter said."""
    return _TOOL_CALL.get()

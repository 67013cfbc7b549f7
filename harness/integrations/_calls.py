"""One call of an action on behalf of a framework, told as the framework's model should see it.

Every adapter runs an action the same way: in the episode current in the caller's context (or
the one given), with the arguments the model sent as a mapping. A refusal (invalid arguments, a
failed precondition, a rejection, a failed action) comes back as an :class:`Answer` the adapter
turns into the framework's tool result; an escalation or a closed episode is raised, for the
adapter to stop the run its own way.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .. import observe
from .._json import dumps
from ..action import ACTIVE_CALL, CURRENT_EPISODE, OPEN_EPISODES, Action
from ..errors import ConfigurationError, NotInEpisode, refusal

__all__ = ["Answer", "acall", "acall_in_turn", "call", "checked", "episode_for", "flatten"]


@dataclass(frozen=True)
class Answer:
    """What one call gave: its value, or the refusal the model is told about."""

    ok: bool
    value: Any = None
    kind: str | None = None
    message: str = ""

    @property
    def text(self) -> str:
        """The answer as text, for frameworks whose tool results are strings."""
        if not self.ok:
            return f"Error: {self.message}"
        if isinstance(self.value, str):
            return self.value
        return dumps(self.value)


def episode_for(action: Action[Any, Any], episode: Any = None) -> Any:
    """The episode a call runs in: the one given, else the one current in this context."""
    found = episode if episode is not None else CURRENT_EPISODE.get()
    if found is None:
        raise NotInEpisode(action.name, open_elsewhere=len(OPEN_EPISODES))
    return found


def _refused(exc: Exception) -> Answer:
    told = refusal(exc)
    if told is None:
        raise exc
    return Answer(False, kind=told[0], message=told[1])


def call(
    action: Action[Any, Any],
    arguments: dict[str, Any],
    episode: Any = None,
    tool_call_id: str | None = None,
) -> Answer:
    """Run a sync action with a model's arguments in the episode (see the module).

    ``tool_call_id``: the model's id of the tool call this answers, for traces
    (:func:`harness.observe.tool_call`).
    """
    ep = episode_for(action, episode)
    try:
        with observe.tool_call(tool_call_id):
            return Answer(True, ep.call_mapping(action, dict(arguments)))
    except Exception as exc:
        return _refused(exc)


async def acall(
    action: Action[Any, Any],
    arguments: dict[str, Any],
    episode: Any = None,
    tool_call_id: str | None = None,
) -> Answer:
    """Run an action from a coroutine: an async one awaited, a sync one in a worker thread
    (with this context, so the episode is current there) so the event loop keeps running."""
    ep = episode_for(action, episode)
    with observe.tool_call(tool_call_id):
        return await _acall(action, arguments, ep)


async def _acall(action: Action[Any, Any], arguments: dict[str, Any], ep: Any) -> Answer:
    try:
        if action.is_async:
            value = await ep.call_mapping(action, dict(arguments))
        else:
            value = await asyncio.to_thread(ep.call_mapping, action, dict(arguments))
        return Answer(True, value)
    except Exception as exc:
        return _refused(exc)


def checked(action: Any, where: str, framework: str) -> Action[Any, Any]:
    """``action`` if it is an ``@hx.action``; else the error naming the fix."""
    if not isinstance(action, Action):
        raise ConfigurationError(
            f"{where} takes an @hx.action, not {type(action).__name__} {action!r}; decorate the "
            f"tool function with @hx.action(...) first (a plain function can go to {framework} "
            "as it is)"
        )
    return action


def flatten(
    items: tuple[Action[Any, Any] | Iterable[Action[Any, Any]], ...], where: str, framework: str
) -> list[Action[Any, Any]]:
    """Actions given one by one or as iterables (``tools(*env.actions)``, ``tools(actions)``),
    in order; two with one name are refused (the model tells tools apart by name)."""
    flat: list[Action[Any, Any]] = []
    for item in items:
        if isinstance(item, Action):
            flat.append(item)
        elif isinstance(item, Iterable) and not isinstance(item, (str, bytes)):
            flat.extend(checked(a, where, framework) for a in item)
        else:
            flat.append(checked(item, where, framework))
    names = [a.name for a in flat]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(
            f"{where}: two actions are named {', '.join(map(repr, twice))}; the model tells "
            "tools apart by name, so give one another with @hx.action(name=...)"
        )
    return flat


# Per episode and event loop: the turn calls made at once take, first come first served.
# Frameworks start one model response's tool calls as tasks in the order the model made them,
# but a sync action then waits for the episode in a worker thread, where a later async call
# could overtake it: the record's order would be a race, and a resumed run (held to that
# order) could diverge from it.
_TURNS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _turn(ep: Any) -> asyncio.Lock | None:
    running = ACTIVE_CALL.get()
    if running is not None and running.in_tool and running.episode_id == ep.id:
        return None  # called from inside a running tool: part of that call, whose turn it is
    locks = _TURNS.setdefault(ep, weakref.WeakKeyDictionary())
    return locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())


def _finished(turn: asyncio.Lock | None) -> Callable[[asyncio.Future[Answer]], None]:
    def done(task: asyncio.Future[Answer]) -> None:
        if turn is not None:
            turn.release()
        # A call whose caller was cancelled finishes alone; its outcome is in the store, and
        # an error it ended with (the episode closed meanwhile) is nobody's to report.
        if not task.cancelled():
            task.exception()

    return done


async def acall_in_turn(
    action: Action[Any, Any],
    arguments: dict[str, Any],
    episode: Any,
    tool_call_id: str | None = None,
) -> Answer:
    """:func:`acall` for a framework that runs one response's calls at once.

    The calls take the episode in the order they were made (the order the framework started
    them), so the record, and a resume held to it, does not depend on a race. A call that has
    started is shielded from cancellation (a sibling tool that raised, a cancelled run): its
    transaction still ends in a commit or an undo, never in doubt, and ``async with
    hx.Episode(...)`` waits for it; a call still waiting for its turn is dropped.
    """
    turn = _turn(episode)
    if turn is not None:
        await turn.acquire()  # (cancelled while waiting: the call never started)
    task = asyncio.ensure_future(acall(action, arguments, episode, tool_call_id))
    task.add_done_callback(_finished(turn))
    return await asyncio.shield(task)

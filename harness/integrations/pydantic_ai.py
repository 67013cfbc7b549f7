"""Actions as Pydantic AI tools: every call the model makes is one transaction.

::

    from pydantic_ai import Agent
    from harness.integrations.pydantic_ai import as_tool, toolset

    agent = Agent(model, tools=[as_tool(deposit)])          # one action
    agent = Agent(model, toolsets=[toolset(deposit, refund)])  # or several as a toolset

    async with hx.Episode(state=state, store=url):
        result = await agent.run("Put 10 in account a")

The model sees the action's own name, description and JSON Schema (``action.schema``, the
schema the harness validates against), not one Pydantic AI rebuilds from the signature. Each
call runs in the episode current where ``agent.run(...)`` is awaited, or the one given.

How each outcome reaches the run:

- committed: the tool's result is the tool's answer;
- refused (invalid arguments, a false precondition, a person's rejection, a failed or rolled
  back action): raised as :class:`pydantic_ai.ToolFailed`, which the model reads as a failed
  tool result (the provider's error channel) and the run goes on;
- escalated: :class:`harness.Escalated` propagates out of ``agent.run(...)`` with its
  ``escalation_id``; once a person resolves it (``Store.resolve``), run the agent again in
  ``hx.Episode(..., episode_id=<same>, resume=True)``: calls that committed are answered from
  the record, the approved call runs once;
- the episode is closed (rolled back or escalated before): :class:`harness.EpisodeClosed`
  propagates out of ``agent.run(...)``.

Pydantic AI runs the tool calls of one model response at once, as tasks; the episode runs them
one at a time, each recorded with its own changes, in the order the model made them (so a
resumed run, which must repeat the record's order, makes them in the same order).
"""

from __future__ import annotations

import asyncio
import copy
import weakref
from collections.abc import Iterable
from typing import Any

from pydantic_ai import Tool, ToolFailed
from pydantic_ai.toolsets import FunctionToolset

from ..action import ACTIVE_CALL, Action
from ..errors import ConfigurationError
from ._calls import acall, episode_for

__all__ = ["as_tool", "toolset"]


def _checked(action: Any, where: str) -> Action[Any, Any]:
    if not isinstance(action, Action):
        raise ConfigurationError(
            f"{where} takes an @hx.action, not {type(action).__name__} {action!r}; decorate the "
            "tool function with @hx.action(...) first (a plain function can go to Pydantic AI "
            "as it is)"
        )
    return action


# Per episode and event loop: the turn adapter calls take, first come first served. Pydantic AI
# starts a response's tool calls as tasks in the order the model made them and they reach
# their tools in that order, but a sync action then waits for the episode in a worker thread,
# where a later async call could overtake it: the record's order would be a race, and a
# resumed run (held to that order) could diverge from it.
_TURNS: weakref.WeakKeyDictionary[Any, weakref.WeakKeyDictionary[Any, asyncio.Lock]] = (
    weakref.WeakKeyDictionary()
)


def _turn(ep: Any) -> asyncio.Lock | None:
    running = ACTIVE_CALL.get()
    if running is not None and running.in_tool and running.episode_id == ep.id:
        return None  # called from inside a running tool: part of that call, whose turn it is
    locks = _TURNS.setdefault(ep, weakref.WeakKeyDictionary())
    return locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())


def _finished(turn: asyncio.Lock | None) -> Any:
    def done(task: asyncio.Task[Any]) -> None:
        if turn is not None:
            turn.release()
        # A call whose caller was cancelled finishes alone; its outcome is in the store, and
        # an error it ended with (the episode closed meanwhile) is nobody's to report.
        if not task.cancelled():
            task.exception()

    return done


def as_tool(action: Action[Any, Any], *, episode: Any = None) -> Tool[Any]:
    """A Pydantic AI tool that runs ``action`` as one transaction per call.

    Args:
        action: an ``@hx.action``; its name, description and ``.schema`` are what the model
            sees.
        episode: the episode calls run in (default: the one current where the agent runs,
            i.e. ``agent.run(...)`` awaited inside ``with hx.Episode(...)``).

    Returns:
        A :class:`pydantic_ai.Tool` for ``Agent(tools=[...])`` or a ``FunctionToolset``.

    Raises:
        ConfigurationError: ``action`` is not an ``@hx.action``.

    A refusal is raised as :class:`pydantic_ai.ToolFailed` rather than returned as text or
    raised as :class:`pydantic_ai.ModelRetry`: the model reads the refusal as a failed tool
    result and goes on, and, unlike ``ModelRetry``, it spends none of the tool's retry budget,
    whose exhaustion would end the whole run with ``UnexpectedModelBehavior``. A false
    precondition is an answer about the world, not a malformed call the model must repeat.
    Invalid arguments are refused the same way: the action validates them against the schema
    the model was shown, so Pydantic AI's own validation is skipped.

    Calls made at once (the tool calls of one model response) take the episode in the order
    the model made them. A call that has started is shielded from cancellation (a sibling
    tool that raised, a cancelled run): the transaction still ends in a commit or an undo,
    never in doubt, and ``async with hx.Episode(...)`` waits for it before the episode ends;
    a call still waiting for its turn is dropped.

    :class:`harness.Escalated` and :class:`harness.EpisodeClosed` propagate out of
    ``agent.run(...)`` unchanged.
    """
    action = _checked(action, "as_tool()")

    async def run(**arguments: Any) -> Any:
        ep = episode_for(action, episode)
        turn = _turn(ep)
        if turn is not None:
            await turn.acquire()  # (cancelled while waiting: the call never started)
        task = asyncio.ensure_future(acall(action, arguments, ep))
        task.add_done_callback(_finished(turn))
        answer = await asyncio.shield(task)
        if not answer.ok:
            raise ToolFailed(answer.message)
        return answer.value

    run.__name__ = run.__qualname__ = action.name
    run.__doc__ = action.description
    return Tool.from_schema(
        run,
        name=action.name,
        description=action.description or None,
        json_schema=copy.deepcopy(action.schema),
    )


def toolset(
    *actions: Action[Any, Any] | Iterable[Action[Any, Any]],
    episode: Any = None,
    id: str | None = None,
) -> FunctionToolset[Any]:
    """A Pydantic AI toolset of several actions (each as :func:`as_tool` makes it).

    Args:
        *actions: ``@hx.action``\\ s, or iterables of them (``toolset(*env.actions)`` or
            ``toolset(actions)``).
        episode: the episode calls run in (default: the one current where the agent runs).
        id: the toolset's id, as ``FunctionToolset(id=...)`` takes it (durable execution
            needs one).

    Returns:
        A :class:`pydantic_ai.toolsets.FunctionToolset` for ``Agent(toolsets=[...])``.

    Raises:
        ConfigurationError: an item is not an ``@hx.action``, or two actions share a name.
    """
    flat: list[Action[Any, Any]] = []
    for item in actions:
        if isinstance(item, Action):
            flat.append(item)
        elif isinstance(item, Iterable) and not isinstance(item, (str, bytes)):
            flat.extend(_checked(a, "toolset()") for a in item)
        else:
            flat.append(_checked(item, "toolset()"))
    names = [a.name for a in flat]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(
            f"toolset(): two actions are named {', '.join(map(repr, twice))}; the model tells "
            "tools apart by name, so give one another with @hx.action(name=...)"
        )
    return FunctionToolset([as_tool(a, episode=episode) for a in flat], id=id)

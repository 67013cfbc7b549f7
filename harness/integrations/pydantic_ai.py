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

import copy
from collections.abc import Iterable
from typing import Any

from pydantic_ai import RunContext, Tool, ToolFailed
from pydantic_ai.toolsets import FunctionToolset

from ..action import Action
from ._calls import acall_in_turn, checked, episode_for, flatten

# Named in the message refusing a plain function, which Pydantic AI takes as it is.
_FRAMEWORK = "Pydantic AI"

__all__ = ["as_tool", "toolset"]


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
    action = checked(action, "as_tool()", _FRAMEWORK)

    async def run(run_context: RunContext[Any], /, **arguments: Any) -> Any:
        answer = await acall_in_turn(
            action, arguments, episode_for(action, episode), run_context.tool_call_id
        )
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
        takes_ctx=True,
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
    flat = flatten(actions, "toolset()", _FRAMEWORK)
    return FunctionToolset([as_tool(a, episode=episode) for a in flat], id=id)

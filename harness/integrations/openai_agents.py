"""Actions as OpenAI Agents SDK tools: every call the model makes is one transaction.

::

    from agents import Agent, Runner
    from harness.integrations.openai_agents import function_tool, tools

    agent = Agent(name="teller", model=model, tools=[function_tool(deposit)])  # one action
    agent = Agent(name="teller", model=model, tools=tools(deposit, withdraw))  # or several

    async with hx.Episode(state=state, store=url):
        result = await Runner.run(agent, "Put 10 in account a")

The model sees the action's own name, description and JSON Schema (``action.schema``, the schema
the harness validates against), not one the SDK rebuilds from the signature. Each call runs in
the episode current where ``Runner.run(...)`` is awaited (or ``Runner.run_sync`` called), or the
one given.

How each outcome reaches the run:

- committed: the tool's result is the tool's answer (text as it is, anything else as JSON);
- refused (invalid arguments, a false precondition, a person's rejection, a failed action whose
  effect was undone): the tool's answer is ``"Error: <why>"``, which the model reads in its next
  turn, and the run goes on;
- escalated: the run stops; :class:`harness.Escalated` (as :class:`RunEscalated`, which is
  both an ``Escalated`` and the SDK's ``AgentsException``, so the SDK lets it through unwrapped)
  propagates out of ``Runner.run(...)`` with its ``escalation_id``. Once a person resolves it
  (``Store.resolve``), run the agent again in ``hx.Episode(..., episode_id=<same>, resume=True)``:
  calls that committed are answered from the record, the approved call runs once;
- the episode is closed (a failure rolled it back, or it escalated before): the run stops with
  :class:`harness.EpisodeClosed` (as :class:`RunClosed`). A call whose own failure rolled the
  episode back stops the run at once, rather than telling the model and letting it go on to a
  final answer about work that was undone.

Any other error of the harness (no episode current, a resumed run whose model asked for
something other than what the record says, :class:`harness.Diverged`) fails the run as the
SDK's ``UserError``, whose ``__cause__`` is the harness's error; nothing ran for that call.

Resuming holds the agent to its record: its calls must come again with the same arguments, in
the same order. The SDK's ``ScriptedModel`` (tests) or any deterministic model does; a live
model may ask for something else, which is a :class:`harness.Diverged` (run it as a new
episode then).

The SDK runs the tool calls of one model response at once, as tasks; the episode runs them one
at a time, each recorded with its own changes, and in the order the model listed them, so that
a resumed run (whose calls are held to the record in order) meets them in the same order.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from typing import Any

from agents import FunctionTool
from agents.exceptions import AgentsException, UserError
from agents.strict_schema import ensure_strict_json_schema
from agents.tool_context import ToolContext

from ..action import Action
from ..episode import Episode
from ..errors import ConfigurationError, EpisodeClosed, Escalated
from ..store import EpisodeStatus
from ._calls import acall_in_turn, checked, episode_for, flatten

# Named in the message refusing a plain function, which the SDK takes as it is.
_FRAMEWORK = "the SDK's own @function_tool"

__all__ = ["RunClosed", "RunEscalated", "function_tool", "tools"]


class RunEscalated(Escalated, AgentsException):
    """An escalation stopping an Agents SDK run: catch it as :class:`harness.Escalated`.

    The SDK wraps what a tool raises in its own ``UserError``, except its own exceptions; being
    an ``AgentsException`` too, this one reaches the caller of ``Runner.run(...)`` as it is,
    with ``escalation_id`` (and the SDK's ``run_data``). The original error is its
    ``__cause__``.
    """

    @classmethod
    def of(cls, error: Escalated) -> RunEscalated:
        """The same escalation, as the run's exception."""
        return cls(error.escalation_id, error.action, error.failure_class, error.reason)


class RunClosed(EpisodeClosed, AgentsException):
    """The episode closed (rolled back, escalated), stopping an Agents SDK run: catch it as
    :class:`harness.EpisodeClosed`.

    Attributes:
        episode_id: the episode.
        outcome: how it ended (``rolled_back``, ``escalated``...).
        reason: what the call that closed it was told (empty when the episode was closed
            before the call).
    """

    def __init__(self, episode_id: str, outcome: str, reason: str = "") -> None:
        super().__init__(episode_id, outcome)
        self.reason = reason
        if reason:
            self.args = (f"{self.args[0]}; the call that closed it: {reason}",)


def _all_required(schema: Any) -> bool:
    """Whether every object in the schema (nested ones too) requires all its fields: strict
    mode would make a field with a default required, which the tool's signature does not."""
    if isinstance(schema, dict):
        fields = schema.get("properties")
        if isinstance(fields, dict) and set(fields) - set(schema.get("required", ())):
            return False
        return all(_all_required(v) for v in schema.values())
    if isinstance(schema, list):
        return all(_all_required(v) for v in schema)
    return True


def _strictness(action: Action[Any, Any], strict: bool | None) -> bool:
    """Whether the tool's schema is given to the model in strict mode (see function_tool)."""
    if strict is False:
        return False
    schema = action.schema
    if strict is None and not _all_required(schema):
        return False
    try:
        ensure_strict_json_schema(copy.deepcopy(schema))
    except (UserError, TypeError, ValueError) as exc:
        if strict:
            raise ConfigurationError(
                f"function_tool({action.name}, strict=True): its argument schema cannot be made "
                f"strict ({exc}); leave strict unset (the schema then goes as it is) or give "
                "the arguments closed types (no dict[str, Any], no extra fields)"
            ) from exc
        return False
    return True


def _arguments(name: str, text: str) -> dict[str, Any] | str:
    """The model's arguments as a mapping, or the refusal to answer with."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError as exc:
        return (
            f"Error: the arguments for {name} are not valid JSON ({exc}); call it again with "
            "a JSON object matching its parameters"
        )
    if not isinstance(value, dict):
        return f"Error: the arguments for {name} must be a JSON object, not {type(value).__name__}"
    return value


async def _run(
    action: Action[Any, Any], episode: Episode | None, text: str, tool_call_id: str | None
) -> str:
    arguments = _arguments(action.name, text)
    if isinstance(arguments, str):
        return arguments
    ep = episode_for(action, episode)
    try:
        answer = await acall_in_turn(action, arguments, ep, tool_call_id)
    except Escalated as exc:
        raise RunEscalated.of(exc) from exc
    except EpisodeClosed as exc:
        raise RunClosed(exc.episode_id, exc.outcome) from exc
    if not answer.ok and ep.outcome != EpisodeStatus.RUNNING:
        # This call's failure rolled the episode back: nothing the model does next can count.
        raise RunClosed(ep.id, ep.outcome, answer.message)
    return answer.text


def function_tool(
    action: Action[Any, Any],
    *,
    episode: Episode | None = None,
    name: str | None = None,
    description: str | None = None,
    strict: bool | None = None,
) -> FunctionTool:
    """An Agents SDK tool that runs ``action`` as one transaction per call.

    Args:
        action: an ``@hx.action``; its name, description and ``.schema`` are what the model
            sees (sync actions run in a worker thread, async ones on the run's event loop).
        episode: the episode calls run in (default: the one current where the agent runs,
            i.e. ``Runner.run(...)`` awaited inside ``with hx.Episode(...)``).
        name: the tool's name as the model sees it (default: the action's). The episode
            records the action's own name.
        description: the tool's description (default: the action's).
        strict: give the model the schema in strict mode (every argument required, no other
            fields). Default: strict when every argument (and every field of a nested model) is
            required and the schema can be made strict; an argument with a default stays
            optional for the model, as in Python.
            ``True`` forces strict mode (the model must then send defaulted arguments too).

    Returns:
        An :class:`agents.FunctionTool` for ``Agent(tools=[...])``.

    Raises:
        ConfigurationError: ``action`` is not an ``@hx.action``, ``episode`` is not an
            ``hx.Episode``, or ``strict=True`` for a schema that cannot be strict.

    A refusal is the tool's answer (``"Error: ..."``); an escalation or a closed episode stops
    the run with :class:`RunEscalated` / :class:`RunClosed`, which are ``hx.Escalated`` /
    ``hx.EpisodeClosed`` (see the module).
    """
    action = checked(action, "function_tool()", _FRAMEWORK)
    if episode is not None and not isinstance(episode, Episode):
        raise ConfigurationError(
            f"function_tool({action.name}, episode=...) takes an hx.Episode, not "
            f"{type(episode).__name__}; or leave it out to use the episode current where the "
            "agent runs"
        )

    async def invoke(ctx: ToolContext[Any], arguments: str) -> str:
        return await _run(action, episode, arguments, ctx.tool_call_id)

    return FunctionTool(
        name=name or action.name,
        description=description if description is not None else action.description,
        params_json_schema=copy.deepcopy(action.schema),
        on_invoke_tool=invoke,
        strict_json_schema=_strictness(action, strict),
    )


def tools(
    *actions: Action[Any, Any] | Iterable[Action[Any, Any]],
    episode: Episode | None = None,
    strict: bool | None = None,
) -> list[FunctionTool]:
    """Agents SDK tools for several actions (each as :func:`function_tool` makes it).

    Args:
        *actions: ``@hx.action``\\ s, or iterables of them (``tools(*env.actions)`` or
            ``tools(actions)``).
        episode: the episode calls run in (default: the one current where the agent runs).
        strict: as for :func:`function_tool`, for every tool.

    Returns:
        A list for ``Agent(tools=[...])``.

    Raises:
        ConfigurationError: an item is not an ``@hx.action``, or two actions share a name.
    """
    flat = flatten(actions, "tools()", _FRAMEWORK)
    return [function_tool(a, episode=episode, strict=strict) for a in flat]

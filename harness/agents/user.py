"""Users: who the agent talks to in tau2-bench's conversation loop, behind one small protocol.

A :class:`User` answers the agent's text messages with its own; :class:`ScriptedUser` says
replies from a list (for tests and offline runs); ``OpenAIUser``
(:mod:`harness.agents.openai`, beside the agent it shares its client with) is a model on any
OpenAI-compatible server prompted as tau2-bench prompts its user simulator. Users are built by
name from plain options through :data:`user_registry` (``scripted``, ``openai``), as agents are.

What is taken from tau2-bench (github.com/sierra-research/tau2-bench, commit
``a2c024725189473d2d7cea3a5cfdbcc67478e41f``, MIT licence, notice below):

- ``src/tau2/user/user_simulator_base.py``: the tokens ending a conversation, ``###STOP###``
  (the user's goal is met), ``###TRANSFER###`` (the user was transferred to another agent) and
  ``###OUT-OF-SCOPE###`` (the scenario does not say how to go on); a user message containing
  any of them stops the conversation (``UserSimulator.is_stop``: a substring test, tool calls
  and empty contents never stop). ``UserState.flip_roles``: the user's model sees its own past
  messages as ``assistant`` and the agent's text messages as ``user``; the agent's tool calls
  and their results are not part of the user's view (``is_valid_user_history_message``).
- ``src/tau2/user/user_simulator.py``: the system prompt is ``SYSTEM_PROMPT`` below, the
  global guidelines (``data/tau2/user_simulator/simulation_guidelines.md``, the tool-less
  version: retail users have no tools) with the ``<PERSONA_GUIDELINES>`` placeholder emptied,
  then the task's user scenario in a ``<scenario>`` element. The scenario is
  ``str(task.user_scenario)`` (``src/tau2/runner/build.py``, ``build_user``), whose text
  ``src/tau2/data_model/tasks.py`` defines (``UserScenario.__str__``,
  ``StructuredUserInstructions.__str__``): :func:`scenario_text` writes the same text.
- ``src/tau2/config.py``: the user's model runs at temperature 0.0; the orchestrator seeds it
  with the simulation's seed.
- Users with tools (the telecom domain's user acts on their own phone): the user's model is
  offered the user's tools and gets the guidelines for users with tools
  (``data/tau2/user_simulator/simulation_guidelines_tools.md``,
  :data:`SIMULATION_GUIDELINES_TOOLS`; ``get_global_user_sim_guidelines(use_tools=True)``).
  A user message may call tools (``UserSimulator._generate_next_message`` gives each call
  ``requestor="user"``); such a message never stops the conversation (``is_stop`` is false for
  a tool call). The user's view keeps its own tool calls (as the ``assistant``'s, with their
  text) and the results of its calls (``ToolMessage`` with ``requestor == "user"``), and still
  leaves out the agent's tool calls and their results.

tau2-bench's licence, for the text copied here (``SIMULATION_GUIDELINES``,
``SIMULATION_GUIDELINES_TOOLS``, ``SYSTEM_PROMPT``)::

    MIT License

    Copyright (c) 2025 Sierra Research

    Permission is hereby granted, free of charge, to any person obtaining a copy
    of this software and associated documentation files (the "Software"), to deal
    in the Software without restriction, including without limitation the rights
    to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
    copies of the Software, and to permit persons to whom the Software is
    furnished to do so, subject to the following conditions:

    The above copyright notice and this permission notice shall be included in all
    copies or substantial portions of the Software.

    THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
    IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
    FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
    AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
    LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
    OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
    SOFTWARE.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigurationError
from ..suite import Task
from .base import Session

__all__ = [
    "OUT_OF_SCOPE",
    "SIMULATION_GUIDELINES",
    "SIMULATION_GUIDELINES_TOOLS",
    "STOP",
    "STOP_TOKENS",
    "SYSTEM_PROMPT",
    "TRANSFER",
    "ScriptedUser",
    "User",
    "UserRegistry",
    "UserTurn",
    "is_stop",
    "scenario_text",
    "user_registry",
    "user_system_prompt",
    "user_view",
]

STOP = "###STOP###"
"""The user's goal is met (tau2's ``STOP``)."""

TRANSFER = "###TRANSFER###"
"""The user was transferred to another agent (tau2's ``TRANSFER``)."""

OUT_OF_SCOPE = "###OUT-OF-SCOPE###"
"""The scenario does not say how to go on (tau2's ``OUT_OF_SCOPE``)."""

STOP_TOKENS: tuple[str, ...] = (STOP, TRANSFER, OUT_OF_SCOPE)
"""Every token that ends the conversation when a user message contains it."""

# Copied from tau2-bench data/tau2/user_simulator/simulation_guidelines.md (MIT, see above),
# byte for byte (the trailing space on the second line and the final newline included).
SIMULATION_GUIDELINES = (
    "# User Simulation Guidelines\n"
    "You are playing the role of a customer contacting a customer service representative. \n"
    "Your goal is to simulate realistic customer interactions while following specific "
    "scenario instructions.\n"
    "\n"
    "## Core Principles\n"
    "- Generate one message at a time, maintaining natural conversation flow.\n"
    "- Strictly follow the scenario instructions you have received.\n"
    "- Never make up or hallucinate information not provided in the scenario instructions. "
    "Information that is not provided in the scenario instructions should be considered "
    "unknown or unavailable.\n"
    "- Avoid repeating the exact instructions verbatim. Use paraphrasing and natural language "
    "to convey the same information\n"
    "- Disclose information progressively. Wait for the agent to ask for specific information "
    "before providing it.\n"
    "\n"
    "## Task Completion\n"
    "- The goal is to continue the conversation until the task is complete.\n"
    "- If the instruction goal is satisified, generate the '###STOP###' token to end the "
    "conversation.\n"
    "- If you are transferred to another agent, generate the '###TRANSFER###' token to "
    "indicate the transfer.\n"
    "- If you find yourself in a situation in which the scenario does not provide enough "
    "information for you to continue the conversation, generate the '###OUT-OF-SCOPE###' "
    "token to end the conversation.\n"
    "Remember: The goal is to create realistic, natural conversations while strictly adhering "
    "to the provided instructions and maintaining character consistency.\n"
)
"""tau2-bench's global user simulation guidelines (the version for users without tools)."""

# Copied from tau2-bench data/tau2/user_simulator/simulation_guidelines_tools.md (MIT, see
# above), byte for byte (trailing spaces and the final newline included).
SIMULATION_GUIDELINES_TOOLS = (
    "# User Simulation Guidelines\n"
    "\n"
    "You are playing the role of a customer contacting a customer service representative "
    "agent. \n"
    "Your goal is to simulate realistic customer interactions while following specific "
    "scenario instructions.\n"
    "You have some tools to perform the actions on your end that might be requested by the "
    "agent to diagnose and resolve your issue.\n"
    "\n"
    "## Core Principles\n"
    "- Generate one message at a time, maintaining natural conversation flow.\n"
    "- At each turn you can either:\n"
    "    - Send a message to the agent.\n"
    "    - Make a tool call to perform an action requested by the agent.\n"
    "    - You cannot do both at the same time.\n"
    "- Strictly follow the scenario instructions you have received.\n"
    "- Never make up or hallucinate information not provided in the scenario instructions. "
    "Information that is not provided in the scenario instructions should be considered "
    "unknown or unavailable.\n"
    "- Never make up the results of tool calls that the agent has requested, you must ground "
    "your responses based on the results of tool calls if the agent has requested.\n"
    "- If you made an error in a tool call and get an error message, fix the error and try "
    "again.\n"
    "- All the information you provide to the agent must be grounded in the information "
    "provided in the scenario instructions or the results of tool calls.\n"
    "- Avoid repeating the exact instructions verbatim. Use paraphrasing and natural language "
    "to convey the same information\n"
    "- Disclose information progressively. Wait for the agent to ask for specific information "
    "before providing it.\n"
    "- Only call a tool if the agent has requested it or if it is necessary to answer a "
    "question the agent has asked. Ask clarifying questions if you do not know what action to "
    "take.\n"
    "- If the agent asks multiple actions to perform, state that you cannot perform multiple "
    "actions at once, and ask the agent to instruct you one action at a time.\n"
    "- Your messages when performing tool calls will not be displayed to the agent, only the "
    "messages without tool calls will be displayed to the agent.\n"
    "\n"
    "## Task Completion\n"
    "- The goal is to continue the conversation until the task is complete.\n"
    "- If the instruction goal is satisified, generate the '###STOP###' token to end the "
    "conversation.\n"
    "- If you have been transferred to another agent, generate the '###TRANSFER###' token to "
    "indicate the transfer. Only do this after the agent has clearly indicated that you are "
    "being transferred.\n"
    "- If you find yourself in a situation in which the scenario does not provide enough "
    "information for you to continue the conversation, generate the '###OUT-OF-SCOPE###' "
    "token to end the conversation.\n"
    "Remember: The goal is to create realistic, natural conversations while strictly adhering "
    "to the provided instructions and maintaining character consistency.\n"
)
"""tau2-bench's global user simulation guidelines for users with tools."""

# Copied from tau2-bench src/tau2/user/user_simulator.py (MIT, see above).
SYSTEM_PROMPT = """
{global_user_sim_guidelines_with_persona}

<scenario>
{instructions}
</scenario>
""".strip()
"""tau2-bench's user system prompt template: the guidelines, then the scenario."""


def is_stop(content: str | None) -> bool:
    """Whether a user message ends the conversation: it contains one of :data:`STOP_TOKENS`
    (tau2's ``UserSimulator.is_stop``)."""
    return content is not None and any(token in content for token in STOP_TOKENS)


def _indented(text: Any) -> str:
    return textwrap.indent(str(text), "\t")


def _instructions_text(task: Task, instructions: Any) -> str:
    """tau2's ``str(StructuredUserInstructions)``, or a plain instruction string as it is."""
    if isinstance(instructions, str):
        return instructions
    if not isinstance(instructions, Mapping):
        raise ConfigurationError(
            f"task {task.id!r}: the user scenario's instructions must be a string or a mapping, "
            f"not {type(instructions).__name__}"
        )
    missing = [
        k for k in ("domain", "reason_for_call", "task_instructions") if k not in instructions
    ]
    if missing:
        raise ConfigurationError(
            f"task {task.id!r}: the user scenario's instructions lack {', '.join(missing)} "
            "(tau2's structured instructions: domain, reason_for_call, known_info, "
            "unknown_info, task_instructions)"
        )
    lines = [
        f"Domain: {instructions['domain']}",
        f"Reason for call:\n{_indented(instructions['reason_for_call'])}",
    ]
    if instructions.get("known_info") is not None:
        lines.append(f"Known info:\n{_indented(instructions['known_info'])}")
    if instructions.get("unknown_info") is not None:
        lines.append(f"Unknown info:\n{_indented(instructions['unknown_info'])}")
    lines.append(f"Task instructions:\n{_indented(instructions['task_instructions'])}")
    return "\n".join(lines)


def scenario_text(task: Task) -> str:
    """The task's user scenario as tau2 writes it into its user's prompt (``str(UserScenario)``).

    ``task.user`` is tau2's ``user_scenario.instructions`` (a tau2 ``tasks.json``), or the
    whole scenario (``{"persona": ..., "instructions": ...}``); a task without one gives its
    ``instruction`` as a plain-text instruction, as tau2 accepts.

    Raises:
        ConfigurationError: structured instructions that lack one of tau2's required fields.
    """
    user = dict(task.user or {})
    if "instructions" in user and not {"domain", "reason_for_call"} & set(user):
        persona, instructions = user.get("persona"), user["instructions"]
    else:
        persona, instructions = None, user or task.instruction
    lines = []
    if persona is not None:
        lines.append("Persona:")
        lines.append(_indented(persona))
    lines.append("Instructions:")
    lines.append(_indented(_instructions_text(task, instructions)))
    return "\n".join(lines)


def user_system_prompt(task: Task, guidelines: str = SIMULATION_GUIDELINES) -> str:
    """The system prompt tau2's user simulator gets for ``task`` (no runtime persona)."""
    return SYSTEM_PROMPT.format(
        global_user_sim_guidelines_with_persona=guidelines.replace("<PERSONA_GUIDELINES>", ""),
        instructions=scenario_text(task),
    )


def user_view(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as the user's model reads it (tau2's ``UserState.flip_roles``).

    ``messages`` is the conversation in tau2's shape (the agent's ``assistant`` messages, the
    ``user``'s, the ``tool`` results). The user's own messages become ``assistant`` messages
    (with their tool calls, in OpenAI's shape, when the user called tools) and the agent's text
    messages ``user`` messages; the results of the user's own calls (``requestor == "user"``)
    are ``tool`` messages; the agent's tool calls and their results are left out (the user
    never sees them).
    """
    view: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        if role == "user":
            entry: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
            if message.get("tool_calls"):
                entry["tool_calls"] = [
                    {
                        "id": call.get("id"),
                        "type": "function",
                        "function": {
                            "name": call.get("name"),
                            "arguments": json.dumps(call.get("arguments") or {}),
                        },
                    }
                    for call in message["tool_calls"]
                ]
            view.append(entry)
        elif role == "assistant" and not message.get("tool_calls"):
            view.append({"role": "user", "content": message.get("content")})
        elif role == "tool" and message.get("requestor") == "user":
            view.append(
                {
                    "role": "tool",
                    "tool_call_id": message.get("id"),
                    "content": message.get("content"),
                }
            )
    return view


@dataclass
class UserTurn:
    """What the user said, and what it cost.

    Attributes:
        content: the message (a stop token in it ends the conversation, :func:`is_stop`,
            unless the message calls tools).
        usage: token counts the user's model reported (``prompt_tokens``,
            ``completion_tokens``), when it has one.
        cost: the cost the user's server reported, when it did.
        meta: anything else worth keeping (the model call's request digest, tries).
        tool_calls: the user's own tool calls, in tau2's shape (``{"id", "name",
            "arguments"}``, arguments a dict; a call without an id is numbered): they run on
            the user's tools and their results come back to the user, not the agent. A call
            with an ``"error"`` (and ``arguments`` None) is one whose arguments did not parse:
            it is answered with that error and runs nothing.
    """

    content: str | None
    usage: dict[str, int] | None = None
    cost: float | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    tool_calls: list[dict[str, Any]] | None = None


@runtime_checkable
class User(Protocol):
    """Who the agent talks to: given the conversation so far, say the next message.

    Any class with these three members is a user (no base class to inherit)::

        class Impatient:
            name = "impatient"

            def config(self) -> dict:
                return {"implementation": self.name}

            def respond(self, task, messages, *, session, seed):
                if len(messages) > 6:
                    return UserTurn("Never mind. ###STOP###")
                return UserTurn(task.instruction)

    ``respond`` gets the task (``task.user`` holds tau2's user scenario), the whole conversation
    so far in tau2's message shape (:func:`user_view` is what a model-backed user should see of
    it), the trial's episode as a :class:`~harness.agents.base.Session` and the trial's seed. A
    value the answer depends on that is not fixed by these (a model's answer) goes through
    ``session.remember(what, request, compute)``, so a resumed trial gets the same answer
    without asking again. Ending the conversation is saying one of :data:`STOP_TOKENS`.

    In an environment whose user has tools (``environment.user_tools``), ``respond`` is also
    given ``tools=``: the user's tool definitions in OpenAI's function-calling format. A turn
    whose :attr:`UserTurn.tool_calls` is set calls them; their results come back to the user
    (``tool`` messages with ``requestor == "user"`` in ``messages``), who speaks again.
    """

    name: str

    def config(self) -> dict[str, Any]:
        """The user's configuration, for the run's evidence (JSON-ready; tau2's ``UserInfo``
        keys ``implementation``, ``llm``, ``llm_args`` where they apply)."""
        ...

    def respond(
        self, task: Task, messages: Sequence[Mapping[str, Any]], *, session: Session, seed: int
    ) -> UserTurn:
        """The user's next message."""
        ...


Reply = str | dict[str, Any]
"""One turn of a :class:`ScriptedUser`: a message, or ``{"tool_calls": [...]}`` (optionally
with ``"content"``) calling the user's tools."""


def _scripted_calls(reply: Mapping[str, Any], turn: int) -> list[dict[str, Any]]:
    """A scripted turn's tool calls in tau2's shape, numbered by turn where they have no id.

    Raises:
        ConfigurationError: not a list of ``{"name": str, "arguments": dict}``.
    """
    calls = reply.get("tool_calls")
    if not isinstance(calls, list) or not calls or set(reply) - {"tool_calls", "content"}:
        raise ConfigurationError(
            f"ScriptedUser: turn {turn} is {dict(reply)!r}; a turn calling tools is "
            '{"tool_calls": [{"name": ..., "arguments": {...}}], "content": optional}'
        )
    out = []
    for i, call in enumerate(calls):
        if (
            not isinstance(call, Mapping)
            or not isinstance(call.get("name"), str)
            or not isinstance(call.get("arguments", {}), Mapping)
        ):
            raise ConfigurationError(
                f"ScriptedUser: turn {turn}'s call {i} is {call!r}; give "
                '{"name": ..., "arguments": {...}}'
            )
        out.append(
            {
                "id": str(call.get("id") or f"user_call_{turn}_{i}"),
                "name": call["name"],
                "arguments": dict(call.get("arguments") or {}),
            }
        )
    return out


class ScriptedUser:
    """Says ``replies`` in order, one per turn, then ``then`` (``###STOP###``) for ever.

    Args:
        replies: what to say; default the task's ``instruction`` (a user who states the task
            once, then stops). A reply may instead call the user's tools
            (``{"tool_calls": [{"name": "toggle_airplane_mode", "arguments": {}}]}``, with an
            optional ``"content"``): the calls run on the user's tools, their results come back
            to this user, and the next reply follows them.
        then: what to say once the replies are said.

    Which reply comes is the number of user messages already in the conversation, so a resumed
    trial says the same things without remembering anything.
    """

    name = "scripted"

    def __init__(self, replies: Sequence[Reply] | None = None, *, then: str = STOP) -> None:
        if replies is not None and (
            isinstance(replies, str) or not all(isinstance(r, str | dict) for r in replies)
        ):
            raise ConfigurationError(
                'ScriptedUser(replies=...): give a list of strings and {"tool_calls": [...]} turns'
            )
        self.replies = None if replies is None else list(replies)
        for turn, reply in enumerate(self.replies or ()):
            if isinstance(reply, dict):
                _scripted_calls(reply, turn)
        self.then = then

    def config(self) -> dict[str, Any]:
        """The user's configuration."""
        return {"implementation": self.name, "replies": self.replies, "then": self.then}

    def respond(
        self,
        task: Task,
        messages: Sequence[Mapping[str, Any]],
        *,
        session: Session,
        seed: int,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> UserTurn:
        """The next reply of the script."""
        replies: list[Reply] = [task.instruction] if self.replies is None else self.replies
        said = sum(1 for m in messages if m.get("role") == "user")
        reply = replies[said] if said < len(replies) else self.then
        if isinstance(reply, dict):
            content = reply.get("content")
            return UserTurn(
                content if isinstance(content, str) else None,
                tool_calls=_scripted_calls(reply, said),
            )
        return UserTurn(reply)


class UserRegistry:
    """User factories by name (an object, so tests can use a fresh one)."""

    def __init__(self) -> None:
        self._factories: dict[str, Callable[..., User]] = {}

    def register(self, name: str, factory: Callable[..., User]) -> None:
        """Add a factory under ``name``."""
        self._factories[name] = factory

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._factories)

    def create(self, name: str, **options: Any) -> User:
        """A new user ``name`` with ``options``.

        Raises:
            ConfigurationError: the name is not registered or the options do not fit.
        """
        factory = self._factories.get(name)
        if factory is None:
            raise ConfigurationError(f"unknown user {name!r}; built in: {', '.join(self.names())}")
        try:
            return factory(**options)
        except TypeError as exc:
            raise ConfigurationError(f"user {name!r}: bad options {options} ({exc})") from exc


user_registry = UserRegistry()
"""Users by name: ``scripted`` (:class:`ScriptedUser`), ``openai`` (``OpenAIUser``)."""

user_registry.register("scripted", ScriptedUser)

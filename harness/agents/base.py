"""The agent protocol, the toolbox agents act through, and the registry of built-in agents.

An agent gets a task and a :class:`Toolbox` and acts. The toolbox runs write tools as
transactions in the trial's episode and turns the harness's refusals and failures into tool
results (as a model would see them), so a failed precondition is something the agent reads and
adapts to, not a crash. Only an escalation ends the agent's turn.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, cast, runtime_checkable

from .._json import canonical, dumps, json_copy
from ..action import Action, as_json, build_model
from ..errors import (
    ConfigurationError,
    Diverged,
    EpisodeClosed,
    Escalated,
    NotSerializable,
    refusal,
)
from ..suite import Task
from .spec import AgentSpec, is_agent_spec

__all__ = [
    "Agent",
    "AgentOutput",
    "AgentRegistry",
    "CallRecord",
    "Session",
    "ToolResult",
    "Toolbox",
    "call_request",
    "environment_text",
    "registry",
]


@dataclass
class ToolResult:
    """What a tool call gave back, as the agent sees it.

    Attributes:
        ok: Whether the call succeeded.
        content: What the tool returned (when ``ok``).
        error: Why the call failed, in the harness's words (which check refused it, which
            failure class ended it); the store, the log and the audit keep the same.
        kind: The failure's kind (``invalid``, ``precondition``, ``unknown_tool``, a failure
            class...).
        text: The exact text the model reads, when the environment chose it
            (:meth:`Toolbox.call` asks the environment's ``tool_message`` hook); None: the
            content or the error, rendered by :meth:`as_text`.
    """

    ok: bool
    content: Any = None
    error: str | None = None
    kind: str | None = None
    text: str | None = None

    def as_text(self) -> str:
        """The result as a model reads it: the environment's text when it chose one."""
        if self.text is not None:
            return self.text
        if self.ok:
            if isinstance(self.content, str):
                return self.content
            try:
                return dumps(self.content)
            except (TypeError, ValueError):
                return dumps(as_json(self.content))
        return f"Error: {self.error}"


@dataclass
class AgentOutput:
    """How the agent's turn ended."""

    message: str = ""
    claimed_success: bool = True
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class CallRecord:
    """One call the agent made through the toolbox."""

    name: str
    arguments: dict[str, Any]
    ok: bool
    kind: str | None
    write: bool
    requestor: str = "assistant"


class Session(Protocol):
    """What a toolbox needs of the episode its calls run in: a live :class:`~harness.Episode`,
    or a replay that answers every call from the episode's record."""

    id: str
    """The episode's id."""

    @property
    def diverged(self) -> Diverged | None:
        """The divergence from the record found (None: none)."""
        ...

    def call_mapping(self, action: Action[Any, Any], arguments: dict[str, Any]) -> Any:
        """Run ``action`` with arguments given as a mapping (a model's tool call)."""
        ...

    def remember(self, what: str, request: Any, compute: Callable[[], Any]) -> Any:
        """A value the agent's path depends on, computed once and given back on resume."""
        ...


def environment_text(
    environment: Any,
    name: str,
    arguments: dict[str, Any],
    result: ToolResult,
    error: BaseException | None,
) -> str | None:
    """What the environment's ``tool_message`` hook shows the model for a call (None: it has
    no hook, or says to render the result the harness's way).

    Raises:
        ConfigurationError: The hook returned something other than a string or None.
    """
    hook = getattr(environment, "tool_message", None)
    if not callable(hook):
        return None
    text = hook(name, dict(arguments), result, error)
    if text is not None and not isinstance(text, str):
        raise ConfigurationError(
            f"{type(environment).__name__}.tool_message returned {type(text).__name__} for "
            f"{name!r}; return the text the model reads, or None for the default"
        )
    return text


def call_request(name: str, arguments: dict[str, Any], requestor: str) -> dict[str, Any]:
    """What the episode remembers a call's answer under: the tool and its arguments, and for a
    user's call its requestor (an agent's call reads as it did before users had tools)."""
    request: dict[str, Any] = {"tool": name, "arguments": arguments}
    if requestor != "assistant":
        request["requestor"] = requestor
    return request


def _read_value(name: str, value: Any) -> Any:
    """What a read tool (a plain function) returned, as the JSON the agent reads; a value JSON
    cannot hold is refused as an action's result is (never shown as its ``repr``)."""
    try:
        dumps(value)
    except (TypeError, ValueError):
        try:
            return as_json(value)
        except TypeError as exc:
            raise NotSerializable(name, exc) from None
    return value


class Toolbox:
    """The tools of one trial's environment, called as the agent would call them.

    An environment can choose what the model sees, so that it matches a benchmark's own tools
    word for word while the harness's checks run underneath; both hooks are optional, and an
    environment without them is shown the harness's own rendering:

    - ``environment.tool_defs() -> list[dict]``: tool definitions in OpenAI's function-calling
      format; :attr:`specs` gives the environment's definition of every tool it defines.
    - ``environment.tool_message(name, arguments, result, error) -> str | None``: the text the
      model reads for a call (``result`` is the :class:`ToolResult`, ``error`` the exception
      the call raised, None when it succeeded or never reached a tool); it becomes
      :attr:`ToolResult.text`. None keeps the default. A refusal keeps the harness's reason in
      :attr:`ToolResult.error`, the store and the log; only the model's text changes. The text
      of a refused *action* call after which the episode goes on is remembered by the episode
      (:meth:`Session.remember`, ``what="tool_message"``), so a resumed or replayed episode
      shows the model the same words even though the state it would be computed from has
      moved on (or, in a replay, never moved).

    The user may have tools too (tau2-bench's dual-control domains: the user acts on a device of
    their own): ``environment.user_tools`` (tool name -> callable, as ``tools``) and, optionally,
    ``environment.user_tool_defs()``, the definitions shown to the user's model. A user's call
    is ``call(name, arguments, requestor="user")``: it runs in the same episode as the agent's
    (a write as a transaction, a read recorded), is found among the user's tools only, and its
    :class:`CallRecord` says ``requestor="user"``. :attr:`user_specs` lists the user's tools.

    Args:
        tools: tool name -> callable (actions run as transactions, others plainly).
        episode: the trial's episode (or a replay of it).
        environment: the trial's environment (agents may read hooks from it).
    """

    def __init__(
        self, tools: dict[str, Callable[..., Any]], episode: Session, environment: Any = None
    ) -> None:
        self.tools = tools
        self.episode = episode
        self.environment = environment
        self.calls: list[CallRecord] = []
        self._specs: list[dict[str, Any]] | None = None
        self._user_specs: list[dict[str, Any]] | None = None
        self._specs_canonical: str | None = None
        self._specs_compact: str | None = None

    @property
    def user_tools(self) -> dict[str, Callable[..., Any]]:
        """The user's tools (the environment's ``user_tools``; none when it has no such)."""
        tools = getattr(self.environment, "user_tools", None)
        return dict(tools) if isinstance(tools, Mapping) else {}

    def tools_of(self, requestor: str) -> Mapping[str, Callable[..., Any]]:
        """The tools ``requestor`` (``assistant`` or ``user``) may call.

        Raises:
            ConfigurationError: another requestor.
        """
        if requestor == "assistant":
            return self.tools
        if requestor == "user":
            return self.user_tools
        raise ConfigurationError(f"requestor {requestor!r}: give 'assistant' or 'user'")

    def is_write(self, name: str, requestor: str = "assistant") -> bool:
        """Whether ``name`` is a tool (of ``requestor``) that changes state."""
        tool = self.tools_of(requestor).get(name)
        return isinstance(tool, Action) and tool.mutating

    @property
    def user_specs(self) -> list[dict[str, Any]]:
        """Every tool of the user in OpenAI's function-calling format (the environment's
        ``user_tool_defs()`` where it defines them)."""
        if self._user_specs is None:
            self._user_specs = self._build_specs(
                self.user_tools, self._defined_specs("user_tool_defs")
            )
        return self._user_specs

    @property
    def specs(self) -> list[dict[str, Any]]:
        """Every tool in OpenAI's function-calling format."""
        if self._specs is None:
            self._specs = self._build_specs(self.tools, self._defined_specs())
        return self._specs

    @property
    def specs_canonical(self) -> str:
        """:attr:`specs` as canonical JSON, built once as they are: most of a request's
        digest, as the tool definitions are most of a request."""
        if self._specs_canonical is None:
            self._specs_canonical = canonical(self.specs)
        return self._specs_canonical

    @property
    def specs_compact(self) -> str:
        """:attr:`specs` as compact JSON in their own key order (what a request sends), built
        once as they are."""
        if self._specs_compact is None:
            self._specs_compact = dumps(self.specs)
        return self._specs_compact

    @staticmethod
    def _build_specs(
        tools: Mapping[str, Callable[..., Any]], defined: Mapping[str, dict[str, Any]]
    ) -> list[dict[str, Any]]:
        specs = []
        for name, tool in tools.items():
            if name in defined:
                specs.append(defined[name])  # a copy already (_defined_specs)
            elif isinstance(tool, Action):
                specs.append(tool.openai_tool)
            else:
                model, _, summary, _ = build_model(name, tool)
                schema = model.model_json_schema()
                schema.pop("title", None)
                for prop in schema.get("properties", {}).values():
                    prop.pop("title", None)
                specs.append(
                    {
                        "type": "function",
                        "function": {
                            "name": name,
                            "description": summary,
                            "parameters": schema,
                        },
                    }
                )
        return specs

    def _defined_specs(self, hook: str = "tool_defs") -> dict[str, dict[str, Any]]:
        """The environment's own tool definitions by name (``tool_defs()``, or the user's
        ``user_tool_defs()``), if it has them: copies, which the agent may change."""
        tool_defs = getattr(self.environment, hook, None)
        if not callable(tool_defs):
            return {}
        given = list(tool_defs())
        try:
            specs = json_copy(given)  # what a request sends: JSON
        except (TypeError, ValueError):
            specs = copy.deepcopy(given)
        defined: dict[str, dict[str, Any]] = {}
        for spec in specs:
            function = spec.get("function") if isinstance(spec, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if not isinstance(name, str):
                raise ConfigurationError(
                    f"{type(self.environment).__name__}.{hook}() gave {spec!r}, not a tool "
                    'definition; return {"type": "function", "function": {"name": ..., '
                    '"description": ..., "parameters": {...}}} for each tool'
                )
            defined[name] = spec
        return defined

    def apply_tool_message(
        self,
        name: str,
        arguments: dict[str, Any],
        result: ToolResult,
        error: BaseException | None,
        requestor: str = "assistant",
    ) -> None:
        """Set ``result.text`` from the environment's ``tool_message`` hook, if it has one.

        :meth:`call` does this for every call; a toolbox that makes calls its own way (calls
        the tools bare, answers from a record) calls it to show the model the same words.

        Args:
            name: The tool called.
            arguments: The arguments as the agent sent them.
            result: The call's result; its ``text`` is set (None: the default rendering).
            error: The exception the call raised (None: it succeeded or never reached a tool).

        Raises:
            ConfigurationError: The hook returned something other than a string or None.
        """
        if not callable(getattr(self.environment, "tool_message", None)):
            return

        def compute() -> str | None:
            return environment_text(self.environment, name, arguments, result, error)

        refused_action = not result.ok and isinstance(self.tools_of(requestor).get(name), Action)
        if refused_action and getattr(error, "decision", "continue") == "continue":
            request = call_request(name, arguments, requestor)
            result.text = self.episode.remember("tool_message", request, compute)
        else:
            result.text = compute()

    def refuse(
        self, name: str, error: str, kind: str = "invalid", requestor: str = "assistant"
    ) -> ToolResult:
        """Record a call that never reached a tool (e.g. arguments that are not JSON)."""
        result = ToolResult(False, error=error, kind=kind)
        write = self.is_write(name, requestor)
        self.calls.append(CallRecord(name, {}, False, kind, write, requestor))
        return result

    def call(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        requestor: str = "assistant",
    ) -> ToolResult:
        """Call a tool; refusals and failures come back as results, escalations propagate.

        ``requestor="user"`` calls one of the user's tools (:attr:`user_tools`)."""
        arguments = dict(arguments or {})
        tools = self.tools_of(requestor)
        tool = tools.get(name)
        write = self.is_write(name, requestor)
        error: BaseException | None = None
        if tool is None:
            whose = "tools" if requestor == "assistant" else "the user's tools"
            result = ToolResult(
                False,
                error=f"unknown tool {name!r}; {whose}: {', '.join(sorted(tools))}",
                kind="unknown_tool",
            )
        else:
            try:
                if isinstance(tool, Action):
                    value = self.episode.call_mapping(tool, arguments)
                else:
                    value = _read_value(name, tool(**arguments))
                result = ToolResult(True, value)
            except (Escalated, EpisodeClosed, ConfigurationError):
                self.calls.append(CallRecord(name, arguments, False, "escalated", write, requestor))
                raise
            except Exception as exc:
                error = exc
                told = refusal(exc)
                if told is not None:
                    result = ToolResult(False, error=told[1], kind=told[0])
                elif isinstance(exc, TypeError):
                    result = ToolResult(
                        False, error=f"invalid arguments for {name!r}: {exc}", kind="invalid"
                    )
                else:  # a read tool's own error is an answer for the agent
                    result = ToolResult(False, error=f"{exc}", kind="tool_error")
        self.apply_tool_message(name, arguments, result, error, requestor)
        self.calls.append(CallRecord(name, arguments, result.ok, result.kind, write, requestor))
        return result


@runtime_checkable
class Agent(Protocol):
    """Given a task and a toolbox, act; return how the turn ended.

    Any class with these three members is an agent (no base class to inherit)::

        class MyAgent:
            name = "my-agent"                      # required: a non-empty string

            def config(self) -> dict:              # required: JSON-ready, for the evidence
                return {"name": self.name}

            def run(self, task, toolbox, *, seed): # required: act, then say how it ended
                for call in task.reference_actions:
                    toolbox.call(call.name, dict(call.arguments))
                return AgentOutput(message="done")

    Attributes:
        name: names the agent in the run's records and reports (required; a class attribute
            or set in ``__init__``).

    ``run`` gets the :class:`~harness.Task` (``task.instruction``, ``task.reference_actions``)
    and a :class:`Toolbox`: ``toolbox.call(name, arguments)`` runs a tool (a write as a
    transaction in the trial's episode) and returns a :class:`ToolResult`; a refused or failed
    call comes back as ``ok=False`` with the reason, for the agent to adapt to; only an
    escalation ends the turn. ``toolbox.specs`` lists the tools in OpenAI's function-calling
    format and ``toolbox.is_write(name)`` says which change state. ``seed`` is the trial's
    seed: draw every random choice from it, so a resumed or replayed trial repeats its path.
    A value the path depends on that is not a tool call (a model's answer) goes through
    ``toolbox.episode.remember(what, request, compute)`` (:class:`Session`), so a resume gets it
    back instead of computing it again.

    The agent is built with its options as keyword arguments (none from the command line), so
    its ``__init__`` parameters need defaults. On the command line an agent is a registered
    name (``scripted``, ``simulated``, ``openai``), ``module:Class`` (imported from the current
    directory or the installed packages) or ``path/to/file.py:Class``
    (:class:`~harness.agents.spec.AgentSpec`, which checks all of the above before a trial
    starts).
    """

    name: str

    def config(self) -> dict[str, Any]:
        """The agent's configuration, for the run's evidence record (a JSON-ready dict)."""
        ...

    def run(self, task: Task, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        """Act on ``task`` through ``toolbox``; ``seed`` is the trial's."""
        ...


class AgentRegistry:
    """Agent factories by name (an object, so tests can use a fresh one).

    :meth:`create` also builds an agent a spec names (``module:Class`` or
    ``path/to/file.py:Class``, :class:`~harness.agents.spec.AgentSpec`), so whatever names an
    agent (a run's configuration, a worker process) goes through one place.
    """

    def __init__(self) -> None:
        self._factories: dict[str, Callable[..., Agent]] = {}

    def register(self, name: str, factory: Callable[..., Agent]) -> None:
        """Add a factory under ``name``."""
        self._factories[name] = factory

    def names(self) -> list[str]:
        """Registered names, sorted."""
        return sorted(self._factories)

    def factory(self, name: str) -> Callable[..., Any]:
        """What builds agent ``name``: the registered factory, or the class a spec names.

        Raises:
            ConfigurationError: as :meth:`create`, before anything is built.
        """
        factory = self._factories.get(name)
        if factory is None and is_agent_spec(name):
            return AgentSpec.parse(name).load()
        if factory is None:
            raise ConfigurationError(
                f"unknown agent {name!r}; built in: {', '.join(self.names())}; or name your "
                "own agent class as module:Class or path/to/file.py:Class"
            )
        return factory

    def create(self, name: str, **options: Any) -> Agent:
        """A new agent ``name`` (a registered name or a spec with a colon) with ``options``.

        Raises:
            ConfigurationError: the name is not registered, the spec does not load or does not
                name an agent class, or the options do not fit.
        """
        if name not in self._factories and is_agent_spec(name):
            return AgentSpec.parse(name).create(options)
        factory = self.factory(name)
        try:
            return cast(Agent, factory(**options))
        except TypeError as exc:
            raise ConfigurationError(f"agent {name!r}: bad options {options} ({exc})") from exc


registry = AgentRegistry()

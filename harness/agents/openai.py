"""``OpenAIAgent``: a model behind any OpenAI-compatible chat-completions server acts on a task;
``OpenAIUser``: a model on such a server plays the user, as tau2-bench's user simulator does.

The agent speaks the chat-completions protocol with tool calling (OpenAI, vLLM, llama.cpp's
server, Ollama) on the HTTP client the official ``openai`` package runs on (its pooled
``httpx`` client, with openai's connection limits; a plain ``http://`` server reached with no
proxy goes over the standard library's kept-alive connections, :mod:`.plainhttp`), pointed at
the server by ``base_url``: a request is one POST of the body as it is, without the typed
client's rebuilding of it.
The toolbox's tools are offered as functions, and every tool call the model makes goes through
:meth:`Toolbox.call`, so writes run as transactions and refusals come back to the model as tool
results. Several tool calls in one reply run at once, each its own transaction (the episode
attributes each its own changes), and their results go back in the order of the calls.

Without a user, the task's instruction is the user's single message, and the turn ends when the
model answers without calling a tool, or after ``max_turns``.

With a user (``user=``: a :class:`~harness.agents.user.User`, or ``"openai"`` / ``"scripted"``
built from the ``user_*`` options), the agent runs tau2-bench's half-duplex conversation loop
(``src/tau2/orchestrator/orchestrator.py``, ``Orchestrator``, at commit
``a2c024725189473d2d7cea3a5cfdbcc67478e41f``), which this module re-states:

- The agent speaks first, without a model call: :data:`GREETING`. Its system prompt is tau2's
  (:data:`TAU2_SYSTEM_PROMPT` with :data:`TAU2_AGENT_INSTRUCTION` and the environment's
  ``policy``) unless ``system_prompt`` is given.
- Then the user answers; the agent's reply goes to the tools when it calls any (all its calls
  run, and each result follows in the order of the calls), else to the user; after tool
  results the agent speaks again. The user sees the agent's text messages only.
- A user may have tools of its own (``environment.user_tools``: tau2's dual-control domains).
  A user message that calls tools goes to the environment, not the agent (``Orchestrator.step``:
  ``user_msg.is_tool_call()`` sends it to ``Role.ENV``); the calls run one after another
  (``_execute_tool_calls``, each through ``Environment.get_response`` with
  ``requestor="user"``, so on the user's tools), each result a ``tool`` message with
  ``requestor: "user"``, and the results go back to the user (``to_role = from_role``), who
  speaks again. The agent never sees that message nor its results; such a message never stops
  the conversation (``UserSimulator.is_stop`` is false for a tool call). The user's calls go
  through the same :class:`~harness.agents.base.Toolbox` and episode as the agent's
  (``Toolbox.call(..., requestor="user")``): a write is a transaction, a read is recorded, and
  a resumed or replayed trial gets the recorded results.
- Each of those is one step: a user message, an agent message, the results of one message's
  tool calls (the agent's or the user's). An error is a tool result that failed, whoever
  made the call (a refusal, an unknown tool, malformed arguments). After every step that
  does not wait on tools, the conversation ends as ``max_steps`` when ``max_steps`` steps
  were taken, and as ``too_many_errors`` when ``max_errors`` errors were made (checked in
  that order, so the latter wins, and either replaces a ``user_stop`` of the same step, as
  tau2's ``_check_termination`` does).
- A user message containing ``###STOP###``, ``###TRANSFER###`` or ``###OUT-OF-SCOPE###``
  ends it as ``user_stop``. tau2's text agent never stops by itself (``LLMAgent.is_stop`` is
  false): calling ``transfer_to_human_agents`` is a tool call like any other, whose result
  (``Transfer successful``) goes back to the agent, which tells the user, who answers
  ``###TRANSFER###``. The run records that the transfer tool was called (``transferred``).
- An agent or user message with no text and no tool call ends it as ``agent_error`` or
  ``user_error`` (tau2 validates each message and fails the simulation there).

:class:`~harness.agents.base.AgentOutput` then carries the conversation in tau2's message shape
(``meta["messages"]``: ``assistant``, ``user`` and ``tool`` messages with their contents, the
tool calls with ids, names, arguments and requestor, each tool result's ``id``, ``requestor``
and ``error``, every message's ``turn_idx`` and ``timestamp``, the models' ``usage`` and
``cost`` where the server reported them), ``termination_reason`` (tau2's values),
``max_steps``, ``max_errors`` and ``user`` (the user's configuration: implementation, model).
Its ``message`` is every text message the agent sent the user, one per line (tau2 checks the
information a task requires the agent to communicate in any of them); ``claimed_success`` is
whether the conversation ended as ``user_stop`` or ``agent_stop``, the endings tau2 rewards.

Failures of the model server itself (connection refused or dropped, timeouts, HTTP 5xx, 408,
429) are retried here with exponential backoff, always waiting at least the server's
``Retry-After`` (every attempt is counted and every wait is ours), within two bounds:
``attempts`` failed attempts (429s included), and ``retry_for`` seconds over the call's
attempts and waits, so a rate-limit burst can be waited out with many attempts and still not
for ever; a wait that would end past ``retry_for`` (the server's ``Retry-After`` included)
ends the retries at once. Failures that persist are raised as
:class:`ModelServerError`: an infrastructure error, not the agent's failure. A request the
server refuses (HTTP 4xx other than 408 and 429: a wrong model name, a bad key, a request it
cannot parse) is raised at once as :class:`ModelRequestError`, naming the status and the
server's message. An error leaving :meth:`OpenAIAgent.run` carries ``agent_meta``: what the
trial's metadata said so far (its model calls, the failed one with its attempts, the seconds
and tokens), so a trial that ends on it still counts what it cost.

A broken server cannot take the process down with it. Its body is read as it arrives and
reading stops past ``max_response_bytes`` (an error body is cut at
:data:`ERROR_BODY_BYTES`, which is plenty for its message); ``timeout`` bounds each wait for
data, and ``request_timeout`` the whole attempt, so a server dripping a byte a second fails it
too; a tool call's arguments longer than ``max_tool_argument_bytes`` are not parsed, and the
model is told so as it is told of malformed arguments. Each limit's error names the option
that changes it.

``openai`` is imported when an agent is made, not by ``import harness``.
``harness.testing.model_server.FakeChatServer`` is a scripted local server to test against.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import json
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from .._json import canonical, canonical_object, digest
from .._version import __version__
from ..action import ContextExecutor
from ..errors import (
    RETRYABLE_STATUS,
    ConfigurationError,
    EndpointDown,
    ModelRequestError,
    ModelServerError,
)
from ..suite import Task
from .base import AgentOutput, Session, Toolbox, ToolResult, registry
from .endpoint import DOWN_AFTER, DOWN_FAILURES, endpoint
from .plainhttp import plain_transport_type
from .user import (
    SIMULATION_GUIDELINES,
    SIMULATION_GUIDELINES_TOOLS,
    STOP_TOKENS,
    User,
    UserTurn,
    is_stop,
    user_registry,
    user_system_prompt,
    user_view,
)

if TYPE_CHECKING:
    from ..action import Action
    from ..errors import Diverged

__all__ = [
    "DEFAULT_MAX_ERRORS",
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_MAX_STEPS",
    "DEFAULT_MAX_TOOL_ARGUMENT_BYTES",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_RETRY_FOR",
    "DEFAULT_SYSTEM_PROMPT",
    "ERROR_BODY_BYTES",
    "GREETING",
    "TAU2_AGENT_INSTRUCTION",
    "TAU2_SYSTEM_PROMPT",
    "TRANSFER_TOOL",
    "OpenAIAgent",
    "OpenAIUser",
    "SimulationFailed",
]

DEFAULT_SYSTEM_PROMPT = (
    "You are a customer-service agent. Act only through the tools you are given: look up what "
    "you need, make changes only with the tools, and follow the policy. When a tool returns an "
    "error, read it and adapt. When you are done, or cannot go further, answer the customer in "
    "plain text without calling a tool."
)
"""The system prompt unless one is given (the environment's ``policy`` text is appended)."""

# Copied from tau2-bench src/tau2/agent/llm_agent.py (MIT; notice in harness/agents/user.py).
TAU2_AGENT_INSTRUCTION = """
You are a customer service agent that helps the user according to the <policy> provided below.
In each turn you can either:
- Send a message to the user.
- Make a tool call.
You cannot do both at the same time.

Try to be helpful and always follow the policy. Always make sure you generate valid JSON only.
""".strip()
"""tau2-bench's agent instruction (``AGENT_INSTRUCTION``): the agent's instructions in a
conversation with a user, unless ``system_prompt`` is given."""

# Copied from tau2-bench src/tau2/agent/llm_agent.py (MIT; notice in harness/agents/user.py).
TAU2_SYSTEM_PROMPT = """
<instructions>
{agent_instruction}
</instructions>
<policy>
{domain_policy}
</policy>
""".strip()
"""tau2-bench's agent system prompt template (``SYSTEM_PROMPT``): the instruction, then the
environment's ``policy``."""

GREETING = "Hi! How can I help you today?"
"""The agent's first message in a conversation, before any model call (tau2-bench's
``DEFAULT_FIRST_AGENT_MESSAGE``, ``src/tau2/orchestrator/orchestrator.py``)."""

DEFAULT_MAX_STEPS = 200
"""Messages a conversation may take before it ends as ``max_steps`` (tau2-bench's
``DEFAULT_MAX_STEPS``, ``src/tau2/config.py``)."""

DEFAULT_MAX_ERRORS = 10
"""Failed tool calls a conversation may make before it ends as ``too_many_errors``
(tau2-bench's ``DEFAULT_MAX_ERRORS``)."""

DEFAULT_RETRY_FOR = 120.0
"""Seconds a model call may spend on its attempts and the waits between them (``retry_for``)."""

DEFAULT_REQUEST_TIMEOUT = 600.0
"""Seconds one attempt may take from sending to the last byte of the answer
(``request_timeout``; ``timeout`` bounds each wait for data within it)."""

DEFAULT_MAX_RESPONSE_BYTES = 32 * 1024 * 1024
"""Bytes of one response's body read at most (``max_response_bytes``)."""

DEFAULT_MAX_TOOL_ARGUMENT_BYTES = 1024 * 1024
"""Bytes of one tool call's arguments parsed at most (``max_tool_argument_bytes``)."""

ERROR_BODY_BYTES = 64 * 1024
"""Bytes of an error response's body read (the rest is dropped: the message is at its start)."""

TRANSFER_TOOL = "transfer_to_human_agents"
"""tau2-bench's tool for handing the user to a person (a tool call like any other there: the
conversation goes on until the user says ``###TRANSFER###``)."""


def _server_message(text: str) -> str:
    """The error message in an error response, in any of the shapes servers use."""
    text = text.strip()
    try:
        data = json.loads(text)
    except ValueError:
        return text[:500]
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict):
            for field in ("message", "detail", "error"):
                if isinstance(err.get(field), str):
                    return str(err[field])
        if isinstance(err, str):
            return err
        if isinstance(data.get("detail"), str):
            return str(data["detail"])
    return text[:500]


def _retry_after(headers: Any) -> float | None:
    """The wait a response asks for, in seconds (``retry-after-ms`` or ``Retry-After``), or
    None (absent, or an HTTP date: our own backoff applies)."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name) if headers is not None else None
        if value:
            try:
                return max(float(value) / divisor, 0.0)
            except ValueError:
                continue
    return None


def parse_arguments(
    raw: Any, *, max_bytes: int | None = None
) -> tuple[dict[str, Any] | None, str | None]:
    """A tool call's arguments as a dict, or the reason they cannot be read (with what the
    model should do instead).

    Servers send a JSON string (the protocol); some (Ollama) send the object itself.

    Args:
        raw: the call's ``arguments`` as the server sent them.
        max_bytes: arguments longer than this (UTF-8 JSON) are refused without being parsed.
    """
    if max_bytes is not None and not isinstance(raw, str | None):
        size = _json_size(raw)
        if size is not None and size > max_bytes:
            return None, _too_long(size, max_bytes)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}, None
    if isinstance(raw, dict):
        return raw, None
    hint = "; send the arguments as a JSON object"
    if not isinstance(raw, str):
        return None, f"arguments must be a JSON object, got {type(raw).__name__}{hint}"
    if max_bytes is not None and len(raw) * 4 > max_bytes:  # (a character is 1 to 4 bytes)
        size = len(raw) if len(raw) > max_bytes else len(raw.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            return None, _too_long(size, max_bytes)
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return None, f"arguments are not valid JSON ({exc}): {raw[:200]}{hint}"
    if not isinstance(value, dict):
        return None, (
            f"arguments must be a JSON object, got {type(value).__name__}: {raw[:200]}{hint}"
        )
    return value, None


def _json_size(value: Any) -> int | None:
    """The UTF-8 length of ``value`` as JSON, or None when JSON cannot hold it."""
    try:
        return len(json.dumps(value).encode())
    except (TypeError, ValueError):
        return None


def _too_long(size: int, limit: int) -> str:
    return (
        f"its arguments are {size:,} bytes, over the limit of {limit:,} "
        "(max_tool_argument_bytes); send smaller arguments"
    )


def _as_text(result: ToolResult) -> str:
    """The result as the model reads it, even when a read tool returned something JSON cannot
    hold (its ``str``), rather than ending the trial on a serialization error."""
    try:
        return result.as_text()
    except (TypeError, ValueError):
        return json.dumps(result.content, default=str)


def _normalized_calls(raw: Any, turn: int) -> list[dict[str, Any]]:
    """The tool calls of a reply as the protocol shapes them, to send back in the history.

    Copies (the recorded response stays as received), with an id and type where a server left
    them out, and arguments as a JSON string where a server sent the object.
    """
    calls: list[dict[str, Any]] = []
    for i, call in enumerate(raw if isinstance(raw, list) else []):
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        function = dict(function) if isinstance(function, dict) else {}
        if isinstance(function.get("arguments"), dict):
            function["arguments"] = json.dumps(function["arguments"])
        calls.append(
            {
                "id": call.get("id") or f"call_{turn}_{i}",
                "type": call.get("type") or "function",
                "function": function,
            }
        )
    return calls


def _user_calls(user: User, calls: Any) -> list[dict[str, Any]]:
    """A user turn's tool calls in tau2's shape (``id``, ``name``, ``arguments``,
    ``requestor="user"``; ``error`` when the arguments did not parse).

    Raises:
        ConfigurationError: the user gave something that is not a list of such calls.
    """
    if not calls:
        return []
    out = []
    for i, call in enumerate(calls if isinstance(calls, list) else [calls]):
        name = call.get("name") if isinstance(call, Mapping) else None
        arguments = call.get("arguments") if isinstance(call, Mapping) else None
        error = call.get("error") if isinstance(call, Mapping) else None
        if not isinstance(name, str) or (error is None and not isinstance(arguments, Mapping)):
            raise ConfigurationError(
                f"user {user.name!r}: a UserTurn's tool_calls are "
                f'{{"id": ..., "name": ..., "arguments": {{...}}}}, got {call!r}'
            )
        out.append(
            {
                "id": str(call.get("id") or f"user_call_{i}"),
                "name": name,
                "arguments": dict(arguments) if isinstance(arguments, Mapping) else None,
                "requestor": "user",
                **({"error": str(error)} if error is not None else {}),
            }
        )
    return out


def _now() -> str:
    """A message's timestamp as tau2 writes it (``get_now``: local time, ISO format)."""
    return datetime.now().isoformat()


def _usage(response: Mapping[str, Any]) -> dict[str, int] | None:
    """The token counts of a response as tau2 keeps them (``completion_tokens``,
    ``prompt_tokens``), or None when the server reported none."""
    raw = response.get("usage")
    if not isinstance(raw, Mapping):
        return None
    counts = {
        k: raw[k] for k in ("completion_tokens", "prompt_tokens") if isinstance(raw.get(k), int)
    }
    return counts or None


def _total_tokens(response: Mapping[str, Any]) -> int:
    """The tokens a response used (``usage.total_tokens``, else its prompt and completion
    tokens added), 0 when the server reported none."""
    raw = response.get("usage")
    if not isinstance(raw, Mapping):
        return 0
    total = raw.get("total_tokens")
    if isinstance(total, int) and not isinstance(total, bool):
        return total
    return sum((_usage(response) or {}).values())


def _cost(response: Mapping[str, Any]) -> float | None:
    """The cost a server reported with a response (``usage.cost``, as some routers send), or
    None: the harness does not price tokens itself."""
    raw = response.get("usage")
    cost = raw.get("cost") if isinstance(raw, Mapping) else None
    return float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) else None


def _add_usage(total: dict[str, int], usage: Any) -> None:
    for k, v in (usage or {}).items():
        if isinstance(v, int) and not isinstance(v, bool):
            total[k] = total.get(k, 0) + v


_MESSAGE_TEXTS: dict[tuple[tuple[str, Any], ...], tuple[str, str]] = {}
_MESSAGE_TEXTS_KEPT = 4096  # (the whole cache is dropped when full)


def _message_texts(message: Any) -> tuple[str, str]:
    """A chat message's canonical JSON (for the digest) and its compact JSON as sent.

    A message whose every value is a string or None (the system prompt, the user's and the
    tools' messages: most of a conversation's text) is kept by its content: each request
    sends the whole conversation again, and its old messages are not encoded again. Others
    (an assistant's message with tool calls) are encoded each time."""
    if type(message) is dict and all(v is None or type(v) is str for v in message.values()):
        key = tuple(message.items())
        found = _MESSAGE_TEXTS.get(key)
        if found is None:
            found = (canonical(message), _REQUEST_JSON.encode(message))
            if len(_MESSAGE_TEXTS) >= _MESSAGE_TEXTS_KEPT:
                _MESSAGE_TEXTS.clear()
            _MESSAGE_TEXTS[key] = found
        return found
    return canonical(message), _REQUEST_JSON.encode(message)


def _request_texts(body: dict[str, Any], toolbox: Toolbox | None) -> tuple[str, str]:
    """The request's digest and its JSON as sent (the text of ``_REQUEST_JSON.encode(body)``,
    byte for byte), built from each message's texts (:func:`_message_texts`) and the
    toolbox's tool definitions encoded once a trial (they are most of a request).

    Raises:
        TypeError, ValueError: the body holds something JSON cannot write.
    """
    messages = body.get("messages")
    if type(messages) is not list:
        return digest(body), _REQUEST_JSON.encode(body)
    pairs = [_message_texts(m) for m in messages]
    canon: dict[str, str] = {}
    sent: list[str] = []
    for key, value in body.items():
        if key == "messages":
            canon[key] = "[" + ",".join(c for c, _ in pairs) + "]"
            text = "[" + ",".join(p for _, p in pairs) + "]"
        elif key == "tools" and toolbox is not None and value is toolbox.specs:
            canon[key], text = toolbox.specs_canonical, toolbox.specs_compact
        else:
            canon[key], text = canonical(value), _REQUEST_JSON.encode(value)
        sent.append(f"{_REQUEST_JSON.encode(key)}:{text}")
    request_digest = hashlib.sha256(canonical_object(canon).encode()).hexdigest()
    return request_digest, "{" + ",".join(sent) + "}"


def _failed_call(
    error: ModelServerError, request_digest: str | None, seconds: float
) -> dict[str, Any]:
    """The record of a model call that raised: its attempts (those sent), its time, the error;
    no response."""
    entry: dict[str, Any] = {
        "response": None,
        "error": f"{type(error).__name__}: {error}",
        "attempts": error.attempts,
        "seconds": round(seconds, 6),
    }
    if request_digest is not None:
        entry = {"request_digest": request_digest, **entry}
    return entry


def _loop_meta(
    calls: list[dict[str, Any]], usage: dict[str, int], *, stop_reason: str | None
) -> dict[str, Any]:
    """The metadata every loop of the agent starts with: its model calls and tokens (the
    lists the loop fills), counts at zero."""
    return {
        "model_calls": calls,
        "model_call_count": 0,
        "usage": usage,
        "tool_calls": 0,
        "malformed_tool_calls": 0,
        "parallel_turns": 0,
        "stop_reason": stop_reason,
    }


def _with_seconds(meta: dict[str, Any]) -> dict[str, Any]:
    """``meta`` with what the trial cost in model time, summed over its calls (answers from
    the record take none)."""
    for calls, key in (("model_calls", "model_seconds"), ("user_calls", "user_seconds")):
        if calls in meta:
            meta[key] = round(sum(c.get("seconds", 0.0) for c in meta[calls]), 6)
    return meta


def _tau2_call(call: Mapping[str, Any], max_bytes: int) -> dict[str, Any]:
    """A tool call in tau2's shape (``ToolCall``: id, name, arguments as an object,
    requestor); arguments that are not a JSON object, or longer than ``max_bytes``, are given
    as ``{}``."""
    function = call.get("function") or {}
    arguments, _ = parse_arguments(function.get("arguments"), max_bytes=max_bytes)
    return {
        "id": call.get("id", ""),
        "name": function.get("name") or "",
        "arguments": arguments if arguments is not None else {},
        "requestor": "assistant",
    }


class _Overrun(Exception):
    """A response passed a limit while it was read: ``limit`` names the option, ``size`` the
    bytes read when it did (for ``max_response_bytes``)."""

    def __init__(self, limit: str, size: int = 0) -> None:
        self.limit = limit
        self.size = size
        super().__init__(limit)


class _BoundedBody:
    """A response's body stream, read through its limits: it raises :class:`_Overrun` once
    more than ``limit`` bytes came (or were announced), or when ``deadline`` (monotonic) has
    passed; with ``cut``, it ends quietly at ``limit`` bytes instead. Either way the
    connection underneath is closed, not left half read."""

    def __init__(
        self, inner: Any, *, limit: int, declared: int | None, deadline: float, cut: bool
    ) -> None:
        self._inner = inner
        self._limit = limit
        self._declared = declared
        self._deadline = deadline
        self._cut = cut
        self._closed = False

    def __iter__(self) -> Iterator[bytes]:
        if not self._cut and self._declared is not None and self._declared > self._limit:
            self.close()
            raise _Overrun("max_response_bytes", self._declared)
        read = 0
        for chunk in self._inner:
            if time.monotonic() > self._deadline:
                self.close()
                raise _Overrun("request_timeout")
            read += len(chunk)
            if read > self._limit:
                self.close()
                if self._cut:
                    yield chunk[: self._limit - (read - len(chunk))]
                    return
                raise _Overrun("max_response_bytes", read)
            yield chunk

    def close(self) -> None:
        """Close the stream underneath, once (httpx closes a response again after us)."""
        if not self._closed:
            self._closed = True
            self._inner.close()


class _NotRun(BaseException):
    """A call of a reply left unrun because a call before it raised (an escalation), as a
    reply's calls made one after another would be. A BaseException, so that the toolbox does
    not turn it into a tool result."""


class _Turnstile:
    """Lets the calls of one reply reach the episode in the order of the calls.

    A call's steps that the episode records (a transaction, a remembered read) wait until every
    call before it has finished, so the record holds them in the order of the calls whatever
    thread ran first, and a resumed episode, which makes the calls again in that order, matches
    its record. A call that records nothing (a plain read tool) runs at once.
    """

    def __init__(self, calls: int) -> None:
        self._cond = threading.Condition()
        self._done = [False] * calls
        self._failed: int | None = None  # the first position whose call raised

    def wait(self, position: int) -> None:
        """Return once every call before ``position`` has finished; :class:`_NotRun` when one
        of them raised."""
        with self._cond:
            self._cond.wait_for(lambda: all(self._done[:position]))
            if self._failed is not None and self._failed < position:
                raise _NotRun

    def done(self, position: int, *, failed: bool) -> None:
        """The call at ``position`` has finished (``failed``: it raised)."""
        with self._cond:
            self._done[position] = True
            if failed and (self._failed is None or position < self._failed):
                self._failed = position
            self._cond.notify_all()


class _InOrder:
    """The episode as one call of a reply sees it: what it records waits its turn
    (:class:`_Turnstile`); everything else is the episode's."""

    def __init__(self, session: Session, turnstile: _Turnstile, position: int) -> None:
        self._session = session
        self._turnstile = turnstile
        self._position = position
        self.id = session.id

    @property
    def diverged(self) -> Diverged | None:
        """The episode's divergence from its record, if any."""
        return self._session.diverged

    def call_mapping(self, action: Action[Any, Any], arguments: dict[str, Any]) -> Any:
        """Run ``action`` in the episode once the calls before this one have finished."""
        self._turnstile.wait(self._position)
        return self._session.call_mapping(action, arguments)

    def remember(self, what: str, request: Any, compute: Callable[[], Any]) -> Any:
        """Remember a value in the episode once the calls before this one have finished."""
        self._turnstile.wait(self._position)
        return self._session.remember(what, request, compute)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def _call_in_order(
    toolbox: Toolbox, turnstile: _Turnstile, position: int, name: str, arguments: dict[str, Any]
) -> ToolResult:
    """One call of a reply, on a view of the toolbox whose episode steps wait their turn."""
    view = copy.copy(toolbox)  # shares the tools and the list of calls
    view.episode = _InOrder(toolbox.episode, turnstile, position)
    try:
        result = view.call(name, arguments)
    except BaseException:
        turnstile.done(position, failed=True)
        raise
    turnstile.done(position, failed=False)
    return result


class _ChatEndpoint:
    """A model on an OpenAI-compatible chat-completions server: the client, its retries, the
    limits on what a response may cost, and how errors are told (what :class:`OpenAIAgent`
    and :class:`OpenAIUser` share)."""

    def _init_endpoint(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None,
        timeout: float,
        attempts: int,
        backoff: float,
        max_backoff: float,
        proxy: str | None,
        sleep: Callable[[float], None],
        max_in_flight: int | None = None,
        down_after: float = DOWN_AFTER,
        down_failures: int = DOWN_FAILURES,
        retry_for: float | None = DEFAULT_RETRY_FOR,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        """Check and keep the server's settings (errors name the class being built)."""
        who = type(self).__name__
        if not isinstance(base_url, str) or not base_url.startswith(("http://", "https://")):
            raise ConfigurationError(
                f"{who}(base_url={base_url!r}): give an http(s) URL such as "
                "http://127.0.0.1:8000/v1"
            )
        if not model:
            raise ConfigurationError(f"{who}(model=...): name the model the server serves")
        if attempts < 1:
            raise ConfigurationError(f"{who}: attempts must be >= 1")
        if timeout <= 0 or backoff < 0 or max_backoff < 0:
            raise ConfigurationError(f"{who}: timeout must be > 0, backoff waits >= 0")
        if retry_for is not None and retry_for < 0:
            raise ConfigurationError(
                f"{who}(retry_for={retry_for}): give seconds >= 0, or None for no time limit"
            )
        if request_timeout <= 0 or max_response_bytes < 1:
            raise ConfigurationError(
                f"{who}: request_timeout must be > 0 seconds and max_response_bytes >= 1 "
                f"(got {request_timeout}, {max_response_bytes})"
            )
        self.base_url = base_url.rstrip("/")
        self.url = _completions_url(self.base_url)
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.retry_for = retry_for
        self.request_timeout = request_timeout
        self.max_response_bytes = max_response_bytes
        self.proxy = proxy
        self._sleep = sleep
        self.max_in_flight = max_in_flight
        self.down_after = down_after
        self.down_failures = down_failures
        # The client is imported now, once: trials started at once in threads would import it
        # side by side, and the client reads a half-imported httpx (no URL yet).
        import openai  # noqa: F401

        _http()

        self._client_lock = threading.Lock()
        self._shared_client: Any = None
        # The deadline of the attempt each thread is making, for the bodies it reads.
        self._attempt = threading.local()

        # Shared with every agent and user of this process calling the same server.
        self.endpoint = endpoint(self.base_url).configure(
            max_in_flight=max_in_flight, down_after=down_after, down_failures=down_failures
        )

    def _transport_config(self) -> dict[str, Any]:
        """The settings of the requests themselves, as ``config()`` records them."""
        return {
            "timeout": self.timeout,
            "request_timeout": self.request_timeout,
            "attempts": self.attempts,
            "retry_for": self.retry_for,
            "backoff": self.backoff,
            "max_backoff": self.max_backoff,
            "max_response_bytes": self.max_response_bytes,
            "proxy": self.proxy,
        }

    @staticmethod
    def _message(response: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
        choices = response.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise ValueError("response has no choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise ValueError("response's first choice has no message")
        reason = choices[0].get("finish_reason")
        return dict(message), reason if isinstance(reason, str) else None

    def _client(self) -> Any:
        """The HTTP client, made on first use and shared by every trial this object runs
        (threads included: the client is thread-safe and pools its connections, and making one
        costs tens of milliseconds of CPU, mostly its TLS context)."""
        with self._client_lock:
            if self._shared_client is None:
                self._shared_client = self._new_client()
            return self._shared_client

    def _new_client(self) -> Any:
        """openai's own HTTP client (``DefaultHttpxClient``: its connection limits, redirects
        followed), which retries nothing (we do), reads no environment variable (no proxy but
        ``proxy``, no key but ``api_key``: never ``OPENAI_API_KEY``) and reads every body
        through its limits (:meth:`_bound_body`). A plain ``http://`` server with no proxy is
        reached through :mod:`.plainhttp`'s transport (about 0.25 ms of CPU a call against
        0.36 through the client's own pool, body encoded beforehand); TLS and proxies keep the
        client's own."""
        import openai

        options: dict[str, Any] = {}
        if self.proxy is None and self.url.startswith("http://"):
            # A plain HTTP server reached directly: the standard library's connections.
            options["transport"] = plain_transport_type(_http())()
        return openai.DefaultHttpxClient(
            trust_env=False,
            proxy=self.proxy,
            timeout=self.timeout,  # httpx's: each connect, write and read (not the total)
            event_hooks={"response": [self._bound_body]},
            **options,
        )

    def _bound_body(self, response: Any) -> None:
        """Have ``response``'s body read through its limits (an httpx response hook: it runs
        once the headers are in, before any of the body is read, including the error bodies
        the client reads itself)."""
        deadline = getattr(self._attempt, "deadline", None)
        if deadline is None:
            deadline = time.monotonic() + self.request_timeout
        failed = response.status_code >= 400
        declared = response.headers.get("content-length")
        response.stream = _bounded_body_type()(
            response.stream,
            limit=ERROR_BODY_BYTES if failed else self.max_response_bytes,
            declared=int(declared) if declared and declared.isdigit() else None,
            deadline=deadline,
            cut=failed,
        )

    @functools.cached_property
    def _headers(self) -> Any:
        """Each request's headers: JSON both ways, and the key only when there is one (no
        organization, no project); built once, as the HTTP library's own type."""
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": f"harness/{__version__}",
        }
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return _http().Headers(headers)

    @functools.cached_property
    def _post_url(self) -> Any:
        """Where a request goes, parsed once by the HTTP library."""
        return _http().URL(self.url)

    def _encoded(self, body: dict[str, Any], toolbox: Toolbox | None) -> tuple[str, bytes]:
        """The request's digest and the bytes sent (:func:`_request_texts`).

        Raises:
            TypeError: the body holds something JSON cannot write (a bug of the caller's,
                not the server's).
        """
        try:
            request_digest, text = _request_texts(body, toolbox)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"the request to {self.url} cannot be written as JSON: {exc}") from None
        return request_digest, text.encode("utf-8")

    # --- retries ---
    def _complete(
        self, client: Any, body: dict[str, Any], payload: bytes | None = None
    ) -> tuple[dict[str, Any], int]:
        """Ask for one completion, retrying infrastructure errors within ``attempts`` and
        ``retry_for``; the response and the attempts it took. ``payload``: ``body`` encoded
        already (:func:`_request_texts`).

        Raises:
            ModelServerError: the retries ran out (every attempt's error in ``errors``), or a
                failure another attempt cannot mend; its ``attempts`` counts those sent.
            EndpointDown: the circuit is open (``attempts``: those sent before it opened).
            ModelRequestError: the server refused the request.
        """
        errors: list[ModelServerError] = []
        sent = 0  # attempts that reached the server (a circuit or a pause may refuse one)
        spent = 0.0  # the call's time so far: its attempts and the waits between them
        while True:
            started = time.monotonic()
            left = None if self.retry_for is None else max(self.retry_for - spent, 0.0)
            try:
                with self.endpoint.request(retry=bool(errors), patience=left):
                    sent += 1
                    response = self._post(client, body, payload)
                    self._message(response)
                self.endpoint.used(_total_tokens(response))
                return response, sent
            except (EndpointDown, ModelRequestError) as exc:
                exc.attempts = sent
                raise
            except ModelServerError as exc:
                error = exc
            except ValueError as exc:  # a body that is not a chat completion
                error = ModelServerError(
                    f"model server at {self.url} sent a malformed response: {exc}", url=self.url
                )
                error.__cause__ = exc
            spent += time.monotonic() - started
            errors.append(error)
            wait = _backoff(self.backoff, self.max_backoff, len(errors), error.retry_after)
            final = self._give_up(errors, sent, spent, wait)
            if final is not None:
                raise final from error
            self._sleep(wait)
            spent += wait

    def _give_up(
        self, errors: list[ModelServerError], sent: int, spent: float, wait: float
    ) -> ModelServerError | None:
        """The error ending a call's retries after ``errors`` (``sent`` of them reached the
        server), or None to wait ``wait`` and try again: a failure no attempt can mend,
        ``attempts`` failures, or a wait that would end past ``retry_for`` (the server's
        ``Retry-After`` is never cut short)."""
        last = errors[-1]
        limit: str | None = None
        if not last.transient or len(errors) >= self.attempts:
            why = ""
        elif self.retry_for is not None and spent + wait > self.retry_for:
            left = max(self.retry_for - spent, 0.0)
            asked = "the server's Retry-After of" if last.retry_after == wait else "a backoff of"
            why = (
                f"; retries stopped: {asked} {wait:g} s is more than the {left:.1f} s left of "
                f"retry_for={self.retry_for:g} s (raise retry_for, or give None for no time "
                "limit)"
            )
            limit = "retry_for"
        else:
            return None
        return ModelServerError(
            f"model server at {self.url} failed {len(errors)} time(s) in {spent:.1f} s{why}; "
            f"last: {last}",
            url=self.url,
            status=last.status,
            attempts=sent,
            errors=errors,
            limit=limit or last.limit,
        )

    # --- one attempt ---
    def _post(
        self, client: Any, body: dict[str, Any], payload: bytes | None = None
    ) -> dict[str, Any]:
        """One attempt; its failures as :class:`ModelServerError` (or its 4xx subclass).

        The body is sent as it is (the typed ``chat.completions.create`` walks the whole
        conversation to rebuild it on every turn), and the server's JSON is read as it was
        sent (not through the client's response types, which would reshape what some servers
        send, such as Ollama's arguments as an object), as it arrives, through the limits
        (:meth:`_bound_body`).
        """
        http = _http()
        if payload is None:
            payload = self._encoded(body, None)[1]
        self._attempt.deadline = time.monotonic() + self.request_timeout
        try:
            with client.stream(
                "POST", self._post_url, content=payload, headers=self._headers
            ) as raw:
                if raw.status_code >= 400:
                    raw.read()  # the error body, cut at ERROR_BODY_BYTES (_bound_body)
                    raise self._refused(raw.status_code, raw.text, raw.headers)
                content = bytearray()
                for chunk in raw.iter_bytes():  # decoded: a compressed body counts in full
                    content += chunk
                    if len(content) > self.max_response_bytes:
                        raise _Overrun("max_response_bytes", len(content))
        except _Overrun as exc:
            raise self._overrun(exc) from None
        except http.TransportError as exc:  # no connection, a timeout, a connection lost
            raise self._no_answer(exc) from exc
        except http.DecodingError as exc:
            raise ValueError(f"its body cannot be decoded: {exc}") from None
        except http.HTTPError as exc:  # anything else the HTTP client raised
            raise ModelServerError(
                f"the client failed: {type(exc).__name__}: {exc}", url=self.url
            ) from exc
        finally:
            self._attempt.deadline = None
        try:
            value = json.loads(content)
        except ValueError as exc:
            raise ValueError(f"not JSON ({exc}): {_start(content)!r}") from None
        if not isinstance(value, dict):
            raise ValueError(f"not a JSON object: {_start(content)!r}")
        return value

    def _refused(self, status: int, text: str, headers: Any) -> ModelServerError:
        """The error of an HTTP error status: the request refused (4xx but 408 and 429), or
        a failure another attempt may mend (waiting the server's ``Retry-After``)."""
        message = _server_message(text)
        if 400 <= status < 500 and status not in RETRYABLE_STATUS:
            return ModelRequestError(
                f"model server at {self.url} refused the request: HTTP {status}: {message}",
                url=self.url,
                status=status,
                server_message=message,
            )
        return ModelServerError(
            f"HTTP {status}: {message}",
            url=self.url,
            status=status,
            retry_after=_retry_after(headers),
        )

    def _no_answer(self, cause: BaseException) -> ModelServerError:
        """The error of an attempt that got no (whole) answer: a timeout, no connection, a
        connection lost."""
        http = _http()
        if isinstance(cause, http.TimeoutException):
            return ModelServerError(
                f"no answer within {self.timeout} s (timeout, the longest wait for data)",
                url=self.url,
            )
        if isinstance(cause, http.ConnectError):  # nothing listening, or no route
            return ModelServerError(f"cannot reach the server: {cause}", url=self.url)
        return ModelServerError(f"connection failed: {type(cause).__name__}: {cause}", url=self.url)

    def _overrun(self, overrun: _Overrun) -> ModelServerError:
        """The error of a response that passed a limit, naming it and the option."""
        if overrun.limit == "request_timeout":
            # No whole answer came: as a timeout, retried (within retry_for) and a down signal.
            return ModelServerError(
                f"the answer took longer than request_timeout={self.request_timeout:g} s "
                "(the whole attempt, the server still sending); raise request_timeout if the "
                "server is that slow",
                url=self.url,
                limit="request_timeout",
            )
        # The server answered (status 200): another attempt would get the same, so none is made.
        return ModelServerError(
            f"the response is larger than max_response_bytes={self.max_response_bytes:,} "
            f"({overrun.size:,} bytes read or announced; the rest was not read); raise "
            "max_response_bytes if it should be accepted, or cap the completion (max_tokens)",
            url=self.url,
            status=200,
            limit="max_response_bytes",
        )


@functools.cache
def _bounded_body_type() -> type[_BoundedBody]:
    """:class:`_BoundedBody` as the HTTP library's own ``SyncByteStream`` (which it checks
    a response's stream is, to close it)."""
    bases = (_BoundedBody, _http().SyncByteStream)
    made: type[_BoundedBody] = type("BoundedBody", bases, {"__module__": __name__})
    return made


_REQUEST_JSON = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)


def _completions_url(base_url: str) -> str:
    """``base_url``'s ``/chat/completions``, its query (an ``api-version``) kept after it."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/") + "/chat/completions"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


@functools.cache
def _http() -> Any:
    """The HTTP library the installed ``openai`` client runs on: ``httpx2`` (openai 3),
    ``httpx`` before; its response, stream and error types are what a request meets."""
    import openai

    library = openai.DefaultHttpxClient.__mro__[1].__module__.partition(".")[0]
    return importlib.import_module(library)


def _backoff(backoff: float, max_backoff: float, failures: int, asked: float | None) -> float:
    """The wait after ``failures`` failed attempts: exponential from ``backoff``, capped at
    ``max_backoff``, and never shorter than the server's ``Retry-After`` (``asked``)."""
    wait = min(backoff * 2.0 ** min(failures - 1, 64), max_backoff)
    return max(wait, asked) if asked is not None else wait


def _start(content: bytes | bytearray) -> str:
    """The start of a body, as text, for an error message."""
    return bytes(content[:200]).decode("utf-8", "replace")


class OpenAIAgent(_ChatEndpoint):
    """A model on an OpenAI-compatible chat-completions server, acting through the toolbox.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1`` (``/chat/completions`` is
            appended).
        model: the model name the server knows.
        api_key: sent as a bearer token when given (local servers usually need none; without
            one no ``Authorization`` header is sent).
        temperature: sampling temperature.
        max_turns: model calls per task before the agent gives up.
        timeout: seconds to wait for the server at each step of a request (connecting,
            sending, each read of the answer): a server that stops sending fails the attempt.
        request_timeout: seconds one attempt may take in all, from sending to the answer's
            last byte (default :data:`DEFAULT_REQUEST_TIMEOUT`): a server dripping its answer
            fails it too (retried as a timeout is).
        system_prompt: the instructions the model gets first (default
            :data:`DEFAULT_SYSTEM_PROMPT`).
        max_tokens: a cap on each completion, when given.
        attempts: attempts per model call on infrastructure errors (429s included), the first
            included; ``retry_for`` bounds their time as well.
        retry_for: seconds a model call may spend on its attempts and the waits between them
            (default :data:`DEFAULT_RETRY_FOR`); a wait that would end past it ends the
            retries at once, with a :class:`ModelServerError` saying so. None: no bound but
            ``attempts``.
        backoff: first wait in seconds between attempts; doubles each attempt.
        max_backoff: cap on one wait of our own (a server's ``Retry-After`` is always waited
            out in full, within ``retry_for``).
        max_response_bytes: bytes of a response read at most (default
            :data:`DEFAULT_MAX_RESPONSE_BYTES`); a larger one fails the call, unretried, with
            a :class:`ModelServerError` naming the option, and is not read past the limit.
        max_tool_argument_bytes: bytes of one tool call's arguments read at most (default
            :data:`DEFAULT_MAX_TOOL_ARGUMENT_BYTES`); longer ones are not parsed, and the
            model is told so in the call's result, as for malformed arguments.
        proxy: an HTTP proxy URL; none by default.
        parallel_tool_calls: run the tool calls of one reply at once, in threads that carry the
            episode (each call its own transaction; the episode runs their transactions one at
            a time); False runs them one after another, in order.
        sleep: how to wait between attempts (``FakeClock().sleep`` in tests).
        user: converse with this user in tau2-bench's loop (module docstring): a
            :class:`~harness.agents.user.User`, or a registered user's name (``openai``,
            ``scripted``) built from the ``user_*`` options; None (the default) gives the
            task's instruction as the single user message, as always.
        user_model: the ``openai`` user's model (default: ``model``).
        user_base_url: the ``openai`` user's server (default: ``base_url``).
        user_api_key: the ``openai`` user's key (default: ``api_key`` when the user's server
            is the agent's, else none). The user shares the agent's timeouts, retries,
            response limit, proxy and circuit settings.
        user_temperature: the ``openai`` user's temperature (tau2's 0.0).
        user_replies: the ``scripted`` user's replies (default: the task's instruction).
        max_steps: with a user, steps before the conversation ends as ``max_steps`` (tau2's
            200); ``max_turns`` does not apply then.
        max_errors: with a user, failed tool calls before it ends as ``too_many_errors``
            (tau2's 10).
        max_in_flight: requests this process may have in flight to the server at once, over
            every trial it runs (``--concurrency``) and the user on the same server; None: no
            limit (:mod:`harness.agents.endpoint`).
        down_after, down_failures: the server counts as down, and its requests fail at once
            with :class:`~harness.errors.EndpointDown` (a run stops on it), once
            ``down_failures`` requests in a row (of every trial of the process) have failed
            with no answer between and it has answered nothing for ``down_after`` seconds
            (5 s by default; the rule is :mod:`harness.agents.endpoint`'s).

    Configuration is what is passed in: environment variables (``http_proxy``,
    ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``, ``OPENAI_ORG_ID``, ``OPENAI_PROJECT_ID``) are not
    read.
    """

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_turns: int = 30,
        timeout: float = 120.0,
        system_prompt: str | None = None,
        max_tokens: int | None = None,
        attempts: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        proxy: str | None = None,
        parallel_tool_calls: bool = True,
        sleep: Callable[[float], None] = time.sleep,
        user: str | User | None = None,
        user_model: str | None = None,
        user_base_url: str | None = None,
        user_api_key: str | None = None,
        user_temperature: float = 0.0,
        user_replies: list[str] | None = None,
        max_steps: int = DEFAULT_MAX_STEPS,
        max_errors: int = DEFAULT_MAX_ERRORS,
        max_in_flight: int | None = None,
        down_after: float = DOWN_AFTER,
        down_failures: int = DOWN_FAILURES,
        retry_for: float | None = DEFAULT_RETRY_FOR,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_tool_argument_bytes: int = DEFAULT_MAX_TOOL_ARGUMENT_BYTES,
        simulation_errors: Literal["tau2", "fail"] = "tau2",
    ) -> None:
        if max_turns < 1:
            raise ConfigurationError("OpenAIAgent: max_turns and attempts must be >= 1")
        self._init_endpoint(
            base_url=base_url,
            model=model,
            api_key=api_key,
            timeout=timeout,
            attempts=attempts,
            backoff=backoff,
            max_backoff=max_backoff,
            proxy=proxy,
            sleep=sleep,
            max_in_flight=max_in_flight,
            down_after=down_after,
            down_failures=down_failures,
            retry_for=retry_for,
            request_timeout=request_timeout,
            max_response_bytes=max_response_bytes,
        )
        if max_tool_argument_bytes < 1:
            raise ConfigurationError(
                f"OpenAIAgent(max_tool_argument_bytes={max_tool_argument_bytes}): give at "
                "least 1 byte"
            )
        self.max_tool_argument_bytes = max_tool_argument_bytes
        self.temperature = temperature
        self.max_turns = max_turns
        self._custom_prompt = system_prompt is not None
        self.system_prompt = DEFAULT_SYSTEM_PROMPT if system_prompt is None else system_prompt
        self.max_tokens = max_tokens
        self.parallel_tool_calls = parallel_tool_calls
        if max_steps < 1 or max_errors < 1:
            raise ConfigurationError(
                f"OpenAIAgent(max_steps={max_steps}, max_errors={max_errors}): both must be >= 1"
            )
        self.max_steps = max_steps
        self.max_errors = max_errors
        if simulation_errors not in ("tau2", "fail"):
            raise ConfigurationError(
                f"OpenAIAgent(simulation_errors={simulation_errors!r}): give 'tau2' (a "
                "conversation tau2 would fail is run again, then an infrastructure error) or "
                "'fail' (the trial fails as the agent's)"
            )
        self.simulation_errors = simulation_errors
        self.user = self._build_user(
            user,
            user_model=user_model,
            user_base_url=user_base_url,
            user_api_key=user_api_key,
            user_temperature=user_temperature,
            user_replies=user_replies,
        )

    def config(self) -> dict[str, Any]:
        """The agent's configuration for the evidence record (the key itself is left out)."""
        config: dict[str, Any] = {
            "agent": self.name,
            "base_url": self.base_url,
            "model": self.model,
            "api_key": "set" if self.api_key else None,
            "temperature": self.temperature,
            "max_turns": self.max_turns,
            "system_prompt": self.system_prompt,
            "max_tokens": self.max_tokens,
            **self._transport_config(),
            "max_tool_argument_bytes": self.max_tool_argument_bytes,
            "parallel_tool_calls": self.parallel_tool_calls,
            "max_in_flight": self.max_in_flight,
            "down_after": self.down_after,
            "down_failures": self.down_failures,
        }
        if self.user is not None:  # a run without a user records what it always did
            config["system_prompt"] = self._conversation_prompt_template()
            config["user"] = self.user.config()
            config["max_steps"] = self.max_steps
            config["max_errors"] = self.max_errors
            config["simulation_errors"] = self.simulation_errors
        return config

    # --- the loop ---
    def run(self, task: Task, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        """Converse with the model until it answers without a tool call, or ``max_turns``;
        with a user, run tau2-bench's conversation until it ends (module docstring).

        Raises:
            ModelServerError: the server kept failing (an infrastructure error); its
                ``agent_meta`` is the trial's metadata so far, the failed call included.
            EndpointDown: the server's circuit is open (``agent_meta`` as above).
            ModelRequestError: the server refused a request (4xx; ``agent_meta`` as above).
            Escalated: a tool call was escalated to a person (from :meth:`Toolbox.call`); the
                other calls of the same reply have finished by then.
        """
        client = self._client()
        meta: dict[str, Any] = {}  # filled by the loop as it goes, for an error to carry
        try:
            if self.user is not None:
                out = self._converse_with_user(client, task, toolbox, seed, self.user, meta)
            else:
                out = self._converse(client, task, toolbox, seed, meta)
        except ModelServerError as exc:
            meta.update(
                model_call_count=len(meta.get("model_calls", ())),
                stop_reason="model_server_error",
            )
            exc.agent_meta = _with_seconds(meta)
            raise
        _with_seconds(out.meta)
        return out

    def _converse(
        self, client: Any, task: Task, toolbox: Toolbox, seed: int, meta: dict[str, Any]
    ) -> AgentOutput:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": self._system_prompt(toolbox)},
            {"role": "user", "content": task.instruction},
        ]
        calls: list[dict[str, Any]] = []
        usage: dict[str, int] = {}
        meta.update(_loop_meta(calls, usage, stop_reason="max_turns"))
        content = ""
        for turn in range(self.max_turns):
            message, _ = self._agent_turn(client, toolbox, messages, seed, calls, usage)
            meta["model_call_count"] = len(calls)
            content = message.get("content") or ""
            if not isinstance(content, str):  # some servers send a list of content parts
                content = json.dumps(content)
            tool_calls = _normalized_calls(message.get("tool_calls"), turn)
            if not tool_calls:
                meta["stop_reason"] = "answered"
                return AgentOutput(message=content, claimed_success=True, meta=meta)
            messages.append(
                {"role": "assistant", "content": message.get("content"), "tool_calls": tool_calls}
            )
            results = self._call_tools(tool_calls, toolbox, meta)
            for call, result in zip(tool_calls, results, strict=True):
                messages.append(
                    {"role": "tool", "tool_call_id": call["id"], "content": _as_text(result)}
                )
        meta["stop_reason"] = "max_turns"
        return AgentOutput(message=content, claimed_success=False, meta=meta)

    # --- the conversation with a user (tau2's loop) ---
    def _build_user(
        self,
        user: str | User | None,
        *,
        user_model: str | None,
        user_base_url: str | None,
        user_api_key: str | None,
        user_temperature: float,
        user_replies: list[str] | None,
    ) -> User | None:
        """The user: the one given, or one built by name from the ``user_*`` options."""
        if user is None:
            given = [
                n
                for n, v in (
                    ("user_model", user_model),
                    ("user_base_url", user_base_url),
                    ("user_replies", user_replies),
                )
                if v is not None
            ]
            if given:
                raise ConfigurationError(
                    f"OpenAIAgent: {', '.join(given)} given without user=...; name the user "
                    f"({', '.join(user_registry.names())})"
                )
            return None
        if not isinstance(user, str):
            if not isinstance(user, User):
                raise ConfigurationError(
                    f"OpenAIAgent(user={user!r}): give a user's name "
                    f"({', '.join(user_registry.names())}) or an object with name, config() "
                    "and respond()"
                )
            return user
        options: dict[str, Any] = {}
        if user == "openai":
            base_url = user_base_url or self.base_url
            options = {
                "base_url": base_url,
                "model": user_model or self.model,
                # The agent's key goes to the agent's server only.
                "api_key": user_api_key
                or (self.api_key if base_url.rstrip("/") == self.base_url else None),
                "temperature": user_temperature,
                **self._transport_config(),
                "sleep": self._sleep,
                "max_in_flight": self.max_in_flight,
                "down_after": self.down_after,
                "down_failures": self.down_failures,
            }
        elif user == "scripted":
            options = {} if user_replies is None else {"replies": user_replies}
        return user_registry.create(user, **options)

    def _conversation_prompt_template(self) -> str:
        """The system prompt of a conversation, with ``{domain_policy}`` for the policy."""
        if self._custom_prompt:
            return self.system_prompt
        return TAU2_SYSTEM_PROMPT.replace("{agent_instruction}", TAU2_AGENT_INSTRUCTION)

    def _conversation_system_prompt(self, toolbox: Toolbox) -> str:
        """tau2's agent system prompt with the environment's policy (or, when ``system_prompt``
        was given, that prompt with the policy appended, as without a user)."""
        if self._custom_prompt:
            return self._system_prompt(toolbox)
        policy = getattr(toolbox.environment, "policy", None)
        return TAU2_SYSTEM_PROMPT.format(
            agent_instruction=TAU2_AGENT_INSTRUCTION,
            domain_policy=policy if isinstance(policy, str) else "",
        )

    def _converse_with_user(
        self,
        client: Any,
        task: Task,
        toolbox: Toolbox,
        seed: int,
        user: User,
        meta: dict[str, Any],
    ) -> AgentOutput:
        """tau2's half-duplex loop (``Orchestrator.step`` and ``_check_termination``)."""
        greeting: dict[str, Any] = {
            "role": "assistant",
            "content": GREETING,
            "tool_calls": None,
            "turn_idx": 0,
            "timestamp": _now(),
            "cost": 0.0,
            "usage": None,
        }
        trajectory: list[dict[str, Any]] = [greeting]
        history: list[dict[str, Any]] = [
            {"role": "system", "content": self._conversation_system_prompt(toolbox)},
            {"role": "assistant", "content": GREETING},
        ]
        calls: list[dict[str, Any]] = []
        user_calls: list[dict[str, Any]] = []
        usage: dict[str, int] = {}
        user_usage: dict[str, int] = {}
        meta.update(
            {
                **_loop_meta(calls, usage, stop_reason=None),
                "messages": trajectory,
                "termination_reason": None,
                "max_steps": self.max_steps,
                "max_errors": self.max_errors,
                "user": user.config(),
                "user_calls": user_calls,
                "user_usage": user_usage,
                "steps": 0,
                "num_errors": 0,
                "transferred": False,
                "stop_token": None,
            }
        )
        # pending: the tool calls of the last message, made by ``caller`` (agent or user)
        to_role, pending, caller = "user", [], "assistant"
        user_tools = {"tools": toolbox.user_specs} if toolbox.user_tools else {}
        if user_tools:
            meta["user_tool_calls"] = 0
        steps = errors = 0
        reason: str | None = None
        while reason is None:
            if to_role == "user":
                asked = time.perf_counter()
                try:
                    turn = user.respond(
                        task, list(trajectory), session=toolbox.episode, seed=seed, **user_tools
                    )
                except ModelServerError as exc:
                    user_calls.append(_failed_call(exc, None, time.perf_counter() - asked))
                    raise
                if not isinstance(turn, UserTurn):
                    raise ConfigurationError(
                        f"user {user.name!r}: respond() must return a UserTurn, got "
                        f"{type(turn).__name__}"
                    )
                pending = _user_calls(user, turn.tool_calls)
                content = turn.content if isinstance(turn.content, str) else ""
                trajectory.append(
                    {
                        "role": "user",
                        "content": turn.content if pending else content,
                        "tool_calls": [
                            {k: c[k] for k in ("id", "name", "arguments", "requestor")}
                            for c in pending
                        ]
                        or None,
                        "turn_idx": len(trajectory),
                        "timestamp": _now(),
                        "cost": turn.cost,
                        "usage": turn.usage,
                    }
                )
                user_calls.append(dict(turn.meta))
                _add_usage(user_usage, turn.usage)
                if pending:  # to the user's tools; the agent never sees this message
                    to_role, caller = "env", "user"
                else:
                    history.append({"role": "user", "content": content})
                    if not content.strip():
                        reason = "user_error"
                    elif is_stop(content):
                        reason = "user_stop"
                        meta["stop_token"] = next(t for t in STOP_TOKENS if t in content)
                    to_role = "agent"
            elif to_role == "agent":
                message, response = self._agent_turn(client, toolbox, history, seed, calls, usage)
                said = message.get("content")
                text = said if isinstance(said, str) else None
                pending = _normalized_calls(message.get("tool_calls"), len(calls) - 1)
                trajectory.append(
                    {
                        "role": "assistant",
                        "content": text,
                        "tool_calls": [_tau2_call(c, self.max_tool_argument_bytes) for c in pending]
                        or None,
                        "turn_idx": len(trajectory),
                        "timestamp": _now(),
                        "cost": _cost(response),
                        "usage": _usage(response),
                    }
                )
                entry: dict[str, Any] = {"role": "assistant", "content": text}
                if pending:
                    entry["tool_calls"] = pending
                history.append(entry)
                if pending:
                    to_role, caller = "env", "assistant"
                elif text is None or not text.strip():
                    reason = "agent_error"
                else:
                    to_role = "user"
            elif caller == "user":  # the user's calls run in order; results go to the user
                meta["user_tool_calls"] += len(pending)
                for call in pending:
                    if call.get("error") is not None:
                        meta["malformed_tool_calls"] += 1
                        result = toolbox.refuse(call["name"], call["error"], requestor="user")
                    else:
                        result = toolbox.call(call["name"], call["arguments"], requestor="user")
                    errors += not result.ok
                    trajectory.append(
                        {
                            "id": call["id"],
                            "role": "tool",
                            "content": _as_text(result),
                            "requestor": "user",
                            "error": not result.ok,
                            "turn_idx": len(trajectory),
                            "timestamp": _now(),
                        }
                    )
                to_role = "user"
            else:
                results = self._call_tools(pending, toolbox, meta)
                for call, result in zip(pending, results, strict=True):
                    text = _as_text(result)
                    errors += not result.ok
                    if result.ok and call["function"].get("name") == TRANSFER_TOOL:
                        meta["transferred"] = True
                    trajectory.append(
                        {
                            "id": call["id"],
                            "role": "tool",
                            "content": text,
                            "requestor": "assistant",
                            "error": not result.ok,
                            "turn_idx": len(trajectory),
                            "timestamp": _now(),
                        }
                    )
                    history.append({"role": "tool", "tool_call_id": call["id"], "content": text})
                to_role = "agent"
            steps += 1
            if to_role != "env":
                if steps >= self.max_steps:
                    reason = "max_steps"
                if errors >= self.max_errors:
                    reason = "too_many_errors"
        meta.update(
            model_call_count=len(calls),
            steps=steps,
            num_errors=errors,
            termination_reason=reason,
            stop_reason=reason,
        )
        failed = _simulation_error(reason, meta)
        if failed is not None and self.simulation_errors == "tau2":
            error = SimulationFailed(
                f"tau2 fails this simulation ({failed}): it runs the conversation again, up to "
                "4 attempts, then records an infrastructure error its metrics exclude "
                "(agent option simulation_errors='fail' counts it as the agent's failure)",
                url=self.base_url,
            )
            error.agent_meta = meta
            raise error
        said = [
            m["content"]
            for m in trajectory[1:]
            if m["role"] == "assistant" and isinstance(m["content"], str) and m["content"].strip()
        ]
        return AgentOutput(
            message="\n".join(said),
            claimed_success=reason in ("user_stop", "agent_stop"),
            meta=meta,
        )

    def _agent_turn(
        self,
        client: Any,
        toolbox: Toolbox,
        history: list[dict[str, Any]],
        seed: int,
        calls: list[dict[str, Any]],
        usage: dict[str, int],
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """One model call of the agent, recorded as without a user: its message and response."""
        body = self._request_body(history, toolbox.specs, seed)
        request_digest, payload = self._encoded(body, toolbox)
        started = time.perf_counter()
        try:
            response, attempts = self._recorded_complete(
                client, toolbox, request_digest, body, payload
            )
        except ModelServerError as exc:
            calls.append(_failed_call(exc, request_digest, time.perf_counter() - started))
            raise
        seconds = time.perf_counter() - started
        message, finish_reason = self._message(response)
        calls.append(
            {
                "request_digest": request_digest,
                "response": {
                    "id": response.get("id"),
                    "model": response.get("model"),
                    "message": message,
                    "finish_reason": finish_reason,
                    "usage": response.get("usage"),
                },
                "attempts": attempts,
                "seconds": round(seconds, 6),
            }
        )
        _add_usage(usage, response.get("usage"))
        return message, response

    def _system_prompt(self, toolbox: Toolbox) -> str:
        policy = getattr(toolbox.environment, "policy", None)
        if isinstance(policy, str) and policy.strip():
            return f"{self.system_prompt}\n\n# Policy\n\n{policy.strip()}"
        return self.system_prompt

    def _request_body(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "seed": seed,
        }
        if tools:  # some servers reject an empty tools list or tool_choice without tools
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    # --- tools ---
    def _call_tools(
        self, tool_calls: list[dict[str, Any]], toolbox: Toolbox, meta: dict[str, Any]
    ) -> list[ToolResult]:
        """Run one reply's tool calls; their results in the order of the calls.

        Several well-formed calls run at once, in :class:`~harness.action.ContextExecutor`
        threads that carry the episode; each write is its own transaction, attributed its own
        changes. What the episode records (transactions, remembered reads) is recorded in the
        order of the calls (:class:`_Turnstile`), so a resumed episode matches its record. When
        a call raises (an escalation), the calls after it record nothing, as if they had been
        made one after another, and the first error in the order of the calls is raised once
        every call has finished.
        """
        meta["tool_calls"] += len(tool_calls)
        refused: dict[int, ToolResult] = {}
        jobs: dict[int, tuple[str, dict[str, Any]]] = {}
        for i, call in enumerate(tool_calls):
            prepared = self._prepare(call, meta)
            if isinstance(prepared, ToolResult):
                refused[i] = prepared
            else:
                jobs[i] = prepared
        outcomes: dict[int, ToolResult | BaseException] = dict(refused)
        if self.parallel_tool_calls and len(jobs) > 1:
            meta["parallel_turns"] += 1
            turnstile = _Turnstile(len(jobs))
            with ContextExecutor(
                max_workers=min(len(jobs), 8), thread_name_prefix="openai-tool"
            ) as pool:
                futures = {
                    i: pool.submit(_call_in_order, toolbox, turnstile, position, *job)
                    for position, (i, job) in enumerate(jobs.items())
                }
                for i, future in futures.items():
                    error = future.exception()
                    outcomes[i] = error if error is not None else future.result()
        else:
            for i, (name, arguments) in jobs.items():
                outcomes[i] = toolbox.call(name, arguments)
        results: list[ToolResult] = []
        for i in range(len(tool_calls)):
            outcome = outcomes[i]
            if isinstance(outcome, BaseException):
                raise outcome  # the first in the order of the calls: never a _NotRun
            results.append(outcome)
        return results

    def _prepare(
        self, call: dict[str, Any], meta: dict[str, Any]
    ) -> tuple[str, dict[str, Any]] | ToolResult:
        """A call's tool name and arguments, or the result telling the model it was malformed
        (its arguments longer than ``max_tool_argument_bytes`` included: the model wrote them,
        and may write shorter ones)."""
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        name = function.get("name")
        if not isinstance(name, str) or not name:
            meta["malformed_tool_calls"] += 1
            return ToolResult(False, error="tool call without a function name", kind="invalid")
        arguments, problem = parse_arguments(
            function.get("arguments"), max_bytes=self.max_tool_argument_bytes
        )
        if arguments is None:
            meta["malformed_tool_calls"] += 1
            return ToolResult(False, error=f"tool {name!r} not called: {problem}", kind="invalid")
        return name, arguments

    # --- the model ---
    def _recorded_complete(
        self,
        client: Any,
        toolbox: Toolbox,
        request_digest: str,
        body: dict[str, Any],
        payload: bytes | None = None,
    ) -> tuple[dict[str, Any], int]:
        """The completion for ``body``, from the episode's record when it has it.

        The response (the server's JSON, as it sent it) is remembered by the episode under the
        request's digest, so an episode resumed (or replayed) gets the model's recorded answers
        and follows the same path without asking the server again.
        """
        response, attempts = toolbox.episode.remember(
            "model_call", request_digest, lambda: list(self._complete(client, body, payload))
        )
        return dict(response), int(attempts)


class SimulationFailed(ModelServerError):
    """A conversation tau2-bench's own runner would have failed with an exception (a message
    with no text and no tool call, tool-call arguments that do not parse): an infrastructure
    error of this attempt, which the run tries again at once (tau2: up to 4 attempts)."""

    retry_at_once = True


def _simulation_error(reason: str | None, meta: Mapping[str, Any]) -> str | None:
    """Why tau2 would have failed this conversation (None: it would not have)."""
    if reason == "agent_error":
        return "the agent's message had no text and no tool call"
    if reason == "user_error":
        return "the user's message had no text"
    if meta.get("malformed_tool_calls"):
        return f"{meta['malformed_tool_calls']} tool call(s) whose arguments do not parse"
    return None


class _ChatRole(_ChatEndpoint):
    """A model on an OpenAI-compatible server playing a part beside the agent (the user, the
    judge): its model, server and sampling settings, and its answers remembered by the trial's
    episode under each request's digest, so a resumed or replayed trial never asks again.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name the server knows.
        api_key: sent as a bearer token when given.
        temperature: sampling temperature (tau2's 0.0).
        max_tokens: a cap on each completion, when given.
        timeout, request_timeout, attempts, retry_for, backoff, max_backoff,
            max_response_bytes, proxy, sleep, max_in_flight, down_after, down_failures: as
            for :class:`OpenAIAgent`.
    """

    name = "openai"

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.0,
        max_tokens: int | None = None,
        timeout: float = 120.0,
        attempts: int = 4,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        proxy: str | None = None,
        sleep: Callable[[float], None] = time.sleep,
        max_in_flight: int | None = None,
        down_after: float = DOWN_AFTER,
        down_failures: int = DOWN_FAILURES,
        retry_for: float | None = DEFAULT_RETRY_FOR,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self._init_endpoint(
            base_url=base_url,
            model=model,
            api_key=api_key,
            timeout=timeout,
            attempts=attempts,
            backoff=backoff,
            max_backoff=max_backoff,
            proxy=proxy,
            sleep=sleep,
            max_in_flight=max_in_flight,
            down_after=down_after,
            down_failures=down_failures,
            retry_for=retry_for,
            request_timeout=request_timeout,
            max_response_bytes=max_response_bytes,
        )
        self.temperature = temperature
        self.max_tokens = max_tokens

    def _role_config(self, **more: Any) -> dict[str, Any]:
        """The part's model, server and settings (``more`` after its sampling arguments; the
        key itself is left out)."""
        return {
            "implementation": self.name,
            "llm": self.model,
            "llm_args": {"temperature": self.temperature},
            **more,
            "base_url": self.base_url,
            "api_key": "set" if self.api_key else None,
            "max_tokens": self.max_tokens,
            **self._transport_config(),
        }

    def _body(self, messages: list[dict[str, Any]], seed: int) -> dict[str, Any]:
        """A chat-completions request of ``messages`` at the part's settings and ``seed``."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "seed": seed,
        }
        if self.max_tokens is not None:
            body["max_tokens"] = self.max_tokens
        return body

    def _ask(
        self, session: Session, what: str, body: dict[str, Any]
    ) -> tuple[dict[str, Any], int, float, str]:
        """The server's answer to ``body``, remembered by ``session`` as ``what`` under the
        request's digest (a resumed call does not ask again): the response, the attempts it
        took, the seconds this call took and the digest."""
        request_digest, payload = self._encoded(body, None)
        started = time.perf_counter()
        response, attempts = session.remember(
            what, request_digest, lambda: list(self._complete_once(body, payload))
        )
        return dict(response), int(attempts), time.perf_counter() - started, request_digest

    def _complete_once(
        self, body: dict[str, Any], payload: bytes | None = None
    ) -> tuple[dict[str, Any], int]:
        """Ask the server (a resumed call does not)."""
        return self._complete(self._client(), body, payload)


class OpenAIUser(_ChatRole):
    """A model on an OpenAI-compatible server playing the user, prompted as tau2-bench prompts
    its user simulator (:mod:`harness.agents.user`).

    Its system prompt is tau2's guidelines with the task's user scenario
    (:func:`~harness.agents.user.user_system_prompt`); it reads the conversation as tau2's user
    does (:func:`~harness.agents.user.user_view`: its own messages as ``assistant``, the
    agent's text messages as ``user``, no tools), at ``temperature`` with the trial's seed.
    Each answer is remembered by the trial's episode under the request's digest
    (``user_model_call``), so a resumed or replayed trial gets the user's recorded answers and
    does not ask the server again.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8000/v1``.
        model: the model name the server knows.
        api_key: sent as a bearer token when given.
        temperature: sampling temperature (tau2's default 0.0).
        guidelines: the global simulation guidelines (default tau2's,
            :data:`~harness.agents.user.SIMULATION_GUIDELINES`).
        max_tokens: a cap on each completion, when given.
        timeout, request_timeout, attempts, retry_for, backoff, max_backoff,
            max_response_bytes, proxy, sleep, max_in_flight, down_after, down_failures: as
            for :class:`OpenAIAgent`.
    """

    def __init__(self, *, guidelines: str | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.guidelines = SIMULATION_GUIDELINES if guidelines is None else guidelines
        self.tools_guidelines = SIMULATION_GUIDELINES_TOOLS if guidelines is None else guidelines

    def config(self) -> dict[str, Any]:
        """tau2's ``UserInfo`` (implementation, llm, llm_args, global_simulation_guidelines)
        with the server's URL and the requests' settings (the key itself is left out)."""
        return self._role_config(global_simulation_guidelines=self.guidelines)

    def request_body(
        self,
        task: Task,
        messages: Sequence[Mapping[str, Any]],
        seed: int,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> dict[str, Any]:
        """The chat-completions request for the user's next message (with the user's
        ``tools`` offered, and tau2's guidelines for users with tools, when it has any)."""
        guidelines = self.tools_guidelines if tools else self.guidelines
        body = self._body(
            [
                {"role": "system", "content": user_system_prompt(task, guidelines)},
                *user_view(messages),
            ],
            seed,
        )
        if tools:
            # (after the sampling settings, before max_tokens: the order requests were recorded in)
            capped = body.pop("max_tokens", None)
            body["tools"] = [dict(t) for t in tools]
            body["tool_choice"] = "auto"
            if capped is not None:
                body["max_tokens"] = capped
        return body

    def respond(
        self,
        task: Task,
        messages: Sequence[Mapping[str, Any]],
        *,
        session: Session,
        seed: int,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> UserTurn:
        """The model's next message as the user, from the episode's record when it has it;
        with ``tools`` (the user's tool definitions) the model may call them instead, each
        call given back in tau2's shape with ``requestor="user"``.

        Raises:
            ModelServerError: the server kept failing (an infrastructure error).
            ModelRequestError: the server refused the request (4xx).
        """
        body = self.request_body(task, messages, seed, tools)
        response, attempts, seconds, request_digest = self._ask(session, "user_model_call", body)
        message, finish_reason = self._message(response)
        content = message.get("content")
        calls = []
        for i, call in enumerate(_normalized_calls(message.get("tool_calls"), len(messages))):
            function = call.get("function") or {}
            arguments, problem = parse_arguments(function.get("arguments"))
            calls.append(
                {
                    "id": call.get("id") or f"user_call_{i}",
                    "name": function.get("name") or "",
                    "arguments": arguments,
                    **({"error": problem} if arguments is None else {}),
                }
            )
        return UserTurn(
            content=content if isinstance(content, str) else ("" if not calls else None),
            tool_calls=calls or None,
            usage=_usage(response),
            cost=_cost(response),
            meta={
                "request_digest": request_digest,
                "response": {
                    "id": response.get("id"),
                    "model": response.get("model"),
                    "finish_reason": finish_reason,
                    "usage": response.get("usage"),
                },
                "attempts": attempts,
                "seconds": round(seconds, 6),
            },
        )


registry.register("openai", OpenAIAgent)
user_registry.register("openai", OpenAIUser)

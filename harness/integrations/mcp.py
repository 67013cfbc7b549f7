"""Actions served as MCP tools: one episode per MCP session (``[mcp]`` extra).

:func:`build_server` makes an :class:`mcp.server.mcpserver.MCPServer` whose tools are the
given actions; :func:`serve` runs it over stdio or Streamable HTTP (``harness mcp serve``).

- Every MCP session (a stdio connection, an HTTP ``Mcp-Session-Id``) gets its own
  :class:`~harness.episode.Episode`, opened at its first tool call and ended when the session
  ends; every ``tools/call`` is one transaction in it. Calls made at once in one session run
  one at a time (the episode's gate), each attributed its own changes.
- A refusal (invalid arguments, a failed precondition, a rejection, a failed action, a
  rollback) is a tool result with ``isError`` true and the refusal's text: the model reads it.
- An escalation is an error result naming the escalation id, the episode and how to resolve
  it. While it is pending, every later call in the session is refused with the same news;
  once a person resolved it (``harness escalations STORE resolve ID --approve``), the next
  call in the session resumes the episode, and the held call, made again with the same
  arguments, runs (approved) or is refused (rejected). A new session started with
  ``episode_id=`` (``--episode-id``) resumes that episode instead of starting a new one.
- After a rollback (or a failure that ends the episode) later calls are refused: the episode
  is over; the client opens a new session to start again.
- Over stdio, a line that is no JSON-RPC message (not JSON, nested deeper than
  :data:`READ_DEPTH_LIMIT`, not a message's shape) is answered with a JSON-RPC error saying
  why (for the request's id when the line shows one), where the SDK would answer nothing; and
  a call whose arguments are larger than :data:`MAX_ARGUMENT_BYTES` is refused before it runs.
  Neither is recorded, and the session goes on.

Each result's ``_meta`` carries ``harness/episode`` (the episode id). A call whose own
``_meta`` names ``harness/episode`` runs in that episode instead of its session's (calls naming
the same id share it; an escalated one is resumed): how a client of the sessionless 2026-07-28
protocol, where every request is a connection of its own, keeps its calls in one episode.
Requests of that protocol that name none share the server's one episode (over stdio, the
process serves one client).
"""

from __future__ import annotations

import asyncio
import contextvars
import importlib
import json
import os
import re
import sys
import uuid
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp.server.mcpserver import Context as MCPContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE
from mcp.shared.message import SessionMessage
from mcp_types import (
    INVALID_REQUEST,
    PARSE_ERROR,
    CallToolResult,
    ErrorData,
    JSONRPCError,
    TextContent,
    ToolAnnotations,
)
from mcp_types import Tool as MCPTool
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import ValidationError

from ..action import CURRENT_EPISODE, Action
from ..episode import Episode
from ..errors import ConfigurationError, EpisodeClosed, Escalated, HarnessError
from ..policy import Policy
from ..store import EpisodeStatus, EscalationStatus, Store
from ._calls import acall

__all__ = [
    "MAX_ARGUMENT_BYTES",
    "META_EPISODE",
    "READ_DEPTH_LIMIT",
    "ServedActions",
    "build_server",
    "describe",
    "load_served",
    "run",
    "serve",
]

META_EPISODE = "harness/episode"
"""The key of a tool result's ``_meta`` that names the session's episode."""

Transport = Literal["stdio", "http"]

MAX_ARGUMENT_BYTES = DEFAULT_MAX_REQUEST_BODY_SIZE
"""The most bytes a call's arguments take as JSON (4 MiB): what the SDK's HTTP transport takes
of a whole request, so that a call over stdio, which reads lines of any length, is bounded as
one over HTTP is. A larger call is refused before it runs, and nothing is recorded."""


@dataclass(frozen=True)
class ServedActions:
    """What ``harness mcp serve module:attribute`` found: the actions and the state they change.

    Attributes:
        actions: the actions, by tool name.
        state: the state adapter the session episodes run against.
        policy: the episodes' policy (None: the default).
    """

    actions: dict[str, Action[..., Any]]
    state: Any
    policy: Policy | None = None


def _actions_by_name(actions: Any, where: str) -> dict[str, Action[..., Any]]:
    """``actions`` (one action, a list of them, or a mapping of tool name to action) by tool
    name."""
    items: Iterable[tuple[str | None, Any]]
    if isinstance(actions, Action):
        items = [(None, actions)]
    elif isinstance(actions, Mapping):
        items = actions.items()
    elif isinstance(actions, list | tuple):
        items = [(None, a) for a in actions]
    else:
        raise ConfigurationError(
            f"{where} is a {type(actions).__name__}; give a list of @hx.action functions, a "
            "dict of tool name to action, or a function returning one (or (state, actions))"
        )
    out: dict[str, Action[..., Any]] = {}
    for name, act in items:
        if not isinstance(act, Action):
            raise ConfigurationError(
                f"{where} holds {act!r}, which is not an @hx.action; decorate it with "
                "@hx.action(...) so each call runs as a transaction"
            )
        tool = name or act.name
        if tool in out:
            raise ConfigurationError(
                f"{where} has two tools named {tool!r}; give one another name with "
                "@hx.action(name=...)"
            )
        out[tool] = act
    if not out:
        raise ConfigurationError(f"{where} holds no actions; give at least one @hx.action")
    return out


def _import(spec: str, what: str) -> Any:
    """The object ``module:attribute`` (or ``path/to/file.py:attribute``) names.

    The current directory comes first on ``sys.path`` (as ``python -m`` puts it), so a module
    beside the caller is found.
    """
    module_name, sep, attribute = spec.rpartition(":")
    if not sep or not module_name or not attribute:
        raise ConfigurationError(
            f"{what} {spec!r} is not module:attribute; name it like myapp.tools:actions "
            "or path/to/tools.py:actions"
        )
    try:
        if module_name.endswith(".py"):
            path = Path(module_name).resolve()
            if not path.is_file():
                raise ConfigurationError(f"{what} {spec!r}: no file {path}")
            if str(path.parent) not in sys.path:
                sys.path.insert(0, str(path.parent))
            module = importlib.import_module(path.stem)
        else:
            if os.getcwd() not in sys.path:
                sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"{what} {spec!r}: cannot import {module_name!r} ({exc}); run from the folder "
            "that holds it or install it"
        ) from exc
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise ConfigurationError(
            f"{what} {spec!r}: module {module_name!r} has no attribute {attribute!r}"
        ) from None


def load_served(spec: str, *, state: str | None = None) -> ServedActions:
    """What ``module:attribute`` names, made ready to serve.

    The attribute is a list (or dict) of actions, or a function called once with no arguments
    that returns one, or ``(state, actions)``. The state adapter is, in this order: the one
    the function returned, the object ``state`` names (``module:attribute``), or the
    attribute ``state`` of the actions' module. The module's ``policy`` (an ``hx.Policy``), if
    it has one, is the episodes' policy.

    Args:
        spec: ``module:attribute`` or ``path/to/file.py:attribute``.
        state: ``module:attribute`` of the state adapter, when it is not the module's ``state``.

    Raises:
        ConfigurationError: what is named is missing or is not actions, or no state is found.
    """
    target = _import(spec, "actions")
    module = sys.modules.get(getattr(target, "__module__", "") or "")
    module_name = spec.rpartition(":")[0]
    if module_name.endswith(".py"):
        module = sys.modules.get(Path(module_name).stem, module)
    else:
        module = sys.modules.get(module_name, module)
    found_state: Any = None
    if callable(target) and not isinstance(target, Action | list | tuple | dict):
        try:
            made = target()
        except Exception as exc:
            raise ConfigurationError(
                f"actions {spec!r}: calling it raised {type(exc).__name__}: {exc}; a function "
                "named as TARGET is called with no arguments and returns the actions (or "
                "(state, actions))"
            ) from exc
        if isinstance(made, tuple) and len(made) == 2:
            found_state, target = made
        else:
            target = made
    actions = _actions_by_name(target, f"actions {spec!r}")
    if found_state is None and state is not None:
        found_state = _import(state, "state")
    if found_state is None:
        found_state = getattr(module, "state", None)
    if found_state is None:
        raise ConfigurationError(
            f"no state adapter for actions {spec!r}: give --state module:attribute, define "
            "`state = hx.DictState(...)` (or SQLState, FileState) in its module, or make "
            "the attribute a function returning (state, actions)"
        )
    policy = getattr(module, "policy", None)
    return ServedActions(actions, found_state, policy if isinstance(policy, Policy) else None)


def _text(text: str, episode_id: str | None, *, error: bool) -> CallToolResult:
    meta = {META_EPISODE: episode_id} if episode_id else None
    return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error, _meta=meta)


class _Session:
    """One MCP session's episode: opened at the first call, resumed after a resolution,
    ended with the session.

    The episode is entered and exited in a context of its own (the ``with`` protocol resets
    the context variable it set, which only works in the context that set it); each call
    makes the episode current in its own request's context.
    """

    def __init__(self, server: _ActionServer, episode_id: str | None) -> None:
        self.server = server
        self.episode_id = episode_id or uuid.uuid4().hex[:16]
        self.episode: Episode | None = None
        self.lock = asyncio.Lock()
        self.closed = False
        self._context = contextvars.Context()

    def _open(self, resume: bool) -> Episode:
        srv = self.server
        ep = Episode(
            state=srv.state,
            store=srv.store,
            policy=srv.policy,
            episode_id=self.episode_id,
            resume=resume,
            # An MCP client does not re-execute its earlier calls on resume (it is a remote
            # agent, not code run again): the episode runs live from here, its committed
            # work still recognised by idempotency key.
            follow_record=False,
            actions=srv.actions.values(),
            meta={"mcp": srv.name},
        )
        self._context.run(ep.__enter__)
        return ep

    async def _end(self) -> None:
        ep, self.episode = self.episode, None
        if ep is not None:
            await asyncio.get_running_loop().create_task(
                ep.__aexit__(None, None, None), context=self._context
            )

    async def episode_for_call(self) -> Episode | CallToolResult:
        """The episode the next call runs in, or the refusal the client is told instead."""
        async with self.lock:
            if self.closed:
                return _text("this MCP session has ended", self.episode_id, error=True)
            if self.episode is None:
                existing = self.server.store.episode(self.episode_id)
                if existing is not None and existing.status == EpisodeStatus.ESCALATED:
                    pending = self.server.pending(self.episode_id)
                    if pending is not None:
                        return pending
                    # Resolved: the episode resumes, and the held call may be made again.
                elif existing is not None and existing.status != EpisodeStatus.RUNNING:
                    return _text(
                        f"episode {self.episode_id} ended {existing.status} and takes no more "
                        "calls; open a new MCP session to start a new episode",
                        self.episode_id,
                        error=True,
                    )
                self.episode = self._open(resume=existing is not None)
            return self.episode

    async def escalated(self, ep: Episode) -> None:
        """End the episode a call escalated: it is paused for a person, whose decision is
        recorded while it is closed; the next call after the decision resumes it."""
        async with self.lock:
            if self.episode is ep:
                await self._end()

    async def close(self) -> None:
        """End the session's episode (committed, or escalated while a call is held)."""
        async with self.lock:
            self.closed = True
            await self._end()


class _ActionServer(MCPServer[Any]):
    """An MCP server whose tools are actions, each call a transaction in its session's episode."""

    def __init__(
        self,
        actions: Mapping[str, Action[..., Any]],
        *,
        state: Any,
        store: Store,
        policy: Policy | None,
        name: str,
        episode_id: str | None,
        instructions: str | None,
        schemas: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        self.actions = dict(actions)
        self.schemas = dict(schemas or {})
        self.state = state
        self.store = store
        self.policy = policy
        self._episode_id = episode_id
        self._sessions: dict[int, _Session] = {}
        self._detached: _Session | None = None
        self._named: dict[str, _Session] = {}
        super().__init__(name, instructions=instructions, lifespan=_close_sessions_at_exit)

    def pending(self, episode_id: str) -> CallToolResult | None:
        """The refusal for a call while the episode's escalation waits for a person."""
        for esc in self.store.escalations(EscalationStatus.PENDING, episode_id=episode_id):
            return _text(
                self.escalated_text(esc.id, esc.action, esc.reason, episode_id),
                episode_id,
                error=True,
            )
        return None

    def escalated_text(self, esc_id: str, action: str, reason: str, episode_id: str) -> str:
        """What the client is told about an escalation: which, why, and how it is resolved."""
        return (
            f"escalated: action {action!r} is held for a person ({reason}). Escalation "
            f"{esc_id} of episode {episode_id} must be resolved first: `harness escalations "
            f"{self.store.url} resolve {esc_id} --approve` (or --reject, --edit JSON) "
            f"--by NAME, or Store.resolve({esc_id!r}, ...). Until then every call in this "
            "session is refused; afterwards, make the held call again with the same "
            f"arguments (in this session, or in one started with --episode-id {episode_id})"
        )

    def _session(self, context: MCPContext[Any, Any] | None) -> _Session:
        named = _requested_episode(context)
        if named is not None:
            # The client names its episode: calls naming it share it, from any session.
            session = self._named.get(named)
            if session is None or session.closed:
                session = self._named[named] = _Session(self, named)
            return session
        connection = _connection_of(context)
        if connection is None:
            # No session: called directly, or a request of the sessionless (2026-07-28)
            # protocol, where every request is a connection of its own. Such calls share the
            # server's one episode (over stdio, the process serves one client).
            if self._detached is None:
                self._detached = _Session(self, self._next_episode_id())
            return self._detached
        session = connection.state.get("harness.session")
        if session is None:
            session = _Session(self, self._next_episode_id())
            connection.state["harness.session"] = session
            self._sessions[id(session)] = session
            connection.exit_stack.push_async_callback(self._forget, session)
        assert isinstance(session, _Session)
        return session

    async def _forget(self, session: _Session) -> None:
        self._sessions.pop(id(session), None)
        await session.close()

    def _next_episode_id(self) -> str | None:
        # The given id names the first session's episode (stdio has one session per process).
        episode_id, self._episode_id = self._episode_id, None
        return episode_id

    async def close_sessions(self) -> None:
        """End every session's episode (the server is stopping)."""
        sessions = [*self._sessions.values(), *self._named.values()]
        if self._detached is not None:
            sessions.append(self._detached)
        self._sessions.clear()
        self._named.clear()
        self._detached = None
        for session in sessions:
            await session.close()

    async def run_stdio_async(self) -> None:
        """Serve over stdin and stdout, answering every line that is no JSON-RPC message
        with an error that says why (:class:`_AnsweredReads`), instead of the SDK's silence."""
        # The SDK's own run_stdio_async, but for the read stream; it reaches the low-level
        # server by the same attribute (which the SDK plans to make public).
        lowlevel = self._lowlevel_server
        async with stdio_server() as (read_stream, write_stream):
            await lowlevel.run(
                _AnsweredReads(read_stream, write_stream),
                write_stream,
                lowlevel.create_initialization_options(),
            )

    async def list_tools(self) -> list[MCPTool]:
        """The actions as MCP tools (name, description, JSON Schema of the arguments)."""
        return [
            MCPTool(
                name=name,
                description=act.description,
                input_schema=self.schemas.get(name, act.schema),
                annotations=ToolAnnotations(read_only_hint=not act.mutating),
            )
            for name, act in self.actions.items()
        ]

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: MCPContext[Any, Any] | None = None
    ) -> CallToolResult:
        """Run one call of the action ``name`` as a transaction in the session's episode."""
        act = self.actions.get(name)
        if act is None:
            raise ToolError(f"unknown tool {name!r}; this server has {', '.join(self.actions)}")
        size = len(json.dumps(arguments, ensure_ascii=False, default=str).encode())
        if size > MAX_ARGUMENT_BYTES:
            raise ToolError(
                f"the arguments of {name!r} are {size:,} bytes of JSON, over the "
                f"{MAX_ARGUMENT_BYTES:,} this server takes in one call; send smaller arguments "
                "(a large content in parts, or a reference to it)"
            )
        session = self._session(context)
        ep = await session.episode_for_call()
        if isinstance(ep, CallToolResult):
            return ep
        token = CURRENT_EPISODE.set(ep)
        try:
            answer = await acall(act, arguments, episode=ep)
        except Escalated as exc:
            await session.escalated(ep)
            return _text(
                self.escalated_text(exc.escalation_id, exc.action, exc.reason, ep.id),
                ep.id,
                error=True,
            )
        except EpisodeClosed as exc:
            if ep.outcome == EpisodeStatus.ESCALATED:
                await session.escalated(ep)
            pending = self.pending(ep.id) if ep.outcome == EpisodeStatus.ESCALATED else None
            return pending or _text(
                f"{exc}; open a new MCP session to start a new episode", ep.id, error=True
            )
        except HarnessError as exc:
            # Not a refusal the model could adapt to (a configuration error, a divergence, a
            # store that cannot be written): still told as the call's result, not a crash.
            return _text(f"{type(exc).__name__}: {exc}", ep.id, error=True)
        finally:
            CURRENT_EPISODE.reset(token)
        if not answer.ok:
            return _text(answer.message, ep.id, error=True)
        result = _text(answer.text, ep.id, error=False)
        if isinstance(answer.value, dict):
            result.structured_content = answer.value
        return result


# A JSON string (escapes included) or a bracket: what the nesting of a JSON text is made of.
_NESTING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')

READ_DEPTH_LIMIT = 200
"""How deep the SDK's JSON reader (pydantic-core's) follows arrays and objects nested in each
other; a message nested deeper is answered with a parse error naming its depth."""


def _outline(line: str) -> tuple[int, Any]:
    """How deep ``line``'s JSON nests, and its top level with every value nested in it
    replaced by null (None when even that is not JSON): what a line too deep to parse still
    tells, such as the id of the request."""
    parts: list[str] = []
    depth = deepest = last = 0
    for token in _NESTING.finditer(line):
        char = token.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if depth == 2:
                parts.append(line[last : token.start()])
        elif char in "]}":
            if depth == 2:
                parts.append("null")
                last = token.end()
            depth -= 1
    parts.append(line[last:])
    try:
        return deepest, json.loads("".join(parts))
    except ValueError:
        return deepest, None


def _shape(message: Any) -> str | None:
    """Which JSON-RPC message ``message`` (a decoded JSON value) means to be, by its keys."""
    if not isinstance(message, dict):
        return None
    if "method" in message:
        return "JSONRPCRequest" if "id" in message else "JSONRPCNotification"
    return "JSONRPCError" if "error" in message else "JSONRPCResponse"


def _unreadable(exc: ValidationError) -> JSONRPCError:
    """The JSON-RPC error answering a line the SDK could not read as a message (``exc``):
    a parse error for one that is not JSON or nests too deeply, an invalid request for JSON
    that is not a JSON-RPC message; with the request's id when the line shows it."""
    errors: list[Any] = list(exc.errors(include_url=False))
    first: Any = errors[0] if errors else {"type": "", "loc": (), "msg": str(exc), "input": None}
    top: Any = None
    if first["type"] == "json_invalid" and isinstance(first["input"], str):
        depth, top = _outline(first["input"])
        why = str(first.get("ctx", {}).get("error") or first["msg"])
        if "recursion limit" in why:
            message = (
                f"Parse error: the message nests {depth} levels deep (arrays and objects "
                f"inside each other); this server reads at most {READ_DEPTH_LIMIT} levels: "
                "send the arguments less deeply nested"
            )
        else:
            message = f"Parse error: the line is not JSON ({why})"
        code = PARSE_ERROR
    else:
        # Valid JSON, but no JSON-RPC message: the error of a missing field (or of a value
        # that is no object at all) holds the whole message as its input.
        top = next(
            (
                e["input"]
                for e in errors
                if len(e["loc"]) == 1 or (e["type"] == "missing" and len(e["loc"]) == 2)
            ),
            None,
        )
        shape = _shape(top)
        err = next((e for e in errors if e["loc"][:1] == (shape,)), first)
        field = ".".join(str(part) for part in err["loc"][1:]) or "(top level)"
        message = (
            f"Invalid Request: not a JSON-RPC 2.0 message (field {field}: {err['msg']}); a "
            'request is {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {...}}'
        )
        code = INVALID_REQUEST
    # Only a request is answered by its id (a malformed response's id is one of the
    # server's own requests); otherwise null, as JSON-RPC says when the id cannot be told.
    request_id = top.get("id") if _shape(top) == "JSONRPCRequest" else None
    if isinstance(request_id, bool) or not isinstance(request_id, int | str):
        request_id = None
    return JSONRPCError(jsonrpc="2.0", id=request_id, error=ErrorData(code=code, message=message))


class _AnsweredReads:
    """The stdio transport's read stream, less the lines that are no JSON-RPC message.

    The SDK hands the server such a line as the exception its parser raised, and the server
    drops it without an answer: a client waiting for that request would wait for ever. Each
    is answered here on the write stream (:func:`_unreadable`), and the next line is read;
    everything else passes through as it came, with its sender's context.
    """

    def __init__(self, inner: Any, write_stream: Any) -> None:
        self._inner = inner
        self._write_stream = write_stream

    @property
    def last_context(self) -> contextvars.Context | None:
        """The context the last message was sent in (the SDK restores it for its handler)."""
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        """The next message (or an exception this stream does not answer)."""
        while True:
            item = await self._inner.receive()
            if not isinstance(item, ValidationError):
                return item
            # A client that has gone is not answered.
            with suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
                await self._write_stream.send(SessionMessage(_unreadable(item)))

    async def aclose(self) -> None:
        """Close the underlying stream."""
        await self._inner.aclose()

    def __aiter__(self) -> _AnsweredReads:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _AnsweredReads:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


def _requested_episode(context: MCPContext[Any, Any] | None) -> str | None:
    """The episode a request names in its ``_meta`` (``harness/episode``), if any."""
    if context is None:
        return None
    try:
        meta = context.request_context.meta
    except ValueError:  # a Context made outside a request
        return None
    named = meta.get(META_EPISODE) if isinstance(meta, Mapping) else None
    if named is None:
        return None
    if not isinstance(named, str) or not named.strip():
        raise ToolError(f"_meta {META_EPISODE!r} names an episode by a non-empty string")
    return named


def _connection_of(context: MCPContext[Any, Any] | None) -> Any:
    """The MCP connection a tool call came in on (None when called without one).

    The SDK hands the connection (with its per-connection ``state`` and the ``exit_stack``
    unwound when the connection ends) to low-level contexts only; a tool's context reaches it
    through its request's session.
    """
    if context is None:
        return None
    try:
        session = context.request_context.session
    except ValueError:  # a Context made outside a request
        return None
    connection = getattr(session, "_connection", None)
    if connection is None or not hasattr(connection, "exit_stack"):
        return None
    if getattr(connection, "protocol_version", None) in MODERN_PROTOCOL_VERSIONS:
        return None  # a single exchange: the connection ends with this request
    return connection


@asynccontextmanager
async def _close_sessions_at_exit(server: MCPServer[Any]) -> AsyncIterator[None]:
    try:
        yield None
    finally:
        if isinstance(server, _ActionServer):
            await server.close_sessions()


def build_server(
    actions: Iterable[Action[..., Any]] | Mapping[str, Action[..., Any]],
    *,
    state: Any,
    store: Store | str | None = None,
    policy: Policy | None = None,
    name: str = "harness",
    episode_id: str | None = None,
    instructions: str | None = None,
    schemas: Mapping[str, dict[str, Any]] | None = None,
) -> MCPServer[Any]:
    """An MCP server whose tools are ``actions``; every MCP session runs one episode.

    Args:
        actions: the actions (a list, or a mapping of tool name to action).
        state: the state adapter the episodes run against.
        store: where episodes are recorded (a :class:`Store` or URL; default
            ``sqlite:///logs/harness.db``).
        policy: the episodes' policy.
        name: the server's name, told to clients.
        episode_id: the id of the first session's episode; if that episode exists (escalated,
            or cut short), the session resumes it.
        instructions: what the server tells clients about itself.
        schemas: tool name -> the input schema to publish instead of the action's own (the
            proxy publishes the upstream tool's); the action still validates the arguments.

    Returns:
        The :class:`mcp.server.mcpserver.MCPServer` (``.run("stdio")``, or pass it to
        ``mcp.client.Client`` for an in-process client).

    Raises:
        ConfigurationError: ``actions`` holds something that is not an action, or nothing.
    """
    if isinstance(actions, Mapping):
        by_name = _actions_by_name(actions, "build_server(actions=...)")
    else:
        by_name = _actions_by_name(list(actions), "build_server(actions=...)")
    if not callable(getattr(state, "get", None)):
        raise ConfigurationError(
            "build_server(state=...) takes a state adapter (hx.DictState(mapping), "
            f"hx.SQLState(url), hx.FileState(folder)), not a {type(state).__name__}"
        )
    if not isinstance(store, Store):
        store = Store(store or "sqlite:///logs/harness.db", create=True)
    return _ActionServer(
        by_name,
        state=state,
        store=store,
        policy=policy,
        name=name,
        episode_id=episode_id,
        instructions=instructions,
        schemas=schemas,
    )


def serve(
    actions: Iterable[Action[..., Any]] | Mapping[str, Action[..., Any]],
    *,
    state: Any,
    store: Store | str | None = None,
    policy: Policy | None = None,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    name: str = "harness",
    episode_id: str | None = None,
) -> None:
    """Serve ``actions`` as MCP tools until the client (stdio) or the process (HTTP) stops.

    Args:
        actions, state, store, policy, name, episode_id: as for :func:`build_server`.
        transport: ``stdio`` (one session: the process's stdin and stdout) or ``http``
            (Streamable HTTP at ``http://HOST:PORT/mcp``, one episode per session).
        host: the HTTP interface to listen on.
        port: the HTTP port.
    """
    server = build_server(
        actions, state=state, store=store, policy=policy, name=name, episode_id=episode_id
    )
    run(server, transport=transport, host=host, port=port)


def run(server: MCPServer[Any], *, transport: Transport, host: str, port: int) -> None:
    """Run an MCP server on ``transport`` (``stdio`` or ``http``) until it stops."""
    if transport == "stdio":
        server.run("stdio")
    elif transport == "http":
        server.run("streamable-http", host=host, port=port)
    else:
        raise ConfigurationError(f"transport {transport!r} is not stdio or http")


def describe(result: CallToolResult) -> str:
    """A tool result's text, as a client shows it."""
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))

"""A transactional proxy in front of an MCP server (``harness mcp proxy config.toml``).

The proxy connects to an upstream MCP server as a client (a command it spawns over stdio, or
a Streamable HTTP URL), lists its tools and serves the ones its config describes as actions,
through the server :func:`harness.integrations.mcp.build_server` makes (one episode per
session). A small TOML file says, per tool, what the harness cannot learn from the upstream
server::

    [upstream]
    command = ["python", "bank_server.py", "bank.json"]   # or: url = "http://host:port/mcp"

    [proxy]
    store = "sqlite:///logs/harness.db"
    unlisted = "refuse"           # tools the config does not name: "refuse" or "escalate"
    decisions = { silent = "rollback" }                  # the episodes' policy

    [[state]]                     # how ctx.state.get(key) reads the upstream state
    pattern = "accounts/{account}"
    tool = "get_account"          # called with {"account": ...}; its result is the value

    [tools.get_account]           # no writes: a read, watched through [[state]]
    writes = []

    [tools.withdraw]
    writes = ["accounts/{account}"]
    preconditions = ["hooks:covered"]
    postconditions = ["hooks:dropped_by_amount"]
    compensation = "hooks:refund"
    idempotency_key = "hooks:withdraw_key"               # optional
    approval = false
    # observes = ["accounts/{account}"]  # more keys to read before and after (see below)

Hooks are ``module:function`` (the config's folder first on ``sys.path``) and receive the
harness ``ctx``. ``ctx.state`` is an :class:`UpstreamState`: ``ctx.state.get(key)`` reads a
resource through the configured read tool, and ``ctx.state.call(tool, arguments)`` calls any
upstream tool (a compensation calls the tool that undoes the effect, served or not).

What the proxy sees of a call is what it reads before and after it:

- a write tool (``writes``): its scope's keys, plus its ``observes``; a change to an observed
  key outside ``writes`` is a ``scope`` failure. Give concrete patterns
  (``accounts/{account}``): a glob cannot be read through a tool.
- a read-only tool (no ``writes``): its ``observes``, by default every ``[[state]]`` pattern
  whose fields its arguments fill (``get_account(account=...)`` reads
  ``accounts/{account}``). Any change found is a ``scope`` failure: it was declared a read,
  so the change has no undo, and the call escalates with the change as evidence. A read-only
  tool none of whose keys can be filled is taken at its word.

Changes to keys the proxy does not read are invisible to it.

A tool the config does not name is *unlisted*: the harness knows neither what it changes nor
how to undo it. ``unlisted = "refuse"`` (the default) does not serve it: it is not in
``tools/list`` and a call is refused naming the tool and how to allow it. ``unlisted =
"escalate"`` serves it as a write with no undo: it is listed with ``readOnlyHint`` false, every
call is held for a person's approval before it reaches upstream, its ``[[state]]`` keys (as
for a read) are recorded as its diff, and once one has run the episode cannot roll back past
it (a pivot: a later failure escalates instead).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import inspect
import re
import sys
import threading
import tomllib
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.server.mcpserver import Context as MCPContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, TextContent
from mcp_types import Tool as MCPTool

from .._json import loads
from ..action import Action, action
from ..errors import ConfigurationError, HarnessError
from ..policy import Policy
from ..state.base import escape_glob
from ..store import Store
from .mcp import Transport, _ActionServer, run

__all__ = [
    "ProxyConfig",
    "ReadRule",
    "ToolRule",
    "Unlisted",
    "Upstream",
    "UpstreamError",
    "UpstreamState",
    "build_proxy",
    "load_config",
    "serve_proxy",
]

_FIELD = re.compile(r"\{(\w+)\}")

Unlisted = Literal["refuse", "escalate"]
"""What becomes of an upstream tool the config does not name (see the module)."""

_UNLISTED: tuple[str, ...] = ("refuse", "escalate")


class UpstreamError(HarnessError):
    """The upstream MCP server answered a call with an error (``isError``), or could not be
    reached."""


@dataclass(frozen=True)
class ReadRule:
    """How keys matching ``pattern`` (``accounts/{account}``) are read: ``tool`` called with
    the pattern's fields as arguments (or ``arguments``, whose ``{field}`` strings are
    filled in)."""

    pattern: str
    tool: str
    arguments: Mapping[str, Any] | None = None

    def match(self, key: str) -> dict[str, str] | None:
        """The pattern's fields in ``key`` (each one path segment), or None when it does not
        match."""
        parts = _FIELD.split(self.pattern)  # literal, field, literal, field, ..., literal
        regex = "".join(
            re.escape(part) if i % 2 == 0 else f"(?P<{part}>[^/]+)" for i, part in enumerate(parts)
        )
        found = re.fullmatch(regex, key)
        return None if found is None else found.groupdict()


@dataclass(frozen=True)
class ToolRule:
    """What the config says about one upstream tool.

    Attributes:
        writes: the keys it may change (``accounts/{account}``); none: it is a read.
        preconditions: ``module:function`` checks run before the call.
        postconditions: ``module:function`` checks run after it, on the state read upstream.
        compensation: the ``module:function`` that undoes it.
        idempotency_key: the ``module:function`` of the arguments naming its effect.
        approval: a person approves every call before it runs.
        observes: keys read before and after each call besides ``writes`` (a change to one is
            a ``scope`` failure). None: for a read, every ``[[state]]`` pattern its arguments
            fill; for a write, none.
    """

    writes: tuple[str, ...] = ()
    preconditions: tuple[str, ...] = ()
    postconditions: tuple[str, ...] = ()
    compensation: str | None = None
    idempotency_key: str | None = None
    approval: bool = False
    observes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ProxyConfig:
    """A proxy's configuration (:func:`load_config` reads it from TOML).

    Attributes:
        command: the upstream server's command line (stdio), or None.
        url: the upstream server's Streamable HTTP URL, or None.
        cwd: the folder the command runs in.
        store: where the episodes are recorded.
        unlisted: what becomes of tools the config does not name: ``refuse`` (the default:
            not served, a call is refused) or ``escalate`` (served as writes with no undo, each
            call held for a person's approval).
        reads: how state keys are read upstream.
        tools: tool name -> its rule.
        decisions: the policy's failure class -> decision overrides.
        env: environment variables for the command.
        hooks: the folder hooks are imported from (first on ``sys.path``): the config's.
    """

    command: tuple[str, ...] | None = None
    url: str | None = None
    cwd: Path = field(default_factory=Path.cwd)
    store: str = "sqlite:///logs/harness.db"
    unlisted: Unlisted = "refuse"
    reads: tuple[ReadRule, ...] = ()
    tools: Mapping[str, ToolRule] = field(default_factory=dict)
    decisions: Mapping[Any, Any] = field(default_factory=dict)
    env: Mapping[str, str] | None = None
    hooks: Path = field(default_factory=Path.cwd)

    def __post_init__(self) -> None:
        if self.unlisted not in _UNLISTED:
            raise ConfigurationError(_unlisted_error(self.unlisted, "ProxyConfig(unlisted=...)"))

    def with_store(self, store: str) -> ProxyConfig:
        """This configuration, recording to ``store``."""
        return replace(self, store=store)


def _unlisted_error(value: Any, where: str) -> str:
    if value == "read-only":
        return (
            f'{where} = "read-only" is no longer accepted: it served every tool the config '
            "does not name as a read, so a tool that writes reached upstream unseen, was "
            "recorded as a read and could not be undone. Name the tools you need under "
            '[tools.NAME] (no writes for a read, watched through [[state]]) and use "refuse" '
            '(the default), or "escalate" to have a person approve each call of the others'
        )
    return f'{where} = {value!r}; use "refuse" (the default) or "escalate"'


def _strings(value: Any, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigurationError(f"{where} must be a string or a list of strings, not {value!r}")
    return tuple(value)


def load_config(path: str | Path) -> ProxyConfig:
    """Read a proxy configuration from a TOML file (see the module for its shape).

    Raises:
        ConfigurationError: the file is missing, is not TOML, or a field is wrong (named).
    """
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigurationError(f"proxy config {path}: cannot read it ({exc})") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"proxy config {path} is not TOML: {exc}") from exc
    upstream = raw.get("upstream") or {}
    command, url = upstream.get("command"), upstream.get("url")
    if (command is None) == (url is None):
        raise ConfigurationError(
            f"proxy config {path}: [upstream] needs exactly one of command = [...] (a server "
            'to spawn over stdio) or url = "http://host:port/mcp"'
        )
    base = path.resolve().parent
    proxy = raw.get("proxy") or {}
    unlisted = proxy.get("unlisted", "refuse")
    if unlisted not in _UNLISTED:
        raise ConfigurationError(
            _unlisted_error(unlisted, f"proxy config {path}: [proxy] unlisted")
        )
    reads = []
    for i, rule in enumerate(raw.get("state") or []):
        if not isinstance(rule, dict) or "pattern" not in rule or "tool" not in rule:
            raise ConfigurationError(
                f'proxy config {path}: [[state]] entry {i + 1} needs pattern = "kind/{{field}}" '
                'and tool = "a read tool"'
            )
        reads.append(ReadRule(rule["pattern"], rule["tool"], rule.get("arguments")))
    tools: dict[str, ToolRule] = {}
    for name, rule in (raw.get("tools") or {}).items():
        where = f"proxy config {path}: [tools.{name}]"
        unknown = set(rule) - {
            "writes", "preconditions", "postconditions", "compensation", "idempotency_key",
            "approval", "observes",
        }  # fmt: skip
        if unknown:
            raise ConfigurationError(f"{where} has unknown keys {', '.join(sorted(unknown))}")
        approval = rule.get("approval", False)
        if not isinstance(approval, bool):
            raise ConfigurationError(f"{where} approval = {approval!r}; use true or false")
        for hook in ("compensation", "idempotency_key"):
            if not isinstance(rule.get(hook, ""), str):
                raise ConfigurationError(f'{where} {hook} must be one "module:function"')
        tools[name] = ToolRule(
            writes=_strings(rule.get("writes", []), f"{where} writes"),
            preconditions=_strings(rule.get("preconditions", []), f"{where} preconditions"),
            postconditions=_strings(rule.get("postconditions", []), f"{where} postconditions"),
            compensation=rule.get("compensation"),
            idempotency_key=rule.get("idempotency_key"),
            approval=approval,
            observes=None
            if "observes" not in rule
            else _strings(rule["observes"], f"{where} observes"),
        )
    cwd = base / upstream.get("cwd", ".")
    return ProxyConfig(
        command=None if command is None else _strings(command, f"proxy config {path}: command"),
        url=url,
        cwd=cwd,
        store=proxy.get("store", "sqlite:///logs/harness.db"),
        unlisted=unlisted,
        reads=tuple(reads),
        tools=tools,
        decisions=dict(proxy.get("decisions") or {}),
        env=upstream.get("env"),
        hooks=base,
    )


def _value(result: CallToolResult) -> Any:
    """What an upstream tool answered: its structured content (unwrapped from ``result``),
    else its text, parsed as JSON when it is."""
    if result.structured_content is not None:
        content = result.structured_content
        if set(content) == {"result"}:
            return content["result"]
        return content
    text = "\n".join(c.text for c in result.content if isinstance(c, TextContent))
    try:
        return loads(text)
    except ValueError:
        return text


def _innermost(exc: BaseException) -> BaseException:
    """The first exception at the bottom of nested exception groups (what went wrong)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class Upstream:
    """A client session with the upstream MCP server, on a thread of its own.

    Actions, checks and the state adapter are sync code the harness runs in worker threads;
    they reach the upstream session (which lives on this thread's event loop) through
    :meth:`call`.
    """

    def __init__(self, config: ProxyConfig, *, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self._loop = asyncio.new_event_loop()
        self._ready: Future[list[MCPTool]] = Future()
        self._stop: asyncio.Event | None = None
        self._client: Client | None = None
        if config.command:
            self._target: Any = StdioServerParameters(
                command=config.command[0],
                args=list(config.command[1:]),
                cwd=str(config.cwd),
                env=dict(config.env) if config.env else None,
            )
        else:
            self._target = config.url
        self._thread = threading.Thread(target=self._run, name="harness-mcp-upstream", daemon=True)
        self._thread.start()
        try:
            self.tools = self._ready.result(timeout)
        except Exception as exc:
            cause = _innermost(exc)
            where = " ".join(config.command) if config.command else config.url
            raise UpstreamError(
                f"cannot connect to the upstream MCP server {where!r} "
                f"({type(cause).__name__}: {cause}); check that it starts and speaks MCP"
            ) from exc

    def _run(self) -> None:
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        try:
            async with Client(self._target) as client:
                self._client = client
                tools = (await client.list_tools()).tools
                self._ready.set_result(tools)
                await self._stop.wait()
        except BaseException as exc:
            if not self._ready.done():
                self._ready.set_exception(exc)

    def call(self, tool: str, arguments: Mapping[str, Any]) -> CallToolResult:
        """Call an upstream tool and wait for its result."""
        if self._client is None:
            raise UpstreamError("the upstream MCP session is closed")
        future = asyncio.run_coroutine_threadsafe(
            self._client.call_tool(tool, dict(arguments)), self._loop
        )
        return future.result(self.timeout)

    def close(self) -> None:
        """End the upstream session (and the server process it spawned)."""
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(self.timeout)
        self._client = None


class UpstreamState:
    """The upstream server's state as the harness sees it: resources read by read tools.

    ``get(key)`` calls the read tool of the first :class:`ReadRule` whose pattern matches.
    Change tracking re-reads the keys a window has read (the scope's keys, read before each
    call), so a tool's effect on them is seen; keys no window read are not tracked.
    """

    def __init__(self, upstream: Upstream, reads: tuple[ReadRule, ...]) -> None:
        self.upstream = upstream
        self.reads = reads
        self._windows: dict[int, dict[str, Any]] = {}
        self._next = 0
        self._lock = threading.Lock()

    def call(self, tool: str, arguments: Mapping[str, Any]) -> Any:
        """Call an upstream tool; its value, or :class:`UpstreamError` if it answered an error."""
        result = self.upstream.call(tool, arguments)
        if result.is_error:
            text = "\n".join(c.text for c in result.content if isinstance(c, TextContent))
            raise UpstreamError(f"upstream tool {tool!r} failed: {text}")
        return _value(result)

    def get(self, key: str) -> Any | None:
        """The resource ``key`` as its read tool gives it (None when the tool says error)."""
        for rule in self.reads:
            fields = rule.match(key)
            if fields is None:
                continue
            if rule.arguments is None:
                arguments: dict[str, Any] = dict(fields)
            else:
                arguments = {
                    k: v.format(**fields) if isinstance(v, str) else v
                    for k, v in rule.arguments.items()
                }
            result = self.upstream.call(rule.tool, arguments)
            return None if result.is_error else _value(result)
        raise ConfigurationError(
            f"no [[state]] rule of the proxy config reads {key!r}; add one with a pattern "
            "matching it and the upstream tool that reads it"
        )

    def snapshot(self, keys: Any) -> dict[str, Any]:
        """Current values of ``keys``; every open window remembers them as its before."""
        values = {k: self.get(k) for k in keys}
        with self._lock:
            for seen in self._windows.values():
                for k, v in values.items():
                    seen.setdefault(k, v)
        return values

    def mark(self) -> int:
        """Start a window (its keys are those read by :meth:`snapshot` while it is open)."""
        with self._lock:
            self._next += 1
            self._windows[self._next] = {}
            return self._next

    def changes(self, mark: int) -> dict[str, Any]:
        """The keys the window read, with their value then (the caller compares them now)."""
        with self._lock:
            return dict(self._windows.get(mark, {}))

    def release(self, mark: int) -> None:
        """End the window."""
        with self._lock:
            self._windows.pop(mark, None)

    def fingerprint(self) -> str:
        """Not available: the upstream state cannot be read whole."""
        return hashlib.sha256(b"upstream").hexdigest()


def _hook(spec: str, folder: Path, where: str) -> Callable[..., Any]:
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        raise ConfigurationError(f"{where}: {spec!r} is not module:function")
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"{where}: cannot import {module_name!r} ({exc}); put it beside the config"
        ) from exc
    hook = getattr(module, name, None)
    if not callable(hook):
        raise ConfigurationError(f"{where}: {module_name!r} has no function {name!r}")
    return hook  # type: ignore[no-any-return]


_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "object": dict,
    "array": list,
}


def _signature(schema: Mapping[str, Any]) -> inspect.Signature:
    """Keyword parameters for an upstream tool's input schema (optional ones default None)."""
    required = set(schema.get("required") or ())
    params = []
    for name, prop in (schema.get("properties") or {}).items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        hint = _JSON_TYPES.get(kind, Any) if isinstance(kind, str) else Any
        if name in required:
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=hint))
        else:
            params.append(
                inspect.Parameter(
                    name, inspect.Parameter.KEYWORD_ONLY, annotation=hint | None, default=None
                )
            )
    return inspect.Signature(params)


def _fields(pattern: str) -> list[str]:
    return _FIELD.findall(pattern)


def _observed(
    name: str, rule: ToolRule | None, arguments: set[str], reads: tuple[ReadRule, ...]
) -> list[str]:
    """The key patterns read before and after each call of ``name`` besides its ``writes``.

    Raises:
        ConfigurationError: an ``observes`` pattern names a field that is not an argument, or
            no ``[[state]]`` rule reads it.
    """
    where = f"[tools.{name}] observes"
    if rule is not None and rule.observes is not None:
        for pattern in rule.observes:
            unknown = sorted(set(_fields(pattern)) - arguments)
            if unknown:
                raise ConfigurationError(
                    f"{where} {pattern!r} names {', '.join(unknown)}, which is not an argument "
                    f"of {name} (it has {', '.join(sorted(arguments)) or 'none'})"
                )
            sample = _FIELD.sub("x", pattern)
            if not any(read.match(sample) is not None for read in reads):
                raise ConfigurationError(
                    f"{where} {pattern!r}, which no [[state]] rule reads; add a [[state]] rule "
                    "whose pattern matches it and the upstream tool that reads it"
                )
        return list(rule.observes)
    if rule is not None and rule.writes:
        return []
    # A read, or a tool the config does not name: every key its arguments can name.
    found: list[str] = []
    for read in reads:
        if set(_fields(read.pattern)) <= arguments and read.pattern not in found:
            found.append(read.pattern)
    return found


def _fill(pattern: str, values: Mapping[str, str]) -> str:
    """``pattern`` with each ``{field}`` replaced by its value."""
    return _FIELD.sub(lambda m: values[m.group(1)], pattern)


def _keys(name: str, patterns: list[str], arguments: Mapping[str, Any]) -> list[str]:
    """``patterns`` filled with the call's ``arguments`` (one whose argument is not given is
    left out: the call does not name that key).

    Raises:
        ConfigurationError: an argument's value cannot be one segment of a key.
    """
    keys = []
    for pattern in patterns:
        values = {f: arguments.get(f) for f in _fields(pattern)}
        if any(v is None for v in values.values()):
            continue
        for f, v in values.items():
            if not str(v) or "/" in str(v):
                raise ConfigurationError(
                    f"tool {name!r}: argument {f} = {v!r} cannot name the key {pattern!r} (a "
                    "field is one path segment), so the proxy cannot watch what the call "
                    "changes; nothing was sent upstream"
                )
        keys.append(_fill(pattern, {f: str(v) for f, v in values.items()}))
    return keys


def _proxied(
    tool: MCPTool,
    rule: ToolRule | None,
    state: UpstreamState,
    folder: Path,
    *,
    reads: tuple[ReadRule, ...] = (),
) -> Action[..., Any]:
    """``tool`` as an action: as its ``rule`` says, or (``rule`` None: unlisted) as a write
    with no undo, held for a person before every call."""
    name = tool.name
    sig = _signature(tool.input_schema)
    observed = _observed(name, rule, set(sig.parameters), reads)
    writes: Any = list(rule.writes) if rule is not None and rule.writes else None
    # Keys the scope does not read already: read here, inside the call's change window, so a
    # change to one is seen (outside the scope: a ``scope`` failure).
    watch = [p for p in observed if writes is None or p not in writes]
    if rule is None:
        # An unknown write: what it changes among the keys it names is its recorded diff.
        watch = []

        def unknown_writes(model: Any) -> list[str]:
            values = {p: getattr(model, p, None) for p in sig.parameters}
            return [escape_glob(k) for k in _keys(name, observed, values)]

        writes = unknown_writes

    def forward(**arguments: Any) -> Any:
        given = {k: v for k, v in arguments.items() if v is not None}
        if watch:
            keys = _keys(name, watch, given)
            if keys:
                state.snapshot(keys)
        return state.call(name, given)

    forward.__signature__ = sig  # type: ignore[attr-defined]
    forward.__annotations__ = {p.name: p.annotation for p in sig.parameters.values()}
    forward.__name__ = forward.__qualname__ = name
    digest = hashlib.sha256(repr(tool.input_schema).encode()).hexdigest()[:12]
    # (actions share argument models by code and docstring: the digest keeps each tool's own)
    forward.__doc__ = f"{tool.description or name}\n\nupstream schema {digest}"
    where = f"[tools.{name}]"
    key = None
    if rule is not None and rule.idempotency_key:
        key = _hook(rule.idempotency_key, folder, f"{where} idempotency_key")
    act = action(
        forward,
        writes=writes,
        idempotency_key=key,
        # Unlisted: the harness can neither see nor undo what it does, so a person decides
        # each call, and the episode does not claim to roll back past one that ran.
        approval=rule.approval if rule is not None else True,
        pivot=rule is None,
        name=name,
        description=tool.description or name,
    )
    if rule is not None:
        for spec in rule.preconditions:
            act.precondition(_hook(spec, folder, f"{where} preconditions"))
        for spec in rule.postconditions:
            act.postcondition(_hook(spec, folder, f"{where} postconditions"))
        if rule.compensation:
            act.compensation(_hook(rule.compensation, folder, f"{where} compensation"))
    return act


def _refusal(name: str) -> str:
    """What a client is told when it calls an unlisted tool the proxy refuses."""
    return (
        f"tool {name!r} is refused by the harness proxy: its config does not describe it "
        f"(no [tools.{name}]), so the harness could neither see what it changes nor undo it. "
        f"Nothing was sent upstream. To allow it, declare it in the proxy config: "
        f'[tools.{name}] with writes = ["..."] and a compensation if it changes state, or '
        "with no writes if it only reads (its [[state]] keys are then checked before and "
        'after each call); or set [proxy] unlisted = "escalate" to have a person approve '
        "each call of a tool the config does not describe"
    )


class _ProxyServer(_ActionServer):
    """The proxy's MCP server: its actions, and the unlisted tools it refuses by name."""

    def __init__(self, *args: Any, refused: Mapping[str, str], **kwargs: Any) -> None:
        self.refused = dict(refused)
        super().__init__(*args, **kwargs)

    async def call_tool(
        self, name: str, arguments: dict[str, Any], context: MCPContext[Any, Any] | None = None
    ) -> CallToolResult:
        """Refuse a call of an unlisted tool (naming how to allow it), else run it."""
        if name in self.refused:
            raise ToolError(self.refused[name])
        return await super().call_tool(name, arguments, context)


@dataclass
class Proxy:
    """A running proxy's parts: the MCP server to serve, and the upstream session it uses.

    Attributes:
        server: the MCP server that fronts the upstream one.
        upstream: the client session with the upstream server.
        actions: the served tools, by name.
        refused: the upstream tools it does not serve (unlisted, refused), sorted.
    """

    server: MCPServer[Any]
    upstream: Upstream
    actions: dict[str, Action[..., Any]]
    refused: tuple[str, ...] = ()

    def close(self) -> None:
        """End the upstream session."""
        self.upstream.close()


def build_proxy(config: ProxyConfig, *, episode_id: str | None = None) -> Proxy:
    """Connect to the upstream server and make the MCP server that fronts it.

    Raises:
        ConfigurationError: the config names a tool the upstream server does not have, or a
            hook that cannot be imported.
        UpstreamError: the upstream server cannot be reached.
    """
    upstream = Upstream(config)
    try:
        state = UpstreamState(upstream, config.reads)
        by_name = {t.name: t for t in upstream.tools}
        missing = sorted(set(config.tools) - set(by_name))
        if missing:
            raise ConfigurationError(
                f"the proxy config names tools the upstream server does not have: "
                f"{', '.join(missing)} (it has {', '.join(sorted(by_name))})"
            )
        actions = {
            name: _proxied(tool, config.tools.get(name), state, config.hooks, reads=config.reads)
            for name, tool in by_name.items()
            if name in config.tools or config.unlisted == "escalate"
        }
        refused = sorted(set(by_name) - set(actions))
        if not actions:
            raise ConfigurationError(
                "the proxy config describes none of the upstream server's tools "
                f"({', '.join(sorted(by_name)) or 'it has none'}) and refuses the tools it "
                "does not describe, so there is nothing to serve; declare the tools to serve "
                'under [tools.NAME], or set [proxy] unlisted = "escalate"'
            )
        policy = Policy(decisions=dict(config.decisions)) if config.decisions else None
        server = _ProxyServer(
            actions, state=state, store=Store(config.store, create=True), policy=policy,
            name="harness-proxy", episode_id=episode_id, instructions=None,
            schemas={name: by_name[name].input_schema for name in actions},
            refused={name: _refusal(name) for name in refused},
        )  # fmt: skip
    except BaseException:
        upstream.close()
        raise
    return Proxy(server, upstream, actions, tuple(refused))


def serve_proxy(
    config: ProxyConfig | str | Path,
    *,
    transport: Transport = "stdio",
    host: str = "127.0.0.1",
    port: int = 8000,
    episode_id: str | None = None,
) -> None:
    """Serve the upstream server's tools through transactions until the client (stdio) or the
    process (HTTP) stops."""
    if not isinstance(config, ProxyConfig):
        config = load_config(config)
    proxy = build_proxy(config, episode_id=episode_id)
    try:
        run(proxy.server, transport=transport, host=host, port=port)
    finally:
        proxy.close()

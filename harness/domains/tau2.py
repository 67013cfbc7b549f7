"""What the tau2-bench domains (retail, airline) share: upstream's words around our transactions.

- :class:`UpstreamError`: a tool refused the call; ``str(error)`` is upstream's message.
- :func:`calculate`: upstream's ``calculate`` tool, without ``eval``.
- :func:`upstream_error`: what upstream's environment would answer a call, found by running
  the tool as a dry run.
- :func:`load_tool_defs`: the tools exactly as upstream hands them to an agent.
- :class:`Tau2Environment`: one trial's database with its tools, its tool definitions, policy
  and tool messages word for word upstream's.
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import os
import sqlite3
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from pydantic import Field, create_model

import harness as hx
from harness._json import json_copy
from harness.domains.base import FolderEnvironment, OccurrenceKeys, delegate
from harness.domains.records import Record, Tables, dry_run

if TYPE_CHECKING:
    from harness.agents.base import ToolResult

__all__ = [
    "Tau2Environment",
    "Tau2Tools",
    "UpstreamError",
    "build_actions",
    "calculate",
    "load_tool_defs",
    "upstream_error",
]


class UpstreamError(ValueError):
    """A tool refused the call; ``str(error)`` is upstream's message for the agent."""


_CALCULATOR_CHARS: Final = frozenset("0123456789+-*/(). ")
_MAX_EXPONENT: Final = 10_000

_BINARY: Final[Mapping[type[ast.operator], Callable[[Any, Any], Any]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}
_UNARY: Final[Mapping[type[ast.unaryop], Callable[[Any], Any]]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}


def _arithmetic(node: ast.AST, error: type[UpstreamError]) -> Any:
    """Evaluate the arithmetic Python's ``eval`` would, for the calculator's character set."""
    if isinstance(node, ast.Expression):
        return _arithmetic(node.body, error)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_arithmetic(node.operand, error))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _arithmetic(node.left, error), _arithmetic(node.right, error)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            # eval would try; a huge integer power can take the process down.
            raise error("Exponent too large")
        return _BINARY[type(node.op)](left, right)
    raise error("Invalid expression")


def calculate(expression: str, error: type[UpstreamError]) -> str:
    """Upstream's ``calculate``: the expression's value rounded to 2 decimals, as a string.

    Args:
        expression: Numbers, the operators +, -, * and /, parentheses and spaces.
        error: The domain's error type, raised with upstream's message.

    Raises:
        UpstreamError: (``error``) other characters, or not a valid expression.
    """
    if not all(char in _CALCULATOR_CHARS for char in expression):
        raise error("Invalid characters in expression")
    try:
        # "<string>": the file name eval gives, so a syntax error reads as upstream's.
        value = _arithmetic(ast.parse(expression, filename="<string>", mode="eval"), error)
        return str(round(float(value), 2))
    except (SyntaxError, ArithmeticError) as exc:
        raise error(str(exc)) from exc


class Tau2Tools:
    """What every tau2 domain's tools have: one SQLite connection, upstream's two generic tools
    (``calculate`` and ``transfer_to_human_agents``) and the domain's tool list.

    A subclass sets :attr:`TOOL_TYPES` and :attr:`ERROR`, and gets the generic tools as its
    own methods (their qualified name is the subclass's, so a call that does not fit the
    signature reads as upstream's: ``RetailTools.calculate() missing 1 required ...``).

    Args:
        conn: A connection opened with ``isolation_level=None``
            (:func:`harness.domains.records.connect` opens one). Write tools open their own
            transaction (``BEGIN IMMEDIATE``), or a savepoint when the caller already has one.

    Raises:
        ValueError: If the connection manages transactions itself (``isolation_level`` set).
    """

    TOOL_TYPES: ClassVar[Mapping[str, str]]
    """Every tool with upstream's ``ToolType`` (what :func:`upstream_error` knows as tools)."""
    ERROR: ClassVar[type[UpstreamError]] = UpstreamError
    """The domain's error, raised with upstream's message."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name in ("calculate", "transfer_to_human_agents"):
            if name not in cls.__dict__:
                setattr(cls, name, _as_method_of(cls, getattr(Tau2Tools, name)))

    def __init__(self, conn: sqlite3.Connection) -> None:
        if conn.isolation_level is not None:
            raise ValueError(
                f"{type(self).__name__} needs a connection opened with isolation_level=None "
                "(harness.domains.records.connect opens one)"
            )
        self.conn = conn

    def calculate(self, expression: str) -> str:
        """Calculate the result of a mathematical expression.

        Args:
            expression: The expression to calculate, such as '2 + 2'. It may contain numbers,
                the operators +, -, * and /, parentheses and spaces.

        Returns:
            The result, rounded to 2 decimals, as a string.

        Raises:
            UpstreamError: (the domain's ``ERROR``) other characters, or not a valid
                expression.
        """
        return calculate(expression, self.ERROR)

    def transfer_to_human_agents(self, summary: str) -> str:
        """Transfer the user to a human agent, with a summary of the user's issue.

        Only transfer if the user explicitly asks for a human agent, or if the user's issue
        cannot be solved with the policy and the available tools.

        Args:
            summary: A summary of the user's issue.

        Returns:
            A message saying the user has been transferred to a human agent.
        """
        return "Transfer successful"


def _as_method_of(cls: type, function: Any) -> Any:
    """A copy of ``function`` whose qualified name (the code's too, which Python's argument
    errors use) is ``cls``'s."""
    qualname = f"{cls.__name__}.{function.__name__}"
    copied = types.FunctionType(
        function.__code__.replace(co_qualname=qualname),
        function.__globals__,
        function.__name__,
        function.__defaults__,
        function.__closure__,
    )
    copied.__kwdefaults__ = function.__kwdefaults__
    copied.__doc__ = function.__doc__
    copied.__annotations__ = dict(function.__annotations__)
    copied.__module__ = cls.__module__
    copied.__qualname__ = qualname
    return copied


def build_actions(
    tools: Any,
    state: Any,
    *,
    names: Sequence[str],
    scope: Callable[[Any, str], Callable[[Any], list[str]]],
    preconditions: Mapping[str, Sequence[Callable[[hx.Context], bool]]],
    postconditions: Mapping[str, Sequence[Callable[[hx.Context], bool]]],
    recovered: Callable[[Any, str], Callable[[hx.Context], Any]],
    database: Tables,
) -> dict[str, hx.Action[..., Any]]:
    """Turn each write tool of ``tools`` into a transactional action.

    Each action has upstream's name, arguments and docstring (it calls ``tools.<name>``,
    looked up at each call), the scope ``scope(state, name)``, the checks, one compensation
    that writes back the before-row of every row it changed
    (:meth:`harness.domains.records.Tables.restore_before`), the result read back when an
    answer is lost (``recovered(tools, name)``), and an occurrence-numbered idempotency key
    (:class:`harness.domains.base.OccurrenceKeys`): upstream runs a repeated call again, and
    so do these actions.

    Returns:
        ``{tool name: action}`` for ``names``.
    """
    occurrences = OccurrenceKeys()

    def compensate(ctx: hx.Context) -> None:
        database.restore_before(tools.conn, ctx)

    actions: dict[str, hx.Action[..., Any]] = {}
    for name in names:
        call, writes = delegate(tools, name), scope(state, name)
        pre, post = tuple(preconditions[name]), tuple(postconditions[name])
        key = (type(tools), name, pre, post)
        made = _PROTOTYPES.get(key)
        if made is None:
            made = hx.Action(call, writes=writes, idempotency_key=occurrences.key)
            for check in pre:
                made.precondition(check)
            for check in post:
                made.postcondition(check)
            if len(_PROTOTYPES) < _PROTOTYPES_KEPT:
                # Kept without this environment's function, scope and keys (each copy gets
                # its own), so the prototype does not keep the environment alive.
                _PROTOTYPES[key] = made._around(
                    _detached, idempotency_key=_detached, writes=_detached
                )
        # Every environment's action is a copy of the one made first (its arguments' model,
        # schema and checks read once a process): its own function, scope, key and undo.
        act = made._around(call, idempotency_key=occurrences.key, writes=writes)
        act.compensation(compensate)
        act.recover(recovered(tools, name))
        actions[name] = act
    return actions


def _detached(*_args: Any, **_kwargs: Any) -> Any:
    """A kept prototype's function, scope and keys: never called (copies replace them)."""
    raise RuntimeError("a prototype action is only copied, never called")


_PROTOTYPES: dict[tuple[Any, ...], hx.Action[..., Any]] = {}
"""The first action made for each (tools class, tool name, checks): the others copy it."""
_PROTOTYPES_KEPT = 1024


def upstream_error(tools: Any, name: str, arguments: Mapping[str, Any]) -> str | None:
    """The error upstream's environment would report for this call on the current database.

    Runs the tool ``name`` of ``tools`` as upstream would call it (``tool(**arguments)``, no
    argument validation) in a *dry run* (:func:`harness.domains.records.dry_run`): every
    validation and lookup of the tool runs in the same order as in a real call, but nothing
    is written, so the database is left as it was. The message is what upstream puts after
    ``"Error: "`` in the tool message the agent reads (upstream's
    ``Environment.get_response``): an :class:`UpstreamError`'s text, Python's own
    ``TypeError`` text for arguments that do not fit the signature (the same as upstream's,
    whose class and methods have these names), ``Tool '<name>' not found.`` for a name that
    is not a tool (``type(tools).TOOL_TYPES`` lists the tools).

    Returns:
        The message, or None when upstream's tool would accept the call.
    """
    if name not in type(tools).TOOL_TYPES:
        return f"Tool '{name}' not found."
    function = getattr(type(tools), name)
    try:
        inspect.signature(function).bind(tools, **arguments)
    except TypeError:
        try:  # binding fails before the body runs: Python's own message, as upstream gets
            function(tools, **arguments)
        except TypeError as error:
            return str(error)
    with dry_run():
        try:
            getattr(tools, name)(**arguments)
        except Exception as error:  # upstream reports any exception as "Error: <message>"
            return str(error)
    return None


def _in_upstreams_order(spec: dict[str, Any], tools: type) -> dict[str, Any]:
    """A tool definition with its keys in the order upstream's ``Tool.openai_schema`` gives them.

    The shipped file keeps upstream's content with its keys sorted. Upstream builds the
    parameters with ``pydantic.create_model("parameters", **{arg: (type, Field(...,
    description=...))})`` from the tool's signature; doing the same from our tool's signature
    (same names, types and order) gives upstream's key order. Should that ever differ from the
    shipped content, the shipped definition is kept as it is.
    """
    function = spec["function"]
    name = function["name"]
    method = getattr(tools, name)
    hints = typing.get_type_hints(method)
    described = function["parameters"]["properties"]
    fields: dict[str, Any] = {
        arg: (hints[arg], Field(..., description=described.get(arg, {}).get("description")))
        for arg in list(inspect.signature(method).parameters)[1:]
    }
    ordered = {
        "type": "function",
        "function": {
            "name": name,
            "description": function["description"],
            "parameters": create_model("parameters", **fields).model_json_schema(),
        },
    }
    return ordered if ordered == spec else spec


def load_tool_defs(data: Traversable, tools: type) -> tuple[Mapping[str, Any], ...]:
    """The tools of ``data/tools.json`` exactly as upstream hands them to an agent
    (``Tool.openai_schema``), in upstream's order, keys in upstream's order."""
    specs = json.loads(data.joinpath("tools.json").read_text("utf-8"))
    return tuple(_in_upstreams_order(spec, tools) for spec in specs)


class Tau2Environment(FolderEnvironment):
    """A fresh copy of a tau2 domain's database, its state adapter and its tools.

    A domain subclasses it with its tables, tools class, actions builder, tool definitions
    and policy (class attributes). One connection is shared: the tools write through the
    adapter's own ``sqlite3`` connection (autocommit mode), each write tool in one
    ``BEGIN IMMEDIATE`` transaction, and the adapter's change-capture triggers fire inside
    that same transaction, so a tool that fails rolls back its rows *and* their capture
    records together.

    What the agent sees is upstream's, word for word, while the transactions run underneath:
    the tools' definitions (:meth:`tool_defs`), the policy (:attr:`policy`) and every tool
    message (:meth:`tool_message`).

    Args:
        folder: Where the database file goes (created if missing; left in place on
            :meth:`close`). Default: the database lives in memory, a copy of the template
            nobody else can open, gone on :meth:`close`.
        db_json_path: Upstream's ``db.json`` to build the template from (default: the copy
            shipped in the package).

    Attributes:
        path: The database file (None: the database is in memory).
        state: The :class:`hx.SQLState` over it (resources ``<table>/<id>``).
        backend: The plain tools the actions call, over ``state.connection`` (its methods are
            looked up at each call: patch one to inject a fault).
        actions: ``{name: hx.Action}`` for the write tools.
        tools: ``{name: callable}`` for all the tools: the actions for writes, the plain
            methods for the rest, in upstream's order (that of :meth:`tool_defs`).
        policy: Upstream's policy, word for word.
    """

    DATABASE: ClassVar[Tables]
    TOOLS: ClassVar[type]
    ERROR: ClassVar[type[UpstreamError]]
    BUILD_ACTIONS: ClassVar[Callable[[Any, Any], dict[str, hx.Action[..., Any]]]]
    TOOL_DEFS: ClassVar[tuple[Mapping[str, Any], ...]]
    TOOL_NAMES: ClassVar[frozenset[str]]
    policy: str

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        db_json_path: str | os.PathLike[str] | None = None,
    ) -> None:
        if folder is None:
            # A throwaway copy nobody else reads (a resumed trial gets a fresh environment):
            # in memory, made and dropped without touching the disk.
            self.path: Path | None = None
            self.state = hx.SQLState(":memory:", image=self.DATABASE.image(db_json_path))
        else:
            name = self.DATABASE.name
            root = self._open_folder(folder, f"harness-{name}-")
            self.path = self.DATABASE.fresh_copy(root / f"{name}.sqlite", db_json_path=db_json_path)
            # The copy is the environment's own: WAL suits its many small writes.
            self.state = hx.SQLState(self.path, journal_mode="wal")
        self.backend = self.TOOLS(self.state.connection)
        build = type(self).BUILD_ACTIONS
        self.actions: dict[str, hx.Action[..., Any]] = build(self.backend, self.state)
        self.tools: dict[str, Callable[..., Any]] = {
            n: self.actions[n] if n in self.actions else getattr(self.backend, n)
            for n in (d["function"]["name"] for d in self.TOOL_DEFS)
        }

    @classmethod
    def tool_defs(cls) -> list[dict[str, Any]]:
        """The tools as upstream hands them to an agent, word for word (a fresh copy).

        Returns:
            Upstream's ``Tool.openai_schema`` of each tool, in upstream's order:
            ``{"type": "function", "function": {"name", "description", "parameters"}}``, the
            parameters being pydantic's JSON schema with its ``title`` keys. The toolbox gives
            these to the agent (:attr:`harness.agents.base.Toolbox.specs`); exports list them
            as the run's tool definitions.
        """
        defs: list[dict[str, Any]] = json_copy(cls.TOOL_DEFS)
        return defs

    def tool_message(
        self,
        name: str,
        arguments: Mapping[str, Any],
        result: ToolResult,
        error: BaseException | None,
    ) -> str | None:
        """The tool message the agent reads for a call, as upstream's environment writes it.

        The :class:`~harness.agents.base.Toolbox` asks for it after every call (see
        :attr:`~harness.agents.base.ToolResult.text`). Upstream's ``Environment.get_response``
        gives a string result as it is, any other result as ``json.dumps(value, default=str)``
        of its ``model_dump()`` (our records have that shape), and a failed call as
        ``Error: <the exception's message>``.

        A call the harness refused (a precondition, arguments that do not fit) reads as
        upstream's tool would have failed on the same database: the tool runs as a dry run
        (:func:`upstream_error`) and its message is used; which of our checks refused it, and
        why, stays in the store, the log and the audit. A call that failed in the tool reads as
        the tool's error. Failures upstream has no counterpart for (an injected fault, a
        postcondition, a person's rejection) keep the harness's wording.

        Args:
            name: The tool called.
            arguments: The arguments as the agent sent them.
            result: What the toolbox made of the call (``ok``, ``content``, ``error``, ``kind``).
            error: The exception the call raised (None: it succeeded, or never reached a tool).

        Returns:
            The text, or None to let the toolbox render the result its own way.
        """
        if result.ok:
            content = result.content
            return content if isinstance(content, str) else json.dumps(content, default=str)
        if error is None:
            if result.kind == "unknown_tool":
                return f"Error: {upstream_error(self.backend, name, arguments)}"
            return None
        if isinstance(error, hx.PreconditionFailed | hx.InvalidArguments):
            told = upstream_error(self.backend, name, arguments)
            return None if told is None else f"Error: {told}"
        if isinstance(error, hx.ActionFailed):
            last = error.errors[-1] if error.errors else None
            told = self._tool_error(last) if error.failure_class == "fail_stop" else None
            return None if told is None else f"Error: {told}"
        if name in self.actions or isinstance(error, hx.HarnessError):
            return None
        return f"Error: {error}"  # a read tool's own error, as upstream reports it

    def _tool_error(self, error: BaseException | None) -> str | None:
        """The message of the domain's own tool error: the error itself, or (a replayed call)
        the ``"<ErrorType>: <message>"`` text the store kept of it."""
        if isinstance(error, self.ERROR):
            return str(error)
        text = "" if error is None else str(error)
        prefix = f"{self.ERROR.__name__}: "
        return text[len(prefix) :] if text.startswith(prefix) else None

    def export(self) -> dict[str, dict[str, Record]]:
        """The database as plain JSON in the shape of tau2's ``db.json``."""
        return self.DATABASE.export(self.state.connection)

    def _release(self) -> None:
        if self.path is None:
            self.state.discard()  # (the database goes with its connection)
        else:
            self.state.close()

    def _where(self) -> object:
        return ":memory:" if self.path is None else self.path

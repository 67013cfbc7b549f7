"""``@action``: a tool function turned into a transactional action.

The decorated object keeps the function's name, signature, docstring and type hints, exposes
its argument schema (``.schema``, ``.openai_tool``) and carries the checks and the undo
registered on it. Calling it inside an episode runs one transaction
(:mod:`harness.transaction`); calling it anywhere else raises :class:`NotInEpisode`.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import functools
import hashlib
import inspect
import string
import types
import typing
import weakref
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, ParamSpec, TypeVar, overload

import docstring_parser
from docstring_parser.google import DEFAULT_SECTIONS, GoogleParser, Section, SectionType
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PydanticUserError,
    TypeAdapter,
    ValidationError,
    create_model,
)

from ._json import canonical, dumps, encodable
from .errors import ConfigurationError, InvalidArguments, NotInEpisode
from .policy import Retry
from .state.base import escape_glob

# The episode active in this context (set by ``Episode.__enter__``); here, below the episode
# package, so that calling an action needs no import.
CURRENT_EPISODE: contextvars.ContextVar[Any] = contextvars.ContextVar(
    "harness_episode", default=None
)
# The episodes open in this process, whatever context they are current in: what a call that
# finds no episode in its own context can say about where its episode went.
OPEN_EPISODES: weakref.WeakSet[Any] = weakref.WeakSet()
# The transaction whose tool is running in this context (set around each attempt), so that
# calls running at once in threads or tasks each see their own.
ACTIVE_CALL: contextvars.ContextVar[Context | None] = contextvars.ContextVar(
    "harness_active_context", default=None
)

__all__ = [
    "ACTIVE_CALL",
    "CURRENT_EPISODE",
    "OPEN_EPISODES",
    "Action",
    "Context",
    "ContextExecutor",
    "action",
    "as_json",
    "build_model",
    "current_context",
]

P = ParamSpec("P")
R = TypeVar("R")

Check = Callable[["Context"], Any]
Writes = Sequence[str] | Callable[[Any], Sequence[str]]


class Context:
    """What checks, compensations and key functions receive.

    Attributes:
        action: the action's name.
        args: the validated arguments, by attribute (``ctx.args.order_id``).
        state: the live state adapter (``ctx.state.get(key)``).
        before: values of the resolved ``writes`` scope before execution, key -> value.
        after: the same keys (and any other written key) after execution.
        result: what the tool returned (None before execution or when it was lost).
        idempotency_key: this call's key.
        attempt: the attempt number, from 1.
        txn_id: the transaction's id.
        episode_id: the episode's id.
    """

    __slots__ = (
        "action",
        "after",
        "args",
        "attempt",
        "before",
        "episode_id",
        "idempotency_key",
        "in_tool",
        "result",
        "state",
        "txn_id",
    )

    def __init__(self, action: str, args: Any, state: Any, episode_id: str) -> None:
        self.action = action
        self.args = args
        self.state = state
        self.episode_id = episode_id
        self.before: dict[str, Any] = {}
        self.after: dict[str, Any] = {}
        self.result: Any = None
        self.idempotency_key = ""
        self.attempt = 0
        self.txn_id = ""
        self.in_tool = False  # the call's tool is running now


# Google first (the style of this project's docstrings), with the Note(s) sections Google style
# also uses, so that a note stays out of the tool's description.
_GOOGLE = GoogleParser(
    sections=[
        *DEFAULT_SECTIONS,
        Section("Note", "notes", SectionType.SINGULAR),
        Section("Notes", "notes", SectionType.SINGULAR),
    ]
)
_OTHER_STYLES = (
    docstring_parser.DocstringStyle.NUMPYDOC,
    docstring_parser.DocstringStyle.REST,
    docstring_parser.DocstringStyle.EPYDOC,
)
# The sections that describe a call's arguments (not "Attributes", nor NumPy's "Receives").
_ARG_SECTIONS = frozenset(
    {"param", "parameter", "arg", "argument", "key", "keyword", "other_param"}
)


def _arg_docs(parsed: docstring_parser.Docstring) -> dict[str, str]:
    return {
        p.arg_name.lstrip("*"): " ".join(
            line.strip() for line in (p.description or "").splitlines() if line.strip()
        )
        for p in parsed.params
        if p.args[0] in _ARG_SECTIONS
    }


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """The description and per-argument descriptions of a docstring, in Google, NumPy, reST or
    Epydoc style.

    The style read is the one that finds the most argument descriptions, Google on a tie.
    (``docstring_parser``'s own guess counts every field, and takes a Google description line
    that starts with a reST role, ``:class:`X```, for a reST field, cutting the description.)
    """
    if not doc:
        return "", {}
    best: tuple[docstring_parser.Docstring, dict[str, str]] | None = None
    for style in (None, *_OTHER_STYLES):
        try:
            parsed = _GOOGLE.parse(doc) if style is None else docstring_parser.parse(doc, style)
        except docstring_parser.ParseError:
            continue
        args = _arg_docs(parsed)
        if best is None or len(args) > len(best[1]):
            best = parsed, args
    if best is None:  # no style reads it: all of it describes the action
        return " ".join(doc.split()), {}
    parsed, args = best
    text = f"{parsed.short_description or ''} {parsed.long_description or ''}"
    return " ".join(text.split()), args


_Built = tuple[type[BaseModel], list[str], str, Any]
_MODELS: dict[tuple[Any, ...], tuple[_Built, inspect.Signature]] = {}


def build_model(name: str, fn: Callable[..., Any]) -> _Built:
    """The arguments' pydantic model, names and the docstring summary (cached per function).

    Environments build their actions afresh for every trial, often from bound methods or
    closures of the same code; building a pydantic model costs a millisecond, so models are
    shared between functions with the same code, defaults and docstring.
    """
    return _built(name, fn)[0]


def _built(name: str, fn: Callable[..., Any]) -> tuple[_Built, inspect.Signature]:
    """:func:`build_model`'s answer and ``inspect.signature(fn)``, cached together.

    The key is the function whose signature ``inspect.signature`` reads: through
    ``functools.wraps`` wrappers (``__wrapped__``) down to one that states its own
    ``__signature__``, or to the function itself, with its code, defaults, annotations and
    docstring, whether it is bound, the stated signature, and the action's name.
    """
    inner = inspect.unwrap(fn, stop=lambda f: hasattr(f, "__signature__"))
    stated = getattr(inner, "__signature__", None)
    function = getattr(inner, "__func__", inner)
    code = getattr(function, "__code__", None)
    try:
        key: tuple[Any, ...] | None = (
            name,
            code,
            inner is not function,  # (a bound method's signature has no self)
            repr(getattr(function, "__defaults__", None)),
            repr(getattr(function, "__kwdefaults__", None)),
            repr(getattr(function, "__annotations__", None)),
            fn.__doc__,
            id(getattr(function, "__globals__", None)),
            stated,
        )
        hash(key)
    except TypeError:  # a stated signature with an unhashable default
        key = None
    if code is None or key is None:
        sig = _signature(name, fn)
        return _make_model(name, fn, sig), sig
    cached = _MODELS.get(key)
    if cached is None:
        sig = _signature(name, fn)
        cached = _MODELS[key] = (_make_model(name, fn, sig), sig)
    return cached


def _signature(name: str, fn: Callable[..., Any]) -> inspect.Signature:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"@action on {name!r}: cannot read its signature ({exc})") from exc


def _make_model(name: str, fn: Callable[..., Any], sig: inspect.Signature) -> _Built:
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # unresolvable forward references
        raise ConfigurationError(
            f"@action on {name!r}: cannot resolve its type hints ({exc}); import the types it "
            "names at module level"
        ) from exc
    summary, arg_docs = _parse_docstring(fn.__doc__)
    fields: dict[str, Any] = {}
    names: list[str] = []
    for param in sig.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"@action on {name!r}: *{param.name} and **{param.name} have no schema; "
                "name every argument"
            )
        annotation = hints.get(param.name, Any)
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (annotation, Field(default, description=arg_docs.get(param.name)))
        names.append(param.name)
    model = create_model(
        name, __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=True), **fields
    )
    return model, names, summary, hints.get("return")


_PLAIN_ATOMS = frozenset({str, int, float, bool, type(None)})
_RESULT_CONFIG = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON as it is: it comes back from the record unchanged."""
    try:
        return _plain_value(value)
    except RecursionError:  # a cycle (or absurd nesting): not JSON
        return False


def _plain_value(value: Any) -> bool:
    kind = type(value)
    if kind in _PLAIN_ATOMS:
        return True
    if kind is dict:
        for k, v in value.items():
            if type(k) is not str or (type(v) not in _PLAIN_ATOMS and not _plain_value(v)):
                return False
        return True
    if kind is list:
        for v in value:  # noqa: SIM110 - a loop: all() over a generator costs more, per call
            if type(v) not in _PLAIN_ATOMS and not _plain_value(v):
                return False
        return True
    return False


@functools.cache
def _any_adapter() -> TypeAdapter[Any]:
    """What a value is encoded with when nothing says its type (bytes as base64)."""
    return TypeAdapter(Any, config=_RESULT_CONFIG)


def _not_json(value: Any, error: BaseException, returns: Any = None) -> str:
    """Why ``value`` cannot be stored as JSON, and what to do about it."""
    kind = type(value).__name__
    if returns is not None and isinstance(error, PydanticUserError):
        name = getattr(returns, "__name__", str(returns))
        return (
            f"the return annotation {name} has no JSON form pydantic knows; make {name} a "
            "pydantic model or a dataclass, or annotate the tool with a JSON type"
        )
    detail = str(error).split("\n", 1)[0]
    return (
        f"a value of type {kind} has no JSON form ({detail}); make it a pydantic model or a "
        "dataclass and annotate the tool's return type with it"
    )


def as_json(value: Any) -> Any:
    """``value`` as JSON data: as it is when it is JSON already, otherwise through pydantic's
    JSON mode (models, dataclasses, ``datetime``, ``Decimal``, ``UUID``, enums, sets).

    What a read tool that is a plain function gives the agent: JSON, or a refusal, never the
    ``repr`` of an object.

    Raises:
        TypeError: the value has no JSON form (an ``object()``, an instance of a plain class, a
            cycle, absurd nesting); the message names the fix.
    """
    if _plain(value):
        return value
    try:
        return _any_adapter().dump_python(value, mode="json")
    except Exception as exc:  # pydantic cannot serialize it (or nesting overflowed the stack)
        raise TypeError(_not_json(value, exc)) from None


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _plain_return(annotation: Any) -> bool:
    """Whether a return annotation needs no decoding (JSON gives its values back as they are)."""
    return annotation in (None, Any, inspect.Signature.empty, type(None)) or annotation in (
        dict,
        list,
        str,
        int,
        float,
        bool,
    )


class _Literal:
    """An argument value substituted into a ``writes`` pattern, glob characters escaped."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        return escape_glob(format(self.value, spec))

    def __getattr__(self, name: str) -> _Literal:
        return _Literal(getattr(self.value, name))

    def __getitem__(self, item: Any) -> _Literal:
        return _Literal(self.value[item])


class Action(Generic[P, R]):
    """A tool function whose every call is one transaction.

    Build it with :func:`action`; register checks with :meth:`precondition`,
    :meth:`postcondition` and the undo with :meth:`compensation`.
    """

    def __init__(
        self,
        fn: Callable[P, R],
        *,
        writes: Writes | None = None,
        idempotency_key: Callable[[Any], Any] | None = None,
        idempotent: bool = False,
        idempotency_scope: str = "episode",
        retry: Retry | None = None,
        timeout: float | None = None,
        pivot: bool = False,
        approval: bool | Check = False,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        self.fn = fn
        self.name: str = name or str(getattr(fn, "__name__", "action"))
        if timeout is not None and timeout <= 0:
            raise ConfigurationError(f"@action on {self.name!r}: timeout must be > 0 seconds")
        if timeout is not None and not inspect.iscoroutinefunction(fn):
            raise ConfigurationError(
                f"@action on {self.name!r}: timeout= needs an async def tool; a sync call cannot "
                "be interrupted, so a timeout would only be noticed after the call returned. "
                "Make the tool async def, or bound the wait inside the tool (e.g. the client's "
                "own timeout)"
            )
        if retry is not None and not isinstance(retry, Retry):
            raise ConfigurationError(f"@action on {self.name!r}: retry must be an hx.Retry(...)")
        if writes is not None and isinstance(writes, str):
            raise ConfigurationError(
                f"@action on {self.name!r}: writes must be a list of patterns, "
                f"e.g. writes=[{writes!r}]"
            )
        self.is_async = inspect.iscoroutinefunction(fn)
        built, signature = _built(self.name, fn)
        self.model, self.arg_names, summary, returns = built
        self.returns: Any = None if _plain_return(returns) else returns
        self.description = description or summary
        self.writes = writes
        self.mutating = writes is not None and (callable(writes) or len(writes) > 0)
        self.idempotency_key = idempotency_key
        self.idempotent = idempotent
        if idempotency_scope not in ("episode", "store"):
            raise ConfigurationError(
                f"@action on {self.name!r}: idempotency_scope is 'episode' (the default) or "
                f"'store', not {idempotency_scope!r}"
            )
        if idempotency_scope == "store" and not self.mutating:
            raise ConfigurationError(
                f"@action on {self.name!r}: idempotency_scope='store' keys effects, and a "
                "read-only action has none; give it writes=[...], or leave the scope alone"
            )
        self.store_scoped = idempotency_scope == "store"
        self.retry = retry
        self.timeout = timeout
        self.pivot = pivot
        if not isinstance(approval, bool) and not callable(approval):
            raise ConfigurationError(
                f"@action on {self.name!r}: approval takes True (always ask a person) or a "
                "function of ctx saying when to ask (e.g. lambda ctx: ctx.args.amount > 1000)"
            )
        self.approval = approval
        self.preconditions: list[tuple[str, Check]] = []
        self.postconditions: list[tuple[str, Check]] = []
        self.compensate: Check | None = None
        self.undo_check: tuple[str, Check] | None = None
        self.recovered_result: Check | None = None
        self._static_scope: list[str] | None = None
        if writes is not None and not callable(writes):
            fields = [f for w in writes for _, f, _, _ in string.Formatter().parse(w) if f]
            if not fields:
                self._static_scope = list(writes)
            unknown = {f.split(".")[0].split("[")[0] for f in fields} - set(self.arg_names)
            if unknown:
                raise ConfigurationError(
                    f"@action on {self.name!r}: writes name {sorted(unknown)}, which are not "
                    f"arguments of {self.name}({', '.join(self.arg_names)})"
                )
        self._schema: dict[str, Any] | None = None
        self._look_like(fn, signature)

    def _look_like(self, fn: Callable[..., Any], signature: inspect.Signature) -> None:
        """Carry the tool function's identity, so an action is taken for the function it wraps.

        ``functools.wraps`` metadata (name, qualified name, module, docstring, annotations,
        ``__wrapped__``) and the signature, as for any decorator. Frameworks also decide whether
        to await a tool with ``inspect.iscoroutinefunction``, which in Python 3.11 accepts a
        callable object that carries a function's code, defaults and name (what compiled
        functions do): an action carries its tool's, so an ``async def`` action is recognized
        as a coroutine function and a sync one is not. And it is a non-data descriptor, so
        ``inspect.isroutine`` holds, as for a function (an action is not bound as a method:
        its arguments are its tool's).

        The tool's own attributes are not copied (``updated=()``): a function decorated by
        another library (tenacity's ``@retry`` sets ``.retry``) must not replace the action's.
        """
        functools.update_wrapper(self, fn, updated=())
        self.__signature__ = signature
        code = getattr(fn, "__code__", None)
        if isinstance(code, types.CodeType):
            self.__code__ = code
            self.__defaults__ = getattr(fn, "__defaults__", None)
            self.__kwdefaults__ = getattr(fn, "__kwdefaults__", None)

    def __get__(self, instance: Any, owner: type | None = None) -> Action[P, R]:
        return self

    def _around(
        self,
        fn: Callable[P, R],
        *,
        idempotency_key: Callable[[Any], Any],
        writes: Callable[[Any], list[str]] | None = None,
    ) -> Action[P, R]:
        """A new action configured as this one, around ``fn``: a function of the same name,
        signature and docstring (another environment's copy of the tool this action was built
        from), keyed by ``idempotency_key``, with ``writes`` in place of this one's scope
        function when given, this one's checks (lists of its own) and no undo registered yet.

        Environments that build the same actions for every trial copy one made once, instead
        of reading each function again (a few microseconds an action).
        """
        if writes is not None and not callable(self.writes):
            raise ConfigurationError(
                f"{self.name}: only an action whose writes is a function takes another"
            )
        new: Action[P, R] = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        new.fn = new.__wrapped__ = fn  # type: ignore[attr-defined]
        new.idempotency_key = idempotency_key
        if writes is not None:
            new.writes = writes
        new.preconditions, new.postconditions = list(self.preconditions), list(self.postconditions)
        new.compensate = new.undo_check = new.recovered_result = None
        return new

    # --- registration ---
    def _registrable(self, fn: Check, role: str) -> str:
        name = str(getattr(fn, "__name__", role))
        if not callable(fn):
            raise ConfigurationError(f"{self.name}.{role} takes a function of ctx")
        if not self.is_async and inspect.iscoroutinefunction(fn):
            raise ConfigurationError(
                f"{role} {name!r} is async but the action {self.name!r} is sync; "
                "make the action async def, or the function sync"
            )
        return name

    def precondition(self, fn: Check) -> Check:
        """Register a check run against live state before execution (False: not executed)."""
        self.preconditions.append((self._registrable(fn, "precondition"), fn))
        return fn

    def postcondition(self, fn: Check) -> Check:
        """Register a check run against observed state after execution (False: ``silent``)."""
        self.postconditions.append((self._registrable(fn, "postcondition"), fn))
        return fn

    def recover(self, fn: Check) -> Check:
        """Register how to rebuild the result from the observed state.

        Used when the effect is verified present but the tool's answer was lost (the call
        raised after acting, or the process died before the outcome was recorded), so the agent
        still gets a result. Without it, such a call returns None.
        """
        self._registrable(fn, "recover")
        self.recovered_result = fn
        return fn

    def compensation(self, fn: Check) -> Check:
        """Register the undo, run to restore ``ctx.before`` when the action must be reverted."""
        self._registrable(fn, "compensation")
        if self.compensate is not None:
            raise ConfigurationError(f"action {self.name!r} already has a compensation")
        self.compensate = fn
        return fn

    def compensation_check(self, fn: Check) -> Check:
        """Register how the undo is judged, for undo by a reversing entry.

        Append-only systems (ledgers, payments, tickets) undo by adding a refund, not by
        restoring the old row, so "the state equals ``ctx.before``" cannot hold. With this
        check, a compensation is verified by the check instead (a function of ``ctx`` run after
        the compensation, reading ``ctx.state``; e.g. "the net balance change is zero"), and
        the record says the undo was semantic.
        """
        name = self._registrable(fn, "compensation_check")
        if self.undo_check is not None:
            raise ConfigurationError(f"action {self.name!r} already has a compensation check")
        self.undo_check = (name, fn)
        return fn

    # --- schema ---
    @property
    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the arguments."""
        if self._schema is None:
            schema = self.model.model_json_schema()
            schema.pop("title", None)
            for prop in schema.get("properties", {}).values():
                prop.pop("title", None)
            self._schema = schema
        return self._schema

    @property
    def openai_tool(self) -> dict[str, Any]:
        """The action in OpenAI's function-calling format."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.schema,
            },
        }

    @property
    def compensable(self) -> bool:
        """Whether the action can be undone."""
        return self.compensate is not None

    @property
    def safe_to_repeat(self) -> bool:
        """Whether running it again after an unknown outcome cannot apply the effect twice."""
        return self.idempotent or self.idempotency_key is not None

    @property
    def identity(self) -> str:
        """Where the tool function is defined (``module.qualname``): what tells two actions of
        the same name apart."""
        fn = getattr(self.fn, "__func__", self.fn)
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"

    # --- per call ---
    def encode_args(self, model: BaseModel, values: dict[str, Any] | None = None) -> str:
        """The arguments as stored JSON, checked to come back equal on resume.

        Plain JSON values are stored as they are. Others go through pydantic's JSON mode
        (``datetime``, ``Decimal``, ``UUID``, enums...) and must validate back to the same
        arguments; text must be storable (no lone surrogates).

        Raises:
            InvalidArguments: a value cannot be stored so that it comes back the same; nothing
                has run.
        """
        if values is None:
            values = self.call_values(model)
        if _plain(values):
            text = dumps(values)
        else:
            data = self._dump_args(model)
            try:
                same = self.model.model_validate(data) == model
            except Exception as exc:  # pydantic cannot re-read the value
                raise InvalidArguments(
                    self.name, [f"the arguments cannot be stored as JSON ({exc})"]
                ) from None
            if not same:
                bad = [
                    n
                    for n in self.arg_names
                    if getattr(self.model.model_validate(data), n) != values[n]
                ]
                raise InvalidArguments(
                    self.name,
                    [
                        f"{n}: a {type(values[n]).__name__} value would not come back the same "
                        "from the record (resume would call with something else); annotate the "
                        "argument with its type, or pass JSON values (str keys)"
                        for n in bad
                    ],
                )
            text = dumps(data)
        if not encodable(text):
            raise InvalidArguments(
                self.name, ["the arguments hold text that is not valid Unicode (lone surrogates)"]
            )
        return text

    def encode_result(self, result: Any) -> str:
        """The result as stored JSON, checked to come back equal on resume (see
        :meth:`decode_result`); raises ``TypeError`` naming the fix when it would not."""
        if result is None:
            return "null"
        if _plain(result):
            text = dumps(result)
        else:
            try:
                adapter = self._result_adapter()
                data = adapter.dump_python(result, mode="json")
                back = adapter.validate_python(data)
            except Exception as exc:
                raise TypeError(_not_json(result, exc, self.returns)) from None
            if back != result:
                raise TypeError(
                    f"a {type(result).__name__} result would come back from the record as "
                    f"{type(back).__name__} {back!r:.60}; annotate the tool's return type "
                    f"(-> {type(result).__name__}) or return JSON values (str keys)"
                )
            text = dumps(data)
        if not encodable(text):
            raise TypeError("it holds text that is not valid Unicode (lone surrogates)")
        return text

    def decode_result(self, data: Any) -> Any:
        """A stored result as the tool returned it (typed by its return annotation)."""
        if data is None or self.returns is None:
            return data
        return self._result_adapter().validate_python(data)

    def _result_adapter(self) -> TypeAdapter[Any]:
        if self.returns is None:
            return _any_adapter()
        adapter = self.__dict__.get("_adapter")
        if adapter is None:
            adapter = self.__dict__["_adapter"] = TypeAdapter(
                self.returns, config=None if _is_model(self.returns) else _RESULT_CONFIG
            )
        return adapter

    def validate(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> BaseModel:
        """Bind and validate a call's arguments; raises :class:`InvalidArguments`."""
        if len(args) > len(self.arg_names):
            raise InvalidArguments(
                self.name, [f"takes {len(self.arg_names)} arguments, {len(args)} given"]
            )
        values = dict(zip(self.arg_names, args, strict=False))
        for k, v in kwargs.items():
            if k in values:
                raise InvalidArguments(self.name, [f"{k}: given twice"])
            values[k] = v
        return self.validate_mapping(values)

    def validate_mapping(self, values: dict[str, Any]) -> BaseModel:
        """Validate arguments given as a mapping (as an LLM's tool call gives them)."""
        try:
            return self.model.model_validate(values)
        except ValidationError as exc:
            errors = [
                f"{'.'.join(str(p) for p in e['loc']) or '(arguments)'}: {e['msg']}"
                for e in exc.errors()
            ]
            raise InvalidArguments(self.name, errors) from None

    def call_values(self, model: BaseModel) -> dict[str, Any]:
        """Keyword arguments for the tool function."""
        return {n: getattr(model, n) for n in self.arg_names}

    def key_for(self, model: BaseModel) -> str:
        """The idempotency key: the key function's value, or a hash of name and arguments.

        Raises:
            ConfigurationError: the key function raised, or returned something other than a
                non-empty string.
        """
        if self.idempotency_key is not None:
            try:
                key = self.idempotency_key(model)
            except Exception as exc:
                raise ConfigurationError(
                    f"the idempotency_key of action {self.name!r} raised "
                    f"{type(exc).__name__}: {exc}; nothing ran. Fix the key function: it "
                    "receives the validated arguments (a.order_id, ...)"
                ) from exc
            if not isinstance(key, str) or not key:
                raise ConfigurationError(
                    f"the idempotency_key of action {self.name!r} returned {key!r}; nothing ran. "
                    "It must return a non-empty string naming the effect, e.g. "
                    "idempotency_key=lambda a: f'{a.order_id}'"
                )
            return f"{self.name}:{key}"
        text = canonical(self._dump_args(model))
        return f"{self.name}:{hashlib.sha256(text.encode()).hexdigest()[:32]}"

    def _dump_args(self, model: BaseModel) -> Any:
        """The arguments as JSON data (pydantic's JSON mode).

        Raises:
            InvalidArguments: pydantic cannot serialize them (a value with no JSON form, a
                cycle, nesting deeper than it goes); nothing has run.
        """
        try:
            return model.model_dump(mode="json")
        except Exception as exc:  # (RecursionError too: nesting past the stack)
            text = str(exc)
            if isinstance(exc, RecursionError) or "depth" in text:
                problem = (
                    "the arguments are nested too deep to be stored (at most about 250 levels "
                    "of lists and dicts); pass flatter values"
                )
            elif "Circular reference" in text:
                problem = "the arguments hold a cycle (a value that contains itself)"
            else:
                problem = f"the arguments cannot be stored as JSON ({exc})"
            raise InvalidArguments(self.name, [problem]) from None

    def scope(self, model: BaseModel, values: dict[str, Any] | None = None) -> list[str]:
        """The resolved ``writes`` patterns for this call (``values``: its
        :meth:`call_values`, when the caller has them already)."""
        if self._static_scope is not None:
            return self._static_scope
        if self.writes is None:
            return []
        if callable(self.writes):
            # The function's patterns are the developer's: argument values in them glob unless
            # escaped (hx.escape_glob).
            try:
                patterns = self.writes(model)
            except Exception as exc:
                raise ConfigurationError(
                    f"the writes function of action {self.name!r} raised "
                    f"{type(exc).__name__}: {exc}; nothing ran. Fix the function: it receives "
                    "the validated arguments"
                ) from exc
            if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
                raise ConfigurationError(
                    f"the writes function of action {self.name!r} returned {patterns!r}; it must "
                    "return a list of resource patterns, e.g. [f'orders/{escape_glob(a.id)}']"
                )
            return list(patterns)
        if values is None:
            values = self.call_values(model)
        # Argument values are literals: a value "*" names the resource "*", it does not widen
        # the scope. Only the pattern the developer wrote may glob.
        literal = {
            k: (escape_glob(v) if type(v) is str else v if type(v) in _PLAIN_ATOMS else _Literal(v))
            for k, v in values.items()
        }
        return [w.format_map(literal) for w in self.writes]

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        episode = CURRENT_EPISODE.get()
        if episode is None:
            raise NotInEpisode(self.name, open_elsewhere=len(OPEN_EPISODES))
        return episode.call(self, args, kwargs)  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"<action {self.name}>"


# The overloads repeat Action's options so type checkers see both forms of the decorator
# (@hx.action and @hx.action(...)); the options themselves are defined once, on Action.
@overload
def action(
    fn: Callable[P, R],
    /,
    *,
    writes: Writes | None = None,
    idempotency_key: Callable[[Any], Any] | None = None,
    idempotent: bool = False,
    idempotency_scope: str = "episode",
    retry: Retry | None = None,
    timeout: float | None = None,
    pivot: bool = False,
    approval: bool | Check = False,
    name: str | None = None,
    description: str | None = None,
) -> Action[P, R]: ...


@overload
def action(
    fn: None = None,
    /,
    *,
    writes: Writes | None = None,
    idempotency_key: Callable[[Any], Any] | None = None,
    idempotent: bool = False,
    idempotency_scope: str = "episode",
    retry: Retry | None = None,
    timeout: float | None = None,
    pivot: bool = False,
    approval: bool | Check = False,
    name: str | None = None,
    description: str | None = None,
) -> Callable[[Callable[P, R]], Action[P, R]]: ...


def action(
    fn: Callable[P, R] | None = None,
    /,
    *,
    writes: Writes | None = None,
    idempotency_key: Callable[[Any], Any] | None = None,
    idempotent: bool = False,
    idempotency_scope: str = "episode",
    retry: Retry | None = None,
    timeout: float | None = None,
    pivot: bool = False,
    approval: bool | Check = False,
    name: str | None = None,
    description: str | None = None,
) -> Action[P, R] | Callable[[Callable[P, R]], Action[P, R]]:
    """Make a tool function (sync or ``async def``) a transactional action.

    Args:
        writes: resource patterns the action may change, with ``{arg}`` templates
            (``["orders/{order_id}"]``), or a function of the arguments returning them. Omitted:
            the action is read-only, and any change it makes is a ``scope`` failure.
        idempotency_key: a function of the arguments giving the key that identifies the effect;
            the tool is trusted to apply a key at most once, so retries are safe.
        idempotent: the tool can run twice with the same effect as once.
        idempotency_scope: where a committed key answers for the call: ``"episode"`` (the
            default: within the episode, also after a resume) or ``"store"`` (in every episode
            of the store, e.g. an agent retried as a new episode). A store-wide key committed
            with other arguments is ``IdempotencyConflict``; one whose call has not committed
            yet is :class:`~harness.errors.KeyInFlight`; nothing runs in either case.
        retry: retry settings for this action (default: the policy's).
        timeout: seconds an attempt may take before it is a ``fail_slow`` failure.
        pivot: the point of no return: after it commits, failures escalate instead of rolling
            back.
        approval: hold each call for a person before it runs (``True``), or the calls for which
            a function of ``ctx`` says so. The request is bound to the call's exact arguments;
            once approved (``Store.resolve``), the resumed episode runs that call once.
        name: the tool name (default: the function's name).
        description: the tool description (default: the docstring's summary).
    """

    def wrap(f: Callable[P, R]) -> Action[P, R]:
        if isinstance(f, Action):
            raise ConfigurationError(f"{f.name!r} is already an action")
        if not callable(f):
            raise ConfigurationError(f"@action decorates functions, not {type(f).__name__}")
        return Action(
            f,
            writes=writes,
            idempotency_key=idempotency_key,
            idempotent=idempotent,
            idempotency_scope=idempotency_scope,
            retry=retry,
            timeout=timeout,
            pivot=pivot,
            approval=approval,
            name=name,
            description=description,
        )

    if fn is not None:
        return wrap(fn)
    return wrap


class ContextExecutor(concurrent.futures.ThreadPoolExecutor):
    """A thread pool whose tasks run in a copy of the submitter's context, as
    ``asyncio.to_thread`` runs them: an action called in a task belongs to the submitter's
    episode.

    A plain ``ThreadPoolExecutor`` (and so ``loop.run_in_executor`` with one) starts each task
    in an empty context, where no episode is current. Hand this one to a framework that takes
    an executor. An episode entered while an event loop runs makes one the loop's default
    executor when the loop has none yet, so ``loop.run_in_executor(None, ...)`` carries the
    episode too.
    """

    def submit(
        self, fn: Callable[..., R], /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[R]:
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)


def current_context() -> Context | None:
    """The transaction context of the tool running now (to pass its idempotency key on)."""
    return ACTIVE_CALL.get()


AsyncTool = Callable[..., Awaitable[Any]]

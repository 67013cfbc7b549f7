"""OpenTelemetry traces of episodes and transactions (the ``[otel]`` extra).

Tracing is opt-in: ``import harness`` never imports OpenTelemetry, and until
:func:`instrument` is called the engine's cost is one check per hook::

    from harness.integrations import otel

    otel.instrument()  # the global tracer provider; or instrument(tracer_provider=provider)

Then every episode opened is a span, ``harness.episode`` (current while the episode is open,
so spans a framework starts inside it are its children), and every call of an action is a span
following OpenTelemetry's GenAI conventions for tool execution: named ``execute_tool {name}``,
kind ``INTERNAL``, a child of the span current where the call was made (an agent framework's
run span, say; the episode's span when the calling thread has none), with:

==============================  =================================================================
attribute                       value
==============================  =================================================================
``gen_ai.operation.name``       ``execute_tool``
``gen_ai.tool.name``            the action's name
``gen_ai.tool.type``            ``function``
``gen_ai.tool.description``     the action's description
``gen_ai.tool.call.id``         the model's tool call id, when the adapter knows it
                                (:func:`harness.observe.tool_call`)
``harness.episode.id``          the episode
``harness.txn.id``              the transaction (absent when the call never became one)
``harness.idempotency_key``     its idempotency key
``harness.txn.status``          ``committed``, ``recovered``, ``precondition``, ``check_error``,
                                ``held``, ``failed``, ``invalid``, ``in_doubt``, ``recorded``
                                (answered from the record: nothing ran) or ``error``
``harness.failure_class``       ``precondition``, ``fail_stop``, ``silent``, ``scope``... on failure
``harness.decision``            the policy's decision on failure: ``continue``, ``rollback``...
``harness.attempts``            attempts made
``harness.step``                the checkpoint step a committed write reached
``harness.escalation.id``       the escalation raised, if any
``error.type``                  the exception's qualified name, when the call raised
==============================  =================================================================

A call that raises (refused, failed, escalated) has status ``ERROR`` and an ``exception``
event; each retry is a ``harness.retry`` event. Each compensation (undoing a failed attempt, or
a committed call when the episode rolls back) is a span ``compensate {name}``, a child of the
span current then (the failing call's span, when the policy rolled the episode back), with
``harness.txn.id`` of the call it undoes, ``harness.rollback`` (true when it undoes a committed
call) and ``harness.compensation.semantic``; a failed undo has status ``ERROR``. The episode's
span carries ``harness.episode.id``, ``harness.run.id``, ``harness.task.id``,
``harness.trial``, ``harness.episode.resume`` and, when it ends, ``harness.episode.outcome``
and ``harness.episode.steps``; it has status ``ERROR`` when the outcome is ``failed``.

While instrumented, every line of the episode's JSON-lines log carries ``trace_id`` and
``span_id`` (hex, as OpenTelemetry's log data model writes them) of the span current where the
line was written (the episode's span when there is none), so logs and traces join.

Arguments and results may be sensitive, so they are recorded only with
``instrument(capture_content=True)`` (``gen_ai.tool.call.arguments`` and
``gen_ai.tool.call.result``, as JSON). A run's worker processes trace only if they call
:func:`instrument` themselves.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Generator
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode

from .. import observe
from .._version import __version__
from ..errors import ConfigurationError, IdempotencyConflict, InvalidArguments

__all__ = ["instrument", "instrumented", "uninstrument"]

Steps = Generator[Any, Any, Any]

# The traced call running in this context (a transaction starting finds its span here).
_CALL: contextvars.ContextVar[_CallSpan | None] = contextvars.ContextVar(
    "harness_otel_call", default=None
)


def _qualname(exc: BaseException) -> str:
    """``error.type``: the exception's canonical name (module and class)."""
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _attach(span: Span) -> tuple[Any, otel_context.Context]:
    """Make ``span`` current in this context; returns what :func:`_detach` needs."""
    ctx = trace.set_span_in_context(span)
    return otel_context.attach(ctx), ctx


def _detach(token: Any, ctx: otel_context.Context) -> None:
    """Undo :func:`_attach`, only where it was done (a generator abandoned and closed by the
    garbage collector runs its ``finally`` elsewhere, where there is nothing to undo)."""
    if otel_context.get_current() is ctx:
        otel_context.detach(token)


class _TracedLog:
    """The episode's structured log, each line stamped with the current span's ids."""

    __slots__ = ("_fallback", "_last", "_log")

    def __init__(self, log: Any, fallback: SpanContext) -> None:
        self._log = log
        self._fallback = fallback
        self._last: tuple[int, str, str] = (0, "", "")  # a span id and the hex ids, as sent

    def _stamp(self, fields: dict[str, Any]) -> dict[str, Any]:
        found = trace.get_current_span().get_span_context()
        if not found.is_valid:
            found = self._fallback
            if not found.is_valid:
                return fields
        last = self._last
        if last[0] != found.span_id:
            last = (found.span_id, format(found.trace_id, "032x"), format(found.span_id, "016x"))
            self._last = last
        fields.setdefault("trace_id", last[1])
        fields.setdefault("span_id", last[2])
        return fields

    def later(self, event: str, **fields: Any) -> None:
        """Queue one info line (stamped now, not when it is sent)."""
        self._log.later(event, **self._stamp(fields))

    def debug(self, event: Any = None, *args: Any, **fields: Any) -> Any:
        """A debug line."""
        return self._log.debug(event, *args, **self._stamp(fields))

    def info(self, event: Any = None, *args: Any, **fields: Any) -> Any:
        """An info line."""
        return self._log.info(event, *args, **self._stamp(fields))

    def warning(self, event: Any = None, *args: Any, **fields: Any) -> Any:
        """A warning line."""
        return self._log.warning(event, *args, **self._stamp(fields))

    def error(self, event: Any = None, *args: Any, **fields: Any) -> Any:
        """An error line."""
        return self._log.error(event, *args, **self._stamp(fields))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


class _EpisodeSpan:
    """An open episode's span (the episode keeps it, and closes it when it ends)."""

    __slots__ = ("context", "episode", "span", "token", "tracing")

    def __init__(self, tracing: _Tracing, episode: Any, span: Span) -> None:
        self.tracing = tracing
        self.episode = episode
        self.span = span
        self.token, self.context = _attach(span)

    def close(self, error: BaseException | None) -> None:
        """Record how the episode ended, end its span, and make the caller's span current."""
        ep, span = self.episode, self.span
        try:
            span.set_attribute("harness.episode.outcome", str(ep.outcome))
            span.set_attribute("harness.episode.steps", ep.steps)
            if ep.escalation_id is not None:
                span.set_attribute("harness.escalation.id", ep.escalation_id)
            if error is not None:
                span.record_exception(error)
                span.set_attribute("error.type", _qualname(error))
            if ep.outcome == "failed":
                why = f"{type(error).__name__}: {error}" if error is not None else "failed"
                span.set_status(Status(StatusCode.ERROR, why))
        finally:
            self.tracing.forget(ep.id, self)
            _detach(self.token, self.context)
            span.end()


class _CallSpan:
    """One call's span; its transaction's recorder reports the outcome to it. Attributes are
    gathered and set once, when the call ends (each ``set_attribute`` takes the span's lock)."""

    __slots__ = ("attributes", "episode_id", "finished", "span", "txn")

    def __init__(self, span: Span, episode_id: str) -> None:
        self.span = span
        self.episode_id = episode_id
        self.txn: Any = None
        self.attributes: dict[str, Any] = {}
        self.finished = False

    # --- what the recorder reports (harness.observe.CallObservation) ---
    def refused(self, status: str, failure_class: str, decision: str, reason: str) -> None:
        """Nothing ran: a precondition refused it, or it is held for a person."""
        self._decided(status, failure_class, decision, reason)

    def failed(self, status: str, failure_class: str, decision: str, reason: str) -> None:
        """It ran and did not commit."""
        self._decided(status, failure_class, decision, reason)

    def _decided(self, status: str, failure_class: str, decision: str, reason: str) -> None:
        self.attributes.update(
            {
                "harness.txn.status": str(status),
                "harness.failure_class": str(failure_class),
                "harness.decision": str(decision),
                "harness.reason": reason,
            }
        )

    def committed(self, status: str, step: int | None) -> None:
        """It committed."""
        self.attributes["harness.txn.status"] = str(status)
        if step is not None:
            self.attributes["harness.step"] = step

    def retrying(self, attempt: int, wait: float, error: BaseException | None) -> None:
        """An attempt failed; another follows."""
        event: dict[str, Any] = {"harness.attempt": attempt, "harness.retry.wait": wait}
        if error is not None:
            event["error.type"] = _qualname(error)
            event["exception.message"] = str(error)
        self.span.add_event("harness.retry", event)

    def escalated(self, escalation_id: str) -> None:
        """A person is asked."""
        self.attributes["harness.escalation.id"] = escalation_id

    # --- the call's end ---
    def finish(self, error: BaseException | None, capture: bool) -> None:
        """Set the outcome's attributes and status (the caller ends the span). A record
        reported after this (a call the store refused, recorded later) is not the span's."""
        self.finished = True
        span, txn, attributes = self.span, self.txn, self.attributes
        if txn is not None:
            ctx = txn.ctx
            attributes["harness.txn.id"] = ctx.txn_id
            attributes["harness.idempotency_key"] = ctx.idempotency_key
            attributes["harness.mutating"] = bool(txn.action.mutating)
            attributes["harness.attempts"] = ctx.attempt
            if capture:
                attributes["gen_ai.tool.call.arguments"] = txn.args_json or "{}"
        if error is None:
            attributes.setdefault("harness.txn.status", "recorded")
            if capture and txn is not None:
                attributes["gen_ai.tool.call.result"] = txn.result_json
            span.set_attributes(attributes)
            return
        if "harness.txn.status" not in attributes:
            if isinstance(error, (InvalidArguments, IdempotencyConflict)):
                attributes["harness.txn.status"] = "invalid"
            elif txn is not None and txn.action.mutating and txn.intended and not txn.recorded:
                attributes["harness.txn.status"] = "in_doubt"
            else:
                attributes["harness.txn.status"] = "error"
        for name, value in (
            ("harness.failure_class", getattr(error, "failure_class", None)),
            ("harness.decision", getattr(error, "decision", None)),
            ("harness.escalation.id", getattr(error, "escalation_id", None)),
        ):
            if isinstance(value, str):
                attributes.setdefault(name, value)
        attributes["error.type"] = _qualname(error)
        span.set_attributes(attributes)
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


class _Tracing:
    """The observer :func:`instrument` installs (:class:`harness.observe.Observer`)."""

    def __init__(self, tracer: trace.Tracer, *, capture_content: bool) -> None:
        self.tracer = tracer
        self.capture_content = capture_content
        self._episodes: dict[str, _EpisodeSpan] = {}
        self._lock = threading.Lock()

    # --- episodes ---
    def episode(self, episode: Any) -> _EpisodeSpan:
        """An episode opened: its span starts and becomes current; its log carries ids."""
        attributes: dict[str, Any] = {
            "harness.episode.id": episode.id,
            "harness.episode.resume": bool(episode.resume),
        }
        for name, value in (
            ("harness.run.id", episode.run_id),
            ("harness.task.id", episode.task_id),
            ("harness.trial", episode.trial),
        ):
            if value is not None:
                attributes[name] = value
        span = self.tracer.start_span(
            "harness.episode", kind=SpanKind.INTERNAL, attributes=attributes
        )
        observed = _EpisodeSpan(self, episode, span)
        recorder = episode.recorder
        recorder.log = _TracedLog(recorder.log, span.get_span_context())
        with self._lock:
            self._episodes[episode.id] = observed
        return observed

    def forget(self, episode_id: str, observed: _EpisodeSpan) -> None:
        """An episode closed."""
        with self._lock:
            if self._episodes.get(episode_id) is observed:
                del self._episodes[episode_id]

    def _parent(self, episode_id: str, observed: Any) -> otel_context.Context | None:
        """The context a span starts in: the current one, or, where no span is current (a
        thread started without the caller's context), the episode's span."""
        if trace.get_current_span().get_span_context().is_valid:
            return None
        if observed is None:
            with self._lock:
                observed = self._episodes.get(episode_id)
        if isinstance(observed, _EpisodeSpan):
            return trace.set_span_in_context(observed.span)
        return None

    # --- calls ---
    def call(self, episode: Any, observed: Any, action: Any, steps: Steps) -> Steps:
        """One call of ``action``: the steps run inside its span."""
        return self._call(episode.id, observed, action, steps)

    def _call(self, episode_id: str, observed: Any, action: Any, steps: Steps) -> Steps:
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": action.name,
            "gen_ai.tool.type": "function",
            "harness.episode.id": episode_id,
        }
        if action.description:
            attributes["gen_ai.tool.description"] = action.description
        call_id = observe.current_tool_call()
        if call_id:
            attributes["gen_ai.tool.call.id"] = call_id
        span = self.tracer.start_span(
            f"execute_tool {action.name}",
            context=self._parent(episode_id, observed),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
        )
        call = _CallSpan(span, episode_id)
        token, ctx = _attach(span)
        current = _CALL.set(call)
        try:
            result = yield from steps
        except BaseException as exc:
            call.finish(exc, self.capture_content)
            raise
        else:
            call.finish(None, self.capture_content)
            return result
        finally:
            with contextlib.suppress(ValueError):  # (closed elsewhere: nothing to reset)
                _CALL.reset(current)
            _detach(token, ctx)
            span.end()

    def transaction(self, txn: Any) -> _CallSpan | None:
        """The call running in this context became a transaction: its ids go on its span."""
        call = _CALL.get()
        ctx = txn.ctx
        if (
            call is None
            or call.txn is not None
            or call.finished
            or call.episode_id != ctx.episode_id
        ):
            return None
        call.txn = txn
        return call

    # --- compensations ---
    def compensation(self, action: Any, ctx: Any, steps: Steps) -> Steps:
        """A compensation: its steps run inside its span."""
        return self._compensation(action, ctx, steps)

    def _compensation(self, action: Any, ctx: Any, steps: Steps) -> Steps:
        call = _CALL.get()
        undoing_a_commit = call is None or call.txn is None or call.txn.ctx.txn_id != ctx.txn_id
        span = self.tracer.start_span(
            f"compensate {action.name}",
            context=self._parent(ctx.episode_id, None),
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.tool.name": action.name,
                "harness.episode.id": ctx.episode_id,
                "harness.txn.id": ctx.txn_id,
                "harness.idempotency_key": ctx.idempotency_key,
                "harness.rollback": undoing_a_commit,
            },
        )
        token, context = _attach(span)
        try:
            semantic = yield from steps
        except BaseException as exc:
            span.set_attribute("error.type", _qualname(exc))
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            raise
        else:
            span.set_attribute("harness.compensation.semantic", bool(semantic))
            return semantic
        finally:
            _detach(token, context)
            span.end()


def instrument(
    tracer_provider: trace.TracerProvider | None = None, *, capture_content: bool = False
) -> None:
    """Trace every episode opened and every call of an action made from now on.

    Args:
        tracer_provider: where spans go (default: OpenTelemetry's global tracer provider,
            as ``trace.set_tracer_provider`` sets it, now or later).
        capture_content: also record each call's arguments and result as JSON
            (``gen_ai.tool.call.arguments``, ``gen_ai.tool.call.result``); they may hold
            personal or secret data, so this is off by default.

    Raises:
        ConfigurationError: ``tracer_provider`` is not an OpenTelemetry ``TracerProvider``.
    """
    if tracer_provider is not None and not isinstance(tracer_provider, trace.TracerProvider):
        raise ConfigurationError(
            f"otel.instrument(tracer_provider=...) takes an OpenTelemetry TracerProvider "
            f"(opentelemetry.sdk.trace.TracerProvider()), not a {type(tracer_provider).__name__}"
        )
    tracer = trace.get_tracer("harness", __version__, tracer_provider=tracer_provider)
    observe.install(_Tracing(tracer, capture_content=capture_content))


def uninstrument() -> None:
    """Stop tracing new episodes and calls (open episodes' spans still end when they do)."""
    if isinstance(observe.installed(), _Tracing):
        observe.uninstall()


def instrumented() -> bool:
    """Whether :func:`instrument` is in effect."""
    return isinstance(observe.installed(), _Tracing)

"""The toolboxes trials use: with transactions (the default), or with the tools called bare.

:class:`RecordingToolbox` runs writes as transactions and records reads in the episode.
:class:`BareToolbox` calls every tool's own function, as a plain tau2 environment does: no
preconditions, postconditions, compensations or retries. Its calls are still recorded in the
episode (:meth:`Episode.remember`, kind :data:`BARE`, with the changes each made), so the trial
is judged on its final state like any other, resumed from its record and exported. A run picks
one with ``run_trials(..., transactions=False)``; ``harness compare`` then gives the paired
difference in pass^k between the two ways of calling the same tools.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._json import canonical, dumps, loads
from ..action import Action, as_json
from ..agents.base import (
    CallRecord,
    Session,
    Toolbox,
    ToolResult,
    call_request,
    environment_text,
)
from ..episode.cursor import REMEMBERED
from ..store import LogRow
from ..transaction import observed_changes

__all__ = [
    "BARE",
    "BareCall",
    "BareToolbox",
    "RecordingToolbox",
    "bare_calls",
    "bare_changes",
    "bare_writes",
    "make_toolbox",
]

BARE = "bare_call"
"""What a :class:`BareToolbox` remembers for each call of an action's function."""


def _result_data(result: ToolResult) -> dict[str, Any]:
    """A tool result as JSON. (The toolbox refuses a read whose value JSON cannot hold; a bare
    call's such value is kept as its text, as a plain tau2 environment shows it.)"""
    content = result.content
    try:
        dumps(content)
    except (TypeError, ValueError):
        try:
            content = as_json(content)
        except TypeError:
            content = json.dumps(content, default=str)
    return {
        "ok": result.ok,
        "content": content,
        "error": result.error,
        "kind": result.kind,
        "text": result.text,
    }


def _from_data(data: dict[str, Any]) -> ToolResult:
    return ToolResult(data["ok"], data["content"], data["error"], data["kind"], data.get("text"))


class RecordingToolbox(Toolbox):
    """A toolbox whose reads are part of the episode's record.

    Write tools run as transactions, as in :class:`Toolbox`. A read's result is remembered by
    the episode (:meth:`Episode.remember`), so on resume, and in a replay, the agent reads what
    it read the first time; a divergence from the record is raised, not turned into a tool
    result.
    """

    def call(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        requestor: str = "assistant",
    ) -> ToolResult:
        """Call a tool; reads are recorded (and answered from the record on resume)."""
        arguments = dict(arguments or {})
        tool = self.tools_of(requestor).get(name)
        if tool is not None and not isinstance(tool, Action):
            ran: list[ToolResult] = []

            def read() -> dict[str, Any]:
                ran.append(Toolbox.call(self, name, arguments, requestor=requestor))
                return _result_data(ran[0])

            request = call_request(name, arguments, requestor)
            data = self.episode.remember("read", request, read)
            if not ran:
                self.calls.append(
                    CallRecord(name, arguments, data["ok"], data["kind"], False, requestor)
                )
            return _from_data(data)
        result = super().call(name, arguments, requestor=requestor)
        if self.episode.diverged is not None:
            raise self.episode.diverged
        return result


def _run_bare(
    tool: Action[Any, Any], arguments: dict[str, Any]
) -> tuple[ToolResult, Exception | None]:
    """The action's own function on the model's arguments, as a plain environment calls it;
    with the exception it raised (None: it returned)."""
    try:
        value = tool.fn(**arguments)
        if inspect.iscoroutine(value):
            value = asyncio.run(value)
    except Exception as exc:  # the tool's own error is the answer, as tau2 gives it
        # Arguments that do not fit the function: tau2's environment answers those with
        # Python's words too (``Error: RetailTools.cancel_pending_order() got an unexpected
        # keyword argument 'x'``), with no prefix of ours.
        kind = "invalid" if isinstance(exc, TypeError) and not _fits(tool.fn, arguments) else None
        return ToolResult(False, error=f"{exc}", kind=kind or "tool_error"), exc
    return ToolResult(True, value), None


def _fits(fn: Any, arguments: dict[str, Any]) -> bool:
    """Whether ``arguments`` bind to ``fn``'s signature (True when it has none to read)."""
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError:
        return False
    except ValueError:
        return True
    return True


class BareToolbox(RecordingToolbox):
    """A toolbox that calls every tool bare: an action's own function (``Action.fn``), with no
    transaction around it.

    No precondition, postcondition, scope check, compensation or retry runs, and nothing is
    rolled back: an error the function raises is the agent's answer (``Error: <message>``, as
    tau2's environment words it), and whatever it changed before raising stays changed. The agent
    sees the same tools (names, schemas, descriptions) as with transactions.

    Each call is remembered in the episode (kind :data:`BARE`: the tool, the arguments, the
    result and the changes it made, key -> value after), so the record holds the whole trial: a
    resumed trial gets its recorded results and its state rebuilt from those changes
    (:func:`bare_changes`), and exports list the calls (:func:`bare_calls`). Reads are recorded
    as with :class:`RecordingToolbox`.
    """

    def call(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        *,
        requestor: str = "assistant",
    ) -> ToolResult:
        """Call a tool bare; the call and what it changed are recorded in the episode."""
        arguments = dict(arguments or {})
        tool = self.tools_of(requestor).get(name)
        if not isinstance(tool, Action):
            return super().call(name, arguments, requestor=requestor)
        state: Any = getattr(self.environment, "state", None)

        def run() -> dict[str, Any]:
            changes: dict[str, Any] = {}
            if state is None:
                result, error = _run_bare(tool, arguments)
            else:
                mark = state.mark()
                try:
                    result, error = _run_bare(tool, arguments)
                    changes = {k: v for k, (_, v) in observed_changes(state, mark).items()}
                finally:
                    state.release(mark)
            result.text = self._message(name, arguments, result, error)
            return {**_result_data(result), "changes": changes}

        data = self.episode.remember(BARE, call_request(name, arguments, requestor), run)
        self.calls.append(
            CallRecord(name, arguments, data["ok"], data["kind"], tool.mutating, requestor)
        )
        return _from_data(data)

    def _message(
        self, name: str, arguments: dict[str, Any], result: ToolResult, error: Exception | None
    ) -> str | None:
        """The environment's ``tool_message`` for a bare call (None: the default rendering);
        kept with the call's record, so a resumed trial shows the model the same words."""
        return environment_text(self.environment, name, arguments, result, error)


def make_toolbox(
    tools: dict[str, Any], episode: Session, environment: Any, *, transactions: bool = True
) -> RecordingToolbox:
    """The toolbox of one trial: :class:`RecordingToolbox`, or :class:`BareToolbox` when
    ``transactions`` is False."""
    cls = RecordingToolbox if transactions else BareToolbox
    return cls(tools, episode, environment)


@dataclass(frozen=True)
class BareCall:
    """One call a :class:`BareToolbox` recorded.

    Attributes:
        seq: its place in the episode's log.
        tool, arguments: what was called.
        ok, content, error, kind: its result.
        text: the environment's words for it, when it chose them (``tool_message``).
        requestor: who made it: ``assistant`` (the agent) or ``user`` (a user with tools).
        changes: what it changed: key -> value after (None: removed).
        ts: when it was recorded (Unix time).
    """

    seq: int
    tool: str
    arguments: dict[str, Any]
    ok: bool
    content: Any
    error: str | None
    kind: str | None
    changes: dict[str, Any]
    ts: float
    text: str | None = None
    requestor: str = "assistant"


def bare_calls(log: Iterable[LogRow]) -> list[BareCall]:
    """The bare calls an episode's log records, in order (none for a run with transactions)."""
    out = []
    for row in sorted(log, key=lambda r: r.seq):
        if row.kind != REMEMBERED:
            continue
        payload = loads(row.payload)
        if not isinstance(payload, dict) or payload.get("what") != BARE:
            continue
        request, value = payload.get("request") or {}, payload.get("value") or {}
        out.append(
            BareCall(
                seq=row.seq,
                tool=str(request.get("tool", "")),
                arguments=dict(request.get("arguments") or {}),
                ok=bool(value.get("ok")),
                content=value.get("content"),
                error=value.get("error"),
                kind=value.get("kind"),
                changes=dict(value.get("changes") or {}),
                ts=row.ts,
                text=value.get("text"),
                requestor=str(request.get("requestor") or "assistant"),
            )
        )
    return out


def bare_changes(calls: Iterable[BareCall]) -> dict[str, Any]:
    """The resources bare calls left changed: key -> value after (None: absent); later win."""
    out: dict[str, Any] = {}
    for call in calls:
        out.update(call.changes)
    return out


def bare_writes(calls: Iterable[BareCall], tools: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The writes bare calls made without an error: (tool, canonical arguments), as
    :func:`~harness.runs.judge.committed_calls` gives them for transactions."""
    out = []
    for call in calls:
        tool = tools.get(call.tool)
        if not call.ok or not isinstance(tool, Action) or not tool.mutating:
            continue
        try:
            values = tool.call_values(tool.validate_mapping(dict(call.arguments)))
        except Exception:
            values = call.arguments
        out.append((call.tool, canonical(values)))
    return out

"""The toolbox trials use: writes are transactions, and reads are part of the episode's record."""

from __future__ import annotations

import json
from typing import Any

from .._json import dumps
from ..action import Action
from ..agents.base import CallRecord, Toolbox, ToolResult

__all__ = ["RecordingToolbox"]


def _result_data(result: ToolResult) -> dict[str, Any]:
    """A tool result as JSON, its content as text when JSON cannot hold it (as a model reads it)."""
    content = result.content
    try:
        dumps(content)
    except (TypeError, ValueError):
        content = json.dumps(content, default=str)
    return {"ok": result.ok, "content": content, "error": result.error, "kind": result.kind}


class RecordingToolbox(Toolbox):
    """A toolbox whose reads are part of the episode's record.

    Write tools run as transactions, as in :class:`Toolbox`. A read's result is remembered by
    the episode (:meth:`Episode.remember`), so on resume, and in a replay, the agent reads what
    it read the first time; a divergence from the record is raised, not turned into a tool
    result.
    """

    def call(self, name: str, arguments: dict[str, Any] | None = None) -> ToolResult:
        """Call a tool; reads are recorded (and answered from the record on resume)."""
        arguments = dict(arguments or {})
        tool = self.tools.get(name)
        if tool is not None and not isinstance(tool, Action):
            ran: list[ToolResult] = []

            def read() -> dict[str, Any]:
                ran.append(Toolbox.call(self, name, arguments))
                return _result_data(ran[0])

            data = self.episode.remember("read", {"tool": name, "arguments": arguments}, read)
            if not ran:
                self.calls.append(CallRecord(name, arguments, data["ok"], data["kind"], False))
            return ToolResult(data["ok"], data["content"], data["error"], data["kind"])
        result = super().call(name, arguments)
        if self.episode.diverged is not None:
            raise self.episode.diverged
        return result

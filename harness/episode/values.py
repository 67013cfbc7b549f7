"""The episode's small values: what it remembers of a call, and helpers."""

from __future__ import annotations

import json
import reprlib
from dataclasses import dataclass, field
from typing import Any

from .._json import dumps, encodable, loads
from ..action import Action
from ..store.tables import txn_seq


@dataclass
class InDoubt:
    """An intent with no outcome, read back from the log on resume."""

    id: str
    action: str
    key: str
    args: dict[str, Any]
    before: dict[str, Any]
    ts: float  # when the call started (its intent's "started")
    seen: dict[str, Any] = field(default_factory=dict)  # before values its window saw change

    @property
    def seq(self) -> int:
        return txn_seq(self.id)

    @classmethod
    def from_log(cls, txn_id: str, payload: str, ts: float) -> InDoubt:
        data = loads(payload)
        return cls(
            txn_id,
            data["action"],
            data["key"],
            data.get("args") or {},
            data.get("before") or {},
            data.get("started", ts),
        )


@dataclass(slots=True)
class Committed:
    """A committed transaction as the episode remembers it (for dedup and rollback)."""

    txn_id: str
    action: str
    key: str
    result: Any
    args_json: str  # the arguments as recorded before the tool ran (a tool may change its own)
    before: dict[str, Any]
    diff: dict[str, tuple[Any, Any]]
    step: int | None
    mutating: bool
    compensated: bool = False
    impl: Action[Any, Any] | None = None
    result_json: str | None = None  # the result as recorded (each answer is decoded afresh)

    @property
    def args(self) -> dict[str, Any]:
        """The arguments, as recorded."""
        value: dict[str, Any] = loads(self.args_json)
        return value

    def result_for(self, action: Action[Any, Any]) -> Any:
        """The result as the tool returned it (typed by ``action``'s return), decoded afresh
        from the record each time: what one answer's receiver does with it changes no other."""
        if self.result_json is None:
            return self.result
        return action.decode_result(loads(self.result_json))


def _jsonable(value: Any) -> str:
    """JSON for the record whatever ``value`` is: storable text (lone surrogates escaped), or
    the value's repr when JSON cannot hold it (shortened, past a few levels of nesting, when
    it is nested too deep for even a repr)."""
    try:
        text = dumps(value)
    except (TypeError, ValueError):
        try:
            text = dumps(repr(value))
        except RecursionError:
            text = dumps(reprlib.repr(value))
    return text if encodable(text) else json.dumps(loads(text))


def dumps_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Arguments as JSON for the record, whatever they are."""
    return _jsonable({"args": list(args), "kwargs": kwargs})


def _missing_action(name: str) -> Action[Any, Any]:
    def missing() -> None:
        """An action whose implementation is not known to this episode."""

    return Action(missing, name=name, writes=["*"])

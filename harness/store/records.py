"""What the store's readers return: its rows with their JSON decoded, as pydantic models.

The tables keep JSON as text (the hot path writes it once, and the chain hashes exactly that
text); the records people read carry values: a transaction's ``diff`` is a mapping of resource
to ``[before, after]``, its ``result`` the tool's answer, its ``args`` a mapping. The raw rows
stay available (``Store.transaction_rows`` and the like) for code that checks the text itself.
A column that does not hold valid JSON (an edit behind the store's back) is kept as its text.
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

from pydantic import BaseModel, ConfigDict

from .._json import loads_or
from ..errors import StoreError

__all__ = ["Escalation", "Transaction", "Trial", "trial_failures", "trial_steps"]


class _Record(BaseModel):
    """A row read back, with the columns named in ``_json`` decoded."""

    model_config = ConfigDict(frozen=True)
    _json: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def of(cls, row: Any) -> Self:
        """The record of a table row."""
        data = row.model_dump()
        for name in cls._json:
            data[name] = loads_or(data[name], None, keep_text=True)
        return cls(**data)


class Transaction(_Record):
    """One call of an action: what it was asked, what it did and what was decided.

    Attributes:
        args: the validated arguments.
        result: the tool's answer (None if it did not commit).
        before: the resources in its scope before it ran.
        diff: ``{resource: [before, after]}`` for each resource it changed.
        errors: every failed attempt's error.
    """

    _json = ("args", "result", "before", "diff", "errors")

    episode_id: str
    seq: int
    id: str
    action: str
    idem_key: str
    args: Any
    status: str
    mutating: bool = True
    failure_class: str | None = None
    decision: str | None = None
    reason: str | None = None
    result: Any = None
    before: Any = None
    diff: Any = None
    attempts: int = 0
    errors: Any = None
    started_at: float
    ended_at: float | None = None
    duration: float | None = None
    step: int | None = None


class Escalation(_Record):
    """A call held for a person, and what they decided.

    Attributes:
        args: the arguments the call was made with.
        evidence: what the failure left to judge it by.
        edit: the arguments a person chose instead (``edited``).
    """

    _json = ("args", "evidence", "edit")

    id: str
    episode_id: str
    txn_id: str
    action: str
    idem_key: str
    args: Any
    failure_class: str
    reason: str
    evidence: Any
    status: str
    created_at: float
    deadline: float | None = None
    fallback: str
    resolved_by: str | None = None
    resolved_at: float | None = None
    resolution_reason: str | None = None
    edit: Any = None


class Trial(_Record):
    """One trial of a task in a run: its verdict and the evidence behind it.

    Attributes:
        failures: failed calls by failure class.
        steps: the agent's steps.
        verdict: the verifier's output.
        agent_meta: what the agent reported (model, tokens, ...).
    """

    _json = ("failures", "steps", "verdict", "agent_meta")

    id: str
    run_id: str
    task_id: str
    task_version: str = "1"
    trial: int
    seed: int
    episode_id: str
    passed: bool = False
    partial: float | None = None
    outcome: str
    infra_error: bool = False
    failures: Any = None
    steps: Any = None
    message: str = ""
    verdict: Any = None
    agent_meta: Any = None
    duration: float = 0.0
    created_at: float


def _edited(row: Any, what: str, shape: str, got: Any) -> StoreError:
    shown = repr(got)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return StoreError(
        f"trial {row.id}: its {what} are not what the harness writes ({shape}; the row holds "
        f"{shown}): the row was edited, or written by something else; nothing was read from "
        "it. `harness verify` names what else was changed"
    )


def trial_failures(row: Any) -> dict[str, int]:
    """A trial row's failed calls by failure class, as the harness writes them.

    Raises:
        StoreError: they are not an object of counts (the row was edited).
    """
    value = loads_or(row.failures or "{}", None)
    if not isinstance(value, dict) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value.values()
    ):
        raise _edited(row, "failures", "an object of counts by failure class", value)
    return {str(k): v for k, v in value.items()}


def trial_steps(row: Any) -> list[bool]:
    """A trial row's steps (each step passed or not), as the harness writes them.

    Raises:
        StoreError: they are not a list of true/false (the row was edited).
    """
    value = loads_or(row.steps or "[]", None)
    if not isinstance(value, list) or not all(isinstance(v, bool) for v in value):
        raise _edited(row, "steps", "a list of true or false", value)
    return value

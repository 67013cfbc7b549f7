"""Judging a trial: what the task's reference actions do, and the suite's verifier on the state.

A trial passes only on verified external state: the changes it left are compared with what the
reference actions produce on a fresh environment, by the verifier its suite names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._json import canonical, loads
from ..action import Action
from ..store import TransactionRow
from ..store.statuses import APPLIED
from ..suite import Reference, Suite, Task, Verification
from ..transaction import observed_changes

__all__ = ["Reference", "committed_calls", "judge", "plain", "reference_outcome", "steps_done"]


def plain(tool: Any) -> Callable[..., Any]:
    """The function behind a tool (an action's undecorated function)."""
    return tool.fn if isinstance(tool, Action) else tool


def reference_outcome(suite: Suite, task: Task) -> Reference:
    """What the task's reference actions do on a fresh environment (:meth:`Suite.reference`)."""
    return suite.reference(task)


def committed_calls(rows: Iterable[TransactionRow]) -> list[tuple[str, str]]:
    """The writes an episode committed: (action, canonical arguments)."""
    return [
        (t.action, canonical(loads(t.args))) for t in rows if t.mutating and t.status in APPLIED
    ]


def steps_done(reference: Reference, committed: Iterable[tuple[str, str]]) -> list[bool]:
    """For each reference write, whether the trial committed the same call."""
    pool = Counter(committed)
    done = []
    for call in reference.writes:
        if pool[call] > 0:
            pool[call] -= 1
            done.append(True)
        else:
            done.append(False)
    return done


def judge(
    suite: Suite,
    task: Task,
    reference: Reference,
    *,
    state: Any,
    mark: Any,
    rows: Sequence[TransactionRow],
    message: str,
    bare: Sequence[tuple[str, str]] = (),
) -> tuple[Verification, list[bool]]:
    """The suite's verdict on a trial's state (changed since ``mark``) and its required steps.

    ``bare``: the writes a trial with its tools called bare made without an error
    (:func:`~harness.runs.toolbox.bare_writes`), which count as committed ones do.
    """
    actual = {k: after for k, (_, after) in observed_changes(state, mark).items()}
    steps = steps_done(reference, [*committed_calls(rows), *bare])
    verdict = suite.verify(
        task, actual=actual, expected=reference.changes, message=message, state=state, steps=steps
    )
    return verdict, steps


# How a conversation with a simulated user may end and still be rewarded: as its user or its
# agent ended it. tau2 gives reward 0 to any other end (max_steps, too_many_errors,
# agent_error, user_error...), whatever state the conversation left.
REWARDED_ENDS = frozenset({"user_stop", "agent_stop"})


def premature_end(meta: Any) -> str | None:
    """The termination reason of a conversation cut short (None: not cut short, or no
    conversation): an agent that records ``termination_reason`` in its output's meta."""
    ended = meta.get("termination_reason") if isinstance(meta, dict) else None
    if isinstance(ended, str) and ended not in REWARDED_ENDS:
        return ended
    return None

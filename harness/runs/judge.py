"""Judging a trial: what the task's reference actions do, and the suite's verifier on the state.

A trial passes only on verified external state: the changes it left are compared with what the
reference actions produce on a fresh environment, by the verifier its suite names.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .._json import canonical, loads, loads_or
from ..action import Action
from ..agents.base import AgentOutput
from ..agents.judge import Judgement
from ..store import EpisodeStatus, TransactionRow, TrialRow
from ..store.records import trial_failures
from ..store.statuses import APPLIED
from ..suite import Reference, Suite, Task, Verification
from ..transaction import observed_changes

__all__ = [
    "AGENT_ERROR",
    "NL_CHECK",
    "REWARD_CHECK",
    "TRIAL_CLASSES",
    "AssessedVerdict",
    "FailedTrial",
    "Reference",
    "RewardVerdict",
    "classify_trial",
    "committed_calls",
    "judge",
    "plain",
    "reference_outcome",
    "steps_done",
    "trial_class",
    "trial_conversation",
    "with_assertions",
]

AGENT_ERROR: Final = "agent error"
"""The failure class of a trial whose agent raised (its ``failures`` count it once)."""


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
    environment: Any = None,
    calls: Callable[[], list[dict[str, Any]]] | None = None,
) -> tuple[Verification, list[bool]]:
    """The suite's verdict on a trial's state (changed since ``mark``) and its required steps.

    ``bare``: the writes a trial with its tools called bare made without an error
    (:func:`~harness.runs.toolbox.bare_writes`), which count as committed ones do.
    ``environment``: the trial's environment; one with ``reward(task, calls)`` scores the
    trial itself (tau2's environment reward), and the suite's verifier is not asked.
    ``calls``: gives every tool call of the trial's record, the agent's and the user's
    (:func:`~harness.runs.calls.record_calls`), which such an environment matches against the
    task's reference actions; asked only then.
    """
    steps = steps_done(reference, [*committed_calls(rows), *bare])
    reward = getattr(environment, "reward", None)
    if callable(reward):
        made = [] if calls is None else calls()
        return RewardVerdict(dict(reward(task, made)), partial_steps(task, steps)), steps
    actual = {k: after for k, (_, after) in observed_changes(state, mark).items()}
    verdict = suite.verify(
        task, actual=actual, expected=reference.changes, message=message, state=state, steps=steps
    )
    return verdict, steps


def partial_steps(task: Task, steps: Sequence[bool]) -> float | None:
    """The fraction of the reference's writes the trial made (None: none, or not asked)."""
    if task.partial_credit != "steps" or not steps:
        return None
    return sum(steps) / len(steps)


REWARD_CHECK: Final = "environment_reward"
"""The name of the verdict's check of an environment's own reward (``reward(task)``)."""


@dataclass(frozen=True)
class RewardVerdict:
    """The verdict of an environment that scores a trial itself: it passes on reward 1.0;
    ``info`` is what the environment reports (tau2's ``reward_info`` fields)."""

    info: dict[str, Any]
    partial: float | None

    @property
    def passed(self) -> bool:
        return float(self.info.get("reward", 0.0)) == 1.0

    def to_dict(self) -> dict[str, Any]:
        check = {"name": REWARD_CHECK, "passed": self.passed, "compared": self.info}
        return {"passed": self.passed, "partial": self.partial, "checks": [check]}


NL_CHECK: Final = "nl_assertions"
"""The name of the verdict's check of a task's natural-language assertions."""


def trial_conversation(task: Task, out: AgentOutput) -> list[dict[str, Any]]:
    """The conversation a judge reads: the one the agent recorded (``meta["messages"]``), or
    else the task's instruction as the user's message and the agent's final message."""
    recorded = out.meta.get("messages") if isinstance(out.meta, dict) else None
    if isinstance(recorded, list) and recorded:
        return [m for m in recorded if isinstance(m, dict)]
    return [
        {"role": "user", "content": task.instruction},
        {"role": "assistant", "content": out.message},
    ]


@dataclass(frozen=True)
class AssessedVerdict:
    """A verifier's verdict with the judge's check of the task's assertions added: it passes
    only when both do; partial credit stays the verifier's."""

    base: Verification
    check: dict[str, Any]

    @property
    def passed(self) -> bool:
        return bool(self.base.passed) and bool(self.check["passed"])

    @property
    def partial(self) -> float | None:
        return self.base.partial

    def to_dict(self) -> dict[str, Any]:
        """The verifier's verdict, its ``checks`` ending with the assertions' check."""
        data = dict(self.base.to_dict())
        data["checks"] = [*(data.get("checks") or []), self.check]
        data["passed"] = self.passed
        return data


def with_assertions(
    verdict: Verification,
    task: Task,
    judgement: Judgement | None,
    *,
    unjudged: str = "no judge was given (harness run --judge-model)",
) -> Verification:
    """``verdict`` with the check of ``task``'s natural-language assertions (the verdict as it
    is when the task has none). Without a judgement the check fails, ``unjudged`` saying why
    (no judge was given, the judge failed, the conversation was cut short): a task that cannot
    be fully judged is never passed."""
    if not task.nl_assertions:
        return verdict
    if judgement is None:
        check: dict[str, Any] = {
            "name": NL_CHECK,
            "passed": False,
            "compared": {
                "judged": False,
                "assertions": list(task.nl_assertions),
                "reason": unjudged,
            },
        }
    else:
        check = {
            "name": NL_CHECK,
            "passed": judgement.met,
            "compared": {
                "judged": True,
                "assertions": [c.to_dict() for c in judgement.checks],
                "judge": judgement.judge.get("llm"),
                "request_digest": judgement.meta.get("request_digest"),
            },
        }
    return AssessedVerdict(verdict, check)


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


# --------------------------------------------------------------------------------------------
# Why a trial failed: one class per failed trial, so that the classes add up to the failures.
# --------------------------------------------------------------------------------------------

TRIAL_CLASSES: Final[Mapping[str, str]] = {
    "wrong final state": "the trial changed state, but not to what the reference leaves",
    "no action taken": "the trial changed nothing where the reference changes state "
    "(a refusal where action was expected)",
    "unexpected action": "the trial changed state where the reference changes nothing "
    "(an action where a refusal was expected)",
    "missing output": "the final message lacks an output the task requires",
    "assertion unmet": "the judge found a natural-language assertion of the task unmet",
    "not judged": "the task has natural-language assertions and the run had no judge",
    "failed check": "a check of the suite's verifier failed",
    "rejected by verifier": "the suite's verifier failed the trial without naming a check",
    "cut short": "the conversation ended before the agent or the user ended it "
    "(max_steps, too many errors)",
    AGENT_ERROR: "the agent raised an exception",
    "rolled back": "a failed call rolled the episode back",
    "escalated": "the episode waits for a person (or was rejected by one)",
    "episode failed": "the episode ended failed",
    "episode not ended": "the episode has no end on record",
    "infrastructure": "the model server, the store or a worker failed, not the agent",
    "planned interruption": "a fault plan interrupted the trial",
}
"""Each class a failed trial is given (:func:`classify_trial`), with what it means."""

_SHOWN_KEYS = 3


@dataclass(frozen=True)
class FailedTrial:
    """One failed trial and why.

    Attributes:
        task_id, trial, episode_id: which trial (``harness audit RUN --episode ID`` shows it).
        cls: its class, a key of :data:`TRIAL_CLASSES`.
        detail: what in the record gave that class, in a line.
    """

    task_id: str
    trial: int
    episode_id: str
    cls: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the class under ``class``)."""
        return {
            "task_id": self.task_id,
            "trial": self.trial,
            "episode_id": self.episode_id,
            "class": self.cls,
            "detail": self.detail,
        }


def _calls(failures: Mapping[str, int]) -> str:
    named = [
        f"{name} x{count}" if count > 1 else name
        for name, count in sorted(failures.items())
        if name != AGENT_ERROR and not name.startswith("ended: ")
    ]
    return ", ".join(named)


def _keys(keys: Any) -> str:
    keys = [str(k) for k in keys] if isinstance(keys, list) else []
    shown = ", ".join(keys[:_SHOWN_KEYS])
    return shown + (f" and {len(keys) - _SHOWN_KEYS} more" if len(keys) > _SHOWN_KEYS else "")


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _compared(check: Mapping[str, Any]) -> Mapping[str, Any]:
    compared = check.get("compared")
    return compared if isinstance(compared, Mapping) else {}


def _verdict_class(verdict: Mapping[str, Any]) -> tuple[str, str]:
    """The class of a committed episode the verifier failed, from the checks it recorded."""
    checks = [c for c in verdict.get("checks") or [] if isinstance(c, Mapping)]
    failed = [c for c in checks if not c.get("passed")]
    for check in failed:
        if check.get("name") != "state_equality":
            continue
        compared = _compared(check)
        actual, expected = (
            _count(compared.get("actual_changed")),
            _count(compared.get("expected_changed")),
        )
        if actual == 0 and expected:
            return "no action taken", f"the reference changes {expected} resource(s)"
        if expected == 0 and actual:
            return "unexpected action", (
                f"changed {actual} resource(s): {_keys(compared.get('differing_keys'))}"
            )
        return "wrong final state", f"differs at {_keys(compared.get('differing_keys'))}"
    for check in failed:
        name = str(check.get("name"))
        compared = _compared(check)
        if name.startswith("field:"):
            return "wrong final state", (
                f"{name[len('field:') :]} is {canonical(compared.get('actual'))}, expected "
                + ("absent" if compared.get("absent") else canonical(compared.get("expected")))
            )
        if name == "required_outputs":
            missing = compared.get("missing")
            return "missing output", f"missing {_keys(missing) or 'an output'}"
        if name == NL_CHECK:
            if not compared.get("judged"):
                return "not judged", str(compared.get("reason") or "no judge was given")
            graded = compared.get("assertions")
            unmet = [
                str(a.get("nl_assertion"))
                for a in (graded if isinstance(graded, list) else [])
                if isinstance(a, Mapping) and not a.get("met")
            ]
            return "assertion unmet", "unmet: " + ("; ".join(unmet[:_SHOWN_KEYS]) or "?")
    if failed:
        return "failed check", ", ".join(str(c.get("name")) for c in failed[:_SHOWN_KEYS])
    return "rejected by verifier", "no check named"


def classify_trial(
    *,
    passed: bool,
    infra_error: bool,
    outcome: str,
    failures: Mapping[str, int],
    verdict: Any,
    meta: Any,
) -> tuple[str, str] | None:
    """Why a trial failed, as ``(class, detail)``; None when it passed.

    Every failed trial gets exactly one class of :data:`TRIAL_CLASSES`, the first that holds
    of: the infrastructure (or a fault plan) ended it, its agent raised, its conversation was
    cut short, its episode did not commit (rolled back, escalated, failed), and else what the
    verifier found in the final state (nothing changed, a change where none was expected, the
    wrong change, a missing output, another check).
    """
    if passed and not infra_error:
        return None
    meta = meta if isinstance(meta, Mapping) else {}
    error = str(meta.get("error") or "").strip()
    if infra_error:
        if meta.get("interruption") == "planned":
            return "planned interruption", error or "announced by the fault plan"
        return "infrastructure", error or "no cause recorded"
    if failures.get(AGENT_ERROR) or meta.get("agent_error"):
        return AGENT_ERROR, str(meta.get("agent_error") or error or "no message recorded")
    ended = [name[len("ended: ") :] for name in failures if name.startswith("ended: ")]
    cut = premature_end(meta)
    if ended or cut is not None:
        return "cut short", f"ended by {ended[0] if ended else cut}"
    calls = _calls(failures)
    if outcome == EpisodeStatus.ROLLED_BACK:
        return "rolled back", f"after {calls}" if calls else "no failed call recorded"
    if outcome == EpisodeStatus.ESCALATED:
        return "escalated", calls or "held for approval"
    if outcome == EpisodeStatus.FAILED:
        return "episode failed", error or calls or "no cause recorded"
    if outcome != EpisodeStatus.COMMITTED:
        return "episode not ended", f"outcome {outcome}"
    cls, detail = _verdict_class(verdict if isinstance(verdict, Mapping) else {})
    if calls:
        detail += f"; failed calls: {calls}"
    return cls, detail


def trial_class(row: TrialRow) -> FailedTrial | None:
    """Why the trial of ``row`` failed (:func:`classify_trial`); None when it passed.

    Raises:
        StoreError: the row's failures are not what the harness writes (the row was edited).
    """
    found = classify_trial(
        passed=row.passed,
        infra_error=row.infra_error,
        outcome=str(row.outcome),
        failures=trial_failures(row),
        verdict=loads_or(row.verdict, {}),
        meta=loads_or(row.agent_meta, {}),
    )
    if found is None:
        return None
    return FailedTrial(row.task_id, row.trial, row.episode_id, found[0], found[1])

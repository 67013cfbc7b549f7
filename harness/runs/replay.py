"""``harness replay``: one episode re-verified, and its agent re-run against its record.

:func:`replay_episode` re-runs the suite's verifier against the recorded final state, and
re-runs the episode's agent against the record (a :class:`ReplayEpisode` answers every call
from it; nothing is executed), reporting the first step where the agent and the record differ.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._json import canonical, loads
from ..action import Action
from ..agents.base import Agent
from ..agents.judge import Judgement, OpenAIJudge
from ..episode.cursor import RecordCursor, RecordedStep, rebuilt_error, recorded_steps
from ..episode.values import dumps_args
from ..errors import (
    Diverged,
    EpisodeClosed,
    Escalated,
    HarnessError,
    InvalidArguments,
    Rejected,
)
from ..store import EpisodeStatus, EscalationRow, EscalationStatus, Store, TxnStatus
from .calls import record_calls
from .judge import judge, reference_outcome, trial_conversation, with_assertions
from .layout import open_run
from .rebuild import apply_changes, recorded_changes
from .resume import judge_options, run_agent, run_suite
from .toolbox import bare_calls, bare_changes, bare_writes, make_toolbox

__all__ = ["ReplayEpisode", "ReplayReport", "replay_episode"]


class RecordEnds(HarnessError):
    """The record stops here: the episode was interrupted in this call (internal to replay)."""


class ReplayEpisode:
    """Stands in for an episode when its agent re-runs against the record; nothing executes.

    Every action call, read and model call is matched against the next recorded step
    (:class:`~harness.episode.cursor.RecordCursor`, as a resumed episode's are) and answered
    with the recorded outcome; the first mismatch raises :class:`Diverged`.

    Args:
        episode_id: the episode replayed.
        steps: its recorded steps (:func:`~harness.episode.cursor.recorded_steps`).
        escalations: its escalations (to raise them again where they were raised).
    """

    def __init__(
        self, episode_id: str, steps: Sequence[RecordedStep], escalations: Sequence[EscalationRow]
    ) -> None:
        self.id = episode_id
        self.cursor = RecordCursor(episode_id, steps, live_after=False)
        self.outcome: str = EpisodeStatus.RUNNING
        self._escalations = {e.txn_id: e for e in escalations}

    @property
    def diverged(self) -> Diverged | None:
        """The first divergence from the record (None: none yet)."""
        return self.cursor.diverged

    def call_mapping(self, action: Action[Any, Any], arguments: dict[str, Any]) -> Any:
        """Answer an action call from the record."""
        if self.diverged is not None:
            raise self.diverged
        if self.outcome != EpisodeStatus.RUNNING:
            raise EpisodeClosed(self.id, self.outcome)
        try:
            model = action.validate_mapping(dict(arguments))
        except InvalidArguments:
            self.cursor.expect_invalid(action.name, loads(dumps_args((), dict(arguments))))
            raise
        values = action.call_values(model)
        key = action.key_for(model)
        step = self.cursor.expect_call(action.name, values, key)
        assert step is not None  # (a replay never goes live)
        if step.returned:
            return step.result
        if step.status == TxnStatus.IN_DOUBT:
            raise RecordEnds(f"step {step.step}: the episode was interrupted in this call")
        row = step.row
        assert row is not None
        if row.decision == "escalate":
            esc = self._escalations.get(row.id)
            if esc is not None and esc.status == EscalationStatus.REJECTED:
                # A person rejected it: on resume, the agent was told so, and went on.
                raise Rejected(action.name, esc.resolved_by or "?", esc.resolution_reason or "")
            self.outcome = EpisodeStatus.ESCALATED
            raise Escalated(
                esc.id if esc else "?", action.name, row.failure_class or "", row.reason or ""
            )
        if row.decision == "rollback":
            self.outcome = EpisodeStatus.ROLLED_BACK
        raise rebuilt_error(row)

    def remember(self, what: str, request: Any, compute: Callable[[], Any]) -> Any:
        """The recorded value for ``request`` (``compute`` is never called)."""
        step = self.cursor.expect_remembered(what, request)
        assert step is not None  # (a replay never goes live)
        return step.value

    def finish(self) -> None:
        """Raise :class:`Diverged` if the agent ended before the record does."""
        self.cursor.finish()


# --------------------------------------------------------------------------------------------
# harness replay
# --------------------------------------------------------------------------------------------


@dataclass
class ReplayReport:
    """What replaying one episode found.

    Attributes:
        episode_id, task_id: the episode and its task.
        steps: the steps in its record.
        replayed: the steps the re-run agent made as recorded.
        divergence: the first step where the agent and the record differ (None: none).
        ended: how the re-run ended (``answered``, ``escalated``, ``rolled_back``,
            ``interrupted``: the record stops in a call the crash cut short, or an error).
        verdict: the verifiers' verdict on the recorded final state, now.
        recorded_verdict: the verdict stored when the trial finished (None: it never did).
        message_matches: whether the agent's final message is the recorded one.
    """

    episode_id: str
    task_id: str | None
    steps: int
    replayed: int
    divergence: Diverged | None
    ended: str
    verdict: dict[str, Any]
    recorded_verdict: dict[str, Any] | None
    message_matches: bool | None
    notes: list[str] = field(default_factory=list)

    @property
    def verdict_matches(self) -> bool | None:
        """Whether the verdict now equals the recorded one (None: nothing recorded)."""
        if self.recorded_verdict is None:
            return None
        return canonical(self.verdict) == canonical(self.recorded_verdict)

    @property
    def ok(self) -> bool:
        """No divergence, and the verdict (when one was recorded) is the same."""
        return self.divergence is None and self.verdict_matches is not False

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        d = self.divergence
        return {
            "episode_id": self.episode_id,
            "task_id": self.task_id,
            "steps": self.steps,
            "replayed": self.replayed,
            "divergence": None
            if d is None
            else {"step": d.step, "expected": d.expected, "actual": d.actual, "message": str(d)},
            "ended": self.ended,
            "verdict": self.verdict,
            "recorded_verdict": self.recorded_verdict,
            "verdict_matches": self.verdict_matches,
            "message_matches": self.message_matches,
            "ok": self.ok,
            "notes": self.notes,
        }


def replay_episode(
    folder: str | Path,
    episode_id: str,
    *,
    agent: str | Agent | None = None,
    suite: str | Path | None = None,
    trust: bool = False,
    trust_agent: bool = False,
) -> ReplayReport:
    """Re-verify one episode's recorded final state and re-run its agent against its record.

    Args:
        folder: the run folder (``logs/<run>``).
        episode_id: the episode (``harness audit`` lists them).
        agent: the agent to re-run, or how to build it (a built-in name, ``module:Class`` or
            ``path/to/file.py:Class``); default: the run's, from the spec it records, which
            must be a built-in agent unless ``trust_agent`` is set
            (:func:`~harness.runs.resume.agent_spec`).
        suite: the suite to replay on (a path or a built-in name; it must be the run's suite);
            needed unless the run's suite is built in or ``trust`` is set: the suite path a run
            folder records is not loaded on the folder's word
            (:func:`~harness.runs.resume.run_suite`).
        trust: load the suite at the path the run folder records, whatever it is.
        trust_agent: build the agent from the spec the run folder records, whatever it names.

    Raises:
        RunNotFound: the folder is not a run folder.
        StoreError: its database is damaged or from a newer harness.
        HarnessError: no such episode in the run; the suite or agent cannot be loaded.
        SuiteError: the run's suite is not built in and neither ``suite`` nor ``trust`` is
            given.
        ConfigurationError: the run's agent is not built in and neither ``agent`` nor
            ``trust_agent`` is given, or it does not build.
    """
    with open_run(folder) as run:
        store: Store = run.store
        episode = store.episode(episode_id)
        if episode is None or episode.run_id != run.run.id:
            known = [e.id for e in store.episodes(run.run.id)][:5]
            raise HarnessError(
                f"no episode {episode_id!r} in run {run.run.id} ({run.where}); "
                f"episodes include: {', '.join(known) or 'none'} (`harness audit {run.where}`)"
            )
        loaded = run_suite(run, suite=suite, trust=trust)
        # Built before anything runs: a refused agent leaves nothing half done.
        built = run_agent(run, agent, trust=trust_agent)
        task = loaded.task(episode.task_id or "")
        trial = next((t for t in store.trial_rows(run.run.id) if t.episode_id == episode_id), None)
        rows = store.transaction_rows(episode_id)
        log = store.log(episode_id)
        steps = recorded_steps(rows, log)
        bare = bare_calls(log)
        transactions = bool(run.config.get("transactions", True))
        notes: list[str] = []
        # 1. The verifier against the recorded final state.
        reference = reference_outcome(loaded, task)
        env = loaded.environment_for(task)
        try:
            mark = env.state.mark()
            apply_changes(env.state, recorded_changes(rows))
            apply_changes(env.state, bare_changes(bare))
            base_verdict = judge(
                loaded,
                task,
                reference,
                state=env.state,
                mark=mark,
                rows=rows,
                message=trial.message if trial else "",
                bare=bare_writes(bare, env.tools),
                environment=env,
                calls=lambda: record_calls(episode_id, log, rows),
            )[0]
            env.state.release(mark)
        finally:
            env.close()
        # 2. The agent against the record.
        replay = ReplayEpisode(episode_id, steps, store.escalation_rows(episode_id=episode_id))
        env = loaded.environment_for(task)
        message: str | None = None
        judgement: Judgement | None = None
        recorded_judge = judge_options(run)
        ended = "answered"
        started = time.perf_counter()
        try:
            toolbox = make_toolbox(env.tools, replay, env, transactions=transactions)
            try:
                seed = trial.seed if trial else 0
                out = built.run(task, toolbox, seed=seed)
                message = out.message
                if task.nl_assertions and recorded_judge is not None:
                    # The grades on record, for the same conversation (a judge never asked).
                    judgement = OpenAIJudge(**recorded_judge).judge(
                        task, trial_conversation(task, out), session=replay, seed=seed
                    )
                replay.finish()
            except Diverged:
                ended = "diverged"
            except RecordEnds as end:
                ended = "interrupted"
                notes.append(f"the record ends in a call a crash cut short ({end})")
            except Escalated:
                ended = "escalated"
            except EpisodeClosed as closed:
                ended = closed.outcome
            except HarnessError as exc:
                ended = f"error: {type(exc).__name__}: {exc}"
            if replay.outcome == EpisodeStatus.ROLLED_BACK and ended == "answered":
                ended = "rolled_back"
        finally:
            env.close()
        notes.append(f"re-ran in {time.perf_counter() - started:.3f} s")
        verdict = with_assertions(base_verdict, task, judgement).to_dict()
        return ReplayReport(
            episode_id=episode_id,
            task_id=episode.task_id,
            steps=len(steps),
            replayed=replay.cursor.at if replay.diverged is None else replay.diverged.step - 1,
            divergence=replay.diverged,
            ended=ended,
            verdict=verdict,
            recorded_verdict=loads(trial.verdict) if trial and trial.verdict else None,
            message_matches=None if trial is None or message is None else message == trial.message,
            notes=notes,
        )

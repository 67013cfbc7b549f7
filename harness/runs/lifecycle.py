"""One lifecycle for a run, shared by starting it and resuming it.

:func:`carry_out` does what both do once the jobs are known: record the run as running, run
the jobs on the run's executor with Ctrl-C and the agent-error limit watched, stop on a model
server that is down, a worker that died or a store that refuses a write, record the run as
finished only when every trial has its result, sign it, and write its summary and evidence.
Whatever stopped it, the store is left as a crash would leave it at worst: every finished trial
with its row, every other one resumable, and ``harness verify`` passes.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .._json import canonical, dumps, loads
from ..errors import ConfigurationError, EndpointDown, StoreError
from ..stats import Estimate, pass_at_k, suite_pass_hat_k
from ..store import EpisodeStatus, RunStatus, SigningKey, Store, TrialRow
from ..store.limiter import Limiter
from ..store.signing import episode_message, sign_episode, sign_run
from ..store.verify import run_bindings, verify_episode
from .executors import AnyStop, Executor, Prepares, Stop, StopFlag, StopOnSigint
from .layout import (
    EVIDENCE_FILE,
    SUMMARY_FILE,
    current_trials,
    earlier_attempts,
    episode_id,
    run_row,
    write_json,
)
from .reliability import reliability_report
from .spec import Job
from .worker import TrialResult, WorkerLost, trial_state

__all__ = ["HELD_POLL", "AgentErrorLimit", "RunRecord", "RunResult", "carry_out", "run_jobs"]


@dataclass
class RunResult:
    """The trials of one run and the statistics over them.

    Attributes:
        results: each trial's result (its last attempt).
        interrupted: the run stopped before its end (Ctrl-C, or ``stopped``).
        stopped: why it stopped, when something other than Ctrl-C stopped it (a model server
            down, a worker lost, a store refusing a write, too many agent errors).
        retried: the results of earlier attempts of trials that ran again (infrastructure
            errors): not in the statistics, counted in :meth:`usage`.
        missing: trials of the run with no result yet (``harness resume`` runs them), those
            waiting for a person included.
        folder: the run folder (None: a run named by its store's URL, with no folder here).
        target: how to name the run on a command line (default: its folder).
        faults: for a run under a fault plan, its reliability by class
            (:class:`~harness.runs.reliability.ReliabilityReport` as JSON); else None.
    """

    run_id: str
    folder: Path | None
    suite: str
    trials_per_task: int
    results: list[TrialResult]
    interrupted: bool = False
    stopped: str | None = None
    retried: list[TrialResult] = field(default_factory=list)
    missing: int = 0
    target: str = ""
    faults: dict[str, Any] | None = None

    @property
    def where(self) -> str:
        """The run as a command line names it: its folder, or its store's URL and id."""
        return self.target or str(self.folder)

    @property
    def complete(self) -> bool:
        """Whether every trial of the run has its result and nothing stopped it."""
        return not self.interrupted and self.missing == 0

    def usage(self) -> dict[str, float]:
        """What the trials cost, summed over every attempt: model calls, their failed
        attempts, seconds waited on the model and tokens, as far as the agent reported them
        (:func:`~harness.runs.worker.trial_usage`)."""
        total: Counter[str] = Counter()
        for r in [*self.results, *self.retried]:
            total.update(r.usage)
        return dict(total)

    def counts(self) -> tuple[list[str], list[int], list[int]]:
        """Task ids, successes per task, trials per task (infrastructure errors count as fails)."""
        by_task: dict[str, list[bool]] = {}
        for r in self.results:
            by_task.setdefault(r.task_id, []).append(r.passed)
        ids = sorted(by_task)
        return ids, [sum(by_task[i]) for i in ids], [len(by_task[i]) for i in ids]

    def pass_hat(self, k: int, confidence: float = 0.95) -> Estimate:
        """Suite pass^k with its interval."""
        _, c, n = self.counts()
        return suite_pass_hat_k(c, n, k, confidence=confidence)

    def pass_at(self, k: int) -> float:
        """Suite pass@k (mean over tasks)."""
        _, c, n = self.counts()
        return float(sum(pass_at_k(ni, ci, k) for ci, ni in zip(c, n, strict=True)) / len(c))

    def failures_by_class(self) -> dict[str, int]:
        """Failed tool calls by class over all trials, and agent errors (``agent error``)."""
        total: Counter[str] = Counter()
        for r in self.results:
            total.update(r.failures)
        return dict(total)

    def failed_trials_by_class(self) -> dict[str, int]:
        """Failed trials by why they failed (``harness.runs.judge.TRIAL_CLASSES``): one class a
        failed trial, infrastructure errors included, so the counts add up to the failures."""
        return dict(Counter(r.failure[0] for r in self.results if r.failure is not None))

    def agent_errors(self) -> list[TrialResult]:
        """The trials whose agent raised."""
        return [r for r in self.results if r.agent_error is not None]

    def outcomes(self) -> dict[str, int]:
        """Episodes by outcome."""
        return dict(Counter(r.outcome for r in self.results))

    def write_summary(self) -> None:
        """Write ``summary.json`` in the run folder (when trials finished)."""
        if self.results and self.folder is not None:
            write_json(self.folder, SUMMARY_FILE, self.summary())

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        n = min(self.counts()[2], default=0)
        return {
            "run_id": self.run_id,
            "folder": self.where,
            "suite": self.suite,
            "tasks": len(self.counts()[0]),
            "trials": len(self.results),
            "interrupted": self.interrupted,
            "stopped": self.stopped,
            "missing": self.missing,
            "retried": len(self.retried),
            "agent_errors": len(self.agent_errors()),
            "usage": self.usage(),
            "pass_hat_k": {k: self.pass_hat(k).to_dict() for k in range(1, n + 1)},
            "pass_at_k": {k: self.pass_at(k) for k in range(1, n + 1)},
            "failed_trials_by_class": self.failed_trials_by_class(),
            "failures_by_class": self.failures_by_class(),
            "outcomes": self.outcomes(),
            **({} if self.faults is None else {"faults": self.faults}),
        }


@dataclass(frozen=True)
class AgentErrorLimit:
    """When a run stops because its agent keeps raising, as Inspect's ``fail_on_error`` does:
    more than ``limit`` trials with an agent error (an int), or more than that fraction of the
    trials finished so far (a float below 1, judged once ``min_trials`` finished).

    Raises:
        ConfigurationError: a negative limit, or a fraction not below 1.
    """

    limit: float
    min_trials: int = 10

    def __post_init__(self) -> None:
        if isinstance(self.limit, bool) or not isinstance(self.limit, int | float):
            raise ConfigurationError(
                f"max_agent_errors={self.limit!r}: give a count (e.g. 5) or a fraction (0.2)"
            )
        if (
            not math.isfinite(self.limit)
            or self.limit < 0
            or (not float(self.limit).is_integer() and self.limit >= 1)
        ):
            raise ConfigurationError(
                f"max_agent_errors={self.limit}: give a count >= 0 or a fraction in [0, 1)"
            )

    @classmethod
    def of(cls, value: float | AgentErrorLimit | None) -> AgentErrorLimit | None:
        """The limit a caller's value gives (None: no limit)."""
        if value is None or isinstance(value, AgentErrorLimit):
            return value
        return cls(value)

    def exceeded(self, errors: int, finished: int) -> bool:
        """Whether ``errors`` of ``finished`` trials is past the limit."""
        if float(self.limit).is_integer():
            return errors > self.limit
        # (a margin: 0.29 * 100 is 28.999... in floating point, and 29 of 100 is not past 29%)
        return finished >= self.min_trials and errors > self.limit * finished + 1e-9

    def describe(self) -> str:
        """The limit in words."""
        if float(self.limit).is_integer():
            return f"more than {int(self.limit)} agent error(s)"
        return f"agent errors in more than {self.limit:.0%} of the trials"


@dataclass
class RunRecord:
    """The run's row as this start or resume writes it (its status changes; the rest stays)."""

    store: Store
    run_id: str
    suite: str
    config: dict[str, Any]
    evidence: dict[str, Any]
    created_at: float | None = None

    def write(self, status: str) -> None:
        """Record the run with ``status``."""
        extra = {} if self.created_at is None else {"created_at": self.created_at}
        written = self.store.record_run(
            run_row(
                self.run_id,
                suite=self.suite,
                status=status,
                config=dumps(self.config),
                evidence=dumps(self.evidence),
                **extra,
            )
        )
        self.evidence = loads(written.evidence)  # (with another resume's, when one ran)


def sign_left_unsigned(store: Store, run_id: str, key: SigningKey) -> list[str]:
    """Sign the run's ended episodes whose head no signature covers: those a resume without
    the key ended. Each is verified first (its chain and rows, as ``harness verify`` checks
    them without a key); one that fails is left unsigned, so that a check with the public key
    still names it. Returns the episodes signed."""
    signed = {s.subject: s.message for s in store.signatures() if s.scope == "episode"}
    trials = {t.episode_id: t for t in store.trial_rows(run_id)}
    bindings = run_bindings(store)
    done = []
    for episode in store.episodes(run_id):
        if episode.status == EpisodeStatus.RUNNING:
            continue
        if signed.get(episode.id) == canonical(episode_message(episode)):
            continue
        finding, _ = verify_episode(store, episode, trials, bindings=bindings)
        if finding is None:
            sign_episode(store, episode.id, key)
            done.append(episode.id)
    return done


HELD_POLL = 1.0
"""Seconds between looks at the trials another process holds (a ``harness work`` process, a
second resume), until each is done there or free to run here."""


def run_jobs(
    executor: Executor,
    jobs: Sequence[Job],
    *,
    store: Store,
    run_id: str,
    on_result: Callable[[Job, TrialResult | None], None],
    on_start: Callable[[Job], None] | None = None,
    stop: Stop | None = None,
    poll: float = HELD_POLL,
    elsewhere: Callable[[Job, TrialResult], None] | None = None,
) -> None:
    """Run ``jobs`` on ``executor`` until each trial is done, here or in another process.

    A trial another process holds (its lease taken: a worker that joined the run, a second
    resume) is looked at again every ``poll`` seconds: once it finished there, its recorded
    result goes to ``elsewhere``; once its holder let it go unfinished (it died, its lease
    lapsed), it runs here. ``on_result`` gets each job once: its result, or None when it did
    not run here (done elsewhere, waiting for a person, or still held when the run stopped).

    Raises:
        what ``executor.run`` raises (KeyboardInterrupt on a stop).
    """
    held: dict[Job, None] = {}

    def ended(job: Job, result: TrialResult | None) -> None:
        if result is None:
            held[job] = None
        else:
            held.pop(job, None)
            on_result(job, result)

    try:
        executor.run(jobs, on_result=ended, on_start=on_start, stop=stop)
        while held:
            left = []
            for job in list(held):
                state, eid = trial_state(store, episode_id(run_id, job.task_id, job.trial))
                if state == "done":
                    with store.session() as s:
                        row = s.get(TrialRow, eid)
                    del held[job]
                    if row is not None and elsewhere is not None:
                        elsewhere(job, TrialResult.from_row(row))
                    on_result(job, None)
                elif state == "pending":
                    del held[job]
                    on_result(job, None)
                else:
                    left.append(replace(job, mode="auto"))
            if not left:
                return
            # Only what its holder let go is handed out again (no worker is started for a
            # trial that is still held).
            left = [j for j in left if not store.lease_held(episode_id(run_id, j.task_id, j.trial))]
            deadline = time.monotonic() + poll
            while time.monotonic() < deadline:
                if stop is not None and stop.requested:
                    raise KeyboardInterrupt
                time.sleep(min(0.1, poll))
            if left:
                executor.run(left, on_result=ended, on_start=None, stop=stop)
    finally:
        for job in held:  # (still held elsewhere when the run stopped)
            on_result(job, None)


def carry_out(
    record: RunRecord,
    jobs: Sequence[Job],
    executor: Executor,
    *,
    folder: Path | None,
    trials: int,
    expected: int,
    progress: Callable[[TrialResult], None] | None = None,
    on_start: Callable[[Job], None] | None = None,
    on_result: Callable[[Job, TrialResult | None], None] | None = None,
    signing_key: SigningKey | None = None,
    max_agent_errors: AgentErrorLimit | None = None,
    target: str = "",
) -> RunResult:
    """Run ``jobs`` as one start or resume of the run ``record`` names, and end it.

    Args:
        record: the run's row.
        jobs: the trials to run now.
        executor: where they run.
        folder: the run folder (its summary and evidence are written there; None: the run
            was named by its store's URL, and only the store is written).
        trials: trials per task.
        expected: how many trials the run has in all (it is finished when each has a row).
        progress: called with each trial finished now.
        on_start: called as each trial is handed to a worker.
        on_result: called with each job as it ends (None: another process held it, or it
            needed nothing), after ``progress``.
        signing_key: signs the run's manifest at the end.
        max_agent_errors: stop the run once its agent raised past this limit.
        target: how a command line names the run (default: its folder).

    Every stop is recorded: the run is ``interrupted`` and :attr:`RunResult.stopped` says why
    (Ctrl-C leaves it None); the trials in flight end first, and ``harness resume`` runs the
    rest. A second Ctrl-C interrupts at once (KeyboardInterrupt is raised after the run is
    recorded as interrupted).

    An executor's setup (:class:`~.executors.Prepares`: Ray's workers checking they reach the
    store) comes before anything is recorded: when it is refused (ConfigurationError), the run's
    record is left as it was.
    """
    store = record.store
    if isinstance(executor, Prepares):
        executor.prepare(jobs)
    try:
        # A start or resume tries the servers again: the circuits the run's processes found
        # open before are forgotten (a worker that joins later keeps to the record).
        forget = Limiter(store, record.run_id)
        try:
            forget.forget_circuits()
        finally:
            forget.close()
        record.write(RunStatus.RUNNING)
    except BaseException:
        if isinstance(executor, Prepares):
            executor.close()
        raise
    sigint, own = StopOnSigint.active()
    limit = StopFlag()
    finished = errors = 0

    def ended(job: Job, result: TrialResult | None) -> None:
        if result is None:
            held.append(job)
        else:
            count(job, result)
        if on_result is not None:
            on_result(job, result)

    def count(_job: Job, result: TrialResult) -> None:
        """A trial finished, here or in another process of the run."""
        nonlocal finished, errors
        finished += 1
        errors += result.agent_error is not None
        if progress is not None:
            progress(result)
        if max_agent_errors is not None and max_agent_errors.exceeded(errors, finished):
            limit.ask(
                f"the agent raised in {errors} of {finished} trials, "
                f"{max_agent_errors.describe()} (--max-agent-errors): the agent looks broken; "
                "the last error: " + (result.agent_error or "")
            )

    interrupted, stopped = False, None
    hard: BaseException | None = None
    held: list[Job] = []
    try:
        run_jobs(
            executor,
            jobs,
            store=store,
            run_id=record.run_id,
            on_result=ended,
            on_start=on_start,
            stop=AnyStop([sigint, limit]),
            elsewhere=count,
        )
    except KeyboardInterrupt as exc:
        interrupted, stopped = True, limit.why
        if sigint.hard:
            hard = exc
    except (EndpointDown, WorkerLost) as exc:
        interrupted, stopped = True, str(exc)
    except StoreError as exc:
        interrupted, stopped = True, f"the run's store refused a write: {exc}"
    except Exception as exc:  # (recorded as interrupted, then raised: a bug, or a bad setup)
        interrupted, stopped = True, f"{type(exc).__name__}: {exc}"
        hard = exc
    finally:
        if own:
            sigint.restore()
    rows = store.trial_rows(record.run_id)
    current = current_trials(rows)
    waiting = any(r.outcome == EpisodeStatus.ESCALATED for r in current)
    # A trial another process held whose last attempt is an infrastructure error to run
    # again is not done, though it has a row.
    again = sum(
        trial_state(store, episode_id(record.run_id, job.task_id, job.trial))[0] == "retry"
        for job in held
    )
    result = RunResult(
        record.run_id,
        folder,
        record.suite,
        trials,
        [TrialResult.from_row(r) for r in current],
        interrupted=interrupted,
        stopped=stopped,
        retried=[TrialResult.from_row(r) for r in earlier_attempts(rows)],
        missing=max(expected - len(current), 0)
        + sum(r.outcome == EpisodeStatus.ESCALATED for r in current)
        + again,
        target=target,
        faults=reliability_report(store, record.run_id).to_dict()
        if "faults" in record.evidence
        else None,
    )
    record.write(RunStatus.FINISHED if result.complete and not waiting else RunStatus.INTERRUPTED)
    if signing_key is not None:
        sign_left_unsigned(store, record.run_id, signing_key)
        sign_run(store, record.run_id, signing_key)
    result.write_summary()
    if folder is not None:
        write_json(folder, EVIDENCE_FILE, record.evidence)
    if hard is not None:
        raise hard
    return result

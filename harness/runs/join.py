"""``harness work``: a process that joins a running run and takes a share of its trials.

Started on any machine that reaches the run's store (a run folder whose store is a database
elsewhere, or the store's URL), a worker takes the run's unfinished trials one by one through
the leases every process of the run already honours, as a DBOS process or a Temporal worker
joins a queue: a trial another process holds is left to it (and taken over once that process
is gone and its lease lapsed), a finished one is never run again. It leaves when every trial of
the run is done or waiting for a person, or when the run stops (its driver recorded it as
finished or interrupted), or on Ctrl-C.

It writes trials, never the run's own record: the process that started the run (or a
``harness resume``) records it finished and writes its summary.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..agents import Agent
from ..errors import ConfigurationError, EndpointDown, StoreError
from ..store import RunRow, RunStatus, SigningKey, Store
from .executors import AnyStop, StopOnSigint, check_placement, executor_for
from .layout import episode_id, open_run
from .lifecycle import HELD_POLL, run_jobs
from .resume import (
    agent_spec,
    check_secret_servers,
    run_agent,
    run_policy,
    run_suite,
    signing_notes,
    trial_plan,
    worker_spec,
)
from .spec import Job
from .start import ExecutorName
from .worker import TrialResult, Worker, WorkerLost

__all__ = ["RunWatch", "WorkResult", "work_run"]


@dataclass
class WorkResult:
    """What ``work_run`` did.

    Attributes:
        run_id: the run joined.
        target: how a command line names it.
        ran: episodes this process ran to their end.
        elsewhere: trials other processes of the run finished meanwhile (their trial ids).
        left: trials still unfinished when this process left (held elsewhere, or stopped).
        stopped: why it left early (the run stopped, a server down, a store refusing a
            write), or None; Ctrl-C leaves it None with ``interrupted``.
        interrupted: Ctrl-C stopped it.
        notes: what the user should know (a signed run joined without its key...).
        results: the results of the trials this process ran.
    """

    run_id: str
    target: str
    ran: list[str] = field(default_factory=list)
    elsewhere: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    stopped: str | None = None
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    results: list[TrialResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "run_id": self.run_id,
            "target": self.target,
            "ran": self.ran,
            "elsewhere": self.elsewhere,
            "left": self.left,
            "stopped": self.stopped,
            "interrupted": self.interrupted,
            "notes": self.notes,
        }


class RunWatch:
    """A stop that is requested once the run is no longer running (its driver recorded it
    finished or interrupted): read from the store at most every ``every`` seconds."""

    def __init__(self, store: Store, run_id: str, every: float = 2.0) -> None:
        self.store, self.run_id, self.every = store, run_id, every
        self._seen = 0.0
        self._status: str = RunStatus.RUNNING
        self._lock = threading.Lock()

    @property
    def requested(self) -> bool:
        with self._lock:
            now = time.monotonic()
            if now - self._seen >= self.every:
                self._seen = now
                with self.store.session() as s:
                    row = s.get(RunRow, self.run_id)
                self._status = RunStatus.RUNNING if row is None else str(row.status)
            return self._status != RunStatus.RUNNING

    @property
    def status(self) -> str:
        """The run's status when last read."""
        return self._status


def work_run(
    target: str | Path,
    *,
    workers: int = 1,
    concurrency: int = 1,
    executor: ExecutorName = "processes",
    address: str | None = None,
    agent: str | Agent | None = None,
    suite: str | Path | None = None,
    trust: bool = False,
    trust_agent: bool = False,
    secrets: dict[str, Any] | None = None,
    signing_key: SigningKey | None = None,
    lease_seconds: float = 600.0,
    progress: Callable[[TrialResult], None] | None = None,
    poll: float = HELD_POLL,
) -> WorkResult:
    """Join the running run ``target`` (a run folder, or its store's URL ``...#<run id>``) and
    run its unfinished trials until none is left to run, sharing them with every other
    process of the run through the trials' leases.

    Args:
        target: the run: its folder (whose ``store.json`` names a store this machine reaches)
            or its store's URL.
        workers, concurrency, executor, address: where this process runs its share, as for
            :func:`~harness.runs.resume.resume_run`.
        agent, suite, trust, trust_agent, secrets, signing_key, lease_seconds: how the trials
            are run, as for :func:`~harness.runs.resume.resume_run` (the run's agent and suite,
            built only from what the caller vouches for).
        progress: called with each trial this process finishes.
        poll: seconds between looks at trials other processes hold.

    Raises:
        ConfigurationError: the run is not running (finished, or interrupted: ``harness
            resume`` finishes it), bad arguments, or as ``resume_run``.
        RunNotFound, StoreError, SuiteError: as :func:`~harness.runs.resume.resume_run`.
    """
    check_placement("work_run", workers, concurrency, executor, address)
    with open_run(target, writable=True) as run:
        row = run.run
        if row.status != RunStatus.RUNNING:
            then = (
                "every trial has its result"
                if row.status == RunStatus.FINISHED
                else f"`harness resume {run.where}` finishes it"
            )
            raise ConfigurationError(
                f"run {row.id} ({run.where}) is {row.status}, not running, so there is no run "
                f"to join: {then}"
            )
        store = run.store
        for trial in store.trial_rows(row.id):  # (a row it cannot read: refused first)
            TrialResult.from_row(trial)
        loaded = run_suite(run, suite=suite, trust=trust)
        policy, notes = run_policy(run)
        notes += signing_notes(store, row.id, signing_key)
        spec = agent_spec(run, agent, trust=trust_agent)
        check_secret_servers(run, secrets, trust=trust_agent)
        agent_obj = run_agent(run, spec, secrets=secrets)
        if executor == "ray" and not isinstance(spec, str):
            raise ConfigurationError(
                "work_run: executor='ray' builds the agent in each Ray worker from its name: "
                "give a built-in name or module:Class, not an agent object"
            )
        config = run.config
        tasks = list(config.get("tasks") or [t.id for t in loaded.tasks])
        trials = int(config.get("trials") or 1)
        seed = int(config.get("seed") or 0)
        scheme = str(config.get("seeds") or "harness")
        jobs, _ = trial_plan(store, row.id, tasks, trials, seed, scheme)
        out = WorkResult(row.id, run.where, notes=notes)
        if not jobs:
            return out
        run_spec = worker_spec(
            run,
            loaded,
            spec,
            policy,
            secrets=secrets,
            lease_seconds=lease_seconds,
            signing_key=signing_key,
            executor=executor,
        )
        where = executor_for(
            executor,
            run_spec,
            workers=workers,
            concurrency=concurrency,
            address=address,
            in_process=lambda: Worker(run_spec, suite=loaded, agent=agent_obj),
        )
        watch = RunWatch(store, row.id)
        sigint, own = StopOnSigint.active()

        def ended(_job: Job, result: TrialResult | None) -> None:
            if result is not None:
                out.ran.append(result.episode_id)
                out.results.append(result)
                if progress is not None:
                    progress(result)

        def finished_elsewhere(job: Job, _result: TrialResult) -> None:
            out.elsewhere.append(episode_id(row.id, job.task_id, job.trial))

        try:
            run_jobs(
                where,
                jobs,
                store=store,
                run_id=row.id,
                on_result=ended,
                stop=AnyStop([sigint, watch]),
                poll=poll,
                elsewhere=finished_elsewhere,
            )
        except KeyboardInterrupt:
            if sigint.hard:
                raise
            if sigint.requested:
                out.interrupted = True
            elif watch.status != RunStatus.FINISHED:  # (finished: every trial has its result)
                out.stopped = f"the run is {watch.status}: its driver stopped it"
        except (EndpointDown, WorkerLost) as exc:
            out.stopped = str(exc)
        except StoreError as exc:
            out.stopped = f"the run's store refused a write: {exc}"
        finally:
            if own:
                sigint.restore()
        left, _ = trial_plan(store, row.id, tasks, trials, seed, scheme)
        out.left = [episode_id(row.id, j.task_id, j.trial) for j in left]
        return out

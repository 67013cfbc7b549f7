"""One process's share of a run: a worker runs trials, each under its episode's lease.

The worker builds the trial's environment, runs the agent inside an :class:`~harness.Episode`
(resuming it from its records when it was interrupted), judges the state it left, and writes
the trial's row. Worker processes of a pool build one worker each (:func:`start_worker`).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .._json import dumps, loads
from ..action import Action
from ..agents import Agent, registry
from ..episode import Episode
from ..errors import EndpointDown, Escalated, HarnessError, ModelServerError
from ..faults import RunFaults, WorkerCrash
from ..policy import Policy
from ..store import EpisodeStatus, EscalationStatus, SigningKey, Store, TrialRow
from ..store.signing import sign_episode
from ..suite import Suite, Task, load_suite
from .judge import Reference, judge, premature_end, reference_outcome
from .layout import episode_id
from .rebuild import apply_changes, recorded_changes
from .toolbox import bare_calls, bare_changes, bare_writes, make_toolbox

__all__ = [
    "Job",
    "TrialResult",
    "Worker",
    "WorkerLost",
    "run_job",
    "start_worker",
    "trial_state",
    "trial_usage",
]

# One trial to run: task id, trial index, seed, and mode (``new`` or ``auto``).
Job = tuple[str, int, int, str]


class WorkerLost(HarnessError):
    """A worker died mid-run (killed, out of memory, its machine gone) and its trials could
    not be finished elsewhere: the run stops; ``harness resume`` resumes, and does not repeat,
    the trials it had in flight."""


@dataclass
class TrialResult:
    """One trial's outcome, as the run summarises it."""

    task_id: str
    trial: int
    seed: int
    episode_id: str
    passed: bool
    partial: float | None
    outcome: str
    infra_error: bool = False
    failures: dict[str, int] = field(default_factory=dict)
    steps: list[bool] = field(default_factory=list)
    duration: float = 0.0
    usage: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_row(cls, row: TrialRow) -> TrialResult:
        """The result a trial row records."""
        return cls(
            row.task_id,
            row.trial,
            row.seed,
            row.episode_id,
            row.passed,
            row.partial,
            row.outcome,
            row.infra_error,
            loads(row.failures or "{}"),
            loads(row.steps or "[]"),
            row.duration,
            trial_usage(loads(row.agent_meta or "{}")),
        )


# What a trial's agent metadata may say it cost, as the run totals it.
_TOKENS = ("prompt_tokens", "completion_tokens", "total_tokens")


def trial_usage(meta: dict[str, Any]) -> dict[str, float]:
    """What a trial cost, from its agent's metadata, when the agent reports it: model calls
    (and the failed attempts they retried), seconds waited on the model (``model_seconds``;
    the user's in ``user_seconds``), and the tokens the server counted (the agent's and the
    user's together)."""
    out: dict[str, float] = {}
    calls = meta.get("model_calls")
    if isinstance(calls, list):
        out["model_calls"] = len(calls)
        # Failed attempts the calls needed before their answer (429s, 5xx, no response).
        out["model_retries"] = sum(
            max(int(c.get("attempts", 1)) - 1, 0) for c in calls if isinstance(c, dict)
        )
    for key in ("model_seconds", "user_seconds"):
        value = meta.get(key)
        if isinstance(value, int | float):
            out[key] = float(value)
    for usage in (meta.get("usage"), meta.get("user_usage")):
        if isinstance(usage, dict):
            for key in _TOKENS:
                value = usage.get(key)
                if isinstance(value, int | float):
                    out[key] = out.get(key, 0) + value
    return out


def trial_state(store: Store, episode: str) -> str:
    """What a trial of a run needs: ``new`` (never started), ``resume`` (interrupted, or
    escalated with every escalation resolved), ``pending`` (waiting for a person) or ``done``."""
    with store.session() as s:
        finished = s.get(TrialRow, episode)
    if store.episode(episode) is None:
        return "new"
    if finished is not None and finished.outcome != EpisodeStatus.ESCALATED:
        return "done"
    if store.escalation_rows(EscalationStatus.PENDING, episode_id=episode):
        return "pending"
    return "resume"


class Worker:
    """Everything one process needs to run trials of one run.

    Args:
        suite: the suite, or its path (loaded here: workers may be other processes; a suite
            already loaded in this process keeps the reference outcomes it computed).
        agent: an agent, or how to build one with ``agent_options``: a built-in agent's name,
            ``module:Class`` or ``path/to/file.py:Class``.
        store_url: the run's store.
        run_id: the run.
        policy: the policy of every episode.
        faults: the run's fault injection, if any.
        lease_seconds: how long an episode's lease lasts without renewal.
        signing_key: the run's signing key as PEM: each episode's head is signed as it ends.
        transactions: False calls the agent's tools bare (each tool's own function, no
            transaction: :class:`~harness.runs.toolbox.BareToolbox`); trials are recorded and
            judged alike.
    """

    def __init__(
        self,
        suite: str | Suite,
        agent: str | Agent,
        agent_options: dict[str, Any],
        store_url: str,
        run_id: str,
        policy: Policy,
        faults: RunFaults | None = None,
        lease_seconds: float = 600.0,
        signing_key: bytes | None = None,
        transactions: bool = True,
    ) -> None:
        self.suite = (
            suite
            if isinstance(suite, Suite)
            else load_suite(suite, check_references=False)  # (checked by the run)
        )
        # (PEM: a key object cannot be sent to a worker process.)
        self.signing_key = None if signing_key is None else SigningKey.from_pem(signing_key)
        self.agent = registry.create(agent, **agent_options) if isinstance(agent, str) else agent
        self.store = Store(store_url)
        self.run_id = run_id
        self.policy = policy
        self.faults = faults
        self.references: dict[str, Reference] = {}
        self._references_lock = threading.Lock()
        # Leases name their holder: host, process and this worker.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_seconds = lease_seconds
        self.transactions = transactions

    def reference(self, task: Task) -> Reference:
        """The task's reference outcome (computed once per worker, whichever of its threads
        asks first)."""
        with self._references_lock:
            if task.id not in self.references:
                self.references[task.id] = reference_outcome(self.suite, task)
            return self.references[task.id]

    def _record_verdict(self, episode_id: str, payload: dict[str, Any]) -> None:
        writer = self.store.writer(episode_id)
        try:
            with writer.batch():
                writer.load_head()
                writer.append("verdict", None, payload)
                writer.update_head()
        finally:
            writer.close()
        if self.signing_key is not None:
            sign_episode(self.store, episode_id, self.signing_key)

    def trial(self, task_id: str, trial: int, seed: int, mode: str = "new") -> TrialResult | None:
        """Run one trial while holding its episode's lease.

        Args:
            mode: ``new`` (a fresh episode), or ``auto``: decided under the lease from the
                store (:func:`trial_state`): run it, resume it, or leave it.

        Returns:
            The result, or None when another process holds the lease or nothing is to be done.

        Raises:
            EndpointDown: the model server is down (its circuit is open): the trial stopped,
                with no verdict and no trial row, so that resuming the run runs it again.
        """
        eid = episode_id(self.run_id, task_id, trial)
        with self.store.lease(eid, owner=self.owner, seconds=self.lease_seconds) as held:
            if not held:
                return None
            state = "new" if mode == "new" else trial_state(self.store, eid)
            if state in ("done", "pending"):
                return None
            return self._trial(task_id, trial, seed, resume=state == "resume")

    def _trial(self, task_id: str, trial: int, seed: int, *, resume: bool) -> TrialResult:
        task = self.suite.task(task_id)
        reference = self.reference(task)
        started = time.perf_counter()
        eid = episode_id(self.run_id, task_id, trial)
        env = self.suite.new_environment()
        injector = None if self.faults is None else self.faults.injector(env, task_id, trial, eid)
        message, infra, meta = "", False, {}
        down: EndpointDown | None = None
        try:
            mark = env.state.mark()
            if resume:
                # The trial's environment died with the process that ran it: rebuild the state
                # its record says the episode left, so the verdict sees every effect.
                apply_changes(env.state, recorded_changes(self.store.transaction_rows(eid)))
                apply_changes(env.state, bare_changes(bare_calls(self.store.log(eid))))
            if injector is not None:
                injector.install()

            def episode(resume: bool = False) -> Episode:
                return Episode(
                    state=env.state,
                    store=self.store,
                    policy=self.policy,
                    episode_id=eid,
                    resume=resume,
                    clock=None if injector is None else injector.clock,
                    run_id=self.run_id,
                    task_id=task_id,
                    trial=trial,
                    meta={"seed": seed},
                    actions=[t for t in env.tools.values() if isinstance(t, Action)],
                    signing_key=self.signing_key,
                )

            ep = episode(resume=resume)
            toolbox = make_toolbox(env.tools, ep, env, transactions=self.transactions)
            while True:
                try:
                    with ep:
                        out = self.agent.run(task, toolbox, seed=seed)
                        message, meta = out.message, out.meta
                except Escalated:
                    pass
                except EndpointDown as exc:
                    down = exc
                except HarnessError as exc:
                    # A server that is down or rate-limiting is infrastructure; a request it
                    # refuses (wrong model, bad key) is a configuration the run must not count
                    # as the agent's success or failure either.
                    infra = isinstance(exc, ModelServerError)
                    meta = {"error": f"{type(exc).__name__}: {exc}"}
                except WorkerCrash as crash:
                    # An injected worker death: resume the episode from its records, as a
                    # restarted worker would, and let the agent start its turn over.
                    assert injector is not None
                    if injector.crashes > injector.plan.max_resumes:
                        meta = {"error": f"worker crashed {injector.crashes} times: {crash}"}
                    else:
                        ep = toolbox.episode = episode(resume=True)
                        continue
                break
            if down is not None:
                raise down  # (the run stops; the trial is left for resume)
            outcome = ep.outcome
            verdict, steps = judge(
                self.suite,
                task,
                reference,
                state=env.state,
                mark=mark,
                rows=self.store.transaction_rows(eid),
                message=message,
                bare=[]
                if self.transactions
                else bare_writes(bare_calls(self.store.log(eid)), env.tools),
            )
            failures = Counter(c.kind for c in toolbox.calls if c.kind)
            cut = premature_end(meta)
            if cut is not None:  # a conversation cut short earns nothing, as in tau2
                failures[f"ended: {cut}"] += 1
            passed = verdict.passed and outcome == EpisodeStatus.COMMITTED and cut is None
            if injector is not None and injector.finish(self.store).planned and not passed:
                # Announced in advance: the trial was interrupted, not failed by the agent.
                infra, meta = True, {**meta, "interruption": "planned"}
        finally:
            if injector is not None:
                injector.uninstall()
            env.close()
        result = TrialResult(
            task_id,
            trial,
            seed,
            eid,
            passed,
            verdict.partial,
            outcome,
            infra,
            dict(failures),
            steps,
            time.perf_counter() - started,
            trial_usage(meta),
        )
        # The verdict joins the episode's hash chain, after its end: the trial row is checked
        # against it, and the head is signed again now that the record is final.
        self._record_verdict(
            eid,
            {
                "task_id": task_id,
                "trial": trial,
                "passed": passed,
                "partial": verdict.partial,
                "outcome": str(outcome),
                "infra_error": infra,
                "verdict": verdict.to_dict(),
            },
        )
        self.store.add(
            TrialRow(
                id=eid,
                run_id=self.run_id,
                task_id=task_id,
                task_version=task.version,
                trial=trial,
                seed=seed,
                episode_id=eid,
                passed=passed,
                partial=verdict.partial,
                outcome=outcome,
                infra_error=infra,
                failures=dumps(result.failures),
                steps=dumps(steps),
                message=message[:4000],
                verdict=dumps(verdict.to_dict()),
                agent_meta=dumps(meta),
                duration=result.duration,
                created_at=time.time(),
            )
        )
        return result


# The worker of a pool's process (built by its initializer).
_WORKER: Worker | None = None


def start_worker(*args: Any) -> None:
    """A pool process's initializer: build its :class:`Worker`."""
    global _WORKER
    _WORKER = Worker(*args)


def run_job(job: Job) -> TrialResult | None:
    """Run one job on this process's worker."""
    assert _WORKER is not None, "start_worker runs first (the pool's initializer)"
    return _WORKER.trial(*job)

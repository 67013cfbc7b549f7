"""One process's share of a run: a worker runs trials, each under its trial's lease.

The worker builds the trial's environment, runs the agent inside an :class:`~harness.Episode`
(resuming it from its records when it was interrupted), judges the state it left, and writes
the trial's row. A trial whose last attempt ended in an infrastructure error (a model server
that failed past its retries) runs again in a new episode, ``<trial id>~<attempt>``; the
failed attempt stays in the record.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import traceback
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .._json import canonical, dumps, loads
from ..action import Action
from ..agents import Agent, registry
from ..agents.judge import Judge, Judgement, OpenAIJudge
from ..episode import Episode
from ..errors import EndpointDown, Escalated, HarnessError, ModelServerError, StoreError
from ..faults import WorkerCrash
from ..store import EpisodeStatus, EscalationStatus, SigningKey, Store, TrialRow
from ..store.records import trial_failures, trial_steps
from ..store.signing import sign_episode
from ..store.witness import Witness
from ..suite import HELD_FOR_APPROVAL, Suite, Task, load_suite
from .calls import record_calls
from .judge import (
    AGENT_ERROR,
    Reference,
    classify_trial,
    judge,
    premature_end,
    reference_outcome,
    trial_class,
    trial_conversation,
    with_assertions,
)
from .layout import attempt_id, attempt_of, episode_id
from .limits import RunGate, RunLimits
from .rebuild import apply_changes, recorded_changes
from .spec import Job, RunSpec
from .toolbox import bare_calls, bare_changes, bare_writes, make_toolbox

__all__ = [
    "AGENT_ERROR",
    "Job",
    "TrialResult",
    "Worker",
    "WorkerLost",
    "retryable",
    "trial_state",
    "trial_usage",
]


class WorkerLost(HarnessError):
    """A worker died mid-run (killed, out of memory, its machine gone) and its trials could
    not be finished elsewhere: the run stops; ``harness resume`` resumes, and does not repeat,
    the trials it had in flight."""


@dataclass(kw_only=True)
class TrialResult:
    """One trial's outcome, as the run summarises it.

    Attributes:
        agent_error: the exception the agent raised (``Type: message``), when it raised; the
            trial failed as the agent's error (its traceback is in the trial's agent meta).
        failure: why it failed, ``(class, detail)`` (:func:`~harness.runs.judge.classify_trial`);
            None when it passed.
        attempt: which attempt of the trial this is (0: the first).
        again: its infrastructure error is one to try again at once (a conversation tau2's
            runner would have failed).
    """

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
    agent_error: str | None = None
    failure: tuple[str, str] | None = None
    attempt: int = 0
    again: bool = False

    @classmethod
    def from_row(cls, row: TrialRow) -> TrialResult:
        """The result a trial row records."""
        meta = loads(row.agent_meta or "{}")
        error = meta.get("agent_error") if isinstance(meta, dict) else None
        failed = trial_class(row)
        return cls(
            task_id=row.task_id,
            trial=row.trial,
            seed=row.seed,
            episode_id=row.episode_id,
            passed=row.passed,
            partial=row.partial,
            outcome=row.outcome,
            infra_error=row.infra_error,
            failures=trial_failures(row),
            steps=trial_steps(row),
            duration=row.duration,
            usage=trial_usage(meta if isinstance(meta, dict) else {}),
            agent_error=error if isinstance(error, str) else None,
            failure=None if failed is None else (failed.cls, failed.detail),
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


def retryable(row: TrialRow) -> bool:
    """Whether a finished trial runs again on resume: its attempt ended in an infrastructure
    error (a model server that failed past its retries, or refused the request), not in an
    interruption a fault plan announced."""
    if not row.infra_error:
        return False
    meta = loads(row.agent_meta or "{}")
    return not (isinstance(meta, dict) and meta.get("interruption") == "planned")


AT_ONCE = 4
"""How many attempts a trial gets at once when its conversation failed as tau2's runner fails
one (tau2-bench's ``max_retries`` 3, plus the first)."""

MAX_ATTEMPTS = 100
"""The most attempts of one trial a run keeps (each resume makes at most one more)."""


def trial_state(store: Store, trial_id: str) -> tuple[str, str]:
    """What a trial of a run needs, and the episode of its attempt to run or leave.

    ``new`` (never started), ``resume`` (interrupted, or escalated with every escalation
    resolved), ``retry`` (its last attempt ended in an infrastructure error: a new attempt's
    episode is given), ``pending`` (waiting for a person) or ``done``.
    """
    for attempt in range(MAX_ATTEMPTS):
        eid = attempt_id(trial_id, attempt)
        if store.episode(eid) is None:
            return ("new", eid) if attempt == 0 else ("retry", eid)
        with store.session() as s:
            finished = s.get(TrialRow, eid)
        if finished is None or finished.outcome == EpisodeStatus.ESCALATED:
            if store.escalation_rows(EscalationStatus.PENDING, episode_id=eid):
                return "pending", eid
            return "resume", eid
        if not retryable(finished):
            return "done", eid
    return "done", attempt_id(trial_id, MAX_ATTEMPTS - 1)


class Worker:
    """Everything one process needs to run trials of one run.

    Args:
        spec: the run (:class:`~harness.runs.spec.RunSpec`): how to build the suite, the agent
            and the store, the policy, the lease, the signing key, the run-wide limits on
            model requests (held as this process's gate while its trials run).
        suite: the suite already loaded in this process (it keeps the reference outcomes it
            computed); default: loaded from ``spec.suite``.
        agent: the agent object to use (default: built from ``spec.agent`` and its options).
        judge: the judge of tasks' natural-language assertions (default: built from
            ``spec.judge``; none when it is None).
    """

    def __init__(
        self,
        spec: RunSpec,
        *,
        suite: Suite | None = None,
        agent: Agent | None = None,
        judge: Judge | None = None,
    ) -> None:
        self.spec = spec
        self.suite = (
            suite if suite is not None else load_suite(spec.suite, check_references=False)
        )  # (references checked by the run)
        if agent is None:
            if spec.agent is None:
                raise HarnessError(
                    f"run {spec.run_id}: its agent is an object of the process that started the "
                    "run, and another process cannot build it: run it in one process"
                )
            agent = registry.create(spec.agent, **spec.agent_options)
        self.agent = agent
        if judge is None and spec.judge is not None:
            judge = OpenAIJudge(**spec.judge)
        self.judge = judge
        # (PEM: a key object cannot be sent to a worker process.)
        key = spec.signing_key
        witness = None if spec.witness is None else Witness(spec.witness)
        self.signing_key = None if key is None else SigningKey.from_pem(key, witness=witness)
        self.store = Store(spec.store_url)
        self.run_id = spec.run_id
        self.binding = None if spec.binding is None else dict(spec.binding)
        self.policy = spec.policy
        self.faults = spec.faults
        self.references: dict[str, Reference] = {}
        self._references_lock = threading.Lock()
        self._computing: dict[str, threading.Lock] = {}  # a lock per task being computed
        # Leases name their holder: host, process and this worker.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_seconds = spec.lease_seconds
        self.transactions = spec.transactions
        # Installed in this process while its trials run: the run's limits, and its servers'
        # circuits shared with every other process of the run (one worker finding a server
        # down stops them all), limits or none.
        self.gate = RunGate(self.store, spec.run_id, spec.limits or RunLimits())

    def reference(self, task: Task) -> Reference:
        """The task's reference outcome (computed once per worker, whichever of its threads
        asks first)."""
        with self._references_lock:
            found = self.references.get(task.id)
            if found is not None:
                return found
            lock = self._computing.setdefault(task.id, threading.Lock())
        with lock:  # (one thread computes it; the others of the same task wait for it)
            with self._references_lock:
                found = self.references.get(task.id)
            if found is None:
                found = reference_outcome(self.suite, task)
                with self._references_lock:
                    self.references[task.id] = found
            return found

    def trial(self, job: Job) -> TrialResult | None:
        """Run one trial while holding its lease.

        ``job.mode`` ``new`` starts a fresh episode; ``auto`` decides under the lease from the
        store (:func:`trial_state`): start it, resume its interrupted episode, run it again
        in a new episode (its last attempt ended in an infrastructure error), or leave it.

        Returns:
            The result, or None when another process holds the lease or nothing is to be done.

        Raises:
            EndpointDown: the model server is down (its circuit is open): the trial stopped,
                with no verdict and no trial row, so that resuming the run runs it again.
            KeyboardInterrupt: the agent was interrupted (the run stops).
        """
        trial_id = episode_id(self.run_id, job.task_id, job.trial)
        with self.store.lease(trial_id, owner=self.owner, seconds=self.lease_seconds) as held:
            if not held:
                return None
            if job.mode == "new":
                state, eid = "new", trial_id
            else:
                state, eid = trial_state(self.store, trial_id)
            if state in ("done", "pending"):
                return None
            with self.gate:
                result = self._trial(job, eid, resume=state == "resume")
                # A conversation tau2's runner would have failed is run again at once, in a new
                # attempt, as tau2 runs a simulation again: up to 4 attempts each time the trial
                # is taken up (a resume gives it 4 more, as a new tau2 run would).
                made = 1
                while result.infra_error and result.again and made < AT_ONCE:
                    state, eid = trial_state(self.store, trial_id)
                    if state != "retry":
                        break
                    result = self._trial(job, eid, resume=False)
                    made += 1
                return result

    def _trial(self, job: Job, eid: str, *, resume: bool) -> TrialResult:
        task_id, trial, seed = job.task_id, job.trial, job.seed
        task = self.suite.task(task_id)
        reference = self.reference(task)
        started = time.perf_counter()
        env = self.suite.environment_for(task)
        injector = None if self.faults is None else self.faults.injector(env, task_id, trial, eid)
        message, infra, meta = "", False, {}
        agent_error: str | None = None
        judgement: Judgement | None = None
        answered = False
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
                    meta={"seed": seed, **({} if self.binding is None else {"run": self.binding})},
                    actions=[t for t in env.tools.values() if isinstance(t, Action)],
                    signing_key=self.signing_key,
                )

            ep = episode(resume=resume)
            toolbox = make_toolbox(env.tools, ep, env, transactions=self.transactions)
            # The decisions the task records for held calls, each answering one held call.
            recorded = Counter((name, bound) for name, bound, _ in reference.approvals)
            while True:
                try:
                    with ep:
                        out = self.agent.run(task, toolbox, seed=seed)
                        message, meta = out.message, out.meta
                        answered = True
                        # A conversation cut short earns nothing whatever it said: tau2 does not
                        # judge it, and neither is the judge asked here.
                        if (
                            task.nl_assertions
                            and self.judge is not None
                            and premature_end(out.meta) is None
                        ):
                            # Inside the episode: the grades are remembered with its record.
                            judgement = self.judge.judge(
                                task, trial_conversation(task, out), session=ep, seed=seed
                            )
                except Escalated:
                    if self._answer_held(task, reference, eid, recorded):
                        # Decided as the task records: resume, and the agent starts its turn
                        # over (its calls before the held one are answered from the record),
                        # as after a person's decision and `harness resume`.
                        ep = episode(resume=True)
                        toolbox = make_toolbox(env.tools, ep, env, transactions=self.transactions)
                        continue
                except EndpointDown as exc:
                    down = exc
                except StoreError:
                    # The store refusing a write (a full disk, say) stops the run, whether the
                    # episode was opening, recording a call or ending: it is no verdict on the
                    # agent, and resume runs the trial from what was committed.
                    raise
                except HarnessError as exc:
                    # A server that is down or rate-limiting is infrastructure; a request it
                    # refuses (wrong model, bad key) is a configuration the run must not count
                    # as the agent's success or failure either.
                    infra = isinstance(exc, ModelServerError)
                    # After the agent answered (the judge failed), its own record is kept.
                    kept = meta if answered and isinstance(meta, dict) else _partial_meta(exc)
                    meta = {**kept, "error": _said(exc)}
                    if getattr(exc, "retry_at_once", False):
                        meta["retry_at_once"] = True
                except WorkerCrash as crash:
                    # An injected worker death: resume the episode from its records, as a
                    # restarted worker would, and let the agent start its turn over.
                    assert injector is not None
                    if injector.crashes > injector.plan.max_resumes:
                        meta = {"error": f"worker crashed {injector.crashes} times: {crash}"}
                    else:
                        ep = toolbox.episode = episode(resume=True)
                        continue
                except (KeyboardInterrupt, GeneratorExit):
                    raise  # (a stop of the run, not the agent's failure)
                except BaseException as exc:
                    # The agent's own bug (SystemExit included): this trial fails as the
                    # agent's error, with its traceback on record; the run goes on.
                    agent_error = _said(exc)
                    meta = {
                        **_partial_meta(exc),
                        "error": agent_error,
                        "agent_error": agent_error,
                        "traceback": _traceback(exc),
                    }
                break
            if down is not None:
                raise down  # (the run stops; the trial is left for resume)
            outcome = ep.outcome
            rows = self.store.transaction_rows(eid)
            verdict, steps = judge(
                self.suite,
                task,
                reference,
                state=env.state,
                mark=mark,
                rows=rows,
                message=message,
                bare=[]
                if self.transactions
                else bare_writes(bare_calls(self.store.log(eid)), env.tools),
                environment=env,
                calls=lambda: record_calls(eid, self.store.log(eid), rows),
            )
            verdict = with_assertions(
                verdict, task, judgement, unjudged=_unjudged(self.judge, answered, meta)
            )
            failures = Counter(c.kind for c in toolbox.calls if c.kind)
            if agent_error is not None:
                failures[AGENT_ERROR] += 1
            cut = premature_end(meta)
            if cut is not None:  # a conversation cut short earns nothing, as in tau2
                failures[f"ended: {cut}"] += 1
            passed = (
                verdict.passed
                and outcome == EpisodeStatus.COMMITTED
                and cut is None
                and agent_error is None
            )
            if injector is not None and injector.finish(self.store).planned and not passed:
                # Announced in advance: the trial was interrupted, not failed by the agent.
                infra, meta = True, {**meta, "interruption": "planned"}
        finally:
            if injector is not None:
                injector.uninstall()
            env.close()
        verdict_data = verdict.to_dict()  # (once: the result, the record and the row)
        result = TrialResult(
            task_id=task_id,
            trial=trial,
            seed=seed,
            episode_id=eid,
            passed=passed,
            partial=verdict.partial,
            outcome=outcome,
            infra_error=infra,
            failures=dict(failures),
            steps=steps,
            duration=time.perf_counter() - started,
            usage=trial_usage(meta),
            agent_error=agent_error,
            attempt=attempt_of(eid),
            again=infra and bool(meta.get("retry_at_once")),
            failure=classify_trial(
                passed=passed,
                infra_error=infra,
                outcome=str(outcome),
                failures=failures,
                verdict=verdict_data,
                meta=meta,
            ),
        )
        # The verdict joins the episode's hash chain, after its end, in the same database
        # transaction as the trial row (a kill between them would leave a verdict whose row
        # is missing): the row is checked against it, and the head is signed again now that
        # the record is final.
        self.store.record_verdict(
            eid,
            {
                "task_id": task_id,
                "trial": trial,
                "passed": passed,
                "partial": verdict.partial,
                "outcome": str(outcome),
                "infra_error": infra,
                "verdict": verdict_data,
            },
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
                verdict=dumps(verdict_data),
                agent_meta=dumps(meta),
                duration=result.duration,
                created_at=time.time(),
            ),
        )
        if self.signing_key is not None:
            sign_episode(self.store, eid, self.signing_key)
        return result

    def _answer_held(
        self, task: Task, reference: Reference, eid: str, recorded: Counter[tuple[str, str]]
    ) -> bool:
        """Decide the episode's held calls that the task records a decision for (the same
        action with the same arguments, as the reference replay's held call bound them), as
        the task's approver: each recorded decision answers one held call. True when no call
        is left waiting for a person."""
        pending = self.store.escalation_rows(EscalationStatus.PENDING, episode_id=eid)
        for row in pending:
            bound = (row.action, canonical(loads(row.args)))
            approval = reference.approval(*bound)
            if row.failure_class != HELD_FOR_APPROVAL or approval is None or not recorded[bound]:
                continue
            recorded[bound] -= 1
            approval.resolve(self.store, row.id, task.id, signing_key=self.signing_key)
        left = self.store.escalation_rows(EscalationStatus.PENDING, episode_id=eid)
        return bool(pending) and not left


_TRACEBACK_CHARS = 20_000


_MESSAGE_CHARS = 4_000


def _unjudged(judge: Judge | None, answered: bool, meta: Any) -> str:
    """Why a trial with natural-language assertions has no grades (when it has none)."""
    if judge is None:
        return "no judge was given (harness run --judge-model)"
    if not answered:
        return "the agent did not finish its turn, so the judge was not asked"
    if isinstance(meta, dict) and meta.get("error"):
        return f"the judge failed: {meta['error']}"
    return "the conversation was cut short, so the judge was not asked (as in tau2)"


def _said(exc: BaseException) -> str:
    """``Type: message``, the message cut when it is long."""
    text = str(exc)
    if len(text) > _MESSAGE_CHARS:
        text = text[:_MESSAGE_CHARS] + f"… ({len(text):,} characters)"
    return f"{type(exc).__name__}: {text}"


def _traceback(exc: BaseException) -> str:
    """The exception's traceback as text, its end kept when it is long."""
    text = "".join(traceback.format_exception(exc))
    if len(text) <= _TRACEBACK_CHARS:
        return text
    half = _TRACEBACK_CHARS // 2
    return text[:half] + "\n…\n" + text[-half:]


def _partial_meta(exc: BaseException) -> dict[str, Any]:
    """What an agent that raised says the trial cost so far (``agent_meta`` on its error:
    the model calls made, the failed attempts among them, the tokens)."""
    meta = getattr(exc, "agent_meta", None)
    return dict(meta) if isinstance(meta, dict) else {}

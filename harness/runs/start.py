"""Runs: every task of a suite as repeated, isolated trials, in parallel processes.

Each trial gets a fresh environment and its own episode in the run's store; its verdict comes
from the final external state compared with what the task's reference actions produce on a
fresh copy (computed once per task and worker). Results land in ``logs/<run>/harness.db`` with
an evidence record beside them (``evidence.json``): harness version, task and tool versions,
agent configuration, retry policy, partial-credit rules, seeds, machine.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import inspect
import json
import multiprocessing
import os
import platform
import re
import signal
import socket
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import harness

from .._json import canonical, dumps
from ..action import Action
from ..agents import Agent, registry
from ..episode import Episode
from ..errors import ConfigurationError, Escalated, HarnessError
from ..faults import FaultPlan, RunFaults, WorkerCrash, load_faults
from ..policy import Policy
from ..stats import Estimate, pass_at_k, suite_pass_hat_k
from ..store import RunRow, Store, TrialRow
from ..suite import Suite, Task, load_suite
from ..transaction import observed_changes
from .replay import RecordingToolbox, apply_changes, recorded_changes

__all__ = [
    "RunResult",
    "TrialResult",
    "evidence_record",
    "redact",
    "reference_outcome",
    "run_trials",
    "trial_seed",
    "trial_state",
]


def _import_agents() -> None:
    from ..agents import openai, scripted, simulated  # noqa: F401  (registers them)


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


@dataclass
class Reference:
    """What a task's reference actions do on a fresh environment."""

    changes: dict[str, Any]
    writes: list[tuple[str, str]]


def _plain(tool: Any) -> Callable[..., Any]:
    return tool.fn if isinstance(tool, Action) else tool


def reference_outcome(suite: Suite, task: Task) -> Reference:
    """Replay the reference actions with the plain tools on a fresh environment."""
    env = suite.new_environment()
    try:
        mark = env.state.mark()
        writes = []
        for call in task.reference_actions:
            tool = env.tools[call.name]
            try:
                _plain(tool)(**call.arguments)
            except Exception:  # a reference call upstream's own tools refuse: counted as such
                continue
            if isinstance(tool, Action) and tool.mutating:
                # Compare as the transaction log records them: validated, defaults filled in.
                values = tool.call_values(tool.validate_mapping(dict(call.arguments)))
                writes.append((call.name, canonical(values)))
        changes = {k: after for k, (_, after) in observed_changes(env.state, mark).items()}
        env.state.release(mark)
        return Reference(changes, writes)
    finally:
        env.close()


def _steps_done(reference: Reference, committed: Iterable[tuple[str, str]]) -> list[bool]:
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


def trial_state(store: Store, episode_id: str) -> str:
    """What a trial of a run needs: ``new`` (never started), ``resume`` (interrupted, or
    escalated with every escalation resolved), ``pending`` (waiting for a person) or ``done``."""
    with store.session() as s:
        finished = s.get(TrialRow, episode_id)
    episode = store.episode(episode_id)
    if episode is None:
        return "new"
    if finished is not None and finished.outcome != "escalated":
        return "done"
    if store.escalations("pending", episode_id=episode_id):
        return "pending"
    return "resume"


class _Worker:
    """Everything one process needs to run trials of one run."""

    def __init__(
        self,
        suite_path: str,
        agent: str | Agent,
        agent_options: dict[str, Any],
        store_url: str,
        run_id: str,
        policy: Policy,
        faults: RunFaults | None = None,
    ) -> None:
        _import_agents()
        self.suite = load_suite(suite_path)
        self.agent = registry.create(agent, **agent_options) if isinstance(agent, str) else agent
        self.store = Store(store_url)
        self.run_id = run_id
        self.policy = policy
        self.faults = faults
        self.references: dict[str, Reference] = {}
        # Leases name their holder: host, process and this worker.
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease_seconds = 600.0

    def reference(self, task: Task) -> Reference:
        if task.id not in self.references:
            self.references[task.id] = reference_outcome(self.suite, task)
        return self.references[task.id]

    def trial(self, task_id: str, trial: int, seed: int, mode: str = "new") -> TrialResult | None:
        """Run one trial while holding its episode's lease.

        Args:
            mode: ``new`` (a fresh episode), or ``auto``: decided under the lease from the
                store (:func:`trial_state`): run it, resume it, or leave it.

        Returns:
            The result, or None when another process holds the lease or nothing is to be done.
        """
        episode_id = f"{self.run_id}-{task_id}-{trial}"
        with self.store.lease(episode_id, owner=self.owner, seconds=self.lease_seconds) as held:
            if not held:
                return None
            state = "new" if mode == "new" else trial_state(self.store, episode_id)
            if state in ("done", "pending"):
                return None
            return self._trial(task_id, trial, seed, resume=state == "resume")

    def _trial(self, task_id: str, trial: int, seed: int, *, resume: bool) -> TrialResult:
        task = self.suite.task(task_id)
        reference = self.reference(task)
        started = time.perf_counter()
        episode_id = f"{self.run_id}-{task_id}-{trial}"
        env = self.suite.new_environment()
        injector = (
            None if self.faults is None else self.faults.injector(env, task_id, trial, episode_id)
        )
        outcome, message, infra, meta = "failed", "", False, {}
        try:
            mark = env.state.mark()
            if resume:
                # The trial's environment died with the process that ran it: rebuild the state
                # its record says the episode left, so the verdict sees every effect.
                apply_changes(env.state, recorded_changes(self.store.transactions(episode_id)))
            if injector is not None:
                injector.install()

            def episode(resume: bool = False) -> Episode:
                return Episode(
                    state=env.state,
                    store=self.store,
                    policy=self.policy,
                    episode_id=episode_id,
                    resume=resume,
                    clock=None if injector is None else injector.clock,
                    run_id=self.run_id,
                    task_id=task_id,
                    trial=trial,
                    meta={"seed": seed},
                    actions=[t for t in env.tools.values() if isinstance(t, Action)],
                )

            ep = episode(resume=resume)
            toolbox = RecordingToolbox(env.tools, ep, env)
            while True:
                try:
                    with ep:
                        out = self.agent.run(task, toolbox, seed=seed)
                        message, meta = out.message, out.meta
                except Escalated:
                    pass
                except HarnessError as exc:
                    from ..errors import ModelRequestError, ModelServerError

                    # A server that is down or rate-limiting is infrastructure; a request it
                    # refuses (wrong model, bad key) is a configuration the run must not count
                    # as the agent's success or failure either.
                    infra = isinstance(exc, ModelServerError | ModelRequestError)
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
            outcome = ep.outcome
            actual = {k: after for k, (_, after) in observed_changes(env.state, mark).items()}
            committed = [
                (t.action, canonical(json.loads(t.args)))
                for t in self.store.transactions(episode_id)
                if t.mutating and t.status in ("committed", "recovered")
            ]
            steps = _steps_done(reference, committed)
            from verifiers import verify

            verdict = verify(
                task,
                actual=actual,
                expected=reference.changes,
                message=message,
                state=env.state,
                steps=steps,
            )
            passed = verdict.passed and outcome == "committed"
            failures = Counter(c.kind for c in toolbox.calls if c.kind)
            if injector is not None and injector.finish(self.store).planned and not passed:
                # Announced in advance: the trial was interrupted, not failed by the agent.
                infra, meta = True, {**meta, "interruption": "planned"}
        finally:
            if injector is not None:
                injector.uninstall()
            env.close()
        duration = time.perf_counter() - started
        result = TrialResult(
            task_id,
            trial,
            seed,
            episode_id,
            passed,
            verdict.partial,
            outcome,
            infra,
            dict(failures),
            steps,
            duration,
        )
        self.store.add(
            TrialRow(
                id=episode_id,
                run_id=self.run_id,
                task_id=task_id,
                task_version=task.version,
                trial=trial,
                seed=seed,
                episode_id=episode_id,
                passed=passed,
                partial=verdict.partial,
                outcome=outcome,
                infra_error=infra,
                failures=dumps(dict(failures)),
                steps=dumps(steps),
                message=message[:4000],
                verdict=dumps(verdict.to_dict()),
                agent_meta=dumps(meta),
                duration=duration,
                created_at=time.time(),
            )
        )
        return result


_WORKER: _Worker | None = None


def _init_worker(*args: Any) -> None:
    global _WORKER
    _WORKER = _Worker(*args)


def _run_job(job: tuple[Any, ...]) -> TrialResult | None:
    assert _WORKER is not None
    return _WORKER.trial(*job)


REDACTED = "<redacted>"
_SECRET = re.compile(r"key|token|secret|password", re.IGNORECASE)


def redact(options: dict[str, Any]) -> dict[str, Any]:
    """Agent options as a run may record them: secrets (API keys, tokens) replaced."""
    return {k: REDACTED if _SECRET.search(k) and v else v for k, v in options.items()}


def trial_seed(seed: int, task_id: str, trial: int) -> int:
    """A trial's seed: stable across runs, workers and orderings."""
    h = hashlib.sha256(f"{seed}:{task_id}:{trial}".encode()).digest()
    return int.from_bytes(h[:8], "big") % (2**31)


def _tool_versions(suite: Suite) -> dict[str, str]:
    env = suite.new_environment()
    try:
        out = {}
        for name, tool in sorted(env.tools.items()):
            fn = _plain(tool)
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                src = repr(fn)
            out[name] = hashlib.sha256(src.encode()).hexdigest()[:16]
        return out
    finally:
        env.close()


def evidence_record(
    suite: Suite, agent_config: dict[str, Any], policy: Policy, trials: int, seed: int
) -> dict[str, Any]:
    """What a run must keep to be reproduced and believed."""
    return {
        "harness_version": harness.__version__,
        "suite": suite.manifest(),
        "tool_versions": _tool_versions(suite),
        "agent": agent_config,
        "policy": policy.describe(),
        "partial_credit": {t.id: t.partial_credit for t in suite.tasks},
        "trials": trials,
        "seed": seed,
        "infra_error_policy": "fail",
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
    }


@dataclass
class RunResult:
    """The trials of one run and the statistics over them."""

    run_id: str
    folder: Path
    suite: str
    trials_per_task: int
    results: list[TrialResult]
    interrupted: bool = False

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
        """Failed tool calls by class, over all trials."""
        total: Counter[str] = Counter()
        for r in self.results:
            total.update(r.failures)
        return dict(total)

    def outcomes(self) -> dict[str, int]:
        """Episodes by outcome."""
        return dict(Counter(r.outcome for r in self.results))

    def summary(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        n = min(self.counts()[2], default=0)
        return {
            "run_id": self.run_id,
            "folder": str(self.folder),
            "suite": self.suite,
            "tasks": len(self.counts()[0]),
            "trials": len(self.results),
            "interrupted": self.interrupted,
            "pass_hat_k": {k: self.pass_hat(k).to_dict() for k in range(1, n + 1)},
            "pass_at_k": {k: self.pass_at(k) for k in range(1, n + 1)},
            "failures_by_class": self.failures_by_class(),
            "outcomes": self.outcomes(),
        }


class _StopOnSigint:
    """Ctrl-C stops a run between trials: the first SIGINT asks, the run ends after the trial
    it is in; a second one interrupts at once (KeyboardInterrupt).

    An interrupt raised at an arbitrary point can land where Python ignores it (a weakref
    callback, a finaliser) and be lost; a flag read between trials cannot.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._ask)

    def _ask(self, _signum: int, _frame: Any) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self._previous or signal.default_int_handler)

    def restore(self) -> None:
        """Put the handler back as it was."""
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None


def run_trials(
    suite: Suite | str | Path,
    *,
    agent: str | Agent = "scripted",
    agent_options: dict[str, Any] | None = None,
    trials: int = 1,
    workers: int = 1,
    seed: int = 0,
    logs: str | Path = "logs",
    run_id: str | None = None,
    policy: Policy | None = None,
    tasks: Iterable[str] | None = None,
    progress: Callable[[TrialResult], None] | None = None,
    faults: FaultPlan | str | Path | None = None,
) -> RunResult:
    """Run every task of ``suite`` as ``trials`` isolated trials.

    Args:
        suite: a loaded suite, a suite folder, or a tau2 ``tasks.json``.
        agent: a built-in agent name (``scripted``, ``simulated``, ``openai``) or an agent.
        agent_options: options for a named agent (e.g. ``{"error_rate": 0.1}``).
        trials: trials per task.
        workers: processes running trials in parallel.
        seed: the run's seed; each trial's seed derives from it, the task and the trial index.
        logs: the folder under which the run's folder is created.
        run_id: the run's id (default: time-stamped).
        policy: the harness policy for every episode.
        tasks: only these task ids.
        progress: called with each finished trial (in the parent process).
        faults: a fault plan (or its JSON/TOML file) to inject into every trial; its events
            and their judgement land in the run's store (``harness.report.reliability``).
    """
    _import_agents()
    if trials < 1 or workers < 1:
        raise ConfigurationError("run_trials: trials and workers must be >= 1")
    loaded = suite if isinstance(suite, Suite) else load_suite(suite)
    agent_options = dict(agent_options or {})
    policy = policy or Policy()
    plan = None if faults is None else load_faults(faults)
    if plan is not None:
        plan.check_suite(loaded)
        policy = plan.apply_to(policy)
    agent_obj = registry.create(agent, **agent_options) if isinstance(agent, str) else agent
    wanted = None if tasks is None else list(tasks)
    if wanted is not None:
        unknown = sorted(set(wanted) - {t.id for t in loaded.tasks})
        if unknown:
            raise ConfigurationError(
                f"run_trials: no task {', '.join(map(repr, unknown))} in suite {loaded.name}"
            )
    selected = [t for t in loaded.tasks if wanted is None or t.id in wanted]
    if not selected:
        raise ConfigurationError(f"run_trials: no tasks selected from {loaded.name}")
    run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
    folder = Path(logs) / run_id
    folder.mkdir(parents=True, exist_ok=True)
    store_url = f"sqlite:///{folder / 'harness.db'}"
    store = Store(store_url, create=True)
    evidence = evidence_record(loaded, agent_obj.config(), policy, trials, seed)
    if plan is not None:
        evidence["faults"] = plan.describe()
    (folder / "evidence.json").write_text(json.dumps(evidence, indent=2, default=str))
    config = {
        "suite_path": str(loaded.path),
        "agent": agent if isinstance(agent, str) else agent_obj.name,
        "agent_options": redact(agent_options),
        "trials": trials,
        "workers": workers,
        "seed": seed,
        "tasks": [t.id for t in selected],
    }
    store.add(
        RunRow(
            id=run_id,
            created_at=time.time(),
            suite=loaded.name,
            status="running",
            config=dumps(config),
            evidence=dumps(evidence),
        )
    )
    jobs = [(t.id, i, trial_seed(seed, t.id, i)) for i in range(trials) for t in selected]
    results: list[TrialResult] = []
    interrupted = False
    injection = None if plan is None else plan.for_run(run_id)
    init = (str(loaded.path), agent, agent_options, store_url, run_id, policy, injection)
    stop = _StopOnSigint()
    try:
        if workers == 1:
            worker = (
                _Worker(*init)
                if isinstance(agent, str)
                else _Worker(str(loaded.path), agent_obj, {}, store_url, run_id, policy, injection)
            )
            for job in jobs:
                if stop.requested:
                    raise KeyboardInterrupt
                r = worker.trial(*job)
                if r is None:  # another process holds its lease (a concurrent resume)
                    continue
                results.append(r)
                if progress:
                    progress(r)
        else:
            ctx = multiprocessing.get_context("spawn")
            with cf.ProcessPoolExecutor(
                workers, mp_context=ctx, initializer=_init_worker, initargs=init
            ) as pool:
                futures = [pool.submit(_run_job, job) for job in jobs]
                try:
                    for fut in cf.as_completed(futures):
                        if stop.requested:
                            raise KeyboardInterrupt
                        r = fut.result()
                        if r is None:
                            continue
                        results.append(r)
                        if progress:
                            progress(r)
                except KeyboardInterrupt:
                    for f in futures:
                        f.cancel()
                    raise
    except KeyboardInterrupt:
        interrupted = True
    finally:
        stop.restore()
    status = "interrupted" if interrupted else "finished"
    row = RunRow(
        id=run_id,
        created_at=time.time(),
        suite=loaded.name,
        status=status,
        config=dumps(config),
        evidence=dumps(evidence),
    )
    store.add(row)
    result = RunResult(run_id, folder, loaded.name, trials, results, interrupted)
    if results:
        (folder / "summary.json").write_text(json.dumps(result.summary(), indent=2))
    store.close()
    return result

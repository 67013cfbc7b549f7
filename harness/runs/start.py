"""Runs: every task of a suite as repeated, isolated trials, in parallel processes.

Each trial gets a fresh environment and its own episode in the run's store; its verdict comes
from the final external state compared with what the task's reference actions produce on a
fresh copy (computed once per task and worker). Results land in ``logs/<run>/harness.db`` with
an evidence record beside them (``evidence.json``): harness version, task and tool versions,
agent configuration, retry policy, partial-credit rules, seeds, machine.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import platform
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path
from typing import Any, Final, Literal

from .._version import __version__
from ..agents import Agent, recorded_spec, registry
from ..agents.judge import OpenAIJudge
from ..errors import ConfigurationError, StoreError
from ..faults import FaultPlan, load_faults
from ..policy import Policy
from ..store import SigningKey, Store
from ..store.chain import run_binding
from ..suite import Suite, load_suite
from .executors import EXECUTORS, executor_for
from .judge import plain
from .layout import (
    EVIDENCE_FILE,
    new_run_id,
    public_url,
    store_url,
    write_json,
    write_store_pointer,
)
from .lifecycle import AgentErrorLimit, RunRecord, RunResult, carry_out
from .limits import Rate, RunLimits
from .spec import Job, RunSpec, key_for_workers
from .worker import TrialResult, Worker

__all__ = [
    "REDACTED",
    "SEED_SCHEMES",
    "RunResult",
    "evidence_record",
    "harness_commit",
    "redact",
    "run_trials",
    "seeding",
    "trial_seed",
]

ExecutorName = Literal["processes", "ray"]


REDACTED = "<redacted>"
_SECRET = re.compile(r"key|token|secret|password", re.IGNORECASE)


def redact(options: dict[str, Any]) -> dict[str, Any]:
    """Agent options as a run may record them: secrets (API keys, tokens) replaced."""
    return {k: REDACTED if _SECRET.search(k) and v else v for k, v in options.items()}


def trial_seed(seed: int, task_id: str, trial: int) -> int:
    """A trial's seed: stable across runs, workers and orderings."""
    h = hashlib.sha256(f"{seed}:{task_id}:{trial}".encode()).digest()
    return int.from_bytes(h[:8], "big") % (2**31)


SEED_SCHEMES: Final = ("harness", "tau2")
"""How a run seeds its trials: ``harness`` (:func:`trial_seed`, one seed per task and trial)
or ``tau2`` (tau2-bench's runner: ``random.seed(seed)``, then one ``randint(0, 1000000)`` per
trial, the same for every task), which runs of tau2 tasks use so that a trial's seed is the
one tau2 gives it."""


def seeding(scheme: str, seed: int, trials: int) -> Callable[[str, int], int]:
    """The seed of ``(task id, trial)`` under ``scheme`` (:data:`SEED_SCHEMES`).

    Raises:
        ConfigurationError: an unknown scheme.
    """
    if scheme == "tau2":
        rng = random.Random(seed)
        per_trial = [rng.randint(0, 1_000_000) for _ in range(trials)]
        return lambda _task_id, trial: per_trial[trial]
    if scheme == "harness":
        return lambda task_id, trial: trial_seed(seed, task_id, trial)
    raise ConfigurationError(f"seed scheme {scheme!r}: give one of {', '.join(SEED_SCHEMES)}")


def _tool_versions(suite: Suite) -> dict[str, str]:
    env = suite.new_environment()
    try:
        out = {}
        for name, tool in sorted(env.tools.items()):
            fn = plain(tool)
            try:
                src = inspect.getsource(fn)
            except (OSError, TypeError):
                src = repr(fn)
            out[name] = hashlib.sha256(src.encode()).hexdigest()[:16]
        return out
    finally:
        env.close()


@cache
def harness_commit() -> str | None:
    """The git commit of the harness source that runs (None when it is not a git checkout, or
    git is not installed), with ``-dirty`` when the checkout has uncommitted changes."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "harness"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{commit}-dirty" if commit and dirty else commit or None


def evidence_record(
    suite: Suite,
    agent_config: dict[str, Any],
    policy: Policy,
    trials: int,
    seed: int,
    *,
    transactions: bool = True,
) -> dict[str, Any]:
    """What a run must keep to be reproduced and believed.

    ``transactions``: whether the agent's tools ran as transactions (False: called bare,
    :class:`~harness.runs.toolbox.BareToolbox`).
    """
    return {
        "harness_version": __version__,
        "harness_commit": harness_commit(),
        "transactions": transactions,
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


def _shared_store(url: str, run_id: str) -> Store:
    """The store at ``url`` for a new run ``run_id`` (nothing is written to it yet).

    Raises:
        ConfigurationError: ``url`` is not a database URL.
        StoreError: it does not open, or holds a run ``run_id`` already.
    """
    if "://" not in url:
        raise ConfigurationError(
            f"store {url!r}: give a database URL, postgresql://user@host/db (its password in "
            "PGPASSWORD or ~/.pgpass) or sqlite:///path/harness.db"
        )
    public_url(url)  # (refuses what is not a database URL, naming it)
    opened = Store(url, create=True)
    try:
        if any(r.id == run_id for r in opened.runs()):
            raise StoreError(
                f"the store at {public_url(url)} holds a run {run_id!r} already; nothing was "
                "written: give the run another id, or `harness resume` that one"
            )
    except BaseException:
        opened.close()
        raise
    return opened


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
    signing_key: SigningKey | None = None,
    transactions: bool = True,
    concurrency: int = 1,
    executor: ExecutorName = "processes",
    address: str | None = None,
    on_start: Callable[[str, int], None] | None = None,
    max_agent_errors: float | None = None,
    store: str | None = None,
    max_in_flight: int | None = None,
    rate_limit: str | Rate | None = None,
    token_limit: str | Rate | None = None,
    judge: dict[str, Any] | None = None,
) -> RunResult:
    """Run every task of ``suite`` as ``trials`` isolated trials.

    Args:
        suite: a loaded suite, a suite folder, or a tau2 ``tasks.json``.
        agent: a built-in agent name (``scripted``, ``simulated``, ``openai``), an agent class
            of the user's code named ``module:Class`` or ``path/to/file.py:Class``
            (:class:`~harness.agents.AgentSpec`; the run records it, so ``harness resume`` can
            build it again), or an agent object (resumed only from Python, with ``agent=``).
        agent_options: options for a named agent (e.g. ``{"error_rate": 0.1}``).
        judge: the options of a judge model on an OpenAI-compatible server that grades the
            tasks' natural-language assertions (``Task.nl_assertions``), as
            :class:`~harness.agents.judge.OpenAIJudge` takes them (``model``, ``base_url``,
            ``api_key``...; the key is never recorded). Without one, a task with assertions
            cannot pass, and the run's evidence names it (``unjudged_tasks``).
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
        signing_key: signs each episode's head as it ends and the run's manifest at the end
            (:mod:`harness.store.signing`); ``harness audit --verify --public-key`` checks them.
        transactions: False calls the agent's tools bare, as a plain tau2 environment does (each
            tool's own function: no preconditions, postconditions, compensations or retries;
            :class:`~harness.runs.toolbox.BareToolbox`). Trials are recorded and judged as with
            transactions, and the run's evidence and configuration say ``transactions: false``,
            so ``harness compare`` of two runs gives the paired difference transactions make.
        concurrency: trials in flight at once in each worker (threads, each trial in its own
            episode): for agents that wait on a model server. The agent object is shared by a
            worker's threads, so its ``run`` must be safe to call at once (the built-in ones
            are).
        executor: ``processes`` (worker processes on this machine) or ``ray`` (Ray tasks, on
            the cluster at ``address``, or on a local one started for the run; needs the
            ``ray`` extra and a named agent).
        address: with ``executor="ray"``, the cluster to join (``ray://host:10001`` or
            ``auto``); None starts a local one.
        on_start: called with (task id, trial index) as each trial is handed to a worker (in
            the parent process).
        max_agent_errors: stop the run once the agent raised in more than this many trials
            (an int), or in more than this fraction of the trials finished (a float below 1,
            judged after ten): a clearly broken agent does not burn the whole run. Default: no
            limit; each trial whose agent raises fails as an agent error and the run goes on.
        store: the run's store, a database URL (``postgresql://user@host/db``: one store that
            the run's workers on every machine write, and other runs share). Default: the run
            folder's own SQLite file, ``harness.db``. The folder then records the URL without
            its password (``store.json``), and every command given the folder follows it; the
            password comes from the environment (``PGPASSWORD``) or a ``~/.pgpass`` or service
            file when the folder is used later.
        max_in_flight: the most model requests in flight at once to each model server, over
            the whole run (every worker process and Ray actor). Default: no limit.
        rate_limit: the most model requests started per period to each server, over the whole
            run: ``N/s``, ``N/min`` or ``N/h`` (``"600/min"``) or a
            :class:`~harness.runs.limits.Rate`. Default: no limit.
        token_limit: the most tokens each server's responses may use per period over the
            whole run (their ``usage.total_tokens``), in the same form: no request starts while
            the last period's add up to it. Default: no limit.
            The three hold through the run's store (:mod:`harness.runs.limits`), are recorded
            in its configuration and evidence (``limits``) and kept by ``harness resume``; a
            server one process finds down then stops every process's requests to it.

    A trial whose agent raises (any exception, ``SystemExit`` included) fails as the agent's
    error, its traceback in the trial's record. A model server that is down
    (:class:`~harness.errors.EndpointDown`, its circuit open), a worker process that died, a
    store that refuses a write or the agent-error limit stops the run: the trials in flight
    end, no new one starts, the run is recorded as interrupted and ``RunResult.stopped`` says
    why; ``harness resume`` runs the rest. Ctrl-C stops the same way (a second one at once).
    """
    if trials < 1 or workers < 1 or concurrency < 1:
        raise ConfigurationError("run_trials: trials, workers and concurrency must be >= 1")
    if executor not in EXECUTORS:
        raise ConfigurationError(
            f"run_trials: executor {executor!r}: give one of {', '.join(EXECUTORS)}"
        )
    if address is not None and executor != "ray":
        raise ConfigurationError("run_trials: address= names a Ray cluster: add executor='ray'")
    limit = AgentErrorLimit.of(max_agent_errors)
    limits = RunLimits.of(
        max_in_flight=max_in_flight, rate_limit=rate_limit, token_limit=token_limit
    )
    loaded = suite if isinstance(suite, Suite) else load_suite(suite)
    agent_options = dict(agent_options or {})
    policy = policy or Policy()
    plan = None if faults is None else load_faults(faults)
    if plan is not None:
        plan.check_suite(loaded)
        policy = plan.apply_to(policy)
    if isinstance(agent, str):
        agent = recorded_spec(agent)
        agent_obj = registry.create(agent, **agent_options)
    else:
        if executor == "ray":
            raise ConfigurationError(
                "run_trials: executor='ray' builds the agent in each Ray worker from its name: "
                "give a built-in name or module:Class, not an agent object"
            )
        agent_obj = agent
    judge_options = None if judge is None else dict(judge)
    # Tasks from tau2's files get the seeds tau2's runner gives its trials.
    scheme = "tau2" if loaded.tasks and all(t.source == "tau2" for t in loaded.tasks) else "harness"
    judge_obj = None if judge_options is None else OpenAIJudge(**judge_options)
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
    run_id = run_id or new_run_id()
    folder = Path(logs) / run_id
    fresh = not folder.exists()  # (a run refused before it is recorded leaves no folder then)
    if store is None:
        folder.mkdir(parents=True, exist_ok=True)
        url = store_url(folder)
        opened = Store(url, create=True)
    else:
        url = store
        opened = _shared_store(url, run_id)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_store_pointer(folder, url, run_id)
        except BaseException:
            opened.close()
            raise
    try:
        evidence = evidence_record(
            loaded, agent_obj.config(), policy, trials, seed, transactions=transactions
        )
        if plan is not None:
            evidence["faults"] = plan.describe()
        if limit is not None:
            evidence["max_agent_errors"] = limit.limit
        if judge_obj is not None:
            evidence["judge"] = judge_obj.config()
        unjudged = [t.id for t in selected if t.nl_assertions and judge_obj is None]
        if unjudged:
            evidence["unjudged_tasks"] = unjudged
        if limits is not None:
            evidence["limits"] = limits.to_config()
        write_json(folder, EVIDENCE_FILE, evidence)
        config = {
            "suite_path": str(loaded.path),
            # How the agent was named (rebuilt from it on resume), or an object's name.
            "agent": agent if isinstance(agent, str) else agent_obj.name,
            "agent_name": agent_obj.name,
            "agent_object": not isinstance(agent, str),
            "agent_options": redact(agent_options),
            "trials": trials,
            "workers": workers,
            "concurrency": concurrency,
            "executor": executor,
            "seed": seed,
            "tasks": [t.id for t in selected],
            "transactions": transactions,
            "seeds": scheme,
        }
        if limits is not None:
            config["limits"] = limits.to_config()
        if judge_options is not None:
            config["judge"] = redact(judge_options)
        spec = RunSpec(
            suite=str(loaded.path),
            agent=agent if isinstance(agent, str) else None,
            agent_options=agent_options,
            store_url=url,
            run_id=run_id,
            policy=policy,
            faults=None if plan is None else plan.for_run(run_id),
            **key_for_workers(signing_key, executor=executor),
            transactions=transactions,
            limits=limits,
            binding=run_binding(config, evidence),
            judge=judge_options,
        )
        seed_of = seeding(scheme, seed, trials)
        jobs = [Job(t.id, i, seed_of(t.id, i), "auto") for i in range(trials) for t in selected]
        # One worker, or an agent object: trials run here, on the suite already loaded (its
        # reference outcomes computed once) and the agent already built.
        where = executor_for(
            executor,
            spec,
            workers=workers,
            concurrency=concurrency,
            address=address,
            in_process=lambda: Worker(spec, suite=loaded, agent=agent_obj, judge=judge_obj),
        )
        return carry_out(
            RunRecord(opened, run_id, loaded.name, config, evidence),
            jobs,
            where,
            folder=folder,
            trials=trials,
            expected=len(jobs),
            progress=progress,
            on_start=None if on_start is None else lambda job: on_start(job.task_id, job.trial),
            signing_key=signing_key,
            max_agent_errors=limit,
        )
    except BaseException:
        if fresh and not _recorded(opened, run_id):
            opened.close()
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        opened.close()


def _recorded(store: Store, run_id: str) -> bool:
    """Whether ``store`` holds the run's row (True when it cannot be read: keep what is there)."""
    try:
        return any(r.id == run_id for r in store.runs())
    except Exception:
        return True

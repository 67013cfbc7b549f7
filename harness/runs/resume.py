"""``harness resume``: finish a crashed run without repeating a side effect.

A run killed part-way leaves three kinds of trials: finished ones (a trial row), interrupted
ones (an episode without a trial row, or escalated with every escalation now resolved) and
missing ones (no episode). :func:`resume_run` keeps the first, resumes the second (the agent
runs again on the same trial with ``resume=True``: its completed steps get their recorded
results, in-doubt calls are probed, nothing committed runs twice) and runs the third.

Each trial runs under its episode's lease (:meth:`Store.lease`), so two processes resuming the
same run at once never execute the same episode: the second one skips it.
"""

from __future__ import annotations

import os
import shlex
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._version import __version__
from ..agents import Agent, is_agent_spec, recorded_spec, registry
from ..agents.judge import JUDGE_DEFAULT_BASE_URL
from ..errors import ConfigurationError, HarnessError, SuiteError
from ..policy import Policy, Retry
from ..store import SigningKey, Store
from ..store.chain import run_binding
from ..suite import Suite, is_builtin_suite, load_suite
from .executors import check_placement, executor_for
from .layout import OpenRun, episode_id, open_run
from .lifecycle import AgentErrorLimit, RunRecord, RunResult, carry_out
from .limits import RunLimits
from .spec import Job, RunSpec, key_for_workers
from .start import REDACTED, ExecutorName, seeding
from .worker import TrialResult, Worker, trial_state

__all__ = [
    "ResumeResult",
    "agent_spec",
    "check_secret_servers",
    "resume_line",
    "resume_run",
    "run_agent",
    "run_policy",
    "run_suite",
    "signing_notes",
    "trial_plan",
    "worker_spec",
]


def run_suite(run: OpenRun, *, suite: str | Path | None = None, trust: bool = False) -> Suite:
    """The suite a run was made from, loaded only from a place the caller vouches for.

    A run folder is data, and whoever can write it can change the suite path it records
    (``suite_path`` in its configuration); loading a suite imports the code it names. So the
    recorded path is loaded only when it is a built-in suite's folder
    (:func:`~harness.suite.is_builtin_suite`) or ``trust`` is set; otherwise the caller names
    the suite (``suite``: a path or a built-in name), which must carry the run's suite name.

    Raises:
        SuiteError: the recorded suite is neither built in nor trusted (the message says to pass
            ``--suite``), the suite does not load, or it is not the run's suite.
    """
    if suite is not None:
        loaded = load_suite(suite)
        if loaded.name != run.run.suite:
            raise SuiteError(
                f"run {run.run.id} in {run.where} was made from suite {run.run.suite!r}; "
                f"{suite} is suite {loaded.name!r}"
            )
        return loaded
    path = run.config.get("suite_path")
    if not path:
        raise HarnessError(
            f"run {run.run.id} in {run.where} does not record its suite; it was not written by "
            "`harness run`"
        )
    if not trust and not is_builtin_suite(path):
        raise SuiteError(
            f"run {run.run.id} in {run.where} records its suite at {path}, which is not a "
            "built-in suite; a run folder does not choose the code that runs: name the suite "
            f"yourself (`--suite {path}`, suite=... in Python), or trust the recorded path "
            "(`--trust-suite`, trust=True)"
        )
    try:
        return load_suite(path)
    except SuiteError as exc:
        raise SuiteError(
            f"run {run.run.id} in {run.where}: its suite {path} does not load ({exc}); put the "
            "suite back where the run found it"
        ) from exc


def resume_line(run: OpenRun) -> str:
    """The ``harness resume`` command line that finishes ``run`` as it was started: with the
    ``--suite`` and ``--agent`` a run of the user's own suite or agent needs (a run folder does
    not choose the code that runs, so resume loads only built-in ones by itself)."""
    parts = ["harness", "resume", run.where]
    path = run.config.get("suite_path")
    if isinstance(path, str) and path and not is_builtin_suite(path):
        parts += ["--suite", path]
    recorded = run.config.get("agent")
    if run.config.get("agent_object"):
        parts += ["--agent", "module:Class"]
    elif isinstance(recorded, str) and is_agent_spec(recorded):
        parts += ["--agent", recorded]
    return shlex.join(parts)


def agent_spec(
    run: OpenRun, agent: str | Agent | None = None, *, trust: bool = False
) -> str | Agent:
    """What the run's agent is built from: the caller's agent or spec, else the run's record
    when it names a built-in agent or the caller trusts it.

    A run folder is data, and whoever can write it can change the agent spec it records
    (``agent`` in its configuration); building a ``module:Class`` or ``path/to/file.py:Class``
    agent imports the code it names. So, as with the suite (:func:`run_suite`), a recorded spec
    is built only when ``trust`` is set; otherwise the caller names the agent (``agent``).

    Raises:
        ConfigurationError: the run's agent was an object (nothing records how to build it), or
            its recorded spec is not a built-in agent and neither ``agent`` nor ``trust`` is
            given (the message says to pass ``--agent`` or ``--trust-agent``).
    """
    if agent is not None:
        return recorded_spec(agent) if isinstance(agent, str) else agent
    recorded = run.config.get("agent")
    named = isinstance(recorded, str) and (is_agent_spec(recorded) or recorded in registry.names())
    if run.config.get("agent_object") or not named:
        raise ConfigurationError(
            f"run {run.run.id} in {run.where} used agent {recorded!r}, an object given in "
            "Python (a run records how to build only a built-in agent or a module:Class or "
            "path/to/file.py:Class spec); name its class (`--agent module:Class`), or resume "
            "from Python with resume_run(folder, agent=...)"
        )
    assert isinstance(recorded, str)
    if is_agent_spec(recorded) and not trust:
        raise ConfigurationError(
            f"run {run.run.id} in {run.where} records its agent as {recorded}, which is not a "
            "built-in agent; a run folder does not choose the code that runs: name the agent "
            f"yourself (`--agent {recorded}`, agent=... in Python), or trust the recorded spec "
            "(`--trust-agent`, trust_agent=True)"
        )
    return recorded


def run_agent(
    run: OpenRun,
    agent: str | Agent | None = None,
    *,
    trust: bool = False,
    secrets: dict[str, Any] | None = None,
) -> Agent:
    """A new agent as the run configured it (:func:`agent_spec` says from what), with its
    recorded options and ``secrets`` given back.

    Raises:
        ConfigurationError: as :func:`agent_spec`; the spec does not build an agent, or builds
            one whose name is not the run's agent's.
    """
    chosen = agent_spec(run, agent, trust=trust)
    if not isinstance(chosen, str):
        return chosen
    built = registry.create(chosen, **agent_options(run, secrets))
    expected = run.config.get("agent_name")
    if expected and built.name != expected:
        raise ConfigurationError(
            f"run {run.run.id} in {run.where} was made by agent {expected!r} "
            f"({run.config.get('agent')}); {chosen} builds agent {built.name!r}: name the run's "
            "agent"
        )
    return built


# Where each secret a run does not record is sent: the recorded options naming its server (the
# first one given), and the variables with which a user names a server of their own.
_SECRET_SERVERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "api_key": (("base_url",), ("HARNESS_OPENAI_BASE_URL",)),
    "user_api_key": (
        ("user_base_url", "base_url"),
        ("HARNESS_USER_BASE_URL", "HARNESS_OPENAI_BASE_URL"),
    ),
}


def check_secret_servers(
    run: OpenRun, secrets: dict[str, Any] | None, *, trust: bool = False
) -> None:
    """Refuse to give a secret (an API key) back to an agent whose recorded options would send
    it to a server the caller did not name.

    A run folder is data: whoever can write it can record any ``base_url``. A key from the
    caller's environment is given back only when the server it goes to is the agent's
    default, or one the caller names (``HARNESS_OPENAI_BASE_URL``; for the user simulator's
    key ``HARNESS_USER_BASE_URL`` too), or when the caller trusts the folder (``trust``:
    ``--trust-agent``).

    Raises:
        ConfigurationError: naming the server, the key and both ways to go on.
    """
    if trust or not secrets:
        return
    recorded_judge = run.config.get("judge")
    if (
        secrets.get("judge_api_key")
        and isinstance(recorded_judge, dict)
        and recorded_judge.get("api_key") == REDACTED  # (no key recorded: none is given back)
    ):
        judge_server = str(recorded_judge.get("base_url") or "").rstrip("/")
        named = {
            JUDGE_DEFAULT_BASE_URL.rstrip("/"),
            os.environ.get("HARNESS_JUDGE_BASE_URL", "").rstrip("/"),
        }
        proxy = recorded_judge.get("proxy")
        if judge_server not in named or proxy:
            where = f"{judge_server} through the proxy {proxy}" if proxy else judge_server
            raise ConfigurationError(
                f"run {run.run.id} in {run.where} records its judge's server as {where}; a run "
                "folder does not choose where your key goes, so HARNESS_JUDGE_API_KEY was not "
                "given back and nothing was sent: name that server yourself "
                f"(HARNESS_JUDGE_BASE_URL={judge_server}), or trust the folder's configuration "
                "(`--trust-agent`, trust_agent=True)"
            )
    stored = dict(run.config.get("agent_options") or {})
    for key in secrets:
        if key not in stored or key not in _SECRET_SERVERS:
            continue
        options, variables = _SECRET_SERVERS[key]
        server = next((str(stored[o]) for o in options if stored.get(o)), None)
        if stored.get("proxy"):
            # Whatever the server, the key would travel through the proxy the folder names.
            raise ConfigurationError(
                f"run {run.run.id} in {run.where} records a proxy for its agent "
                f"({stored['proxy']}); a run folder does not choose where your key goes, so "
                f"{key} was not given back and nothing was sent: trust the folder's agent "
                "configuration (`--trust-agent`, trust_agent=True) if that proxy is yours"
            )
        if server is None:
            continue  # (the agent's default server)
        named = {str(os.environ.get(v, "")).rstrip("/") for v in variables} - {""}
        if server.rstrip("/") in named:
            continue
        raise ConfigurationError(
            f"run {run.run.id} in {run.where} records its agent's server for {key} as "
            f"{server}; a run folder does not choose where your key goes, so it was not "
            f"given back and nothing was sent: name that server yourself ({variables[0]}="
            f"{server}), or trust the folder's agent configuration (`--trust-agent`, "
            "trust_agent=True)"
        )


def judge_options(run: OpenRun, secrets: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The options of the run's judge as it recorded them, its key given back by the caller
    (``judge_api_key``); None when the run had no judge."""
    stored = run.config.get("judge")
    if not isinstance(stored, dict):
        return None
    options = {k: v for k, v in stored.items() if v != REDACTED}
    key = (secrets or {}).get("judge_api_key")
    if key and stored.get("api_key") == REDACTED:
        options["api_key"] = key
    return options


def agent_options(run: OpenRun, secrets: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's agent options, with the secrets it did not record given back by the caller."""
    stored = dict(run.config.get("agent_options") or {})
    options = {k: v for k, v in stored.items() if v != REDACTED}
    for key, value in (secrets or {}).items():
        if key in stored:
            options[key] = value
    return options


def run_policy(run: OpenRun) -> tuple[Policy, list[str]]:
    """The run's policy rebuilt from its evidence record, and what could not be rebuilt."""
    described = run.evidence.get("policy") or {}
    notes: list[str] = []
    try:
        retry = dict(described.get("retry") or {})
        on = retry.pop("on", ["TransientError"])
        if on != ["TransientError"]:
            notes.append(
                f"the run's retry predicate ({on}) cannot be rebuilt from the record; resumed "
                "trials retry harness.TransientError only (pass policy=... to resume_run)"
            )
        return (
            Policy(
                decisions=described.get("decisions") or {},
                retry=Retry(**retry),
                timeout=described.get("timeout"),
                exhausted=described.get("exhausted", "continue"),
                unsafe=described.get("unsafe", "escalate"),
            ),
            notes,
        )
    except (ConfigurationError, TypeError, ValueError) as exc:
        notes.append(f"the run's policy does not rebuild ({exc}); the default policy is used")
        return Policy(), notes


@dataclass
class ResumeResult:
    """What ``resume_run`` did.

    Attributes:
        run: every trial of the run now finished, with the statistics over them.
        kept: episodes that had finished before (left as they were).
        resumed: interrupted episodes resumed and finished now.
        started: missing trials run now.
        retried: trials whose last attempt had ended in an infrastructure error, run again
            now in a new episode (the failed attempt stays in the record).
        pending: episodes waiting for a person (``harness escalations RUN``).
        skipped: episodes another process held (or finished meanwhile).
        notes: anything the user should know (a policy that could not be rebuilt...).
    """

    run: RunResult
    kept: list[str] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    started: list[str] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Whether every trial of the run now has its result (none waiting, none stopped)."""
        return self.run.complete

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "run_id": self.run.run_id,
            "folder": self.run.where,
            "kept": self.kept,
            "resumed": self.resumed,
            "started": self.started,
            "retried": self.retried,
            "pending": self.pending,
            "missing": self.run.missing,
            "complete": self.complete,
            "skipped": self.skipped,
            "notes": self.notes,
            "summary": self.run.summary() if self.run.results else None,
        }


def signing_notes(store: Store, run_id: str, key: SigningKey | None) -> list[str]:
    """Refuse a key other than the run's; note a signed run resumed without its key."""
    ids = {e.id for e in store.episodes(run_id)}
    signers = {
        s.key_id
        for s in store.signatures()
        if s.subject == run_id or (s.scope == "episode" and s.subject in ids)
    }
    if key is not None and signers - {key.key_id}:
        raise ConfigurationError(
            f"run {run_id} was signed with key {', '.join(sorted(signers))}, not with the key "
            f"given ({key.key_id}); resume it with the key it was signed with"
        )
    if key is None and signers:
        return [
            f"run {run_id} was signed (key {', '.join(sorted(signers))}) and this resume is "
            "not: the episodes it ends and the run's manifest go unsigned, and an audit with "
            "the public key names them; resume with --signing-key to sign them"
        ]
    return []


def trial_plan(
    store: Store, run_id: str, tasks: list[str], trials: int, seed: int, scheme: str = "harness"
) -> tuple[list[Job], dict[str, tuple[str, str]]]:
    """What each trial of the run needs now: its state and the episode of its attempt, by trial
    id (:func:`~harness.runs.worker.trial_state`), and the jobs of those left to run (mode
    ``auto``: decided again under each trial's lease)."""
    jobs: list[Job] = []
    plan: dict[str, tuple[str, str]] = {}
    seed_of = seeding(scheme, seed, trials)
    for i in range(trials):
        for task_id in tasks:
            eid = episode_id(run_id, task_id, i)
            plan[eid] = trial_state(store, eid)
            if plan[eid][0] not in ("done", "pending"):
                jobs.append(Job(task_id, i, seed_of(task_id, i), "auto"))
    return jobs, plan


def worker_spec(
    run: OpenRun,
    suite: Suite,
    agent: str | Agent,
    policy: Policy,
    *,
    secrets: dict[str, Any] | None = None,
    lease_seconds: float = 600.0,
    signing_key: SigningKey | None = None,
    executor: str = "processes",
) -> RunSpec:
    """How a worker of this process (or another it starts) runs trials of the opened run, as
    the run recorded them: its store, its agent options with ``secrets`` given back, its
    limits, bare tools when the run called them bare (runs before the option: with
    transactions)."""
    return RunSpec(
        suite=str(suite.path),
        agent=agent if isinstance(agent, str) else None,
        agent_options=agent_options(run, secrets),
        store_url=run.url,
        run_id=run.run.id,
        policy=policy,
        lease_seconds=lease_seconds,
        **key_for_workers(signing_key, executor=executor),
        transactions=bool(run.config.get("transactions", True)),
        limits=RunLimits.from_config(run.config),
        binding=run_binding(run.config, run.evidence),
        judge=judge_options(run, secrets),
    )


def resume_run(
    folder: str | Path,
    *,
    workers: int = 1,
    agent: str | Agent | None = None,
    policy: Policy | None = None,
    progress: Callable[[TrialResult], None] | None = None,
    lease_seconds: float = 600.0,
    secrets: dict[str, Any] | None = None,
    suite: str | Path | None = None,
    trust: bool = False,
    trust_agent: bool = False,
    signing_key: SigningKey | None = None,
    concurrency: int = 1,
    executor: ExecutorName = "processes",
    address: str | None = None,
    max_agent_errors: float | None = None,
) -> ResumeResult:
    """Finish the run in ``folder``: keep finished trials, resume interrupted ones, run the rest.

    Args:
        folder: the run folder (``logs/<run>``).
        workers: processes running trials in parallel.
        agent: the agent, or how to build it (a built-in name, ``module:Class`` or
            ``path/to/file.py:Class``); default: the run's, rebuilt from the spec it records,
            which must be a built-in agent unless ``trust_agent`` is set (:func:`agent_spec`).
        policy: the policy (default: the run's, rebuilt from its evidence record).
        progress: called with each trial finished now.
        lease_seconds: how long an episode's lease lasts without renewal (its holder renews
            it every third of that while it runs).
        secrets: agent options the run did not record (an API key), given back by name.
        suite: the suite to resume the run on (a path or a built-in name; it must be the run's
            suite); needed unless the run's suite is built in or ``trust`` is set
            (:func:`run_suite`).
        trust: load the suite at the path the run folder records, whatever it is.
        trust_agent: build the agent from the spec the run folder records, whatever it names.
        signing_key: the key the run was signed with: each episode that ends now is signed,
            and the run's manifest again at the end. A run signed with another key is refused;
            a signed run resumed without its key gets a note (its new heads go unsigned, and
            an audit with the public key names them).
        concurrency: trials in flight at once in each worker (threads).
        executor: ``processes`` or ``ray`` (Ray tasks; ``address`` names the cluster, None
            starts a local one), as for :func:`~harness.runs.start.run_trials`.
        address: with ``executor="ray"``, the cluster to join.
        max_agent_errors: stop once the agent raised past this limit, as for
            :func:`~harness.runs.start.run_trials` (default: the run's).

    A trial whose last attempt ended in an infrastructure error (a model server that failed
    past its retries) runs again in a new episode; the failed attempt stays in the record and
    in the usage totals. A model server that is down, a worker process that dies, a store
    that refuses a write or Ctrl-C stops the resume as it stops a run: the run stays
    interrupted and ``run.stopped`` says why. ``ResumeResult.complete`` says whether every
    trial has its result now.

    Raises:
        RunNotFound: the folder is not a run folder.
        StoreError: its database is damaged or from a newer harness.
        SuiteError: the run's suite is not built in and neither ``suite`` nor ``trust`` is
            given, or the suite does not load.
        ConfigurationError: the run's agent is not built in and neither ``agent`` nor
            ``trust_agent`` is given, or it does not build; or ``signing_key`` is not the key
            the run was signed with.
    """
    check_placement("resume_run", workers, concurrency, executor, address)
    with open_run(folder, writable=True) as run:
        store: Store = run.store
        config = run.config
        for written in store.trial_rows(run.run.id):  # (a row it cannot read: refused first)
            TrialResult.from_row(written)
        loaded = run_suite(run, suite=suite, trust=trust)
        notes: list[str] = []
        if policy is None:
            policy, notes = run_policy(run)
        notes += signing_notes(store, run.run.id, signing_key)
        spec = agent_spec(run, agent, trust=trust_agent)
        check_secret_servers(run, secrets, trust=trust_agent)
        agent_obj = run_agent(run, spec, secrets=secrets)
        if executor == "ray" and not isinstance(spec, str):
            raise ConfigurationError(
                "resume_run: executor='ray' builds the agent in each Ray worker from its name: "
                "give a built-in name or module:Class, not an agent object"
            )
        run_id = run.run.id
        tasks = list(config.get("tasks") or [t.id for t in loaded.tasks])
        trials = int(config.get("trials") or 1)
        seed = int(config.get("seed") or 0)
        if max_agent_errors is None:
            max_agent_errors = run.evidence.get("max_agent_errors")
        limit = AgentErrorLimit.of(max_agent_errors)
        out = ResumeResult(RunResult(run_id, run.folder, loaded.name, trials, []), notes=notes)
        # (A run recorded before seed schemes seeded every trial the harness's way.)
        scheme = str(config.get("seeds") or "harness")
        jobs, plan = trial_plan(store, run_id, tasks, trials, seed, scheme)
        states = {eid: state for eid, (state, _) in plan.items()}
        for state, attempt in plan.values():
            if state == "done":
                out.kept.append(attempt)
            elif state == "pending":
                out.pending.append(attempt)
        evidence = dict(run.evidence)
        evidence.setdefault("resumes", []).append(
            {
                "at": time.time(),
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "harness_version": __version__,
                "trials": len(jobs),
            }
        )
        row = run.run
        record = RunRecord(store, row.id, row.suite, config, evidence, created_at=row.created_at)
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

        def finished(job: Job, result: TrialResult | None) -> None:
            eid = episode_id(run_id, job.task_id, job.trial)
            if result is None:
                out.skipped.append(eid)
                return
            where = {"resume": out.resumed, "retry": out.retried}.get(states[eid], out.started)
            where.append(result.episode_id)

        where = executor_for(
            executor,
            run_spec,
            workers=workers,
            concurrency=concurrency,
            address=address,
            in_process=lambda: Worker(run_spec, suite=loaded, agent=agent_obj),
        )
        out.run = carry_out(
            record,
            jobs,
            where,
            folder=run.folder,
            target=run.where,
            trials=trials,
            expected=trials * len(tasks),
            progress=progress,
            on_result=finished,
            signing_key=signing_key,
            max_agent_errors=limit,
        )
        return out

"""The commands that run trials: ``harness run``, ``harness resume`` and ``harness replay``."""

from __future__ import annotations

import contextlib
import datetime
import functools
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from ..agents import AgentSpec, is_agent_spec, registry
from ..agents.endpoint import endpoints
from ..agents.spec import typed_options
from ..errors import HarnessError, SuiteError
from ..faults import FaultPlan
from ..report.gate import Bar, Basis, exit_status
from ..report.model import Report, load_report
from ..report.terminal import render_gate, render_summary
from ..runs import RunResult, TrialResult, replay_episode, resume_run, run_trials
from ..runs.executors import EXECUTORS, StopOnSigint, Tally
from ..runs.join import work_run
from ..runs.limits import Rate
from ..runs.ray_pool import RAY_LEASE_SECONDS
from ..suite import Task as SuiteTask
from ..suite import load_suite, resolve_suite
from ._common import (
    OPENAI_DEFAULT_BASE_URL,
    console,
    dump,
    fail,
    judge_settings,
    openai_said,
    openai_settings,
    secrets,
    signing_key,
    signing_key_option,
    suite_options,
    unverified_option,
    user_settings,
    verified,
    verify_options,
    what_is_left,
)
from .report import GATE_HELP, INFRA_OPTION, all_k_option, fail_under_options, judge_bars

__all__ = ["replay_command", "resume_command", "run_command"]

_SIGNED = "each episode's head as it ends and the run's manifest"

EXECUTOR_OPTION = click.option(
    "--executor",
    type=click.Choice(EXECUTORS),
    default="processes",
    show_default=True,
    help="Where workers run: processes on this machine, or Ray tasks (the ray extra).",
)
ADDRESS_OPTION = click.option(
    "--address",
    default=None,
    help="--executor ray: the Ray cluster to join (ray://host:10001, or auto); "
    "default: a local one for the run.",
)


def stops_on_ctrl_c(command: Callable[..., None]) -> Callable[..., None]:
    """The command owns Ctrl-C from its first line (:class:`StopOnSigint`): pressed while the
    suite loads or trials run, the run stops after the trials in flight, and is recorded as
    interrupted; pressed twice, at once."""

    @functools.wraps(command)
    def wrapped(*args: Any, **kwargs: Any) -> None:
        stop, new = StopOnSigint.active()  # (the command line installs it as it loads this)
        try:
            command(*args, **kwargs)
        finally:
            if new:
                stop.restore()

    return wrapped


def _agent_error_limit(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> float | None:
    """``--max-agent-errors``: a count (``5``) or a fraction of the trials (``0.2``, ``20%``)."""
    if value is None:
        return None
    text = value.strip()
    try:
        number = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: give a count of trials (5) or a fraction of them (0.2 or 20%)"
        ) from None
    if (
        not math.isfinite(number)
        or number < 0
        or (number >= 1 and not number.is_integer())
        or (text.endswith("%") and number >= 1)
    ):
        raise click.BadParameter(
            f"{value!r}: give a count >= 0 (5) or a fraction below 1 (0.2 or 20%)"
        )
    return int(number) if number >= 1 or (number == 0 and not text.endswith("%")) else number


def _rate_option(ctx: click.Context, param: click.Parameter, value: str | None) -> Rate | None:
    """``--rate-limit`` and ``--token-limit``: ``N/s``, ``N/min`` or ``N/h``."""
    if value is None:
        return None
    try:
        return Rate.parse(value, what=f"--{(param.name or '').replace('_', '-')}")
    except HarnessError as exc:
        raise click.BadParameter(str(exc)) from None


MAX_AGENT_ERRORS_OPTION = click.option(
    "--max-agent-errors",
    default=None,
    callback=_agent_error_limit,
    metavar="N|FRACTION",
    help="Stop the run once the agent raised in more than N trials, or in more than this "
    "fraction of the trials finished (0.2 or 20%, judged after ten) [default: no limit; a "
    "trial whose agent raises fails as an agent error and the run goes on].",
)


def check_agent(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
    """``--agent``, checked before anything runs: a registered name, or a spec whose class
    imports and has an agent's methods (:meth:`AgentSpec.load`)."""
    if value is None or value in registry.names():
        return value
    try:
        if not is_agent_spec(value):
            registry.create(value)  # (raises: not registered)
        AgentSpec.parse(value).load()
    except HarnessError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def rerun_agent_options(command: Any) -> Any:
    """``--agent`` and ``--trust-agent``: which agent replay and resume may build."""
    command = click.option(
        "--trust-agent",
        is_flag=True,
        help="Build the agent from the module:Class or file.py:Class the run folder records "
        "(it imports the code it names), and give your API key back to the server it records "
        "(without it, only to the agent's default server or one you name with "
        "HARNESS_OPENAI_BASE_URL).",
    )(command)
    return click.option(
        "--agent",
        "agent",
        default=None,
        callback=check_agent,
        help="The run's agent (a built-in name, module:Class or path/to/file.py:Class); needed "
        "unless the run's agent is built in or --trust-agent is given.",
    )(command)


def show_judging(tasks: list[SuiteTask], judge: dict[str, Any] | None) -> None:
    """Say before the first trial which judge grades the tasks' natural-language assertions,
    or which tasks cannot pass without one."""
    judged = [t.id for t in tasks if t.nl_assertions]
    if not judged:
        return
    if judge is not None:
        key = "its key from HARNESS_JUDGE_API_KEY" if judge.get("api_key") else "no key"
        console.print(
            f"judge: model {judge['model']!r} at {judge['base_url']}, {key}, grades the "
            f"natural-language assertions of {len(judged)} task(s)",
            markup=False,
        )
        return
    shown = ", ".join(judged[:5]) + (f" and {len(judged) - 5} more" if len(judged) > 5 else "")
    console.print(
        f"[yellow]not judged[/]: {len(judged)} task(s) have natural-language assertions and no "
        f"judge was given ({escape(shown)}): their trials cannot pass; name a judge with "
        "--judge-model (and --judge-base-url, HARNESS_JUDGE_API_KEY)"
    )


@click.command("run", epilog=GATE_HELP)
@click.argument("suite")
@click.option(
    "--agent",
    default="simulated",
    show_default=True,
    callback=check_agent,
    help="scripted, simulated, openai, or your own agent class: module:Class (from the current "
    "directory or an installed package) or path/to/file.py:Class.",
)
@click.option(
    "--agent-option",
    "agent_option_pairs",
    multiple=True,
    metavar="KEY=VALUE",
    help="An option of the agent's constructor, typed by its annotation (repeatable): "
    "--agent-option retries=3 --agent-option strict=true; lists and dicts as JSON. Given after "
    "the flags above, it wins over them. The run records it (a secret-named one redacted), and "
    "resume builds the agent with it again.",
)
@click.option("--trials", default=4, show_default=True, type=click.IntRange(1))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1))
@click.option(
    "--concurrency",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    help="Trials in flight at once in each worker (threads): for agents that wait on a model "
    "server.",
)
@EXECUTOR_OPTION
@ADDRESS_OPTION
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--logs", default="logs", show_default=True, type=click.Path(file_okay=False))
@click.option(
    "--store",
    default=None,
    metavar="URL",
    help="The run's store: a database URL (postgresql://user@host/db) that workers on other "
    "machines can write. The run folder records it without its password; the password comes "
    "from PGPASSWORD or ~/.pgpass. [default: the run folder's harness.db]",
)
@click.option(
    "--error-rate",
    default=0.1,
    show_default=True,
    type=click.FloatRange(0, 1),
    help="simulated agent: per-step error rate.",
)
@click.option(
    "--self-conditioning",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0),
    help="simulated agent: how much each error raises the rate.",
)
@click.option("--task", "tasks", multiple=True, help="Only this task id (repeatable).")
@click.option(
    "--base-url",
    default=None,
    help="openai agent: the model server's URL, any OpenAI-compatible one (vLLM, llama.cpp, "
    "Ollama, a hosted API; docs/models.md) [default: HARNESS_OPENAI_BASE_URL, else "
    f"{OPENAI_DEFAULT_BASE_URL}]. Its key comes from HARNESS_OPENAI_API_KEY.",
)
@click.option(
    "--model",
    default=None,
    help="openai agent: the model's name as the server knows it [default: HARNESS_OPENAI_MODEL, "
    "else 'default'].",
)
@click.option(
    "--max-in-flight",
    default=None,
    type=click.IntRange(1),
    help="Model requests in flight at once to each model server over the whole run: every "
    "worker process and Ray actor shares the limit through the run's store, and a request "
    "waits for a slot [default: no limit].",
)
@click.option(
    "--rate-limit",
    default=None,
    callback=_rate_option,
    metavar="N/s|N/min|N/h",
    help="Model requests started per period to each model server over the whole run, in a "
    "sliding window (600/min): a request waits until the window has room [default: no limit].",
)
@click.option(
    "--token-limit",
    default=None,
    callback=_rate_option,
    metavar="N/s|N/min|N/h",
    help="Tokens the responses of each model server may use per period over the whole run "
    "(their usage.total_tokens, in a sliding window; 100000/min): no request starts while "
    "the window's total is at the limit, so the requests in flight may pass it by what they "
    "use [default: no limit].",
)
@click.option(
    "--model-retries",
    default=None,
    type=click.IntRange(0),
    help="openai agent and user: retries of one failed model request (429, 5xx, no "
    "answer) [default: 3].",
)
@click.option(
    "--model-retry-for",
    default=None,
    type=click.FloatRange(0),
    metavar="SECONDS",
    help="openai agent and user: the most time one model request may spend on its retries and "
    "their waits, the server's Retry-After always waited out within it [default: 120].",
)
@INFRA_OPTION
@click.option(
    "--user",
    type=click.Choice(["openai", "scripted"]),
    default=None,
    help="openai agent: converse with a user as tau2-bench does (the agent greets, the user "
    "answers until it says ###STOP###, ###TRANSFER### or ###OUT-OF-SCOPE###): openai, a model "
    "prompted with the task's user scenario; scripted, a user who states the task's "
    "instruction, then stops.",
)
@click.option(
    "--user-model", default=None, help="openai user: model name (default: the agent's --model)."
)
@click.option(
    "--user-base-url",
    default=None,
    help="openai user: server URL (…/v1; default: the agent's --base-url). "
    "HARNESS_USER_API_KEY is its key.",
)
@click.option(
    "--judge-model",
    default=None,
    help="The model that grades tasks' natural-language assertions (nl_assertions) on each "
    "trial's conversation, with tau2-bench's prompt [default: HARNESS_JUDGE_MODEL; none: "
    "those tasks cannot pass, and the run says so].",
)
@click.option(
    "--judge-base-url",
    default=None,
    help="The judge's server (…/v1) [default: HARNESS_JUDGE_BASE_URL, else "
    "http://127.0.0.1:8000/v1]. HARNESS_JUDGE_API_KEY is its key.",
)
@click.option(
    "--max-steps",
    default=None,
    type=click.IntRange(1),
    help="With --user: messages before the conversation ends as max_steps [default: 200, tau2's].",
)
@click.option(
    "--max-errors",
    default=None,
    type=click.IntRange(1),
    help="With --user: failed tool calls before the conversation ends as too_many_errors "
    "[default: 10, tau2's].",
)
@click.option(
    "--no-transactions",
    "bare",
    is_flag=True,
    help="Call the agent's tools bare (their own functions: no checks, retries or undo), "
    "recorded and judged as usual, to compare with a run under transactions "
    "(harness compare).",
)
@click.option(
    "--faults",
    "faults_file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Inject the faults of this plan (JSON or TOML) and report detection by class.",
)
@MAX_AGENT_ERRORS_OPTION
@signing_key_option(_SIGNED)
@all_k_option
@fail_under_options
@stops_on_ctrl_c
def run_command(
    suite: str,
    agent: str,
    agent_option_pairs: tuple[str, ...],
    trials: int,
    workers: int,
    concurrency: int,
    executor: str,
    address: str | None,
    seed: int,
    logs: str,
    store: str | None,
    error_rate: float,
    self_conditioning: float,
    tasks: tuple[str, ...],
    base_url: str | None,
    model: str | None,
    max_in_flight: int | None,
    rate_limit: Rate | None,
    token_limit: Rate | None,
    model_retries: int | None,
    model_retry_for: float | None,
    infra: str,
    user: str | None,
    user_model: str | None,
    user_base_url: str | None,
    judge_model: str | None,
    judge_base_url: str | None,
    max_steps: int | None,
    max_errors: int | None,
    bare: bool,
    faults_file: str | None,
    max_agent_errors: float | None,
    signing_key_file: str | None,
    all_k: bool,
    bars: list[Bar],
    fail_under_on: Basis,
) -> None:
    """Run SUITE (a folder, a tau2 tasks.json, or a built-in name) as repeated trials.

    The run ends with pass^k, failures by class and every infrastructure failure with its
    cause. It exits non-zero when infrastructure failures dominate (more than half of the
    trials) or, with --fail-under, when a metric is below its bar: a run CI can gate on.
    """
    for bar in bars:
        try:
            bar.check_k(trials)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--fail-under'") from None
    try:
        path = resolve_suite(suite)
    except SuiteError as exc:
        raise click.BadParameter(str(exc), param_hint="SUITE") from None
    options: dict[str, Any] = {}
    if agent == "simulated":
        options = {"error_rate": error_rate, "self_conditioning": self_conditioning}
    elif agent == "openai":
        options = openai_settings(base_url, model)
        console.print(openai_said(base_url, model), markup=False)
        if model_retries is not None:
            options["attempts"] = model_retries + 1
        if model_retry_for is not None:
            options["retry_for"] = model_retry_for
    if agent_option_pairs:
        try:
            options.update(typed_options(agent, registry.factory(agent), agent_option_pairs))
        except HarnessError as exc:
            raise click.BadParameter(str(exc), param_hint="'--agent-option'") from None
    limit_flags: dict[str, object] = {
        "--max-in-flight": max_in_flight,
        "--rate-limit": rate_limit,
        "--token-limit": token_limit,
    }
    for flag, value in limit_flags.items():
        if value is not None and agent in ("scripted", "simulated"):
            raise click.BadParameter(
                f"{flag} limits model requests (the openai agent's, or those of an agent of "
                f"yours through harness.agents.endpoint); the {agent!r} agent sends none",
                param_hint=f"'{flag}'",
            )
    model_flags = {
        "--model-retries": model_retries,
        "--model-retry-for": model_retry_for,
    }
    for flag, value in model_flags.items():
        if value is not None and agent != "openai":
            raise click.BadParameter(
                f"{flag} applies to the openai agent's model requests, not {agent!r}'s",
                param_hint=f"'{flag}'",
            )
    if address is not None and executor != "ray":
        raise click.BadParameter(
            "--address names a Ray cluster: add --executor ray", param_hint="'--address'"
        )
    conversation = {
        "--user-model": user_model,
        "--user-base-url": user_base_url,
        "--max-steps": max_steps,
        "--max-errors": max_errors,
    }
    if user is None:
        given = [flag for flag, value in conversation.items() if value is not None]
        if given:
            raise click.BadParameter(
                f"{', '.join(given)} only apply to a conversation: add --user openai|scripted",
                param_hint="'--user'",
            )
    elif agent != "openai":
        raise click.BadParameter(
            f"a user converses with the openai agent only, not {agent!r}: add --agent openai",
            param_hint="'--user'",
        )
    else:
        options.update(
            user_settings(
                user,
                model=user_model,
                base_url=user_base_url,
                max_steps=max_steps,
                max_errors=max_errors,
            )
        )
    judge = judge_settings(judge_model, judge_base_url)
    try:
        plan = None if faults_file is None else FaultPlan.load(faults_file)
        key = signing_key(signing_key_file)
        loaded = load_suite(path)
        selected = [t for t in loaded.tasks if not tasks or t.id in tasks]
        total = len(selected) * trials
        show_judging(selected, judge)
        flight = Flight()
        with trial_progress(f"{loaded.name} x {trials}", total, flight) as tick:
            result = run_trials(
                loaded,
                agent=agent,
                agent_options=options,
                trials=trials,
                workers=workers,
                seed=seed,
                logs=logs,
                store=store,
                tasks=tasks or None,
                progress=tick,
                faults=plan,
                signing_key=key,
                transactions=not bare,
                concurrency=concurrency,
                executor=executor,  # type: ignore[arg-type]
                address=address,
                on_start=flight.started,
                max_agent_errors=max_agent_errors,
                max_in_flight=max_in_flight,
                rate_limit=rate_limit,
                token_limit=token_limit,
                judge=judge,
            )
    except HarnessError as exc:
        fail(exc)
    status = 0
    if result.results:
        report = _summary(result.where, all_k, infra=infra)
        if plan is not None:
            from ..report.reliability import load_reliability, render_reliability

            render_reliability(load_reliability(result.where, result.run_id), console)
        if not result.interrupted:
            judgements = judge_bars(report, bars, fail_under_on)
            render_gate(judgements, fail_under_on, console)
            status = exit_status(report, judgements)
    show_agent_errors(result)
    status = show_stop(result, status)
    click.echo(f"run folder: {result.folder}")
    if status:
        sys.exit(status)


def show_agent_errors(result: RunResult) -> None:
    """Say which trials' agent raised, the first error, and where its traceback is."""
    errors = result.agent_errors()
    if not errors:
        return
    first = errors[0]
    console.print(
        f"[red]{len(errors)} trial(s) ended in an agent error[/red] (counted as the agent's "
        f"failures); first: {escape(first.task_id)} trial {first.trial}: "
        f"{escape(first.agent_error or '')}\n"
        f"its traceback: `harness audit {result.where} --episode {first.episode_id}`"
    )


def stop_status(result: RunResult, status: int) -> int:
    """The exit status a run or resume gives: 3 stopped (a server down, a worker lost, a store
    refusing a write, too many agent errors), 130 interrupted by Ctrl-C, 4 trials left undone
    (held by another process, or waiting for a person), else ``status``."""
    if result.stopped is not None:
        return 3
    if result.interrupted:
        return 130
    return status or 4 if result.missing else status


def show_stop(result: RunResult, status: int) -> int:
    """Say why a run or resume stopped, and what is left; its exit status (:func:`stop_status`)."""
    done = len(result.results)
    if result.stopped is None and not result.interrupted and not result.missing:
        return stop_status(result, status)
    resume, waiting = what_is_left(result.where)
    if result.stopped is not None:
        console.print(
            f"[red]stopped[/red] after {done} trials: {escape(result.stopped)}\n"
            f"the store is consistent; `{escape(resume)}` runs the rest"
        )
    elif result.interrupted:
        console.print(
            f"[yellow]interrupted[/yellow] after {done} trials; the store is consistent; "
            f"`{escape(resume)}` runs the rest"
        )
    elif waiting:
        console.print(
            f"[yellow]{result.missing} trial(s) not finished[/yellow]: {waiting} escalation(s) "
            f"waiting for a person; `harness escalations {escape(result.where)}` shows each and "
            f"how to decide it, then `{escape(resume)}` finishes them"
        )
    else:
        console.print(
            f"[yellow]{result.missing} trial(s) not finished[/yellow] (held by another process); "
            f"`{escape(resume)}` runs them once they are free"
        )
    return stop_status(result, status)


@contextlib.contextmanager
def trial_progress(
    description: str, total: int, flight: Flight
) -> Iterator[Callable[[TrialResult], None]]:
    """What a run shows as its trials finish; yields the function each finished trial is given.

    On a terminal, a live bar. Elsewhere (a CI log, a file, a pipe) a bar is redrawn into
    wrapped, cut lines, so a plain line instead, every tenth of the trials, at the last one, and
    at least once a minute: ``retail x 8: 320/912 done, passed 301, failed 19, infrastructure 0,
    in flight 16, 0:01:05``. (``TTY_COMPATIBLE=1`` or ``FORCE_COLOR`` force the bar.)
    """
    tally = Tally()
    if console.is_terminal:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("done, {task.fields[tally]}"),
            flight,
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            bar = progress.add_task(description, total=total, tally=tally)

            def advance(result: TrialResult) -> None:
                tally.add(result)
                flight.finished(result)
                progress.update(bar, advance=1, tally=tally)

            yield advance
        return
    every = max(1, math.ceil(total / 10))
    lock = threading.Lock()
    started = time.monotonic()
    seen = {"done": 0, "said": started}

    def line(result: TrialResult) -> None:
        with lock:
            tally.add(result)
            flight.finished(result)
            seen["done"] += 1
            done, now = seen["done"], time.monotonic()
            if done % every and done != total and now - seen["said"] < 60:
                return
            seen["said"] = now
            elapsed = datetime.timedelta(seconds=int(now - started))
            console.print(
                f"{description}: {done}/{total} done, {tally}, {flight.text()}, {elapsed}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )

    yield line


class Flight(ProgressColumn):
    """The progress bar's view of the work in flight: trials started and not finished, the
    model server's request rate and its errors so far.

    In a run in this process the counts come live from the process's model endpoints
    (:func:`~harness.agents.endpoint.endpoints`); with worker processes or Ray, from the
    finished trials' usage (requests per second of the run so far, retried attempts).
    """

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._base = {e.url: e.stats() for e in endpoints()}
        self.in_flight = 0
        self.calls = 0.0
        self.retries = 0.0

    def started(self, _task_id: str, _trial: int) -> None:
        """A trial was handed to a worker."""
        with self._lock:
            self.in_flight += 1

    def finished(self, result: TrialResult) -> None:
        """A trial finished."""
        with self._lock:
            self.in_flight = max(self.in_flight - 1, 0)
            self.calls += result.usage.get("model_calls", 0)
            self.retries += result.usage.get("model_retries", 0)

    def text(self) -> str:
        """What the column shows now."""
        elapsed = max(time.monotonic() - self._since, 1e-9)
        live = [e.stats() for e in endpoints()]
        requests = errors = 0
        for stats in live:  # (counted from when the bar started)
            base = self._base.get(stats.url)
            requests += stats.requests - (base.requests if base else 0)
            errors += stats.error_count - (base.error_count if base else 0)
        with self._lock:
            if not requests:
                requests, errors = int(self.calls + self.retries), int(self.retries)
            line = f"in flight {self.in_flight}"
        if requests:
            line += f", model {requests / elapsed:.1f} req/s, {errors} errors"
        return line

    def render(self, task: Task) -> Text:
        """The column's cell."""
        return Text(self.text())


def _summary(folder: str | Path, all_k: bool, *, infra: str = "fail") -> Report:
    """Print a run's pass^k, failures and infrastructure failures; its report."""
    try:
        report = load_report(folder, infra=infra)  # type: ignore[arg-type]
    except HarnessError as exc:
        fail(exc)
    render_summary(report, console, all_k=all_k)
    return report


@click.command("replay")
@click.argument("run")
@click.option("--episode", required=True, help="The episode to replay.")
@suite_options
@rerun_agent_options
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@verify_options
def replay_command(
    run: str,
    episode: str,
    suite: str | None,
    trust_suite: bool,
    agent: str | None,
    trust_agent: bool,
    as_json: bool,
    public_key: str | None,
    allow_unverified: bool,
) -> None:
    """Re-verify an episode's recorded final state and re-run its agent against its record.

    The suite path a run folder records is loaded only when it is a built-in suite or
    --trust-suite is given; otherwise name the suite with --suite. Likewise the agent: a
    recorded module:Class or file.py:Class is built only with --trust-agent; otherwise name it
    with --agent.
    """
    verified(run, public_key=public_key, allow=allow_unverified)
    try:
        report = replay_episode(
            run, episode, suite=suite, trust=trust_suite, agent=agent, trust_agent=trust_agent
        )
    except HarnessError as exc:
        fail(exc)
    if as_json:
        dump(report.to_dict())
    else:
        d = report.divergence
        if d is None:
            console.print(
                f"[green]no divergence[/]: the agent made the {report.replayed} recorded step(s) "
                f"of {report.steps} as recorded; it ended {report.ended}"
            )
        else:
            console.print(f"[red]diverged at step {d.step}[/]: {escape(str(d))}")
        match = report.verdict_matches
        console.print(
            f"verifier on the recorded final state: "
            f"{'passed' if report.verdict.get('passed') else 'failed'}"
            + (
                ""
                if match is None
                else " (same verdict as recorded)"
                if match
                else " [red](DIFFERENT from the recorded verdict)[/]"
            )
        )
        for note in report.notes:
            console.print(f"[dim]{escape(note)}[/]")
    sys.exit(0 if report.ok else 1)


def rerun_options(command: Any) -> Any:
    """What resume and work share: where the trials run (workers, concurrency, executor,
    address), which suite and agent they may build, JSON output."""
    options: list[Callable[[Any], Any]] = [
        click.option("--workers", default=1, show_default=True, type=click.IntRange(1)),
        click.option(
            "--concurrency",
            default=1,
            show_default=True,
            type=click.IntRange(1),
            help="Trials in flight at once in each worker (threads).",
        ),
        EXECUTOR_OPTION,
        ADDRESS_OPTION,
        suite_options,
        rerun_agent_options,
        click.option("--json", "as_json", is_flag=True, help="Machine-readable output."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


@click.command("resume")
@click.argument("run")
@rerun_options
@MAX_AGENT_ERRORS_OPTION
@signing_key_option(_SIGNED)
@unverified_option
@stops_on_ctrl_c
def resume_command(
    run: str,
    workers: int,
    concurrency: int,
    executor: str,
    address: str | None,
    suite: str | None,
    trust_suite: bool,
    agent: str | None,
    trust_agent: bool,
    as_json: bool,
    max_agent_errors: float | None,
    signing_key_file: str | None,
    allow_unverified: bool,
) -> None:
    """Finish a crashed RUN: keep finished trials, resume interrupted ones, run missing ones,
    and run again the ones whose last attempt ended in an infrastructure error.

    Exits 0 only when every trial of the run has its result: 3 when something stopped it (a
    server down, a worker lost, a store refusing a write), 130 on Ctrl-C, 4 when trials are
    left (waiting for a person, or held by another process).

    The suite path a run folder records is loaded only when it is a built-in suite or
    --trust-suite is given; otherwise name the suite with --suite. Likewise the agent: a
    recorded module:Class or file.py:Class is built only with --trust-agent; otherwise name it
    with --agent.
    """
    verified(run, allow=allow_unverified)
    try:
        # Secrets are not recorded with a run: give the API key back from the environment.
        result = resume_run(
            run,
            signing_key=signing_key(signing_key_file),
            workers=workers,
            concurrency=concurrency,
            executor=executor,  # type: ignore[arg-type]
            address=address,
            secrets=secrets(),
            suite=suite,
            trust=trust_suite,
            agent=agent,
            trust_agent=trust_agent,
            max_agent_errors=max_agent_errors,
        )
    except HarnessError as exc:
        fail(exc)
    if as_json:
        dump(result.to_dict())
        status = stop_status(result.run, 0)
        if status:
            sys.exit(status)
        return
    console.print(
        f"run {result.run.run_id}: kept {len(result.kept)}, resumed {len(result.resumed)}, "
        f"ran {len(result.started)} missing, ran {len(result.retried)} again after an "
        f"infrastructure error; {len(result.pending)} waiting for a person, "
        f"{len(result.skipped)} held by another process"
    )
    for note in result.notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    if result.run.results:
        _summary(result.run.where, all_k=False)
    show_agent_errors(result.run)
    status = show_stop(result.run, 0)
    if status:
        sys.exit(status)


@click.command("work")
@click.argument("run")
@rerun_options
@click.option(
    "--lease-seconds",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=1.0),
    help="How long this worker's hold on a trial lasts unrenewed (it renews it every third of "
    "that): should this machine die or lose the network, the run's other processes take its "
    f"trials over that long after. Shorten it for a machine that may vanish; on Ray, at most "
    f"{RAY_LEASE_SECONDS:g}.",
)
@signing_key_option(_SIGNED)
@unverified_option
@stops_on_ctrl_c
def work_command(
    run: str,
    workers: int,
    concurrency: int,
    executor: str,
    address: str | None,
    suite: str | None,
    trust_suite: bool,
    agent: str | None,
    trust_agent: bool,
    as_json: bool,
    lease_seconds: float,
    signing_key_file: str | None,
    allow_unverified: bool,
) -> None:
    """Join the running RUN from this machine and take a share of its trials.

    RUN is the run's folder (its store a database this machine reaches: `harness run
    --store postgresql://...`) or the store's URL, postgresql://host/db#<run id>. Trials are
    shared with every other process of the run through their leases: none runs twice, a
    trial held by a process that died is taken over once its lease lapses. Leaves when every
    trial is done or waiting for a person, or when the run stops; the process that started
    the run records its end and summary.

    Exits 0 when the run has no trial left to run, 3 when something stopped this worker (the
    run stopped, a server down, a store refusing a write), 130 on Ctrl-C.
    """
    verified(run, allow=allow_unverified)
    try:
        result = work_run(
            run,
            workers=workers,
            concurrency=concurrency,
            executor=executor,  # type: ignore[arg-type]
            address=address,
            signing_key=signing_key(signing_key_file),
            secrets=secrets(),
            suite=suite,
            trust=trust_suite,
            agent=agent,
            trust_agent=trust_agent,
            lease_seconds=lease_seconds,
        )
    except HarnessError as exc:
        fail(exc)
    status = 130 if result.interrupted else 3 if result.stopped else 0
    if as_json:
        dump(result.to_dict())
    else:
        tally = Tally()
        for r in result.results:
            tally.add(r)
        console.print(
            f"run {result.run_id}: ran {len(result.ran)} trial(s) here ({tally}); "
            f"{len(result.elsewhere)} finished by other processes meanwhile; "
            f"{len(result.left)} left"
        )
        for note in result.notes:
            console.print(f"[yellow]note:[/] {escape(note)}")
        if result.stopped:
            console.print(f"[red]stopped[/red]: {escape(result.stopped)}")
        elif result.interrupted:
            console.print("[yellow]interrupted[/yellow]: the trials in flight here ended first")
    if status:
        sys.exit(status)

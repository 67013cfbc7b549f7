"""The ``harness`` command line: a thin layer over the library.

Environment variables are read here only (``HARNESS_OPENAI_BASE_URL``, ``HARNESS_OPENAI_MODEL``,
``HARNESS_OPENAI_API_KEY``), never in the library.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .audit.commands import audit_command, escalations_command, replay_command, resume_command
from .errors import HarnessError
from .export import export_command
from .report import compare_command, report_command
from .trials import RunResult, TrialResult, run_trials

__all__ = ["main"]

console = Console()
BUILTIN_SUITES = ("retail", "configs")


def resolve_suite(name: str) -> Path:
    """A suite path, or the name of a built-in suite (``retail``, ``configs``)."""
    path = Path(name)
    if path.exists():
        return path
    if name in BUILTIN_SUITES:
        builtin = Path(__file__).resolve().parents[1] / "tasks" / name
        if builtin.exists():
            return builtin
    raise click.BadParameter(
        f"{name!r} is neither a suite folder, a tasks.json, nor a built-in suite "
        f"({', '.join(BUILTIN_SUITES)})",
        param_hint="SUITE",
    )


def summary_table(result: RunResult) -> Table:
    """pass^k and pass@k for k = 1..n with intervals."""
    table = Table(title=f"{result.suite}: pass^k over {len(result.counts()[0])} tasks")
    for col in ("k", "pass^k", "95% interval", "pass@k", "method"):
        table.add_column(col, justify="right" if col != "method" else "left")
    n = min(result.counts()[2], default=0)
    for k in range(1, n + 1):
        est = result.pass_hat(k)
        table.add_row(
            str(k),
            f"{est.value:.3f}",
            f"[{est.low:.3f}, {est.high:.3f}]",
            f"{result.pass_at(k):.3f}",
            est.method,
        )
    return table


def failures_table(result: RunResult) -> Table:
    """Failed tool calls by class and episodes by outcome."""
    table = Table(title="failures by class and outcomes")
    table.add_column("what")
    table.add_column("count", justify="right")
    for name, count in sorted(result.failures_by_class().items()):
        table.add_row(f"failed call: {name}", str(count))
    for name, count in sorted(result.outcomes().items()):
        table.add_row(f"episode {name}", str(count))
    return table


@click.group()
@click.version_option(package_name="harness")
def main() -> None:
    """A transactional agent-execution harness."""


@main.command()
@click.argument("suite")
@click.option(
    "--agent", default="simulated", show_default=True, help="scripted, simulated or openai."
)
@click.option("--trials", default=4, show_default=True, type=click.IntRange(1))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--logs", default="logs", show_default=True, type=click.Path(file_okay=False))
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
@click.option("--base-url", default=None, help="openai agent: server URL (…/v1).")
@click.option("--model", default=None, help="openai agent: model name.")
@click.option(
    "--faults",
    "faults_file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="Inject the faults of this plan (JSON or TOML) and report detection by class.",
)
def run(
    suite: str,
    agent: str,
    trials: int,
    workers: int,
    seed: int,
    logs: str,
    error_rate: float,
    self_conditioning: float,
    tasks: tuple[str, ...],
    base_url: str | None,
    model: str | None,
    faults_file: str | None,
) -> None:
    """Run SUITE (a folder, a tau2 tasks.json, or a built-in name) as repeated trials."""
    path = resolve_suite(suite)
    options: dict[str, Any] = {}
    if agent == "simulated":
        options = {"error_rate": error_rate, "self_conditioning": self_conditioning}
    elif agent == "openai":
        options = {
            "base_url": base_url
            or os.environ.get("HARNESS_OPENAI_BASE_URL", "http://127.0.0.1:8000/v1"),
            "model": model or os.environ.get("HARNESS_OPENAI_MODEL", "default"),
        }
        if os.environ.get("HARNESS_OPENAI_API_KEY"):
            options["api_key"] = os.environ["HARNESS_OPENAI_API_KEY"]
    try:
        from .faults import FaultPlan
        from .suite import load_suite

        plan = None if faults_file is None else FaultPlan.load(faults_file)
        loaded = load_suite(path)
        selected = [t for t in loaded.tasks if not tasks or t.id in tasks]
        total = len(selected) * trials
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("passed {task.fields[passed]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        ) as progress:
            bar = progress.add_task(f"{loaded.name} x {trials}", total=total, passed=0)
            passed = 0

            def tick(r: TrialResult) -> None:
                nonlocal passed
                passed += r.passed
                progress.update(bar, advance=1, passed=passed)

            result = run_trials(
                loaded,
                agent=agent,
                agent_options=options,
                trials=trials,
                workers=workers,
                seed=seed,
                logs=logs,
                tasks=tasks or None,
                progress=tick,
                faults=plan,
            )
    except HarnessError as exc:
        console.print(f"[red]error:[/red] {exc}")
        sys.exit(2)
    if result.results:
        console.print(summary_table(result))
        console.print(failures_table(result))
        if plan is not None:
            from .reliability import load_reliability, render_reliability

            render_reliability(load_reliability(result.folder, result.run_id), console)
    if result.interrupted:
        console.print(
            f"[yellow]interrupted[/yellow] after {len(result.results)} trials; "
            "the store is consistent"
        )
    click.echo(f"run folder: {result.folder}")
    if result.interrupted:
        sys.exit(130)


# Reading runs back: defined beside what they read, registered here.
main.add_command(report_command)
main.add_command(compare_command)
main.add_command(export_command)
main.add_command(audit_command)
main.add_command(replay_command)
main.add_command(resume_command)
main.add_command(escalations_command)


if __name__ == "__main__":  # pragma: no cover
    main()

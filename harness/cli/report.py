"""The commands that read a run back: ``harness report``, ``compare`` and ``export``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape

from ..errors import HarnessError
from ..report.export import (
    EXPORT_FORMATS,
    ExportFormat,
    export_run,
    suite_left_out,
    taubench_ids_note,
)
from ..report.gate import (
    BASES,
    EXIT_BELOW_BAR,
    EXIT_INFRA,
    Bar,
    Basis,
    Judgement,
    exit_status,
    judge,
)
from ..report.model import Report, compare_reports, load_report
from ..report.terminal import render, render_comparison, render_gate
from ..runs.output import write_output
from ..stats import InfraPolicy
from ._common import dump, fail, suite_options, verified, verify_options

__all__ = [
    "GATE_HELP",
    "all_k_option",
    "compare_command",
    "export_command",
    "fail_under_options",
    "judge_bars",
    "report_command",
]

INFRA_OPTION = click.option(
    "--infra",
    type=click.Choice(["fail", "exclude"]),
    default="fail",
    show_default=True,
    help="Infrastructure errors: count as failures (tau-bench) or exclude (tau2-bench).",
)
CONFIDENCE_OPTION = click.option(
    "--confidence",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.95,
    show_default=True,
    help="Nominal coverage of every interval.",
)


GATE_HELP = (
    f"Exit status: 0; {EXIT_BELOW_BAR} when a --fail-under metric is below its bar; "
    f"{EXIT_INFRA} when infrastructure failures dominate (more than half of the trials run "
    "ended in one, e.g. a model server refusing connections; a fault plan's planned "
    "interruptions do not count); 2 for a usage or harness error."
)


def _bars(_ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]) -> list[Bar]:
    try:
        return [Bar.parse(v) for v in values]
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def fail_under_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--fail-under METRIC=VALUE`` (repeatable) and ``--fail-under-on lower|point``."""
    command = click.option(
        "--fail-under-on",
        "fail_under_on",
        type=click.Choice(BASES),
        default="lower",
        show_default=True,
        help="Judge --fail-under on the interval's lower bound (confident the metric is at "
        "least the bar) or on the point estimate.",
    )(command)
    return click.option(
        "--fail-under",
        "bars",
        multiple=True,
        callback=_bars,
        metavar="METRIC=VALUE",
        help='Exit 1 when METRIC is below VALUE, e.g. "pass^4=0.8" or "pass@1=0.9" '
        "(repeatable; k at most the trials per task).",
    )(command)


def all_k_option(command: Callable[..., Any]) -> Callable[..., Any]:
    """``--all-k``: the pass^k table shows every k, not 1..10 and the powers of two."""
    return click.option(
        "--all-k",
        "all_k",
        is_flag=True,
        help="Show every k in the pass^k table [default: k = 1..10, the powers of two and n].",
    )(command)


def judge_bars(report: Report, bars: list[Bar], basis: Basis) -> list[Judgement]:
    """The report held to ``bars``; a k beyond the run's trials is a usage error (exit 2)."""
    try:
        return judge(report, bars, basis)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--fail-under'") from None


@click.command("report", epilog=GATE_HELP)
@click.argument("run")
@INFRA_OPTION
@CONFIDENCE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write one self-contained HTML file (plots, tables, evidence), in which every "
    "cell of the per-task grid opens its trial's timeline.",
)
@click.option(
    "--tasks/--no-tasks",
    "per_task",
    default=True,
    show_default=True,
    help="Print the per-task table (passes out of trials, each task's pass^k, its trials).",
)
@all_k_option
@fail_under_options
@verify_options
def report_command(
    run: str,
    infra: InfraPolicy,
    confidence: float,
    as_json: bool,
    html_file: Path | None,
    per_task: bool,
    all_k: bool,
    bars: list[Bar],
    fail_under_on: Basis,
    public_key: str | None,
    allow_unverified: bool,
) -> None:
    """Report RUN (logs/<run>): pass^k and pass@k with intervals, p^n, failures, evidence.

    With --fail-under the command gates CI: it exits non-zero when a metric is below its bar
    or infrastructure failures dominate.
    """
    check = verified(run, public_key=public_key, allow=allow_unverified)
    try:
        report = load_report(run, infra=infra, confidence=confidence)
    except HarnessError as exc:
        fail(exc)
    judgements = judge_bars(report, bars, fail_under_on)
    if as_json:
        data = report.to_dict()
        data["verification"] = check.to_dict()
        if bars:
            data["fail_under"] = [j.to_dict() for j in judgements]
        dump(data)
    else:
        console = Console()
        render(report, console, per_task=per_task, all_k=all_k)
        render_gate(judgements, fail_under_on, console)
        if check.unchecked_signatures:
            console.print(
                f"[yellow]signatures not checked[/]: the run is signed (key "
                f"{', '.join(check.signers)}); `harness report {run} --public-key K.pub` checks "
                "them"
            )
    if html_file is not None:
        from ..audit.html import render_report

        try:
            write_output(html_file, render_report(report, all_k=all_k))
        except HarnessError as exc:
            fail(exc)
        click.echo(f"wrote {html_file}", err=as_json)
    if bars:
        sys.exit(exit_status(report, judgements))


@click.command("compare")
@click.argument("run_a")
@click.argument("run_b")
@INFRA_OPTION
@CONFIDENCE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@all_k_option
@verify_options
def compare_command(
    run_a: str,
    run_b: str,
    infra: InfraPolicy,
    confidence: float,
    as_json: bool,
    all_k: bool,
    public_key: str | None,
    allow_unverified: bool,
) -> None:
    """Compare RUN_A with RUN_B: paired pass^k difference on the tasks both ran."""
    for run in (run_a, run_b):
        verified(run, public_key=public_key, allow=allow_unverified)
    try:
        a = load_report(run_a, infra=infra, confidence=confidence)
        b = load_report(run_b, infra=infra, confidence=confidence)
        cmp = compare_reports(a, b)
    except HarnessError as exc:
        fail(exc)
    if as_json:
        dump(cmp.to_dict())
    else:
        render_comparison(cmp, Console(), all_k=all_k)


@click.command("export")
@click.argument("run")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(EXPORT_FORMATS),
    required=True,
    help="taubench (tau-bench results list), tau2 (tau2-bench Results) or jsonl.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="File to write [default: export-<format>.json or export.jsonl in the run folder].",
)
@click.option(
    "--infra",
    type=click.Choice(["fail", "exclude"]),
    default="fail",
    show_default=True,
    help="taubench: write infrastructure errors as reward 0 (fail) or leave them out. "
    "tau2 always marks them infrastructure_error, which tau2's metrics exclude.",
)
@click.option(
    "--require-index",
    is_flag=True,
    help="taubench: refuse unless every task has its index in the tasks file it came from "
    "(instead of numbering tasks in run order).",
)
@suite_options
@verify_options
def export_command(
    run: str,
    fmt: ExportFormat,
    out: Path | None,
    infra: InfraPolicy,
    require_index: bool,
    suite: str | None,
    trust_suite: bool,
    public_key: str | None,
    allow_unverified: bool,
) -> None:
    """Export RUN (logs/<run>) as files tau-bench's or tau2-bench's scorers read, or JSON lines.

    The tasks' instructions come from the run's suite, which is loaded when it is built in,
    named with --suite, or trusted with --trust-suite.
    """
    verified(run, public_key=public_key, allow=allow_unverified)
    try:
        target = export_run(
            run, fmt, out, infra=infra, suite=suite, trust=trust_suite, require_index=require_index
        )
        notes = [] if fmt == "jsonl" else [suite_left_out(run, suite=suite, trust=trust_suite)]
        if fmt == "taubench":
            notes.append(taubench_ids_note(run, suite=suite, trust=trust_suite))
    except HarnessError as exc:
        fail(exc)
    for note in notes:
        if note:
            Console(stderr=True, soft_wrap=True, highlight=False).print(
                f"[yellow]note:[/] {escape(note)}"
            )
    click.echo(f"wrote {target}")

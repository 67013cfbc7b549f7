"""The commands that read a run back: ``harness report``, ``compare`` and ``export``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from ..errors import HarnessError
from ..report.export import EXPORT_FORMATS, ExportFormat, export_run, suite_left_out
from ..report.model import compare_reports, load_report
from ..report.terminal import render, render_comparison
from ..runs.output import write_output
from ..stats import InfraPolicy
from ._common import dump, fail, suite_options, verified, verify_options

__all__ = ["compare_command", "export_command", "report_command"]

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


@click.command("report")
@click.argument("run", type=click.Path(path_type=Path))
@INFRA_OPTION
@CONFIDENCE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write one self-contained HTML file (plots, tables, evidence).",
)
@click.option("--tasks", "per_task", is_flag=True, help="Also print the per-task table.")
@verify_options
def report_command(
    run: Path,
    infra: InfraPolicy,
    confidence: float,
    as_json: bool,
    html_file: Path | None,
    per_task: bool,
    public_key: str | None,
    allow_unverified: bool,
) -> None:
    """Report RUN (logs/<run>): pass^k and pass@k with intervals, p^n, failures, evidence."""
    check = verified(run, public_key=public_key, allow=allow_unverified)
    try:
        report = load_report(run, infra=infra, confidence=confidence)
    except HarnessError as exc:
        fail(exc)
    if as_json:
        data = report.to_dict()
        data["verification"] = check.to_dict()
        dump(data)
    else:
        render(report, Console(), per_task=per_task)
    if html_file is not None:
        from ..report.html import render_html

        try:
            write_output(html_file, render_html(report))
        except HarnessError as exc:
            fail(exc)
        click.echo(f"wrote {html_file}", err=as_json)


@click.command("compare")
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@INFRA_OPTION
@CONFIDENCE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@verify_options
def compare_command(
    run_a: Path,
    run_b: Path,
    infra: InfraPolicy,
    confidence: float,
    as_json: bool,
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
        render_comparison(cmp, Console())


@click.command("export")
@click.argument("run", type=click.Path(path_type=Path))
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
@suite_options
@verify_options
def export_command(
    run: Path,
    fmt: ExportFormat,
    out: Path | None,
    infra: InfraPolicy,
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
        target = export_run(run, fmt, out, infra=infra, suite=suite, trust=trust_suite)
        note = None if fmt == "jsonl" else suite_left_out(run, suite=suite, trust=trust_suite)
    except HarnessError as exc:
        fail(exc)
    if note:
        Console(stderr=True, soft_wrap=True, highlight=False).print(
            f"[yellow]note:[/] {escape(note)}"
        )
    click.echo(f"wrote {target}")

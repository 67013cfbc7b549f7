"""The ``harness report`` and ``harness compare`` commands (registered by ``harness.cli``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from ..errors import HarnessError
from ..stats import InfraPolicy
from .model import compare_reports, load_report
from .terminal import render, render_comparison

__all__ = ["compare_command", "report_command"]

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


def _fail(exc: Exception) -> None:
    click.echo(f"error: {exc}", err=True)
    sys.exit(2)


def _dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=False, allow_nan=False, default=str)


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
def report_command(
    run: Path,
    infra: InfraPolicy,
    confidence: float,
    as_json: bool,
    html_file: Path | None,
    per_task: bool,
) -> None:
    """Report RUN (logs/<run>): pass^k and pass@k with intervals, p^n, failures, evidence."""
    try:
        report = load_report(run, infra=infra, confidence=confidence)
    except HarnessError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(_dump(report.to_dict()))
    else:
        render(report, Console(), per_task=per_task)
    if html_file is not None:
        from .html import render_html

        html_file.parent.mkdir(parents=True, exist_ok=True)
        html_file.write_text(render_html(report), encoding="utf-8")
        click.echo(f"wrote {html_file}", err=as_json)


@click.command("compare")
@click.argument("run_a", type=click.Path(path_type=Path))
@click.argument("run_b", type=click.Path(path_type=Path))
@INFRA_OPTION
@CONFIDENCE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_command(
    run_a: Path, run_b: Path, infra: InfraPolicy, confidence: float, as_json: bool
) -> None:
    """Compare RUN_A with RUN_B: paired pass^k difference on the tasks both ran."""
    try:
        a = load_report(run_a, infra=infra, confidence=confidence)
        b = load_report(run_b, infra=infra, confidence=confidence)
        cmp = compare_reports(a, b)
    except HarnessError as exc:
        _fail(exc)
        return
    if as_json:
        click.echo(_dump(cmp.to_dict()))
    else:
        render_comparison(cmp, Console())

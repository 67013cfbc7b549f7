"""Reliability by cause as a user reads it: the tables ``harness run --faults`` ends with and
``harness report`` shows for a run under a fault plan (the figures come from
:mod:`harness.runs.reliability`)."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from ..runs.layout import open_store
from ..runs.reliability import (
    EFFECTS,
    ClassReport,
    Flagged,
    ReliabilityReport,
    Spread,
    reliability_report,
)

__all__ = [
    "EFFECTS",
    "ClassReport",
    "Flagged",
    "ReliabilityReport",
    "Spread",
    "load_reliability",
    "reliability_report",
    "render_reliability",
]


def load_reliability(run: str | Path, run_id: str | None = None) -> ReliabilityReport:
    """The reliability report of a run folder (``logs/<run>``), a store file or a store URL
    (``...#<run id>`` names one run of it).

    Args:
        run: the run's folder, a store's database file, or a store URL.
        run_id: which run of the store (default: the run the target names, else every run).

    Raises:
        RunNotFound, StoreError: as :func:`~harness.runs.layout.open_store` raises them.
    """
    with open_store(run) as opened:
        return reliability_report(opened.store, run_id or opened.run_id)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _counts(values: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(values.items(), key=lambda kv: -kv[1])) or "-"


def render_reliability(report: ReliabilityReport, console: Console) -> None:
    """Draw the report: detection and recovery by class, cost by class, false positives."""
    if report.classes:
        # A class's name is never cut (fail_stop and fail_slow would both read "fail_s…").
        width = max(len(name) for name in report.classes)
        detect = Table(title="injected faults: detection and decisions by class")
        detect.add_column("class", no_wrap=True, min_width=width)
        for name in ("injected", "detected", "coverage"):
            detect.add_column(name, justify="right")
        detect.add_column("classified as", overflow="fold")
        detect.add_column("decisions", overflow="fold")
        for c in report.classes.values():
            detect.add_row(
                c.failure_class,
                str(c.injected),
                str(c.detected),
                _pct(c.coverage),
                _counts(c.detected_as),
                _counts(c.decisions),
            )
        console.print(detect)
        cost = Table(
            title="recovery and cost by class (seconds: median / max on the trials' clock; "
            "re-run: attempts executed again; blast: episodes one fault touched)"
        )
        for name in (
            "class",
            "detect s",
            "recovered",
            "recover s",
            "re-run",
            "trials lost",
            "blast max/mean",
            "dup/lost/div/unacc",
        ):
            if name == "class":
                cost.add_column(name, no_wrap=True, min_width=width)
            else:
                cost.add_column(name, justify="right", overflow="fold")
        for c in report.classes.values():
            lost = c.trials_lost
            cost.add_row(
                c.failure_class,
                c.detect_latency.text(),
                f"{c.recovered}/{c.injected}",
                c.recover_time.text(),
                str(c.re_executed),
                f"{lost}/{c.episodes}"
                + (f" (+{c.planned_interruptions} planned)" if c.planned_interruptions else ""),
                f"{c.blast_radius_max} / {c.blast_radius_mean:.1f}",
                "/".join(
                    str(c.effects[k]) for k in ("duplicated", "lost", "diverged", "unaccounted")
                ),
            )
        console.print(cost)
    fp = len(report.false_positives)
    console.print(
        f"{report.trials} trials, {report.faulted_trials} with injected faults; "
        f"false positives (failures flagged with nothing injected): {fp}; knock-on failures: "
        f"{len(report.knock_on)}; clean trials failed: {report.clean_trials_failed}"
    )
    if report.accounted_trials:
        e = report.effects
        console.print(
            f"effects over {report.accounted_trials} trials: duplicated {e['duplicated']}, "
            f"lost {e['lost']}, diverged {e['diverged']}, unaccounted {e['unaccounted']}, "
            f"held for a person {e['held']}"
        )
    for a in report.announced:
        console.print(
            f"announced in advance: {a['notice']} of {a['domain']} during {a['window']} "
            f"({a['fault']})"
        )

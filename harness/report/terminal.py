"""Reports as rich tables in the terminal."""

from __future__ import annotations

import json
import math

from rich.console import Console
from rich.table import Table

from ..stats import INTERVAL_METHODS, Estimate
from .model import INFRA_DESCRIPTIONS, Comparison, Report

__all__ = ["render", "render_comparison"]


def _iv(e: Estimate | tuple[float, float], digits: int = 3) -> str:
    low, high = (e.low, e.high) if isinstance(e, Estimate) else e
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def _steps(h: float) -> str:
    return "inf" if math.isinf(h) else f"{h:.1f}"


def _pct(confidence: float) -> str:
    return f"{confidence:.0%}"


def render(report: Report, console: Console, *, per_task: bool = False) -> None:
    """Print ``report`` as rich tables."""
    conf = _pct(report.confidence)
    console.print(
        f"[bold]run {report.run_id}[/bold]  suite [bold]{report.suite}[/bold]  "
        f"status {report.status}\n"
        f"T = {report.n_tasks} tasks, n = {report.n} trials per task"
        + (f" (up to {report.n_max})" if report.n_max != report.n else "")
        + f", {report.n_trials} trials counted; {conf} intervals at the task level\n"
        f"infrastructure errors: {report.infra_errors}; policy [bold]{report.infra_policy}"
        f"[/bold]: {INFRA_DESCRIPTIONS[report.infra_policy]}"
    )
    if report.dropped_tasks:
        console.print(
            f"[yellow]dropped[/yellow] (no trials left under exclude): "
            f"{', '.join(report.dropped_tasks)}"
        )
    table = Table(
        title=f"{report.suite}: pass^k and pass@k over {report.n_tasks} tasks",
        show_edge=False,
        pad_edge=False,
    )
    for col in ("k", "pass^k", f"{conf} interval", "pass@k", f"{conf} interval "):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("pass^k method", overflow="fold")
    for k in report.curve.ks.tolist():
        hat, at = report.pass_hat(int(k)), report.pass_at(int(k))
        table.add_row(str(k), f"{hat.value:.3f}", _iv(hat), f"{at.value:.3f}", _iv(at), hat.method)
    console.print(table)
    for name, text in report.methods().items():
        console.print(f"  [dim]{name}: {text}[/dim]")

    counts = Table(title="failures by class and outcomes")
    counts.add_column("what")
    counts.add_column("count", justify="right")
    for name, count in sorted(report.failures.items()):
        counts.add_row(f"failed call: {name}", str(count))
    for name, count in sorted(report.outcomes.items()):
        counts.add_row(f"episode {name}", str(count))
    counts.add_row("infrastructure errors", str(report.infra_errors))
    console.print(counts)
    if report.partial_mean is None:
        console.print("partial credit: none of the counted trials has a partial-credit rule")
    else:
        console.print(
            f"partial credit (reported separately, not part of pass/fail): mean "
            f"{report.partial_mean:.3f} over {report.partial_trials} trials"
        )

    if report.null is None:
        console.print("p^n null model: no task has required steps")
    else:
        p = report.null.p
        nt = Table(title="p^n null model: observed task success against p^n by required steps")
        for col in ("steps", "tasks", "p^n", f"{conf} interval", "observed", "interval ", "fits"):
            nt.add_column(col, justify="right")
        for row in report.null.rows:
            nt.add_row(
                str(row.steps),
                str(row.n_tasks),
                f"{row.predicted:.3f}",
                _iv((row.predicted_low, row.predicted_high)),
                f"{row.observed:.3f}",
                _iv((row.observed_low, row.observed_high)),
                "yes" if row.consistent else "[red]no[/red]",
            )
        console.print(nt)
        h = report.null.horizon(0.5)
        console.print(
            f"per-step success p = {p.value:.4f} {_iv(p, 4)} ({p.method}, {p.n_tasks} steps); "
            f"horizon at s = 0.5: H = {_steps(h[0])} steps [{_steps(h[1])}, {_steps(h[2])}]"
        )
    sc = report.self_conditioning
    if sc is not None:
        parts = []
        for label, est in (("after an earlier error", sc.after_error), ("clean", sc.clean)):
            parts.append(
                f"{label}: no steps"
                if est is None
                else f"{label}: {est.value:.3f} {_iv(est)} ({est.n_tasks} steps)"
            )
        diff = sc.difference
        console.print(
            "self-conditioning, step error rate "
            + "; ".join(parts)
            + ("" if diff is None else f"; difference {diff:+.3f}")
        )
    ev = report.evidence
    if ev:
        agent = ev.get("agent", {})
        machine = ev.get("machine", {})
        retry = (ev.get("policy") or {}).get("retry", {})
        console.print(
            f"[dim]evidence: harness {ev.get('harness_version', '?')}, agent "
            f"{json.dumps(agent, sort_keys=True)}, seed {ev.get('seed', '?')}, retry "
            f"{json.dumps(retry, sort_keys=True)}, python {machine.get('python', '?')} on "
            f"{machine.get('platform', '?')}[/dim]"
        )
    if per_task:
        tt = Table(title="per task")
        for col in ("task", "version", "passed", "trials", "infra", "steps", "partial"):
            tt.add_column(col, justify="left" if col == "task" else "right")
        for t in report.tasks:
            tt.add_row(
                t.task_id,
                t.version,
                str(t.successes),
                str(t.trials),
                str(t.infra_errors),
                str(t.steps),
                "-" if t.partial is None else f"{t.partial:.2f}",
            )
        console.print(tt)


def render_comparison(cmp: Comparison, console: Console) -> None:
    """Print a comparison as a rich table."""
    conf = _pct(cmp.a.confidence)
    console.print(
        f"A = run {cmp.a.run_id} ({cmp.a.suite}), B = run {cmp.b.run_id} ({cmp.b.suite})\n"
        f"paired on the {len(cmp.tasks)} tasks both ran; infrastructure errors: "
        f"{cmp.a.infra_errors} in A, {cmp.b.infra_errors} in B, policy "
        f"[bold]{cmp.a.infra_policy}[/bold]: {INFRA_DESCRIPTIONS[cmp.a.infra_policy]}"
    )
    for label, ids in (("only in A", cmp.only_a), ("only in B", cmp.only_b)):
        if ids:
            console.print(f"[yellow]{label}[/yellow] (not compared): {', '.join(ids)}")
    if cmp.changed:
        console.print(
            f"[yellow]changed between the runs[/yellow] (version or content): "
            f"{', '.join(cmp.changed)}"
        )
    table = Table(
        title="pass^k: A, B and the paired difference A - B", show_edge=False, pad_edge=False
    )
    for col in ("k", "A", f"{conf} interval", "B", f"{conf} interval ", "A - B", "interval"):
        table.add_column(col, justify="right", no_wrap=True)
    for ea, eb, d in cmp.rows:
        table.add_row(
            str(d.k),
            f"{ea.value:.3f}",
            _iv(ea),
            f"{eb.value:.3f}",
            _iv(eb),
            f"{d.value:+.3f}",
            f"[{d.low:+.3f}, {d.high:+.3f}]",
        )
    console.print(table)
    methods = dict.fromkeys(e.method for row in cmp.rows for e in row)
    for name in methods:
        console.print(f"  [dim]{name}: {INTERVAL_METHODS.get(name, name)}[/dim]")

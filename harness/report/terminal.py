"""Reports as rich tables in the terminal."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..runs.judge import TRIAL_CLASSES
from ..stats import INTERVAL_METHODS, Estimate
from .gate import Basis, Judgement
from .model import INFRA_DESCRIPTIONS, Comparison, Report, table_ks
from .reliability import render_reliability

__all__ = [
    "render",
    "render_comparison",
    "render_failed_trials",
    "render_gate",
    "render_infra",
    "render_summary",
]

# Trials named per infrastructure cause (``--json`` lists them all).
_TRIALS_SHOWN = 4


def _iv(e: Estimate | tuple[float, float], digits: int = 3) -> str:
    low, high = (e.low, e.high) if isinstance(e, Estimate) else e
    return f"[{low:.{digits}f}, {high:.{digits}f}]"


def _steps(h: float) -> str:
    return "inf" if math.isinf(h) else f"{h:.1f}"


def _pct(confidence: float) -> str:
    return f"{confidence:.0%}"


def _k_table(report: Report, all_k: bool) -> Table:
    conf = _pct(report.confidence)
    ks = table_ks(report.n, all_k=all_k)
    title = f"{report.suite}: pass^k and pass@k over {report.n_tasks} tasks"
    if len(ks) < report.n:
        title += f" (k = 1..10, powers of two and {report.n}; --all-k shows all {report.n})"
    table = Table(title=title, show_edge=False, pad_edge=False)
    for col in ("k", "pass^k", f"{conf} interval", "pass@k", f"{conf} interval "):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("pass^k method", overflow="fold")
    for k in ks:
        hat, at = report.pass_hat(k), report.pass_at(k)
        table.add_row(str(k), f"{hat.value:.3f}", _iv(hat), f"{at.value:.3f}", _iv(at), hat.method)
    return table


def render_infra(report: Report, console: Console) -> None:
    """Print the trials that ended in an infrastructure error, grouped by cause."""
    if not report.infra_failures:
        return
    share = f"{report.infra_errors} of {report.trials_run} trials"
    if report.infra_dominates:
        console.print(
            f"[bold red]infrastructure failures: {share}[/] (more than half: these figures "
            "measure the infrastructure, not the agent)"
        )
    else:
        console.print(f"[yellow]infrastructure failures[/]: {share}")
    for cause, failures in report.infra_causes():
        named = ", ".join(f"{f.task_id} trial {f.trial}" for f in failures[:_TRIALS_SHOWN])
        more = len(failures) - _TRIALS_SHOWN
        console.print(f"  {len(failures)} x {escape(cause)}", soft_wrap=True)
        console.print(
            f"    [dim]{escape(named)}" + (f" and {more} more" if more > 0 else "") + "[/]"
        )


def render_summary(
    report: Report, console: Console, *, all_k: bool = False, full: bool = False
) -> None:
    """Print the pass^k table, failures by class and outcomes, and infrastructure failures
    with their causes (what ``harness run`` ends with; ``full``: every interval method the
    report uses, the null model's too)."""
    console.print(_k_table(report, all_k))
    curve = {*report.curve.hat_methods, *report.curve.at_methods}
    for name, text in report.methods().items():
        # The null model's method belongs with it: only the full report shows that.
        if full or name in curve:
            console.print(f"  [dim]{name}: {text}[/dim]")
    if report.failed_trials:
        console.print(_class_table(report))
    else:
        console.print(f"failed trials: none of {report.n_trials} counted trials failed")
    counts = Table(title="failed calls by class, and outcomes")
    counts.add_column("what")
    counts.add_column("count", justify="right")
    for name, count in sorted(report.failures.items()):
        counts.add_row(f"failed call: {name}", str(count))
    for name, count in sorted(report.outcomes.items()):
        counts.add_row(f"episode {name}", str(count))
    counts.add_row("infrastructure errors", str(report.infra_errors))
    console.print(counts)
    render_infra(report, console)


def _class_table(report: Report) -> Table:
    """Failed trials by class: one class a failed trial, so the counts add up."""
    failed = len(report.failed_trials)
    table = Table(
        title=f"failed trials by class: {failed} of {report.n_trials} counted trials failed"
    )
    table.add_column("class")
    table.add_column("trials", justify="right")
    table.add_column("what it means", overflow="fold")
    for name, count in report.failed_by_class().items():
        table.add_row(name, str(count), TRIAL_CLASSES.get(name, ""))
    return table


# Failed trials the terminal report names (``--json`` and ``--html`` list them all).
_FAILED_SHOWN = 30
# Trial glyphs per task in the per-task table, up to this many trials a task.
_CELLS_SHOWN = 16
_GLYPHS = {"pass": "P", "fail": "F", "infra": "I", "missing": "-"}


def _task_table(report: Report) -> Table:
    """Each task: passes out of trials, its own pass^1 and pass^n, infrastructure errors."""
    n = report.n
    table = Table(title="per task: passes out of trials, and each task's pass^k", show_edge=False)
    width = max((len(t.task_id) for t in report.tasks), default=4)
    table.add_column("task", no_wrap=True, min_width=min(width, 40))
    columns = ["passed", "pass^1", f"pass^{n}", "infra", "partial"]
    for col in columns:
        table.add_column(col, justify="right", no_wrap=True)
    glyphs = report.n_max <= _CELLS_SHOWN
    if glyphs:
        table.add_column("trials", no_wrap=True)
    for t in report.tasks:
        hat1, hatn = t.pass_hat(1), t.pass_hat(n)
        row = [
            escape(t.task_id) + ("" if t.version == "1" else f" v{escape(t.version)}"),
            f"{t.successes}/{t.trials}",
            "-" if hat1 is None else f"{hat1:.3f}",
            "-" if hatn is None else f"{hatn:.3f}",
            str(t.infra_errors),
            "-" if t.partial is None else f"{t.partial:.2f}",
        ]
        if glyphs:
            row.append("".join(_GLYPHS.get(c, "?") for c in t.cells))
        table.add_row(*row)
    return table


def render_failed_trials(report: Report, console: Console) -> None:
    """List the failed trials with their class and why (the first 30)."""
    if not report.failed_trials:
        return
    shown = report.failed_trials[:_FAILED_SHOWN]
    title = f"failed trials ({len(report.failed_trials)})"
    if len(shown) < len(report.failed_trials):
        title += f", the first {len(shown)}: --json and --html list them all"
    table = Table(title=title, show_edge=False)
    table.add_column("trial", no_wrap=True)
    table.add_column("class", no_wrap=True)
    table.add_column("why", overflow="fold")
    for f in shown:
        table.add_row(f"{escape(f.task_id)} #{f.trial}", f.cls, escape(f.detail))
    console.print(table)
    first = report.failed_trials[0]
    console.print(
        f"  [dim]a trial's timeline: harness audit {escape(report.folder)} --episode "
        f"{escape(first.episode_id)} (trial #{first.trial} of {escape(first.task_id)})[/dim]",
        soft_wrap=True,
    )


def render_gate(judgements: Sequence[Judgement], basis: Basis, console: Console) -> None:
    """Print each ``--fail-under`` bar's verdict and the figure it was judged on."""
    if not judgements:
        return
    how = (
        "the lower bound of the interval (--fail-under-on point judges the estimate)"
        if basis == "lower"
        else "the point estimate (--fail-under-on lower judges the interval's lower bound)"
    )
    console.print(f"[bold]--fail-under[/], judged on {how}:")
    for j in judgements:
        style = "green" if j.passed else "bold red"
        # One line per bar, never wrapped: CI logs are searched for it.
        console.print(f"  [{style}]{escape(j.describe())}[/]", soft_wrap=True)


def render(
    report: Report, console: Console, *, per_task: bool = False, all_k: bool = False
) -> None:
    """Print ``report`` as rich tables (``all_k``: every k, not 1..10 and powers of two)."""
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
    render_summary(report, console, all_k=all_k, full=True)
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
    if report.faults is not None:
        render_reliability(report.faults, console)
    if per_task:
        console.print(_task_table(report))
    render_failed_trials(report, console)


def render_comparison(cmp: Comparison, console: Console, *, all_k: bool = False) -> None:
    """Print a comparison as a rich table (k = 1..10, the powers of two and the largest k;
    every k with ``all_k``)."""
    conf = _pct(cmp.a.confidence)
    console.print(
        f"A = run {cmp.a.run_id} ({cmp.a.suite}), B = run {cmp.b.run_id} ({cmp.b.suite})\n"
        f"paired on the {len(cmp.tasks)} tasks both ran; infrastructure errors: "
        f"{cmp.a.infra_errors} in A, {cmp.b.infra_errors} in B, policy "
        f"[bold]{cmp.a.infra_policy}[/bold]: {INFRA_DESCRIPTIONS[cmp.a.infra_policy]}"
    )
    if cmp.a.transactions != cmp.b.transactions:

        def tools(transactions: bool) -> str:
            return "as transactions" if transactions else "called bare"

        console.print(
            f"tools: A {tools(cmp.a.transactions)}, B {tools(cmp.b.transactions)} (bare: no "
            "preconditions, postconditions, compensations or retries)"
        )
    for label, ids in (("only in A", cmp.only_a), ("only in B", cmp.only_b)):
        if ids:
            console.print(f"[yellow]{label}[/yellow] (not compared): {', '.join(ids)}")
    if cmp.changed:
        console.print(
            f"[yellow]changed between the runs[/yellow] (version or content): "
            f"{', '.join(cmp.changed)}"
        )
    for side in cmp.unfinished:
        run = cmp.a if side == "a" else cmp.b
        console.print(
            f"[yellow]run {side.upper()} ({run.run_id}) is {run.status}, not finished[/yellow]: "
            "it is compared on the trials it has so far"
        )
    if cmp.cut_k:
        cut = cmp.cut_k
        ks = f"k = {cut[0]}" if len(cut) == 1 else f"k = {cut[0]}..{cut[-1]}"
        console.print(
            f"[yellow]{ks} not compared[/yellow]: the runs were planned for up to {cut[-1]} "
            f"trials a task, and some shared task has only {cut[0] - 1} in one of them"
        )
    n = max((d.k or 0 for _, _, d in cmp.rows), default=0)
    shown = set(table_ks(n, all_k=all_k))
    title = "pass^k: A, B and the paired difference A - B"
    if len(shown) < n:
        title += f" (k = 1..10, powers of two and {n}; --all-k shows all {n})"
    table = Table(title=title, show_edge=False, pad_edge=False)
    for col in ("k", "A", f"{conf} interval", "B", f"{conf} interval ", "A - B", "interval"):
        table.add_column(col, justify="right", no_wrap=True)
    for ea, eb, d in cmp.rows:
        if d.k not in shown:
            continue
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

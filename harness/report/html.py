"""A report as one self-contained HTML file: inline SVG plots, tables, the evidence record.

No script, no stylesheet or font from the network, no external asset: the file opens the same
offline, in a browser or in a CI artifact viewer, years later. Plots are drawn here as SVG:

- ``#plot-passk``: pass^k against k with its interval band (pass@k dashed, for contrast);
- ``#plot-null``: observed task success by required step count against ``p^n`` and its band;
- ``#plot-heatmap``: per-task success, tasks by trials (pass, fail, infrastructure error).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .model import INFRA_DESCRIPTIONS, Report

__all__ = ["render_html"]

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;
max-width:1100px;padding:0 1rem;color:#1d2330}
h1{font-size:1.5rem;margin-bottom:.2rem}h2{font-size:1.15rem;margin-top:2rem;
border-bottom:1px solid #d8dce4;padding-bottom:.2rem}
table{border-collapse:collapse;margin:.5rem 0}td,th{border:1px solid #d8dce4;padding:.2rem .5rem;
vertical-align:top}th{background:#f3f5f9;text-align:left}td.num{text-align:right;
font-variant-numeric:tabular-nums}.muted{color:#667085}.policy{background:#fff8e1;
border:1px solid #f0d98c;padding:.5rem .8rem;border-radius:4px}
code,pre{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace}pre{white-space:pre-wrap;
word-break:break-all;margin:0}svg{display:block;margin:.5rem 0}svg text{font:11px sans-serif;
fill:#1d2330}.bad{color:#b42318;font-weight:600}.legend span{display:inline-block;width:.8rem;
height:.8rem;margin:0 .3rem 0 1rem;vertical-align:middle}
"""

_COLORS = {"pass": "#2e7d32", "fail": "#d32f2f", "infra": "#9e9e9e", "missing": "#ffffff"}


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _f(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


def _table(
    headers: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    ident: str = "",
    numeric: Iterable[int] = (),
) -> str:
    nums = set(numeric)
    out = [f"<table{f' id={_e(ident)!r}' if ident else ''}>".replace("'", '"')]
    out.append("<tr>" + "".join(f"<th>{_e(h)}</th>" for h in headers) + "</tr>")
    for row in rows:
        cells = []
        for i, cell in enumerate(row):
            cls = ' class="num"' if i in nums else ""
            cells.append(f"<td{cls}>{cell}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    return "\n".join(out)


class _Axes:
    """Linear scales from data to pixels for one plot area."""

    def __init__(
        self,
        width: int,
        height: int,
        x: tuple[float, float],
        y: tuple[float, float] = (0.0, 1.0),
        margin: tuple[int, int, int, int] = (34, 20, 45, 55),  # top, right, bottom, left
    ) -> None:
        self.width, self.height = width, height
        self.top, self.right, self.bottom, self.left = margin
        lo, hi = x
        if hi <= lo:
            lo, hi = lo - 0.5, hi + 0.5
        self.x0, self.x1 = lo, hi
        self.y0, self.y1 = y

    def x(self, v: float) -> float:
        span = self.width - self.left - self.right
        return self.left + (v - self.x0) / (self.x1 - self.x0) * span

    def y(self, v: float) -> float:
        span = self.height - self.top - self.bottom
        return self.top + (1.0 - (v - self.y0) / (self.y1 - self.y0)) * span

    def frame(self, xticks: Sequence[float], xlabel: str, ylabel: str) -> str:
        parts = []
        for t in (0.0, 0.25, 0.5, 0.75, 1.0):
            yy = self.y(t)
            parts.append(
                f'<line x1="{self.left}" x2="{self.width - self.right}" y1="{yy:.1f}" '
                f'y2="{yy:.1f}" stroke="#e4e7ec"/>'
                f'<text x="{self.left - 6}" y="{yy + 4:.1f}" text-anchor="end">{t:.2f}</text>'
            )
        base = self.height - self.bottom
        for t in xticks:
            xx = self.x(t)
            parts.append(
                f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{base}" y2="{base + 4}" stroke="#667085"/>'
                f'<text x="{xx:.1f}" y="{base + 16}" text-anchor="middle">{t:g}</text>'
            )
        parts.append(
            f'<line x1="{self.left}" x2="{self.width - self.right}" y1="{base}" y2="{base}" '
            'stroke="#667085"/>'
            f'<line x1="{self.left}" x2="{self.left}" y1="{self.top}" y2="{base}" '
            'stroke="#667085"/>'
            f'<text x="{(self.left + self.width - self.right) / 2:.1f}" y="{self.height - 8}" '
            f'text-anchor="middle">{_e(xlabel)}</text>'
            f'<text transform="translate(14,{(self.top + base) / 2:.1f}) rotate(-90)" '
            f'text-anchor="middle">{_e(ylabel)}</text>'
        )
        return "".join(parts)


def _ticks(lo: int, hi: int, most: int = 12) -> list[float]:
    step = max(1, math.ceil((hi - lo + 1) / most))
    return [float(v) for v in range(lo, hi + 1, step)]


def _band(axes: _Axes, xs: Sequence[float], low: Sequence[float], high: Sequence[float]) -> str:
    pts = [f"{axes.x(x):.1f},{axes.y(h):.1f}" for x, h in zip(xs, high, strict=True)]
    pts += [f"{axes.x(x):.1f},{axes.y(lo):.1f}" for x, lo in zip(xs, low, strict=True)][::-1]
    return " ".join(pts)


def _line(axes: _Axes, xs: Sequence[float], ys: Sequence[float]) -> str:
    return " ".join(f"{axes.x(x):.1f},{axes.y(y):.1f}" for x, y in zip(xs, ys, strict=True))


def plot_pass_k(report: Report) -> str:
    """pass^k against k with the interval band, pass@k dashed."""
    curve = report.curve
    ks = [float(k) for k in curve.ks.tolist()]
    axes = _Axes(640, 300, (ks[0], ks[-1]))
    hat = curve.hat_value.tolist()
    at = curve.at_value.tolist()
    conf = f"{report.confidence:.0%}"
    band = _band(axes, ks, curve.hat_low.tolist(), curve.hat_high.tolist())
    points = "".join(
        f'<circle class="point" cx="{axes.x(k):.1f}" cy="{axes.y(v):.1f}" r="3.5" '
        f'fill="#1f4fbf"><title>k={k:g}: pass^k {v:.3f} [{lo:.3f}, {hi:.3f}]</title></circle>'
        for k, v, lo, hi in zip(
            ks, hat, curve.hat_low.tolist(), curve.hat_high.tolist(), strict=True
        )
    )
    return (
        f'<svg id="plot-passk" xmlns="http://www.w3.org/2000/svg" width="{axes.width}" '
        f'height="{axes.height}" viewBox="0 0 {axes.width} {axes.height}" role="img" '
        f'aria-label="pass^k against k with {conf} interval band">'
        f"<title>pass^k against k with its {conf} interval band</title>"
        + axes.frame(_ticks(int(ks[0]), int(ks[-1])), "k", "pass^k")
        + f'<polygon class="band" points="{band}" '
        'fill="#1f4fbf" fill-opacity="0.18" stroke="none"/>'
        f'<polyline class="estimate" points="{_line(axes, ks, hat)}" fill="none" '
        'stroke="#1f4fbf" stroke-width="2"/>'
        f'<polyline class="pass-at" points="{_line(axes, ks, at)}" fill="none" '
        'stroke="#7a869a" stroke-width="1.5" stroke-dasharray="5 4"/>'
        + points
        + f'<text x="{axes.width - axes.right}" y="14" text-anchor="end">'
        f"pass^k (band: {conf} interval) - dashed: pass@k</text></svg>"
    )


def plot_null_model(report: Report) -> str:
    """Observed task success by required steps against p^n and its band."""
    null = report.null
    if null is None:
        return '<p class="muted">No task has required steps: no p^n model to plot.</p>'
    top = max(row.steps for row in null.rows)
    axes = _Axes(640, 300, (0.0, float(max(top, 1))))
    grid = [top * i / 100 for i in range(101)] if top else [0.0, 1.0]
    p = null.p

    def power(base: float) -> list[float]:
        return [base**x for x in grid]

    markers = []
    for row in null.rows:
        x = axes.x(row.steps)
        r = 3.0 + min(6.0, math.sqrt(row.n_tasks))
        markers.append(
            f'<line class="errorbar" x1="{x:.1f}" x2="{x:.1f}" y1="{axes.y(row.observed_low):.1f}" '
            f'y2="{axes.y(row.observed_high):.1f}" stroke="#b54708" stroke-width="1.5"/>'
            f'<circle class="observed" cx="{x:.1f}" cy="{axes.y(row.observed):.1f}" r="{r:.1f}" '
            f'fill="{"#b54708" if row.consistent else "#b42318"}" fill-opacity="0.85">'
            f"<title>{row.steps} steps, {row.n_tasks} tasks: observed {row.observed:.3f} "
            f"[{row.observed_low:.3f}, {row.observed_high:.3f}], p^n {row.predicted:.3f}"
            f"</title></circle>"
        )
    return (
        f'<svg id="plot-null" xmlns="http://www.w3.org/2000/svg" width="{axes.width}" '
        f'height="{axes.height}" viewBox="0 0 {axes.width} {axes.height}" role="img" '
        'aria-label="observed task success against p^n by required steps">'
        "<title>observed task success against the p^n prediction by required steps</title>"
        + axes.frame(_ticks(0, max(top, 1)), "required steps n", "task success")
        + f'<polygon class="band" points="{_band(axes, grid, power(p.low), power(p.high))}" '
        'fill="#7a869a" fill-opacity="0.2" stroke="none"/>'
        f'<polyline class="prediction" points="{_line(axes, grid, power(p.value))}" '
        'fill="none" stroke="#475467" stroke-width="2"/>'
        + "".join(markers)
        + f'<text x="{axes.width - axes.right}" y="14" text-anchor="end">'
        f"line: p^n, p = {p.value:.4f} - points: observed, with intervals</text></svg>"
    )


def plot_heatmap(report: Report) -> str:
    """Tasks by trials: each cell one trial's verdict."""
    cell, label_w, head = 14, 150, 28
    width_cells = max(len(t.cells) for t in report.tasks)
    width = label_w + width_cells * (cell + 1) + 60
    height = head + len(report.tasks) * (cell + 1) + 10
    parts = [
        f'<svg id="plot-heatmap" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="per-task success heat map, tasks by trials">'
        "<title>per-task success, tasks by trials</title>"
    ]
    for j in range(width_cells):
        x = label_w + j * (cell + 1) + cell / 2
        parts.append(f'<text x="{x:.1f}" y="{head - 8}" text-anchor="middle">{j}</text>')
    for i, task in enumerate(report.tasks):
        y = head + i * (cell + 1)
        parts.append(
            f'<text x="{label_w - 6}" y="{y + cell - 3}" text-anchor="end">'
            f"{_e(task.task_id)}</text>"
        )
        for j, state in enumerate(task.cells):
            parts.append(
                f'<rect class="cell cell-{state}" x="{label_w + j * (cell + 1)}" y="{y}" '
                f'width="{cell}" height="{cell}" fill="{_COLORS[state]}" stroke="#d0d5dd">'
                f"<title>{_e(task.task_id)} trial {j}: {state}</title></rect>"
            )
        parts.append(
            f'<text x="{label_w + width_cells * (cell + 1) + 6}" y="{y + cell - 3}">'
            f"{task.successes}/{task.trials}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _json_cell(value: Any) -> str:
    return f"<pre>{_e(json.dumps(value, indent=1, sort_keys=True, default=str))}</pre>"


def _mapping_table(value: Mapping[str, Any], render: Callable[[Any], str]) -> str:
    return _table(("name", "value"), ((_e(k), render(v)) for k, v in sorted(value.items())))


def evidence_table(evidence: Mapping[str, Any], report: Report) -> str:
    """The evidence record as a table: one row per item, known items first."""
    ev = dict(evidence)
    rows: list[tuple[str, str]] = []

    def take(key: str, label: str, render: Callable[[Any], str]) -> None:
        if key in ev:
            rows.append((label, render(ev.pop(key))))

    take("harness_version", "harness version", _e)
    suite = ev.pop("suite", None)
    if isinstance(suite, dict):
        tasks = suite.get("tasks") or {}
        head = {k: v for k, v in suite.items() if k != "tasks"}
        rows.append(("suite", _json_cell(head)))
        if isinstance(tasks, dict):
            versions: dict[str, int] = {}
            for info in tasks.values():
                version = str(info.get("version", "?"))
                versions[version] = versions.get(version, 0) + 1
            counted = ", ".join(f"version {v}: {n}" for v, n in sorted(versions.items()))
            listing = _table(
                ("task", "version", "content digest"),
                (
                    (
                        _e(tid),
                        _e(info.get("version", "?")),
                        f"<code>{_e(str(info.get('digest', ''))[:16])}</code>",
                    )
                    for tid, info in tasks.items()
                ),
            )
            rows.append(
                (
                    "task versions",
                    f"{len(tasks)} tasks ({_e(counted)})<details><summary>per task, with the "
                    f"digest of its content</summary>{listing}</details>",
                )
            )
    take(
        "tool_versions",
        "tool versions",
        lambda v: _mapping_table(v, lambda x: f"<code>{_e(x)}</code>"),
    )
    take("agent", "agent configuration", _json_cell)
    policy = ev.pop("policy", None)
    if isinstance(policy, dict):
        if "retry" in policy:
            rows.append(("retry policy", _json_cell(policy["retry"])))
        rows.append(
            ("harness policy", _json_cell({k: v for k, v in policy.items() if k != "retry"}))
        )
    rules = ev.pop("partial_credit", None)
    if isinstance(rules, dict):
        counts: dict[str, int] = {}
        for rule in rules.values():
            counts[str(rule)] = counts.get(str(rule), 0) + 1
        summary = ", ".join(f"{rule}: {n} tasks" for rule, n in sorted(counts.items()))
        rows.append(
            (
                "partial-credit rules",
                f"{_e(summary)}<details><summary>per task</summary>"
                f"{_mapping_table(rules, _e)}</details>",
            )
        )
    seed = ev.pop("seed", None)
    if seed is not None:
        rows.append(
            (
                "seeds",
                f"run seed <code>{_e(seed)}</code>; each trial's seed is derived from it, the "
                "task id and the trial index (sha256), so any trial reruns alone",
            )
        )
    take("trials", "trials per task", _e)
    if "infra_error_policy" in ev:
        rows.append(
            (
                "infrastructure-error policy",
                f"run default <code>{_e(ev.pop('infra_error_policy'))}</code>; this report: "
                f"<code>{_e(report.infra_policy)}</code>",
            )
        )
    take("machine", "machine", _json_cell)
    for key in sorted(ev):
        rows.append((_e(key), _json_cell(ev[key])))
    body = "".join(f"<tr><th>{label}</th><td>{value}</td></tr>" for label, value in rows)
    return f'<table id="evidence">{body}</table>'


def render_html(report: Report) -> str:
    """The whole report as one self-contained HTML document."""
    conf = f"{report.confidence:.0%}"
    passk = _table(
        ("k", "pass^k", f"{conf} interval", "method", "pass@k", f"{conf} interval", "method"),
        (
            (
                str(k),
                _f(h.value),
                f"[{_f(h.low)}, {_f(h.high)}]",
                _e(h.method),
                _f(a.value),
                f"[{_f(a.low)}, {_f(a.high)}]",
                _e(a.method),
            )
            for k in report.curve.ks.tolist()
            for h, a in [(report.pass_hat(int(k)), report.pass_at(int(k)))]
        ),
        ident="passk-table",
        numeric=(0, 1, 2, 4, 5),
    )
    methods = "".join(
        f"<li><code>{_e(m)}</code>: {_e(text)}</li>" for m, text in report.methods().items()
    )
    counts = _table(
        ("what", "count"),
        [(f"failed call: {_e(k)}", str(v)) for k, v in sorted(report.failures.items())]
        + [(f"episode {_e(k)}", str(v)) for k, v in sorted(report.outcomes.items())]
        + [("infrastructure errors", str(report.infra_errors))],
        ident="counts-table",
        numeric=(1,),
    )
    partial = (
        "No counted trial has a partial-credit rule."
        if report.partial_mean is None
        else f"Mean partial credit {_f(report.partial_mean)} over {report.partial_trials} "
        "trials, reported separately: pass/fail does not use it."
    )
    null_html = '<p class="muted">No task has required steps.</p>'
    if report.null is not None:
        p = report.null.p
        h = report.null.horizon(0.5)
        null_html = (
            f"<p>Per-step success p = {_f(p.value, 4)} [{_f(p.low, 4)}, {_f(p.high, 4)}] "
            f"({_e(p.method)}, {p.n_tasks} steps from the transaction logs). Horizon at "
            f"s = 0.5: H = ln 0.5 / ln p = {_f(h[0], 1)} steps [{_f(h[1], 1)}, {_f(h[2], 1)}]."
            "</p>"
            + _table(
                ("steps", "tasks", "p^n", f"{conf} interval", "observed", "interval", "fits"),
                (
                    (
                        str(r.steps),
                        str(r.n_tasks),
                        _f(r.predicted),
                        f"[{_f(r.predicted_low)}, {_f(r.predicted_high)}]",
                        _f(r.observed),
                        f"[{_f(r.observed_low)}, {_f(r.observed_high)}]",
                        "yes" if r.consistent else '<span class="bad">no</span>',
                    )
                    for r in report.null.rows
                ),
                ident="null-table",
                numeric=(0, 1, 2, 3, 4, 5),
            )
        )
    sc = report.self_conditioning
    sc_html = ""
    if sc is not None:
        items = []
        for label, est in (("after an earlier error", sc.after_error), ("clean history", sc.clean)):
            items.append(
                f"<li>{label}: no steps</li>"
                if est is None
                else f"<li>{label}: {_f(est.value)} [{_f(est.low)}, {_f(est.high)}] "
                f"({est.n_tasks} steps)</li>"
            )
        diff = sc.difference
        sc_html = (
            "<p>Step error rate by history, over "
            f"{sc.n_episodes} episodes:</p><ul>{''.join(items)}</ul>"
            + ("" if diff is None else f"<p>Difference {diff:+.3f}.</p>")
        )
    per_task = _table(
        ("task", "version", "passed", "trials", "infra", "steps", "partial"),
        (
            (
                _e(t.task_id),
                _e(t.version),
                str(t.successes),
                str(t.trials),
                str(t.infra_errors),
                str(t.steps),
                _f(t.partial, 2),
            )
            for t in report.tasks
        ),
        ident="task-table",
        numeric=(2, 3, 4, 5, 6),
    )
    dropped = (
        f"<p>Dropped (no trials left under exclude): {_e(', '.join(report.dropped_tasks))}</p>"
        if report.dropped_tasks
        else ""
    )
    legend = "".join(
        f'<span style="background:{color};border:1px solid #d0d5dd"></span>{name}'
        for name, color in _COLORS.items()
    )
    full = json.dumps(report.evidence, indent=2, sort_keys=True, default=str)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>harness report: {_e(report.suite)} run {_e(report.run_id)}</title>
<style>{_CSS}</style></head>
<body>
<h1>{_e(report.suite)}: run {_e(report.run_id)}</h1>
<p class="muted">status {_e(report.status)} - folder {_e(report.folder)}</p>
<table id="summary">
<tr><th>tasks (T)</th><td class="num">{report.n_tasks}</td></tr>
<tr><th>trials per task (n)</th><td class="num">{report.n}{
        "" if report.n == report.n_max else f" (up to {report.n_max})"
    }</td></tr>
<tr><th>trials counted</th><td class="num">{report.n_trials}</td></tr>
<tr><th>confidence</th><td class="num">{conf}, intervals at the task level</td></tr>
</table>
<p class="policy" id="infra-policy"><b>Infrastructure errors: {report.infra_errors}.</b>
Policy <code>{_e(report.infra_policy)}</code>: {_e(INFRA_DESCRIPTIONS[report.infra_policy])}.</p>
{dropped}
<h2>pass^k and pass@k</h2>
{plot_pass_k(report)}
{passk}
<ul class="muted">{methods}</ul>
<h2>p^n null model</h2>
{plot_null_model(report)}
{null_html}
<h2>Self-conditioning</h2>
{sc_html or '<p class="muted">No step histories.</p>'}
<h2>Per-task success</h2>
<p class="legend">{legend}</p>
{plot_heatmap(report)}
{per_task}
<h2>Failures and outcomes</h2>
{counts}
<p>{partial}</p>
<h2>Evidence</h2>
{evidence_table(report.evidence, report)}
<details><summary>evidence record as JSON</summary><pre>{_e(full)}</pre></details>
</body></html>
"""

"""A report as one self-contained HTML file: inline SVG plots, tables, the evidence record.

No script, no stylesheet or font from the network, no external asset: the file opens the same
offline, in a browser or in a CI artifact viewer, years later. Plots are drawn here as SVG:

- ``#plot-passk``: pass^k against k with its interval band (pass@k dashed, for contrast);
- ``#plot-null``: observed task success by required step count against ``p^n`` and its band;
- ``#plot-heatmap``: per-task success, tasks by trials (pass, fail, infrastructure error).

Given every trial's page (:class:`TrialPages`, which ``harness.audit.render_report`` builds from
the run's record), each heat-map cell links to its trial's timeline, a list of the trials shows
the failed ones first with a filter by failure class, and each trial's page shows alone when its
link is followed (the CSS ``:target``; the browser's Back button returns), still with no script.

The pages are the jinja2 templates in ``templates/``; the geometry of the plots is computed here
and handed to them as numbers.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from markupsafe import Markup

from ..runs.judge import TRIAL_CLASSES
from .model import INFRA_DESCRIPTIONS, Report, table_ks
from .reliability import _counts
from .templating import environment

__all__ = ["INFRASTRUCTURE", "PASSED", "TrialPage", "TrialPages", "render_html"]

_COLORS = {"pass": "#2e7d32", "fail": "#d32f2f", "infra": "#9e9e9e", "missing": "#ffffff"}

# The filter's names for a trial that passed, and (as ``harness.runs.judge.TRIAL_CLASSES``
# names it) one the infrastructure ended.
PASSED = "passed"
INFRASTRUCTURE = "infrastructure"

# Failed trials first, then infrastructure errors, then passes.
_STATE_ORDER = {"fail": 0, "infra": 1, "pass": 2}


@dataclass(frozen=True)
class TrialPage:
    """One trial as the report shows it: a row of the trial list and a page of its own.

    Attributes:
        task_id, trial, episode_id: which trial.
        state: ``pass``, ``fail`` or ``infra``, as its heat-map cell.
        failure_classes: the failure classes of its calls that did not commit, sorted.
        trial_class: why it failed (``harness.runs.judge.TRIAL_CLASSES``), or ``passed``.
        why: why it failed, in a line (the infrastructure cause, what the verifier found).
        body: its timeline as HTML (``harness.audit`` renders it; this module trusts it).
    """

    task_id: str
    trial: int
    episode_id: str
    state: str
    failure_classes: tuple[str, ...]
    trial_class: str
    why: str
    body: Markup

    @property
    def anchor(self) -> str:
        """The id of its page in the report."""
        return f"episode-{self.episode_id}"

    @property
    def href(self) -> str:
        """A link to its page, for any episode id."""
        return "#" + quote(self.anchor, safe="")

    @property
    def filters(self) -> tuple[str, ...]:
        """The names the filter knows it by: its trial class, one a trial, so the filter's
        counts add up to the trials."""
        return (self.trial_class,)


@dataclass(frozen=True)
class TrialPages:
    """Every trial's page, for a report whose grid links to them.

    Attributes:
        trials: the pages, in any order (the report lists failures first).
        style: the CSS their bodies need.
    """

    trials: tuple[TrialPage, ...]
    style: Markup


def _f(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    if math.isinf(x):
        return "inf"
    return f"{x:.{digits}f}"


_env = environment("harness.report", f=_f)


def _render(template: str, **context: Any) -> str:
    return _env.get_template(template).render(**context)


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

    def frame(self, xticks: Sequence[float], xlabel: str, ylabel: str) -> dict[str, Any]:
        """The plot's size and where its axes, grid, ticks and labels go (see ``svg.html.j2``)."""
        base = self.height - self.bottom
        return {
            "width": self.width,
            "height": self.height,
            "left": self.left,
            "right": self.width - self.right,
            "top": self.top,
            "base": base,
            "yticks": [(self.y(t), t) for t in (0.0, 0.25, 0.5, 0.75, 1.0)],
            "xticks": [(self.x(t), t) for t in xticks],
            "xlabel": xlabel,
            "xlabel_at": ((self.left + self.width - self.right) / 2, self.height - 8),
            "ylabel": ylabel,
            "ylabel_at": (14, (self.top + base) / 2),
        }


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
    hat, low, high = curve.hat_value.tolist(), curve.hat_low.tolist(), curve.hat_high.tolist()
    return _render(
        "pass_k.html.j2",
        conf=f"{report.confidence:.0%}",
        frame=axes.frame(_ticks(int(ks[0]), int(ks[-1])), "k", "pass^k"),
        band=_band(axes, ks, low, high),
        estimate=_line(axes, ks, hat),
        pass_at=_line(axes, ks, curve.at_value.tolist()),
        points=[
            (axes.x(k), axes.y(v), k, v, lo, hi)
            for k, v, lo, hi in zip(ks, hat, low, high, strict=True)
        ],
    )


def plot_null_model(report: Report) -> str:
    """Observed task success by required steps against p^n and its band."""
    null = report.null
    if null is None:
        return _render("null_model.html.j2", null=None)
    top = max(row.steps for row in null.rows)
    axes = _Axes(640, 300, (0.0, float(max(top, 1))))
    grid = [top * i / 100 for i in range(101)] if top else [0.0, 1.0]
    p = null.p

    def power(base: float) -> list[float]:
        return [base**x for x in grid]

    return _render(
        "null_model.html.j2",
        null=null,
        frame=axes.frame(_ticks(0, max(top, 1)), "required steps n", "task success"),
        band=_band(axes, grid, power(p.low), power(p.high)),
        prediction=_line(axes, grid, power(p.value)),
        markers=[
            {
                "row": row,
                "x": axes.x(row.steps),
                "y": axes.y(row.observed),
                "low": axes.y(row.observed_low),
                "high": axes.y(row.observed_high),
                "r": 3.0 + min(6.0, math.sqrt(row.n_tasks)),
            }
            for row in null.rows
        ],
    )


def plot_heatmap(report: Report, links: Mapping[tuple[str, int], str] | None = None) -> str:
    """Tasks by trials: each cell one trial's verdict, a link to its page when ``links`` has
    one for ``(task_id, trial)``."""
    links = links or {}
    cell, label_w, head = 14, 150, 28
    width_cells = max(len(t.cells) for t in report.tasks)
    return _render(
        "heatmap.html.j2",
        width=label_w + width_cells * (cell + 1) + 60,
        height=head + len(report.tasks) * (cell + 1) + 10,
        cell=cell,
        label_x=label_w - 6,
        count_x=label_w + width_cells * (cell + 1) + 6,
        head_y=head - 8,
        columns=[label_w + j * (cell + 1) + cell / 2 for j in range(width_cells)],
        rows=[
            (
                task,
                head + i * (cell + 1),
                [
                    (label_w + j * (cell + 1), state, _COLORS[state], links.get((task.task_id, j)))
                    for j, state in enumerate(task.cells)
                ],
            )
            for i, task in enumerate(report.tasks)
        ],
    )


def _json(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=True, default=str)


def evidence_table(evidence: Mapping[str, Any], report: Report) -> str:
    """The evidence record as a table: one row per item, known items first.

    Each row is ``(label, kind, value)``; ``kind`` says how ``evidence.html.j2`` shows it.
    """
    ev = dict(evidence)
    rows: list[tuple[str, str, Any]] = []

    def take(key: str, label: str, kind: str = "json") -> None:
        if key in ev:
            value = ev.pop(key)
            rows.append((label, kind, _json(value) if kind == "json" else value))

    take("harness_version", "harness version", "text")
    suite = ev.pop("suite", None)
    if isinstance(suite, dict):
        tasks = suite.get("tasks") or {}
        rows.append(("suite", "json", _json({k: v for k, v in suite.items() if k != "tasks"})))
        if isinstance(tasks, dict):
            versions = Counter(str(info.get("version", "?")) for info in tasks.values())
            listing = [
                (tid, info.get("version", "?"), str(info.get("digest", ""))[:16])
                for tid, info in tasks.items()
            ]
            counted = ", ".join(f"version {v}: {n}" for v, n in sorted(versions.items()))
            rows.append(("task versions", "tasks", (counted, listing)))
    take("tool_versions", "tool versions", "digests")
    take("agent", "agent configuration")
    policy = ev.pop("policy", None)
    if isinstance(policy, dict):
        if "retry" in policy:
            rows.append(("retry policy", "json", _json(policy["retry"])))
        harness_policy = {k: v for k, v in policy.items() if k != "retry"}
        rows.append(("harness policy", "json", _json(harness_policy)))
    rules = ev.pop("partial_credit", None)
    if isinstance(rules, dict):
        counts = Counter(str(rule) for rule in rules.values())
        summary = ", ".join(f"{rule}: {n} tasks" for rule, n in sorted(counts.items()))
        rows.append(("partial-credit rules", "rules", (summary, rules)))
    seed = ev.pop("seed", None)
    if seed is not None:
        rows.append(("seeds", "seed", seed))
    take("trials", "trials per task", "text")
    take("infra_error_policy", "infrastructure-error policy", "infra")
    take("machine", "machine")
    rows += [(key, "json", _json(ev[key])) for key in sorted(ev)]
    return _render("evidence.html.j2", rows=rows, report=report)


def _walkthrough(report: Report, pages: TrialPages | None) -> dict[str, Any]:
    """The trial list, its filter and the links from the grid (all empty without pages)."""
    if pages is None:
        return {"trials": [], "filters": [], "trial_style": Markup(""), "links": {}}
    tasks = {t.task_id: i for i, t in enumerate(report.tasks)}
    trials = sorted(
        pages.trials,
        key=lambda p: (_STATE_ORDER.get(p.state, 3), tasks.get(p.task_id, len(tasks)), p.trial),
    )
    counts = Counter(name for p in trials for name in p.filters)
    names = sorted(counts, key=lambda n: (n == PASSED, n == INFRASTRUCTURE, -counts[n], n))
    # The filter's CSS names a class by its position, never by its recorded text.
    index = {name: i for i, name in enumerate(names)}
    return {
        "trials": [(p, " ".join(f"fc-{index[n]}" for n in p.filters)) for p in trials],
        "filters": [(index[n], n, counts[n]) for n in names],
        "trial_style": pages.style,
        "links": {(p.task_id, p.trial): p.href for p in trials},
    }


def render_html(report: Report, *, pages: TrialPages | None = None, all_k: bool = False) -> str:
    """The whole report as one self-contained HTML document; with ``pages``, each trial's
    timeline one click from its cell of the grid. The pass^k table holds k = 1..10, the powers
    of two and n (every k with ``all_k``); the plot always draws every k."""
    shown = set(table_ks(report.n, all_k=all_k))
    ks = [int(k) for k in report.curve.ks.tolist() if int(k) in shown]
    walk = _walkthrough(report, pages)
    return _render(
        "report.html.j2",
        report=report,
        conf=f"{report.confidence:.0%}",
        infra_description=INFRA_DESCRIPTIONS[report.infra_policy],
        trial_classes=TRIAL_CLASSES,
        counts=_counts,
        passk=[(k, report.pass_hat(k), report.pass_at(k)) for k in ks],
        horizon=None if report.null is None else report.null.horizon(0.5),
        colors=_COLORS,
        plot_pass_k=Markup(plot_pass_k(report)),
        plot_null_model=Markup(plot_null_model(report)),
        plot_heatmap=Markup(plot_heatmap(report, walk.pop("links"))),
        evidence=Markup(evidence_table(report.evidence, report)),
        evidence_json=json.dumps(report.evidence, indent=2, sort_keys=True, default=str),
        **walk,
    )

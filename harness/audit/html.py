"""Episodes as self-contained HTML (no external resources): one episode's timeline as a page,
and a run's report whose grid links to every trial's timeline.

Every event of the record is a list item; a transaction shows its arguments, outcome, decision
and failure class, attempts, timing, the diff it made (field by field, with the whole before
and after one click away) and its checkpoint. ``templates/episode.html.j2`` draws an episode
once, for both: :func:`render_html` wraps it in a page of its own (``timeline.html.j2``, whose
small inline script filters the list; the page reads the same without it), and
:func:`render_report` hands every trial's to the report (:mod:`harness.report.html`).
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from typing import Any

from markupsafe import Markup

from ..report.html import PASSED, TrialPage, TrialPages
from ..report.html import render_html as render_report_html
from ..report.model import Report
from ..report.templating import environment
from ..runs.judge import trial_class
from ..runs.layout import current_trials, open_store
from ..store import TrialRow, TxnStatus, VerifyReport
from .model import timeline

__all__ = ["render_html", "render_report", "trial_page"]

_PROBLEMS = {
    TxnStatus.FAILED,
    TxnStatus.INVALID,
    TxnStatus.CHECK_ERROR,
    TxnStatus.PRECONDITION,
    TxnStatus.IN_DOUBT,
    TxnStatus.ABANDONED,
}


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return ""
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _omit(value: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k not in keys}


_env = environment("harness.audit", json=_json, when=_when, omit=_omit)
_env.globals["problems"] = _PROBLEMS


def render_html(t: dict[str, Any], *, verification: VerifyReport | None = None) -> str:
    """A self-contained HTML page showing one episode's timeline (from :func:`timeline`), and
    what ``verification`` found: a line that it verified, or a banner naming each finding (the
    timeline, made with the findings, marks each where it appears)."""
    said = None if verification is None else verification.to_dict()
    return _env.get_template("timeline.html.j2").render(t=t, verification=said)


def trial_page(t: dict[str, Any], row: TrialRow) -> TrialPage:
    """Trial ``row`` as the report lists and shows it, ``t`` its episode's timeline."""
    state = "infra" if row.infra_error else ("pass" if row.passed else "fail")
    classes = {
        str(e["failure_class"])
        for e in t["events"]
        if e["kind"] == "transaction" and e.get("failure_class")
    }
    failed = trial_class(row)
    if failed is None:
        cls, why = PASSED, ""
    else:
        cls, why = failed.cls, failed.detail
    body = _env.get_template("episode.html.j2").module.episode(t)  # type: ignore[attr-defined]
    return TrialPage(
        task_id=row.task_id,
        trial=row.trial,
        episode_id=row.episode_id,
        state=state,
        failure_classes=tuple(sorted(classes)),
        trial_class=cls,
        why=why,
        body=Markup(body),
    )


def render_report(report: Report, *, all_k: bool = False) -> str:
    """``report`` as one self-contained HTML document in which every cell of the per-task grid
    opens its trial's timeline, read from the run's record (``report.folder``).

    The page grows by about 11 KB a trial: 4.5 MB for the retail suite's 49 tasks by 8 trials
    (the report alone: 0.1 MB).
    """
    with open_store(report.folder) as opened:
        episodes = {e.id: e for e in opened.store.episodes(opened.run_id)}
        # Each trial's last attempt, as the report counts it (under exclude, no infrastructure
        # error): the filter's counts add up to the report's, and a cell opens its attempt.
        rows = current_trials(opened.store.trial_rows(opened.run_id))
        trials = tuple(
            trial_page(timeline(opened.store, episodes[row.episode_id], row), row)
            for row in rows
            if row.episode_id in episodes
            and not (report.infra_policy == "exclude" and row.infra_error)
        )
    style = Markup(_env.get_template("episode.css.j2").render())
    return render_report_html(report, pages=TrialPages(trials, style), all_k=all_k)

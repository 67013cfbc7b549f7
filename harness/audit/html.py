"""One episode's timeline as a self-contained HTML page (no external resources).

Every event of the record is a list item of ``#timeline``; a transaction shows its arguments,
outcome, decision and failure class, attempts, timing, the diff it made (a before/after table)
and its checkpoint. A small inline script filters the list; the page reads the same without it.
The page is the jinja2 template ``templates/timeline.html.j2``.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Mapping
from typing import Any

from ..report.templating import environment
from ..store import TxnStatus

__all__ = ["render_html"]

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


def render_html(t: dict[str, Any]) -> str:
    """A self-contained HTML page showing one episode's timeline (from :func:`timeline`)."""
    return _env.get_template("timeline.html.j2").render(t=t, problems=_PROBLEMS)

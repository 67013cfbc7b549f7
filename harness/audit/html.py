"""One episode's timeline as a self-contained HTML page (no external resources).

Every event of the record is a list item of ``#timeline``; a transaction shows its arguments,
outcome, decision and failure class, attempts, timing, the diff it made (a before/after table)
and its checkpoint. A small inline script filters the list; the page reads the same without it.
"""

from __future__ import annotations

import datetime as _dt
import json
from html import escape
from typing import Any

__all__ = ["render_html"]

_CSS = """
:root { --ok:#1a7f37; --bad:#cf222e; --warn:#9a6700; --dim:#57606a; --line:#d0d7de; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto;
       max-width: 1100px; padding: 24px; color: #1f2328; }
h1 { font-size: 20px; margin: 0 0 4px; }
.meta, .dim { color: var(--dim); }
.verdict { padding: 6px 10px; border-radius: 6px; display: inline-block; margin: 8px 0; }
.verdict.pass { background: #dafbe1; } .verdict.fail { background: #ffebe9; }
nav button { margin-right: 6px; border: 1px solid var(--line); background: #f6f8fa;
             border-radius: 6px; padding: 3px 10px; cursor: pointer; }
nav button.on { background: #ddf4ff; border-color: #54aeff; }
#timeline { list-style: none; padding: 0; margin: 16px 0; border-left: 3px solid var(--line); }
#timeline li.event { margin: 0 0 10px 0; padding: 6px 10px 6px 14px; position: relative; }
#timeline li.event::before { content: ""; position: absolute; left: -8px; top: 12px; width: 13px;
                             height: 13px; border-radius: 50%; background: var(--line); }
li.transaction { background: #f6f8fa; border-radius: 6px; }
li.committed::before, li.recovered::before { background: var(--ok) !important; }
li.failed::before, li.invalid::before, li.check_error::before { background: var(--bad) !important; }
li.precondition::before, li.compensated::before, li.escalation::before
  { background: var(--warn) !important; }
.seq { color: var(--dim); font-variant-numeric: tabular-nums; margin-right: 6px; }
.status { font-weight: 600; margin-left: 6px; }
.committed .status, .recovered .status { color: var(--ok); }
.failed .status, .invalid .status, .check_error .status { color: var(--bad); }
.precondition .status, .compensated .status, .abandoned .status, .in_doubt .status
  { color: var(--warn); }
code { font: 12px/1.4 ui-monospace, SFMono-Regular, Menlo, monospace; }
.args { word-break: break-all; }
table.diff { border-collapse: collapse; margin-top: 6px; width: 100%; }
table.diff th, table.diff td { border: 1px solid var(--line); padding: 3px 6px; text-align: left;
                               vertical-align: top; }
table.diff td { font: 12px ui-monospace, monospace; white-space: pre-wrap; word-break: break-all; }
td.before { background: #ffebe9; } td.after { background: #dafbe1; }
.hidden { display: none; }
"""

_SCRIPT = """
(function () {
  var items = document.querySelectorAll("#timeline li.event");
  var buttons = document.querySelectorAll("nav button");
  function show(which) {
    items.forEach(function (li) {
      var hide = which === "actions" ? !li.classList.contains("transaction")
        : which === "problems" ? !li.classList.contains("problem") : false;
      li.classList.toggle("hidden", hide);
    });
    buttons.forEach(function (b) { b.classList.toggle("on", b.dataset.show === which); });
  }
  buttons.forEach(function (b) {
    b.addEventListener("click", function () { show(b.dataset.show); });
  });
  show("all");
  document.body.dataset.rendered = String(items.length);
})();
"""

_PROBLEMS = {"failed", "invalid", "check_error", "precondition", "in_doubt", "abandoned"}


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def _when(ts: Any) -> str:
    if not isinstance(ts, int | float):
        return ""
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _transaction(event: dict[str, Any]) -> str:
    status = str(event.get("status"))
    parts = [
        f'<span class="seq">{event["seq"]}</span>',
        f'<span class="dim">{escape(_when(event.get("started_at") or event.get("ts")))}</span> ',
        f'<b class="action">{escape(str(event.get("action")))}</b>',
        f'(<code class="args">{escape(_json(event.get("arguments")))}</code>)',
        f'<span class="status">{escape(status)}</span>',
    ]
    if event.get("failure_class"):
        parts.append(
            f' <span class="fc">{escape(str(event["failure_class"]))} → '
            f"{escape(str(event.get('decision')))}</span>"
        )
    if event.get("attempts"):
        parts.append(f' <span class="dim">{event["attempts"]} attempt(s)</span>')
    if isinstance(event.get("duration"), int | float):
        parts.append(f' <span class="dim">{event["duration"] * 1000:.1f} ms</span>')
    body = [f'<div class="head">{"".join(parts)}</div>']
    if event.get("reason"):
        body.append(f'<div class="why">{escape(str(event["reason"]))}</div>')
    for err in event.get("errors") or []:
        body.append(f'<div class="why dim">error: {escape(str(err))}</div>')
    if event.get("status") in ("committed", "recovered", "compensated") and "result" in event:
        body.append(f'<div class="dim">result: <code>{escape(_json(event["result"]))}</code></div>')
    diff = event.get("diff") or {}
    if diff:
        rows = "".join(
            f"<tr><td>{escape(key)}</td><td class='before'>{escape(_json(c['before']))}</td>"
            f"<td class='after'>{escape(_json(c['after']))}</td></tr>"
            for key, c in diff.items()
        )
        body.append(
            '<table class="diff"><tr><th>resource</th><th>before</th><th>after</th></tr>'
            f"{rows}</table>"
        )
    cp = event.get("checkpoint")
    if cp:
        body.append(
            f'<div class="checkpoint dim">checkpoint {cp["step"]} · <code>{escape(cp["digest"])}'
            "</code></div>"
        )
    classes = f"event transaction {escape(status)}" + (" problem" if status in _PROBLEMS else "")
    return (
        f'<li class="{classes}" data-txn="{escape(str(event.get("txn_id")))}">{"".join(body)}</li>'
    )


def _other(event: dict[str, Any]) -> str:
    kind = str(event["kind"])
    head = (
        f'<span class="seq">{event["seq"]}</span>'
        f'<span class="dim">{escape(_when(event.get("ts")))}</span> <b>{escape(kind)}</b> '
    )
    problem = kind in ("escalation", "diverged", "rollback")
    if kind == "escalation":
        text = (
            f"{escape(str(event.get('action')))} ({escape(str(event.get('failure_class')))}): "
            f"{escape(str(event.get('reason')))} — <b>{escape(str(event.get('status')))}</b>"
        )
        if event.get("resolved_by"):
            text += (
                f" by {escape(str(event['resolved_by']))}: "
                f"{escape(str(event.get('resolution_reason') or ''))}"
            )
    elif kind == "start":
        text = (
            f"<details><summary>policy</summary><code>{escape(_json(event.get('policy')))}"
            "</code></details>"
        )
    elif kind == "recorded":
        text = (
            f"{escape(str(event.get('what')))} <code>{escape(_json(event.get('request')))}</code>"
        )
    else:
        rest = {k: v for k, v in event.items() if k not in ("seq", "ts", "kind", "txn_id")}
        text = f"<code>{escape(_json(rest))}</code>" if rest else ""
    classes = f"event {escape(kind)}" + (" problem" if problem else "")
    return f'<li class="{classes}">{head}{text}</li>'


def render_html(t: dict[str, Any]) -> str:
    """A self-contained HTML page showing one episode's timeline (from :func:`timeline`)."""
    verdict = t.get("verdict")
    if verdict:
        checks = ", ".join(
            f"{escape(str(c.get('name')))} {'ok' if c.get('passed') else 'failed'}"
            for c in verdict.get("checks", [])
        )
        verdict_html = (
            f'<p class="verdict {"pass" if verdict.get("passed") else "fail"}">verifier: '
            f"<b>{'passed' if verdict.get('passed') else 'failed'}</b> ({checks})"
            + (
                f"; partial credit {verdict['partial']:.2f}"
                if isinstance(verdict.get("partial"), int | float)
                else ""
            )
            + "</p>"
        )
    else:
        verdict_html = '<p class="verdict fail">no verdict recorded (the trial did not finish)</p>'
    items = "\n".join(
        _transaction(e) if e["kind"] == "transaction" else _other(e) for e in t["events"]
    )
    escalations = "".join(
        f"<li>{escape(e['id'])}: {escape(e['action'])} ({escape(e['failure_class'])}) "
        f"<b>{escape(e['status'])}</b>"
        + (
            f" by {escape(str(e['resolved_by']))}: {escape(str(e.get('resolution_reason') or ''))}"
            if e.get("resolved_by")
            else ""
        )
        + "</li>"
        for e in t.get("escalations") or []
    )
    title = f"episode {t['episode_id']}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)} · harness audit</title>
<style>{_CSS}</style></head>
<body>
<header>
<h1>{escape(title)}</h1>
<p class="meta">run {escape(str(t.get("run_id")))} · task {escape(str(t.get("task_id")))} ·
trial {escape(str(t.get("trial")))} · <b>{escape(str(t["status"]))}</b> ·
{t["steps"]} step(s) · final digest <code>{escape(t["digest"])}</code></p>
{verdict_html}
</header>
<nav><button data-show="all">all</button><button data-show="actions">actions</button><button
 data-show="problems">problems</button></nav>
<ol id="timeline">
{items}
</ol>
<section id="escalations"><h2>Escalations</h2><ul>{escalations or "<li>none</li>"}</ul></section>
<script>{_SCRIPT}</script>
</body></html>
"""

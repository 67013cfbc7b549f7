"""Timelines and verification results as text for a terminal (rich markup)."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

from rich.markup import escape

from ..store import TxnStatus
from ..store.verify import VerifyReport

__all__ = ["diff_lines", "render_text", "render_verify"]

_STATUS_STYLE: dict[str, str] = {
    TxnStatus.COMMITTED: "green",
    TxnStatus.RECOVERED: "cyan",
    TxnStatus.COMPENSATED: "yellow",
    TxnStatus.FAILED: "red",
    TxnStatus.ABANDONED: "magenta",
    TxnStatus.PRECONDITION: "yellow",
    TxnStatus.CHECK_ERROR: "red",
    TxnStatus.INVALID: "red",
    TxnStatus.IN_DOUBT: "magenta",
    TxnStatus.HELD: "yellow",
    "approved": "green",
    "edited": "green",
    "rejected": "red",
}


# Field changes shown per resource (the JSON and HTML timelines have them all).
_FIELDS_SHOWN = 8


def _short(value: Any, width: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= width else text[: width - 1] + "…"


def _when(ts: float | None) -> str:
    if ts is None:
        return ""
    return _dt.datetime.fromtimestamp(ts, tz=_dt.UTC).strftime("%H:%M:%S.%f")[:-3]


def diff_lines(diff: dict[str, Any] | None) -> list[str]:
    """A timeline's diff (``{resource: {"fields": [...]}}``) as plain lines, one a changed
    field, at most ``_FIELDS_SHOWN`` a resource."""
    lines: list[str] = []
    for key, change in (diff or {}).items():
        fields = change.get("fields") or [] if isinstance(change, dict) else []
        lines.extend(f"{key}{field}" for field in fields[:_FIELDS_SHOWN])
        if len(fields) > _FIELDS_SHOWN:
            lines.append(f"{key}: {len(fields) - _FIELDS_SHOWN} more field(s) (--json has all)")
    return lines


def _decision(decided: dict[str, Any]) -> str:
    """Where a held call's escalation stands, as a timeline says it."""
    if decided.get("status") == "pending":
        return f"[yellow]waiting for a person[/] (escalation {decided.get('escalation_id')})"
    if decided.get("status") == "missing":
        return "[red]held, its escalation missing[/]"
    said = f"{decided.get('status')} by {escape(str(decided.get('by')))}"
    if decided.get("reason"):
        said += f": {escape(str(decided['reason']))}"
    if decided.get("edit") is not None:
        said += f" (run as {escape(_short(decided['edit'], 80))})"
    return said


def _event_lines(event: dict[str, Any]) -> list[str]:
    kind = event["kind"]
    head = f"  {event['seq']:>4} {_when(event.get('ts'))} "
    if kind == "transaction":
        decided = event.get("decided")
        status = str(event.get("status"))
        if decided and decided.get("status") not in (None, "pending"):
            # A held call reads as what the person decided: rejected, approved or edited.
            status = str(decided["status"])
        style = _STATUS_STYLE.get(status, "white")
        args = escape(_short(event.get("arguments"), 80))
        line = f"{head}[bold]{escape(str(event.get('action')))}[/bold]({args}) [{style}]{status}[/]"
        if event.get("failure_class"):
            line += f" {event['failure_class']} → {event.get('decision')}"
        if event.get("attempts"):
            line += f", {event['attempts']} attempt(s)"
        if event.get("duration") is not None and not decided:
            line += f", {event['duration'] * 1000:.1f} ms"
        lines = [line]
        if decided:
            lines.append(f"         {_decision(decided)}")
        if event.get("reason"):
            lines.append(f"         why: {escape(_short(event['reason'], 160))}")
        for err in event.get("errors") or []:
            lines.append(f"         error: {escape(_short(err, 160))}")
        lines.extend(f"         Δ {escape(line)}" for line in diff_lines(event.get("diff")))
        cp = event.get("checkpoint")
        if cp:
            lines.append(f"         checkpoint {cp['step']}: {cp['digest'][:16]}")
        return lines
    if kind == "escalation":
        args = escape(_short(event.get("args"), 80))
        line = (
            f"{head}[bold yellow]escalated[/] {escape(str(event.get('action')))}({args}) "
            f"({event.get('failure_class')}) {event.get('escalation_id')}: "
            f"{escape(_short(event.get('reason'), 120))}"
        )
        return [line]
    if kind == "resolution":
        return [
            f"{head}[bold]resolution[/] {event.get('escalation_id')}: {event.get('decision')} by "
            f"{escape(str(event.get('by')))}: {escape(str(event.get('reason') or ''))}"
        ]
    if kind == "recorded":
        return [
            f"{head}[dim]recorded {event.get('what')}: {escape(_short(event.get('request')))}[/]"
        ]
    if kind == "retry":
        return [
            f"{head}[dim]retry attempt {event.get('attempt')} after {event.get('wait')} s: "
            f"{escape(str(event.get('reason') or ''))}[/]"
        ]
    if kind == "diverged":
        return [
            f"{head}[bold red]diverged[/] at step {event.get('step')}: "
            f"{escape(_short(event.get('expected')))} / {escape(_short(event.get('actual')))}"
        ]
    if kind == "start":
        return [f"{head}[dim]start[/]"]
    if kind == "end":
        return [f"{head}[dim]end: {event.get('outcome')}, {event.get('steps')} step(s)[/]"]
    rest = {k: v for k, v in event.items() if k not in ("seq", "ts", "kind", "txn_id")}
    detail = f" {escape(_short(rest, 120))}" if rest else ""
    return [f"{head}[dim]{kind}{detail}[/]"]


def render_text(timelines: list[dict[str, Any]]) -> str:
    """Timelines as rich-markup text, one block per episode."""
    out: list[str] = []
    for t in timelines:
        verdict = t.get("verdict")
        passed = t.get("passed")
        mark = "" if passed is None else (" [green]passed[/]" if passed else " [red]failed[/]")
        out.append(
            f"[bold]episode {escape(t['episode_id'])}[/] task {escape(str(t.get('task_id')))} "
            f"trial {t.get('trial')}: {t['status']}{mark}, {t['steps']} step(s), digest "
            f"{t['digest'][:16]}"
        )
        if t.get("infra_cause"):
            out.append(
                "  [bold red]infrastructure failure[/] (not the agent's): "
                f"{escape(str(t['infra_cause']))}"
            )
        for event in t["events"]:
            out.extend(_event_lines(event))
        for esc in t.get("escalations") or []:
            who = (
                f"{esc['status']} by {escape(str(esc['resolved_by']))}: "
                f"{escape(str(esc.get('resolution_reason') or ''))}"
                if esc["resolved_by"]
                else esc["status"]
            )
            call = f"{escape(str(esc['action']))}({escape(_short(esc.get('args'), 80))})"
            out.append(f"  escalation {esc['id']} {call}: {who}")
            out.extend(f"         Δ {escape(line)}" for line in diff_lines(esc.get("diff")))
        if verdict:
            checks = ", ".join(
                f"{c.get('name')} {'ok' if c.get('passed') else 'FAILED'}"
                for c in verdict.get("checks", [])
            )
            out.append(f"  verifier: {'passed' if verdict.get('passed') else 'failed'} ({checks})")
            for c in verdict.get("checks", []):
                if not c.get("passed") and c.get("compared"):
                    shown = escape(_short(c["compared"], 160))
                    out.append(f"    {escape(str(c.get('name')))}: {shown}")
        if t.get("recorded"):
            out.append(
                "  recorded for replay: "
                + ", ".join(f"{n} {k}" for k, n in sorted(t["recorded"].items()))
            )
        out.append("")
    return "\n".join(out)


def render_verify(report: VerifyReport) -> str:
    """A verification result as rich-markup text."""
    checked = (
        f"{report.episodes} episode(s), {report.records} log records, {report.transactions} "
        f"transactions, {report.checkpoints} checkpoints, {report.escalations} escalations"
    )
    if report.signed_by is not None:
        checked += f"; signatures of key {report.signed_by}"
    if report.ok:
        signed = "" if report.signed_by is None else ", signatures hold"
        said = f"[green]verified[/]: {checked}; hash chains, digests and rows agree{signed}"
        if report.unchecked_signatures:
            said += (
                f"\n[yellow]signatures not checked[/]: signed with key "
                f"{', '.join(report.signers)}; give its public key (--public-key) to check them "
                "(without it, a rewrite with recomputed hashes is not found)"
            )
        return said
    lines = [f"[red]NOT VERIFIED[/]: checked {checked}"]
    lines.extend(f"  {escape(str(f))}" for f in report.findings)
    return "\n".join(lines)

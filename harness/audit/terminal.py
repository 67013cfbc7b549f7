"""Timelines and verification results as text for a terminal (rich markup)."""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any

from rich.markup import escape

from ..store import TxnStatus
from ..store.verify import VerifyReport

__all__ = ["diff_lines", "render_text", "render_verify", "unverified_note"]

# What marks an item verification found wrong, at the start of its line.
MARK = "[bold red]✗[/]"

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


def _finding_lines(item: dict[str, Any], indent: str = "         ") -> list[str]:
    """What verification found wrong in a marked item, a line a finding."""
    return [f"{indent}{MARK} [red]not verified[/]: {escape(_found(f))}" for f in item["findings"]]


def _found(f: dict[str, Any]) -> str:
    """A finding as a timeline says it (the episode is the timeline's own)."""
    proof = f" (log record {f['log_seq']})" if f.get("log_seq") is not None else ""
    return f"{f['table']} {f['record']}{proof}: {f['reason']}"


def _event_lines(event: dict[str, Any]) -> list[str]:
    lines = _event_text(event)
    if event.get("verified") is False:
        lines[1:1] = _finding_lines(event)
        lines[0] = MARK + lines[0][1:]
    return lines


def _event_text(event: dict[str, Any]) -> list[str]:
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
    """Timelines as rich-markup text, one block per episode; what verification found wrong
    (:func:`~harness.audit.model.mark`) marked with ✗ on the item's line, the finding under it."""
    out: list[str] = []
    for t in timelines:
        verdict = t.get("verdict")
        passed = t.get("passed")
        mark = "" if passed is None else (" [green]passed[/]" if passed else " [red]failed[/]")
        unverified = t.get("verified") is False
        out.append(
            f"{MARK + ' ' if unverified else ''}[bold]episode {escape(t['episode_id'])}[/] task "
            f"{escape(str(t.get('task_id')))} trial {t.get('trial')}: {t['status']}{mark}, "
            f"{t['steps']} step(s), digest {t['digest'][:16]}"
            + (" [bold red]NOT VERIFIED[/]" if unverified else "")
        )
        # (the trial's row is the pass or fail above and the verifier's line below)
        named = [f for f in t.get("findings") or [] if f.get("marked") in ("episode", "verdict")]
        out.extend(_finding_lines({"findings": named}, "  "))
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
            edited = esc.get("verified") is False
            out.append(f"{MARK if edited else ' '} escalation {esc['id']} {call}: {who}")
            out.extend(f"         Δ {escape(line)}" for line in diff_lines(esc.get("diff")))
            if edited:
                out.extend(_finding_lines(esc))
        if verdict:
            checks = ", ".join(
                f"{c.get('name')} {'ok' if c.get('passed') else 'FAILED'}"
                for c in verdict.get("checks", [])
            )
            said = "passed" if verdict.get("passed") else "failed"
            out.append(
                f"{MARK if t.get('verdict_verified') is False else ' '} verifier: {said} ({checks})"
            )
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


def unverified_note(target: str) -> str:
    """What an audit of a record that fails verification says under the findings (rich
    markup): the record was edited, where the timeline marks it, and what that vouches for."""
    return (
        f"[bold red]The record in {escape(target)} was edited after it was written[/]: the "
        f"timelines show it as it is now, {MARK} on each record named above. Verification "
        "names the first problem of each episode, so nothing else in a marked episode is "
        "vouched for either."
    )

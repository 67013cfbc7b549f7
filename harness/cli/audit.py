"""The commands over a run's record: ``harness audit`` and ``harness escalations``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.markup import escape
from rich.table import Table

from ..audit.html import render_html
from ..audit.model import episode_summaries, escalation_view, pending_escalations, timeline
from ..audit.terminal import diff_lines, render_text, render_verify, unverified_note
from ..errors import HarnessError, RunNotFound
from ..policy import FailureClass
from ..runs.layout import OpenStore, open_store, store_url
from ..runs.output import write_output
from ..store import (
    EpisodeRow,
    PublicKey,
    Store,
    VerifyReport,
    WitnessReport,
    check_witness,
)
from ..store.verify import verify_run
from ._common import (
    console,
    dump,
    fail,
    judged,
    signing_key,
    signing_key_option,
    verify_options,
    what_is_left,
)

__all__ = ["audit_command", "escalations_command", "verify_command"]

_TARGET_HELP = (
    "TARGET is a run folder (logs/<run>), a store file (logs/harness.db, as hx.Episode writes "
    "it) or a database URL (sqlite:///..., postgresql://...)."
)

_AUDIT_EPILOG = (
    f"{_TARGET_HELP} Exit status: 0; 1 when the record fails verification (not with "
    "--allow-unverified); 2 for a usage or harness error."
)

_public_key_option = click.option(
    "--public-key",
    "public_key",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Also check the signatures with this public key (harness keygen).",
)


def _verify(
    opened: OpenStore,
    episodes: list[EpisodeRow] | None,
    public_key: Path | None,
    as_json: bool,
    witness: Path | None = None,
) -> None:
    """Verify the whole target (``episodes`` None) or these episodes, and against ``witness``
    when given; print; exit 0 or 1."""
    key = None if public_key is None else PublicKey.load(public_key)
    witnessed = None
    with opened.store.snapshot():  # (the record and the witness compared on one state of it)
        report = _check(opened, episodes, key)
        if witness is not None:
            witnessed = check_witness(opened.store, witness, public_key=key, run_id=opened.run_id)
            report.findings.extend(witnessed.findings)
    _print(report, witnessed, as_json, "run" if opened.run_id else "store")


def _check(
    opened: OpenStore, episodes: list[EpisodeRow] | None, key: PublicKey | None
) -> VerifyReport:
    """The verification of the whole target (``episodes`` None) or of these episodes."""
    if episodes is None:
        return opened.store.verify(opened.run_id, public_key=key)
    return verify_run(opened.store, episodes, public_key=key)


def _print(
    report: VerifyReport, witnessed: WitnessReport | None, as_json: bool, what: str
) -> NoReturn:
    """Print a verification (and what the witness found); exit 0, or 1 on a finding."""
    if as_json:
        data = report.to_dict()
        if witnessed is not None:
            data["witness"] = witnessed.to_dict()
        dump(data)
    else:
        console.print(render_verify(report))
        if witnessed is not None:
            console.print(_witness_text(witnessed, what))
    sys.exit(0 if report.ok else 1)


def _witness_text(witnessed: WitnessReport, what: str) -> str:
    said = (
        f"witness {escape(str(witnessed.path))}: {witnessed.checked} of its {witnessed.lines} "
        f"line(s) are about this {what}"
    )
    if witnessed.signed_by is not None:
        said += f", their signatures checked with key {witnessed.signed_by}"
    elif witnessed.lines:
        said += (
            "; [yellow]their signatures not checked[/]: give the public key (--public-key) to "
            "find a line edited"
        )
    if not witnessed.checked and witnessed.elsewhere:
        shown = ", ".join(escape(s) for s in witnessed.elsewhere[:3])
        more = len(witnessed.elsewhere) - 3
        said += (
            f"\n[yellow]the witness saw nothing signed in this {what}[/]: its lines are about "
            f"{shown}{f' and {more} more' if more > 0 else ''}"
        )
    return said


def _verify_lost_run(
    folder: Path, lost: RunNotFound, public_key: Path | None, witness: Path, as_json: bool
) -> None:
    """A run folder whose store no longer holds its run: what the witness saw of the run is
    all there is to check (none: the run folder's error stands)."""
    key = None if public_key is None else PublicKey.load(public_key)
    with open_store(store_url(folder)) as opened:
        witnessed = check_witness(opened.store, witness, public_key=key, run_id=folder.name)
    if not witnessed.checked:
        raise lost
    report = VerifyReport(findings=list(witnessed.findings))
    if not as_json:
        console.print(f"{escape(str(lost))}; the witness saw run {escape(folder.name)} signed")
    _print(report, witnessed, as_json, "run")


@click.command("verify")
@click.argument("target")
@_public_key_option
@click.option(
    "--witness",
    "witness",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="Also check TARGET against this witness file (harness run --witness FILE): every "
    "run and episode it saw signed there must still be there, with every head it saw.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def verify_command(
    target: str, public_key: Path | None, witness: Path | None, as_json: bool
) -> None:
    """Prove TARGET's record was not edited, or name the first edit (exit 1).

    Recomputes every hash chain and checkpoint digest, cross-checks every row against the log
    records that wrote it, and with --public-key checks every signed episode head and run
    manifest. Same as `harness audit TARGET --verify`; `harness audit TARGET` shows the
    record too, marking what fails.

    With --witness FILE (the file `harness run --signing-key KEY --witness FILE` appended each
    signature to, outside the store), also names each run or episode the witness saw signed
    in TARGET's store that is missing from it (deleted, or the store rolled back to before
    it), whose chain no longer holds a head the witness saw (rewritten, rolled back), or whose
    signature is gone. With --public-key, a witness line whose signature does not hold is
    named by its line number (the witness file was edited). The witness matches lines to
    TARGET by its store's URL (a SQLite file by its absolute path; a run folder by its run).

    \b
    TARGET is a run folder (logs/<run>), a store file (logs/harness.db, as hx.Episode writes
    it) or a database URL (sqlite:///..., postgresql://...).
    """
    try:
        try:
            with open_store(target) as opened:
                _verify(opened, None, public_key, as_json, witness)
        except RunNotFound as lost:
            if witness is None or not Path(target).is_dir():
                raise
            _verify_lost_run(Path(target), lost, public_key, witness, as_json)
    except HarnessError as exc:
        fail(exc)


@click.command("audit", epilog=_AUDIT_EPILOG)
@click.argument("target")
@click.option("--episode", default=None, help="Only this episode.")
@click.option("--task", default=None, help="Only episodes of this task.")
@click.option(
    "--failure-class",
    default=None,
    type=click.Choice([str(f) for f in FailureClass]),
    help="Only episodes with a transaction of this failure class.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--verify",
    is_flag=True,
    help="Show only the verification (as `harness verify` does), not the timelines.",
)
@_public_key_option
@click.option(
    "--allow-unverified",
    is_flag=True,
    help="Exit 0 when the record fails verification; what fails is still marked.",
)
@click.option(
    "--html",
    "html_file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one episode's timeline as a self-contained HTML page.",
)
def audit_command(
    target: str,
    episode: str | None,
    task: str | None,
    failure_class: str | None,
    as_json: bool,
    verify: bool,
    public_key: Path | None,
    allow_unverified: bool,
    html_file: Path | None,
) -> None:
    """Show what happened in TARGET, episode by episode (actions, diffs, verdicts, escalations).

    What is shown is verified first, as `harness verify` does (with --public-key, the
    signatures too), and a line says so. A record edited after it was written is still shown,
    as it is now, never as fact: the findings are named first, the timeline marks each with ✗
    where it appears (the call, the trial's verdict, the checkpoint's transaction, the
    escalation, the episode), --json gives "verified": false and the findings on each, and so
    does the HTML page; the command exits 1 (0 with --allow-unverified).
    """
    if verify and allow_unverified:
        raise click.UsageError(
            "--verify exits as `harness verify` does; --allow-unverified goes with the timelines"
        )
    try:
        key = None if public_key is None else PublicKey.load(public_key)
        # (the record shown is the record verified: one state of the store)
        with open_store(target) as opened, opened.store.snapshot():
            episodes = episode_summaries(
                opened, episode=episode, task=task, failure_class=failure_class
            )
            whole = episode is None and task is None and failure_class is None
            if verify:
                _verify(opened, None if whole else episodes, public_key, as_json)
            if html_file is not None and len(episodes) != 1:
                raise click.UsageError(
                    f"--html shows one episode and the filters match {len(episodes)}: "
                    "name it with --episode ID"
                )
            report = _check(opened, None if whole else episodes, key)
            trials = {t.episode_id: t for t in opened.store.trial_rows(opened.run_id)}
            timelines = [
                timeline(opened.store, e, trials.get(e.id), report.findings) for e in episodes
            ]
            where, run_id = opened.where, opened.run_id
        if html_file is not None:
            write_output(html_file, render_html(timelines[0], verification=report))
    except HarnessError as exc:
        fail(exc)
    if html_file is not None:
        _say_verification(report, where)
        click.echo(f"wrote {html_file}")
    elif as_json:
        dump(
            {
                "run_id": run_id,
                "target": where,
                "verification": report.to_dict(),
                "episodes": timelines,
            }
        )
    else:
        _say_verification(report, where)
        console.print(render_text(timelines) if timelines else "no episode matches")
        if not report.ok:
            console.print(
                f"[bold red]NOT VERIFIED[/]: {len(report.findings)} problem(s) in "
                f"{escape(where)}, named at the top and marked ✗ where they appear"
            )
    sys.exit(0 if report.ok or allow_unverified else 1)


def _say_verification(report: VerifyReport, where: str) -> None:
    """What the verification of an audit found, said before what it shows."""
    console.print(render_verify(report))
    if not report.ok:
        console.print(unverified_note(where))


@click.command("escalations", epilog=_TARGET_HELP)
@click.argument("target")
@click.argument("resolve", required=False, type=click.Choice(["resolve"]))
@click.argument("escalation_id", required=False)
@click.option("--approve", "decision", flag_value="approve", help="Run the action as proposed.")
@click.option("--reject", "decision", flag_value="reject", help="Do not run it; the agent is told.")
@click.option("--edit", "edit_json", default=None, help="Run it with these arguments (JSON).")
@click.option("--by", default=None, help="Who decides (with resolve).")
@click.option("--reason", default="", help="Why (with resolve).")
@click.option("--all", "every", is_flag=True, help="List resolved ones too.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@signing_key_option("the episode's new head, with resolve (the decision is appended to its log)")
@verify_options
def escalations_command(
    target: str,
    resolve: str | None,
    escalation_id: str | None,
    decision: str | None,
    edit_json: str | None,
    by: str | None,
    reason: str,
    every: bool,
    as_json: bool,
    signing_key_file: str | None,
    public_key: str | None,
    allow_unverified: bool,
) -> None:
    """List TARGET's escalations waiting for a person, or record a decision on one.

    \b
    harness escalations TARGET [--all] [--json]
    harness escalations TARGET resolve ID --approve|--reject|--edit JSON --by NAME --reason TEXT

    Each shows the call to decide on (the action and its arguments), why it was escalated,
    and what the call changed. TARGET's record is verified first, as `harness verify` does
    (with --public-key, its signatures too): an edited record is refused (exit 2), so what
    you approve is what the agent asked for.

    After a decision, `harness resume RUN` continues a run's episode from where it stopped
    (an episode of your own code continues with hx.Episode(..., episode_id=ID, resume=True)).
    """
    checked_with = None if public_key is None else PublicKey.load(public_key)
    if resolve is None:
        if decision or edit_json or by:
            raise click.UsageError("--approve, --reject, --edit and --by go with `resolve ID`")
        _list_escalations(
            target, every=every, as_json=as_json, key=checked_with, allow=allow_unverified
        )
        return
    if escalation_id is None:
        raise click.UsageError("name the escalation: resolve ID (`harness escalations RUN`)")
    edit: dict[str, Any] | None = None
    if edit_json is not None:
        if decision is not None:
            raise click.UsageError("give one of --approve, --reject or --edit JSON")
        try:
            edit = json.loads(edit_json)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON ({exc})", param_hint="--edit") from None
        if not isinstance(edit, dict):
            raise click.BadParameter("give the arguments as a JSON object", param_hint="--edit")
        decision = "edit"
    if decision is None:
        raise click.UsageError("give one of --approve, --reject or --edit JSON")
    if not by:
        raise click.UsageError("say who decides with --by NAME")
    try:
        # Look read-only (verified first); open the store for writing only to record the
        # decision.
        with open_store(target) as opened:
            ids = {
                e["id"] for e in _verified_escalations(opened, checked_with, allow_unverified, True)
            }
            if escalation_id not in ids:
                within = f"run {opened.run_id}" if opened.run_id else target
                raise HarnessError(
                    f"no escalation {escalation_id!r} in {within}; "
                    f"`harness escalations {target} --all` lists them; nothing was changed"
                )
            url, in_run = opened.url, opened.run_id is not None
        key = signing_key(signing_key_file)
        store = Store(url)
        try:
            row = store.resolve(
                escalation_id, decision, by=by, reason=reason, edit=edit, signing_key=key
            )
        finally:
            store.close()
    except HarnessError as exc:
        fail(exc)
    if as_json:
        dump(row.model_dump())
        return
    how = (
        f"`{what_is_left(target)[0]}`"
        if in_run
        else f"hx.Episode(..., episode_id={row.episode_id!r}, resume=True)"
    )
    console.print(
        f"escalation {row.id} {row.status} by {escape(str(row.resolved_by))}; the episode "
        f"{row.episode_id} continues from where it stopped with {escape(how)}"
    )


def _verified_escalations(
    opened: OpenStore, key: PublicKey | None, allow: bool, every: bool
) -> list[dict[str, Any]]:
    """The escalations of ``opened`` as :func:`escalation_view` shows them, read on the one
    state of the store its verification checked; a record that fails is refused (exit 2)
    unless ``allow``."""
    with opened.store.snapshot():
        report = opened.store.verify(opened.run_id, public_key=key)
        views = [escalation_view(r) for r in pending_escalations(opened, every=every)]
    judged(opened.where, report, allow=allow)
    return views


def _list_escalations(
    target: str, *, every: bool, as_json: bool, key: PublicKey | None, allow: bool
) -> None:
    try:
        with open_store(target) as opened:
            views = _verified_escalations(opened, key, allow, every)
    except HarnessError as exc:
        fail(exc)
    if as_json:
        dump(views)
        return
    if not views:
        click.echo("no escalations" + ("" if every else " waiting"))
        return
    waiting = sum(v["status"] == "pending" for v in views)
    console.print(
        f"[bold]{len(views)} escalation(s) in {escape(target)}[/], {waiting} waiting for a person"
    )
    for v in views:
        console.print(_escalation_block(v, target))


def _escalation_block(v: dict[str, Any], target: str) -> Table:
    """One escalation as the person deciding it reads it: the call, why, what it changed,
    where it stands and the command that decides it."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim", no_wrap=True)
    grid.add_column(overflow="fold")
    status = v["status"] if not v["resolved_by"] else f"{v['status']} by {v['resolved_by']}"
    if v["resolution_reason"]:
        status += f": {v['resolution_reason']}"
    grid.add_row("", f"[bold]escalation {v['id']}[/] · episode {escape(str(v['episode_id']))}")
    grid.add_row("call", f"[bold]{escape(str(v['action']))}[/]({escape(_json_text(v['args']))})")
    grid.add_row("why", f"{v['failure_class']}: {escape(str(v['reason']))}")
    changed = diff_lines(v["diff"])
    if changed:
        grid.add_row("changed", "\n".join(escape(line) for line in changed))
    elif v["failure_class"] == "approval":
        grid.add_row("changed", "nothing: held before it ran")
    else:
        grid.add_row("changed", "nothing")
    errors = v["evidence"].get("errors") if isinstance(v["evidence"], dict) else None
    for err in errors or []:
        grid.add_row("error", escape(str(err)))
    if v["edit"] is not None:
        grid.add_row("run as", escape(_json_text(v["edit"])))
    grid.add_row("status", escape(status))
    if v["status"] == "pending":
        if v["deadline"] is not None:
            grid.add_row("deadline", f"{_utc(v['deadline'])}, then {v['fallback']}")
        grid.add_row(
            "decide",
            escape(
                f"harness escalations {target} resolve {v['id']} --approve|--reject|--edit "
                "JSON --by NAME --reason TEXT"
            ),
        )
    grid.add_row("", "")
    return grid


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _utc(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(ts))

"""The commands over a run's record: ``harness audit`` and ``harness escalations``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from ..audit.html import render_html
from ..audit.model import episode_summaries, pending_escalations, timeline
from ..audit.terminal import render_text, render_verify
from ..errors import HarnessError
from ..policy import FailureClass
from ..runs.layout import open_run
from ..runs.output import write_output
from ..store import PublicKey, Store
from ..store.verify import verify_run
from ._common import console, dump, fail

__all__ = ["audit_command", "escalations_command"]


@click.command("audit")
@click.argument("run", type=click.Path(path_type=Path))
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
    help="Recompute hash chains and checkpoint digests, cross-check every row with the log.",
)
@click.option(
    "--public-key",
    "public_key",
    default=None,
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="With --verify: also check the run's signatures with this key (harness keygen).",
)
@click.option(
    "--html",
    "html_file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write one episode's timeline as a self-contained HTML page.",
)
def audit_command(
    run: Path,
    episode: str | None,
    task: str | None,
    failure_class: str | None,
    as_json: bool,
    verify: bool,
    public_key: Path | None,
    html_file: Path | None,
) -> None:
    """Show what happened in RUN, episode by episode (actions, diffs, verdicts, escalations)."""
    try:
        with open_run(run) as opened:
            episodes = episode_summaries(
                opened, episode=episode, task=task, failure_class=failure_class
            )
            trials = {t.episode_id: t for t in opened.store.trials(opened.run.id)}
            if verify:
                whole = episode is None and task is None and failure_class is None
                report = verify_run(
                    opened.store,
                    episodes,
                    public_key=None if public_key is None else PublicKey.load(public_key),
                    run_id=opened.run.id if whole else None,
                )
                if as_json:
                    dump(report.to_dict())
                else:
                    console.print(render_verify(report))
                sys.exit(0 if report.ok else 1)
            if html_file is not None:
                if len(episodes) != 1:
                    raise click.UsageError(
                        f"--html shows one episode and the filters match {len(episodes)}: "
                        "name it with --episode ID"
                    )
                (ep,) = episodes
                write_output(html_file, render_html(timeline(opened.store, ep, trials.get(ep.id))))
                click.echo(f"wrote {html_file}")
                return
            timelines = [timeline(opened.store, e, trials.get(e.id)) for e in episodes]
            if as_json:
                dump({"run_id": opened.run.id, "folder": str(opened.folder), "episodes": timelines})
            elif not timelines:
                click.echo("no episode matches")
            else:
                console.print(render_text(timelines))
    except HarnessError as exc:
        fail(exc)


@click.command("escalations")
@click.argument("run", type=click.Path(path_type=Path))
@click.argument("resolve", required=False, type=click.Choice(["resolve"]))
@click.argument("escalation_id", required=False)
@click.option("--approve", "decision", flag_value="approve", help="Run the action as proposed.")
@click.option("--reject", "decision", flag_value="reject", help="Do not run it; the agent is told.")
@click.option("--edit", "edit_json", default=None, help="Run it with these arguments (JSON).")
@click.option("--by", default=None, help="Who decides (with resolve).")
@click.option("--reason", default="", help="Why (with resolve).")
@click.option("--all", "every", is_flag=True, help="List resolved ones too.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def escalations_command(
    run: Path,
    resolve: str | None,
    escalation_id: str | None,
    decision: str | None,
    edit_json: str | None,
    by: str | None,
    reason: str,
    every: bool,
    as_json: bool,
) -> None:
    """List RUN's escalations waiting for a person, or record a decision on one.

    \b
    harness escalations RUN [--all] [--json]
    harness escalations RUN resolve ID --approve|--reject|--edit JSON --by NAME --reason TEXT

    After a decision, `harness resume RUN` continues the episode from where it stopped.
    """
    if resolve is None:
        if decision or edit_json or by:
            raise click.UsageError("--approve, --reject, --edit and --by go with `resolve ID`")
        _list_escalations(run, every=every, as_json=as_json)
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
        # Look read-only; open the store for writing only to record the decision.
        with open_run(run) as opened:
            ids = {e.id for e in pending_escalations(opened, every=True)}
            if escalation_id not in ids:
                raise HarnessError(
                    f"no escalation {escalation_id!r} in run {opened.run.id}; "
                    f"`harness escalations {run} --all` lists them; nothing was changed"
                )
            db = opened.db
        store = Store(db)
        try:
            row = store.resolve(escalation_id, decision, by=by, reason=reason, edit=edit)
        finally:
            store.close()
    except HarnessError as exc:
        fail(exc)
    if as_json:
        dump(row.model_dump())
        return
    console.print(
        f"escalation {row.id} {row.status} by {escape(str(row.resolved_by))}; the episode "
        f"{row.episode_id} continues from where it stopped with `harness resume {run}`"
    )


def _list_escalations(run: Path, *, every: bool, as_json: bool) -> None:
    try:
        with open_run(run) as opened:
            rows = pending_escalations(opened, every=every)
    except HarnessError as exc:
        fail(exc)
    if as_json:
        dump([r.model_dump() for r in rows])
        return
    if not rows:
        click.echo("no escalations" + ("" if every else " waiting"))
        return
    table = Table(title=f"escalations in {run}")
    for col in ("id", "episode", "action", "class", "reason", "status"):
        table.add_column(col)
    for r in rows:
        status = r.status if not r.resolved_by else f"{r.status} by {r.resolved_by}"
        table.add_row(r.id, r.episode_id, r.action, r.failure_class, r.reason, status)
    console.print(table)

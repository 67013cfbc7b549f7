"""``harness state uninstall``: take the harness's change capture out of an application's
database by hand (what a process killed with its adapter open leaves behind)."""

from __future__ import annotations

import click
from rich.markup import escape

from ..errors import HarnessError
from ..state import SQLState
from ._common import console, dump, fail

__all__ = ["state_group"]


@click.group("state")
def state_group() -> None:
    """The harness's objects in your application's database."""


@state_group.command("uninstall")
@click.argument("database")
@click.option("--json", "as_json", is_flag=True, help="Print what was removed as JSON.")
def uninstall_command(database: str, as_json: bool) -> None:
    """Remove the change-capture triggers and `_hx_` tables hx.SQLState put in DATABASE.

    DATABASE is a SQLite file or sqlite:/// URL, or a postgresql:// URL (its current schema).
    An adapter removes them when it closes; a process killed with one open leaves them until
    the next adapter opens the database, recording your application's writes meanwhile (once
    per row, and on SQLite only for the 10 minutes of the dead window's lease). Refused while
    an adapter is open on the database: its tools' writes would fail without them.
    """
    try:
        removed = SQLState.uninstall(database)
    except HarnessError as exc:
        fail(exc)
    if as_json:
        dump({"database": database, "removed": removed})
    elif removed:
        console.print(f"removed from {escape(database)}: {escape(', '.join(removed))}")
    else:
        console.print(f"nothing to remove: {escape(database)} holds no change capture of harness")

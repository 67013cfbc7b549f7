"""``harness new-suite NAME``: a working skeleton of a suite, to edit into one's own.

The folder it writes passes ``harness run FOLDER --agent scripted --trials 1`` as it is: a
``suite.json`` manifest, a ``tasks.json`` with two tasks, an ``environment.py`` (imported from
the suite's own folder, no PYTHONPATH needed) with one read and one action that has a
precondition, a postcondition and a compensation, and a ``README.md`` saying how to run it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import click

from ._common import console

__all__ = ["new_suite_command", "write_skeleton"]

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

ENVIRONMENT = '''\
"""The suite's environment: a small inventory, one fresh and isolated copy per trial.

Replace the data and the tools with your domain's. The harness builds InventoryEnvironment()
for every trial: `state` is what it snapshots, diffs and verifies (a DictState here; SQLState
and FileState work the same), `tools` is what the agent may call: actions for writes (each call
one transaction), plain functions for reads.
"""

from __future__ import annotations

from typing import Any

import harness as hx

STOCK = {"apple": 5, "pear": 2}


class InventoryEnvironment:
    """Items `items/<name>` with a stock count; one write tool and one read tool."""

    # Every tool name: the suite loader rejects a task whose reference actions name another.
    TOOL_NAMES = frozenset({"get_item", "receive_delivery"})

    def __init__(self) -> None:
        self.state = hx.DictState({f"items/{n}": {"stock": s} for n, s in STOCK.items()})
        state = self.state

        # writes: the resources the action may change (anything else is a scope failure);
        # idempotency_key: the same delivery is never added twice, even across a crash.
        @hx.action(writes=["items/{item}"], idempotency_key=lambda a: a.delivery_id)
        def receive_delivery(delivery_id: str, item: str, amount: int) -> dict[str, Any]:
            """Add delivery `delivery_id` of `amount` units of `item` to the item's stock."""
            record = dict(state[f"items/{item}"])
            record["stock"] += amount
            state[f"items/{item}"] = record
            return record

        @receive_delivery.precondition
        def known_item_and_positive_amount(ctx: hx.Context) -> bool:
            # Checked against the live state before anything runs; false: nothing runs and
            # the agent is told why.
            return ctx.state.get(f"items/{ctx.args.item}") is not None and ctx.args.amount > 0

        @receive_delivery.postcondition
        def stock_went_up(ctx: hx.Context) -> bool:
            # Checked against the state after the call, never against what the tool returned.
            key = f"items/{ctx.args.item}"
            return bool(ctx.after[key]["stock"] == ctx.before[key]["stock"] + ctx.args.amount)

        @receive_delivery.compensation
        def take_it_back(ctx: hx.Context) -> None:
            # Undo: put back what the action's scope held before it ran.
            for key, value in ctx.before.items():
                state[key] = value

        def get_item(item: str) -> Any:
            """The stock record of `item` (null: no such item)."""
            return state.get(f"items/{item}")

        self.tools: dict[str, Any] = {"get_item": get_item, "receive_delivery": receive_delivery}

    def export(self) -> dict[str, Any]:
        """The inventory as plain JSON."""
        return self.state.to_dict()

    def close(self) -> None:
        """Nothing to release: the state lives in memory."""
'''

TASKS: dict[str, Any] = {
    "format": "harness.tasks",
    "version": 1,
    "tasks": [
        {
            "id": "apple-delivery",
            "version": "1",
            "instruction": "Delivery d-100 brought 3 apples. Add it to the stock.",
            "reference_actions": [
                {
                    "name": "receive_delivery",
                    "arguments": {"delivery_id": "d-100", "item": "apple", "amount": 3},
                }
            ],
            "checks": [{"key": "items/apple", "path": ["stock"], "equals": 8}],
        },
        {
            "id": "pear-delivery",
            "version": "1",
            "instruction": "Check the pear stock, then add delivery d-200 of 4 pears to it.",
            "reference_actions": [
                {"name": "get_item", "arguments": {"item": "pear"}},
                {
                    "name": "receive_delivery",
                    "arguments": {"delivery_id": "d-200", "item": "pear", "amount": 4},
                },
            ],
            "checks": [{"key": "items/pear", "path": ["stock"], "equals": 6}],
        },
    ],
}

README = """\
# {name}

A harness suite: `suite.json` names the environment (`environment.py`, in this folder) and the
task file (`tasks.json`). From the folder above this one, run it with
`harness run {name} --agent scripted --trials 1`, then edit the environment and the tasks into
your own (`harness run --help` for more).
"""


def write_skeleton(folder: Path, name: str) -> list[Path]:
    """Write a skeleton suite named ``name`` into the new folder ``folder``; the files written.

    Raises:
        FileExistsError: ``folder`` exists (nothing is written).
    """
    folder.mkdir()  # (claims the folder: fails if it exists, even empty)
    files = {
        "suite.json": json.dumps(
            {
                "name": name,
                "version": "1",
                "description": "A skeleton suite: a small inventory and two deliveries.",
                "environment": "environment:InventoryEnvironment",
                "tasks": ["tasks.json"],
            },
            indent=2,
        )
        + "\n",
        "tasks.json": json.dumps(TASKS, indent=2) + "\n",
        "environment.py": ENVIRONMENT,
        "README.md": README.format(name=name),
    }
    try:
        for file, text in files.items():
            (folder / file).write_text(text, encoding="utf-8")
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return [folder / file for file in files]


@click.command("new-suite")
@click.argument("name")
@click.option(
    "--dir",
    "parent",
    default=".",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="The folder to create the suite's folder in.",
)
def new_suite_command(name: str, parent: Path) -> None:
    """Write a working skeleton suite in a new folder NAME: suite.json, tasks.json with two
    tasks, environment.py with one action (precondition, postcondition, compensation) and a
    README; `harness run NAME --agent scripted --trials 1` passes as it is."""
    if not NAME.match(name):
        raise click.BadParameter(
            f"{name!r} is not a suite name: use letters, digits, '-', '_' and '.', starting "
            "with a letter or digit (e.g. my-suite)",
            param_hint="NAME",
        )
    folder = parent / name
    if folder.exists() or folder.is_symlink():
        raise click.BadParameter(
            f"{folder} exists; new-suite never overwrites: choose another NAME or --dir, or "
            "remove the folder",
            param_hint="NAME",
        )
    try:
        parent.mkdir(parents=True, exist_ok=True)
        written = write_skeleton(folder, name)
    except OSError as exc:
        raise click.ClickException(f"cannot write the suite into {folder}: {exc}") from None
    console.print(f"created suite [bold]{name}[/] in {folder}:")
    for path in written:
        console.print(f"  {path}")
    console.print(f"run it: harness run {folder} --agent scripted --trials 1")

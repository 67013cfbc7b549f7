"""``RetailEnvironment``: one isolated retail database with its tools, for one trial.

It copies the template database (:func:`~harness.domains.retail.db.fresh_copy`) into a folder
of its own (a new temporary one unless given), opens it as an :class:`hx.SQLState`, and builds
the tools over that adapter's connection: actions for the seven write tools
(:func:`~harness.domains.retail.actions.build_actions`), plain methods for the reads,
``calculate`` and ``transfer_to_human_agents``.

One connection, shared: the tools write through the adapter's own ``sqlite3`` connection
(autocommit mode, ``isolation_level=None``). Each write tool runs in one ``BEGIN IMMEDIATE``
transaction on it, and the adapter's change-capture triggers fire inside that same transaction,
so a tool that fails rolls back its rows *and* their capture records together: the harness sees
exactly the committed changes, with no window in which another connection's uncommitted or
not-yet-visible writes could be missed or misattributed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from importlib import resources
from typing import Any

import harness as hx
from harness.domains.base import FolderEnvironment
from harness.domains.retail import db
from harness.domains.retail.actions import build_actions
from harness.domains.retail.db import Record
from harness.domains.retail.tools import TOOL_TYPES, RetailTools

__all__ = ["POLICY", "RetailEnvironment"]

POLICY: str = (
    resources.files("harness.domains.retail").joinpath("data", "policy.md").read_text("utf-8")
)
"""Upstream's retail agent policy (what the preconditions enforce), in words."""

DB_FILE = "retail.sqlite"
"""The database's file name inside the environment's folder."""


class RetailEnvironment(FolderEnvironment):
    """A fresh copy of the retail database, its state adapter and its tools.

    Args:
        folder: Where the database file goes (created if missing; left in place on
            :meth:`close`). Default: a new temporary folder, removed on :meth:`close`.
        db_json_path: Upstream's ``db.json`` to build the template from (default: the copy
            shipped in the package, ``harness/domains/retail/data/db.json``).

    Attributes:
        path: The database file.
        state: The :class:`hx.SQLState` over it (resources ``orders/<id>``, ``users/<id>``,
            ``products/<id>``).
        backend: The plain :class:`RetailTools` the actions call, over ``state.connection``
            (its methods are looked up at each call: patch one to inject a fault).
        actions: ``{name: hx.Action}`` for the seven write tools.
        tools: ``{name: callable}`` for all sixteen tools: the actions for writes, the plain
            methods for the rest.
    """

    TOOL_NAMES = frozenset(TOOL_TYPES)
    """Every tool name the environment offers (the keys of ``tools``)."""

    def __init__(
        self,
        folder: str | os.PathLike[str] | None = None,
        *,
        db_json_path: str | os.PathLike[str] | None = None,
    ) -> None:
        root = self._open_folder(folder, "harness-retail-")
        try:
            self.path = db.fresh_copy(root / DB_FILE, db_json_path=db_json_path)
            # The copy is the environment's own: WAL suits its many small writes.
            self.state = hx.SQLState(self.path, journal_mode="wal")
        except BaseException:
            self._remove_folder()
            raise
        self.backend = RetailTools(self.state.connection)
        self.actions: dict[str, hx.Action[..., Record]] = build_actions(self.backend, self.state)
        self.tools: dict[str, Callable[..., Any]] = {
            name: self.actions[name] if name in self.actions else getattr(self.backend, name)
            for name in TOOL_TYPES
        }

    def extra_write(self, task: Any, rng: random.Random) -> tuple[str, dict[str, Any]] | None:
        """A plausible write nobody asked for (the simulated agent's ``extra_write`` mistake):
        moving the task's customer to another address."""
        user_id = None
        for call in task.reference_actions:
            args = call.arguments
            if "user_id" in args:
                user_id = args["user_id"]
            elif "order_id" in args and user_id is None:
                order = self.state.get(f"orders/{args['order_id']}")
                user_id = order["user_id"] if order else None
        if user_id is None:
            return None
        return "modify_user_address", {
            "user_id": user_id,
            "address1": f"{rng.randint(1, 999)} Elsewhere Road",
            "address2": "",
            "city": "Springfield",
            "state": "IL",
            "country": "USA",
            "zip": "62701",
        }

    def export(self) -> dict[str, dict[str, Record]]:
        """The database as plain JSON in the shape of tau2's ``db.json``."""
        return db.export(self.state.connection)

    def _release(self) -> None:
        self.state.close()

    def _where(self) -> object:
        return self.path

"""``RetailEnvironment``: one isolated retail database with its tools, for one trial.

It starts from a copy of the template database, in memory
(:meth:`harness.domains.records.Tables.image`) or in a folder given
(:func:`~harness.domains.retail.db.fresh_copy`), opens it as an :class:`hx.SQLState`, and builds
the tools over that adapter's connection: actions for the seven write tools
(:func:`~harness.domains.retail.actions.build_actions`), plain methods for the reads,
``calculate`` and ``transfer_to_human_agents``.

One connection, shared: the tools write through the adapter's own ``sqlite3`` connection
(autocommit mode, ``isolation_level=None``). Each write tool runs in one ``BEGIN IMMEDIATE``
transaction on it, and the adapter's change-capture triggers fire inside that same transaction,
so a tool that fails rolls back its rows *and* their capture records together: the harness sees
exactly the committed changes, with no window in which another connection's uncommitted or
not-yet-visible writes could be missed or misattributed.

What the agent sees is upstream's, word for word, while the transactions run underneath:

- the tools' definitions (:meth:`RetailEnvironment.tool_defs`: names, descriptions, parameter
  schemas as upstream's ``Tool.openai_schema`` gives them, ``data/tools.json``), which the
  :class:`~harness.agents.base.Toolbox` hands the agent;
- the policy (:attr:`RetailEnvironment.policy`, upstream's ``policy.md``);
- every tool message (:meth:`RetailEnvironment.tool_message`): a result as upstream's
  environment serialises it, and a refused call as upstream's tool would have failed
  (``Error: Order not found``), not the name and docstring of the precondition that refused it.
  That reason stays in the store, the log and the audit.
"""

from __future__ import annotations

import random
from importlib import resources
from typing import Any, Final

from harness.domains.retail import db
from harness.domains.retail.actions import build_actions
from harness.domains.retail.tools import TOOL_TYPES, RetailError, RetailTools
from harness.domains.tau2 import Tau2Environment, load_tool_defs

__all__ = ["POLICY", "TOOL_DEFS", "RetailEnvironment"]

_DATA = resources.files("harness.domains.retail").joinpath("data")

POLICY: Final[str] = _DATA.joinpath("policy.md").read_text("utf-8")
"""Upstream's retail agent policy (``policy.md``, what the preconditions enforce), word for word:
the domain policy the agent is given."""

TOOL_DEFS: Final = load_tool_defs(_DATA, RetailTools)
"""The sixteen tools exactly as upstream hands them to an agent (``Tool.openai_schema``:
OpenAI function-calling objects with upstream's names, descriptions and parameter schemas,
``title`` keys included), in upstream's order, keys included. Read them with
:meth:`RetailEnvironment.tool_defs` (a copy)."""

DB_FILE = "retail.sqlite"
"""The database's file name inside the environment's folder."""


class RetailEnvironment(Tau2Environment):
    """A fresh copy of the retail database, its state adapter and its tools.

    Args:
        folder: Where the database file goes (created if missing; left in place on
            :meth:`close`). Default: the database lives in memory, a copy of the template
            nobody else can open, gone on :meth:`close`.
        db_json_path: Upstream's ``db.json`` to build the template from (default: the copy
            shipped in the package, ``harness/domains/retail/data/db.json``).

    Attributes:
        path: The database file (None: the database is in memory).
        state: The :class:`hx.SQLState` over it (resources ``orders/<id>``, ``users/<id>``,
            ``products/<id>``).
        backend: The plain :class:`RetailTools` the actions call, over ``state.connection``
            (its methods are looked up at each call: patch one to inject a fault).
        actions: ``{name: hx.Action}`` for the seven write tools.
        tools: ``{name: callable}`` for all sixteen tools: the actions for writes, the plain
            methods for the rest, in upstream's order (that of :meth:`tool_defs`).
        policy: Upstream's retail policy, word for word (:data:`POLICY`).
    """

    DATABASE = db.DATABASE
    TOOLS = RetailTools
    ERROR = RetailError
    BUILD_ACTIONS = build_actions
    TOOL_DEFS = TOOL_DEFS
    TOOL_NAMES = frozenset(TOOL_TYPES)
    """Every tool name the environment offers (the keys of ``tools``)."""

    policy: str = POLICY
    """The domain policy the agent is given: upstream's ``policy.md``, word for word."""

    backend: RetailTools

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

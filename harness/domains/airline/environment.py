"""``AirlineEnvironment``: one isolated airline database with its tools, for one trial.

It starts from a copy of the template database, in memory
(:meth:`harness.domains.records.Tables.image`) or in a folder given
(:meth:`~harness.domains.records.Tables.fresh_copy`), opens it as an :class:`hx.SQLState`, and
builds the tools over that adapter's connection: actions for the six write tools
(:func:`~harness.domains.airline.actions.build_actions`), plain methods for the reads,
``calculate`` and ``transfer_to_human_agents`` (:class:`harness.domains.tau2.Tau2Environment`
says how the connection is shared and how the agent sees upstream's words)."""

from __future__ import annotations

import random
from importlib import resources
from typing import Any, Final

from harness.domains.airline import db
from harness.domains.airline.actions import build_actions
from harness.domains.airline.tools import TOOL_TYPES, AirlineError, AirlineTools
from harness.domains.tau2 import Tau2Environment, load_tool_defs

__all__ = ["POLICY", "TOOL_DEFS", "AirlineEnvironment"]

_DATA = resources.files("harness.domains.airline").joinpath("data")

POLICY: Final[str] = _DATA.joinpath("policy.md").read_text("utf-8")
"""Upstream's airline agent policy (``policy.md``, what the preconditions enforce), word for
word: the domain policy the agent is given."""

TOOL_DEFS: Final = load_tool_defs(_DATA, AirlineTools)
"""The fourteen tools exactly as upstream hands them to an agent (``Tool.openai_schema``), in
upstream's order, keys included. Read them with :meth:`AirlineEnvironment.tool_defs` (a copy)."""


class AirlineEnvironment(Tau2Environment):
    """A fresh copy of the airline database, its state adapter and its tools.

    Args:
        folder: Where the database file goes (created if missing; left in place on
            :meth:`close`). Default: the database lives in memory, a copy of the template
            nobody else can open, gone on :meth:`close`.
        db_json_path: Upstream's ``db.json`` to build the template from (default: the copy
            shipped in the package, ``harness/domains/airline/data/db.json``).

    Attributes:
        path: The database file (None: the database is in memory).
        state: The :class:`hx.SQLState` over it (resources ``flights/<number>``,
            ``users/<id>``, ``reservations/<id>``).
        backend: The plain :class:`AirlineTools` the actions call, over ``state.connection``
            (its methods are looked up at each call: patch one to inject a fault).
        actions: ``{name: hx.Action}`` for the six write tools.
        tools: ``{name: callable}`` for all fourteen tools: the actions for writes, the plain
            methods for the rest, in upstream's order (that of :meth:`tool_defs`).
        policy: Upstream's airline policy, word for word (:data:`POLICY`).
    """

    DATABASE = db.DATABASE
    TOOLS = AirlineTools
    ERROR = AirlineError
    BUILD_ACTIONS = build_actions
    TOOL_DEFS = TOOL_DEFS
    TOOL_NAMES = frozenset(TOOL_TYPES)
    """Every tool name the environment offers (the keys of ``tools``)."""

    policy: str = POLICY
    """The domain policy the agent is given: upstream's ``policy.md``, word for word."""

    backend: AirlineTools

    def extra_write(self, task: Any, rng: random.Random) -> tuple[str, dict[str, Any]] | None:
        """A plausible write nobody asked for (the simulated agent's ``extra_write`` mistake):
        a certificate sent to the task's customer."""
        for call in task.reference_actions:
            user_id = call.arguments.get("user_id")
            if isinstance(user_id, str):
                return "send_certificate", {"user_id": user_id, "amount": rng.choice((50, 100))}
        return None

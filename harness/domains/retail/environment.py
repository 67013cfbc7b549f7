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

import copy
import inspect
import json
import os
import random
import typing
from collections.abc import Callable, Mapping
from importlib import resources
from typing import TYPE_CHECKING, Any, Final

from pydantic import Field, create_model

import harness as hx
from harness.domains.base import FolderEnvironment
from harness.domains.retail import db
from harness.domains.retail.actions import build_actions
from harness.domains.retail.db import Record
from harness.domains.retail.tools import TOOL_TYPES, RetailError, RetailTools, upstream_error

if TYPE_CHECKING:
    from harness.agents.base import ToolResult

__all__ = ["POLICY", "TOOL_DEFS", "RetailEnvironment"]

_DATA = resources.files("harness.domains.retail").joinpath("data")

POLICY: Final[str] = _DATA.joinpath("policy.md").read_text("utf-8")
"""Upstream's retail agent policy (``policy.md``, what the preconditions enforce), word for word:
the domain policy the agent is given."""


def _in_upstreams_order(spec: dict[str, Any]) -> dict[str, Any]:
    """A tool definition with its keys in the order upstream's ``Tool.openai_schema`` gives them.

    The shipped file keeps upstream's content with its keys sorted. Upstream builds the
    parameters with ``pydantic.create_model("parameters", **{arg: (type, Field(...,
    description=...))})`` from the tool's signature; doing the same from our tool's signature
    (same names, types and order) gives upstream's key order. Should that ever differ from the
    shipped content, the shipped definition is kept as it is.
    """
    function = spec["function"]
    name = function["name"]
    method = getattr(RetailTools, name)
    hints = typing.get_type_hints(method)
    described = function["parameters"]["properties"]
    fields: dict[str, Any] = {
        arg: (hints[arg], Field(..., description=described.get(arg, {}).get("description")))
        for arg in list(inspect.signature(method).parameters)[1:]
    }
    ordered = {
        "type": "function",
        "function": {
            "name": name,
            "description": function["description"],
            "parameters": create_model("parameters", **fields).model_json_schema(),
        },
    }
    return ordered if ordered == spec else spec


TOOL_DEFS: Final[tuple[Mapping[str, Any], ...]] = tuple(
    _in_upstreams_order(spec)
    for spec in json.loads(_DATA.joinpath("tools.json").read_text("utf-8"))
)
"""The sixteen tools exactly as upstream hands them to an agent (``Tool.openai_schema``:
OpenAI function-calling objects with upstream's names, descriptions and parameter schemas,
``title`` keys included), in upstream's order, keys included. Read them with
:meth:`RetailEnvironment.tool_defs` (a copy)."""

_TOOL_ORDER: Final[tuple[str, ...]] = tuple(d["function"]["name"] for d in TOOL_DEFS)

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
            methods for the rest, in upstream's order (that of :meth:`tool_defs`).
        policy: Upstream's retail policy, word for word (:data:`POLICY`).
    """

    TOOL_NAMES = frozenset(TOOL_TYPES)
    """Every tool name the environment offers (the keys of ``tools``)."""

    policy: str = POLICY
    """The domain policy the agent is given: upstream's ``policy.md``, word for word."""

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
            for name in _TOOL_ORDER
        }

    @staticmethod
    def tool_defs() -> list[dict[str, Any]]:
        """The tools as upstream hands them to an agent, word for word (a fresh copy).

        Returns:
            Upstream's ``Tool.openai_schema`` of each of the sixteen tools, in upstream's order:
            ``{"type": "function", "function": {"name", "description", "parameters"}}``, the
            parameters being pydantic's JSON schema with its ``title`` keys. The toolbox gives
            these to the agent (:attr:`harness.agents.base.Toolbox.specs`); exports list them
            as the run's tool definitions.
        """
        return [copy.deepcopy(dict(d)) for d in TOOL_DEFS]

    def tool_message(
        self,
        name: str,
        arguments: Mapping[str, Any],
        result: ToolResult,
        error: BaseException | None,
    ) -> str | None:
        """The tool message the agent reads for a call, as upstream's environment writes it.

        The :class:`~harness.agents.base.Toolbox` asks for it after every call (see
        :attr:`~harness.agents.base.ToolResult.text`). Upstream's ``Environment.get_response``
        gives a string result as it is, any other result as ``json.dumps(value, default=str)``
        of its ``model_dump()`` (our records have that shape), and a failed call as
        ``Error: <the exception's message>``.

        A call the harness refused (a precondition, arguments that do not fit) reads as
        upstream's tool would have failed on the same database: the tool runs as a dry run
        (:func:`~harness.domains.retail.tools.upstream_error`) and its message is used; which
        of our checks refused it, and why, stays in the store, the log and the audit. A call
        that failed in the tool reads as the tool's error. Failures upstream has no counterpart
        for (an injected fault, a postcondition, a person's rejection) keep the harness's
        wording.

        Args:
            name: The tool called.
            arguments: The arguments as the agent sent them.
            result: What the toolbox made of the call (``ok``, ``content``, ``error``, ``kind``).
            error: The exception the call raised (None: it succeeded, or never reached a tool).

        Returns:
            The text, or None to let the toolbox render the result its own way.
        """
        if result.ok:
            content = result.content
            return content if isinstance(content, str) else json.dumps(content, default=str)
        if error is None:
            if result.kind == "unknown_tool":
                return f"Error: {upstream_error(self.backend, name, arguments)}"
            return None
        if isinstance(error, hx.PreconditionFailed | hx.InvalidArguments):
            told = upstream_error(self.backend, name, arguments)
            return None if told is None else f"Error: {told}"
        if isinstance(error, hx.ActionFailed):
            last = error.errors[-1] if error.errors else None
            told = _tool_error(last) if error.failure_class == "fail_stop" else None
            return None if told is None else f"Error: {told}"
        if name in self.actions or isinstance(error, hx.HarnessError):
            return None
        return f"Error: {error}"  # a read tool's own error, as upstream reports it

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


def _tool_error(error: BaseException | None) -> str | None:
    """The message of a retail tool's own error: the error itself, or (a replayed call) the
    ``"RetailError: <message>"`` text the store kept of it."""
    if isinstance(error, RetailError):
        return str(error)
    text = "" if error is None else str(error)
    prefix = f"{RetailError.__name__}: "
    return text[len(prefix) :] if text.startswith(prefix) else None

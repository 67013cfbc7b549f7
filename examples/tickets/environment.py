"""The tickets suite's environment: a help desk's tickets and staff, one fresh copy per trial.

``suite.json`` names it as ``environment:TicketsEnvironment``: a module of the suite's own
folder, which the harness imports from there (no PYTHONPATH). Every trial gets a new
``TicketsEnvironment()``; its ``state`` is what the harness snapshots, diffs and verifies, and its
``tools`` are what the agent may call: an :func:`harness.action` for each write (every call one
transaction: precondition, write-ahead intent, postcondition, commit or compensation) and plain
functions for reads.
"""

from __future__ import annotations

import copy
from typing import Any

import harness as hx

TICKETS: dict[str, dict[str, Any]] = {
    "T-1": {"title": "Printer jams on floor 2", "status": "open", "assignee": None},
    "T-2": {"title": "VPN drops every hour", "status": "open", "assignee": None},
    "T-3": {"title": "Password reset", "status": "closed", "assignee": "ana"},
}
STAFF = ("ana", "li", "maria")


class TicketsEnvironment:
    """Tickets ``tickets/<id>`` and staff ``staff/<name>``; two writes, two reads.

    The desk's rules, enforced as preconditions: only an open ticket is assigned or closed,
    only to someone on the staff, and a ticket is assigned before it is closed.
    """

    # Every tool name: the suite loader rejects a task whose reference actions name another.
    TOOL_NAMES = frozenset({"assign_ticket", "close_ticket", "get_ticket", "list_staff"})

    def __init__(self) -> None:
        data = {f"tickets/{k}": copy.deepcopy(v) for k, v in TICKETS.items()}
        data.update({f"staff/{name}": {"name": name} for name in STAFF})
        self.state = hx.DictState(data)
        state = self.state

        def put_back(ctx: hx.Context) -> None:
            """Compensation: what the action's scope held before it ran."""
            for key, value in ctx.before.items():
                state[key] = value

        @hx.action(
            writes=["tickets/{ticket_id}"],
            idempotency_key=lambda a: f"assign:{a.ticket_id}:{a.assignee}",
        )
        def assign_ticket(ticket_id: str, assignee: str) -> dict[str, Any]:
            """Assign open ticket `ticket_id` to `assignee`, who must be on the staff."""
            ticket = dict(state[f"tickets/{ticket_id}"])
            ticket["assignee"] = assignee
            state[f"tickets/{ticket_id}"] = ticket
            return ticket

        @assign_ticket.precondition
        def open_ticket_and_known_assignee(ctx: hx.Context) -> bool:
            ticket = ctx.state.get(f"tickets/{ctx.args.ticket_id}")
            staff = ctx.state.get(f"staff/{ctx.args.assignee}")
            return ticket is not None and ticket["status"] == "open" and staff is not None

        @assign_ticket.postcondition
        def assigned(ctx: hx.Context) -> bool:
            return bool(ctx.after[f"tickets/{ctx.args.ticket_id}"]["assignee"] == ctx.args.assignee)

        assign_ticket.compensation(put_back)

        @hx.action(writes=["tickets/{ticket_id}"], idempotency_key=lambda a: f"close:{a.ticket_id}")
        def close_ticket(ticket_id: str, resolution: str) -> dict[str, Any]:
            """Close open, assigned ticket `ticket_id`, saying how it was resolved."""
            ticket = dict(state[f"tickets/{ticket_id}"])
            ticket.update(status="closed", resolution=resolution)
            state[f"tickets/{ticket_id}"] = ticket
            return ticket

        @close_ticket.precondition
        def open_and_assigned(ctx: hx.Context) -> bool:
            ticket = ctx.state.get(f"tickets/{ctx.args.ticket_id}")
            return ticket is not None and ticket["status"] == "open" and bool(ticket["assignee"])

        @close_ticket.postcondition
        def closed(ctx: hx.Context) -> bool:
            ticket = ctx.after[f"tickets/{ctx.args.ticket_id}"]
            return bool(
                ticket["status"] == "closed" and ticket["resolution"] == ctx.args.resolution
            )

        close_ticket.compensation(put_back)

        def get_ticket(ticket_id: str) -> Any:
            """Ticket `ticket_id` (null: no such ticket)."""
            return state.get(f"tickets/{ticket_id}")

        def list_staff() -> list[str]:
            """The names of everyone on the staff."""
            return sorted(key.removeprefix("staff/") for key in state if key.startswith("staff/"))

        self.tools: dict[str, Any] = {
            "assign_ticket": assign_ticket,
            "close_ticket": close_ticket,
            "get_ticket": get_ticket,
            "list_staff": list_staff,
        }

    def export(self) -> dict[str, Any]:
        """The desk's data as plain JSON."""
        return self.state.to_dict()

    def close(self) -> None:
        """Nothing to release: the state lives in memory."""

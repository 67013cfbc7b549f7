"""A custom agent: a rule-based help-desk agent for the ``examples/tickets`` suite.

It never looks at a task's reference actions: it reads the instruction, calls tools through the
toolbox, and reads what they answer (a refused call comes back as a result, not an exception),
as a model-driven agent would. Run it with::

    harness run examples/tickets --agent examples/agents/desk_agent.py:DeskAgent --trials 4

or, from ``examples/agents``, ``--agent desk_agent:DeskAgent``. Any class with a ``name``,
``config()`` and ``run(task, toolbox, *, seed)`` is an agent (``help(harness.agents.Agent)``).
"""

from __future__ import annotations

import re
from typing import Any

from harness import Task
from harness.agents import AgentOutput, Toolbox

TICKET = re.compile(r"\b(T-\d+)\b")
ASSIGN = re.compile(r"\bassign (?:ticket T-\d+|it) to (\w+)", re.IGNORECASE)
CLOSE = re.compile(r"\bclose (?:ticket T-\d+|it) with resolution '([^']+)'", re.IGNORECASE)


class DeskAgent:
    """Assigns and closes the ticket an instruction names, and says no when the desk's rules
    (the tools' preconditions) refuse.

    Args:
        polite: open every answer with a greeting (an option, to show how options reach an
            agent: ``run_trials(agent=..., agent_options={"polite": True})``).
    """

    name = "desk"

    def __init__(self, polite: bool = False) -> None:
        self.polite = polite

    def config(self) -> dict[str, Any]:
        """What the run's evidence records about this agent."""
        return {"name": self.name, "polite": self.polite}

    def run(self, task: Task, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        """Act on the instruction; ``seed`` is unused (the agent draws nothing at random)."""
        found = TICKET.search(task.instruction)
        if found is None:
            return self._answer("Which ticket? I found no ticket id (T-<number>).", False)
        ticket_id = found.group(1)
        ticket = toolbox.call("get_ticket", {"ticket_id": ticket_id})
        if not ticket.ok or ticket.content is None:
            return self._answer(f"There is no ticket {ticket_id}.", False)
        if ticket.content["status"] == "closed":
            return self._answer(f"Ticket {ticket_id} is already closed; I changed nothing.", False)
        assign = ASSIGN.search(task.instruction)
        if assign is not None:
            who = assign.group(1)
            done = toolbox.call("assign_ticket", {"ticket_id": ticket_id, "assignee": who})
            if not done.ok:
                staff = toolbox.call("list_staff", {}).content or []
                if who not in staff:
                    return self._answer(
                        f"{who} is not on the staff ({', '.join(staff)}); ticket {ticket_id} "
                        "is unchanged.",
                        False,
                    )
                return self._answer(f"I could not assign {ticket_id}: {done.error}", False)
        close = CLOSE.search(task.instruction)
        if close is not None:
            done = toolbox.call(
                "close_ticket", {"ticket_id": ticket_id, "resolution": close.group(1)}
            )
            if not done.ok:
                return self._answer(f"I could not close {ticket_id}: {done.error}", False)
        return self._answer(f"Done: ticket {ticket_id} is updated.", True)

    def _answer(self, text: str, success: bool) -> AgentOutput:
        return AgentOutput(
            message=("Hello! " if self.polite else "") + text, claimed_success=success
        )

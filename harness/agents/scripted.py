"""``scripted``: replays a task's reference actions; passes every trial when nothing is injected."""

from __future__ import annotations

from typing import Any

from ..suite import Task
from .base import AgentOutput, Toolbox, registry

__all__ = ["ScriptedAgent"]


class ScriptedAgent:
    """Calls the task's reference actions in order, then reports the required outputs; a
    reference call the user makes (``requestor`` ``user``) is made with the user's tools."""

    name = "scripted"

    def config(self) -> dict[str, Any]:
        return {"name": self.name}

    def run(self, task: Task, toolbox: Toolbox, *, seed: int) -> AgentOutput:
        for call in task.reference_actions:
            toolbox.call(call.name, dict(call.arguments), requestor=call.requestor)
        return AgentOutput(message=final_message(task), claimed_success=True)


def final_message(task: Task) -> str:
    """A closing message that says what the task requires the agent to say."""
    if task.expect == "refuse":
        opening = "I'm sorry, I cannot do that under our policy."
    elif task.expect == "handoff":
        opening = "I have transferred you to a human agent."
    else:
        opening = "Done: everything you asked for is complete."
    return " ".join([opening, *task.required_outputs])


registry.register("scripted", ScriptedAgent)

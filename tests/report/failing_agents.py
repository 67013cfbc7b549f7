"""An agent that fails each toy task its own way, every call it makes committed or refused."""

from __future__ import annotations

from typing import Any

from harness.agents.base import AgentOutput
from harness.agents.scripted import ScriptedAgent


class EveryWayAgent(ScriptedAgent):
    """By task: ``t0`` (the reference changes nothing) bumps a counter anyway; ``t1`` does
    nothing; ``t2`` bumps the wrong counter; ``t3`` raises; ``t4`` asks for a counter that
    does not exist (refused by its precondition) and stops; any other task is done right."""

    name = "every-way"

    def run(self, task: Any, toolbox: Any, *, seed: int) -> AgentOutput:
        if task.id == "t0":
            toolbox.call("bump", {"name": "a", "step": 0})
        elif task.id == "t1":
            pass
        elif task.id == "t2":
            toolbox.call("bump", {"name": "h", "step": 0})
            toolbox.call("bump", {"name": "h", "step": 1})
        elif task.id == "t3":
            raise RuntimeError("the agent's own bug")
        elif task.id == "t4":
            toolbox.call("bump", {"name": "zz", "step": 0})
        else:
            return super().run(task, toolbox, seed=seed)
        return AgentOutput(message="done", claimed_success=True)


class FirstAttemptDown(ScriptedAgent):
    """The model server fails every trial's first attempt; later attempts do the task."""

    name = "first-attempt-down"

    def run(self, task: Any, toolbox: Any, *, seed: int) -> AgentOutput:
        from harness.errors import ModelServerError

        if "~" not in toolbox.episode.id:
            raise ModelServerError("cannot reach the server", url="http://127.0.0.1:9/v1")
        return super().run(task, toolbox, seed=seed)

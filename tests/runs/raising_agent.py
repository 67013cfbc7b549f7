"""Agents with bugs: they raise in some trials, as a real agent's code does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.agents.simulated import SimulatedAgent


class RaisingAgent(SimulatedAgent):
    """The simulated agent, raising in the trials of task ``task`` after one write.

    ``raise_as``: ``value`` (ValueError), ``exit`` (SystemExit(7)) or ``interrupt``
    (KeyboardInterrupt). With ``fixed``, it raises only while that file does not exist: the
    bug is fixed once the file is made.
    """

    name = "raising"

    def __init__(
        self,
        task: str = "t1",
        raise_as: str = "value",
        fixed: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**{"error_rate": 0.0, **options})
        self.task, self.raise_as, self.fixed = task, raise_as, fixed

    def config(self) -> dict[str, Any]:
        return {**super().config(), "agent": self.name, "task": self.task}

    def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
        broken = self.fixed is None or not Path(self.fixed).exists()
        if task.id != self.task or not broken:
            return super().run(task, toolbox, seed=seed)
        toolbox.call("bump", {"name": "a", "step": 0})
        if self.raise_as == "exit":
            raise SystemExit(7)
        if self.raise_as == "interrupt":
            raise KeyboardInterrupt
        raise ValueError(f"a bug in the agent (task {task.id}, seed {seed})")


class ExitingAgent(RaisingAgent):
    """As :class:`RaisingAgent`, raising ``SystemExit(7)``."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**{"raise_as": "exit", **options})


class SlowAgent(SimulatedAgent):
    """The simulated agent, taking ``delay`` seconds before each trial (a model's think time)."""

    name = "slow"

    def __init__(self, delay: float = 0.1, **options: Any) -> None:
        super().__init__(**options)
        self.delay = delay

    def config(self) -> dict[str, Any]:
        return {**super().config(), "agent": self.name, "delay": self.delay}

    def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
        import time

        time.sleep(self.delay)
        return super().run(task, toolbox, seed=seed)

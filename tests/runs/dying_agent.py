"""An agent whose process dies in its first trial, as one killed or out of memory would."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from harness.agents.simulated import SimulatedAgent


class DyingAgent(SimulatedAgent):
    """Exits its process at once, without cleaning up. With ``marker``, only the first time
    (the file says it happened); after that it acts as the simulated agent."""

    name = "dying"

    def __init__(self, marker: str | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.marker = marker

    def config(self) -> dict[str, Any]:
        return {**super().config(), "agent": self.name, "marker": self.marker}

    def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
        if self.marker is None or not Path(self.marker).exists():
            if self.marker is not None:
                Path(self.marker).touch()
            os._exit(17)
        return super().run(task, toolbox, seed=seed)

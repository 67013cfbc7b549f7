"""An agent that takes its time and says which process ran each trial (for runs shared by
several processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from harness.agents.simulated import SimulatedAgent


class SlowAgent(SimulatedAgent):
    """The simulated agent with no errors, sleeping ``pause`` seconds per trial, half before
    its writes and half after (default: the ``HX_TEST_PAUSE`` variable, else 0.25); with a
    ``ledger`` (default: the ``HX_TEST_LEDGER`` file) it appends ``<pid> <episode id>`` for
    each trial it runs."""

    name = "slow"

    def __init__(
        self, pause: float | None = None, ledger: str | None = None, **options: Any
    ) -> None:
        super().__init__(**{"error_rate": 0.0, **options})
        self.pause = float(os.environ.get("HX_TEST_PAUSE", "0.25")) if pause is None else pause
        self.ledger = ledger or os.environ.get("HX_TEST_LEDGER")

    def config(self) -> dict[str, Any]:
        return {**super().config(), "agent": self.name, "pause": self.pause}

    def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
        time.sleep(self.pause / 2)
        if self.ledger:
            with Path(self.ledger).open("a", encoding="utf-8") as f:
                f.write(f"{os.getpid()} {toolbox.episode.id}\n")
        out = super().run(task, toolbox, seed=seed)
        time.sleep(self.pause / 2)  # (its episode holds its store connection meanwhile)
        return out

"""An agent whose process dies in its first trial, as one killed or out of memory would."""

from __future__ import annotations

import os
from typing import Any


class DyingAgent:
    """Exits its process at once, without cleaning up."""

    name = "dying"

    def config(self) -> dict[str, Any]:
        return {"agent": self.name}

    def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
        os._exit(17)

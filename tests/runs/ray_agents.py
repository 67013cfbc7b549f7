"""An agent and an environment the Ray executor's tests build in Ray's worker processes.

They live in a module (not in the test file) because a Ray worker builds them from their
``module:Class`` names, as it would a user's.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import harness as hx
from harness.agents import AgentOutput

from ..toy_env import ToyEnvironment


class LedgerEnvironment(ToyEnvironment):
    """The toy counters, whose ``bump`` also appends a line to a ledger file each time its
    body runs: ``<episode id> <name>:<step>``. The ledger outlives the process, so it counts
    the effects that really happened, whatever the records say."""

    def __init__(self, ledger: str) -> None:
        super().__init__()
        bump = self.tools["bump"]
        body = bump.fn

        def bump_and_note(name: str, step: int, amount: int = 1) -> int:
            out = body(name, step, amount)
            episode = hx.current_episode()
            with open(ledger, "a") as f:
                f.write(f"{episode.id if episode else '?'} {name}:{step}\n")
            return out

        bump.fn = bump_and_note


def ledger_lines(ledger: Path) -> list[str]:
    """The ledger's lines (none when no bump ran)."""
    return ledger.read_text().splitlines() if ledger.exists() else []


class CrashOnce:
    """Replays the task's reference actions; the first trial of ``task`` to run, in the whole
    run, kills its own process (SIGKILL) right after its first write committed.

    ``marker``: a file whose creation says "already crashed once" (it holds the episode's id).
    ``always``: every trial of ``task`` does it, every time it runs (and appends its episode's
    id to ``marker`` first, a line per crash).
    """

    name = "crash-once"

    def __init__(self, marker: str, task: str, always: bool = False) -> None:
        self.marker = marker
        self.task = task
        self.always = always

    def config(self) -> dict[str, Any]:
        return {"name": self.name, "task": self.task}

    def run(self, task: Any, toolbox: Any, *, seed: int) -> AgentOutput:
        writes = 0
        for call in task.reference_actions:
            toolbox.call(call.name, dict(call.arguments))
            writes += toolbox.is_write(call.name)
            if writes == 1 and task.id == self.task and self._first():
                os.kill(os.getpid(), signal.SIGKILL)
        return AgentOutput(message="done")

    def _first(self) -> bool:
        """Claim the crash (once per run, whichever process gets here first)."""
        if self.always:
            episode = hx.current_episode()
            with open(self.marker, "a") as f:
                f.write(f"{episode.id if episode else '?'}\n")
            return True
        try:
            fd = os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        episode = hx.current_episode()
        os.write(fd, (episode.id if episode else "?").encode())
        os.close(fd)
        return True

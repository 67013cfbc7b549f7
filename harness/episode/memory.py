"""What an episode knows of itself, shared by the parts that make it up.

:class:`Memory` is one episode's working state: its outcome, steps and digest, what it committed,
the calls in doubt, the escalations resolved for it. The episode owns it and gives it to its
parts (the recorder, the saga, the settler); each part changes only what its records say.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import Diverged
from ..store import GENESIS, EpisodeStatus, EscalationRow
from .values import Committed, InDoubt

if TYPE_CHECKING:
    from ..action import Action
    from ..transaction import Transaction

__all__ = ["Memory"]


@dataclass(eq=False)
class Memory:
    """One episode's working state (see the module)."""

    id: str
    outcome: str = EpisodeStatus.RUNNING
    steps: int = 0
    digest: str = GENESIS
    seq: int = 0  # the last transaction's sequence number
    pivot: str | None = None  # the committed pivot action that bars rolling back past it
    escalation_id: str | None = None
    committed: list[Committed] = field(default_factory=list)
    done: dict[str, Committed] = field(default_factory=dict)  # idempotency key -> its commit
    by_txn: dict[str, Committed] = field(default_factory=dict)
    in_doubt: dict[str, InDoubt] = field(default_factory=dict)
    # Calls whose outcome could not be recorded (the store failed): settled first thing.
    unsettled: dict[str, Action[Any, Any]] = field(default_factory=dict)
    # Calls that changed nothing whose record the store refused: recorded as failed next.
    unrecorded: list[tuple[Transaction, str]] = field(default_factory=list)
    resolutions: dict[str, EscalationRow] = field(default_factory=dict)
    compensating: set[str] = field(default_factory=set)  # undo started, outcome unrecorded
    rolled_back: bool = False
    diverged: Diverged | None = None

"""The store's vocabulary: the statuses its rows hold (transactions, episodes, escalations, runs).

Each vocabulary is a :class:`enum.StrEnum`: a member *is* the string the store holds
(``TxnStatus.COMMITTED == "committed"``, same hash, same JSON), so rows read back as plain
strings, stored values and comparisons with plain strings all agree with the members.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "APPLIED",
    "RESOLVED_AS",
    "RETURNED",
    "EpisodeStatus",
    "EscalationStatus",
    "RunStatus",
    "TxnStatus",
]


class TxnStatus(enum.StrEnum):
    """How one call of an action ended: the ``status`` of its ``hx_transaction`` row."""

    COMMITTED = "committed"
    """Its effect verified and recorded."""
    RECOVERED = "recovered"
    """Committed after its outcome was in doubt (an error, a lost answer, a crash): its
    postconditions found the effect present."""
    COMPENSATED = "compensated"
    """Committed, then undone by its compensation (a rollback)."""
    FAILED = "failed"
    """Not committed (or its undo failed): its failure class and the policy's decision say why
    and what came next."""
    INVALID = "invalid"
    """Refused before it ran: arguments that do not validate, or an idempotency conflict."""
    PRECONDITION = "precondition"
    """Refused before it ran: a precondition was false."""
    CHECK_ERROR = "check_error"
    """Refused before it ran: a precondition raised."""
    HELD = "held"
    """Held for a person's approval before it ran (an escalation)."""
    ABANDONED = "abandoned"
    """In doubt, its effect found absent: the call ran again as another transaction."""
    IN_DOUBT = "in_doubt"
    """An intent without an outcome (the process died in the call). Never a row's status: the
    record's readers (resume, replay, the audit timeline) name such a call so."""


class EpisodeStatus(enum.StrEnum):
    """An episode's outcome: ``hx_episode.status``, ``Episode.outcome``, a trial's outcome."""

    RUNNING = "running"
    COMMITTED = "committed"
    ROLLED_BACK = "rolled_back"
    ESCALATED = "escalated"
    FAILED = "failed"


class EscalationStatus(enum.StrEnum):
    """Where a decision left to a person stands: ``hx_escalation.status``."""

    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"
    EDITED = "edited"


class RunStatus(enum.StrEnum):
    """A run of a suite: ``hx_run.status``."""

    RUNNING = "running"
    FINISHED = "finished"
    INTERRUPTED = "interrupted"


APPLIED: frozenset[TxnStatus] = frozenset({TxnStatus.COMMITTED, TxnStatus.RECOVERED})
"""Calls whose effect stands as their commit recorded it."""

RETURNED: frozenset[TxnStatus] = APPLIED | {TxnStatus.COMPENSATED}
"""Calls whose row holds a result the agent received (compensated ones committed first)."""

RESOLVED_AS: Mapping[str, EscalationStatus] = MappingProxyType(
    {
        "approve": EscalationStatus.APPROVED,
        "reject": EscalationStatus.REJECTED,
        "edit": EscalationStatus.EDITED,
    }
)
"""A person's decision on an escalation (``Store.resolve``) -> the escalation's status."""

"""What a faulted tool raises, and the error a malformed plan raises."""

from __future__ import annotations

from ..errors import ConfigurationError, TransientError

__all__ = [
    "CompensationBroken",
    "FaultPlanError",
    "InjectedError",
    "InjectedFault",
    "InjectedTransientError",
    "LostAcknowledgement",
    "PlannedInterruption",
    "ServiceDown",
    "TransientServiceDown",
    "WorkerCrash",
]


# --------------------------------------------------------------------------------------------
# What a faulted tool raises. These imitate a tool's own failures, so they are not
# HarnessErrors; every message starts with the event id, which is how the report finds the
# fault in the errors a transaction recorded.
# --------------------------------------------------------------------------------------------


class FaultPlanError(ConfigurationError):
    """A fault plan is malformed: its file, its syntax, or a field (named precisely)."""


class InjectedFault(Exception):
    """Base of what a faulted tool raises; ``event_id`` names the :class:`FaultEvent`."""

    def __init__(self, event_id: str, message: str) -> None:
        self.event_id = event_id
        super().__init__(f"[{event_id}] {message}")


class InjectedError(InjectedFault):
    """An injected permanent failure (``fail_stop`` with ``transient = false``)."""


class InjectedTransientError(InjectedError, TransientError):
    """An injected transient failure: the harness's default retry policy tries again."""


class ServiceDown(InjectedError):
    """The tool's fault domain is down (a ``correlated`` outage)."""


class TransientServiceDown(ServiceDown, TransientError):
    """The fault domain is down, and says so as a transient error."""


class PlannedInterruption(InjectedFault):
    """The fault domain is in announced maintenance (a ``planned`` interruption)."""


class LostAcknowledgement(InjectedFault):
    """The effect was applied, but the connection dropped before the answer came back."""


class CompensationBroken(InjectedFault):
    """The undo itself failed (a ``compensation`` fault)."""


class WorkerCrash(BaseException):
    """The worker died mid-call (``lost_ack`` with ``then = "crash"``).

    A ``BaseException``, like ``SystemExit``: nothing in the engine or the agent catches it, so
    the episode is cut between its intent and its outcome, as a killed process leaves it. The
    runner resumes the episode from its records.
    """

    def __init__(self, event_id: str) -> None:
        self.event_id = event_id
        super().__init__(f"[{event_id}] the worker died before the answer came back")

"""harness: a transactional agent-execution harness.

Every consequential tool call runs as a transaction (preconditions against live state,
write-ahead intent, retries, postconditions against observed state, scope check, commit or
compensation), recorded in a hash-chained log, inside an :class:`Episode`.

The names below are imported when first used (PEP 562), so that ``import harness.errors`` or
``harness --version`` does not load the store, SQLAlchemy and the agents.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from ._json import canonical, digest
    from .action import Action, Context, ContextExecutor, action, current_context
    from .clock import Clock, SystemClock
    from .episode import Episode, current_episode
    from .errors import (
        ActionFailed,
        CheckError,
        CompensationFailed,
        ConfigurationError,
        Diverged,
        EndpointDown,
        EpisodeClosed,
        Escalated,
        HarnessError,
        IdempotencyConflict,
        InvalidArguments,
        KeyInFlight,
        ModelServerError,
        NotInEpisode,
        NotSerializable,
        PreconditionFailed,
        Rejected,
        RunNotFound,
        ScopeViolation,
        StoreError,
        StoreWriteFailed,
        SuiteError,
        TransientError,
        WriteConflict,
    )
    from .policy import Decision, FailureClass, Policy, Retry
    from .runs import RunResult, resume_run, run_trials
    from .state import DictState, FileState, SQLState, StateAdapter
    from .state.base import escape_glob
    from .store import (
        ChainReport,
        EpisodeStatus,
        EscalationStatus,
        PublicKey,
        RunStatus,
        SigningKey,
        Store,
        TxnStatus,
        Witness,
    )
    from .suite import FieldCheck, Suite, Task, Verification, Verifier, load_suite

# module: the public names it gives
_PUBLIC: dict[str, tuple[str, ...]] = {
    "._json": ("canonical", "digest"),
    ".action": ("Action", "Context", "ContextExecutor", "action", "current_context"),
    ".clock": ("Clock", "SystemClock"),
    ".episode": ("Episode", "current_episode"),
    ".errors": (
        "ActionFailed",
        "CheckError",
        "CompensationFailed",
        "ConfigurationError",
        "Diverged",
        "EndpointDown",
        "EpisodeClosed",
        "Escalated",
        "HarnessError",
        "IdempotencyConflict",
        "InvalidArguments",
        "KeyInFlight",
        "ModelServerError",
        "NotInEpisode",
        "NotSerializable",
        "PreconditionFailed",
        "Rejected",
        "RunNotFound",
        "ScopeViolation",
        "StoreError",
        "StoreWriteFailed",
        "SuiteError",
        "TransientError",
        "WriteConflict",
    ),
    ".policy": ("Decision", "FailureClass", "Policy", "Retry"),
    ".runs": ("RunResult", "resume_run", "run_trials"),
    ".state": ("DictState", "FileState", "SQLState", "StateAdapter"),
    ".state.base": ("escape_glob",),
    ".store": (
        "ChainReport",
        "EpisodeStatus",
        "EscalationStatus",
        "PublicKey",
        "RunStatus",
        "SigningKey",
        "Store",
        "TxnStatus",
        "Witness",
    ),
    ".suite": ("FieldCheck", "Suite", "Task", "Verification", "Verifier", "load_suite"),
}
_WHERE = {name: module for module, names in _PUBLIC.items() for name in names}

__all__ = [
    "Action",
    "ActionFailed",
    "ChainReport",
    "CheckError",
    "Clock",
    "CompensationFailed",
    "ConfigurationError",
    "Context",
    "ContextExecutor",
    "Decision",
    "DictState",
    "Diverged",
    "EndpointDown",
    "Episode",
    "EpisodeClosed",
    "EpisodeStatus",
    "Escalated",
    "EscalationStatus",
    "FailureClass",
    "FieldCheck",
    "FileState",
    "HarnessError",
    "IdempotencyConflict",
    "InvalidArguments",
    "KeyInFlight",
    "ModelServerError",
    "NotInEpisode",
    "NotSerializable",
    "Policy",
    "PreconditionFailed",
    "PublicKey",
    "Rejected",
    "Retry",
    "RunNotFound",
    "RunResult",
    "RunStatus",
    "SQLState",
    "ScopeViolation",
    "SigningKey",
    "StateAdapter",
    "Store",
    "StoreError",
    "StoreWriteFailed",
    "Suite",
    "SuiteError",
    "SystemClock",
    "Task",
    "TransientError",
    "TxnStatus",
    "Verification",
    "Verifier",
    "Witness",
    "WriteConflict",
    "__version__",
    "action",
    "canonical",
    "current_context",
    "current_episode",
    "digest",
    "escape_glob",
    "load_suite",
    "resume_run",
    "run_trials",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use; a submodule (``harness.store``)
    as ``import harness.store`` gives it."""
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
    elif not name.startswith("__"):
        try:
            value = importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Harness(types.ModuleType):
    """The package's module: importing a submodule named as a public name (``harness.action``,
    the module of :func:`action`) leaves the public name in place, as an eager import would."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WHERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Harness

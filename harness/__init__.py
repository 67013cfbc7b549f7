"""harness: a transactional agent-execution harness.

Every consequential tool call runs as a transaction (preconditions against live state,
write-ahead intent, retries, postconditions against observed state, scope check, commit or
compensation), recorded in a hash-chained log, inside an :class:`Episode`.
"""

from ._json import canonical, digest
from ._version import __version__
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
)
from .suite import FieldCheck, Suite, Task, Verification, Verifier, load_suite

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

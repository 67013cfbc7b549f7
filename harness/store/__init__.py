"""The store: episodes, transactions, checkpoints, escalations and the hash-chained log.

SQLModel defines the schema and serves the queries people make (``Store.episodes()`` ...); the
per-action writes go through prebuilt SQL on a raw driver connection (:class:`EpisodeWriter`),
because an ORM round-trip per action would cost more than the action's whole budget.
Every log record carries the hash of the one before it in its episode, and the episode row
keeps the head of its chain, so an edit, a removal or a reordering is detectable.
The statuses its rows hold are string enums (:mod:`.statuses`): ``TxnStatus``,
``EpisodeStatus``, ``EscalationStatus`` and ``RunStatus``.
"""

from .jsonlines import JsonLines as JsonLines
from .records import Escalation, Transaction, Trial
from .signing import PublicKey, SigningKey
from .statuses import EpisodeStatus, EscalationStatus, RunStatus, TxnStatus
from .store import Store
from .tables import DEFAULT_URL as DEFAULT_URL
from .tables import GENESIS as GENESIS
from .tables import SCHEMA_VERSION as SCHEMA_VERSION
from .tables import (
    ChainReport,
    CheckpointRow,
    EpisodeRow,
    EscalationRow,
    FaultEventRow,
    FaultTrialRow,
    LeaseRow,
    LogRow,
    RunRow,
    SignatureRow,
    TransactionRow,
    TrialRow,
    record_hash,
)
from .tables import MetaRow as MetaRow
from .verify import Finding, VerifyReport
from .witness import Witness, WitnessReport, check_witness
from .writer import EpisodeWriter

__all__ = [
    "ChainReport",
    "CheckpointRow",
    "EpisodeRow",
    "EpisodeStatus",
    "EpisodeWriter",
    "Escalation",
    "EscalationRow",
    "EscalationStatus",
    "FaultEventRow",
    "FaultTrialRow",
    "Finding",
    "LeaseRow",
    "LogRow",
    "PublicKey",
    "RunRow",
    "RunStatus",
    "SignatureRow",
    "SigningKey",
    "Store",
    "Transaction",
    "TransactionRow",
    "Trial",
    "TrialRow",
    "TxnStatus",
    "VerifyReport",
    "Witness",
    "WitnessReport",
    "check_witness",
    "record_hash",
]

"""The hash-chain check of the store's log (mixed into :class:`~.store.Store`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._json import digest, dumps, loads
from .projection import HOT_NOTES, HOT_OUTCOMES
from .statuses import EpisodeStatus
from .tables import GENESIS, ChainReport, EpisodeRow, LogRow, record_hash

_HOT_KINDS = HOT_OUTCOMES | HOT_NOTES | {"intent"}


class _Chain:
    """``verify_chain``: every episode's chain (:func:`chain_problem`)."""

    if TYPE_CHECKING:  # provided by Store

        def episode(self, episode_id: str) -> EpisodeRow | None: ...
        def episodes(self, run_id: str | None = None) -> list[EpisodeRow]: ...
        def log(self, episode_id: str) -> list[LogRow]: ...

    def verify_chain(self, episode_id: str | None = None) -> ChainReport:
        """Recompute each hash chain; report the first altered, missing or moved record."""
        episodes = [self.episode(episode_id)] if episode_id else self.episodes()
        total = 0
        for ep in episodes:
            if ep is None:
                return ChainReport(False, 0, 0, episode_id, None, "episode not found")
            rows = self.log(ep.id)
            problem = chain_problem(ep, rows)
            if problem is not None:
                seq, reason = problem
                return ChainReport(False, len(episodes), total + seq, ep.id, seq, reason)
            total += len(rows)
        return ChainReport(True, len(episodes), total)


def chain_problem(ep: EpisodeRow, rows: list[LogRow]) -> tuple[int, str] | None:
    """The first bad record of one episode's chain, ``(seq, reason)``, or None.

    Each record must sit at its place and hash to the hash it holds, chained to the one before;
    the chain must end where the episode's row says (:func:`witness_problem`).
    """
    prev = GENESIS
    for expected_seq, row in enumerate(rows, start=1):
        if row.seq != expected_seq:
            return (
                expected_seq,
                f"record {expected_seq} is missing or out of order (found {row.seq})",
            )
        h = record_hash(prev, row.episode_id, row.seq, row.kind, row.txn_id, row.payload, row.ts)
        if h != row.hash:
            return row.seq, "content does not match its hash: the record was altered"
        prev = row.hash
    return witness_problem(ep, rows)


def witness_problem(ep: EpisodeRow, rows: list[LogRow]) -> tuple[int, str] | None:
    """Check the chain against the episode row's witness (record count and head hash).

    The witness moves with every write but the hot path's (intents, commits and remembered
    values, whose rows follow with the next write), so a crashed episode may end with those
    past it (after a rollback or an escalation, remembered values only); anything else past
    it, or a chain shorter than it, was tampered.
    """
    if len(rows) < ep.log_count:
        return (
            len(rows) + 1,
            f"chain ends at record {len(rows)} but the episode recorded {ep.log_count}: "
            "records were removed from the end",
        )
    if ep.log_count and rows[ep.log_count - 1].hash != ep.head_hash:
        return ep.log_count, "the episode's recorded head does not match this record"
    extra = rows[ep.log_count :]
    # (A remembered value may follow a rollback or an escalation too: the episode is still
    # open then, and its end's write moves the witness past it.)
    hot = _HOT_KINDS if ep.status == EpisodeStatus.RUNNING else HOT_NOTES
    if any(r.kind not in hot for r in extra):
        return (
            ep.log_count + 1,
            f"{len(extra)} record(s) after the episode's recorded head "
            f"({ep.status}): appended outside the harness",
        )
    return None


RESUMES = "resumes"
"""The key of a run's evidence that resumes append to (the rest is written once)."""


def run_binding(config: Mapping[str, Any], evidence: Mapping[str, Any]) -> dict[str, str]:
    """What every trial's start record holds of its run: the digests of the run's
    configuration and of its evidence as the run started (the resumes appended since left
    out), so that an edit of either, signed or not, disagrees with the chains
    (:func:`harness.store.verify.verify_run`)."""
    as_stored = loads(dumps({"config": dict(config), "evidence": dict(evidence)}))
    started = {k: v for k, v in as_stored["evidence"].items() if k != RESUMES}
    return {"config": digest(as_stored["config"]), "evidence": digest(started)}

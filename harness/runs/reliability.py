"""Reliability by cause: what a run injected, what the harness detected, and what it cost.

:func:`reliability_report` reads a run's store: the injected fault events and their judgement
(``hx_fault_event``, written by :mod:`harness.faults`), the per-trial effect accounting
(``hx_fault_trial``), the trials and the transactions. For each failure class it gives events
injected and detected (detection coverage = detected / injected), what the harness classified
them as, the decisions it took, detection latency and time to recover (on the trials' clock),
work lost (attempts re-executed, trials lost), blast radius (episodes one fault touched), and
whether any effect was duplicated, lost, diverged or left unaccounted for. Failures the harness
flagged with nothing injected in their episode are false positives; a clean run (no plan, or an
empty one) reports only those. Planned interruptions are counted apart from lost trials.

The report is a plain value (``to_dict()`` for JSON) so other reports and a run's
``summary.json`` can embed it; :mod:`harness.report.reliability` draws it with rich.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlmodel import col, select

from .._json import loads
from ..faults import KINDS
from ..store import (
    EpisodeRow,
    EpisodeStatus,
    FaultEventRow,
    FaultTrialRow,
    Store,
    TransactionRow,
    TxnStatus,
)
from .layout import current_trials

__all__ = [
    "EFFECTS",
    "ClassReport",
    "Flagged",
    "ReliabilityReport",
    "Spread",
    "reliability_report",
]

EFFECTS = ("duplicated", "lost", "diverged", "unaccounted", "held")
"""The effect counts of a trial's accounting (see :class:`harness.faults.TrialFaults`)."""


@dataclass(frozen=True)
class Spread:
    """How a set of durations spreads: count, median, mean and max (seconds, trial clock)."""

    n: int = 0
    median: float | None = None
    mean: float | None = None
    max: float | None = None

    @classmethod
    def of(cls, values: Iterable[float | None]) -> Spread:
        """The spread of the values that are not None."""
        xs = [float(v) for v in values if v is not None]
        if not xs:
            return cls()
        return cls(len(xs), statistics.median(xs), statistics.fmean(xs), max(xs))

    def text(self) -> str:
        """``median / max`` as a table cell."""
        if self.n == 0 or self.median is None or self.max is None:
            return "-"
        return f"{self.median:.3g} / {self.max:.3g}"


@dataclass
class ClassReport:
    """One failure class across a run.

    Attributes:
        failure_class: the injected class.
        injected: events injected.
        detected: events the harness detected (see :func:`harness.faults.judge`).
        detected_as: how the harness classified the detected events.
        decisions: the decisions it took on them.
        detect_latency: from the fault to the harness's first record of it.
        recovered: events whose transaction still committed (retried, recovered, resumed).
        recover_time: from the fault to that commit.
        re_executed: attempts the harness ran again because of an event.
        episodes: episodes with at least one event of the class.
        trials_lost: of those, trials that did not pass (planned interruptions excluded).
        planned_interruptions: trials recorded as planned interruptions.
        instances: distinct faults (a correlated or planned window is one fault).
        blast_radius_max: most episodes one fault touched.
        blast_radius_mean: mean episodes per fault.
        effects: duplicated, lost, diverged, unaccounted and held resources over the
            episodes touched.
    """

    failure_class: str
    injected: int = 0
    detected: int = 0
    detected_as: dict[str, int] = field(default_factory=dict)
    decisions: dict[str, int] = field(default_factory=dict)
    detect_latency: Spread = field(default_factory=Spread)
    recovered: int = 0
    recover_time: Spread = field(default_factory=Spread)
    re_executed: int = 0
    episodes: int = 0
    trials_lost: int = 0
    planned_interruptions: int = 0
    instances: int = 0
    blast_radius_max: int = 0
    blast_radius_mean: float = 0.0
    effects: dict[str, int] = field(default_factory=lambda: dict.fromkeys(EFFECTS, 0))

    @property
    def coverage(self) -> float | None:
        """Detected / injected (None when nothing was injected)."""
        return self.detected / self.injected if self.injected else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {**asdict(self), "coverage": self.coverage}


@dataclass(frozen=True)
class Flagged:
    """A transaction the harness flagged as failed, retried or recovered."""

    episode_id: str
    txn_id: str
    action: str
    status: str
    failure_class: str | None
    attempts: int


@dataclass
class ReliabilityReport:
    """A run's reliability by cause.

    Attributes:
        run_id: the run (None: every run in the store).
        trials: trials read.
        faulted_trials: trials with at least one injected event.
        classes: per injected class, in the taxonomy's order.
        false_positives: failures the harness flagged in episodes where nothing was injected.
        knock_on: failures flagged without a fault of their own, in episodes that had one
            (a later call failing because an earlier one did).
        clean_trials_failed: trials with nothing injected that did not pass.
        effects: duplicated, lost, diverged, unaccounted and held resources over all trials
            run under a plan.
        accounted_trials: trials whose effects were accounted (those run under a plan).
        announced: the planned interruptions the run was told about.
    """

    run_id: str | None
    trials: int
    faulted_trials: int
    classes: dict[str, ClassReport]
    false_positives: list[Flagged]
    knock_on: list[Flagged]
    clean_trials_failed: int
    effects: dict[str, int]
    accounted_trials: int
    announced: list[dict[str, Any]] = field(default_factory=list)

    @property
    def injected(self) -> int:
        """Events injected, over every class."""
        return sum(c.injected for c in self.classes.values())

    @property
    def detected(self) -> int:
        """Events detected, over every class."""
        return sum(c.detected for c in self.classes.values())

    def coverage(self, failure_class: str) -> float | None:
        """Detection coverage of one class (None if it was not injected)."""
        found = self.classes.get(failure_class)
        return None if found is None else found.coverage

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "run_id": self.run_id,
            "trials": self.trials,
            "faulted_trials": self.faulted_trials,
            "injected": self.injected,
            "detected": self.detected,
            "classes": {k: c.to_dict() for k, c in self.classes.items()},
            "false_positives": [asdict(f) for f in self.false_positives],
            "knock_on": [asdict(f) for f in self.knock_on],
            "clean_trials_failed": self.clean_trials_failed,
            "effects": dict(self.effects),
            "accounted_trials": self.accounted_trials,
            "announced": list(self.announced),
        }


def _flagged(txn: TransactionRow) -> bool:
    """Whether the harness saw something wrong in this transaction (refusals aside)."""
    if txn.status in (TxnStatus.RECOVERED, TxnStatus.ABANDONED) or txn.attempts > 1:
        return True
    return txn.status == TxnStatus.FAILED and txn.failure_class not in (None, "precondition")


def _transactions(store: Store, episode_ids: Sequence[str]) -> list[TransactionRow]:
    out: list[TransactionRow] = []
    running: list[str] = []
    with store.session() as s:
        for i in range(0, len(episode_ids), 500):
            chunk = list(episode_ids[i : i + 500])
            q = select(TransactionRow).where(col(TransactionRow.episode_id).in_(chunk))
            out.extend(s.exec(q))
            eq = select(EpisodeRow.id).where(
                col(EpisodeRow.id).in_(chunk), EpisodeRow.status == EpisodeStatus.RUNNING
            )
            running.extend(s.exec(eq))
    # An episode that never finished may hold commits whose rows were not written yet.
    have = {t.id for t in out}
    for episode_id in running:
        tail = store.unmaterialised(episode_id, have)
        if tail is not None:
            out.extend(tail[0])
    return out


def reliability_report(store: Store, run_id: str | None = None) -> ReliabilityReport:
    """Read one run (or every run) of ``store`` into a :class:`ReliabilityReport`."""
    trials = current_trials(store.trial_rows(run_id))  # (each trial's last attempt)
    with store.session() as s:
        eq = select(FaultEventRow)
        tq = select(FaultTrialRow)
        if run_id is not None:
            eq = eq.where(FaultEventRow.run_id == run_id)
            tq = tq.where(FaultTrialRow.run_id == run_id)
        events = list(s.exec(eq))
        accounts = {r.id: r for r in s.exec(tq)}
    by_episode: dict[str, list[FaultEventRow]] = defaultdict(list)
    for ev in events:
        by_episode[ev.episode_id].append(ev)
    trial_of = {t.episode_id: t for t in trials}
    planned = {
        t.episode_id
        for t in trials
        if t.infra_error and loads(t.agent_meta or "{}").get("interruption") == "planned"
    }
    classes: dict[str, ClassReport] = {}
    for kind in [k for k in KINDS if any(e.kind == k for e in events)]:
        evs = [e for e in events if e.kind == kind]
        touched = sorted({e.episode_id for e in evs})
        radius: dict[str, set[str]] = defaultdict(set)
        for e in evs:
            radius[e.instance].add(e.episode_id)
        sizes = [len(v) for v in radius.values()]
        effects = dict.fromkeys(EFFECTS, 0)
        for ep in touched:
            acc = accounts.get(ep)
            if acc is not None:
                for name in EFFECTS:
                    effects[name] += int(getattr(acc, name))
        lost = [
            ep for ep in touched if ep in trial_of and not trial_of[ep].passed and ep not in planned
        ]
        classes[kind] = ClassReport(
            failure_class=kind,
            injected=len(evs),
            detected=sum(e.detected for e in evs),
            detected_as=dict(Counter(e.detected_as or "undetected" for e in evs)),
            decisions=dict(Counter(e.decision for e in evs if e.decision)),
            detect_latency=Spread.of(e.detect_latency for e in evs if e.detected),
            recovered=sum(e.recovered for e in evs),
            recover_time=Spread.of(e.recover_time for e in evs if e.recovered),
            re_executed=sum(e.re_executed for e in evs),
            episodes=len(touched),
            trials_lost=len(lost),
            planned_interruptions=len([ep for ep in touched if ep in planned]),
            instances=len(radius),
            blast_radius_max=max(sizes, default=0),
            blast_radius_mean=statistics.fmean(sizes) if sizes else 0.0,
            effects=effects,
        )
    faulted_txns = {e.txn_id for e in events if e.txn_id}
    false_positives: list[Flagged] = []
    knock_on: list[Flagged] = []
    for txn in _transactions(store, [t.episode_id for t in trials]):
        if not _flagged(txn) or txn.id in faulted_txns:
            continue
        flag = Flagged(
            txn.episode_id, txn.id, txn.action, txn.status, txn.failure_class, txn.attempts
        )
        (knock_on if txn.episode_id in by_episode else false_positives).append(flag)
    totals = dict.fromkeys(EFFECTS, 0)
    for acc in accounts.values():
        for name in EFFECTS:
            totals[name] += int(getattr(acc, name))
    announced: list[dict[str, Any]] = []
    for run in store.runs():
        if run_id is None or run.id == run_id:
            announced += loads(run.evidence or "{}").get("faults", {}).get("announced", [])
    return ReliabilityReport(
        run_id=run_id,
        trials=len(trials),
        faulted_trials=len([t for t in trials if t.episode_id in by_episode]),
        classes=classes,
        false_positives=false_positives,
        knock_on=knock_on,
        clean_trials_failed=len(
            [t for t in trials if t.episode_id not in by_episode and not t.passed]
        ),
        effects=totals,
        accounted_trials=len(accounts),
        announced=announced,
    )

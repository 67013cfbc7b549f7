"""The report model: a run folder read into counts, estimates, the null model and evidence.

``open_run`` opens ``logs/<run>`` for reading (and refuses, writing nothing, a path that is not
a run folder); ``build_report`` turns its trials into a :class:`Report` under a stated
infrastructure-error policy; ``compare_reports`` pairs two reports on their shared tasks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._json import loads_or
from ..errors import HarnessError, RunNotFound
from ..runs.judge import TRIAL_CLASSES, FailedTrial, trial_class
from ..runs.layout import OpenRun, open_run
from ..runs.output import finite
from ..runs.reliability import ReliabilityReport, reliability_report
from ..stats import (
    INTERVAL_METHODS,
    Estimate,
    InfraPolicy,
    NullModel,
    SelfConditioning,
    SuiteCurve,
    apply_infra_policy,
    fit_step_success,
    null_model,
    paired_difference,
    pass_hat_k,
    self_conditioning,
    suite_curve,
    suite_pass_hat_k,
)
from ..store import RunStatus, TrialRow
from ..store.records import trial_failures, trial_steps

__all__ = [
    "COMPARISON_FORMAT",
    "INFRA_DESCRIPTIONS",
    "PLANNED_CAUSE",
    "REPORT_FORMAT",
    "REPORT_VERSION",
    "TABLE_KS",
    "Comparison",
    "InfraFailure",
    "Report",
    "TaskResult",
    "build_report",
    "compare_reports",
    "infra_cause",
    "load_report",
    "table_ks",
]

REPORT_FORMAT = "harness.report"
REPORT_VERSION = 1
COMPARISON_FORMAT = "harness.comparison"

INFRA_DESCRIPTIONS: Mapping[str, str] = {
    "fail": "infrastructure errors count as failed trials (tau-bench's convention)",
    "exclude": "infrastructure errors are left out of the trial counts (tau2-bench's convention)",
}


# The k values a table shows without --all-k: every k up to 10, then the powers of two.
TABLE_KS = 10


def table_ks(n: int, *, all_k: bool = False) -> list[int]:
    """The k values a pass^k table shows for ``n`` trials per task: 1..10, the powers of two
    above, and ``n`` itself (every k from 1 to ``n`` with ``all_k``)."""
    if all_k or n <= TABLE_KS:
        return list(range(1, n + 1))
    powers = {1 << i for i in range(n.bit_length()) if TABLE_KS < 1 << i <= n}
    return sorted({*range(1, TABLE_KS + 1), *powers, n})


PLANNED_CAUSE = "planned interruption (fault plan)"


def infra_cause(row: TrialRow) -> str:
    """Why a trial ended in an infrastructure error, as its row records it (``agent_meta``)."""
    meta = loads_or(row.agent_meta, {})
    meta = meta if isinstance(meta, dict) else {}
    error = str(meta.get("error") or "").strip()
    if meta.get("interruption") == "planned":
        return PLANNED_CAUSE + (f": {error}" if error else "")
    return error or "infrastructure error (no cause recorded)"


@dataclass(frozen=True)
class InfraFailure:
    """One trial that ended in an infrastructure error, and why.

    Attributes:
        task_id, trial, episode_id: which trial (``harness audit RUN --episode ID`` shows it).
        cause: the error that ended it, e.g. ``ModelServerError: cannot reach the server: ...``.
    """

    task_id: str
    trial: int
    episode_id: str
    cause: str

    @property
    def planned(self) -> bool:
        """An interruption a fault plan announced: asked for, not suffered."""
        return self.cause.startswith(PLANNED_CAUSE)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {**asdict(self), "planned": self.planned}


# --------------------------------------------------------------------------------------------
# The report model.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskResult:
    """One task's trials as the report counts them.

    Attributes:
        task_id: the task.
        version: its version in the run.
        successes: passed trials (an infrastructure error never passes).
        trials: trials counted under the infrastructure-error policy.
        run_trials: trials run, infrastructure errors included.
        infra_errors: trials that ended in an infrastructure error.
        steps: required steps (reference writes) the null model uses.
        partial: mean partial credit over counted trials that have one, else None.
        cells: per trial index, ``pass``, ``fail``, ``infra`` or ``missing`` (the heat map).
    """

    task_id: str
    version: str
    successes: int
    trials: int
    run_trials: int
    infra_errors: int
    steps: int
    partial: float | None
    cells: tuple[str, ...]

    def pass_hat(self, k: int) -> float | None:
        """The task's own pass^k, C(c, k) / C(n, k) (None when k exceeds its trials)."""
        return (
            None if not 0 < k <= self.trials else float(pass_hat_k(self.trials, self.successes, k))
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "task_id": self.task_id,
            "version": self.version,
            "successes": self.successes,
            "trials": self.trials,
            "run_trials": self.run_trials,
            "infra_errors": self.infra_errors,
            "steps": self.steps,
            "partial": self.partial,
            "cells": list(self.cells),
            "pass_hat_k": [self.pass_hat(k) for k in range(1, self.trials + 1)],
        }


@dataclass(frozen=True)
class Report:
    """Everything ``harness report`` shows about one run.

    Attributes:
        run_id, suite, status, folder: which run.
        infra_policy: how infrastructure errors were counted (``fail`` or ``exclude``).
        confidence: nominal coverage of every interval.
        tasks: per-task counts for the tasks estimated from, in run order.
        dropped_tasks: tasks left with no trials under ``exclude``.
        curve: pass^k and pass@k for k = 1..n with intervals.
        failures: failed tool calls by class, over all trials.
        failed_trials: every counted trial that failed, with its class (one each, so the
            classes add up to the failures), in task order.
        faults: for a run under a fault plan, what it injected, what was detected and what it
            cost, by class (None: no plan).
        outcomes: episodes by outcome, over all trials.
        infra_errors: trials that ended in an infrastructure error.
        partial_mean: mean partial credit over counted trials that have one.
        partial_trials: how many trials that mean is over.
        null: the ``p^n`` null model (None if no task has required steps).
        self_conditioning: error rates after an error versus with a clean history.
        evidence: the run's evidence record.
        config: how the run was started.
        infra_failures: every trial that ended in an infrastructure error, with its cause.
        trials_run: trials run, infrastructure errors and dropped tasks included.
    """

    run_id: str
    suite: str
    status: str
    folder: str
    infra_policy: InfraPolicy
    confidence: float
    tasks: tuple[TaskResult, ...]
    dropped_tasks: tuple[str, ...]
    curve: SuiteCurve
    failures: dict[str, int]
    outcomes: dict[str, int]
    infra_errors: int
    partial_mean: float | None
    partial_trials: int
    null: NullModel | None
    self_conditioning: SelfConditioning | None
    evidence: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    infra_failures: tuple[InfraFailure, ...] = ()
    trials_run: int = 0
    failed_trials: tuple[FailedTrial, ...] = ()
    faults: ReliabilityReport | None = None

    def failed_by_class(self) -> dict[str, int]:
        """Counted failed trials by class, the most frequent first (they add up to the
        counted trials that did not pass)."""
        counts = Counter(f.cls for f in self.failed_trials)
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    @property
    def transactions(self) -> bool:
        """Whether the run's tools ran as transactions (False: called bare,
        ``run_trials(transactions=False)``; runs from before the option: True)."""
        return bool(self.evidence.get("transactions", self.config.get("transactions", True)))

    @property
    def infra_dominates(self) -> bool:
        """More than half of the trials run ended in an infrastructure error: the figures
        measure the infrastructure, not the agent. A fault plan's planned interruptions were
        asked for and do not count."""
        suffered = sum(1 for f in self.infra_failures if not f.planned)
        return 2 * suffered > self.trials_run

    def infra_causes(self) -> list[tuple[str, list[InfraFailure]]]:
        """Infrastructure failures grouped by cause, the most frequent first."""
        groups: dict[str, list[InfraFailure]] = {}
        for f in self.infra_failures:
            groups.setdefault(f.cause, []).append(f)
        return sorted(groups.items(), key=lambda item: -len(item[1]))

    @property
    def n_tasks(self) -> int:
        """T: tasks estimated from."""
        return len(self.tasks)

    @property
    def n(self) -> int:
        """n: the smallest trial count of a task (pass^k is reported for k = 1..n)."""
        return min(t.trials for t in self.tasks)

    @property
    def n_max(self) -> int:
        """The largest trial count of a task (differs from ``n`` after an interruption)."""
        return max(t.trials for t in self.tasks)

    @property
    def n_trials(self) -> int:
        """Trials counted, over all tasks."""
        return sum(t.trials for t in self.tasks)

    def pass_hat(self, k: int) -> Estimate:
        """Suite pass^k at ``k``, with its interval."""
        return self.curve.pass_hat(k)

    def pass_at(self, k: int) -> Estimate:
        """Suite pass@k at ``k``, with its interval."""
        return self.curve.pass_at(k)

    def horizon(self, s: float = 0.5) -> tuple[float, float, float] | None:
        """Steps until an error-free run has chance ``s`` under ``p^n``: value, low, high."""
        return None if self.null is None else self.null.horizon(s)

    def methods(self) -> dict[str, str]:
        """The interval methods this report uses, with what each one is."""
        used = sorted({*self.curve.hat_methods, *self.curve.at_methods})
        if self.null is not None:
            used.append(self.null.p.method)
        return {m: INTERVAL_METHODS.get(m, m) for m in dict.fromkeys(used)}

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data, with its format name and version."""
        horizon = self.horizon()
        sc = self.self_conditioning
        data: dict[str, Any] = finite(
            {
                "format": REPORT_FORMAT,
                "version": REPORT_VERSION,
                "run": {
                    "id": self.run_id,
                    "suite": self.suite,
                    "status": self.status,
                    "folder": self.folder,
                },
                "infra_policy": {
                    "policy": self.infra_policy,
                    "description": INFRA_DESCRIPTIONS[self.infra_policy],
                    "infra_errors": self.infra_errors,
                    "trials_run": self.trials_run,
                    "dominates": self.infra_dominates,
                    "failures": [f.to_dict() for f in self.infra_failures],
                    "dropped_tasks": list(self.dropped_tasks),
                },
                "confidence": self.confidence,
                "T": self.n_tasks,
                "n": self.n,
                "n_max": self.n_max,
                "trials": self.n_trials,
                "pass_hat_k": [self.pass_hat(int(k)).to_dict() for k in self.curve.ks.tolist()],
                "pass_at_k": [self.pass_at(int(k)).to_dict() for k in self.curve.ks.tolist()],
                "methods": self.methods(),
                "failed_trials_by_class": self.failed_by_class(),
                "trial_classes": {c: TRIAL_CLASSES[c] for c in self.failed_by_class()},
                "failed_trials": [f.to_dict() for f in self.failed_trials],
                "failures_by_class": dict(sorted(self.failures.items())),
                "outcomes": dict(sorted(self.outcomes.items())),
                "partial_credit": {
                    "mean": self.partial_mean,
                    "trials": self.partial_trials,
                    "note": "reported separately; pass/fail does not use it",
                },
                "null_model": None if self.null is None else self.null.to_dict(),
                "horizon": None
                if horizon is None
                else {"s": 0.5, "value": horizon[0], "low": horizon[1], "high": horizon[2]},
                "self_conditioning": None if sc is None else sc.to_dict(),
                "tasks": [t.to_dict() for t in self.tasks],
                "faults": None if self.faults is None else self.faults.to_dict(),
                "evidence": self.evidence,
                "config": self.config,
            }
        )
        return data


def _task_order(data: OpenRun) -> list[str]:
    seen = {t.task_id for t in data.trials}
    listed = [t for t in data.config.get("tasks", []) if t in seen]
    return listed + sorted(seen - set(listed))


def build_report(data: OpenRun, *, infra: InfraPolicy = "fail", confidence: float = 0.95) -> Report:
    """The report of an opened run.

    Args:
        data: from ``open_run``.
        infra: ``fail`` counts infrastructure errors as failed trials (tau-bench); ``exclude``
            leaves them out (tau2-bench), dropping tasks left with no trials.
        confidence: nominal coverage of every interval.

    Raises:
        RunNotFound: under ``exclude``, every trial was an infrastructure error.
        ValueError: an unknown policy or a confidence outside (0, 1).
    """
    if infra not in INFRA_DESCRIPTIONS:
        raise ValueError(f"infra must be 'fail' or 'exclude', got {infra!r}")
    by_task: dict[str, list[TrialRow]] = {}
    for row in data.trials:
        by_task.setdefault(row.task_id, []).append(row)
    order = _task_order(data)
    ids = list(order)
    rows = [sorted(by_task[t], key=lambda r: r.trial) for t in ids]
    run_n = [len(r) for r in rows]
    succ = [sum(1 for x in r if x.passed and not x.infra_error) for r in rows]
    infra_n = [sum(1 for x in r if x.infra_error) for r in rows]
    s, n = apply_infra_policy(succ, run_n, infra_n, infra)
    counted = [
        [x for x in r if infra == "fail" or not x.infra_error] for r in rows
    ]  # the trials behind the counts
    keep = [i for i in range(len(ids)) if int(n[i]) > 0]
    dropped = tuple(ids[i] for i in range(len(ids)) if int(n[i]) == 0)
    if not keep:
        raise RunNotFound(
            data.where,
            f"run {data.run.id}: every trial ended in an infrastructure error, so nothing is "
            "left to estimate under --infra exclude; use --infra fail to count them as failures",
        )
    width = max(x.trial for x in data.trials) + 1
    tasks = []
    step_lists: list[list[bool]] = []
    partials: list[float] = []
    for i in keep:
        steps_here = [trial_steps(x) for x in counted[i]]
        step_lists.extend(steps_here)
        part = [x.partial for x in counted[i] if x.partial is not None]
        partials.extend(part)
        cells = ["missing"] * width
        for x in rows[i]:
            cells[x.trial] = "infra" if x.infra_error else ("pass" if x.passed else "fail")
        tasks.append(
            TaskResult(
                task_id=ids[i],
                version=rows[i][0].task_version,
                successes=int(s[i]),
                trials=int(n[i]),
                run_trials=run_n[i],
                infra_errors=infra_n[i],
                steps=max((len(st) for st in steps_here), default=0),
                partial=sum(part) / len(part) if part else None,
                cells=tuple(cells),
            )
        )
    curve = suite_curve([t.successes for t in tasks], [t.trials for t in tasks], None, confidence)
    null: NullModel | None = None
    if any(step_lists):
        p = fit_step_success(step_lists, confidence=confidence)
        null = null_model(
            p,
            [t.steps for t in tasks],
            [t.successes / t.trials for t in tasks],
            trials=[t.trials for t in tasks],
            confidence=confidence,
        )
    # Episodes with no required steps carry no step history; they are left out (and
    # ``stats.self_conditioning`` miscounts histories when an empty episode comes first).
    histories = [st for st in step_lists if st]
    sc = self_conditioning(histories, confidence) if histories else None
    failures: Counter[str] = Counter()
    for row in data.trials:
        failures.update(trial_failures(row))
    return Report(
        run_id=data.run.id,
        suite=data.run.suite,
        status=data.run.status,
        folder=data.where,
        infra_policy=infra,
        confidence=curve.confidence,
        tasks=tuple(tasks),
        dropped_tasks=dropped,
        curve=curve,
        failures=dict(failures),
        outcomes=dict(Counter(row.outcome for row in data.trials)),
        infra_errors=sum(infra_n),
        partial_mean=sum(partials) / len(partials) if partials else None,
        partial_trials=len(partials),
        null=null,
        self_conditioning=sc,
        evidence=data.evidence,
        config=data.config,
        infra_failures=tuple(
            InfraFailure(r.task_id, r.trial, r.episode_id, infra_cause(r))
            for task in rows
            for r in task
            if r.infra_error
        ),
        trials_run=len(data.trials),
        failed_trials=tuple(
            f for i in keep for x in counted[i] if (f := trial_class(x)) is not None
        ),
        faults=reliability_report(data.store, data.run.id) if "faults" in data.evidence else None,
    )


def load_report(
    path: str | Path, *, infra: InfraPolicy = "fail", confidence: float = 0.95
) -> Report:
    """Open the run folder ``path`` and build its report (see ``build_report``)."""
    with open_run(path, finished=True) as data:
        return build_report(data, infra=infra, confidence=confidence)


# --------------------------------------------------------------------------------------------
# Paired comparison of two runs.
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Run A against run B on the tasks both ran: pass^k of each and the paired difference.

    Attributes:
        a, b: the two reports.
        tasks: shared task ids, in A's order.
        only_a, only_b: tasks one run has and the other does not (not compared).
        changed: shared tasks whose version or content digest differs between the runs.
        rows: per k, ``(pass^k of A, pass^k of B, A - B)`` on the shared tasks.
        cut_k: the k the runs were planned for but cannot be compared at (a run not finished,
            or fewer trials of some shared task than planned): ``kmax + 1 .. planned``.
    """

    a: Report
    b: Report
    tasks: tuple[str, ...]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    changed: tuple[str, ...]
    rows: tuple[tuple[Estimate, Estimate, Estimate], ...]
    cut_k: tuple[int, ...] = ()

    @property
    def unfinished(self) -> tuple[str, ...]:
        """Which of ``"a"`` and ``"b"`` is a run not finished (running, or interrupted)."""
        return tuple(
            side for side, r in (("a", self.a), ("b", self.b)) if r.status != RunStatus.FINISHED
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data, with its format name and version."""
        data: dict[str, Any] = finite(
            {
                "format": COMPARISON_FORMAT,
                "version": REPORT_VERSION,
                "a": {
                    "run": self.a.run_id,
                    "status": self.a.status,
                    "planned_trials": planned_trials(self.a),
                    "folder": self.a.folder,
                    "suite": self.a.suite,
                    "transactions": self.a.transactions,
                },
                "b": {
                    "run": self.b.run_id,
                    "status": self.b.status,
                    "planned_trials": planned_trials(self.b),
                    "folder": self.b.folder,
                    "suite": self.b.suite,
                    "transactions": self.b.transactions,
                },
                "infra_policy": {
                    "policy": self.a.infra_policy,
                    "description": INFRA_DESCRIPTIONS[self.a.infra_policy],
                    "infra_errors": {"a": self.a.infra_errors, "b": self.b.infra_errors},
                },
                "confidence": self.a.confidence,
                "T": len(self.tasks),
                "tasks": list(self.tasks),
                "only_a": list(self.only_a),
                "only_b": list(self.only_b),
                "changed": list(self.changed),
                "unfinished": list(self.unfinished),
                "cut_k": list(self.cut_k),
                "rows": [
                    {
                        "k": d.k,
                        "a": ea.to_dict(),
                        "b": eb.to_dict(),
                        "difference": d.to_dict(),
                    }
                    for ea, eb, d in self.rows
                ],
                "methods": {
                    m: INTERVAL_METHODS.get(m, m)
                    for m in dict.fromkeys(e.method for row in self.rows for e in row)
                },
            }
        )
        return data


def planned_trials(report: Report) -> int:
    """How many trials of each task the run was started for (its ``--trials``; a run that
    does not record it: the most trials any task has)."""
    planned = report.config.get("trials")
    if isinstance(planned, int) and not isinstance(planned, bool) and planned > 0:
        return max(planned, report.n_max)
    return report.n_max


def _task_digests(report: Report) -> dict[str, Any]:
    suite = report.evidence.get("suite") or {}
    tasks = suite.get("tasks") if isinstance(suite, dict) else None
    return dict(tasks) if isinstance(tasks, dict) else {}


def compare_reports(a: Report, b: Report) -> Comparison:
    """Pair run ``a`` with run ``b`` on their shared tasks (``stats.paired_difference``).

    Raises:
        HarnessError: the runs share no task, or used different confidence levels or
            infrastructure-error policies.
    """
    if a.infra_policy != b.infra_policy or a.confidence != b.confidence:
        raise HarnessError(
            "compare: both reports must use the same --infra policy and confidence "
            f"({a.infra_policy}/{a.confidence} vs {b.infra_policy}/{b.confidence})"
        )
    ta = {t.task_id: t for t in a.tasks}
    tb = {t.task_id: t for t in b.tasks}
    shared = tuple(t for t in ta if t in tb)
    if not shared:
        raise HarnessError(
            f"compare: runs {a.run_id} and {b.run_id} share no task; a paired comparison needs "
            "the same tasks in both runs"
        )
    da, db = _task_digests(a), _task_digests(b)
    changed = tuple(
        t
        for t in shared
        if ta[t].version != tb[t].version
        or (t in da and t in db and da[t].get("digest") != db[t].get("digest"))
    )
    sa = [ta[t].successes for t in shared]
    na = [ta[t].trials for t in shared]
    sb = [tb[t].successes for t in shared]
    nb = [tb[t].trials for t in shared]
    kmax = min(min(na), min(nb))
    rows = tuple(
        (
            suite_pass_hat_k(sa, na, k, a.confidence),
            suite_pass_hat_k(sb, nb, k, a.confidence),
            paired_difference(sa, na, sb, nb, k, a.confidence),
        )
        for k in range(1, kmax + 1)
    )
    return Comparison(
        a=a,
        b=b,
        tasks=shared,
        only_a=tuple(t for t in ta if t not in tb),
        only_b=tuple(t for t in tb if t not in ta),
        changed=changed,
        rows=rows,
        cut_k=tuple(range(kmax + 1, max(planned_trials(a), planned_trials(b)) + 1)),
    )

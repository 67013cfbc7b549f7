"""Fault injection: seeded, declarative fault plans applied to one trial's tools at a time.

A :class:`FaultPlan` (pydantic; loaded from JSON or TOML with :meth:`FaultPlan.load`) lists
faults across the failure taxonomy, each aimed at a *fault domain*: one tool
(``tool = "cancel_pending_order"``), a service (``service = "orders"``, a named group of tools
from the plan's ``[services]``, or the built-in ``writes`` and ``reads``), or the whole worker
(``worker = true``: every tool the trial calls).

=================  =========================================================================
kind               what the call does
=================  =========================================================================
``fail_stop``      raises before running (``transient = true``: a ``TransientError``)
``fail_slow``      waits ``delay`` seconds on the trial's clock, then runs; ``growth`` > 1
                   makes each further slow call of the trial slower (progressive degradation)
``silent``         runs, returns its answer, but its effect is ``missing``, ``partial`` or
                   ``wrong`` (the real effect, undone or altered through the state adapter)
``lost_ack``       runs (the effect is applied), then raises (``then = "raise"``) or the
                   worker dies before the answer comes back (``then = "crash"``)
``correlated``     the domain is down for a window (``trials = [start, end)`` by trial index,
                   or ``seconds = [start, end)`` since the run started), across every trial in it
``compensation``   runs with a wrong effect, so the harness must undo it, and the undo fails
                   (``undo = "raise"``, or ``"incomplete"``: returns without restoring)
``planned``        an announced interruption: during its window, calls to the domain are
                   refused; the run records the announcement and the trials it interrupted
=================  =========================================================================

Selection is seeded: whether the n-th call of a trial into a domain is faulted depends only on
the plan's seed, the task, the trial index, the tool and n, never on timing or worker order.
``calls = [1, 3]`` picks exact call numbers; ``rate`` draws. Faults with a ``rate`` share one
draw per call (each takes its own slice of [0, 1)), so a call gets at most one fault and the
rates of faults sharing a tool must sum to at most 1. ``correlated`` and ``planned`` faults are
states of their domain, checked first.

An :class:`Injector` wraps one trial's tools (``Action.fn`` of each action, the plain callables
of ``env.tools``, and each action's compensation) and records every fault it injects as a
:class:`FaultEvent` (class, tool, trial, transaction, attempt, time on the trial's clock). After
the trial, :meth:`Injector.finish` reads the harness's own records (transaction rows, the log,
escalations) to judge each event: detected or not, as which class, the decision taken, detection
latency, time to recover, work re-executed; and compares the final state with what the committed
transactions account for (lost, diverged, unaccounted, duplicated effects). Both land in the
store (``hx_fault_event``, ``hx_fault_trial``) for :mod:`harness.report.reliability` to report.

Modules: ``plan`` (the models, loading, checks against the tools), ``errors`` (what faulted tools
raise), ``injector`` (the wrapping), ``alter`` (missing, partial and wrong effects), ``events``
(events, their judgement, the effect accounting).
"""

from .errors import (
    CompensationBroken,
    FaultPlanError,
    InjectedError,
    InjectedFault,
    InjectedTransientError,
    LostAcknowledgement,
    PlannedInterruption,
    ServiceDown,
    TransientServiceDown,
    WorkerCrash,
)
from .events import FaultEvent, TrialFaults, account, judge
from .injector import Injector
from .plan import (
    BUILTIN_SERVICES,
    KINDS,
    CompensationFault,
    Correlated,
    FailSlow,
    FailStop,
    Fault,
    FaultPlan,
    LostAck,
    Planned,
    RunFaults,
    Silent,
    load_faults,
)

__all__ = [
    "BUILTIN_SERVICES",
    "KINDS",
    "CompensationBroken",
    "CompensationFault",
    "Correlated",
    "FailSlow",
    "FailStop",
    "Fault",
    "FaultEvent",
    "FaultPlan",
    "FaultPlanError",
    "InjectedError",
    "InjectedFault",
    "InjectedTransientError",
    "Injector",
    "LostAck",
    "LostAcknowledgement",
    "Planned",
    "PlannedInterruption",
    "RunFaults",
    "ServiceDown",
    "Silent",
    "TransientServiceDown",
    "TrialFaults",
    "WorkerCrash",
    "account",
    "judge",
    "load_faults",
]

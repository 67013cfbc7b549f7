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
store (``hx_fault_event``, ``hx_fault_trial``) for :mod:`harness.reliability` to report.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import inspect
import json
import time
import tomllib
from collections import Counter, defaultdict
from collections.abc import Callable, Generator, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    model_validator,
)

from ._json import canonical, dumps, loads
from .action import Action, Context, current_context
from .clock import Clock, SystemClock
from .errors import ConfigurationError
from .policy import Policy, TransientError
from .store import FaultEventRow, FaultTrialRow, Store, TransactionRow
from .testing import FakeClock
from .transaction import observed_changes

if TYPE_CHECKING:
    from .store import EscalationRow, LogRow
    from .suite import Suite

__all__ = [
    "BUILTIN_SERVICES",
    "KINDS",
    "CompensationBroken",
    "Fault",
    "FaultEvent",
    "FaultPlan",
    "FaultPlanError",
    "InjectedError",
    "InjectedFault",
    "InjectedTransientError",
    "Injector",
    "LostAcknowledgement",
    "PlannedInterruption",
    "RunFaults",
    "ServiceDown",
    "TransientServiceDown",
    "TrialFaults",
    "WorkerCrash",
    "load_faults",
]

KINDS = (
    "fail_stop",
    "fail_slow",
    "silent",
    "lost_ack",
    "correlated",
    "compensation",
    "planned",
)
"""The fault classes a plan can inject, in the taxonomy's order."""

BUILTIN_SERVICES = ("reads", "writes")
"""Services every plan knows: ``writes`` (the mutating actions) and ``reads`` (every other tool)."""

_EFFECT_KINDS = frozenset({"silent", "lost_ack", "compensation"})
"""Kinds that act on a write's real effect: they apply to mutating actions only."""

_WINDOWED = frozenset({"correlated", "planned"})


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


# --------------------------------------------------------------------------------------------
# The plan.
# --------------------------------------------------------------------------------------------


class _Fault(BaseModel):
    """What every fault has: a name, one fault domain, and which calls it hits."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str | None = None
    tool: str | None = None
    service: str | None = None
    worker: bool = False
    rate: float = Field(1.0, ge=0.0, le=1.0)
    calls: tuple[PositiveInt, ...] | None = None
    max_per_trial: PositiveInt | None = None
    trials: tuple[NonNegativeInt, NonNegativeInt] | None = None
    seconds: tuple[NonNegativeFloat, NonNegativeFloat] | None = None
    tasks: tuple[str, ...] | None = None

    @model_validator(mode="after")
    def _one_domain_one_window(self) -> _Fault:
        given = [self.tool is not None, self.service is not None, self.worker]
        if sum(given) != 1:
            raise ValueError(
                'give exactly one fault domain: tool = "<name>", service = "<name>" or '
                "worker = true"
            )
        if self.calls is not None and self.rate != 1.0:
            raise ValueError("give rate or calls, not both (calls picks exact call numbers)")
        if self.trials is not None and self.seconds is not None:
            raise ValueError(
                "a window is trials = [start, end) or seconds = [start, end), not both"
            )
        for label, window in (("trials", self.trials), ("seconds", self.seconds)):
            if window is not None and window[0] >= window[1]:
                raise ValueError(f"{label} = [start, end) needs start < end, got {list(window)}")
        return self

    @property
    def domain(self) -> str:
        """The fault domain as text: ``tool:x``, ``service:y`` or ``worker``."""
        if self.tool is not None:
            return f"tool:{self.tool}"
        if self.service is not None:
            return f"service:{self.service}"
        return "worker"

    @property
    def window(self) -> str | None:
        """The window as text, if any."""
        if self.trials is not None:
            return f"trials [{self.trials[0]}, {self.trials[1]})"
        if self.seconds is not None:
            return f"seconds [{self.seconds[0]:g}, {self.seconds[1]:g})"
        return None


class _Windowed(_Fault):
    @model_validator(mode="after")
    def _needs_window(self) -> _Windowed:
        if self.trials is None and self.seconds is None:
            raise ValueError(
                "needs a window: trials = [start, end) (trial indices) or seconds = [start, end) "
                "(since the run started)"
            )
        return self


class FailStop(_Fault):
    """The call raises before running."""

    kind: Literal["fail_stop"]
    transient: bool = True


class FailSlow(_Fault):
    """The call waits ``delay`` seconds (times ``growth`` per earlier slow call), then runs."""

    kind: Literal["fail_slow"]
    delay: PositiveFloat
    growth: float = Field(1.0, ge=1.0)


class Silent(_Fault):
    """The call returns success, but its effect is missing, partial or wrong."""

    kind: Literal["silent"]
    mode: Literal["missing", "partial", "wrong"] = "missing"


class LostAck(_Fault):
    """The effect is applied, then the call raises or the worker dies."""

    kind: Literal["lost_ack"]
    then: Literal["raise", "crash"] = "raise"


class Correlated(_Windowed):
    """The domain is down (or slow, with ``delay``) for a window, across trials."""

    kind: Literal["correlated"]
    transient: bool = True
    delay: PositiveFloat | None = None


class CompensationFault(_Fault):
    """The call leaves a wrong effect and the undo the harness runs for it fails."""

    kind: Literal["compensation"]
    undo: Literal["raise", "incomplete"] = "raise"


class Planned(_Windowed):
    """An announced interruption of the domain during its window."""

    kind: Literal["planned"]
    notice: str = "scheduled maintenance"


Fault = Annotated[
    FailStop | FailSlow | Silent | LostAck | Correlated | CompensationFault | Planned,
    Field(discriminator="kind"),
]
"""One fault of a plan, told apart by its ``kind``."""


class FaultPlan(BaseModel):
    """A seeded, declarative set of faults to inject into a run's trials.

    Args:
        version: the plan format's version (1).
        seed: the seed of every draw.
        clock: ``fake`` (default: each trial runs on a :class:`~harness.testing.FakeClock`, so
            delays and retry back-offs take no real time and latencies are simulated seconds)
            or ``real``.
        timeout: the per-attempt timeout (seconds) the harness runs with when its policy gives
            none; without one, a slow call is never a ``fail_slow`` failure.
        max_resumes: how many injected worker crashes one trial is resumed from.
        services: named groups of tools (``orders = ["cancel_pending_order", ...]``).
        faults: the faults.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: Literal[1] = 1
    seed: int = 0
    clock: Literal["fake", "real"] = "fake"
    timeout: PositiveFloat | None = None
    max_resumes: NonNegativeInt = 10
    services: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    faults: tuple[Fault, ...] = ()

    @model_validator(mode="after")
    def _names_resolve(self) -> FaultPlan:
        clash = sorted(set(self.services) & set(BUILTIN_SERVICES))
        if clash:
            raise ValueError(f"services: {', '.join(clash)} is built in; name yours otherwise")
        known = sorted({*self.services, *BUILTIN_SERVICES})
        for i, fault in enumerate(self.faults):
            if fault.service is not None and fault.service not in known:
                raise ValueError(
                    f"faults[{i}] ({fault.kind}): no service {fault.service!r}; services: "
                    f"{', '.join(known)} (define yours under [services])"
                )
        names = [f.name for f in self.faults if f.name is not None]
        repeated = sorted(n for n, c in Counter(names).items() if c > 1)
        if repeated:
            raise ValueError(f"faults: names must be unique, {', '.join(repeated)} repeats")
        return self

    # --- building ---
    @classmethod
    def parse(cls, data: Any, *, source: str = "fault plan") -> FaultPlan:
        """A plan from parsed JSON/TOML data; raises :class:`FaultPlanError` naming each field."""
        if not isinstance(data, Mapping):
            raise FaultPlanError(f"{source}: a fault plan is a table/object, not {type(data)}")
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise FaultPlanError(_explain(exc, source)) from None

    @classmethod
    def load(cls, path: str | Path) -> FaultPlan:
        """Read a plan from a ``.json`` or ``.toml`` file."""
        p = Path(path)
        if p.suffix not in (".json", ".toml"):
            raise FaultPlanError(f"{p}: a fault plan is a .json or .toml file")
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise FaultPlanError(f"{p}: cannot read the fault plan ({exc.strerror})") from None
        try:
            data = tomllib.loads(text) if p.suffix == ".toml" else json.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise FaultPlanError(f"{p}: not valid TOML ({exc})") from None
        except json.JSONDecodeError as exc:
            raise FaultPlanError(
                f"{p}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})"
            ) from None
        return cls.parse(data, source=str(p))

    # --- identities and descriptions ---
    def fault_id(self, index: int) -> str:
        """The fault's name, or ``faults[i]``."""
        return self.faults[index].name or f"faults[{index}]"

    def announcements(self) -> list[dict[str, Any]]:
        """The planned interruptions, as the run is told about them before it starts."""
        return [
            {
                "fault": self.fault_id(i),
                "domain": f.domain,
                "window": f.window,
                "notice": f.notice,
            }
            for i, f in enumerate(self.faults)
            if isinstance(f, Planned)
        ]

    def describe(self) -> dict[str, Any]:
        """The plan and its announcements, JSON-ready, for the run's evidence record."""
        return {**self.model_dump(mode="json"), "announced": self.announcements()}

    def apply_to(self, policy: Policy) -> Policy:
        """``policy``, with the plan's timeout when the policy has none."""
        if self.timeout is None or policy.timeout is not None:
            return policy
        return Policy(
            decisions=dict(policy.decisions),
            retry=policy.retry,
            timeout=self.timeout,
            exhausted=policy.exhausted,
            unsafe=policy.unsafe,
        )

    # --- domains ---
    def domain_of(self, index: int, tools: Mapping[str, Any]) -> list[str]:
        """The tool names fault ``index`` can hit among ``tools`` (sorted)."""
        fault = self.faults[index]
        if fault.tool is not None:
            names = [fault.tool]
        elif fault.service == "writes":
            names = [n for n, t in tools.items() if _mutating(t)]
        elif fault.service == "reads":
            names = [n for n, t in tools.items() if not _mutating(t)]
        elif fault.service is not None:
            names = list(self.services[fault.service])
        else:
            names = list(tools)
        if fault.kind in _EFFECT_KINDS:
            names = [n for n in names if _mutating(tools.get(n))]
        return sorted(names)

    def check_tools(self, tools: Mapping[str, Any]) -> None:
        """Check the plan against an environment's tools; raise :class:`FaultPlanError`."""
        problems = []
        for name, members in sorted(self.services.items()):
            unknown = sorted(set(members) - set(tools))
            if unknown:
                problems.append(f"services.{name}: no tool {', '.join(map(repr, unknown))}")
        for i, fault in enumerate(self.faults):
            label = f"faults[{i}] ({fault.kind})"
            if fault.tool is not None and fault.tool not in tools:
                problems.append(f"{label}: no tool {fault.tool!r}")
            elif (
                fault.tool is not None
                and fault.kind in _EFFECT_KINDS
                and not _mutating(tools[fault.tool])
            ):
                problems.append(
                    f"{label}: {fault.tool!r} changes no state, so it has no effect to "
                    "lose or corrupt; aim it at a write tool (an action with writes=...)"
                )
        share: dict[str, float] = defaultdict(float)
        for i, fault in enumerate(self.faults):
            if fault.kind in _WINDOWED or fault.calls is not None:
                continue
            for name in self.domain_of(i, tools):
                share[name] += fault.rate
        over = sorted(n for n, r in share.items() if r > 1.0 + 1e-9)
        if over:
            problems.append(
                f"the rates of faults sharing {', '.join(map(repr, over))} sum to more than 1; "
                "a call gets at most one fault, so lower them"
            )
        if problems:
            valid = ", ".join(sorted(tools))
            raise FaultPlanError(
                "fault plan does not fit the environment: "
                + "; ".join(problems)
                + f" (tools: {valid})"
            )

    def check_suite(self, suite: Suite) -> None:
        """Check the plan against the tools of ``suite``'s environment."""
        env = suite.new_environment()
        try:
            self.check_tools(env.tools)
        finally:
            env.close()

    # --- running ---
    def for_run(self, run_id: str | None = None, *, started: float | None = None) -> RunFaults:
        """The plan bound to one run: its id and the moment its ``seconds`` windows count from."""
        return RunFaults(self, run_id, time.time() if started is None else started)

    def injector(
        self,
        env: Any,
        *,
        task_id: str | None = None,
        trial: int = 0,
        episode_id: str = "episode",
        run_id: str | None = None,
        started: float | None = None,
        clock: Clock | None = None,
    ) -> Injector:
        """An injector for one trial on ``env`` (install it before the agent acts)."""
        return Injector(
            self,
            env,
            task_id=task_id,
            trial=trial,
            episode_id=episode_id,
            run_id=run_id,
            started=started,
            clock=clock,
        )


def load_faults(plan: FaultPlan | Mapping[str, Any] | str | Path) -> FaultPlan:
    """A plan given as a plan, its parsed data, or the path of its file."""
    if isinstance(plan, FaultPlan):
        return plan
    if isinstance(plan, Mapping):
        return FaultPlan.parse(plan)
    return FaultPlan.load(plan)


def _mutating(tool: Any) -> bool:
    return isinstance(tool, Action) and tool.mutating


def _where(loc: tuple[int | str, ...]) -> str:
    """``faults[2] (silent): mode`` from pydantic's ``('faults', 2, 'silent', 'mode')``."""
    parts: list[str] = []
    i = 0
    while i < len(loc):
        item = loc[i]
        if isinstance(item, int):
            parts[-1] = f"{parts[-1]}[{item}]" if parts else f"[{item}]"
            if (
                parts
                and parts[-1].startswith("faults[")
                and i + 1 < len(loc)
                and loc[i + 1] in KINDS
            ):
                parts[-1] += f" ({loc[i + 1]})"
                i += 1
        else:
            parts.append(str(item))
        i += 1
    if not parts:
        return ""
    head, *rest = parts
    return head + (": " + ".".join(rest) if rest else "") + ": "


def _explain(exc: ValidationError, source: str) -> str:
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = _where(loc)
        kind = err["type"]
        if kind == "union_tag_not_found":
            msg = f"kind is missing; give kind = one of {', '.join(KINDS)}"
        elif kind == "union_tag_invalid":
            got = err.get("input", {})
            tag = got.get("kind") if isinstance(got, Mapping) else got
            msg = f"unknown kind {tag!r}; kinds: {', '.join(KINDS)}"
        elif kind == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling"
        elif kind == "missing":
            msg = "required field is missing"
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")
        lines.append(f"{where}{msg}")
    return f"{source}: invalid fault plan: " + "; ".join(lines)


@dataclass(frozen=True)
class RunFaults:
    """A plan bound to one run (picklable, so worker processes get it)."""

    plan: FaultPlan
    run_id: str | None
    started: float

    def injector(self, env: Any, task_id: str, trial: int, episode_id: str) -> Injector:
        """The injector for one trial of the run."""
        return self.plan.injector(
            env,
            task_id=task_id,
            trial=trial,
            episode_id=episode_id,
            run_id=self.run_id,
            started=self.started,
        )


# --------------------------------------------------------------------------------------------
# Events and the trial's accounting.
# --------------------------------------------------------------------------------------------


@dataclass
class FaultEvent:
    """One injected fault, and (after :meth:`Injector.finish`) what the harness made of it.

    Times (``at``, ``end``, ``detect_latency``, ``recover_time``) are on the trial's clock;
    ``wall`` and ``wall_end`` are Unix time, to line events up with the store's records.
    """

    id: str
    fault: str
    kind: str
    tool: str
    instance: str
    episode_id: str
    task_id: str | None
    trial: int | None
    txn_id: str | None
    attempt: int | None
    call: int
    at: float
    wall: float
    end: float = 0.0
    wall_end: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)
    detected: bool = False
    detected_as: str | None = None
    decision: str | None = None
    detect_latency: float | None = None
    recovered: bool = False
    recover_time: float | None = None
    re_executed: int = 0

    def row(self, run_id: str | None) -> FaultEventRow:
        """The event as a store row."""
        return FaultEventRow(
            id=self.id,
            run_id=run_id,
            episode_id=self.episode_id,
            task_id=self.task_id,
            trial=self.trial,
            fault=self.fault,
            kind=self.kind,
            tool=self.tool,
            instance=self.instance,
            txn_id=self.txn_id,
            attempt=self.attempt,
            call=self.call,
            at=self.at,
            wall=self.wall,
            detail=dumps(self.detail),
            detected=self.detected,
            detected_as=self.detected_as,
            decision=self.decision,
            detect_latency=self.detect_latency,
            recovered=self.recovered,
            recover_time=self.recover_time,
            re_executed=self.re_executed,
        )


@dataclass
class _Execution:
    """One run of a real write (``do``) or of its undo, for counting re-applied effects."""

    key: str
    op: Literal["do", "undo"]
    keys: list[str]


@dataclass
class TrialFaults:
    """One trial's faults and its effects, judged against the harness's records.

    Attributes:
        events: the injected faults, judged.
        crashes: injected worker deaths (each one resumed by the runner).
        planned: whether a planned interruption hit the trial.
        executions: runs of real writes that changed state.
        duplicated: writes applied again while their earlier effect stood (same idempotency
            key, no undo in between).
        lost: resources a committed transaction changed that are back at their original value.
        diverged: resources whose final value is neither what the committed transactions left
            nor the original.
        unaccounted: resources changed that no committed transaction (nor a pending escalation)
            accounts for.
        held: resources left for a person by a pending escalation.
    """

    events: list[FaultEvent]
    crashes: int = 0
    planned: bool = False
    executions: int = 0
    duplicated: int = 0
    lost: int = 0
    diverged: int = 0
    unaccounted: int = 0
    held: int = 0
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def clean(self) -> bool:
        """No effect duplicated, lost, diverged or unaccounted for."""
        return not (self.duplicated or self.lost or self.diverged or self.unaccounted)


# --------------------------------------------------------------------------------------------
# Injecting.
# --------------------------------------------------------------------------------------------

_RUN = object()
"""What the call steps yield to have the real tool run now."""


@dataclass(frozen=True)
class _Delay:
    seconds: float


CallSteps = Generator[Any, Any, Any]


def _uniform(*parts: object) -> float:
    """A uniform draw in [0, 1) from ``parts`` alone (no state, no order dependence)."""
    h = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


class Injector:
    """Wraps one trial's tools and injects the plan's faults into their calls.

    Use it around the trial (``with plan.injector(env, ...) as inj:``, or :meth:`install` and
    :meth:`finish`). Give the episode :attr:`clock`, so injected delays move the clock the
    harness times attempts with.
    """

    def __init__(
        self,
        plan: FaultPlan,
        env: Any,
        *,
        task_id: str | None,
        trial: int,
        episode_id: str,
        run_id: str | None,
        started: float | None,
        clock: Clock | None,
    ) -> None:
        self.plan = plan
        self.env = env
        self.state = env.state
        self.task_id, self.trial, self.episode_id, self.run_id = task_id, trial, episode_id, run_id
        self.started = time.time() if started is None else started
        self.clock: Clock = clock or (FakeClock() if plan.clock == "fake" else SystemClock())
        self.events: list[FaultEvent] = []
        self.crashes = 0
        self.planned = False
        self._ledger: list[_Execution] = []
        self._restore: list[Callable[[], None]] = []
        self._undos: dict[str, Callable[..., Any]] = {}
        self._domains: list[frozenset[str]] = []
        self._slices: dict[str, list[tuple[float, float, int]]] = {}
        self._rule_calls: Counter[int] = Counter()
        self._rule_hits: Counter[int] = Counter()
        self._tool_calls: Counter[str] = Counter()
        self._armed: dict[str, tuple[FaultEvent, str]] = {}
        self._walls: list[float] = []
        self._clocks: list[float] = []
        self._mark: Any = None
        self._fake = hasattr(self.clock, "advance")

    # --- lifecycle ---
    def __enter__(self) -> Injector:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    @property
    def installed(self) -> bool:
        """Whether the tools are wrapped now."""
        return bool(self._restore)

    def install(self) -> Injector:
        """Wrap the environment's tools (restored by :meth:`uninstall` or :meth:`finish`)."""
        if self.installed:
            raise ConfigurationError("this injector is already installed")
        tools: MutableMapping[str, Any] = self.env.tools
        plan = self.plan
        plan.check_tools(tools)
        self._domains = [frozenset(plan.domain_of(i, tools)) for i in range(len(plan.faults))]
        lows: dict[str, float] = defaultdict(float)
        for i, fault in enumerate(plan.faults):
            if fault.kind in _WINDOWED or fault.calls is not None:
                continue
            for name in sorted(self._domains[i]):
                lo = lows[name]
                self._slices.setdefault(name, []).append((lo, lo + fault.rate, i))
                lows[name] = lo + fault.rate
        writable = isinstance(self.state, MutableMapping)
        for i, fault in enumerate(plan.faults):
            if fault.kind not in ("silent", "compensation") or writable:
                continue
            stuck = sorted(n for n in self._domains[i] if tools[n].compensate is None)
            if stuck:
                raise FaultPlanError(
                    f"faults[{i}] ({fault.kind}): {', '.join(stuck)} cannot have its effect "
                    "altered: the state adapter takes no writes and the action has no "
                    "compensation to write through"
                )
        self._mark = self.state.mark()
        for name, tool in list(tools.items()):
            if isinstance(tool, Action):
                self._wrap_action(name, tool)
            else:
                tools[name] = self._wrap(name, tool, None)
                self._restore.append(functools.partial(tools.__setitem__, name, tool))
        self._sample()
        return self

    def _wrap_action(self, name: str, act: Action[Any, Any]) -> None:
        original_fn = act.fn
        act.fn = self._wrap(name, original_fn, act)

        def put_fn_back() -> None:
            act.fn = original_fn

        self._restore.append(put_fn_back)
        original_undo = act.compensate
        if original_undo is not None:
            self._undos[name] = original_undo
            act.compensate = self._wrap_undo(act, original_undo)

            def put_undo_back() -> None:
                act.compensate = original_undo

            self._restore.append(put_undo_back)

    def uninstall(self) -> None:
        """Put the original tools back (idempotent)."""
        while self._restore:
            self._restore.pop()()

    # --- wrappers ---
    def _wrap(self, name: str, fn: Callable[..., Any], act: Action[Any, Any] | None) -> Any:
        if inspect.iscoroutinefunction(fn):

            async def acall(*args: Any, **kwargs: Any) -> Any:
                steps = self._call(name, fn, act, args, kwargs)
                try:
                    request = next(steps)
                    while True:
                        try:
                            if isinstance(request, _Delay):
                                await self._adelay(request.seconds)
                                value = None
                            else:
                                value = await fn(*args, **kwargs)
                        except Exception as exc:
                            request = steps.throw(exc)
                        else:
                            request = steps.send(value)
                except StopIteration as stop:
                    return stop.value

            wrapper: Callable[..., Any] = acall
        else:

            def call(*args: Any, **kwargs: Any) -> Any:
                steps = self._call(name, fn, act, args, kwargs)
                try:
                    request = next(steps)
                    while True:
                        try:
                            if isinstance(request, _Delay):
                                self._delay(request.seconds)
                                value = None
                            else:
                                value = fn(*args, **kwargs)
                        except Exception as exc:
                            request = steps.throw(exc)
                        else:
                            request = steps.send(value)
                except StopIteration as stop:
                    return stop.value

            wrapper = call
        functools.update_wrapper(wrapper, fn)
        return wrapper

    def _wrap_undo(self, act: Action[Any, Any], undo: Callable[..., Any]) -> Any:
        def before(ctx: Context) -> bool:
            armed = self._armed.pop(ctx.txn_id, None)
            if armed is None:
                return True
            event, mode = armed
            event.detail["undo_failed"] = mode
            if mode == "raise":
                raise CompensationBroken(event.id, f"injected: the undo of {act.name} failed")
            return False  # incomplete: report success, restore nothing

        def after(ctx: Context) -> None:
            changed = sorted(k for k, v in ctx.after.items() if v != ctx.before.get(k))
            self._ledger.append(_Execution(ctx.idempotency_key, "undo", changed))

        if inspect.iscoroutinefunction(undo):

            async def aundo(ctx: Context) -> Any:
                if not before(ctx):
                    return None
                result = await undo(ctx)
                after(ctx)
                return result

            wrapper: Callable[..., Any] = aundo
        else:

            def sundo(ctx: Context) -> Any:
                if not before(ctx):
                    return None
                result = undo(ctx)
                after(ctx)
                return result

            wrapper = sundo
        functools.update_wrapper(wrapper, undo)
        return wrapper

    def _delay(self, seconds: float) -> None:
        advance = getattr(self.clock, "advance", None)
        if advance is not None:
            advance(seconds)
        else:
            self.clock.sleep(seconds)
        self._sample()

    async def _adelay(self, seconds: float) -> None:
        advance = getattr(self.clock, "advance", None)
        if advance is not None:
            advance(seconds)
        else:
            await self.clock.asleep(seconds)
        self._sample()

    def _sample(self) -> None:
        """Note (wall time, clock time), so store records can be placed on the trial's clock."""
        wall = time.time()
        if self._walls and wall < self._walls[-1]:
            wall = self._walls[-1]
        self._walls.append(wall)
        self._clocks.append(self.clock.now())

    def clock_at(self, wall: float) -> float:
        """The trial clock's reading at Unix time ``wall`` (from the samples taken)."""
        i = max(bisect.bisect_right(self._walls, wall) - 1, 0)
        if not self._walls:
            return self.clock.now()
        base = self._clocks[i]
        return base if self._fake else base + max(wall - self._walls[i], 0.0)

    # --- one call ---
    def _call(
        self,
        name: str,
        fn: Callable[..., Any],
        act: Action[Any, Any] | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> CallSteps:
        ctx = current_context() if act is not None else None
        self._tool_calls[name] += 1
        key = ctx.idempotency_key if ctx is not None else f"{name}#{self._tool_calls[name]}"
        self._sample()
        first = len(self.events)
        choice = self._choose(name)
        mark = self.state.mark()
        try:
            if choice is None:
                return (yield _RUN)
            return (yield from self._inject(choice, name, fn, act, ctx, args, kwargs, mark))
        finally:
            changes = observed_changes(self.state, mark)
            self.state.release(mark)
            self._sample()
            for event in self.events[first:]:
                event.end, event.wall_end = self.clock.now(), time.time()
            if act is not None and act.mutating:
                self._ledger.append(_Execution(key, "do", sorted(changes)))

    def _choose(self, name: str) -> tuple[int, Any] | None:
        plan = self.plan
        matching = [i for i, d in enumerate(self._domains) if name in d]
        for i in matching:
            self._rule_calls[i] += 1
        since = time.time() - self.started
        ordered = [i for i in matching if plan.faults[i].kind in _WINDOWED]
        ordered += [i for i in matching if plan.faults[i].calls is not None and i not in ordered]
        for i in ordered:
            fault = plan.faults[i]
            if not self._eligible(fault, i, since):
                continue
            n = self._rule_calls[i]
            if fault.calls is not None:
                hit = n in fault.calls
            else:
                hit = _uniform(plan.seed, i, self.task_id, self.trial, n) < fault.rate
            if hit:
                self._rule_hits[i] += 1
                return i, fault
        slices = self._slices.get(name)
        if slices:
            u = _uniform(plan.seed, "slice", self.task_id, self.trial, name, self._tool_calls[name])
            for lo, hi, i in slices:
                if lo <= u < hi and self._eligible(plan.faults[i], i, since):
                    self._rule_hits[i] += 1
                    return i, plan.faults[i]
        return None

    def _eligible(self, fault: Any, index: int, since: float) -> bool:
        if fault.tasks is not None and self.task_id not in fault.tasks:
            return False
        if fault.trials is not None and not fault.trials[0] <= self.trial < fault.trials[1]:
            return False
        if fault.seconds is not None and not fault.seconds[0] <= since < fault.seconds[1]:
            return False
        return fault.max_per_trial is None or self._rule_hits[index] < fault.max_per_trial

    def _record(
        self, index: int, fault: Any, name: str, ctx: Context | None, **detail: Any
    ) -> FaultEvent:
        event_id = f"{self.episode_id}#{len(self.events) + 1}"
        fault_id = self.plan.fault_id(index)
        event = FaultEvent(
            id=event_id,
            fault=fault_id,
            kind=fault.kind,
            tool=name,
            instance=fault_id if fault.kind in _WINDOWED else event_id,
            episode_id=self.episode_id,
            task_id=self.task_id,
            trial=self.trial,
            txn_id=ctx.txn_id if ctx is not None else None,
            attempt=ctx.attempt if ctx is not None else None,
            call=self._rule_calls[index],
            at=self.clock.now(),
            wall=time.time(),
            detail={"domain": fault.domain, **detail},
        )
        self.events.append(event)
        return event

    def _inject(
        self,
        choice: tuple[int, Any],
        name: str,
        fn: Callable[..., Any],
        act: Action[Any, Any] | None,
        ctx: Context | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        mark: Any,
    ) -> CallSteps:
        index, fault = choice
        kind = fault.kind
        if kind == "fail_stop":
            event = self._record(index, fault, name, ctx, transient=fault.transient)
            error = InjectedTransientError if fault.transient else InjectedError
            raise error(event.id, f"injected fail_stop: {name} failed before running")
        if kind == "planned":
            event = self._record(index, fault, name, ctx, notice=fault.notice)
            self.planned = True
            raise PlannedInterruption(
                event.id,
                f"{fault.notice}: {fault.domain} is in announced maintenance during "
                f"{fault.window}; {name} was not run",
            )
        if kind == "correlated":
            event = self._record(index, fault, name, ctx, window=fault.window, delay=fault.delay)
            if fault.delay is not None:
                yield _Delay(fault.delay)
                return (yield _RUN)
            down = TransientServiceDown if fault.transient else ServiceDown
            raise down(event.id, f"{fault.domain} is down ({fault.window}); {name} was not run")
        if kind == "fail_slow":
            # Progressive degradation: each earlier slow call of this fault in the trial
            # multiplies the delay by ``growth`` (this call is already counted in the hits).
            delay = fault.delay * fault.growth ** (self._rule_hits[index] - 1)
            self._record(index, fault, name, ctx, delay=delay)
            yield _Delay(delay)
            return (yield _RUN)
        result = yield _RUN
        changes = observed_changes(self.state, mark)
        if not changes:
            return result  # the call changed nothing: no effect to lose or corrupt
        assert act is not None
        if kind == "lost_ack":
            event = self._record(index, fault, name, ctx, then=fault.then, keys=sorted(changes))
            if fault.then == "crash":
                self.crashes += 1
                raise WorkerCrash(event.id)
            raise LostAcknowledgement(
                event.id,
                f"{name}: the connection dropped after the effect was applied, before the "
                "answer came back",
            )
        mode = fault.mode if kind == "silent" else "wrong"
        u = _uniform(
            self.plan.seed, "alter", self.task_id, self.trial, name, self._tool_calls[name]
        )
        target = _altered(mode, changes, u)
        self._put(act, fn, ctx, args, kwargs, changes, target)
        event = self._record(index, fault, name, ctx, mode=mode, keys=sorted(changes))
        if kind == "compensation":
            event.detail["undo"] = fault.undo
            if ctx is not None:
                self._armed[ctx.txn_id] = (event, fault.undo)
        return result

    def _put(
        self,
        act: Action[Any, Any],
        fn: Callable[..., Any],
        ctx: Context | None,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        changes: Mapping[str, tuple[Any, Any]],
        target: Mapping[str, Any],
    ) -> None:
        """Make the state hold ``target`` for the changed keys, through the adapter."""
        todo = {k: v for k, v in target.items() if canonical(v) != canonical(changes[k][1])}
        if not todo:
            return
        if isinstance(self.state, MutableMapping):
            for key, value in todo.items():
                if value is None:
                    self.state.pop(key, None)
                else:
                    self.state[key] = value
            return
        # Write through the action's own undo: it restores ctx.before on the changed keys, so
        # handing it the altered values as "before" writes them, in the adapter's own way.
        undo = self._undos[act.name]
        if ctx is not None:
            model = ctx.args
        else:
            bound = inspect.signature(fn).bind(*args, **kwargs)
            model = act.validate_mapping(dict(bound.arguments))
        writer = Context(act.name, model, self.state, self.episode_id)
        writer.before = dict(todo)
        writer.after = {k: changes[k][1] for k in todo}
        done = undo(writer)
        if inspect.isawaitable(done):
            if hasattr(done, "close"):
                done.close()
            raise FaultPlanError(
                f"{act.name}: its compensation is async, so a silent fault cannot write through "
                "it from a sync call"
            )

    # --- after the trial ---
    def finish(self, store: Store) -> TrialFaults:
        """Judge every event against the store, account for effects, write both, uninstall."""
        self.uninstall()
        self._sample()
        txns = store.transactions(self.episode_id)
        logs = store.log(self.episode_id)
        escalations = store.escalations(episode_id=self.episode_id)
        for event in self.events:
            judge(event, txns, logs, self.clock_at)
        result = self._account(txns, escalations)
        if self._mark is not None:
            self.state.release(self._mark)
            self._mark = None
        with store.session() as s:
            for event in self.events:
                s.merge(event.row(self.run_id))
            s.merge(
                FaultTrialRow(
                    id=self.episode_id,
                    run_id=self.run_id,
                    task_id=self.task_id,
                    trial=self.trial,
                    events=len(self.events),
                    crashes=result.crashes,
                    planned=result.planned,
                    executions=result.executions,
                    duplicated=result.duplicated,
                    lost=result.lost,
                    diverged=result.diverged,
                    unaccounted=result.unaccounted,
                    held=result.held,
                    detail=dumps(result.detail),
                )
            )
            s.commit()
        return result

    def _account(self, txns: list[TransactionRow], escalations: list[EscalationRow]) -> TrialFaults:
        committed = sorted(
            (t for t in txns if t.mutating and t.status in ("committed", "recovered")),
            key=lambda t: t.seq,
        )
        expected: dict[str, Any] = {}
        for t in committed:
            for key, (_, after) in loads(t.diff or "{}").items():
                expected[key] = after
        actual = observed_changes(self.state, self._mark) if self._mark is not None else {}
        held: set[str] = set()
        for esc in escalations:
            if esc.status == "pending":
                held |= set(loads(esc.evidence or "{}").get("diff") or {})
        lost: list[str] = []
        diverged: list[str] = []
        unaccounted: list[str] = []
        holding: list[str] = []
        for key, want in expected.items():
            if key in actual:
                original, now = actual[key]
            else:
                original = now = self.state.get(key)
            if canonical(now) == canonical(want):
                continue
            if key in held:
                holding.append(key)
            elif canonical(now) == canonical(original):
                lost.append(key)
            else:
                diverged.append(key)
        for key in actual:
            if key not in expected:
                (holding if key in held else unaccounted).append(key)
        applied: Counter[str] = Counter()
        duplicated, executions = [], 0
        for x in self._ledger:
            if x.op == "undo":
                applied[x.key] = 0
            elif x.keys:
                executions += 1
                if applied[x.key]:
                    duplicated.append(x.key)
                applied[x.key] += 1
        per_key = Counter(t.idem_key for t in committed)
        twice = sorted(k for k, n in per_key.items() if n > 1)
        return TrialFaults(
            events=self.events,
            crashes=self.crashes,
            planned=self.planned,
            executions=executions,
            duplicated=len(duplicated) + len([k for k in twice if k not in duplicated]),
            lost=len(lost),
            diverged=len(diverged),
            unaccounted=len(unaccounted),
            held=len(holding),
            detail={
                "lost": sorted(lost),
                "diverged": sorted(diverged),
                "unaccounted": sorted(unaccounted),
                "held": sorted(holding),
                "duplicated": sorted(set(duplicated) | set(twice)),
            },
        )


# --------------------------------------------------------------------------------------------
# Altering an effect (silent and compensation faults).
# --------------------------------------------------------------------------------------------


def _altered(mode: str, changes: Mapping[str, tuple[Any, Any]], u: float) -> dict[str, Any]:
    """The values the changed keys should hold for a ``missing``/``partial``/``wrong`` effect."""
    if mode == "missing":
        return {k: before for k, (before, _) in changes.items()}
    target = {k: after for k, (_, after) in changes.items()}
    keys = sorted(changes)
    if mode == "partial":
        if len(keys) > 1:
            target[keys[-1]] = changes[keys[-1]][0]
            return target
        before, after = changes[keys[0]]
        half = _partial(before, after)
        target[keys[0]] = before if half is None else half
        return target
    key = keys[int(u * len(keys)) % len(keys)]
    target[key] = _wrong(changes[key][0], changes[key][1], u)
    return target


def _partial(before: Any, after: Any) -> Any:
    """``after`` with part of its change from ``before`` undone; None if it cannot be split."""
    if isinstance(before, dict) and isinstance(after, dict):
        differ = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if len(differ) > 1:
            out = json.loads(dumps(after))
            for k in differ[len(differ) // 2 :]:
                if k in before:
                    out[k] = before[k]
                else:
                    out.pop(k, None)
            return out
        if len(differ) == 1:
            inner = _partial(before.get(differ[0]), after.get(differ[0]))
            if inner is None:
                return None
            return {**after, differ[0]: inner}
        return None
    if isinstance(before, list) and isinstance(after, list):
        added = len(after) - len(before)
        if added > 1 and after[: len(before)] == before:
            return after[: len(before) + added // 2]
    return None


def _wrong(before: Any, after: Any, u: float) -> Any:
    """A value unlike both ``before`` and ``after``: one changed part of ``after``, perturbed."""
    if isinstance(after, dict) and isinstance(before, dict):
        differ = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if differ:
            k = differ[int(u * len(differ)) % len(differ)]
            return {**after, k: _wrong(before.get(k), after.get(k), u)}
    if after is None:
        return before
    return _perturb(after)


def _perturb(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        return value + " (garbled)"
    if isinstance(value, list):
        return value[:-1] if value else ["garbled"]
    if isinstance(value, dict) and value:
        k = sorted(value)[0]
        return {**value, k: _perturb(value[k])}
    return "garbled"


# --------------------------------------------------------------------------------------------
# Judging an event against the harness's records.
# --------------------------------------------------------------------------------------------

_DETECTIONS = frozenset({"decision", "recovered", "escalation"})
_RECOVERIES = frozenset({"committed", "recovered"})
_RAISES = frozenset({"fail_stop", "correlated", "planned", "lost_ack"})


def judge(
    event: FaultEvent,
    txns: Iterable[TransactionRow],
    logs: Iterable[LogRow],
    clock_at: Callable[[float], float],
) -> None:
    """Fill in what the harness made of ``event``, from its transaction rows and its log.

    The harness *detected* the fault when it did not commit the faulted attempt as if nothing
    happened: it retried after it (the store shows a later attempt), recorded the transaction
    as failed (with its class and decision), committed it as ``recovered`` (the raise was seen
    and the effect verified), or resolved it as in doubt on resume. A retried attempt that
    returned normally within its timeout was necessarily rejected by a postcondition (the only
    retryable failure that raises nothing), so it counts as ``silent``.
    """
    if event.txn_id is None:
        return  # a plain call: no transaction took it, nothing of the harness's to judge
    rows = list(txns)
    txn = next((t for t in rows if t.id == event.txn_id), None)
    if txn is None:
        return
    errors = [str(e) for e in loads(txn.errors or "[]")]
    attempt = event.attempt or 0
    crash = event.kind == "lost_ack" and event.detail.get("then") == "crash"
    if crash:
        if txn.status == "recovered":
            event.detected, event.detected_as, event.decision = True, "in_doubt", "recover"
        elif txn.status == "abandoned":
            event.detected, event.detected_as, event.decision = True, "in_doubt", "retry"
            event.re_executed = 1
        elif txn.status == "failed":
            event.detected, event.detected_as, event.decision = True, "in_doubt", txn.decision
    elif txn.attempts > attempt:
        event.detected, event.decision, event.re_executed = True, "retry", 1
        if event.kind == "fail_slow" or event.detail.get("delay") is not None:
            event.detected_as = "fail_slow"
        elif event.kind in _RAISES:
            event.detected_as = "fail_stop" if any(event.id in e for e in errors) else None
        else:
            event.detected_as = "silent"
    elif txn.status == "recovered":
        event.detected, event.detected_as, event.decision = True, "lost_ack", "recover"
    elif txn.status == "failed":
        event.detected, event.detected_as, event.decision = True, txn.failure_class, txn.decision
    if event.kind == "planned" and any(
        event.id in e and "PlannedInterruption" in e for e in errors
    ):
        # The engine classifies any raise as fail_stop; the run was told of this window in
        # advance, and the recorded error is the announced refusal, so it is a planned one.
        event.detected_as = "planned"
    logs = list(logs)
    seen = _first(logs, event.txn_id, event.wall_end, _DETECTIONS)
    if event.detected and seen is not None:
        event.detect_latency = max(clock_at(seen.ts) - event.at, 0.0)
    fixed = txn
    if txn.status not in ("committed", "recovered"):
        fixed = next(
            (
                t
                for t in rows
                if t.idem_key == txn.idem_key
                and t.seq > txn.seq
                and t.status in ("committed", "recovered")
            ),
            txn,
        )
    if fixed.status in ("committed", "recovered") and event.detected:
        event.recovered = True
        done = _first(logs, fixed.id, event.wall_end, _RECOVERIES)
        if done is not None:
            event.recover_time = max(clock_at(done.ts) - event.at, 0.0)


def _first(logs: list[LogRow], txn_id: str, after: float, kinds: frozenset[str]) -> LogRow | None:
    for rec in logs:
        if rec.txn_id == txn_id and rec.kind in kinds and rec.ts >= after:
            return rec
    return None

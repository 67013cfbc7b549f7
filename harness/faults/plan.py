"""The fault plan: pydantic models of the faults, loading, validation against the tools."""

from __future__ import annotations

import dataclasses
import json
import time
import tomllib
from collections import Counter, defaultdict
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
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

from ..action import Action
from ..clock import Clock
from ..policy import Policy
from .errors import FaultPlanError
from .injector import WINDOWED, Injector

if TYPE_CHECKING:
    from ..suite import Suite


__all__ = [
    "BUILTIN_SERVICES",
    "KINDS",
    "CompensationFault",
    "Correlated",
    "FailSlow",
    "FailStop",
    "Fault",
    "FaultPlan",
    "LostAck",
    "Planned",
    "RunFaults",
    "Silent",
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
        return dataclasses.replace(policy, timeout=self.timeout)

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

    def check_tools(self, tools: Mapping[str, Any], *, writable: bool = True) -> None:
        """Check the plan against an environment's tools; raise :class:`FaultPlanError`.

        Args:
            tools: the environment's tools, by name.
            writable: whether its state adapter takes writes (``state[key] = value``); if not,
                ``silent`` and ``compensation`` faults alter effects through the action's
                compensation, so their actions need one.
        """
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
            if fault.kind in ("silent", "compensation") and not writable:
                stuck = [n for n in self.domain_of(i, tools) if tools[n].compensate is None]
                if stuck:
                    problems.append(
                        f"{label}: {', '.join(stuck)} cannot have its effect altered: the state "
                        "adapter takes no writes and the action has no compensation to write "
                        "through"
                    )
        share: dict[str, float] = defaultdict(float)
        for i, fault in enumerate(self.faults):
            if fault.kind in WINDOWED or fault.calls is not None:
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
            self.check_tools(env.tools, writable=isinstance(env.state, MutableMapping))
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

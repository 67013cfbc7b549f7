"""The injector: wraps one trial's tools and injects a plan's faults into their calls."""

from __future__ import annotations

import bisect
import functools
import hashlib
import inspect
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Generator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._json import canonical, dumps
from ..action import Action, Context, current_context
from ..clock import Clock, FakeClock, SystemClock
from ..errors import ConfigurationError
from ..store import FaultTrialRow, Store
from ..transaction import observed_changes
from .alter import altered
from .errors import (
    CompensationBroken,
    FaultPlanError,
    InjectedError,
    InjectedTransientError,
    LostAcknowledgement,
    PlannedInterruption,
    ServiceDown,
    TransientServiceDown,
    WorkerCrash,
)
from .events import FaultEvent, TrialFaults, _Execution, account, judge

if TYPE_CHECKING:
    from .plan import FaultPlan

__all__ = [
    "Injector",
]

WINDOWED = frozenset({"correlated", "planned"})
"""Fault kinds that strike a window of calls (by call count or seconds), not one call."""


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
        plan.check_tools(tools, writable=isinstance(self.state, MutableMapping))
        self._domains = [frozenset(plan.domain_of(i, tools)) for i in range(len(plan.faults))]
        lows: dict[str, float] = defaultdict(float)
        for i, fault in enumerate(plan.faults):
            if fault.kind in WINDOWED or fault.calls is not None:
                continue
            for name in sorted(self._domains[i]):
                lo = lows[name]
                self._slices.setdefault(name, []).append((lo, lo + fault.rate, i))
                lows[name] = lo + fault.rate
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
        # An async tool gets an async wrapper and a sync one a sync wrapper; both drive the same
        # generator of steps (_call), so the injection logic is written once.
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
        ordered = [i for i in matching if plan.faults[i].kind in WINDOWED]
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
            instance=fault_id if fault.kind in WINDOWED else event_id,
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
        target = altered(mode, changes, u)
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
        txns = store.transaction_rows(self.episode_id)
        logs = store.log(self.episode_id)
        escalations = store.escalation_rows(episode_id=self.episode_id)
        for event in self.events:
            judge(event, txns, logs, self.clock_at)
        result = account(
            self.state,
            self._mark,
            self._ledger,
            txns,
            escalations,
            events=self.events,
            crashes=self.crashes,
            planned=self.planned,
        )
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

"""Decisions, failure classes, retry settings and the policy that maps one to the other."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any

import tenacity

from .errors import ConfigurationError, TransientError

__all__ = ["Decision", "FailureClass", "Policy", "Retry", "TransientError"]


class Decision(StrEnum):
    """What the policy chose after a transaction did not commit."""

    CONTINUE = "continue"
    RETRY = "retry"
    ROLLBACK = "rollback"
    ESCALATE = "escalate"


class FailureClass(StrEnum):
    """Why a transaction did not commit."""

    PRECONDITION = "precondition"
    FAIL_STOP = "fail_stop"
    FAIL_SLOW = "fail_slow"
    SILENT = "silent"
    SCOPE = "scope"
    CONFLICT = "conflict"
    COMPENSATION = "compensation"
    CORRELATED = "correlated"
    PLANNED = "planned"


RetryOn = tuple[type[BaseException], ...] | Callable[[BaseException], bool]


@dataclass(frozen=True, kw_only=True)
class Retry:
    """How often and how patiently a failed attempt is tried again (built on tenacity).

    Args:
        attempts: total attempts, the first included (1 means no retry).
        backoff: first wait in seconds; doubles each attempt.
        max_backoff: cap on one wait.
        jitter: add up to ``backoff`` seconds of random wait (seeded by the episode).
        on: exception types, or a predicate, that count as transient.
    """

    attempts: int = 3
    backoff: float = 0.5
    max_backoff: float = 30.0
    jitter: bool = True
    on: RetryOn = (TransientError,)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError(f"Retry(attempts={self.attempts}): attempts must be >= 1")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ConfigurationError("Retry: backoff and max_backoff must be >= 0 seconds")
        if not (callable(self.on) and not isinstance(self.on, tuple)) and not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in self.on
        ):
            raise ConfigurationError(
                "Retry(on=...): give a tuple of exception types or a predicate(exception) -> bool"
            )

    def is_transient(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt."""
        if isinstance(self.on, tuple):
            return isinstance(error, self.on)
        return bool(self.on(error))

    def tenacity_wait(self) -> Any:
        """The tenacity wait strategy: exponential from ``backoff``, capped, with jitter."""
        wait = tenacity.wait_exponential(
            multiplier=self.backoff, min=self.backoff, max=self.max_backoff
        )
        if self.jitter and self.backoff > 0:
            return wait + tenacity.wait_random(0, self.backoff)
        return wait

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description for the evidence record."""
        on = (
            [t.__qualname__ for t in self.on]
            if isinstance(self.on, tuple)
            else getattr(self.on, "__qualname__", repr(self.on))
        )
        return {
            "attempts": self.attempts,
            "backoff": self.backoff,
            "max_backoff": self.max_backoff,
            "jitter": self.jitter,
            "on": on,
        }


_DEFAULT_DECISIONS: Mapping[FailureClass, Decision] = MappingProxyType(
    {
        FailureClass.PRECONDITION: Decision.CONTINUE,
        FailureClass.FAIL_STOP: Decision.CONTINUE,
        FailureClass.FAIL_SLOW: Decision.RETRY,
        FailureClass.SILENT: Decision.RETRY,
        FailureClass.SCOPE: Decision.ROLLBACK,
        FailureClass.CONFLICT: Decision.RETRY,
        FailureClass.COMPENSATION: Decision.ESCALATE,
        FailureClass.CORRELATED: Decision.CONTINUE,
        FailureClass.PLANNED: Decision.CONTINUE,
    }
)


# Decisions that cannot be carried out for a class, and why (the constructor refuses them,
# so every mapping a policy holds takes effect).
_REFUSED: Mapping[FailureClass, tuple[frozenset[Decision], str]] = MappingProxyType(
    {
        FailureClass.PRECONDITION: (
            frozenset({Decision.RETRY}),
            "nothing ran, so there is nothing to retry; the agent is told and may call again "
            "(use continue, rollback or escalate)",
        ),
        FailureClass.COMPENSATION: (
            frozenset({Decision.CONTINUE, Decision.RETRY, Decision.ROLLBACK}),
            "a failed compensation leaves a change in the state that only a person can judge "
            "(use escalate)",
        ),
    }
)


def _frozen_decisions(value: Mapping[Any, Any]) -> Mapping[FailureClass, Decision]:
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            "Policy(decisions=...) takes a mapping of failure class to decision, e.g. "
            "{'fail_stop': 'retry'}"
        )
    merged = dict(_DEFAULT_DECISIONS)
    for key, decision in value.items():
        try:
            failure, chosen = FailureClass(key), Decision(decision)
        except ValueError:
            raise ConfigurationError(
                f"Policy(decisions={{{key!r}: {decision!r}}}): failure classes are "
                f"{', '.join(FailureClass)}; decisions are {', '.join(Decision)}"
            ) from None
        refused = _REFUSED.get(failure)
        if refused is not None and chosen in refused[0]:
            raise ConfigurationError(
                f"Policy(decisions={{{str(failure)!r}: {str(chosen)!r}}}) cannot be carried out: "
                f"{refused[1]}"
            )
        merged[failure] = chosen
    return MappingProxyType(merged)


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Maps each failure class to a decision, with the default retry settings and timeout.

    Transient errors (``Retry.on``) are always retried up to ``retry.attempts``. A class mapped
    to ``retry`` (by default ``fail_slow``, ``silent`` and ``conflict``) is retried too, after
    its partial effect is compensated; when attempts run out, ``exhausted`` decides. A
    ``conflict`` (another writer changed what the call changed) is compensated only by an undo
    safe under other writers (one with a ``compensation_check``); otherwise it escalates. A
    mutating action with neither an idempotency key nor a compensation cannot be retried or
    undone safely, so its failures get ``unsafe``. After a ``pivot`` action commits,
    ``rollback`` becomes ``escalate``.

    Args:
        decisions: overrides of the default decision per failure class.
        retry: the retry settings for actions that give none.
        timeout: seconds an attempt may take before it counts as ``fail_slow`` (None: no limit).
        exhausted: the decision once retries are used up.
        unsafe: the decision for failures of actions that can be neither retried nor undone.
        idempotency_scope: ``"store"`` makes every mutating action's idempotency key hold
            across the episodes of the store, as ``@hx.action(idempotency_scope="store")``
            does for one action; ``"episode"`` (the default) leaves it to each action.
        approval: a rule, a function of the call's ``ctx``, saying which calls a person must
            approve before they run (e.g. ``lambda ctx: ctx.args.amount > 1000``); on top of
            each action's own ``approval=``. Runs in worker processes must be able to pickle it
            (a module-level function).

    Decisions a class cannot take are refused: a false precondition is never retried (nothing
    ran), and a failed compensation always escalates (its change is still in the state).
    """

    decisions: Mapping[FailureClass, Decision] = field(default_factory=dict)
    retry: Retry = field(default_factory=Retry)
    timeout: float | None = None
    exhausted: Decision = Decision.CONTINUE
    unsafe: Decision = Decision.ESCALATE
    approval: Callable[[Any], Any] | None = None
    idempotency_scope: str = "episode"

    def __post_init__(self) -> None:
        if self.idempotency_scope not in ("episode", "store"):
            raise ConfigurationError(
                f"Policy(idempotency_scope={self.idempotency_scope!r}): give 'episode' (a key "
                "answers within its episode, the default) or 'store' (across every episode of "
                "the store)"
            )
        object.__setattr__(self, "decisions", _frozen_decisions(self.decisions))
        object.__setattr__(self, "exhausted", Decision(self.exhausted))
        object.__setattr__(self, "unsafe", Decision(self.unsafe))
        if self.exhausted is Decision.RETRY or self.unsafe is Decision.RETRY:
            raise ConfigurationError("Policy: exhausted and unsafe cannot be 'retry'")
        if self.timeout is not None and self.timeout <= 0:
            raise ConfigurationError(f"Policy(timeout={self.timeout}): must be > 0 seconds")
        if self.approval is not None and not callable(self.approval):
            raise ConfigurationError(
                "Policy(approval=...) takes a function of ctx saying which calls need a person's "
                "approval, e.g. lambda ctx: ctx.args.amount > 1000"
            )

    def __reduce__(self) -> tuple[Any, ...]:
        # The decisions are a read-only mapping, which pickle cannot copy: rebuild from a dict
        # so a policy travels to worker processes.
        return (
            _rebuild,
            (
                dict(self.decisions),
                self.retry,
                self.timeout,
                self.exhausted,
                self.unsafe,
                self.approval,
                self.idempotency_scope,
            ),
        )

    def decide(self, failure_class: FailureClass | str) -> Decision:
        """The configured decision for ``failure_class``."""
        return self.decisions[FailureClass(failure_class)]

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description for the evidence record."""
        described = {
            "decisions": {str(k): str(v) for k, v in self.decisions.items()},
            "retry": self.retry.describe(),
            "timeout": self.timeout,
            "exhausted": str(self.exhausted),
            "unsafe": str(self.unsafe),
            "approval": None
            if self.approval is None
            else getattr(self.approval, "__qualname__", repr(self.approval)),
        }
        if self.idempotency_scope != "episode":
            described["idempotency_scope"] = self.idempotency_scope
        return described


def _rebuild(
    decisions: dict[FailureClass, Decision],
    retry: Retry,
    timeout: float | None,
    exhausted: Decision,
    unsafe: Decision,
    approval: Callable[[Any], Any] | None = None,
    idempotency_scope: str = "episode",
) -> Policy:
    return Policy(
        decisions=decisions,
        retry=retry,
        timeout=timeout,
        exhausted=exhausted,
        unsafe=unsafe,
        approval=approval,
        idempotency_scope=idempotency_scope,
    )

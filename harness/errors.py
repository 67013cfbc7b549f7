"""Every error the harness raises, under one root.

The tree::

    HarnessError
    ├── ConfigurationError      a decorator, policy or adapter was configured wrongly
    │   └── FaultPlanError      a fault plan is malformed (harness.faults)
    ├── StoreError              the store cannot be opened, read or written
    │   └── StoreWriteFailed    the database refused a write (disk full, read-only, I/O, locked)
    ├── NotInEpisode            an action was called outside ``with Episode(...)``
    ├── InvalidArguments        arguments do not match the action's schema; nothing ran
    ├── IdempotencyConflict     a committed key was reused with other arguments; nothing ran
    ├── KeyInFlight             a store-wide key is held by another episode's unfinished call
    ├── PreconditionFailed      a precondition was false against live state; nothing ran
    ├── ActionFailed            the action ran (or tried to) and did not commit
    │   ├── ScopeViolation      it changed resources outside its declared ``writes``
    │   ├── CheckError          a check raised instead of answering True/False
    │   ├── CompensationFailed  the undo raised, or the state was not back afterwards
    │   ├── WriteConflict       another writer changed what the call changed; nothing restored
    │   └── NotSerializable     its result cannot be stored as JSON
    ├── Escalated               the policy paused the episode for a person to decide
    ├── SuiteError              a suite, manifest or task file is malformed
    ├── RunNotFound             a run folder does not exist or holds no run
    ├── ModelServerError        a model server stayed down or rate-limited
    │   ├── EndpointDown        its circuit is open: it failed without a break for too long
    │   └── ModelRequestError   the server refused the request (wrong model, bad key)
    ├── Rejected                a person rejected this action when resolving an escalation
    ├── Diverged                resumed agent code did not do what its record says (harness.episode)
    └── EpisodeClosed           the episode is finished (rolled back, escalated or closed)

Errors carry their context as attributes (the action, the failure class, the decision, every
attempt's error) so callers and agents can act on them without parsing messages.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Any

from ._json import canonical

__all__ = [
    "ActionFailed",
    "CheckError",
    "CompensationFailed",
    "ConfigurationError",
    "Diverged",
    "EndpointDown",
    "EpisodeClosed",
    "Escalated",
    "HarnessError",
    "IdempotencyConflict",
    "InvalidArguments",
    "KeyInFlight",
    "ModelRequestError",
    "ModelServerError",
    "NotInEpisode",
    "NotSerializable",
    "PreconditionFailed",
    "Rejected",
    "RunNotFound",
    "ScopeViolation",
    "StoreError",
    "StoreWriteFailed",
    "SuiteError",
    "TransientError",
    "WriteConflict",
    "refusal",
]


class HarnessError(Exception):
    """Root of every error the harness raises."""


class ConfigurationError(HarnessError):
    """A decorator, policy, adapter or store was configured wrongly."""


class StoreError(HarnessError):
    """The store could not be opened, read or written."""


class StoreWriteFailed(StoreError):
    """The database refused a write: the disk is full, the file or database is read-only, an
    I/O error, or the write lock stayed taken past the busy timeout. The refused write was
    rolled back whole; everything committed before it is kept.

    Attributes:
        database: the database, as shown to people (a file path, or a URL without password).
        cause: why, in plain words (``the disk is full``).
        fix: what to do about it.
        error: the driver's error.
    """

    def __init__(self, database: str, cause: str, fix: str, error: BaseException) -> None:
        self.database = database
        self.cause = cause
        self.fix = fix
        self.error = error
        said = " ".join(str(error).split()) or type(error).__name__
        super().__init__(
            f"the store {database} could not be written: {cause} (the database said: {said}); "
            f"that write was rolled back whole. {fix}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # (a worker process sends it to the run's process)
        return (type(self), (self.database, self.cause, self.fix, self.error))


class NotInEpisode(HarnessError):
    """An action was called with no active episode."""

    def __init__(self, action: str, *, open_elsewhere: int = 0) -> None:
        self.action = action
        self.open_elsewhere = open_elsewhere
        if open_elsewhere:
            # An episode is open, but this call's context does not carry it: a thread started
            # without a copy of the context that entered the episode.
            super().__init__(
                f"action {action!r} was called where no episode is current, while "
                f"{open_elsewhere} episode(s) are open in this process: it runs in a thread "
                "that did not inherit the context the episode was entered in "
                "(ThreadPoolExecutor.submit, threading.Thread and run_in_executor with an "
                "executor of your own start threads in an empty context). Start the work with "
                "asyncio.to_thread(...), submit it to an hx.ContextExecutor(), or run it in "
                "contextvars.copy_context().run(...) taken where the episode is current"
            )
            return
        super().__init__(
            f"action {action!r} was called outside an episode; call it inside "
            "`with hx.Episode(state=..., store=...):` (or `async with`) so it runs as a transaction"
        )


class InvalidArguments(HarnessError):
    """The arguments do not match the action's schema; nothing was executed."""

    def __init__(self, action: str, errors: Sequence[str]) -> None:
        self.action = action
        self.errors = list(errors)
        super().__init__(
            f"invalid arguments for action {action!r}: {'; '.join(self.errors)}; "
            f"call it with arguments matching {action}.schema"
        )


class IdempotencyConflict(HarnessError):
    """A call's idempotency key already committed with other arguments; nothing was executed.

    The key names the effect, so the same key with other arguments is either a different
    effect wrongly keyed alike, or the same one asked for differently: either way, answering it
    with the first call's result would be a lie.
    """

    def __init__(self, action: str, key: str, txn_id: str, first: Any, now: Any) -> None:
        self.action = action
        self.key = key
        self.txn_id = txn_id
        self.first = first
        self.now = now
        super().__init__(
            f"action {action!r} was called with idempotency key {key!r}, which transaction "
            f"{txn_id} committed with other arguments ({first} then {now}); nothing ran. Make "
            "the key function name everything that makes the effect different, or call it with "
            "the same arguments"
        )


class KeyInFlight(HarnessError):
    """A store-wide idempotency key (``idempotency_scope="store"``) is held by a call of another
    episode that has not committed: running now could apply the effect twice; nothing ran.

    Attributes:
        action, key: the call refused.
        episode_id, txn_id: the episode and call holding the key.
        pid, host: the process that took it.
        status: that call's status (None: no outcome yet, it runs or its process died).
    """

    def __init__(
        self,
        action: str,
        key: str,
        episode_id: str,
        txn_id: str,
        *,
        pid: int,
        host: str,
        status: str | None,
    ) -> None:
        self.action, self.key = action, key
        self.episode_id, self.txn_id = episode_id, txn_id
        self.pid, self.host, self.status = pid, host, status
        state = "has no outcome yet" if status is None else f"ended {status}"
        super().__init__(
            f"action {action!r}: idempotency key {key!r} is in flight in episode {episode_id} "
            f"(call {txn_id}, process {pid} on {host}, {state}); nothing ran. Call again once "
            f"that call has committed (its result is then the answer); if its process is gone, "
            f"resume episode {episode_id} to settle it (or resolve its escalation)"
        )


class PreconditionFailed(HarnessError):
    """A precondition was false against live state; nothing was executed."""

    failure_class = "precondition"

    def __init__(self, action: str, check: str, reason: str = "") -> None:
        self.action = action
        self.check = check
        self.reason = reason
        self.decision = "continue"
        msg = f"action {action!r} not executed: precondition {check!r} is false"
        super().__init__(f"{msg}: {reason}" if reason else msg)


class ActionFailed(HarnessError):
    """The action did not commit; its own effects were undone where possible.

    Attributes:
        action: the action's name.
        failure_class: ``fail_stop``, ``fail_slow``, ``silent``, ``scope``, ``compensation``...
        decision: what the policy decided (``continue``, ``rollback``, ``escalate``).
        errors: every attempt's error, in order.
        reason: why the policy decided what it did.
    """

    def __init__(
        self,
        action: str,
        failure_class: str,
        reason: str,
        *,
        decision: str = "continue",
        errors: Sequence[BaseException] = (),
        txn_id: str | None = None,
    ) -> None:
        self.action = action
        self.failure_class = failure_class
        self.reason = reason
        self.decision = decision
        self.errors = list(errors)
        self.txn_id = txn_id
        super().__init__(
            f"action {action!r} failed ({failure_class}, decision {decision}): {reason}"
        )


class ScopeViolation(ActionFailed):
    """The action changed resources outside its declared ``writes`` scope."""

    def __init__(self, action: str, keys: Sequence[str], **kw: Any) -> None:
        self.keys = list(keys)
        reason = (
            f"changed {', '.join(self.keys)} outside its declared writes; "
            "declare them in @action(writes=[...]) or stop the tool from writing them"
        )
        super().__init__(action, "scope", reason, **kw)


class CheckError(ActionFailed):
    """A precondition or postcondition raised instead of returning a bool."""

    def __init__(
        self, action: str, check: str, phase: str, error: BaseException, **kw: Any
    ) -> None:
        self.check = check
        self.phase = phase
        self.error = error
        failure_class = "precondition" if phase == "precondition" else "silent"
        reason = (
            f"{phase} {check!r} raised {type(error).__name__}: {error}; "
            "a check must return True or False; fix the check"
        )
        super().__init__(action, failure_class, reason, errors=[error], **kw)


class CompensationFailed(ActionFailed):
    """The compensation raised, or the state was not back to its snapshot afterwards."""

    def __init__(self, action: str, reason: str, **kw: Any) -> None:
        kw.setdefault("decision", "escalate")
        super().__init__(action, "compensation", reason, **kw)


class WriteConflict(ActionFailed):
    """Another writer changed a resource the call changed, while the call ran or since: the
    harness did not restore the value before the call over it (that would erase their write).

    Attributes:
        keys: the resources both changed.
        others: ``{key: [value before the other writer's change, value now]}``.
        restored: whether the compensation had run (another writer changed the resource while
            it ran), so that it may have written over their change.
    """

    def __init__(
        self,
        action: str,
        keys: Sequence[str],
        others: dict[str, Any],
        when: str,
        *,
        restored: bool = False,
        **kw: Any,
    ) -> None:
        self.keys = list(keys)
        self.others = others
        self.restored = restored  # the compensation had run: it may have written over theirs
        done = (
            "the compensation had run and may have written over their change (the values now "
            "are in the evidence)"
            if restored
            else "the harness restored nothing over their change"
        )
        reason = (
            f"another writer changed {', '.join(self.keys)} {when}; {done} (give the action "
            "an undo that is safe under other writers, a relative update or a reversing entry "
            "with a compensation_check, to have it undone)"
        )
        super().__init__(action, "conflict", reason, **kw)


class NotSerializable(ActionFailed):
    """The action's result cannot be stored as JSON; its effect was undone."""

    def __init__(self, action: str, error: BaseException, **kw: Any) -> None:
        reason = (
            f"result is not JSON-serializable ({error}); return dicts, lists, strings, numbers, "
            "booleans, None or pydantic models"
        )
        super().__init__(action, "fail_stop", reason, errors=[error], **kw)


class Escalated(HarnessError):
    """The episode is paused: a person must approve, reject or edit an action."""

    def __init__(
        self,
        escalation_id: str,
        action: str,
        failure_class: str,
        reason: str,
        *,
        where: str | None = None,
    ) -> None:
        self.escalation_id = escalation_id
        self.action = action
        self.failure_class = failure_class
        self.reason = reason
        store = shlex.quote(where) if where else "STORE"
        super().__init__(
            f"action {action!r} escalated ({failure_class}): {reason}; a person decides with "
            f"`harness escalations {store} resolve {escalation_id} --approve|--reject --by "
            f"NAME` (`harness escalations {store}` shows the call; or Store.resolve(...) from "
            "Python), then the episode resumes"
        )


class Rejected(HarnessError):
    """A person rejected this action; it was not executed."""

    def __init__(self, action: str, by: str, reason: str) -> None:
        self.action = action
        self.by = by
        self.reason = reason
        super().__init__(f"action {action!r} was rejected by {by}: {reason or 'no reason given'}")


class EpisodeClosed(HarnessError):
    """The episode is finished and takes no more actions."""

    def __init__(self, episode_id: str, outcome: str) -> None:
        self.episode_id = episode_id
        self.outcome = outcome
        super().__init__(
            f"episode {episode_id} is {outcome} and takes no more actions; "
            "start a new episode, or resume this one after resolving its escalation"
        )


class TransientError(Exception):
    """Raised by a tool to say "this attempt failed, trying again may succeed"."""


class SuiteError(HarnessError):
    """A suite, manifest or task file is malformed; names the file, the task and the field."""


# HTTP statuses worth another attempt besides 5xx: request timeout, too many requests.
RETRYABLE_STATUS = frozenset({408, 429})


class ModelServerError(HarnessError):
    """The model server could not be reached or kept failing: an infrastructure error.

    Attributes:
        url: the endpoint called.
        status: the last HTTP status, or None when no response came (connection, timeout).
        attempts: how many attempts were made (sent to the server).
        errors: every attempt's error, in order.
        retry_after: the wait the server asked for (``Retry-After``), in seconds, or None.
        limit: the option whose limit the request passed (``max_response_bytes``,
            ``request_timeout``, ``retry_for``), or None.
        agent_meta: what the trial's agent metadata said when the error left the agent (its
            model calls, the failed one included with its attempts, seconds, tokens), so a
            trial ended by it keeps what it cost; empty unless the agent set it.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str,
        status: int | None = None,
        attempts: int = 1,
        errors: Sequence[BaseException] = (),
        retry_after: float | None = None,
        limit: str | None = None,
    ) -> None:
        self.url = url
        self.status = status
        self.attempts = attempts
        self.errors = list(errors)
        self.retry_after = retry_after
        self.limit = limit
        self.agent_meta: dict[str, Any] = {}
        super().__init__(message)

    @property
    def transient(self) -> bool:
        """Whether another attempt might succeed (no response, 5xx, 408 or 429)."""
        return self.status is None or self.status >= 500 or self.status in RETRYABLE_STATUS


class EndpointDown(ModelServerError):
    """The model server has failed without a break for too long: its circuit is open, and
    requests to it fail at once instead of burning every trial's retries.

    A run stops on it (the trials left are resumed with ``harness resume`` once the server is
    back); a trial it ends is an infrastructure error, never the agent's failure.

    Attributes:
        failures: the failed requests in a row that opened the circuit.
        down_for: seconds since the first of them.
    """

    def __init__(
        self, message: str, *, url: str = "", failures: int = 0, down_for: float = 0.0
    ) -> None:
        # (Defaults: an error sent from a worker process is rebuilt from its message, then
        # its attributes are restored.)
        self.failures = failures
        self.down_for = down_for
        super().__init__(message, url=url)

    @property
    def transient(self) -> bool:
        """Never: another attempt now would fail the same way."""
        return False


class ModelRequestError(ModelServerError):
    """The server refused the request (HTTP 4xx other than 408/429); retrying cannot help.

    Attributes:
        status: the HTTP status.
        server_message: what the server said, as it said it.
    """

    def __init__(self, message: str, *, url: str, status: int, server_message: str) -> None:
        self.server_message = server_message
        super().__init__(message, url=url, status=status)


class Diverged(HarnessError):
    """Re-executed agent code did something other than what the record says it did.

    Attributes:
        episode_id: the episode.
        step: the first step (1-based) where the agent and the record differ.
        expected: the step the record has there (None: the record ends before it).
        actual: what the agent did instead (None: the agent ended before it).
    """

    def __init__(
        self,
        episode_id: str,
        step: int,
        expected: dict[str, Any] | None,
        actual: dict[str, Any] | None,
    ) -> None:
        self.episode_id = episode_id
        self.step = step
        self.expected = expected
        self.actual = actual
        has = "nothing more" if expected is None else _show(expected)
        did = "nothing more (it ended)" if actual is None else _show(actual)
        super().__init__(
            f"episode {episode_id} diverged from its record at step {step}: the record has "
            f"{has}, the agent now did {did}; nothing was executed for it. The agent is not "
            "deterministic given its recorded results (seed, tool reads, model calls): run it "
            "as a new episode instead of resuming this one"
        )


def _show(step: dict[str, Any]) -> str:
    kind = step.get("kind")
    if kind in ("action", "dedup"):
        args = step.get("arguments")
        shown = canonical(args) if args is not None else f"key {step.get('key')!r}"
        return f"{step.get('name')}({shown})"
    return f"{kind} {step.get('name')} {canonical(step.get('request'))}"


class RunNotFound(HarnessError):
    """A path given as a run folder is not one: missing, or without its ``harness.db``.

    Attributes:
        path: the path as given.
    """

    def __init__(self, path: Any, message: str) -> None:
        self.path = path
        super().__init__(message)


def refusal(exc: BaseException) -> tuple[str, str] | None:
    """How a call that did not commit is told to the model that made it: ``(kind, message)``.

    Invalid arguments, a failed precondition, a person's rejection and a failed action are
    answers the model reads and adapts to (kind ``invalid``, ``precondition``, ``rejected``, or
    the failure class). None for everything else: an escalation, a closed episode and a
    configuration error end the agent's turn, and errors that are not the harness's are the
    caller's to handle. The one mapping the built-in toolbox and every framework adapter use.
    """
    if isinstance(exc, InvalidArguments):
        return "invalid", str(exc)
    if isinstance(exc, PreconditionFailed):
        return "precondition", str(exc)
    if isinstance(exc, Rejected):
        return "rejected", str(exc)
    if isinstance(exc, ActionFailed):
        return exc.failure_class, str(exc)
    return None

"""What one process knows of each model server it calls.

Every request of the built-in agent and user goes through its server's :class:`Endpoint`,
shared by all the trials a process runs at once (``--concurrency``):

- a limit on requests in flight (``max_in_flight``), so hundreds of trials in flight do not
  send hundreds of requests at once to a server that serves eight;
- a pause new requests keep when the server answers 429 with ``Retry-After`` (the request
  that got it waits in its own retry, as retries do; the others hold back instead of
  hammering);
- a circuit, fed by every request of every trial to the server (each attempt of a retried
  request counts, whatever trial made it). It opens once ``down_failures`` requests in a row
  have failed with no answer between (no response, 5xx, a malformed body; a 429 or a refused
  request is an answer, and ends the streak) and the server has answered nothing for
  ``down_after`` seconds since the first of them: measured to the latest failure, or, when a
  request is about to be sent and none is in flight, to now (every request sent since the
  streak began has failed, and none can still answer). The second case is what opens the
  circuit within ``down_after`` of a server going down even while every trial waits out its
  backoff, so the trials' last attempts are refused instead of spent; the time condition is
  what keeps a blip (a few failures at once, then answers) from opening it. Once open,
  requests fail at once with :class:`~harness.errors.EndpointDown` instead of burning every
  trial's retries, and a run stops on it. After ``down_after`` seconds (at least
  :data:`PROBE_AFTER`) one request may probe the server; an answer closes the circuit, a
  failure opens it again;
- counters (requests, answers, errors by kind, time waited), which the run's progress shows.

What holds for a whole run, over its processes (limits kept in the run's store, a circuit one
process opened refusing every process's requests), is a :class:`Gate` the run installs in
each of its processes (:func:`install_gate`); every endpoint of the process consults it. With
none installed, nothing is asked.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol

from ..errors import ConfigurationError, EndpointDown, ModelRequestError, ModelServerError

__all__ = [
    "Endpoint",
    "EndpointStats",
    "Gate",
    "endpoint",
    "endpoints",
    "forget_endpoints",
    "gate",
    "install_gate",
    "remove_gate",
]

DOWN_AFTER = 5.0  # seconds without an answer, with down_failures failures, that open it
DOWN_FAILURES = 10
PROBE_AFTER = 1.0  # the least time an open circuit refuses requests before a probe


@dataclass(frozen=True)
class EndpointStats:
    """A snapshot of one endpoint's counters.

    Attributes:
        url: the server's API root.
        requests: requests sent (each attempt counts).
        answered: requests that got an answer (a 2xx body, a 429, a refusal).
        errors: failed requests by kind (``429``, ``500``, ``no response``, ``malformed``, a
            limit passed such as ``max_response_bytes`` or ``request_timeout``...).
        in_flight: requests waiting for an answer now.
        waiting: requests held back now (by the limit or a ``Retry-After`` pause).
        seconds: time spent waiting for answers, summed over requests.
        open: whether the circuit is open (the server counts as down).
    """

    url: str
    requests: int
    answered: int
    errors: dict[str, int]
    in_flight: int
    waiting: int
    seconds: float
    open: bool

    @property
    def error_count(self) -> int:
        """Failed requests, all kinds."""
        return sum(self.errors.values())


class Gate(Protocol):
    """What a run adds to every endpoint of a process: limits and a circuit shared by all
    the run's processes (the runs layer implements it; :func:`install_gate`)."""

    def enter(self, url: str) -> object:
        """Wait until the run lets one more request to ``url`` start; a ticket to give back
        to :meth:`leave` when it ends.

        Raises:
            EndpointDown: a process of the run found ``url`` down (its circuit is open).
        """
        ...

    def leave(self, url: str, ticket: object) -> None:
        """The request :meth:`enter` let start has ended."""
        ...

    def used(self, url: str, tokens: int) -> None:
        """A response of ``url`` used ``tokens`` tokens (its ``usage.total_tokens``)."""
        ...

    def down(self, url: str, error: EndpointDown, seconds: float) -> None:
        """This process's circuit of ``url`` is open (``error`` is what it raises) for about
        ``seconds`` more: the run's other processes refuse their requests too."""
        ...


@dataclass
class Endpoint:
    """One model server as this process sees it (get it with :func:`endpoint`)."""

    url: str
    max_in_flight: int | None = None
    down_after: float = DOWN_AFTER
    down_failures: int = DOWN_FAILURES
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _in_flight: int = 0
    _waiting: int = 0
    _pause_until: float = 0.0
    _streak: int = 0
    _streak_since: float = 0.0
    _opened_at: float | None = None
    _probing: bool = False
    _requests: int = 0
    _answered: int = 0
    _seconds: float = 0.0
    _errors: Counter[str] = field(default_factory=Counter)

    def configure(
        self,
        *,
        max_in_flight: int | None = None,
        down_after: float = DOWN_AFTER,
        down_failures: int = DOWN_FAILURES,
    ) -> Endpoint:
        """Set the limit and the circuit's thresholds (the last caller's settings hold).

        Raises:
            ConfigurationError: a limit below 1, a negative time, fewer than one failure.
        """
        if max_in_flight is not None and max_in_flight < 1:
            raise ConfigurationError(
                f"max_in_flight={max_in_flight} for {self.url}: give at least 1, or None for "
                "no limit"
            )
        if down_after < 0 or down_failures < 1:
            raise ConfigurationError(
                f"circuit of {self.url}: down_after must be >= 0 seconds and down_failures "
                f">= 1 (got {down_after}, {down_failures})"
            )
        with self._cond:
            self.max_in_flight = max_in_flight
            self.down_after = down_after
            self.down_failures = down_failures
            self._cond.notify_all()
        return self

    # --- a request ---
    @contextmanager
    def request(self, *, retry: bool = False, patience: float | None = None) -> Iterator[None]:
        """Send one request inside this block: it waits for a slot and, unless it is a
        ``retry`` (which has waited its own backoff), for any pause a server's ``Retry-After``
        asked for; its outcome (the exception leaving the block, or none) feeds the counters
        and the circuit.

        Args:
            retry: the request is a retry: it does not wait for the pause.
            patience: the longest the request may wait for the pause, in seconds (its time
                left); None: as long as the pause lasts.

        Raises:
            EndpointDown: the circuit is open; nothing is sent.
            ModelServerError: the pause lasts longer than ``patience``; nothing is sent. Its
                status is 429 and its ``retry_after`` the pause left, as if the server had
                said so again.
        """
        shared = _GATE
        try:
            probe = self._enter(retry, patience)
        except EndpointDown:
            if shared is not None:
                self._tell(shared)
            raise
        ticket = None if shared is None else self._through(shared, probe)
        started = time.monotonic()
        try:
            yield
        except BaseException as exc:
            self._leave(started, exc, probe)
            if shared is not None:
                shared.leave(self.url, ticket)
                self._tell(shared)
            raise
        self._leave(started, None, probe)
        if shared is not None:
            shared.leave(self.url, ticket)

    def used(self, tokens: int) -> None:
        """Count the tokens a response used (its ``usage.total_tokens``) against the run's
        token limit, when the run keeps one."""
        shared = _GATE
        if shared is not None and tokens > 0:
            shared.used(self.url, tokens)

    def _through(self, shared: Gate, probe: bool) -> object:
        """Wait for the run's gate, this request counted as waiting; on a refusal the
        request is not sent, and gives its slot here back."""
        with self._cond:
            self._waiting += 1
        try:
            return shared.enter(self.url)
        except BaseException:
            with self._cond:
                self._in_flight -= 1
                self._requests -= 1
                if probe:
                    self._probing = False
                self._cond.notify_all()
            raise
        finally:
            with self._cond:
                self._waiting -= 1

    def _tell(self, shared: Gate) -> None:
        """Tell the run's gate when this process's circuit is open."""
        with self._cond:
            if self._opened_at is None:
                return
            now = time.monotonic()
            error = self._down_error(now)
            left = max(self.down_after, PROBE_AFTER) - (now - self._opened_at)
        shared.down(self.url, error, max(left, 0.0))

    def _enter(self, retry: bool, patience: float | None) -> bool:
        """Wait for a slot (and the pause); whether this request is the circuit's probe."""
        with self._cond:
            probe = self._check_circuit()
            self._waiting += 1
            try:
                while True:
                    now = time.monotonic()
                    if not retry and self._pause_until > now:
                        left = self._pause_until - now
                        if patience is not None and left > patience:
                            raise ModelServerError(
                                f"HTTP 429: the server asked every request to wait {left:.1f} s "
                                f"more (Retry-After), longer than this one may ({patience:.1f} s)",
                                url=self.url,
                                status=429,
                                retry_after=left,
                            )
                        self._cond.wait(left)
                    elif self.max_in_flight is not None and self._in_flight >= self.max_in_flight:
                        self._cond.wait()
                    else:
                        break
                    if not probe:  # (the probe holds its turn while it waits)
                        probe = self._check_circuit()
            except BaseException:
                if probe:
                    self._probing = False
                raise
            finally:
                self._waiting -= 1
            self._in_flight += 1
            self._requests += 1
            return probe

    def _check_circuit(self) -> bool:
        """Raise :class:`EndpointDown` while the circuit is open (opening it first when the
        server has answered nothing for long enough); let one probe through once
        ``down_after`` (at least :data:`PROBE_AFTER`) has passed since it opened (True: this
        request is the probe)."""
        now = time.monotonic()
        if self._opened_at is None and self._down(now, sending=True):
            self._opened_at = now
        if self._opened_at is None:
            return False
        wait = max(self.down_after, PROBE_AFTER)
        if not self._probing and now - self._opened_at >= wait:
            self._probing = True
            return True
        raise self._down_error(now)

    def _down_error(self, now: float) -> EndpointDown:
        """What a request refused by the open circuit raises (under the lock)."""
        down_for = now - self._streak_since
        return EndpointDown(
            f"model server at {self.url} is down: {self._streak} requests in a row failed, "
            f"with no answer for {down_for:.1f} s; requests to it fail at once for "
            f"{max(self.down_after, PROBE_AFTER):g} s (the circuit is open). Check the server; "
            "`harness resume` runs the trials left once it is back",
            url=self.url,
            failures=self._streak,
            down_for=down_for,
        )

    def _leave(self, started: float, error: BaseException | None, probe: bool) -> None:
        now = time.monotonic()
        with self._cond:
            self._in_flight -= 1
            self._seconds += now - started
            if error is None or isinstance(error, ModelRequestError) or _status(error) == 429:
                # The server answered (busy or refusing is still up): the circuit closes.
                self._answered += 1
                self._streak = 0
                self._opened_at = None
            if error is not None:
                self._errors[_kind(error)] += 1
                retry_after = getattr(error, "retry_after", None)
                if isinstance(retry_after, int | float) and retry_after > 0:
                    self._pause_until = max(self._pause_until, now + retry_after)
                if _down_signal(error):
                    if self._streak == 0:
                        self._streak_since = now
                    self._streak += 1
                    if self._down(now, sending=False):
                        self._opened_at = now
            if probe:
                self._probing = False
            self._cond.notify_all()

    def _down(self, now: float, *, sending: bool) -> bool:
        """Whether the circuit should open now (the rule in the module docstring): a failure
        just came (``sending`` False), or a request is about to be sent (True), which counts
        the time to now only when no request is in flight that could still answer."""
        if self._streak < self.down_failures:
            return False
        if sending and self._in_flight > 0:
            return False
        return now - self._streak_since >= self.down_after

    # --- what the run shows ---
    def stats(self) -> EndpointStats:
        """The counters now."""
        with self._cond:
            return EndpointStats(
                url=self.url,
                requests=self._requests,
                answered=self._answered,
                errors=dict(self._errors),
                in_flight=self._in_flight,
                waiting=self._waiting,
                seconds=self._seconds,
                open=self._opened_at is not None,
            )

    @property
    def open(self) -> bool:
        """Whether the circuit is open now."""
        with self._cond:
            return self._opened_at is not None


def _status(error: BaseException) -> int | None:
    return error.status if isinstance(error, ModelServerError) else None


def _kind(error: BaseException) -> str:
    limit = getattr(error, "limit", None)
    if isinstance(limit, str):  # a limit of ours, passed (max_response_bytes...): its name
        return limit
    status = _status(error)
    if status is not None:
        return str(status)
    if isinstance(error, ModelServerError):
        return "no response"
    if isinstance(error, ValueError):
        return "malformed"
    return type(error).__name__


def _down_signal(error: BaseException) -> bool:
    """Whether a failed request says the server is down (not that it is busy or refuses)."""
    if isinstance(error, ModelRequestError | EndpointDown):
        return False
    status = _status(error)
    if status is not None:
        return status >= 500
    return isinstance(error, ModelServerError | ValueError)


_REGISTRY: dict[str, Endpoint] = {}
_REGISTRY_LOCK = threading.Lock()
_GATE: Gate | None = None


def install_gate(new: Gate) -> None:
    """Make ``new`` the gate every endpoint of this process consults, from its next request.

    Raises:
        ConfigurationError: another gate is installed (another run keeping limits is running
            in this process).
    """
    global _GATE
    with _REGISTRY_LOCK:
        if _GATE is not None and _GATE is not new:
            raise ConfigurationError(
                "a run keeping run-wide limits is running in this process already: run this one "
                "in another process, or after it"
            )
        _GATE = new


def remove_gate(old: Gate) -> None:
    """Stop consulting ``old`` (when it is the gate installed)."""
    global _GATE
    with _REGISTRY_LOCK:
        if _GATE is old:
            _GATE = None


def gate() -> Gate | None:
    """The gate installed in this process, if any."""
    return _GATE


def endpoint(url: str) -> Endpoint:
    """The process's :class:`Endpoint` for the server at ``url`` (its API root), made on first
    use and shared by every agent and user calling it."""
    key = url.rstrip("/")
    with _REGISTRY_LOCK:
        found = _REGISTRY.get(key)
        if found is None:
            found = _REGISTRY[key] = Endpoint(key)
        return found


def endpoints() -> list[Endpoint]:
    """Every endpoint this process has called, in the order first used."""
    with _REGISTRY_LOCK:
        return list(_REGISTRY.values())


def forget_endpoints() -> None:
    """Drop every endpoint's state: limits, pauses, circuits and counters (tests; a new
    process starts without any)."""
    with _REGISTRY_LOCK:
        _REGISTRY.clear()

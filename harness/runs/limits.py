"""Limits on a run's model requests that hold for the whole run, in every process of it.

A run may keep, for each model server its agent calls:

- ``max_in_flight``: the most requests in flight at once, over every worker process and Ray
  actor of the run (each request holds a slot while it waits for its answer);
- ``rate`` (:class:`Rate`, ``600/min``): at most that many requests started in any period;
- ``tokens`` (``100000/min``): no request starts while the tokens the server's responses used
  (their ``usage.total_tokens``) in the last period add up to the limit or more, so a run
  overshoots by at most what the requests already in flight use.

They are a :class:`RunLimits` value in the run's :class:`~.spec.RunSpec` and its recorded
configuration (:meth:`RunLimits.to_config`, :meth:`RunLimits.from_config`: a resume keeps
them). Each worker holds a :class:`RunGate` for them while it runs trials: it is the
process's :class:`~harness.agents.endpoint.Gate`, keeping its state in the run's store
(:class:`~harness.store.limiter.Limiter`), so processes on one machine share them through a
SQLite store and machines through a Postgres one. The circuit is shared too, limits or none:
a process that finds a server down records it, and every process of the run refuses its
requests to that server while the record holds (the run stops on the first). Without limits a
request costs the gate no store access but a read of the shared circuit at most every
:data:`CIRCUIT_CACHE` seconds.
"""

from __future__ import annotations

import contextlib
import random
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..agents.endpoint import install_gate, remove_gate
from ..errors import ConfigurationError, EndpointDown
from ..store import Store
from ..store.limiter import Circuit, Limiter

__all__ = ["Rate", "RunGate", "RunLimits"]

_PERIODS = {"s": 1.0, "min": 60.0, "h": 3600.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*([a-z]+)\s*$")


@dataclass(frozen=True)
class Rate:
    """At most ``count`` per ``seconds`` (a sliding window).

    Attributes:
        count: how many (requests, or tokens).
        seconds: the period: 1 (``/s``), 60 (``/min``) or 3600 (``/h``).
    """

    count: int
    seconds: float

    @classmethod
    def parse(cls, text: str, *, what: str = "rate") -> Rate:
        """A rate written ``N/s``, ``N/min`` or ``N/h`` (``600/min``).

        Raises:
            ConfigurationError: another form, or N below 1.
        """
        found = _RATE.match(str(text).lower())
        if found is None or found.group(2) not in _PERIODS or int(found.group(1)) < 1:
            raise ConfigurationError(
                f"{what} {text!r}: give N/s, N/min or N/h with N a whole number of at least 1 "
                "(e.g. 600/min)"
            )
        return cls(int(found.group(1)), _PERIODS[found.group(2)])

    def __str__(self) -> str:
        unit = next((u for u, s in _PERIODS.items() if s == self.seconds), None)
        return f"{self.count}/{unit}" if unit else f"{self.count}/{self.seconds:g}s"

    def pair(self) -> tuple[int, float]:
        """``(count, seconds)``."""
        return self.count, self.seconds


@dataclass(frozen=True, kw_only=True)
class RunLimits:
    """The limits a run keeps on each model server's requests (see the module docstring).

    Attributes:
        max_in_flight: the most requests in flight at once over the run (None: no limit).
        rate: the most requests started per period.
        tokens: the most tokens used per period.
    """

    max_in_flight: int | None = None
    rate: Rate | None = None
    tokens: Rate | None = None

    def __post_init__(self) -> None:
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ConfigurationError(
                f"max_in_flight={self.max_in_flight}: give at least 1, or None for no limit"
            )

    @classmethod
    def of(
        cls,
        *,
        max_in_flight: int | None = None,
        rate_limit: str | Rate | None = None,
        token_limit: str | Rate | None = None,
    ) -> RunLimits | None:
        """The limits given (a rate as :class:`Rate` or its text, ``600/min``), or None when
        none is.

        Raises:
            ConfigurationError: a limit below 1, or a rate not written N/s, N/min or N/h.
        """
        rate = _rate(rate_limit, "rate_limit")
        tokens = _rate(token_limit, "token_limit")
        if max_in_flight is None and rate is None and tokens is None:
            return None
        return cls(max_in_flight=max_in_flight, rate=rate, tokens=tokens)

    @property
    def none(self) -> bool:
        """Whether no limit is kept (the gate then shares only the servers' circuits)."""
        return self.max_in_flight is None and self.rate is None and self.tokens is None

    def to_config(self) -> dict[str, Any]:
        """The limits as a run's configuration records them (plain JSON)."""
        return {
            "max_in_flight": self.max_in_flight,
            "rate": None if self.rate is None else str(self.rate),
            "tokens": None if self.tokens is None else str(self.tokens),
        }

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> RunLimits | None:
        """The limits a run's configuration records (``config["limits"]``), or None."""
        raw = config.get("limits")
        if not isinstance(raw, Mapping):
            return None
        return cls.of(
            max_in_flight=raw.get("max_in_flight"),
            rate_limit=raw.get("rate"),
            token_limit=raw.get("tokens"),
        )


def _rate(value: str | Rate | None, what: str) -> Rate | None:
    if value is None or isinstance(value, Rate):
        return value
    return Rate.parse(value, what=what)


HEARTBEAT = 10.0
"""Seconds between renewals of a process's slots."""
EXPIRY = 30.0
"""Seconds a process's slots last without renewal (a process that died frees them then)."""
CIRCUIT_CACHE = 0.5
"""Seconds a process trusts what it last read of a server's shared circuit."""
POLL = 0.05
"""About how long a request waiting for a slot sleeps between looks (jittered)."""


class RunGate:
    """The gate of one process of a run (:class:`~harness.agents.endpoint.Gate`): its limits
    and its shared circuits, kept in the run's store.

    Use it as a context manager around the trials a worker runs: the first one in installs it
    in the process and starts its heartbeat; the last one out removes it and gives back what
    it holds. One thread of the process at a time looks in the store for a slot; the others
    wait here, and a slot given back in this process wakes them at once.

    Args:
        store: the run's store.
        run_id: the run.
        limits: its limits.
        heartbeat, expiry: how often this process's slots are renewed, and how long they last
            without it.
        poll: about how long a waiting request sleeps between looks (jittered, 0.5x to 1.5x).
    """

    def __init__(
        self,
        store: Store,
        run_id: str,
        limits: RunLimits,
        *,
        heartbeat: float = HEARTBEAT,
        expiry: float = EXPIRY,
        poll: float = POLL,
    ) -> None:
        self.limits = limits
        self.limiter = Limiter(store, run_id, seconds=expiry)
        self.heartbeat = heartbeat
        self.poll = poll
        self._users = 0
        self._state = threading.Lock()
        self._turn = threading.Lock()  # (one thread of the process looks in the store)
        self._freed = threading.Condition()
        self._stale: list[tuple[str, str]] = []  # slots a failed give-back left
        self._circuits: dict[str, tuple[float, Circuit | None]] = {}
        self._reading = threading.Lock()  # (one thread of the process reads a circuit anew)
        self._stop = threading.Event()
        self._keeper: threading.Thread | None = None

    # --- installed while trials run ---
    def __enter__(self) -> RunGate:
        with self._state:
            if self._users == 0:
                install_gate(self)
                self._stop.clear()
                self._keeper = threading.Thread(target=self._renew, name="run-limits", daemon=True)
                self._keeper.start()
            self._users += 1
        return self

    def __exit__(self, *_exc: object) -> None:
        with self._state:
            self._users -= 1
            if self._users:
                return
            remove_gate(self)
            self._stop.set()
            if self._keeper is not None:
                self._keeper.join()
                self._keeper = None
            self.limiter.close()

    def _renew(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with contextlib.suppress(Exception):  # (the next beat tries again)
                self._give_back_stale()
                self.limiter.renew()

    # --- the gate ---
    def enter(self, url: str) -> object:
        """Wait for the run's limits to let one request to ``url`` start; its slot (or None).

        Raises:
            EndpointDown: a process of the run found ``url`` down.
        """
        limits = self.limits
        if limits.none:  # (nothing to count: only the shared circuit, read at most every
            self._refuse_if_down(url)  # CIRCUIT_CACHE seconds)
            return None
        with self._turn:
            while True:
                self._refuse_if_down(url)
                taken = self.limiter.take(
                    url,
                    max_in_flight=limits.max_in_flight,
                    rate=None if limits.rate is None else limits.rate.pair(),
                    tokens=None if limits.tokens is None else limits.tokens.pair(),
                )
                if taken.ok:
                    return taken.slot
                wait = self.poll if taken.wait is None else min(taken.wait, 4 * self.poll)
                with self._freed:
                    self._freed.wait(max(wait, 0.001) * random.uniform(0.5, 1.5))

    def leave(self, url: str, ticket: object) -> None:
        """Give the request's slot back (a failure leaves it to the heartbeat to retry)."""
        if isinstance(ticket, str):
            try:
                self.limiter.give_back(url, [ticket])
            except Exception:
                with self._state:
                    self._stale.append((url, ticket))
        with self._freed:
            self._freed.notify_all()

    def used(self, url: str, tokens: int) -> None:
        """Count a response's tokens in the run's window (when a token limit is kept)."""
        if self.limits.tokens is None:
            return
        with contextlib.suppress(Exception):  # (an uncounted response: the window undercounts)
            self.limiter.used(url, tokens)
        with self._freed:
            self._freed.notify_all()

    def down(self, url: str, error: EndpointDown, seconds: float) -> None:
        """Record for the run that ``url`` is down, unless the record says so already."""
        if self._circuit(url, fresh=False) is not None:
            return
        self.limiter.open_circuit(
            url, seconds, str(error), failures=error.failures, down_for=error.down_for
        )
        self._circuits.pop(url, None)

    def _refuse_if_down(self, url: str) -> None:
        found = self._circuit(url, fresh=False)
        if found is None:
            return
        raise EndpointDown(
            f"{found.why} (found down by process {found.pid} on {found.host}: every process "
            "of this run refuses its requests meanwhile)",
            url=url,
            failures=found.failures,
            down_for=found.down_for,
        )

    def _circuit(self, url: str, *, fresh: bool) -> Circuit | None:
        """The shared circuit of ``url``, as last read (within :data:`CIRCUIT_CACHE`)."""
        now = time.monotonic()
        cached = self._circuits.get(url)
        if not fresh and cached is not None and now - cached[0] < CIRCUIT_CACHE:
            return cached[1]
        if fresh or cached is None:
            self._reading.acquire()
        elif not self._reading.acquire(blocking=False):
            return cached[1]  # another thread is reading it anew: what it last was, meanwhile
        try:
            found = self.limiter.circuit(url)
            self._circuits[url] = (now, found)
        finally:
            self._reading.release()
        return found

    def _give_back_stale(self) -> None:
        with self._state:
            stale, self._stale = self._stale, []
        for url, slot in stale:
            try:
                self.limiter.give_back(url, [slot])
            except Exception:
                with self._state:
                    self._stale.append((url, slot))

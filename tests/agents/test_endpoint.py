"""A model server's endpoint: the limit on requests in flight, the pause after a 429, the
circuit that fails requests at once while the server is down, and the counters."""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import harness as hx
from harness.agents import endpoint as endpoint_module
from harness.agents.base import Toolbox
from harness.agents.endpoint import Endpoint, endpoint, endpoints, forget_endpoints
from harness.agents.openai import OpenAIAgent
from harness.errors import ConfigurationError, EndpointDown, ModelRequestError, ModelServerError
from harness.suite import Task
from harness.testing import FakeClock
from harness.testing.model_server import Failure, FakeChatServer, text_reply

URL = "http://x/v1"
TASK = Task(id="t1", instruction="Say hello.", required_outputs=[])


@pytest.fixture(autouse=True)
def _fresh_endpoints() -> Iterator[None]:
    forget_endpoints()
    yield
    forget_endpoints()


@pytest.fixture
def probe_after(monkeypatch: pytest.MonkeyPatch) -> float:
    """The least time an open circuit refuses, shortened from a second to keep tests fast."""
    monkeypatch.setattr(endpoint_module, "PROBE_AFTER", 0.1)
    return 0.1


class Now:
    """The endpoint module's clock, moved only by the test: ``time.monotonic()`` there reads
    ``t``."""

    def __init__(self) -> None:
        self.t = 1000.0

    def monotonic(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def now(monkeypatch: pytest.MonkeyPatch) -> Now:
    """The time the endpoints read, standing still until the test moves it: the circuit's
    windows are then exact, however slowly a loaded machine runs the test."""
    fake = Now()
    monkeypatch.setattr(endpoint_module, "time", fake)
    return fake


# --- helpers ---
def http(status: int, retry_after: float | None = None) -> ModelServerError:
    """The error of a request answered with HTTP ``status``."""
    return ModelServerError(f"HTTP {status}", url=URL, status=status, retry_after=retry_after)


def no_response() -> ModelServerError:
    """The error of a request that got no response."""
    return ModelServerError("cannot reach the server", url=URL)


def refused() -> ModelRequestError:
    """The error of a request the server refused (a 404: no such model)."""
    return ModelRequestError("HTTP 404", url=URL, status=404, server_message="no such model")


def fail(ep: Endpoint, error: BaseException, *, retry: bool = False) -> None:
    """One request that is sent and ends with ``error`` (not refused by the circuit)."""
    with pytest.raises(type(error)) as info:
        with ep.request(retry=retry):
            raise error
    assert info.value is error


def succeed(ep: Endpoint, *, retry: bool = False) -> None:
    """One request that gets an answer."""
    with ep.request(retry=retry):
        pass


def wait_until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Poll ``condition`` until it holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.005)


class Holders:
    """Threads that each hold one request open until released, counting those inside."""

    def __init__(self, ep: Endpoint, n: int) -> None:
        self.ep = ep
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.inside = self.peak = self.entered = 0
        self.threads = [threading.Thread(target=self._hold, daemon=True) for _ in range(n)]
        for t in self.threads:
            t.start()

    def _hold(self) -> None:
        with self.ep.request():
            with self.lock:
                self.inside += 1
                self.entered += 1
                self.peak = max(self.peak, self.inside)
            self.release.wait(5)
            with self.lock:
                self.inside -= 1

    def join(self) -> None:
        self.release.set()
        for t in self.threads:
            t.join(5)
        assert not any(t.is_alive() for t in self.threads)


def open_circuit(
    ep: Endpoint, failures: int = 3, wait: Callable[[float], None] = time.sleep
) -> None:
    """Fail ``failures`` requests in a row over ``ep.down_after`` seconds (``wait``ed between
    the first and the others): the circuit opens."""
    fail(ep, http(500))
    wait(ep.down_after)
    for _ in range(failures - 1):
        fail(ep, http(500))
    assert ep.open


# --- the limit on requests in flight ---
def test_max_in_flight_holds_back_requests_beyond_the_limit() -> None:
    """Five requests held open with a limit of two: two inside, three waiting, all in at last."""
    ep = Endpoint(URL).configure(max_in_flight=2)
    holders = Holders(ep, 5)
    wait_until(lambda: ep.stats().in_flight == 2 and ep.stats().waiting == 3)
    time.sleep(0.05)  # the waiting ones stay out while the two hold their slots
    assert holders.entered == 2 and ep.stats().waiting == 3
    holders.join()
    assert holders.entered == 5 and holders.peak == 2
    stats = ep.stats()
    assert (stats.requests, stats.answered, stats.in_flight, stats.waiting) == (5, 5, 0, 0)


def test_raising_the_limit_lets_waiting_requests_in() -> None:
    """A higher max_in_flight configured later wakes the requests waiting for a slot."""
    ep = Endpoint(URL).configure(max_in_flight=1)
    holders = Holders(ep, 3)
    wait_until(lambda: ep.stats().in_flight == 1 and ep.stats().waiting == 2)
    ep.configure(max_in_flight=3)
    # All three inside at once, though the first has not let go of its slot.
    wait_until(lambda: holders.inside == 3)
    assert ep.stats().waiting == 0
    holders.join()
    assert holders.peak == 3


# --- a 429's Retry-After ---
def test_a_429_pauses_new_requests_for_its_retry_after_but_not_retries() -> None:
    """After a 429 asking for 10 s, a new request is held back (counted as waiting) while a
    retry, which has waited its own backoff, goes at once; after a 429 asking for 0.3 s, a new
    request waits it out, and once it is over a request that may not wait at all goes.

    (The long pause outlasts whatever delays a loaded machine adds to the first part; the short
    one is timed from before its 429, a bound no delay breaks.)"""
    ep = Endpoint(URL)
    fail(ep, http(429, retry_after=10))
    started = time.monotonic()
    succeed(ep, retry=True)
    assert time.monotonic() - started < 5  # not after the pause
    entered: list[float] = []

    def new_request(ep: Endpoint) -> None:
        with ep.request():
            entered.append(time.monotonic())

    # (a daemon: it goes once the pause is over, after the test)
    threading.Thread(target=new_request, args=(ep,), daemon=True).start()
    wait_until(lambda: ep.stats().waiting == 1 or bool(entered))
    assert not entered and ep.stats().waiting == 1  # held back, and counted so
    assert ep.stats().requests == 2

    ep = Endpoint(URL)
    before_429 = time.monotonic()
    fail(ep, http(429, retry_after=0.3))
    thread = threading.Thread(target=new_request, args=(ep,))
    thread.start()
    thread.join(10)
    assert entered and entered[0] - before_429 > 0.29  # (the pause ends 0.3 s after the 429)
    with ep.request(patience=0):  # the pause is over: nothing is left to wait
        pass
    stats = ep.stats()
    assert stats.errors == {"429": 1} and stats.answered == 3 and stats.waiting == 0


def test_a_429_is_an_answer_it_never_opens_the_circuit_and_resets_the_streak() -> None:
    """Many 429s do not open the circuit; a 429 between failures starts their count again."""
    ep = Endpoint(URL).configure(down_after=0, down_failures=3)
    for _ in range(6):
        fail(ep, http(429))
    assert not ep.open
    fail(ep, http(500))
    fail(ep, http(500))
    fail(ep, http(429))
    fail(ep, http(500))
    fail(ep, http(500))
    assert not ep.open  # two in a row since the 429
    fail(ep, http(500))
    assert ep.open
    assert ep.stats().errors == {"429": 7, "500": 5}


def test_a_refused_request_resets_the_streak() -> None:
    """A 4xx refusal is an answer (the server is up): the failures before it do not count."""
    ep = Endpoint(URL).configure(down_after=0, down_failures=3)
    fail(ep, http(500))
    fail(ep, no_response())
    fail(ep, refused())
    fail(ep, http(503))
    fail(ep, ValueError("not JSON"))
    assert not ep.open
    fail(ep, no_response())
    assert ep.open


# --- the circuit ---
def test_three_failures_in_a_row_open_the_circuit_and_requests_fail_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 500, no response and a malformed body in a row open it (down_after=0, 3 failures):
    the next request raises EndpointDown without running, naming the server and the count,
    at once (not after waiting for the probe's turn, a minute here)."""
    monkeypatch.setattr(endpoint_module, "PROBE_AFTER", 60.0)
    ep = Endpoint(URL).configure(down_after=0, down_failures=3)
    fail(ep, http(500))
    fail(ep, no_response())
    assert not ep.open
    fail(ep, ValueError("response has no choices"))
    assert ep.open and ep.stats().open
    before = ep.stats()

    ran = False
    started = time.monotonic()
    with pytest.raises(EndpointDown) as info:
        with ep.request():
            ran = True
    assert not ran and time.monotonic() - started < 10
    # A retry is refused too.
    with pytest.raises(EndpointDown):
        with ep.request(retry=True):
            ran = True
    assert not ran
    after = ep.stats()
    assert (before.requests, before.answered) == (after.requests, after.answered) == (3, 0)
    assert before.errors == after.errors == {"500": 1, "no response": 1, "malformed": 1}

    down = info.value
    assert isinstance(down, ModelServerError) and isinstance(down, hx.HarnessError)
    assert down.failures == 3 and down.url == URL and down.transient is False
    assert down.down_for >= 0
    message = str(down)
    assert URL in message and "3 requests in a row failed" in message
    assert "circuit is open" in message and "fail at once" in message


def test_a_circuit_opened_with_down_after_0_still_refuses_before_its_probe(
    probe_after: float, now: Now
) -> None:
    """down_after=0 opens on the failures alone; requests are refused for PROBE_AFTER, then
    one probes."""
    ep = Endpoint(URL).configure(down_after=0, down_failures=2)
    fail(ep, http(500))
    fail(ep, http(502))
    for wait in (0.0, 0.0, probe_after - 0.01):
        now.advance(wait)
        with pytest.raises(EndpointDown):
            succeed(ep)
    now.advance(0.02)
    succeed(ep)  # the probe, answered: the circuit closes
    assert not ep.open
    succeed(ep)
    assert ep.stats().requests == 4


class InFlight:
    """One request held in flight on a thread until ``end()``, which fails it (no response)
    or lets it answer."""

    def __init__(self, ep: Endpoint) -> None:
        self.inside, self.go = threading.Event(), threading.Event()
        self.fails = True
        self.thread = threading.Thread(target=self._request, args=(ep,))
        self.thread.start()
        assert self.inside.wait(5)

    def _request(self, ep: Endpoint) -> None:
        with contextlib.suppress(ModelServerError):
            with ep.request():
                self.inside.set()
                self.go.wait(5)
                if self.fails:
                    raise no_response()

    def end(self, *, fail: bool = True) -> None:
        self.fails = fail
        self.go.set()
        self.thread.join(5)
        assert not self.thread.is_alive()


def test_failures_must_last_down_after_before_the_circuit_opens(now: Now) -> None:
    """With down_after=0.2 s, twenty failures in a row within 0.19 s do not open it; a request
    in flight failing after 0.2 s does."""
    ep = Endpoint(URL).configure(down_after=0.2, down_failures=3)
    for _ in range(20):
        fail(ep, http(500))
        now.advance(0.0095)
    assert not ep.open
    held = InFlight(ep)
    now.advance(0.02)
    assert not ep.open
    held.end(fail=True)
    assert ep.open
    with pytest.raises(EndpointDown) as info:
        succeed(ep)
    assert info.value.failures == 21 and info.value.down_for >= 0.2


def test_time_passing_with_a_request_in_flight_does_not_open_the_circuit() -> None:
    """After down_failures quick failures and down_after seconds, a new request is still sent
    while another is in flight (it could still answer); its answer ends the streak."""
    ep = Endpoint(URL).configure(down_after=0.2, down_failures=3)
    for _ in range(5):
        fail(ep, http(500))
    held = InFlight(ep)
    time.sleep(0.21)
    succeed(ep)  # sent, not refused, and answered
    held.end(fail=True)
    assert not ep.open and ep.stats().requests == 7


def test_a_request_after_down_after_with_none_in_flight_is_refused(now: Now) -> None:
    """Once down_failures have failed and nothing has answered for down_after, with no request
    in flight that could, the next request opens the circuit and is refused unsent (a server
    down while every trial waits out its backoff is found then, not at the next failure)."""
    ep = Endpoint(URL).configure(down_after=0.2, down_failures=3)
    for _ in range(3):
        fail(ep, http(500))
    assert not ep.open
    now.advance(0.21)
    ran = False
    with pytest.raises(EndpointDown) as info:
        with ep.request(retry=True):
            ran = True
    assert not ran and ep.open and ep.stats().requests == 3
    assert info.value.failures == 3 and info.value.down_for >= 0.2


def test_fewer_than_down_failures_never_open_however_long_ago() -> None:
    """Two failures (a blip) with down_failures=3 leave the circuit closed however long nothing
    else is sent; the next request goes out."""
    ep = Endpoint(URL).configure(down_after=0.05, down_failures=3)
    fail(ep, http(503))
    fail(ep, http(503))
    time.sleep(0.1)
    succeed(ep)
    assert not ep.open and ep.stats().requests == 3


def test_after_down_after_one_probe_goes_through_and_an_answer_closes_the_circuit(
    probe_after: float, now: Now
) -> None:
    """Once open for down_after, one request probes while the others are still refused; its
    answer closes the circuit."""
    ep = Endpoint(URL).configure(down_after=0.2, down_failures=2)
    open_circuit(ep, failures=2, wait=now.advance)
    for wait in (0.0, 0.19):
        now.advance(wait)
        with pytest.raises(EndpointDown):
            succeed(ep)
    now.advance(0.02)

    probe = Holders(ep, 1)
    wait_until(lambda: probe.inside == 1)
    with pytest.raises(EndpointDown):  # one probe at a time
        succeed(ep)
    assert ep.open
    probe.join()
    assert not ep.open and not ep.stats().open
    succeed(ep)
    succeed(ep)
    stats = ep.stats()
    assert stats.requests == 5 and stats.answered == 3 and stats.errors == {"500": 2}


def test_a_failed_probe_opens_the_circuit_again(probe_after: float, now: Now) -> None:
    """A probe that fails reopens the circuit for another down_after: requests fail at once."""
    ep = Endpoint(URL).configure(down_after=0.2, down_failures=2)
    open_circuit(ep, failures=2, wait=now.advance)
    now.advance(0.22)
    fail(ep, http(503))  # the probe
    assert ep.open
    now.advance(0.19)
    with pytest.raises(EndpointDown) as info:
        succeed(ep)
    assert info.value.failures == 3
    now.advance(0.02)
    succeed(ep)  # the next probe, answered
    assert not ep.open


def test_requests_waiting_for_a_slot_are_refused_when_the_circuit_opens() -> None:
    """A request held back by max_in_flight is not sent once the server counts as down."""
    ep = Endpoint(URL).configure(max_in_flight=1, down_after=0, down_failures=1)
    inside, go = threading.Event(), threading.Event()
    outcome: list[BaseException | None] = []

    def failing() -> None:
        with pytest.raises(ModelServerError):
            with ep.request():
                inside.set()
                go.wait(5)
                raise no_response()

    def waiting() -> None:
        try:
            succeed(ep)
            outcome.append(None)
        except EndpointDown as exc:
            outcome.append(exc)

    first = threading.Thread(target=failing)
    first.start()
    inside.wait(5)
    second = threading.Thread(target=waiting)
    second.start()
    wait_until(lambda: ep.stats().waiting == 1)
    go.set()
    first.join(5)
    second.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], EndpointDown)
    assert ep.stats().requests == 1


def test_a_probe_held_back_by_a_retry_after_pause_is_sent_when_the_pause_ends(
    probe_after: float,
) -> None:
    """The request let through to probe, held back by a 429's pause, is sent once it ends."""
    ep = Endpoint(URL).configure(down_after=0.1, down_failures=2)
    fail(ep, http(429, retry_after=0.5))  # new requests pause until 0.5 s from now
    fail(ep, http(500), retry=True)
    time.sleep(0.11)
    fail(ep, http(500), retry=True)
    assert ep.open
    time.sleep(probe_after + 0.02)
    ran = False
    with ep.request():  # the probe: it waits for the pause, then goes
        ran = True
    assert ran and not ep.open


def test_only_one_probe_at_a_time_whatever_else_leaves(probe_after: float) -> None:
    """A request from before the circuit opened, ending during the probe, lets no second one
    through."""
    ep = Endpoint(URL).configure(down_after=0.1, down_failures=2)
    old_inside, old_go = threading.Event(), threading.Event()
    probe_inside, probe_go = threading.Event(), threading.Event()

    def old_request() -> None:
        with pytest.raises(ModelServerError):
            with ep.request():
                old_inside.set()
                old_go.wait(5)
                raise http(408)

    def probe_request() -> None:
        with ep.request():
            probe_inside.set()
            probe_go.wait(5)

    old = threading.Thread(target=old_request)
    probe = threading.Thread(target=probe_request)
    old.start()
    try:
        assert old_inside.wait(5)
        open_circuit(ep, failures=2)
        time.sleep(probe_after + 0.02)
        probe.start()
        assert probe_inside.wait(5)
        old_go.set()  # the old request ends while the probe runs
        old.join(5)
        with pytest.raises(EndpointDown):
            succeed(ep)
    finally:
        old_go.set()
        probe_go.set()
        old.join(5)
        if probe.is_alive():
            probe.join(5)


# --- the counters ---
def test_stats_count_requests_answers_errors_by_kind_and_time() -> None:
    """Each request counts once; answers include 429s and refusals; errors go by kind."""
    ep = Endpoint(URL)
    with ep.request():
        time.sleep(0.02)
    succeed(ep)
    fail(ep, http(500))
    fail(ep, http(500))
    fail(ep, http(429))
    fail(ep, no_response())
    fail(ep, ValueError("not JSON"))
    fail(ep, refused())
    stats = ep.stats()
    assert stats.url == URL
    assert stats.requests == 8
    assert stats.answered == 4  # two answers, the 429 and the refusal
    assert stats.errors == {"500": 2, "429": 1, "no response": 1, "malformed": 1, "404": 1}
    assert stats.error_count == 6
    assert stats.seconds >= 0.02
    assert (stats.in_flight, stats.waiting, stats.open) == (0, 0, False)
    ep.configure(down_after=0, down_failures=3)
    for _ in range(3):
        fail(ep, http(500))
    assert ep.stats().open is True and ep.stats().errors["500"] == 5


# --- configuration ---
@pytest.mark.parametrize(
    ("options", "fix"),
    [
        ({"max_in_flight": 0}, "give at least 1, or None for no limit"),
        ({"max_in_flight": -3}, "give at least 1"),
        ({"down_after": -1.0}, "down_after must be >= 0 seconds"),
        ({"down_failures": 0}, "down_failures >= 1"),
    ],
)
def test_configure_refuses_bad_settings_and_keeps_the_old_ones(
    options: dict[str, Any], fix: str
) -> None:
    """A limit below 1, a negative time or fewer than one failure: a ConfigurationError naming
    the endpoint and the fix; the settings stay as they were."""
    ep = Endpoint(URL).configure(max_in_flight=2, down_after=5.0, down_failures=4)
    with pytest.raises(ConfigurationError) as info:
        ep.configure(**options)
    assert fix in str(info.value) and URL in str(info.value)
    assert (ep.max_in_flight, ep.down_after, ep.down_failures) == (2, 5.0, 4)


# --- one endpoint per server and process ---
def test_endpoint_is_one_object_per_url_until_forgotten() -> None:
    """A trailing slash names the same server; endpoints() lists them in order of first use;
    forget_endpoints() drops them and their state."""
    a = endpoint("http://a/v1")
    assert endpoint("http://a/v1/") is a and a.url == "http://a/v1"
    b = endpoint("http://b/v1")
    assert b is not a
    assert endpoints() == [a, b]
    succeed(a)
    forget_endpoints()
    assert endpoints() == []
    fresh = endpoint("http://a/v1/")
    assert fresh is not a and fresh.stats().requests == 0
    assert endpoints() == [fresh]


def test_endpoint_down_survives_pickling() -> None:
    """EndpointDown crosses from worker processes to the run: its attributes come back."""
    ep = Endpoint(URL).configure(down_after=0, down_failures=2)
    fail(ep, http(500))
    fail(ep, http(500))
    with pytest.raises(EndpointDown) as info:
        succeed(ep)
    copy = pickle.loads(pickle.dumps(info.value))
    assert type(copy) is EndpointDown
    assert str(copy) == str(info.value)
    assert (copy.url, copy.failures, copy.down_for) == (URL, 2, info.value.down_for)
    assert copy.transient is False and copy.status is None


# --- through the openai agent ---
def tools() -> dict[str, Any]:
    def get_time() -> str:
        """The time."""
        return "noon"

    return {"get_time": get_time}


def nothing_listening() -> tuple[str, int]:
    """The base URL and port of a fake server gone: nothing listens there."""
    with FakeChatServer([]) as gone:
        return gone.base_url, gone.port


def run_agent(agent: OpenAIAgent, store: hx.Store, clock: FakeClock) -> str:
    """One run of the agent in an episode of its own."""
    with hx.Episode(state=hx.DictState({}), store=store, clock=clock) as ep:
        return agent.run(TASK, Toolbox(tools(), ep), seed=0).message


def test_agent_requests_fail_at_once_while_the_server_is_down(
    store: hx.Store, clock: FakeClock, probe_after: float, now: Now
) -> None:
    """Two runs failing against a server with nothing listening open the circuit: the third
    raises EndpointDown without contacting the server (back up by then); after down_after a run
    probes it and succeeds."""
    base_url, port = nothing_listening()
    agent = OpenAIAgent(
        base_url=base_url,
        model="fake-model",
        attempts=1,
        down_after=0.2,
        down_failures=2,
        sleep=clock.sleep,
    )
    with pytest.raises(ModelServerError) as first:
        run_agent(agent, store, clock)
    assert not isinstance(first.value, EndpointDown)
    assert not agent.endpoint.open
    now.advance(0.21)  # failing for down_after
    with pytest.raises(ModelServerError) as second:
        run_agent(agent, store, clock)
    assert not isinstance(second.value, EndpointDown)
    assert agent.endpoint.open and agent.endpoint is endpoint(base_url)

    with FakeChatServer([text_reply("hello")], port=port) as server:
        now.advance(0.19)
        with pytest.raises(EndpointDown) as info:
            run_agent(agent, store, clock)
        assert server.requests == []
        assert info.value.failures == 2 and base_url in str(info.value)
        now.advance(0.02)
        assert run_agent(agent, store, clock) == "hello"
        assert len(server.requests) == 1
    stats = agent.endpoint.stats()
    assert not stats.open
    assert (stats.requests, stats.answered, stats.errors) == (3, 1, {"no response": 2})
    assert clock.sleeps == []


class Overlap:
    """A script that takes ``seconds`` to answer and counts the requests it answers at once."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.lock = threading.Lock()
        self.now = self.peak = self.calls = 0

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.now += 1
            self.calls += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(self.seconds)
            return text_reply("hello")
        finally:
            with self.lock:
                self.now -= 1


def runs_at_once(agent: OpenAIAgent, store: hx.Store, clock: FakeClock, n: int) -> list[Any]:
    """``n`` runs at once in threads: each one's answer, or the ModelServerError it raised."""
    outcomes: list[Any] = []
    lock = threading.Lock()

    def one() -> None:
        try:
            outcome: Any = run_agent(agent, store, clock)
        except ModelServerError as exc:
            outcome = exc
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(outcomes) == n
    return outcomes


@pytest.mark.parametrize("limit", [2, None])
def test_agent_max_in_flight_caps_the_requests_at_the_server(
    store: hx.Store, clock: FakeClock, limit: int | None
) -> None:
    """Six runs in six threads on a server taking 0.2 s an answer have at most max_in_flight=2
    requests at the server at once (without a limit, more)."""
    overlap = Overlap(0.2)
    with FakeChatServer(overlap) as server:
        agent = OpenAIAgent(base_url=server.base_url, model="fake-model", max_in_flight=limit)
        answers = runs_at_once(agent, store, clock, 6)
    assert answers == ["hello"] * 6 and overlap.calls == 6
    if limit is None:
        assert overlap.peak > 2
    else:
        assert overlap.peak == limit
    stats = agent.endpoint.stats()
    assert (stats.requests, stats.answered, stats.error_count, stats.in_flight) == (6, 6, 0, 0)


def test_a_server_down_from_the_start_opens_the_circuit_before_the_trials_last_attempts(
    store: hx.Store, clock: FakeClock
) -> None:
    """Eight trials at once on a server with nothing listening (attempts=4, backoff 0.4 s:
    attempts at 0, 0.4, 1.2 and 2.8 s; down_after=2 s): when the first last attempt is
    due, every request has failed and none is in flight, so the circuit opens there and
    then, and every trial ends with EndpointDown (the run stops, resumable) instead of
    spending its last attempt; no failure came between 1.2 and 2.8 s, so a rule waiting for
    one would have burnt them all. (The times are wide enough for threads started up to a
    second apart on a loaded machine.)"""
    agent = OpenAIAgent(
        base_url=nothing_listening()[0],
        model="fake-model",
        attempts=4,
        backoff=0.4,
        down_after=2.0,
        down_failures=10,
    )
    started = time.monotonic()
    raised = runs_at_once(agent, store, clock, 8)
    assert time.monotonic() - started < 10  # (2.8 s unloaded)
    assert all(isinstance(e, EndpointDown) for e in raised), raised
    stats = agent.endpoint.stats()
    assert (
        stats.open and stats.requests <= 8 * 3 and stats.errors == {"no response": stats.requests}
    )


def test_a_blip_failing_every_trials_first_attempts_at_once_does_not_open_the_circuit(
    store: hx.Store, clock: FakeClock
) -> None:
    """Sixteen 503s in a row among eight trials at once, with the circuit's defaults (10
    failures, 5 s): more than down_failures, but not for down_after; the retries get answers
    and the circuit stays closed (attempts=17: whichever trials the failures fall on).
    The eight trials share one fake clock, so each one's backoff moves every trial's time
    on: retry_for=None keeps the time budget, which is not under test, out of it."""
    failures = [Failure.http(503)] * 16
    with FakeChatServer(lambda request: text_reply("hello"), failures=failures) as server:
        agent = OpenAIAgent(
            base_url=server.base_url,
            model="fake-model",
            attempts=17,
            retry_for=None,
            sleep=clock.sleep,
        )
        raised = runs_at_once(agent, store, clock, 8)
    assert raised == ["hello"] * 8
    stats = agent.endpoint.stats()
    assert not stats.open and stats.errors == {"503": 16} and stats.answered == 8


def test_the_default_circuit_opens_within_seconds() -> None:
    """The defaults: ten failures in a row with no answer for 5 s (not a minute)."""
    ep = Endpoint(URL)
    assert (ep.down_failures, ep.down_after) == (10, 5.0)


def test_a_request_that_may_not_wait_out_the_pause_is_refused_unsent() -> None:
    """With a 429's pause of 10 s left, a new request whose patience is 0.1 s gets at once a
    429 ModelServerError carrying the pause left (nothing sent); a retry is sent. With a pause
    of 0.3 s, a request whose patience is longer waits it out, then is sent."""
    ep = Endpoint(URL)
    fail(ep, http(429, retry_after=10))
    started = time.monotonic()
    with pytest.raises(ModelServerError) as info:
        with ep.request(patience=0.1):
            pytest.fail("sent")
    assert time.monotonic() - started < 5  # not after the pause
    error = info.value
    assert error.status == 429 and error.retry_after is not None and 5 < error.retry_after <= 10
    assert "Retry-After" in str(error) and ep.stats().requests == 1
    assert ep.stats().waiting == 0
    succeed(ep, retry=True)
    assert ep.stats().requests == 2

    ep = Endpoint(URL)
    before_429 = time.monotonic()
    fail(ep, http(429, retry_after=0.3))
    with ep.request(patience=10.0):  # waits out the pause left, then goes
        pass
    assert ep.stats().requests == 2 and time.monotonic() - before_429 > 0.29

"""The circuit shared by a run's processes: a server one process finds down stops the others
at their next request, and a gate keeps its process's slots alive while it holds them."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.errors import EndpointDown
from harness.runs.limits import RunGate, RunLimits
from harness.runs.start import run_trials
from harness.store.limiter import Limiter
from harness.suite import Suite
from harness.testing.model_server import FakeChatServer, ReplayPolicy

from .test_run_limits import opts

pytestmark = pytest.mark.usefixtures("fresh_endpoints")


@pytest.mark.parametrize("max_in_flight", [10, None])
def test_a_server_one_process_finds_down_stops_the_other_at_once(
    toy: Suite, tmp_path: Path, max_in_flight: int | None
) -> None:
    """A server failing every request: the process whose requests fail fast opens its
    circuit and records it, and the other process, whose requests fail slowly, stops at its
    next request instead of spending its own five failures. The run stops saying the server
    is down. The circuit is shared whether the run keeps limits or none.

    (The slow failures wait for the fast process's fifth: a loaded machine may start one
    worker process a second or more after the other.)"""
    policy = ReplayPolicy(toy.tasks)
    slow = threading.Event()
    fast_failed = threading.Event()
    fast = [0]
    lock = threading.Lock()

    def failing(request: dict[str, Any]) -> dict[str, Any]:
        if policy.task_for(request).id == "t1":
            slow.set()
            fast_failed.wait(30)
            time.sleep(0.5)
        else:
            with lock:
                fast[0] += 1
                if fast[0] >= 5:
                    fast_failed.set()
        raise RuntimeError("the model crashed")  # (a 500 from the server)

    with FakeChatServer(failing) as server:
        result = run_trials(
            toy,
            agent="openai",
            agent_options=opts(server, attempts=20, backoff=0.0, down_after=0.0, down_failures=5),
            tasks=["t0", "t1"],
            trials=1,
            workers=2,
            logs=tmp_path,
            max_in_flight=max_in_flight,
        )
        requests = list(server.requests)
    assert result.stopped is not None and "is down" in result.stopped
    slow_ones = [r for r in requests if policy.task_for(r).id == "t1"]
    fast_ones = [r for r in requests if policy.task_for(r).id == "t0"]
    assert len(fast_ones) == 5  # (its own circuit opened)
    assert slow.is_set() or not slow_ones
    assert len(slow_ones) < 5  # (alone, it would have sent five)
    store = hx.Store(result.folder / "harness.db")
    assert store.runs()[0].status == "interrupted" and store.verify_chain().ok


def test_a_gate_s_heartbeat_keeps_its_slots_and_its_circuit_refuses_other_processes(
    tmp_path: Path,
) -> None:
    """A slot held past its expiry stays held while the heartbeat renews it, and is free once
    given back; a circuit one gate records makes another gate of the run refuse requests
    with the same message and who found it, until it closes."""
    store = hx.Store(tmp_path / "harness.db", create=True)
    limits = RunLimits(max_in_flight=1)
    # (An expiry of 2 s, renewed every 0.05 s: however slowly a loaded machine runs the
    # heartbeat, it renews in time; the record of a circuit lasts 2 s for the same reason.)
    here = RunGate(store, "r", limits, heartbeat=0.05, expiry=2.0)
    other = Limiter(store, "r")
    with here:
        ticket = here.enter("u")
        time.sleep(2.2)
        assert not other.take("u", max_in_flight=1).ok  # (renewed past its 2 s expiry)
        here.leave("u", ticket)
        assert other.take("u", max_in_flight=1).ok
    there = RunGate(store, "r", limits)
    down = EndpointDown("model server at u is down: 5 requests in a row failed", url="u")
    here.down("u", down, 2.0)
    with pytest.raises(EndpointDown, match="5 requests in a row failed.*found down by process"):
        there.enter("u")
    time.sleep(2.6)  # (the record closed, and the cached look at it lapsed)
    other.close()
    assert there.enter("u") is not None
    store.close()


def test_one_thread_reads_a_circuit_anew_while_the_others_go_on_with_the_last_look(
    tmp_path: Path,
) -> None:
    """When a process's look at a server's circuit lapses, one thread reads it again; the
    other threads' requests go on with what was last read instead of queueing behind that
    read (every request of a run passes the gate), and the next look is the new one."""
    store = hx.Store(tmp_path / "harness.db", create=True)
    gate = RunGate(store, "r", RunLimits())
    reading, release = threading.Event(), threading.Event()
    real = gate.limiter.circuit
    reads: list[str] = []

    def slow(url: str) -> Any:
        reads.append(url)
        reading.set()
        release.wait(10)
        return real(url)

    assert gate.enter("u") is None  # (the first look, cached)
    gate._circuits["u"] = (time.monotonic() - 10, None)  # (that look lapsed)
    gate.limiter.circuit = slow  # type: ignore[method-assign]
    outcomes: list[Any] = []

    def enter() -> None:
        try:
            outcomes.append(gate.enter("u"))
        except EndpointDown as exc:
            outcomes.append(exc)

    reader = threading.Thread(target=enter)
    reader.start()
    assert reading.wait(10)
    started = time.monotonic()
    assert gate.enter("u") is None  # (the last look: not down)
    assert time.monotonic() - started < 5 and reads == ["u"]
    Limiter(store, "r").open_circuit("u", 30, "model server at u is down")
    release.set()
    reader.join(10)
    assert [type(o) for o in outcomes] == [EndpointDown]  # (the reader saw the new record)
    with pytest.raises(EndpointDown, match="model server at u is down"):
        gate.enter("u")  # (the new look, cached)
    assert reads == ["u"]
    gate.limiter.close()
    store.close()

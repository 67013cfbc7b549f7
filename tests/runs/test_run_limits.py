"""Limits that hold for a whole run across its worker processes, counted at the model server:
requests in flight, requests started per period, tokens used per period; the limits are
recorded and kept on resume; the command line refuses malformed limits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.agents.endpoint import gate
from harness.cli import main
from harness.errors import ConfigurationError
from harness.runs import RunResult, resume_run
from harness.runs import resume as resume_module
from harness.runs.limits import Rate, RunLimits
from harness.runs.start import run_trials
from harness.runs.worker import Worker
from harness.suite import Suite
from harness.testing.model_server import FakeChatServer, ReplayPolicy

from .test_concurrency import openai_run

pytestmark = pytest.mark.usefixtures("fresh_endpoints")


def opts(server: FakeChatServer, **more: Any) -> dict[str, Any]:
    return {"base_url": server.base_url, "model": "fake", **more}


IN_FLIGHT = 8
"""The most requests of :func:`two_processes` in flight at once: two processes of four trials
each, one request at a time a trial."""


def two_processes(
    toy: Suite, server: FakeChatServer, logs: Path, concurrency: int = 4, **limits: Any
) -> RunResult:
    """Two trials of each task on two worker processes of ``concurrency`` trials in flight
    each, under ``limits``; every trial passes."""
    result = run_trials(
        toy,
        agent="openai",
        agent_options=opts(server),
        trials=2,
        workers=2,
        concurrency=concurrency,
        logs=logs,
        **limits,
    )
    assert result.stopped is None and all(r.passed for r in result.results)
    assert len(result.results) == 12
    return result


def most_in_window(times: list[float], seconds: float) -> int:
    """The most of ``times`` within any ``seconds`` (a window starting at one of them)."""
    times = sorted(times)
    return max(sum(1 for t in times[i:] if t < start + seconds) for i, start in enumerate(times))


def test_max_in_flight_holds_over_two_worker_processes(toy: Suite, tmp_path: Path) -> None:
    """Two processes of four trials each in flight send at most three requests at once in
    all, and every trial passes."""
    with FakeChatServer(ReplayPolicy(toy.tasks), latency=0.05) as server:
        two_processes(toy, server, tmp_path, max_in_flight=3)
    assert 2 <= server.peak_in_flight <= 3


def test_a_rate_limit_holds_over_two_worker_processes(toy: Suite, tmp_path: Path) -> None:
    """At 20 requests a second over two processes, no second at the server holds more than the
    20 the limiter let start in it and the requests it had let start before that were still on
    their way (at most the run's eight in flight), and the run took as long as that needs.

    The limiter counts starts in its own clock; the server sees arrivals, each later by the
    way there, which a loaded machine stretches: the bounds hold whatever that delay is."""
    with FakeChatServer(ReplayPolicy(toy.tasks)) as server:
        two_processes(toy, server, tmp_path, rate_limit="20/s")
    arrived = server.arrived
    assert len(arrived) > 40
    assert most_in_window(arrived, 1.0) <= 20 + IN_FLIGHT
    # (n starts at 20 a second span at least (n - 20) / 20 s; an arrival is never before its
    # start, and the first of them waited at most for the eight requests in flight before it)
    assert max(arrived) - min(arrived) >= (len(arrived) - 20 - IN_FLIGHT) / 20


def test_a_token_limit_holds_over_two_worker_processes(toy: Suite, tmp_path: Path) -> None:
    """No request reaches the server while the responses it sent in the last second used the
    limit or more, beyond what the requests in flight when it started used (the module's
    promise: a run overshoots by at most that), and the limit held the run back.

    The limiter counts a response's tokens when its process has read it, in its own clock: a
    response the server sent but no process has counted yet was in flight when the request
    started. Two processes of two trials each have at most three other requests in flight, so
    the bound holds however long a loaded machine takes to bring responses back."""
    limit = 1500
    with FakeChatServer(ReplayPolicy(toy.tasks)) as server:
        two_processes(toy, server, tmp_path, concurrency=2, token_limit=f"{limit}/s")
    used = [r["usage"]["total_tokens"] for r in server.responses]
    answered = server.answered
    assert sum(used) > 3 * limit  # (the run needed more than three windows' worth)
    in_flight = sum(sorted(used)[-3:])  # (the three others in flight, at their largest)
    assert in_flight < limit  # (so a run without the limit breaks the bound below)
    for at in server.arrived:
        window = sum(n for n, t in zip(used, answered, strict=True) if at - 0.99 < t < at)
        assert window < limit + in_flight
    # (the run's tokens at most limit + in_flight a second: it took more than two)
    assert max(server.arrived) - min(server.arrived) >= 2.0


def test_the_limits_are_recorded_and_resume_keeps_them(
    toy: Suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's configuration and evidence record the limits as plain JSON; the spec a resume
    builds its workers from carries the same limits; a run without limits records none."""
    specs: list[Any] = []
    build = resume_module.executor_for

    def spy(name: str, spec: Any, **kw: Any) -> Any:
        specs.append(spec)
        return build(name, spec, **kw)

    monkeypatch.setattr(resume_module, "executor_for", spy)
    with FakeChatServer(ReplayPolicy(toy.tasks)) as server:
        result = run_trials(
            toy,
            agent="openai",
            agent_options=opts(server),
            tasks=["t0"],
            logs=tmp_path,
            max_in_flight=2,
            rate_limit=Rate(600, 60.0),
            token_limit="100000/min",
        )
        assert gate() is None  # (removed after the run)
        recorded = {"max_in_flight": 2, "rate": "600/min", "tokens": "100000/min"}
        config = hx.Store(result.folder / "harness.db").runs()[0].config
        assert json.loads(config or "{}")["limits"] == recorded
        evidence = json.loads((result.folder / "evidence.json").read_text())
        assert evidence["limits"] == recorded
        limits = RunLimits.from_config({"limits": recorded})
        assert limits == RunLimits(max_in_flight=2, rate=Rate(600, 60.0), tokens=Rate(100000, 60.0))
        resumed = resume_run(result.folder, suite=toy.path)
    assert resumed.run.stopped is None
    assert [s.limits for s in specs] == [limits]
    assert RunLimits.from_config({}) is None and RunLimits.of() is None
    plain = run_trials(toy, agent="simulated", tasks=["t0"], logs=tmp_path / "plain")
    assert "limits" not in json.loads(hx.Store(plain.folder / "harness.db").runs()[0].config)


def test_a_worker_installs_its_gate_while_a_trial_runs(toy: Suite, tmp_path: Path) -> None:
    """A worker installs its run's gate while a trial runs and removes it after; without
    limits the gate counts nothing in the store (a request takes no slot) and shares only
    the circuit."""
    from harness.runs.spec import Job, RunSpec

    seen: list[object] = []

    class Peek:
        name = "peek"

        def config(self) -> dict[str, Any]:
            return {}

        def run(self, task: Any, toolbox: Any, *, seed: int) -> Any:
            seen.append(gate())
            return hx.agents.AgentOutput(message="")

    store = tmp_path / "harness.db"
    hx.Store(store, create=True).close()
    spec = RunSpec(
        suite=str(toy.path), agent=None, store_url=str(store), run_id="r", policy=hx.Policy()
    )
    bare = Worker(spec, suite=toy, agent=Peek())  # type: ignore[arg-type]
    with bare.gate:
        assert bare.gate.enter("http://model") is None  # (no slot: nothing counted)
    bare.trial(Job("t0", 0, 1))
    assert seen == [bare.gate] and gate() is None
    seen.clear()
    limited = Worker(
        RunSpec(**{**spec.__dict__, "limits": RunLimits(max_in_flight=1)}),
        suite=toy,
        agent=Peek(),  # type: ignore[arg-type]
    )
    limited.trial(Job("t0", 1, 1))
    assert seen == [limited.gate] and gate() is None


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--rate-limit", "600/fortnight"], "give N/s, N/min or N/h"),
        (["--rate-limit", "600"], "give N/s, N/min or N/h"),
        (["--token-limit", "0/min"], "--token-limit '0/min'"),
        (["--max-in-flight", "0"], "--max-in-flight"),
    ],
)
def test_malformed_limits_are_refused_before_anything_runs(
    toy: Suite, tmp_path: Path, flags: list[str], words: str
) -> None:
    """A malformed limit exits 2 saying which forms are accepted, and makes no run folder."""
    with FakeChatServer([]) as server:
        code, output = openai_run(toy, server, tmp_path, *flags)
    assert code == 2 and words in output, output
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_limits_for_an_agent_without_a_model_server_are_refused(tmp_path: Path, toy: Suite) -> None:
    """The simulated agent sends no model request: a limit on them is refused (exit 2)."""
    out = CliRunner().invoke(
        main, ["run", str(toy.path), "--logs", str(tmp_path), "--rate-limit", "10/s"]
    )
    assert out.exit_code == 2 and "sends none" in out.output, out.output


def test_the_command_line_runs_with_run_wide_limits(toy: Suite, tmp_path: Path) -> None:
    """harness run with the three limits runs the trials and records the limits."""
    limits = ["--max-in-flight", "1", "--rate-limit", "100/s", "--token-limit", "1000000/h"]
    with FakeChatServer(ReplayPolicy(toy.tasks)) as server:
        code, output = openai_run(toy, server, tmp_path, "--trials", "1", "--task", "t0", *limits)
    assert code == 0, output
    (folder,) = tmp_path.iterdir()
    config = json.loads(hx.Store(folder / "harness.db").runs()[0].config or "{}")
    assert config["limits"] == {"max_in_flight": 1, "rate": "100/s", "tokens": "1000000/h"}


def test_rates_parse_in_their_three_forms_and_refuse_others() -> None:
    """N/s, N/min and N/h parse and print back; anything else says what is accepted."""
    assert [Rate.parse(t) for t in ("5/s", "600/min", " 7 / H ")] == [
        Rate(5, 1.0),
        Rate(600, 60.0),
        Rate(7, 3600.0),
    ]
    assert str(Rate(600, 60.0)) == "600/min"
    for bad in ("600/fortnight", "1.5/s", "-1/s", "0/s", "per/min", ""):
        with pytest.raises(ConfigurationError, match="N/s, N/min or N/h"):
            Rate.parse(bad)
    with pytest.raises(ConfigurationError, match="max_in_flight=0"):
        RunLimits(max_in_flight=0)


def test_a_worker_computes_two_tasks_references_at_once_and_each_once(
    toy: Suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Threads asking for different tasks' reference outcomes compute them at once (one
    slow reference does not hold up another task's trials), and threads asking for the same
    task share one computation."""
    import threading
    import time

    from harness.runs import worker as worker_module
    from harness.runs.spec import RunSpec

    store = tmp_path / "harness.db"
    hx.Store(store, create=True).close()
    spec = RunSpec(
        suite=str(toy.path), agent=None, store_url=str(store), run_id="r", policy=hx.Policy()
    )
    worker = Worker(spec, suite=toy, agent="simulated")  # type: ignore[arg-type]
    first, second = toy.tasks[0], toy.tasks[1]
    second_done = threading.Event()
    computed: list[str] = []

    def slow(suite: Any, task: Any) -> Any:
        computed.append(task.id)
        if task.id == first.id:  # (waits for the other task's, which must not wait for it)
            assert second_done.wait(10), "the second task's reference waited for the first's"
            time.sleep(0.1)
        return f"reference of {task.id}"

    monkeypatch.setattr(worker_module, "reference_outcome", slow)
    answers: dict[int, Any] = {}

    def ask(i: int, task: Any) -> None:
        answers[i] = worker.reference(task)
        if task is second:
            second_done.set()

    threads = [
        threading.Thread(target=ask, args=(i, task))
        for i, task in enumerate([first, first, second])
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert answers == {
        0: f"reference of {first.id}",
        1: f"reference of {first.id}",
        2: f"reference of {second.id}",
    }
    assert sorted(computed) == sorted([first.id, second.id])

"""Many trials in flight: the same verdicts as a sequential run, a model server's 429s obeyed
and never counted as the agent's failures, and a server that is down stopping the run so that
resume finishes it without repeating anything."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.agents.endpoint import forget_endpoints
from harness.agents.openai import OpenAIAgent
from harness.cli import main
from harness.report.model import load_report
from harness.runs import RunResult, resume_run
from harness.runs.start import run_trials
from harness.suite import Suite
from harness.testing.model_server import Failure, FakeChatServer, ReplayPolicy

pytestmark = pytest.mark.usefixtures("fresh_endpoints")


class Overlap:
    """A replay script that takes ``seconds`` to answer and counts requests answered at once."""

    def __init__(self, suite: Suite, seconds: float) -> None:
        self.policy = ReplayPolicy(suite.tasks)
        self.seconds = seconds
        self.lock = threading.Lock()
        self.now = self.peak = 0

    def __call__(self, request: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            time.sleep(self.seconds)
            return self.policy(request)
        finally:
            with self.lock:
                self.now -= 1


def by_trial(result: RunResult) -> dict[tuple[str, int], bool]:
    return {(r.task_id, r.trial): r.passed for r in result.results}


def successes(result: RunResult) -> dict[str, int]:
    ids, counts, _ = result.counts()
    return dict(zip(ids, counts, strict=True))


def test_trials_in_flight_give_the_sequential_verdicts(toy: Suite, tmp_path: Path) -> None:
    """Threads in one process, and threads in two worker processes, give the verdicts a
    sequential run gives with the same seeds, trial for trial."""
    opts = {"error_rate": 0.3}
    runs = {
        name: run_trials(
            toy, agent="simulated", agent_options=opts, trials=4, seed=5, logs=tmp_path / name, **kw
        )
        for name, kw in {
            "sequential": {},
            "threads": {"concurrency": 24},  # (every trial at once),
            "processes": {"workers": 2, "concurrency": 3},
        }.items()
    }
    first = by_trial(runs["sequential"])
    assert 0 < sum(first.values()) < len(first) == 24  # (some trials fail: a real comparison)
    for name, result in runs.items():
        assert by_trial(result) == first, name
        assert successes(result) == successes(runs["sequential"])
        store = hx.Store(result.folder / "harness.db")
        assert store.verify_chain().ok
        assert Counter(r.episode_id for r in store.trial_rows()) == {
            r.episode_id: 1 for r in result.results
        }


def test_the_openai_agent_keeps_trials_in_flight_and_records_their_cost(
    toy: Suite, tmp_path: Path
) -> None:
    """Sixteen trials at once against a slow server: their requests overlap, every trial
    passes as it does alone, and each records its model calls and model time."""
    script = Overlap(toy, 0.05)
    with FakeChatServer(script) as server:
        opts = {"base_url": server.base_url, "model": "fake"}
        alone = run_trials(
            toy, agent="openai", agent_options=opts, trials=2, logs=tmp_path / "a", seed=1
        )
        assert script.peak == 1
        many = run_trials(
            toy,
            agent="openai",
            agent_options=opts,
            trials=2,
            logs=tmp_path / "b",
            seed=1,
            concurrency=12,
        )
    assert script.peak > 1
    assert by_trial(many) == by_trial(alone) == {k: True for k in by_trial(alone)}
    for r in many.results:
        assert r.usage["model_calls"] >= 2 and r.usage["model_seconds"] >= 0.05
        assert r.usage["model_retries"] == 0
    total = many.summary()["usage"]
    assert total["model_calls"] == sum(r.usage["model_calls"] for r in many.results)
    row = hx.Store(many.folder / "harness.db").trials()[0]
    assert row.agent_meta["model_seconds"] > 0  # (the trial's row keeps it)


def test_max_in_flight_caps_the_requests_at_the_server(toy: Suite, tmp_path: Path) -> None:
    """Twelve trials in flight, at most three requests at the server at once."""
    script = Overlap(toy, 0.03)
    with FakeChatServer(script) as server:
        result = run_trials(
            toy,
            agent="openai",
            agent_options={"base_url": server.base_url, "model": "fake", "max_in_flight": 3},
            trials=2,
            logs=tmp_path,
            concurrency=12,
        )
    assert all(r.passed for r in result.results)
    assert 1 < script.peak <= 3


def test_429_retry_after_is_obeyed_and_is_never_the_agents_failure(
    toy: Suite, tmp_path: Path
) -> None:
    """Rate-limited requests wait the server's Retry-After and succeed: the trials pass. A
    request rate-limited past its retries ends its trial as an infrastructure error, which
    the report counts as a failed trial (tau-bench) or leaves out (tau2-bench), and never as
    a failure of the agent's."""
    sleeps: list[float] = []
    lock = threading.Lock()

    def sleep(seconds: float) -> None:
        with lock:
            sleeps.append(seconds)

    with FakeChatServer(ReplayPolicy(toy.tasks)) as server:
        server.fail_next(*[Failure.rate_limited(retry_after=0.25)] * 3)
        agent = OpenAIAgent(
            base_url=server.base_url, model="fake", backoff=0.01, attempts=4, sleep=sleep
        )
        good = run_trials(toy, agent=agent, trials=1, logs=tmp_path / "good", concurrency=4)
        assert sleeps == [0.25] * 3  # each retried after the Retry-After, not the backoff
        assert all(r.passed and not r.infra_error for r in good.results)
        assert sum(r.usage["model_retries"] for r in good.results) == 3
        server.fail_next(*[Failure.rate_limited(retry_after=0.01)] * 4)
        bad = run_trials(toy, agent=agent, tasks=["t0"], trials=2, logs=tmp_path / "bad")
    assert [(r.passed, r.infra_error) for r in bad.results] == [(False, True), (True, False)]
    assert bad.failures_by_class() == {}
    failing = load_report(bad.folder, infra="fail")
    excluding = load_report(bad.folder, infra="exclude")
    assert (failing.tasks[0].trials, failing.tasks[0].successes) == (2, 1)
    assert (excluding.tasks[0].trials, excluding.tasks[0].successes) == (1, 1)
    assert "tau2" in excluding.to_dict()["infra_policy"]["description"]


def test_a_server_going_down_stops_the_run_and_resume_finishes_it(
    toy: Suite, tmp_path: Path
) -> None:
    """The server fails every request from the third on: its circuit opens, the run stops
    (interrupted, saying why) instead of burning every trial, and the trial caught mid-way
    has no row. With the server back, resume finishes the run: the stopped trial continues
    from its record, each write committed once."""
    policy = ReplayPolicy(toy.tasks)
    with FakeChatServer(policy) as server:
        port = server.port
        base_url = server.base_url

        def down_after_two(request: dict[str, Any]) -> dict[str, Any]:
            if len(server.responses) >= 1:  # the second answer is the last
                server.fail_next(*[Failure.http(503)] * 100)
            return policy(request)

        server.policy = down_after_two
        opts = {
            "base_url": base_url,
            "model": "fake",
            "attempts": 3,
            "backoff": 0.0,
            "down_after": 0.0,
            "down_failures": 2,
        }
        stopped = run_trials(
            toy, agent="openai", agent_options=opts, tasks=["t2", "t4"], trials=2, logs=tmp_path
        )
    assert stopped.interrupted and stopped.stopped is not None
    assert "is down" in stopped.stopped and base_url in stopped.stopped
    assert stopped.results == []  # (the first trial stopped mid-way; none other began)
    store = hx.Store(stopped.folder / "harness.db")
    assert store.runs()[0].status == "interrupted"
    (episode,) = store.episodes()
    assert episode.status == "failed" and store.trial_rows() == []
    committed = [t for t in store.transaction_rows(episode.id) if t.status == "committed"]
    assert len(committed) == 1  # the write the first answer asked for

    forget_endpoints()  # (as a new process resuming it would start)
    with FakeChatServer(ReplayPolicy(toy.tasks), port=port):
        resumed = resume_run(stopped.folder, suite=toy.path, concurrency=2)
    assert resumed.run.stopped is None
    assert [r.passed for r in resumed.run.results] == [True] * 4
    assert episode.id in resumed.resumed
    store = hx.Store(stopped.folder / "harness.db")
    assert store.verify_chain().ok
    writes = Counter(
        (e.id, t.idem_key)
        for e in store.episodes()
        for t in store.transaction_rows(e.id)
        if t.status == "committed" and t.action == "bump"
    )
    assert set(writes.values()) == {1}  # nothing done twice
    assert sum(1 for k in writes if k[0] == episode.id) == 3  # t2's three writes, once each


def test_cli_runs_trials_in_flight_and_checks_its_flags(toy: Suite, tmp_path: Path) -> None:
    """--concurrency runs and is recorded; --address without Ray and --max-in-flight for an
    agent without a model server are refused before anything runs."""
    runner = CliRunner()
    base = ["run", str(toy.path), "--agent", "simulated", "--trials", "2"]
    out = runner.invoke(main, [*base, "--concurrency", "4", "--logs", str(tmp_path / "ok")])
    assert out.exit_code == 0, out.output
    (folder,) = (tmp_path / "ok").iterdir()
    config = json.loads(hx.Store(folder / "harness.db").runs()[0].config or "{}")
    assert (config["concurrency"], config["executor"]) == (4, "processes")
    for extra, words in (
        (["--address", "auto"], "--executor ray"),
        (["--max-in-flight", "2"], "openai agent"),
        (["--model-retries", "2"], "openai agent"),
        (["--model-retry-for", "5"], "openai agent"),
    ):
        out = runner.invoke(main, [*base, *extra, "--logs", str(tmp_path / "no")])
        assert out.exit_code == 2 and words in out.output, out.output
    assert not (tmp_path / "no").exists()


def openai_run(toy: Suite, server: FakeChatServer, logs: Path, *extra: str) -> tuple[int, str]:
    """``harness run`` of the toy suite with the openai agent on ``server``: exit code, output."""
    forget_endpoints()  # (each command is a new process to its endpoints)
    out = CliRunner().invoke(
        main,
        [
            *("run", str(toy.path), "--agent", "openai", "--base-url", server.base_url),
            *("--model", "fake", "--logs", str(logs), *extra),
        ],
    )
    return out.exit_code, out.output


def test_a_rate_limit_burst_past_the_retry_budget_is_run_again_by_resume(
    toy: Suite, tmp_path: Path
) -> None:
    """A burst of 429s (Retry-After 0.2 s) longer than the requests' retries (2) ends the
    trials in flight as infrastructure errors, their failed attempts counted in the usage;
    `harness resume` runs exactly those trials again in new episodes, keeping the failed
    attempts in the record, and every trial is then judged."""
    with FakeChatServer(ReplayPolicy(toy.tasks)) as server:
        server.fail_next(*[Failure.rate_limited(retry_after=0.2)] * 9)
        code, out = openai_run(
            toy,
            server,
            tmp_path,
            *("--trials", "2", "--concurrency", "3", "--model-retries", "2"),
            *("--model-retry-for", "10"),
        )
        (folder,) = tmp_path.iterdir()
        store = hx.Store(folder / "harness.db")
        failed = [r for r in store.trial_rows() if r.infra_error]
        store.close()
        assert code == 0 and 1 <= len(failed) <= 3, out
        summary = json.loads((folder / "summary.json").read_text())
        assert summary["usage"]["model_retries"] >= 2 * len(failed)
        forget_endpoints()
        resumed = CliRunner().invoke(main, ["resume", str(folder), "--suite", str(toy.path)])
    assert resumed.exit_code == 0, resumed.output
    assert f"ran {len(failed)} again after an infrastructure error" in resumed.output
    store = hx.Store(folder / "harness.db")
    rows = store.trial_rows()
    assert len(rows) == 12 + len(failed)  # (the failed attempts stay)
    report = load_report(folder)
    assert sum(t.trials for t in report.tasks) == 12
    assert sum(t.successes for t in report.tasks) == 12
    again = {r.episode_id for r in rows} - {r.episode_id for r in failed}
    assert {f"{r.episode_id}~1" for r in failed} <= again
    assert store.verify().ok and store.runs()[0].status == "finished"
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["retried"] == len(failed) and summary["trials"] == 12
    assert summary["usage"]["model_retries"] >= 2 * len(failed)  # (the failed attempts')
    store.close()


def test_a_server_down_from_the_start_stops_the_run_within_seconds(
    toy: Suite, tmp_path: Path
) -> None:
    """Every request fails (503) from the start, 8 trials in flight: the circuit opens within
    seconds, the run stops having touched at most the trials in flight, exits 3 and says so;
    once the server is back, `harness resume` finishes every trial."""
    with FakeChatServer(ReplayPolicy(toy.tasks)) as server:
        server.fail_next(*[Failure.http(503)] * 10_000)
        started = time.monotonic()
        code, out = openai_run(toy, server, tmp_path, "--trials", "2", "--concurrency", "8")
        took = time.monotonic() - started
        (folder,) = tmp_path.iterdir()
        assert code == 3 and "is down" in out, out
        assert took < 30, took
        store = hx.Store(folder / "harness.db")
        assert len(store.episodes()) <= 8
        assert store.runs()[0].status == "interrupted"
        store.close()
        server.clear_failures()  # the server is back
        forget_endpoints()
        resumed = CliRunner().invoke(
            main, ["resume", str(folder), "--suite", str(toy.path), "--concurrency", "4"]
        )
    assert resumed.exit_code == 0, resumed.output
    store = hx.Store(folder / "harness.db")
    assert len(store.trial_rows()) == 12 and all(r.passed for r in store.trial_rows())
    assert store.verify().ok
    store.close()


def test_a_broken_server_ends_its_trials_as_infrastructure_errors_and_the_run_goes_on(
    toy: Suite, tmp_path: Path
) -> None:
    """Through `harness run`: a server answering 300 MB bodies ends each trial it answers as an
    infrastructure error naming max_response_bytes, within seconds and without reading the
    bodies whole; one dripping its answer a byte at a time ends the trial at request_timeout.
    The run finishes, the store verifies, and nothing is counted as the agent's failure."""
    from ..agents.test_openai_limits import RawServer, completion, headers, huge_body

    with RawServer(huge_body(300 * 1024 * 1024)) as server:
        forget_endpoints()
        started = time.monotonic()
        out = CliRunner().invoke(
            main,
            [
                *("run", str(toy.path), "--agent", "openai", "--base-url", server.base_url),
                *("--model", "m", "--trials", "1", "--task", "t0", "--task", "t1"),
                *("--logs", str(tmp_path / "huge")),
            ],
        )
        took = time.monotonic() - started
    assert out.exit_code == 3 and "max_response_bytes" in out.output, out.output
    assert "infrastructure failures: 2 of 2" in out.output
    assert took < 60 and server.requests == 2  # (not retried: the same answer would come)
    (folder,) = (tmp_path / "huge").iterdir()
    store = hx.Store(folder / "harness.db")
    assert [r.infra_error for r in store.trial_rows()] == [True, True]
    assert store.verify().ok and store.runs()[0].status == "finished"
    store.close()

    body = completion("slow")

    def drip(server: RawServer, handler: Any) -> None:
        headers(handler, length=len(body))
        for i in range(len(body)):
            server.write(handler, body[i : i + 1])
            time.sleep(0.05)

    with RawServer(drip) as server:
        forget_endpoints()
        options = {"base_url": server.base_url, "model": "m", "attempts": 1}
        result = run_trials(
            toy,
            agent="openai",
            agent_options={**options, "timeout": 5.0, "request_timeout": 0.5},
            tasks=["t0"],
            logs=tmp_path / "drip",
        )
    (trial,) = result.results
    assert trial.infra_error and not trial.passed and result.failures_by_class() == {}
    store = hx.Store(result.folder / "harness.db")
    assert "request_timeout" in json.loads(store.trial_rows()[0].agent_meta)["error"]
    store.close()


def test_cli_says_why_a_run_stopped_and_exits_3(
    toy: Suite, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run stopped by a down server prints the reason and how to finish it, and exits 3."""
    import harness.cli.run as cli_run

    def stopped_run(*args: Any, **kwargs: Any) -> RunResult:
        result = run_trials(*args, **kwargs)
        result.interrupted = True
        result.stopped = "model server at http://127.0.0.1:9/v1 is down"
        return result

    monkeypatch.setattr(cli_run, "run_trials", stopped_run)
    out = CliRunner().invoke(
        main, ["run", str(toy.path), "--agent", "simulated", "--logs", str(tmp_path)]
    )
    assert out.exit_code == 3
    assert "stopped" in out.output and "is down" in out.output
    assert "harness resume" in out.output


def test_bad_concurrency_and_executor_are_refused(toy: Suite, tmp_path: Path) -> None:
    """A concurrency below 1, an unknown executor, an address without Ray, or Ray with an
    agent object are clear errors, and no run folder is made."""
    cases: list[dict[str, Any]] = [
        {"concurrency": 0},
        {"executor": "threads"},
        {"address": "auto"},
        {"executor": "ray", "agent": OpenAIAgent(base_url="http://127.0.0.1:9/v1", model="m")},
    ]
    for kwargs in cases:
        with pytest.raises(hx.ConfigurationError):
            run_trials(toy, logs=tmp_path / "logs", **kwargs)
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("concurrency", [1, 3])
def test_a_worker_process_dying_stops_the_run_with_the_store_consistent(
    toy: Suite, tmp_path: Path, concurrency: int
) -> None:
    """A worker process that dies mid-trial stops the run (interrupted, saying so) instead of
    hanging or raising from deep inside; the store verifies and resume can take over."""
    agent = f"{Path(__file__).with_name('dying_agent.py')}:DyingAgent"
    result = run_trials(
        toy, agent=agent, trials=1, workers=2, concurrency=concurrency, logs=tmp_path
    )
    assert result.interrupted and result.stopped is not None
    assert "worker process died" in result.stopped and "harness resume" in result.stopped
    store = hx.Store(result.folder / "harness.db")
    assert store.runs()[0].status == "interrupted" and store.trial_rows() == []
    assert store.verify_chain().ok


def test_the_progress_column_shows_what_is_in_flight() -> None:
    """Trials in flight, and the model's request rate and errors: live from this process's
    endpoints, or from the finished trials' usage when they ran elsewhere."""
    from harness.agents.endpoint import endpoint
    from harness.cli.run import Flight
    from harness.runs.worker import TrialResult

    flight = Flight()
    assert flight.text() == "in flight 0"
    for i in range(3):
        flight.started("t", i)
    result = TrialResult(
        task_id="t",
        trial=0,
        seed=0,
        episode_id="e",
        passed=True,
        partial=None,
        outcome="committed",
    )
    result.usage = {"model_calls": 4, "model_retries": 2}
    flight.finished(result)
    assert flight.text().startswith("in flight 2, model ") and flight.text().endswith(" 2 errors")
    with endpoint("http://127.0.0.1:9/v1").request():
        pass
    assert flight.text().endswith(", 0 errors")  # (live counts win)


@pytest.mark.parametrize(("workers", "concurrency"), [(1, 3), (2, 2)])
def test_a_server_down_from_the_start_stops_trials_in_flight_too(
    toy: Suite, tmp_path: Path, workers: int, concurrency: int
) -> None:
    """Nothing listens: the first failures open each worker's circuit and the run stops
    without trying the rest. The trials that got a failure are infrastructure errors, the ones
    stopped have no row (resume runs them), and nothing is counted as the agent's."""
    with FakeChatServer([]) as gone:
        base_url = gone.base_url  # (a port nothing listens on once it stops)
    opts = {
        "base_url": base_url,
        "model": "fake",
        "attempts": 1,
        "down_after": 0.0,
        "down_failures": 1,
    }
    result = run_trials(
        toy,
        agent="openai",
        agent_options=opts,
        trials=4,
        workers=workers,
        concurrency=concurrency,
        logs=tmp_path,
    )
    assert result.stopped is not None and "is down" in result.stopped
    assert 0 < len(result.results) < 24
    assert all(r.infra_error and not r.failures for r in result.results)
    store = hx.Store(result.folder / "harness.db")
    assert store.runs()[0].status == "interrupted"
    assert len(store.trial_rows()) == len(result.results)
    assert store.verify_chain().ok


class AskAfter:
    """A stop asked for once ``n`` results are in."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.seen = 0

    @property
    def requested(self) -> bool:
        return self.seen >= self.n


@pytest.mark.parametrize(("workers", "concurrency"), [(1, 4), (2, 2)])
def test_a_stop_ends_the_trials_in_flight_and_starts_no_more(
    toy: Suite, tmp_path: Path, workers: int, concurrency: int
) -> None:
    """Asked to stop (Ctrl-C) after the first result: the trials in flight end and are
    reported, no new one starts, and KeyboardInterrupt is raised; every reported trial has its
    row and nothing else ran."""
    from harness.policy import Policy
    from harness.runs.executors import InProcess, Processes
    from harness.runs.layout import run_row, store_url
    from harness.runs.spec import Job, RunSpec
    from harness.runs.worker import Worker
    from harness.store import Store

    folder = tmp_path / "run"
    folder.mkdir()
    url = store_url(folder)
    Store(url, create=True).add(
        run_row("r", suite=toy.name, status="running", config="{}", evidence="{}")
    )
    spec = RunSpec(str(toy.path), "simulated", url, "r", Policy())
    jobs = [Job(t.id, i, i) for i in range(10) for t in toy.tasks]
    executor = (
        InProcess(Worker(spec), concurrency)
        if workers == 1
        else Processes(spec, workers, concurrency)
    )
    stop = AskAfter(1)
    got: list[Any] = []

    def on_result(_job: Any, result: Any) -> None:
        got.append(result)
        stop.seen += 1

    with pytest.raises(KeyboardInterrupt):
        executor.run(jobs, on_result=on_result, stop=stop)
    # The trials in flight end, and those the workers took before the stop reached them:
    # how many is timing (a loaded machine delivers the stop later), but far from all.
    assert 1 <= len(got) < len(jobs) // 2
    rows = Store(url).trial_rows()
    assert sorted(r.episode_id for r in rows) == sorted(r.episode_id for r in got)

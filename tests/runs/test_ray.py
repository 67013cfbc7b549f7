"""Runs on Ray: trials as Ray tasks on a local Ray instance, all writing one run.

One small Ray instance serves the module (two CPUs, no dashboard); each test makes its own run.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray")

import harness as hx  # noqa: E402
from harness.runs import ray_pool  # noqa: E402
from harness.runs.layout import run_row, store_url  # noqa: E402
from harness.runs.ray_pool import (  # noqa: E402
    RAY_LEASE_SECONDS,
    RayExecutor,
    RayWorker,
    check_store_reach,
)
from harness.runs.spec import Job, RunSpec  # noqa: E402
from harness.runs.start import run_trials, trial_seed  # noqa: E402
from harness.runs.worker import TrialResult, WorkerLost  # noqa: E402

from ..toy_env import write_suite  # noqa: E402
from .ray_agents import ledger_lines  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def jobs_of(tasks: list[str], trials: int, seed: int) -> list[Job]:
    """The jobs of a run, as run_trials makes them."""
    return [Job(t, i, trial_seed(seed, t, i)) for i in range(trials) for t in tasks]


def run_spec(
    suite: Path, folder: Path, run_id: str, agent: str, options: Any, lease: float = 600.0
) -> RunSpec:
    """What builds a run's workers (the suite, agent, store, run, policy...), as run_trials
    gives them; the run's store and its row are created here."""
    folder.mkdir(parents=True, exist_ok=True)
    url = store_url(folder)
    store = hx.Store(url, create=True)
    store.add(run_row(run_id, suite="toy", status="running", config="{}", evidence="{}"))
    store.close()
    return RunSpec(
        str(suite), agent, url, run_id, hx.Policy(), agent_options=options, lease_seconds=lease
    )


def successes(results: list[TrialResult]) -> dict[str, int]:
    """Passed trials per task."""
    out: Counter[str] = Counter()
    for r in results:
        out[r.task_id] += r.passed
    return dict(out)


def test_a_run_on_ray_counts_what_a_sequential_run_counts(cluster: str, tmp_path: Path):
    """Trials split over Ray workers (two trials at once in each) give every task the success
    count the same seeds give in one process, and the store holds one trial row per trial."""
    suite = write_suite(tmp_path / "suite", [1, 2, 3])
    options = {"error_rate": 0.25}
    sequential = run_trials(
        suite, agent="simulated", agent_options=options, trials=3, seed=11, logs=tmp_path / "seq"
    )
    folder = tmp_path / "logs" / "r"
    got: list[TrialResult] = []
    started: list[Job] = []
    jobs = jobs_of(["t0", "t1", "t2"], 3, 11)
    RayExecutor(run_spec(suite, folder, "r", "simulated", options), workers=2, concurrency=2).run(
        jobs,
        on_result=lambda _job, r: got.append(r) if r is not None else None,
        on_start=started.append,
    )
    assert sorted(started) == sorted(jobs)
    assert len(got) == 9
    expected = successes(sequential.results)
    assert 0 < sum(expected.values()) < 9  # some trials fail: the counts say something
    assert successes(got) == expected
    store = hx.Store(store_url(folder))
    rows = store.trial_rows("r")
    assert sorted(r.episode_id for r in rows) == sorted(f"r-{j.task_id}-{j.trial}" for j in jobs)
    assert successes([TrialResult.from_row(r) for r in rows]) == expected
    assert store.verify().ok
    store.close()
    assert ray.is_initialized()  # a Ray connection the caller made stays


def test_a_killed_ray_worker_repeats_nothing(cluster: str, tmp_path: Path):
    """A Ray worker process killed right after a trial's first write committed: the run still
    finishes every trial once, the killed trial's episode is resumed from its records, and its
    write (like every other) happened and committed exactly once; every chain verifies."""
    suite, ledger = crash_suite(tmp_path, [2, 3])
    marker = tmp_path / "crashed"
    folder = tmp_path / "logs" / "r"
    got: list[TrialResult] = []
    jobs = jobs_of(["t0", "t1"], 3, 0)
    spec = run_spec(
        suite, folder, "r", "tests.runs.ray_agents:CrashOnce", {"marker": str(marker), "task": "t1"}
    )
    RayExecutor(spec, workers=2, concurrency=2).run(
        jobs, on_result=lambda _job, r: got.append(r) if r is not None else None
    )
    crashed = marker.read_text()
    assert crashed.startswith("r-t1-")
    assert sorted(r.episode_id for r in got) == sorted(f"r-{j.task_id}-{j.trial}" for j in jobs)
    assert all(r.passed for r in got)  # the final states equal the reference's: bumped once

    store = hx.Store(store_url(folder))
    try:
        assert len(store.trial_rows("r")) == len(jobs)
        assert "resume" in [r.kind for r in store.log(crashed)]
        for row in store.trial_rows("r"):
            txns = [t for t in store.transactions(row.episode_id) if t.mutating]
            # A trial in flight beside the crashed one in the killed process may have been in
            # a call: in doubt, its effect absent from the state rebuilt from the records, it
            # was abandoned and ran again. Every write committed once, whatever happened.
            assert {t.status for t in txns} <= {"committed", "abandoned"}
            committed = [t.idem_key for t in txns if t.status == "committed"]
            assert len(committed) == len(set(committed)) == (2 if row.task_id == "t0" else 3)
        assert [t.status for t in store.transactions(crashed)] == ["committed"] * 3
        report = store.verify()
        assert report.ok and not report.findings, report.findings
    finally:
        store.close()
    # The crashed trial's first bump ran once, before the kill; resumed, it was not run again.
    effects = Counter(ledger_lines(ledger))
    assert [effects[f"{crashed} {key}"] for key in ("a:0", "b:1", "c:2")] == [1, 1, 1]


def crash_suite(tmp_path: Path, steps: list[int]) -> tuple[Path, Path]:
    """A toy suite whose bumps each note their effect in a ledger file; the suite, the ledger."""
    suite = write_suite(tmp_path / "suite", steps)
    ledger = tmp_path / "ledger.txt"
    spec = json.loads((suite / "suite.json").read_text())
    spec["environment"] = "tests.runs.ray_agents:LedgerEnvironment"
    spec["environment_options"] = {"ledger": str(ledger)}
    (suite / "suite.json").write_text(json.dumps(spec))
    return suite, ledger


def test_a_trial_whose_worker_dies_every_time_is_given_up_after_the_others(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A trial that kills its worker each time it runs is handed out LOST_WORKER_LIMIT + 1
    times, then given up with an error naming it and the fix, after every other trial finished;
    its write still happened once."""
    monkeypatch.setattr(ray_pool, "LOST_WORKER_LIMIT", 0)  # given up at its first loss
    suite, ledger = crash_suite(tmp_path, [1, 2])
    folder = tmp_path / "logs" / "r"
    got: list[TrialResult] = []
    options = {"marker": str(tmp_path / "m"), "task": "t1", "always": True}
    with pytest.raises(WorkerLost, match=r"given up, .* 1 time\(s\): t1 trial 0 .*harness resume"):
        RayExecutor(
            run_spec(suite, folder, "r", "tests.runs.ray_agents:CrashOnce", options),
            workers=2,
            concurrency=1,
        ).run(
            jobs_of(["t0", "t1"], 1, 0),
            on_result=lambda _job, r: got.append(r) if r is not None else None,
        )
    assert [r.episode_id for r in got] == ["r-t0-0"]
    assert (tmp_path / "m").read_text().splitlines() == ["r-t1-0"]
    assert Counter(ledger_lines(ledger))["r-t1-0 a:0"] == 1


def test_a_trial_whose_lease_another_process_holds_runs_when_it_expires(
    cluster: str, tmp_path: Path
):
    """A trial whose episode lease is held by a live process elsewhere is not dropped: it is
    handed out again until the lease expires, then runs, and its result is reported."""
    suite = write_suite(tmp_path / "suite", [1])
    folder = tmp_path / "logs" / "r"
    spec = run_spec(suite, folder, "r", "scripted", {}, lease=2.0)  # (the other's expires)
    store = hx.Store(store_url(folder))
    assert store.acquire_lease("r-t0-0", owner="elsewhere", seconds=2.0)
    got: list[TrialResult | None] = []
    RayExecutor(spec, workers=1, concurrency=2).run(
        jobs_of(["t0"], 2, 0),
        on_result=lambda _job, r: got.append(r),
    )
    assert sorted(r.episode_id for r in got if r is not None) == ["r-t0-0", "r-t0-1"]
    assert len(store.trial_rows("r")) == 2
    store.close()


def test_a_stop_hands_out_nothing_more_and_lets_the_trials_in_flight_finish(
    cluster: str, tmp_path: Path
):
    """Once a stop is requested (Ctrl-C), no trial is handed out any more; the one running
    finishes and is reported, then the run raises KeyboardInterrupt."""

    class Stop:
        requested = False

    stop = Stop()
    suite = write_suite(tmp_path / "suite", [1])
    folder = tmp_path / "logs" / "r"
    got: list[TrialResult | None] = []

    def finished(_job: Job, r: TrialResult | None) -> None:
        got.append(r)
        stop.requested = True

    with pytest.raises(KeyboardInterrupt):
        RayExecutor(run_spec(suite, folder, "r", "scripted", {}), workers=1, concurrency=1).run(
            jobs_of(["t0"], 6, 0),
            on_result=finished,
            stop=stop,
        )
    assert [r.episode_id for r in got if r is not None] == ["r-t0-0"]
    store = hx.Store(store_url(folder))
    assert [r.episode_id for r in store.trial_rows("r")] == ["r-t0-0"]
    store.close()


def harness_run(cwd: Path, *options: str) -> Path:
    """``harness run suite --executor ray --workers 2 ...`` in a new process in ``cwd``, with
    the suite and the run folder given relative to it, as a user would; the run's folder."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT)  # where the suite's environment module is, as a user's
    (cwd / "logs").mkdir()
    out = subprocess.run(
        [
            *(sys.executable, "-m", "harness", "run", "suite", "--logs", "logs"),
            *("--workers", "2", "--executor", "ray", *options),
        ],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (folder,) = (cwd / "logs").iterdir()
    return folder


def test_harness_run_on_a_cluster_by_address_leaves_it_running(cluster: str, tmp_path: Path):
    """`harness run --executor ray --address` in a new process runs every trial on the cluster
    (the harness shipped with the job; the relative run folder resolved in the caller's folder,
    not the cluster's) and only disconnects: the cluster still runs work after."""
    write_suite(tmp_path / "suite", [1, 2])
    folder = harness_run(tmp_path, "--agent", "scripted", "--trials", "2", "--address", cluster)
    store = hx.Store(store_url(folder))
    assert [r.passed for r in store.trial_rows()] == [True] * 4
    store.close()
    assert not (Path.cwd() / "logs" / folder.name).exists()  # (the cluster's folder)
    assert ray.get(ray.remote(lambda: 7).remote()) == 7


def test_harness_run_on_ray_without_an_address_counts_what_a_sequential_run_counts(
    tmp_path: Path,
):
    """`harness run --executor ray` in a new process, with no address, runs the trials on a Ray
    instance it starts on this machine (two workers, two trials at once in each), and every
    task has the success count the same seeds give in one process."""
    suite = write_suite(tmp_path / "suite", [1, 2, 3])
    options = ("--agent", "simulated", "--error-rate", "0.25", "--seed", "5", "--trials", "3")
    folder = harness_run(tmp_path, *options, "--concurrency", "2")
    sequential = run_trials(
        suite,
        agent="simulated",
        agent_options={"error_rate": 0.25},
        trials=3,
        seed=5,
        logs=tmp_path / "seq",
    )
    expected = successes(sequential.results)
    assert 0 < sum(expected.values()) < 9
    store = hx.Store(store_url(folder))
    assert successes([TrialResult.from_row(r) for r in store.trial_rows()]) == expected
    store.close()


def test_bad_input_is_refused_with_the_fix(tmp_path: Path):
    """Workers or concurrency below one, and a SQLite store of this machine for workers on
    others, are configuration errors that say what to do."""
    with pytest.raises(hx.ConfigurationError, match="concurrency >= 1"):
        RayExecutor(
            RunSpec("s", "scripted", "sqlite://", "r", hx.Policy()), workers=1, concurrency=0
        ).run([Job("t", 0, 0)], on_result=print)
    with pytest.raises(hx.ConfigurationError, match="workers run on b, c: .* Postgres store"):
        check_store_reach("sqlite:///logs/r/harness.db", ["a", "c", "b", "a"], here="a")
    check_store_reach("sqlite:///logs/r/harness.db", ["a", "a"], here="a")
    check_store_reach("postgresql+psycopg://u@h/db", ["a", "b"], here="a")
    assert RAY_LEASE_SECONDS < 600.0


def test_a_stopped_run_resumes_on_ray(cluster: str, tmp_path: Path):
    """A run stopped by a worker process dying (interrupted) is finished on Ray by
    resume_run(executor="ray"): every trial gets one row, and the counts are a sequential
    run's."""
    from harness.runs import resume_run

    suite = write_suite(tmp_path / "suite", [1, 2, 3])
    dying = f"{Path(__file__).with_name('dying_agent.py')}:DyingAgent"
    options = {"marker": str(tmp_path / "died"), "error_rate": 0.3}
    stopped = run_trials(
        suite, agent=dying, agent_options=options, trials=4, workers=2, logs=tmp_path / "logs"
    )
    assert stopped.stopped is not None and len(stopped.results) < 12
    done = resume_run(
        stopped.folder,
        suite=suite,
        trust_agent=True,
        executor="ray",
        address=cluster,
        concurrency=2,
    )
    sequential = run_trials(
        suite, agent=dying, agent_options=options, trials=4, logs=tmp_path / "seq"
    )
    assert done.run.stopped is None and len(done.run.results) == 12
    assert successes(done.run.results) == successes(sequential.results)
    store = hx.Store(stopped.folder / "harness.db")
    assert Counter(r.episode_id for r in store.trial_rows()) == {
        r.episode_id: 1 for r in done.run.results
    }
    assert store.verify_chain().ok


def test_a_ray_worker_on_another_host_refuses_a_sqlite_store_before_writing_a_file(
    cluster: str, tmp_path: Path
):
    """A Ray worker whose driver runs on another host builds no run worker on a SQLite store:
    ready() says why in the store-reach words, and no database file is created here."""
    db = tmp_path / "logs" / "r" / "harness.db"
    suite = write_suite(tmp_path / "suite", [1])
    spec = RunSpec(str(suite), "scripted", f"sqlite:///{db}", "r", hx.Policy())
    worker = RayWorker(os.getcwd(), [], spec, "hx-driver")
    host, where, error = worker.ready()
    assert worker.worker is None and where.startswith(f"{host}:")
    assert error is not None and "SQLite file on this machine (hx-driver" in error
    assert f"Ray workers run on {host}" in error
    assert not db.parent.exists()
    with pytest.raises(hx.HarnessError, match="could not build its worker"):
        worker.trial(Job("t0", 0, 0), again=False)


def test_a_run_whose_ray_workers_cannot_reach_its_sqlite_store_leaves_no_folder(
    cluster: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """run_trials on Ray workers of another host (here the driver is told another host name)
    with the folder's SQLite store is refused with the store-reach message before the run is
    recorded: no run folder is left, so no run shows as running or interrupted."""
    suite = write_suite(tmp_path / "suite", [1, 2])
    monkeypatch.setattr(socket, "gethostname", lambda: "hx-driver")  # (the driver's only)
    with pytest.raises(hx.ConfigurationError, match=r"SQLite file on this machine \(hx-driver"):
        run_trials(suite, executor="ray", workers=2, logs=tmp_path / "logs", run_id="r")
    assert list((tmp_path / "logs").iterdir()) == []
    assert ray.is_initialized()  # (the caller's connection stays)


class _Ref:
    """A fake Ray object ref: its value, or the error getting it raises."""

    def __init__(self, value: Any = None, error: BaseException | None = None) -> None:
        self.value, self.error = value, error


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> _Ref:
        try:
            return _Ref(self.fn(*args))
        except ray.exceptions.RayError as exc:
            return _Ref(error=exc)


class _Actor:
    """A fake Ray worker: one that runs every trial at once, or one dead for good (every call
    fails as a dead actor's does)."""

    def __init__(self, dead: bool = False) -> None:
        def gone(*_args: Any) -> Any:
            raise ray.exceptions.RayError("the actor died and will not be restarted")

        self.ready = _Method(gone if dead else lambda: ("h", "h:1", None))
        self.trial = _Method(gone if dead else lambda job, _again: ("done", job.task_id))


class _FakeRay:
    """The parts of Ray the driver loop uses, every ref ready at once."""

    exceptions = ray.exceptions

    @staticmethod
    def wait(refs: list[_Ref], num_returns: int, timeout: float) -> tuple[list[_Ref], list[_Ref]]:
        return refs[:num_returns], refs[num_returns:]

    @staticmethod
    def get(ref: _Ref) -> Any:
        if ref.error is not None:
            raise ref.error
        return ref.value


def _drive(actors: list[_Actor], jobs: list[Job], got: list[str], restart_for: float) -> None:
    ray_pool._drive(
        _FakeRay(),
        actors,
        jobs,
        store_url="postgresql://h/db",
        concurrency=1,
        on_result=lambda _job, r: got.append(r),
        on_start=None,
        stop=None,
        poll=0.1,
        restart_for=restart_for,
    )


def test_a_worker_dead_for_good_is_given_up_on_and_the_others_run_every_trial():
    """Of two workers, one dead for good (its calls and its restart pings all fail): its trial
    is handed to the other, which runs every trial, and the run ends."""
    got: list[str] = []
    _drive([_Actor(dead=True), _Actor()], jobs_of(["t0", "t1", "t2"], 1, 0), got, 0.2)
    assert sorted(got) == ["t0", "t1", "t2"]


def test_a_run_whose_every_worker_is_dead_for_good_stops_with_worker_lost():
    """A run whose only worker died and never answers again stops with WorkerLost once it has
    waited restart_for seconds, naming how many trials are left and the fix, not retrying
    its restart forever."""
    got: list[str] = []
    with pytest.raises(
        WorkerLost, match=r"every Ray worker .* gone, with 2 trial\(s\) left .*harness resume"
    ):
        _drive([_Actor(dead=True)], jobs_of(["t0", "t1"], 1, 0), got, 0.3)
    assert got == []


def test_placements_take_the_live_nodes_in_turn():
    """Workers go to the cluster's live nodes in turn, each held to its node; on a cluster of
    one node they are left to Ray's SPREAD."""

    class Nodes:
        def __init__(self, *alive: bool) -> None:
            self.alive = alive

        def nodes(self) -> list[dict[str, Any]]:
            return [{"NodeID": f"{i:056x}", "Alive": a} for i, a in enumerate(self.alive)]

    placed = ray_pool._placements(Nodes(True, False, True), 3)
    n0, n2 = f"{0:056x}", f"{2:056x}"
    assert [(p.node_id, p.soft) for p in placed] == [(n0, False), (n2, False), (n0, False)]
    assert ray_pool._placements(Nodes(True, False), 2) == ["SPREAD", "SPREAD"]


def test_a_cluster_asking_for_a_token_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch):
    """A cluster that refuses the driver for want of an authentication token (Ray's
    ConnectionError caused by InvalidAuthToken) is a configuration error naming the cause and
    both fixes; a cluster that does not answer is one naming the address."""

    class Refusing:
        def __init__(self, error: BaseException) -> None:
            self.error = error

        def init(self, **_options: Any) -> None:
            raise self.error

    token = RuntimeError("Failed to connect to GCS: RPC error: InvalidAuthToken: missing")
    refused = ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")
    refused.__cause__ = token
    with pytest.raises(hx.ConfigurationError, match="authentication token") as caught:
        ray_pool._connect(Refusing(refused), "10.0.0.1:6379")
    said = str(caught.value)
    assert "RAY_AUTH_MODE=token" in said and "RAY_AUTH_MODE=disabled" in said
    with pytest.raises(hx.ConfigurationError, match=r"could not join .* at h:1: Failed .*running"):
        ray_pool._connect(Refusing(ConnectionError("Failed to connect")), "h:1")

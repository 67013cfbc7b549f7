"""Runs on two hosts: a head, and a second host whose processes see another host name
(``hx-second``, its own UTS namespace), as a second machine sharing this one's file system
would look to the harness.

On a Ray cluster of the two (``run_trials(executor="ray", address=..., store=<Postgres>)``)
the run's trials run on both hosts; the second host killed mid-run (its raylet and workers,
SIGKILL), the trials it held are handed out again, resumed on the head once their leases
expire, and each finishes once, its effects committed once. A SQLite store is refused, leaving
no run behind. Without Ray, ``harness work`` on the second host joins a run started on the
head and takes a share of its trials; killed while it holds one, the head's driver takes that
one over once its lease lapses.

Needs ``unshare --uts`` (root, or user namespaces) and ``HX_TEST_POSTGRES_URL``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ..postgres import fresh_database
from ..store.test_postgres_many_writers import SERVER, _libpq, databases, psycopg
from ..store.test_postgres_ray import TASKS, OrdersInASchema
from ..store.test_postgres_ray import write_suite as orders_suite
from ..toy_env import write_suite as toy_suite
from .test_store_elsewhere import running_run

ray = pytest.importorskip("ray")

import harness as hx  # noqa: E402
from harness.cli import main  # noqa: E402
from harness.runs import RunResult, ray_pool  # noqa: E402
from harness.runs.start import run_trials  # noqa: E402
from harness.runs.worker import TrialResult  # noqa: E402

__all__ = ["HostedOrders", "databases"]

SECOND = "hx-second"
TRIALS = 2
WORKERS = 2  # (placed on the nodes in turn: one on each)
RAY = str(Path(sys.executable).with_name("ray"))
ROOT = Path(__file__).resolve().parents[2]
SLOW = f"{Path(__file__).with_name('slow_agent.py')}:SlowAgent"
PAUSE = 0.8  # seconds the slow agent takes per trial: the driver is still running when work joins
# The head finds a node dead within about a second, not the default half minute.
FAST_HEALTH = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "300",
    "RAY_health_check_timeout_ms": "300",
    "RAY_health_check_failure_threshold": "3",
}


def _unshare_works() -> bool:
    try:
        return subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


pytestmark = [
    pytest.mark.skipif(
        not SERVER,
        reason="set HX_TEST_POSTGRES_URL=postgresql+psycopg://user@host:port/db to run on Postgres",
    ),
    pytest.mark.skipif(
        not _unshare_works(),
        reason="`unshare --uts` is not permitted here (needs root or user namespaces): no second "
        "host name for a second Ray node",
    ),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A Ray head node on this host and a second node in its own UTS namespace."""

    def __init__(self) -> None:
        # (short: Ray's socket paths live under it, and a Unix socket path is at most 107 bytes)
        self.temp = tempfile.mkdtemp(prefix="hxray")
        self.address = f"127.0.0.1:{_free_port()}"
        # (Without RAY_AUTH_MODE, a node of a machine where a local Ray once ran, which left
        # ~/.ray/auth_token, asks for a token that a driver given an address does not send.)
        self.env = {
            **os.environ,
            "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "disabled",
            **FAST_HEALTH,
        }
        head = [RAY, "start", "--head", f"--port={self.address.split(':')[1]}", "--num-cpus=1"]
        options = ["--disable-usage-stats", "--include-dashboard=false", f"--temp-dir={self.temp}"]
        # A session of its own: every process the head leaves behind is in its group.
        started = subprocess.Popen(
            [*head, *options],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.head_group: int | None = started.pid
        self.second: subprocess.Popen[bytes] | None = None
        said, _ = started.communicate()
        if started.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start --head failed: {said.decode()[-2000:]}")

    def start_second(self) -> None:
        """Start the second node (host name hx-second) and wait until the head counts it."""
        join = f"exec {RAY} start --address={self.address} --num-cpus=1 --disable-usage-stats"
        self.second = subprocess.Popen(
            ["unshare", "--uts", "sh", "-c", f"hostname {SECOND} && {join} --block"],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        self.wait_for(2)

    def kill_second(self) -> None:
        """SIGKILL the second node: its raylet and every worker process of it."""
        assert self.second is not None
        os.killpg(self.second.pid, signal.SIGKILL)
        self.second.wait()

    def wait_for(self, nodes: int, timeout: float = 60.0) -> None:
        """Wait until ``nodes`` nodes are alive."""
        ray.init(address=self.address, logging_level=logging.WARNING)
        try:
            deadline = time.monotonic() + timeout
            while sum(n["Alive"] for n in ray.nodes()) != nodes:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the Ray cluster did not reach {nodes} live nodes")
                time.sleep(0.2)
        finally:
            ray.shutdown()

    def stop(self) -> None:
        """Stop both nodes (their process groups) and remove their files."""
        for group in (self.second.pid if self.second else None, self.head_group):
            if group is not None:
                with contextlib.suppress(ProcessLookupError):  # (gone already)
                    os.killpg(group, signal.SIGKILL)
        if self.second is not None:
            self.second.wait()
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Two Ray nodes on this machine, the second one seeing host name hx-second."""
    if ray.is_initialized():
        ray.shutdown()
    nodes = Cluster()
    try:
        nodes.start_second()
        yield nodes
    finally:
        nodes.stop()


class HostedOrders(OrdersInASchema):
    """The Postgres Ray test's orders, whose cancel notes each cancel it makes in
    ``public.effects`` (the episode, the order, the host) in the same database transaction:
    the table counts the effects that were committed, and where; ``delay`` seconds before
    each keep trials in flight long enough to be killed in."""

    def __init__(self, url: str, delay: float = 0.0) -> None:
        super().__init__(url)
        cancel = self.tools["cancel"]
        body, state = cancel.fn, self.state

        def cancel_and_note(order_id: str) -> None:
            time.sleep(delay)
            body(order_id)
            episode = hx.current_episode()
            state.connection.execute(
                "INSERT INTO public.effects VALUES (%s, %s, %s)",
                (episode.id if episode else "?", order_id, socket.gethostname()),
            )

        cancel.fn = cancel_and_note


def write_suite(folder: Path, state_url: str, delay: float) -> Path:
    """The Postgres Ray test's TASKS tasks, on HostedOrders, and the effects table."""
    with psycopg.connect(_libpq(state_url), autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS effects (episode text, order_id text, host text)")
    suite = orders_suite(folder, state_url)
    spec = json.loads((suite / "suite.json").read_text())
    spec["environment"] = f"{__name__}:HostedOrders"
    spec["environment_options"] = {"url": state_url, "delay": delay}
    (suite / "suite.json").write_text(json.dumps(spec))
    return suite


def effects(state_url: str) -> list[tuple[str, str, str]]:
    """The committed cancels: (episode, order, host)."""
    with psycopg.connect(_libpq(state_url), autocommit=True) as conn:
        return [tuple(r) for r in conn.execute("SELECT episode, order_id, host FROM effects")]


def lease_hosts(store_url: str) -> set[str]:
    """The hosts holding episode leases in the store now."""
    with psycopg.connect(_libpq(store_url), autocommit=True) as conn:
        try:
            return {r[0] for r in conn.execute("SELECT host FROM hx_lease")}
        except psycopg.errors.UndefinedTable:
            return set()


def expected_of(run_id: str, tasks: int = TASKS, trials: int = TRIALS) -> list[str]:
    """The episode ids of a run's trials."""
    return sorted(f"{run_id}-t{t}-{i}" for i in range(trials) for t in range(tasks))


def on_the_cluster(
    cluster: Cluster, suite: Path, store_url: str, logs: Path, **options: Any
) -> RunResult:
    """``run_trials`` of the orders suite on the cluster, WORKERS Ray workers of one trial at a
    time, on the Postgres store at ``store_url``: run ``r``."""
    return run_trials(
        suite,
        agent="scripted",
        trials=TRIALS,
        executor="ray",
        address=cluster.address,
        workers=WORKERS,
        concurrency=1,
        store=store_url,
        logs=logs,
        run_id="r",
        **options,
    )


def check_cli(folder: Path, expected: list[str]) -> None:
    """``harness verify`` on the run folder passes, and ``harness report --json`` counts each
    of the run's trials once."""
    verified = CliRunner().invoke(main, ["verify", str(folder)])
    assert verified.exit_code == 0, verified.output
    assert f"verified: {len(expected)} episode(s)" in verified.output, verified.output
    reported = CliRunner().invoke(main, ["report", str(folder), "--json"])
    assert reported.exit_code == 0, reported.output
    report = json.loads(reported.output)
    assert (report["run"]["id"], report["trials"]) == (folder.name, len(expected))


def check_run(store_url: str, state_url: str, run_id: str, expected: list[str]) -> set[str]:
    """Every trial of the run has one row and passed, each of its two cancels was committed
    once, no lease is left and every chain verifies; the hosts the cancels ran on."""
    store = hx.Store(store_url)
    try:
        rows = store.trial_rows(run_id)
        assert sorted(r.episode_id for r in rows) == expected
        assert all(TrialResult.from_row(r).passed for r in rows)
        for eid in expected:
            committed = [t.idem_key for t in store.transactions(eid) if t.status == "committed"]
            assert sorted(committed) == ["cancel:a", "cancel:b"], eid
        assert store.leases() == []
        report = store.verify()
        assert report.ok and not report.findings, report.findings
    finally:
        store.close()
    # (the others are the tasks' reference runs, one per task and worker)
    done = [e for e in effects(state_url) if e[0] in expected]
    assert Counter((e, o) for e, o, _ in done) == {(e, o): 1 for e in expected for o in "ab"}
    return {host for _, _, host in done}


def test_a_sqlite_store_is_refused_for_workers_on_the_second_host(
    cluster: Cluster, databases: tuple[str, str], tmp_path: Path
):
    """run_trials on the two-host cluster with the run folder's SQLite store is refused with
    the store-reach message naming the second host, before the run is recorded: no run
    folder (so no run marked running) is left."""
    suite = write_suite(tmp_path / "suite", databases[0], 0.0)
    with pytest.raises(hx.ConfigurationError, match=f"Ray workers run on {SECOND}: .*Postgres"):
        run_trials(
            suite,
            executor="ray",
            address=cluster.address,
            workers=WORKERS,
            logs=tmp_path / "logs",
            run_id="r",
        )
    assert list((tmp_path / "logs").iterdir()) == []


def test_a_run_on_two_hosts_writes_one_postgres_store(
    cluster: Cluster, databases: tuple[str, str], tmp_path: Path
):
    """run_trials on the two-host cluster with a Postgres store runs every trial once on Ray
    workers of both hosts: cancels ran on both, each committed once; every chain verifies,
    and the CLI's verify and report on the run folder agree."""
    state_url, store_url = databases
    suite = write_suite(tmp_path / "suite", state_url, 0.0)
    result = on_the_cluster(cluster, suite, store_url, tmp_path / "logs")
    expected = expected_of("r")
    assert result.complete and result.stopped is None
    assert sorted(r.episode_id for r in result.results) == expected
    assert check_run(store_url, state_url, "r", expected) == {socket.gethostname(), SECOND}
    check_cli(tmp_path / "logs" / "r", expected)


def test_the_second_host_killed_mid_run_leaves_every_trial_done_once(
    cluster: Cluster, databases: tuple[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """The second host killed (SIGKILL to its raylet and workers) while it holds trials: the
    run finishes on the head, the lost trials handed out again and resumed once their leases
    expire (3 s here, not RAY_LEASE_SECONDS); every trial has one row, each cancel was
    committed once, every chain verifies, and verify and report on the folder agree."""
    monkeypatch.setattr(ray_pool, "RAY_LEASE_SECONDS", 3.0)
    state_url, store_url = databases
    suite = write_suite(tmp_path / "suite", state_url, 0.3)
    killed: list[float] = []

    def kill_when_held_there(_task: str, _trial: int) -> None:
        if not killed:
            killed.append(0.0)
            watcher.start()

    def watch() -> None:
        deadline = time.monotonic() + 30
        while SECOND not in lease_hosts(store_url) and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.kill_second()
        killed[0] = time.monotonic()

    watcher = threading.Thread(target=watch, daemon=True)
    started = time.monotonic()
    result = on_the_cluster(
        cluster, suite, store_url, tmp_path / "logs", on_start=kill_when_held_there
    )
    watcher.join()
    assert killed[0] > started
    expected = expected_of("r")
    assert result.complete and result.stopped is None
    assert sorted(r.episode_id for r in result.results) == expected
    hosts = check_run(store_url, state_url, "r", expected)
    assert socket.gethostname() in hosts
    check_cli(tmp_path / "logs" / "r", expected)


def harness(*args: str, ledger: Path, pause: float, second: bool = False) -> subprocess.Popen[str]:
    """``python -m harness ARGS`` in a session of its own, the slow agent pausing ``pause``
    seconds per trial and noting each in ``ledger``; with ``second``, on the second host (a
    UTS namespace named hx-second: its leases name that host)."""
    command = [sys.executable, "-m", "harness", *args]
    if second:
        command = [
            "unshare",
            "--uts",
            "sh",
            "-c",
            f'hostname {SECOND} && exec "$@"',
            "sh",
            *command,
        ]
    return subprocess.Popen(
        command,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "COLUMNS": "200",
            "HX_TEST_LEDGER": str(ledger),
            "HX_TEST_PAUSE": str(pause),
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def joined(store_url: str, run_id: str, ledger: Path, *options: str) -> subprocess.Popen[str]:
    """``harness work`` of the run on the second host, the slow agent noting its trials in
    ``ledger``."""
    return harness(
        *("work", f"{store_url}#{run_id}", "--agent", SLOW, "--trust-suite", *options),
        ledger=ledger,
        pause=PAUSE,
        second=True,
    )


def held_on_second(store_url: str, worker: subprocess.Popen[str]) -> str | None:
    """An episode the second host holds the lease of and has begun but not ended, if any, with
    ``worker``'s process group left stopped (SIGSTOP) so that it cannot end that episode before
    it is killed. A lease alone does not say so: the worker takes the lease of a trial the
    head has finished, to read that it is done, and gives it back."""
    store = hx.Store(store_url)
    try:
        for lease in store.leases():
            if lease.host != SECOND or store.episode(lease.episode_id) is None:
                continue
            os.killpg(worker.pid, signal.SIGSTOP)
            if "end" not in [r.kind for r in store.log(lease.episode_id)]:
                return lease.episode_id
            os.killpg(worker.pid, signal.SIGCONT)  # (it ended, or was never its: look again)
        return None
    finally:
        store.close()


@contextlib.contextmanager
def driver_on_the_head(
    suite: Path, store_url: str, logs: Path, ledger: Path
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``harness run`` of ``suite`` (one worker, the slow agent) on the head, on the store at
    ``store_url``: the process and its run's id once the run is recorded running; the
    process group killed after, if it still runs."""
    driver = harness(
        *("run", str(suite), "--agent", SLOW, "--trials", str(TRIALS), "--logs", str(logs)),
        *("--store", store_url),
        ledger=ledger,
        pause=PAUSE,
    )
    try:
        yield driver, running_run(store_url, driver)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()


def check_finished(store_url: str, run_id: str, expected: list[str]) -> None:
    """The run is finished, with one passed trial row per trial, no lease left, and it
    verifies."""
    store = hx.Store(store_url)
    try:
        (run,) = [r for r in store.runs() if r.id == run_id]
        assert run.status == "finished"
        rows = store.trial_rows(run_id)
        assert sorted(r.episode_id for r in rows) == expected
        assert all(TrialResult.from_row(r).passed for r in rows)
        assert store.leases() == []
        report = store.verify(run_id)
        assert report.ok and not report.findings, report.findings
    finally:
        store.close()


def test_a_worker_on_the_second_host_joins_a_run_started_on_the_head(tmp_path: Path):
    """`harness run` on the head (one worker) and `harness work` on the second host, on the
    run's store URL: both hosts hold trials' leases and both processes run trials, each trial
    runs in exactly one of them, and the run ends finished and verifies."""
    with fresh_database() as store_url:
        suite = toy_suite(tmp_path / "suite", [1, 1, 1, 1])
        ledger = tmp_path / "ledger.txt"
        hosts: set[str] = set()
        with driver_on_the_head(suite, store_url, tmp_path / "logs", ledger) as (
            driver,
            run_id,
        ):
            worker = joined(store_url, run_id, ledger)
            deadline = time.monotonic() + 90
            while worker.poll() is None and time.monotonic() < deadline:
                hosts |= lease_hosts(store_url)
                time.sleep(0.05)
            worked, _ = worker.communicate(timeout=30)
            drove, _ = driver.communicate(timeout=60)
        assert worker.returncode == 0, worked
        assert driver.returncode == 0, drove
        expected = expected_of(run_id, tasks=4)
        assert hosts == {socket.gethostname(), SECOND}
        lines = [line.split() for line in ledger.read_text().splitlines()]
        assert sorted(eid for _, eid in lines) == expected  # (each trial ran once)
        pids = Counter(pid for pid, _ in lines)
        assert set(pids) == {str(driver.pid), str(worker.pid)}, pids
        assert f"ran {pids[str(worker.pid)]} trial(s) here" in worked, worked
        check_finished(store_url, run_id, expected)
        check_cli(tmp_path / "logs" / run_id, expected)


def test_a_joined_worker_killed_on_the_second_host_loses_nothing(tmp_path: Path):
    """`harness work --lease-seconds 3` on the second host killed (SIGKILL to its process
    group) while it holds a trial: the head's driver, waiting for the trials the worker held,
    takes that one over once its lease lapses (a holder on another host is not known dead
    before), resumes its episode, and the run ends finished, every trial once, and verifies."""
    with fresh_database() as store_url:
        suite = toy_suite(tmp_path / "suite", [1, 1, 1, 1])
        ledger = tmp_path / "ledger.txt"
        with driver_on_the_head(suite, store_url, tmp_path / "logs", ledger) as (
            driver,
            run_id,
        ):
            worker = joined(store_url, run_id, ledger, "--lease-seconds", "3")
            try:
                deadline = time.monotonic() + 60
                held = None
                while held is None and worker.poll() is None and time.monotonic() < deadline:
                    held = held_on_second(store_url, worker)
                    time.sleep(0.02)
                assert held is not None, "the worker took no trial"
            finally:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
            drove, _ = driver.communicate(timeout=60)
        assert driver.returncode == 0, drove
        expected = expected_of(run_id, tasks=4)
        check_finished(store_url, run_id, expected)
        lines = [line.split() for line in ledger.read_text().splitlines()]
        assert sorted(set(eid for _, eid in lines)) == expected
        assert [pid for pid, eid in lines if eid == held][-1] == str(driver.pid)
        store = hx.Store(store_url)
        try:
            assert "resume" in [r.kind for r in store.log(held)]
        finally:
            store.close()
        check_cli(tmp_path / "logs" / run_id, expected)

"""Runs on a Ray cluster of two hosts: a head node, and a second node whose processes see
another host name (``hx-second``, its own UTS namespace), as a second machine sharing this
one's file system would look to the harness.

With a Postgres store the run's trials run on both hosts; the second host killed mid-run (its
raylet and workers, SIGKILL), the trials it held are handed out again, resumed on the head
once their leases expire, and each finishes once, its effects committed once. A SQLite store
is refused, leaving no run behind.

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

import pytest

from ..store.test_postgres_many_writers import SERVER, _libpq, databases, psycopg
from ..store.test_postgres_ray import TASKS, OrdersInASchema
from ..store.test_postgres_ray import write_suite as orders_suite

ray = pytest.importorskip("ray")

import harness as hx  # noqa: E402
from harness.runs.layout import run_row  # noqa: E402
from harness.runs.ray_pool import RayExecutor  # noqa: E402
from harness.runs.spec import Job, RunSpec  # noqa: E402
from harness.runs.start import run_trials, trial_seed  # noqa: E402
from harness.runs.worker import TrialResult  # noqa: E402

__all__ = ["HostedOrders", "databases"]

SECOND = "hx-second"
TRIALS = 2
# Ray's SPREAD puts each of two actors needing no CPU on either node at will; of four, some
# land on each node nearly always.
WORKERS = 4
RAY = str(Path(sys.executable).with_name("ray"))
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


def spec_for(suite: Path, store_url: str, run_id: str) -> RunSpec:
    """The run's spec, its row written in the store (as run_trials does), leases of 3 s: a
    trial the dead host held runs again 3 s after its last renewal, not RAY_LEASE_SECONDS."""
    store = hx.Store(store_url, create=True)
    store.add(run_row(run_id, suite="orders", status="running", config="{}", evidence="{}"))
    store.close()
    return RunSpec(str(suite), "scripted", store_url, run_id, hx.Policy(), lease_seconds=3.0)


def jobs_of(run_id: str) -> tuple[list[Job], list[str]]:
    """The run's jobs, and their episode ids."""
    jobs = [Job(f"t{t}", i, trial_seed(0, f"t{t}", i)) for i in range(TRIALS) for t in range(TASKS)]
    return jobs, sorted(f"{run_id}-{j.task_id}-{j.trial}" for j in jobs)


def on_both_hosts(spec: RunSpec, jobs: list[Job], cluster: Cluster) -> RayExecutor:
    """An executor whose workers run on both hosts, prepared: Ray's SPREAD places actors that
    need no CPU at will (often all on one node of two), so the workers are started again until
    some run on each."""
    for _ in range(8):
        executor = RayExecutor(spec, workers=WORKERS, concurrency=1, address=cluster.address)
        executor.prepare(jobs)
        if set(executor.hosts) == {socket.gethostname(), SECOND}:
            return executor
        executor.close()
    raise AssertionError("Ray placed every worker on one host, eight times")


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
    """Ray workers on both hosts run every trial of one run on one Postgres store:
    cancels ran on both hosts, each committed once, and every chain verifies."""
    state_url, store_url = databases
    suite = write_suite(tmp_path / "suite", state_url, 0.0)
    jobs, expected = jobs_of("r")
    on_both_hosts(spec_for(suite, store_url, "r"), jobs, cluster).run(
        jobs, on_result=lambda _job, _r: None
    )
    assert check_run(store_url, state_url, "r", expected) == {socket.gethostname(), SECOND}


def test_the_second_host_killed_mid_run_leaves_every_trial_done_once(
    cluster: Cluster, databases: tuple[str, str], tmp_path: Path
):
    """The second host killed (SIGKILL to its raylet and workers) while it holds trials: the
    run finishes on the head, the lost trials handed out again and resumed once their leases
    expire; every trial has one row, each cancel was committed once, every chain verifies."""
    state_url, store_url = databases
    suite = write_suite(tmp_path / "suite", state_url, 0.3)
    jobs, expected = jobs_of("r")
    killed: list[float] = []
    ended: list[str] = []

    def kill_when_held_there(_job: Job) -> None:
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
    on_both_hosts(spec_for(suite, store_url, "r"), jobs, cluster).run(
        jobs,
        on_start=kill_when_held_there,
        on_result=lambda job, r: ended.append(f"{job.task_id}-{job.trial}"),
    )
    watcher.join()
    assert killed[0] > started
    hosts = check_run(store_url, state_url, "r", expected)
    assert socket.gethostname() in hosts

"""A run whose store is a database elsewhere: the folder records where, every command follows
it, the store's URL stands for the run, and ``harness work`` joins a running run.

Each test runs on a store URL of its own: a SQLite file outside the run folder always, and a
Postgres database when ``HX_TEST_POSTGRES_URL`` names a server.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.runs.join import work_run
from harness.runs.layout import STORE_FILE, open_run, public_url
from harness.runs.start import run_trials

from ..postgres import SERVER, fresh_database
from ..toy_env import write_suite

ROOT = Path(__file__).resolve().parents[2]
SLOW = f"{Path(__file__).with_name('slow_agent.py')}:SlowAgent"


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store URL outside any run folder."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared' / 'store.db'}"
        return
    with fresh_database() as url:
        yield url


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_every_command_follows_the_folder_and_the_url(store_url: str, tmp_path: Path):
    """A run on a store elsewhere: its folder holds store.json (no harness.db), and report,
    verify, audit, export, compare, escalations, replay, resume and work read the same run from
    the folder and from the store's URL."""
    suite = write_suite(tmp_path / "suite", [1, 2])
    result = run_trials(
        suite, agent="simulated", trials=2, seed=1, logs=tmp_path / "logs", store=store_url
    )
    folder = tmp_path / "logs" / result.run_id
    assert result.complete and len(result.results) == 4
    assert sorted(p.name for p in folder.iterdir()) == [
        "evidence.json",
        STORE_FILE,
        "summary.json",
    ]
    pointer = json.loads((folder / STORE_FILE).read_text())
    assert pointer == {"format": "harness.store", "url": store_url, "run_id": result.run_id}
    url = f"{store_url}#{result.run_id}"
    for target in (str(folder), url):
        code, out = invoke("report", target, "--json")
        assert code == 0, out
        report = json.loads(out)
        assert (report["run"]["id"], report["trials"]) == (result.run_id, 4)
        code, out = invoke("verify", target)
        assert code == 0 and "verified: 4 episode(s)" in out, out
        code, out = invoke("audit", target, "--json")
        assert code == 0, out
        assert len(json.loads(out)["episodes"]) == 4
        exported = tmp_path / f"export-{len(target)}.jsonl"
        code, out = invoke("export", target, "--format", "jsonl", "--out", str(exported))
        assert code == 0, out
        assert len(exported.read_text().splitlines()) == 4
        code, out = invoke("compare", target, str(folder), "--json")
        assert code == 0, out
        code, out = invoke("escalations", target, "--json")
        assert code == 0 and json.loads(out) == [], out
        code, out = invoke(
            "replay", target, "--episode", result.results[0].episode_id, "--trust-suite"
        )
        assert code == 0 and "no divergence" in out, out
        code, out = invoke("resume", target, "--trust-suite", "--json")
        assert code == 0, out
        assert len(json.loads(out)["kept"]) == 4
        code, out = invoke("work", target, "--trust-suite")
        assert code != 0 and "is finished, not running" in out, out
    store = hx.Store(store_url)
    try:
        assert len(store.trial_rows(result.run_id)) == 4  # (nothing ran again)
    finally:
        store.close()


def test_the_folder_never_records_the_password(tmp_path: Path):
    """A store URL's password (in the URL or its query) is left out of the folder and of the
    run's record; what the folder records is what the run's commands open later."""
    assert public_url("postgresql+psycopg://ann:s3cret@db.example:5432/runs") == (
        "postgresql+psycopg://ann@db.example:5432/runs"
    )
    assert public_url("postgresql://ann@db/runs?password=s3cret&sslmode=require") == (
        "postgresql://ann@db/runs?sslmode=require"
    )
    if not SERVER:
        pytest.skip("set HX_TEST_POSTGRES_URL to run on Postgres")
    scheme, rest = SERVER.split("://", 1)
    user, host = rest.split("@", 1)
    with_password = f"{scheme}://{user}:s3cret-pw@{host}"
    suite = write_suite(tmp_path / "suite", [1])
    result = run_trials(suite, agent="simulated", logs=tmp_path / "logs", store=with_password)
    folder = tmp_path / "logs" / result.run_id
    for path in folder.iterdir():
        assert "s3cret-pw" not in path.read_text(), path
    with open_run(folder) as run:
        assert "s3cret-pw" not in run.run.config + run.run.evidence
        assert run.target == str(folder)


def test_a_url_naming_no_run_or_one_it_lacks_says_how_to_name_one(tmp_path: Path):
    """A store holding two runs: its URL alone is refused, naming the ``#<run id>`` form and
    the runs; a run id it does not hold is refused; the whole store still verifies."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    suite = write_suite(tmp_path / "suite", [1])
    ids = [
        run_trials(suite, agent="simulated", logs=tmp_path / "logs", store=url).run_id
        for _ in range(2)
    ]
    code, out = invoke("report", url)
    assert code != 0 and f"{url}#<run id>" in out and ids[1] in out, out
    code, out = invoke("report", f"{url}#nope")
    assert code != 0 and "holds no run 'nope'" in out, out
    code, out = invoke("verify", url)
    assert code == 0 and "verified: 2 episode(s)" in out, out
    with pytest.raises(hx.StoreError, match="holds a run"):
        run_trials(suite, agent="simulated", logs=tmp_path / "again", store=url, run_id=ids[0])
    assert not (tmp_path / "again" / ids[0]).exists()


def test_bad_store_values_and_pointers_are_refused_clearly(tmp_path: Path):
    """``--store`` that is not a database URL, or one that does not open, is refused before
    any folder is made; a damaged store.json, or one naming a store that does not open, is
    refused naming the file and where a password comes from."""
    suite = write_suite(tmp_path / "suite", [1])
    logs = tmp_path / "logs"
    code, out = invoke("run", str(suite), "--logs", str(logs), "--store", "runs.db")
    assert code != 0 and "give a database URL" in out, out
    code, out = invoke(
        "run", str(suite), "--logs", str(logs), "--store", "postgresql+psycopg://u@127.0.0.1:1/x"
    )
    assert code != 0 and "does not open" in out, out
    assert not logs.exists() or list(logs.iterdir()) == []
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / STORE_FILE).write_text("{not json")
    code, out = invoke("report", str(folder))
    assert code != 0 and "does not read as JSON" in out, out
    (folder / STORE_FILE).write_text(json.dumps({"format": "harness.store", "url": 3}))
    code, out = invoke("verify", str(folder))
    assert code != 0 and "is not a store record" in out, out
    (folder / STORE_FILE).write_text(
        json.dumps({"format": "harness.store", "url": "postgresql+psycopg://u@127.0.0.1:1/x"})
    )
    code, out = invoke("report", str(folder))
    assert code != 0 and "PGPASSWORD" in out and "~/.pgpass" in out, out


def _harness(*args: str, ledger: Path, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=cwd,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "COLUMNS": "200",
            "HX_TEST_LEDGER": str(ledger),
            "HX_TEST_PAUSE": "0.6",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _running(url: str) -> str | None:
    """The id of the run in the store once it is recorded running."""
    try:
        store = hx.Store(url)
    except hx.HarnessError:
        return None
    try:
        runs = [r for r in store.runs() if r.status == "running"]
        return runs[0].id if runs else None
    finally:
        store.close()


def running_run(url: str, driver: subprocess.Popen[str], timeout: float = 60.0) -> str:
    """The id of the run ``driver`` started on the store at ``url``, once it is recorded
    running (the test fails, with the driver's output, if it is not within ``timeout``)."""
    deadline = time.monotonic() + timeout
    run_id = None
    while run_id is None and time.monotonic() < deadline and driver.poll() is None:
        run_id = _running(url)
        time.sleep(0.05)
    assert run_id is not None, driver.communicate()[0]
    return run_id


def test_work_joins_a_running_run_and_no_trial_runs_twice(store_url: str, tmp_path: Path):
    """`harness run` with one worker and `harness work` started beside it on the store's URL
    share the run's trials: each trial runs in exactly one of the two processes, the worker
    runs some, the run ends finished with every trial once and verifies, and the driver's
    summary counts the trials the worker ran."""
    suite = write_suite(tmp_path / "suite", [1, 1, 1, 1])
    ledger = tmp_path / "ledger.txt"
    driver = _harness(
        *("run", str(suite), "--agent", SLOW, "--trials", "3", "--logs", str(tmp_path / "logs")),
        *("--store", store_url),
        ledger=ledger,
        cwd=tmp_path,
    )
    try:
        run_id = running_run(store_url, driver)
        worker = _harness(
            *("work", f"{store_url}#{run_id}", "--agent", SLOW, "--trust-suite"),
            ledger=ledger,
            cwd=tmp_path,
        )
        worked, _ = worker.communicate(timeout=120)
        drove, _ = driver.communicate(timeout=120)
    finally:
        for p in (driver,):
            if p.poll() is None:
                p.kill()
    assert worker.returncode == 0, worked
    assert driver.returncode == 0, drove
    lines = [line.split() for line in ledger.read_text().splitlines()]
    by_episode = Counter(eid for _, eid in lines)
    assert len(by_episode) == 12 and set(by_episode.values()) == {1}, by_episode
    pids = Counter(pid for pid, _ in lines)
    assert len(pids) == 2, pids  # both processes ran trials
    joined = sum(n for pid, n in pids.items() if pid != str(driver.pid))
    assert f"ran {joined} trial(s) here" in worked, worked
    store = hx.Store(store_url)
    try:
        (run,) = [r for r in store.runs() if r.id == run_id]
        assert run.status == "finished"
        assert len(store.trial_rows(run_id)) == 12
        assert store.verify(run_id).ok
        assert store.leases() == []
    finally:
        store.close()
    summary = json.loads((tmp_path / "logs" / run_id / "summary.json").read_text())
    assert (summary["trials"], summary["missing"]) == (12, 0)


def test_work_on_a_crashed_runs_store_finishes_its_trials(tmp_path: Path):
    """A run whose driver died (recorded running, trials left): `work_run` on its folder runs
    every trial left, once; the run stays running until a resume records its end."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    suite = write_suite(tmp_path / "suite", [1, 1])
    stopped = []

    def stop_after_one(_result: object) -> None:
        if not stopped:
            stopped.append(True)
            raise KeyboardInterrupt

    result = run_trials(
        suite,
        agent="simulated",
        trials=2,
        logs=tmp_path / "logs",
        store=url,
        progress=stop_after_one,
    )
    assert result.interrupted and len(result.results) == 1
    store = hx.Store(url)
    store.add(
        hx.store.RunRow(**{**store.runs()[0].model_dump(), "status": "running"})
    )  # (as a killed driver leaves it)
    store.close()
    done = work_run(tmp_path / "logs" / result.run_id, trust=True)
    assert len(done.ran) == 3 and done.left == [] and done.stopped is None
    again = work_run(tmp_path / "logs" / result.run_id, trust=True)
    assert again.ran == [] and again.left == []
    store = hx.Store(url)
    try:
        assert len(store.trial_rows(result.run_id)) == 4 and store.verify(result.run_id).ok
    finally:
        store.close()


def test_a_joined_worker_killed_mid_trial_loses_nothing_and_repeats_nothing(tmp_path: Path):
    """`harness work` killed (SIGKILL) while it holds a trial: the run's driver, waiting for
    the trials the worker held, takes that one over once its holder is gone (at once on this
    host), resumes its episode from the records, and the run ends finished with every trial
    once, each write committed once, and a store that verifies."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    suite = write_suite(tmp_path / "suite", [1, 1, 1, 1])
    ledger = tmp_path / "ledger.txt"
    driver = _harness(
        *("run", str(suite), "--agent", SLOW, "--trials", "3", "--logs", str(tmp_path / "logs")),
        *("--store", url),
        ledger=ledger,
        cwd=tmp_path,
    )
    worker = None
    try:
        run_id = running_run(url, driver)
        worker = _harness(
            *("work", url, "--agent", SLOW, "--trust-suite"), ledger=ledger, cwd=tmp_path
        )
        held = None
        deadline = time.monotonic() + 60
        while held is None and time.monotonic() < deadline and worker.poll() is None:
            store = hx.Store(url)
            try:
                began = next(
                    (
                        x
                        for x in store.leases()
                        if x.pid == worker.pid and store.episode(x.episode_id) is not None
                    ),
                    None,
                )  # (a trial it holds whose episode began)
                if began is not None:
                    # Stopped, the worker cannot end that trial between this look and the kill
                    # (on a loaded machine the look can take longer than the trial's pause).
                    worker.send_signal(signal.SIGSTOP)
                    if "end" in [r.kind for r in store.log(began.episode_id)]:
                        worker.send_signal(signal.SIGCONT)  # (it ended meanwhile: look again)
                    else:
                        held = began
            finally:
                store.close()
            time.sleep(0.02)
        assert held is not None, "the worker took no trial"
        worker.kill()
        worker.wait(10)
        drove, _ = driver.communicate(timeout=120)
    finally:
        for p in (driver, worker):
            if p is not None and p.poll() is None:
                p.kill()
    assert driver.returncode == 0, drove
    store = hx.Store(url)
    try:
        (run,) = store.runs()
        assert run.status == "finished"
        rows = store.trial_rows(run_id)
        assert len(rows) == 12 and len({r.episode_id for r in rows}) == 12
        for row in rows:
            bumps = [
                t
                for t in store.transaction_rows(row.episode_id)
                if t.action == "bump" and t.status == "committed"
            ]
            assert len(bumps) == 1, (row.episode_id, bumps)
        assert "resume" in [r.kind for r in store.log(held.episode_id)]
        assert store.verify(run_id).ok and store.leases() == []
    finally:
        store.close()


def test_many_trials_in_flight_on_a_postgres_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Each episode in flight holds a connection to the store while it runs: 40 at once in one
    process (SQLAlchemy's default pool would make the 16th wait 30 s, then fail), then a run
    with 24 trials in flight in one worker."""
    monkeypatch.setenv("HX_TEST_PAUSE", "0.5")
    suite = write_suite(tmp_path / "suite", [1, 1, 1, 1])
    with fresh_database() as url:
        store = hx.Store(url)
        try:
            started = time.monotonic()
            writers = [store.writer(f"e{i}") for i in range(40)]
            assert time.monotonic() - started < 10
            for w in writers:
                w.close()
        finally:
            store.close()
        result = run_trials(
            suite, agent=SLOW, trials=6, concurrency=24, logs=tmp_path / "logs", store=url
        )
        assert result.complete and len(result.results) == 24
        assert all(r.passed for r in result.results)


def _set_status(url: str, status: str) -> None:
    store = hx.Store(url)
    try:
        store.add(hx.store.RunRow(**{**store.runs()[0].model_dump(), "status": status}))
    finally:
        store.close()


@pytest.mark.parametrize("status", ["interrupted", "finished"])
def test_work_leaves_when_the_run_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, status: str
):
    """A joined worker stops taking trials once the run is recorded as no longer running: an
    interrupted run is a stop it reports (`harness resume` finishes it), with the trials left
    named; a finished one is not."""
    monkeypatch.setenv("HX_TEST_PAUSE", "0.3")
    url = f"sqlite:///{tmp_path / 'store.db'}"
    suite = write_suite(tmp_path / "suite", [1, 1])

    def stop_at_once(_result: object) -> None:
        raise KeyboardInterrupt

    first = run_trials(
        suite, agent=SLOW, trials=8, logs=tmp_path / "logs", store=url, progress=stop_at_once
    )
    _set_status(url, "running")  # (as a killed driver leaves it)
    flip = threading.Timer(0.5, _set_status, (url, status))
    flip.start()
    try:
        done = work_run(tmp_path / "logs" / first.run_id, agent=SLOW, trust=True)
    finally:
        flip.cancel()
    assert done.ran and done.left  # (it stopped before the end)
    if status == "interrupted":
        assert done.stopped == "the run is interrupted: its driver stopped it"
    else:
        assert done.stopped is None
    store = hx.Store(url)
    try:
        assert len(store.trial_rows(first.run_id)) == 1 + len(done.ran)
        assert store.verify(first.run_id).ok and store.leases() == []
    finally:
        store.close()


@pytest.mark.parametrize(
    ("column", "value", "words"),
    [
        ("failures", '"boom"', "its failures are not what the harness writes"),
        ("failures", '{"x": -1}', "its failures are not what the harness writes"),
        ("steps", '{"a": 1}', "its steps are not what the harness writes"),
        ("steps", "[1, 2]", "its steps are not what the harness writes"),
    ],
)
def test_a_trial_row_of_the_wrong_shape_is_refused_in_words(
    tmp_path: Path, column: str, value: str, words: str
):
    """A trial row whose failures or steps are not what the harness writes: report, export and
    resume refuse it naming the trial (exit 2, no traceback), resume writing nothing (the run
    stays finished)."""
    suite = write_suite(tmp_path / "suite", [1, 1])
    result = run_trials(suite, agent="simulated", trials=1, logs=tmp_path / "logs")
    assert result.folder is not None
    folder = result.folder
    first = result.results[0].episode_id
    with sqlite3.connect(folder / "harness.db") as db:
        db.execute(f"UPDATE hx_trial SET {column} = ? WHERE id = ?", (value, first))
    for command in (
        ["report", str(folder)],
        ["export", str(folder), "--format", "jsonl"],
        ["resume", str(folder), "--trust-suite"],
    ):
        code, out = invoke(*command)
        assert code == 2 and words in out and first in out, (command, out)
        assert "Traceback" not in out
    store = hx.Store(folder / "harness.db")
    try:
        assert store.runs()[0].status == "finished"
    finally:
        store.close()

"""Any stop leaves a run that verifies and resumes: SIGKILL at random moments (with worker
processes and threads), and Ctrl-C, through the CLI as a user meets them."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import harness as hx

from .test_resume import PLAN, ledger_suite

ROOT = Path(__file__).resolve().parents[2]
TASKS, TRIALS = 3, 8  # (24 trials, 8 in flight: a stop after the first leaves some unstarted)


def start_run(tmp_path: Path, suite: Path, *options: str) -> subprocess.Popen[str]:
    """``harness run`` on ``suite`` with 2 workers and 4 trials in flight in each, in its own
    process group (as a terminal's foreground job is)."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "harness", "run", str(suite), "--agent", "scripted"),
            *("--trials", str(TRIALS), "--workers", "2", "--concurrency", "4"),
            *("--logs", str(tmp_path / "logs"), *options),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def rows_of(folder: Path) -> int:
    """Trial rows in the run's store (0 while it has none, or no store yet)."""
    if not (folder / "harness.db").exists():
        return 0
    try:
        store = hx.Store(folder / "harness.db", readonly=True)
    except hx.HarnessError:  # (being made)
        return 0
    try:
        return len(store.trial_rows())
    except hx.HarnessError:
        return 0
    finally:
        store.close()


def the_folder(tmp_path: Path) -> Path:
    """The one run folder under logs/, once it is made."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = (
            list((tmp_path / "logs").glob("*/harness.db")) if (tmp_path / "logs").exists() else []
        )
        if found:
            return found[0].parent
        time.sleep(0.02)
    raise AssertionError("the run made no folder")


def group_gone(pgid: int, within: float = 5.0) -> bool:
    """Whether every process of the group has exited (workers die with the run)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def each_trial_once(folder: Path) -> None:
    """Every trial has one row, every keyed write committed once, and the store verifies."""
    store = hx.Store(folder / "harness.db")
    try:
        rows = store.trial_rows()
        assert sorted((r.task_id, r.trial) for r in rows) == sorted(
            (f"t{t}", i) for t in range(TASKS) for i in range(TRIALS)
        )
        assert all(r.passed for r in rows), [r.episode_id for r in rows if not r.passed]
        for row in rows:
            committed = Counter(
                t.idem_key for t in store.transactions(row.episode_id) if t.status == "committed"
            )
            assert committed == {"bump:a:0": 1, "bump:b:1": 1}, (row.episode_id, committed)
        assert store.verify().ok
        assert store.runs()[0].status == "finished"
    finally:
        store.close()


@pytest.mark.parametrize("kill_after", [2, 7])
def test_sigkill_at_any_moment_leaves_a_run_that_verifies_and_resumes(
    tmp_path: Path, kill_after: int
):
    """SIGKILL of the `harness run` process (2 worker processes, 4 trials in flight in each) once
    ``kill_after`` trials finished, plus a random moment up to a trial's length: its workers
    die with it (no process is left holding a lease), `harness verify` passes on what it
    left, and `harness resume` finishes the run with every trial once and exits 0."""
    suite = ledger_suite(
        tmp_path / "suite", [PLAN] * TASKS, ledger=str(tmp_path / "ledger.txt"), delay=0.1
    )
    run = start_run(tmp_path, suite)
    folder = the_folder(tmp_path)
    deadline = time.monotonic() + 120
    while rows_of(folder) < kill_after and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(random.Random(kill_after).uniform(0, 0.3))
    os.kill(run.pid, signal.SIGKILL)  # (the run's process only: its workers must follow)
    run.wait()
    assert group_gone(run.pid), "a worker outlived the run it belonged to"
    verified = cli("verify", str(folder))
    assert verified.returncode == 0, verified.stdout + verified.stderr
    resumed = cli("resume", str(folder), "--suite", str(suite), "--workers", "2")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Traceback" not in resumed.stderr
    each_trial_once(folder)


def test_ctrl_c_stops_after_the_trials_in_flight_and_resume_finishes(tmp_path: Path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) once a trial
    finished: the run ends after the trials in flight, exits 130, prints no traceback from any
    worker, and is recorded as interrupted; resume finishes it, every trial once."""
    suite = ledger_suite(
        tmp_path / "suite", [PLAN] * TASKS, ledger=str(tmp_path / "ledger.txt"), delay=0.2
    )
    run = start_run(tmp_path, suite)
    folder = the_folder(tmp_path)
    deadline = time.monotonic() + 120
    while rows_of(folder) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(run.pid, signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 130, out + err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert "interrupted after" in out
    assert group_gone(run.pid)
    store = hx.Store(folder / "harness.db")
    assert store.runs()[0].status == "interrupted"
    assert 1 <= len(store.trial_rows()) < TASKS * TRIALS
    store.close()
    resumed = cli("resume", str(folder), "--suite", str(suite))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    each_trial_once(folder)


@pytest.mark.parametrize("after", [0.3, 0.8])
def test_ctrl_c_while_the_suite_loads_stops_before_any_trial(tmp_path: Path, after: float):
    """Ctrl-C early (the interpreter starting, the harness importing, or the suite loading) ends
    the command: killed by the signal when it comes before the command owns Ctrl-C, else exit 130
    with no traceback; either way the run does not go on to finish its trials. (An interrupt
    raised inside an import could land in a callback where Python ignores it, and the run went on
    to finish: the command line owns Ctrl-C before it imports the command.)"""
    suite = ledger_suite(
        tmp_path / "suite", [PLAN] * TASKS, ledger=str(tmp_path / "ledger.txt"), delay=0.0
    )
    run = start_run(tmp_path, suite)
    time.sleep(after)
    os.killpg(run.pid, signal.SIGINT)
    out, err = run.communicate(timeout=120)
    assert run.returncode in (130, -signal.SIGINT), out + err
    if run.returncode == 130:
        assert "Traceback" not in err, err
    folders = list((tmp_path / "logs").glob("*/harness.db")) if (tmp_path / "logs").exists() else []
    for db in folders:
        assert rows_of(db.parent) < TASKS * TRIALS

"""One episode is open in one process at a time: a second opener is refused, writing nothing."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.testing import FakeClock

# The store fixtures (SQLite, and Postgres when a server is given); tests take `url` by name.
from .test_store_idempotency import pg_url  # noqa: F401
from .test_store_idempotency import url as url

FORK = multiprocessing.get_context("fork")  # (a spawned child imports the harness again)


class Crash(BaseException):
    """Stands for the process dying in the middle of the episode."""


def ledger() -> tuple[hx.DictState, Any]:
    """An account and a keyed, compensable deposit into it."""
    state = hx.DictState({"acct/a": {"balance": 0}})

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: f"{a.name}:{a.amount}")
    def deposit(name: str, amount: int) -> int:
        acct = state[f"acct/{name}"]
        acct["balance"] += amount
        state[f"acct/{name}"] = acct
        return int(acct["balance"])

    @deposit.compensation
    def undo(ctx: hx.Context) -> None:
        state[f"acct/{ctx.args.name}"] = ctx.before[f"acct/{ctx.args.name}"]

    return state, deposit


def crashed_episode(url: str) -> None:
    """Episode E: one deposit committed, then the agent died."""
    state, deposit = ledger()
    with pytest.raises(Crash):
        with hx.Episode(state=state, store=url, episode_id="E", clock=FakeClock()):
            deposit("a", 1)
            raise Crash()


def _resume(
    url: str, opened: str | None, release: str | None, out: str, calls: int, start: float = 0.0
) -> None:
    """Child process: resume E at ``start`` (a time) and run the agent again (after
    ``release`` exists, if given)."""
    state, deposit = ledger()
    while time.time() < start:
        time.sleep(0.001)
    try:
        with hx.Episode(state=state, store=url, episode_id="E", resume=True, actions=[deposit]):
            if opened is not None:
                Path(opened).touch()
            while release is not None and not Path(release).exists():
                time.sleep(0.01)
            for amount in range(1, calls + 1):
                deposit("a", amount)
        Path(out).write_text("ok")
    except hx.StoreError as exc:
        Path(out).write_text(f"refused {exc}")


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert path.exists(), f"{path.name} never appeared"


def test_a_second_process_resuming_an_open_episode_is_refused_and_writes_nothing(
    url: str, tmp_path: Path
):
    """While one process has an episode open, another resuming it gets a StoreError naming
    the holder's pid, writes nothing, and the store still verifies."""
    crashed_episode(url)
    opened, release = tmp_path / "opened", tmp_path / "release"
    first_out, second_out = tmp_path / "first", tmp_path / "second"
    first = FORK.Process(target=_resume, args=(url, str(opened), str(release), str(first_out), 3))
    first.start()
    try:
        _wait_for(opened)
        store = hx.Store(url)
        before = len(store.log("E"))
        second = FORK.Process(target=_resume, args=(url, None, None, str(second_out), 3))
        second.start()
        second.join(60)
        assert second.exitcode == 0
        text = second_out.read_text()
        assert text.startswith("refused ") and "open in another process" in text
        assert f"pid {first.pid}" in text
        assert len(store.log("E")) == before
        release.touch()
        first.join(60)
        assert first_out.read_text() == "ok"
        report = store.verify()
        assert report.ok, report.findings
        assert store.episode("E").status == "committed"  # type: ignore[union-attr]
        store.close()
    finally:
        release.touch()
        first.join(60)


def test_two_processes_resuming_one_episode_at_once_leave_no_trace_of_tampering(
    url: str, tmp_path: Path
):
    """Two processes resuming one crashed episode at the same moment: at most one runs it,
    the other is refused (or runs after it), and verify finds nothing altered."""
    crashed_episode(url)
    outs = [tmp_path / "one", tmp_path / "two"]
    start = time.time() + 0.5  # (both processes are forked and ready by then)
    processes = [
        FORK.Process(target=_resume, args=(url, None, None, str(out), 60, start)) for out in outs
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    answers = [out.read_text() for out in outs]
    assert "ok" in answers
    assert all(a == "ok" or "open in another process" in a for a in answers)
    store = hx.Store(url)
    report = store.verify()
    assert report.ok, report.findings
    store.close()


def _open_and_die(url: str, opened: str) -> None:
    """Child process: resume E, say so, and be killed while it is open."""
    state, deposit = ledger()
    with hx.Episode(state=state, store=url, episode_id="E", resume=True, actions=[deposit]):
        Path(opened).touch()
        os.kill(os.getpid(), signal.SIGKILL)


def test_a_process_killed_with_the_episode_open_does_not_block_its_resume(url: str, tmp_path: Path):
    """The claim of a process killed on this host while it had the episode open does not
    block resuming it here."""
    crashed_episode(url)
    opened = tmp_path / "opened"
    victim = FORK.Process(target=_open_and_die, args=(url, str(opened)))
    victim.start()
    victim.join(60)
    assert victim.exitcode == -signal.SIGKILL and opened.exists()
    state, deposit = ledger()
    with hx.Episode(
        state=state, store=url, episode_id="E", resume=True, actions=[deposit], clock=FakeClock()
    ) as ep:
        deposit("a", 1)
    assert ep.outcome == "committed"
    store = hx.Store(url)
    assert store.verify().ok
    store.close()

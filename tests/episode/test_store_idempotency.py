"""Idempotency across episodes, when asked for: ``@hx.action(idempotency_scope="store")``."""

from __future__ import annotations

import multiprocessing
import time
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.testing import FakeClock

from ..store.test_postgres import SERVER, pg_url  # noqa: F401 - (a fixture)


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store: a SQLite file, or a Postgres database when a server is given."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'harness.db'}"
    if not SERVER:
        pytest.skip("set HX_TEST_POSTGRES_URL=postgresql+psycopg://user@host:port/db")
    return str(request.getfixturevalue("pg_url"))


def bank(effects: Path, *, scope: str = "store", wait_for: Path | None = None) -> Any:
    """A transfer action keyed by its reference; every run of its tool is a line in
    ``effects`` (so runs in other processes are counted too)."""
    state = hx.DictState({"acct/a": {"balance": 0}})

    @hx.action(writes=["acct/{name}"], idempotency_key=lambda a: a.ref, idempotency_scope=scope)
    def transfer(name: str, amount: int, ref: str) -> dict[str, int]:
        """Move money into an account, once per reference."""
        with effects.open("a") as f:
            f.write(f"{ref}\n")
        while wait_for is not None and not wait_for.exists():
            time.sleep(0.01)
        acct = state[f"acct/{name}"]
        acct["balance"] += amount
        state[f"acct/{name}"] = acct
        return {"balance": acct["balance"]}

    @transfer.compensation
    def undo(ctx: hx.Context) -> None:
        state[f"acct/{ctx.args.name}"] = ctx.before[f"acct/{ctx.args.name}"]

    return state, transfer


def runs(effects: Path) -> list[str]:
    """The references the tool ran for, in every process."""
    return effects.read_text().split() if effects.exists() else []


def test_a_new_episode_gets_the_committed_result_and_runs_nothing(url: str, tmp_path: Path):
    """A second episode calling a store-scoped action with a committed key gets the recorded
    result, runs nothing, and its log records the dedup with the other episode's id."""
    effects = tmp_path / "effects"
    state, transfer = bank(effects)
    with hx.Episode(state=state, store=url, clock=FakeClock()) as first:
        assert transfer("a", 5, ref="r1") == {"balance": 5}
    with hx.Episode(state=state, store=url, clock=FakeClock()) as retried:
        assert transfer("a", 5, ref="r1") == {"balance": 5}
    assert runs(effects) == ["r1"] and retried.outcome == "committed"
    store = hx.Store(url)
    (dedup,) = [r for r in store.log(retried.id) if r.kind == "dedup"]
    assert first.id in dedup.payload
    assert store.transactions(retried.id) == []
    assert store.verify().ok
    store.close()


def test_a_key_committed_with_other_arguments_elsewhere_is_a_conflict(url: str, tmp_path: Path):
    """The same store-wide key with other arguments is IdempotencyConflict: nothing runs and
    the refusal is recorded."""
    effects = tmp_path / "effects"
    state, transfer = bank(effects)
    with hx.Episode(state=state, store=url, clock=FakeClock()):
        transfer("a", 5, ref="r1")
    with hx.Episode(state=state, store=url, clock=FakeClock()) as other:
        with pytest.raises(hx.IdempotencyConflict):
            transfer("a", 7, ref="r1")
    assert runs(effects) == ["r1"]
    store = hx.Store(url)
    assert [t.status for t in store.transactions(other.id)] == ["invalid"]
    store.close()


def test_a_rolled_back_call_does_not_count_as_done(url: str, tmp_path: Path):
    """A store-scoped call committed and then compensated (rolled back) leaves its key free: a
    later episode runs the tool."""
    effects = tmp_path / "effects"
    state, transfer = bank(effects)
    with hx.Episode(state=state, store=url, clock=FakeClock()) as first:
        transfer("a", 5, ref="r1")
        first.rollback()
    assert first.outcome == "rolled_back" and state["acct/a"] == {"balance": 0}
    with hx.Episode(state=state, store=url, clock=FakeClock()):
        assert transfer("a", 5, ref="r1") == {"balance": 5}
    assert runs(effects) == ["r1", "r1"]


def test_a_call_that_failed_gives_its_key_back(url: str, tmp_path: Path):
    """A store-scoped call refused by its precondition holds no key: another episode runs it."""
    effects = tmp_path / "effects"
    state, transfer = bank(effects)
    allowed = {"ok": False}

    @transfer.precondition
    def open_for_business(ctx: hx.Context) -> bool:
        return allowed["ok"]

    with hx.Episode(state=state, store=url, clock=FakeClock()):
        with pytest.raises(hx.PreconditionFailed):
            transfer("a", 5, ref="r1")
    allowed["ok"] = True
    with hx.Episode(state=state, store=url, clock=FakeClock()):
        assert transfer("a", 5, ref="r1") == {"balance": 5}
    assert runs(effects) == ["r1"]


def test_the_default_scope_is_the_episode(url: str, tmp_path: Path):
    """Without idempotency_scope='store', a new episode runs a committed key again (the
    documented default)."""
    effects = tmp_path / "effects"
    state, transfer = bank(effects, scope="episode")
    for _ in range(2):
        with hx.Episode(state=state, store=url, clock=FakeClock()):
            transfer("a", 5, ref="r1")
    assert runs(effects) == ["r1", "r1"]


def test_a_read_only_action_cannot_be_store_scoped():
    """idempotency_scope='store' on an action with no writes is refused when it is declared."""
    with pytest.raises(hx.ConfigurationError, match="read-only"):
        hx.action(lambda: None, idempotency_scope="store")


# --- two processes at once ---


def _transfer_in_process(url: str, effects: str, release: str | None, out: str) -> None:
    """Child process: one episode calling transfer(ref='r1'); writes what it got to ``out``."""
    state, transfer = bank(Path(effects), wait_for=None if release is None else Path(release))
    try:
        with hx.Episode(state=state, store=url) as ep:
            result = transfer("a", 5, ref="r1")
        Path(out).write_text(f"ok {ep.id} {result['balance']}")
    except hx.KeyInFlight as exc:
        Path(out).write_text(f"in_flight {exc.episode_id}")


def _spawn(*args: Any) -> multiprocessing.process.BaseProcess:
    process = multiprocessing.get_context("spawn").Process(target=_transfer_in_process, args=args)
    process.start()
    return process


def test_a_key_in_flight_in_another_process_is_refused_then_answered(url: str, tmp_path: Path):
    """While another process's call holds a store-wide key, a call with the key is KeyInFlight
    naming that episode (nothing runs); once it committed, the call gets its result."""
    effects, release, out = tmp_path / "effects", tmp_path / "release", tmp_path / "out"
    holder = _spawn(url, str(effects), str(release), str(out))
    try:
        deadline = time.monotonic() + 60
        while not runs(effects) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert runs(effects) == ["r1"]
        state, transfer = bank(effects)
        with hx.Episode(state=state, store=url, clock=FakeClock()) as waiting:
            with pytest.raises(hx.KeyInFlight) as info:
                transfer("a", 5, ref="r1")
        assert runs(effects) == ["r1"]
        release.touch()
        holder.join(60)
        assert holder.exitcode == 0
        done, holder_id, _ = out.read_text().split()
        assert done == "ok" and info.value.episode_id == holder_id
        store = hx.Store(url)
        assert "key_in_flight" in [r.kind for r in store.log(waiting.id)]
        store.close()
        with hx.Episode(state=state, store=url, clock=FakeClock()):
            assert transfer("a", 5, ref="r1") == {"balance": 5}
        assert runs(effects) == ["r1"]
    finally:
        release.touch()
        holder.join(60)


def test_two_processes_racing_one_key_run_the_tool_once(url: str, tmp_path: Path):
    """Two processes calling a store-scoped action with one key at the same moment run its
    tool once: the other gets the recorded result or KeyInFlight naming the first."""
    hx.Store(url, create=True).close()  # (the schema exists before they race)
    effects = tmp_path / "effects"
    outs = [tmp_path / "out-1", tmp_path / "out-2"]
    processes = [_spawn(url, str(effects), None, str(out)) for out in outs]
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    assert runs(effects) == ["r1"]
    answers = sorted(out.read_text().split() for out in outs)
    ran = [a for a in answers if a[0] == "ok" and a[2] == "5"]
    assert ran and all(a[0] in ("ok", "in_flight") for a in answers)
    store = hx.Store(url)
    assert store.verify().ok
    store.close()


def test_a_policy_can_make_every_key_hold_across_episodes(url: str, tmp_path: Path):
    """``Policy(idempotency_scope="store")`` makes an action declared with the default scope
    answer a second episode from the first one's commit, and a bad scope is refused by name."""
    effects = tmp_path / "effects"
    state, transfer = bank(effects, scope="episode")
    policy = hx.Policy(idempotency_scope="store")
    for _ in range(2):
        with hx.Episode(state=state, store=url, clock=FakeClock(), policy=policy) as ep:
            assert transfer("a", 5, ref="r1") == {"balance": 5}
        assert ep.outcome == "committed"
    assert runs(effects) == ["r1"]
    assert policy.describe()["idempotency_scope"] == "store"
    assert "idempotency_scope" not in hx.Policy().describe()  # records stay as they were
    with pytest.raises(hx.ConfigurationError, match="idempotency_scope='stores'.*'episode'"):
        hx.Policy(idempotency_scope="stores")

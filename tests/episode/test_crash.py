"""Crash safety: a child process running episodes is SIGKILLed in every window of a transaction.

The child runs episodes of a small agent against a SQLite database whose tools write their
effect and a ledger entry in one database transaction (the ledger is an ``_hx_`` table, which
the harness's change capture does not see: it is the outside world's own account of what was
applied). The parent kills the child with SIGKILL, either when it reports reaching a chosen
window (it pauses there) or after a random short delay, then starts a new child that resumes
where the last one died, approving any escalation a person would have to decide. Between kills
the parent checks that every log record and committed transaction it saw is still there,
unchanged, and that the hash chain verifies; at the end, that every transaction's effect was
applied exactly as many times as its outcome says (once if committed, else not at all).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import select
import signal
import sqlite3
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import harness as hx
from harness.episode import Episode
from harness.episode.recorder import Recorder
from harness.store import EpisodeWriter

WINDOWS = (
    "before_intent",  # a precondition runs: no intent yet
    "after_intent",  # the intent is durable, the tool has not run
    "during_execution",  # inside the tool's database transaction (rolled back by the kill)
    "after_execution",  # the effect is committed in the database, its outcome is not recorded
    "during_materialise",  # a later batch writes committed calls' rows and checkpoints: not
    # committed yet (the commits' own records are)
    "during_compensation",  # inside a compensation's database transaction
    "after_compensation",  # the compensation is committed, its outcome is not recorded
)
PHASES = ("agent", *WINDOWS)
POLICY = hx.Policy(retry=hx.Retry(attempts=3, backoff=0.0, jitter=False))
EPISODES_PER_ROUND = 12


# --------------------------------------------------------------------------------------------
# The child: an environment whose tools keep a ledger, and an agent that uses them.
# --------------------------------------------------------------------------------------------


def make_database(path: Path) -> None:
    """Create the environment's tables: items, and the ledger of applied effects."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE items (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
    conn.execute("CREATE TABLE notes (key TEXT PRIMARY KEY, text TEXT NOT NULL)")
    conn.execute(
        "CREATE TABLE _hx_ledger (id INTEGER PRIMARY KEY AUTOINCREMENT, txn TEXT NOT NULL, "
        "key TEXT NOT NULL, op TEXT NOT NULL, delta INTEGER NOT NULL)"
    )
    conn.close()


class LedgerEnvironment:
    """Items in SQLite; ``put`` (keyed) and ``add`` (unkeyed) with compensations, ``note``
    (keyed, without one); every effect writes the ledger in its own database transaction."""

    def __init__(self, path: Path, hook: Any) -> None:
        self.state = hx.SQLState(path)
        db = self.state.connection

        def apply(statements: list[tuple[str, tuple[Any, ...]]], during: str, after: str) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    db.execute(sql, params)
                hook(during)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            hook(after)

        def ledger(txn: str, key: str, op: str, delta: int) -> tuple[str, tuple[Any, ...]]:
            return (
                "INSERT INTO _hx_ledger (txn, key, op, delta) VALUES (?, ?, ?, ?)",
                (txn, key, op, delta),
            )

        @hx.action(writes=["items/{key}"], idempotency_key=lambda a: a.key)
        def put(key: str, value: int, flaky: bool = False) -> dict[str, Any]:
            """Store `value` under a new `key` (a flaky put's first attempt writes a wrong one)."""
            ctx = hx.current_context()
            assert ctx is not None
            wrong = flaky and ctx.attempt == 1
            apply(
                [
                    ("INSERT INTO items VALUES (?, ?)", (key, value + 1000 if wrong else value)),
                    ledger(ctx.txn_id, key, "put", 1),
                ],
                "during_execution",
                "after_execution",
            )
            return {"key": key, "value": value}

        @put.precondition
        def is_new(ctx: hx.Context) -> bool:
            """The key must not exist yet."""
            hook("before_intent")
            return ctx.state.get(f"items/{ctx.args.key}") is None

        @put.postcondition
        def stored(ctx: hx.Context) -> bool:
            row = ctx.after.get(f"items/{ctx.args.key}")
            return row is not None and row["value"] == ctx.args.value

        @put.compensation
        def unput(ctx: hx.Context) -> None:
            apply(
                [
                    ("DELETE FROM items WHERE key = ?", (ctx.args.key,)),
                    ledger(ctx.txn_id, ctx.args.key, "put", -1),
                ],
                "during_compensation",
                "after_compensation",
            )

        @put.recover
        def put_result(ctx: hx.Context) -> dict[str, Any]:
            return {"key": ctx.args.key, "value": ctx.args.value}

        @hx.action(writes=["items/{key}"])
        def add(key: str, amount: int) -> int:
            """Add `amount` to the value under `key`; returns the new value."""
            ctx = hx.current_context()
            assert ctx is not None
            apply(
                [
                    ("UPDATE items SET value = value + ? WHERE key = ?", (amount, key)),
                    ledger(ctx.txn_id, key, "add", 1),
                ],
                "during_execution",
                "after_execution",
            )
            return int(db.execute("SELECT value FROM items WHERE key = ?", (key,)).fetchone()[0])

        @add.precondition
        def exists(ctx: hx.Context) -> bool:
            """The key must exist."""
            hook("before_intent")
            return ctx.state.get(f"items/{ctx.args.key}") is not None

        @add.postcondition
        def added(ctx: hx.Context) -> bool:
            key = f"items/{ctx.args.key}"
            before, after = ctx.before.get(key), ctx.after.get(key)
            return bool(before and after and after["value"] - before["value"] == ctx.args.amount)

        @add.compensation
        def unadd(ctx: hx.Context) -> None:
            before = ctx.before[f"items/{ctx.args.key}"]
            apply(
                [
                    ("UPDATE items SET value = ? WHERE key = ?", (before["value"], ctx.args.key)),
                    ledger(ctx.txn_id, ctx.args.key, "add", -1),
                ],
                "during_compensation",
                "after_compensation",
            )

        @add.recover
        def add_result(ctx: hx.Context) -> int:
            return int(ctx.state.get(f"items/{ctx.args.key}")["value"])

        @hx.action(writes=["notes/{key}"], idempotency_key=lambda a: a.key)
        def note(key: str, text: str) -> str:
            """Attach `text` to `key`; it cannot be taken back (no compensation)."""
            ctx = hx.current_context()
            assert ctx is not None
            apply(
                [
                    ("INSERT INTO notes VALUES (?, ?)", (key, text)),
                    ledger(ctx.txn_id, key, "note", 1),
                ],
                "during_execution",
                "after_execution",
            )
            return text

        @note.precondition
        def unnoted(ctx: hx.Context) -> bool:
            """The key has no note yet."""
            hook("before_intent")
            return ctx.state.get(f"notes/{ctx.args.key}") is None

        @note.postcondition
        def noted(ctx: hx.Context) -> bool:
            row = ctx.after.get(f"notes/{ctx.args.key}")
            return row is not None and row["text"] == ctx.args.text

        @note.recover
        def note_result(ctx: hx.Context) -> str:
            return str(ctx.args.text)

        self.put, self.add, self.note = put, add, note
        self.count = lambda: int(db.execute("SELECT COUNT(*) FROM items").fetchone()[0])


def plan(n: int) -> tuple[list[str], list[int], list[bool]]:
    """Episode n's keys, values and which puts are flaky (seeded by n)."""
    rng = random.Random(n)
    keys = [f"e{n}k{j}" for j in range(3)]
    return keys, [rng.randint(1, 999) for _ in keys], [(n + j) % 3 == 0 for j in range(3)]


def agent(ep: Episode, env: LedgerEnvironment, n: int) -> None:
    """The agent of episode n: puts, a refused add, a repeated put, an add, a put, a note;
    every 4th episode rolls back instead of noting. It checks every answer it gets."""
    keys, values, flaky = plan(n)
    assert isinstance(ep.remember("read", {"count": "items"}, env.count), int)
    for j in range(2):
        assert env.put(keys[j], values[j], flaky[j]) == {"key": keys[j], "value": values[j]}
    with contextlib.suppress(hx.PreconditionFailed):
        env.add(f"missing{n}", 1)
        raise AssertionError("add on a missing key must be refused")
    assert env.put(keys[0], values[0], flaky[0]) == {
        "key": keys[0],
        "value": values[0],
    }  # same call
    assert env.add(keys[0], 5) == values[0] + 5
    assert env.put(keys[2], values[2], flaky[2]) == {"key": keys[2], "value": values[2]}
    if n % 4 == 3:
        ep.rollback()
    else:
        assert env.note(keys[1], f"note {n}") == f"note {n}"


def child(folder: Path, episodes: int, target: str | None, occurrence: int, phase: Any) -> None:
    """Run episodes 0..episodes-1 (new, or resumed where a killed child left them)."""
    hits = 0
    wfd = int(os.environ["HX_CRASH_FD"])

    def hook(name: str) -> None:
        nonlocal hits
        phase.value = PHASES.index(name)
        if name == target:
            hits += 1
            if hits == occurrence:
                os.write(wfd, f"{name}\n".encode())
                time.sleep(60)  # until the parent's SIGKILL

    intent, flush, commit = (
        Recorder.record_intent,
        EpisodeWriter.flush,
        Recorder.commit_entry,
    )

    def record_intent(self: Recorder, txn: Any) -> None:
        intent(self, txn)
        hook("after_intent")

    def materialise(self: EpisodeWriter) -> None:
        rows = len(self.pending)
        flush(self)
        if rows:
            hook("during_materialise")

    def commit_entry(self: Recorder, *args: Any, **kw: Any) -> Any:
        entry = commit(self, *args, **kw)
        phase.value = 0
        return entry

    Recorder.record_intent = record_intent  # type: ignore[method-assign]
    EpisodeWriter.flush = materialise  # type: ignore[method-assign]
    Recorder.commit_entry = commit_entry  # type: ignore[method-assign]
    env = LedgerEnvironment(folder / "env.db", hook)
    store = hx.Store(folder / "store.db", create=True)
    for n in range(episodes):
        row = store.episode(f"e{n}")
        if row is not None and row.status in ("committed", "rolled_back", "failed"):
            continue
        if row is not None and store.escalations("pending", episode_id=f"e{n}"):
            continue
        phase.value = 0
        with contextlib.suppress(hx.Escalated):
            with Episode(
                state=env.state,
                store=store,
                policy=POLICY,
                episode_id=f"e{n}",
                resume=row is not None,
                actions=[env.put, env.add, env.note],
            ) as ep:
                agent(ep, env, n)


# --------------------------------------------------------------------------------------------
# The parent: kill, check, resume.
# --------------------------------------------------------------------------------------------


def fork_child(
    folder: Path, episodes: int, target: str | None, occurrence: int, delay: float
) -> str | None:
    """Run a child until it ends or is killed; return the window it was killed in (or None).

    With a ``target`` the child is killed when it reports pausing there; without one, when it
    is still running after ``delay`` seconds. A child that ends by itself must exit cleanly.
    """
    phase = multiprocessing.RawValue("i", 0)
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(rfd)
        code = 0
        try:
            os.environ["HX_CRASH_FD"] = str(wfd)
            child(folder, episodes, target, occurrence, phase)
        except BaseException:
            (folder / "child-error.txt").write_text(traceback.format_exc())
            code = 3
        finally:
            os._exit(code)
    os.close(wfd)
    window: str | None = None
    status: int | None = None
    try:
        if target is not None:
            ready, _, _ = select.select([rfd], [], [], 60)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError(f"the child neither paused at {target} nor ended in 60 s")
            window = os.read(rfd, 100).decode().strip() or None  # empty: it ended by itself
        else:
            end = time.monotonic() + delay
            while time.monotonic() < end:
                done, code = os.waitpid(pid, os.WNOHANG)
                if done:
                    status = code
                    break
                time.sleep(0.001)
            else:
                window = PHASES[phase.value]
        if status is None:
            if window is not None:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
    finally:
        os.close(rfd)
    if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
        return window
    error = folder / "child-error.txt"
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, (
        error.read_text() if error.exists() else f"child ended with status {status}"
    )
    return None


def snapshot(folder: Path) -> tuple[dict[tuple[str, int], str], dict[str, tuple[Any, ...]]]:
    """Every log record (by episode and seq, its hash) and every committed transaction."""
    conn = sqlite3.connect(f"{(folder / 'store.db').resolve().as_uri()}?mode=ro", uri=True)
    try:
        log = {(e, s): h for e, s, h in conn.execute("SELECT episode_id, seq, hash FROM hx_log")}
        txns = {
            r[0]: r[1:]
            for r in conn.execute(
                "SELECT id, action, args, result, diff, step FROM hx_transaction "
                "WHERE step IS NOT NULL"
            )
        }
    finally:
        conn.close()
    return log, txns


def approve_pending(folder: Path) -> int:
    """Approve every pending escalation, as the person on call would."""
    store = hx.Store(folder / "store.db")
    try:
        pending = store.escalations("pending")
        for esc in pending:
            store.resolve(esc.id, "approve", by="crash-test", reason="effect checked: absent")
        return len(pending)
    finally:
        store.close()


def check_final(folder: Path, episodes: int) -> dict[str, int]:
    """Every transaction's effect applied exactly as its outcome says; the record verifies."""
    store = hx.Store(folder / "store.db")
    try:
        statuses = Counter()
        rows = []
        for n in range(episodes):
            ep = store.episode(f"e{n}")
            assert ep is not None
            expected = "rolled_back" if n % 4 == 3 else "committed"
            assert ep.status == expected, (ep.id, ep.status)
            rows.extend(store.transactions(ep.id))
        assert not store.escalations("pending")
        report = store.verify()
        assert report.ok, report.findings
        assert store.verify_chain().ok
    finally:
        store.close()
    conn = sqlite3.connect(folder / "env.db")
    ledger: Counter[str] = Counter()
    applied: Counter[str] = Counter()
    for txn, delta in conn.execute("SELECT txn, delta FROM _hx_ledger"):
        ledger[txn] += delta
        applied[txn] += delta > 0
    items = dict(conn.execute("SELECT key, value FROM items").fetchall())
    notes = dict(conn.execute("SELECT key, text FROM notes").fetchall())
    conn.close()
    by_id = {r.id: r for r in rows}
    for row in rows:
        statuses[row.status] += 1
        want = 1 if row.mutating and row.status in ("committed", "recovered") else 0
        assert ledger.get(row.id, 0) == want, (row.id, row.status, ledger.get(row.id, 0))
    for txn, net in ledger.items():
        assert txn in by_id or net == 0, (txn, net)  # an intent never settled left nothing
    expected: dict[str, int] = {}
    expected_notes: dict[str, str] = {}
    for n in range(episodes):
        if n % 4 == 3:
            continue
        keys, values, _ = plan(n)
        expected.update({keys[0]: values[0] + 5, keys[1]: values[1], keys[2]: values[2]})
        expected_notes[keys[1]] = f"note {n}"
    assert items == expected
    assert notes == expected_notes
    statuses["ledger_entries"] = sum(applied.values())
    return dict(statuses)


def campaign(
    folder: Path, *, kills: int, per_window: int, seed: int, random_share: float
) -> dict[str, Any]:
    """Kill, check and resume until ``kills`` kills landed, ``per_window`` of them paused in
    each window, then let every episode finish."""
    rng = random.Random(seed)
    make_database(folder / "env.db")
    episodes = EPISODES_PER_ROUND
    by_window: Counter[str] = Counter()
    random_by_window: Counter[str] = Counter()
    approvals = cycles = 0
    seen_log: dict[tuple[str, int], str] = {}
    seen_txns: dict[str, tuple[Any, ...]] = {}
    turn = 0
    while sum(by_window.values()) + sum(random_by_window.values()) < kills or any(
        by_window[w] < per_window for w in WINDOWS
    ):
        cycles += 1
        if rng.random() < random_share:
            killed = fork_child(folder, episodes, None, 0, rng.uniform(0.0, 0.08))
            if killed is not None:
                random_by_window[killed] += 1
        else:
            target = WINDOWS[turn % len(WINDOWS)]
            killed = fork_child(folder, episodes, target, rng.randint(1, 3), 0.0)
            if killed is not None:
                by_window[killed] += 1
                turn += 1
        if killed is None:
            episodes += EPISODES_PER_ROUND  # the child finished everything: give it more
        approvals += approve_pending(folder)
        log, txns = snapshot(folder)
        lost_records = [k for k, h in seen_log.items() if log.get(k) != h]
        assert not lost_records, f"log records lost or changed: {lost_records[:5]}"
        lost_txns = [k for k, v in seen_txns.items() if txns.get(k) != v]
        assert not lost_txns, f"committed transactions lost or changed: {lost_txns[:5]}"
        seen_log, seen_txns = log, txns
        store = hx.Store(folder / "store.db")
        chain = store.verify_chain()
        store.close()
        assert chain.ok, chain
    for _ in range(20):  # no more kills: let the last episodes finish
        cycles += 1
        assert fork_child(folder, episodes, None, 0, 120.0) is None
        if not approve_pending(folder):
            break
    else:
        raise AssertionError("escalations keep coming back after approval")
    statuses = check_final(folder, episodes)
    return {
        "kills": dict(by_window),
        "random_kills": dict(random_by_window),
        "cycles": cycles,
        "episodes": episodes,
        "approvals": approvals,
        "outcomes": statuses,
    }


def test_sigkill_in_every_window_loses_nothing_and_applies_nothing_twice(tmp_path: Path):
    """Over 100+ seeded SIGKILLs covering every window, resumes lose no record and no effect
    is applied twice or left applied without its commit."""
    stats = campaign(tmp_path, kills=120, per_window=12, seed=20240611, random_share=0.2)
    print("crash campaign:", stats)
    for window in WINDOWS:
        assert stats["kills"].get(window, 0) >= 12, (window, stats["kills"])
    assert sum(stats["kills"].values()) + sum(stats["random_kills"].values()) >= 120
    outcomes = stats["outcomes"]
    # The windows were really exercised: effects found present were recovered, absent keyed
    # calls ran again, and unkeyed ones waited for a person's approval.
    assert outcomes.get("recovered", 0) > 0 and outcomes.get("abandoned", 0) > 0
    assert stats["approvals"] > 0


@pytest.mark.slow
def test_soak_thousand_sigkills(tmp_path: Path):
    """A thousand seeded SIGKILLs, each resumed: still no lost record, no double effect."""
    stats = campaign(tmp_path, kills=1000, per_window=90, seed=7, random_share=0.3)
    print("soak:", stats)
    assert sum(stats["kills"].values()) + sum(stats["random_kills"].values()) >= 1000

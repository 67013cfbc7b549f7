"""Overhead of one durable harness transaction, against two raw SQLite inserts and a DBOS step.

    python benchmarks/transaction_overhead.py [--n N] [--reps R] [--warmup W] [--no-dbos] [--signed]

Everything runs in one process, on SQLite files in a fresh temporary folder:

(a) raw floor: two ``sqlite3`` INSERTs, each its own committed transaction, into a WAL database
    with ``synchronous=NORMAL``; microseconds per pair. Write-ahead needs two durable writes per
    action (the intent before the tool runs, the outcome after), so this is the floor.
(b) harness: a no-op mutating ``@hx.action`` (writes scope, idempotency key, a compensation: the
    full path, intent + commit) with one precondition and one postcondition, called N times with
    distinct arguments (no dedup) inside one ``hx.Episode`` on ``DictState`` and the default
    store (``sqlite:///<tmp>/h.db``: WAL, ``synchronous=NORMAL``); microseconds per action.
(c) DBOS: a no-op ``@DBOS.step()`` called N times inside one ``@DBOS.workflow()`` on a SQLite
    system database; microseconds per step. Measured twice: with the same durability settings
    as (a) and (b) (WAL, ``synchronous=NORMAL``; the ratio target is judged on this one) and
    with SQLite as DBOS leaves it (rollback journal, ``synchronous=FULL``). Needs
    ``pip install 'transactional-harness[bench]'``; without it (a) and (b) still run and (c)
    says why not.

Each measurement is timed around the N calls, and for the harness also the episode's end, where
the transaction rows and checkpoints of its commits are written from their log records (opening
the episode, launching DBOS and starting the workflow are outside); repeated after warm-up,
medians are reported.
Then, for the harness, where the time goes: one instrumented run that times every engine piece
(exclusive time, the instrumentation's own cost subtracted) and a cProfile of one run.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import io
import os
import platform
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import types
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tenacity

import harness as hx
import harness.episode.recorder as hx_records
import harness.store.store as hx_store
import harness.store.writer as hx_writer
import harness.transaction as hx_transaction
from harness.policy import Retry
from harness.state.dict import DictState
from harness.store import EpisodeWriter

TARGET_VS_RAW = 3.0  # at most 3x two raw SQLite commits
TARGET_VS_DBOS = 0.1

# --------------------------------------------------------------------------------------------
# (a) raw floor
# --------------------------------------------------------------------------------------------

_PAYLOAD = '{"action":"touch","key":"%d","args":{"key":"%d","n":%d},"status":"intent"}'


class RawFloor:
    """Two autocommitted INSERTs per pair on one WAL, synchronous=NORMAL connection."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(str(path), isolation_level=None)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        self.conn.execute(
            "CREATE TABLE IF NOT EXISTS t (id INTEGER PRIMARY KEY, k TEXT, payload TEXT, ts REAL)"
        )
        self.sql = "INSERT INTO t (k, payload, ts) VALUES (?, ?, ?)"

    def run(self, n: int) -> float:
        """Seconds per pair over ``n`` pairs."""
        execute, sql, now = self.conn.execute, self.sql, time.time
        t0 = time.perf_counter()
        for i in range(n):
            text = _PAYLOAD % (i, i, i)
            execute(sql, (f"a{i}", text, now()))  # autocommit: one committed transaction
            execute(sql, (f"b{i}", text, now()))
        return (time.perf_counter() - t0) / n

    def close(self) -> None:
        self.conn.close()


# --------------------------------------------------------------------------------------------
# (b) harness
# --------------------------------------------------------------------------------------------


def _build_action() -> hx.Action[Any, Any]:
    @hx.action(writes=["k/{key}"], idempotency_key=lambda a: a.key)
    def touch(key: str, n: int) -> None:
        """A no-op tool that declares it may write ``k/{key}``."""
        return None

    @touch.precondition
    def exists(ctx: hx.Context) -> bool:
        return ctx.state.get(f"k/{ctx.args.key}") is not None

    @touch.postcondition
    def unchanged(ctx: hx.Context) -> bool:
        k = f"k/{ctx.args.key}"
        return bool(ctx.after[k] == ctx.before[k])

    @touch.compensation
    def undo(ctx: hx.Context) -> None:
        return None

    return touch


class _NullLog:
    """A logger that drops every line (ablation: no structlog line per transaction)."""

    def info(self, *_: Any, **__: Any) -> None:
        return None

    warning = error = debug = later = info

    def drain(self) -> None:
        return None

    def bind(self, **_: Any) -> _NullLog:
        return self


class _NullCursor:
    """A cursor stand-in that sends nothing (ablation: no SQLite)."""

    def execute(self, *_: Any) -> None:
        return None

    executemany = execute

    def close(self) -> None:
        return None


class _NullConn:
    """A connection stand-in whose COMMIT does nothing (ablation: no SQLite)."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def commit(self) -> None:
        return None

    def rollback(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class HarnessBench:
    """N calls of the no-op action per episode; every episode on the same store file."""

    def __init__(self, folder: Path, n: int, signed: bool = False) -> None:
        self.folder = folder
        # With --signed, each episode's head is signed as it ends (as `harness run
        # --signing-key` does); the end is inside the timing.
        self.signing_key = hx.SigningKey.generate() if signed else None
        self.path = folder / "h.db"
        self.url = f"sqlite:///{self.path.as_posix()}"
        self.n = n
        self.state = DictState({f"k/{i}": {"i": i, "status": "open"} for i in range(n)})
        self.action = _build_action()
        # One store for every episode, as a worker of a run holds it (DBOS too is launched
        # once): an episode's end closes its own connection, not the database.
        self.store = hx.Store(self.url, create=True)

    def episode(self) -> hx.Episode:
        return hx.Episode(state=self.state, store=self.store, signing_key=self.signing_key)

    def loop(self) -> float:
        """Seconds for the N calls (inside an open episode)."""
        touch, n = self.action, self.n
        t0 = time.perf_counter()
        for i in range(n):
            touch(str(i), i)
        return time.perf_counter() - t0

    def run(self, mode: str = "full") -> float:
        """Seconds per action, the episode's end included; ``mode`` "no-log" drops the JSON
        line, "python" also SQLite."""
        with self.episode() as ep:
            writer = ep._writer
            if mode in ("no-log", "python"):
                ep.recorder.log = _NullLog()
            if mode == "python":
                writer._cursor = _NullCursor()
                writer.conn = _NullConn(writer.conn)
            t0 = time.perf_counter()
            self.loop()
        elapsed = time.perf_counter() - t0
        if ep.outcome != "committed" or ep.steps != self.n:
            raise RuntimeError(f"harness run went wrong: {ep!r}")
        return elapsed / self.n

    def capture_sql(self) -> tuple[Path, list[tuple[str, Any]]]:
        """The statements one run sends (its end included), and a copy of the database as it
        was before them."""
        statements: list[tuple[str, Any]] = []
        pristine = self.folder / "replay-pristine.db"
        with self.episode() as ep:
            writer = ep._writer
            src = sqlite3.connect(str(self.path))
            dst = sqlite3.connect(str(pristine))
            src.backup(dst)
            src.close()
            dst.close()
            cursor = writer._cursor

            class Recording:
                def execute(self, sql: str, params: Any) -> None:
                    statements.append((sql, params if isinstance(params, tuple) else dict(params)))
                    cursor.execute(sql, params)

                def executemany(self, sql: str, rows: list[Any]) -> None:
                    statements.append((sql, [r if isinstance(r, tuple) else dict(r) for r in rows]))
                    cursor.executemany(sql, rows)

                def close(self) -> None:
                    cursor.close()

            class RecordingConn(_NullConn):
                def commit(self) -> None:
                    statements.append(("COMMIT", None))
                    self._conn.commit()

            writer._cursor = Recording()
            writer.conn = RecordingConn(writer.conn)
            self.loop()
        return pristine, statements


SKIP_LEAN = ("UPDATE hx_episode", "INSERT INTO hx_checkpoint", "INSERT INTO hx_transaction")


def replay_sql(
    pristine: Path, statements: list[tuple[str, Any]], n: int, skip: tuple[str, ...]
) -> float:
    """Seconds per action to send the captured statements with plain sqlite3, no engine."""
    target = pristine.with_name("replay.db")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{target}{suffix}").unlink(missing_ok=True)
    shutil.copyfile(pristine, target)
    conn = sqlite3.connect(str(target), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    cur = conn.cursor()
    todo = [(sql, p) for sql, p in statements if not sql.startswith(skip)] if skip else statements
    t0 = time.perf_counter()
    for sql, params in todo:
        if sql == "COMMIT":
            if conn.in_transaction:
                conn.commit()
        elif isinstance(params, list):
            cur.executemany(sql, params)
        else:
            cur.execute(sql, params)
    if conn.in_transaction:
        conn.commit()
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed / n


# --------------------------------------------------------------------------------------------
# (c) DBOS
# --------------------------------------------------------------------------------------------


def _dbos_engine(url: str) -> Any:
    """An engine like DBOS's own SQLite engine, plus WAL and synchronous=NORMAL."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = "IMMEDIATE"  # what DBOS sets on its connections
        dbapi_conn.execute("PRAGMA busy_timeout=30000")
        dbapi_conn.execute("PRAGMA foreign_keys=ON")
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")

    return engine


def bench_dbos(
    folder: Path, n: int, reps: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, str], str | None]:
    """Per-step seconds for each DBOS configuration, the settings seen, or why it could not run."""
    try:
        import dbos
        from dbos import DBOS
    except Exception as exc:  # not installed, or broken
        return (
            {},
            {},
            (
                f"dbos is not importable ({type(exc).__name__}: {exc}); "
                "install it with: pip install 'transactional-harness[bench]'"
            ),
        )
    version = getattr(dbos, "__version__", None)
    if version is None:
        from importlib.metadata import version as _v

        version = _v("dbos")

    @DBOS.step()
    def noop_step(i: int) -> None:
        return None

    @DBOS.workflow()
    def steps_workflow(count: int) -> float:
        t0 = time.perf_counter()
        for i in range(count):
            noop_step(i)
        return time.perf_counter() - t0

    results: dict[str, list[float]] = {}
    settings: dict[str, str] = {"version": str(version)}
    # DBOS's own settings fsync every commit: fewer steps there, it is only a reference.
    configs = [
        ("wal", folder / "dbos_wal.sqlite", True, n),
        ("default", folder / "dbos_default.sqlite", False, min(n, 200)),
    ]
    for name, path, wal, count in configs:
        url = f"sqlite:///{path.as_posix()}"
        config: dict[str, Any] = {
            "name": f"hx-bench-{name}",
            "system_database_url": url,
            "log_level": "WARNING",
        }
        if wal:
            config["system_database_engine"] = _dbos_engine(url)
        try:
            DBOS(config=config)  # type: ignore[arg-type]
            DBOS.launch()
            check = sqlite3.connect(str(path))
            journal = check.execute("PRAGMA journal_mode").fetchone()[0]
            sync = check.execute("PRAGMA synchronous").fetchone()[0]
            check.close()
            if wal:
                with config["system_database_engine"].connect() as c:
                    sync = c.exec_driver_sql("PRAGMA synchronous").fetchone()[0]
            level = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}.get(sync, sync)
            settings[name] = f"journal_mode={journal}, synchronous={level}"
            if count != n:
                settings[name] += f"; {count} steps"
            steps_workflow(min(count, 100))
            times = []
            for r in range(warmup + reps):
                elapsed = steps_workflow(count)
                if r >= warmup:
                    times.append(elapsed / count)
            results[name] = times
        except Exception as exc:
            return (
                results,
                settings,
                (f"DBOS on SQLite failed ({name}): {type(exc).__name__}: {exc}"),
            )
        finally:
            with contextlib.suppress(Exception):
                DBOS.destroy(destroy_registry=False)
    return results, settings, None


# --------------------------------------------------------------------------------------------
# breakdown: exclusive time per engine piece
# --------------------------------------------------------------------------------------------


class Pieces:
    """Wraps functions to record exclusive time per label; subtracts its own calibrated cost."""

    def __init__(self) -> None:
        self.excl: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.child_calls: dict[str, int] = defaultdict(int)
        self.stack: list[list[float]] = [[0.0, 0.0]]
        self.restore: list[tuple[Any, str, Any]] = []
        self.missing: list[str] = []
        self.c_in = 0.0
        self.c_out = 0.0

    def wrap(self, label: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        stack, excl, calls, child_calls = self.stack, self.excl, self.calls, self.child_calls
        pc = time.perf_counter

        def timed(*args: Any, **kwargs: Any) -> Any:
            frame = [0.0, 0.0]
            stack.append(frame)
            t = pc()
            try:
                return fn(*args, **kwargs)
            finally:
                elapsed = pc() - t
                stack.pop()
                name = label(*args) if callable(label) else label
                excl[name] += elapsed - frame[0]
                calls[name] += 1
                child_calls[name] += int(frame[1])
                parent = stack[-1]
                parent[0] += elapsed
                parent[1] += 1

        timed.__name__ = getattr(fn, "__name__", "timed")
        return timed

    def reset(self) -> None:
        """Forget what was recorded so far (the episode's opening records)."""
        self.excl.clear()
        self.calls.clear()
        self.child_calls.clear()
        self.stack[:] = [[0.0, 0.0]]

    def patch(self, owner: Any, attr: str, label: str | Callable[..., str]) -> None:
        """Time ``owner.attr``; an attribute the engine no longer has is noted and skipped."""
        original = getattr(owner, attr, None)
        if original is None:
            self.missing.append(f"{getattr(owner, '__name__', owner)}.{attr}")
            return
        self.restore.append((owner, attr, original))
        setattr(owner, attr, self.wrap(label, original))

    def swap(self, owner: Any, attr: str, value: Any) -> None:
        """Replace ``owner.attr`` with ``value`` until :meth:`undo`."""
        self.restore.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def undo(self) -> None:
        for owner, attr, original in reversed(self.restore):
            setattr(owner, attr, original)
        self.restore.clear()

    def calibrate(self, rounds: int = 200_000) -> None:
        """The wrapper's cost inside a timed call (c_in) and outside it, in the caller (c_out)."""

        def noop() -> None:
            return None

        probe = Pieces()
        wrapped = probe.wrap("probe", noop)
        best_plain = best_wrapped = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(rounds):
                noop()
            best_plain = min(best_plain, time.perf_counter() - t0)
            t0 = time.perf_counter()
            for _ in range(rounds):
                wrapped()
            best_wrapped = min(best_wrapped, time.perf_counter() - t0)
        self.c_in = probe.excl["probe"] / probe.calls["probe"]
        total = max(best_wrapped - best_plain, 0.0) / rounds
        self.c_out = max(total - self.c_in, 0.0)

    def table(self, elapsed: float, n: int) -> list[tuple[str, float, float]]:
        """(label, calls per action, corrected µs per action), glue last."""
        rows = []
        for label, t in self.excl.items():
            corrected = t - self.calls[label] * self.c_in - self.child_calls[label] * self.c_out
            rows.append((label, self.calls[label] / n, max(corrected, 0.0) / n * 1e6))
        root_time, root_calls = self.stack[0]
        glue = elapsed - root_time - root_calls * self.c_out
        rows.sort(key=lambda r: -r[2])
        rows.append(("engine control flow (the rest: see below)", 0.0, max(glue, 0.0) / n * 1e6))
        return rows


class _TimedConn:
    """A stand-in for the writer's sqlite3 connection that times COMMIT."""

    def __init__(self, conn: Any, pieces: Pieces) -> None:
        self._conn = conn
        self.commit = pieces.wrap("sqlite: COMMIT (WAL append)", conn.commit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _TimedLog:
    """A stand-in for the episode's structlog logger that times each line."""

    def __init__(self, log: Any, pieces: Pieces) -> None:
        self._log = log
        self.info = pieces.wrap("structlog JSON line (ep.log.info)", log.info)
        self.warning = pieces.wrap("structlog JSON line (ep.log.info)", log.warning)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


def _sql_label(_writer: Any, sql: str, *_: Any) -> str:
    if sql.startswith("BEGIN"):
        return "sqlite: BEGIN IMMEDIATE"
    verb = sql.split(" ", 1)[0]
    table = sql.split()[2] if verb == "INSERT" else sql.split()[1]
    return f"sqlite: {verb} {table}"


def breakdown(bench: HarnessBench) -> tuple[list[tuple[str, float, float]], float, Pieces]:
    """One instrumented run: rows, its corrected µs/action, and the instrumentation."""
    p = Pieces()
    p.calibrate()
    act = bench.action
    p.patch(hx.Action, "validate", "validate arguments (pydantic model_validate)")
    p.patch(hx.Action, "key_for", "idempotency key (Action.key_for)")
    p.patch(hx.Action, "scope", "scope (Action.scope + ScopeMatcher)")
    p.patch(hx_transaction, "ScopeMatcher", "scope (Action.scope + ScopeMatcher)")
    p.patch(hx.Action, "call_values", "Action.call_values (args -> dict)")
    for attr in ("get", "snapshot", "mark", "changes", "release"):
        p.patch(DictState, attr, "DictState get/snapshot/mark/changes (deepcopy)")
    p.patch(hx_transaction, "observed_changes", "observe (observed_changes + _observe)")
    p.patch(hx_transaction.Transaction, "_observe", "observe (observed_changes + _observe)")
    p.patch(hx_transaction.Transaction, "__init__", "Transaction + Context objects")
    p.patch(hx.Context, "__init__", "Transaction + Context objects")
    tenacity_label = "tenacity (Retrying + wait/stop objects, iter)"
    p.patch(Retry, "tenacity_wait", tenacity_label)
    engine_tenacity = getattr(hx_transaction, "tenacity", None)
    if engine_tenacity is not None:
        module = engine_tenacity
        proxy = types.SimpleNamespace(
            **{k: getattr(module, k) for k in dir(module) if not k.startswith("__")}
        )
        for attr in ("Retrying", "stop_after_attempt", "retry_if_exception"):
            if hasattr(module, attr):
                setattr(proxy, attr, p.wrap(tenacity_label, getattr(module, attr)))
        p.swap(hx_transaction, "tenacity", proxy)
        p.patch(module.BaseRetrying, "iter", tenacity_label)
    p.patch(hx_records.Recorder, "record_intent", "intent record: building the rows")
    p.patch(hx_records.Recorder, "commit_entry", "commit record: building the rows")
    p.patch(hx_records.Recorder, "update_episode", "writer.update_episode")
    p.patch(EpisodeWriter, "update_episode", "writer.update_episode")
    p.patch(EpisodeWriter, "append", "writer.append/append_text: log record")
    if hasattr(EpisodeWriter, "append_text"):
        p.patch(EpisodeWriter, "append_text", "writer.append/append_text: log record")
    p.patch(EpisodeWriter, "insert_txn", "writer.insert_txn")
    p.patch(EpisodeWriter, "update_txn", "writer.update_txn")
    if hasattr(EpisodeWriter, "flush"):
        p.patch(EpisodeWriter, "flush", "rows + checkpoints built and written at the end (flush)")
    p.patch(EpisodeWriter, "_exec", _sql_label)
    p.patch(hx_writer, "record_hash", "sha256: hash chain (record_hash)")
    if getattr(hx_records, "hashlib", None) is hashlib:
        label = "sha256: args/result/diff/state digests"
        p.swap(hx_records, "hashlib", types.SimpleNamespace(sha256=p.wrap(label, hashlib.sha256)))
    user = "user code: no-op tool + 2 checks"
    tool_fn = act.fn
    act.fn = p.wrap(user, tool_fn)
    pre, post = list(act.preconditions), list(act.postconditions)
    act.preconditions[:] = [(name, p.wrap(user, fn)) for name, fn in pre]
    act.postconditions[:] = [(name, p.wrap(user, fn)) for name, fn in post]
    try:
        with bench.episode() as ep:
            # After the episode opened, so the logger keeps its own JSON encoder.
            for module in (hx_records, hx_writer, hx_store, hx_transaction):
                if hasattr(module, "dumps"):
                    p.patch(module, "dumps", "JSON encoding (_json.dumps)")
            writer = ep._writer
            writer.conn = _TimedConn(writer.conn, p)
            ep.recorder.log = _TimedLog(ep.log, p)
            p.reset()
            t0 = time.perf_counter()
            bench.loop()
        elapsed = time.perf_counter() - t0
        rows = p.table(elapsed, bench.n)
        total_calls = sum(p.calls.values())
    finally:
        p.undo()
        act.fn = tool_fn
        act.preconditions[:] = pre
        act.postconditions[:] = post
    corrected = elapsed - total_calls * (p.c_in + p.c_out)
    return rows, corrected / bench.n * 1e6, p


def _short(filename: str) -> str:
    path = filename.replace("\\", "/")
    for marker in ("site-packages/", "/harness/", "/benchmarks/", "/lib/python"):
        idx = path.rfind(marker)
        if idx >= 0:
            tail = path[idx + len(marker) :]
            if marker == "/harness/":
                return "harness/" + tail
            if marker == "/benchmarks/":
                return "benchmarks/" + tail
            if marker == "/lib/python":
                return "stdlib/" + tail.split("/", 1)[-1]
            return tail
    return path


def profile(bench: HarnessBench, top: int) -> tuple[list[tuple[str, float, float, float]], float]:
    """cProfile of one run: the ``top`` functions by own time, µs/action (inflated by cProfile)."""
    prof = cProfile.Profile()
    with bench.episode():
        prof.enable()
        t0 = time.perf_counter()
        bench.loop()
    elapsed = time.perf_counter() - t0
    prof.disable()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (filename, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        where = "built-in" if filename == "~" else f"{_short(filename)}:{line}"
        rows.append((f"{where} {func}", nc / bench.n, tt / bench.n * 1e6, ct / bench.n * 1e6))
    rows.sort(key=lambda r: -r[2])
    return rows[:top], elapsed / bench.n * 1e6


def micro(folder: Path) -> list[tuple[str, float]]:
    """Standalone costs of candidate pieces, µs per call (best of 3)."""
    out: list[tuple[str, float]] = []

    def best(fn: Callable[[], Any], rounds: int) -> float:
        b = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(rounds):
                fn()
            b = min(b, time.perf_counter() - t0)
        return b / rounds * 1e6

    store = hx.Store(f"sqlite:///{(folder / 'micro.db').as_posix()}", create=True)
    try:
        log = store.jsonl(episode_id="micro", run_id=None)
        out.append(
            (
                "structlog line from the logger Store.jsonl builds (one info call)",
                best(
                    lambda: log.info(
                        "committed",
                        txn_id="e:1",
                        action="touch",
                        step=1,
                        attempts=1,
                        duration=0.0001,
                    ),
                    5000,
                ),
            )
        )
    finally:
        store.close()

    def tenacity_once() -> None:
        retry = Retry()
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(retry.attempts),
            wait=retry.tenacity_wait(),
            retry=tenacity.retry_if_exception(lambda e: False),
            sleep=lambda s: None,
            reraise=True,
        )
        for attempt in retrying:
            with attempt:
                pass

    out.append(
        ("tenacity.Retrying built and run for one successful attempt", best(tenacity_once, 5000))
    )
    act = _build_action()
    out.append(
        (
            "pydantic validation of (key, n) (Action.validate)",
            best(lambda: act.validate(("7", 7), {}), 20000),
        )
    )
    conn = sqlite3.connect(str(folder / "micro_raw.db"), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    counter = iter(range(10**9))

    def explicit() -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (v) VALUES (?)", (str(next(counter)),))
        conn.execute("COMMIT")

    def autocommit() -> None:
        conn.execute("INSERT INTO t (v) VALUES (?)", (str(next(counter)),))

    out.append(("one INSERT, autocommit (WAL, NORMAL)", best(autocommit, 3000)))
    out.append(("one INSERT in BEGIN IMMEDIATE ... COMMIT (WAL, NORMAL)", best(explicit, 3000)))

    def four() -> None:
        conn.execute("BEGIN IMMEDIATE")
        for _ in range(4):
            conn.execute("INSERT INTO t (v) VALUES (?)", (str(next(counter)),))
        conn.execute("COMMIT")

    out.append(("four INSERTs in one BEGIN IMMEDIATE ... COMMIT", best(four, 3000)))
    conn.close()
    return out


# --------------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------------


def _med(values: list[float]) -> float:
    return statistics.median(values) * 1e6


def _fmt(values: list[float]) -> str:
    us = [v * 1e6 for v in values]
    return f"{statistics.median(us):9.1f} {min(us):9.1f} {max(us):9.1f}"


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def _attempt(what: str, fn: Callable[[], Any], notes: list[str]) -> Any:
    """Run an optional measurement; if the engine changed under it, note why and go on."""
    try:
        return fn()
    except Exception as exc:
        notes.append(f"{what}: not measured ({type(exc).__name__}: {exc})")
        return None


def _run_mode(bench: HarnessBench, mode: str, notes: list[str]) -> float | None:
    if mode == "full":
        return bench.run(mode)
    return _attempt(f"harness ({mode})", lambda: bench.run(mode), notes)  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--n", type=int, default=1000, help="calls per repetition (1000)")
    parser.add_argument("--reps", type=int, default=5, help="measured repetitions (5)")
    parser.add_argument("--warmup", type=int, default=1, help="warm-up repetitions (1)")
    parser.add_argument("--no-dbos", action="store_true", help="skip (c)")
    parser.add_argument(
        "--signed", action="store_true", help="(b) signs each episode's head as it ends"
    )
    parser.add_argument("--no-breakdown", action="store_true", help="skip the breakdown")
    parser.add_argument("--top", type=int, default=25, help="cProfile rows to show (25)")
    args = parser.parse_args(argv)
    n, reps, warmup = max(args.n, 1), max(args.reps, 1), max(args.warmup, 0)
    notes: list[str] = []
    modes = ("full",) if args.no_breakdown else ("full", "no-log", "python")

    with tempfile.TemporaryDirectory(prefix="hx-bench-") as tmp:
        folder = Path(tmp)
        raw = RawFloor(folder / "raw.db")
        bench = HarnessBench(folder, n, signed=args.signed)
        raw_t: list[float] = []
        hx_t: dict[str, list[float]] = {m: [] for m in modes}
        for r in range(warmup + reps):  # interleaved, so drift hits every variant alike
            a = raw.run(n)
            b = {m: _run_mode(bench, m, notes) for m in modes}
            if r >= warmup:
                raw_t.append(a)
                for m, v in b.items():
                    if v is not None:
                        hx_t[m].append(v)
        raw.close()

        replay: dict[str, list[float]] = {}
        rows = prof_rows = micro_rows = None
        if not args.no_breakdown:
            captured = _attempt("SQL capture", bench.capture_sql, notes)
            if captured is not None:
                pristine, statements = captured
                replay = {"as is": [], "lean": []}
                for r in range(warmup + reps):
                    for name, skip in (("as is", ()), ("lean", SKIP_LEAN)):
                        v = replay_sql(pristine, statements, n, skip)
                        if r >= warmup:
                            replay[name].append(v)
                per_action: dict[str, float] = defaultdict(float)
                for sql, _ in statements:
                    per_action[
                        " ".join(sql.split()[:3])
                        if not sql.startswith("BEGIN")
                        else "BEGIN IMMEDIATE"
                    ] += 1 / n
            found = _attempt("instrumented breakdown", lambda: breakdown(bench), notes)
            if found is not None:
                rows, instrumented, pieces = found
            prof = _attempt("cProfile", lambda: profile(bench, args.top), notes)
            if prof is not None:
                prof_rows, prof_total = prof
            micro_rows = _attempt("standalone costs", lambda: micro(folder), notes)
        bench.store.close()

        dbos_t: dict[str, list[float]] = {}
        dbos_settings: dict[str, str] = {}
        dbos_missing: str | None = "skipped (--no-dbos)"
        if not args.no_dbos:
            dbos_t, dbos_settings, dbos_missing = bench_dbos(folder, n, reps, warmup)

    print(
        f"transaction overhead: N={n} calls per repetition, {reps} repetitions after "
        f"{warmup} warm-up; median, min and max of the repetitions"
    )
    print(
        f"Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        f"harness {hx.__version__}, {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} CPUs"
    )
    if hasattr(os, "getloadavg"):
        load = os.getloadavg()[0]
        busy = os.cpu_count() or 1
        print(
            f"load average (1 min) at the end: {load:.2f}"
            + (
                f": other processes competed for the {busy} CPUs, so absolute figures are "
                "inflated and noisy; the interleaved ratios less so"
                if load > 0.75 * busy
                else ""
            )
        )
    print()
    w = 84
    print(f"{'':{w}} {'median':>9} {'min':>9} {'max':>9}  (µs)")
    print(
        f"{'(a) raw floor: 2 sqlite3 INSERTs, each committed (WAL, NORMAL), per pair':{w}} "
        f"{_fmt(raw_t)}"
    )
    print(
        f"{'(b) harness: durable transaction (intent + commit, pre + post), per action':{w}} "
        f"{_fmt(hx_t['full'])}"
    )
    if "wal" in dbos_t:
        label = (
            f"(c) DBOS {dbos_settings.get('version')} step in a workflow, SQLite "
            f"({dbos_settings.get('wal')})"
        )
        print(f"{label:{w}} {_fmt(dbos_t['wal'])}")
    if "default" in dbos_t:
        label = f"(c') DBOS step, SQLite as DBOS sets it up ({dbos_settings.get('default')})"
        print(f"{label:{w}} {_fmt(dbos_t['default'])}")
    if dbos_missing:
        print(f"(c) DBOS step: NOT MEASURED: {dbos_missing}")

    h = statistics.median(hx_t["full"])
    floor = statistics.median(raw_t)
    print()
    print("ratios (medians of this run)")
    ratio_raw = h / floor
    need = f"  (needs <= {floor * TARGET_VS_RAW * 1e6:.0f} µs)"
    need = "" if ratio_raw <= TARGET_VS_RAW else need
    print(
        f"  harness / raw floor   = {ratio_raw:6.2f}x   target <= {TARGET_VS_RAW:g}x    "
        f"{_verdict(ratio_raw <= TARGET_VS_RAW)}{need}"
    )
    if "wal" in dbos_t:
        d = statistics.median(dbos_t["wal"])
        ratio_dbos = h / d
        need = (
            ""
            if ratio_dbos <= TARGET_VS_DBOS
            else f"  (needs <= {d * TARGET_VS_DBOS * 1e6:.0f} µs)"
        )
        print(
            f"  harness / DBOS step   = {ratio_dbos:6.3f}    target <= {TARGET_VS_DBOS:g}    "
            f"{_verdict(ratio_dbos <= TARGET_VS_DBOS)}{need}  [DBOS on the same WAL/NORMAL]"
        )
        if "default" in dbos_t:
            dd = statistics.median(dbos_t["default"])
            print(
                f"  harness / DBOS step   = {h / dd:6.3f}    for reference: DBOS on its own "
                f"SQLite settings ({dbos_settings.get('default')})"
            )
    else:
        print(
            f"  harness / DBOS step   =    n/a    target <= {TARGET_VS_DBOS:g}    "
            f"not measured: {dbos_missing}"
        )

    if args.no_breakdown:
        return 0
    print()
    print("where the harness's time goes")
    print("  by ablation, uninstrumented (same repetitions as (b); medians, µs per action):")
    full = _med(hx_t["full"])
    no_log = _med(hx_t["no-log"]) if hx_t.get("no-log") else None
    python = _med(hx_t["python"]) if hx_t.get("python") else None
    print(f"    {'full transaction (b)':74} {full:8.1f}")
    if no_log is not None:
        least = (min(hx_t["full"]) - min(hx_t["no-log"])) * 1e6
        print(
            f"    {'without the structlog JSON line':74} {no_log:8.1f}"
            f"   -> the line costs {full - no_log:.1f} ({least:.1f} between the minimums)"
        )
        print(
            "      (a WAL checkpoint or a full garbage collection costs tens of ms and lands on "
            "whichever repetition\n      is running: with few repetitions the difference of "
            "medians can charge one to a variant; the minimums less so)"
        )
    if python is not None and no_log is not None:
        print(
            f"    {'without the line and with SQLite stubbed out (the Python engine alone)':74} "
            f"{python:8.1f}   -> SQLite in the engine costs {no_log - python:.1f}"
        )
    if replay:
        as_is, lean = _med(replay["as is"]), _med(replay["lean"])
        stmts = ", ".join(f"{k} x{v:g}" for k, v in sorted(per_action.items()))
        print(
            f"    {'the same SQL replayed with plain sqlite3, no engine':74} {as_is:8.1f}"
            f"   = {as_is / (floor * 1e6):.1f}x the raw floor"
        )
        print(f"      per action: {stmts}")
        print(
            f"    {'  the replay without the rows written at the end':74} "
            f"{lean:8.1f}   -> they cost {as_is - lean:.1f}"
        )
        if python is not None and no_log is not None and no_log - python > as_is:
            print(
                f"    (SQLite: {no_log - python:.0f} µs inside the engine, {as_is:.0f} replayed "
                "alone: the engine's work between statements slows SQLite down too)"
            )
    if rows is not None:
        print()
        print(
            f"  by piece, one instrumented run of N={n}: exclusive µs per action, the "
            f"instrumentation's cost ({(pieces.c_in + pieces.c_out) * 1e6:.2f} µs per timed "
            f"call) subtracted; sum {instrumented:.0f} µs against {full:.0f} uninstrumented"
        )
        total = sum(r[2] for r in rows)
        print(f"    {'piece':68} {'calls':>6} {'µs':>8} {'share':>6}")
        db = 0.0
        for label, calls, us in rows:
            if label.startswith("sqlite:"):
                db += us
            calls_s = f"{calls:6.1f}" if calls else " " * 6
            print(f"    {label:68} {calls_s} {us:8.1f} {us / total:6.1%}")
        print(
            f"    SQLite itself (BEGIN, statements, COMMIT): {db:.1f} µs ({db / total:.0%}); "
            f"the rest, Python: {total - db:.1f} µs ({(total - db) / total:.0%})"
        )
        print(
            "    'engine control flow' is what no piece covers: drive() and the generators "
            "(Transaction.run/_attempts/_attempt, run_check,\n    Episode._call_steps), "
            "the batch() context managers, Action.__call__/current_episode, clock reads, "
            "tenacity's AttemptManager."
        )
        if pieces.missing:
            print(f"    (not found in the engine, so not timed: {', '.join(pieces.missing)})")
    if micro_rows is not None:
        print()
        print("  standalone costs of single pieces (µs per call, best of 3)")
        for label, us in micro_rows:
            print(f"    {label:84} {us:8.2f}")
    if prof_rows is not None:
        print()
        print(
            f"  cProfile of one run ({prof_total:.0f} µs per action with the profiler on); "
            "top functions by own time, per action"
        )
        print(f"    {'function':86} {'calls':>6} {'own µs':>8} {'cum µs':>8}")
        for where, calls, tt, ct in prof_rows:
            print(f"    {where[:86]:86} {calls:6.1f} {tt:8.1f} {ct:8.1f}")
    for note in notes:
        print(f"note: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

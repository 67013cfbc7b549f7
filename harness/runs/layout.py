"""A run folder's layout, and opening one for reading.

A run lives in ``<logs>/<run id>/``: ``harness.db`` (the store: run row, episodes, transactions,
trials, the hash-chained log), ``evidence.json`` (what the run must keep to be reproduced and
believed) and ``summary.json`` (pass^k and pass@k when trials finished). Each trial is one
episode, ``<run id>-<task id>-<trial>``.

A run whose store is elsewhere (``harness run --store postgresql://...``, shared by machines)
has ``store.json`` in its folder instead of ``harness.db``: the store's URL without its
password (which comes from the environment, ``PGPASSWORD``, or a ``~/.pgpass`` or service
file), followed by every command given the folder. The store's URL names the run as well:
``postgresql://host/db#<run id>`` (the fragment may be left out when the store holds one run).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from .._json import loads_or
from ..errors import ConfigurationError, RunNotFound, StoreError
from ..store import SCHEMA_VERSION, RunRow, Store, TrialRow
from ..store.store import sqlite_file
from .output import json_text, write_output

__all__ = [
    "DB_FILE",
    "EVIDENCE_FILE",
    "STORE_FILE",
    "SUMMARY_FILE",
    "OpenRun",
    "OpenStore",
    "attempt_id",
    "attempt_of",
    "check_database",
    "check_recorded_password",
    "current_trials",
    "earlier_attempts",
    "episode_id",
    "new_run_id",
    "open_run",
    "open_store",
    "public_url",
    "recorded_store",
    "run_row",
    "run_target",
    "split_target",
    "store_url",
    "write_json",
    "write_store_pointer",
]

DB_FILE = "harness.db"
EVIDENCE_FILE = "evidence.json"
SUMMARY_FILE = "summary.json"
STORE_FILE = "store.json"
_STORE_FORMAT = "harness.store"
# Query parameters of a database URL that carry a secret (libpq's names).
_SECRET_PARAMS = frozenset({"password", "sslpassword", "passfile"})


def new_run_id() -> str:
    """A run id: when it started, and six random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def episode_id(run_id: str, task_id: str, trial: int) -> str:
    """The id of one trial of a run: its first attempt's episode (and trial row), and the
    name of its lease."""
    return f"{run_id}-{task_id}-{trial}"


def attempt_id(trial_id: str, attempt: int) -> str:
    """The episode of a trial's ``attempt`` (0: the first, named as the trial is; a trial runs
    again when an attempt ended in an infrastructure error)."""
    return trial_id if attempt == 0 else f"{trial_id}~{attempt}"


def current_trials(rows: Iterable[TrialRow]) -> list[TrialRow]:
    """Each trial's row of its last attempt (rows in the order given, the earlier attempts of
    a trial that ran again left out)."""
    rows = list(rows)
    last: dict[tuple[str, str, int], TrialRow] = {}
    for row in rows:
        key = (row.run_id, row.task_id, row.trial)
        if key not in last or _attempt(row) >= _attempt(last[key]):
            last[key] = row
    kept = {id(r) for r in last.values()}
    return [r for r in rows if id(r) in kept]


def earlier_attempts(rows: Iterable[TrialRow]) -> list[TrialRow]:
    """The rows of attempts that a later attempt of the same trial replaced."""
    rows = list(rows)
    kept = {id(r) for r in current_trials(rows)}
    return [r for r in rows if id(r) not in kept]


def attempt_of(episode: str) -> int:
    """Which attempt of its trial an episode is (:func:`attempt_id`; 0: the first)."""
    _, sep, n = episode.rpartition("~")
    return int(n) if sep and n.isdigit() else 0


def _attempt(row: TrialRow) -> int:
    return attempt_of(row.episode_id)


def store_url(folder: Path) -> str:
    """The URL of a run folder's store: the one its ``store.json`` records, else its own
    ``harness.db``.

    Raises:
        StoreError: ``store.json`` is there but damaged.
    """
    return recorded_store(folder) or f"sqlite:///{folder / DB_FILE}"


def public_url(url: str) -> str:
    """``url`` as a run folder may record it: without its password (in the URL or its query).

    Raises:
        ConfigurationError: ``url`` is not a database URL.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        raise ConfigurationError(
            f"store URL {url!r} is not a database URL ({exc}): give postgresql://user@host/db "
            "or sqlite:///path/harness.db"
        ) from exc
    secret = [k for k in parsed.query if k.lower() in _SECRET_PARAMS]
    # (URL.set takes None as "unchanged": the password is dropped by replacing the field.)
    kept = parsed.difference_update_query(secret)._replace(password=None)
    return kept.render_as_string(hide_password=False)


def write_store_pointer(folder: Path, url: str, run_id: str) -> None:
    """Record in ``folder`` that the run ``run_id``'s store is at ``url`` (no password)."""
    write_json(
        folder, STORE_FILE, {"format": _STORE_FORMAT, "url": public_url(url), "run_id": run_id}
    )


def recorded_store(folder: Path) -> str | None:
    """The store URL ``folder/store.json`` records (None when there is none).

    Raises:
        StoreError: the file is not one ``harness run --store`` wrote (nothing is opened).
    """
    path = folder / STORE_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{path} does not read as JSON ({exc}); nothing was opened") from exc
    url = data.get("url") if isinstance(data, dict) else None
    if not isinstance(url, str) or data.get("format") != _STORE_FORMAT or "://" not in url:
        raise StoreError(
            f"{path} is not a store record `harness run --store` wrote (it needs "
            f'{{"format": "{_STORE_FORMAT}", "url": "postgresql://..."}}); nothing was opened'
        )
    return url


def split_target(text: str) -> tuple[str, str | None]:
    """A store URL that may name a run (``postgresql://host/db#<run id>``): the URL, the run."""
    url, sep, run = text.partition("#")
    return url, (run or None) if sep else None


def run_target(url: str, run_id: str) -> str:
    """How to name the run ``run_id`` of the store at ``url`` on a command line (its password
    left out)."""
    return f"{public_url(url)}#{run_id}"


def write_json(folder: Path, name: str, data: Any) -> None:
    """Write ``folder/name`` as indented JSON, atomically (values JSON cannot hold as text,
    NaN and infinities as ``null``).

    Raises:
        HarnessError: the file cannot be written (nothing is, then).
    """
    write_output(folder / name, json_text(data, indent=2))


def run_row(
    run_id: str,
    *,
    suite: str,
    status: str,
    config: str,
    evidence: str,
    created_at: float | None = None,
) -> RunRow:
    """The run's row (its status changes as the run goes; the rest is written once)."""
    return RunRow(
        id=run_id,
        created_at=time.time() if created_at is None else created_at,
        suite=suite,
        status=status,
        config=config,
        evidence=evidence,
    )


def _shorter_than_its_header(db: Path) -> str:
    """Why the file is cut short, judging by its SQLite header ("" when it is not)."""
    with db.open("rb") as f:
        header = f.read(100)
    size = db.stat().st_size
    if not header.startswith(b"SQLite format 3\x00") or len(header) < 100:
        return ""  # not SQLite at all: opening it says so
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    valid = header[24:28] == header[92:96]  # the in-header size is current
    if valid and size < pages * page_size:
        return f"truncated: {size} bytes of the {pages * page_size} its header records"
    return ""


def _beside(db: Path, suffix: str) -> Path | None:
    """The write-ahead log (``-wal``) or rollback journal (``-journal``) beside ``db``, when
    it holds anything."""
    path = Path(f"{db}{suffix}")
    try:
        return path if path.stat().st_size > 0 else None
    except OSError:
        return None


def _damaged(db: Path, what: str) -> StoreError:
    return StoreError(
        f"{db} is {what}; nothing was written. Restore it from a copy, or save what is "
        f"readable with `sqlite3 {db} .recover`"
    )


def check_database(db: Path) -> None:
    """Refuse, without writing to it, a database that is damaged or from a newer harness.

    SQLite judges it (``PRAGMA quick_check``) as it would open it, with what it recovers from
    beside it: a file shorter than its header records is what a checkpoint or commit cut
    short (by a full disk, a crash) leaves, and is damaged only when no write-ahead log or
    rollback journal beside it holds the rest. A rollback journal is replayed in a copy (a
    read-only open cannot replay it); the file itself is left as it is.

    Raises:
        StoreError: naming the file, what is wrong and what to do.
    """
    short = _shorter_than_its_header(db)
    journal = _beside(db, "-journal")
    if journal is not None:
        _check_replayed(db, journal, short)
        return
    if short and _beside(db, "-wal") is None:
        raise _damaged(db, f"damaged ({short})")
    # Without a write-ahead log to read, open it immutable: not even a -shm file is created.
    mode = "mode=ro" if Path(f"{db}-wal").exists() else "mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?{mode}", uri=True)
    except sqlite3.Error as exc:
        raise StoreError(f"{db} does not open ({exc}); check its permissions") from exc
    _judge(conn, db, short and f"{short}, and its write-ahead log does not hold the rest")


def _check_replayed(db: Path, journal: Path, short: str) -> None:
    """Judge ``db`` as SQLite leaves it once it has replayed its rollback journal (an
    unfinished write, undone when the store is next opened for writing): in a copy."""
    with tempfile.TemporaryDirectory(prefix="hx-check-") as tmp:
        copy = Path(tmp) / db.name
        try:
            shutil.copyfile(db, copy)
            shutil.copyfile(journal, f"{copy}-journal")
        except OSError as exc:
            raise StoreError(
                f"{db} holds an unfinished write in {journal.name}, undone the next time the "
                f"store is opened for writing; checking it first needs a copy, which could not "
                f"be made in {tmp} ({exc}); nothing was written. Free space there, then try again"
            ) from exc
        try:
            conn = sqlite3.connect(copy)  # (read-write: SQLite replays the journal on open)
        except sqlite3.Error as exc:
            raise _damaged(db, f"damaged or not a database ({exc})") from exc
        _judge(conn, db, short and f"{short}, and its rollback journal does not hold the rest")


def _judge(conn: sqlite3.Connection, db: Path, short: str) -> None:
    """Refuse the database open on ``conn`` if SQLite finds it damaged, or it is from a newer
    harness (``short``: why its size alone looked wrong, said with the damage); closes it."""
    cut = f"; {short}" if short else ""
    try:
        problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise _damaged(db, f"damaged ({'; '.join(problems[:3])}{cut})")
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "hx_meta" in tables:
            row = conn.execute("SELECT value FROM hx_meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                raise StoreError(
                    f"{db} has schema version {version}, newer than this harness understands "
                    f"({SCHEMA_VERSION}); nothing was written. Upgrade harness to read it"
                )
    except sqlite3.DatabaseError as exc:
        raise _damaged(db, f"damaged or not a database ({exc}{cut})") from exc
    finally:
        conn.close()


@dataclass
class OpenRun:
    """A run opened for reading: its store, run row, configuration, evidence, trials.

    Attributes:
        folder: the run's folder on this machine (None when the run was named by its store's
            URL: nothing is written beside it then).
        db: the folder's own store file (None when the store is elsewhere).
        url: the store's URL (its password included when the caller gave one).
        target: how to name the run again (the folder, or ``<store URL>#<run id>``).
    """

    folder: Path | None
    db: Path | None
    store: Store
    run: RunRow
    config: dict[str, Any]
    evidence: dict[str, Any]
    trials: list[TrialRow] = field(default_factory=list)
    url: str = ""
    target: str = ""

    @property
    def where(self) -> str:
        """The run as messages name it: its folder, or its store's URL and id."""
        return self.target or str(self.folder)

    def close(self) -> None:
        """Release the store's connections."""
        self.store.close()


def _runs_hint(folder: Path) -> str:
    parent = folder.parent if str(folder.parent) not in ("", ".") else Path(".")
    try:
        runs = sorted(
            p.name
            for p in parent.iterdir()
            if (p / "harness.db").is_file() or (p / STORE_FILE).is_file()
        )
    except OSError:
        runs = []
    if not runs:
        return ""
    shown = ", ".join(runs[-5:])
    return f" (run folders in {parent}: {shown})"


def _not_found(folder: Path, message: str) -> RunNotFound:
    return RunNotFound(folder, message + _runs_hint(folder))


def _open_url(url: str, *, readonly: bool, recorded_in: Path | None = None) -> Store:
    """The store at ``url`` (a SQLite file checked first); a store a run folder records that
    does not open says where the password comes from."""
    try:
        file = sqlite_file(url)
    except (ArgumentError, ValueError):
        file = None  # (Store(url) says what is wrong with it)
    if file is not None:
        if not file.is_file():
            raise RunNotFound(file, f"no database file {file}: check the URL's path")
        check_database(file)
    elif recorded_in is not None:
        check_recorded_password(url, recorded_in)
    try:
        return Store(url, readonly=readonly)
    except StoreError as exc:
        if recorded_in is None or file is not None:
            raise
        raise StoreError(
            f"{exc}. The run folder {recorded_in} records its store at {public_url(url)} without "
            "a password: give it in ~/.pgpass or in a service file (PGSERVICEFILE), or name the "
            f"store yourself in place of the folder ('{run_target(url, recorded_in.name)}', "
            "which may take PGPASSWORD)"
        ) from exc


def check_recorded_password(url: str, folder: Path) -> None:
    """Refuse to open a Postgres store a run folder names while ``PGPASSWORD`` is set.

    libpq sends ``PGPASSWORD`` to whatever server the URL names, and the URL came from the
    folder (its ``store.json``), not from you: a folder someone hands you could name their own
    host and collect the password. A password in ``~/.pgpass`` or a service file is bound to
    the host it names and is never refused; a URL you give yourself (``URL#<run id>`` in place
    of the folder) is yours to send the password to.

    Raises:
        ConfigurationError: ``PGPASSWORD`` is set and ``url`` is a Postgres URL.
    """
    if not os.environ.get("PGPASSWORD"):
        return
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return  # (opening it says what is wrong with it)
    if not parsed.drivername.startswith("postgres"):
        return
    named = run_target(url, folder.name)
    raise ConfigurationError(
        f"the run folder {folder} names its store on host {parsed.host or 'the default'} "
        f"({url}), and PGPASSWORD in your environment would be sent there: a folder decides "
        "no server your password goes to. Name the store yourself in place of the folder "
        f"(e.g. `harness report '{named}'`), or keep the password in ~/.pgpass or a service "
        "file, which libpq sends only to the host they name"
    )


def _choose_run(store: Store, where: str, run_id: str | None, url: str) -> RunRow:
    runs = {r.id: r for r in store.runs()}
    if run_id is not None:
        if run_id not in runs:
            known = ", ".join(sorted(runs)[-5:]) or "none"
            raise RunNotFound(where, f"{where}: the store holds no run {run_id!r} (runs: {known})")
        return runs[run_id]
    if not runs:
        raise RunNotFound(where, f"{where} holds no run record: was it written by `harness run`?")
    if len(runs) == 1:
        (run,) = runs.values()
        return run
    latest = sorted(runs.values(), key=lambda r: r.created_at)[-3:]
    raise RunNotFound(
        where,
        f"{where} holds {len(runs)} runs: name one as {public_url(url)}#<run id> (the latest: "
        + ", ".join(r.id for r in reversed(latest))
        + ")",
    )


@contextmanager
def open_run(
    path: str | Path, *, finished: bool = False, writable: bool = False
) -> Iterator[OpenRun]:
    """Open the run in ``path``: a run folder (``logs/<run>``, or its ``harness.db``), or a
    store URL naming the run (``postgresql://host/db#<run id>``; the fragment may be left out
    when the store holds one run). A folder whose ``store.json`` records a store elsewhere
    opens that store. Nothing is created.

    The store is opened read-only (``Store(db, readonly=True)``): reading a run never creates
    or changes a file, not even a -wal or -shm file where there was none.

    Args:
        finished: refuse a run without a finished trial (what reports need).
        writable: open the store for writing (``harness resume``, which continues the run).

    Raises:
        RunNotFound: the folder does not exist, has no ``harness.db`` or ``store.json``, or
            holds no run (or, with ``finished``, no finished trial); the URL's store holds
            no such run, or several and the URL names none.
        StoreError: the database is damaged, empty, not a harness store, or from another
            harness version, or does not open (nothing is written).
    """
    text = str(path)
    folder: Path | None = None
    db: Path | None = None
    if "://" in text:
        url, run_id = split_target(text)
        store = _open_url(url, readonly=not writable)
        where = text
    else:
        folder = Path(text)
        if folder.suffix == ".db" and folder.is_file():
            folder = folder.parent
        if not folder.exists():
            raise _not_found(
                folder,
                f"no run folder {folder}: give the folder `harness run` printed (logs/<run>)",
            )
        if not folder.is_dir():
            raise _not_found(folder, f"{folder} is a file, not a run folder: give logs/<run>")
        recorded = None if (folder / DB_FILE).is_file() else recorded_store(folder)
        where = str(folder)
        if recorded is not None:
            url = recorded
            store = _open_url(url, readonly=not writable, recorded_in=folder)
            run_id = folder.name
        else:
            db = folder / DB_FILE
            if not db.is_file():
                raise RunNotFound(
                    folder,
                    f"{folder} has no {DB_FILE} or {STORE_FILE}, so it is not a run folder: give "
                    f"the folder `harness run` printed (logs/<run>){_runs_hint(folder / 'x')}",
                )
            check_database(db)
            url = f"sqlite:///{db}"
            store = Store(db, readonly=not writable)
            run_id = None
    try:
        if folder is not None and db is not None:
            runs = {r.id: r for r in store.runs()}
            if not runs:
                raise RunNotFound(
                    folder, f"{db} holds no run record: was it written by `harness run`?"
                )
            if folder.name in runs:
                run = runs[folder.name]
            elif len(runs) == 1:
                (run,) = runs.values()
            else:
                raise RunNotFound(
                    folder,
                    f"{db} holds {len(runs)} runs ({', '.join(sorted(runs))}) and none is named "
                    f"after the folder {folder.name!r}: give each run its own folder",
                )
        else:
            run = _choose_run(store, where, run_id, url)
        trials = current_trials(store.trial_rows(run.id))
        target = str(folder) if folder is not None else run_target(url, run.id)
        if finished and not trials:
            raise RunNotFound(
                folder or where,
                f"run {run.id} in {target} has no finished trials yet (status {run.status}): "
                "let it finish, or `harness resume` it",
            )
        evidence = loads_or(run.evidence, {}) or {}
        if not evidence and folder is not None and (folder / EVIDENCE_FILE).is_file():
            evidence = loads_or((folder / EVIDENCE_FILE).read_text(encoding="utf-8"), {}) or {}
        opened = OpenRun(
            folder,
            db,
            store,
            run,
            loads_or(run.config, {}) or {},
            evidence,
            trials,
            url=url,
            target=target,
        )
    except BaseException:
        store.close()
        raise
    try:
        yield opened
    finally:
        opened.close()


@dataclass
class OpenStore:
    """A store opened for reading: a run folder's, a store file, or a database's.

    Attributes:
        where: the target as the user named it (for messages and the commands they give next).
        url: the store's URL (to reopen it for writing, e.g. to record a decision).
        store: the store, read-only.
        run: the run, when the target is a run folder; None for a whole store.
    """

    where: str
    url: str
    store: Store
    run: RunRow | None = None

    @property
    def run_id(self) -> str | None:
        """The run's id, or None for a whole store."""
        return None if self.run is None else self.run.id


@contextmanager
def open_store(target: str | Path) -> Iterator[OpenStore]:
    """Open, read-only, a run folder (``logs/<run>``, its store wherever ``store.json`` says),
    a store file (``logs/harness.db``, as ``hx.Episode(store=...)`` writes it) or a database
    URL (``sqlite:///...``, ``postgresql://...``; ``...#<run id>`` names one run of it).
    Nothing is created or written.

    A store file inside a run folder, named after a run it holds, is that run; any other
    store file or URL is the whole store (every run and every episode in it).

    Raises:
        RunNotFound: a path that does not exist, or a folder with no ``harness.db``; a URL
            naming a run its store does not hold.
        StoreError: the database is damaged, empty, not a harness store, or from another
            harness version, or the URL does not open (nothing is written).
    """
    text = str(target)
    if "://" not in text:
        path = Path(text)
        if path.is_dir() or not path.exists():
            with open_run(path) as opened:
                yield OpenStore(text, opened.url, opened.store, opened.run)
            return
        check_database(path)
        url, run_id = f"sqlite:///{path}", None
        store = Store(url, readonly=True)
    else:
        url, run_id = split_target(text)
        store = _open_url(url, readonly=True)
    try:
        run = None
        if run_id is not None:
            run = _choose_run(store, text, run_id, url)
        elif "://" not in text:
            run = next((r for r in store.runs() if r.id == Path(text).parent.name), None)
        yield OpenStore(text, url, store, run)
    finally:
        store.close()

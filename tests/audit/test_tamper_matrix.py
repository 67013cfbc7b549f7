"""The tamper matrix: every way someone with write access could edit a signed store, and
what ``Store.verify`` finds, with the public key and without it.

One signed store holds a run (three tasks x two trials, signed by ``run_trials``) and an
episode of the user's own code that escalated, was resolved with edited arguments by a person
and resumed (signed by ``hx.Episode``). Each case edits a copy of it as an attacker would, then
verifies the whole store. With the key every case is found, and the first finding names the
table and the record that is bad. Without the key the case is found, naming the same record,
or (for an edit that recomputes what the chain covers) not at all: ``docs/tamper-matrix.md``
lists which, and a test keeps that page true.
"""

# ruff: noqa: E501  (the SQL an attacker runs is clearer on one line)

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

import harness as hx
from harness.store import verify as verify_module
from harness.store.tables import log_key
from harness.testing import FakeClock

from ..conftest import Shop
from ..episode.test_episode import escalating_run
from ..store.test_signing import rechain
from ..toy_env import write_suite

KEY = hx.SigningKey.generate()
E = "r1-t0-0"  # log: 1 start, 2 recorded, 3 intent :1, 4 committed :1, 5 intent :2,
#                6 committed :2, 7 end, 8 verdict
OWN = "own"  # escalated at own:2, resolved (edited), resumed; committed own:1 and own:3
DOCS = Path(__file__).parents[2] / "docs" / "tamper-matrix.md"


@pytest.fixture(scope="module")
def signed_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tamper")
    result = hx.run_trials(
        write_suite(root / "suite", [2, 1, 3]),
        agent="scripted",
        trials=2,
        logs=root / "logs",
        run_id="r1",
        signing_key=KEY,
    )
    db = result.folder / "harness.db"
    url = f"sqlite:///{db}"
    shop = Shop()
    _, agent = escalating_run(shop, url, FakeClock(), counts={})
    with pytest.raises(hx.Escalated):
        with hx.Episode(state=shop.state, store=url, episode_id=OWN, signing_key=KEY) as ep:
            agent(ep)
    store = hx.Store(db)
    (pending,) = store.escalations("pending")
    store.resolve(pending.id, "edit", by="ana", reason="checked", edit={"order_id": "o2"})
    store.close()
    with hx.Episode(
        state=shop.state, store=url, episode_id=OWN, resume=True, signing_key=KEY
    ) as ep:
        agent(ep)
    assert ep.outcome == "committed"
    return db


@pytest.fixture
def db(signed_store: Path, tmp_path: Path) -> Path:
    folder = Path(shutil.copytree(signed_store.parent, tmp_path / "r1"))
    return folder / "harness.db"


# ---------------------------------------------------------------------------------------------
# The attacker's tools.
# ---------------------------------------------------------------------------------------------


def sql(*statements: str) -> Callable[[Path], None]:
    def edit(db: Path) -> None:
        with sqlite3.connect(db) as conn:
            for statement in statements:
                conn.execute(statement)
        conn.close()

    return edit


def rechained(*edits: Callable[[Path], None]) -> Callable[[Path], None]:
    """The edits, then every record hash and episode head recomputed (no key needed)."""

    def edit(db: Path) -> None:
        for each in edits:
            each(db)
        rechain(db.parent)

    return edit


def payload(episode: str, seq: int, change: Callable[[dict[str, object]], None]) -> Callable:
    """Edit one log record's JSON payload."""

    def edit(db: Path) -> None:
        with sqlite3.connect(db) as conn:
            (text,) = conn.execute(
                "SELECT payload FROM hx_log WHERE episode_id = ? AND seq = ?", (episode, seq)
            ).fetchone()
            data = json.loads(text)
            change(data)
            conn.execute(
                "UPDATE hx_log SET payload = ? WHERE episode_id = ? AND seq = ?",
                (json.dumps(data, separators=(",", ":"), sort_keys=True), episode, seq),
            )
        conn.close()

    return edit


def copy_episode(source: str, new: str) -> Callable[[Path], None]:
    """Add an episode: every row of ``source`` copied under a new id (chain recomputed)."""

    def edit(db: Path) -> None:
        with sqlite3.connect(db) as conn:
            conn.row_factory = sqlite3.Row
            for table, column in (
                ("hx_episode", "id"),
                ("hx_log", "episode_id"),
                ("hx_transaction", "episode_id"),
                ("hx_checkpoint", "episode_id"),
                ("hx_trial", "episode_id"),
            ):
                rows = conn.execute(f"SELECT * FROM {table} WHERE {column} = ?", (source,))
                for row in rows.fetchall():
                    values = dict(row)
                    for name, value in values.items():
                        if isinstance(value, str) and source in value:
                            values[name] = value.replace(source, new)
                    if table == "hx_episode":
                        (top,) = conn.execute("SELECT max(num) FROM hx_episode").fetchone()
                        values["num"] = num = top + 1
                    if table == "hx_log":
                        values["id"] = log_key(num, values["seq"])
                    names = ", ".join(values)
                    marks = ", ".join("?" for _ in values)
                    conn.execute(
                        f"INSERT INTO {table} ({names}) VALUES ({marks})", list(values.values())
                    )
        conn.close()

    return rechained(edit)


def delete_episode(episode: str, *, keep_signature: bool = False) -> Callable[[Path], None]:
    """Remove every row of the episode (and its signature, unless told to keep it)."""
    tables = [
        ("hx_log", "episode_id"),
        ("hx_transaction", "episode_id"),
        ("hx_checkpoint", "episode_id"),
        ("hx_trial", "episode_id"),
        ("hx_episode", "id"),
    ]
    if not keep_signature:
        tables.append(("hx_signature", "subject"))
    return sql(*(f"DELETE FROM {table} WHERE {column} = '{episode}'" for table, column in tables))


# ---------------------------------------------------------------------------------------------
# The matrix.
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    name: str
    edit: Callable[[Path], None]
    table: str  # the table of the first finding
    record: str  # words its record holds
    episode: str  # the episode (or run) it names
    keyless: bool  # found without the key too


def _flip(key: str) -> Callable[[dict[str, object]], None]:
    def change(data: dict[str, object]) -> None:
        data[key] = not data[key]

    return change


def _set(key: str, value: object) -> Callable[[dict[str, object]], None]:
    def change(data: dict[str, object]) -> None:
        data[key] = value

    return change


T = f"{E}:2"
SIG = "hx_signature"
CASES = [
    # The log (the hash chain).
    Case(
        "log record payload edited",
        sql(f"UPDATE hx_log SET payload = payload || ' ' WHERE episode_id = '{E}' AND seq = 4"),
        "hx_log",
        "record 4",
        E,
        True,
    ),
    Case(
        "log record kind edited",
        sql(f"UPDATE hx_log SET kind = 'resume' WHERE episode_id = '{E}' AND seq = 2"),
        "hx_log",
        "record 2",
        E,
        True,
    ),
    Case(
        "log record time edited",
        sql(f"UPDATE hx_log SET ts = ts + 1 WHERE episode_id = '{E}' AND seq = 3"),
        "hx_log",
        "record 3",
        E,
        True,
    ),
    Case(
        "log record deleted",
        sql(f"DELETE FROM hx_log WHERE episode_id = '{E}' AND seq = 5"),
        "hx_log",
        "record 5",
        E,
        True,
    ),
    Case(
        "log record inserted",
        sql(
            f"INSERT INTO hx_log (id, episode_id, seq, kind, payload, ts, hash) SELECT id + 1, episode_id, 9, 'note', '{{}}', 0, 'x' FROM hx_log WHERE episode_id = '{E}' AND seq = 8"
        ),
        "hx_log",
        "record 9",
        E,
        True,
    ),
    Case(
        "log records swapped",
        sql(
            f"UPDATE hx_log SET seq = -1 WHERE episode_id = '{E}' AND seq = 3",
            f"UPDATE hx_log SET seq = 3 WHERE episode_id = '{E}' AND seq = 4",
            f"UPDATE hx_log SET seq = 4 WHERE episode_id = '{E}' AND seq = -1",
        ),
        "hx_log",
        "record 3",
        E,
        True,
    ),
    Case(
        "log tail cut off",
        sql(f"DELETE FROM hx_log WHERE episode_id = '{E}' AND seq >= 7"),
        "hx_log",
        "record 7",
        E,
        True,
    ),
    Case(
        "log tail cut off, head recomputed",
        rechained(sql(f"DELETE FROM hx_log WHERE episode_id = '{E}' AND seq >= 7")),
        "hx_trial",
        E,
        E,
        True,
    ),
    Case(
        "commit record edited, head recomputed",
        rechained(payload(E, 4, _set("digest", "0" * 64))),
        "hx_transaction",
        f"{E}:1",
        E,
        True,
    ),
    Case(
        "commit record given a field, head recomputed",
        rechained(payload(E, 4, _set("note", 1))),
        SIG,
        "episode",
        E,
        False,
    ),
    Case(
        "full rewrite: verdict flipped in record and row",
        rechained(
            payload(E, 8, _flip("passed")),
            sql(f"UPDATE hx_trial SET passed = NOT passed WHERE episode_id = '{E}'"),
        ),
        SIG,
        "episode",
        E,
        False,
    ),
    Case(
        "full rewrite: outcome changed in end record and row",
        rechained(
            payload(E, 7, _set("outcome", "failed")),
            sql(f"UPDATE hx_episode SET status = 'failed' WHERE id = '{E}'"),
        ),
        SIG,
        "episode",
        E,
        False,
    ),
    # Transaction rows.
    Case(
        "transaction result edited",
        sql(f"UPDATE hx_transaction SET result = '7' WHERE id = '{T}'"),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction diff edited",
        sql(f"UPDATE hx_transaction SET diff = '{{}}' WHERE id = '{T}'"),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction arguments edited",
        sql(f'UPDATE hx_transaction SET args = \'{{"name":"z","step":1}}\' WHERE id = \'{T}\''),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction idempotency key edited",
        sql(f"UPDATE hx_transaction SET idem_key = 'forged' WHERE id = '{T}'"),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction status edited",
        sql(f"UPDATE hx_transaction SET status = 'compensated' WHERE id = '{T}'"),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction timing edited",
        sql(f"UPDATE hx_transaction SET duration = 99 WHERE id = '{T}'"),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction action renamed",
        sql(f"UPDATE hx_transaction SET action = 'look' WHERE id = '{T}'"),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction attempts edited",
        sql(f"UPDATE hx_transaction SET attempts = 3 WHERE id = '{T}'"),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction deleted",
        sql(f"DELETE FROM hx_transaction WHERE id = '{T}'"),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction added",
        sql(
            f"INSERT INTO hx_transaction (episode_id, seq, id, action, idem_key, args, status, mutating, attempts, errors, started_at) VALUES ('{E}', 50, '{E}:50', 'bump', 'k', '{{}}', 'committed', 1, 1, '[]', 0)"
        ),
        "hx_transaction",
        f"{E}:50",
        E,
        True,
    ),
    Case(
        "transactions reordered",
        sql(
            f"UPDATE hx_transaction SET seq = 99 WHERE id = '{E}:1'",
            f"UPDATE hx_transaction SET seq = 1 WHERE id = '{T}'",
            f"UPDATE hx_transaction SET seq = 2 WHERE id = '{E}:1'",
        ),
        "hx_transaction",
        T,
        E,
        True,
    ),
    Case(
        "transaction moved to another episode",
        sql(f"UPDATE hx_transaction SET episode_id = 'r1-t1-0' WHERE id = '{T}'"),
        "hx_transaction",
        T,
        E,
        True,
    ),
    # Checkpoints.
    Case(
        "checkpoint digest edited",
        sql(f"UPDATE hx_checkpoint SET digest = 'ab' WHERE episode_id = '{E}' AND step = 1"),
        "hx_checkpoint",
        "step 1",
        E,
        True,
    ),
    Case(
        "checkpoint deleted",
        sql(f"DELETE FROM hx_checkpoint WHERE episode_id = '{E}' AND step = 2"),
        "hx_checkpoint",
        "step 2",
        E,
        True,
    ),
    Case(
        "checkpoint added",
        sql(
            f"INSERT INTO hx_checkpoint (episode_id, step, txn_id, digest, created_at) VALUES ('{E}', 3, '{E}:9', 'ab', 0)"
        ),
        "hx_checkpoint",
        "step 3",
        E,
        True,
    ),
    Case(
        "checkpoints swapped",
        sql(
            f"UPDATE hx_checkpoint SET step = 9 WHERE episode_id = '{E}' AND step = 1",
            f"UPDATE hx_checkpoint SET step = 1 WHERE episode_id = '{E}' AND step = 2",
            f"UPDATE hx_checkpoint SET step = 2 WHERE episode_id = '{E}' AND step = 9",
        ),
        "hx_checkpoint",
        "step 1",
        E,
        True,
    ),
    # Episode rows.
    Case(
        "episode outcome edited",
        sql(f"UPDATE hx_episode SET status = 'failed' WHERE id = '{E}'"),
        "hx_episode",
        E,
        E,
        True,
    ),
    Case(
        "episode steps edited",
        sql(f"UPDATE hx_episode SET steps = 1 WHERE id = '{E}'"),
        "hx_episode",
        E,
        E,
        True,
    ),
    Case(
        "episode digest edited",
        sql(f"UPDATE hx_episode SET digest = '{'0' * 64}' WHERE id = '{E}'"),
        "hx_episode",
        E,
        E,
        True,
    ),
    Case(
        "episode task edited",
        sql(f"UPDATE hx_episode SET task_id = 't9' WHERE id = '{E}'"),
        "hx_episode",
        E,
        E,
        True,
    ),
    Case(
        "episode trial edited",
        sql(f"UPDATE hx_episode SET trial = 7 WHERE id = '{E}'"),
        "hx_episode",
        E,
        E,
        True,
    ),
    Case(
        "episode moved to another run",
        sql(f"UPDATE hx_episode SET run_id = 'r2' WHERE id = '{E}'"),
        "hx_episode",
        E,
        E,
        True,
    ),
    Case(
        "episode head edited",
        sql(f"UPDATE hx_episode SET head_hash = '{'1' * 64}' WHERE id = '{E}'"),
        "hx_log",
        "record 8",
        E,
        True,
    ),
    Case(
        "episode record count edited",
        sql(f"UPDATE hx_episode SET log_count = 3 WHERE id = '{E}'"),
        "hx_log",
        "record 3",
        E,
        True,
    ),
    Case(
        "episode row deleted, its records left",
        sql(f"DELETE FROM hx_episode WHERE id = '{E}'"),
        "hx_episode",
        E,
        E,
        True,
    ),
    Case("whole episode deleted", delete_episode(E), SIG, "run", "r1", False),
    Case(
        "whole episode deleted, its signature kept",
        delete_episode(E, keep_signature=True),
        SIG,
        "episode",
        E,
        False,
    ),
    Case(
        "episode added (a copy, chain recomputed)",
        copy_episode(E, "r1-t0-9"),
        SIG,
        "episode",
        "r1-t0-9",
        False,
    ),
    # Trials (the verdicts reports count).
    Case(
        "verdict flipped",
        sql(f"UPDATE hx_trial SET passed = NOT passed WHERE episode_id = '{E}'"),
        "hx_trial",
        E,
        E,
        True,
    ),
    Case(
        "partial score edited",
        sql(f"UPDATE hx_trial SET partial = 0.5 WHERE episode_id = '{E}'"),
        "hx_trial",
        E,
        E,
        True,
    ),
    Case(
        "failed call's leftover diff edited",
        sql("UPDATE hx_transaction SET diff = '{\"orders/o2\":[1,2]}' WHERE id = 'own:2'"),
        "hx_transaction",
        "own:2",
        OWN,
        True,
    ),
    Case(
        "failed call's arguments edited",
        sql(
            'UPDATE hx_transaction SET args = \'{"order_id":"o9","reason":"asked"}\' WHERE id = \'own:2\''
        ),
        "hx_transaction",
        "own:2",
        OWN,
        True,
    ),
    Case(
        "episode policy edited",
        sql(
            f"UPDATE hx_episode SET policy = json_set(policy, '$.decisions.scope', 'continue') WHERE id = '{E}'"
        ),
        "hx_episode",
        E,
        E,
        True,
    ),
    Case(
        "episode meta edited",
        sql(f"UPDATE hx_episode SET meta = json_set(meta, '$.seed', 1) WHERE id = '{E}'"),
        "hx_episode",
        E,
        E,
        True,
    ),
    Case(
        "verifier output edited",
        sql(f"UPDATE hx_trial SET verdict = '{{}}' WHERE episode_id = '{E}'"),
        "hx_trial",
        E,
        E,
        True,
    ),
    Case(
        "infrastructure error forged",
        sql(f"UPDATE hx_trial SET infra_error = 1 WHERE episode_id = '{E}'"),
        "hx_trial",
        E,
        E,
        True,
    ),
    Case(
        "trial deleted",
        sql(f"DELETE FROM hx_trial WHERE episode_id = '{E}'"),
        "hx_trial",
        E,
        E,
        True,
    ),
    Case(
        "trial added",
        sql(
            f"INSERT INTO hx_trial SELECT id || 'x', run_id, task_id, task_version, trial, seed, '{OWN}', passed, partial, outcome, infra_error, failures, steps, message, verdict, agent_meta, duration, created_at FROM hx_trial WHERE episode_id = '{E}'"
        ),
        "hx_trial",
        OWN,
        OWN,
        True,
    ),
    # The run.
    Case(
        "run configuration edited",
        sql("UPDATE hx_run SET config = json_set(config, '$.trials', 9)"),
        "hx_run",
        "r1",
        E,
        True,
    ),
    Case(
        "run's agent server edited",
        sql(
            "UPDATE hx_run SET config = json_set(config, '$.agent_options.base_url', 'http://evil.example')"
        ),
        "hx_run",
        "r1",
        E,
        True,
    ),
    Case(
        "run evidence edited",
        sql("UPDATE hx_run SET evidence = json_set(evidence, '$.edited', 1)"),
        "hx_run",
        "r1",
        E,
        True,
    ),
    Case(
        "run's resumes edited",
        sql("UPDATE hx_run SET evidence = json_set(evidence, '$.resumes', json('[{\"at\": 1}]'))"),
        SIG,
        "run",
        "r1",
        False,
    ),
    Case("run row deleted", sql("DELETE FROM hx_run"), "hx_run", "r1", E, True),
    # Escalations (a person's decision).
    Case(
        "escalation decider edited",
        sql("UPDATE hx_escalation SET resolved_by = 'mallory'"),
        "hx_escalation",
        "",
        OWN,
        True,
    ),
    Case(
        "escalation arguments edited",
        sql('UPDATE hx_escalation SET edit = \'{"order_id":"o3"}\''),
        "hx_escalation",
        "",
        OWN,
        True,
    ),
    Case(
        "escalation decision edited",
        sql("UPDATE hx_escalation SET status = 'rejected'"),
        "hx_escalation",
        "",
        OWN,
        True,
    ),
    Case(
        "escalation's waiting arguments edited",
        sql('UPDATE hx_escalation SET args = \'{"order_id":"o9","reason":"asked"}\''),
        "hx_escalation",
        "",
        OWN,
        True,
    ),
    Case(
        "escalation evidence edited",
        sql("UPDATE hx_escalation SET evidence = json_set(evidence, '$.attempts', 9)"),
        "hx_escalation",
        "",
        OWN,
        True,
    ),
    Case(
        "escalation deadline edited",
        sql("UPDATE hx_escalation SET deadline = 1"),
        "hx_escalation",
        "",
        OWN,
        True,
    ),
    Case(
        "escalation fallback edited",
        sql("UPDATE hx_escalation SET fallback = 'approve'"),
        "hx_escalation",
        "",
        OWN,
        True,
    ),
    Case("escalation deleted", sql("DELETE FROM hx_escalation"), "hx_escalation", "", OWN, True),
    Case(
        "escalation added",
        sql(
            f"INSERT INTO hx_escalation SELECT 'forged', episode_id, txn_id, action, idem_key, args, failure_class, reason, evidence, 'pending', created_at, deadline, fallback, NULL, NULL, NULL, NULL FROM hx_escalation WHERE episode_id = '{OWN}'"
        ),
        "hx_escalation",
        "forged",
        OWN,
        True,
    ),
    # Signatures.
    Case(
        "signed head edited",
        sql(
            f"UPDATE hx_signature SET message = replace(message, '\"steps\":2', '\"steps\":3') WHERE subject = '{E}'"
        ),
        SIG,
        "episode",
        E,
        False,
    ),
    Case(
        "signature deleted",
        sql(f"DELETE FROM hx_signature WHERE subject = '{E}'"),
        SIG,
        "episode",
        E,
        False,
    ),
    Case(
        "signatures swapped between episodes",
        sql(
            f"UPDATE hx_signature SET subject = 'x' WHERE subject = '{E}'",
            f"UPDATE hx_signature SET subject = '{E}', id = 'episode:{E}-' WHERE subject = 'r1-t0-1'",
            "UPDATE hx_signature SET subject = 'r1-t0-1', id = 'episode:r1-t0-1-' WHERE subject = 'x'",
        ),
        SIG,
        "episode",
        E,
        False,
    ),
    Case(
        "signature key id edited",
        sql(f"UPDATE hx_signature SET key_id = 'someone' WHERE subject = '{E}'"),
        SIG,
        "episode",
        E,
        False,
    ),
]


def _report(db: Path, key: hx.PublicKey | None) -> hx.store.VerifyReport:
    """Store.verify's report, the same whether it reads episode by episode or all at once."""
    store = hx.Store(db, readonly=True)
    try:
        one_by_one = store.verify(public_key=key)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(verify_module, "_ONE_BY_ONE", 0)
            at_once = store.verify(public_key=key)
    finally:
        store.close()
    assert at_once == one_by_one
    return one_by_one


def test_the_matrix_is_large_and_the_untouched_store_verifies(signed_store: Path) -> None:
    assert len(CASES) >= 40 and len({c.name for c in CASES}) == len(CASES)
    assert _report(signed_store, KEY.public).ok
    assert _report(signed_store, None).ok


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_every_edit_is_found_with_the_key_naming_the_first_bad_record(db: Path, case: Case) -> None:
    case.edit(db)
    with_key = _report(db, KEY.public)
    assert not with_key.ok, case.name
    first = with_key.findings[0]
    assert (first.table, first.episode_id) == (case.table, case.episode), with_key.findings
    assert case.record in first.record, with_key.findings
    without = _report(db, None)
    if case.keyless:
        assert without.findings and without.findings[0] == first, without.findings
    else:
        assert without.ok, without.findings


CORRUPTIONS = {
    "file truncated": lambda data: data[: len(data) // 2],
    "file emptied": lambda data: b"",
    "page overwritten": lambda data: data[:4096] + b"\xff" * 4096 + data[8192:],
    "header overwritten": lambda data: b"\x00" * 100 + data[100:],
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_a_corrupt_file_is_refused_on_open_and_left_as_it_is(db: Path, name: str) -> None:
    for extra in db.parent.glob("harness.db-*"):
        extra.unlink()
    db.write_bytes(CORRUPTIONS[name](db.read_bytes()))
    before = db.read_bytes()
    with pytest.raises(hx.StoreError) as info:
        _report(db, KEY.public)
    assert "nothing was written" in str(info.value) or str(db) in str(info.value)
    assert db.read_bytes() == before


def test_the_docs_page_says_what_is_found_without_a_key() -> None:
    """docs/tamper-matrix.md lists every case, and its "without the key" column is true."""
    rows = {}
    for line in DOCS.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] and not set(cells[0]) <= {"-", " "}:
            rows[cells[0]] = cells
    for case in CASES:
        assert case.name in rows, f"docs/tamper-matrix.md has no row for {case.name!r}"
        _, _, keyless, keyed = rows[case.name]
        assert keyless == ("found" if case.keyless else "not found"), case.name
        assert keyed == "found", case.name
    assert re.search(rf"\b{len(CASES)} edits\b", DOCS.read_text(encoding="utf-8"))

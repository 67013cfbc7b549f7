"""Auditing any store: the file hx.Episode writes, a database URL, not only a run folder.

A user whose own agent code writes ``logs/harness.db`` through ``hx.Episode`` audits it the
same way a run folder is audited: ``harness audit``, ``harness verify`` and ``harness
escalations`` take the store file or its URL, and ``Store.verify()`` returns the full check.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.testing import FakeClock

from ..conftest import Shop
from ..episode.test_episode import escalating_run
from ..test_transaction import cancel_action

KEY = hx.SigningKey.generate()


def _own_code_store(folder: Path, *, signed: bool = False) -> Path:
    """What a user's own agent code leaves behind: two episodes in logs/harness.db, one
    committed, one waiting for a person."""
    db = folder / "logs" / "harness.db"
    url = f"sqlite:///{db}"
    key = KEY if signed else None
    shop = Shop()
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=url, episode_id="mine-1", signing_key=key):
        cancel("o1")
    counts: dict[str, int] = {}
    _, agent = escalating_run(Shop(), url, FakeClock(), counts=counts)
    with pytest.raises(hx.Escalated):
        with hx.Episode(state=Shop().state, store=url, episode_id="mine-2", signing_key=key) as ep:
            agent(ep)
    return db


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_store_written_by_own_code_is_audited_by_path_and_by_url(tmp_path: Path) -> None:
    db = _own_code_store(tmp_path)
    before = sorted(p.name for p in db.parent.iterdir())
    digest = _file_digest(db)
    for target in (str(db), f"sqlite:///{db}"):
        code, out = _cli("verify", target)
        assert code == 0, out
        assert "verified: 2 episode(s)" in out and "agree" in out
        code, out = _cli("audit", target, "--json")
        assert code == 0, out
        assert [e["episode_id"] for e in json.loads(out)["episodes"]] == ["mine-1", "mine-2"]
        code, out = _cli("escalations", target, "--json")
        assert code == 0, out
        assert [e["episode_id"] for e in json.loads(out)] == ["mine-2"]
    # Reading wrote nothing: the same files, the same bytes.
    assert sorted(p.name for p in db.parent.iterdir()) == before
    assert _file_digest(db) == digest


def test_store_verify_checks_transaction_rows_not_only_the_log(tmp_path: Path) -> None:
    """An edited idempotency key was invisible to verify_chain; Store.verify names it."""
    db = _own_code_store(tmp_path)
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE hx_transaction SET idem_key = 'forged' WHERE id = 'mine-1:1'")
    store = hx.Store(db, readonly=True)
    try:
        assert store.verify_chain().ok  # the log alone is intact
        report = store.verify()
    finally:
        store.close()
    assert not report.ok
    (finding,) = report.findings
    assert (finding.episode_id, finding.table, finding.record) == (
        "mine-1",
        "hx_transaction",
        "mine-1:1",
    )
    assert "idem_key" in finding.reason
    code, out = _cli("verify", str(db))
    assert code == 1
    assert "mine-1:1" in out and "idem_key" in out


def test_store_verify_one_episode_or_run_and_unknown_names(tmp_path: Path) -> None:
    db = _own_code_store(tmp_path)
    store = hx.Store(db, readonly=True)
    try:
        report = store.verify(episode="mine-2")
        assert report.ok and report.episodes == 1 and report.escalations == 1
        with pytest.raises(hx.StoreError, match="no episode 'nope'"):
            store.verify(episode="nope")
        with pytest.raises(hx.StoreError, match="no run 'nope'"):
            store.verify("nope")
    finally:
        store.close()


def test_signed_store_a_deleted_episode_is_found_with_the_key_only(tmp_path: Path) -> None:
    db = _own_code_store(tmp_path, signed=True)
    pub = tmp_path / "k.pub"
    pub.write_bytes(KEY.public.pem())
    code, out = _cli("verify", str(db), "--public-key", str(pub))
    assert code == 0, out
    with sqlite3.connect(db) as conn:
        for table, column in (
            ("hx_log", "episode_id"),
            ("hx_transaction", "episode_id"),
            ("hx_checkpoint", "episode_id"),
            ("hx_episode", "id"),
        ):
            conn.execute(f"DELETE FROM {table} WHERE {column} = 'mine-1'")
    code, out = _cli("verify", str(db))
    assert code == 0, out  # without the key the rest of the store is consistent
    code, out = _cli("verify", str(db), "--public-key", str(pub), "--json")
    assert code == 1
    (finding,) = json.loads(out)["findings"]
    assert finding["episode_id"] == "mine-1" and "deleted" in finding["reason"]
    store = hx.Store(db, readonly=True)
    try:
        assert not store.verify(public_key=pub).ok
    finally:
        store.close()


def test_an_escalation_in_own_store_is_resolved_from_the_cli(tmp_path: Path) -> None:
    db = _own_code_store(tmp_path)
    store = hx.Store(db, readonly=True)
    try:
        (pending,) = store.escalations(status="pending")
    finally:
        store.close()
    code, out = _cli(
        "escalations", str(db), "resolve", pending.id, "--approve", "--by", "ana", "--reason", "ok"
    )
    assert code == 0, out
    assert "resume=True" in out  # own code resumes the episode itself, not `harness resume`
    code, out = _cli("escalations", str(db))
    assert code == 0 and "no escalations waiting" in out
    code, out = _cli("verify", str(db))
    assert code == 0, out


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda p: p.write_bytes(b""), "empty"),
        (lambda p: p.write_text("not a database at all, just text" * 10), "not"),
        (lambda p: sqlite3.connect(p).execute("CREATE TABLE t(x)").connection.commit(), "no"),
    ],
    ids=["zero bytes", "text file", "another sqlite database"],
)
def test_a_file_that_is_not_a_store_is_refused_untouched(
    tmp_path: Path, make: object, expected: str
) -> None:
    db = tmp_path / "harness.db"
    make(db)  # type: ignore[operator]
    digest = _file_digest(db)
    for command in ("verify", "audit", "escalations"):
        code, out = _cli(command, str(db))
        assert code != 0
        assert expected in out and "Traceback" not in out
    assert _file_digest(db) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == ["harness.db"]


def test_a_missing_store_is_refused_and_not_created(tmp_path: Path) -> None:
    for target in (str(tmp_path / "nope.db"), f"sqlite:///{tmp_path / 'nope.db'}"):
        code, out = _cli("verify", target)
        assert code != 0 and "nope.db" in out and "Traceback" not in out
    code, out = _cli("verify", "nosuchdriver://x/y")
    assert code != 0 and "Traceback" not in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("signed", [True, False], ids=["with the key", "without the key"])
def test_a_decision_moves_the_signed_head_and_resolve_signs_it_again(
    tmp_path: Path, signed: bool
) -> None:
    """Recording a decision appends to the episode's log; resolved with the signing key, the
    new head is signed, so the audit with the public key still holds; without it, the audit
    names the episode whose head moved."""
    db = _own_code_store(tmp_path, signed=True)
    key_file = tmp_path / "signing.key"
    KEY.save(key_file)
    store = hx.Store(db, readonly=True)
    try:
        (pending,) = store.escalations(status="pending")
    finally:
        store.close()
    args = ["escalations", str(db), "resolve", pending.id, "--reject", "--by", "ana"]
    code, out = _cli(*args, *(["--signing-key", str(key_file)] if signed else []))
    assert code == 0, out
    code, out = _cli("verify", str(db), "--public-key", f"{key_file}.pub", "--json")
    if signed:
        assert code == 0, out
    else:
        assert code == 1
        (finding,) = json.loads(out)["findings"]
        assert finding["episode_id"] == "mine-2" and "differs" in finding["reason"]


@pytest.mark.parametrize("signed", [True, False])
def test_a_decision_made_from_python_with_the_key_keeps_the_episode_verifiable(
    tmp_path: Path, signed: bool
) -> None:
    """`Store.resolve(..., signing_key=KEY)` signs the head the decision moved, so the audit
    with the public key still holds; without the key it names the episode."""
    db = _own_code_store(tmp_path, signed=True)
    pub = tmp_path / "signing.pub"
    pub.write_bytes(KEY.public.pem())
    store = hx.Store(db)
    try:
        (pending,) = store.escalations(status="pending")
        store.resolve(pending.id, "reject", by="ana", signing_key=KEY if signed else None)
        report = store.verify(public_key=pub)
    finally:
        store.close()
    assert report.ok is signed, report.findings

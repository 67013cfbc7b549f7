"""The witness: a file outside the database that finds a signed run the database lost.

Each case makes a small signed run through the CLI with ``--witness``, then edits its database as
someone with write access could (deleting the run with its signatures, rewriting a chain with
recomputed hashes, rolling a chain back) or edits the witness, and checks that
``harness verify --witness`` names what was lost, and that plain verification does not.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.store import GENESIS, record_hash
from harness.store.signing import sign_episode
from harness.store.witness import read_witness, store_identity
from harness.testing import FakeClock

from ..conftest import Shop
from ..episode.test_episode import escalating_run
from ..toy_env import write_suite


def cli(*args: str | Path) -> Any:
    """Run one harness command in this process."""
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A signing key (``harness keygen``); its public key is beside it, ``.pub``."""
    path = tmp_path_factory.mktemp("key") / "h.key"
    assert cli("keygen", path).exit_code == 0
    return path


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two tasks of one and two writes."""
    return Path(write_suite(tmp_path_factory.mktemp("suite") / "suite", [1, 2]))


def signed_run(suite: Path, key: Path, witness: Path, logs: Path) -> Path:
    """`harness run --signing-key KEY --witness FILE`: the run folder."""
    ran = cli(
        "run", suite, "--agent", "scripted", "--trials", "1", "--logs", logs,
        "--signing-key", key, "--witness", witness,
    )  # fmt: skip
    assert ran.exit_code == 0, ran.output
    (folder,) = logs.iterdir()
    return folder


@pytest.fixture
def run(suite: Path, key: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A witnessed signed run of its own: (run folder, witness file)."""
    witness = tmp_path / "witness.jsonl"
    return signed_run(suite, key, witness, tmp_path / "logs"), witness


def sql(folder: Path, *statements: str) -> None:
    """Edit the run's database as someone with write access would."""
    with sqlite3.connect(folder / "harness.db") as conn:
        for statement in statements:
            conn.execute(statement)


def rechain(folder: Path) -> None:
    """Recompute every record hash and every episode's head, as a forger without the key can."""
    with sqlite3.connect(folder / "harness.db") as conn:
        for (episode_id,) in conn.execute("SELECT id FROM hx_episode").fetchall():
            rows = conn.execute(
                "SELECT id, seq, kind, txn_id, payload, ts FROM hx_log WHERE episode_id = ? "
                "ORDER BY id",
                (episode_id,),
            ).fetchall()
            prev = GENESIS
            for row_key, seq, kind, txn_id, payload, ts in rows:
                prev = record_hash(prev, episode_id, seq, kind, txn_id, payload, ts)
                conn.execute("UPDATE hx_log SET hash = ? WHERE id = ?", (prev, row_key))
            conn.execute(
                "UPDATE hx_episode SET head_hash = ?, log_count = ? WHERE id = ?",
                (prev, len(rows), episode_id),
            )


def delete_run(folder: Path, run_id: str) -> None:
    """Delete every row of run ``run_id`` from every hx_* table, its signatures included."""
    with sqlite3.connect(folder / "harness.db") as conn:
        tables = [
            t
            for (t,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'hx_%'"
            )
        ]
        for table in tables:
            columns = {c[1] for c in conn.execute(f"PRAGMA table_info({table})")}
            if table == "hx_run":
                conn.execute("DELETE FROM hx_run WHERE id = ?", (run_id,))
            elif table == "hx_signature":
                conn.execute("DELETE FROM hx_signature WHERE subject LIKE ?", (f"{run_id}%",))
            elif "run_id" in columns:
                conn.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
            if "episode_id" in columns:
                conn.execute(f"DELETE FROM {table} WHERE episode_id LIKE ?", (f"{run_id}%",))


def episodes(folder: Path) -> dict[str, tuple[int, str]]:
    """Every episode's (record count, head hash), as the store has them."""
    with sqlite3.connect(folder / "harness.db") as conn:
        rows = conn.execute("SELECT id, log_count, head_hash FROM hx_episode").fetchall()
    return {eid: (count, head) for eid, count, head in rows}


def verify(target: Path, witness: Path, key: Path | None = None, *more: str) -> Any:
    """`harness verify TARGET --witness FILE [--public-key KEY.pub]`."""
    extra = [] if key is None else ["--public-key", f"{key}.pub"]
    return cli("verify", target, "--witness", witness, *extra, *more)


def test_a_witnessed_run_verifies_with_its_witness(suite: Path, key: Path, tmp_path: Path):
    """An intact run verifies against a witness, which holds one line per signature, mode
    0600, naming every episode's head; a second run's line in the same file is not checked
    against the first run's store."""
    witness = tmp_path / "witness.jsonl"
    first = signed_run(suite, key, witness, tmp_path / "a")
    second = signed_run(suite, key, witness, tmp_path / "b")
    assert stat.S_IMODE(witness.stat().st_mode) == 0o600
    lines, bad = read_witness(witness, hx.PublicKey.load(f"{key}.pub"))
    runs = [line for line in lines if line.scope == "run"]
    assert bad == [] and [line.subject for line in runs] == [first.name, second.name]
    # Each episode the workers signed has lines of its own too (its end, then its verdict).
    signed = {line.subject for line in lines if line.scope == "episode"}
    assert signed == set(episodes(first)) | set(episodes(second))
    assert dict(runs[0].heads) == episodes(first)
    assert runs[0].store == store_identity(f"sqlite:///{first / 'harness.db'}")
    said = verify(first, witness, key)
    assert said.exit_code == 0, said.output
    assert "5 of its 10 line(s) are about this run" in said.output
    assert "signatures checked with key" in said.output
    data = json.loads(verify(first / "harness.db", witness, key, "--json").output)
    assert data["ok"] and data["witness"]["checked"] == 5
    assert data["witness"]["other_stores"] == [runs[1].store]


def test_a_deleted_run_is_named_by_the_witness(run: tuple[Path, Path], key: Path):
    """A run deleted from its store with every row and signature passes plain verification of
    the store; with the witness, the run folder and the store file each name it deleted."""
    folder, witness = run
    episodes_before = episodes(folder)
    delete_run(folder, folder.name)
    plain = cli("verify", folder / "harness.db", "--public-key", f"{key}.pub")
    assert plain.exit_code == 0, plain.output  # (the hole the witness closes)
    for target in (folder, folder / "harness.db"):
        said = verify(target, witness, key)
        assert said.exit_code == 1, said.output
        assert f"run {folder.name}: signed and witnessed at" in said.output, said.output
        assert "missing from the store: deleted (and 2 of its 2 witnessed episodes)" in said.output
    data = json.loads(verify(folder, witness, key, "--json").output)
    named = [f["episode_id"] for f in data["findings"]]
    assert not data["ok"] and set(named) == {folder.name, *episodes_before}, named


def test_a_rewritten_chain_is_named_by_the_witness(run: tuple[Path, Path], key: Path):
    """An episode's record edited with every hash recomputed and every signature removed (so no
    signature is left to break) is named rewritten, and the run's signature removed."""
    folder, witness = run
    episode = sorted(episodes(folder))[-1]
    sql(
        folder,
        "UPDATE hx_log SET payload = replace(payload, '\"amount\":1', '\"amount\":5') "
        f"WHERE episode_id = '{episode}' AND kind = 'intent'",
        "DELETE FROM hx_signature",
    )
    rechain(folder)
    (witnessed,) = [line for line in read_witness(witness)[0] if line.scope == "run"]
    assert episodes(folder)[episode] != dict(witnessed.heads)[episode]
    said = verify(folder, witness)
    assert said.exit_code == 1, said.output
    assert f"episode {episode}: its chain no longer holds the witnessed head: rewritten" in (
        said.output
    ), said.output
    assert f"run {folder.name}: signed and witnessed at" in said.output
    assert "its signature is missing from the store: removed" in said.output


def test_a_chain_rolled_back_is_named_by_the_witness(run: tuple[Path, Path]):
    """An episode's chain cut back to an earlier head (its signatures removed) no longer holds
    the witnessed count: named rolled back."""
    folder, witness = run
    episode, (count, _) = max(episodes(folder).items(), key=lambda item: item[1][0])
    with sqlite3.connect(folder / "harness.db") as conn:
        (head,) = conn.execute(
            "SELECT hash FROM hx_log WHERE episode_id = ? AND seq = ?", (episode, count - 1)
        ).fetchone()
        conn.execute("DELETE FROM hx_log WHERE episode_id = ? AND seq = ?", (episode, count))
        conn.execute(
            "UPDATE hx_episode SET log_count = ?, head_hash = ? WHERE id = ?",
            (count - 1, head, episode),
        )
        conn.execute("DELETE FROM hx_signature")
    said = verify(folder, witness)
    assert said.exit_code == 1, said.output
    assert (
        f"episode {episode}: its chain holds {count - 1} record(s), the witness saw {count}"
        in said.output
    ), said.output
    assert "rolled back" in said.output


def test_an_edited_witness_line_is_named_by_its_number(run: tuple[Path, Path], key: Path):
    """A witness line edited (a head changed) fails its signature under the public key and is
    named by its line number, not believed; a line that is not one is named too."""
    folder, witness = run
    line = json.loads(witness.read_text().splitlines()[-1])  # (the run's line)
    first = sorted(line["heads"])[0]
    line["heads"][first][1] = "0" * 64
    witness.write_text(json.dumps(line) + "\n" + "not a line\n")
    said = verify(folder, witness, key)
    assert said.exit_code == 1, said.output
    assert f"witness {witness} line 1: its signature does not hold" in said.output, said.output
    assert "the witness file was edited" in said.output
    assert f"witness {witness} line 2: it is not a witness line (not JSON)" in said.output
    assert "rewritten" not in said.output  # (the edited line is not believed)
    unchecked = verify(folder, witness)
    assert "rewritten" in unchecked.output and "signatures not checked" in unchecked.output


def test_an_episode_signed_with_a_witness_is_named_when_deleted(run: tuple[Path, Path], key: Path):
    """An episode signed from Python with a key given a Witness gets its own line; the episode
    deleted with its records and signature is named deleted."""
    folder, witness = run
    episode = sorted(episodes(folder))[0]
    store = hx.Store(folder / "harness.db")
    try:
        sign_episode(store, episode, hx.SigningKey.load(key, witness=hx.Witness(witness)))
    finally:
        store.close()
    lines, _ = read_witness(witness)
    assert [(w.scope, w.subject) for w in lines][-1] == ("episode", episode)
    assert dict(lines[-1].heads) == {episode: episodes(folder)[episode]}
    assert verify(folder, witness, key).exit_code == 0
    sql(
        folder,
        *(f"DELETE FROM {t} WHERE episode_id = '{episode}'" for t in ("hx_log", "hx_trial")),
        f"DELETE FROM hx_episode WHERE id = '{episode}'",
        f"DELETE FROM hx_signature WHERE subject = '{episode}'",
    )
    said = verify(folder, witness, key)
    assert said.exit_code == 1
    assert f"episode {episode}: signed and witnessed at" in said.output, said.output
    assert "but missing from the store: deleted" in said.output


def test_a_witness_that_is_a_directory_is_refused_before_the_run(
    suite: Path, key: Path, tmp_path: Path
):
    """`--witness DIR` is refused naming it, and no run folder is made."""
    logs = tmp_path / "logs"
    said = cli(
        "run", suite, "--agent", "scripted", "--trials", "1", "--logs", logs,
        "--signing-key", key, "--witness", tmp_path,
    )  # fmt: skip
    assert said.exit_code == 2, said.output
    assert f"witness {tmp_path} is a directory" in said.output, said.output
    assert not logs.exists() or not any(logs.iterdir())


def test_a_store_put_back_from_an_older_copy_is_named_rolled_back(key: Path, tmp_path: Path):
    """An episode of one's own code signed with a witnessed key, then a decision recorded on it
    with `escalations resolve --witness`: the store put back from a copy made before the
    decision passes plain verification, and the witness names the episode rolled back."""
    db, witness = tmp_path / "logs" / "harness.db", tmp_path / "witness.jsonl"
    signing = hx.SigningKey.load(key, witness=hx.Witness(witness))
    _, agent = escalating_run(Shop(), f"sqlite:///{db}", FakeClock(), counts={})
    with pytest.raises(hx.Escalated):
        with hx.Episode(
            state=Shop().state, store=db, episode_id="mine", signing_key=signing
        ) as episode:
            agent(episode)
    shutil.copy(db, tmp_path / "before.db")
    store = hx.Store(db, readonly=True)
    try:
        (pending,) = store.escalations(status="pending")
    finally:
        store.close()
    resolved = cli(
        "escalations", db, "resolve", pending.id, "--reject", "--by", "ana",
        "--signing-key", key, "--witness", witness,
    )  # fmt: skip
    assert resolved.exit_code == 0, resolved.output
    lines, _ = read_witness(witness)
    assert [(w.scope, w.subject) for w in lines] == [("episode", "mine")] * 2
    assert verify(db, witness, key).exit_code == 0
    shutil.copy(tmp_path / "before.db", db)
    assert cli("verify", db, "--public-key", f"{key}.pub").exit_code == 0
    said = verify(db, witness, key)
    assert said.exit_code == 1, said.output
    assert "episode mine: its chain holds" in said.output and "rolled back" in said.output


@pytest.mark.parametrize("first", [True, False])
def test_a_witness_without_a_signing_key_is_refused(
    suite: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, first: bool
):
    """`--witness` with no signing key (none given, HARNESS_SIGNING_KEY unset) is refused, in
    either order of the options, and no run folder is made."""
    monkeypatch.delenv("HARNESS_SIGNING_KEY", raising=False)
    logs = tmp_path / "logs"
    witness = ["--witness", str(tmp_path / "w.jsonl")]
    rest = ["--agent", "scripted", "--trials", "1", "--logs", str(logs)]
    said = cli("run", suite, *(witness + rest if first else rest + witness))
    assert said.exit_code == 2, said.output
    assert "--witness mirrors the signatures the signing key makes" in said.output
    assert "--signing-key" in said.output
    assert not logs.exists() or not any(logs.iterdir())
    assert not (tmp_path / "w.jsonl").exists()


_APPEND = """
import sys
import harness as hx
from harness.store.signing import signature_row
key = hx.SigningKey.load(sys.argv[1], witness=hx.Witness(sys.argv[2]))
heads = {f"{sys.argv[3]}-{n}": (n, "ab" * 32) for n in range(800)}  # (a line of ~70 kB)
for i in range(int(sys.argv[4])):
    row = signature_row(key, "episode", f"{sys.argv[3]}-{i}", {"n": i})
    key.witness.record(key, row, store="sqlite:///x.db", run_id=sys.argv[3], heads=heads)
"""


def test_two_processes_append_whole_lines(key: Path, tmp_path: Path):
    """Two processes appending long lines to one witness at once leave only whole lines, every
    one read back and its signature holding."""
    witness = tmp_path / "w.jsonl"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _APPEND, str(key), str(witness), name, "60"],
            env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        )
        for name in ("p", "q")
    ]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    lines, bad = read_witness(witness, hx.PublicKey.load(f"{key}.pub"))
    assert bad == []
    assert sorted(w.run_id or "" for w in lines) == ["p"] * 60 + ["q"] * 60
    assert all(len(w.heads) == 800 for w in lines)


def test_the_witness_names_a_store_without_its_password():
    """A store is witnessed by its URL without the password (or secret query parameters), and
    a SQLite file by its absolute path."""
    said = store_identity("postgresql://u:secret@db.example/h?sslpassword=x&sslmode=require")
    assert said == "postgresql://u@db.example/h?sslmode=require"
    assert store_identity("sqlite:///logs/harness.db") == (
        f"sqlite:///{os.path.realpath('logs/harness.db')}"
    )

"""Signatures: a key outside the database tells a rewritten record from the real one.

Each case edits a signed run's database as someone with write access could (recomputing every
hash and head, so the chain alone still verifies where it can) and checks that the audit with
the public key names the episode or run whose signed fact no longer holds.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import main
from harness.runs.layout import open_run
from harness.store import GENESIS, record_hash
from harness.store.verify import verify_run

from ..conftest import SIGNING_KEY
from ..toy_env import write_suite

KEY = SIGNING_KEY


@pytest.fixture
def run(signed_run: Path, tmp_path: Path) -> Path:
    """A copy of the signed run to edit."""
    return Path(shutil.copytree(signed_run, tmp_path / "r1"))


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
            for key, seq, kind, txn_id, payload, ts in rows:
                prev = record_hash(prev, episode_id, seq, kind, txn_id, payload, ts)
                conn.execute("UPDATE hx_log SET hash = ? WHERE id = ?", (prev, key))
            conn.execute(
                "UPDATE hx_episode SET head_hash = ?, log_count = ? WHERE id = ?",
                (prev, len(rows), episode_id),
            )


def audit(folder: Path, key: hx.PublicKey | None = KEY.public) -> list[str]:
    """The findings of `harness audit --verify` with the public key, as text."""
    with open_run(folder) as opened:
        report = verify_run(
            opened.store, opened.store.episodes(opened.run.id), public_key=key, run_id="r1"
        )
    return [str(f) for f in report.findings]


def first_episode(folder: Path) -> str:
    with sqlite3.connect(folder / "harness.db") as conn:
        (episode_id,) = conn.execute("SELECT id FROM hx_episode ORDER BY id LIMIT 1").fetchone()
    return str(episode_id)


def test_a_signed_run_verifies_with_its_public_key(signed_run: Path):
    """An unedited signed run verifies: chains, rows and every signature hold."""
    assert audit(signed_run) == []


def test_another_key_verifies_nothing(signed_run: Path):
    """Signatures made by one key do not verify under another: each episode and the run say so."""
    found = audit(signed_run, hx.SigningKey.generate().public)
    assert len(found) == 7 and all("not by the key given" in f for f in found)


def test_a_full_rewrite_with_recomputed_hashes_is_found(run: Path):
    """Changing a payload and recomputing every hash passes the chain, not the signature."""
    episode = first_episode(run)
    sql(
        run,
        f"UPDATE hx_log SET payload = replace(payload, '\"amount\":1', '\"amount\":5') "
        f"WHERE episode_id = '{episode}' AND kind = 'intent'",
    )
    rechain(run)
    store = hx.Store(run / "harness.db")
    try:
        assert store.verify_chain().ok  # the chain alone is fooled
    finally:
        store.close()
    found = audit(run)
    assert any(episode in f and "head_hash signed" in f for f in found), found


def test_an_edited_outcome_is_found(run: Path):
    """An episode's outcome changed in its row breaks its signed head."""
    episode = first_episode(run)
    sql(run, f"UPDATE hx_episode SET status = 'failed' WHERE id = '{episode}'")
    found = audit(run)
    assert any(episode in f and 'status signed "committed", now "failed"' in f for f in found)


def test_a_flipped_verdict_is_found(run: Path):
    """A failed trial flipped to passed (or the reverse) breaks the run's signed manifest."""
    episode = first_episode(run)
    sql(run, f"UPDATE hx_trial SET passed = NOT passed WHERE episode_id = '{episode}'")
    found = audit(run)
    assert any("run r1" in f and "trials: changed" in f and episode in f for f in found), found


def test_a_deleted_episode_is_found_with_or_without_its_signature(run: Path):
    """An episode removed from every table is missed by the chain; its signature or the
    manifest names it."""
    episode = first_episode(run)
    for table in ("hx_log", "hx_transaction", "hx_checkpoint", "hx_trial"):
        sql(run, f"DELETE FROM {table} WHERE episode_id = '{episode}'")
    sql(run, f"DELETE FROM hx_episode WHERE id = '{episode}'")
    found = audit(run)
    assert any(episode in f and "deleted" in f for f in found), found
    sql(run, f"DELETE FROM hx_signature WHERE subject = '{episode}'")
    found = audit(run)
    assert any("run r1" in f and "removed" in f and episode in f for f in found), found


def test_an_added_episode_is_found(run: Path):
    """An episode copied in under a new id has no signature and is not in the manifest."""
    with sqlite3.connect(run / "harness.db") as conn:
        conn.row_factory = sqlite3.Row
        row = dict(conn.execute("SELECT * FROM hx_episode LIMIT 1").fetchone())
        row.update(id="r1-t0-9", num=999, trial=9)
        cols = ", ".join(row)
        conn.execute(
            f"INSERT INTO hx_episode ({cols}) VALUES ({', '.join('?' for _ in row)})",
            list(row.values()),
        )
    found = audit(run)
    assert any("r1-t0-9" in f and "no signature" in f for f in found), found
    assert any("run r1" in f and "added r1-t0-9" in f for f in found), found


def test_an_edited_run_configuration_is_found(run: Path):
    """The run's recorded configuration (agent, seed, suite path) is under the manifest."""
    sql(run, "UPDATE hx_run SET config = replace(config, '\"seed\":0', '\"seed\":7')")
    assert any("run r1" in f and "config signed" in f for f in audit(run))


def test_an_edited_signature_message_does_not_hold(run: Path):
    """Rewriting what a signature says (to match an edit) makes the signature invalid."""
    episode = first_episode(run)
    sql(
        run,
        "UPDATE hx_signature SET message = replace(message, '\"committed\"', '\"failed\"') "
        f"WHERE subject = '{episode}'",
    )
    assert any(episode in f and "does not hold" in f for f in audit(run))


def test_a_removed_signature_is_found(run: Path):
    """An episode whose signature was deleted is reported as unsigned."""
    episode = first_episode(run)
    sql(run, f"DELETE FROM hx_signature WHERE subject = '{episode}'")
    assert any(episode in f and "no signature" in f for f in audit(run))


def test_an_unsigned_run_checked_with_a_key_reports_every_episode(tmp_path: Path):
    """A run written without a key cannot pass a check that asks for signatures."""
    suite = write_suite(tmp_path / "suite", [1])
    result = hx.run_trials(suite, agent="scripted", trials=2, logs=tmp_path / "logs", run_id="r1")
    found = audit(result.folder)
    assert len(found) == 3 and all("no signature" in f for f in found)


def test_keygen_writes_a_private_key_only_its_owner_reads_and_never_overwrites(tmp_path: Path):
    """`harness keygen` makes a 0600 private key and a public key, and refuses to overwrite."""
    path = tmp_path / "keys" / "harness.key"
    result = CliRunner().invoke(main, ["keygen", str(path)])
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = hx.SigningKey.load(path)
    assert hx.PublicKey.load(f"{path}.pub").key_id == key.key_id
    again = CliRunner().invoke(main, ["keygen", str(path)])
    assert again.exit_code == 2 and "never overwritten" in again.output
    assert hx.SigningKey.load(path).key_id == key.key_id


def test_a_key_file_that_is_not_a_key_is_a_clear_error(tmp_path: Path):
    """A wrong file given as a key names itself; nothing is run."""
    bogus = tmp_path / "k.pem"
    bogus.write_text("not a key")
    with pytest.raises(hx.ConfigurationError, match="k.pem is not an unencrypted PEM"):
        hx.SigningKey.load(bogus)
    with pytest.raises(hx.ConfigurationError, match="cannot read the signing key"):
        hx.SigningKey.load(tmp_path / "missing.pem")


def test_the_cli_signs_a_run_and_the_audit_checks_it(tmp_path: Path):
    """`harness run --signing-key` then `harness audit --verify --public-key`: verified, and a
    flipped verdict makes the audit fail naming the run."""
    key = tmp_path / "h.key"
    assert CliRunner().invoke(main, ["keygen", str(key)]).exit_code == 0
    suite = write_suite(tmp_path / "suite", [1, 2])
    args = ["run", str(suite), "--agent", "scripted", "--trials", "1"]
    ran = CliRunner().invoke(
        main, [*args, "--logs", str(tmp_path / "logs"), "--signing-key", str(key)]
    )
    assert ran.exit_code == 0, ran.output
    (folder,) = (tmp_path / "logs").iterdir()
    check = ["audit", str(folder), "--verify", "--public-key", f"{key}.pub"]
    ok = CliRunner().invoke(main, check)
    assert ok.exit_code == 0 and "signatures hold" in ok.output, ok.output
    sql(folder, "UPDATE hx_trial SET passed = NOT passed")
    bad: Any = CliRunner().invoke(main, check)
    assert bad.exit_code == 1 and "NOT VERIFIED" in bad.output and "trials: changed" in bad.output


@pytest.mark.parametrize(
    ("edit", "found"),
    [
        (
            "UPDATE hx_trial SET passed = NOT passed",
            "hx_trial {e}: its passed is not what its verdict",
        ),
        ("UPDATE hx_trial SET partial = 0.5", "hx_trial {e}: its partial is not what its verdict"),
        ("DELETE FROM hx_trial", "hx_trial {e}: its verdict record has no trial row"),
        ("UPDATE hx_episode SET status = 'failed'", "hx_episode {e}: it says failed after"),
        (
            "UPDATE hx_episode SET task_id = 't9'",
            "hx_episode {e}: its task_id is not what its start",
        ),
        ("UPDATE hx_episode SET trial = 7", "hx_episode {e}: its trial is not what its start"),
    ],
)
def test_what_reports_read_is_under_the_chain_without_a_key(run: Path, edit: str, found: str):
    """Verdicts, outcomes and the run, task and trial of an episode are checked against the
    hashed records that wrote them, with no key needed for a partial edit."""
    episode = first_episode(run)
    where = "episode_id" if "hx_trial" in edit else "id"
    sql(run, f"{edit} WHERE {where} = '{episode}'")
    where_found, what = found.format(e=episode).split(": ", 1)
    findings = audit(run, key=None)
    assert any(where_found in f and what in f for f in findings), findings


def test_a_private_key_others_may_read_is_refused_and_nothing_runs(tmp_path: Path):
    """A signing key readable or writable by others than its owner (0644, 0640, 0660) is
    refused, naming its mode and `chmod 600`, as ssh refuses one; `harness run --signing-key`
    with it starts no run. Made the owner's alone, it is used."""
    path = tmp_path / "harness.key"
    key = hx.SigningKey.generate()
    key.save(path)
    for mode in (0o644, 0o640, 0o660, 0o604):
        path.chmod(mode)
        with pytest.raises(hx.ConfigurationError, match=f"mode {mode:04o}.*chmod 600"):
            hx.SigningKey.load(path)
    suite = write_suite(tmp_path / "suite", [1])
    result = CliRunner().invoke(
        main,
        [
            "run",
            str(suite),
            "--agent",
            "scripted",
            "--trials",
            "1",
            "--logs",
            str(tmp_path / "logs"),
            "--signing-key",
            str(path),
        ],
    )
    assert result.exit_code == 2 and "chmod 600" in result.output, result.output
    assert not (tmp_path / "logs").exists() or not list((tmp_path / "logs").iterdir())
    path.chmod(0o600)
    assert hx.SigningKey.load(path).key_id == key.key_id


def test_a_signed_run_verified_without_its_public_key_says_its_signatures_were_not_checked(
    tmp_path: Path,
):
    """`harness verify` and `harness report` of a signed run without --public-key pass, and
    say the signatures were not checked, naming the key (--json: `signatures` and `signers`);
    with the public key they say the signatures hold; an unsigned run says neither."""
    path = tmp_path / "harness.key"
    key = hx.SigningKey.generate()
    key.save(path)
    suite = write_suite(tmp_path / "suite", [1])
    signed = hx.run_trials(suite, agent="scripted", logs=tmp_path / "logs", signing_key=key)
    plain = hx.run_trials(suite, agent="scripted", logs=tmp_path / "plain")
    runner = CliRunner()
    said = runner.invoke(main, ["verify", str(signed.folder)])
    assert said.exit_code == 0 and "signatures not checked" in said.output, said.output
    assert key.key_id in said.output
    said = runner.invoke(main, ["report", str(signed.folder)])
    assert said.exit_code == 0 and "signatures not checked" in said.output, said.output
    data = json.loads(runner.invoke(main, ["report", str(signed.folder), "--json"]).output)
    assert data["verification"]["signers"] == [key.key_id]
    assert data["verification"]["signatures"].startswith("not checked")
    checked = runner.invoke(
        main, ["verify", str(signed.folder), "--public-key", f"{path}.pub"]
    ).output
    assert "signatures hold" in checked and "not checked" not in checked
    for command in (["verify", str(plain.folder)], ["report", str(plain.folder)]):
        out = runner.invoke(main, command).output
        assert "signatures" not in out.lower() or "not checked" not in out, out
    data = json.loads(runner.invoke(main, ["report", str(plain.folder), "--json"]).output)
    assert data["verification"]["signatures"] == "none" and data["verification"]["signers"] == []

"""The commands that read a run back refuse one whose record fails verification.

``harness report``, ``compare``, ``export``, ``replay`` and ``resume`` verify the run first
(hash chains, every row against the log, and the signatures when a public key is given). A run
that fails is refused, naming the first problem, unless ``--allow-unverified`` is given; then
the output is marked UNVERIFIED. A signed run resumed with its key stays signed.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import harness as hx
from harness.cli import main
from harness.runs.layout import open_run
from harness.runs.resume import resume_run

from ..conftest import SIGNING_KEY
from .test_resume import executions, killed_run

KEY = SIGNING_KEY


def _cli(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def run(signed_run: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(signed_run, tmp_path / "r1"))


@pytest.fixture
def public_key(tmp_path: Path) -> Path:
    path = tmp_path / "k.pub"
    path.write_bytes(KEY.public.pem())
    return path


def _trial_effects(tmp_path: Path) -> dict[tuple[str, ...], int]:
    """The run's tool executions (not the reference replays), counted."""
    return {k: n for k, n in executions(tmp_path).items() if k[0].startswith("r1-")}


def _flip_a_verdict(folder: Path) -> None:
    """What someone with write access would do to raise pass^1: mark a trial passed."""
    with sqlite3.connect(folder / "harness.db") as conn:
        conn.execute("UPDATE hx_trial SET passed = 1 - passed WHERE episode_id = 'r1-t0-0'")


READERS = [
    ("report", ["report", "{run}"]),
    ("report json", ["report", "{run}", "--json"]),
    ("compare", ["compare", "{run}", "{run}"]),
    ("export", ["export", "{run}", "--format", "jsonl", "--out", "{tmp}/out.jsonl"]),
    ("replay", ["replay", "{run}", "--episode", "r1-t0-0", "--trust-suite"]),
    ("resume", ["resume", "{run}", "--trust-suite"]),
]


@pytest.mark.parametrize(("name", "argv"), READERS, ids=[r[0] for r in READERS])
def test_a_tampered_run_is_refused_naming_the_first_problem(
    run: Path, tmp_path: Path, name: str, argv: list[str]
) -> None:
    _flip_a_verdict(run)
    before = (run / "harness.db").read_bytes()
    args = [a.format(run=run, tmp=tmp_path) for a in argv]
    result = _cli(*args)
    assert result.exit_code == 2, result.output
    assert "fails verification" in result.stderr
    assert "hx_trial" in result.stderr and "r1-t0-0" in result.stderr
    assert "--allow-unverified" in result.stderr
    assert "Traceback" not in result.output
    assert (run / "harness.db").read_bytes() == before  # refused before anything was written
    assert not (tmp_path / "out.jsonl").exists()


def test_allow_unverified_goes_on_and_marks_the_report(run: Path) -> None:
    _flip_a_verdict(run)
    result = _cli("report", run, "--json", "--allow-unverified")
    assert result.exit_code == 0, result.output
    assert "UNVERIFIED" in result.stderr and "r1-t0-0" in result.stderr
    data = json.loads(result.stdout)
    assert data["verification"]["ok"] is False
    assert data["verification"]["findings"][0]["table"] == "hx_trial"


def test_an_intact_run_reports_as_verified(run: Path, public_key: Path) -> None:
    result = _cli("report", run, "--json", "--public-key", public_key)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["verification"]["ok"] is True
    assert data["verification"]["signed_by"] == KEY.key_id
    assert "UNVERIFIED" not in result.stderr


def test_a_rewrite_that_passes_the_chain_is_refused_with_the_public_key(
    run: Path, public_key: Path
) -> None:
    """A whole episode deleted (every table) leaves the chains intact: only the key sees it."""
    with sqlite3.connect(run / "harness.db") as conn:
        for table, column in (
            ("hx_log", "episode_id"),
            ("hx_transaction", "episode_id"),
            ("hx_checkpoint", "episode_id"),
            ("hx_trial", "episode_id"),
            ("hx_episode", "id"),
        ):
            conn.execute(f"DELETE FROM {table} WHERE {column} = 'r1-t2-1'")
    assert _cli("report", run).exit_code == 0
    result = _cli("report", run, "--public-key", public_key)
    assert result.exit_code == 2
    assert "r1-t2-1" in result.stderr and "deleted" in result.stderr


def test_a_signed_run_resumed_with_its_key_stays_signed(tmp_path: Path) -> None:
    folder = killed_run(tmp_path, tasks=2, trials=2, pause_in="r1-t1-0", signing_key=KEY)
    key_file = tmp_path / "signing.key"
    KEY.save(key_file)
    public = tmp_path / "signing.key.pub"
    other = tmp_path / "other.key"
    hx.SigningKey.generate().save(other)
    before = _trial_effects(tmp_path)
    refused = _cli("resume", folder, "--trust-suite", "--signing-key", other)
    assert refused.exit_code == 2
    assert "signed with key" in refused.stderr and KEY.key_id in refused.stderr
    assert _trial_effects(tmp_path) == before  # refused before any trial ran
    result = _cli("resume", folder, "--trust-suite", "--signing-key", key_file)
    assert result.exit_code == 0, result.output
    assert "kept 1, resumed 1, ran 2 missing" in result.output
    verify = _cli("verify", folder, "--public-key", public)
    assert verify.exit_code == 0, verify.output
    done = _trial_effects(tmp_path)
    assert set(done.values()) == {1} and len(done) == 8  # 4 trials x 2 bumps, once each


def test_a_signed_run_resumed_without_its_key_says_so_and_the_audit_names_the_gap(
    tmp_path: Path,
) -> None:
    folder = killed_run(tmp_path, tasks=2, trials=1, pause_in="r1-t1-0", signing_key=KEY)
    public = tmp_path / "k.pub"
    public.write_bytes(KEY.public.pem())
    result = _cli("resume", folder, "--trust-suite")
    assert result.exit_code == 0, result.output
    assert "was signed" in result.output and "--signing-key" in result.output
    verify = _cli("verify", folder, "--public-key", public, "--json")
    assert verify.exit_code == 1
    findings = json.loads(verify.stdout)["findings"]
    assert {f["episode_id"] for f in findings} >= {"r1-t1-0"}
    assert all("no signature" in f["reason"] or "differs" in f["reason"] for f in findings)


def test_resuming_with_the_key_signs_what_a_keyless_resume_left_unsigned(
    tmp_path: Path,
) -> None:
    """A signed run resumed once without its key, then resumed with it: the episodes the
    keyless resume ended are signed (each verified first), and the run verifies with its
    public key again, as the keyless resume's note promises."""
    folder = killed_run(tmp_path, tasks=2, trials=1, pause_in="r1-t1-0", signing_key=KEY)
    key_file = tmp_path / "signing.key"
    KEY.save(key_file)
    public = tmp_path / "signing.key.pub"
    assert _cli("resume", folder, "--trust-suite").exit_code == 0
    assert _cli("verify", folder, "--public-key", public).exit_code == 1
    before = _trial_effects(tmp_path)
    result = _cli("resume", folder, "--trust-suite", "--signing-key", key_file)
    assert result.exit_code == 0, result.output
    assert _trial_effects(tmp_path) == before  # nothing ran again
    verify = _cli("verify", folder, "--public-key", public)
    assert verify.exit_code == 0, verify.output


def test_an_unsigned_episode_edited_since_is_not_signed_by_a_resume_with_the_key(
    tmp_path: Path,
) -> None:
    """The key never blesses an edit: an episode a keyless resume ended and someone then
    edited (its trial's verdict flipped) stays unsigned when a resume with the key runs from
    Python (which does not verify first), so a check with the public key still names it."""
    folder = killed_run(tmp_path, tasks=2, trials=1, pause_in="r1-t1-0", signing_key=KEY)
    assert _cli("resume", folder, "--trust-suite").exit_code == 0
    with sqlite3.connect(folder / "harness.db") as conn:
        conn.execute("UPDATE hx_trial SET passed = 1 - passed WHERE episode_id = 'r1-t1-0'")
    conn.close()
    resume_run(folder, trust=True, signing_key=KEY)
    with open_run(folder) as opened:
        report = opened.store.verify(opened.run.id, public_key=KEY.public)
        signed = {s.subject for s in opened.store.signatures() if s.scope == "episode"}
    assert "r1-t1-0" in {f.episode_id for f in report.findings}, report.findings
    assert "r1-t1-0" not in signed

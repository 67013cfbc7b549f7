"""`harness audit` verifies what it shows first and never shows an edited record as fact: a
call's amount edited from 7 to 700 and a trial's verdict flipped are named at the top, marked
where they appear (text, --json, HTML) and make the command exit 1."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from harness.cli import main

from ..conftest import SIGNING_KEY
from ..toy_env import write_suite

MARK = "✗"


@pytest.fixture(scope="module")
def made_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`harness run` of a toy suite: task t0 bumps counter a by 7, then b by 1; task t1 bumps
    a by 1. Both trials pass."""
    root = tmp_path_factory.mktemp("verified-audit")
    suite = write_suite(root / "suite", [2, 1])
    tasks = json.loads((suite / "tasks.json").read_text())
    tasks["tasks"][0]["reference_actions"][1]["arguments"]["amount"] = 7
    (suite / "tasks.json").write_text(json.dumps(tasks))
    result = CliRunner().invoke(
        main, ["run", str(suite), "--agent", "scripted", "--trials", "1", "--logs", str(root)]
    )
    assert result.exit_code == 0, result.output
    match = re.search(r"run folder: (\S+)", result.output)
    assert match, result.output
    return Path(match.group(1))


@pytest.fixture
def run(made_run: Path, tmp_path: Path) -> Path:
    """A private copy of the run folder, safe to edit."""
    folder = tmp_path / made_run.name
    shutil.copytree(made_run, folder)
    return folder


def audit(*args: Any) -> Result:
    return CliRunner().invoke(main, ["audit", *(str(a) for a in args)])


def episode(run: Path, task: str) -> str:
    return f"{run.name}-{task}-0"


def edit_amount_and_flip_verdict(run: Path) -> None:
    """With sqlite3, behind the harness's back: t0's committed call bumps by 700, not 7; t1's
    trial reads failed."""
    con = sqlite3.connect(run / "harness.db")
    with con:
        (args,) = con.execute(
            "SELECT args FROM hx_transaction WHERE id = ?", (f"{episode(run, 't0')}:1",)
        ).fetchone()
        assert json.loads(args)["amount"] == 7
        con.execute(
            "UPDATE hx_transaction SET args = ? WHERE id = ?",
            (args.replace('"amount":7', '"amount":700'), f"{episode(run, 't0')}:1"),
        )
        con.execute("UPDATE hx_trial SET passed = 0 WHERE episode_id = ?", (episode(run, "t1"),))
    con.close()


def marked_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(MARK)]


def test_a_clean_run_says_it_verified_and_marks_nothing(run: Path):
    """Exit 0; the first line says what was verified; no mark; --json says verified."""
    result = audit(run)
    assert result.exit_code == 0, result.output
    first = result.output.splitlines()[0]
    assert first.startswith("verified: 2 episode(s)") and "rows agree" in first
    assert MARK not in result.output and "NOT VERIFIED" not in result.output
    assert '"amount": 7, "name": "a"' in result.output
    data = json.loads(audit(run, "--json").output)
    assert data["verification"]["ok"] is True and data["verification"]["findings"] == []
    assert [e["verified"] for e in data["episodes"]] == [True, True]
    assert not [x for e in data["episodes"] for x in e["events"] if "verified" in x]


def test_an_edited_amount_and_a_flipped_verdict_are_named_and_marked_where_they_appear(
    run: Path,
):
    """The banner names both edits; exactly the edited call's line, the two episodes and the
    flipped trial's verdict carry the mark, each with what is wrong under it; exit 1."""
    edit_amount_and_flip_verdict(run)
    result = audit(run)
    assert result.exit_code == 1, result.output
    out = result.output
    lines = out.splitlines()
    assert lines[0].startswith("NOT VERIFIED: checked 2 episode(s)")
    call = f"{episode(run, 't0')}:1"
    assert f"hx_transaction {call} (log record 4): its args does not match" in lines[1]
    assert f"hx_trial {episode(run, 't1')}" in lines[2] and "its passed is not" in lines[2]
    assert "was edited after it was written" in lines[3]
    marked = marked_lines(out)
    assert len(marked) == 4, marked
    assert marked[0].startswith(f"{MARK} episode {episode(run, 't0')}")
    assert marked[0].endswith("NOT VERIFIED")
    assert '"amount": 700, "name": "a"' in marked[1] and "committed" in marked[1]
    assert marked[2].startswith(f"{MARK} episode {episode(run, 't1')}") and "failed" in marked[2]
    assert marked[3] == f"{MARK} verifier: passed (state_equality ok)"
    under = lines[lines.index(marked[1]) + 1]
    assert under.strip().startswith(f"{MARK} not verified: hx_transaction {call}")
    # The call not edited and the other episode's verdict are not marked.
    (other,) = [line for line in lines if '"amount": 1, "name": "b"' in line]
    assert other.startswith("  ") and "  verifier: passed (state_equality ok)" in lines
    last = f"NOT VERIFIED: 2 problem(s) in {run}, named at the top and marked {MARK} where"
    assert lines[-1] == f"{last} they appear"


def test_the_json_says_which_records_failed_and_where_they_are_marked(run: Path):
    """--json: the verification with its findings, each episode verified or not, the edited
    call "verified": false with its finding, the flipped trial's verdict_verified false."""
    edit_amount_and_flip_verdict(run)
    result = audit(run, "--json")
    assert result.exit_code == 1
    data = json.loads(result.output)
    assert data["verification"]["ok"] is False
    assert [f["table"] for f in data["verification"]["findings"]] == ["hx_transaction", "hx_trial"]
    t0, t1 = data["episodes"]
    assert (t0["verified"], t1["verified"]) == (False, False)
    edited = [e for e in t0["events"] if "verified" in e]
    assert [(e["arguments"]["amount"], e["verified"]) for e in edited] == [(700, False)]
    (finding,) = edited[0]["findings"]
    assert finding["record"] == f"{episode(run, 't0')}:1" and "args" in finding["reason"]
    assert [f["marked"] for f in t0["findings"]] == [f"transaction {episode(run, 't0')}:1"]
    assert "verdict_verified" not in t0
    assert t1["verdict_verified"] is False and t1["passed"] is False
    assert [f["marked"] for f in t1["findings"]] == ["verdict"]
    assert not [e for e in t1["events"] if "verified" in e]


def test_allow_unverified_exits_0_with_the_marks_and_verify_still_only_verifies(run: Path):
    """--allow-unverified exits 0 and keeps every mark; `audit --verify`, as scripts call it,
    is still `harness verify` (its output, its exit status) and takes no --allow-unverified."""
    edit_amount_and_flip_verdict(run)
    result = audit(run, "--allow-unverified")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("NOT VERIFIED") and len(marked_lines(result.output)) == 4
    verify = audit(run, "--verify", "--json")
    assert verify.exit_code == 1
    assert set(json.loads(verify.output)) >= {"ok", "findings", "episodes"}
    assert "events" not in verify.output
    both = audit(run, "--verify", "--allow-unverified")
    assert both.exit_code == 2 and "--allow-unverified goes with the timelines" in both.output


def test_an_episode_shown_alone_is_verified_alone(run: Path):
    """--episode verifies the episode shown: the edited one exits 1, the other 0."""
    edit_amount_and_flip_verdict(run)
    con = sqlite3.connect(run / "harness.db")
    with con:
        con.execute("UPDATE hx_trial SET passed = 1 WHERE episode_id = ?", (episode(run, "t1"),))
    con.close()
    edited = audit(run, "--episode", episode(run, "t0"))
    assert edited.exit_code == 1 and len(marked_lines(edited.output)) == 2
    clean = audit(run, "--episode", episode(run, "t1"))
    assert clean.exit_code == 0 and clean.output.startswith("verified: 1 episode(s)")


def test_the_html_page_names_the_edit_and_marks_the_call(run: Path, tmp_path: Path):
    """--html of the edited episode: a banner naming the edit, the call's item marked with
    the finding, exit 1; of the clean run, a line saying it verified."""
    clean = tmp_path / "clean.html"
    assert audit(run, "--episode", episode(run, "t0"), "--html", clean).exit_code == 0
    assert '<p class="verified">verified: 1 episode(s)' in clean.read_text()
    assert "unverified" not in clean.read_text().split("</style>")[1]
    edit_amount_and_flip_verdict(run)
    page = tmp_path / "t0.html"
    result = audit(run, "--episode", episode(run, "t0"), "--html", page)
    assert result.exit_code == 1 and result.output.startswith("NOT VERIFIED")
    assert f"wrote {page}" in result.output
    html = unescape(page.read_text())
    assert '<div class="unverified banner"><p><b>NOT VERIFIED</b>' in html
    items = re.findall(r'<li class="event transaction ([^"]*)"', html)
    assert items == ["committed problem unverified", "committed"]
    assert html.count(f"✗ not verified</b>: hx_transaction {episode(run, 't0')}:1") == 1
    verdict = tmp_path / "t1.html"
    assert audit(run, "--episode", episode(run, "t1"), "--html", verdict).exit_code == 1
    assert '<p class="verdict pass unverified">' in verdict.read_text()


def test_a_signed_run_says_whether_its_signatures_were_checked(signed_run: Path, tmp_path: Path):
    """Without the public key the audit says the signatures were not checked; with it, that
    they hold."""
    unchecked = audit(signed_run)
    assert unchecked.exit_code == 0
    assert f"signatures not checked: signed with key {SIGNING_KEY.public.key_id}" in (
        " ".join(unchecked.output.split())
    )
    key = tmp_path / "k.pub"
    key.write_bytes(SIGNING_KEY.public.pem())
    checked = audit(signed_run, "--public-key", key)
    assert checked.exit_code == 0
    first = checked.output.splitlines()[0]
    assert f"signatures of key {SIGNING_KEY.public.key_id}" in first
    assert "signatures hold" in first and "not checked" not in checked.output

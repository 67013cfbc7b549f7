"""Audit: timelines of what happened, a verification that names the first edited record,
replay against the record, an HTML view rendered by Chromium, and clear errors on bad input."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.audit import render_html
from harness.cli import main
from harness.runs.replay import replay_episode
from harness.runs.start import run_trials

from ..browser import layout, needs_chromium
from ..runs.test_resume import PLAN, ledger_suite


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of two tasks: t0 commits three steps; t1's risky call escalates, is approved by a
    person and resumed to the end."""
    root = tmp_path_factory.mktemp("audit")
    suite = ledger_suite(
        root / "suite",
        [PLAN, [("bump", {"name": "a", "step": 0}), ("risky", {"name": "c"})]],
        ledger=str(root / "ledger.txt"),
    )
    run_trials(suite, agent="scripted", trials=1, logs=root / "logs", run_id="r1")
    folder = root / "logs" / "r1"
    store = hx.Store(folder / "harness.db")
    (pending,) = store.escalations("pending")
    store.resolve(pending.id, "approve", by="ana", reason="refusal was transient")
    store.close()
    result = CliRunner().invoke(main, ["resume", str(folder), "--suite", str(suite)])
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture
def run_copy(recorded_run: Path, tmp_path: Path) -> Path:
    """A private copy of the recorded run folder, safe to edit."""
    folder = tmp_path / "r1"
    shutil.copytree(recorded_run, folder)
    return folder


def cli(*args: str) -> Any:
    """Run the harness command line in-process."""
    return CliRunner().invoke(main, [*args])


# --------------------------------------------------------------------------------------------
# Timelines.
# --------------------------------------------------------------------------------------------


def test_audit_shows_actions_diffs_checkpoints_verdicts_and_who_resolved(recorded_run: Path):
    """The text timeline lists each action with arguments, outcome, attempts and timing, the
    diff it made, its checkpoint, the verifier's verdict and the person who resolved."""
    out = cli("audit", str(recorded_run)).output
    assert 'bump({"name": "a", "step": 0}) committed, 1 attempt(s)' in out
    assert "Δ c/a: 0 → 1" in out and "checkpoint 1:" in out and "ms" in out
    assert "recorded read" in out and "verifier: passed (state_equality ok)" in out
    assert "fail_stop → escalate" in out and "risky refused the first time" in out
    assert 'escalated risky({"name": "c"}) (fail_stop)' in out
    assert "approved by ana: refusal was transient" in out
    assert "resume" in out


def test_audit_json_has_every_field_for_machines(recorded_run: Path):
    """--json gives each episode's events with arguments, status, decision, failure class,
    attempts, timing, diff and checkpoint, and its verdict and escalations."""
    data = json.loads(cli("audit", str(recorded_run), "--json").output)
    assert data["run_id"] == "r1" and len(data["episodes"]) == 2
    escalated = next(e for e in data["episodes"] if e["task_id"] == "t1")
    txns = [e for e in escalated["events"] if e["kind"] == "transaction"]
    refused, approved = (t for t in txns if t["action"] == "risky")
    assert refused["status"] == "failed" and refused["decision"] == "escalate"
    assert refused["failure_class"] == "fail_stop" and refused["attempts"] == 1
    assert approved["status"] == "committed" and approved["diff"] == {
        "c/c": {"before": 0, "after": 100, "fields": [": 0 → 100"]}
    }
    assert approved["checkpoint"]["step"] == 2 and len(approved["checkpoint"]["digest"]) == 64
    assert isinstance(approved["duration"], float) and approved["arguments"] == {"name": "c"}
    (esc,) = escalated["escalations"]
    assert (esc["status"], esc["resolved_by"]) == ("approved", "ana")
    assert escalated["verdict"]["passed"] is True and escalated["passed"] is True


def test_audit_filters_by_task_episode_and_failure_class(recorded_run: Path):
    """--task, --episode and --failure-class select episodes; an unknown episode is an error."""

    def ids(*args: str) -> list[str]:
        data = json.loads(cli("audit", str(recorded_run), "--json", *args).output)
        return [e["episode_id"] for e in data["episodes"]]

    assert ids("--task", "t0") == ["r1-t0-0"]
    assert ids("--episode", "r1-t1-0") == ["r1-t1-0"]
    assert ids("--failure-class", "fail_stop") == ["r1-t1-0"]
    assert ids("--failure-class", "scope") == []
    missing = cli("audit", str(recorded_run), "--episode", "nope")
    assert missing.exit_code == 2 and "no episode 'nope' in run r1" in missing.output


# --------------------------------------------------------------------------------------------
# --verify: every kind of edit is named.
# --------------------------------------------------------------------------------------------


def edit(folder: Path, *statements: str) -> None:
    """Change the run's database behind the harness's back."""
    conn = sqlite3.connect(folder / "harness.db")
    with conn:
        for sql in statements:
            conn.execute(sql)
    conn.close()


def verify(folder: Path) -> tuple[int, list[dict[str, Any]]]:
    """`harness audit --verify --json`: its exit code and findings."""
    result = cli("audit", str(folder), "--verify", "--json")
    return result.exit_code, json.loads(result.output)["findings"]


def test_unedited_run_verifies(recorded_run: Path):
    """A run nobody edited verifies: chains, digests and every row agree with the log."""
    result = cli("audit", str(recorded_run), "--verify")
    assert result.exit_code == 0 and "verified: 2 episode(s)" in result.output


T0 = "r1-t0-0"
EDITS: dict[str, tuple[list[str], str, str, str]] = {
    # name: (SQL, table named, record named, words in the reason)
    "transaction result altered": (
        [f"UPDATE hx_transaction SET result = '7' WHERE id = '{T0}:2'"],
        "hx_transaction",
        f"{T0}:2",
        "result does not match",
    ),
    "transaction diff altered": (
        [f"UPDATE hx_transaction SET diff = '{{}}' WHERE id = '{T0}:2'"],
        "hx_transaction",
        f"{T0}:2",
        "diff does not match",
    ),
    "transaction timing altered": (
        [f"UPDATE hx_transaction SET duration = 99 WHERE id = '{T0}:2'"],
        "hx_transaction",
        f"{T0}:2",
        "duration is not the time",
    ),
    "transaction status altered": (
        [f"UPDATE hx_transaction SET status = 'compensated' WHERE id = '{T0}:2'"],
        "hx_transaction",
        f"{T0}:2",
        "status 'compensated'",
    ),
    "transaction removed": (
        [f"DELETE FROM hx_transaction WHERE id = '{T0}:2'"],
        "hx_transaction",
        f"{T0}:2",
        "removed",
    ),
    "transactions reordered": (
        [
            f"UPDATE hx_transaction SET seq = 99 WHERE id = '{T0}:1'",
            f"UPDATE hx_transaction SET seq = 1 WHERE id = '{T0}:2'",
            f"UPDATE hx_transaction SET seq = 2 WHERE id = '{T0}:1'",
        ],
        "hx_transaction",
        f"{T0}:2",
        "reordered",
    ),
    "transaction added": (
        [
            "INSERT INTO hx_transaction (episode_id, seq, id, action, idem_key, args, status, "
            "mutating, attempts, errors, started_at) VALUES "
            f"('{T0}', 50, '{T0}:50', 'bump', 'k', '{{}}', 'committed', 1, 1, '[]', 0)"
        ],
        "hx_transaction",
        f"{T0}:50",
        "added outside the harness",
    ),
    "checkpoint altered": (
        [f"UPDATE hx_checkpoint SET digest = 'ab' WHERE episode_id = '{T0}' AND step = 1"],
        "hx_checkpoint",
        "step 1",
        "checkpoint was altered",
    ),
    "checkpoint removed": (
        [f"DELETE FROM hx_checkpoint WHERE episode_id = '{T0}' AND step = 2"],
        "hx_checkpoint",
        "step 2",
        "removed",
    ),
    "checkpoints reordered": (
        [
            f"UPDATE hx_checkpoint SET step = 9 WHERE episode_id = '{T0}' AND step = 1",
            f"UPDATE hx_checkpoint SET step = 1 WHERE episode_id = '{T0}' AND step = 2",
            f"UPDATE hx_checkpoint SET step = 2 WHERE episode_id = '{T0}' AND step = 9",
        ],
        "hx_checkpoint",
        "step 1",
        "reordered",
    ),
    "log record altered": (
        [f"UPDATE hx_log SET payload = payload || ' ' WHERE episode_id = '{T0}' AND seq = 3"],
        "hx_log",
        "record 3",
        "altered",
    ),
    "log record removed": (
        [f"DELETE FROM hx_log WHERE episode_id = '{T0}' AND seq = 4"],
        "hx_log",
        "record 4",
        "missing",
    ),
    "log records reordered": (
        [
            f"UPDATE hx_log SET seq = -1 WHERE episode_id = '{T0}' AND seq = 3",
            f"UPDATE hx_log SET seq = 3 WHERE episode_id = '{T0}' AND seq = 4",
            f"UPDATE hx_log SET seq = 4 WHERE episode_id = '{T0}' AND seq = -1",
        ],
        "hx_log",
        "record 3",
        "",
    ),
    "episode row altered": (
        [f"UPDATE hx_episode SET digest = '{'0' * 64}' WHERE id = '{T0}'"],
        "hx_episode",
        T0,
        "the row was altered",
    ),
    "escalation resolution altered": (
        ["UPDATE hx_escalation SET resolved_by = 'mallory'"],
        "hx_escalation",
        "",
        "who resolved it",
    ),
    "escalation removed": (
        ["DELETE FROM hx_escalation"],
        "hx_escalation",
        "",
        "removed",
    ),
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_verify_names_the_first_edited_record(run_copy: Path, name: str):
    """Each kind of edit (altered, removed, reordered or added rows of every table) fails
    --verify, naming the table, the record and what happened to it."""
    statements, table, record, words = EDITS[name]
    assert verify(run_copy) == (0, [])
    edit(run_copy, *statements)
    code, findings = verify(run_copy)
    assert code == 1 and len(findings) == 1, findings
    (found,) = findings
    assert found["table"] == table, found
    assert record in found["record"] and words in found["reason"], found


# Where `harness audit` marks each edit on the timeline (--json "marked"): the item showing the
# record named, else the event showing the log record that proves it, else the episode.
MARKED = {
    "transaction result altered": f"transaction {T0}:2",
    "transaction diff altered": f"transaction {T0}:2",
    "transaction timing altered": f"transaction {T0}:2",
    "transaction status altered": f"transaction {T0}:2",
    "transaction removed": f"transaction {T0}:2",  # (shown from its log records)
    "transactions reordered": f"transaction {T0}:2",
    "transaction added": "episode",  # (no log record: not on the timeline)
    "checkpoint altered": f"transaction {T0}:1",
    "checkpoint removed": f"transaction {T0}:2",
    "checkpoints reordered": f"transaction {T0}:2",  # (the row now saying step 1 is its)
    "log record altered": f"transaction {T0}:1",
    "log record removed": "episode",
    "log records reordered": "log record 3",
    "episode row altered": "episode",
    "escalation resolution altered": "log record 6 and escalation",
    "escalation removed": "log record 6",
}


@pytest.mark.parametrize("name", sorted(EDITS))
def test_audit_marks_each_edit_where_it_appears(run_copy: Path, name: str):
    """`harness audit` of each edited record exits 1 and marks the item showing it, and no
    other: the finding says where (``marked``), the item carries it ("verified": false)."""
    edit(run_copy, *EDITS[name][0])
    result = cli("audit", str(run_copy), "--json")
    assert result.exit_code == 1, result.output
    data = json.loads(result.output)
    (episode,) = [e for e in data["episodes"] if not e["verified"]]
    (finding,) = episode["findings"]
    assert finding["table"] == EDITS[name][1] and finding["marked"].startswith(MARKED[name])
    items = [e for e in episode["events"] + episode["escalations"] if "verified" in e]
    assert len(items) == finding["marked"].count(" and ") + (finding["marked"] != "episode")
    assert all(e["verified"] is False and e["findings"] for e in items)
    assert result.output.count('"verified": false') == 1 + len(items)


def test_verify_text_names_the_record_and_the_proof(run_copy: Path):
    """The text report says NOT VERIFIED and names the record and the log record proving it."""
    edit(run_copy, f"UPDATE hx_transaction SET result = '7' WHERE id = '{T0}:2'")
    result = cli("audit", str(run_copy), "--verify")
    assert result.exit_code == 1 and "NOT VERIFIED" in result.output
    assert f"hx_transaction {T0}:2 (log record 6)" in result.output


# --------------------------------------------------------------------------------------------
# Replay.
# --------------------------------------------------------------------------------------------


def test_replay_of_unmodified_episodes_reports_no_divergence(recorded_run: Path):
    """Replaying each episode re-runs its agent against the record without a divergence and
    re-verifies the recorded final state to the recorded verdict."""
    for episode in ("r1-t0-0", "r1-t1-0"):
        result = cli("replay", str(recorded_run), "--episode", episode, "--trust-suite")
        assert result.exit_code == 0, result.output
        assert "no divergence" in result.output and "same verdict as recorded" in result.output
    report = replay_episode(recorded_run, "r1-t0-0", trust=True)
    assert report.ok and report.divergence is None and report.replayed == report.steps == 3
    assert report.message_matches and report.verdict_matches


def test_replay_reports_the_first_step_that_differs(run_copy: Path):
    """A record whose second action differs from what the agent does is reported as a
    divergence at that step, with what the record has and what the agent did."""
    edit(
        run_copy,
        f"""UPDATE hx_transaction SET args = '{{"name":"z","step":1}}'
                       WHERE id = '{T0}:2'""",
    )
    args = ["--trust-suite", "--json", "--allow-unverified"]  # the edit fails verification
    result = cli("replay", str(run_copy), "--episode", T0, *args)
    assert "UNVERIFIED" in result.stderr
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and not data["ok"]
    divergence = data["divergence"]
    assert divergence["step"] == 3
    assert divergence["expected"]["arguments"] == {"name": "z", "step": 1}
    assert divergence["actual"]["arguments"] == {"name": "b", "step": 1}


def test_replay_notices_a_verdict_that_no_longer_holds(run_copy: Path):
    """Re-verifying the recorded final state against an edited recorded verdict says so."""
    edit(run_copy, f"UPDATE hx_trial SET verdict = '{{\"passed\": false}}' WHERE id = '{T0}'")
    refused = cli("replay", str(run_copy), "--episode", T0, "--trust-suite")
    assert refused.exit_code == 2 and "fails verification" in refused.stderr
    args = ["--trust-suite", "--allow-unverified"]
    result = cli("replay", str(run_copy), "--episode", T0, *args)
    assert result.exit_code == 1 and "DIFFERENT from the recorded verdict" in result.output


def test_replay_of_an_unknown_episode_is_a_clear_error(recorded_run: Path):
    """Replaying an episode the run does not have names it and lists some that exist."""
    result = cli("replay", str(recorded_run), "--episode", "ghost", "--trust-suite")
    assert result.exit_code == 2 and "no episode 'ghost' in run r1" in result.output


def point_suite_at(folder: Path, suite: Path) -> None:
    """Edit the run's recorded suite path (hx_run.config) to point at ``suite``."""
    edit(folder, f"UPDATE hx_run SET config = json_set(config, '$.suite_path', '{suite}')")


def malicious_suite(folder: Path, original: Path, marker: Path, environment: str) -> Path:
    """A copy of the suite ``original`` with ``environment``, beside a module that touches
    ``marker`` when imported."""
    folder.mkdir()
    (folder / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from tests.runs.test_resume import LedgerToy as Env\n"
    )
    recorded = json.loads((original / "suite.json").read_text())
    recorded["environment"] = environment
    recorded["environment_options"] = {"ledger": str(folder / "ledger.txt")}
    if environment == "os:system":
        recorded["environment_options"] = {"command": f"touch {marker}"}
    (folder / "suite.json").write_text(json.dumps(recorded))
    shutil.copy(original / "tasks.json", folder / "tasks.json")
    return folder


def test_replay_refuses_a_recorded_suite_path_it_was_not_told_to_trust(
    run_copy: Path, recorded_run: Path, tmp_path: Path
):
    """A run folder whose recorded suite path was edited to point at another suite folder is
    not loaded on the folder's word: replay refuses, saying to pass --suite, and imports
    nothing; --suite replays on the suite named; only --trust-suite loads the recorded path."""
    marker = tmp_path / "imported"
    original = recorded_run.parents[1] / "suite"
    point_suite_at(run_copy, malicious_suite(tmp_path / "evil", original, marker, "evil:Env"))
    # The edit is found first: the trials' start records bind the run's configuration.
    unverified = cli("replay", str(run_copy), "--episode", T0)
    assert unverified.exit_code == 2, unverified.output
    said = " ".join(unverified.output.split())
    assert "fails verification" in said and "hx_run r1" in said and "configuration" in said
    assert not marker.exists()
    # Told to go on anyway, the recorded path is still not loaded on the folder's word.
    refused = cli("replay", str(run_copy), "--episode", T0, "--allow-unverified")
    assert refused.exit_code == 2, refused.output
    said = " ".join(refused.output.split())
    assert "not a built-in suite" in said and "--suite" in said
    assert not marker.exists()
    with pytest.raises(hx.SuiteError, match="trust=True"):
        replay_episode(run_copy, T0)
    assert not marker.exists()
    named = cli(
        "replay",
        str(run_copy),
        "--episode",
        T0,
        "--allow-unverified",
        "--suite",
        str(recorded_run.parents[1] / "suite"),
    )
    assert named.exit_code == 0 and "no divergence" in named.output, named.output
    assert not marker.exists()
    trusted = cli("replay", str(run_copy), "--episode", T0, "--allow-unverified", "--trust-suite")
    assert marker.exists(), trusted.output


def test_replay_refuses_os_system_even_when_trusted(
    run_copy: Path, recorded_run: Path, tmp_path: Path
):
    """A trusted recorded suite is still a suite: `os:system` is refused and nothing runs."""
    marker = tmp_path / "ran"
    original = recorded_run.parents[1] / "suite"
    point_suite_at(run_copy, malicious_suite(tmp_path / "evil", original, marker, "os:system"))
    for flags in ((), ("--trust-suite",)):
        result = cli("replay", str(run_copy), "--episode", T0, "--allow-unverified", *flags)
        assert result.exit_code == 2, result.output
    assert "is not a class" in " ".join(result.output.split())
    assert not marker.exists()


def test_replay_with_another_suite_is_refused(run_copy: Path):
    """--suite must name the run's suite: a run of `ledger` does not replay on `configs`."""
    result = cli("replay", str(run_copy), "--episode", T0, "--suite", "configs")
    assert result.exit_code == 2
    assert "was made from suite 'ledger'" in " ".join(result.output.split())


# --------------------------------------------------------------------------------------------
# HTML.
# --------------------------------------------------------------------------------------------

# Appended to a copy of the page inside the test only: it measures what Chromium laid out.
LAYOUT_PROBE = """<script>
const items = document.querySelectorAll("#timeline li.event");
const boxes = Array.from(items, li => li.getBoundingClientRect().height);
const out = document.createElement("pre");
out.id = "layout";
out.textContent = JSON.stringify({
  rendered: document.body.dataset.rendered,
  heights: boxes,
  diffs: document.querySelectorAll("#timeline table.diff tr").length,
  visible: Array.from(items).filter(li => li.offsetParent !== null).length,
});
document.body.appendChild(out);
</script></body>"""


def test_audit_html_writes_one_self_contained_episode(recorded_run: Path, tmp_path: Path):
    """--html writes one episode's timeline with its diffs and nothing loaded from elsewhere;
    several matching episodes without --episode is a usage error."""
    page = tmp_path / "e.html"
    result = cli("audit", str(recorded_run), "--episode", "r1-t1-0", "--html", str(page))
    assert result.exit_code == 0, result.output
    html = page.read_text()
    assert '<ol id="timeline">' in html and "approved</b> by ana" in html
    assert '<td class="after">100</td>' in html
    assert not re.search(r"""(src|href)=["']?https?:""", html)
    several = cli("audit", str(recorded_run), "--html", str(tmp_path / "x.html"))
    assert several.exit_code == 2 and "--episode" in several.output


def hostile_timeline(hostile: str) -> dict[str, Any]:
    """A timeline (as ``audit.timeline`` gives it) with ``hostile`` in every recorded string."""
    return {
        "episode_id": hostile,
        "run_id": "r",
        "task_id": hostile,
        "trial": 0,
        "status": "finished",
        "steps": 1,
        "digest": "d",
        "message": hostile,
        "infra_cause": hostile,
        "verdict": {
            "passed": False,
            "checks": [{"name": hostile, "passed": False, "compared": {hostile: hostile}}],
        },
        "escalations": [
            {
                "id": "e1",
                "action": hostile,
                "args": {hostile: hostile},
                "reason": hostile,
                "failure_class": "fail_stop",
                "status": "approved",
                "resolved_by": hostile,
                "resolution_reason": hostile,
            }
        ],
        "events": [
            {
                "seq": 1,
                "ts": 0.0,
                "kind": "transaction",
                "txn_id": hostile,
                "action": hostile,
                "arguments": {"name": hostile},
                "status": "committed",
                "failure_class": hostile,
                "reason": hostile,
                "result": hostile,
                "diff": {hostile: {"before": None, "after": hostile, "fields": [hostile]}},
            },
            {"seq": 2, "ts": 0.0, "kind": "recorded", "what": hostile, "request": hostile},
            {"seq": 3, "ts": 0.0, "kind": hostile, "note": hostile},
        ],
    }


def test_audit_html_escapes_every_recorded_string():
    """Ids, actions, arguments, reasons, diffs, the verdict's checks, the infrastructure cause
    and escalations come out escaped, in text and in attributes, so a hostile tool argument
    cannot inject markup into the page."""
    hostile = "<script>alert(1)</script>\"'"
    page = render_html(hostile_timeline(hostile))
    assert "<script>alert" not in page and "\"'" not in page
    assert page.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 15
    assert unescape(page).count(hostile) >= 10


@needs_chromium
def test_audit_html_timeline_renders_in_headless_chromium(recorded_run: Path, tmp_path: Path):
    """Chromium runs the page's script and lays out every timeline event and diff row."""
    page = tmp_path / "e.html"
    cli("audit", str(recorded_run), "--episode", "r1-t1-0", "--html", str(page))
    html = page.read_text()
    events = html.count('<li class="event')
    measured, _ = layout(page, LAYOUT_PROBE, tmp_path / "profile")
    assert measured["rendered"] == str(events) and measured["visible"] == events
    assert len(measured["heights"]) == events and min(measured["heights"]) > 10
    assert measured["diffs"] >= 3  # header + a row for each of the two committed diffs


# --------------------------------------------------------------------------------------------
# Bad input.
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "extra"),
    [("audit", ()), ("audit", ("--verify",)), ("replay", ("--episode", "x")), ("escalations", ())],
)
def test_bad_run_folders_are_clear_errors_and_nothing_is_written(
    tmp_path: Path, recorded_run: Path, command: str, extra: tuple[str, ...]
):
    """A missing folder, a folder without a database, a file that is not a database, a
    truncated database and one from a newer harness: exit 2, a message naming the path and
    the fix, and no file created or changed."""

    def refused(folder: Path, *words: str) -> None:
        before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        result = cli(command, str(folder), *extra)
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        for word in words:
            assert word in text, text
        after = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
        assert after == before

    missing = tmp_path / "missing"
    result = cli(command, str(missing), *extra)
    assert result.exit_code == 2 and f"no run folder {missing}" in result.output
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    refused(empty, "has no harness.db", "logs/<run>")
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "harness.db").write_bytes(b"not a database at all " * 200)
    refused(junk, "damaged or not a database", ".recover")
    cut = tmp_path / "cut"
    shutil.copytree(recorded_run, cut)
    for leftover in ("harness.db-wal", "harness.db-shm"):
        (cut / leftover).unlink(missing_ok=True)
    data = (cut / "harness.db").read_bytes()
    (cut / "harness.db").write_bytes(data[: len(data) // 2])
    refused(cut, "damaged", "Restore it from a copy")
    newer = tmp_path / "newer"
    shutil.copytree(recorded_run, newer)
    edit(newer, "UPDATE hx_meta SET value = '42' WHERE key = 'schema_version'")
    for leftover in ("harness.db-wal", "harness.db-shm"):
        (newer / leftover).unlink(missing_ok=True)
    refused(newer, "schema version 42", "Upgrade harness")


def test_resolving_an_already_resolved_escalation_changes_nothing(run_copy: Path):
    """A second decision on a resolved escalation is refused, naming who decided; the store is
    left as it was."""
    (esc,) = json.loads(cli("escalations", str(run_copy), "--all", "--json").output)
    db = run_copy / "harness.db"
    before = sqlite3.connect(db).execute("SELECT * FROM hx_escalation").fetchall()
    log_before = sqlite3.connect(db).execute("SELECT COUNT(*) FROM hx_log").fetchone()
    result = cli("escalations", str(run_copy), "resolve", esc["id"], "--reject", "--by", "bo")
    assert result.exit_code == 2
    assert f"escalation {esc['id']} is already approved by ana" in result.output
    assert sqlite3.connect(db).execute("SELECT * FROM hx_escalation").fetchall() == before
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM hx_log").fetchone() == log_before
    unknown = cli("escalations", str(run_copy), "resolve", "nope", "--approve", "--by", "bo")
    assert unknown.exit_code == 2 and "no escalation 'nope' in run r1" in unknown.output


def test_verify_of_a_folder_its_database_and_its_url_agree_on_a_removed_episode_row(
    run_copy: Path,
):
    """An episode's row deleted with its records left: `harness verify` of the run folder, of
    its harness.db and of its sqlite:/// URL all name the episode removed (the folder's check
    of one run names the orphans that are the run's, as the whole store's check does)."""
    edit(run_copy, "DELETE FROM hx_episode WHERE id = 'r1-t0-0'")
    db = run_copy / "harness.db"
    for target in (str(run_copy), str(db), f"sqlite:///{db}"):
        result = cli("verify", target)
        said = " ".join(result.output.split())
        assert result.exit_code == 1, (target, said)
        assert "r1-t0-0" in said and "the episode was removed" in said, (target, said)

"""What an approver sees: the call to decide on (action, arguments, what it changed), only from
a record that verified, and the decision read back as it was made."""

from __future__ import annotations

import json
import sqlite3
from html import unescape
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

import harness as hx
from harness.cli import _common, main


@pytest.fixture(autouse=True)
def wide_console(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line's console wide enough that no line of its output folds: a long
    temporary folder would split the path the tests look for. (Its width, not COLUMNS: a
    pytest-xdist worker sets COLUMNS=80 and LINES=24 before the console is made, which then
    keeps that size.)"""
    monkeypatch.setattr(_common.console, "_width", 1000)


def cli(*args: str) -> Any:
    """Run the harness command line in-process."""
    return CliRunner().invoke(main, [*args])


def bank_actions(bank: hx.DictState) -> tuple[Any, Any]:
    """A deposit held for approval above 1,000, and a transfer that changes the books and then
    fails, with neither a key nor a compensation (so it is escalated with its change left)."""

    @hx.action(writes=["accounts/{who}"], approval=lambda ctx: ctx.args.amount > 1000)
    def deposit(who: str, amount: int) -> dict:
        row = {"balance": bank.get(f"accounts/{who}")["balance"] + amount}
        bank[f"accounts/{who}"] = row
        return row

    @deposit.compensation
    def undo(ctx: Any) -> None:
        bank.update(ctx.before)

    @hx.action(writes=["accounts/{who}"])
    def payout(who: str, amount: int) -> dict:
        bank[f"accounts/{who}"] = {"balance": bank.get(f"accounts/{who}")["balance"] - amount}
        raise RuntimeError("the payment network dropped the call")

    return deposit, payout


@pytest.fixture
def held(tmp_path: Path) -> tuple[Path, str]:
    """A store with one episode: a deposit of 5 committed, one of 10,000 to carol held."""
    db = tmp_path / "h.db"
    bank = hx.DictState({"accounts/bob": {"balance": 0}, "accounts/carol": {"balance": 0}})
    deposit, _ = bank_actions(bank)
    store = hx.Store(db, create=True)
    with pytest.raises(hx.Escalated) as raised:
        with hx.Episode(state=bank, store=store, episode_id="ep1"):
            deposit("bob", 5)
            deposit(who="carol", amount=10000)
    store.close()
    return db, raised.value.escalation_id


def test_the_listing_shows_the_call_to_decide_on_and_how_to_decide(held: tuple[Path, str]):
    """Each waiting escalation shows its action with the arguments, why it is held, that it
    changed nothing yet, and the exact command that decides it."""
    db, esc_id = held
    result = cli("escalations", str(db))
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert 'deposit({"amount": 10000, "who": "carol"})' in out
    assert "approval: held for a person's approval before it runs" in out
    assert "nothing: held before it ran" in out
    assert f"harness escalations {db} resolve {esc_id} --approve|--reject" in out


def test_json_gives_arguments_and_evidence_as_values_not_strings(held: tuple[Path, str]):
    """--json is for machines: arguments, evidence and diff are JSON objects."""
    db, esc_id = held
    (esc,) = json.loads(cli("escalations", str(db), "--json").output)
    assert esc["id"] == esc_id and esc["action"] == "deposit"
    assert esc["args"] == {"who": "carol", "amount": 10000}
    assert isinstance(esc["evidence"], dict) and esc["evidence"]["attempts"] == 0
    assert esc["diff"] == {} and esc["status"] == "pending" and esc["fallback"] == "reject"


def test_a_failed_calls_escalation_shows_the_change_it_left(tmp_path: Path):
    """A call that changed the books and then failed, with no way to undo it, is escalated
    with the change it left: the listing and the JSON show it, field by field."""
    db = tmp_path / "h.db"
    bank = hx.DictState({"accounts/bob": {"balance": 100}})
    _, payout = bank_actions(bank)
    store = hx.Store(db, create=True)
    with pytest.raises(hx.Escalated):
        with hx.Episode(state=bank, store=store, episode_id="ep2"):
            payout("bob", 30)
    store.close()
    out = cli("escalations", str(db)).output
    assert 'payout({"amount": 30, "who": "bob"})' in out
    assert "accounts/bob" in out and "100 → 70" in out
    (esc,) = json.loads(cli("escalations", str(db), "--json").output)
    assert esc["diff"]["accounts/bob"]["before"] == {"balance": 100}
    assert esc["diff"]["accounts/bob"]["after"] == {"balance": 70}


def test_edited_arguments_are_refused_before_an_approver_sees_them(held: tuple[Path, str]):
    """The held request's arguments edited from 10,000 to 10 behind the harness's back: the
    listing and a decision are both refused (exit 2), and nothing is recorded; with
    --allow-unverified the listing goes on, marked UNVERIFIED."""
    db, esc_id = held
    con = sqlite3.connect(db)
    con.execute('UPDATE hx_escalation SET args = \'{"who":"carol","amount":10}\'')
    con.commit()
    before = con.execute("SELECT * FROM hx_escalation").fetchall()
    log_before = con.execute("SELECT COUNT(*) FROM hx_log").fetchone()
    listed = cli("escalations", str(db))
    assert listed.exit_code == 2 and "fails verification" in listed.output
    assert '"amount": 10,' not in listed.output and '"amount": 10}' not in listed.output
    decided = cli("escalations", str(db), "resolve", esc_id, "--approve", "--by", "ana")
    assert decided.exit_code == 2 and "fails verification" in decided.output
    assert con.execute("SELECT * FROM hx_escalation").fetchall() == before
    assert con.execute("SELECT COUNT(*) FROM hx_log").fetchone() == log_before
    as_json = cli("escalations", str(db), "--json")
    assert as_json.exit_code == 2
    anyway = cli("escalations", str(db), "--allow-unverified")
    assert anyway.exit_code == 0 and "UNVERIFIED" in anyway.output


def test_a_rejected_call_reads_rejected_in_audit_text_and_html(
    held: tuple[Path, str], tmp_path: Path
):
    """After a rejection the held call reads "rejected by NAME: REASON" in the audit timeline
    and on the HTML trial page, with its arguments, not as a call still held."""
    db, esc_id = held
    result = cli(
        "escalations", str(db), "resolve", esc_id, "--reject", "--by", "ana", "--reason", "too much"
    )
    assert result.exit_code == 0, result.output
    text = cli("audit", str(db), "--episode", "ep1")
    assert text.exit_code == 0, text.output
    assert "rejected by ana: too much" in text.output
    assert "waiting for a person" not in text.output
    page = tmp_path / "ep1.html"
    html = cli("audit", str(db), "--episode", "ep1", "--html", str(page))
    assert html.exit_code == 0, html.output
    shown = unescape(page.read_text())
    assert '"amount": 10000' in shown and '"who": "carol"' in shown
    assert "rejected</b> by ana: too much" in shown


def test_a_waiting_call_says_so_on_the_trial_page(held: tuple[Path, str], tmp_path: Path):
    """Before anyone decides, the trial page shows the held call's arguments and that it waits
    for a person, naming the escalation."""
    db, esc_id = held
    page = tmp_path / "ep1.html"
    assert cli("audit", str(db), "--episode", "ep1", "--html", str(page)).exit_code == 0
    shown = unescape(page.read_text())
    assert f"waiting for a person (escalation {esc_id})" in shown
    assert '"amount": 10000' in shown and "held before it ran" in shown


def test_the_escalated_error_names_the_command_that_decides(held: tuple[Path, str]):
    """The Python exception an escalation raises tells the caller the command to decide and to
    look at the call, with the store it is in."""
    db, _ = held
    bank = hx.DictState({"accounts/bob": {"balance": 0}, "accounts/carol": {"balance": 0}})
    deposit, _ = bank_actions(bank)
    store = hx.Store(db)
    with pytest.raises(hx.Escalated) as raised:
        with hx.Episode(state=bank, store=store, episode_id="ep3"):
            deposit("carol", 5000)
    store.close()
    message = str(raised.value)
    assert f"harness escalations {db} resolve {raised.value.escalation_id}" in message
    assert "--approve|--reject --by NAME" in message and f"`harness escalations {db}`" in message

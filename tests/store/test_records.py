"""What the store's readers return: values, not JSON text.

``Store.transactions()``, ``escalations()``, ``trials()`` and ``resolve()`` give pydantic
records whose JSON columns are decoded (a diff is a mapping, a result a value); the raw rows,
JSON as stored, stay available (``transaction_rows`` and the like) for checks of the text.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import harness as hx
from harness.store import Escalation, EscalationRow, Transaction, TransactionRow, Trial, TrialRow
from harness.testing import FakeClock

from ..conftest import Shop
from ..episode.test_episode import escalating_run
from ..test_transaction import cancel_action


@pytest.mark.parametrize(
    ("record", "table"),
    [(Transaction, TransactionRow), (Escalation, EscalationRow), (Trial, TrialRow)],
)
def test_each_record_has_its_tables_columns(record: type, table: type) -> None:
    """A column added to a table is added to its record too (or this fails)."""
    assert set(record.model_fields) == set(table.model_fields)


def test_transactions_carry_values(shop: Shop, store_url: str) -> None:
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1"):
        cancel("o1", reason="asked")
    store = hx.Store(store_url)
    try:
        (txn,) = store.transactions("e1")
        (raw,) = store.transaction_rows("e1")
    finally:
        store.close()
    assert isinstance(txn, Transaction)
    assert txn.args == {"order_id": "o1", "reason": "asked"}
    assert txn.result == {"order_id": "o1", "status": "cancelled"}
    before = {"status": "pending", "total": 10}
    assert txn.diff == {"orders/o1": [before, {"status": "cancelled", "total": 10}]}
    assert txn.before == {"orders/o1": before} and txn.errors == []
    assert isinstance(raw.diff, str)  # the stored text is still there
    with pytest.raises(ValueError):
        txn.status = "failed"  # type: ignore[misc]  # records are read, not edited


def test_escalations_and_decisions_carry_values(shop: Shop, store_url: str) -> None:
    counts: dict[str, int] = {}
    _, agent = escalating_run(shop, store_url, FakeClock(), counts=counts)
    with pytest.raises(hx.Escalated):
        with hx.Episode(state=shop.state, store=store_url, episode_id="e1") as ep:
            agent(ep)
    store = hx.Store(store_url)
    try:
        (esc,) = store.escalations(status="pending")
        assert isinstance(esc, Escalation) and esc.args == {"order_id": "o2", "reason": "asked"}
        assert isinstance(esc.evidence, dict)
        decided = store.resolve(esc.id, "edit", by="ana", reason="ok", edit={"order_id": "o3"})
        assert isinstance(decided, Escalation) and decided.edit == {"order_id": "o3"}
        assert isinstance(store.escalation_rows()[0].edit, str)
    finally:
        store.close()


def test_trials_carry_values(tmp_path: Path) -> None:
    from ..toy_env import write_suite

    result = hx.run_trials(
        write_suite(tmp_path / "suite", [1]), agent="scripted", logs=tmp_path / "logs"
    )
    store = hx.Store(result.folder / "harness.db", readonly=True)
    try:
        (trial,) = store.trials()
        (raw,) = store.trial_rows()
    finally:
        store.close()
    assert isinstance(trial, Trial) and trial.passed
    assert isinstance(trial.verdict, dict) and trial.verdict["passed"] is True
    assert isinstance(trial.agent_meta, dict) and isinstance(raw.verdict, str)


def test_a_column_that_is_not_json_is_kept_as_its_text(shop: Shop, store_url: str) -> None:
    """An edit behind the store's back that breaks a column's JSON does not break reading."""
    cancel = cancel_action(shop)
    with hx.Episode(state=shop.state, store=store_url, episode_id="e1"):
        cancel("o1")
    with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE hx_transaction SET result = 'not json {'")
    conn.close()
    store = hx.Store(store_url)
    try:
        (txn,) = store.transactions("e1")
        assert txn.result == "not json {"
        assert not store.verify().ok  # and the audit names it
    finally:
        store.close()
